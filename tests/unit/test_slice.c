/*
 * test_slice.c - slice names, regions, stream bounding boxes and the
 * chunk <-> stream copies (checked against an element-by-element model).
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "slice.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
	/* xorshift64* */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545F4914F6CDD1Dull;
}

static uint64_t rnd_below(uint64_t n)
{
	return n ? rnd() % n : 0;
}

/* ---- parsing ---------------------------------------------------------------- */

static int parse(const char *s, int rank, const uint64_t *shape, ckpt_region *r)
{
	const char *why = NULL;
	int rc = ckpt_slice_parse(s, strlen(s), rank, shape, r, &why);
	if (rc)
		CHECK(why != NULL && why[0] != 0);
	return rc;
}

static int region_is(const ckpt_region *r, int rank, const uint64_t *start, const uint64_t *stop)
{
	if (r->rank != rank)
		return 0;
	for (int d = 0; d < rank; d++)
		if (r->start[d] != start[d] || r->stop[d] != stop[d])
			return 0;
	return 1;
}

#define EXPECT_REGION(text, rank, shape, ...)                                                                \
	do {                                                                                                 \
		ckpt_region r_;                                                                              \
		uint64_t v_[] = { __VA_ARGS__ };                                                             \
		CHECK_EQ_INT(parse(text, rank, shape, &r_), 0);                                              \
		CHECK(region_is(&r_, rank, v_, v_ + (rank)));                                                \
	} while (0)

static void test_parse(void)
{
	uint64_t s2[] = { 64, 128 };
	uint64_t s1[] = { 100 };
	uint64_t s3[] = { 4, 5, 6 };
	ckpt_region r;

	/* the examples of the usage doc */
	EXPECT_REGION("[0:16,32:64]", 2, s2, 0, 32, 16, 64);
	EXPECT_REGION("[:,64:]", 2, s2, 0, 64, 64, 128);
	EXPECT_REGION("[8:24]", 2, s2, 8, 0, 24, 128);
	EXPECT_REGION("[-32:]", 1, s1, 68, 100);
	EXPECT_REGION("[-32:]", 2, s2, 32, 0, 64, 128);

	/* integer indices keep the dim with length 1 */
	EXPECT_REGION("[3]", 2, s2, 3, 0, 4, 128);
	EXPECT_REGION("[-1]", 2, s2, 63, 0, 64, 128);
	EXPECT_REGION("[-64,127]", 2, s2, 0, 127, 1, 128);
	EXPECT_REGION("[0]", 1, s1, 0, 1);
	EXPECT_REGION("[1,2,3]", 3, s3, 1, 2, 3, 2, 3, 4);
	EXPECT_REGION("[1,2]", 3, s3, 1, 2, 0, 2, 3, 6);

	/* omitted bounds, clamping, full forms */
	EXPECT_REGION("[:]", 1, s1, 0, 100);
	EXPECT_REGION("[]", 2, s2, 0, 0, 64, 128);
	EXPECT_REGION("[:,:]", 2, s2, 0, 0, 64, 128);
	EXPECT_REGION("[0:1000]", 1, s1, 0, 100);
	EXPECT_REGION("[-1000:5]", 1, s1, 0, 5);
	EXPECT_REGION("[:-1]", 1, s1, 0, 99);
	EXPECT_REGION("[-3:-1]", 1, s1, 97, 99);
	EXPECT_REGION("[5:]", 1, s1, 5, 100);
	EXPECT_REGION("[:7]", 1, s1, 0, 7);
	EXPECT_REGION("[-0:3]", 1, s1, 0, 3);
	EXPECT_REGION("[007:9]", 1, s1, 7, 9);
	EXPECT_REGION("[-9223372036854775808:9223372036854775807]", 1, s1, 0, 100);
	EXPECT_REGION("[9223372036854775806]", 1, (uint64_t[]){ UINT64_MAX }, 9223372036854775806ull,
		      9223372036854775807ull);
	EXPECT_REGION("[-1]", 1, (uint64_t[]){ UINT64_MAX }, UINT64_MAX - 1, UINT64_MAX);

	/* rank 0 */
	CHECK_EQ_INT(parse("[]", 0, NULL, &r), 0);
	CHECK_EQ_INT(r.rank, 0);
	CHECK_EQ_INT(parse("[0]", 0, NULL, &r), -EINVAL);
	CHECK_EQ_INT(parse("[:]", 0, NULL, &r), -EINVAL);

	/* malformed */
	const char *bad[] = {
		"",
		"[",
		"]",
		"0:16",
		"[0:16",
		"0:16]",
		"[,1]",
		"[1,]",
		"[,]",
		"[::2]",
		"[0:16:2]",
		"[0::]",
		"[ 0:16]",
		"[0 :16]",
		"[0:16 ]",
		"[0:16, 32:64]",
		"[0:x]",
		"[x]",
		"[0:16,32:64,1]",
		"[1,2,3]",
		"[99999999999999999999999:]",
		"[:9223372036854775808]",
		"[-9223372036854775809]",
		"[-]",
		"[-:3]",
		"[+3]",
		"[1.5]",
		"[0x10]",
		"[...]",
		"[None]",
		"[[0]]",
		"[0]]",
		"[[0]",
		"(0:16)",
		"[0:16];",
		"x[0:16]",
		"[0;16]",
		"[--1]",
		"[1-]",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int rc = parse(bad[i], 2, s2, &r);
		if (rc != -EINVAL)
			fprintf(stderr, "accepted or misclassified: '%s' -> %d\n", bad[i], rc);
		CHECK_EQ_INT(rc, -EINVAL);
	}
	/* malformed text wins over an out-of-range index before it */
	CHECK_EQ_INT(parse("[100,x]", 2, s2, &r), -EINVAL);
	CHECK_EQ_INT(parse("[100,1,2]", 2, s2, &r), -EINVAL);
	CHECK_EQ_INT(parse("[100,1]", 2, s2, &r), -ERANGE);
	/* embedded NUL inside the length */
	CHECK_EQ_INT(ckpt_slice_parse("[0\0:1]", 6, 2, s2, &r, NULL), -EINVAL);
	/* NULL why is allowed */
	CHECK_EQ_INT(ckpt_slice_parse("[x]", 3, 2, s2, &r, NULL), -EINVAL);
	/* length bounds the text: "[0:16]" followed by junk not counted */
	CHECK_EQ_INT(ckpt_slice_parse("[0:16]junk", 6, 2, s2, &r, NULL), 0);
	CHECK_EQ_INT(r.stop[0], 16);
	/* invalid rank */
	CHECK_EQ_INT(parse("[]", -1, s2, &r), -EINVAL);
	CHECK_EQ_INT(parse("[]", CKPT_MAX_RANK + 1, s2, &r), -EINVAL);

	/* well-formed but empty */
	const char *empty[] = { "[64]",
				"[-65]",
				"[9223372036854775807]",
				"[-9223372036854775808]",
				"[5:5]",
				"[10:5]",
				"[64:]",
				"[:-64]",
				"[-1:-2]",
				"[:,128:]",
				"[:0]",
				"[0,128]",
				"[1000:2000]" };
	for (size_t i = 0; i < sizeof(empty) / sizeof(empty[0]); i++) {
		int rc = parse(empty[i], 2, s2, &r);
		if (rc != -ERANGE)
			fprintf(stderr, "expected ERANGE: '%s' -> %d\n", empty[i], rc);
		CHECK_EQ_INT(rc, -ERANGE);
	}
	/* a zero-length dim: even "[]" selects nothing */
	uint64_t z[] = { 4, 0 };
	CHECK_EQ_INT(parse("[]", 2, z, &r), -ERANGE);
	CHECK_EQ_INT(parse("[1]", 2, z, &r), -ERANGE);

	/* max rank */
	uint64_t big[CKPT_MAX_RANK];
	char text[4 * CKPT_MAX_RANK + 8];
	size_t n = 0;
	text[n++] = '[';
	for (int d = 0; d < CKPT_MAX_RANK; d++) {
		big[d] = 3;
		if (d)
			text[n++] = ',';
		text[n++] = '1';
	}
	text[n++] = ']';
	CHECK_EQ_INT(ckpt_slice_parse(text, n, CKPT_MAX_RANK, big, &r, NULL), 0);
	CHECK_EQ_INT(r.rank, CKPT_MAX_RANK);
	CHECK_EQ_INT(r.start[CKPT_MAX_RANK - 1], 1);
	CHECK_EQ_INT(ckpt_slice_parse(text, n, CKPT_MAX_RANK - 1, big, &r, NULL), -EINVAL);
}

/* Python-slice model on small numbers for random cross-checks. */
static int model_bound(long v, long n)
{
	if (v < 0)
		v += n;
	if (v < 0)
		v = 0;
	if (v > n)
		v = n;
	return (int)v;
}

static void test_parse_random(void)
{
	for (int it = 0; it < 20000; it++) {
		int rank = (int)rnd_below(4) + 1;
		uint64_t shape[4];
		long st[4], sp[4];
		int nd = (int)rnd_below((uint64_t)rank + 1), expect = 0;
		char text[200];
		size_t len = 0;

		for (int d = 0; d < rank; d++) {
			shape[d] = rnd_below(9);
			st[d] = 0;
			sp[d] = (long)shape[d];
		}
		text[len++] = '[';
		for (int d = 0; d < nd; d++) {
			long n = (long)shape[d];
			int form = (int)rnd_below(5);
			long a = (long)rnd_below(25) - 12, b = (long)rnd_below(25) - 12;
			if (d)
				text[len++] = ',';
			switch (form) {
			case 0: /* integer */
				len += (size_t)sprintf(text + len, "%ld", a);
				if (a < -n || a >= n)
					expect = -ERANGE;
				st[d] = a < 0 ? a + n : a;
				sp[d] = st[d] + 1;
				break;
			case 1:
				len += (size_t)sprintf(text + len, "%ld:%ld", a, b);
				st[d] = model_bound(a, n);
				sp[d] = model_bound(b, n);
				break;
			case 2:
				len += (size_t)sprintf(text + len, "%ld:", a);
				st[d] = model_bound(a, n);
				break;
			case 3:
				len += (size_t)sprintf(text + len, ":%ld", b);
				sp[d] = model_bound(b, n);
				break;
			default:
				len += (size_t)sprintf(text + len, ":");
				break;
			}
		}
		text[len++] = ']';
		for (int d = 0; d < rank && !expect; d++)
			if (sp[d] <= st[d])
				expect = -ERANGE;
		ckpt_region r;
		int rc = ckpt_slice_parse(text, len, rank, shape, &r, NULL);
		CHECK_EQ_INT(rc, expect);
		if (rc == 0 && expect == 0) {
			int ok = r.rank == rank;
			for (int d = 0; d < rank; d++)
				ok &= r.start[d] == (uint64_t)st[d] && r.stop[d] == (uint64_t)sp[d];
			if (!ok)
				fprintf(stderr, "mismatch for %.*s\n", (int)len, text);
			CHECK(ok);
		}
	}
}

static void test_format(void)
{
	ckpt_region r;
	char buf[64];

	r.rank = 0;
	CHECK_EQ_INT(ckpt_slice_format(&r, buf, sizeof(buf)), 2);
	CHECK(strcmp(buf, "[]") == 0);
	CHECK_EQ_INT(ckpt_slice_format(&r, buf, 2), -ENOBUFS);
	CHECK_EQ_INT(ckpt_slice_format(&r, buf, 3), 2);

	r.rank = 2;
	r.start[0] = 0;
	r.stop[0] = 16;
	r.start[1] = 32;
	r.stop[1] = 64;
	CHECK_EQ_INT(ckpt_slice_format(&r, buf, sizeof(buf)), 12);
	CHECK(strcmp(buf, "[0:16,32:64]") == 0);
	CHECK_EQ_INT(ckpt_slice_format(&r, buf, 12), -ENOBUFS);
	CHECK_EQ_INT(ckpt_slice_format(&r, buf, 13), 12);
	for (size_t cap = 0; cap < 12; cap++)
		CHECK_EQ_INT(ckpt_slice_format(&r, buf, cap), -ENOBUFS);

	r.rank = 1;
	r.start[0] = 0;
	r.stop[0] = UINT64_MAX;
	CHECK_EQ_INT(ckpt_slice_format(&r, buf, sizeof(buf)), 24);
	CHECK(strcmp(buf, "[0:18446744073709551615]") == 0);

	/* round trip of random regions */
	for (int it = 0; it < 5000; it++) {
		uint64_t shape[CKPT_MAX_RANK];
		ckpt_region a, b;
		char text[CKPT_MAX_RANK * 44 + 4];
		a.rank = (int)rnd_below(CKPT_MAX_RANK + 1);
		for (int d = 0; d < a.rank; d++) {
			shape[d] = (rnd() & 1) ? rnd_below(1000) + 1 : (rnd() >> 2) + 1;
			a.start[d] = rnd_below(shape[d]);
			a.stop[d] = a.start[d] + 1 + rnd_below(shape[d] - a.start[d]);
		}
		int n = ckpt_slice_format(&a, text, sizeof(text));
		CHECK(n > 0);
		CHECK_EQ_INT((size_t)n, strlen(text));
		CHECK_EQ_INT(ckpt_slice_parse(text, (size_t)n, a.rank, shape, &b, NULL), 0);
		CHECK(region_is(&b, a.rank, a.start, a.stop));
	}
}

static void test_region_basics(void)
{
	ckpt_region a, b, o;
	uint64_t shape[] = { 3, 4, 5 }, n;

	ckpt_region_full(&a, 3, shape);
	CHECK_EQ_INT(ckpt_region_count(&a, &n), 0);
	CHECK_EQ_INT(n, 60);
	ckpt_region_full(&a, 0, NULL);
	CHECK_EQ_INT(ckpt_region_count(&a, &n), 0);
	CHECK_EQ_INT(n, 1);

	a.rank = 2;
	a.start[0] = 0;
	a.stop[0] = UINT64_MAX;
	a.start[1] = 0;
	a.stop[1] = 3;
	CHECK_EQ_INT(ckpt_region_count(&a, &n), -EOVERFLOW);

	a.start[0] = 2;
	a.stop[0] = 10;
	a.start[1] = 0;
	a.stop[1] = 5;
	b.rank = 2;
	b.start[0] = 8;
	b.stop[0] = 20;
	b.start[1] = 4;
	b.stop[1] = 9;
	CHECK_EQ_INT(ckpt_region_intersect(&a, &b, &o), 1);
	CHECK(region_is(&o, 2, (uint64_t[]){ 8, 4 }, (uint64_t[]){ 10, 5 }));
	b.start[1] = 5;
	CHECK_EQ_INT(ckpt_region_intersect(&a, &b, &o), 0);
	b.rank = 1;
	CHECK_EQ_INT(ckpt_region_intersect(&a, &b, &o), 0);
	a.rank = b.rank = 0;
	CHECK_EQ_INT(ckpt_region_intersect(&a, &b, &o), 1);
}

/* ---- copies against the element-by-element model ------------------------- */

#define MAXR 5

static void coords_of(const uint64_t *ext, int rank, uint64_t p, uint64_t *c)
{
	for (int d = rank - 1; d >= 0; d--) {
		c[d] = p % ext[d];
		p /= ext[d];
	}
}

/* Chunk element offset of global coords g, or -1 if g is outside the chunk. */
static long long chunk_index(int rank, const uint64_t *g, const uint64_t *origin, const uint64_t *cshape)
{
	long long idx = 0;
	for (int d = 0; d < rank; d++) {
		if (g[d] < origin[d] || g[d] >= origin[d] + cshape[d])
			return -1;
		idx = idx * (long long)cshape[d] + (long long)(g[d] - origin[d]);
	}
	return idx;
}

static uint64_t model_copy(const ckpt_region *r, uint64_t e0, uint64_t e1, uint8_t *stream, uint8_t *chunk,
			   const uint64_t *origin, const uint64_t *cshape, size_t isz, int to_chunk)
{
	uint64_t ext[MAXR], c[MAXR], g[MAXR], n = 0;
	for (int d = 0; d < r->rank; d++)
		ext[d] = r->stop[d] - r->start[d];
	for (uint64_t p = e0; p < e1; p++) {
		coords_of(ext, r->rank, p, c);
		for (int d = 0; d < r->rank; d++)
			g[d] = r->start[d] + c[d];
		long long ci = chunk_index(r->rank, g, origin, cshape);
		if (ci < 0)
			continue;
		if (to_chunk)
			memcpy(chunk + (size_t)ci * isz, stream + (p - e0) * isz, isz);
		else
			memcpy(stream + (p - e0) * isz, chunk + (size_t)ci * isz, isz);
		n++;
	}
	return n;
}

static void model_bbox(const ckpt_region *r, uint64_t e0, uint64_t e1, ckpt_region *bb)
{
	uint64_t ext[MAXR], c[MAXR];
	bb->rank = r->rank;
	for (int d = 0; d < r->rank; d++) {
		ext[d] = r->stop[d] - r->start[d];
		bb->start[d] = UINT64_MAX;
		bb->stop[d] = 0;
	}
	for (uint64_t p = e0; p < e1; p++) {
		coords_of(ext, r->rank, p, c);
		for (int d = 0; d < r->rank; d++) {
			uint64_t g = r->start[d] + c[d];
			if (g < bb->start[d])
				bb->start[d] = g;
			if (g + 1 > bb->stop[d])
				bb->stop[d] = g + 1;
		}
	}
}

static void fill_random(uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)rnd();
}

static void test_copy_random(void)
{
	static const size_t isizes[] = { 1, 2, 3, 4, 8, 16 };
	int cases = 0, fold_cases = 0;

	for (int it = 0; it < 30000; it++) {
		int rank = (int)rnd_below(MAXR);
		uint64_t shape[MAXR], cshape[MAXR], origin[MAXR];
		size_t isz = isizes[rnd_below(6)];
		ckpt_region r;
		int fold_from = (rnd() & 1) ? (int)rnd_below((uint64_t)rank + 1) : rank;

		r.rank = rank;
		for (int d = 0; d < rank; d++) {
			shape[d] = 1 + rnd_below(7);
			cshape[d] = 1 + rnd_below(5);
			if (d >= fold_from) {
				/* trailing dims covered fully by region and chunk */
				r.start[d] = 0;
				r.stop[d] = shape[d];
				cshape[d] = shape[d];
				origin[d] = 0;
				continue;
			}
			r.start[d] = rnd_below(shape[d]);
			r.stop[d] = r.start[d] + 1 + rnd_below(shape[d] - r.start[d]);
			if (rnd() & 3) /* a grid chunk, possibly an edge chunk */
				origin[d] = cshape[d] * rnd_below((shape[d] + cshape[d] - 1) / cshape[d]);
			else /* arbitrary placement, may miss the region */
				origin[d] = rnd_below(shape[d] + 2);
		}
		uint64_t count;
		CHECK_EQ_INT(ckpt_region_count(&r, &count), 0);
		uint64_t e0 = rnd_below(count), e1 = e0 + 1 + rnd_below(count - e0);
		if (rnd() % 4 == 0) {
			e0 = 0;
			e1 = count;
		}
		uint64_t csize = 1;
		for (int d = 0; d < rank; d++)
			csize *= cshape[d];
		size_t sbytes = (size_t)(e1 - e0) * isz, cbytes = (size_t)csize * isz;
		uint8_t *chunk = malloc(cbytes), *chunk2 = malloc(cbytes);
		uint8_t *s1 = malloc(sbytes), *s2 = malloc(sbytes);

		/* chunk -> stream */
		fill_random(chunk, cbytes);
		fill_random(s1, sbytes);
		memcpy(s2, s1, sbytes);
		model_copy(&r, e0, e1, s1, chunk, origin, cshape, isz, 0);
		ckpt_copy_chunk_to_stream(&r, e0, e1, s2, chunk, origin, cshape, isz);
		int ok = memcmp(s1, s2, sbytes) == 0;

		/* stream -> chunk */
		fill_random(s1, sbytes);
		fill_random(chunk, cbytes);
		memcpy(chunk2, chunk, cbytes);
		uint64_t n1 = model_copy(&r, e0, e1, s1, chunk, origin, cshape, isz, 1);
		uint64_t n2 = ckpt_copy_stream_to_chunk(&r, e0, e1, s1, chunk2, origin, cshape, isz);
		ok &= n1 == n2 && memcmp(chunk, chunk2, cbytes) == 0;

		/* bounding box */
		ckpt_region bb1, bb2;
		model_bbox(&r, e0, e1, &bb1);
		ckpt_region_stream_bbox(&r, e0, e1, &bb2);
		ok &= region_is(&bb2, bb1.rank, bb1.start, bb1.stop);

		if (!ok) {
			char t[200];
			ckpt_slice_format(&r, t, sizeof(t));
			fprintf(stderr,
				"copy mismatch: rank %d region %s e0 %llu e1 %llu isz %zu origin/cshape:",
				rank, t, (unsigned long long)e0, (unsigned long long)e1, isz);
			for (int d = 0; d < rank; d++)
				fprintf(stderr, " %llu/%llu", (unsigned long long)origin[d],
					(unsigned long long)cshape[d]);
			fprintf(stderr, "\n");
		}
		CHECK(ok);
		cases++;
		fold_cases += fold_from < rank;
		free(chunk);
		free(chunk2);
		free(s1);
		free(s2);
	}
	printf("copy: %d random cases (%d with fully covered trailing dims)\n", cases, fold_cases);
}

/* Every chunk of a grid together writes each stream position exactly once. */
static void test_grid_coverage(void)
{
	for (int it = 0; it < 2000; it++) {
		int rank = 1 + (int)rnd_below(4);
		uint64_t shape[MAXR], cshape[MAXR], grid[MAXR], origin[MAXR], nchunks = 1;
		ckpt_region r;
		r.rank = rank;
		for (int d = 0; d < rank; d++) {
			shape[d] = 1 + rnd_below(9);
			cshape[d] = 1 + rnd_below(4);
			grid[d] = (shape[d] + cshape[d] - 1) / cshape[d];
			nchunks *= grid[d];
			r.start[d] = rnd_below(shape[d]);
			r.stop[d] = r.start[d] + 1 + rnd_below(shape[d] - r.start[d]);
		}
		uint64_t count, csize = 1;
		ckpt_region_count(&r, &count);
		for (int d = 0; d < rank; d++)
			csize *= cshape[d];
		uint64_t e0 = rnd_below(count), e1 = e0 + 1 + rnd_below(count - e0);
		uint16_t *stream = calloc(e1 - e0, 2), *chunk = malloc(csize * 2);
		uint64_t total = 0;
		for (uint64_t k = 0; k < nchunks; k++) {
			uint64_t rest = k;
			for (int d = rank - 1; d >= 0; d--) {
				origin[d] = (rest % grid[d]) * cshape[d];
				rest /= grid[d];
			}
			for (uint64_t i = 0; i < csize; i++)
				chunk[i] = 1;
			/* add 1 to every stream element the chunk covers */
			uint16_t *tmp = malloc((e1 - e0) * 2);
			memset(tmp, 0, (e1 - e0) * 2);
			ckpt_copy_chunk_to_stream(&r, e0, e1, (uint8_t *)tmp, (uint8_t *)chunk, origin,
						  cshape, 2);
			for (uint64_t i = 0; i < e1 - e0; i++)
				stream[i] = (uint16_t)(stream[i] + tmp[i]);
			free(tmp);
			total += ckpt_copy_stream_to_chunk(&r, e0, e1, (uint8_t *)stream, (uint8_t *)chunk,
							   origin, cshape, 2);
		}
		int ok = total == e1 - e0;
		for (uint64_t i = 0; i < e1 - e0; i++)
			ok &= stream[i] == 1;
		CHECK(ok);
		free(stream);
		free(chunk);
	}
}

static void test_copy_edges(void)
{
	/* rank 0: one element */
	ckpt_region r;
	uint8_t chunk[8] = { 1, 2, 3, 4, 5, 6, 7, 8 }, dst[8] = { 0 };
	r.rank = 0;
	ckpt_copy_chunk_to_stream(&r, 0, 1, dst, chunk, NULL, NULL, 8);
	CHECK(memcmp(dst, chunk, 8) == 0);
	memset(chunk, 0, 8);
	CHECK_EQ_INT(ckpt_copy_stream_to_chunk(&r, 0, 1, dst, chunk, NULL, NULL, 8), 1);
	CHECK(memcmp(dst, chunk, 8) == 0);

	/* invalid ranges are no-ops */
	uint64_t shape[] = { 4 }, origin[] = { 0 }, cs[] = { 4 };
	ckpt_region_full(&r, 1, shape);
	memset(dst, 0xAA, 8);
	CHECK_EQ_INT(ckpt_copy_stream_to_chunk(&r, 2, 2, dst, chunk, origin, cs, 1), 0);
	CHECK_EQ_INT(ckpt_copy_stream_to_chunk(&r, 3, 2, dst, chunk, origin, cs, 1), 0);
	CHECK_EQ_INT(ckpt_copy_stream_to_chunk(&r, 0, 5, dst, chunk, origin, cs, 1), 0);
	r.rank = CKPT_MAX_RANK + 1;
	CHECK_EQ_INT(ckpt_copy_stream_to_chunk(&r, 0, 1, dst, chunk, origin, cs, 1), 0);
	ckpt_region bb;
	ckpt_region_stream_bbox(&r, 0, 1, &bb);
	CHECK_EQ_INT(bb.rank, 0);

	/* huge coordinates: chunk near the end of a 2^64-ish dim */
	uint64_t o2[] = { UINT64_MAX - 10 }, c2[] = { 8 };
	r.rank = 1;
	r.start[0] = UINT64_MAX - 6;
	r.stop[0] = UINT64_MAX - 1;
	uint8_t big[8] = { 10, 11, 12, 13, 14, 15, 16, 17 }, out[5] = { 0 };
	ckpt_copy_chunk_to_stream(&r, 0, 5, out, big, o2, c2, 1);
	CHECK(out[0] == 14 && out[1] == 15 && out[2] == 16 && out[3] == 17 && out[4] == 0);
	/* chunk whose end overflows uint64: ignored */
	uint64_t o3[] = { UINT64_MAX - 2 };
	CHECK_EQ_INT(ckpt_copy_stream_to_chunk(&r, 0, 5, out, big, o3, c2, 1), 0);

	/* max rank: 12 unit dims, then 20 dims where the chunk has 2 and the
	 * region selects index 1; the element is the chunk's last one */
	ckpt_region m;
	uint64_t mo[CKPT_MAX_RANK], mc[CKPT_MAX_RANK];
	static uint8_t mchunk[1u << 20];
	m.rank = CKPT_MAX_RANK;
	for (int d = 0; d < CKPT_MAX_RANK; d++) {
		int unit = d < CKPT_MAX_RANK - 20;
		m.start[d] = unit ? 0 : 1;
		m.stop[d] = m.start[d] + 1;
		mo[d] = 0;
		mc[d] = unit ? 1 : 2;
	}
	mchunk[(1u << 20) - 1] = 0x5A;
	uint8_t one = 0;
	ckpt_copy_chunk_to_stream(&m, 0, 1, &one, mchunk, mo, mc, 1);
	CHECK_EQ_INT(one, 0x5A);
}

/* ---- micro-benchmark (printed, not asserted) ------------------------------- */

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void bench_one(const char *name, const uint64_t *shape, const uint64_t *cshape, const ckpt_region *r,
		      uint8_t *dst, uint8_t *chunk)
{
	uint64_t count, grid[2], origin[2];
	ckpt_region_count(r, &count);
	for (int d = 0; d < 2; d++)
		grid[d] = (shape[d] + cshape[d] - 1) / cshape[d];
	int reps = 3;
	double best = 1e9;
	for (int rep = 0; rep < reps; rep++) {
		double t0 = now_s();
		for (uint64_t i = 0; i < grid[0]; i++)
			for (uint64_t j = 0; j < grid[1]; j++) {
				origin[0] = i * cshape[0];
				origin[1] = j * cshape[1];
				ckpt_copy_chunk_to_stream(r, 0, count, dst, chunk, origin, cshape, 4);
			}
		double t = now_s() - t0;
		if (t < best)
			best = t;
	}
	printf("bench %-44s %6.1f ms  %7.2f GB/s\n", name, best * 1e3, (double)count * 4 / best / 1e9);
}

static void bench(void)
{
	uint8_t *dst = malloc(64u << 20), *chunk = malloc(4u << 20);
	if (!dst || !chunk) {
		printf("bench skipped (no memory)\n");
		free(dst);
		free(chunk);
		return;
	}
	memset(dst, 1, 64u << 20);
	memset(chunk, 2, 4u << 20);
	ckpt_region r;
	uint64_t a1[] = { 8192, 8192 }, c1[] = { 1024, 1024 };
	r.rank = 2;
	r.start[0] = 0, r.stop[0] = 4096, r.start[1] = 0, r.stop[1] = 4096;
	bench_one("f32 [0:4096,0:4096] of 8192^2, chunks 1024^2", a1, c1, &r, dst, chunk);
	r.start[0] = 100, r.stop[0] = 4196, r.start[1] = 37, r.stop[1] = 4133;
	bench_one("f32 [100:4196,37:4133], chunks 1024^2", a1, c1, &r, dst, chunk);
	uint64_t a2[] = { 4096, 4096 }, c2[] = { 256, 4096 };
	r.start[0] = 0, r.stop[0] = 4096, r.start[1] = 0, r.stop[1] = 4096;
	bench_one("f32 full 4096^2, chunks 256x4096 (folded)", a2, c2, &r, dst, chunk);
	uint64_t a3[] = { 16384, 8192 }, c3[] = { 8192, 128 };
	r.start[0] = 0, r.stop[0] = 2048, r.start[1] = 0, r.stop[1] = 8192;
	bench_one("f32 [0:2048] of 16384x8192, chunks 8192x128", a3, c3, &r, dst, chunk);
	free(dst);
	free(chunk);
}

int main(void)
{
	CHECK_RUN(test_parse);
	CHECK_RUN(test_parse_random);
	CHECK_RUN(test_format);
	CHECK_RUN(test_region_basics);
	CHECK_RUN(test_copy_edges);
	CHECK_RUN(test_copy_random);
	CHECK_RUN(test_grid_coverage);
	CHECK_RUN(bench);
	return CHECK_DONE();
}
