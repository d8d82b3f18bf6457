/*
 * npz.c - .npy headers of .npz members and member names as key paths
 * (see npz.h).
 */
#include <errno.h>
#include <string.h>

#include "common.h"
#include "npz.h"

static int fail(const char **why, const char *w, int rc)
{
	if (why)
		*why = w;
	return rc;
}

static const char *ws(const char *p, const char *e)
{
	while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
		p++;
	return p;
}

/* A quoted string at p: its body in [*s, *se), past the closing quote. */
static const char *str_lit(const char *p, const char *e, const char **s, const char **se)
{
	if (p >= e || (*p != '\'' && *p != '"'))
		return NULL;
	char q = *p++;
	*s = p;
	while (p < e && *p != q) {
		if (*p == '\\')
			return NULL; /* no escapes in what numpy writes */
		p++;
	}
	if (p >= e)
		return NULL;
	*se = p;
	return p + 1;
}

static int lit_is(const char *s, const char *se, const char *w)
{
	return (size_t)(se - s) == strlen(w) && memcmp(s, w, (size_t)(se - s)) == 0;
}

static int parse_dtype(const char *s, const char *se, struct ckpt_npz_header *h, const char **why)
{
	char d[16];
	size_t n = (size_t)(se - s);
	if (n < 2 || n >= sizeof(d))
		return fail(why, "unsupported descr", -ENOTSUP);
	memcpy(d, s, n);
	d[n] = 0;
	char bo = d[0];
	if (bo != '<' && bo != '>' && bo != '|' && bo != '=')
		return fail(why, "unsupported descr", -ENOTSUP);
	if (strcmp(d + 1, "V2") == 0) {
		h->dtype = CKPT_DT_BFLOAT16;
		h->void2 = 1;
		return 0;
	}
	d[0] = '<';
	h->dtype = ckpt_dtype_from_npy(d, CKPT_DT_INVALID);
	if (h->dtype == CKPT_DT_INVALID)
		return fail(why, "unsupported descr (structured, object, string or unknown type)", -ENOTSUP);
	h->big_endian = bo == '>' && ckpt_dtype_get(h->dtype)->itemsize > 1;
	return 0;
}

static const char *parse_shape(const char *p, const char *e, struct ckpt_npz_header *h)
{
	if (p >= e || *p != '(')
		return NULL;
	p = ws(p + 1, e);
	h->rank = 0;
	while (p < e && *p != ')') {
		if (*p < '0' || *p > '9' || h->rank == CKPT_MAX_RANK)
			return NULL;
		uint64_t v = 0;
		while (p < e && *p >= '0' && *p <= '9') {
			unsigned dig = (unsigned)(*p - '0');
			if (v > (UINT64_C(1) << 62) / 10)
				return NULL;
			v = v * 10 + dig;
			p++;
		}
		if (p < e && *p == 'L')
			p++;
		h->shape[h->rank++] = v;
		p = ws(p, e);
		if (p < e && *p == ',')
			p = ws(p + 1, e);
		else if (p < e && *p != ')')
			return NULL;
	}
	return p < e ? p + 1 : NULL;
}

int ckpt_npz_header_parse(const uint8_t *buf, size_t len, struct ckpt_npz_header *out, size_t *need,
			  const char **why)
{
	memset(out, 0, sizeof(*out));
	static const uint8_t magic[6] = { 0x93, 'N', 'U', 'M', 'P', 'Y' };
	if (len < 10) {
		if (memcmp(buf, magic, len < 6 ? len : 6) != 0)
			return fail(why, "not an .npy header", -EINVAL);
		if (need)
			*need = 12;
		return -EAGAIN;
	}
	if (memcmp(buf, magic, 6) != 0)
		return fail(why, "not an .npy header", -EINVAL);
	uint8_t major = buf[6];
	uint64_t hl, pre;
	if (major == 1) {
		hl = (uint64_t)buf[8] | (uint64_t)buf[9] << 8;
		pre = 10;
	} else if (major == 2 || major == 3) {
		if (len < 12) {
			if (need)
				*need = 12;
			return -EAGAIN;
		}
		hl = ckpt_le32(buf + 8);
		pre = 12;
	} else {
		return fail(why, "unsupported .npy format version", -ENOTSUP);
	}
	if (hl > CKPT_NPZ_MAX_HEADER)
		return fail(why, ".npy header too long", -EINVAL);
	if (len < pre + hl) {
		if (need)
			*need = (size_t)(pre + hl);
		return -EAGAIN;
	}
	const char *p = (const char *)buf + pre, *e = p + hl;
	int have_d = 0, have_f = 0, have_s = 0;
	p = ws(p, e);
	if (p >= e || *p != '{')
		return fail(why, "bad .npy header dict", -EINVAL);
	p = ws(p + 1, e);
	while (p < e && *p != '}') {
		const char *k, *ke;
		if (!(p = str_lit(p, e, &k, &ke)))
			return fail(why, "bad .npy header dict", -EINVAL);
		p = ws(p, e);
		if (p >= e || *p != ':')
			return fail(why, "bad .npy header dict", -EINVAL);
		p = ws(p + 1, e);
		int rc;
		if (lit_is(k, ke, "descr") && !have_d) {
			const char *s, *se;
			if (!(p = str_lit(p, e, &s, &se)))
				return fail(why, "unsupported descr (not a plain string)", -ENOTSUP);
			if ((rc = parse_dtype(s, se, out, why)) < 0)
				return rc;
			have_d = 1;
		} else if (lit_is(k, ke, "fortran_order") && !have_f) {
			if ((size_t)(e - p) >= 4 && memcmp(p, "True", 4) == 0) {
				out->fortran_order = 1;
				p += 4;
			} else if ((size_t)(e - p) >= 5 && memcmp(p, "False", 5) == 0) {
				p += 5;
			} else {
				return fail(why, "bad fortran_order", -EINVAL);
			}
			have_f = 1;
		} else if (lit_is(k, ke, "shape") && !have_s) {
			if (!(p = parse_shape(p, e, out)))
				return fail(why, "bad shape", -EINVAL);
			have_s = 1;
		} else {
			return fail(why, "unexpected or repeated key in the .npy header", -EINVAL);
		}
		p = ws(p, e);
		if (p < e && *p == ',')
			p = ws(p + 1, e);
		else if (p < e && *p != '}')
			return fail(why, "bad .npy header dict", -EINVAL);
	}
	if (p >= e || !have_d || !have_f || !have_s)
		return fail(why, "the .npy header lacks descr, fortran_order or shape", -EINVAL);
	uint64_t nb = ckpt_dtype_get(out->dtype)->itemsize;
	for (int d = 0; d < out->rank; d++)
		if (ckpt_mul_u64(nb, out->shape[d], &nb) < 0 || nb > (UINT64_C(1) << 62))
			return fail(why, "array byte size overflows", -EINVAL);
	out->nbytes = nb;
	out->data_offset = pre + hl;
	return 0;
}

int ckpt_npz_key_path(const char *name, char *buf, size_t cap, const char **comps, int max)
{
	size_t n = strlen(name);
	if (n >= 4 && strcmp(name + n - 4, ".npy") == 0)
		n -= 4;
	if (n == 0 || n >= cap)
		return n ? -ENAMETOOLONG : -EINVAL;
	memcpy(buf, name, n);
	buf[n] = 0;
	int depth = 0;
	char *p = buf;
	for (;;) {
		char *s = strchr(p, '/');
		if (s)
			*s = 0;
		if (!*p || strcmp(p, ".") == 0 || strcmp(p, "..") == 0 || depth == max)
			return depth == max ? -ENAMETOOLONG : -EINVAL;
		comps[depth++] = p;
		if (!s)
			return depth;
		p = s + 1;
	}
}
