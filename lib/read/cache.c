/*
 * cache.c - the decoded-chunk cache (see cache.h).
 *
 * Invariants (all under c->lock; ckpt_cache_check() verifies them and the
 * assert()s below check the local ones):
 *  - every LOADING/READY entry is in the hash table, FAILED ones are not
 *    (their waiters hold the last refs and free them); c->count is the
 *    number of entries in the table;
 *  - a LOADING entry is pinned (refs >= 1) by whoever fills it or reserved
 *    it, and has no buffer until it is claimed (a prefetch reservation);
 *  - a READY entry has a buffer of cap >= size bytes; READY entries with
 *    refs == 0 are on the LRU list (head = most recent), all others are off;
 *  - c->bytes = the capacities of the buffers of table entries + spare
 *    buffers + buffers still held by FAILED entries (c->failed_bytes);
 *  - consumed READY entries (released with ckpt_cache_release_used) sit
 *    at the cold end of the LRU list, behind every other idle entry;
 *  - an entry marked dropped (ckpt_cache_drop_owners) is never idle: it is
 *    pinned or loading, and freed at its last release.
 *
 * Budget: a decode takes its buffer before it runs, so in-flight decodes
 * count like cached chunks.  A decode that finds no room (every byte
 * pinned or being filled) waits until some is released; only a thread
 * that itself holds pins does not wait (it could wait for itself), and a
 * prefetch gives up instead.  A unit larger than the whole budget waits
 * until nothing else is held, then runs alone, and is never kept.
 *
 * Buffers: a first touch of fresh memory costs a page fault per page, so
 * decoded chunks land in reused memory whenever possible: buffers come from
 * ckpt_hugebuf_alloc (2 MiB-rounded huge-page mappings for large chunks) and
 * an evicted buffer is reused for any smaller chunk: a mapped one is split,
 * the chunk takes its own capacity (so a chunk is charged what it holds)
 * and the rest stays a spare with its pages touched; a small one (calloc)
 * only when that wastes at most half of it.  An evicted buffer too small
 * for the next chunk is resized when the budget allows (the pages it
 * keeps are warm).
 */
#include <assert.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "lockrank.h"
#include "common.h"
#include "hugebuf.h"
#include "stats.h"

enum { LOADING, READY, FAILED };

struct ckpt_centry {
	uint64_t owner, idx;
	size_t size, cap;
	void *data;
	int state, err;
	int claimed; /* LOADING: someone is filling it (a reservation may not be) */
	int consumed; /* READY, idle: its reader is done with it (cold end of the LRU) */
	int starved; /* LOADING: its filler waits for room in the budget */
	int dropped; /* its owner was dropped while it was pinned: freed at its last release */
	unsigned refs;
	struct ckpt_centry *hnext;
	struct ckpt_centry *prev, *next; /* LRU */
};

struct spare {
	void *data;
	size_t cap;
};

#define NSPARE 16

struct ckpt_cache {
	pthread_mutex_t lock;
	pthread_cond_t loaded;
	pthread_cond_t room; /* bytes may have become free or evictable */
	unsigned waiting; /* threads waiting on room */
	uint64_t budget, bytes;
	uint64_t failed_bytes; /* buffers of FAILED entries not yet freed */
	struct ckpt_centry **table;
	size_t nbuckets, count;
	struct ckpt_centry lru; /* sentinel */
	struct spare spare[NSPARE];
	int nspare;
};

static size_t bucket(const ckpt_cache *c, uint64_t owner, uint64_t idx)
{
	uint64_t h = owner * 0x9E3779B97F4A7C15ull ^ (idx + 0x632BE59BD9B4E019ull) * 0xC2B2AE3D27D4EB4Full;
	h ^= h >> 29;
	return (size_t)(h & (c->nbuckets - 1));
}

int ckpt_cache_create(uint64_t budget, ckpt_cache **out)
{
	ckpt_cache *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->nbuckets = 4096;
	c->table = calloc(c->nbuckets, sizeof(*c->table));
	if (!c->table) {
		free(c);
		return -ENOMEM;
	}
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->loaded, NULL);
	pthread_cond_init(&c->room, NULL);
	c->budget = budget;
	atomic_store(&ckpt_g_stats.cache_budget, budget);
	c->lru.prev = c->lru.next = &c->lru;
	*out = c;
	return 0;
}

uint64_t ckpt_cache_budget(const ckpt_cache *c)
{
	return c->budget; /* set once at create */
}

static void lru_unlink(struct ckpt_centry *e)
{
	assert(e->prev && e->next && e->state == READY);
	e->prev->next = e->next;
	e->next->prev = e->prev;
	e->prev = e->next = NULL;
}

static void lru_push(ckpt_cache *c, struct ckpt_centry *e)
{
	assert(e->state == READY && e->refs == 0 && !e->prev && !e->next && e->data);
	if (e->consumed) {
		/* used once: first out, before any chunk a reader may still want */
		e->prev = c->lru.prev;
		e->next = &c->lru;
		c->lru.prev->next = e;
		c->lru.prev = e;
	} else {
		e->next = c->lru.next;
		e->prev = &c->lru;
		c->lru.next->prev = e;
		c->lru.next = e;
	}
	if (c->waiting)
		pthread_cond_broadcast(&c->room);
}

static void table_remove(ckpt_cache *c, struct ckpt_centry *e)
{
	struct ckpt_centry **pp = &c->table[bucket(c, e->owner, e->idx)];
	while (*pp && *pp != e)
		pp = &(*pp)->hnext;
	assert(*pp == e && c->count > 0);
	if (*pp)
		*pp = e->hnext;
	c->count--;
}

static void grow_table(ckpt_cache *c)
{
	size_t nb = c->nbuckets * 2;
	struct ckpt_centry **t = calloc(nb, sizeof(*t));
	if (!t)
		return;
	struct ckpt_centry **old = c->table;
	size_t ob = c->nbuckets;
	c->table = t;
	c->nbuckets = nb;
	for (size_t i = 0; i < ob; i++)
		for (struct ckpt_centry *e = old[i], *n; e; e = n) {
			n = e->hnext;
			size_t b = bucket(c, e->owner, e->idx);
			e->hnext = t[b];
			t[b] = e;
		}
	free(old);
}

/* The capacity ckpt_hugebuf_alloc gives for `size` bytes (computed before
 * allocating, for the budget). */
static size_t cap_for(size_t size)
{
	const size_t align = (size_t)2 << 20;
	if (size < CKPT_HUGEBUF_MIN)
		return size ? size : 1;
	return (size + align - 1) & ~(align - 1);
}

size_t ckpt_cache_charge(size_t size)
{
	return cap_for(size);
}

static void *buf_alloc(size_t size, size_t *cap)
{
	void *p = ckpt_hugebuf_alloc(size, cap);
	assert(!p || *cap == cap_for(size));
	return p;
}

static void buf_free(void *p, size_t cap)
{
	ckpt_hugebuf_free(p, cap);
}

/* 1 for a mapped buffer (capacity >= CKPT_HUGEBUF_MIN): it can be split
 * and resized. */
static int mapped(size_t cap)
{
	return cap >= CKPT_HUGEBUF_MIN;
}

/* A spare of capacity `cap` can hold a chunk of `size` bytes: a mapped
 * one of any larger capacity (trim splits the rest off as a spare), a
 * small one without wasting more than half of itself. */
static int fits(size_t cap, size_t size)
{
	if (cap < size)
		return 0;
	if (mapped(cap) && mapped(cap_for(size)))
		return 1;
	return cap - size <= cap / 2;
}

static void drop_spare(ckpt_cache *c, int i)
{
	assert(i >= 0 && i < c->nspare && c->bytes >= c->spare[i].cap);
	buf_free(c->spare[i].data, c->spare[i].cap);
	c->bytes -= c->spare[i].cap;
	atomic_store(&ckpt_g_stats.cache_bytes, c->bytes);
	c->spare[i] = c->spare[--c->nspare];
}

/* Keep a freed buffer for reuse (the oldest spare goes when full).
 * Called with the lock held. */
static void give_back(ckpt_cache *c, void *data, size_t cap)
{
	assert(data && c->nspare <= NSPARE);
	if (c->nspare == NSPARE)
		drop_spare(c, 0);
	c->spare[c->nspare].data = data;
	c->spare[c->nspare].cap = cap;
	c->nspare++;
}

/* Make room for a buffer of `need` bytes: drop spares that cannot hold
 * it, then evict LRU entries (their buffers become spares). */
static void make_room(ckpt_cache *c, size_t need)
{
	size_t cap = need ? cap_for(need) : 0;
	for (int i = 0; i < c->nspare && c->bytes + cap > c->budget;) {
		if (!need || !fits(c->spare[i].cap, need))
			drop_spare(c, i);
		else
			return; /* a spare will be reused: no new bytes needed */
	}
	while (c->bytes + cap > c->budget && c->lru.prev != &c->lru) {
		struct ckpt_centry *e = c->lru.prev;
		assert(e->state == READY && e->refs == 0);
		void *data = e->data;
		size_t ecap = e->cap;
		lru_unlink(e);
		table_remove(c, e);
		free(e);
		CKPT_STAT_ADD(cache_evictions, 1);
		if (need && fits(ecap, need)) {
			give_back(c, data, ecap); /* take_buffer reuses it at once */
			return;
		}
		assert(c->bytes >= ecap);
		/* A buffer of another size whose resizing fits the budget: its
		 * touched pages serve the new chunk (fresh pages cost a fault
		 * and zeroing each). */
		size_t ncap;
		void *q = need && c->bytes - ecap + cap <= c->budget
				  ? ckpt_hugebuf_resize(data, ecap, need, &ncap)
				  : NULL;
		if (q) {
			assert(ncap == cap);
			c->bytes = c->bytes - ecap + ncap;
			atomic_store(&ckpt_g_stats.cache_bytes, c->bytes);
			give_back(c, q, ncap);
			return;
		}
		buf_free(data, ecap);
		c->bytes -= ecap;
		atomic_store(&ckpt_g_stats.cache_bytes, c->bytes);
	}
}

/* Pins this thread took with ckpt_cache_get and has not released yet.  A
 * thread holding pins never waits for room (it might wait for itself). */
static __thread int held_pins;

/* A fitting spare, or NULL.  Lock held. */
static void *take_spare(ckpt_cache *c, size_t size, size_t *cap)
{
	int best = -1;
	for (int i = 0; i < c->nspare; i++)
		if (fits(c->spare[i].cap, size) && (best < 0 || c->spare[i].cap < c->spare[best].cap))
			best = i;
	if (best >= 0) {
		void *p = c->spare[best].data;
		*cap = c->spare[best].cap;
		c->spare[best] = c->spare[--c->nspare];
		return p; /* its bytes stay counted: now they belong to the entry */
	}
	return NULL;
}

/* The buffer of a consumed idle entry at the cold end of the LRU that
 * fits `size` (the entry is evicted), or NULL.  Lock held. */
static void *take_consumed(ckpt_cache *c, size_t size, size_t *cap)
{
	int scanned = 0;
	for (struct ckpt_centry *e = c->lru.prev; e != &c->lru && e->consumed && scanned < 16;
	     e = e->prev, scanned++) {
		if (!fits(e->cap, size))
			continue;
		void *p = e->data;
		*cap = e->cap;
		lru_unlink(e);
		table_remove(c, e);
		free(e);
		CKPT_STAT_ADD(cache_evictions, 1);
		return p; /* its bytes stay counted: now they belong to the new entry */
	}
	return NULL;
}

/* A reused buffer larger than size needs is cut to the chunk's own
 * capacity, so that a chunk is charged what it holds, not the capacity of
 * the larger chunk the buffer held before: a mapped buffer's tail becomes
 * a spare (its pages stay touched, its bytes counted).  A small one
 * (calloc, which fits allowed only up to twice the chunk) stays whole.
 * Lock held. */
static void *trim(ckpt_cache *c, void *p, size_t size, size_t *cap)
{
	size_t want = cap_for(size);
	if (*cap > want && mapped(want)) {
		give_back(c, ckpt_hugebuf_split(p, *cap, want), *cap - want);
		*cap = want;
	}
	return p;
}

/* A buffer for `size` bytes within the budget.  Memory that was touched
 * before comes first (a spare, then the buffer of a chunk its reader has
 * consumed), so a streaming reader cycles through a few pre-faulted
 * buffers however large the budget; then idle entries are evicted and
 * fresh memory is taken.  NULL with *err = -EAGAIN when there is no room
 * (every byte pinned or being filled), -ENOMEM.  Lock held. */
static void *take_buffer(ckpt_cache *c, size_t size, size_t *cap, int *err)
{
	void *p = take_spare(c, size, cap);
	if (!p)
		p = take_consumed(c, size, cap);
	if (p)
		return trim(c, p, size, cap);
	make_room(c, size);
	p = take_spare(c, size, cap);
	if (p)
		return trim(c, p, size, cap);
	size_t need = cap_for(size);
	if (c->bytes + need > c->budget && (need <= c->budget || c->bytes > 0)) {
		/* (a unit larger than the budget runs when nothing else is held) */
		*err = -EAGAIN;
		return NULL;
	}
	p = buf_alloc(size, cap);
	if (!p) {
		*err = -ENOMEM;
		return NULL;
	}
	c->bytes += *cap;
	atomic_store(&ckpt_g_stats.cache_bytes, c->bytes);
	return p;
}

/* Drop one reference of a FAILED entry (off the table); frees it at 0. */
static void put_failed(ckpt_cache *c, struct ckpt_centry *e)
{
	assert(e->state == FAILED && e->refs > 0);
	if (--e->refs == 0) {
		if (e->data) {
			assert(c->failed_bytes >= e->cap);
			c->failed_bytes -= e->cap;
			give_back(c, e->data, e->cap); /* its bytes stay counted, now as a spare */
			if (c->waiting)
				pthread_cond_broadcast(&c->room);
		}
		free(e);
	}
}

/* Insert a LOADING entry with no buffer yet, pinned once.  Lock held. */
static struct ckpt_centry *insert_loading(ckpt_cache *c, uint64_t owner, uint64_t idx, size_t size)
{
	struct ckpt_centry *e = calloc(1, sizeof(*e));
	if (!e)
		return NULL;
	e->owner = owner;
	e->idx = idx;
	e->size = size;
	e->state = LOADING;
	e->refs = 1;
	size_t b = bucket(c, owner, idx);
	e->hnext = c->table[b];
	c->table[b] = e;
	if (++c->count > c->nbuckets)
		grow_table(c);
	return e;
}

/* Finish a LOADING entry: state, wake the waiters.  Lock held. */
static void publish(ckpt_cache *c, struct ckpt_centry *e, int rc)
{
	assert(e->state == LOADING && e->refs > 0);
	if (rc < 0) {
		e->state = FAILED;
		e->err = rc;
		table_remove(c, e); /* a new attempt may start; waiters hold refs */
		if (e->data)
			c->failed_bytes += e->cap;
	} else {
		assert(e->data && e->cap >= e->size);
		e->state = READY;
	}
	pthread_cond_broadcast(&c->loaded);
}

enum { FILL_READER, FILL_PREFETCH };

/* Fill a LOADING entry this thread has claimed (e->claimed set under the
 * lock), publish it.  On failure the caller's ref is dropped too.  With no
 * room in the budget: a reader holding no pins waits for it (marking the
 * entry starved, so that pin holders waiting for it back off); a reader
 * holding pins gets -EAGAIN and a prefetch -ECANCELED (the entry is then
 * published as cancelled: its waiters load it themselves). */
static int do_fill(ckpt_cache *c, struct ckpt_centry *e, ckpt_cache_fill_fn fill, void *arg, int mode)
{
	ckpt_lock(&c->lock, CKPT_RANK_CACHE);
	assert(e->state == LOADING && e->claimed && !e->data && e->refs > 0);
	int rc = 0;
	for (;;) {
		rc = 0;
		e->data = take_buffer(c, e->size, &e->cap, &rc);
		if (e->data || rc != -EAGAIN || mode == FILL_PREFETCH || held_pins > 0)
			break;
		if (!e->starved) {
			e->starved = 1;
			pthread_cond_broadcast(&c->loaded);
		}
		c->waiting++;
		pthread_cond_wait(&c->room, &c->lock);
		c->waiting--;
	}
	e->starved = 0;
	ckpt_unlock(&c->lock, CKPT_RANK_CACHE);
	if (rc == 0) {
		CKPT_STAT_ADD(cache_misses, 1);
		rc = fill(arg, e->data);
	}
	ckpt_lock(&c->lock, CKPT_RANK_CACHE);
	publish(c, e, rc == -EAGAIN ? -ECANCELED : rc);
	if (rc < 0)
		put_failed(c, e);
	if (rc == -EAGAIN && mode == FILL_PREFETCH)
		rc = -ECANCELED;
	ckpt_unlock(&c->lock, CKPT_RANK_CACHE);
	return rc;
}

static void put_ready(ckpt_cache *c, struct ckpt_centry *e, int consumed);

/* Only large buffers are worth recycling ahead of the LRU order: their
 * first touch is what costs (a huge page zeroed per 2 MiB); small chunks
 * keep plain LRU order, so a re-read still hits. */
static int recyclable(const struct ckpt_centry *e)
{
	return e->cap >= CKPT_HUGEBUF_MIN;
}

/* Drop a ref whatever the entry's state.  Lock held. */
static void put_any(ckpt_cache *c, struct ckpt_centry *e)
{
	assert(e->refs > 0);
	if (e->state == FAILED) {
		put_failed(c, e);
	} else if (e->state == READY) {
		put_ready(c, e, 0);
	} else {
		assert(e->refs > 1); /* a LOADING entry is pinned by whoever fills it */
		e->refs--;
	}
}

int ckpt_cache_fill_reserved(ckpt_cache *c, ckpt_centry *e, ckpt_cache_fill_fn fill, void *arg)
{
	ckpt_lock(&c->lock, CKPT_RANK_CACHE);
	if (e->claimed) {
		/* A reader needed it first and loads (or loaded) it itself. */
		int rc = e->state == FAILED ? e->err : 0;
		put_any(c, e);
		ckpt_unlock(&c->lock, CKPT_RANK_CACHE);
		return rc;
	}
	e->claimed = 1;
	ckpt_unlock(&c->lock, CKPT_RANK_CACHE);
	int rc = do_fill(c, e, fill, arg, FILL_PREFETCH);
	if (rc == 0) {
		ckpt_lock(&c->lock, CKPT_RANK_CACHE);
		put_ready(c, e, 0);
		ckpt_unlock(&c->lock, CKPT_RANK_CACHE);
	}
	return rc;
}

int ckpt_cache_reserve(ckpt_cache *c, uint64_t owner, uint64_t idx, size_t size, ckpt_centry **out)
{
	ckpt_lock(&c->lock, CKPT_RANK_CACHE);
	struct ckpt_centry *e = c->table[bucket(c, owner, idx)];
	while (e && !(e->owner == owner && e->idx == idx))
		e = e->hnext;
	int rc = 0;
	if (!e) {
		*out = insert_loading(c, owner, idx, size);
		rc = *out ? 1 : -ENOMEM;
	}
	ckpt_unlock(&c->lock, CKPT_RANK_CACHE);
	return rc;
}

void ckpt_cache_cancel(ckpt_cache *c, ckpt_centry *e)
{
	ckpt_lock(&c->lock, CKPT_RANK_CACHE);
	if (e->claimed) {
		put_any(c, e); /* a reader is filling (or filled) it */
	} else {
		publish(c, e, -ECANCELED);
		put_failed(c, e);
	}
	ckpt_unlock(&c->lock, CKPT_RANK_CACHE);
}

/* The reader's side of a LOADING entry it holds a reference to, called with
 * c->lock held (released here): claims the entry, fills it without the
 * lock and, filled, hands it out pinned in *out. */
static int claim_and_fill(ckpt_cache *c, struct ckpt_centry *e, ckpt_cache_fill_fn fill, void *arg,
			  ckpt_centry **out)
{
	e->claimed = 1;
	ckpt_unlock(&c->lock, CKPT_RANK_CACHE);
	int rc = do_fill(c, e, fill, arg, FILL_READER);
	if (rc == 0) {
		held_pins++;
		*out = e;
	}
	return rc;
}

int ckpt_cache_get(ckpt_cache *c, uint64_t owner, uint64_t idx, size_t size, ckpt_cache_fill_fn fill,
		   void *arg, ckpt_centry **out)
{
	int joined_failed = 0; /* a load this call waited for failed */
	ckpt_lock(&c->lock, CKPT_RANK_CACHE);
	for (;;) {
		struct ckpt_centry *e = c->table[bucket(c, owner, idx)];
		while (e && !(e->owner == owner && e->idx == idx))
			e = e->hnext;
		if (!e) {
			/* Miss: insert a LOADING entry, then fill without the lock. */
			e = insert_loading(c, owner, idx, size);
			if (!e) {
				ckpt_unlock(&c->lock, CKPT_RANK_CACHE);
				return -ENOMEM;
			}
			return claim_and_fill(c, e, fill, arg, out);
		}
		e->refs++;
		if (e->state == READY) {
			if (e->refs == 1)
				lru_unlink(e);
			e->consumed = 0;
			ckpt_unlock(&c->lock, CKPT_RANK_CACHE);
			CKPT_STAT_ADD(cache_hits, 1);
			held_pins++;
			*out = e;
			return 0;
		}
		if (e->state == LOADING && !e->claimed) {
			/* Reserved by a prefetch still in the queue: load it now
			 * rather than wait behind the queue. */
			return claim_and_fill(c, e, fill, arg, out);
		}
		/* LOADING by another thread: wait (a pin holder not for a filler
		 * that waits for room: those pins may be what it waits for). */
		while (e->state == LOADING) {
			if (held_pins > 0 && e->starved) {
				e->refs--;
				ckpt_unlock(&c->lock, CKPT_RANK_CACHE);
				return -EAGAIN;
			}
			pthread_cond_wait(&c->loaded, &c->lock);
		}
		if (e->state == READY) {
			e->consumed = 0;
			ckpt_unlock(&c->lock, CKPT_RANK_CACHE);
			CKPT_STAT_ADD(cache_hits, 1);
			held_pins++;
			*out = e;
			return 0;
		}
		int err = e->err;
		put_failed(c, e);
		if (err != -ECANCELED && joined_failed++) {
			ckpt_unlock(&c->lock, CKPT_RANK_CACHE);
			return err;
		}
		/* A cancelled prefetch, or a load that began before this call
		 * and failed (a store that has recovered since, say): look again,
		 * and load it ourselves, once. */
	}
}

const void *ckpt_centry_data(const ckpt_centry *e)
{
	return e->data;
}

/* Drop one ref of a READY entry.  Lock held. */
static void put_ready(ckpt_cache *c, struct ckpt_centry *e, int consumed)
{
	assert(e->state == READY && e->refs > 0);
	if (consumed && recyclable(e))
		e->consumed = 1;
	if (--e->refs == 0) {
		if (e->cap > c->budget || e->dropped) {
			/* Larger than the whole budget, or its owner was dropped: never kept. */
			table_remove(c, e);
			assert(c->bytes >= e->cap);
			buf_free(e->data, e->cap);
			c->bytes -= e->cap;
			atomic_store(&ckpt_g_stats.cache_bytes, c->bytes);
			free(e);
			if (c->waiting)
				pthread_cond_broadcast(&c->room);
		} else {
			lru_push(c, e);
			make_room(c, 0);
		}
	}
}

void ckpt_cache_release_used(ckpt_cache *c, ckpt_centry *e, int consumed)
{
	ckpt_lock(&c->lock, CKPT_RANK_CACHE);
	put_ready(c, e, consumed);
	ckpt_unlock(&c->lock, CKPT_RANK_CACHE);
	if (held_pins > 0)
		held_pins--;
}

void ckpt_cache_mark_used(ckpt_cache *c, ckpt_centry *e)
{
	ckpt_lock(&c->lock, CKPT_RANK_CACHE);
	assert(e->state == READY && e->refs > 0);
	if (recyclable(e))
		e->consumed = 1;
	ckpt_unlock(&c->lock, CKPT_RANK_CACHE);
}

void ckpt_cache_release(ckpt_cache *c, ckpt_centry *e)
{
	ckpt_cache_release_used(c, e, 0);
}

int ckpt_cache_contains(ckpt_cache *c, uint64_t owner, uint64_t idx)
{
	ckpt_lock(&c->lock, CKPT_RANK_CACHE);
	struct ckpt_centry *e = c->table[bucket(c, owner, idx)];
	while (e && !(e->owner == owner && e->idx == idx))
		e = e->hnext;
	int r = e && e->state != FAILED;
	ckpt_unlock(&c->lock, CKPT_RANK_CACHE);
	return r;
}

static int owner_listed(const uint64_t *owners, size_t n, uint64_t owner)
{
	size_t lo = 0, hi = n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (owners[mid] == owner)
			return 1;
		if (owners[mid] < owner)
			lo = mid + 1;
		else
			hi = mid;
	}
	return 0;
}

size_t ckpt_cache_cool_owner(ckpt_cache *c, uint64_t owner)
{
	size_t moved = 0;
	ckpt_lock(&c->lock, CKPT_RANK_CACHE);
	for (size_t i = 0; i < c->nbuckets; i++)
		for (struct ckpt_centry *e = c->table[i]; e; e = e->hnext) {
			if (e->owner != owner || e->state != READY || e->refs > 0 || e->consumed ||
			    !recyclable(e))
				continue;
			lru_unlink(e);
			e->consumed = 1;
			lru_push(c, e);
			moved++;
		}
	ckpt_unlock(&c->lock, CKPT_RANK_CACHE);
	return moved;
}

size_t ckpt_cache_drop_owners(ckpt_cache *c, const uint64_t *owners, size_t n)
{
	if (!n)
		return 0;
	size_t dropped = 0;
	ckpt_lock(&c->lock, CKPT_RANK_CACHE);
	for (size_t i = 0; i < c->nbuckets; i++) {
		struct ckpt_centry **pp = &c->table[i];
		while (*pp) {
			struct ckpt_centry *e = *pp;
			if (!owner_listed(owners, n, e->owner)) {
				pp = &e->hnext;
				continue;
			}
			if (e->state != READY || e->refs > 0) {
				e->dropped = 1; /* in use: freed at its last release */
				pp = &e->hnext;
				continue;
			}
			*pp = e->hnext;
			c->count--;
			lru_unlink(e);
			assert(c->bytes >= e->cap);
			buf_free(e->data, e->cap); /* not kept as a spare: the bytes go back */
			c->bytes -= e->cap;
			free(e);
			dropped++;
		}
	}
	atomic_store(&ckpt_g_stats.cache_bytes, c->bytes);
	CKPT_STAT_ADD(cache_evictions, dropped);
	if (dropped && c->waiting)
		pthread_cond_broadcast(&c->room);
	ckpt_unlock(&c->lock, CKPT_RANK_CACHE);
	return dropped;
}

uint64_t ckpt_cache_bytes(ckpt_cache *c)
{
	ckpt_lock(&c->lock, CKPT_RANK_CACHE);
	uint64_t b = c->bytes;
	ckpt_unlock(&c->lock, CKPT_RANK_CACHE);
	return b;
}

void ckpt_cache_destroy(ckpt_cache *c)
{
	if (!c)
		return;
	assert(ckpt_cache_check(c) == 0 && c->failed_bytes == 0);
	for (size_t i = 0; i < c->nbuckets; i++)
		for (struct ckpt_centry *e = c->table[i], *n; e; e = n) {
			assert(e->refs == 0); /* every entry released */
			n = e->hnext;
			buf_free(e->data, e->cap);
			free(e);
		}
	for (int i = 0; i < c->nspare; i++)
		buf_free(c->spare[i].data, c->spare[i].cap);
	free(c->table);
	pthread_mutex_destroy(&c->lock);
	pthread_cond_destroy(&c->loaded);
	pthread_cond_destroy(&c->room);
	free(c);
}

int ckpt_cache_check(ckpt_cache *c)
{
	int bad = 0;
	ckpt_lock(&c->lock, CKPT_RANK_CACHE);
	uint64_t bytes = c->failed_bytes;
	size_t count = 0, idle = 0, lru = 0;
	for (size_t i = 0; i < c->nbuckets; i++)
		for (const struct ckpt_centry *e = c->table[i]; e; e = e->hnext) {
			count++;
			bad |= bucket(c, e->owner, e->idx) != i;
			bad |= e->state != LOADING && e->state != READY;
			bad |= e->state == LOADING && (e->refs == 0 || e->prev || (!e->claimed && e->data));
			bad |= e->state == READY && (!e->data || e->cap < e->size);
			bad |= e->state == READY && (e->refs == 0) != (e->prev != NULL);
			bad |= e->dropped && e->state == READY && e->refs == 0;
			idle += e->state == READY && e->refs == 0;
			if (e->data)
				bytes += e->cap;
		}
	for (const struct ckpt_centry *e = c->lru.next; e != &c->lru && lru <= count; e = e->next)
		lru++;
	int cold = 0; /* consumed entries form the cold end of the LRU */
	for (const struct ckpt_centry *e = c->lru.next; e != &c->lru && lru <= count; e = e->next) {
		bad |= cold && !e->consumed;
		cold |= e->consumed;
	}
	bad |= count != c->count || lru != idle;
	bad |= c->nspare < 0 || c->nspare > NSPARE;
	for (int i = 0; i < c->nspare && i < NSPARE; i++)
		bytes += c->spare[i].cap;
	bad |= bytes != c->bytes;
	ckpt_unlock(&c->lock, CKPT_RANK_CACHE);
	return bad ? -EUCLEAN : 0;
}
