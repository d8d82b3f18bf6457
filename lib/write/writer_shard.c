/* writer_shard.c - the shard files of a pending array: their paths, opening
 * one for appending (O_DIRECT where the file system allows it), appending a
 * compressed chunk, reading a stored chunk back, and finishing a shard
 * (index, fsync): at commit, or as soon as its last chunk is stored when the
 * step has a sink (writer.h; the shard is then marked finished and the
 * commit skips it, unless a chunk of it is written again).  One shard is one file <item>/<param>/c/<i>/<j>...
 * in the step's tmp folder; chunks are appended in completion order and only
 * the index written at commit says where each one is.
 *
 * Called by writer_zpool.c (append, early finish), writer_chunk.c (read
 * back a stored chunk that is written again, unfinish) and
 * writer_commit.c (finish).  Calls only
 * writer_geom.c and base/. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zstd.h>

#include "crc32c.h"
#include "stats.h"
#include "sysio.h"
#include "writer_int.h"

int ckpt_w_shard_path(const struct ckpt_warray *a, uint64_t sidx, char *buf, size_t cap)
{
	uint64_t g[CKPT_MAX_RANK];
	for (int d = a->rank - 1; d >= 0; d--) {
		g[d] = sidx % a->nsh[d];
		sidx /= a->nsh[d];
	}
	int n = snprintf(buf, cap, "%s/c", a->relpath);
	for (int d = 0; d < a->rank && n >= 0 && (size_t)n < cap; d++)
		n += snprintf(buf + n, cap - (size_t)n, "/%llu", (unsigned long long)g[d]);
	if (n < 0 || (size_t)n >= cap)
		return -ENAMETOOLONG;
	return n;
}

/* Open (with O_CREAT: creating it and its folders) shard file sidx of a. */
static int shard_open(struct ckpt_warray *a, uint64_t sidx, int flags)
{
	char path[4096];
	int rc = ckpt_w_shard_path(a, sidx, path, sizeof(path));
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

/*
 * Appends use O_DIRECT where the file system allows it: the compressed bytes
 * go from the compression thread's reused buffer to the disk without a copy
 * into fresh page-cache pages (allocating and filling those pages costs more
 * than the disk write on most hosts), and the commit's fsync finds no dirty
 * data left.  Each chunk then starts on a W_DIO_ALIGN boundary; the gap after
 * it is zeros that no index entry points to, which sharding_indexed allows.
 * Without O_DIRECT (tmpfs, some network file systems: open fails with
 * EINVAL, remembered per step in st->no_direct) chunks are packed and written
 * through the page cache, with writeback started at once.
 */
int ckpt_w_shard_append(struct ckpt_warray *a, uint64_t sidx, uint8_t *z, size_t n, size_t zcap,
			uint64_t *off, int *fd_out, char *why, size_t wcap)
{
	struct wshard *sh = ckpt_w_shard_at(a, sidx); /* made when its chunk was first written */
	struct ckpt_step *st = a->step;
	int direct = !atomic_load(&st->no_direct);
	int fd = shard_open(a, sidx, O_WRONLY | O_CREAT | (direct ? O_DIRECT : 0));
	if (fd == -EINVAL && direct) {
		atomic_store(&st->no_direct, 1);
		direct = 0;
		fd = shard_open(a, sidx, O_WRONLY | O_CREAT);
	}
	if (fd < 0) {
		snprintf(why, wcap, "cannot open shard %llu: %s", (unsigned long long)sidx, strerror(-fd));
		return fd;
	}
	size_t wlen = direct ? (n + W_DIO_ALIGN - 1) / W_DIO_ALIGN * W_DIO_ALIGN : n;
	assert(wlen <= zcap);
	(void)zcap;
	if (wlen > n)
		memset(z + n, 0, wlen - n);
	ckpt_lock(&sh->mu, CKPT_RANK_W_SHARD);
	if (direct)
		sh->end = (sh->end + W_DIO_ALIGN - 1) / W_DIO_ALIGN * W_DIO_ALIGN;
	*off = sh->end;
	sh->end += wlen;
	ckpt_unlock(&sh->mu, CKPT_RANK_W_SHARD);
	int rc = ckpt_pwrite_all(fd, z, wlen, *off);
	if (rc) {
		snprintf(why, wcap, "writing shard %llu: %s", (unsigned long long)sidx, strerror(-rc));
		close(fd);
		return rc;
	}
	/* Buffered: start writeback now, so the commit's fsync finds little
	 * left to do and disk writes overlap compression. */
	if (!direct)
		sync_file_range(fd, (off_t)*off, (off_t)n, SYNC_FILE_RANGE_WRITE);
	*fd_out = fd;
	return 0;
}

void ckpt_w_shard_append_done(int fd, int shard_complete)
{
	if (shard_complete) /* start writeback of the whole file early; commit fsyncs */
		sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
	close(fd);
}

int ckpt_w_shard_load_chunk(struct ckpt_warray *a, uint64_t idx, uint64_t off, uint64_t len, uint8_t *dst)
{
	char path[4096];
	int rc = ckpt_w_shard_path(a, ckpt_w_chunk_shard(a, idx), path, sizeof(path));
	if (rc < 0)
		return rc;
	uint8_t *z = malloc(len ? len : 1);
	if (!z)
		return -ENOMEM;
	int fd = openat(a->step->dirfd, path, O_RDONLY | O_CLOEXEC);
	rc = fd < 0 ? -errno : ckpt_pread_all(fd, z, len, off);
	if (fd >= 0)
		close(fd);
	if (!rc) {
		size_t n = ZSTD_decompress(dst, a->chunk_nbytes, z, len);
		if (ZSTD_isError(n) || n != a->chunk_nbytes) {
			ckpt_log(CKPT_LOG_ERR, "writer: %s: chunk %llu in %s does not decode: %s", a->relpath,
				 (unsigned long long)idx, path,
				 ZSTD_isError(n) ? ZSTD_getErrorName(n) : "wrong size");
			rc = -EIO;
		}
	} else {
		ckpt_log(CKPT_LOG_ERR, "writer: %s: reading chunk %llu from %s: %s", a->relpath,
			 (unsigned long long)idx, path, strerror(-rc));
	}
	free(z);
	CKPT_STAT_ADD(backing_reads, 1);
	return rc;
}

int ckpt_w_fsync_dir(struct ckpt_step *st, const char *rel)
{
	int rc = ckpt_fsync_dir_at(st->dirfd, rel);
	if (rc)
		ckpt_log(CKPT_LOG_ERR, "writer: step %s: fsync of folder %s: %s", st->name, rel,
			 strerror(-rc));
	return rc;
}

/* The index of shard s (sharding_indexed, index_location "end"): per inner
 * chunk of the shard in C order (offset, nbytes) little-endian, both
 * UINT64_MAX for chunks outside the array, then crc32c of those bytes. */
static int shard_index(const struct ckpt_warray *a, uint64_t s, uint64_t n, uint8_t *ix)
{
	uint64_t sg[CKPT_MAX_RANK], l[CKPT_MAX_RANK] = { 0 }, t = s;
	for (int d = a->rank - 1; d >= 0; d--) {
		sg[d] = t % a->nsh[d];
		t /= a->nsh[d];
	}
	for (uint64_t e = 0; e < n; e++) {
		uint64_t lin = 0;
		int out = 0;
		for (int d = 0; d < a->rank; d++) {
			uint64_t g = sg[d] * a->mps[d] + l[d];
			out |= g >= a->nch[d];
			lin = lin * a->nch[d] + g;
		}
		uint64_t off = UINT64_MAX, len = UINT64_MAX;
		if (!out) {
			const struct wchunk *c = ckpt_w_chunk_at(a, lin);
			if (!c || c->state != WC_STORED)
				return -EAGAIN; /* early finish: written again meanwhile */
			off = c->off;
			len = c->len;
		}
		ckpt_put_le64(ix + 16 * e, off);
		ckpt_put_le64(ix + 16 * e + 8, len);
		for (int d = a->rank - 1; d >= 0 && ++l[d] == a->mps[d]; d--)
			l[d] = 0;
	}
	ckpt_put_le32(ix + 16 * n, ckpt_crc32c(0, ix, 16 * n));
	return 0;
}

/* Entries (inner chunks) per shard. */
static uint64_t shard_entries(const struct ckpt_warray *a)
{
	uint64_t n = 1;
	for (int d = 0; d < a->rank; d++)
		n *= a->mps[d];
	return n;
}

/* Write index ix (16 * n + 4 bytes) at `end` of shard s, truncate the file
 * after it and fsync it. */
static int put_index(struct ckpt_warray *a, uint64_t s, uint64_t n, const uint8_t *ix, uint64_t end)
{
	size_t isize = (size_t)(16 * n + 4);
	int fd = shard_open(a, s, O_WRONLY | O_CREAT);
	int rc = fd < 0 ? fd : ckpt_pwrite_all(fd, ix, isize, end);
	if (!rc && ftruncate(fd, (off_t)(end + isize)))
		rc = -errno;
	if (!rc && fsync(fd))
		rc = -errno;
	if (fd >= 0)
		close(fd);
	if (rc)
		ckpt_log(CKPT_LOG_ERR, "writer: %s: finishing shard %llu: %s", a->relpath,
			 (unsigned long long)s, strerror(-rc));
	else
		CKPT_STAT_ADD(stored_bytes_written, isize);
	return rc;
}

/* Index, truncate and fsync shard s of a (n entries, ix a buffer of
 * 16 * n + 4 bytes).  Every in-bounds chunk of s must be STORED. */
static int finish_one(struct ckpt_warray *a, uint64_t s, uint64_t n, uint8_t *ix)
{
	int rc = shard_index(a, s, n, ix);
	assert(rc == 0); /* every in-bounds chunk is STORED at commit */
	(void)rc;
	return put_index(a, s, n, ix, ckpt_w_shard_at(a, s)->end);
}

/* Finish shards s = first, first + stride, ... of a that are not finished
 * yet.  Each call has its own index buffer; shard files are disjoint. */
struct finish_job {
	struct ckpt_warray *a;
	uint64_t first, stride, n;
	int rc;
};

static void *finish_shards(void *arg)
{
	struct finish_job *j = arg;
	struct ckpt_warray *a = j->a;
	uint8_t *ix = malloc((size_t)(16 * j->n + 4));
	if (!ix) {
		j->rc = -ENOMEM;
		return NULL;
	}
	int rc = 0;
	/* Every shard has an entry: all its chunks are STORED at commit. */
	for (uint64_t s = j->first; s < a->nshards && !rc; s += j->stride)
		if (ckpt_w_shard_at(a, s)->state == WSH_OPEN) /* no writer runs during the commit */
			rc = finish_one(a, s, j->n, ix);
	free(ix);
	j->rc = rc;
	return NULL;
}

/*
 * Shard states (sh->state, under array->mu):
 *
 *   from      to        by
 *   OPEN      FINISHED  ckpt_w_shard_finish_early: every chunk STORED and nothing
 *                       changed while its index was written: handed to the
 *                       sink (object-store roots upload it at once)
 *   FINISHED  OPEN      ckpt_w_shard_unfinish_locked: a STORED chunk of it leaves
 *                       STORED (written again, reset): the sink hears of it
 *
 * The commit finishes every shard still OPEN (finish_shards) and then the
 * step is gone; a new shard entry starts OPEN (zeroed).
 */
static void shard_set_state(struct wshard *sh, enum wsh_state to)
{
	assert((sh->state == WSH_OPEN && to == WSH_FINISHED) ||
	       (sh->state == WSH_FINISHED && to == WSH_OPEN));
	sh->state = (uint8_t)to;
}

void ckpt_w_shard_finish_early(struct ckpt_warray *a, uint64_t sidx)
{
	struct ckpt_step *st = a->step;
	struct wshard *sh = ckpt_w_shard_at(a, sidx);
	uint64_t n = shard_entries(a);
	ckpt_lock(&a->mu, CKPT_RANK_W_ARRAY);
	assert(sh->finishing > 0);
	unsigned gen = sh->gen;
	int go = sh->unstored == 0 && sh->state == WSH_OPEN;
	ckpt_unlock(&a->mu, CKPT_RANK_W_ARRAY);
	int rc = -EAGAIN;
	uint8_t *ix = go ? malloc((size_t)(16 * n + 4)) : NULL;
	if (ix) {
		/* The index from the chunk states (under a->mu); gen unchanged
		 * at the end means no chunk of the shard left STORED meanwhile,
		 * so no append moved sh->end either.  A rewrite that started
		 * meanwhile leaves the shard unfinished (the commit finishes it). */
		ckpt_lock(&a->mu, CKPT_RANK_W_ARRAY);
		int same = sh->gen == gen && sh->unstored == 0 && shard_index(a, sidx, n, ix) == 0;
		ckpt_unlock(&a->mu, CKPT_RANK_W_ARRAY);
		if (same) {
			/* Under sh->mu (a leaf: no other lock held): an append that
			 * reserved its extent before is kept by the truncate (the
			 * index goes after it), one that reserves after overwrites
			 * the index. */
			ckpt_lock(&sh->mu, CKPT_RANK_W_SHARD);
			rc = put_index(a, sidx, n, ix, sh->end);
			ckpt_unlock(&sh->mu, CKPT_RANK_W_SHARD);
		}
		free(ix);
	}
	char path[4096];
	ckpt_lock(&a->mu, CKPT_RANK_W_ARRAY);
	sh->finishing--;
	if (!rc && sh->gen == gen && sh->unstored == 0 && sh->state == WSH_OPEN &&
	    ckpt_w_shard_path(a, sidx, path, sizeof(path)) > 0) {
		shard_set_state(sh, WSH_FINISHED);
		if (st->sink.shard_done)
			st->sink.shard_done(st->sink.ctx, path);
	}
	pthread_cond_broadcast(&a->cond);
	ckpt_unlock(&a->mu, CKPT_RANK_W_ARRAY);
}

void ckpt_w_shard_unfinish_locked(struct ckpt_warray *a, uint64_t sidx)
{
	ckpt_assert_held(CKPT_RANK_W_ARRAY);
	struct ckpt_step *st = a->step;
	struct wshard *sh = ckpt_w_shard_at(a, sidx);
	sh->gen++;
	if (sh->state != WSH_FINISHED)
		return;
	shard_set_state(sh, WSH_OPEN);
	char path[4096];
	if (st->sink.shard_changed && ckpt_w_shard_path(a, sidx, path, sizeof(path)) > 0)
		st->sink.shard_changed(st->sink.ctx, path);
}

void ckpt_step_set_sink(ckpt_step *st, const struct ckpt_step_sink *sink)
{
	if (sink)
		st->sink = *sink;
	else
		memset(&st->sink, 0, sizeof(st->sink));
}

/* Shard files fsynced at once: the fsyncs of many small files (one chunk
 * per shard, as several hosts write) overlap instead of queueing. */
#define W_FINISH_THREADS 8

int ckpt_w_shard_finish_all(struct ckpt_step *st, struct ckpt_warray *a)
{
	uint64_t n = shard_entries(a);
	/* Early finishes still running on compression threads end first. */
	ckpt_lock(&a->mu, CKPT_RANK_W_ARRAY);
	for (uint64_t s = ckpt_w_shard_next(a, 0); s < a->nshards; s = ckpt_w_shard_next(a, s + 1))
		while (ckpt_w_shard_at(a, s)->finishing)
			pthread_cond_wait(&a->cond, &a->mu);
	ckpt_unlock(&a->mu, CKPT_RANK_W_ARRAY);
	uint64_t nthr = a->nshards < W_FINISH_THREADS ? a->nshards : W_FINISH_THREADS;
	if (nthr == 0)
		nthr = 1;
	struct finish_job jobs[W_FINISH_THREADS];
	pthread_t tids[W_FINISH_THREADS];
	int started[W_FINISH_THREADS] = { 0 };
	for (uint64_t t = 0; t < nthr; t++) {
		jobs[t] = (struct finish_job){ .a = a, .first = t, .stride = nthr, .n = n, .rc = 0 };
		/* the first job runs on this thread; a failed start runs inline too */
		if (t > 0 && pthread_create(&tids[t], NULL, finish_shards, &jobs[t]) == 0)
			started[t] = 1;
	}
	finish_shards(&jobs[0]);
	int rc = jobs[0].rc;
	for (uint64_t t = 1; t < nthr; t++) {
		if (started[t])
			pthread_join(tids[t], NULL);
		else
			finish_shards(&jobs[t]);
		if (!rc)
			rc = jobs[t].rc;
	}
	if (rc || a->nshards == 0)
		return rc;
	/* Folders c/<i0>/.../<i_{p-1}> for p = rank-1 .. 1, then c. */
	char path[4096];
	for (int p = a->rank - 1; p >= 1 && !rc; p--) {
		uint64_t cnt = 1, g[CKPT_MAX_RANK] = { 0 };
		for (int d = 0; d < p; d++)
			cnt *= a->nsh[d];
		for (uint64_t i = 0; i < cnt && !rc; i++) {
			int k = snprintf(path, sizeof(path), "%s/c", a->relpath);
			for (int d = 0; d < p && k > 0 && (size_t)k < sizeof(path); d++)
				k += snprintf(path + k, sizeof(path) - (size_t)k, "/%llu",
					      (unsigned long long)g[d]);
			rc = ckpt_w_fsync_dir(st, path);
			for (int d = p - 1; d >= 0 && ++g[d] == a->nsh[d]; d--)
				g[d] = 0;
		}
	}
	if (!rc && a->rank > 0) {
		snprintf(path, sizeof(path), "%s/c", a->relpath);
		rc = ckpt_w_fsync_dir(st, path);
	}
	return rc;
}
