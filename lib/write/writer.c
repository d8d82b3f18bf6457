/* writer.c - pending steps (begin, abort, destroy) and the write and
 * read-back paths: a byte range of a region is cut into per-chunk pieces
 * (format/slice.c's ckpt_stream_pieces) and each piece is copied into or
 * out of its chunk through writer_chunk.c.  writer_int.h has the map of the
 * other writer files. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <zstd.h>

#include "orbax.h"
#include "stats.h"
#include "sysio.h"
#include "writer_int.h"

void ckpt_writer_opts_init(ckpt_writer_opts *o)
{
	o->zstd_level = 1;
	/* Enough to take a typical host's share of a checkpoint without making
	 * writers wait: RAM / 8, at least 512 MiB, at most 2 GiB. */
	long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
	uint64_t ram = pages > 0 && psize > 0 ? (uint64_t)pages * (uint64_t)psize : 0;
	o->mem_budget = ram / 8;
	if (o->mem_budget < ((uint64_t)512 << 20))
		o->mem_budget = (uint64_t)512 << 20;
	if (o->mem_budget > ((uint64_t)2 << 30))
		o->mem_budget = (uint64_t)2 << 30;
	o->threads = 2;
	o->chunk_bytes = (uint64_t)4 << 20;
	o->shard_bytes = (uint64_t)1 << 30;
}

/* ---- steps ---- */

/* Close the step's files (the folder fd holds the flock) and free it. */
static void step_free(struct ckpt_step *st)
{
	if (st->spill_fd >= 0)
		close(st->spill_fd);
	if (st->dirfd >= 0)
		close(st->dirfd);
	if (st->rootfd >= 0)
		close(st->rootfd);
	ckpt_w_keytab_free(st);
	if (st->hosts_free)
		st->hosts_free(st); /* the multi-host wrapper's state */
	free(st->root);
	free(st->name);
	free(st->tmpname);
	free(st->tmppath);
	pthread_mutex_destroy(&st->decl_mu);
	pthread_mutex_destroy(&st->mu);
	pthread_cond_destroy(&st->memcond);
	pthread_cond_destroy(&st->qcond);
	pthread_cond_destroy(&st->idlecond);
	free(st);
}

/* ckpt_step_begin, or (adopt) ckpt_step_adopt. */
static int step_open(const char *root_dir, const char *step_name, const ckpt_writer_opts *opts, int adopt,
		     ckpt_step **out)
{
	ckpt_writer_opts o;
	*out = NULL;
	if (opts)
		o = *opts;
	else
		ckpt_writer_opts_init(&o);
	const char *why = "no root folder";
	if (!root_dir || !ckpt_orbax_name_ok(CKPT_NAME_PENDING_STEP, step_name, &why)) {
		ckpt_log(CKPT_LOG_ERR, "writer: bad step name '%s': %s", step_name ? step_name : "(null)",
			 why);
		return -EINVAL;
	}
	if (o.threads < 1 || o.threads > 64 || o.chunk_bytes < 1 || o.shard_bytes < 1 || o.mem_budget < 1 ||
	    o.zstd_level < ZSTD_minCLevel() || o.zstd_level > ZSTD_maxCLevel()) {
		ckpt_log(CKPT_LOG_ERR, "writer: step %s: bad writer options", step_name);
		return -EINVAL;
	}
	struct ckpt_step *st = calloc(1, sizeof(*st));
	if (!st)
		return -ENOMEM;
	st->opts = o;
	st->rootfd = st->dirfd = st->spill_fd = -1;
	pthread_mutex_init(&st->decl_mu, NULL);
	pthread_mutex_init(&st->mu, NULL);
	pthread_cond_init(&st->memcond, NULL);
	pthread_cond_init(&st->qcond, NULL);
	pthread_cond_init(&st->idlecond, NULL);
	int rc = -ENOMEM;
	st->root = strdup(root_dir);
	st->name = strdup(step_name);
	if (!st->root || !st->name || ckpt_w_keytab_create(st))
		goto fail;
	if (asprintf(&st->tmpname, "%s%s", step_name, CKPT_ORBAX_TMP_INFIX) < 0 ||
	    asprintf(&st->tmppath, "%s/%s", root_dir, st->tmpname) < 0) {
		st->tmpname = st->tmppath = NULL;
		goto fail;
	}
	st->rootfd = open(root_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (st->rootfd < 0) {
		rc = -errno;
		ckpt_log(CKPT_LOG_ERR, "writer: step %s: cannot open root %s: %s", step_name, root_dir,
			 strerror(errno));
		goto fail;
	}
	struct stat sb;
	if (fstatat(st->rootfd, step_name, &sb, AT_SYMLINK_NOFOLLOW) == 0) {
		rc = -EEXIST;
		ckpt_log(CKPT_LOG_ERR, "writer: step %s already exists in %s", step_name, root_dir);
		goto fail;
	}
	if (adopt) { /* the tmp folder as it is: locked, never removed here */
		st->dirfd = openat(st->rootfd, st->tmpname, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		rc = st->dirfd < 0 ? -errno : flock(st->dirfd, LOCK_EX | LOCK_NB) ? -EBUSY : 0;
		if (rc) {
			ckpt_log(CKPT_LOG_ERR, "writer: step %s: cannot take %s: %s", step_name, st->tmppath,
				 strerror(-rc));
			goto fail;
		}
		st->as_written = 1;
		st->init_ns = ckpt_wall_ns();
		*out = st;
		return 0;
	}
	/* A tmp folder nobody holds the lock of was left by a crash. */
	int old = openat(st->rootfd, st->tmpname, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (old >= 0) {
		if (flock(old, LOCK_EX | LOCK_NB)) {
			close(old);
			rc = -EBUSY;
			ckpt_log(CKPT_LOG_ERR, "writer: step %s: %s is in use by a pending save", step_name,
				 st->tmppath);
			goto fail;
		}
		ckpt_log(CKPT_LOG_WARN, "writer: removing stale %s", st->tmppath);
		rc = ckpt_rmtree_at(st->rootfd, st->tmpname);
		close(old);
		if (rc) {
			ckpt_log(CKPT_LOG_ERR, "writer: step %s: cannot remove stale %s: %s", step_name,
				 st->tmppath, strerror(-rc));
			goto fail;
		}
	}
	if (mkdirat(st->rootfd, st->tmpname, 0755)) {
		rc = errno == EEXIST ? -EBUSY : -errno;
		ckpt_log(CKPT_LOG_ERR, "writer: step %s: mkdir %s: %s", step_name, st->tmppath,
			 strerror(errno));
		goto fail;
	}
	st->dirfd = openat(st->rootfd, st->tmpname, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (st->dirfd < 0 || flock(st->dirfd, LOCK_EX | LOCK_NB)) {
		rc = -errno;
		ckpt_log(CKPT_LOG_ERR, "writer: step %s: cannot lock %s: %s", step_name, st->tmppath,
			 strerror(errno));
		goto fail;
	}
	st->init_ns = ckpt_wall_ns();
	rc = ckpt_w_write_ckpt_metadata(st, 0);
	if (rc)
		goto fail_dir;
	rc = ckpt_w_zpool_start(st);
	if (rc) {
		ckpt_log(CKPT_LOG_ERR, "writer: step %s: cannot start compression threads", step_name);
		goto fail_dir;
	}
	*out = st;
	return 0;
fail_dir:
	ckpt_rmtree_at(st->rootfd, st->tmpname);
fail:
	step_free(st);
	return rc;
}

int ckpt_step_begin(const char *root_dir, const char *step_name, const ckpt_writer_opts *opts,
		    ckpt_step **out)
{
	return step_open(root_dir, step_name, opts, 0, out);
}

int ckpt_step_adopt(const char *root_dir, const char *step_name, const ckpt_writer_opts *opts,
		    ckpt_step **out)
{
	return step_open(root_dir, step_name, opts, 1, out);
}

/* ---- writes ---- */

struct wctx {
	struct ckpt_warray *a;
	const ckpt_stream_piece *p;
	const uint8_t *src; /* write: the caller's bytes */
	uint64_t byte_off; /* write: the range's first byte in the region's stream */
	uint64_t span_coff, span_soff; /* write: the span being checked */
	uint64_t bad_coff, bad_soff; /* write: the first differing byte (conflict set) */
	int conflict;
	int check; /* write: refuse changes of bytes already written (CKPT_WRITE_SAME) */
	uint8_t *dst; /* read: the caller's buffer */
	const uint8_t *from; /* read: the chunk's bytes, NULL = all zero */
	uint8_t *chunk; /* write: the chunk buffer */
	struct wcov *cov;
	uint8_t *scratch; /* read: a chunk-sized copy for stored/spilled chunks */
	uint64_t added;
	int rc;
};

static void span_write(void *ctx, uint64_t coff, uint64_t soff, uint64_t n)
{
	struct wctx *w = ctx;
	memcpy(w->chunk + coff, w->src + soff, n);
	int64_t r = ckpt_w_cov_add(w->cov, w->a->chunk_nbytes, coff, coff + n);
	if (r < 0)
		w->rc = (int)r;
	else
		w->added += (uint64_t)r;
}

/* A covered run [s, e) of the chunk inside the span being checked: its
 * bytes must equal the new ones, except that a covered zero may take any
 * value (see writer.h). */
static int check_run(void *ctx, uint64_t s, uint64_t e)
{
	struct wctx *w = ctx;
	const uint8_t *old = w->chunk + s, *new = w->src + w->span_soff + (s - w->span_coff);
	if (memcmp(old, new, e - s) == 0)
		return 0;
	for (uint64_t i = 0; i < e - s; i++)
		if (old[i] != new[i] && old[i] != 0) {
			w->conflict = 1;
			w->bad_coff = s + i;
			w->bad_soff = w->span_soff + (s - w->span_coff) + i;
			return -EINVAL;
		}
	return 0;
}

static void span_check(void *ctx, uint64_t coff, uint64_t soff, uint64_t n)
{
	struct wctx *w = ctx;
	if (w->conflict)
		return;
	w->span_coff = coff;
	w->span_soff = soff;
	ckpt_w_cov_each(w->cov, coff, coff + n, check_run, w);
}

/* Under the chunk buffer's lock (writer_chunk.c): refuse the piece when it
 * changes bytes already written, else copy it. */
static int fill_piece(void *ctx, uint8_t *buf, struct wcov *cov, uint64_t *added)
{
	struct wctx *w = ctx;
	w->chunk = buf;
	w->cov = cov;
	w->added = 0;
	*added = 0;
	if (w->check && (cov->n || cov->bm)) {
		ckpt_stream_piece_spans(&w->a->grid, w->p, span_check, w);
		if (w->conflict)
			return -EINVAL;
	}
	ckpt_stream_piece_spans(&w->a->grid, w->p, span_write, w);
	*added = w->added;
	return w->rc;
}

/* Byte offset in the array's C-order bytes of byte coff of chunk cg. */
static uint64_t array_byte(const struct ckpt_warray *a, const uint64_t *cg, uint64_t coff)
{
	uint64_t e = coff / a->isz, lin = 0, g[CKPT_MAX_RANK];
	for (int d = a->rank - 1; d >= 0; d--) {
		g[d] = cg[d] * a->inner[d] + e % a->inner[d];
		e /= a->inner[d];
	}
	for (int d = 0; d < a->rank; d++)
		lin = lin * a->shape[d] + g[d];
	return lin * a->isz + coff % a->isz;
}

static int piece_write(void *ctx, const ckpt_stream_piece *p)
{
	struct wctx *w = ctx;
	w->p = p;
	int rc = ckpt_w_chunk_write(w->a, p->chunk, fill_piece, w);
	if (rc && w->conflict)
		ckpt_log(CKPT_LOG_ERR,
			 "writer: %s: write refused: byte %llu of the array (byte %llu of the written "
			 "region's stream) was already written with another value; truncate the file "
			 "(O_TRUNC) to write it again",
			 w->a->relpath, (unsigned long long)array_byte(w->a, p->cg, w->bad_coff),
			 (unsigned long long)(w->byte_off + w->bad_soff));
	else if (rc && w->rc)
		ckpt_log(CKPT_LOG_ERR, "writer: %s: out of memory for a coverage map", w->a->relpath);
	return rc;
}

int ckpt_warray_write(ckpt_warray *a, const ckpt_region *region, uint64_t byte_off, const void *data,
		      size_t len)
{
	return ckpt_warray_write_flags(a, region, byte_off, data, len, 0);
}

int ckpt_warray_write_flags(ckpt_warray *a, const ckpt_region *region, uint64_t byte_off, const void *data,
			    size_t len, unsigned flags)
{
	ckpt_region r;
	uint64_t rbytes, end;
	if (ckpt_w_region_check(a, region, &r, &rbytes)) {
		ckpt_log(CKPT_LOG_ERR, "writer: %s: write to a region outside the array or of another rank",
			 a->relpath);
		return -EINVAL;
	}
	if (len == 0)
		return 0;
	if (ckpt_add_u64(byte_off, len, &end) || end > rbytes) {
		ckpt_log(CKPT_LOG_ERR, "writer: %s: write of %zu bytes at %llu is past the end (%llu bytes)",
			 a->relpath, len, (unsigned long long)byte_off, (unsigned long long)rbytes);
		return -EFBIG;
	}
	if (atomic_load(&a->step->state) != CKPT_STEP_PENDING)
		return ckpt_w_step_writable(a->step, a->relpath);
	if (atomic_load(&a->removed)) {
		ckpt_log(CKPT_LOG_ERR, "writer: %s: write to a removed array", a->relpath);
		return -ESTALE;
	}
	struct wctx w = {
		.a = a, .src = data, .byte_off = byte_off, .check = (flags & CKPT_WRITE_SAME) != 0
	};
	int rc = ckpt_stream_pieces(&a->grid, &r, byte_off, end, piece_write, &w);
	if (!rc)
		CKPT_STAT_ADD(bytes_written, len);
	return rc;
}

/* Forget: the bytes of a box (chunk-local, in-bounds) of one chunk. */
struct dropctx {
	const struct ckpt_warray *a;
	uint64_t lo[CKPT_MAX_RANK], hi[CKPT_MAX_RANK];
};

/* Under the chunk buffer's lock: uncover and zero the box's bytes, run by
 * run: along dim k, where every dim after k is whole (the padded chunk's
 * extent), runs are contiguous. */
static int drop_box(void *ctx, uint8_t *buf, struct wcov *cov, uint64_t *removed)
{
	const struct dropctx *f = ctx;
	const struct ckpt_warray *a = f->a;
	int rank = a->rank, k = rank - 1;
	*removed = 0;
	if (rank == 0)
		return 0; /* one element: the whole chunk, reset instead */
	while (k > 0 && f->lo[k] == 0 && f->hi[k] == a->inner[k])
		k--;
	uint64_t stride[CKPT_MAX_RANK], s = a->isz;
	for (int d = rank - 1; d >= 0; d--) {
		stride[d] = s;
		s *= a->inner[d];
	}
	uint64_t l[CKPT_MAX_RANK];
	for (int d = 0; d < k; d++)
		l[d] = f->lo[d];
	for (;;) {
		uint64_t base = 0;
		for (int d = 0; d < k; d++)
			base += l[d] * stride[d];
		uint64_t b0 = base + f->lo[k] * stride[k], b1 = base + f->hi[k] * stride[k];
		int64_t r = ckpt_w_cov_remove(cov, a->chunk_nbytes, b0, b1);
		if (r < 0)
			return (int)r;
		*removed += (uint64_t)r;
		memset(buf + b0, 0, b1 - b0);
		int d = k - 1;
		for (; d >= 0 && ++l[d] == f->hi[d]; d--)
			l[d] = f->lo[d];
		if (d < 0)
			return 0;
	}
}

int ckpt_warray_forget(ckpt_warray *a, const ckpt_region *region)
{
	ckpt_region r;
	uint64_t rbytes;
	if (ckpt_w_region_check(a, region, &r, &rbytes))
		return -EINVAL;
	if (atomic_load(&a->step->state) != CKPT_STEP_PENDING)
		return ckpt_w_step_writable(a->step, a->relpath);
	/* Only chunks with a table entry can hold bytes. */
	for (uint64_t i = ckpt_w_chunk_next(a, 0); i < a->nchunks; i = ckpt_w_chunk_next(a, i + 1)) {
		ckpt_region c;
		ckpt_w_chunk_region(a, i, &c);
		struct dropctx f = { .a = a };
		int inside = 1, meets = 1;
		for (int d = 0; meets && d < a->rank; d++) {
			uint64_t lo = c.start[d] > r.start[d] ? c.start[d] : r.start[d];
			uint64_t hi = c.stop[d] < r.stop[d] ? c.stop[d] : r.stop[d];
			meets = lo < hi;
			inside &= lo == c.start[d] && hi == c.stop[d];
			f.lo[d] = lo - c.start[d]; /* c.start is the chunk's origin */
			f.hi[d] = hi - c.start[d];
		}
		if (!meets)
			continue;
		if (inside) {
			ckpt_w_chunk_reset(a, i);
			continue;
		}
		int rc = ckpt_w_chunk_forget(a, i, drop_box, &f);
		if (rc) {
			ckpt_log(CKPT_LOG_ERR, "writer: %s: dropping the bytes of a region: %s", a->relpath,
				 strerror(-rc));
			return rc;
		}
	}
	return 0;
}

/* ---- reads ---- */

static void span_read(void *ctx, uint64_t coff, uint64_t soff, uint64_t n)
{
	struct wctx *w = ctx;
	if (w->from)
		memcpy(w->dst + soff, w->from + coff, n);
	else
		memset(w->dst + soff, 0, n);
}

static void copy_piece(void *ctx, const uint8_t *bytes)
{
	struct wctx *w = ctx;
	w->from = bytes;
	ckpt_stream_piece_spans(&w->a->grid, w->p, span_read, w);
}

static int piece_read(void *ctx, const ckpt_stream_piece *p)
{
	struct wctx *w = ctx;
	w->p = p;
	return ckpt_w_chunk_read(w->a, p->chunk, &w->scratch, copy_piece, w);
}

ssize_t ckpt_warray_read(ckpt_warray *a, const ckpt_region *region, uint64_t byte_off, void *dst, size_t len)
{
	ckpt_region r;
	uint64_t rbytes;
	if (ckpt_w_region_check(a, region, &r, &rbytes)) {
		ckpt_log(CKPT_LOG_ERR, "writer: %s: read of a region outside the array or of another rank",
			 a->relpath);
		return -EINVAL;
	}
	if (atomic_load(&a->removed))
		return -ESTALE;
	if (byte_off >= rbytes || len == 0)
		return 0;
	if (len > rbytes - byte_off)
		len = (size_t)(rbytes - byte_off);
	if (len > (size_t)SSIZE_MAX)
		len = (size_t)SSIZE_MAX;
	struct wctx w = { .a = a, .dst = dst };
	int rc = ckpt_stream_pieces(&a->grid, &r, byte_off, byte_off + len, piece_read, &w);
	free(w.scratch);
	return rc ? rc : (ssize_t)len;
}

/* ---- end of life ---- */

void ckpt_step_abort(ckpt_step *st)
{
	if (!st || st->state == CKPT_STEP_COMMITTED)
		return;
	ckpt_w_zpool_stop(st);
	if (st->state == CKPT_STEP_PENDING) {
		int rc = ckpt_rmtree_at(st->rootfd, st->tmpname);
		if (rc)
			ckpt_log(CKPT_LOG_ERR, "writer: step %s: removing %s: %s", st->name, st->tmppath,
				 strerror(-rc));
	}
	st->state = CKPT_STEP_ABORTED;
}

void ckpt_step_destroy(ckpt_step *st)
{
	if (!st)
		return;
	ckpt_w_zpool_stop(st);
	for (struct witem *it = st->items, *nit; it; it = nit) {
		nit = it->next;
		for (struct ckpt_warray *a = it->first, *na; a; a = na) {
			na = a->next;
			ckpt_w_chunk_free_all(st, a);
			ckpt_w_warray_free(a);
		}
		free(it->name);
		free(it->json);
		free(it->handler);
		free(it);
	}
	for (struct ckpt_warray *a = st->removed, *na; a; a = na) {
		na = a->next;
		ckpt_w_chunk_free_all(st, a);
		ckpt_w_warray_free(a);
	}
	ckpt_w_chunk_cache_free(st);
	if (st->bytes_pending)
		CKPT_STAT_ADD(bytes_pending, -(int64_t)st->bytes_pending);
	step_free(st);
}
