/*
 * cache.h - the decoded-chunk cache: entries keyed by (owner, index), a byte
 * budget with LRU eviction, and single-flight loading (when several threads
 * miss on the same chunk, one decodes and the others wait for it).
 *
 * Buffers of evicted entries are reused for new entries of the same size,
 * so a steady-state reader allocates no fresh memory per chunk.
 *
 * Thread-safety: all functions are thread-safe.  One internal mutex; the
 * fill callback runs without it held.
 */
#ifndef CKPT_CACHE_H
#define CKPT_CACHE_H

#include <stddef.h>
#include <stdint.h>

typedef struct ckpt_cache ckpt_cache;
typedef struct ckpt_centry ckpt_centry;

/* Fill dst (size bytes) with the chunk's decoded bytes; 0 or -errno. */
typedef int (*ckpt_cache_fill_fn)(void *arg, void *dst);

/* The largest decode unit a reader decodes whole into the cache, for a
 * budget of b bytes: a quarter of it, so that a few such units and the
 * read-ahead fit.  Larger units are read as streams (stream.h) when their
 * encoding allows it (raw, or one zstd frame, not sharded); the others
 * (gzip, blosc, lz4, bz2, F order, big-endian) are still decoded whole, one
 * at a time when larger than the budget (see ckpt_cache_get). */
#define CKPT_CACHE_UNIT_CAP(b) ((b) / 4)

int ckpt_cache_create(uint64_t budget_bytes, ckpt_cache **out);
uint64_t ckpt_cache_budget(const ckpt_cache *c);
/* The bytes of the budget a chunk of `size` bytes takes (its buffer's
 * capacity: large buffers are rounded up to 2 MiB). */
size_t ckpt_cache_charge(size_t size);
/* All entries must have been released. */
void ckpt_cache_destroy(ckpt_cache *c);

/* Return a pinned entry for (owner, idx) in *out.  On a miss, takes a
 * `size`-byte buffer and calls fill(arg, buf) once across all threads;
 * others wait.  A failed fill is not cached: its error is returned to the
 * loader; a waiter of that attempt (which began before the waiter asked)
 * calls its own fill once, and returns that one's result (a store that
 * recovered meanwhile serves it).  Pinned entries are never evicted.
 *
 * Budget: buffers of pinned entries and of decodes in flight count against
 * the budget, and are never taken beyond it: a miss that finds no room
 * waits until pins are released.  A thread that already holds pins (taken
 * with ckpt_cache_get on this thread and not yet released) does not wait:
 * it gets -EAGAIN, and must release its pins before it asks again.  One
 * unit larger than the whole budget (readers stream units over
 * CKPT_CACHE_UNIT_CAP where they can) is decoded only while nothing else
 * is held, so the cache's memory never exceeds max(budget, that unit); it
 * is freed at its last release. */
int ckpt_cache_get(ckpt_cache *c, uint64_t owner, uint64_t idx, size_t size, ckpt_cache_fill_fn fill,
		   void *arg, ckpt_centry **out);

/* Prefetch without duplicates: reserve (owner, idx) now, fill it later on
 * a worker.  Returns 1 and a pinned LOADING entry in *out when it was
 * absent (readers that need it meanwhile wait for the fill), 0 when it is
 * cached or being loaded already, -ENOMEM.  A reservation must end with
 * ckpt_cache_fill_reserved (fills it unless a reader already took it over,
 * then unpins it; returns the fill's result) or ckpt_cache_cancel.  A
 * reader that needs a reserved chunk before its fill started loads it
 * itself instead of waiting behind the queue.  The buffer is taken at
 * fill time, so reservations hold no memory. */
int ckpt_cache_reserve(ckpt_cache *c, uint64_t owner, uint64_t idx, size_t size, ckpt_centry **out);
int ckpt_cache_fill_reserved(ckpt_cache *c, ckpt_centry *e, ckpt_cache_fill_fn fill, void *arg);
void ckpt_cache_cancel(ckpt_cache *c, ckpt_centry *e);

/* The decoded bytes of a pinned entry. */
const void *ckpt_centry_data(const ckpt_centry *e);

/* Unpin an entry returned by ckpt_cache_get. */
void ckpt_cache_release(ckpt_cache *c, ckpt_centry *e);

/* ckpt_cache_release, saying whether the caller is done with the chunk
 * (consumed: a sequential reader read its last byte).  A consumed chunk of
 * 2 MiB or more (CKPT_HUGEBUF_MIN; smaller ones keep LRU order) leaves
 * first, and its buffer is reused for the next decode before any fresh
 * memory is taken, so a streaming reader cycles through a few pre-faulted
 * buffers whatever the budget.  A later hit clears the mark. */
void ckpt_cache_release_used(ckpt_cache *c, ckpt_centry *e, int consumed);

/* Mark a pinned entry consumed now (it is treated so at its last release
 * unless a hit takes it again before). */
void ckpt_cache_mark_used(ckpt_cache *c, ckpt_centry *e);

/* 1 if (owner, idx) is cached or being loaded, else 0.  Never blocks on a load. */
int ckpt_cache_contains(ckpt_cache *c, uint64_t owner, uint64_t idx);

/* Move the idle entries of owner to the cold end of the LRU, as consumed
 * (evicted first, their buffers reused first): its reader is done with
 * them, though another reader may still hit them.  Entries of owner that
 * are pinned, loading or too small to recycle stay where they are.
 * Returns how many moved. */
size_t ckpt_cache_cool_owner(ckpt_cache *c, uint64_t owner);
/* Drop every entry of the listed owners (owners sorted ascending, n of
 * them), e.g. the arrays of a step that was deleted: idle entries at once,
 * their buffers freed (not kept for reuse), so ckpt_cache_bytes goes down;
 * entries pinned or being loaded are freed at their last release (until
 * then a get of them shares them, as before).  Meant for owners nobody
 * asks for again.  Counted as evictions.  Returns the number of entries
 * freed now. */
size_t ckpt_cache_drop_owners(ckpt_cache *c, const uint64_t *owners, size_t n);

/* Bytes currently held (cached + pinned + reusable spare buffers). */
uint64_t ckpt_cache_bytes(ckpt_cache *c);

/* Verify every invariant of the cache (entry states, pins, the LRU list,
 * the table count, the byte accounting) under its lock: 0, or -EUCLEAN
 * when one is broken.  O(entries); for tests and debugging. */
int ckpt_cache_check(ckpt_cache *c);

#endif
