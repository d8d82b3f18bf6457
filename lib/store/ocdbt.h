/*
 * ocdbt.h - read-only decoder of TensorStore OCDBT key-value databases, as
 * Orbax writes them inside an item folder (format: docs/format.md, "OCDBT").
 *
 * What is opened:
 *   - <item>/manifest.ocdbt (the merged root).  A manifest of kind
 *     "numbered" is followed to the newest <item>/manifest.<16 hex digits>.
 *   - otherwise the union of every <item>/ocdbt.process_<id>/ database (a
 *     save whose merge never ran); when two databases hold the same key,
 *     the one with the smaller process id wins (ids compare numerically
 *     when they are decimal, else bytewise).
 * Only the latest version of each database is read.
 *
 * Cost: ckpt_ocdbt_open() reads the manifest and every B+tree node of the
 * latest version (never a whole data file) and builds an in-memory sorted
 * index of (key -> inline bytes | data-file byte range).  After that, a
 * lookup is a binary search, a listing is a range scan in byte order, and
 * an out-of-line value is read as one byte range of its data file through
 * the base store (ckpt_store: a folder, or an object store where each read
 * is one ranged GET); data-file sizes are looked up once and cached.
 *
 * Keys are OCDBT keys verbatim (e.g. "params.w/.zarray", "w/c/0/1").  Keys
 * that contain a NUL byte cannot be named through this API and are skipped
 * (with a warning) at open.
 *
 * Errors: negative errno.  Corrupt stored data (bad magic/CRC/length,
 * truncated or oversized node, overflowing varint, out-of-range count,
 * reference cycle, key order violation, data-file range past the end of the
 * file, ...) is logged as one ckpt_log(CKPT_LOG_ERR) line naming the file
 * and the reason, and reported as -EIO.  Memory is bounded: a decoded node is
 * at most min(max_decoded_node_bytes, 256 MiB), and keys plus inline values
 * held by one handle (with its data-file paths) are at most 2 GiB.
 *
 * Thread-safety: open/close are not concurrent with anything else on the
 * same handle; every other function may be called from many threads at once.
 */
#ifndef CKPT_OCDBT_H
#define CKPT_OCDBT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct ckpt_ocdbt ckpt_ocdbt;

/* Open the OCDBT database of an item folder.  On success *out is a new
 * handle (free it with ckpt_ocdbt_close).  -ENOENT when the folder has
 * neither manifest.ocdbt nor any ocdbt.process_<id>/manifest.ocdbt, -EIO
 * (logged) when what is there is corrupt, -ENOMEM, or another -errno of
 * the file system. */
int ckpt_ocdbt_open(const char *item_dir, ckpt_ocdbt **out);

struct ckpt_store;
/* The same over folder `dir` ("" = its root) of any store: every manifest,
 * node and value byte is read through `base` (the handle holds a reference
 * on it, so the caller may destroy its own). */
int ckpt_ocdbt_open_store(struct ckpt_store *base, const char *dir, ckpt_ocdbt **out);

struct ckpt_pool;
/* The same, fetching the children of B+tree nodes on `pool` (pool.h: the
 * reader's decode threads; used only during the open) when the base store
 * serves several requests at once.  NULL: threads started for the open and
 * stopped before it returns. */
int ckpt_ocdbt_open_store_pool(struct ckpt_store *base, const char *dir, struct ckpt_pool *pool,
			       ckpt_ocdbt **out);

/* Free the handle, its index and its reference on the base store.  NULL is a no-op. */
void ckpt_ocdbt_close(ckpt_ocdbt *db);

/* Number of keys in the index. */
size_t ckpt_ocdbt_count(const ckpt_ocdbt *db);

/* B+tree height of the root of the (first) database opened; 0 = leaf. */
int ckpt_ocdbt_height(const ckpt_ocdbt *db);

/* Number of B+tree nodes decoded at open (all databases together). */
size_t ckpt_ocdbt_nodes(const ckpt_ocdbt *db);

/* Size of key's value in *size.  -ENOENT when absent; -EIO (logged) when
 * the value is out-of-line and its byte range lies past the end of its data
 * file (or the data file cannot be opened). */
int ckpt_ocdbt_size(ckpt_ocdbt *db, const char *key, uint64_t *size);

/* Copy up to len bytes of key's value starting at off into dst.  Returns the
 * byte count (short only at the end of the value; 0 when off >= size),
 * -ENOENT when absent, -EIO (logged) on a read error or a range past the end
 * of the data file. */
ssize_t ckpt_ocdbt_read(ckpt_ocdbt *db, const char *key, uint64_t off, size_t len, void *dst);

/* Call cb(ctx, key, size) for every key starting with prefix ("" = all), in
 * unsigned byte order.  A non-zero return of cb stops the scan and is
 * returned; otherwise 0.  `key` is valid only during the call.  The sizes are
 * the stored value lengths (not checked against the data files). */
int ckpt_ocdbt_list(ckpt_ocdbt *db, const char *prefix, int (*cb)(void *ctx, const char *key, uint64_t size),
		    void *ctx);

/*
 * Where a value lives, for callers that want to batch their own I/O.
 * `inline_data` is non-NULL for a value stored in its B+tree node (owned by
 * the handle, valid until close); otherwise the value is the byte range
 * [offset, offset + size) of the data file `path` (a path relative to the
 * item folder, owned by the handle).
 */
struct ckpt_ocdbt_value {
	uint64_t size;
	const uint8_t *inline_data;
	const char *path;
	uint64_t offset;
};

/* Look key up without reading anything.  0 or -ENOENT. */
int ckpt_ocdbt_lookup(const ckpt_ocdbt *db, const char *key, struct ckpt_ocdbt_value *out);

/*
 * Fuzzing / testing entry: decode `buf` both as an encoded manifest and as an
 * encoded B+tree node (envelope, zstd, CRC, body), entirely in memory, with
 * small limits (16 MiB decoded).  Returns 0 when either decode succeeded,
 * -EIO when both failed.  Logs nothing.
 */
int ckpt_ocdbt_fuzz_parse(const uint8_t *buf, size_t len);

#endif
