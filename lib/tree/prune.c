/*
 * prune.c - deleting committed steps of a writable root through the mount
 * (CheckpointManager's max_to_keep, `rm -rf MNT/<step>`).
 *
 * Only with -o delete_steps (ckpt_view_opts.delete_steps): otherwise every
 * removal inside a committed step is -EROFS and no step loses a byte to a
 * stray `rm`.
 *
 * The mount shows a committed step as its tree of arrays, not as the files
 * Orbax stored, so removing it file by file cannot map onto the source.  A
 * removal anywhere inside committed step S is taken as the deletion of all
 * of S, at once:
 *   - the first unlink or rmdir below S takes S out of the source: on a
 *     local disk its folder is renamed to "S" CKPT_ORBAX_TMP_INFIX ".deleted"
 *     (a name neither Orbax nor ckptfs takes for a step), then removed; on an
 *     object store its commit_success.txt is deleted first (the step is no
 *     step from then on), then every other object;
 *   - S leaves the root's listing and moves to the hidden-name map, so that
 *     the rest of the removal (rmtree's unlinks, rmdirs and its final
 *     rmdir of S) still finds what it walks: each unlink or rmdir then
 *     removes one node of what the mount showed (rmdir: ENOTEMPTY while the
 *     folder has kids), and the rmdir of S itself frees its name.
 * A crash or kill in the middle leaves no partial step: the source lost S
 * at the first call.  Runs with ns_lock exclusive.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "orbax.h"
#include "store.h"
#include "sysio.h"
#include "upload.h"
#include "tree_int.h"

/* The committed step of the root that n is in (n itself when it is one),
 * or NULL. */
struct node *ckpt_prune_step_of(ckpt_view *v, struct node *n)
{
	if (!v->writable || !n || n->ino == CKPT_ROOT_INO || strcmp(v->kind, "root"))
		return NULL;
	while (n && n->parent != CKPT_ROOT_INO)
		n = ckpt_node_at(v, n->parent);
	if (!n || n->kind == N_PSTEP || !node_has_kids(n) || !strcmp(n->name, ".ckptfs"))
		return NULL;
	return n;
}

struct keys {
	char **k;
	size_t n, cap;
};

static int collect(void *ctx, const char *key, uint64_t size)
{
	(void)size;
	struct keys *ks = ctx;
	if (ks->n == ks->cap) {
		size_t cap = ks->cap ? ks->cap * 2 : 64;
		char **p = realloc(ks->k, cap * sizeof(*p));
		if (!p)
			return -ENOMEM;
		ks->k = p;
		ks->cap = cap;
	}
	if (!(ks->k[ks->n] = strdup(key)))
		return -ENOMEM;
	ks->n++;
	return 0;
}

/* Object store: the marker, then every other object of prefix S/. */
static int delete_objects(ckpt_view *v, const char *step)
{
	char prefix[VIEW_PATH_MAX], marker[VIEW_PATH_MAX];
	snprintf(prefix, sizeof(prefix), "%s/", step);
	snprintf(marker, sizeof(marker), "%s/%s", step, CKPT_ORBAX_COMMIT_SUCCESS);
	struct keys ks = { 0 };
	int rc = ckpt_store_list(v->src, prefix, collect, &ks);
	if (rc == -ENOENT)
		rc = 0;
	if (!rc)
		rc = ckpt_store_delete(v->src, marker);
	for (size_t i = 0; i < ks.n; i++) {
		if (!rc && strcmp(ks.k[i], marker))
			rc = ckpt_store_delete(v->src, ks.k[i]);
		free(ks.k[i]);
	}
	free(ks.k);
	return rc;
}

/* Take step s out of the source and out of the root's listing. */
static int retire(ckpt_view *v, struct node *s)
{
	int rc;
	if (v->opts.spool_dir) {
		rc = delete_objects(v, s->name);
	} else {
		char from[VIEW_PATH_MAX], to[VIEW_PATH_MAX];
		snprintf(from, sizeof(from), "%s/%s", v->source, s->name);
		snprintf(to, sizeof(to), "%s/%s%s.deleted", v->source, s->name, CKPT_ORBAX_TMP_INFIX);
		ckpt_rmtree(to); /* one left by an earlier crash */
		rc = rename(from, to) && errno != ENOENT ? -errno : 0;
		if (!rc && ckpt_rmtree(to) < 0)
			ckpt_log(CKPT_LOG_WARN, "%s: cannot remove it all (left as it is, not a step)", to);
	}
	if (rc) {
		ckpt_log(CKPT_LOG_ERR, "step %s: cannot delete it: %s", s->name, strerror(-rc));
		return rc;
	}
	struct node *root = ckpt_node_at(v, CKPT_ROOT_INO);
	ckpt_node_remove_kid(root, s);
	atomic_store(&s->pruned, true);
	s->hidden = 1; /* by name only from here on (its readers hold no pointer to it) */
	rc = ckpt_node_dyn_add(v, s);
	ckpt_log(CKPT_LOG_INFO, "step %s: deleted", s->name);
	return rc;
}

int ckpt_prune_remove(ckpt_view *v, struct node *dir, struct node *n, int rmdir_op)
{
	struct node *s = ckpt_prune_step_of(v, n ? n : dir);
	if (!s)
		return -EROFS;
	if (!v->opts.delete_steps && !atomic_load(&s->pruned)) {
		ckpt_log(CKPT_LOG_WARN,
			 "step %s: committed steps are read-only here; mount with -o delete_steps to let rm "
			 "-r "
			 "and Orbax's max_to_keep delete them (the first removal inside a step deletes all "
			 "of it)",
			 s->name);
		return -EROFS;
	}
	if (!atomic_load(&s->pruned)) {
		int rc = retire(v, s);
		if (rc)
			return rc;
	}
	if (!n)
		return -ENOENT;
	if (rmdir_op && !node_has_kids(n))
		return -ENOTDIR;
	if (!rmdir_op && node_has_kids(n))
		return -EISDIR;
	if (rmdir_op && node_load(v, n) == 0 && to_dir(n)->nkids)
		return -ENOTEMPTY;
	if (n == s)
		ckpt_node_dyn_remove(v, s);
	else if (!n->hidden)
		ckpt_node_remove_kid(dir, n);
	atomic_store(&n->orphan, true);
	return 0;
}
