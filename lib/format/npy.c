/*
 * npy.c - .npy header writer (byte-identical to np.save) and a strict,
 * bounds-checked parser for headers that users write.
 */
#include <string.h>

#include "npy.h"

static const uint8_t npy_magic[6] = { 0x93, 'N', 'U', 'M', 'P', 'Y' };

#define NPY_ALIGN 64
#define NPY_GROWTH_DIGITS 21 /* numpy's GROWTH_AXIS_MAX_DIGITS */

/* ---- writer --------------------------------------------------------------- */

static size_t fmt_u64(char *out, uint64_t v)
{
	char rev[24];
	size_t n = 0;

	do {
		rev[n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	for (size_t i = 0; i < n; i++)
		out[i] = rev[n - 1 - i];
	return n;
}

static char *put_str(char *p, const char *s)
{
	size_t n = strlen(s);

	memcpy(p, s, n);
	return p + n;
}

/* Build the complete header into out (>= CKPT_NPY_HEADER_MAX bytes).
 * Returns its length or a negative errno. */
static int build_header(ckpt_dtype dt, int rank, const uint64_t *shape, char *out)
{
	const ckpt_dtype_info *info = ckpt_dtype_get(dt);
	char *p = out + 10, *dict;
	size_t dlen, hlen, pad, total;

	if (!info || rank < 0 || rank > CKPT_MAX_RANK || (rank > 0 && !shape))
		return -EINVAL;
	for (int d = 0; d < rank; d++)
		if (shape[d] > (uint64_t)INT64_MAX)
			return -EOVERFLOW;

	/* Longest case: 15 + 6 + 39 + 32 * 21 + 4 + 20 + 1 = 757 bytes < 1024. */
	dict = p;
	size_t dl = strlen(info->npy_descr);
	if (dl > 16)
		return -EINVAL; /* the table's descrs are at most 4 characters */
	p = put_str(p, "{'descr': '");
	memcpy(p, info->npy_descr, dl);
	p += dl;
	p = put_str(p, "', 'fortran_order': False, 'shape': (");
	for (int d = 0; d < rank; d++) {
		if (d) {
			*p++ = ',';
			*p++ = ' ';
		}
		p += fmt_u64(p, shape[d]);
	}
	if (rank == 1)
		*p++ = ',';
	p = put_str(p, "), }");
	if (rank > 0) {
		char digits[24];
		size_t nd = fmt_u64(digits, shape[0]);
		for (size_t i = nd; i < NPY_GROWTH_DIGITS; i++)
			*p++ = ' ';
	}
	dlen = (size_t)(p - dict);
	hlen = dlen + 1; /* the final '\n' */
	pad = NPY_ALIGN - (10 + hlen) % NPY_ALIGN; /* 64 when already aligned, as numpy */
	total = 10 + hlen + pad;
	memset(p, ' ', pad);
	p[pad] = '\n';

	memcpy(out, npy_magic, 6);
	out[6] = 1;
	out[7] = 0;
	out[8] = (char)((hlen + pad) & 0xff);
	out[9] = (char)((hlen + pad) >> 8);
	return (int)total;
}

int ckpt_npy_header(ckpt_dtype dt, int rank, const uint64_t *shape, char *buf, size_t cap)
{
	char tmp[CKPT_NPY_HEADER_MAX + 64];
	int n = build_header(dt, rank, shape, tmp);

	if (n < 0)
		return n;
	if (!buf || (size_t)n > cap)
		return -ENOBUFS;
	memcpy(buf, tmp, (size_t)n);
	return n;
}

int ckpt_npy_file_size(ckpt_dtype dt, int rank, const uint64_t *shape, uint64_t *header_len, uint64_t *total)
{
	char tmp[CKPT_NPY_HEADER_MAX + 64];
	int n = build_header(dt, rank, shape, tmp);
	uint64_t count = 1, bytes;

	if (n < 0)
		return n;
	for (int d = 0; d < rank; d++)
		if (ckpt_mul_u64(count, shape[d], &count))
			return -EOVERFLOW;
	if (ckpt_mul_u64(count, ckpt_dtype_get(dt)->itemsize, &bytes) ||
	    ckpt_add_u64(bytes, (uint64_t)n, &bytes))
		return -EOVERFLOW;
	if (header_len)
		*header_len = (uint64_t)n;
	if (total)
		*total = bytes;
	return 0;
}

/* ---- parser --------------------------------------------------------------- */

struct lexer {
	const uint8_t *p, *end;
	int version;
};

static int is_space(uint8_t c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f';
}

static void skip_ws(struct lexer *lx)
{
	while (lx->p < lx->end && is_space(*lx->p))
		lx->p++;
}

/* Consume character c after optional whitespace. */
static int accept(struct lexer *lx, uint8_t c)
{
	skip_ws(lx);
	if (lx->p < lx->end && *lx->p == c) {
		lx->p++;
		return 1;
	}
	return 0;
}

/* A quoted string without escapes into out (cap includes the NUL). */
static int lex_string(struct lexer *lx, char *out, size_t cap)
{
	uint8_t q;
	size_t n = 0;

	skip_ws(lx);
	if (lx->p >= lx->end || (*lx->p != '\'' && *lx->p != '"'))
		return -EINVAL;
	q = *lx->p++;
	while (lx->p < lx->end && *lx->p != q) {
		uint8_t c = *lx->p++;
		if (c < 0x20 || c >= 0x7f || c == '\\' || n + 1 >= cap)
			return -EINVAL;
		out[n++] = (char)c;
	}
	if (lx->p >= lx->end)
		return -EINVAL;
	lx->p++;
	out[n] = 0;
	return 0;
}

/* An identifier-like word (True/False) must not run into more letters. */
static int accept_word(struct lexer *lx, const char *w)
{
	size_t n = strlen(w);

	skip_ws(lx);
	if ((size_t)(lx->end - lx->p) < n || memcmp(lx->p, w, n) != 0)
		return 0;
	if (lx->p + n < lx->end) {
		uint8_t c = lx->p[n];
		if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_')
			return 0;
	}
	lx->p += n;
	return 1;
}

/* Non-negative decimal int, no leading zeros, <= INT64_MAX. */
static int lex_uint(struct lexer *lx, uint64_t *out)
{
	uint64_t v = 0;
	const uint8_t *start;

	skip_ws(lx);
	start = lx->p;
	while (lx->p < lx->end && *lx->p >= '0' && *lx->p <= '9') {
		uint64_t digit = (uint64_t)(*lx->p - '0');
		if (v > ((uint64_t)INT64_MAX - digit) / 10)
			return -EINVAL;
		v = v * 10 + digit;
		lx->p++;
	}
	if (lx->p == start || (lx->p - start > 1 && *start == '0'))
		return -EINVAL;
	if (lx->version < 3 && lx->p < lx->end && *lx->p == 'L')
		lx->p++;
	if (lx->p < lx->end) {
		uint8_t c = *lx->p;
		if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == '.')
			return -EINVAL;
	}
	*out = v;
	return 0;
}

/* A tuple of ints: "()", "(n,)", "(a, b)", "(a, b,)". */
static int lex_shape(struct lexer *lx, int *rank, uint64_t *shape)
{
	int n = 0;

	if (!accept(lx, '('))
		return -EINVAL;
	if (accept(lx, ')')) {
		*rank = 0;
		return 0;
	}
	for (;;) {
		if (n >= CKPT_MAX_RANK)
			return -EINVAL;
		if (lex_uint(lx, &shape[n]))
			return -EINVAL;
		n++;
		if (accept(lx, ')')) {
			if (n == 1)
				return -EINVAL; /* "(5)" is an int, not a tuple */
			break;
		}
		if (!accept(lx, ','))
			return -EINVAL;
		if (accept(lx, ')'))
			break;
	}
	*rank = n;
	return 0;
}

static int parse_dict(struct lexer *lx, ckpt_dtype hint, ckpt_npy_info *out)
{
	char key[16], descr[32];
	int have_descr = 0, have_fortran = 0, have_shape = 0;

	if (!accept(lx, '{'))
		return -EINVAL;
	while (!accept(lx, '}')) {
		if (lex_string(lx, key, sizeof(key)) || !accept(lx, ':'))
			return -EINVAL;
		if (strcmp(key, "descr") == 0 && !have_descr) {
			if (lex_string(lx, descr, sizeof(descr)))
				return -EINVAL;
			have_descr = 1;
		} else if (strcmp(key, "fortran_order") == 0 && !have_fortran) {
			if (accept_word(lx, "True"))
				out->fortran_order = 1;
			else if (accept_word(lx, "False"))
				out->fortran_order = 0;
			else
				return -EINVAL;
			have_fortran = 1;
		} else if (strcmp(key, "shape") == 0 && !have_shape) {
			if (lex_shape(lx, &out->rank, out->shape))
				return -EINVAL;
			have_shape = 1;
		} else {
			return -EINVAL; /* unknown or repeated key */
		}
		if (!accept(lx, ',')) {
			if (!accept(lx, '}'))
				return -EINVAL;
			break;
		}
	}
	skip_ws(lx);
	if (lx->p != lx->end || !have_descr || !have_fortran || !have_shape)
		return -EINVAL;

	out->dtype = ckpt_dtype_from_npy(descr, hint);
	if (out->dtype == CKPT_DT_INVALID)
		return -EINVAL;
	return 0;
}

int ckpt_npy_parse(const uint8_t *buf, size_t len, ckpt_dtype hint, struct ckpt_npy_info *out, size_t *need)
{
	size_t prefix, hlen;
	struct lexer lx;
	ckpt_npy_info info;
	int rc, big = 0;

	if (!buf || !out)
		return -EINVAL;
	/* Reject a wrong magic as soon as the bytes we have show it. */
	if (memcmp(buf, npy_magic, len < 6 ? len : 6) != 0)
		return -EINVAL;
	if (len >= 7 && (buf[6] < 1 || buf[6] > 3))
		return -EINVAL;
	if (len >= 8 && buf[7] != 0)
		return -EINVAL;
	if (len < 7) {
		if (need)
			*need = 12; /* enough for any version's prefix */
		return -EAGAIN;
	}
	prefix = buf[6] == 1 ? 10 : 12;
	if (len < prefix) {
		if (need)
			*need = prefix;
		return -EAGAIN;
	}
	hlen = buf[6] == 1 ? (size_t)(buf[8] | buf[9] << 8) : (size_t)ckpt_le32(buf + 8);
	if (hlen > CKPT_NPY_MAX_HLEN)
		return -EINVAL;
	if (len < prefix + hlen) {
		if (need)
			*need = prefix + hlen;
		return -EAGAIN;
	}

	memset(&info, 0, sizeof(info));
	info.version = buf[6];
	lx.p = buf + prefix;
	lx.end = buf + prefix + hlen;
	lx.version = info.version;
	rc = parse_dict(&lx, hint, &info);
	if (rc)
		return rc;

	info.nelems = 1;
	for (int d = 0; d < info.rank; d++) {
		if (ckpt_mul_u64(info.nelems, info.shape[d], &info.nelems))
			return -EINVAL;
		big += info.shape[d] > 1;
	}
	if (ckpt_mul_u64(info.nelems, ckpt_dtype_get(info.dtype)->itemsize, &info.nbytes))
		return -EINVAL;
	info.data_offset = prefix + hlen;
	if (info.nbytes > (uint64_t)INT64_MAX - info.data_offset)
		return -EINVAL;
	if (info.fortran_order && big > 1 && info.nelems > 0)
		return -EINVAL; /* a real Fortran layout: ckptfs stores C order */
	*out = info;
	return 0;
}
