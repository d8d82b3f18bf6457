/*
 * cli_verify.c - `ckptfs verify SOURCE [STEP...]`: read every array of
 * SOURCE (or of the given steps) in full through the view API, which
 * decodes every stored chunk and checks every checksum the format has
 * (shard-index CRC-32C, crc32c codecs, zstd frame checksums when the frame
 * carries one, OCDBT's CRCs).  Also checks each array's stored units
 * against its chunk grid (the missing-data rule: an item whose _METADATA
 * says store_array_data_equal_to_fill_value stores every chunk, so a
 * missing one is a problem; elsewhere it reads as the fill value and is
 * only noted).  Errors the library logs while opening SOURCE or reading an
 * array are collected and reported per array.
 *
 * Exit status: 0 no problem, 1 a problem, 2 usage.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckfs.h"
#include "cli.h"

/* Arrays without a data checksum named in the closing note. */
#define VERIFY_NOSUM_NAMES 8

/* ---- log capture: library error lines go to the array being read ---- */

static pthread_mutex_t cap_lock = PTHREAD_MUTEX_INITIALIZER;
static char *cap_buf;
static size_t cap_len;

static void capture_sink(int level, const char *msg)
{
	if (level > CKPT_LOG_ERR) {
		if (level == CKPT_LOG_WARN)
			fprintf(stderr, "ckptfs verify: warning: %s\n", msg);
		return;
	}
	pthread_mutex_lock(&cap_lock);
	size_t l = strlen(msg);
	char *nb = realloc(cap_buf, cap_len + l + 2);
	if (nb) {
		cap_buf = nb;
		memcpy(cap_buf + cap_len, msg, l);
		cap_len += l;
		cap_buf[cap_len++] = '\n';
		cap_buf[cap_len] = 0;
	}
	pthread_mutex_unlock(&cap_lock);
}

/* The captured lines so far (malloc'd, or NULL when none); clears them. */
static char *take_captured(void)
{
	pthread_mutex_lock(&cap_lock);
	char *b = cap_len ? cap_buf : NULL;
	if (!b)
		free(cap_buf);
	cap_buf = NULL;
	cap_len = 0;
	pthread_mutex_unlock(&cap_lock);
	return b;
}

/* ---- the arrays to read ---- */

struct varr {
	char *path;
	ckpt_ino ino;
	uint64_t size;
};

struct vlist {
	ckpt_view *v;
	struct varr *a;
	size_t n, cap;
	uint64_t total;
};

static int collect(void *ctx, const char *path, int depth, const ckpt_attr *a)
{
	(void)depth;
	struct vlist *l = ctx;
	char buf[64];
	if (a->is_dir || ckfs_xattr(l->v, a->ino, "user.ckpt.dtype", buf, sizeof(buf)) < 0)
		return 0;
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 64;
		struct varr *na = realloc(l->a, cap * sizeof(*na));
		if (!na)
			return -ENOMEM;
		l->a = na;
		l->cap = cap;
	}
	l->a[l->n] = (struct varr){ strdup(path), a->ino, a->size };
	if (!l->a[l->n].path)
		return -ENOMEM;
	l->n++;
	l->total += a->size;
	return 0;
}

/* Does the item holding `path` (its _METADATA) promise every chunk is
 * stored?  Looks in the parents of path for a _METADATA file. */
static int stores_every_chunk(ckpt_view *v, const char *path)
{
	char *dir = strdup(path);
	int found = 0;
	while (dir && !found) {
		char *slash = strrchr(dir, '/');
		if (!slash)
			break;
		*slash = 0;
		char meta[8192];
		snprintf(meta, sizeof(meta), "%s/_METADATA", dir);
		ckpt_attr a;
		if (ckfs_resolve(v, meta, &a) < 0 || a.is_dir)
			continue;
		size_t len = a.size < (64u << 20) ? (size_t)a.size : (64u << 20);
		char *txt = malloc(len + 1);
		ssize_t n = txt ? ckpt_view_read(v, a.ino, 0, len, txt) : -ENOMEM;
		if (n >= 0) {
			txt[n] = 0;
			const char *k = strstr(txt, "\"store_array_data_equal_to_fill_value\"");
			if (k) {
				k += strlen("\"store_array_data_equal_to_fill_value\"");
				k += strspn(k, " \t\r\n:");
				found = !strncmp(k, "true", 4) ? 1 : -1;
			} else {
				found = -1;
			}
		}
		free(txt);
	}
	free(dir);
	return found > 0;
}

/* "N of M stored units missing" from user.ckpt.shards ({"count": N,
 * "grid": [a,b]}); returns the number missing, 0 when unknown. */
static uint64_t missing_units(ckpt_view *v, ckpt_ino ino, uint64_t *total)
{
	char buf[512];
	*total = 0;
	if (ckfs_xattr(v, ino, "user.ckpt.shards", buf, sizeof(buf)) < 0)
		return 0;
	const char *c = strstr(buf, "\"count\":");
	const char *g = strstr(buf, "\"grid\":");
	if (!c || !g)
		return 0;
	uint64_t count = strtoull(c + 8, NULL, 10);
	uint64_t prod = 1;
	const char *p = strchr(g, '[');
	if (!p)
		return 0;
	for (p++; *p && *p != ']';) {
		char *end;
		uint64_t d = strtoull(p, &end, 10);
		if (end == p)
			break;
		prod *= d;
		p = end + (*end == ',');
	}
	if (count == 0 && prod > (1u << 20))
		return 0; /* too many to list: not counted */
	*total = prod;
	return count < prod ? prod - count : 0;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct progress {
	int on; /* stderr is a terminal */
	double start, last;
	uint64_t total, done;
	size_t arrays, narrays;
};

static void show_progress(struct progress *p, int force)
{
	if (!p->on)
		return;
	double t = now_s();
	if (!force && t - p->last < 0.2)
		return;
	p->last = t;
	char a[32], b[32], r[32];
	double el = t - p->start;
	double rate = el > 0 ? (double)p->done / el : 0;
	char eta[32] = "?";
	if (rate > 0)
		snprintf(eta, sizeof(eta), "%.0fs", (double)(p->total - p->done) / rate);
	fprintf(stderr, "\r\033[Kverify: %zu/%zu arrays, %s/%s, %s/s, ETA %s", p->arrays, p->narrays,
		ckpt_human(p->done, a, sizeof(a)), ckpt_human(p->total, b, sizeof(b)),
		ckpt_human((uint64_t)rate, r, sizeof(r)), eta);
}

/* Frees the list and its view, ends the log capture, frees real and steps. */
static void verify_release(struct vlist *l, char *real, const char **steps)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->a[i].path);
	free(l->a);
	ckpt_view_destroy(l->v);
	ckpt_log_set_sink(NULL);
	free(take_captured());
	free(real);
	free(steps);
}

static void verify_usage(FILE *f)
{
	fprintf(f, "usage: ckptfs verify SOURCE [STEP...]\n"
		   "Decode every chunk of every array (of the given steps) and check every checksum.\n"
		   "Exit status 0: no problem; 1: problems, listed per array; 2: usage.\n");
}

int ckfs_cmd_verify(int argc, char **argv)
{
	const char *source = NULL;
	int nsteps = 0;
	const char **steps = calloc((size_t)argc, sizeof(*steps));
	if (!steps)
		return 1;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			verify_usage(stdout);
			free(steps);
			return 0;
		}
		if (argv[i][0] == '-' && argv[i][1]) {
			fprintf(stderr, "ckptfs verify: unknown option %s\n", argv[i]);
			verify_usage(stderr);
			free(steps);
			return 2;
		}
		if (!source)
			source = argv[i];
		else
			steps[nsteps++] = argv[i];
	}
	if (!source) {
		verify_usage(stderr);
		free(steps);
		return 2;
	}
	ckpt_log_set_level(CKPT_LOG_WARN);
	ckpt_log_set_sink(capture_sink);
	ckpt_view *v;
	char *real;
	int rc = cli_open_view(source, &v, &real);
	if (rc < 0) {
		free(take_captured());
		free(steps);
		return 1;
	}
	size_t problems = 0;
	/* Errors while opening: arrays or files left out of the view. */
	char *open_errs = take_captured();
	if (open_errs) {
		for (char *s = open_errs, *e; *s; s = e + 1) {
			e = strchr(s, '\n');
			*e = 0;
			printf("%s: %s\n", real, s);
			problems++;
		}
		free(open_errs);
	}
	struct vlist l = { .v = v };
	if (nsteps == 0) {
		rc = ckfs_walk(v, CKPT_ROOT_INO, "", 0, collect, &l);
	} else if (strcmp(ckpt_view_kind(v), "root")) {
		fprintf(stderr, "ckptfs verify: %s is %s, not a CheckpointManager root: give no STEP\n", real,
			ckpt_view_kind(v));
		rc = -EINVAL;
	} else {
		for (int i = 0; i < nsteps && rc == 0; i++) {
			ckpt_attr a;
			rc = ckfs_resolve(v, steps[i], &a);
			if (rc < 0 || !a.is_dir) {
				fprintf(stderr, "ckptfs verify: %s: no step %s\n", real, steps[i]);
				rc = rc < 0 ? rc : -ENOTDIR;
				break;
			}
			rc = ckfs_walk(v, a.ino, steps[i], 0, collect, &l);
		}
	}
	if (rc < 0) {
		verify_release(&l, real, steps);
		return 1;
	}
	struct progress pg = { isatty(2), now_s(), 0, l.total, 0, 0, l.n };
	size_t bufcap = 8u << 20;
	char *buf = malloc(bufcap);
	size_t bad_arrays = 0, notes = 0, unsummed = 0;
	char **nosum = calloc(l.n ? l.n : 1, sizeof(*nosum)); /* arrays without a data checksum */
	for (size_t i = 0; buf && i < l.n; i++) {
		struct varr *r = &l.a[i];
		int bad = 0;
		char ck[256];
		if (nosum && ckfs_xattr(v, r->ino, "user.ckpt.checksum", ck, sizeof(ck)) >= 0 &&
		    !strstr(ck, "zstd-frame") && !strstr(ck, "crc32c-chunk") && !strstr(ck, "gzip-crc32"))
			nosum[unsummed++] = r->path; /* a shard index CRC covers offsets, not data */
		uint64_t total;
		uint64_t miss = missing_units(v, r->ino, &total);
		if (miss) {
			if (stores_every_chunk(v, r->path)) {
				if (pg.on)
					fprintf(stderr, "\r\033[K");
				printf("%s: %llu of %llu stored chunks missing (the item stores every "
				       "chunk)\n",
				       r->path, (unsigned long long)miss, (unsigned long long)total);
				bad = 1;
			} else {
				notes++;
			}
		}
		for (uint64_t off = 0; off < r->size;) {
			size_t want = r->size - off < bufcap ? (size_t)(r->size - off) : bufcap;
			ssize_t n = ckpt_view_read(v, r->ino, off, want, buf);
			if (n <= 0) {
				char *why = take_captured();
				if (pg.on)
					fprintf(stderr, "\r\033[K");
				printf("%s: read failed at byte %llu: %s\n", r->path, (unsigned long long)off,
				       n < 0 ? strerror((int)-n) : "unexpected end of file");
				for (char *s = why, *e; s && *s; s = e + 1) {
					e = strchr(s, '\n');
					*e = 0;
					printf("    %s\n", s);
				}
				free(why);
				bad = 1;
				pg.done += r->size - off;
				break;
			}
			off += (uint64_t)n;
			pg.done += (uint64_t)n;
			show_progress(&pg, 0);
		}
		/* Lines logged while this array read fine stay captured: they
		 * come from read-ahead of the next array (on another thread),
		 * and go with that array's failure, or are reported at the end. */
		pg.arrays++;
		bad_arrays += bad;
	}
	if (pg.on) {
		show_progress(&pg, 1);
		fprintf(stderr, "\n");
	}
	char *left = take_captured();
	for (char *s = left, *e; s && *s; s = e + 1) {
		e = strchr(s, '\n');
		*e = 0;
		printf("%s: %s\n", real, s);
		problems++;
	}
	free(left);
	char h[32];
	problems += bad_arrays;
	if (!buf) {
		fprintf(stderr, "ckptfs verify: out of memory\n");
		problems++;
	} else if (problems) {
		printf("ckptfs verify: %s: %zu problem%s (%zu of %zu arrays)\n", real, problems,
		       problems == 1 ? "" : "s", bad_arrays, l.n);
	} else {
		printf("ckptfs verify: %s: OK, %zu arrays, %s read and decoded", real, l.n,
		       ckpt_human(l.total, h, sizeof(h)));
		if (notes)
			printf(", %zu with chunks absent (read as the fill value)", notes);
		printf("\n");
	}
	if (buf && unsummed) {
		/* Orbax writes zstd frames without checksums: a flipped bit there
		 * goes unnoticed unless it breaks the decoding. */
		printf("ckptfs verify: %zu of %zu arrays carry no data checksum (see their "
		       "user.ckpt.checksum):",
		       unsummed, l.n);
		for (size_t i = 0; i < unsummed && i < VERIFY_NOSUM_NAMES; i++)
			printf("%s %s", i ? "," : "", nosum[i]);
		if (unsummed > VERIFY_NOSUM_NAMES)
			printf(" and %zu more", unsummed - VERIFY_NOSUM_NAMES);
		printf("\n");
	}
	free(nosum);
	free(buf);
	verify_release(&l, real, steps);
	return problems ? 1 : 0;
}
