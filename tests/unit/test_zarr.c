/* Unit tests of zarr.c on hand-made arrays: sharding_indexed with several
 * inner chunks, the index at the start, empty inner chunks, edge shards;
 * big-endian bytes + crc32c; zarr v2 with '/' keys, F order, no compressor;
 * corrupt indexes; metadata that must be refused. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include "check.h"
#include "crc32c.h"
#include "zarr_chunk.h"

static char dir[256];

static void put_file(const char *rel, const void *data, size_t len)
{
	char p[512], tmp[512];
	snprintf(p, sizeof(p), "%s/%s", dir, rel);
	/* mkdir -p of the parent */
	snprintf(tmp, sizeof(tmp), "%s", p);
	for (char *s = tmp + strlen(dir) + 1; (s = strchr(s, '/')); s++) {
		*s = 0;
		mkdir(tmp, 0755);
		*s = '/';
	}
	FILE *f = fopen(p, "wb");
	fwrite(data, 1, len, f);
	fclose(f);
}

static int parse(int fmt, const char *json, ckpt_array_meta *m)
{
	const char *why;
	return ckpt_zarr_parse(fmt, json, strlen(json), m, &why);
}

/* v3: int32 [6,4], shard [4,4], inner [2,2], index at start, chunk (0,1)
 * of shard (0,0) empty; element (i,j) = 100*i + j. */
static void test_sharded_start(ckpt_store *s)
{
	const char *json =
		"{\"zarr_format\":3,\"node_type\":\"array\",\"shape\":[6,4],\"data_type\":\"int32\","
		"\"chunk_grid\":{\"name\":\"regular\",\"configuration\":{\"chunk_shape\":[4,4]}},"
		"\"chunk_key_encoding\":{\"name\":\"default\"},\"fill_value\":-1,"
		"\"codecs\":[{\"name\":\"sharding_indexed\",\"configuration\":{\"chunk_shape\":[2,2],"
		"\"codecs\":[{\"name\":\"bytes\",\"configuration\":{\"endian\":\"little\"}},{\"name\":"
		"\"zstd\"}],"
		"\"index_codecs\":[{\"name\":\"bytes\",\"configuration\":{\"endian\":\"little\"}},{\"name\":"
		"\"crc32c\"}],"
		"\"index_location\":\"start\"}}]}";
	put_file("a/zarr.json", json, strlen(json));
	for (int sr = 0; sr < 2; sr++) { /* shard rows 0..1 (rows 0-3, 4-7 clipped at 6) */
		uint8_t buf[4096];
		uint8_t ix[4 * 16 + 4];
		size_t pos = sizeof(ix);
		for (int c = 0; c < 4; c++) {
			int ci = c / 2, cj = c % 2;
			int gi = sr * 2 + ci;
			if ((sr == 0 && c == 1) || gi >= 3) { /* empty, or entirely outside the array */
				ckpt_put_le64(ix + 16 * c, UINT64_MAX);
				ckpt_put_le64(ix + 16 * c + 8, UINT64_MAX);
				continue;
			}
			int32_t v[4];
			for (int k = 0; k < 4; k++)
				v[k] = 100 * (gi * 2 + k / 2) + cj * 2 + k % 2;
			size_t n = ZSTD_compress(buf + pos, sizeof(buf) - pos, v, sizeof(v), 3);
			ckpt_put_le64(ix + 16 * c, pos);
			ckpt_put_le64(ix + 16 * c + 8, n);
			pos += n;
		}
		ckpt_put_le32(ix + 64, ckpt_crc32c(0, ix, 64));
		memcpy(buf, ix, sizeof(ix));
		char key[32];
		snprintf(key, sizeof(key), "a/c/%d/0", sr);
		put_file(key, buf, pos);
	}
	ckpt_array_meta m;
	CHECK_EQ_INT(parse(3, json, &m), 0);
	CHECK(m.sharded && m.index_at_start && m.index_crc);
	CHECK_EQ_INT(m.grid[0], 3);
	CHECK_EQ_INT(m.grid[1], 2);
	ckpt_zarr_scratch *sc = ckpt_zarr_scratch_create();
	for (uint64_t gi = 0; gi < 3; gi++)
		for (uint64_t gj = 0; gj < 2; gj++) {
			int32_t v[4];
			uint64_t g[2] = { gi, gj };
			CHECK_EQ_INT(ckpt_zarr_read_unit(s, "a", &m, g, v, sc), 0);
			for (int k = 0; k < 4; k++) {
				int32_t want = (gi == 0 && gj == 1)
						       ? -1
						       : (int32_t)(100 * (gi * 2 + k / 2) + gj * 2 + k % 2);
				CHECK_EQ_INT(v[k], want);
			}
		}
	/* corrupt the index CRC of shard 1 */
	char p[512];
	snprintf(p, sizeof(p), "%s/a/c/1/0", dir);
	FILE *f = fopen(p, "r+b");
	fseek(f, 64, SEEK_SET);
	int byte = fgetc(f);
	fseek(f, 64, SEEK_SET);
	fputc(byte ^ 0xff, f);
	fclose(f);
	int32_t v[4];
	uint64_t g[2] = { 2, 0 };
	CHECK_EQ_INT(ckpt_zarr_read_unit(s, "a", &m, g, v, sc), -EIO);
	ckpt_zarr_scratch_destroy(sc);
}

/* v3 without sharding: uint16 [3] big-endian bytes, then crc32c. */
static void test_big_endian_crc(ckpt_store *s)
{
	const char *json =
		"{\"zarr_format\":3,\"node_type\":\"array\",\"shape\":[3],\"data_type\":\"uint16\","
		"\"chunk_grid\":{\"name\":\"regular\",\"configuration\":{\"chunk_shape\":[3]}},"
		"\"chunk_key_encoding\":{\"name\":\"v2\"},\"fill_value\":0,"
		"\"codecs\":[{\"name\":\"bytes\",\"configuration\":{\"endian\":\"big\"}},{\"name\":"
		"\"crc32c\"}]}";
	put_file("b/zarr.json", json, strlen(json));
	uint8_t raw[6 + 4] = { 0x01, 0x02, 0x03, 0x04, 0x05, 0x06 };
	ckpt_put_le32(raw + 6, ckpt_crc32c(0, raw, 6));
	put_file("b/0", raw, sizeof(raw));
	ckpt_array_meta m;
	CHECK_EQ_INT(parse(3, json, &m), 0);
	ckpt_zarr_scratch *sc = ckpt_zarr_scratch_create();
	uint16_t v[3];
	uint64_t g[1] = { 0 };
	CHECK_EQ_INT(ckpt_zarr_read_unit(s, "b", &m, g, v, sc), 0);
	CHECK_EQ_INT(v[0], 0x0102);
	CHECK_EQ_INT(v[2], 0x0506);
	raw[0] ^= 1; /* payload changed: CRC mismatch */
	put_file("b/0", raw, sizeof(raw));
	CHECK_EQ_INT(ckpt_zarr_read_unit(s, "b", &m, g, v, sc), -EIO);
	ckpt_zarr_scratch_destroy(sc);
}

/* v2: float32 [2,3], one chunk, F order, '/' separator, no compressor. */
static void test_v2_fortran(ckpt_store *s)
{
	const char *json =
		"{\"zarr_format\":2,\"shape\":[2,3],\"chunks\":[2,3],\"dtype\":\"<f4\",\"compressor\":null,"
		"\"fill_value\":null,\"filters\":null,\"order\":\"F\",\"dimension_separator\":\"/\"}";
	put_file("c/.zarray", json, strlen(json));
	float f[6] = { 0, 3, 1, 4, 2, 5 }; /* column-major of [[0,1,2],[3,4,5]] */
	put_file("c/0/0", f, sizeof(f));
	ckpt_array_meta m;
	CHECK_EQ_INT(parse(2, json, &m), 0);
	CHECK_EQ_INT(m.sep, '/');
	char key[64];
	uint64_t g[2] = { 0, 0 };
	CHECK(ckpt_zarr_unit_key(&m, "c", g, key, sizeof(key)) > 0);
	CHECK(strcmp(key, "c/0/0") == 0);
	ckpt_zarr_scratch *sc = ckpt_zarr_scratch_create();
	float v[6];
	CHECK_EQ_INT(ckpt_zarr_read_unit(s, "c", &m, g, v, sc), 0);
	for (int i = 0; i < 6; i++)
		CHECK(v[i] == (float)i);
	ckpt_zarr_scratch_destroy(sc);
}

static void test_refused(void)
{
	ckpt_array_meta m;
	const char *why;
	const char *gzip =
		"{\"zarr_format\":2,\"shape\":[4],\"chunks\":[4],\"dtype\":\"<f4\","
		"\"compressor\":{\"id\":\"gzip\"},\"fill_value\":0,\"filters\":null,\"order\":\"C\"}";
	CHECK_EQ_INT(ckpt_zarr_parse(2, gzip, strlen(gzip), &m, &why), -ENOTSUP);
	const char *huge =
		"{\"zarr_format\":2,\"shape\":[4611686018427387904,4611686018427387904],\"chunks\":[1,1],"
		"\"dtype\":\"<f4\",\"compressor\":null,\"fill_value\":0,\"filters\":null,\"order\":\"C\"}";
	CHECK_EQ_INT(ckpt_zarr_parse(2, huge, strlen(huge), &m, &why), -EINVAL);
	const char *zero = "{\"zarr_format\":2,\"shape\":[4],\"chunks\":[0],\"dtype\":\"<f4\","
			   "\"compressor\":null,\"fill_value\":0,\"filters\":null,\"order\":\"C\"}";
	CHECK_EQ_INT(ckpt_zarr_parse(2, zero, strlen(zero), &m, &why), -EINVAL);
	CHECK_EQ_INT(ckpt_zarr_parse(3, "[1,2]", 5, &m, &why), -EINVAL);
	CHECK_EQ_INT(ckpt_zarr_parse(3, "{\"zarr_format\":3", 16, &m, &why), -EINVAL);
	const char *badshard =
		"{\"zarr_format\":3,\"node_type\":\"array\",\"shape\":[8],\"data_type\":\"int8\","
		"\"chunk_grid\":{\"name\":\"regular\",\"configuration\":{\"chunk_shape\":[4]}},"
		"\"chunk_key_encoding\":{\"name\":\"default\"},\"fill_value\":0,"
		"\"codecs\":[{\"name\":\"sharding_indexed\",\"configuration\":{\"chunk_shape\":[3],"
		"\"codecs\":[{\"name\":\"bytes\"}]}}]}";
	CHECK_EQ_INT(ckpt_zarr_parse(3, badshard, strlen(badshard), &m, &why), -EINVAL);
}

int main(void)
{
	snprintf(dir, sizeof(dir), "/tmp/ckpt_test_zarr.XXXXXX");
	if (!mkdtemp(dir))
		return 1;
	ckpt_store *s;
	CHECK_EQ_INT(ckpt_store_dir_open(dir, &s), 0);
	test_sharded_start(s);
	test_big_endian_crc(s);
	test_v2_fortran(s);
	test_refused();
	ckpt_store_destroy(s);
	char cmd[300];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "cannot remove %s\n", dir);
	return CHECK_DONE();
}
