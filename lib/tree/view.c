/*
 * view.c - the public read-side calls on the mounted tree: open/destroy,
 * lookup, readdir, getattr, reads and xattrs.  Each one finds the node and
 * dispatches through its kind's ops table (view_internal.h); the write-side
 * calls (mkdir, create, write, ...) are in pending.c.
 */
#include <stdlib.h>
#include <string.h>

#include "view_internal.h"

/* .ckptfs/: hidden, reachable by name */
#define VIEW_META_DIR ".ckptfs"
#define VIEW_STATS_FILE "stats"

int ckpt_view_open(const char *source, const ckpt_view_opts *opts, ckpt_view **out)
{
	ckpt_view *v = calloc(1, sizeof(*v));
	if (!v)
		return -ENOMEM;
	if (opts)
		v->opts = *opts;
	pthread_mutex_init(&v->alloc_lock, NULL);
	pthread_mutex_init(&v->dyn_lock, NULL);
	pthread_mutex_init(&v->res_lock, NULL);
	pthread_rwlock_init(&v->ns_lock, NULL);
	v->source = strdup(source);
	int rc = v->source ? ckpt_ctx_create(&v->opts.ctx, &v->ctx) : -ENOMEM;
	if (rc < 0) {
		free(v->source);
		free(v);
		return rc;
	}
	struct node *root = node_new(v, &dir_ops, "", NULL);
	if (!root) {
		ckpt_view_destroy(v);
		return -ENOMEM;
	}
	assert(root->ino == CKPT_ROOT_INO);
	rc = layout_build_view(v, source);
	if (rc < 0) {
		ckpt_view_destroy(v);
		return rc;
	}
	v->writable = !strcmp(v->kind, "root") && !v->opts.read_only;
	struct node *meta = node_new(v, &dir_ops, VIEW_META_DIR, root);
	struct node *stats = meta ? node_new(v, &stats_ops, VIEW_STATS_FILE, meta) : NULL;
	if (meta)
		meta->hidden = 1;
	if (!stats || view_add_kid(meta, stats) < 0 || view_dyn_add(v, meta) < 0) {
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
	node_release_all(v); /* pending steps, safetensors layouts, ... */
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
	node_free_all(v);
	free(v->dyn);
	free(v->source);
	pthread_rwlock_destroy(&v->ns_lock);
	pthread_mutex_destroy(&v->alloc_lock);
	pthread_mutex_destroy(&v->dyn_lock);
	pthread_mutex_destroy(&v->res_lock);
	free(v);
}

const char *ckpt_view_kind(const ckpt_view *v)
{
	return v->kind;
}

int ckpt_view_getattr(ckpt_view *v, ckpt_ino ino, ckpt_attr *out)
{
	struct node *n = view_node(v, ino);
	if (!n)
		return -ENOENT;
	view_fill_attr(v, n, out);
	return 0;
}

int ckpt_view_lookup(ckpt_view *v, ckpt_ino parent, const char *name, ckpt_attr *out)
{
	pthread_rwlock_rdlock(&v->ns_lock);
	struct node *dir = view_node(v, parent);
	struct node *n = NULL;
	int rc = dir ? node_lookup_ref(v, dir, name, &n) : -ENOENT;
	if (rc == 0)
		view_fill_attr(v, n, out);
	pthread_rwlock_unlock(&v->ns_lock);
	return rc;
}

int ckpt_view_readdir(ckpt_view *v, ckpt_ino ino, uint64_t index, const char **name, ckpt_attr *attr)
{
	pthread_rwlock_rdlock(&v->ns_lock);
	struct node *dir = view_node(v, ino);
	struct node *n = NULL;
	int rc = !dir ? -ENOENT : !dir->ops->readdir ? -ENOTDIR : dir->ops->readdir(v, dir, index, &n);
	if (rc == 1) {
		*name = n->name;
		view_fill_attr(v, n, attr);
	}
	pthread_rwlock_unlock(&v->ns_lock);
	return rc;
}

int ckpt_view_read_iov(ckpt_view *v, ckpt_ino ino, uint64_t off, size_t len, struct iovec *iov, int max,
		       ckpt_pin **pins, int *npins)
{
	struct node *n = view_node(v, ino);
	*npins = 0;
	if (!n || !n->ops->read_iov || max < 3)
		return -ENOTSUP;
	return n->ops->read_iov(v, n, off, len, iov, max, pins, npins);
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
	if (!n->ops->read)
		return -EISDIR;
	return n->ops->read(v, n, off, len, dst);
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
	if (!n->ops->getxattr)
		return -ENODATA;
	return n->ops->getxattr(v, n, name, buf, cap);
}

ssize_t ckpt_view_listxattr(ckpt_view *v, ckpt_ino ino, char *buf, size_t cap)
{
	struct node *n = view_node(v, ino);
	if (!n)
		return -ENOENT;
	if (!n->ops->listxattr)
		return 0;
	return n->ops->listxattr(v, n, buf, cap);
}
