/*
 * store_int.h - helpers shared by the store implementations (not for
 * other layers).
 *
 * Files, from the bottom up (each calls only the ones above it in this
 * list; calls the other way go through a store's ops table):
 *   store.c         dispatchers (calls through ops), reference counting,
 *                   sub-stores, key helpers, listdir/stat from flat keys
 *   sigv4.c         SHA-256, HMAC, AWS Signature Version 4
 *   http.c          HTTP requests (libcurl), retries and backoff
 *   diskcache.c     on-disk cache of object-store byte ranges
 *   store_dir.c     backend: a local folder
 *   store_mem.c     backend: keys held in memory
 *   store_s3.c      backend: an object store (s3://, gs://)
 *   upload_tree.c   uploading a committed step to an object store
 *   store_source.c  SOURCE as the user wrote it: store options, which backend
 *   ocdbt.c         the OCDBT reader (through any store)
 *   store_ocdbt.c   backend: an OCDBT database as a store
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

/* Requests an object store (or a view of one) sends at once; 0 for
 * other stores. */
unsigned ckpt_store_s3_connections(ckpt_store *s);

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
