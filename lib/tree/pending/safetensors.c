/*
 * pending/safetensors.c - importing safetensors files into a pending step.
 *
 * `cp model.safetensors MNT/30/state/params.safetensors` (or shard files
 * into MNT/30/state/params.safetensors.d/): the header is parsed as its
 * bytes arrive, every tensor becomes an array of the step under
 * params/<name split on '.'> (the read side's safetensors view joins key
 * paths with '.'), and the data buffer is cut into writes of those arrays
 * as it streams in: nothing is kept beyond the writer's chunk buffers.
 * `__metadata__` is not kept (Orbax has no place for it).
 * Not here: the node kind (file.c), the step's checks (step.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "orbax.h"
#include "writer_hosts.h"
#include "pending_int.h"

/* The array key path of an imported file: its directory's, then X (from
 * X.safetensors, or from X.safetensors.d/ for a shard). */
static int st_prefix(ckpt_view *v, struct pfile_node *f, const char **item, const char **keys, int *types,
		     int *depth, char *kbuf)
{
	struct node *dir = parent_of(v, &f->n);
	const char *fname = f->pf.final ? f->pf.final : f->n.name;
	char stem[VIEW_NAME_BUF];
	const char *from = fname;
	size_t cut = strlen(ST_SUFFIX);
	if (dir->kind == N_PDIR && to_pdir(dir)->is_stdir) {
		from = dir->name;
		cut = strlen(ST_DIR_SUFFIX);
		dir = parent_of(v, dir);
	}
	size_t sl = strlen(from) - cut;
	if (sl >= sizeof(stem))
		return -ENAMETOOLONG;
	memcpy(stem, from, sl);
	stem[sl] = 0;
	return ckpt_pf_key_path(v, dir, stem, item, keys, types, depth, kbuf);
}

/* Declare the parsed tensors (pf->mu held): all or none. */
static int st_declare(ckpt_view *v, struct pfile_node *f)
{
	ckpt_assert_held(CKPT_RANK_PF);
	struct pfile *pf = &f->pf;
	const char *item, *keys[CKPT_ORBAX_MAX_DEPTH];
	int types[CKPT_ORBAX_MAX_DEPTH], depth;
	char *kbuf = malloc((size_t)CKPT_ORBAX_MAX_DEPTH * VIEW_NAME_BUF);
	char *nbuf = NULL;
	int rc = kbuf ? st_prefix(v, f, &item, keys, types, &depth, kbuf) : -ENOMEM;
	if (rc == 0 && !(pf->st_arr = calloc(pf->nst ? pf->nst : 1, sizeof(*pf->st_arr))))
		rc = -ENOMEM;
	size_t i = 0;
	for (; rc == 0 && i < pf->nst; i++) {
		const ckpt_st_entry *e = &pf->st[i];
		free(nbuf);
		if (!(nbuf = strdup(e->name))) {
			rc = -ENOMEM;
			break;
		}
		int d = depth;
		for (char *p = nbuf, *q; p && rc == 0; p = q) {
			q = strchr(p, '.');
			if (q)
				*q++ = 0;
			if (d == CKPT_ORBAX_MAX_DEPTH || !*p) {
				ckpt_log(CKPT_LOG_ERR,
					 "%s: tensor '%s': not a key path (empty part, or too deep)",
					 f->n.name, e->name);
				rc = -EINVAL;
				break;
			}
			int digits = 1;
			for (const char *c = p; *c; c++)
				digits &= *c >= '0' && *c <= '9';
			keys[d] = p;
			types[d++] = digits ? CKPT_KEY_SEQ : CKPT_KEY_DICT;
		}
		if (rc == 0 && ckpt_step_find_array(f->ps->step, item, keys, d))
			rc = -EEXIST; /* another file's array: names must not collide */
		if (rc == 0)
			rc = ckpt_hosts_declare(f->ps->step, item, keys, types, d, e->dtype, e->rank,
						e->shape, &pf->st_arr[i]);
		if (rc < 0)
			ckpt_log(CKPT_LOG_ERR, "%s: tensor '%s' cannot be an array of the step: %s",
				 f->n.name, e->name, strerror(-rc));
	}
	if (rc < 0 && pf->st_arr) { /* none: the file may be written again */
		for (size_t k = 0; k < pf->nst; k++)
			if (pf->st_arr[k])
				ckpt_warray_remove(pf->st_arr[k]);
		free(pf->st_arr);
		pf->st_arr = NULL;
	}
	free(nbuf);
	free(kbuf);
	return rc < 0 ? (rc == -ENOMEM ? rc : -EINVAL) : 0;
}

static int st_entry_cmp(const void *a, const void *b)
{
	const ckpt_st_entry *x = a, *y = b;
	return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* The tensors of an imported file's header (format/safetensors.c checks it
 * as the reference reader does), sorted by data offset, their offsets made
 * relative to the data buffer; *data_size the buffer's size.  The file's
 * final size is not known while it is written: offsets are checked against
 * one another only. */
static int st_entries_parse(struct pfile_node *f, const char *json, size_t len, ckpt_st_entry **out,
			    size_t *n, uint64_t *data_size)
{
	ckpt_st_file *stf = NULL;
	int rc = ckpt_st_parse(json, len, UINT64_MAX, f->n.name, &stf);
	if (rc < 0)
		return rc;
	ckpt_st_entry *e = calloc(stf->n ? stf->n : 1, sizeof(*e));
	*data_size = 0;
	for (size_t i = 0; e && i < stf->n; i++) {
		e[i] = stf->t[i];
		e[i].begin -= stf->data_start;
		e[i].end -= stf->data_start;
		if (e[i].end > *data_size)
			*data_size = e[i].end;
		stf->t[i].name = NULL; /* moved */
	}
	*n = stf->n;
	ckpt_st_file_free(stf);
	if (!e)
		return -ENOMEM;
	qsort(e, *n, sizeof(*e), st_entry_cmp);
	*out = e;
	return 0;
}

/* Header phase of an imported file (pf->mu held): as collect_header. */
static int st_collect(ckpt_view *v, struct pfile_node *f, uint64_t off, const uint8_t *data, size_t len,
		      size_t *take)
{
	ckpt_assert_held(CKPT_RANK_PF);
	struct pfile *pf = &f->pf;
	if (off > pf->have) {
		ckpt_log(CKPT_LOG_ERR, "%s: write at %llu before the safetensors header is complete",
			 f->n.name, (unsigned long long)off);
		return -EINVAL;
	}
	uint64_t need = 8;
	if (pf->have >= 8 || off + len >= 8) {
		uint8_t lenb[8];
		for (int i = 0; i < 8; i++)
			lenb[i] = (uint64_t)i < pf->have ? pf->hdr[i] : data[i - off];
		uint64_t n = ckpt_le64(lenb);
		if (n > 100000000 || n < 2) {
			ckpt_log(CKPT_LOG_ERR, "%s: not a safetensors file (header length %llu)", f->n.name,
				 (unsigned long long)n);
			pf->have = 0;
			return -EINVAL;
		}
		need = 8 + n;
	}
	*take = off + len < need ? len : (size_t)(need - off);
	if (ckpt_pf_hdr_put(pf, off, data, *take) < 0)
		return -ENOMEM;
	if (need == 8 || pf->have < need) {
		pf->size = pf->have;
		return 0;
	}
	ckpt_st_entry *e;
	size_t n;
	uint64_t data_size;
	int rc = st_entries_parse(f, (const char *)pf->hdr + 8, (size_t)(need - 8), &e, &n, &data_size);
	if (rc == 0 && pf->st) { /* again after O_TRUNC: the same tensors or nothing */
		int same = n == pf->nst && data_size == pf->st_data;
		for (size_t i = 0; same && i < n; i++)
			same = !strcmp(e[i].name, pf->st[i].name) && e[i].dtype == pf->st[i].dtype &&
			       e[i].begin == pf->st[i].begin && e[i].rank == pf->st[i].rank &&
			       !memcmp(e[i].shape, pf->st[i].shape, sizeof(uint64_t) * (size_t)e[i].rank);
		ckpt_pf_st_entries_free(e, n);
		if (!same) {
			ckpt_log(CKPT_LOG_ERR,
				 "%s: written again with other tensors; rm it first to import anew",
				 f->n.name);
			rc = -EINVAL;
		}
	} else if (rc == 0) {
		pf->st = e;
		pf->nst = n;
		pf->st_data = data_size;
		rc = st_declare(v, f);
		if (rc < 0) {
			ckpt_pf_st_entries_free(pf->st, pf->nst);
			pf->st = NULL;
			pf->nst = 0;
		}
	} else if (rc != -ENOMEM) {
		rc = -EINVAL; /* logged by the parser */
	}
	if (rc < 0) {
		pf->have = 0; /* forgotten: the writer may start over */
		return rc;
	}
	pf->data_off = (size_t)need;
	ckpt_pf_set_phase(pf, PH_DATA);
	pf->size = need + pf->st_data;
	return 1;
}

/* Data of an imported file: file bytes [off, off+len) past the header
 * (data_off bytes) go to the tensors they belong to.  pf->st is fixed once
 * the header is parsed. */
static int st_write_data(struct pfile_node *f, uint64_t off, size_t data_off, const uint8_t *data, size_t len)
{
	struct pfile *pf = &f->pf;
	uint64_t d = off - data_off;
	if (d + len > pf->st_data || d + len < d) {
		ckpt_log(CKPT_LOG_ERR, "%s: write past the end of the data its header declares", f->n.name);
		return -EFBIG;
	}
	size_t lo = 0, hi = pf->nst; /* first tensor with end > d */
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (pf->st[mid].end <= d)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (size_t i = lo; len && i < pf->nst; i++) {
		const ckpt_st_entry *e = &pf->st[i];
		if (e->end == e->begin)
			continue;
		size_t k = e->end - d < len ? (size_t)(e->end - d) : len;
		int rc = ckpt_warray_write(pf->st_arr[i], NULL, d - e->begin, data, k);
		if (rc < 0)
			return rc;
		d += k;
		data += k;
		len -= k;
	}
	return 0;
}

/* ---- the kind's ops (PF_ST) -------------------------------------------------- */

static ssize_t st_write(ckpt_view *v, struct pfile_node *f, uint64_t off, const uint8_t *data, size_t len,
			int append)
{
	ckpt_assert_held(CKPT_RANK_IO);
	size_t take, data_off;
	int rc = ckpt_pf_header_write(v, f, &off, data, len, append, st_collect, "safetensors", NULL, NULL,
				      &take, &data_off);
	if (rc <= 0)
		return rc < 0 ? rc : (ssize_t)len;
	if (take < len && (rc = st_write_data(f, off + take, data_off, data + take, len - take)) < 0)
		return rc;
	return (ssize_t)len;
}

/* Read back an imported file: the header bytes, then the tensors' (never
 * written bytes read as zeros). */
static ssize_t st_read(ckpt_view *v, struct pfile_node *f, uint64_t off, size_t len, uint8_t *dst)
{
	ckpt_assert_held(CKPT_RANK_IO);
	(void)v;
	struct pfile *pf = &f->pf;
	ckpt_lock(&pf->mu, CKPT_RANK_PF);
	ckpt_pf_assert(pf);
	size_t hl = pf->data_off ? pf->data_off : pf->have;
	size_t done = ckpt_pf_header_part(pf, off, &len, dst);
	int parsed = pf->phase == PH_DATA;
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	uint64_t d = off + done - hl;
	for (size_t i = 0; parsed && done < len && i < pf->nst; i++) {
		const ckpt_st_entry *e = &pf->st[i];
		if (e->end <= d)
			continue;
		size_t k = e->end - d < len - done ? (size_t)(e->end - d) : len - done;
		ssize_t r = ckpt_warray_read(pf->st_arr[i], NULL, d - e->begin, dst + done, k);
		if (r < 0)
			return r;
		if ((size_t)r < k)
			memset(dst + done + r, 0, k - (size_t)r);
		done += k;
		d += k;
	}
	return (ssize_t)done;
}

static int st_truncate(ckpt_view *v, struct pfile_node *f, uint64_t size)
{
	ckpt_assert_held(CKPT_RANK_IO);
	(void)v;
	struct pfile *pf = &f->pf;
	int rc = 0;
	ckpt_lock(&pf->mu, CKPT_RANK_PF);
	ckpt_pf_assert(pf);
	if (size == 0) {
		/* a writer starting over: the tensors' bytes go, the same header must come again */
		for (size_t i = 0; rc == 0 && pf->phase == PH_DATA && i < pf->nst; i++)
			rc = ckpt_warray_forget(pf->st_arr[i], NULL);
		if (!rc) {
			if (pf->phase == PH_DATA)
				ckpt_pf_set_phase(pf, PH_HEADER);
			pf->data_off = pf->have = pf->size = pf->hwm = 0;
		}
	} else if (size != pf->size) {
		rc = -EINVAL;
		ckpt_log(CKPT_LOG_ERR, "%s: cannot resize an imported safetensors file", f->n.name);
	}
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	return rc;
}

static int st_check(struct pfile_node *f, int copy, char *why, size_t cap)
{
	ckpt_assert_held(CKPT_RANK_NS);
	struct pfile *pf = &f->pf;
	ckpt_lock(&pf->mu, CKPT_RANK_PF);
	int dirty = pf->dirty, parsed = pf->phase == PH_DATA;
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	if (copy && dirty) {
		snprintf(why, cap, "still being copied");
		return -EBUSY;
	}
	if (!parsed) {
		snprintf(why, cap, "created, but its safetensors header was never completed");
		return -ENODATA;
	}
	for (size_t i = 0; copy && i < pf->nst; i++) {
		ckpt_warray_info info;
		ckpt_warray_get_info(pf->st_arr[i], &info);
		if (info.bytes_written < info.nbytes) {
			snprintf(why, cap, "tensor %s not written yet", pf->st[i].name);
			return -ENODATA;
		}
	}
	return 0;
}

/* unlink: an import's tensors go with it. */
static int st_destroy(ckpt_view *v, struct pfile_node *f)
{
	ckpt_assert_held(CKPT_RANK_IO);
	(void)v;
	struct pfile *pf = &f->pf;
	int rc = 0;
	for (size_t i = 0; pf->st_arr && i < pf->nst && rc == 0; i++)
		rc = ckpt_warray_remove(pf->st_arr[i]);
	return rc;
}

const struct pfile_ops ckpt_pf_st_ops = {
	.kind = PF_ST,
	.name = "safetensors",
	.write = st_write,
	.read = st_read,
	.truncate = st_truncate,
	.check = st_check,
	.destroy = st_destroy,
};
