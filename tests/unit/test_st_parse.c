/*
 * test_st_parse.c - reading safetensors headers (format/safetensors.c
 * ckpt_st_parse): the fixture written by the real safetensors library, a
 * header ckptfs' own layout emits, and the refusals of the reference reader.
 */
#include <errno.h>
#include <string.h>

#include "check.h"
#include "common.h"
#include "safetensors.h"

static int parse_str(const char *json, uint64_t data_len, ckpt_st_file **f)
{
	return ckpt_st_parse(json, strlen(json), 8 + strlen(json) + data_len, "t", f);
}

static void test_fixture(void)
{
	size_t n = 0;
	char *b = check_slurp(CKPT_FIXTURES "/params.safetensors", &n);
	CHECK(b != NULL);
	if (!b)
		return;
	uint64_t hn = 0;
	CHECK_EQ_INT(ckpt_st_header_len((const uint8_t *)b, n, "params", &hn), 0);
	CHECK_EQ_INT(hn, 688);
	ckpt_st_file *f = NULL;
	CHECK_EQ_INT(ckpt_st_parse(b + 8, hn, n, "params", &f), 0);
	CHECK(f && f->n == 8 && f->data_start == 696);
	if (f && f->n == 8) {
		CHECK(strcmp(f->t[6].name, "params.embed.embedding") == 0);
		CHECK(f->t[6].dtype == CKPT_DT_BFLOAT16 && f->t[6].rank == 2 && f->t[6].shape[1] == 32);
		CHECK(f->t[6].begin == 696 + 29312 && f->t[6].end == 696 + 33408);
		CHECK(f->t[7].end == n);
	}
	ckpt_st_file_free(f);
	free(b);
}

static void test_roundtrip(void)
{
	uint64_t s1[2] = { 3, 4 }, s2[1] = { 5 };
	ckpt_st_tensor t[3] = { { "a.b", CKPT_DT_FLOAT32, 2, s1 },
				{ "c", CKPT_DT_BFLOAT16, 1, s2 },
				{ "s", CKPT_DT_INT64, 0, NULL } };
	ckpt_st_meta meta[1] = { { "format", "pt" } };
	ckpt_st_layout *l = NULL;
	CHECK_EQ_INT(ckpt_st_layout_create(t, 3, meta, 1, 0, &l), 0);
	size_t hl = 0;
	const uint8_t *h = ckpt_st_layout_header(l, &hl);
	ckpt_st_file *f = NULL;
	uint64_t hn = 0;
	CHECK_EQ_INT(ckpt_st_header_len(h, ckpt_st_layout_file_size(l), "rt", &hn), 0);
	CHECK_EQ_INT(ckpt_st_parse((const char *)h + 8, hn, ckpt_st_layout_file_size(l), "rt", &f), 0);
	CHECK(f && f->n == 3 && f->metadata_json && strcmp(f->metadata_json, "{\"format\":\"pt\"}") == 0);
	for (size_t i = 0; f && i < f->n; i++) {
		size_t k;
		CHECK_EQ_INT(ckpt_st_layout_find(l, f->t[i].name, &k), 0);
	}
	ckpt_st_file_free(f);
	ckpt_st_layout_destroy(l);
}

static void test_refused(void)
{
	ckpt_st_file *f = NULL;
	ckpt_log_quiet(1);
	CHECK_EQ_INT(parse_str("[1]", 0, &f), -EINVAL);
	CHECK_EQ_INT(parse_str("{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, &f),
		     -EINVAL);
	CHECK_EQ_INT(parse_str("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 8, &f),
		     -EINVAL);
	CHECK_EQ_INT(parse_str("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 3, &f),
		     -EINVAL);
	CHECK_EQ_INT(parse_str("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, &f),
		     -EINVAL);
	CHECK_EQ_INT(parse_str("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
			       "\"b\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[2,6]}}",
			       8, &f),
		     -EINVAL);
	CHECK_EQ_INT(parse_str("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
			       "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
			       8, &f),
		     -EINVAL);
	CHECK_EQ_INT(parse_str("{\"__metadata__\":{\"x\":1}}", 0, &f), -EINVAL);
	uint8_t big[8] = { 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0 };
	uint64_t hn;
	CHECK_EQ_INT(ckpt_st_header_len(big, 1u << 20, "big", &hn), -EINVAL);
	ckpt_log_quiet(0);
	CHECK_EQ_INT(parse_str("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
			       "\"b\":{\"dtype\":\"BOOL\",\"shape\":[],\"data_offsets\":[0,1]}}",
			       1, &f),
		     0);
	CHECK(f && f->n == 2 && f->t[1].dtype == CKPT_DT_BOOL && f->t[1].rank == 0);
	ckpt_st_file_free(f);
}

int main(void)
{
	CHECK_RUN(test_fixture);
	CHECK_RUN(test_roundtrip);
	CHECK_RUN(test_refused);
	return CHECK_DONE();
}
