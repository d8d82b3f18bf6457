/*
 * http.c - bounded pool of kept-alive libcurl easy handles (see http.h).
 *
 * Locking: h->mu guards the free list; a handle taken from it is used by
 * one thread only until it is given back.  curl_global_init runs once.
 */
#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "common.h"
#include "http.h"

struct ckpt_http {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	CURL **free_v; /* idle handles */
	unsigned nfree, made, cap;
	struct ckpt_http_cfg cfg;
};

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static int global_rc;

static void global_init(void)
{
	global_rc = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK ? 0 : -EIO;
}

int ckpt_http_new(const struct ckpt_http_cfg *cfg, ckpt_http **out)
{
	*out = NULL;
	pthread_once(&global_once, global_init);
	if (global_rc)
		return global_rc;
	ckpt_http *h = calloc(1, sizeof(*h));
	if (!h)
		return -ENOMEM;
	h->cfg = *cfg;
	if (!h->cfg.connections)
		h->cfg.connections = 8;
	if (!h->cfg.timeout_ms)
		h->cfg.timeout_ms = 30000;
	h->cap = h->cfg.connections;
	h->free_v = calloc(h->cap, sizeof(*h->free_v));
	if (!h->free_v) {
		free(h);
		return -ENOMEM;
	}
	pthread_mutex_init(&h->mu, NULL);
	pthread_cond_init(&h->cv, NULL);
	*out = h;
	return 0;
}

void ckpt_http_free(ckpt_http *h)
{
	if (!h)
		return;
	for (unsigned i = 0; i < h->nfree; i++)
		curl_easy_cleanup(h->free_v[i]);
	free(h->free_v);
	pthread_mutex_destroy(&h->mu);
	pthread_cond_destroy(&h->cv);
	free(h);
}

static CURL *take(ckpt_http *h)
{
	pthread_mutex_lock(&h->mu);
	while (h->nfree == 0 && h->made >= h->cap)
		pthread_cond_wait(&h->cv, &h->mu);
	CURL *c = NULL;
	if (h->nfree) {
		c = h->free_v[--h->nfree];
	} else {
		h->made++;
		pthread_mutex_unlock(&h->mu);
		c = curl_easy_init();
		if (!c) {
			pthread_mutex_lock(&h->mu);
			h->made--;
			pthread_cond_signal(&h->cv);
			pthread_mutex_unlock(&h->mu);
		}
		return c;
	}
	pthread_mutex_unlock(&h->mu);
	return c;
}

static void give(ckpt_http *h, CURL *c, int drop)
{
	if (drop) {
		curl_easy_cleanup(c);
		c = NULL;
	}
	pthread_mutex_lock(&h->mu);
	if (c)
		h->free_v[h->nfree++] = c;
	else
		h->made--;
	pthread_cond_signal(&h->cv);
	pthread_mutex_unlock(&h->mu);
}

struct xfer {
	const struct ckpt_http_req *req;
	struct ckpt_http_resp *resp;
	size_t cap;
	int overflow;
	int error_status; /* the answer is an error: its body goes to resp->body, not dst */
	/* request body */
	size_t sent;
};

static size_t on_body(char *p, size_t sz, size_t nm, void *ud)
{
	struct xfer *x = ud;
	size_t n = sz * nm;
	struct ckpt_http_resp *r = x->resp;
	if (x->req->dst && !x->error_status) {
		if (r->len + n > x->req->dst_cap) {
			x->overflow = 1;
			return 0;
		}
		memcpy((char *)x->req->dst + r->len, p, n);
		r->len += n;
		return n;
	}
	size_t max = x->error_status ? 65536 : x->req->max_body ? x->req->max_body : ((size_t)64 << 20);
	if (r->len + n > max) {
		x->overflow = 1;
		return 0;
	}
	if (r->len + n + 1 > x->cap) {
		size_t nc = x->cap ? x->cap * 2 : 16384;
		while (nc < r->len + n + 1)
			nc *= 2;
		char *nb = realloc(r->body, nc);
		if (!nb)
			return 0;
		r->body = nb;
		x->cap = nc;
	}
	memcpy(r->body + r->len, p, n);
	r->len += n;
	r->body[r->len] = 0;
	return n;
}

static void copy_hval(char *dst, size_t cap, const char *v, size_t n)
{
	while (n && (*v == ' ' || *v == '\t')) {
		v++;
		n--;
	}
	while (n && (v[n - 1] == '\r' || v[n - 1] == '\n' || v[n - 1] == ' '))
		n--;
	if (n >= cap)
		n = cap - 1;
	memcpy(dst, v, n);
	dst[n] = 0;
}

static size_t on_header(char *p, size_t sz, size_t nm, void *ud)
{
	struct xfer *x = ud;
	size_t n = sz * nm;
	struct ckpt_http_resp *r = x->resp;
	/* A new status line (redirect, 100-continue) starts a fresh header set. */
	if (n >= 5 && strncmp(p, "HTTP/", 5) == 0) {
		r->etag[0] = r->content_range[0] = r->last_modified[0] = 0;
		r->content_length = -1;
		const char *sp = memchr(p, ' ', n);
		long st = sp ? strtol(sp + 1, NULL, 10) : 0;
		x->error_status = st >= 300;
		return n;
	}
	const char *colon = memchr(p, ':', n);
	if (!colon)
		return n;
	size_t kl = (size_t)(colon - p);
	const char *v = colon + 1;
	size_t vl = n - kl - 1;
	if (kl == 4 && strncasecmp(p, "ETag", 4) == 0) {
		copy_hval(r->etag, sizeof(r->etag), v, vl);
	} else if (kl == 13 && strncasecmp(p, "Content-Range", 13) == 0) {
		copy_hval(r->content_range, sizeof(r->content_range), v, vl);
	} else if (kl == 13 && strncasecmp(p, "Last-Modified", 13) == 0) {
		copy_hval(r->last_modified, sizeof(r->last_modified), v, vl);
	} else if (kl == 14 && strncasecmp(p, "Content-Length", 14) == 0) {
		char tmp[32];
		copy_hval(tmp, sizeof(tmp), v, vl);
		r->content_length = strtoll(tmp, NULL, 10);
	}
	return n;
}

static size_t on_read(char *p, size_t sz, size_t nm, void *ud)
{
	struct xfer *x = ud;
	size_t n = sz * nm, left = x->req->body_len - x->sent;
	if (n > left)
		n = left;
	memcpy(p, (const char *)x->req->body + x->sent, n);
	x->sent += n;
	return n;
}

int ckpt_http_perform(ckpt_http *h, const struct ckpt_http_req *req, struct ckpt_http_resp *resp)
{
	memset(resp, 0, sizeof(*resp));
	resp->content_length = -1;
	CURL *c = take(h);
	if (!c)
		return -ENOMEM;
	curl_easy_reset(c); /* keeps the connection cache */
	struct xfer x = { req, resp, 0, 0, 0, 0 };
	struct curl_slist *hl = NULL;
	int oom = 0;
	if (req->headers)
		for (const char *const *p = req->headers; *p; p++) {
			struct curl_slist *n = curl_slist_append(hl, *p);
			if (!n) {
				oom = 1;
				break;
			}
			hl = n;
		}
	/* libcurl adds Expect: 100-continue to large uploads; never wanted. */
	struct curl_slist *n = oom ? NULL : curl_slist_append(hl, "Expect:");
	if (!n) {
		curl_slist_free_all(hl);
		give(h, c, 0);
		return -ENOMEM;
	}
	hl = n;
	curl_easy_setopt(c, CURLOPT_URL, req->url);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, &x);
	curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(c, CURLOPT_HEADERDATA, &x);
	curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)h->cfg.timeout_ms);
	curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1024L);
	curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, (long)(h->cfg.timeout_ms + 999) / 1000);
	curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
	curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(c, CURLOPT_ACCEPT_ENCODING, NULL);
	if (strcmp(req->method, "HEAD") == 0) {
		curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
	} else if (strcmp(req->method, "PUT") == 0) {
		curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
		curl_easy_setopt(c, CURLOPT_READFUNCTION, on_read);
		curl_easy_setopt(c, CURLOPT_READDATA, &x);
		curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, (curl_off_t)req->body_len);
	} else if (strcmp(req->method, "POST") == 0) {
		curl_easy_setopt(c, CURLOPT_POST, 1L);
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, req->body ? req->body : "");
		curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_len);
	} else if (strcmp(req->method, "GET") != 0) {
		curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, req->method);
	}
	CURLcode cc = curl_easy_perform(c);
	curl_slist_free_all(hl);
	resp->curl_code = (int)cc;
	int rc = 0;
	if (cc == CURLE_OK) {
		curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &resp->status);
	} else {
		if (x.overflow) {
			resp->curl_code = CKPT_HTTP_OVERFLOW;
			curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &resp->status);
		} else {
			resp->status = 0;
		}
		rc = -EIO;
	}
	/* A failed transfer may leave the connection in any state: drop it. */
	give(h, c, cc != CURLE_OK);
	return rc;
}

void ckpt_http_resp_free(struct ckpt_http_resp *resp)
{
	free(resp->body);
	resp->body = NULL;
}

int ckpt_http_retryable(int rc, const struct ckpt_http_resp *resp)
{
	if (rc == -ENOMEM)
		return 0;
	if (rc) {
		switch (resp->curl_code) {
		case CURLE_UNSUPPORTED_PROTOCOL:
		case CURLE_URL_MALFORMAT:
		case CURLE_WRITE_ERROR:
			return 0;
		default:
			return 1;
		}
	}
	switch (resp->status) {
	case 408:
	case 429:
	case 500:
	case 502:
	case 503:
	case 504:
		return 1;
	default:
		return 0;
	}
}

void ckpt_http_backoff(unsigned attempt, unsigned base_ms)
{
	uint64_t cap = base_ms ? base_ms : 100;
	for (unsigned i = 1; i < attempt && cap < 5000; i++)
		cap *= 2;
	if (cap > 5000)
		cap = 5000;
	static __thread unsigned seed;
	if (!seed)
		seed = (unsigned)time(NULL) ^ (unsigned)(uintptr_t)&seed;
	uint64_t ms = (uint64_t)rand_r(&seed) % (cap + 1);
	struct timespec ts = { (time_t)(ms / 1000), (long)(ms % 1000) * 1000000L };
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

const char *ckpt_http_what(int rc, const struct ckpt_http_resp *resp, char *buf, size_t cap)
{
	if (rc == 0 || resp->curl_code == CKPT_HTTP_OVERFLOW) {
		if (resp->curl_code == CKPT_HTTP_OVERFLOW)
			snprintf(buf, cap, "HTTP %ld with a longer body than asked for", resp->status);
		else
			snprintf(buf, cap, "HTTP %ld", resp->status);
	} else {
		snprintf(buf, cap, "%s", curl_easy_strerror((CURLcode)resp->curl_code));
	}
	return buf;
}
