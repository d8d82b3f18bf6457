/*
 * s3_xml.c - the XML an object store answers with: elements and their text
 * (entities, URL-encoded keys), ListObjectsV2 pages (ckpt_s3_list_parse,
 * also the entry of the fuzz_s3_list target), and the timestamps in them.
 * Pure: no I/O, no locks, no store; nothing here trusts the input (every
 * search is bounded by the end of the body).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "s3_int.h"

/* Next element <tag> (or <tag attr...>) in [p, end): its content in
 * [*c, *ce), *next after the closing tag.  0 found, -1 not. */
int ckpt_s3_xml_elem(const char *p, const char *end, const char *tag, const char **c, const char **ce,
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
char *ckpt_s3_xml_text(const char *c, const char *ce, int url)
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
int64_t ckpt_s3_tm_ns(struct tm *tm)
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
	return ckpt_s3_tm_ns(&tm) + (int64_t)((sec - (int)sec) * 1e9);
}

/* [c, ce) is a decimal number that fits in 64 bits. */
static int parse_size(const char *c, const char *ce, uint64_t *out)
{
	uint64_t v = 0;
	if (c == ce || ce - c > 20)
		return -1;
	for (; c < ce; c++) {
		if (*c < '0' || *c > '9')
			return -1;
		uint64_t d = (uint64_t)(*c - '0');
		if (v > (UINT64_MAX - d) / 10)
			return -1;
		v = v * 10 + d;
	}
	*out = v;
	return 0;
}

static const char *skip_ws(const char *p, const char *e)
{
	while (p < e && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n'))
		p++;
	return p;
}

/* The root element's name starts at the returned pointer (after an XML
 * declaration, comments and white space), or NULL when there is none. */
static const char *root_elem(const char *p, const char *e)
{
	for (;;) {
		p = skip_ws(p, e);
		if (e - p >= 2 && p[0] == '<' && (p[1] == '?' || p[1] == '!')) {
			const char *gt = memchr(p, '>', (size_t)(e - p));
			if (!gt)
				return NULL;
			p = gt + 1;
			continue;
		}
		return e - p >= 2 && p[0] == '<' ? p + 1 : NULL;
	}
}

static int name_is(const char *p, const char *e, const char *name)
{
	size_t n = strlen(name);
	return (size_t)(e - p) > n && strncmp(p, name, n) == 0 &&
	       (p[n] == '>' || p[n] == ' ' || p[n] == '/' || p[n] == '\t' || p[n] == '\r' || p[n] == '\n');
}

static int bad(const char **why, const char *what)
{
	if (why)
		*why = what;
	return -EBADMSG;
}

/* Key text [c, ce) under the listing's prefix?  *out: the decoded key. */
static int key_under(const char *c, const char *ce, int url, const char *want, char **out)
{
	*out = ckpt_s3_xml_text(c, ce, url);
	if (!*out)
		return -ENOMEM;
	if (want && strncmp(*out, want, strlen(want)) != 0) {
		free(*out);
		*out = NULL;
		return -EBADMSG;
	}
	return 0;
}

/* One pass over a page: check it (cb NULL), or hand every entry to cb. */
static int list_pass(const char *b, const char *e, int url, const char *want, ckpt_s3_list_cb cb, void *ctx,
		     const char **why)
{
	const char *c, *ce, *nx;
	int rc = 0;
	for (const char *p = b; rc == 0 && ckpt_s3_xml_elem(p, e, "Contents", &c, &ce, &nx) == 0; p = nx) {
		const char *kc, *kce, *kn;
		if (ckpt_s3_xml_elem(c, ce, "Key", &kc, &kce, &kn) != 0)
			return bad(why, "an object without a Key");
		char *key = NULL, *etag = NULL;
		uint64_t size = 0;
		int64_t mt = 0;
		rc = key_under(kc, kce, url, want, &key);
		if (rc == -EBADMSG)
			return bad(why, "a key outside the prefix asked for");
		if (rc)
			return rc;
		if (ckpt_s3_xml_elem(c, ce, "Size", &kc, &kce, &kn) != 0 || parse_size(kc, kce, &size) != 0) {
			free(key);
			return bad(why, "an object without a valid Size");
		}
		if (cb) {
			if (ckpt_s3_xml_elem(c, ce, "ETag", &kc, &kce, &kn) == 0)
				etag = ckpt_s3_xml_text(kc, kce, 0);
			if (ckpt_s3_xml_elem(c, ce, "LastModified", &kc, &kce, &kn) == 0)
				mt = parse_iso_ns(kc);
			rc = cb(ctx, key, etag, size, mt, 0);
		}
		free(key);
		free(etag);
	}
	for (const char *p = b; rc == 0 && ckpt_s3_xml_elem(p, e, "CommonPrefixes", &c, &ce, &nx) == 0;
	     p = nx) {
		const char *kc, *kce, *kn;
		if (ckpt_s3_xml_elem(c, ce, "Prefix", &kc, &kce, &kn) != 0)
			return bad(why, "a common prefix without a Prefix");
		char *key = NULL;
		rc = key_under(kc, kce, url, want, &key);
		if (rc == -EBADMSG)
			return bad(why, "a common prefix outside the prefix asked for");
		if (rc)
			return rc;
		if (cb)
			rc = cb(ctx, key, NULL, 0, 0, 1);
		free(key);
	}
	return rc;
}

int ckpt_s3_list_parse(const char *body, size_t len, const char *want_prefix, ckpt_s3_list_cb cb, void *ctx,
		       int *truncated, char **token, const char **why)
{
	const char *b = body, *e = b + len;
	const char *c, *ce, *nx;
	*truncated = 0;
	*token = NULL;
	if (why)
		*why = NULL;
	/* A whole ListBucketResult document: its root element, and its end tag
	 * last (a page cut off anywhere is refused). */
	const char *r = root_elem(b, e);
	if (r && name_is(r, e, "Error"))
		return bad(why, "an error document");
	if (!r || !name_is(r, e, "ListBucketResult"))
		return bad(why, "not a ListBucketResult document");
	static const char end_tag[] = "</ListBucketResult>";
	const char *t = e;
	while (t > r && (t[-1] == ' ' || t[-1] == '\t' || t[-1] == '\r' || t[-1] == '\n'))
		t--;
	if ((size_t)(t - r) < sizeof(end_tag) - 1 ||
	    memcmp(t - (sizeof(end_tag) - 1), end_tag, sizeof(end_tag) - 1))
		return bad(why, "cut off (no closing </ListBucketResult>)");
	const char *gt = memchr(r, '>', (size_t)(t - r));
	if (!gt)
		return bad(why, "not a ListBucketResult document");
	b = gt + 1; /* the document's content */
	e = t - (sizeof(end_tag) - 1);
	int url = ckpt_s3_xml_elem(b, e, "EncodingType", &c, &ce, &nx) == 0 && ce - c == 3 &&
		  strncmp(c, "url", 3) == 0;
	/* the listing's own Prefix, before the first entry: the one asked for */
	const char *first = e;
	if (ckpt_s3_xml_elem(b, e, "Contents", &c, &ce, &nx) == 0)
		first = c;
	if (ckpt_s3_xml_elem(b, first, "CommonPrefixes", &c, &ce, &nx) == 0)
		first = c;
	if (want_prefix && ckpt_s3_xml_elem(b, first, "Prefix", &c, &ce, &nx) == 0) {
		char *p = ckpt_s3_xml_text(c, ce, url);
		if (!p)
			return -ENOMEM;
		int same = strcmp(p, want_prefix) == 0;
		free(p);
		if (!same)
			return bad(why, "a Prefix other than the one asked for");
	}
	if (ckpt_s3_xml_elem(b, e, "IsTruncated", &c, &ce, &nx) != 0)
		return bad(why, "no IsTruncated");
	if (ce - c == 4 && strncmp(c, "true", 4) == 0)
		*truncated = 1;
	else if (!(ce - c == 5 && strncmp(c, "false", 5) == 0))
		return bad(why, "an IsTruncated that is neither true nor false");
	if (*truncated && ckpt_s3_xml_elem(b, e, "NextContinuationToken", &c, &ce, &nx) == 0 && ce > c) {
		*token = ckpt_s3_xml_text(c, ce, 0);
		if (!*token)
			return -ENOMEM;
	}
	/* checked whole before the first entry is handed out */
	int rc = list_pass(b, e, url, want_prefix, NULL, NULL, why);
	if (rc == 0)
		rc = list_pass(b, e, url, want_prefix, cb, ctx, why);
	if (rc) {
		free(*token);
		*token = NULL;
		*truncated = 0;
	}
	return rc;
}
