/*
 * foreign_torch.c - PyTorch checkpoints as virtual Orbax items (foreign.h):
 *
 *   torch        a torch.save file (the ZIP format of torch >= 1.6): data.pkl
 *                read with the restricted pickle reader (format/pickle.h,
 *                nothing is ever called), every tensor a view of a stored
 *                member data/<key>, served as a byte range of the file.  The
 *                older non-ZIP and tar formats are recognized and refused.
 *   dcp          a distributed-checkpoint folder: .metadata names every
 *                tensor's chunk boxes and where each chunk's item lies (a
 *                torch.save archive of the chunk inside a data file, maybe a
 *                zstd stream of one); a tensor whose boxes form a regular
 *                grid is a zarr array with that chunk grid.
 *   safetensors  a .safetensors file, or a folder of shards with
 *                model.safetensors.index.json.
 *
 * Names: a tensor's name (a state-dict key, an fqn, a safetensors name) is
 * split on '.' into its key path, so that the safetensors view of the tree
 * joins it back to the original name.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "common.h"
#include "foreign.h"
#include "orbax.h"
#include "pickle.h"
#include "safetensors.h"
#include "torch.h"
#include "zip.h"

#define PICKLE_MAX (64u << 20) /* data.pkl, .metadata */
#define INDEX_MAX (64u << 20) /* model.safetensors.index.json */
#define ZSTD_ITEM_MAX (256u << 20) /* one decompressed zstd item */
#define ZSTD_TOTAL_MAX (1024u << 20) /* all zstd items of one checkpoint, kept in memory */
#define DCP_METADATA ".metadata"
#define ST_INDEX "model.safetensors.index.json"

/* ---- byte sources: a range of a store's file, or memory ----------------------- */

struct frd {
	ckpt_store *s;
	const char *key;
	uint64_t base, size;
	const uint8_t *mem; /* when set: the bytes themselves (size of them) */
};

static ssize_t frd_read(void *ctx, uint64_t off, size_t len, void *dst)
{
	struct frd *r = ctx;
	if (off >= r->size)
		return 0;
	if (len > r->size - off)
		len = (size_t)(r->size - off);
	if (r->mem) {
		memcpy(dst, r->mem + off, len);
		return (ssize_t)len;
	}
	return ckpt_store_read(r->s, r->key, r->base + off, len, dst);
}

/* ---- one torch.save archive ---------------------------------------------------- */

struct tarch {
	struct frd r;
	struct ckpt_zip_dir dir;
	const struct ckpt_zip_entry **sorted; /* the entries by name, for lookups */
	char prefix[256]; /* the archive's top folder, with its '/' ("archive/") */
	int big_endian;
	ckpt_pickle *pk;
	struct ckpt_torch_state st;
};

static void tarch_free(struct tarch *a)
{
	free(a->sorted);
	a->sorted = NULL;
	ckpt_torch_state_free(&a->st);
	ckpt_pickle_free(a->pk);
	ckpt_zip_dir_free(&a->dir);
	a->pk = NULL;
}

static int by_name(const void *x, const void *y)
{
	return strcmp((*(const struct ckpt_zip_entry *const *)x)->name,
		      (*(const struct ckpt_zip_entry *const *)y)->name);
}

/* Member prefix + name (a binary search once the entries are sorted). */
static const struct ckpt_zip_entry *zfind(struct tarch *a, const char *prefix, const char *name)
{
	char full[512];
	if (snprintf(full, sizeof(full), "%s%s", prefix, name) >= (int)sizeof(full))
		return NULL;
	if (!a->sorted && a->dir.n) {
		a->sorted = malloc(a->dir.n * sizeof(*a->sorted));
		if (!a->sorted)
			return NULL;
		for (size_t i = 0; i < a->dir.n; i++)
			a->sorted[i] = &a->dir.e[i];
		qsort(a->sorted, a->dir.n, sizeof(*a->sorted), by_name);
	}
	size_t lo = 0, hi = a->dir.n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(a->sorted[mid]->name, full);
		if (c == 0)
			return a->sorted[mid];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

/* Where member e's bytes lie in the archive (stored members only). */
static int member_at(struct tarch *a, const struct ckpt_zip_entry *e, uint64_t *off, const char **why)
{
	if (e->flags & 1) {
		*why = "an encrypted member";
		return -EINVAL;
	}
	if (e->method != 0) {
		*why = "a compressed member (torch.save stores them)";
		return -EINVAL;
	}
	return ckpt_zip_data_offset(frd_read, &a->r, &a->dir, e, off, why);
}

/* Read the directory, data.pkl and byteorder of the archive a->r; parse the tensors. */
static int tarch_open(struct tarch *a, const char *what)
{
	const char *why = "?";
	int rc = ckpt_zip_dir_read(frd_read, &a->r, a->r.size, &a->dir, &why);
	const struct ckpt_zip_entry *pkl = NULL;
	for (size_t i = 0; rc == 0 && i < a->dir.n && !pkl; i++) {
		const char *n = a->dir.e[i].name;
		const char *slash = strchr(n, '/');
		if (slash && strcmp(slash + 1, "data.pkl") == 0 &&
		    (size_t)(slash - n) + 1 < sizeof(a->prefix)) {
			pkl = &a->dir.e[i];
			memcpy(a->prefix, n, (size_t)(slash - n) + 1);
			a->prefix[slash - n + 1] = 0;
		}
	}
	if (rc == 0 && !pkl) {
		why = "no <archive>/data.pkl member";
		rc = -EINVAL;
	}
	uint64_t off = 0;
	if (rc == 0 && (rc = member_at(a, pkl, &off, &why)) == 0 && pkl->csize > PICKLE_MAX) {
		why = "data.pkl larger than 64 MiB";
		rc = -EINVAL;
	}
	uint8_t *buf = NULL;
	if (rc == 0) {
		buf = malloc(pkl->csize ? (size_t)pkl->csize : 1);
		ssize_t n = buf ? frd_read(&a->r, off, (size_t)pkl->csize, buf) : -ENOMEM;
		if (n >= 0 && (uint64_t)n != pkl->csize) {
			why = "data.pkl is cut short";
			n = -EINVAL;
		}
		rc = n < 0 ? (int)n : 0;
	}
	if (rc == 0) {
		rc = ckpt_pickle_load(buf, (size_t)pkl->csize, what, &a->pk);
		if (rc == 0)
			rc = ckpt_torch_state_parse(ckpt_pickle_root(a->pk), what, &a->st);
		if (rc == -EPERM || rc == -EINVAL)
			why = "its data.pkl cannot be read (see above)";
	}
	free(buf);
	const struct ckpt_zip_entry *bo = rc == 0 ? zfind(a, a->prefix, "byteorder") : NULL;
	uint64_t boff;
	char order[8] = { 0 };
	if (bo && bo->csize < sizeof(order) && member_at(a, bo, &boff, &why) == 0 &&
	    frd_read(&a->r, boff, (size_t)bo->csize, order) == (ssize_t)bo->csize) {
		if (strcmp(order, "big") == 0)
			a->big_endian = 1;
		else if (strcmp(order, "little") != 0) {
			why = "an unknown byteorder";
			rc = -EINVAL;
		}
	}
	if (rc < 0 && rc != -ENOMEM)
		ckpt_log(CKPT_LOG_ERR, "%s: not a readable torch.save archive: %s", what,
			 rc == -EINVAL || rc == -EPERM ? why : strerror(-rc));
	return rc;
}

/* Where tensor t's elements lie in the archive: *off (archive offset of the
 * dense block), *len, *order (the block's dimension order). */
static int tensor_at(struct tarch *a, const struct ckpt_torch_tensor *t, int *order, uint64_t *off,
		     uint64_t *len, int *whole, uint32_t *crc, const char **why)
{
	char name[96];
	snprintf(name, sizeof(name), "data/%s", t->storage_key);
	const struct ckpt_zip_entry *e = zfind(a, a->prefix, name);
	if (!e) {
		*why = "its storage member is missing";
		return -EINVAL;
	}
	uint64_t moff, boff, blen;
	int rc = member_at(a, e, &moff, why);
	if (rc)
		return rc;
	if (ckpt_torch_dense(t, order, &boff, &blen)) {
		*why = "its strides make no dense block in any dimension order (a strided or overlapping "
		       "view)";
		return -EINVAL;
	}
	if (boff > e->csize || blen > e->csize - boff) {
		*why = "its elements lie outside its storage member";
		return -EINVAL;
	}
	*off = moff + boff;
	*len = blen;
	/* a tensor that is its whole stored member: the member's CRC-32 is its */
	*whole = e->method == 0 && boff == 0 && blen == e->csize;
	*crc = e->crc32;
	return 0;
}

/* ---- building arrays ----------------------------------------------------------- */

struct build {
	struct ckpt_vitem *vi;
	uint64_t mem_bytes; /* bytes of decompressed zstd items copied into the item */
	const char *what;
	/* the safetensors parts of DCP data files read so far, each parsed once */
	struct st_part *parts;
	size_t nparts;
};

struct st_part {
	char *key; /* the data file */
	uint64_t base; /* where the part starts in it */
	ckpt_st_file *f;
	cJSON *shard; /* its DCP_SHARDING_INFO object, NULL when absent */
};

static void st_part_drop(struct build *b)
{
	for (size_t i = 0; i < b->nparts; i++) {
		free(b->parts[i].key);
		ckpt_st_file_free(b->parts[i].f);
		cJSON_Delete(b->parts[i].shard);
	}
	free(b->parts);
	b->parts = NULL;
	b->nparts = 0;
}

/* A dense block of `len` bytes at off of base_key: the array of `shape`
 * whose elements lie in dimension order `order` (order[0] slowest).
 * member_crc (not NULL): the block is a whole stored ZIP member and this
 * its CRC-32 (checked once the array was read whole). */
static int add_block(struct build *b, const char *const *comps, int depth, ckpt_dtype dt, int rank,
		     const uint64_t *shape, const int *order, int big, ckpt_store *base, const char *base_key,
		     uint64_t off, uint64_t len, const uint32_t *member_crc)
{
	int ident = 1, rev = rank > 1;
	for (int d = 0; d < rank; d++) {
		ident &= order[d] == d;
		rev &= order[d] == rank - 1 - d;
	}
	if (ident || rev) {
		struct ckpt_varray a = { .dtype = dt,
					 .rank = rank,
					 .fortran_order = !ident,
					 .big_endian = big,
					 .codec = CKPT_VCODEC_RAW,
					 .base = base,
					 .base_key = base_key,
					 .offset = off,
					 .length = len,
					 .has_crc32 = member_crc != NULL,
					 .crc32 = member_crc ? *member_crc : 0 };
		memcpy(a.shape, shape, sizeof(uint64_t) * (size_t)rank);
		return ckpt_vitem_add_array(b->vi, comps, depth, &a);
	}
	/* any other order: one cell, its elements in that order */
	struct ckpt_vgrid g = { .dtype = dt, .rank = rank, .big_endian = big, .order = order };
	memcpy(g.shape, shape, sizeof(uint64_t) * (size_t)rank);
	memcpy(g.cell, shape, sizeof(uint64_t) * (size_t)rank);
	uint64_t zero[CKPT_MAX_RANK] = { 0 };
	int rc = len ? ckpt_vitem_cell_range(b->vi, rank, zero, base, base_key, off, len) : 0;
	return rc ? rc : ckpt_vitem_add_grid(b->vi, comps, depth, &g);
}

static int finish(struct build *b, int rc, ckpt_store **item)
{
	st_part_drop(b);
	if (rc < 0) {
		ckpt_vitem_free(b->vi);
		return rc;
	}
	return ckpt_vitem_finish(b->vi, item);
}

/* ---- torch.save files ---------------------------------------------------------- */

static const uint8_t k_legacy_magic[] = { 0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c,
					  0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19 };

static int is_legacy(const uint8_t *head, size_t n)
{
	if (n >= sizeof(k_legacy_magic) && memcmp(head, k_legacy_magic, sizeof(k_legacy_magic)) == 0)
		return 1; /* torch < 1.6: pickles one after another */
	/* the tar format of early torch: members sys_info, pickle, storages, tensors */
	if (n >= 263 && memcmp(head + 257, "ustar", 5) == 0)
		return !strncmp((const char *)head, "sys_info", 9) ||
		       !strncmp((const char *)head, "pickle", 7) ||
		       !strncmp((const char *)head, "storages", 9) ||
		       !strncmp((const char *)head, "tensors", 8);
	return 0;
}

static int torch_probe(ckpt_store *src, const char *key, const struct ckpt_store_stat *st,
		       const uint8_t *head, size_t nhead)
{
	(void)src;
	(void)key;
	if (st->is_dir)
		return 0;
	if (is_legacy(head, nhead))
		return 1;
	if (nhead < 30 || ckpt_le32(head) != 0x04034b50u)
		return 0;
	/* torch.save writes <archive>/data.pkl first */
	size_t nl = (size_t)head[26] | (size_t)head[27] << 8;
	if (30 + nl > nhead || nl < 9 || memcmp(head + 30 + nl - 9, "/data.pkl", 9) != 0)
		return 0;
	return memchr(head + 30, '/', nl - 9) == NULL;
}

static int torch_open(ckpt_store *src, const char *key, const struct ckpt_store_stat *st, ckpt_store **item)
{
	char what[4096];
	snprintf(what, sizeof(what), "%s/%s", src->root, key);
	uint8_t head[300];
	ssize_t hn = ckpt_store_read(src, key, 0, sizeof(head), head);
	if (hn < 0)
		return (int)hn;
	if (is_legacy(head, (size_t)hn)) {
		ckpt_log(
			CKPT_LOG_ERR,
			"%s: a torch.save file in the legacy format of torch before 1.6 (not a ZIP archive); "
			"ckptfs reads only the ZIP format: load and save it again with a newer torch",
			what);
		return -EMEDIUMTYPE;
	}
	struct tarch a = { .r = { src, key, 0, st->size, NULL } };
	int rc = tarch_open(&a, what);
	if (rc < 0) {
		tarch_free(&a);
		return rc == -ENOMEM ? rc : -EIO;
	}
	struct build b = { .what = what };
	if ((rc = ckpt_vitem_new(what, &b.vi)) < 0) {
		tarch_free(&a);
		return rc;
	}
	if (a.st.skipped)
		ckpt_log(CKPT_LOG_INFO, "%s: %zu entries that are not tensors are not shown", what,
			 a.st.skipped);
	for (size_t i = 0; i < a.st.n && rc >= 0; i++) {
		const struct ckpt_torch_tensor *t = &a.st.t[i];
		if (t->depth > CKPT_ORBAX_MAX_DEPTH)
			continue;
		const char *why = NULL;
		int order[CKPT_MAX_RANK];
		uint64_t off, len;
		int whole = 0;
		uint32_t crc = 0;
		rc = tensor_at(&a, t, order, &off, &len, &whole, &crc, &why);
		if (rc == 0)
			rc = add_block(&b, (const char *const *)t->path, t->depth, t->dtype, t->rank,
				       t->shape, order, a.big_endian, src, key, off, len,
				       whole ? &crc : NULL);
		if (rc < 0 && rc != -ENOMEM) {
			ckpt_log(CKPT_LOG_ERR,
				 "%s: tensor %s cannot be served (%s); listed, reads answer EIO", what,
				 t->name, why ? why : strerror(-rc));
			rc = ckpt_vitem_add_unreadable(b.vi, (const char *const *)t->path, t->depth);
		}
	}
	tarch_free(&a);
	return finish(&b, rc, item);
}

const struct ckpt_foreign_fmt ckpt_foreign_torch = {
	.name = "torch",
	.what = "a torch.save file (ZIP format)",
	.probe = torch_probe,
	.open = torch_open,
};

/* ---- distributed checkpoints --------------------------------------------------- */

static int key_join(char *buf, size_t cap, const char *dir, const char *name)
{
	int n = snprintf(buf, cap, "%s%s%s", dir, *dir ? "/" : "", name);
	return n >= 0 && (size_t)n < cap ? 0 : -ENAMETOOLONG;
}

static int dcp_st_probe(ckpt_store *src, const char *key);

static int dcp_probe(ckpt_store *src, const char *key, const struct ckpt_store_stat *st, const uint8_t *head,
		     size_t nhead)
{
	(void)head;
	(void)nhead;
	if (!st->is_dir)
		return 0;
	char k[4096];
	struct ckpt_store_stat ms;
	uint8_t b[2];
	if (key_join(k, sizeof(k), key, DCP_METADATA))
		return 0;
	if (ckpt_store_stat(src, k, &ms) == 0)
		return !ms.is_dir && ckpt_store_read(src, k, 0, 2, b) == 2 && b[0] == 0x80 && b[1] >= 2 &&
		       b[1] <= 5;
	return dcp_st_probe(src, key);
}

/* Decompress a zstd item (bounded). */
static int unzstd(const uint8_t *in, size_t n, uint8_t **out, size_t *outn, const char **why)
{
	ZSTD_DStream *z = ZSTD_createDStream();
	size_t cap = 1 << 16, made = 0;
	uint8_t *buf = malloc(cap);
	if (!z || !buf) {
		ZSTD_freeDStream(z);
		free(buf);
		return -ENOMEM;
	}
	ZSTD_DCtx_setParameter(z, ZSTD_d_windowLogMax, 27);
	ZSTD_inBuffer ib = { in, n, 0 };
	int rc = 0;
	size_t zr = 1;
	while (ib.pos < ib.size || zr != 0) {
		if (made == cap) {
			if (cap >= ZSTD_ITEM_MAX) {
				*why = "a zstd item larger than 256 MiB once decompressed";
				rc = -EINVAL;
				break;
			}
			uint8_t *nb = realloc(buf, cap * 2);
			if (!nb) {
				rc = -ENOMEM;
				break;
			}
			buf = nb;
			cap *= 2;
		}
		ZSTD_outBuffer ob = { buf, cap, made };
		size_t before = ib.pos;
		zr = ZSTD_decompressStream(z, &ob, &ib);
		if (ZSTD_isError(zr)) {
			*why = "bad zstd data";
			rc = -EINVAL;
			break;
		}
		int progress = ob.pos != made || ib.pos != before;
		made = ob.pos;
		if (!progress && ib.pos == ib.size) {
			if (zr != 0) {
				*why = "a zstd item cut short";
				rc = -EINVAL;
			}
			break;
		}
	}
	ZSTD_freeDStream(z);
	if (rc) {
		free(buf);
		return rc;
	}
	*out = buf;
	*outn = made;
	return 0;
}

#define MAX_RUNS_PER_CELL 65536u

/* The grid cells of box c (cell shape g) as cells of the item's next
 * array (ckpt_vitem_cell_*): each cell's bytes are one range, or several (a
 * cell narrower than its box), of the box's C-order elements, which lie at
 * `at` in fkey of src, or in plain[at...] when the item was decompressed. */
static int put_cells(struct build *b, ckpt_store *src, const char *fkey, const uint8_t *plain, uint64_t at,
		     const struct ckpt_dcp_entry *e, const struct ckpt_dcp_chunk *c, const uint64_t *g,
		     const char **why)
{
	int r = e->rank;
	uint64_t isz = ckpt_dtype_get(e->dtype)->itemsize;
	uint64_t m[CKPT_MAX_RANK], q[CKPT_MAX_RANK] = { 0 }, bs[CKPT_MAX_RANK + 1];
	uint64_t cells = 1;
	/* bs[d]: elements between neighbours along d in the box's C order */
	bs[r] = 1;
	for (int d = r - 1; d >= 0; d--)
		bs[d] = d + 1 < r ? bs[d + 1] * c->sizes[d + 1] : 1;
	for (int d = 0; d < r; d++) {
		m[d] = c->sizes[d] / g[d];
		cells *= m[d];
	}
	if (cells == 0)
		return 0;
	/* j: the dims from j on are whole in a cell; runs are contiguous over
	 * dims j-1.. and there are prod(g[0..j-2]) of them per cell */
	int j = r;
	while (j > 0 && g[j - 1] == c->sizes[j - 1])
		j--;
	uint64_t run = j == 0 ? (r ? c->sizes[0] * bs[0] : 1) : g[j - 1] * bs[j - 1], nruns = 1;
	for (int d = 0; d + 1 < j; d++)
		nruns *= g[d];
	if (nruns > MAX_RUNS_PER_CELL) {
		*why = "its chunk boxes make grid cells of too many pieces";
		return -EINVAL;
	}
	uint64_t *pieces = malloc(2 * nruns * sizeof(*pieces));
	size_t cellbytes = (size_t)(run * isz * nruns);
	uint8_t *copy = plain && nruns > 1 ? malloc(cellbytes ? cellbytes : 1) : NULL;
	if (!pieces || (plain && nruns > 1 && !copy)) {
		free(pieces);
		free(copy);
		return -ENOMEM;
	}
	int rc = 0;
	for (;;) {
		uint64_t coord[CKPT_MAX_RANK], start[CKPT_MAX_RANK];
		for (int d = 0; d < r; d++) {
			start[d] = q[d] * g[d];
			coord[d] = c->offsets[d] / g[d] + q[d];
		}
		/* every run of the cell: an odometer over dims 0..j-2 inside the cell */
		uint64_t w[CKPT_MAX_RANK] = { 0 };
		for (uint64_t k = 0; k < nruns; k++) {
			uint64_t el = 0;
			for (int d = 0; d < r; d++)
				el += (start[d] + (d + 1 < j ? w[d] : 0)) * bs[d];
			pieces[2 * k] = at + el * isz;
			pieces[2 * k + 1] = run * isz;
			for (int d = j - 2; d >= 0; d--) {
				if (++w[d] < g[d])
					break;
				w[d] = 0;
			}
		}
		if (plain) {
			uint64_t total = run * isz * nruns;
			if (b->mem_bytes + total > ZSTD_TOTAL_MAX) {
				*why = "more than 1 GiB of zstd-compressed chunks";
				rc = -EINVAL;
			} else {
				b->mem_bytes += total;
				if (nruns == 1) {
					rc = ckpt_vitem_cell_bytes(b->vi, r, coord, plain + pieces[0],
								   (size_t)pieces[1]);
				} else {
					for (uint64_t k = 0; k < nruns; k++)
						memcpy(copy + k * run * isz, plain + pieces[2 * k],
						       (size_t)pieces[2 * k + 1]);
					rc = ckpt_vitem_cell_bytes(b->vi, r, coord, copy, (size_t)total);
				}
			}
		} else if (nruns == 1) {
			rc = ckpt_vitem_cell_range(b->vi, r, coord, src, fkey, pieces[0], pieces[1]);
		} else {
			rc = ckpt_vitem_cell_pieces(b->vi, r, coord, src, fkey, pieces, (size_t)nruns);
		}
		if (rc)
			break;
		int d = r - 1;
		while (d >= 0 && ++q[d] == m[d])
			q[d--] = 0;
		if (d < 0)
			break;
	}
	free(pieces);
	free(copy);
	return rc;
}

static int st_head_ok(const uint8_t *head, size_t nhead, uint64_t size);

/* The safetensors part of data file fkey (fsize bytes) that starts at base:
 * what DCP writes with its safetensors serialization, where a data file is
 * its bytes items followed by one safetensors file holding every tensor
 * chunk of the file under its fqn, and each chunk's storage entry points at
 * the start of that part.  Parsed once per data file (kept in b->parts). */
static int st_part_load(struct build *b, ckpt_store *src, const char *fkey, uint64_t base, uint64_t fsize,
			const struct st_part **out, const char **why)
{
	for (size_t i = 0; i < b->nparts; i++)
		if (b->parts[i].base == base && !strcmp(b->parts[i].key, fkey)) {
			*out = &b->parts[i];
			if (!b->parts[i].f) /* refused before, and logged then */
				*why = "its safetensors header is malformed";
			return b->parts[i].f ? 0 : -EINVAL;
		}
	char what[8400];
	snprintf(what, sizeof(what), "%s: safetensors data of %s", b->what, fkey);
	uint8_t h8[8];
	uint64_t n = 0;
	ckpt_st_file *f = NULL;
	int rc = 0;
	if (ckpt_store_read(src, fkey, base, 8, h8) != 8) {
		*why = "its item cannot be read";
		rc = -EINVAL;
	} else if (ckpt_st_header_len(h8, fsize - base, what, &n)) {
		*why = "its safetensors header length does not fit its data file";
		rc = -EINVAL;
	} else {
		char *json = malloc((size_t)n + 1);
		if (!json)
			return -ENOMEM;
		ssize_t got = ckpt_store_read(src, fkey, base + 8, (size_t)n, json);
		rc = got == (ssize_t)n ? ckpt_st_parse(json, (size_t)n, fsize - base, what, &f) : -EIO;
		free(json);
		if (rc == -ENOMEM)
			return rc;
		if (rc) {
			*why = rc == -EIO ? "its safetensors header cannot be read"
					  : "its safetensors header is malformed";
			rc = -EINVAL;
		}
	}
	/* kept, refused ones too (f NULL), so other chunks of the file neither
	 * read it again nor log again */
	struct st_part *np = realloc(b->parts, (b->nparts + 1) * sizeof(*np));
	char *k = strdup(fkey);
	if (np)
		b->parts = np;
	if (!np || !k) {
		free(k);
		ckpt_st_file_free(f);
		return -ENOMEM;
	}
	struct st_part *p = &b->parts[b->nparts++];
	*p = (struct st_part){ .key = k, .base = base, .f = f };
	*out = p;
	if (rc)
		return rc;
	if (f->metadata_json) {
		cJSON *m = cJSON_Parse(f->metadata_json);
		const cJSON *si = cJSON_GetObjectItemCaseSensitive(m, "DCP_SHARDING_INFO");
		if (cJSON_IsString(si))
			p->shard = cJSON_Parse(si->valuestring);
		cJSON_Delete(m);
	}
	*out = p;
	return 0;
}

/* One chunk box of a DCP tensor kept in the safetensors part of its data file. */
static int dcp_chunk_st(struct build *b, ckpt_store *src, const char *fkey, uint64_t fsize,
			const struct ckpt_dcp_entry *e, const struct ckpt_dcp_chunk *c, const uint64_t *g,
			const char **why)
{
	const struct st_part *p = NULL;
	int rc = st_part_load(b, src, fkey, c->offset, fsize, &p, why);
	if (rc)
		return rc;
	const ckpt_st_entry *t = NULL;
	for (size_t i = 0; i < p->f->n && !t; i++)
		if (!strcmp(p->f->t[i].name, e->fqn))
			t = &p->f->t[i];
	if (!t) {
		*why = "the safetensors data of its data file holds no tensor of that name";
		return -EINVAL;
	}
	int same = t->dtype == e->dtype && t->rank == e->rank;
	for (int d = 0; same && d < t->rank; d++)
		same = t->shape[d] == c->sizes[d];
	if (!same) {
		*why = "its safetensors tensor differs in dtype or shape from the chunk box";
		return -EINVAL;
	}
	/* the file's own record of where the shard lies must agree with .metadata */
	const cJSON *so = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(p->shard, e->fqn),
							   "saved_offsets");
	if (so) {
		int ok = cJSON_IsArray(so) && cJSON_GetArraySize(so) == e->rank;
		for (int d = 0; ok && d < e->rank; d++) {
			const cJSON *v = cJSON_GetArrayItem(so, d);
			ok = cJSON_IsNumber(v) && v->valuedouble >= 0 &&
			     v->valuedouble < 9007199254740992.0 && (uint64_t)v->valuedouble == c->offsets[d];
		}
		if (!ok) {
			*why = "the saved_offsets of its safetensors data differ from its chunk box";
			return -EINVAL;
		}
	}
	if (t->end == t->begin)
		return 0;
	return put_cells(b, src, fkey, NULL, c->offset + t->begin, e, c, g, why);
}

/* One chunk box of a DCP tensor: locate the tensor in its item, put its cells. */
static int dcp_chunk(struct build *b, ckpt_store *src, const char *dir, const struct ckpt_dcp_entry *e,
		     const struct ckpt_dcp_chunk *c, const uint64_t *g, int *big, const char **why)
{
	char fkey[4096];
	if (strchr(c->file, '/') || strcmp(c->file, ".") == 0 || strcmp(c->file, "..") == 0 ||
	    key_join(fkey, sizeof(fkey), dir, c->file)) {
		*why = "a data file name that is not a plain file name";
		return -EINVAL;
	}
	struct ckpt_store_stat fs;
	int rc = ckpt_store_stat(src, fkey, &fs);
	if (rc < 0 || fs.is_dir) {
		*why = "its data file is missing";
		return -EINVAL;
	}
	if (c->offset > fs.size || c->length > fs.size - c->offset) {
		*why = "its item lies beyond the end of its data file";
		return -EINVAL;
	}
	if (c->transform == CKPT_DCP_RAW && c->length >= 1) {
		uint8_t h[10];
		ssize_t hn = ckpt_store_read(src, fkey, c->offset, sizeof(h), h);
		if (hn == (ssize_t)sizeof(h) && memcmp(h, "PK\x03\x04", 4) != 0 &&
		    st_head_ok(h, sizeof(h), fs.size - c->offset)) {
			*big = 0;
			return dcp_chunk_st(b, src, fkey, fs.size, e, c, g, why);
		}
	}
	uint8_t *plain = NULL;
	struct tarch a = { .r = { src, fkey, c->offset, c->length, NULL } };
	if (c->transform == CKPT_DCP_ZSTD) {
		uint8_t *z = malloc(c->length ? (size_t)c->length : 1);
		size_t pn = 0;
		if (!z)
			return -ENOMEM;
		ssize_t got = c->length > ZSTD_ITEM_MAX
				      ? -EFBIG
				      : ckpt_store_read(src, fkey, c->offset, (size_t)c->length, z);
		if (got >= 0 && (uint64_t)got == c->length)
			rc = unzstd(z, (size_t)got, &plain, &pn, why);
		else {
			*why = got == -EFBIG ? "a zstd item larger than 256 MiB" : "its item cannot be read";
			rc = got < 0 && got != -EFBIG ? (int)got : -EINVAL;
		}
		free(z);
		if (rc)
			return rc;
		a.r = (struct frd){ NULL, NULL, 0, pn, plain };
	}
	char what[512];
	snprintf(what, sizeof(what), "%s: chunk item of %s in %s", b->what, e->fqn, c->file);
	rc = tarch_open(&a, what);
	int order[CKPT_MAX_RANK];
	uint64_t off = 0, len = 0;
	if (rc == 0 && a.st.n != 1) {
		*why = "its item holds no single tensor";
		rc = -EINVAL;
	}
	const struct ckpt_torch_tensor *t = rc == 0 ? &a.st.t[0] : NULL;
	if (t) {
		int same = t->dtype == e->dtype && t->rank == e->rank;
		for (int d = 0; same && d < t->rank; d++)
			same = t->shape[d] == c->sizes[d];
		if (!same) {
			*why = "its item's tensor differs in dtype or shape from the chunk box";
			rc = -EINVAL;
		}
	}
	int whole_member = 0; /* a DCP cell is served in pieces: its member's CRC is not checked */
	uint32_t member_crc = 0;
	if (rc == 0 && (rc = tensor_at(&a, t, order, &off, &len, &whole_member, &member_crc, why)) == 0) {
		for (int d = 0; d < t->rank && rc == 0; d++)
			if (order[d] != d && t->shape[d] > 1) {
				*why = "its item's tensor is not in C order";
				rc = -EINVAL;
			}
	}
	*big = a.big_endian;
	if (rc == 0 && len)
		rc = put_cells(b, src, fkey, plain, plain ? off : c->offset + off, e, c, g, why);
	tarch_free(&a);
	free(plain);
	if (rc == -EIO || rc == -EPERM)
		*why = *why ? *why : "its item cannot be read";
	return rc;
}

static int dcp_tensor(struct build *b, ckpt_store *src, const char *dir, const struct ckpt_dcp_entry *e,
		      const char *const *comps, int depth, const char **why)
{
	uint64_t g[CKPT_MAX_RANK];
	int rc = ckpt_dcp_cells(e, g);
	if (rc) {
		*why = rc == -ENOMEM ? NULL : "its chunk boxes do not tile the tensor (gaps or overlaps)";
		return rc;
	}
	int big = -1;
	for (size_t i = 0; i < e->nchunks && rc == 0; i++) {
		int cbig = 0;
		rc = dcp_chunk(b, src, dir, e, &e->chunks[i], g, &cbig, why);
		if (rc == 0 && big >= 0 && cbig != big) {
			*why = "its chunks differ in byte order";
			rc = -EINVAL;
		}
		big = cbig;
	}
	if (rc)
		return rc;
	struct ckpt_vgrid grid = { .dtype = e->dtype, .rank = e->rank, .big_endian = big > 0 };
	memcpy(grid.shape, e->size, sizeof(uint64_t) * (size_t)e->rank);
	memcpy(grid.cell, g, sizeof(uint64_t) * (size_t)e->rank);
	return ckpt_vitem_add_grid(b->vi, comps, depth, &grid);
}

/* ---- sharded safetensors folders without .metadata ---- */

/* The Hugging Face storage writer of torch.distributed.checkpoint, saving
 * sharded, writes no .metadata and no index: each rank writes its shards as
 * safetensors files (shard-<rank>-model-<i>-of-<n>.safetensors) whose
 * DCP_SHARDING_INFO metadata gives every shard's saved_offsets.  The global
 * size is then the far corner of the boxes. */
#define ST_SUFFIX ".safetensors"
#define SHARDING_KEY "\"DCP_SHARDING_INFO\""
#define ST_SHARD_MAX 100000u /* shard files of one folder */

struct st_names {
	char **v;
	size_t n;
	int oom;
	int first_only; /* the probe: stop at the first one */
};

static int st_names_cb(void *ctx, const char *name, const struct ckpt_store_stat *st)
{
	struct st_names *l = ctx;
	size_t n = strlen(name), k = strlen(ST_SUFFIX);
	if (st->is_dir || n <= k || strcmp(name + n - k, ST_SUFFIX) != 0)
		return 0;
	if (l->n >= ST_SHARD_MAX)
		return 1;
	char **nv = realloc(l->v, (l->n + 1) * sizeof(*nv));
	char *c = strdup(name);
	if (nv)
		l->v = nv;
	if (!nv || !c) {
		free(c);
		l->oom = 1;
		return 1;
	}
	l->v[l->n++] = c;
	return l->first_only;
}

static void st_names_free(struct st_names *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->v[i]);
	free(l->v);
}

static int by_str(const void *x, const void *y)
{
	return strcmp(*(char *const *)x, *(char *const *)y);
}

/* A folder without .metadata and without a safetensors index whose first
 * safetensors file names DCP_SHARDING_INFO in the first 64 KiB of its header. */
static int dcp_st_probe(ckpt_store *src, const char *key)
{
	char k[4096];
	struct ckpt_store_stat is;
	if (key_join(k, sizeof(k), key, ST_INDEX) || ckpt_store_stat(src, k, &is) == 0)
		return 0;
	struct st_names l = { .first_only = 1 };
	int found = 0;
	if (ckpt_store_listdir(src, key, st_names_cb, &l) >= 0 && l.n == 1 &&
	    key_join(k, sizeof(k), key, l.v[0]) == 0) {
		size_t cap = 8 + 65536, kl = strlen(SHARDING_KEY);
		uint8_t *buf = malloc(cap);
		ssize_t got = buf ? ckpt_store_read(src, k, 0, cap, buf) : -ENOMEM;
		if (got >= 10 && st_head_ok(buf, (size_t)got, UINT64_MAX)) {
			uint64_t n = 0;
			for (int i = 7; i >= 0; i--)
				n = n << 8 | buf[i];
			size_t end = (size_t)got < 8 + n ? (size_t)got : (size_t)(8 + n);
			for (size_t i = 8; i + kl <= end && !found; i++)
				found = buf[i] == '"' && memcmp(buf + i, SHARDING_KEY, kl) == 0;
		}
		free(buf);
	}
	st_names_free(&l);
	return found;
}

/* The entry of fqn in md (a new one when absent). */
static struct ckpt_dcp_entry *st_entry(struct ckpt_dcp_meta *md, size_t *cap, const char *fqn)
{
	for (size_t i = 0; i < md->n; i++)
		if (!strcmp(md->e[i].fqn, fqn))
			return &md->e[i];
	if (md->n == *cap) {
		size_t nc = *cap ? *cap * 2 : 16;
		struct ckpt_dcp_entry *ne = realloc(md->e, nc * sizeof(*ne));
		if (!ne)
			return NULL;
		md->e = ne;
		*cap = nc;
	}
	struct ckpt_dcp_entry *e = &md->e[md->n];
	memset(e, 0, sizeof(*e));
	if (!(e->fqn = strdup(fqn)))
		return NULL;
	md->n++;
	e->rank = -1;
	return e;
}

/* One shard file's tensors as chunks of md's entries; *bad gets 1 for an
 * entry whose shards disagree (dtype, rank, saved_offsets). */
static int st_shards_of(struct build *b, ckpt_store *src, const char *fkey, const char *fname,
			struct ckpt_dcp_meta *md, size_t *cap, uint8_t **bad, size_t *badcap)
{
	struct ckpt_store_stat fs;
	const struct st_part *p = NULL;
	const char *why = NULL;
	int rc = ckpt_store_stat(src, fkey, &fs);
	if (rc < 0 || fs.is_dir) {
		ckpt_log(CKPT_LOG_ERR, "%s: %s cannot be read", b->what, fname);
		return -EIO;
	}
	if ((rc = st_part_load(b, src, fkey, 0, fs.size, &p, &why))) {
		if (rc != -ENOMEM)
			ckpt_log(CKPT_LOG_ERR, "%s: %s: %s", b->what, fname, why ? why : strerror(-rc));
		return rc == -ENOMEM ? rc : -EIO;
	}
	for (size_t i = 0; i < p->f->n; i++) {
		const ckpt_st_entry *t = &p->f->t[i];
		struct ckpt_dcp_entry *e = st_entry(md, cap, t->name);
		if (!e)
			return -ENOMEM;
		size_t ei = (size_t)(e - md->e);
		if (md->n > *badcap) {
			uint8_t *nb = realloc(*bad, *cap);
			if (!nb)
				return -ENOMEM;
			memset(nb + *badcap, 0, *cap - *badcap);
			*bad = nb;
			*badcap = *cap;
		}
		if (e->rank < 0) {
			e->rank = t->rank;
			e->dtype = t->dtype;
		}
		uint64_t off[CKPT_MAX_RANK] = { 0 };
		const cJSON *so = cJSON_GetObjectItemCaseSensitive(
			cJSON_GetObjectItemCaseSensitive(p->shard, t->name), "saved_offsets");
		int ok = e->rank == t->rank && e->dtype == t->dtype &&
			 (!so || (cJSON_IsArray(so) && cJSON_GetArraySize(so) == t->rank));
		for (int d = 0; ok && so && d < t->rank; d++) {
			const cJSON *v = cJSON_GetArrayItem(so, d);
			ok = cJSON_IsNumber(v) && v->valuedouble >= 0 &&
			     v->valuedouble < 9007199254740992.0 &&
			     (double)(uint64_t)v->valuedouble == v->valuedouble;
			off[d] = ok ? (uint64_t)v->valuedouble : 0;
			ok = ok && off[d] <= UINT64_MAX / 2 && t->shape[d] <= UINT64_MAX / 2;
		}
		if (!ok || e->nchunks >= CKPT_PK_MAX_ITEMS) {
			(*bad)[ei] = 1;
			continue;
		}
		struct ckpt_dcp_chunk *nc = realloc(e->chunks, (e->nchunks + 1) * sizeof(*nc));
		if (!nc)
			return -ENOMEM;
		e->chunks = nc;
		struct ckpt_dcp_chunk *c = &e->chunks[e->nchunks];
		memset(c, 0, sizeof(*c));
		if (!(c->file = strdup(fname)))
			return -ENOMEM;
		e->nchunks++;
		c->length = t->end - t->begin;
		for (int d = 0; d < t->rank; d++) {
			c->offsets[d] = off[d];
			c->sizes[d] = t->shape[d];
			if (off[d] + t->shape[d] > e->size[d])
				e->size[d] = off[d] + t->shape[d];
		}
	}
	return 0;
}

/* Every entry of md into b.  A tensor whose name cannot be a path is left
 * out (logged); one that cannot be served (dcp_tensor fails, or bad[i] is
 * set: its shards disagree) is listed and its reads answer EIO; bytes
 * entries are not shown (counted in one log line).  0 or -ENOMEM. */
static int dcp_add_tensors(struct build *b, ckpt_store *src, const char *key, const struct ckpt_dcp_meta *md,
			   const uint8_t *bad, size_t badcap)
{
	int rc = 0;
	size_t nbytes = 0;
	for (size_t i = 0; i < md->n && rc >= 0; i++) {
		const struct ckpt_dcp_entry *e = &md->e[i];
		if (e->is_bytes) {
			nbytes++;
			continue;
		}
		char buf[4096];
		const char *comps[CKPT_TORCH_MAX_PATH];
		int depth = ckpt_torch_key_split(e->fqn, buf, sizeof(buf), comps, CKPT_TORCH_MAX_PATH);
		if (depth < 0) {
			ckpt_log(CKPT_LOG_WARN, "%s: tensor name '%.200s' cannot be a path, not shown",
				 b->what, e->fqn);
			continue;
		}
		const char *why = NULL;
		if (i < badcap && bad[i]) {
			why = "its shards differ in dtype or rank, or a saved_offsets is malformed";
			rc = -EINVAL;
		} else {
			rc = dcp_tensor(b, src, key, e, comps, depth, &why);
		}
		if (rc < 0 && rc != -ENOMEM) {
			ckpt_log(CKPT_LOG_ERR,
				 "%s: tensor %s cannot be served (%s); listed, reads answer EIO", b->what,
				 e->fqn, why ? why : strerror(-rc));
			rc = ckpt_vitem_add_unreadable(b->vi, comps, depth);
		}
	}
	if (nbytes)
		ckpt_log(CKPT_LOG_INFO, "%s: %zu non-tensor (bytes) entries are not shown", b->what, nbytes);
	return rc;
}

static int dcp_st_open(ckpt_store *src, const char *key, const char *what, ckpt_store **item)
{
	struct st_names l = { 0 };
	int rc = ckpt_store_listdir(src, key, st_names_cb, &l);
	if (rc < 0 || l.oom) {
		st_names_free(&l);
		ckpt_log(CKPT_LOG_ERR, "%s: cannot be listed (%s)", what, strerror(rc < 0 ? -rc : ENOMEM));
		return rc < 0 ? -EIO : -ENOMEM;
	}
	qsort(l.v, l.n, sizeof(*l.v), by_str);
	struct build b = { .what = what };
	if ((rc = ckpt_vitem_new(what, &b.vi)) < 0) {
		st_names_free(&l);
		return rc;
	}
	struct ckpt_dcp_meta md = { 0 };
	size_t cap = 0, badcap = 0;
	uint8_t *bad = NULL;
	for (size_t i = 0; i < l.n && rc >= 0; i++) {
		char k[4096];
		rc = key_join(k, sizeof(k), key, l.v[i]);
		if (rc == 0)
			rc = st_shards_of(&b, src, k, l.v[i], &md, &cap, &bad, &badcap);
	}
	if (rc >= 0)
		rc = dcp_add_tensors(&b, src, key, &md, bad, badcap);
	free(bad);
	ckpt_dcp_meta_free(&md);
	st_names_free(&l);
	return finish(&b, rc, item);
}

static int dcp_open(ckpt_store *src, const char *key, const struct ckpt_store_stat *st, ckpt_store **item)
{
	(void)st;
	char what[4096], mk[4096];
	snprintf(what, sizeof(what), "%s%s%s", src->root, *key ? "/" : "", key);
	int rc = key_join(mk, sizeof(mk), key, DCP_METADATA);
	char *txt = NULL;
	size_t len = 0;
	struct ckpt_store_stat ms;
	if (rc == 0 && ckpt_store_stat(src, mk, &ms) == -ENOENT)
		return dcp_st_open(src, key, what, item);
	if (rc == 0)
		rc = ckpt_store_read_small(src, mk, PICKLE_MAX, &txt, &len);
	if (rc < 0) {
		ckpt_log(CKPT_LOG_ERR, "%s/" DCP_METADATA ": cannot be read (%s)", what, strerror(-rc));
		return -EIO;
	}
	char mwhat[4200];
	snprintf(mwhat, sizeof(mwhat), "%s/" DCP_METADATA, what);
	ckpt_pickle *pk = NULL;
	struct ckpt_dcp_meta md = { 0 };
	rc = ckpt_pickle_load(txt, len, mwhat, &pk);
	free(txt);
	if (rc == 0)
		rc = ckpt_dcp_meta_parse(ckpt_pickle_root(pk), mwhat, &md);
	ckpt_pickle_free(pk);
	if (rc < 0)
		return rc == -ENOMEM ? rc : -EIO;
	struct build b = { .what = what };
	if ((rc = ckpt_vitem_new(what, &b.vi)) < 0) {
		ckpt_dcp_meta_free(&md);
		return rc;
	}
	rc = dcp_add_tensors(&b, src, key, &md, NULL, 0);
	ckpt_dcp_meta_free(&md);
	return finish(&b, rc, item);
}

const struct ckpt_foreign_fmt ckpt_foreign_dcp = {
	.name = "torch-dcp",
	.what = "a PyTorch distributed checkpoint folder (.metadata, or sharded safetensors files with "
		"DCP_SHARDING_INFO)",
	.probe = dcp_probe,
	.open = dcp_open,
};

/* ---- safetensors ------------------------------------------------------------------- */

static int st_head_ok(const uint8_t *head, size_t nhead, uint64_t size)
{
	if (nhead < 10 || size < 10)
		return 0;
	uint64_t n = 0;
	for (int i = 7; i >= 0; i--)
		n = n << 8 | head[i];
	return n >= 2 && n <= CKPT_ST_MAX_HEADER && n <= size - 8 && head[8] == '{' &&
	       (head[9] == '"' || head[9] == '}');
}

/* Every tensor of safetensors file fkey into b. */
static int st_add_file(struct build *b, ckpt_store *src, const char *fkey, uint64_t size, const char *what)
{
	uint8_t h8[8];
	uint64_t n = 0;
	ssize_t got = ckpt_store_read(src, fkey, 0, 8, h8);
	if (got != 8) {
		ckpt_log(CKPT_LOG_ERR, "%s: cannot read its header", what);
		return -EIO;
	}
	int rc = ckpt_st_header_len(h8, size, what, &n);
	if (rc)
		return -EIO;
	char *json = malloc((size_t)n + 1);
	if (!json)
		return -ENOMEM;
	got = ckpt_store_read(src, fkey, 8, (size_t)n, json);
	ckpt_st_file *f = NULL;
	rc = got == (ssize_t)n ? ckpt_st_parse(json, (size_t)n, size, what, &f) : -EIO;
	free(json);
	if (rc < 0)
		return rc == -ENOMEM ? rc : -EIO;
	for (size_t i = 0; i < f->n && rc >= 0; i++) {
		const ckpt_st_entry *t = &f->t[i];
		char buf[4096];
		const char *comps[CKPT_TORCH_MAX_PATH];
		int depth = ckpt_torch_key_split(t->name, buf, sizeof(buf), comps, CKPT_TORCH_MAX_PATH);
		if (depth < 0) {
			ckpt_log(CKPT_LOG_WARN, "%s: tensor name '%.200s' cannot be a path, not shown", what,
				 t->name);
			continue;
		}
		int order[CKPT_MAX_RANK];
		for (int d = 0; d < t->rank; d++)
			order[d] = d;
		rc = add_block(b, comps, depth, t->dtype, t->rank, t->shape, order, 0, src, fkey, t->begin,
			       t->end - t->begin, NULL);
		if (rc < 0 && rc != -ENOMEM) {
			ckpt_log(CKPT_LOG_ERR,
				 "%s: tensor %s cannot be served (%s); listed, reads answer EIO", what,
				 t->name, strerror(-rc));
			rc = ckpt_vitem_add_unreadable(b->vi, comps, depth);
		}
	}
	ckpt_st_file_free(f);
	return rc;
}

static int st_file_probe(ckpt_store *src, const char *key, const struct ckpt_store_stat *st,
			 const uint8_t *head, size_t nhead)
{
	(void)src;
	(void)key;
	return !st->is_dir && st_head_ok(head, nhead, st->size);
}

static int st_file_open(ckpt_store *src, const char *key, const struct ckpt_store_stat *st, ckpt_store **item)
{
	char what[4096];
	snprintf(what, sizeof(what), "%s/%s", src->root, key);
	struct build b = { .what = what };
	int rc = ckpt_vitem_new(what, &b.vi);
	if (rc < 0)
		return rc;
	rc = st_add_file(&b, src, key, st->size, what);
	return finish(&b, rc, item);
}

const struct ckpt_foreign_fmt ckpt_foreign_safetensors = {
	.name = "safetensors",
	.what = "a safetensors file",
	.probe = st_file_probe,
	.open = st_file_open,
};

static int st_dir_probe(ckpt_store *src, const char *key, const struct ckpt_store_stat *st,
			const uint8_t *head, size_t nhead)
{
	(void)head;
	(void)nhead;
	char k[4096];
	struct ckpt_store_stat is;
	return st->is_dir && key_join(k, sizeof(k), key, ST_INDEX) == 0 &&
	       ckpt_store_stat(src, k, &is) == 0 && !is.is_dir;
}

static int st_dir_open(ckpt_store *src, const char *key, const struct ckpt_store_stat *st, ckpt_store **item)
{
	(void)st;
	char what[4096], k[4096];
	snprintf(what, sizeof(what), "%s%s%s", src->root, *key ? "/" : "", key);
	char *txt = NULL;
	size_t len = 0;
	int rc = key_join(k, sizeof(k), key, ST_INDEX);
	if (rc == 0)
		rc = ckpt_store_read_small(src, k, INDEX_MAX, &txt, &len);
	cJSON *idx = rc == 0 ? cJSON_ParseWithLength(txt, len) : NULL;
	free(txt);
	const cJSON *wm = cJSON_GetObjectItemCaseSensitive(idx, "weight_map");
	if (!cJSON_IsObject(wm)) {
		ckpt_log(CKPT_LOG_ERR, "%s/" ST_INDEX ": %s", what,
			 rc < 0 ? strerror(-rc) : "no weight_map object");
		cJSON_Delete(idx);
		return -EIO;
	}
	struct build b = { .what = what };
	if ((rc = ckpt_vitem_new(what, &b.vi)) < 0) {
		cJSON_Delete(idx);
		return rc;
	}
	/* each shard file once, in the order the map first names it */
	const cJSON **files = calloc((size_t)cJSON_GetArraySize(wm) + 1, sizeof(*files));
	size_t nf = 0;
	if (!files)
		rc = -ENOMEM;
	for (const cJSON *e = wm->child; e && rc == 0; e = e->next) {
		if (!cJSON_IsString(e) || strchr(e->valuestring, '/') || !strcmp(e->valuestring, "..") ||
		    !strcmp(e->valuestring, ".") || !*e->valuestring) {
			ckpt_log(CKPT_LOG_ERR, "%s/" ST_INDEX ": tensor %.200s names no file of the folder",
				 what, e->string);
			rc = -EIO;
			break;
		}
		size_t j = 0;
		while (j < nf && strcmp(files[j]->valuestring, e->valuestring))
			j++;
		if (j == nf)
			files[nf++] = e;
	}
	for (size_t j = 0; j < nf && rc >= 0; j++) {
		struct ckpt_store_stat fs;
		char fwhat[8300];
		if ((rc = key_join(k, sizeof(k), key, files[j]->valuestring)) < 0)
			break;
		snprintf(fwhat, sizeof(fwhat), "%s/%s", what, files[j]->valuestring);
		if ((rc = ckpt_store_stat(src, k, &fs)) < 0 || fs.is_dir) {
			ckpt_log(CKPT_LOG_ERR, "%s: missing shard of " ST_INDEX, fwhat);
			rc = -EIO;
			break;
		}
		rc = st_add_file(&b, src, k, fs.size, fwhat);
	}
	free(files);
	cJSON_Delete(idx);
	return finish(&b, rc, item);
}

const struct ckpt_foreign_fmt ckpt_foreign_safetensors_dir = {
	.name = "safetensors",
	.what = "a folder of safetensors shards with " ST_INDEX,
	.probe = st_dir_probe,
	.open = st_dir_open,
};
