/*
 * view_internal.h - the node model shared by view.c (requests) and
 * layout.c (building the tree from a source folder).  Not a public header.
 *
 * Invariants: nodes are created, never freed, until the view is destroyed;
 * a node's fields are immutable once published (its inode number handed
 * out), except `kids` of directories while layout.c builds them (before
 * ckpt_view_open returns) and the lazily computed fields guarded by
 * node->once / v->dyn_lock.
 */
#ifndef CKPT_VIEW_INTERNAL_H
#define CKPT_VIEW_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "array.h"
#include "safetensors.h"
#include "view.h"

enum node_type {
	N_DIR, /* step, item, pytree node, mirrored folder */
	N_ARRAY, /* NAME.npy, NAME[slice].npy, NAME.shards/[..].npy: region of an array */
	N_FILE, /* regular file copied from the source (path) or synthesized (content) */
	N_SHARDS, /* NAME.shards/ */
	N_STATS, /* .ckptfs/stats */
	N_SAFETENSORS, /* X.safetensors */
	N_PSTEP, /* a pending step (mkdir at the root of a writable mount) */
	N_PDIR, /* an item or pytree directory inside a pending step */
	N_PFILE /* NAME.npy or NAME[slice].npy being written */
};

struct aref { /* one stored array, shared by its .npy, slices and shards */
	ckpt_array *arr;
	char *sharding; /* JSON string from _sharding, or NULL */
	int ocdbt;
};

struct node {
	ckpt_ino ino;
	ckpt_ino parent;
	enum node_type type;
	char *name;
	int64_t mtime_ns;
	int hidden; /* reachable by name, not listed */
	/* N_DIR */
	struct node **kids; /* sorted by name once built */
	size_t nkids, capkids;
	/* N_ARRAY */
	struct aref *ar;
	ckpt_region region;
	char *hdr; /* the .npy header (hdrlen bytes) */
	size_t hdrlen;
	uint64_t size;
	/* N_FILE */
	char *path;
	char *content;
	/* N_SHARDS: lazily listed stored units */
	pthread_once_t once;
	struct node **units;
	size_t nunits;
	/* N_SAFETENSORS */
	struct node *stdir; /* the directory it covers */
	ckpt_st_layout *st;
	struct node **st_arrays; /* tensor i of the layout is st_arrays[i] */
	int st_err;
	int st_borrowed; /* st/st_arrays belong to the X.safetensors.d/ directory */
	atomic_uint_least64_t st_next; /* end of the last read of a file streamed from 0, else UINT64_MAX */
	ckpt_st_sharded *sts; /* X.safetensors.d/: the shard set (owns the layouts) */
	/* N_PSTEP / N_PDIR / N_PFILE (pending.c) */
	struct pstep *ps; /* the pending step this node belongs to */
	struct pfile *pf; /* N_PFILE state */
	int orphan; /* removed from its directory (committed/aborted/renamed) */
	atomic_int next_warmed; /* N_ARRAY: the next file of the directory was prefetched */
};

/* A pending step: the writer's step plus the lock that keeps commit apart
 * from writes (writes hold it shared, commit/abort exclusive). */
struct pstep {
	struct ckpt_step *step;
	pthread_rwlock_t io_lock;
	int dead; /* committed or aborted: no more writes */
};

#define PAGE_BITS 12
#define NPAGES 65536

struct ckpt_view {
	ckpt_view_opts opts;
	const char *kind;
	ckpt_ctx *ctx;
	/* node table: pages of 4096 pointers; count published with release */
	struct node **pages[NPAGES];
	atomic_uint_least64_t count;
	pthread_mutex_t alloc_lock;
	/* hidden nodes created by lookup: (parent, name) -> node */
	pthread_mutex_t dyn_lock;
	struct node **dyn;
	size_t ndyn_buckets, ndyn;
	/* Namespace lock: held shared by lookup/readdir, exclusive by every
	 * namespace change (mkdir, create, rename, unlink, commit).  Taken
	 * before dyn_lock and alloc_lock. */
	pthread_rwlock_t ns_lock;
	char *source; /* the folder mounted */
	int writable; /* a CheckpointManager root not mounted read-only */
	struct pstep **psteps;
	size_t npsteps;
	/* owned resources */
	ckpt_store **stores;
	size_t nstores;
	struct aref **arefs;
	size_t narefs;
};

struct node *view_node(ckpt_view *v, ckpt_ino ino);
struct node *view_new_node(ckpt_view *v, enum node_type t, const char *name, struct node *parent);
int view_add_kid(struct node *dir, struct node *kid);
struct node *view_find_kid(struct node *dir, const char *name);
void view_sort_kids(struct node *dir);
int view_init_array_node(struct node *n, struct aref *ar, const ckpt_region *r);

/* layout.c: fill v's root from the source folder. */
int layout_build(ckpt_view *v, const char *source);
/* layout.c: build the committed step folder `path` as a new directory node
 * `name` of the root (not yet linked into the root's kids). */
struct node *layout_new_step(ckpt_view *v, const char *name, const char *path);

/* view.c: the hidden-name map (takes dyn_lock itself). */
struct node *view_dyn_find(ckpt_view *v, ckpt_ino parent, const char *name);
int view_dyn_add(ckpt_view *v, struct node *n);
/* view.c: remove `kid` from dir's kids (the node stays allocated). */
void view_remove_kid(struct node *dir, struct node *kid);
void view_fill_attr(ckpt_view *v, struct node *n, ckpt_attr *a);

/* pending.c */
void pending_attr(ckpt_view *v, struct node *n, ckpt_attr *a);
ssize_t pending_read(ckpt_view *v, struct node *n, uint64_t off, size_t len, void *dst);
void pending_destroy(ckpt_view *v);

/* Escape one pytree key as a safe file name into buf (see docs/usage.md). */
void view_escape_name(const char *key, char *buf, size_t cap);

#endif
