/*
 * upload_tree.c - ckpt_store_upload_tree(): a finished local step folder
 * into an object store, in Orbax's order (data, then metadata, then the
 * commit marker alone, create-only).
 *
 * Jobs: every regular file below the folder is one PUT, or (over
 * UPLOAD_PART bytes) a multipart upload whose parts are separate jobs, so
 * a few large shard files are sent by every worker at once.  Each worker
 * holds one part-sized buffer: memory is threads * UPLOAD_PART.
 */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "orbax.h"
#include "store_int.h"
#include "sysio.h"
#include "upload.h"

#define UPLOAD_PART ((size_t)8 << 20) /* >= CKPT_UPLOAD_MIN_PART */

struct ufile {
	char *rel; /* '/'-separated path below the folder */
	uint64_t size;
	int meta; /* metadata: sent after every data file */
	ckpt_upload *up; /* multipart, or NULL for one PUT */
	int sent; /* the object exists (deleted again when the upload fails) */
};

struct ujob {
	struct ufile *f;
	unsigned part; /* 0: whole-file PUT */
};

struct uctx {
	ckpt_store *s;
	const char *local;
	const char *prefix;
	struct ufile *files;
	size_t nfiles, capfiles;
	struct ujob *jobs;
	size_t njobs, next;
	pthread_mutex_t mu;
	int rc; /* first failure: the other workers stop */
};

/* Names Orbax and zarr read to find data: they go after the data. */
static int is_meta(const char *base)
{
	static const char *const names[] = { "zarr.json",
					     ".zarray",
					     ".zattrs",
					     ".zgroup",
					     ".zmetadata",
					     CKPT_ORBAX_METADATA,
					     CKPT_ORBAX_CKPT_METADATA,
					     CKPT_ORBAX_SHARDING,
					     CKPT_ORBAX_COMMIT_SUCCESS,
					     CKPT_ORBAX_OCDBT_MANIFEST };
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (strcmp(base, names[i]) == 0)
			return 1;
	return 0;
}

static int add_file(struct uctx *c, const char *rel, uint64_t size)
{
	if (c->nfiles == c->capfiles) {
		size_t n = c->capfiles ? 2 * c->capfiles : 64;
		struct ufile *f = realloc(c->files, n * sizeof(*f));
		if (!f)
			return -ENOMEM;
		c->files = f;
		c->capfiles = n;
	}
	struct ufile *f = &c->files[c->nfiles];
	memset(f, 0, sizeof(*f));
	f->rel = strdup(rel);
	if (!f->rel)
		return -ENOMEM;
	const char *b = strrchr(rel, '/');
	f->meta = is_meta(b ? b + 1 : rel);
	f->size = size;
	c->nfiles++;
	return 0;
}

/* Every regular file below local/rel (symlinks and others: -EINVAL). */
static int walk(struct uctx *c, const char *rel, int depth)
{
	char path[4096];
	int n = snprintf(path, sizeof(path), "%s%s%s", c->local, *rel ? "/" : "", rel);
	if (n < 0 || (size_t)n >= sizeof(path))
		return -ENAMETOOLONG;
	DIR *d = opendir(path);
	if (!d)
		return -errno;
	int rc = 0;
	struct dirent *e;
	while (rc == 0 && (e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		char r[4096];
		if ((size_t)snprintf(r, sizeof(r), "%s%s%s", rel, *rel ? "/" : "", e->d_name) >= sizeof(r)) {
			rc = -ENAMETOOLONG;
			break;
		}
		struct stat st;
		if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
			rc = -errno;
		} else if (S_ISDIR(st.st_mode)) {
			rc = depth < 64 ? walk(c, r, depth + 1) : -ELOOP;
		} else if (S_ISREG(st.st_mode)) {
			rc = add_file(c, r, (uint64_t)st.st_size);
		} else {
			ckpt_log(CKPT_LOG_ERR, "%s/%s: not a regular file, not uploaded", c->local, r);
			rc = -EINVAL;
		}
	}
	closedir(d);
	return rc;
}

static int send_job(struct uctx *c, const struct ujob *j, void *buf)
{
	struct ufile *f = j->f;
	char path[4096];
	snprintf(path, sizeof(path), "%s/%s", c->local, f->rel);
	uint64_t off = j->part ? (uint64_t)(j->part - 1) * UPLOAD_PART : 0;
	size_t len = (size_t)(f->size - off < UPLOAD_PART ? f->size - off : UPLOAD_PART);
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return -errno;
	int rc = ckpt_pread_all(fd, buf, len, off);
	close(fd);
	if (rc)
		return rc;
	if (j->part)
		return ckpt_upload_part(f->up, j->part, buf, len);
	char *key = ckpt_store_join(c->prefix, f->rel);
	if (!key)
		return -ENOMEM;
	rc = ckpt_store_put(c->s, key, buf, len, 0);
	free(key);
	if (rc == 0)
		f->sent = 1; /* one writer per file: no lock needed */
	return rc;
}

static void *worker(void *arg)
{
	struct uctx *c = arg;
	void *buf = malloc(UPLOAD_PART);
	for (;;) {
		pthread_mutex_lock(&c->mu);
		if (!buf && !c->rc)
			c->rc = -ENOMEM;
		if (c->rc || c->next == c->njobs) {
			pthread_mutex_unlock(&c->mu);
			break;
		}
		struct ujob j = c->jobs[c->next++];
		pthread_mutex_unlock(&c->mu);
		int rc = send_job(c, &j, buf);
		if (rc) {
			ckpt_log(CKPT_LOG_ERR, "%s/%s: upload of %s failed: %s", c->s->root, c->prefix,
				 j.f->rel, strerror(-rc));
			pthread_mutex_lock(&c->mu);
			if (!c->rc)
				c->rc = rc;
			pthread_mutex_unlock(&c->mu);
		}
	}
	free(buf);
	return NULL;
}

/* Send every file with meta == want (multipart ones begun, parted, completed). */
static int send_phase(struct uctx *c, int want, unsigned threads)
{
	c->njobs = c->next = 0;
	size_t cap = 0;
	int rc = 0;
	for (size_t i = 0; i < c->nfiles && !rc; i++) {
		struct ufile *f = &c->files[i];
		if (f->meta != want || (want && !strcmp(f->rel, CKPT_ORBAX_COMMIT_SUCCESS)))
			continue;
		unsigned parts =
			f->size > UPLOAD_PART ? (unsigned)((f->size + UPLOAD_PART - 1) / UPLOAD_PART) : 0;
		if (parts > CKPT_UPLOAD_MAX_PARTS) {
			ckpt_log(CKPT_LOG_ERR, "%s: %s is too large for one object", c->s->root, f->rel);
			rc = -EFBIG;
			break;
		}
		if (parts) {
			char *key = ckpt_store_join(c->prefix, f->rel);
			rc = key ? ckpt_upload_begin(c->s, key, &f->up) : -ENOMEM;
			free(key);
		}
		for (unsigned p = parts ? 1 : 0; p <= parts && !rc; p++) {
			if (c->njobs == cap) {
				cap = cap ? 2 * cap : 256;
				struct ujob *nj = realloc(c->jobs, cap * sizeof(*nj));
				if (!nj) {
					rc = -ENOMEM;
					break;
				}
				c->jobs = nj;
			}
			c->jobs[c->njobs++] = (struct ujob){ f, p };
		}
	}
	c->rc = rc;
	pthread_t th[64];
	unsigned n = 0;
	if (!rc) {
		for (; n < threads && n < c->njobs; n++)
			if (pthread_create(&th[n], NULL, worker, c) != 0)
				break;
		if (n == 0 && c->njobs)
			worker(c);
		for (unsigned i = 0; i < n; i++)
			pthread_join(th[i], NULL);
		rc = c->rc;
	}
	for (size_t i = 0; i < c->nfiles; i++) {
		struct ufile *f = &c->files[i];
		if (!f->up)
			continue;
		int r = rc ? (ckpt_upload_abort(f->up), 0) : ckpt_upload_complete(f->up);
		f->up = NULL;
		if (r && !rc)
			rc = r;
		else if (!rc)
			f->sent = 1;
	}
	return rc;
}

int ckpt_store_upload_tree(ckpt_store *s, const char *local_dir, const char *prefix, unsigned threads)
{
	struct uctx c = { 0 };
	c.s = s;
	c.local = local_dir;
	c.prefix = prefix;
	pthread_mutex_init(&c.mu, NULL);
	unsigned conns = ckpt_store_s3_connections(s);
	if (conns && threads > conns)
		threads = conns; /* more would hold buffers while waiting for a connection */
	if (threads < 1)
		threads = 1;
	if (threads > 64)
		threads = 64;
	int rc = walk(&c, "", 0);
	int has_marker = 0;
	for (size_t i = 0; i < c.nfiles; i++)
		has_marker |= !strcmp(c.files[i].rel, CKPT_ORBAX_COMMIT_SUCCESS);
	if (rc == 0 && !has_marker) {
		ckpt_log(CKPT_LOG_ERR, "%s: no %s: not a finished step, not uploaded", local_dir,
			 CKPT_ORBAX_COMMIT_SUCCESS);
		rc = -EINVAL;
	}
	if (rc == 0)
		rc = send_phase(&c, 0, threads); /* data */
	if (rc == 0)
		rc = send_phase(&c, 1, threads); /* metadata, item markers */
	if (rc == 0) { /* the step's marker, last and only once */
		char path[4096], *buf = NULL, *key = ckpt_store_join(prefix, CKPT_ORBAX_COMMIT_SUCCESS);
		size_t len = 0;
		snprintf(path, sizeof(path), "%s/%s", local_dir, CKPT_ORBAX_COMMIT_SUCCESS);
		rc = key ? ckpt_read_small_file(AT_FDCWD, path, 1 << 20, &buf, &len) : -ENOMEM;
		if (rc == 0)
			rc = ckpt_store_put(s, key, buf, len, CKPT_PUT_CREATE_ONLY);
		if (rc == -EEXIST)
			ckpt_log(CKPT_LOG_ERR, "%s/%s: the step was committed by someone else meanwhile",
				 s->root, key);
		free(buf);
		free(key);
	}
	if (rc && rc != -EEXIST) { /* no marker: take back what was sent (best effort) */
		for (size_t i = 0; i < c.nfiles; i++) {
			char *key = c.files[i].sent ? ckpt_store_join(prefix, c.files[i].rel) : NULL;
			if (key && ckpt_store_delete(s, key) != 0)
				ckpt_log(CKPT_LOG_WARN, "%s/%s: left behind by the failed upload", s->root,
					 key);
			free(key);
		}
	}
	for (size_t i = 0; i < c.nfiles; i++)
		free(c.files[i].rel);
	free(c.files);
	free(c.jobs);
	pthread_mutex_destroy(&c.mu);
	return rc;
}
