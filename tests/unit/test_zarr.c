/* Unit tests of zarr_chunk.c and array.c on hand-made arrays:
 * sharding_indexed with several inner chunks, the index at the start, empty
 * inner chunks, edge shards; big-endian bytes + crc32c; zarr v2 with '/'
 * keys, F order, no compressor; corrupt indexes; metadata that must be
 * refused; every compressor (zlib, gzip, bz2, lz4, blosc) including data
 * that decodes to more or less than the chunk; a general transpose; the
 * missing-data rule and its log line; revalidation of cached chunks;
 * decoding in place from a mapping of the stored file, and a file that
 * shrinks under that mapping (EIO, never SIGBUS). */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <blosc.h>
#include <bzlib.h>
#include <lz4.h>
#include <zlib.h>
#include <zstd.h>

#include "array.h"
#include "cache.h"
#include "check.h"
#include "crc32c.h"
#include "fwd_store.h"
#include "kept.h"
#include "pool.h"
#include "stats.h"
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
	const char *foo =
		"{\"zarr_format\":2,\"shape\":[4],\"chunks\":[4],\"dtype\":\"<f4\","
		"\"compressor\":{\"id\":\"foo\"},\"fill_value\":0,\"filters\":null,\"order\":\"C\"}";
	CHECK_EQ_INT(ckpt_zarr_parse(2, foo, strlen(foo), &m, &why), -ENOTSUP);
	CHECK(strstr(why, "foo") != NULL);
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

/* ---- compressors --------------------------------------------------------- */

enum { C_ZLIB, C_GZIP, C_BZ2, C_LZ4, C_BLOSC };

static size_t compress_with(int c, const void *src, size_t n, uint8_t *dst, size_t cap)
{
	switch (c) {
	case C_ZLIB: {
		uLongf dl = cap;
		CHECK_EQ_INT(compress2(dst, &dl, src, n, 6), Z_OK);
		return dl;
	}
	case C_GZIP: {
		z_stream z;
		memset(&z, 0, sizeof(z));
		CHECK_EQ_INT(deflateInit2(&z, 5, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
		z.next_in = (Bytef *)src;
		z.avail_in = (uInt)n;
		z.next_out = dst;
		z.avail_out = (uInt)cap;
		CHECK_EQ_INT(deflate(&z, Z_FINISH), Z_STREAM_END);
		size_t out = z.total_out;
		deflateEnd(&z);
		return out;
	}
	case C_BZ2: {
		unsigned dl = (unsigned)cap;
		CHECK_EQ_INT(BZ2_bzBuffToBuffCompress((char *)dst, &dl, (char *)src, (unsigned)n, 9, 0, 0),
			     BZ_OK);
		return dl;
	}
	case C_LZ4: {
		ckpt_put_le32(dst, (uint32_t)n);
		int r = LZ4_compress_default(src, (char *)dst + 4, (int)n, (int)cap - 4);
		CHECK(r > 0);
		return (size_t)r + 4;
	}
	default: {
		int r = blosc_compress_ctx(5, BLOSC_SHUFFLE, 4, n, src, dst, cap, "lz4", 0, 1);
		CHECK(r > 0);
		return (size_t)r;
	}
	}
}

static const char *const v2_comp[] = {
	"{\"id\":\"zlib\",\"level\":6}",
	"{\"id\":\"gzip\",\"level\":5}",
	"{\"id\":\"bz2\",\"level\":9}",
	"{\"id\":\"lz4\",\"acceleration\":1}",
	"{\"id\":\"blosc\",\"cname\":\"lz4\",\"clevel\":5,\"shuffle\":1,\"blocksize\":0}",
};

/* v2 float32 [4,8] in [4,4] chunks, each compressor: exact bytes back;
 * a stream that decodes to one element more or less is -EIO. */
static void test_compressors(ckpt_store *s)
{
	for (int c = 0; c <= C_BLOSC; c++) {
		char json[512], pre[16];
		snprintf(pre, sizeof(pre), "comp%d", c);
		snprintf(json, sizeof(json),
			 "{\"zarr_format\":2,\"shape\":[4,8],\"chunks\":[4,4],\"dtype\":\"<f4\","
			 "\"compressor\":%s,"
			 "\"fill_value\":0,\"filters\":null,\"order\":\"C\"}",
			 v2_comp[c]);
		ckpt_array_meta m;
		CHECK_EQ_INT(parse(2, json, &m), 0);
		float v[17];
		for (int i = 0; i < 17; i++)
			v[i] = (float)(i * 3 + c);
		uint8_t buf[4096];
		char key[64];
		size_t n = compress_with(c, v, 16 * sizeof(float), buf, sizeof(buf));
		snprintf(key, sizeof(key), "%s/0.0", pre);
		put_file(key, buf, n);
		ckpt_zarr_scratch *sc = ckpt_zarr_scratch_create();
		float got[16];
		uint64_t g[2] = { 0, 0 };
		CHECK_EQ_INT(ckpt_zarr_read_unit(s, pre, &m, g, got, sc), 0);
		CHECK(memcmp(got, v, sizeof(got)) == 0);
		/* one element too many, one too few: refused, nothing past the chunk written */
		for (int extra = -1; extra <= 1; extra += 2) {
			n = compress_with(c, v, (size_t)(16 + extra) * sizeof(float), buf, sizeof(buf));
			put_file(key, buf, n);
			float guard[20];
			memset(guard, 0x5a, sizeof(guard));
			CHECK_EQ_INT(ckpt_zarr_read_unit(s, pre, &m, g, guard, sc), -EIO);
			uint8_t tail[sizeof(guard) - 16 * sizeof(float)];
			memset(tail, 0x5a, sizeof(tail));
			CHECK(memcmp((uint8_t *)guard + 16 * sizeof(float), tail, sizeof(tail)) == 0);
		}
		/* truncated and garbage data */
		n = compress_with(c, v, 16 * sizeof(float), buf, sizeof(buf));
		put_file(key, buf, n / 2);
		CHECK_EQ_INT(ckpt_zarr_read_unit(s, pre, &m, g, got, sc), -EIO);
		memset(buf, 0xa5, sizeof(buf));
		put_file(key, buf, 100);
		CHECK_EQ_INT(ckpt_zarr_read_unit(s, pre, &m, g, got, sc), -EIO);
		ckpt_zarr_scratch_destroy(sc);
	}
}

/* v3 int16 [2,3,4] with transpose [2,0,1] + gzip + crc32c, and [1,2,0]
 * without compression. */
static void test_transpose(ckpt_store *s)
{
	static const int orders[2][3] = { { 2, 0, 1 }, { 1, 2, 0 } };
	for (int t = 0; t < 2; t++) {
		char json[1024], pre[8];
		const int *o = orders[t];
		snprintf(pre, sizeof(pre), "tr%d", t);
		snprintf(json, sizeof(json),
			 "{\"zarr_format\":3,\"node_type\":\"array\",\"shape\":[2,3,4],\"data_type\":"
			 "\"int16\","
			 "\"chunk_grid\":{\"name\":\"regular\",\"configuration\":{\"chunk_shape\":[2,3,4]}},"
			 "\"chunk_key_encoding\":{\"name\":\"default\"},\"fill_value\":0,\"codecs\":["
			 "{\"name\":\"transpose\",\"configuration\":{\"order\":[%d,%d,%d]}},"
			 "{\"name\":\"bytes\",\"configuration\":{\"endian\":\"little\"}}%s]}",
			 o[0], o[1], o[2], t == 0 ? ",{\"name\":\"gzip\"},{\"name\":\"crc32c\"}" : "");
		ckpt_array_meta m;
		CHECK_EQ_INT(parse(3, json, &m), 0);
		int16_t a[2][3][4], st[24];
		const int dims[3] = { 2, 3, 4 };
		for (int i = 0; i < 2; i++)
			for (int j = 0; j < 3; j++)
				for (int k = 0; k < 4; k++)
					a[i][j][k] = (int16_t)(100 * i + 10 * j + k);
		/* stored = np.transpose(a, o) in C order */
		int sd[3] = { dims[o[0]], dims[o[1]], dims[o[2]] }, p = 0;
		for (int x = 0; x < sd[0]; x++)
			for (int y = 0; y < sd[1]; y++)
				for (int z = 0; z < sd[2]; z++) {
					int idx[3];
					idx[o[0]] = x;
					idx[o[1]] = y;
					idx[o[2]] = z;
					st[p++] = a[idx[0]][idx[1]][idx[2]];
				}
		uint8_t buf[1024];
		size_t n = sizeof(st);
		if (t == 0) {
			n = compress_with(C_GZIP, st, sizeof(st), buf, sizeof(buf) - 4);
			ckpt_put_le32(buf + n, ckpt_crc32c(0, buf, n));
			n += 4;
		} else {
			memcpy(buf, st, n);
		}
		char key[32];
		snprintf(key, sizeof(key), "%s/c/0/0/0", pre);
		put_file(key, buf, n);
		ckpt_zarr_scratch *sc = ckpt_zarr_scratch_create();
		int16_t got[24];
		uint64_t g[3] = { 0, 0, 0 };
		CHECK_EQ_INT(ckpt_zarr_read_unit(s, pre, &m, g, got, sc), 0);
		CHECK(memcmp(got, a, sizeof(got)) == 0);
		ckpt_zarr_scratch_destroy(sc);
	}
}

/* ---- missing data, log once, revalidation ---------------------------------- */

static int nlogged_missing;
static char last_log[1024];

static void count_log(int level, const char *msg)
{
	(void)level;
	if (strstr(msg, "is missing"))
		nlogged_missing++;
	snprintf(last_log, sizeof(last_log), "%s", msg);
}

/* ckpt_array_visit: v2 int32 [7,5] in [3,2] chunks (raw), element (i,j) =
 * 100*i + j.  A box meets the chunks it overlaps, in grid order, each whole
 * (its region from its origin, edge chunks too) with the stored values;
 * the callback's nonzero return stops the walk; Fortran-order chunks are
 * -ENOTSUP (the caller copies instead). */
struct visit_log {
	int n, stop_at;
	uint64_t starts[16][2];
	int bad;
};

static int visit_cb(void *arg, const void *data, const ckpt_region *chunk)
{
	struct visit_log *l = arg;
	const int32_t *v = data;
	if (chunk->rank != 2 || chunk->stop[0] - chunk->start[0] != 3 ||
	    chunk->stop[1] - chunk->start[1] != 2)
		l->bad++;
	for (uint64_t i = chunk->start[0]; i < chunk->stop[0] && i < 7; i++)
		for (uint64_t j = chunk->start[1]; j < chunk->stop[1] && j < 5; j++)
			if (v[(i - chunk->start[0]) * 2 + (j - chunk->start[1])] != (int32_t)(100 * i + j))
				l->bad++;
	if (l->n < 16) {
		l->starts[l->n][0] = chunk->start[0];
		l->starts[l->n][1] = chunk->start[1];
	}
	return ++l->n == l->stop_at ? -EINTR : 0;
}

static void test_visit(ckpt_store *s)
{
	const char *json = "{\"zarr_format\":2,\"shape\":[7,5],\"chunks\":[3,2],\"dtype\":\"<i4\","
			   "\"compressor\":null,\"fill_value\":0,\"filters\":null,\"order\":\"C\"}";
	const char *jsonf = "{\"zarr_format\":2,\"shape\":[7,5],\"chunks\":[3,2],\"dtype\":\"<i4\","
			    "\"compressor\":null,\"fill_value\":0,\"filters\":null,\"order\":\"F\"}";
	put_file("vis/.zarray", json, strlen(json));
	put_file("visf/.zarray", jsonf, strlen(jsonf));
	for (int gi = 0; gi < 3; gi++)
		for (int gj = 0; gj < 3; gj++) {
			int32_t c[6];
			for (int i = 0; i < 3; i++)
				for (int j = 0; j < 2; j++)
					c[i * 2 + j] = 100 * (gi * 3 + i) + gj * 2 + j;
			char key[32];
			snprintf(key, sizeof(key), "vis/%d.%d", gi, gj);
			put_file(key, c, sizeof(c));
			snprintf(key, sizeof(key), "visf/%d.%d", gi, gj);
			put_file(key, c, sizeof(c));
		}
	ckpt_ctx *ctx;
	CHECK_EQ_INT(ckpt_ctx_create(NULL, &ctx), 0);
	ckpt_array *a, *f;
	CHECK_EQ_INT(ckpt_array_open(ctx, s, "vis", 2, &a), 0);
	CHECK_EQ_INT(ckpt_array_open(ctx, s, "visf", 2, &f), 0);
	ckpt_region box = { .rank = 2, .start = { 1, 1 }, .stop = { 7, 4 } };
	struct visit_log l = { 0 };
	CHECK_EQ_INT(ckpt_array_visit(a, &box, visit_cb, &l), 0);
	CHECK_EQ_INT(l.n, 6); /* chunk rows 0..2, columns 0..1 */
	CHECK_EQ_INT(l.bad, 0);
	static const uint64_t want[6][2] = { { 0, 0 }, { 0, 2 }, { 3, 0 }, { 3, 2 }, { 6, 0 }, { 6, 2 } };
	for (int i = 0; i < 6; i++)
		CHECK(l.starts[i][0] == want[i][0] && l.starts[i][1] == want[i][1]);
	struct visit_log l2 = { .stop_at = 2 };
	CHECK_EQ_INT(ckpt_array_visit(a, &box, visit_cb, &l2), -EINTR);
	CHECK_EQ_INT(l2.n, 2);
	ckpt_region out = { .rank = 2, .start = { 0, 0 }, .stop = { 8, 5 } };
	CHECK_EQ_INT(ckpt_array_visit(a, &out, visit_cb, &l), -EINVAL);
	CHECK_EQ_INT(ckpt_array_visit(f, &box, visit_cb, &l), -ENOTSUP);
	ckpt_array_destroy(a);
	ckpt_array_destroy(f);
	ckpt_ctx_destroy(ctx);
}

static int fill_ones(void *arg, void *dst)
{
	(void)arg;
	memset(dst, 1, 8);
	return 0;
}

/* A read that passed its state check just before its array was retired
 * (its step pruned) may cache a chunk after the retire dropped the
 * array's chunks, under the owner the retire replaced or the fresh one.
 * The retire when the array is freed drops those too (before, they
 * stayed in the cache until the LRU reached them). */
static void test_retire_drops_late_fills(ckpt_store *s)
{
	const char *json = "{\"zarr_format\":2,\"shape\":[4],\"chunks\":[2],\"dtype\":\"<i4\","
			   "\"compressor\":null,\"fill_value\":0,\"filters\":null,\"order\":\"C\"}";
	int32_t c0[2] = { 1, 2 }, c1[2] = { 3, 4 };
	put_file("ret/.zarray", json, strlen(json));
	put_file("ret/0", c0, sizeof(c0));
	put_file("ret/1", c1, sizeof(c1));
	ckpt_ctx *ctx;
	CHECK_EQ_INT(ckpt_ctx_create(NULL, &ctx), 0);
	ckpt_cache *cache = ckpt_ctx_cache(ctx);
	ckpt_array *a;
	CHECK_EQ_INT(ckpt_array_open(ctx, s, "ret", 2, &a), 0);
	ckpt_region all = { .rank = 1, .start = { 0 }, .stop = { 4 } };
	/* (a part: a whole raw array is read straight from the folder, uncached) */
	ckpt_region part = { .rank = 1, .start = { 0 }, .stop = { 3 } };
	int32_t out[4];
	CHECK_EQ_INT(ckpt_array_read(a, &part, 0, 3 * sizeof(int32_t), out), 3 * (int)sizeof(int32_t));
	CHECK(out[0] == 1 && out[2] == 3);
	/* the read-ahead the read queued holds its entry until its task ran
	 * (then freed at that release, dropped or not): let it end first */
	ckpt_ctx_quiesce(ctx);
	CHECK(ckpt_cache_bytes(cache) > 0);
	uint64_t old = ckpt_array_cache_owner(a);
	ckpt_arrays_retire(ctx, &a, 1);
	CHECK_EQ_INT(ckpt_cache_bytes(cache), 0);
	CHECK_EQ_INT(ckpt_array_read(a, &all, 0, sizeof(out), out), -ESTALE);
	uint64_t fresh = ckpt_array_cache_owner(a);
	CHECK(fresh != old);
	/* the late fills of a read that raced the retire */
	ckpt_centry *e;
	CHECK_EQ_INT(ckpt_cache_get(cache, old, 0, 8, fill_ones, NULL, &e), 0);
	ckpt_cache_release(cache, e);
	CHECK_EQ_INT(ckpt_cache_get(cache, fresh, 1, 8, fill_ones, NULL, &e), 0);
	ckpt_cache_release(cache, e);
	CHECK(ckpt_cache_bytes(cache) > 0);
	ckpt_arrays_retire(ctx, &a, 1); /* as its step is freed */
	CHECK_EQ_INT(ckpt_cache_bytes(cache), 0);
	ckpt_array_destroy(a);
	ckpt_ctx_destroy(ctx);
}

static void test_missing(ckpt_store *s)
{
	/* v2 float32 [4] in [2] chunks, fill 0 or null */
	const char *json0 =
		"{\"zarr_format\":2,\"shape\":[4],\"chunks\":[2],\"dtype\":\"<f4\",\"compressor\":null,"
		"\"fill_value\":1.5,\"filters\":null,\"order\":\"C\"}";
	const char *jsonn =
		"{\"zarr_format\":2,\"shape\":[4],\"chunks\":[2],\"dtype\":\"<f4\",\"compressor\":null,"
		"\"fill_value\":null,\"filters\":null,\"order\":\"C\"}";
	float one[2] = { 7, 8 };
	put_file("m0/.zarray", json0, strlen(json0));
	put_file("m0/0", one, sizeof(one));
	put_file("mn/.zarray", jsonn, strlen(jsonn));
	put_file("mn/0", one, sizeof(one));
	ckpt_array_meta m;
	ckpt_zarr_scratch *sc = ckpt_zarr_scratch_create();
	float v[2];
	uint64_t g[1] = { 1 };
	CHECK_EQ_INT(parse(2, json0, &m), 0);
	CHECK_EQ_INT(ckpt_zarr_read_unit(s, "m0", &m, g, v, sc), 0);
	CHECK(v[0] == 1.5f && v[1] == 1.5f);
	m.missing_is_error = 1;
	CHECK_EQ_INT(ckpt_zarr_read_unit(s, "m0", &m, g, v, sc), -ENODATA);
	CHECK_EQ_INT(parse(2, jsonn, &m), 0);
	CHECK(m.fill_null);
	/* fill_value null: zeros, as TensorStore reads it; -ENODATA with the flag */
	v[0] = v[1] = 5;
	CHECK_EQ_INT(ckpt_zarr_read_unit(s, "mn", &m, g, v, sc), 0);
	CHECK(v[0] == 0 && v[1] == 0);
	m.missing_is_error = 1;
	CHECK_EQ_INT(ckpt_zarr_read_unit(s, "mn", &m, g, v, sc), -ENODATA);
	ckpt_zarr_scratch_destroy(sc);

	/* through an array: -EIO, logged once per chunk, other chunks read */
	ckpt_ctx *ctx;
	CHECK_EQ_INT(ckpt_ctx_create(NULL, &ctx), 0);
	ckpt_array *a;
	ckpt_array_open_opts o = { .format = 2, .missing_is_error = 1 };
	CHECK_EQ_INT(ckpt_array_open_ex(ctx, s, "m0", &o, &a), 0);
	ckpt_log_set_sink(count_log);
	nlogged_missing = 0;
	ckpt_region all, first;
	uint64_t shape[1] = { 4 };
	ckpt_region_full(&all, 1, shape);
	ckpt_region_full(&first, 1, shape);
	first.stop[0] = 2;
	float out[4];
	for (int i = 0; i < 3; i++)
		CHECK_EQ_INT(ckpt_array_read(a, &all, 0, sizeof(out), out), -EIO);
	CHECK_EQ_INT(nlogged_missing, 1);
	CHECK(strstr(last_log, "m0") && strstr(last_log, "(1)"));
	CHECK_EQ_INT(ckpt_array_read(a, &first, 0, 8, out), 8);
	CHECK(out[0] == 7 && out[1] == 8);
	/* the chunk appears: read at once (failures are not cached) */
	float two[2] = { 9, 10 };
	put_file("m0/1", two, sizeof(two));
	CHECK_EQ_INT(ckpt_array_read(a, &all, 0, sizeof(out), out), (int)sizeof(out));
	CHECK(out[2] == 9 && out[3] == 10);
	/* replaced under the mount: the cached chunk is served until a new
	 * epoch, then the new bytes */
	float three[2] = { 11, 12 };
	put_file("m0/1", three, sizeof(three)); /* same size: mtime differs */
	struct timespec ts[2] = { { 0, UTIME_OMIT }, { 1000, 0 } };
	char p[512];
	snprintf(p, sizeof(p), "%s/m0/1", dir);
	utimensat(AT_FDCWD, p, ts, 0);
	ckpt_array_revalidate(a);
	CHECK_EQ_INT(ckpt_array_read(a, &all, 0, sizeof(out), out), (int)sizeof(out));
	CHECK(out[0] == 7 && out[2] == 11 && out[3] == 12);
	/* deleted: EIO (missing with the flag), not the cached bytes */
	unlink(p);
	ckpt_array_revalidate(a);
	CHECK_EQ_INT(ckpt_array_read(a, &all, 0, sizeof(out), out), -EIO);
	CHECK_EQ_INT(ckpt_array_read(a, &first, 0, 8, out), 8);
	ckpt_log_set_sink(NULL);
	ckpt_array_destroy(a);
	/* without the flag, a v2 null fill reads the missing chunk as zeros */
	CHECK_EQ_INT(ckpt_array_open_ex(ctx, s, "mn", NULL, &a), 0);
	CHECK_EQ_INT(ckpt_array_read(a, &all, 0, sizeof(out), out), (int)sizeof(out));
	CHECK(out[0] == 7 && out[1] == 8 && out[2] == 0 && out[3] == 0);
	ckpt_array_destroy(a);
	/* with it, EIO */
	CHECK_EQ_INT(ckpt_array_open_ex(ctx, s, "mn", &o, &a), 0);
	ckpt_log_set_sink(count_log);
	CHECK_EQ_INT(ckpt_array_read(a, &all, 0, sizeof(out), out), -EIO);
	ckpt_log_set_sink(NULL);
	ckpt_array_destroy(a);
	ckpt_ctx_destroy(ctx);
}

/* A whole raw array in a folder is read straight from the chunk files
 * (direct_read): the bytes of any range, pieces of several chunks in one
 * reply, nothing decoded or cached; a missing chunk still reads as the
 * fill value, a chunk of the wrong size is EIO, and a chunk that changed
 * after this epoch served it is ESTALE for the rest of the epoch, then
 * read anew. */
static void test_direct(ckpt_store *s)
{
	/* int32 [6, 4] in chunks [4, 2]: each row of the array is 2 pieces,
	 * each chunk file holds 4 x 2 elements (the last row of chunks padded) */
	const char *json = "{\"zarr_format\":2,\"shape\":[6,4],\"chunks\":[4,2],\"dtype\":\"<i4\","
			   "\"compressor\":null,\"fill_value\":-1,\"filters\":null,\"order\":\"C\"}";
	put_file("dr/.zarray", json, strlen(json));
	for (int ci = 0; ci < 2; ci++)
		for (int cj = 0; cj < 2; cj++) {
			int32_t c[8];
			for (int k = 0; k < 8; k++) {
				int i = ci * 4 + k / 2, j = cj * 2 + k % 2;
				c[k] = i < 6 ? i * 4 + j : 999;
			}
			char key[32];
			snprintf(key, sizeof(key), "dr/%d.%d", ci, cj);
			if (ci == 1 && cj == 1)
				continue; /* missing: the fill value */
			put_file(key, c, sizeof(c));
		}
	int32_t want[24];
	for (int k = 0; k < 24; k++)
		want[k] = k >= 16 && k % 4 >= 2 ? -1 : k;
	ckpt_ctx *ctx;
	CHECK_EQ_INT(ckpt_ctx_create(NULL, &ctx), 0);
	ckpt_cache *cache = ckpt_ctx_cache(ctx);
	ckpt_array *a;
	CHECK_EQ_INT(ckpt_array_open(ctx, s, "dr", 2, &a), 0);
	ckpt_region all;
	uint64_t shape[2] = { 6, 4 };
	ckpt_region_full(&all, 2, shape);
	uint64_t decoded = atomic_load(&ckpt_g_stats.chunks_decoded);
	/* the first 4 rows (chunks 0.0 and 0.1 only): every byte range */
	uint8_t out[96];
	for (size_t off = 0; off < 64; off += 3)
		for (size_t len = 1; off + len <= 64; len += 5) {
			memset(out, 0x55, sizeof(out));
			CHECK_EQ_INT(ckpt_array_read(a, &all, off, len, out), (int)len);
			CHECK(memcmp(out, (const uint8_t *)want + off, len) == 0);
			CHECK(out[len] == 0x55);
		}
	CHECK_EQ_INT(ckpt_cache_bytes(cache), 0);
	CHECK(atomic_load(&ckpt_g_stats.chunks_decoded) == decoded);
	/* the whole array: the missing chunk through the cache, as the fill value */
	CHECK_EQ_INT(ckpt_array_read(a, &all, 0, sizeof(want), out), (int)sizeof(want));
	CHECK(memcmp(out, want, sizeof(want)) == 0);
	/* a chunk of the wrong size: EIO (logged), as decoding it says */
	int32_t shortc[7] = { 0 };
	put_file("dr/1.0", shortc, sizeof(shortc));
	ckpt_array_revalidate(a);
	ckpt_log_set_sink(count_log);
	CHECK_EQ_INT(ckpt_array_read(a, &all, 64, 32, out), -EIO);
	/* changed after this epoch served it: ESTALE until the next epoch */
	int32_t c00[8];
	for (int k = 0; k < 8; k++)
		c00[k] = (k / 2) * 4 + k % 2;
	CHECK_EQ_INT(ckpt_array_read(a, &all, 0, 16, out), 16);
	c00[0] = 100;
	put_file("dr/0.0", c00, sizeof(c00));
	struct timespec ts[2] = { { 0, UTIME_OMIT }, { 2000, 0 } };
	char p[512];
	snprintf(p, sizeof(p), "%s/dr/0.0", dir);
	utimensat(AT_FDCWD, p, ts, 0);
	CHECK_EQ_INT(ckpt_array_read(a, &all, 0, 16, out), -ESTALE);
	CHECK_EQ_INT(ckpt_array_read(a, &all, 32, 16, out), -ESTALE);
	ckpt_log_set_sink(NULL);
	ckpt_array_revalidate(a);
	CHECK_EQ_INT(ckpt_array_read(a, &all, 0, 16, out), 16);
	CHECK(out[0] == 100 && out[4] == 1);
	ckpt_array_destroy(a);
	ckpt_ctx_destroy(ctx);
}

/* An int32 zarr v2 array `name` of shape sh (rank r, 1 to 4) in chunks
 * ch, its element at index i the C-order position i; chunk files full
 * size (edge chunks padded with 999), zlib-compressed when zl. */
static void put_i32_nd(const char *name, int r, const int *sh, const int *ch, int zl)
{
	char json[512], key[128], dims[2][64];
	for (int k = 0; k < 2; k++) {
		const int *v = k ? ch : sh;
		int w = 0;
		for (int d = 0; d < r; d++)
			w += snprintf(dims[k] + w, sizeof(dims[k]) - (size_t)w, "%s%d", d ? "," : "", v[d]);
	}
	snprintf(json, sizeof(json),
		 "{\"zarr_format\":2,\"shape\":[%s],\"chunks\":[%s],\"dtype\":\"<i4\","
		 "\"compressor\":%s,\"fill_value\":-1,\"filters\":null,\"order\":\"C\"}",
		 dims[0], dims[1], zl ? "{\"id\":\"zlib\",\"level\":1}" : "null");
	snprintf(key, sizeof(key), "%s/.zarray", name);
	put_file(key, json, strlen(json));
	int n = 1, grid[4], g[4] = { 0 };
	for (int d = 0; d < r; d++) {
		n *= ch[d];
		grid[d] = (sh[d] + ch[d] - 1) / ch[d];
	}
	int32_t *c = malloc(sizeof(int32_t) * (size_t)n);
	uLongf zcap = compressBound(sizeof(int32_t) * (uLong)n);
	uint8_t *z = malloc(zcap);
	for (;;) {
		for (int e = 0; e < n; e++) {
			int rest = e, inside = 1;
			int64_t pos = 0;
			int idx[4] = { 0 };
			for (int d = r - 1; d >= 0; d--) {
				idx[d] = g[d] * ch[d] + rest % ch[d];
				rest /= ch[d];
				inside &= idx[d] < sh[d];
			}
			for (int d = 0; d < r; d++)
				pos = pos * sh[d] + idx[d];
			c[e] = inside ? (int32_t)pos : 999;
		}
		int w = snprintf(key, sizeof(key), "%s/", name);
		for (int d = 0; d < r; d++)
			w += snprintf(key + w, sizeof(key) - (size_t)w, "%s%d", d ? "." : "", g[d]);
		uLongf zl_len = zcap;
		if (zl && compress2(z, &zl_len, (const Bytef *)c, sizeof(int32_t) * (uLong)n, 1) == Z_OK)
			put_file(key, z, zl_len);
		else
			put_file(key, c, sizeof(int32_t) * (size_t)n);
		int d = r - 1;
		while (d >= 0 && ++g[d] == grid[d])
			g[d--] = 0;
		if (d < 0)
			break;
	}
	free(z);
	free(c);
}

/* Whole-array reads of arrays whose chunks cut one or several dimensions
 * (edge chunks clipped in each): ranges read straight from the raw chunk
 * files (direct_read) and mapped onto the cached chunks of the same array
 * compressed (ckpt_array_map) give the C-order bytes: the pieces of a row
 * follow each other, and a row in other chunks than the one before finds
 * its own.  Fixed layouts, then 40 drawn with a fixed seed (rank 1 to 4,
 * dimensions 1 to 7). */
static void test_pieces(ckpt_store *s)
{
	static const int fixed[][9] = {
		{ 3, 5, 3, 7, 2, 2, 3 }, /* cut in every dimension: rows of 3 pieces */
		{ 3, 4, 6, 5, 2, 4, 5 }, /* the last dimension whole: rows along dimension 1 */
		{ 3, 3, 4, 9, 3, 4, 2 }, /* one chunk along dimensions 0 and 1 */
		{ 1, 10, 3 }, /* one row, 4 pieces */
		{ 2, 4, 4, 4, 4 }, /* one chunk */
	};
	unsigned seed = 12345;
	int nfixed = (int)(sizeof(fixed) / sizeof(fixed[0]));
	for (int li = 0; li < nfixed + 40; li++) {
		int r, sh[4], ch[4];
		if (li < nfixed) {
			r = fixed[li][0];
			for (int d = 0; d < r; d++) {
				sh[d] = fixed[li][1 + d];
				ch[d] = fixed[li][1 + r + d];
			}
		} else {
			r = 1 + (int)(rand_r(&seed) % 4);
			for (int d = 0; d < r; d++) {
				sh[d] = 1 + (int)(rand_r(&seed) % 7);
				ch[d] = 1 + (int)(rand_r(&seed) % (unsigned)sh[d]);
			}
		}
		uint64_t shape[4];
		size_t count = 1;
		for (int d = 0; d < r; d++) {
			shape[d] = (uint64_t)sh[d];
			count *= (size_t)sh[d];
		}
		size_t nb = count * sizeof(int32_t);
		int32_t *want = malloc(nb);
		uint8_t *out = malloc(nb + 1), *w8 = (uint8_t *)want;
		for (size_t e = 0; e < count; e++)
			want[e] = (int32_t)e;
		char raw[32], zl[32];
		snprintf(raw, sizeof(raw), "pcraw%d", li);
		snprintf(zl, sizeof(zl), "pczl%d", li);
		put_i32_nd(raw, r, sh, ch, 0);
		put_i32_nd(zl, r, sh, ch, 1);
		ckpt_ctx *ctx;
		CHECK_EQ_INT(ckpt_ctx_create(NULL, &ctx), 0);
		ckpt_array *a, *b;
		CHECK_EQ_INT(ckpt_array_open(ctx, s, raw, 2, &a), 0);
		CHECK_EQ_INT(ckpt_array_open(ctx, s, zl, 2, &b), 0);
		ckpt_region all;
		ckpt_region_full(&all, r, shape);
		uint64_t decoded = atomic_load(&ckpt_g_stats.chunks_decoded);
		size_t step = nb > 400 ? 7 : 3;
		for (size_t off = 0; off < nb; off += step)
			for (size_t len = 1; off + len <= nb; len += 13) {
				memset(out, 0x55, nb + 1);
				CHECK_EQ_INT(ckpt_array_read(a, &all, off, len, out), (int)len);
				CHECK(memcmp(out, w8 + off, len) == 0);
				CHECK(out[len] == 0x55);
			}
		CHECK(atomic_load(&ckpt_g_stats.chunks_decoded) == decoded); /* all direct */
		struct iovec iov[512];
		ckpt_pin *pins[512];
		for (size_t off = 0; off < nb; off += step + 4)
			for (size_t len = 1; off + len <= nb; len += 17) {
				int n = ckpt_array_map(b, &all, off, len, iov, pins, 512);
				CHECK(n > 0);
				if (n <= 0)
					continue;
				size_t at = 0;
				for (int i = 0; i < n; i++) {
					CHECK(at + iov[i].iov_len <= len);
					if (at + iov[i].iov_len <= len)
						memcpy(out + at, iov[i].iov_base, iov[i].iov_len);
					at += iov[i].iov_len;
				}
				CHECK(at == len);
				CHECK(memcmp(out, w8 + off, len) == 0);
				for (int i = 0; i < n; i++)
					ckpt_ctx_unpin(ctx, pins[i]);
			}
		ckpt_array_destroy(b);
		ckpt_array_destroy(a);
		ckpt_ctx_destroy(ctx);
		free(out);
		free(want);
	}
}

/* A raw int32 zarr v2 array `name` of rows x cols values `want`, in chunks
 * of cr x cc that divide it: its .zarray and chunk files. */
static void put_raw_i32(const char *name, const int32_t *want, int rows, int cols, int cr, int cc)
{
	char json[320], key[64];
	snprintf(json, sizeof(json),
		 "{\"zarr_format\":2,\"shape\":[%d,%d],\"chunks\":[%d,%d],\"dtype\":\"<i4\","
		 "\"compressor\":null,\"fill_value\":-1,\"filters\":null,\"order\":\"C\"}",
		 rows, cols, cr, cc);
	snprintf(key, sizeof(key), "%s/.zarray", name);
	put_file(key, json, strlen(json));
	int32_t *c = malloc(sizeof(int32_t) * (size_t)(cr * cc));
	for (int ci = 0; ci < rows / cr; ci++)
		for (int cj = 0; cj < cols / cc; cj++) {
			for (int k = 0; k < cr * cc; k++)
				c[k] = want[(ci * cr + k / cc) * cols + cj * cc + k % cc];
			snprintf(key, sizeof(key), "%s/%d.%d", name, ci, cj);
			put_file(key, c, sizeof(int32_t) * (size_t)(cr * cc));
		}
	free(c);
}

/* A direct read keeps its unit files open for the later reads of the same
 * epoch (lib/read/kept.h): ten reads of the first rows open each of their
 * 2 chunk files once.  A file renamed over one of them is not seen by that
 * epoch (its reads get the bytes of the file they first opened), and is by
 * the next; a read that reaches the array's end, a retirement and destroy
 * leave no file open. */
static void test_direct_kept(ckpt_store *s)
{
	/* int32 [8, 4] in chunks [4, 2]: element (i, j) = 10 i + j */
	int32_t want[32];
	for (int k = 0; k < 32; k++)
		want[k] = k / 4 * 10 + k % 4;
	put_raw_i32("dk", want, 8, 4, 4, 2);
	ckpt_ctx *ctx;
	CHECK_EQ_INT(ckpt_ctx_create(NULL, &ctx), 0);
	ckpt_array *a;
	CHECK_EQ_INT(ckpt_array_open(ctx, s, "dk", 2, &a), 0);
	ckpt_region all;
	uint64_t shape[2] = { 8, 4 };
	ckpt_region_full(&all, 2, shape);
	uint64_t opens = atomic_load(&ckpt_g_stats.backing_opens);
	int64_t kept = atomic_load(&ckpt_g_stats.kept_files);
	uint8_t out[128];
	for (int i = 0; i < 10; i++) {
		CHECK_EQ_INT(ckpt_array_read(a, &all, 0, 64, out), 64);
		CHECK(memcmp(out, want, 64) == 0);
	}
	CHECK(atomic_load(&ckpt_g_stats.backing_opens) - opens == 2);
	CHECK(atomic_load(&ckpt_g_stats.kept_files) - kept == 2);
	/* chunk 0.0 replaced by rename: this epoch keeps reading the file it opened */
	int32_t c00[8];
	for (int k = 0; k < 8; k++)
		c00[k] = 1000 + k;
	put_file("dk/new", c00, sizeof(c00));
	char from[512], to[512];
	snprintf(from, sizeof(from), "%s/dk/new", dir);
	snprintf(to, sizeof(to), "%s/dk/0.0", dir);
	CHECK_EQ_INT(rename(from, to), 0);
	CHECK_EQ_INT(ckpt_array_read(a, &all, 0, 64, out), 64);
	CHECK(memcmp(out, want, 64) == 0);
	/* the next epoch (an open of a file backed by the array) opens it anew */
	ckpt_array_revalidate(a);
	CHECK_EQ_INT(ckpt_array_read(a, &all, 0, 64, out), 64);
	int32_t got[16];
	memcpy(got, out, sizeof(got));
	CHECK(got[0] == 1000 && got[1] == 1001 && got[4] == 1002 && got[2] == 2);
	CHECK(atomic_load(&ckpt_g_stats.backing_opens) - opens == 4);
	CHECK(atomic_load(&ckpt_g_stats.kept_files) - kept == 2);
	/* read to the end: nothing held open */
	CHECK_EQ_INT(ckpt_array_read(a, &all, 64, 64, out), 64);
	CHECK(memcmp(out, want + 16, 64) == 0);
	CHECK(atomic_load(&ckpt_g_stats.kept_files) == kept);
	/* retired (its step went): nothing held open, every read ESTALE */
	CHECK_EQ_INT(ckpt_array_read(a, &all, 0, 64, out), 64);
	CHECK(atomic_load(&ckpt_g_stats.kept_files) - kept == 2);
	ckpt_arrays_retire(ctx, &a, 1);
	CHECK(atomic_load(&ckpt_g_stats.kept_files) == kept);
	CHECK_EQ_INT(ckpt_array_read(a, &all, 0, 64, out), -ESTALE);
	ckpt_array_destroy(a);
	/* destroy closes what a read kept */
	CHECK_EQ_INT(ckpt_array_open(ctx, s, "dk", 2, &a), 0);
	CHECK_EQ_INT(ckpt_array_read(a, &all, 0, 64, out), 64);
	CHECK(atomic_load(&ckpt_g_stats.kept_files) - kept == 2);
	ckpt_array_destroy(a);
	CHECK(atomic_load(&ckpt_g_stats.kept_files) == kept);
	ckpt_ctx_destroy(ctx);
}

/* Reads of one raw array from 4 threads while another starts epochs: the
 * kept descriptors are taken, added, dropped and released concurrently
 * (run under TSan by the test command); every read gets the right bytes
 * and nothing stays open at the end. */
struct kept_reader {
	ckpt_array *a;
	const int32_t *want;
	unsigned seed;
	atomic_int *stop;
	int bad;
};

static void *kept_read_loop(void *arg)
{
	struct kept_reader *r = arg;
	ckpt_region all;
	uint64_t shape[2] = { 64, 64 };
	ckpt_region_full(&all, 2, shape);
	uint8_t out[64 * 64 * 4];
	for (int i = 0; i < 400 && !atomic_load(r->stop); i++) {
		r->seed = r->seed * 1103515245u + 12345u;
		size_t off = (r->seed >> 8) % sizeof(out), len = 1 + (r->seed >> 3) % 4096;
		if (i % 50 == 49)
			off = sizeof(out) - len; /* to the end: drops what the set keeps */
		if (off + len > sizeof(out))
			len = sizeof(out) - off;
		if (ckpt_array_read(r->a, &all, off, len, out) != (ssize_t)len ||
		    memcmp(out, (const uint8_t *)r->want + off, len) != 0)
			r->bad++;
	}
	return NULL;
}

static void test_direct_kept_threads(ckpt_store *s)
{
	/* int32 [64, 64] in chunks [16, 8]: 32 files, more than a set keeps */
	static int32_t want[64 * 64];
	for (int k = 0; k < 64 * 64; k++)
		want[k] = k * 3 + 1;
	put_raw_i32("dt", want, 64, 64, 16, 8);
	ckpt_ctx *ctx;
	CHECK_EQ_INT(ckpt_ctx_create(NULL, &ctx), 0);
	ckpt_array *a;
	CHECK_EQ_INT(ckpt_array_open(ctx, s, "dt", 2, &a), 0);
	int64_t kept = atomic_load(&ckpt_g_stats.kept_files);
	atomic_int stop = 0;
	struct kept_reader r[4];
	pthread_t t[4];
	for (int i = 0; i < 4; i++) {
		r[i] = (struct kept_reader){ a, want, 77u * (unsigned)i + 1, &stop, 0 };
		CHECK_EQ_INT(pthread_create(&t[i], NULL, kept_read_loop, &r[i]), 0);
	}
	for (int i = 0; i < 200; i++) {
		ckpt_array_revalidate(a);
		usleep(100);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(t[i], NULL);
		CHECK_EQ_INT(r[i].bad, 0);
	}
	ckpt_array_destroy(a);
	CHECK(atomic_load(&ckpt_g_stats.kept_files) == kept);
	ckpt_ctx_destroy(ctx);
}

/* kept.h's slots on their own: the context's limit, the least recently
 * used idle slot giving way, a slot dropped while in use closed by its last
 * release, and slots of an older epoch dropped by the next take. */
static int fd_open(int fd)
{
	return fcntl(fd, F_GETFD) != -1;
}

static void test_kept_slots(void)
{
	ckpt_kept_limit lim = { 0 };
	lim.max = 3;
	ckpt_kept *k = ckpt_kept_create(&lim);
	CHECK(k != NULL);
	int fds[5], fd;
	for (int i = 0; i < 5; i++)
		fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
	int s0 = ckpt_kept_add(k, 0, 7, fds[0]), s1 = ckpt_kept_add(k, 1, 7, fds[1]);
	int s2 = ckpt_kept_add(k, 2, 7, fds[2]);
	CHECK(s0 >= 0 && s1 >= 0 && s2 >= 0 && atomic_load(&lim.open) == 3);
	CHECK_EQ_INT(ckpt_kept_add(k, 3, 7, fds[3]), -1); /* the limit: the caller keeps fds[3] */
	CHECK(fd_open(fds[3]));
	ckpt_kept_release(k, s1);
	ckpt_kept_release(k, s0);
	ckpt_kept_release(k, s2);
	CHECK_EQ_INT(ckpt_kept_take(k, 1, 7, &fd), s1); /* 1 used last now; 0 then 2 before it */
	CHECK(fd == fds[1]);
	ckpt_kept_release(k, s1);
	int s3 = ckpt_kept_add(k, 3, 7, fds[3]); /* in place of the least recently used (0) */
	CHECK(s3 == s0 && !fd_open(fds[0]) && atomic_load(&lim.open) == 3);
	ckpt_kept_release(k, s3);
	CHECK_EQ_INT(ckpt_kept_take(k, 0, 7, &fd), -1);
	CHECK_EQ_INT(ckpt_kept_take(k, 2, 7, &fd), s2);
	ckpt_kept_drop(k); /* 1 and 3 closed; 2, in use, when released */
	CHECK(!fd_open(fds[1]) && !fd_open(fds[3]) && fd_open(fds[2]));
	CHECK_EQ_INT(ckpt_kept_take(k, 2, 7, &fd), -1);
	ckpt_kept_release(k, s2);
	CHECK(!fd_open(fds[2]) && atomic_load(&lim.open) == 0);
	/* another epoch: the next take drops the older slots */
	int s4 = ckpt_kept_add(k, 4, 7, fds[4]);
	CHECK(s4 >= 0);
	ckpt_kept_release(k, s4);
	CHECK_EQ_INT(ckpt_kept_take(k, 4, 8, &fd), -1);
	CHECK(!fd_open(fds[4]) && atomic_load(&lim.open) == 0);
	/* two reads that missed at once both add the unit: a take takes one */
	int d0 = open("/dev/null", O_RDONLY | O_CLOEXEC), d1 = open("/dev/null", O_RDONLY | O_CLOEXEC);
	int a0 = ckpt_kept_add(k, 5, 8, d0), a1 = ckpt_kept_add(k, 5, 8, d1);
	CHECK(a0 >= 0 && a1 >= 0 && a0 != a1);
	ckpt_kept_release(k, a0);
	ckpt_kept_release(k, a1);
	int t5 = ckpt_kept_take(k, 5, 8, &fd);
	CHECK(t5 >= 0);
	ckpt_kept_release(k, t5);
	ckpt_kept_drop(k); /* every slot idle: all closed now */
	CHECK(!fd_open(d0) && !fd_open(d1) && atomic_load(&lim.open) == 0);
	ckpt_kept_destroy(k);
}

/* The context's pool, started before a fork (an OCDBT item opened while the
 * daemon built its view): the child gets a pool of its own whose tasks run,
 * the parent keeps its own. */
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TSAN_CLANG 1
#endif
#endif
#ifndef TSAN_CLANG
#define TSAN_CLANG 0
#endif

static void set_flag(void *arg)
{
	atomic_store((atomic_int *)arg, 1);
}

static int pool_runs(ckpt_pool *p)
{
	static atomic_int flag;
	atomic_store(&flag, 0);
	if (!p || ckpt_pool_submit(p, set_flag, (void *)&flag) != 0)
		return 0;
	for (int i = 0; i < 2000 && !atomic_load(&flag); i++)
		usleep(1000);
	return atomic_load(&flag);
}

static void test_ctx_pool_fork(void)
{
	ckpt_ctx *ctx;
	CHECK_EQ_INT(ckpt_ctx_create(NULL, &ctx), 0);
	ckpt_pool *p = ckpt_ctx_pool(ctx);
	CHECK(p != NULL && ckpt_ctx_pool(ctx) == p);
	CHECK(pool_runs(p));
	ckpt_ctx_quiesce(ctx); /* as ckpt_view_open returns */
#if defined(__SANITIZE_THREAD__) || TSAN_CLANG
	/* ThreadSanitizer does not support threads started in the child of a
	 * multi-threaded fork: the child half runs in the other builds. */
	ckpt_ctx_destroy(ctx);
	return;
#endif
	pid_t pid = fork();
	if (pid == 0) {
		alarm(10);
		ckpt_pool *q = ckpt_ctx_pool(ctx);
		int ok = q && q != p && ckpt_ctx_pool(ctx) == q && pool_runs(q);
		ckpt_ctx_destroy(ctx); /* its pool and the parent's copy */
		_exit(ok ? 0 : 1);
	}
	int st = 0;
	CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	CHECK(ckpt_ctx_pool(ctx) == p);
	/* A child that never needed threads destroys the context (a daemon
	 * unmounted before any read): the parent's workers are not there to
	 * join, which must not hang it (SIGALRM ends it if it does). */
	pid = fork();
	if (pid == 0) {
		alarm(10);
		ckpt_ctx_destroy(ctx);
		_exit(0);
	}
	CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	ckpt_ctx_destroy(ctx);
}

static void slow_set_flag(void *arg)
{
	usleep(50000);
	atomic_store((atomic_int *)arg, 1);
}

/* A pool is at rest when create returns (every worker started and parked)
 * and after ckpt_pool_quiesce (a running task returned, not only the queue
 * emptied).  A worker that is still starting is inside the thread library
 * and a sanitizer's runtime (ASan's allocator, for its own thread set-up):
 * a fork then copies that runtime's lock into the child held, and the
 * child's own first thread stalls on it for good. */
static void test_pool_rest(void)
{
	enum { N = 32 };
	ckpt_pool *p;
	CHECK_EQ_INT(ckpt_pool_create(N, 4, &p), 0);
	CHECK_EQ_INT(ckpt_pool_parked(p), N);
	static atomic_int done;
	atomic_store(&done, 0);
	CHECK_EQ_INT(ckpt_pool_submit(p, slow_set_flag, (void *)&done), 0);
	ckpt_pool_quiesce(p);
	CHECK(atomic_load(&done));
	CHECK_EQ_INT(ckpt_pool_parked(p), N);
	ckpt_pool_quiesce(p); /* at rest already: returns at once */
	ckpt_pool_destroy(p);
#if !(defined(__SANITIZE_THREAD__) || TSAN_CLANG)
	/* Fork right after create, again and again: the child's pool runs, and
	 * the parent's pool destroyed in the child returns (nothing to join). */
	for (int i = 0; i < 20; i++) {
		CHECK_EQ_INT(ckpt_pool_create(N, 4, &p), 0);
		pid_t pid = fork();
		if (pid == 0) {
			alarm(10);
			ckpt_pool_destroy(p);
			ckpt_pool *q = NULL;
			_exit(ckpt_pool_create(2, 4, &q) == 0 && pool_runs(q) ? 0 : 1);
		}
		int st = 0;
		CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
		ckpt_pool_destroy(p);
	}
#endif
}

/* ---- large compressed chunks: read, not mapped ---------------------- */

/* A store over the folder store that counts reads, and with `shrink` set
 * truncates the file right before it passes a read on (as another process
 * might while the daemon decodes). */
struct spy {
	struct fwd_store f;
	int reads, shrink;
};

static ssize_t spy_read(ckpt_store *s, const char *k, uint64_t off, size_t len, void *dst)
{
	struct spy *p = (struct spy *)s;
	p->reads++;
	if (p->shrink) {
		char path[512];
		snprintf(path, sizeof(path), "%s/%s", dir, k);
		CHECK_EQ_INT(truncate(path, 0), 0);
	}
	return fwd_read(s, k, off, len, dst);
}

static void spy_destroy(ckpt_store *s)
{
	(void)s; /* on the stack; the folder store is the test's */
}

static const struct ckpt_store_ops spy_ops = {
	.size = fwd_size,
	.read = spy_read,
	.list = fwd_list,
	.listdir = fwd_listdir,
	.stat = fwd_stat,
	.destroy = spy_destroy,
};

/* Bytes zstd cannot shrink much: the stored chunk stays large. */
static void noise(uint32_t *v, size_t n, uint32_t seed)
{
	uint32_t x = seed | 1;
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		v[i] = x;
	}
}

/* Zstd chunks of 512 KiB, zarr v2 and in v3 shards, are read (pread into
 * the scratch buffer) and decoded from there; a file that shrinks under
 * the read fails it with EIO.  The library installs no signal handler: the
 * SIGBUS disposition is the same after the decodes as before. */
static void test_large_chunks(ckpt_store *dirs)
{
	struct sigaction bus0, bus1;
	CHECK_EQ_INT(sigaction(SIGBUS, NULL, &bus0), 0);
	struct spy spy = { { { &spy_ops, (char *)"spy", 0 }, dirs }, 0, 0 };
	ckpt_store *s = &spy.f.base;
	enum { R = 512, C = 256 }; /* 512 KiB of uint32 per chunk */
	size_t nb = (size_t)R * C * 4;
	uint32_t *v = malloc(nb), *got = malloc(nb);
	size_t cap = ZSTD_compressBound(nb) * 2 + 64;
	uint8_t *z = malloc(cap);
	ckpt_zarr_scratch *sc = ckpt_zarr_scratch_create();

	/* zarr v2, one zstd chunk: one read */
	const char *j2 = "{\"zarr_format\":2,\"shape\":[512,256],\"chunks\":[512,256],\"dtype\":\"<u4\","
			 "\"compressor\":{\"id\":\"zstd\",\"level\":1},\"fill_value\":0,\"order\":\"C\","
			 "\"filters\":null}";
	put_file("mp2/.zarray", j2, strlen(j2));
	noise(v, (size_t)R * C, 7);
	size_t zn = ZSTD_compress(z, cap, v, nb, 1);
	CHECK(zn >= nb / 2);
	put_file("mp2/0.0", z, zn);
	ckpt_array_meta m, m2;
	CHECK_EQ_INT(parse(2, j2, &m), 0);
	m2 = m;
	uint64_t g[2] = { 0, 0 };
	CHECK_EQ_INT(ckpt_zarr_read_unit(s, "mp2", &m, g, got, sc), 0);
	CHECK(memcmp(got, v, nb) == 0);
	CHECK_EQ_INT(spy.reads, 1);

	/* the file shrinks between its stat and its read: EIO, and the
	 * scratch decodes the next chunk correctly */
	spy.shrink = 1;
	memset(got, 0, nb);
	CHECK_EQ_INT(ckpt_zarr_read_unit(s, "mp2", &m, g, got, sc), -EIO);
	spy.shrink = 0;
	put_file("mp2/0.0", z, zn);
	CHECK_EQ_INT(ckpt_zarr_read_unit(s, "mp2", &m, g, got, sc), 0);
	CHECK(memcmp(got, v, nb) == 0);

	/* v3 shards: two inner chunks (index at the end, crc32c after zstd
	 * inside each chunk), and one inner chunk (decoded in place as well,
	 * the index read first) */
	for (int inner = 1; inner <= 2; inner++) {
		char json[1024], pre[16], key[32];
		snprintf(json, sizeof(json),
			 "{\"zarr_format\":3,\"node_type\":\"array\",\"shape\":[%d,256],\"data_type\":"
			 "\"uint32\","
			 "\"chunk_grid\":{\"name\":\"regular\",\"configuration\":{\"chunk_shape\":[%d,256]}},"
			 "\"chunk_key_encoding\":{\"name\":\"default\"},\"fill_value\":0,"
			 "\"codecs\":[{\"name\":\"sharding_indexed\",\"configuration\":{\"chunk_shape\":[512,"
			 "256],"
			 "\"codecs\":[{\"name\":\"bytes\",\"configuration\":{\"endian\":\"little\"}},"
			 "{\"name\":\"zstd\"},{\"name\":\"crc32c\"}],"
			 "\"index_codecs\":[{\"name\":\"bytes\",\"configuration\":{\"endian\":\"little\"}},"
			 "{\"name\":\"crc32c\"}],\"index_location\":\"end\"}}]}",
			 512 * inner, 512 * inner);
		snprintf(pre, sizeof(pre), "mp3_%d", inner);
		snprintf(key, sizeof(key), "%s/zarr.json", pre);
		put_file(key, json, strlen(json));
		CHECK_EQ_INT(parse(3, json, &m), 0);
		size_t pos = 0;
		uint8_t ix[2 * 16 + 4];
		for (int c = 0; c < inner; c++) {
			noise(v, (size_t)R * C, 100 + (uint32_t)c);
			size_t n = ZSTD_compress(z + pos, cap - pos - 4, v, nb, 1);
			ckpt_put_le32(z + pos + n, ckpt_crc32c(0, z + pos, n));
			ckpt_put_le64(ix + 16 * c, pos);
			ckpt_put_le64(ix + 16 * c + 8, n + 4);
			pos += n + 4;
		}
		ckpt_put_le32(ix + 16 * inner, ckpt_crc32c(0, ix, 16 * (size_t)inner));
		memcpy(z + pos, ix, 16 * (size_t)inner + 4);
		pos += 16 * (size_t)inner + 4;
		snprintf(key, sizeof(key), "%s/c/0/0", pre);
		put_file(key, z, pos);
		spy.reads = 0;
		for (int c = 0; c < inner; c++) {
			uint64_t gi[2] = { (uint64_t)c, 0 };
			CHECK_EQ_INT(ckpt_zarr_read_unit(s, pre, &m, gi, got, sc), 0);
			noise(v, (size_t)R * C, 100 + (uint32_t)c);
			CHECK(memcmp(got, v, nb) == 0);
		}
		CHECK_EQ_INT(spy.reads, inner == 1 ? 1 : 2 * inner);
	}

	/* straight from the folder store too (a mapping used to be made here,
	 * and a SIGBUS handler installed for it) */
	noise(v, (size_t)R * C, 7);
	CHECK_EQ_INT(ckpt_zarr_read_unit(dirs, "mp2", &m2, g, got, sc), 0);
	CHECK(memcmp(got, v, nb) == 0);
	CHECK_EQ_INT(sigaction(SIGBUS, NULL, &bus1), 0);
	CHECK(bus1.sa_handler == bus0.sa_handler &&
	      (bus1.sa_flags & SA_SIGINFO) == (bus0.sa_flags & SA_SIGINFO));

	ckpt_zarr_scratch_destroy(sc);
	free(z);
	free(got);
	free(v);
}

int main(void)
{
	snprintf(dir, sizeof(dir), "/tmp/ckpt_test_zarr.XXXXXX");
	if (!mkdtemp(dir))
		return 1;
	ckpt_store *s;
	CHECK_EQ_INT(ckpt_store_dir_open(dir, &s), 0);
	CHECK_RUN_CALL(test_sharded_start, (s));
	CHECK_RUN_CALL(test_big_endian_crc, (s));
	CHECK_RUN_CALL(test_v2_fortran, (s));
	CHECK_RUN(test_refused);
	CHECK_RUN(test_ctx_pool_fork);
	CHECK_RUN(test_pool_rest);
	CHECK_RUN_CALL(test_compressors, (s));
	CHECK_RUN_CALL(test_transpose, (s));
	CHECK_RUN_CALL(test_missing, (s));
	CHECK_RUN_CALL(test_visit, (s));
	CHECK_RUN_CALL(test_retire_drops_late_fills, (s));
	CHECK_RUN_CALL(test_direct, (s));
	CHECK_RUN_CALL(test_direct_kept, (s));
	CHECK_RUN_CALL(test_pieces, (s));
	CHECK_RUN(test_kept_slots);
	CHECK_RUN_CALL(test_direct_kept_threads, (s));
	CHECK_RUN_CALL(test_large_chunks, (s));
	ckpt_store_destroy(s);
	char cmd[300];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "cannot remove %s\n", dir);
	return CHECK_DONE();
}
