/*
 * store.h - where stored bytes come from: one interface over a plain folder
 * (zarr per-array layout: key = relative file path) and an OCDBT key-value
 * store (key = OCDBT key).  Keys are '/'-separated, never start with '/'.
 *
 * Thread-safety: every operation may be called from many threads at once
 * on the same store.  A store is immutable once opened (read-only view).
 *
 * Ownership: ckpt_store_destroy() frees the store; keys and buffers passed
 * in stay owned by the caller.
 */
#ifndef CKPT_STORE_H
#define CKPT_STORE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct ckpt_store ckpt_store;

/* Listing callback: return 0 to continue, non-zero to stop (that value is
 * returned by list).  `key` is NUL-terminated and valid only during the call. */
typedef int (*ckpt_store_list_cb)(void *ctx, const char *key, uint64_t size);

struct ckpt_store_ops {
	/* Size of the value stored under key; -ENOENT when absent. */
	int (*size)(ckpt_store *s, const char *key, uint64_t *size);
	/* Copy up to len bytes of key's value starting at off into dst.
	 * Returns bytes copied (short only at the end of the value), -ENOENT
	 * when absent, -EIO on a read error (logged). */
	ssize_t (*read)(ckpt_store *s, const char *key, uint64_t off, size_t len, void *dst);
	/* Call cb for every key that starts with prefix (all keys for ""),
	 * in byte order for OCDBT, unspecified order for folders. */
	int (*list)(ckpt_store *s, const char *prefix, ckpt_store_list_cb cb, void *ctx);
	void (*destroy)(ckpt_store *s);
};

/* Every store implementation embeds this as its first member. */
struct ckpt_store {
	const struct ckpt_store_ops *ops;
	char *root; /* folder the store was opened on, for log messages */
};

/* Folder store over `dir` (a zarr per-array item folder).  -errno on failure. */
int ckpt_store_dir_open(const char *dir, ckpt_store **out);

/* OCDBT store over an item folder: the root manifest.ocdbt if present,
 * else the union of ocdbt.process_<i>/ databases.  -ENOENT when the folder
 * holds no OCDBT database, -EIO (logged) when it is corrupt. */
int ckpt_store_ocdbt_open(const char *dir, ckpt_store **out);

/* Dispatchers; read() also counts backing_bytes_read in ckpt_g_stats. */
int ckpt_store_size(ckpt_store *s, const char *key, uint64_t *size);
ssize_t ckpt_store_read(ckpt_store *s, const char *key, uint64_t off, size_t len, void *dst);
int ckpt_store_list(ckpt_store *s, const char *prefix, ckpt_store_list_cb cb, void *ctx);
void ckpt_store_destroy(ckpt_store *s);

/* Read a whole value of at most `max` bytes into a fresh NUL-terminated
 * malloc'd buffer (*out, caller frees; *len excludes the NUL).
 * -EFBIG when larger than max. */
int ckpt_store_read_all(ckpt_store *s, const char *key, size_t max, char **out, size_t *len);

#endif
