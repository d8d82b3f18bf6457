/*
 * s3_int.h - internals of the object store (s3://, gs://), shared by its
 * files; not for other layers, nor for other store files.  The file map is
 * at the top of store_int.h: s3_xml.c, s3_creds.c, s3_request.c,
 * store_s3.c, s3_upload.c, each calling only those before it.
 *
 * Locking: s->mu guards the pinned-object table and the bearer token;
 * s->qmu the GET queue and the free-slot count (never both held).
 */
#ifndef CKPT_S3_INT_H
#define CKPT_S3_INT_H

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "http.h"
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

#define NBUCKETS 4096 /* pinned-object table */

/* Small GETs kept (store_s3.c): a shard's index is read before each of its
 * inner chunks, and each read would be a request. */
#define MEMO_SLOTS 64
#define MEMO_MAX ((size_t)64 << 10)

struct memo {
	char *name; /* NULL: free slot */
	char etag[128];
	uint64_t first, last;
	uint8_t *bytes;
};

/* One range GET waiting for a slot (s3_request.c). */
struct greq;

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
	struct memo memo[MEMO_SLOTS]; /* under mu; the oldest goes first */
	unsigned memo_next;
	unsigned long long memo_hits;
};

/* One request (s3_request.c sends it). */
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
	/* Set to 1 (when not NULL) once an attempt ended so that the server may
	 * have applied it without our knowing: no answer (reset, timeout, cut
	 * off) or a 5xx.  A later 412 or final error then says nothing certain
	 * about a create-only write. */
	int *maybe_applied;
};

typedef int (*page_cb)(struct s3_store *s, void *ctx, const char *key, const char *etag, uint64_t size,
		       int64_t mtime_ns, int is_prefix);

/* ---------------------------------------------------------------- small helpers */

static inline char *xstrdup(const char *s)
{
	return s ? strdup(s) : NULL;
}

/* Zero a secret, then free it. */
static inline void free_secret(char *s)
{
	if (s) {
		volatile char *p = s;
		while (*p)
			*p++ = 0;
		free(s);
	}
}

static inline const char *env_nonempty(const char *name)
{
	const char *v = getenv(name);
	return v && *v ? v : NULL;
}

/* Full object name of store key `key` ("" = the prefix itself). */
static inline char *objname(struct s3_store *s, const char *key)
{
	return ckpt_store_join(s->prefix, key);
}

/* ---------------------------------------------------------------- s3_xml.c */

/* Next element <tag> (or <tag attr...>) in [p, end): its content in
 * [*c, *ce), *next after the closing tag.  0 found, -1 not. */
int ckpt_s3_xml_elem(const char *p, const char *end, const char *tag, const char **c, const char **ce,
		     const char **next);
/* Text of [c, ce) with XML entities decoded (and, when url, form-decoded);
 * malloc'd, NULL when out of memory. */
char *ckpt_s3_xml_text(const char *c, const char *ce, int url);
/* A UTC calendar time as ns since 1970; 0 (unknown) outside 1970..2200. */
int64_t ckpt_s3_tm_ns(struct tm *tm);
/* (ckpt_s3_list_parse, in store_int.h, is there too.) */

/* ---------------------------------------------------------------- s3_creds.c */

/* Region and credentials of a new store (s->gcs, s->base.root set): the
 * options, the environment, the profile files, the token file, the GCE
 * metadata server (store.h says in which order).  0, -EINVAL (a named
 * profile that does not exist), -EACCES (an unreadable token file), -ENOMEM. */
int ckpt_s3_creds_setup(struct s3_store *s, const struct ckpt_store_opts *o);
/* Bearer token up to date (re-read the token file when it changed, or ask
 * the metadata server when the token is about to expire); 0 when the store
 * has no such token.  0 or -EACCES (logged). */
int ckpt_s3_bearer_refresh(struct s3_store *s);

/* ---------------------------------------------------------------- s3_request.c */

/* Pin (size, etag) of an object the first time it is seen; copy the pinned
 * entry to *out (NULL: no copy).  0 or -ENOMEM. */
int ckpt_s3_obj_pin(struct s3_store *s, const char *name, uint64_t size, const char *etag, int64_t mtime_ns,
		    struct obj *out);
/* The object was (re)written: what readers pin from now on is the new one. */
void ckpt_s3_obj_replace(struct s3_store *s, const char *name, uint64_t size, const char *etag);
/* Signed request with retries.  0 with *resp holding a 2xx/304 answer;
 * otherwise -ENOENT (404, not logged), -EACCES, -ESTALE (412), -EIO
 * (logged).  r->maybe_applied: see struct rq. */
int ckpt_s3_request(struct s3_store *s, const struct rq *r, struct ckpt_http_resp *resp);
/* HEAD of object `name`, pinned; 0 or -errno as ckpt_s3_request. */
int ckpt_s3_head(struct s3_store *s, const char *name, struct obj *out);
/* Pinned metadata of an object, asking the server when not seen yet. */
int ckpt_s3_meta(struct s3_store *s, const char *name, struct obj *out);
/* The most pages one listing may take (1000 keys each): beyond, -EIO. */
#define CKPT_S3_LIST_MAX_PAGES 100000u
/* ListObjectsV2 of every key starting with `pfx` (full object names), cb
 * for each entry; every page unless one_page.  Each page is checked whole
 * before its entries reach cb; a page that is not a valid listing is asked
 * for again (s->retries times), then -EIO (logged with the request); a
 * token seen twice, more than CKPT_S3_LIST_MAX_PAGES pages, or a truncated
 * page without a token is -EIO too.  On any error the caller must drop
 * what cb received: a listing is used only whole. */
int ckpt_s3_list_objects(struct s3_store *s, const char *pfx, int delim, unsigned max_keys, int one_page,
			 page_cb cb, void *ctx);
/* GET [first, last] of `name` (pinned as *o) into dst through the slot
 * queue, merged with queued neighbours (s3_request.c's header).  0 or
 * -errno (logged). */
int ckpt_s3_coalesced_get(struct s3_store *s, const char *name, const char *key, const struct obj *o,
			  uint64_t first, uint64_t last, void *dst);

/* ---------------------------------------------------------------- store_s3.c */

/* st as an object store, or NULL when it is another kind of store. */
struct s3_store *ckpt_s3_store_of(ckpt_store *st);

#endif
