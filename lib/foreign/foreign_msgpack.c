/*
 * foreign_msgpack.c - checkpoints whose tree is a MessagePack document:
 *
 *   - a folder holding a `checkpoint` file: an item of Orbax before 0.5.16
 *     (the aggregate file: leaves "PLACEHOLDER://<name>" or
 *     "AGGREGATED://<name>" for arrays TensorStore wrote into a zarr folder
 *     <name>/ of the item or into the item's OCDBT database under <name>/,
 *     other leaves inline), a Flax save_checkpoint step of the Orbax era
 *     (every array inline), or a T5X step (partitioned leaves are
 *     TensorStore spec maps pointing at zarr folders of the step);
 *   - one file `checkpoint_<N>` of legacy Flax (flax.training.checkpoints
 *     without Orbax): inline arrays, "//GDAPlaceholder:<path>" leaves for
 *     arrays in <file>_gda/<path>.
 *
 * Inline arrays (Flax's ext type 1 / 3 values, in pieces under
 * __msgpack_chunked_array__ past 2^30 bytes) are served as byte ranges of
 * the file; nothing but the structure is read (format/msgpack.h).  Lists
 * (msgpack arrays, or Flax's maps keyed "0", "1", ...) and tuples are
 * folders like maps; Python scalars are 0-d arrays (int64, float64, bool,
 * complex128); strings are NAME.txt; None leaves nothing.
 */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "foreign.h"
#include "msgpack.h"
#include "orbax.h"

#define CHECKPOINT_FILE "checkpoint"
#define PH_PREFIX "PLACEHOLDER://"
#define AGG_PREFIX "AGGREGATED://"
#define GDA_PREFIX "//GDAPlaceholder:"
#define GDA_SUFFIX "_gda"
#define CHUNKED_KEY "__msgpack_chunked_array__"
#define MAX_JSON (64u << 20)

struct mctx {
	ckpt_store *src;
	const char *file; /* the msgpack file (key of src) */
	const char *dir; /* the folder placeholders are relative to ("" = src's root) */
	ckpt_store *ocdbt; /* dir's OCDBT database, opened on first need */
	int ocdbt_tried;
	struct subdb *subdbs; /* databases of dir's subfolders, tried so far */
	char **folders; /* dir's subfolders, sorted (listed once: no stat for a name not there) */
	size_t nfolders;
	int listed; /* 1 listed, -1 could not be listed (then every name is looked up) */
	cJSON *strings; /* dir's _strings.json */
	int strings_tried;
	struct mkey *mkeys; /* dir's _METADATA leaves with no data, sorted by path */
	size_t nmkeys;
	int meta_tried;
	struct ckpt_vitem *vi;
	const char *path[CKPT_ORBAX_MAX_DEPTH];
	char num[CKPT_ORBAX_MAX_DEPTH][24]; /* integer keys as text */
	int depth;
	size_t unreadable;
};

/* The OCDBT database of a subfolder of the item (NULL: none there). */
struct subdb {
	char *dir;
	ckpt_store *db;
	struct subdb *next;
};

static ckpt_store *subdb_of(struct mctx *c, const char *dir)
{
	for (struct subdb *d = c->subdbs; d; d = d->next)
		if (!strcmp(d->dir, dir))
			return d->db;
	struct subdb *d = calloc(1, sizeof(*d));
	if (!d || !(d->dir = strdup(dir))) {
		free(d);
		return NULL;
	}
	if (ckpt_store_ocdbt_open_on(c->src, dir, &d->db) < 0)
		d->db = NULL;
	d->next = c->subdbs;
	c->subdbs = d;
	return d->db;
}

struct frd {
	ckpt_store *s;
	const char *key;
};

static ssize_t fread_cb(void *ctx, uint64_t off, size_t len, void *dst)
{
	struct frd *r = ctx;
	return ckpt_store_read(r->s, r->key, off, len, dst);
}

static char *join(const char *a, const char *b)
{
	size_t na = strlen(a), nb = strlen(b);
	char *s = malloc(na + nb + 2);
	if (!s)
		return NULL;
	memcpy(s, a, na);
	size_t o = na;
	if (na && nb)
		s[o++] = '/';
	memcpy(s + o, b, nb + 1);
	return s;
}

static void where(const struct mctx *c, char *buf, size_t cap)
{
	size_t o = 0;
	buf[0] = 0;
	for (int i = 0; i < c->depth && o < cap; i++)
		o += (size_t)snprintf(buf + o, cap - o, "%s%s", i ? "/" : "", c->path[i]);
}

static int unreadable(struct mctx *c, const char *why)
{
	char w[1024];
	where(c, w, sizeof(w));
	ckpt_log(CKPT_LOG_ERR, "%s/%s: leaf %s cannot be read (%s); listed, reads answer EIO", c->src->root,
		 c->file, w, why);
	c->unreadable++;
	return ckpt_vitem_add_unreadable(c->vi, c->path, c->depth);
}

/* 1 when folder `dir` of s holds zarr metadata. */
static int zarr_folder(ckpt_store *s, const char *dir)
{
	static const char *const metas[] = { CKPT_ORBAX_ZARR2_META, CKPT_ORBAX_ZARR3_META };
	for (int i = 0; i < 2; i++) {
		char *k = join(dir, metas[i]);
		struct ckpt_store_stat st;
		int ok = k && ckpt_store_stat(s, k, &st) == 0 && !st.is_dir;
		free(k);
		if (ok)
			return 1;
	}
	return 0;
}

/* An array TensorStore wrote under `name` (an item's param name, or a T5X
 * spec's relative path): a zarr folder of dir, else the dir's OCDBT
 * database; else a string leaf of _strings.json. */
static int dir_cb(void *ctx, const char *name, const struct ckpt_store_stat *st)
{
	struct mctx *c = ctx;
	if (!st->is_dir)
		return 0;
	if ((c->nfolders & (c->nfolders + 1)) == 0 || !c->folders) { /* grow at 0, 1, 3, 7, ... */
		char **v = realloc(c->folders, (2 * c->nfolders + 2) * sizeof(*v));
		if (!v)
			return -ENOMEM;
		c->folders = v;
	}
	if (!(c->folders[c->nfolders] = strdup(name)))
		return -ENOMEM;
	c->nfolders++;
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* 0 when dir surely has no subfolder named as name's first component. */
static int maybe_folder(struct mctx *c, const char *name)
{
	if (!c->listed) {
		c->listed = ckpt_store_listdir(c->src, c->dir, dir_cb, c) < 0 ? -1 : 1;
		if (c->listed > 0 && c->nfolders)
			qsort(c->folders, c->nfolders, sizeof(*c->folders), cmp_str);
	}
	if (c->listed < 0)
		return 1;
	char first[256];
	size_t n = strcspn(name, "/");
	if (n >= sizeof(first))
		return 1;
	memcpy(first, name, n);
	first[n] = 0;
	const char *key = first;
	return c->nfolders && bsearch(&key, c->folders, c->nfolders, sizeof(*c->folders), cmp_str) != NULL;
}

/* A leaf of the item's _METADATA that carries no data: its key path (keys
 * joined by 0x1f) and whether it is an empty container (else None). */
struct mkey {
	char *path;
	int container;
};

static int mkey_cmp(const void *a, const void *b)
{
	return strcmp(((const struct mkey *)a)->path, ((const struct mkey *)b)->path);
}

#define MKEY_SEP '\x1f'

/* Collect the _METADATA leaves whose value_type carries no data (Orbax 0.5
 * writes a placeholder for them in `checkpoint` too, with an empty folder,
 * and restores them from _METADATA as {} / [] / None). */
static void meta_load(struct mctx *c)
{
	c->meta_tried = 1;
	char *k = join(c->dir, CKPT_ORBAX_METADATA);
	char *txt = NULL;
	size_t len;
	cJSON *meta = NULL;
	if (k && ckpt_store_read_small(c->src, k, MAX_JSON, &txt, &len) == 0)
		meta = cJSON_ParseWithLength(txt, len);
	free(txt);
	free(k);
	const cJSON *tree = meta ? cJSON_GetObjectItemCaseSensitive(meta, "tree_metadata") : NULL;
	const cJSON *e;
	size_t cap = 0;
	cJSON_ArrayForEach(e, tree)
	{
		const cJSON *vm = cJSON_GetObjectItemCaseSensitive(e, "value_metadata");
		const cJSON *vt = cJSON_GetObjectItemCaseSensitive(vm, "value_type");
		const cJSON *km = cJSON_GetObjectItemCaseSensitive(e, "key_metadata");
		if (!cJSON_IsString(vt) || !cJSON_IsArray(km))
			continue;
		const char *t = vt->valuestring;
		int container = !strcmp(t, "Dict") || !strcmp(t, "List") || !strcmp(t, "Tuple") ||
				!strcmp(t, "NamedTuple");
		if (!container && strcmp(t, "None") != 0)
			continue;
		size_t plen = 0;
		const cJSON *ke;
		cJSON_ArrayForEach(ke, km)
		{
			const cJSON *kk = cJSON_GetObjectItemCaseSensitive(ke, "key");
			plen += (cJSON_IsString(kk) ? strlen(kk->valuestring) : 24) + 1;
		}
		char *path = malloc(plen + 1);
		if (!path)
			break;
		size_t o = 0;
		cJSON_ArrayForEach(ke, km)
		{
			const cJSON *kk = cJSON_GetObjectItemCaseSensitive(ke, "key");
			if (o)
				path[o++] = MKEY_SEP;
			if (cJSON_IsString(kk))
				o += (size_t)snprintf(path + o, plen + 1 - o, "%s", kk->valuestring);
			else if (cJSON_IsNumber(kk))
				o += (size_t)snprintf(path + o, plen + 1 - o, "%.0f", kk->valuedouble);
		}
		path[o] = 0;
		if (c->nmkeys == cap) {
			size_t nc = cap ? 2 * cap : 16;
			struct mkey *v = realloc(c->mkeys, nc * sizeof(*v));
			if (!v) {
				free(path);
				break;
			}
			c->mkeys = v;
			cap = nc;
		}
		c->mkeys[c->nmkeys].path = path;
		c->mkeys[c->nmkeys++].container = container;
	}
	cJSON_Delete(meta);
	if (c->nmkeys)
		qsort(c->mkeys, c->nmkeys, sizeof(*c->mkeys), mkey_cmp);
}

/* The _METADATA entry of the current key path when it carries no data. */
static const struct mkey *meta_dataless(struct mctx *c)
{
	if (!c->meta_tried)
		meta_load(c);
	if (!c->nmkeys)
		return NULL;
	size_t n = 0;
	for (int i = 0; i < c->depth; i++)
		n += strlen(c->path[i]) + 1;
	char *path = malloc(n + 1);
	if (!path)
		return NULL;
	size_t o = 0;
	for (int i = 0; i < c->depth; i++) {
		if (i)
			path[o++] = MKEY_SEP;
		size_t l = strlen(c->path[i]);
		memcpy(path + o, c->path[i], l);
		o += l;
	}
	path[o] = 0;
	struct mkey key = { .path = path };
	const struct mkey *m = bsearch(&key, c->mkeys, c->nmkeys, sizeof(*c->mkeys), mkey_cmp);
	free(path);
	return m;
}

static int placeholder(struct mctx *c, const char *name)
{
	if (!*name || !ckpt_store_key_ok(name))
		return unreadable(c, "a placeholder that names no array");
	char *k = join(c->dir, name);
	if (!k)
		return -ENOMEM;
	int rc = 1;
	if (maybe_folder(c, name) && zarr_folder(c->src, k))
		rc = ckpt_vitem_add_zarr(c->vi, c->path, c->depth, c->src, k);
	free(k);
	if (rc <= 0)
		return rc;
	if (!c->ocdbt_tried) {
		c->ocdbt_tried = 1;
		if (ckpt_store_ocdbt_open_on(c->src, c->dir, &c->ocdbt) < 0)
			c->ocdbt = NULL;
	}
	if (c->ocdbt && zarr_folder(c->ocdbt, name))
		return ckpt_vitem_add_zarr(c->vi, c->path, c->depth, c->ocdbt, name);
	/* Orbax 0.4 put a name holding '/' into the database of its folder:
	 * "a/b/w" is key "w" of the database in a/b/ */
	const char *slash = strrchr(name, '/');
	if (slash) {
		char *sub = strndup(name, (size_t)(slash - name));
		char *sk = sub ? join(c->dir, sub) : NULL;
		ckpt_store *db = sk ? subdb_of(c, sk) : NULL;
		free(sub);
		free(sk);
		if (db && zarr_folder(db, slash + 1))
			return ckpt_vitem_add_zarr(c->vi, c->path, c->depth, db, slash + 1);
	}
	if (!c->strings_tried) {
		c->strings_tried = 1;
		char *sk = join(c->dir, CKPT_ORBAX_STRINGS);
		char *txt;
		size_t len;
		if (sk && ckpt_store_read_small(c->src, sk, MAX_JSON, &txt, &len) == 0) {
			c->strings = cJSON_ParseWithLength(txt, len);
			free(txt);
		}
		free(sk);
	}
	const cJSON *s = c->strings ? cJSON_GetObjectItemCaseSensitive(c->strings, name) : NULL;
	if (cJSON_IsString(s))
		return ckpt_vitem_add_string(c->vi, c->path, c->depth, s->valuestring);
	/* Orbax 0.5 wrote placeholders for {} and None too; _METADATA says so */
	const struct mkey *mk = meta_dataless(c);
	if (mk)
		return mk->container ? ckpt_vitem_add_empty(c->vi, c->path, c->depth) : 0;
	return unreadable(c, "its zarr folder is not in the checkpoint");
}

/* Flax's ndarray encoding: [shape, dtype name, C-order bytes]. */
static int ndarray(struct mctx *c, const struct ckpt_mp *doc, int scalar)
{
	if (doc->type != CKPT_MP_ARRAY || doc->n != 3)
		return unreadable(c, "an ndarray value that is not [shape, dtype, data]");
	const struct ckpt_mp *sh = &doc->kids[0], *dt = &doc->kids[1], *data = &doc->kids[2];
	if (sh->type != CKPT_MP_ARRAY || sh->n > CKPT_MAX_RANK || (scalar && sh->n != 0))
		return unreadable(c, "a bad shape");
	struct ckpt_varray a = {
		.rank = (int)sh->n, .codec = CKPT_VCODEC_RAW, .base = c->src, .base_key = c->file
	};
	for (uint32_t i = 0; i < sh->n; i++) {
		if (sh->kids[i].type != CKPT_MP_INT || sh->kids[i].v.i < 0)
			return unreadable(c, "a bad shape");
		a.shape[i] = (uint64_t)sh->kids[i].v.i;
	}
	if (dt->type != CKPT_MP_STR || !dt->str)
		return unreadable(c, "a dtype that is not a name");
	a.dtype = ckpt_dtype_from_name(dt->str);
	if (a.dtype == CKPT_DT_INVALID) {
		char why[96];
		snprintf(why, sizeof(why), "dtype %.40s is not supported", dt->str);
		return unreadable(c, why);
	}
	if (data->type != CKPT_MP_BIN)
		return unreadable(c, "array data that is not bytes");
	a.offset = data->off;
	a.length = data->len;
	int rc = ckpt_vitem_add_array(c->vi, c->path, c->depth, &a);
	return rc == -EINVAL ? unreadable(c, "its byte count differs from its shape and dtype") : rc;
}

/* Flax's pieces of an array past 2^30 bytes: {shape: {"0": d0, ...},
 * chunks: {"0": ndarray (1-d), ...}}. */
static int chunked(struct mctx *c, const struct ckpt_mp *m)
{
	const struct ckpt_mp *sh = ckpt_mp_get(m, "shape"), *ch = ckpt_mp_get(m, "chunks");
	if (!sh || !ch || sh->type != CKPT_MP_MAP || ch->type != CKPT_MP_MAP || sh->n > CKPT_MAX_RANK ||
	    !ch->n)
		return unreadable(c, "a chunked array without its shape or chunks");
	struct ckpt_varray a = {
		.rank = (int)sh->n, .codec = CKPT_VCODEC_RAW, .base = c->src, .base_key = c->file
	};
	for (uint32_t i = 0; i < sh->n; i++) {
		char k[24];
		snprintf(k, sizeof(k), "%" PRIu32, i);
		const struct ckpt_mp *d = ckpt_mp_get(sh, k);
		if (!d || d->type != CKPT_MP_INT || d->v.i < 0)
			return unreadable(c, "a bad chunked shape");
		a.shape[i] = (uint64_t)d->v.i;
	}
	uint64_t *pieces = calloc((size_t)ch->n * 2, sizeof(uint64_t));
	if (!pieces)
		return -ENOMEM;
	for (uint32_t i = 0; i < ch->n; i++) {
		char k[24];
		snprintf(k, sizeof(k), "%" PRIu32, i);
		const struct ckpt_mp *e = ckpt_mp_get(ch, k), *doc;
		if (!e || e->type != CKPT_MP_EXT || e->ext_type != CKPT_MP_EXT_NDARRAY || e->n != 1 ||
		    (doc = &e->kids[0])->type != CKPT_MP_ARRAY || doc->n != 3 ||
		    doc->kids[1].type != CKPT_MP_STR || !doc->kids[1].str ||
		    doc->kids[2].type != CKPT_MP_BIN) {
			free(pieces);
			return unreadable(c, "a chunk that is not an ndarray");
		}
		ckpt_dtype dt = ckpt_dtype_from_name(doc->kids[1].str);
		if (dt == CKPT_DT_INVALID || (i && dt != a.dtype)) {
			free(pieces);
			return unreadable(c, "chunks of an unsupported or differing dtype");
		}
		a.dtype = dt;
		pieces[2 * i] = doc->kids[2].off;
		pieces[2 * i + 1] = doc->kids[2].len;
	}
	a.pieces = pieces;
	a.npieces = ch->n;
	int rc = ckpt_vitem_add_array(c->vi, c->path, c->depth, &a);
	free(pieces);
	return rc == -EINVAL ? unreadable(c, "its chunks' bytes differ from its shape and dtype") : rc;
}

/* A T5X leaf: a TensorStore spec of a zarr array of the step. */
static int ts_spec(struct mctx *c, const struct ckpt_mp *m)
{
	const struct ckpt_mp *kv = ckpt_mp_get(m, "kvstore"), *p = kv ? ckpt_mp_get(kv, "path") : NULL;
	if (!p)
		p = ckpt_mp_get(m, "path");
	if (!p || p->type != CKPT_MP_STR || !p->str)
		return unreadable(c, "a TensorStore spec without a path");
	const char *name = p->str;
	/* a path relative to the step; an absolute one (gs://..., /...) keeps its last folder */
	if (strstr(name, "://") || name[0] == '/') {
		const char *s = strrchr(name, '/');
		while (s && s > name && s[1] == 0) /* trailing '/' */
			s = NULL;
		name = s ? s + 1 : name;
	}
	return placeholder(c, name);
}

static int is_ts_spec(const struct ckpt_mp *m)
{
	const struct ckpt_mp *d = ckpt_mp_get(m, "driver");
	return d && d->type == CKPT_MP_STR && (ckpt_mp_get(m, "kvstore") || ckpt_mp_get(m, "path")) &&
	       ckpt_mp_get(m, "metadata");
}

static int walk(struct mctx *c, const struct ckpt_mp *m);

/* Children of a map (keys = its keys) or an array (keys "0", "1", ...). */
static int children(struct mctx *c, const struct ckpt_mp *m, int map)
{
	if (m->n == 0)
		return c->depth ? ckpt_vitem_add_empty(c->vi, c->path, c->depth) : 0;
	if (c->depth >= CKPT_ORBAX_MAX_DEPTH)
		return unreadable(c, "nested too deeply");
	int d = c->depth++;
	int rc = 0;
	for (uint32_t i = 0; i < m->n && rc >= 0; i++) {
		const struct ckpt_mp *k = map ? &m->kids[2 * i] : NULL,
				     *val = map ? &m->kids[2 * i + 1] : &m->kids[i];
		if (!map) {
			snprintf(c->num[d], sizeof(c->num[d]), "%" PRIu32, i);
			c->path[d] = c->num[d];
		} else if (k->type == CKPT_MP_STR && k->str && *k->str) {
			c->path[d] = k->str;
		} else if (k->type == CKPT_MP_INT) {
			snprintf(c->num[d], sizeof(c->num[d]), "%" PRId64, k->v.i);
			c->path[d] = c->num[d];
		} else {
			c->depth = d;
			char w[1024];
			where(c, w, sizeof(w));
			ckpt_log(CKPT_LOG_WARN,
				 "%s/%s: a key that is not a string or integer under %s, left out",
				 c->src->root, c->file, *w ? w : "the top");
			c->depth = d + 1;
			continue;
		}
		rc = walk(c, val);
	}
	c->depth = d;
	return rc;
}

static int scalar(struct mctx *c, ckpt_dtype dt, const void *bytes)
{
	const ckpt_dtype_info *di = ckpt_dtype_get(dt);
	return ckpt_vitem_add_bytes(c->vi, c->path, c->depth, dt, 0, NULL, bytes, di->itemsize);
}

static int walk(struct mctx *c, const struct ckpt_mp *m)
{
	if (c->depth == 0 && m->type != CKPT_MP_MAP && m->type != CKPT_MP_ARRAY) {
		/* a lone value: one leaf named after nothing cannot be shown */
		c->path[0] = "value";
		c->depth = 1;
		int rc = walk(c, m);
		c->depth = 0;
		return rc;
	}
	switch (m->type) {
	case CKPT_MP_MAP:
		if (ckpt_mp_get(m, CHUNKED_KEY))
			return chunked(c, m);
		if (c->depth && is_ts_spec(m))
			return ts_spec(c, m);
		return children(c, m, 1);
	case CKPT_MP_ARRAY:
		return children(c, m, 0);
	case CKPT_MP_EXT:
		if (m->n != 1)
			return unreadable(c, "an ext value of an unknown type");
		switch (m->ext_type) {
		case CKPT_MP_EXT_NDARRAY:
			return ndarray(c, &m->kids[0], 0);
		case CKPT_MP_EXT_NPSCALAR:
			return ndarray(c, &m->kids[0], 1);
		case CKPT_MP_EXT_TUPLE:
			if (m->kids[0].type != CKPT_MP_ARRAY)
				return unreadable(c, "a tuple that is not an array");
			return children(c, &m->kids[0], 0);
		case CKPT_MP_EXT_COMPLEX: {
			const struct ckpt_mp *d = &m->kids[0];
			if (d->type != CKPT_MP_ARRAY || d->n != 2 || d->kids[0].type != CKPT_MP_FLOAT ||
			    d->kids[1].type != CKPT_MP_FLOAT)
				return unreadable(c, "a complex value that is not [real, imag]");
			double v[2] = { d->kids[0].v.f, d->kids[1].v.f };
			return scalar(c, CKPT_DT_COMPLEX128, v);
		}
		}
		return unreadable(c, "an ext value of an unknown type");
	case CKPT_MP_STR:
		if (!m->str)
			return unreadable(c, "a string too long to show");
		if (strncmp(m->str, PH_PREFIX, strlen(PH_PREFIX)) == 0)
			return placeholder(c, m->str + strlen(PH_PREFIX));
		if (strncmp(m->str, AGG_PREFIX, strlen(AGG_PREFIX)) == 0)
			return placeholder(c, m->str + strlen(AGG_PREFIX));
		if (strncmp(m->str, GDA_PREFIX, strlen(GDA_PREFIX)) == 0) {
			const char *rel = m->str + strlen(GDA_PREFIX);
			size_t fl = strlen(c->file);
			char *gda = malloc(fl + strlen(GDA_SUFFIX) + 1);
			if (!gda)
				return -ENOMEM;
			memcpy(gda, c->file, fl);
			strcpy(gda + fl, GDA_SUFFIX);
			char *k = join(gda, rel);
			free(gda);
			if (!k)
				return -ENOMEM;
			int rc = ckpt_store_key_ok(rel) && zarr_folder(c->src, k)
					 ? ckpt_vitem_add_zarr(c->vi, c->path, c->depth, c->src, k)
					 : unreadable(c,
						      "its " GDA_SUFFIX " folder holds no zarr array there");
			free(k);
			return rc;
		}
		return ckpt_vitem_add_string(c->vi, c->path, c->depth, m->str);
	case CKPT_MP_INT:
		return scalar(c, CKPT_DT_INT64, &m->v.i);
	case CKPT_MP_UINT:
		return scalar(c, CKPT_DT_UINT64, &m->v.u);
	case CKPT_MP_FLOAT: {
		if (m->f32) {
			float f = (float)m->v.f;
			return scalar(c, CKPT_DT_FLOAT32, &f);
		}
		return scalar(c, CKPT_DT_FLOAT64, &m->v.f);
	}
	case CKPT_MP_BOOL: {
		uint8_t b = (uint8_t)(m->v.b != 0);
		return scalar(c, CKPT_DT_BOOL, &b);
	}
	case CKPT_MP_NIL:
		return 0; /* None: nothing stored */
	case CKPT_MP_BIN:
		return unreadable(c, "a bytes value");
	}
	return 0;
}

/* Translate msgpack file `file` of src, placeholders relative to `dir`. */
static int translate(ckpt_store *src, const char *file, const char *dir, uint64_t size, ckpt_store **item)
{
	struct frd r = { src, file };
	struct ckpt_mp *doc;
	const char *why = "?";
	int rc = ckpt_mp_parse(fread_cb, &r, size, &doc, &why);
	if (rc < 0) {
		ckpt_log(CKPT_LOG_ERR, "%s/%s: not a readable MessagePack checkpoint: %s", src->root, file,
			 rc == -EINVAL ? why : strerror(-rc));
		return rc == -EINVAL ? -EIO : rc;
	}
	char name[4096];
	snprintf(name, sizeof(name), "%s/%s", src->root, file);
	struct mctx c = { .src = src, .file = file, .dir = dir };
	if ((rc = ckpt_vitem_new(name, &c.vi)) == 0) {
		rc = walk(&c, doc);
		if (rc < 0)
			ckpt_vitem_free(c.vi);
		else
			rc = ckpt_vitem_finish(c.vi, item);
	}
	ckpt_mp_free(doc);
	ckpt_store_destroy(c.ocdbt);
	for (size_t i = 0; i < c.nfolders; i++)
		free(c.folders[i]);
	free(c.folders);
	for (struct subdb *d = c.subdbs, *nx; d; d = nx) {
		nx = d->next;
		ckpt_store_destroy(d->db);
		free(d->dir);
		free(d);
	}
	cJSON_Delete(c.strings);
	for (size_t i = 0; i < c.nmkeys; i++)
		free(c.mkeys[i].path);
	free(c.mkeys);
	return rc;
}

/* ---- a msgpack file of its own (legacy Flax checkpoint_<N>) ------------------ */

static int file_probe(ckpt_store *src, const char *key, const struct ckpt_store_stat *st, const uint8_t *head,
		      size_t nhead)
{
	(void)src;
	(void)key;
	return !st->is_dir && ckpt_mp_magic(head, nhead);
}

static int file_open(ckpt_store *src, const char *key, const struct ckpt_store_stat *st, ckpt_store **item)
{
	char *dir = strdup(key);
	if (!dir)
		return -ENOMEM;
	char *slash = strrchr(dir, '/');
	if (slash)
		*slash = 0;
	else
		dir[0] = 0;
	int rc = translate(src, key, dir, st->size, item);
	free(dir);
	return rc;
}

const struct ckpt_foreign_fmt ckpt_foreign_msgpack_file = {
	.name = "flax-msgpack",
	.what = "a Flax checkpoint file (MessagePack)",
	.probe = file_probe,
	.open = file_open,
};

/* ---- a folder with a `checkpoint` msgpack file (old Orbax, Flax, T5X) -------- */

static int dir_probe(ckpt_store *src, const char *key, const struct ckpt_store_stat *st, const uint8_t *head,
		     size_t nhead)
{
	(void)head;
	(void)nhead;
	if (!st->is_dir)
		return 0;
	char *k = join(key, CHECKPOINT_FILE);
	if (!k)
		return 0;
	struct ckpt_store_stat fs;
	uint8_t h[64];
	int ok = 0;
	if (ckpt_store_stat(src, k, &fs) == 0 && !fs.is_dir) {
		size_t want = fs.size < sizeof(h) ? (size_t)fs.size : sizeof(h);
		ssize_t n = want ? ckpt_store_read(src, k, 0, want, h) : 0;
		ok = n > 0 && ckpt_mp_magic(h, (size_t)n);
	}
	free(k);
	return ok;
}

static int dir_open(ckpt_store *src, const char *key, const struct ckpt_store_stat *st, ckpt_store **item)
{
	(void)st;
	char *k = join(key, CHECKPOINT_FILE);
	if (!k)
		return -ENOMEM;
	struct ckpt_store_stat fs;
	int rc = ckpt_store_stat(src, k, &fs);
	if (rc == 0)
		rc = translate(src, k, key, fs.size, item);
	free(k);
	return rc;
}

const struct ckpt_foreign_fmt ckpt_foreign_msgpack_dir = {
	.name = "msgpack-item",
	.what = "a folder with a MessagePack `checkpoint` file (Orbax before 0.5.16, Flax, T5X)",
	.probe = dir_probe,
	.open = dir_open,
	.main_file = CHECKPOINT_FILE,
};

/* ---- an Orbax 0.1 item without `checkpoint`: zarr folders named by key paths -- */

#define NAMES_PROBE_MAX 16 /* subfolders a probe looks into */

struct names {
	char **v;
	size_t n, cap;
	size_t files; /* regular files other than commit_success.txt */
	size_t max; /* stop collecting beyond this many (0: all) */
	int oom;
};

static int names_cb(void *ctx, const char *name, const struct ckpt_store_stat *st)
{
	struct names *l = ctx;
	if (name[0] == '.' || ckpt_orbax_is_unfinished(name))
		return 0;
	if (!st->is_dir) {
		l->files += strcmp(name, CKPT_ORBAX_COMMIT_SUCCESS) != 0;
		return 0;
	}
	if (l->max && l->n >= l->max)
		return 0;
	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 16;
		char **v = realloc(l->v, cap * sizeof(*v));
		if (!v) {
			l->oom = 1;
			return 1;
		}
		l->v = v;
		l->cap = cap;
	}
	if (!(l->v[l->n] = strdup(name))) {
		l->oom = 1;
		return 1;
	}
	l->n++;
	return 0;
}

static void names_free(struct names *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->v[i]);
	free(l->v);
}

static int has_file(ckpt_store *src, const char *dir, const char *name)
{
	char *k = join(dir, name);
	struct ckpt_store_stat st;
	int ok = k && ckpt_store_stat(src, k, &st) == 0;
	free(k);
	return ok;
}

static int ocdbt_cb(void *ctx, const char *name, const struct ckpt_store_stat *st)
{
	(void)ctx;
	(void)st;
	return strncmp(name, CKPT_ORBAX_OCDBT_PROCESS_PREFIX, strlen(CKPT_ORBAX_OCDBT_PROCESS_PREFIX)) == 0;
}

static int names_probe(ckpt_store *src, const char *key, const struct ckpt_store_stat *st,
		       const uint8_t *head, size_t nhead)
{
	(void)head;
	(void)nhead;
	if (!st->is_dir || has_file(src, key, CHECKPOINT_FILE) || has_file(src, key, CKPT_ORBAX_METADATA) ||
	    has_file(src, key, CKPT_ORBAX_OCDBT_MANIFEST) || has_file(src, key, CKPT_ORBAX_CKPT_METADATA) ||
	    ckpt_store_listdir(src, key, ocdbt_cb, NULL) > 0)
		return 0;
	struct names l = { .max = NAMES_PROBE_MAX };
	int ok = ckpt_store_listdir(src, key, names_cb, &l) >= 0 && !l.oom && l.n > 0 && l.files == 0;
	for (size_t i = 0; ok && i < l.n; i++) {
		char *k = join(key, l.v[i]);
		ok = k && zarr_folder(src, k);
		free(k);
	}
	names_free(&l);
	return ok;
}

static int names_open(ckpt_store *src, const char *key, const struct ckpt_store_stat *st, ckpt_store **item)
{
	(void)st;
	struct names l = { .max = 0 };
	int rc = ckpt_store_listdir(src, key, names_cb, &l);
	if (rc >= 0 && l.oom)
		rc = -ENOMEM;
	char name[4096];
	snprintf(name, sizeof(name), "%s%s%s", src->root, *key ? "/" : "", key);
	struct ckpt_vitem *vi = NULL;
	if (rc >= 0)
		rc = ckpt_vitem_new(name, &vi);
	for (size_t i = 0; rc >= 0 && i < l.n; i++) {
		char *k = join(key, l.v[i]);
		if (!k) {
			rc = -ENOMEM;
			break;
		}
		if (zarr_folder(src, k)) {
			/* the key path: the folder name split on '.' */
			char buf[4096];
			const char *path[CKPT_ORBAX_MAX_DEPTH];
			int depth = 0;
			snprintf(buf, sizeof(buf), "%s", l.v[i]);
			for (char *p = buf; p && depth < CKPT_ORBAX_MAX_DEPTH;) {
				char *dot = strchr(p, '.');
				if (dot)
					*dot = 0;
				path[depth++] = p;
				p = dot ? dot + 1 : NULL;
			}
			rc = ckpt_vitem_add_zarr(vi, path, depth, src, k);
		}
		free(k);
	}
	names_free(&l);
	if (rc < 0) {
		ckpt_vitem_free(vi);
		return rc;
	}
	return ckpt_vitem_finish(vi, item);
}

const struct ckpt_foreign_fmt ckpt_foreign_zarr_names = {
	.name = "orbax-zarr-folders",
	.what = "an Orbax 0.1 item of zarr folders named by '.'-joined key paths",
	.probe = names_probe,
	.open = names_open,
};
