/*
 * store.c - the dispatchers (calls through a store's ops table), reference
 * counting, sub-stores (a view of a store below a folder), key helpers, and
 * listdir/stat derived from a flat key listing (for stores, like OCDBT,
 * that only have keys).  The bottom of store/: it calls no backend (SOURCE
 * parsing, which opens one, is store_source.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "stats.h"
#include "store.h"
#include "store_int.h"
#include "sysio.h"

/*
 * The one key check: every key a dispatcher passes to a store's ops is well
 * formed (ckpt_store_key_ok; "" too where it names the root folder), so no
 * backend sees "..", an absolute path, an empty or "." component or a
 * trailing '/'.  Such keys are simply absent: -ENOENT.  list()'s prefix is
 * a byte prefix, not a key, and is passed on as it is.
 */
int ckpt_store_size(ckpt_store *s, const char *key, uint64_t *size)
{
	if (!ckpt_store_key_ok(key))
		return -ENOENT;
	return s->ops->size(s, key, size);
}

ssize_t ckpt_store_read_raw(ckpt_store *s, const char *key, uint64_t off, size_t len, void *dst)
{
	if (!ckpt_store_key_ok(key))
		return -ENOENT;
	return s->ops->read(s, key, off, len, dst);
}

ssize_t ckpt_store_read(ckpt_store *s, const char *key, uint64_t off, size_t len, void *dst)
{
	ssize_t n = ckpt_store_read_raw(s, key, off, len, dst);
	if (n > 0) {
		CKPT_STAT_ADD(backing_bytes_read, (uint64_t)n);
		CKPT_STAT_ADD(backing_reads, 1);
	}
	return n;
}

int ckpt_store_has_open_fd(const ckpt_store *s)
{
	return s->ops->open_fd != NULL;
}

int ckpt_store_open_fd(ckpt_store *s, const char *key, struct ckpt_store_stat *st)
{
	if (!s->ops->open_fd)
		return -ENOTSUP;
	if (!ckpt_store_key_ok(key))
		return -ENOENT;
	return s->ops->open_fd(s, key, st);
}

ssize_t ckpt_store_fd_readv(int fd, uint64_t off, const struct iovec *iov, int n)
{
	ssize_t r = ckpt_preadv_all(fd, iov, n, off);
	if (r > 0) {
		CKPT_STAT_ADD(backing_bytes_read, (uint64_t)r);
		CKPT_STAT_ADD(backing_reads, 1);
	}
	return r;
}

int ckpt_store_list(ckpt_store *s, const char *prefix, ckpt_store_list_cb cb, void *ctx)
{
	return s->ops->list(s, prefix, cb, ctx);
}

int ckpt_store_listdir(ckpt_store *s, const char *dir, ckpt_store_dir_cb cb, void *ctx)
{
	if (!dir)
		dir = "";
	if (*dir && !ckpt_store_key_ok(dir))
		return -ENOENT;
	return s->ops->listdir(s, dir, cb, ctx);
}

int ckpt_store_stat(ckpt_store *s, const char *key, struct ckpt_store_stat *st)
{
	memset(st, 0, sizeof(*st));
	if (!key)
		key = "";
	if (*key && !ckpt_store_key_ok(key))
		return -ENOENT;
	return s->ops->stat(s, key, st);
}

unsigned ckpt_store_connections(ckpt_store *s)
{
	unsigned n = s->ops->connections ? s->ops->connections(s) : CKPT_STORE_FOLDER_CONNECTIONS;
	return n ? n : 1;
}

ckpt_store *ckpt_store_ref(ckpt_store *s)
{
	__atomic_add_fetch(&s->extra_refs, 1, __ATOMIC_RELAXED);
	return s;
}

void ckpt_store_destroy(ckpt_store *s)
{
	if (!s)
		return;
	if (__atomic_load_n(&s->extra_refs, __ATOMIC_ACQUIRE) > 0 &&
	    __atomic_sub_fetch(&s->extra_refs, 1, __ATOMIC_ACQ_REL) >= 0)
		return;
	s->ops->destroy(s);
}

int ckpt_store_read_all(ckpt_store *s, const char *key, size_t max, char **out, size_t *len)
{
	uint64_t size;
	int rc = ckpt_store_size(s, key, &size);
	if (rc < 0)
		return rc;
	if (size > max)
		return -EFBIG;
	char *buf = malloc((size_t)size + 1);
	if (!buf)
		return -ENOMEM;
	ssize_t n = size ? ckpt_store_read(s, key, 0, (size_t)size, buf) : 0;
	if (n < 0) {
		free(buf);
		return (int)n;
	}
	if ((uint64_t)n != size) {
		ckpt_log(CKPT_LOG_ERR, "%s/%s: short read (%zd of %llu bytes)", s->root, key, n,
			 (unsigned long long)size);
		free(buf);
		return -EIO;
	}
	buf[n] = 0;
	*out = buf;
	*len = (size_t)n;
	return 0;
}

int ckpt_store_read_small(ckpt_store *s, const char *key, size_t max, char **out, size_t *len)
{
	return ckpt_store_read_all(s, key, max, out, len);
}

int ckpt_store_key_ok(const char *key)
{
	if (!key || !*key || key[0] == '/')
		return 0;
	for (const char *p = key; *p;) {
		const char *e = strchr(p, '/');
		size_t n = e ? (size_t)(e - p) : strlen(p);
		if (n == 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
			return 0;
		p += n;
		if (*p == '/') {
			p++;
			if (!*p)
				return 0; /* trailing '/' */
		}
	}
	return 1;
}

char *ckpt_store_join(const char *a, const char *b)
{
	size_t an = a ? strlen(a) : 0, bn = b ? strlen(b) : 0;
	char *r = malloc(an + bn + 2);
	if (!r)
		return NULL;
	if (an)
		memcpy(r, a, an);
	size_t n = an;
	if (an && bn)
		r[n++] = '/';
	if (bn)
		memcpy(r + n, b, bn);
	r[n + bn] = 0;
	return r;
}

/* ---------------------------------------------------------------- sub-store */

struct sub_store {
	struct ckpt_store base;
	ckpt_store *parent;
	char *prefix; /* well-formed key, no trailing '/' */
	size_t plen;
};

static char *sub_key(struct sub_store *u, const char *key)
{
	return ckpt_store_join(u->prefix, key);
}

static int sub_size(ckpt_store *s, const char *key, uint64_t *size)
{
	struct sub_store *u = (struct sub_store *)s;
	char *k = sub_key(u, key);
	if (!k)
		return -ENOMEM;
	int rc = u->parent->ops->size(u->parent, k, size);
	free(k);
	return rc;
}

static ssize_t sub_read(ckpt_store *s, const char *key, uint64_t off, size_t len, void *dst)
{
	struct sub_store *u = (struct sub_store *)s;
	char *k = sub_key(u, key);
	if (!k)
		return -ENOMEM;
	ssize_t rc = u->parent->ops->read(u->parent, k, off, len, dst);
	free(k);
	return rc;
}

static int sub_open_fd(ckpt_store *s, const char *key, struct ckpt_store_stat *st)
{
	struct sub_store *u = (struct sub_store *)s;
	char *k = sub_key(u, key);
	if (!k)
		return -ENOMEM;
	int rc = u->parent->ops->open_fd(u->parent, k, st);
	free(k);
	return rc;
}

struct sub_list_ctx {
	size_t strip;
	ckpt_store_list_cb cb;
	void *ctx;
};

static int sub_list_cb(void *ctx, const char *key, uint64_t size)
{
	struct sub_list_ctx *c = ctx;
	if (strlen(key) <= c->strip)
		return 0;
	return c->cb(c->ctx, key + c->strip, size);
}

static int sub_list(ckpt_store *s, const char *prefix, ckpt_store_list_cb cb, void *ctx)
{
	struct sub_store *u = (struct sub_store *)s;
	size_t pn = prefix ? strlen(prefix) : 0;
	char *k = malloc(u->plen + 1 + pn + 1);
	if (!k)
		return -ENOMEM;
	memcpy(k, u->prefix, u->plen);
	k[u->plen] = '/';
	if (pn)
		memcpy(k + u->plen + 1, prefix, pn);
	k[u->plen + 1 + pn] = 0;
	struct sub_list_ctx c = { u->plen + 1, cb, ctx };
	int rc = u->parent->ops->list(u->parent, k, sub_list_cb, &c);
	free(k);
	return rc;
}

static int sub_listdir(ckpt_store *s, const char *dir, ckpt_store_dir_cb cb, void *ctx)
{
	struct sub_store *u = (struct sub_store *)s;
	char *k = sub_key(u, dir);
	if (!k)
		return -ENOMEM;
	int rc = u->parent->ops->listdir(u->parent, k, cb, ctx);
	free(k);
	return rc;
}

static int sub_stat(ckpt_store *s, const char *key, struct ckpt_store_stat *st)
{
	struct sub_store *u = (struct sub_store *)s;
	char *k = sub_key(u, key);
	if (!k)
		return -ENOMEM;
	int rc = u->parent->ops->stat(u->parent, k, st);
	free(k);
	return rc;
}

static unsigned sub_connections(ckpt_store *s)
{
	return ckpt_store_connections(((struct sub_store *)s)->parent);
}

static void sub_destroy(ckpt_store *s)
{
	struct sub_store *u = (struct sub_store *)s;
	ckpt_store_destroy(u->parent);
	free(u->prefix);
	free(u->base.root);
	free(u);
}

#define SUB_OPS                                                                                              \
	.size = sub_size, .read = sub_read, .list = sub_list, .listdir = sub_listdir, .stat = sub_stat,      \
	.destroy = sub_destroy, .connections = sub_connections

static const struct ckpt_store_ops sub_ops = { SUB_OPS };
/* The same over a parent that offers open_fd. */
static const struct ckpt_store_ops sub_ops_fd = { SUB_OPS, .open_fd = sub_open_fd };

static int is_sub(const ckpt_store *s)
{
	return s->ops == &sub_ops || s->ops == &sub_ops_fd;
}

int ckpt_store_unwrap(ckpt_store *s, const char *key, ckpt_store **base, char **full)
{
	char *k = strdup(key ? key : "");
	if (!k)
		return -ENOMEM;
	while (is_sub(s)) {
		struct sub_store *u = (struct sub_store *)s;
		char *nk = ckpt_store_join(u->prefix, k);
		free(k);
		if (!nk)
			return -ENOMEM;
		k = nk;
		s = u->parent;
	}
	*base = s;
	*full = k;
	return 0;
}

int ckpt_store_sub(ckpt_store *parent, const char *prefix, ckpt_store **out)
{
	*out = NULL;
	if (!prefix || !*prefix) {
		*out = ckpt_store_ref(parent);
		return 0;
	}
	if (!ckpt_store_key_ok(prefix))
		return -EINVAL;
	struct sub_store *u = calloc(1, sizeof(*u));
	if (!u)
		return -ENOMEM;
	u->base.ops = parent->ops->open_fd ? &sub_ops_fd : &sub_ops;
	u->prefix = strdup(prefix);
	u->plen = strlen(prefix);
	u->base.root = ckpt_store_join(parent->root, prefix);
	if (!u->prefix || !u->base.root) {
		free(u->prefix);
		free(u->base.root);
		free(u);
		return -ENOMEM;
	}
	u->parent = ckpt_store_ref(parent);
	*out = &u->base;
	return 0;
}

/* ---------------------------------------------------------------- listdir/stat from list */

struct kl_ctx {
	size_t strip; /* length of "dir/" */
	char last[4096]; /* last child folder reported */
	ckpt_store_dir_cb cb;
	void *ctx;
	int any;
};

static int kl_cb(void *ctx, const char *key, uint64_t size)
{
	struct kl_ctx *c = ctx;
	const char *rest = key + c->strip;
	c->any = 1;
	const char *slash = strchr(rest, '/');
	struct ckpt_store_stat st = { 0, size, 0 };
	if (!slash)
		return *rest ? c->cb(c->ctx, rest, &st) : 0;
	size_t n = (size_t)(slash - rest);
	if (n == 0 || n >= sizeof(c->last))
		return 0;
	/* Keys come in byte order: one folder's keys are adjacent. */
	if (strncmp(c->last, rest, n) == 0 && c->last[n] == 0)
		return 0;
	memcpy(c->last, rest, n);
	c->last[n] = 0;
	st.is_dir = 1;
	st.size = 0;
	return c->cb(c->ctx, c->last, &st);
}

int ckpt_store_listdir_from_keys(ckpt_store *s, const char *dir, ckpt_store_dir_cb cb, void *ctx)
{
	size_t dn = strlen(dir);
	char *p = malloc(dn + 2);
	if (!p)
		return -ENOMEM;
	memcpy(p, dir, dn);
	if (dn)
		p[dn++] = '/';
	p[dn] = 0;
	struct kl_ctx *c = calloc(1, sizeof(*c));
	if (!c) {
		free(p);
		return -ENOMEM;
	}
	c->strip = dn;
	c->cb = cb;
	c->ctx = ctx;
	int rc = s->ops->list(s, p, kl_cb, c);
	if (rc == 0 && !c->any && dn)
		rc = -ENOENT;
	free(c);
	free(p);
	return rc;
}

static int any_cb(void *ctx, const char *key, uint64_t size)
{
	(void)ctx;
	(void)key;
	(void)size;
	return 1;
}

int ckpt_store_stat_from_keys(ckpt_store *s, const char *key, struct ckpt_store_stat *st)
{
	memset(st, 0, sizeof(*st));
	if (!*key) {
		st->is_dir = 1;
		return 0;
	}
	uint64_t size;
	int rc = s->ops->size(s, key, &size);
	if (rc == 0) {
		st->size = size;
		return 0;
	}
	if (rc != -ENOENT)
		return rc;
	size_t n = strlen(key);
	char *q = malloc(n + 2);
	if (!q)
		return -ENOMEM;
	memcpy(q, key, n);
	q[n] = '/';
	q[n + 1] = 0;
	rc = s->ops->list(s, q, any_cb, NULL);
	free(q);
	if (rc == 1) {
		st->is_dir = 1;
		return 0;
	}
	return rc < 0 ? rc : -ENOENT;
}
