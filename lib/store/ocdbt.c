/*
 * ocdbt.c - read-only OCDBT decoder (see ocdbt.h; format: docs/format.md, "OCDBT").
 *
 * Invariants:
 *  - Every byte comes through db->base (a ckpt_store whose root is the item
 *    folder): a folder store locally, an object store for s3:// and gs://.
 *  - After ckpt_ocdbt_open_store() returns, everything but the data-file size
 *    cache (struct ofile.sized/size) is immutable; those fields are guarded
 *    by db->mu.  No other lock exists.
 *  - db->ents is sorted by key (unsigned bytes) with no duplicates; every key
 *    is NUL-terminated in db->keys and contains no NUL.
 *  - A B+tree child is visited with expected height = parent height - 1, so
 *    recursion depth is at most 255 and a reference cycle fails the height
 *    check; a node reached twice (a DAG) re-emits keys and fails the strict
 *    key-order check.  Either way the walk ends.
 *  - Every count read from input is checked against the bytes left before
 *    anything is allocated for it.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "common.h"
#include "crc32c.h"
#include "ocdbt.h"
#include "pool.h"
#include "stats.h"
#include "store.h"
#include "store_int.h"

#define MAGIC_MANIFEST 0x0cdb3a2au
#define MAGIC_BTREE 0x0cdb20deu

#define ENVELOPE_MIN 18u /* magic + length + 2 varints + crc */
#define MANIFEST_MAX_BYTES ((uint64_t)64 << 20) /* encoded and decoded manifest */
#define NODE_MAX_BYTES ((uint64_t)256 << 20) /* decoded node, whatever the config says */
#define INDEX_MAX_BYTES ((uint64_t)2 << 30) /* keys + inline values + entries */
#define KEY_MAX 65536u /* longest full key accepted */
#define FILE_PATH_MAX 4000u /* longest data-file path (relative) */
#define TABLE_MAX_BYTES ((uint64_t)16 << 20) /* materialized paths of one table */
#define NODE_MAX_ENTRIES 1048576u
#define MAX_NODES ((size_t)1 << 24)

struct lim {
	uint64_t node_bytes; /* hard cap on a decoded node */
	uint64_t index_bytes; /* cap on the whole index */
};

static const struct lim default_lim = { NODE_MAX_BYTES, INDEX_MAX_BYTES };
static const struct lim fuzz_lim = { (uint64_t)16 << 20, (uint64_t)64 << 20 };

/* ---------------------------------------------------------------- errors */

struct perr {
	char msg[320];
};

static int fail(struct perr *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(struct perr *e, const char *fmt, ...)
{
	if (e->msg[0] == '\0') {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
		va_end(ap);
	}
	return -EIO;
}

/* ---------------------------------------------------------------- reader */

struct rd {
	const uint8_t *p, *end;
};

static size_t rd_left(const struct rd *r)
{
	return (size_t)(r->end - r->p);
}

static int rd_varint(struct rd *r, struct perr *e, const char *what, uint64_t *v)
{
	uint64_t x = 0;
	*v = 0; /* defined on failure too (gcc -O2 cannot see that fail() never returns 0) */
	for (unsigned i = 0; i < 10; i++) {
		if (r->p >= r->end)
			return fail(e, "truncated %s", what);
		uint8_t b = *r->p++;
		if (i == 9 && b > 1)
			return fail(e, "varint %s overflows 64 bits", what);
		x |= (uint64_t)(b & 0x7f) << (7 * i);
		if (!(b & 0x80)) {
			*v = x;
			return 0;
		}
	}
	return fail(e, "varint %s overflows 64 bits", what); /* not reached */
}

static int rd_u8(struct rd *r, struct perr *e, const char *what, uint8_t *v)
{
	if (r->p >= r->end)
		return fail(e, "truncated %s", what);
	*v = *r->p++;
	return 0;
}

static int rd_bytes(struct rd *r, struct perr *e, const char *what, uint64_t n, const uint8_t **out)
{
	if (n > rd_left(r))
		return fail(e, "%s of %llu bytes exceeds the %zu bytes left", what, (unsigned long long)n,
			    rd_left(r));
	*out = r->p;
	r->p += n;
	return 0;
}

/* Read n varints into v[] (caller checked n against the bytes left). */
static int rd_varints(struct rd *r, struct perr *e, const char *what, uint64_t *v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		int rc = rd_varint(r, e, what, &v[i]);
		if (rc)
			return rc;
	}
	return 0;
}

/* Read a count and check that `min_each` bytes per element can follow. */
static int rd_count(struct rd *r, struct perr *e, const char *what, uint64_t max, size_t min_each,
		    uint64_t *n)
{
	int rc = rd_varint(r, e, what, n);
	if (rc)
		return rc;
	if (*n > max)
		return fail(e, "%s %llu exceeds the maximum %llu", what, (unsigned long long)*n,
			    (unsigned long long)max);
	if (min_each && *n > rd_left(r) / min_each)
		return fail(e, "%s %llu larger than the %zu bytes left allow", what, (unsigned long long)*n,
			    rd_left(r));
	return 0;
}

/* ---------------------------------------------------------------- envelope */

static int zstd_decode(struct perr *e, const uint8_t *src, size_t n, uint64_t cap, uint8_t **out,
		       size_t *out_len)
{
	/* Grow the output progressively so that a small frame claiming a huge
	 * size never makes us allocate it; one byte beyond cap detects excess. */
	size_t limit = (size_t)cap + 1;
	size_t size = n < ((size_t)1 << 20) ? 4 * n + 256 : 2 * n;
	unsigned long long fcs = ZSTD_getFrameContentSize(src, n);
	if (fcs != ZSTD_CONTENTSIZE_UNKNOWN && fcs != ZSTD_CONTENTSIZE_ERROR && fcs < cap)
		size = (size_t)fcs + 1;
	if (size > limit)
		size = limit;
	uint8_t *buf = malloc(size);
	ZSTD_DStream *ds = ZSTD_createDStream();
	int rc = 0;
	if (!buf || !ds) {
		rc = -ENOMEM;
		goto out;
	}
	ZSTD_initDStream(ds);
	/* Bound the window zstd may allocate by the cap too: at least 2^24
	 * (enough for every level <= 19), at most zstd's default 2^27. */
	int wlog = 24;
	while (wlog < 27 && ((uint64_t)1 << wlog) < cap)
		wlog++;
	ZSTD_DCtx_setParameter(ds, ZSTD_d_windowLogMax, wlog);
	ZSTD_inBuffer in = { src, n, 0 };
	ZSTD_outBuffer ob = { buf, size, 0 };
	for (;;) {
		if (ob.pos == ob.size) {
			if (ob.size >= limit) {
				rc = fail(e, "decoded size exceeds the limit of %llu bytes",
					  (unsigned long long)cap);
				goto out;
			}
			size_t ns = ob.size > limit / 2 ? limit : ob.size * 2;
			uint8_t *nb = realloc(buf, ns);
			if (!nb) {
				rc = -ENOMEM;
				goto out;
			}
			buf = nb;
			ob.dst = buf;
			ob.size = ns;
		}
		size_t ret = ZSTD_decompressStream(ds, &ob, &in);
		if (ZSTD_isError(ret)) {
			rc = fail(e, "zstd: %s", ZSTD_getErrorName(ret));
			goto out;
		}
		if (ret == 0) {
			if (in.pos != in.size) {
				rc = fail(e, "%zu trailing bytes after the zstd frame", in.size - in.pos);
				goto out;
			}
			break;
		}
		if (in.pos == in.size && ob.pos < ob.size) {
			rc = fail(e, "truncated zstd frame");
			goto out;
		}
	}
	if (ob.pos > cap) {
		rc = fail(e, "decoded size exceeds the limit of %llu bytes", (unsigned long long)cap);
		goto out;
	}
	*out = buf;
	*out_len = ob.pos;
	buf = NULL;
out:
	free(buf);
	ZSTD_freeDStream(ds);
	return rc;
}

/*
 * Check magic, length, CRC, version, compression; return the body.  *owned is
 * set when the body was decompressed (caller frees), else the body points
 * into buf.
 */
static int envelope_decode(struct perr *e, const uint8_t *buf, size_t len, uint32_t magic, uint64_t cap,
			   uint8_t **owned, const uint8_t **body, size_t *body_len)
{
	*owned = NULL;
	if (len < ENVELOPE_MIN)
		return fail(e, "%zu bytes is too short for an envelope", len);
	uint32_t m = (uint32_t)buf[0] << 24 | (uint32_t)buf[1] << 16 | (uint32_t)buf[2] << 8 | buf[3];
	if (m != magic)
		return fail(e, "bad magic 0x%08x (expected 0x%08x)", m, magic);
	uint64_t l = ckpt_le64(buf + 4);
	if (l != len)
		return fail(e, "envelope length %llu but %zu bytes stored", (unsigned long long)l, len);
	uint32_t want = ckpt_le32(buf + len - 4);
	uint32_t got = ckpt_crc32c(0, buf, len - 4);
	if (want != got)
		return fail(e, "CRC-32C mismatch (stored 0x%08x, computed 0x%08x)", want, got);
	struct rd r = { buf + 12, buf + len - 4 };
	uint64_t version, comp;
	int rc = rd_varint(&r, e, "format version", &version);
	if (!rc)
		rc = rd_varint(&r, e, "compression format", &comp);
	if (rc)
		return rc;
	if (version != 0)
		return fail(e, "unsupported format version %llu", (unsigned long long)version);
	if (comp == 0) {
		if (rd_left(&r) > cap)
			return fail(e, "body of %zu bytes exceeds the limit of %llu bytes", rd_left(&r),
				    (unsigned long long)cap);
		*body = r.p;
		*body_len = rd_left(&r);
		return 0;
	}
	if (comp != 1)
		return fail(e, "unknown compression format %llu", (unsigned long long)comp);
	size_t n = 0;
	rc = zstd_decode(e, r.p, rd_left(&r), cap, owned, &n);
	if (rc)
		return rc;
	*body = *owned;
	*body_len = n;
	return 0;
}

/* ---------------------------------------------------------------- handle */

struct ofile {
	char *abs; /* root "/" rel, for messages */
	const char *rel; /* points into abs: the key in db->base */
	uint32_t rel_len;
	/* size cache, guarded by db->mu */
	bool sized; /* size valid (files are immutable) */
	uint64_t size;
};

struct ent {
	uint64_t koff; /* into db->keys */
	uint64_t voff; /* into db->vals (inline) or the data file */
	uint64_t size;
	uint32_t klen;
	uint32_t file; /* FILE_INLINE or index into db->files */
};
#define FILE_INLINE UINT32_MAX
/* A data file table entry with an empty path: TensorStore writes one for
 * the empty B+tree of a database's first generation (a merged Orbax 0.4 /
 * 0.5 manifest keeps it in its version list).  Nothing may be read from it. */
#define FILE_NONE (UINT32_MAX - 1)

struct ckpt_ocdbt {
	char *root; /* for messages */
	size_t root_len;
	struct lim lim;
	ckpt_store *base; /* one reference; NULL only for the fuzzing entry */
	ckpt_pool *pool; /* B+tree node prefetch at open (not owned), or NULL */
	ckpt_pool *own_pool; /* else this open's own, stopped when the open ends */
	bool own_pool_failed;

	struct ofile *files;
	size_t nfiles, capfiles;
	uint64_t file_bytes; /* memory held by the interned paths */
	uint32_t *fhash; /* open addressing: index + 1, 0 = empty */
	size_t fhcap;

	struct ent *ents;
	size_t nents, capents;
	char *keys;
	size_t nkeys, capkeys;
	uint8_t *vals;
	size_t nvals, capvals;

	int height;
	size_t nodes;
	size_t skipped_nul;

	pthread_mutex_t mu;
};

static int grow(void **buf, size_t *cap, size_t need, size_t elem)
{
	if (need <= *cap)
		return 0;
	size_t nc = *cap ? *cap : 16;
	while (nc < need) {
		if (nc > SIZE_MAX / 4 / elem)
			return -ENOMEM;
		nc *= 2;
	}
	void *p = realloc(*buf, nc * elem);
	if (!p)
		return -ENOMEM;
	*buf = p;
	*cap = nc;
	return 0;
}

static uint64_t index_bytes(const ckpt_ocdbt *db)
{
	return (uint64_t)db->nkeys + db->nvals + (uint64_t)db->nents * sizeof(struct ent) + db->file_bytes;
}

static uint64_t hash_bytes(const char *s, size_t n)
{
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
	return h;
}

/* Intern a data-file path (relative to the item folder); *gid = its index. */
static int file_intern(ckpt_ocdbt *db, struct perr *e, const char *rel, size_t n, uint32_t *gid)
{
	if (db->fhcap == 0 || (db->nfiles + 1) * 2 > db->fhcap) {
		size_t nc = db->fhcap ? db->fhcap * 2 : 64;
		uint32_t *nh = calloc(nc, sizeof(*nh));
		if (!nh)
			return -ENOMEM;
		for (size_t i = 0; i < db->nfiles; i++) {
			uint64_t h = hash_bytes(db->files[i].rel, db->files[i].rel_len) & (nc - 1);
			while (nh[h])
				h = (h + 1) & (nc - 1);
			nh[h] = (uint32_t)i + 1;
		}
		free(db->fhash);
		db->fhash = nh;
		db->fhcap = nc;
	}
	uint64_t h = hash_bytes(rel, n) & (db->fhcap - 1);
	while (db->fhash[h]) {
		struct ofile *f = &db->files[db->fhash[h] - 1];
		if (f->rel_len == n && memcmp(f->rel, rel, n) == 0) {
			*gid = db->fhash[h] - 1;
			return 0;
		}
		h = (h + 1) & (db->fhcap - 1);
	}
	if (db->nfiles >= UINT32_MAX - 1)
		return fail(e, "too many data files");
	uint64_t add = db->root_len + n + 2 + sizeof(struct ofile) + 2 * sizeof(uint32_t);
	if (index_bytes(db) + add > db->lim.index_bytes)
		return fail(e, "index exceeds %llu bytes", (unsigned long long)db->lim.index_bytes);
	db->file_bytes += add;
	int rc = grow((void **)&db->files, &db->capfiles, db->nfiles + 1, sizeof(*db->files));
	if (rc)
		return rc;
	char *abs = malloc(db->root_len + 1 + n + 1);
	if (!abs)
		return -ENOMEM;
	memcpy(abs, db->root, db->root_len);
	abs[db->root_len] = '/';
	memcpy(abs + db->root_len + 1, rel, n);
	abs[db->root_len + 1 + n] = '\0';
	struct ofile *f = &db->files[db->nfiles];
	memset(f, 0, sizeof(*f));
	f->abs = abs;
	f->rel = abs + db->root_len + 1;
	f->rel_len = (uint32_t)n;
	db->fhash[h] = (uint32_t)db->nfiles + 1;
	*gid = (uint32_t)db->nfiles++;
	return 0;
}

/* A data-file path must stay inside the item folder. */
static int check_rel_path(struct perr *e, const char *p, size_t n)
{
	if (n == 0)
		return fail(e, "empty data file path");
	if (n > FILE_PATH_MAX)
		return fail(e, "data file path of %zu bytes is too long", n);
	if (p[0] == '/')
		return fail(e, "absolute data file path");
	if (memchr(p, '\0', n))
		return fail(e, "NUL byte in a data file path");
	if (p[n - 1] == '/')
		return fail(e, "data file path ends with '/'");
	size_t i = 0;
	while (i < n) {
		size_t j = i;
		while (j < n && p[j] != '/')
			j++;
		if (j - i == 2 && p[i] == '.' && p[i + 1] == '.')
			return fail(e, "data file path has a '..' component");
		i = j + 1;
	}
	return 0;
}

/* ---------------------------------------------------------------- data files */

/* Size of data file gid (cached: files are immutable).  A missing file is
 * corrupt data (-EIO); other failures pass through. */
static int file_size(ckpt_ocdbt *db, uint32_t gid, uint64_t *size)
{
	struct ofile *f = &db->files[gid];
	pthread_mutex_lock(&db->mu);
	bool sized = f->sized;
	*size = f->size;
	pthread_mutex_unlock(&db->mu);
	if (sized)
		return 0;
	uint64_t n = 0;
	int rc = ckpt_store_size(db->base, f->rel, &n);
	if (rc) {
		ckpt_log(CKPT_LOG_ERR, "ocdbt: %s: cannot open data file: %s", f->abs, strerror(-rc));
		return rc == -ENOENT || rc == -ENOTDIR ? -EIO : rc;
	}
	pthread_mutex_lock(&db->mu);
	if (!f->sized) {
		f->size = n;
		f->sized = true;
	}
	*size = f->size;
	pthread_mutex_unlock(&db->mu);
	return 0;
}

/* Read exactly len bytes at off of data file gid (no stats counted). */
static int file_read(ckpt_ocdbt *db, uint32_t gid, void *dst, size_t len, uint64_t off, size_t *got)
{
	const struct ofile *f = &db->files[gid];
	size_t done = 0;
	*got = 0;
	while (done < len) {
		ssize_t n =
			ckpt_store_read_raw(db->base, f->rel, off + done, len - done, (uint8_t *)dst + done);
		if (n < 0) {
			*got = done;
			return (int)n;
		}
		if (n == 0)
			break;
		done += (size_t)n;
	}
	*got = done;
	return 0;
}

/* ---------------------------------------------------------------- data file table */

struct dft_entry {
	uint32_t gid; /* interned full path */
	uint32_t trans_len; /* transitive path length for nodes reached through it */
};

struct dft {
	size_t n;
	struct dft_entry *e;
};

/*
 * Parse a data file table.  Paths are relative to the database root plus
 * `trans` (the transitive path); each entry's full path is trans + path, and
 * a node reached through it has transitive path trans + base_path.
 */
static int parse_table(ckpt_ocdbt *db, struct rd *r, struct perr *e, const char *trans, size_t trans_len,
		       struct dft *t)
{
	uint64_t n;
	t->n = 0;
	t->e = NULL;
	int rc = rd_count(r, e, "data file count", UINT32_MAX - 1, 2, &n);
	if (rc || n == 0)
		return rc;
	uint64_t *v = malloc(3 * n * sizeof(uint64_t));
	char *path = malloc(trans_len + 65536 + 1);
	t->e = calloc(n, sizeof(*t->e));
	if (!v || !path || !t->e) {
		rc = -ENOMEM;
		goto out;
	}
	uint64_t *pre = v, *suf = v + n, *base = v + 2 * n;
	pre[0] = 0;
	rc = rd_varints(r, e, "path prefix length", pre + 1, n - 1);
	if (!rc)
		rc = rd_varints(r, e, "path suffix length", suf, n);
	if (!rc)
		rc = rd_varints(r, e, "base path length", base, n);
	if (rc)
		goto out;
	memcpy(path, trans, trans_len);
	uint64_t plen = 0, total = 0;
	for (uint64_t i = 0; i < n; i++) {
		if (pre[i] > plen) {
			rc = fail(
				e, "data file %llu: prefix length %llu exceeds the previous path length %llu",
				(unsigned long long)i, (unsigned long long)pre[i], (unsigned long long)plen);
			goto out;
		}
		const uint8_t *s = NULL;
		rc = rd_bytes(r, e, "data file path suffix", suf[i], &s);
		if (rc)
			goto out;
		if (pre[i] + suf[i] > 65535) {
			rc = fail(e, "data file %llu: path longer than 65535 bytes", (unsigned long long)i);
			goto out;
		}
		plen = pre[i] + suf[i];
		total += plen;
		if (total > TABLE_MAX_BYTES) {
			rc = fail(e, "data file table paths exceed %llu bytes",
				  (unsigned long long)TABLE_MAX_BYTES);
			goto out;
		}
		memcpy(path + trans_len + pre[i], s, suf[i]);
		if (base[i] > plen) {
			rc = fail(e, "data file %llu: base path length %llu exceeds the path length %llu",
				  (unsigned long long)i, (unsigned long long)base[i],
				  (unsigned long long)plen);
			goto out;
		}
		size_t full = trans_len + plen;
		t->e[i].trans_len = (uint32_t)(trans_len + base[i]);
		if (plen == 0) {
			t->e[i].gid = FILE_NONE; /* refused where a reference uses it */
			continue;
		}
		rc = check_rel_path(e, path, full);
		if (rc)
			goto out;
		rc = file_intern(db, e, path, full, &t->e[i].gid);
		if (rc)
			goto out;
	}
	t->n = n;
out:
	free(v);
	free(path);
	if (rc) {
		free(t->e);
		t->e = NULL;
		t->n = 0;
	}
	return rc;
}

/* ---------------------------------------------------------------- manifest */

struct manifest {
	uint64_t kind;
	uint64_t max_inline;
	uint64_t max_decoded;
	uint8_t arity_log2;
	bool has_versions;
	bool empty;
	uint8_t height;
	uint32_t gid; /* root node file */
	uint32_t trans_len; /* its transitive path length */
	uint64_t off, len;
	uint64_t generation;
};

static int parse_config(struct rd *r, struct perr *e, struct manifest *m)
{
	const uint8_t *uuid;
	uint64_t comp;
	int rc = rd_bytes(r, e, "uuid", 16, &uuid);
	if (!rc)
		rc = rd_varint(r, e, "manifest kind", &m->kind);
	if (!rc)
		rc = rd_varint(r, e, "max_inline_value_bytes", &m->max_inline);
	if (!rc)
		rc = rd_varint(r, e, "max_decoded_node_bytes", &m->max_decoded);
	if (!rc)
		rc = rd_u8(r, e, "version_tree_arity_log2", &m->arity_log2);
	if (!rc)
		rc = rd_varint(r, e, "compression method", &comp);
	if (rc)
		return rc;
	if (m->kind > 1)
		return fail(e, "unknown manifest kind %llu", (unsigned long long)m->kind);
	if (m->arity_log2 < 1 || m->arity_log2 > 16)
		return fail(e, "version_tree_arity_log2 %u out of range", m->arity_log2);
	if (comp == 1) {
		const uint8_t *lvl;
		rc = rd_bytes(r, e, "zstd level", 4, &lvl);
	} else if (comp != 0) {
		rc = fail(e, "unknown compression method %llu", (unsigned long long)comp);
	}
	return rc;
}

#define REF_MISSING UINT64_MAX

/* Parse a manifest body.  `numbered_file`: the body comes from a
 * manifest.<hex> file and must carry versions whatever its kind. */
static int parse_manifest_body(ckpt_ocdbt *db, struct perr *e, const uint8_t *body, size_t len,
			       const char *trans, size_t trans_len, bool numbered_file, struct manifest *m)
{
	struct rd r = { body, body + len };
	struct dft t = { 0, NULL };
	uint64_t *v = NULL;
	memset(m, 0, sizeof(*m));
	int rc = parse_config(&r, e, m);
	if (rc)
		return rc;
	if (m->kind == 1 && !numbered_file) {
		if (rd_left(&r))
			return fail(e, "%zu trailing bytes after a config-only manifest", rd_left(&r));
		return 0;
	}
	m->has_versions = true;
	rc = parse_table(db, &r, e, trans, trans_len, &t);
	if (rc)
		return rc;
	/* Leaf version entries, column-major, >= 16 bytes each. */
	uint64_t n;
	rc = rd_count(&r, e, "version count", UINT32_MAX, 16, &n);
	if (rc)
		goto out;
	v = malloc((n ? n : 1) * 8 * sizeof(uint64_t));
	if (!v) {
		rc = -ENOMEM;
		goto out;
	}
	uint64_t *gen = v, *fid = v + n, *off = v + 2 * n, *ln = v + 3 * n, *stats = v + 4 * n;
	const uint8_t *heights = NULL, *times;
	rc = rd_varints(&r, e, "generation number", gen, n);
	if (!rc)
		rc = rd_bytes(&r, e, "root heights", n, &heights);
	if (!rc)
		rc = rd_varints(&r, e, "root data file id", fid, n);
	if (!rc)
		rc = rd_varints(&r, e, "root offset", off, n);
	if (!rc)
		rc = rd_varints(&r, e, "root length", ln, n);
	if (!rc)
		rc = rd_varints(&r, e, "version statistics", stats, 3 * n);
	if (!rc)
		rc = rd_bytes(&r, e, "commit times", 8 * n, &times);
	if (rc)
		goto out;
	for (uint64_t i = 0; i < n; i++) {
		if (gen[i] == 0 || (i && gen[i] <= gen[i - 1])) {
			rc = fail(e, "generation numbers not strictly increasing from 1");
			goto out;
		}
		bool missing = off[i] == REF_MISSING && ln[i] == REF_MISSING;
		if (missing)
			continue;
		if (fid[i] >= t.n) {
			rc = fail(e, "version %llu: data file id %llu out of range (%zu files)",
				  (unsigned long long)gen[i], (unsigned long long)fid[i], t.n);
			goto out;
		}
		uint64_t end;
		if (ckpt_add_u64(off[i], ln[i], &end)) {
			rc = fail(e, "version %llu: offset + length overflows", (unsigned long long)gen[i]);
			goto out;
		}
	}
	/* Interior version-tree entries (ignored beyond validation). */
	uint64_t mcount;
	rc = rd_count(&r, e, "version node count", UINT32_MAX, 14, &mcount);
	if (rc)
		goto out;
	for (int col = 0; col < 5 && !rc; col++) {
		for (uint64_t i = 0; i < mcount && !rc; i++) {
			uint64_t x;
			rc = rd_varint(&r, e, "version node reference", &x);
			if (!rc && col == 1 && x >= t.n)
				rc = fail(e, "version node data file id %llu out of range",
					  (unsigned long long)x);
		}
	}
	const uint8_t *skip;
	if (!rc)
		rc = rd_bytes(&r, e, "version node commit times", 8 * mcount, &skip);
	if (!rc)
		rc = rd_bytes(&r, e, "version node heights", mcount, &skip);
	if (rc)
		goto out;
	if (rd_left(&r)) {
		rc = fail(e, "%zu trailing bytes after the manifest", rd_left(&r));
		goto out;
	}
	if (n == 0) {
		if (mcount) {
			rc = fail(e, "latest version only in version-tree nodes (unsupported)");
			goto out;
		}
		m->empty = true;
		goto out;
	}
	m->generation = gen[n - 1];
	m->height = heights[n - 1];
	if (off[n - 1] == REF_MISSING && ln[n - 1] == REF_MISSING) {
		m->empty = true;
		goto out;
	}
	if (t.e[fid[n - 1]].gid == FILE_NONE) {
		rc = fail(e, "the latest version's root node is in a data file with an empty path");
		goto out;
	}
	m->gid = t.e[fid[n - 1]].gid;
	m->trans_len = t.e[fid[n - 1]].trans_len;
	m->off = off[n - 1];
	m->len = ln[n - 1];
out:
	free(v);
	free(t.e);
	return rc;
}

/* ---------------------------------------------------------------- B+tree node */

struct node {
	uint8_t height;
	struct dft tab;
	size_t n;
	uint8_t *kbuf; /* relative keys, concatenated */
	uint64_t *koff; /* n + 1 offsets into kbuf */
	uint64_t *scp; /* interior: subtree common prefix lengths */
	uint64_t *fid; /* leaf: local file id or REF_MISSING (inline); interior: child file */
	uint64_t *off; /* leaf: data file offset or offset into body; interior: child offset */
	uint64_t *len; /* value length / child length */
	uint64_t *mem; /* backing of the arrays above */
};

static void btree_node_free(struct node *nd)
{
	free(nd->tab.e);
	free(nd->kbuf);
	free(nd->koff);
	free(nd->mem);
	memset(nd, 0, sizeof(*nd));
}

static int key_cmp(const uint8_t *a, size_t an, const uint8_t *b, size_t bn)
{
	int c = memcmp(a, b, an < bn ? an : bn);
	if (c)
		return c;
	return an < bn ? -1 : an > bn ? 1 : 0;
}

/*
 * Parse a B+tree node body.  Inline leaf values stay in `body`: off[i] is
 * their offset from body (body must outlive the use of nd).
 */
static int parse_node_body(ckpt_ocdbt *db, struct perr *e, const uint8_t *body, size_t blen,
			   const char *trans, size_t trans_len, uint64_t key_budget, struct node *nd)
{
	struct rd r = { body, body + blen };
	memset(nd, 0, sizeof(*nd));
	int rc = rd_u8(&r, e, "node height", &nd->height);
	if (!rc)
		rc = parse_table(db, &r, e, trans, trans_len, &nd->tab);
	uint64_t n;
	if (!rc)
		rc = rd_count(&r, e, "entry count", NODE_MAX_ENTRIES, 3, &n);
	if (rc)
		goto out;
	if (n == 0) {
		rc = fail(e, "node with no entries");
		goto out;
	}
	nd->n = n;
	bool leaf = nd->height == 0;
	/* pre, suf, scp, fid, off, len */
	nd->mem = malloc(6 * n * sizeof(uint64_t));
	nd->koff = malloc((n + 1) * sizeof(uint64_t));
	if (!nd->mem || !nd->koff) {
		rc = -ENOMEM;
		goto out;
	}
	uint64_t *pre = nd->mem, *suf = pre + n;
	nd->scp = suf + n;
	nd->fid = nd->scp + n;
	nd->off = nd->fid + n;
	nd->len = nd->off + n;
	pre[0] = 0;
	rc = rd_varints(&r, e, "key prefix length", pre + 1, n - 1);
	if (!rc)
		rc = rd_varints(&r, e, "key suffix length", suf, n);
	if (!rc && !leaf)
		rc = rd_varints(&r, e, "subtree common prefix length", nd->scp, n);
	if (rc)
		goto out;
	/* Key lengths and the materialized size, before touching key bytes. */
	uint64_t prev = 0, total = 0, suf_total = 0;
	for (uint64_t i = 0; i < n; i++) {
		if (pre[i] > prev) {
			rc = fail(
				e, "entry %llu: key prefix length %llu exceeds the previous key length %llu",
				(unsigned long long)i, (unsigned long long)pre[i], (unsigned long long)prev);
			goto out;
		}
		if (suf[i] > KEY_MAX || pre[i] + suf[i] > KEY_MAX) {
			rc = fail(e, "entry %llu: key longer than %u bytes", (unsigned long long)i, KEY_MAX);
			goto out;
		}
		prev = pre[i] + suf[i];
		if (!leaf && nd->scp[i] > prev) {
			rc = fail(e,
				  "entry %llu: subtree common prefix length %llu exceeds the key length %llu",
				  (unsigned long long)i, (unsigned long long)nd->scp[i],
				  (unsigned long long)prev);
			goto out;
		}
		nd->koff[i] = total;
		total += prev;
		suf_total += suf[i];
	}
	nd->koff[n] = total;
	if (suf_total > rd_left(&r)) {
		rc = fail(e, "key suffixes of %llu bytes exceed the %zu bytes left",
			  (unsigned long long)suf_total, rd_left(&r));
		goto out;
	}
	if (total > key_budget) {
		rc = fail(e, "keys of %llu bytes exceed the limit of %llu", (unsigned long long)total,
			  (unsigned long long)key_budget);
		goto out;
	}
	nd->kbuf = malloc(total ? total : 1);
	if (!nd->kbuf) {
		rc = -ENOMEM;
		goto out;
	}
	for (uint64_t i = 0; i < n; i++) {
		uint8_t *k = nd->kbuf + nd->koff[i];
		if (pre[i])
			memcpy(k, nd->kbuf + nd->koff[i - 1], pre[i]);
		memcpy(k + pre[i], r.p, suf[i]);
		r.p += suf[i];
		if (i && key_cmp(nd->kbuf + nd->koff[i - 1], nd->koff[i] - nd->koff[i - 1], k,
				 nd->koff[i + 1] - nd->koff[i]) >= 0) {
			rc = fail(e, "entry %llu: keys not strictly increasing", (unsigned long long)i);
			goto out;
		}
	}
	if (leaf) {
		rc = rd_varints(&r, e, "value length", nd->len, n);
		if (rc)
			goto out;
		for (uint64_t i = 0; i < n; i++) {
			uint64_t kind;
			rc = rd_varint(&r, e, "value kind", &kind);
			if (rc)
				goto out;
			if (kind > 1) {
				rc = fail(e, "entry %llu: unknown value kind %llu", (unsigned long long)i,
					  (unsigned long long)kind);
				goto out;
			}
			nd->fid[i] = kind ? 0 : REF_MISSING;
		}
		/* file ids, then offsets, of out-of-line entries in entry order */
		for (int col = 0; col < 2; col++) {
			for (uint64_t i = 0; i < n; i++) {
				if (nd->fid[i] == REF_MISSING)
					continue;
				uint64_t x;
				rc = rd_varint(&r, e, col ? "value offset" : "value data file id", &x);
				if (rc)
					goto out;
				if (col == 0) {
					if (x >= nd->tab.n) {
						rc = fail(e,
							  "entry %llu: data file id %llu out of range (%zu "
							  "files)",
							  (unsigned long long)i, (unsigned long long)x,
							  nd->tab.n);
						goto out;
					}
					nd->fid[i] = x;
				} else {
					uint64_t end;
					if (ckpt_add_u64(x, nd->len[i], &end)) {
						rc = fail(e, "entry %llu: value offset + length overflows",
							  (unsigned long long)i);
						goto out;
					}
					nd->off[i] = x;
				}
			}
		}
		for (uint64_t i = 0; i < n; i++) {
			if (nd->fid[i] != REF_MISSING)
				continue;
			const uint8_t *p = NULL;
			rc = rd_bytes(&r, e, "inline value", nd->len[i], &p);
			if (rc)
				goto out;
			nd->off[i] = (uint64_t)(p - body);
		}
	} else {
		rc = rd_varints(&r, e, "child data file id", nd->fid, n);
		if (!rc)
			rc = rd_varints(&r, e, "child offset", nd->off, n);
		if (!rc)
			rc = rd_varints(&r, e, "child length", nd->len, n);
		if (rc)
			goto out;
		for (uint64_t i = 0; i < n; i++) {
			uint64_t end;
			if (nd->fid[i] >= nd->tab.n) {
				rc = fail(e, "entry %llu: child data file id %llu out of range (%zu files)",
					  (unsigned long long)i, (unsigned long long)nd->fid[i], nd->tab.n);
				goto out;
			}
			if (ckpt_add_u64(nd->off[i], nd->len[i], &end)) {
				rc = fail(e, "entry %llu: child offset + length overflows",
					  (unsigned long long)i);
				goto out;
			}
		}
		/* statistics: num_keys, num_tree_bytes, num_indirect_value_bytes */
		for (uint64_t i = 0; i < 3 * n && !rc; i++) {
			uint64_t x;
			rc = rd_varint(&r, e, "child statistics", &x);
		}
		if (rc)
			goto out;
	}
	if (rd_left(&r))
		rc = fail(e, "%zu trailing bytes after the node", rd_left(&r));
out:
	if (rc)
		btree_node_free(nd);
	return rc;
}

/* ---------------------------------------------------------------- tree walk */

struct walk {
	const char *dbname; /* for messages: the database folder */
	size_t first_ent; /* first entry of this database */
	uint64_t node_cap;
};

/* Append one index entry for the full key k. */
static int emit(ckpt_ocdbt *db, struct perr *e, struct walk *w, const uint8_t *k, size_t klen, uint64_t size,
		uint32_t file, const uint8_t *inl, uint64_t voff)
{
	if (memchr(k, '\0', klen)) {
		db->skipped_nul++;
		return 0;
	}
	uint64_t add = klen + 1 + (inl ? size : 0) + sizeof(struct ent);
	if (index_bytes(db) + add > db->lim.index_bytes)
		return fail(e, "index exceeds %llu bytes", (unsigned long long)db->lim.index_bytes);
	/* strict order across the whole database */
	if (db->nents > w->first_ent) {
		const struct ent *last = &db->ents[db->nents - 1];
		if (key_cmp((const uint8_t *)db->keys + last->koff, last->klen, k, klen) >= 0)
			return fail(e, "key order violated across nodes (a shared or misplaced subtree)");
	}
	int rc = grow((void **)&db->ents, &db->capents, db->nents + 1, sizeof(struct ent));
	if (!rc)
		rc = grow((void **)&db->keys, &db->capkeys, db->nkeys + klen + 1, 1);
	if (!rc && inl)
		rc = grow((void **)&db->vals, &db->capvals, db->nvals + size, 1);
	if (rc)
		return rc;
	struct ent *en = &db->ents[db->nents++];
	en->koff = db->nkeys;
	en->klen = (uint32_t)klen;
	memcpy(db->keys + db->nkeys, k, klen);
	db->keys[db->nkeys + klen] = '\0';
	db->nkeys += klen + 1;
	en->size = size;
	en->file = file;
	if (inl) {
		if (size)
			memcpy(db->vals + db->nvals, inl, size);
		en->voff = db->nvals;
		db->nvals += size;
	} else {
		en->voff = voff;
	}
	return 0;
}

/* Read and decode the node at (gid, off, len); *owned / *raw freed by caller.
 * pre: the node's bytes already fetched (len bytes, taken over), or NULL. */
static int read_node(ckpt_ocdbt *db, struct perr *e, uint32_t gid, uint64_t off, uint64_t len, uint64_t cap,
		     uint8_t *pre, uint8_t **raw, uint8_t **owned, const uint8_t **body, size_t *blen)
{
	uint64_t fsize;
	*raw = pre;
	*owned = NULL;
	if (db->nodes >= MAX_NODES)
		return fail(e, "more than %zu B+tree nodes", MAX_NODES);
	int rc = file_size(db, gid, &fsize);
	if (rc)
		return rc;
	uint64_t end = off + len; /* overflow excluded by the parsers */
	if (end > fsize) {
		rc = fail(e, "node range ends at %llu, past the end of the data file (%llu bytes)",
			  (unsigned long long)end, (unsigned long long)fsize);
		goto out;
	}
	/* Encoded size can exceed the decoded cap only by zstd's framing. */
	if (len > cap + cap / 64 + 4096) {
		rc = fail(e, "node claims %llu bytes, over the limit of %llu", (unsigned long long)len,
			  (unsigned long long)cap);
		goto out;
	}
	size_t got = len;
	if (!pre) {
		*raw = malloc(len ? len : 1);
		if (!*raw) {
			rc = -ENOMEM;
			goto out;
		}
		rc = file_read(db, gid, *raw, len, off, &got);
	}
	if (rc) {
		rc = fail(e, "read: %s", strerror(-rc));
		goto out;
	}
	if (got != len) {
		rc = fail(e, "short read (%zu of %llu bytes)", got, (unsigned long long)len);
		goto out;
	}
	CKPT_STAT_ADD(backing_bytes_read, len);
	CKPT_STAT_ADD(backing_reads, 1);
	db->nodes++;
	rc = envelope_decode(e, *raw, len, MAGIC_BTREE, cap, owned, body, blen);
out:
	return rc;
}

/*
 * Children of an interior node fetched in parallel when the base store
 * serves several requests at once (ckpt_store_connections > 1; one request
 * per node otherwise runs one round trip after another): up to
 * PREFETCH_BATCH siblings at once as tasks of a pool, the one given at open
 * (the reader's decode threads) or else one started for this open only and
 * stopped when it ends; visit() then decodes them in order.  The visitor
 * runs every job of its batch that no worker has taken yet itself and
 * waits only for the jobs workers are running, so a batch never waits for a
 * busy worker (nor for none: a pool whose queue is full, or that is a
 * worker's own).  A batch lives until its last queued task has run (refs).
 * Only file_read (thread-safe; the data file table is not changed while
 * they run) is called from the tasks.
 */
#define PREFETCH_BATCH 16

enum { PRE_NONE, PRE_QUEUED, PRE_RUNNING, PRE_DONE };

struct pre_batch;

struct pre_job {
	struct pre_batch *b;
	ckpt_ocdbt *db;
	uint32_t gid;
	uint64_t off, len;
	uint8_t *buf; /* NULL when not fetched or the fetch failed (read_node then tries again) */
	atomic_int state; /* PRE_*: QUEUED -> RUNNING by whoever takes it, -> DONE under b->mu */
};

struct pre_batch {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	atomic_int refs; /* the visitor's, plus one per task in a pool's queue */
	struct pre_job jobs[PREFETCH_BATCH];
};

static void pre_fetch(struct pre_job *j)
{
	size_t got = 0;
	j->buf = malloc(j->len ? j->len : 1);
	if (j->buf && (file_read(j->db, j->gid, j->buf, j->len, j->off, &got) != 0 || got != j->len)) {
		free(j->buf);
		j->buf = NULL;
	}
}

static void batch_put(struct pre_batch *b)
{
	if (atomic_fetch_sub(&b->refs, 1) != 1)
		return;
	for (size_t k = 0; k < PREFETCH_BATCH; k++)
		free(b->jobs[k].buf); /* fetched, not visited (an earlier child failed) */
	pthread_mutex_destroy(&b->mu);
	pthread_cond_destroy(&b->cv);
	free(b);
}

/* Take job j (queued) and run it; 1 when this call ran it. */
static int pre_take(struct pre_job *j)
{
	int q = PRE_QUEUED;
	if (!atomic_compare_exchange_strong(&j->state, &q, PRE_RUNNING))
		return 0;
	pre_fetch(j);
	pthread_mutex_lock(&j->b->mu);
	atomic_store(&j->state, PRE_DONE);
	pthread_cond_broadcast(&j->b->cv);
	pthread_mutex_unlock(&j->b->mu);
	return 1;
}

static void pre_task(void *arg)
{
	struct pre_job *j = arg;
	struct pre_batch *b = j->b;
	pre_take(j);
	batch_put(b);
}

/* The pool prefetch tasks go to: the one given at open, else this open's own. */
static ckpt_pool *pre_pool(ckpt_ocdbt *db)
{
	if (db->pool)
		return db->pool;
	if (!db->own_pool && !db->own_pool_failed) {
		unsigned n = ckpt_store_connections(db->base);
		if (ckpt_pool_create(n < PREFETCH_BATCH ? (int)n : PREFETCH_BATCH, 4 * PREFETCH_BATCH,
				     &db->own_pool) != 0) {
			db->own_pool = NULL;
			db->own_pool_failed = true; /* every job then runs in the visitor */
		}
	}
	return db->own_pool;
}

/* Fetch children [i, i + n) of nd as one batch (n <= PREFETCH_BATCH): a
 * new batch, or NULL when out of memory (then nothing is prefetched). */
static struct pre_batch *pre_batch_run(ckpt_ocdbt *db, const struct node *nd, size_t i, size_t n,
				       uint64_t node_cap)
{
	struct pre_batch *b = calloc(1, sizeof(*b));
	if (!b)
		return NULL;
	pthread_mutex_init(&b->mu, NULL);
	pthread_cond_init(&b->cv, NULL);
	atomic_init(&b->refs, 1);
	ckpt_pool *pool = pre_pool(db);
	for (size_t k = 0; k < n; k++) {
		const struct dft_entry *ke = &nd->tab.e[nd->fid[i + k]];
		struct pre_job *j = &b->jobs[k];
		uint64_t fsz;
		j->b = b;
		j->db = db;
		j->gid = ke->gid;
		j->off = nd->off[i + k];
		j->len = nd->len[i + k];
		int want = ke->gid != FILE_NONE && nd->len[i + k] <= node_cap &&
			   file_size(db, ke->gid, &fsz) == 0 && nd->off[i + k] + nd->len[i + k] <= fsz;
		atomic_init(&j->state, want ? PRE_QUEUED : PRE_NONE);
	}
	for (size_t k = 0; pool && k < n; k++) {
		if (atomic_load(&b->jobs[k].state) != PRE_QUEUED)
			continue;
		atomic_fetch_add(&b->refs, 1);
		if (ckpt_pool_try_submit(pool, pre_task, &b->jobs[k]) != 0) {
			atomic_fetch_sub(&b->refs, 1); /* queue full: the visitor runs it */
			break;
		}
	}
	for (size_t k = 0; k < n; k++)
		pre_take(&b->jobs[k]);
	pthread_mutex_lock(&b->mu);
	for (size_t k = 0; k < n; k++)
		while (atomic_load(&b->jobs[k].state) == PRE_RUNNING)
			pthread_cond_wait(&b->cv, &b->mu);
	pthread_mutex_unlock(&b->mu);
	return b;
}

/*
 * Visit the subtree at (gid, off, len) whose keys all start with prefix P
 * and lie in [lo, hi) (full keys; lo/hi NULL = unbounded).
 */
static int visit(ckpt_ocdbt *db, struct walk *w, uint32_t gid, uint32_t trans_len, uint64_t off, uint64_t len,
		 uint8_t *pre, unsigned height, const uint8_t *P, size_t plen, const uint8_t *lo,
		 size_t lolen, const uint8_t *hi, size_t hilen)
{
	struct pre_batch *pb = NULL;
	size_t jfirst = 0, jn = 0; /* pb holds children [jfirst, jfirst + jn) */
	struct perr e = { { 0 } };
	uint8_t *raw = NULL, *owned = NULL, *kb = NULL, *nb = NULL;
	const uint8_t *body;
	size_t blen;
	struct node nd;
	memset(&nd, 0, sizeof(nd));
	char trans[FILE_PATH_MAX + 1];
	memcpy(trans, db->files[gid].rel, trans_len);
	trans[trans_len] = '\0';

	int rc = read_node(db, &e, gid, off, len, w->node_cap, pre, &raw, &owned, &body, &blen);
	if (!rc)
		rc = parse_node_body(db, &e, body, blen, trans, trans_len, w->node_cap, &nd);
	if (!rc && nd.height != height)
		rc = fail(&e, "node height %u, expected %u (cycle or malformed tree)", nd.height, height);
	if (rc)
		goto out;
	/* kb = P + rel[i] (the current full key), nb = P + rel[i+1] */
	size_t maxrel = 0;
	for (size_t i = 0; i < nd.n; i++)
		if (nd.koff[i + 1] - nd.koff[i] > maxrel)
			maxrel = nd.koff[i + 1] - nd.koff[i];
	if (plen + maxrel > KEY_MAX) {
		rc = fail(&e, "key longer than %u bytes", KEY_MAX);
		goto out;
	}
	kb = malloc(plen + maxrel + 1);
	nb = malloc(plen + maxrel + 1);
	if (!kb || !nb) {
		rc = -ENOMEM;
		goto out;
	}
	if (plen) {
		memcpy(kb, P, plen);
		memcpy(nb, P, plen);
	}
	for (size_t i = 0; i < nd.n && !rc; i++) {
		size_t rlen = nd.koff[i + 1] - nd.koff[i];
		size_t flen = plen + rlen;
		memcpy(kb + plen, nd.kbuf + nd.koff[i], rlen);
		if (lo && key_cmp(kb, flen, lo, lolen) < 0) {
			rc = fail(&e, "entry %zu: key below its subtree's lower bound", i);
			break;
		}
		if (hi && key_cmp(kb, flen, hi, hilen) >= 0) {
			rc = fail(&e, "entry %zu: key not below the next subtree's bound", i);
			break;
		}
		if (height == 0) {
			bool inl = nd.fid[i] == REF_MISSING;
			uint32_t vfile = inl ? FILE_INLINE : nd.tab.e[nd.fid[i]].gid;
			if (vfile == FILE_NONE) {
				rc = fail(&e, "entry %zu: value in a data file with an empty path", i);
				break;
			}
			rc = emit(db, &e, w, kb, flen, nd.len[i], vfile, inl ? body + nd.off[i] : NULL,
				  nd.off[i]);
			continue;
		}
		/* child: prefix P + rel[:scp], bounds [P + rel_i, P + rel_{i+1}) */
		const uint8_t *nhi = hi;
		size_t nhilen = hilen;
		if (i + 1 < nd.n) {
			nhilen = plen + nd.koff[i + 2] - nd.koff[i + 1];
			memcpy(nb + plen, nd.kbuf + nd.koff[i + 1], nhilen - plen);
			nhi = nb;
		}
		const struct dft_entry *ce = &nd.tab.e[nd.fid[i]];
		if (ce->gid == FILE_NONE) {
			rc = fail(&e, "entry %zu: child node in a data file with an empty path", i);
			break;
		}
		if (i >= jfirst + jn && nd.n > 1 && ckpt_store_connections(db->base) > 1) {
			/* the next batch of siblings, fetched at once */
			if (pb)
				batch_put(pb);
			jfirst = i;
			jn = nd.n - i < PREFETCH_BATCH ? nd.n - i : PREFETCH_BATCH;
			pb = pre_batch_run(db, &nd, i, jn, w->node_cap);
			if (!pb)
				jn = 0;
		}
		uint8_t *cpre = NULL;
		if (pb && i >= jfirst && i < jfirst + jn) {
			cpre = pb->jobs[i - jfirst].buf;
			pb->jobs[i - jfirst].buf = NULL;
		}
		rc = visit(db, w, ce->gid, ce->trans_len, nd.off[i], nd.len[i], cpre, height - 1, kb,
			   plen + nd.scp[i], kb, flen, nhi, nhilen);
		if (rc == -EIO)
			e.msg[0] = '\0'; /* already logged by the child */
	}
out:
	if (pb)
		batch_put(pb); /* frees what was fetched, not visited (an earlier child failed) */
	if (rc == -EIO && e.msg[0])
		ckpt_log(CKPT_LOG_ERR, "ocdbt: %s: B+tree node at offset %llu length %llu: %s",
			 db->files[gid].abs, (unsigned long long)off, (unsigned long long)len, e.msg);
	btree_node_free(&nd);
	free(kb);
	free(nb);
	free(owned);
	free(raw);
	return rc;
}

/* ---------------------------------------------------------------- open */

/* A whole small file of the database, by key relative to the item folder. */
static int read_file(ckpt_ocdbt *db, const char *key, uint64_t max, uint8_t **out, size_t *len)
{
	uint64_t size;
	int rc = ckpt_store_size(db->base, key, &size);
	if (rc)
		return rc;
	if (size > max)
		return -EFBIG;
	uint8_t *buf = malloc((size_t)size + 1);
	if (!buf)
		return -ENOMEM;
	size_t done = 0;
	while (done < size) {
		ssize_t n = ckpt_store_read_raw(db->base, key, done, (size_t)size - done, buf + done);
		if (n < 0) {
			free(buf);
			return (int)n;
		}
		if (n == 0)
			break;
		done += (size_t)n;
	}
	if (done != size) {
		free(buf);
		return -EIO;
	}
	*out = buf;
	*len = done;
	CKPT_STAT_ADD(backing_bytes_read, done);
	CKPT_STAT_ADD(backing_reads, 1);
	return 0;
}

static int is_hex16(const char *s)
{
	for (int i = 0; i < 16; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return 0;
	return s[16] == '\0';
}

/* Load and parse one manifest file of the database at dbdir. */
static int load_manifest(ckpt_ocdbt *db, const char *key, const char *path, const char *trans,
			 size_t trans_len, bool numbered, struct manifest *m)
{
	uint8_t *buf = NULL, *owned = NULL;
	size_t len = 0, blen = 0;
	const uint8_t *body;
	struct perr e = { { 0 } };
	int rc = read_file(db, key, MANIFEST_MAX_BYTES, &buf, &len);
	if (rc == -ENOENT)
		return rc;
	if (rc == -EFBIG)
		rc = fail(&e, "larger than %llu bytes", (unsigned long long)MANIFEST_MAX_BYTES);
	else if (rc && rc != -ENOMEM)
		rc = fail(&e, "cannot read: %s", strerror(-rc));
	if (!rc)
		rc = envelope_decode(&e, buf, len, MAGIC_MANIFEST, MANIFEST_MAX_BYTES, &owned, &body, &blen);
	if (!rc)
		rc = parse_manifest_body(db, &e, body, blen, trans, trans_len, numbered, m);
	if (rc == -EIO)
		ckpt_log(CKPT_LOG_ERR, "ocdbt: %s: %s", path, e.msg);
	free(owned);
	free(buf);
	return rc;
}

struct best_ctx {
	char best[17];
};

static int best_cb(void *ctx, const char *name, const struct ckpt_store_stat *st)
{
	struct best_ctx *c = ctx;
	if (!st->is_dir && strncmp(name, "manifest.", 9) == 0 && is_hex16(name + 9) &&
	    strcmp(name + 9, c->best) > 0)
		memcpy(c->best, name + 9, 17);
	return 0;
}

/*
 * Open one database whose root is <item>/<trans> (trans "" or
 * "ocdbt.process_<id>/") and append its keys to the index.
 */
static int open_one(ckpt_ocdbt *db, const char *trans, bool first)
{
	size_t tl = strlen(trans);
	char *dir = malloc(db->root_len + 1 + tl + 40);
	char *key = malloc(tl + 40);
	char *path = malloc(db->root_len + 1 + tl + 40);
	int rc = 0;
	if (!dir || !key || !path) {
		rc = -ENOMEM;
		goto out;
	}
	sprintf(dir, "%s/%s", db->root, trans);
	sprintf(key, "%smanifest.ocdbt", trans);
	sprintf(path, "%s/%s", db->root, key);
	struct manifest m;
	rc = load_manifest(db, key, path, trans, tl, false, &m);
	if (rc)
		goto out;
	if (m.kind == 1) {
		/* numbered: newest manifest.<16 hex> */
		struct best_ctx bc = { "" };
		char sub[256];
		snprintf(sub, sizeof(sub), "%.*s", tl ? (int)tl - 1 : 0, trans);
		rc = ckpt_store_listdir(db->base, sub, best_cb, &bc);
		if (rc) {
			ckpt_log(CKPT_LOG_ERR, "ocdbt: %s: cannot list: %s", dir, strerror(-rc));
			rc = -EIO;
			goto out;
		}
		if (!bc.best[0]) {
			ckpt_log(CKPT_LOG_ERR,
				 "ocdbt: %s: numbered manifest kind but no manifest.<16 hex> file", path);
			rc = -EIO;
			goto out;
		}
		sprintf(key, "%smanifest.%s", trans, bc.best);
		sprintf(path, "%s/%s", db->root, key);
		rc = load_manifest(db, key, path, trans, tl, true, &m);
		if (rc == -ENOENT) {
			ckpt_log(CKPT_LOG_ERR, "ocdbt: %s: vanished", path);
			rc = -EIO;
		}
		if (rc)
			goto out;
	}
	if (first)
		db->height = m.height;
	if (m.empty)
		goto out;
	struct walk w = { dir, db->nents, NODE_MAX_BYTES };
	if (m.max_decoded && m.max_decoded < w.node_cap)
		w.node_cap = m.max_decoded;
	if (db->lim.node_bytes < w.node_cap)
		w.node_cap = db->lim.node_bytes;
	rc = visit(db, &w, m.gid, m.trans_len, m.off, m.len, NULL, m.height, NULL, 0, NULL, 0, NULL, 0);
out:
	free(path);
	free(key);
	free(dir);
	return rc;
}

static ckpt_ocdbt *db_new(const char *root, struct lim lim)
{
	ckpt_ocdbt *db = calloc(1, sizeof(*db));
	if (!db)
		return NULL;
	db->root = strdup(root);
	if (!db->root) {
		free(db);
		return NULL;
	}
	db->root_len = strlen(root);
	while (db->root_len > 1 && db->root[db->root_len - 1] == '/')
		db->root[--db->root_len] = '\0';
	db->lim = lim;
	pthread_mutex_init(&db->mu, NULL);
	return db;
}

void ckpt_ocdbt_close(ckpt_ocdbt *db)
{
	if (!db)
		return;
	for (size_t i = 0; i < db->nfiles; i++)
		free(db->files[i].abs);
	ckpt_store_destroy(db->base);
	free(db->files);
	free(db->fhash);
	free(db->ents);
	free(db->keys);
	free(db->vals);
	pthread_mutex_destroy(&db->mu);
	free(db->root);
	free(db);
}

static int is_digits(const char *s)
{
	if (!*s)
		return 0;
	for (; *s; s++)
		if (*s < '0' || *s > '9')
			return 0;
	return 1;
}

/* Process ids: decimal ones numerically (shorter first, leading zeros aside), then bytewise. */
static int proc_cmp(const void *a, const void *b)
{
	const char *x = *(const char *const *)a + 14, *y = *(const char *const *)b + 14;
	/* replica folders after the plain ones, each in id order */
	int rx = strncmp(x, "replica_", 8) == 0, ry = strncmp(y, "replica_", 8) == 0;
	if (rx != ry)
		return rx ? 1 : -1;
	x += rx ? 8 : 0;
	y += ry ? 8 : 0;
	int dx = is_digits(x), dy = is_digits(y);
	if (dx != dy)
		return dx ? -1 : 1;
	if (dx) {
		while (*x == '0' && x[1])
			x++;
		while (*y == '0' && y[1])
			y++;
		size_t lx = strlen(x), ly = strlen(y);
		if (lx != ly)
			return lx < ly ? -1 : 1;
	}
	return strcmp(x, y);
}

/* "ocdbt.process_<id>", or "ocdbt.process_replica_<id>" (Orbax's
 * replica_separate_folder); <id> is [A-Za-z0-9]+. */
static int is_proc_name(const char *s)
{
	if (strncmp(s, "ocdbt.process_", 14) != 0 || !s[14])
		return 0;
	s += 14;
	if (strncmp(s, "replica_", 8) == 0 && s[8])
		s += 8;
	for (; *s; s++)
		if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z')))
			return 0;
	return 1;
}

struct sort_item {
	struct ent e;
	size_t order;
};

static int sort_cmp_r(const void *a, const void *b, void *arg)
{
	const ckpt_ocdbt *db = arg;
	const struct sort_item *x = a, *y = b;
	int c = key_cmp((const uint8_t *)db->keys + x->e.koff, x->e.klen,
			(const uint8_t *)db->keys + y->e.koff, y->e.klen);
	if (c)
		return c;
	return x->order < y->order ? -1 : x->order > y->order;
}

/* Sort the union of several databases; on duplicate keys keep the first. */
static int sort_union(ckpt_ocdbt *db)
{
	struct sort_item *v = malloc(db->nents * sizeof(*v) + 1);
	if (!v)
		return -ENOMEM;
	for (size_t i = 0; i < db->nents; i++) {
		v[i].e = db->ents[i];
		v[i].order = i;
	}
	qsort_r(v, db->nents, sizeof(*v), sort_cmp_r, db);
	size_t n = 0;
	for (size_t i = 0; i < db->nents; i++) {
		if (n && key_cmp((const uint8_t *)db->keys + db->ents[n - 1].koff, db->ents[n - 1].klen,
				 (const uint8_t *)db->keys + v[i].e.koff, v[i].e.klen) == 0)
			continue;
		db->ents[n++] = v[i].e;
	}
	db->nents = n;
	free(v);
	return 0;
}

struct proc_ctx {
	char **names;
	size_t nn, cap;
	int rc;
};

static int proc_cb(void *ctx, const char *name, const struct ckpt_store_stat *st)
{
	struct proc_ctx *c = ctx;
	if (!st->is_dir || !is_proc_name(name) || strlen(name) > 200)
		return 0;
	if (grow((void **)&c->names, &c->cap, c->nn + 1, sizeof(*c->names)) ||
	    !(c->names[c->nn] = strdup(name))) {
		c->rc = -ENOMEM;
		return 1;
	}
	c->nn++;
	return 0;
}

int ckpt_ocdbt_open_store(ckpt_store *base, const char *dir, ckpt_ocdbt **out)
{
	return ckpt_ocdbt_open_store_pool(base, dir, NULL, out);
}

int ckpt_ocdbt_open_store_pool(ckpt_store *base, const char *dir, ckpt_pool *pool, ckpt_ocdbt **out)
{
	*out = NULL;
	ckpt_store *item;
	int rc = ckpt_store_sub(base, dir, &item);
	if (rc)
		return rc;
	ckpt_ocdbt *db = db_new(item->root, default_lim);
	if (!db) {
		ckpt_store_destroy(item);
		return -ENOMEM;
	}
	db->base = item;
	db->pool = pool;
	rc = open_one(db, "", true);
	if (rc == -ENOENT) {
		/* No merged root: the union of ocdbt.process_<id>/ databases. */
		struct proc_ctx pc = { NULL, 0, 0, 0 };
		rc = ckpt_store_listdir(item, "", proc_cb, &pc);
		if (rc == 1)
			rc = pc.rc;
		char **names = pc.names;
		size_t nn = pc.nn;
		if (!rc && nn > 1)
			qsort(names, nn, sizeof(*names), proc_cmp);
		size_t opened = 0;
		for (size_t i = 0; i < nn && !rc; i++) {
			char trans[256];
			snprintf(trans, sizeof(trans), "%s/", names[i]);
			rc = open_one(db, trans, opened == 0);
			if (rc == -ENOENT) {
				ckpt_log(CKPT_LOG_WARN, "ocdbt: %s/%s: no manifest.ocdbt, skipped", db->root,
					 names[i]);
				rc = 0;
				continue;
			}
			if (!rc)
				opened++;
		}
		for (size_t i = 0; i < nn; i++)
			free(names[i]);
		free(names);
		if (!rc && opened == 0)
			rc = -ENOENT;
		if (!rc && opened > 1)
			rc = sort_union(db);
	}
	/* the prefetch is over: no pool is kept past the open */
	ckpt_pool_destroy(db->own_pool);
	db->own_pool = NULL;
	db->pool = NULL;
	if (rc)
		goto fail;
	if (db->skipped_nul)
		ckpt_log(CKPT_LOG_WARN, "ocdbt: %s: %zu keys containing NUL bytes skipped", db->root,
			 db->skipped_nul);
	*out = db;
	return 0;
fail:
	ckpt_ocdbt_close(db);
	return rc;
}

int ckpt_ocdbt_open(const char *item_dir, ckpt_ocdbt **out)
{
	*out = NULL;
	if (!item_dir || !*item_dir)
		return -EINVAL;
	ckpt_store *base;
	int rc = ckpt_store_dir_open(item_dir, &base);
	if (rc)
		return rc;
	rc = ckpt_ocdbt_open_store(base, "", out);
	ckpt_store_destroy(base);
	return rc;
}

/* ---------------------------------------------------------------- queries */

size_t ckpt_ocdbt_count(const ckpt_ocdbt *db)
{
	return db->nents;
}

int ckpt_ocdbt_height(const ckpt_ocdbt *db)
{
	return db->height;
}

size_t ckpt_ocdbt_nodes(const ckpt_ocdbt *db)
{
	return db->nodes;
}

/* First entry whose key is >= (k, n). */
static size_t lower_bound(const ckpt_ocdbt *db, const char *k, size_t n)
{
	size_t lo = 0, hi = db->nents;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const struct ent *en = &db->ents[mid];
		if (key_cmp((const uint8_t *)db->keys + en->koff, en->klen, (const uint8_t *)k, n) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static const struct ent *find(const ckpt_ocdbt *db, const char *key)
{
	size_t n = strlen(key);
	size_t i = lower_bound(db, key, n);
	if (i < db->nents && db->ents[i].klen == n && memcmp(db->keys + db->ents[i].koff, key, n) == 0)
		return &db->ents[i];
	return NULL;
}

int ckpt_ocdbt_lookup(const ckpt_ocdbt *db, const char *key, struct ckpt_ocdbt_value *out)
{
	const struct ent *en = find(db, key);
	if (!en)
		return -ENOENT;
	out->size = en->size;
	if (en->file == FILE_INLINE) {
		out->inline_data = db->vals + en->voff;
		out->path = NULL;
		out->offset = 0;
	} else {
		out->inline_data = NULL;
		out->path = db->files[en->file].rel;
		out->offset = en->voff;
	}
	return 0;
}

/* Check an out-of-line value against its data file. */
static int value_file(ckpt_ocdbt *db, const struct ent *en)
{
	uint64_t fsize;
	int rc = file_size(db, en->file, &fsize);
	if (rc)
		return rc;
	if (en->voff + en->size > fsize) {
		ckpt_log(CKPT_LOG_ERR,
			 "ocdbt: %s: value of key '%s' at offset %llu length %llu lies past the end of the "
			 "data "
			 "file (%llu bytes)",
			 db->files[en->file].abs, db->keys + en->koff, (unsigned long long)en->voff,
			 (unsigned long long)en->size, (unsigned long long)fsize);
		return -EIO;
	}
	return 0;
}

int ckpt_ocdbt_size(ckpt_ocdbt *db, const char *key, uint64_t *size)
{
	const struct ent *en = find(db, key);
	if (!en)
		return -ENOENT;
	if (en->file != FILE_INLINE) {
		int rc = value_file(db, en);
		if (rc)
			return rc;
	}
	*size = en->size;
	return 0;
}

ssize_t ckpt_ocdbt_read(ckpt_ocdbt *db, const char *key, uint64_t off, size_t len, void *dst)
{
	const struct ent *en = find(db, key);
	if (!en)
		return -ENOENT;
	if (off >= en->size)
		return 0;
	uint64_t n = en->size - off;
	if (n > len)
		n = len;
	if (n > SSIZE_MAX)
		n = SSIZE_MAX;
	if (en->file == FILE_INLINE) {
		memcpy(dst, db->vals + en->voff + off, n);
		return (ssize_t)n;
	}
	int rc = value_file(db, en);
	if (rc)
		return rc;
	size_t got;
	rc = file_read(db, en->file, dst, n, en->voff + off, &got);
	if (rc == -ESTALE || rc == -ENOMEM)
		return rc;
	if (rc || got != n) {
		ckpt_log(CKPT_LOG_ERR, "ocdbt: %s: reading key '%s' at offset %llu: %s",
			 db->files[en->file].abs, db->keys + en->koff, (unsigned long long)(en->voff + off),
			 rc ? strerror(-rc) : "short read");
		rc = -EIO;
	}
	return rc ? rc : (ssize_t)n;
}

int ckpt_ocdbt_list(ckpt_ocdbt *db, const char *prefix, int (*cb)(void *ctx, const char *key, uint64_t size),
		    void *ctx)
{
	size_t pn = prefix ? strlen(prefix) : 0;
	for (size_t i = pn ? lower_bound(db, prefix, pn) : 0; i < db->nents; i++) {
		const struct ent *en = &db->ents[i];
		if (en->klen < pn || memcmp(db->keys + en->koff, prefix, pn) != 0)
			break;
		int rc = cb(ctx, db->keys + en->koff, en->size);
		if (rc)
			return rc;
	}
	return 0;
}

/* ---------------------------------------------------------------- fuzzing */

static int fuzz_one(const uint8_t *buf, size_t len)
{
	int ok = 0;
	ckpt_ocdbt *db = db_new("/nonexistent", fuzz_lim);
	if (!db)
		return -ENOMEM;
	const char *trans = "ocdbt.process_0/";
	for (int as_node = 0; as_node < 2; as_node++) {
		/* 1: the envelope as given; 2: its body decoded directly */
		for (int pass = 0; pass < 2; pass++) {
			struct perr e = { { 0 } };
			uint8_t *owned = NULL;
			const uint8_t *body = buf;
			size_t blen = len;
			int rc = 0;
			if (pass == 0)
				rc = envelope_decode(&e, buf, len, as_node ? MAGIC_BTREE : MAGIC_MANIFEST,
						     fuzz_lim.node_bytes, &owned, &body, &blen);
			if (!rc) {
				if (as_node) {
					struct node nd;
					rc = parse_node_body(db, &e, body, blen, trans, strlen(trans),
							     fuzz_lim.node_bytes, &nd);
					if (!rc)
						btree_node_free(&nd);
				} else {
					struct manifest m;
					rc = parse_manifest_body(db, &e, body, blen, "", 0, pass == 1, &m);
				}
			}
			free(owned);
			ok |= rc == 0;
		}
	}
	ckpt_ocdbt_close(db);
	return ok ? 0 : -EIO;
}

int ckpt_ocdbt_fuzz_parse(const uint8_t *buf, size_t len)
{
	int rc = fuzz_one(buf, len);
	/* Again with the length and CRC fields repaired, so that mutations reach
	 * the body parsers instead of stopping at the checksum. */
	if (len >= ENVELOPE_MIN && len < ((size_t)64 << 20)) {
		uint8_t *copy = malloc(len);
		if (copy) {
			memcpy(copy, buf, len);
			ckpt_put_le64(copy + 4, len);
			ckpt_put_le32(copy + len - 4, ckpt_crc32c(0, copy, len - 4));
			if (fuzz_one(copy, len) == 0)
				rc = 0;
			free(copy);
		}
	}
	return rc;
}
