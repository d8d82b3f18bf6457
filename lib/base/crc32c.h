/*
 * crc32c.h - CRC-32C (Castagnoli), as used by OCDBT envelopes and the zarr v3
 * crc32c codec.  Thread-safe, no allocation.
 */
#ifndef CKPT_CRC32C_H
#define CKPT_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Extend `crc` (0 to start) over `len` bytes; returns the finished CRC
 * (pre/post inversion handled inside, so calls chain: crc = ckpt_crc32c(crc, ...)). */
uint32_t ckpt_crc32c(uint32_t crc, const void *data, size_t len);

#endif
