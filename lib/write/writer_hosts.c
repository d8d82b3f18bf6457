/*
 * writer_hosts.c - one step written by several hosts over a shared root
 * (writer_hosts.h has the contracts, docs/format.md "Multi-host writes" the
 * files).  Built on the single-host writer: the primary's step is the step;
 * every other host writes a staging step of its own in the coordination
 * folder, and at its commit exports what it wrote (stored chunks by file
 * offset, partly written chunks with their byte coverage) in a done record.
 * The primary adopts stored chunks into its own shard files (a whole shard
 * file by rename when one host wrote all of it, else by copying the
 * compressed bytes), merges partial chunks through the normal write path
 * (ckpt_w_chunk_write, so they are compressed like any other chunk), and then
 * commits with ckpt_step_commit, which checks that every byte is there.
 *
 * Calls writer.c/writer_decl.c/writer_commit.c through the public API, and
 * writer_chunk.c (ckpt_w_chunk_write, ckpt_w_chunk_adopt_stored, idle wait),
 * writer_shard.c (paths) and writer_geom.c below them.
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <zstd.h>

#include "orbax.h"
#include "sysio.h"
#include "writer_hosts.h"
#include "writer_int.h"

#define DONE_MAX ((size_t)256 << 20)
/* Polling the shared folder: 1 ms at first, doubling up to 50 ms. */
#define POLL_MIN_NS (1000 * 1000)
#define POLL_MAX_NS (50 * 1000 * 1000)

struct whosts {
	int index, count;
	unsigned timeout_s;
	char *root, *step; /* shared root, real step name */
	char *cname; /* "<step>.orbax-checkpoint-tmp.hosts" */
	int rootfd, cfd;
	char attempt[64]; /* primary: its attempt id; others: the one of the last done record */
	char nonce[64]; /* others: id of the last done record */
	cJSON *done; /* others: the last done record */
	uint64_t moved, copied,
		merged; /* primary's last merge: shard files renamed, chunks copied / merged */
};

static void w_hosts_free(struct ckpt_step *st)
{
	struct whosts *h = st->hosts;
	if (!h)
		return;
	if (h->cfd >= 0)
		close(h->cfd);
	if (h->rootfd >= 0)
		close(h->rootfd);
	cJSON_Delete(h->done);
	free(h->root);
	free(h->step);
	free(h->cname);
	free(h);
	st->hosts = NULL;
}

int ckpt_hosts_is_multi(const ckpt_step *st)
{
	return st && st->hosts != NULL;
}

/* ---- small helpers ---- */

static void new_id(char *buf, size_t cap)
{
	uint64_t r = 0;
	if (getrandom(&r, sizeof(r), 0) != (ssize_t)sizeof(r))
		r = (uint64_t)getpid() * 0x9e3779b97f4a7c15ull;
	snprintf(buf, cap, "%016llx-%llx", (unsigned long long)r, (unsigned long long)ckpt_wall_ns());
}

static void nap(long *ns)
{
	struct timespec ts = { 0, *ns };
	nanosleep(&ts, NULL);
	*ns = *ns * 2 > POLL_MAX_NS ? POLL_MAX_NS : *ns * 2;
}

/* Write name below dirfd atomically: a fsynced temporary, rename, fsync of
 * the folder. */
static int write_atomic(int dirfd, const char *name, const char *data, size_t len)
{
	char tmp[300], id[64];
	new_id(id, sizeof(id));
	snprintf(tmp, sizeof(tmp), ".tmp.%s", id);
	int rc = ckpt_write_file_sync_at(dirfd, tmp, data, len);
	if (!rc && renameat(dirfd, tmp, dirfd, name))
		rc = -errno;
	if (rc)
		unlinkat(dirfd, tmp, 0);
	else
		rc = ckpt_fsync_dir_at(dirfd, ".");
	return rc;
}

/* Parse the JSON file name below dirfd; -ENOENT when absent. */
static int read_json(int dirfd, const char *name, size_t max, cJSON **out)
{
	char *s = NULL;
	size_t len = 0;
	*out = NULL;
	int rc = ckpt_read_small_file(dirfd, name, max, &s, &len);
	if (rc)
		return rc;
	*out = cJSON_ParseWithLength(s, len);
	free(s);
	return *out ? 0 : -EINVAL;
}

static int write_json_atomic(int dirfd, const char *name, const cJSON *j)
{
	char *s = cJSON_PrintUnformatted(j);
	if (!s)
		return -ENOMEM;
	int rc = write_atomic(dirfd, name, s, strlen(s));
	free(s);
	return rc;
}

uint64_t ckpt_w_json_to_u64(const cJSON *j)
{
	if (!cJSON_IsNumber(j) || !(j->valuedouble > 0))
		return 0;
	/* 2^64 and up (a written 2^64-1 reads back as 2^64): saturated, no cast overflow */
	return j->valuedouble < 18446744073709551616.0 ? (uint64_t)j->valuedouble : UINT64_MAX;
}

static char *join_keys(const char *const *keys, int depth)
{
	size_t n = 1;
	for (int i = 0; i < depth; i++)
		n += strlen(keys[i]) + 1;
	char *s = malloc(n), *p = s;
	if (!s)
		return NULL;
	*p = 0;
	for (int i = 0; i < depth; i++) {
		if (i)
			*p++ = '.';
		p = stpcpy(p, keys[i]);
	}
	return s;
}

/* mkdir -p of the folders of rel (not its last component) below dirfd. */
static int mkdir_parents(int dirfd, const char *rel)
{
	char path[4096];
	if (snprintf(path, sizeof(path), "%s", rel) >= (int)sizeof(path))
		return -ENAMETOOLONG;
	for (char *p = path; (p = strchr(p, '/')); p++) {
		*p = 0;
		int r = mkdirat(dirfd, path, 0755);
		*p = '/';
		if (r && errno != EEXIST)
			return -errno;
	}
	return 0;
}

/* ---- declarations ---- */

/* The declaration record of a (keys, dtype, shape, chunk and shard shapes). */
static cJSON *decl_json(const struct ckpt_warray *a, int host)
{
	cJSON *j = cJSON_CreateObject(), *k = cJSON_CreateArray(), *t = cJSON_CreateArray();
	for (int i = 0; i < a->depth; i++) {
		cJSON_AddItemToArray(k, cJSON_CreateString(a->keys[i]));
		cJSON_AddItemToArray(t, cJSON_CreateNumber(a->ktypes[i]));
	}
	cJSON_AddStringToObject(j, "item", a->item->name);
	cJSON_AddItemToObject(j, "keys", k);
	cJSON_AddItemToObject(j, "key_types", t);
	cJSON_AddStringToObject(j, "dtype", ckpt_dtype_get(a->dtype)->name);
	cJSON_AddItemToObject(j, "shape", ckpt_w_json_shape(a->shape, a->rank));
	cJSON_AddItemToObject(j, "chunk", ckpt_w_json_shape(a->inner, a->rank));
	cJSON_AddItemToObject(j, "shard", ckpt_w_json_shape(a->shard, a->rank));
	cJSON_AddNumberToObject(j, "host", host);
	return j;
}

int ckpt_w_decl_parse(const cJSON *j, struct w_decl *d)
{
	memset(d, 0, sizeof(*d));
	const cJSON *it = cJSON_GetObjectItemCaseSensitive(j, "item");
	const cJSON *k = cJSON_GetObjectItemCaseSensitive(j, "keys");
	const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "key_types");
	const cJSON *dt = cJSON_GetObjectItemCaseSensitive(j, "dtype");
	const cJSON *sh = cJSON_GetObjectItemCaseSensitive(j, "shape");
	const cJSON *ch = cJSON_GetObjectItemCaseSensitive(j, "chunk");
	const cJSON *sd = cJSON_GetObjectItemCaseSensitive(j, "shard");
	if (!cJSON_IsString(it) || !cJSON_IsArray(k) || !cJSON_IsArray(t) || !cJSON_IsString(dt) ||
	    !cJSON_IsArray(sh) || !cJSON_IsArray(ch) || !cJSON_IsArray(sd))
		return -EINVAL;
	d->item = it->valuestring;
	d->depth = cJSON_GetArraySize(k);
	d->rank = cJSON_GetArraySize(sh);
	if (d->depth < 1 || d->depth > CKPT_ORBAX_MAX_DEPTH || cJSON_GetArraySize(t) != d->depth ||
	    d->rank > CKPT_MAX_RANK || cJSON_GetArraySize(ch) != d->rank || cJSON_GetArraySize(sd) != d->rank)
		return -EINVAL;
	for (int i = 0; i < d->depth; i++) {
		const cJSON *ki = cJSON_GetArrayItem(k, i), *ti = cJSON_GetArrayItem(t, i);
		if (!cJSON_IsString(ki) || !cJSON_IsNumber(ti))
			return -EINVAL;
		d->keys[i] = ki->valuestring;
		d->types[i] = ti->valueint;
	}
	for (int i = 0; i < d->rank; i++) {
		d->shape[i] = ckpt_w_json_to_u64(cJSON_GetArrayItem(sh, i));
		d->chunk[i] = ckpt_w_json_to_u64(cJSON_GetArrayItem(ch, i));
		d->shard[i] = ckpt_w_json_to_u64(cJSON_GetArrayItem(sd, i));
	}
	d->dtype = ckpt_dtype_from_name(dt->valuestring);
	const cJSON *h = cJSON_GetObjectItemCaseSensitive(j, "host");
	d->host = cJSON_IsNumber(h) ? h->valueint : -1;
	return ckpt_dtype_get(d->dtype) ? 0 : -EINVAL;
}

/* What differs between record d and the declaration (keys, dtype, shape)
 * or, with a, the array's chunk and shard shapes; NULL when nothing. */
static const char *decl_differs(const struct w_decl *d, const char *const *keys, const int *types, int depth,
				ckpt_dtype dtype, int rank, const uint64_t *shape,
				const struct ckpt_warray *a)
{
	if (d->depth != depth)
		return "key path";
	for (int i = 0; i < depth; i++)
		if (strcmp(d->keys[i], keys[i]) || (types && d->types[i] != types[i]))
			return "key path";
	if (d->dtype != dtype)
		return "dtype";
	if (d->rank != rank)
		return "shape";
	for (int i = 0; i < rank; i++)
		if (d->shape[i] != shape[i])
			return "shape";
	for (int i = 0; a && i < rank; i++)
		if (d->chunk[i] != a->inner[i] || d->shard[i] != a->shard[i])
			return "chunk or shard shape";
	return NULL;
}

static int decl_rel(const char *item, const char *name, char *buf, size_t cap)
{
	int n = snprintf(buf, cap, "decl/%s/%s", item, name);
	return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

int ckpt_hosts_declare(ckpt_step *st, const char *item, const char *const *keypath, const int *key_types,
		       int depth, ckpt_dtype dtype, int rank, const uint64_t *shape, ckpt_warray **out)
{
	struct whosts *h = st->hosts;
	if (!h)
		return ckpt_step_add_array(st, item, keypath, key_types, depth, dtype, rank, shape, out);
	*out = NULL;
	if (!item || !keypath || depth < 1 || depth > CKPT_ORBAX_MAX_DEPTH || !ckpt_dtype_get(dtype))
		return ckpt_step_add_array(st, item, keypath, key_types, depth, dtype, rank, shape, out);
	for (int i = 0; i < depth; i++)
		if (!keypath[i])
			return -EINVAL;
	char *name = join_keys(keypath, depth);
	char rel[4096];
	if (!name)
		return -ENOMEM;
	int rc = decl_rel(item, name, rel, sizeof(rel));
	cJSON *rec = NULL;
	struct w_decl d;
	if (!rc) {
		rc = read_json(h->cfd, rel, 1 << 20, &rec);
		if (rc == -ENOENT)
			rc = 0;
		else if (!rc && ckpt_w_decl_parse(rec, &d))
			rc = -EINVAL;
	}
	const char *what = NULL;
	if (!rc && rec && (what = decl_differs(&d, keypath, key_types, depth, dtype, rank, shape, NULL)))
		rc = -EINVAL;
	if (!rc)
		rc = ckpt_step_add_array(st, item, keypath, key_types, depth, dtype, rank, shape, out);
	if (!rc && rec && (what = decl_differs(&d, keypath, key_types, depth, dtype, rank, shape, *out)))
		rc = -EINVAL;
	if (!rc && !rec) {
		/* Publish: a temporary linked to the final name, which fails if
		 * another host published first (then compare with that one). */
		char dir[4096], tmp[4400], id[64];
		snprintf(dir, sizeof(dir), "decl/%s", item);
		new_id(id, sizeof(id));
		snprintf(tmp, sizeof(tmp), "%s/.tmp.%d.%s", dir, h->index, id);
		if (mkdirat(h->cfd, dir, 0755) && errno != EEXIST)
			rc = -errno;
		cJSON *j = rc ? NULL : decl_json(*out, h->index);
		char *s = j ? cJSON_PrintUnformatted(j) : NULL;
		cJSON_Delete(j);
		if (!rc)
			rc = s ? ckpt_write_file_sync_at(h->cfd, tmp, s, strlen(s)) : -ENOMEM;
		free(s);
		if (!rc && linkat(h->cfd, tmp, h->cfd, rel, 0)) {
			rc = -errno;
			if (rc == -EEXIST) {
				rc = read_json(h->cfd, rel, 1 << 20, &rec);
				if (!rc && ckpt_w_decl_parse(rec, &d))
					rc = -EINVAL;
				if (!rc && (what = decl_differs(&d, keypath, key_types, depth, dtype, rank,
								shape, *out)))
					rc = -EINVAL;
			}
		}
		unlinkat(h->cfd, tmp, 0);
		if (!rc)
			rc = ckpt_fsync_dir_at(h->cfd, dir);
	}
	if (rc == -EINVAL && what)
		ckpt_log(CKPT_LOG_ERR,
			 "writer: %s/%s: host %d declared it with another %s; host %d's declaration is "
			 "refused",
			 item, name, rec ? d.host : -1, what, h->index);
	else if (rc && rc != -EINVAL)
		ckpt_log(CKPT_LOG_ERR, "writer: %s/%s: declaration record: %s", item, name, strerror(-rc));
	cJSON_Delete(rec);
	free(name);
	return rc;
}

int ckpt_hosts_adopt(ckpt_step *st, const char *item, const char *const *keypath, int depth,
		     ckpt_warray **out)
{
	struct whosts *h = st->hosts;
	*out = NULL;
	if (!h || !item || !keypath || depth < 1 || depth > CKPT_ORBAX_MAX_DEPTH)
		return -ENOENT;
	char *name = join_keys(keypath, depth);
	char rel[4096];
	if (!name)
		return -ENOMEM;
	int rc = decl_rel(item, name, rel, sizeof(rel));
	cJSON *rec = NULL;
	struct w_decl d;
	if (!rc)
		rc = read_json(h->cfd, rel, 1 << 20, &rec);
	if (!rc && ckpt_w_decl_parse(rec, &d))
		rc = -EINVAL;
	if (!rc && decl_differs(&d, keypath, NULL, depth, d.dtype, d.rank, d.shape, NULL))
		rc = -ENOENT; /* another key path with the same param name */
	if (!rc)
		rc = ckpt_step_add_array(st, item, d.keys, d.types, depth, d.dtype, d.rank, d.shape, out);
	if (!rc && decl_differs(&d, keypath, NULL, depth, d.dtype, d.rank, d.shape, *out)) {
		ckpt_log(CKPT_LOG_ERR, "writer: %s/%s: chunk or shard shape differs from host %d's", item,
			 name, d.host);
		rc = -EINVAL;
	}
	if (rc == -EINVAL)
		ckpt_log(CKPT_LOG_ERR, "writer: %s/%s: unusable declaration record", item, name);
	cJSON_Delete(rec);
	free(name);
	return rc;
}

/* ---- begin ---- */

/* Primary: done and error records of earlier attempts go; new attempt id. */
static int new_attempt(struct whosts *h)
{
	DIR *dir = NULL;
	int fd = openat(h->cfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0)
		dir = fdopendir(fd);
	if (!dir) {
		if (fd >= 0)
			close(fd);
		return -errno;
	}
	struct dirent *e;
	while ((e = readdir(dir)))
		if (!strncmp(e->d_name, "done.", 5) || !strcmp(e->d_name, "error") ||
		    !strncmp(e->d_name, ".tmp.", 5))
			unlinkat(h->cfd, e->d_name, 0);
	closedir(dir);
	new_id(h->attempt, sizeof(h->attempt));
	return write_atomic(h->cfd, "attempt", h->attempt, strlen(h->attempt));
}

int ckpt_hosts_step_begin(const char *root, const char *step_name, const ckpt_writer_opts *o,
			  const ckpt_hosts_opts *ho, ckpt_step **out)
{
	*out = NULL;
	if (!ho || ho->count <= 1)
		return ckpt_step_begin(root, step_name, o, out);
	const char *why = "no root folder";
	if (ho->count > CKPT_HOSTS_MAX || ho->index < 0 || ho->index >= ho->count) {
		ckpt_log(CKPT_LOG_ERR, "writer: process_index %d is not in [0, process_count %d)", ho->index,
			 ho->count);
		return -EINVAL;
	}
	if (!root || !ckpt_orbax_name_ok(CKPT_NAME_PENDING_STEP, step_name, &why)) {
		ckpt_log(CKPT_LOG_ERR, "writer: bad step name '%s': %s", step_name ? step_name : "(null)",
			 why);
		return -EINVAL;
	}
	struct whosts *h = calloc(1, sizeof(*h));
	if (!h)
		return -ENOMEM;
	h->index = ho->index;
	h->count = ho->count;
	h->timeout_s = ho->timeout_s ? ho->timeout_s : CKPT_HOSTS_DEFAULT_TIMEOUT;
	h->rootfd = h->cfd = -1;
	int rc = -ENOMEM;
	ckpt_step *st = NULL;
	struct stat sb;
	if (!(h->root = strdup(root)) || !(h->step = strdup(step_name)) ||
	    asprintf(&h->cname, "%s%s", step_name, CKPT_HOSTS_SUFFIX) < 0) {
		h->cname = NULL;
		goto fail;
	}
	h->rootfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (h->rootfd < 0) {
		rc = -errno;
		goto fail;
	}
	if (fstatat(h->rootfd, step_name, &sb, AT_SYMLINK_NOFOLLOW) == 0) {
		ckpt_log(CKPT_LOG_ERR, "writer: step %s already exists in %s", step_name, root);
		rc = -EEXIST;
		goto fail;
	}
	if (mkdirat(h->rootfd, h->cname, 0755) && errno != EEXIST) {
		rc = -errno;
		goto fail;
	}
	h->cfd = openat(h->rootfd, h->cname, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (h->cfd < 0 || (mkdirat(h->cfd, "decl", 0755) && errno != EEXIST)) {
		rc = -errno;
		goto fail;
	}
	/* One inner chunk per shard file, as Orbax writes: a host that writes a
	 * whole chunk then owns its whole shard file, which the primary moves
	 * into the step by rename instead of copying it. */
	ckpt_writer_opts oo;
	if (o)
		oo = *o;
	else
		ckpt_writer_opts_init(&oo);
	oo.shard_bytes = oo.chunk_bytes;
	o = &oo;
	if (h->index == 0) {
		rc = ckpt_step_begin(root, step_name, o, &st);
		if (!rc && (rc = new_attempt(h)))
			ckpt_log(CKPT_LOG_ERR, "writer: step %s: cannot start an attempt in %s/%s: %s",
				 step_name, root, h->cname, strerror(-rc));
	} else {
		char hname[32], cpath[8192];
		snprintf(hname, sizeof(hname), "h%d", h->index);
		snprintf(cpath, sizeof(cpath), "%s/%s", root, h->cname);
		rc = ckpt_step_begin(cpath, hname, o, &st);
	}
	if (rc)
		goto fail;
	st->hosts = h;
	st->hosts_free = w_hosts_free;
	*out = st;
	ckpt_log(CKPT_LOG_INFO, "writer: step %s: host %d of %d begins%s%s", step_name, h->index, h->count,
		 h->index ? "" : " attempt ", h->index ? "" : h->attempt);
	return 0;
fail:
	if (st) {
		ckpt_step_abort(st);
		ckpt_step_destroy(st);
	}
	if (rc != -EEXIST && rc != -EBUSY)
		ckpt_log(CKPT_LOG_ERR, "writer: step %s: host %d cannot begin: %s", step_name, ho->index,
			 strerror(-rc));
	struct ckpt_step tmp = { .hosts = h };
	w_hosts_free(&tmp);
	return rc;
}

/* ---- host I >= 1: export and wait ---- */

/* Copy of a partial chunk's bytes and a bitmap of its covered bytes. */
struct peek {
	uint64_t n; /* chunk_nbytes */
	uint8_t *buf; /* n bytes, then (n + 7) / 8 bitmap bytes */
};

static void set_bits(uint8_t *bm, uint64_t a, uint64_t b)
{
	for (uint64_t i = a; i < b; i++)
		bm[i >> 3] |= (uint8_t)(1u << (i & 7));
}

static int peek_fill(void *ctx, uint8_t *buf, struct wcov *cov, uint64_t *added)
{
	struct peek *p = ctx;
	uint8_t *bm = p->buf + p->n;
	*added = 0;
	memcpy(p->buf, buf, p->n);
	memset(bm, 0, (p->n + 7) / 8);
	if (cov->bm) {
		for (uint64_t i = 0; i < p->n; i++)
			if (cov->bm[i >> 6] >> (i & 63) & 1)
				bm[i >> 3] |= (uint8_t)(1u << (i & 7));
	} else {
		for (uint32_t k = 0; k < cov->n; k++)
			set_bits(bm, cov->iv[k][0], cov->iv[k][1]);
	}
	return 0;
}

static enum wc_state chunk_state(struct ckpt_warray *a, uint64_t idx, uint64_t *off, uint64_t *len)
{
	ckpt_lock(&a->mu, CKPT_RANK_W_ARRAY);
	const struct wchunk *c = ckpt_w_chunk_at(a, idx);
	enum wc_state s = c ? c->state : WC_EMPTY;
	if (off)
		*off = c ? c->off : 0;
	if (len)
		*len = c ? c->len : 0;
	ckpt_unlock(&a->mu, CKPT_RANK_W_ARRAY);
	return s;
}

/* Common checks of a commit; then every background job finished. */
static int commit_prepare(struct ckpt_step *st)
{
	if (st->state != CKPT_STEP_PENDING)
		return ckpt_w_step_writable(st, "commit");
	ckpt_lock(&st->mu, CKPT_RANK_W_STEP);
	uint64_t pins = st->pins_total;
	ckpt_unlock(&st->mu, CKPT_RANK_W_STEP);
	if (pins) {
		ckpt_log(CKPT_LOG_ERR, "writer: step %s: commit while writes are in progress",
			 st->hosts->step);
		return -EBUSY;
	}
	ckpt_w_chunk_retry_errors(st);
	ckpt_w_chunk_wait_idle(st);
	for (struct witem *it = st->items; it; it = it->next)
		for (struct ckpt_warray *a = it->first; a; a = a->next)
			if (atomic_load(&a->err)) {
				int rc = atomic_load(&a->err);
				ckpt_log(CKPT_LOG_ERR,
					 "writer: commit of step %s: %s: storing chunks failed: %s",
					 st->hosts->step, a->relpath, strerror(-rc));
				return rc;
			}
	return 0;
}

/* Export array a: stored chunks, partial chunks appended to the parts file
 * at *poff; fsync its shard files.  Fills the array's done entry. */
static int export_array(struct ckpt_step *st, struct ckpt_warray *a, int pfd, uint64_t *poff, cJSON *e)
{
	cJSON *stored = cJSON_AddArrayToObject(e, "stored"), *parts = cJSON_AddArrayToObject(e, "parts");
	struct peek p = { .n = a->chunk_nbytes };
	size_t raw = (size_t)(p.n + (p.n + 7) / 8), zcap = ZSTD_compressBound(raw);
	uint8_t *z = NULL;
	int rc = 0;
	for (uint64_t i = ckpt_w_chunk_next(a, 0); i < a->nchunks && !rc; i = ckpt_w_chunk_next(a, i + 1)) {
		uint64_t off, len;
		enum wc_state s = chunk_state(a, i, &off, &len);
		if (s == WC_EMPTY)
			continue;
		cJSON *t = cJSON_CreateArray();
		cJSON_AddItemToArray(t, ckpt_w_json_u64(i));
		if (s == WC_STORED) {
			cJSON_AddItemToArray(t, ckpt_w_json_u64(off));
			cJSON_AddItemToArray(t, ckpt_w_json_u64(len));
			cJSON_AddItemToArray(stored, t);
			continue;
		}
		if (!p.buf && (!(p.buf = malloc(raw)) || !(z = malloc(zcap)))) {
			cJSON_Delete(t);
			rc = -ENOMEM;
			break;
		}
		rc = ckpt_w_chunk_write(a, i, peek_fill, &p);
		size_t zn = rc ? 0 : ZSTD_compress(z, zcap, p.buf, raw, 1);
		if (!rc && ZSTD_isError(zn))
			rc = -EIO;
		if (!rc)
			rc = ckpt_pwrite_all(pfd, z, zn, *poff);
		if (rc) {
			cJSON_Delete(t);
			break;
		}
		cJSON_AddItemToArray(t, ckpt_w_json_u64(*poff));
		cJSON_AddItemToArray(t, ckpt_w_json_u64(zn));
		cJSON_AddItemToArray(parts, t);
		*poff += zn;
	}
	free(p.buf);
	free(z);
	/* Shard files written so far, and their folders. */
	char path[4096], last[4096] = "";
	for (uint64_t s = ckpt_w_shard_next(a, 0); s < a->nshards && !rc; s = ckpt_w_shard_next(a, s + 1)) {
		struct wshard *sh = ckpt_w_shard_at(a, s);
		ckpt_lock(&sh->mu, CKPT_RANK_W_SHARD);
		uint64_t end = sh->end;
		ckpt_unlock(&sh->mu, CKPT_RANK_W_SHARD);
		if (!end)
			continue;
		if ((rc = ckpt_w_shard_path(a, s, path, sizeof(path))) < 0)
			break;
		rc = 0;
		int fd = openat(st->dirfd, path, O_RDONLY | O_CLOEXEC);
		if (fd < 0 || fsync(fd))
			rc = -errno;
		if (fd >= 0)
			close(fd);
		for (char *sl = strrchr(path, '/'); sl && !rc; sl = NULL) {
			*sl = 0;
			if (strcmp(path, last)) {
				rc = ckpt_w_fsync_dir(st, path);
				snprintf(last, sizeof(last), "%s", path);
			}
		}
	}
	if (!rc) {
		snprintf(path, sizeof(path), "%s/c", a->relpath);
		struct stat sb;
		if (fstatat(st->dirfd, path, &sb, 0) == 0)
			rc = ckpt_w_fsync_dir(st, path);
	}
	if (!rc)
		rc = ckpt_w_fsync_dir(st, a->relpath);
	return rc;
}

/* Make this host's part durable and build its done record. */
static int host_export(struct ckpt_step *st, const char *final_name, cJSON **out)
{
	struct whosts *h = st->hosts;
	*out = NULL;
	int pfd = openat(st->dirfd, "parts", O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (pfd < 0)
		return -errno;
	cJSON *j = cJSON_CreateObject(), *items = cJSON_CreateArray(), *arrays = cJSON_CreateArray();
	cJSON_AddNumberToObject(j, "host", h->index);
	cJSON_AddStringToObject(j, "final", final_name);
	cJSON_AddItemToObject(j, "items", items);
	cJSON_AddItemToObject(j, "arrays", arrays);
	uint64_t poff = 0;
	int rc = 0;
	ckpt_lock(&st->decl_mu, CKPT_RANK_W_DECL);
	for (struct witem *it = st->items; it && !rc; it = it->next) {
		cJSON_AddItemToArray(items, cJSON_CreateString(it->name));
		for (struct ckpt_warray *a = it->first; a && !rc; a = a->next) {
			cJSON *e = decl_json(a, h->index);
			ckpt_lock(&a->mu, CKPT_RANK_W_ARRAY);
			if (a->sharding)
				cJSON_AddStringToObject(e, "sharding", a->sharding);
			ckpt_unlock(&a->mu, CKPT_RANK_W_ARRAY);
			cJSON_AddItemToArray(arrays, e);
			rc = export_array(st, a, pfd, &poff, e);
		}
		if (!rc)
			rc = ckpt_w_fsync_dir(st, it->name);
	}
	ckpt_unlock(&st->decl_mu, CKPT_RANK_W_DECL);
	if (!rc && fsync(pfd))
		rc = -errno;
	close(pfd);
	if (!rc)
		rc = ckpt_w_fsync_dir(st, ".");
	if (rc) {
		cJSON_Delete(j);
		return rc;
	}
	*out = j;
	return 0;
}

static int read_attempt(struct whosts *h, char *buf, size_t cap)
{
	char *s = NULL;
	size_t len = 0;
	int rc = ckpt_read_small_file(h->cfd, "attempt", 256, &s, &len);
	if (rc)
		return rc;
	snprintf(buf, cap, "%.*s", (int)len, s);
	free(s);
	return 0;
}

/* (Re)write done.<I> for the current attempt with a new nonce. */
static int record_done(struct whosts *h)
{
	char name[32];
	if (read_attempt(h, h->attempt, sizeof(h->attempt)))
		h->attempt[0] = 0; /* the primary has not begun: recorded again when it does */
	new_id(h->nonce, sizeof(h->nonce));
	cJSON_DeleteItemFromObjectCaseSensitive(h->done, "attempt");
	cJSON_DeleteItemFromObjectCaseSensitive(h->done, "nonce");
	cJSON_AddStringToObject(h->done, "attempt", h->attempt);
	cJSON_AddStringToObject(h->done, "nonce", h->nonce);
	snprintf(name, sizeof(name), "done.%d", h->index);
	return write_json_atomic(h->cfd, name, h->done);
}

/* The error record's errno when it names nonce, else 0. */
static int error_for(struct whosts *h, const char *nonce, char *msg, size_t cap)
{
	cJSON *e = NULL;
	if (read_json(h->cfd, "error", 1 << 20, &e))
		return 0;
	int rc = 0;
	const cJSON *n, *ns = cJSON_GetObjectItemCaseSensitive(e, "nonces");
	cJSON_ArrayForEach(n, ns)
	{
		if (cJSON_IsString(n) && !strcmp(n->valuestring, nonce)) {
			const cJSON *en = cJSON_GetObjectItemCaseSensitive(e, "errno");
			const cJSON *m = cJSON_GetObjectItemCaseSensitive(e, "message");
			rc = cJSON_IsNumber(en) && en->valueint > 0 ? -en->valueint : -EIO;
			snprintf(msg, cap, "%s", cJSON_IsString(m) ? m->valuestring : "(no message)");
		}
	}
	cJSON_Delete(e);
	return rc;
}

static int host_commit(struct ckpt_step *st, const char *final_name)
{
	struct whosts *h = st->hosts;
	int rc = commit_prepare(st);
	if (rc)
		return rc;
	cJSON_Delete(h->done);
	h->done = NULL;
	rc = host_export(st, final_name, &h->done);
	if (!rc)
		rc = record_done(h);
	if (rc) {
		ckpt_log(CKPT_LOG_ERR, "writer: step %s: host %d cannot record its part: %s", h->step,
			 h->index, strerror(-rc));
		return rc;
	}
	ckpt_log(CKPT_LOG_INFO, "writer: step %s: host %d done; waiting for the primary's commit", h->step,
		 h->index);
	uint64_t deadline = ckpt_now_ns() + ((uint64_t)h->timeout_s * 2 + 10) * 1000000000ull;
	char name[32], msg[1024], att[64];
	snprintf(name, sizeof(name), "done.%d", h->index);
	long poll = POLL_MIN_NS;
	for (;;) {
		struct stat sb;
		if (fstatat(h->rootfd, final_name, &sb, 0) == 0 && S_ISDIR(sb.st_mode))
			break;
		rc = error_for(h, h->nonce, msg, sizeof(msg));
		if (rc) {
			ckpt_log(CKPT_LOG_ERR, "writer: step %s: the primary's commit failed: %s", h->step,
				 msg);
			return rc;
		}
		/* A new attempt of the primary (or a record it removed) while
		 * this host's part stands: record it again for that attempt. */
		if ((read_attempt(h, att, sizeof(att)) == 0 && strcmp(att, h->attempt)) ||
		    fstatat(h->cfd, name, &sb, 0)) {
			if (fstatat(h->rootfd, final_name, &sb, 0) == 0)
				break;
			if (error_for(h, h->nonce, msg, sizeof(msg)) == 0 && (rc = record_done(h)))
				return rc;
		}
		if (ckpt_now_ns() > deadline) {
			ckpt_log(CKPT_LOG_ERR,
				 "writer: step %s: host %d: no commit from the primary (host 0) "
				 "within %u s",
				 h->step, h->index, h->timeout_s * 2 + 10);
			return -ETIMEDOUT;
		}
		nap(&poll);
	}
	atomic_store(&st->state, CKPT_STEP_COMMITTED);
	ckpt_w_zpool_stop(st);
	ckpt_log(CKPT_LOG_INFO, "writer: step %s: committed by the primary (host %d's part included)",
		 final_name, h->index);
	return 0;
}

/* ---- primary: collect, merge, commit ---- */

/* Write the error record of this attempt and drop the consumed done
 * records, so every host's next commit starts over. */
static void fail_attempt(struct whosts *h, cJSON **done, int rc, const char *msg, const int *missing,
			 int nmissing)
{
	cJSON *e = cJSON_CreateObject(), *ns = cJSON_CreateArray(), *ms = cJSON_CreateArray();
	cJSON_AddStringToObject(e, "attempt", h->attempt);
	cJSON_AddNumberToObject(e, "errno", -rc);
	cJSON_AddStringToObject(e, "message", msg);
	for (int k = 1; k < h->count; k++)
		if (done[k]) {
			const cJSON *n = cJSON_GetObjectItemCaseSensitive(done[k], "nonce");
			if (cJSON_IsString(n))
				cJSON_AddItemToArray(ns, cJSON_CreateString(n->valuestring));
		}
	for (int i = 0; i < nmissing; i++)
		cJSON_AddItemToArray(ms, cJSON_CreateNumber(missing[i]));
	cJSON_AddItemToObject(e, "nonces", ns);
	cJSON_AddItemToObject(e, "missing", ms);
	int wr = write_json_atomic(h->cfd, "error", e);
	cJSON_Delete(e);
	if (wr)
		ckpt_log(CKPT_LOG_ERR, "writer: step %s: cannot write the error record: %s", h->step,
			 strerror(-wr));
	for (int k = 1; k < h->count; k++)
		if (done[k]) {
			char name[32];
			snprintf(name, sizeof(name), "done.%d", k);
			unlinkat(h->cfd, name, 0);
		}
	ckpt_fsync_dir_at(h->cfd, ".");
}

/* Wait for done records of this attempt from hosts 1..N-1.  -ETIMEDOUT
 * with the missing indices in missing[0..*nmissing). */
static int collect_done(struct whosts *h, cJSON **done, int *missing, int *nmissing)
{
	uint64_t deadline = ckpt_now_ns() + (uint64_t)h->timeout_s * 1000000000ull;
	long poll = POLL_MIN_NS;
	for (;;) {
		int left = 0;
		for (int k = 1; k < h->count; k++) {
			if (done[k])
				continue;
			char name[32];
			cJSON *j = NULL;
			snprintf(name, sizeof(name), "done.%d", k);
			if (read_json(h->cfd, name, DONE_MAX, &j) == 0) {
				const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "attempt");
				if (cJSON_IsString(a) && !strcmp(a->valuestring, h->attempt)) {
					done[k] = j;
					continue;
				}
				cJSON_Delete(j);
			}
			left++;
		}
		if (!left)
			return 0;
		if (ckpt_now_ns() > deadline) {
			*nmissing = 0;
			for (int k = 1; k < h->count; k++)
				if (!done[k])
					missing[(*nmissing)++] = k;
			return -ETIMEDOUT;
		}
		nap(&poll);
	}
}

/* Where a chunk comes from when another host stored it whole. */
/* A chunk another host stored whole (the lowest host id of those that did). */
struct src {
	uint64_t idx;
	int host;
	uint64_t off, len;
};

static int src_cmp(const void *x, const void *y)
{
	const struct src *p = x, *q = y;
	if (p->idx != q->idx)
		return p->idx < q->idx ? -1 : 1;
	return p->host < q->host ? -1 : p->host > q->host;
}

static const struct src *src_find(const struct src *v, size_t n, uint64_t idx)
{
	size_t lo = 0, hi = n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (v[mid].idx == idx)
			return &v[mid];
		if (v[mid].idx < idx)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

static int u64_cmp(const void *x, const void *y)
{
	uint64_t p = *(const uint64_t *)x, q = *(const uint64_t *)y;
	return p < q ? -1 : p > q;
}

/* The entry of shard s of the primary (made if none of its chunks was
 * written here); NULL on ENOMEM. */
static struct wshard *shard_entry(struct ckpt_warray *a, uint64_t s)
{
	ckpt_lock(&a->mu, CKPT_RANK_W_ARRAY);
	struct wshard *sh = ckpt_w_shard_touch(a, s);
	ckpt_unlock(&a->mu, CKPT_RANK_W_ARRAY);
	return sh;
}

/* Apply bytes of a chunk under a bitmap (write path fill). */
struct apply {
	const struct ckpt_warray *a;
	const uint8_t *data, *bm;
};

static int apply_fill(void *ctx, uint8_t *buf, struct wcov *cov, uint64_t *added)
{
	struct apply *p = ctx;
	uint64_t n = p->a->chunk_nbytes, i = 0;
	*added = 0;
	while (i < n) {
		while (i < n && !(p->bm[i >> 3] >> (i & 7) & 1))
			i++;
		uint64_t s = i;
		while (i < n && (p->bm[i >> 3] >> (i & 7) & 1))
			i++;
		if (i > s) {
			memcpy(buf + s, p->data + s, i - s);
			int64_t r = ckpt_w_cov_add(cov, n, s, i);
			if (r < 0)
				return (int)r;
			*added += (uint64_t)r;
		}
	}
	return 0;
}

/* Bitmap of the in-bounds bytes of chunk idx (padded chunk, C order). */
static void inbounds_bitmap(const struct ckpt_warray *a, uint64_t idx, uint8_t *bm)
{
	uint64_t cg[CKPT_MAX_RANK], ext[CKPT_MAX_RANK], l[CKPT_MAX_RANK] = { 0 };
	memset(bm, 0, (a->chunk_nbytes + 7) / 8);
	ckpt_w_chunk_coords(a, idx, cg);
	for (int d = 0; d < a->rank; d++) {
		uint64_t s = cg[d] * a->inner[d];
		ext[d] = a->shape[d] - s < a->inner[d] ? a->shape[d] - s : a->inner[d];
		if (!ext[d])
			return;
	}
	if (a->rank == 0) {
		set_bits(bm, 0, a->isz);
		return;
	}
	int r = a->rank;
	for (;;) {
		uint64_t e = 0;
		for (int d = 0; d < r; d++)
			e = e * a->inner[d] + l[d];
		set_bits(bm, e * a->isz, (e + ext[r - 1]) * a->isz);
		int d = r - 2;
		while (d >= 0 && ++l[d] == ext[d])
			l[d--] = 0;
		if (d < 0)
			break;
	}
}

static int host_path(const struct ckpt_warray *a, int host, uint64_t sidx, char *buf, size_t cap)
{
	char rel[4096];
	int rc = ckpt_w_shard_path(a, sidx, rel, sizeof(rel));
	if (rc < 0)
		return rc;
	rc = snprintf(buf, cap, "h%d.orbax-checkpoint-tmp/%s", host, rel);
	return rc < 0 || (size_t)rc >= cap ? -ENAMETOOLONG : 0;
}

/* Read and decompress a chunk host k stored at (off, len) into dst. */
static int load_host_chunk(struct whosts *h, const struct ckpt_warray *a, int k, uint64_t idx, uint64_t off,
			   uint64_t len, uint8_t *dst)
{
	char path[4400];
	int rc = host_path(a, k, ckpt_w_chunk_shard(a, idx), path, sizeof(path));
	if (rc)
		return rc;
	uint8_t *z = malloc(len ? len : 1);
	if (!z)
		return -ENOMEM;
	int fd = openat(h->cfd, path, O_RDONLY | O_CLOEXEC);
	rc = fd < 0 ? -errno : ckpt_pread_all(fd, z, len, off);
	if (fd >= 0)
		close(fd);
	if (!rc) {
		size_t n = ZSTD_decompress(dst, a->chunk_nbytes, z, len);
		rc = ZSTD_isError(n) || n != a->chunk_nbytes ? -EIO : 0;
	}
	free(z);
	return rc;
}

/* Copy len bytes at off of host k's shard file to the end of the primary's
 * shard file; the new offset in *noff. */
static int copy_chunk(struct whosts *h, struct ckpt_warray *a, int k, uint64_t sidx, uint64_t off,
		      uint64_t len, uint64_t *noff)
{
	char hp[4400], pp[4096];
	int rc = host_path(a, k, sidx, hp, sizeof(hp));
	if (!rc && (rc = ckpt_w_shard_path(a, sidx, pp, sizeof(pp))) > 0)
		rc = 0;
	if (!rc)
		rc = mkdir_parents(a->step->dirfd, pp);
	if (rc)
		return rc;
	int in = openat(h->cfd, hp, O_RDONLY | O_CLOEXEC);
	int out = openat(a->step->dirfd, pp, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
	if (in < 0 || out < 0)
		rc = -errno;
	struct wshard *sh = rc ? NULL : shard_entry(a, sidx);
	if (!rc && !sh)
		rc = -ENOMEM;
	if (!rc) {
		ckpt_lock(&sh->mu, CKPT_RANK_W_SHARD);
		*noff = sh->end;
		sh->end += len;
		ckpt_unlock(&sh->mu, CKPT_RANK_W_SHARD);
	}
	loff_t io = (loff_t)off, oo = (loff_t)*noff;
	uint64_t left = rc ? 0 : len;
	while (left) {
		ssize_t n = copy_file_range(in, &io, out, &oo, left, 0);
		if (n <= 0)
			break;
		left -= (uint64_t)n;
	}
	if (left && !rc) { /* no copy_file_range here: read and write */
		uint8_t *b = malloc(left);
		rc = b ? ckpt_pread_all(in, b, left, (uint64_t)io) : -ENOMEM;
		if (!rc)
			rc = ckpt_pwrite_all(out, b, left, (uint64_t)oo);
		free(b);
	}
	if (in >= 0)
		close(in);
	if (out >= 0)
		close(out);
	return rc;
}

/* One host's stored and parts lists of array a (NULL when it has none). */
static const cJSON *host_entry(cJSON *done, const struct ckpt_warray *a)
{
	const cJSON *e, *arrays = cJSON_GetObjectItemCaseSensitive(done, "arrays");
	cJSON_ArrayForEach(e, arrays)
	{
		struct w_decl d;
		if (ckpt_w_decl_parse(e, &d) || strcmp(d.item, a->item->name) || d.depth != a->depth)
			continue;
		int same = 1;
		for (int i = 0; i < d.depth && same; i++)
			same = !strcmp(d.keys[i], a->keys[i]);
		if (same)
			return e;
	}
	return NULL;
}

/* Merge every host's stored and partial chunks of a into the primary.
 * O(chunks the hosts stored or wrote in part), not O(chunks declared). */
static int merge_array(struct whosts *h, struct ckpt_warray *a, cJSON **done)
{
	size_t nsrc = 0, cap = 0;
	for (int k = 1; k < h->count; k++) {
		const cJSON *e = host_entry(done[k], a);
		cap += (size_t)cJSON_GetArraySize(e ? cJSON_GetObjectItemCaseSensitive(e, "stored") : NULL);
	}
	struct src *src = malloc((cap ? cap : 1) * sizeof(*src));
	uint64_t *shs = malloc((cap ? cap : 1) * sizeof(*shs));
	if (!src || !shs) {
		free(src);
		free(shs);
		return -ENOMEM;
	}
	for (int k = 1; k < h->count; k++) {
		const cJSON *e = host_entry(done[k], a), *t;
		cJSON_ArrayForEach(t, (e ? cJSON_GetObjectItemCaseSensitive(e, "stored") : NULL))
		{
			uint64_t i = ckpt_w_json_to_u64(cJSON_GetArrayItem(t, 0));
			if (i < a->nchunks && nsrc < cap)
				src[nsrc++] =
					(struct src){ .idx = i,
						      .host = k,
						      .off = ckpt_w_json_to_u64(cJSON_GetArrayItem(t, 1)),
						      .len = ckpt_w_json_to_u64(cJSON_GetArrayItem(t, 2)) };
		}
	}
	/* Sorted by chunk, the lowest host first; one entry per chunk. */
	qsort(src, nsrc, sizeof(*src), src_cmp);
	size_t u = 0;
	for (size_t i = 0; i < nsrc; i++)
		if (!u || src[u - 1].idx != src[i].idx)
			src[u++] = src[i];
	nsrc = u;
	size_t nshs = 0;
	for (size_t i = 0; i < nsrc; i++)
		shs[nshs++] = ckpt_w_chunk_shard(a, src[i].idx);
	qsort(shs, nshs, sizeof(*shs), u64_cmp);
	u = 0;
	for (size_t i = 0; i < nshs; i++)
		if (!u || shs[u - 1] != shs[i])
			shs[u++] = shs[i];
	nshs = u;
	uint64_t per = 1;
	for (int d = 0; d < a->rank; d++)
		per *= a->mps[d];
	int rc = 0;
	/* Stored chunks: a whole shard of one host moves by rename; else the
	 * compressed bytes are copied.  The primary's own complete chunks win. */
	for (size_t q = 0; q < nshs && !rc; q++) {
		uint64_t s = shs[q];
		int only = -2; /* -2: no chunk yet, -1: mixed, else the one host */
		uint64_t end = 0;
		for (uint64_t e = 0; e < per; e++) {
			uint64_t i = ckpt_w_shard_entry_chunk(a, s, e);
			if (i == UINT64_MAX)
				continue;
			const struct src *sc = src_find(src, nsrc, i);
			int k = chunk_state(a, i, NULL, NULL) == WC_EMPTY && sc ? sc->host : -1;
			only = only == -2 || only == k ? k : -1;
			if (k >= 0 && sc->off + sc->len > end)
				end = sc->off + sc->len;
		}
		struct wshard *sh = shard_entry(a, s);
		if (!sh) {
			rc = -ENOMEM;
			break;
		}
		ckpt_lock(&sh->mu, CKPT_RANK_W_SHARD);
		int fresh = sh->end == 0;
		ckpt_unlock(&sh->mu, CKPT_RANK_W_SHARD);
		if (only >= 0 && fresh) {
			char hp[4400], pp[4096];
			rc = host_path(a, only, s, hp, sizeof(hp));
			if (!rc && (rc = ckpt_w_shard_path(a, s, pp, sizeof(pp))) > 0)
				rc = 0;
			if (!rc)
				rc = mkdir_parents(a->step->dirfd, pp);
			if (!rc && renameat(h->cfd, hp, a->step->dirfd, pp))
				rc = -errno;
			if (rc)
				break;
			ckpt_lock(&sh->mu, CKPT_RANK_W_SHARD);
			sh->end = end;
			ckpt_unlock(&sh->mu, CKPT_RANK_W_SHARD);
			for (uint64_t e = 0; e < per && !rc; e++) {
				uint64_t i = ckpt_w_shard_entry_chunk(a, s, e);
				const struct src *sc = i == UINT64_MAX ? NULL : src_find(src, nsrc, i);
				if (sc)
					rc = ckpt_w_chunk_adopt_stored(a, i, sc->off, sc->len);
			}
			h->moved++;
			continue;
		}
		for (uint64_t e = 0; e < per && !rc; e++) {
			uint64_t i = ckpt_w_shard_entry_chunk(a, s, e);
			const struct src *sc = i == UINT64_MAX ? NULL : src_find(src, nsrc, i);
			if (!sc || chunk_state(a, i, NULL, NULL) != WC_EMPTY)
				continue;
			uint64_t noff = 0;
			rc = copy_chunk(h, a, sc->host, s, sc->off, sc->len, &noff);
			if (!rc)
				rc = ckpt_w_chunk_adopt_stored(a, i, noff, sc->len);
			if (!rc)
				h->copied++;
		}
	}
	free(shs);
	/* Chunks the primary holds in part and another host stored whole, and
	 * chunks written in part by several hosts: through the write path. */
	uint64_t n = a->chunk_nbytes, bml = (n + 7) / 8;
	size_t raw = (size_t)(n + bml);
	uint8_t *buf = rc ? NULL : malloc(raw), *z = NULL;
	if (!rc && !buf)
		rc = -ENOMEM;
	for (size_t q = 0; q < nsrc && !rc; q++) {
		uint64_t i = src[q].idx;
		enum wc_state s = chunk_state(a, i, NULL, NULL);
		if (s != WC_LIVE && s != WC_SPILLED)
			continue;
		rc = load_host_chunk(h, a, src[q].host, i, src[q].off, src[q].len, buf);
		if (!rc) {
			inbounds_bitmap(a, i, buf + n);
			struct apply ap = { a, buf, buf + n };
			rc = ckpt_w_chunk_write(a, i, apply_fill, &ap);
		}
	}
	for (int k = 1; k < h->count && !rc; k++) {
		const cJSON *e = host_entry(done[k], a), *t;
		char pp[64];
		snprintf(pp, sizeof(pp), "h%d.orbax-checkpoint-tmp/parts", k);
		int pfd = -1;
		cJSON_ArrayForEach(t, (e ? cJSON_GetObjectItemCaseSensitive(e, "parts") : NULL))
		{
			uint64_t i = ckpt_w_json_to_u64(cJSON_GetArrayItem(t, 0)),
				 off = ckpt_w_json_to_u64(cJSON_GetArrayItem(t, 1)),
				 zl = ckpt_w_json_to_u64(cJSON_GetArrayItem(t, 2));
			if (i >= a->nchunks || src_find(src, nsrc, i))
				continue;
			enum wc_state s = chunk_state(a, i, NULL, NULL);
			if (s != WC_EMPTY && s != WC_LIVE && s != WC_SPILLED)
				continue; /* complete on the primary */
			if (pfd < 0 && (pfd = openat(h->cfd, pp, O_RDONLY | O_CLOEXEC)) < 0) {
				rc = -errno;
				break;
			}
			uint8_t *nz = realloc(z, zl ? zl : 1);
			if (!nz) {
				rc = -ENOMEM;
				break;
			}
			z = nz;
			rc = ckpt_pread_all(pfd, z, zl, off);
			size_t got = rc ? 0 : ZSTD_decompress(buf, raw, z, zl);
			if (!rc && (ZSTD_isError(got) || got != raw))
				rc = -EIO;
			if (rc)
				break;
			struct apply ap = { a, buf, buf + n };
			rc = ckpt_w_chunk_write(a, i, apply_fill, &ap);
			if (rc)
				break;
			h->merged++;
		}
		if (pfd >= 0)
			close(pfd);
	}
	if (rc)
		ckpt_log(CKPT_LOG_ERR, "writer: commit of step %s: merging the hosts' parts of %s: %s",
			 h->step, a->relpath, strerror(-rc));
	free(buf);
	free(z);
	free(src);
	return rc;
}

/* Declarations, items and shardings of every host into the primary's step,
 * then their chunks. */
static int merge_all(struct ckpt_step *st, cJSON **done, const char *final_name, char *msg, size_t cap)
{
	struct whosts *h = st->hosts;
	int rc = 0;
	h->moved = h->copied = h->merged = 0;
	for (int k = 1; k < h->count && !rc; k++) {
		const cJSON *f = cJSON_GetObjectItemCaseSensitive(done[k], "final"), *e;
		if (!cJSON_IsString(f) || strcmp(f->valuestring, final_name)) {
			snprintf(msg, cap, "host %d commits step %s as '%s', the primary as '%s'", k, h->step,
				 cJSON_IsString(f) ? f->valuestring : "?", final_name);
			return -EINVAL;
		}
		cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(done[k], "items"))
		{
			if (cJSON_IsString(e) && (rc = ckpt_step_add_item(st, e->valuestring)))
				break;
		}
		cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(done[k], "arrays"))
		{
			struct w_decl d;
			ckpt_warray *a = NULL;
			if (rc || (rc = ckpt_w_decl_parse(e, &d)))
				break;
			rc = ckpt_step_add_array(st, d.item, d.keys, d.types, d.depth, d.dtype, d.rank,
						 d.shape, &a);
			if (!rc && decl_differs(&d, d.keys, d.types, d.depth, d.dtype, d.rank, d.shape, a))
				rc = -EINVAL;
			if (rc) {
				snprintf(msg, cap,
					 "host %d's declaration of %s/%s disagrees with the primary's", k,
					 d.item, d.keys[d.depth - 1]);
				return rc;
			}
			const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "sharding");
			ckpt_lock(&a->mu, CKPT_RANK_W_ARRAY);
			int unset = a->sharding == NULL;
			ckpt_unlock(&a->mu, CKPT_RANK_W_ARRAY);
			if (cJSON_IsString(sh) && unset)
				rc = ckpt_warray_set_sharding(a, sh->valuestring);
		}
	}
	for (struct witem *it = st->items; it && !rc; it = it->next)
		for (struct ckpt_warray *a = it->first; a && !rc; a = a->next)
			rc = merge_array(h, a, done);
	ckpt_w_chunk_wait_idle(st);
	if (!rc)
		ckpt_log(CKPT_LOG_INFO,
			 "writer: step %s: merged %d hosts: %llu shard files moved, %llu chunks copied, %llu "
			 "partial "
			 "chunks merged",
			 h->step, h->count, (unsigned long long)h->moved, (unsigned long long)h->copied,
			 (unsigned long long)h->merged);
	if (rc && !msg[0])
		snprintf(msg, cap, "merging the hosts' parts failed: %s", strerror(-rc));
	return rc;
}

static int primary_commit(struct ckpt_step *st, const char *final_name)
{
	struct whosts *h = st->hosts;
	int rc = commit_prepare(st);
	if (rc)
		return rc;
	cJSON **done = calloc((size_t)h->count, sizeof(*done));
	int *missing = calloc((size_t)h->count, sizeof(int)), nmissing = 0;
	char msg[2048] = "";
	if (!done || !missing) {
		free(done);
		free(missing);
		return -ENOMEM;
	}
	ckpt_log(CKPT_LOG_INFO, "writer: step %s: primary waits for %d other hosts (timeout %u s)", h->step,
		 h->count - 1, h->timeout_s);
	uint64_t t0 = ckpt_now_ns();
	rc = collect_done(h, done, missing, &nmissing);
	uint64_t t1 = ckpt_now_ns(), t2 = t1;
	if (rc == -ETIMEDOUT) {
		int n = snprintf(msg, sizeof(msg), "hosts not done within %u s:", h->timeout_s);
		for (int i = 0; i < nmissing && n > 0 && (size_t)n < sizeof(msg) - 16; i++)
			n += snprintf(msg + n, sizeof(msg) - (size_t)n, " %d", missing[i]);
	}
	if (!rc) {
		rc = merge_all(st, done, final_name, msg, sizeof(msg));
		t2 = ckpt_now_ns();
	}
	if (!rc) {
		const char *f = getenv("CKPT_HOSTS_FAULT");
		if (f && !strcmp(f, "exit_before_rename")) {
			ckpt_log(CKPT_LOG_ERR, "writer: step %s: CKPT_HOSTS_FAULT: exiting before the rename",
				 h->step);
			_exit(70);
		}
		rc = ckpt_step_commit(st, final_name);
		if (rc)
			snprintf(msg, sizeof(msg), "the primary's commit failed: %s", strerror(-rc));
	}
	if (rc) {
		ckpt_log(CKPT_LOG_ERR,
			 "writer: commit of step %s (%d hosts) failed: %s; the step stays pending", h->step,
			 h->count, msg);
		fail_attempt(h, done, rc, msg, missing, nmissing);
	} else {
		uint64_t t3 = ckpt_now_ns();
		ckpt_log(CKPT_LOG_INFO,
			 "writer: step %s: %d hosts committed: waited %.1f ms for the others, merge %.1f ms, "
			 "commit (fsyncs, metadata, rename) %.1f ms",
			 final_name, h->count, (double)(t1 - t0) / 1e6, (double)(t2 - t1) / 1e6,
			 (double)(t3 - t2) / 1e6);
		int r = ckpt_rmtree_at(h->rootfd, h->cname);
		if (r)
			ckpt_log(CKPT_LOG_WARN, "writer: step %s: cannot remove %s/%s: %s", final_name,
				 h->root, h->cname, strerror(-r));
		fsync(h->rootfd);
	}
	for (int k = 0; k < h->count; k++)
		cJSON_Delete(done[k]);
	free(done);
	free(missing);
	return rc;
}

int ckpt_hosts_commit(ckpt_step *st, const char *final_name)
{
	if (!st->hosts)
		return ckpt_step_commit(st, final_name);
	const char *why;
	if (!ckpt_orbax_name_ok(CKPT_NAME_PENDING_STEP, final_name, &why)) {
		ckpt_log(CKPT_LOG_ERR, "writer: step %s: bad final name '%s': %s", st->hosts->step,
			 final_name ? final_name : "(null)", why);
		return -EINVAL;
	}
	return st->hosts->index == 0 ? primary_commit(st, final_name) : host_commit(st, final_name);
}
