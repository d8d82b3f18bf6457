/*
 * pending.c - writing new steps through the view: pending steps, items,
 * pytree directories and array files map onto the writer (writer.h).
 *
 * Locks, in order: v->ns_lock (namespace) -> pstep->io_lock (writes shared,
 * commit/abort exclusive) -> pfile->mu (header state of one file).
 * ckpt_warray_write runs with only io_lock held (shared), so writers of
 * different files never wait for each other here.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "npy.h"
#include "writer.h"
#include "view_internal.h"

#define COMMIT_FILE "commit_success.txt"

struct pfile {
	pthread_mutex_t mu;
	int is_slice;
	struct node *decl; /* slice files: the NAME.npy node that declared the array */
	ckpt_warray *arr; /* NULL until the header has been parsed */
	ckpt_region region; /* whole array or the slice */
	uint8_t *hdr; /* header bytes (all bytes written before the header parsed) */
	size_t have, cap;
	size_t data_off; /* header length once parsed */
	uint64_t size; /* apparent file size */
};

static int valid_name(const char *name)
{
	return name[0] && name[0] != '.' && !strchr(name, '/') && strlen(name) <= 200 &&
	       !strstr(name, ".orbax-checkpoint-tmp");
}

/* Refuse a change of committed data (or of a read-only mount), logged. */
static int refuse(const char *name, const char *what)
{
	ckpt_log(CKPT_LOG_WARN,
		 "%s: cannot %s: read-only (committed data, or a mount that takes no new steps)", name, what);
	return -EROFS;
}

static struct node *parent_of(ckpt_view *v, struct node *n)
{
	return view_node(v, n->parent);
}

void pending_attr(ckpt_view *v, struct node *n, ckpt_attr *a)
{
	(void)v;
	a->immutable = 0;
	if (n->type == N_PFILE) {
		a->mode = 0644;
		pthread_mutex_lock(&n->pf->mu);
		a->size = n->pf->size;
		pthread_mutex_unlock(&n->pf->mu);
	} else {
		a->mode = 0755;
	}
}

int ckpt_view_is_writable(ckpt_view *v, ckpt_ino ino)
{
	struct node *n = view_node(v, ino);
	return n && n->type == N_PFILE && !n->ps->dead;
}

int ckpt_view_check_writable(ckpt_view *v, ckpt_ino ino)
{
	struct node *n = view_node(v, ino);
	if (!n)
		return -ENOENT;
	if (n->type == N_PFILE && !n->ps->dead && !n->orphan)
		return 0;
	return refuse(n->name, "open for writing");
}

static struct pstep *own_pstep(ckpt_view *v, ckpt_step *step)
{
	struct pstep *ps = calloc(1, sizeof(*ps));
	struct pstep **arr = realloc(v->psteps, (v->npsteps + 1) * sizeof(*arr));
	if (!ps || !arr) {
		free(ps);
		if (arr)
			v->psteps = arr;
		return NULL;
	}
	v->psteps = arr;
	ps->step = step;
	pthread_rwlock_init(&ps->io_lock, NULL);
	v->psteps[v->npsteps++] = ps;
	return ps;
}

void pending_destroy(ckpt_view *v)
{
	for (size_t i = 0; i < v->npsteps; i++) {
		struct ckpt_step *st = v->psteps[i]->step;
		ckpt_step_info info;
		ckpt_step_get_info(st, &info);
		if (info.state == CKPT_STEP_PENDING)
			ckpt_log(CKPT_LOG_WARN,
				 "step %s was not committed; its data stays in %s (not a step)", info.name,
				 info.tmp_path);
		ckpt_step_destroy(st);
		pthread_rwlock_destroy(&v->psteps[i]->io_lock);
		free(v->psteps[i]);
	}
	free(v->psteps);
	uint64_t n = atomic_load(&v->count);
	for (uint64_t i = 1; i <= n; i++) {
		struct node *x = view_node(v, i);
		if (x && x->pf) {
			pthread_mutex_destroy(&x->pf->mu);
			free(x->pf->hdr);
			free(x->pf);
		}
	}
}

/* ---- namespace -------------------------------------------------------- */

static int new_step(ckpt_view *v, struct node *root, const char *name, ckpt_attr *out)
{
	if (!valid_name(name) || !strcmp(name, "metadata")) {
		/* "metadata" is the root's metadata folder, never a step */
		ckpt_log(CKPT_LOG_ERR, "%s: not a valid step name", name);
		return -EINVAL;
	}
	if (view_find_kid(root, name))
		return -EEXIST;
	ckpt_writer_opts o;
	ckpt_writer_opts_init(&o);
	if (v->opts.zstd_level)
		o.zstd_level = v->opts.zstd_level;
	if (v->opts.write_budget)
		o.mem_budget = v->opts.write_budget;
	ckpt_step *st;
	int rc = ckpt_step_begin(v->source, name, &o, &st);
	if (rc < 0) {
		ckpt_log(CKPT_LOG_ERR, "step %s: cannot start a pending step: %s", name, strerror(-rc));
		return rc;
	}
	struct pstep *ps = own_pstep(v, st);
	struct node *n = ps ? view_new_node(v, N_PSTEP, name, root) : NULL;
	if (!n || view_add_kid(root, n) < 0) {
		ckpt_step_abort(st);
		if (!ps)
			ckpt_step_destroy(st);
		return -ENOMEM;
	}
	n->ps = ps;
	view_fill_attr(v, n, out);
	return 0;
}

int ckpt_view_mkdir(ckpt_view *v, ckpt_ino parent, const char *name, ckpt_attr *out)
{
	pthread_rwlock_wrlock(&v->ns_lock);
	struct node *dir = view_node(v, parent);
	int rc = 0;
	if (!dir) {
		rc = -ENOENT;
	} else if (dir->ino == CKPT_ROOT_INO && v->writable) {
		rc = new_step(v, dir, name, out);
	} else if ((dir->type == N_PSTEP || dir->type == N_PDIR) && !dir->ps->dead && !dir->orphan) {
		if (!valid_name(name) || strchr(name, '[')) {
			ckpt_log(CKPT_LOG_ERR, "%s: not a valid item or pytree directory name", name);
			rc = -EINVAL;
		} else if (view_find_kid(dir, name)) {
			rc = -EEXIST;
		} else {
			rc = dir->type == N_PSTEP ? ckpt_step_add_item(dir->ps->step, name) : 0;
			struct node *n = rc == 0 ? view_new_node(v, N_PDIR, name, dir) : NULL;
			if (rc == 0 && (!n || view_add_kid(dir, n) < 0))
				rc = -ENOMEM;
			if (rc == 0) {
				n->ps = dir->ps;
				view_fill_attr(v, n, out);
			}
		}
	} else {
		rc = refuse(name, "make a directory");
	}
	pthread_rwlock_unlock(&v->ns_lock);
	return rc;
}

/* Commit pending step node `sn` as `final`; replaces it in the root. */
static int commit_step(ckpt_view *v, struct node *sn, const char *final, struct node **committed)
{
	struct node *root = view_node(v, CKPT_ROOT_INO);
	if (strcmp(sn->name, final) && view_find_kid(root, final)) {
		ckpt_log(CKPT_LOG_ERR, "step %s: cannot commit as %s: that step exists", sn->name, final);
		return -EEXIST;
	}
	struct pstep *ps = sn->ps;
	pthread_rwlock_wrlock(&ps->io_lock);
	int rc = ckpt_step_commit(ps->step, final);
	if (rc == 0)
		ps->dead = 1;
	pthread_rwlock_unlock(&ps->io_lock);
	if (rc < 0) {
		ckpt_log(CKPT_LOG_ERR, "step %s: commit failed: %s; the step stays pending", sn->name,
			 strerror(-rc));
		return rc;
	}
	char path[4096];
	snprintf(path, sizeof(path), "%s/%s", v->source, final);
	struct node *n = layout_new_step(v, final, path);
	view_remove_kid(root, sn);
	sn->orphan = 1;
	if (!n || view_add_kid(root, n) < 0) {
		ckpt_log(CKPT_LOG_ERR, "step %s: committed to %s but cannot be shown; remount to see it",
			 final, path);
		return -EIO;
	}
	ckpt_log(CKPT_LOG_INFO, "step %s: committed to %s", final, path);
	*committed = n;
	return 0;
}

/* Key path of a file in a pending step: item = first directory below the
 * step, keys = the directories below it plus the file's stem. */
static int key_path(ckpt_view *v, struct node *dir, const char *stem, const char **item, const char **keys,
		    int *types, int *depth)
{
	const char *rev[256];
	int n = 0;
	rev[n++] = stem;
	struct node *d = dir;
	while (d && d->type == N_PDIR && n < 256) {
		rev[n++] = d->name;
		d = parent_of(v, d);
	}
	if (!d || d->type != N_PSTEP || n < 2)
		return -EINVAL;
	*item = rev[n - 1];
	*depth = n - 1;
	for (int i = 0; i < n - 1; i++) {
		keys[i] = rev[n - 2 - i];
		int digits = keys[i][0] != 0;
		for (const char *p = keys[i]; *p; p++)
			digits &= *p >= '0' && *p <= '9';
		types[i] = digits ? 1 : 2;
	}
	return 0;
}

static int new_pfile(ckpt_view *v, struct node *dir, const char *name, struct node **out)
{
	size_t len = strlen(name);
	if (len < 5 || strcmp(name + len - 4, ".npy")) {
		ckpt_log(CKPT_LOG_ERR,
			 "%s: only NAME.npy arrays (or NAME[slice].npy) can be written in a pending step",
			 name);
		return -EPERM;
	}
	const char *br = strchr(name, '[');
	struct pfile *pf = calloc(1, sizeof(*pf));
	if (!pf)
		return -ENOMEM;
	pthread_mutex_init(&pf->mu, NULL);
	if (br) {
		char base[4200];
		size_t stem = len - 4;
		if ((size_t)(br - name) + 5 > sizeof(base) || name[stem - 1] != ']') {
			ckpt_log(CKPT_LOG_ERR, "%s: malformed slice file name (want NAME[<slice>].npy)",
				 name);
			free(pf);
			return -EINVAL;
		}
		memcpy(base, name, (size_t)(br - name));
		memcpy(base + (br - name), ".npy", 5);
		struct node *decl = view_find_kid(dir, base);
		if (!decl || decl->type != N_PFILE || !decl->pf->arr) {
			ckpt_log(CKPT_LOG_ERR, "%s: %s is not declared yet (write its .npy header first)",
				 name, base);
			free(pf);
			return -ENOENT;
		}
		ckpt_warray_info info;
		ckpt_warray_get_info(decl->pf->arr, &info);
		const char *why = "";
		int rc = ckpt_slice_parse(br, stem - (size_t)(br - name), info.rank, info.shape, &pf->region,
					  &why);
		if (rc < 0) {
			ckpt_log(CKPT_LOG_ERR, "%s: %s", name, why);
			free(pf);
			return rc == -ERANGE ? -EINVAL : rc;
		}
		pf->is_slice = 1;
		pf->decl = decl;
		pf->arr = NULL; /* set when this file's own header has been checked */
	}
	struct node *n = view_new_node(v, N_PFILE, name, dir);
	if (!n) {
		free(pf);
		return -ENOMEM;
	}
	n->ps = dir->ps;
	n->pf = pf;
	*out = n;
	return 0;
}

int ckpt_view_create(ckpt_view *v, ckpt_ino parent, const char *name, ckpt_attr *out)
{
	pthread_rwlock_wrlock(&v->ns_lock);
	struct node *dir = view_node(v, parent);
	int rc = 0;
	if (!dir) {
		rc = -ENOENT;
	} else if (dir->type == N_PSTEP && !dir->ps->dead && !dir->orphan && !strcmp(name, COMMIT_FILE)) {
		struct node *step;
		rc = commit_step(v, dir, dir->name, &step);
		if (rc == 0) {
			struct node *f = view_find_kid(step, COMMIT_FILE);
			if (f)
				view_fill_attr(v, f, out);
			else
				rc = -EIO;
		}
	} else if (dir->type == N_PSTEP && !dir->ps->dead) {
		ckpt_log(CKPT_LOG_ERR, "%s: files go in an item directory (mkdir %s/ITEM first)", name,
			 dir->name);
		rc = -EPERM;
	} else if (dir->type == N_PDIR && !dir->ps->dead && !dir->orphan) {
		struct node *n = view_find_kid(dir, name);
		if (!n) {
			n = view_dyn_find(v, dir->ino, name); /* slice files are hidden names */
		}
		if (n) {
			rc = n->type == N_PFILE ? 0 : -EISDIR;
		} else {
			rc = new_pfile(v, dir, name, &n);
			if (rc == 0) {
				if (n->pf->is_slice) {
					n->hidden = 1;
					rc = view_dyn_add(v, n);
				} else {
					rc = view_add_kid(dir, n);
				}
			}
		}
		if (rc == 0)
			view_fill_attr(v, n, out);
	} else {
		rc = refuse(name, "create a file");
	}
	pthread_rwlock_unlock(&v->ns_lock);
	return rc;
}

int ckpt_view_rename(ckpt_view *v, ckpt_ino parent, const char *name, ckpt_ino newparent, const char *newname)
{
	pthread_rwlock_wrlock(&v->ns_lock);
	struct node *dir = view_node(v, parent);
	struct node *n = dir && dir->type != N_SHARDS ? view_find_kid(dir, name) : NULL;
	int rc;
	if (!n)
		rc = -ENOENT;
	else if (n->type == N_PSTEP && parent == CKPT_ROOT_INO && newparent == CKPT_ROOT_INO &&
		 !n->ps->dead) {
		struct node *step;
		if (valid_name(newname) && strcmp(newname, "metadata")) {
			rc = commit_step(v, n, newname, &step);
		} else {
			ckpt_log(CKPT_LOG_ERR, "%s: not a valid step name", newname);
			rc = -EINVAL;
		}
	} else if (n->type == N_PSTEP || n->type == N_PDIR || n->type == N_PFILE) {
		ckpt_log(CKPT_LOG_ERR, "%s: only a whole pending step can be renamed (that commits it)",
			 name);
		rc = -EPERM;
	} else {
		rc = refuse(name, "rename");
	}
	pthread_rwlock_unlock(&v->ns_lock);
	return rc;
}

int ckpt_view_unlink(ckpt_view *v, ckpt_ino parent, const char *name)
{
	pthread_rwlock_wrlock(&v->ns_lock);
	struct node *dir = view_node(v, parent);
	struct node *n = dir && (dir->type == N_PDIR || dir->type == N_DIR) ? view_find_kid(dir, name) : NULL;
	int rc;
	if (!n) {
		rc = dir && dir->type == N_PDIR ? -ENOENT : refuse(name, "remove");
	} else if (n->type != N_PFILE) {
		rc = n->type == N_PDIR ? -EISDIR : refuse(name, "remove");
	} else if (n->pf->arr) {
		ckpt_log(CKPT_LOG_ERR, "%s: a declared array cannot be removed (rmdir the step to abort it)",
			 name);
		rc = -EPERM;
	} else {
		view_remove_kid(dir, n);
		n->orphan = 1;
		rc = 0;
	}
	pthread_rwlock_unlock(&v->ns_lock);
	return rc;
}

int ckpt_view_rmdir(ckpt_view *v, ckpt_ino parent, const char *name)
{
	pthread_rwlock_wrlock(&v->ns_lock);
	struct node *dir = view_node(v, parent);
	struct node *n = dir ? view_find_kid(dir, name) : NULL;
	int rc;
	if (!n) {
		rc = -ENOENT;
	} else if (n->type == N_PSTEP && !n->ps->dead) {
		pthread_rwlock_wrlock(&n->ps->io_lock);
		ckpt_step_abort(n->ps->step);
		n->ps->dead = 1;
		pthread_rwlock_unlock(&n->ps->io_lock);
		view_remove_kid(dir, n);
		n->orphan = 1;
		ckpt_log(CKPT_LOG_INFO, "step %s: aborted", name);
		rc = 0;
	} else if (n->type == N_PDIR) {
		ckpt_log(CKPT_LOG_ERR,
			 "%s: directories of a pending step cannot be removed (rmdir the step to abort it)",
			 name);
		rc = -EPERM;
	} else {
		rc = n->type == N_DIR ? refuse(name, "remove") : -ENOTDIR;
	}
	pthread_rwlock_unlock(&v->ns_lock);
	return rc;
}

/* ---- data -------------------------------------------------------------- */

/* Declare the array from the parsed header (pf->mu held). */
static int declare(ckpt_view *v, struct node *n, const ckpt_npy_info *h)
{
	struct pfile *pf = n->pf;
	if (pf->is_slice) {
		ckpt_warray_info info;
		ckpt_warray_get_info(pf->decl->pf->arr, &info);
		int same = h->dtype == info.dtype && h->rank == pf->region.rank;
		for (int d = 0; same && d < h->rank; d++)
			same = h->shape[d] == pf->region.stop[d] - pf->region.start[d];
		if (!same) {
			ckpt_log(CKPT_LOG_ERR,
				 "%s: the .npy header (dtype/shape) disagrees with the slice of %s", n->name,
				 pf->decl->name);
			return -EINVAL;
		}
		pf->arr = pf->decl->pf->arr;
		return 0;
	}
	const char *item, *keys[256];
	int types[256], depth;
	char stem[4200];
	size_t sl = strlen(n->name) - 4;
	if (sl >= sizeof(stem))
		return -ENAMETOOLONG;
	memcpy(stem, n->name, sl);
	stem[sl] = 0;
	struct node *dir = parent_of(v, n);
	int rc = key_path(v, dir, stem, &item, keys, types, &depth);
	if (rc < 0)
		return rc;
	rc = ckpt_step_add_array(n->ps->step, item, keys, types, depth, h->dtype, h->rank, h->shape,
				 &pf->arr);
	if (rc < 0)
		return rc;
	ckpt_region_full(&pf->region, h->rank, h->shape);
	return 0;
}

static ssize_t write_locked(ckpt_view *v, struct node *n, uint64_t off, const uint8_t *data, size_t len)
{
	struct pfile *pf = n->pf;
	pthread_mutex_lock(&pf->mu);
	if (!pf->data_off) {
		/* Header phase: collect bytes from offset 0 until the header parses. */
		if (off > pf->have) {
			pthread_mutex_unlock(&pf->mu);
			ckpt_log(CKPT_LOG_ERR, "%s: write at %llu before the .npy header is complete",
				 n->name, (unsigned long long)off);
			return -EINVAL;
		}
		/* Only the first CKPT_NPY_MAX_HLEN + 16 bytes can hold a header. */
		const size_t limit = CKPT_NPY_MAX_HLEN + 16;
		if (off >= limit) {
			pthread_mutex_unlock(&pf->mu);
			ckpt_log(CKPT_LOG_ERR, "%s: no valid .npy header in the first %zu bytes", n->name,
				 limit);
			return -EINVAL;
		}
		size_t take = len < limit - off ? len : (size_t)(limit - off);
		if (off + take > pf->cap) {
			uint8_t *p = realloc(pf->hdr, (size_t)(off + take));
			if (!p) {
				pthread_mutex_unlock(&pf->mu);
				return -ENOMEM;
			}
			pf->hdr = p;
			pf->cap = (size_t)(off + take);
		}
		memcpy(pf->hdr + off, data, take);
		if (off + take > pf->have)
			pf->have = (size_t)(off + take);
		ckpt_npy_info h;
		size_t need = 0;
		/* Void descrs: '<V2' is bfloat16, '<V1' the 8-bit float e4m3fn; a
		 * slice must use its array's dtype.  Named descrs ("float8_e5m2")
		 * pick any other ml_dtypes type. */
		ckpt_dtype hint = CKPT_DT_BFLOAT16;
		if (pf->is_slice) {
			ckpt_warray_info info;
			ckpt_warray_get_info(pf->decl->pf->arr, &info);
			hint = info.dtype;
		}
		int rc = ckpt_npy_parse(pf->hdr, pf->have, hint, &h, &need);
		if (rc == -EINVAL && !pf->is_slice)
			rc = ckpt_npy_parse(pf->hdr, pf->have, CKPT_DT_F8_E4M3FN, &h, &need);
		if (rc == -EAGAIN && take == len) {
			if (pf->size < pf->have)
				pf->size = pf->have;
			pthread_mutex_unlock(&pf->mu);
			return (ssize_t)len;
		}
		if (rc == -EAGAIN)
			rc = -EINVAL;
		if (rc < 0)
			ckpt_log(CKPT_LOG_ERR, "%s: not a valid .npy header for ckptfs", n->name);
		else
			rc = declare(v, n, &h); /* logs its own reasons */
		if (rc < 0) {
			pf->have = 0; /* a refused header is forgotten: the writer may start over */
			pthread_mutex_unlock(&pf->mu);
			return rc;
		}
		pf->data_off = (size_t)h.data_offset;
		uint64_t count;
		ckpt_region_count(&pf->region, &count);
		pf->size = pf->data_off + count * (h.nbytes / (h.nelems ? h.nelems : 1));
		if (!h.nelems)
			pf->size = pf->data_off;
		/* Bytes already collected past the header are data. */
		size_t extra = pf->have > pf->data_off ? pf->have - pf->data_off : 0;
		if (extra) {
			rc = ckpt_warray_write(pf->arr, &pf->region, 0, pf->hdr + pf->data_off, extra);
			if (rc < 0) {
				pthread_mutex_unlock(&pf->mu);
				return rc;
			}
		}
		pf->have = pf->data_off;
		uint8_t *shrunk = realloc(pf->hdr, pf->data_off);
		if (shrunk)
			pf->hdr = shrunk;
		pf->cap = pf->data_off;
		pthread_mutex_unlock(&pf->mu);
		if (take < len) {
			rc = ckpt_warray_write(pf->arr, &pf->region, off + take - pf->data_off, data + take,
					       len - take);
			if (rc < 0)
				return rc;
		}
		return (ssize_t)len;
	}
	/* Declared: header bytes must not change; the rest is array data. */
	size_t hdr_part = off < pf->data_off ? (size_t)(pf->data_off - off) : 0;
	if (hdr_part > len)
		hdr_part = len;
	if (hdr_part && memcmp(pf->hdr + off, data, hdr_part)) {
		pthread_mutex_unlock(&pf->mu);
		ckpt_log(CKPT_LOG_ERR, "%s: the .npy header cannot change once written", n->name);
		return -EINVAL;
	}
	uint64_t doff = off + hdr_part - pf->data_off;
	pthread_mutex_unlock(&pf->mu);
	if (len > hdr_part) {
		int rc = ckpt_warray_write(pf->arr, &pf->region, doff, data + hdr_part, len - hdr_part);
		if (rc < 0)
			return rc;
	}
	return (ssize_t)len;
}

ssize_t ckpt_view_write(ckpt_view *v, ckpt_ino ino, uint64_t off, const void *data, size_t len)
{
	struct node *n = view_node(v, ino);
	if (!n)
		return -ENOENT;
	if (n->type != N_PFILE)
		return n->type == N_DIR || n->type == N_PDIR || n->type == N_PSTEP ? -EISDIR
										   : refuse(n->name, "write");
	struct pstep *ps = n->ps;
	pthread_rwlock_rdlock(&ps->io_lock);
	ssize_t rc = ps->dead || n->orphan ? refuse(n->name, "write") : write_locked(v, n, off, data, len);
	pthread_rwlock_unlock(&ps->io_lock);
	return rc;
}

int ckpt_view_truncate(ckpt_view *v, ckpt_ino ino, uint64_t size)
{
	struct node *n = view_node(v, ino);
	if (!n)
		return -ENOENT;
	if (n->type != N_PFILE)
		return n->type == N_ARRAY || n->type == N_FILE ? refuse(n->name, "truncate") : -EISDIR;
	struct pfile *pf = n->pf;
	int rc = 0;
	pthread_mutex_lock(&pf->mu);
	if (n->ps->dead)
		rc = refuse(n->name, "truncate");
	else if (size == 0 && !pf->data_off)
		pf->have = pf->size = 0;
	else if (size == pf->size)
		rc = 0;
	else {
		ckpt_log(CKPT_LOG_ERR, "%s: cannot resize to %llu bytes (the .npy header fixes the size)",
			 n->name, (unsigned long long)size);
		rc = -EINVAL;
	}
	pthread_mutex_unlock(&pf->mu);
	return rc;
}

ssize_t pending_read(ckpt_view *v, struct node *n, uint64_t off, size_t len, void *dst)
{
	(void)v;
	struct pfile *pf = n->pf;
	pthread_mutex_lock(&pf->mu);
	uint64_t size = pf->size;
	size_t hl = pf->data_off ? pf->data_off : pf->have;
	if (off >= size) {
		pthread_mutex_unlock(&pf->mu);
		return 0;
	}
	if (len > size - off)
		len = (size_t)(size - off);
	size_t done = 0;
	if (off < hl) {
		done = hl - (size_t)off < len ? hl - (size_t)off : len;
		memcpy(dst, pf->hdr + off, done);
	}
	ckpt_warray *arr = pf->arr;
	ckpt_region r = pf->region;
	size_t doff = pf->data_off;
	pthread_mutex_unlock(&pf->mu);
	if (done < len && arr) {
		ssize_t r2 = ckpt_warray_read(arr, &r, off + done - doff, (uint8_t *)dst + done, len - done);
		if (r2 < 0)
			return r2;
		done += (size_t)r2;
	}
	return (ssize_t)done;
}

int ckpt_view_setxattr(ckpt_view *v, ckpt_ino ino, const char *name, const char *value, size_t size)
{
	struct node *n = view_node(v, ino);
	if (!n)
		return -ENOENT;
	if (n->type != N_PFILE || n->ps->dead || n->orphan)
		return refuse(n->name, "set an extended attribute");
	if (strcmp(name, "user.ckpt.sharding")) {
		ckpt_log(CKPT_LOG_ERR, "%s: only user.ckpt.sharding can be set on a pending array", n->name);
		return -ENOTSUP;
	}
	char *json = malloc(size + 1);
	if (!json)
		return -ENOMEM;
	memcpy(json, value, size);
	json[size] = 0;
	struct pfile *pf = n->pf;
	pthread_mutex_lock(&pf->mu);
	ckpt_warray *arr = pf->is_slice ? pf->decl->pf->arr : pf->arr;
	pthread_mutex_unlock(&pf->mu);
	int rc;
	if (!arr) {
		ckpt_log(CKPT_LOG_ERR, "%s: write the .npy header before setting its sharding", n->name);
		rc = -ENOENT;
	} else {
		rc = ckpt_warray_set_sharding(arr, json);
		if (rc < 0)
			ckpt_log(CKPT_LOG_ERR, "%s: user.ckpt.sharding is not valid JSON", n->name);
	}
	free(json);
	return rc;
}
