/*
 * store_int.h - helpers shared by the store implementations (not for
 * other layers).
 *
 * Files, from the bottom up (each calls only the ones above it in this
 * list; calls the other way go through a store's ops table):
 *   store.c         the dispatchers (the one key check, stats; calls through
 *                   ops), reference counts, sub-stores, key helpers,
 *                   listdir/stat from flat keys
 *   sigv4.c         SHA-256, HMAC, URI encoding, AWS Signature Version 4
 *   http.c          libcurl: kept-alive connections, one attempt, what is
 *                   retryable, backoff
 *   diskcache.c     on-disk cache of object-store byte ranges
 *   store_dir.c     backend: a local folder (openat2, no symlinks, regular
 *                   files only)
 *   store_mem.c     backend: keys held in memory (tests, fuzzers, virtual
 *                   items of foreign formats)
 *   s3_xml.c        object-store XML: elements, ListObjectsV2 pages,
 *                   timestamps (pure; the fuzz_s3_list target's)
 *   s3_creds.c      region and credentials; bearer tokens kept fresh
 *   s3_request.c    signed requests, retries, pinned objects, HEAD, listings,
 *                   validated and coalesced range GETs
 *   store_s3.c      backend: an object store (s3://, gs://): the vtable,
 *                   configuration at open
 *   s3_upload.c     PUT, multipart uploads, DELETE, stale-upload cleanup
 *                   (upload.h)
 *   upload_tree.c   a step folder uploaded in commit order; background uploads
 *   store_source.c  SOURCE as the user wrote it: store options, which backend
 *   ocdbt.c         the OCDBT reader (through any store); its node prefetch
 *                   runs on a pool (base/pool.c) given at open
 *   store_ocdbt.c   backend: an OCDBT database as a store
 * The object store's files share s3_int.h.
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

/* One ListObjectsV2 answer (body of len bytes, NUL-terminated after them),
 * checked whole before anything is handed out: the document must be one
 * whole <ListBucketResult> (its root element, its end tag last: a page cut
 * off anywhere is refused), its own <Prefix> (when present) want_prefix,
 * every key and common prefix under want_prefix (NULL: no prefix check),
 * every <Contents> with a <Key> and a decimal <Size>, and an <IsTruncated>
 * of true or false.  Then cb for every <Contents> (key, ETag or NULL, Size,
 * LastModified in ns or 0; is_prefix 0), then for every <CommonPrefixes>
 * <Prefix> (is_prefix 1); keys decoded from XML entities and, with
 * <EncodingType>url, from URL form.  *truncated: <IsTruncated>true;
 * *token: a non-empty <NextContinuationToken> then (malloc'd), else NULL.
 * Returns 0, cb's non-zero value (stops), -ENOMEM, or -EBADMSG (not a whole
 * valid page, nothing handed out; *why, when why is not NULL, a static
 * phrase saying what is wrong).  (s3_xml.c; fuzz_s3_list.) */
typedef int (*ckpt_s3_list_cb)(void *ctx, const char *key, const char *etag, uint64_t size, int64_t mtime_ns,
			       int is_prefix);
int ckpt_s3_list_parse(const char *body, size_t len, const char *want_prefix, ckpt_s3_list_cb cb, void *ctx,
		       int *truncated, char **token, const char **why);

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
