/*
 * slice.c - regions, slice names, and the chunk <-> stream copies.
 *
 * Copy algorithm: the problem is first reduced to the dims that matter.  The
 * trailing dims that both the region and the chunk cover completely (same
 * start, same extent) are folded into the innermost dim kept, since their
 * elements are contiguous in both buffers; the innermost dim then yields one
 * memcpy run per row.  The copy descends dim by dim over the sub-blocks of
 * the region's stream, visiting only the indices that lie both inside the
 * chunk and inside [e0, e1), so a chunk costs time proportional to the rows
 * it contributes, never to the size of the region.
 */
#include <string.h>

#include "slice.h"

#define INT64_MAX_U ((uint64_t)INT64_MAX)

void ckpt_region_full(ckpt_region *r, int rank, const uint64_t *shape)
{
	if (rank < 0 || rank > CKPT_MAX_RANK)
		rank = 0;
	r->rank = rank;
	for (int d = 0; d < rank; d++) {
		r->start[d] = 0;
		r->stop[d] = shape[d];
	}
}

int ckpt_region_count(const ckpt_region *r, uint64_t *count)
{
	uint64_t n = 1;

	if (r->rank < 0 || r->rank > CKPT_MAX_RANK)
		return -EINVAL;
	for (int d = 0; d < r->rank; d++) {
		if (r->stop[d] < r->start[d])
			return -EINVAL;
		if (ckpt_mul_u64(n, r->stop[d] - r->start[d], &n))
			return -EOVERFLOW;
	}
	*count = n;
	return 0;
}

int ckpt_region_intersect(const ckpt_region *a, const ckpt_region *b, ckpt_region *out)
{
	int nonempty = 1;

	if (a->rank != b->rank || a->rank < 0 || a->rank > CKPT_MAX_RANK) {
		out->rank = 0;
		return 0;
	}
	out->rank = a->rank;
	for (int d = 0; d < a->rank; d++) {
		uint64_t lo = a->start[d] > b->start[d] ? a->start[d] : b->start[d];
		uint64_t hi = a->stop[d] < b->stop[d] ? a->stop[d] : b->stop[d];

		if (hi <= lo) {
			hi = lo;
			nonempty = 0;
		}
		out->start[d] = lo;
		out->stop[d] = hi;
	}
	return nonempty;
}

/* ---- slice names ---------------------------------------------------------- */

static int fail(const char **why, const char *reason, int err)
{
	if (why)
		*why = reason;
	return err;
}

/* Parse an optional integer (optional '-' then decimal digits) at *pp.
 * Returns 1 and advances *pp if a number is there, 0 if the next character
 * cannot start one, -EINVAL for a lone '-' or an int64 overflow. */
static int parse_i64(const char **pp, const char *end, int64_t *out)
{
	const char *p = *pp;
	int neg = 0;
	uint64_t mag = 0;

	if (p < end && *p == '-') {
		neg = 1;
		p++;
	}
	if (p >= end || *p < '0' || *p > '9')
		return neg ? -EINVAL : 0;
	while (p < end && *p >= '0' && *p <= '9') {
		uint64_t digit = (uint64_t)(*p - '0');

		if (mag > (INT64_MAX_U + 1 - digit) / 10)
			return -EINVAL;
		mag = mag * 10 + digit;
		p++;
	}
	if (mag > INT64_MAX_U + (uint64_t)neg)
		return -EINVAL;
	if (neg)
		*out = mag == INT64_MAX_U + 1 ? INT64_MIN : -(int64_t)mag;
	else
		*out = (int64_t)mag;
	*pp = p;
	return 1;
}

/* A slice bound resolved against extent n, clamped to [0, n] like Python. */
static uint64_t clamp_bound(int64_t v, uint64_t n)
{
	if (v >= 0)
		return (uint64_t)v < n ? (uint64_t)v : n;
	/* -v without overflow for INT64_MIN */
	uint64_t back = (uint64_t)(-(v + 1)) + 1;
	return back >= n ? 0 : n - back;
}

/*
 * Decisions beyond slice.h: "[]" means the whole array for every rank (and
 * is the only form rank 0 accepts); a trailing comma ("[1,]") counts as an
 * empty component and is rejected; numbers are an optional '-' and decimal
 * digits (leading zeros allowed, no '+'); "-0" is 0; a shape with a zero
 * extent makes every slice, "[]" included, -ERANGE.  The whole text is
 * checked first, so malformed text is -EINVAL even when an earlier index is
 * out of range.
 */
int ckpt_slice_parse(const char *text, size_t len, int rank, const uint64_t *shape, ckpt_region *out,
		     const char **why)
{
	const char *p, *end;
	int d = 0, bad_index = 0;

	if (!text || !out || rank < 0 || rank > CKPT_MAX_RANK || (rank > 0 && !shape))
		return fail(why, "invalid arguments", -EINVAL);
	if (len < 2 || text[0] != '[' || text[len - 1] != ']')
		return fail(why, "slice must be enclosed in [ ]", -EINVAL);
	p = text + 1;
	end = text + len - 1; /* the closing bracket */

	out->rank = rank;
	for (int k = 0; k < rank; k++) {
		out->start[k] = 0;
		out->stop[k] = shape[k];
	}

	if (p == end) {
		/* "[]": the whole array (any rank) */
	} else {
		for (;;) {
			int64_t a = 0, b = 0;
			int has_a, has_b = 0, colon = 0;

			if (d >= rank)
				return fail(why, "more indices than array dimensions", -EINVAL);
			has_a = parse_i64(&p, end, &a);
			if (has_a < 0)
				return fail(why, "bad or out-of-range number", -EINVAL);
			if (p < end && *p == ':') {
				colon = 1;
				p++;
				has_b = parse_i64(&p, end, &b);
				if (has_b < 0)
					return fail(why, "bad or out-of-range number", -EINVAL);
				if (p < end && *p == ':')
					return fail(why, "steps are not supported", -EINVAL);
			}
			if (p < end && *p != ',')
				return fail(why, "unexpected character", -EINVAL);
			if (!has_a && !colon)
				return fail(why, "empty index", -EINVAL);

			uint64_t n = shape[d];
			if (!colon) {
				uint64_t i;
				if (a >= 0) {
					i = (uint64_t)a;
				} else {
					uint64_t back = (uint64_t)(-(a + 1)) + 1;
					i = back > n ? n : n - back;
				}
				if (i >= n) {
					bad_index = 1; /* reported once the text is checked */
					out->start[d] = out->stop[d] = 0;
				} else {
					out->start[d] = i;
					out->stop[d] = i + 1;
				}
			} else {
				uint64_t lo = has_a ? clamp_bound(a, n) : 0;
				uint64_t hi = has_b ? clamp_bound(b, n) : n;
				out->start[d] = lo;
				out->stop[d] = hi;
			}
			d++;
			if (p == end)
				break;
			p++; /* the ',' */
			if (p == end)
				return fail(why, "empty index", -EINVAL);
		}
	}
	if (bad_index)
		return fail(why, "index out of range", -ERANGE);
	for (int k = 0; k < rank; k++)
		if (out->stop[k] <= out->start[k])
			return fail(why, "slice selects no elements", -ERANGE);
	return 0;
}

static size_t put_u64(char *tmp, uint64_t v)
{
	char rev[24];
	size_t n = 0, i;

	do {
		rev[n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	for (i = 0; i < n; i++)
		tmp[i] = rev[n - 1 - i];
	return n;
}

int ckpt_slice_format(const ckpt_region *r, char *buf, size_t cap)
{
	size_t pos = 0;
	char tmp[48];

	if (r->rank < 0 || r->rank > CKPT_MAX_RANK)
		return -EINVAL;
#define EMIT(s, n)                                                                                           \
	do {                                                                                                 \
		if (pos + (n) >= cap)                                                                        \
			return -ENOBUFS;                                                                     \
		memcpy(buf + pos, (s), (n));                                                                 \
		pos += (n);                                                                                  \
	} while (0)
	EMIT("[", 1);
	for (int d = 0; d < r->rank; d++) {
		size_t n = 0;
		if (d)
			tmp[n++] = ',';
		n += put_u64(tmp + n, r->start[d]);
		tmp[n++] = ':';
		n += put_u64(tmp + n, r->stop[d]);
		EMIT(tmp, n);
	}
	EMIT("]", 1);
#undef EMIT
	buf[pos] = 0;
	return (int)pos;
}

/* ---- stream geometry ------------------------------------------------------ */

/* Validate r and [e0, e1); fill ext[] and blk[] where blk[d] is the number
 * of stream elements spanned by one index step of dim d.  Returns 0 if
 * the range is valid and non-empty. */
static int stream_setup(const ckpt_region *r, uint64_t e0, uint64_t e1, uint64_t *ext, uint64_t *blk)
{
	uint64_t n = 1;

	if (r->rank < 0 || r->rank > CKPT_MAX_RANK || e0 >= e1)
		return -EINVAL;
	for (int d = r->rank - 1; d >= 0; d--) {
		if (r->stop[d] < r->start[d])
			return -EINVAL;
		ext[d] = r->stop[d] - r->start[d];
		blk[d] = n;
		if (ckpt_mul_u64(n, ext[d], &n))
			return -EOVERFLOW;
	}
	if (e1 > n)
		return -EINVAL;
	return 0;
}

void ckpt_region_stream_bbox(const ckpt_region *r, uint64_t e0, uint64_t e1, ckpt_region *bbox)
{
	uint64_t ext[CKPT_MAX_RANK], blk[CKPT_MAX_RANK];
	int rank = (r->rank >= 0 && r->rank <= CKPT_MAX_RANK) ? r->rank : 0;

	bbox->rank = rank;
	if (stream_setup(r, e0, e1, ext, blk)) {
		for (int d = 0; d < rank; d++)
			bbox->start[d] = bbox->stop[d] = r->start[d];
		return;
	}
	/* Along dim d the index of position p is (p / blk[d]) mod ext[d]; over
	 * a contiguous range of p the quotient runs through consecutive values,
	 * so the index range is either one unwrapped interval or everything. */
	for (int d = 0; d < rank; d++) {
		uint64_t q0 = e0 / blk[d], q1 = (e1 - 1) / blk[d];
		uint64_t i0 = q0 % ext[d], i1 = q1 % ext[d];

		if (q1 - q0 >= ext[d] || i1 < i0) {
			bbox->start[d] = r->start[d];
			bbox->stop[d] = r->stop[d];
		} else {
			bbox->start[d] = r->start[d] + i0;
			bbox->stop[d] = r->start[d] + i1 + 1;
		}
	}
}

/* ---- chunk <-> stream copies ---------------------------------------------- */

struct copy_ctx {
	int rank; /* reduced rank, >= 1 */
	uint64_t lo[CKPT_MAX_RANK]; /* region-relative index range inside the chunk */
	uint64_t hi[CKPT_MAX_RANK];
	uint64_t off[CKPT_MAX_RANK]; /* chunk index = region index + off (mod 2^64) */
	uint64_t blk[CKPT_MAX_RANK]; /* stream elements per index step */
	uint64_t cst[CKPT_MAX_RANK]; /* chunk elements per index step */
	uint64_t e0;
	size_t itemsize;
	uint8_t *stream; /* holds stream positions [e0, e1) */
	uint8_t *chunk;
	int to_chunk;
	uint64_t copied;
};

static void copy_run(struct copy_ctx *c, uint64_t spos, uint64_t cpos, uint64_t n)
{
	size_t sz = c->itemsize;
	uint8_t *s = c->stream + (spos - c->e0) * sz;
	uint8_t *k = c->chunk + cpos * sz;

	if (c->to_chunk)
		memcpy(k, s, n * sz);
	else
		memcpy(s, k, n * sz);
	c->copied += n;
}

/* Copy the part of stream positions [sbase + a, sbase + b) that lies in the
 * sub-block of dims d.. starting at stream position sbase and chunk element
 * cbase (0 <= a < b <= that sub-block's size). */
static void copy_rec(struct copy_ctx *c, int d, uint64_t sbase, uint64_t cbase, uint64_t a, uint64_t b)
{
	uint64_t blk = c->blk[d];
	uint64_t i0 = a / blk, i1 = (b - 1) / blk + 1;

	if (i0 < c->lo[d])
		i0 = c->lo[d];
	if (i1 > c->hi[d])
		i1 = c->hi[d];
	if (i0 >= i1)
		return;

	if (d == c->rank - 1) {
		/* innermost: blk == 1, one contiguous run */
		copy_run(c, sbase + i0, cbase + i0 + c->off[d], i1 - i0);
		return;
	}
	if (d == c->rank - 2) {
		/* one memcpy per row; inline the innermost level */
		int e = d + 1;
		uint64_t rlo = c->lo[e], rhi = c->hi[e];
		uint64_t cst = c->cst[d], eoff = c->off[e];

		for (uint64_t i = i0; i < i1; i++) {
			uint64_t s = i * blk;
			uint64_t x0 = a > s ? a - s : 0;
			uint64_t x1 = b - s < blk ? b - s : blk;

			if (x0 < rlo)
				x0 = rlo;
			if (x1 > rhi)
				x1 = rhi;
			if (x0 < x1)
				copy_run(c, sbase + s + x0, cbase + (i + c->off[d]) * cst + x0 + eoff,
					 x1 - x0);
		}
		return;
	}
	for (uint64_t i = i0; i < i1; i++) {
		uint64_t s = i * blk;
		uint64_t x0 = a > s ? a - s : 0;
		uint64_t x1 = b - s < blk ? b - s : blk;

		copy_rec(c, d + 1, sbase + s, cbase + (i + c->off[d]) * c->cst[d], x0, x1);
	}
}

static uint64_t copy_common(const ckpt_region *r, uint64_t e0, uint64_t e1, uint8_t *stream, uint8_t *chunk,
			    const uint64_t *origin, const uint64_t *chunk_shape, size_t itemsize,
			    int to_chunk)
{
	uint64_t ext[CKPT_MAX_RANK], blk[CKPT_MAX_RANK], cst[CKPT_MAX_RANK];
	struct copy_ctx c;
	int rank = r->rank, m;

	if (!stream || !chunk || itemsize == 0 || stream_setup(r, e0, e1, ext, blk))
		return 0;
	if (rank > 0 && (!origin || !chunk_shape))
		return 0;

	c.e0 = e0;
	c.itemsize = itemsize;
	c.stream = stream;
	c.chunk = chunk;
	c.to_chunk = to_chunk;
	c.copied = 0;

	if (rank == 0) {
		/* a single element at stream position 0 */
		copy_run(&c, 0, 0, 1);
		return c.copied;
	}

	/* Intersection with the chunk box, region-relative; chunk strides. */
	uint64_t n = 1;
	for (int d = rank - 1; d >= 0; d--) {
		uint64_t cend;
		uint64_t lo, hi;

		cst[d] = n;
		if (ckpt_mul_u64(n, chunk_shape[d], &n) || ckpt_add_u64(origin[d], chunk_shape[d], &cend))
			return 0;
		lo = origin[d] > r->start[d] ? origin[d] : r->start[d];
		hi = cend < r->stop[d] ? cend : r->stop[d];
		if (hi <= lo)
			return 0;
		c.lo[d] = lo - r->start[d];
		c.hi[d] = hi - r->start[d];
		c.off[d] = r->start[d] - origin[d]; /* modular; exact where used */
		c.blk[d] = blk[d];
		c.cst[d] = cst[d];
	}

	/* Fold trailing dims that both buffers cover completely: dim k (k > m)
	 * qualifies when the region's and the chunk's ranges along k coincide. */
	m = rank - 1;
	while (m > 0 && r->start[m] == origin[m] && ext[m] == chunk_shape[m])
		m--;
	if (m < rank - 1) {
		uint64_t f = blk[m]; /* == cst[m]: product of the folded extents */
		c.lo[m] *= f;
		c.hi[m] *= f;
		c.off[m] *= f;
		c.blk[m] = 1;
		c.cst[m] = 1;
	}
	c.rank = m + 1;

	copy_rec(&c, 0, 0, 0, e0, e1);
	return c.copied;
}

void ckpt_copy_chunk_to_stream(const ckpt_region *r, uint64_t e0, uint64_t e1, uint8_t *dst,
			       const uint8_t *chunk, const uint64_t *origin, const uint64_t *chunk_shape,
			       size_t itemsize)
{
	/* the chunk is only read when to_chunk == 0 */
	copy_common(r, e0, e1, dst, (uint8_t *)(uintptr_t)chunk, origin, chunk_shape, itemsize, 0);
}

uint64_t ckpt_copy_stream_to_chunk(const ckpt_region *r, uint64_t e0, uint64_t e1, const uint8_t *src,
				   uint8_t *chunk, const uint64_t *origin, const uint64_t *chunk_shape,
				   size_t itemsize)
{
	return copy_common(r, e0, e1, (uint8_t *)(uintptr_t)src, chunk, origin, chunk_shape, itemsize, 1);
}

/* ---- byte ranges of a region's stream over a chunk grid ---- */

/* Chunk, grid coordinates and byte offset in the chunk of the element at
 * global coordinates gc. */
static void piece_locate(const ckpt_chunk_grid *g, const uint64_t *gc, ckpt_stream_piece *p, uint64_t *coff)
{
	uint64_t lin = 0, off = 0;
	for (int d = 0; d < g->rank; d++) {
		uint64_t c = gc[d] / g->chunk_shape[d];
		p->cg[d] = c;
		lin = lin * g->grid[d] + c;
		off = off * g->chunk_shape[d] + (gc[d] - c * g->chunk_shape[d]);
	}
	p->chunk = lin;
	*coff = off * g->itemsize;
}

/* Global coordinates of stream element e of region r. */
static void piece_unravel(const ckpt_region *r, uint64_t e, uint64_t *gc)
{
	for (int d = r->rank - 1; d >= 0; d--) {
		uint64_t ext = r->stop[d] - r->start[d];
		gc[d] = r->start[d] + e % ext;
		e /= ext;
	}
}

/* A partial element: bytes [lo, hi) of stream element e, at data offset soff. */
static int piece_single(const ckpt_chunk_grid *g, const ckpt_region *r, uint64_t e, uint64_t lo, uint64_t hi,
			uint64_t soff, ckpt_stream_piece_fn fn, void *ctx)
{
	ckpt_stream_piece p;
	uint64_t gc[CKPT_MAX_RANK], coff;
	memset(&p, 0, sizeof(p));
	piece_unravel(r, e, gc);
	piece_locate(g, gc, &p, &coff);
	p.single = 1;
	p.s_coff = coff + lo;
	p.s_soff = soff;
	p.s_n = hi - lo;
	return fn(ctx, &p);
}

/* One piece per chunk meeting the box [bst, bsp), whose first element is at
 * data offset base. */
static int piece_box(const ckpt_chunk_grid *g, const uint64_t *bst, const uint64_t *bsp, uint64_t base,
		     ckpt_stream_piece_fn fn, void *ctx)
{
	int n = g->rank;
	ckpt_stream_piece p;
	uint64_t lo[CKPT_MAX_RANK], hi[CKPT_MAX_RANK];
	memset(&p, 0, sizeof(p));
	p.base = base;
	uint64_t st = 1;
	for (int d = n - 1; d >= 0; d--) {
		p.bst[d] = bst[d];
		p.bstride[d] = st;
		st *= bsp[d] - bst[d];
		lo[d] = bst[d] / g->chunk_shape[d];
		hi[d] = (bsp[d] - 1) / g->chunk_shape[d];
		p.cg[d] = lo[d];
	}
	for (;;) {
		uint64_t lin = 0;
		for (int d = 0; d < n; d++) {
			uint64_t c0 = p.cg[d] * g->chunk_shape[d], c1 = c0 + g->chunk_shape[d];
			p.ist[d] = bst[d] > c0 ? bst[d] : c0;
			p.isp[d] = bsp[d] < c1 ? bsp[d] : c1;
			lin = lin * g->grid[d] + p.cg[d];
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

/* Whole stream elements [E0, E1) of r (rank >= 1) as at most 2 * rank boxes:
 * from E0 up to the next boundary of the smallest block it is not aligned
 * to, then ever larger aligned blocks, then ever smaller ones up to E1.
 * B[j] is the element count of a block of the last j dims. */
static int piece_boxes(const ckpt_chunk_grid *g, const ckpt_region *r, uint64_t E0, uint64_t E1,
		       uint64_t orig, ckpt_stream_piece_fn fn, void *ctx)
{
	int n = r->rank;
	uint64_t s = g->itemsize, ext[CKPT_MAX_RANK], B[CKPT_MAX_RANK + 1];
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
		int rc = piece_box(g, bst, bsp, p * s - orig, fn, ctx);
		if (rc)
			return rc;
		p += m * B[j];
	}
	return 0;
}

int ckpt_stream_pieces(const ckpt_chunk_grid *g, const ckpt_region *r, uint64_t b0, uint64_t b1,
		       ckpt_stream_piece_fn fn, void *ctx)
{
	uint64_t s = g->itemsize, orig = b0;
	int rc;
	if (b0 >= b1 || s == 0)
		return 0;
	if (b0 % s) { /* head: part of one element */
		uint64_t e = b0 / s, lo = b0 % s, hi = (b1 - e * s) < s ? b1 - e * s : s;
		rc = piece_single(g, r, e, lo, hi, 0, fn, ctx);
		if (rc)
			return rc;
		b0 = e * s + hi;
	}
	uint64_t E0 = b0 / s, E1 = b1 / s;
	if (b0 < b1 && E1 > E0) {
		if (r->rank == 0) {
			ckpt_stream_piece p;
			memset(&p, 0, sizeof(p));
			p.single = 1;
			p.s_soff = b0 - orig;
			p.s_n = s;
			rc = fn(ctx, &p);
		} else {
			rc = piece_boxes(g, r, E0, E1, orig, fn, ctx);
		}
		if (rc)
			return rc;
		b0 = E1 * s;
	}
	if (b0 < b1) /* tail: first bytes of one element */
		return piece_single(g, r, b0 / s, 0, b1 - b0, b0 - orig, fn, ctx);
	return 0;
}

void ckpt_stream_piece_spans(const ckpt_chunk_grid *g, const ckpt_stream_piece *p, ckpt_stream_span_fn fn,
			     void *ctx)
{
	if (p->single) {
		fn(ctx, p->s_coff, p->s_soff, p->s_n);
		return;
	}
	int n = g->rank;
	uint64_t s = g->itemsize, cst[CKPT_MAX_RANK], i[CKPT_MAX_RANK], st = 1;
	for (int d = n - 1; d >= 0; d--) {
		cst[d] = st;
		st *= g->chunk_shape[d];
		i[d] = p->ist[d];
	}
	uint64_t run = (p->isp[n - 1] - p->ist[n - 1]) * s;
	uint64_t pc = 0, ps = 0, pn = 0; /* pending merged span */
	for (;;) {
		uint64_t co = 0, so = 0;
		for (int d = 0; d < n; d++) {
			co += (i[d] - p->cg[d] * g->chunk_shape[d]) * cst[d];
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
