/*
 * safetensors.c - layout of virtual safetensors files (see safetensors.h).
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "safetensors.h"

/* ---- small growable byte buffer ---------------------------------------- */

struct sbuf {
	char *p;
	size_t len, cap;
	int err; /* sticky: first failure (negative errno) */
};

static void sb_reserve(struct sbuf *b, size_t more)
{
	size_t need, ncap;
	char *np;

	if (b->err)
		return;
	if (__builtin_add_overflow(b->len, more, &need) || need == SIZE_MAX) {
		b->err = -EOVERFLOW;
		return;
	}
	need++; /* room for a NUL */
	if (need <= b->cap)
		return;
	ncap = b->cap ? b->cap : 256;
	while (ncap < need) {
		if (ncap > SIZE_MAX / 2) {
			ncap = need;
			break;
		}
		ncap *= 2;
	}
	np = realloc(b->p, ncap);
	if (!np) {
		b->err = -ENOMEM;
		return;
	}
	b->p = np;
	b->cap = ncap;
}

static void sb_put(struct sbuf *b, const char *s, size_t n)
{
	sb_reserve(b, n);
	if (b->err)
		return;
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
}

static void sb_str(struct sbuf *b, const char *s)
{
	sb_put(b, s, strlen(s));
}

static void sb_u64(struct sbuf *b, uint64_t v)
{
	char tmp[24];
	int n = snprintf(tmp, sizeof(tmp), "%llu", (unsigned long long)v);

	sb_put(b, tmp, (size_t)n);
}

/* ---- JSON string escaping (serde_json's rules) -------------------------- */

/* The escape of byte c, written to out (up to 6 bytes); returns its length
 * (1 when c is written as is). */
static size_t escape_byte(unsigned char c, char out[6])
{
	static const char hex[] = "0123456789abcdef";

	switch (c) {
	case '"':
		memcpy(out, "\\\"", 2);
		return 2;
	case '\\':
		memcpy(out, "\\\\", 2);
		return 2;
	case '\b':
		memcpy(out, "\\b", 2);
		return 2;
	case '\f':
		memcpy(out, "\\f", 2);
		return 2;
	case '\n':
		memcpy(out, "\\n", 2);
		return 2;
	case '\r':
		memcpy(out, "\\r", 2);
		return 2;
	case '\t':
		memcpy(out, "\\t", 2);
		return 2;
	default:
		break;
	}
	if (c < 0x20) {
		memcpy(out, "\\u00", 4);
		out[4] = hex[c >> 4];
		out[5] = hex[c & 15];
		return 6;
	}
	out[0] = (char)c;
	return 1;
}

size_t ckpt_st_json_escape(const char *s, char *buf, size_t cap)
{
	size_t total = 0;

	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		char e[6];
		size_t n = escape_byte(*p, e);

		for (size_t i = 0; i < n; i++, total++)
			if (cap && total < cap - 1)
				buf[total] = e[i];
	}
	if (cap)
		buf[total < cap - 1 ? total : cap - 1] = '\0';
	return total;
}

/* Append "s" (quoted, escaped). */
static void sb_jstr(struct sbuf *b, const char *s)
{
	const unsigned char *p = (const unsigned char *)s;

	sb_put(b, "\"", 1);
	while (*p && !b->err) {
		/* copy the run of bytes that need no escape in one go */
		const unsigned char *q = p;

		while (*q && *q >= 0x20 && *q != '"' && *q != '\\')
			q++;
		if (q > p) {
			sb_put(b, (const char *)p, (size_t)(q - p));
			p = q;
			continue;
		}
		char e[6];
		size_t n = escape_byte(*p, e);

		sb_put(b, e, n);
		p++;
	}
	sb_put(b, "\"", 1);
}

/* ---- UTF-8 -------------------------------------------------------------- */

int ckpt_st_utf8_valid(const char *str)
{
	const unsigned char *s = (const unsigned char *)str;

	if (!s)
		return 0;
	while (*s) {
		unsigned c = *s;
		int n;
		uint32_t cp, min;

		if (c < 0x80) {
			s++;
			continue;
		} else if ((c & 0xe0) == 0xc0) {
			n = 1;
			cp = c & 0x1f;
			min = 0x80;
		} else if ((c & 0xf0) == 0xe0) {
			n = 2;
			cp = c & 0x0f;
			min = 0x800;
		} else if ((c & 0xf8) == 0xf0) {
			n = 3;
			cp = c & 0x07;
			min = 0x10000;
		} else {
			return 0;
		}
		for (int i = 1; i <= n; i++) {
			if ((s[i] & 0xc0) != 0x80) /* also catches the NUL */
				return 0;
			cp = (cp << 6) | (s[i] & 0x3f);
		}
		if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return 0;
		s += n + 1;
	}
	return 1;
}

/* ---- dtype order -------------------------------------------------------- */

/* The reference `Dtype` enum (huggingface/safetensors tensor.rs), in its
 * declaration order = increasing alignment.  The writer sorts by this rank,
 * descending. */
static const char *const st_dtype_order[] = {
	"BOOL",	   "F4",	  "F6_E2M3",	 "F6_E3M2", "U8",  "I8",  "F8_E5M2", "F8_E4M3",
	"F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16",	    "U16", "F16", "BF16",    "I32",
	"U32",	   "F32",	  "C64",	 "F64",	    "I64", "U64",
};

static int st_dtype_rank(const char *code)
{
	for (size_t i = 0; i < sizeof(st_dtype_order) / sizeof(st_dtype_order[0]); i++)
		if (strcmp(st_dtype_order[i], code) == 0)
			return (int)i;
	return -1;
}

/* ---- the layout --------------------------------------------------------- */

struct st_ent {
	const char *name; /* into layout->names */
	ckpt_dtype dtype;
	int rank;
	int order; /* st_dtype_rank */
	const uint64_t *shape; /* into layout->shapes */
	uint64_t begin, nbytes;
	size_t input;
};

struct ckpt_st_layout {
	size_t n;
	struct st_ent *ent; /* file order */
	size_t *by_name; /* file-order indices sorted by name */
	char *names;
	uint64_t *shapes;
	uint8_t *header; /* 8 + N bytes */
	size_t header_len;
	uint64_t data_size, file_size;
};

/* A checked input tensor. */
struct st_in {
	const char *name;
	ckpt_dtype dtype;
	int rank;
	int order;
	const uint64_t *shape;
	uint64_t nbytes;
	size_t input;
};

static int cmp_in_name(const void *a, const void *b)
{
	const struct st_in *x = a, *y = b;

	return strcmp(x->name, y->name);
}

static int cmp_in_file_order(const void *a, const void *b)
{
	const struct st_in *x = a, *y = b;

	if (x->order != y->order)
		return x->order > y->order ? -1 : 1;
	return strcmp(x->name, y->name);
}

static int cmp_in_caller_order(const void *a, const void *b)
{
	const struct st_in *x = a, *y = b;

	return x->input < y->input ? -1 : x->input > y->input;
}

static int cmp_meta_key(const void *a, const void *b)
{
	const ckpt_st_meta *const *x = a, *const *y = b;

	return strcmp((*x)->key, (*y)->key);
}

/* Validate the metadata map: UTF-8, unique keys. */
static int check_meta(const ckpt_st_meta *meta, size_t n_meta)
{
	const ckpt_st_meta **sorted;
	int rc = 0;

	if (n_meta && !meta)
		return -EINVAL;
	for (size_t i = 0; i < n_meta; i++) {
		if (!meta[i].key || !meta[i].value) {
			ckpt_log(CKPT_LOG_ERR, "safetensors: metadata entry %zu has a NULL key or value", i);
			return -EINVAL;
		}
		if (!ckpt_st_utf8_valid(meta[i].key) || !ckpt_st_utf8_valid(meta[i].value)) {
			ckpt_log(CKPT_LOG_ERR, "safetensors: metadata entry %zu is not valid UTF-8", i);
			return -EINVAL;
		}
	}
	if (n_meta < 2)
		return 0;
	sorted = malloc(n_meta * sizeof(*sorted));
	if (!sorted)
		return -ENOMEM;
	for (size_t i = 0; i < n_meta; i++)
		sorted[i] = &meta[i];
	qsort(sorted, n_meta, sizeof(*sorted), cmp_meta_key);
	for (size_t i = 1; i < n_meta; i++) {
		if (strcmp(sorted[i - 1]->key, sorted[i]->key) == 0) {
			ckpt_log(CKPT_LOG_ERR, "safetensors: duplicate metadata key '%s'", sorted[i]->key);
			rc = -EINVAL;
			break;
		}
	}
	free(sorted);
	return rc;
}

/* Check the caller's tensors and return the kept ones (*out, malloc'd,
 * in the caller's order; *nout of them).  Tensors of dtypes without a
 * safetensors code fail or are skipped per flags. */
static int check_tensors(const ckpt_st_tensor *t, size_t n, unsigned flags, struct st_in **out, size_t *nout)
{
	struct st_in *in, *sorted = NULL;
	size_t k = 0;
	int rc = 0;

	*out = NULL;
	*nout = 0;
	if (n && !t)
		return -EINVAL;
	if (n > SIZE_MAX / sizeof(*in))
		return -ENOMEM;
	in = malloc((n ? n : 1) * sizeof(*in));
	if (!in)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		const ckpt_dtype_info *di = ckpt_dtype_get(t[i].dtype);
		uint64_t count = 1, bits;

		if (!t[i].name || !ckpt_st_utf8_valid(t[i].name)) {
			ckpt_log(CKPT_LOG_ERR, "safetensors: tensor %zu: name is %s", i,
				 t[i].name ? "not valid UTF-8" : "NULL");
			rc = -EINVAL;
			goto fail;
		}
		if (strcmp(t[i].name, "__metadata__") == 0) {
			ckpt_log(CKPT_LOG_ERR, "safetensors: a tensor may not be called '__metadata__'");
			rc = -EINVAL;
			goto fail;
		}
		if (t[i].rank < 0 || t[i].rank > CKPT_MAX_RANK || (t[i].rank > 0 && !t[i].shape)) {
			ckpt_log(CKPT_LOG_ERR, "safetensors: tensor '%s': bad rank %d or no shape", t[i].name,
				 t[i].rank);
			rc = -EINVAL;
			goto fail;
		}
		if (!di) {
			ckpt_log(CKPT_LOG_ERR, "safetensors: tensor '%s': invalid dtype %d", t[i].name,
				 (int)t[i].dtype);
			rc = -EINVAL;
			goto fail;
		}
		if (!di->st_code || st_dtype_rank(di->st_code) < 0) {
			if (flags & CKPT_ST_SKIP_UNSUPPORTED) {
				ckpt_log(
					CKPT_LOG_WARN,
					"safetensors: tensor '%s' left out: dtype %s has no safetensors code",
					t[i].name, di->name);
				continue;
			}
			ckpt_log(CKPT_LOG_ERR, "safetensors: tensor '%s': dtype %s has no safetensors code",
				 t[i].name, di->name);
			rc = -ENOTSUP;
			goto fail;
		}
		/* The reader multiplies the dims in order, then by the bit
		 * size, all checked: any overflow there is fatal for it. */
		for (int d = 0; d < t[i].rank; d++) {
			if (ckpt_mul_u64(count, t[i].shape[d], &count)) {
				rc = -EOVERFLOW;
				break;
			}
		}
		if (!rc)
			rc = ckpt_mul_u64(count, (uint64_t)di->itemsize * 8, &bits);
		if (rc) {
			ckpt_log(CKPT_LOG_ERR, "safetensors: tensor '%s': size overflows", t[i].name);
			goto fail;
		}
		in[k].name = t[i].name;
		in[k].dtype = t[i].dtype;
		in[k].rank = t[i].rank;
		in[k].order = st_dtype_rank(di->st_code);
		in[k].shape = t[i].shape;
		in[k].nbytes = bits / 8;
		in[k].input = i;
		k++;
	}
	/* unique names */
	if (k > 1) {
		sorted = malloc(k * sizeof(*sorted));
		if (!sorted) {
			rc = -ENOMEM;
			goto fail;
		}
		memcpy(sorted, in, k * sizeof(*sorted));
		qsort(sorted, k, sizeof(*sorted), cmp_in_name);
		for (size_t i = 1; i < k; i++) {
			if (strcmp(sorted[i - 1].name, sorted[i].name) == 0) {
				ckpt_log(CKPT_LOG_ERR, "safetensors: duplicate tensor name '%s'",
					 sorted[i].name);
				rc = -EINVAL;
				goto fail;
			}
		}
		free(sorted);
	}
	*out = in;
	*nout = k;
	return 0;
fail:
	free(sorted);
	free(in);
	return rc;
}

void ckpt_st_layout_destroy(ckpt_st_layout *l)
{
	if (!l)
		return;
	free(l->ent);
	free(l->by_name);
	free(l->names);
	free(l->shapes);
	free(l->header);
	free(l);
}

static int cmp_ent_name_idx(const void *a, const void *b, void *ctx)
{
	const struct st_ent *e = ctx;
	size_t x = *(const size_t *)a, y = *(const size_t *)b;

	return strcmp(e[x].name, e[y].name);
}

/* Build a layout from checked inputs (in[] is reordered in place). */
static int layout_build(struct st_in *in, size_t n, const ckpt_st_meta *meta, size_t n_meta, unsigned flags,
			ckpt_st_layout **out)
{
	ckpt_st_layout *l;
	struct sbuf b = { 0 };
	size_t names_len = 0, shapes_len = 0, pad;
	uint64_t off = 0;
	char *np;
	uint64_t *sp;
	int rc;

	qsort(in, n, sizeof(*in), flags & CKPT_ST_CALLER_ORDER ? cmp_in_caller_order : cmp_in_file_order);
	for (size_t i = 0; i < n; i++) {
		size_t sl = strlen(in[i].name) + 1;

		if (__builtin_add_overflow(names_len, sl, &names_len))
			return -ENOMEM;
		shapes_len += (size_t)in[i].rank; /* <= n * CKPT_MAX_RANK */
		if (ckpt_add_u64(off, in[i].nbytes, &off)) {
			ckpt_log(CKPT_LOG_ERR, "safetensors: total data size overflows");
			return -EOVERFLOW;
		}
	}
	l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	l->n = n;
	l->ent = calloc(n ? n : 1, sizeof(*l->ent));
	l->by_name = calloc(n ? n : 1, sizeof(*l->by_name));
	l->names = malloc(names_len ? names_len : 1);
	l->shapes = calloc(shapes_len ? shapes_len : 1, sizeof(*l->shapes));
	if (!l->ent || !l->by_name || !l->names || !l->shapes) {
		rc = -ENOMEM;
		goto fail;
	}
	np = l->names;
	sp = l->shapes;
	off = 0;
	for (size_t i = 0; i < n; i++) {
		struct st_ent *e = &l->ent[i];
		size_t sl = strlen(in[i].name) + 1;

		memcpy(np, in[i].name, sl);
		e->name = np;
		np += sl;
		if (in[i].rank)
			memcpy(sp, in[i].shape, (size_t)in[i].rank * sizeof(*sp));
		e->shape = sp;
		sp += in[i].rank;
		e->dtype = in[i].dtype;
		e->rank = in[i].rank;
		e->order = in[i].order;
		e->begin = off;
		e->nbytes = in[i].nbytes;
		e->input = in[i].input;
		off += in[i].nbytes;
		l->by_name[i] = i;
	}
	l->data_size = off;
	qsort_r(l->by_name, n, sizeof(*l->by_name), cmp_ent_name_idx, l->ent);

	/* The JSON header, after 8 placeholder bytes for N. */
	sb_put(&b, "\0\0\0\0\0\0\0\0", 8);
	sb_put(&b, "{", 1);
	if (n_meta) {
		sb_str(&b, "\"__metadata__\":{");
		for (size_t i = 0; i < n_meta; i++) {
			if (i)
				sb_put(&b, ",", 1);
			sb_jstr(&b, meta[i].key);
			sb_put(&b, ":", 1);
			sb_jstr(&b, meta[i].value);
		}
		sb_put(&b, "}", 1);
	}
	for (size_t i = 0; i < n; i++) {
		const struct st_ent *e = &l->ent[i];

		if (i || n_meta)
			sb_put(&b, ",", 1);
		sb_jstr(&b, e->name);
		sb_str(&b, ":{\"dtype\":\"");
		sb_str(&b, ckpt_dtype_get(e->dtype)->st_code);
		sb_str(&b, "\",\"shape\":[");
		for (int d = 0; d < e->rank; d++) {
			if (d)
				sb_put(&b, ",", 1);
			sb_u64(&b, e->shape[d]);
		}
		sb_str(&b, "],\"data_offsets\":[");
		sb_u64(&b, e->begin);
		sb_put(&b, ",", 1);
		sb_u64(&b, e->begin + e->nbytes);
		sb_str(&b, "]}");
	}
	sb_put(&b, "}", 1);
	if (b.err) {
		rc = b.err;
		goto fail;
	}
	pad = (8 - (b.len - 8) % 8) % 8;
	sb_put(&b, "        ", pad);
	if (b.err) {
		rc = b.err;
		goto fail;
	}
	if (b.len - 8 > CKPT_ST_MAX_HEADER) {
		ckpt_log(CKPT_LOG_ERR,
			 "safetensors: header of %zu bytes exceeds the %u-byte limit of readers", b.len - 8,
			 CKPT_ST_MAX_HEADER);
		rc = -EFBIG;
		goto fail;
	}
	ckpt_put_le64((uint8_t *)b.p, (uint64_t)(b.len - 8));
	l->header = (uint8_t *)b.p;
	l->header_len = b.len;
	b.p = NULL;
	if (ckpt_add_u64(l->data_size, l->header_len, &l->file_size)) {
		ckpt_log(CKPT_LOG_ERR, "safetensors: file size overflows");
		rc = -EOVERFLOW;
		goto fail;
	}
	*out = l;
	return 0;
fail:
	free(b.p);
	ckpt_st_layout_destroy(l);
	return rc;
}

int ckpt_st_layout_create(const ckpt_st_tensor *tensors, size_t n, const ckpt_st_meta *meta, size_t n_meta,
			  unsigned flags, ckpt_st_layout **out)
{
	struct st_in *in;
	size_t k;
	int rc;

	if (!out)
		return -EINVAL;
	rc = check_meta(meta, n_meta);
	if (rc)
		return rc;
	rc = check_tensors(tensors, n, flags, &in, &k);
	if (rc)
		return rc;
	rc = layout_build(in, k, meta, n_meta, flags, out);
	free(in);
	return rc;
}

const uint8_t *ckpt_st_layout_header(const ckpt_st_layout *l, size_t *len)
{
	if (len)
		*len = l ? l->header_len : 0;
	return l ? l->header : NULL;
}

uint64_t ckpt_st_layout_file_size(const ckpt_st_layout *l)
{
	return l ? l->file_size : 0;
}

uint64_t ckpt_st_layout_data_size(const ckpt_st_layout *l)
{
	return l ? l->data_size : 0;
}

size_t ckpt_st_layout_count(const ckpt_st_layout *l)
{
	return l ? l->n : 0;
}

int ckpt_st_layout_get(const ckpt_st_layout *l, size_t i, ckpt_st_info *out)
{
	const struct st_ent *e;

	if (!l || !out)
		return -EINVAL;
	if (i >= l->n)
		return -ERANGE;
	e = &l->ent[i];
	out->name = e->name;
	out->dtype = e->dtype;
	out->rank = e->rank;
	out->shape = e->shape;
	out->data_begin = e->begin;
	out->file_offset = l->header_len + e->begin; /* <= file_size: no overflow */
	out->nbytes = e->nbytes;
	out->input = e->input;
	return 0;
}

int ckpt_st_layout_find(const ckpt_st_layout *l, const char *name, size_t *idx)
{
	size_t lo = 0, hi;

	if (!l || !name)
		return -EINVAL;
	hi = l->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(l->ent[l->by_name[mid]].name, name);

		if (c == 0) {
			if (idx)
				*idx = l->by_name[mid];
			return 0;
		}
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return -ENOENT;
}

ssize_t ckpt_st_layout_map(const ckpt_st_layout *l, uint64_t off, size_t len, ckpt_st_piece *pieces,
			   size_t cap)
{
	uint64_t end, pos, d;
	size_t k = 0, lo, hi;

	if (!l || (cap && !pieces))
		return -EINVAL;
	if (off >= l->file_size || len == 0)
		return 0;
	end = l->file_size - off < len ? l->file_size : off + len;
	if (cap == 0)
		return -EINVAL;
	if (cap > SSIZE_MAX)
		cap = SSIZE_MAX;
	pos = off;
	if (pos < l->header_len) {
		uint64_t stop = end < l->header_len ? end : l->header_len;

		pieces[k].dst_off = 0;
		pieces[k].len = (size_t)(stop - pos);
		pieces[k].tensor = CKPT_ST_PIECE_HEADER;
		pieces[k].input = CKPT_ST_PIECE_HEADER;
		pieces[k].src_off = pos;
		k++;
		pos = stop;
	}
	if (pos >= end || k >= cap)
		return (ssize_t)k;
	/* First tensor whose data ends after data offset d (ends ascend). */
	d = pos - l->header_len;
	lo = 0;
	hi = l->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (l->ent[mid].begin + l->ent[mid].nbytes > d)
			hi = mid;
		else
			lo = mid + 1;
	}
	for (size_t i = lo; i < l->n && pos < end && k < cap; i++) {
		const struct st_ent *e = &l->ent[i];
		uint64_t tend = l->header_len + e->begin + e->nbytes; /* file offset */

		if (tend <= pos)
			continue; /* zero-size tensor */
		uint64_t stop = end < tend ? end : tend;

		pieces[k].dst_off = (size_t)(pos - off);
		pieces[k].len = (size_t)(stop - pos);
		pieces[k].tensor = i;
		pieces[k].input = e->input;
		pieces[k].src_off = pos - l->header_len - e->begin;
		k++;
		pos = stop;
	}
	return (ssize_t)k;
}

ssize_t ckpt_st_layout_read(const ckpt_st_layout *l, uint64_t off, size_t len, uint8_t *dst,
			    ckpt_st_tensor_read_fn tensor, void *arg)
{
	size_t hlen;
	const uint8_t *hdr = ckpt_st_layout_header(l, &hlen);
	size_t done = 0;
	while (done < len) {
		ckpt_st_piece pieces[16];
		ssize_t np = ckpt_st_layout_map(l, off + done, len - done, pieces, 16);
		if (np < 0)
			return np;
		if (np == 0)
			break;
		for (ssize_t i = 0; i < np; i++) {
			const ckpt_st_piece *p = &pieces[i];
			uint8_t *to = dst + done + p->dst_off;
			if (p->tensor == CKPT_ST_PIECE_HEADER) {
				memcpy(to, hdr + p->src_off, p->len);
				continue;
			}
			ssize_t r = tensor(arg, p->input, p->src_off, p->len, to);
			if (r < 0)
				return r;
			if ((size_t)r != p->len)
				return -EIO;
		}
		done += pieces[np - 1].dst_off + pieces[np - 1].len;
	}
	return (ssize_t)done;
}

/* ---- sharded form ------------------------------------------------------- */

#define SHARD_NAME_MAX 48

struct ckpt_st_sharded {
	size_t n;
	ckpt_st_layout **layouts;
	char (*names)[SHARD_NAME_MAX];
	char *index;
	size_t index_len;
	uint64_t total;
};

void ckpt_st_sharded_destroy(ckpt_st_sharded *s)
{
	if (!s)
		return;
	if (s->layouts)
		for (size_t i = 0; i < s->n; i++)
			ckpt_st_layout_destroy(s->layouts[i]);
	free(s->layouts);
	free(s->names);
	free(s->index);
	free(s);
}

struct wm_ent {
	const char *name;
	size_t shard;
};

static int cmp_wm(const void *a, const void *b)
{
	const struct wm_ent *x = a, *y = b;

	return strcmp(x->name, y->name);
}

int ckpt_st_sharded_create(const ckpt_st_tensor *tensors, size_t n, const ckpt_st_meta *meta, size_t n_meta,
			   uint64_t max_shard_bytes, unsigned flags, ckpt_st_sharded **out)
{
	static const ckpt_st_meta shard_meta[] = { { "format", "pt" } };
	struct st_in *in = NULL;
	size_t k = 0, nshards = 0, *first = NULL;
	struct wm_ent *wm = NULL;
	ckpt_st_sharded *s = NULL;
	struct sbuf b = { 0 };
	uint64_t cur = 0;
	int rc;

	if (!out || max_shard_bytes == 0)
		return -EINVAL;
	rc = check_meta(meta, n_meta);
	if (rc)
		return rc;
	for (size_t i = 0; i < n_meta; i++) {
		if (strcmp(meta[i].key, "total_size") == 0) {
			ckpt_log(CKPT_LOG_ERR, "safetensors: index metadata may not override 'total_size'");
			return -EINVAL;
		}
	}
	rc = check_tensors(tensors, n, flags, &in, &k);
	if (rc)
		return rc;

	/* Split: first[j] = index in in[] of shard j's first tensor. */
	first = malloc((k + 1) * sizeof(*first));
	wm = malloc((k ? k : 1) * sizeof(*wm));
	s = calloc(1, sizeof(*s));
	if (!first || !wm || !s) {
		rc = -ENOMEM;
		goto fail;
	}
	for (size_t i = 0; i < k; i++) {
		uint64_t sz = in[i].nbytes, sum;
		int fresh = nshards == 0 /* nothing open yet */
			    || sz > max_shard_bytes /* oversized: a shard of its own */
			    || cur > max_shard_bytes /* the open shard holds an oversized one */
			    || ckpt_add_u64(cur, sz, &sum) || sum > max_shard_bytes;

		if (fresh) {
			first[nshards++] = i;
			cur = 0;
		}
		cur += sz; /* cur <= max before, or 0: cannot wrap */
	}
	first[nshards] = k;
	if (nshards > 99999) {
		ckpt_log(CKPT_LOG_ERR, "safetensors: %zu shards exceed the 5-digit shard naming", nshards);
		rc = -EFBIG;
		goto fail;
	}
	s->layouts = calloc(nshards ? nshards : 1, sizeof(*s->layouts));
	s->names = calloc(nshards ? nshards : 1, sizeof(*s->names));
	if (!s->layouts || !s->names) {
		rc = -ENOMEM;
		goto fail;
	}
	s->n = nshards;
	for (size_t j = 0; j < nshards; j++) {
		snprintf(s->names[j], SHARD_NAME_MAX, "model-%05zu-of-%05zu.safetensors", j + 1, nshards);
		for (size_t i = first[j]; i < first[j + 1]; i++) {
			wm[i].name = in[i].name;
			wm[i].shard = j;
		}
	}
	for (size_t j = 0; j < nshards; j++) {
		/* layout_build reorders its slice of in[] (wm is filled already) */
		rc = layout_build(in + first[j], first[j + 1] - first[j], shard_meta, 1, flags,
				  &s->layouts[j]);
		if (rc)
			goto fail;
		if (ckpt_add_u64(s->total, s->layouts[j]->data_size, &s->total)) {
			rc = -EOVERFLOW;
			goto fail;
		}
	}

	/* The index, laid out as json.dumps(indent=2). */
	qsort(wm, k, sizeof(*wm), cmp_wm);
	sb_str(&b, "{\n  \"metadata\": {\n    \"total_size\": ");
	sb_u64(&b, s->total);
	for (size_t i = 0; i < n_meta; i++) {
		sb_str(&b, ",\n    ");
		sb_jstr(&b, meta[i].key);
		sb_str(&b, ": ");
		sb_jstr(&b, meta[i].value);
	}
	sb_str(&b, "\n  },\n  \"weight_map\": {");
	for (size_t i = 0; i < k; i++) {
		sb_str(&b, i ? ",\n    " : "\n    ");
		sb_jstr(&b, wm[i].name);
		sb_str(&b, ": \"");
		sb_str(&b, s->names[wm[i].shard]);
		sb_str(&b, "\"");
	}
	sb_str(&b, k ? "\n  }\n}\n" : "}\n}\n");
	if (b.err) {
		rc = b.err;
		goto fail;
	}
	s->index = b.p;
	s->index_len = b.len;
	b.p = NULL;
	free(first);
	free(wm);
	free(in);
	*out = s;
	return 0;
fail:
	free(b.p);
	free(first);
	free(wm);
	free(in);
	ckpt_st_sharded_destroy(s);
	return rc;
}

size_t ckpt_st_sharded_count(const ckpt_st_sharded *s)
{
	return s ? s->n : 0;
}

const ckpt_st_layout *ckpt_st_sharded_layout(const ckpt_st_sharded *s, size_t i)
{
	return s && i < s->n ? s->layouts[i] : NULL;
}

const char *ckpt_st_sharded_name(const ckpt_st_sharded *s, size_t i)
{
	return s && i < s->n ? s->names[i] : NULL;
}

int ckpt_st_sharded_find_file(const ckpt_st_sharded *s, const char *name, size_t *i)
{
	if (!s || !name)
		return -EINVAL;
	for (size_t j = 0; j < s->n; j++) {
		if (strcmp(s->names[j], name) == 0) {
			if (i)
				*i = j;
			return 0;
		}
	}
	return -ENOENT;
}

const char *ckpt_st_sharded_index(const ckpt_st_sharded *s, size_t *len)
{
	if (len)
		*len = s ? s->index_len : 0;
	return s ? s->index : NULL;
}

uint64_t ckpt_st_sharded_total_size(const ckpt_st_sharded *s)
{
	return s ? s->total : 0;
}

/* ---- reading a safetensors header ---------------------------------------------- */

#include <cjson/cJSON.h>

ckpt_dtype ckpt_st_dtype(const char *code)
{
	if (!code)
		return CKPT_DT_INVALID;
	for (int d = 1; d < CKPT_DT_COUNT; d++) {
		const ckpt_dtype_info *di = ckpt_dtype_get((ckpt_dtype)d);
		if (di && di->st_code && strcmp(di->st_code, code) == 0)
			return (ckpt_dtype)d;
	}
	return CKPT_DT_INVALID;
}

int ckpt_st_header_len(const uint8_t first8[8], uint64_t file_size, const char *what, uint64_t *n)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | first8[i];
	if (file_size < 8 || v > CKPT_ST_MAX_HEADER || v > file_size - 8) {
		ckpt_log(CKPT_LOG_ERR,
			 "%s: not a safetensors file (header length %llu for a file of %llu bytes)", what,
			 (unsigned long long)v, (unsigned long long)file_size);
		return -EINVAL;
	}
	*n = v;
	return 0;
}

void ckpt_st_file_free(ckpt_st_file *f)
{
	if (!f)
		return;
	for (size_t i = 0; i < f->n; i++)
		free(f->t[i].name);
	free(f->t);
	free(f->metadata_json);
	free(f);
}

/* A JSON number that is a non-negative integer below 2^53. */
static int st_uint(const cJSON *j, uint64_t *v)
{
	if (!cJSON_IsNumber(j) || j->valuedouble < 0 || j->valuedouble > 9007199254740992.0 ||
	    j->valuedouble != (double)(uint64_t)j->valuedouble)
		return -1;
	*v = (uint64_t)j->valuedouble;
	return 0;
}

static int st_by_begin(const void *a, const void *b)
{
	const ckpt_st_entry *x = *(const ckpt_st_entry *const *)a, *y = *(const ckpt_st_entry *const *)b;
	return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static int st_bad(const char *what, const char *name, const char *why)
{
	ckpt_log(CKPT_LOG_ERR, "%s: safetensors header%s%.200s: %s", what, name ? ", tensor " : "",
		 name ? name : "", why);
	return -EINVAL;
}

int ckpt_st_parse(const char *json, size_t n, uint64_t file_size, const char *what, ckpt_st_file **out)
{
	*out = NULL;
	what = what ? what : "safetensors";
	if (n > CKPT_ST_MAX_HEADER || file_size < 8 || n > file_size - 8)
		return st_bad(what, NULL, "header larger than the file or the limit");
	cJSON *root = cJSON_ParseWithLength(json, n);
	if (!cJSON_IsObject(root)) {
		cJSON_Delete(root);
		return st_bad(what, NULL, "not a JSON object");
	}
	ckpt_st_file *f = calloc(1, sizeof(*f));
	size_t cap = (size_t)cJSON_GetArraySize(root);
	if (f)
		f->t = calloc(cap ? cap : 1, sizeof(*f->t));
	if (!f || !f->t) {
		cJSON_Delete(root);
		ckpt_st_file_free(f);
		return -ENOMEM;
	}
	f->data_start = 8 + (uint64_t)n;
	uint64_t data_len = file_size - f->data_start;
	int rc = 0;
	for (cJSON *e = root->child; e && !rc; e = e->next) {
		if (!e->string || !ckpt_st_utf8_valid(e->string)) {
			rc = st_bad(what, NULL, "a name is not UTF-8");
			break;
		}
		if (strcmp(e->string, "__metadata__") == 0) {
			int ok = cJSON_IsObject(e) && !f->metadata_json;
			for (cJSON *m = ok ? e->child : NULL; m; m = m->next)
				ok &= cJSON_IsString(m);
			if (!ok) {
				rc = st_bad(what, NULL, "__metadata__ is not a map of strings");
				break;
			}
			f->metadata_json = cJSON_PrintUnformatted(e);
			if (!f->metadata_json)
				rc = -ENOMEM;
			continue;
		}
		for (size_t i = 0; i < f->n; i++)
			if (strcmp(f->t[i].name, e->string) == 0)
				rc = st_bad(what, e->string, "name given twice");
		if (rc)
			break;
		ckpt_st_entry *t = &f->t[f->n];
		const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
		const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
		const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
		if (!cJSON_IsObject(e) || !cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(off) ||
		    cJSON_GetArraySize(off) != 2 || cJSON_GetArraySize(sh) > CKPT_MAX_RANK) {
			rc = st_bad(what, e->string, "entry without dtype, shape and data_offsets");
			break;
		}
		t->dtype = ckpt_st_dtype(dt->valuestring);
		if (t->dtype == CKPT_DT_INVALID) {
			rc = st_bad(what, e->string, "unknown dtype code");
			break;
		}
		uint64_t numel = 1, b, en;
		int over = 0;
		for (const cJSON *d = sh->child; d; d = d->next) {
			if (st_uint(d, &t->shape[t->rank])) {
				over = 1;
				break;
			}
			if (t->shape[t->rank] && numel > UINT64_MAX / t->shape[t->rank])
				over = 1;
			numel *= t->shape[t->rank];
			t->rank++;
		}
		uint64_t isz = ckpt_dtype_get(t->dtype)->itemsize;
		if (over || numel > UINT64_MAX / isz) {
			rc = st_bad(what, e->string, "malformed shape");
			break;
		}
		if (st_uint(off->child, &b) || st_uint(off->child->next, &en) || b > en || en > data_len) {
			rc = st_bad(what, e->string, "data_offsets outside the data");
			break;
		}
		if (en - b != numel * isz) {
			rc = st_bad(what, e->string, "data_offsets do not match dtype and shape");
			break;
		}
		t->begin = f->data_start + b;
		t->end = f->data_start + en;
		t->name = strdup(e->string);
		if (!t->name)
			rc = -ENOMEM;
		else
			f->n++;
	}
	cJSON_Delete(root);
	if (!rc && f->n > 0) {
		/* the data buffer is covered from its start, no gap, no overlap */
		const ckpt_st_entry **s = malloc(f->n * sizeof(*s));
		if (!s) {
			rc = -ENOMEM;
		} else {
			for (size_t i = 0; i < f->n; i++)
				s[i] = &f->t[i];
			qsort(s, f->n, sizeof(*s), st_by_begin);
			if (s[0]->begin != f->data_start)
				rc = st_bad(what, s[0]->name, "a gap before the first tensor");
			for (size_t i = 1; i < f->n && !rc; i++)
				if (s[i]->begin < s[i - 1]->end)
					rc = st_bad(what, s[i]->name, "tensors overlap");
				else if (s[i]->begin > s[i - 1]->end)
					rc = st_bad(what, s[i]->name, "a gap between tensors");
			free(s);
		}
	}
	if (rc) {
		ckpt_st_file_free(f);
		return rc;
	}
	*out = f;
	return 0;
}
