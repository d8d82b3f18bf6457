/*
 * test_safetensors.c - layout module: a small worked example (metadata
 * {"format":"pt"}, tensors "w" F32 [2,3] and "b" BF16 [3]) byte for byte,
 * the shipped params.safetensors fixture byte for byte
 * (header and, via the range mapping, the whole file), ordering, padding,
 * escaping, range mapping edge cases, sharding, input errors.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "check.h"
#include "common.h"
#include "safetensors.h"

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

/* Decode hex digits, skipping spaces; returns the byte count. */
static size_t unhex(const char *s, uint8_t *out, size_t cap)
{
	size_t n = 0;

	while (*s) {
		if (*s == ' ') {
			s++;
			continue;
		}
		if (n >= cap || hexval(s[0]) < 0 || hexval(s[1]) < 0)
			return 0;
		out[n++] = (uint8_t)(hexval(s[0]) << 4 | hexval(s[1]));
		s += 2;
	}
	return n;
}

/* The file the reference writer (huggingface/safetensors) makes for
 * __metadata__ {"format":"pt"}, "w" F32 [2,3] and "b" BF16 [3]: its first
 * 0x98 bytes (8 + N), i.e. N = 144 and the JSON header (no padding needed)
 * {"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2,3],
 * "data_offsets":[0,24]},"b":{"dtype":"BF16","shape":[3],"data_offsets":[24,30]}} */
static const char worked_hex[] = "9000 0000 0000 0000 7b22 5f5f 6d65 7461"
				 "6461 7461 5f5f 223a 7b22 666f 726d 6174"
				 "223a 2270 7422 7d2c 2277 223a 7b22 6474"
				 "7970 6522 3a22 4633 3222 2c22 7368 6170"
				 "6522 3a5b 322c 335d 2c22 6461 7461 5f6f"
				 "6666 7365 7473 223a 5b30 2c32 345d 7d2c"
				 "2262 223a 7b22 6474 7970 6522 3a22 4246"
				 "3136 222c 2273 6861 7065 223a 5b33 5d2c"
				 "2264 6174 615f 6f66 6673 6574 7322 3a5b"
				 "3234 2c33 305d 7d7d";

static void test_worked_example(void)
{
	static const uint64_t sw[] = { 2, 3 }, sb[] = { 3 };
	/* given in the "wrong" order on purpose: the writer reorders */
	const ckpt_st_tensor t[] = {
		{ "b", CKPT_DT_BFLOAT16, 1, sb },
		{ "w", CKPT_DT_FLOAT32, 2, sw },
	};
	const ckpt_st_meta m[] = { { "format", "pt" } };
	uint8_t want[256];
	size_t wn = unhex(worked_hex, want, sizeof(want)), hl = 0;
	ckpt_st_layout *l = NULL;
	ckpt_st_info info;

	CHECK_EQ_INT(wn, 152);
	CHECK_EQ_INT(ckpt_st_layout_create(t, 2, m, 1, 0, &l), 0);
	if (!l)
		return;
	const uint8_t *h = ckpt_st_layout_header(l, &hl);
	CHECK_EQ_INT(hl, 152);
	CHECK(hl == wn && memcmp(h, want, wn) == 0);
	CHECK_EQ_INT(ckpt_st_layout_file_size(l), 152 + 30);
	CHECK_EQ_INT(ckpt_st_layout_data_size(l), 30);
	CHECK_EQ_INT(ckpt_st_layout_count(l), 2);
	CHECK_EQ_INT(ckpt_st_layout_get(l, 0, &info), 0);
	CHECK(strcmp(info.name, "w") == 0);
	CHECK_EQ_INT(info.dtype, CKPT_DT_FLOAT32);
	CHECK_EQ_INT(info.rank, 2);
	CHECK(info.shape[0] == 2 && info.shape[1] == 3);
	CHECK_EQ_INT(info.data_begin, 0);
	CHECK_EQ_INT(info.file_offset, 152);
	CHECK_EQ_INT(info.nbytes, 24);
	CHECK_EQ_INT(info.input, 1);
	CHECK_EQ_INT(ckpt_st_layout_get(l, 1, &info), 0);
	CHECK(strcmp(info.name, "b") == 0);
	CHECK_EQ_INT(info.file_offset, 176);
	CHECK_EQ_INT(info.nbytes, 6);
	CHECK_EQ_INT(info.input, 0);
	CHECK_EQ_INT(ckpt_st_layout_get(l, 2, &info), -ERANGE);

	size_t idx = 99;
	CHECK_EQ_INT(ckpt_st_layout_find(l, "b", &idx), 0);
	CHECK_EQ_INT(idx, 1);
	CHECK_EQ_INT(ckpt_st_layout_find(l, "w", &idx), 0);
	CHECK_EQ_INT(idx, 0);
	CHECK_EQ_INT(ckpt_st_layout_find(l, "x", &idx), -ENOENT);
	CHECK_EQ_INT(ckpt_st_layout_find(l, "", &idx), -ENOENT);
	ckpt_st_layout_destroy(l);
}

/* ---- the shipped fixture ------------------------------------------------ */

static uint8_t *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf = NULL;
	long n;

	*len = 0;
	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
		buf = malloc((size_t)n + 1);
		if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
			free(buf);
			buf = NULL;
		} else if (buf) {
			*len = (size_t)n;
		}
	}
	fclose(f);
	return buf;
}

/* The tensors of params.safetensors (its header lists exactly these),
 * built from expected/expected.json; returns the count. */
#define FIX_MAX 16
struct fix_tensor {
	char name[128];
	ckpt_dtype dt;
	int rank;
	uint64_t shape[CKPT_MAX_RANK];
	uint8_t *data;
	size_t len;
};

static const char *const fixture_names[] = {
	"opt_state.mu.embedding",  "opt_state.nu.embedding",	 "params.embed.embedding",
	"params.final_norm.scale", "params.layer_0.attn.o_proj", "params.layer_0.attn.q_proj",
	"params.layer_0.mlp.b1",   "params.layer_0.mlp.w1",
};

static size_t load_fixture_tensors(struct fix_tensor *ft)
{
	size_t jl, n = 0;
	char *json = (char *)slurp(CKPT_FIXTURES "/expected/expected.json", &jl);
	cJSON *root;

	if (!json)
		return 0;
	json[jl] = '\0';
	root = cJSON_Parse(json);
	free(json);
	if (!root)
		return 0;
	for (size_t i = 0; i < sizeof(fixture_names) / sizeof(fixture_names[0]); i++) {
		cJSON *e = cJSON_GetObjectItemCaseSensitive(root, fixture_names[i]);
		cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
		cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
		cJSON *file = cJSON_GetObjectItemCaseSensitive(e, "file");
		cJSON *d;
		char path[512];

		if (!cJSON_IsString(dt) || !cJSON_IsArray(shape) || !cJSON_IsString(file))
			break;
		snprintf(ft[n].name, sizeof(ft[n].name), "%s", fixture_names[i]);
		ft[n].dt = ckpt_dtype_from_name(dt->valuestring);
		ft[n].rank = 0;
		cJSON_ArrayForEach(d, shape)
		{
			if (ft[n].rank < CKPT_MAX_RANK)
				ft[n].shape[ft[n].rank++] = (uint64_t)d->valuedouble;
		}
		snprintf(path, sizeof(path), "%s/expected/%s", CKPT_FIXTURES, file->valuestring);
		ft[n].data = slurp(path, &ft[n].len);
		if (!ft[n].data)
			break;
		n++;
	}
	cJSON_Delete(root);
	return n;
}

static void test_fixture(void)
{
	struct fix_tensor ft[FIX_MAX];
	ckpt_st_tensor t[FIX_MAX];
	size_t n = load_fixture_tensors(ft), flen = 0, hl;
	uint8_t *file = slurp(CKPT_FIXTURES "/params.safetensors", &flen);
	ckpt_st_layout *l = NULL;

	CHECK_EQ_INT(n, 8);
	CHECK(file != NULL);
	if (n != 8 || !file)
		goto out;
	/* present them in reverse order: the result must not depend on it */
	for (size_t i = 0; i < n; i++) {
		t[i].name = ft[n - 1 - i].name;
		t[i].dtype = ft[n - 1 - i].dt;
		t[i].rank = ft[n - 1 - i].rank;
		t[i].shape = ft[n - 1 - i].shape;
	}
	CHECK_EQ_INT(ckpt_st_layout_create(t, n, NULL, 0, 0, &l), 0);
	if (!l)
		goto out;
	const uint8_t *h = ckpt_st_layout_header(l, &hl);
	CHECK_EQ_INT(ckpt_st_layout_file_size(l), flen);
	CHECK(hl <= flen && memcmp(h, file, hl) == 0);

	/* Rebuild the whole file through the range mapping, in odd-sized
	 * reads with a small piece array, and compare byte for byte. */
	uint8_t *re = calloc(1, flen + 1);
	const size_t steps[] = { 1, 7, 100, 4096, 5000, 65536 };
	int bad = 0;

	for (size_t si = 0; re && si < sizeof(steps) / sizeof(steps[0]); si++) {
		memset(re, 0xAA, flen);
		for (uint64_t off = 0; off < flen;) {
			ckpt_st_piece p[2];
			ssize_t np = ckpt_st_layout_map(l, off, steps[si], p, 2);
			size_t got = 0;

			if (np <= 0) {
				bad++;
				break;
			}
			for (ssize_t k = 0; k < np; k++) {
				if (p[k].dst_off != got) {
					bad++;
					break;
				}
				if (p[k].tensor == CKPT_ST_PIECE_HEADER) {
					memcpy(re + off + p[k].dst_off, h + p[k].src_off, p[k].len);
				} else {
					const struct fix_tensor *src = &ft[n - 1 - p[k].input];

					if (p[k].src_off + p[k].len > src->len) {
						bad++;
						break;
					}
					memcpy(re + off + p[k].dst_off, src->data + p[k].src_off, p[k].len);
				}
				got += p[k].len;
			}
			if (got == 0)
				break;
			off += got;
		}
		if (memcmp(re, file, flen) != 0)
			bad++;
	}
	CHECK(re != NULL);
	CHECK_EQ_INT(bad, 0);
	free(re);
	ckpt_st_layout_destroy(l);
out:
	for (size_t i = 0; i < n; i++)
		free(ft[i].data);
	free(file);
}

/* ---- ordering, padding, 0-d / empty tensors ----------------------------- */

static void test_order(void)
{
	static const uint64_t s1[] = { 1 };
	const ckpt_st_tensor t[] = {
		{ "a_bool", CKPT_DT_BOOL, 1, s1 },	 { "a_u8", CKPT_DT_UINT8, 1, s1 },
		{ "z_i8", CKPT_DT_INT8, 1, s1 },	 { "a_f64", CKPT_DT_FLOAT64, 1, s1 },
		{ "b_i64", CKPT_DT_INT64, 1, s1 },	 { "c_u64", CKPT_DT_UINT64, 1, s1 },
		{ "a_c64", CKPT_DT_COMPLEX64, 1, s1 },	 { "a_i32", CKPT_DT_INT32, 1, s1 },
		{ "b_f32", CKPT_DT_FLOAT32, 1, s1 },	 { "a_u32", CKPT_DT_UINT32, 1, s1 },
		{ "a_bf16", CKPT_DT_BFLOAT16, 1, s1 },	 { "a_f16", CKPT_DT_FLOAT16, 1, s1 },
		{ "a_i16", CKPT_DT_INT16, 1, s1 },	 { "b_f32b", CKPT_DT_FLOAT32, 1, s1 },
		{ "a_e4m3", CKPT_DT_F8_E4M3FN, 1, s1 },	 { "a_e5m2", CKPT_DT_F8_E5M2, 1, s1 },
		{ "a_e8m0", CKPT_DT_F8_E8M0FNU, 1, s1 }, { "a_e4m3fnuz", CKPT_DT_F8_E4M3FNUZ, 1, s1 },
	};
	/* reference Dtype enum descending, then name */
	static const char *const want[] = {
		"c_u64", "b_i64", "a_f64",	"a_c64",  "b_f32",  "b_f32b", "a_u32", "a_i32", "a_bf16",
		"a_f16", "a_i16", "a_e4m3fnuz", "a_e8m0", "a_e4m3", "a_e5m2", "z_i8",  "a_u8",	"a_bool",
	};
	size_t n = sizeof(t) / sizeof(t[0]);
	ckpt_st_layout *l = NULL;
	ckpt_st_info info;
	uint64_t off = 0;

	CHECK_EQ_INT(ckpt_st_layout_create(t, n, NULL, 0, 0, &l), 0);
	if (!l)
		return;
	CHECK_EQ_INT(ckpt_st_layout_count(l), n);
	for (size_t i = 0; i < n; i++) {
		CHECK_EQ_INT(ckpt_st_layout_get(l, i, &info), 0);
		CHECK(strcmp(info.name, want[i]) == 0);
		CHECK_EQ_INT(info.data_begin, off);
		/* every tensor starts at a multiple of its own itemsize */
		CHECK_EQ_INT(info.file_offset % ckpt_dtype_get(info.dtype)->itemsize, 0);
		off += info.nbytes;
	}
	CHECK_EQ_INT(ckpt_st_layout_data_size(l), off);
	ckpt_st_layout_destroy(l);
}

/* Names of 1..24 characters cover every padding amount. */
static void test_padding(void)
{
	int seen[8] = { 0 };

	for (int len = 1; len <= 24; len++) {
		char name[32];
		static const uint64_t s[] = { 2 };
		ckpt_st_tensor t = { name, CKPT_DT_FLOAT32, 1, s };
		ckpt_st_layout *l = NULL;
		size_t hl;

		memset(name, 'x', (size_t)len);
		name[len] = '\0';
		CHECK_EQ_INT(ckpt_st_layout_create(&t, 1, NULL, 0, 0, &l), 0);
		if (!l)
			continue;
		const uint8_t *h = ckpt_st_layout_header(l, &hl);
		uint64_t nn = ckpt_le64(h);
		size_t j = hl;

		CHECK_EQ_INT(nn + 8, hl);
		CHECK_EQ_INT(nn % 8, 0);
		CHECK_EQ_INT(h[8], '{');
		while (j > 8 && h[j - 1] == ' ')
			j--;
		CHECK(j > 8 && h[j - 1] == '}');
		CHECK(hl - j < 8);
		seen[hl - j]++;
		/* the reference writer's JSON is exactly this */
		char want[96];
		int wl = snprintf(want, sizeof(want),
				  "{\"%s\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", name);
		CHECK_EQ_INT(wl, j - 8);
		CHECK(memcmp(h + 8, want, (size_t)wl) == 0);
		CHECK_EQ_INT(ckpt_st_layout_file_size(l), hl + 8);
		ckpt_st_layout_destroy(l);
	}
	for (int p = 0; p < 8; p++)
		CHECK(seen[p] > 0);
}

static void test_scalar_and_empty(void)
{
	static const uint64_t s0[] = { 0, 5 }, s3[] = { 3 };
	const ckpt_st_tensor t[] = {
		{ "count", CKPT_DT_INT32, 0, NULL },
		{ "empty", CKPT_DT_FLOAT32, 2, s0 },
		{ "v", CKPT_DT_FLOAT32, 1, s3 },
	};
	ckpt_st_layout *l = NULL;
	ckpt_st_info info;
	size_t hl;

	CHECK_EQ_INT(ckpt_st_layout_create(t, 3, NULL, 0, 0, &l), 0);
	if (!l)
		return;
	const char *h = (const char *)ckpt_st_layout_header(l, &hl);
	/* F32 before I32 (enum order), names: empty < v */
	const char *want = "{\"empty\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[0,0]},"
			   "\"v\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]},"
			   "\"count\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[12,16]}}";
	CHECK(hl >= 8 + strlen(want) && memcmp(h + 8, want, strlen(want)) == 0);
	CHECK_EQ_INT(ckpt_st_layout_file_size(l), hl + 16);
	CHECK_EQ_INT(ckpt_st_layout_get(l, 0, &info), 0);
	CHECK_EQ_INT(info.nbytes, 0);
	CHECK_EQ_INT(ckpt_st_layout_get(l, 2, &info), 0);
	CHECK_EQ_INT(info.rank, 0);
	CHECK_EQ_INT(info.nbytes, 4);
	CHECK_EQ_INT(info.input, 0);

	/* A read over the whole data: the empty tensor gives no piece. */
	ckpt_st_piece p[8];
	ssize_t np = ckpt_st_layout_map(l, hl, 100, p, 8);
	CHECK_EQ_INT(np, 2);
	if (np == 2) {
		CHECK_EQ_INT(p[0].tensor, 1);
		CHECK_EQ_INT(p[0].input, 2);
		CHECK_EQ_INT(p[0].len, 12);
		CHECK_EQ_INT(p[1].tensor, 2);
		CHECK_EQ_INT(p[1].dst_off, 12);
		CHECK_EQ_INT(p[1].len, 4);
	}
	ckpt_st_layout_destroy(l);

	/* no tensors at all: "{}" padded, like the reference writer */
	CHECK_EQ_INT(ckpt_st_layout_create(NULL, 0, NULL, 0, 0, &l), 0);
	if (l) {
		const uint8_t *e = ckpt_st_layout_header(l, &hl);
		CHECK_EQ_INT(hl, 16);
		CHECK(memcmp(e, "\x08\0\0\0\0\0\0\0{}      ", 16) == 0);
		CHECK_EQ_INT(ckpt_st_layout_file_size(l), 16);
		CHECK_EQ_INT(ckpt_st_layout_map(l, 0, 100, p, 8), 1);
		CHECK_EQ_INT(ckpt_st_layout_map(l, 16, 100, p, 8), 0);
		ckpt_st_layout_destroy(l);
	}
}

/* ---- range mapping ------------------------------------------------------ */

static void test_map_edges(void)
{
	static const uint64_t sa[] = { 4 }, sb[] = { 0 }, sc[] = { 2, 2 };
	const ckpt_st_tensor t[] = {
		{ "a", CKPT_DT_FLOAT32, 1, sa }, /* 16 bytes at 0 */
		{ "b", CKPT_DT_FLOAT32, 1, sb }, /* 0 bytes at 16 */
		{ "c", CKPT_DT_FLOAT32, 2, sc }, /* 16 bytes at 16 */
	};
	ckpt_st_layout *l = NULL;
	ckpt_st_piece p[8];
	size_t hl;
	ssize_t np;

	CHECK_EQ_INT(ckpt_st_layout_create(t, 3, NULL, 0, 0, &l), 0);
	if (!l)
		return;
	ckpt_st_layout_header(l, &hl);
	uint64_t fs = ckpt_st_layout_file_size(l);
	CHECK_EQ_INT(fs, hl + 32);

	/* inside the header */
	np = ckpt_st_layout_map(l, 3, 5, p, 8);
	CHECK_EQ_INT(np, 1);
	CHECK(p[0].tensor == CKPT_ST_PIECE_HEADER && p[0].src_off == 3 && p[0].len == 5 && p[0].dst_off == 0);
	CHECK(p[0].input == CKPT_ST_PIECE_HEADER);

	/* header tail + start of a */
	np = ckpt_st_layout_map(l, hl - 2, 6, p, 8);
	CHECK_EQ_INT(np, 2);
	CHECK(p[0].tensor == CKPT_ST_PIECE_HEADER && p[0].src_off == hl - 2 && p[0].len == 2);
	CHECK(p[1].tensor == 0 && p[1].src_off == 0 && p[1].len == 4 && p[1].dst_off == 2);

	/* exactly tensor a */
	np = ckpt_st_layout_map(l, hl, 16, p, 8);
	CHECK_EQ_INT(np, 1);
	CHECK(p[0].tensor == 0 && p[0].src_off == 0 && p[0].len == 16);

	/* end of a, over empty b, into c */
	np = ckpt_st_layout_map(l, hl + 15, 3, p, 8);
	CHECK_EQ_INT(np, 2);
	CHECK(p[0].tensor == 0 && p[0].src_off == 15 && p[0].len == 1);
	CHECK(p[1].tensor == 2 && p[1].input == 2 && p[1].src_off == 0 && p[1].len == 2 && p[1].dst_off == 1);

	/* starting exactly where b (empty) and c begin: c, never b */
	np = ckpt_st_layout_map(l, hl + 16, 1, p, 8);
	CHECK_EQ_INT(np, 1);
	CHECK(p[0].tensor == 2 && p[0].src_off == 0 && p[0].len == 1);

	/* middle of c, clamped at EOF */
	np = ckpt_st_layout_map(l, hl + 20, 1000, p, 8);
	CHECK_EQ_INT(np, 1);
	CHECK(p[0].tensor == 2 && p[0].src_off == 4 && p[0].len == 12);

	/* last byte */
	np = ckpt_st_layout_map(l, fs - 1, 1, p, 8);
	CHECK_EQ_INT(np, 1);
	CHECK(p[0].tensor == 2 && p[0].src_off == 15 && p[0].len == 1);

	/* at / past EOF, empty reads */
	CHECK_EQ_INT(ckpt_st_layout_map(l, fs, 10, p, 8), 0);
	CHECK_EQ_INT(ckpt_st_layout_map(l, fs + 100, 10, p, 8), 0);
	CHECK_EQ_INT(ckpt_st_layout_map(l, UINT64_MAX, SIZE_MAX, p, 8), 0);
	CHECK_EQ_INT(ckpt_st_layout_map(l, 0, 0, p, 8), 0);
	/* off + len wraps: clamped to EOF */
	np = ckpt_st_layout_map(l, hl + 30, SIZE_MAX, p, 8);
	CHECK_EQ_INT(np, 1);
	CHECK(p[0].len == 2 && p[0].src_off == 14);

	/* whole file at once */
	np = ckpt_st_layout_map(l, 0, (size_t)fs, p, 8);
	CHECK_EQ_INT(np, 3);
	CHECK(np == 3 && p[0].len == hl && p[1].len == 16 && p[2].len == 16 && p[2].dst_off == hl + 16);

	/* cap: only the first pieces, continue after them */
	np = ckpt_st_layout_map(l, 0, (size_t)fs, p, 1);
	CHECK_EQ_INT(np, 1);
	CHECK(p[0].tensor == CKPT_ST_PIECE_HEADER && p[0].len == hl);
	np = ckpt_st_layout_map(l, hl, (size_t)fs, p, 1);
	CHECK_EQ_INT(np, 1);
	CHECK(p[0].tensor == 0 && p[0].len == 16);
	CHECK_EQ_INT(ckpt_st_layout_map(l, 0, 10, p, 0), -EINVAL);
	CHECK_EQ_INT(ckpt_st_layout_map(l, 0, 10, NULL, 4), -EINVAL);
	CHECK_EQ_INT(ckpt_st_layout_map(l, fs, 10, NULL, 0), 0);
	ckpt_st_layout_destroy(l);
}

/* Random tensor sets and ranges, checked against a per-byte oracle. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
	return check_rnd(&rng_state);
}

static void test_map_random(void)
{
	static const ckpt_dtype dts[] = { CKPT_DT_BOOL,	   CKPT_DT_INT16,    CKPT_DT_FLOAT32,
					  CKPT_DT_FLOAT64, CKPT_DT_BFLOAT16, CKPT_DT_UINT8 };
	int bad = 0;

	for (int round = 0; round < 200; round++) {
		ckpt_st_tensor t[12];
		uint64_t shapes[12][3];
		char names[12][16];
		size_t n = 1 + rnd() % 12, hl;
		ckpt_st_layout *l = NULL;

		for (size_t i = 0; i < n; i++) {
			snprintf(names[i], sizeof(names[i]), "t%zu", (size_t)(rnd() % 1000) * 12 + i);
			t[i].name = names[i];
			t[i].dtype = dts[rnd() % 6];
			t[i].rank = (int)(rnd() % 4);
			for (int d = 0; d < t[i].rank; d++)
				shapes[i][d] = rnd() % 5; /* zeros included */
			t[i].shape = shapes[i];
		}
		if (ckpt_st_layout_create(t, n, NULL, 0, 0, &l) != 0) {
			bad++;
			continue;
		}
		ckpt_st_layout_header(l, &hl);
		uint64_t fs = ckpt_st_layout_file_size(l);
		/* oracle: owner (tensor index or -1 header) and offset per byte */
		long *own = malloc(fs * sizeof(*own));
		uint64_t *at = malloc(fs * sizeof(*at));
		if (!own || !at) {
			free(own);
			free(at);
			ckpt_st_layout_destroy(l);
			bad++;
			continue;
		}
		for (uint64_t b = 0; b < hl; b++) {
			own[b] = -1;
			at[b] = b;
		}
		uint64_t pos = hl;
		for (size_t i = 0; i < ckpt_st_layout_count(l); i++) {
			ckpt_st_info info;

			ckpt_st_layout_get(l, i, &info);
			if (info.file_offset != pos)
				bad++;
			for (uint64_t b = 0; b < info.nbytes; b++) {
				own[pos + b] = (long)i;
				at[pos + b] = b;
			}
			pos += info.nbytes;
		}
		if (pos != fs)
			bad++;
		for (int q = 0; q < 50 && !bad; q++) {
			uint64_t off = rnd() % (fs + 10);
			size_t len = (size_t)(rnd() % (fs + 10));
			size_t cap = 1 + rnd() % 4;
			ckpt_st_piece p[4];
			ssize_t np = ckpt_st_layout_map(l, off, len, p, cap);
			uint64_t want = off >= fs ? 0 : (fs - off < len ? fs - off : len);
			size_t got = 0;

			if (np < 0 || (size_t)np > cap || (want && np == 0) || (!want && np != 0)) {
				bad++;
				break;
			}
			for (ssize_t k = 0; k < np; k++) {
				long owner = p[k].tensor == CKPT_ST_PIECE_HEADER ? -1 : (long)p[k].tensor;

				if (p[k].dst_off != got || p[k].len == 0) {
					bad++;
					break;
				}
				for (size_t b = 0; b < p[k].len; b++) {
					uint64_t fo = off + got + b;

					if (fo >= fs || own[fo] != owner || at[fo] != p[k].src_off + b) {
						bad++;
						break;
					}
				}
				got += p[k].len;
			}
			/* fully covered unless the piece array ran out */
			if ((size_t)np < cap && got != want)
				bad++;
		}
		free(own);
		free(at);
		ckpt_st_layout_destroy(l);
	}
	CHECK_EQ_INT(bad, 0);
}

/* ---- escaping, UTF-8 ---------------------------------------------------- */

static void test_escape(void)
{
	char buf[64];

	CHECK_EQ_INT(ckpt_st_json_escape("a\"b\\c", buf, sizeof(buf)), 7);
	CHECK(strcmp(buf, "a\\\"b\\\\c") == 0);
	CHECK_EQ_INT(ckpt_st_json_escape("\n\t\r\b\f", buf, sizeof(buf)), 10);
	CHECK(strcmp(buf, "\\n\\t\\r\\b\\f") == 0);
	CHECK_EQ_INT(ckpt_st_json_escape("\x01\x1f\x7f", buf, sizeof(buf)), 13);
	CHECK(strcmp(buf, "\\u0001\\u001f\x7f") == 0);
	CHECK_EQ_INT(ckpt_st_json_escape("caf\xc3\xa9/x", buf, sizeof(buf)), 7);
	CHECK(strcmp(buf, "caf\xc3\xa9/x") == 0);
	/* truncation, snprintf style */
	CHECK_EQ_INT(ckpt_st_json_escape("a\"b", buf, 3), 4);
	CHECK(strcmp(buf, "a\\") == 0);
	CHECK_EQ_INT(ckpt_st_json_escape("abc", NULL, 0), 3);
	CHECK_EQ_INT(ckpt_st_json_escape("", buf, sizeof(buf)), 0);
	CHECK(buf[0] == '\0');

	CHECK(ckpt_st_utf8_valid("plain.ascii"));
	CHECK(ckpt_st_utf8_valid("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"));
	CHECK(!ckpt_st_utf8_valid("\xc3")); /* truncated */
	CHECK(!ckpt_st_utf8_valid("\xc0\xaf")); /* overlong */
	CHECK(!ckpt_st_utf8_valid("\xe0\x80\xaf")); /* overlong */
	CHECK(!ckpt_st_utf8_valid("\xed\xa0\x80")); /* surrogate */
	CHECK(!ckpt_st_utf8_valid("\xf4\x90\x80\x80")); /* > U+10FFFF */
	CHECK(!ckpt_st_utf8_valid("\xff"));
	CHECK(!ckpt_st_utf8_valid("\x80"));

	/* names and metadata go through the escaper into valid JSON */
	static const uint64_t s[] = { 1 };
	const ckpt_st_tensor t[] = {
		{ "we\"ird\\na\nme\x01", CKPT_DT_FLOAT32, 1, s },
		{ "caf\xc3\xa9", CKPT_DT_FLOAT32, 1, s },
	};
	const ckpt_st_meta m[] = { { "format", "pt" }, { "no\"te", "line1\nline2\\" } };
	ckpt_st_layout *l = NULL;
	size_t hl;

	CHECK_EQ_INT(ckpt_st_layout_create(t, 2, m, 2, 0, &l), 0);
	if (!l)
		return;
	const char *h = (const char *)ckpt_st_layout_header(l, &hl);
	char *json = strndup(h + 8, hl - 8);
	const char *want = "{\"__metadata__\":{\"format\":\"pt\",\"no\\\"te\":\"line1\\nline2\\\\\"},"
			   "\"caf\xc3\xa9\":{";
	CHECK(json && strncmp(json, want, strlen(want)) == 0);
	CHECK(json && strstr(json, "\"we\\\"ird\\\\na\\nme\\u0001\":{") != NULL);
	cJSON *root = json ? cJSON_Parse(json) : NULL;
	CHECK(root != NULL);
	if (root) {
		cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "we\"ird\\na\nme\x01");
		cJSON *md = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
		cJSON *note = cJSON_GetObjectItemCaseSensitive(md, "no\"te");

		CHECK(cJSON_IsObject(e));
		CHECK(cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(root, "caf\xc3\xa9")));
		CHECK(cJSON_IsString(note) && strcmp(note->valuestring, "line1\nline2\\") == 0);
		cJSON_Delete(root);
	}
	free(json);
	ckpt_st_layout_destroy(l);
}

/* ---- input errors ------------------------------------------------------- */

static void test_errors(void)
{
	static const uint64_t s[] = { 4 }, huge[] = { 1ull << 40, 1ull << 40 }, big61[] = { 1ull << 61 },
			      zero_then_big[] = { 0, 1ull << 62, 1ull << 62 },
			      big_then_zero[] = { 1ull << 62, 8, 0 };
	ckpt_st_layout *l = (ckpt_st_layout *)&l; /* must stay untouched on failure */
	ckpt_st_layout *keep = l;
	const ckpt_st_meta m_ok[] = { { "format", "pt" } };

	const ckpt_st_tensor dup[] = { { "a", CKPT_DT_FLOAT32, 1, s }, { "a", CKPT_DT_INT8, 1, s } };
	CHECK_EQ_INT(ckpt_st_layout_create(dup, 2, NULL, 0, 0, &l), -EINVAL);
	const ckpt_st_tensor reserved[] = { { "__metadata__", CKPT_DT_FLOAT32, 1, s } };
	CHECK_EQ_INT(ckpt_st_layout_create(reserved, 1, NULL, 0, 0, &l), -EINVAL);
	const ckpt_st_tensor badutf[] = { { "x\xff", CKPT_DT_FLOAT32, 1, s } };
	CHECK_EQ_INT(ckpt_st_layout_create(badutf, 1, NULL, 0, 0, &l), -EINVAL);
	const ckpt_st_tensor noname[] = { { NULL, CKPT_DT_FLOAT32, 1, s } };
	CHECK_EQ_INT(ckpt_st_layout_create(noname, 1, NULL, 0, 0, &l), -EINVAL);
	const ckpt_st_tensor badrank[] = { { "r", CKPT_DT_FLOAT32, CKPT_MAX_RANK + 1, s } };
	CHECK_EQ_INT(ckpt_st_layout_create(badrank, 1, NULL, 0, 0, &l), -EINVAL);
	const ckpt_st_tensor noshape[] = { { "r", CKPT_DT_FLOAT32, 2, NULL } };
	CHECK_EQ_INT(ckpt_st_layout_create(noshape, 1, NULL, 0, 0, &l), -EINVAL);
	const ckpt_st_tensor baddt[] = { { "r", CKPT_DT_INVALID, 1, s } };
	CHECK_EQ_INT(ckpt_st_layout_create(baddt, 1, NULL, 0, 0, &l), -EINVAL);
	const ckpt_st_tensor ov[] = { { "o", CKPT_DT_UINT8, 2, huge } };
	CHECK_EQ_INT(ckpt_st_layout_create(ov, 1, NULL, 0, 0, &l), -EOVERFLOW);
	/* 2^61 float32 = 2^63 bytes fits u64, but the bit count does not:
	 * the reader fails it (ValidationOverflow), so do we */
	const ckpt_st_tensor ov2[] = { { "o", CKPT_DT_FLOAT32, 1, big61 } };
	CHECK_EQ_INT(ckpt_st_layout_create(ov2, 1, NULL, 0, 0, &l), -EOVERFLOW);
	/* the reader multiplies dims in order: an early 0 stops the overflow */
	const ckpt_st_tensor ov3[] = { { "o", CKPT_DT_FLOAT32, 3, big_then_zero } };
	CHECK_EQ_INT(ckpt_st_layout_create(ov3, 1, NULL, 0, 0, &l), -EOVERFLOW);
	const ckpt_st_tensor ok0[] = { { "o", CKPT_DT_FLOAT32, 3, zero_then_big } };
	ckpt_st_layout *l0 = NULL;
	CHECK_EQ_INT(ckpt_st_layout_create(ok0, 1, NULL, 0, 0, &l0), 0);
	ckpt_st_layout_destroy(l0);
	l0 = NULL;
	/* nine tensors of 2^61 - 1 bytes each: each fine, the sum overflows */
	static const uint64_t b61[] = { (1ull << 61) - 1 };
	ckpt_st_tensor nine[9];
	char nn[9][4];
	for (int i = 0; i < 9; i++) {
		snprintf(nn[i], sizeof(nn[i]), "t%d", i);
		nine[i] = (ckpt_st_tensor){ nn[i], CKPT_DT_UINT8, 1, b61 };
	}
	l0 = NULL;
	CHECK_EQ_INT(ckpt_st_layout_create(nine, 7, NULL, 0, 0, &l0), 0);
	ckpt_st_layout_destroy(l0);
	/* 8 of them: the data fits u64, data + header does not */
	CHECK_EQ_INT(ckpt_st_layout_create(nine, 8, NULL, 0, 0, &l), -EOVERFLOW);
	CHECK_EQ_INT(ckpt_st_layout_create(nine, 9, NULL, 0, 0, &l), -EOVERFLOW);

	const ckpt_st_meta mdup[] = { { "format", "pt" }, { "format", "tf" } };
	const ckpt_st_tensor one[] = { { "a", CKPT_DT_FLOAT32, 1, s } };
	CHECK_EQ_INT(ckpt_st_layout_create(one, 1, mdup, 2, 0, &l), -EINVAL);
	const ckpt_st_meta mbad[] = { { "format", "p\xc3" } };
	CHECK_EQ_INT(ckpt_st_layout_create(one, 1, mbad, 1, 0, &l), -EINVAL);
	const ckpt_st_meta mnull[] = { { "format", NULL } };
	CHECK_EQ_INT(ckpt_st_layout_create(one, 1, mnull, 1, 0, &l), -EINVAL);
	CHECK_EQ_INT(ckpt_st_layout_create(one, 1, NULL, 1, 0, &l), -EINVAL);
	CHECK_EQ_INT(ckpt_st_layout_create(NULL, 1, m_ok, 1, 0, &l), -EINVAL);
	CHECK_EQ_INT(ckpt_st_layout_create(one, 1, m_ok, 1, 0, NULL), -EINVAL);

	/* dtype without a safetensors code: fail, or skip on request */
	const ckpt_st_tensor uns[] = {
		{ "a", CKPT_DT_FLOAT32, 1, s },
		{ "q4", CKPT_DT_INT4, 1, s },
		{ "z", CKPT_DT_COMPLEX128, 1, s },
	};
	CHECK_EQ_INT(ckpt_st_layout_create(uns, 3, NULL, 0, 0, &l), -ENOTSUP);
	CHECK(l == keep);
	ckpt_st_layout *ls = NULL;
	CHECK_EQ_INT(ckpt_st_layout_create(uns, 3, NULL, 0, CKPT_ST_SKIP_UNSUPPORTED, &ls), 0);
	if (ls) {
		ckpt_st_info info;

		CHECK_EQ_INT(ckpt_st_layout_count(ls), 1);
		CHECK_EQ_INT(ckpt_st_layout_get(ls, 0, &info), 0);
		CHECK_EQ_INT(info.input, 0);
		CHECK_EQ_INT(ckpt_st_layout_find(ls, "q4", NULL), -ENOENT);
		ckpt_st_layout_destroy(ls);
	}
	ckpt_st_layout_destroy(NULL);
}

/* A header above the readers' 100,000,000-byte limit is refused.  Control
 * bytes escape to 6 bytes each, which keeps the input small. */
static void test_header_limit(void)
{
	static const uint64_t s[] = { 1 };
	const ckpt_st_tensor t[] = { { "a", CKPT_DT_UINT8, 1, s } };
	size_t big = 16700000, small = 16600000; /* * 6 = 100.2 MB / 99.6 MB */
	char *v = malloc(big + 1);
	ckpt_st_layout *l = NULL;
	size_t hl;

	CHECK(v != NULL);
	if (!v)
		return;
	memset(v, 0x01, big);
	v[big] = '\0';
	ckpt_st_meta m[] = { { "format", "pt" }, { "blob", v } };
	CHECK_EQ_INT(ckpt_st_layout_create(t, 1, m, 2, 0, &l), -EFBIG);
	CHECK(l == NULL);
	v[small] = '\0';
	CHECK_EQ_INT(ckpt_st_layout_create(t, 1, m, 2, 0, &l), 0);
	if (l) {
		ckpt_st_layout_header(l, &hl);
		CHECK(hl - 8 <= CKPT_ST_MAX_HEADER && hl - 8 > small * 6);
		ckpt_st_layout_destroy(l);
	}
	free(v);
}

/* ---- sharding ----------------------------------------------------------- */

static void test_shards(void)
{
	static const uint64_t s10[] = { 10 }, s40[] = { 40 }, s0[] = { 0 }, s100[] = { 100 }, s25[] = { 25 };
	/* U8 sizes: 10, 40, 100 (> S), 0, 25, 10, 40 with S = 50 */
	const ckpt_st_tensor t[] = {
		{ "l0.w", CKPT_DT_UINT8, 1, s10 }, { "l0.b", CKPT_DT_UINT8, 1, s40 },
		{ "big", CKPT_DT_UINT8, 1, s100 }, { "empty", CKPT_DT_UINT8, 1, s0 },
		{ "l1.w", CKPT_DT_UINT8, 1, s25 }, { "l1.b", CKPT_DT_UINT8, 1, s10 },
		{ "l2.w", CKPT_DT_UINT8, 1, s40 },
	};
	const ckpt_st_meta m[] = { { "step", "20" } };
	ckpt_st_sharded *sh = NULL;
	size_t xl;

	CHECK_EQ_INT(ckpt_st_sharded_create(t, 7, m, 1, 50, 0, &sh), 0);
	if (!sh)
		return;
	/* {l0.w,l0.b}=50 | {big}=100 | {empty,l1.w,l1.b}=35 | {l2.w}=40 */
	CHECK_EQ_INT(ckpt_st_sharded_count(sh), 4);
	CHECK_EQ_INT(ckpt_st_sharded_total_size(sh), 225);
	static const size_t want_n[] = { 2, 1, 3, 1 };
	static const uint64_t want_bytes[] = { 50, 100, 35, 40 };
	for (size_t i = 0; i < 4; i++) {
		const ckpt_st_layout *l = ckpt_st_sharded_layout(sh, i);
		char nm[64];
		size_t hl;

		snprintf(nm, sizeof(nm), "model-%05zu-of-00004.safetensors", i + 1);
		CHECK(ckpt_st_sharded_name(sh, i) && strcmp(ckpt_st_sharded_name(sh, i), nm) == 0);
		size_t fi = 99;
		CHECK_EQ_INT(ckpt_st_sharded_find_file(sh, nm, &fi), 0);
		CHECK_EQ_INT(fi, i);
		CHECK(l != NULL);
		if (!l)
			continue;
		CHECK_EQ_INT(ckpt_st_layout_count(l), want_n[i]);
		CHECK_EQ_INT(ckpt_st_layout_data_size(l), want_bytes[i]);
		const char *h = (const char *)ckpt_st_layout_header(l, &hl);
		const char *pre = "{\"__metadata__\":{\"format\":\"pt\"},\"";
		CHECK(hl > 8 + strlen(pre) && strncmp(h + 8, pre, strlen(pre)) == 0);
	}
	CHECK(ckpt_st_sharded_layout(sh, 4) == NULL);
	CHECK(ckpt_st_sharded_name(sh, 4) == NULL);
	CHECK_EQ_INT(ckpt_st_sharded_find_file(sh, "model.safetensors", NULL), -ENOENT);

	/* pieces of a shard name the caller's index */
	const ckpt_st_layout *l2 = ckpt_st_sharded_layout(sh, 2);
	ckpt_st_info info;
	CHECK_EQ_INT(ckpt_st_layout_get(l2, 0, &info), 0);
	CHECK(strcmp(info.name, "empty") == 0 && info.input == 3);
	CHECK_EQ_INT(ckpt_st_layout_get(l2, 1, &info), 0);
	CHECK(strcmp(info.name, "l1.b") == 0 && info.input == 5);
	ckpt_st_piece p[4];
	size_t hl2;
	ckpt_st_layout_header(l2, &hl2);
	ssize_t np = ckpt_st_layout_map(l2, hl2, 100, p, 4);
	CHECK_EQ_INT(np, 2);
	CHECK(np == 2 && p[0].input == 5 && p[0].len == 10 && p[1].input == 4 && p[1].len == 25);

	const char *want_index = "{\n"
				 "  \"metadata\": {\n"
				 "    \"total_size\": 225,\n"
				 "    \"step\": \"20\"\n"
				 "  },\n"
				 "  \"weight_map\": {\n"
				 "    \"big\": \"model-00002-of-00004.safetensors\",\n"
				 "    \"empty\": \"model-00003-of-00004.safetensors\",\n"
				 "    \"l0.b\": \"model-00001-of-00004.safetensors\",\n"
				 "    \"l0.w\": \"model-00001-of-00004.safetensors\",\n"
				 "    \"l1.b\": \"model-00003-of-00004.safetensors\",\n"
				 "    \"l1.w\": \"model-00003-of-00004.safetensors\",\n"
				 "    \"l2.w\": \"model-00004-of-00004.safetensors\"\n"
				 "  }\n"
				 "}\n";
	const char *idx = ckpt_st_sharded_index(sh, &xl);
	CHECK(idx && strcmp(idx, want_index) == 0);
	CHECK_EQ_INT(xl, strlen(want_index));
	ckpt_st_sharded_destroy(sh);

	/* one big shard when everything fits; oversized first tensor */
	sh = NULL;
	CHECK_EQ_INT(ckpt_st_sharded_create(t, 7, NULL, 0, 1000, 0, &sh), 0);
	if (sh) {
		CHECK_EQ_INT(ckpt_st_sharded_count(sh), 1);
		CHECK(strcmp(ckpt_st_sharded_name(sh, 0), "model-00001-of-00001.safetensors") == 0);
		CHECK_EQ_INT(ckpt_st_layout_count(ckpt_st_sharded_layout(sh, 0)), 7);
		ckpt_st_sharded_destroy(sh);
	}
	sh = NULL;
	CHECK_EQ_INT(ckpt_st_sharded_create(t + 2, 3, NULL, 0, 30, 0, &sh), 0);
	if (sh) {
		/* {big} | {empty, l1.w}=25 */
		CHECK_EQ_INT(ckpt_st_sharded_count(sh), 2);
		CHECK_EQ_INT(ckpt_st_layout_count(ckpt_st_sharded_layout(sh, 0)), 1);
		CHECK_EQ_INT(ckpt_st_layout_count(ckpt_st_sharded_layout(sh, 1)), 2);
		ckpt_st_sharded_destroy(sh);
	}
	/* exact fit: 10 + 40 == 50 stays together; every tensor at S */
	sh = NULL;
	const ckpt_st_tensor eq[] = { { "a", CKPT_DT_UINT8, 1, s40 }, { "b", CKPT_DT_UINT8, 1, s40 } };
	CHECK_EQ_INT(ckpt_st_sharded_create(eq, 2, NULL, 0, 40, 0, &sh), 0);
	if (sh) {
		CHECK_EQ_INT(ckpt_st_sharded_count(sh), 2);
		ckpt_st_sharded_destroy(sh);
	}
	/* no tensors: zero shards, empty weight_map */
	sh = NULL;
	CHECK_EQ_INT(ckpt_st_sharded_create(NULL, 0, NULL, 0, 10, 0, &sh), 0);
	if (sh) {
		CHECK_EQ_INT(ckpt_st_sharded_count(sh), 0);
		CHECK(strcmp(ckpt_st_sharded_index(sh, NULL), "{\n  \"metadata\": {\n    \"total_size\": 0\n "
							      " },\n  \"weight_map\": {}\n}\n") == 0);
		ckpt_st_sharded_destroy(sh);
	}
	/* errors */
	sh = NULL;
	const ckpt_st_meta mts[] = { { "total_size", "1" } };
	CHECK_EQ_INT(ckpt_st_sharded_create(t, 7, mts, 1, 50, 0, &sh), -EINVAL);
	CHECK_EQ_INT(ckpt_st_sharded_create(t, 7, NULL, 0, 0, 0, &sh), -EINVAL);
	const ckpt_st_tensor uns[] = { { "a", CKPT_DT_UINT8, 1, s10 }, { "q", CKPT_DT_UINT4, 1, s10 } };
	CHECK_EQ_INT(ckpt_st_sharded_create(uns, 2, NULL, 0, 50, 0, &sh), -ENOTSUP);
	CHECK(sh == NULL);
	CHECK_EQ_INT(ckpt_st_sharded_create(uns, 2, NULL, 0, 50, CKPT_ST_SKIP_UNSUPPORTED, &sh), 0);
	if (sh) {
		CHECK_EQ_INT(ckpt_st_sharded_total_size(sh), 10);
		CHECK(strstr(ckpt_st_sharded_index(sh, NULL), "\"q\"") == NULL);
		ckpt_st_sharded_destroy(sh);
	}
	ckpt_st_sharded_destroy(NULL);
}

int main(void)
{
	/* the error cases log one line each, on purpose */
	CHECK_RUN(test_worked_example);
	CHECK_RUN(test_fixture);
	CHECK_RUN(test_order);
	CHECK_RUN(test_padding);
	CHECK_RUN(test_scalar_and_empty);
	CHECK_RUN(test_map_edges);
	CHECK_RUN(test_map_random);
	CHECK_RUN(test_escape);
	CHECK_RUN(test_errors);
	CHECK_RUN(test_header_limit);
	CHECK_RUN(test_shards);
	return CHECK_DONE();
}
