/*
 * slice.h - boxes (regions) of N-d arrays, numpy-style slice names, and the
 * strided copies between a chunk and a region's C-order byte stream.
 *
 * Conventions: a region is a half-open box [start[d], stop[d]) per dim in
 * global array coordinates.  A region's "stream" is its elements in C order
 * (last dim fastest), each `itemsize` bytes.  A chunk is a full chunk-shape
 * buffer in C order (edge chunks are still full-size, zarr style) whose
 * element [0,...,0] sits at `origin` in global coordinates.
 *
 * Slice names (file names): "[a:b,c:d]" per numpy basic slicing:
 *   - each dim is `start:stop` with either bound optional, negative bounds
 *     count from the end, bounds are clamped like numpy;
 *   - an integer `i` (also negative) selects one index and KEEPS the
 *     dimension with length 1 (so a slice file always has the array's rank);
 *   - trailing dims may be omitted (they mean the full extent);
 *   - no step, no ellipsis, no newaxis; spaces are not allowed.
 *
 * Pure functions: thread-safe, no allocation.
 */
#ifndef CKPT_SLICE_H
#define CKPT_SLICE_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"

typedef struct ckpt_region {
	int rank;
	uint64_t start[CKPT_MAX_RANK];
	uint64_t stop[CKPT_MAX_RANK];
} ckpt_region;

/* The full box of an array of the given shape. */
void ckpt_region_full(ckpt_region *r, int rank, const uint64_t *shape);

/* Number of elements in r (1 for rank 0); -EOVERFLOW on overflow. */
int ckpt_region_count(const ckpt_region *r, uint64_t *count);

/* Parse a slice name such as "[0:16,32:64]" (the whole text must be the
 * bracketed slice; `len` bytes, not NUL-terminated) against an array of
 * `rank` dims and `shape`.
 * Returns 0 and fills *out, or
 *   -EINVAL  malformed text (bad characters, missing brackets, empty
 *            component, more dims than rank, a number that does not fit
 *            in int64), *why set to a static reason string;
 *   -ERANGE  well-formed but selects nothing (empty after clamping, or an
 *            integer index outside [-n, n)), *why set.
 * Rank-0 arrays accept only "[]". */
int ckpt_slice_parse(const char *text, size_t len, int rank, const uint64_t *shape, ckpt_region *out,
		     const char **why);

/* Format r as a canonical slice name "[0:16,32:64]" ("[]" for rank 0).
 * Returns the length written (NUL-terminated), or -ENOBUFS. */
int ckpt_slice_format(const ckpt_region *r, char *buf, size_t cap);

/* Intersection of a and b (same rank).  Returns 1 if non-empty, else 0. */
int ckpt_region_intersect(const ckpt_region *a, const ckpt_region *b, ckpt_region *out);

/* Bounding box (in global coordinates) of the elements of stream positions
 * [e0, e1) of region r (0 <= e0 < e1 <= count(r)).  Used to find the chunks
 * that a byte range of a region file touches. */
void ckpt_region_stream_bbox(const ckpt_region *r, uint64_t e0, uint64_t e1, ckpt_region *bbox);

/* Copy every element that lies both in the chunk and in stream positions
 * [e0, e1) of region r from the chunk buffer to dst, where dst holds
 * stream positions [e0, e1) (dst[0] is position e0).  Elements outside the
 * chunk are left untouched.  Copies whole contiguous runs with memcpy. */
void ckpt_copy_chunk_to_stream(const ckpt_region *r, uint64_t e0, uint64_t e1, uint8_t *dst,
			       const uint8_t *chunk, const uint64_t *origin, const uint64_t *chunk_shape,
			       size_t itemsize);

/* The reverse: copy stream positions [e0, e1) of region r held in src
 * (src[0] is position e0) into the chunk buffer where they fall inside the
 * chunk.  Returns the number of elements copied. */
uint64_t ckpt_copy_stream_to_chunk(const ckpt_region *r, uint64_t e0, uint64_t e1, const uint8_t *src,
				   uint8_t *chunk, const uint64_t *origin, const uint64_t *chunk_shape,
				   size_t itemsize);

/* ---- byte ranges of a region's stream over a chunk grid ----
 *
 * The chunks a byte range of a region's stream touches, and where each of
 * its bytes goes in them.  Where ckpt_copy_*_chunk above take one chunk that
 * the caller already has and copy whatever of a stream range falls in it,
 * ckpt_stream_pieces finds exactly the chunks the range touches (never one
 * it does not: a writer allocates a buffer for every chunk it is handed) and
 * works in bytes, not elements: a range may start or end inside an element.
 *
 * The range is cut into at most 2 * rank + 2 pieces of work per chunk: a
 * partial first element, boxes of whole elements (at most 2 * rank of them
 * for any range), and a partial last element.  A chunk is the full chunk
 * shape in C order (edge chunks padded, as above). */

/* An array's chunk grid: chunk_shape[d] elements per chunk, grid[d] chunks
 * along dim d (ceil(shape[d] / chunk_shape[d])).  The arrays are borrowed. */
typedef struct ckpt_chunk_grid {
	int rank;
	size_t itemsize;
	const uint64_t *chunk_shape;
	const uint64_t *grid;
} ckpt_chunk_grid;

/* One chunk's share of a stream range.  chunk and cg are for the caller; the
 * rest tells ckpt_stream_piece_spans how to walk it. */
typedef struct ckpt_stream_piece {
	uint64_t chunk; /* linear index in the grid, C order */
	uint64_t cg[CKPT_MAX_RANK]; /* grid coordinates */
	int single; /* one span: s_n bytes from data s_soff to chunk s_coff */
	uint64_t s_coff, s_soff, s_n;
	uint64_t ist[CKPT_MAX_RANK], isp[CKPT_MAX_RANK]; /* box meets chunk (global) */
	uint64_t bst[CKPT_MAX_RANK]; /* box start (global) */
	uint64_t bstride[CKPT_MAX_RANK]; /* box element strides */
	uint64_t base; /* data byte offset of the box's first element */
} ckpt_stream_piece;

typedef int (*ckpt_stream_piece_fn)(void *ctx, const ckpt_stream_piece *p);
typedef void (*ckpt_stream_span_fn)(void *ctx, uint64_t chunk_off, uint64_t data_off, uint64_t n);

/* Call fn for each piece of stream bytes [b0, b1) of region r (inside the
 * grid's array; b1 <= the region's byte count), in stream order; data
 * offsets are relative to b0.  Stops at and returns fn's first non-zero
 * result; 0 otherwise (also for b0 >= b1).  Rank 0: one single piece. */
int ckpt_stream_pieces(const ckpt_chunk_grid *g, const ckpt_region *r, uint64_t b0, uint64_t b1,
		       ckpt_stream_piece_fn fn, void *ctx);

/* Call fn for each contiguous run of piece p: n bytes at chunk byte offset
 * chunk_off <-> data byte offset data_off.  Adjacent runs are merged. */
void ckpt_stream_piece_spans(const ckpt_chunk_grid *g, const ckpt_stream_piece *p, ckpt_stream_span_fn fn,
			     void *ctx);

#endif
