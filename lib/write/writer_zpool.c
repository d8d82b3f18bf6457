/* writer_zpool.c - compression threads of a pending step: take complete
 * chunks from the queue, zstd them (one ZSTD_CCtx per thread, frame
 * checksum on), append them to their shard file at an offset reserved
 * under the shard's short lock, and free their memory. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <zstd.h>

#include "stats.h"
#include "sysio.h"
#include "writer_int.h"

void w_queue_push_locked(struct ckpt_step *st, struct wlive *l)
{
	if (l->in_queue)
		return;
	l->in_queue = 1;
	l->qnext = NULL;
	if (st->qtail)
		st->qtail->qnext = l;
	else
		st->qhead = l;
	st->qtail = l;
	pthread_cond_signal(&st->qcond);
}

/* Open (creating it and its folders) the shard file sidx of a. */
int w_shard_open(struct ckpt_warray *a, uint64_t sidx, int flags)
{
	char path[4096];
	int rc = w_shard_path(a, sidx, path, sizeof(path));
	if (rc < 0)
		return rc;
	int fd = openat(a->step->dirfd, path, flags | O_CLOEXEC, 0644);
	if (fd >= 0 || errno != ENOENT || !(flags & O_CREAT))
		return fd >= 0 ? fd : -errno;
	/* Create the folders <relpath>/c/<i>/... below the array folder. */
	size_t base = strlen(a->relpath);
	for (char *p = path + base + 1; (p = strchr(p, '/')); p++) {
		*p = 0;
		int r = mkdirat(a->step->dirfd, path, 0755);
		*p = '/';
		if (r && errno != EEXIST)
			return -errno;
	}
	fd = openat(a->step->dirfd, path, flags | O_CLOEXEC, 0644);
	return fd >= 0 ? fd : -errno;
}

struct zworker {
	ZSTD_CCtx *cc;
	uint8_t *out;
	size_t cap;
};

#define DIO_ALIGN 4096

/* Compress l's buffer and append it to its shard.  Returns 0 with the
 * extent in *off and *len, or -errno with the reason in why (logged by the
 * caller once per array and commit attempt, not once per chunk).
 *
 * Appends use O_DIRECT where the file system allows it: the compressed
 * bytes go from our reused buffer to the disk without a copy into fresh
 * page-cache pages (the most expensive thing on this VM), and the commit's
 * fsync has no dirty data left.  Each chunk then starts on a 4 KiB
 * boundary; the gap after it is zeros that no index entry points to,
 * which sharding_indexed allows.  Without O_DIRECT (tmpfs, some network
 * file systems) chunks are packed and written through the page cache. */
static int store_chunk(struct zworker *z, struct ckpt_warray *a, struct wlive *l, uint64_t *off,
		       uint64_t *len, int *shard_done_fd, char *why, size_t wcap)
{
	size_t bound = ZSTD_compressBound(a->chunk_nbytes) + DIO_ALIGN;
	if (bound > z->cap) {
		void *n = NULL;
		if (posix_memalign(&n, DIO_ALIGN, bound))
			return -ENOMEM;
		free(z->out);
		z->out = n;
		z->cap = bound;
	}
	size_t n = ZSTD_compress2(z->cc, z->out, z->cap - DIO_ALIGN, l->buf, a->chunk_nbytes);
	if (ZSTD_isError(n)) {
		snprintf(why, wcap, "zstd failed: %s", ZSTD_getErrorName(n));
		return -EIO;
	}
	uint64_t sidx = w_chunk_shard(a, l->idx);
	struct wshard *sh = &a->shards[sidx];
	struct ckpt_step *st = a->step;
	int direct = !atomic_load(&st->no_direct);
	int fd = w_shard_open(a, sidx, O_WRONLY | O_CREAT | (direct ? O_DIRECT : 0));
	if (fd == -EINVAL && direct) {
		atomic_store(&st->no_direct, 1); /* this file system has no O_DIRECT */
		direct = 0;
		fd = w_shard_open(a, sidx, O_WRONLY | O_CREAT);
	}
	if (fd < 0) {
		snprintf(why, wcap, "cannot open shard %llu: %s", (unsigned long long)sidx, strerror(-fd));
		return fd;
	}
	size_t wlen = direct ? (n + DIO_ALIGN - 1) / DIO_ALIGN * DIO_ALIGN : n;
	if (wlen > n)
		memset(z->out + n, 0, wlen - n);
	pthread_mutex_lock(&sh->mu);
	if (direct)
		sh->end = (sh->end + DIO_ALIGN - 1) / DIO_ALIGN * DIO_ALIGN;
	*off = sh->end;
	sh->end += direct ? wlen : n;
	pthread_mutex_unlock(&sh->mu);
	int rc = ckpt_pwrite_all(fd, z->out, wlen, *off);
	if (rc) {
		snprintf(why, wcap, "writing shard %llu: %s", (unsigned long long)sidx, strerror(-rc));
		close(fd);
		return rc;
	}
	/* Buffered: start writeback now, so the commit's fsync finds little
	 * left to do and disk writes overlap compression. */
	if (!direct)
		sync_file_range(fd, (off_t)*off, (off_t)n, SYNC_FILE_RANGE_WRITE);
	*len = n;
	*shard_done_fd = fd;
	return 0;
}

static void *worker(void *arg)
{
	struct ckpt_step *st = arg;
	struct zworker z = { 0 };
	/* Compression yields the CPU to the threads serving writers: write()
	 * latency is what the writers wait for; compression only has to be
	 * done by the commit. */
	if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 5) < 0)
		ckpt_log(CKPT_LOG_DEBUG, "compression thread: cannot lower its priority");
	z.cc = ZSTD_createCCtx();
	if (z.cc) {
		ZSTD_CCtx_setParameter(z.cc, ZSTD_c_compressionLevel, st->opts.zstd_level);
		ZSTD_CCtx_setParameter(z.cc, ZSTD_c_checksumFlag, 1);
		ZSTD_CCtx_setParameter(z.cc, ZSTD_c_contentSizeFlag, 1);
	}
	pthread_mutex_lock(&st->mu);
	for (;;) {
		while (!st->qhead && !st->stop)
			pthread_cond_wait(&st->qcond, &st->mu);
		if (st->stop)
			break;
		/* A queued live is alive while in the queue; once we drop st->mu
		 * only (array, idx) may be used: look the chunk up again. */
		struct wlive *l = st->qhead;
		st->qhead = l->qnext;
		if (!st->qhead)
			st->qtail = NULL;
		l->in_queue = 0;
		struct ckpt_warray *a = l->arr;
		uint64_t idx = l->idx;
		pthread_mutex_unlock(&st->mu);

		struct wchunk *c = &a->chunks[idx];
		pthread_mutex_lock(&a->mu);
		l = c->live;
		int requeued = 0;
		if (l) {
			pthread_mutex_lock(&st->mu);
			requeued = l->in_queue;
			pthread_mutex_unlock(&st->mu);
		}
		if (!l || c->state != WC_QUEUED || c->pins || requeued) {
			/* Pinned: the last unpin queues it again.  Requeued (an unpin
			 * came between our pop and here): that entry is its turn. */
			pthread_mutex_unlock(&a->mu);
			pthread_mutex_lock(&st->mu);
			pthread_cond_broadcast(&st->idlecond);
			continue;
		}
		c->state = WC_COMPRESSING;
		pthread_mutex_unlock(&a->mu);

		uint64_t off = 0, len = 0;
		int fd = -1;
		char why[256] = "no compression context";
		int rc = z.cc ? store_chunk(&z, a, l, &off, &len, &fd, why, sizeof(why)) : -ENOMEM;
		uint64_t need = w_chunk_need(a, l->idx);

		pthread_mutex_lock(&a->mu);
		int shard_done = 0;
		uint64_t spilled = c->spill_off;
		if (!rc) {
			c->state = WC_STORED;
			c->off = off;
			c->len = len;
			c->live = NULL;
			c->spill_off = 0;
			a->nstored++;
			a->stored_bytes += len;
			shard_done = --a->shards[w_chunk_shard(a, l->idx)].unstored == 0;
		} else {
			c->state = WC_ERROR;
			if (!a->err)
				ckpt_log(CKPT_LOG_ERR,
					 "writer: %s: %s (chunk kept in memory; retried at commit)",
					 a->relpath, why);
			a->err = rc;
		}
		pthread_mutex_lock(&st->mu);
		st->inflight -= a->live_cost;
		if (!rc) {
			st->bytes_pending -= need;
			st->stored_bytes += len;
		} else {
			st->io_err = rc;
		}
		int sfd = st->spill_fd;
		pthread_cond_broadcast(&st->memcond);
		pthread_cond_broadcast(&st->idlecond);
		pthread_mutex_unlock(&st->mu);
		pthread_cond_broadcast(&a->cond);
		pthread_mutex_unlock(&a->mu);

		if (!rc) {
			CKPT_STAT_ADD(bytes_pending, -(int64_t)need);
			CKPT_STAT_ADD(stored_bytes_written, len);
			if (spilled && sfd >= 0) {
				uint64_t slot = (a->chunk_nbytes + a->bm_bytes + 4095) / 4096 * 4096;
				fallocate(sfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
					  (off_t)(spilled - 1), (off_t)slot);
			}
			if (shard_done) /* start writeback early; commit fsyncs */
				sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
			close(fd);
			w_live_free(st, l, 1);
		}
		pthread_mutex_lock(&st->mu);
	}
	pthread_mutex_unlock(&st->mu);
	ZSTD_freeCCtx(z.cc);
	free(z.out);
	return NULL;
}

int w_zpool_start(struct ckpt_step *st)
{
	st->threads = calloc((size_t)st->opts.threads, sizeof(pthread_t));
	if (!st->threads)
		return -ENOMEM;
	for (int i = 0; i < st->opts.threads; i++) {
		int rc = pthread_create(&st->threads[i], NULL, worker, st);
		if (rc) {
			w_zpool_stop(st);
			return -rc;
		}
		st->nthreads++;
	}
	return 0;
}

void w_zpool_stop(struct ckpt_step *st)
{
	pthread_mutex_lock(&st->mu);
	st->stop = 1;
	pthread_cond_broadcast(&st->qcond);
	pthread_mutex_unlock(&st->mu);
	for (int i = 0; i < st->nthreads; i++)
		pthread_join(st->threads[i], NULL);
	st->nthreads = 0;
	free(st->threads);
	st->threads = NULL;
}

void w_zpool_drain(struct ckpt_step *st)
{
	pthread_mutex_lock(&st->mu);
	while (st->qhead || st->inflight)
		pthread_cond_wait(&st->idlecond, &st->mu);
	pthread_mutex_unlock(&st->mu);
}
