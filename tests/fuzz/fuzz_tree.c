/*
 * fuzz_tree.c - libFuzzer target over the whole tree: the input is decoded
 * into a few (path, bytes) files of an in-memory store, a view is built over
 * it exactly as for a mount or `ckptfs info`, and every node is visited:
 * readdir, lookup, getattr, bounded reads (plain and zero-copy), xattrs,
 * the hidden companions (slices, NAME.shards/, X.safetensors, .ckptfs/) and
 * the summary table, then the view is freed.
 *
 * Input (tests/fuzz/make_tree_seeds.py writes it from real folders):
 *   flags:u8                 bit 0: show companions in readdir
 *   entry*                   until the input ends
 *   entry = head:u8 comp{(head & 7) + 1} len:u16le bytes{len}
 *   comp  = c:u8             c < NWORDS: words[c]; else a literal name of
 *                            (c - NWORDS) bytes that follow
 * Path components are joined with '/'.  A malformed key is skipped; len
 * is cut to the bytes left.  A file named "@slice" is not stored: its
 * bytes are one more slice suffix to look up on every array.
 *
 * Properties (REQUIRE): a name readdir lists is found by lookup as the same
 * inode; reads never answer more than asked nor past st_size; xattr lengths
 * agree between the probe (cap 0) and the read.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "common.h"
#include "ckpt.h"
#include "store.h"
#include "fuzz.h"

/* The names layouts are made of, so that mutations reach deep; the index
 * of each is its byte in the container (append only: seeds depend on it). */
static const char *const words[] = {
	"_METADATA",
	"_CHECKPOINT_METADATA",
	"_sharding",
	"zarr.json",
	".zarray",
	"manifest.ocdbt",
	"d",
	"commit_success.txt",
	"orbax.checkpoint",
	"ocdbt.process_0",
	"ocdbt.process_1",
	"state",
	"metadata",
	"params",
	"opt_state",
	"10",
	"20",
	"step_30",
	"0",
	"0.0",
	"c",
	"a",
	"b",
	"array_metadatas",
	"process_0",
	"_strings.json",
	"descriptor",
	"default",
	"30.orbax-checkpoint-tmp-1",
	"40.partial_save",
	"metrics",
	".zattrs",
	"1",
	"0.1",
	"1.0",
	"params.a",
	"opt_state.b",
	"x",
	"@slice",
	"pytree",
};
#define NWORDS (sizeof(words) / sizeof(words[0]))

#define MAX_ENTRIES 128
#define MAX_NODES 600 /* nodes visited per input */
#define MAX_DEPTH 24
#define READ_PIECE 4096
#define READ_MAX (64 * 1024) /* bytes read per file */
#define MAX_SLICES 4

struct walk {
	ckpt_view *v;
	int nodes;
	const char *slices[MAX_SLICES];
	size_t nslices;
	uint8_t buf[READ_PIECE];
};

static int verbose;

static void quiet(int level, const char *msg)
{
	(void)level;
	(void)msg;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	ckpt_log_set_level(CKPT_LOG_INFO); /* every log line is still formatted */
	verbose = getenv("FUZZ_TREE_VERBOSE") != NULL; /* logs and a line per input, to stderr */
	if (!verbose)
		ckpt_log_set_sink(quiet);
	return 0;
}

static void check_xattrs(struct walk *w, ckpt_ino ino)
{
	char list[4096], val[4096];
	ssize_t n = ckpt_view_listxattr(w->v, ino, NULL, 0);
	if (n <= 0 || (size_t)n > sizeof(list))
		return;
	ssize_t m = ckpt_view_listxattr(w->v, ino, list, sizeof(list));
	REQUIRE(m == n);
	REQUIRE(list[m - 1] == 0);
	for (char *p = list; p < list + m; p += strlen(p) + 1) {
		ssize_t a = ckpt_view_getxattr(w->v, ino, p, NULL, 0);
		if (a < 0)
			continue; /* e.g. a value that needs array data which is damaged */
		ssize_t b = ckpt_view_getxattr(w->v, ino, p, val, sizeof(val));
		REQUIRE(b < 0 || b == a || (b == -ERANGE && (size_t)a > sizeof(val)));
		if (a > 1) { /* (cap 0 is the probe) */
			ssize_t c = ckpt_view_getxattr(w->v, ino, p, val, (size_t)a - 1);
			if (c >= 0) {
				fprintf(stderr, "fuzz_tree: %s: %zd bytes into a buffer of %zd\n", p, c,
					a - 1);
				abort();
			}
		}
	}
	(void)ckpt_view_getxattr(w->v, ino, "user.ckpt.nonexistent", val, sizeof(val));
	(void)ckpt_view_getxattr(w->v, ino, "security.selinux", val, sizeof(val));
}

static void read_file(struct walk *w, const ckpt_attr *a)
{
	if (ckpt_view_open_check(w->v, a->ino) < 0)
		return;
	uint64_t size = a->size;
	uint64_t off = 0;
	do { /* at least one read: files of size 0 too (broken arrays, summaries) */
		ssize_t n = ckpt_view_read(w->v, a->ino, off, READ_PIECE, w->buf);
		if (n < 0)
			return;
		REQUIRE((size_t)n <= READ_PIECE);
		/* volatile files (stats) may grow between getattr and read */
		REQUIRE(a->volatile_data || off + (uint64_t)n <= size);
		off += READ_PIECE;
	} while (off < size && off < READ_MAX);
	if (size > READ_MAX) { /* the tail, and a piece straddling the end */
		ssize_t n = ckpt_view_read(w->v, a->ino, size - 10, READ_PIECE, w->buf);
		REQUIRE(n < 0 || a->volatile_data || n <= 10);
	}
	ssize_t past = ckpt_view_read(w->v, a->ino, size + 1, 16, w->buf);
	REQUIRE(a->volatile_data || past <= 0);
	struct iovec iov[8];
	ckpt_pin *pins[8];
	int npins = 0;
	int k = ckpt_view_read_iov(w->v, a->ino, 0, READ_PIECE, iov, 8, pins, &npins);
	if (k >= 0) {
		size_t got = 0;
		for (int i = 0; i < k; i++)
			got += iov[i].iov_len;
		REQUIRE(got <= READ_PIECE && (a->volatile_data || got <= size));
		REQUIRE(npins >= 0 && npins <= 8);
		/* the zero-copy pieces hold the bytes a plain read returns */
		ssize_t n = a->volatile_data ? -1 : ckpt_view_read(w->v, a->ino, 0, got, w->buf);
		if (n >= 0) {
			REQUIRE((size_t)n == got);
			size_t at = 0;
			for (int i = 0; i < k; i++) {
				REQUIRE(memcmp(w->buf + at, iov[i].iov_base, iov[i].iov_len) == 0);
				at += iov[i].iov_len;
			}
		}
	}
	ckpt_view_unpin(w->v, a->ino, pins, npins);
}

static void walk_dir(struct walk *w, ckpt_ino dir, int depth);

/* Everything a node answers; directories are walked. */
static void visit(struct walk *w, const ckpt_attr *a, int depth)
{
	if (++w->nodes > MAX_NODES)
		return;
	ckpt_attr g;
	if (ckpt_view_getattr(w->v, a->ino, &g) == 0)
		REQUIRE(g.ino == a->ino && g.is_dir == a->is_dir);
	check_xattrs(w, a->ino);
	if (a->is_dir)
		walk_dir(w, a->ino, depth + 1);
	else
		read_file(w, a);
}

/* Look a hidden name up in dir; visit it and forget it again. */
static void hidden(struct walk *w, ckpt_ino dir, const char *name, int depth)
{
	ckpt_attr a;
	if (ckpt_view_lookup(w->v, dir, name, &a) < 0)
		return;
	visit(w, &a, depth);
	ckpt_view_forget(w->v, a.ino, 1);
}

static void walk_dir(struct walk *w, ckpt_ino dir, int depth)
{
	if (depth > MAX_DEPTH)
		return;
	for (uint64_t i = 0; w->nodes < MAX_NODES; i++) {
		const char *name;
		ckpt_attr a;
		int rc = ckpt_view_readdir(w->v, dir, i, &name, &a);
		if (rc != 1)
			break;
		char copy[512];
		if (strlen(name) >= sizeof(copy) - 64)
			continue;
		strcpy(copy, name);
		ckpt_attr l;
		rc = ckpt_view_lookup(w->v, dir, copy, &l);
		REQUIRE(rc == 0); /* what readdir lists, lookup finds */
		REQUIRE(l.ino == a.ino);
		visit(w, &l, depth);
		ckpt_view_forget(w->v, l.ino, 1);
		size_t n = strlen(copy);
		char h[sizeof(copy) + 300];
		if (!a.is_dir && n > 4 && !strcmp(copy + n - 4, ".npy")) {
			static const char *const fixed[] = { "[0]", "[-1:]", "[1:,:2]" };
			for (size_t j = 0; j < sizeof(fixed) / sizeof(fixed[0]) + w->nslices; j++) {
				const char *s = j < 3 ? fixed[j] : w->slices[j - 3];
				snprintf(h, sizeof(h), "%.*s%s.npy", (int)(n - 4), copy, s);
				hidden(w, dir, h, depth);
			}
			snprintf(h, sizeof(h), "%.*s.f32.npy", (int)(n - 4), copy);
			hidden(w, dir, h, depth);
			snprintf(h, sizeof(h), "%.*s.shards", (int)(n - 4), copy);
			hidden(w, dir, h, depth);
		} else if (a.is_dir) {
			snprintf(h, sizeof(h), "%s.safetensors", copy);
			hidden(w, dir, h, depth);
			snprintf(h, sizeof(h), "%s.safetensors.d", copy);
			hidden(w, dir, h, depth);
		}
	}
	hidden(w, dir, ".ckptfs", depth);
	hidden(w, dir, "no-such-name", depth);
}

/* Decode the container into store m; slice suffixes into w. */
static void fill(ckpt_store *m, struct walk *w, const uint8_t *p, size_t size, char *slicebuf)
{
	size_t slen = 0;
	for (int e = 0; e < MAX_ENTRIES && size > 0; e++) {
		unsigned ncomp = (p[0] & 7) + 1;
		p++, size--;
		char key[1024];
		size_t klen = 0;
		int ok = 1;
		for (unsigned c = 0; c < ncomp && size > 0; c++) {
			unsigned b = *p++;
			size--;
			const char *s;
			size_t n;
			if (b < NWORDS) {
				s = words[b];
				n = strlen(s);
			} else {
				s = (const char *)p;
				n = b - NWORDS;
				if (n > size)
					n = size;
				p += n, size -= n;
			}
			if (klen + n + 2 > sizeof(key) || memchr(s, 0, n)) {
				ok = 0;
				continue;
			}
			if (klen)
				key[klen++] = '/';
			memcpy(key + klen, s, n);
			klen += n;
		}
		key[klen] = 0;
		size_t len = 0;
		if (size >= 2) {
			len = (size_t)p[0] | (size_t)p[1] << 8;
			p += 2, size -= 2;
		} else {
			p += size, size = 0;
		}
		if (len > size)
			len = size;
		const uint8_t *data = p;
		p += len, size -= len;
		if (!ok)
			continue;
		if (!strcmp(key, "@slice")) {
			if (w->nslices < MAX_SLICES && len < 200 && !memchr(data, 0, len)) {
				memcpy(slicebuf + slen, data, len);
				slicebuf[slen + len] = 0;
				w->slices[w->nslices++] = slicebuf + slen;
				slen += len + 1;
			}
			continue;
		}
		(void)ckpt_store_mem_put(m, key, data, len); /* -EINVAL for a malformed key */
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	ckpt_store *m;
	if (ckpt_store_mem_open("mem:fuzz", &m) < 0)
		return 0;
	struct walk w = { 0 };
	char slicebuf[MAX_SLICES * 201];
	fill(m, &w, data + 1, size - 1, slicebuf);
	ckpt_view_opts o = { 0 };
	o.ctx.threads = 1;
	o.ctx.cache_bytes = 8 << 20;
	o.ctx.prefetch_bytes = 64 << 10;
	o.show_companions = data[0] & 1;
	ckpt_view *v;
	int rc = ckpt_view_open_store(m, &o, &v);
	ckpt_store_destroy(m); /* the view holds its own reference */
	if (rc < 0)
		return 0;
	w.v = v;
	REQUIRE(ckpt_view_kind(v) != NULL);
	ckpt_attr root;
	REQUIRE(ckpt_view_getattr(v, CKPT_ROOT_INO, &root) == 0 && root.is_dir);
	visit(&w, &root, 0);
	for (int json = 0; json < 2; json++) {
		char *buf = NULL;
		size_t len = 0;
		if (ckpt_view_summary(v, CKPT_ROOT_INO, NULL, json, &buf, &len) == 0)
			REQUIRE(buf && strlen(buf) == len);
		free(buf);
	}
	if (verbose)
		fprintf(stderr, "fuzz_tree: %s, %d nodes visited\n", ckpt_view_kind(v), w.nodes);
	ckpt_view_destroy(v);
	return 0;
}
