/*
 * latest.c - the `latest` entry of a CheckpointManager root: a symlink
 * whose target is the name of the newest committed step (the committed
 * step folder of the root's kids with the greatest number, as Orbax's
 * latest_step picks it: "100" over "20", "step_100" over "step_20").  It
 * is listed after the steps and looked up by name only while
 * the root has a committed step; it is no kid of the root (so it is never
 * taken for a step, and no rescan or commit has to move it) and not in the
 * hidden-name map: the root's ops answer it (companions.c).  Its target is
 * read from the kids on every readlink, so it follows the live root; its
 * attributes are not cached by the kernel (not immutable), nor is the
 * target (the daemon does not ask FUSE to cache symlinks).
 *
 * Node state (one node per root view, made at open, freed with the view):
 *   shown   - the root has a committed step: listed, looked up, readlink
 *             answers the step's name
 *   absent  - no committed step: not listed, lookup -ENOENT, readlink
 *             (through an inode the kernel kept) -ENOENT
 * Each answer reads the state from the root's kids under ns_lock.
 */
#include <string.h>

#include "tree_int.h"

struct latest_node {
	struct node n;
	_Atomic size_t len; /* length of the target at the last answer (st_size) */
};

/* The step number a folder name ends with (Orbax's "N", "PREFIX_N",
 * "PREFIX_000N"): its digits without leading zeros, *len of them; NULL
 * when the name ends with no digit. */
static const char *step_number(const char *name, size_t *len)
{
	size_t n = strlen(name), k = n;
	while (k > 0 && name[k - 1] >= '0' && name[k - 1] <= '9')
		k--;
	if (k == n)
		return NULL;
	while (k < n - 1 && name[k] == '0')
		k++;
	*len = n - k;
	return name + k;
}

/* The newest committed step of root by number (the last of equal numbers
 * in kid order), or NULL (ns_lock held). */
static const char *target(struct node *root)
{
	struct dir_node *d = to_dir(root);
	const char *best = NULL, *bnum = NULL;
	size_t blen = 0;
	for (size_t i = 0; i < d->nkids; i++) {
		struct node *k = d->kids[i];
		size_t len;
		const char *num = step_number(k->name, &len);
		if (k->kind != N_DIR || !num || atomic_load(&k->orphan) || atomic_load(&k->gone))
			continue;
		if (!best || len > blen || (len == blen && memcmp(num, bnum, len) >= 0)) {
			best = k->name;
			bnum = num;
			blen = len;
		}
	}
	return best;
}

/* Refresh n's size from the root's kids (ns_lock held): 1 when shown. */
static int refresh(ckpt_view *v, struct node *n)
{
	const char *t = target(ckpt_node_at(v, CKPT_ROOT_INO));
	atomic_store(&container_of(n, struct latest_node, n)->len, t ? strlen(t) : 0);
	return t != NULL;
}

static void latest_attr(ckpt_view *v, struct node *n, ckpt_attr *a)
{
	a->is_link = 1;
	a->mode = 0777;
	a->immutable = 0; /* its target moves */
	a->mtime_ns = atomic_load(&v->root_mtime);
	a->size = atomic_load(&container_of(n, struct latest_node, n)->len);
}

/* Before getattr answers (no view lock held): its size. */
static void latest_prepare(ckpt_view *v, struct node *n)
{
	ckpt_rdlock(&v->ns_lock, CKPT_RANK_NS);
	refresh(v, n);
	ckpt_rwunlock(&v->ns_lock, CKPT_RANK_NS);
}

static ssize_t latest_readlink(ckpt_view *v, struct node *n, char *buf, size_t cap)
{
	(void)n;
	const char *t = target(ckpt_node_at(v, CKPT_ROOT_INO));
	if (!t)
		return -ENOENT;
	size_t len = strlen(t);
	if (len >= cap)
		return -ENAMETOOLONG;
	memcpy(buf, t, len + 1);
	return (ssize_t)len;
}

static const struct node_ops latest_ops = {
	.kind = N_LINK,
	.size = sizeof(struct latest_node),
	.getattr = latest_attr,
	.prepare = latest_prepare,
	.readlink = latest_readlink,
};

int ckpt_latest_make(ckpt_view *v)
{
	struct node *root = ckpt_node_at(v, CKPT_ROOT_INO);
	v->latest = ckpt_node_new(v, &latest_ops, CKPT_LATEST_NAME, root);
	return v->latest ? 0 : -ENOMEM;
}

int ckpt_latest_is(ckpt_view *v, ckpt_ino parent, const char *name)
{
	return v->latest && parent == CKPT_ROOT_INO && !strcmp(name, CKPT_LATEST_NAME);
}

int ckpt_latest_entry(ckpt_view *v, struct node **out)
{
	if (!v->latest || !refresh(v, v->latest))
		return 0;
	*out = v->latest;
	return 1;
}

int ckpt_latest_refuse(const char *what)
{
	ckpt_log(CKPT_LOG_WARN,
		 "%s: cannot %s: it is the root's link to its newest committed step, made by ckptfs "
		 "(read-only)",
		 CKPT_LATEST_NAME, what);
	return -EPERM;
}
