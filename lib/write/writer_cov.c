/* writer_cov.c - distinct-byte coverage of a chunk buffer.
 * Invariant: interval mode holds n sorted, disjoint, non-adjacent [a, b)
 * intervals; bitmap mode has bit i set iff byte i was written. */
#include <stdlib.h>
#include <string.h>

#include "writer_int.h"

/* Set (set != 0) or clear bits [a, b) of bm; returns how many changed. */
static uint64_t bm_change(uint64_t *bm, uint64_t a, uint64_t b, int set)
{
	uint64_t changed = 0;
	while (a < b) {
		uint64_t w = a / 64, bit = a % 64;
		uint64_t n = 64 - bit;
		if (n > b - a)
			n = b - a;
		uint64_t mask = (n == 64 ? ~0ULL : ((1ULL << n) - 1)) << bit;
		uint64_t flip = mask & (set ? ~bm[w] : bm[w]);
		changed += (uint64_t)__builtin_popcountll(flip);
		bm[w] ^= flip;
		a += n;
	}
	return changed;
}

static uint64_t bm_set(uint64_t *bm, uint64_t a, uint64_t b)
{
	return bm_change(bm, a, b, 1);
}

int ckpt_w_cov_to_bitmap(struct wcov *c, uint64_t nbytes)
{
	if (c->bm)
		return 0;
	uint64_t *bm = calloc((nbytes + 63) / 64, 8);
	if (!bm)
		return -ENOMEM;
	for (uint32_t i = 0; i < c->n; i++)
		bm_set(bm, c->iv[i][0], c->iv[i][1]);
	c->bm = bm;
	c->n = 0;
	return 0;
}

int64_t ckpt_w_cov_add(struct wcov *c, uint64_t nbytes, uint64_t a, uint64_t b)
{
	if (a >= b)
		return 0;
	if (c->bm)
		return (int64_t)bm_set(c->bm, a, b);
	uint32_t i = 0, j;
	while (i < c->n && c->iv[i][1] < a)
		i++;
	j = i;
	uint64_t before = 0, lo = a, hi = b;
	while (j < c->n && c->iv[j][0] <= b) {
		uint64_t oa = c->iv[j][0] > a ? c->iv[j][0] : a;
		uint64_t ob = c->iv[j][1] < b ? c->iv[j][1] : b;
		if (ob > oa)
			before += ob - oa;
		if (c->iv[j][0] < lo)
			lo = c->iv[j][0];
		if (c->iv[j][1] > hi)
			hi = c->iv[j][1];
		j++;
	}
	if (j == i) { /* insert at i */
		if (c->n == W_COV_INLINE) {
			int rc = ckpt_w_cov_to_bitmap(c, nbytes);
			if (rc)
				return rc;
			return (int64_t)bm_set(c->bm, a, b);
		}
		memmove(c->iv[i + 1], c->iv[i], (c->n - i) * sizeof(c->iv[0]));
		c->n++;
	} else if (j > i + 1) {
		memmove(c->iv[i + 1], c->iv[j], (c->n - j) * sizeof(c->iv[0]));
		c->n -= j - i - 1;
	}
	c->iv[i][0] = lo;
	c->iv[i][1] = hi;
	return (int64_t)(b - a - before);
}

static uint64_t bm_clear(uint64_t *bm, uint64_t a, uint64_t b)
{
	return bm_change(bm, a, b, 0);
}

int64_t ckpt_w_cov_remove(struct wcov *c, uint64_t nbytes, uint64_t a, uint64_t b)
{
	if (a >= b)
		return 0;
	if (c->bm)
		return (int64_t)bm_clear(c->bm, a, b);
	uint32_t i = 0;
	while (i < c->n && c->iv[i][1] <= a)
		i++;
	if (i == c->n || c->iv[i][0] >= b)
		return 0;
	/* An interval strictly around [a, b) splits in two. */
	if (c->iv[i][0] < a && c->iv[i][1] > b) {
		if (c->n == W_COV_INLINE) {
			int rc = ckpt_w_cov_to_bitmap(c, nbytes);
			if (rc)
				return rc;
			return (int64_t)bm_clear(c->bm, a, b);
		}
		memmove(c->iv[i + 1], c->iv[i], (c->n - i) * sizeof(c->iv[0]));
		c->n++;
		c->iv[i][1] = a;
		c->iv[i + 1][0] = b;
		return (int64_t)(b - a);
	}
	uint64_t removed = 0;
	uint32_t j = i, keep = i;
	for (; j < c->n && c->iv[j][0] < b; j++) {
		uint64_t lo = c->iv[j][0], hi = c->iv[j][1];
		uint64_t oa = lo > a ? lo : a, ob = hi < b ? hi : b;
		removed += ob - oa;
		if (lo < a) { /* keeps its head */
			c->iv[keep][0] = lo;
			c->iv[keep++][1] = a;
		} else if (hi > b) { /* keeps its tail */
			c->iv[keep][0] = b;
			c->iv[keep++][1] = hi;
		}
	}
	memmove(c->iv[keep], c->iv[j], (c->n - j) * sizeof(c->iv[0]));
	c->n -= j - keep;
	return (int64_t)removed;
}

int ckpt_w_cov_each(const struct wcov *c, uint64_t a, uint64_t b,
		    int (*fn)(void *ctx, uint64_t s, uint64_t e), void *ctx)
{
	if (!c->bm) {
		for (uint32_t i = 0; i < c->n && c->iv[i][0] < b; i++) {
			uint64_t s = c->iv[i][0] > a ? c->iv[i][0] : a, e = c->iv[i][1] < b ? c->iv[i][1] : b;
			int rc = s < e ? fn(ctx, s, e) : 0;
			if (rc)
				return rc;
		}
		return 0;
	}
	uint64_t i = a;
	while (i < b) {
		/* the next set bit at or after i */
		uint64_t w = i / 64, word = c->bm[w] & (~0ULL << (i % 64));
		while (!word && ++w * 64 < b)
			word = c->bm[w];
		if (!word)
			return 0;
		uint64_t s = w * 64 + (uint64_t)__builtin_ctzll(word);
		if (s >= b)
			return 0;
		/* the next clear bit after s */
		w = s / 64;
		word = ~c->bm[w] & (~0ULL << (s % 64));
		while (!word && ++w * 64 < b)
			word = ~c->bm[w];
		uint64_t e = word ? w * 64 + (uint64_t)__builtin_ctzll(word) : b;
		if (e > b)
			e = b;
		int rc = fn(ctx, s, e);
		if (rc)
			return rc;
		i = e;
	}
	return 0;
}

void ckpt_w_cov_fill(struct wcov *c, uint64_t nbytes)
{
	free(c->bm);
	c->bm = NULL;
	c->n = 1;
	c->iv[0][0] = 0;
	c->iv[0][1] = nbytes;
}

void ckpt_w_cov_free(struct wcov *c)
{
	free(c->bm);
	c->bm = NULL;
	c->n = 0;
}
