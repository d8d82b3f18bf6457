/* writer_zpool.c - the compression threads of a pending step.  Each thread
 * takes a complete chunk from the queue (writer_chunk.c), zstd-compresses
 * it (one ZSTD_CCtx per thread, frame checksum on), appends it to its shard
 * file (writer_shard.c) and reports the outcome back to writer_chunk.c,
 * which owns every chunk state change.  With a step sink (writer.h), a
 * shard whose last chunk this thread stored is finished here at once and
 * handed to the sink.  Calls writer_chunk.c, writer_shard.c and
 * writer_geom.c; nothing calls back. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <zstd.h>

#include "writer_int.h"

struct zworker {
	ZSTD_CCtx *cc;
	uint8_t *out; /* W_DIO_ALIGN-aligned, for O_DIRECT appends */
	size_t cap;
};

/* Compress l's buffer and append it to its shard.  Returns 0 with the
 * extent in *off and *len and the shard's fd in *fd, or -errno with the
 * reason in why (logged by writer_chunk.c once per array and commit
 * attempt, not once per chunk). */
static int store_chunk(struct zworker *z, struct ckpt_warray *a, struct wlive *l, uint64_t *off,
		       uint64_t *len, int *fd, char *why, size_t wcap)
{
	if (!z->cc) {
		snprintf(why, wcap, "no compression context");
		return -ENOMEM;
	}
	/* Room for the padding of an O_DIRECT append after the frame. */
	size_t bound = ZSTD_compressBound(a->chunk_nbytes) + W_DIO_ALIGN;
	if (bound > z->cap) {
		void *n = NULL;
		if (posix_memalign(&n, W_DIO_ALIGN, bound)) {
			snprintf(why, wcap, "out of memory for a compression buffer");
			return -ENOMEM;
		}
		free(z->out);
		z->out = n;
		z->cap = bound;
	}
	size_t n = ZSTD_compress2(z->cc, z->out, z->cap - W_DIO_ALIGN, l->buf, a->chunk_nbytes);
	if (ZSTD_isError(n)) {
		snprintf(why, wcap, "zstd failed: %s", ZSTD_getErrorName(n));
		return -EIO;
	}
	int rc = ckpt_w_shard_append(a, ckpt_w_chunk_shard(a, l->idx), z->out, n, z->cap, off, fd, why, wcap);
	if (!rc)
		*len = n;
	return rc;
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
	struct ckpt_warray *a;
	uint64_t idx;
	struct wlive *l;
	while (ckpt_w_chunk_take_job(st, &a, &idx, &l) == 0) {
		/* l is ours (COMPRESSING) until ckpt_w_chunk_store_done. */
		uint64_t off = 0, len = 0;
		int fd = -1;
		char why[256] = "";
		int rc = store_chunk(&z, a, l, &off, &len, &fd, why, sizeof(why));
		int shard_complete = ckpt_w_chunk_store_done(a, idx, rc, off, len, why);
		if (!rc)
			ckpt_w_shard_append_done(fd, shard_complete && !st->sink.shard_done);
		if (!rc && shard_complete && st->sink.shard_done) /* counted by ckpt_w_chunk_store_done */
			ckpt_w_shard_finish_early(a, ckpt_w_chunk_shard(a, idx));
	}
	ZSTD_freeCCtx(z.cc);
	free(z.out);
	return NULL;
}

int ckpt_w_zpool_start(struct ckpt_step *st)
{
	st->threads = calloc((size_t)st->opts.threads, sizeof(pthread_t));
	if (!st->threads)
		return -ENOMEM;
	for (int i = 0; i < st->opts.threads; i++) {
		int rc = pthread_create(&st->threads[i], NULL, worker, st);
		if (rc) {
			ckpt_w_zpool_stop(st);
			return -rc;
		}
		st->nthreads++;
	}
	return 0;
}

void ckpt_w_zpool_stop(struct ckpt_step *st)
{
	ckpt_lock(&st->mu, CKPT_RANK_W_STEP);
	st->stop = 1;
	pthread_cond_broadcast(&st->qcond);
	ckpt_unlock(&st->mu, CKPT_RANK_W_STEP);
	for (int i = 0; i < st->nthreads; i++)
		pthread_join(st->threads[i], NULL);
	st->nthreads = 0;
	free(st->threads);
	st->threads = NULL;
}
