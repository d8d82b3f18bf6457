/*
 * layout.c - detect what a source is (CheckpointManager root, step, item)
 * and build the view's nodes from Orbax's layout and metadata.  Everything
 * is read through the store interface (store.h: listdir, stat, read_small,
 * sub, ocdbt_open_on) from the source's root store, so a folder and an
 * object store are discovered alike.  Keys are '/'-separated paths below
 * the source ("" = the source itself).
 */
#include <cjson/cJSON.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "foreign.h"
#include "npy.h"
#include "orbax.h"
#include "tree_int.h"

#define MAX_JSON (64u << 20) /* _METADATA and friends */
/* Deepest folder mirrored below a non-pytree item, and the most nodes (files
 * and folders) mirrored for one such item: a folder that is not a checkpoint
 * item (a JSON item, a stray tree) never costs more than this. */
#define MIRROR_MAX_DEPTH 16
#define MIRROR_CAP 10000

/* key = dir + "/" + name (just name when dir is the root ""); 0 or -ENAMETOOLONG. */
static int key_join(char *buf, size_t cap, const char *dir, const char *name)
{
	int n = snprintf(buf, cap, "%s%s%s", dir, *dir ? "/" : "", name);
	return n >= 0 && (size_t)n < cap ? 0 : -ENAMETOOLONG;
}

/*
 * A read error is not a missing file.  What the layout reads (a stat, a
 * listing, a metadata file) is either there, missing (-ENOENT: the store
 * says so), or unreadable now (any other error: a 5xx after retries, a bad
 * answer, a listing that is not whole).  The first such error met while
 * this thread builds part of the tree is kept here; a build that met one
 * is thrown away by its caller (step_load, ckpt_layout_build_view,
 * ckpt_layout_list_steps), which answers the error and builds again next
 * time.  So an unreadable _METADATA never makes arrays appear flat, and an
 * unreadable marker never drops a step from the list.
 */
static _Thread_local int build_err, build_depth;

/* Note rc (the result of a call on store src) for the build under way.
 * Object stores only: there an error is an answer that may be different
 * next time (5xx, a bad page, a lost connection); a local folder's errors
 * (a special file, a symlink, a damaged file) are what the folder holds,
 * and stay where they are found (the entry is left out, or answers EIO). */
static void note_err(ckpt_store *src, int rc)
{
	if (rc < 0 && rc != -ENOENT && rc != -ENOTDIR && rc != -EISDIR && rc != -ENAMETOOLONG &&
	    build_depth && !build_err && src && ckpt_store_source_is_remote(src->root))
		build_err = rc;
}

/* Start a build: its own error slot (*saved keeps the one of a build
 * around it).  build_end returns this build's error and hands it on to
 * the build around it, if any. */
static void build_begin(int *saved)
{
	*saved = build_err;
	build_err = 0;
	build_depth++;
}

static int build_end(int saved)
{
	int rc = build_err;
	build_depth--;
	build_err = !build_depth ? 0 : saved ? saved : rc;
	return rc;
}

/* 1 when dir/name of store src exists as a file (want_dir 0) or folder
 * (want_dir 1); 0 when not, or when it cannot be told (noted). */
static int exists_in(ckpt_store *src, const char *dir, const char *name, int want_dir)
{
	char k[VIEW_PATH_MAX];
	struct ckpt_store_stat st;
	if (key_join(k, sizeof(k), dir, name) < 0)
		return 0;
	int rc = ckpt_store_stat(src, k, &st);
	if (rc < 0) {
		note_err(src, rc);
		return 0;
	}
	return want_dir ? st.is_dir : !st.is_dir;
}

/* The same in the source's store. */
static int exists_at(ckpt_view *v, const char *dir, const char *name, int want_dir)
{
	return exists_in(v->src, dir, name, want_dir);
}

static int ocdbt_cb(void *ctx, const char *name, const struct ckpt_store_stat *st)
{
	(void)ctx;
	(void)st;
	return strncmp(name, CKPT_ORBAX_OCDBT_PROCESS_PREFIX, strlen(CKPT_ORBAX_OCDBT_PROCESS_PREFIX)) == 0;
}

static int has_ocdbt_in(ckpt_store *src, const char *dir)
{
	if (exists_in(src, dir, CKPT_ORBAX_OCDBT_MANIFEST, 0))
		return 1;
	int rc = ckpt_store_listdir(src, dir, ocdbt_cb, NULL);
	note_err(src, rc);
	return rc > 0;
}

static int has_ocdbt(ckpt_view *v, const char *dir)
{
	return has_ocdbt_in(v->src, dir);
}

static int is_item(ckpt_view *v, const char *dir)
{
	return exists_at(v, dir, CKPT_ORBAX_METADATA, 0) || has_ocdbt(v, dir);
}

static cJSON *read_json_in(ckpt_store *src, const char *dir, const char *name)
{
	char k[VIEW_PATH_MAX];
	size_t len;
	char *txt;
	if (key_join(k, sizeof(k), dir, name) < 0)
		return NULL;
	int rc = ckpt_store_read_small(src, k, MAX_JSON, &txt, &len);
	if (rc < 0) {
		note_err(src, rc);
		return NULL;
	}
	cJSON *j = cJSON_ParseWithLength(txt, len);
	free(txt);
	if (!j)
		ckpt_log(CKPT_LOG_WARN, "%s/%s: invalid JSON, ignored", src->root, k);
	return j;
}

static cJSON *read_json(ckpt_view *v, const char *dir, const char *name)
{
	return read_json_in(v->src, dir, name);
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
	struct node *n = ckpt_node_new(v, &ckpt_file_ops, name, dir);
	if (!n)
		return NULL;
	struct file_node *f = to_file(n);
	f->store = v->src;
	f->key = strdup(key);
	f->size = size;
	n->mtime_ns = mtime;
	if (!f->key || ckpt_node_add_kid(dir, n) < 0)
		return NULL;
	return n;
}

/* add_file for dir/name when it is a file of the source. */
static void add_file_if(ckpt_view *v, struct node *dirn, const char *dir, const char *name, int64_t mtime)
{
	char k[VIEW_PATH_MAX];
	struct ckpt_store_stat st;
	if (ckpt_node_find_kid(dirn, name) || key_join(k, sizeof(k), dir, name) < 0)
		return;
	int rc = ckpt_store_stat(v->src, k, &st);
	note_err(v->src, rc);
	if (rc < 0 || st.is_dir)
		return;
	add_file(v, dirn, name, k, st.size, mtime);
}

static struct node *add_dir(ckpt_view *v, struct node *parent, const char *name, int64_t mtime)
{
	struct node *n = ckpt_node_find_kid(parent, name);
	if (n)
		return n->kind == N_DIR ? n : NULL;
	n = ckpt_node_new(v, &ckpt_dir_ops, name, parent);
	if (!n)
		return NULL;
	n->mtime_ns = mtime;
	if (ckpt_node_add_kid(parent, n) < 0)
		return NULL;
	return n;
}

/* ---- arrays that cannot be read ------------------------------------------ */

/* An array named by the metadata whose own metadata or store is unusable:
 * listed under its name, so that a copy of the tree fails instead of
 * silently leaving it out; reads answer -EIO.  The reason was logged when
 * the node was made. */
static void broken_attr(ckpt_view *v, struct node *n, ckpt_attr *a)
{
	(void)v;
	(void)n;
	a->mode = 0444;
	a->size = 0;
	a->immutable = 0;
	a->volatile_data = 1; /* direct I/O: every read reaches broken_read */
}

static ssize_t broken_read(ckpt_view *v, struct node *n, uint64_t off, size_t len, void *dst)
{
	(void)v;
	(void)off;
	(void)len;
	(void)dst;
	ckpt_log(CKPT_LOG_ERR, "%s: unreadable array (reason logged at mount)", n->name);
	return -EIO;
}

static const struct node_ops broken_ops = {
	.kind = N_BROKEN,
	.size = sizeof(struct node),
	.getattr = broken_attr,
	.read = broken_read,
};

static void add_broken(ckpt_view *v, struct node *dir, const char *where, const char *param,
		       const char *fname, const char *why, int64_t mtime)
{
	ckpt_log(CKPT_LOG_ERR, "%s: array %s cannot be read (%s): listed as %s, reads answer EIO", where,
		 param, why, fname);
	struct node *n = ckpt_node_new(v, &broken_ops, fname, dir);
	if (!n)
		return;
	n->mtime_ns = mtime;
	ckpt_node_add_kid(dir, n);
}

/* Add array `param` (store prefix) as file `fname` in dir (store NULL: the
 * item's store could not be opened). */
static void add_array(ckpt_view *v, struct node *dir, ckpt_store *store, int ocdbt, const char *param,
		      const char *fname, int format, int all_stored, const cJSON *sharding, int64_t mtime)
{
	if (ckpt_node_find_kid(dir, fname)) {
		ckpt_log(CKPT_LOG_WARN, "%s: name collision for array %s, left out",
			 store ? store->root : v->src->root, param);
		return;
	}
	if (!store) {
		add_broken(v, dir, v->src->root, param, fname, "its item's store cannot be opened", mtime);
		return;
	}
	ckpt_array *arr;
	ckpt_array_open_opts oo = { .format = format, .missing_is_error = all_stored };
	int rc = ckpt_array_open_ex(v->ctx, store, param, &oo, &arr);
	if (rc < 0) { /* the reason was logged by ckpt_array_open_ex */
		add_broken(v, dir, store->root, param, fname,
			   rc == -ENOENT ? "no zarr metadata" : strerror(-rc), mtime);
		return;
	}
	struct aref *ar = ckpt_node_new_aref(v, arr, ocdbt);
	if (!ar) {
		ckpt_array_destroy(arr);
		return;
	}
	if (v->live) { /* the step it belongs to: its cached data goes when the step is pruned */
		const struct node *s = dir;
		while (s && s->parent != CKPT_ROOT_INO)
			s = ckpt_node_at(v, s->parent);
		ckpt_lock(&v->res_lock, CKPT_RANK_RES); /* the aref is listed already */
		ar->step = s && s->ino != CKPT_ROOT_INO ? s->ino : 0;
		ckpt_unlock(&v->res_lock, CKPT_RANK_RES);
	}
	if (sharding) {
		char *key = ckpt_orbax_sharding_key(param);
		const cJSON *s = key ? cJSON_GetObjectItemCaseSensitive(sharding, key) : NULL;
		if (cJSON_IsString(s))
			ar->sharding = strdup(s->valuestring);
		free(key);
	}
	struct node *n = ckpt_node_new(v, &ckpt_array_ops, fname, dir);
	if (!n)
		return;
	const ckpt_array_meta *m = ckpt_array_meta_of(arr);
	ckpt_region r;
	ckpt_region_full(&r, m->rank, m->shape);
	if (ckpt_array_node_init(n, ar, &r) < 0)
		return;
	n->mtime_ns = mtime;
	ckpt_node_add_kid(dir, n);
}

static void add_string_leaf(ckpt_view *v, struct node *dir, const char *fname, const char *value,
			    int64_t mtime)
{
	struct node *n = ckpt_node_new(v, &ckpt_file_ops, fname, dir);
	if (!n)
		return;
	struct file_node *f = to_file(n);
	f->content = strdup(value);
	f->size = f->content ? strlen(f->content) : 0;
	n->mtime_ns = mtime;
	ckpt_node_add_kid(dir, n);
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
	if (!ckpt_node_find_kid(c->dir, fname))
		add_array(c->v, c->dir, c->store, c->ocdbt, param, fname,
			  strcmp(slash + 1, CKPT_ORBAX_ZARR3_META) ? 2 : 3, 0, NULL, c->mtime);
	return 0;
}

/* A pytree item folder (key `path` of store isrc: the source's store, or a
 * virtual item of a foreign format, foreign.h, whose synthesized metadata
 * files are not shown) -> dir's children. */
static void build_item_in(ckpt_view *v, struct node *dir, ckpt_store *isrc, const char *path, int64_t mtime)
{
	static const char *const meta_files[] = { CKPT_ORBAX_CKPT_METADATA, CKPT_ORBAX_METADATA,
						  CKPT_ORBAX_SHARDING, CKPT_ORBAX_COMMIT_SUCCESS,
						  CKPT_ORBAX_MARKER_FILE };
	int virt = isrc != v->src;
	for (size_t i = 0; !virt && i < sizeof(meta_files) / sizeof(meta_files[0]); i++)
		add_file_if(v, dir, path, meta_files[i], mtime);
	cJSON *meta = read_json_in(isrc, path, CKPT_ORBAX_METADATA);
	int ocdbt = has_ocdbt_in(isrc, path) ||
		    (meta && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(meta, "use_ocdbt")));
	ckpt_store *store = NULL;
	int rc = ocdbt ? ckpt_store_ocdbt_open_pool(isrc, path, ckpt_ctx_pool(v->ctx), &store)
		       : ckpt_store_sub(isrc, path, &store);
	if (rc < 0) {
		/* The arrays _METADATA names stay listed (reads answer EIO). */
		ckpt_log(CKPT_LOG_ERR, "%s/%s: cannot open the %s store (%s); its arrays answer EIO",
			 isrc->root, path, ocdbt ? "OCDBT" : "folder", strerror(-rc));
		store = NULL;
	} else if (ckpt_node_own_store(v, store, dir) < 0) {
		ckpt_store_destroy(store);
		cJSON_Delete(meta);
		return;
	}
	/* where log lines name the item: its store's root, or the item's folder
	 * when no store could be opened */
	char nowhere[VIEW_PATH_MAX];
	snprintf(nowhere, sizeof(nowhere), "%s%s%s", isrc->root, *path ? "/" : "", path);
	const char *where = store ? store->root : nowhere;
	cJSON *sharding = read_json_in(isrc, path, CKPT_ORBAX_SHARDING);
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
		if (!store)
			goto out;
		if (meta)
			ckpt_log(CKPT_LOG_ERR,
				 "%s/" CKPT_ORBAX_METADATA
				 ": no tree_metadata object; listing arrays from the store",
				 store->root);
		struct scan_ctx c = { v, dir, store, ocdbt, mtime };
		note_err(store, ckpt_store_list(store, "", scan_cb, &c));
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
				 where, leaf->string ? leaf->string : "?");
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
				 where, leaf->string ? leaf->string : "?");
			continue;
		}
		const char *type = vt->valuestring;
		char fname[VIEW_NAME_BUF];
		/* a virtual item (foreign.h) names each leaf's store key, and
		 * whether every chunk of it is stored */
		const cJSON *vkey = virt ? cJSON_GetObjectItemCaseSensitive(vm, CKPT_VITEM_KEY_MEMBER) : NULL;
		const cJSON *vall = virt ? cJSON_GetObjectItemCaseSensitive(vm, "ckptfs_all_stored") : NULL;
		if (cJSON_IsString(vkey) && strlen(vkey->valuestring) < sizeof(param))
			strcpy(param, vkey->valuestring);
		if (!strcmp(type, "jax.Array") || !strcmp(type, "np.ndarray") || !strcmp(type, "scalar")) {
			snprintf(fname, sizeof(fname), "%s.npy", esc);
			add_array(v, d, store, ocdbt, param, fname, format,
				  cJSON_IsBool(vall) ? cJSON_IsTrue(vall) : all_stored, sharding, mtime);
		} else if (!strcmp(type, "Dict") || !strcmp(type, "List") || !strcmp(type, "Tuple") ||
			   !strcmp(type, "NamedTuple")) {
			add_dir(v, d, esc, mtime);
		} else if (!strcmp(type, "string")) {
			if (!strings)
				strings = read_json_in(isrc, path, CKPT_ORBAX_STRINGS);
			const cJSON *s = strings ? cJSON_GetObjectItemCaseSensitive(strings, param) : NULL;
			snprintf(fname, sizeof(fname), "%s.txt", esc);
			if (cJSON_IsString(s) && !ckpt_node_find_kid(d, fname))
				add_string_leaf(v, d, fname, s->valuestring, mtime);
		}
		/* "None", "placeholder" and unknown types carry no data. */
	}
out:
	cJSON_Delete(meta);
	cJSON_Delete(sharding);
	cJSON_Delete(strings);
}

static void build_item(ckpt_view *v, struct node *dir, const char *path, int64_t mtime)
{
	build_item_in(v, dir, v->src, path, mtime);
}

/* `path` (a file or folder of the source) in a foreign format `f`
 * (foreign.h) -> dir's children, through its virtual item.  When it cannot
 * be read, dir holds one unreadable entry named after it (reads answer
 * EIO; the reason is logged): never an empty folder that looks fine. */
static int build_foreign(ckpt_view *v, struct node *dir, const char *path, const struct ckpt_foreign_fmt *f,
			 int64_t mtime)
{
	ckpt_store *item = NULL;
	struct ckpt_store_stat st = { 0 };
	int rc = ckpt_store_stat(v->src, path, &st);
	if (rc == 0)
		rc = f->open(v->src, path, &st, &item);
	if (rc == 0 && (rc = ckpt_node_own_store(v, item, dir)) < 0)
		ckpt_store_destroy(item);
	if (rc < 0) {
		const char *base = strrchr(path, '/');
		base = st.is_dir && f->main_file ? f->main_file : base ? base + 1 : *path ? path : f->name;
		char why[128];
		snprintf(why, sizeof(why), "its %s data cannot be read: %s", f->name, strerror(-rc));
		add_broken(v, dir, v->src->root, path, base, why, mtime);
		return rc;
	}
	build_item_in(v, dir, item, "", mtime);
	return 0;
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
	int rc = ckpt_store_listdir(v->src, dir, entry_cb, &e);
	note_err(v->src, rc);
	return rc;
}

struct walk_ctx {
	struct node *dir;
	int64_t mtime;
	int depth;
	size_t *budget; /* mirror walks: nodes still allowed (MIRROR_CAP per item) */
	const char *top; /* mirror walks: the item folder, for the log line */
};

static void mirror_dir(ckpt_view *v, struct node *dir, const char *path, int64_t mtime, int depth,
		       size_t *budget, const char *top);

/* A non-pytree item (e.g. JSON `metadata/metadata`): its regular files and folders. */
static void mirror_entry(ckpt_view *v, void *arg, const char *name, const char *key,
			 const struct ckpt_store_stat *st)
{
	struct walk_ctx *w = arg;
	if (*w->budget == 0)
		return;
	if (--*w->budget == 0)
		ckpt_log(CKPT_LOG_WARN, "%s/%s: more than %d files and folders; the rest are not shown",
			 v->source, w->top, MIRROR_CAP);
	if (!st->is_dir) {
		add_file(v, w->dir, name, key, st->size, w->mtime);
		return;
	}
	struct node *sub = add_dir(v, w->dir, name, w->mtime);
	if (sub)
		mirror_dir(v, sub, key, w->mtime, w->depth + 1, w->budget, w->top);
}

static void mirror_dir(ckpt_view *v, struct node *dir, const char *path, int64_t mtime, int depth,
		       size_t *budget, const char *top)
{
	if (depth > MIRROR_MAX_DEPTH || *budget == 0)
		return;
	struct walk_ctx w = { dir, mtime, depth, budget, top };
	for_each_entry(v, path, mirror_entry, &w);
}

/* Mirror the folder `path` (a non-pytree item) into dir, within MIRROR_CAP nodes. */
static void mirror_item(ckpt_view *v, struct node *dir, const char *path, int64_t mtime)
{
	size_t budget = MIRROR_CAP;
	mirror_dir(v, dir, path, mtime, 0, &budget, path);
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
	const struct ckpt_foreign_fmt *f = ckpt_foreign_probe(v->src, key, st);
	if (f)
		build_foreign(v, item, key, f, w->mtime);
	else if (is_item(v, key))
		build_item(v, item, key, w->mtime);
	else
		mirror_item(v, item, key, w->mtime);
}

static void build_step(ckpt_view *v, struct node *dir, const char *path, int64_t mtime)
{
	/* a step that is one foreign file or folder (legacy Flax checkpoint_<N>
	 * file, a T5X checkpoint_<N>/ folder, an old Orbax direct save) */
	const struct ckpt_foreign_fmt *f = ckpt_foreign_probe(v->src, path, NULL);
	if (f) {
		build_foreign(v, dir, path, f, mtime);
		return;
	}
	if (is_item(v, path)) { /* a direct (non-composite) save: the step is the item */
		build_item(v, dir, path, mtime);
		return;
	}
	struct walk_ctx w = { .dir = dir, .mtime = mtime };
	for_each_entry(v, path, step_entry, &w);
}

/* ---- committed steps of a root, built on first use ------------------------ */

/* A step folder of a CheckpointManager root: named at mount (or when a
 * rescan finds it), its commit time read when it is looked up or stat'ed,
 * its items built when something inside it is looked up or listed. */
struct step_node {
	struct dir_node d;
	pthread_mutex_t load_mu;
	atomic_bool loaded; /* kids built (release); they never change afterwards */
	atomic_bool timed; /* mtime is the commit time */
	_Atomic int64_t mtime; /* the folder's mtime, then the commit time */
};

static const struct node_ops step_ops;

static struct step_node *to_step(struct node *n)
{
	assert(n->ops == &step_ops);
	return container_of(to_dir(n), struct step_node, d);
}

void ckpt_layout_step_touch(ckpt_view *v, struct node *n)
{
	if (n->ops != &step_ops)
		return;
	struct step_node *s = to_step(n);
	if (atomic_load(&s->timed))
		return;
	/* Racing callers read the same file and store the same value; one
	 * that cannot be read now is read again next time. */
	int saved;
	build_begin(&saved);
	int64_t t = commit_time(v, n->name, atomic_load(&s->mtime));
	if (build_end(saved) == 0) {
		atomic_store(&s->mtime, t);
		atomic_store(&s->timed, true);
	}
}

/* The kids built so far go (a build that met a read error): unlinked,
 * orphaned, freed at unmount like those of a pruned step. */
static void drop_kids(struct node *n)
{
	struct dir_node *d = to_dir(n);
	while (d->nkids) {
		struct node *k = d->kids[d->nkids - 1];
		ckpt_node_remove_kid(n, k);
		atomic_store(&k->orphan, true);
	}
}

static int step_load(ckpt_view *v, struct node *n)
{
	struct step_node *s = to_step(n);
	if (atomic_load_explicit(&s->loaded, memory_order_acquire))
		return 0;
	int rc = 0;
	ckpt_lock(&s->load_mu, CKPT_RANK_LOAD);
	if (!atomic_load_explicit(&s->loaded, memory_order_relaxed)) {
		ckpt_layout_step_touch(v, n);
		int saved;
		build_begin(&saved);
		build_step(v, n, n->name, atomic_load(&s->mtime));
		rc = build_end(saved);
		if (rc) {
			drop_kids(n);
			ckpt_log(CKPT_LOG_ERR,
				 "%s/%s: cannot be read now (%s): the lookup fails and is tried again on the "
				 "next "
				 "one",
				 v->src->root, n->name, strerror(-rc));
			rc = -EIO;
		} else {
			atomic_store_explicit(&s->loaded, true, memory_order_release);
		}
	}
	ckpt_unlock(&s->load_mu, CKPT_RANK_LOAD);
	return rc;
}

static void step_attr(ckpt_view *v, struct node *n, ckpt_attr *a)
{
	ckpt_dir_ops.getattr(v, n, a);
	a->mtime_ns = atomic_load(&to_step(n)->mtime);
	if (v->live)
		a->immutable = 0; /* it may be pruned */
}

static int step_readdir(ckpt_view *v, struct node *dir, uint64_t index, struct node **out)
{
	int rc = step_load(v, dir);
	return rc ? rc : ckpt_dir_ops.readdir(v, dir, index, out);
}

static int step_lookup(ckpt_view *v, struct node *dir, const char *name, struct node **out)
{
	int rc = step_load(v, dir);
	return rc ? rc : ckpt_dir_ops.lookup(v, dir, name, out);
}

/* Extended attributes of a committed step of a root: what `ckptfs info
 * ROOT` prints on the step's line.  Called with no view lock held. */
static const char *const step_xattrs[] = { "user.ckpt.step",	     "user.ckpt.committed",
					   "user.ckpt.arrays",	     "user.ckpt.logical_bytes",
					   "user.ckpt.stored_bytes", "user.ckpt.unreadable" };

static ssize_t step_getxattr(ckpt_view *v, struct node *n, const char *name, char *buf, size_t cap)
{
	char val[64];
	if (!strcmp(name, step_xattrs[0])) {
		snprintf(val, sizeof(val), "%s", n->name);
	} else if (!strcmp(name, step_xattrs[1])) {
		ckpt_layout_step_touch(v, n);
		int64_t ns = atomic_load(&to_step(n)->mtime);
		time_t sec = (time_t)(ns / 1000000000);
		struct tm tm;
		gmtime_r(&sec, &tm);
		strftime(val, sizeof(val), "%Y-%m-%dT%H:%M:%SZ", &tm);
	} else {
		size_t k = 2;
		while (k < sizeof(step_xattrs) / sizeof(step_xattrs[0]) && strcmp(name, step_xattrs[k]))
			k++;
		if (k == sizeof(step_xattrs) / sizeof(step_xattrs[0]))
			return -ENODATA;
		struct summary_totals t;
		int rc = ckpt_summary_totals(v, n->ino, &t);
		if (rc < 0)
			return rc;
		uint64_t x = k == 2 ? t.arrays : k == 3 ? t.logical : k == 4 ? t.stored : t.unreadable;
		snprintf(val, sizeof(val), "%llu", (unsigned long long)x);
	}
	size_t len = strlen(val);
	if (cap == 0)
		return (ssize_t)len;
	if (len > cap)
		return -ERANGE;
	memcpy(buf, val, len);
	return (ssize_t)len;
}

static ssize_t step_listxattr(ckpt_view *v, struct node *n, char *buf, size_t cap)
{
	(void)v;
	(void)n;
	return ckpt_xattr_list(step_xattrs, sizeof(step_xattrs) / sizeof(step_xattrs[0]), NULL, buf, cap);
}

static void step_destroy(ckpt_view *v, struct node *n)
{
	(void)v;
	pthread_mutex_destroy(&to_step(n)->load_mu);
}

static const struct node_ops step_ops = {
	.kind = N_DIR,
	.size = sizeof(struct step_node),
	.getattr = step_attr,
	.readdir = step_readdir,
	.lookup = step_lookup,
	.getxattr = step_getxattr,
	.listxattr = step_listxattr,
	.load = step_load,
	.destroy = step_destroy,
};

/* A step node of the root, not linked yet. */
static struct node *new_step_node(ckpt_view *v, const char *name, int64_t mtime)
{
	struct node *root = ckpt_node_at(v, CKPT_ROOT_INO);
	struct node *n = ckpt_node_new(v, &step_ops, name, root);
	if (!n)
		return NULL;
	struct step_node *s = to_step(n);
	pthread_mutex_init(&s->load_mu, NULL);
	atomic_init(&s->loaded, false);
	atomic_init(&s->timed, false);
	atomic_init(&s->mtime, mtime);
	n->mtime_ns = mtime;
	if (v->live)
		ckpt_node_step_track(n); /* freed with all its nodes once pruned */
	return n;
}

/* The folders of a root that are steps: not the manager's metadata/ folder,
 * not hidden, not unfinished (for_each_entry skips those). */
static int is_t5x_tmp(const char *name);

static int is_step_folder(const char *name, const struct ckpt_store_stat *st)
{
	return st->is_dir && strcmp(name, CKPT_ORBAX_ROOT_METADATA_DIR) != 0 && !is_t5x_tmp(name);
}

/* A step that is one file (legacy Flax's checkpoint_<N>): a step name and
 * content a foreign translator claims. */
static int is_step_file(ckpt_view *v, const char *name, const struct ckpt_store_stat *st)
{
	return !st->is_dir && ckpt_orbax_step_number(name, NULL) && ckpt_foreign_probe(v->src, name, st);
}

/* T5X saves a step into "<step name>.tmp-<seconds>" and renames it: unfinished. */
static int is_t5x_tmp(const char *name)
{
	const char *t = strstr(name, ".tmp-");
	if (!t || !t[5] || t == name)
		return 0;
	for (const char *p = t + 5; *p; p++)
		if (*p < '0' || *p > '9')
			return 0;
	char step[VIEW_NAME_BUF];
	size_t n = (size_t)(t - name);
	if (n >= sizeof(step))
		return 0;
	memcpy(step, name, n);
	step[n] = 0;
	return ckpt_orbax_step_number(step, NULL);
}

/* Legacy Flax keeps the arrays of step file X that were not written inline
 * in folder X_gda/: part of step X, not a step of its own. */
static int is_gda_folder(ckpt_view *v, const char *name, const struct ckpt_store_stat *st)
{
	size_t n = strlen(name);
	char file[VIEW_NAME_BUF];
	if (!st->is_dir || n <= 4 || n - 4 >= sizeof(file) || strcmp(name + n - 4, "_gda") != 0)
		return 0;
	memcpy(file, name, n - 4);
	file[n - 4] = 0;
	return ckpt_orbax_step_number(file, NULL) && exists_at(v, "", file, 0);
}

/* Object stores have no atomic rename: there Orbax writes a step under its
 * final name and writes commit_success.txt last, so a step folder without
 * it is still being written (on a file system the tmp-folder rename is the
 * commit, and commit_success.txt is optional). */
static int step_committed(ckpt_view *v, const char *name)
{
	if (!ckpt_store_source_is_remote(v->source) || exists_at(v, name, CKPT_ORBAX_COMMIT_SUCCESS, 0))
		return 1;
	/* Flax and T5X steps (foreign.h) have no such marker: there the file that
	 * describes the step (a step file, a folder's `checkpoint`) is written
	 * last.  Not a folder of bare zarr arrays: that may be an Orbax step
	 * still being written. */
	struct ckpt_store_stat st;
	int rc = ckpt_store_stat(v->src, name, &st);
	if (rc < 0) {
		note_err(v->src, rc);
		return 0;
	}
	const struct ckpt_foreign_fmt *f = ckpt_foreign_probe(v->src, name, &st);
	return f && (!st.is_dir || f->main_file);
}

static void root_entry(ckpt_view *v, void *arg, const char *name, const char *key,
		       const struct ckpt_store_stat *st)
{
	(void)key;
	struct node *root = arg;
	if (!(is_step_folder(name, st) || is_step_file(v, name, st)) || is_gda_folder(v, name, st) ||
	    !step_committed(v, name))
		return;
	struct node *step = new_step_node(v, name, st->mtime_ns ? st->mtime_ns : root->mtime_ns);
	if (step)
		ckpt_node_add_kid(root, step);
}

struct layout_steps {
	char **names;
	int64_t *mtime;
	size_t n, cap;
	int oom;
};

static void list_entry(ckpt_view *v, void *arg, const char *name, const char *key,
		       const struct ckpt_store_stat *st)
{
	(void)key;
	struct layout_steps *l = arg;
	if (!(is_step_folder(name, st) || is_step_file(v, name, st)) || is_gda_folder(v, name, st) || l->oom)
		return;
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 64;
		char **nm = realloc(l->names, cap * sizeof(*nm));
		if (nm)
			l->names = nm;
		int64_t *mt = realloc(l->mtime, cap * sizeof(*mt));
		if (mt)
			l->mtime = mt;
		if (!nm || !mt) {
			l->oom = 1;
			return;
		}
		l->cap = cap;
	}
	if (!(l->names[l->n] = strdup(name))) {
		l->oom = 1;
		return;
	}
	l->mtime[l->n++] = st->mtime_ns;
}

static void free_steps(struct layout_steps *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->names[i]);
	free(l->names);
	free(l->mtime);
	free(l);
}

int ckpt_layout_list_steps(ckpt_view *v, struct layout_steps **out)
{
	struct layout_steps *l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	int saved;
	build_begin(&saved);
	int rc = for_each_entry(v, "", list_entry, l);
	if (rc == 0 && l->oom)
		rc = -ENOMEM;
	if (rc < 0) {
		build_end(saved);
		ckpt_log(CKPT_LOG_ERR, "%s: cannot list the root again: %s", v->src->root, strerror(-rc));
		free_steps(l);
		return rc;
	}
	if (ckpt_store_source_is_remote(v->source)) {
		/* New names only (a step shown stays until it vanishes): drop
		 * those without their commit marker yet; the next rescan looks again. */
		struct node *root = ckpt_node_at(v, CKPT_ROOT_INO);
		size_t keep = 0;
		for (size_t i = 0; i < l->n; i++) {
			ckpt_rdlock(&v->ns_lock, CKPT_RANK_NS);
			int known = ckpt_node_find_kid(root, l->names[i]) != NULL;
			ckpt_rwunlock(&v->ns_lock, CKPT_RANK_NS);
			if (known || step_committed(v, l->names[i])) {
				l->names[keep] = l->names[i];
				l->mtime[keep++] = l->mtime[i];
			} else {
				free(l->names[i]);
			}
		}
		l->n = keep;
	}
	/* a step whose marker could not be checked: the list is not known */
	rc = build_end(saved);
	if (rc < 0) {
		ckpt_log(CKPT_LOG_ERR, "%s: cannot list the root again: %s", v->src->root, strerror(-rc));
		free_steps(l);
		return rc;
	}
	*out = l;
	return 0;
}

static int listed(const struct layout_steps *l, const char *name)
{
	for (size_t i = 0; i < l->n; i++)
		if (!strcmp(l->names[i], name))
			return 1;
	return 0;
}

/* The root's list of steps has one owner, this file: a pending step
 * (pending/step.c) only says, through its ops, which final name it takes while
 * it commits. */
int ckpt_name_reserved(struct node *root, const char *name)
{
	struct dir_node *d = to_dir(root);
	for (size_t i = 0; i < d->nkids; i++) {
		struct node *k = d->kids[i];
		const char *final = k->ops->reserves ? k->ops->reserves(k) : NULL;
		if (final && !strcmp(final, name))
			return 1;
	}
	return 0;
}

int ckpt_layout_apply_steps(ckpt_view *v, struct layout_steps *l)
{
	int changes = 0;
	struct node *root = ckpt_node_at(v, CKPT_ROOT_INO);
	struct dir_node *d = to_dir(root);
	/* Vanished: committed steps no longer in the source.  Pending steps
	 * live in tmp folders and are never listed. */
	for (size_t i = d->nkids; i-- > 0;) {
		struct node *k = d->kids[i];
		if (k->ops != &step_ops || listed(l, k->name))
			continue;
		ckpt_node_remove_kid(root, k);
		atomic_store(&k->gone, true);
		atomic_store(&k->orphan, true);
		ckpt_node_step_gone(v, k); /* freed once the kernel forgets it (node.c) */
		changes++;
		ckpt_log(CKPT_LOG_INFO, "%s: step %s is gone from the source", v->src->root, k->name);
	}
	for (size_t i = 0; i < l->n; i++) {
		const char *name = l->names[i];
		/* A step committing through the mount links its own node. */
		if (ckpt_node_find_kid(root, name) || ckpt_name_reserved(root, name))
			continue;
		struct node *n = new_step_node(v, name, l->mtime[i] ? l->mtime[i] : root->mtime_ns);
		if (!n || ckpt_node_add_kid(root, n) < 0)
			break;
		changes++;
		ckpt_log(CKPT_LOG_INFO, "%s: new step %s", v->src->root, name);
	}
	free_steps(l);
	return changes;
}

/* ---- what SOURCE is ----------------------------------------------------------- */

#define STEP_FILE_PROBE_MAX 8 /* step-named files whose content is looked at */

struct probe {
	size_t entries, steps;
	char *files[STEP_FILE_PROBE_MAX]; /* step-named files (legacy Flax steps?) */
	struct ckpt_store_stat fst[STEP_FILE_PROBE_MAX];
	int nfiles;
};

static int probe_cb(void *ctx, const char *name, const struct ckpt_store_stat *st)
{
	struct probe *p = ctx;
	p->entries++;
	if (st->is_dir && (ckpt_orbax_step_number(name, NULL) || ckpt_orbax_is_unfinished(name)))
		p->steps++;
	if (!st->is_dir && name[0] != '.' && ckpt_orbax_step_number(name, NULL) &&
	    p->nfiles < STEP_FILE_PROBE_MAX && (p->files[p->nfiles] = strdup(name))) {
		p->fst[p->nfiles++] = *st;
	}
	return 0;
}

/* Step files among those probe_cb noted (the names first, then the reads:
 * no store call inside a listing). */
static void probe_step_files(ckpt_view *v, struct probe *p)
{
	for (int i = 0; i < p->nfiles; i++) {
		if (ckpt_foreign_probe(v->src, p->files[i], &p->fst[i]))
			p->steps++;
		free(p->files[i]);
	}
	p->nfiles = 0;
}

/* SOURCE is one file (a local one, or an object of an object store): a
 * foreign format's (an .npz archive, a legacy Flax checkpoint_<N> file,
 * ...) or refused.  The source's store is the file's folder (the object's
 * parent prefix). */
static int build_single_file(ckpt_view *v, const char *source, int remote)
{
	char *dir = strdup(source);
	if (!dir)
		return -ENOMEM;
	char *slash = strrchr(dir, '/');
	const char *name = slash ? slash + 1 : dir;
	ckpt_store *src = NULL;
	int rc;
	if (remote) {
		*slash = 0; /* "s3://bucket/x.npz" -> "s3://bucket" */
		rc = ckpt_store_open_source(dir, v->opts.store, &src);
	} else {
		rc = slash ? (slash == dir ? ckpt_store_dir_open("/", &src)
					   : (*slash = 0, ckpt_store_dir_open(dir, &src)))
			   : ckpt_store_dir_open(".", &src);
	}
	if (rc == 0 && (rc = ckpt_node_own_store(v, src, NULL)) < 0)
		ckpt_store_destroy(src);
	if (rc < 0) {
		free(dir);
		return rc;
	}
	v->src = src;
	struct ckpt_store_stat st;
	const struct ckpt_foreign_fmt *f = NULL;
	if ((rc = ckpt_store_stat(src, name, &st)) == 0 && !st.is_dir)
		f = ckpt_foreign_probe(src, name, &st);
	if (!f) {
		ckpt_log(CKPT_LOG_ERR, "%s: not a checkpoint file: it is none of %s", source,
			 ckpt_foreign_what());
		free(dir);
		return rc < 0 ? rc : -EMEDIUMTYPE;
	}
	ckpt_store *item = NULL;
	if ((rc = f->open(src, name, &st, &item)) == 0 && (rc = ckpt_node_own_store(v, item, NULL)) < 0)
		ckpt_store_destroy(item);
	free(dir);
	if (rc < 0)
		return rc;
	v->kind = "item";
	struct node *root = ckpt_node_at(v, CKPT_ROOT_INO);
	root->mtime_ns = st.mtime_ns;
	build_item_in(v, root, item, "", root->mtime_ns);
	return 0;
}

/* A step Orbax wrote before _CHECKPOINT_METADATA existed has only its item
 * folders (each with _METADATA, or OCDBT, ...) and perhaps commit_success.txt:
 * a folder with at least one item folder among its visible subfolders is a
 * step (asked only when the folder has no step folders, so a root whose
 * steps are direct saves stays a root). */
#define ITEM_PROBE_MAX 64 /* subfolders looked at */

struct item_probe {
	char *names[ITEM_PROBE_MAX];
	int n;
};

static int item_probe_cb(void *ctx, const char *name, const struct ckpt_store_stat *st)
{
	struct item_probe *p = ctx;
	if (!st->is_dir || name[0] == '.' || ckpt_orbax_is_unfinished(name))
		return 0;
	if (p->n == ITEM_PROBE_MAX || !(p->names[p->n] = strdup(name)))
		return 1;
	p->n++;
	return 0;
}

static int has_item_folder(ckpt_view *v)
{
	struct item_probe p = { .n = 0 };
	int found = 0;
	/* the names first, then the checks: no store call inside a listing */
	if (ckpt_store_listdir(v->src, "", item_probe_cb, &p) >= 0)
		for (int i = 0; i < p.n && !found; i++)
			found = is_item(v, p.names[i]);
	for (int i = 0; i < p.n; i++)
		free(p.names[i]);
	return found;
}

/* 1 when an object-store SOURCE "scheme://bucket/.../name" names an object
 * (a file of its parent prefix). */
static int remote_file(ckpt_view *v, const char *source)
{
	if (!ckpt_store_source_is_remote(source))
		return 0;
	const char *b = strstr(source, "://");
	const char *slash = b ? strrchr(b + 3, '/') : NULL;
	if (!slash || !slash[1])
		return 0;
	char *dir = strndup(source, (size_t)(slash - source));
	ckpt_store *s = NULL;
	struct ckpt_store_stat st;
	int is_file = dir && ckpt_store_open_source(dir, v->opts.store, &s) == 0 &&
		      ckpt_store_stat(s, slash + 1, &st) == 0 && !st.is_dir;
	ckpt_store_destroy(s);
	free(dir);
	return is_file;
}

static int build_view(ckpt_view *v, const char *source, ckpt_store *given);

/* The view of SOURCE; a read error met on the way (a stat, a listing or a
 * metadata file that cannot be read now) fails it: its kind and shape are
 * never guessed from what could be read. */
int ckpt_layout_build_view(ckpt_view *v, const char *source, ckpt_store *given)
{
	int saved;
	build_begin(&saved);
	int rc = build_view(v, source, given);
	int err = build_end(saved);
	if (rc == 0 && err < 0) {
		ckpt_log(CKPT_LOG_ERR, "%s: cannot be read now (%s); not mounted", source, strerror(-err));
		rc = -EIO;
	}
	return rc;
}

static int build_view(ckpt_view *v, const char *source, ckpt_store *given)
{
	struct stat sb;
	if (!given && !ckpt_store_source_is_remote(source) && stat(source, &sb) == 0 && S_ISREG(sb.st_mode))
		return build_single_file(v, source, 0);
	ckpt_store *src = given ? ckpt_store_ref(given) : NULL;
	int rc = given ? 0 : ckpt_store_open_source(source, v->opts.store, &src);
	if (rc < 0)
		return rc;
	if ((rc = ckpt_node_own_store(v, src, NULL)) < 0) {
		ckpt_store_destroy(src);
		return rc;
	}
	v->src = src;
	struct ckpt_store_stat st;
	if ((rc = ckpt_store_stat(src, "", &st)) < 0)
		return rc;
	if (!st.is_dir)
		return -ENOTDIR;
	struct node *root = ckpt_node_at(v, CKPT_ROOT_INO);
	int64_t now = st.mtime_ns;
	const struct ckpt_foreign_fmt *f = ckpt_foreign_probe(src, "", &st);
	if (f) { /* an item or step in a foreign format (foreign.h) */
		ckpt_store *item = NULL;
		if ((rc = f->open(src, "", &st, &item)) < 0)
			return rc;
		if ((rc = ckpt_node_own_store(v, item, NULL)) < 0) {
			ckpt_store_destroy(item);
			return rc;
		}
		v->kind = "item";
		root->mtime_ns = commit_time(v, "", now);
		build_item_in(v, root, item, "", root->mtime_ns);
		return 0;
	}
	if (is_item(v, "")) {
		v->kind = "item";
		root->mtime_ns = commit_time(v, "", now);
		build_item(v, root, "", root->mtime_ns);
		return 0;
	}
	if (exists_at(v, "", CKPT_ORBAX_CKPT_METADATA, 0) || exists_at(v, "", CKPT_ORBAX_MARKER_FILE, 0)) {
		v->kind = "step";
		root->mtime_ns = commit_time(v, "", now);
		build_step(v, root, "", root->mtime_ns);
		return 0;
	}
	struct probe p = { .entries = 0 };
	rc = ckpt_store_listdir(src, "", probe_cb, &p);
	probe_step_files(v, &p);
	if (rc < 0)
		return rc;
	/* "s3://bucket/x.npz" names an object, not a prefix: nothing below it */
	if (p.entries == 0 && !given && remote_file(v, source))
		return build_single_file(v, source, 1);
	if (p.entries && !p.steps && !v->opts.force_root && has_item_folder(v)) {
		v->kind = "step";
		root->mtime_ns = commit_time(v, "", now);
		build_step(v, root, "", root->mtime_ns);
		return 0;
	}
	if (p.entries && !p.steps && !v->opts.force_root) {
		ckpt_log(CKPT_LOG_ERR,
			 "%s: not a checkpoint: found none of " CKPT_ORBAX_METADATA
			 " or " CKPT_ORBAX_OCDBT_MANIFEST " / " CKPT_ORBAX_OCDBT_PROCESS_PREFIX
			 "* (an item), " CKPT_ORBAX_CKPT_METADATA " or " CKPT_ORBAX_MARKER_FILE
			 " or an item folder (a step), or a step folder such as 30/ or step_30/ (a "
			 "CheckpointManager root), "
			 "or any of %s; "
			 "mount it with -o root to use this non-empty folder as a root for new steps anyway",
			 src->root, ckpt_foreign_what());
		return -EMEDIUMTYPE;
	}
	v->kind = "root";
	v->live = 1;
	root->mtime_ns = now;
	return for_each_entry(v, "", root_entry, root);
}

struct node *ckpt_layout_new_step(ckpt_view *v, const char *name)
{
	struct node *root = ckpt_node_at(v, CKPT_ROOT_INO);
	struct node *step = new_step_node(v, name, root->mtime_ns);
	if (step)
		step_load(v, step); /* just committed: read it back now */
	return step;
}

struct node *ckpt_layout_new_item(ckpt_view *v, const char *path)
{
	struct node *root = ckpt_node_at(v, CKPT_ROOT_INO);
	struct node *n = ckpt_node_new(v, &ckpt_dir_ops, "item", root);
	if (n)
		build_item(v, n, path, 0);
	return n;
}
