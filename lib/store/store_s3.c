/*
 * store_s3.c - object stores: s3:// (AWS S3 and S3-compatible services)
 * and gs:// (Google Cloud Storage through its XML API), read-only.
 *
 * Keys of the store are object names below the mounted prefix.  Requests:
 *   listdir -> ListObjectsV2 with delimiter '/' (paginated);
 *   list    -> ListObjectsV2 without delimiter;
 *   stat    -> the pinned entry, else HEAD, else a 1-key listing of "key/";
 *   read    -> one GET (a Range GET unless the whole object is wanted).
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
 * run out the read is -EIO with one log line naming the object and the
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
 * Locking: s->mu guards the pinned-object table and the bearer token;
 * s->qmu the GET queue and the free-slot count (never both held).
 */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

#include "common.h"
#include "http.h"
#include "sigv4.h"
#include "store.h"
#include "store_int.h"

enum auth_kind { AUTH_NONE, AUTH_SIGV4, AUTH_BEARER };

struct obj {
	struct obj *next;
	uint64_t size;
	int64_t mtime_ns;
	char etag[128];
	int stale; /* seen changed: every read fails */
	char key[]; /* full object name */
};

#define NBUCKETS 4096

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

struct s3_store {
	struct ckpt_store base;
	pthread_mutex_t qmu;
	pthread_cond_t qcv;
	struct greq *queue; /* waiting GETs, oldest first */
	unsigned slots; /* free GET slots */
	unsigned conns; /* -o connections */
	unsigned long long gets, merged; /* GET requests sent; ranges served by another's request */
	int gcs;
	char *bucket;
	char *prefix; /* object-name prefix without trailing '/', "" for the bucket root */
	char *scheme_host; /* "http://127.0.0.1:4568" */
	char *host_hdr; /* "127.0.0.1:4568" */
	char *base_path; /* "" or "/BUCKET" (path style) plus any endpoint path */
	char *region;
	enum auth_kind auth;
	char *akid, *secret, *session_token;
	char *token_file, *bearer;
	struct timespec bearer_mtime;
	char *meta_url; /* GCE metadata server token URL, or NULL */
	time_t bearer_expiry; /* metadata-server tokens: when to fetch again */
	unsigned retries, retry_base_ms;
	ckpt_http *http;
	struct ckpt_dcache *dcache; /* -o cache_dir, or NULL */
	pthread_mutex_t mu;
	struct obj *tab[NBUCKETS];
};

/* ---------------------------------------------------------------- small helpers */

static uint64_t hash_str(const char *s)
{
	uint64_t h = 1469598103934665603ull;
	for (; *s; s++)
		h = (h ^ (unsigned char)*s) * 1099511628211ull;
	return h;
}

static char *xstrdup(const char *s)
{
	return s ? strdup(s) : NULL;
}

static void free_secret(char *s)
{
	if (s) {
		volatile char *p = s;
		while (*p)
			*p++ = 0;
		free(s);
	}
}

/* Full object name of store key `key` ("" = the prefix itself). */
static char *objname(struct s3_store *s, const char *key)
{
	return ckpt_store_join(s->prefix, key);
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
static int obj_pin(struct s3_store *s, const char *name, uint64_t size, const char *etag, int64_t mtime_ns,
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

/* ---------------------------------------------------------------- XML */

/* Next element <tag> (or <tag attr...>) in [p, end): its content in
 * [*c, *ce), *next after the closing tag.  0 found, -1 not. */
static int xml_elem(const char *p, const char *end, const char *tag, const char **c, const char **ce,
		    const char **next)
{
	size_t tl = strlen(tag);
	while (p < end) {
		const char *lt = memchr(p, '<', (size_t)(end - p));
		if (!lt || lt + 1 + tl >= end)
			return -1;
		if (strncmp(lt + 1, tag, tl) == 0 && (lt[1 + tl] == '>' || lt[1 + tl] == ' ')) {
			const char *gt = memchr(lt, '>', (size_t)(end - lt));
			if (!gt)
				return -1;
			if (gt[-1] == '/') { /* <tag/> */
				*c = *ce = gt + 1;
				*next = gt + 1;
				return 0;
			}
			const char *q = gt + 1;
			while (q < end) {
				const char *l2 = memchr(q, '<', (size_t)(end - q));
				if (!l2 || l2 + 2 + tl >= end)
					return -1;
				if (l2[1] == '/' && strncmp(l2 + 2, tag, tl) == 0 && l2[2 + tl] == '>') {
					*c = gt + 1;
					*ce = l2;
					*next = l2 + 3 + tl;
					return 0;
				}
				q = l2 + 1;
			}
			return -1;
		}
		p = lt + 1;
	}
	return -1;
}

static int hexval(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* Text of [c, ce) with XML entities decoded (and, when url, form-decoded). */
static char *xml_text(const char *c, const char *ce, int url)
{
	char *r = malloc((size_t)(ce - c) + 1), *o = r;
	if (!r)
		return NULL;
	while (c < ce) {
		if (*c == '&') {
			const char *semi = memchr(c, ';', (size_t)(ce - c));
			size_t n = semi ? (size_t)(semi - c) : 0;
			if (n == 5 && strncmp(c, "&quot", 5) == 0)
				*o++ = '"';
			else if (n == 4 && strncmp(c, "&amp", 4) == 0)
				*o++ = '&';
			else if (n == 3 && strncmp(c, "&lt", 3) == 0)
				*o++ = '<';
			else if (n == 3 && strncmp(c, "&gt", 3) == 0)
				*o++ = '>';
			else if (n == 5 && strncmp(c, "&apos", 5) == 0)
				*o++ = '\'';
			else if (n >= 3 && c[1] == '#') {
				unsigned long v =
					c[2] == 'x' ? strtoul(c + 3, NULL, 16) : strtoul(c + 2, NULL, 10);
				if (v < 0x80) {
					*o++ = (char)v;
				} else if (v < 0x800) {
					*o++ = (char)(0xc0 | (v >> 6));
					*o++ = (char)(0x80 | (v & 0x3f));
				} else {
					*o++ = (char)(0xe0 | ((v >> 12) & 0x0f));
					*o++ = (char)(0x80 | ((v >> 6) & 0x3f));
					*o++ = (char)(0x80 | (v & 0x3f));
				}
			} else {
				*o++ = *c++;
				continue;
			}
			c = semi + 1;
			continue;
		}
		*o++ = *c++;
	}
	*o = 0;
	if (url) {
		char *w = r;
		for (char *p = r; *p; p++) {
			if (*p == '+') {
				*w++ = ' ';
			} else if (*p == '%' && hexval(p[1]) >= 0 && hexval(p[2]) >= 0) {
				*w++ = (char)(hexval(p[1]) * 16 + hexval(p[2]));
				p += 2;
			} else {
				*w++ = *p;
			}
		}
		*w = 0;
	}
	return r;
}

/* A UTC calendar time as ns since 1970; 0 (unknown) outside 1970..2200,
 * where the product would overflow. */
static int64_t tm_ns(struct tm *tm)
{
	if (tm->tm_year < 70 || tm->tm_year > 300)
		return 0;
	return (int64_t)timegm(tm) * 1000000000;
}

static int64_t parse_iso_ns(const char *s)
{
	struct tm tm = { 0 };
	int y, mo, d, h, mi;
	double sec;
	if (sscanf(s, "%d-%d-%dT%d:%d:%lf", &y, &mo, &d, &h, &mi, &sec) != 6)
		return 0;
	/* out of range: 0 (unknown), and no overflow below */
	if (y < 1970 || y > 2200 || mo < 1 || mo > 12 || d < 1 || d > 31 || h < 0 || h > 23 || mi < 0 ||
	    mi > 59 || !(sec >= 0 && sec < 61))
		return 0;
	tm.tm_year = y - 1900;
	tm.tm_mon = mo - 1;
	tm.tm_mday = d;
	tm.tm_hour = h;
	tm.tm_min = mi;
	tm.tm_sec = (int)sec;
	return tm_ns(&tm) + (int64_t)((sec - (int)sec) * 1e9);
}

/* ---------------------------------------------------------------- requests */

/* A token from the GCE metadata server, kept until a minute before it expires. */
static int metadata_refresh(struct s3_store *s)
{
	time_t now = time(NULL);
	pthread_mutex_lock(&s->mu);
	int fresh = s->bearer && now < s->bearer_expiry;
	pthread_mutex_unlock(&s->mu);
	if (fresh)
		return 0;
	const char *hdrs[] = { "Metadata-Flavor: Google", NULL };
	struct ckpt_http_req req = { "GET", s->meta_url, hdrs, NULL, 0, NULL, 0, 65536 };
	struct ckpt_http_resp resp;
	int rc = -EIO;
	char what[160];
	for (unsigned a = 1; a <= 3; a++) {
		rc = ckpt_http_perform(s->http, &req, &resp);
		if (rc == 0 && resp.status == 200)
			break;
		if (a == 3 || !ckpt_http_retryable(rc, &resp)) {
			ckpt_log(CKPT_LOG_ERR, "%s: metadata server token: %s", s->base.root,
				 ckpt_http_what(rc, &resp, what, sizeof(what)));
			ckpt_http_resp_free(&resp);
			return -EACCES;
		}
		ckpt_http_resp_free(&resp);
		ckpt_http_backoff(a, s->retry_base_ms);
	}
	cJSON *j = cJSON_ParseWithLength(resp.body ? resp.body : "", resp.len);
	if (resp.body)
		memset(resp.body, 0, resp.len);
	ckpt_http_resp_free(&resp);
	const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "access_token");
	const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "expires_in");
	char *tok = cJSON_IsString(t) && *t->valuestring ? strdup(t->valuestring) : NULL;
	double life = cJSON_IsNumber(e) ? e->valuedouble : 300;
	if (cJSON_IsString(t))
		memset(t->valuestring, 0, strlen(t->valuestring));
	cJSON_Delete(j);
	if (!tok) {
		ckpt_log(CKPT_LOG_ERR, "%s: metadata server token: no access_token in the answer",
			 s->base.root);
		return -EACCES;
	}
	pthread_mutex_lock(&s->mu);
	free_secret(s->bearer);
	s->bearer = tok;
	s->bearer_expiry = now + (time_t)(life > 120 ? life - 60 : life / 2);
	pthread_mutex_unlock(&s->mu);
	return 0;
}

static int bearer_refresh(struct s3_store *s)
{
	if (s->meta_url)
		return metadata_refresh(s);
	if (!s->token_file)
		return 0;
	struct stat st;
	if (stat(s->token_file, &st) != 0) {
		ckpt_log(CKPT_LOG_ERR, "%s: token file %s: %s", s->base.root, s->token_file, strerror(errno));
		return -EACCES;
	}
	pthread_mutex_lock(&s->mu);
	int same = s->bearer && st.st_mtim.tv_sec == s->bearer_mtime.tv_sec &&
		   st.st_mtim.tv_nsec == s->bearer_mtime.tv_nsec;
	pthread_mutex_unlock(&s->mu);
	if (same)
		return 0;
	FILE *f = fopen(s->token_file, "r");
	char buf[8192];
	size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
	if (f)
		fclose(f);
	buf[n] = 0;
	while (n && isspace((unsigned char)buf[n - 1]))
		buf[--n] = 0;
	char *p = buf;
	while (isspace((unsigned char)*p))
		p++;
	if (!*p) {
		ckpt_log(CKPT_LOG_ERR, "%s: token file %s is empty or unreadable", s->base.root,
			 s->token_file);
		return -EACCES;
	}
	char *t = strdup(p);
	memset(buf, 0, sizeof(buf));
	if (!t)
		return -ENOMEM;
	pthread_mutex_lock(&s->mu);
	free_secret(s->bearer);
	s->bearer = t;
	s->bearer_mtime = st.st_mtim;
	pthread_mutex_unlock(&s->mu);
	return 0;
}

struct rq {
	const char *method;
	const char *name; /* object name, NULL for a bucket request */
	const char *query; /* canonical query, "" for none */
	const char *range; /* "bytes=F-L" or NULL */
	const char *if_match; /* ETag or NULL */
	void *dst;
	size_t dst_cap;
	size_t max_body;
	const char *what; /* for logs: "GET", "LIST", ... */
	/* writes */
	const void *body;
	size_t body_len;
	const char *payload_hash; /* hex SHA-256 of body; NULL = the empty body's */
	const char *extra; /* one more header line ("If-None-Match: *"), unsigned; or NULL */
};

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
		rc = bearer_refresh(s);
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
	if (resp->body && xml_elem(resp->body, resp->body + resp->len, "Code", &c, &ce, &nx) == 0) {
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
static int request(struct s3_store *s, const struct rq *r, struct ckpt_http_resp *resp)
{
	unsigned attempts = s->retries + 1;
	char what[160];
	for (unsigned a = 1;; a++) {
		int rc = attempt(s, r, resp);
		if (rc == -ENOMEM || rc == -EACCES)
			return rc;
		int retry = ckpt_http_retryable(rc, resp);
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

static int head(struct s3_store *s, const char *name, struct obj *out)
{
	struct rq r = { "HEAD", name, "", NULL, NULL, NULL, 0, 0, "HEAD", NULL, 0, NULL, NULL };
	struct ckpt_http_resp resp;
	int rc = request(s, &r, &resp);
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
			mt = tm_ns(&tm);
	}
	return obj_pin(s, name, (uint64_t)resp.content_length, resp.etag, mt, out);
}

/* Pinned metadata of an object, asking the server when not seen yet. */
static int meta(struct s3_store *s, const char *name, struct obj *out)
{
	if (obj_get(s, name, out) == 0)
		return 0;
	return head(s, name, out);
}

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

typedef int (*page_cb)(struct s3_store *s, void *ctx, const char *key, const char *etag, uint64_t size,
		       int64_t mtime_ns, int is_prefix);

int ckpt_s3_list_parse(const char *body, size_t len, ckpt_s3_list_cb cb, void *ctx, int *truncated,
		       char **token)
{
	const char *b = body, *e = b + len;
	const char *c, *ce, *nx;
	int rc = 0;
	*truncated = 0;
	*token = NULL;
	int url = xml_elem(b, e, "EncodingType", &c, &ce, &nx) == 0 && ce - c == 3 && strncmp(c, "url", 3) == 0;
	for (const char *p = b; rc == 0 && xml_elem(p, e, "Contents", &c, &ce, &nx) == 0; p = nx) {
		const char *kc, *kce, *kn;
		if (xml_elem(c, ce, "Key", &kc, &kce, &kn) != 0)
			continue;
		char *key = xml_text(kc, kce, url);
		char *etag = NULL;
		uint64_t size = 0;
		int64_t mt = 0;
		if (xml_elem(c, ce, "ETag", &kc, &kce, &kn) == 0)
			etag = xml_text(kc, kce, 0);
		if (xml_elem(c, ce, "Size", &kc, &kce, &kn) == 0)
			size = strtoull(kc, NULL, 10);
		if (xml_elem(c, ce, "LastModified", &kc, &kce, &kn) == 0)
			mt = parse_iso_ns(kc);
		if (!key)
			rc = -ENOMEM;
		else
			rc = cb(ctx, key, etag, size, mt, 0);
		free(key);
		free(etag);
	}
	for (const char *p = b; rc == 0 && xml_elem(p, e, "CommonPrefixes", &c, &ce, &nx) == 0; p = nx) {
		const char *kc, *kce, *kn;
		if (xml_elem(c, ce, "Prefix", &kc, &kce, &kn) != 0)
			continue;
		char *key = xml_text(kc, kce, url);
		rc = key ? cb(ctx, key, NULL, 0, 0, 1) : -ENOMEM;
		free(key);
	}
	if (rc)
		return rc;
	*truncated = xml_elem(b, e, "IsTruncated", &c, &ce, &nx) == 0 && ce - c == 4 && strncmp(c, "true", 4) == 0;
	if (*truncated && xml_elem(b, e, "NextContinuationToken", &c, &ce, &nx) == 0) {
		*token = xml_text(c, ce, 0);
		if (!*token)
			return -ENOMEM;
	}
	return 0;
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

/* ListObjectsV2 of every key starting with `pfx` (full object names). */
static int list_objects(struct s3_store *s, const char *pfx, int delim, unsigned max_keys, int one_page,
			page_cb cb, void *ctx)
{
	char *token = NULL;
	int rc = 0;
	char mk[16];
	snprintf(mk, sizeof(mk), "%u", max_keys);
	for (;;) {
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
		struct rq r = { "GET",	NULL, q, NULL, NULL, NULL, 0, (size_t)64 << 20,
				"LIST", NULL, 0, NULL, NULL };
		struct ckpt_http_resp resp;
		rc = request(s, &r, &resp);
		free(q);
		if (rc == -ENOENT) {
			ckpt_log(CKPT_LOG_ERR, "%s: LIST: no such bucket", s->base.root);
			rc = -EIO;
		}
		if (rc)
			break;
		struct page_tramp t = { s, cb, ctx };
		int more = 0;
		free(token);
		token = NULL;
		rc = ckpt_s3_list_parse(resp.body ? resp.body : "", resp.len, page_tramp_cb, &t, &more, &token);
		if (rc == 0 && more && !token) {
			ckpt_log(CKPT_LOG_ERR, "%s: LIST %s: truncated answer without a continuation token",
				 s->base.root, pfx);
			rc = -EIO;
		}
		ckpt_http_resp_free(&resp);
		if (rc || !token || one_page)
			break;
	}
	free(token);
	return rc;
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
		int rc = obj_pin(s, key, size, etag, mt, NULL);
		if (rc)
			return rc;
	} else {
		if (n < 2 || rest[n - 1] != '/')
			return 0;
		n--;
		if (memchr(rest, '/', n))
			return 0;
	}
	if (c->res.n == c->res.cap) {
		size_t nc = c->res.cap ? 2 * c->res.cap : 64;
		struct lentry *nv = realloc(c->res.v, nc * sizeof(*nv));
		if (!nv)
			return -ENOMEM;
		c->res.v = nv;
		c->res.cap = nc;
	}
	struct lentry *e = &c->res.v[c->res.n];
	e->name = strndup(rest, n);
	if (!e->name)
		return -ENOMEM;
	e->is_dir = is_prefix;
	e->size = is_prefix ? 0 : size;
	e->mtime_ns = is_prefix ? 0 : mt;
	c->res.n++;
	return 0;
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
	if (*dir && !ckpt_store_key_ok(dir))
		return -ENOENT;
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
	int rc = list_objects(s, pfx, 1, 1000, 0, ld_cb, &c);
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
	ckpt_store_list_cb cb;
	void *ctx;
};

static int fl_cb(struct s3_store *s, void *ctx, const char *key, const char *etag, uint64_t size, int64_t mt,
		 int is_prefix)
{
	struct fl_ctx *c = ctx;
	size_t n = strlen(key);
	if (is_prefix || n <= c->strip || key[n - 1] == '/')
		return 0;
	int rc = obj_pin(s, key, size, etag, mt, NULL);
	if (rc)
		return rc;
	return c->cb(c->ctx, key + c->strip, size);
}

static int s3_list(ckpt_store *st, const char *prefix, ckpt_store_list_cb cb, void *ctx)
{
	struct s3_store *s = (struct s3_store *)st;
	size_t pl = strlen(s->prefix);
	char *full = malloc(pl + 1 + strlen(prefix ? prefix : "") + 1);
	if (!full)
		return -ENOMEM;
	sprintf(full, "%s%s%s", s->prefix, pl ? "/" : "", prefix ? prefix : "");
	struct fl_ctx c = { pl ? pl + 1 : 0, cb, ctx };
	int rc = list_objects(s, full, 0, 1000, 0, fl_cb, &c);
	free(full);
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
	if (!ckpt_store_key_ok(key))
		return -ENOENT;
	char *name = objname(s, key);
	if (!name)
		return -ENOMEM;
	struct obj o;
	int rc = meta(s, name, &o);
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
			rc = list_objects(s, pfx, 1, 1, 1, any_cb, &any);
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
	if (!ckpt_store_key_ok(key))
		return -ENOENT;
	char *name = objname(s, key);
	if (!name)
		return -ENOMEM;
	struct obj o;
	int rc = meta(s, name, &o);
	free(name);
	if (rc == 0)
		*size = o.size;
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

/* One validated GET of [first, last] of object `name` (pinned as *o) into
 * dst.  0 or -errno (logged). */
static int fetch_range(struct s3_store *s, const char *name, const char *key, const struct obj *o,
		       uint64_t first, uint64_t last, void *dst)
{
	int whole = first == 0 && last + 1 == o->size;
	uint64_t want = last - first + 1;
	char range[64];
	snprintf(range, sizeof(range), "bytes=%llu-%llu", (unsigned long long)first,
		 (unsigned long long)last);
	struct rq r = { "GET", name, "",  whole ? NULL : range, o->etag, dst, (size_t)want, 0, "GET", NULL,
			0,     NULL, NULL };
	struct ckpt_http_resp resp;
	__atomic_add_fetch(&s->gets, 1, __ATOMIC_RELAXED);
	int rc = request(s, &r, &resp);
	if (rc == -ESTALE) {
		ckpt_log(CKPT_LOG_ERR, "%s/%s: object changed since it was first seen (ETag no longer %s)",
			 s->base.root, key, o->etag);
		obj_mark_stale(s, name);
	}
	if (rc == -ENOENT) {
		ckpt_log(CKPT_LOG_ERR, "%s/%s: object vanished since it was first seen", s->base.root, key);
		obj_mark_stale(s, name);
		rc = -EIO;
	}
	if (rc)
		return rc;
	ckpt_http_resp_free(&resp);
	const char *bad = NULL;
	uint64_t f = 0, l = 0, t = 0;
	if (o->etag[0] && resp.etag[0] && strcmp(o->etag, resp.etag) != 0) {
		ckpt_log(CKPT_LOG_ERR, "%s/%s: object changed since it was first seen (ETag %s, now %s)",
			 s->base.root, key, o->etag, resp.etag);
		obj_mark_stale(s, name);
		return -ESTALE;
	}
	if (resp.len != want)
		bad = "body length differs from the range asked for";
	else if (!whole && resp.status != 206 && !(resp.status == 200 && first == 0 && want == o->size))
		bad = "range ignored";
	else if (resp.status == 206 &&
		 (parse_cr(resp.content_range, &f, &l, &t) || f != first || l != last || t != o->size))
		bad = "Content-Range differs from the range asked for";
	if (bad) {
		ckpt_log(CKPT_LOG_ERR, "%s/%s: GET %s: HTTP %ld, %s (Content-Range '%s', %zu bytes)",
			 s->base.root, key, range, resp.status, bad, resp.content_range, resp.len);
		return -EIO;
	}
	return 0;
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
static int coalesced_get(struct s3_store *s, const char *name, const char *key, const struct obj *o,
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

static ssize_t s3_read(ckpt_store *st, const char *key, uint64_t off, size_t len, void *dst)
{
	struct s3_store *s = (struct s3_store *)st;
	if (!ckpt_store_key_ok(key))
		return -ENOENT;
	char *name = objname(s, key);
	if (!name)
		return -ENOMEM;
	struct obj o;
	int rc = meta(s, name, &o);
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
	if (id && ckpt_dcache_get(s->dcache, id, o.etag, first, last - first + 1, buf) == 0) {
		rc = 0;
	} else {
		rc = coalesced_get(s, name, key, &o, first, last, buf);
		if (rc == 0 && id)
			ckpt_dcache_put(s->dcache, id, o.etag, first, last - first + 1, buf);
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
	if (s->gets)
		ckpt_log(CKPT_LOG_DEBUG, "%s: %llu range GETs, %llu more ranges served by merged GETs",
			 s->base.root, s->gets, s->merged);
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

static const struct ckpt_store_ops s3_ops = {
	.size = s3_size,
	.read = s3_read,
	.list = s3_list,
	.listdir = s3_listdir,
	.stat = s3_stat,
	.destroy = s3_destroy,
};

/* ---------------------------------------------------------------- configuration */

/* Value of `key` in section `section` of an INI file (malloc'd), or NULL. */
static char *ini_get(const char *path, const char *section, const char *key, int *section_seen)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return NULL;
	char line[4096];
	int in = 0;
	char *val = NULL;
	while (!val && fgets(line, sizeof(line), f)) {
		char *p = line;
		while (isspace((unsigned char)*p))
			p++;
		char *e = p + strlen(p);
		while (e > p && isspace((unsigned char)e[-1]))
			*--e = 0;
		if (*p == '#' || *p == ';' || !*p)
			continue;
		if (*p == '[') {
			char *cl = strchr(p, ']');
			if (!cl)
				continue;
			*cl = 0;
			p++;
			while (isspace((unsigned char)*p))
				p++;
			char *q = p + strlen(p);
			while (q > p && isspace((unsigned char)q[-1]))
				*--q = 0;
			in = strcmp(p, section) == 0;
			if (in && section_seen)
				*section_seen = 1;
			continue;
		}
		if (!in)
			continue;
		char *eq = strchr(p, '=');
		if (!eq)
			continue;
		char *k = p, *ke = eq;
		while (ke > k && isspace((unsigned char)ke[-1]))
			ke--;
		*ke = 0;
		char *v = eq + 1;
		while (isspace((unsigned char)*v))
			v++;
		if (strcmp(k, key) == 0)
			val = strdup(v);
	}
	memset(line, 0, sizeof(line));
	fclose(f);
	return val;
}

static char *home_path(const char *env, const char *rel)
{
	const char *e = getenv(env);
	if (e && *e)
		return strdup(e);
	const char *home = getenv("HOME");
	if (!home || !*home)
		return NULL;
	char *p = NULL;
	if (asprintf(&p, "%s/%s", home, rel) < 0)
		return NULL;
	return p;
}

static const char *env_nonempty(const char *name)
{
	const char *v = getenv(name);
	return v && *v ? v : NULL;
}

/* Credentials: environment, then the shared credentials file and the config
 * file (profile).  Sets s->auth. */
static int find_creds(struct s3_store *s, const char *profile_opt, int *profile_region_set)
{
	const char *ak = env_nonempty("AWS_ACCESS_KEY_ID"), *sk = env_nonempty("AWS_SECRET_ACCESS_KEY");
	const char *tok = env_nonempty("AWS_SESSION_TOKEN");
	if (!tok)
		tok = env_nonempty("AWS_SECURITY_TOKEN");
	const char *prof = profile_opt;
	int explicit_profile = prof != NULL;
	if (!prof && (prof = env_nonempty("AWS_PROFILE")))
		explicit_profile = 1;
	if (!prof && (prof = env_nonempty("AWS_DEFAULT_PROFILE")))
		explicit_profile = 1;
	if (!prof)
		prof = "default";
	char *cred = home_path("AWS_SHARED_CREDENTIALS_FILE", ".aws/credentials");
	char *conf = home_path("AWS_CONFIG_FILE", ".aws/config");
	char confsec[300];
	if (strcmp(prof, "default") == 0)
		snprintf(confsec, sizeof(confsec), "default");
	else
		snprintf(confsec, sizeof(confsec), "profile %s", prof);
	int seen = 0;
	int rc = 0;
	/* region from the profile (used when no option / env gave one) */
	if (!s->region && conf) {
		s->region = ini_get(conf, confsec, "region", &seen);
		if (s->region)
			*profile_region_set = 1;
	}
	if (ak && sk && !profile_opt) {
		s->akid = strdup(ak);
		s->secret = strdup(sk);
		s->session_token = xstrdup(tok);
		s->auth = AUTH_SIGV4;
		ckpt_log(CKPT_LOG_INFO, "%s: credentials from the environment (key id %.4s...)", s->base.root,
			 ak);
		goto out;
	}
	char *a = NULL, *b = NULL, *t = NULL;
	if (cred) {
		a = ini_get(cred, prof, "aws_access_key_id", &seen);
		b = ini_get(cred, prof, "aws_secret_access_key", &seen);
		t = ini_get(cred, prof, "aws_session_token", &seen);
	}
	if ((!a || !b) && conf) {
		free(a);
		free_secret(b);
		free_secret(t);
		a = ini_get(conf, confsec, "aws_access_key_id", &seen);
		b = ini_get(conf, confsec, "aws_secret_access_key", &seen);
		t = ini_get(conf, confsec, "aws_session_token", &seen);
	}
	if (a && b) {
		s->akid = a;
		s->secret = b;
		s->session_token = t;
		s->auth = AUTH_SIGV4;
		ckpt_log(CKPT_LOG_INFO, "%s: credentials from profile '%s' (key id %.4s...)", s->base.root,
			 prof, a);
		goto out;
	}
	free(a);
	free_secret(b);
	free_secret(t);
	if (explicit_profile && !seen) {
		ckpt_log(CKPT_LOG_ERR, "%s: profile '%s' not found in the shared credentials or config file",
			 s->base.root, prof);
		rc = -EINVAL;
		goto out;
	}
	s->auth = AUTH_NONE;
	ckpt_log(CKPT_LOG_INFO, "%s: no credentials found: anonymous requests", s->base.root);
out:
	free(cred);
	free(conf);
	return rc;
}

/* Linux on Google Compute Engine, the way Google's client libraries tell. */
static int on_gce(void)
{
	FILE *f = fopen("/sys/class/dmi/id/product_name", "r");
	char buf[128] = "";
	if (f) {
		if (!fgets(buf, sizeof(buf), f))
			buf[0] = 0;
		fclose(f);
	}
	return strstr(buf, "Google") != NULL;
}

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

	/* region */
	const char *reg = o->region;
	if (!reg && !s->gcs)
		reg = env_nonempty("AWS_REGION");
	if (!reg && !s->gcs)
		reg = env_nonempty("AWS_DEFAULT_REGION");
	if (reg && !(s->region = strdup(reg))) {
		rc = -ENOMEM;
		goto fail;
	}

	/* credentials */
	int profile_region = 0;
	if (o->anonymous) {
		s->auth = AUTH_NONE;
	} else if (s->gcs && (o->token_file || env_nonempty("GOOGLE_OAUTH_ACCESS_TOKEN"))) {
		s->auth = AUTH_BEARER;
		if (o->token_file) {
			s->token_file = strdup(o->token_file);
			if (!s->token_file) {
				rc = -ENOMEM;
				goto fail;
			}
			rc = bearer_refresh(s);
			if (rc)
				goto fail;
		} else {
			s->bearer = strdup(env_nonempty("GOOGLE_OAUTH_ACCESS_TOKEN"));
		}
		ckpt_log(CKPT_LOG_INFO, "%s: OAuth2 bearer token from %s", s->base.root,
			 o->token_file ? "the token file" : "GOOGLE_OAUTH_ACCESS_TOKEN");
	} else {
		rc = find_creds(s, o->profile, &profile_region);
		if (rc)
			goto fail;
		/* gs:// with nothing else on a Google Cloud machine: the metadata server */
		const char *mh = env_nonempty("GCE_METADATA_HOST");
		if (!mh)
			mh = env_nonempty("GCE_METADATA_ROOT");
		if (s->gcs && s->auth == AUTH_NONE && (mh || on_gce())) {
			if (asprintf(&s->meta_url,
				     "http://%s/computeMetadata/v1/instance/service-accounts/default/token",
				     mh ? mh : "metadata.google.internal") < 0) {
				s->meta_url = NULL;
				rc = -ENOMEM;
				goto fail;
			}
			s->auth = AUTH_BEARER;
			ckpt_log(CKPT_LOG_INFO, "%s: OAuth2 bearer tokens from the metadata server",
				 s->base.root);
		}
	}
	if (!s->region && !(s->region = strdup(s->gcs ? "auto" : "us-east-1"))) {
		rc = -ENOMEM;
		goto fail;
	}

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

/* ---------------------------------------------------------------- writing (upload.h) */

#include "upload.h"

/* The s3 store and full object name behind store key `key`. */
static int writable(ckpt_store *st, const char *key, struct s3_store **out, char **name)
{
	ckpt_store *b;
	char *k;
	int rc = ckpt_store_unwrap(st, key, &b, &k);
	if (rc)
		return rc;
	if (b->ops != &s3_ops) {
		free(k);
		return -EROFS;
	}
	if (*k && !ckpt_store_key_ok(k)) {
		free(k);
		return -EINVAL;
	}
	struct s3_store *s = (struct s3_store *)b;
	*name = objname(s, k);
	free(k);
	if (!*name)
		return -ENOMEM;
	*out = s;
	return 0;
}

unsigned ckpt_store_s3_connections(ckpt_store *st)
{
	ckpt_store *b;
	char *k;
	if (ckpt_store_unwrap(st, "", &b, &k) != 0)
		return 0;
	free(k);
	return b->ops == &s3_ops ? ((struct s3_store *)b)->conns : 0;
}

/* The object was (re)written: what readers pin from now on is the new one. */
static void obj_replace(struct s3_store *s, const char *name, uint64_t size, const char *etag)
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

int ckpt_store_put(ckpt_store *st, const char *key, const void *buf, size_t len, int flags)
{
	struct s3_store *s;
	char *name;
	int rc = writable(st, key, &s, &name);
	if (rc)
		return rc;
	if (len > ((size_t)5 << 30)) {
		free(name);
		return -EFBIG;
	}
	char hash[65];
	ckpt_sha256_hex(buf, len, hash);
	struct rq r = { "PUT",
			name,
			"",
			NULL,
			NULL,
			NULL,
			0,
			0,
			"PUT",
			buf,
			len,
			hash,
			(flags & CKPT_PUT_CREATE_ONLY) ? "If-None-Match: *" : NULL };
	struct ckpt_http_resp resp;
	rc = request(s, &r, &resp);
	if (rc == 0) {
		ckpt_http_resp_free(&resp);
		obj_replace(s, name, len, resp.etag);
	} else if (rc == -ESTALE) {
		rc = -EEXIST; /* 412: create-only and it exists */
	} else if (rc == -ENOENT) {
		ckpt_log(CKPT_LOG_ERR, "%s: PUT %s: no such bucket", s->base.root, name);
		rc = -EIO;
	}
	free(name);
	return rc;
}

int ckpt_store_delete(ckpt_store *st, const char *key)
{
	struct s3_store *s;
	char *name;
	int rc = writable(st, key, &s, &name);
	if (rc)
		return rc;
	struct rq r = { "DELETE", name, "", NULL, NULL, NULL, 0, 0, "DELETE", NULL, 0, NULL, NULL };
	struct ckpt_http_resp resp;
	rc = request(s, &r, &resp);
	if (rc == 0)
		ckpt_http_resp_free(&resp);
	if (rc == -ENOENT)
		rc = 0;
	free(name);
	return rc;
}

struct ckpt_upload {
	struct s3_store *s;
	ckpt_store *ref; /* keeps the store alive */
	char *name;
	char *upload_id;
	pthread_mutex_t mu;
	unsigned nparts; /* highest part number + 1 allocated */
	char (*etags)[128]; /* index = part number */
	size_t *sizes;
};

/* Text of the first <tag> element of a body (malloc'd) or NULL. */
static char *xml_first(const struct ckpt_http_resp *resp, const char *tag)
{
	const char *c, *ce, *nx;
	if (!resp->body || xml_elem(resp->body, resp->body + resp->len, tag, &c, &ce, &nx) != 0)
		return NULL;
	return xml_text(c, ce, 0);
}

static void upload_free(ckpt_upload *u)
{
	pthread_mutex_destroy(&u->mu);
	free(u->name);
	free(u->upload_id);
	free(u->etags);
	free(u->sizes);
	ckpt_store_destroy(u->ref);
	free(u);
}

int ckpt_upload_begin(ckpt_store *st, const char *key, ckpt_upload **out)
{
	*out = NULL;
	struct s3_store *s;
	char *name;
	int rc = writable(st, key, &s, &name);
	if (rc)
		return rc;
	ckpt_upload *u = calloc(1, sizeof(*u));
	if (!u) {
		free(name);
		return -ENOMEM;
	}
	pthread_mutex_init(&u->mu, NULL);
	u->s = s;
	u->name = name;
	u->ref = ckpt_store_ref(&s->base);
	const char *qn[] = { "uploads" };
	char *q = ckpt_sigv4_query(qn, NULL, 1);
	if (!q) {
		upload_free(u);
		return -ENOMEM;
	}
	struct rq r = { "POST",
			name,
			q,
			NULL,
			NULL,
			NULL,
			0,
			1 << 20,
			"CreateMultipartUpload",
			NULL,
			0,
			NULL,
			"Content-Type: application/octet-stream" };
	struct ckpt_http_resp resp;
	rc = request(s, &r, &resp);
	free(q);
	if (rc == 0) {
		u->upload_id = xml_first(&resp, "UploadId");
		ckpt_http_resp_free(&resp);
		if (!u->upload_id || !*u->upload_id) {
			ckpt_log(CKPT_LOG_ERR, "%s: CreateMultipartUpload %s: no UploadId in the answer",
				 s->base.root, name);
			rc = -EIO;
		}
	}
	if (rc) {
		upload_free(u);
		return rc == -ENOENT ? -EIO : rc;
	}
	*out = u;
	return 0;
}

int ckpt_upload_part(ckpt_upload *u, unsigned part, const void *buf, size_t len)
{
	if (part < 1 || part > CKPT_UPLOAD_MAX_PARTS || len > ((size_t)5 << 30))
		return -EINVAL;
	pthread_mutex_lock(&u->mu);
	if (part >= u->nparts) {
		unsigned nn = part + 1 > 2 * u->nparts ? part + 1 : 2 * u->nparts;
		void *e = realloc(u->etags, nn * sizeof(*u->etags));
		if (e)
			u->etags = e;
		void *z = realloc(u->sizes, nn * sizeof(*u->sizes));
		if (z)
			u->sizes = z;
		if (!e || !z) {
			pthread_mutex_unlock(&u->mu);
			return -ENOMEM;
		}
		for (unsigned i = u->nparts; i < nn; i++) {
			u->etags[i][0] = 0;
			u->sizes[i] = 0;
		}
		u->nparts = nn;
	}
	pthread_mutex_unlock(&u->mu);
	char pn[16];
	snprintf(pn, sizeof(pn), "%u", part);
	const char *qn[] = { "partNumber", "uploadId" }, *qv[] = { pn, u->upload_id };
	char *q = ckpt_sigv4_query(qn, qv, 2);
	if (!q)
		return -ENOMEM;
	char hash[65];
	ckpt_sha256_hex(buf, len, hash);
	struct rq r = { "PUT", u->name, q, NULL, NULL, NULL, 0, 0, "UploadPart", buf, len, hash, NULL };
	struct ckpt_http_resp resp;
	int rc = request(u->s, &r, &resp);
	free(q);
	if (rc)
		return rc == -ENOENT ? -EIO : rc;
	ckpt_http_resp_free(&resp);
	if (!resp.etag[0]) {
		ckpt_log(CKPT_LOG_ERR, "%s: UploadPart %s #%u: no ETag in the answer", u->s->base.root,
			 u->name, part);
		return -EIO;
	}
	pthread_mutex_lock(&u->mu);
	memcpy(u->etags[part], resp.etag, sizeof(resp.etag));
	u->sizes[part] = len;
	pthread_mutex_unlock(&u->mu);
	return 0;
}

void ckpt_upload_abort(ckpt_upload *u)
{
	if (!u)
		return;
	const char *qn[] = { "uploadId" }, *qv[] = { u->upload_id };
	char *q = ckpt_sigv4_query(qn, qv, 1);
	if (q) {
		struct rq r = { "DELETE", u->name, q,	 NULL, NULL, NULL, 0, 0, "AbortMultipartUpload",
				NULL,	  0,	   NULL, NULL };
		struct ckpt_http_resp resp;
		int rc = request(u->s, &r, &resp);
		if (rc == 0)
			ckpt_http_resp_free(&resp);
		else if (rc != -ENOENT)
			ckpt_log(CKPT_LOG_WARN,
				 "%s: %s: multipart upload not aborted; its parts stay until a cleanup",
				 u->s->base.root, u->name);
		free(q);
	}
	upload_free(u);
}

int ckpt_upload_complete(ckpt_upload *u)
{
	struct s3_store *s = u->s;
	unsigned last = 0;
	uint64_t total = 0;
	int rc = 0;
	for (unsigned i = 1; i < u->nparts; i++)
		if (u->etags[i][0])
			last = i;
	for (unsigned i = 1; i <= last && !rc; i++) {
		if (!u->etags[i][0]) {
			ckpt_log(CKPT_LOG_ERR, "%s: %s: part %u of %u missing", s->base.root, u->name, i,
				 last);
			rc = -EINVAL;
		} else if (i < last && u->sizes[i] < CKPT_UPLOAD_MIN_PART) {
			ckpt_log(CKPT_LOG_ERR, "%s: %s: part %u has %zu bytes, under the 5 MiB minimum",
				 s->base.root, u->name, i, u->sizes[i]);
			rc = -EINVAL;
		}
		total += u->sizes[i];
	}
	if (!rc && last == 0)
		rc = -EINVAL;
	size_t cap = 128 + (size_t)last * 200;
	char *body = rc ? NULL : malloc(cap);
	if (!rc && !body)
		rc = -ENOMEM;
	if (rc) {
		ckpt_upload_abort(u);
		return rc;
	}
	size_t n = (size_t)sprintf(body, "<CompleteMultipartUpload>");
	for (unsigned i = 1; i <= last; i++)
		n += (size_t)sprintf(body + n, "<Part><PartNumber>%u</PartNumber><ETag>%s</ETag></Part>", i,
				     u->etags[i]);
	n += (size_t)sprintf(body + n, "</CompleteMultipartUpload>");
	char hash[65];
	ckpt_sha256_hex(body, n, hash);
	const char *qn[] = { "uploadId" }, *qv[] = { u->upload_id };
	char *q = ckpt_sigv4_query(qn, qv, 1);
	if (!q) {
		free(body);
		ckpt_upload_abort(u);
		return -ENOMEM;
	}
	struct rq r = { "POST",
			u->name,
			q,
			NULL,
			NULL,
			NULL,
			0,
			1 << 20,
			"CompleteMultipartUpload",
			body,
			n,
			hash,
			"Content-Type: application/xml" };
	struct ckpt_http_resp resp;
	rc = request(s, &r, &resp);
	free(q);
	free(body);
	if (rc == 0) {
		/* A 200 may still carry an error: the server answers early. */
		char *code = xml_first(&resp, "Code");
		int err = resp.body && strstr(resp.body, "<Error") != NULL;
		if (err) {
			ckpt_log(CKPT_LOG_ERR, "%s: CompleteMultipartUpload %s: error %s in a 200 answer",
				 s->base.root, u->name, code ? code : "?");
			rc = -EIO;
		} else {
			char *etag = xml_first(&resp, "ETag");
			obj_replace(s, u->name, total, etag ? etag : resp.etag);
			free(etag);
		}
		free(code);
		ckpt_http_resp_free(&resp);
	} else if (rc == -ENOENT) {
		/* NoSuchUpload after a retry: the first attempt may have completed it. */
		struct obj o;
		rc = head(s, u->name, &o) == 0 && o.size == total ? 0 : -EIO;
		if (rc)
			ckpt_log(CKPT_LOG_ERR, "%s: CompleteMultipartUpload %s: upload unknown to the server",
				 s->base.root, u->name);
	}
	if (rc) {
		ckpt_upload_abort(u);
		return rc;
	}
	upload_free(u);
	return 0;
}

int ckpt_store_abort_stale_uploads(ckpt_store *st, const char *prefix)
{
	struct s3_store *s;
	char *name;
	int rc = writable(st, prefix ? prefix : "", &s, &name);
	if (rc)
		return rc;
	const char *qn[] = { "uploads", "prefix" }, *qv[] = { "", name };
	char *q = ckpt_sigv4_query(qn, qv, 2);
	free(name);
	if (!q)
		return -ENOMEM;
	struct rq r = { "GET", NULL, q,	   NULL, NULL, NULL, 0, (size_t)16 << 20, "ListMultipartUploads",
			NULL,  0,    NULL, NULL };
	struct ckpt_http_resp resp;
	rc = request(s, &r, &resp);
	free(q);
	if (rc)
		return rc == -EIO ? -ENOTSUP : rc;
	int n = 0;
	const char *b = resp.body ? resp.body : "", *e = b + resp.len, *c, *ce, *nx;
	for (const char *p = b; xml_elem(p, e, "Upload", &c, &ce, &nx) == 0; p = nx) {
		const char *kc, *kce, *kn;
		if (xml_elem(c, ce, "Key", &kc, &kce, &kn) != 0)
			continue;
		char *key = xml_text(kc, kce, 0);
		if (xml_elem(c, ce, "UploadId", &kc, &kce, &kn) != 0) {
			free(key);
			continue;
		}
		char *id = xml_text(kc, kce, 0);
		ckpt_upload *u = calloc(1, sizeof(*u));
		if (!key || !id || !u) {
			free(key);
			free(id);
			free(u);
			rc = -ENOMEM;
			break;
		}
		pthread_mutex_init(&u->mu, NULL);
		u->s = s;
		u->ref = ckpt_store_ref(&s->base);
		u->name = key;
		u->upload_id = id;
		ckpt_upload_abort(u);
		n++;
	}
	ckpt_http_resp_free(&resp);
	return rc ? rc : n;
}
