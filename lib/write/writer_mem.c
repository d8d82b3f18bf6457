/* writer_mem.c - chunk memory of a pending step: the budget, warm free
 * buffers, the spill file for partial chunks, and pinning a chunk for a
 * writer (allocating, re-reading a spilled chunk, or decoding a stored
 * chunk that is written again). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zstd.h>

#include "hugebuf.h"
#include "stats.h"
#include "sysio.h"
#include "writer_int.h"

#define SPILL_NONE 0 /* chunks[].spill_off stores offset + 1 */

struct wbuf {
	struct wbuf *next;
	uint64_t size; /* the chunk size it was allocated for */
	size_t cap; /* ckpt_hugebuf_alloc's capacity */
	uint8_t *p;
};

void w_lru_remove_locked(struct ckpt_step *st, struct wlive *l)
{
	if (!l->in_lru)
		return;
	if (l->lru_prev)
		l->lru_prev->lru_next = l->lru_next;
	else
		st->lru_head = l->lru_next;
	if (l->lru_next)
		l->lru_next->lru_prev = l->lru_prev;
	else
		st->lru_tail = l->lru_prev;
	l->lru_prev = l->lru_next = NULL;
	l->in_lru = 0;
}

static void lru_add_locked(struct ckpt_step *st, struct wlive *l)
{
	if (l->in_lru)
		return;
	l->lru_next = NULL;
	l->lru_prev = st->lru_tail;
	if (st->lru_tail)
		st->lru_tail->lru_next = l;
	else
		st->lru_head = l;
	st->lru_tail = l;
	l->in_lru = 1;
}

static int spill(struct ckpt_step *st, struct ckpt_warray *a, uint64_t idx);

/* Charge `cost` bytes for a live chunk whose buffer has `size` bytes and
 * return a zeroed buffer.  Waits for compression, spills partial chunks,
 * and exceeds the budget only when nothing else can free memory.  Called
 * with no lock held. */
static int mem_acquire(struct ckpt_step *st, uint64_t cost, uint64_t size, uint8_t **out, size_t *outcap)
{
	uint8_t *buf = NULL;
	size_t cap = 0;
	int rc = 0;
	pthread_mutex_lock(&st->mu);
	for (struct wbuf **pp = &st->cache; *pp; pp = &(*pp)->next) {
		if ((*pp)->size == size) {
			struct wbuf *b = *pp;
			*pp = b->next;
			buf = b->p;
			cap = b->cap;
			free(b);
			st->cached_bytes -= size;
			st->ncached--;
			st->mem_used -= size;
			break;
		}
	}
	for (;;) {
		if (st->mem_used + cost <= st->opts.mem_budget || st->mem_used == 0)
			break;
		if (st->cache) {
			struct wbuf *b = st->cache;
			st->cache = b->next;
			st->cached_bytes -= b->size;
			st->ncached--;
			st->mem_used -= b->size;
			ckpt_hugebuf_free(b->p, b->cap);
			free(b);
			continue;
		}
		if (st->inflight > 0) {
			pthread_cond_wait(&st->memcond, &st->mu);
			continue;
		}
		if (st->lru_head) {
			/* Only (array, idx) stay valid once st->mu is dropped. */
			struct wlive *v = st->lru_head;
			struct ckpt_warray *va = v->arr;
			uint64_t vidx = v->idx;
			w_lru_remove_locked(st, v);
			pthread_mutex_unlock(&st->mu);
			rc = spill(st, va, vidx);
			pthread_mutex_lock(&st->mu);
			if (rc && rc != -EAGAIN)
				break;
			rc = 0;
			continue;
		}
		if (st->npinned > 0) {
			pthread_cond_wait(&st->memcond, &st->mu);
			continue;
		}
		if (st->io_err) {
			rc = st->io_err;
			break;
		}
		break; /* nothing can be freed: exceed the budget */
	}
	if (!rc)
		st->mem_used += cost;
	pthread_mutex_unlock(&st->mu);
	int fresh = !buf;
	if (!rc && !buf && !(buf = ckpt_hugebuf_alloc(size, &cap))) {
		rc = -ENOMEM;
		pthread_mutex_lock(&st->mu);
		st->mem_used -= cost;
		pthread_cond_broadcast(&st->memcond);
		pthread_mutex_unlock(&st->mu);
	}
	if (rc) {
		ckpt_hugebuf_free(buf, cap);
		return rc;
	}
	if (!fresh)
		memset(buf, 0, size); /* a fresh buffer is zero already */
	*out = buf;
	*outcap = cap;
	return 0;
}

static int live_new(struct ckpt_warray *a, uint64_t idx, struct wlive **out)
{
	struct wlive *l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	int rc = mem_acquire(a->step, a->live_cost, a->chunk_nbytes, &l->buf, &l->bufcap);
	if (rc) {
		free(l);
		if (rc == -ENOMEM)
			ckpt_log(CKPT_LOG_ERR, "writer: %s: out of memory for a chunk buffer", a->relpath);
		else
			ckpt_log(CKPT_LOG_ERR, "writer: %s: no chunk memory can be freed: %s", a->relpath,
				 strerror(-rc));
		return rc;
	}
	pthread_mutex_init(&l->mu, NULL);
	l->arr = a;
	l->idx = idx;
	*out = l;
	return 0;
}

void w_live_free(struct ckpt_step *st, struct wlive *l, int release_mem)
{
	struct ckpt_warray *a = l->arr;
	struct wbuf *b = NULL;
	pthread_mutex_destroy(&l->mu);
	w_cov_free(&l->cov);
	pthread_mutex_lock(&st->mu);
	if (release_mem)
		st->mem_used -= a->live_cost;
	if (release_mem && st->ncached < 64 &&
	    st->cached_bytes + a->chunk_nbytes <= st->opts.mem_budget / 4 && (b = malloc(sizeof(*b)))) {
		b->p = l->buf;
		b->cap = l->bufcap;
		b->size = a->chunk_nbytes;
		b->next = st->cache;
		st->cache = b;
		st->ncached++;
		st->cached_bytes += b->size;
		st->mem_used += b->size;
		l->buf = NULL;
	}
	pthread_cond_broadcast(&st->memcond);
	pthread_mutex_unlock(&st->mu);
	ckpt_hugebuf_free(l->buf, l->bufcap);
	free(l);
}

int w_spill_fd(struct ckpt_step *st)
{
	int fd;
	pthread_mutex_lock(&st->mu);
	if (st->spill_fd < 0) {
		fd = openat(st->dirfd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
		if (fd < 0) {
			fd = openat(st->dirfd, ".ckptfs-spill", O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
			if (fd >= 0)
				unlinkat(st->dirfd, ".ckptfs-spill", 0);
		}
		st->spill_fd = fd < 0 ? -errno : fd;
	}
	fd = st->spill_fd;
	pthread_mutex_unlock(&st->mu);
	return fd;
}

/* Write partial chunk idx of a to its spill slot and free its memory.
 * -EAGAIN when the chunk is no longer a spill candidate. */
static int spill(struct ckpt_step *st, struct ckpt_warray *a, uint64_t idx)
{
	struct wchunk *c = &a->chunks[idx];
	uint64_t slot = (a->chunk_nbytes + a->bm_bytes + 4095) / 4096 * 4096;
	pthread_mutex_lock(&a->mu);
	struct wlive *l = c->live;
	if (!l || c->state != WC_LIVE || c->pins || c->have == w_chunk_need(a, idx)) {
		pthread_mutex_unlock(&a->mu);
		return -EAGAIN;
	}
	c->state = WC_SPILLING;
	pthread_mutex_lock(&st->mu);
	w_lru_remove_locked(st, l); /* may be a newer live than the victim taken */
	st->inflight += a->live_cost;
	if (c->spill_off == SPILL_NONE) {
		c->spill_off = st->spill_end + 1;
		st->spill_end += slot;
	}
	uint64_t off = c->spill_off - 1;
	pthread_mutex_unlock(&st->mu);
	pthread_mutex_unlock(&a->mu);

	int fd = w_spill_fd(st), rc = fd < 0 ? fd : 0;
	if (!rc)
		rc = w_cov_to_bitmap(&l->cov, a->chunk_nbytes);
	if (!rc)
		rc = ckpt_pwrite_all(fd, l->buf, a->chunk_nbytes, off);
	if (!rc)
		rc = ckpt_pwrite_all(fd, l->cov.bm, a->bm_bytes, off + a->chunk_nbytes);

	pthread_mutex_lock(&a->mu);
	pthread_mutex_lock(&st->mu);
	st->inflight -= a->live_cost;
	if (rc) {
		c->state = WC_LIVE;
		lru_add_locked(st, l);
	} else {
		c->state = WC_SPILLED;
		c->live = NULL;
		st->nspilled++;
		st->spills++;
	}
	pthread_cond_broadcast(&st->memcond);
	pthread_cond_broadcast(&st->idlecond);
	pthread_mutex_unlock(&st->mu);
	pthread_cond_broadcast(&a->cond);
	pthread_mutex_unlock(&a->mu);
	if (rc) {
		ckpt_log(CKPT_LOG_ERR, "writer: %s: spilling a partial chunk failed: %s", a->relpath,
			 strerror(-rc));
		return rc;
	}
	w_live_free(st, l, 1);
	return 0;
}

/* ---- pins ---- */

/* Under a->mu, state has a live buffer. */
void w_pin_locked(struct ckpt_step *st, struct wchunk *c)
{
	pthread_mutex_lock(&st->mu);
	if (c->pins++ == 0) {
		w_lru_remove_locked(st, c->live);
		st->npinned++;
	}
	st->pins_total++;
	pthread_mutex_unlock(&st->mu);
}

void w_unpin(struct ckpt_warray *a, uint64_t idx, uint64_t added)
{
	struct ckpt_step *st = a->step;
	struct wchunk *c = &a->chunks[idx];
	pthread_mutex_lock(&a->mu);
	c->have += added;
	a->have_total += added;
	c->pins--;
	pthread_mutex_lock(&st->mu);
	st->pins_total--;
	st->bytes_pending += added;
	if (c->pins == 0) {
		st->npinned--;
		if (c->state == WC_LIVE) {
			if (c->have == w_chunk_need(a, idx)) {
				c->state = WC_QUEUED;
				st->inflight += a->live_cost;
				w_queue_push_locked(st, c->live);
			} else {
				lru_add_locked(st, c->live);
			}
		} else if (c->state == WC_QUEUED && !c->live->in_queue) {
			w_queue_push_locked(st, c->live);
		}
		pthread_cond_broadcast(&st->memcond);
	}
	if (st->pins_total == 0)
		pthread_cond_broadcast(&st->idlecond);
	pthread_mutex_unlock(&st->mu);
	pthread_mutex_unlock(&a->mu);
	if (added)
		CKPT_STAT_ADD(bytes_pending, (int64_t)added);
}

int w_stored_load(struct ckpt_warray *a, uint64_t idx, uint64_t off, uint64_t len, uint8_t *dst)
{
	char path[4096];
	int rc = w_shard_path(a, w_chunk_shard(a, idx), path, sizeof(path));
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

/* Pin chunk idx for writing, giving it a live buffer (allocating, reloading
 * from the spill file, or decoding from the shard file as needed). */
int w_pin_write(struct ckpt_warray *a, uint64_t idx, struct wlive **out)
{
	struct ckpt_step *st = a->step;
	struct wchunk *c = &a->chunks[idx];
	struct wlive *fresh = NULL;
	int rc;
	pthread_mutex_lock(&a->mu);
	for (;;) {
		switch (c->state) {
		case WC_LIVE:
		case WC_QUEUED:
		case WC_ERROR:
			w_pin_locked(st, c);
			*out = c->live;
			pthread_mutex_unlock(&a->mu);
			if (fresh)
				w_live_free(st, fresh, 1);
			return 0;
		case WC_COMPRESSING:
		case WC_SPILLING:
		case WC_LOADING:
			pthread_cond_wait(&a->cond, &a->mu);
			continue;
		default:
			break;
		}
		if (!fresh) {
			pthread_mutex_unlock(&a->mu);
			rc = live_new(a, idx, &fresh);
			if (rc)
				return rc;
			pthread_mutex_lock(&a->mu);
			continue;
		}
		if (c->state == WC_EMPTY) {
			c->live = fresh;
			c->state = WC_LIVE;
			w_pin_locked(st, c);
			*out = fresh;
			pthread_mutex_unlock(&a->mu);
			return 0;
		}
		/* SPILLED or STORED: load it. */
		int prev = c->state;
		uint64_t off = c->off, len = c->len, soff = c->spill_off - 1;
		c->state = WC_LOADING;
		c->live = fresh;
		pthread_mutex_lock(&st->mu);
		st->inflight += a->live_cost;
		pthread_mutex_unlock(&st->mu);
		pthread_mutex_unlock(&a->mu);
		if (prev == WC_SPILLED) {
			int fd = w_spill_fd(st);
			rc = w_cov_to_bitmap(&fresh->cov, a->chunk_nbytes);
			if (!rc)
				rc = fd < 0 ? fd : ckpt_pread_all(fd, fresh->buf, a->chunk_nbytes, soff);
			if (!rc)
				rc = ckpt_pread_all(fd, fresh->cov.bm, a->bm_bytes, soff + a->chunk_nbytes);
			if (rc)
				ckpt_log(CKPT_LOG_ERR, "writer: %s: re-reading a spilled chunk failed: %s",
					 a->relpath, strerror(-rc));
		} else {
			rc = w_stored_load(a, idx, off, len, fresh->buf);
			if (!rc)
				w_cov_fill(&fresh->cov, a->chunk_nbytes);
		}
		pthread_mutex_lock(&a->mu);
		pthread_mutex_lock(&st->mu);
		st->inflight -= a->live_cost;
		pthread_cond_broadcast(&st->memcond);
		pthread_cond_broadcast(&st->idlecond);
		pthread_mutex_unlock(&st->mu);
		pthread_cond_broadcast(&a->cond);
		if (rc) {
			c->state = (uint8_t)prev;
			c->live = NULL;
			pthread_mutex_unlock(&a->mu);
			w_live_free(st, fresh, 1);
			return rc;
		}
		uint64_t need = w_chunk_need(a, idx);
		if (prev == WC_SPILLED) {
			pthread_mutex_lock(&st->mu);
			st->nspilled--;
			pthread_mutex_unlock(&st->mu);
		} else {
			/* A stored chunk is written again: it is pending again. */
			a->nstored--;
			a->shards[w_chunk_shard(a, idx)].unstored++;
			pthread_mutex_lock(&st->mu);
			st->bytes_pending += need;
			pthread_mutex_unlock(&st->mu);
			CKPT_STAT_ADD(bytes_pending, (int64_t)need);
		}
		c->state = WC_LIVE;
		w_pin_locked(st, c);
		*out = fresh;
		pthread_mutex_unlock(&a->mu);
		return 0;
	}
}

void w_cache_free(struct ckpt_step *st)
{
	for (struct wbuf *b = st->cache, *nb; b; b = nb) {
		nb = b->next;
		ckpt_hugebuf_free(b->p, b->cap);
		free(b);
	}
	st->cache = NULL;
	st->mem_used -= st->cached_bytes;
	st->cached_bytes = 0;
	st->ncached = 0;
}
