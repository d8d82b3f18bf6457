/*
 * companions.c - committed directories and the hidden names they make on
 * lookup: NAME[slice].npy (a region of array NAME.npy), NAME.f32.npy (a
 * bfloat16 or float8 array widened to float32), NAME.shards/ (one file per
 * stored unit), X.safetensors (directory X as one safetensors file),
 * X.safetensors.d/ (the Hugging Face sharded form), STEP/.ckptfs/ and
 * STEP/.stored/, and the stored files the tree does not show; .views
 * (views.c) and the root's `latest` (latest.c) are answered through the
 * same table, hidden_names: one row per hidden name, its match and maker.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orbax.h"
#include "store.h"
#include "tree_int.h"

/* Most stored units a NAME.shards/ directory lists. */
#define SHARDS_MAX_UNITS (1u << 20)
/* Default X.safetensors.d/ shard size (the Hugging Face default, 5 GB). */
#define ST_SHARD_BYTES_DEFAULT 5000000000ull

static void dir_attr(ckpt_view *v, struct node *n, ckpt_attr *a)
{
	(void)v;
	(void)n;
	a->is_dir = 1;
	a->mode = 0555;
	a->nlink = 2;
}

/* The static array file "<stem>.npy" in dir, or NULL. */
static struct array_node *array_kid(struct node *dir, const char *name, size_t stem)
{
	char buf[VIEW_NAME_BUF];
	if (stem + 5 > sizeof(buf))
		return NULL;
	memcpy(buf, name, stem);
	memcpy(buf + stem, ".npy", 5);
	struct node *k = ckpt_node_find_kid(dir, buf);
	return k && k->kind == N_ARRAY ? to_array(k) : NULL;
}

/* ---- NAME.shards/ ---------------------------------------------------------- */

/* The stored units of the array, as array nodes of sd (units_mu held; the
 * store size calls run without any view-wide lock). */
static void list_units(ckpt_view *v, struct shards_node *sd)
{
	struct node *an = ckpt_node_at(v, sd->n.parent);
	struct array_node *arr =
		an ? array_kid(an, sd->n.name, strlen(sd->n.name) - strlen(".shards")) : NULL;
	if (!arr)
		return;
	const ckpt_array_meta *m = ckpt_array_meta_of(arr->ar->arr);
	ckpt_store *s = ckpt_array_store(arr->ar->arr);
	uint64_t total = 1;
	for (int d = 0; d < m->rank; d++)
		total *= m->store_grid[d];
	if (total > SHARDS_MAX_UNITS) {
		ckpt_log(CKPT_LOG_WARN, "%s: %llu stored units: too many to list", arr->n.name,
			 (unsigned long long)total);
		return;
	}
	sd->units = calloc(total ? total : 1, sizeof(*sd->units));
	if (!sd->units)
		return;
	uint64_t g[CKPT_MAX_RANK] = { 0 };
	for (uint64_t u = 0; u < total; u++) {
		char key[VIEW_PATH_MAX];
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
				struct node *n = ckpt_node_new(v, &ckpt_array_ops, name, &sd->n);
				if (n && ckpt_array_node_init(n, arr->ar, &r) == 0)
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

/* List the units once; afterwards units/nunits never change. */
static struct shards_node *ensure_units(ckpt_view *v, struct node *n)
{
	struct shards_node *sd = to_shards(n);
	ckpt_lock(&sd->units_mu, CKPT_RANK_UNITS);
	if (!sd->listed) {
		list_units(v, sd);
		sd->listed = 1;
	}
	ckpt_unlock(&sd->units_mu, CKPT_RANK_UNITS);
	return sd;
}

static int shards_readdir(ckpt_view *v, struct node *dir, uint64_t index, struct node **out)
{
	struct shards_node *sd = ensure_units(v, dir);
	if (index >= sd->nunits)
		return 0;
	*out = sd->units[index];
	return 1;
}

static int shards_lookup(ckpt_view *v, struct node *dir, const char *name, struct node **out)
{
	struct shards_node *sd = ensure_units(v, dir);
	for (size_t i = 0; i < sd->nunits; i++)
		if (!strcmp(sd->units[i]->name, name)) {
			*out = sd->units[i];
			return 1; /* shard files belong to their directory's unit list */
		}
	return -ENOENT;
}

static int shards_nentries(ckpt_view *v, struct node *dir, uint64_t *count)
{
	*count = ensure_units(v, dir)->nunits;
	return 0;
}

static void shards_destroy(ckpt_view *v, struct node *n)
{
	(void)v;
	struct shards_node *sd = to_shards(n);
	free(sd->units);
	pthread_mutex_destroy(&sd->units_mu);
}

static const struct node_ops shards_ops = {
	.kind = N_SHARDS,
	.size = sizeof(struct shards_node),
	.getattr = dir_attr,
	.readdir = shards_readdir,
	.lookup = shards_lookup,
	.nentries = shards_nentries,
	.destroy = shards_destroy,
};

/* ---- X.safetensors and X.safetensors.d/ ------------------------------------ */

static void stdir_destroy(ckpt_view *v, struct node *n)
{
	(void)v;
	struct stdir_node *sd = to_stdir(n);
	free(sd->st_arrays);
	ckpt_st_sharded_destroy(sd->sts);
}

static const struct node_ops stdir_ops = {
	.kind = N_STDIR,
	.size = sizeof(struct stdir_node),
	.getattr = dir_attr,
	.readdir = ckpt_node_readdir_kids,
	.destroy = stdir_destroy,
};

/* Arrays under dir (recursively), as tensors named by their key path. */
struct st_collect {
	ckpt_st_tensor *t;
	struct node **nodes;
	char **names;
	size_t n, cap;
};

static int collect(ckpt_view *v, struct node *dir, const char *prefix, struct st_collect *c, int depth)
{
	if (depth > CKPT_ORBAX_MAX_DEPTH)
		return 0;
	struct dir_node *dn = to_dir(dir);
	for (size_t i = 0; i < dn->nkids; i++) {
		struct node *k = dn->kids[i];
		char name[VIEW_KEYPATH_MAX];
		size_t stem;
		if (k->kind == N_BROKEN) {
			ckpt_log(CKPT_LOG_ERR,
				 "%s%s%s: unreadable array: no safetensors view of its directory", prefix,
				 *prefix ? "." : "", k->name);
			return -EIO; /* never a file that silently leaves an array out */
		}
		if (k->kind == N_ARRAY && ckpt_node_ends_with(k->name, ".npy", &stem)) {
			int w = snprintf(name, sizeof(name), "%s%s%.*s", prefix, *prefix ? "." : "",
					 (int)stem, k->name);
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
			const ckpt_array_meta *m = ckpt_array_meta_of(to_array(k)->ar->arr);
			c->names[c->n] = strdup(name);
			if (!c->names[c->n])
				return -ENOMEM;
			c->t[c->n] = (ckpt_st_tensor){ c->names[c->n], m->dtype, m->rank, m->shape };
			c->nodes[c->n] = k;
			c->n++;
		} else if (k->kind == N_DIR) {
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
		n = ckpt_node_at(v, n->parent);
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

static int build_safetensors(ckpt_view *v, struct st_node *stn, struct node *dir)
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
 * subtree holds more than opts.st_shard_bytes of data. */
static int build_safetensors_dir(ckpt_view *v, struct stdir_node *sd, struct node *dir)
{
	uint64_t limit = v->opts.st_shard_bytes ? v->opts.st_shard_bytes : ST_SHARD_BYTES_DEFAULT;
	struct st_collect c = { 0 };
	int rc = collect(v, dir, "", &c, 0);
	uint64_t total = 0;
	for (size_t i = 0; rc == 0 && i < c.n; i++)
		total += ckpt_array_meta_of(to_array(c.nodes[i])->ar->arr)->nbytes;
	if (rc == 0 && total <= limit)
		rc = -ENOENT;
	if (rc == 0) {
		ckpt_st_meta meta[1] = { { "step", step_of(v, dir) } };
		rc = ckpt_st_sharded_create(c.t, c.n, meta, meta[0].value ? 1 : 0, limit,
					    CKPT_ST_SKIP_UNSUPPORTED, &sd->sts);
	}
	for (size_t i = 0; rc == 0 && i < ckpt_st_sharded_count(sd->sts); i++) {
		struct node *fn = ckpt_node_new(v, &ckpt_st_ops, ckpt_st_sharded_name(sd->sts, i), &sd->d.n);
		if (!fn) {
			rc = -ENOMEM;
			break;
		}
		struct st_node *f = to_st(fn);
		f->st = (ckpt_st_layout *)ckpt_st_sharded_layout(sd->sts, i);
		f->st_arrays = c.nodes;
		f->st_borrowed = 1;
		f->size = ckpt_st_layout_file_size(f->st);
		f->stdir = dir;
		atomic_init(&f->st_next, UINT64_MAX);
		rc = ckpt_node_add_kid(&sd->d.n, fn);
	}
	if (rc == 0) {
		size_t len;
		const char *idx = ckpt_st_sharded_index(sd->sts, &len);
		struct node *f = ckpt_node_new(v, &ckpt_file_ops, CKPT_ST_INDEX_NAME, &sd->d.n);
		if (!f || !(to_file(f)->content = strdup(idx)))
			rc = -ENOMEM;
		else {
			to_file(f)->size = len;
			rc = ckpt_node_add_kid(&sd->d.n, f);
		}
	}
	if (rc == 0) {
		sd->st_arrays = c.nodes; /* owned here, shared by the shard files */
		c.nodes = NULL;
	}
	free_collect(&c);
	return rc;
}

/* ---- the makers of hidden names -------------------------------------------- */

/*
 * Each hidden name of committed directories has a row in hidden_names
 * (below): how the name matches, and its maker, called with ns_lock shared
 * as ops->lookup is: stem is the length of the name without the row's
 * suffix (0 for a row matching the whole name).  A maker answers as
 * ops->lookup (0 and a new hidden node, 1 and a node the directory keeps,
 * -errno), or NOT_MINE: the name matched the row but is not the maker's
 * (no array behind NAME.shards, .ckptfs outside a committed step), and the
 * rows after it decide.
 */
#define NOT_MINE 2

/* dir is a committed step of a root (where .ckptfs/ and .stored/ are made). */
static int committed_step(ckpt_view *v, struct node *dir)
{
	/* the root's own .ckptfs/ is made at open */
	return !strcmp(v->kind, "root") && dir->ino != CKPT_ROOT_INO && dir->parent == CKPT_ROOT_INO &&
	       strcmp(dir->name, ".ckptfs");
}

/* The root's `latest` entry: answered, not made (latest.c). */
static int latest_entry(ckpt_view *v, struct node *dir, const char *name, size_t stem, struct node **out)
{
	(void)stem;
	if (!ckpt_latest_is(v, dir->ino, name))
		return NOT_MINE;
	return ckpt_latest_entry(v, out) ? 1 : -ENOENT; /* the root keeps it */
}

/* NAME[<slice>].npy of array NAME.npy in dir (stem: the name without "].npy"). */
static int make_slice(ckpt_view *v, struct node *dir, const char *name, size_t stem, struct node **out)
{
	const char *br = strchr(name, '[');
	if (!br)
		return NOT_MINE;
	stem++; /* NAME[<slice>] */
	struct array_node *arr = array_kid(dir, name, (size_t)(br - name));
	if (!arr) {
		char base[VIEW_NAME_BUF];
		snprintf(base, sizeof(base), "%.*s.npy", (int)(br - name), name);
		struct node *k = ckpt_node_find_kid(dir, base);
		return k && k->kind == N_BROKEN ? -EIO : -ENOENT; /* an unreadable array's slices too */
	}
	const ckpt_array_meta *m = ckpt_array_meta_of(arr->ar->arr);
	ckpt_region r;
	const char *why = "";
	int rc = ckpt_slice_parse(br, stem - (size_t)(br - name), m->rank, m->shape, &r, &why);
	if (rc < 0) {
		ckpt_log(CKPT_LOG_WARN, "%s: %s", name, why);
		return rc == -ERANGE ? -ENOENT : -EINVAL;
	}
	struct node *n = ckpt_node_new(v, &ckpt_array_ops, name, dir);
	if (!n)
		return -ENOMEM;
	n->hidden = 1;
	n->transient = 1; /* any number of names: freed once the kernel forgets it */
	if ((rc = ckpt_array_node_init(n, arr->ar, &r)) < 0) {
		ckpt_node_free(v, n);
		return rc;
	}
	*out = n;
	return 0;
}

/* NAME.f32.npy or NAME[<slice>].f32.npy: a bfloat16 / float8 array (or a
 * slice of one) widened to float32, exactly. */
static int make_widened(ckpt_view *v, struct node *dir, const char *name, size_t stem, struct node **out)
{
	char base[VIEW_NAME_BUF];
	if (stem + 5 > sizeof(base))
		return -ENOENT;
	memcpy(base, name, stem);
	memcpy(base + stem, ".npy", 5); /* NAME.npy or NAME[<slice>].npy */
	const char *br = strchr(base, '[');
	struct array_node *arr =
		array_kid(dir, base, br && base[stem - 1] == ']' ? (size_t)(br - base) : stem);
	if (!arr)
		return -ENOENT;
	const ckpt_array_meta *m = ckpt_array_meta_of(arr->ar->arr);
	ckpt_region r;
	if (br && base[stem - 1] == ']') {
		const char *why = "";
		int rc = ckpt_slice_parse(br, stem - (size_t)(br - base), m->rank, m->shape, &r, &why);
		if (rc < 0) {
			ckpt_log(CKPT_LOG_WARN, "%s: %s", name, why);
			return rc == -ERANGE ? -ENOENT : -EINVAL;
		}
	} else {
		r = arr->region;
	}
	struct node *n = ckpt_node_new(v, &ckpt_array_ops, name, dir);
	if (!n)
		return -ENOMEM;
	n->hidden = 1;
	n->transient = 1;
	int rc = ckpt_array_node_init_f32(n, arr->ar, &r);
	if (rc < 0) {
		ckpt_node_free(v, n);
		return rc == -ENOTSUP ? -ENOENT : rc; /* only bfloat16 and float8 widen */
	}
	*out = n;
	return 0;
}

/* X.safetensors or X.safetensors.d/ of sub-directory X of dir; with an
 * empty X (".safetensors", ".safetensors.d"), of dir itself: at the top of
 * a mount, the whole checkpoint under its full key names. */
static int make_safetensors(ckpt_view *v, struct node *dir, const char *name, size_t stem, int sharded,
			    struct node **out)
{
	char base[VIEW_NAME_BUF];
	if (stem >= sizeof(base))
		return -ENOENT;
	memcpy(base, name, stem);
	base[stem] = 0;
	struct node *sub = stem ? ckpt_node_find_kid(dir, base) : dir;
	if (!sub || sub->kind != N_DIR)
		return -ENOENT;
	if (!stem && dir->ino == CKPT_ROOT_INO && strcmp(v->kind, "root") == 0)
		return -ENOENT; /* not every step of a root at once */
	int lrc = node_load(v, sub); /* a step of a root builds its kids on first use */
	if (lrc < 0)
		return lrc;
	struct node *n = ckpt_node_new(v, sharded ? &stdir_ops : &ckpt_st_ops, name, dir);
	if (!n)
		return -ENOMEM;
	n->hidden = 1;
	int rc;
	if (sharded) {
		rc = build_safetensors_dir(v, to_stdir(n), sub);
	} else {
		atomic_init(&to_st(n)->st_next, UINT64_MAX);
		rc = build_safetensors(v, to_st(n), sub);
	}
	if (rc == -ENOENT)
		return rc;
	if (rc < 0) {
		ckpt_log(CKPT_LOG_ERR, "%s: cannot build the safetensors view (%s)", name, strerror(-rc));
		return -EIO;
	}
	*out = n;
	return 0;
}

static int make_st(ckpt_view *v, struct node *dir, const char *name, size_t stem, struct node **out)
{
	return make_safetensors(v, dir, name, stem, 0, out);
}

static int make_st_sharded(ckpt_view *v, struct node *dir, const char *name, size_t stem, struct node **out)
{
	return make_safetensors(v, dir, name, stem, 1, out);
}

/* NAME.shards/ of array NAME.npy in dir: its units are listed on first use. */
static int make_shards(ckpt_view *v, struct node *dir, const char *name, size_t stem, struct node **out)
{
	if (!array_kid(dir, name, stem))
		return NOT_MINE;
	struct node *n = ckpt_node_new(v, &shards_ops, name, dir);
	if (!n)
		return -ENOMEM;
	pthread_mutex_init(&to_shards(n)->units_mu, NULL);
	n->hidden = 1;
	*out = n;
	return 0;
}

/* STEP/.views/ (views.c). */
static int views_dir(ckpt_view *v, struct node *dir, const char *name, size_t stem, struct node **out)
{
	(void)stem;
	return ckpt_views_lookup(v, dir, name, out);
}

/* A file or folder the source holds at dir's path under `name` that the
 * tree does not show (Orbax's own files: manifest.ocdbt, d/, ocdbt.process_0/,
 * array_metadatas/, zarr folders): a hidden node reading it as stored, so
 * that Orbax and TensorStore restore through the mount, opening its files
 * by name.  Not in the root (its unfinished folders are no steps).  0 and
 * the node, or -ENOENT. */
static int stored_lookup(ckpt_view *v, struct node *dir, const char *name, size_t stem, struct node **out)
{
	(void)stem;
	const char *parts[CKPT_ORBAX_MAX_DEPTH + 1];
	int k = 0;
	if (dir->ino == CKPT_ROOT_INO || !strcmp(name, ".") || !strcmp(name, ".."))
		return -ENOENT;
	parts[k++] = name;
	for (struct node *d = dir; d && d->ino != CKPT_ROOT_INO; d = ckpt_node_at(v, d->parent)) {
		if (k == CKPT_ORBAX_MAX_DEPTH + 1 || d->kind != N_DIR || !strcmp(d->name, ".ckptfs"))
			return -ENOENT;
		parts[k++] = d->name;
	}
	char key[VIEW_PATH_MAX];
	size_t len = 0;
	for (int i = k - 1; i >= 0; i--) {
		int m = snprintf(key + len, sizeof(key) - len, "%s%s", parts[i], i ? "/" : "");
		if (m < 0 || (size_t)m >= sizeof(key) - len)
			return -ENOENT;
		len += (size_t)m;
	}
	struct ckpt_store_stat st;
	if (ckpt_store_stat(v->src, key, &st) < 0)
		return -ENOENT;
	struct node *n = ckpt_node_new(v, st.is_dir ? &ckpt_dir_ops : &ckpt_file_ops, name, dir);
	if (!n)
		return -ENOMEM;
	n->hidden = 1;
	if (!st.is_dir) {
		struct file_node *f = to_file(n);
		f->store = v->src;
		f->size = st.size;
		if (!(f->key = strdup(key)))
			return -ENOMEM;
	}
	*out = n;
	return 0;
}

/* ---- STEP/.stored/: the step's files as they are stored ---------------------- */

/* Folders of .stored/: their kids only, no hidden names. */
static int stored_readdir(ckpt_view *v, struct node *dir, uint64_t index, struct node **out)
{
	(void)v;
	struct dir_node *d = to_dir(dir);
	if (index >= d->nkids)
		return 0;
	*out = d->kids[index];
	return 1;
}

static const struct node_ops stored_dir_ops = {
	.kind = N_DIR,
	.size = sizeof(struct dir_node),
	.getattr = dir_attr,
	.readdir = stored_readdir,
};

#define STORED_MAX_DEPTH 64
#define STORED_MAX_NODES (1u << 22)

struct stored_ent {
	char *name;
	struct ckpt_store_stat st;
};

struct stored_list {
	struct stored_ent *e;
	size_t n, cap;
};

static int stored_collect(void *ctx, const char *name, const struct ckpt_store_stat *st)
{
	struct stored_list *l = ctx;
	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 16;
		struct stored_ent *e = realloc(l->e, cap * sizeof(*e));
		if (!e)
			return -ENOMEM;
		l->e = e;
		l->cap = cap;
	}
	l->e[l->n].name = strdup(name);
	if (!l->e[l->n].name)
		return -ENOMEM;
	l->e[l->n++].st = *st;
	return 0;
}

/* The files and folders of source folder `key` as kids of dir, recursively:
 * files read straight from the source store (ckpt_file_ops). */
static int stored_fill(ckpt_view *v, struct node *dir, const char *key, int depth, size_t *budget)
{
	if (depth > STORED_MAX_DEPTH)
		return -ELOOP;
	struct stored_list l = { 0 };
	int rc = ckpt_store_listdir(v->src, key, stored_collect, &l);
	for (size_t i = 0; rc >= 0 && i < l.n; i++) {
		char k[VIEW_PATH_MAX];
		if (snprintf(k, sizeof(k), "%s/%s", key, l.e[i].name) >= (int)sizeof(k) || !(*budget)--) {
			rc = -ENAMETOOLONG;
			break;
		}
		struct node *n = ckpt_node_new(v, l.e[i].st.is_dir ? &stored_dir_ops : &ckpt_file_ops,
					       l.e[i].name, dir);
		if (!n) {
			rc = -ENOMEM;
			break;
		}
		n->mtime_ns = l.e[i].st.mtime_ns ? l.e[i].st.mtime_ns : dir->mtime_ns;
		if (!l.e[i].st.is_dir) {
			struct file_node *f = to_file(n);
			f->store = v->src;
			f->key = strdup(k);
			f->size = l.e[i].st.size;
			f->stored_copy = 1;
			if (!f->key) {
				rc = -ENOMEM;
				break;
			}
		}
		rc = ckpt_node_add_kid(dir, n);
		if (rc == 0 && l.e[i].st.is_dir)
			rc = stored_fill(v, n, k, depth + 1, budget);
	}
	for (size_t i = 0; i < l.n; i++)
		free(l.e[i].name);
	free(l.e);
	return rc < 0 ? rc : 0;
}

/* ".stored" in a committed step of a root: a hidden folder holding the
 * step's files as the source stores them (Orbax metadata, zarr or OCDBT
 * files), so that `cp -r STEP/.stored DEST` makes a step Orbax restores,
 * from any source, s3:// and gs:// included.  Listed once, on this lookup
 * (ns_lock shared: the listing takes no view lock). */
static int stored_dir(ckpt_view *v, struct node *dir, const char *name, size_t stem, struct node **out)
{
	(void)name;
	(void)stem;
	if (!committed_step(v, dir))
		return NOT_MINE;
	struct node *top = ckpt_node_new(v, &stored_dir_ops, CKPT_STORED_DIR, dir);
	if (!top)
		return -ENOMEM;
	top->hidden = 1;
	top->mtime_ns = dir->mtime_ns;
	size_t budget = STORED_MAX_NODES;
	int rc = stored_fill(v, top, dir->name, 0, &budget);
	if (rc < 0) {
		ckpt_log(CKPT_LOG_ERR, "%s/%s: cannot list the stored files: %s", dir->name, CKPT_STORED_DIR,
			 strerror(-rc));
		return -EIO;
	}
	*out = top;
	return 0;
}

/* ".ckptfs" in a committed step of a root: a new hidden .ckptfs/ directory
 * holding the summary files (summary.c), which builds nothing now. */
static int meta_dir(ckpt_view *v, struct node *dir, const char *name, size_t stem, struct node **out)
{
	(void)stem;
	if (!committed_step(v, dir))
		return NOT_MINE;
	struct node *meta = ckpt_node_new(v, &ckpt_dir_ops, name, dir);
	if (!meta)
		return -ENOMEM;
	meta->hidden = 1;
	int rc = ckpt_summary_add_files(v, meta);
	if (rc < 0)
		return rc;
	*out = meta;
	return 0;
}

/* ---- committed directories ------------------------------------------------- */

/* How a row of hidden_names matches a name. */
enum hidden_match {
	BY_NAME, /* the name is the row's text */
	BY_SUFFIX, /* NAME + text, NAME not empty */
	BY_SUFFIX_OR_NAME, /* NAME + text, NAME maybe empty (the directory itself) */
	BY_ANY, /* every name */
};

struct hidden_row {
	enum hidden_match match;
	const char *text;
	int (*make)(ckpt_view *v, struct node *dir, const char *name, size_t stem, struct node **out);
};

/* The hidden names of committed directories (names no kid has), tried in
 * this order: the first row that matches and whose maker does not answer
 * NOT_MINE answers the lookup.  A new derived file is one row here. */
static const struct hidden_row hidden_names[] = {
	{ BY_NAME, CKPT_LATEST_NAME, latest_entry }, /* the root's `latest` */
	{ BY_SUFFIX, ".f32.npy", make_widened }, /* NAME.f32.npy, NAME[<slice>].f32.npy */
	{ BY_SUFFIX, "].npy", make_slice }, /* NAME[<slice>].npy */
	{ BY_SUFFIX, ".shards", make_shards }, /* NAME.shards/ */
	{ BY_SUFFIX_OR_NAME, ".safetensors.d", make_st_sharded }, /* X.safetensors.d/ */
	{ BY_SUFFIX_OR_NAME, ".safetensors", make_st }, /* X.safetensors */
	{ BY_NAME, CKPT_VIEWS_DIR, views_dir }, /* STEP/.views/ */
	{ BY_NAME, ".ckptfs", meta_dir }, /* STEP/.ckptfs/ */
	{ BY_NAME, CKPT_STORED_DIR, stored_dir }, /* STEP/.stored/ */
	{ BY_ANY, NULL, stored_lookup }, /* a stored file or folder the tree does not show */
};

/* 1 when name matches row r (*stem: its length without the row's suffix). */
static int row_matches(const struct hidden_row *r, const char *name, size_t *stem)
{
	*stem = 0;
	switch (r->match) {
	case BY_NAME:
		return !strcmp(name, r->text);
	case BY_SUFFIX_OR_NAME:
		if (!strcmp(name, r->text))
			return 1;
		/* fall through */
	case BY_SUFFIX:
		return ckpt_node_ends_with(name, r->text, stem);
	case BY_ANY:
		return 1;
	}
	return 0;
}

static int dir_lookup(ckpt_view *v, struct node *dir, const char *name, struct node **out)
{
	for (size_t i = 0; i < sizeof(hidden_names) / sizeof(hidden_names[0]); i++) {
		size_t stem;
		if (!row_matches(&hidden_names[i], name, &stem))
			continue;
		int rc = hidden_names[i].make(v, dir, name, stem, out);
		if (rc != NOT_MINE)
			return rc;
	}
	return -ENOENT;
}

/* Companion entry c of dir (show_companions): NAME.shards for each array,
 * X.safetensors for each sub-directory, in kid order. */
static struct node *companion(ckpt_view *v, struct node *dir, uint64_t c)
{
	struct dir_node *d = to_dir(dir);
	for (size_t i = 0; i < d->nkids; i++) {
		struct node *k = d->kids[i];
		if (k->kind != N_ARRAY && k->kind != N_DIR)
			continue;
		if (c-- > 0)
			continue;
		char name[VIEW_NAME_BUF];
		size_t stem;
		if (k->kind == N_ARRAY && ckpt_node_ends_with(k->name, ".npy", &stem))
			snprintf(name, sizeof(name), "%.*s.shards", (int)stem, k->name);
		else
			snprintf(name, sizeof(name), "%s.safetensors", k->name);
		struct node *n;
		if (ckpt_node_lookup_locked(v, dir, name, &n) < 0)
			return NULL;
		return n;
	}
	return NULL;
}

static int dir_readdir(ckpt_view *v, struct node *dir, uint64_t index, struct node **out)
{
	struct dir_node *d = to_dir(dir);
	if (index < d->nkids) {
		*out = d->kids[index];
		return 1;
	}
	struct node *latest;
	if (dir->ino == CKPT_ROOT_INO && ckpt_latest_entry(v, &latest)) { /* after the steps */
		if (index == d->nkids) {
			*out = latest;
			return 1;
		}
		index--;
	}
	if (!v->opts.show_companions)
		return 0;
	/* A companion that cannot be built ends the listing: indexes stay stable. */
	*out = companion(v, dir, index - d->nkids);
	return *out != NULL;
}

const struct node_ops ckpt_dir_ops = {
	.kind = N_DIR,
	.size = sizeof(struct dir_node),
	.getattr = dir_attr,
	.readdir = dir_readdir,
	.lookup = dir_lookup,
};
