/*
 * ckpt_bench - the C half of scripts/bench.  It links libckpt so that the
 * in-process numbers go through the same code path as the daemon.
 *
 *   ckpt_bench gen SPEC OUTDIR [-t THREADS] [-l LEVEL] [-s SEED]
 *       Write an Orbax item folder (use_zarr3, no OCDBT) like
 *       StandardCheckpointer.save(OUTDIR) would: _METADATA,
 *       _CHECKPOINT_METADATA, commit_success.txt and per array
 *       <param>/zarr.json + <param>/c/i/j shard files (sharding_indexed,
 *       one inner chunk per shard, bytes little + zstd, index bytes +
 *       crc32c at the end).  Values are random normal (float32, or
 *       bfloat16 = the top 16 bits of a float32).  SPEC has one array per
 *       line: `key/path dtype 8192x8192 1024x8192` (dtype bfloat16 or
 *       float32; '#' starts a comment).  Shards are generated and
 *       compressed on THREADS threads.
 *
 *   ckpt_bench decode ITEMDIR [-t THREADS] [-m unit|array] [-k TOPKEY] [-o N] [-H]
 *       Decode every chunk of every array of the item (those under pytree
 *       key TOPKEY only, with -k).  unit: ckpt_zarr_read_unit on THREADS
 *       threads of our own, each into one reused pre-faulted buffer (the
 *       decode limit); -o N: into N such buffers in turn, -o 0: each chunk
 *       into a fresh mapping (memory never touched before, as a loader
 *       allocating the arrays it returns); the buffers are made before the
 *       clock starts.  array: one ckpt_array_read of each whole array
 *       through a read context with THREADS decode threads (the daemon's
 *       cache + pool code path).  -H prints a hash of each array's C-order
 *       bytes (array mode; not timed).  The folder may be an OCDBT item.
 *
 *   ckpt_bench read [-b BYTES] [-P PROCS] [-H] FILE...
 *       PROCS processes read the files with read(2) of BYTES (default
 *       1 MiB) into a reused buffer; files are dealt to processes keeping
 *       their order, balanced by size.  Timed from a common start (after
 *       fork) to the last exit.  -H also hashes each .npy's data bytes.
 *
 *   ckpt_bench vread SOURCE PATH [-c CACHE_MIB] [-t THREADS] [-b BYTES] [-o OUT]
 *       The daemon's work for one file of a mount, without FUSE or a
 *       reader: open a view of SOURCE (shipped recipes found as the
 *       daemon finds them), look PATH up from the root (e.g.
 *       30/.views/NAME/model.safetensors or 30/items/params.safetensors)
 *       and read it front to back in BYTES pieces (default 1 MiB, the
 *       mount's requests), zero-copy where the daemon replies zero-copy;
 *       each piece is then copied once into a reused buffer, as the
 *       kernel copies a reply.  Prints the seconds, the process CPU
 *       seconds and the decode counters.  -o writes the bytes read to
 *       OUT (after the clock; tests compare them with the mount's).
 *
 *   ckpt_bench wlimit OUTFILE [-t THREADS] [-l LEVEL] [-c CHUNK] FILE...
 *       The write-path limit: load FILEs into memory, compress them in
 *       CHUNK pieces (default 4 MiB) with zstd LEVEL (default 1) on
 *       THREADS threads; then write the compressed bytes to OUTFILE and
 *       fsync it (OUTFILE is removed afterwards).
 *
 * Every subcommand prints one JSON object on stdout.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <zstd.h>

/* The public header, then the library internals this benchmark measures
 * directly (decode without the daemon, read contexts, the metadata model). */
#include "ckpt.h"
#include "base/crc32c.h"
#include "base/stats.h"
#include "format/zarr_meta.h"
#include "read/array.h"
#include "read/zarr_chunk.h"
#include "store/store.h"

#define MAX_RANK 8
#define MIB (1024.0 * 1024.0)

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void die(const char *fmt, const char *arg)
{
	fprintf(stderr, "ckpt_bench: ");
	fprintf(stderr, fmt, arg);
	fprintf(stderr, "\n");
	exit(1);
}

/* Allocate and touch every page once, so that timed loops never fault. */
static void *alloc_touched(size_t n)
{
	void *p = NULL;
	if (n == 0)
		n = 1;
	if (posix_memalign(&p, 4096, n) != 0)
		die("out of memory (%s)", "alloc");
	madvise(p, n, MADV_HUGEPAGE);
	memset(p, 0, n);
	return p;
}

/* ---- order-dependent 64-bit hash over a byte stream --------------------- */

typedef struct hasher {
	uint64_t h;
	uint8_t tail[8];
	int ntail;
} hasher;

static void hash_init(hasher *x)
{
	x->h = 0xcbf29ce484222325ull;
	x->ntail = 0;
}

static inline uint64_t mix_word(uint64_t h, uint64_t w)
{
	h ^= w;
	h *= 0x100000001b3ull;
	return h ^ (h >> 29);
}

static void hash_feed(hasher *x, const uint8_t *p, size_t n)
{
	while (n && x->ntail) {
		x->tail[x->ntail++] = *p++;
		n--;
		if (x->ntail == 8) {
			uint64_t w;
			memcpy(&w, x->tail, 8);
			x->h = mix_word(x->h, w);
			x->ntail = 0;
		}
	}
	uint64_t h = x->h;
	while (n >= 8) {
		uint64_t w;
		memcpy(&w, p, 8);
		h = mix_word(h, w);
		p += 8;
		n -= 8;
	}
	x->h = h;
	while (n--)
		x->tail[x->ntail++] = *p++;
}

static uint64_t hash_done(hasher *x)
{
	uint64_t h = x->h;
	for (int i = 0; i < x->ntail; i++)
		h = mix_word(h, x->tail[i] | 0x100u);
	return h;
}

/* ---- random normal values ------------------------------------------------ */

/* Quantiles q[i] = Phi^-1(i / 2^16), i = 1 .. 2^16 - 1, with the two ends
 * set at the 1e-7 tails; a value is a uniform point between two adjacent
 * quantiles, which is a normal sample up to a 2^-16 resolution in
 * probability, with a continuous (full-entropy) mantissa. */
#define QBITS 16
#define QN (1u << QBITS)
static float qtab[QN + 1];

static double phi(double x)
{
	return 0.5 * erfc(-x / sqrt(2.0));
}

static double inv_phi(double p)
{
	double lo = -9.0, hi = 9.0;
	for (int i = 0; i < 64; i++) {
		double mid = 0.5 * (lo + hi);
		if (phi(mid) < p)
			lo = mid;
		else
			hi = mid;
	}
	return 0.5 * (lo + hi);
}

static void qtab_init(void)
{
	for (unsigned i = 1; i < QN; i++)
		qtab[i] = (float)inv_phi((double)i / QN);
	qtab[0] = (float)inv_phi(1e-7);
	qtab[QN] = -qtab[0];
}

typedef struct rng {
	uint64_t s[4];
} rng;

static uint64_t splitmix(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static void rng_seed(rng *r, uint64_t seed)
{
	for (int i = 0; i < 4; i++)
		r->s[i] = splitmix(&seed);
}

static inline uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

/* xoshiro256+ step */
static inline uint64_t rng_next(rng *r)
{
	uint64_t *s = r->s;
	uint64_t res = s[0] + s[3];
	uint64_t t = s[1] << 17;
	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return res;
}

static inline float rng_normal(rng *r)
{
	uint64_t u = rng_next(r);
	uint32_t i = (uint32_t)(u >> (64 - QBITS));
	float f = (float)((u >> 16) & 0xffffffu) * (1.0f / 16777216.0f);
	return qtab[i] + f * (qtab[i + 1] - qtab[i]);
}

static void fill_normal(rng *r, ckpt_dtype dt, void *dst, uint64_t nelem)
{
	if (dt == CKPT_DT_FLOAT32) {
		float *o = dst;
		for (uint64_t i = 0; i < nelem; i++)
			o[i] = rng_normal(r);
	} else {
		uint16_t *o = dst;
		for (uint64_t i = 0; i < nelem; i++) {
			float f = rng_normal(r);
			uint32_t b;
			memcpy(&b, &f, 4);
			o[i] = (uint16_t)(b >> 16);
		}
	}
}

/* ---- gen --------------------------------------------------------------- */

typedef struct garray {
	char *keys[16];
	int depth;
	char name[512]; /* param name: keys joined with '.' */
	ckpt_dtype dtype;
	unsigned itemsize;
	int rank;
	uint64_t shape[MAX_RANK], chunk[MAX_RANK], grid[MAX_RANK];
	uint64_t nshards, chunk_bytes;
	atomic_uint_least64_t stored;
} garray;

typedef struct gen_job {
	garray *arr;
	int narr;
	uint64_t *task_arr; /* per task: array index */
	uint64_t *task_shard; /* per task: linear shard index */
	uint64_t ntasks;
	atomic_uint_least64_t next;
	const char *out;
	int level;
	uint64_t seed;
	uint64_t max_chunk;
	atomic_int failed;
} gen_job;

static int parse_dims(const char *s, uint64_t *out)
{
	int n = 0;
	while (*s) {
		if (n == MAX_RANK)
			return -1;
		char *end;
		unsigned long long v = strtoull(s, &end, 10);
		if (end == s || v == 0)
			return -1;
		out[n++] = v;
		s = end;
		if (*s == 'x')
			s++;
		else if (*s)
			return -1;
	}
	return n;
}

static void mkdirs(const char *path)
{
	char buf[4096];
	snprintf(buf, sizeof(buf), "%s", path);
	for (char *p = buf + 1; *p; p++) {
		if (*p == '/') {
			*p = 0;
			mkdir(buf, 0755);
			*p = '/';
		}
	}
	mkdir(buf, 0755);
}

static void write_file(const char *path, const void *data, size_t n)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0)
		die("cannot create %s", path);
	const uint8_t *p = data;
	while (n) {
		ssize_t w = write(fd, p, n);
		if (w <= 0)
			die("write to %s failed", path);
		p += w;
		n -= (size_t)w;
	}
	close(fd);
}

static void dims_json(char *buf, size_t cap, int rank, const uint64_t *d)
{
	size_t o = (size_t)snprintf(buf, cap, "[");
	for (int i = 0; i < rank; i++)
		o += (size_t)snprintf(buf + o, cap - o, "%s%llu", i ? "," : "", (unsigned long long)d[i]);
	snprintf(buf + o, cap - o, "]");
}

static void *gen_worker(void *arg)
{
	gen_job *j = arg;
	uint8_t *raw = alloc_touched(j->max_chunk);
	size_t ccap = ZSTD_compressBound(j->max_chunk) + 20;
	uint8_t *comp = alloc_touched(ccap);
	ZSTD_CCtx *cc = ZSTD_createCCtx();
	char path[4096];
	for (;;) {
		uint64_t t = atomic_fetch_add(&j->next, 1);
		if (t >= j->ntasks)
			break;
		garray *a = &j->arr[j->task_arr[t]];
		uint64_t s = j->task_shard[t];
		rng r;
		rng_seed(&r, j->seed ^ (j->task_arr[t] * 0x9e3779b97f4a7c15ull) ^ (s << 32) ^ s);
		fill_normal(&r, a->dtype, raw, a->chunk_bytes / a->itemsize);
		size_t cn = ZSTD_compressCCtx(cc, comp, ccap - 20, raw, a->chunk_bytes, j->level);
		if (ZSTD_isError(cn)) {
			atomic_store(&j->failed, 1);
			break;
		}
		/* shard index at the end: (offset, nbytes) of the one inner chunk + crc32c */
		ckpt_put_le64(comp + cn, 0);
		ckpt_put_le64(comp + cn + 8, cn);
		ckpt_put_le32(comp + cn + 16, ckpt_crc32c(0, comp + cn, 16));
		/* key c/i/j of the shard (C order over the shard grid) */
		uint64_t g[MAX_RANK], rem = s;
		for (int d = a->rank - 1; d >= 0; d--) {
			g[d] = rem % a->grid[d];
			rem /= a->grid[d];
		}
		size_t o = (size_t)snprintf(path, sizeof(path), "%s/%s/c", j->out, a->name);
		for (int d = 0; d < a->rank - 1; d++)
			o += (size_t)snprintf(path + o, sizeof(path) - o, "/%llu", (unsigned long long)g[d]);
		mkdirs(path);
		snprintf(path + o, sizeof(path) - o, "/%llu", (unsigned long long)g[a->rank - 1]);
		write_file(path, comp, cn + 20);
		atomic_fetch_add(&a->stored, cn + 20);
	}
	ZSTD_freeCCtx(cc);
	free(raw);
	free(comp);
	return NULL;
}

static int cmd_gen(int argc, char **argv)
{
	int threads = 2, level = 3;
	uint64_t seed = 1;
	int opt;
	while ((opt = getopt(argc, argv, "t:l:s:")) != -1) {
		if (opt == 't')
			threads = atoi(optarg);
		else if (opt == 'l')
			level = atoi(optarg);
		else if (opt == 's')
			seed = strtoull(optarg, NULL, 10);
		else
			return 2;
	}
	if (argc - optind != 2)
		die("usage: %s", "gen SPEC OUTDIR [-t THREADS] [-l LEVEL] [-s SEED]");
	const char *spec = argv[optind], *out = argv[optind + 1];
	FILE *f = fopen(spec, "r");
	if (!f)
		die("cannot open %s", spec);
	garray *arr = calloc(4096, sizeof(*arr));
	int narr = 0;
	char line[1024];
	while (fgets(line, sizeof(line), f)) {
		char *h = strchr(line, '#');
		if (h)
			*h = 0;
		char kp[512], dt[64], sh[128], ch[128];
		if (sscanf(line, "%511s %63s %127s %127s", kp, dt, sh, ch) != 4)
			continue;
		if (narr == 4096)
			die("too many arrays in %s", spec);
		garray *a = &arr[narr++];
		a->dtype = ckpt_dtype_from_name(dt);
		if (a->dtype != CKPT_DT_FLOAT32 && a->dtype != CKPT_DT_BFLOAT16)
			die("dtype %s: only float32 and bfloat16", dt);
		a->itemsize = ckpt_dtype_get(a->dtype)->itemsize;
		a->rank = parse_dims(sh, a->shape);
		if (a->rank < 1 || parse_dims(ch, a->chunk) != a->rank)
			die("bad shape/chunk in line: %s", line);
		a->nshards = 1;
		a->chunk_bytes = a->itemsize;
		for (int d = 0; d < a->rank; d++) {
			if (a->shape[d] % a->chunk[d])
				die("chunk must divide shape: %s", line);
			a->grid[d] = a->shape[d] / a->chunk[d];
			a->nshards *= a->grid[d];
			a->chunk_bytes *= a->chunk[d];
		}
		char *save = NULL;
		size_t o = 0;
		for (char *k = strtok_r(kp, "/", &save); k; k = strtok_r(NULL, "/", &save)) {
			if (a->depth == 16)
				die("key path too deep: %s", line);
			a->keys[a->depth++] = strdup(k);
			o += (size_t)snprintf(a->name + o, sizeof(a->name) - o, "%s%s", o ? "." : "", k);
		}
	}
	fclose(f);
	if (!narr)
		die("no arrays in %s", spec);
	qtab_init();
	mkdirs(out);

	gen_job j = { .arr = arr, .narr = narr, .out = out, .level = level, .seed = seed };
	for (int i = 0; i < narr; i++) {
		j.ntasks += arr[i].nshards;
		if (arr[i].chunk_bytes > j.max_chunk)
			j.max_chunk = arr[i].chunk_bytes;
	}
	j.task_arr = malloc(j.ntasks * sizeof(uint64_t));
	j.task_shard = malloc(j.ntasks * sizeof(uint64_t));
	uint64_t t = 0;
	for (int i = 0; i < narr; i++)
		for (uint64_t s = 0; s < arr[i].nshards; s++, t++) {
			j.task_arr[t] = (uint64_t)i;
			j.task_shard[t] = s;
		}

	/* metadata first (zarr.json per array, _METADATA, _CHECKPOINT_METADATA) */
	char path[4096], a1[256];
	size_t mcap = 1024 + (size_t)narr * 1024, mo = 0;
	char *meta = malloc(mcap);
	mo += (size_t)snprintf(meta + mo, mcap - mo, "{\"tree_metadata\": {");
	for (int i = 0; i < narr; i++) {
		garray *a = &arr[i];
		snprintf(path, sizeof(path), "%s/%s", out, a->name);
		mkdirs(path);
		dims_json(a1, sizeof(a1), a->rank, a->chunk);
		/* zarr.json: one inner chunk per shard, zstd frames without checksums */
		struct ckpt_zarr_meta zm;
		if (ckpt_zarr_meta_init_sharded_zstd(&zm, a->dtype, a->rank, a->shape, a->chunk, a->chunk,
						     level))
			die("zarr metadata for %s", a->name);
		zm.codecs.a2b.sharding->codecs.b2b[0].checksum = 0;
		char *zj = ckpt_zarr_meta_emit(&zm);
		ckpt_zarr_meta_free(&zm);
		if (!zj)
			die("zarr metadata for %s", a->name);
		snprintf(path, sizeof(path), "%s/%s/zarr.json", out, a->name);
		write_file(path, zj, strlen(zj));
		free(zj);
		/* "('params', 'embed', 'embedding')": {key_metadata, value_metadata} */
		mo += (size_t)snprintf(meta + mo, mcap - mo, "%s\"(", i ? ", " : "");
		for (int k = 0; k < a->depth; k++)
			mo += (size_t)snprintf(meta + mo, mcap - mo, "%s'%s'", k ? ", " : "", a->keys[k]);
		mo += (size_t)snprintf(meta + mo, mcap - mo, "%s)\": {\"key_metadata\": [",
				       a->depth == 1 ? "," : "");
		for (int k = 0; k < a->depth; k++)
			mo += (size_t)snprintf(meta + mo, mcap - mo, "%s{\"key\": \"%s\", \"key_type\": 2}",
					       k ? ", " : "", a->keys[k]);
		mo += (size_t)snprintf(
			meta + mo, mcap - mo,
			"], \"value_metadata\": {\"value_type\": \"jax.Array\", \"skip_deserialize\": false, "
			"\"write_shape\": %s}}",
			a1);
	}
	mo += (size_t)snprintf(
		meta + mo, mcap - mo,
		"}, \"use_ocdbt\": false, \"use_zarr3\": true, \"store_array_data_equal_to_fill_value\": "
		"true, \"custom_metadata\": null}");
	snprintf(path, sizeof(path), "%s/_METADATA", out);
	write_file(path, meta, mo);
	free(meta);

	double t0 = now_s();
	pthread_t th[64];
	if (threads < 1 || threads > 64)
		threads = 2;
	for (int i = 0; i < threads; i++)
		pthread_create(&th[i], NULL, gen_worker, &j);
	for (int i = 0; i < threads; i++)
		pthread_join(th[i], NULL);
	double secs = now_s() - t0;
	if (atomic_load(&j.failed))
		die("compression failed (%s)", out);

	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	unsigned long long ns =
		(unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
	char cm[1024];
	int n = snprintf(
		cm, sizeof(cm),
		"{\"item_handlers\": \"orbax.checkpoint._src.handlers.pytree_checkpoint_handler."
		"PyTreeCheckpointHandler\", \"metrics\": {}, \"performance_metrics\": {}, "
		"\"init_timestamp_nsecs\": %llu, \"commit_timestamp_nsecs\": %llu, \"custom_metadata\": {}}",
		ns - 1000000, ns);
	snprintf(path, sizeof(path), "%s/_CHECKPOINT_METADATA", out);
	write_file(path, cm, (size_t)n);
	n = snprintf(cm, sizeof(cm), "Checkpoint commit was successful to %s", out);
	snprintf(path, sizeof(path), "%s/commit_success.txt", out);
	write_file(path, cm, (size_t)n);

	/* summary, with totals per top-level pytree key */
	cJSON *root = cJSON_CreateObject(), *tops = cJSON_CreateObject(), *list = cJSON_CreateArray();
	uint64_t raw = 0, stored = 0;
	for (int i = 0; i < narr; i++) {
		garray *a = &arr[i];
		uint64_t nb = a->chunk_bytes * a->nshards, st = atomic_load(&a->stored);
		raw += nb;
		stored += st;
		cJSON *tk = cJSON_GetObjectItem(tops, a->keys[0]);
		if (!tk) {
			tk = cJSON_AddObjectToObject(tops, a->keys[0]);
			cJSON_AddNumberToObject(tk, "raw_bytes", 0);
			cJSON_AddNumberToObject(tk, "stored_bytes", 0);
			cJSON_AddNumberToObject(tk, "arrays", 0);
		}
		cJSON_SetNumberValue(cJSON_GetObjectItem(tk, "raw_bytes"),
				     cJSON_GetObjectItem(tk, "raw_bytes")->valuedouble + (double)nb);
		cJSON_SetNumberValue(cJSON_GetObjectItem(tk, "stored_bytes"),
				     cJSON_GetObjectItem(tk, "stored_bytes")->valuedouble + (double)st);
		cJSON_SetNumberValue(cJSON_GetObjectItem(tk, "arrays"),
				     cJSON_GetObjectItem(tk, "arrays")->valuedouble + 1);
		cJSON *e = cJSON_CreateObject();
		cJSON_AddStringToObject(e, "name", a->name);
		cJSON_AddStringToObject(e, "dtype", ckpt_dtype_get(a->dtype)->name);
		cJSON_AddNumberToObject(e, "raw_bytes", (double)nb);
		cJSON_AddNumberToObject(e, "stored_bytes", (double)st);
		cJSON_AddNumberToObject(e, "shards", (double)a->nshards);
		cJSON_AddNumberToObject(e, "chunk_bytes", (double)a->chunk_bytes);
		cJSON_AddItemToArray(list, e);
	}
	cJSON_AddNumberToObject(root, "arrays", narr);
	cJSON_AddNumberToObject(root, "shards", (double)j.ntasks);
	cJSON_AddNumberToObject(root, "raw_bytes", (double)raw);
	cJSON_AddNumberToObject(root, "stored_bytes", (double)stored);
	cJSON_AddNumberToObject(root, "ratio", stored ? (double)raw / (double)stored : 0);
	cJSON_AddNumberToObject(root, "seconds", secs);
	cJSON_AddItemToObject(root, "by_top", tops);
	cJSON_AddItemToObject(root, "list", list);
	char *txt = cJSON_PrintUnformatted(root);
	printf("%s\n", txt);
	free(txt);
	cJSON_Delete(root);
	return 0;
}

/* ---- decode ------------------------------------------------------------ */

typedef struct darray {
	char name[512];
	ckpt_array *a;
	const ckpt_array_meta *m;
	uint64_t units;
	uint64_t stored;
} darray;

typedef struct dec_job {
	ckpt_store *store;
	darray *arr;
	uint64_t *task_arr, *task_unit, ntasks;
	atomic_uint_least64_t next;
	uint64_t max_unit;
	int outs; /* -o N: output buffers per thread, in turn; 0: a fresh mapping per unit */
	pthread_barrier_t ready; /* the buffers are allocated before the clock starts */
	atomic_int failed;
} dec_job;

static void *dec_worker(void *arg)
{
	dec_job *j = arg;
	uint8_t *bufs[64];
	int nb = j->outs < 1 ? 1 : j->outs > 64 ? 64 : j->outs;
	for (int b = 0; b < nb; b++)
		bufs[b] = j->outs ? alloc_touched(j->max_unit) : NULL;
	ckpt_zarr_scratch *sc = ckpt_zarr_scratch_create();
	pthread_barrier_wait(&j->ready);
	for (int turn = 0;; turn++) {
		uint64_t t = atomic_fetch_add(&j->next, 1);
		if (t >= j->ntasks)
			break;
		uint8_t *dst = bufs[turn % nb];
		if (!j->outs) {
			dst = mmap(NULL, j->max_unit, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
				   0);
			if (dst == MAP_FAILED)
				die("out of memory (%s)", "mmap");
		}
		darray *d = &j->arr[j->task_arr[t]];
		uint64_t g[CKPT_MAX_RANK], rem = j->task_unit[t];
		for (int k = d->m->rank - 1; k >= 0; k--) {
			g[k] = rem % d->m->grid[k];
			rem /= d->m->grid[k];
		}
		int rc = ckpt_zarr_read_unit(j->store, d->name, d->m, g, dst, sc);
		if (!j->outs)
			munmap(dst, j->max_unit);
		if (rc < 0) {
			atomic_store(&j->failed, 1);
			break;
		}
	}
	ckpt_zarr_scratch_destroy(sc);
	for (int b = 0; b < nb; b++)
		free(bufs[b]);
	return NULL;
}

static int cmd_decode(int argc, char **argv)
{
	int threads = 2, hash = 0;
	const char *mode = "unit", *top = NULL;
	int opt;
	int outs = 1;
	while ((opt = getopt(argc, argv, "t:m:k:o:H")) != -1) {
		if (opt == 'o')
			outs = atoi(optarg);
		else if (opt == 't')
			threads = atoi(optarg);
		else if (opt == 'm')
			mode = optarg;
		else if (opt == 'k')
			top = optarg;
		else if (opt == 'H')
			hash = 1;
		else
			return 2;
	}
	if (argc - optind != 1)
		die("usage: %s", "decode ITEMDIR [-t THREADS] [-m unit|array] [-k TOPKEY] [-o N] [-H]");
	if (threads < 1 || threads > 64)
		threads = 2;
	const char *dir = argv[optind];
	char path[4096];
	snprintf(path, sizeof(path), "%s/_METADATA", dir);
	FILE *f = fopen(path, "r");
	if (!f)
		die("cannot open %s", path);
	fseek(f, 0, SEEK_END);
	long len = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *txt = malloc((size_t)len + 1);
	if (fread(txt, 1, (size_t)len, f) != (size_t)len)
		die("cannot read %s", path);
	txt[len] = 0;
	fclose(f);
	cJSON *md = cJSON_Parse(txt);
	free(txt);
	cJSON *tree = md ? cJSON_GetObjectItem(md, "tree_metadata") : NULL;
	if (!tree)
		die("no tree_metadata in %s", path);

	ckpt_store *store;
	snprintf(path, sizeof(path), "%s/manifest.ocdbt", dir);
	int ocdbt = access(path, F_OK) == 0;
	int rc = ocdbt ? ckpt_store_ocdbt_open(dir, &store) : ckpt_store_dir_open(dir, &store);
	if (rc < 0)
		die("cannot open store %s", dir);
	ckpt_ctx_opts co = { .threads = threads };
	ckpt_ctx *ctx;
	if (ckpt_ctx_create(&co, &ctx) < 0)
		die("cannot create context (%s)", dir);

	int n = cJSON_GetArraySize(tree), narr = 0;
	darray *arr = calloc((size_t)n + 1, sizeof(*arr));
	cJSON *e;
	cJSON_ArrayForEach(e, tree)
	{
		cJSON *km = cJSON_GetObjectItem(e, "key_metadata");
		int depth = cJSON_GetArraySize(km);
		if (depth < 1)
			continue;
		if (top &&
		    strcmp(cJSON_GetObjectItem(cJSON_GetArrayItem(km, 0), "key")->valuestring, top) != 0)
			continue;
		darray *d = &arr[narr];
		size_t o = 0;
		for (int k = 0; k < depth; k++)
			o += (size_t)snprintf(
				d->name + o, sizeof(d->name) - o, "%s%s", k ? "." : "",
				cJSON_GetObjectItem(cJSON_GetArrayItem(km, k), "key")->valuestring);
		if (ckpt_array_open(ctx, store, d->name, 0, &d->a) < 0)
			die("cannot open array %s", d->name);
		d->m = ckpt_array_meta_of(d->a);
		d->units = 1;
		for (int k = 0; k < d->m->rank; k++)
			d->units *= d->m->grid[k];
		ckpt_array_stored_bytes(d->a, &d->stored);
		narr++;
	}
	cJSON_Delete(md);

	dec_job j = { .store = store, .arr = arr, .outs = outs };
	uint64_t max_nbytes = 0, stored = 0, decoded = 0;
	for (int i = 0; i < narr; i++) {
		j.ntasks += arr[i].units;
		if (arr[i].m->unit_bytes > j.max_unit)
			j.max_unit = arr[i].m->unit_bytes;
		if (arr[i].m->nbytes > max_nbytes)
			max_nbytes = arr[i].m->nbytes;
		stored += arr[i].stored;
	}
	cJSON *out = cJSON_CreateObject(), *hashes = cJSON_CreateObject();
	double secs = 0;
	if (strcmp(mode, "unit") == 0) {
		j.task_arr = malloc(j.ntasks * sizeof(uint64_t));
		j.task_unit = malloc(j.ntasks * sizeof(uint64_t));
		uint64_t t = 0;
		for (int i = 0; i < narr; i++)
			for (uint64_t u = 0; u < arr[i].units; u++, t++) {
				j.task_arr[t] = (uint64_t)i;
				j.task_unit[t] = u;
				decoded += arr[i].m->unit_bytes;
			}
		pthread_t th[64];
		pthread_barrier_init(&j.ready, NULL, (unsigned)threads + 1);
		for (int i = 0; i < threads; i++)
			pthread_create(&th[i], NULL, dec_worker, &j);
		pthread_barrier_wait(&j.ready);
		double t0 = now_s();
		for (int i = 0; i < threads; i++)
			pthread_join(th[i], NULL);
		secs = now_s() - t0;
		pthread_barrier_destroy(&j.ready);
		if (atomic_load(&j.failed))
			die("decode failed in %s", dir);
	} else if (strcmp(mode, "array") == 0) {
		uint8_t *buf = alloc_touched(max_nbytes);
		for (int i = 0; i < narr; i++) {
			ckpt_region r;
			ckpt_region_full(&r, arr[i].m->rank, arr[i].m->shape);
			double t0 = now_s();
			ssize_t got = ckpt_array_read(arr[i].a, &r, 0, arr[i].m->nbytes, buf);
			secs += now_s() - t0;
			if (got != (ssize_t)arr[i].m->nbytes)
				die("read of %s failed", arr[i].name);
			decoded += arr[i].m->nbytes;
			if (hash) {
				hasher h;
				hash_init(&h);
				hash_feed(&h, buf, arr[i].m->nbytes);
				char hx[32];
				snprintf(hx, sizeof(hx), "%016llx", (unsigned long long)hash_done(&h));
				cJSON_AddStringToObject(hashes, arr[i].name, hx);
			}
		}
		free(buf);
	} else {
		die("unknown mode %s", mode);
	}
	cJSON_AddStringToObject(out, "mode", mode);
	cJSON_AddNumberToObject(out, "threads", threads);
	cJSON_AddNumberToObject(out, "arrays", narr);
	cJSON_AddNumberToObject(out, "units", (double)j.ntasks);
	cJSON_AddNumberToObject(out, "decoded_bytes", (double)decoded);
	cJSON_AddNumberToObject(out, "stored_bytes", (double)stored);
	cJSON_AddNumberToObject(out, "seconds", secs);
	cJSON_AddNumberToObject(out, "gbps", secs > 0 ? (double)decoded / secs / 1e9 : 0);
	if (hash)
		cJSON_AddItemToObject(out, "hashes", hashes);
	else
		cJSON_Delete(hashes);
	char *s = cJSON_PrintUnformatted(out);
	printf("%s\n", s);
	free(s);
	cJSON_Delete(out);
	for (int i = 0; i < narr; i++)
		ckpt_array_destroy(arr[i].a);
	ckpt_ctx_destroy(ctx);
	ckpt_store_destroy(store);
	free(arr);
	return 0;
}

/* ---- read -------------------------------------------------------------- */

typedef struct read_slot {
	uint64_t bytes;
	uint64_t hash;
	int err;
} read_slot;

static void read_files(char **files, const int *owner, int nfiles, int me, size_t bs, int hash,
		       read_slot *slots)
{
	uint8_t *buf = alloc_touched(bs);
	for (int i = 0; i < nfiles; i++) {
		if (owner[i] != me)
			continue;
		int fd = open(files[i], O_RDONLY);
		if (fd < 0) {
			slots[i].err = errno;
			continue;
		}
		hasher h;
		hash_init(&h);
		uint64_t total = 0, skip = 0;
		for (;;) {
			ssize_t n = read(fd, buf, bs);
			if (n < 0) {
				if (errno == EINTR)
					continue;
				slots[i].err = errno;
				break;
			}
			if (n == 0)
				break;
			if (hash) {
				const uint8_t *p = buf;
				size_t m = (size_t)n;
				if (total == 0 && m >= 10 && memcmp(buf, "\x93NUMPY", 6) == 0)
					skip = buf[6] == 1 ? 10u + (buf[8] | ((uint64_t)buf[9] << 8))
							   : 12u + (buf[8] | ((uint64_t)buf[9] << 8) |
								    ((uint64_t)buf[10] << 16) |
								    ((uint64_t)buf[11] << 24));
				if (total < skip) {
					uint64_t k = skip - total < m ? skip - total : m;
					p += k;
					m -= (size_t)k;
				}
				hash_feed(&h, p, m);
			}
			total += (uint64_t)n;
		}
		close(fd);
		slots[i].bytes = total;
		slots[i].hash = hash_done(&h);
	}
	free(buf);
}

static int cmd_read(int argc, char **argv)
{
	size_t bs = 1 << 20;
	int procs = 1, hash = 0;
	int opt;
	while ((opt = getopt(argc, argv, "b:P:H")) != -1) {
		if (opt == 'b')
			bs = (size_t)strtoull(optarg, NULL, 10);
		else if (opt == 'P')
			procs = atoi(optarg);
		else if (opt == 'H')
			hash = 1;
		else
			return 2;
	}
	int nfiles = argc - optind;
	char **files = argv + optind;
	if (nfiles < 1 || procs < 1 || bs < 1)
		die("usage: %s", "read [-b BYTES] [-P PROCS] [-H] FILE...");
	/* deal files to processes in order, each to the currently lightest one */
	int *owner = calloc((size_t)nfiles, sizeof(int));
	uint64_t *load = calloc((size_t)procs, sizeof(uint64_t));
	for (int i = 0; i < nfiles; i++) {
		struct stat st;
		uint64_t sz = stat(files[i], &st) == 0 ? (uint64_t)st.st_size : 0;
		int best = 0;
		for (int p = 1; p < procs; p++)
			if (load[p] < load[best])
				best = p;
		owner[i] = best;
		load[best] += sz;
	}
	size_t shm = sizeof(read_slot) * (size_t)nfiles + sizeof(double) * (size_t)procs;
	void *mem = mmap(NULL, shm, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (mem == MAP_FAILED)
		die("mmap failed (%s)", "read");
	memset(mem, 0, shm);
	read_slot *slots = mem;
	double *ends = (double *)(slots + nfiles);
	int go[2];
	if (pipe(go) < 0)
		die("pipe failed (%s)", "read");
	pid_t *pids = calloc((size_t)procs, sizeof(pid_t));
	for (int p = 0; p < procs; p++) {
		pids[p] = fork();
		if (pids[p] < 0)
			die("fork failed (%s)", "read");
		if (pids[p] == 0) {
			close(go[1]);
			char c;
			while (read(go[0], &c, 1) < 0 && errno == EINTR)
				;
			read_files(files, owner, nfiles, p, bs, hash, slots);
			ends[p] = now_s();
			_exit(0);
		}
	}
	close(go[0]);
	usleep(20000); /* let the children reach the barrier (buffers touched) */
	double t0 = now_s();
	close(go[1]);
	for (int p = 0; p < procs; p++)
		waitpid(pids[p], NULL, 0);
	double t1 = now_s();
	uint64_t total = 0;
	int errs = 0;
	cJSON *out = cJSON_CreateObject(), *per = cJSON_CreateArray(), *hs = cJSON_CreateObject();
	for (int i = 0; i < nfiles; i++) {
		total += slots[i].bytes;
		if (slots[i].err) {
			errs++;
			fprintf(stderr, "ckpt_bench: %s: %s\n", files[i], strerror(slots[i].err));
		}
		if (hash) {
			char hx[32];
			snprintf(hx, sizeof(hx), "%016llx", (unsigned long long)slots[i].hash);
			cJSON_AddStringToObject(hs, files[i], hx);
		}
	}
	for (int p = 0; p < procs; p++)
		cJSON_AddItemToArray(per, cJSON_CreateNumber(ends[p] > 0 ? ends[p] - t0 : -1));
	cJSON_AddNumberToObject(out, "files", nfiles);
	cJSON_AddNumberToObject(out, "procs", procs);
	cJSON_AddNumberToObject(out, "bytes", (double)total);
	cJSON_AddNumberToObject(out, "seconds", t1 - t0);
	cJSON_AddNumberToObject(out, "gbps", t1 > t0 ? (double)total / (t1 - t0) / 1e9 : 0);
	cJSON_AddNumberToObject(out, "errors", errs);
	cJSON_AddItemToObject(out, "proc_seconds", per);
	if (hash)
		cJSON_AddItemToObject(out, "hashes", hs);
	else
		cJSON_Delete(hs);
	char *s = cJSON_PrintUnformatted(out);
	printf("%s\n", s);
	free(s);
	cJSON_Delete(out);
	return errs ? 1 : 0;
}

/* ---- wlimit ------------------------------------------------------------ */

typedef struct wl_job {
	const uint8_t *src;
	uint64_t total;
	size_t chunk;
	uint64_t nchunks;
	uint8_t *out; /* nchunks slots of `slot` bytes */
	size_t slot;
	size_t *csize;
	int level;
	atomic_uint_least64_t next;
	atomic_int failed;
} wl_job;

static void *wl_worker(void *arg)
{
	wl_job *j = arg;
	ZSTD_CCtx *cc = ZSTD_createCCtx();
	for (;;) {
		uint64_t c = atomic_fetch_add(&j->next, 1);
		if (c >= j->nchunks)
			break;
		uint64_t off = c * j->chunk;
		size_t n = j->total - off < j->chunk ? (size_t)(j->total - off) : j->chunk;
		size_t r = ZSTD_compressCCtx(cc, j->out + c * j->slot, j->slot, j->src + off, n, j->level);
		if (ZSTD_isError(r)) {
			atomic_store(&j->failed, 1);
			break;
		}
		j->csize[c] = r;
	}
	ZSTD_freeCCtx(cc);
	return NULL;
}

static int cmd_wlimit(int argc, char **argv)
{
	int threads = 2, level = 1;
	size_t chunk = 4u << 20;
	int opt;
	while ((opt = getopt(argc, argv, "t:l:c:")) != -1) {
		if (opt == 't')
			threads = atoi(optarg);
		else if (opt == 'l')
			level = atoi(optarg);
		else if (opt == 'c')
			chunk = (size_t)strtoull(optarg, NULL, 10);
		else
			return 2;
	}
	if (argc - optind < 2 || chunk < 4096)
		die("usage: %s", "wlimit OUTFILE [-t THREADS] [-l LEVEL] [-c CHUNK] FILE...");
	if (threads < 1 || threads > 64)
		threads = 2;
	const char *outfile = argv[optind];
	uint64_t total = 0;
	for (int i = optind + 1; i < argc; i++) {
		struct stat st;
		if (stat(argv[i], &st) < 0)
			die("cannot stat %s", argv[i]);
		total += (uint64_t)st.st_size;
	}
	wl_job j = { .total = total, .chunk = chunk, .level = level };
	uint8_t *src = alloc_touched(total);
	uint64_t off = 0;
	for (int i = optind + 1; i < argc; i++) {
		int fd = open(argv[i], O_RDONLY);
		if (fd < 0)
			die("cannot open %s", argv[i]);
		for (;;) {
			ssize_t n = read(fd, src + off, 8u << 20);
			if (n < 0)
				die("cannot read %s", argv[i]);
			if (n == 0)
				break;
			off += (uint64_t)n;
		}
		close(fd);
	}
	j.src = src;
	j.nchunks = (total + chunk - 1) / chunk;
	j.slot = ZSTD_compressBound(chunk);
	j.out = alloc_touched(j.slot * j.nchunks);
	j.csize = calloc(j.nchunks, sizeof(size_t));
	pthread_t th[64];
	double t0 = now_s();
	for (int i = 0; i < threads; i++)
		pthread_create(&th[i], NULL, wl_worker, &j);
	for (int i = 0; i < threads; i++)
		pthread_join(th[i], NULL);
	double tc = now_s() - t0;
	if (atomic_load(&j.failed))
		die("compression failed (%s)", "wlimit");
	uint64_t comp = 0;
	for (uint64_t c = 0; c < j.nchunks; c++)
		comp += j.csize[c];

	/* write the compressed bytes to disk, then fsync */
	t0 = now_s();
	int fd = open(outfile, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0)
		die("cannot create %s", outfile);
	for (uint64_t c = 0; c < j.nchunks; c++) {
		const uint8_t *p = j.out + c * j.slot;
		size_t n = j.csize[c];
		while (n) {
			ssize_t w = write(fd, p, n);
			if (w <= 0)
				die("write to %s failed", outfile);
			p += w;
			n -= (size_t)w;
		}
	}
	if (fsync(fd) < 0)
		die("fsync of %s failed", outfile);
	close(fd);
	double tw = now_s() - t0;
	unlink(outfile);
	printf("{\"raw_bytes\":%llu,\"compressed_bytes\":%llu,\"ratio\":%.4f,\"compress_seconds\":%.4f,"
	       "\"write_fsync_seconds\":%.4f,\"threads\":%d,\"level\":%d,\"chunk\":%zu}\n",
	       (unsigned long long)total, (unsigned long long)comp, comp ? (double)total / (double)comp : 0,
	       tc, tw, threads, level, chunk);
	free(src);
	free(j.out);
	free(j.csize);
	return 0;
}

/* ---- vread: one file of a view, in process ------------------------------ */

static double cpu_s(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
	       (double)ru.ru_stime.tv_usec * 1e-6;
}

static int cmd_vread(int argc, char **argv)
{
	long cache_mib = 256, piece = 1 << 20;
	int threads = 2, opt;
	const char *outpath = NULL;
	while ((opt = getopt(argc, argv, "c:t:b:o:")) != -1) {
		if (opt == 'o')
			outpath = optarg;
		else if (opt == 'c')
			cache_mib = atol(optarg);
		else if (opt == 't')
			threads = atoi(optarg);
		else if (opt == 'b')
			piece = atol(optarg);
		else
			return 2;
	}
	if (argc - optind != 2 || cache_mib < 1 || piece < 4096 || threads < 1 || threads > 64)
		die("usage: %s", "vread SOURCE PATH [-c CACHE_MIB] [-t THREADS] [-b BYTES] [-o OUT]");
	ckpt_view_opts o;
	memset(&o, 0, sizeof(o));
	o.ctx.cache_bytes = (uint64_t)cache_mib << 20;
	o.ctx.threads = threads;
	o.read_only = 1;
	ckpt_view *v;
	if (ckpt_view_open(argv[optind], &o, &v) < 0)
		die("cannot open %s", argv[optind]);
	/* PATH, one name at a time from the root */
	char *path = strdup(argv[optind + 1]), *save = NULL;
	ckpt_attr a = { .ino = CKPT_ROOT_INO, .is_dir = 1 };
	for (char *name = strtok_r(path, "/", &save); name; name = strtok_r(NULL, "/", &save))
		if (ckpt_view_lookup(v, a.ino, name, &a) < 0)
			die("no %s in the view", argv[optind + 1]);
	if (a.is_dir)
		die("%s is a folder", argv[optind + 1]);
	uint8_t *buf = alloc_touched((size_t)piece);
	FILE *outf = outpath ? fopen(outpath, "wb") : NULL;
	if (outpath && !outf)
		die("cannot create %s", outpath);
	double spent = 0, spent_cpu = 0; /* in writing OUT, taken off the clocks */
	enum { NIOV = 1023 }; /* the daemon's bound: IOV_MAX with libfuse's header */
	struct iovec iov[NIOV];
	ckpt_pin *pins[NIOV];
	uint64_t d0 = atomic_load(&ckpt_g_stats.chunks_decoded),
		 b0 = atomic_load(&ckpt_g_stats.decoded_bytes);
	double c0 = cpu_s(), t0 = now_s();
	uint64_t off = 0, zc = 0;
	while (off < a.size) {
		int npins, k = ckpt_view_read_iov(v, a.ino, off, (size_t)piece, iov, NIOV, pins, &npins);
		ssize_t n = 0;
		if (k >= 0) {
			for (int i = 0; i < k; i++) {
				memcpy(buf + n, iov[i].iov_base, iov[i].iov_len);
				n += (ssize_t)iov[i].iov_len;
			}
			ckpt_view_unpin(v, a.ino, pins, npins);
			zc += (uint64_t)n;
		} else if (k == -ENOTSUP) {
			n = ckpt_view_read(v, a.ino, off, (size_t)piece, buf);
		} else {
			n = k;
		}
		if (n <= 0)
			die("read of %s failed", argv[optind + 1]);
		off += (uint64_t)n;
		if (outf) {
			double w0 = now_s(), u0 = cpu_s();
			if (fwrite(buf, 1, (size_t)n, outf) != (size_t)n)
				die("cannot write %s", outpath);
			spent += now_s() - w0;
			spent_cpu += cpu_s() - u0;
		}
	}
	double secs = now_s() - t0 - spent, cpu = cpu_s() - c0 - spent_cpu;
	if (outf && fclose(outf) != 0)
		die("cannot write %s", outpath);
	cJSON *out = cJSON_CreateObject();
	cJSON_AddStringToObject(out, "path", argv[optind + 1]);
	cJSON_AddNumberToObject(out, "bytes", (double)off);
	cJSON_AddNumberToObject(out, "zero_copy_bytes", (double)zc);
	cJSON_AddNumberToObject(out, "seconds", secs);
	cJSON_AddNumberToObject(out, "cpu_seconds", cpu);
	cJSON_AddNumberToObject(out, "gbps", secs > 0 ? (double)off / secs / 1e9 : 0);
	cJSON_AddNumberToObject(out, "chunks_decoded",
				(double)(atomic_load(&ckpt_g_stats.chunks_decoded) - d0));
	cJSON_AddNumberToObject(out, "decoded_bytes",
				(double)(atomic_load(&ckpt_g_stats.decoded_bytes) - b0));
	char *txt = cJSON_PrintUnformatted(out);
	printf("%s\n", txt);
	free(txt);
	cJSON_Delete(out);
	free(buf);
	free(path);
	ckpt_view_destroy(v);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: ckpt_bench gen|decode|read|vread|wlimit ...\n");
		return 2;
	}
	const char *cmd = argv[1];
	argv++;
	argc--;
	if (strcmp(cmd, "gen") == 0)
		return cmd_gen(argc, argv);
	if (strcmp(cmd, "decode") == 0)
		return cmd_decode(argc, argv);
	if (strcmp(cmd, "read") == 0)
		return cmd_read(argc, argv);
	if (strcmp(cmd, "wlimit") == 0)
		return cmd_wlimit(argc, argv);
	if (strcmp(cmd, "vread") == 0)
		return cmd_vread(argc, argv);
	fprintf(stderr, "ckpt_bench: unknown command %s\n", cmd);
	return 2;
}
