/*
 * pool.h - a fixed set of worker threads running queued tasks (chunk
 * decodes ahead of readers).  The writer does not use it: each pending
 * step runs its own compression threads (lib/write/writer_zpool.c).
 *
 * Thread-safety: submit may be called from any thread.  destroy drains
 * nothing: queued tasks are run to completion first, then threads join.
 *
 * fork: the child has none of the workers.  A pool is safe to fork under
 * only while it is at rest (every worker parked, nothing queued; create
 * returns so, ckpt_pool_quiesce waits for it): a worker that is starting,
 * or running or returning from a task, may hold a lock of the C library,
 * of a sanitizer runtime (its allocator) or of a task, and the child gets
 * that lock held by no thread.  The child must not submit to the parent's
 * pool (no worker would run the task); it makes its own.
 */
#ifndef CKPT_POOL_H
#define CKPT_POOL_H

#include <stddef.h>

typedef struct ckpt_pool ckpt_pool;
typedef void (*ckpt_task_fn)(void *arg);

/* nthreads >= 1 workers; at most max_queued tasks wait at once.  Returns
 * once every worker has started and parked (the pool is at rest). */
int ckpt_pool_create(int nthreads, size_t max_queued, ckpt_pool **out);

/* Queue fn(arg).  -EAGAIN when the queue is full (the caller keeps arg). */
int ckpt_pool_try_submit(ckpt_pool *p, ckpt_task_fn fn, void *arg);

/* Queue fn(arg), waiting while the queue is full. */
int ckpt_pool_submit(ckpt_pool *p, ckpt_task_fn fn, void *arg);

/* Run remaining tasks, stop and join the workers, free the pool.  In the
 * child of a fork, for a pool the parent made: free its memory only (the
 * parent's workers and queued tasks are not there). */
void ckpt_pool_destroy(ckpt_pool *p);

int ckpt_pool_threads(const ckpt_pool *p);

/* Wait until the pool is at rest: nothing queued and every worker parked
 * (its task, if any, returned).  Tasks submitted meanwhile are waited for
 * too; the caller must keep others from submitting if it needs the pool
 * to stay at rest (before a fork). */
void ckpt_pool_quiesce(ckpt_pool *p);

/* 1 in the child of a fork for a pool the parent made: its workers are
 * not in this process (submit nothing to it; destroy frees its memory). */
int ckpt_pool_forked(const ckpt_pool *p);

/* Workers parked now, waiting for a task (for tests). */
int ckpt_pool_parked(ckpt_pool *p);

#endif
