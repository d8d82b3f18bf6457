/*
 * http.h - a bounded pool of kept-alive libcurl handles for the object
 * stores, one attempt per call; retry policy helpers for the caller.
 *
 * A pool holds at most `connections` easy handles; ckpt_http_perform()
 * takes a free one (waiting while all are busy), so at most that many
 * requests are in flight and each handle keeps its connection alive for
 * the next request.  Thread-safe.  No request or header is ever logged
 * here (headers carry credentials); callers log the object and status.
 */
#ifndef CKPT_HTTP_H
#define CKPT_HTTP_H

#include <stddef.h>
#include <stdint.h>

typedef struct ckpt_http ckpt_http;

struct ckpt_http_cfg {
	unsigned connections; /* > 0 */
	unsigned timeout_ms; /* connect timeout, and abort when under 1 KiB/s for this long */
};

struct ckpt_http_req {
	const char *method; /* "GET", "HEAD", "PUT", "POST", "DELETE" */
	const char *url;
	const char *const *headers; /* "Name: value" lines, NULL-terminated; may be NULL */
	const void *body; /* request body (PUT/POST), body_len bytes */
	size_t body_len;
	/* Response body: into dst (at most dst_cap bytes; more is an error,
	 * CKPT_HTTP_OVERFLOW) when dst is set, else into a malloc'd buffer of
	 * at most max_body bytes. */
	void *dst;
	size_t dst_cap;
	size_t max_body;
};

struct ckpt_http_resp {
	long status; /* HTTP status; 0 when no response came */
	int curl_code; /* CURLcode of the transfer */
	char *body; /* malloc'd (NUL-terminated) when req.dst was NULL or the status is >= 300, else NULL */
	size_t len; /* body bytes received */
	char etag[128]; /* ETag header value as sent (with quotes), "" if none */
	char content_range[96]; /* Content-Range value, "" if none */
	int64_t content_length; /* Content-Length, -1 if none */
	char last_modified[64];
};

#define CKPT_HTTP_OVERFLOW 1000 /* curl_code when the body exceeded dst_cap/max_body */

int ckpt_http_new(const struct ckpt_http_cfg *cfg, ckpt_http **out);
void ckpt_http_free(ckpt_http *h);

/* One attempt.  0 when a response (any status) arrived; -EIO on a
 * transport failure (curl_code says which); -ENOMEM.  Free resp->body with
 * ckpt_http_resp_free. */
int ckpt_http_perform(ckpt_http *h, const struct ckpt_http_req *req, struct ckpt_http_resp *resp);
void ckpt_http_resp_free(struct ckpt_http_resp *resp);

/* 1 when an attempt that ended this way should be retried: a transport
 * failure (reset, timeout, truncated body, connection refused, a body
 * longer than asked for: a range the server ignored) or status 408, 429,
 * 500, 502, 503, 504. */
int ckpt_http_retryable(int rc, const struct ckpt_http_resp *resp);

/* Sleep before retry number `attempt` (1, 2, ...): full jitter over
 * base_ms * 2^(attempt-1), capped at 5 s. */
void ckpt_http_backoff(unsigned attempt, unsigned base_ms);

/* Short text for logs: "HTTP 503" or curl's error string. */
const char *ckpt_http_what(int rc, const struct ckpt_http_resp *resp, char *buf, size_t cap);

#endif
