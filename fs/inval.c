/*
 * inval.c - make the kernel forget transient names soon.
 *
 * A transient node (a slice name: made on lookup) is freed by libckpt when
 * the kernel forgets its inode.  The kernel forgets an inode when its last
 * dentry goes, and a /dev/fuse mount keeps even an expired dentry cached
 * until memory runs short.  So each answered lookup of a transient name is
 * followed by an entry invalidation: the dentry is unhashed, dies at its
 * last use (at once when unused; when the file is closed if it is open),
 * and the FORGET follows.
 *
 * The invalidation takes the parent directory's inode lock in the kernel,
 * which a lookup in progress holds until it is answered, so it must never
 * run in a request handler (the lookup it waits for may need that very
 * thread): one thread of its own sends them.  What to invalidate is
 * libckpt's list of transient nodes answered since (ckpt_view_next_inval):
 * no queue here, and no request handler ever waits for this thread.
 * Readers that look names up in one directory outrun one invalidation per
 * name (each waits for the lookups in progress there), so beyond a fixed
 * number waiting (CKPT_VIEW_INVAL_NAMES_CAP) libckpt hands out the
 * directory's own entry instead: its invalidation drops every unused
 * dentry below it at once, and the names still in use are invalidated one
 * by one afterwards.  The nodes waiting for the kernel's forget, hence the
 * daemon's memory, stay bounded whatever the number of readers and names.
 *
 * libckpt's list also holds the entries of a step pruned from a live root
 * and of each node of it the kernel holds: their forgets free the step.
 *
 * The same thread drops the kernel's cached pages of files whose step
 * vanished from a live root (ckpt_view_next_inval_inode): an open
 * descriptor would otherwise go on reading them without asking; after the
 * invalidation its reads reach libckpt, which answers ESTALE.  Those come
 * first: the queue of inodes is emptied before each name, so a prune is
 * never queued behind a flood of names.  It invalidates as soon as it is
 * kicked: letting lookups gather first (1 ms) gained no time under load
 * and let the backlog, hence memory, grow.
 */
#include <pthread.h>
#include <string.h>

#include "ckfs.h"

static struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int kicked, stop, started;
	struct fuse_session *se;
	ckpt_view *view;
	pthread_t th;
} iq = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };

static void *inval_main(void *arg)
{
	(void)arg;
	char name[4096];
	for (;;) {
		ckpt_lock(&iq.mu, CKPT_RANK_FS_INVAL);
		while (!iq.kicked && !iq.stop)
			pthread_cond_wait(&iq.cv, &iq.mu);
		int stop = iq.stop;
		iq.kicked = 0;
		ckpt_unlock(&iq.mu, CKPT_RANK_FS_INVAL);
		if (stop)
			break;
		for (;;) {
			/* Files of a pruned step first, before every name: an open
			 * descriptor reads their cached pages until they go. */
			ckpt_ino ino;
			while (ckpt_view_next_inval_inode(iq.view, &ino) == 1)
				fuse_lowlevel_notify_inval_inode(iq.se, ino, 0, 0); /* -ENOENT: not cached */
			ckpt_ino parent;
			if (ckpt_view_next_inval(iq.view, &parent, name, sizeof(name)) != 1)
				break;
			/* -ENOENT when the dentry is gone already: nothing to do */
			fuse_lowlevel_notify_inval_entry(iq.se, parent, name, strlen(name));
			ckpt_lock(&iq.mu, CKPT_RANK_FS_INVAL);
			stop = iq.stop;
			ckpt_unlock(&iq.mu, CKPT_RANK_FS_INVAL);
			if (stop)
				return NULL;
		}
	}
	return NULL;
}

static void inval_notify(void *arg)
{
	(void)arg;
	ckfs_inval_kick();
}

int ckfs_inval_start(struct fuse_session *se, ckpt_view *view)
{
	iq.se = se;
	iq.view = view;
	iq.stop = 0;
	ckpt_view_set_inval_notify(view, inval_notify, NULL);
	if (pthread_create(&iq.th, NULL, inval_main, NULL) != 0)
		return -1;
	iq.started = 1;
	return 0;
}

void ckfs_inval_kick(void)
{
	ckpt_lock(&iq.mu, CKPT_RANK_FS_INVAL);
	if (!iq.kicked) {
		iq.kicked = 1;
		pthread_cond_signal(&iq.cv);
	}
	ckpt_unlock(&iq.mu, CKPT_RANK_FS_INVAL);
}

void ckfs_inval_stop(void)
{
	if (!iq.started)
		return;
	ckpt_lock(&iq.mu, CKPT_RANK_FS_INVAL);
	iq.stop = 1;
	pthread_cond_signal(&iq.cv);
	ckpt_unlock(&iq.mu, CKPT_RANK_FS_INVAL);
	pthread_join(iq.th, NULL);
	iq.started = 0;
}
