/*
 * view.c - the public read-side calls on the mounted tree: open/destroy,
 * lookup, readdir, getattr, reads and xattrs.  Each one finds the node and
 * dispatches through its kind's ops table (tree_int.h); the write-side
 * calls (mkdir, create, write, ...) are in pending/.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sysio.h"
#include "tree_int.h"

/* .ckptfs/: hidden, reachable by name */
#define VIEW_META_DIR ".ckptfs"
#define VIEW_STATS_FILE "stats"
#define VIEW_LOG_FILE "log"
/* A root whose store reports no mtime (object stores) is listed again at
 * most this often. */
#define RESCAN_INTERVAL_NS 1000000000ll
/* A folder mtime this close to the wall clock may hide a later change with
 * the same (coarse) timestamp: list again on the next call. */
#define RESCAN_UNSURE_NS 2000000000ll

static int64_t wall_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* After a rescan unlinked steps: the files of theirs that were ever opened
 * may have pages in the kernel's cache, which an open file descriptor
 * would go on reading without asking; queue them for an inode
 * invalidation (ckpt_view_next_inval_inode), each once.  The node table is
 * scanned under alloc_lock: a transient node is freed only after its slot
 * is cleared under that lock, so every node seen stays readable. */
static void queue_gone_files(ckpt_view *v)
{
	ckpt_ino *add = NULL;
	size_t n = 0, cap = 0;
	ckpt_lock(&v->alloc_lock, CKPT_RANK_ALLOC);
	uint64_t count = atomic_load(&v->count);
	for (uint64_t i = 1; i <= count; i++) {
		struct node *x = ckpt_node_at(v, i);
		if (!x || atomic_load(&x->kcache) != NODE_OPENED || !ckpt_node_is_gone(v, x))
			continue;
		if (n == cap) {
			size_t nc = cap ? cap * 2 : 64;
			ckpt_ino *a = realloc(add, nc * sizeof(*a));
			if (!a)
				break; /* the next rescan with changes tries the rest */
			add = a;
			cap = nc;
		}
		add[n++] = i;
		atomic_store(&x->kcache, NODE_INVAL_QUEUED);
	}
	ckpt_unlock(&v->alloc_lock, CKPT_RANK_ALLOC);
	if (!n)
		return;
	ckpt_lock(&v->inval_mu, CKPT_RANK_INVAL);
	if (v->ninval + n > v->capinval) {
		size_t nc = v->capinval ? v->capinval : 64;
		while (nc < v->ninval + n)
			nc *= 2;
		ckpt_ino *a = realloc(v->inval_inos, nc * sizeof(*a));
		if (a) {
			v->inval_inos = a;
			v->capinval = nc;
		}
	}
	size_t fit = v->capinval - v->ninval < n ? v->capinval - v->ninval : n;
	if (fit)
		memcpy(v->inval_inos + v->ninval, add, fit * sizeof(*add));
	v->ninval += fit;
	ckpt_unlock(&v->inval_mu, CKPT_RANK_INVAL);
	free(add);
	if (v->inval_notify)
		v->inval_notify(v->inval_arg);
}

/* After a rescan unlinked steps: their arrays' decoded chunks can never be
 * read again (every read of a gone step answers ESTALE); drop them from the
 * cache now rather than let them crowd out live data until they age out.
 * Under scan_mu, as the freeing of a step (node.c): the arrays listed here
 * stay alive until ckpt_arrays_retire is done with them. */
static void retire_gone_arrays(ckpt_view *v)
{
	ckpt_array **gone = NULL;
	size_t n = 0, cap = 0;
	ckpt_lock(&v->res_lock, CKPT_RANK_RES);
	for (size_t i = 0; i < v->narefs; i++) {
		struct aref *ar = v->arefs[i];
		const struct node *s = ar->step ? ckpt_node_at(v, ar->step) : NULL;
		if (ar->retired || !s || !atomic_load(&s->gone))
			continue;
		if (n == cap) {
			size_t nc = cap ? cap * 2 : 64;
			ckpt_array **a = realloc(gone, nc * sizeof(*a));
			if (!a)
				break; /* the next rescan with changes tries the rest */
			gone = a;
			cap = nc;
		}
		gone[n++] = ar->arr;
		ar->retired = 1;
	}
	ckpt_unlock(&v->res_lock, CKPT_RANK_RES);
	ckpt_arrays_retire(v->ctx, gone, n);
	free(gone);
}

int ckpt_view_next_inval_inode(ckpt_view *v, ckpt_ino *ino)
{
	ckpt_lock(&v->inval_mu, CKPT_RANK_INVAL);
	int got = v->ninval > 0;
	if (got)
		*ino = v->inval_inos[--v->ninval];
	ckpt_unlock(&v->inval_mu, CKPT_RANK_INVAL);
	return got;
}

void ckpt_view_set_inval_notify(ckpt_view *v, void (*fn)(void *arg), void *arg)
{
	v->inval_notify = fn;
	v->inval_arg = arg;
}

int ckpt_view_open_check(ckpt_view *v, ckpt_ino ino)
{
	struct node *n = ckpt_node_at(v, ino);
	if (!n)
		return -ENOENT;
	int was = 0;
	/* before the gone check: a rescan marks gone, then looks at this flag */
	atomic_compare_exchange_strong(&n->kcache, &was, NODE_OPENED);
	if (ckpt_node_is_gone(v, n))
		return -ESTALE;
	return n->ops->open ? n->ops->open(v, n) : 0;
}

/* Root rescan: when the source folder's mtime moved since the last
 * listing (creating, renaming or removing a step folder moves it), list it
 * again and link/unlink steps.  Called before ns_lock is taken. */
static void root_refresh(ckpt_view *v)
{
	if (!v->live)
		return;
	struct ckpt_store_stat st;
	if (ckpt_store_stat(v->src, "", &st) < 0)
		return; /* keep what is shown; reads of vanished data fail on their own */
	ckpt_lock(&v->scan_mu, CKPT_RANK_SCAN);
	uint64_t now = ckpt_now_ns();
	int due = st.mtime_ns ? st.mtime_ns != v->scan_mtime || v->scan_unsure
			      : now - v->scan_at_ns >= (uint64_t)RESCAN_INTERVAL_NS;
	struct layout_steps *l;
	if (due && ckpt_layout_list_steps(v, &l) == 0) {
		ckpt_wrlock(&v->ns_lock, CKPT_RANK_NS);
		int changes = ckpt_layout_apply_steps(v, l);
		ckpt_rwunlock(&v->ns_lock, CKPT_RANK_NS);
		if (changes) {
			queue_gone_files(v);
			retire_gone_arrays(v);
		}
		/* the steps unlinked: freed now unless the kernel still holds some
		 * of their inodes (then by the forget of the last one); their
		 * entries were queued for invalidation, which brings those forgets */
		if (ckpt_node_drop_unlinked(v) && v->inval_notify)
			v->inval_notify(v->inval_arg);
		int64_t shown = atomic_load(&v->root_mtime), t = st.mtime_ns;
		if (changes && t <= shown) /* object stores: no folder mtime */
			t = wall_ns() > shown ? wall_ns() : shown + 1;
		if (t > shown)
			atomic_store(&v->root_mtime, t);
		v->scan_mtime = st.mtime_ns;
		v->scan_at_ns = now;
		v->scan_unsure = st.mtime_ns && wall_ns() - st.mtime_ns < RESCAN_UNSURE_NS;
	}
	ckpt_unlock(&v->scan_mu, CKPT_RANK_SCAN);
}

/* src NULL: open the store of `source`; else use src (one more reference). */
static int view_open(const char *source, ckpt_store *src, const ckpt_view_opts *opts, ckpt_view **out)
{
	ckpt_view *v = calloc(1, sizeof(*v));
	if (!v)
		return -ENOMEM;
	if (opts)
		v->opts = *opts;
	pthread_mutex_init(&v->alloc_lock, NULL);
	pthread_mutex_init(&v->dyn_lock, NULL);
	pthread_mutex_init(&v->res_lock, NULL);
	pthread_mutex_init(&v->scan_mu, NULL);
	pthread_mutex_init(&v->inval_mu, NULL);
	pthread_rwlock_init(&v->ns_lock, NULL);
	v->source = strdup(source);
	int rc = v->source ? ckpt_ctx_create(&v->opts.ctx, &v->ctx) : -ENOMEM;
	if (rc < 0) {
		free(v->source);
		free(v);
		return rc;
	}
	struct node *root = ckpt_node_new(v, &ckpt_dir_ops, "", NULL);
	if (!root) {
		ckpt_view_destroy(v);
		return -ENOMEM;
	}
	assert(root->ino == CKPT_ROOT_INO);
	rc = ckpt_layout_build_view(v, source, src);
	if (rc < 0) {
		ckpt_view_destroy(v);
		return rc;
	}
	v->writable = !strcmp(v->kind, "root") && !v->opts.read_only;
	ckpt_pending_adopt_leftovers(v); /* before anyone sees the root */
	/* the listing ckpt_layout_build_view made counts as the first scan */
	v->scan_mtime = root->mtime_ns;
	atomic_store(&v->root_mtime, root->mtime_ns);
	v->scan_at_ns = ckpt_now_ns();
	v->scan_unsure = root->mtime_ns && wall_ns() - root->mtime_ns < RESCAN_UNSURE_NS;
	struct node *meta = ckpt_node_new(v, &ckpt_dir_ops, VIEW_META_DIR, root);
	struct node *stats = meta ? ckpt_node_new(v, &ckpt_stats_ops, VIEW_STATS_FILE, meta) : NULL;
	if (meta)
		meta->hidden = 1;
	/* a one-step or one-item mount: its summary next to the stats (a root's
	 * steps each have their own, STEP/.ckptfs/) */
	struct node *log = stats ? ckpt_node_new(v, &ckpt_log_ops, VIEW_LOG_FILE, meta) : NULL;
	if (!stats || !log || (!strcmp(v->kind, "root") && ckpt_latest_make(v) < 0) ||
	    ckpt_node_add_kid(meta, stats) < 0 || ckpt_node_add_kid(meta, log) < 0 ||
	    (strcmp(v->kind, "root") && ckpt_summary_add_files(v, meta) < 0) ||
	    ckpt_node_dyn_add(v, meta) < 0) {
		ckpt_view_destroy(v);
		return -ENOMEM;
	}
	/* Work the build queued (OCDBT node fetches) is done: the caller may
	 * fork now (ckpt_view_open, view.h). */
	ckpt_ctx_quiesce(v->ctx);
	*out = v;
	return 0;
}

int ckpt_view_open(const char *source, const ckpt_view_opts *opts, ckpt_view **out)
{
	return view_open(source, NULL, opts, out);
}

int ckpt_view_open_store(ckpt_store *src, const ckpt_view_opts *opts, ckpt_view **out)
{
	ckpt_view_opts o = opts ? *opts : (ckpt_view_opts){ 0 };
	o.read_only = 1; /* pending steps are staged as local folders of SOURCE */
	o.spool_dir = NULL;
	return view_open(src->root, src, &o, out);
}

void ckpt_view_destroy(ckpt_view *v)
{
	if (!v)
		return;
	while (v->nstop_hooks > 0) { /* threads of the files below (the copy-tool watch) */
		v->nstop_hooks--;
		v->stop_hooks[v->nstop_hooks].fn(v, v->stop_hooks[v->nstop_hooks].arg);
	}
	ckpt_node_release_all(v); /* pending steps, safetensors layouts, ... */
	for (size_t i = 0; i < v->narefs; i++) {
		ckpt_array_destroy(v->arefs[i]->arr);
		free(v->arefs[i]->sharding);
		free(v->arefs[i]);
	}
	free(v->arefs);
	for (size_t i = 0; i < v->nstores; i++)
		ckpt_store_destroy(v->stores[i]);
	free(v->stores);
	free(v->store_step);
	free(v->unlinked);
	ckpt_ctx_destroy(v->ctx);
	ckpt_node_free_all(v);
	ckpt_views_destroy(v);
	free(v->dyn);
	free(v->source);
	pthread_rwlock_destroy(&v->ns_lock);
	pthread_mutex_destroy(&v->alloc_lock);
	pthread_mutex_destroy(&v->dyn_lock);
	pthread_mutex_destroy(&v->res_lock);
	pthread_mutex_destroy(&v->scan_mu);
	pthread_mutex_destroy(&v->inval_mu);
	free(v->inval_inos);
	free(v);
}

const char *ckpt_view_kind(const ckpt_view *v)
{
	return v->kind;
}

int ckpt_view_getattr(ckpt_view *v, ckpt_ino ino, ckpt_attr *out)
{
	struct node *n = ckpt_node_at(v, ino);
	if (!n)
		return -ENOENT;
	if (ckpt_node_is_gone(v, n))
		return -ESTALE;
	if (ino == CKPT_ROOT_INO)
		root_refresh(v); /* its mtime tells the kernel whether its cached listing is valid */
	ckpt_layout_step_touch(v, n);
	if (n->ops->prepare)
		n->ops->prepare(v, n); /* no view lock held here */
	ckpt_node_fill_attr(v, n, out);
	return 0;
}

int ckpt_view_lookup(ckpt_view *v, ckpt_ino parent, const char *name, ckpt_attr *out)
{
	if (parent == CKPT_ROOT_INO)
		root_refresh(v);
	ckpt_rdlock(&v->ns_lock, CKPT_RANK_NS);
	struct node *dir = ckpt_node_at(v, parent);
	struct node *n = NULL;
	/* In a directory of a pruned step: -ESTALE, not -ENOENT, on which the
	 * kernel would cache a negative entry that keeps the directory's
	 * dentry, hence the step's nodes, until its cache is shrunk. */
	int rc = !dir			     ? -ENOENT
		 : ckpt_node_is_gone(v, dir) ? -ESTALE
					     : ckpt_node_lookup_ref(v, dir, name, &n);
	if (rc == 0) {
		ckpt_layout_step_touch(v, n);
		ckpt_node_fill_attr(v, n, out);
	}
	ckpt_rwunlock(&v->ns_lock, CKPT_RANK_NS);
	return rc;
}

int ckpt_view_readdir(ckpt_view *v, ckpt_ino ino, uint64_t index, const char **name, ckpt_attr *attr)
{
	if (ino == CKPT_ROOT_INO && index == 0)
		root_refresh(v);
	return ckpt_node_entry(v, ino, index, name, attr, 0);
}

int ckpt_view_readdir_ref(ckpt_view *v, ckpt_ino ino, uint64_t index, const char **name, ckpt_attr *attr)
{
	if (ino == CKPT_ROOT_INO && index == 0)
		root_refresh(v);
	return ckpt_node_entry(v, ino, index, name, attr, 1);
}

int ckpt_view_read_iov(ckpt_view *v, ckpt_ino ino, uint64_t off, size_t len, struct iovec *iov, int max,
		       ckpt_pin **pins, int *npins)
{
	struct node *n = ckpt_node_at(v, ino);
	*npins = 0;
	if (n && ckpt_node_is_gone(v, n))
		return -ESTALE;
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

ssize_t ckpt_view_readlink(ckpt_view *v, ckpt_ino ino, char *buf, size_t cap)
{
	struct node *n = ckpt_node_at(v, ino);
	if (!n)
		return -ENOENT;
	if (!n->ops->readlink)
		return -EINVAL;
	if (n->parent == CKPT_ROOT_INO)
		root_refresh(v); /* it follows the live root */
	ckpt_rdlock(&v->ns_lock, CKPT_RANK_NS);
	ssize_t rc = n->ops->readlink(v, n, buf, cap);
	ckpt_rwunlock(&v->ns_lock, CKPT_RANK_NS);
	return rc;
}

ssize_t ckpt_view_read(ckpt_view *v, ckpt_ino ino, uint64_t off, size_t len, void *dst)
{
	struct node *n = ckpt_node_at(v, ino);
	if (!n)
		return -ENOENT;
	if (ckpt_node_is_gone(v, n))
		return -ESTALE;
	if (!n->ops->read)
		return -EISDIR;
	return n->ops->read(v, n, off, len, dst);
}

ssize_t ckpt_view_getxattr(ckpt_view *v, ckpt_ino ino, const char *name, char *buf, size_t cap)
{
	struct node *n = ckpt_node_at(v, ino);
	if (!n)
		return -ENOENT;
	/* Only user.* exists here.  ENOTSUP (not ENODATA) for the others lets
	 * tools such as ls remember, per file system, that there are no SELinux
	 * labels or ACLs instead of asking for every file. */
	if (strncmp(name, "user.", 5) != 0)
		return -ENOTSUP;
	if (ckpt_node_is_gone(v, n))
		return -ESTALE;
	if (!n->ops->getxattr)
		return -ENODATA;
	return n->ops->getxattr(v, n, name, buf, cap);
}

ssize_t ckpt_view_listxattr(ckpt_view *v, ckpt_ino ino, char *buf, size_t cap)
{
	struct node *n = ckpt_node_at(v, ino);
	if (!n)
		return -ENOENT;
	if (ckpt_node_is_gone(v, n))
		return -ESTALE;
	if (!n->ops->listxattr)
		return 0;
	return n->ops->listxattr(v, n, buf, cap);
}
