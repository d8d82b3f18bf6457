/* writer_decl.c - declarations of a pending step: items, arrays and
 * their pytree key paths (consistency and name checks), and the queries
 * the daemon lists pending steps with. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "hash.h"
#include "orbax.h"
#include "sysio.h"
#include "writer_int.h"

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
	return ckpt_fnv1a(k, n, CKPT_FNV1A_INIT);
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

static void hash_remove(struct whash *t, const char *k, size_t n)
{
	uint64_t h = hash_bytes(k, n);
	for (struct hent **pp = &t->b[h & (t->nb - 1)]; *pp; pp = &(*pp)->next) {
		struct hent *e = *pp;
		if (e->h == h && e->klen == n && memcmp(e->key, k, n) == 0) {
			*pp = e->next;
			free(e);
			t->n--;
			return;
		}
	}
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

int ckpt_w_keytab_create(struct ckpt_step *st)
{
	st->nodes = calloc(1, sizeof(*st->nodes));
	if (!st->nodes)
		return -ENOMEM;
	st->nodes->nb = 64;
	st->nodes->b = calloc(64, sizeof(struct hent *));
	return st->nodes->b ? 0 : -ENOMEM;
}

void ckpt_w_keytab_free(struct ckpt_step *st)
{
	hash_free(st->nodes);
	st->nodes = NULL;
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

int ckpt_w_step_writable(struct ckpt_step *st, const char *what)
{
	if (st->state == CKPT_STEP_PENDING)
		return 0;
	ckpt_log(CKPT_LOG_ERR, "writer: step %s: %s: step already %s", st->name, what,
		 st->state == CKPT_STEP_COMMITTED ? "committed" : "aborted");
	return -EROFS;
}

/* Item `item` of a step that still takes changes, made when missing
 * (decl_mu held): NULL with *rc set when the step is committed or aborted,
 * or on -ENOMEM. */
static struct witem *item_to_change(struct ckpt_step *st, const char *item, int *rc)
{
	*rc = ckpt_w_step_writable(st, item);
	if (!*rc && st->as_written) {
		ckpt_log(CKPT_LOG_ERR, "writer: step %s is stored as written: item %s cannot be declared",
			 st->name, item);
		*rc = -EINVAL;
	}
	return *rc ? NULL : item_get(st, item, 1, rc);
}

int ckpt_step_add_item(ckpt_step *st, const char *item)
{
	int rc = 0;
	const char *why;
	if (!ckpt_orbax_name_ok(CKPT_NAME_ITEM, item, &why)) {
		ckpt_log(CKPT_LOG_ERR, "writer: step %s: bad item name '%s': %s", st->name,
			 item ? item : "(null)", why);
		return -EINVAL;
	}
	ckpt_lock(&st->decl_mu, CKPT_RANK_W_DECL);
	item_to_change(st, item, &rc);
	ckpt_unlock(&st->decl_mu, CKPT_RANK_W_DECL);
	return rc;
}

void ckpt_w_warray_free(struct ckpt_warray *a)
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
	ckpt_w_tab_free(a);
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

/* Build 'P' item \0 name: the key of a param name in st->nodes. */
static char *param_key(const char *item, const char *name, size_t *len)
{
	size_t n = 1 + strlen(item) + 1 + strlen(name);
	char *k = malloc(n + 1); /* strcpy adds a NUL not in the key */
	if (!k)
		return NULL;
	k[0] = 'P';
	strcpy(stpcpy(k + 1, item) + 1, name);
	*len = n;
	return k;
}

/* Step 1 of a declaration, no lock: the item name, the key path (keys, key
 * types, the param name they join to), dtype and rank.  0 with *name the
 * malloc'd param name, or -EINVAL / -ENOMEM (logged). */
static int decl_validate(ckpt_step *st, const char *item, const char *const *keypath, const int *key_types,
			 int depth, ckpt_dtype dtype, int rank, const uint64_t *shape, char **name)
{
	const char *why;
	*name = NULL;
	if (!ckpt_orbax_name_ok(CKPT_NAME_ITEM, item, &why)) {
		ckpt_log(CKPT_LOG_ERR, "writer: step %s: bad item name '%s': %s", st->name,
			 item ? item : "(null)", why);
		return -EINVAL;
	}
	if (!ckpt_orbax_keypath_ok(keypath, key_types, depth, &why)) {
		ckpt_log(CKPT_LOG_ERR, "writer: %s: the key path is not usable: %s", item, why);
		return -EINVAL;
	}
	size_t nlen = 0;
	for (int i = 0; i < depth; i++)
		nlen += strlen(keypath[i]) + 1;
	char *p = *name = malloc(nlen);
	if (!p)
		return -ENOMEM;
	for (int i = 0; i < depth; i++) {
		if (i)
			*p++ = '.';
		p = stpcpy(p, keypath[i]);
	}
	const char *bad = NULL;
	if (!ckpt_dtype_get(dtype) || rank < 0 || rank > CKPT_MAX_RANK || (rank && !shape))
		bad = "bad dtype or rank";
	else if (dtype == CKPT_DT_UINT4)
		bad = "dtype uint4 has no TensorStore name: Orbax cannot save or restore it";
	else if (strcmp(item, CKPT_ORBAX_METRICS_ITEM) == 0)
		bad = "the item 'metrics' is the manager's JSON metrics (metrics/metrics), not arrays";
	for (int d = 0; !bad && d < rank; d++)
		if (shape[d] == 0)
			bad = "zero-size array: Orbax refuses to save arrays without elements";
	if (bad) {
		ckpt_log(CKPT_LOG_ERR, "writer: %s/%s: %s", item, *name, bad);
		free(*name);
		*name = NULL;
		return -EINVAL;
	}
	return 0;
}

/* Step 2, under decl_mu: where the key path (node key k) fits in the item's
 * pytree.  0: a new leaf may be added; 1: the same array was declared before
 * (*out set); -EINVAL (logged) or -ENOMEM. */
static int tree_check_locked(ckpt_step *st, const char *item, const char *const *keypath,
			     const int *key_types, int depth, const char *name, ckpt_dtype dtype, int rank,
			     const uint64_t *shape, const char *k, size_t klen, ckpt_warray **out)
{
	ckpt_assert_held(CKPT_RANK_W_DECL);
	struct hent *e = hash_find(st->nodes, k, klen);
	if (e && e->leaf) {
		if (same_decl(e->arr, dtype, rank, shape)) {
			*out = e->arr;
			return 1;
		}
		ckpt_log(CKPT_LOG_ERR, "writer: %s/%s: declared again with a different dtype or shape", item,
			 name);
		return -EINVAL;
	}
	if (e) {
		ckpt_log(CKPT_LOG_ERR, "writer: %s/%s: is a pytree node holding other arrays", item, name);
		return -EINVAL;
	}
	/* Every ancestor must be an interior node whose children use this
	 * level's key type. */
	for (int lv = 0; lv < depth; lv++) {
		size_t pl;
		char *pk = node_key(item, keypath, key_types, lv, &pl);
		if (!pk)
			return -ENOMEM;
		struct hent *pe = hash_find(st->nodes, pk, pl);
		free(pk);
		if (pe && pe->leaf) {
			ckpt_log(CKPT_LOG_ERR, "writer: %s/%s: an ancestor (%d keys) is an array", item, name,
				 lv);
			return -EINVAL;
		}
		if (pe && pe->child_type && pe->child_type != key_types[lv]) {
			ckpt_log(CKPT_LOG_ERR,
				 "writer: %s/%s: key '%s' mixes sequence and dict keys in one node", item,
				 name, keypath[lv]);
			return -EINVAL;
		}
	}
	size_t plen;
	char *pn = param_key(item, name, &plen);
	if (!pn)
		return -ENOMEM;
	struct hent *ne = hash_find(st->nodes, pn, plen);
	free(pn);
	if (ne) {
		ckpt_log(CKPT_LOG_ERR, "writer: %s/%s: another key path has the same name", item, name);
		return -EINVAL;
	}
	return 0;
}

/* Step 3: a new array of item it (not yet linked anywhere): geometry, key
 * copies, chunk and shard tables, its folder.  Takes ownership of name.
 * 0 with *out, or -errno (logged where the cause is not -ENOMEM). */
static int array_alloc(ckpt_step *st, struct witem *it, char *name, const char *const *keypath,
		       const int *key_types, int depth, ckpt_dtype dtype, int rank, const uint64_t *shape,
		       struct ckpt_warray **out)
{
	struct ckpt_warray *a = calloc(1, sizeof(*a));
	if (!a) {
		free(name);
		return -ENOMEM;
	}
	pthread_mutex_init(&a->mu, NULL);
	pthread_cond_init(&a->cond, NULL);
	a->step = st;
	a->item = it;
	a->name = name;
	a->dtype = dtype;
	a->isz = ckpt_dtype_get(dtype)->itemsize;
	a->rank = rank;
	a->depth = depth;
	for (int d = 0; d < rank; d++)
		a->shape[d] = shape[d];
	int rc = ckpt_w_geom_init(a, st->opts.chunk_bytes, st->opts.shard_bytes);
	if (rc) {
		ckpt_log(CKPT_LOG_ERR, "writer: %s/%s: array too large (%s)", it->name, a->name,
			 rc == -EFBIG ? "too many chunks or bytes" : "overflow");
		goto fail;
	}
	rc = -ENOMEM;
	a->keys = calloc((size_t)depth, sizeof(char *));
	a->ktypes = malloc((size_t)depth * sizeof(int));
	/* The chunk and shard tables are sparse (writer_table.c): nothing is
	 * allocated for them until a chunk is written. */
	if (!a->keys || !a->ktypes || asprintf(&a->relpath, "%s/%s", it->name, a->name) < 0) {
		a->relpath = NULL;
		goto fail;
	}
	for (int i = 0; i < depth; i++) {
		a->ktypes[i] = key_types[i];
		if (!(a->keys[i] = strdup(keypath[i])))
			goto fail;
	}
	/* A key with '/' makes nested folders (the param name "we/ird"). */
	for (char *p = strchr(a->relpath, '/'); p; p = strchr(p + 1, '/')) {
		*p = 0;
		int r = p[1] && mkdirat(st->dirfd, a->relpath, 0755) && errno != EEXIST ? -errno : 0;
		*p = '/';
		if (r) {
			rc = r;
			ckpt_log(CKPT_LOG_ERR, "writer: %s: mkdir: %s", a->relpath, strerror(-r));
			goto fail;
		}
	}
	if (mkdirat(st->dirfd, a->relpath, 0755) && errno != EEXIST) {
		rc = -errno;
		ckpt_log(CKPT_LOG_ERR, "writer: %s: mkdir: %s", a->relpath, strerror(errno));
		goto fail;
	}
	*out = a;
	return 0;
fail:
	ckpt_w_warray_free(a);
	return rc;
}

/* Step 4, under decl_mu: enter a into the pytree (ancestors, the leaf at
 * node key k, its param name) and link it into its item.  An allocation
 * failure after the first insert leaves harmless interior entries behind
 * (a node with no leaf below is never visible). */
static int tree_register_locked(ckpt_step *st, struct ckpt_warray *a, const char *k, size_t klen)
{
	ckpt_assert_held(CKPT_RANK_W_DECL);
	const char *item = a->item->name;
	for (int lv = 0; lv < a->depth; lv++) {
		size_t pl;
		char *pk = node_key(item, (const char *const *)a->keys, a->ktypes, lv, &pl);
		struct hent *pe = pk ? hash_find(st->nodes, pk, pl) : NULL;
		if (pk && !pe)
			pe = hash_add(st->nodes, pk, pl);
		free(pk);
		if (!pe)
			return -ENOMEM;
		pe->child_type = a->ktypes[lv];
	}
	size_t plen;
	char *pn = param_key(item, a->name, &plen);
	struct hent *le = pn ? hash_add(st->nodes, k, klen) : NULL;
	struct hent *pne = le ? hash_add(st->nodes, pn, plen) : NULL;
	free(pn);
	if (!pne) {
		if (le)
			le->leaf = 0; /* becomes a dangling interior node: still consistent */
		return -ENOMEM;
	}
	le->leaf = 1;
	le->arr = a;
	pne->leaf = 2;
	pne->arr = a;
	struct witem *it = a->item;
	if (it->last)
		it->last->next = a;
	else
		it->first = a;
	it->last = a;
	it->narrays++;
	st->narrays++;
	st->bytes_declared += a->nbytes;
	return 0;
}

int ckpt_step_add_array(ckpt_step *st, const char *item, const char *const *keypath, const int *key_types,
			int depth, ckpt_dtype dtype, int rank, const uint64_t *shape, ckpt_warray **out)
{
	char *name, *k = NULL;
	size_t klen;
	*out = NULL;
	int rc = decl_validate(st, item, keypath, key_types, depth, dtype, rank, shape, &name);
	if (rc)
		return rc;
	ckpt_lock(&st->decl_mu, CKPT_RANK_W_DECL);
	struct witem *it = NULL;
	struct ckpt_warray *a = NULL;
	if ((rc = ckpt_w_step_writable(st, name)))
		goto out;
	if (!(it = item_get(st, item, 1, &rc)))
		goto out;
	if (it->json || it->stored) {
		ckpt_log(CKPT_LOG_ERR, "writer: %s/%s: %s is %s, not arrays", item, name, item,
			 it->stored ? "a stored copy (files copied as they are)" : "a JSON item");
		rc = -EINVAL;
		goto out;
	}
	rc = -ENOMEM;
	if (!(k = node_key(item, keypath, key_types, depth, &klen)))
		goto out;
	rc = tree_check_locked(st, item, keypath, key_types, depth, name, dtype, rank, shape, k, klen, out);
	if (rc) {
		if (rc == 1)
			rc = 0; /* declared before: *out is that array */
		goto out;
	}
	rc = array_alloc(st, it, name, keypath, key_types, depth, dtype, rank, shape, &a);
	name = NULL; /* owned by a, or freed */
	if (rc)
		goto out;
	rc = tree_register_locked(st, a, k, klen);
	if (rc)
		ckpt_w_warray_free(a);
	else
		*out = a;
out:
	ckpt_unlock(&st->decl_mu, CKPT_RANK_W_DECL);
	free(k);
	free(name);
	return rc;
}

const char *ckpt_step_json_file(const char *item)
{
	return item && strcmp(item, CKPT_ORBAX_METRICS_ITEM) == 0 ? CKPT_ORBAX_METRICS_ITEM
								  : CKPT_ORBAX_JSON_FILE;
}

int ckpt_step_set_json(ckpt_step *st, const char *item, const void *json, size_t len)
{
	const char *why;
	if (!ckpt_orbax_name_ok(CKPT_NAME_ITEM, item, &why)) {
		ckpt_log(CKPT_LOG_ERR, "writer: step %s: bad item name '%s': %s", st->name,
			 item ? item : "(null)", why);
		return -EINVAL;
	}
	if (json && len > ((size_t)64 << 20)) {
		ckpt_log(CKPT_LOG_ERR, "writer: %s/%s: a JSON item holds at most 64 MiB", item,
			 ckpt_step_json_file(item));
		return -EFBIG;
	}
	char *copy = NULL;
	if (json) {
		if (!(copy = malloc(len + 1)))
			return -ENOMEM;
		memcpy(copy, json, len);
		copy[len] = 0;
	}
	int rc = 0;
	ckpt_lock(&st->decl_mu, CKPT_RANK_W_DECL);
	struct witem *it = item_to_change(st, item, &rc);
	if (it && (it->narrays || it->stored)) {
		ckpt_log(CKPT_LOG_ERR, "writer: %s/%s: the item holds %s; a JSON item holds only its JSON",
			 item, ckpt_step_json_file(item), it->stored ? "a stored copy" : "arrays");
		rc = -EINVAL;
	} else if (it) {
		free(it->json);
		it->json = copy;
		it->json_len = copy ? len : 0;
		copy = NULL;
	}
	ckpt_unlock(&st->decl_mu, CKPT_RANK_W_DECL);
	free(copy);
	return rc;
}

int ckpt_step_add_stored_item(ckpt_step *st, const char *item)
{
	int rc = 0;
	ckpt_lock(&st->decl_mu, CKPT_RANK_W_DECL);
	struct witem *it = item_to_change(st, item, &rc);
	if (it && (it->narrays || it->json)) {
		ckpt_log(CKPT_LOG_ERR, "writer: step %s: item %s holds %s: it cannot also be a stored copy",
			 st->name, item, it->json ? "JSON" : "arrays");
		rc = -EINVAL;
	} else if (it) {
		it->stored = 1;
	}
	ckpt_unlock(&st->decl_mu, CKPT_RANK_W_DECL);
	return rc;
}

int ckpt_step_set_as_written(ckpt_step *st)
{
	ckpt_lock(&st->decl_mu, CKPT_RANK_W_DECL);
	int rc = st->state != CKPT_STEP_PENDING ? -EROFS : 0;
	for (struct witem *it = st->items; it && !rc; it = it->next)
		if (it->narrays) {
			ckpt_log(CKPT_LOG_ERR,
				 "writer: step %s: item %s holds arrays: it cannot be stored as written",
				 st->name, it->name);
			rc = -EINVAL;
		}
	if (!rc)
		st->as_written = 1;
	ckpt_unlock(&st->decl_mu, CKPT_RANK_W_DECL);
	return rc;
}

int ckpt_step_set_item_handler(ckpt_step *st, const char *item, const char *handler)
{
	char *copy = NULL;
	if (handler && !(copy = strdup(handler)))
		return -ENOMEM;
	int rc = 0;
	ckpt_lock(&st->decl_mu, CKPT_RANK_W_DECL);
	struct witem *it = item_to_change(st, item, &rc);
	if (it) {
		free(it->handler);
		it->handler = copy;
		copy = NULL;
	}
	ckpt_unlock(&st->decl_mu, CKPT_RANK_W_DECL);
	free(copy);
	return rc;
}

int ckpt_warray_remove(ckpt_warray *a)
{
	struct ckpt_step *st = a->step;
	ckpt_lock(&st->decl_mu, CKPT_RANK_W_DECL);
	int rc = ckpt_w_step_writable(st, a->relpath);
	if (rc || atomic_load(&a->removed)) {
		ckpt_unlock(&st->decl_mu, CKPT_RANK_W_DECL);
		return rc;
	}
	atomic_store(&a->removed, 1);
	struct witem *it = a->item;
	struct ckpt_warray *prev = NULL;
	for (struct ckpt_warray *x = it->first; x && x != a; x = x->next)
		prev = x;
	if (prev)
		prev->next = a->next;
	else
		it->first = a->next;
	if (it->last == a)
		it->last = prev;
	it->narrays--;
	st->narrays--;
	st->bytes_declared -= a->nbytes;
	size_t kl, pl;
	char *k = node_key(it->name, (const char *const *)a->keys, a->ktypes, a->depth, &kl);
	char *pk = param_key(it->name, a->name, &pl);
	if (k)
		hash_remove(st->nodes, k, kl);
	if (pk)
		hash_remove(st->nodes, pk, pl);
	free(k);
	free(pk);
	a->next = st->removed;
	st->removed = a;
	ckpt_unlock(&st->decl_mu, CKPT_RANK_W_DECL);
	/* Nobody finds it any more: drop its bytes and its folder. */
	for (uint64_t i = ckpt_w_chunk_next(a, 0); i < a->nchunks; i = ckpt_w_chunk_next(a, i + 1))
		ckpt_w_chunk_reset(a, i);
	rc = ckpt_rmtree_at(st->dirfd, a->relpath);
	if (rc && rc != -ENOENT)
		ckpt_log(CKPT_LOG_WARN, "writer: %s: removing its folder: %s", a->relpath, strerror(-rc));
	ckpt_log(CKPT_LOG_INFO, "writer: %s: removed from pending step %s", a->relpath, st->name);
	return 0;
}

int ckpt_warray_set_sharding(ckpt_warray *a, const char *json)
{
	char *copy = NULL;
	if (json) {
		cJSON *j = strlen(json) <= (1u << 20) ? cJSON_Parse(json) : NULL;
		if (!j) {
			ckpt_log(CKPT_LOG_ERR, "writer: %s: sharding is not valid JSON (or over 1 MiB)",
				 a->relpath);
			return -EINVAL;
		}
		cJSON_Delete(j);
		if (!(copy = strdup(json)))
			return -ENOMEM;
	}
	ckpt_lock(&a->mu, CKPT_RANK_W_ARRAY);
	free(a->sharding);
	a->sharding = copy;
	ckpt_unlock(&a->mu, CKPT_RANK_W_ARRAY);
	return 0;
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
	ckpt_lock(&a->mu, CKPT_RANK_W_ARRAY);
	o->bytes_written = a->have_total;
	o->stored_bytes = a->stored_bytes;
	o->chunks_stored = a->nstored;
	o->sharding = a->sharding;
	ckpt_unlock(&a->mu, CKPT_RANK_W_ARRAY);
}

ckpt_warray *ckpt_step_find_array(ckpt_step *st, const char *item, const char *const *keypath, int depth)
{
	/* Param names are unique per item: look the name up, then compare
	 * the keys (('a.b',) and ('a', 'b') share a name). */
	if (!item || !keypath || depth < 1 || depth > CKPT_ORBAX_MAX_DEPTH)
		return NULL;
	size_t n = 1 + strlen(item) + 1;
	for (int i = 0; i < depth; i++) {
		if (!keypath[i])
			return NULL;
		n += strlen(keypath[i]) + 1;
	}
	char *k = malloc(n), *p = k;
	if (!k)
		return NULL;
	*p++ = 'P';
	p = stpcpy(p, item) + 1;
	for (int i = 0; i < depth; i++) {
		if (i)
			*p++ = '.';
		p = stpcpy(p, keypath[i]);
	}
	ckpt_warray *found = NULL;
	ckpt_lock(&st->decl_mu, CKPT_RANK_W_DECL);
	struct hent *e = hash_find(st->nodes, k, (size_t)(p - k));
	if (e && e->arr && e->arr->depth == depth) {
		int i = 0;
		while (i < depth && strcmp(e->arr->keys[i], keypath[i]) == 0)
			i++;
		if (i == depth)
			found = e->arr;
	}
	ckpt_unlock(&st->decl_mu, CKPT_RANK_W_DECL);
	free(k);
	return found;
}

int ckpt_step_foreach_item(ckpt_step *st, int (*cb)(void *ctx, const char *item), void *ctx)
{
	int rc = 0;
	ckpt_lock(&st->decl_mu, CKPT_RANK_W_DECL);
	for (struct witem *it = st->items; it && !rc; it = it->next)
		rc = cb(ctx, it->name);
	ckpt_unlock(&st->decl_mu, CKPT_RANK_W_DECL);
	return rc;
}

int ckpt_step_foreach_array(ckpt_step *st, const char *item, int (*cb)(void *ctx, ckpt_warray *a), void *ctx)
{
	int rc = 0;
	ckpt_lock(&st->decl_mu, CKPT_RANK_W_DECL);
	for (struct witem *it = st->items; it && !rc; it = it->next) {
		if (item && strcmp(item, it->name) != 0)
			continue;
		for (struct ckpt_warray *a = it->first; a && !rc; a = a->next)
			rc = cb(ctx, a);
	}
	ckpt_unlock(&st->decl_mu, CKPT_RANK_W_DECL);
	return rc;
}

void ckpt_step_get_info(ckpt_step *st, ckpt_step_info *o)
{
	memset(o, 0, sizeof(*o));
	ckpt_lock(&st->decl_mu, CKPT_RANK_W_DECL);
	o->state = st->state;
	o->name = st->name;
	o->tmp_path = st->tmppath;
	o->arrays = st->narrays;
	o->bytes_declared = st->bytes_declared;
	for (struct witem *it = st->items; it; it = it->next)
		for (struct ckpt_warray *a = it->first; a; a = a->next) {
			ckpt_lock(&a->mu, CKPT_RANK_W_ARRAY);
			o->bytes_written += a->have_total;
			ckpt_unlock(&a->mu, CKPT_RANK_W_ARRAY);
		}
	ckpt_unlock(&st->decl_mu, CKPT_RANK_W_DECL);
	ckpt_lock(&st->mu, CKPT_RANK_W_STEP);
	o->bytes_pending = st->bytes_pending;
	o->mem_used = st->mem_used;
	o->spilled_chunks = st->nspilled;
	o->spills = st->spills;
	o->stored_bytes = st->stored_bytes;
	ckpt_unlock(&st->mu, CKPT_RANK_W_STEP);
}
