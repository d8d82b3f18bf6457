/*
 * lockrank.h - the lock order of libckpt as one table, and lock wrappers
 * that check it (base/lockrank.c).
 *
 * Every lock of the namespace (tree/), of the decoded-chunk cache
 * (read/cache.c), of the writer (write/) and of the daemon's invalidation
 * queue (fs/inval.c) has a rank below.  The ranks form a tree (a lock may
 * have several parents: it then appears under each): a lock may be taken
 * only while every lock the thread holds is one of its ancestors, that is,
 * lies on a path from a root of the tree down to it.  scripts/lock_tree
 * prints the tree from this table; the text in tree/tree_int.h and
 * docs/design.md is that output (tests/py/test_repo.py compares them).
 *
 * Leaf locks of store/ and base/ (OCDBT node cache, HTTP handles, decode
 * pool, stats) and of read/ (the read context's pool locks, an array's
 * set of kept descriptors in kept.c) stay plain pthread calls: each is
 * taken with nothing of its own layer held and calls out of nothing.
 *
 * With NDEBUG defined (Release, RelWithDebInfo) the wrappers are the plain
 * pthread calls and the assertions vanish.  Without it (Debug, and the ASan
 * and TSan builds, which pass -UNDEBUG) each thread keeps the set of ranks
 * it holds and every acquisition checks it: a lock taken out of order, a
 * `*_locked` function called without its lock, or a public entry point
 * called with a view lock held, logs one line naming both locks and aborts.
 */
#ifndef CKPT_LOCKRANK_H
#define CKPT_LOCKRANK_H

#include <pthread.h>

/*
 * The table: CKPT_RANK(ID, lock, what it guards, parents).  parents: the
 * ranks it may be taken directly under, P(ID) | P(ID) ..., or 0 for a root.
 * One line each, in the order the tree lists them (scripts/lock_tree parses
 * these lines).
 */
/* scripts/lock_tree reads one rank a line: */
/* clang-format off */
#define CKPT_RANKS(CKPT_RANK, P) \
	CKPT_RANK(SCAN, "v->scan_mu", "a rescan of the root: listing without view locks, then ns_lock exclusive; the freeing of a pruned step", 0) \
	CKPT_RANK(NS, "v->ns_lock", "rwlock. Shared: lookup, readdir, user.ckpt.shards. Exclusive: mkdir, create, rename, unlink, rmdir, the two short sections of a commit", P(SCAN)) \
	CKPT_RANK(LOAD, "step->load_mu", "a committed step of a root building its kids, once", P(NS)) \
	CKPT_RANK(UNITS, "sd->units_mu", "one NAME.shards/ listing its units, once", P(NS)) \
	CKPT_RANK(DYN, "v->dyn_lock", "hidden-name map, transient nodes' references", P(NS)) \
	CKPT_RANK(WP, "ps->wp_mu", "the processes writing a pending step", P(NS)) \
	CKPT_RANK(IO, "ps->io_lock", "rwlock. Shared: write, read-back, setxattr of a pending file. Exclusive: commit (without ns_lock), abort", P(NS)) \
	CKPT_RANK(PF, "pf->mu", "a pending file's header state and size", P(IO)) \
	CKPT_RANK(W_DECL, "step->decl_mu", "writer: items, arrays, key paths (declare)", P(PF)) \
	CKPT_RANK(W_ARRAY, "array->mu", "writer: one array's chunk table and chunk states", P(W_DECL)) \
	CKPT_RANK(W_STEP, "step->mu", "writer: budget, compression queue, spill list", P(W_ARRAY)) \
	CKPT_RANK(W_LIVE, "wlive->mu", "writer: one chunk buffer; a leaf, taken with no other writer lock held but decl_mu (the multi-host merge)", P(PF) | P(W_DECL)) \
	CKPT_RANK(W_SHARD, "wshard->mu", "writer: appends to one shard file; a leaf, also read under decl_mu by the multi-host records", P(PF) | P(W_DECL)) \
	CKPT_RANK(RES, "v->res_lock", "the view's store and array lists", P(LOAD) | P(IO)) \
	CKPT_RANK(ALLOC, "v->alloc_lock", "node table appends, and the frees of a pruned step's nodes", P(LOAD) | P(UNITS) | P(IO)) \
	CKPT_RANK(CACHE, "cache->lock", "decoded-chunk cache entries; the fill callback runs without it", P(LOAD) | P(UNITS) | P(IO)) \
	CKPT_RANK(INVAL, "v->inval_mu", "inodes to invalidate in the kernel; filled by a rescan", P(SCAN)) \
	CKPT_RANK(FS_INVAL, "iq.mu", "fs/inval.c: the daemon's invalidation queue (kicked by a rescan)", P(SCAN)) \
	CKPT_RANK(VRUN, "vs->run_mu", "a view's tensor reads in flight per run of one source; a leaf, taken with no other lock held", 0)
/* clang-format on */

#define CKPT_RANK_ENUM_(id, lock, what, parents) CKPT_RANK_##id,
#define CKPT_RANK_NOP_(id) 0
enum ckpt_rank { CKPT_RANK_NONE_ = -1, CKPT_RANKS(CKPT_RANK_ENUM_, CKPT_RANK_NOP_) CKPT_RANK_COUNT };

/* The lock a rank names ("v->ns_lock"), for messages. */
const char *ckpt_rank_name(int rank);

/* The checks, always built (the unit test calls them in any build): note
 * an acquisition (before it blocks) or a release of `rank` by this thread;
 * assert that this thread holds / does not hold `rank`.  A violation logs
 * one line (file:line, both locks) and aborts. */
void ckpt_rank_acquire(int rank, const char *file, int line);
void ckpt_rank_release(int rank);
void ckpt_rank_assert_held(int rank, const char *file, int line);
void ckpt_rank_assert_not_held(int rank, const char *file, int line);

#ifdef NDEBUG
#define ckpt_lock(m, rank) pthread_mutex_lock(m)
#define ckpt_unlock(m, rank) pthread_mutex_unlock(m)
#define ckpt_rdlock(l, rank) pthread_rwlock_rdlock(l)
#define ckpt_wrlock(l, rank) pthread_rwlock_wrlock(l)
#define ckpt_rwunlock(l, rank) pthread_rwlock_unlock(l)
#define ckpt_assert_held(rank) ((void)0)
#define ckpt_assert_not_held(rank) ((void)0)
#else
#define ckpt_lock(m, rank) (ckpt_rank_acquire((rank), __FILE__, __LINE__), pthread_mutex_lock(m))
#define ckpt_unlock(m, rank) (ckpt_rank_release(rank), pthread_mutex_unlock(m))
#define ckpt_rdlock(l, rank) (ckpt_rank_acquire((rank), __FILE__, __LINE__), pthread_rwlock_rdlock(l))
#define ckpt_wrlock(l, rank) (ckpt_rank_acquire((rank), __FILE__, __LINE__), pthread_rwlock_wrlock(l))
#define ckpt_rwunlock(l, rank) (ckpt_rank_release(rank), pthread_rwlock_unlock(l))
#define ckpt_assert_held(rank) ckpt_rank_assert_held((rank), __FILE__, __LINE__)
#define ckpt_assert_not_held(rank) ckpt_rank_assert_not_held((rank), __FILE__, __LINE__)
#endif

#endif
