/*
 * stream.c - streamed reads of large decode units (see stream.h).
 *
 * A cursor is (owner, unit) plus the decoded bytes [win_off, win_off +
 * win_len) of that unit in its window, and for zstd the decompression
 * state positioned right after the window.  A read that needs rows at or
 * after win_off continues the stream; one that needs earlier rows starts
 * the frame again.  Cursors are taken exclusively (busy) while a read uses
 * them; the pool lock guards only the choice of cursor.
 */
#include <assert.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>
#include <zstd_errors.h>

#include "common.h"
#include "stats.h"
#include "stream.h"

/* Stored bytes read per store call: 4 MiB, so that an object store (one
 * range GET per call) streams a large unit in few requests. */
#define IN_BUF ((size_t)4 << 20)
#define MAX_ROW ((uint64_t)32 << 20)

struct cursor {
	const void *owner; /* NULL: unused */
	uint64_t unit; /* decode-unit linear index */
	int busy;
	uint64_t lru; /* last use (pool clock) */
	ZSTD_DCtx *dctx;
	uint64_t in_off; /* stored bytes consumed from the store */
	uint8_t *in;
	size_t in_len, in_pos;
	int ended; /* the frame ended */
	uint8_t *win;
	size_t win_cap;
	uint64_t win_off, win_len; /* decoded bytes of the unit held in win */
	/* Where the unit's stored bytes lie in its stored value: [base, base +
	 * len) (a shard's one inner chunk), or the whole value (base 0, len
	 * UINT64_MAX). */
	uint64_t base, len;
};

struct ckpt_streams {
	pthread_mutex_t mu;
	pthread_cond_t freed;
	uint64_t clock;
	struct cursor cur[CKPT_STREAM_CURSORS];
};

int ckpt_streams_create(ckpt_streams **out)
{
	ckpt_streams *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->freed, NULL);
	*out = s;
	return 0;
}

static void cursor_free(struct cursor *c)
{
	ZSTD_freeDCtx(c->dctx);
	free(c->in);
	free(c->win);
	memset(c, 0, sizeof(*c));
}

void ckpt_streams_destroy(ckpt_streams *s)
{
	if (!s)
		return;
	for (int i = 0; i < CKPT_STREAM_CURSORS; i++) {
		assert(!s->cur[i].busy);
		cursor_free(&s->cur[i]);
	}
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->freed);
	free(s);
}

void ckpt_streams_forget(ckpt_streams *s, const void *owner)
{
	if (!s)
		return;
	pthread_mutex_lock(&s->mu);
	for (int i = 0; i < CKPT_STREAM_CURSORS; i++) {
		struct cursor *c = &s->cur[i];
		while (c->owner == owner && c->busy)
			pthread_cond_wait(&s->freed, &s->mu);
		if (c->owner == owner) {
			c->owner = NULL;
			c->win_len = 0;
		}
	}
	pthread_mutex_unlock(&s->mu);
}

int ckpt_stream_ok(const ckpt_array_meta *m)
{
	/* A shard streams when it holds one inner chunk (Orbax's zarr3 layout:
	 * inner chunk = shard); its range comes from the shard index. */
	if ((m->sharded && m->inner_per_shard != 1) || m->order_f || m->rank < 1 ||
	    (m->big_endian && m->itemsize > 1))
		return 0;
	if (!(m->nb2b == 0 || (m->nb2b == 1 && m->b2b[0] == CKPT_B2B_ZSTD)))
		return 0;
	uint64_t row = m->unit_bytes / m->inner_shape[0];
	return row > 0 && row <= MAX_ROW;
}

/* Take the cursor of (owner, unit) if idle, else the least recently used
 * idle one (reset); waits while all are busy. */
static struct cursor *take(ckpt_streams *s, const void *owner, uint64_t unit, uint64_t need_off)
{
	pthread_mutex_lock(&s->mu);
	for (;;) {
		struct cursor *best = NULL, *lru = NULL;
		int busy_same = 0;
		for (int i = 0; i < CKPT_STREAM_CURSORS; i++) {
			struct cursor *c = &s->cur[i];
			int same = c->owner == owner && c->unit == unit;
			if (c->busy) {
				busy_same |= same;
				continue;
			}
			if (same && c->win_off != UINT64_MAX && c->win_off <= need_off &&
			    (!best || c->win_off > best->win_off))
				best = c;
			if (!lru || c->lru < lru->lru)
				lru = c;
		}
		/* Another reader is moving this unit's stream (concurrent reads
		 * of one sequential reader arrive out of order): wait for it
		 * rather than start the frame again on another cursor. */
		struct cursor *c = best ? best : busy_same ? NULL : lru;
		if (c) {
			if (!best) {
				c->owner = owner;
				c->unit = unit;
				c->win_len = 0;
				c->win_off = UINT64_MAX; /* not positioned */
			}
			c->busy = 1;
			c->lru = ++s->clock;
			pthread_mutex_unlock(&s->mu);
			return c;
		}
		pthread_cond_wait(&s->freed, &s->mu);
	}
}

static void put(ckpt_streams *s, struct cursor *c, int keep)
{
	pthread_mutex_lock(&s->mu);
	if (!keep) {
		c->owner = NULL;
		c->win_len = 0;
	}
	c->busy = 0;
	pthread_cond_broadcast(&s->freed);
	pthread_mutex_unlock(&s->mu);
}

/* Position at the start of the unit stored under key: for a shard, find
 * its inner chunk's range first (-ENOTSUP when the shard or the inner chunk
 * is absent: the whole-unit path answers missing data). */
static int restart(struct cursor *c, ckpt_store *st, const char *key, const ckpt_array_meta *m, int zstd)
{
	c->base = 0;
	c->len = UINT64_MAX;
	if (m->sharded) {
		struct ckpt_zarr_unit_id id;
		int rc = ckpt_zarr_key_identity(st, key, &id);
		if (rc < 0)
			return rc;
		if (id.absent)
			return -ENOTSUP;
		rc = ckpt_zarr_inner_range(st, key, m, 0, id.size, &c->base, &c->len);
		if (rc == -ENODATA)
			return -ENOTSUP;
		if (rc < 0)
			return rc;
		if (!zstd && c->len != m->unit_bytes) {
			ckpt_log(CKPT_LOG_ERR, "%s/%s: inner chunk of %llu bytes, its shape implies %llu",
				 st->root, key, (unsigned long long)c->len,
				 (unsigned long long)m->unit_bytes);
			return -EIO;
		}
	}
	c->in_off = 0;
	c->in_len = c->in_pos = 0;
	c->ended = 0;
	c->win_off = 0;
	c->win_len = 0;
	if (!zstd)
		return 0;
	if (!c->dctx && !(c->dctx = ZSTD_createDCtx()))
		return -ENOMEM;
	ZSTD_DCtx_reset(c->dctx, ZSTD_reset_session_only);
	ZSTD_DCtx_setParameter(c->dctx, ZSTD_d_windowLogMax, CKPT_STREAM_WLOG);
	if (!c->in && !(c->in = malloc(IN_BUF)))
		return -ENOMEM;
	return 0;
}

/* Decode the next window: the bytes right after the current one, up to
 * win_cap bytes (fewer only at the end of the unit). */
static int next_window(struct cursor *c, ckpt_store *st, const char *key, const ckpt_array_meta *m, int zstd)
{
	uint64_t off = c->win_off + c->win_len;
	uint64_t want = m->unit_bytes - off < c->win_cap ? m->unit_bytes - off : c->win_cap;
	c->win_off = off;
	c->win_len = 0;
	if (!zstd) {
		ssize_t n = ckpt_store_read(st, key, c->base + off, (size_t)want, c->win);
		if (n == -ENOENT)
			return -ENOTSUP;
		if (n < 0)
			return (int)n;
		if ((uint64_t)n != want) {
			ckpt_log(CKPT_LOG_ERR, "%s/%s: stored chunk holds fewer bytes than its shape implies",
				 st->root, key);
			return -EIO;
		}
		c->win_len = want;
		return 0;
	}
	ZSTD_outBuffer ob = { c->win, (size_t)want, 0 };
	while (ob.pos < ob.size) {
		if (c->ended) {
			ckpt_log(CKPT_LOG_ERR,
				 "%s/%s: zstd data decodes to fewer bytes than the chunk's shape", st->root,
				 key);
			return -EIO;
		}
		if (c->in_pos == c->in_len) {
			size_t ask = c->len - c->in_off < IN_BUF ? (size_t)(c->len - c->in_off) : IN_BUF;
			ssize_t n = ask ? ckpt_store_read(st, key, c->base + c->in_off, ask, c->in) : 0;
			if (n == -ENOENT && c->in_off == 0)
				return -ENOTSUP;
			if (n < 0)
				return (int)n;
			if (n == 0) {
				ckpt_log(CKPT_LOG_ERR, "%s/%s: zstd data truncated", st->root, key);
				return -EIO;
			}
			c->in_off += (uint64_t)n;
			c->in_len = (size_t)n;
			c->in_pos = 0;
		}
		ZSTD_inBuffer ib = { c->in, c->in_len, c->in_pos };
		size_t r = ZSTD_decompressStream(c->dctx, &ob, &ib);
		c->in_pos = ib.pos;
		if (ZSTD_isError(r)) {
			if (ZSTD_getErrorCode(r) == ZSTD_error_frameParameter_windowTooLarge)
				return -ENOTSUP;
			ckpt_log(CKPT_LOG_ERR, "%s/%s: zstd: %s", st->root, key, ZSTD_getErrorName(r));
			return -EIO;
		}
		if (r == 0)
			c->ended = 1;
	}
	c->win_len = ob.pos;
	CKPT_STAT_ADD(decoded_bytes, ob.pos);
	return 0;
}

int ckpt_stream_copy(ckpt_streams *s, const void *owner, ckpt_store *st, const char *prefix,
		     const ckpt_array_meta *m, const uint64_t *g, const ckpt_region *r, uint64_t e0,
		     uint64_t e1, uint8_t *dst)
{
	assert(ckpt_stream_ok(m));
	int zstd = m->nb2b == 1;
	uint64_t rows = m->inner_shape[0];
	uint64_t row = m->unit_bytes / rows;
	/* Rows of this unit the request touches. */
	ckpt_region bbox;
	ckpt_region_stream_bbox(r, e0, e1, &bbox);
	uint64_t base = g[0] * rows;
	uint64_t r0 = bbox.start[0] > base ? bbox.start[0] - base : 0;
	uint64_t r1 = bbox.stop[0] - base < rows ? bbox.stop[0] - base : rows;
	if (r0 >= r1)
		return 0;
	uint64_t unit = 0;
	for (int d = 0; d < m->rank; d++)
		unit = unit * m->grid[d] + g[d];
	char key[4096];
	uint64_t sg[CKPT_MAX_RANK];
	ckpt_zarr_storage_index(m, g, sg);
	if (ckpt_zarr_unit_key(m, prefix, sg, key, sizeof(key)) < 0)
		return -ENAMETOOLONG;

	struct cursor *c = take(s, owner, unit, r0 * row);
	int rc = 0;
	if (!c->win) {
		uint64_t per = CKPT_STREAM_WINDOW / row ? CKPT_STREAM_WINDOW / row : 1;
		c->win_cap = (size_t)(per * row);
		if (!(c->win = malloc(c->win_cap)))
			rc = -ENOMEM;
	} else if (c->win_cap % row) {
		/* another array used it: whole rows of this one */
		uint64_t per = c->win_cap / row ? c->win_cap / row : 1;
		if (per * row > c->win_cap) {
			uint8_t *w = realloc(c->win, (size_t)(per * row));
			if (!w)
				rc = -ENOMEM;
			else
				c->win = w;
		}
		c->win_cap = (size_t)(per * row);
	}
	if (rc == 0 && (c->win_off == UINT64_MAX || r0 * row < c->win_off))
		rc = restart(c, st, key, m, zstd);
	/* Raw units need no sequential pass: jump to the first row. */
	if (rc == 0 && !zstd && c->win_off + c->win_len < r0 * row) {
		c->win_off = r0 * row;
		c->win_len = 0;
	}
	uint64_t origin[CKPT_MAX_RANK], shape[CKPT_MAX_RANK];
	for (int d = 0; d < m->rank; d++) {
		origin[d] = g[d] * m->inner_shape[d];
		shape[d] = m->inner_shape[d];
	}
	while (rc == 0) {
		uint64_t w0 = c->win_off, w1 = c->win_off + c->win_len;
		if (c->win_len > 0 && w1 > r0 * row && w0 < r1 * row) {
			assert(w0 % row == 0 && w1 % row == 0);
			origin[0] = base + w0 / row;
			shape[0] = (w1 - w0) / row;
			ckpt_copy_chunk_to_stream(r, e0, e1, dst, c->win, origin, shape, m->itemsize);
		}
		if (w1 >= r1 * row)
			break;
		rc = next_window(c, st, key, m, zstd);
	}
	put(s, c, rc == 0);
	return rc;
}
