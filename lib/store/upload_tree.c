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

#define UPLOAD_PART CKPT_UPLOAD_PART
_Static_assert(UPLOAD_PART >= CKPT_UPLOAD_MIN_PART, "parts below S3's minimum");

struct ufile {
	char *rel; /* '/'-separated path below the folder */
	uint64_t size;
	int meta; /* metadata: sent after every data file */
	int skip; /* already sent by a ckpt_bg_upload */
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
		if (f->skip || f->meta != want || (want && !strcmp(f->rel, CKPT_ORBAX_COMMIT_SUCCESS)))
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
	return ckpt_store_upload_tree_rest(s, local_dir, prefix, threads, NULL, 0);
}

/* Take back (best effort) every object of c that was sent. */
static void delete_sent(struct uctx *c)
{
	for (size_t i = 0; i < c->nfiles; i++) {
		char *key = c->files[i].sent ? ckpt_store_join(c->prefix, c->files[i].rel) : NULL;
		if (key && ckpt_store_delete(c->s, key) != 0)
			ckpt_log(CKPT_LOG_WARN, "%s/%s: left behind by the failed upload", c->s->root, key);
		free(key);
	}
}

/* The step's marker, last and only once; then what is true of the step:
 * 0 committed, -EEXIST someone else's, -EINPROGRESS unknown (everything
 * kept), or the error after the marker was taken back first, then the data. */
static int send_marker(struct uctx *c, int settle)
{
	ckpt_store *s = c->s;
	char path[4096], *buf = NULL, *key = ckpt_store_join(c->prefix, CKPT_ORBAX_COMMIT_SUCCESS);
	size_t len = 0;
	snprintf(path, sizeof(path), "%s/%s", c->local, CKPT_ORBAX_COMMIT_SUCCESS);
	int rc = key ? ckpt_read_small_file(AT_FDCWD, path, 1 << 20, &buf, &len) : -ENOMEM;
	int state = rc ? rc : ckpt_store_put_marker(s, key, buf, len, settle);
	free(buf);
	switch (state) {
	case CKPT_MARKER_LANDED:
		rc = 0;
		break;
	case CKPT_MARKER_OTHERS:
		ckpt_log(CKPT_LOG_ERR, "%s/%s: the step was committed by someone else meanwhile", s->root,
			 key);
		rc = -EEXIST;
		break;
	case CKPT_MARKER_UNKNOWN:
		ckpt_log(CKPT_LOG_ERR,
			 "%s/%s: whether the step committed is unknown: every object sent is kept (a reader "
			 "sees the whole step or none of it)",
			 s->root, key);
		rc = -EINPROGRESS;
		break;
	default: /* absent, or a local error: nothing committed */
		rc = state < 0 ? state : -EIO;
		/* the marker goes first: without it what is left is unfinished */
		if (key && ckpt_store_delete(s, key) != 0) {
			ckpt_log(CKPT_LOG_ERR,
				 "%s/%s: the marker did not land but cannot be deleted; every object sent is "
				 "kept",
				 s->root, key);
			rc = -EINPROGRESS;
		} else {
			ckpt_log(CKPT_LOG_ERR, "%s/%s: the marker did not land; what was sent is deleted",
				 s->root, key);
			delete_sent(c);
		}
		break;
	}
	free(key);
	return rc;
}

int ckpt_store_upload_tree_rest(ckpt_store *s, const char *local_dir, const char *prefix, unsigned threads,
				ckpt_bg_upload *done, int settle)
{
	struct uctx c = { 0 };
	c.s = s;
	c.local = local_dir;
	c.prefix = prefix;
	pthread_mutex_init(&c.mu, NULL);
	unsigned conns = ckpt_store_connections(s);
	if (threads > conns)
		threads = conns; /* more would hold buffers while waiting for a connection */
	if (threads < 1)
		threads = 1;
	if (threads > 64)
		threads = 64;
	int rc = walk(&c, "", 0);
	int has_marker = 0;
	for (size_t i = 0; i < c.nfiles; i++)
		has_marker |= !strcmp(c.files[i].rel, CKPT_ORBAX_COMMIT_SUCCESS);
	for (size_t i = 0; done && rc == 0 && i < c.nfiles; i++) {
		int d = c.files[i].meta ? 0 : ckpt_bg_upload_done(done, c.files[i].rel);
		c.files[i].skip = d == 1;
		c.files[i].sent = d != 0; /* taken back if this upload fails */
	}
	if (rc == 0 && !has_marker) {
		ckpt_log(CKPT_LOG_ERR, "%s: no %s: not a finished step, not uploaded", local_dir,
			 CKPT_ORBAX_COMMIT_SUCCESS);
		rc = -EINVAL;
	}
	if (rc == 0)
		rc = send_phase(&c, 0, threads); /* data */
	if (rc == 0)
		rc = send_phase(&c, 1, threads); /* metadata, item markers */
	if (rc == 0)
		rc = send_marker(&c, settle); /* decides what is kept */
	else if (!settle)
		delete_sent(&c); /* no marker was sent: take back what was */
	/* (settling an unknown marker, a failure before it keeps everything:
	 * the marker of the earlier attempt may be there) */
	else
		rc = -EINPROGRESS;
	for (size_t i = 0; i < c.nfiles; i++)
		free(c.files[i].rel);
	free(c.files);
	free(c.jobs);
	pthread_mutex_destroy(&c.mu);
	return rc;
}

/* ---- background uploads of finished files (ckpt_bg_upload) ---- */

enum { BG_QUEUED, BG_RUNNING, BG_IDLE };

struct bgfile {
	char *rel;
	int state; /* BG_* */
	int again; /* queued again while running */
	unsigned gen; /* bumped by ckpt_bg_upload_stale */
	int valid; /* the object holds the file's current bytes */
	int sent; /* an object exists under its key */
};

struct ckpt_bg_upload {
	ckpt_store *s;
	char *local, *prefix;
	pthread_mutex_t mu;
	pthread_cond_t cond; /* work queued, a job ended, or closing */
	struct bgfile *files;
	size_t nfiles, cap;
	unsigned running;
	int closed; /* no new work is taken; workers exit when idle */
	int aborting; /* in-flight uploads stop between parts */
	int rc; /* first upload error since the last drain */
	pthread_t th[64];
	unsigned nth;
};

/* One file as one object: a PUT, or a multipart upload of UPLOAD_PART parts
 * sent one after the other from buf. */
static int bg_send(struct ckpt_bg_upload *u, const char *rel, void *buf)
{
	char path[4096];
	if ((size_t)snprintf(path, sizeof(path), "%s/%s", u->local, rel) >= sizeof(path))
		return -ENAMETOOLONG;
	char *key = ckpt_store_join(u->prefix, rel);
	if (!key)
		return -ENOMEM;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	int rc = fd < 0 ? -errno : 0;
	struct stat st;
	if (!rc && fstat(fd, &st) != 0)
		rc = -errno;
	uint64_t size = rc ? 0 : (uint64_t)st.st_size;
	if (!rc && size <= UPLOAD_PART) {
		rc = ckpt_pread_all(fd, buf, (size_t)size, 0);
		if (!rc)
			rc = ckpt_store_put(u->s, key, buf, (size_t)size, 0);
	} else if (!rc) {
		uint64_t parts = (size + UPLOAD_PART - 1) / UPLOAD_PART;
		ckpt_upload *up = NULL;
		rc = parts > CKPT_UPLOAD_MAX_PARTS ? -EFBIG : ckpt_upload_begin(u->s, key, &up);
		for (unsigned p = 1; !rc && p <= parts; p++) {
			uint64_t off = (uint64_t)(p - 1) * UPLOAD_PART;
			size_t len = (size_t)(size - off < UPLOAD_PART ? size - off : UPLOAD_PART);
			pthread_mutex_lock(&u->mu);
			rc = u->aborting ? -ECANCELED : 0;
			pthread_mutex_unlock(&u->mu);
			if (!rc)
				rc = ckpt_pread_all(fd, buf, len, off);
			if (!rc)
				rc = ckpt_upload_part(up, p, buf, len);
		}
		if (up) {
			if (rc)
				ckpt_upload_abort(up);
			else
				rc = ckpt_upload_complete(up);
		}
	}
	if (fd >= 0)
		close(fd);
	if (rc && rc != -ECANCELED)
		ckpt_log(CKPT_LOG_ERR, "%s/%s: upload of %s failed: %s", u->s->root, u->prefix, rel,
			 strerror(-rc));
	free(key);
	return rc;
}

static void *bg_worker(void *arg)
{
	struct ckpt_bg_upload *u = arg;
	void *buf = NULL;
	pthread_mutex_lock(&u->mu);
	for (;;) {
		struct bgfile *f = NULL;
		size_t i;
		if (!u->aborting)
			for (i = 0; i < u->nfiles && !f; i++)
				if (u->files[i].state == BG_QUEUED)
					f = &u->files[i];
		if (!f) {
			if (u->closed)
				break;
			pthread_cond_wait(&u->cond, &u->mu);
			continue;
		}
		i--;
		f->state = BG_RUNNING;
		f->again = 0;
		unsigned gen = f->gen;
		u->running++;
		char *rel = strdup(f->rel);
		pthread_mutex_unlock(&u->mu);
		if (!buf)
			buf = malloc(UPLOAD_PART);
		int rc = !buf || !rel ? -ENOMEM : bg_send(u, rel, buf);
		free(rel);
		pthread_mutex_lock(&u->mu);
		f = &u->files[i]; /* files may have moved */
		u->running--;
		f->state = f->again ? BG_QUEUED : BG_IDLE;
		if (!rc)
			f->sent = 1;
		if (f->gen == gen) { /* unchanged meanwhile: the outcome counts */
			f->valid = !rc;
			if (rc && rc != -ECANCELED && !u->rc)
				u->rc = rc;
		}
		pthread_cond_broadcast(&u->cond);
	}
	pthread_mutex_unlock(&u->mu);
	free(buf);
	return NULL;
}

int ckpt_bg_upload_new(ckpt_store *s, const char *local_dir, const char *prefix, unsigned threads,
		       ckpt_bg_upload **out)
{
	struct ckpt_bg_upload *u = calloc(1, sizeof(*u));
	if (!u)
		return -ENOMEM;
	u->s = s;
	u->local = strdup(local_dir);
	u->prefix = strdup(prefix);
	pthread_mutex_init(&u->mu, NULL);
	pthread_cond_init(&u->cond, NULL);
	unsigned conns = ckpt_store_connections(s);
	if (threads > conns)
		threads = conns;
	if (threads < 1)
		threads = 1;
	if (threads > 64)
		threads = 64;
	int rc = u->local && u->prefix ? 0 : -ENOMEM;
	for (; !rc && u->nth < threads; u->nth++)
		if (pthread_create(&u->th[u->nth], NULL, bg_worker, u) != 0)
			break;
	if (!rc && u->nth == 0)
		rc = -EAGAIN;
	if (rc) {
		ckpt_bg_upload_free(u, 0);
		return rc;
	}
	*out = u;
	return 0;
}

static struct bgfile *bg_find(struct ckpt_bg_upload *u, const char *rel)
{
	for (size_t i = 0; i < u->nfiles; i++)
		if (!strcmp(u->files[i].rel, rel))
			return &u->files[i];
	return NULL;
}

int ckpt_bg_upload_file(ckpt_bg_upload *u, const char *rel)
{
	int rc = 0;
	pthread_mutex_lock(&u->mu);
	struct bgfile *f = bg_find(u, rel);
	if (u->closed) {
		/* sent at commit */
	} else if (f) {
		f->valid = 0;
		if (f->state == BG_RUNNING)
			f->again = 1;
		else
			f->state = BG_QUEUED;
	} else if (u->nfiles == u->cap && !(f = realloc(u->files, (u->cap ? 2 * u->cap : 64) * sizeof(*f)))) {
		rc = -ENOMEM;
	} else {
		if (u->nfiles == u->cap) {
			u->files = f;
			u->cap = u->cap ? 2 * u->cap : 64;
		}
		f = &u->files[u->nfiles];
		memset(f, 0, sizeof(*f));
		f->rel = strdup(rel);
		if (!f->rel) {
			rc = -ENOMEM;
		} else {
			f->state = BG_QUEUED;
			u->nfiles++;
		}
	}
	pthread_cond_broadcast(&u->cond);
	pthread_mutex_unlock(&u->mu);
	return rc;
}

void ckpt_bg_upload_stale(ckpt_bg_upload *u, const char *rel)
{
	pthread_mutex_lock(&u->mu);
	struct bgfile *f = bg_find(u, rel);
	if (f) {
		f->gen++;
		f->valid = 0;
	}
	pthread_mutex_unlock(&u->mu);
}

/* Under u->mu: take back every object sent (best effort). */
static void bg_delete_sent_locked(struct ckpt_bg_upload *u)
{
	for (size_t i = 0; i < u->nfiles; i++) {
		struct bgfile *f = &u->files[i];
		char *key = f->sent ? ckpt_store_join(u->prefix, f->rel) : NULL;
		if (key && ckpt_store_delete(u->s, key) != 0)
			ckpt_log(CKPT_LOG_WARN, "%s/%s: left behind by a failed or aborted save", u->s->root,
				 key);
		free(key);
		f->sent = f->valid = 0;
	}
}

int ckpt_bg_upload_drain(ckpt_bg_upload *u)
{
	pthread_mutex_lock(&u->mu);
	u->closed = 1;
	pthread_cond_broadcast(&u->cond);
	for (;;) {
		int busy = u->running > 0;
		for (size_t i = 0; i < u->nfiles && !busy; i++)
			busy = u->files[i].state != BG_IDLE;
		if (!busy)
			break;
		pthread_cond_wait(&u->cond, &u->mu);
	}
	int rc = u->rc;
	u->rc = 0;
	if (rc) /* a failed save leaves nothing behind; a retried commit sends everything */
		bg_delete_sent_locked(u);
	pthread_mutex_unlock(&u->mu);
	return rc ? -EIO : 0;
}

int ckpt_bg_upload_done(ckpt_bg_upload *u, const char *rel)
{
	pthread_mutex_lock(&u->mu);
	struct bgfile *f = bg_find(u, rel);
	int r = f && f->valid && f->state == BG_IDLE ? 1 : f && f->sent ? 2 : 0;
	pthread_mutex_unlock(&u->mu);
	return r;
}

void ckpt_bg_upload_free(ckpt_bg_upload *u, int delete_sent)
{
	if (!u)
		return;
	pthread_mutex_lock(&u->mu);
	u->closed = 1;
	u->aborting |= delete_sent;
	pthread_cond_broadcast(&u->cond);
	pthread_mutex_unlock(&u->mu);
	for (unsigned i = 0; i < u->nth; i++)
		pthread_join(u->th[i], NULL);
	if (delete_sent)
		bg_delete_sent_locked(u); /* no other thread left */
	for (size_t i = 0; i < u->nfiles; i++)
		free(u->files[i].rel);
	free(u->files);
	free(u->local);
	free(u->prefix);
	pthread_cond_destroy(&u->cond);
	pthread_mutex_destroy(&u->mu);
	free(u);
}
