/*
 * view.c - requests on the mounted tree: node table, lookup (including the
 * hidden companions created on demand), readdir, attributes, reads, xattrs.
 *
 * Locks: alloc_lock (node table appends) and dyn_lock (hidden-name map);
 * dyn_lock may be held while taking alloc_lock, never the reverse.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include "npy.h"
#include "stats.h"
#include "view_internal.h"

/* ---- node table ----------------------------------------------------------- */

static int has_kids(const struct node *n)
{
	return n->type == N_DIR || n->type == N_PSTEP || n->type == N_PDIR;
}

struct node *view_node(ckpt_view *v, ckpt_ino ino)
{
	uint64_t n = atomic_load_explicit(&v->count, memory_order_acquire);
	if (ino == 0 || ino > n)
		return NULL;
	uint64_t i = ino - 1;
	return v->pages[i >> PAGE_BITS][i & ((1u << PAGE_BITS) - 1)];
}

struct node *view_new_node(ckpt_view *v, enum node_type t, const char *name, struct node *parent)
{
	struct node *n = calloc(1, sizeof(*n));
	if (!n)
		return NULL;
	n->name = strdup(name);
	if (!n->name) {
		free(n);
		return NULL;
	}
	n->type = t;
	n->once = (pthread_once_t)PTHREAD_ONCE_INIT;
	atomic_init(&n->st_next, UINT64_MAX);
	n->parent = parent ? parent->ino : CKPT_ROOT_INO;
	n->mtime_ns = parent ? parent->mtime_ns : 0;
	pthread_mutex_lock(&v->alloc_lock);
	uint64_t i = atomic_load_explicit(&v->count, memory_order_relaxed);
	size_t pg = (size_t)(i >> PAGE_BITS);
	if (pg >= NPAGES) {
		pthread_mutex_unlock(&v->alloc_lock);
		free(n->name);
		free(n);
		ckpt_log(CKPT_LOG_ERR, "too many nodes in the view");
		return NULL;
	}
	if (!v->pages[pg]) {
		v->pages[pg] = calloc((size_t)1 << PAGE_BITS, sizeof(struct node *));
		if (!v->pages[pg]) {
			pthread_mutex_unlock(&v->alloc_lock);
			free(n->name);
			free(n);
			return NULL;
		}
	}
	n->ino = i + 1;
	v->pages[pg][i & ((1u << PAGE_BITS) - 1)] = n;
	atomic_store_explicit(&v->count, i + 1, memory_order_release);
	pthread_mutex_unlock(&v->alloc_lock);
	return n;
}

static size_t kid_pos(const struct node *dir, const char *name, int *found)
{
	size_t lo = 0, hi = dir->nkids;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		int c = strcmp(dir->kids[mid]->name, name);
		if (c == 0) {
			*found = 1;
			return mid;
		}
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	*found = 0;
	return lo;
}

/* Kids stay sorted (binary insertion); only layout.c adds kids, before the
 * view is published. */
void view_remove_kid(struct node *dir, struct node *kid)
{
	int found;
	size_t pos = kid_pos(dir, kid->name, &found);
	if (!found || dir->kids[pos] != kid)
		return;
	memmove(dir->kids + pos, dir->kids + pos + 1, (dir->nkids - pos - 1) * sizeof(*dir->kids));
	dir->nkids--;
}

int view_add_kid(struct node *dir, struct node *kid)
{
	int found;
	size_t pos = kid_pos(dir, kid->name, &found);
	if (found)
		return -EEXIST;
	if (dir->nkids == dir->capkids) {
		size_t cap = dir->capkids ? dir->capkids * 2 : 8;
		struct node **k = realloc(dir->kids, cap * sizeof(*k));
		if (!k)
			return -ENOMEM;
		dir->kids = k;
		dir->capkids = cap;
	}
	memmove(dir->kids + pos + 1, dir->kids + pos, (dir->nkids - pos) * sizeof(*dir->kids));
	dir->kids[pos] = kid;
	dir->nkids++;
	return 0;
}

struct node *view_find_kid(struct node *dir, const char *name)
{
	int found;
	size_t pos = kid_pos(dir, name, &found);
	return found ? dir->kids[pos] : NULL;
}

void view_escape_name(const char *key, char *buf, size_t cap)
{
	if (cap == 0)
		return;
	if (!*key) {
		snprintf(buf, cap, "%%");
		return;
	}
	if (!strcmp(key, ".")) {
		snprintf(buf, cap, "%%2E");
		return;
	}
	if (!strcmp(key, "..")) {
		snprintf(buf, cap, "%%2E%%2E");
		return;
	}
	size_t o = 0;
	for (const char *p = key; *p && o + 4 < cap; p++) {
		if (*p == '%' || *p == '/')
			o += (size_t)snprintf(buf + o, cap - o, "%%%02X", (unsigned char)*p);
		else
			buf[o++] = *p;
	}
	buf[o] = 0;
}

int view_init_array_node(struct node *n, struct aref *ar, const ckpt_region *r)
{
	const ckpt_array_meta *m = ckpt_array_meta_of(ar->arr);
	n->ar = ar;
	n->region = *r;
	uint64_t shape[CKPT_MAX_RANK];
	for (int d = 0; d < r->rank; d++)
		shape[d] = r->stop[d] - r->start[d];
	char hdr[CKPT_NPY_HEADER_MAX];
	int h = ckpt_npy_header(m->dtype, r->rank, shape, hdr, sizeof(hdr));
	if (h < 0)
		return h;
	n->hdr = malloc((size_t)h);
	if (!n->hdr)
		return -ENOMEM;
	memcpy(n->hdr, hdr, (size_t)h);
	n->hdrlen = (size_t)h;
	uint64_t count;
	if (ckpt_region_count(r, &count) < 0)
		return -EOVERFLOW;
	n->size = n->hdrlen + count * m->itemsize;
	return 0;
}

/* ---- open / destroy -------------------------------------------------------- */

static void free_node(struct node *n)
{
	free(n->hdr);
	free(n->name);
	free(n->kids);
	free(n->path);
	free(n->content);
	free(n->units);
	if (!n->st_borrowed) {
		free(n->st_arrays);
		ckpt_st_layout_destroy(n->st);
	}
	ckpt_st_sharded_destroy(n->sts);
	free(n);
}

static int dyn_insert(ckpt_view *v, struct node *n);

int ckpt_view_open(const char *source, const ckpt_view_opts *opts, ckpt_view **out)
{
	ckpt_view *v = calloc(1, sizeof(*v));
	if (!v)
		return -ENOMEM;
	if (opts)
		v->opts = *opts;
	pthread_mutex_init(&v->alloc_lock, NULL);
	pthread_mutex_init(&v->dyn_lock, NULL);
	pthread_rwlock_init(&v->ns_lock, NULL);
	v->source = strdup(source);
	int rc = v->source ? ckpt_ctx_create(&v->opts.ctx, &v->ctx) : -ENOMEM;
	if (rc < 0) {
		free(v->source);
		free(v);
		return rc;
	}
	struct node *root = view_new_node(v, N_DIR, "", NULL);
	if (!root) {
		ckpt_view_destroy(v);
		return -ENOMEM;
	}
	rc = layout_build(v, source);
	if (rc < 0) {
		ckpt_view_destroy(v);
		return rc;
	}
	v->writable = !strcmp(v->kind, "root") && !v->opts.read_only;
	/* MNT/.ckptfs/stats: hidden, reachable by name. */
	struct node *meta = view_new_node(v, N_DIR, ".ckptfs", root);
	struct node *stats = meta ? view_new_node(v, N_STATS, "stats", meta) : NULL;
	if (!stats || view_add_kid(meta, stats) < 0 || dyn_insert(v, meta) < 0) {
		ckpt_view_destroy(v);
		return -ENOMEM;
	}
	*out = v;
	return 0;
}

void ckpt_view_destroy(ckpt_view *v)
{
	if (!v)
		return;
	pending_destroy(v);
	for (size_t i = 0; i < v->narefs; i++) {
		ckpt_array_destroy(v->arefs[i]->arr);
		free(v->arefs[i]->sharding);
		free(v->arefs[i]);
	}
	free(v->arefs);
	for (size_t i = 0; i < v->nstores; i++)
		ckpt_store_destroy(v->stores[i]);
	free(v->stores);
	ckpt_ctx_destroy(v->ctx);
	uint64_t n = atomic_load(&v->count);
	for (uint64_t i = 0; i < n; i++)
		free_node(v->pages[i >> PAGE_BITS][i & ((1u << PAGE_BITS) - 1)]);
	for (size_t p = 0; p < NPAGES && v->pages[p]; p++)
		free(v->pages[p]);
	free(v->dyn);
	free(v->source);
	pthread_rwlock_destroy(&v->ns_lock);
	pthread_mutex_destroy(&v->alloc_lock);
	pthread_mutex_destroy(&v->dyn_lock);
	free(v);
}

const char *ckpt_view_kind(const ckpt_view *v)
{
	return v->kind;
}

/* ---- hidden names ---------------------------------------------------------- */

static uint64_t dyn_hash(ckpt_ino parent, const char *name)
{
	uint64_t h = 1469598103934665603ull ^ parent;
	for (const unsigned char *p = (const unsigned char *)name; *p; p++)
		h = (h ^ *p) * 1099511628211ull;
	return h;
}

static struct node *dyn_find_locked(ckpt_view *v, ckpt_ino parent, const char *name)
{
	if (!v->ndyn_buckets)
		return NULL;
	size_t mask = v->ndyn_buckets - 1;
	for (size_t i = dyn_hash(parent, name) & mask;; i = (i + 1) & mask) {
		struct node *n = v->dyn[i];
		if (!n)
			return NULL;
		if (n->parent == parent && !strcmp(n->name, name))
			return n;
	}
}

static int dyn_insert_locked(ckpt_view *v, struct node *n)
{
	if ((v->ndyn + 1) * 2 > v->ndyn_buckets) {
		size_t nb = v->ndyn_buckets ? v->ndyn_buckets * 2 : 256;
		struct node **t = calloc(nb, sizeof(*t));
		if (!t)
			return -ENOMEM;
		for (size_t i = 0; i < v->ndyn_buckets; i++)
			if (v->dyn[i]) {
				size_t j = dyn_hash(v->dyn[i]->parent, v->dyn[i]->name) & (nb - 1);
				while (t[j])
					j = (j + 1) & (nb - 1);
				t[j] = v->dyn[i];
			}
		free(v->dyn);
		v->dyn = t;
		v->ndyn_buckets = nb;
	}
	size_t mask = v->ndyn_buckets - 1;
	size_t i = dyn_hash(n->parent, n->name) & mask;
	while (v->dyn[i])
		i = (i + 1) & mask;
	v->dyn[i] = n;
	v->ndyn++;
	return 0;
}

static int dyn_insert(ckpt_view *v, struct node *n)
{
	pthread_mutex_lock(&v->dyn_lock);
	int rc = dyn_insert_locked(v, n);
	pthread_mutex_unlock(&v->dyn_lock);
	return rc;
}

struct node *view_dyn_find(ckpt_view *v, ckpt_ino parent, const char *name)
{
	pthread_mutex_lock(&v->dyn_lock);
	struct node *n = dyn_find_locked(v, parent, name);
	pthread_mutex_unlock(&v->dyn_lock);
	return n;
}

int view_dyn_add(ckpt_view *v, struct node *n)
{
	return dyn_insert(v, n);
}

static int ends_with(const char *s, const char *suffix, size_t *stem)
{
	size_t n = strlen(s), k = strlen(suffix);
	if (n <= k || strcmp(s + n - k, suffix))
		return 0;
	*stem = n - k;
	return 1;
}

/* The static array file "<stem>.npy" in dir, or NULL. */
static struct node *array_kid(struct node *dir, const char *name, size_t stem)
{
	char buf[4200];
	if (stem + 5 > sizeof(buf))
		return NULL;
	memcpy(buf, name, stem);
	memcpy(buf + stem, ".npy", 5);
	struct node *k = view_find_kid(dir, buf);
	return k && k->type == N_ARRAY ? k : NULL;
}

/* Stored units of an array, listed once. */
static __thread ckpt_view *shards_view;
static __thread struct node *shards_node;

static void list_units(void)
{
	ckpt_view *v = shards_view;
	struct node *sd = shards_node;
	struct node *an = view_node(v, sd->parent);
	struct node *arr = an ? array_kid(an, sd->name, strlen(sd->name) - strlen(".shards")) : NULL;
	if (!arr)
		return;
	const ckpt_array_meta *m = ckpt_array_meta_of(arr->ar->arr);
	ckpt_store *s = ckpt_array_store(arr->ar->arr);
	uint64_t total = 1;
	for (int d = 0; d < m->rank; d++)
		total *= m->store_grid[d];
	if (total > (1u << 20)) {
		ckpt_log(CKPT_LOG_WARN, "%s: %llu stored units: too many to list", arr->name,
			 (unsigned long long)total);
		return;
	}
	sd->units = calloc(total ? total : 1, sizeof(*sd->units));
	if (!sd->units)
		return;
	uint64_t g[CKPT_MAX_RANK] = { 0 };
	for (uint64_t u = 0; u < total; u++) {
		char key[4096];
		uint64_t size;
		if (ckpt_zarr_unit_key(m, ckpt_array_prefix(arr->ar->arr), g, key, sizeof(key)) >= 0 &&
		    ckpt_store_size(s, key, &size) == 0) {
			ckpt_region r;
			r.rank = m->rank;
			for (int d = 0; d < m->rank; d++) {
				r.start[d] = g[d] * m->chunk_shape[d];
				r.stop[d] = r.start[d] + m->chunk_shape[d];
				if (r.stop[d] > m->shape[d])
					r.stop[d] = m->shape[d];
			}
			char name[CKPT_MAX_RANK * 44 + 8];
			int len = ckpt_slice_format(&r, name, sizeof(name) - 4);
			int empty = 0;
			for (int d = 0; d < m->rank; d++)
				empty |= r.start[d] >= r.stop[d];
			if (len > 0 && !empty) {
				memcpy(name + len, ".npy", 5);
				struct node *n = view_new_node(v, N_ARRAY, name, sd);
				if (n && view_init_array_node(n, arr->ar, &r) == 0)
					sd->units[sd->nunits++] = n;
			}
		}
		for (int d = m->rank - 1; d >= 0; d--) {
			if (++g[d] < m->store_grid[d])
				break;
			g[d] = 0;
		}
	}
}

static void ensure_units(ckpt_view *v, struct node *sd)
{
	/* pthread_once has no argument: pass it through thread-locals. */
	pthread_mutex_lock(&v->dyn_lock);
	shards_view = v;
	shards_node = sd;
	pthread_once(&sd->once, list_units);
	pthread_mutex_unlock(&v->dyn_lock);
}

/* Arrays under dir (recursively), as tensors named by their key path. */
struct st_collect {
	ckpt_st_tensor *t;
	struct node **nodes;
	char **names;
	size_t n, cap;
};

static int collect(ckpt_view *v, struct node *dir, const char *prefix, struct st_collect *c, int depth)
{
	if (depth > 256)
		return 0;
	for (size_t i = 0; i < dir->nkids; i++) {
		struct node *k = dir->kids[i];
		char name[8192];
		size_t stem;
		if (k->type == N_ARRAY && ends_with(k->name, ".npy", &stem)) {
			int w = snprintf(name, sizeof(name), "%s%s%.*s", prefix, *prefix ? "." : "", (int)stem,
					 k->name);
			if (w < 0 || (size_t)w >= sizeof(name))
				return -ENAMETOOLONG;
			if (c->n == c->cap) {
				size_t cap = c->cap ? c->cap * 2 : 16;
				ckpt_st_tensor *t = realloc(c->t, cap * sizeof(*t));
				if (t)
					c->t = t;
				struct node **nn = realloc(c->nodes, cap * sizeof(*nn));
				if (nn)
					c->nodes = nn;
				char **nm = realloc(c->names, cap * sizeof(*nm));
				if (nm)
					c->names = nm;
				if (!t || !nn || !nm)
					return -ENOMEM;
				c->cap = cap;
			}
			const ckpt_array_meta *m = ckpt_array_meta_of(k->ar->arr);
			c->names[c->n] = strdup(name);
			if (!c->names[c->n])
				return -ENOMEM;
			c->t[c->n] = (ckpt_st_tensor){ c->names[c->n], m->dtype, m->rank, m->shape };
			c->nodes[c->n] = k;
			c->n++;
		} else if (k->type == N_DIR) {
			int w = snprintf(name, sizeof(name), "%s%s%s", prefix, *prefix ? "." : "", k->name);
			if (w < 0 || (size_t)w >= sizeof(name))
				return -ENAMETOOLONG;
			int rc = collect(v, k, name, c, depth + 1);
			if (rc < 0)
				return rc;
		}
	}
	return 0;
}

/* The step name a node lives under (root mounts), or NULL. */
static const char *step_of(ckpt_view *v, struct node *n)
{
	if (strcmp(v->kind, "root"))
		return NULL;
	while (n && n->parent != CKPT_ROOT_INO)
		n = view_node(v, n->parent);
	return n && n->ino != CKPT_ROOT_INO ? n->name : NULL;
}

static void free_collect(struct st_collect *c)
{
	for (size_t i = 0; i < c->n; i++)
		free(c->names[i]);
	free(c->names);
	free(c->t);
	free(c->nodes);
}

static int build_safetensors(ckpt_view *v, struct node *stn, struct node *dir)
{
	struct st_collect c = { 0 };
	int rc = collect(v, dir, "", &c, 0);
	if (rc == 0) {
		ckpt_st_meta meta[2] = { { "format", "pt" }, { "step", step_of(v, dir) } };
		size_t nmeta = meta[1].value ? 2 : 1;
		rc = ckpt_st_layout_create(c.t, c.n, meta, nmeta, CKPT_ST_SKIP_UNSUPPORTED, &stn->st);
	}
	if (rc == 0) {
		stn->st_arrays = c.nodes;
		c.nodes = NULL;
		stn->size = ckpt_st_layout_file_size(stn->st);
		stn->stdir = dir;
	}
	free_collect(&c);
	return rc;
}

/* X.safetensors.d/: the Hugging Face sharded form, offered when the
 * subtree holds more than opts.st_shard_bytes (default 5 GB) of data. */
static int build_safetensors_dir(ckpt_view *v, struct node *sd, struct node *dir)
{
	uint64_t limit = v->opts.st_shard_bytes ? v->opts.st_shard_bytes : 5000000000ull;
	struct st_collect c = { 0 };
	int rc = collect(v, dir, "", &c, 0);
	uint64_t total = 0;
	for (size_t i = 0; rc == 0 && i < c.n; i++)
		total += ckpt_array_meta_of(c.nodes[i]->ar->arr)->nbytes;
	if (rc == 0 && total <= limit)
		rc = -ENOENT;
	if (rc == 0) {
		ckpt_st_meta meta[1] = { { "step", step_of(v, dir) } };
		rc = ckpt_st_sharded_create(c.t, c.n, meta, meta[0].value ? 1 : 0, limit,
					    CKPT_ST_SKIP_UNSUPPORTED, &sd->sts);
	}
	for (size_t i = 0; rc == 0 && i < ckpt_st_sharded_count(sd->sts); i++) {
		struct node *f = view_new_node(v, N_SAFETENSORS, ckpt_st_sharded_name(sd->sts, i), sd);
		if (!f) {
			rc = -ENOMEM;
			break;
		}
		f->st = (ckpt_st_layout *)ckpt_st_sharded_layout(sd->sts, i);
		f->st_arrays = c.nodes;
		f->st_borrowed = 1;
		f->size = ckpt_st_layout_file_size(f->st);
		f->stdir = dir;
		rc = view_add_kid(sd, f);
	}
	if (rc == 0) {
		size_t len;
		const char *idx = ckpt_st_sharded_index(sd->sts, &len);
		struct node *f = view_new_node(v, N_FILE, CKPT_ST_INDEX_NAME, sd);
		if (!f || !(f->content = strdup(idx)))
			rc = -ENOMEM;
		else {
			f->size = len;
			rc = view_add_kid(sd, f);
		}
	}
	if (rc == 0) {
		sd->st_arrays = c.nodes; /* owned here, shared by the shard files */
		c.nodes = NULL;
	}
	free_collect(&c);
	return rc;
}

/* Create the hidden node `name` in dir, or return -ENOENT/-EINVAL. */
static int make_hidden(ckpt_view *v, struct node *dir, const char *name, struct node **out)
{
	size_t stem;
	const char *br = strchr(name, '[');
	if (dir->type == N_SHARDS) {
		ensure_units(v, dir);
		for (size_t i = 0; i < dir->nunits; i++)
			if (!strcmp(dir->units[i]->name, name)) {
				*out = dir->units[i];
				return 0;
			}
		return -ENOENT;
	}
	if (br && ends_with(name, ".npy", &stem) && name[stem - 1] == ']') {
		struct node *arr = array_kid(dir, name, (size_t)(br - name));
		if (!arr)
			return -ENOENT;
		const ckpt_array_meta *m = ckpt_array_meta_of(arr->ar->arr);
		ckpt_region r;
		const char *why = "";
		int rc = ckpt_slice_parse(br, stem - (size_t)(br - name), m->rank, m->shape, &r, &why);
		if (rc < 0) {
			ckpt_log(CKPT_LOG_WARN, "%s: %s", name, why);
			return rc == -ERANGE ? -ENOENT : -EINVAL;
		}
		struct node *n = view_new_node(v, N_ARRAY, name, dir);
		if (!n)
			return -ENOMEM;
		n->hidden = 1;
		if ((rc = view_init_array_node(n, arr->ar, &r)) < 0)
			return rc;
		*out = n;
		return 0;
	}
	if (ends_with(name, ".shards", &stem) && array_kid(dir, name, stem)) {
		struct node *n = view_new_node(v, N_SHARDS, name, dir);
		if (!n)
			return -ENOMEM;
		n->hidden = 1;
		*out = n;
		return 0;
	}
	int sharded = ends_with(name, ".safetensors.d", &stem);
	if ((sharded || ends_with(name, ".safetensors", &stem)) && dir->type == N_DIR) {
		char base[4200];
		if (stem >= sizeof(base))
			return -ENOENT;
		memcpy(base, name, stem);
		base[stem] = 0;
		struct node *sub = view_find_kid(dir, base);
		if (!sub || sub->type != N_DIR)
			return -ENOENT;
		struct node *n = view_new_node(v, sharded ? N_DIR : N_SAFETENSORS, name, dir);
		if (!n)
			return -ENOMEM;
		n->hidden = 1;
		int rc = sharded ? build_safetensors_dir(v, n, sub) : build_safetensors(v, n, sub);
		if (rc == -ENOENT)
			return rc;
		if (rc < 0) {
			ckpt_log(CKPT_LOG_ERR, "%s: cannot build the safetensors view (%s)", name,
				 strerror(-rc));
			return -EIO;
		}
		*out = n;
		return 0;
	}
	return -ENOENT;
}

/* ---- requests -------------------------------------------------------------- */

void view_fill_attr(ckpt_view *v, struct node *n, ckpt_attr *a)
{
	memset(a, 0, sizeof(*a));
	a->ino = n->ino;
	a->mtime_ns = n->mtime_ns;
	a->immutable = 1;
	switch (n->type) {
	case N_DIR:
	case N_SHARDS:
		a->is_dir = 1;
		a->mode = 0555;
		a->nlink = 2;
		break;
	case N_PSTEP:
	case N_PDIR:
		a->is_dir = 1;
		a->nlink = 2;
		pending_attr(v, n, a);
		break;
	case N_PFILE:
		a->nlink = 1;
		pending_attr(v, n, a);
		break;
	case N_STATS:
		a->mode = 0444;
		a->nlink = 1;
		a->size = 4096;
		a->immutable = 0;
		a->volatile_data = 1;
		break;
	default:
		a->mode = 0444;
		a->nlink = 1;
		a->size = n->size;
	}
}

int ckpt_view_getattr(ckpt_view *v, ckpt_ino ino, ckpt_attr *out)
{
	struct node *n = view_node(v, ino);
	if (!n)
		return -ENOENT;
	view_fill_attr(v, n, out);
	return 0;
}

static int lookup_locked(ckpt_view *v, ckpt_ino parent, const char *name, ckpt_attr *out)
{
	struct node *dir = view_node(v, parent);
	if (!dir)
		return -ENOENT;
	if (!has_kids(dir) && dir->type != N_SHARDS)
		return -ENOTDIR;
	struct node *n = has_kids(dir) ? view_find_kid(dir, name) : NULL;
	if (!n) {
		pthread_mutex_lock(&v->dyn_lock);
		n = dyn_find_locked(v, parent, name);
		pthread_mutex_unlock(&v->dyn_lock);
	}
	if (!n) {
		struct node *made = NULL;
		int rc = make_hidden(v, dir, name, &made);
		if (rc < 0)
			return rc;
		pthread_mutex_lock(&v->dyn_lock);
		n = dyn_find_locked(v, parent, name);
		if (!n) {
			/* Shard files already belong to their directory's unit list. */
			if (dir->type != N_SHARDS && dyn_insert_locked(v, made) < 0) {
				pthread_mutex_unlock(&v->dyn_lock);
				return -ENOMEM;
			}
			n = made;
		}
		/* A racing lookup that lost keeps its node unreachable (freed at destroy). */
		pthread_mutex_unlock(&v->dyn_lock);
	}
	view_fill_attr(v, n, out);
	return 0;
}

int ckpt_view_lookup(ckpt_view *v, ckpt_ino parent, const char *name, ckpt_attr *out)
{
	pthread_rwlock_rdlock(&v->ns_lock);
	int rc = lookup_locked(v, parent, name, out);
	pthread_rwlock_unlock(&v->ns_lock);
	return rc;
}

/* Companion entry c of dir (show_companions): NAME.shards for each array,
 * X.safetensors for each sub-directory, in kid order. */
static struct node *companion(ckpt_view *v, struct node *dir, uint64_t c)
{
	for (size_t i = 0; i < dir->nkids; i++) {
		struct node *k = dir->kids[i];
		if (k->type != N_ARRAY && k->type != N_DIR)
			continue;
		if (c-- > 0)
			continue;
		char name[4200];
		size_t stem;
		if (k->type == N_ARRAY && ends_with(k->name, ".npy", &stem))
			snprintf(name, sizeof(name), "%.*s.shards", (int)stem, k->name);
		else
			snprintf(name, sizeof(name), "%s.safetensors", k->name);
		ckpt_attr a;
		if (lookup_locked(v, dir->ino, name, &a) < 0)
			return NULL;
		return view_node(v, a.ino);
	}
	return NULL;
}

static int readdir_locked(ckpt_view *v, ckpt_ino ino, uint64_t index, const char **name, ckpt_attr *attr)
{
	struct node *dir = view_node(v, ino);
	if (!dir)
		return -ENOENT;
	struct node *n = NULL;
	if (dir->type == N_SHARDS) {
		ensure_units(v, dir);
		if (index < dir->nunits)
			n = dir->units[index];
	} else if (has_kids(dir)) {
		if (index < dir->nkids) {
			n = dir->kids[index];
		} else if (v->opts.show_companions && dir->type == N_DIR) {
			/* A companion that cannot be built ends the listing: indexes stay stable. */
			n = companion(v, dir, index - dir->nkids);
		}
	} else {
		return -ENOTDIR;
	}
	if (!n)
		return 0;
	*name = n->name;
	view_fill_attr(v, n, attr);
	return 1;
}

int ckpt_view_readdir(ckpt_view *v, ckpt_ino ino, uint64_t index, const char **name, ckpt_attr *attr)
{
	pthread_rwlock_rdlock(&v->ns_lock);
	int rc = readdir_locked(v, ino, index, name, attr);
	pthread_rwlock_unlock(&v->ns_lock);
	return rc;
}

/* A reader near the end of an array file probably goes on with the next
 * file of the directory (cp -r, tar, a loader walking the tree): start
 * decoding its first chunks now, once. */
static void warm_next_file(ckpt_view *v, struct node *n)
{
	if (n->hidden || atomic_exchange(&n->next_warmed, 1))
		return;
	struct node *dir = view_node(v, n->parent);
	if (!dir || dir->type != N_DIR)
		return;
	int found;
	size_t pos = kid_pos(dir, n->name, &found);
	if (!found)
		return;
	for (size_t i = pos + 1; i < dir->nkids; i++) {
		struct node *k = dir->kids[i];
		if (k->type == N_ARRAY) {
			ckpt_array_prefetch(k->ar->arr, &k->region, 0, ckpt_array_window(k->ar->arr));
			return;
		}
	}
}

static ssize_t read_array_node(struct node *n, uint64_t off, size_t len, uint8_t *dst)
{
	if (off >= n->size)
		return 0;
	if (len > n->size - off)
		len = (size_t)(n->size - off);
	size_t done = 0;
	if (off < n->hdrlen) {
		size_t h = n->hdrlen - (size_t)off < len ? n->hdrlen - (size_t)off : len;
		memcpy(dst, n->hdr + off, h);
		done = h;
	}
	if (done < len) {
		ssize_t r = ckpt_array_read(n->ar->arr, &n->region, off + done - n->hdrlen, len - done,
					    dst + done);
		if (r < 0)
			return r;
		done += (size_t)r;
	}
	return (ssize_t)done;
}

static ssize_t read_file_node(struct node *n, uint64_t off, size_t len, uint8_t *dst)
{
	if (off >= n->size)
		return 0;
	if (len > n->size - off)
		len = (size_t)(n->size - off);
	if (n->content) {
		memcpy(dst, n->content + off, len);
		return (ssize_t)len;
	}
	int fd = open(n->path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		ckpt_log(CKPT_LOG_ERR, "%s: %s", n->path, strerror(errno));
		return -EIO;
	}
	ssize_t r = pread(fd, dst, len, (off_t)off);
	int err = errno;
	close(fd);
	if (r < 0) {
		ckpt_log(CKPT_LOG_ERR, "%s: read failed: %s", n->path, strerror(err));
		return -EIO;
	}
	CKPT_STAT_ADD(backing_bytes_read, (uint64_t)r);
	return r;
}

/* A sequential reader of the file crosses from tensor to tensor: queue the
 * decode of whatever the next window of the file holds. */
static void st_read_ahead(struct node *n, uint64_t off)
{
	ckpt_st_piece pieces[8];
	struct node *first = NULL;
	uint64_t window = 0;
	ssize_t np = ckpt_st_layout_map(n->st, off, 1, pieces, 1);
	if (np <= 0 || pieces[0].tensor == CKPT_ST_PIECE_HEADER)
		return;
	first = n->st_arrays[pieces[0].input];
	window = ckpt_array_window(first->ar->arr);
	np = ckpt_st_layout_map(n->st, off, (size_t)window, pieces, 8);
	for (ssize_t i = 0; i < np; i++) {
		if (pieces[i].tensor == CKPT_ST_PIECE_HEADER)
			continue;
		struct node *an = n->st_arrays[pieces[i].input];
		ckpt_array_prefetch(an->ar->arr, &an->region, pieces[i].src_off, pieces[i].len);
	}
}

/* Read ahead across tensors only for a reader streaming the file from its
 * start past the header (cp, cat): one that reads the header and then
 * tensor T by its byte range (safe_open) decodes T's chunks and nothing
 * else. */
static void st_after_read(struct node *n, uint64_t off, size_t done, size_t hlen)
{
	uint64_t expect = atomic_load(&n->st_next);
	int streaming = (off == 0 && done > hlen) ||
			(expect != UINT64_MAX && off + (4u << 20) >= expect && off <= expect + (4u << 20));
	atomic_store(&n->st_next, streaming ? off + done : UINT64_MAX);
	if (streaming)
		st_read_ahead(n, off + done);
}

/* Zero-copy mapping of a safetensors byte range (see ckpt_view_read_iov). */
static int st_read_iov(ckpt_view *v, struct node *n, uint64_t off, size_t len, struct iovec *iov, int max,
		       ckpt_pin **pins, int *npins)
{
	size_t hlen;
	const uint8_t *hdr = ckpt_st_layout_header(n->st, &hlen);
	ckpt_st_piece pieces[8];
	ssize_t np = ckpt_st_layout_map(n->st, off, len, pieces, max < 8 ? (size_t)max : 8);
	if (np < 0)
		return (int)np;
	int k = 0;
	size_t done = 0;
	for (ssize_t i = 0; i < np && k < max; i++) {
		ckpt_st_piece *p = &pieces[i];
		if (p->tensor == CKPT_ST_PIECE_HEADER) {
			iov[k].iov_base = (void *)(hdr + p->src_off);
			iov[k].iov_len = p->len;
			k++;
		} else {
			struct node *an = n->st_arrays[p->input];
			int m = ckpt_array_map(an->ar->arr, &an->region, p->src_off, p->len, iov + k,
					       pins + *npins, max - k);
			if (m < 0) {
				for (int j = 0; j < *npins; j++)
					ckpt_ctx_unpin(v->ctx, pins[j]);
				*npins = 0;
				return m;
			}
			k += m;
			*npins += m;
		}
		done = p->dst_off + p->len;
	}
	/* Out of iovec room: a short reply is fine, the kernel asks again. */
	st_after_read(n, off, done, hlen);
	return k;
}

static ssize_t read_safetensors(struct node *n, uint64_t off, size_t len, uint8_t *dst)
{
	size_t hlen;
	const uint8_t *hdr = ckpt_st_layout_header(n->st, &hlen);
	size_t done = 0;
	while (done < len) {
		ckpt_st_piece pieces[16];
		ssize_t np = ckpt_st_layout_map(n->st, off + done, len - done, pieces, 16);
		if (np < 0)
			return np;
		if (np == 0)
			break;
		for (ssize_t i = 0; i < np; i++) {
			ckpt_st_piece *p = &pieces[i];
			if (p->tensor == CKPT_ST_PIECE_HEADER) {
				memcpy(dst + done + p->dst_off, hdr + p->src_off, p->len);
			} else {
				struct node *an = n->st_arrays[p->input];
				ssize_t r = ckpt_array_read(an->ar->arr, &an->region, p->src_off, p->len,
							    dst + done + p->dst_off);
				if (r < 0)
					return r;
				if ((size_t)r != p->len)
					return -EIO;
			}
		}
		done += pieces[np - 1].dst_off + pieces[np - 1].len;
	}
	st_after_read(n, off, done, hlen);
	return (ssize_t)done;
}

int ckpt_view_read_iov(ckpt_view *v, ckpt_ino ino, uint64_t off, size_t len, struct iovec *iov, int max,
		       ckpt_pin **pins, int *npins)
{
	struct node *n = view_node(v, ino);
	*npins = 0;
	if (n && n->type == N_SAFETENSORS && max >= 3)
		return st_read_iov(v, n, off, len, iov, max, pins, npins);
	if (!n || n->type != N_ARRAY || max < 3)
		return -ENOTSUP;
	if (off >= n->size)
		return 0;
	if (len > n->size - off)
		len = (size_t)(n->size - off);
	int k = 0;
	size_t done = 0;
	if (off < n->hdrlen) {
		done = n->hdrlen - (size_t)off < len ? n->hdrlen - (size_t)off : len;
		iov[k].iov_base = n->hdr + off;
		iov[k].iov_len = done;
		k++;
	}
	if (done < len) {
		int m = ckpt_array_map(n->ar->arr, &n->region, off + done - n->hdrlen, len - done, iov + k,
				       pins, max - k);
		if (m < 0)
			return m;
		*npins = m;
		k += m;
	}
	if (off + len + ckpt_array_window(n->ar->arr) >= n->size)
		warm_next_file(v, n);
	return k;
}

void ckpt_view_unpin(ckpt_view *v, ckpt_ino ino, ckpt_pin **pins, int npins)
{
	(void)ino;
	for (int i = 0; i < npins; i++)
		ckpt_ctx_unpin(v->ctx, pins[i]);
}

ssize_t ckpt_view_read(ckpt_view *v, ckpt_ino ino, uint64_t off, size_t len, void *dst)
{
	struct node *n = view_node(v, ino);
	if (!n)
		return -ENOENT;
	switch (n->type) {
	case N_ARRAY: {
		ssize_t r = read_array_node(n, off, len, dst);
		if (r > 0 && off + (uint64_t)r + ckpt_array_window(n->ar->arr) >= n->size)
			warm_next_file(v, n);
		return r;
	}
	case N_FILE:
		return read_file_node(n, off, len, dst);
	case N_SAFETENSORS:
		return read_safetensors(n, off, len, dst);
	case N_PFILE:
		return pending_read(v, n, off, len, dst);
	case N_STATS: {
		char buf[4096];
		int k = ckpt_stats_json(buf, sizeof(buf));
		if (k < 0)
			return k;
		if (off >= (uint64_t)k)
			return 0;
		size_t m = (size_t)k - (size_t)off < len ? (size_t)k - (size_t)off : len;
		memcpy(dst, buf + off, m);
		return (ssize_t)m;
	}
	default:
		return -EISDIR;
	}
}

/* ---- xattrs ---------------------------------------------------------------- */

static const char *const array_xattrs[] = { "user.ckpt.dtype",	"user.ckpt.shape",
					    "user.ckpt.chunks", "user.ckpt.codec",
					    "user.ckpt.format", "user.ckpt.stored_bytes",
					    "user.ckpt.shards", "user.ckpt.sharding",
					    "user.ckpt.slice" };

static int dims_str(int rank, const uint64_t *d, char *buf, size_t cap)
{
	size_t o = (size_t)snprintf(buf, cap, "[");
	for (int i = 0; i < rank && o < cap; i++)
		o += (size_t)snprintf(buf + o, cap - o, "%s%llu", i ? "," : "", (unsigned long long)d[i]);
	if (o < cap)
		o += (size_t)snprintf(buf + o, cap - o, "]");
	return o < cap ? (int)o : -ERANGE;
}

static int has_xattr(struct node *n, const char *name)
{
	if (!strcmp(name, "user.ckpt.sharding"))
		return n->ar->sharding != NULL;
	if (!strcmp(name, "user.ckpt.slice")) {
		const ckpt_array_meta *m = ckpt_array_meta_of(n->ar->arr);
		for (int d = 0; d < m->rank; d++)
			if (n->region.start[d] != 0 || n->region.stop[d] != m->shape[d])
				return 1;
		return 0;
	}
	return 1;
}

static ssize_t put(const char *val, size_t len, char *buf, size_t cap)
{
	if (cap == 0)
		return (ssize_t)len;
	if (len > cap)
		return -ERANGE;
	memcpy(buf, val, len);
	return (ssize_t)len;
}

static struct node *shards_dir_of(ckpt_view *v, struct node *n)
{
	char name[4200];
	size_t stem;
	struct node *dir = view_node(v, n->parent);
	if (!dir || dir->type != N_DIR || !ends_with(n->name, ".npy", &stem))
		return NULL;
	snprintf(name, sizeof(name), "%.*s.shards", (int)stem, n->name);
	ckpt_attr a;
	if (ckpt_view_lookup(v, dir->ino, name, &a) < 0)
		return NULL;
	return view_node(v, a.ino);
}

ssize_t ckpt_view_getxattr(ckpt_view *v, ckpt_ino ino, const char *name, char *buf, size_t cap)
{
	struct node *n = view_node(v, ino);
	if (!n)
		return -ENOENT;
	/* Only user.* exists here.  ENOTSUP (not ENODATA) for the others lets
	 * tools such as ls remember, per file system, that there are no SELinux
	 * labels or ACLs instead of asking for every file. */
	if (strncmp(name, "user.", 5) != 0)
		return -ENOTSUP;
	if (n->type != N_ARRAY || !has_xattr(n, name))
		return -ENODATA;
	const ckpt_array_meta *m = ckpt_array_meta_of(n->ar->arr);
	char val[4096];
	int len = -ENODATA;
	if (!strcmp(name, "user.ckpt.dtype")) {
		len = snprintf(val, sizeof(val), "%s", ckpt_dtype_get(m->dtype)->name);
	} else if (!strcmp(name, "user.ckpt.shape")) {
		uint64_t s[CKPT_MAX_RANK];
		for (int d = 0; d < n->region.rank; d++)
			s[d] = n->region.stop[d] - n->region.start[d];
		len = dims_str(m->rank, s, val, sizeof(val));
	} else if (!strcmp(name, "user.ckpt.chunks")) {
		len = dims_str(m->rank, m->chunk_shape, val, sizeof(val));
	} else if (!strcmp(name, "user.ckpt.codec")) {
		ckpt_zarr_codec_str(m, val, sizeof(val));
		len = (int)strlen(val);
	} else if (!strcmp(name, "user.ckpt.format")) {
		len = snprintf(val, sizeof(val), "zarr%d%s", m->zarr_format, n->ar->ocdbt ? "+ocdbt" : "");
	} else if (!strcmp(name, "user.ckpt.stored_bytes")) {
		uint64_t sb;
		int rc = ckpt_array_stored_bytes(n->ar->arr, &sb);
		if (rc < 0)
			return -EIO;
		len = snprintf(val, sizeof(val), "%llu", (unsigned long long)sb);
	} else if (!strcmp(name, "user.ckpt.shards")) {
		struct node *sd = shards_dir_of(v, n);
		if (sd)
			ensure_units(v, sd);
		char grid[CKPT_MAX_RANK * 21 + 3];
		dims_str(m->rank, m->store_grid, grid, sizeof(grid));
		len = snprintf(val, sizeof(val), "{\"count\": %zu, \"grid\": %s}", sd ? sd->nunits : 0, grid);
	} else if (!strcmp(name, "user.ckpt.sharding")) {
		return put(n->ar->sharding, strlen(n->ar->sharding), buf, cap);
	} else if (!strcmp(name, "user.ckpt.slice")) {
		len = ckpt_slice_format(&n->region, val, sizeof(val));
	}
	if (len < 0)
		return len;
	return put(val, (size_t)len, buf, cap);
}

ssize_t ckpt_view_listxattr(ckpt_view *v, ckpt_ino ino, char *buf, size_t cap)
{
	struct node *n = view_node(v, ino);
	if (!n)
		return -ENOENT;
	if (n->type != N_ARRAY)
		return 0;
	size_t total = 0;
	for (size_t i = 0; i < sizeof(array_xattrs) / sizeof(array_xattrs[0]); i++) {
		if (!has_xattr(n, array_xattrs[i]))
			continue;
		size_t l = strlen(array_xattrs[i]) + 1;
		if (cap) {
			if (total + l > cap)
				return -ERANGE;
			memcpy(buf + total, array_xattrs[i], l);
		}
		total += l;
	}
	return (ssize_t)total;
}
