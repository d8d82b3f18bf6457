/*
 * test_npy.c - .npy headers: byte-exact against numpy (via /usr/bin/python3
 * when it has numpy; skipped with a note otherwise), hard-coded headers,
 * parsing of own and numpy-written headers, malformed and fuzzed input.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "npy.h"

#define PYTHON "/usr/bin/python3"

static uint64_t rng_state = 0x243F6A8885A308D3ull;

static uint64_t rnd(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545F4914F6CDD1Dull;
}

static uint64_t rnd_below(uint64_t n)
{
	return n ? rnd() % n : 0;
}

/* Parse from an exact-size heap copy so that AddressSanitizer sees any
 * read past the end. */
static int parse_copy(const void *buf, size_t len, ckpt_dtype hint, ckpt_npy_info *info, size_t *need)
{
	uint8_t *p = malloc(len ? len : 1);
	memcpy(p, buf, len);
	int rc = ckpt_npy_parse(p, len, hint, info, need);
	free(p);
	return rc;
}

/* A v1.0 header around dict text: padded with spaces to `total` bytes
 * (the last one '\n'); HEADER_LEN = total - 10. */
static size_t make_v1(uint8_t *out, const char *dict, size_t total)
{
	size_t dl = strlen(dict);
	memcpy(out, "\x93NUMPY\x01\x00", 8);
	out[8] = (uint8_t)((total - 10) & 0xff);
	out[9] = (uint8_t)((total - 10) >> 8);
	memcpy(out + 10, dict, dl);
	memset(out + 10 + dl, ' ', total - 11 - dl);
	out[total - 1] = '\n';
	return total;
}

/* Same with an explicit version byte and HEADER_LEN width. */
static size_t make_vn(uint8_t *out, int version, const char *dict)
{
	size_t dl = strlen(dict), prefix = version == 1 ? 10 : 12;
	memcpy(out, "\x93NUMPY", 6);
	out[6] = (uint8_t)version;
	out[7] = 0;
	if (version == 1) {
		out[8] = (uint8_t)(dl & 0xff);
		out[9] = (uint8_t)(dl >> 8);
	} else {
		ckpt_put_le32(out + 8, (uint32_t)dl);
	}
	memcpy(out + prefix, dict, dl);
	return prefix + dl;
}

/* ---- hard-coded headers ------------------------------------------------------ */

static void check_hdr(ckpt_dtype dt, int rank, const uint64_t *shape, const char *dict, size_t total)
{
	uint8_t want[CKPT_NPY_HEADER_MAX];
	char got[CKPT_NPY_HEADER_MAX];
	make_v1(want, dict, total);
	int n = ckpt_npy_header(dt, rank, shape, got, sizeof(got));
	CHECK_EQ_INT(n, (long long)total);
	CHECK(n == (int)total && memcmp(got, want, total) == 0);
	CHECK_EQ_INT(ckpt_npy_header(dt, rank, shape, got, total - 1), -ENOBUFS);
	CHECK_EQ_INT(ckpt_npy_header(dt, rank, shape, got, total), (long long)total);
}

static void test_hardcoded(void)
{
	char buf[CKPT_NPY_HEADER_MAX];
	uint64_t s23[] = { 2, 3 }, s5[] = { 5 }, big[] = { 4096, 11008 }, ones[10],
		 edge[] = { 1, 100000000000000000ull, 100000000000000000ull };
	for (int i = 0; i < 10; i++)
		ones[i] = 1;

	/* The spec's example, literally: 128 bytes. */
	int n = ckpt_npy_header(CKPT_DT_FLOAT32, 2, s23, buf, sizeof(buf));
	CHECK_EQ_INT(n, 128);
	static const char lit[] =
		"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
	CHECK(memcmp(buf, lit, sizeof(lit) - 1) == 0);
	CHECK(buf[127] == '\n' && buf[126] == ' ' && buf[sizeof(lit) - 1] == ' ');

	/* from numpy 1.24 np.save output */
	check_hdr(CKPT_DT_FLOAT32, 2, s23, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
		  128);
	check_hdr(CKPT_DT_FLOAT32, 0, NULL, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 128);
	check_hdr(CKPT_DT_FLOAT32, 1, s5, "{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }", 128);
	check_hdr(CKPT_DT_FLOAT16, 2, big,
		  "{'descr': '<f2', 'fortran_order': False, 'shape': (4096, 11008), }", 128);
	check_hdr(CKPT_DT_UINT8, 10, ones,
		  "{'descr': '|u1', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 1, 1, 1, 1), }", 128);
	check_hdr(CKPT_DT_BOOL, 1, (uint64_t[]){ 2 },
		  "{'descr': '|b1', 'fortran_order': False, 'shape': (2,), }", 128);
	check_hdr(CKPT_DT_COMPLEX128, 1, (uint64_t[]){ 0 },
		  "{'descr': '<c16', 'fortran_order': False, 'shape': (0,), }", 128);
	/* header text exactly aligned: numpy then pads a whole 64 bytes */
	check_hdr(CKPT_DT_COMPLEX128, 3, edge,
		  "{'descr': '<c16', 'fortran_order': False, 'shape': (1, 100000000000000000, "
		  "100000000000000000), }    ",
		  192);
	check_hdr(CKPT_DT_BFLOAT16, 1, (uint64_t[]){ 3 },
		  "{'descr': '<V2', 'fortran_order': False, 'shape': (3,), }", 128);
	check_hdr(CKPT_DT_F8_E4M3FN, 2, s23, "{'descr': '<V1', 'fortran_order': False, 'shape': (2, 3), }",
		  128);

	/* errors */
	CHECK_EQ_INT(ckpt_npy_header(CKPT_DT_INVALID, 1, s5, buf, sizeof(buf)), -EINVAL);
	CHECK_EQ_INT(ckpt_npy_header(CKPT_DT_COUNT, 1, s5, buf, sizeof(buf)), -EINVAL);
	CHECK_EQ_INT(ckpt_npy_header(CKPT_DT_FLOAT32, -1, s5, buf, sizeof(buf)), -EINVAL);
	CHECK_EQ_INT(ckpt_npy_header(CKPT_DT_FLOAT32, CKPT_MAX_RANK + 1, s5, buf, sizeof(buf)), -EINVAL);
	CHECK_EQ_INT(ckpt_npy_header(CKPT_DT_FLOAT32, 1, NULL, buf, sizeof(buf)), -EINVAL);
	CHECK_EQ_INT(ckpt_npy_header(CKPT_DT_FLOAT32, 1, (uint64_t[]){ (uint64_t)INT64_MAX + 1 }, buf,
				     sizeof(buf)),
		     -EOVERFLOW);
	CHECK_EQ_INT(ckpt_npy_header(CKPT_DT_FLOAT32, 1, s5, NULL, 0), -ENOBUFS);
	CHECK_EQ_INT(ckpt_npy_header(CKPT_DT_FLOAT32, 1, s5, buf, 0), -ENOBUFS);

	/* the documented bound holds for the longest possible header */
	uint64_t maxs[CKPT_MAX_RANK];
	for (int d = 0; d < CKPT_MAX_RANK; d++)
		maxs[d] = (uint64_t)INT64_MAX;
	for (int dt = 1; dt < CKPT_DT_COUNT; dt++) {
		n = ckpt_npy_header((ckpt_dtype)dt, CKPT_MAX_RANK, maxs, buf, sizeof(buf));
		CHECK(n > 0 && n <= CKPT_NPY_HEADER_MAX && n % 64 == 0);
		maxs[0] = 1; /* shortest first dim -> most growth padding */
		n = ckpt_npy_header((ckpt_dtype)dt, CKPT_MAX_RANK, maxs, buf, sizeof(buf));
		CHECK(n > 0 && n <= CKPT_NPY_HEADER_MAX && n % 64 == 0);
		maxs[0] = (uint64_t)INT64_MAX;
	}

	/* file size */
	uint64_t hl = 0, tot = 0;
	CHECK_EQ_INT(ckpt_npy_file_size(CKPT_DT_FLOAT32, 2, s23, &hl, &tot), 0);
	CHECK_EQ_INT(hl, 128);
	CHECK_EQ_INT(tot, 152);
	CHECK_EQ_INT(ckpt_npy_file_size(CKPT_DT_FLOAT16, 2, big, &hl, &tot), 0);
	CHECK_EQ_INT(tot, 90177664); /* np.save file size */
	CHECK_EQ_INT(ckpt_npy_file_size(CKPT_DT_COMPLEX128, 0, NULL, NULL, &tot), 0);
	CHECK_EQ_INT(tot, 144);
	CHECK_EQ_INT(ckpt_npy_file_size(CKPT_DT_FLOAT64, 2, (uint64_t[]){ 1ull << 62, 8 }, &hl, &tot),
		     -EOVERFLOW);
	CHECK_EQ_INT(
		ckpt_npy_file_size(CKPT_DT_FLOAT64, 2, (uint64_t[]){ 1ull << 62, 1ull << 62 }, &hl, &tot),
		-EOVERFLOW);
	CHECK_EQ_INT(ckpt_npy_file_size(CKPT_DT_UINT8, 1, (uint64_t[]){ (uint64_t)INT64_MAX }, &hl, &tot), 0);
	CHECK_EQ_INT(tot, (uint64_t)INT64_MAX + 128);
	CHECK_EQ_INT(ckpt_npy_file_size(CKPT_DT_INVALID, 1, s5, &hl, &tot), -EINVAL);

	/* a header can describe more bytes than a file can hold; parsing it fails */
	uint64_t huge2[] = { 1ull << 62, 1ull << 62 };
	ckpt_npy_info info;
	n = ckpt_npy_header(CKPT_DT_UINT8, 2, huge2, buf, sizeof(buf));
	CHECK_EQ_INT(n, 128);
	CHECK_EQ_INT(ckpt_npy_parse((const uint8_t *)buf, (size_t)n, CKPT_DT_INVALID, &info, NULL), -EINVAL);
	huge2[1] = 1;
	CHECK_EQ_INT(ckpt_npy_parse((const uint8_t *)buf, (size_t)n, CKPT_DT_INVALID, &info, NULL), -EINVAL);
	n = ckpt_npy_header(CKPT_DT_UINT8, 2, huge2, buf, sizeof(buf));
	CHECK_EQ_INT(ckpt_npy_parse((const uint8_t *)buf, (size_t)n, CKPT_DT_INVALID, &info, NULL), 0);
	CHECK_EQ_INT(info.nbytes, 1ull << 62);
}

/* ---- parsing ------------------------------------------------------------------ */

static int shape_is(const ckpt_npy_info *in, int rank, const uint64_t *shape)
{
	if (in->rank != rank)
		return 0;
	for (int d = 0; d < rank; d++)
		if (in->shape[d] != shape[d])
			return 0;
	return 1;
}

static void random_shape_any(int *rank, uint64_t *shape)
{
	*rank = (int)rnd_below(8);
	if (rnd_below(10) == 0)
		*rank = (int)rnd_below(CKPT_MAX_RANK + 1);
	for (int d = 0; d < *rank; d++) {
		int digits = 1 + (int)rnd_below(*rank > 3 ? 2 : 7);
		uint64_t lim = 1;
		for (int k = 0; k < digits; k++)
			lim *= 10;
		shape[d] = rnd_below(lim);
	}
}

/* A random shape whose .npy file size fits in int64 (what the parser
 * accepts); large dims and ranks up to CKPT_MAX_RANK included. */
static void random_shape(int *rank, uint64_t *shape)
{
	uint64_t total;
	do
		random_shape_any(rank, shape);
	while (ckpt_npy_file_size(CKPT_DT_COMPLEX128, *rank, shape, NULL, &total) ||
	       total > (uint64_t)INT64_MAX);
}

static void test_roundtrip(void)
{
	for (int it = 0; it < 3000; it++) {
		ckpt_dtype dt = (ckpt_dtype)(1 + rnd_below(CKPT_DT_COUNT - 1));
		int rank;
		uint64_t shape[CKPT_MAX_RANK], hl, tot;
		char buf[CKPT_NPY_HEADER_MAX];
		ckpt_npy_info info;
		size_t need = 0;

		random_shape(&rank, shape);
		int n = ckpt_npy_header(dt, rank, shape, buf, sizeof(buf));
		CHECK(n > 0 && n % 64 == 0);
		if (n <= 0)
			continue;
		CHECK_EQ_INT(ckpt_npy_file_size(dt, rank, shape, &hl, &tot), 0);
		CHECK_EQ_INT(hl, n);
		int rc = parse_copy(buf, (size_t)n, dt, &info, &need);
		CHECK_EQ_INT(rc, 0);
		if (rc == 0) {
			CHECK_EQ_INT(info.dtype, dt);
			CHECK(shape_is(&info, rank, shape));
			CHECK_EQ_INT(info.data_offset, n);
			CHECK_EQ_INT(info.fortran_order, 0);
			CHECK_EQ_INT(info.version, 1);
			CHECK_EQ_INT(info.nbytes + info.data_offset, tot);
		}
		/* void descrs need the hint */
		if (ckpt_dtype_get(dt)->kind == 'V') {
			CHECK_EQ_INT(parse_copy(buf, (size_t)n, CKPT_DT_INVALID, &info, NULL), -EINVAL);
			CHECK_EQ_INT(parse_copy(buf, (size_t)n, CKPT_DT_FLOAT32, &info, NULL), -EINVAL);
		} else {
			CHECK_EQ_INT(parse_copy(buf, (size_t)n, CKPT_DT_INVALID, &info, NULL), 0);
		}

		/* streaming: every prefix asks for more, and feeding what is asked
		 * for reaches the full header in at most three steps */
		for (size_t l = 0; l < (size_t)n; l += 1 + rnd_below(7)) {
			need = 0;
			CHECK_EQ_INT(parse_copy(buf, l, dt, &info, &need), -EAGAIN);
			CHECK(need > l && need <= (size_t)n + 2);
		}
		size_t l = 0;
		int steps = 0;
		while ((rc = parse_copy(buf, l, dt, &info, &need)) == -EAGAIN && steps < 5) {
			l = need;
			steps++;
		}
		CHECK_EQ_INT(rc, 0);
		CHECK(steps <= 3 && l == (size_t)n);
		/* trailing data after the header does not matter */
		char more[CKPT_NPY_HEADER_MAX + 16];
		memcpy(more, buf, (size_t)n);
		memset(more + n, 0xff, 16);
		CHECK_EQ_INT(parse_copy(more, (size_t)n + 16, dt, &info, NULL), 0);
		CHECK_EQ_INT(info.data_offset, n);
	}
}

struct variant {
	const char *dict;
	int rc;
	int rank;
	uint64_t d0;
};

static void test_variants(void)
{
	static const struct variant v[] = {
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 0, 2, 2 },
		{ "{'shape': (2, 3), 'fortran_order': False, 'descr': '<f4'}", 0, 2, 2 },
		{ "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (7,)}", 0, 1, 7 },
		{ "{'descr':'<f4','fortran_order':False,'shape':(2,3)}", 0, 2, 2 },
		{ "{'descr':'<f4','fortran_order':False,'shape':(2,3,),}", 0, 2, 2 },
		{ "  {\n\t'descr' : '<f4' ,\r\n 'fortran_order' : False ,'shape' : ( 4 , ) }\n\n", 0, 1, 4 },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': ( ), }", 0, 0, 0 },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3L), }", 0, 2, 2 },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': (0,), }", 0, 1, 0 },
		{ "{'descr': '|b1', 'fortran_order': False, 'shape': (9223372036854775000,), }", 0, 1,
		  9223372036854775000ull },
		{ "{'descr': '<c16', 'fortran_order': False, 'shape': (), }", 0, 0, 0 },
		/* Fortran order only where it equals C order */
		{ "{'descr': '<f4', 'fortran_order': True, 'shape': (5,), }", 0, 1, 5 },
		{ "{'descr': '<f4', 'fortran_order': True, 'shape': (1, 5, 1), }", 0, 3, 1 },
		{ "{'descr': '<f4', 'fortran_order': True, 'shape': (0, 5, 3), }", 0, 3, 0 },
		{ "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", -EINVAL, 0, 0 },
		/* malformed / unsupported */
		{ "", -EINVAL, 0, 0 },
		{ "{}", -EINVAL, 0, 0 },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': (5), }", -EINVAL, 0, 0 },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': [2, 3], }", -EINVAL, 0, 0 },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3) }}", -EINVAL, 0, 0 },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } x", -EINVAL, 0, 0 },
		{ "{'descr': '<f4', 'fortran_order': False}", -EINVAL, 0, 0 },
		{ "{'descr': '<f4', 'shape': (2,)}", -EINVAL, 0, 0 },
		{ "{'fortran_order': False, 'shape': (2,)}", -EINVAL, 0, 0 },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'extra': 1}", -EINVAL, 0, 0 },
		{ "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", -EINVAL, 0, 0 },
		{ "{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}", -EINVAL, 0, 0 },
		{ "{'descr': '<f4', 'fortran_order': false, 'shape': (2,)}", -EINVAL, 0, 0 },
		{ "{'descr': '<f4', 'fortran_order': Falsey, 'shape': (2,)}", -EINVAL, 0, 0 },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}", -EINVAL, 0, 0 },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': (+1,)}", -EINVAL, 0, 0 },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': (01,)}", -EINVAL, 0, 0 },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': (1.0,)}", -EINVAL, 0, 0 },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': (1e3,)}", -EINVAL, 0, 0 },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': (1_000,)}", -EINVAL, 0, 0 },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': (0x10,)}", -EINVAL, 0, 0 },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': (9223372036854775808,)}", -EINVAL, 0,
		  0 },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999,)}", -EINVAL, 0,
		  0 },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 4)}", -EINVAL, 0,
		  0 },
		{ "{'descr': '|u1', 'fortran_order': False, 'shape': (9223372036854775807,)}", -EINVAL, 0,
		  0 },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': (,)}", -EINVAL, 0, 0 },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': (2,,3)}", -EINVAL, 0, 0 },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': (2 3)}", -EINVAL, 0, 0 },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3}", -EINVAL, 0, 0 },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3),, }", -EINVAL, 0, 0 },
		{ "{'descr': '<f4' 'fortran_order': False, 'shape': (2, 3)}", -EINVAL, 0, 0 },
		{ "{'descr' '<f4', 'fortran_order': False, 'shape': (2, 3)}", -EINVAL, 0, 0 },
		{ "{'descr': '<f4\", 'fortran_order': False, 'shape': (2, 3)}", -EINVAL, 0, 0 },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)", -EINVAL, 0, 0 },
		{ "'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}", -EINVAL, 0, 0 },
		{ "{'descr': '>f4', 'fortran_order': False, 'shape': (2,)}", -EINVAL, 0, 0 },
		{ "{'descr': '|O', 'fortran_order': False, 'shape': (2,)}", -EINVAL, 0, 0 },
		{ "{'descr': '<U3', 'fortran_order': False, 'shape': (2,)}", -EINVAL, 0, 0 },
		{ "{'descr': '<M8[ns]', 'fortran_order': False, 'shape': (2,)}", -EINVAL, 0, 0 },
		{ "{'descr': [('a', '<f4'), ('b', '<i4')], 'fortran_order': False, 'shape': (2,)}", -EINVAL,
		  0, 0 },
		{ "{'descr': '<V2', 'fortran_order': False, 'shape': (2,)}", -EINVAL, 0, 0 }, /* hint is f4 */
		{ "{'descr': '<f\\x34', 'fortran_order': False, 'shape': (2,)}", -EINVAL, 0, 0 },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': "
		  "(1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,"
		  "1,1,1,1,1,1,1,1,1,1,1)}",
		  -EINVAL, 0, 0 },
		{ "{'descr': '<f4', 'fortran_order': False, 'shape': "
		  "(1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,"
		  "1,1,1,1,1,1,1,1,1,1)}",
		  0, 32, 1 },
	};
	uint8_t buf[1024];
	for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
		size_t len = make_vn(buf, 1, v[i].dict);
		ckpt_npy_info info;
		memset(&info, 0x55, sizeof(info));
		int rc = parse_copy(buf, len, CKPT_DT_FLOAT32, &info, NULL);
		if (rc != v[i].rc)
			fprintf(stderr, "variant %zu: %s -> %d\n", i, v[i].dict, rc);
		CHECK_EQ_INT(rc, v[i].rc);
		if (rc == 0 && v[i].rc == 0) {
			CHECK_EQ_INT(info.rank, v[i].rank);
			if (v[i].rank > 0)
				CHECK_EQ_INT(info.shape[0], v[i].d0);
			CHECK_EQ_INT(info.data_offset, len);
		}
	}

	ckpt_npy_info info;
	size_t len;

	/* a NUL byte after the closing brace */
	len = make_vn(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }");
	buf[len++] = 0;
	buf[8]++;
	CHECK_EQ_INT(parse_copy(buf, len, CKPT_DT_FLOAT32, &info, NULL), -EINVAL);
	buf[len - 1] = ' ';
	CHECK_EQ_INT(parse_copy(buf, len, CKPT_DT_FLOAT32, &info, NULL), 0);

	/* the Fortran flag is reported */
	len = make_vn(buf, 1, "{'descr': '<i8', 'fortran_order': True, 'shape': (5,), }");
	CHECK_EQ_INT(parse_copy(buf, len, CKPT_DT_INVALID, &info, NULL), 0);
	CHECK_EQ_INT(info.fortran_order, 1);
	CHECK_EQ_INT(info.dtype, CKPT_DT_INT64);
	CHECK_EQ_INT(info.nbytes, 40);

	/* hints: void only with the matching ml_dtypes size; others ignored */
	len = make_vn(buf, 1, "{'descr': '<V2', 'fortran_order': False, 'shape': (2,), }");
	CHECK_EQ_INT(parse_copy(buf, len, CKPT_DT_BFLOAT16, &info, NULL), 0);
	CHECK_EQ_INT(info.dtype, CKPT_DT_BFLOAT16);
	CHECK_EQ_INT(info.nbytes, 4);
	CHECK_EQ_INT(parse_copy(buf, len, CKPT_DT_F8_E5M2, &info, NULL), -EINVAL);
	CHECK_EQ_INT(parse_copy(buf, len, CKPT_DT_UINT16, &info, NULL), -EINVAL);
	len = make_vn(buf, 1, "{'descr': '|V1', 'fortran_order': False, 'shape': (2,), }");
	CHECK_EQ_INT(parse_copy(buf, len, CKPT_DT_F8_E5M2, &info, NULL), 0);
	CHECK_EQ_INT(info.dtype, CKPT_DT_F8_E5M2);
	len = make_vn(buf, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }");
	CHECK_EQ_INT(parse_copy(buf, len, CKPT_DT_BFLOAT16, &info, NULL), 0);
	CHECK_EQ_INT(info.dtype, CKPT_DT_FLOAT32);

	/* versions */
	const char *d = "{'descr': '<u2', 'fortran_order': False, 'shape': (3, 4), }";
	for (int ver = 1; ver <= 3; ver++) {
		len = make_vn(buf, ver, d);
		CHECK_EQ_INT(parse_copy(buf, len, CKPT_DT_INVALID, &info, NULL), 0);
		CHECK_EQ_INT(info.version, ver);
		CHECK_EQ_INT(info.data_offset, len);
		CHECK_EQ_INT(info.nelems, 12);
	}
	/* 'L' suffixes are Python 2 only (v1/v2) */
	len = make_vn(buf, 3, "{'descr': '<u2', 'fortran_order': False, 'shape': (3L, 4), }");
	CHECK_EQ_INT(parse_copy(buf, len, CKPT_DT_INVALID, &info, NULL), -EINVAL);
	len = make_vn(buf, 2, "{'descr': '<u2', 'fortran_order': False, 'shape': (3L, 4), }");
	CHECK_EQ_INT(parse_copy(buf, len, CKPT_DT_INVALID, &info, NULL), 0);
	/* bad versions and magic */
	len = make_vn(buf, 1, d);
	buf[7] = 1;
	CHECK_EQ_INT(parse_copy(buf, len, CKPT_DT_INVALID, &info, NULL), -EINVAL);
	for (int bad = 0; bad < 256; bad++) {
		if (bad >= 1 && bad <= 3)
			continue;
		len = make_vn(buf, 1, d);
		buf[6] = (uint8_t)bad;
		CHECK_EQ_INT(parse_copy(buf, len, CKPT_DT_INVALID, &info, NULL), -EINVAL);
	}
	for (int pos = 0; pos < 6; pos++) {
		len = make_vn(buf, 1, d);
		buf[pos] ^= 0x20;
		CHECK_EQ_INT(parse_copy(buf, len, CKPT_DT_INVALID, &info, NULL), -EINVAL);
		/* already visible in a short prefix */
		CHECK_EQ_INT(parse_copy(buf, pos + 1, CKPT_DT_INVALID, &info, NULL), -EINVAL);
	}
	/* HEADER_LEN beyond the sane bound fails without waiting for data */
	len = make_vn(buf, 2, d);
	ckpt_put_le32(buf + 8, CKPT_NPY_MAX_HLEN + 1);
	CHECK_EQ_INT(parse_copy(buf, 12, CKPT_DT_INVALID, &info, NULL), -EINVAL);
	ckpt_put_le32(buf + 8, 0xffffffffu);
	CHECK_EQ_INT(parse_copy(buf, 12, CKPT_DT_INVALID, &info, NULL), -EINVAL);
	ckpt_put_le32(buf + 8, CKPT_NPY_MAX_HLEN);
	size_t need = 0;
	CHECK_EQ_INT(parse_copy(buf, len, CKPT_DT_INVALID, &info, &need), -EAGAIN);
	CHECK_EQ_INT(need, 12 + CKPT_NPY_MAX_HLEN);
	/* a zero HEADER_LEN is just malformed */
	len = make_vn(buf, 1, "");
	CHECK_EQ_INT(parse_copy(buf, len, CKPT_DT_INVALID, &info, NULL), -EINVAL);
	/* NULL arguments */
	CHECK_EQ_INT(ckpt_npy_parse(NULL, 0, CKPT_DT_INVALID, &info, NULL), -EINVAL);
	CHECK_EQ_INT(ckpt_npy_parse(buf, len, CKPT_DT_INVALID, NULL, NULL), -EINVAL);
	/* a header longer than 64 KiB padded with spaces in v2 is refused */
	uint8_t *huge = malloc(70000);
	len = make_vn(huge, 2, d);
	memset(huge + len, ' ', 70000 - len);
	ckpt_put_le32(huge + 8, 70000 - 12);
	CHECK_EQ_INT(ckpt_npy_parse(huge, 70000, CKPT_DT_INVALID, &info, NULL), -EINVAL);
	/* but a 60000-byte one is fine */
	ckpt_put_le32(huge + 8, 60000 - 12);
	CHECK_EQ_INT(ckpt_npy_parse(huge, 60000, CKPT_DT_INVALID, &info, NULL), 0);
	CHECK_EQ_INT(info.data_offset, 60000);
	free(huge);
}

/* Mutated and random inputs: must return 0, -EAGAIN or -EINVAL, never
 * touch memory outside the buffer (run under ASan in the sanitize build),
 * and a success must describe a sane array. */
static void test_fuzz(void)
{
	int ok0 = 0, again = 0, inval = 0;
	for (int it = 0; it < 60000; it++) {
		uint8_t buf[CKPT_NPY_HEADER_MAX + 64];
		size_t len;
		ckpt_dtype dt = (ckpt_dtype)(1 + rnd_below(CKPT_DT_COUNT - 1));
		if (it % 10 == 9) {
			/* magic + version then random bytes */
			len = 10 + rnd_below(200);
			for (size_t i = 0; i < len; i++)
				buf[i] = (uint8_t)rnd();
			memcpy(buf, "\x93NUMPY", 6);
			buf[6] = (uint8_t)(1 + rnd_below(3));
			buf[7] = 0;
			buf[8] = (uint8_t)rnd_below(len);
			buf[9] = 0;
			if (buf[6] > 1)
				buf[10] = buf[11] = 0;
		} else {
			int rank;
			uint64_t shape[CKPT_MAX_RANK];
			random_shape(&rank, shape);
			int n = ckpt_npy_header(dt, rank, shape, (char *)buf, sizeof(buf));
			if (n <= 0)
				continue;
			len = (size_t)n;
			int muts = 1 + (int)rnd_below(4);
			for (int m = 0; m < muts; m++) {
				size_t pos = rnd_below(len);
				static const char tokens[] = "{}(),:'\" 0123456789-LTrueFalse<>|Vfi\n\t\\";
				switch (rnd_below(4)) {
				case 0:
					buf[pos] = (uint8_t)rnd();
					break;
				case 1:
					buf[pos] = (uint8_t)tokens[rnd_below(sizeof(tokens) - 1)];
					break;
				case 2: /* delete a byte (header length unchanged) */
					memmove(buf + pos, buf + pos + 1, len - pos - 1);
					buf[len - 1] = ' ';
					break;
				default:
					buf[pos] ^= (uint8_t)(1u << rnd_below(8));
					break;
				}
			}
			if (rnd_below(8) == 0)
				len = rnd_below(len + 1);
		}
		ckpt_npy_info info;
		size_t need = 0;
		int rc = parse_copy(buf, len, dt, &info, &need);
		if (rc == 0) {
			ok0++;
			int sane = info.rank >= 0 && info.rank <= CKPT_MAX_RANK && info.data_offset <= len &&
				   ckpt_dtype_get(info.dtype) != NULL && info.version >= 1 &&
				   info.version <= 3;
			uint64_t n = 1;
			for (int d = 0; d < info.rank && sane; d++)
				sane = info.shape[d] <= (uint64_t)INT64_MAX &&
				       !ckpt_mul_u64(n, info.shape[d], &n);
			sane = sane && n == info.nelems &&
			       info.nbytes == n * ckpt_dtype_get(info.dtype)->itemsize;
			CHECK(sane);
		} else if (rc == -EAGAIN) {
			again++;
			CHECK(need > len);
		} else {
			inval++;
			CHECK_EQ_INT(rc, -EINVAL);
		}
	}
	printf("fuzz: %d ok, %d need more, %d invalid\n", ok0, again, inval);
	CHECK(ok0 > 100 && again > 100 && inval > 1000);
}

/* ---- against numpy ----------------------------------------------------------- */

static int have_numpy(void)
{
	if (access(PYTHON, X_OK) != 0)
		return 0;
	FILE *f = popen(PYTHON " -c 'import numpy; print(\"ok\")' 2>/dev/null", "r");
	char line[16] = { 0 };
	if (!f)
		return 0;
	int ok = fgets(line, sizeof(line), f) != NULL && strncmp(line, "ok", 2) == 0;
	pclose(f);
	return ok;
}

static int hexval(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

/* Decode a hex line into out; returns the byte count or -1. */
static long unhex(const char *s, uint8_t *out, size_t cap)
{
	size_t n = 0;
	while (s[0] && s[0] != '\n') {
		int a = hexval(s[0]), b = s[1] ? hexval(s[1]) : -1;
		if (a < 0 || b < 0 || n >= cap)
			return -1;
		out[n++] = (uint8_t)(a << 4 | b);
		s += 2;
	}
	return (long)n;
}

/* Run a Python script (written to a temp file) and return its stdout. */
static FILE *run_python(const char *script, char *path, size_t cap)
{
	snprintf(path, cap, "/tmp/ckpt_test_npy_XXXXXX");
	int fd = mkstemp(path);
	if (fd < 0)
		return NULL;
	FILE *f = fdopen(fd, "w");
	fputs(script, f);
	fclose(f);
	char cmd[256];
	snprintf(cmd, sizeof(cmd), PYTHON " %s", path);
	return popen(cmd, "r");
}

#define NCASES 400

struct npcase {
	ckpt_dtype dt;
	int rank;
	uint64_t shape[CKPT_MAX_RANK];
};

static void test_numpy_headers(void)
{
	static struct npcase cases[NCASES];
	int nc = 0;
	uint64_t fixed[][4] = { { 0 },
				{ 5 },
				{ 2, 3 },
				{ 4096, 11008 },
				{ 1, 100000000000000000ull, 100000000000000000ull },
				{ 9223372036854775807ull },
				{ 0, 0 },
				{ 1 },
				{ 10 },
				{ 123456789 },
				{ 7, 0, 3 } };
	int fixed_rank[] = { 0, 1, 2, 2, 3, 1, 2, 1, 1, 1, 3 };

	/* every non-void dtype with the fixed shapes */
	for (int dt = 1; dt < CKPT_DT_COUNT; dt++) {
		if (ckpt_dtype_get((ckpt_dtype)dt)->kind == 'V')
			continue;
		for (size_t k = 0; k < sizeof(fixed_rank) / sizeof(fixed_rank[0]); k++) {
			cases[nc].dt = (ckpt_dtype)dt;
			cases[nc].rank = fixed_rank[k];
			memcpy(cases[nc].shape, fixed[k], sizeof(fixed[k]));
			nc++;
		}
	}
	/* (1,)*10, (1,)*32, (3,)*32 */
	for (int k = 0; k < 3; k++) {
		cases[nc].dt = CKPT_DT_INT16;
		cases[nc].rank = k == 0 ? 10 : 32;
		for (int d = 0; d < cases[nc].rank; d++)
			cases[nc].shape[d] = k == 2 ? 3 : 1;
		nc++;
	}
	/* random shapes (total size kept below 2^62 so numpy can build them) */
	while (nc < NCASES) {
		struct npcase *c = &cases[nc];
		do
			c->dt = (ckpt_dtype)(1 + rnd_below(CKPT_DT_COUNT - 1));
		while (ckpt_dtype_get(c->dt)->kind == 'V');
		random_shape(&c->rank, c->shape);
		uint64_t n = 1;
		int fits = 1;
		for (int d = 0; d < c->rank; d++)
			fits &= !ckpt_mul_u64(n, c->shape[d] ? c->shape[d] : 1, &n) && n < (1ull << 40);
		if (fits)
			nc++;
	}

	/* The script: np.save for small arrays, the same header writer with a
	 * zero-stride array's header data for big ones. */
	size_t cap = 1u << 20;
	char *script = malloc(cap);
	size_t pos = (size_t)snprintf(script, cap,
				      "import io, numpy as np, numpy.lib.format as fmt\n"
				      "cases = [\n");
	for (int i = 0; i < nc; i++) {
		pos += (size_t)snprintf(script + pos, cap - pos, "('%s', (",
					ckpt_dtype_get(cases[i].dt)->npy_descr);
		for (int d = 0; d < cases[i].rank; d++)
			pos += (size_t)snprintf(script + pos, cap - pos, "%llu,",
						(unsigned long long)cases[i].shape[d]);
		pos += (size_t)snprintf(script + pos, cap - pos, ")),\n");
	}
	CHECK(pos < cap / 2);
	snprintf(script + pos, cap - pos,
		 "]\n"
		 "for descr, shape in cases:\n"
		 "    dt = np.dtype(descr)\n"
		 "    b = io.BytesIO()\n"
		 "    if int(np.prod(shape, dtype=object)) * dt.itemsize <= 1 << 20:\n"
		 "        np.save(b, np.zeros(shape, dtype=dt))\n"
		 "    else:\n"
		 "        try:\n"
		 "            a = np.broadcast_to(np.zeros((), dtype=dt), shape)\n"
		 "            d = fmt.header_data_from_array_1_0(a)\n"
		 "        except Exception:\n"
		 "            d = {'descr': fmt.dtype_to_descr(dt), 'fortran_order': False, 'shape': shape}\n"
		 "        fmt.write_array_header_1_0(b, d)\n"
		 "    v = b.getvalue()\n"
		 "    print(v[:10 + (v[8] | v[9] << 8)].hex())\n");
	char path[64];
	FILE *f = run_python(script, path, sizeof(path));
	free(script);
	if (!f) {
		CHECK(0);
		return;
	}
	static char line[4 * CKPT_NPY_HEADER_MAX];
	int compared = 0;
	for (int i = 0; i < nc; i++) {
		uint8_t want[CKPT_NPY_HEADER_MAX * 2];
		char got[CKPT_NPY_HEADER_MAX];
		if (!fgets(line, sizeof(line), f))
			break;
		long wn = unhex(line, want, sizeof(want));
		int n = ckpt_npy_header(cases[i].dt, cases[i].rank, cases[i].shape, got, sizeof(got));
		int same = wn == n && memcmp(want, got, (size_t)n) == 0;
		if (!same)
			fprintf(stderr,
				"numpy header mismatch, case %d (%s rank %d): numpy %ld bytes, ours %d\n", i,
				ckpt_dtype_get(cases[i].dt)->npy_descr, cases[i].rank, wn, n);
		CHECK(same);
		compared++;
	}
	CHECK_EQ_INT(pclose(f), 0);
	unlink(path);
	CHECK_EQ_INT(compared, nc);
	printf("numpy: %d headers compared byte for byte\n", compared);
}

/* Files written here (our header + data) load with np.load, including the
 * void types; numpy reports dtype, shape and the data bytes. */
static void test_numpy_load(void)
{
	static const ckpt_dtype dts[] = { CKPT_DT_FLOAT32, CKPT_DT_BFLOAT16,   CKPT_DT_F8_E4M3FN,
					  CKPT_DT_INT4,	   CKPT_DT_COMPLEX128, CKPT_DT_BOOL,
					  CKPT_DT_UINT64 };
	static const uint64_t shape[] = { 2, 3 };
	const int nd = sizeof(dts) / sizeof(dts[0]);
	char paths[8][64];
	char script[4096];
	size_t pos = (size_t)snprintf(script, sizeof(script), "import numpy as np\n");
	uint8_t data[8][96];

	for (int i = 0; i < nd; i++) {
		char hdr[CKPT_NPY_HEADER_MAX];
		unsigned isz = ckpt_dtype_get(dts[i])->itemsize;
		int n = ckpt_npy_header(dts[i], 2, shape, hdr, sizeof(hdr));
		snprintf(paths[i], sizeof(paths[i]), "/tmp/ckpt_test_npy_load_XXXXXX");
		int fd = mkstemp(paths[i]);
		CHECK(fd >= 0 && n > 0);
		if (fd < 0 || n <= 0)
			return;
		for (unsigned k = 0; k < 6 * isz; k++)
			data[i][k] = dts[i] == CKPT_DT_BOOL ? (uint8_t)(k & 1) : (uint8_t)(k * 7 + 1);
		FILE *f = fdopen(fd, "wb");
		fwrite(hdr, 1, (size_t)n, f);
		fwrite(data[i], 1, 6 * isz, f);
		fclose(f);
		pos += (size_t)snprintf(script + pos, sizeof(script) - pos,
					"a = np.load('%s'); print(a.dtype.str, a.dtype.itemsize, a.shape, "
					"a.tobytes().hex())\n"
					"m = np.load('%s', mmap_mode='r'); print(m.tobytes().hex())\n",
					paths[i], paths[i]);
	}
	char spath[64];
	FILE *f = run_python(script, spath, sizeof(spath));
	CHECK(f != NULL);
	if (!f)
		return;
	for (int i = 0; i < nd; i++) {
		char line[512], descr[16], hex[256], hex2[256];
		unsigned isz = 0;
		char want_hex[256];
		if (!fgets(line, sizeof(line), f)) {
			CHECK(0);
			break;
		}
		int got = sscanf(line, "%15s %u (2, 3) %255s", descr, &isz, hex);
		CHECK_EQ_INT(got, 3);
		if (!fgets(line, sizeof(line), f) || sscanf(line, "%255s", hex2) != 1)
			hex2[0] = 0;
		const ckpt_dtype_info *di = ckpt_dtype_get(dts[i]);
		CHECK_EQ_INT(isz, di->itemsize);
		/* numpy reports plain void types as '|V2' */
		if (di->kind == 'V')
			CHECK(descr[0] == '|' && strcmp(descr + 1, di->npy_descr + 1) == 0);
		else
			CHECK(strcmp(descr, di->npy_descr) == 0);
		for (unsigned k = 0; k < 6 * di->itemsize; k++)
			sprintf(want_hex + 2 * k, "%02x", data[i][k]);
		CHECK(strcmp(hex, want_hex) == 0);
		CHECK(strcmp(hex2, want_hex) == 0);
	}
	CHECK_EQ_INT(pclose(f), 0);
	unlink(spath);
	for (int i = 0; i < nd; i++)
		unlink(paths[i]);
}

/* Headers numpy writes in every version parse to what numpy meant. */
static void test_numpy_parse(void)
{
	const char *script =
		"import io, numpy as np, numpy.lib.format as fmt\n"
		"def emit(a, ver, expect):\n"
		"    b = io.BytesIO()\n"
		"    fmt.write_array(b, a, version=ver, allow_pickle=True)\n"
		"    v = b.getvalue()\n"
		"    n = 10 + (v[8] | v[9] << 8) if ver == (1, 0) else 12 + int.from_bytes(v[8:12], "
		"'little')\n"
		"    print(expect, a.dtype.str, ver[0], n, len(a.shape), ','.join(map(str, a.shape)) or '-', "
		"v[:n].hex())\n"
		"for ver in [(1, 0), (2, 0), (3, 0)]:\n"
		"    for dt, shape in [('<f4', (2, 3)), ('<f8', ()), ('|u1', (5,)), ('<i8', (3, 0, 2)),\n"
		"                      ('<c8', (1, 1, 1, 1)), ('|b1', (7, 1)), ('<f2', (4096, 3))]:\n"
		"        emit(np.zeros(shape, dtype=dt), ver, 0)\n"
		"    emit(np.zeros((2, 3), dtype='<f4', order='F'), ver, 1)\n"
		"    emit(np.zeros((2, 3), dtype='>f4'), ver, 1)\n"
		"    emit(np.zeros((2,), dtype=[('a', '<f4'), ('b', '<i2')]), ver, 1)\n"
		"    emit(np.array([None, 1], dtype=object), ver, 1)\n"
		"    emit(np.zeros((2,), dtype='<U3'), ver, 1)\n"
		"    emit(np.zeros((2,), dtype='V2'), ver, 2)\n";
	char path[64];
	FILE *f = run_python(script, path, sizeof(path));
	CHECK(f != NULL);
	if (!f)
		return;
	static char line[8192];
	int seen = 0;
	while (fgets(line, sizeof(line), f)) {
		int expect, ver, rank, n;
		char descr[32], dims[512], hex[4096];
		uint8_t hdr[2048];
		if (sscanf(line, "%d %31s %d %d %d %511s %4095s", &expect, descr, &ver, &n, &rank, dims,
			   hex) != 7) {
			CHECK(0);
			continue;
		}
		long hn = unhex(hex, hdr, sizeof(hdr));
		CHECK_EQ_INT(hn, n);
		if (hn != n)
			continue;
		ckpt_npy_info info;
		size_t need = 0;
		/* void: only with a matching hint */
		ckpt_dtype hint = expect == 2 ? CKPT_DT_BFLOAT16 : CKPT_DT_INVALID;
		int rc = parse_copy(hdr, (size_t)n, hint, &info, &need);
		seen++;
		if (expect == 1) {
			if (rc != -EINVAL)
				fprintf(stderr, "numpy header accepted: %s v%d\n", descr, ver);
			CHECK_EQ_INT(rc, -EINVAL);
			continue;
		}
		CHECK_EQ_INT(rc, 0);
		if (rc)
			continue;
		CHECK_EQ_INT(info.version, ver);
		CHECK_EQ_INT(info.data_offset, n);
		CHECK_EQ_INT(info.rank, rank);
		if (expect == 2) {
			CHECK_EQ_INT(info.dtype, CKPT_DT_BFLOAT16);
			CHECK_EQ_INT(parse_copy(hdr, (size_t)n, CKPT_DT_INVALID, &info, NULL), -EINVAL);
		} else {
			CHECK(strcmp(ckpt_dtype_get(info.dtype)->npy_descr, descr) == 0);
		}
		char *p = dims;
		for (int d = 0; d < rank; d++) {
			CHECK_EQ_INT(info.shape[d], strtoull(p, &p, 10));
			if (*p == ',')
				p++;
		}
		/* streaming prefixes */
		for (size_t l = 0; l < (size_t)n; l++)
			CHECK_EQ_INT(parse_copy(hdr, l, hint, &info, &need), -EAGAIN);
	}
	CHECK_EQ_INT(pclose(f), 0);
	unlink(path);
	CHECK_EQ_INT(seen, 3 * 13);
	printf("numpy: %d numpy-written headers parsed\n", seen);
}

int main(void)
{
	CHECK_RUN(test_hardcoded);
	CHECK_RUN(test_roundtrip);
	CHECK_RUN(test_variants);
	CHECK_RUN(test_fuzz);
	if (have_numpy()) {
		CHECK_RUN(test_numpy_headers);
		CHECK_RUN(test_numpy_load);
		CHECK_RUN(test_numpy_parse);
	} else {
		printf("NOTE: %s with numpy not available; numpy comparisons skipped\n", PYTHON);
	}
	return CHECK_DONE();
}
