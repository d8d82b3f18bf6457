/*
 * inval.c - make the kernel forget transient names soon.
 *
 * A transient node (a slice name, a widened view: made on lookup) is freed
 * by libckpt when the kernel forgets its inode.  The kernel forgets an
 * inode when its last dentry goes; an expired dentry is not dropped at its
 * last use by every kernel (6.x keeps it on the LRU until memory runs
 * short), so each answered lookup of a transient name is followed by an
 * entry invalidation: the dentry is unhashed, dies at its last dput (at
 * once when unused; when the file is closed when open), and the FORGET
 * follows.
 *
 * The invalidation takes the parent directory's inode lock in the kernel,
 * which a lookup in progress holds, so it must never run in a request
 * handler (the lookup it waits for may need that very thread): a queue and
 * one thread of its own send them.  The queue is bounded; when it is full
 * an invalidation is dropped, and that node lives until the kernel evicts
 * its inode by itself (memory pressure, unmount) or the name is looked up
 * again.  Nothing waits on the queue.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ckfs.h"

/* Invalidations waiting to be sent. */
#define INVAL_QUEUE 8192

struct inval_item {
	fuse_ino_t parent;
	char *name;
};

static struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct inval_item q[INVAL_QUEUE];
	size_t head, len;
	int stop, started;
	unsigned long dropped;
	struct fuse_session *se;
	pthread_t th;
} iq = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };

static void *inval_main(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&iq.mu);
	for (;;) {
		while (!iq.len && !iq.stop)
			pthread_cond_wait(&iq.cv, &iq.mu);
		if (iq.stop)
			break;
		struct inval_item it = iq.q[iq.head];
		iq.head = (iq.head + 1) % INVAL_QUEUE;
		iq.len--;
		pthread_mutex_unlock(&iq.mu);
		/* -ENOENT when the dentry is gone already: nothing to do */
		fuse_lowlevel_notify_inval_entry(iq.se, it.parent, it.name, strlen(it.name));
		free(it.name);
		pthread_mutex_lock(&iq.mu);
	}
	pthread_mutex_unlock(&iq.mu);
	return NULL;
}

int ckfs_inval_start(struct fuse_session *se)
{
	iq.se = se;
	iq.stop = 0;
	if (pthread_create(&iq.th, NULL, inval_main, NULL) != 0)
		return -1;
	iq.started = 1;
	return 0;
}

void ckfs_inval_queue(fuse_ino_t parent, const char *name)
{
	char *copy = strdup(name);
	pthread_mutex_lock(&iq.mu);
	if (!iq.started || iq.stop || !copy || iq.len == INVAL_QUEUE) {
		if (iq.started && !iq.stop && iq.dropped++ == 0)
			ckpt_log(CKPT_LOG_INFO, "entry invalidation queue full: some hidden names stay "
						"cached until the kernel drops them");
		pthread_mutex_unlock(&iq.mu);
		free(copy);
		return;
	}
	iq.q[(iq.head + iq.len) % INVAL_QUEUE] = (struct inval_item){ parent, copy };
	iq.len++;
	pthread_cond_signal(&iq.cv);
	pthread_mutex_unlock(&iq.mu);
}

void ckfs_inval_stop(void)
{
	if (!iq.started)
		return;
	pthread_mutex_lock(&iq.mu);
	iq.stop = 1;
	pthread_cond_signal(&iq.cv);
	pthread_mutex_unlock(&iq.mu);
	pthread_join(iq.th, NULL);
	iq.started = 0;
	for (; iq.len; iq.len--, iq.head = (iq.head + 1) % INVAL_QUEUE)
		free(iq.q[iq.head].name);
}
