/*
 * store_mem.c - a store held in memory: key -> bytes, filled with
 * ckpt_store_mem_put() before use (tests and fuzzers build trees with it),
 * or with byte ranges of files of other stores (ckpt_store_mem_put_range)
 * and whole folders of other stores (ckpt_store_mem_put_folder): the
 * virtual Orbax items that foreign formats are translated into
 * (foreign/foreign.c).  The keys are kept sorted in byte order, so list()
 * walks one range and listdir/stat come from the flat key list (a folder is
 * any proper '/'-prefix of a key), as for OCDBT; below a mounted folder the
 * base store answers.
 */
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "store.h"
#include "store_int.h"

struct mem_entry {
	char *key;
	uint8_t *data; /* literal bytes (base NULL) */
	size_t len; /* literal: bytes; range: the range's length */
	ckpt_store *base; /* range or mount: the store read through (a reference) */
	char *base_key; /* range: the file of base; mount: the folder of base ("" = its root) */
	uint64_t off; /* range: first byte in base_key */
	uint64_t *pieces; /* pieces: npieces (offset, length) pairs of base_key, read one after another */
	size_t npieces;
	int mount; /* 1: key is a folder whose contents are base's folder base_key */
};

typedef struct mem_store {
	struct ckpt_store base;
	struct mem_entry *e; /* sorted by key (strcmp) */
	size_t n, cap;
	size_t nmounts;
} mem_store;

static const struct ckpt_store_ops mem_ops;

/* First index whose key is >= key. */
static size_t mem_lower(const mem_store *m, const char *key)
{
	size_t lo = 0, hi = m->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (strcmp(m->e[mid].key, key) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static const struct mem_entry *mem_find(const mem_store *m, const char *key)
{
	size_t i = mem_lower(m, key);
	return i < m->n && strcmp(m->e[i].key, key) == 0 ? &m->e[i] : NULL;
}

/* The mount holding `key` (key itself or one of its '/'-prefixes is a
 * mounted folder): the entry, and in *rest the part of key below it (""
 * for the mount's folder itself).  NULL when none. */
static const struct mem_entry *mem_mount_of(const mem_store *m, const char *key, const char **rest)
{
	if (!m->nmounts)
		return NULL;
	char buf[4096];
	size_t n = strlen(key);
	if (n >= sizeof(buf))
		return NULL;
	memcpy(buf, key, n + 1);
	for (;;) {
		const struct mem_entry *e = mem_find(m, buf);
		if (e && e->mount) {
			size_t bn = strlen(buf);
			*rest = key[bn] == '/' ? key + bn + 1 : key + bn;
			return e;
		}
		char *slash = strrchr(buf, '/');
		if (!slash)
			return NULL;
		*slash = 0;
	}
}

/* base_key of a mount + "/" + rest (malloc'd). */
static char *mount_key(const struct mem_entry *e, const char *rest)
{
	return ckpt_store_join(e->base_key, rest);
}

static int mem_size(ckpt_store *s, const char *key, uint64_t *size)
{
	mem_store *m = (mem_store *)s;
	const struct mem_entry *e = mem_find(m, key);
	if (e && !e->mount) {
		*size = e->len;
		return 0;
	}
	const char *rest;
	if ((e = mem_mount_of(m, key, &rest)) && *rest) {
		char *k = mount_key(e, rest);
		if (!k)
			return -ENOMEM;
		int rc = e->base->ops->size(e->base, k, size);
		free(k);
		return rc;
	}
	return -ENOENT;
}

static ssize_t mem_read(ckpt_store *s, const char *key, uint64_t off, size_t len, void *dst)
{
	mem_store *m = (mem_store *)s;
	const struct mem_entry *e = mem_find(m, key);
	const char *rest;
	if (!e || e->mount) {
		if (!(e = mem_mount_of(m, key, &rest)) || !*rest)
			return -ENOENT;
		char *k = mount_key(e, rest);
		if (!k)
			return -ENOMEM;
		/* the base's own read: the dispatcher counts the bytes once */
		ssize_t r = e->base->ops->read(e->base, k, off, len, dst);
		free(k);
		return r;
	}
	if (off >= e->len)
		return 0;
	size_t n = e->len - (size_t)off < len ? e->len - (size_t)off : len;
	if (!e->base) {
		memcpy(dst, e->data + off, n);
		return (ssize_t)n;
	}
	if (e->npieces) { /* the pieces in turn */
		size_t done = 0;
		uint64_t skip = off;
		for (size_t i = 0; i < e->npieces && done < n; i++) {
			uint64_t po = e->pieces[2 * i], pl = e->pieces[2 * i + 1];
			if (skip >= pl) {
				skip -= pl;
				continue;
			}
			size_t k = pl - skip < n - done ? (size_t)(pl - skip) : n - done;
			ssize_t r =
				e->base->ops->read(e->base, e->base_key, po + skip, k, (uint8_t *)dst + done);
			if (r < 0)
				return r;
			if ((size_t)r < k) {
				ckpt_log(CKPT_LOG_ERR,
					 "%s/%s: %s/%s is shorter than the pieces it should hold", s->root,
					 key, e->base->root, e->base_key);
				return -EIO;
			}
			done += k;
			skip = 0;
		}
		return (ssize_t)done;
	}
	uint64_t at;
	if (ckpt_add_u64(e->off, off, &at) < 0)
		return -EIO;
	ssize_t r = e->base->ops->read(e->base, e->base_key, at, n, dst);
	if (r >= 0 && (size_t)r < n) {
		ckpt_log(CKPT_LOG_ERR, "%s/%s: %s/%s is shorter than the %zu bytes at %llu it should hold",
			 s->root, key, e->base->root, e->base_key, n, (unsigned long long)at);
		return -EIO;
	}
	return r;
}

struct remap_ctx {
	const char *from; /* the base's folder prefix, with its '/' ("" = root) */
	const char *to; /* the mount's key */
	ckpt_store_list_cb cb;
	void *ctx;
	size_t fn;
};

static int remap_cb(void *arg, const char *key, uint64_t size)
{
	struct remap_ctx *r = arg;
	if (strncmp(key, r->from, r->fn) != 0)
		return 0;
	char *k = ckpt_store_join(r->to, key + r->fn);
	if (!k)
		return -ENOMEM;
	int rc = r->cb(r->ctx, k, size);
	free(k);
	return rc;
}

/* List the keys of mount e that start with `prefix` (a key prefix of the
 * mem store). */
static int list_mount(const struct mem_entry *e, const char *prefix, ckpt_store_list_cb cb, void *ctx)
{
	size_t kn = strlen(e->key), pn = strlen(prefix);
	char *from = ckpt_store_join(e->base_key, "");
	if (!from)
		return -ENOMEM;
	size_t fn = strlen(from);
	char *f2 = malloc(fn + 2);
	if (!f2) {
		free(from);
		return -ENOMEM;
	}
	memcpy(f2, from, fn);
	if (fn)
		f2[fn++] = '/';
	f2[fn] = 0;
	free(from);
	/* what the base is asked for: f2 + the part of prefix below the mount */
	const char *below = pn > kn + 1 ? prefix + kn + 1 : "";
	char *bp = malloc(fn + strlen(below) + 1);
	if (!bp) {
		free(f2);
		return -ENOMEM;
	}
	strcpy(bp, f2);
	strcat(bp, below);
	struct remap_ctx r = { f2, e->key, cb, ctx, fn };
	int rc = e->base->ops->list(e->base, bp, remap_cb, &r);
	free(bp);
	free(f2);
	return rc;
}

static int mem_list(ckpt_store *s, const char *prefix, ckpt_store_list_cb cb, void *ctx)
{
	mem_store *m = (mem_store *)s;
	const char *p = prefix ? prefix : "";
	size_t pn = strlen(p);
	/* a prefix inside a mounted folder ("M/..."): that folder's keys only */
	const char *cut = strrchr(p, '/');
	if (cut && m->nmounts && (size_t)(cut - p) < 4096) {
		char head[4096];
		memcpy(head, p, (size_t)(cut - p));
		head[cut - p] = 0;
		const char *rest;
		const struct mem_entry *e = *head ? mem_mount_of(m, head, &rest) : NULL;
		if (e)
			return list_mount(e, p, cb, ctx);
	}
	for (size_t i = mem_lower(m, p); i < m->n && strncmp(m->e[i].key, p, pn) == 0; i++) {
		const struct mem_entry *e = &m->e[i];
		int rc;
		if (e->mount) {
			/* whole mounted folder under the prefix ("a" for a mount "a" + "/"...) */
			rc = list_mount(e, e->key, cb, ctx);
		} else {
			rc = cb(ctx, e->key, e->len);
		}
		if (rc)
			return rc;
	}
	return 0;
}

static int mem_listdir(ckpt_store *s, const char *dir, ckpt_store_dir_cb cb, void *ctx)
{
	mem_store *m = (mem_store *)s;
	const char *rest;
	const struct mem_entry *e;
	if (*dir && (e = mem_mount_of(m, dir, &rest))) {
		char *k = mount_key(e, rest);
		if (!k)
			return -ENOMEM;
		int rc = e->base->ops->listdir(e->base, k, cb, ctx);
		free(k);
		return rc;
	}
	if (*dir && !ckpt_store_key_ok(dir))
		return -ENOENT;
	size_t dn = strlen(dir);
	char pre[4096];
	if (dn + 2 > sizeof(pre))
		return -ENOENT;
	memcpy(pre, dir, dn);
	if (dn)
		pre[dn++] = '/';
	pre[dn] = 0;
	char last[4096] = "";
	int any = 0;
	/* keys in byte order: one folder's keys are adjacent */
	for (size_t i = mem_lower(m, pre); i < m->n && strncmp(m->e[i].key, pre, dn) == 0; i++) {
		e = &m->e[i];
		const char *name = e->key + dn;
		const char *slash = strchr(name, '/');
		size_t n = slash ? (size_t)(slash - name) : strlen(name);
		any = 1;
		if (n == 0 || n >= sizeof(last))
			continue;
		struct ckpt_store_stat st = { 0, 0, 0 };
		if (slash || e->mount) {
			if (strncmp(last, name, n) == 0 && last[n] == 0)
				continue;
			memcpy(last, name, n);
			last[n] = 0;
			st.is_dir = 1;
			int rc = cb(ctx, last, &st);
			if (rc)
				return rc;
			continue;
		}
		st.size = e->len;
		int rc = cb(ctx, name, &st);
		if (rc)
			return rc;
	}
	return !any && dn ? -ENOENT : 0;
}

static int mem_stat(ckpt_store *s, const char *key, struct ckpt_store_stat *st)
{
	mem_store *m = (mem_store *)s;
	memset(st, 0, sizeof(*st));
	if (!*key) {
		st->is_dir = 1;
		return 0;
	}
	if (!ckpt_store_key_ok(key))
		return -ENOENT;
	const struct mem_entry *e = mem_find(m, key);
	const char *rest;
	if (e && !e->mount) {
		st->size = e->len;
		return 0;
	}
	if ((e = mem_mount_of(m, key, &rest))) {
		if (!*rest) {
			st->is_dir = 1;
			return 0;
		}
		char *k = mount_key(e, rest);
		if (!k)
			return -ENOMEM;
		int rc = e->base->ops->stat(e->base, k, st);
		free(k);
		return rc;
	}
	size_t n = strlen(key);
	char q[4096];
	if (n + 2 > sizeof(q))
		return -ENOENT;
	memcpy(q, key, n);
	q[n] = '/';
	q[n + 1] = 0;
	size_t i = mem_lower(m, q);
	if (i < m->n && strncmp(m->e[i].key, q, n + 1) == 0) {
		st->is_dir = 1;
		return 0;
	}
	return -ENOENT;
}

static void mem_destroy(ckpt_store *s)
{
	mem_store *m = (mem_store *)s;
	for (size_t i = 0; i < m->n; i++) {
		free(m->e[i].key);
		free(m->e[i].data);
		free(m->e[i].base_key);
		free(m->e[i].pieces);
		ckpt_store_destroy(m->e[i].base);
	}
	free(m->e);
	free(m->base.root);
	free(m);
}

static unsigned mem_connections(ckpt_store *s)
{
	(void)s;
	return 1; /* a memcpy: nothing gains from a second request */
}

static const struct ckpt_store_ops mem_ops = {
	.size = mem_size,
	.read = mem_read,
	.list = mem_list,
	.listdir = mem_listdir,
	.stat = mem_stat,
	.destroy = mem_destroy,
	.connections = mem_connections,
};

int ckpt_store_mem_open(const char *name, ckpt_store **out)
{
	*out = NULL;
	mem_store *m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->base.ops = &mem_ops;
	m->base.root = strdup(name ? name : "mem:");
	if (!m->base.root) {
		free(m);
		return -ENOMEM;
	}
	*out = &m->base;
	return 0;
}

/* Insert or replace entry `ne` (its key, data and base_key owned by the
 * store from here on, also on failure). */
static int mem_insert(mem_store *m, struct mem_entry ne)
{
	size_t i = mem_lower(m, ne.key);
	if (i < m->n && strcmp(m->e[i].key, ne.key) == 0) {
		struct mem_entry *o = &m->e[i];
		m->nmounts -= (size_t)o->mount;
		free(o->key);
		free(o->data);
		free(o->base_key);
		free(o->pieces);
		ckpt_store_destroy(o->base);
		*o = ne;
		m->nmounts += (size_t)ne.mount;
		return 0;
	}
	if (m->n == m->cap) {
		size_t nc = m->cap ? m->cap * 2 : 16;
		struct mem_entry *e = realloc(m->e, nc * sizeof(*e));
		if (!e) {
			free(ne.key);
			free(ne.data);
			free(ne.base_key);
			free(ne.pieces);
			ckpt_store_destroy(ne.base);
			return -ENOMEM;
		}
		m->e = e;
		m->cap = nc;
	}
	memmove(m->e + i + 1, m->e + i, (m->n - i) * sizeof(*m->e));
	m->e[i] = ne;
	m->n++;
	m->nmounts += (size_t)ne.mount;
	return 0;
}

int ckpt_store_mem_put(ckpt_store *s, const char *key, const void *data, size_t len)
{
	if (s->ops != &mem_ops)
		return -EINVAL;
	if (!ckpt_store_key_ok(key))
		return -EINVAL;
	uint8_t *copy = malloc(len ? len : 1);
	char *k = strdup(key);
	if (!copy || !k) {
		free(copy);
		free(k);
		return -ENOMEM;
	}
	if (len)
		memcpy(copy, data, len);
	return mem_insert((mem_store *)s, (struct mem_entry){ .key = k, .data = copy, .len = len });
}

int ckpt_store_mem_put_range(ckpt_store *s, const char *key, ckpt_store *base, const char *base_key,
			     uint64_t offset, uint64_t length)
{
	if (s->ops != &mem_ops || !base || base == s || !ckpt_store_key_ok(key) ||
	    !ckpt_store_key_ok(base_key))
		return -EINVAL;
	uint64_t end;
	if (ckpt_add_u64(offset, length, &end) < 0 || length > SIZE_MAX)
		return -EINVAL;
	char *k = strdup(key), *bk = strdup(base_key);
	if (!k || !bk) {
		free(k);
		free(bk);
		return -ENOMEM;
	}
	return mem_insert((mem_store *)s, (struct mem_entry){ .key = k,
							      .len = (size_t)length,
							      .base = ckpt_store_ref(base),
							      .base_key = bk,
							      .off = offset });
}

int ckpt_store_mem_put_folder(ckpt_store *s, const char *key, ckpt_store *base, const char *base_dir)
{
	if (s->ops != &mem_ops || !base || base == s || !ckpt_store_key_ok(key) ||
	    (*base_dir && !ckpt_store_key_ok(base_dir)))
		return -EINVAL;
	char *k = strdup(key), *bk = strdup(base_dir);
	if (!k || !bk) {
		free(k);
		free(bk);
		return -ENOMEM;
	}
	return mem_insert(
		(mem_store *)s,
		(struct mem_entry){ .key = k, .base = ckpt_store_ref(base), .base_key = bk, .mount = 1 });
}

int ckpt_store_mem_put_pieces(ckpt_store *s, const char *key, ckpt_store *base, const char *base_key,
			      const uint64_t *pieces, size_t npieces)
{
	if (s->ops != &mem_ops || !base || base == s || !ckpt_store_key_ok(key) ||
	    !ckpt_store_key_ok(base_key) || npieces == 0 || npieces > SIZE_MAX / (2 * sizeof(uint64_t)))
		return -EINVAL;
	uint64_t total = 0, end;
	for (size_t i = 0; i < npieces; i++)
		if (ckpt_add_u64(pieces[2 * i], pieces[2 * i + 1], &end) < 0 ||
		    ckpt_add_u64(total, pieces[2 * i + 1], &total) < 0 || total > SIZE_MAX)
			return -EINVAL;
	char *k = strdup(key), *bk = strdup(base_key);
	uint64_t *p = malloc(npieces * 2 * sizeof(uint64_t));
	if (!k || !bk || !p) {
		free(k);
		free(bk);
		free(p);
		return -ENOMEM;
	}
	memcpy(p, pieces, npieces * 2 * sizeof(uint64_t));
	return mem_insert((mem_store *)s, (struct mem_entry){ .key = k,
							      .len = (size_t)total,
							      .base = ckpt_store_ref(base),
							      .base_key = bk,
							      .pieces = p,
							      .npieces = npieces });
}
