/*
 * pending/file.c - the pending files whose bytes the view keeps or hands
 * to the writer itself, and their kinds' ops (struct pfile_ops):
 *   PF_ARRAY, PF_SLICE  NAME.npy and NAME[slice].npy: the .npy header is
 *                       collected and parsed (the header phase, pending_int.h),
 *                       the array declared, then the data goes to the writer;
 *   PF_JSON, PF_META, PF_MARKER, PF_INDEX  buffered: the JSON file of a JSON
 *                       item, copied Orbax metadata, the step's commit
 *                       marker, a safetensors index; their bytes stay here.
 * And the write and truncate calls of every pending file: the gate, then
 * the file's kind (reads dispatch from N_PFILE's node ops, pfile.c).
 * Not here: raw files (raw.c), safetensors imports (safetensors.c), which
 * kind a new file is (namespace.c), completeness of the step (step.c).
 */
#include <stdio.h>
#include <stdlib.h>

#include "orbax.h"
#include "writer_hosts.h"
#include "pending_int.h"

/* ---- NAME.npy and NAME[slice].npy -------------------------------------------- */

/* Multi-host: NAME.npy that another host declared (its declaration record,
 * writer_hosts.h) becomes a declared pending file here, as if its header
 * had been written on this mount.  ns_lock exclusive held; NULL if none. */
struct pfile_node *ckpt_pf_adopt_decl(ckpt_view *v, struct node *dir, const char *base)
{
	ckpt_assert_held(CKPT_RANK_NS);
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
	struct pfile_node *f = hl > 0 ? ckpt_pf_node_new(v, dir, base, &ckpt_pf_array_ops) : NULL;
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
	ckpt_lock(&f->pf.mu, CKPT_RANK_PF);
	ckpt_pf_set_phase(&f->pf, PH_DATA); /* as if its header had been written here */
	ckpt_unlock(&f->pf.mu, CKPT_RANK_PF);
	return f;
}

/* Declare the array from the parsed header (pf->mu held). */
static int declare(ckpt_view *v, struct pfile_node *n, const ckpt_npy_info *h)
{
	ckpt_assert_held(CKPT_RANK_PF);
	struct pfile *pf = &n->pf;
	if (pf->kind == PF_SLICE) {
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
	return pf->kind == PF_SLICE || atomic_load(&pf->nslices) ? CKPT_WRITE_SAME : 0;
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
	ckpt_assert_held(CKPT_RANK_PF);
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
	ckpt_warray *known = pf->kind == PF_SLICE ? pf->decl->pf.arr : pf->arr;
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
	ckpt_pf_set_phase(pf, PH_DATA);
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

/* write of PF_ARRAY, PF_SLICE: the header phase collects the header; once
 * declared, header bytes must not change and the rest is array data,
 * written without pf->mu. */
struct npy_snap {
	ckpt_warray *arr;
	ckpt_region region;
};

/* arr and region are fixed once declared: copied under pf->mu. */
static void npy_snap(struct pfile *pf, void *arg)
{
	struct npy_snap *s = arg;
	s->arr = pf->arr;
	s->region = pf->region;
}

static ssize_t npy_write(ckpt_view *v, struct pfile_node *f, uint64_t off, const uint8_t *data, size_t len,
			 int append)
{
	ckpt_assert_held(CKPT_RANK_IO);
	struct npy_snap s;
	size_t take, data_off;
	int rc = ckpt_pf_header_write(v, f, &off, data, len, append, collect_header, ".npy", npy_snap, &s,
				      &take, &data_off);
	if (rc <= 0)
		return rc < 0 ? rc : (ssize_t)len;
	if (take < len) {
		rc = ckpt_warray_write_flags(s.arr, &s.region, off + take - data_off, data + take, len - take,
					     same_flag(&f->pf));
		if (rc < 0)
			return rc;
	}
	return (ssize_t)len;
}

/* Read back: the header bytes, then what the writer holds. */
static ssize_t npy_read(ckpt_view *v, struct pfile_node *f, uint64_t off, size_t len, uint8_t *dst)
{
	ckpt_assert_held(CKPT_RANK_IO);
	(void)v;
	struct pfile *pf = &f->pf;
	ckpt_lock(&pf->mu, CKPT_RANK_PF);
	ckpt_pf_assert(pf);
	size_t done = ckpt_pf_header_part(pf, off, &len, dst);
	ckpt_warray *arr = pf->arr;
	ckpt_region r = pf->region;
	size_t doff = pf->data_off;
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	ssize_t rc = 0;
	if (done < len && arr) {
		rc = ckpt_warray_read(arr, &r, off + done - doff, dst + done, len - done);
		if (rc >= 0)
			done += (size_t)rc;
	}
	return rc < 0 ? rc : (ssize_t)done;
}

static int npy_truncate(ckpt_view *v, struct pfile_node *f, uint64_t size)
{
	ckpt_assert_held(CKPT_RANK_IO);
	(void)v;
	struct pfile *pf = &f->pf;
	int rc = 0;
	ckpt_lock(&pf->mu, CKPT_RANK_PF);
	ckpt_pf_assert(pf);
	if (size == 0 && pf->phase == PH_HEADER) {
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
			ckpt_pf_set_phase(pf, PH_HEADER);
		}
	} else if (size != pf->size) {
		ckpt_log(CKPT_LOG_ERR, "%s: cannot resize to %llu bytes (the .npy header fixes the size)",
			 f->n.name, (unsigned long long)size);
		rc = -EINVAL;
	}
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	return rc;
}

static int npy_check(struct pfile_node *f, int copy, char *why, size_t cap)
{
	ckpt_assert_held(CKPT_RANK_NS);
	struct pfile *pf = &f->pf;
	int rc = ckpt_pf_copy_busy(f, copy, why, cap);
	if (rc)
		return rc;
	ckpt_lock(&pf->mu, CKPT_RANK_PF);
	ckpt_warray *arr = pf->arr;
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	if (!arr) {
		snprintf(why, cap,
			 "created, but its .npy header was never completed (write the file again, or rm it)");
		return -ENODATA;
	}
	if (copy && pf->kind == PF_ARRAY) {
		ckpt_warray_info info;
		ckpt_warray_get_info(arr, &info);
		if (info.bytes_written < info.nbytes) {
			snprintf(why, cap, "%llu of %llu bytes not written yet",
				 (unsigned long long)(info.nbytes - info.bytes_written),
				 (unsigned long long)info.nbytes);
			return -ENODATA;
		}
	}
	return 0;
}

/* unlink of NAME.npy: its array's bytes and folder go. */
static int array_destroy(ckpt_view *v, struct pfile_node *f)
{
	ckpt_assert_held(CKPT_RANK_IO);
	(void)v;
	ckpt_lock(&f->pf.mu, CKPT_RANK_PF);
	ckpt_warray *arr = f->pf.arr;
	ckpt_unlock(&f->pf.mu, CKPT_RANK_PF);
	return arr ? ckpt_warray_remove(arr) : 0;
}

/* unlink of a slice file: what it wrote stays in the array. */
static int keep_destroy(ckpt_view *v, struct pfile_node *f)
{
	(void)v;
	(void)f;
	return 0;
}

const struct pfile_ops ckpt_pf_array_ops = {
	.kind = PF_ARRAY,
	.name = "array",
	.write = npy_write,
	.read = npy_read,
	.truncate = npy_truncate,
	.check = npy_check,
	.destroy = array_destroy,
};

const struct pfile_ops ckpt_pf_slice_ops = {
	.kind = PF_SLICE,
	.name = "slice",
	.write = npy_write,
	.read = npy_read,
	.truncate = npy_truncate,
	.check = npy_check,
	.destroy = keep_destroy,
};

/* ---- buffered files: JSON, copied metadata, the marker, an index -------------- */

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

static ssize_t buf_write(ckpt_view *v, struct pfile_node *f, uint64_t off, const uint8_t *data, size_t len,
			 int append)
{
	ckpt_assert_held(CKPT_RANK_IO);
	struct pfile *pf = &f->pf;
	ckpt_lock(&pf->mu, CKPT_RANK_PF);
	ckpt_pf_assert(pf);
	ckpt_pf_note_write_locked(pf, &off, len, append);
	uint64_t end = off + len;
	int rc = end < off ? -EFBIG : 0;
	if (!rc && end > pf->size)
		rc = json_resize_locked(pf, end);
	if (!rc) {
		memcpy(pf->hdr + off, data, len);
		if (pf->kind == PF_JSON)
			rc = json_set_locked(v, f);
	}
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	return rc < 0 ? rc : (ssize_t)len;
}

static ssize_t buf_read(ckpt_view *v, struct pfile_node *f, uint64_t off, size_t len, uint8_t *dst)
{
	ckpt_assert_held(CKPT_RANK_IO);
	(void)v;
	struct pfile *pf = &f->pf;
	ckpt_lock(&pf->mu, CKPT_RANK_PF);
	uint64_t size = pf->size;
	size_t k = off < size ? (size_t)(size - off < len ? size - off : len) : 0;
	if (k)
		memcpy(dst, pf->hdr + off, k);
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	return (ssize_t)k;
}

static int buf_truncate(ckpt_view *v, struct pfile_node *f, uint64_t size)
{
	ckpt_assert_held(CKPT_RANK_IO);
	struct pfile *pf = &f->pf;
	ckpt_lock(&pf->mu, CKPT_RANK_PF);
	int rc = json_resize_locked(pf, size);
	if (!rc && pf->kind == PF_JSON)
		rc = json_set_locked(v, f);
	if (!rc)
		pf->hwm = size;
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	return rc;
}

/* unlink of a JSON item's file: the item has no content any more. */
static int json_destroy(ckpt_view *v, struct pfile_node *f)
{
	ckpt_assert_held(CKPT_RANK_IO);
	return ckpt_step_set_json(f->ps->step, parent_of(v, &f->n)->name, NULL, 0);
}

/* unlink of the marker: the copy's request to commit is withdrawn (ns_lock). */
static int marker_destroy(ckpt_view *v, struct pfile_node *f)
{
	ckpt_assert_held(CKPT_RANK_NS);
	(void)v;
	f->ps->commit_wanted = 0;
	return 0;
}

const struct pfile_ops ckpt_pf_json_ops = {
	.kind = PF_JSON,
	.name = "json",
	.write = buf_write,
	.read = buf_read,
	.truncate = buf_truncate,
	.check = ckpt_pf_copy_busy,
	.destroy = json_destroy,
};

const struct pfile_ops ckpt_pf_meta_ops = {
	.kind = PF_META,
	.name = "meta",
	.write = buf_write,
	.read = buf_read,
	.truncate = buf_truncate,
	.check = ckpt_pf_copy_busy,
	.destroy = keep_destroy,
};

const struct pfile_ops ckpt_pf_marker_ops = {
	.kind = PF_MARKER,
	.name = "marker",
	.write = buf_write,
	.read = buf_read,
	.truncate = buf_truncate,
	.check = ckpt_pf_copy_busy,
	.destroy = marker_destroy,
};

const struct pfile_ops ckpt_pf_index_ops = {
	.kind = PF_INDEX,
	.name = "index",
	.write = buf_write,
	.read = buf_read,
	.truncate = buf_truncate,
	.check = ckpt_pf_copy_busy,
	.destroy = keep_destroy,
};

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
	ckpt_warray *known = dead ? NULL : pf->kind == PF_SLICE ? pf->decl->pf.arr : pf->arr;
	ckpt_dtype have = CKPT_DT_INVALID;
	if (known) {
		ckpt_warray_info info;
		ckpt_warray_get_info(known, &info);
		have = info.dtype;
	}
	if (dead || atomic_load(&f->n.orphan)) {
		rc = ckpt_pf_refuse(f->n.name, "set an extended attribute");
	} else if (pf_buffered(pf)) {
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

/* ---- write and truncate of every pending file: the gate, then its kind -------- */

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
			     : f->pf.ops->write(v, f, off, data, len, (flags & CKPT_WRITE_APPEND) != 0);
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
		return n->kind == N_ARRAY || n->kind == N_FILE ? ckpt_pf_refuse(n->name, "truncate")
							       : -EISDIR;
	struct pfile_node *f = to_pfile(n);
	ckpt_rdlock(&f->ps->io_lock, CKPT_RANK_IO);
	int rc = ps_dead(f->ps) || atomic_load(&n->orphan) ? ckpt_pf_refuse(n->name, "truncate")
							   : f->pf.ops->truncate(v, f, size);
	ckpt_rwunlock(&f->ps->io_lock, CKPT_RANK_IO);
	return rc;
}
