/*
 * node.c - the node table (inode number -> node), kids of directories, the
 * hidden-name map, and the kind-independent parts of lookup, readdir and
 * attributes.  The node model, its invariants and the lock order of
 * libckpt are described in tree_int.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hash.h"
#include "stats.h"
#include "tree_int.h"

/*
 * The life of a kid of the root (node->life; every change through
 * life_set(), which checks the edge against life_edges):
 *
 *   from       to        by
 *   UNTRACKED  LIVE      ckpt_node_step_track: a committed step of a live
 *                        root, before it is linked (refs = 1, the tree's)
 *   LIVE       GONE      ckpt_node_step_gone: a rescan unlinked it (its
 *                        folder vanished); ns_lock exclusive, scan_mu
 *   GONE       FREEING   step_reclaim: its last reference went (scan_mu)
 *
 * UNTRACKED nodes (pending steps, .ckptfs/, everything of a step or item
 * mount) live as long as the view; their refs are not kept.  LIVE: listed
 * in the root, refs >= 1.  GONE: unlinked, every request on it answers
 * -ENOENT / -ESTALE; refs counts the kernel's references left (and the
 * tree's until the rescan drops it).  FREEING: refs reached 0, nothing can
 * reach it or its nodes; step_reclaim frees them.
 */
enum node_life { LIFE_UNTRACKED, LIFE_LIVE, LIFE_GONE, LIFE_FREEING, LIFE_NSTATES };

static const char *const life_names[LIFE_NSTATES] = { "untracked", "live", "gone", "freeing" };
static const unsigned life_edges[LIFE_NSTATES] = {
	[LIFE_UNTRACKED] = 1u << LIFE_LIVE,
	[LIFE_LIVE] = 1u << LIFE_GONE,
	[LIFE_GONE] = 1u << LIFE_FREEING,
};
_Static_assert(LIFE_NSTATES <= 32, "life_edges is a 32-bit mask per state");

/* Move step s from `from` to `to`: an edge of the table, and s in `from`
 * (each edge has one caller, so a mismatch is a bug: it aborts). */
static void life_set(struct node *s, enum node_life from, enum node_life to)
{
	int cur = from;
	int ok = (life_edges[from] & (1u << to)) && atomic_compare_exchange_strong(&s->life, &cur, (int)to);
	if (!ok) {
		ckpt_log(CKPT_LOG_ERR, "step %s: no edge %s -> %s (it is %s)", s->name, life_names[from],
			 life_names[to], life_names[cur]);
		abort();
	}
}

/* ---- node table ----------------------------------------------------------- */

struct node *ckpt_node_at(ckpt_view *v, ckpt_ino ino)
{
	uint64_t n = atomic_load_explicit(&v->count, memory_order_acquire);
	if (ino == 0 || ino > n)
		return NULL;
	uint64_t i = ino - 1;
	/* A slot is NULL while its (transient) node is freed and not reused. */
	struct node *x =
		__atomic_load_n(&v->pages[i >> PAGE_BITS][i & ((1u << PAGE_BITS) - 1)], __ATOMIC_ACQUIRE);
	assert(!x || (x->ino == ino && x->ops && x->ops->kind == x->kind));
	return x;
}

int ckpt_node_is_gone(ckpt_view *v, const struct node *n)
{
	if (!v->live)
		return 0;
	/* Only steps of a root are ever marked: a few hops at most. */
	while (n && n->ino != CKPT_ROOT_INO) {
		if (atomic_load_explicit(&n->gone, memory_order_relaxed))
			return 1;
		n = ckpt_node_at(v, n->parent);
	}
	return 0;
}

struct node *ckpt_node_new(ckpt_view *v, const struct node_ops *ops, const char *name, struct node *parent)
{
	assert(ops && ops->getattr && ops->size >= sizeof(struct node));
	assert(!parent || node_has_kids(parent) || parent->kind == N_SHARDS);
	struct node *n = calloc(1, ops->size);
	if (!n)
		return NULL;
	n->name = strdup(name);
	if (!n->name) {
		free(n);
		return NULL;
	}
	n->kind = ops->kind;
	n->ops = ops;
	atomic_init(&n->orphan, false);
	atomic_init(&n->gone, false);
	n->parent = parent ? parent->ino : CKPT_ROOT_INO;
	n->mtime_ns = parent ? parent->mtime_ns : 0;
	n->gen = 1;
	atomic_init(&n->life, LIFE_UNTRACKED);
	atomic_init(&n->refs, 0);
	atomic_init(&n->kref, 0);
	ckpt_lock(&v->alloc_lock, CKPT_RANK_ALLOC);
	if (v->nfree) {
		/* a number a freed node had: a new generation (fresh numbers have 1) */
		n->ino = v->free_inos[--v->nfree];
		n->gen = ++v->last_gen + 1;
		n->step = !parent ? 0 : parent->ino == CKPT_ROOT_INO ? n->ino : parent->step;
		uint64_t j = n->ino - 1;
		__atomic_store_n(&v->pages[j >> PAGE_BITS][j & ((1u << PAGE_BITS) - 1)], n, __ATOMIC_RELEASE);
		ckpt_unlock(&v->alloc_lock, CKPT_RANK_ALLOC);
		return n;
	}
	uint64_t i = atomic_load_explicit(&v->count, memory_order_relaxed);
	size_t pg = (size_t)(i >> PAGE_BITS);
	if (pg >= NPAGES) {
		ckpt_unlock(&v->alloc_lock, CKPT_RANK_ALLOC);
		free(n->name);
		free(n);
		ckpt_log(CKPT_LOG_ERR, "too many nodes in the view");
		return NULL;
	}
	if (!v->pages[pg]) {
		v->pages[pg] = calloc((size_t)1 << PAGE_BITS, sizeof(struct node *));
		if (!v->pages[pg]) {
			ckpt_unlock(&v->alloc_lock, CKPT_RANK_ALLOC);
			free(n->name);
			free(n);
			return NULL;
		}
	}
	n->ino = i + 1;
	n->step = !parent ? 0 : parent->ino == CKPT_ROOT_INO ? n->ino : parent->step;
	__atomic_store_n(&v->pages[pg][i & ((1u << PAGE_BITS) - 1)], n, __ATOMIC_RELEASE);
	atomic_store_explicit(&v->count, i + 1, memory_order_release);
	ckpt_unlock(&v->alloc_lock, CKPT_RANK_ALLOC);
	return n;
}

static void node_free_memory(struct node *x)
{
	if (node_has_kids(x))
		free(to_dir(x)->kids);
	free(x->name);
	free(x);
}

void ckpt_node_free(ckpt_view *v, struct node *n)
{
	if (n->ops->destroy)
		n->ops->destroy(v, n);
	ckpt_ino ino = n->ino;
	uint64_t i = ino - 1;
	ckpt_lock(&v->alloc_lock, CKPT_RANK_ALLOC);
	assert(ckpt_node_at(v, ino) == n);
	__atomic_store_n(&v->pages[i >> PAGE_BITS][i & ((1u << PAGE_BITS) - 1)], NULL, __ATOMIC_RELEASE);
	if (v->nfree == v->capfree) {
		size_t cap = v->capfree ? v->capfree * 2 : 64;
		ckpt_ino *f = realloc(v->free_inos, cap * sizeof(*f));
		if (f) {
			v->free_inos = f;
			v->capfree = cap;
		}
	}
	if (v->nfree < v->capfree)
		v->free_inos[v->nfree++] = ino; /* else the number is never reused */
	ckpt_unlock(&v->alloc_lock, CKPT_RANK_ALLOC);
	node_free_memory(n);
}

void ckpt_node_release_all(ckpt_view *v)
{
	uint64_t n = atomic_load(&v->count);
	for (uint64_t i = 1; i <= n; i++) {
		struct node *x = ckpt_node_at(v, i);
		if (x && x->ops->destroy)
			x->ops->destroy(v, x);
	}
}

void ckpt_node_free_all(ckpt_view *v)
{
	uint64_t n = atomic_load(&v->count);
	for (uint64_t i = 1; i <= n; i++) {
		struct node *x = ckpt_node_at(v, i);
		if (x)
			node_free_memory(x);
	}
	for (size_t p = 0; p < NPAGES && v->pages[p]; p++)
		free(v->pages[p]);
	free(v->free_inos);
}

/* ---- kids ------------------------------------------------------------------ */

/* Length of name's digits when name is all digits, else 0. */
static size_t digits(const char *name)
{
	size_t k = strspn(name, "0123456789");
	return name[k] ? 0 : k;
}

/* The order of the root's kids: step folders (names all digits) first, by
 * number, then the rest by strcmp, so that `ls`, `ckptfs info` and the JSON
 * list steps 20 before 100.  Every other directory: strcmp. */
static int kid_cmp(const struct dir_node *dir, const char *a, const char *b)
{
	if (dir->n.ino != CKPT_ROOT_INO)
		return strcmp(a, b);
	size_t da = digits(a), db = digits(b);
	if (!da || !db)
		return da ? -1 : db ? 1 : strcmp(a, b);
	const char *na = a + strspn(a, "0"), *nb = b + strspn(b, "0"); /* leading zeros */
	size_t la = strlen(na), lb = strlen(nb);
	if (la != lb)
		return la < lb ? -1 : 1;
	int c = strcmp(na, nb);
	return c ? c : strcmp(a, b);
}

static size_t kid_pos(const struct dir_node *dir, const char *name, int *found)
{
	size_t lo = 0, hi = dir->nkids;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		int c = kid_cmp(dir, dir->kids[mid]->name, name);
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

int ckpt_node_kid_index(struct node *dir, const char *name, size_t *pos)
{
	int found;
	*pos = kid_pos(to_dir(dir), name, &found);
	return found;
}

/* Kids stay sorted (binary insertion).  layout.c fills directories before
 * they are linked; pending/ adds and removes kids of the root and of
 * pending directories at run time, under ns_lock exclusive. */
void ckpt_node_remove_kid(struct node *dir, struct node *kid)
{
	struct dir_node *d = to_dir(dir);
	int found;
	size_t pos = kid_pos(d, kid->name, &found);
	if (!found || d->kids[pos] != kid)
		return;
	memmove(d->kids + pos, d->kids + pos + 1, (d->nkids - pos - 1) * sizeof(*d->kids));
	d->nkids--;
}

int ckpt_node_add_kid(struct node *dir, struct node *kid)
{
	struct dir_node *d = to_dir(dir);
	assert(!kid->hidden && kid->parent == dir->ino);
	int found;
	size_t pos = kid_pos(d, kid->name, &found);
	if (found)
		return -EEXIST;
	if (d->nkids == d->capkids) {
		size_t cap = d->capkids ? d->capkids * 2 : 8;
		struct node **k = realloc(d->kids, cap * sizeof(*k));
		if (!k)
			return -ENOMEM;
		d->kids = k;
		d->capkids = cap;
	}
	memmove(d->kids + pos + 1, d->kids + pos, (d->nkids - pos) * sizeof(*d->kids));
	d->kids[pos] = kid;
	d->nkids++;
	return 0;
}

struct node *ckpt_node_find_kid(struct node *dir, const char *name)
{
	struct dir_node *d = to_dir(dir);
	int found;
	size_t pos = kid_pos(d, name, &found);
	return found ? d->kids[pos] : NULL;
}

int ckpt_node_entry(ckpt_view *v, ckpt_ino ino, uint64_t index, const char **name, ckpt_attr *attr, int ref)
{
	ckpt_rdlock(&v->ns_lock, CKPT_RANK_NS);
	struct node *dir = ckpt_node_at(v, ino);
	struct node *n = NULL;
	int rc = !dir || ckpt_node_is_gone(v, dir) ? -ENOENT
		 : !dir->ops->readdir		   ? -ENOTDIR
						   : dir->ops->readdir(v, dir, index, &n);
	if (rc == 1) {
		*name = n->name;
		ckpt_node_fill_attr(v, n, attr);
		if (ref)
			ckpt_node_kref(v, n, 1); /* listed (ns_lock) or under dir, which the kernel holds */
	}
	ckpt_rwunlock(&v->ns_lock, CKPT_RANK_NS);
	return rc;
}

int ckpt_node_readdir_kids(ckpt_view *v, struct node *dir, uint64_t index, struct node **out)
{
	(void)v;
	struct dir_node *d = to_dir(dir);
	if (index >= d->nkids)
		return 0;
	*out = d->kids[index];
	return 1;
}

int ckpt_node_ends_with(const char *s, const char *suffix, size_t *stem)
{
	size_t n = strlen(s), k = strlen(suffix);
	if (n <= k || strcmp(s + n - k, suffix))
		return 0;
	*stem = n - k;
	return 1;
}

/* ---- hidden names ---------------------------------------------------------- */

static uint64_t dyn_hash(ckpt_ino parent, const char *name)
{
	return ckpt_fnv1a(name, strlen(name), CKPT_FNV1A_INIT ^ parent);
}

static struct node *dyn_find_locked(ckpt_view *v, ckpt_ino parent, const char *name)
{
	ckpt_assert_held(CKPT_RANK_DYN);
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

/* Moves the map (dyn_lock held) into a new table of nb buckets (a power
 * of two above the count); 0, or -ENOMEM with the old table kept. */
static int dyn_rehash_locked(ckpt_view *v, size_t nb)
{
	ckpt_assert_held(CKPT_RANK_DYN);
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
	return 0;
}

static int dyn_insert_locked(ckpt_view *v, struct node *n)
{
	ckpt_assert_held(CKPT_RANK_DYN);
	assert(n->hidden);
	if ((v->ndyn + 1) * 2 > v->ndyn_buckets) {
		int rc = dyn_rehash_locked(v, v->ndyn_buckets ? v->ndyn_buckets * 2 : 256);
		if (rc)
			return rc;
	}
	size_t mask = v->ndyn_buckets - 1;
	size_t i = dyn_hash(n->parent, n->name) & mask;
	while (v->dyn[i])
		i = (i + 1) & mask;
	v->dyn[i] = n;
	v->ndyn++;
	CKPT_STAT_ADD(hidden_nodes, 1);
	return 0;
}

struct node *ckpt_node_dyn_find(ckpt_view *v, ckpt_ino parent, const char *name)
{
	ckpt_lock(&v->dyn_lock, CKPT_RANK_DYN);
	struct node *n = dyn_find_locked(v, parent, name);
	ckpt_unlock(&v->dyn_lock, CKPT_RANK_DYN);
	return n;
}

int ckpt_node_dyn_add(ckpt_view *v, struct node *n)
{
	ckpt_lock(&v->dyn_lock, CKPT_RANK_DYN);
	int rc = dyn_insert_locked(v, n);
	ckpt_unlock(&v->dyn_lock, CKPT_RANK_DYN);
	return rc;
}

/* ---- lookup and attributes ------------------------------------------------- */

/* Remove n from the map (dyn_lock held): backward-shift deletion keeps
 * every probe chain unbroken; the table halves when it is mostly empty. */
static void dyn_remove_locked(ckpt_view *v, struct node *n)
{
	ckpt_assert_held(CKPT_RANK_DYN);
	size_t mask = v->ndyn_buckets - 1;
	size_t i = dyn_hash(n->parent, n->name) & mask;
	while (v->dyn[i] != n) {
		assert(v->dyn[i]);
		i = (i + 1) & mask;
	}
	v->dyn[i] = NULL;
	v->ndyn--;
	atomic_fetch_sub_explicit(&ckpt_g_stats.hidden_nodes, 1, memory_order_relaxed);
	for (size_t j = (i + 1) & mask; v->dyn[j]; j = (j + 1) & mask) {
		size_t home = dyn_hash(v->dyn[j]->parent, v->dyn[j]->name) & mask;
		/* move j into the hole at i unless its home lies in (i, j] */
		if (((j - home) & mask) >= ((j - i) & mask)) {
			v->dyn[i] = v->dyn[j];
			v->dyn[j] = NULL;
			i = j;
		}
	}
	if (v->ndyn_buckets > 256 && v->ndyn * 8 < v->ndyn_buckets)
		(void)dyn_rehash_locked(v, v->ndyn_buckets / 2); /* on ENOMEM: keep the big table */
}

void ckpt_node_dyn_remove(ckpt_view *v, struct node *n)
{
	ckpt_lock(&v->dyn_lock, CKPT_RANK_DYN);
	if (dyn_find_locked(v, n->parent, n->name) == n)
		dyn_remove_locked(v, n);
	ckpt_unlock(&v->dyn_lock, CKPT_RANK_DYN);
}

/* The invalidation list (dyn_lock held). */
static void inval_unlink_locked(ckpt_view *v, struct node *n)
{
	ckpt_assert_held(CKPT_RANK_DYN);
	if (!n->on_inval)
		return;
	if (n->inval_prev)
		n->inval_prev->inval_next = n->inval_next;
	else
		v->inval_head = n->inval_next;
	if (n->inval_next)
		n->inval_next->inval_prev = n->inval_prev;
	else
		v->inval_tail = n->inval_prev;
	n->inval_prev = n->inval_next = NULL;
	n->on_inval = 0;
	assert(v->inval_len > 0);
	v->inval_len--;
}

static void inval_append_locked(ckpt_view *v, struct node *n)
{
	ckpt_assert_held(CKPT_RANK_DYN);
	assert(!n->on_inval);
	n->inval_prev = v->inval_tail;
	n->inval_next = NULL;
	if (v->inval_tail)
		v->inval_tail->inval_next = n;
	else
		v->inval_head = n;
	v->inval_tail = n;
	n->on_inval = 1;
	v->inval_len++;
}

/* n was answered to the kernel: count the reference, and put it on the
 * invalidation list (dyn_lock held). */
static void ref_locked(ckpt_view *v, struct node *n)
{
	ckpt_assert_held(CKPT_RANK_DYN);
	n->nlookup++;
	if (n->on_inval)
		return;
	n->inval_swept = 0;
	inval_append_locked(v, n);
}

/* ref: count a kernel reference on a transient result (under dyn_lock, so
 * that a concurrent forget cannot free it between the find and the count). */
static int lookup(ckpt_view *v, struct node *dir, const char *name, int ref, struct node **out)
{
	if (!dir->ops->readdir)
		return -ENOTDIR;
	int lrc = node_load(v, dir); /* a committed step of a root builds its kids on first use */
	if (lrc < 0)
		return lrc;
	struct node *n = node_has_kids(dir) ? ckpt_node_find_kid(dir, name) : NULL;
	if (!n) {
		ckpt_lock(&v->dyn_lock, CKPT_RANK_DYN);
		n = dyn_find_locked(v, dir->ino, name);
		if (n && ref && n->transient)
			ref_locked(v, n);
		ckpt_unlock(&v->dyn_lock, CKPT_RANK_DYN);
	}
	if (!n) {
		if (!dir->ops->lookup)
			return -ENOENT;
		struct node *made = NULL;
		int rc = dir->ops->lookup(v, dir, name, &made);
		if (rc < 0)
			return rc;
		assert(made && made->parent == dir->ino);
		if (rc == 1) {
			n = made; /* the directory keeps it (shard files) */
			assert(!n->transient);
		} else {
			ckpt_lock(&v->dyn_lock, CKPT_RANK_DYN);
			n = dyn_find_locked(v, dir->ino, name);
			if (!n) {
				if (dyn_insert_locked(v, made) < 0) {
					ckpt_unlock(&v->dyn_lock, CKPT_RANK_DYN);
					if (made->transient)
						ckpt_node_free(v, made);
					return -ENOMEM;
				}
				n = made;
			}
			if (ref && n->transient)
				ref_locked(v, n);
			ckpt_unlock(&v->dyn_lock, CKPT_RANK_DYN);
			/* A racing lookup that lost: its node was never handed out. */
			if (n != made && made->transient)
				ckpt_node_free(v, made);
		}
	}
	if (ref)
		ckpt_node_kref(v, n, 1); /* n's step is listed (ns_lock held) or holds dir */
	*out = n;
	return 0;
}

int ckpt_node_lookup_locked(ckpt_view *v, struct node *dir, const char *name, struct node **out)
{
	ckpt_assert_held(CKPT_RANK_NS);
	return lookup(v, dir, name, 0, out);
}

int ckpt_node_lookup_ref(ckpt_view *v, struct node *dir, const char *name, struct node **out)
{
	return lookup(v, dir, name, 1, out);
}

/* ---- the life of a step of a live root ------------------------------------ */

/* The tracked step n belongs to, or NULL.  n is held (by the caller's
 * reference, or listed under ns_lock), hence its step too. */
static struct node *tracked_step(ckpt_view *v, const struct node *n)
{
	if (!n->step)
		return NULL;
	struct node *s = ckpt_node_at(v, n->step);
	assert(s && s->parent == CKPT_ROOT_INO);
	return s && atomic_load_explicit(&s->life, memory_order_relaxed) != LIFE_UNTRACKED ? s : NULL;
}

void ckpt_node_step_track(struct node *step)
{
	assert(step->parent == CKPT_ROOT_INO && step->step == step->ino);
	atomic_store(&step->refs, 1); /* the tree's */
	life_set(step, LIFE_UNTRACKED, LIFE_LIVE);
}

void ckpt_node_kref(ckpt_view *v, struct node *n, uint64_t k)
{
	struct node *s = tracked_step(v, n);
	if (s) {
		uint64_t was = atomic_fetch_add(&s->refs, k);
		(void)was;
		assert(was > 0); /* a reference already held keeps it: never revived from 0 */
		atomic_fetch_add(&n->kref, k);
	}
}

/* Drop k references of tracked step s: 1 when they were the last (the
 * caller then frees it under scan_mu).  More than it holds: logged, and
 * the step is kept (a kernel forgetting more than it was answered). */
static int step_put(struct node *s, uint64_t k)
{
	uint64_t r = atomic_load(&s->refs);
	do {
		if (k > r) {
			ckpt_log(CKPT_LOG_WARN, "step %s: %llu references dropped, it has %llu; kept",
				 s->name, (unsigned long long)k, (unsigned long long)r);
			return 0;
		}
	} while (!atomic_compare_exchange_weak(&s->refs, &r, r - k));
	return r == k;
}

void ckpt_node_step_gone(ckpt_view *v, struct node *s)
{
	ckpt_assert_held(CKPT_RANK_NS);
	life_set(s, LIFE_LIVE, LIFE_GONE);
	if (v->nunlinked == v->capunlinked) {
		size_t cap = v->capunlinked ? v->capunlinked * 2 : 16;
		struct node **a = realloc(v->unlinked, cap * sizeof(*a));
		if (a) {
			v->unlinked = a;
			v->capunlinked = cap;
		}
	}
	if (v->nunlinked < v->capunlinked)
		v->unlinked[v->nunlinked++] = s; /* else its tree reference stays: kept until the view goes */
	/* The kernel keeps the step's dentries (and so its references to the
	 * step's inodes) until they are invalidated: ask for that, the step's
	 * own entry first (it drops the unused ones below it at once), then
	 * that of every node of it the kernel holds.  A lookup answered before
	 * the step went may put its dentry in place after the step's entry was
	 * invalidated, under a directory of the step; its own invalidation waits
	 * for that lookup (the kernel holds the directory's lock across it). */
	struct node **held = NULL;
	size_t nh = 0, cap = 0;
	ckpt_lock(&v->alloc_lock, CKPT_RANK_ALLOC);
	uint64_t count = atomic_load(&v->count);
	for (uint64_t i = 1; i <= count; i++) {
		struct node *x = ckpt_node_at(v, i);
		if (!x || x == s || x->step != s->ino || x->transient || !atomic_load(&x->kref))
			continue; /* transient ones are on the list from their lookup */
		if (nh == cap) {
			size_t nc = cap ? cap * 2 : 64;
			struct node **a = realloc(held, nc * sizeof(*a));
			if (!a)
				break; /* those left wait for the kernel to shrink its cache */
			held = a;
			cap = nc;
		}
		held[nh++] = x;
	}
	ckpt_unlock(&v->alloc_lock, CKPT_RANK_ALLOC);
	ckpt_lock(&v->dyn_lock, CKPT_RANK_DYN);
	if (!s->on_inval)
		inval_append_locked(v, s);
	for (size_t i = 0; i < nh; i++)
		if (!held[i]->on_inval)
			inval_append_locked(v, held[i]);
	ckpt_unlock(&v->dyn_lock, CKPT_RANK_DYN);
	free(held);
}

static void step_reclaim(ckpt_view *v, struct node *s);

int ckpt_node_drop_unlinked(ckpt_view *v)
{
	ckpt_assert_held(CKPT_RANK_SCAN);
	size_t n = v->nunlinked;
	for (size_t i = 0; i < n; i++)
		if (step_put(v->unlinked[i], 1))
			step_reclaim(v, v->unlinked[i]);
	v->nunlinked = 0;
	return n > 0;
}

/* Free GONE step s, whose last reference went, and every node of it
 * (scan_mu held: serialized with the rescan's walks of the node table and
 * the array list).  Nothing reaches s any more: it is unlinked, the kernel
 * forgot all of its inodes, and no request on them is in progress. */
static void step_reclaim(ckpt_view *v, struct node *s)
{
	ckpt_assert_held(CKPT_RANK_SCAN);
	life_set(s, LIFE_GONE, LIFE_FREEING);
	ckpt_ino sino = s->ino;
	/* 1. the hidden-name map and the invalidation list */
	ckpt_lock(&v->dyn_lock, CKPT_RANK_DYN);
	struct node *drop[64];
	for (;;) {
		size_t k = 0;
		for (size_t i = 0; i < v->ndyn_buckets && k < 64; i++)
			if (v->dyn[i] && v->dyn[i]->step == sino)
				drop[k++] = v->dyn[i];
		for (size_t i = 0; i < k; i++) {
			inval_unlink_locked(v, drop[i]);
			dyn_remove_locked(v, drop[i]);
		}
		if (k < 64)
			break;
	}
	for (struct node *x = v->inval_head, *next; x; x = next) {
		next = x->inval_next;
		if (x->step == sino)
			inval_unlink_locked(v, x);
	}
	ckpt_unlock(&v->dyn_lock, CKPT_RANK_DYN);
	/* 2. its arrays and stores leave the view's lists */
	struct aref **ars = NULL;
	ckpt_store **sts = NULL;
	size_t nar = 0, nst = 0;
	ckpt_lock(&v->res_lock, CKPT_RANK_RES);
	ars = malloc((v->narefs ? v->narefs : 1) * sizeof(*ars));
	sts = malloc((v->nstores ? v->nstores : 1) * sizeof(*sts));
	if (ars && sts) {
		size_t keep = 0;
		for (size_t i = 0; i < v->narefs; i++)
			if (v->arefs[i]->step == sino)
				ars[nar++] = v->arefs[i];
			else
				v->arefs[keep++] = v->arefs[i];
		v->narefs = keep;
		keep = 0;
		for (size_t i = 0; i < v->nstores; i++)
			if (v->store_step[i] == sino) {
				sts[nst++] = v->stores[i];
			} else {
				v->stores[keep] = v->stores[i];
				v->store_step[keep++] = v->store_step[i];
			}
		v->nstores = keep;
	}
	ckpt_unlock(&v->res_lock, CKPT_RANK_RES);
	/* 3. its nodes leave the table, all in one section: a walk of the table
	 * (under alloc_lock) sees all of them or none */
	struct node **nodes = NULL;
	size_t nn = 0, cap = 0;
	ckpt_lock(&v->alloc_lock, CKPT_RANK_ALLOC);
	uint64_t count = atomic_load(&v->count);
	for (uint64_t i = 1; i <= count; i++) {
		struct node *x = ckpt_node_at(v, i);
		if (!x || x->step != sino)
			continue;
		if (nn == cap) {
			size_t nc = cap ? cap * 2 : 64;
			struct node **a = realloc(nodes, nc * sizeof(*a));
			if (!a)
				break; /* the rest stay in the table until the view goes */
			nodes = a;
			cap = nc;
		}
		nodes[nn++] = x;
	}
	if (v->nfree + nn > v->capfree) {
		size_t nc = v->capfree ? v->capfree : 64;
		while (nc < v->nfree + nn)
			nc *= 2;
		ckpt_ino *f = realloc(v->free_inos, nc * sizeof(*f));
		if (f) {
			v->free_inos = f;
			v->capfree = nc;
		}
	}
	for (size_t i = 0; i < nn; i++) {
		uint64_t j = nodes[i]->ino - 1;
		__atomic_store_n(&v->pages[j >> PAGE_BITS][j & ((1u << PAGE_BITS) - 1)], NULL,
				 __ATOMIC_RELEASE);
		if (v->nfree < v->capfree)
			v->free_inos[v->nfree++] = nodes[i]->ino; /* else the number is never reused */
	}
	ckpt_unlock(&v->alloc_lock, CKPT_RANK_ALLOC);
	/* 4. what the nodes own, then the arrays (once their prefetch tasks
	 * ended), the stores (newest first: a sub-store may lean on the one it
	 * was made from) and the nodes' memory */
	for (size_t i = 0; i < nn; i++)
		if (nodes[i]->ops->destroy)
			nodes[i]->ops->destroy(v, nodes[i]);
	if (nar) {
		ckpt_array **arrs = malloc(nar * sizeof(*arrs));
		for (size_t i = 0; arrs && i < nar; i++)
			arrs[i] = ars[i]->arr;
		if (arrs)
			ckpt_arrays_retire(v->ctx, arrs, nar); /* its cached chunks and streams */
		free(arrs);
	}
	for (size_t i = 0; i < nar; i++) {
		ckpt_array_destroy(ars[i]->arr);
		free(ars[i]->sharding);
		free(ars[i]);
	}
	for (size_t i = nst; i-- > 0;)
		ckpt_store_destroy(sts[i]);
	free(ars);
	free(sts);
	for (size_t i = 0; i < nn; i++)
		node_free_memory(nodes[i]);
	free(nodes);
	CKPT_STAT_ADD(steps_freed, 1);
}

void ckpt_view_forget(ckpt_view *v, ckpt_ino ino, uint64_t nlookup)
{
	ckpt_lock(&v->dyn_lock, CKPT_RANK_DYN);
	struct node *n = ckpt_node_at(v, ino);
	/* the kernel's references to n keep n's step (this call drops them) */
	struct node *s = n ? tracked_step(v, n) : NULL;
	/* Only the references n's step counted go back to it: lookups answered
	 * before the step was tracked (its pending folder's, whose inode a
	 * commit hands on) were never counted. */
	uint64_t counted = 0;
	if (s) {
		uint64_t r = atomic_load(&n->kref);
		do
			counted = r < nlookup ? r : nlookup;
		while (!atomic_compare_exchange_weak(&n->kref, &r, r - counted));
	}
	if (!n || !n->transient) {
		ckpt_unlock(&v->dyn_lock, CKPT_RANK_DYN);
		if (s && counted && step_put(s, counted)) {
			ckpt_lock(&v->scan_mu, CKPT_RANK_SCAN);
			step_reclaim(v, s);
			ckpt_unlock(&v->scan_mu, CKPT_RANK_SCAN);
		}
		return; /* the others go with their step (freed above), or with the view */
	}
	if (nlookup > n->nlookup) {
		ckpt_log(CKPT_LOG_WARN, "forget of %llu references to inode %llu, which has %llu",
			 (unsigned long long)nlookup, (unsigned long long)ino,
			 (unsigned long long)n->nlookup);
		nlookup = n->nlookup;
	}
	n->nlookup -= nlookup;
	int last = n->nlookup == 0;
	if (last) {
		inval_unlink_locked(v, n);
		dyn_remove_locked(v, n);
	}
	ckpt_unlock(&v->dyn_lock, CKPT_RANK_DYN);
	if (last)
		ckpt_node_free(v, n); /* before its step's references drop: the step may go next */
	if (s && counted && step_put(s, counted)) {
		ckpt_lock(&v->scan_mu, CKPT_RANK_SCAN);
		step_reclaim(v, s);
		ckpt_unlock(&v->scan_mu, CKPT_RANK_SCAN);
	}
}

/* Sweep directory p (dyn_lock held): every entry of the list under p that
 * was not swept yet moves to the tail, marked swept.  The caller hands out
 * p's own entry instead of theirs: invalidating a directory's entry makes
 * the kernel drop the unused dentries below it at once (one invalidation,
 * one lock of the grandparent, for any number of names), and their forgets
 * take them off the list.  Those still on it when they come round again
 * were in use or being looked up at the time: each is then invalidated on
 * its own, so no answered name is ever left for the kernel to keep. */
static void inval_sweep_locked(ckpt_view *v, ckpt_ino p)
{
	ckpt_assert_held(CKPT_RANK_DYN);
	struct node *stop = v->inval_tail, *n = v->inval_head;
	while (n) {
		struct node *next = n->inval_next, *last = n;
		if (n->parent == p && !n->inval_swept) {
			inval_unlink_locked(v, n);
			n->inval_swept = 1;
			inval_append_locked(v, n);
		}
		if (last == stop)
			break; /* the ones moved (now behind stop) are not looked at again */
		n = next;
	}
}

int ckpt_view_next_inval(ckpt_view *v, ckpt_ino *parent, char *name, size_t cap)
{
	ckpt_lock(&v->dyn_lock, CKPT_RANK_DYN);
	struct node *n = v->inval_head;
	int got = 0;
	while (n && !got) {
		struct node *next = n->inval_next;
		if (v->inval_len > CKPT_VIEW_INVAL_NAMES_CAP && !n->inval_swept &&
		    n->parent != CKPT_ROOT_INO) {
			/* Too many names wait (lookups outrun one invalidation per
			 * name, each of which waits for the lookups in progress in
			 * the directory): invalidate the directory's entry. */
			const struct node *p = ckpt_node_at(v, n->parent);
			size_t len = p ? strlen(p->name) : cap;
			if (len < cap && p->ino != CKPT_ROOT_INO) {
				memcpy(name, p->name, len + 1);
				*parent = p->parent;
				inval_sweep_locked(v, p->ino);
				got = 1;
				break;
			}
		}
		inval_unlink_locked(v, n);
		size_t len = strlen(n->name);
		if (len < cap) { /* longer names never came from the kernel */
			memcpy(name, n->name, len + 1);
			*parent = n->parent;
			got = 1;
		}
		n = next;
	}
	ckpt_unlock(&v->dyn_lock, CKPT_RANK_DYN);
	return got;
}

void ckpt_node_fill_attr(ckpt_view *v, struct node *n, ckpt_attr *a)
{
	memset(a, 0, sizeof(*a));
	a->ino = n->ino;
	a->generation = n->gen;
	a->transient = n->transient;
	a->mtime_ns = n->mtime_ns;
	a->immutable = 1;
	a->nlink = 1;
	n->ops->getattr(v, n, a);
	if (n->ino == CKPT_ROOT_INO && v->live) {
		a->immutable = 0; /* steps come and go */
		a->mtime_ns = atomic_load(&v->root_mtime);
	}
	assert(!a->is_dir == !n->ops->readdir);
}

/* ---- owned resources ------------------------------------------------------- */

int ckpt_node_own_store(ckpt_view *v, ckpt_store *s, const struct node *owner)
{
	ckpt_lock(&v->res_lock, CKPT_RANK_RES);
	ckpt_store **p = realloc(v->stores, (v->nstores + 1) * sizeof(*p));
	if (p)
		v->stores = p;
	ckpt_ino *q = p ? realloc(v->store_step, (v->nstores + 1) * sizeof(*q)) : NULL;
	if (q) {
		v->store_step = q;
		v->store_step[v->nstores] = owner ? owner->step : 0;
		v->stores[v->nstores++] = s;
	}
	ckpt_unlock(&v->res_lock, CKPT_RANK_RES);
	return q ? 0 : -ENOMEM;
}

struct aref *ckpt_node_new_aref(ckpt_view *v, ckpt_array *arr, int ocdbt)
{
	struct aref *ar = calloc(1, sizeof(*ar));
	if (!ar)
		return NULL;
	ar->arr = arr;
	ar->ocdbt = ocdbt;
	ckpt_lock(&v->res_lock, CKPT_RANK_RES);
	struct aref **p = realloc(v->arefs, (v->narefs + 1) * sizeof(*p));
	if (p) {
		v->arefs = p;
		v->arefs[v->narefs++] = ar;
	}
	ckpt_unlock(&v->res_lock, CKPT_RANK_RES);
	if (!p) {
		free(ar);
		return NULL;
	}
	return ar;
}
