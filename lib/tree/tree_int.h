/*
 * tree_int.h - the node model of the mounted tree, shared by the files
 * of lib/tree/.  Not a public header.
 *
 * Files, from the bottom up (each calls only the files listed before it;
 * calls the other way go through a node's ops table):
 *   node/node.c   node table, kids, hidden-name map, generic lookup/readdir/attr;
 *                 the life of a live root's steps (node_life), kernel references,
 *                 forget and the name invalidation list
 *   node/xattr.c  user.ckpt.* xattrs of array files
 *   node/array_files.c  the file kinds read from arrays (array, .f32.npy,
 *                 safetensors) and their reads: zero-copy map, read-ahead,
 *                 next-file warming, open checks
 *   node/plain_files.c  files read from a store key or held in memory, and
 *                 .ckptfs/stats, .ckptfs/log
 *   derived/summary.c  the table of arrays of a directory, and the summary files
 *   derived/views.c  STEP/.views/NAME/: a step shown as another model family's
 *                 folder by a view recipe (the recipe set, planning, reading
 *                 target tensors)
 *   derived/latest.c  the root's `latest` symlink to its newest committed step
 *   derived/companions.c  the ops of committed directories, and their hidden
 *                 names made on lookup, one row each in its table: NAME[slice].npy,
 *                 NAME.f32.npy, NAME.shards/, X.safetensors, X.safetensors.d/,
 *                 STEP/.ckptfs/, STEP/.stored/, .views (views.c), latest (latest.c)
 *   layout.c      SOURCE -> nodes (root/step/item detection, _METADATA walk;
 *                 formats that are not Orbax through the translator table of
 *                 lib/foreign/, foreign.h); the root's list of steps (which names
 *                 a committing step takes)
 *   prune.c       deleting committed steps of a writable root (rmtree through the mount)
 *                 (on top: it changes the root's listing and the source, for pending/)
 *   views_import.c  view recipes the other way: a folder copied into a pending
 *                 STEP/.views/NAME/ becomes the step's arrays at its commit
 *   pending/pfile.c  the write protocol's shared helpers (tmp folder paths, key
 *                 names), the pending file kinds' tables, N_PDIR's and N_PFILE's
 *                 ops; pending/pending_int.h lists the folder
 *   pending/raw.c  raw copies (stored copies, Orbax saves), the copy-tool watch
 *   pending/safetensors.c  importing safetensors files into a pending step
 *   pending/file.c  .npy and buffered (JSON, metadata) pending files; write, truncate
 *   pending/step.c  a pending step's life (state table): begin, checks, commit,
 *                 settle, abort
 *   pending/namespace.c  mkdir, create, rename, unlink, rmdir, flush, setxattr
 *                 on pending steps
 *   view.c        open/destroy, lookup, readdir, getattr, read, xattr: dispatch;
 *                 root rescans, and the files of gone steps to invalidate; the
 *                 stop hooks of threads below it
 * The sections at the end of this header declare each file's calls, in this
 * order; the translators live in lib/foreign/ (foreign.h), and view.c defines
 * only public calls (view.h).
 *
 * Floors: node/ is the node model (the node table, kids, the hidden-name
 * map, the file kinds: array, safetensors and plain files); derived/ makes,
 * out of node/, what the source does not store (the hidden names made on
 * lookup, the summary files, recipe views, `latest`) and holds the ops of
 * committed directories that answer them; the files of lib/tree/ itself
 * sit on top.  node/ calls nothing in derived/ nor layout.c, derived/
 * nothing in layout.c (scripts/check_layers).
 *
 * Nodes: a common head (struct node) embedded first in a per-kind struct
 * (container_of), with a per-kind ops table.  Three lifetimes:
 *   - transient nodes (hidden files made on lookup: slice names, widened
 *     views) sit in the hidden-name map with a count of kernel references
 *     (+1 per ckpt_view_lookup answer, -n per ckpt_view_forget); at 0 they
 *     leave the map and are freed.
 *   - the nodes of a committed step of a live root (node->step names the
 *     step: the kid of the root they lie under) go together, step by
 *     step.  The step node counts references for all of them (step->refs):
 *     one for the root's tree while the step is listed, plus one per
 *     kernel reference to any of its nodes (ckpt_view_lookup and
 *     ckpt_view_readdir_ref answers +1, ckpt_view_forget -n).  A rescan
 *     that finds the step folder gone unlinks it (LIVE -> GONE, ns_lock
 *     exclusive), queues its name for an entry invalidation (so that the
 *     kernel drops its dentries and sends the forgets) and drops the
 *     tree's reference.  Whoever drops the last one frees the step, under
 *     scan_mu (GONE -> FREEING, step_reclaim in node.c): its nodes leave
 *     the hidden-name map, the invalidation list and the node table (one
 *     alloc_lock section), its arrays (after their prefetch tasks ended)
 *     and stores leave the view's lists (res_lock) and are destroyed, then
 *     the nodes' memory goes.  The state table is node_life in node.c.
 *   - every other node (the root, its .ckptfs/, pending steps, a step or
 *     item mount, a step not in a live root) lives as long as the view.
 * A freed node's inode number is reused with a new generation.  Why no
 * freed node is ever touched: the kernel sends no request for an inode it
 * has forgotten, and forgets an inode only after every request on it was
 * answered (an open file holds its inode, hence its reference); a lookup or
 * readdir reaches a step only while it is listed (under ns_lock) or through
 * a directory of it the kernel holds; the library's own walks of the node
 * table (queue_gone_files, under alloc_lock), of the array list
 * (retire_gone_arrays, under res_lock and scan_mu) and of the invalidation
 * list (dyn_lock) are serialized with the frees; read-ahead and next-file
 * warming queue prefetch tasks that ckpt_array_destroy waits for; nothing
 * in the library keeps a node pointer across calls otherwise.  A node is
 * published when its inode number is handed
 * out; from then on its name, kind, ops and parent never change.  What
 * changes after publication, and under which lock:
 *   - the kids of the root (pending steps and committed steps are added and
 *     removed; a root rescan adds the steps that appeared in the source and
 *     unlinks the vanished ones) and of pending directories: ns_lock
 *     exclusive to change, ns_lock shared to read.  Kids of committed
 *     directories other than the root are built before the directory is
 *     linked and never change, except a committed step of a root: its kids
 *     are built once, on first use (ops->load, under the step's load_mu),
 *     and never change afterwards.
 *   - the hidden-name map: dyn_lock.
 *   - a shards directory's unit list: made once, under its own mutex.
 *   - node->orphan, node->gone, pstep->dead/committing: atomics (read
 *     without locks).
 *   - a step's life and refs, a node's kref: atomics; the view's list of
 *     steps a rescan unlinked: scan_mu.
 *   - a pending file's header state: its pfile mutex (pending/).
 *
 * ---- Lock order of libckpt ---------------------------------------------------
 * Outer first: a lock may be taken only while every lock the thread holds
 * is an ancestor of it in this tree; a lock with several parents is listed
 * under each (its own locks the first time).  Generated by scripts/lock_tree
 * from the table in include/ckpt/lockrank.h, whose wrappers (ckpt_lock,
 * ckpt_rdlock, ckpt_wrlock) assert it in debug and sanitizer builds.
 *
 * v->scan_mu  (a rescan of the root: listing without view locks, then ns_lock exclusive; the
 * |            freeing of a pruned step)
 * |-> v->ns_lock  (rwlock. Shared: lookup, readdir, user.ckpt.shards. Exclusive: mkdir, create,
 * |   |            rename, unlink, rmdir, the two short sections of a commit)
 * |   |-> step->load_mu  (a committed step of a root building its kids, once)
 * |   |   |-> v->res_lock  (the view's store and array lists)
 * |   |   |-> v->alloc_lock  (node table appends, and the frees of a pruned step's nodes)
 * |   |   '-> cache->lock  (decoded-chunk cache entries; the fill callback runs without it)
 * |   |-> sd->units_mu  (one NAME.shards/ listing its units, once)
 * |   |   |-> v->alloc_lock  (node table appends, and the frees of a pruned step's nodes)
 * |   |   '-> cache->lock  (decoded-chunk cache entries; the fill callback runs without it)
 * |   |-> v->dyn_lock  (hidden-name map, transient nodes' references)
 * |   |-> ps->wp_mu  (the processes writing a pending step)
 * |   '-> ps->io_lock  (rwlock. Shared: write, read-back, setxattr of a pending file. Exclusive:
 * |       |             commit (without ns_lock), abort)
 * |       |-> pf->mu  (a pending file's header state and size)
 * |       |   |-> step->decl_mu  (writer: items, arrays, key paths (declare))
 * |       |   |   |-> array->mu  (writer: one array's chunk table and chunk states)
 * |       |   |   |   '-> step->mu  (writer: budget, compression queue, spill list)
 * |       |   |   |-> wlive->mu  (writer: one chunk buffer; a leaf, taken with no other writer
 * |       |   |   |               lock held but decl_mu (the multi-host merge))
 * |       |   |   '-> wshard->mu  (writer: appends to one shard file; a leaf, also read under
 * |       |   |                    decl_mu by the multi-host records)
 * |       |   |-> wlive->mu  (writer: one chunk buffer; a leaf, taken with no other writer lock
 * |       |   |               held but decl_mu (the multi-host merge))
 * |       |   '-> wshard->mu  (writer: appends to one shard file; a leaf, also read under decl_mu
 * |       |                    by the multi-host records)
 * |       |-> v->res_lock  (the view's store and array lists)
 * |       |-> v->alloc_lock  (node table appends, and the frees of a pruned step's nodes)
 * |       '-> cache->lock  (decoded-chunk cache entries; the fill callback runs without it)
 * |-> v->inval_mu  (inodes to invalidate in the kernel; filled by a rescan)
 * '-> iq.mu  (fs/inval.c: the daemon's invalidation queue (kicked by a rescan))
 * vs->run_mu  (a view's tensor reads in flight per run of one source; a leaf, taken with no other
 *              lock held)
 */

/*
 * The read path and a commit, in the order above (ranks of
 * include/ckpt/lockrank.h):
 *
 *   Read path (under ns_lock shared, units_mu, or nothing):
 *     cache->lock (entry table; the fill callback runs WITHOUT it)
 *     fill -> store -> OCDBT db->mu (node cache; leaf)
 *     ctx->pool_lock (starting the decode pool), ctx->drain_lock, pool->lock: leaves
 *
 *   A commit: ns_lock exclusive { checks; ps->committing = 1 }; then, with no
 *   view lock, io_lock exclusive { ckpt_step_commit: drain, fsync, rename };
 *   the committed folder is read back into unlinked nodes (res_lock,
 *   alloc_lock, read path); then ns_lock exclusive { swap the step's node
 *   for the committed one; committing = 0 }.  So lookups and readdirs of
 *   the whole mount go on while a step drains and fsyncs.  A namespace call
 *   never waits for io_lock of a committing step (the commit needs ns_lock
 *   to finish): it refuses it with -EROFS, as it would once committed.
 */
#ifndef CKPT_TREE_INT_H
#define CKPT_TREE_INT_H

/* The translators (lib/foreign/, built with CKPT_LAYER_FOREIGN) sit below
 * the tree: lib/tree/ is not on their include path, and this refuses them
 * by any other path. */
#ifdef CKPT_LAYER_FOREIGN
#error "tree_int.h is the node model: a translator (lib/foreign/) never sees nodes; it builds a virtual item with foreign.h"
#endif

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "array.h"
#include "lockrank.h"
#include "recipe.h"
#include "safetensors.h"
#include "view.h"

/* A path in the source folder, and a file name plus a suffix. */
#define VIEW_PATH_MAX 4096
#define VIEW_NAME_BUF (VIEW_PATH_MAX + 104)
/* A '.'-joined key path (param name) built from a tree walk. */
#define VIEW_KEYPATH_MAX 8192

enum node_kind {
	N_DIR, /* step, item, pytree node, .ckptfs/, .stored/ and .views/ folders (committed) */
	N_ARRAY, /* NAME.npy, NAME[slice].npy, NAME.f32.npy, NAME.shards/[..].npy: region of an array */
	N_FILE, /* regular file read from a store (store, key) or synthesized (content) */
	N_SHARDS, /* NAME.shards/ */
	N_STATS, /* .ckptfs/stats, .ckptfs/log */
	N_SAFETENSORS, /* X.safetensors, and the shard files of X.safetensors.d/ */
	N_STDIR, /* X.safetensors.d/ */
	N_PSTEP, /* a pending step (mkdir at the root of a writable mount) */
	N_PDIR, /* an item or pytree directory inside a pending step */
	N_PFILE, /* NAME.npy or NAME[slice].npy being written */
	N_BROKEN, /* NAME.npy of an array whose metadata or store is unusable: listed, reads -EIO */
	N_SUMMARY, /* .ckptfs/summary.txt, .ckptfs/summary.json (summary.c) */
	N_VIEWFILE, /* a safetensors file of STEP/.views/NAME/ (views.c) */
	N_LINK, /* a root's `latest` symlink (latest.c) */
	N_KINDS
};

struct node;
struct iovec;

/*
 * What a kind does.  Every function gets the node of its kind.  NULL
 * entries give the default named on each line.
 */
struct node_ops {
	enum node_kind kind;
	size_t size; /* bytes of the per-kind struct (ckpt_node_new allocates it) */
	/* a is filled with ino, mtime, nlink 1, immutable 1; the kind adds the rest */
	void (*getattr)(ckpt_view *v, struct node *n, ckpt_attr *a); /* required */
	ssize_t (*read)(ckpt_view *v, struct node *n, uint64_t off, size_t len, void *dst); /* -EISDIR */
	int (*read_iov)(ckpt_view *v, struct node *n, uint64_t off, size_t len, struct iovec *iov, int max,
			ckpt_pin **pins, int *npins); /* -ENOTSUP */
	ssize_t (*getxattr)(ckpt_view *v, struct node *n, const char *name, char *buf,
			    size_t cap); /* -ENODATA */
	ssize_t (*listxattr)(ckpt_view *v, struct node *n, char *buf, size_t cap); /* 0 */
	/* Directories: entry `index` (1 and *out, 0 past the end, -errno);
	 * called with ns_lock shared.  NULL: not a directory (-ENOTDIR). */
	int (*readdir)(ckpt_view *v, struct node *dir, uint64_t index, struct node **out);
	/* A name that is neither a kid nor in the hidden-name map: 0 and a new
	 * hidden node (the caller publishes it in the map), 1 and a node the
	 * directory keeps itself (not put in the map), or -errno.  Called with
	 * ns_lock shared.  NULL: -ENOENT. */
	int (*lookup)(ckpt_view *v, struct node *dir, const char *name, struct node **out);
	/* Number of readdir entries, for directories that make them lazily. */
	int (*nentries)(ckpt_view *v, struct node *dir, uint64_t *count);
	/* Directories whose kids are made on first use (committed steps of a
	 * root): make them now; once made, a later call returns at once.
	 * Called (through node_load) before the kids are read, with ns_lock
	 * shared or not at all.  NULL: the kids are always there. */
	int (*load)(ckpt_view *v, struct node *dir);
	/* Release what the kind owns; runs at view destroy before the view's
	 * arrays, stores and context go.  NULL: nothing. */
	void (*destroy)(ckpt_view *v, struct node *n);
	/* A file is being opened: revalidate what it serves (cheap and bounded:
	 * it runs on every open).  1 when bytes the kernel may keep from
	 * earlier opens could be stale (the open then drops them), 0, or -errno.
	 * NULL: 0. */
	int (*open)(ckpt_view *v, struct node *n);
	/* ckpt_view_getattr is about to answer for n: make what its attributes
	 * depend on (called with no view lock held; never from a lookup or a
	 * readdir, which answer under ns_lock).  NULL: nothing. */
	void (*prepare)(ckpt_view *v, struct node *n);
	/* Pending steps: the final name the step takes while it commits
	 * (committing or sealed), else NULL.  Read with ns_lock held.  NULL: none. */
	const char *(*reserves)(struct node *n);
	/* Symlinks: the target into buf (NUL-terminated), its length, or
	 * -errno (-ENAMETOOLONG when cap is too small); called with ns_lock
	 * shared.  NULL: not a symlink (-EINVAL). */
	ssize_t (*readlink)(ckpt_view *v, struct node *n, char *buf, size_t cap);
};

/* The head of every node. */
struct node {
	ckpt_ino ino;
	ckpt_ino parent;
	enum node_kind kind;
	const struct node_ops *ops;
	char *name;
	int64_t mtime_ns;
	int hidden; /* reachable by name (hidden-name map), not listed; set before publication */
	/* a step of the root committed through this mount (pending/), whose
	 * nodes accept chmod/chown from the tool that copied it; set before
	 * publication */
	int written_here;
	/* Freed when the kernel forgets it: a hidden file made on lookup (slice
	 * names, widened views).  Set before publication. */
	int transient;
	uint64_t gen; /* generation of ino: a reused inode number gets a new one */
	uint64_t nlookup; /* transient: kernel references (lookups not yet forgotten); dyn_lock */
	/* transient: on the view's invalidation list (answered since last handed out there); dyn_lock */
	struct node *inval_prev, *inval_next;
	int on_inval;
	int inval_swept; /* its parent's entry was invalidated while it was on the list (node.c) */
	/* The step of a live root the node belongs to: its own number for a kid
	 * of the root, the parent's step below, 0 for the root.  Set before
	 * publication. */
	ckpt_ino step;
	/* A kid of the root: its life (enum node_life, node.c) and, while
	 * tracked (a committed step of a live root), the references that keep
	 * it and every node of it: the tree's, and the kernel's (see above). */
	_Atomic int life;
	atomic_uint_least64_t refs;
	/* in a tracked step: the kernel's references to this node itself (its
	 * entry is invalidated when the step goes) */
	atomic_uint_least64_t kref;
	atomic_bool orphan; /* removed from its directory (committed/aborted/renamed/unlinked) */
	/* a committed step being deleted through the mount (prune.c): out of
	 * the source and of the root's kids, in the hidden-name map until its
	 * rmdir */
	atomic_bool pruned;
	atomic_bool gone; /* its source vanished (a step pruned from a live root): it and
			   * everything below it answer -ENOENT/-ESTALE (ckpt_node_is_gone) */
	/* NODE_OPENED once a file was opened (the kernel may keep pages of it);
	 * NODE_INVAL_QUEUED once it went and was queued for an inode
	 * invalidation (view.c). */
	atomic_int kcache;
};

#define NODE_OPENED 1
#define NODE_INVAL_QUEUED 2
_Static_assert((NODE_OPENED & NODE_INVAL_QUEUED) == 0, "kcache holds both flags in one int");

#ifndef container_of
#define container_of(p, type, member) ((type *)((char *)(p)-offsetof(type, member)))
#endif

/* N_DIR, N_STDIR, N_PSTEP, N_PDIR */
struct dir_node {
	struct node n;
	struct node **kids; /* sorted by name (the root's step folders by number: node.c) */
	size_t nkids, capkids;
};

struct aref { /* one stored array, shared by its .npy, slices and shards */
	ckpt_array *arr;
	char *sharding; /* JSON string from _sharding, or NULL */
	int ocdbt;
	ckpt_ino step; /* the step of a live root it belongs to (0: none); res_lock */
	int retired; /* its step is gone and its cached data dropped; res_lock */
};

/* N_ARRAY */
struct array_node {
	struct node n;
	struct aref *ar;
	ckpt_region region;
	char *hdr; /* the .npy header (hdrlen bytes) */
	size_t hdrlen;
	uint64_t size;
	atomic_int next_warmed; /* the next files of the tree walk were prefetched (once) */
	atomic_uint seen_changes; /* the array's change count at the last open (ckpt_array_open_check) */
	int widen; /* NAME.f32.npy: the region served as float32 (bfloat16, float8 widened exactly) */
};

/* N_FILE */
struct file_node {
	struct node n;
	ckpt_store *store; /* a file of the source: the view's source store (borrowed) ... */
	char *key; /* ... and its key there; or */
	char *content; /* the bytes themselves */
	uint64_t size;
	int stored_copy; /* a file of STEP/.stored/: reads count in stored_copy_bytes */
};

/* N_SHARDS */
struct shards_node {
	struct node n;
	pthread_mutex_t units_mu;
	int listed; /* under units_mu; units/nunits are fixed once set */
	struct node **units;
	size_t nunits;
};

/* N_SAFETENSORS */
struct st_node {
	struct node n;
	struct node *stdir; /* the directory it covers */
	ckpt_st_layout *st;
	struct node **st_arrays; /* tensor i of the layout is st_arrays[i] (N_ARRAY nodes) */
	int st_borrowed; /* st/st_arrays belong to the X.safetensors.d/ directory */
	uint64_t size;
	atomic_uint_least64_t st_next; /* end of the last read of a file streamed from 0, else UINT64_MAX */
	atomic_uint seen_changes; /* sum of its arrays' change counts at the last open */
	atomic_size_t open_rr; /* the tensor the next open starts checking at */
};

/* N_STDIR */
struct stdir_node {
	struct dir_node d;
	ckpt_st_sharded *sts; /* the shard set (owns the layouts) */
	struct node **st_arrays; /* shared by the shard files */
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
	/* inode numbers of freed transient nodes, reused first (alloc_lock) */
	ckpt_ino *free_inos;
	size_t nfree, capfree;
	uint64_t last_gen; /* generation handed to the last reused number (alloc_lock) */
	/* hidden nodes created by lookup: (parent, name) -> node */
	pthread_mutex_t dyn_lock;
	struct node **dyn;
	size_t ndyn_buckets, ndyn;
	/* transient nodes answered by a lookup since ckpt_view_next_inval last
	 * handed them out, oldest first (dyn_lock) */
	struct node *inval_head, *inval_tail;
	size_t inval_len; /* nodes on that list */
	pthread_rwlock_t ns_lock; /* see the lock order above */
	/* pending/raw.c: the copy-tool watch, a thread that commits stored
	 * copies once the processes that copied them have exited (started on
	 * first need, under ns_lock exclusive) */
	struct copy_watch *copy_watch;
	/* run first thing at view destroy (ckpt_view_add_stop_hook) */
	struct view_stop_hook {
		void (*fn)(ckpt_view *v, void *arg);
		void *arg;
	} stop_hooks[4];
	int nstop_hooks;
	char *source; /* what was mounted, as given */
	ckpt_store *src; /* its root store (also in stores[]): all discovery goes through it */
	int writable; /* a CheckpointManager root not mounted read-only */
	int live; /* a CheckpointManager root: steps come and go in the source */
	/* root rescans (view.c): the source's mtime at the last listing */
	pthread_mutex_t scan_mu;
	int64_t scan_mtime; /* under scan_mu */
	uint64_t scan_at_ns; /* monotonic time of the last listing, under scan_mu */
	int scan_unsure; /* the mtime was too recent to trust (coarse clocks): list again */
	/* the root's mtime as shown: moves whenever a rescan changed the steps,
	 * so that the kernel drops its cached listing of the root */
	_Atomic int64_t root_mtime;
	/* owned resources, appended under res_lock (and removed there when
	 * their step is freed) */
	pthread_mutex_t res_lock;
	ckpt_store **stores;
	ckpt_ino *store_step; /* the step each store belongs to (0: the view) */
	size_t nstores;
	struct aref **arefs;
	size_t narefs;
	/* inodes of opened files whose step went (root rescan), to be
	 * invalidated in the kernel (ckpt_view_next_inval_inode; inval_mu, leaf) */
	pthread_mutex_t inval_mu;
	ckpt_ino *inval_inos;
	size_t ninval, capinval;
	/* views.c: the recipes, read on first use (set once, compare-and-swap) */
	struct recipe_set *_Atomic recipes;
	/* steps a rescan unlinked, whose tree reference the rescan drops once
	 * it is done with them (scan_mu) */
	struct node **unlinked;
	size_t nunlinked, capunlinked;
	void (*inval_notify)(void *arg); /* set before requests are served */
	void *inval_arg;
	struct node *latest; /* a root's `latest` symlink (latest.c), else NULL; set at open */
};

/* ---- node/node.c ----------------------------------------------------------- */
/* (also ckpt_view_forget and ckpt_view_next_inval of view.h) */

static inline int node_has_kids(const struct node *n)
{
	return n->kind == N_DIR || n->kind == N_STDIR || n->kind == N_PSTEP || n->kind == N_PDIR;
}

static inline struct dir_node *to_dir(struct node *n)
{
	assert(node_has_kids(n));
	return container_of(n, struct dir_node, n);
}

static inline struct array_node *to_array(struct node *n)
{
	assert(n->kind == N_ARRAY);
	return container_of(n, struct array_node, n);
}

static inline struct file_node *to_file(struct node *n)
{
	assert(n->kind == N_FILE);
	return container_of(n, struct file_node, n);
}

static inline struct shards_node *to_shards(struct node *n)
{
	assert(n->kind == N_SHARDS);
	return container_of(n, struct shards_node, n);
}

static inline struct st_node *to_st(struct node *n)
{
	assert(n->kind == N_SAFETENSORS);
	return container_of(n, struct st_node, n);
}

static inline struct stdir_node *to_stdir(struct node *n)
{
	assert(n->kind == N_STDIR);
	return container_of(to_dir(n), struct stdir_node, d);
}

/* The node of inode ino, or NULL (lock-free). */
struct node *ckpt_node_at(ckpt_view *v, ckpt_ino ino);
/* 1 when n or one of its ancestors vanished from the source (lock-free). */
int ckpt_node_is_gone(ckpt_view *v, const struct node *n);
/* Make dir's kids if it builds them lazily (ops->load); 0 or -errno. */
static inline int node_load(ckpt_view *v, struct node *dir)
{
	return dir->ops->load ? dir->ops->load(v, dir) : 0;
}
/* A new node of ops->kind, zeroed past the head, in the node table (not yet
 * linked anywhere); mtime from the parent.  NULL on out of memory. */
struct node *ckpt_node_new(ckpt_view *v, const struct node_ops *ops, const char *name, struct node *parent);
/* Kids (dir: a node with kids; callers hold ns_lock exclusive once dir is reachable). */
int ckpt_node_add_kid(struct node *dir, struct node *kid);
void ckpt_node_remove_kid(struct node *dir, struct node *kid);
struct node *ckpt_node_find_kid(struct node *dir, const char *name);
/* Position of kid `name` in dir's kids: 1 and *pos when found. */
int ckpt_node_kid_index(struct node *dir, const char *name, size_t *pos);
/* Generic readdir of a node with kids. */
int ckpt_node_readdir_kids(ckpt_view *v, struct node *dir, uint64_t index, struct node **out);
/* Entry `index` of directory ino, as ckpt_view_readdir answers it (without
 * the root's rescan): takes ns_lock shared, so the caller holds no view lock.
 * ref: count a kernel reference on the entry (ckpt_view_readdir_ref). */
int ckpt_node_entry(ckpt_view *v, ckpt_ino ino, uint64_t index, const char **name, ckpt_attr *attr, int ref);
/* The hidden-name map (takes dyn_lock itself). */
struct node *ckpt_node_dyn_find(ckpt_view *v, ckpt_ino parent, const char *name);
int ckpt_node_dyn_add(ckpt_view *v, struct node *n);
/* Take a node that is not transient out of the map (no-op when absent). */
void ckpt_node_dyn_remove(ckpt_view *v, struct node *n);
/* Name lookup in dir: kids, hidden-name map, then dir->ops->lookup (the
 * result published in the map).  Caller holds ns_lock shared. */
int ckpt_node_lookup_locked(ckpt_view *v, struct node *dir, const char *name, struct node **out);
/* The same, for an answer to the kernel: a transient result may be freed by
 * a forget at any time, so only this call, which counts one kernel
 * reference on it inside the map's lock, may hand one out. */
int ckpt_node_lookup_ref(ckpt_view *v, struct node *dir, const char *name, struct node **out);
/* Free a node nobody can reach any more (in no directory, not in the map,
 * no kernel reference): ops->destroy, then its memory; its inode number is
 * reused with a new generation. */
void ckpt_node_free(ckpt_view *v, struct node *n);
void ckpt_node_fill_attr(ckpt_view *v, struct node *n, ckpt_attr *a);
/* The step life (node.c): a committed step of a live root, not linked
 * yet, becomes tracked (one reference: the tree's, taken when it is
 * linked under the root). */
void ckpt_node_step_track(struct node *step);
/* A rescan unlinked tracked step s from the root (ns_lock exclusive, under
 * scan_mu): LIVE -> GONE; its name is queued for an entry invalidation and
 * s for ckpt_node_drop_unlinked. */
void ckpt_node_step_gone(ckpt_view *v, struct node *s);
/* The rescan is done with the steps it unlinked (scan_mu held, no other
 * view lock): drop the tree's reference of each; the ones nothing else
 * holds are freed now.  1 when any was unlinked. */
int ckpt_node_drop_unlinked(ckpt_view *v);
/* n was answered to the kernel k more times (a lookup, a READDIRPLUS
 * entry): count it on n's step.  n must be reachable (listed, or under a
 * directory the kernel holds) for the whole call. */
void ckpt_node_kref(ckpt_view *v, struct node *n, uint64_t k);
/* View destroy: ops->destroy of every node (what the kinds own; the nodes
 * stay), then, after the arrays and stores went, every node's memory and the
 * node table. */
void ckpt_node_release_all(ckpt_view *v);
void ckpt_node_free_all(ckpt_view *v);
/* The view's owned stores and arrays (take res_lock).  owner: the node
 * whose tree uses the store (its step's, freed with it), or NULL. */
int ckpt_node_own_store(ckpt_view *v, ckpt_store *s, const struct node *owner);
struct aref *ckpt_node_new_aref(ckpt_view *v, ckpt_array *arr, int ocdbt);
/* 1 when s ends with suffix (and is longer), *stem = its length without it. */
int ckpt_node_ends_with(const char *s, const char *suffix, size_t *stem);

/* ---- node/xattr.c ---------------------------------------------------------- */

ssize_t ckpt_array_getxattr(ckpt_view *v, struct node *n, const char *name, char *buf, size_t cap);
ssize_t ckpt_array_listxattr(ckpt_view *v, struct node *n, char *buf, size_t cap);
/* A listxattr answer of names[i] (those with skip[i] 0; skip may be NULL),
 * each with its NUL: the size needed when cap is 0, -ERANGE when it does
 * not fit. */
ssize_t ckpt_xattr_list(const char *const *names, size_t count, const uint8_t *skip, char *buf, size_t cap);

/* ---- node/array_files.c ---------------------------------------------------- */

extern const struct node_ops ckpt_array_ops, ckpt_st_ops;
/* Set up array node n (made with ckpt_array_ops) as region r of ar. */
int ckpt_array_node_init(struct node *n, struct aref *ar, const ckpt_region *r);
/* The same, served as float32 (NAME.f32.npy); -ENOTSUP unless the dtype is
 * bfloat16, float8_e4m3fn or float8_e5m2. */
int ckpt_array_node_init_f32(struct node *n, struct aref *ar, const ckpt_region *r);

/* ---- node/plain_files.c ---------------------------------------------------- */

extern const struct node_ops ckpt_file_ops, ckpt_stats_ops, ckpt_log_ops;

/* ---- derived/summary.c ----------------------------------------------------- */
/* (also ckpt_view_summary, ckpt_human and ckpt_json_str of summary.h) */

/* The arrays under dir and their bytes (logical: shape x itemsize; stored:
 * user.ckpt.stored_bytes), and the arrays listed but unreadable: the walk
 * of ckpt_view_summary without the text.  No view lock may be held. */
struct summary_totals {
	uint64_t arrays, logical, stored, unreadable;
};
int ckpt_summary_totals(ckpt_view *v, ckpt_ino dir, struct summary_totals *t);

/* Add the summary files (summary.txt, summary.json: the table of `ckptfs
 * info` for meta's parent, built on first open/read/getattr, outside
 * ns_lock) as kids of the hidden .ckptfs/ directory meta before it is
 * published. */
int ckpt_summary_add_files(ckpt_view *v, struct node *meta);

/* ---- derived/views.c ------------------------------------------------------- */
/* (also ckpt_view_recipe_table of view.h) */

#define CKPT_VIEWS_DIR ".views"
/* ckpt_dir_ops lookup of ".views" in a committed step of a root (or the
 * root of a step mount): 0 and a new hidden directory with one folder per
 * recipe that matches the step; -ENOENT for any other name or directory,
 * or -errno.  Called with ns_lock shared. */
int ckpt_views_lookup(ckpt_view *v, struct node *dir, const char *name, struct node **out);
/* Free the recipe set (view destroy, after the nodes). */
void ckpt_views_destroy(ckpt_view *v);
/* The recipe named `name` (read on first use), or NULL. */
const ckpt_recipe *ckpt_views_recipe(ckpt_view *v, const char *name);

/* ---- derived/latest.c ------------------------------------------------------ */

#define CKPT_LATEST_NAME "latest"
/* Make v->latest (a root view, at open).  0 or -ENOMEM. */
int ckpt_latest_make(ckpt_view *v);
/* 1 when (parent, name) is the root's `latest` entry. */
int ckpt_latest_is(ckpt_view *v, ckpt_ino parent, const char *name);
/* The root's `latest` entry when the root has a committed step: 1 and
 * *out (its size refreshed), else 0.  ns_lock held. */
int ckpt_latest_entry(ckpt_view *v, struct node **out);
/* A write call on `latest` (what: "remove", "rename", ...): -EPERM, logged. */
int ckpt_latest_refuse(const char *what);

/* ---- derived/companions.c -------------------------------------------------- */

/* STEP/.stored/: a committed step's files as stored */
#define CKPT_STORED_DIR ".stored"
/* Committed directories: kids, then (show_companions) NAME.shards and
 * X.safetensors entries; hidden companions made on lookup. */
extern const struct node_ops ckpt_dir_ops;

/* ---- layout.c -------------------------------------------------------------- */

/* Fill v's root from SOURCE (a folder, or one file of a foreign format):
 * detect what it is; a root's steps become lazy step nodes (named only;
 * built on first use).  A non-empty source that is none of item, step or
 * root is refused with -EMEDIUMTYPE (logged: what was looked for) unless
 * opts.force_root; a read error met on the way fails it (-EIO).  src: read
 * that store (one more reference taken) instead of opening `source`'s. */
int ckpt_layout_build_view(ckpt_view *v, const char *source, ckpt_store *src);
/* Build the committed step folder `name` of the source as a new directory
 * node of the root (not yet linked into the root's kids).  Takes no view
 * lock but res_lock/alloc_lock: callable without ns_lock. */
struct node *ckpt_layout_new_step(ckpt_view *v, const char *name);
/* The item folder `path` (relative to the source) read as an item into a
 * new directory node that is linked nowhere (a stored copy checked before
 * its step commits); NULL on ENOMEM. */
struct node *ckpt_layout_new_item(ckpt_view *v, const char *path);
/* A looked-up or stat'ed step of a root reads its commit time (once). */
void ckpt_layout_step_touch(ckpt_view *v, struct node *n);
/* Root rescan: the step folder names of the source (no view lock held)... */
struct layout_steps;
int ckpt_layout_list_steps(ckpt_view *v, struct layout_steps **out);
/* ... then, with ns_lock exclusive: link the new ones as lazy step nodes,
 * unlink and mark gone the committed steps no longer listed (pending steps
 * and names a committing step takes stay).  Frees the list; returns the
 * number of steps linked or unlinked. */
int ckpt_layout_apply_steps(ckpt_view *v, struct layout_steps *l);
/* 1 when a committing step of the root takes `name` (ns_lock held): asks
 * each pending step through its ops (reserves). */
int ckpt_name_reserved(struct node *root, const char *name);

/* ---- prune.c --------------------------------------------------------------- */

/* The committed step of a writable root's view that n is in (n itself when
 * it is one), or NULL. */
struct node *ckpt_prune_step_of(ckpt_view *v, struct node *n);
/* unlink (rmdir_op 0) or rmdir (1) of n (NULL: a name not there) in dir,
 * inside a committed step: the first such call deletes the whole step
 * from the source (see prune.c); 0 or -errno.  ns_lock exclusive held. */
int ckpt_prune_remove(ckpt_view *v, struct node *dir, struct node *n, int rmdir_op);

/* ---- views_import.c -------------------------------------------------------- */

struct ckpt_step;

/* mkdir STEP/.views/NAME in pending step `step`: 0 when recipe NAME
 * imports; -ENOENT (no such recipe) or -EOPNOTSUPP (an op that does not
 * invert), logged with the rule and op. */
int ckpt_vimport_check(ckpt_view *v, const char *step, const char *name);
/* In the commit of pending step `stepname` (io_lock exclusive, no ns_lock):
 * every folder <tmp>/.views/NAME/ staged by the step becomes arrays of the
 * step through recipe NAME the other way, then the staged files go.  0
 * when there is none; else -errno, logged, and nothing declared. */
int ckpt_vimport_commit(ckpt_view *v, struct ckpt_step *step, const char *stepname);

/* ---- pending/ ---------------------------------------------------------------- */
/* (also the write-side calls of view.h: ckpt_view_mkdir, ckpt_view_create,
 * ckpt_view_write, ...; the folder's own calls are in pending/pending_int.h) */

/* A writable local root shows each <step>.orbax-checkpoint-tmp folder it
 * holds at open (left by an earlier mount or Orbax run) as a pending step
 * stored as written (pending/step.c).  Called once by view open. */
void ckpt_pending_adopt_leftovers(ckpt_view *v);

/* ---- view.c's stop hooks ----------------------------------------------------- */

/* A thread of a file below view.c registers fn(v, arg) to be stopped first
 * thing at ckpt_view_destroy (hooks run last registered first).  Called
 * under ns_lock exclusive; 0, or -ENOSPC when the table is full. */
static inline int ckpt_view_add_stop_hook(ckpt_view *v, void (*fn)(ckpt_view *v, void *arg), void *arg)
{
	if (v->nstop_hooks == (int)(sizeof(v->stop_hooks) / sizeof(v->stop_hooks[0])))
		return -ENOSPC;
	v->stop_hooks[v->nstop_hooks].fn = fn;
	v->stop_hooks[v->nstop_hooks++].arg = arg;
	return 0;
}

#endif
