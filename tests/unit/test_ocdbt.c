/*
 * test_ocdbt.c - the OCDBT decoder and store: real Orbax fixtures (merged
 * roots, per-process databases, the union path), values checked against the
 * expected arrays, synthetic trees from scripts/gen_ocdbt.py (deep trees,
 * out-of-line values, many data files, concurrency, 10,000 arrays timing),
 * and corrupt input (fixture copies and hand-built trees).
 */
#include <cjson/cJSON.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zstd.h>

#include "check.h"
#include "common.h"
#include "crc32c.h"
#include "fwd_store.h"
#include "ocdbt.h"
#include "pool.h"
#include "store.h"

#define FIX CKPT_FIXTURES
#define PY "/usr/bin/python3"

static char tmp_root[256];

/* ------------------------------------------------------------ helpers */

static int run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int run(const char *fmt, ...)
{
	char cmd[4096];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	int rc = system(cmd);
	return rc == -1 ? -1 : WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static int spit(const char *path, const void *data, size_t len)
{
	FILE *f = fopen(path, "wb");
	if (!f)
		return -1;
	size_t w = fwrite(data, 1, len, f);
	fclose(f);
	return w == len ? 0 : -1;
}

/* Copy a fixture folder into a fresh writable temp folder. */
static void copy_tree(const char *src, const char *dst)
{
	run("rm -rf '%s' && cp -r '%s' '%s' && chmod -R u+w '%s'", dst, src, dst, dst);
}

static void tmp_path(char *out, size_t cap, const char *name)
{
	snprintf(out, cap, "%s/%s", tmp_root, name);
}

/* Collect keys of a store listing. */
struct keylist {
	char **k;
	uint64_t *sz;
	size_t n, cap;
};

static int collect_cb(void *ctx, const char *key, uint64_t size)
{
	struct keylist *l = ctx;
	if (l->n == l->cap) {
		l->cap = l->cap ? 2 * l->cap : 64;
		l->k = realloc(l->k, l->cap * sizeof(*l->k));
		l->sz = realloc(l->sz, l->cap * sizeof(*l->sz));
	}
	l->k[l->n] = strdup(key);
	l->sz[l->n++] = size;
	return 0;
}

static void keylist_free(struct keylist *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->k[i]);
	free(l->k);
	free(l->sz);
	memset(l, 0, sizeof(*l));
}

static int has_key(const struct keylist *l, const char *k)
{
	for (size_t i = 0; i < l->n; i++)
		if (strcmp(l->k[i], k) == 0)
			return 1;
	return 0;
}

static int sorted_unique(const struct keylist *l)
{
	for (size_t i = 1; i < l->n; i++)
		if (strcmp(l->k[i - 1], l->k[i]) >= 0)
			return 0;
	return 1;
}

static int read_value(ckpt_store *s, const char *key, uint8_t **out, size_t *len)
{
	*out = NULL; /* defined on failure too: gcc -O2 cannot prove (int)n != 0 below */
	*len = 0;
	uint64_t size;
	int rc = ckpt_store_size(s, key, &size);
	if (rc)
		return rc;
	uint8_t *b = malloc(size + 1);
	ssize_t n = ckpt_store_read(s, key, 0, size, b);
	if (n < 0 || (uint64_t)n != size) {
		free(b);
		return n < 0 ? (int)n : -EIO;
	}
	*out = b;
	*len = size;
	return 0;
}

static int open_rc(const char *dir)
{
	ckpt_store *s = NULL;
	int rc = ckpt_store_ocdbt_open(dir, &s);
	if (rc == 0)
		ckpt_store_destroy(s);
	return rc;
}

/* Run open with stderr captured; returns rc, *log = captured text. */
static int open_rc_logged(const char *dir, char **log)
{
	char path[512];
	tmp_path(path, sizeof(path), "stderr.txt");
	fflush(stderr);
	int saved = dup(2);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	dup2(fd, 2);
	close(fd);
	int rc = open_rc(dir);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	*log = check_slurp(path, NULL);
	if (*log)
		fputs(*log, stderr); /* keep it visible in the test output */
	return rc;
}

static int count_lines(const char *s)
{
	int n = 0;
	for (; s && *s; s++)
		n += *s == '\n';
	return n;
}

/* ------------------------------------------------------------ fixtures */

static const char *const zarr2_arrays[] = {
	"opt_state.count",
	"opt_state.mu.embedding",
	"opt_state.nu.embedding",
	"params.embed.embedding",
	"params.final_norm.scale",
	"params.layer_0.attn.o_proj",
	"params.layer_0.attn.q_proj",
	"params.layer_0.mlp.b1",
	"params.layer_0.mlp.w1",
	"step",
};

static const uint8_t zstd_magic[4] = { 0x28, 0xb5, 0x2f, 0xfd };

/* Chunk value checks: zarr2 = one zstd frame; zarr3 = shard with 1 inner
 * chunk and a 20-byte index (offset, nbytes, crc32c). */
static int valid_chunk(const uint8_t *v, size_t n, int zarr3)
{
	if (!zarr3)
		return n >= 4 && memcmp(v, zstd_magic, 4) == 0;
	if (n < 20)
		return 0;
	const uint8_t *ix = v + n - 20;
	uint64_t off = ckpt_le64(ix), nb = ckpt_le64(ix + 8);
	if (ckpt_crc32c(0, ix, 16) != ckpt_le32(ix + 16))
		return 0;
	return off <= n - 20 && nb <= n - 20 - off && nb >= 4 && memcmp(v + off, zstd_magic, 4) == 0;
}

/* Open one item; check keys; check every chunk value's framing. */
static void check_item(const char *dir, const char *const *names, size_t nnames, int zarr3, size_t nkeys)
{
	ckpt_store *s = NULL;
	int rc = ckpt_store_ocdbt_open(dir, &s);
	CHECK_EQ_INT(rc, 0);
	if (rc) {
		fprintf(stderr, "  (item %s)\n", dir);
		return;
	}
	CHECK(strcmp(s->root, dir) == 0);
	struct keylist l = { 0 };
	CHECK_EQ_INT(ckpt_store_list(s, "", collect_cb, &l), 0);
	CHECK_EQ_INT(l.n, nkeys);
	CHECK(sorted_unique(&l));
	for (size_t i = 0; i < nnames; i++) {
		char k[256];
		snprintf(k, sizeof(k), "%s/%s", names[i], zarr3 ? "zarr.json" : ".zarray");
		if (!has_key(&l, k))
			fprintf(stderr, "  missing %s in %s\n", k, dir);
		CHECK(has_key(&l, k));
	}
	size_t chunks = 0, bad = 0;
	for (size_t i = 0; i < l.n; i++) {
		const char *slash = strrchr(l.k[i], '/');
		if (!slash || !strcmp(slash, "/.zarray") || !strcmp(slash, "/zarr.json"))
			continue;
		uint8_t *v;
		size_t n;
		rc = read_value(s, l.k[i], &v, &n);
		if (rc || n != l.sz[i] || !valid_chunk(v, n, zarr3)) {
			bad++;
			fprintf(stderr, "  bad chunk %s/%s rc=%d\n", dir, l.k[i], rc);
		}
		if (!rc)
			free(v);
		chunks++;
	}
	CHECK_EQ_INT(bad, 0);
	CHECK_EQ_INT(chunks + nnames, nkeys);
	/* metadata parses as JSON and names the right format */
	char k[256];
	snprintf(k, sizeof(k), "%s/%s", names[0], zarr3 ? "zarr.json" : ".zarray");
	char *meta;
	size_t mlen;
	CHECK_EQ_INT(ckpt_store_read_all(s, k, 1 << 20, &meta, &mlen), 0);
	cJSON *j = cJSON_Parse(meta);
	CHECK(j != NULL);
	cJSON *zf = cJSON_GetObjectItemCaseSensitive(j, "zarr_format");
	CHECK(cJSON_IsNumber(zf) && zf->valueint == (zarr3 ? 3 : 2));
	cJSON_Delete(j);
	free(meta);
	keylist_free(&l);
	ckpt_store_destroy(s);
}

static size_t dtype_size(const char *dt)
{
	return !strcmp(dt, "bfloat16") ? 2 : 4; /* fixtures: bfloat16, float32, int32 */
}

static int json_ints(cJSON *arr, uint64_t *out, int max)
{
	int n = 0;
	cJSON *it;
	cJSON_ArrayForEach(it, arr)
	{
		if (n >= max || !cJSON_IsNumber(it))
			return -1;
		out[n++] = (uint64_t)it->valuedouble;
	}
	return n;
}

/*
 * Decode a whole array from its chunks (zarr2: zstd; zarr3: one-chunk shard
 * + zstd) and compare with expected/<name>.bin.  Returns 0 when equal.
 */
static int decode_and_compare(ckpt_store *s, const char *name, const char *exp_name, int zarr3)
{
	char key[512], path[512];
	cJSON *exp_doc = NULL, *meta = NULL;
	char *exp_json = NULL, *mtxt = NULL, *expected = NULL;
	uint8_t *arr = NULL, *chunk = NULL;
	int rc = -1;
	snprintf(path, sizeof(path), "%s/expected/expected.json", FIX);
	exp_json = check_slurp(path, NULL);
	exp_doc = cJSON_Parse(exp_json);
	cJSON *e = cJSON_GetObjectItemCaseSensitive(exp_doc, exp_name);
	if (!e)
		goto out;
	size_t isz = dtype_size(cJSON_GetObjectItemCaseSensitive(e, "dtype")->valuestring);
	snprintf(path, sizeof(path), "%s/expected/%s", FIX,
		 cJSON_GetObjectItemCaseSensitive(e, "file")->valuestring);
	size_t exp_len;
	expected = check_slurp(path, &exp_len);

	size_t mlen;
	snprintf(key, sizeof(key), "%s/%s", name, zarr3 ? "zarr.json" : ".zarray");
	if (ckpt_store_read_all(s, key, 1 << 20, &mtxt, &mlen))
		goto out;
	meta = cJSON_Parse(mtxt);
	uint64_t shape[8], cs[8];
	int rank = json_ints(cJSON_GetObjectItemCaseSensitive(meta, "shape"), shape, 8);
	cJSON *cj = zarr3 ? cJSON_GetObjectItemCaseSensitive(
				    cJSON_GetObjectItemCaseSensitive(
					    cJSON_GetObjectItemCaseSensitive(meta, "chunk_grid"),
					    "configuration"),
				    "chunk_shape")
			  : cJSON_GetObjectItemCaseSensitive(meta, "chunks");
	if (rank < 0 || json_ints(cj, cs, 8) != rank)
		goto out;
	uint64_t total = 1, cel = 1, grid[8], gi[8] = { 0 };
	for (int d = 0; d < rank; d++) {
		total *= shape[d];
		cel *= cs[d];
		grid[d] = (shape[d] + cs[d] - 1) / cs[d];
	}
	if (!expected || exp_len != total * isz)
		goto out;
	arr = calloc(total, isz);
	chunk = malloc(cel * isz);
	for (;;) {
		/* chunk key */
		int kl = snprintf(key, sizeof(key), "%s/%s", name, zarr3 ? "c" : "");
		for (int d = 0; d < rank; d++)
			kl += snprintf(key + kl, sizeof(key) - (size_t)kl, "%s%llu",
				       zarr3 ? "/" : (d ? "." : ""), (unsigned long long)gi[d]);
		if (!zarr3 && rank == 0)
			snprintf(key + kl, sizeof(key) - (size_t)kl, "0");
		uint8_t *v;
		size_t vn;
		if (read_value(s, key, &v, &vn)) {
			fprintf(stderr, "  cannot read %s\n", key);
			goto out;
		}
		const uint8_t *frame = v;
		size_t fn = vn;
		if (zarr3) {
			if (!valid_chunk(v, vn, 1)) {
				free(v);
				goto out;
			}
			frame = v + ckpt_le64(v + vn - 20);
			fn = ckpt_le64(v + vn - 12);
		}
		size_t dn = ZSTD_decompress(chunk, cel * isz, frame, fn);
		free(v);
		if (ZSTD_isError(dn) || dn != cel * isz) {
			fprintf(stderr, "  zstd failed on %s\n", key);
			goto out;
		}
		/* scatter the chunk's elements (C order) into the array */
		for (uint64_t el = 0; el < cel; el++) {
			uint64_t rem = el, gidx = 0, inside = 1;
			for (int d = rank - 1; d >= 0; d--) {
				uint64_t c = rem % cs[d];
				rem /= cs[d];
				uint64_t g = gi[d] * cs[d] + c;
				if (g >= shape[d])
					inside = 0;
				uint64_t stride = 1;
				for (int d2 = d + 1; d2 < rank; d2++)
					stride *= shape[d2];
				gidx += g * stride;
			}
			if (inside)
				memcpy(arr + gidx * isz, chunk + el * isz, isz);
		}
		int d = rank - 1;
		while (d >= 0 && ++gi[d] == grid[d])
			gi[d--] = 0;
		if (d < 0)
			break;
	}
	rc = memcmp(arr, expected, total * isz) == 0 ? 0 : 1;
out:
	if (rc)
		fprintf(stderr, "  decode/compare failed for %s (%s)\n", name, exp_name);
	free(chunk);
	free(arr);
	cJSON_Delete(meta);
	free(mtxt);
	free(expected);
	cJSON_Delete(exp_doc);
	free(exp_json);
	return rc;
}

static void test_fixtures(void)
{
	static const char *const v1_params[] = { "embed.embedding",	"final_norm.scale",
						 "layer_0.attn.o_proj", "layer_0.attn.q_proj",
						 "layer_0.mlp.b1",	"layer_0.mlp.w1" };
	static const char *const v1_opt[] = { "count", "mu.embedding", "nu.embedding" };
	const size_t nz = sizeof(zarr2_arrays) / sizeof(zarr2_arrays[0]);
	check_item(FIX "/std_ocdbt_zarr3", zarr2_arrays, nz, 0, 76);
	check_item(FIX "/pytree_ocdbt_zarr2", zarr2_arrays, nz, 0, 76);
	check_item(FIX "/manager/10/state", zarr2_arrays, nz, 0, 76);
	check_item(FIX "/manager/20/state", zarr2_arrays, nz, 0, 76);
	check_item(FIX "/v1_pytree/state", zarr2_arrays, nz, 1, 76);
	check_item(FIX "/v1_checkpointables/params", v1_params, 6, 1, 54);
	check_item(FIX "/v1_checkpointables/opt_state", v1_opt, 3, 1, 20);
	/* per-process databases opened alone: the latest generation holds all keys */
	check_item(FIX "/std_ocdbt_zarr3/ocdbt.process_0", zarr2_arrays, nz, 0, 76);
	check_item(FIX "/pytree_ocdbt_zarr2/ocdbt.process_0", zarr2_arrays, nz, 0, 76);
	check_item(FIX "/manager/10/state/ocdbt.process_0", zarr2_arrays, nz, 0, 76);
	check_item(FIX "/manager/20/state/ocdbt.process_0", zarr2_arrays, nz, 0, 76);
	check_item(FIX "/v1_pytree/state/ocdbt.process_0", zarr2_arrays, nz, 1, 76);
	check_item(FIX "/v1_checkpointables/params/ocdbt.process_0", v1_params, 6, 1, 54);
	check_item(FIX "/v1_checkpointables/opt_state/ocdbt.process_0", v1_opt, 3, 1, 20);

	/* not OCDBT at all */
	CHECK_EQ_INT(open_rc(FIX "/pytree_zarr2"), -ENOENT);
	CHECK_EQ_INT(open_rc(FIX "/does-not-exist"), -ENOENT);

	/* decode every array of a zarr2 item and of a zarr3 item (whose large
	 * chunks are out of line in ocdbt.process_0/d/ through base_path) */
	ckpt_store *s;
	CHECK_EQ_INT(ckpt_store_ocdbt_open(FIX "/std_ocdbt_zarr3", &s), 0);
	for (size_t i = 0; i < nz; i++)
		CHECK_EQ_INT(decode_and_compare(s, zarr2_arrays[i], zarr2_arrays[i], 0), 0);
	ckpt_store_destroy(s);
	CHECK_EQ_INT(ckpt_store_ocdbt_open(FIX "/v1_pytree/state", &s), 0);
	for (size_t i = 0; i < nz; i++)
		CHECK_EQ_INT(decode_and_compare(s, zarr2_arrays[i], zarr2_arrays[i], 1), 0);
	ckpt_store_destroy(s);
	CHECK_EQ_INT(ckpt_store_ocdbt_open(FIX "/v1_checkpointables/params", &s), 0);
	for (size_t i = 0; i < 6; i++) {
		char en[128];
		snprintf(en, sizeof(en), "params.%s", v1_params[i]);
		CHECK_EQ_INT(decode_and_compare(s, v1_params[i], en, 1), 0);
	}
	ckpt_store_destroy(s);
	CHECK_EQ_INT(ckpt_store_ocdbt_open(FIX "/v1_checkpointables/opt_state", &s), 0);
	for (size_t i = 0; i < 3; i++) {
		char en[128];
		snprintf(en, sizeof(en), "opt_state.%s", v1_opt[i]);
		CHECK_EQ_INT(decode_and_compare(s, v1_opt[i], en, 1), 0);
	}
	/* a wrong expectation is detected (mu decoded, compared with nu) */
	CHECK_EQ_INT(decode_and_compare(s, "mu.embedding", "opt_state.nu.embedding", 1), 1);
	ckpt_store_destroy(s);

	/* out-of-line values through base_path: lookup reports the process file */
	ckpt_ocdbt *db;
	CHECK_EQ_INT(ckpt_ocdbt_open(FIX "/v1_pytree/state", &db), 0);
	struct ckpt_ocdbt_value v;
	CHECK_EQ_INT(ckpt_ocdbt_lookup(db, "opt_state.mu.embedding/c/0/0", &v), 0);
	CHECK(v.inline_data == NULL && v.path && strncmp(v.path, "ocdbt.process_0/d/", 18) == 0);
	CHECK_EQ_INT(v.size, 1033);
	CHECK_EQ_INT(ckpt_ocdbt_lookup(db, "opt_state.mu.embedding/c/2/0", &v), 0);
	CHECK(v.inline_data != NULL && v.size == 1022);
	CHECK_EQ_INT(ckpt_ocdbt_lookup(db, "opt_state.mu.embedding/c/9/9", &v), -ENOENT);
	CHECK_EQ_INT(ckpt_ocdbt_height(db), 0);
	CHECK_EQ_INT(ckpt_ocdbt_nodes(db), 1);
	ckpt_ocdbt_close(db);
}

/* Compare two stores key by key, value by value. */
static int same_content(ckpt_store *a, ckpt_store *b)
{
	struct keylist la = { 0 }, lb = { 0 };
	ckpt_store_list(a, "", collect_cb, &la);
	ckpt_store_list(b, "", collect_cb, &lb);
	int ok = la.n == lb.n && la.n > 0;
	for (size_t i = 0; ok && i < la.n; i++) {
		uint8_t *va, *vb;
		size_t na, nb;
		ok = strcmp(la.k[i], lb.k[i]) == 0 && read_value(a, la.k[i], &va, &na) == 0;
		if (ok) {
			ok = read_value(b, lb.k[i], &vb, &nb) == 0;
			if (ok) {
				ok = na == nb && memcmp(va, vb, na) == 0;
				free(vb);
			}
			free(va);
		}
	}
	keylist_free(&la);
	keylist_free(&lb);
	return ok;
}

static void test_union_fixture(const char *item, const char *name)
{
	char dst[512];
	tmp_path(dst, sizeof(dst), name);
	copy_tree(item, dst);
	char p[600];
	snprintf(p, sizeof(p), "%s/manifest.ocdbt", dst);
	CHECK_EQ_INT(unlink(p), 0);
	run("rm -rf '%s/d'", dst); /* the merged root's nodes are gone too */
	ckpt_store *a = NULL, *b = NULL;
	CHECK_EQ_INT(ckpt_store_ocdbt_open(item, &a), 0);
	CHECK_EQ_INT(ckpt_store_ocdbt_open(dst, &b), 0);
	if (a && b)
		CHECK(same_content(a, b));
	ckpt_store_destroy(a);
	ckpt_store_destroy(b);
	/* the same database twice: duplicates collapse, content unchanged */
	run("cp -r '%s/ocdbt.process_0' '%s/ocdbt.process_1'", dst, dst);
	CHECK_EQ_INT(ckpt_store_ocdbt_open(item, &a), 0);
	CHECK_EQ_INT(ckpt_store_ocdbt_open(dst, &b), 0);
	if (a && b)
		CHECK(same_content(a, b));
	ckpt_store_destroy(a);
	ckpt_store_destroy(b);
	run("rm -rf '%s/ocdbt.process_1'", dst);
	/* Orbax's replica_separate_folder names: ocdbt.process_replica_<id>/ */
	run("mv '%s/ocdbt.process_0' '%s/ocdbt.process_replica_0'", dst, dst);
	CHECK_EQ_INT(ckpt_store_ocdbt_open(item, &a), 0);
	CHECK_EQ_INT(ckpt_store_ocdbt_open(dst, &b), 0);
	if (a && b)
		CHECK(same_content(a, b));
	ckpt_store_destroy(a);
	ckpt_store_destroy(b);
	run("mv '%s/ocdbt.process_replica_0' '%s/ocdbt.process_0'", dst, dst);
	snprintf(p, sizeof(p), "%s/ocdbt.process_replica_", dst); /* no id: not a process folder */
	mkdir(p, 0755);
	CHECK_EQ_INT(open_rc(dst), 0);
	/* a process folder without a manifest is skipped; none at all: -ENOENT */
	snprintf(p, sizeof(p), "%s/ocdbt.process_7", dst);
	mkdir(p, 0755);
	CHECK_EQ_INT(open_rc(dst), 0);
	run("rm -rf '%s/ocdbt.process_0'", dst);
	CHECK_EQ_INT(open_rc(dst), -ENOENT);
}

/* ------------------------------------------------------------ corrupt fixture copies */

static void flip_byte(const char *path, long off_from_end_or_start, int from_end)
{
	size_t n;
	char *b = check_slurp(path, &n);
	if (!b)
		return;
	size_t at = from_end ? n - (size_t)off_from_end_or_start : (size_t)off_from_end_or_start;
	b[at] ^= 0x5a;
	spit(path, b, n);
	free(b);
}

static void truncate_to(const char *path, long keep)
{
	CHECK_EQ_INT(truncate(path, keep), 0);
}

/* The single file in dir/d/ (the merged root's node file). */
static void only_d_file(const char *dir, char *out, size_t cap)
{
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "ls '%s/d' | head -1", dir);
	FILE *p = popen(cmd, "r");
	char name[128] = "";
	if (p) {
		if (!fgets(name, sizeof(name), p))
			name[0] = 0;
		pclose(p);
	}
	name[strcspn(name, "\n")] = 0;
	snprintf(out, cap, "%s/d/%s", dir, name);
}

static void expect_eio_logged(const char *dir, const char *file_in_log)
{
	char *log = NULL;
	CHECK_EQ_INT(open_rc_logged(dir, &log), -EIO);
	CHECK(log && strstr(log, file_in_log) != NULL);
	CHECK_EQ_INT(count_lines(log), 1);
	free(log);
}

static void test_corrupt_fixtures(void)
{
	char d[512], f[700];
	tmp_path(d, sizeof(d), "corrupt");
	const char *src = FIX "/std_ocdbt_zarr3";

	copy_tree(src, d);
	snprintf(f, sizeof(f), "%s/manifest.ocdbt", d);
	flip_byte(f, 1, 1); /* last byte: CRC */
	expect_eio_logged(d, f);

	copy_tree(src, d);
	flip_byte(f, 0, 0); /* magic */
	expect_eio_logged(d, f);

	copy_tree(src, d);
	flip_byte(f, 30, 0); /* inside the zstd body: CRC catches it */
	expect_eio_logged(d, f);

	copy_tree(src, d);
	truncate_to(f, 60);
	expect_eio_logged(d, f);

	copy_tree(src, d);
	truncate_to(f, 5);
	expect_eio_logged(d, f);

	copy_tree(src, d);
	only_d_file(d, f, sizeof(f));
	flip_byte(f, 2, 1);
	expect_eio_logged(d, f);

	copy_tree(src, d);
	only_d_file(d, f, sizeof(f));
	flip_byte(f, 1, 0);
	expect_eio_logged(d, f);

	copy_tree(src, d);
	only_d_file(d, f, sizeof(f));
	truncate_to(f, 20000);
	expect_eio_logged(d, f);

	copy_tree(src, d);
	only_d_file(d, f, sizeof(f));
	CHECK_EQ_INT(unlink(f), 0);
	expect_eio_logged(d, f);

	/* values out of line in ocdbt.process_0/d/<id>: a truncated value file
	 * does not fail open (nodes only), but size/read of those keys does */
	const char *v1 = FIX "/v1_pytree/state";
	copy_tree(v1, d);
	snprintf(f, sizeof(f), "%s/ocdbt.process_0/d/32affb36dfeb0d60a55e1777f4c97c6f", d);
	truncate_to(f, 100);
	ckpt_store *s = NULL;
	CHECK_EQ_INT(ckpt_store_ocdbt_open(d, &s), 0);
	if (s) {
		uint64_t sz = 0;
		uint8_t buf[2048];
		CHECK_EQ_INT(ckpt_store_size(s, "opt_state.mu.embedding/c/0/0", &sz), -EIO);
		CHECK_EQ_INT(ckpt_store_read(s, "opt_state.mu.embedding/c/0/0", 0, sizeof(buf), buf), -EIO);
		CHECK_EQ_INT(ckpt_store_size(s, "opt_state.mu.embedding/c/2/0", &sz), 0); /* inline */
		CHECK_EQ_INT(sz, 1022);
		CHECK_EQ_INT(ckpt_store_read(s, "opt_state.mu.embedding/c/2/0", 0, sizeof(buf), buf), 1022);
		CHECK_EQ_INT(ckpt_store_size(s, "nope", &sz), -ENOENT);
		CHECK_EQ_INT(ckpt_store_read(s, "nope", 0, 1, buf), -ENOENT);
		ckpt_store_destroy(s);
	}
	unlink(f);
	CHECK_EQ_INT(ckpt_store_ocdbt_open(d, &s), 0);
	if (s) {
		uint64_t sz;
		CHECK_EQ_INT(ckpt_store_size(s, "opt_state.mu.embedding/c/0/0", &sz), -EIO);
		ckpt_store_destroy(s);
	}
	run("rm -rf '%s'", d);
}

/* ------------------------------------------------------------ hand-built trees */

struct buf {
	uint8_t *p;
	size_t n, cap;
};

static void put(struct buf *b, const void *d, size_t n)
{
	if (b->n + n > b->cap) {
		b->cap = (b->n + n) * 2 + 64;
		b->p = realloc(b->p, b->cap);
	}
	memcpy(b->p + b->n, d, n);
	b->n += n;
}

static void put_u8(struct buf *b, uint8_t v)
{
	put(b, &v, 1);
}

static void put_var(struct buf *b, uint64_t v)
{
	do {
		uint8_t x = v & 0x7f;
		v >>= 7;
		put_u8(b, (uint8_t)(x | (v ? 0x80 : 0)));
	} while (v);
}

static void put_le64(struct buf *b, uint64_t v)
{
	uint8_t x[8];
	ckpt_put_le64(x, v);
	put(b, x, 8);
}

static void put_str(struct buf *b, const char *s)
{
	put(b, s, strlen(s));
}

/* Wrap body into an envelope (compression 0 raw, 1 zstd). */
static struct buf envelope(uint32_t magic, const struct buf *body, int zstd)
{
	struct buf out = { 0 };
	uint8_t m[4] = { (uint8_t)(magic >> 24), (uint8_t)(magic >> 16), (uint8_t)(magic >> 8),
			 (uint8_t)magic };
	put(&out, m, 4);
	put_le64(&out, 0);
	put_var(&out, 0);
	put_var(&out, (uint64_t)zstd);
	if (zstd) {
		size_t cap = ZSTD_compressBound(body->n);
		uint8_t *c = malloc(cap);
		size_t cn = ZSTD_compress(c, cap, body->p, body->n, 3);
		put(&out, c, cn);
		free(c);
	} else {
		put(&out, body->p, body->n);
	}
	put_le64(&out, 0); /* room for the CRC; trimmed below */
	out.n -= 4;
	ckpt_put_le64(out.p + 4, out.n);
	uint32_t crc = ckpt_crc32c(0, out.p, out.n - 4);
	ckpt_put_le32(out.p + out.n - 4, crc);
	return out;
}

/* Data file table with one file (base, rel), or none when rel is NULL. */
static void put_table(struct buf *b, const char *base, const char *rel)
{
	if (!rel) {
		put_var(b, 0);
		return;
	}
	put_var(b, 1);
	put_var(b, strlen(base) + strlen(rel));
	put_var(b, strlen(base));
	put_str(b, base);
	put_str(b, rel);
}

/* Manifest body: config + table(1 file) + one version + no version nodes. */
static struct buf manifest_body(uint64_t kind, uint64_t max_decoded, const char *rel, uint8_t height,
				uint64_t off, uint64_t len)
{
	struct buf b = { 0 };
	uint8_t uuid[16] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16 };
	put(&b, uuid, 16);
	put_var(&b, kind);
	put_var(&b, 1024);
	put_var(&b, max_decoded);
	put_u8(&b, 4);
	put_var(&b, 0); /* no compression */
	if (kind == 1 && !rel)
		return b; /* config-only manifest.ocdbt of a numbered database */
	put_table(&b, "", rel);
	put_var(&b, 1); /* one version */
	put_var(&b, 1);
	put_u8(&b, height);
	put_var(&b, 0);
	put_var(&b, off);
	put_var(&b, len);
	put_var(&b, 1);
	put_var(&b, len);
	put_var(&b, 0);
	put_le64(&b, 1700000000000000000ull);
	put_var(&b, 0); /* version nodes */
	return b;
}

/* Leaf with inline values vals[i] (the key text when vals is NULL). */
static struct buf leaf_body_kv(const char *const *keys, const char *const *vals, size_t n)
{
	struct buf b = { 0 };
	put_u8(&b, 0);
	put_table(&b, NULL, NULL);
	put_var(&b, n);
	for (size_t i = 1; i < n; i++)
		put_var(&b, 0); /* no prefix sharing */
	for (size_t i = 0; i < n; i++)
		put_var(&b, strlen(keys[i]));
	for (size_t i = 0; i < n; i++)
		put_str(&b, keys[i]);
	for (size_t i = 0; i < n; i++)
		put_var(&b, strlen(vals ? vals[i] : keys[i]));
	for (size_t i = 0; i < n; i++)
		put_u8(&b, 0);
	for (size_t i = 0; i < n; i++)
		put_str(&b, vals ? vals[i] : keys[i]);
	return b;
}

static struct buf leaf_body(const char *const *keys, size_t n)
{
	return leaf_body_kv(keys, NULL, n);
}

struct child {
	const char *key;
	uint64_t off, len;
};

/* Interior node of height h; every child lives in file rel. */
static struct buf interior_body(uint8_t h, const char *rel, const struct child *c, size_t n)
{
	struct buf b = { 0 };
	put_u8(&b, h);
	put_table(&b, "", rel);
	put_var(&b, n);
	for (size_t i = 1; i < n; i++)
		put_var(&b, 0);
	for (size_t i = 0; i < n; i++)
		put_var(&b, strlen(c[i].key));
	for (size_t i = 0; i < n; i++)
		put_var(&b, 0); /* subtree common prefix */
	for (size_t i = 0; i < n; i++)
		put_str(&b, c[i].key);
	for (size_t i = 0; i < n; i++)
		put_var(&b, 0);
	for (size_t i = 0; i < n; i++)
		put_var(&b, c[i].off);
	for (size_t i = 0; i < n; i++)
		put_var(&b, c[i].len);
	for (size_t i = 0; i < 3 * n; i++)
		put_var(&b, 1);
	return b;
}

static void write_db(const char *dir, const struct buf *manifest_env, const char *rel, const struct buf *data)
{
	char p[700];
	run("rm -rf '%s' && mkdir -p '%s/d'", dir, dir);
	snprintf(p, sizeof(p), "%s/manifest.ocdbt", dir);
	spit(p, manifest_env->p, manifest_env->n);
	if (rel && data) {
		snprintf(p, sizeof(p), "%s/%s", dir, rel);
		spit(p, data->p, data->n);
	}
}

static void bfree(struct buf *b)
{
	free(b->p);
	memset(b, 0, sizeof(*b));
}

/* Build a database: nodes[] are written back to back into d/x; the root is
 * node `root` with height h.  max_decoded as given. */
static int build_and_open(const char *dir, struct buf *nodes, size_t nn, size_t root, uint8_t h,
			  uint64_t max_decoded, int zstd)
{
	struct buf data = { 0 };
	uint64_t off[8] = { 0 }, len[8] = { 0 };
	for (size_t i = 0; i < nn; i++) {
		struct buf e = envelope(0x0cdb20de, &nodes[i], zstd);
		off[i] = data.n;
		len[i] = e.n;
		put(&data, e.p, e.n);
		bfree(&e);
	}
	struct buf mb = manifest_body(0, max_decoded, "d/x", h, off[root], len[root]);
	struct buf me = envelope(0x0cdb3a2a, &mb, 0);
	write_db(dir, &me, "d/x", &data);
	bfree(&mb);
	bfree(&me);
	bfree(&data);
	return open_rc(dir);
}

static void test_crafted(void)
{
	char d[512];
	tmp_path(d, sizeof(d), "crafted");
	static const char *const k2[] = { "a/.zarray", "a/0" };
	static const char *const k3[] = { "b/.zarray", "b/0" };

	/* sanity: the encoder builds valid leaves and interior trees */
	struct buf n[4];
	n[0] = leaf_body(k2, 2);
	CHECK_EQ_INT(build_and_open(d, n, 1, 0, 0, 100000000, 0), 0);
	CHECK_EQ_INT(build_and_open(d, n, 1, 0, 0, 100000000, 1), 0);
	n[1] = leaf_body(k3, 2);
	/* interior root (node 2) over leaves 0 and 1: offsets are known because
	 * raw envelopes of these bodies are 18 + body bytes */
	uint64_t l0 = 18 + n[0].n, l1 = 18 + n[1].n;
	struct child c[2] = { { "a/.zarray", 0, l0 }, { "b/.zarray", l0, l1 } };
	n[2] = interior_body(1, "d/x", c, 2);
	CHECK_EQ_INT(build_and_open(d, n, 3, 2, 1, 100000000, 0), 0);
	{
		ckpt_store *s;
		CHECK_EQ_INT(ckpt_store_ocdbt_open(d, &s), 0);
		struct keylist l = { 0 };
		ckpt_store_list(s, "", collect_cb, &l);
		CHECK_EQ_INT(l.n, 4);
		CHECK(l.n == 4 && !strcmp(l.k[0], "a/.zarray") && !strcmp(l.k[3], "b/0"));
		char v[16] = { 0 };
		CHECK_EQ_INT(ckpt_store_read(s, "b/0", 0, sizeof(v), v), 3);
		CHECK(!memcmp(v, "b/0", 3));
		CHECK_EQ_INT(ckpt_store_read(s, "b/.zarray", 2, 3, v), 3);
		CHECK(!memcmp(v, ".za", 3));
		CHECK_EQ_INT(ckpt_store_read(s, "b/.zarray", 9, 3, v), 0);
		keylist_free(&l);
		ckpt_store_destroy(s);
	}
	/* manifest says height 0 but the root is interior, and vice versa */
	CHECK_EQ_INT(build_and_open(d, n, 3, 2, 0, 100000000, 0), -EIO);
	CHECK_EQ_INT(build_and_open(d, n, 3, 0, 1, 100000000, 0), -EIO);
	/* interior keys out of order with their subtrees: bounds violated */
	struct child cs[2] = { { "a/.zarray", l0, l1 }, { "b/.zarray", 0, l0 } };
	bfree(&n[2]);
	n[2] = interior_body(1, "d/x", cs, 2);
	CHECK_EQ_INT(build_and_open(d, n, 3, 2, 1, 100000000, 0), -EIO);
	/* a DAG: both entries point at the same leaf -> keys repeat */
	struct child cd[2] = { { "a/.zarray", 0, l0 }, { "a/0", 0, l0 } };
	bfree(&n[2]);
	n[2] = interior_body(1, "d/x", cd, 2);
	CHECK_EQ_INT(build_and_open(d, n, 3, 2, 1, 100000000, 0), -EIO);
	/* a cycle: an interior node whose child is itself (node 2 at offset l0+l1;
	 * its length is found by iterating to a fixed point) */
	uint64_t self_len = 40;
	for (int it = 0; it < 4; it++) {
		struct child cc[1] = { { "a", l0 + l1, self_len } };
		bfree(&n[2]);
		n[2] = interior_body(1, "d/x", cc, 1);
		self_len = 18 + n[2].n;
	}
	CHECK_EQ_INT(build_and_open(d, n, 3, 2, 1, 100000000, 0), -EIO);
	/* a child at the same height as its parent: node 3 (height 1) points at
	 * the valid interior node 2 (height 1) */
	bfree(&n[2]);
	n[2] = interior_body(1, "d/x", c, 2);
	struct child c3[1] = { { "a/.zarray", l0 + l1, 18 + n[2].n } };
	n[3] = interior_body(1, "d/x", c3, 1);
	CHECK_EQ_INT(build_and_open(d, n, 4, 3, 1, 100000000, 0), -EIO);
	/* ... and the same node 3 claiming height 2 is a valid 3-level tree */
	bfree(&n[3]);
	n[3] = interior_body(2, "d/x", c3, 1);
	CHECK_EQ_INT(build_and_open(d, n, 4, 3, 2, 100000000, 0), 0);
	for (int i = 0; i < 4; i++)
		bfree(&n[i]);

	/* huge claimed lengths */
	struct buf lf = leaf_body(k2, 2);
	struct buf le = envelope(0x0cdb20de, &lf, 0);
	struct buf mb = manifest_body(0, 100000000, "d/x", 0, 0, (uint64_t)1 << 40);
	struct buf me = envelope(0x0cdb3a2a, &mb, 0);
	write_db(d, &me, "d/x", &le);
	char *log = NULL;
	CHECK_EQ_INT(open_rc_logged(d, &log), -EIO);
	CHECK(log && strstr(log, "/d/x") != NULL);
	free(log);
	bfree(&mb);
	bfree(&me);
	/* offset + length overflowing 64 bits */
	mb = manifest_body(0, 100000000, "d/x", 0, UINT64_MAX - 5, 100);
	me = envelope(0x0cdb3a2a, &mb, 0);
	write_db(d, &me, "d/x", &le);
	CHECK_EQ_INT(open_rc(d), -EIO);
	bfree(&mb);
	bfree(&me);
	bfree(&le);
	bfree(&lf);
	/* a node claiming 2^40 entries in a few bytes */
	struct buf big = { 0 };
	put_u8(&big, 0);
	put_var(&big, 0);
	put_var(&big, (uint64_t)1 << 40);
	put_var(&big, 1);
	CHECK_EQ_INT(build_and_open(d, &big, 1, 0, 0, 100000000, 0), -EIO);
	bfree(&big);
	/* counts within the maxima but larger than the bytes left: entries,
	 * data files */
	put_u8(&big, 0);
	put_var(&big, 0);
	put_var(&big, 1000);
	put_var(&big, 1);
	CHECK_EQ_INT(build_and_open(d, &big, 1, 0, 0, 100000000, 0), -EIO);
	bfree(&big);
	put_u8(&big, 0);
	put_var(&big, 500);
	put_var(&big, 1);
	CHECK_EQ_INT(build_and_open(d, &big, 1, 0, 0, 100000000, 0), -EIO);
	bfree(&big);
	/* a node claiming a key suffix of 1 GiB */
	put_u8(&big, 0);
	put_var(&big, 0);
	put_var(&big, 1);
	put_var(&big, (uint64_t)1 << 30);
	put_str(&big, "abc");
	CHECK_EQ_INT(build_and_open(d, &big, 1, 0, 0, 100000000, 0), -EIO);
	bfree(&big);
	/* a zstd bomb: 1 MiB of zeros compresses to a few bytes, over max_decoded */
	put_u8(&big, 0);
	put_var(&big, 0);
	put_var(&big, 1);
	put_var(&big, 1);
	put_str(&big, "k");
	put_var(&big, 1 << 20);
	put_u8(&big, 0);
	uint8_t *zeros = calloc(1, 1 << 20);
	put(&big, zeros, 1 << 20);
	free(zeros);
	CHECK_EQ_INT(build_and_open(d, &big, 1, 0, 0, 100000000, 1), 0); /* fine under the limit */
	CHECK_EQ_INT(build_and_open(d, &big, 1, 0, 0, 65536, 1), -EIO);
	CHECK_EQ_INT(build_and_open(d, &big, 1, 0, 0, 65536, 0), -EIO); /* raw body over the limit too */
	/* trailing bytes after the node body */
	bfree(&big);
	big = leaf_body(k2, 2);
	put_u8(&big, 0);
	CHECK_EQ_INT(build_and_open(d, &big, 1, 0, 0, 100000000, 0), -EIO);
	bfree(&big);
	/* keys not increasing inside a leaf */
	static const char *const kr[] = { "b", "a" };
	big = leaf_body(kr, 2);
	CHECK_EQ_INT(build_and_open(d, &big, 1, 0, 0, 100000000, 0), -EIO);
	bfree(&big);

	/* varint overflow in the manifest: 11 bytes, and 10 bytes > 64 bits */
	for (int variant = 0; variant < 2; variant++) {
		struct buf b = { 0 };
		uint8_t uuid[16] = { 0 };
		put(&b, uuid, 16);
		put_var(&b, 0);
		for (int i = 0; i < 9; i++)
			put_u8(&b, 0xff);
		put_u8(&b, variant ? 0x02 : 0xff);
		if (!variant)
			put_u8(&b, 0x01);
		put_var(&b, 1000);
		put_u8(&b, 4);
		put_var(&b, 0);
		put_var(&b, 0);
		put_var(&b, 0);
		put_var(&b, 0);
		struct buf e = envelope(0x0cdb3a2a, &b, 0);
		write_db(d, &e, NULL, NULL);
		CHECK_EQ_INT(open_rc(d), -EIO);
		bfree(&b);
		bfree(&e);
	}
	/* an empty database (root reference "missing") has no keys */
	mb = manifest_body(0, 100000000, "d/x", 0, UINT64_MAX, UINT64_MAX);
	me = envelope(0x0cdb3a2a, &mb, 0);
	write_db(d, &me, NULL, NULL);
	{
		ckpt_ocdbt *db;
		CHECK_EQ_INT(ckpt_ocdbt_open(d, &db), 0);
		if (db) {
			CHECK_EQ_INT(ckpt_ocdbt_count(db), 0);
			ckpt_ocdbt_close(db);
		}
	}
	bfree(&mb);
	bfree(&me);
	/* an empty data file path (TensorStore's entry for the empty tree of a
	 * first generation, kept in merged manifests of Orbax 0.4 / 0.5): fine
	 * while nothing is read from it ... */
	mb = manifest_body(0, 100000000, "", 0, UINT64_MAX, UINT64_MAX);
	me = envelope(0x0cdb3a2a, &mb, 0);
	write_db(d, &me, NULL, NULL);
	{
		ckpt_ocdbt *db;
		CHECK_EQ_INT(ckpt_ocdbt_open(d, &db), 0);
		if (db) {
			CHECK_EQ_INT(ckpt_ocdbt_count(db), 0);
			ckpt_ocdbt_close(db);
		}
	}
	bfree(&mb);
	bfree(&me);
	/* ... and refused where the root node would be read from it */
	lf = leaf_body(k2, 2);
	le = envelope(0x0cdb20de, &lf, 0);
	mb = manifest_body(0, 100000000, "", 0, 0, le.n);
	me = envelope(0x0cdb3a2a, &mb, 0);
	write_db(d, &me, NULL, NULL);
	CHECK_EQ_INT(open_rc(d), -EIO);
	bfree(&lf);
	bfree(&le);
	bfree(&mb);
	bfree(&me);
	/* a data file path escaping the folder */
	lf = leaf_body(k2, 2);
	le = envelope(0x0cdb20de, &lf, 0);
	mb = manifest_body(0, 100000000, "../x", 0, 0, le.n);
	me = envelope(0x0cdb3a2a, &mb, 0);
	write_db(d, &me, NULL, NULL);
	CHECK_EQ_INT(open_rc(d), -EIO);
	bfree(&mb);
	bfree(&me);

	/* numbered manifests: manifest.ocdbt holds the config only; the newest
	 * manifest.<16 hex> holds the versions */
	mb = manifest_body(1, 100000000, NULL, 0, 0, 0);
	me = envelope(0x0cdb3a2a, &mb, 0);
	write_db(d, &me, "d/x", &le);
	char p[700];
	struct buf nb = manifest_body(1, 100000000, "d/x", 0, 0, le.n);
	struct buf ne = envelope(0x0cdb3a2a, &nb, 0);
	snprintf(p, sizeof(p), "%s/manifest.0000000000000002", d);
	spit(p, ne.p, ne.n);
	snprintf(p, sizeof(p), "%s/manifest.0000000000000001", d);
	spit(p, "garbage", 7); /* older: never read */
	CHECK_EQ_INT(open_rc(d), 0);
	snprintf(p, sizeof(p), "%s/manifest.000000000000000a", d);
	spit(p, "garbage", 7); /* newest is corrupt -> -EIO */
	CHECK_EQ_INT(open_rc(d), -EIO);
	unlink(p);
	snprintf(p, sizeof(p), "%s/manifest.0000000000000002", d);
	unlink(p);
	snprintf(p, sizeof(p), "%s/manifest.0000000000000001", d);
	unlink(p);
	CHECK_EQ_INT(open_rc(d), -EIO); /* numbered kind without numbered files */
	bfree(&nb);
	bfree(&ne);
	bfree(&mb);
	bfree(&me);

	/* union precedence: process 9 beats process 10 (ids compare as
	 * numbers), keys of both appear once and in order */
	{
		static const char *const uk9[] = { "k", "only9" }, *const uv9[] = { "nine", "x" };
		static const char *const uk10[] = { "a10", "k" }, *const uv10[] = { "y", "ten" };
		char sub[700];
		run("rm -rf '%s' && mkdir -p '%s'", d, d);
		for (int which = 0; which < 2; which++) {
			struct buf lb = which ? leaf_body_kv(uk10, uv10, 2) : leaf_body_kv(uk9, uv9, 2);
			struct buf lenv = envelope(0x0cdb20de, &lb, 0);
			struct buf m = manifest_body(0, 100000000, "d/x", 0, 0, lenv.n);
			struct buf menv = envelope(0x0cdb3a2a, &m, 0);
			snprintf(sub, sizeof(sub), "%s/ocdbt.process_%s", d, which ? "10" : "9");
			write_db(sub, &menv, "d/x", &lenv);
			bfree(&lb);
			bfree(&lenv);
			bfree(&m);
			bfree(&menv);
		}
		ckpt_store *s;
		CHECK_EQ_INT(ckpt_store_ocdbt_open(d, &s), 0);
		if (s) {
			struct keylist l = { 0 };
			ckpt_store_list(s, "", collect_cb, &l);
			CHECK_EQ_INT(l.n, 3);
			CHECK(l.n == 3 && !strcmp(l.k[0], "a10") && !strcmp(l.k[1], "k") &&
			      !strcmp(l.k[2], "only9"));
			char v[8] = { 0 };
			CHECK_EQ_INT(ckpt_store_read(s, "k", 0, sizeof(v), v), 4);
			CHECK(!memcmp(v, "nine", 4));
			keylist_free(&l);
			ckpt_store_destroy(s);
		}
	}

	/* an out-of-line value past the end of its data file: open works,
	 * size/read fail with -EIO */
	struct buf ob = { 0 };
	put_u8(&ob, 0);
	put_table(&ob, "", "d/v");
	put_var(&ob, 2);
	put_var(&ob, 0);
	put_var(&ob, 1);
	put_var(&ob, 1);
	put_str(&ob, "ab");
	put_var(&ob, 4); /* a: 4 bytes at offset 0 (ok) */
	put_var(&ob, 100); /* b: 100 bytes at offset 2 (past the end) */
	put_u8(&ob, 1);
	put_u8(&ob, 1);
	put_var(&ob, 0);
	put_var(&ob, 0);
	put_var(&ob, 0);
	put_var(&ob, 2);
	struct buf oe = envelope(0x0cdb20de, &ob, 0);
	mb = manifest_body(0, 100000000, "d/x", 0, 0, oe.n);
	me = envelope(0x0cdb3a2a, &mb, 0);
	write_db(d, &me, "d/x", &oe);
	snprintf(p, sizeof(p), "%s/d/v", d);
	spit(p, "0123456789", 10);
	{
		ckpt_store *s;
		CHECK_EQ_INT(ckpt_store_ocdbt_open(d, &s), 0);
		uint64_t sz = 0;
		char v[128];
		CHECK_EQ_INT(ckpt_store_size(s, "a", &sz), 0);
		CHECK_EQ_INT(sz, 4);
		CHECK_EQ_INT(ckpt_store_read(s, "a", 1, 10, v), 3);
		CHECK(!memcmp(v, "123", 3));
		CHECK_EQ_INT(ckpt_store_size(s, "b", &sz), -EIO);
		CHECK_EQ_INT(ckpt_store_read(s, "b", 0, sizeof(v), v), -EIO);
		ckpt_store_destroy(s);
	}
	bfree(&ob);
	bfree(&oe);
	bfree(&mb);
	bfree(&me);
	bfree(&lf);
	bfree(&le);
	run("rm -rf '%s'", d);
}

/* ------------------------------------------------------------ generated trees */

static int have_python(void)
{
	return access(PY, X_OK) == 0 && run(PY " -c 'import json' >/dev/null 2>&1") == 0;
}

static int gen(const char *dir, const char *expect, const char *opts)
{
	return run(PY " '%s/scripts/gen_ocdbt.py' '%s' %s --expect '%s'", CKPT_SRCDIR, dir, opts, expect);
}

/* Value of element e (C order) of array i: arange + i. */
static float gen_value(const cJSON *arr, const char *chunk_key, uint64_t el, int zarr3)
{
	uint64_t shape[2], cs[2];
	json_ints(cJSON_GetObjectItemCaseSensitive(arr, "shape"), shape, 2);
	json_ints(cJSON_GetObjectItemCaseSensitive(arr, "chunks"), cs, 2);
	unsigned g0 = 0, g1 = 0;
	if (zarr3)
		sscanf(chunk_key, "c/%u/%u", &g0, &g1);
	else
		sscanf(chunk_key, "%u.%u", &g0, &g1);
	uint64_t r = el / cs[1], c = el % cs[1];
	double off = cJSON_GetObjectItemCaseSensitive(arr, "offset")->valuedouble;
	return (float)((double)((g0 * cs[0] + r) * shape[1] + g1 * cs[1] + c) + off);
}

/* Check a generated store against its expect sidecar; returns failures. */
static int check_generated(ckpt_store *s, const char *expect_path, int check_values)
{
	char *txt = check_slurp(expect_path, NULL);
	cJSON *doc = cJSON_Parse(txt);
	int bad = 0;
	if (!doc)
		return 1;
	int zarr3 = !strcmp(cJSON_GetObjectItemCaseSensitive(doc, "format")->valuestring, "zarr3");
	cJSON *keys = cJSON_GetObjectItemCaseSensitive(doc, "keys");
	struct keylist l = { 0 };
	ckpt_store_list(s, "", collect_cb, &l);
	if ((size_t)cJSON_GetArraySize(keys) != l.n)
		bad++;
	size_t i = 0;
	cJSON *k;
	cJSON_ArrayForEach(k, keys)
	{
		if (i >= l.n || strcmp(k->valuestring, l.k[i]) != 0) {
			bad++;
			break;
		}
		i++;
	}
	if (check_values) {
		cJSON *arrays = cJSON_GetObjectItemCaseSensitive(doc, "arrays");
		cJSON *a;
		cJSON_ArrayForEach(a, arrays)
		{
			cJSON *ck;
			cJSON_ArrayForEach(ck, cJSON_GetObjectItemCaseSensitive(a, "chunk_keys"))
			{
				uint8_t *v;
				size_t n;
				if (read_value(s, ck->valuestring, &v, &n)) {
					bad++;
					continue;
				}
				const char *local = strchr(ck->valuestring, '/') + 1;
				for (size_t e = 0; e < n / 4; e++) {
					float f;
					memcpy(&f, v + 4 * e, 4);
					if (f != gen_value(a, local, e, zarr3)) {
						bad++;
						break;
					}
				}
				/* a partial read in the middle agrees */
				if (n > 8) {
					uint8_t part[8];
					if (ckpt_store_read(s, ck->valuestring, n / 2, 8, part) != 8 ||
					    memcmp(part, v + n / 2, 8) != 0)
						bad++;
				}
				free(v);
			}
			cJSON *mk = cJSON_GetObjectItemCaseSensitive(a, "metadata_key");
			char *m;
			size_t ml;
			if (ckpt_store_read_all(s, mk->valuestring, 1 << 16, &m, &ml) == 0) {
				cJSON *mj = cJSON_Parse(m);
				if (!mj)
					bad++;
				cJSON_Delete(mj);
				free(m);
			} else {
				bad++;
			}
		}
	}
	keylist_free(&l);
	cJSON_Delete(doc);
	free(txt);
	return bad;
}

static int expected_height(const char *expect_path)
{
	char *txt = check_slurp(expect_path, NULL);
	cJSON *doc = cJSON_Parse(txt);
	int h = doc ? cJSON_GetObjectItemCaseSensitive(doc, "height")->valueint : -1;
	cJSON_Delete(doc);
	free(txt);
	return h;
}

static int count_cb(void *ctx, const char *key, uint64_t size)
{
	(void)key;
	(void)size;
	(*(size_t *)ctx)++;
	return 0;
}

static int stop_cb(void *ctx, const char *key, uint64_t size)
{
	(void)key;
	(void)size;
	return ++(*(size_t *)ctx) == 3 ? 42 : 0;
}

static void test_generated(void)
{
	char d[512], e[512];
	tmp_path(d, sizeof(d), "gen");
	tmp_path(e, sizeof(e), "gen.json");
	static const char *const variants[] = {
		/* 3+ levels, zarr2, large values out of line, leaves under
		 * ocdbt.process_0/ reached through base_path */
		"--arrays 30 --leaf-entries 4 --interior-entries 3 --zarr2 --large-every 7 "
		"--leaves-in-subdir",
		/* zarr3, zstd envelopes, values spread over 3 data files */
		"--arrays 40 --leaf-entries 5 --interior-entries 2 --zarr3 --large-every 3 --compress "
		"--value-files 3",
		/* one leaf (height 0) */
		"--arrays 5 --zarr3",
		/* height 1: one interior node over many leaves */
		"--arrays 50 --leaf-entries 7 --zarr2 --large-every 5",
		/* no merged root: union of 3 process databases (each its own tree) */
		"--arrays 25 --leaf-entries 3 --interior-entries 2 --zarr2 --large-every 4 --processes 3",
	};
	for (size_t v = 0; v < sizeof(variants) / sizeof(variants[0]); v++) {
		run("rm -rf '%s'", d);
		CHECK_EQ_INT(gen(d, e, variants[v]), 0);
		ckpt_store *s = NULL;
		int rc = ckpt_store_ocdbt_open(d, &s);
		CHECK_EQ_INT(rc, 0);
		if (rc) {
			fprintf(stderr, "  variant %zu: %s\n", v, variants[v]);
			continue;
		}
		int bad = check_generated(s, e, 1);
		if (bad)
			fprintf(stderr, "  variant %zu: %d mismatches\n", v, bad);
		CHECK_EQ_INT(bad, 0);
		ckpt_ocdbt *db;
		CHECK_EQ_INT(ckpt_ocdbt_open(d, &db), 0);
		if (db) {
			if (v == 4) /* union: the first database's height */
				CHECK(ckpt_ocdbt_height(db) >= 1);
			else
				CHECK_EQ_INT(ckpt_ocdbt_height(db), expected_height(e));
			if (v == 0)
				CHECK(ckpt_ocdbt_height(db) >= 2); /* at least 3 levels */
			ckpt_ocdbt_close(db);
		}
		/* prefix listing, early stop, absent keys */
		size_t cnt = 0;
		CHECK_EQ_INT(ckpt_store_list(s, "layer_000004.w/", count_cb, &cnt), 0);
		CHECK_EQ_INT(cnt, v == 4 ? 3 : 2); /* .zarray + 1 chunk, or 2 chunks when large */
		cnt = 0;
		CHECK_EQ_INT(ckpt_store_list(s, "layer_000004.w", count_cb, &cnt), 0);
		CHECK_EQ_INT(cnt, v == 4 ? 3 : 2);
		cnt = 0;
		CHECK_EQ_INT(ckpt_store_list(s, "zzz", count_cb, &cnt), 0);
		CHECK_EQ_INT(cnt, 0);
		cnt = 0;
		CHECK_EQ_INT(ckpt_store_list(s, "", stop_cb, &cnt), 42);
		CHECK_EQ_INT(cnt, 3);
		uint64_t sz;
		CHECK_EQ_INT(ckpt_store_size(s, "layer_000004.w", &sz), -ENOENT);
		CHECK_EQ_INT(ckpt_store_size(s, "layer_000004.w/", &sz), -ENOENT);
		ckpt_store_destroy(s);
	}
	run("rm -rf '%s' '%s'", d, e);
}

/* Many threads reading through a store whose values live in more data
 * files than the descriptor cache holds. */
struct thr {
	ckpt_store *s;
	cJSON *doc;
	unsigned seed;
	int bad;
};

static void *reader(void *arg)
{
	struct thr *t = arg;
	cJSON *ool = cJSON_GetObjectItemCaseSensitive(t->doc, "out_of_line");
	int n = cJSON_GetArraySize(ool);
	cJSON *arrays = cJSON_GetObjectItemCaseSensitive(t->doc, "arrays");
	for (int it = 0; it < 3000; it++) {
		t->seed = t->seed * 1103515245u + 12345u;
		const char *key = cJSON_GetArrayItem(ool, (int)((t->seed >> 8) % (unsigned)n))->valuestring;
		char name[64];
		snprintf(name, sizeof(name), "%.*s", (int)(strchr(key, '/') - key), key);
		cJSON *a = cJSON_GetObjectItemCaseSensitive(arrays, name);
		uint64_t sz;
		if (ckpt_store_size(t->s, key, &sz) || sz != 2048) {
			t->bad++;
			continue;
		}
		uint64_t el = (t->seed >> 4) % 512;
		float f;
		if (ckpt_store_read(t->s, key, el * 4, 4, &f) != 4 ||
		    f != gen_value(a, strchr(key, '/') + 1, el, 0))
			t->bad++;
		if (it % 500 == 0) {
			size_t cnt = 0;
			ckpt_store_list(t->s, "", count_cb, &cnt);
			if (cnt !=
			    (size_t)cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(t->doc, "keys")))
				t->bad++;
		}
	}
	return NULL;
}

static void test_concurrent(void)
{
	char d[512], e[512];
	tmp_path(d, sizeof(d), "conc");
	tmp_path(e, sizeof(e), "conc.json");
	CHECK_EQ_INT(gen(d, e, "--arrays 60 --leaf-entries 16 --zarr2 --large-every 1 --value-files 45"), 0);
	ckpt_store *s = NULL;
	CHECK_EQ_INT(ckpt_store_ocdbt_open(d, &s), 0);
	char *txt = check_slurp(e, NULL);
	cJSON *doc = cJSON_Parse(txt);
	if (s && doc) {
		struct thr t[4];
		pthread_t th[4];
		for (int i = 0; i < 4; i++) {
			t[i] = (struct thr){ s, doc, (unsigned)i * 7919u + 1, 0 };
			pthread_create(&th[i], NULL, reader, &t[i]);
		}
		int bad = 0;
		for (int i = 0; i < 4; i++) {
			pthread_join(th[i], NULL);
			bad += t[i].bad;
		}
		CHECK_EQ_INT(bad, 0);
		/* open descriptors stay bounded: count /proc/self/fd */
		size_t fds = 0;
		char path[64];
		for (int fd = 0; fd < 1024; fd++) {
			snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
			if (access(path, F_OK) == 0)
				fds++;
		}
		CHECK(fds < 3 + 32 + 8);
	}
	cJSON_Delete(doc);
	free(txt);
	ckpt_store_destroy(s);
	run("rm -rf '%s' '%s'", d, e);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void test_10k(void)
{
	char d[512], e[512];
	tmp_path(d, sizeof(d), "g10k");
	tmp_path(e, sizeof(e), "g10k.json");
	double t0 = now_s();
	CHECK_EQ_INT(gen(d, e, "--arrays 10000 --leaf-entries 256 --zarr3"), 0);
	double t1 = now_s();
	ckpt_store *s = NULL;
	CHECK_EQ_INT(ckpt_store_ocdbt_open(d, &s), 0);
	double t2 = now_s();
	size_t cnt = 0;
	if (s)
		CHECK_EQ_INT(ckpt_store_list(s, "", count_cb, &cnt), 0);
	double t3 = now_s();
	CHECK_EQ_INT(cnt, 20000);
	if (s) {
		CHECK_EQ_INT(check_generated(s, e, 0), 0);
		uint64_t sz;
		double t4 = now_s();
		for (int i = 0; i < 10000; i++) {
			char k[64];
			snprintf(k, sizeof(k), "layer_%06d.w/zarr.json", i);
			if (ckpt_store_size(s, k, &sz))
				CHECK(0);
		}
		double t5 = now_s();
		printf("10k arrays (20000 keys): generate %.2f s; open %.1f ms; list all %.2f ms; 10000 "
		       "lookups %.2f ms\n",
		       t1 - t0, (t2 - t1) * 1e3, (t3 - t2) * 1e3, (t5 - t4) * 1e3);
	}
	ckpt_store_destroy(s);
	run("rm -rf '%s' '%s'", d, e);
}

/* ------------------------------------------------------------ node prefetch on a pool */

/* A store over another that records which threads read through it and
 * answers 8 connections (so that OCDBT prefetches sibling nodes). */
struct spy_store {
	struct fwd_store f;
	pthread_mutex_t mu;
	long tids[256];
	int n;
};

static ssize_t spy_read(ckpt_store *s, const char *key, uint64_t off, size_t len, void *dst)
{
	struct spy_store *p = (struct spy_store *)s;
	pthread_mutex_lock(&p->mu);
	if (p->n < 256)
		p->tids[p->n++] = (long)syscall(SYS_gettid);
	pthread_mutex_unlock(&p->mu);
	return fwd_read(s, key, off, len, dst);
}

static unsigned spy_connections(ckpt_store *s)
{
	(void)s;
	return 8;
}

static void spy_destroy(ckpt_store *s)
{
	struct spy_store *p = (struct spy_store *)s;
	ckpt_store_destroy(p->f.in);
	pthread_mutex_destroy(&p->mu);
	free(p->f.base.root);
	free(p);
}

static const struct ckpt_store_ops spy_ops = {
	.size = fwd_size,
	.read = spy_read,
	.list = fwd_list,
	.listdir = fwd_listdir,
	.stat = fwd_stat,
	.destroy = spy_destroy,
	.connections = spy_connections,
};

static struct spy_store *spy_open(const char *dir)
{
	struct spy_store *p = calloc(1, sizeof(*p));
	p->f.base.ops = &spy_ops;
	p->f.base.root = strdup("spy");
	pthread_mutex_init(&p->mu, NULL);
	CHECK_EQ_INT(ckpt_store_dir_open(dir, &p->f.in), 0);
	return p;
}

/* Threads of this process now. */
static int task_ids(long *out, int cap)
{
	DIR *d = opendir("/proc/self/task");
	int n = 0;
	for (struct dirent *e; d && (e = readdir(d)) != NULL;)
		if (e->d_name[0] != '.' && n < cap)
			out[n++] = atol(e->d_name);
	if (d)
		closedir(d);
	return n;
}

struct blocker {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int go;
};

static void block_task(void *arg)
{
	struct blocker *b = arg;
	pthread_mutex_lock(&b->mu);
	while (!b->go)
		pthread_cond_wait(&b->cv, &b->mu);
	pthread_mutex_unlock(&b->mu);
}

static void test_pool_prefetch(void)
{
	char d[512];
	tmp_path(d, sizeof(d), "prefetch");
	static const char *const ka[] = { "a/.zarray", "a/0" }, *const kb[] = { "b/.zarray", "b/0" };
	static const char *const kc[] = { "c/.zarray", "c/0" }, *const kd[] = { "d/.zarray", "d/0" };
	struct buf n[5] = { leaf_body(ka, 2), leaf_body(kb, 2), leaf_body(kc, 2), leaf_body(kd, 2) };
	struct child c[4];
	uint64_t off = 0;
	const char *first[] = { "a/.zarray", "b/.zarray", "c/.zarray", "d/.zarray" };
	for (int i = 0; i < 4; i++) {
		c[i] = (struct child){ first[i], off, 18 + n[i].n };
		off += 18 + n[i].n;
	}
	n[4] = interior_body(1, "d/x", c, 4); /* an interior root over four leaves */
	CHECK_EQ_INT(build_and_open(d, n, 5, 4, 1, 100000000, 0), 0);
	for (int i = 0; i < 5; i++)
		bfree(&n[i]);

	/* every node is read by this thread or by a thread of the pool given:
	 * no thread is started for the open */
	ckpt_pool *pool;
	CHECK_EQ_INT(ckpt_pool_create(3, 64, &pool), 0);
	long before[256];
	int nb = task_ids(before, 256);
	for (int round = 0; round < 20; round++) {
		struct spy_store *spy = spy_open(d);
		ckpt_store *o = NULL;
		CHECK_EQ_INT(ckpt_store_ocdbt_open_pool(&spy->f.base, "", pool, &o), 0);
		uint64_t sz = 0;
		CHECK_EQ_INT(ckpt_store_size(o, "d/0", &sz), 0);
		CHECK_EQ_INT(sz, 3);
		CHECK(spy->n >= 6); /* manifest, root, four leaves */
		for (int i = 0; i < spy->n; i++) {
			int known = 0;
			for (int k = 0; k < nb; k++)
				known |= spy->tids[i] == before[k];
			if (!known) {
				CHECK(known);
				break;
			}
		}
		ckpt_store_destroy(o);
		ckpt_store_destroy(&spy->f.base);
	}

	/* a pool whose only worker is busy (a decode pool's tasks, or the very
	 * thread opening): the opening thread fetches the nodes itself */
	ckpt_pool *one;
	CHECK_EQ_INT(ckpt_pool_create(1, 64, &one), 0);
	struct blocker bl = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0 };
	CHECK_EQ_INT(ckpt_pool_submit(one, block_task, &bl), 0);
	alarm(20);
	struct spy_store *spy = spy_open(d);
	ckpt_store *o = NULL;
	CHECK_EQ_INT(ckpt_store_ocdbt_open_pool(&spy->f.base, "", one, &o), 0);
	long me = (long)syscall(SYS_gettid);
	for (int i = 0; i < spy->n; i++)
		CHECK(spy->tids[i] == me);
	alarm(0);
	ckpt_store_destroy(o);
	ckpt_store_destroy(&spy->f.base);
	pthread_mutex_lock(&bl.mu);
	bl.go = 1;
	pthread_cond_broadcast(&bl.cv);
	pthread_mutex_unlock(&bl.mu);
	ckpt_pool_destroy(one); /* runs the batch's stale tasks: they find their jobs taken */
	ckpt_pool_destroy(pool);
	run("rm -rf '%s'", d);
}

/* ------------------------------------------------------------ fuzz entry */

static void test_fuzz_entry(void)
{
	size_t n;
	char *m = check_slurp(FIX "/std_ocdbt_zarr3/manifest.ocdbt", &n);
	CHECK(m != NULL);
	if (m) {
		CHECK_EQ_INT(ckpt_ocdbt_fuzz_parse((const uint8_t *)m, n), 0);
		m[n - 1] ^= 1; /* CRC repaired by the second pass */
		CHECK_EQ_INT(ckpt_ocdbt_fuzz_parse((const uint8_t *)m, n), 0);
		CHECK_EQ_INT(ckpt_ocdbt_fuzz_parse((const uint8_t *)m, 3), -EIO);
		free(m);
	}
	m = check_slurp(FIX "/std_ocdbt_zarr3/d/216253d3f7703882ab744fdab31b6dc3", &n);
	if (m) {
		CHECK_EQ_INT(ckpt_ocdbt_fuzz_parse((const uint8_t *)m, n), 0);
		free(m);
	}
	CHECK_EQ_INT(ckpt_ocdbt_fuzz_parse((const uint8_t *)"", 0), -EIO);
}

int main(void)
{
	snprintf(tmp_root, sizeof(tmp_root), "/tmp/test_ocdbt.XXXXXX");
	if (!mkdtemp(tmp_root)) {
		perror("mkdtemp");
		return 1;
	}
	CHECK_RUN(test_fixtures);
	CHECK_RUN_CALL(test_union_fixture, (FIX "/std_ocdbt_zarr3", "union_std"));
	CHECK_RUN_CALL(test_union_fixture, (FIX "/v1_pytree/state", "union_v1"));
	CHECK_RUN(test_corrupt_fixtures);
	CHECK_RUN(test_crafted);
	CHECK_RUN(test_pool_prefetch);
	CHECK_RUN(test_fuzz_entry);
	if (have_python()) {
		CHECK_RUN(test_generated);
		CHECK_RUN(test_concurrent);
		CHECK_RUN(test_10k);
	} else {
		printf("SKIP generated-tree tests: %s not usable\n", PY);
	}
	run("rm -rf '%s'", tmp_root);
	return CHECK_DONE();
}
