/*
 * sigv4.c - AWS Signature Version 4 (see sigv4.h): canonical request,
 * string to sign, derived signing key, signature.
 */
#include <ctype.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sigv4.h"

#define MAX_HEADERS 32

static void hex(const unsigned char *b, size_t n, char *out)
{
	static const char d[] = "0123456789abcdef";
	for (size_t i = 0; i < n; i++) {
		out[2 * i] = d[b[i] >> 4];
		out[2 * i + 1] = d[b[i] & 15];
	}
	out[2 * n] = 0;
}

void ckpt_sha256_hex(const void *buf, size_t len, char out[65])
{
	unsigned char md[SHA256_DIGEST_LENGTH];
	SHA256(buf, len, md);
	hex(md, sizeof(md), out);
}

void ckpt_sigv4_amz_date(time_t t, char out[17])
{
	struct tm tm;
	gmtime_r(&t, &tm);
	strftime(out, 17, "%Y%m%dT%H%M%SZ", &tm);
}

char *ckpt_sigv4_uri_encode(const char *s, int keep_slash)
{
	size_t n = strlen(s);
	char *r = malloc(3 * n + 1), *o = r;
	if (!r)
		return NULL;
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		unsigned c = *p;
		if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
		    c == '.' || c == '_' || c == '~' || (c == '/' && keep_slash)) {
			*o++ = (char)c;
		} else {
			static const char d[] = "0123456789ABCDEF";
			*o++ = '%';
			*o++ = d[c >> 4];
			*o++ = d[c & 15];
		}
	}
	*o = 0;
	return r;
}

struct qpair {
	char *name, *value;
};

static int qcmp(const void *a, const void *b)
{
	const struct qpair *x = a, *y = b;
	int c = strcmp(x->name, y->name);
	return c ? c : strcmp(x->value, y->value);
}

char *ckpt_sigv4_query(const char *const *names, const char *const *values, size_t n)
{
	struct qpair *v = calloc(n + 1, sizeof(*v));
	char *r = NULL;
	size_t total = 1;
	if (!v)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		v[i].name = ckpt_sigv4_uri_encode(names[i], 0);
		v[i].value = ckpt_sigv4_uri_encode(values && values[i] ? values[i] : "", 0);
		if (!v[i].name || !v[i].value)
			goto out;
		total += strlen(v[i].name) + strlen(v[i].value) + 2;
	}
	qsort(v, n, sizeof(*v), qcmp);
	r = malloc(total);
	if (!r)
		goto out;
	char *o = r;
	for (size_t i = 0; i < n; i++)
		o += sprintf(o, "%s%s=%s", i ? "&" : "", v[i].name, v[i].value);
	*o = 0;
out:
	for (size_t i = 0; i < n; i++) {
		free(v[i].name);
		free(v[i].value);
	}
	free(v);
	return r;
}

struct hdr {
	char *name, *value;
};

static int hcmp(const void *a, const void *b)
{
	return strcmp(((const struct hdr *)a)->name, ((const struct hdr *)b)->name);
}

/* Trim, collapse runs of spaces. */
static char *norm_value(const char *s)
{
	char *r = malloc(strlen(s) + 1), *o = r;
	if (!r)
		return NULL;
	while (*s == ' ' || *s == '\t')
		s++;
	int sp = 0;
	for (; *s; s++) {
		if (*s == ' ' || *s == '\t') {
			sp = 1;
			continue;
		}
		if (sp && o != r)
			*o++ = ' ';
		sp = 0;
		*o++ = *s;
	}
	*o = 0;
	return r;
}

char *ckpt_sigv4_canonical(const char *method, const char *uri, const char *query,
			   const struct ckpt_sigv4_header *h, size_t nh, const char *payload_hash,
			   char **signed_headers)
{
	struct hdr v[MAX_HEADERS];
	char *r = NULL, *sh = NULL;
	size_t total = strlen(method) + strlen(uri) + strlen(query) + strlen(payload_hash) + 8;
	size_t shlen = 1;
	size_t k = 0;
	*signed_headers = NULL;
	if (nh > MAX_HEADERS)
		return NULL;
	for (; k < nh; k++) {
		v[k].name = strdup(h[k].name);
		v[k].value = norm_value(h[k].value);
		if (!v[k].name || !v[k].value) {
			k++;
			goto out;
		}
		for (char *p = v[k].name; *p; p++)
			*p = (char)tolower((unsigned char)*p);
		total += strlen(v[k].name) + strlen(v[k].value) + 2;
		shlen += strlen(v[k].name) + 1;
	}
	qsort(v, nh, sizeof(v[0]), hcmp);
	r = malloc(total + shlen);
	sh = malloc(shlen);
	if (!r || !sh) {
		free(r);
		free(sh);
		r = sh = NULL;
		goto out;
	}
	char *o = sh;
	for (size_t i = 0; i < nh; i++)
		o += sprintf(o, "%s%s", i ? ";" : "", v[i].name);
	*o = 0;
	o = r;
	o += sprintf(o, "%s\n%s\n%s\n", method, *uri ? uri : "/", query);
	for (size_t i = 0; i < nh; i++)
		o += sprintf(o, "%s:%s\n", v[i].name, v[i].value);
	sprintf(o, "\n%s\n%s", sh, payload_hash);
	*signed_headers = sh;
out:
	for (size_t i = 0; i < k; i++) {
		free(v[i].name);
		free(v[i].value);
	}
	return r;
}

static int hmac(const void *key, size_t klen, const char *msg, unsigned char out[32])
{
	unsigned int n = 32;
	return HMAC(EVP_sha256(), key, (int)klen, (const unsigned char *)msg, strlen(msg), out, &n) ? 0 : -1;
}

char *ckpt_sigv4_sign(const struct ckpt_sigv4_creds *c, const char *amz_date, const char *method,
		      const char *uri, const char *query, const struct ckpt_sigv4_header *h, size_t nh,
		      const char *payload_hash, char sig_out[65])
{
	char *sh = NULL;
	char *canon = ckpt_sigv4_canonical(method, uri, query, h, nh, payload_hash, &sh);
	if (!canon)
		return NULL;
	char chash[65];
	ckpt_sha256_hex(canon, strlen(canon), chash);
	free(canon);

	char date[9];
	memcpy(date, amz_date, 8);
	date[8] = 0;
	size_t scope_len = strlen(c->region) + strlen(c->service) + 32;
	char *scope = malloc(scope_len);
	size_t sts_len = scope_len + 128;
	char *sts = malloc(sts_len);
	size_t kl = strlen(c->secret_key) + 5;
	char *k0 = malloc(kl);
	char *auth = NULL;
	if (!scope || !sts || !k0)
		goto out;
	snprintf(scope, scope_len, "%s/%s/%s/aws4_request", date, c->region, c->service);
	snprintf(sts, sts_len, "AWS4-HMAC-SHA256\n%s\n%s\n%s", amz_date, scope, chash);
	snprintf(k0, kl, "AWS4%s", c->secret_key);
	unsigned char kd[32], kr[32], ks[32], kg[32], sig[32];
	if (hmac(k0, strlen(k0), date, kd) || hmac(kd, 32, c->region, kr) || hmac(kr, 32, c->service, ks) ||
	    hmac(ks, 32, "aws4_request", kg) || hmac(kg, 32, sts, sig))
		goto out;
	char sighex[65];
	hex(sig, 32, sighex);
	size_t alen = strlen(c->access_key) + strlen(scope) + strlen(sh) + 160;
	auth = malloc(alen);
	if (auth)
		snprintf(auth, alen, "AWS4-HMAC-SHA256 Credential=%s/%s, SignedHeaders=%s, Signature=%s",
			 c->access_key, scope, sh, sighex);
	if (sig_out)
		memcpy(sig_out, sighex, 65);
	OPENSSL_cleanse(kd, sizeof(kd));
	OPENSSL_cleanse(kr, sizeof(kr));
	OPENSSL_cleanse(ks, sizeof(ks));
	OPENSSL_cleanse(kg, sizeof(kg));
out:
	if (k0) {
		OPENSSL_cleanse(k0, strlen(k0));
		free(k0);
	}
	free(scope);
	free(sts);
	free(sh);
	return auth;
}
