/*
 * zarr_meta.c - zarr v2 / v3 array metadata: parse and emit (see zarr_meta.h).
 */
#include "zarr_meta.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TOTAL_BYTES (1ull << 62)

static int fail(const char **why, const char *reason, int rc)
{
	if (why)
		*why = reason;
	return rc;
}

/* ---- JSON helpers ------------------------------------------------------- */

static const cJSON *member(const cJSON *o, const char *key)
{
	return cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
}

/* A non-negative integer exactly representable as a double. */
static int json_u64(const cJSON *v, uint64_t *out)
{
	if (!cJSON_IsNumber(v))
		return -1;
	double d = v->valuedouble;
	if (!(d >= 0) || d > 9007199254740992.0 || floor(d) != d)
		return -1;
	*out = (uint64_t)d;
	return 0;
}

/* A (possibly negative) int within +-2^31. */
static int json_int(const cJSON *v, int *out)
{
	if (!cJSON_IsNumber(v))
		return -1;
	double d = v->valuedouble;
	if (!(d >= -2147483648.0 && d <= 2147483647.0) || floor(d) != d)
		return -1;
	*out = (int)d;
	return 0;
}

static int parse_shape(const cJSON *a, int *rank, uint64_t *dims, int allow_zero, const char **why)
{
	if (!cJSON_IsArray(a))
		return fail(why, "shape/chunks is not a list", -EINVAL);
	int n = cJSON_GetArraySize(a);
	if (n > CKPT_MAX_RANK)
		return fail(why, "rank too large", -EINVAL);
	int i = 0;
	const cJSON *e;
	cJSON_ArrayForEach(e, a)
	{
		if (json_u64(e, &dims[i]) < 0 || (!allow_zero && dims[i] == 0))
			return fail(why, "bad dimension", -EINVAL);
		i++;
	}
	*rank = n;
	return 0;
}

/* ---- fill values -------------------------------------------------------- */

static uint16_t f32_to_bf16(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	if ((u & 0x7fffffff) > 0x7f800000)
		return (uint16_t)((u >> 16) | 0x40);
	u += 0x7fff + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

static float bf16_to_f32(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static uint16_t f32_to_f16(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	uint32_t sign = (u >> 16) & 0x8000;
	int32_t exp = (int32_t)((u >> 23) & 0xff) - 127 + 15;
	uint32_t man = u & 0x7fffff;
	if (((u >> 23) & 0xff) == 0xff)
		return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
	if (exp >= 31)
		return (uint16_t)(sign | 0x7c00);
	if (exp <= 0) {
		if (exp < -10)
			return (uint16_t)sign;
		man |= 0x800000;
		uint32_t shift = (uint32_t)(14 - exp);
		uint32_t half = man >> shift;
		uint32_t rem = man & ((1u << shift) - 1);
		uint32_t mid = 1u << (shift - 1);
		if (rem > mid || (rem == mid && (half & 1)))
			half++;
		return (uint16_t)(sign | half);
	}
	uint32_t h = sign | ((uint32_t)exp << 10) | (man >> 13);
	uint32_t rem = man & 0x1fff;
	if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
		h++;
	return (uint16_t)h;
}

static float f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
	float f;
	if (exp == 0x1f) {
		uint32_t u = sign | 0x7f800000 | (man << 13);
		memcpy(&f, &u, 4);
		return f;
	}
	if (exp == 0) {
		f = ldexpf((float)man, -24);
		return sign ? -f : f;
	}
	uint32_t u = sign | ((exp + 112) << 23) | (man << 13);
	memcpy(&f, &u, 4);
	return f;
}

static void put_le(uint8_t *dst, uint64_t v, unsigned n)
{
	for (unsigned i = 0; i < n && i < 8; i++)
		dst[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *src, unsigned n)
{
	uint64_t v = 0;
	for (unsigned i = 0; i < n && i < 8; i++)
		v |= (uint64_t)src[i] << (8 * i);
	return v;
}

/* "0x<hex digits>": the value's bits. */
static int parse_hex(const char *s, uint64_t *bits)
{
	if (s[0] != '0' || s[1] != 'x' || !s[2] || strlen(s + 2) > 16)
		return -1;
	uint64_t v = 0;
	for (const char *p = s + 2; *p; p++) {
		int d = (*p >= '0' && *p <= '9')   ? *p - '0'
			: (*p >= 'a' && *p <= 'f') ? *p - 'a' + 10
			: (*p >= 'A' && *p <= 'F') ? *p - 'A' + 10
						   : -1;
		if (d < 0)
			return -1;
		v = v << 4 | (uint64_t)d;
	}
	*bits = v;
	return 0;
}

/* ---- the source text of a top-level number ------------------------------
 * cJSON keeps a number only as a double, which cannot hold every 64-bit
 * integer.  For an integer fill value the digits themselves are needed, so
 * the text that cJSON has already accepted is scanned once more for the
 * top-level member `key` (the first one of that name, as cJSON's lookup
 * finds) and, when its value is a number, the token's span is returned.
 * Anything unexpected makes the scan give up (the double is used then). */

struct num_text {
	const char *p;
	size_t n;
};

static const char *ws(const char *p, const char *e)
{
	while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
		p++;
	return p;
}

/* p at '"': the position after the closing quote, or NULL. */
static const char *skip_str(const char *p, const char *e)
{
	for (p++; p < e; p++) {
		if (*p == '\\') {
			p++;
			continue;
		}
		if (*p == '"')
			return p + 1;
	}
	return NULL;
}

static int hexval(char c)
{
	return c >= '0' && c <= '9'   ? c - '0'
	       : c >= 'a' && c <= 'f' ? c - 'a' + 10
	       : c >= 'A' && c <= 'F' ? c - 'A' + 10
				      : -1;
}

/* Whether the JSON string token [p, q) (quotes included) decodes to the
 * ASCII text `want` (simple escapes and \u00XX handled; others differ). */
static int str_is(const char *p, const char *q, const char *want)
{
	for (p++, q--; p < q; want++) {
		int c = (unsigned char)*p++;
		if (c == '\\') {
			if (p >= q)
				return 0;
			c = (unsigned char)*p++;
			if (c == 'u') {
				int v = 0;
				for (int i = 0; i < 4; i++) {
					int h = p < q ? hexval(*p++) : -1;
					if (h < 0)
						return 0;
					v = v * 16 + h;
				}
				if (v == 0 || v > 0x7f)
					return 0;
				c = v;
			} else if (c != '"' && c != '\\' && c != '/') {
				return 0;
			}
		}
		if (!*want || c != (unsigned char)*want)
			return 0;
	}
	return *want == 0;
}

/* Skip one JSON value at p (already whitespace-skipped); NULL on anything odd. */
static const char *skip_val(const char *p, const char *e, int depth)
{
	if (p >= e || depth > 1000)
		return NULL;
	if (*p == '"')
		return skip_str(p, e);
	if (*p == '{' || *p == '[') {
		char close = *p == '{' ? '}' : ']';
		p = ws(p + 1, e);
		if (p < e && *p == close)
			return p + 1;
		for (;;) {
			if (close == '}') {
				if (p >= e || *p != '"' || !(p = skip_str(p, e)))
					return NULL;
				p = ws(p, e);
				if (p >= e || *p != ':')
					return NULL;
				p = ws(p + 1, e);
			}
			if (!(p = skip_val(p, e, depth + 1)))
				return NULL;
			p = ws(p, e);
			if (p < e && *p == ',') {
				p = ws(p + 1, e);
				continue;
			}
			return p < e && *p == close ? p + 1 : NULL;
		}
	}
	const char *s = p;
	while (p < e && (strchr("+-.eE", *p) || (*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z')))
		p++;
	return p > s ? p : NULL;
}

static int top_number_text(const char *json, size_t len, const char *key, struct num_text *out)
{
	const char *e = json + len;
	const char *p = ws(json, e);
	if (len >= 3 && (unsigned char)p[0] == 0xef && (unsigned char)p[1] == 0xbb &&
	    (unsigned char)p[2] == 0xbf)
		p = ws(p + 3, e); /* a UTF-8 byte order mark */
	if (p >= e || *p != '{')
		return -1;
	p = ws(p + 1, e);
	while (p < e && *p == '"') {
		const char *k = p;
		if (!(p = skip_str(p, e)))
			return -1;
		int hit = str_is(k, p, key);
		p = ws(p, e);
		if (p >= e || *p != ':')
			return -1;
		p = ws(p + 1, e);
		const char *v = p;
		if (!(p = skip_val(p, e, 0)))
			return -1;
		if (hit) {
			if (*v != '-' && !(*v >= '0' && *v <= '9'))
				return -1;
			out->p = v;
			out->n = (size_t)(p - v);
			return 0;
		}
		p = ws(p, e);
		if (p >= e || *p != ',')
			return -1;
		p = ws(p + 1, e);
	}
	return -1;
}

/* A JSON integer token (-?digits, no fraction or exponent) as its two's
 * complement bits: 1 when it is one and fits [-2^63, 2^64), 0 when it is
 * not an integer token, -1 when it is one but out of that range. */
static int int_token_bits(const struct num_text *t, uint64_t *bits)
{
	const char *p = t->p, *e = t->p + t->n;
	int neg = p < e && *p == '-';
	p += neg;
	if (p >= e)
		return 0;
	uint64_t v = 0;
	int over = 0;
	for (const char *q = p; q < e; q++) {
		if (*q < '0' || *q > '9')
			return 0;
		unsigned dgt = (unsigned)(*q - '0');
		if (v > (UINT64_MAX - dgt) / 10)
			over = 1;
		else
			v = v * 10 + dgt;
	}
	if (over || (neg && v > (1ull << 63)))
		return -1;
	*bits = neg ? (uint64_t)0 - v : v;
	return 1;
}

/* One scalar fill element of type dt (not complex) from JSON value v into
 * dst; raw, when not NULL, is v's source text (v a top-level number). */
static int parse_scalar_fill(const cJSON *v, const struct num_text *raw, ckpt_dtype dt, uint8_t *dst,
			     int *lossy, const char **why)
{
	const ckpt_dtype_info *di = ckpt_dtype_get(dt);
	double d = 0;
	if (raw && cJSON_IsNumber(v) && (di->kind == 'i' || di->kind == 'u')) {
		/* integers exactly, from their digits: a double holds only 53 bits */
		uint64_t bits;
		int r = int_token_bits(raw, &bits);
		if (r < 0)
			return fail(why, "fill_value out of range for the data type", -EINVAL);
		if (r > 0) {
			put_le(dst, bits, di->itemsize);
			return 0;
		}
	}
	if (cJSON_IsBool(v)) {
		d = cJSON_IsTrue(v) ? 1 : 0;
	} else if (cJSON_IsNumber(v)) {
		d = v->valuedouble;
	} else if (cJSON_IsString(v)) {
		const char *s = v->valuestring;
		uint64_t bits;
		if (strcmp(s, "NaN") == 0)
			d = NAN;
		else if (strcmp(s, "Infinity") == 0)
			d = INFINITY;
		else if (strcmp(s, "-Infinity") == 0)
			d = -INFINITY;
		else if (parse_hex(s, &bits) == 0) {
			put_le(dst, bits, di->itemsize);
			return 0;
		} else {
			return fail(why, "unsupported fill_value string", -ENOTSUP);
		}
	} else {
		return fail(why, "bad fill_value", -EINVAL);
	}
	if (d == 0 && !signbit(d))
		return 0;
	switch (dt) {
	case CKPT_DT_FLOAT32: {
		float f = (float)d;
		memcpy(dst, &f, 4);
		return 0;
	}
	case CKPT_DT_FLOAT64:
		memcpy(dst, &d, 8);
		return 0;
	case CKPT_DT_BFLOAT16:
		put_le(dst, f32_to_bf16((float)d), 2);
		return 0;
	case CKPT_DT_FLOAT16:
		put_le(dst, f32_to_f16((float)d), 2);
		return 0;
	default:
		break;
	}
	if (di->kind == 'b') { /* as numpy casts to bool: any non-zero number is True */
		if (!isfinite(d))
			return fail(why, "fill_value out of range for the data type", -EINVAL);
		put_le(dst, d != 0, di->itemsize);
		return 0;
	}
	if (di->kind == 'i' || di->kind == 'u') {
		/* the value's two's complement bits, truncated to the type */
		uint64_t bits;
		if (d >= -9223372036854775808.0 && d < 9223372036854775808.0)
			bits = (uint64_t)(int64_t)d;
		else if (d >= 0 && d < 18446744073709551616.0)
			bits = (uint64_t)d;
		else
			return fail(why, "fill_value out of range for the data type", -EINVAL);
		put_le(dst, bits, di->itemsize);
		return 0;
	}
	*lossy = 1; /* ml_dtypes floats and small ints: only bit patterns are kept */
	return 0;
}

static int parse_fill(const cJSON *v, const struct num_text *raw, struct ckpt_zarr_meta *m, const char **why)
{
	memset(m->fill, 0, sizeof(m->fill));
	m->fill_null = !v || cJSON_IsNull(v);
	if (m->fill_null)
		return 0;
	if (m->dtype == CKPT_DT_COMPLEX64 || m->dtype == CKPT_DT_COMPLEX128) {
		ckpt_dtype part = m->dtype == CKPT_DT_COMPLEX64 ? CKPT_DT_FLOAT32 : CKPT_DT_FLOAT64;
		unsigned half = ckpt_dtype_get(m->dtype)->itemsize / 2;
		if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 2)
			return fail(why, "bad complex fill_value", -EINVAL);
		int rc =
			parse_scalar_fill(cJSON_GetArrayItem(v, 0), NULL, part, m->fill, &m->fill_lossy, why);
		return rc ? rc
			  : parse_scalar_fill(cJSON_GetArrayItem(v, 1), NULL, part, m->fill + half,
					      &m->fill_lossy, why);
	}
	return parse_scalar_fill(v, raw, m->dtype, m->fill, &m->fill_lossy, why);
}

/* ---- codecs ------------------------------------------------------------- */

static void chain_free(struct ckpt_zarr_chain *c);

static void codec_free(struct ckpt_zarr_codec *c)
{
	if (c->sharding) {
		chain_free(&c->sharding->codecs);
		chain_free(&c->sharding->index_codecs);
		free(c->sharding);
		c->sharding = NULL;
	}
}

static void chain_free(struct ckpt_zarr_chain *c)
{
	codec_free(&c->a2b);
}

static const cJSON *conf(const cJSON *codec, const char *key)
{
	return member(member(codec, "configuration"), key);
}

static int kind_of(enum ckpt_zarr_codec_id id)
{
	switch (id) {
	case CKPT_CODEC_TRANSPOSE:
		return 0;
	case CKPT_CODEC_BYTES:
	case CKPT_CODEC_SHARDING:
		return 1;
	default:
		return 2;
	}
}

static int parse_chain(const cJSON *codecs, int rank, const uint64_t *chunk, int depth,
		       struct ckpt_zarr_chain *ch, const char **why);

static int parse_sharding(const cJSON *c, int rank, const uint64_t *chunk, int depth,
			  struct ckpt_zarr_codec *out, const char **why)
{
	if (depth >= CKPT_ZARR_MAX_NESTING)
		return fail(why, "sharding nested too deep", -ENOTSUP);
	struct ckpt_zarr_sharding *sh = calloc(1, sizeof(*sh));
	if (!sh)
		return fail(why, "out of memory", -ENOMEM);
	out->sharding = sh;
	int irank, rc;
	if ((rc = parse_shape(conf(c, "chunk_shape"), &irank, sh->chunk_shape, 0, why)) < 0)
		return rc;
	if (irank != rank)
		return fail(why, "inner chunk_shape rank differs", -EINVAL);
	for (int d = 0; d < rank; d++)
		if (chunk[d] % sh->chunk_shape[d])
			return fail(why, "shard shape not a multiple of the inner chunk shape", -EINVAL);
	if ((rc = parse_chain(conf(c, "codecs"), rank, sh->chunk_shape, depth + 1, &sh->codecs, why)) < 0)
		return rc;
	const cJSON *ic = conf(c, "index_codecs");
	if (ic) {
		/* the index is a [n..., 2] uint64 array */
		uint64_t ishape[CKPT_MAX_RANK + 1];
		for (int d = 0; d < rank; d++)
			ishape[d] = chunk[d] / sh->chunk_shape[d];
		ishape[rank] = 2;
		if ((rc = parse_chain(ic, rank + 1, ishape, CKPT_ZARR_MAX_NESTING, &sh->index_codecs, why)) <
		    0)
			return rc;
	}
	const cJSON *loc = conf(c, "index_location");
	if (cJSON_IsString(loc) && strcmp(loc->valuestring, "start") == 0)
		sh->index_at_start = 1;
	else if (loc && !(cJSON_IsString(loc) && strcmp(loc->valuestring, "end") == 0))
		return fail(why, "bad index_location", -EINVAL);
	return 0;
}

/* zarr-python's numcodecs.zarr3 wrappers: "numcodecs.<id>" whose
 * configuration is the numcodecs codec's (without its id); the stored bytes
 * are those of the numcodecs codec. */
static int parse_numcodecs_v3(const cJSON *c, const char *id, struct ckpt_zarr_codec *out, const char **why)
{
	out->numcodecs = 1;
	if (strcmp(id, "zlib") == 0 || strcmp(id, "gzip") == 0 || strcmp(id, "bz2") == 0 ||
	    strcmp(id, "lz4") == 0) {
		out->id = id[0] == 'z'	 ? CKPT_CODEC_ZLIB
			  : id[0] == 'g' ? CKPT_CODEC_GZIP
			  : id[0] == 'b' ? CKPT_CODEC_BZ2
					 : CKPT_CODEC_LZ4;
		const cJSON *l = conf(c, out->id == CKPT_CODEC_LZ4 ? "acceleration" : "level");
		if (l && json_int(l, &out->level) < 0)
			return fail(why, "bad compression level", -EINVAL);
		return 0;
	}
	if (strcmp(id, "zstd") == 0) {
		out->id = CKPT_CODEC_ZSTD;
		const cJSON *l = conf(c, "level");
		if (l && json_int(l, &out->level) < 0)
			return fail(why, "bad compression level", -EINVAL);
		out->checksum = cJSON_IsTrue(conf(c, "checksum"));
		return 0;
	}
	if (strcmp(id, "blosc") == 0) {
		out->id = CKPT_CODEC_BLOSC;
		const cJSON *cn = conf(c, "cname"), *cl = conf(c, "clevel"), *sh = conf(c, "shuffle");
		const cJSON *ts = conf(c, "typesize"), *bs = conf(c, "blocksize");
		uint64_t t = 0;
		if ((cn && (!cJSON_IsString(cn) || strlen(cn->valuestring) >= sizeof(out->cname))) ||
		    (cl && json_int(cl, &out->level) < 0) ||
		    (sh && (json_int(sh, &out->shuffle) < 0 || out->shuffle < -1 || out->shuffle > 2)) ||
		    (ts && (json_u64(ts, &t) < 0 || t > 255)) || (bs && json_u64(bs, &out->blocksize) < 0))
			return fail(why, "bad numcodecs.blosc configuration", -EINVAL);
		snprintf(out->cname, sizeof(out->cname), "%s", cn ? cn->valuestring : "lz4");
		if (!cl)
			out->level = 5;
		if (!sh)
			out->shuffle = 1;
		out->typesize = (int)t;
		return 0;
	}
	if (strcmp(id, "crc32c") == 0) {
		const cJSON *loc = conf(c, "location");
		if (loc && !(cJSON_IsString(loc) && strcmp(loc->valuestring, "end") == 0))
			return fail(why,
				    "numcodecs.crc32c with its checksum before the data is not supported",
				    -ENOTSUP);
		out->id = CKPT_CODEC_CRC32C;
		return 0;
	}
	return fail(why, "unsupported codec", -ENOTSUP);
}

static int parse_codec(const cJSON *c, int rank, const uint64_t *chunk, int depth,
		       struct ckpt_zarr_codec *out, const char **why)
{
	const cJSON *nm = member(c, "name");
	if (!cJSON_IsString(nm))
		return fail(why, "codec without a name", -EINVAL);
	const char *n = nm->valuestring;
	memset(out, 0, sizeof(*out));
	if (strcmp(n, "transpose") == 0) {
		out->id = CKPT_CODEC_TRANSPOSE;
		const cJSON *o = conf(c, "order");
		int seen[CKPT_MAX_RANK + 1] = { 0 }, i = 0;
		if (!cJSON_IsArray(o) || cJSON_GetArraySize(o) != rank)
			return fail(why, "transpose order is not a permutation of the dimensions", -EINVAL);
		const cJSON *e;
		cJSON_ArrayForEach(e, o)
		{
			int v;
			if (json_int(e, &v) < 0 || v < 0 || v >= rank || seen[v]++)
				return fail(why, "transpose order is not a permutation of the dimensions",
					    -EINVAL);
			out->order[i++] = v;
		}
	} else if (strcmp(n, "bytes") == 0) {
		out->id = CKPT_CODEC_BYTES;
		const cJSON *e = conf(c, "endian");
		if (!e)
			out->endian = CKPT_ENDIAN_NONE;
		else if (cJSON_IsString(e) && strcmp(e->valuestring, "little") == 0)
			out->endian = CKPT_ENDIAN_LITTLE;
		else if (cJSON_IsString(e) && strcmp(e->valuestring, "big") == 0)
			out->endian = CKPT_ENDIAN_BIG;
		else
			return fail(why, "bad endian", -EINVAL);
	} else if (strcmp(n, "sharding_indexed") == 0) {
		out->id = CKPT_CODEC_SHARDING;
		return parse_sharding(c, rank, chunk, depth, out, why);
	} else if (strcmp(n, "zstd") == 0 || strcmp(n, "gzip") == 0) {
		out->id = n[0] == 'z' ? CKPT_CODEC_ZSTD : CKPT_CODEC_GZIP;
		const cJSON *l = conf(c, "level"), *ck = conf(c, "checksum");
		if (l && json_int(l, &out->level) < 0)
			return fail(why, "bad compression level", -EINVAL);
		out->checksum = cJSON_IsTrue(ck);
	} else if (strcmp(n, "blosc") == 0) {
		out->id = CKPT_CODEC_BLOSC;
		const cJSON *cn = conf(c, "cname"), *cl = conf(c, "clevel"), *sh = conf(c, "shuffle");
		const cJSON *ts = conf(c, "typesize"), *bs = conf(c, "blocksize");
		uint64_t t = 0;
		if (!cJSON_IsString(cn) || strlen(cn->valuestring) >= sizeof(out->cname) ||
		    (cl && json_int(cl, &out->level) < 0) || (ts && (json_u64(ts, &t) < 0 || t > 255)) ||
		    (bs && json_u64(bs, &out->blocksize) < 0))
			return fail(why, "bad blosc configuration", -EINVAL);
		strcpy(out->cname, cn->valuestring);
		out->typesize = (int)t;
		if (!sh || (cJSON_IsString(sh) && strcmp(sh->valuestring, "noshuffle") == 0))
			out->shuffle = 0;
		else if (cJSON_IsString(sh) && strcmp(sh->valuestring, "shuffle") == 0)
			out->shuffle = 1;
		else if (cJSON_IsString(sh) && strcmp(sh->valuestring, "bitshuffle") == 0)
			out->shuffle = 2;
		else
			return fail(why, "bad blosc shuffle", -EINVAL);
	} else if (strcmp(n, "crc32c") == 0) {
		out->id = CKPT_CODEC_CRC32C;
	} else if (strncmp(n, "numcodecs.", 10) == 0) {
		return parse_numcodecs_v3(c, n + 10, out, why);
	} else {
		return fail(why, "unsupported codec", -ENOTSUP);
	}
	return 0;
}

/* Remember which name was not supported (for the caller's log line). */
static void note_unsupported(struct ckpt_zarr_meta *m, const cJSON *name)
{
	if (cJSON_IsString(name) && !m->unsupported[0])
		snprintf(m->unsupported, sizeof(m->unsupported), "%s", name->valuestring);
}

/* The first codec name of a chain (or of a nested sharding chain) that
 * parse_codec does not know. */
static const cJSON *unknown_codec(const cJSON *codecs, int depth)
{
	static const char *const known[] = { "transpose",
					     "bytes",
					     "sharding_indexed",
					     "zstd",
					     "gzip",
					     "blosc",
					     "crc32c",
					     "numcodecs.zlib",
					     "numcodecs.gzip",
					     "numcodecs.bz2",
					     "numcodecs.lz4",
					     "numcodecs.zstd",
					     "numcodecs.blosc",
					     "numcodecs.crc32c" };
	const cJSON *c;
	if (!cJSON_IsArray(codecs) || depth > CKPT_ZARR_MAX_NESTING)
		return NULL;
	cJSON_ArrayForEach(c, codecs)
	{
		const cJSON *nm = member(c, "name");
		if (!cJSON_IsString(nm))
			continue;
		size_t i = 0;
		while (i < sizeof(known) / sizeof(known[0]) && strcmp(known[i], nm->valuestring))
			i++;
		if (i == sizeof(known) / sizeof(known[0]))
			return nm;
		const cJSON *in = unknown_codec(conf(c, "codecs"), depth + 1);
		if (!in)
			in = unknown_codec(conf(c, "index_codecs"), depth + 1);
		if (in)
			return in;
	}
	return NULL;
}

/* [array->array..., array->bytes, bytes->bytes...] */
static int parse_chain(const cJSON *codecs, int rank, const uint64_t *chunk, int depth,
		       struct ckpt_zarr_chain *ch, const char **why)
{
	if (!cJSON_IsArray(codecs) || cJSON_GetArraySize(codecs) < 1)
		return fail(why, "codecs is not a non-empty list", -EINVAL);
	const cJSON *c;
	cJSON_ArrayForEach(c, codecs)
	{
		struct ckpt_zarr_codec x = { 0 };
		int rc = parse_codec(c, rank, chunk, depth, &x, why);
		if (rc < 0) {
			codec_free(&x);
			return rc;
		}
		int k = kind_of(x.id), have_a2b = ch->a2b.id != CKPT_CODEC_NONE;
		if ((k == 0 && have_a2b) || (k == 1 && have_a2b) || (k == 2 && !have_a2b)) {
			codec_free(&x);
			return fail(why, "codecs out of order (array->array, array->bytes, bytes->bytes)",
				    k == 1 ? -EINVAL : -ENOTSUP);
		}
		if ((k == 0 && ch->na2a >= CKPT_ZARR_MAX_A2A) || (k == 2 && ch->nb2b >= CKPT_ZARR_MAX_B2B)) {
			codec_free(&x);
			return fail(why, "too many codecs", -ENOTSUP);
		}
		if (k == 0)
			ch->a2a[ch->na2a++] = x;
		else if (k == 1)
			ch->a2b = x;
		else
			ch->b2b[ch->nb2b++] = x;
	}
	if (ch->a2b.id == CKPT_CODEC_NONE)
		return fail(why, "no array->bytes codec", -EINVAL);
	return 0;
}

/* ---- parse -------------------------------------------------------------- */

static int check_size(const struct ckpt_zarr_meta *m, const char **why)
{
	uint64_t n = ckpt_dtype_get(m->dtype)->itemsize;
	for (int d = 0; d < m->rank; d++)
		if (ckpt_mul_u64(n, m->shape[d], &n) < 0 || n > MAX_TOTAL_BYTES)
			return fail(why, "array byte size overflows", -EINVAL);
	return 0;
}

static int parse_v2(const cJSON *root, const struct num_text *fraw, struct ckpt_zarr_meta *m,
		    const char **why)
{
	const cJSON *fmt = member(root, "zarr_format");
	if (!cJSON_IsNumber(fmt) || fmt->valuedouble != 2)
		return fail(why, "zarr_format is not 2", -EINVAL);
	m->zarr_format = 2;
	int rc, crank;
	if ((rc = parse_shape(member(root, "shape"), &m->rank, m->shape, 1, why)) < 0)
		return rc;
	if ((rc = parse_shape(member(root, "chunks"), &crank, m->chunk_shape, 0, why)) < 0)
		return rc;
	if (crank != m->rank)
		return fail(why, "chunks rank differs from shape rank", -EINVAL);
	const cJSON *dt = member(root, "dtype");
	if (!cJSON_IsString(dt))
		return fail(why, "dtype missing or structured", -ENOTSUP);
	int big = 0;
	m->dtype = ckpt_dtype_from_zarr2(dt->valuestring, &big);
	if (m->dtype == CKPT_DT_INVALID) {
		note_unsupported(m, dt);
		return fail(why, "unsupported dtype", -ENOTSUP);
	}
	struct ckpt_zarr_chain *ch = &m->codecs;
	const cJSON *order = member(root, "order");
	if (cJSON_IsString(order) && strcmp(order->valuestring, "F") == 0) {
		if (m->rank > 1) {
			struct ckpt_zarr_codec *t = &ch->a2a[ch->na2a++];
			t->id = CKPT_CODEC_TRANSPOSE;
			for (int d = 0; d < m->rank; d++)
				t->order[d] = m->rank - 1 - d;
		}
	} else if (order && !(cJSON_IsString(order) && strcmp(order->valuestring, "C") == 0)) {
		return fail(why, "bad order", -EINVAL);
	}
	ch->a2b.id = CKPT_CODEC_BYTES;
	ch->a2b.endian = big					  ? CKPT_ENDIAN_BIG
			 : ckpt_dtype_get(m->dtype)->itemsize > 1 ? CKPT_ENDIAN_LITTLE
								  : CKPT_ENDIAN_NONE;
	const cJSON *comp = member(root, "compressor");
	if (comp && !cJSON_IsNull(comp)) {
		const cJSON *id = member(comp, "id");
		struct ckpt_zarr_codec *c = &ch->b2b[ch->nb2b++];
		if (!cJSON_IsString(id))
			return fail(why, "compressor without an id", -EINVAL);
		if (strcmp(id->valuestring, "zstd") == 0 || strcmp(id->valuestring, "gzip") == 0) {
			c->id = id->valuestring[0] == 'z' ? CKPT_CODEC_ZSTD : CKPT_CODEC_GZIP;
			const cJSON *l = member(comp, "level");
			if (l && json_int(l, &c->level) < 0)
				return fail(why, "bad compression level", -EINVAL);
			c->checksum = cJSON_IsTrue(member(comp, "checksum"));
		} else if (strcmp(id->valuestring, "blosc") == 0) {
			c->id = CKPT_CODEC_BLOSC;
			const cJSON *cn = member(comp, "cname"), *cl = member(comp, "clevel");
			const cJSON *sh = member(comp, "shuffle"), *bs = member(comp, "blocksize");
			if (!cJSON_IsString(cn) || strlen(cn->valuestring) >= sizeof(c->cname) ||
			    (cl && json_int(cl, &c->level) < 0) ||
			    (sh && (json_int(sh, &c->shuffle) < 0 || c->shuffle < -1 || c->shuffle > 2)) ||
			    (bs && json_u64(bs, &c->blocksize) < 0))
				return fail(why, "bad blosc configuration", -EINVAL);
			strcpy(c->cname, cn->valuestring);
			c->typesize = (int)ckpt_dtype_get(m->dtype)->itemsize;
		} else if (strcmp(id->valuestring, "zlib") == 0 || strcmp(id->valuestring, "bz2") == 0 ||
			   strcmp(id->valuestring, "lz4") == 0) {
			c->id = id->valuestring[0] == 'z'   ? CKPT_CODEC_ZLIB
				: id->valuestring[0] == 'b' ? CKPT_CODEC_BZ2
							    : CKPT_CODEC_LZ4;
			const cJSON *l = member(comp, c->id == CKPT_CODEC_LZ4 ? "acceleration" : "level");
			if (l && json_int(l, &c->level) < 0)
				return fail(why, "bad compression level", -EINVAL);
		} else if (strcmp(id->valuestring, CKPT_ZARR_RAW_DEFLATE_ID) == 0) {
			c->id = CKPT_CODEC_RAW_DEFLATE;
			const cJSON *sk = member(comp, "skip");
			uint64_t v = 0;
			if (sk && (json_u64(sk, &v) < 0 || v > CKPT_ZARR_MAX_SKIP))
				return fail(why, "bad skip of " CKPT_ZARR_RAW_DEFLATE_ID, -EINVAL);
			c->skip = (uint32_t)v;
			const cJSON *cr = member(comp, "crc32");
			if (cr) {
				if (json_u64(cr, &v) < 0 || v > UINT32_MAX)
					return fail(why, "bad crc32 of " CKPT_ZARR_RAW_DEFLATE_ID, -EINVAL);
				c->has_crc32 = 1;
				c->crc32 = (uint32_t)v;
			}
		} else if (strcmp(id->valuestring, "crc32c") == 0) {
			/* numcodecs CRC32C: the checksum after the data, as zarr v3's crc32c */
			const cJSON *loc = member(comp, "location");
			if (loc && !(cJSON_IsString(loc) && strcmp(loc->valuestring, "end") == 0)) {
				note_unsupported(m, id);
				return fail(why, "a checksum before the data is not supported", -ENOTSUP);
			}
			c->id = CKPT_CODEC_CRC32C;
		} else {
			note_unsupported(m, id);
			return fail(why, "unsupported compressor", -ENOTSUP);
		}
	}
	const cJSON *filters = member(root, "filters");
	if (filters && !cJSON_IsNull(filters) &&
	    !(cJSON_IsArray(filters) && cJSON_GetArraySize(filters) == 0)) {
		note_unsupported(m, member(cJSON_GetArrayItem(filters, 0), "id"));
		return fail(why, "filters are not supported", -ENOTSUP);
	}
	const cJSON *zc = member(root, "ckptfs.zip_crc32");
	if (zc) {
		uint64_t c = 0, h = 0;
		const cJSON *cj = member(zc, "crc32"), *hj = member(zc, "head_crc32");
		if (!cj || !hj || json_u64(cj, &c) < 0 || json_u64(hj, &h) < 0 || c > UINT32_MAX ||
		    h > UINT32_MAX)
			return fail(why, "bad ckptfs.zip_crc32", -EINVAL);
		m->zip_has_crc = 1;
		m->zip_crc32 = (uint32_t)c;
		m->zip_head_crc32 = (uint32_t)h;
	}
	m->key_encoding = CKPT_ZARR_KEYS_V2;
	m->sep = '.';
	const cJSON *sep = member(root, "dimension_separator");
	if (cJSON_IsString(sep)) {
		if (strcmp(sep->valuestring, "/") == 0)
			m->sep = '/';
		else if (strcmp(sep->valuestring, ".") != 0)
			return fail(why, "bad dimension_separator", -EINVAL);
	}
	if ((rc = check_size(m, why)) < 0)
		return rc;
	return parse_fill(member(root, "fill_value"), fraw, m, why);
}

static int parse_v3(const cJSON *root, const struct num_text *fraw, struct ckpt_zarr_meta *m,
		    const char **why)
{
	const cJSON *fmt = member(root, "zarr_format");
	if (!cJSON_IsNumber(fmt) || fmt->valuedouble != 3)
		return fail(why, "zarr_format is not 3", -EINVAL);
	const cJSON *nt = member(root, "node_type");
	if (!cJSON_IsString(nt) || strcmp(nt->valuestring, "array") != 0)
		return fail(why, "node_type is not array", -EINVAL);
	m->zarr_format = 3;
	int rc, crank;
	if ((rc = parse_shape(member(root, "shape"), &m->rank, m->shape, 1, why)) < 0)
		return rc;
	const cJSON *grid = member(root, "chunk_grid");
	const cJSON *gname = member(grid, "name");
	if (!cJSON_IsString(gname) || strcmp(gname->valuestring, "regular") != 0)
		return fail(why, "chunk_grid is not regular", -ENOTSUP);
	if ((rc = parse_shape(conf(grid, "chunk_shape"), &crank, m->chunk_shape, 0, why)) < 0)
		return rc;
	if (crank != m->rank)
		return fail(why, "chunk_shape rank differs from shape rank", -EINVAL);
	const cJSON *dt = member(root, "data_type");
	m->dtype = cJSON_IsString(dt) ? ckpt_dtype_from_name(dt->valuestring) : CKPT_DT_INVALID;
	if (m->dtype == CKPT_DT_INVALID) {
		note_unsupported(m, dt);
		return fail(why, "unsupported data_type", -ENOTSUP);
	}
	const cJSON *enc = member(root, "chunk_key_encoding");
	const cJSON *ename = member(enc, "name");
	if (!cJSON_IsString(ename))
		return fail(why, "chunk_key_encoding missing", -EINVAL);
	if (strcmp(ename->valuestring, "default") == 0) {
		m->key_encoding = CKPT_ZARR_KEYS_DEFAULT;
		m->sep = '/';
	} else if (strcmp(ename->valuestring, "v2") == 0) {
		m->key_encoding = CKPT_ZARR_KEYS_V2;
		m->sep = '.';
	} else {
		return fail(why, "unsupported chunk_key_encoding", -ENOTSUP);
	}
	const cJSON *sep = conf(enc, "separator");
	if (cJSON_IsString(sep)) {
		if (strcmp(sep->valuestring, "/") == 0 || strcmp(sep->valuestring, ".") == 0)
			m->sep = sep->valuestring[0];
		else
			return fail(why, "bad chunk key separator", -EINVAL);
	}
	if ((rc = parse_chain(member(root, "codecs"), m->rank, m->chunk_shape, 0, &m->codecs, why)) < 0) {
		if (rc == -ENOTSUP)
			note_unsupported(m, unknown_codec(member(root, "codecs"), 0));
		return rc;
	}
	const cJSON *st = member(root, "storage_transformers");
	if (st && !(cJSON_IsArray(st) && cJSON_GetArraySize(st) == 0))
		return fail(why, "storage_transformers are not supported", -ENOTSUP);
	const cJSON *dn = member(root, "dimension_names");
	if (dn && !cJSON_IsNull(dn)) {
		if (!cJSON_IsArray(dn) || cJSON_GetArraySize(dn) != m->rank)
			return fail(why, "dimension_names is not a list of rank entries", -EINVAL);
		m->dim_names = calloc((size_t)(m->rank ? m->rank : 1), sizeof(char *));
		if (!m->dim_names)
			return fail(why, "out of memory", -ENOMEM);
		int i = 0;
		const cJSON *e;
		cJSON_ArrayForEach(e, dn)
		{
			if (cJSON_IsString(e)) {
				if (!(m->dim_names[i] = strdup(e->valuestring)))
					return fail(why, "out of memory", -ENOMEM);
			} else if (!cJSON_IsNull(e)) {
				return fail(why, "a dimension name is neither a string nor null", -EINVAL);
			}
			i++;
		}
	}
	if ((rc = check_size(m, why)) < 0)
		return rc;
	return parse_fill(member(root, "fill_value"), fraw, m, why);
}

int ckpt_zarr_meta_parse(const char *json, size_t len, int zarr_format, struct ckpt_zarr_meta *m,
			 const char **why)
{
	memset(m, 0, sizeof(*m));
	if (why)
		*why = "";
	if (zarr_format != 2 && zarr_format != 3)
		return fail(why, "unknown zarr_format", -EINVAL);
	cJSON *root = cJSON_ParseWithLength(json, len);
	if (!root || !cJSON_IsObject(root)) {
		cJSON_Delete(root);
		return fail(why, "invalid JSON", -EINVAL);
	}
	/* the fill value's digits, when it is a number: checked against cJSON's
	 * reading of it, so a scan that went astray is never believed */
	struct num_text ft, *fraw = NULL;
	const cJSON *fv = member(root, "fill_value");
	if (cJSON_IsNumber(fv) && top_number_text(json, len, "fill_value", &ft) == 0 && ft.n < 64) {
		char b[64];
		memcpy(b, ft.p, ft.n);
		b[ft.n] = 0;
		char *end;
		double d = strtod(b, &end);
		if (*end == 0 && (d == fv->valuedouble || (isinf(d) && isinf(fv->valuedouble))))
			fraw = &ft;
	}
	int rc = zarr_format == 2 ? parse_v2(root, fraw, m, why) : parse_v3(root, fraw, m, why);
	cJSON_Delete(root);
	return rc;
}

void ckpt_zarr_meta_free(struct ckpt_zarr_meta *m)
{
	if (!m)
		return;
	chain_free(&m->codecs);
	if (m->dim_names)
		for (int i = 0; i < m->rank; i++)
			free(m->dim_names[i]);
	free(m->dim_names);
	memset(m, 0, sizeof(*m));
}

const struct ckpt_zarr_chain *ckpt_zarr_meta_unit_chain(const struct ckpt_zarr_meta *m, uint64_t *unit_shape)
{
	const struct ckpt_zarr_chain *c = &m->codecs;
	memcpy(unit_shape, m->chunk_shape, sizeof(uint64_t) * (size_t)m->rank);
	while (c->a2b.id == CKPT_CODEC_SHARDING && c->a2b.sharding) {
		memcpy(unit_shape, c->a2b.sharding->chunk_shape, sizeof(uint64_t) * (size_t)m->rank);
		c = &c->a2b.sharding->codecs;
	}
	return c;
}

int ckpt_zarr_meta_init_sharded_zstd(struct ckpt_zarr_meta *m, ckpt_dtype dtype, int rank,
				     const uint64_t *shape, const uint64_t *shard_shape,
				     const uint64_t *inner_shape, int zstd_level)
{
	memset(m, 0, sizeof(*m));
	if (!ckpt_dtype_get(dtype) || rank < 0 || rank > CKPT_MAX_RANK)
		return -EINVAL;
	struct ckpt_zarr_sharding *sh = calloc(1, sizeof(*sh));
	if (!sh)
		return -ENOMEM;
	m->zarr_format = 3;
	m->dtype = dtype;
	m->rank = rank;
	m->key_encoding = CKPT_ZARR_KEYS_DEFAULT;
	m->sep = '/';
	for (int d = 0; d < rank; d++) {
		m->shape[d] = shape[d];
		m->chunk_shape[d] = shard_shape[d];
		sh->chunk_shape[d] = inner_shape[d];
	}
	m->codecs.a2b.id = CKPT_CODEC_SHARDING;
	m->codecs.a2b.sharding = sh;
	sh->codecs.a2b.id = CKPT_CODEC_BYTES;
	sh->codecs.a2b.endian = CKPT_ENDIAN_LITTLE;
	sh->codecs.nb2b = 1;
	sh->codecs.b2b[0].id = CKPT_CODEC_ZSTD;
	sh->codecs.b2b[0].level = zstd_level;
	sh->codecs.b2b[0].checksum = 1;
	sh->index_codecs.a2b.id = CKPT_CODEC_BYTES;
	sh->index_codecs.a2b.endian = CKPT_ENDIAN_LITTLE;
	sh->index_codecs.nb2b = 1;
	sh->index_codecs.b2b[0].id = CKPT_CODEC_CRC32C;
	return 0;
}

/* ---- emit --------------------------------------------------------------- */

/* Builders record a failed allocation in *bad instead of dropping a member. */
static void put(cJSON *o, const char *k, cJSON *v, int *bad)
{
	if (!o || !v || !cJSON_AddItemToObject(o, k, v)) {
		cJSON_Delete(v);
		*bad = 1;
	}
}

static void push(cJSON *a, cJSON *v, int *bad)
{
	if (!a || !v || !cJSON_AddItemToArray(a, v)) {
		cJSON_Delete(v);
		*bad = 1;
	}
}

static cJSON *raw_u64(uint64_t v)
{
	char b[24];
	snprintf(b, sizeof(b), "%" PRIu64, v);
	return cJSON_CreateRaw(b);
}

static cJSON *raw_int(long long v)
{
	char b[24];
	snprintf(b, sizeof(b), "%lld", v);
	return cJSON_CreateRaw(b);
}

static cJSON *shape_json(const uint64_t *v, int n, int *bad)
{
	cJSON *a = cJSON_CreateArray();
	for (int i = 0; a && i < n; i++)
		push(a, raw_u64(v[i]), bad);
	return a;
}

/* {"configuration": cf, "name": name}; an empty cf is left out. */
static cJSON *named(const char *name, cJSON *cf, int *bad)
{
	cJSON *c = cJSON_CreateObject();
	if (cf && cf->child)
		put(c, "configuration", cf, bad);
	else
		cJSON_Delete(cf);
	put(c, "name", cJSON_CreateString(name), bad);
	return c;
}

static cJSON *hex_json(uint64_t bits, unsigned bytes)
{
	char b[24];
	snprintf(b, sizeof(b), "0x%0*" PRIx64, (int)(2 * bytes), bits);
	return cJSON_CreateString(b);
}

/* A float value: "NaN" / "Infinity" / number; NaNs other than the one "NaN"
 * parses to are written as their bits. */
static cJSON *float_json(double d, uint64_t bits, unsigned size, int digits, uint64_t canon_nan)
{
	char b[40];
	if (isnan(d))
		return bits == canon_nan ? cJSON_CreateString("NaN") : hex_json(bits, size);
	if (isinf(d))
		return cJSON_CreateString(d > 0 ? "Infinity" : "-Infinity");
	snprintf(b, sizeof(b), "%.*g", digits, d);
	return cJSON_CreateRaw(b);
}

static cJSON *scalar_fill_json(ckpt_dtype dt, const uint8_t *p)
{
	const ckpt_dtype_info *di = ckpt_dtype_get(dt);
	uint64_t bits = get_le(p, di->itemsize);
	if (bits == 0) {
		/* what TensorStore prints for a zero fill value */
		switch (di->kind) {
		case 'b':
			return cJSON_CreateFalse();
		case 'i':
		case 'u':
			return cJSON_CreateRaw("0");
		case 'V':
			return cJSON_CreateRaw(strncmp(di->name, "int", 3) == 0 ||
							       strncmp(di->name, "uint", 4) == 0
						       ? "0"
						       : "0.0");
		default:
			return cJSON_CreateRaw("0.0");
		}
	}
	switch (dt) {
	case CKPT_DT_FLOAT64: {
		double d, cn = NAN;
		uint64_t cb;
		memcpy(&d, p, 8);
		memcpy(&cb, &cn, 8);
		return float_json(d, bits, 8, 17, cb);
	}
	case CKPT_DT_FLOAT32: {
		float f, cn = (float)NAN;
		uint32_t cb;
		memcpy(&f, p, 4);
		memcpy(&cb, &cn, 4);
		return float_json(f, bits, 4, 9, cb);
	}
	case CKPT_DT_BFLOAT16:
		return float_json(bf16_to_f32((uint16_t)bits), bits, 2, 9, f32_to_bf16((float)NAN));
	case CKPT_DT_FLOAT16:
		return float_json(f16_to_f32((uint16_t)bits), bits, 2, 9, f32_to_f16((float)NAN));
	default:
		break;
	}
	if (di->kind == 'b')
		return cJSON_CreateBool(bits != 0);
	/* integers as their exact decimal digits (parsed back from the digits) */
	if (di->kind == 'i') {
		unsigned sh = 64 - 8 * di->itemsize;
		return raw_int((int64_t)(bits << sh) >> sh);
	}
	if (di->kind == 'u')
		return raw_u64(bits);
	return hex_json(bits, di->itemsize);
}

static cJSON *fill_json(const struct ckpt_zarr_meta *m, int *bad)
{
	if (m->fill_null)
		return cJSON_CreateNull();
	if (m->dtype == CKPT_DT_COMPLEX64 || m->dtype == CKPT_DT_COMPLEX128) {
		ckpt_dtype part = m->dtype == CKPT_DT_COMPLEX64 ? CKPT_DT_FLOAT32 : CKPT_DT_FLOAT64;
		unsigned half = ckpt_dtype_get(m->dtype)->itemsize / 2;
		cJSON *a = cJSON_CreateArray();
		push(a, scalar_fill_json(part, m->fill), bad);
		push(a, scalar_fill_json(part, m->fill + half), bad);
		return a;
	}
	return scalar_fill_json(m->dtype, m->fill);
}

static cJSON *chain_json(const struct ckpt_zarr_chain *ch, int rank, int *bad);

/* A codec parsed from a "numcodecs.<id>" name, written back the same way. */
static cJSON *numcodecs_json(const struct ckpt_zarr_codec *c, cJSON *cf, int *bad)
{
	switch (c->id) {
	case CKPT_CODEC_ZLIB:
	case CKPT_CODEC_GZIP:
	case CKPT_CODEC_BZ2:
		put(cf, "level", raw_int(c->level), bad);
		return named(c->id == CKPT_CODEC_ZLIB	? "numcodecs.zlib"
			     : c->id == CKPT_CODEC_GZIP ? "numcodecs.gzip"
							: "numcodecs.bz2",
			     cf, bad);
	case CKPT_CODEC_LZ4:
		put(cf, "acceleration", raw_int(c->level), bad);
		return named("numcodecs.lz4", cf, bad);
	case CKPT_CODEC_ZSTD:
		put(cf, "checksum", cJSON_CreateBool(c->checksum), bad);
		put(cf, "level", raw_int(c->level), bad);
		return named("numcodecs.zstd", cf, bad);
	case CKPT_CODEC_BLOSC:
		put(cf, "blocksize", raw_u64(c->blocksize), bad);
		put(cf, "clevel", raw_int(c->level), bad);
		put(cf, "cname", cJSON_CreateString(c->cname), bad);
		put(cf, "shuffle", raw_int(c->shuffle), bad);
		if (c->typesize)
			put(cf, "typesize", raw_int(c->typesize), bad);
		return named("numcodecs.blosc", cf, bad);
	case CKPT_CODEC_CRC32C:
		return named("numcodecs.crc32c", cf, bad);
	default:
		cJSON_Delete(cf);
		*bad = 1;
		return NULL;
	}
}

static cJSON *codec_json(const struct ckpt_zarr_codec *c, int rank, int *bad)
{
	static const char *const shuffles[] = { "noshuffle", "shuffle", "bitshuffle" };
	cJSON *cf = cJSON_CreateObject();
	if (c->numcodecs)
		return numcodecs_json(c, cf, bad);
	switch (c->id) {
	case CKPT_CODEC_TRANSPOSE: {
		cJSON *o = cJSON_CreateArray();
		for (int d = 0; d < rank; d++)
			push(o, raw_int(c->order[d]), bad);
		put(cf, "order", o, bad);
		return named("transpose", cf, bad);
	}
	case CKPT_CODEC_BYTES:
		if (c->endian != CKPT_ENDIAN_NONE)
			put(cf, "endian", cJSON_CreateString(c->endian == CKPT_ENDIAN_BIG ? "big" : "little"),
			    bad);
		return named("bytes", cf, bad);
	case CKPT_CODEC_SHARDING: {
		const struct ckpt_zarr_sharding *sh = c->sharding;
		if (!sh)
			break;
		put(cf, "chunk_shape", shape_json(sh->chunk_shape, rank, bad), bad);
		put(cf, "codecs", chain_json(&sh->codecs, rank, bad), bad);
		if (sh->index_codecs.a2b.id != CKPT_CODEC_NONE)
			put(cf, "index_codecs", chain_json(&sh->index_codecs, rank + 1, bad), bad);
		put(cf, "index_location", cJSON_CreateString(sh->index_at_start ? "start" : "end"), bad);
		return named("sharding_indexed", cf, bad);
	}
	case CKPT_CODEC_ZSTD:
		put(cf, "checksum", cJSON_CreateBool(c->checksum), bad);
		put(cf, "level", raw_int(c->level), bad);
		return named("zstd", cf, bad);
	case CKPT_CODEC_GZIP:
		put(cf, "level", raw_int(c->level), bad);
		return named("gzip", cf, bad);
	case CKPT_CODEC_BLOSC:
		if (c->shuffle < 0 || c->shuffle > 2)
			break;
		put(cf, "blocksize", raw_u64(c->blocksize), bad);
		put(cf, "clevel", raw_int(c->level), bad);
		put(cf, "cname", cJSON_CreateString(c->cname), bad);
		put(cf, "shuffle", cJSON_CreateString(shuffles[c->shuffle]), bad);
		if (c->typesize)
			put(cf, "typesize", raw_int(c->typesize), bad);
		return named("blosc", cf, bad);
	case CKPT_CODEC_CRC32C:
		return named("crc32c", cf, bad);
	case CKPT_CODEC_ZLIB: /* zarr v2 only */
	case CKPT_CODEC_LZ4:
	case CKPT_CODEC_BZ2:
	case CKPT_CODEC_RAW_DEFLATE:
	case CKPT_CODEC_NONE:
		break;
	}
	cJSON_Delete(cf);
	*bad = 1;
	return NULL;
}

static cJSON *chain_json(const struct ckpt_zarr_chain *ch, int rank, int *bad)
{
	cJSON *a = cJSON_CreateArray();
	for (int i = 0; i < ch->na2a; i++)
		push(a, codec_json(&ch->a2a[i], rank, bad), bad);
	push(a, codec_json(&ch->a2b, rank, bad), bad);
	for (int i = 0; i < ch->nb2b; i++)
		push(a, codec_json(&ch->b2b[i], rank, bad), bad);
	return a;
}

static cJSON *emit_v3(const struct ckpt_zarr_meta *m, int *bad)
{
	cJSON *j = cJSON_CreateObject(), *gc = cJSON_CreateObject(), *kc = cJSON_CreateObject();
	put(gc, "chunk_shape", shape_json(m->chunk_shape, m->rank, bad), bad);
	put(j, "chunk_grid", named("regular", gc, bad), bad);
	if (!(m->key_encoding == CKPT_ZARR_KEYS_DEFAULT && m->sep == '/') &&
	    !(m->key_encoding == CKPT_ZARR_KEYS_V2 && m->sep == '.'))
		put(kc, "separator", cJSON_CreateString(m->sep == '.' ? "." : "/"), bad);
	put(j, "chunk_key_encoding", named(m->key_encoding == CKPT_ZARR_KEYS_V2 ? "v2" : "default", kc, bad),
	    bad);
	put(j, "codecs", chain_json(&m->codecs, m->rank, bad), bad);
	put(j, "data_type", cJSON_CreateString(ckpt_dtype_get(m->dtype)->name), bad);
	if (m->dim_names) {
		cJSON *dn = cJSON_CreateArray();
		for (int d = 0; d < m->rank; d++)
			push(dn, m->dim_names[d] ? cJSON_CreateString(m->dim_names[d]) : cJSON_CreateNull(),
			     bad);
		put(j, "dimension_names", dn, bad);
	}
	put(j, "fill_value", fill_json(m, bad), bad);
	put(j, "node_type", cJSON_CreateString("array"), bad);
	put(j, "shape", shape_json(m->shape, m->rank, bad), bad);
	put(j, "zarr_format", raw_int(3), bad);
	return j;
}

static cJSON *emit_v2(const struct ckpt_zarr_meta *m, int *bad)
{
	const struct ckpt_zarr_chain *ch = &m->codecs;
	const ckpt_dtype_info *di = ckpt_dtype_get(m->dtype);
	int order_f = 0;
	if (m->key_encoding != CKPT_ZARR_KEYS_V2 || ch->a2b.id != CKPT_CODEC_BYTES || ch->na2a > 1 ||
	    ch->nb2b > 1 || m->dim_names)
		return NULL;
	if (ch->na2a == 1) {
		if (ch->a2a[0].id != CKPT_CODEC_TRANSPOSE || m->rank < 2)
			return NULL;
		for (int d = 0; d < m->rank; d++)
			if (ch->a2a[0].order[d] != m->rank - 1 - d)
				return NULL;
		order_f = 1;
	}
	/* the byte order lives in the dtype string */
	int big = ch->a2b.endian == CKPT_ENDIAN_BIG && di->itemsize > 1;
	char dts[24];
	if (strchr(di->npy_descr, 'V')) {
		if (big)
			return NULL;
		snprintf(dts, sizeof(dts), "%s", di->name);
	} else {
		snprintf(dts, sizeof(dts), "%c%s",
			 di->itemsize == 1 ? '|'
			 : big		   ? '>'
					   : '<',
			 di->npy_descr + 1);
	}
	cJSON *comp;
	if (ch->nb2b == 0) {
		comp = cJSON_CreateNull();
	} else {
		const struct ckpt_zarr_codec *c = &ch->b2b[0];
		comp = cJSON_CreateObject();
		if (c->id == CKPT_CODEC_ZSTD) {
			if (c->checksum)
				put(comp, "checksum", cJSON_CreateTrue(), bad);
			put(comp, "id", cJSON_CreateString("zstd"), bad);
			put(comp, "level", raw_int(c->level), bad);
		} else if (c->id == CKPT_CODEC_GZIP) {
			put(comp, "id", cJSON_CreateString("gzip"), bad);
			put(comp, "level", raw_int(c->level), bad);
		} else if (c->id == CKPT_CODEC_BLOSC && c->shuffle >= -1 && c->shuffle <= 2) {
			put(comp, "blocksize", raw_u64(c->blocksize), bad);
			put(comp, "clevel", raw_int(c->level), bad);
			put(comp, "cname", cJSON_CreateString(c->cname), bad);
			put(comp, "id", cJSON_CreateString("blosc"), bad);
			put(comp, "shuffle", raw_int(c->shuffle), bad);
		} else if (c->id == CKPT_CODEC_ZLIB || c->id == CKPT_CODEC_BZ2) {
			put(comp, "id", cJSON_CreateString(c->id == CKPT_CODEC_ZLIB ? "zlib" : "bz2"), bad);
			put(comp, "level", raw_int(c->level), bad);
		} else if (c->id == CKPT_CODEC_LZ4) {
			put(comp, "acceleration", raw_int(c->level), bad);
			put(comp, "id", cJSON_CreateString("lz4"), bad);
		} else if (c->id == CKPT_CODEC_CRC32C) {
			put(comp, "id", cJSON_CreateString("crc32c"), bad);
		} else if (c->id == CKPT_CODEC_RAW_DEFLATE) {
			put(comp, "id", cJSON_CreateString(CKPT_ZARR_RAW_DEFLATE_ID), bad);
			if (c->skip)
				put(comp, "skip", raw_u64(c->skip), bad);
			if (c->has_crc32)
				put(comp, "crc32", raw_u64(c->crc32), bad);
		} else {
			cJSON_Delete(comp);
			return NULL;
		}
	}
	cJSON *j = cJSON_CreateObject();
	if (m->zip_has_crc) {
		cJSON *zc = cJSON_CreateObject();
		put(zc, "crc32", raw_u64(m->zip_crc32), bad);
		put(zc, "head_crc32", raw_u64(m->zip_head_crc32), bad);
		put(j, "ckptfs.zip_crc32", zc, bad);
	}
	put(j, "chunks", shape_json(m->chunk_shape, m->rank, bad), bad);
	put(j, "compressor", comp, bad);
	put(j, "dimension_separator", cJSON_CreateString(m->sep == '/' ? "/" : "."), bad);
	put(j, "dtype", cJSON_CreateString(dts), bad);
	put(j, "fill_value", fill_json(m, bad), bad);
	put(j, "filters", cJSON_CreateNull(), bad);
	put(j, "order", cJSON_CreateString(order_f ? "F" : "C"), bad);
	put(j, "shape", shape_json(m->shape, m->rank, bad), bad);
	put(j, "zarr_format", raw_int(2), bad);
	return j;
}

char *ckpt_zarr_meta_emit(const struct ckpt_zarr_meta *m)
{
	if (!ckpt_dtype_get(m->dtype) || m->rank < 0 || m->rank > CKPT_MAX_RANK)
		return NULL;
	int bad = 0;
	cJSON *j = m->zarr_format == 3 ? emit_v3(m, &bad) : m->zarr_format == 2 ? emit_v2(m, &bad) : NULL;
	char *s = j && !bad ? cJSON_PrintUnformatted(j) : NULL;
	cJSON_Delete(j);
	return s;
}
