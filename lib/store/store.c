#include <stdlib.h>

#include "common.h"
#include "stats.h"
#include "store.h"

int ckpt_store_size(ckpt_store *s, const char *key, uint64_t *size)
{
	return s->ops->size(s, key, size);
}

ssize_t ckpt_store_read(ckpt_store *s, const char *key, uint64_t off, size_t len, void *dst)
{
	ssize_t n = s->ops->read(s, key, off, len, dst);
	if (n > 0) {
		CKPT_STAT_ADD(backing_bytes_read, (uint64_t)n);
		CKPT_STAT_ADD(backing_reads, 1);
	}
	return n;
}

int ckpt_store_list(ckpt_store *s, const char *prefix, ckpt_store_list_cb cb, void *ctx)
{
	return s->ops->list(s, prefix, cb, ctx);
}

void ckpt_store_destroy(ckpt_store *s)
{
	if (s)
		s->ops->destroy(s);
}

int ckpt_store_read_all(ckpt_store *s, const char *key, size_t max, char **out, size_t *len)
{
	uint64_t size;
	int rc = ckpt_store_size(s, key, &size);
	if (rc < 0)
		return rc;
	if (size > max)
		return -EFBIG;
	char *buf = malloc((size_t)size + 1);
	if (!buf)
		return -ENOMEM;
	ssize_t n = ckpt_store_read(s, key, 0, (size_t)size, buf);
	if (n < 0) {
		free(buf);
		return (int)n;
	}
	if ((uint64_t)n != size) {
		ckpt_log(CKPT_LOG_ERR, "%s/%s: short read (%zd of %llu bytes)", s->root, key, n,
			 (unsigned long long)size);
		free(buf);
		return -EIO;
	}
	buf[n] = 0;
	*out = buf;
	*len = (size_t)n;
	return 0;
}
