/*
 * pending/file.c - pending files (N_PFILE): their node ops, and the bytes
 * of the files the view keeps or hands to the writer itself: NAME.npy and
 * NAME[slice].npy (the .npy header collected and parsed, the array
 * declared, then data), the JSON file of a JSON item, copied Orbax
 * metadata and the commit marker (buffered).  write, read and truncate of
 * every pending file start here.
 * Not here: raw files' bytes (raw.c), safetensors imports (safetensors.c),
 * which kind a new file is (namespace.c), completeness (step.c).
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "orbax.h"
#include "sysio.h"
#include "writer_hosts.h"
#include "pending_int.h"

static void pfile_attr(ckpt_view *v, struct node *n, ckpt_attr *a)
{
	(void)v;
	struct pfile *pf = &to_pfile(n)->pf;
	a->immutable = 0;
	a->mode = 0644;
	ckpt_lock(&pf->mu, CKPT_RANK_PF);
	a->size = pf->size;
	if (pf->raw_mtime_ns)
		a->mtime_ns = pf->raw_mtime_ns;
	/* an Orbax save's file: its bytes go straight to the tmp folder and are
	 * read from there, so the kernel keeps no pages of it (direct I/O) */
	a->volatile_data = pf->is_raw && to_pfile(n)->ps->as_written;
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
}

static void pfile_destroy(ckpt_view *v, struct node *n)
{
	(void)v;
	struct pfile *pf = &to_pfile(n)->pf;
	pthread_mutex_destroy(&pf->mu);
	free(pf->hdr);
	free(pf->final);
	free(pf->rel);
	ckpt_st_import_entries_free(pf->st, pf->nst);
	free(pf->st_arr);
}

static ssize_t pending_read(ckpt_view *v, struct node *n, uint64_t off, size_t len, void *dst);

static const struct node_ops pfile_ops = {
	.kind = N_PFILE,
	.size = sizeof(struct pfile_node),
	.getattr = pfile_attr,
	.read = pending_read,
	.destroy = pfile_destroy,
};

/* A new pending file `name` in dir (a folder of a pending step; not added
 * as its kid yet), of dir's step, its mutex ready.  NULL without memory. */
struct pfile_node *ckpt_pf_node_new(ckpt_view *v, struct node *dir, const char *name)
{
	struct node *n = ckpt_node_new(v, &pfile_ops, name, dir);
	if (!n)
		return NULL;
	struct pfile_node *f = to_pfile(n);
	f->ps = to_pdir(dir)->ps;
	pthread_mutex_init(&f->pf.mu, NULL);
	return f;
}

/* Multi-host: NAME.npy that another host declared (its declaration record,
 * writer_hosts.h) becomes a declared pending file here, as if its header
 * had been written on this mount.  ns_lock exclusive held; NULL if none. */
struct pfile_node *ckpt_pf_adopt_decl(ckpt_view *v, struct node *dir, const char *base)
{
	const char *item, *keys[CKPT_ORBAX_MAX_DEPTH];
	int types[CKPT_ORBAX_MAX_DEPTH], depth;
	char stem[VIEW_NAME_BUF], hdr[CKPT_NPY_HEADER_MAX];
	size_t sl = strlen(base) - 4;
	ckpt_warray *arr;
	memcpy(stem, base, sl);
	stem[sl] = 0;
	char *kbuf = malloc((size_t)CKPT_ORBAX_MAX_DEPTH * VIEW_NAME_BUF);
	int rc = kbuf ? ckpt_pf_key_path(v, dir, stem, &item, keys, types, &depth, kbuf) : -ENOMEM;
	if (rc == 0)
		rc = ckpt_hosts_adopt(to_pdir(dir)->ps->step, item, keys, depth, &arr);
	free(kbuf);
	if (rc < 0)
		return NULL;
	ckpt_warray_info info;
	ckpt_warray_get_info(arr, &info);
	int hl = ckpt_npy_header(info.dtype, info.rank, info.shape, hdr, sizeof(hdr));
	struct pfile_node *f = hl > 0 ? ckpt_pf_node_new(v, dir, base) : NULL;
	if (!f)
		return NULL;
	struct node *n = &f->n;
	f->pf.hdr = malloc((size_t)hl);
	if (!f->pf.hdr || ckpt_node_add_kid(dir, n) < 0)
		return NULL;
	memcpy(f->pf.hdr, hdr, (size_t)hl);
	f->pf.arr = arr;
	ckpt_region_full(&f->pf.region, info.rank, info.shape);
	f->pf.have = f->pf.cap = f->pf.data_off = (size_t)hl;
	f->pf.size = (uint64_t)hl + info.nbytes;
	return f;
}

/* Declare the array from the parsed header (pf->mu held). */
static int declare(ckpt_view *v, struct pfile_node *n, const ckpt_npy_info *h)
{
	struct pfile *pf = &n->pf;
	if (pf->is_slice) {
		/* decl->pf.arr is set once and never changes: no need for its mutex */
		ckpt_warray_info info;
		ckpt_warray_get_info(pf->decl->pf.arr, &info);
		int same = h->dtype == info.dtype && h->rank == pf->region.rank;
		for (int d = 0; same && d < h->rank; d++)
			same = h->shape[d] == pf->region.stop[d] - pf->region.start[d];
		if (!same) {
			ckpt_log(CKPT_LOG_ERR,
				 "%s: the .npy header (dtype/shape) disagrees with the slice of %s",
				 n->n.name, pf->decl->n.name);
			return -EINVAL;
		}
		pf->arr = pf->decl->pf.arr;
		return 0;
	}
	if (pf->arr) {
		/* Written again after O_TRUNC: the same declaration or nothing. */
		ckpt_warray_info info;
		ckpt_warray_get_info(pf->arr, &info);
		int same = h->dtype == info.dtype && h->rank == info.rank;
		for (int d = 0; same && d < h->rank; d++)
			same = h->shape[d] == info.shape[d];
		if (!same) {
			ckpt_log(CKPT_LOG_ERR,
				 "%s: written again with another dtype or shape than its declaration (%s, "
				 "rank "
				 "%d); unlink it first to declare it anew",
				 n->n.name, ckpt_dtype_get(info.dtype)->name, info.rank);
			return -EINVAL;
		}
		return 0;
	}
	const char *item, *keys[CKPT_ORBAX_MAX_DEPTH];
	int types[CKPT_ORBAX_MAX_DEPTH], depth;
	char stem[VIEW_NAME_BUF];
	const char *fname = pf->final ? pf->final : n->n.name; /* a temporary name declares its final one */
	size_t sl = strlen(fname) - 4;
	if (sl >= sizeof(stem))
		return -ENAMETOOLONG;
	memcpy(stem, fname, sl);
	stem[sl] = 0;
	struct node *dir = parent_of(v, &n->n);
	char *kbuf = malloc((size_t)CKPT_ORBAX_MAX_DEPTH * VIEW_NAME_BUF);
	if (!kbuf)
		return -ENOMEM;
	int rc = ckpt_pf_key_path(v, dir, stem, &item, keys, types, &depth, kbuf);
	if (rc == 0)
		rc = ckpt_hosts_declare(n->ps->step, item, keys, types, depth, h->dtype, h->rank, h->shape,
					&pf->arr);
	free(kbuf);
	if (rc < 0)
		return rc;
	ckpt_region_full(&pf->region, h->rank, h->shape);
	return 0;
}

/* Several files write this array: written bytes must stay as they are. */
static unsigned same_flag(struct pfile *pf)
{
	return pf->is_slice || atomic_load(&pf->nslices) ? CKPT_WRITE_SAME : 0;
}

/*
 * Header phase (pf->mu held, no header parsed yet): collect the bytes from
 * offset 0 until the .npy header parses, then declare the array and hand
 * the bytes collected past the header to the writer.  Returns 0 when all
 * len bytes were taken and the header is still incomplete, 1 when the
 * array is declared and the first *take bytes of data were consumed (the
 * rest is array data for the caller), or -errno.
 */
static int collect_header(ckpt_view *v, struct pfile_node *n, uint64_t off, const uint8_t *data, size_t len,
			  size_t *take)
{
	struct pfile *pf = &n->pf;
	if (off > pf->have) {
		ckpt_log(CKPT_LOG_ERR, "%s: write at %llu before the .npy header is complete", n->n.name,
			 (unsigned long long)off);
		return -EINVAL;
	}
	/* Only the first CKPT_NPY_MAX_HLEN + 16 bytes can hold a header. */
	const size_t limit = CKPT_NPY_MAX_HLEN + 16;
	if (off >= limit) {
		ckpt_log(CKPT_LOG_ERR, "%s: no valid .npy header in the first %zu bytes", n->n.name, limit);
		return -EINVAL;
	}
	*take = len < limit - off ? len : (size_t)(limit - off);
	if (ckpt_pf_hdr_put(pf, off, data, *take) < 0)
		return -ENOMEM;
	ckpt_npy_info h;
	size_t need = 0;
	/* Void descrs name no type: '<V2' is bfloat16 (the only 2-byte one);
	 * a 1-byte '<V1' may be any 8-bit float or int4, so it needs the name
	 * from user.ckpt.dtype (set before the data) or from the array it
	 * belongs to.  Named descrs ("float8_e5m2") need no hint. */
	ckpt_dtype hint = CKPT_DT_BFLOAT16;
	ckpt_warray *known = pf->is_slice ? pf->decl->pf.arr : pf->arr;
	if (known) {
		ckpt_warray_info info;
		ckpt_warray_get_info(known, &info);
		hint = info.dtype;
	}
	if (pf->hint != CKPT_DT_INVALID)
		hint = pf->hint;
	int rc = ckpt_npy_parse(pf->hdr, pf->have, hint, &h, &need);
	if (rc == -EAGAIN && *take == len) {
		if (pf->size < pf->have)
			pf->size = pf->have;
		return 0;
	}
	if (rc == -EAGAIN)
		rc = -EINVAL;
	if (rc < 0) {
		ckpt_log(
			CKPT_LOG_ERR,
			"%s: not a valid .npy header for ckptfs (a 1-byte void descr such as '<V1' needs its "
			"dtype named first: setfattr -n user.ckpt.dtype -v float8_e5m2 %s)",
			n->n.name, n->n.name);
	} else if (pf->hint != CKPT_DT_INVALID && h.dtype != pf->hint) {
		ckpt_log(CKPT_LOG_ERR, "%s: the .npy header's dtype is %s, user.ckpt.dtype says %s",
			 n->n.name, ckpt_dtype_get(h.dtype)->name, ckpt_dtype_get(pf->hint)->name);
		rc = -EINVAL;
	} else {
		rc = declare(v, n, &h); /* logs its own reasons */
	}
	if (rc < 0) {
		pf->have = 0; /* a refused header is forgotten: the writer may start over */
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
		rc = ckpt_warray_write_flags(pf->arr, &pf->region, 0, pf->hdr + pf->data_off, extra,
					     same_flag(pf));
		if (rc < 0)
			return rc;
	}
	pf->have = pf->data_off;
	uint8_t *shrunk = realloc(pf->hdr, pf->data_off);
	if (shrunk)
		pf->hdr = shrunk;
	pf->cap = pf->data_off;
	return 1;
}

/* Declared (pf->mu held, released here): header bytes must not change;
 * the rest is array data, written without pf->mu. */
static ssize_t write_data(struct pfile_node *n, uint64_t off, const uint8_t *data, size_t len)
{
	struct pfile *pf = &n->pf;
	size_t hdr_part = off < pf->data_off ? (size_t)(pf->data_off - off) : 0;
	if (hdr_part > len)
		hdr_part = len;
	if (hdr_part && memcmp(pf->hdr + off, data, hdr_part)) {
		ckpt_unlock(&pf->mu, CKPT_RANK_PF);
		ckpt_log(CKPT_LOG_ERR, "%s: the .npy header cannot change once written", n->n.name);
		return -EINVAL;
	}
	uint64_t doff = off + hdr_part - pf->data_off;
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	if (len > hdr_part) {
		int rc = ckpt_warray_write_flags(pf->arr, &pf->region, doff, data + hdr_part, len - hdr_part,
						 same_flag(pf));
		if (rc < 0)
			return rc;
	}
	return (ssize_t)len;
}

/* The content of a JSON file changed (pf->mu held): hand it to the writer. */
static int json_set_locked(ckpt_view *v, struct pfile_node *n)
{
	ckpt_assert_held(CKPT_RANK_PF);
	struct node *dir = parent_of(v, &n->n);
	return ckpt_step_set_json(n->ps->step, dir->name, n->pf.hdr ? (const char *)n->pf.hdr : "",
				  (size_t)n->pf.size);
}

/* Resize a JSON file's buffer to size bytes (pf->mu held), zero-filling. */
static int json_resize_locked(struct pfile *pf, uint64_t size)
{
	ckpt_assert_held(CKPT_RANK_PF);
	if (size > ((uint64_t)64 << 20))
		return -EFBIG;
	if (size > pf->cap) {
		size_t cap = pf->cap ? pf->cap : 4096;
		while (cap < size)
			cap *= 2;
		uint8_t *p = realloc(pf->hdr, cap);
		if (!p)
			return -ENOMEM;
		pf->hdr = p;
		pf->cap = cap;
	}
	if (size > pf->size)
		memset(pf->hdr + pf->size, 0, (size_t)(size - pf->size));
	pf->size = size;
	return 0;
}

static ssize_t json_write_locked(ckpt_view *v, struct pfile_node *n, uint64_t off, const uint8_t *data,
				 size_t len)
{
	ckpt_assert_held(CKPT_RANK_PF);
	struct pfile *pf = &n->pf;
	uint64_t end = off + len;
	int rc = end < off ? -EFBIG : 0;
	if (!rc && end > pf->size)
		rc = json_resize_locked(pf, end);
	if (!rc) {
		memcpy(pf->hdr + off, data, len);
		if (pf->is_json)
			rc = json_set_locked(v, n);
	}
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	return rc < 0 ? rc : (ssize_t)len;
}

static ssize_t write_locked(ckpt_view *v, struct pfile_node *n, uint64_t off, const uint8_t *data, size_t len,
			    int append)
{
	ckpt_assert_held(CKPT_RANK_IO);
	struct pfile *pf = &n->pf;
	ckpt_lock(&pf->mu, CKPT_RANK_PF);
	if (append) /* O_APPEND: after the furthest byte written, not the declared size */
		off = buffered(pf) || pf->is_raw ? pf->size : pf->hwm;
	pf->dirty = 1;
	if (off + len > pf->hwm)
		pf->hwm = off + len;
	if (pf->is_raw) { /* a stored copy's file: straight to the tmp folder */
		ckpt_unlock(&pf->mu, CKPT_RANK_PF);
		int fd = ckpt_pf_raw_open_f(v, n, O_WRONLY);
		int rc = fd < 0 ? fd : ckpt_pwrite_all(fd, data, len, off);
		if (rc < 0) {
			if (fd >= 0)
				close(fd);
			ckpt_log(CKPT_LOG_ERR, "%s: write: %s", n->n.name, strerror(-rc));
			return rc;
		}
		ckpt_lock(&pf->mu, CKPT_RANK_PF);
		if (off + len > pf->size)
			pf->size = off + len;
		ckpt_pf_raw_note_stat(pf, fd);
		ckpt_unlock(&pf->mu, CKPT_RANK_PF);
		close(fd);
		return (ssize_t)len;
	}
	if (buffered(pf))
		return json_write_locked(v, n, off, data, len);
	if (pf->is_st)
		return ckpt_st_import_write_locked(v, n, off, data, len);
	if (pf->data_off)
		return write_data(n, off, data, len);
	size_t take = 0;
	int rc = collect_header(v, n, off, data, len, &take);
	size_t data_off = pf->data_off;
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	if (rc < 0)
		return rc;
	if (rc == 1 && take < len) {
		/* pf->arr and pf->region are fixed once data_off is set */
		rc = ckpt_warray_write_flags(pf->arr, &pf->region, off + take - data_off, data + take,
					     len - take, same_flag(pf));
		if (rc < 0)
			return rc;
	}
	return (ssize_t)len;
}

ssize_t ckpt_view_write(ckpt_view *v, ckpt_ino ino, uint64_t off, const void *data, size_t len,
			unsigned flags)
{
	struct node *n = ckpt_node_at(v, ino);
	if (!n)
		return -ENOENT;
	if (n->kind != N_PFILE)
		return node_has_kids(n) ? -EISDIR : ckpt_pf_refuse(n->name, "write");
	struct pfile_node *f = to_pfile(n);
	struct pstep *ps = f->ps;
	ckpt_raw_note_writer(ps);
	ckpt_rdlock(&ps->io_lock, CKPT_RANK_IO);
	ssize_t rc = ps_dead(ps) || atomic_load(&n->orphan)
			     ? ckpt_pf_refuse(n->name, "write")
			     : write_locked(v, f, off, data, len, (flags & CKPT_WRITE_APPEND) != 0);
	ckpt_rwunlock(&ps->io_lock, CKPT_RANK_IO);
	return rc;
}

int ckpt_view_truncate(ckpt_view *v, ckpt_ino ino, uint64_t size)
{
	struct node *n = ckpt_node_at(v, ino);
	if (!n)
		return -ENOENT;
	if (n->kind != N_PFILE && size == 0 && ckpt_pf_is_commit_marker(v, n))
		return 0; /* a commit again: nothing changes */
	if (n->kind != N_PFILE)
		return n->kind == N_ARRAY || n->kind == N_FILE ? ckpt_pf_refuse(n->name, "truncate") : -EISDIR;
	struct pfile_node *f = to_pfile(n);
	struct pfile *pf = &f->pf;
	int rc = 0;
	ckpt_rdlock(&f->ps->io_lock, CKPT_RANK_IO);
	ckpt_lock(&pf->mu, CKPT_RANK_PF);
	if (ps_dead(f->ps) || atomic_load(&n->orphan)) {
		rc = ckpt_pf_refuse(n->name, "truncate");
	} else if (pf->is_st && size == 0) {
		/* a writer starting over: the tensors' bytes go, the same header must come again */
		for (size_t i = 0; rc == 0 && pf->data_off && i < pf->nst; i++)
			rc = ckpt_warray_forget(pf->st_arr[i], NULL);
		if (!rc)
			pf->data_off = pf->have = pf->size = pf->hwm = 0;
	} else if (pf->is_st) {
		rc = size == pf->size ? 0 : -EINVAL;
		if (rc)
			ckpt_log(CKPT_LOG_ERR, "%s: cannot resize an imported safetensors file", n->name);
	} else if (pf->is_raw) {
		int fd = ckpt_pf_raw_open_f(v, f, O_WRONLY);
		rc = fd < 0 ? fd : ftruncate(fd, (off_t)size) ? -errno : 0;
		if (!rc) {
			pf->size = pf->hwm = size;
			ckpt_pf_raw_note_stat(pf, fd);
		}
		if (fd >= 0)
			close(fd);
	} else if (buffered(pf)) {
		rc = json_resize_locked(pf, size);
		if (!rc && pf->is_json)
			rc = json_set_locked(v, f);
		if (!rc)
			pf->hwm = size;
	} else if (size == 0 && !pf->data_off) {
		pf->have = pf->size = 0;
		pf->hwm = 0;
	} else if (size == 0) {
		/* O_TRUNC of a written file: a writer starting over.  Its bytes
		 * go (the array is incomplete until written again); the next
		 * header must repeat the declaration. */
		rc = ckpt_warray_forget(pf->arr, &pf->region);
		if (!rc) {
			pf->data_off = 0;
			pf->have = pf->size = 0;
			pf->hwm = 0;
		}
	} else if (size == pf->size) {
		rc = 0;
	} else {
		ckpt_log(CKPT_LOG_ERR, "%s: cannot resize to %llu bytes (the .npy header fixes the size)",
			 n->name, (unsigned long long)size);
		rc = -EINVAL;
	}
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	ckpt_rwunlock(&f->ps->io_lock, CKPT_RANK_IO);
	return rc;
}

/* Read back a pending file: the header bytes, then what the writer holds
 * (io_lock shared: never concurrent with the step's commit or abort). */
static ssize_t pending_read(ckpt_view *v, struct node *node, uint64_t off, size_t len, void *dst)
{
	struct pfile_node *n = to_pfile(node);
	struct pfile *pf = &n->pf;
	ckpt_rdlock(&n->ps->io_lock, CKPT_RANK_IO);
	if (ps_dead(n->ps)) {
		/* committed (the step's files are read from its folder under their
		 * path now) or aborted: the writer's state is gone */
		ckpt_rwunlock(&n->ps->io_lock, CKPT_RANK_IO);
		return -ESTALE;
	}
	ckpt_lock(&pf->mu, CKPT_RANK_PF);
	uint64_t size = pf->size;
	if (pf->is_st) {
		ssize_t r = ckpt_st_import_read_locked(pf, off, len, dst);
		ckpt_rwunlock(&n->ps->io_lock, CKPT_RANK_IO);
		return r;
	}
	if (pf->is_raw) {
		ckpt_unlock(&pf->mu, CKPT_RANK_PF);
		size_t k = off < size ? (size_t)(size - off < len ? size - off : len) : 0;
		int fd = k ? ckpt_pf_raw_open_f(v, n, O_RDONLY) : 0;
		int rc = fd < 0 ? fd : k ? ckpt_pread_all(fd, dst, k, off) : 0;
		if (k && fd >= 0)
			close(fd);
		ckpt_rwunlock(&n->ps->io_lock, CKPT_RANK_IO);
		return rc < 0 ? rc : (ssize_t)k;
	}
	if (buffered(pf)) {
		size_t k = off < size ? (size_t)(size - off < len ? size - off : len) : 0;
		if (k)
			memcpy(dst, pf->hdr + off, k);
		ckpt_unlock(&pf->mu, CKPT_RANK_PF);
		ckpt_rwunlock(&n->ps->io_lock, CKPT_RANK_IO);
		return (ssize_t)k;
	}
	size_t done = ckpt_pf_header_part(pf, off, &len, dst);
	ckpt_warray *arr = pf->arr;
	ckpt_region r = pf->region;
	size_t doff = pf->data_off;
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	ssize_t rc = 0;
	if (done < len && arr) {
		rc = ckpt_warray_read(arr, &r, off + done - doff, (uint8_t *)dst + done, len - done);
		if (rc >= 0)
			done += (size_t)rc;
	}
	ckpt_rwunlock(&n->ps->io_lock, CKPT_RANK_IO);
	return rc < 0 ? rc : (ssize_t)done;
}

/* user.ckpt.dtype on a pending file: the dtype its .npy header means (for
 * '<V1', which np.save writes for every 1-byte ml_dtypes type). */
int ckpt_pf_set_dtype(struct pfile_node *f, const char *value, size_t size)
{
	char name[32];
	if (size >= sizeof(name)) {
		ckpt_log(CKPT_LOG_ERR, "%s: user.ckpt.dtype: not a dtype name", f->n.name);
		return -EINVAL;
	}
	memcpy(name, value, size);
	name[size] = 0;
	ckpt_dtype dt = ckpt_dtype_from_name(name);
	if (dt == CKPT_DT_INVALID) {
		ckpt_log(
			CKPT_LOG_ERR,
			"%s: user.ckpt.dtype: unknown dtype '%s' (TensorStore names: float8_e5m2, int4, ...)",
			f->n.name, name);
		return -EINVAL;
	}
	struct pfile *pf = &f->pf;
	int rc = 0;
	ckpt_rdlock(&f->ps->io_lock, CKPT_RANK_IO);
	ckpt_lock(&pf->mu, CKPT_RANK_PF);
	int dead = ps_dead(f->ps); /* then the arrays are freed */
	ckpt_warray *known = dead ? NULL : pf->is_slice ? pf->decl->pf.arr : pf->arr;
	ckpt_dtype have = CKPT_DT_INVALID;
	if (known) {
		ckpt_warray_info info;
		ckpt_warray_get_info(known, &info);
		have = info.dtype;
	}
	if (dead || atomic_load(&f->n.orphan)) {
		rc = ckpt_pf_refuse(f->n.name, "set an extended attribute");
	} else if (buffered(pf)) {
		rc = -ENOTSUP;
	} else if (known && have != dt) {
		ckpt_log(CKPT_LOG_ERR, "%s: user.ckpt.dtype: the array is declared as %s", f->n.name,
			 ckpt_dtype_get(have)->name);
		rc = -EINVAL;
	} else if (!known && pf->have) {
		ckpt_log(CKPT_LOG_ERR, "%s: set user.ckpt.dtype before writing the file", f->n.name);
		rc = -EINVAL;
	} else {
		pf->hint = dt;
	}
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	ckpt_rwunlock(&f->ps->io_lock, CKPT_RANK_IO);
	return rc;
}
