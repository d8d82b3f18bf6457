/* test_writer.c - the write path: declare arrays, write them in many ways
 * (random-sized stream pieces, slices from threads, rewrites, tiny memory
 * budget), commit, then decode the files independently (cJSON + shard
 * index + CRC-32C + ZSTD_decompress) and compare with the source bytes.
 *
 *   test_writer            run the tests (and print throughput figures)
 *   test_writer --emit DIR write a small checkpoint to DIR/root/1 plus the
 *                          expected bytes under DIR/expected (for
 *                          tests/py/test_zarr3_verify.py)
 */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <zstd.h>

#include "check.h"
#include "crc32c.h"
#include "stats.h"
#include "writer.h"
#include "writer_int.h"
#include "zarr_chunk.h"

/* ---- helpers ---- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ULL;
static uint64_t rnd(void)
{
	return check_rnd(&rng_state);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int exists(const char *path)
{
	struct stat sb;
	return stat(path, &sb) == 0;
}

static void rm_rf(const char *path)
{
	char cmd[4200];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", path);
	if (system(cmd) != 0)
		fprintf(stderr, "rm -rf %s failed\n", path);
}

static char *make_root(const char *tag)
{
	char tmpl[256];
	snprintf(tmpl, sizeof(tmpl), "/tmp/ckpt-writer-%s-XXXXXX", tag);
	char *d = mkdtemp(tmpl);
	return d ? strdup(d) : NULL;
}

/* Random contents for dt: bool 0/1, everything else random bits. */
static void fill_random(uint8_t *p, size_t n, ckpt_dtype dt)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)rnd();
	if (dt == CKPT_DT_BOOL)
		for (size_t i = 0; i < n; i++)
			p[i] &= 1;
}

static uint64_t prod(const uint64_t *s, int r)
{
	uint64_t n = 1;
	for (int i = 0; i < r; i++)
		n *= s[i];
	return n;
}

/* ---- independent decoder of what was committed ---- */

static int json_shape(const cJSON *a, uint64_t *out, int max)
{
	if (!cJSON_IsArray(a))
		return -1;
	int n = 0;
	const cJSON *e;
	cJSON_ArrayForEach(e, a)
	{
		if (n >= max || !cJSON_IsNumber(e))
			return -1;
		out[n++] = (uint64_t)e->valuedouble;
	}
	return n;
}

static const cJSON *jget(const cJSON *o, const char *k)
{
	return cJSON_GetObjectItemCaseSensitive(o, k);
}

/* Decode array `name` of the committed item folder and compare it with
 * `expect` (C order).  Returns the number of problems found (each printed);
 * callers CHECK that it is 0 (or, for corrupted files, that it is not). */
#define VOK(c)                                                                                               \
	do {                                                                                                 \
		if (!(c)) {                                                                                  \
			fprintf(stderr, "verify %s/%s: line %d: %s\n", itemdir, name, __LINE__, #c);         \
			bad++;                                                                               \
		}                                                                                            \
	} while (0)
#define VEQ(a, b)                                                                                            \
	do {                                                                                                 \
		long long va_ = (long long)(a), vb_ = (long long)(b);                                        \
		if (va_ != vb_) {                                                                            \
			fprintf(stderr, "verify %s/%s: line %d: %s == %s (%lld != %lld)\n", itemdir, name,   \
				__LINE__, #a, #b, va_, vb_);                                                 \
			bad++;                                                                               \
		}                                                                                            \
	} while (0)
static int verify_array(const char *itemdir, const char *name, ckpt_dtype dt, int rank, const uint64_t *shape,
			const uint8_t *expect)
{
	char path[4096];
	int bad = 0;
	unsigned isz = ckpt_dtype_get(dt)->itemsize;
	snprintf(path, sizeof(path), "%s/%s/zarr.json", itemdir, name);
	size_t jl;
	char *js = check_slurp(path, &jl);
	if (!js) {
		fprintf(stderr, "verify: cannot read %s\n", path);
		return 1;
	}
	/* The project's own reader must accept it too. */
	ckpt_array_meta meta;
	const char *why = NULL;
	int prc = ckpt_zarr_parse(3, js, jl, &meta, &why);
	VEQ(prc, 0);
	if (prc)
		fprintf(stderr, "zarr parse of %s: %s\n", path, why ? why : "?");
	cJSON *j = cJSON_Parse(js);
	free(js);
	VOK(j != NULL);
	if (!j)
		return bad;
	uint64_t shp[CKPT_MAX_RANK], shard[CKPT_MAX_RANK], inner[CKPT_MAX_RANK];
	VEQ(jget(j, "zarr_format")->valuedouble, 3);
	VOK(strcmp(jget(j, "node_type")->valuestring, "array") == 0);
	VOK(strcmp(jget(j, "data_type")->valuestring, ckpt_dtype_get(dt)->name) == 0);
	VEQ(json_shape(jget(j, "shape"), shp, CKPT_MAX_RANK), rank);
	for (int d = 0; d < rank; d++)
		VEQ(shp[d], shape[d]);
	const cJSON *cg = jget(j, "chunk_grid");
	VOK(strcmp(jget(cg, "name")->valuestring, "regular") == 0);
	VEQ(json_shape(jget(jget(cg, "configuration"), "chunk_shape"), shard, CKPT_MAX_RANK), rank);
	VOK(strcmp(jget(jget(j, "chunk_key_encoding"), "name")->valuestring, "default") == 0);
	const cJSON *codecs = jget(j, "codecs");
	VEQ(cJSON_GetArraySize(codecs), 1);
	const cJSON *sh = cJSON_GetArrayItem(codecs, 0);
	VOK(strcmp(jget(sh, "name")->valuestring, "sharding_indexed") == 0);
	const cJSON *shc = jget(sh, "configuration");
	VEQ(json_shape(jget(shc, "chunk_shape"), inner, CKPT_MAX_RANK), rank);
	const cJSON *ic = jget(shc, "codecs");
	VOK(strcmp(jget(cJSON_GetArrayItem(ic, 0), "name")->valuestring, "bytes") == 0);
	const cJSON *zs = cJSON_GetArrayItem(ic, 1);
	VOK(strcmp(jget(zs, "name")->valuestring, "zstd") == 0);
	VOK(cJSON_IsTrue(jget(jget(zs, "configuration"), "checksum")));
	const cJSON *ixc = jget(shc, "index_codecs");
	VOK(strcmp(jget(cJSON_GetArrayItem(ixc, 1), "name")->valuestring, "crc32c") == 0);
	VOK(strcmp(jget(shc, "index_location")->valuestring, "end") == 0);
	cJSON_Delete(j);

	uint64_t nsh[CKPT_MAX_RANK], mps[CKPT_MAX_RANK], nshards = 1, n_in = 1;
	for (int d = 0; d < rank; d++) {
		VOK(inner[d] >= 1 && shard[d] % inner[d] == 0);
		if (!inner[d] || shard[d] % inner[d])
			return bad;
		mps[d] = shard[d] / inner[d];
		nsh[d] = (shape[d] + shard[d] - 1) / shard[d];
		nshards *= nsh[d];
		n_in *= mps[d];
	}
	uint64_t chunk_elems = prod(inner, rank), cbytes = chunk_elems * isz;
	uint8_t *dec = malloc(cbytes);
	for (uint64_t s = 0; s < nshards; s++) {
		uint64_t sg[CKPT_MAX_RANK], t = s;
		for (int d = rank - 1; d >= 0; d--) {
			sg[d] = t % nsh[d];
			t /= nsh[d];
		}
		int k = snprintf(path, sizeof(path), "%s/%s/c", itemdir, name);
		for (int d = 0; d < rank; d++)
			k += snprintf(path + k, sizeof(path) - (size_t)k, "/%llu", (unsigned long long)sg[d]);
		size_t flen = 0;
		uint8_t *f = (uint8_t *)check_slurp(path, &flen);
		VOK(f != NULL);
		if (!f)
			continue;
		uint64_t isize = 16 * n_in + 4;
		VOK(flen >= isize);
		if (flen < isize) {
			free(f);
			continue;
		}
		const uint8_t *ix = f + flen - isize;
		VEQ(ckpt_crc32c(0, ix, 16 * n_in), ckpt_le32(ix + 16 * n_in));
		uint64_t l[CKPT_MAX_RANK] = { 0 };
		for (uint64_t e = 0; e < n_in; e++) {
			uint64_t off = ckpt_le64(ix + 16 * e), len = ckpt_le64(ix + 16 * e + 8);
			uint64_t g0[CKPT_MAX_RANK];
			int out = 0;
			for (int d = 0; d < rank; d++) {
				g0[d] = (sg[d] * mps[d] + l[d]) * inner[d];
				out |= g0[d] >= shape[d];
			}
			if (out) {
				VOK(off == UINT64_MAX && len == UINT64_MAX);
			} else if (off == UINT64_MAX || off + len > flen - isize) {
				VOK(!"inner chunk missing or outside the data area");
			} else {
				size_t zn = ZSTD_decompress(dec, cbytes, f + off, len);
				VOK(!ZSTD_isError(zn) && zn == cbytes);
				if (ZSTD_isError(zn))
					fprintf(stderr, "verify: %s: %s\n", path, ZSTD_getErrorName(zn));
				/* Frame magic, and the Content_Checksum_flag of the descriptor. */
				VOK(len > 5 && ckpt_le32(f + off) == 0xFD2FB528u && (f[off + 4] & 4));
				VEQ(ZSTD_findFrameCompressedSize(f + off, len), len);
				if (!ZSTD_isError(zn) && zn == cbytes) {
					/* Compare every element of the chunk. */
					uint64_t mism = 0;
					for (uint64_t ce = 0; ce < chunk_elems; ce++) {
						uint64_t rem = ce, gi = 0, stride = 1;
						int oob = 0;
						uint64_t idx[CKPT_MAX_RANK];
						for (int d = rank - 1; d >= 0; d--) {
							idx[d] = g0[d] + rem % inner[d];
							rem /= inner[d];
							oob |= idx[d] >= shape[d];
						}
						for (int d = rank - 1; d >= 0 && !oob; d--) {
							gi += idx[d] * stride;
							stride *= shape[d];
						}
						const uint8_t *got = dec + ce * isz;
						if (oob) {
							for (unsigned b = 0; b < isz; b++)
								mism += got[b] != 0;
						} else if (memcmp(got, expect + gi * isz, isz)) {
							mism++;
						}
					}
					VEQ(mism, 0);
				}
			}
			for (int d = rank - 1; d >= 0 && ++l[d] == mps[d]; d--)
				l[d] = 0;
		}
		free(f);
	}
	free(dec);
	return bad;
}

/* ---- 1. every dtype, ranks 0..3, random-sized stream pieces, random order ---- */

static const ckpt_dtype all_dtypes[] = { CKPT_DT_BOOL,	 CKPT_DT_INT8,	  CKPT_DT_UINT8,    CKPT_DT_INT16,
					 CKPT_DT_UINT16, CKPT_DT_INT32,	  CKPT_DT_UINT32,   CKPT_DT_INT64,
					 CKPT_DT_UINT64, CKPT_DT_FLOAT16, CKPT_DT_BFLOAT16, CKPT_DT_FLOAT32,
					 CKPT_DT_FLOAT64 };
#define NDT (sizeof(all_dtypes) / sizeof(all_dtypes[0]))

struct tarr {
	ckpt_warray *a;
	ckpt_dtype dt;
	int rank;
	uint64_t shape[4];
	uint8_t *src;
	uint64_t nbytes;
	char name[64];
};

/* Write src as the whole-array stream in random pieces of 1..maxp bytes,
 * in a random order. */
static int write_stream_shuffled(ckpt_warray *a, const uint8_t *src, uint64_t n, uint64_t maxp)
{
	uint64_t cnt = 0, cap = n / 1 + 1;
	uint64_t(*pc)[2] = malloc(cap * sizeof(*pc));
	for (uint64_t off = 0; off < n;) {
		uint64_t len = 1 + rnd() % maxp;
		if (len > n - off)
			len = n - off;
		pc[cnt][0] = off;
		pc[cnt][1] = len;
		cnt++;
		off += len;
	}
	for (uint64_t i = cnt; i > 1; i--) {
		uint64_t k = rnd() % i, t0 = pc[i - 1][0], t1 = pc[i - 1][1];
		pc[i - 1][0] = pc[k][0];
		pc[i - 1][1] = pc[k][1];
		pc[k][0] = t0;
		pc[k][1] = t1;
	}
	int rc = 0;
	for (uint64_t i = 0; i < cnt && !rc; i++)
		rc = ckpt_warray_write(a, NULL, pc[i][0], src + pc[i][0], pc[i][1]);
	free(pc);
	return rc;
}

static void test_all_dtypes(void)
{
	char *root = make_root("dtypes");
	ckpt_writer_opts o;
	ckpt_writer_opts_init(&o);
	o.chunk_bytes = 512; /* many chunks and shards even for small arrays */
	o.shard_bytes = 4096;
	o.threads = 2;
	ckpt_step *st;
	CHECK_EQ_INT(ckpt_step_begin(root, "10", &o, &st), 0);
	static const uint64_t shapes[4][3] = { { 0 }, { 301 }, { 37, 29 }, { 5, 13, 11 } };
	struct tarr arrs[NDT * 4];
	int na = 0;
	for (size_t t = 0; t < NDT; t++)
		for (int r = 0; r <= 3; r++) {
			struct tarr *x = &arrs[na++];
			x->dt = all_dtypes[t];
			x->rank = r;
			memcpy(x->shape, shapes[r], sizeof(shapes[r]));
			snprintf(x->name, sizeof(x->name), "%s_r%d", ckpt_dtype_get(x->dt)->name, r);
			const char *keys[2] = { "arrays", x->name };
			int kt[2] = { 2, 2 };
			CHECK_EQ_INT(ckpt_step_add_array(st, "state", keys, kt, 2, x->dt, r, x->shape, &x->a),
				     0);
			x->nbytes = prod(x->shape, r) * ckpt_dtype_get(x->dt)->itemsize;
			x->src = malloc(x->nbytes);
			fill_random(x->src, x->nbytes, x->dt);
			CHECK_EQ_INT(write_stream_shuffled(x->a, x->src, x->nbytes, 97), 0);
			ckpt_warray_info info;
			ckpt_warray_get_info(x->a, &info);
			CHECK_EQ_INT(info.bytes_written, x->nbytes);
		}
	/* Read back a pending array (mix of stored and buffered chunks). */
	{
		struct tarr *x = &arrs[4 * 11 + 2]; /* float32 rank 2 */
		uint8_t *back = malloc(x->nbytes);
		CHECK_EQ_INT(ckpt_warray_read(x->a, NULL, 0, back, x->nbytes), (long long)x->nbytes);
		CHECK(memcmp(back, x->src, x->nbytes) == 0);
		free(back);
	}
	CHECK_EQ_INT(ckpt_step_commit(st, "10"), 0);
	char item[4200];
	snprintf(item, sizeof(item), "%s/10/state", root);
	for (int i = 0; i < na; i++) {
		char nm[128];
		snprintf(nm, sizeof(nm), "arrays.%s", arrs[i].name);
		CHECK_EQ_INT(verify_array(item, nm, arrs[i].dt, arrs[i].rank, arrs[i].shape, arrs[i].src), 0);
		free(arrs[i].src);
	}
	/* Pending reads keep working after commit (from the shard files). */
	{
		uint8_t b[8];
		CHECK_EQ_INT(ckpt_warray_read(arrs[0].a, NULL, 0, b, 1), 1);
		CHECK_EQ_INT(ckpt_warray_write(arrs[0].a, NULL, 0, b, 1), -EROFS);
	}
	ckpt_step_destroy(st);
	rm_rf(root);
	free(root);
}

/* ---- 2. column slices from 8 threads (optionally with a tiny budget) ---- */

struct slice_job {
	ckpt_warray *a;
	ckpt_region r;
	const uint8_t *full;
	uint64_t cols, isz;
	uint64_t seed;
	int rc;
	int overlap;
};

static void *slice_thread(void *arg)
{
	struct slice_job *j = arg;
	uint64_t rows = j->r.stop[0] - j->r.start[0], w = j->r.stop[1] - j->r.start[1];
	uint64_t n = rows * w * j->isz;
	uint8_t *stream = malloc(n);
	for (uint64_t i = 0; i < rows; i++)
		memcpy(stream + i * w * j->isz,
		       j->full + ((j->r.start[0] + i) * j->cols + j->r.start[1]) * j->isz, w * j->isz);
	uint64_t off = 0;
	while (off < n && !j->rc) {
		uint64_t len = 1 + check_rnd(&j->seed) % 4099;
		if (len > n - off)
			len = n - off;
		j->rc = ckpt_warray_write(j->a, &j->r, off, stream + off, len);
		/* Rewrite a random earlier range (same bytes): distinct counting. */
		if (j->overlap && off > 0 && check_rnd(&j->seed) % 4 == 0) {
			uint64_t b = check_rnd(&j->seed) % off, e = b + 1 + check_rnd(&j->seed) % 1000;
			if (e > off)
				e = off;
			if (!j->rc)
				j->rc = ckpt_warray_write(j->a, &j->r, b, stream + b, e - b);
		}
		off += len;
	}
	free(stream);
	return NULL;
}

static void run_slices(const char *tag, uint64_t budget, uint64_t chunk_bytes, int overlap)
{
	char *root = make_root(tag);
	ckpt_writer_opts o;
	ckpt_writer_opts_init(&o);
	o.mem_budget = budget;
	o.chunk_bytes = chunk_bytes;
	o.shard_bytes = chunk_bytes * 16;
	ckpt_step *st;
	CHECK_EQ_INT(ckpt_step_begin(root, "20", &o, &st), 0);
	uint64_t shape[2] = { 256, 8 * 60 };
	const char *keys[3] = { "params", "0", "w" };
	int kt[3] = { 2, 1, 2 };
	ckpt_warray *a;
	CHECK_EQ_INT(ckpt_step_add_array(st, "params", keys, kt, 3, CKPT_DT_FLOAT32, 2, shape, &a), 0);
	uint64_t n = shape[0] * shape[1] * 4;
	uint8_t *full = malloc(n);
	fill_random(full, n, CKPT_DT_FLOAT32);
	pthread_t th[8];
	struct slice_job jobs[8];
	for (int t = 0; t < 8; t++) {
		struct slice_job *j = &jobs[t];
		memset(j, 0, sizeof(*j));
		j->a = a;
		j->r.rank = 2;
		j->r.start[0] = 0;
		j->r.stop[0] = shape[0];
		j->r.start[1] = (uint64_t)t * 60;
		j->r.stop[1] = (uint64_t)(t + 1) * 60;
		j->full = full;
		j->cols = shape[1];
		j->isz = 4;
		j->seed = 1234567 + (uint64_t)t * 7919;
		j->overlap = overlap;
		pthread_create(&th[t], NULL, slice_thread, j);
	}
	for (int t = 0; t < 8; t++) {
		pthread_join(th[t], NULL);
		CHECK_EQ_INT(jobs[t].rc, 0);
	}
	ckpt_step_info si;
	ckpt_step_get_info(st, &si);
	CHECK_EQ_INT(si.bytes_written, n);
	if (budget < (1u << 20)) {
		printf("%s: budget %llu B, %llu partial-chunk spills, mem_used now %llu\n", tag,
		       (unsigned long long)budget, (unsigned long long)si.spills,
		       (unsigned long long)si.mem_used);
		CHECK(si.spills > 0);
	}
	uint8_t *back = malloc(n);
	CHECK_EQ_INT(ckpt_warray_read(a, NULL, 0, back, n), (long long)n);
	CHECK(memcmp(back, full, n) == 0);
	free(back);
	CHECK_EQ_INT(ckpt_step_commit(st, "20"), 0);
	char item[4200];
	snprintf(item, sizeof(item), "%s/20/params", root);
	CHECK_EQ_INT(verify_array(item, "params.0.w", CKPT_DT_FLOAT32, 2, shape, full), 0);
	ckpt_step_destroy(st);
	free(full);
	rm_rf(root);
	free(root);
}

/* ---- 3. rewrites of compressed chunks, holes, retry ---- */

static void wait_idle(ckpt_step *st)
{
	ckpt_step_info si;
	for (;;) {
		ckpt_step_get_info(st, &si);
		if (!si.bytes_pending)
			return;
		usleep(1000);
	}
}

static void test_rewrite_holes(void)
{
	char *root = make_root("holes");
	ckpt_writer_opts o;
	ckpt_writer_opts_init(&o);
	o.chunk_bytes = 1024;
	o.shard_bytes = 8192;
	ckpt_step *st;
	CHECK_EQ_INT(ckpt_step_begin(root, "30", &o, &st), 0);
	uint64_t shape[2] = { 64, 40 };
	const char *k1[2] = { "opt", "mu" };
	const char *k2[2] = { "opt", "nu" };
	int kt[2] = { 2, 2 };
	ckpt_warray *a, *b;
	CHECK_EQ_INT(ckpt_step_add_array(st, "state", k1, kt, 2, CKPT_DT_BFLOAT16, 2, shape, &a), 0);
	CHECK_EQ_INT(ckpt_step_add_array(st, "state", k2, kt, 2, CKPT_DT_INT16, 2, shape, &b), 0);
	uint64_t n = 64 * 40 * 2;
	uint8_t *va = malloc(n), *vb = malloc(n), *junk = malloc(n);
	fill_random(va, n, CKPT_DT_BFLOAT16);
	fill_random(vb, n, CKPT_DT_INT16);
	fill_random(junk, n, CKPT_DT_INT16);
	/* a: junk first, complete; wait until it is compressed; then the real
	 * bytes, which re-open stored chunks. */
	CHECK_EQ_INT(ckpt_warray_write(a, NULL, 0, junk, n), 0);
	wait_idle(st);
	ckpt_warray_info i0;
	ckpt_warray_get_info(a, &i0);
	CHECK_EQ_INT(i0.chunks_stored, i0.chunks);
	CHECK(i0.chunks > 4);
	/* Other bytes over written ones are refused until forgotten (O_TRUNC)
	 * when several writers share the array (CKPT_WRITE_SAME) ... */
	CHECK_EQ_INT(ckpt_warray_write_flags(a, NULL, 0, va, n, CKPT_WRITE_SAME), -EINVAL);
	CHECK_EQ_INT(ckpt_warray_forget(a, NULL), 0);
	CHECK_EQ_INT(ckpt_warray_write(a, NULL, 0, va, n), 0);
	/* b: everything but bytes [1000, 1003) and the last byte. */
	CHECK_EQ_INT(ckpt_warray_write(b, NULL, 0, vb, 1000), 0);
	CHECK_EQ_INT(ckpt_warray_write(b, NULL, 1003, vb + 1003, n - 1004), 0);
	/* Reads of holes give zeros. */
	uint8_t r8[8];
	CHECK_EQ_INT(ckpt_warray_read(b, NULL, 998, r8, 8), 8);
	CHECK(r8[0] == vb[998] && r8[1] == vb[999] && r8[2] == 0 && r8[4] == 0 && r8[5] == vb[1003]);
	ckpt_warray_info ia;
	ckpt_warray_get_info(a, &ia);
	CHECK_EQ_INT(ia.bytes_written, n);
	uint64_t commits0 = atomic_load(&ckpt_g_stats.commit_failures);
	CHECK_EQ_INT(ckpt_step_commit(st, "30"), -ENODATA);
	CHECK_EQ_INT(atomic_load(&ckpt_g_stats.commit_failures), commits0 + 1);
	char p[4200];
	snprintf(p, sizeof(p), "%s/30", root);
	CHECK(!exists(p));
	snprintf(p, sizeof(p), "%s/30.orbax-checkpoint-tmp", root);
	CHECK(exists(p));
	/* Fill the holes, one of them with a write splitting an element. */
	CHECK_EQ_INT(ckpt_warray_write(b, NULL, 1001, vb + 1001, 2), 0);
	CHECK_EQ_INT(ckpt_warray_write(b, NULL, 1000, vb + 1000, 1), 0);
	CHECK_EQ_INT(ckpt_warray_write(b, NULL, n - 1, vb + n - 1, 1), 0);
	/* Write past the end / bad region. */
	CHECK_EQ_INT(ckpt_warray_write(b, NULL, n - 1, vb, 2), -EFBIG);
	ckpt_region bad = { .rank = 2, .start = { 0, 0 }, .stop = { 65, 40 } };
	CHECK_EQ_INT(ckpt_warray_write(b, &bad, 0, vb, 2), -EINVAL);
	bad.rank = 1;
	CHECK_EQ_INT(ckpt_warray_write(b, &bad, 0, vb, 2), -EINVAL);
	CHECK_EQ_INT(ckpt_step_commit(st, "30"), 0);
	snprintf(p, sizeof(p), "%s/30/state", root);
	CHECK_EQ_INT(verify_array(p, "opt.mu", CKPT_DT_BFLOAT16, 2, shape, va), 0);
	CHECK_EQ_INT(verify_array(p, "opt.nu", CKPT_DT_INT16, 2, shape, vb), 0);
	snprintf(p, sizeof(p), "%s/30.orbax-checkpoint-tmp", root);
	CHECK(!exists(p));
	ckpt_step_destroy(st);
	free(va);
	free(vb);
	free(junk);
	rm_rf(root);
	free(root);
}

/* ---- 3b. reading spilled chunks; I/O errors and commit retry ---- */

static void test_spill_read_and_io_error(void)
{
	char *root = make_root("spillio");
	ckpt_writer_opts o;
	ckpt_writer_opts_init(&o);
	o.chunk_bytes = 1024; /* [4,64] float32 chunks */
	o.shard_bytes = 1 << 20;
	o.mem_budget = 2 * 1024;
	ckpt_step *st;
	CHECK_EQ_INT(ckpt_step_begin(root, "50", &o, &st), 0);
	uint64_t shape[2] = { 64, 64 };
	const char *k[1] = { "w" };
	int kt[1] = { 2 };
	ckpt_warray *a;
	CHECK_EQ_INT(ckpt_step_add_array(st, "state", k, kt, 1, CKPT_DT_FLOAT32, 2, shape, &a), 0);
	uint64_t n = 64 * 64 * 4;
	uint8_t *v = malloc(n), *back = malloc(n), *left = malloc(n / 2);
	fill_random(v, n, CKPT_DT_FLOAT32);
	ckpt_region lr = { .rank = 2, .start = { 0, 0 }, .stop = { 64, 32 } };
	ckpt_region rr = { .rank = 2, .start = { 0, 32 }, .stop = { 64, 64 } };
	for (int r = 0; r < 64; r++)
		memcpy(left + r * 128, v + r * 256, 128);
	/* Left half only: every chunk partial, 16 chunks for a 2-chunk budget. */
	CHECK_EQ_INT(ckpt_warray_write(a, &lr, 0, left, n / 2), 0);
	ckpt_step_info si;
	ckpt_step_get_info(st, &si);
	CHECK(si.spilled_chunks >= 13);
	CHECK(si.mem_used <= 2 * o.mem_budget); /* one chunk over at most */
	CHECK_EQ_INT(ckpt_warray_read(a, NULL, 0, back, n), (long long)n);
	int ok = 1;
	for (int r = 0; r < 64; r++)
		for (int c = 0; c < 256; c++)
			ok &= back[r * 256 + c] == (c < 128 ? v[r * 256 + c] : 0);
	CHECK(ok);

	uint8_t *right = malloc(n / 2);
	for (int r = 0; r < 64; r++)
		memcpy(right + r * 128, v + r * 256 + 128, 128);
	CHECK_EQ_INT(ckpt_warray_write(a, &rr, 0, right, n / 2), 0);
	CHECK_EQ_INT(ckpt_step_commit(st, "50"), 0);
	char p[4200];
	snprintf(p, sizeof(p), "%s/50/state", root);
	CHECK_EQ_INT(verify_array(p, "w", CKPT_DT_FLOAT32, 2, shape, v), 0);
	ckpt_step_destroy(st);

	/* Inject write errors in the compression threads: files may not grow
	 * past 8 KiB (the 16 KiB shard does not fit).  Commit fails with the
	 * error and the step stays pending; once the cause is gone, the same
	 * step commits (failed chunks are retried). */
	o.mem_budget = 1 << 20;
	CHECK_EQ_INT(ckpt_step_begin(root, "51", &o, &st), 0);
	CHECK_EQ_INT(ckpt_step_add_array(st, "state", k, kt, 1, CKPT_DT_FLOAT32, 2, shape, &a), 0);
	struct rlimit old_lim, lim;
	getrlimit(RLIMIT_FSIZE, &old_lim);
	signal(SIGXFSZ, SIG_IGN);
	lim = old_lim;
	lim.rlim_cur = 8192;
	CHECK_EQ_INT(setrlimit(RLIMIT_FSIZE, &lim), 0);
	CHECK_EQ_INT(ckpt_warray_write(a, NULL, 0, v, n), 0);
	fprintf(stderr, "(expected write errors follow)\n");
	CHECK_EQ_INT(ckpt_step_commit(st, "51"), -EFBIG);
	snprintf(p, sizeof(p), "%s/51", root);
	CHECK(!exists(p));
	CHECK_EQ_INT(setrlimit(RLIMIT_FSIZE, &old_lim), 0);
	fprintf(stderr, "(end of expected write errors)\n");
	CHECK_EQ_INT(ckpt_step_commit(st, "51"), 0);
	snprintf(p, sizeof(p), "%s/51/state", root);
	CHECK_EQ_INT(verify_array(p, "w", CKPT_DT_FLOAT32, 2, shape, v), 0);
	ckpt_step_destroy(st);
	free(v);
	free(back);
	free(left);
	free(right);
	rm_rf(root);
	free(root);
}

/* ---- 3d. byte-level rules: forget is byte-exact, written bytes do not
 * change, declared space is free, spilled chunks are sparse ---- */

/* Bytes of a [rows, cols] float32 array holding base + i. */
static void fill_f32(uint8_t *p, uint64_t n, float base)
{
	for (uint64_t i = 0; i < n / 4; i++) {
		float f = base + (float)i;
		memcpy(p + 4 * i, &f, 4);
	}
}

/* The C-order stream of box r of a 2-d array held in full (cols columns). */
static void box_stream(const uint8_t *full, uint64_t cols, unsigned isz, const ckpt_region *r, uint8_t *out)
{
	uint64_t w = (r->stop[1] - r->start[1]) * isz;
	for (uint64_t i = r->start[0]; i < r->stop[0]; i++, out += w)
		memcpy(out, full + (i * cols + r->start[1]) * isz, w);
}

static void box_put(uint8_t *full, uint64_t cols, unsigned isz, const ckpt_region *r, const uint8_t *in)
{
	uint64_t w = (r->stop[1] - r->start[1]) * isz;
	for (uint64_t i = r->start[0]; i < r->stop[0]; i++, in += w)
		memcpy(full + (i * cols + r->start[1]) * isz, in, w);
}

static uint64_t written(ckpt_warray *a)
{
	ckpt_warray_info ai;
	ckpt_warray_get_info(a, &ai);
	return ai.bytes_written;
}

/* A writer rewriting a column slice (O_TRUNC: forget its region) dies after
 * half of it: the commit refuses the array until the rest comes, in every
 * chunk state (stored, spilled, live), and never commits old bytes. */
static void test_forget_exact(void)
{
	char *root = make_root("forget");
	ckpt_writer_opts o;
	ckpt_writer_opts_init(&o);
	o.chunk_bytes = 1024; /* [4, 64] float32: 16 row chunks */
	o.shard_bytes = 4096;
	ckpt_step *st;
	CHECK_EQ_INT(ckpt_step_begin(root, "60", &o, &st), 0);
	uint64_t shape[2] = { 64, 64 };
	const char *k[1] = { "w" }, *k2[1] = { "s" }, *k3[1] = { "p" };
	int kt[1] = { 2 };
	ckpt_warray *a, *small, *part;
	CHECK_EQ_INT(ckpt_step_add_array(st, "state", k, kt, 1, CKPT_DT_FLOAT32, 2, shape, &a), 0);
	uint64_t n = 64 * 64 * 4;
	uint8_t *v = malloc(n), *nv = malloc(n), *want = malloc(n), *back = malloc(n), *sb = malloc(n);
	fill_f32(v, n, 1.0f);
	fill_f32(nv, n, 100000.0f);
	CHECK_EQ_INT(ckpt_warray_write(a, NULL, 0, v, n), 0);
	wait_idle(st);
	CHECK_EQ_INT(a->nstored, 16);
	/* The column slice [:, 8:24] crosses all 16 chunks, each in part. */
	ckpt_region col = { .rank = 2, .start = { 0, 8 }, .stop = { 64, 24 } };
	uint64_t cb = 64 * 16 * 4;
	CHECK_EQ_INT(ckpt_warray_forget(a, &col), 0);
	CHECK_EQ_INT(written(a), n - cb);
	ckpt_w_chunk_wait_idle(st);
	CHECK_EQ_INT(ckpt_w_chunk_check_all(st), 0);
	box_stream(nv, 64, 4, &col, sb);
	CHECK_EQ_INT(ckpt_warray_write(a, &col, 0, sb, cb / 2), 0); /* then the writer dies */
	CHECK_EQ_INT(written(a), n - cb / 2);
	memcpy(want, v, n);
	memset(sb + cb / 2, 0, cb / 2);
	box_put(want, 64, 4, &col, sb);
	CHECK_EQ_INT(ckpt_warray_read(a, NULL, 0, back, n), (long long)n);
	CHECK(memcmp(back, want, n) == 0);
	CHECK_EQ_INT(ckpt_step_commit(st, "60"), -ENODATA);
	/* The restarted writer: O_TRUNC again, then all of it. */
	CHECK_EQ_INT(ckpt_warray_forget(a, &col), 0);
	box_stream(nv, 64, 4, &col, sb);
	CHECK_EQ_INT(ckpt_warray_write(a, &col, 0, sb, cb), 0);
	box_put(want, 64, 4, &col, sb);
	CHECK_EQ_INT(written(a), n);

	/* An array smaller than one chunk: [3, 5] int32, one slice [1:2, 1:3]. */
	uint64_t s2[2] = { 3, 5 };
	CHECK_EQ_INT(ckpt_step_add_array(st, "state", k2, kt, 1, CKPT_DT_INT32, 2, s2, &small), 0);
	uint8_t sv[60], snew[8];
	fill_f32(sv, 60, 7.0f);
	fill_f32(snew, 8, 5000.0f);
	CHECK_EQ_INT(ckpt_warray_write(small, NULL, 0, sv, 60), 0);
	wait_idle(st);
	ckpt_region one = { .rank = 2, .start = { 1, 1 }, .stop = { 2, 3 } };
	CHECK_EQ_INT(ckpt_warray_forget(small, &one), 0);
	CHECK_EQ_INT(written(small), 52);
	CHECK_EQ_INT(ckpt_step_commit(st, "60"), -ENODATA);
	CHECK_EQ_INT(ckpt_warray_write(small, &one, 0, snew, 8), 0);
	memcpy(sv + (1 * 5 + 1) * 4, snew, 8);

	/* Partial chunks: live and spilled ones lose exactly the region's bytes
	 * (a budget of 3 chunks for 16 partial ones). */
	CHECK_EQ_INT(ckpt_step_add_array(st, "state", k3, kt, 1, CKPT_DT_FLOAT32, 2, shape, &part), 0);
	ckpt_region left = { .rank = 2, .start = { 0, 0 }, .stop = { 64, 32 } };
	ckpt_region mid = { .rank = 2, .start = { 0, 16 }, .stop = { 64, 48 } };
	ckpt_region right = { .rank = 2, .start = { 0, 32 }, .stop = { 64, 64 } };
	ckpt_region gap = { .rank = 2, .start = { 0, 16 }, .stop = { 64, 32 } };
	uint64_t spills0;
	{
		ckpt_step_info si;
		ckpt_step_get_info(st, &si);
		spills0 = si.spills;
	}
	/* The budget is read by the compression threads under the step's
	 * lock: changed only while none runs. */
	ckpt_w_chunk_wait_idle(st);
	st->opts.mem_budget = 3 * part->live_cost;
	box_stream(v, 64, 4, &left, sb);
	CHECK_EQ_INT(ckpt_warray_write(part, &left, 0, sb, n / 2), 0);
	ckpt_step_info si;
	ckpt_step_get_info(st, &si);
	CHECK(si.spills > spills0 && si.spilled_chunks > 0);
	CHECK_EQ_INT(ckpt_warray_forget(part, &mid), 0); /* drops [:, 16:32] of each */
	CHECK_EQ_INT(written(part), n / 4);
	ckpt_w_chunk_wait_idle(st);
	CHECK_EQ_INT(ckpt_w_chunk_check_all(st), 0);
	CHECK_EQ_INT(ckpt_warray_read(part, NULL, 0, back, n), (long long)n);
	uint8_t *pw = calloc(1, n);
	ckpt_region keep = { .rank = 2, .start = { 0, 0 }, .stop = { 64, 16 } };
	box_stream(v, 64, 4, &keep, sb);
	box_put(pw, 64, 4, &keep, sb);
	CHECK(memcmp(back, pw, n) == 0);
	/* Written again with other bytes (they were forgotten), then the rest. */
	box_stream(nv, 64, 4, &gap, sb);
	CHECK_EQ_INT(ckpt_warray_write(part, &gap, 0, sb, n / 4), 0);
	box_put(pw, 64, 4, &gap, sb);
	box_stream(v, 64, 4, &right, sb);
	CHECK_EQ_INT(ckpt_warray_write(part, &right, 0, sb, n / 2), 0);
	box_put(pw, 64, 4, &right, sb);
	ckpt_w_chunk_wait_idle(st);
	st->opts.mem_budget = (uint64_t)64 << 20;
	CHECK_EQ_INT(written(part), n);
	CHECK_EQ_INT(ckpt_step_commit(st, "60"), 0);
	char p[4200];
	snprintf(p, sizeof(p), "%s/60/state", root);
	CHECK_EQ_INT(verify_array(p, "w", CKPT_DT_FLOAT32, 2, shape, want), 0);
	CHECK_EQ_INT(verify_array(p, "s", CKPT_DT_INT32, 2, s2, sv), 0);
	CHECK_EQ_INT(verify_array(p, "p", CKPT_DT_FLOAT32, 2, shape, pw), 0);
	ckpt_step_destroy(st);

	/* A whole-array forget of stored chunks: nothing is left. */
	CHECK_EQ_INT(ckpt_step_begin(root, "61", &o, &st), 0);
	CHECK_EQ_INT(ckpt_step_add_array(st, "state", k, kt, 1, CKPT_DT_FLOAT32, 2, shape, &a), 0);
	CHECK_EQ_INT(ckpt_warray_write(a, NULL, 0, v, n), 0);
	wait_idle(st);
	CHECK_EQ_INT(ckpt_warray_forget(a, NULL), 0);
	CHECK_EQ_INT(written(a), 0);
	CHECK_EQ_INT(a->nstored, 0);
	CHECK_EQ_INT(ckpt_warray_write(a, NULL, 0, nv, n / 2), 0);
	CHECK_EQ_INT(ckpt_step_commit(st, "61"), -ENODATA);
	CHECK_EQ_INT(ckpt_warray_write(a, NULL, n / 2, nv + n / 2, n / 2), 0);
	CHECK_EQ_INT(ckpt_step_commit(st, "61"), 0);
	snprintf(p, sizeof(p), "%s/61/state", root);
	CHECK_EQ_INT(verify_array(p, "w", CKPT_DT_FLOAT32, 2, shape, nv), 0);
	ckpt_step_destroy(st);
	free(pw);
	free(v);
	free(nv);
	free(want);
	free(back);
	free(sb);
	rm_rf(root);
	free(root);
}

/* Bytes written once do not change: the same bytes again are fine (a
 * retry, an array every process writes), other bytes are EINVAL unless the
 * old byte is a zero or was forgotten first. */
static void test_overlap_rules(void)
{
	char *root = make_root("overlap");
	ckpt_writer_opts o;
	ckpt_writer_opts_init(&o);
	o.chunk_bytes = 1024;
	o.shard_bytes = 4096;
	ckpt_step *st;
	CHECK_EQ_INT(ckpt_step_begin(root, "62", &o, &st), 0);
	uint64_t shape[2] = { 64, 64 };
	const char *k[1] = { "w" };
	int kt[1] = { 2 };
	ckpt_warray *a;
	CHECK_EQ_INT(ckpt_step_add_array(st, "state", k, kt, 1, CKPT_DT_FLOAT32, 2, shape, &a), 0);
	uint64_t n = 64 * 64 * 4;
	uint8_t *v = malloc(n), *other = malloc(n), *back = malloc(n), *sb = malloc(n);
	fill_f32(v, n, 1.0f);
	fill_f32(other, n, -3.0f);
	/* The last byte first written as zero (as open_memmap does). */
	uint8_t zero = 0;
	CHECK_EQ_INT(ckpt_warray_write(a, NULL, n - 1, &zero, 1), 0);
	ckpt_region top = { .rank = 2, .start = { 0, 0 }, .stop = { 40, 64 } };
	ckpt_region low = { .rank = 2, .start = { 24, 0 }, .stop = { 64, 64 } };
	CHECK_EQ_INT(ckpt_warray_write(a, &top, 0, v, 40 * 256), 0);
	ckpt_w_chunk_wait_idle(st); /* rows 0..39 compressed: a check must re-read them */
	/* Overlapping slice, same bytes: fine; other bytes: refused. */
	fprintf(stderr, "(expected refused writes follow)\n");
	box_stream(other, 64, 4, &low, sb);
	CHECK_EQ_INT(ckpt_warray_write_flags(a, &low, 0, sb, 40 * 256, CKPT_WRITE_SAME), -EINVAL);
	box_stream(v, 64, 4, &low, sb);
	sb[16 * 256 + 5] ^= 0x40; /* one byte past the overlap (rows 40.. are new) */
	sb[3] ^= 0x01; /* one byte inside it (row 24, stored) */
	CHECK_EQ_INT(ckpt_warray_write_flags(a, &low, 0, sb, 40 * 256, CKPT_WRITE_SAME), -EINVAL);
	sb[3] ^= 0x01;
	CHECK_EQ_INT(ckpt_warray_write_flags(a, &low, 0, sb, 40 * 256, CKPT_WRITE_SAME), 0);
	sb[16 * 256 + 5] ^= 0x40;
	fprintf(stderr, "(end of expected refused writes)\n");
	/* Row 40's byte 5 was written with the flipped value: forget the row,
	 * write it right. */
	ckpt_region r40 = { .rank = 2, .start = { 40, 0 }, .stop = { 41, 64 } };
	CHECK_EQ_INT(ckpt_warray_write_flags(a, &r40, 0, v + 40 * 256, 256, CKPT_WRITE_SAME), -EINVAL);
	CHECK_EQ_INT(ckpt_warray_forget(a, &r40), 0);
	CHECK_EQ_INT(ckpt_warray_write(a, &r40, 0, v + 40 * 256, 256), 0);
	/* The whole array again (a retry): the same bytes. */
	CHECK_EQ_INT(ckpt_warray_write(a, NULL, 0, v, n), 0);
	CHECK_EQ_INT(written(a), n);
	CHECK_EQ_INT(ckpt_warray_read(a, NULL, 0, back, n), (long long)n);
	CHECK(memcmp(back, v, n) == 0);
	ckpt_w_chunk_wait_idle(st);
	CHECK_EQ_INT(ckpt_w_chunk_check_all(st), 0);
	CHECK_EQ_INT(ckpt_step_commit(st, "62"), 0);
	char p[4200];
	snprintf(p, sizeof(p), "%s/62/state", root);
	CHECK_EQ_INT(verify_array(p, "w", CKPT_DT_FLOAT32, 2, shape, v), 0);
	ckpt_step_destroy(st);
	free(v);
	free(other);
	free(back);
	free(sb);
	rm_rf(root);
	free(root);
}

static uint64_t statm_field(int i)
{
	unsigned long long f[2] = { 0, 0 };
	FILE *fp = fopen("/proc/self/statm", "r");
	if (fp) {
		if (fscanf(fp, "%llu %llu", &f[0], &f[1]) != 2)
			f[0] = f[1] = 0;
		fclose(fp);
	}
	return (uint64_t)f[i] * (uint64_t)sysconf(_SC_PAGESIZE);
}

/* Declaring costs nothing per chunk; memory follows the chunks written; the
 * commit still counts every unwritten chunk as missing. */
static void test_declared_space_free(void)
{
	char *root = make_root("sparse");
	ckpt_step *st;
	CHECK_EQ_INT(ckpt_step_begin(root, "63", NULL, &st), 0);
	uint64_t shape[1] = { (uint64_t)1 << 44 }; /* float32: 64 TiB, 2^24 chunks */
	int kt[1] = { 2 };
	ckpt_warray *a[8];
	uint64_t vm0 = statm_field(0), rss0 = statm_field(1);
	for (int i = 0; i < 8; i++) {
		char name[16];
		snprintf(name, sizeof(name), "big%d", i);
		const char *k[1] = { name };
		CHECK_EQ_INT(ckpt_step_add_array(st, "state", k, kt, 1, CKPT_DT_FLOAT32, 1, shape, &a[i]), 0);
	}
	uint64_t vm1 = statm_field(0), rss1 = statm_field(1);
	printf("8 declarations of (2**44,) float32: +%llu KiB virtual, +%llu KiB resident, %llu chunks "
	       "each\n",
	       (unsigned long long)((vm1 - vm0) >> 10), (unsigned long long)((rss1 - rss0) >> 10),
	       (unsigned long long)a[0]->nchunks);
	CHECK_EQ_INT(a[0]->nchunks, (uint64_t)1 << 24);
	CHECK(vm1 - vm0 < ((uint64_t)16 << 20)); /* was 8 * 805 MiB */
	CHECK(rss1 - rss0 < ((uint64_t)4 << 20));
	for (int i = 0; i < 8; i++)
		CHECK_EQ_INT(ckpt_w_tab_bytes(a[i]), 0);
	/* A few bytes in three far-apart chunks: three pages of each table. */
	uint8_t b[64];
	fill_f32(b, 64, 2.0f);
	uint64_t nb = (uint64_t)4 << 44;
	CHECK_EQ_INT(ckpt_warray_write(a[0], NULL, 0, b, 64), 0);
	CHECK_EQ_INT(ckpt_warray_write(a[0], NULL, nb / 2, b, 64), 0);
	CHECK_EQ_INT(ckpt_warray_write(a[0], NULL, nb - 64, b, 64), 0);
	uint64_t tb = ckpt_w_tab_bytes(a[0]);
	printf("after 3 writes: %llu bytes of chunk/shard tables\n", (unsigned long long)tb);
	CHECK(tb > 0 && tb < ((uint64_t)1 << 20));
	uint8_t back[64];
	CHECK_EQ_INT(ckpt_warray_read(a[0], NULL, nb / 2, back, 64), 64);
	CHECK(memcmp(back, b, 64) == 0);
	CHECK_EQ_INT(ckpt_warray_read(a[1], NULL, nb / 2, back, 64), 64);
	CHECK(back[0] == 0 && back[63] == 0);
	CHECK_EQ_INT(written(a[0]), 192);
	ckpt_w_chunk_wait_idle(st);
	CHECK_EQ_INT(ckpt_w_chunk_check_all(st), 0);
	CHECK_EQ_INT(ckpt_step_commit(st, "63"), -ENODATA);
	ckpt_region far = { .rank = 1, .start = { (uint64_t)1 << 43 }, .stop = { ((uint64_t)1 << 43) + 8 } };
	CHECK_EQ_INT(ckpt_warray_forget(a[0], &far), 0);
	CHECK_EQ_INT(written(a[0]), 160);
	CHECK_EQ_INT(ckpt_warray_forget(a[0], NULL), 0);
	CHECK_EQ_INT(written(a[0]), 0);
	CHECK_EQ_INT(ckpt_warray_remove(a[1]), 0);
	ckpt_step_abort(st);
	ckpt_step_destroy(st);
	rm_rf(root);
	free(root);
}

/* Spilled partial chunks take about the bytes written in the spill file,
 * not whole chunk slots; reloading one gives exactly its bytes. */
static void test_spill_sparse(void)
{
	char *root = make_root("spillsparse");
	ckpt_writer_opts o;
	ckpt_writer_opts_init(&o);
	o.chunk_bytes = 256 << 10; /* [1, 65536] float32: one row a chunk */
	o.shard_bytes = 1 << 20;
	ckpt_step *st;
	CHECK_EQ_INT(ckpt_step_begin(root, "64", &o, &st), 0);
	uint64_t shape[2] = { 64, 65536 };
	const char *k[1] = { "w" };
	int kt[1] = { 2 };
	ckpt_warray *a;
	CHECK_EQ_INT(ckpt_step_add_array(st, "state", k, kt, 1, CKPT_DT_FLOAT32, 2, shape, &a), 0);
	st->opts.mem_budget = 2 * a->live_cost;
	uint64_t row = 65536 * 4, n = 64 * row;
	uint8_t *v = malloc(n);
	fill_f32(v, n, 1.0f);
	/* 16 bytes at the start and 16 in the middle of every row, interleaved. */
	for (int pass = 0; pass < 2; pass++)
		for (uint64_t r = 0; r < 64; r++) {
			uint64_t off = r * row + (pass ? row / 2 : 0);
			CHECK_EQ_INT(ckpt_warray_write(a, NULL, off, v + off, 16), 0);
		}
	ckpt_step_info si;
	ckpt_step_get_info(st, &si);
	struct stat sb;
	CHECK(st->spill_fd >= 0 && fstat(st->spill_fd, &sb) == 0);
	uint64_t alloc = (uint64_t)sb.st_blocks * 512;
	printf("spill: %llu chunks spilled (%llu spills) of 2 KiB written: %llu KiB allocated, %llu KiB "
	       "file\n",
	       (unsigned long long)si.spilled_chunks, (unsigned long long)si.spills,
	       (unsigned long long)(alloc >> 10), (unsigned long long)((uint64_t)sb.st_size >> 10));
	CHECK(si.spilled_chunks >= 60);
	/* Two 4 KiB blocks of bytes and two of bitmap per chunk, 16 KiB (a whole
	 * slot was 288 KiB); a little slack for the file system's metadata. */
	CHECK(alloc <= si.spilled_chunks * 24576);
	/* Re-read: the bytes written, zeros elsewhere; forget some and spill
	 * again over the same slots: the old bytes stay gone. */
	ckpt_region cut = { .rank = 2, .start = { 0, 0 }, .stop = { 64, 2 } };
	CHECK_EQ_INT(ckpt_warray_forget(a, &cut), 0);
	CHECK_EQ_INT(written(a), 64 * 24);
	uint8_t *back = malloc(n), *want = calloc(1, n);
	for (uint64_t r = 0; r < 64; r++) {
		memcpy(want + r * row + 8, v + r * row + 8, 8);
		memcpy(want + r * row + row / 2, v + r * row + row / 2, 16);
	}
	CHECK_EQ_INT(ckpt_warray_read(a, NULL, 0, back, n), (long long)n);
	CHECK(memcmp(back, want, n) == 0);
	ckpt_w_chunk_wait_idle(st);
	CHECK_EQ_INT(ckpt_w_chunk_check_all(st), 0);
	st->opts.mem_budget = (uint64_t)256 << 20;
	CHECK_EQ_INT(ckpt_warray_write(a, NULL, 0, v, n), 0);
	CHECK_EQ_INT(ckpt_step_commit(st, "64"), 0);
	char p[4200];
	snprintf(p, sizeof(p), "%s/64/state", root);
	CHECK_EQ_INT(verify_array(p, "w", CKPT_DT_FLOAT32, 2, shape, v), 0);
	ckpt_step_destroy(st);
	free(v);
	free(back);
	free(want);
	rm_rf(root);
	free(root);
}

/* ---- 3c. randomized model test of region/byte-range mapping ---- */

/* Global byte offset of byte b of region r's stream. */
static uint64_t model_off(const ckpt_region *r, const uint64_t *shape, unsigned isz, uint64_t b)
{
	uint64_t e = b / isz, gi = 0, st = 1;
	for (int d = r->rank - 1; d >= 0; d--) {
		uint64_t ext = r->stop[d] - r->start[d];
		gi += (r->start[d] + e % ext) * st;
		st *= shape[d];
		e /= ext;
	}
	return gi * isz + b % isz;
}

static void random_region(int rank, const uint64_t *shape, ckpt_region *r)
{
	r->rank = rank;
	for (int d = 0; d < rank; d++) {
		uint64_t a = rnd() % shape[d], b = rnd() % shape[d];
		if (a > b) {
			uint64_t t = a;
			a = b;
			b = t;
		}
		r->start[d] = a;
		r->stop[d] = b + 1;
	}
}

static void test_random_regions(void)
{
	char *root = make_root("random");
	static const ckpt_dtype dts[] = { CKPT_DT_UINT8, CKPT_DT_BFLOAT16, CKPT_DT_FLOAT32, CKPT_DT_INT64 };
	int bad_reads = 0, bad_commits = 0;
	fprintf(stderr, "(expected commits refused for missing bytes follow)\n");
	for (int it = 0; it < 150; it++) {
		ckpt_writer_opts o;
		ckpt_writer_opts_init(&o);
		o.chunk_bytes = 1 + rnd() % 96;
		o.shard_bytes = o.chunk_bytes * (1 + rnd() % 8);
		o.mem_budget = rnd() % 2 ? 1 << 20 : 1 + rnd() % 512;
		o.threads = 1 + (int)(rnd() % 2);
		ckpt_dtype dt = dts[rnd() % 4];
		unsigned isz = ckpt_dtype_get(dt)->itemsize;
		int rank = 1 + (int)(rnd() % 4);
		uint64_t shape[4];
		for (int d = 0; d < rank; d++)
			shape[d] = 1 + rnd() % (rank > 2 ? 6 : 13);
		uint64_t n = prod(shape, rank) * isz;
		char name[32];
		snprintf(name, sizeof(name), "s_%d", it);
		ckpt_step *st;
		ckpt_warray *a;
		const char *k[1] = { "x" };
		int kt[1] = { 2 };
		if (ckpt_step_begin(root, name, &o, &st)) {
			CHECK(!"begin");
			continue;
		}
		CHECK_EQ_INT(ckpt_step_add_array(st, "state", k, kt, 1, dt, rank, shape, &a), 0);
		uint8_t *model = calloc(1, n), *buf = malloc(n), *back = malloc(n + 8);
		/* Overlapping random regions, each in random pieces; each one is
		 * forgotten first (what O_TRUNC does), so that its new bytes may
		 * differ from those of the regions before it. */
		int nreg = 1 + (int)(rnd() % 4);
		for (int q = 0; q < nreg; q++) {
			ckpt_region r;
			random_region(rank, shape, &r);
			uint64_t rb = 0;
			ckpt_region_count(&r, &rb);
			rb *= isz;
			fill_random(buf, rb, CKPT_DT_UINT8);
			CHECK_EQ_INT(ckpt_warray_forget(a, &r), 0);
			for (uint64_t b = 0; b < rb; b++)
				model[model_off(&r, shape, isz, b)] = 0;
			for (uint64_t off = 0; off < rb;) {
				uint64_t len = 1 + rnd() % 23;
				if (len > rb - off)
					len = rb - off;
				CHECK_EQ_INT(ckpt_warray_write(a, &r, off, buf + off, len), 0);
				for (uint64_t b = off; b < off + len; b++)
					model[model_off(&r, shape, isz, b)] = buf[b];
				off += len;
			}
		}
		/* Whole array and random sub-ranges of random regions read back. */
		bad_reads +=
			ckpt_warray_read(a, NULL, 0, back, n) != (ssize_t)n || memcmp(back, model, n) != 0;
		for (int q = 0; q < 4; q++) {
			ckpt_region r;
			random_region(rank, shape, &r);
			uint64_t rb = 0;
			ckpt_region_count(&r, &rb);
			rb *= isz;
			uint64_t b0 = rnd() % rb, len = 1 + rnd() % (rb - b0);
			uint64_t want = len + 5 < rb - b0 ? len + 5 : rb - b0; /* short only at the end */
			ssize_t got = ckpt_warray_read(a, &r, b0, back, len + 5);
			bad_reads += got != (ssize_t)want;
			for (uint64_t b = 0; b < want && got == (ssize_t)want; b++)
				bad_reads += back[b] != model[model_off(&r, shape, isz, b0 + b)];
		}
		/* The bytes not written read as unwritten: the commit says so. */
		ckpt_warray_info wi;
		ckpt_warray_get_info(a, &wi);
		ckpt_w_chunk_wait_idle(st);
		CHECK_EQ_INT(ckpt_w_chunk_check_all(st), 0);
		if (wi.bytes_written < n)
			CHECK_EQ_INT(ckpt_step_commit(st, name), -ENODATA);
		/* Complete it (forgotten first: new bytes) and commit. */
		CHECK_EQ_INT(ckpt_warray_forget(a, NULL), 0);
		ckpt_warray_get_info(a, &wi);
		CHECK_EQ_INT(wi.bytes_written, 0);
		fill_random(model, n, CKPT_DT_UINT8);
		CHECK_EQ_INT(write_stream_shuffled(a, model, n, 1 + rnd() % 40), 0);
		CHECK_EQ_INT(ckpt_step_commit(st, name), 0);
		char item[4200];
		snprintf(item, sizeof(item), "%s/%s/state", root, name);
		bad_commits += verify_array(item, "x", dt, rank, shape, model) != 0;
		ckpt_step_destroy(st);
		free(model);
		free(buf);
		free(back);
	}
	fprintf(stderr, "(end of expected refused commits)\n");
	CHECK_EQ_INT(bad_reads, 0);
	CHECK_EQ_INT(bad_commits, 0);
	rm_rf(root);
	free(root);
}

/* ---- 4. declarations, names, EEXIST, EBUSY, abort, metadata files ---- */

static void test_decls_and_metadata(void)
{
	char *root = make_root("decl");
	char p0[4200];
	ckpt_step *st, *st2;
	CHECK_EQ_INT(ckpt_step_begin(root, "40", NULL, &st), 0);
	CHECK_EQ_INT(ckpt_step_begin(root, "40", NULL, &st2), -EBUSY);
	uint64_t s1[2] = { 3, 4 }, s2[2] = { 4, 3 };
	const char *k[3] = { "params", "dense", "kernel" };
	int kt[3] = { 2, 2, 2 };
	ckpt_warray *a, *a2, *x;
	CHECK_EQ_INT(ckpt_step_add_array(st, "state", k, kt, 3, CKPT_DT_FLOAT32, 2, s1, &a), 0);
	CHECK_EQ_INT(ckpt_step_add_array(st, "state", k, kt, 3, CKPT_DT_FLOAT32, 2, s1, &a2), 0);
	CHECK(a == a2);
	CHECK_EQ_INT(ckpt_step_add_array(st, "state", k, kt, 3, CKPT_DT_FLOAT32, 2, s2, &x), -EINVAL);
	CHECK_EQ_INT(ckpt_step_add_array(st, "state", k, kt, 3, CKPT_DT_INT32, 2, s1, &x), -EINVAL);
	CHECK_EQ_INT(ckpt_step_add_array(st, "state", k, kt, 2, CKPT_DT_INT32, 2, s1, &x),
		     -EINVAL); /* prefix */
	const char *kd[4] = { "params", "dense", "kernel", "x" };
	int ktd[4] = { 2, 2, 2, 2 };
	CHECK_EQ_INT(ckpt_step_add_array(st, "state", kd, ktd, 4, CKPT_DT_INT32, 0, NULL, &x), -EINVAL);
	const char *kdot[1] = { "params.dense.kernel" };
	CHECK_EQ_INT(ckpt_step_add_array(st, "state", kdot, kt, 1, CKPT_DT_INT32, 0, NULL, &x), -EINVAL);
	const char *kseq[2] = { "params", "0" };
	int ktseq[2] = { 2, 1 };
	CHECK_EQ_INT(ckpt_step_add_array(st, "state", kseq, ktseq, 2, CKPT_DT_INT32, 0, NULL, &x), -EINVAL);
	const char *kslash[1] = { "a//b" }; /* '/' makes folders: no empty one */
	CHECK_EQ_INT(ckpt_step_add_array(st, "state", kslash, kt, 1, CKPT_DT_INT32, 0, NULL, &x), -EINVAL);
	/* What Orbax cannot save: uint4, zero-size arrays, arrays in "metrics". */
	const char *ku[1] = { "u" };
	uint64_t s0[2] = { 0, 3 };
	CHECK_EQ_INT(ckpt_step_add_array(st, "state", ku, kt, 1, CKPT_DT_UINT4, 1, s0 + 1, &x), -EINVAL);
	CHECK_EQ_INT(ckpt_step_add_array(st, "state", ku, kt, 1, CKPT_DT_FLOAT32, 2, s0, &x), -EINVAL);
	CHECK_EQ_INT(ckpt_step_add_array(st, "metrics", ku, kt, 1, CKPT_DT_FLOAT32, 0, NULL, &x), -EINVAL);
	CHECK_EQ_INT(ckpt_step_add_item(st, "descriptor"), -EINVAL);
	CHECK_EQ_INT(ckpt_step_add_item(st, "AUTO"), -EINVAL);
	const char *kres[1] = { "_METADATA" };
	CHECK_EQ_INT(ckpt_step_add_array(st, "state", kres, kt, 1, CKPT_DT_INT32, 0, NULL, &x), -EINVAL);
	const char *kbadseq[2] = { "layers", "01" };
	CHECK_EQ_INT(ckpt_step_add_array(st, "state", kbadseq, ktseq, 2, CKPT_DT_INT32, 0, NULL, &x),
		     -EINVAL);
	CHECK_EQ_INT(ckpt_step_add_array(st, "../x", k, kt, 3, CKPT_DT_INT32, 0, NULL, &x), -EINVAL);
	/* A list node, a quote in a key, a scalar, a sharding string. */
	const char *kl0[3] = { "layers", "10", "b" }, *kl1[3] = { "layers", "2", "b" };
	int ktl[3] = { 2, 1, 2 };
	ckpt_warray *l0, *l1, *q, *sc;
	uint64_t s3[1] = { 5 };
	CHECK_EQ_INT(ckpt_step_add_array(st, "state", kl0, ktl, 3, CKPT_DT_UINT8, 1, s3, &l0), 0);
	CHECK_EQ_INT(ckpt_step_add_array(st, "state", kl1, ktl, 3, CKPT_DT_UINT8, 1, s3, &l1), 0);
	const char *kq[1] = { "it's" };
	CHECK_EQ_INT(ckpt_step_add_array(st, "state", kq, kt, 1, CKPT_DT_UINT8, 1, s3, &q), 0);
	const char *ks[1] = { "step" };
	CHECK_EQ_INT(ckpt_step_add_array(st, "state", ks, kt, 1, CKPT_DT_INT64, 0, NULL, &sc), 0);
	CHECK_EQ_INT(ckpt_warray_set_sharding(a,
					      "{\"sharding_type\": \"SingleDeviceSharding\", \"device_str\": "
					      "\"cpu:0\"}"),
		     0);
	CHECK_EQ_INT(ckpt_warray_set_sharding(a, "{not json"), -EINVAL);
	CHECK_EQ_INT(ckpt_step_add_item(st, "empty"), 0);
	/* A removed array frees its name (and the shape may change). */
	const char *kg[1] = { "gone" };
	ckpt_warray *g;
	CHECK_EQ_INT(ckpt_step_add_array(st, "state", kg, kt, 1, CKPT_DT_UINT8, 1, s3, &g), 0);
	CHECK_EQ_INT(ckpt_warray_write(g, NULL, 0, "abcde", 5), 0);
	CHECK_EQ_INT(ckpt_warray_remove(g), 0);
	CHECK(ckpt_step_find_array(st, "state", kg, 1) == NULL);
	CHECK_EQ_INT(ckpt_warray_write(g, NULL, 0, "abcde", 5), -ESTALE);
	snprintf(p0, sizeof(p0), "%s/40.orbax-checkpoint-tmp/state/gone", root);
	CHECK(!exists(p0));
	CHECK_EQ_INT(ckpt_step_add_array(st, "state", kg, kt, 1, CKPT_DT_INT32, 0, NULL, &g), 0);
	CHECK_EQ_INT(ckpt_warray_remove(g), 0);
	CHECK(ckpt_step_find_array(st, "state", k, 3) == a);
	CHECK(ckpt_step_find_array(st, "state", k, 2) == NULL);
	CHECK(ckpt_step_find_array(st, "state", kl0, 3) == l0);
	CHECK(ckpt_step_find_array(st, "other", kl0, 3) == NULL);
	CHECK(ckpt_step_find_array(st, "state", kdot, 1) == NULL);
	float fv[12];
	for (int i = 0; i < 12; i++)
		fv[i] = (float)i;
	uint8_t u5[5] = { 1, 2, 3, 4, 5 };
	int64_t stepv = 1234567890123LL;
	CHECK_EQ_INT(ckpt_warray_write(a, NULL, 0, fv, sizeof(fv)), 0);
	CHECK_EQ_INT(ckpt_warray_write(l0, NULL, 0, u5, 5), 0);
	CHECK_EQ_INT(ckpt_warray_write(l1, NULL, 0, u5, 5), 0);
	CHECK_EQ_INT(ckpt_warray_write(q, NULL, 0, u5, 5), 0);
	CHECK_EQ_INT(ckpt_warray_write(sc, NULL, 3, (uint8_t *)&stepv + 3, 5), 0);
	CHECK_EQ_INT(ckpt_warray_write(sc, NULL, 0, &stepv, 3), 0);
	ckpt_step_info si;
	ckpt_step_get_info(st, &si);
	CHECK_EQ_INT(si.arrays, 5);
	CHECK_EQ_INT(si.bytes_written, si.bytes_declared);

	/* A committed step "41" exists: commit into it fails, step stays pending. */
	char p[4200];
	snprintf(p, sizeof(p), "%s/41", root);
	CHECK_EQ_INT(mkdir(p, 0755), 0);
	CHECK_EQ_INT(ckpt_step_commit(st, "../x"), -EINVAL);
	CHECK_EQ_INT(ckpt_step_commit(st, "best"), -EINVAL); /* Orbax would not find it */
	/* The list layers has 2 and 10 only; "empty" has no arrays. */
	CHECK_EQ_INT(ckpt_step_commit(st, "40"), -EINVAL);
	for (int i = 0; i < 10; i++) {
		char idx[8];
		snprintf(idx, sizeof(idx), "%d", i);
		const char *kli[3] = { "layers", idx, "b" };
		ckpt_warray *li;
		if (i == 2)
			continue;
		CHECK_EQ_INT(ckpt_step_add_array(st, "state", kli, ktl, 3, CKPT_DT_UINT8, 1, s3, &li), 0);
		if (i != 5) /* layers 5 stays missing for one more try */
			CHECK_EQ_INT(ckpt_warray_write(li, NULL, 0, u5, 5), 0);
		else
			CHECK_EQ_INT(ckpt_warray_remove(li), 0);
	}
	CHECK_EQ_INT(ckpt_step_commit(st, "40"), -EINVAL);
	const char *kl5[3] = { "layers", "5", "b" };
	ckpt_warray *l5;
	CHECK_EQ_INT(ckpt_step_add_array(st, "state", kl5, ktl, 3, CKPT_DT_UINT8, 1, s3, &l5), 0);
	CHECK_EQ_INT(ckpt_warray_write(l5, NULL, 0, u5, 5), 0);
	CHECK_EQ_INT(ckpt_step_commit(st, "40"), -EINVAL); /* "empty" */
	/* A JSON item: not JSON is refused at commit; an item with arrays
	 * cannot become one, a JSON item takes no arrays. */
	CHECK_EQ_INT(ckpt_step_set_json(st, "state", "{}", 2), -EINVAL);
	CHECK_EQ_INT(ckpt_step_set_json(st, "empty", "{not json", 9), 0);
	CHECK_EQ_INT(ckpt_step_add_array(st, "empty", ku, kt, 1, CKPT_DT_FLOAT32, 0, NULL, &x), -EINVAL);
	CHECK_EQ_INT(ckpt_step_commit(st, "40"), -EINVAL);
	CHECK_EQ_INT(ckpt_step_set_json(st, "metrics", "[1]", 3), 0);
	CHECK_EQ_INT(ckpt_step_set_json(st, "empty", "{\"lr\": 0.5}", 11), 0);
	CHECK_EQ_INT(ckpt_step_commit(st, "40"), -EINVAL); /* metrics must be an object */
	CHECK_EQ_INT(ckpt_step_set_json(st, "metrics", "{}", 2), 0);
	CHECK_EQ_INT(ckpt_step_commit(st, "41"), -EEXIST);
	CHECK_EQ_INT(ckpt_step_commit(st, "40"), 0);
	CHECK_EQ_INT(ckpt_step_add_item(st, "late"), -EROFS);
	CHECK_EQ_INT(ckpt_step_commit(st, "42"), -EROFS);
	ckpt_step_destroy(st);
	CHECK_EQ_INT(ckpt_step_begin(root, "40", NULL, &st2), -EEXIST);

	/* _CHECKPOINT_METADATA and commit_success.txt. */
	snprintf(p, sizeof(p), "%s/40/_CHECKPOINT_METADATA", root);
	char *s = check_slurp(p, NULL);
	cJSON *j = s ? cJSON_Parse(s) : NULL;
	CHECK(j != NULL);
	if (j) {
		const cJSON *ih = jget(j, "item_handlers");
		CHECK(cJSON_IsObject(ih));
		CHECK(cJSON_IsString(jget(ih, "state")) &&
		      strstr(jget(ih, "state")->valuestring, "PyTreeCheckpointHandler") != NULL);
		CHECK(cJSON_IsString(jget(ih, "empty")) &&
		      strstr(jget(ih, "empty")->valuestring, "JsonCheckpointHandler") != NULL);
		CHECK(cJSON_IsString(jget(ih, "metrics")) &&
		      strstr(jget(ih, "metrics")->valuestring, "JsonCheckpointHandler") != NULL);
		CHECK(cJSON_IsObject(jget(j, "metrics")) && cJSON_IsObject(jget(j, "custom_metadata")));
		CHECK(strstr(s, "\"commit_timestamp_nsecs\":1") != NULL ||
		      strstr(s, "\"commit_timestamp_nsecs\":2") != NULL); /* an exact integer, not 1.7e18 */
	}
	cJSON_Delete(j);
	free(s);
	snprintf(p, sizeof(p), "%s/40/commit_success.txt", root);
	s = check_slurp(p, NULL);
	char want[4200];
	snprintf(want, sizeof(want), "Checkpoint commit was successful to %s/40", root);
	CHECK(s && strcmp(s, want) == 0);
	free(s);
	snprintf(p, sizeof(p), "%s/40/state/commit_success.txt", root);
	CHECK(exists(p));
	/* _METADATA: flatten order, repr keys, key types, write_shape. */
	snprintf(p, sizeof(p), "%s/40/state/_METADATA", root);
	s = check_slurp(p, NULL);
	j = s ? cJSON_Parse(s) : NULL;
	CHECK(j != NULL);
	if (j) {
		const cJSON *tm = jget(j, "tree_metadata");
		/* layers 0..10 in numeric order */
		char expect_keys[14][64];
		snprintf(expect_keys[0], 64, "(\"it's\",)");
		for (int li = 0; li <= 10; li++)
			snprintf(expect_keys[1 + li], 64, "('layers', '%d', 'b')", li);
		snprintf(expect_keys[12], 64, "('params', 'dense', 'kernel')");
		snprintf(expect_keys[13], 64, "('step',)");
		int i = 0;
		const cJSON *e;
		cJSON_ArrayForEach(e, tm)
		{
			CHECK(i < 14 && strcmp(e->string, expect_keys[i]) == 0);
			i++;
		}
		CHECK_EQ_INT(i, 14);
		const cJSON *l = jget(tm, "('layers', '10', 'b')");
		CHECK_EQ_INT(jget(cJSON_GetArrayItem(jget(l, "key_metadata"), 1), "key_type")->valuedouble,
			     1);
		const cJSON *vm = jget(l, "value_metadata");
		CHECK(strcmp(jget(vm, "value_type")->valuestring, "jax.Array") == 0);
		CHECK(cJSON_IsFalse(jget(vm, "skip_deserialize")));
		CHECK_EQ_INT(cJSON_GetArrayItem(jget(vm, "write_shape"), 0)->valuedouble, 5);
		CHECK(cJSON_IsFalse(jget(j, "use_ocdbt")) && cJSON_IsTrue(jget(j, "use_zarr3")));
		CHECK(cJSON_IsTrue(jget(j, "store_array_data_equal_to_fill_value")));
		CHECK(cJSON_IsNull(jget(j, "custom_metadata")));
	}
	cJSON_Delete(j);
	free(s);
	/* _sharding: base64url(param name) -> the JSON as a string. */
	snprintf(p, sizeof(p), "%s/40/state/_sharding", root);
	s = check_slurp(p, NULL);
	j = s ? cJSON_Parse(s) : NULL;
	CHECK(j && cJSON_IsString(jget(j, "cGFyYW1zLmRlbnNlLmtlcm5lbA==")) &&
	      strstr(jget(j, "cGFyYW1zLmRlbnNlLmtlcm5lbA==")->valuestring, "SingleDeviceSharding"));
	/* every other array: the default one-device NamedSharding */
	CHECK(j && cJSON_IsString(jget(j, "c3RlcA==")) &&
	      strcmp(jget(j, "c3RlcA==")->valuestring,
		     "{\"sharding_type\": \"NamedSharding\", \"shape\": [1], \"axis_names\": [\"d\"], "
		     "\"axis_types\": [\"AxisType.Auto\"], \"partition_spec\": [], \"device_mesh\": "
		     "{\"mesh\": [{\"id\": 0}]}}") == 0);
	CHECK_EQ_INT(cJSON_GetArraySize(j), 14);
	cJSON_Delete(j);
	free(s);
	snprintf(p, sizeof(p), "%s/40/empty/_METADATA", root);
	CHECK(!exists(p));
	snprintf(p, sizeof(p), "%s/40/empty/metadata", root);
	s = check_slurp(p, NULL);
	CHECK(s && strcmp(s, "{\"lr\": 0.5}") == 0);
	free(s);
	snprintf(p, sizeof(p), "%s/40/empty/commit_success.txt", root);
	CHECK(exists(p));
	snprintf(p, sizeof(p), "%s/40/metrics/metrics", root);
	CHECK(exists(p));
	snprintf(p, sizeof(p), "%s/40/state", root);
	CHECK_EQ_INT(verify_array(p, "params.dense.kernel", CKPT_DT_FLOAT32, 2, s1, (uint8_t *)fv), 0);
	CHECK_EQ_INT(verify_array(p, "layers.10.b", CKPT_DT_UINT8, 1, s3, u5), 0);
	CHECK_EQ_INT(verify_array(p, "step", CKPT_DT_INT64, 0, NULL, (uint8_t *)&stepv), 0);
	snprintf(p, sizeof(p), "%s/40/state/step/c", root);
	CHECK(exists(p)); /* rank 0: the shard key is "c" */
	/* The checker can fail: wrong expected values, a corrupted index CRC,
	 * a corrupted zstd frame. */
	fprintf(stderr, "(expected verify failures follow)\n");
	snprintf(p, sizeof(p), "%s/40/state", root);
	CHECK(verify_array(p, "layers.10.b", CKPT_DT_UINT8, 1, s3, (const uint8_t *)"\1\2\3\4\6") > 0);
	snprintf(p, sizeof(p), "%s/40/state/params.dense.kernel/c/0/0", root);
	size_t flen = 0;
	char *fb = check_slurp(p, &flen);
	CHECK(fb != NULL && flen > 20);
	if (fb) {
		for (int which = 0; which < 2; which++) {
			size_t at = which == 0 ? flen - 1 : 10; /* CRC byte / inside the frame */
			fb[at] ^= 0x5a;
			FILE *f = fopen(p, "wb");
			CHECK(f && fwrite(fb, 1, flen, f) == flen);
			fclose(f);
			char item40[4200];
			snprintf(item40, sizeof(item40), "%s/40/state", root);
			CHECK(verify_array(item40, "params.dense.kernel", CKPT_DT_FLOAT32, 2, s1,
					   (uint8_t *)fv) > 0);
			fb[at] ^= 0x5a;
		}
		FILE *f = fopen(p, "wb");
		CHECK(f && fwrite(fb, 1, flen, f) == flen);
		fclose(f);
		free(fb);
	}
	fprintf(stderr, "(end of expected verify failures)\n");
	snprintf(p, sizeof(p), "%s/40/state", root);
	CHECK_EQ_INT(verify_array(p, "params.dense.kernel", CKPT_DT_FLOAT32, 2, s1, (uint8_t *)fv), 0);

	/* Abort removes the tmp folder. */
	CHECK_EQ_INT(ckpt_step_begin(root, "43", NULL, &st), 0);
	CHECK_EQ_INT(ckpt_step_add_array(st, "state", k, kt, 3, CKPT_DT_FLOAT32, 2, s1, &a), 0);
	CHECK_EQ_INT(ckpt_warray_write(a, NULL, 0, fv, 7), 0);
	ckpt_step_abort(st);
	CHECK_EQ_INT(ckpt_warray_write(a, NULL, 0, fv, 7), -EROFS);
	ckpt_step_destroy(st);
	snprintf(p, sizeof(p), "%s/43.orbax-checkpoint-tmp", root);
	CHECK(!exists(p));

	/* forget: exactly the region's bytes become unwritten, also in chunks
	 * only partly inside it. */
	ckpt_writer_opts fo;
	ckpt_writer_opts_init(&fo);
	fo.chunk_bytes = 16; /* [3,4] float32: one row (16 bytes) a chunk */
	CHECK_EQ_INT(ckpt_step_begin(root, "44", &fo, &st), 0);
	CHECK_EQ_INT(ckpt_step_add_array(st, "state", k, kt, 3, CKPT_DT_FLOAT32, 2, s1, &a), 0);
	CHECK_EQ_INT(ckpt_warray_write(a, NULL, 0, fv, sizeof(fv)), 0);
	ckpt_region half = { .rank = 2, .start = { 1, 0 }, .stop = { 3, 2 } };
	CHECK_EQ_INT(ckpt_warray_forget(a, &half), 0); /* half of rows 1 and 2 */
	ckpt_warray_info ai;
	ckpt_warray_get_info(a, &ai);
	CHECK_EQ_INT(ai.bytes_written, 32);
	ckpt_region rows = { .rank = 2, .start = { 1, 0 }, .stop = { 3, 4 } };
	CHECK_EQ_INT(ckpt_warray_forget(a, &rows), 0);
	ckpt_warray_get_info(a, &ai);
	CHECK_EQ_INT(ai.bytes_written, 16);
	CHECK_EQ_INT(ckpt_step_commit(st, "44"), -ENODATA);
	CHECK_EQ_INT(ckpt_warray_forget(a, NULL), 0);
	ckpt_warray_get_info(a, &ai);
	CHECK_EQ_INT(ai.bytes_written, 0);
	CHECK_EQ_INT(ckpt_w_chunk_check_all(st), 0);
	CHECK_EQ_INT(ckpt_warray_write(a, NULL, 0, fv, sizeof(fv)), 0);
	CHECK_EQ_INT(ckpt_step_commit(st, "44"), 0);
	ckpt_step_destroy(st);
	snprintf(p, sizeof(p), "%s/44/state", root);
	CHECK_EQ_INT(verify_array(p, "params.dense.kernel", CKPT_DT_FLOAT32, 2, s1, (uint8_t *)fv), 0);
	rm_rf(root);
	free(root);
}

/* ---- 5. SIGKILL mid-save leaves only a tmp folder ---- */

static void test_kill(void)
{
	char *root = make_root("kill");
	/* An earlier committed step. */
	ckpt_step *st;
	uint64_t shape[1] = { 1000 };
	const char *k[1] = { "x" };
	int kt[1] = { 2 };
	ckpt_warray *a;
	uint8_t *v = malloc(4000);
	fill_random(v, 4000, CKPT_DT_FLOAT32);
	CHECK_EQ_INT(ckpt_step_begin(root, "1", NULL, &st), 0);
	CHECK_EQ_INT(ckpt_step_add_array(st, "state", k, kt, 1, CKPT_DT_FLOAT32, 1, shape, &a), 0);
	CHECK_EQ_INT(ckpt_warray_write(a, NULL, 0, v, 4000), 0);
	CHECK_EQ_INT(ckpt_step_commit(st, "1"), 0);
	ckpt_step_destroy(st);

	int pfd[2];
	CHECK_EQ_INT(pipe(pfd), 0);
	pid_t pid = fork();
	if (pid == 0) {
		close(pfd[0]);
		ckpt_writer_opts o;
		ckpt_writer_opts_init(&o);
		o.chunk_bytes = 65536;
		ckpt_step *cs;
		ckpt_warray *ca;
		uint64_t big[2] = { 4096, 4096 };
		if (ckpt_step_begin(root, "2", &o, &cs) ||
		    ckpt_step_add_array(cs, "state", k, kt, 1, CKPT_DT_FLOAT32, 2, big, &ca))
			_exit(3);
		uint8_t *buf = calloc(1, 1 << 20);
		for (uint64_t off = 0; off < 64ULL << 20; off += 1 << 20) {
			if (ckpt_warray_write(ca, NULL, off, buf, 1 << 20))
				_exit(4);
			if (off == 8 << 20 && write(pfd[1], "g", 1) != 1)
				_exit(5);
			usleep(20000);
		}
		ckpt_step_commit(cs, "2");
		_exit(0);
	}
	close(pfd[1]);
	char c = 0;
	CHECK_EQ_INT(read(pfd[0], &c, 1), 1);
	close(pfd[0]);
	kill(pid, SIGKILL);
	int status = 0;
	waitpid(pid, &status, 0);
	CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
	char p[4200];
	snprintf(p, sizeof(p), "%s/2", root);
	CHECK(!exists(p));
	snprintf(p, sizeof(p), "%s/2.orbax-checkpoint-tmp", root);
	CHECK(exists(p));
	snprintf(p, sizeof(p), "%s/1/state", root);
	CHECK_EQ_INT(verify_array(p, "x", CKPT_DT_FLOAT32, 1, shape, v), 0);
	/* Nothing but "1" and the tmp folder in the root. */
	DIR *d = opendir(root);
	int entries = 0;
	struct dirent *de;
	while (d && (de = readdir(d)))
		if (de->d_name[0] != '.' || strlen(de->d_name) > 2)
			entries++;
	if (d)
		closedir(d);
	CHECK_EQ_INT(entries, 2);
	/* ckpt_step_adopt takes it over as it is (a step stored as written):
	 * its lock is held meanwhile, and destroy leaves the folder. */
	ckpt_step *ad;
	CHECK_EQ_INT(ckpt_step_adopt(root, "2", NULL, &ad), 0);
	CHECK_EQ_INT(ckpt_step_begin(root, "2", NULL, &st), -EBUSY);
	CHECK_EQ_INT(ckpt_step_adopt(root, "2", NULL, &st), -EBUSY);
	CHECK_EQ_INT(ckpt_step_adopt(root, "1", NULL, &st), -EEXIST);
	CHECK_EQ_INT(ckpt_step_adopt(root, "3", NULL, &st), -ENOENT);
	ckpt_step_destroy(ad);
	snprintf(p, sizeof(p), "%s/2.orbax-checkpoint-tmp", root);
	CHECK(exists(p));
	/* The stale tmp folder is not a step: a new begin replaces it. */
	CHECK_EQ_INT(ckpt_step_begin(root, "2", NULL, &st), 0);
	CHECK_EQ_INT(ckpt_step_add_array(st, "state", k, kt, 1, CKPT_DT_FLOAT32, 1, shape, &a), 0);
	CHECK_EQ_INT(ckpt_warray_write(a, NULL, 0, v, 4000), 0);
	CHECK_EQ_INT(ckpt_step_commit(st, "2"), 0);
	ckpt_step_destroy(st);
	snprintf(p, sizeof(p), "%s/2/state", root);
	CHECK_EQ_INT(verify_array(p, "x", CKPT_DT_FLOAT32, 1, shape, v), 0);
	free(v);
	rm_rf(root);
	free(root);
}

/* ---- 6. throughput (printed, not asserted) ---- */

struct bench_job {
	ckpt_warray *a;
	const uint8_t *src;
	uint64_t lo, hi;
	int rc;
};

static void *bench_thread(void *arg)
{
	struct bench_job *j = arg;
	for (uint64_t off = j->lo; off < j->hi && !j->rc; off += 1 << 20) {
		uint64_t n = j->hi - off < (1 << 20) ? j->hi - off : (1 << 20);
		j->rc = ckpt_warray_write(j->a, NULL, off, j->src + off, n);
	}
	return NULL;
}

static void bench(int level)
{
	char *root = make_root("bench");
	uint64_t shape[2] = { 8192, 16384 }; /* 256 MiB of bf16 */
	uint64_t n = shape[0] * shape[1] * 2;
	uint8_t *src = malloc(n);
	/* bf16 of roughly normal floats: exponent bytes compress, mantissas don't. */
	uint64_t s = 42;
	for (uint64_t i = 0; i < n / 2; i++) {
		uint64_t r = check_rnd(&s);
		float f = (float)((double)(r & 0xffff) + (double)(r >> 16 & 0xffff) +
				  (double)(r >> 32 & 0xffff) - 98304.0) /
			  20000.0f;
		uint32_t u;
		memcpy(&u, &f, 4);
		src[2 * i] = (uint8_t)(u >> 16);
		src[2 * i + 1] = (uint8_t)(u >> 24);
	}
	ckpt_writer_opts o;
	ckpt_writer_opts_init(&o);
	o.zstd_level = level;
	ckpt_step *st;
	ckpt_warray *a;
	const char *k[1] = { "w" };
	int kt[1] = { 2 };
	CHECK_EQ_INT(ckpt_step_begin(root, "1", &o, &st), 0);
	CHECK_EQ_INT(ckpt_step_add_array(st, "state", k, kt, 1, CKPT_DT_BFLOAT16, 2, shape, &a), 0);
	double t0 = now_s();
	pthread_t th[2];
	struct bench_job jb[2] = { { a, src, 0, n / 2, 0 }, { a, src, n / 2, n, 0 } };
	for (int i = 0; i < 2; i++)
		pthread_create(&th[i], NULL, bench_thread, &jb[i]);
	for (int i = 0; i < 2; i++) {
		pthread_join(th[i], NULL);
		CHECK_EQ_INT(jb[i].rc, 0);
	}
	double t1 = now_s();
	ckpt_step_info si;
	for (;;) { /* background compression still running? */
		ckpt_step_get_info(st, &si);
		if (!si.bytes_pending)
			break;
		usleep(1000);
	}
	double td = now_s();
	CHECK_EQ_INT(ckpt_step_commit(st, "1"), 0);
	double t2 = now_s();
	ckpt_warray_info info;
	ckpt_warray_get_info(a, &info);
	printf("bench zstd level %d: 256 MiB bf16 from 2 threads: writes returned after %.2f s (%.0f MB/s), "
	       "compression done %.2f s later, commit (index+metadata+fsync+rename) %.2f s; end to end %.0f "
	       "MB/s; "
	       "stored %.1f MiB (ratio %.3f), chunk [%llu,%llu] shard [%llu,%llu]\n",
	       level, t1 - t0, n / (t1 - t0) / 1e6, td - t1, t2 - td, n / (t2 - t0) / 1e6,
	       info.stored_bytes / 1048576.0, (double)n / (double)info.stored_bytes,
	       (unsigned long long)info.chunk_shape[0], (unsigned long long)info.chunk_shape[1],
	       (unsigned long long)info.shard_shape[0], (unsigned long long)info.shard_shape[1]);
	ckpt_step_destroy(st);
	free(src);
	rm_rf(root);
	free(root);
}

/* ---- --emit DIR ---- */

static int emit(const char *dir)
{
	char root[4096], p[4200];
	snprintf(root, sizeof(root), "%s/root", dir);
	mkdir(dir, 0755);
	if (mkdir(root, 0755) && errno != EEXIST)
		return 2;
	snprintf(p, sizeof(p), "%s/expected", dir);
	mkdir(p, 0755);
	ckpt_writer_opts o;
	ckpt_writer_opts_init(&o);
	o.chunk_bytes = 2048;
	o.shard_bytes = 16384;
	ckpt_step *st;
	if (ckpt_step_begin(root, "1", &o, &st))
		return 2;
	struct {
		const char *item;
		int depth;
		const char *keys[4];
		int kt[4];
		ckpt_dtype dt;
		int rank;
		uint64_t shape[4];
	} spec[] = {
		{ "state", 3, { "params", "dense", "kernel" }, { 2, 2, 2 }, CKPT_DT_FLOAT32, 2, { 64, 48 } },
		{ "state", 3, { "params", "dense", "bias" }, { 2, 2, 2 }, CKPT_DT_FLOAT32, 1, { 48 } },
		{ "state", 2, { "params", "emb" }, { 2, 2 }, CKPT_DT_BFLOAT16, 2, { 100, 33 } },
		{ "state", 2, { "opt", "count" }, { 2, 2 }, CKPT_DT_INT32, 0, { 0 } },
		{ "state", 3, { "layers", "0", "w" }, { 2, 1, 2 }, CKPT_DT_FLOAT16, 3, { 7, 5, 3 } },
		{ "state", 3, { "layers", "1", "w" }, { 2, 1, 2 }, CKPT_DT_FLOAT16, 3, { 7, 5, 3 } },
		{ "state", 1, { "mask" }, { 2 }, CKPT_DT_BOOL, 1, { 17 } },
		{ "state", 1, { "big" }, { 2 }, CKPT_DT_UINT8, 2, { 300, 200 } },
		{ "state", 1, { "i64" }, { 2 }, CKPT_DT_INT64, 2, { 10, 10 } },
		{ "state", 1, { "r4" }, { 2 }, CKPT_DT_UINT16, 4, { 3, 4, 5, 6 } },
		{ "state", 1, { "f64" }, { 2 }, CKPT_DT_FLOAT64, 1, { 129 } },
		{ "extra", 1, { "q" }, { 2 }, CKPT_DT_INT8, 1, { 50 } },
	};
	cJSON *ex = cJSON_CreateArray();
	for (size_t i = 0; i < sizeof(spec) / sizeof(spec[0]); i++) {
		ckpt_warray *a;
		if (ckpt_step_add_array(st, spec[i].item, spec[i].keys, spec[i].kt, spec[i].depth, spec[i].dt,
					spec[i].rank, spec[i].shape, &a))
			return 2;
		uint64_t n = prod(spec[i].shape, spec[i].rank) * ckpt_dtype_get(spec[i].dt)->itemsize;
		uint8_t *v = malloc(n);
		fill_random(v, n, spec[i].dt);
		if (write_stream_shuffled(a, v, n, 333))
			return 2;
		if (i == 0 && ckpt_warray_set_sharding(a, "{\"sharding_type\": \"SingleDeviceSharding\", "
							  "\"device_str\": \"cpu:0\"}"))
			return 2;
		ckpt_warray_info info;
		ckpt_warray_get_info(a, &info);
		snprintf(p, sizeof(p), "%s/expected/%s.%s.bin", dir, spec[i].item, info.name);
		FILE *f = fopen(p, "wb");
		if (!f || fwrite(v, 1, n, f) != n)
			return 2;
		fclose(f);
		free(v);
		cJSON *e = cJSON_CreateObject();
		cJSON_AddStringToObject(e, "item", spec[i].item);
		cJSON_AddStringToObject(e, "name", info.name);
		cJSON_AddStringToObject(e, "dtype", ckpt_dtype_get(spec[i].dt)->name);
		cJSON *sh = cJSON_CreateArray();
		for (int d = 0; d < spec[i].rank; d++)
			cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)spec[i].shape[d]));
		cJSON_AddItemToObject(e, "shape", sh);
		cJSON_AddStringToObject(e, "file", strrchr(p, '/') + 1);
		cJSON_AddItemToArray(ex, e);
	}
	if (ckpt_step_commit(st, "1"))
		return 2;
	ckpt_step_destroy(st);
	char *s = cJSON_Print(ex);
	cJSON_Delete(ex);
	snprintf(p, sizeof(p), "%s/expected/expected.json", dir);
	FILE *f = fopen(p, "w");
	if (!f || fputs(s, f) < 0)
		return 2;
	fclose(f);
	free(s);
	printf("%s/root/1\n", dir);
	return 0;
}

/* The numbers of multi-host records (fuzz_hosts_done: a written 2^64-1
 * reads back as the double 2^64, whose cast to uint64_t overflowed). */
static void test_host_records(void)
{
	static const struct {
		const char *json;
		uint64_t want;
	} nums[] = { { "42", 42 },
		     { "0", 0 },
		     { "-3", 0 },
		     { "\"7\"", 0 },
		     { "9007199254740992", 9007199254740992ull },
		     { "18446744073709551615", UINT64_MAX },
		     { "1e300", UINT64_MAX } };
	for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++) {
		cJSON *j = cJSON_Parse(nums[i].json);
		CHECK(j != NULL);
		CHECK(ckpt_w_json_to_u64(j) == nums[i].want);
		cJSON_Delete(j);
	}
	/* a declaration written with such a shape parses back to it */
	uint64_t big[2] = { UINT64_MAX, 3 };
	cJSON *r = cJSON_Parse("{\"item\":\"state\",\"keys\":[\"a\",\"b\"],\"key_types\":[1,1],"
			       "\"dtype\":\"float32\",\"host\":2}");
	cJSON_AddItemToObject(r, "shape", ckpt_w_json_shape(big, 2));
	cJSON_AddItemToObject(r, "chunk", ckpt_w_json_shape(big, 2));
	cJSON_AddItemToObject(r, "shard", ckpt_w_json_shape(big, 2));
	char *txt = cJSON_PrintUnformatted(r);
	cJSON *back = txt ? cJSON_Parse(txt) : NULL;
	struct w_decl d;
	CHECK_EQ_INT(ckpt_w_decl_parse(back, &d), 0);
	CHECK(d.depth == 2 && d.rank == 2 && d.host == 2 && strcmp(d.keys[1], "b") == 0);
	CHECK(d.shape[0] == UINT64_MAX && d.shape[1] == 3 && d.chunk[0] == UINT64_MAX && d.shard[1] == 3);
	cJSON_Delete(back);
	free(txt);
	cJSON_Delete(r);
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "--emit") == 0)
		return emit(argv[2]);
	ckpt_log_set_level(getenv("CKPT_TEST_VERBOSE") ? CKPT_LOG_DEBUG : CKPT_LOG_ERR + 0);
	if (getenv("CKPT_TEST_SEED"))
		rng_state = strtoull(getenv("CKPT_TEST_SEED"), NULL, 0) | 1;
	CHECK_RUN(test_decls_and_metadata);
	CHECK_RUN(test_all_dtypes);
	CHECK_RUN(test_rewrite_holes);
	CHECK_RUN(test_spill_read_and_io_error);
	CHECK_RUN(test_forget_exact);
	CHECK_RUN(test_overlap_rules);
	CHECK_RUN(test_declared_space_free);
	CHECK_RUN(test_spill_sparse);
	CHECK_RUN(test_random_regions);
	CHECK_RUN_CALL(run_slices, ("slices", 512 << 20, 4096, 0));
	CHECK_RUN_CALL(run_slices, ("overlap", 512 << 20, 4096, 1));
	CHECK_RUN_CALL(run_slices, ("tinybudget", 3 * 4096, 4096, 1));
	CHECK_RUN_CALL(run_slices, ("tinybudget2", 1, 8192, 0));
	CHECK_RUN(test_kill);
	CHECK_RUN(test_host_records);
	/* Every pending byte was stored or dropped with its step. */
	CHECK_EQ_INT(atomic_load(&ckpt_g_stats.bytes_pending), 0);
	if (CHECK_ALL_CASES()) { /* the totals of every case */
		CHECK(atomic_load(&ckpt_g_stats.commits) >= 150);
		CHECK(atomic_load(&ckpt_g_stats.stored_bytes_written) > 0);
	}
	if (!getenv("CKPT_WRITER_NO_BENCH")) {
		CHECK_RUN_CALL(bench, (1));
		CHECK_RUN_CALL(bench, (3));
	}
	return CHECK_DONE();
}
