/* membuf.c - see membuf.h. */
#include <string.h>

#include "membuf.h"

ssize_t ckpt_membuf_read(void *ctx, uint64_t off, size_t len, void *dst)
{
	const struct ckpt_membuf *b = ctx;
	if (off >= b->n)
		return 0;
	size_t k = b->n - (size_t)off < len ? b->n - (size_t)off : len;
	memcpy(dst, b->p + off, k);
	return (ssize_t)k;
}
