/* writer_geom.c - chunk and shard shapes of a pending array, and chunk
 * coordinates.  How a byte range of a region's stream maps onto chunk
 * buffers is format/slice.c's ckpt_stream_pieces, on a->grid. */
#include <stdio.h>
#include <string.h>

#include "writer_int.h"

/* Largest k <= kmax that divides n, if one is >= kmax/2 within a bounded
 * search; else kmax (the edge chunk is then padded). */
static uint64_t pick_divisor(uint64_t n, uint64_t kmax)
{
	if (kmax >= n)
		return n;
	if (kmax <= 1)
		return 1;
	uint64_t lo = kmax / 2, tries = 0;
	for (uint64_t k = kmax; k > lo && tries < 65536; k--, tries++)
		if (n % k == 0)
			return k;
	return kmax;
}

int ckpt_w_geom_init(struct ckpt_warray *a, uint64_t chunk_bytes, uint64_t shard_bytes)
{
	int r = a->rank;
	uint64_t isz = a->isz, bytes = isz, nb = isz;

	for (int d = 0; d < r; d++) {
		a->inner[d] = a->shape[d] ? a->shape[d] : 1;
		if (ckpt_mul_u64(nb, a->shape[d], &nb) || nb > ((uint64_t)1 << 62))
			return -EFBIG;
	}
	a->nbytes = nb;
	/* The first chunk candidate is the whole array with 0-extents as 1. */
	for (int d = 0; d < r; d++)
		if (ckpt_mul_u64(bytes, a->inner[d], &bytes) || bytes > ((uint64_t)1 << 62))
			return -EFBIG;
	if (chunk_bytes < isz)
		chunk_bytes = isz;
	/* Split leading dims first (Orbax's choose_chunk_shape spirit). */
	for (int d = 0; d < r && bytes > chunk_bytes; d++) {
		uint64_t rest = bytes / a->inner[d]; /* bytes of one slice along d */
		if (rest >= chunk_bytes) {
			a->inner[d] = 1;
			bytes = rest;
			continue;
		}
		uint64_t k = pick_divisor(a->shape[d], chunk_bytes / rest);
		a->inner[d] = k;
		bytes = rest * k;
	}
	a->chunk_nbytes = bytes;
	a->nchunks = 1;
	for (int d = 0; d < r; d++) {
		a->nch[d] = a->shape[d] ? (a->shape[d] - 1) / a->inner[d] + 1 : 0;
		if (ckpt_mul_u64(a->nchunks, a->nch[d], &a->nchunks))
			return -EFBIG;
	}
	if (a->nchunks > W_MAX_CHUNKS)
		return -EFBIG;

	/* Shards: whole inner chunks, trailing dims first, up to shard_bytes
	 * and at most 65536 inner chunks (a 1 MiB index). */
	uint64_t per = shard_bytes / a->chunk_nbytes;
	if (per < 1)
		per = 1;
	if (per > 65536)
		per = 65536;
	a->nshards = 1;
	for (int d = r - 1; d >= 0; d--) {
		uint64_t n = a->nch[d] ? a->nch[d] : 1;
		uint64_t m = pick_divisor(n, per < n ? per : n);
		a->mps[d] = m;
		per /= m;
		if (per < 1)
			per = 1;
		a->shard[d] = a->inner[d] * m;
		a->nsh[d] = a->nch[d] ? (a->nch[d] - 1) / m + 1 : 0;
		a->nshards *= a->nsh[d];
	}
	a->grid.rank = r;
	a->grid.itemsize = isz;
	a->grid.chunk_shape = a->inner;
	a->grid.grid = a->nch;
	a->bm_bytes = (a->chunk_nbytes + 63) / 64 * 8;
	a->live_cost = a->chunk_nbytes + a->bm_bytes;
	return 0;
}

int ckpt_w_region_check(const struct ckpt_warray *a, const ckpt_region *region, ckpt_region *out,
			uint64_t *nbytes)
{
	if (!region) {
		ckpt_region_full(out, a->rank, a->shape);
	} else {
		if (region->rank != a->rank)
			return -EINVAL;
		for (int d = 0; d < a->rank; d++)
			if (region->start[d] >= region->stop[d] || region->stop[d] > a->shape[d])
				return -EINVAL;
		*out = *region;
	}
	uint64_t n = a->isz;
	for (int d = 0; d < a->rank; d++)
		n *= out->stop[d] - out->start[d]; /* <= nbytes of the array: no overflow */
	*nbytes = n;
	return 0;
}

uint64_t ckpt_w_chunk_need(const struct ckpt_warray *a, uint64_t idx)
{
	uint64_t need = a->isz;
	for (int d = a->rank - 1; d >= 0; d--) {
		uint64_t g = idx % a->nch[d];
		idx /= a->nch[d];
		uint64_t lo = g * a->inner[d], hi = lo + a->inner[d];
		if (hi > a->shape[d])
			hi = a->shape[d];
		need *= hi - lo;
	}
	return need;
}

void ckpt_w_chunk_coords(const struct ckpt_warray *a, uint64_t idx, uint64_t *cg)
{
	for (int d = a->rank - 1; d >= 0; d--) {
		cg[d] = idx % a->nch[d];
		idx /= a->nch[d];
	}
}

uint64_t ckpt_w_chunk_shard(const struct ckpt_warray *a, uint64_t idx)
{
	uint64_t cg[CKPT_MAX_RANK], s = 0;
	ckpt_w_chunk_coords(a, idx, cg);
	for (int d = 0; d < a->rank; d++)
		s = s * a->nsh[d] + cg[d] / a->mps[d];
	return s;
}

void ckpt_w_chunk_region(const struct ckpt_warray *a, uint64_t idx, ckpt_region *r)
{
	uint64_t cg[CKPT_MAX_RANK];
	ckpt_w_chunk_coords(a, idx, cg);
	r->rank = a->rank;
	for (int d = 0; d < a->rank; d++) {
		r->start[d] = cg[d] * a->inner[d];
		r->stop[d] = r->start[d] + a->inner[d];
		if (r->stop[d] > a->shape[d])
			r->stop[d] = a->shape[d];
	}
}
