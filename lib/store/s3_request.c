/*
 * s3_request.c - requests to an object store: one signed attempt (SigV4
 * headers, or a bearer token, built per attempt), retries, the pinned
 * objects, HEAD, paginated ListObjectsV2, and range GETs (validated,
 * coalesced).  Calls s3_creds.c (bearer tokens), s3_xml.c (error codes,
 * listing pages), http.c (kept-alive connections: one libcurl handle per
 * connection, reused) and sigv4.c.
 *
 * Consistency: the first time an object is seen (listing or HEAD), its
 * size and ETag are pinned for the life of the store.  Every read sends
 * If-Match with the pinned ETag and checks the ETag of the answer; an
 * object that changed is -ESTALE for every later read of it (logged), never
 * a mix of old and new bytes.  Every ranged answer is checked (206, the
 * Content-Range asked for, the exact length) before a byte is returned.
 *
 * Retries: transport failures (reset, timeout, truncated body), 408, 429
 * and 5xx are retried with full-jitter exponential backoff; when attempts
 * run out the request is -EIO with one log line naming the object and the
 * last status.  Secrets (secret key, session token, bearer token) never
 * reach a log line: only the store URL, the key and the status are logged.
 *
 * Coalescing: range GETs take one of `connections` slots.  A GET that
 * waits for a slot stays queued; whichever GET gets a slot next takes every
 * queued range of the same object (same pinned ETag) that touches or
 * nearly touches its own (gaps up to COALESCE_GAP bytes), up to
 * COALESCE_MAX bytes, and fetches the union with one request, handing each
 * waiter its bytes.  With free slots nothing waits, so nothing is delayed
 * to be merged; under load adjacent chunk reads become one request.
 *
 * Locking: s->mu guards the pinned-object table; s->qmu the GET queue and
 * the free-slot count (never both held).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "http.h"
#include "s3_int.h"
#include "sigv4.h"

#define COALESCE_GAP ((uint64_t)16 << 10)
#define COALESCE_MAX ((uint64_t)8 << 20)

/* One range GET waiting for a slot (on the caller's stack). */
struct greq {
	struct greq *next;
	const char *name; /* full object name */
	const char *key; /* store key, for logs */
	const struct obj *o; /* pinned entry (size, ETag) */
	uint64_t first, last; /* inclusive */
	void *dst; /* last - first + 1 bytes */
	int taken; /* in another GET's batch: wait for done */
	int done;
	int rc; /* 0 or -errno once done */
};

/* ---------------------------------------------------------------- pinned objects */

static uint64_t hash_str(const char *s)
{
	uint64_t h = 1469598103934665603ull;
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h;
}

static struct obj *obj_find_locked(struct s3_store *s, const char *name)
{
	for (struct obj *o = s->tab[hash_str(name) % NBUCKETS]; o; o = o->next)
		if (strcmp(o->key, name) == 0)
			return o;
	return NULL;
}

/* Pin (size, etag) of an object the first time it is seen; copy the pinned
 * entry to *out. */
int ckpt_s3_obj_pin(struct s3_store *s, const char *name, uint64_t size, const char *etag, int64_t mtime_ns,
		    struct obj *out)
{
	pthread_mutex_lock(&s->mu);
	struct obj *o = obj_find_locked(s, name);
	if (!o) {
		size_t n = strlen(name);
		o = calloc(1, sizeof(*o) + n + 1);
		if (!o) {
			pthread_mutex_unlock(&s->mu);
			return -ENOMEM;
		}
		memcpy(o->key, name, n + 1);
		o->size = size;
		o->mtime_ns = mtime_ns;
		snprintf(o->etag, sizeof(o->etag), "%s", etag ? etag : "");
		uint64_t b = hash_str(name) % NBUCKETS;
		o->next = s->tab[b];
		s->tab[b] = o;
	}
	if (out) {
		*out = *o;
		out->next = NULL;
	}
	pthread_mutex_unlock(&s->mu);
	return 0;
}

static int obj_get(struct s3_store *s, const char *name, struct obj *out)
{
	pthread_mutex_lock(&s->mu);
	struct obj *o = obj_find_locked(s, name);
	if (o) {
		*out = *o;
		out->next = NULL;
	}
	pthread_mutex_unlock(&s->mu);
	return o ? 0 : -ENOENT;
}

static void obj_mark_stale(struct s3_store *s, const char *name)
{
	pthread_mutex_lock(&s->mu);
	struct obj *o = obj_find_locked(s, name);
	if (o)
		o->stale = 1;
	pthread_mutex_unlock(&s->mu);
}

/* The object was (re)written: what readers pin from now on is the new one. */
void ckpt_s3_obj_replace(struct s3_store *s, const char *name, uint64_t size, const char *etag)
{
	pthread_mutex_lock(&s->mu);
	struct obj *o = obj_find_locked(s, name);
	if (o) {
		o->size = size;
		o->stale = 0;
		o->mtime_ns = (int64_t)time(NULL) * 1000000000;
		snprintf(o->etag, sizeof(o->etag), "%s", etag ? etag : "");
	}
	pthread_mutex_unlock(&s->mu);
}

static int addh(char **v, int *n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int addh(char **v, int *n, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int rc = vasprintf(&v[*n], fmt, ap);
	va_end(ap);
	if (rc < 0) {
		v[*n] = NULL;
		return -1;
	}
	(*n)++;
	return 0;
}

/* Build headers and URL and perform one attempt. */
static int attempt(struct s3_store *s, const struct rq *r, struct ckpt_http_resp *resp)
{
	char *enc = NULL, *path = NULL, *url = NULL, *auth = NULL;
	char *hdrs[10] = { 0 };
	char *bearer = NULL;
	int nh = 0, rc = -ENOMEM;
	if (r->name) {
		enc = ckpt_sigv4_uri_encode(r->name, 1);
		if (!enc)
			goto out;
	}
	size_t pl = strlen(s->base_path) + (enc ? strlen(enc) : 0) + 4;
	path = malloc(pl);
	if (!path)
		goto out;
	if (enc)
		snprintf(path, pl, "%s/%s", s->base_path, enc);
	else
		snprintf(path, pl, "%s%s", s->base_path, *s->base_path ? "" : "/");
	size_t ul = strlen(s->scheme_host) + strlen(path) + strlen(r->query) + 4;
	url = malloc(ul);
	if (!url)
		goto out;
	snprintf(url, ul, "%s%s%s%s", s->scheme_host, path, *r->query ? "?" : "", r->query);

	char date[17];
	ckpt_sigv4_amz_date(time(NULL), date);
	const char *ph = r->payload_hash ? r->payload_hash : CKPT_SHA256_EMPTY;
	if (addh(hdrs, &nh, "Host: %s", s->host_hdr) < 0)
		goto out;
	if (r->range && addh(hdrs, &nh, "Range: %s", r->range) < 0)
		goto out;
	if (r->if_match && *r->if_match && addh(hdrs, &nh, "If-Match: %s", r->if_match) < 0)
		goto out;
	if (r->extra && addh(hdrs, &nh, "%s", r->extra) < 0)
		goto out;
	if (s->auth == AUTH_SIGV4) {
		struct ckpt_sigv4_header sh[6];
		size_t n = 0;
		sh[n++] = (struct ckpt_sigv4_header){ "host", s->host_hdr };
		if (r->range)
			sh[n++] = (struct ckpt_sigv4_header){ "range", r->range };
		sh[n++] = (struct ckpt_sigv4_header){ "x-amz-content-sha256", ph };
		sh[n++] = (struct ckpt_sigv4_header){ "x-amz-date", date };
		if (s->session_token)
			sh[n++] = (struct ckpt_sigv4_header){ "x-amz-security-token", s->session_token };
		struct ckpt_sigv4_creds c = { s->akid, s->secret, s->region, "s3" };
		auth = ckpt_sigv4_sign(&c, date, r->method, path, r->query, sh, n, ph, NULL);
		if (!auth)
			goto out;
		if (addh(hdrs, &nh, "x-amz-content-sha256: %s", ph) < 0 ||
		    addh(hdrs, &nh, "x-amz-date: %s", date) < 0 ||
		    (s->session_token && addh(hdrs, &nh, "x-amz-security-token: %s", s->session_token) < 0) ||
		    addh(hdrs, &nh, "Authorization: %s", auth) < 0)
			goto out;
	} else if (s->auth == AUTH_BEARER) {
		rc = ckpt_s3_bearer_refresh(s);
		if (rc)
			goto out;
		rc = -ENOMEM;
		pthread_mutex_lock(&s->mu);
		bearer = xstrdup(s->bearer);
		pthread_mutex_unlock(&s->mu);
		if (!bearer || addh(hdrs, &nh, "Authorization: Bearer %s", bearer) < 0)
			goto out;
	}
	hdrs[nh] = NULL;
	struct ckpt_http_req req = { r->method,	 url,	      (const char *const *)hdrs,
				     r->body,	 r->body_len, r->dst,
				     r->dst_cap, r->max_body };
	rc = ckpt_http_perform(s->http, &req, resp);
out:
	for (int i = 0; i < nh; i++)
		free_secret(hdrs[i]);
	free_secret(auth);
	free_secret(bearer);
	free(enc);
	free(path);
	free(url);
	return rc;
}

/* Status that ends the retries with an errno (0: success status). */
static int status_errno(long st)
{
	if (st >= 200 && st < 300)
		return 0;
	switch (st) {
	case 304:
		return 0;
	case 404:
		return -ENOENT;
	case 401:
	case 403:
		return -EACCES;
	case 412:
		return -ESTALE;
	default:
		return -EIO;
	}
}

/* S3 error code from an error body, for logs. */
static void err_code(const struct ckpt_http_resp *resp, char *buf, size_t cap)
{
	const char *c, *ce, *nx;
	buf[0] = 0;
	if (resp->body && ckpt_s3_xml_elem(resp->body, resp->body + resp->len, "Code", &c, &ce, &nx) == 0) {
		size_t n = (size_t)(ce - c);
		if (n >= cap)
			n = cap - 1;
		buf[0] = ' ';
		memcpy(buf + 1, c, n < cap - 2 ? n : cap - 2);
		buf[(n < cap - 2 ? n : cap - 2) + 1] = 0;
	}
}

/*
 * Perform with retries.  0 with *resp holding a 2xx/304 answer; otherwise
 * -ENOENT (404, not logged), -EACCES, -ESTALE, -EIO (logged).
 */
int ckpt_s3_request(struct s3_store *s, const struct rq *r, struct ckpt_http_resp *resp)
{
	unsigned attempts = s->retries + 1;
	char what[160];
	for (unsigned a = 1;; a++) {
		int rc = attempt(s, r, resp);
		if (rc == -ENOMEM || rc == -EACCES)
			return rc;
		int retry = ckpt_http_retryable(rc, resp);
		if (r->maybe_applied && rc != -ENOMEM && (rc != 0 || resp->status >= 500))
			*r->maybe_applied = 1;
		if (!retry || a >= attempts) {
			if (rc == 0) {
				int e = status_errno(resp->status);
				if (e == 0)
					return 0;
				if (e != -ENOENT) {
					char code[64];
					err_code(resp, code, sizeof(code));
					ckpt_log(CKPT_LOG_ERR, "%s: %s %s%s%s: HTTP %ld%s%s", s->base.root,
						 r->what, r->name ? r->name : "(bucket)", r->range ? " " : "",
						 r->range ? r->range : "", resp->status, code,
						 retry ? " (retries exhausted)" : "");
				}
				ckpt_http_resp_free(resp);
				return e;
			}
			ckpt_log(CKPT_LOG_ERR, "%s: %s %s%s%s: %s%s", s->base.root, r->what,
				 r->name ? r->name : "(bucket)", r->range ? " " : "",
				 r->range ? r->range : "", ckpt_http_what(rc, resp, what, sizeof(what)),
				 retry ? " (retries exhausted)" : "");
			ckpt_http_resp_free(resp);
			return -EIO;
		}
		ckpt_log(CKPT_LOG_DEBUG, "%s: %s %s: %s, retry %u", s->base.root, r->what,
			 r->name ? r->name : "", ckpt_http_what(rc, resp, what, sizeof(what)), a);
		ckpt_http_resp_free(resp);
		ckpt_http_backoff(a, s->retry_base_ms);
	}
}

/* ---------------------------------------------------------------- metadata */

int ckpt_s3_head(struct s3_store *s, const char *name, struct obj *out)
{
	struct rq r = { "HEAD", name, "", NULL, NULL, NULL, 0, 0, "HEAD", NULL, 0, NULL, NULL, NULL };
	struct ckpt_http_resp resp;
	int rc = ckpt_s3_request(s, &r, &resp);
	if (rc)
		return rc;
	ckpt_http_resp_free(&resp);
	if (resp.content_length < 0) {
		ckpt_log(CKPT_LOG_ERR, "%s: HEAD %s: no Content-Length", s->base.root, name);
		return -EIO;
	}
	int64_t mt = 0;
	if (resp.last_modified[0]) {
		struct tm tm = { 0 };
		if (strptime(resp.last_modified, "%a, %d %b %Y %H:%M:%S GMT", &tm))
			mt = ckpt_s3_tm_ns(&tm);
	}
	return ckpt_s3_obj_pin(s, name, (uint64_t)resp.content_length, resp.etag, mt, out);
}

/* Pinned metadata of an object, asking the server when not seen yet. */
int ckpt_s3_meta(struct s3_store *s, const char *name, struct obj *out)
{
	if (obj_get(s, name, out) == 0)
		return 0;
	return ckpt_s3_head(s, name, out);
}

struct page_tramp {
	struct s3_store *s;
	page_cb cb;
	void *ctx;
};

static int page_tramp_cb(void *ctx, const char *key, const char *etag, uint64_t size, int64_t mtime_ns,
			 int is_prefix)
{
	struct page_tramp *t = ctx;
	return t->cb(t->s, t->ctx, key, etag, size, mtime_ns, is_prefix);
}

/* Tokens of one listing seen so far (FNV-1a of each): a token seen again
 * is a loop. */
struct seen_tokens {
	uint64_t *h;
	size_t n, cap;
};

/* 1 when token was seen before (else it is remembered); -ENOMEM. */
static int token_seen(struct seen_tokens *t, const char *token)
{
	uint64_t h = hash_str(token);
	for (size_t i = 0; i < t->n; i++)
		if (t->h[i] == h)
			return 1;
	if (t->n == t->cap) {
		size_t nc = t->cap ? 2 * t->cap : 64;
		uint64_t *nh = realloc(t->h, nc * sizeof(*nh));
		if (!nh)
			return -ENOMEM;
		t->h = nh;
		t->cap = nc;
	}
	t->h[t->n++] = h;
	return 0;
}

/* ListObjectsV2 of every key starting with `pfx` (full object names).
 * Every page is checked whole (ckpt_s3_list_parse) before any of its
 * entries reaches cb; a page that is not a valid listing is asked for
 * again like a transient answer, then the listing is -EIO, logged with
 * the request.  A continuation token seen twice, more than
 * CKPT_S3_LIST_MAX_PAGES pages, or a truncated page without a token is
 * -EIO as well: the listing ends in an error, never in part.  The caller
 * must use nothing cb received when the result is not 0. */
int ckpt_s3_list_objects(struct s3_store *s, const char *pfx, int delim, unsigned max_keys, int one_page,
			 page_cb cb, void *ctx)
{
	char *token = NULL;
	int rc = 0;
	char mk[16];
	struct seen_tokens seen = { NULL, 0, 0 };
	snprintf(mk, sizeof(mk), "%u", max_keys);
	for (unsigned page = 1;; page++) {
		if (page > CKPT_S3_LIST_MAX_PAGES) {
			ckpt_log(CKPT_LOG_ERR, "%s: LIST prefix '%s': more than %u pages; refused",
				 s->base.root, pfx, CKPT_S3_LIST_MAX_PAGES);
			rc = -EIO;
			break;
		}
		const char *n[6], *v[6];
		size_t k = 0;
		n[k] = "list-type", v[k++] = "2";
		n[k] = "prefix", v[k++] = pfx;
		n[k] = "max-keys", v[k++] = mk;
		n[k] = "encoding-type", v[k++] = "url";
		if (delim)
			n[k] = "delimiter", v[k++] = "/";
		if (token)
			n[k] = "continuation-token", v[k++] = token;
		char *q = ckpt_sigv4_query(n, v, k);
		if (!q) {
			rc = -ENOMEM;
			break;
		}
		char *next = NULL;
		int more = 0;
		for (unsigned a = 1;; a++) {
			struct rq r = { "GET",	NULL, q, NULL, NULL, NULL, 0, (size_t)64 << 20,
					"LIST", NULL, 0, NULL, NULL, NULL };
			struct ckpt_http_resp resp;
			rc = ckpt_s3_request(s, &r, &resp);
			if (rc == -ENOENT) {
				ckpt_log(CKPT_LOG_ERR, "%s: LIST: no such bucket", s->base.root);
				rc = -EIO;
			}
			if (rc)
				break;
			struct page_tramp t = { s, cb, ctx };
			const char *why = NULL;
			rc = ckpt_s3_list_parse(resp.body ? resp.body : "", resp.len, pfx, page_tramp_cb, &t,
						&more, &next, &why);
			long st = resp.status;
			size_t len = resp.len;
			ckpt_http_resp_free(&resp);
			if (rc != -EBADMSG)
				break;
			if (a > s->retries) {
				ckpt_log(CKPT_LOG_ERR,
					 "%s: LIST prefix '%s' page %u: HTTP %ld with %zu bytes that are not "
					 "a "
					 "valid listing (%s), %u attempts",
					 s->base.root, pfx, page, st, len, why ? why : "?", a);
				rc = -EIO;
				break;
			}
			ckpt_log(CKPT_LOG_DEBUG,
				 "%s: LIST prefix '%s' page %u: not a valid listing (%s), retry %u",
				 s->base.root, pfx, page, why ? why : "?", a);
			ckpt_http_backoff(a, s->retry_base_ms);
		}
		free(q);
		free(token);
		token = next;
		if (rc)
			break;
		if (more && !token) {
			ckpt_log(CKPT_LOG_ERR,
				 "%s: LIST prefix '%s' page %u: truncated answer without a "
				 "continuation token",
				 s->base.root, pfx, page);
			rc = -EIO;
			break;
		}
		if (!more || one_page)
			break;
		int again = token_seen(&seen, token);
		if (again) {
			if (again > 0)
				ckpt_log(CKPT_LOG_ERR,
					 "%s: LIST prefix '%s' page %u: continuation token seen before (a "
					 "loop)",
					 s->base.root, pfx, page);
			rc = again > 0 ? -EIO : again;
			break;
		}
	}
	free(seen.h);
	free(token);
	return rc;
}

/* ---------------------------------------------------------------- reading */

/* Parse "bytes F-L/T". */
static int parse_cr(const char *cr, uint64_t *f, uint64_t *l, uint64_t *t)
{
	unsigned long long a, b, c;
	if (sscanf(cr, "bytes %llu-%llu/%llu", &a, &b, &c) != 3)
		return -1;
	*f = a, *l = b, *t = c;
	return 0;
}

/* A 404 to a GET of an object the listing or a HEAD showed: ask HEAD
 * again.  1: HEAD says it is gone (404) too; 0: HEAD still finds it (the
 * 404 was transient); -errno: HEAD failed. */
static int gone_for_head(struct s3_store *s, const char *name)
{
	struct rq r = { "HEAD", name, "", NULL, NULL, NULL, 0, 0, "HEAD", NULL, 0, NULL, NULL, NULL };
	struct ckpt_http_resp resp;
	int rc = ckpt_s3_request(s, &r, &resp);
	if (rc == -ENOENT)
		return 1;
	if (rc)
		return rc;
	ckpt_http_resp_free(&resp);
	return 0;
}

/* One validated GET of [first, last] of object `name` (pinned as *o) into
 * dst.  An answer that is not the range asked for (another Content-Range,
 * another length, a 200 with the whole object) and a 404 that a HEAD
 * contradicts are retried like transient answers, s->retries times; an
 * object that GET and HEAD both say is gone is marked stale.  0 or -errno
 * (logged). */
static int fetch_range(struct s3_store *s, const char *name, const char *key, const struct obj *o,
		       uint64_t first, uint64_t last, void *dst)
{
	int whole = first == 0 && last + 1 == o->size;
	uint64_t want = last - first + 1;
	char range[64];
	snprintf(range, sizeof(range), "bytes=%llu-%llu", (unsigned long long)first,
		 (unsigned long long)last);
	struct rq r = { "GET", name, "",  whole ? NULL : range, o->etag, dst, (size_t)want, 0, "GET", NULL, 0,
			NULL,  NULL, NULL };
	for (unsigned a = 1;; a++) {
		struct ckpt_http_resp resp;
		__atomic_add_fetch(&s->gets, 1, __ATOMIC_RELAXED);
		int rc = ckpt_s3_request(s, &r, &resp);
		if (rc == -ESTALE) {
			ckpt_log(CKPT_LOG_ERR,
				 "%s/%s: object changed since it was first seen (ETag no longer %s)",
				 s->base.root, key, o->etag);
			obj_mark_stale(s, name);
		}
		if (rc == -ENOENT) {
			int g = gone_for_head(s, name);
			if (g == 0 && a <= s->retries) {
				ckpt_log(CKPT_LOG_DEBUG, "%s/%s: GET %s: 404 but HEAD finds it, retry %u",
					 s->base.root, key, range, a);
				ckpt_http_backoff(a, s->retry_base_ms);
				continue;
			}
			if (g == 1) {
				ckpt_log(CKPT_LOG_ERR,
					 "%s/%s: object vanished since it was first seen (GET and "
					 "HEAD: 404)",
					 s->base.root, key);
				obj_mark_stale(s, name);
			} else {
				ckpt_log(CKPT_LOG_ERR,
					 "%s/%s: GET %s: 404 for a listed object%s, %u attempts",
					 s->base.root, key, range, g == 0 ? " that HEAD still finds" : "", a);
			}
			rc = -EIO;
		}
		if (rc)
			return rc;
		ckpt_http_resp_free(&resp);
		const char *bad = NULL;
		uint64_t f = 0, l = 0, t = 0;
		if (o->etag[0] && resp.etag[0] && strcmp(o->etag, resp.etag) != 0) {
			ckpt_log(CKPT_LOG_ERR,
				 "%s/%s: object changed since it was first seen (ETag %s, now %s)",
				 s->base.root, key, o->etag, resp.etag);
			obj_mark_stale(s, name);
			return -ESTALE;
		}
		if (resp.len != want)
			bad = "body length differs from the range asked for";
		else if (!whole && resp.status != 206 &&
			 !(resp.status == 200 && first == 0 && want == o->size))
			bad = "range ignored";
		else if (resp.status == 206 && (parse_cr(resp.content_range, &f, &l, &t) || f != first ||
						l != last || t != o->size))
			bad = "Content-Range differs from the range asked for";
		if (!bad)
			return 0;
		if (a <= s->retries) {
			ckpt_log(CKPT_LOG_DEBUG, "%s/%s: GET %s: HTTP %ld, %s (Content-Range '%s'), retry %u",
				 s->base.root, key, range, resp.status, bad, resp.content_range, a);
			ckpt_http_backoff(a, s->retry_base_ms);
			continue;
		}
		ckpt_log(CKPT_LOG_ERR,
			 "%s/%s: GET %s: HTTP %ld, %s (Content-Range '%s', %zu bytes), %u attempts",
			 s->base.root, key, range, resp.status, bad, resp.content_range, resp.len, a);
		return -EIO;
	}
}

/* Queued GETs of the same object next to [*lo, *hi]: move them from the
 * queue to *batch and widen the range (s->qmu held). */
static void take_neighbours(struct s3_store *s, const struct greq *me, uint64_t *lo, uint64_t *hi,
			    struct greq **batch)
{
	for (int grew = 1; grew;) {
		grew = 0;
		for (struct greq **pp = &s->queue; *pp;) {
			struct greq *q = *pp;
			uint64_t nlo = q->first < *lo ? q->first : *lo, nhi = q->last > *hi ? q->last : *hi;
			if (strcmp(q->name, me->name) == 0 && strcmp(q->o->etag, me->o->etag) == 0 &&
			    q->first <= *hi + 1 + COALESCE_GAP && q->last + 1 + COALESCE_GAP >= *lo &&
			    nhi - nlo + 1 <= COALESCE_MAX) {
				*pp = q->next;
				q->taken = 1;
				q->next = *batch;
				*batch = q;
				*lo = nlo;
				*hi = nhi;
				grew = 1;
			} else {
				pp = &q->next;
			}
		}
	}
}

/* GET [first, last] of `name` into dst through the slot queue, merged with
 * queued neighbours (see the top of the file). */
int ckpt_s3_coalesced_get(struct s3_store *s, const char *name, const char *key, const struct obj *o,
			  uint64_t first, uint64_t last, void *dst)
{
	struct greq me = { NULL, name, key, o, first, last, dst, 0, 0, 0 };
	pthread_mutex_lock(&s->qmu);
	struct greq **tail = &s->queue;
	while (*tail)
		tail = &(*tail)->next;
	*tail = &me;
	while (!me.done && (me.taken || s->slots == 0))
		pthread_cond_wait(&s->qcv, &s->qmu);
	if (me.done) { /* served by another GET */
		pthread_mutex_unlock(&s->qmu);
		return me.rc;
	}
	s->slots--;
	for (struct greq **pp = &s->queue; *pp; pp = &(*pp)->next)
		if (*pp == &me) {
			*pp = me.next;
			break;
		}
	me.next = NULL;
	struct greq *batch = NULL;
	uint64_t lo = first, hi = last;
	take_neighbours(s, &me, &lo, &hi, &batch);
	pthread_mutex_unlock(&s->qmu);

	int rc;
	if (!batch) {
		rc = fetch_range(s, name, key, o, first, last, dst);
	} else {
		uint8_t *buf = malloc((size_t)(hi - lo + 1));
		rc = buf ? fetch_range(s, name, key, o, lo, hi, buf) : -ENOMEM;
		if (rc == 0) {
			memcpy(dst, buf + (first - lo), (size_t)(last - first + 1));
			for (struct greq *q = batch; q; q = q->next)
				memcpy(q->dst, buf + (q->first - lo), (size_t)(q->last - q->first + 1));
		}
		free(buf);
	}
	pthread_mutex_lock(&s->qmu);
	for (struct greq *q = batch, *nx; q; q = nx) {
		nx = q->next;
		q->rc = rc;
		q->done = 1;
		s->merged++;
	}
	s->slots++;
	pthread_cond_broadcast(&s->qcv);
	pthread_mutex_unlock(&s->qmu);
	return rc;
}
