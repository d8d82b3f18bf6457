/* test_slice_pieces.c - ckpt_stream_pieces / ckpt_stream_piece_spans
 * (format/slice.h): a byte range of a region's stream over a chunk grid,
 * checked byte by byte against a direct model, and against
 * ckpt_copy_stream_to_chunk for whole elements. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "slice.h"

static uint64_t rng = 88172645463325252ULL;
static uint64_t rnd(void)
{
	return check_rnd(&rng);
}
static uint64_t rnd_below(uint64_t n)
{
	return n ? rnd() % n : 0;
}

struct setup {
	int rank;
	size_t isz;
	uint64_t shape[CKPT_MAX_RANK], cs[CKPT_MAX_RANK], grid[CKPT_MAX_RANK];
	uint64_t nchunks, chunk_bytes;
	ckpt_chunk_grid g;
	ckpt_region r;
	uint64_t rbytes;
};

static void random_setup(struct setup *s)
{
	memset(s, 0, sizeof(*s));
	s->rank = (int)rnd_below(5);
	static const size_t sizes[] = { 1, 2, 4, 8, 3 };
	s->isz = sizes[rnd_below(5)];
	s->nchunks = 1;
	s->chunk_bytes = s->isz;
	s->r.rank = s->rank;
	uint64_t count = 1;
	for (int d = 0; d < s->rank; d++) {
		s->shape[d] = rnd_below(9) + 1;
		s->cs[d] = rnd_below(s->shape[d] + 2) + 1; /* may exceed the extent */
		s->grid[d] = (s->shape[d] + s->cs[d] - 1) / s->cs[d];
		s->nchunks *= s->grid[d];
		s->chunk_bytes *= s->cs[d];
		uint64_t a = rnd_below(s->shape[d]), b = rnd_below(s->shape[d]);
		if (a > b) {
			uint64_t t = a;
			a = b;
			b = t;
		}
		s->r.start[d] = a;
		s->r.stop[d] = b + 1;
		count *= b + 1 - a;
	}
	s->rbytes = count * s->isz;
	s->g.rank = s->rank;
	s->g.itemsize = s->isz;
	s->g.chunk_shape = s->cs;
	s->g.grid = s->grid;
}

/* Chunk and byte offset in it of stream byte b of the region (the model). */
static void model(const struct setup *s, uint64_t b, uint64_t *chunk, uint64_t *coff)
{
	uint64_t e = b / s->isz, gc[CKPT_MAX_RANK];
	for (int d = s->rank - 1; d >= 0; d--) {
		uint64_t ext = s->r.stop[d] - s->r.start[d];
		gc[d] = s->r.start[d] + e % ext;
		e /= ext;
	}
	uint64_t lin = 0, off = 0;
	for (int d = 0; d < s->rank; d++) {
		lin = lin * s->grid[d] + gc[d] / s->cs[d];
		off = off * s->cs[d] + gc[d] % s->cs[d];
	}
	*chunk = lin;
	*coff = off * s->isz + b % s->isz;
}

struct walk {
	const struct setup *s;
	uint64_t b0;
	uint8_t *seen; /* per data byte */
	uint64_t *pieces_of; /* per chunk */
	const ckpt_stream_piece *p;
	uint64_t piece_bytes;
	int bad;
	uint8_t **chunks; /* optional: fill chunk buffers from src */
	const uint8_t *src;
};

static void on_span(void *ctx, uint64_t coff, uint64_t doff, uint64_t n)
{
	struct walk *w = ctx;
	w->piece_bytes += n;
	for (uint64_t k = 0; k < n; k++) {
		uint64_t ch, co;
		model(w->s, w->b0 + doff + k, &ch, &co);
		if (ch != w->p->chunk || co != coff + k)
			w->bad = 1;
		w->seen[doff + k]++;
	}
	if (w->chunks)
		memcpy(w->chunks[w->p->chunk] + coff, w->src + doff, n);
}

static int on_piece(void *ctx, const ckpt_stream_piece *p)
{
	struct walk *w = ctx;
	const struct setup *s = w->s;
	uint64_t lin = 0;
	for (int d = 0; d < s->rank; d++) {
		if (p->cg[d] >= s->grid[d])
			w->bad = 1;
		lin = lin * s->grid[d] + p->cg[d];
	}
	if (lin != p->chunk || p->chunk >= s->nchunks) {
		w->bad = 1;
		return 0;
	}
	w->pieces_of[p->chunk]++;
	w->p = p;
	w->piece_bytes = 0;
	ckpt_stream_piece_spans(&s->g, p, on_span, w);
	if (w->piece_bytes == 0) /* a piece never names a chunk it does not touch */
		w->bad = 1;
	return 0;
}

static void test_random_ranges(void)
{
	for (int iter = 0; iter < 3000; iter++) {
		struct setup s;
		random_setup(&s);
		uint64_t b0 = rnd_below(s.rbytes), b1 = b0 + 1 + rnd_below(s.rbytes - b0);
		if (rnd() % 4 == 0) {
			b0 = 0;
			b1 = s.rbytes;
		}
		struct walk w = { .s = &s, .b0 = b0 };
		w.seen = calloc(b1 - b0, 1);
		w.pieces_of = calloc(s.nchunks, sizeof(uint64_t));
		CHECK_EQ_INT(ckpt_stream_pieces(&s.g, &s.r, b0, b1, on_piece, &w), 0);
		CHECK(!w.bad);
		int once = 1;
		for (uint64_t i = 0; i < b1 - b0; i++)
			once &= w.seen[i] == 1;
		CHECK(once);
		int bounded = 1;
		for (uint64_t c = 0; c < s.nchunks; c++)
			bounded &= w.pieces_of[c] <= (uint64_t)(2 * s.rank + 2);
		CHECK(bounded);
		free(w.seen);
		free(w.pieces_of);
	}
}

/* Whole elements: the chunks the pieces fill equal what
 * ckpt_copy_stream_to_chunk writes into each chunk of the grid. */
static void test_against_copy(void)
{
	for (int iter = 0; iter < 1000; iter++) {
		struct setup s;
		random_setup(&s);
		uint64_t n = s.rbytes / s.isz;
		uint64_t e0 = rnd_below(n), e1 = e0 + 1 + rnd_below(n - e0);
		uint64_t b0 = e0 * s.isz, b1 = e1 * s.isz;
		uint8_t *src = malloc(b1 - b0);
		for (uint64_t i = 0; i < b1 - b0; i++)
			src[i] = (uint8_t)rnd();
		uint8_t **a = calloc(s.nchunks, sizeof(*a)), **b = calloc(s.nchunks, sizeof(*b));
		for (uint64_t c = 0; c < s.nchunks; c++) {
			a[c] = calloc(s.chunk_bytes, 1);
			b[c] = calloc(s.chunk_bytes, 1);
		}
		struct walk w = { .s = &s, .b0 = b0, .chunks = a, .src = src };
		w.seen = calloc(b1 - b0, 1);
		w.pieces_of = calloc(s.nchunks, sizeof(uint64_t));
		ckpt_stream_pieces(&s.g, &s.r, b0, b1, on_piece, &w);
		int same = 1;
		for (uint64_t c = 0; c < s.nchunks; c++) {
			uint64_t origin[CKPT_MAX_RANK], t = c;
			for (int d = s.rank - 1; d >= 0; d--) {
				origin[d] = (t % s.grid[d]) * s.cs[d];
				t /= s.grid[d];
			}
			uint64_t copied =
				ckpt_copy_stream_to_chunk(&s.r, e0, e1, src, b[c], origin, s.cs, s.isz);
			same &= memcmp(a[c], b[c], s.chunk_bytes) == 0;
			same &= (copied > 0) == (w.pieces_of[c] > 0);
		}
		CHECK(same);
		for (uint64_t c = 0; c < s.nchunks; c++) {
			free(a[c]);
			free(b[c]);
		}
		free(a);
		free(b);
		free(src);
		free(w.seen);
		free(w.pieces_of);
	}
}

static int stop_at_second(void *ctx, const ckpt_stream_piece *p)
{
	(void)p;
	return ++*(int *)ctx == 2 ? -42 : 0;
}

static int count_piece(void *ctx, const ckpt_stream_piece *p)
{
	(void)p;
	++*(int *)ctx;
	return 0;
}

static void test_edges(void)
{
	/* 2x4 int32 array in 1x2 chunks; the whole array is 4 chunks, 32 bytes. */
	uint64_t cs[2] = { 1, 2 }, grid[2] = { 2, 2 };
	ckpt_chunk_grid g = { .rank = 2, .itemsize = 4, .chunk_shape = cs, .grid = grid };
	ckpt_region r = { .rank = 2, .start = { 0, 0 }, .stop = { 2, 4 } };
	int n = 0;
	CHECK_EQ_INT(ckpt_stream_pieces(&g, &r, 0, 32, stop_at_second, &n), -42);
	CHECK_EQ_INT(n, 2);
	n = 0;
	CHECK_EQ_INT(ckpt_stream_pieces(&g, &r, 5, 5, count_piece, &n), 0); /* empty range */
	CHECK_EQ_INT(n, 0);
	n = 0;
	CHECK_EQ_INT(ckpt_stream_pieces(&g, &r, 1, 3, count_piece, &n), 0); /* inside one element */
	CHECK_EQ_INT(n, 1);
	n = 0;
	CHECK_EQ_INT(ckpt_stream_pieces(&g, &r, 0, 32, count_piece, &n), 0); /* one box, 4 chunks */
	CHECK_EQ_INT(n, 4);
	/* rank 0: one element of 8 bytes, any sub-range is one piece */
	ckpt_chunk_grid g0 = { .rank = 0, .itemsize = 8 };
	ckpt_region r0 = { .rank = 0 };
	n = 0;
	CHECK_EQ_INT(ckpt_stream_pieces(&g0, &r0, 0, 8, count_piece, &n), 0);
	CHECK_EQ_INT(n, 1);
	n = 0;
	CHECK_EQ_INT(ckpt_stream_pieces(&g0, &r0, 3, 7, count_piece, &n), 0);
	CHECK_EQ_INT(n, 1);
}

int main(void)
{
	CHECK_RUN(test_edges);
	CHECK_RUN(test_random_ranges);
	CHECK_RUN(test_against_copy);
	return CHECK_DONE();
}
