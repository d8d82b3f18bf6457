/*
 * array_files.c - the file kinds whose bytes are decoded arrays and their
 * reads: array files (NAME.npy, NAME[slice].npy, a stored shard: a region
 * of a stored array), NAME.f32.npy (bfloat16 and float8 widened to
 * float32) and safetensors files.  Zero-copy mapping of decoded chunks,
 * read-ahead across safetensors tensors, warming of the next file of a
 * directory, and the revalidation on open.
 *
 * The committed file kinds are two files, split by how they read: these
 * read through the read layer's arrays, with the machinery above (maps,
 * read-ahead, warming, open checks) that serves only them; the plain kinds
 * (plain_files.c: copied and synthesized files, .ckptfs/stats and log)
 * read bytes they hold or one store key, and share none of it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "npy.h"
#include "tree_int.h"

/* A streaming reader is one whose next read starts within this distance of
 * where the last one ended. */
#define ST_STREAM_SLACK (4u << 20)
/* Pieces of a safetensors byte range mapped per call. */
#define ST_PIECES 16
#define ST_IOV_PIECES 8
/* Store stats one open may spend revalidating (ckpt_array_open_check). */
#define OPEN_CHECK_BUDGET 64

static void file_attr(ckpt_view *v, struct node *n, ckpt_attr *a, uint64_t size)
{
	(void)v;
	(void)n;
	a->mode = 0444;
	a->size = size;
}

/* ---- array files ----------------------------------------------------------- */

int ckpt_array_node_init(struct node *node, struct aref *ar, const ckpt_region *r)
{
	struct array_node *n = to_array(node);
	const ckpt_array_meta *m = ckpt_array_meta_of(ar->arr);
	n->ar = ar;
	n->region = *r;
	uint64_t shape[CKPT_MAX_RANK];
	for (int d = 0; d < r->rank; d++)
		shape[d] = r->stop[d] - r->start[d];
	char hdr[CKPT_NPY_HEADER_MAX];
	int h = ckpt_npy_header(m->dtype, r->rank, shape, hdr, sizeof(hdr));
	if (h < 0)
		return h;
	n->hdr = malloc((size_t)h);
	if (!n->hdr)
		return -ENOMEM;
	memcpy(n->hdr, hdr, (size_t)h);
	n->hdrlen = (size_t)h;
	uint64_t count;
	if (ckpt_region_count(r, &count) < 0)
		return -EOVERFLOW;
	n->size = n->hdrlen + count * m->itemsize;
	return 0;
}

/* ---- NAME.f32.npy: bfloat16 and float8 widened to float32 ------------------ */

/* Elements converted per step of a widened read. */
#define WIDEN_BATCH 65536

static float f32_of_bits(uint32_t b)
{
	float f;
	memcpy(&f, &b, sizeof(f));
	return f;
}

/* One float8 value (mbits mantissa bits, exponent bias) as float32, exact:
 * every float8 value is a float32 value.  e4m3fn has no infinities and one
 * NaN pattern (S.1111.111); e5m2 follows IEEE (exponent 31: inf or NaN). */
static float f8_to_f32(uint8_t x, int mbits, int bias, int ieee_special)
{
	uint32_t s = (uint32_t)(x >> 7) << 31;
	int ebits = 7 - mbits;
	uint32_t e = (x >> mbits) & ((1u << ebits) - 1), m = x & ((1u << mbits) - 1);
	if (e == (1u << ebits) - 1 && (ieee_special || m == (1u << mbits) - 1))
		return f32_of_bits(s | 0x7f800000u | (m ? 0x400000u : 0)); /* inf or NaN */
	if (e == 0) {
		/* subnormal: m * 2^(1 - bias - mbits) */
		float scale = f32_of_bits((uint32_t)(127 + 1 - bias - mbits) << 23);
		float f = (float)m * scale;
		return s ? -f : f;
	}
	return f32_of_bits(s | (e - (uint32_t)bias + 127) << 23 | m << (23 - mbits));
}

static int widen_supported(ckpt_dtype dt)
{
	return dt == CKPT_DT_BFLOAT16 || dt == CKPT_DT_F8_E4M3FN || dt == CKPT_DT_F8_E5M2;
}

static void widen(ckpt_dtype dt, const uint8_t *src, size_t count, float *dst)
{
	for (size_t i = 0; i < count; i++) {
		if (dt == CKPT_DT_BFLOAT16)
			dst[i] = f32_of_bits((uint32_t)(src[2 * i] | src[2 * i + 1] << 8) << 16);
		else if (dt == CKPT_DT_F8_E4M3FN)
			dst[i] = f8_to_f32(src[i], 3, 7, 0);
		else
			dst[i] = f8_to_f32(src[i], 2, 15, 1);
	}
}

int ckpt_array_node_init_f32(struct node *node, struct aref *ar, const ckpt_region *r)
{
	struct array_node *n = to_array(node);
	const ckpt_array_meta *m = ckpt_array_meta_of(ar->arr);
	if (!widen_supported(m->dtype))
		return -ENOTSUP;
	n->ar = ar;
	n->region = *r;
	n->widen = 1;
	uint64_t shape[CKPT_MAX_RANK];
	for (int d = 0; d < r->rank; d++)
		shape[d] = r->stop[d] - r->start[d];
	char hdr[CKPT_NPY_HEADER_MAX];
	int h = ckpt_npy_header(CKPT_DT_FLOAT32, r->rank, shape, hdr, sizeof(hdr));
	if (h < 0)
		return h;
	n->hdr = malloc((size_t)h);
	if (!n->hdr)
		return -ENOMEM;
	memcpy(n->hdr, hdr, (size_t)h);
	n->hdrlen = (size_t)h;
	uint64_t count;
	if (ckpt_region_count(r, &count) < 0 || count > UINT64_MAX / 4)
		return -EOVERFLOW;
	n->size = n->hdrlen + count * 4;
	return 0;
}

/* Bytes [off, off+len) of the float32 data of widened node n. */
static ssize_t widen_read(struct array_node *n, uint64_t off, size_t len, uint8_t *dst)
{
	const ckpt_array_meta *m = ckpt_array_meta_of(n->ar->arr);
	unsigned is = m->itemsize;
	uint8_t *src = malloc((size_t)WIDEN_BATCH * is);
	float *f = malloc((size_t)WIDEN_BATCH * sizeof(float));
	ssize_t rc = 0;
	size_t done = 0;
	while (src && f && done < len) {
		uint64_t e0 = (off + done) / 4, skip = (off + done) % 4;
		uint64_t want = (len - done + skip + 3) / 4;
		size_t cnt = want < WIDEN_BATCH ? (size_t)want : WIDEN_BATCH;
		ssize_t r = ckpt_array_read(n->ar->arr, &n->region, e0 * is, cnt * is, src);
		if (r < 0) {
			rc = r;
			break;
		}
		if ((size_t)r != cnt * is) {
			rc = -EIO;
			break;
		}
		widen(m->dtype, src, cnt, f);
		size_t take = cnt * 4 - (size_t)skip;
		if (take > len - done)
			take = len - done;
		memcpy(dst + done, (uint8_t *)f + skip, take);
		done += take;
	}
	if (!src || !f)
		rc = -ENOMEM;
	free(src);
	free(f);
	return rc < 0 ? rc : (ssize_t)done;
}

static void array_attr(ckpt_view *v, struct node *n, ckpt_attr *a)
{
	file_attr(v, n, a, to_array(n)->size);
}

static void array_destroy(ckpt_view *v, struct node *n)
{
	(void)v;
	free(to_array(n)->hdr);
}

/* The node after x in the order a reader walking the tree takes (cp -r,
 * tar, a loader in key order): a folder's kids in name order, a folder's
 * files before its next sibling; NULL at the end of the walk.  The walk
 * descends only into folders below a kid of the root: those are built
 * whole when their step is loaded (layout.c) and never change after; the
 * root's kids change (steps come and go), and a step's own kids may not
 * be built yet.  It goes up to the root only from an array file (a root
 * that holds array files is no changing root), not from a folder. */
static struct node *walk_next(ckpt_view *v, struct node *x)
{
	if (x->kind == N_DIR && x->ino != CKPT_ROOT_INO && x->parent != CKPT_ROOT_INO && to_dir(x)->nkids)
		return to_dir(x)->kids[0];
	for (;;) {
		struct node *p = x->ino == CKPT_ROOT_INO ? NULL : ckpt_node_at(v, x->parent);
		if (!p || p->kind != N_DIR || (p->ino == CKPT_ROOT_INO && x->kind != N_ARRAY))
			return NULL;
		size_t pos;
		if (!ckpt_node_kid_index(p, x->name, &pos))
			return NULL;
		if (pos + 1 < to_dir(p)->nkids)
			return to_dir(p)->kids[pos + 1];
		x = p;
	}
}

/* Files warmed ahead of a reader at most, the share of the cache their
 * first windows may take, and the nodes one warm-up looks at at most. */
#define WARM_FILES_MAX 8
#define WARM_CACHE_SHARE 2 /* 1/2 */
#define WARM_WALK_MAX 256

/* A reader near the end of an array file probably goes on with the next
 * files of the tree (cp -r, tar, a loader walking the tree): start
 * decoding their first chunks now, once per file.  The next files, not
 * only the next one: while the reader copies one file out the decode
 * threads work on the next ones side by side (a file of one large chunk
 * is one decode, on one thread), as long as their first windows take at
 * most half of the cache.  The next files of the folder first, then those
 * of the folders after it (walk_next): an Orbax tree keeps a layer's
 * arrays in a folder of their own, so the next file of the reader is
 * often in the next folder. */
static void warm_next_file(ckpt_view *v, struct array_node *n)
{
	if (n->n.hidden || atomic_exchange(&n->next_warmed, 1))
		return;
	uint64_t room = ckpt_array_cache_budget(n->ar->arr) / WARM_CACHE_SHARE;
	int files = 0;
	struct node *k = &n->n;
	for (int seen = 0; files < WARM_FILES_MAX && seen < WARM_WALK_MAX; seen++) {
		if (!(k = walk_next(v, k)))
			return;
		if (k->kind != N_ARRAY || k->hidden)
			continue; /* (slices and other names made on lookup: not in a listing) */
		struct array_node *an = to_array(k);
		uint64_t w = ckpt_array_window(an->ar->arr), bytes = ckpt_array_meta_of(an->ar->arr)->nbytes;
		if (w > bytes)
			w = bytes;
		if (files > 0 && w > room)
			return;
		ckpt_array_prefetch(an->ar->arr, &an->region, 0, w);
		room = w < room ? room - w : 0;
		files++;
	}
}

static ssize_t array_read(ckpt_view *v, struct node *node, uint64_t off, size_t len, void *dst8)
{
	struct array_node *n = to_array(node);
	uint8_t *dst = dst8;
	if (off >= n->size)
		return 0;
	if (len > n->size - off)
		len = (size_t)(n->size - off);
	size_t done = 0;
	if (off < n->hdrlen) {
		size_t h = n->hdrlen - (size_t)off < len ? n->hdrlen - (size_t)off : len;
		memcpy(dst, n->hdr + off, h);
		done = h;
	}
	if (done < len) {
		ssize_t r = n->widen ? widen_read(n, off + done - n->hdrlen, len - done, dst + done)
				     : ckpt_array_read(n->ar->arr, &n->region, off + done - n->hdrlen,
						       len - done, dst + done);
		if (r < 0)
			return r;
		done += (size_t)r;
	}
	if (done > 0 && off + (uint64_t)done + ckpt_array_window(n->ar->arr) >= n->size)
		warm_next_file(v, n);
	return (ssize_t)done;
}

static int array_read_iov(ckpt_view *v, struct node *node, uint64_t off, size_t len, struct iovec *iov,
			  int max, ckpt_pin **pins, int *npins)
{
	struct array_node *n = to_array(node);
	if (n->widen)
		return -ENOTSUP; /* converted bytes: copied by array_read */
	/* A transient node (slice name) may be freed by a FORGET as soon as the
	 * reply completes, while the reply's iovec still names its header (a
	 * checker reading the iovec after writev returns sees freed memory):
	 * its bytes are copied by array_read. */
	if (node->transient)
		return -ENOTSUP;
	if (off >= n->size)
		return 0;
	if (len > n->size - off)
		len = (size_t)(n->size - off);
	int k = 0;
	size_t done = 0;
	if (off < n->hdrlen) {
		done = n->hdrlen - (size_t)off < len ? n->hdrlen - (size_t)off : len;
		iov[k].iov_base = n->hdr + off;
		iov[k].iov_len = done;
		k++;
	}
	if (done < len) {
		int m = ckpt_array_map(n->ar->arr, &n->region, off + done - n->hdrlen, len - done, iov + k,
				       pins, max - k);
		if (m < 0)
			return m;
		*npins = m;
		k += m;
	}
	if (off + len + ckpt_array_window(n->ar->arr) >= n->size)
		warm_next_file(v, n);
	return k;
}

/* Data changed under the mount: revalidate at every open, and let the
 * kernel keep its cached pages of the file unless what they came from
 * changed since this file's previous open. */
static int array_open(ckpt_view *v, struct node *node)
{
	(void)v;
	struct array_node *n = to_array(node);
	int budget = OPEN_CHECK_BUDGET;
	unsigned now = ckpt_array_open_check(n->ar->arr, &budget);
	return atomic_exchange(&n->seen_changes, now) != now;
}

const struct node_ops ckpt_array_ops = {
	.kind = N_ARRAY,
	.open = array_open,
	.size = sizeof(struct array_node),
	.getattr = array_attr,
	.read = array_read,
	.read_iov = array_read_iov,
	.getxattr = ckpt_array_getxattr,
	.listxattr = ckpt_array_listxattr,
	.destroy = array_destroy,
};

/* ---- safetensors files ----------------------------------------------------- */

static struct array_node *st_array(struct st_node *n, size_t input)
{
	return to_array(n->st_arrays[input]);
}

/* A sequential reader of the file crosses from tensor to tensor: queue the
 * decode of whatever the next window of the file holds. */
static void st_read_ahead(struct st_node *n, uint64_t off)
{
	ckpt_st_piece pieces[ST_IOV_PIECES];
	ssize_t np = ckpt_st_layout_map(n->st, off, 1, pieces, 1);
	if (np <= 0 || pieces[0].tensor == CKPT_ST_PIECE_HEADER)
		return;
	struct array_node *first = st_array(n, pieces[0].input);
	uint64_t window = ckpt_array_window(first->ar->arr);
	np = ckpt_st_layout_map(n->st, off, (size_t)window, pieces, ST_IOV_PIECES);
	for (ssize_t i = 0; i < np; i++) {
		if (pieces[i].tensor == CKPT_ST_PIECE_HEADER)
			continue;
		struct array_node *an = st_array(n, pieces[i].input);
		ckpt_array_prefetch(an->ar->arr, &an->region, pieces[i].src_off, pieces[i].len);
	}
}

/* Read ahead across tensors only for a reader streaming the file from its
 * start past the header (cp, cat): one that reads the header and then
 * tensor T by its byte range (safe_open) decodes T's chunks and nothing
 * else. */
static void st_after_read(struct st_node *n, uint64_t off, size_t done, size_t hlen)
{
	uint64_t expect = atomic_load(&n->st_next);
	int streaming =
		(off == 0 && done > hlen) ||
		(expect != UINT64_MAX && off + ST_STREAM_SLACK >= expect && off <= expect + ST_STREAM_SLACK);
	atomic_store(&n->st_next, streaming ? off + done : UINT64_MAX);
	if (streaming)
		st_read_ahead(n, off + done);
}

/* Zero-copy mapping of a safetensors byte range (see ckpt_view_read_iov). */
static int st_read_iov(ckpt_view *v, struct node *node, uint64_t off, size_t len, struct iovec *iov, int max,
		       ckpt_pin **pins, int *npins)
{
	struct st_node *n = to_st(node);
	size_t hlen;
	const uint8_t *hdr = ckpt_st_layout_header(n->st, &hlen);
	ckpt_st_piece pieces[ST_IOV_PIECES];
	ssize_t np = ckpt_st_layout_map(n->st, off, len, pieces,
					max < ST_IOV_PIECES ? (size_t)max : ST_IOV_PIECES);
	if (np < 0)
		return (int)np;
	int k = 0;
	size_t done = 0;
	for (ssize_t i = 0; i < np && k < max; i++) {
		ckpt_st_piece *p = &pieces[i];
		if (p->tensor == CKPT_ST_PIECE_HEADER) {
			iov[k].iov_base = (void *)(hdr + p->src_off);
			iov[k].iov_len = p->len;
			k++;
		} else {
			struct array_node *an = st_array(n, p->input);
			int m = ckpt_array_map(an->ar->arr, &an->region, p->src_off, p->len, iov + k,
					       pins + *npins, max - k);
			if (m < 0) {
				for (int j = 0; j < *npins; j++)
					ckpt_ctx_unpin(v->ctx, pins[j]);
				*npins = 0;
				return m;
			}
			k += m;
			*npins += m;
		}
		done = p->dst_off + p->len;
	}
	/* Out of iovec room: a short reply would tell the kernel the file ends
	 * there (it trims its cached size), so copy instead. */
	uint64_t fsize = ckpt_st_layout_file_size(n->st);
	if (off < fsize && done < (fsize - off < len ? fsize - off : len)) {
		for (int j = 0; j < *npins; j++)
			ckpt_ctx_unpin(v->ctx, pins[j]);
		*npins = 0;
		return -ENOTSUP;
	}
	st_after_read(n, off, done, hlen);
	return k;
}

/* ckpt_st_layout_read's tensor reads: the array behind input. */
static ssize_t st_tensor_read(void *arg, size_t input, uint64_t src_off, size_t len, uint8_t *to)
{
	struct array_node *an = st_array(arg, input);
	return ckpt_array_read(an->ar->arr, &an->region, src_off, len, to);
}

static ssize_t st_read(ckpt_view *v, struct node *node, uint64_t off, size_t len, void *dst8)
{
	(void)v;
	struct st_node *n = to_st(node);
	size_t hlen;
	ckpt_st_layout_header(n->st, &hlen);
	ssize_t done = ckpt_st_layout_read(n->st, off, len, dst8, st_tensor_read, n);
	if (done >= 0)
		st_after_read(n, off, (size_t)done, hlen);
	return done;
}

static void st_attr(ckpt_view *v, struct node *n, ckpt_attr *a)
{
	file_attr(v, n, a, to_st(n)->size);
}

static void st_destroy(ckpt_view *v, struct node *node)
{
	(void)v;
	struct st_node *n = to_st(node);
	if (!n->st_borrowed) {
		free(n->st_arrays);
		ckpt_st_layout_destroy(n->st);
	}
}

/* As array_open, for every tensor of the file: each starts a new epoch; the
 * stats of one open are spent round-robin over the tensors. */
static int st_open(ckpt_view *v, struct node *node)
{
	(void)v;
	struct st_node *n = to_st(node);
	size_t count = ckpt_st_layout_count(n->st);
	if (count == 0)
		return 0;
	size_t first = atomic_fetch_add(&n->open_rr, 1) % count;
	int budget = OPEN_CHECK_BUDGET, spent_all = 0;
	unsigned sum = 0;
	for (size_t k = 0; k < count; k++) {
		size_t i = (first + k) % count;
		ckpt_st_info info;
		if (ckpt_st_layout_get(n->st, i, &info) < 0)
			continue;
		int none = 0;
		sum += ckpt_array_open_check(st_array(n, info.input)->ar->arr, spent_all ? &none : &budget);
		if (budget <= 0 && !spent_all) {
			spent_all = 1;
			atomic_store(&n->open_rr, i + 1);
		}
	}
	return atomic_exchange(&n->seen_changes, sum) != sum;
}

const struct node_ops ckpt_st_ops = {
	.kind = N_SAFETENSORS,
	.open = st_open,
	.size = sizeof(struct st_node),
	.getattr = st_attr,
	.read = st_read,
	.read_iov = st_read_iov,
	.destroy = st_destroy,
};
