/*
 * writer_chunk.c - the life of one inner chunk of a pending array: the memory
 * budget, chunk buffers (and warm free ones), pins, the compression queue,
 * the spill file for partial chunks, reloading a spilled or stored chunk,
 * and the outcome of compression (stored, error, retry).
 *
 * Every change of chunks[i].state happens in this file and goes through
 * chunk_set_state(), which asserts that the transition is one of the table
 * below and that the chunk's fields agree with its new state
 * (assert_chunk_state()).  Nothing else in the writer writes c->state,
 * c->live, c->pins, c->have or c->spill_slot.  Chunk entries live in the
 * sparse table of writer_table.c: a chunk without an entry is EMPTY, and
 * the first write to it makes a zeroed (EMPTY) entry (ckpt_w_chunk_touch).
 *
 * States (enum wc_state, writer_int.h):
 *
 *   EMPTY        never written; no memory.
 *   LIVE         a buffer (c->live) being written, or partial and idle (then
 *                it is a spill candidate, in the step's LRU list).
 *   QUEUED       complete; in the compression queue (or about to be put back
 *                there by its last unpin).
 *   COMPRESSING  BUSY: a compression thread owns the buffer.
 *   STORED       compressed bytes at (c->off, c->len) in the shard file; no
 *                memory.
 *   ERROR        complete, storing failed; buffer kept, queued again at commit.
 *   SPILLING     BUSY: partial, being written to its spill slot.
 *   SPILLED      partial; bytes + coverage bitmap in the spill slot; no memory.
 *   LOADING      BUSY: being re-read from the spill slot or the shard file
 *                into a fresh buffer, because it is written again.
 *
 * The thread that moves a chunk into a BUSY state owns it until it moves it
 * out; it drops array->mu while it does I/O or compression, and every other
 * thread that needs the chunk waits on array->cond.
 *
 *   EMPTY --> LIVE -------------> QUEUED --> COMPRESSING --> STORED
 *              | ^                   ^             |            |
 *              | | failed            +-- ERROR <---+ failed     |
 *              v |                                              |
 *            SPILLING --> SPILLED --> LOADING <-----------------+
 *                                       |       written again
 *                                       +--> LIVE (back to SPILLED or STORED
 *                                                  when the re-read fails)
 *
 *   and QUEUED, ERROR --> LIVE when ckpt_w_chunk_forget drops bytes of a complete
 *   chunk (a STORED or SPILLED one is re-read first, as for a write).
 *
 * Transitions (all under array->mu; "+st" = step->mu taken inside as well):
 *
 *   from         to           function                 when
 *   EMPTY        LIVE         pin_write_locked (+st)   first write; buffer from the budget
 *   LIVE         QUEUED       unpin_locked (+st)       last pin dropped and have == need
 *   QUEUED       LIVE         unpin_locked (+st)       ckpt_w_chunk_forget dropped bytes of a
 *   ERROR        LIVE         unpin_locked (+st)         complete chunk (pinned by it)
 *   LIVE         SPILLING     spill (+st)              budget full, chunk partial and unpinned
 *   SPILLING     SPILLED      spill (+st)              slot written; buffer freed
 *   SPILLING     LIVE         spill (+st)              slot write failed; back in the LRU
 *   SPILLED      LOADING      reload_locked (+st)      written again
 *   STORED       LOADING      reload_locked (+st)      written again (rare: rewrite)
 *   LOADING      LIVE         reload_locked (+st)      re-read done (pinned by the writer)
 *   LOADING      SPILLED      reload_locked (+st)      re-read failed: as before
 *   LOADING      STORED       reload_locked (+st)      re-read failed: as before
 *   QUEUED       COMPRESSING  ckpt_w_chunk_take_job         popped, unpinned, not queued again
 *   COMPRESSING  STORED       ckpt_w_chunk_store_done (+st) appended to the shard file
 *   COMPRESSING  ERROR        ckpt_w_chunk_store_done (+st) compression or append failed
 *   ERROR        QUEUED       ckpt_w_chunk_retry_errors (+st) commit
 *   EMPTY        STORED       ckpt_w_chunk_adopt_stored (+st) multi-host commit: another
 *                                                  host's compressed chunk
 *   LIVE         EMPTY        ckpt_w_chunk_reset (+st)      bytes dropped (O_TRUNC, unlink);
 *   ERROR        EMPTY        ckpt_w_chunk_reset (+st)        unpinned, after BUSY and QUEUED
 *   STORED       EMPTY        ckpt_w_chunk_reset (+st)        states have ended (stored bytes
 *   SPILLED      EMPTY        ckpt_w_chunk_reset (+st)        stay in the shard file, dead)
 *
 * Pins (c->pins, step->npinned, step->pins_total) keep a LIVE, QUEUED or
 * ERROR buffer in memory while a writer copies into it or a reader copies
 * out of it; they do not change the state.  A pinned chunk is never spilled
 * and never compressed.
 *
 * Fields per state (chunk_problem(), asserted on every transition and
 * checked by ckpt_w_chunk_check_all; need = in-bounds bytes of the chunk):
 *
 *   state        live   pins   have         spill slot
 *   EMPTY        NULL   0      0            none
 *   LIVE         set    any    <= need      any      (pins == 0 => have < need)
 *   QUEUED       set    any    == need      any
 *   COMPRESSING  set    0      == need      any
 *   STORED       NULL   0      == need      none     ((off, len) valid)
 *   ERROR        set    any    == need      any
 *   SPILLING     set    0      < need       set
 *   SPILLED      NULL   0      < need       set
 *   LOADING      set    0      any          any
 *
 * Budget (step->mu): mem_used = live_cost per chunk holding a buffer + the
 * bytes of warm free buffers; inflight = live_cost per chunk in QUEUED,
 * COMPRESSING, SPILLING or LOADING (memory that will be freed or become
 * usable without help).  Neither ever goes below zero (budget_sub asserts).
 */
#include <assert.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hugebuf.h"
#include "stats.h"
#include "sysio.h"
#include "writer_int.h"

/* ---- spill slots ----
 * c->spill_slot holds the slot's byte offset in the spill file plus one, so
 * that the zeroed chunk table means "no slot" (offset 0 is a valid slot).
 * Only these helpers read or write the encoding. */
#define SPILL_NONE 0

static int spill_has_slot(const struct wchunk *c)
{
	return c->spill_slot != SPILL_NONE;
}

static uint64_t spill_slot_off(const struct wchunk *c)
{
	assert(spill_has_slot(c));
	return c->spill_slot - 1;
}

static void spill_slot_set(struct wchunk *c, uint64_t off)
{
	c->spill_slot = off + 1;
}

/* A spill slot of array a: the chunk's bytes at the slot's offset, then its
 * coverage bitmap at spill_bm_off, each rounded up to 4 KiB so that the
 * slot's blocks can be punched out one by one.  Only the covered bytes and
 * the bitmap's non-zero blocks are written: the rest of a slot stays a
 * hole, so a spilled chunk takes about the bytes written, not the chunk. */
#define SPILL_BLOCK 4096

static uint64_t spill_bm_off(const struct ckpt_warray *a)
{
	return (a->chunk_nbytes + SPILL_BLOCK - 1) / SPILL_BLOCK * SPILL_BLOCK;
}

static uint64_t spill_slot_bytes(const struct ckpt_warray *a)
{
	return spill_bm_off(a) + (a->bm_bytes + SPILL_BLOCK - 1) / SPILL_BLOCK * SPILL_BLOCK;
}

/* ---- invariants ---- */

static void budget_sub(uint64_t *v, uint64_t n)
{
	assert(*v >= n);
	*v -= n;
}

/* What is wrong with chunk idx's fields for its state (the table above),
 * NULL when nothing.  Under a->mu. */
static const char *chunk_problem(const struct ckpt_warray *a, uint64_t idx)
{
	const struct wchunk *c = ckpt_w_chunk_at(a, idx);
	uint64_t need = ckpt_w_chunk_need(a, idx);
	if (!c)
		return NULL; /* no entry: EMPTY */
	if (c->have > need)
		return "more bytes covered than the chunk has";
	if (c->live && (c->live->arr != a || c->live->idx != idx))
		return "buffer of another chunk";
	switch (c->state) {
	case WC_EMPTY:
		return c->live || c->pins || c->have || spill_has_slot(c) ? "EMPTY with data" : NULL;
	case WC_LIVE:
		if (!c->live)
			return "LIVE without a buffer";
		return c->pins == 0 && c->have == need ? "complete and unpinned but LIVE" : NULL;
	case WC_QUEUED:
	case WC_ERROR:
		return !c->live || c->have != need ? "QUEUED/ERROR without a complete buffer" : NULL;
	case WC_COMPRESSING:
		return !c->live || c->pins || c->have != need ? "COMPRESSING: bad buffer, pins or bytes"
							      : NULL;
	case WC_STORED:
		return c->live || c->pins || c->have != need || spill_has_slot(c)
			       ? "STORED with memory or a slot"
			       : NULL;
	case WC_SPILLING:
		return !c->live || c->pins || c->have >= need || !spill_has_slot(c) ? "SPILLING: bad fields"
										    : NULL;
	case WC_SPILLED:
		return c->live || c->pins || c->have >= need || !spill_has_slot(c) ? "SPILLED: bad fields"
										   : NULL;
	case WC_LOADING:
		return !c->live || c->pins ? "LOADING: bad buffer or pins" : NULL;
	default:
		return "unknown state";
	}
}

#ifndef NDEBUG
static void assert_chunk_state(const struct ckpt_warray *a, uint64_t idx)
{
	const char *why = chunk_problem(a, idx);
	if (why)
		ckpt_log(CKPT_LOG_ERR, "writer: %s: chunk %llu (state %d): %s", a->relpath,
			 (unsigned long long)idx, ckpt_w_chunk_at(a, idx)->state, why);
	assert(!why);
}

static int transition_ok(int from, int to)
{
	static const uint16_t ok[] = {
		[WC_EMPTY] = 1u << WC_LIVE | 1u << WC_STORED,
		[WC_LIVE] = 1u << WC_QUEUED | 1u << WC_SPILLING | 1u << WC_EMPTY,
		[WC_QUEUED] = 1u << WC_COMPRESSING | 1u << WC_LIVE,
		[WC_COMPRESSING] = 1u << WC_STORED | 1u << WC_ERROR,
		[WC_STORED] = 1u << WC_LOADING | 1u << WC_EMPTY,
		[WC_ERROR] = 1u << WC_QUEUED | 1u << WC_EMPTY | 1u << WC_LIVE,
		[WC_SPILLING] = 1u << WC_SPILLED | 1u << WC_LIVE,
		[WC_SPILLED] = 1u << WC_LOADING | 1u << WC_EMPTY,
		[WC_LOADING] = 1u << WC_LIVE | 1u << WC_SPILLED | 1u << WC_STORED,
	};
	return from >= 0 && from <= WC_LOADING && (ok[from] >> to & 1);
}

static void assert_chunk_transition(int from, int to)
{
	assert(transition_ok(from, to));
	(void)from;
	(void)to;
}
#else
#define assert_chunk_state(a, idx) ((void)0)
#define assert_chunk_transition(from, to) ((void)0)
#endif

/* The one place c->state changes.  Under a->mu; the caller has already made
 * the fields agree with `to`. */
static void chunk_set_state(struct ckpt_warray *a, uint64_t idx, enum wc_state to)
{
	struct wchunk *c = ckpt_w_chunk_at(a, idx);
	assert(c);
	assert_chunk_transition(c->state, to);
	c->state = (uint8_t)to;
	assert_chunk_state(a, idx);
}

/* ---- lists under step->mu: spill candidates (LRU) and the queue ---- */

static void lru_remove_locked(struct ckpt_step *st, struct wlive *l)
{
	ckpt_assert_held(CKPT_RANK_W_STEP);
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
	ckpt_assert_held(CKPT_RANK_W_STEP);
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

static void queue_push_locked(struct ckpt_step *st, struct wlive *l)
{
	ckpt_assert_held(CKPT_RANK_W_STEP);
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

/* A chunk that is no longer complete leaves the queue (it may not be
 * spilled or freed while queued). */
static void queue_remove_locked(struct ckpt_step *st, struct wlive *l)
{
	ckpt_assert_held(CKPT_RANK_W_STEP);
	if (!l->in_queue)
		return;
	struct wlive *prev = NULL;
	for (struct wlive *q = st->qhead; q; prev = q, q = q->qnext) {
		if (q != l)
			continue;
		if (prev)
			prev->qnext = q->qnext;
		else
			st->qhead = q->qnext;
		if (st->qtail == q)
			st->qtail = prev;
		break;
	}
	l->qnext = NULL;
	l->in_queue = 0;
}

/* ---- buffers and the budget ---- */

struct wbuf {
	struct wbuf *next;
	uint64_t size; /* the chunk size it was allocated for */
	size_t cap; /* ckpt_hugebuf_alloc's capacity */
	uint8_t *p;
};

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
	ckpt_lock(&st->mu, CKPT_RANK_W_STEP);
	for (struct wbuf **pp = &st->cache; *pp; pp = &(*pp)->next) {
		if ((*pp)->size == size) {
			struct wbuf *b = *pp;
			*pp = b->next;
			buf = b->p;
			cap = b->cap;
			free(b);
			budget_sub(&st->cached_bytes, size);
			st->ncached--;
			budget_sub(&st->mem_used, size);
			break;
		}
	}
	for (;;) {
		if (st->mem_used + cost <= st->opts.mem_budget || st->mem_used == 0)
			break;
		if (st->cache) {
			struct wbuf *b = st->cache;
			st->cache = b->next;
			budget_sub(&st->cached_bytes, b->size);
			st->ncached--;
			budget_sub(&st->mem_used, b->size);
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
			lru_remove_locked(st, v);
			ckpt_unlock(&st->mu, CKPT_RANK_W_STEP);
			rc = spill(st, va, vidx);
			ckpt_lock(&st->mu, CKPT_RANK_W_STEP);
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
	ckpt_unlock(&st->mu, CKPT_RANK_W_STEP);
	int fresh = !buf;
	if (!rc && !buf && !(buf = ckpt_hugebuf_alloc(size, &cap))) {
		rc = -ENOMEM;
		ckpt_lock(&st->mu, CKPT_RANK_W_STEP);
		budget_sub(&st->mem_used, cost);
		pthread_cond_broadcast(&st->memcond);
		ckpt_unlock(&st->mu, CKPT_RANK_W_STEP);
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

/* Under st->mu: return the charge of a buffer that no chunk points to any
 * more to the budget, keeping the buffer warm for the next chunk when there
 * is room (l->buf is then NULL).  Done in the same st->mu section that
 * lowers inflight, so that a thread waiting for memory never sees the
 * memory as neither in flight nor free. */
static void live_release_locked(struct ckpt_step *st, struct wlive *l)
{
	ckpt_assert_held(CKPT_RANK_W_STEP);
	struct ckpt_warray *a = l->arr;
	struct wbuf *b = NULL;
	assert(!l->in_queue && !l->in_lru);
	budget_sub(&st->mem_used, a->live_cost);
	if (st->ncached < 64 && st->cached_bytes + a->chunk_nbytes <= st->opts.mem_budget / 4 &&
	    (b = malloc(sizeof(*b)))) {
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
}

/* No lock: free what live_release_locked left of l. */
static void live_destroy(struct wlive *l)
{
	pthread_mutex_destroy(&l->mu);
	ckpt_w_cov_free(&l->cov);
	ckpt_hugebuf_free(l->buf, l->bufcap);
	free(l);
}

static void live_free(struct ckpt_step *st, struct wlive *l)
{
	ckpt_lock(&st->mu, CKPT_RANK_W_STEP);
	live_release_locked(st, l);
	ckpt_unlock(&st->mu, CKPT_RANK_W_STEP);
	live_destroy(l);
}

/* ---- the spill file ---- */

static int spill_fd(struct ckpt_step *st)
{
	int fd;
	ckpt_lock(&st->mu, CKPT_RANK_W_STEP);
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
	ckpt_unlock(&st->mu, CKPT_RANK_W_STEP);
	return fd;
}

/* Covered runs of a spilled chunk, merged across gaps shorter than a block
 * (the gap's zeros cost no more blocks than the runs around it). */
struct spill_runs {
	int fd;
	uint64_t off; /* the slot */
	const uint8_t *buf;
	uint64_t s, e; /* the run being gathered, e == 0: none */
};

static int spill_flush_run(struct spill_runs *r)
{
	int rc = r->e > r->s ? ckpt_pwrite_all(r->fd, r->buf + r->s, r->e - r->s, r->off + r->s) : 0;
	r->s = r->e = 0;
	return rc;
}

static int spill_run(void *ctx, uint64_t s, uint64_t e)
{
	struct spill_runs *r = ctx;
	if (r->e && s - r->e < SPILL_BLOCK) {
		r->e = e;
		return 0;
	}
	int rc = spill_flush_run(r);
	r->s = s;
	r->e = e;
	return rc;
}

/* Write the covered bytes of l and its bitmap (bitmap mode) to the slot at
 * off.  A slot used before is punched out first, so that bytes and bitmap
 * blocks it no longer covers are holes; where punching is not supported,
 * the whole bitmap is written (the chunk bytes outside it are ignored on
 * reading). */
static int spill_write(struct ckpt_warray *a, int fd, uint64_t off, struct wlive *l, int reused)
{
	int sparse = 1;
	if (reused &&
	    fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)spill_slot_bytes(a)))
		sparse = 0;
	struct spill_runs r = { .fd = fd, .off = off, .buf = l->buf };
	int rc = ckpt_w_cov_each(&l->cov, 0, a->chunk_nbytes, spill_run, &r);
	if (!rc)
		rc = spill_flush_run(&r);
	uint64_t bo = off + spill_bm_off(a);
	const uint8_t *bm = (const uint8_t *)l->cov.bm;
	if (!sparse)
		return rc ? rc : ckpt_pwrite_all(fd, bm, a->bm_bytes, bo);
	for (uint64_t b = 0; !rc && b < a->bm_bytes; b += SPILL_BLOCK) {
		uint64_t n = a->bm_bytes - b < SPILL_BLOCK ? a->bm_bytes - b : SPILL_BLOCK;
		int any = 0;
		for (uint64_t w = 0; !any && w < n / 8; w++)
			any = l->cov.bm[(b / 8) + w] != 0;
		if (any)
			rc = ckpt_pwrite_all(fd, bm + b, n, bo + b);
	}
	return rc;
}

/* pread of a spill slot: the file may end inside it (a slot's tail that was
 * never written is a hole past the end of the file), which reads as zeros. */
static int spill_pread(int fd, uint8_t *p, size_t len, uint64_t off)
{
	while (len) {
		ssize_t n = pread(fd, p, len, (off_t)off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0) {
			memset(p, 0, len);
			return 0;
		}
		p += n;
		len -= (size_t)n;
		off += (uint64_t)n;
	}
	return 0;
}

struct zero_gaps {
	uint8_t *buf;
	uint64_t at; /* end of the last covered run */
};

static int zero_gap(void *ctx, uint64_t s, uint64_t e)
{
	struct zero_gaps *z = ctx;
	memset(z->buf + z->at, 0, s - z->at);
	z->at = e;
	return 0;
}

/* Write partial chunk idx of a to its spill slot and free its memory.
 * -EAGAIN when the chunk is no longer a spill candidate. */
static int spill(struct ckpt_step *st, struct ckpt_warray *a, uint64_t idx)
{
	struct wchunk *c = ckpt_w_chunk_at(a, idx);
	ckpt_lock(&a->mu, CKPT_RANK_W_ARRAY);
	struct wlive *l = c->live;
	if (!l || c->state != WC_LIVE || c->pins || c->have == ckpt_w_chunk_need(a, idx)) {
		ckpt_unlock(&a->mu, CKPT_RANK_W_ARRAY);
		return -EAGAIN;
	}
	ckpt_lock(&st->mu, CKPT_RANK_W_STEP);
	lru_remove_locked(st, l); /* may be a newer live than the victim taken */
	st->inflight += a->live_cost;
	int reused = spill_has_slot(c);
	if (!reused) {
		spill_slot_set(c, st->spill_end);
		st->spill_end += spill_slot_bytes(a);
	}
	uint64_t off = spill_slot_off(c);
	ckpt_unlock(&st->mu, CKPT_RANK_W_STEP);
	chunk_set_state(a, idx, WC_SPILLING);
	ckpt_unlock(&a->mu, CKPT_RANK_W_ARRAY);

	int fd = spill_fd(st), rc = fd < 0 ? fd : 0;
	if (!rc)
		rc = ckpt_w_cov_to_bitmap(&l->cov, a->chunk_nbytes);
	if (!rc)
		rc = spill_write(a, fd, off, l, reused);

	ckpt_lock(&a->mu, CKPT_RANK_W_ARRAY);
	if (!rc)
		c->live = NULL;
	chunk_set_state(a, idx, rc ? WC_LIVE : WC_SPILLED); /* before inflight drops */
	ckpt_lock(&st->mu, CKPT_RANK_W_STEP);
	budget_sub(&st->inflight, a->live_cost);
	if (rc) {
		lru_add_locked(st, l);
	} else {
		st->nspilled++;
		st->spills++;
		live_release_locked(st, l);
	}
	pthread_cond_broadcast(&st->memcond);
	pthread_cond_broadcast(&st->idlecond);
	ckpt_unlock(&st->mu, CKPT_RANK_W_STEP);
	pthread_cond_broadcast(&a->cond);
	ckpt_unlock(&a->mu, CKPT_RANK_W_ARRAY);
	if (rc) {
		ckpt_log(CKPT_LOG_ERR, "writer: %s: spilling a partial chunk failed: %s", a->relpath,
			 strerror(-rc));
		return rc;
	}
	live_destroy(l);
	return 0;
}

/* Read spilled chunk c's slot into buf (chunk_nbytes) and, when cov is not
 * NULL, its coverage (cov must be in bitmap mode).  Bytes the bitmap does
 * not cover read as zero, whatever the slot holds there. */
static int spill_read(struct ckpt_warray *a, uint64_t off, uint8_t *buf, struct wcov *cov)
{
	int fd = spill_fd(a->step);
	struct wcov tmp = { 0 };
	if (!cov) {
		if (!(tmp.bm = malloc(a->bm_bytes ? a->bm_bytes : 8)))
			return -ENOMEM;
		cov = &tmp;
	}
	int rc = fd < 0 ? fd : spill_pread(fd, buf, a->chunk_nbytes, off);
	if (!rc)
		rc = spill_pread(fd, (uint8_t *)cov->bm, a->bm_bytes, off + spill_bm_off(a));
	if (!rc) {
		struct zero_gaps z = { buf, 0 };
		ckpt_w_cov_each(cov, 0, a->chunk_nbytes, zero_gap, &z);
		memset(buf + z.at, 0, a->chunk_nbytes - z.at);
	}
	free(tmp.bm);
	return rc;
}

/* ---- pins ---- */

/* Under a->mu; the chunk has a live buffer. */
static void pin_locked(struct ckpt_step *st, struct wchunk *c)
{
	ckpt_assert_held(CKPT_RANK_W_ARRAY);
	assert(c->live);
	ckpt_lock(&st->mu, CKPT_RANK_W_STEP);
	if (c->pins++ == 0) {
		lru_remove_locked(st, c->live);
		st->npinned++;
	}
	st->pins_total++;
	ckpt_unlock(&st->mu, CKPT_RANK_W_STEP);
}

/* Under a->mu: drop a pin, crediting `added` newly covered bytes and
 * debiting `removed` forgotten ones (ckpt_w_chunk_forget); queues the chunk for
 * compression when it is complete, else makes it a spill candidate.  A
 * complete chunk (QUEUED, ERROR) that lost bytes is LIVE again and leaves
 * the queue. */
static void unpin_locked(struct ckpt_warray *a, uint64_t idx, uint64_t added, uint64_t removed)
{
	ckpt_assert_held(CKPT_RANK_W_ARRAY);
	struct ckpt_step *st = a->step;
	struct wchunk *c = ckpt_w_chunk_at(a, idx);
	assert(c->pins > 0 && c->live);
	assert(removed <= c->have + added);
	c->have += added;
	c->have -= removed;
	a->have_total += added;
	budget_sub(&a->have_total, removed);
	c->pins--;
	ckpt_lock(&st->mu, CKPT_RANK_W_STEP);
	budget_sub(&st->pins_total, 1);
	st->bytes_pending += added;
	budget_sub(&st->bytes_pending, removed);
	enum wc_state was = c->state;
	int reopened = removed && (was == WC_QUEUED || was == WC_ERROR);
	if (reopened && was == WC_QUEUED)
		budget_sub(&st->inflight, a->live_cost);
	int queue = 0;
	if (reopened) {
		/* Before the LRU/queue choice below, which reads the state. */
		queue_remove_locked(st, c->live);
		chunk_set_state(a, idx, WC_LIVE);
		pthread_cond_broadcast(&st->memcond);
		pthread_cond_broadcast(&st->idlecond);
	}
	if (c->pins == 0) {
		budget_sub(&st->npinned, 1);
		if (c->state == WC_LIVE) {
			if (c->have == ckpt_w_chunk_need(a, idx)) {
				st->inflight += a->live_cost;
				queue_push_locked(st, c->live);
				queue = 1;
			} else {
				lru_add_locked(st, c->live);
			}
		} else if (c->state == WC_QUEUED && !c->live->in_queue) {
			queue_push_locked(st, c->live);
		}
		pthread_cond_broadcast(&st->memcond);
	}
	if (st->pins_total == 0)
		pthread_cond_broadcast(&st->idlecond);
	ckpt_unlock(&st->mu, CKPT_RANK_W_STEP);
	if (c->pins == 0)
		pthread_cond_broadcast(&a->cond); /* ckpt_w_chunk_reset waits for pins */
	if (queue)
		chunk_set_state(a, idx, WC_QUEUED);
	else
		assert_chunk_state(a, idx);
	if (added != removed)
		CKPT_STAT_ADD(bytes_pending, (int64_t)added - (int64_t)removed);
}

/* Under a->mu, state SPILLED or STORED, `fresh` a new buffer charged to the
 * budget: LOADING, re-read (a->mu dropped meanwhile), then LIVE and pinned,
 * or back to the old state on failure (fresh is then freed). */
static int reload_locked(struct ckpt_warray *a, uint64_t idx, struct wlive *fresh)
{
	ckpt_assert_held(CKPT_RANK_W_ARRAY);
	struct ckpt_step *st = a->step;
	struct wchunk *c = ckpt_w_chunk_at(a, idx);
	enum wc_state prev = c->state;
	uint64_t off = c->off, len = c->len, soff = prev == WC_SPILLED ? spill_slot_off(c) : 0;
	int rc;
	assert(prev == WC_SPILLED || prev == WC_STORED);
	c->live = fresh;
	ckpt_lock(&st->mu, CKPT_RANK_W_STEP);
	st->inflight += a->live_cost;
	ckpt_unlock(&st->mu, CKPT_RANK_W_STEP);
	if (prev == WC_STORED) /* the shard file will change */
		ckpt_w_shard_unfinish_locked(a, ckpt_w_chunk_shard(a, idx));
	chunk_set_state(a, idx, WC_LOADING);
	ckpt_unlock(&a->mu, CKPT_RANK_W_ARRAY);
	if (prev == WC_SPILLED) {
		rc = ckpt_w_cov_to_bitmap(&fresh->cov, a->chunk_nbytes);
		if (!rc)
			rc = spill_read(a, soff, fresh->buf, &fresh->cov);
		if (rc)
			ckpt_log(CKPT_LOG_ERR, "writer: %s: re-reading a spilled chunk failed: %s",
				 a->relpath, strerror(-rc));
	} else {
		rc = ckpt_w_shard_load_chunk(a, idx, off, len, fresh->buf);
		if (!rc)
			ckpt_w_cov_fill(&fresh->cov, a->chunk_nbytes);
	}
	ckpt_lock(&a->mu, CKPT_RANK_W_ARRAY);
	/* The new state is visible before inflight drops (ckpt_w_chunk_wait_idle). */
	if (rc) {
		c->live = NULL;
		chunk_set_state(a, idx, prev);
	} else {
		pin_locked(st, c);
		chunk_set_state(a, idx, WC_LIVE);
	}
	uint64_t need = ckpt_w_chunk_need(a, idx);
	ckpt_lock(&st->mu, CKPT_RANK_W_STEP);
	budget_sub(&st->inflight, a->live_cost);
	if (rc) {
		live_release_locked(st, fresh);
	} else if (prev == WC_SPILLED) {
		budget_sub(&st->nspilled, 1);
	} else {
		/* A stored chunk is written again: it is pending again. */
		budget_sub(&a->nstored, 1);
		ckpt_w_shard_at(a, ckpt_w_chunk_shard(a, idx))->unstored++;
		st->bytes_pending += need;
	}
	pthread_cond_broadcast(&st->memcond);
	pthread_cond_broadcast(&st->idlecond);
	ckpt_unlock(&st->mu, CKPT_RANK_W_STEP);
	pthread_cond_broadcast(&a->cond);
	if (rc) {
		live_destroy(fresh);
		return rc;
	}
	if (prev == WC_STORED)
		CKPT_STAT_ADD(bytes_pending, (int64_t)need);
	return 0;
}

/* Under a->mu (dropped and retaken while allocating or loading): pin chunk
 * idx for writing, giving it a live buffer (a new one, or re-read from the
 * spill file or the shard file).  With keep_empty, an EMPTY chunk is left
 * alone and 1 returned (nothing pinned). */
static int pin_write_locked(struct ckpt_warray *a, uint64_t idx, int keep_empty)
{
	ckpt_assert_held(CKPT_RANK_W_ARRAY);
	struct ckpt_step *st = a->step;
	struct wchunk *c = ckpt_w_chunk_at(a, idx);
	struct wlive *fresh = NULL;
	int rc;
	if (!c) {
		if (keep_empty)
			return 1;
		if (!(c = ckpt_w_chunk_touch(a, idx))) {
			ckpt_log(CKPT_LOG_ERR, "writer: %s: out of memory for the chunk table", a->relpath);
			return -ENOMEM;
		}
	}
	for (;;) {
		if (keep_empty && c->state == WC_EMPTY) {
			if (fresh) {
				ckpt_unlock(&a->mu, CKPT_RANK_W_ARRAY);
				live_free(st, fresh);
				ckpt_lock(&a->mu, CKPT_RANK_W_ARRAY);
				fresh = NULL;
				continue;
			}
			return 1;
		}
		switch (c->state) {
		case WC_LIVE:
		case WC_QUEUED:
		case WC_ERROR:
			pin_locked(st, c);
			if (fresh) {
				ckpt_unlock(&a->mu, CKPT_RANK_W_ARRAY);
				live_free(st, fresh);
				ckpt_lock(&a->mu, CKPT_RANK_W_ARRAY);
			}
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
			ckpt_unlock(&a->mu, CKPT_RANK_W_ARRAY);
			rc = live_new(a, idx, &fresh);
			ckpt_lock(&a->mu, CKPT_RANK_W_ARRAY);
			if (rc)
				return rc;
			continue;
		}
		if (c->state == WC_EMPTY) {
			c->live = fresh;
			pin_locked(st, c);
			chunk_set_state(a, idx, WC_LIVE);
			return 0;
		}
		return reload_locked(a, idx, fresh);
	}
}

int ckpt_w_chunk_write(struct ckpt_warray *a, uint64_t idx, w_chunk_fill_fn fill, void *ctx)
{
	ckpt_lock(&a->mu, CKPT_RANK_W_ARRAY);
	int rc = pin_write_locked(a, idx, 0);
	if (rc) {
		ckpt_unlock(&a->mu, CKPT_RANK_W_ARRAY);
		return rc;
	}
	/* The pin keeps the buffer; its contents are under l->mu. */
	struct wlive *l = ckpt_w_chunk_at(a, idx)->live;
	ckpt_unlock(&a->mu, CKPT_RANK_W_ARRAY);
	uint64_t added = 0;
	ckpt_lock(&l->mu, CKPT_RANK_W_LIVE);
	rc = fill(ctx, l->buf, &l->cov, &added);
	ckpt_unlock(&l->mu, CKPT_RANK_W_LIVE);
	ckpt_lock(&a->mu, CKPT_RANK_W_ARRAY);
	unpin_locked(a, idx, added, 0);
	ckpt_unlock(&a->mu, CKPT_RANK_W_ARRAY);
	return rc;
}

int ckpt_w_chunk_forget(struct ckpt_warray *a, uint64_t idx, w_chunk_fill_fn drop, void *ctx)
{
	ckpt_lock(&a->mu, CKPT_RANK_W_ARRAY);
	int rc = pin_write_locked(a, idx, 1);
	if (rc) { /* 1: EMPTY, nothing to drop */
		ckpt_unlock(&a->mu, CKPT_RANK_W_ARRAY);
		return rc < 0 ? rc : 0;
	}
	struct wlive *l = ckpt_w_chunk_at(a, idx)->live;
	ckpt_unlock(&a->mu, CKPT_RANK_W_ARRAY);
	uint64_t removed = 0;
	ckpt_lock(&l->mu, CKPT_RANK_W_LIVE);
	rc = drop(ctx, l->buf, &l->cov, &removed);
	ckpt_unlock(&l->mu, CKPT_RANK_W_LIVE);
	ckpt_lock(&a->mu, CKPT_RANK_W_ARRAY);
	unpin_locked(a, idx, 0, removed);
	ckpt_unlock(&a->mu, CKPT_RANK_W_ARRAY);
	return rc;
}

int ckpt_w_chunk_read(struct ckpt_warray *a, uint64_t idx, uint8_t **scratch, w_chunk_copy_fn copy, void *ctx)
{
	struct ckpt_step *st = a->step;
	struct wchunk *c = ckpt_w_chunk_at(a, idx);
	int rc = 0;
	if (!c) { /* never written */
		copy(ctx, NULL);
		return 0;
	}
	ckpt_lock(&a->mu, CKPT_RANK_W_ARRAY);
	while (c->state == WC_COMPRESSING || c->state == WC_SPILLING || c->state == WC_LOADING)
		pthread_cond_wait(&a->cond, &a->mu);
	enum wc_state state = c->state;
	uint64_t off = c->off, len = c->len, soff = state == WC_SPILLED ? spill_slot_off(c) : 0;
	struct wlive *l = c->live;
	if (state == WC_LIVE || state == WC_QUEUED || state == WC_ERROR)
		pin_locked(st, c);
	ckpt_unlock(&a->mu, CKPT_RANK_W_ARRAY);

	if (state == WC_EMPTY) {
		copy(ctx, NULL);
		return 0;
	}
	if (state == WC_LIVE || state == WC_QUEUED || state == WC_ERROR) {
		ckpt_lock(&l->mu, CKPT_RANK_W_LIVE);
		copy(ctx, l->buf);
		ckpt_unlock(&l->mu, CKPT_RANK_W_LIVE);
		ckpt_lock(&a->mu, CKPT_RANK_W_ARRAY);
		unpin_locked(a, idx, 0, 0);
		ckpt_unlock(&a->mu, CKPT_RANK_W_ARRAY);
		return 0;
	}
	/* STORED or SPILLED: a copy, read outside the budget. */
	if (!*scratch && !(*scratch = malloc(a->chunk_nbytes)))
		return -ENOMEM;
	if (state == WC_STORED) {
		rc = ckpt_w_shard_load_chunk(a, idx, off, len, *scratch);
	} else {
		rc = spill_read(a, soff, *scratch, NULL);
		if (rc)
			ckpt_log(CKPT_LOG_ERR, "writer: %s: reading a spilled chunk failed: %s", a->relpath,
				 strerror(-rc));
	}
	if (rc)
		return rc == -ENOMEM ? rc : -EIO;
	copy(ctx, *scratch);
	return 0;
}

/* ---- compression jobs ---- */

int ckpt_w_chunk_take_job(struct ckpt_step *st, struct ckpt_warray **aout, uint64_t *idxout,
			  struct wlive **lout)
{
	ckpt_lock(&st->mu, CKPT_RANK_W_STEP);
	for (;;) {
		while (!st->qhead && !st->stop)
			pthread_cond_wait(&st->qcond, &st->mu);
		if (st->stop) {
			ckpt_unlock(&st->mu, CKPT_RANK_W_STEP);
			return -ECANCELED;
		}
		/* A queued live is alive while in the queue; once st->mu is
		 * dropped only (array, idx) may be used: look the chunk up again. */
		struct wlive *l = st->qhead;
		st->qhead = l->qnext;
		if (!st->qhead)
			st->qtail = NULL;
		l->in_queue = 0;
		struct ckpt_warray *a = l->arr;
		uint64_t idx = l->idx;
		ckpt_unlock(&st->mu, CKPT_RANK_W_STEP);

		struct wchunk *c = ckpt_w_chunk_at(a, idx);
		ckpt_lock(&a->mu, CKPT_RANK_W_ARRAY);
		l = c->live;
		int requeued = 0;
		if (l) {
			ckpt_lock(&st->mu, CKPT_RANK_W_STEP);
			requeued = l->in_queue;
			ckpt_unlock(&st->mu, CKPT_RANK_W_STEP);
		}
		if (l && c->state == WC_QUEUED && !c->pins && !requeued) {
			chunk_set_state(a, idx, WC_COMPRESSING);
			ckpt_unlock(&a->mu, CKPT_RANK_W_ARRAY);
			*aout = a;
			*idxout = idx;
			*lout = l;
			return 0;
		}
		/* Pinned: the last unpin queues it again.  Requeued (an unpin came
		 * between our pop and here): that entry is its turn. */
		ckpt_unlock(&a->mu, CKPT_RANK_W_ARRAY);
		ckpt_lock(&st->mu, CKPT_RANK_W_STEP);
		pthread_cond_broadcast(&st->idlecond);
	}
}

int ckpt_w_chunk_store_done(struct ckpt_warray *a, uint64_t idx, int rc, uint64_t off, uint64_t len,
			    const char *why)
{
	struct ckpt_step *st = a->step;
	struct wchunk *c = ckpt_w_chunk_at(a, idx);
	uint64_t need = ckpt_w_chunk_need(a, idx);
	int shard_done = 0, spilled = 0;
	uint64_t spilled_off = 0;

	ckpt_lock(&a->mu, CKPT_RANK_W_ARRAY);
	struct wlive *l = c->live;
	assert(c->state == WC_COMPRESSING && l);
	if (!rc) {
		if (spill_has_slot(c)) {
			spilled = 1;
			spilled_off = spill_slot_off(c);
			c->spill_slot = SPILL_NONE;
		}
		c->off = off;
		c->len = len;
		c->live = NULL;
		a->nstored++;
		a->stored_bytes += len;
		struct wshard *sh = ckpt_w_shard_at(a, ckpt_w_chunk_shard(a, idx));
		budget_sub(&sh->unstored, 1);
		shard_done = sh->unstored == 0;
		if (shard_done && st->sink.shard_done)
			sh->finishing++; /* ckpt_w_shard_finish_early runs next; the commit waits for it */
	} else {
		if (!atomic_load(&a->err))
			ckpt_log(CKPT_LOG_ERR, "writer: %s: %s (chunk kept in memory; retried at commit)",
				 a->relpath, why);
		atomic_store(&a->err, rc);
	}
	/* The new state is visible before inflight drops: ckpt_w_chunk_wait_idle
	 * returns on inflight == 0 and the commit then reads the states. */
	chunk_set_state(a, idx, rc ? WC_ERROR : WC_STORED);
	ckpt_lock(&st->mu, CKPT_RANK_W_STEP);
	budget_sub(&st->inflight, a->live_cost);
	if (!rc) {
		budget_sub(&st->bytes_pending, need);
		st->stored_bytes += len;
		live_release_locked(st, l);
		/* The process-wide counters move with the step's, before anyone
		 * woken below can read them (a reset waiting for this chunk, a
		 * reader of .ckptfs/stats that saw the state change). */
		CKPT_STAT_ADD(bytes_pending, -(int64_t)need);
		CKPT_STAT_ADD(stored_bytes_written, len);
	} else {
		st->io_err = rc;
	}
	int sfd = st->spill_fd;
	pthread_cond_broadcast(&st->memcond);
	pthread_cond_broadcast(&st->idlecond);
	ckpt_unlock(&st->mu, CKPT_RANK_W_STEP);
	pthread_cond_broadcast(&a->cond);
	ckpt_unlock(&a->mu, CKPT_RANK_W_ARRAY);

	if (!rc) {
		if (spilled && sfd >= 0) /* the stale slot: give its blocks back */
			fallocate(sfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)spilled_off,
				  (off_t)spill_slot_bytes(a));
		live_destroy(l);
	}
	return shard_done;
}

int ckpt_w_chunk_adopt_stored(struct ckpt_warray *a, uint64_t idx, uint64_t off, uint64_t len)
{
	struct ckpt_step *st = a->step;
	uint64_t need = ckpt_w_chunk_need(a, idx);
	ckpt_lock(&a->mu, CKPT_RANK_W_ARRAY);
	struct wchunk *c = ckpt_w_chunk_touch(a, idx);
	if (!c) {
		ckpt_unlock(&a->mu, CKPT_RANK_W_ARRAY);
		ckpt_log(CKPT_LOG_ERR, "writer: %s: out of memory for the chunk table", a->relpath);
		return -ENOMEM;
	}
	assert(c->state == WC_EMPTY && !c->live && !c->pins && !spill_has_slot(c));
	c->off = off;
	c->len = len;
	c->have = need;
	a->have_total += need;
	a->nstored++;
	a->stored_bytes += len;
	budget_sub(&ckpt_w_shard_at(a, ckpt_w_chunk_shard(a, idx))->unstored, 1);
	chunk_set_state(a, idx, WC_STORED);
	ckpt_lock(&st->mu, CKPT_RANK_W_STEP);
	st->stored_bytes += len;
	ckpt_unlock(&st->mu, CKPT_RANK_W_STEP);
	ckpt_unlock(&a->mu, CKPT_RANK_W_ARRAY);
	return 0;
}

void ckpt_w_chunk_retry_errors(struct ckpt_step *st)
{
	for (struct witem *it = st->items; it; it = it->next)
		for (struct ckpt_warray *a = it->first; a; a = a->next) {
			ckpt_lock(&a->mu, CKPT_RANK_W_ARRAY);
			for (uint64_t i = ckpt_w_chunk_next(a, 0); i < a->nchunks;
			     i = ckpt_w_chunk_next(a, i + 1)) {
				struct wchunk *c = ckpt_w_chunk_at(a, i);
				if (c->state != WC_ERROR)
					continue;
				ckpt_lock(&st->mu, CKPT_RANK_W_STEP);
				st->inflight += a->live_cost;
				queue_push_locked(st, c->live);
				ckpt_unlock(&st->mu, CKPT_RANK_W_STEP);
				chunk_set_state(a, i, WC_QUEUED);
			}
			atomic_store(&a->err, 0);
			ckpt_unlock(&a->mu, CKPT_RANK_W_ARRAY);
		}
	ckpt_lock(&st->mu, CKPT_RANK_W_STEP);
	st->io_err = 0;
	ckpt_unlock(&st->mu, CKPT_RANK_W_STEP);
}

void ckpt_w_chunk_reset(struct ckpt_warray *a, uint64_t idx)
{
	struct ckpt_step *st = a->step;
	struct wchunk *c = ckpt_w_chunk_at(a, idx);
	if (!c) /* never written */
		return;
	ckpt_lock(&a->mu, CKPT_RANK_W_ARRAY);
	/* QUEUED ends in STORED or ERROR by itself; pins are short-lived. */
	while (c->pins || c->state == WC_QUEUED || c->state == WC_COMPRESSING || c->state == WC_SPILLING ||
	       c->state == WC_LOADING)
		pthread_cond_wait(&a->cond, &a->mu);
	enum wc_state prev = c->state;
	if (prev == WC_EMPTY) {
		ckpt_unlock(&a->mu, CKPT_RANK_W_ARRAY);
		return;
	}
	uint64_t have = c->have, slot = spill_has_slot(c) ? spill_slot_off(c) : 0;
	int had_slot = spill_has_slot(c);
	struct wlive *l = c->live;
	c->live = NULL;
	c->have = 0;
	c->spill_slot = SPILL_NONE;
	a->have_total -= have;
	if (prev == WC_STORED) {
		budget_sub(&a->nstored, 1);
		ckpt_w_shard_at(a, ckpt_w_chunk_shard(a, idx))->unstored++;
		ckpt_w_shard_unfinish_locked(a, ckpt_w_chunk_shard(a, idx));
	}
	chunk_set_state(a, idx, WC_EMPTY);
	ckpt_lock(&st->mu, CKPT_RANK_W_STEP);
	if (prev != WC_STORED)
		budget_sub(&st->bytes_pending, have);
	if (prev == WC_SPILLED)
		budget_sub(&st->nspilled, 1);
	if (l) {
		lru_remove_locked(st, l);
		live_release_locked(st, l);
	}
	int sfd = st->spill_fd;
	pthread_cond_broadcast(&st->memcond);
	ckpt_unlock(&st->mu, CKPT_RANK_W_STEP);
	pthread_cond_broadcast(&a->cond);
	ckpt_unlock(&a->mu, CKPT_RANK_W_ARRAY);
	if (prev != WC_STORED && have)
		CKPT_STAT_ADD(bytes_pending, -(int64_t)have);
	if (had_slot && sfd >= 0)
		fallocate(sfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)slot,
			  (off_t)spill_slot_bytes(a));
	if (l)
		live_destroy(l);
}

void ckpt_w_chunk_wait_idle(struct ckpt_step *st)
{
	ckpt_lock(&st->mu, CKPT_RANK_W_STEP);
	while (st->qhead || st->inflight)
		pthread_cond_wait(&st->idlecond, &st->mu);
	ckpt_unlock(&st->mu, CKPT_RANK_W_STEP);
}

/* ---- end of life ---- */

void ckpt_w_chunk_free_all(struct ckpt_step *st, struct ckpt_warray *a)
{
	for (uint64_t i = ckpt_w_chunk_next(a, 0); i < a->nchunks; i = ckpt_w_chunk_next(a, i + 1)) {
		struct wchunk *c = ckpt_w_chunk_at(a, i);
		struct wlive *l = c->live;
		if (l) {
			pthread_mutex_destroy(&l->mu);
			ckpt_w_cov_free(&l->cov);
			ckpt_hugebuf_free(l->buf, l->bufcap);
			free(l);
			c->live = NULL;
		}
	}
	(void)st;
}

void ckpt_w_chunk_cache_free(struct ckpt_step *st)
{
	for (struct wbuf *b = st->cache, *nb; b; b = nb) {
		nb = b->next;
		ckpt_hugebuf_free(b->p, b->cap);
		free(b);
	}
	st->cache = NULL;
	budget_sub(&st->mem_used, st->cached_bytes);
	st->cached_bytes = 0;
	st->ncached = 0;
}

/* ---- whole-step consistency ---- */

int ckpt_w_chunk_check_all(struct ckpt_step *st)
{
	uint64_t mem = 0, inflight = 0, npinned = 0, pins = 0, nspilled = 0, pending = 0;
	int bad = 0;
	ckpt_lock(&st->decl_mu, CKPT_RANK_W_DECL);
	for (struct witem *it = st->items; it; it = it->next)
		for (struct ckpt_warray *a = it->first; a; a = a->next) {
			uint64_t have = 0, nstored = 0;
			ckpt_lock(&a->mu, CKPT_RANK_W_ARRAY);
			for (uint64_t i = ckpt_w_chunk_next(a, 0); i < a->nchunks;
			     i = ckpt_w_chunk_next(a, i + 1)) {
				const struct wchunk *c = ckpt_w_chunk_at(a, i);
				const char *why = chunk_problem(a, i);
				if (!why && c->state != WC_EMPTY &&
				    !ckpt_w_shard_at(a, ckpt_w_chunk_shard(a, i)))
					why = "written, but its shard has no entry";
				if (why) {
					ckpt_log(CKPT_LOG_ERR, "writer: %s: chunk %llu (state %d): %s",
						 a->relpath, (unsigned long long)i, c->state, why);
					bad++;
				}
				have += c->have;
				mem += c->live ? a->live_cost : 0;
				if (c->state == WC_QUEUED || c->state == WC_COMPRESSING ||
				    c->state == WC_SPILLING || c->state == WC_LOADING)
					inflight += a->live_cost;
				npinned += c->pins > 0;
				pins += c->pins;
				nspilled += c->state == WC_SPILLED;
				if (c->state == WC_STORED)
					nstored++;
				else
					pending += c->have;
			}
			if (have != a->have_total || nstored != a->nstored) {
				ckpt_log(CKPT_LOG_ERR,
					 "writer: %s: have_total or nstored disagrees with the chunks",
					 a->relpath);
				bad++;
			}
			uint64_t per = 1;
			for (int d = 0; d < a->rank; d++)
				per *= a->mps[d];
			for (uint64_t s = ckpt_w_shard_next(a, 0); s < a->nshards;
			     s = ckpt_w_shard_next(a, s + 1)) {
				const struct wshard *sh = ckpt_w_shard_at(a, s);
				uint64_t unstored = 0;
				for (uint64_t e = 0; e < per; e++) {
					uint64_t ci = ckpt_w_shard_entry_chunk(a, s, e);
					const struct wchunk *c =
						ci == UINT64_MAX ? NULL : ckpt_w_chunk_at(a, ci);
					unstored += ci != UINT64_MAX && (!c || c->state != WC_STORED);
				}
				if (unstored != sh->unstored) {
					ckpt_log(CKPT_LOG_ERR,
						 "writer: %s: shard %llu: unstored count is wrong",
						 a->relpath, (unsigned long long)s);
					bad++;
				}
			}
			ckpt_unlock(&a->mu, CKPT_RANK_W_ARRAY);
		}
	ckpt_unlock(&st->decl_mu, CKPT_RANK_W_DECL);
	ckpt_lock(&st->mu, CKPT_RANK_W_STEP);
	if (mem + st->cached_bytes != st->mem_used || inflight != st->inflight || npinned != st->npinned ||
	    pins != st->pins_total || nspilled != st->nspilled || pending != st->bytes_pending) {
		ckpt_log(CKPT_LOG_ERR,
			 "writer: step %s: accounting disagrees with the chunks: mem %llu+%llu/%llu inflight "
			 "%llu/%llu pinned %llu/%llu pins %llu/%llu spilled %llu/%llu pending %llu/%llu",
			 st->name, (unsigned long long)mem, (unsigned long long)st->cached_bytes,
			 (unsigned long long)st->mem_used, (unsigned long long)inflight,
			 (unsigned long long)st->inflight, (unsigned long long)npinned,
			 (unsigned long long)st->npinned, (unsigned long long)pins,
			 (unsigned long long)st->pins_total, (unsigned long long)nspilled,
			 (unsigned long long)st->nspilled, (unsigned long long)pending,
			 (unsigned long long)st->bytes_pending);
		bad++;
	}
	ckpt_unlock(&st->mu, CKPT_RANK_W_STEP);
	return bad ? -EUCLEAN : 0;
}
