/* writer.c - pending steps: declarations, chunk buffers under a memory
 * budget, spilling, writes and read-back.  Compression threads live in
 * writer_zpool.c, the commit in writer_commit.c, shapes in writer_geom.c. */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <zstd.h>

#include "stats.h"
#include "writer_int.h"

#define SPILL_NONE 0 /* chunks[].spill_off stores offset + 1 */

struct wbuf {
	struct wbuf *next;
	uint64_t size;
	uint8_t *p;
};

void ckpt_writer_opts_init(ckpt_writer_opts *o)
{
	o->zstd_level = 1;
	o->mem_budget = (uint64_t)512 << 20;
	o->threads = 2;
	o->chunk_bytes = (uint64_t)4 << 20;
	o->shard_bytes = (uint64_t)1 << 30;
}

int64_t w_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int w_pwrite_all(int fd, const void *buf, size_t len, uint64_t off)
{
	const uint8_t *p = buf;
	while (len) {
		ssize_t n = pwrite(fd, p, len, (off_t)off);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -EIO;
		p += n;
		len -= (size_t)n;
		off += (uint64_t)n;
	}
	return 0;
}

int w_pread_all(int fd, void *buf, size_t len, uint64_t off)
{
	uint8_t *p = buf;
	while (len) {
		ssize_t n = pread(fd, p, len, (off_t)off);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -EIO; /* short file */
		p += n;
		len -= (size_t)n;
		off += (uint64_t)n;
	}
	return 0;
}

/* One path component we are willing to create. */
int w_name_ok(const char *s)
{
	size_t n = s ? strlen(s) : 0;
	if (n == 0 || n > 255 || strchr(s, '/') || strcmp(s, ".") == 0 || strcmp(s, "..") == 0)
		return 0;
	return strstr(s, W_TMP_SUFFIX) == NULL && strstr(s, ".partial_save") == NULL;
}

/* ---- hash of pytree nodes and param names ----
 * Keys: 'N' item \0 (type key \0)*  -> node (interior or leaf)
 *       'P' item \0 name             -> param name taken */
struct hent {
	struct hent *next;
	uint64_t h;
	size_t klen;
	int leaf;
	int child_type;
	struct ckpt_warray *arr;
	char key[];
};

struct whash {
	struct hent **b;
	size_t nb, n;
};

static uint64_t hash_bytes(const char *k, size_t n)
{
	uint64_t h = 1469598103934665603ULL;
	for (size_t i = 0; i < n; i++)
		h = (h ^ (uint8_t)k[i]) * 1099511628211ULL;
	return h;
}

static struct hent *hash_find(struct whash *t, const char *k, size_t n)
{
	uint64_t h = hash_bytes(k, n);
	for (struct hent *e = t->b[h & (t->nb - 1)]; e; e = e->next)
		if (e->h == h && e->klen == n && memcmp(e->key, k, n) == 0)
			return e;
	return NULL;
}

static struct hent *hash_add(struct whash *t, const char *k, size_t n)
{
	if (t->n >= t->nb) {
		size_t nb = t->nb * 2;
		struct hent **b = calloc(nb, sizeof(*b));
		if (!b)
			return NULL;
		for (size_t i = 0; i < t->nb; i++)
			for (struct hent *e = t->b[i], *nx; e; e = nx) {
				nx = e->next;
				e->next = b[e->h & (nb - 1)];
				b[e->h & (nb - 1)] = e;
			}
		free(t->b);
		t->b = b;
		t->nb = nb;
	}
	struct hent *e = calloc(1, sizeof(*e) + n);
	if (!e)
		return NULL;
	e->h = hash_bytes(k, n);
	e->klen = n;
	memcpy(e->key, k, n);
	e->next = t->b[e->h & (t->nb - 1)];
	t->b[e->h & (t->nb - 1)] = e;
	t->n++;
	return e;
}

static void hash_free(struct whash *t)
{
	if (!t)
		return;
	for (size_t i = 0; t->b && i < t->nb; i++)
		for (struct hent *e = t->b[i], *nx; e; e = nx) {
			nx = e->next;
			free(e);
		}
	free(t->b);
	free(t);
}

/* ---- removing folders ---- */

static int rmtree_at(int dfd, const char *name, int depth)
{
	if (depth > 64)
		return -ELOOP;
	int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOTDIR || errno == ELOOP)
			return unlinkat(dfd, name, 0) ? -errno : 0;
		return errno == ENOENT ? 0 : -errno;
	}
	DIR *d = fdopendir(fd);
	if (!d) {
		close(fd);
		return -errno;
	}
	int rc = 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		int r;
		if (de->d_type == DT_DIR || de->d_type == DT_UNKNOWN)
			r = rmtree_at(dirfd(d), de->d_name, depth + 1);
		else
			r = unlinkat(dirfd(d), de->d_name, 0) ? -errno : 0;
		if (r && !rc)
			rc = r;
	}
	closedir(d);
	if (unlinkat(dfd, name, AT_REMOVEDIR) && !rc && errno != ENOENT)
		rc = -errno;
	return rc;
}

/* ---- steps ---- */

int ckpt_step_begin(const char *root_dir, const char *step_name, const ckpt_writer_opts *opts,
		    ckpt_step **out)
{
	ckpt_writer_opts o;
	*out = NULL;
	if (opts)
		o = *opts;
	else
		ckpt_writer_opts_init(&o);
	if (!root_dir || !w_name_ok(step_name) || strlen(step_name) > 200) {
		ckpt_log(CKPT_LOG_ERR, "writer: bad step name '%s'", step_name ? step_name : "(null)");
		return -EINVAL;
	}
	if (o.threads < 1 || o.threads > 64 || o.chunk_bytes < 1 || o.shard_bytes < 1 || o.mem_budget < 1 ||
	    o.zstd_level < ZSTD_minCLevel() || o.zstd_level > ZSTD_maxCLevel()) {
		ckpt_log(CKPT_LOG_ERR, "writer: step %s: bad writer options", step_name);
		return -EINVAL;
	}
	struct ckpt_step *st = calloc(1, sizeof(*st));
	if (!st)
		return -ENOMEM;
	st->opts = o;
	st->rootfd = st->dirfd = st->spill_fd = -1;
	pthread_mutex_init(&st->decl_mu, NULL);
	pthread_mutex_init(&st->mu, NULL);
	pthread_cond_init(&st->memcond, NULL);
	pthread_cond_init(&st->qcond, NULL);
	pthread_cond_init(&st->idlecond, NULL);
	int rc = -ENOMEM;
	st->root = strdup(root_dir);
	st->name = strdup(step_name);
	st->nodes = calloc(1, sizeof(*st->nodes));
	if (!st->root || !st->name || !st->nodes)
		goto fail;
	st->nodes->nb = 64;
	st->nodes->b = calloc(64, sizeof(struct hent *));
	if (!st->nodes->b || asprintf(&st->tmpname, "%s%s", step_name, W_TMP_SUFFIX) < 0 ||
	    asprintf(&st->tmppath, "%s/%s", root_dir, st->tmpname) < 0) {
		st->tmpname = st->tmppath = NULL;
		goto fail;
	}
	st->rootfd = open(root_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (st->rootfd < 0) {
		rc = -errno;
		ckpt_log(CKPT_LOG_ERR, "writer: step %s: cannot open root %s: %s", step_name, root_dir,
			 strerror(errno));
		goto fail;
	}
	struct stat sb;
	if (fstatat(st->rootfd, step_name, &sb, AT_SYMLINK_NOFOLLOW) == 0) {
		rc = -EEXIST;
		ckpt_log(CKPT_LOG_ERR, "writer: step %s already exists in %s", step_name, root_dir);
		goto fail;
	}
	/* A tmp folder nobody holds the lock of was left by a crash. */
	int old = openat(st->rootfd, st->tmpname, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (old >= 0) {
		if (flock(old, LOCK_EX | LOCK_NB)) {
			close(old);
			rc = -EBUSY;
			ckpt_log(CKPT_LOG_ERR, "writer: step %s: %s is in use by a pending save", step_name,
				 st->tmppath);
			goto fail;
		}
		ckpt_log(CKPT_LOG_WARN, "writer: removing stale %s", st->tmppath);
		rc = rmtree_at(st->rootfd, st->tmpname, 0);
		close(old);
		if (rc) {
			ckpt_log(CKPT_LOG_ERR, "writer: step %s: cannot remove stale %s: %s", step_name,
				 st->tmppath, strerror(-rc));
			goto fail;
		}
	}
	if (mkdirat(st->rootfd, st->tmpname, 0755)) {
		rc = errno == EEXIST ? -EBUSY : -errno;
		ckpt_log(CKPT_LOG_ERR, "writer: step %s: mkdir %s: %s", step_name, st->tmppath, strerror(errno));
		goto fail;
	}
	st->dirfd = openat(st->rootfd, st->tmpname, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (st->dirfd < 0 || flock(st->dirfd, LOCK_EX | LOCK_NB)) {
		rc = -errno;
		ckpt_log(CKPT_LOG_ERR, "writer: step %s: cannot lock %s: %s", step_name, st->tmppath,
			 strerror(errno));
		goto fail;
	}
	st->init_ns = w_now_ns();
	rc = w_write_ckpt_metadata(st, 0);
	if (rc)
		goto fail_dir;
	rc = w_zpool_start(st);
	if (rc) {
		ckpt_log(CKPT_LOG_ERR, "writer: step %s: cannot start compression threads", step_name);
		goto fail_dir;
	}
	*out = st;
	return 0;
fail_dir:
	rmtree_at(st->rootfd, st->tmpname, 0);
fail:
	if (st->dirfd >= 0)
		close(st->dirfd);
	if (st->rootfd >= 0)
		close(st->rootfd);
	hash_free(st->nodes);
	free(st->root);
	free(st->name);
	free(st->tmpname);
	free(st->tmppath);
	pthread_mutex_destroy(&st->decl_mu);
	pthread_mutex_destroy(&st->mu);
	pthread_cond_destroy(&st->memcond);
	pthread_cond_destroy(&st->qcond);
	pthread_cond_destroy(&st->idlecond);
	free(st);
	return rc;
}

static int item_name_ok(const char *item)
{
	return w_name_ok(item) && strcmp(item, "_CHECKPOINT_METADATA") != 0 &&
	       strcmp(item, "commit_success.txt") != 0 && strcmp(item, "orbax.checkpoint") != 0;
}

/* Under decl_mu. */
static struct witem *item_get(struct ckpt_step *st, const char *item, int create, int *rc)
{
	for (struct witem *it = st->items; it; it = it->next)
		if (strcmp(it->name, item) == 0)
			return it;
	if (!create)
		return NULL;
	struct witem *it = calloc(1, sizeof(*it));
	if (!it || !(it->name = strdup(item))) {
		free(it);
		*rc = -ENOMEM;
		return NULL;
	}
	if (mkdirat(st->dirfd, item, 0755) && errno != EEXIST) {
		*rc = -errno;
		ckpt_log(CKPT_LOG_ERR, "writer: step %s: mkdir %s: %s", st->name, item, strerror(errno));
		free(it->name);
		free(it);
		return NULL;
	}
	/* The item's root node (child_type of its top level). */
	size_t n = strlen(item) + 2;
	char *k = malloc(n);
	struct hent *e = NULL;
	if (k) {
		k[0] = 'N';
		memcpy(k + 1, item, n - 1);
		e = hash_add(st->nodes, k, n);
		free(k);
	}
	if (!e) {
		free(it->name);
		free(it);
		*rc = -ENOMEM;
		return NULL;
	}
	if (st->items_last)
		st->items_last->next = it;
	else
		st->items = it;
	st->items_last = it;
	return it;
}

static int step_writable(struct ckpt_step *st, const char *what)
{
	if (st->state == CKPT_STEP_PENDING)
		return 0;
	ckpt_log(CKPT_LOG_ERR, "writer: step %s: %s: step already %s", st->name, what,
		 st->state == CKPT_STEP_COMMITTED ? "committed" : "aborted");
	return -EROFS;
}

int ckpt_step_add_item(ckpt_step *st, const char *item)
{
	int rc = 0;
	if (!item_name_ok(item)) {
		ckpt_log(CKPT_LOG_ERR, "writer: step %s: bad item name '%s'", st->name, item ? item : "(null)");
		return -EINVAL;
	}
	pthread_mutex_lock(&st->decl_mu);
	rc = step_writable(st, item);
	if (!rc)
		item_get(st, item, 1, &rc);
	pthread_mutex_unlock(&st->decl_mu);
	return rc;
}

static int param_name_ok(const char *name)
{
	static const char *const reserved[] = {"_METADATA",     "_sharding",       "_strings.json",
					       "commit_success.txt", "array_metadatas", "manifest.ocdbt",
					       "_CHECKPOINT_METADATA"};
	if (!w_name_ok(name) || strncmp(name, "ocdbt.process_", 14) == 0)
		return 0;
	for (size_t i = 0; i < sizeof(reserved) / sizeof(reserved[0]); i++)
		if (strcmp(name, reserved[i]) == 0)
			return 0;
	return 1;
}

static int seq_key_ok(const char *k)
{
	if (!k[0] || (k[0] == '0' && k[1]) || strlen(k) > 19)
		return 0;
	for (const char *p = k; *p; p++)
		if (*p < '0' || *p > '9')
			return 0;
	return 1;
}

static void warray_free(struct ckpt_warray *a)
{
	if (!a)
		return;
	if (a->keys)
		for (int i = 0; i < a->depth; i++)
			free(a->keys[i]);
	free(a->keys);
	free(a->ktypes);
	free(a->name);
	free(a->relpath);
	free(a->sharding);
	if (a->shards)
		for (uint64_t i = 0; i < a->nshards; i++)
			pthread_mutex_destroy(&a->shards[i].mu);
	free(a->shards);
	free(a->chunks);
	pthread_mutex_destroy(&a->mu);
	pthread_cond_destroy(&a->cond);
	free(a);
}

/* Build 'N' item \0 (type key \0) for the first `levels` levels. */
static char *node_key(const char *item, const char *const *keys, const int *kt, int levels, size_t *len)
{
	size_t n = 1 + strlen(item) + 1;
	for (int i = 0; i < levels; i++)
		n += 1 + strlen(keys[i]) + 1;
	char *k = malloc(n), *p = k;
	if (!k)
		return NULL;
	*p++ = 'N';
	p = stpcpy(p, item) + 1;
	for (int i = 0; i < levels; i++) {
		*p++ = (char)('0' + kt[i]);
		p = stpcpy(p, keys[i]) + 1;
	}
	*len = n;
	return k;
}

static int same_decl(const struct ckpt_warray *a, ckpt_dtype dt, int rank, const uint64_t *shape)
{
	if (a->dtype != dt || a->rank != rank)
		return 0;
	for (int d = 0; d < rank; d++)
		if (a->shape[d] != shape[d])
			return 0;
	return 1;
}

int ckpt_step_add_array(ckpt_step *st, const char *item, const char *const *keypath, const int *key_types,
			int depth, ckpt_dtype dtype, int rank, const uint64_t *shape, ckpt_warray **out)
{
	const ckpt_dtype_info *di = ckpt_dtype_get(dtype);
	*out = NULL;
	if (!item_name_ok(item)) {
		ckpt_log(CKPT_LOG_ERR, "writer: step %s: bad item name '%s'", st->name, item ? item : "(null)");
		return -EINVAL;
	}
	if (depth < 1 || depth > 256 || !keypath || !key_types) {
		ckpt_log(CKPT_LOG_ERR, "writer: %s: an array needs a key path of 1..256 keys", item);
		return -EINVAL;
	}
	/* The param name, for messages and the folder. */
	size_t nlen = 0;
	for (int i = 0; i < depth; i++) {
		if (!keypath[i] || strchr(keypath[i], '/') || (key_types[i] != 1 && key_types[i] != 2) ||
		    (key_types[i] == 1 && !seq_key_ok(keypath[i]))) {
			ckpt_log(CKPT_LOG_ERR, "writer: %s: key %d ('%s') of the key path is invalid", item, i,
				 keypath[i] ? keypath[i] : "(null)");
			return -EINVAL;
		}
		nlen += strlen(keypath[i]) + 1;
	}
	char *name = malloc(nlen);
	if (!name)
		return -ENOMEM;
	char *p = name;
	for (int i = 0; i < depth; i++) {
		if (i)
			*p++ = '.';
		p = stpcpy(p, keypath[i]);
	}
	int rc = 0;
	if (!param_name_ok(name)) {
		ckpt_log(CKPT_LOG_ERR, "writer: %s/%s: not usable as an array name", item, name);
		free(name);
		return -EINVAL;
	}
	if (!di || rank < 0 || rank > CKPT_MAX_RANK || (rank && !shape)) {
		ckpt_log(CKPT_LOG_ERR, "writer: %s/%s: bad dtype or rank", item, name);
		free(name);
		return -EINVAL;
	}

	pthread_mutex_lock(&st->decl_mu);
	struct ckpt_warray *a = NULL;
	char *k = NULL;
	size_t klen;
	if ((rc = step_writable(st, name)))
		goto out;
	struct witem *it = item_get(st, item, 1, &rc);
	if (!it)
		goto out;
	rc = -ENOMEM;
	if (!(k = node_key(item, keypath, key_types, depth, &klen)))
		goto out;
	struct hent *e = hash_find(st->nodes, k, klen);
	if (e && e->leaf) {
		if (same_decl(e->arr, dtype, rank, shape)) {
			*out = e->arr;
			rc = 0;
		} else {
			ckpt_log(CKPT_LOG_ERR, "writer: %s/%s: declared again with a different dtype or shape", item,
				 name);
			rc = -EINVAL;
		}
		goto out;
	}
	if (e) {
		ckpt_log(CKPT_LOG_ERR, "writer: %s/%s: is a pytree node holding other arrays", item, name);
		rc = -EINVAL;
		goto out;
	}
	/* Every ancestor must be an interior node whose children use this
	 * level's key type. */
	for (int lv = 0; lv < depth; lv++) {
		size_t pl;
		char *pk = node_key(item, keypath, key_types, lv, &pl);
		if (!pk)
			goto out;
		struct hent *pe = hash_find(st->nodes, pk, pl);
		free(pk);
		if (pe && pe->leaf) {
			ckpt_log(CKPT_LOG_ERR, "writer: %s/%s: an ancestor (%d keys) is an array", item, name, lv);
			rc = -EINVAL;
			goto out;
		}
		if (pe && pe->child_type && pe->child_type != key_types[lv]) {
			ckpt_log(CKPT_LOG_ERR, "writer: %s/%s: key '%s' mixes sequence and dict keys in one node",
				 item, name, keypath[lv]);
			rc = -EINVAL;
			goto out;
		}
	}
	size_t plen = 1 + strlen(item) + 1 + strlen(name);
	char *pn = malloc(plen + 1); /* strcpy adds a NUL not in the key */
	if (!pn)
		goto out;
	pn[0] = 'P';
	strcpy(stpcpy(pn + 1, item) + 1, name);
	struct hent *ne = hash_find(st->nodes, pn, plen);
	if (ne) {
		free(pn);
		ckpt_log(CKPT_LOG_ERR, "writer: %s/%s: another key path has the same name", item, name);
		rc = -EINVAL;
		goto out;
	}

	a = calloc(1, sizeof(*a));
	if (!a) {
		free(pn);
		goto out;
	}
	pthread_mutex_init(&a->mu, NULL);
	pthread_cond_init(&a->cond, NULL);
	a->step = st;
	a->item = it;
	a->name = name;
	name = NULL;
	a->dtype = dtype;
	a->isz = di->itemsize;
	a->rank = rank;
	a->depth = depth;
	for (int d = 0; d < rank; d++)
		a->shape[d] = shape[d];
	rc = w_geom_init(a, st->opts.chunk_bytes, st->opts.shard_bytes);
	if (rc) {
		ckpt_log(CKPT_LOG_ERR, "writer: %s/%s: array too large (%s)", item, a->name,
			 rc == -EFBIG ? "too many chunks or bytes" : "overflow");
		free(pn);
		goto out_free;
	}
	rc = -ENOMEM;
	a->keys = calloc((size_t)depth, sizeof(char *));
	a->ktypes = malloc((size_t)depth * sizeof(int));
	a->chunks = a->nchunks ? calloc(a->nchunks, sizeof(struct wchunk)) : NULL;
	a->shards = a->nshards ? calloc(a->nshards, sizeof(struct wshard)) : NULL;
	if (!a->keys || !a->ktypes || (a->nchunks && !a->chunks) || (a->nshards && !a->shards) ||
	    asprintf(&a->relpath, "%s/%s", item, a->name) < 0) {
		a->relpath = NULL;
		free(pn);
		goto out_free;
	}
	for (int i = 0; i < depth; i++) {
		a->ktypes[i] = key_types[i];
		if (!(a->keys[i] = strdup(keypath[i]))) {
			free(pn);
			goto out_free;
		}
	}
	for (uint64_t i = 0; i < a->nshards; i++)
		pthread_mutex_init(&a->shards[i].mu, NULL);
	for (uint64_t i = 0; i < a->nchunks; i++)
		a->shards[w_chunk_shard(a, i)].unstored++;
	if (mkdirat(st->dirfd, a->relpath, 0755) && errno != EEXIST) {
		rc = -errno;
		ckpt_log(CKPT_LOG_ERR, "writer: %s: mkdir: %s", a->relpath, strerror(errno));
		free(pn);
		goto out_free;
	}
	/* Register: ancestors, leaf, name.  Allocation failures after the
	 * first insert leave harmless interior entries behind. */
	for (int lv = 0; lv < depth; lv++) {
		size_t pl;
		char *pk = node_key(item, keypath, key_types, lv, &pl);
		struct hent *pe = pk ? hash_find(st->nodes, pk, pl) : NULL;
		if (pk && !pe)
			pe = hash_add(st->nodes, pk, pl);
		free(pk);
		if (!pe) {
			free(pn);
			goto out_free;
		}
		pe->child_type = key_types[lv];
	}
	struct hent *le = hash_add(st->nodes, k, klen);
	struct hent *pne = le ? hash_add(st->nodes, pn, plen) : NULL;
	free(pn);
	if (!pne) {
		if (le)
			le->leaf = 0; /* becomes a dangling interior node: still consistent */
		goto out_free;
	}
	le->leaf = 1;
	le->arr = a;
	pne->leaf = 2;
	pne->arr = a;
	if (it->last)
		it->last->next = a;
	else
		it->first = a;
	it->last = a;
	it->narrays++;
	st->narrays++;
	st->bytes_declared += a->nbytes;
	*out = a;
	rc = 0;
	goto out;
out_free:
	warray_free(a);
out:
	pthread_mutex_unlock(&st->decl_mu);
	free(k);
	free(name);
	return rc;
}

int ckpt_warray_set_sharding(ckpt_warray *a, const char *json)
{
	char *copy = NULL;
	if (json) {
		cJSON *j = strlen(json) <= (1u << 20) ? cJSON_Parse(json) : NULL;
		if (!j) {
			ckpt_log(CKPT_LOG_ERR, "writer: %s: sharding is not valid JSON (or over 1 MiB)", a->relpath);
			return -EINVAL;
		}
		cJSON_Delete(j);
		if (!(copy = strdup(json)))
			return -ENOMEM;
	}
	pthread_mutex_lock(&a->mu);
	free(a->sharding);
	a->sharding = copy;
	pthread_mutex_unlock(&a->mu);
	return 0;
}

/* ---- memory ---- */

void w_lru_remove_locked(struct ckpt_step *st, struct wlive *l)
{
	if (!l->in_lru)
		return;
	if (l->lru_prev)
		l->lru_prev->lru_next = l->lru_next;
	else
		st->lru_head = l->lru_next;
	if (l->lru_next)
		l->lru_next->lru_prev = l->lru_prev;
	else
		st->lru_tail = l->lru_prev;
	l->lru_prev = l->lru_next = NULL;
	l->in_lru = 0;
}

static void lru_add_locked(struct ckpt_step *st, struct wlive *l)
{
	if (l->in_lru)
		return;
	l->lru_next = NULL;
	l->lru_prev = st->lru_tail;
	if (st->lru_tail)
		st->lru_tail->lru_next = l;
	else
		st->lru_head = l;
	st->lru_tail = l;
	l->in_lru = 1;
}

static int spill(struct ckpt_step *st, struct ckpt_warray *a, uint64_t idx);

/* Charge `cost` bytes for a live chunk whose buffer has `size` bytes and
 * return a zeroed buffer.  Waits for compression, spills partial chunks,
 * and exceeds the budget only when nothing else can free memory.  Called
 * with no lock held. */
static int mem_acquire(struct ckpt_step *st, uint64_t cost, uint64_t size, uint8_t **out)
{
	uint8_t *buf = NULL;
	int rc = 0;
	pthread_mutex_lock(&st->mu);
	for (struct wbuf **pp = &st->cache; *pp; pp = &(*pp)->next) {
		if ((*pp)->size == size) {
			struct wbuf *b = *pp;
			*pp = b->next;
			buf = b->p;
			free(b);
			st->cached_bytes -= size;
			st->ncached--;
			st->mem_used -= size;
			break;
		}
	}
	for (;;) {
		if (st->mem_used + cost <= st->opts.mem_budget || st->mem_used == 0)
			break;
		if (st->cache) {
			struct wbuf *b = st->cache;
			st->cache = b->next;
			st->cached_bytes -= b->size;
			st->ncached--;
			st->mem_used -= b->size;
			free(b->p);
			free(b);
			continue;
		}
		if (st->inflight > 0) {
			pthread_cond_wait(&st->memcond, &st->mu);
			continue;
		}
		if (st->lru_head) {
			/* Only (array, idx) stay valid once st->mu is dropped. */
			struct wlive *v = st->lru_head;
			struct ckpt_warray *va = v->arr;
			uint64_t vidx = v->idx;
			w_lru_remove_locked(st, v);
			pthread_mutex_unlock(&st->mu);
			rc = spill(st, va, vidx);
			pthread_mutex_lock(&st->mu);
			if (rc && rc != -EAGAIN)
				break;
			rc = 0;
			continue;
		}
		if (st->npinned > 0) {
			pthread_cond_wait(&st->memcond, &st->mu);
			continue;
		}
		if (st->io_err) {
			rc = st->io_err;
			break;
		}
		break; /* nothing can be freed: exceed the budget */
	}
	if (!rc)
		st->mem_used += cost;
	pthread_mutex_unlock(&st->mu);
	if (!rc && !buf && !(buf = malloc(size))) {
		rc = -ENOMEM;
		pthread_mutex_lock(&st->mu);
		st->mem_used -= cost;
		pthread_cond_broadcast(&st->memcond);
		pthread_mutex_unlock(&st->mu);
	}
	if (rc) {
		free(buf);
		return rc;
	}
	memset(buf, 0, size);
	*out = buf;
	return 0;
}

static int live_new(struct ckpt_warray *a, uint64_t idx, struct wlive **out)
{
	struct wlive *l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	int rc = mem_acquire(a->step, a->live_cost, a->chunk_nbytes, &l->buf);
	if (rc) {
		free(l);
		if (rc == -ENOMEM)
			ckpt_log(CKPT_LOG_ERR, "writer: %s: out of memory for a chunk buffer", a->relpath);
		else
			ckpt_log(CKPT_LOG_ERR, "writer: %s: no chunk memory can be freed: %s", a->relpath,
				 strerror(-rc));
		return rc;
	}
	pthread_mutex_init(&l->mu, NULL);
	l->arr = a;
	l->idx = idx;
	*out = l;
	return 0;
}

void w_live_free(struct ckpt_step *st, struct wlive *l, int release_mem)
{
	struct ckpt_warray *a = l->arr;
	struct wbuf *b = NULL;
	pthread_mutex_destroy(&l->mu);
	w_cov_free(&l->cov);
	pthread_mutex_lock(&st->mu);
	if (release_mem)
		st->mem_used -= a->live_cost;
	if (release_mem && st->ncached < 64 && st->cached_bytes + a->chunk_nbytes <= st->opts.mem_budget / 4 &&
	    (b = malloc(sizeof(*b)))) {
		b->p = l->buf;
		b->size = a->chunk_nbytes;
		b->next = st->cache;
		st->cache = b;
		st->ncached++;
		st->cached_bytes += b->size;
		st->mem_used += b->size;
		l->buf = NULL;
	}
	pthread_cond_broadcast(&st->memcond);
	pthread_mutex_unlock(&st->mu);
	free(l->buf);
	free(l);
}

static int spill_fd(struct ckpt_step *st)
{
	int fd;
	pthread_mutex_lock(&st->mu);
	if (st->spill_fd < 0) {
		fd = openat(st->dirfd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
		if (fd < 0) {
			fd = openat(st->dirfd, ".ckptfs-spill", O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
			if (fd >= 0)
				unlinkat(st->dirfd, ".ckptfs-spill", 0);
		}
		st->spill_fd = fd < 0 ? -errno : fd;
	}
	fd = st->spill_fd;
	pthread_mutex_unlock(&st->mu);
	return fd;
}

/* Write partial chunk idx of a to its spill slot and free its memory.
 * -EAGAIN when the chunk is no longer a spill candidate. */
static int spill(struct ckpt_step *st, struct ckpt_warray *a, uint64_t idx)
{
	struct wchunk *c = &a->chunks[idx];
	uint64_t slot = (a->chunk_nbytes + a->bm_bytes + 4095) / 4096 * 4096;
	pthread_mutex_lock(&a->mu);
	struct wlive *l = c->live;
	if (!l || c->state != WC_LIVE || c->pins || c->have == w_chunk_need(a, idx)) {
		pthread_mutex_unlock(&a->mu);
		return -EAGAIN;
	}
	c->state = WC_SPILLING;
	pthread_mutex_lock(&st->mu);
	w_lru_remove_locked(st, l); /* may be a newer live than the victim taken */
	st->inflight += a->live_cost;
	if (c->spill_off == SPILL_NONE) {
		c->spill_off = st->spill_end + 1;
		st->spill_end += slot;
	}
	uint64_t off = c->spill_off - 1;
	pthread_mutex_unlock(&st->mu);
	pthread_mutex_unlock(&a->mu);

	int fd = spill_fd(st), rc = fd < 0 ? fd : 0;
	if (!rc)
		rc = w_cov_to_bitmap(&l->cov, a->chunk_nbytes);
	if (!rc)
		rc = w_pwrite_all(fd, l->buf, a->chunk_nbytes, off);
	if (!rc)
		rc = w_pwrite_all(fd, l->cov.bm, a->bm_bytes, off + a->chunk_nbytes);

	pthread_mutex_lock(&a->mu);
	pthread_mutex_lock(&st->mu);
	st->inflight -= a->live_cost;
	if (rc) {
		c->state = WC_LIVE;
		lru_add_locked(st, l);
	} else {
		c->state = WC_SPILLED;
		c->live = NULL;
		st->nspilled++;
		st->spills++;
	}
	pthread_cond_broadcast(&st->memcond);
	pthread_cond_broadcast(&st->idlecond);
	pthread_mutex_unlock(&st->mu);
	pthread_cond_broadcast(&a->cond);
	pthread_mutex_unlock(&a->mu);
	if (rc) {
		ckpt_log(CKPT_LOG_ERR, "writer: %s: spilling a partial chunk failed: %s", a->relpath, strerror(-rc));
		return rc;
	}
	w_live_free(st, l, 1);
	return 0;
}

/* ---- pins ---- */

/* Under a->mu, state has a live buffer. */
static void pin_locked(struct ckpt_step *st, struct wchunk *c)
{
	pthread_mutex_lock(&st->mu);
	if (c->pins++ == 0) {
		w_lru_remove_locked(st, c->live);
		st->npinned++;
	}
	st->pins_total++;
	pthread_mutex_unlock(&st->mu);
}

static void unpin(struct ckpt_warray *a, uint64_t idx, uint64_t added)
{
	struct ckpt_step *st = a->step;
	struct wchunk *c = &a->chunks[idx];
	pthread_mutex_lock(&a->mu);
	c->have += added;
	a->have_total += added;
	c->pins--;
	pthread_mutex_lock(&st->mu);
	st->pins_total--;
	st->bytes_pending += added;
	if (c->pins == 0) {
		st->npinned--;
		if (c->state == WC_LIVE) {
			if (c->have == w_chunk_need(a, idx)) {
				c->state = WC_QUEUED;
				st->inflight += a->live_cost;
				w_queue_push_locked(st, c->live);
			} else {
				lru_add_locked(st, c->live);
			}
		} else if (c->state == WC_QUEUED && !c->live->in_queue) {
			w_queue_push_locked(st, c->live);
		}
		pthread_cond_broadcast(&st->memcond);
	}
	if (st->pins_total == 0)
		pthread_cond_broadcast(&st->idlecond);
	pthread_mutex_unlock(&st->mu);
	pthread_mutex_unlock(&a->mu);
	if (added)
		CKPT_STAT_ADD(bytes_pending, (int64_t)added);
}

int w_stored_load(struct ckpt_warray *a, uint64_t idx, uint64_t off, uint64_t len, uint8_t *dst)
{
	char path[4096];
	int rc = w_shard_path(a, w_chunk_shard(a, idx), path, sizeof(path));
	if (rc < 0)
		return rc;
	uint8_t *z = malloc(len ? len : 1);
	if (!z)
		return -ENOMEM;
	int fd = openat(a->step->dirfd, path, O_RDONLY | O_CLOEXEC);
	rc = fd < 0 ? -errno : w_pread_all(fd, z, len, off);
	if (fd >= 0)
		close(fd);
	if (!rc) {
		size_t n = ZSTD_decompress(dst, a->chunk_nbytes, z, len);
		if (ZSTD_isError(n) || n != a->chunk_nbytes) {
			ckpt_log(CKPT_LOG_ERR, "writer: %s: chunk %llu in %s does not decode: %s", a->relpath,
				 (unsigned long long)idx, path,
				 ZSTD_isError(n) ? ZSTD_getErrorName(n) : "wrong size");
			rc = -EIO;
		}
	} else {
		ckpt_log(CKPT_LOG_ERR, "writer: %s: reading chunk %llu from %s: %s", a->relpath,
			 (unsigned long long)idx, path, strerror(-rc));
	}
	free(z);
	CKPT_STAT_ADD(backing_reads, 1);
	return rc;
}

/* Pin chunk idx for writing, giving it a live buffer (allocating, reloading
 * from the spill file, or decoding from the shard file as needed). */
static int pin_write(struct ckpt_warray *a, uint64_t idx, struct wlive **out)
{
	struct ckpt_step *st = a->step;
	struct wchunk *c = &a->chunks[idx];
	struct wlive *fresh = NULL;
	int rc;
	pthread_mutex_lock(&a->mu);
	for (;;) {
		switch (c->state) {
		case WC_LIVE:
		case WC_QUEUED:
		case WC_ERROR:
			pin_locked(st, c);
			*out = c->live;
			pthread_mutex_unlock(&a->mu);
			if (fresh)
				w_live_free(st, fresh, 1);
			return 0;
		case WC_COMPRESSING:
		case WC_SPILLING:
		case WC_LOADING:
			pthread_cond_wait(&a->cond, &a->mu);
			continue;
		default:
			break;
		}
		if (!fresh) {
			pthread_mutex_unlock(&a->mu);
			rc = live_new(a, idx, &fresh);
			if (rc)
				return rc;
			pthread_mutex_lock(&a->mu);
			continue;
		}
		if (c->state == WC_EMPTY) {
			c->live = fresh;
			c->state = WC_LIVE;
			pin_locked(st, c);
			*out = fresh;
			pthread_mutex_unlock(&a->mu);
			return 0;
		}
		/* SPILLED or STORED: load it. */
		int prev = c->state;
		uint64_t off = c->off, len = c->len, soff = c->spill_off - 1;
		c->state = WC_LOADING;
		c->live = fresh;
		pthread_mutex_lock(&st->mu);
		st->inflight += a->live_cost;
		pthread_mutex_unlock(&st->mu);
		pthread_mutex_unlock(&a->mu);
		if (prev == WC_SPILLED) {
			int fd = spill_fd(st);
			rc = w_cov_to_bitmap(&fresh->cov, a->chunk_nbytes);
			if (!rc)
				rc = fd < 0 ? fd : w_pread_all(fd, fresh->buf, a->chunk_nbytes, soff);
			if (!rc)
				rc = w_pread_all(fd, fresh->cov.bm, a->bm_bytes, soff + a->chunk_nbytes);
			if (rc)
				ckpt_log(CKPT_LOG_ERR, "writer: %s: re-reading a spilled chunk failed: %s", a->relpath,
					 strerror(-rc));
		} else {
			rc = w_stored_load(a, idx, off, len, fresh->buf);
			if (!rc)
				w_cov_fill(&fresh->cov, a->chunk_nbytes);
		}
		pthread_mutex_lock(&a->mu);
		pthread_mutex_lock(&st->mu);
		st->inflight -= a->live_cost;
		pthread_cond_broadcast(&st->memcond);
		pthread_cond_broadcast(&st->idlecond);
		pthread_mutex_unlock(&st->mu);
		pthread_cond_broadcast(&a->cond);
		if (rc) {
			c->state = (uint8_t)prev;
			c->live = NULL;
			pthread_mutex_unlock(&a->mu);
			w_live_free(st, fresh, 1);
			return rc;
		}
		uint64_t need = w_chunk_need(a, idx);
		if (prev == WC_SPILLED) {
			pthread_mutex_lock(&st->mu);
			st->nspilled--;
			pthread_mutex_unlock(&st->mu);
		} else {
			/* A stored chunk is written again: it is pending again. */
			a->nstored--;
			a->shards[w_chunk_shard(a, idx)].unstored++;
			pthread_mutex_lock(&st->mu);
			st->bytes_pending += need;
			pthread_mutex_unlock(&st->mu);
			CKPT_STAT_ADD(bytes_pending, (int64_t)need);
		}
		c->state = WC_LIVE;
		pin_locked(st, c);
		*out = fresh;
		pthread_mutex_unlock(&a->mu);
		return 0;
	}
}

/* ---- writes ---- */

struct wctx {
	struct ckpt_warray *a;
	const uint8_t *src;
	uint8_t *dst;
	const uint8_t *from; /* read: source chunk bytes */
	uint8_t *tmp;        /* read: chunk scratch */
	struct wlive *l;
	uint64_t added;
	int rc;
};

static void span_write(void *ctx, uint64_t coff, uint64_t soff, uint64_t n)
{
	struct wctx *w = ctx;
	memcpy(w->l->buf + coff, w->src + soff, n);
	int64_t r = w_cov_add(&w->l->cov, w->a->chunk_nbytes, coff, coff + n);
	if (r < 0)
		w->rc = (int)r;
	else
		w->added += (uint64_t)r;
}

static int piece_write(void *ctx, const struct wpiece *p)
{
	struct wctx *w = ctx;
	struct wlive *l;
	int rc = pin_write(w->a, p->chunk, &l);
	if (rc)
		return rc;
	pthread_mutex_lock(&l->mu);
	w->l = l;
	w->added = 0;
	w_piece_spans(w->a, p, span_write, w);
	uint64_t added = w->added;
	pthread_mutex_unlock(&l->mu);
	unpin(w->a, p->chunk, added);
	if (w->rc)
		ckpt_log(CKPT_LOG_ERR, "writer: %s: out of memory for a coverage map", w->a->relpath);
	return w->rc;
}

int ckpt_warray_write(ckpt_warray *a, const ckpt_region *region, uint64_t byte_off, const void *data,
		      size_t len)
{
	ckpt_region r;
	uint64_t rbytes, end;
	if (w_region_check(a, region, &r, &rbytes)) {
		ckpt_log(CKPT_LOG_ERR, "writer: %s: write to a region outside the array or of another rank",
			 a->relpath);
		return -EINVAL;
	}
	if (len == 0)
		return 0;
	if (ckpt_add_u64(byte_off, len, &end) || end > rbytes) {
		ckpt_log(CKPT_LOG_ERR, "writer: %s: write of %zu bytes at %llu is past the end (%llu bytes)",
			 a->relpath, len, (unsigned long long)byte_off, (unsigned long long)rbytes);
		return -EFBIG;
	}
	if (a->step->state != CKPT_STEP_PENDING)
		return step_writable(a->step, a->relpath);
	struct wctx w = {.a = a, .src = data};
	int rc = w_pieces(a, &r, byte_off, end, piece_write, &w);
	if (!rc)
		CKPT_STAT_ADD(bytes_written, len);
	return rc;
}

/* ---- reads ---- */

static void span_read(void *ctx, uint64_t coff, uint64_t soff, uint64_t n)
{
	struct wctx *w = ctx;
	if (w->from)
		memcpy(w->dst + soff, w->from + coff, n);
	else
		memset(w->dst + soff, 0, n);
}

static int piece_read(void *ctx, const struct wpiece *p)
{
	struct wctx *w = ctx;
	struct ckpt_warray *a = w->a;
	struct ckpt_step *st = a->step;
	struct wchunk *c = &a->chunks[p->chunk];
	int rc = 0;
	pthread_mutex_lock(&a->mu);
	while (c->state == WC_COMPRESSING || c->state == WC_SPILLING || c->state == WC_LOADING)
		pthread_cond_wait(&a->cond, &a->mu);
	int state = c->state;
	uint64_t off = c->off, len = c->len, soff = c->spill_off - 1;
	struct wlive *l = c->live;
	if (state == WC_LIVE || state == WC_QUEUED || state == WC_ERROR)
		pin_locked(st, c);
	pthread_mutex_unlock(&a->mu);

	if (state == WC_EMPTY) {
		w->from = NULL;
		w_piece_spans(a, p, span_read, w);
		return 0;
	}
	if (state == WC_LIVE || state == WC_QUEUED || state == WC_ERROR) {
		pthread_mutex_lock(&l->mu);
		w->from = l->buf;
		w_piece_spans(a, p, span_read, w);
		pthread_mutex_unlock(&l->mu);
		unpin(a, p->chunk, 0);
		return 0;
	}
	if (!w->tmp && !(w->tmp = malloc(a->chunk_nbytes)))
		return -ENOMEM;
	if (state == WC_STORED) {
		rc = w_stored_load(a, p->chunk, off, len, w->tmp);
	} else { /* SPILLED */
		int fd = spill_fd(st);
		rc = fd < 0 ? fd : w_pread_all(fd, w->tmp, a->chunk_nbytes, soff);
		if (rc)
			ckpt_log(CKPT_LOG_ERR, "writer: %s: reading a spilled chunk failed: %s", a->relpath,
				 strerror(-rc));
	}
	if (rc)
		return rc == -ENOMEM ? rc : -EIO;
	w->from = w->tmp;
	w_piece_spans(a, p, span_read, w);
	return 0;
}

ssize_t ckpt_warray_read(ckpt_warray *a, const ckpt_region *region, uint64_t byte_off, void *dst, size_t len)
{
	ckpt_region r;
	uint64_t rbytes;
	if (w_region_check(a, region, &r, &rbytes)) {
		ckpt_log(CKPT_LOG_ERR, "writer: %s: read of a region outside the array or of another rank",
			 a->relpath);
		return -EINVAL;
	}
	if (byte_off >= rbytes || len == 0)
		return 0;
	if (len > rbytes - byte_off)
		len = (size_t)(rbytes - byte_off);
	if (len > (size_t)SSIZE_MAX)
		len = (size_t)SSIZE_MAX;
	struct wctx w = {.a = a, .dst = dst};
	int rc = w_pieces(a, &r, byte_off, byte_off + len, piece_read, &w);
	free(w.tmp);
	return rc ? rc : (ssize_t)len;
}

/* ---- end of life ---- */

void ckpt_step_abort(ckpt_step *st)
{
	if (!st || st->state == CKPT_STEP_COMMITTED)
		return;
	w_zpool_stop(st);
	if (st->state == CKPT_STEP_PENDING) {
		int rc = rmtree_at(st->rootfd, st->tmpname, 0);
		if (rc)
			ckpt_log(CKPT_LOG_ERR, "writer: step %s: removing %s: %s", st->name, st->tmppath,
				 strerror(-rc));
	}
	st->state = CKPT_STEP_ABORTED;
}

void ckpt_step_destroy(ckpt_step *st)
{
	if (!st)
		return;
	w_zpool_stop(st);
	for (struct witem *it = st->items, *nit; it; it = nit) {
		nit = it->next;
		for (struct ckpt_warray *a = it->first, *na; a; a = na) {
			na = a->next;
			for (uint64_t i = 0; i < a->nchunks; i++) {
				struct wlive *l = a->chunks[i].live;
				if (l) {
					pthread_mutex_destroy(&l->mu);
					w_cov_free(&l->cov);
					free(l->buf);
					free(l);
				}
			}
			warray_free(a);
		}
		free(it->name);
		free(it);
	}
	for (struct wbuf *b = st->cache, *nb; b; b = nb) {
		nb = b->next;
		free(b->p);
		free(b);
	}
	if (st->bytes_pending)
		CKPT_STAT_ADD(bytes_pending, -(int64_t)st->bytes_pending);
	if (st->spill_fd >= 0)
		close(st->spill_fd);
	if (st->dirfd >= 0)
		close(st->dirfd); /* releases the flock */
	if (st->rootfd >= 0)
		close(st->rootfd);
	hash_free(st->nodes);
	free(st->root);
	free(st->name);
	free(st->tmpname);
	free(st->tmppath);
	pthread_mutex_destroy(&st->decl_mu);
	pthread_mutex_destroy(&st->mu);
	pthread_cond_destroy(&st->memcond);
	pthread_cond_destroy(&st->qcond);
	pthread_cond_destroy(&st->idlecond);
	free(st);
}

/* ---- queries ---- */

void ckpt_warray_get_info(ckpt_warray *a, ckpt_warray_info *o)
{
	o->item = a->item->name;
	o->name = a->name;
	o->depth = a->depth;
	o->keys = (const char *const *)a->keys;
	o->key_types = a->ktypes;
	o->dtype = a->dtype;
	o->rank = a->rank;
	o->shape = a->shape;
	o->chunk_shape = a->inner;
	o->shard_shape = a->shard;
	o->nbytes = a->nbytes;
	o->chunks = a->nchunks;
	pthread_mutex_lock(&a->mu);
	o->bytes_written = a->have_total;
	o->stored_bytes = a->stored_bytes;
	o->chunks_stored = a->nstored;
	o->sharding = a->sharding;
	pthread_mutex_unlock(&a->mu);
}

ckpt_warray *ckpt_step_find_array(ckpt_step *st, const char *item, const char *const *keypath, int depth)
{
	ckpt_warray *found = NULL;
	pthread_mutex_lock(&st->decl_mu);
	struct witem *it = item_get(st, item, 0, NULL);
	for (struct ckpt_warray *a = it ? it->first : NULL; a && !found; a = a->next) {
		if (a->depth != depth)
			continue;
		int i = 0;
		while (i < depth && strcmp(a->keys[i], keypath[i]) == 0)
			i++;
		if (i == depth)
			found = a;
	}
	pthread_mutex_unlock(&st->decl_mu);
	return found;
}

int ckpt_step_foreach_item(ckpt_step *st, int (*cb)(void *ctx, const char *item), void *ctx)
{
	int rc = 0;
	pthread_mutex_lock(&st->decl_mu);
	for (struct witem *it = st->items; it && !rc; it = it->next)
		rc = cb(ctx, it->name);
	pthread_mutex_unlock(&st->decl_mu);
	return rc;
}

int ckpt_step_foreach_array(ckpt_step *st, const char *item, int (*cb)(void *ctx, ckpt_warray *a), void *ctx)
{
	int rc = 0;
	pthread_mutex_lock(&st->decl_mu);
	for (struct witem *it = st->items; it && !rc; it = it->next) {
		if (item && strcmp(item, it->name) != 0)
			continue;
		for (struct ckpt_warray *a = it->first; a && !rc; a = a->next)
			rc = cb(ctx, a);
	}
	pthread_mutex_unlock(&st->decl_mu);
	return rc;
}

void ckpt_step_get_info(ckpt_step *st, ckpt_step_info *o)
{
	memset(o, 0, sizeof(*o));
	pthread_mutex_lock(&st->decl_mu);
	o->state = st->state;
	o->name = st->name;
	o->tmp_path = st->tmppath;
	o->arrays = st->narrays;
	o->bytes_declared = st->bytes_declared;
	for (struct witem *it = st->items; it; it = it->next)
		for (struct ckpt_warray *a = it->first; a; a = a->next) {
			pthread_mutex_lock(&a->mu);
			o->bytes_written += a->have_total;
			pthread_mutex_unlock(&a->mu);
		}
	pthread_mutex_unlock(&st->decl_mu);
	pthread_mutex_lock(&st->mu);
	o->bytes_pending = st->bytes_pending;
	o->mem_used = st->mem_used;
	o->spilled_chunks = st->nspilled;
	o->spills = st->spills;
	o->stored_bytes = st->stored_bytes;
	pthread_mutex_unlock(&st->mu);
}
