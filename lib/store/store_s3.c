/*
 * store_s3.c - object stores: s3:// (AWS S3 and S3-compatible services)
 * and gs:// (Google Cloud Storage through its XML API): the store vtable,
 * and the store's configuration at open (bucket, prefix, endpoint, retries,
 * connections; the credentials come from s3_creds.c).  Writing objects is
 * s3_upload.c's (upload.h); every request goes through s3_request.c.
 *
 * Keys of the store are object names below the mounted prefix.  Requests:
 *   listdir -> ListObjectsV2 with delimiter '/' (paginated);
 *   list    -> ListObjectsV2 without delimiter;
 *   stat    -> the pinned entry, else HEAD, else a 1-key listing of "key/";
 *   read    -> one GET (a Range GET unless the whole object is wanted),
 *              through the on-disk range cache when there is one.
 * What a listing or HEAD reports is pinned (s3_request.c: consistency).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "common.h"
#include "http.h"
#include "s3_int.h"
#include "sigv4.h"
#include "store.h"
#include "store_int.h"

/* ---------------------------------------------------------------- listing */

struct lentry {
	char *name;
	int is_dir;
	uint64_t size;
	int64_t mtime_ns;
};

struct lres {
	struct lentry *v;
	size_t n, cap;
	int marker; /* a "dir/" object exists */
};

/* Append an entry taking ownership of name (freed on failure). */
static int lres_add(struct lres *r, char *name, int is_dir, uint64_t size, int64_t mtime_ns)
{
	if (r->n == r->cap) {
		size_t nc = r->cap ? 2 * r->cap : 64;
		struct lentry *nv = realloc(r->v, nc * sizeof(*nv));
		if (!nv) {
			free(name);
			return -ENOMEM;
		}
		r->v = nv;
		r->cap = nc;
	}
	r->v[r->n++] = (struct lentry){ .name = name, .is_dir = is_dir, .size = size, .mtime_ns = mtime_ns };
	return 0;
}

struct ld_ctx {
	size_t strip;
	struct lres res;
};

static int ld_cb(struct s3_store *s, void *ctx, const char *key, const char *etag, uint64_t size, int64_t mt,
		 int is_prefix)
{
	struct ld_ctx *c = ctx;
	if (strlen(key) < c->strip)
		return 0;
	const char *rest = key + c->strip;
	size_t n = strlen(rest);
	if (!is_prefix) {
		if (n == 0) {
			c->res.marker = 1;
			return 0;
		}
		if (rest[n - 1] == '/' || strchr(rest, '/'))
			return 0;
		int rc = ckpt_s3_obj_pin(s, key, size, etag, mt, NULL);
		if (rc)
			return rc;
	} else {
		if (n < 2 || rest[n - 1] != '/')
			return 0;
		n--;
		if (memchr(rest, '/', n))
			return 0;
	}
	char *name = strndup(rest, n);
	if (!name)
		return -ENOMEM;
	return lres_add(&c->res, name, is_prefix, is_prefix ? 0 : size, is_prefix ? 0 : mt);
}

static int lentry_cmp(const void *a, const void *b)
{
	const struct lentry *x = a, *y = b;
	int c = strcmp(x->name, y->name);
	return c ? c : x->is_dir - y->is_dir; /* the file first */
}

static int s3_listdir(ckpt_store *st, const char *dir, ckpt_store_dir_cb cb, void *ctx)
{
	struct s3_store *s = (struct s3_store *)st;
	char *name = objname(s, dir);
	if (!name)
		return -ENOMEM;
	size_t nl = strlen(name);
	char *pfx = malloc(nl + 2);
	if (!pfx) {
		free(name);
		return -ENOMEM;
	}
	memcpy(pfx, name, nl);
	if (nl)
		pfx[nl++] = '/';
	pfx[nl] = 0;
	free(name);
	struct ld_ctx c = { nl, { NULL, 0, 0, 0 } };
	int rc = ckpt_s3_list_objects(s, pfx, 1, 1000, 0, ld_cb, &c);
	free(pfx);
	if (rc == 0 && c.res.n == 0 && !c.res.marker && *dir)
		rc = -ENOENT;
	if (rc == 0 && c.res.n > 1)
		qsort(c.res.v, c.res.n, sizeof(*c.res.v), lentry_cmp);
	for (size_t i = 0; i < c.res.n && rc == 0; i++) {
		if (i && strcmp(c.res.v[i].name, c.res.v[i - 1].name) == 0)
			continue; /* a folder with a file's name: the file wins */
		struct ckpt_store_stat cs = { c.res.v[i].is_dir, c.res.v[i].size, c.res.v[i].mtime_ns };
		rc = cb(ctx, c.res.v[i].name, &cs);
	}
	for (size_t i = 0; i < c.res.n; i++)
		free(c.res.v[i].name);
	free(c.res.v);
	return rc;
}

struct fl_ctx {
	size_t strip;
	struct lres res; /* handed out only once the listing is whole */
};

static int fl_cb(struct s3_store *s, void *ctx, const char *key, const char *etag, uint64_t size, int64_t mt,
		 int is_prefix)
{
	struct fl_ctx *c = ctx;
	size_t n = strlen(key);
	if (is_prefix || n <= c->strip || key[n - 1] == '/')
		return 0;
	int rc = ckpt_s3_obj_pin(s, key, size, etag, mt, NULL);
	if (rc)
		return rc;
	char *name = strdup(key + c->strip);
	if (!name)
		return -ENOMEM;
	return lres_add(&c->res, name, 0, size, 0);
}

static int s3_list(ckpt_store *st, const char *prefix, ckpt_store_list_cb cb, void *ctx)
{
	struct s3_store *s = (struct s3_store *)st;
	size_t pl = strlen(s->prefix);
	char *full = malloc(pl + 1 + strlen(prefix ? prefix : "") + 1);
	if (!full)
		return -ENOMEM;
	sprintf(full, "%s%s%s", s->prefix, pl ? "/" : "", prefix ? prefix : "");
	struct fl_ctx c = { pl ? pl + 1 : 0, { NULL, 0, 0, 0 } };
	int rc = ckpt_s3_list_objects(s, full, 0, 1000, 0, fl_cb, &c);
	free(full);
	for (size_t i = 0; i < c.res.n && rc == 0; i++)
		rc = cb(ctx, c.res.v[i].name, c.res.v[i].size);
	for (size_t i = 0; i < c.res.n; i++)
		free(c.res.v[i].name);
	free(c.res.v);
	return rc;
}

static int any_cb(struct s3_store *s, void *ctx, const char *key, const char *etag, uint64_t size, int64_t mt,
		  int is_prefix)
{
	(void)s, (void)key, (void)etag, (void)size, (void)mt, (void)is_prefix;
	*(int *)ctx = 1;
	return 0;
}

static int s3_stat(ckpt_store *st, const char *key, struct ckpt_store_stat *out)
{
	struct s3_store *s = (struct s3_store *)st;
	memset(out, 0, sizeof(*out));
	if (!*key) {
		out->is_dir = 1;
		return 0;
	}
	char *name = objname(s, key);
	if (!name)
		return -ENOMEM;
	struct obj o;
	int rc = ckpt_s3_meta(s, name, &o);
	if (rc == 0) {
		out->size = o.size;
		out->mtime_ns = o.mtime_ns;
	} else if (rc == -ENOENT) {
		size_t n = strlen(name);
		char *pfx = malloc(n + 2);
		if (!pfx) {
			rc = -ENOMEM;
		} else {
			memcpy(pfx, name, n);
			pfx[n] = '/';
			pfx[n + 1] = 0;
			int any = 0;
			rc = ckpt_s3_list_objects(s, pfx, 1, 1, 1, any_cb, &any);
			if (rc == 0 && !any)
				rc = -ENOENT;
			if (rc == 0)
				out->is_dir = 1;
			free(pfx);
		}
	}
	free(name);
	return rc;
}

static int s3_size(ckpt_store *st, const char *key, uint64_t *size)
{
	struct s3_store *s = (struct s3_store *)st;
	char *name = objname(s, key);
	if (!name)
		return -ENOMEM;
	struct obj o;
	int rc = ckpt_s3_meta(s, name, &o);
	free(name);
	if (rc == 0)
		*size = o.size;
	return rc;
}

/* ---------------------------------------------------------------- reading */

/* The memo of small GETs: the same bytes of the same object version (name
 * and ETag, as pinned at the first stat) are fetched once.  A hit copies
 * them into dst; 0, or -ENOENT. */
static int memo_get(struct s3_store *s, const char *name, const char *etag, uint64_t first, uint64_t last,
		    void *dst)
{
	int rc = -ENOENT;
	pthread_mutex_lock(&s->mu);
	for (unsigned i = 0; i < MEMO_SLOTS; i++) {
		struct memo *m = &s->memo[i];
		if (m->name && m->first == first && m->last == last && !strcmp(m->etag, etag) &&
		    !strcmp(m->name, name)) {
			memcpy(dst, m->bytes, (size_t)(last - first + 1));
			s->memo_hits++;
			rc = 0;
			break;
		}
	}
	pthread_mutex_unlock(&s->mu);
	return rc;
}

static void memo_free(struct memo *m)
{
	free(m->name);
	free(m->bytes);
	memset(m, 0, sizeof(*m));
}

/* Keep a small GET's bytes (best effort: nothing happens without memory). */
static void memo_put(struct s3_store *s, const char *name, const char *etag, uint64_t first, uint64_t last,
		     const void *src)
{
	size_t n = (size_t)(last - first + 1);
	char *nm = strdup(name);
	uint8_t *b = malloc(n);
	if (!nm || !b || strlen(etag) >= sizeof(s->memo[0].etag)) {
		free(nm);
		free(b);
		return;
	}
	memcpy(b, src, n);
	pthread_mutex_lock(&s->mu);
	struct memo *m = &s->memo[s->memo_next++ % MEMO_SLOTS];
	memo_free(m);
	m->name = nm;
	snprintf(m->etag, sizeof(m->etag), "%s", etag);
	m->first = first;
	m->last = last;
	m->bytes = b;
	pthread_mutex_unlock(&s->mu);
}

static ssize_t s3_read(ckpt_store *st, const char *key, uint64_t off, size_t len, void *dst)
{
	struct s3_store *s = (struct s3_store *)st;
	char *name = objname(s, key);
	if (!name)
		return -ENOMEM;
	struct obj o;
	int rc = ckpt_s3_meta(s, name, &o);
	if (rc) {
		free(name);
		return rc;
	}
	if (o.stale) {
		free(name);
		return -ESTALE;
	}
	if (off >= o.size || len == 0) {
		free(name);
		return 0; /* never a range request on an empty object */
	}
	uint64_t n = o.size - off;
	if (n > len)
		n = len;
	if (n > ((size_t)1 << 30))
		n = (size_t)1 << 30;
	/* The range asked for.  A 1-byte range "bytes=0-0" is widened to two
	 * bytes: some S3 look-alikes answer it with the whole object. */
	uint64_t first = off, last = off + n - 1;
	if (n == 1 && off == 0 && o.size > 1)
		last = 1;
	char tmp[2];
	void *buf = last - first + 1 == n ? dst : tmp;
	char *id = NULL;
	if (s->dcache && asprintf(&id, "%s%s/%s", s->scheme_host, s->base_path, name) < 0)
		id = NULL;
	int small = last - first + 1 <= MEMO_MAX && o.etag[0];
	if (small && memo_get(s, name, o.etag, first, last, buf) == 0) {
		rc = 0;
	} else {
		if (id && ckpt_dcache_get(s->dcache, id, o.etag, first, last - first + 1, buf) == 0) {
			rc = 0;
		} else {
			rc = ckpt_s3_coalesced_get(s, name, key, &o, first, last, buf);
			if (rc == 0 && id)
				ckpt_dcache_put(s->dcache, id, o.etag, first, last - first + 1, buf);
		}
		if (rc == 0 && small)
			memo_put(s, name, o.etag, first, last, buf);
	}
	free(id);
	free(name);
	if (rc)
		return rc;
	if (buf == tmp)
		memcpy(dst, tmp, (size_t)n);
	return (ssize_t)n;
}

static void s3_destroy(ckpt_store *st)
{
	struct s3_store *s = (struct s3_store *)st;
	for (size_t i = 0; i < NBUCKETS; i++)
		for (struct obj *o = s->tab[i], *nx; o; o = nx) {
			nx = o->next;
			free(o);
		}
	for (unsigned i = 0; i < MEMO_SLOTS; i++)
		memo_free(&s->memo[i]);
	if (s->gets)
		ckpt_log(CKPT_LOG_DEBUG,
			 "%s: %llu range GETs, %llu more ranges served by merged GETs, %llu by kept small "
			 "GETs",
			 s->base.root, s->gets, s->merged, s->memo_hits);
	ckpt_http_free(s->http);
	ckpt_dcache_close(s->dcache);
	pthread_mutex_destroy(&s->mu);
	pthread_mutex_destroy(&s->qmu);
	pthread_cond_destroy(&s->qcv);
	free(s->bucket);
	free(s->prefix);
	free(s->scheme_host);
	free(s->host_hdr);
	free(s->base_path);
	free(s->region);
	free(s->akid);
	free_secret(s->secret);
	free_secret(s->session_token);
	free_secret(s->bearer);
	free(s->token_file);
	free(s->meta_url);
	free(s->base.root);
	free(s);
}

static unsigned s3_connections(ckpt_store *st)
{
	return ((struct s3_store *)st)->conns;
}

static const struct ckpt_store_ops s3_ops = {
	.size = s3_size,
	.read = s3_read,
	.list = s3_list,
	.listdir = s3_listdir,
	.stat = s3_stat,
	.destroy = s3_destroy,
	.connections = s3_connections,
};

/* ---------------------------------------------------------------- configuration */

static int parse_endpoint(struct s3_store *s, const char *ep, int path_style)
{
	const char *p = strstr(ep, "://");
	if (!p || (strncmp(ep, "http://", 7) != 0 && strncmp(ep, "https://", 8) != 0)) {
		ckpt_log(CKPT_LOG_ERR, "%s: endpoint '%s' is not an http:// or https:// URL", s->base.root,
			 ep);
		return -EINVAL;
	}
	p += 3;
	const char *slash = strchr(p, '/');
	size_t hl = slash ? (size_t)(slash - p) : strlen(p);
	if (hl == 0) {
		ckpt_log(CKPT_LOG_ERR, "%s: endpoint '%s' has no host", s->base.root, ep);
		return -EINVAL;
	}
	s->scheme_host = strndup(ep, (size_t)(p - ep) + hl);
	s->host_hdr = strndup(p, hl);
	/* libcurl sends the port only when it is not the scheme's default */
	if (s->host_hdr) {
		size_t n = strlen(s->host_hdr);
		int https = strncmp(ep, "https", 5) == 0;
		if ((https && n > 4 && strcmp(s->host_hdr + n - 4, ":443") == 0) ||
		    (!https && n > 3 && strcmp(s->host_hdr + n - 3, ":80") == 0))
			*strrchr(s->host_hdr, ':') = 0;
	}
	char *bp = slash ? strdup(slash) : strdup("");
	if (!s->scheme_host || !s->host_hdr || !bp) {
		free(bp);
		return -ENOMEM;
	}
	size_t bl = strlen(bp);
	while (bl && bp[bl - 1] == '/')
		bp[--bl] = 0;
	if (path_style) {
		char *enc = ckpt_sigv4_uri_encode(s->bucket, 0);
		if (!enc || asprintf(&s->base_path, "%s/%s", bp, enc) < 0) {
			s->base_path = NULL;
			free(enc);
			free(bp);
			return -ENOMEM;
		}
		free(enc);
		free(bp);
	} else {
		s->base_path = bp;
	}
	return 0;
}

int ckpt_store_s3_open(const char *source, const struct ckpt_store_opts *o, ckpt_store **out)
{
	static const struct ckpt_store_opts none = { 0 };
	*out = NULL;
	if (!o)
		o = &none;
	struct s3_store *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	pthread_mutex_init(&s->mu, NULL);
	pthread_mutex_init(&s->qmu, NULL);
	pthread_cond_init(&s->qcv, NULL);
	s->base.ops = &s3_ops;
	s->gcs = strncmp(source, "gs://", 5) == 0;
	int rc = -ENOMEM;
	const char *b = source + 5;
	const char *sl = strchr(b, '/');
	s->bucket = sl ? strndup(b, (size_t)(sl - b)) : strdup(b);
	s->prefix = strdup(sl ? sl + 1 : "");
	if (!s->bucket || !s->prefix)
		goto fail;
	size_t pl = strlen(s->prefix);
	while (pl && s->prefix[pl - 1] == '/')
		s->prefix[--pl] = 0;
	if (asprintf(&s->base.root, "%.2s://%s%s%s", source, s->bucket, pl ? "/" : "", s->prefix) < 0) {
		s->base.root = NULL;
		goto fail;
	}
	rc = -EINVAL;
	if (!*s->bucket || strchr(s->bucket, '?') || strchr(s->bucket, '#') || strchr(s->bucket, '@') ||
	    (pl && !ckpt_store_key_ok(s->prefix))) {
		ckpt_log(CKPT_LOG_ERR, "%s: malformed object store URL (want %.2s://BUCKET[/PREFIX])", source,
			 source);
		goto fail;
	}
	s->retries = o->retries == CKPT_STORE_NO_RETRY ? 0 : o->retries ? o->retries : 5;
	s->retry_base_ms = o->retry_base_ms ? o->retry_base_ms : 100;

	rc = ckpt_s3_creds_setup(s, o);
	if (rc)
		goto fail;

	/* endpoint */
	const char *ep = o->endpoint;
	if (!ep && !s->gcs)
		ep = env_nonempty("AWS_ENDPOINT_URL_S3");
	if (!ep && !s->gcs)
		ep = env_nonempty("AWS_ENDPOINT_URL");
	char *dflt = NULL;
	int path_style = 1;
	if (!ep) {
		if (s->gcs) {
			dflt = strdup("https://storage.googleapis.com");
		} else if (strchr(s->bucket, '.')) {
			if (asprintf(&dflt, "https://s3.%s.amazonaws.com", s->region) < 0)
				dflt = NULL;
		} else {
			path_style = 0;
			if (asprintf(&dflt, "https://%s.s3.%s.amazonaws.com", s->bucket, s->region) < 0)
				dflt = NULL;
		}
		if (!dflt) {
			rc = -ENOMEM;
			goto fail;
		}
		ep = dflt;
	}
	rc = parse_endpoint(s, ep, path_style);
	free(dflt);
	if (rc)
		goto fail;
	struct ckpt_http_cfg hc = { o->connections ? o->connections : 16,
				    o->timeout_ms ? o->timeout_ms : 30000 };
	s->slots = s->conns = hc.connections;
	if (o->cache_dir && (rc = ckpt_dcache_open(o->cache_dir, o->cache_dir_size, &s->dcache)) != 0)
		goto fail;
	rc = ckpt_http_new(&hc, &s->http);
	if (rc)
		goto fail;
	*out = &s->base;
	return 0;
fail:
	s3_destroy(&s->base);
	return rc;
}

struct s3_store *ckpt_s3_store_of(ckpt_store *st)
{
	return st && st->ops == &s3_ops ? (struct s3_store *)st : NULL;
}
