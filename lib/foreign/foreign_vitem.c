/*
 * foreign_vitem.c - the virtual-item builder of foreign.h, which the
 * translators (foreign_*.c) call.
 * A virtual item is a memory store:
 *   _METADATA        tree_metadata with every leaf's key path; value_metadata
 *                    names the leaf's store key (CKPT_VITEM_KEY_MEMBER);
 *   _strings.json    string leaves, by that key;
 *   a/<i>/.zarray    leaf i's synthesized zarr v2 metadata (literal; zarr.json,
 *                    v3, for a grid in a permuted order);
 *   a/<i>/<chunk>    its chunks: byte ranges (or pieces) of the original file,
 *                    or bytes given (a grid's cells of decompressed items);
 *   a/<i>/...        or, for an array kept as a zarr folder, that folder.
 */
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "foreign.h"
#include "orbax.h"
#include "zarr_meta.h"

/* ---- the builder ------------------------------------------------------------ */

#define CHUNK_TARGET (8u << 20) /* raw arrays: chunks of about this many bytes */
/* zero-padded: leaves are added in key order, so each insert appends */
#define KEY_FMT "a/%010zu"

struct ckpt_vitem {
	ckpt_store *mem;
	cJSON *tree; /* tree_metadata */
	cJSON *strings; /* _strings.json */
	size_t n; /* leaves */
	int oom;
};

int ckpt_vitem_new(const char *name, struct ckpt_vitem **out)
{
	*out = NULL;
	struct ckpt_vitem *vi = calloc(1, sizeof(*vi));
	if (!vi)
		return -ENOMEM;
	int rc = ckpt_store_mem_open(name, &vi->mem);
	vi->tree = cJSON_CreateObject();
	vi->strings = cJSON_CreateObject();
	if (rc < 0 || !vi->tree || !vi->strings) {
		ckpt_vitem_free(vi);
		return rc < 0 ? rc : -ENOMEM;
	}
	*out = vi;
	return 0;
}

void ckpt_vitem_free(struct ckpt_vitem *vi)
{
	if (!vi)
		return;
	ckpt_store_destroy(vi->mem);
	cJSON_Delete(vi->tree);
	cJSON_Delete(vi->strings);
	free(vi);
}

size_t ckpt_vitem_leaves(const struct ckpt_vitem *vi)
{
	return vi->n;
}

/* Record leaf vi->n (its key path, value type and store key) in the tree. */
static int add_leaf(struct ckpt_vitem *vi, const char *const *path, int depth, const char *type,
		    const char *skey, int all_stored)
{
	if (depth < 1 || depth > CKPT_ORBAX_MAX_DEPTH)
		return -EINVAL;
	if (vi->n >= CKPT_VITEM_MAX_LEAVES) {
		ckpt_log(CKPT_LOG_ERR, "%s: more than %u leaves: not shown", vi->mem->root,
			 (unsigned)CKPT_VITEM_MAX_LEAVES);
		return -EFBIG;
	}
	cJSON *leaf = cJSON_CreateObject(), *keys = cJSON_CreateArray(), *vm = cJSON_CreateObject();
	int bad = !leaf || !keys || !vm;
	for (int i = 0; i < depth && !bad; i++) {
		cJSON *k = cJSON_CreateObject();
		bad = !k || !cJSON_AddStringToObject(k, "key", path[i]) || !cJSON_AddItemToArray(keys, k);
		if (!k)
			break;
	}
	if (!bad)
		bad = !cJSON_AddStringToObject(vm, "value_type", type) ||
		      (skey && !cJSON_AddStringToObject(vm, CKPT_VITEM_KEY_MEMBER, skey)) ||
		      (all_stored >= 0 && !cJSON_AddBoolToObject(vm, "ckptfs_all_stored", all_stored));
	char name[32];
	snprintf(name, sizeof(name), "%zu", vi->n);
	if (!bad) {
		cJSON_AddItemToObject(leaf, "key_metadata", keys);
		cJSON_AddItemToObject(leaf, "value_metadata", vm);
		keys = vm = NULL;
		bad = !cJSON_AddItemToObject(vi->tree, name, leaf);
		if (!bad)
			leaf = NULL;
	}
	cJSON_Delete(leaf);
	cJSON_Delete(keys);
	cJSON_Delete(vm);
	if (bad)
		return -ENOMEM;
	vi->n++;
	return 0;
}

static int put_meta(struct ckpt_vitem *vi, const char *skey, const struct ckpt_zarr_meta *m)
{
	char *txt = ckpt_zarr_meta_emit(m);
	if (!txt)
		return -ENOTSUP;
	char k[64];
	snprintf(k, sizeof(k), "%s/%s", skey,
		 m->zarr_format == 3 ? CKPT_ORBAX_ZARR3_META : CKPT_ORBAX_ZARR2_META);
	int rc = ckpt_store_mem_put(vi->mem, k, txt, strlen(txt));
	free(txt);
	return rc;
}

/* A zarr model of dtype/shape in chunks of `chunk` (NULL: one chunk; a
 * dimension of 0 counts as 1), elements in C order, raw bytes. */
static void meta_init(struct ckpt_zarr_meta *m, int format, ckpt_dtype dt, int rank, const uint64_t *shape,
		      const uint64_t *chunk, int big)
{
	memset(m, 0, sizeof(*m));
	m->zarr_format = format;
	m->dtype = dt;
	m->rank = rank;
	for (int d = 0; d < rank; d++) {
		uint64_t c = chunk ? chunk[d] : shape[d];
		m->shape[d] = shape[d];
		m->chunk_shape[d] = c ? c : 1;
	}
	m->key_encoding = CKPT_ZARR_KEYS_V2;
	m->sep = '.';
	struct ckpt_zarr_chain *ch = &m->codecs;
	ch->a2b.id = CKPT_CODEC_BYTES;
	ch->a2b.endian = ckpt_dtype_get(dt)->itemsize == 1 ? CKPT_ENDIAN_NONE
			 : big				   ? CKPT_ENDIAN_BIG
							   : CKPT_ENDIAN_LITTLE;
}

/* The elements in dimension order `order` (order[0] slowest): a transpose codec. */
static void meta_order(struct ckpt_zarr_meta *m, const int *order)
{
	m->codecs.a2a[0].id = CKPT_CODEC_TRANSPOSE;
	for (int d = 0; d < m->rank; d++)
		m->codecs.a2a[0].order[d] = order[d];
	m->codecs.na2a = 1;
}

/* Longest chunk key: the store key, '/', rank coordinates of up to 20
 * digits with a '.' between them. */
#define CHUNK_KEY_MAX (32 + CKPT_MAX_RANK * 21)

/* Key of the chunk at grid coordinates coord ("0" for rank 0). */
static void cell_key(char *buf, size_t cap, const char *skey, int rank, const uint64_t *coord)
{
	size_t o = (size_t)snprintf(buf, cap, "%s/", skey);
	if (rank == 0) {
		snprintf(buf + o, cap - o, "0");
		return;
	}
	for (int d = 0; d < rank && o < cap; d++)
		o += (size_t)snprintf(buf + o, cap - o, "%s%llu", d ? "." : "", (unsigned long long)coord[d]);
}

/* Chunk key of chunk `c` along dimension `dim` (all others 0). */
static void chunk_key(char *buf, size_t cap, const char *skey, int rank, int dim, uint64_t c)
{
	uint64_t coord[CKPT_MAX_RANK] = { 0 };
	if (dim >= 0 && dim < rank)
		coord[dim] = c;
	cell_key(buf, cap, skey, rank, coord);
}

/* Key k = bytes [from, from + len) of a's pieces laid end to end. */
static int put_from_pieces(struct ckpt_vitem *vi, const char *k, const struct ckpt_varray *a, uint64_t from,
			   uint64_t len)
{
	uint64_t *sel = malloc(a->npieces * 2 * sizeof(uint64_t));
	if (!sel)
		return -ENOMEM;
	size_t n = 0;
	uint64_t at = 0; /* stream offset of piece i */
	for (size_t i = 0; i < a->npieces && len; i++) {
		uint64_t po = a->pieces[2 * i], pl = a->pieces[2 * i + 1];
		if (from < at + pl && pl) {
			uint64_t skip = from - at, take = pl - skip < len ? pl - skip : len;
			sel[2 * n] = po + skip;
			sel[2 * n + 1] = take;
			n++;
			from += take;
			len -= take;
		}
		at += pl;
	}
	int rc = n ? ckpt_store_mem_put_pieces(vi->mem, k, a->base, a->base_key, sel, n) : -EINVAL;
	free(sel);
	return rc;
}

int ckpt_vitem_add_array(struct ckpt_vitem *vi, const char *const *path, int depth,
			 const struct ckpt_varray *a)
{
	const ckpt_dtype_info *di = ckpt_dtype_get(a->dtype);
	if (!di || a->rank < 0 || a->rank > CKPT_MAX_RANK || !a->base || !a->base_key)
		return -EINVAL;
	uint64_t nbytes = di->itemsize, elems = 1;
	for (int d = 0; d < a->rank; d++)
		if (ckpt_mul_u64(nbytes, a->shape[d], &nbytes) < 0 ||
		    ckpt_mul_u64(elems, a->shape[d], &elems) < 0 || nbytes > (1ull << 62))
			return -EINVAL;
	uint64_t have = a->length;
	if (a->npieces) {
		if (a->codec != CKPT_VCODEC_RAW)
			return -EINVAL;
		have = 0;
		for (size_t i = 0; i < a->npieces; i++)
			if (ckpt_add_u64(have, a->pieces[2 * i + 1], &have) < 0)
				return -EINVAL;
	}
	if (a->codec == CKPT_VCODEC_RAW && have != nbytes)
		return -EINVAL;
	char skey[32];
	snprintf(skey, sizeof(skey), KEY_FMT, vi->n);
	struct ckpt_zarr_meta m;
	meta_init(&m, 2, a->dtype, a->rank, a->shape, NULL, a->big_endian);
	if (a->fortran_order && a->rank > 1) {
		int rev[CKPT_MAX_RANK];
		for (int d = 0; d < a->rank; d++)
			rev[d] = a->rank - 1 - d;
		meta_order(&m, rev);
	}
	/* the slowest stored dimension: cut it into chunks of whole slabs */
	int dim = a->rank == 0 ? -1 : a->fortran_order ? a->rank - 1 : 0;
	uint64_t per = 1; /* slabs per chunk */
	if (dim >= 0 && a->codec == CKPT_VCODEC_RAW && nbytes > CHUNK_TARGET && a->shape[dim] > 1) {
		uint64_t slab = nbytes / a->shape[dim];
		uint64_t best = 1;
		uint64_t lim = slab ? CHUNK_TARGET / slab : a->shape[dim];
		/* the largest divisor of the dimension within the target: no
		 * partial edge chunk (zarr v2 edge chunks are stored whole) */
		for (uint64_t k = lim < a->shape[dim] ? lim : a->shape[dim]; k >= 1; k--)
			if (a->shape[dim] % k == 0) {
				best = k;
				break;
			}
		per = best;
		m.chunk_shape[dim] = per;
	} else {
		per = dim >= 0 ? m.chunk_shape[dim] : 1;
	}
	if (a->codec == CKPT_VCODEC_DEFLATE) {
		if (a->skip > CKPT_ZARR_MAX_SKIP)
			return -EINVAL;
		m.codecs.b2b[0].id = CKPT_CODEC_RAW_DEFLATE;
		m.codecs.b2b[0].skip = a->skip;
		m.codecs.b2b[0].has_crc32 = a->has_crc32;
		m.codecs.b2b[0].crc32 = a->crc32;
		m.codecs.nb2b = 1;
	}
	if (a->codec == CKPT_VCODEC_RAW && a->has_crc32 && !a->npieces) {
		m.zip_has_crc = 1;
		m.zip_crc32 = a->crc32;
		m.zip_head_crc32 = a->head_crc32;
	}
	int rc = put_meta(vi, skey, &m);
	if (rc < 0)
		return rc;
	if (elems) {
		uint64_t nchunks = dim >= 0 ? a->shape[dim] / per : 1;
		uint64_t cbytes = a->codec == CKPT_VCODEC_RAW ? nbytes / nchunks : a->length;
		for (uint64_t c = 0; c < nchunks; c++) {
			char k[CHUNK_KEY_MAX];
			chunk_key(k, sizeof(k), skey, a->rank, dim, c);
			if (a->npieces)
				rc = put_from_pieces(vi, k, a, c * cbytes, cbytes);
			else
				rc = ckpt_store_mem_put_range(vi->mem, k, a->base, a->base_key,
							      a->offset + c * cbytes, cbytes);
			if (rc < 0)
				return rc;
		}
	}
	return add_leaf(vi, path, depth, "np.ndarray", skey, 1);
}

int ckpt_vitem_add_bytes(struct ckpt_vitem *vi, const char *const *path, int depth, ckpt_dtype dtype,
			 int rank, const uint64_t *shape, const void *data, size_t len)
{
	const ckpt_dtype_info *di = ckpt_dtype_get(dtype);
	if (!di || rank < 0 || rank > CKPT_MAX_RANK)
		return -EINVAL;
	uint64_t nbytes = di->itemsize;
	for (int d = 0; d < rank; d++)
		if (ckpt_mul_u64(nbytes, shape[d], &nbytes) < 0 || nbytes > (1ull << 30))
			return -EINVAL;
	if (nbytes != len)
		return -EINVAL;
	char skey[32];
	snprintf(skey, sizeof(skey), KEY_FMT, vi->n);
	struct ckpt_zarr_meta m;
	meta_init(&m, 2, dtype, rank, shape, NULL, 0);
	int rc = put_meta(vi, skey, &m);
	if (rc < 0)
		return rc;
	if (len) {
		char k[CHUNK_KEY_MAX];
		chunk_key(k, sizeof(k), skey, rank, 0, 0);
		if ((rc = ckpt_store_mem_put(vi->mem, k, data, len)) < 0)
			return rc;
	}
	return add_leaf(vi, path, depth, "np.ndarray", skey, 1);
}

int ckpt_vitem_add_zarr(struct ckpt_vitem *vi, const char *const *path, int depth, ckpt_store *base,
			const char *dir)
{
	char skey[32];
	snprintf(skey, sizeof(skey), KEY_FMT, vi->n);
	int rc = ckpt_store_mem_put_folder(vi->mem, skey, base, dir);
	if (rc < 0)
		return rc;
	/* TensorStore leaves out chunks equal to the fill value: a missing one
	 * reads as the fill value */
	return add_leaf(vi, path, depth, "np.ndarray", skey, 0);
}

/* The key of cell coord of the array the next leaf will be. */
static int next_cell_key(struct ckpt_vitem *vi, int rank, const uint64_t *coord, char *k, size_t cap)
{
	if (rank < 0 || rank > CKPT_MAX_RANK)
		return -EINVAL;
	char skey[32];
	snprintf(skey, sizeof(skey), KEY_FMT, vi->n);
	cell_key(k, cap, skey, rank, coord);
	return 0;
}

int ckpt_vitem_cell_bytes(struct ckpt_vitem *vi, int rank, const uint64_t *coord, const void *data,
			  size_t len)
{
	char k[CHUNK_KEY_MAX];
	int rc = next_cell_key(vi, rank, coord, k, sizeof(k));
	return rc ? rc : ckpt_store_mem_put(vi->mem, k, data, len);
}

int ckpt_vitem_cell_range(struct ckpt_vitem *vi, int rank, const uint64_t *coord, ckpt_store *base,
			  const char *base_key, uint64_t offset, uint64_t length)
{
	char k[CHUNK_KEY_MAX];
	int rc = next_cell_key(vi, rank, coord, k, sizeof(k));
	return rc ? rc : ckpt_store_mem_put_range(vi->mem, k, base, base_key, offset, length);
}

int ckpt_vitem_cell_pieces(struct ckpt_vitem *vi, int rank, const uint64_t *coord, ckpt_store *base,
			   const char *base_key, const uint64_t *pieces, size_t npieces)
{
	char k[CHUNK_KEY_MAX];
	int rc = next_cell_key(vi, rank, coord, k, sizeof(k));
	return rc ? rc : ckpt_store_mem_put_pieces(vi->mem, k, base, base_key, pieces, npieces);
}

int ckpt_vitem_add_grid(struct ckpt_vitem *vi, const char *const *path, int depth, const struct ckpt_vgrid *g)
{
	if (!ckpt_dtype_get(g->dtype) || g->rank < 0 || g->rank > CKPT_MAX_RANK)
		return -EINVAL;
	if (g->order) { /* a permutation of the dimensions */
		uint64_t seen = 0;
		for (int d = 0; d < g->rank; d++) {
			if (g->order[d] < 0 || g->order[d] >= g->rank || (seen >> g->order[d] & 1u))
				return -EINVAL;
			seen |= 1ull << g->order[d];
		}
	}
	char skey[32];
	snprintf(skey, sizeof(skey), KEY_FMT, vi->n);
	struct ckpt_zarr_meta m;
	/* a permuted order needs zarr v3's transpose codec (v2 knows C and F only) */
	meta_init(&m, g->order ? 3 : 2, g->dtype, g->rank, g->shape, g->cell, g->big_endian);
	if (g->order)
		meta_order(&m, g->order);
	int rc = put_meta(vi, skey, &m);
	if (rc < 0)
		return rc;
	/* recorded as add_zarr's leaves are: a cell not put reads as the fill value */
	return add_leaf(vi, path, depth, "np.ndarray", skey, 0);
}

int ckpt_vitem_add_string(struct ckpt_vitem *vi, const char *const *path, int depth, const char *value)
{
	char skey[32];
	snprintf(skey, sizeof(skey), "s/%010zu", vi->n);
	if (!cJSON_AddStringToObject(vi->strings, skey, value))
		return -ENOMEM;
	return add_leaf(vi, path, depth, "string", skey, -1);
}

int ckpt_vitem_add_empty(struct ckpt_vitem *vi, const char *const *path, int depth)
{
	return add_leaf(vi, path, depth, "Dict", NULL, -1);
}

int ckpt_vitem_add_unreadable(struct ckpt_vitem *vi, const char *const *path, int depth)
{
	char skey[32];
	snprintf(skey, sizeof(skey), "x/%010zu", vi->n); /* no metadata there: the tree lists it broken */
	return add_leaf(vi, path, depth, "np.ndarray", skey, 1);
}

int ckpt_vitem_finish(struct ckpt_vitem *vi, ckpt_store **out)
{
	*out = NULL;
	cJSON *meta = cJSON_CreateObject();
	int rc = -ENOMEM;
	if (meta && cJSON_AddItemToObject(meta, "tree_metadata", vi->tree)) {
		vi->tree = NULL;
		if (cJSON_AddBoolToObject(meta, "store_array_data_equal_to_fill_value", 1)) {
			char *txt = cJSON_PrintUnformatted(meta);
			char *st = cJSON_PrintUnformatted(vi->strings);
			if (txt && st) {
				rc = ckpt_store_mem_put(vi->mem, CKPT_ORBAX_METADATA, txt, strlen(txt));
				if (rc == 0)
					rc = ckpt_store_mem_put(vi->mem, CKPT_ORBAX_STRINGS, st, strlen(st));
			}
			free(txt);
			free(st);
		}
	}
	cJSON_Delete(meta);
	if (rc == 0) {
		*out = vi->mem;
		vi->mem = NULL;
	}
	ckpt_vitem_free(vi);
	return rc;
}
