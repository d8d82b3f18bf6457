/*
 * view.h - the mounted tree: nodes (steps, items, pytree directories,
 * array files, metadata files, and the hidden companions: slice files,
 * NAME.shards/ directories, X.safetensors files, .ckptfs/stats) addressed by
 * stable inode numbers, with lookup, readdir, attributes, xattrs and reads.
 * The daemon maps FUSE requests onto these calls one to one.
 *
 * Inode numbers: 1 is the root; a node keeps its number for the life of the
 * view; looking the same hidden name up twice returns the same node.
 *
 * Thread-safety: every call may run concurrently with every other.
 */
#ifndef CKPT_VIEW_H
#define CKPT_VIEW_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "array.h"

typedef struct ckpt_view ckpt_view;
typedef uint64_t ckpt_ino;

#define CKPT_ROOT_INO 1

typedef struct ckpt_view_opts {
	ckpt_ctx_opts ctx;          /* cache and decode threads */
	int show_companions;        /* list NAME.shards/ and X.safetensors in readdir */
	uint64_t st_shard_bytes;    /* X.safetensors.d/ shard size (0: 5 GB) */
} ckpt_view_opts;

typedef struct ckpt_attr {
	ckpt_ino ino;
	int is_dir;
	unsigned mode;      /* permission bits */
	uint64_t size;
	int64_t mtime_ns;
	unsigned nlink;
	int immutable;      /* committed data: the kernel may cache it indefinitely */
	int volatile_data;  /* content changes (stats): serve with direct I/O */
} ckpt_attr;

/* Build the view of SOURCE (a CheckpointManager root, a step folder or an
 * item folder; detected).  Unreadable parts are logged and left out; only
 * an unusable SOURCE fails (-errno). */
int ckpt_view_open(const char *source, const ckpt_view_opts *opts, ckpt_view **out);
void ckpt_view_destroy(ckpt_view *v);

/* What SOURCE was detected as: "root", "step" or "item". */
const char *ckpt_view_kind(const ckpt_view *v);

int ckpt_view_getattr(ckpt_view *v, ckpt_ino ino, ckpt_attr *out);

/* Look `name` up in directory `parent`.  -ENOENT when absent; -EINVAL or
 * -ENOENT (logged with the reason) for a malformed or out-of-range slice
 * name; -ENOTDIR when parent is not a directory. */
int ckpt_view_lookup(ckpt_view *v, ckpt_ino parent, const char *name, ckpt_attr *out);

/* Directory entry number `index` (0-based, "." and ".." not included):
 * returns 1 and sets *name (valid for the life of the view) and *attr, 0
 * past the end, -ENOTDIR / -errno on error. */
int ckpt_view_readdir(ckpt_view *v, ckpt_ino dir, uint64_t index, const char **name, ckpt_attr *attr);

/* Read file bytes [off, off+len) into dst: returns bytes copied (0 at EOF)
 * or -EIO (logged) / -EISDIR. */
ssize_t ckpt_view_read(ckpt_view *v, ckpt_ino ino, uint64_t off, size_t len, void *dst);

/* Extended attributes: value of `name` into buf (returns its length; with
 * cap 0 just the length), -ENODATA when the node has no such attribute,
 * -ERANGE when cap is too small.  list: NUL-separated names, same rules. */
ssize_t ckpt_view_getxattr(ckpt_view *v, ckpt_ino ino, const char *name, char *buf, size_t cap);
ssize_t ckpt_view_listxattr(ckpt_view *v, ckpt_ino ino, char *buf, size_t cap);

#endif
