#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "common.h"
#include "pool.h"

struct task {
	ckpt_task_fn fn;
	void *arg;
};

struct ckpt_pool {
	pthread_mutex_t lock;
	pthread_cond_t nonempty, nonfull;
	/* Signalled when the last busy worker parks with nothing queued. */
	pthread_cond_t rest;
	struct task *q; /* ring buffer */
	size_t cap, head, len;
	int stop, nthreads;
	/* Workers parked in the wait for a task (under lock).  A worker is not
	 * parked from its start until its first wait, nor while it runs a task
	 * and returns from it. */
	int parked;
	pid_t pid; /* the process the workers run in */
	pthread_t *threads;
};

static int at_rest(const ckpt_pool *p)
{
	return !p->len && p->parked == p->nthreads;
}

static void *worker(void *arg)
{
	ckpt_pool *p = arg;
	pthread_mutex_lock(&p->lock);
	for (;;) {
		while (!p->len && !p->stop) {
			p->parked++;
			if (at_rest(p))
				pthread_cond_broadcast(&p->rest);
			pthread_cond_wait(&p->nonempty, &p->lock);
			p->parked--;
		}
		if (!p->len && p->stop)
			break;
		struct task t = p->q[p->head];
		p->head = (p->head + 1) % p->cap;
		p->len--;
		pthread_cond_signal(&p->nonfull);
		pthread_mutex_unlock(&p->lock);
		t.fn(t.arg);
		pthread_mutex_lock(&p->lock);
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

int ckpt_pool_create(int nthreads, size_t max_queued, ckpt_pool **out)
{
	if (nthreads < 1 || max_queued < 1)
		return -EINVAL;
	ckpt_pool *p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	p->q = calloc(max_queued, sizeof(*p->q));
	p->threads = calloc((size_t)nthreads, sizeof(*p->threads));
	if (!p->q || !p->threads) {
		free(p->q);
		free(p->threads);
		free(p);
		return -ENOMEM;
	}
	p->cap = max_queued;
	p->pid = getpid();
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->nonempty, NULL);
	pthread_cond_init(&p->nonfull, NULL);
	pthread_cond_init(&p->rest, NULL);
	for (int i = 0; i < nthreads; i++) {
		if (pthread_create(&p->threads[i], NULL, worker, p) != 0) {
			ckpt_pool_destroy(p);
			return -EAGAIN;
		}
		pthread_mutex_lock(&p->lock); /* read by the workers (at_rest) */
		p->nthreads = i + 1;
		pthread_mutex_unlock(&p->lock);
	}
	/* Not before every worker is parked: a thread still starting is inside
	 * the thread library or a sanitizer runtime (its allocator), and a fork
	 * then would copy the locks it holds into the child, locked. */
	ckpt_pool_quiesce(p);
	*out = p;
	return 0;
}

void ckpt_pool_quiesce(ckpt_pool *p)
{
	pthread_mutex_lock(&p->lock);
	while (!at_rest(p) && !p->stop)
		pthread_cond_wait(&p->rest, &p->lock);
	pthread_mutex_unlock(&p->lock);
}

static void push(ckpt_pool *p, ckpt_task_fn fn, void *arg)
{
	p->q[(p->head + p->len) % p->cap] = (struct task){ fn, arg };
	p->len++;
	pthread_cond_signal(&p->nonempty);
}

int ckpt_pool_try_submit(ckpt_pool *p, ckpt_task_fn fn, void *arg)
{
	pthread_mutex_lock(&p->lock);
	if (p->len == p->cap || p->stop) {
		pthread_mutex_unlock(&p->lock);
		return -EAGAIN;
	}
	push(p, fn, arg);
	pthread_mutex_unlock(&p->lock);
	return 0;
}

int ckpt_pool_submit(ckpt_pool *p, ckpt_task_fn fn, void *arg)
{
	pthread_mutex_lock(&p->lock);
	while (p->len == p->cap && !p->stop)
		pthread_cond_wait(&p->nonfull, &p->lock);
	if (p->stop) {
		pthread_mutex_unlock(&p->lock);
		return -ESHUTDOWN;
	}
	push(p, fn, arg);
	pthread_mutex_unlock(&p->lock);
	return 0;
}

int ckpt_pool_threads(const ckpt_pool *p)
{
	return p->nthreads;
}

int ckpt_pool_forked(const ckpt_pool *p)
{
	return p->pid != getpid();
}

int ckpt_pool_parked(ckpt_pool *p)
{
	pthread_mutex_lock(&p->lock);
	int n = p->parked;
	pthread_mutex_unlock(&p->lock);
	return n;
}

void ckpt_pool_destroy(ckpt_pool *p)
{
	if (!p)
		return;
	/* The child of a fork: the workers stayed in the parent, and the lock
	 * may be a copy of one a worker held.  Nothing to join or to lock; no
	 * thread here uses the memory. */
	if (ckpt_pool_forked(p)) {
		free(p->q);
		free(p->threads);
		free(p);
		return;
	}
	pthread_mutex_lock(&p->lock);
	p->stop = 1;
	pthread_cond_broadcast(&p->nonempty);
	pthread_cond_broadcast(&p->nonfull);
	pthread_cond_broadcast(&p->rest);
	pthread_mutex_unlock(&p->lock);
	for (int i = 0; i < p->nthreads; i++)
		pthread_join(p->threads[i], NULL);
	pthread_mutex_destroy(&p->lock);
	pthread_cond_destroy(&p->nonempty);
	pthread_cond_destroy(&p->nonfull);
	pthread_cond_destroy(&p->rest);
	free(p->q);
	free(p->threads);
	free(p);
}
