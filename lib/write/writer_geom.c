/* writer_geom.c - chunk and shard shapes, and how a byte range of a
 * region's stream maps onto chunk buffers. */
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

int w_geom_init(struct ckpt_warray *a, uint64_t chunk_bytes, uint64_t shard_bytes)
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
	a->bm_bytes = (a->chunk_nbytes + 63) / 64 * 8;
	a->live_cost = a->chunk_nbytes + a->bm_bytes;
	return 0;
}

int w_region_check(const struct ckpt_warray *a, const ckpt_region *region, ckpt_region *out, uint64_t *nbytes)
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

uint64_t w_chunk_need(const struct ckpt_warray *a, uint64_t idx)
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

void w_chunk_coords(const struct ckpt_warray *a, uint64_t idx, uint64_t *cg)
{
	for (int d = a->rank - 1; d >= 0; d--) {
		cg[d] = idx % a->nch[d];
		idx /= a->nch[d];
	}
}

uint64_t w_chunk_shard(const struct ckpt_warray *a, uint64_t idx)
{
	uint64_t cg[CKPT_MAX_RANK], s = 0;
	w_chunk_coords(a, idx, cg);
	for (int d = 0; d < a->rank; d++)
		s = s * a->nsh[d] + cg[d] / a->mps[d];
	return s;
}

/* Byte offset in its chunk buffer, and chunk, of the element at global
 * coordinates g. */
static void elem_locate(const struct ckpt_warray *a, const uint64_t *g, struct wpiece *p, uint64_t *coff)
{
	uint64_t lin = 0, off = 0;
	for (int d = 0; d < a->rank; d++) {
		uint64_t c = g[d] / a->inner[d];
		p->cg[d] = c;
		lin = lin * a->nch[d] + c;
		off = off * a->inner[d] + (g[d] - c * a->inner[d]);
	}
	p->chunk = lin;
	*coff = off * a->isz;
}

/* Global coordinates of stream element e of region r. */
static void unravel(const ckpt_region *r, uint64_t e, uint64_t *g)
{
	for (int d = r->rank - 1; d >= 0; d--) {
		uint64_t ext = r->stop[d] - r->start[d];
		g[d] = r->start[d] + e % ext;
		e /= ext;
	}
}

/* A partial element: bytes [lo, hi) of stream element e. */
static int single_elem(const struct ckpt_warray *a, const ckpt_region *r, uint64_t e, uint64_t lo,
		       uint64_t hi, uint64_t soff, w_piece_fn fn, void *ctx)
{
	struct wpiece p;
	uint64_t g[CKPT_MAX_RANK], coff;
	unravel(r, e, g);
	elem_locate(a, g, &p, &coff);
	p.single = 1;
	p.s_coff = coff + lo;
	p.s_soff = soff;
	p.s_n = hi - lo;
	return fn(ctx, &p);
}

/* All chunks meeting the box [bst, bsp) whose first element is at data
 * offset base. */
static int box_pieces(const struct ckpt_warray *a, const uint64_t *bst, const uint64_t *bsp, uint64_t base,
		      w_piece_fn fn, void *ctx)
{
	int n = a->rank;
	struct wpiece p;
	uint64_t lo[CKPT_MAX_RANK], hi[CKPT_MAX_RANK];
	p.single = 0;
	p.base = base;
	uint64_t st = 1;
	for (int d = n - 1; d >= 0; d--) {
		p.bst[d] = bst[d];
		p.bstride[d] = st;
		st *= bsp[d] - bst[d];
		lo[d] = bst[d] / a->inner[d];
		hi[d] = (bsp[d] - 1) / a->inner[d];
		p.cg[d] = lo[d];
	}
	for (;;) {
		uint64_t lin = 0;
		for (int d = 0; d < n; d++) {
			uint64_t c0 = p.cg[d] * a->inner[d], c1 = c0 + a->inner[d];
			p.ist[d] = bst[d] > c0 ? bst[d] : c0;
			p.isp[d] = bsp[d] < c1 ? bsp[d] : c1;
			lin = lin * a->nch[d] + p.cg[d];
		}
		p.chunk = lin;
		int rc = fn(ctx, &p);
		if (rc)
			return rc;
		int d = n - 1;
		while (d >= 0 && p.cg[d] == hi[d]) {
			p.cg[d] = lo[d];
			d--;
		}
		if (d < 0)
			return 0;
		p.cg[d]++;
	}
}

int w_pieces(const struct ckpt_warray *a, const ckpt_region *r, uint64_t b0, uint64_t b1, w_piece_fn fn,
	     void *ctx)
{
	uint64_t s = a->isz, orig = b0;
	int rc;
	if (b0 >= b1)
		return 0;
	if (b0 % s) { /* head: part of one element */
		uint64_t e = b0 / s, lo = b0 % s, hi = (b1 - e * s) < s ? b1 - e * s : s;
		rc = single_elem(a, r, e, lo, hi, 0, fn, ctx);
		if (rc)
			return rc;
		b0 = e * s + hi;
	}
	uint64_t E0 = b0 / s, E1 = b1 / s;
	if (b0 < b1 && E1 > E0) {
		int n = r->rank;
		if (n == 0) {
			struct wpiece p;
			memset(&p, 0, sizeof(p));
			p.single = 1;
			p.s_coff = 0;
			p.s_soff = b0 - orig;
			p.s_n = s;
			rc = fn(ctx, &p);
			if (rc)
				return rc;
		} else {
			/* Cut [E0, E1) into at most 2*rank boxes. */
			uint64_t ext[CKPT_MAX_RANK], B[CKPT_MAX_RANK + 1];
			for (int d = 0; d < n; d++)
				ext[d] = r->stop[d] - r->start[d];
			B[0] = 1;
			for (int j = 1; j <= n; j++)
				B[j] = B[j - 1] * ext[n - j];
			uint64_t p = E0;
			while (p < E1) {
				uint64_t idx[CKPT_MAX_RANK], q = p;
				for (int d = n - 1; d >= 0; d--) {
					idx[d] = q % ext[d];
					q /= ext[d];
				}
				int j = n - 1;
				while (j > 0 && p % B[j])
					j--;
				uint64_t m;
				for (;;) {
					int k = n - 1 - j;
					m = ext[k] - idx[k];
					if ((E1 - p) / B[j] < m)
						m = (E1 - p) / B[j];
					if (m > 0 || j == 0)
						break;
					j--;
				}
				int k = n - 1 - j;
				uint64_t bst[CKPT_MAX_RANK], bsp[CKPT_MAX_RANK];
				for (int d = 0; d < n; d++) {
					if (d < k) {
						bst[d] = r->start[d] + idx[d];
						bsp[d] = bst[d] + 1;
					} else if (d == k) {
						bst[d] = r->start[d] + idx[d];
						bsp[d] = bst[d] + m;
					} else {
						bst[d] = r->start[d];
						bsp[d] = r->stop[d];
					}
				}
				rc = box_pieces(a, bst, bsp, p * s - orig, fn, ctx);
				if (rc)
					return rc;
				p += m * B[j];
			}
		}
		b0 = E1 * s;
	}
	if (b0 < b1) /* tail: first bytes of one element */
		return single_elem(a, r, b0 / s, 0, b1 - b0, b0 - orig, fn, ctx);
	return 0;
}

void w_piece_spans(const struct ckpt_warray *a, const struct wpiece *p, w_span_fn fn, void *ctx)
{
	if (p->single) {
		fn(ctx, p->s_coff, p->s_soff, p->s_n);
		return;
	}
	int n = a->rank;
	uint64_t s = a->isz, cst[CKPT_MAX_RANK], i[CKPT_MAX_RANK], st = 1;
	for (int d = n - 1; d >= 0; d--) {
		cst[d] = st;
		st *= a->inner[d];
		i[d] = p->ist[d];
	}
	uint64_t run = (p->isp[n - 1] - p->ist[n - 1]) * s;
	uint64_t pc = 0, ps = 0, pn = 0; /* pending coalesced span */
	for (;;) {
		uint64_t co = 0, so = 0;
		for (int d = 0; d < n; d++) {
			co += (i[d] - p->cg[d] * a->inner[d]) * cst[d];
			so += (i[d] - p->bst[d]) * p->bstride[d];
		}
		co *= s;
		so = p->base + so * s;
		if (pn && pc + pn == co && ps + pn == so) {
			pn += run;
		} else {
			if (pn)
				fn(ctx, pc, ps, pn);
			pc = co;
			ps = so;
			pn = run;
		}
		int d = n - 2;
		while (d >= 0 && i[d] + 1 == p->isp[d]) {
			i[d] = p->ist[d];
			d--;
		}
		if (d < 0)
			break;
		i[d]++;
	}
	if (pn)
		fn(ctx, pc, ps, pn);
}
