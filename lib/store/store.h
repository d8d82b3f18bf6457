/*
 * store.h - where stored bytes come from: one interface over a plain folder
 * (zarr per-array layout: key = relative file path), an object store
 * (s3:// or gs://: key = object name below the mounted prefix) and an OCDBT
 * key-value database read through either of them (key = OCDBT key).
 *
 * Keys are '/'-separated, never start or end with '/', never contain an
 * empty, "." or ".." component (such keys are simply absent: -ENOENT; the
 * dispatchers below check every key once, so no backend sees one, even an
 * OCDBT database that stores such a key).  The empty key "" names the root
 * of the store (a folder).
 *
 * Discovery (what tree/layout.c uses, and all it may use, so that every
 * backend works without tree/ knowing which one it has):
 *   - ckpt_store_listdir(): the immediate children of a folder;
 *   - ckpt_store_stat(): one name, file or folder;
 *   - ckpt_store_read_small(): a whole small file (metadata, JSON);
 *   - ckpt_store_sub(): a store for a folder of another store (a step, an
 *     item) sharing its connections and caches;
 *   - ckpt_store_ocdbt_open_on(): the OCDBT database of an item folder,
 *     read through any base store.
 *
 * Folder store safety contract (hostile SOURCE trees):
 *   - No symbolic link below the root is ever followed, in any component of
 *     a key (openat2 RESOLVE_NO_SYMLINKS, or an O_NOFOLLOW walk where the
 *     kernel lacks openat2).  Naming one is -EIO with one log line; listdir
 *     does not report symlinks at all.  The root itself may be a symlink (the
 *     path the user gave is resolved once, at open).
 *   - Only regular files are read: files are opened O_NONBLOCK and checked
 *     with fstat(); a FIFO, socket or device is -EIO with a log line, never a
 *     blocking open or read.  listdir reports only regular files and folders.
 *
 * Thread-safety: every operation may be called from many threads at once
 * on the same store.  A store is a read-only view.
 *
 * Ownership: stores are reference counted.  Every open/sub call returns one
 * reference; ckpt_store_destroy() drops one and frees the store with the
 * last.  A store made by ckpt_store_sub() or ckpt_store_ocdbt_open_on()
 * holds a reference on its parent, so the caller may destroy the parent
 * right away.  Keys and buffers passed in stay owned by the caller.
 */
#ifndef CKPT_STORE_H
#define CKPT_STORE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "support.h"

typedef struct ckpt_store ckpt_store;

/* Listing callback: return 0 to continue, non-zero to stop (that value is
 * returned by list).  `key` is NUL-terminated and valid only during the call. */
typedef int (*ckpt_store_list_cb)(void *ctx, const char *key, uint64_t size);

/* What stat and listdir report about one name. */
struct ckpt_store_stat {
	int is_dir; /* 1 folder (object stores: a common prefix), 0 file */
	uint64_t size; /* bytes of a file; 0 for a folder */
	int64_t mtime_ns; /* modification time (ns since the epoch), 0 when unknown */
};

/* listdir callback: `name` is one path component (no '/'), valid only
 * during the call.  Return 0 to continue, non-zero to stop (returned). */
typedef int (*ckpt_store_dir_cb)(void *ctx, const char *name, const struct ckpt_store_stat *st);

struct ckpt_store_ops {
	/* Size of the value stored under key; -ENOENT when absent (or a folder). */
	int (*size)(ckpt_store *s, const char *key, uint64_t *size);
	/* Copy up to len bytes of key's value starting at off into dst.
	 * Returns bytes copied (short only at the end of the value), -ENOENT
	 * when absent, -EIO on a read error (logged), -ESTALE when an object
	 * store's object changed since it was first seen. */
	ssize_t (*read)(ckpt_store *s, const char *key, uint64_t off, size_t len, void *dst);
	/* Call cb for every key that starts with prefix (all keys for ""),
	 * in byte order for OCDBT, unspecified order for folders. */
	int (*list)(ckpt_store *s, const char *prefix, ckpt_store_list_cb cb, void *ctx);
	/* Immediate children of folder `dir` ("" = the root), in unspecified
	 * order, each name once.  -ENOENT when dir is not a folder. */
	int (*listdir)(ckpt_store *s, const char *dir, ckpt_store_dir_cb cb, void *ctx);
	/* File or folder `key` ("" = the root, always a folder); -ENOENT when
	 * absent.  A name that is both a file and a prefix of other keys (object
	 * stores allow it) is reported as the file. */
	int (*stat)(ckpt_store *s, const char *key, struct ckpt_store_stat *st);
	void (*destroy)(ckpt_store *s);
	/* Requests worth having in flight at once (>= 1): an object store's
	 * connections, a view's (sub-store, OCDBT) those of the store below it.
	 * NULL: CKPT_STORE_FOLDER_CONNECTIONS. */
	unsigned (*connections)(ckpt_store *s);
	/* Optional (NULL: not offered).  Open key's value for reads at any
	 * offset (ckpt_store_fd_readv, from any thread): a descriptor the
	 * caller closes, the value's identity at the open in *st.  -ENOENT when
	 * absent, -EIO (logged) for anything but a regular file or an error.
	 * Offered only where a read is as cheap as a copy from memory (a local
	 * folder: the system's page cache), so that callers may read pieces of
	 * values where they would otherwise keep whole values in memory. */
	int (*open_fd)(ckpt_store *s, const char *key, struct ckpt_store_stat *st);
};

#define CKPT_STORE_FOLDER_CONNECTIONS 4 /* a folder: a few reads at once */

/* Every store implementation embeds this as its first member (zeroed, then
 * ops and root set). */
struct ckpt_store {
	const struct ckpt_store_ops *ops;
	char *root; /* where the store reads, for log messages (no secrets) */
	int extra_refs; /* references beyond the first; atomic, 0 when fresh */
};

/* struct ckpt_store_opts, ckpt_store_opts_set: public (ckpt/support.h). */

/* Folder store over `dir` (a zarr per-array item folder, a step, a root).
 * -errno on failure. */
int ckpt_store_dir_open(const char *dir, ckpt_store **out);

/* Store held in memory, empty at first, named `name` in log lines (NULL:
 * "mem:"): keys get their bytes with ckpt_store_mem_put (a copy; the same
 * key again replaces them), all before the store is shared between
 * threads.  Folders are the proper '/'-prefixes of keys; list() is in byte
 * order; mtimes are 0.  put: -EINVAL for a malformed key or a store that is
 * not a memory store, -ENOMEM. */
int ckpt_store_mem_open(const char *name, ckpt_store **out);
int ckpt_store_mem_put(ckpt_store *s, const char *key, const void *data, size_t len);

/* Key `key` of memory store s whose bytes are `length` bytes of file
 * `base_key` of store `base` from `offset` on: nothing is read now; size
 * and stat answer `length`, read() reads that range of the base lazily
 * (through base->ops, so the bytes are counted once), and a base file
 * shorter than the range is -EIO (logged).  s holds a reference on base
 * until it is destroyed.  The same key again replaces what it held.
 * -EINVAL for a malformed key, a base that is s, an offset + length that
 * overflows; -ENOMEM.  This is how a foreign format's array is served
 * from its original file (foreign/foreign.h). */
int ckpt_store_mem_put_range(ckpt_store *s, const char *key, ckpt_store *base, const char *base_key,
			     uint64_t offset, uint64_t length);

/* The same for bytes that are several ranges of base_key one after another
 * (pieces: npieces (offset, length) pairs), such as an array Flax stored in
 * pieces of 2^30 bytes. */
int ckpt_store_mem_put_pieces(ckpt_store *s, const char *key, ckpt_store *base, const char *base_key,
			      const uint64_t *pieces, size_t npieces);

/* Folder `key` of memory store s shows folder `base_dir` of store `base`
 * ("" = its root): every key below it (key + "/" + rest) is base_dir +
 * "/" + rest of base, for size, read, stat, list and listdir.  A zarr
 * array folder that a foreign format keeps as it is (an old Orbax leaf,
 * a T5X leaf) is put so.  A key below key given literally or as a range
 * is not looked up (the folder answers).  Holds a reference on base.
 * -EINVAL, -ENOMEM as above. */
int ckpt_store_mem_put_folder(ckpt_store *s, const char *key, ckpt_store *base, const char *base_dir);

/* OCDBT store over an item folder: the root manifest.ocdbt if present,
 * else the union of ocdbt.process_<i>/ databases.  -ENOENT when the folder
 * holds no OCDBT database, -EIO (logged) when it is corrupt.
 * = ckpt_store_dir_open(dir) + ckpt_store_ocdbt_open_on(that, ""). */
int ckpt_store_ocdbt_open(const char *dir, ckpt_store **out);

/*
 * SOURCE as the user wrote it: "s3://BUCKET[/PREFIX]" or "gs://BUCKET[/PREFIX]"
 * opens an object store (no request is made before the first operation
 * except credential discovery; -EINVAL for a malformed URL, -ENOTSUP when
 * built without libcurl); anything else is a folder store.  `o` may be NULL.
 */
int ckpt_store_open_source(const char *source, const struct ckpt_store_opts *o, ckpt_store **out);

/* ckpt_store_source_is_remote: public (ckpt/support.h). */

/* A view of `parent` below folder `prefix` ("a/b": key "k" of the view is
 * key "a/b/k" of the parent).  Holds a reference on parent.  Does not check
 * that the folder exists. */
int ckpt_store_sub(ckpt_store *parent, const char *prefix, ckpt_store **out);

/* The OCDBT database of item folder `dir` of `base` ("" = base's root),
 * reading manifests, B+tree nodes and data-file ranges through base only.
 * Same errors as ckpt_store_ocdbt_open(); holds a reference on base. */
int ckpt_store_ocdbt_open_on(ckpt_store *base, const char *dir, ckpt_store **out);

struct ckpt_pool;
/* The same, fetching B+tree nodes on `pool` (base/pool.h: the reader's
 * decode threads, used only while this call runs) when base serves several
 * requests at once; NULL: threads of the open's own, stopped before it
 * returns. */
int ckpt_store_ocdbt_open_pool(ckpt_store *base, const char *dir, struct ckpt_pool *pool, ckpt_store **out);

/* Dispatchers; read() also counts backing_bytes_read in ckpt_g_stats. */
int ckpt_store_size(ckpt_store *s, const char *key, uint64_t *size);

ssize_t ckpt_store_read(ckpt_store *s, const char *key, uint64_t off, size_t len, void *dst);
/* ops->open_fd, or -ENOTSUP where the store does not offer it;
 * ckpt_store_has_open_fd says which beforehand. */
int ckpt_store_open_fd(ckpt_store *s, const char *key, struct ckpt_store_stat *st);
int ckpt_store_has_open_fd(const ckpt_store *s);
/* The identity (size, mtime) of an open_fd descriptor's file now: 0, or
 * -EIO (logged) when fstat fails. */
int ckpt_store_fd_stat(int fd, struct ckpt_store_stat *st);
/* Bytes of an open_fd descriptor from off into iov[0..n) (counted like
 * read): the bytes copied (short only at the end of the value), or -errno
 * (not logged: the caller names the value). */
ssize_t ckpt_store_fd_readv(int fd, uint64_t off, const struct iovec *iov, int n);
int ckpt_store_list(ckpt_store *s, const char *prefix, ckpt_store_list_cb cb, void *ctx);
int ckpt_store_listdir(ckpt_store *s, const char *dir, ckpt_store_dir_cb cb, void *ctx);
int ckpt_store_stat(ckpt_store *s, const char *key, struct ckpt_store_stat *st);
/* Requests worth sending at once (ops->connections; >= 1): callers size their
 * parallel I/O (uploads, OCDBT node fetches) by it. */
unsigned ckpt_store_connections(ckpt_store *s);
/* Take one more reference (returns s). */
ckpt_store *ckpt_store_ref(ckpt_store *s);
/* Drop one reference; the last frees the store.  NULL is a no-op. */
void ckpt_store_destroy(ckpt_store *s);

/* Read a whole value of at most `max` bytes into a fresh NUL-terminated
 * malloc'd buffer (*out, caller frees; *len excludes the NUL).
 * -EFBIG when larger than max, -ENOENT when absent. */
int ckpt_store_read_all(ckpt_store *s, const char *key, size_t max, char **out, size_t *len);
/* The same (the name the discovery API uses). */
int ckpt_store_read_small(ckpt_store *s, const char *key, size_t max, char **out, size_t *len);

/* 1 when key is well formed (see above; "" is not a key of a value). */
int ckpt_store_key_ok(const char *key);

#endif
