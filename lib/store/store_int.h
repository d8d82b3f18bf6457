/*
 * store_int.h - helpers shared by the store implementations (not for
 * other layers).
 */
#ifndef CKPT_STORE_INT_H
#define CKPT_STORE_INT_H

#include "store.h"

/* "a" + "/" + "b" (either may be "" or NULL: no separator), malloc'd. */
char *ckpt_store_join(const char *a, const char *b);

/* listdir / stat derived from ops->list and ops->size, for stores whose
 * keys are flat (OCDBT): a folder is any proper '/'-prefix of a key. */
int ckpt_store_listdir_from_keys(ckpt_store *s, const char *dir, ckpt_store_dir_cb cb, void *ctx);
int ckpt_store_stat_from_keys(ckpt_store *s, const char *key, struct ckpt_store_stat *st);

/* ckpt_store_read without the stats, for stores that read through another
 * store and count what they read themselves (OCDBT). */
ssize_t ckpt_store_read_raw(ckpt_store *s, const char *key, uint64_t off, size_t len, void *dst);

/* The innermost store below sub-store views, and `key` as a key of it
 * (*full malloc'd).  -ENOMEM. */
int ckpt_store_unwrap(ckpt_store *s, const char *key, ckpt_store **base, char **full);

/* Object store (store_s3.c): source is "s3://..." or "gs://...". */
int ckpt_store_s3_open(const char *source, const struct ckpt_store_opts *o, ckpt_store **out);

/* One ListObjectsV2 answer (body of len bytes, NUL-terminated after them):
 * cb for every <Contents> with a <Key> (key, ETag or NULL, Size, LastModified
 * in ns or 0; is_prefix 0), then for every <CommonPrefixes> <Prefix>
 * (is_prefix 1); keys decoded from XML entities and, with
 * <EncodingType>url, from URL form.  *truncated: <IsTruncated>true;
 * *token: <NextContinuationToken> then (malloc'd), else NULL.  Returns 0,
 * cb's non-zero value (stops), or -ENOMEM.  (store_s3.c; fuzz_s3_list.) */
typedef int (*ckpt_s3_list_cb)(void *ctx, const char *key, const char *etag, uint64_t size, int64_t mtime_ns,
			       int is_prefix);
int ckpt_s3_list_parse(const char *body, size_t len, ckpt_s3_list_cb cb, void *ctx, int *truncated,
		       char **token);

/* On-disk cache of object-store byte ranges (diskcache.c): entries keyed
 * by object identity (id: endpoint URL and object name), ETag and range,
 * bounded by max bytes (0: 10 GiB), least recently used evicted first.
 * get: 0 and the len bytes in dst, or -ENOENT (miss, damaged entry). */
struct ckpt_dcache;
int ckpt_dcache_open(const char *dir, uint64_t max, struct ckpt_dcache **out);
void ckpt_dcache_close(struct ckpt_dcache *c);
int ckpt_dcache_get(struct ckpt_dcache *c, const char *id, const char *etag, uint64_t first, uint64_t len,
		    void *dst);
void ckpt_dcache_put(struct ckpt_dcache *c, const char *id, const char *etag, uint64_t first, uint64_t len,
		     const void *src);

#endif
