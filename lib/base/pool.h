/*
 * pool.h - a fixed set of worker threads running queued tasks (chunk
 * decodes ahead of readers).  The writer does not use it: each pending
 * step runs its own compression threads (lib/write/writer_zpool.c).
 *
 * Thread-safety: submit may be called from any thread.  destroy drains
 * nothing: queued tasks are run to completion first, then threads join.
 */
#ifndef CKPT_POOL_H
#define CKPT_POOL_H

#include <stddef.h>

typedef struct ckpt_pool ckpt_pool;
typedef void (*ckpt_task_fn)(void *arg);

/* nthreads >= 1 workers; at most max_queued tasks wait at once. */
int ckpt_pool_create(int nthreads, size_t max_queued, ckpt_pool **out);

/* Queue fn(arg).  -EAGAIN when the queue is full (the caller keeps arg). */
int ckpt_pool_try_submit(ckpt_pool *p, ckpt_task_fn fn, void *arg);

/* Queue fn(arg), waiting while the queue is full. */
int ckpt_pool_submit(ckpt_pool *p, ckpt_task_fn fn, void *arg);

/* Run remaining tasks, stop and join the workers, free the pool. */
void ckpt_pool_destroy(ckpt_pool *p);

int ckpt_pool_threads(const ckpt_pool *p);

#endif
