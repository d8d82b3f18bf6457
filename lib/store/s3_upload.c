/*
 * s3_upload.c - writing objects into an object store (upload.h): single
 * PUTs, multipart uploads (create, parts, complete, abort), DELETE, and the
 * cleanup of multipart uploads a crashed writer left behind.  Above
 * store_s3.c (which store a key names) and s3_request.c (every request:
 * signed, retried); s3_xml.c reads the answers.  A written object's new
 * size and ETag replace its pinned entry, so the store's readers see the
 * new object.  Folder stores answer -EROFS.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "http.h"
#include "s3_int.h"
#include "sigv4.h"
#include "store.h"
#include "store_int.h"
#include "upload.h"

/* The s3 store and full object name behind store key `key`. */
static int writable(ckpt_store *st, const char *key, struct s3_store **out, char **name)
{
	ckpt_store *b;
	char *k;
	int rc = ckpt_store_unwrap(st, key, &b, &k);
	if (rc)
		return rc;
	struct s3_store *s = ckpt_s3_store_of(b);
	if (!s) {
		free(k);
		return -EROFS;
	}
	if (*k && !ckpt_store_key_ok(k)) {
		free(k);
		return -EINVAL;
	}
	*name = objname(s, k);
	free(k);
	if (!*name)
		return -ENOMEM;
	*out = s;
	return 0;
}

/* The header of a create-only PUT: S3's conditional write, or GCS's
 * precondition on the generation (no live object), which its XML API
 * honours where it may ignore If-None-Match. */
static const char *create_only(const struct s3_store *s)
{
	return s->gcs ? "x-goog-if-generation-match: 0" : "If-None-Match: *";
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
			(flags & CKPT_PUT_CREATE_ONLY) ? create_only(s) : NULL,
			NULL };
	struct ckpt_http_resp resp;
	rc = ckpt_s3_request(s, &r, &resp);
	if (rc == 0) {
		ckpt_http_resp_free(&resp);
		ckpt_s3_obj_replace(s, name, len, resp.etag);
	} else if (rc == -ESTALE) {
		rc = -EEXIST; /* 412: create-only and it exists */
	} else if (rc == -ENOENT) {
		ckpt_log(CKPT_LOG_ERR, "%s: PUT %s: no such bucket", s->base.root, name);
		rc = -EIO;
	}
	free(name);
	return rc;
}

/* What the store holds under `name` compared with the marker bytes buf
 * (GET, retried like every request). */
static int marker_state(struct s3_store *s, const char *name, const void *buf, size_t len)
{
	struct rq r = { "GET", name, "", NULL, NULL, NULL, 0, len + ((size_t)1 << 20),
			"GET", NULL, 0,	 NULL, NULL, NULL };
	struct ckpt_http_resp resp;
	int rc = ckpt_s3_request(s, &r, &resp);
	if (rc == -ENOENT)
		return CKPT_MARKER_ABSENT;
	if (rc == -ENOMEM)
		return rc;
	if (rc)
		return CKPT_MARKER_UNKNOWN;
	int same = resp.len == len && (len == 0 || (resp.body && memcmp(resp.body, buf, len) == 0));
	if (same)
		ckpt_s3_obj_replace(s, name, len, resp.etag);
	ckpt_http_resp_free(&resp);
	return same ? CKPT_MARKER_LANDED : CKPT_MARKER_OTHERS;
}

int ckpt_store_put_marker(ckpt_store *st, const char *key, const void *buf, size_t len, int settle)
{
	struct s3_store *s;
	char *name;
	int rc = writable(st, key, &s, &name);
	if (rc)
		return rc;
	if (len > ((size_t)1 << 20)) {
		free(name);
		return -EFBIG;
	}
	char hash[65];
	ckpt_sha256_hex(buf, len, hash);
	int maybe = settle;
	struct rq r = {
		"PUT", name, "", NULL, NULL, NULL, 0, 0, "PUT", buf, len, hash, create_only(s), &maybe
	};
	struct ckpt_http_resp resp;
	rc = ckpt_s3_request(s, &r, &resp);
	int state;
	if (rc == 0) {
		ckpt_http_resp_free(&resp);
		ckpt_s3_obj_replace(s, name, len, resp.etag);
		state = CKPT_MARKER_LANDED;
	} else if (rc == -ENOMEM) {
		state = rc;
	} else if (!maybe) {
		/* every answer was certain: a 412 is someone else's marker, any
		 * other failure wrote nothing */
		state = rc == -ESTALE ? CKPT_MARKER_OTHERS : CKPT_MARKER_ABSENT;
	} else {
		/* an attempt may have landed: ask the store what it holds */
		state = marker_state(s, name, buf, len);
		if (state == CKPT_MARKER_LANDED)
			ckpt_log(CKPT_LOG_WARN, "%s: PUT %s: its answer was lost, but the marker landed",
				 s->base.root, name);
		else if (state == CKPT_MARKER_UNKNOWN)
			ckpt_log(CKPT_LOG_ERR,
				 "%s: PUT %s: whether the marker landed is unknown (no answer settles it)",
				 s->base.root, name);
	}
	free(name);
	return state;
}

int ckpt_store_delete(ckpt_store *st, const char *key)
{
	struct s3_store *s;
	char *name;
	int rc = writable(st, key, &s, &name);
	if (rc)
		return rc;
	struct rq r = { "DELETE", name, "", NULL, NULL, NULL, 0, 0, "DELETE", NULL, 0, NULL, NULL, NULL };
	struct ckpt_http_resp resp;
	rc = ckpt_s3_request(s, &r, &resp);
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
	if (!resp->body || ckpt_s3_xml_elem(resp->body, resp->body + resp->len, tag, &c, &ce, &nx) != 0)
		return NULL;
	return ckpt_s3_xml_text(c, ce, 0);
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
			"Content-Type: application/octet-stream",
			NULL };
	struct ckpt_http_resp resp;
	rc = ckpt_s3_request(s, &r, &resp);
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
	struct rq r = { "PUT", u->name, q, NULL, NULL, NULL, 0, 0, "UploadPart", buf, len, hash, NULL, NULL };
	struct ckpt_http_resp resp;
	int rc = ckpt_s3_request(u->s, &r, &resp);
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
				NULL,	  0,	   NULL, NULL, NULL };
		struct ckpt_http_resp resp;
		int rc = ckpt_s3_request(u->s, &r, &resp);
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
			"Content-Type: application/xml",
			NULL };
	struct ckpt_http_resp resp;
	rc = ckpt_s3_request(s, &r, &resp);
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
			ckpt_s3_obj_replace(s, u->name, total, etag ? etag : resp.etag);
			free(etag);
		}
		free(code);
		ckpt_http_resp_free(&resp);
	} else if (rc == -ENOENT) {
		/* NoSuchUpload after a retry: the first attempt may have completed it. */
		struct obj o;
		rc = ckpt_s3_head(s, u->name, &o) == 0 && o.size == total ? 0 : -EIO;
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
			NULL,  0,    NULL, NULL, NULL };
	struct ckpt_http_resp resp;
	rc = ckpt_s3_request(s, &r, &resp);
	free(q);
	if (rc)
		return rc == -EIO ? -ENOTSUP : rc;
	int n = 0;
	const char *b = resp.body ? resp.body : "", *e = b + resp.len, *c, *ce, *nx;
	for (const char *p = b; ckpt_s3_xml_elem(p, e, "Upload", &c, &ce, &nx) == 0; p = nx) {
		const char *kc, *kce, *kn;
		if (ckpt_s3_xml_elem(c, ce, "Key", &kc, &kce, &kn) != 0)
			continue;
		char *key = ckpt_s3_xml_text(kc, kce, 0);
		if (ckpt_s3_xml_elem(c, ce, "UploadId", &kc, &kce, &kn) != 0) {
			free(key);
			continue;
		}
		char *id = ckpt_s3_xml_text(kc, kce, 0);
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
