/*
 * sigv4.h - AWS Signature Version 4 (header form) for S3 and the GCS XML
 * API with HMAC keys, over OpenSSL's libcrypto (HMAC-SHA256, SHA-256).
 *
 * The caller builds the request as it will be sent (path already encoded
 * once, query already canonical: see ckpt_sigv4_query) and passes every
 * header it wants signed, including host, x-amz-date and
 * x-amz-content-sha256; the result is the Authorization header value.
 * Nothing here reads the clock or the environment, so every function is a
 * pure function of its arguments (unit-tested against AWS's published
 * examples).  Thread-safe.  Secrets are never logged.
 */
#ifndef CKPT_SIGV4_H
#define CKPT_SIGV4_H

#include <stddef.h>
#include <time.h>

#define CKPT_SHA256_EMPTY "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

struct ckpt_sigv4_header {
	const char *name; /* any case; signed lower-cased */
	const char *value; /* trimmed, inner runs of spaces collapsed when signed */
};

struct ckpt_sigv4_creds {
	const char *access_key;
	const char *secret_key;
	const char *region; /* "us-east-1"; "auto" for GCS */
	const char *service; /* "s3" */
};

/* Lower-case hex SHA-256 of buf into out[65]. */
void ckpt_sha256_hex(const void *buf, size_t len, char out[65]);

/* "YYYYMMDDTHHMMSSZ" of t (UTC) into out[17]. */
void ckpt_sigv4_amz_date(time_t t, char out[17]);

/* RFC 3986 percent-encoding as SigV4 wants it: unreserved bytes
 * (A-Z a-z 0-9 - . _ ~) stay, '/' stays when keep_slash, everything else is
 * %XX with upper-case hex.  malloc'd; NULL on ENOMEM. */
char *ckpt_sigv4_uri_encode(const char *s, int keep_slash);

/* Canonical query string of n (name, value) pairs (value NULL or "" both
 * give "name="): each encoded, sorted by encoded name then value, joined by
 * '&'.  Send exactly this string on the wire.  malloc'd; NULL on ENOMEM. */
char *ckpt_sigv4_query(const char *const *names, const char *const *values, size_t n);

/*
 * The canonical request (malloc'd) for: method, canonical URI (encoded path,
 * "/" when empty), canonical query ("" when none), headers, payload hash
 * (hex or "UNSIGNED-PAYLOAD").  *signed_headers (malloc'd) gets the
 * ';'-joined lower-case names.  NULL on ENOMEM or more than 32 headers.
 */
char *ckpt_sigv4_canonical(const char *method, const char *uri, const char *query,
			   const struct ckpt_sigv4_header *h, size_t nh, const char *payload_hash,
			   char **signed_headers);

/*
 * Sign: returns the Authorization header value (malloc'd):
 * "AWS4-HMAC-SHA256 Credential=AKID/DATE/REGION/SERVICE/aws4_request,
 * SignedHeaders=..., Signature=<64 hex>".  amz_date is the x-amz-date value
 * sent.  When sig_out is not NULL the bare signature is copied there.
 */
char *ckpt_sigv4_sign(const struct ckpt_sigv4_creds *c, const char *amz_date, const char *method,
		      const char *uri, const char *query, const struct ckpt_sigv4_header *h, size_t nh,
		      const char *payload_hash, char sig_out[65]);

#endif
