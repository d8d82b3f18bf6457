/*
 * common.h - conventions shared by every libckpt module.
 *
 * Errors: every function that can fail returns a negative errno value
 * (-EIO, -ENOENT, -EINVAL, ...) or 0/a non-negative count on success.
 * That is the only error domain inside libckpt; the daemon converts it to
 * a FUSE reply exactly once.  When a failure is caused by bad stored data
 * the module that notices it logs one line naming the file/key and the
 * reason (ckpt_log), then returns -EIO.
 *
 * Logging: ckpt_log() writes one line to the installed sink (stderr by
 * default).  Thread-safe.
 */
#ifndef CKPT_COMMON_H
#define CKPT_COMMON_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "support.h"

#define CKPT_MAX_RANK 32 /* highest array rank accepted anywhere */

/* ckpt_log and its level and sink: public (ckpt/support.h). */
/* While on, this thread's error, warning and info lines are logged as
 * debug lines (not counted as errors): for probes whose failure is an
 * expected answer.  Returns the previous setting. */
int ckpt_log_quiet(int on);

/* Overflow-checked arithmetic: return -EOVERFLOW instead of wrapping. */
static inline int ckpt_mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
	return __builtin_mul_overflow(a, b, out) ? -EOVERFLOW : 0;
}
static inline int ckpt_add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
	return __builtin_add_overflow(a, b, out) ? -EOVERFLOW : 0;
}

/* Little-endian load/store helpers (the formats are all little-endian). */
static inline uint64_t ckpt_le64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}
static inline uint32_t ckpt_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline void ckpt_put_le64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}
static inline void ckpt_put_le32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

#endif
