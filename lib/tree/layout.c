/*
 * layout.c - detect what a source is (CheckpointManager root, step, item)
 * and build the view's nodes from Orbax's layout and metadata.  Everything
 * is read through the store interface (store.h: listdir, stat, read_small,
 * sub, ocdbt_open_on) from the source's root store, so a folder and an
 * object store are discovered alike.  Keys are '/'-separated paths below
 * the source ("" = the source itself).
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npy.h"
#include "orbax.h"
#include "view_internal.h"

#define MAX_JSON (64u << 20) /* _METADATA and friends */
/* Deepest folder mirrored below a non-pytree item. */
#define MIRROR_MAX_DEPTH 16

/* key = dir + "/" + name (just name when dir is the root ""); 0 or -ENAMETOOLONG. */
static int key_join(char *buf, size_t cap, const char *dir, const char *name)
{
	int n = snprintf(buf, cap, "%s%s%s", dir, *dir ? "/" : "", name);
	return n >= 0 && (size_t)n < cap ? 0 : -ENAMETOOLONG;
}

/* 1 when dir/name exists as a file (want_dir 0) or folder (want_dir 1). */
static int exists_at(ckpt_view *v, const char *dir, const char *name, int want_dir)
{
	char k[VIEW_PATH_MAX];
	struct ckpt_store_stat st;
	if (key_join(k, sizeof(k), dir, name) < 0 || ckpt_store_stat(v->src, k, &st) < 0)
		return 0;
	return want_dir ? st.is_dir : !st.is_dir;
}

static int ocdbt_cb(void *ctx, const char *name, const struct ckpt_store_stat *st)
{
	(void)ctx;
	(void)st;
	return strncmp(name, CKPT_ORBAX_OCDBT_PROCESS_PREFIX, strlen(CKPT_ORBAX_OCDBT_PROCESS_PREFIX)) == 0;
}

static int has_ocdbt(ckpt_view *v, const char *dir)
{
	if (exists_at(v, dir, CKPT_ORBAX_OCDBT_MANIFEST, 0))
		return 1;
	return ckpt_store_listdir(v->src, dir, ocdbt_cb, NULL) > 0;
}

static int is_item(ckpt_view *v, const char *dir)
{
	return exists_at(v, dir, CKPT_ORBAX_METADATA, 0) || has_ocdbt(v, dir);
}

static cJSON *read_json(ckpt_view *v, const char *dir, const char *name)
{
	char k[VIEW_PATH_MAX];
	size_t len;
	char *txt;
	if (key_join(k, sizeof(k), dir, name) < 0 ||
	    ckpt_store_read_small(v->src, k, MAX_JSON, &txt, &len) < 0)
		return NULL;
	cJSON *j = cJSON_ParseWithLength(txt, len);
	free(txt);
	if (!j)
		ckpt_log(CKPT_LOG_WARN, "%s/%s: invalid JSON, ignored", v->src->root, k);
	return j;
}

/* Commit time of a step/checkpoint folder: _CHECKPOINT_METADATA's
 * commit_timestamp_nsecs, else the folder's mtime, else fallback. */
static int64_t commit_time(ckpt_view *v, const char *dir, int64_t fallback)
{
	cJSON *j = read_json(v, dir, CKPT_ORBAX_CKPT_METADATA);
	int64_t t = 0;
	if (j) {
		const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "commit_timestamp_nsecs");
		if (cJSON_IsNumber(c) && c->valuedouble > 0 && c->valuedouble < 9.2e18)
			t = (int64_t)c->valuedouble;
		cJSON_Delete(j);
	}
	if (t)
		return t;
	struct ckpt_store_stat st;
	if (ckpt_store_stat(v->src, dir, &st) == 0 && st.mtime_ns)
		return st.mtime_ns;
	return fallback;
}

/* File `key` of the source (size known) as kid `name` of dir. */
static struct node *add_file(ckpt_view *v, struct node *dir, const char *name, const char *key, uint64_t size,
			     int64_t mtime)
{
	struct node *n = node_new(v, &file_ops, name, dir);
	if (!n)
		return NULL;
	struct file_node *f = to_file(n);
	f->store = v->src;
	f->key = strdup(key);
	f->size = size;
	n->mtime_ns = mtime;
	if (!f->key || view_add_kid(dir, n) < 0)
		return NULL;
	return n;
}

/* add_file for dir/name when it is a file of the source. */
static void add_file_if(ckpt_view *v, struct node *dirn, const char *dir, const char *name, int64_t mtime)
{
	char k[VIEW_PATH_MAX];
	struct ckpt_store_stat st;
	if (view_find_kid(dirn, name) || key_join(k, sizeof(k), dir, name) < 0 ||
	    ckpt_store_stat(v->src, k, &st) < 0 || st.is_dir)
		return;
	add_file(v, dirn, name, k, st.size, mtime);
}

static struct node *add_dir(ckpt_view *v, struct node *parent, const char *name, int64_t mtime)
{
	struct node *n = view_find_kid(parent, name);
	if (n)
		return n->kind == N_DIR ? n : NULL;
	n = node_new(v, &dir_ops, name, parent);
	if (!n)
		return NULL;
	n->mtime_ns = mtime;
	if (view_add_kid(parent, n) < 0)
		return NULL;
	return n;
}

/* Add array `param` (store prefix) as file `fname` in dir. */
static void add_array(ckpt_view *v, struct node *dir, ckpt_store *store, int ocdbt, const char *param,
		      const char *fname, int format, int all_stored, const cJSON *sharding, int64_t mtime)
{
	if (view_find_kid(dir, fname)) {
		ckpt_log(CKPT_LOG_WARN, "%s: name collision for array %s, left out", store->root, param);
		return;
	}
	ckpt_array *arr;
	ckpt_array_open_opts oo = { .format = format, .missing_is_error = all_stored };
	int rc = ckpt_array_open_ex(v->ctx, store, param, &oo, &arr);
	if (rc == -ENOENT) {
		ckpt_log(CKPT_LOG_ERR, "%s: array %s has no zarr metadata, left out", store->root, param);
		return;
	}
	if (rc < 0) {
		ckpt_log(CKPT_LOG_ERR, "%s: array %s left out", store->root, param); /* reason logged above */
		return;
	}
	struct aref *ar = view_new_aref(v, arr, ocdbt);
	if (!ar) {
		ckpt_array_destroy(arr);
		return;
	}
	if (sharding) {
		char *key = ckpt_orbax_sharding_key(param);
		const cJSON *s = key ? cJSON_GetObjectItemCaseSensitive(sharding, key) : NULL;
		if (cJSON_IsString(s))
			ar->sharding = strdup(s->valuestring);
		free(key);
	}
	struct node *n = node_new(v, &array_ops, fname, dir);
	if (!n)
		return;
	const ckpt_array_meta *m = ckpt_array_meta_of(arr);
	ckpt_region r;
	ckpt_region_full(&r, m->rank, m->shape);
	if (array_node_init(n, ar, &r) < 0)
		return;
	n->mtime_ns = mtime;
	view_add_kid(dir, n);
}

static void add_string_leaf(ckpt_view *v, struct node *dir, const char *fname, const char *value,
			    int64_t mtime)
{
	struct node *n = node_new(v, &file_ops, fname, dir);
	if (!n)
		return;
	struct file_node *f = to_file(n);
	f->content = strdup(value);
	f->size = f->content ? strlen(f->content) : 0;
	n->mtime_ns = mtime;
	view_add_kid(dir, n);
}

struct scan_ctx {
	ckpt_view *v;
	struct node *dir;
	ckpt_store *store;
	int ocdbt;
	int64_t mtime;
};

/* Fallback without usable _METADATA: every "<param>/zarr.json|.zarray" key. */
static int scan_cb(void *arg, const char *key, uint64_t size)
{
	(void)size;
	struct scan_ctx *c = arg;
	const char *slash = strrchr(key, '/');
	if (!slash || (strcmp(slash + 1, CKPT_ORBAX_ZARR3_META) && strcmp(slash + 1, CKPT_ORBAX_ZARR2_META)))
		return 0;
	char param[VIEW_PATH_MAX], fname[VIEW_NAME_BUF];
	size_t n = (size_t)(slash - key);
	if (n == 0 || n >= sizeof(param))
		return 0;
	memcpy(param, key, n);
	param[n] = 0;
	if (strchr(param, '/'))
		return 0; /* a chunk path, not an array */
	char esc[VIEW_PATH_MAX];
	ckpt_orbax_key_escape(param, esc, sizeof(esc)); /* too long: truncated, still unique enough to show */
	snprintf(fname, sizeof(fname), "%s.npy", esc);
	if (!view_find_kid(c->dir, fname))
		add_array(c->v, c->dir, c->store, c->ocdbt, param, fname,
			  strcmp(slash + 1, CKPT_ORBAX_ZARR3_META) ? 2 : 3, 0, NULL, c->mtime);
	return 0;
}

/* A pytree item folder (key `path`) -> dir's children. */
static void build_item(ckpt_view *v, struct node *dir, const char *path, int64_t mtime)
{
	static const char *const meta_files[] = { CKPT_ORBAX_CKPT_METADATA, CKPT_ORBAX_METADATA,
						  CKPT_ORBAX_SHARDING, CKPT_ORBAX_COMMIT_SUCCESS,
						  CKPT_ORBAX_MARKER_FILE };
	for (size_t i = 0; i < sizeof(meta_files) / sizeof(meta_files[0]); i++)
		add_file_if(v, dir, path, meta_files[i], mtime);
	int ocdbt = has_ocdbt(v, path);
	ckpt_store *store = NULL;
	int rc =
		ocdbt ? ckpt_store_ocdbt_open_on(v->src, path, &store) : ckpt_store_sub(v->src, path, &store);
	if (rc < 0) {
		ckpt_log(CKPT_LOG_ERR, "%s/%s: cannot open the %s store (%s); arrays left out", v->src->root,
			 path, ocdbt ? "OCDBT" : "folder", strerror(-rc));
		return;
	}
	if (view_own_store(v, store) < 0) {
		ckpt_store_destroy(store);
		return;
	}
	cJSON *meta = read_json(v, path, CKPT_ORBAX_METADATA);
	cJSON *sharding = read_json(v, path, CKPT_ORBAX_SHARDING);
	cJSON *strings = NULL;
	const cJSON *tree = meta ? cJSON_GetObjectItemCaseSensitive(meta, "tree_metadata") : NULL;
	int format = 0, all_stored = 0;
	if (meta) {
		const cJSON *z3 = cJSON_GetObjectItemCaseSensitive(meta, "use_zarr3");
		format = cJSON_IsBool(z3) ? (cJSON_IsTrue(z3) ? 3 : 2) : 0;
		/* Orbax writes every chunk then: a missing one is an error (docs/usage.md) */
		all_stored = cJSON_IsTrue(
			cJSON_GetObjectItemCaseSensitive(meta, "store_array_data_equal_to_fill_value"));
	}
	if (!cJSON_IsObject(tree)) {
		if (meta)
			ckpt_log(CKPT_LOG_ERR,
				 "%s/" CKPT_ORBAX_METADATA
				 ": no tree_metadata object; listing arrays from the store",
				 store->root);
		struct scan_ctx c = { v, dir, store, ocdbt, mtime };
		ckpt_store_list(store, "", scan_cb, &c);
		goto out;
	}
	const cJSON *leaf;
	cJSON_ArrayForEach(leaf, tree)
	{
		const cJSON *keys = cJSON_GetObjectItemCaseSensitive(leaf, "key_metadata");
		const cJSON *vm = cJSON_GetObjectItemCaseSensitive(leaf, "value_metadata");
		const cJSON *vt = vm ? cJSON_GetObjectItemCaseSensitive(vm, "value_type") : NULL;
		int depth = cJSON_GetArraySize(keys);
		if (!cJSON_IsArray(keys) || depth < 1 || depth > CKPT_ORBAX_MAX_DEPTH ||
		    !cJSON_IsString(vt)) {
			ckpt_log(CKPT_LOG_ERR, "%s/" CKPT_ORBAX_METADATA ": malformed entry %s, skipped",
				 store->root, leaf->string ? leaf->string : "?");
			continue;
		}
		/* param name = '.'-joined keys; directories per key. */
		char param[VIEW_KEYPATH_MAX];
		size_t plen = 0;
		int ok = 1;
		struct node *d = dir;
		int i = 0;
		const cJSON *k;
		char esc[VIEW_PATH_MAX];
		cJSON_ArrayForEach(k, keys)
		{
			const cJSON *key = cJSON_GetObjectItemCaseSensitive(k, "key");
			char num[32];
			const char *ks = NULL;
			if (cJSON_IsString(key))
				ks = key->valuestring;
			else if (cJSON_IsNumber(key)) {
				snprintf(num, sizeof(num), "%lld", (long long)key->valuedouble);
				ks = num;
			}
			if (!ks || plen + strlen(ks) + 2 >= sizeof(param)) {
				ok = 0;
				break;
			}
			plen += (size_t)snprintf(param + plen, sizeof(param) - plen, "%s%s", i ? "." : "",
						 ks);
			ckpt_orbax_key_escape(ks, esc, sizeof(esc)); /* too long: truncated */
			if (++i < depth) {
				d = add_dir(v, d, esc, mtime);
				if (!d) {
					ok = 0;
					break;
				}
			}
		}
		if (!ok) {
			ckpt_log(CKPT_LOG_ERR, "%s/" CKPT_ORBAX_METADATA ": bad key path in %s, skipped",
				 store->root, leaf->string ? leaf->string : "?");
			continue;
		}
		const char *type = vt->valuestring;
		char fname[VIEW_NAME_BUF];
		if (!strcmp(type, "jax.Array") || !strcmp(type, "np.ndarray") || !strcmp(type, "scalar")) {
			snprintf(fname, sizeof(fname), "%s.npy", esc);
			add_array(v, d, store, ocdbt, param, fname, format, all_stored, sharding, mtime);
		} else if (!strcmp(type, "Dict") || !strcmp(type, "List") || !strcmp(type, "Tuple") ||
			   !strcmp(type, "NamedTuple")) {
			add_dir(v, d, esc, mtime);
		} else if (!strcmp(type, "string")) {
			if (!strings)
				strings = read_json(v, path, CKPT_ORBAX_STRINGS);
			const cJSON *s = strings ? cJSON_GetObjectItemCaseSensitive(strings, param) : NULL;
			snprintf(fname, sizeof(fname), "%s.txt", esc);
			if (cJSON_IsString(s) && !view_find_kid(d, fname))
				add_string_leaf(v, d, fname, s->valuestring, mtime);
		}
		/* "None", "placeholder" and unknown types carry no data. */
	}
out:
	cJSON_Delete(meta);
	cJSON_Delete(sharding);
	cJSON_Delete(strings);
}

/* Call fn(v, arg, name, key, st) for each regular file and folder of folder
 * `dir`, skipping hidden names and unfinished (tmp / partial) folders. */
typedef void (*entry_fn)(ckpt_view *v, void *arg, const char *name, const char *key,
			 const struct ckpt_store_stat *st);

struct entry_ctx {
	ckpt_view *v;
	const char *dir;
	entry_fn fn;
	void *arg;
};

static int entry_cb(void *ctx, const char *name, const struct ckpt_store_stat *st)
{
	struct entry_ctx *e = ctx;
	char k[VIEW_PATH_MAX];
	if (name[0] == '.' || ckpt_orbax_is_unfinished(name) || key_join(k, sizeof(k), e->dir, name) < 0)
		return 0;
	e->fn(e->v, e->arg, name, k, st);
	return 0;
}

static int for_each_entry(ckpt_view *v, const char *dir, entry_fn fn, void *arg)
{
	struct entry_ctx e = { v, dir, fn, arg };
	return ckpt_store_listdir(v->src, dir, entry_cb, &e);
}

struct walk_ctx {
	struct node *dir;
	int64_t mtime;
	int depth;
};

static void mirror_dir(ckpt_view *v, struct node *dir, const char *path, int64_t mtime, int depth);

/* A non-pytree item (e.g. JSON `metadata/metadata`): its regular files and folders. */
static void mirror_entry(ckpt_view *v, void *arg, const char *name, const char *key,
			 const struct ckpt_store_stat *st)
{
	struct walk_ctx *w = arg;
	if (!st->is_dir) {
		add_file(v, w->dir, name, key, st->size, w->mtime);
		return;
	}
	struct node *sub = add_dir(v, w->dir, name, w->mtime);
	if (sub)
		mirror_dir(v, sub, key, w->mtime, w->depth + 1);
}

static void mirror_dir(ckpt_view *v, struct node *dir, const char *path, int64_t mtime, int depth)
{
	if (depth > MIRROR_MAX_DEPTH)
		return;
	struct walk_ctx w = { dir, mtime, depth };
	for_each_entry(v, path, mirror_entry, &w);
}

/* A step folder: one directory per item plus its metadata files. */
static void step_entry(ckpt_view *v, void *arg, const char *name, const char *key,
		       const struct ckpt_store_stat *st)
{
	struct walk_ctx *w = arg;
	if (!st->is_dir) {
		add_file(v, w->dir, name, key, st->size, w->mtime);
		return;
	}
	struct node *item = add_dir(v, w->dir, name, w->mtime);
	if (!item)
		return;
	if (is_item(v, key))
		build_item(v, item, key, w->mtime);
	else
		mirror_dir(v, item, key, w->mtime, 0);
}

static void build_step(ckpt_view *v, struct node *dir, const char *path, int64_t mtime)
{
	if (is_item(v, path)) { /* a direct (non-composite) save: the step is the item */
		build_item(v, dir, path, mtime);
		return;
	}
	struct walk_ctx w = { dir, mtime, 0 };
	for_each_entry(v, path, step_entry, &w);
}

/* A CheckpointManager root: one directory per committed step. */
static void root_entry(ckpt_view *v, void *arg, const char *name, const char *key,
		       const struct ckpt_store_stat *st)
{
	struct walk_ctx *w = arg;
	if (!st->is_dir || !strcmp(name, CKPT_ORBAX_ROOT_METADATA_DIR))
		return; /* the root's metadata/ folder is not a step */
	int64_t t = commit_time(v, key, w->mtime);
	struct node *step = add_dir(v, w->dir, name, t);
	if (step)
		build_step(v, step, key, t);
}

int layout_build_view(ckpt_view *v, const char *source)
{
	ckpt_store *src;
	int rc = ckpt_store_open_source(source, v->opts.store, &src);
	if (rc < 0)
		return rc;
	if ((rc = view_own_store(v, src)) < 0) {
		ckpt_store_destroy(src);
		return rc;
	}
	v->src = src;
	struct ckpt_store_stat st;
	if ((rc = ckpt_store_stat(src, "", &st)) < 0)
		return rc;
	if (!st.is_dir)
		return -ENOTDIR;
	struct node *root = view_node(v, CKPT_ROOT_INO);
	int64_t now = st.mtime_ns;
	if (is_item(v, "")) {
		v->kind = "item";
		root->mtime_ns = commit_time(v, "", now);
		build_item(v, root, "", root->mtime_ns);
	} else if (exists_at(v, "", CKPT_ORBAX_CKPT_METADATA, 0) ||
		   exists_at(v, "", CKPT_ORBAX_MARKER_FILE, 0)) {
		v->kind = "step";
		root->mtime_ns = commit_time(v, "", now);
		build_step(v, root, "", root->mtime_ns);
	} else {
		v->kind = "root";
		root->mtime_ns = now;
		struct walk_ctx w = { root, now, 0 };
		rc = for_each_entry(v, "", root_entry, &w);
		if (rc < 0)
			return rc;
	}
	return 0;
}

struct node *layout_new_step(ckpt_view *v, const char *name)
{
	struct node *root = view_node(v, CKPT_ROOT_INO);
	int64_t t = commit_time(v, name, root->mtime_ns);
	struct node *step = node_new(v, &dir_ops, name, root);
	if (!step)
		return NULL;
	step->mtime_ns = t;
	build_step(v, step, name, t);
	return step;
}
