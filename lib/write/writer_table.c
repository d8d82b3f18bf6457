/* writer_table.c - the sparse chunk and shard tables of a pending array.
 *
 * An array may declare up to W_MAX_CHUNKS inner chunks; a writer usually
 * touches all of them, but a declaration alone (a header written, a host
 * that writes a share) must not pay for every chunk.  Both tables are two
 * levels: a directory of page pointers, allocated on the first touch, and
 * pages of W_CPAGE chunks / W_SPAGE shards, allocated on the first touch of
 * one of their entries (the last page only as long as the array needs).
 * An entry that is not allocated is an EMPTY chunk / a shard none of whose
 * chunks was written: `unstored` is then the number of its in-bounds
 * chunks (ckpt_w_shard_nchunks), which a fresh shard entry starts with.
 *
 * Pages are never freed before the array (ckpt_w_tab_free), so a pointer to an
 * entry stays valid.  Directory and page pointers are published with
 * release stores under array->mu and read with acquire loads, so lookups
 * need no lock; the entries themselves keep their own locking rules.
 * A leaf: calls only writer_geom.c and base/. */
#include <stdlib.h>

#include "writer_int.h"

static uint64_t ndir(uint64_t n, unsigned shift)
{
	return (n + ((uint64_t)1 << shift) - 1) >> shift;
}

struct wchunk *ckpt_w_chunk_at(const struct ckpt_warray *a, uint64_t idx)
{
	assert(idx < a->nchunks);
	w_chunk_page *dir = atomic_load_explicit(&a->cdir, memory_order_acquire);
	if (!dir)
		return NULL;
	struct wchunk *pg = atomic_load_explicit(&dir[idx >> W_CPAGE_SHIFT], memory_order_acquire);
	return pg ? &pg[idx & (W_CPAGE - 1)] : NULL;
}

struct wshard *ckpt_w_shard_at(const struct ckpt_warray *a, uint64_t sidx)
{
	assert(sidx < a->nshards);
	w_shard_page *dir = atomic_load_explicit(&a->sdir, memory_order_acquire);
	if (!dir)
		return NULL;
	struct wshard *pg = atomic_load_explicit(&dir[sidx >> W_SPAGE_SHIFT], memory_order_acquire);
	return pg ? &pg[sidx & (W_SPAGE - 1)] : NULL;
}

uint64_t ckpt_w_chunk_next(const struct ckpt_warray *a, uint64_t idx)
{
	w_chunk_page *dir = atomic_load_explicit(&a->cdir, memory_order_acquire);
	if (!dir)
		return a->nchunks;
	while (idx < a->nchunks) {
		if (atomic_load_explicit(&dir[idx >> W_CPAGE_SHIFT], memory_order_acquire))
			return idx;
		idx = ((idx >> W_CPAGE_SHIFT) + 1) << W_CPAGE_SHIFT;
	}
	return a->nchunks;
}

uint64_t ckpt_w_shard_next(const struct ckpt_warray *a, uint64_t sidx)
{
	w_shard_page *dir = atomic_load_explicit(&a->sdir, memory_order_acquire);
	if (!dir)
		return a->nshards;
	while (sidx < a->nshards) {
		if (atomic_load_explicit(&dir[sidx >> W_SPAGE_SHIFT], memory_order_acquire))
			return sidx;
		sidx = ((sidx >> W_SPAGE_SHIFT) + 1) << W_SPAGE_SHIFT;
	}
	return a->nshards;
}

uint64_t ckpt_w_shard_nchunks(const struct ckpt_warray *a, uint64_t sidx)
{
	uint64_t n = 1;
	for (int d = a->rank - 1; d >= 0; d--) {
		uint64_t g = sidx % a->nsh[d], lo = g * a->mps[d];
		sidx /= a->nsh[d];
		uint64_t hi = lo + a->mps[d] < a->nch[d] ? lo + a->mps[d] : a->nch[d];
		n *= hi - lo;
	}
	return n;
}

uint64_t ckpt_w_shard_entry_chunk(const struct ckpt_warray *a, uint64_t sidx, uint64_t e)
{
	uint64_t sg[CKPT_MAX_RANK], l[CKPT_MAX_RANK];
	for (int d = a->rank - 1; d >= 0; d--) {
		sg[d] = sidx % a->nsh[d];
		sidx /= a->nsh[d];
		l[d] = e % a->mps[d];
		e /= a->mps[d];
	}
	uint64_t lin = 0;
	for (int d = 0; d < a->rank; d++) {
		uint64_t g = sg[d] * a->mps[d] + l[d];
		if (g >= a->nch[d])
			return UINT64_MAX;
		lin = lin * a->nch[d] + g;
	}
	return lin;
}

struct wshard *ckpt_w_shard_touch(struct ckpt_warray *a, uint64_t sidx)
{
	struct wshard *sh = ckpt_w_shard_at(a, sidx);
	if (sh)
		return sh;
	w_shard_page *dir = atomic_load_explicit(&a->sdir, memory_order_relaxed);
	if (!dir) {
		dir = calloc(ndir(a->nshards, W_SPAGE_SHIFT), sizeof(*dir));
		if (!dir)
			return NULL;
		atomic_store_explicit(&a->sdir, dir, memory_order_release);
	}
	uint64_t p = sidx >> W_SPAGE_SHIFT, base = p << W_SPAGE_SHIFT;
	uint64_t n = a->nshards - base < W_SPAGE ? a->nshards - base : W_SPAGE;
	struct wshard *pg = calloc(n, sizeof(*pg));
	if (!pg)
		return NULL;
	for (uint64_t i = 0; i < n; i++) {
		pthread_mutex_init(&pg[i].mu, NULL);
		pg[i].unstored = ckpt_w_shard_nchunks(a, base + i);
	}
	atomic_store_explicit(&dir[p], pg, memory_order_release);
	return &pg[sidx - base];
}

struct wchunk *ckpt_w_chunk_touch(struct ckpt_warray *a, uint64_t idx)
{
	struct wchunk *c = ckpt_w_chunk_at(a, idx);
	if (c)
		return c;
	/* Its shard first: every chunk that is not EMPTY has a shard entry. */
	if (!ckpt_w_shard_touch(a, ckpt_w_chunk_shard(a, idx)))
		return NULL;
	w_chunk_page *dir = atomic_load_explicit(&a->cdir, memory_order_relaxed);
	if (!dir) {
		dir = calloc(ndir(a->nchunks, W_CPAGE_SHIFT), sizeof(*dir));
		if (!dir)
			return NULL;
		atomic_store_explicit(&a->cdir, dir, memory_order_release);
	}
	uint64_t p = idx >> W_CPAGE_SHIFT, base = p << W_CPAGE_SHIFT;
	uint64_t n = a->nchunks - base < W_CPAGE ? a->nchunks - base : W_CPAGE;
	struct wchunk *pg = calloc(n, sizeof(*pg));
	if (!pg)
		return NULL;
	atomic_store_explicit(&dir[p], pg, memory_order_release);
	return &pg[idx - base];
}

uint64_t ckpt_w_tab_bytes(const struct ckpt_warray *a)
{
	uint64_t n = 0;
	w_chunk_page *cd = atomic_load_explicit(&a->cdir, memory_order_acquire);
	w_shard_page *sd = atomic_load_explicit(&a->sdir, memory_order_acquire);
	if (cd) {
		n += ndir(a->nchunks, W_CPAGE_SHIFT) * sizeof(*cd);
		for (uint64_t i = ckpt_w_chunk_next(a, 0); i < a->nchunks;
		     i = ckpt_w_chunk_next(a, i + W_CPAGE))
			n += W_CPAGE * sizeof(struct wchunk);
	}
	if (sd) {
		n += ndir(a->nshards, W_SPAGE_SHIFT) * sizeof(*sd);
		for (uint64_t i = ckpt_w_shard_next(a, 0); i < a->nshards;
		     i = ckpt_w_shard_next(a, i + W_SPAGE))
			n += W_SPAGE * sizeof(struct wshard);
	}
	return n;
}

void ckpt_w_tab_free(struct ckpt_warray *a)
{
	w_chunk_page *cd = atomic_load_explicit(&a->cdir, memory_order_relaxed);
	w_shard_page *sd = atomic_load_explicit(&a->sdir, memory_order_relaxed);
	if (cd) {
		for (uint64_t p = 0; p < ndir(a->nchunks, W_CPAGE_SHIFT); p++)
			free(atomic_load_explicit(&cd[p], memory_order_relaxed));
		free(cd);
	}
	if (sd) {
		for (uint64_t p = 0; p < ndir(a->nshards, W_SPAGE_SHIFT); p++) {
			struct wshard *pg = atomic_load_explicit(&sd[p], memory_order_relaxed);
			uint64_t base = p << W_SPAGE_SHIFT;
			uint64_t n = a->nshards - base < W_SPAGE ? a->nshards - base : W_SPAGE;
			for (uint64_t i = 0; pg && i < n; i++)
				pthread_mutex_destroy(&pg[i].mu);
			free(pg);
		}
		free(sd);
	}
	atomic_store_explicit(&a->cdir, NULL, memory_order_relaxed);
	atomic_store_explicit(&a->sdir, NULL, memory_order_relaxed);
}
