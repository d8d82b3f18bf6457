/*
 * fuzz_s3_list.c - libFuzzer target over the ListObjectsV2 answer parser of
 * the object store (ckpt_s3_list_parse, s3_xml.c):
 *   1. the input as an answer body (NUL-terminated copy of exactly its
 *      bytes): every key and ETag handed to the callback is a string inside
 *      the allocation, the continuation token only when truncated; what it
 *      accepts is a whole document (it ends with </ListBucketResult>), and
 *      with a prefix asked for, every key handed out is under it; what it
 *      refuses hands out nothing;
 *   2. a round trip: the input split at '\n' into keys (a leading '/' makes
 *      one a common prefix), written as an answer the way S3 writes one
 *      with encoding-type=url (each key URL-encoded, then XML-escaped), must
 *      parse back to exactly those keys, sizes and order, and the token;
 *      and that page cut off at any byte before its end tag is refused
 *      (-EBADMSG) without a key handed out.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "store.h"
#include "store_int.h"
#include "fuzz.h"

#define MAX_KEYS 64

struct got {
	size_t limit; /* longest string the input allows */
	const char *want; /* the prefix asked for, or NULL */
	int n;
	char *keys[MAX_KEYS];
	int prefix[MAX_KEYS];
	uint64_t sizes[MAX_KEYS];
};

static int cb(void *ctx, const char *key, const char *etag, uint64_t size, int64_t mtime_ns, int is_prefix)
{
	struct got *g = ctx;
	(void)mtime_ns;
	REQUIRE(key && strlen(key) <= g->limit);
	REQUIRE(!etag || strlen(etag) <= g->limit);
	REQUIRE(!is_prefix || (!etag && size == 0));
	REQUIRE(!g->want || strncmp(key, g->want, strlen(g->want)) == 0);
	if (g->n < MAX_KEYS) {
		g->keys[g->n] = strdup(key);
		g->prefix[g->n] = is_prefix;
		g->sizes[g->n] = size;
	}
	g->n++;
	return 0;
}

static void got_free(struct got *g)
{
	for (int i = 0; i < g->n && i < MAX_KEYS; i++)
		free(g->keys[i]);
}

/* Append s (n bytes) URL-encoded, then XML-escaped, to *o. */
static char *put_key(char *o, const char *s, size_t n)
{
	static const char hex[] = "0123456789ABCDEF";
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
		    c == '_' || c == '.' || c == '~' || c == '/') {
			*o++ = (char)c;
		} else if (i % 3 == 0 && c == '&') { /* some bytes as XML entities instead */
			o += sprintf(o, "&amp;");
		} else {
			*o++ = '%';
			*o++ = hex[c >> 4];
			*o++ = hex[c & 15];
		}
	}
	return o;
}

static void round_trip(const uint8_t *data, size_t size)
{
	char *doc = malloc(size * 6 + 1024 + MAX_KEYS * 256);
	if (!doc)
		return;
	char *o = doc;
	o += sprintf(o, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListBucketResult "
			"xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>b</Name><Prefix></Prefix>"
			"<KeyCount>1</KeyCount><MaxKeys>1000</MaxKeys><EncodingType>url</EncodingType>"
			"<IsTruncated>true</IsTruncated>");
	const char *keys[MAX_KEYS];
	size_t lens[MAX_KEYS];
	int pre[MAX_KEYS], n = 0;
	const char *p = (const char *)data, *end = p + size;
	while (p < end && n < MAX_KEYS) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		const char *e = nl ? nl : end;
		int is_pre = e > p && *p == '/';
		const char *k = p + is_pre;
		if (e > k && !memchr(k, 0, (size_t)(e - k))) { /* keys are non-empty C strings */
			keys[n] = k;
			lens[n] = (size_t)(e - k);
			pre[n] = is_pre;
			n++;
		}
		p = e + 1;
	}
	/* all objects first, then the common prefixes (the parser's order) */
	for (int pass = 0; pass < 2; pass++)
		for (int i = 0; i < n; i++) {
			if (pre[i] != pass)
				continue;
			if (pass) {
				o += sprintf(o, "<CommonPrefixes><Prefix>");
				o = put_key(o, keys[i], lens[i]);
				o += sprintf(o, "</Prefix></CommonPrefixes>");
			} else {
				o += sprintf(o, "<Contents><Key>");
				o = put_key(o, keys[i], lens[i]);
				o += sprintf(o,
					     "</Key><LastModified>2024-05-01T10:20:30.500Z</LastModified>"
					     "<ETag>&quot;%08x&quot;</ETag><Size>%d</Size>"
					     "<StorageClass>STANDARD</StorageClass></Contents>",
					     (unsigned)i, i * 1000 + 7);
			}
		}
	o += sprintf(o, "<NextContinuationToken>tok+/=%d</NextContinuationToken></ListBucketResult>", n);
	size_t len = (size_t)(o - doc);
	/* cut off anywhere before its end tag: refused, nothing handed out (a
	 * few cuts per input, all of them for short pages) */
	size_t step = len / 97 + 1;
	for (size_t cut = size % step; cut < len; cut += step) {
		struct got c = { len, NULL, 0, { 0 }, { 0 }, { 0 } };
		int tr = 0;
		char *tk = NULL;
		char save = doc[cut];
		doc[cut] = 0;
		REQUIRE(ckpt_s3_list_parse(doc, cut, "", cb, &c, &tr, &tk, NULL) == -EBADMSG);
		REQUIRE(c.n == 0 && tk == NULL && tr == 0);
		doc[cut] = save;
	}
	struct got g = { size * 6 + 1024 + MAX_KEYS * 256, "", 0, { 0 }, { 0 }, { 0 } };
	int truncated = 0;
	char *token = NULL;
	int rc = ckpt_s3_list_parse(doc, len, "", cb, &g, &truncated, &token, NULL);
	REQUIRE(rc == 0 && truncated == 1 && token);
	char want[32];
	snprintf(want, sizeof(want), "tok+/=%d", n);
	REQUIRE(strcmp(token, want) == 0); /* the token is not URL-decoded */
	REQUIRE(g.n == n);
	int j = 0;
	for (int pass = 0; pass < 2; pass++)
		for (int i = 0; i < n; i++) {
			if (pre[i] != pass)
				continue;
			REQUIRE(g.prefix[j] == pass);
			REQUIRE(strlen(g.keys[j]) == lens[i] && memcmp(g.keys[j], keys[i], lens[i]) == 0);
			REQUIRE(g.sizes[j] == (pass ? 0 : (uint64_t)(i * 1000 + 7)));
			j++;
		}
	free(token);
	got_free(&g);
	free(doc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *body = malloc(size + 1);
	if (!body)
		return 0;
	memcpy(body, data, size);
	body[size] = 0;
	/* with the prefix asked for taken from the input's first byte */
	char want[2] = { size ? (char)data[0] : 0, 0 };
	for (int pass = 0; pass < 2; pass++) {
		struct got g = { size, pass ? want : NULL, 0, { 0 }, { 0 }, { 0 } };
		int truncated = 0;
		char *token = NULL;
		const char *why = NULL;
		int rc = ckpt_s3_list_parse(body, size, g.want, cb, &g, &truncated, &token, &why);
		REQUIRE(rc == 0 || rc == -EBADMSG);
		if (rc == 0) { /* accepted: a whole document */
			static const char end[] = "</ListBucketResult>";
			size_t n = size;
			while (n && (body[n - 1] == ' ' || body[n - 1] == '\t' || body[n - 1] == '\r' ||
				     body[n - 1] == '\n'))
				n--;
			REQUIRE(n >= sizeof(end) - 1 &&
				memcmp(body + n - (sizeof(end) - 1), end, sizeof(end) - 1) == 0);
		} else {
			REQUIRE(why && g.n == 0 && !token && !truncated);
		}
		REQUIRE(!token || truncated);
		REQUIRE(!token || strlen(token) <= size);
		free(token);
		got_free(&g);
	}
	free(body);
	if (size <= 4096)
		round_trip(data, size);
	return 0;
}
