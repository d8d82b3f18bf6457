/*
 * membuf.h - a reader over bytes held in memory, in the shape of the read
 * callbacks the format parsers take (ckpt_zip_read_fn, ckpt_mp_read_fn):
 * the unit tests and fuzz targets hand those parsers a buffer with it.
 */
#ifndef CKPT_MEMBUF_H
#define CKPT_MEMBUF_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct ckpt_membuf {
	const uint8_t *p;
	size_t n;
};

/* Copy bytes [off, off + len) of the buffer `ctx` (a struct ckpt_membuf)
 * to dst, clamped to its end: the count copied, 0 past the end. */
ssize_t ckpt_membuf_read(void *ctx, uint64_t off, size_t len, void *dst);

#endif
