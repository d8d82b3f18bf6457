#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "crc32c.h"
#include "stats.h"
#include "zarr.h"

#define MAX_TOTAL_BYTES (1ull << 62)
#define MAX_UNIT_BYTES (1ull << 34) /* 16 GiB decoded per unit: beyond this is absurd */

/* ---- metadata ---------------------------------------------------------- */

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

static int parse_shape(const cJSON *a, int *rank, uint64_t *dims, int allow_zero, const char **why)
{
	if (!cJSON_IsArray(a)) {
		*why = "shape/chunks is not a list";
		return -EINVAL;
	}
	int n = cJSON_GetArraySize(a);
	if (n > CKPT_MAX_RANK) {
		*why = "rank too large";
		return -EINVAL;
	}
	int i = 0;
	const cJSON *e;
	cJSON_ArrayForEach(e, a)
	{
		if (json_u64(e, &dims[i]) < 0 || (!allow_zero && dims[i] == 0)) {
			*why = "bad dimension";
			return -EINVAL;
		}
		i++;
	}
	*rank = n;
	return 0;
}

static uint16_t f32_to_bf16(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	if ((u & 0x7fffffff) > 0x7f800000)
		return (uint16_t)((u >> 16) | 0x40);
	u += 0x7fff + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
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

/* Encode a JSON fill value as one element of m->dtype.  Zero for null. */
static int parse_fill(const cJSON *v, ckpt_array_meta *m, const char **why)
{
	memset(m->fill, 0, sizeof(m->fill));
	if (!v || cJSON_IsNull(v))
		return 0;
	const ckpt_dtype_info *di = ckpt_dtype_get(m->dtype);
	double d = 0;
	if (cJSON_IsBool(v)) {
		d = cJSON_IsTrue(v) ? 1 : 0;
	} else if (cJSON_IsNumber(v)) {
		d = v->valuedouble;
	} else if (cJSON_IsString(v)) {
		const char *s = v->valuestring;
		if (strcmp(s, "NaN") == 0)
			d = NAN;
		else if (strcmp(s, "Infinity") == 0)
			d = INFINITY;
		else if (strcmp(s, "-Infinity") == 0)
			d = -INFINITY;
		else if (s[0] == '0' && s[1] == 'x') {
			uint64_t bits = strtoull(s + 2, NULL, 16);
			for (unsigned i = 0; i < di->itemsize && i < 8; i++)
				m->fill[i] = (uint8_t)(bits >> (8 * i));
			return 0;
		} else {
			*why = "unsupported fill_value string";
			return -ENOTSUP;
		}
	} else if (cJSON_IsArray(v)) {
		return 0; /* complex [re, im]: zeros are the only case seen */
	} else {
		*why = "bad fill_value";
		return -EINVAL;
	}
	if (d == 0 && !signbit(d))
		return 0;
	switch (m->dtype) {
	case CKPT_DT_FLOAT32: {
		float f = (float)d;
		memcpy(m->fill, &f, 4);
		break;
	}
	case CKPT_DT_FLOAT64:
		memcpy(m->fill, &d, 8);
		break;
	case CKPT_DT_BFLOAT16: {
		uint16_t h = f32_to_bf16((float)d);
		memcpy(m->fill, &h, 2);
		break;
	}
	case CKPT_DT_FLOAT16: {
		uint16_t h = f32_to_f16((float)d);
		memcpy(m->fill, &h, 2);
		break;
	}
	default:
		if (di->kind == 'i' || di->kind == 'u' || di->kind == 'b') {
			int64_t iv = (int64_t)d;
			for (unsigned i = 0; i < di->itemsize && i < 8; i++)
				m->fill[i] = (uint8_t)((uint64_t)iv >> (8 * i));
		} else {
			ckpt_log(CKPT_LOG_WARN, "non-zero fill_value for %s read as zeros", di->name);
		}
	}
	return 0;
}

static int finish_meta(ckpt_array_meta *m, const char **why)
{
	const ckpt_dtype_info *di = ckpt_dtype_get(m->dtype);
	m->itemsize = di->itemsize;
	uint64_t n = m->itemsize, u = m->itemsize;
	m->inner_per_shard = 1;
	for (int d = 0; d < m->rank; d++) {
		if (m->chunk_shape[d] == 0 || m->inner_shape[d] == 0) {
			*why = "zero chunk dimension";
			return -EINVAL;
		}
		if (m->chunk_shape[d] % m->inner_shape[d]) {
			*why = "shard shape not a multiple of the inner chunk shape";
			return -EINVAL;
		}
		if (ckpt_mul_u64(n, m->shape[d], &n) < 0 || n > MAX_TOTAL_BYTES) {
			*why = "array byte size overflows";
			return -EINVAL;
		}
		if (ckpt_mul_u64(u, m->inner_shape[d], &u) < 0 || u > MAX_UNIT_BYTES) {
			*why = "chunk byte size too large";
			return -EINVAL;
		}
		m->grid[d] = (m->shape[d] + m->inner_shape[d] - 1) / m->inner_shape[d];
		m->store_grid[d] = (m->shape[d] + m->chunk_shape[d] - 1) / m->chunk_shape[d];
		if (ckpt_mul_u64(m->inner_per_shard, m->chunk_shape[d] / m->inner_shape[d],
				 &m->inner_per_shard) < 0 ||
		    m->inner_per_shard > (1ull << 32)) {
			*why = "too many inner chunks per shard";
			return -EINVAL;
		}
	}
	m->nbytes = n;
	m->unit_bytes = u;
	return 0;
}

static int parse_v2(const cJSON *root, ckpt_array_meta *m, const char **why)
{
	const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "zarr_format");
	if (!cJSON_IsNumber(fmt) || fmt->valuedouble != 2) {
		*why = "zarr_format is not 2";
		return -EINVAL;
	}
	m->zarr_format = 2;
	int rc, crank;
	if ((rc = parse_shape(cJSON_GetObjectItemCaseSensitive(root, "shape"), &m->rank, m->shape, 1, why)) <
	    0)
		return rc;
	if ((rc = parse_shape(cJSON_GetObjectItemCaseSensitive(root, "chunks"), &crank, m->chunk_shape, 0,
			      why)) < 0)
		return rc;
	if (crank != m->rank) {
		*why = "chunks rank differs from shape rank";
		return -EINVAL;
	}
	memcpy(m->inner_shape, m->chunk_shape, sizeof(m->chunk_shape));
	const cJSON *dt = cJSON_GetObjectItemCaseSensitive(root, "dtype");
	if (!cJSON_IsString(dt)) {
		*why = "dtype missing or structured";
		return -ENOTSUP;
	}
	m->dtype = ckpt_dtype_from_zarr2(dt->valuestring, &m->big_endian);
	if (m->dtype == CKPT_DT_INVALID) {
		*why = "unsupported dtype";
		return -ENOTSUP;
	}
	const cJSON *comp = cJSON_GetObjectItemCaseSensitive(root, "compressor");
	if (comp && !cJSON_IsNull(comp)) {
		const cJSON *id = cJSON_GetObjectItemCaseSensitive(comp, "id");
		if (!cJSON_IsString(id) || strcmp(id->valuestring, "zstd") != 0) {
			*why = "unsupported compressor (only zstd or null)";
			return -ENOTSUP;
		}
		const cJSON *lvl = cJSON_GetObjectItemCaseSensitive(comp, "level");
		m->zstd_level = cJSON_IsNumber(lvl) ? (int)lvl->valuedouble : 0;
		m->b2b[m->nb2b++] = CKPT_B2B_ZSTD;
	}
	const cJSON *filters = cJSON_GetObjectItemCaseSensitive(root, "filters");
	if (filters && !cJSON_IsNull(filters) &&
	    !(cJSON_IsArray(filters) && cJSON_GetArraySize(filters) == 0)) {
		*why = "filters are not supported";
		return -ENOTSUP;
	}
	const cJSON *order = cJSON_GetObjectItemCaseSensitive(root, "order");
	if (cJSON_IsString(order) && strcmp(order->valuestring, "F") == 0)
		m->order_f = 1;
	else if (order && !(cJSON_IsString(order) && strcmp(order->valuestring, "C") == 0)) {
		*why = "bad order";
		return -EINVAL;
	}
	m->sep = '.';
	const cJSON *sep = cJSON_GetObjectItemCaseSensitive(root, "dimension_separator");
	if (cJSON_IsString(sep)) {
		if (strcmp(sep->valuestring, "/") == 0)
			m->sep = '/';
		else if (strcmp(sep->valuestring, ".") != 0) {
			*why = "bad dimension_separator";
			return -EINVAL;
		}
	}
	if ((rc = finish_meta(m, why)) < 0)
		return rc;
	return parse_fill(cJSON_GetObjectItemCaseSensitive(root, "fill_value"), m, why);
}

static const char *cname(const cJSON *codec)
{
	const cJSON *n = cJSON_GetObjectItemCaseSensitive(codec, "name");
	return cJSON_IsString(n) ? n->valuestring : NULL;
}

static const cJSON *cconf(const cJSON *codec, const char *key)
{
	const cJSON *c = cJSON_GetObjectItemCaseSensitive(codec, "configuration");
	return c ? cJSON_GetObjectItemCaseSensitive(c, key) : NULL;
}

/* Parse [bytes, b2b...]; sets big_endian (if non-NULL) and the b2b list. */
static int parse_chain(const cJSON *codecs, ckpt_array_meta *m, int inner, int *big_endian, uint8_t *b2b,
		       int *nb2b, const char **why)
{
	if (!cJSON_IsArray(codecs) || cJSON_GetArraySize(codecs) < 1) {
		*why = "codecs is not a non-empty list";
		return -EINVAL;
	}
	int i = 0;
	*nb2b = 0;
	const cJSON *c;
	cJSON_ArrayForEach(c, codecs)
	{
		const char *n = cname(c);
		if (!n) {
			*why = "codec without a name";
			return -EINVAL;
		}
		if (i == 0) {
			if (strcmp(n, "sharding_indexed") == 0 && !inner) {
				m->sharded = 1;
			} else if (strcmp(n, "bytes") == 0) {
				const cJSON *e = cconf(c, "endian");
				if (big_endian)
					*big_endian = cJSON_IsString(e) && strcmp(e->valuestring, "big") == 0;
			} else {
				*why = "unsupported array->bytes codec";
				return -ENOTSUP;
			}
		} else {
			if (*nb2b >= CKPT_ZARR_MAX_B2B) {
				*why = "too many codecs";
				return -ENOTSUP;
			}
			if (strcmp(n, "zstd") == 0) {
				const cJSON *l = cconf(c, "level");
				m->zstd_level = cJSON_IsNumber(l) ? (int)l->valuedouble : 0;
				b2b[(*nb2b)++] = CKPT_B2B_ZSTD;
			} else if (strcmp(n, "crc32c") == 0) {
				b2b[(*nb2b)++] = CKPT_B2B_CRC32C;
			} else {
				*why = "unsupported bytes->bytes codec";
				return -ENOTSUP;
			}
		}
		i++;
	}
	return 0;
}

static int parse_v3(const cJSON *root, ckpt_array_meta *m, const char **why)
{
	const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "zarr_format");
	if (!cJSON_IsNumber(fmt) || fmt->valuedouble != 3) {
		*why = "zarr_format is not 3";
		return -EINVAL;
	}
	const cJSON *nt = cJSON_GetObjectItemCaseSensitive(root, "node_type");
	if (!cJSON_IsString(nt) || strcmp(nt->valuestring, "array") != 0) {
		*why = "node_type is not array";
		return -EINVAL;
	}
	m->zarr_format = 3;
	int rc, crank;
	if ((rc = parse_shape(cJSON_GetObjectItemCaseSensitive(root, "shape"), &m->rank, m->shape, 1, why)) <
	    0)
		return rc;
	const cJSON *grid = cJSON_GetObjectItemCaseSensitive(root, "chunk_grid");
	const cJSON *gname = grid ? cJSON_GetObjectItemCaseSensitive(grid, "name") : NULL;
	if (!cJSON_IsString(gname) || strcmp(gname->valuestring, "regular") != 0) {
		*why = "chunk_grid is not regular";
		return -ENOTSUP;
	}
	if ((rc = parse_shape(cconf(grid, "chunk_shape"), &crank, m->chunk_shape, 0, why)) < 0)
		return rc;
	if (crank != m->rank) {
		*why = "chunk_shape rank differs from shape rank";
		return -EINVAL;
	}
	const cJSON *dt = cJSON_GetObjectItemCaseSensitive(root, "data_type");
	m->dtype = cJSON_IsString(dt) ? ckpt_dtype_from_name(dt->valuestring) : CKPT_DT_INVALID;
	if (m->dtype == CKPT_DT_INVALID) {
		*why = "unsupported data_type";
		return -ENOTSUP;
	}
	const cJSON *enc = cJSON_GetObjectItemCaseSensitive(root, "chunk_key_encoding");
	const cJSON *ename = enc ? cJSON_GetObjectItemCaseSensitive(enc, "name") : NULL;
	if (!cJSON_IsString(ename)) {
		*why = "chunk_key_encoding missing";
		return -EINVAL;
	}
	const cJSON *sep = cconf(enc, "separator");
	if (strcmp(ename->valuestring, "default") == 0) {
		m->key_c_prefix = 1;
		m->sep = '/';
	} else if (strcmp(ename->valuestring, "v2") == 0) {
		m->sep = '.';
	} else {
		*why = "unsupported chunk_key_encoding";
		return -ENOTSUP;
	}
	if (cJSON_IsString(sep)) {
		if (strcmp(sep->valuestring, "/") == 0 || strcmp(sep->valuestring, ".") == 0)
			m->sep = sep->valuestring[0];
		else {
			*why = "bad chunk key separator";
			return -EINVAL;
		}
	}
	const cJSON *codecs = cJSON_GetObjectItemCaseSensitive(root, "codecs");
	if ((rc = parse_chain(codecs, m, 0, &m->big_endian, m->b2b, &m->nb2b, why)) < 0)
		return rc;
	memcpy(m->inner_shape, m->chunk_shape, sizeof(m->chunk_shape));
	if (m->sharded) {
		if (m->nb2b) {
			*why = "codecs after sharding_indexed are not supported";
			return -ENOTSUP;
		}
		const cJSON *sh = cJSON_GetArrayItem(codecs, 0);
		int irank;
		if ((rc = parse_shape(cconf(sh, "chunk_shape"), &irank, m->inner_shape, 0, why)) < 0)
			return rc;
		if (irank != m->rank) {
			*why = "inner chunk_shape rank differs";
			return -EINVAL;
		}
		if ((rc = parse_chain(cconf(sh, "codecs"), m, 1, &m->big_endian, m->b2b, &m->nb2b, why)) < 0)
			return rc;
		uint8_t ib[CKPT_ZARR_MAX_B2B];
		int nib = 0, ibe = 0;
		const cJSON *ic = cconf(sh, "index_codecs");
		if (ic) {
			if ((rc = parse_chain(ic, m, 1, &ibe, ib, &nib, why)) < 0)
				return rc;
			if (ibe || nib > 1 || (nib == 1 && ib[0] != CKPT_B2B_CRC32C)) {
				*why = "unsupported index_codecs";
				return -ENOTSUP;
			}
			m->index_crc = nib == 1;
		}
		const cJSON *loc = cconf(sh, "index_location");
		if (cJSON_IsString(loc) && strcmp(loc->valuestring, "start") == 0)
			m->index_at_start = 1;
		else if (loc && !(cJSON_IsString(loc) && strcmp(loc->valuestring, "end") == 0)) {
			*why = "bad index_location";
			return -EINVAL;
		}
	}
	const cJSON *st = cJSON_GetObjectItemCaseSensitive(root, "storage_transformers");
	if (st && !(cJSON_IsArray(st) && cJSON_GetArraySize(st) == 0)) {
		*why = "storage_transformers are not supported";
		return -ENOTSUP;
	}
	if ((rc = finish_meta(m, why)) < 0)
		return rc;
	return parse_fill(cJSON_GetObjectItemCaseSensitive(root, "fill_value"), m, why);
}

int ckpt_zarr_parse(int format, const char *json, size_t len, ckpt_array_meta *out, const char **why)
{
	memset(out, 0, sizeof(*out));
	*why = "";
	cJSON *root = cJSON_ParseWithLength(json, len);
	if (!root || !cJSON_IsObject(root)) {
		cJSON_Delete(root);
		*why = "invalid JSON";
		return -EINVAL;
	}
	int rc = format == 2 ? parse_v2(root, out, why) : parse_v3(root, out, why);
	cJSON_Delete(root);
	return rc;
}

void ckpt_zarr_codec_str(const ckpt_array_meta *m, char *buf, size_t cap)
{
	char chain[64] = "";
	size_t n = 0;
	if (m->zarr_format == 3)
		n += (size_t)snprintf(chain + n, sizeof(chain) - n, "bytes");
	for (int i = 0; i < m->nb2b && n < sizeof(chain); i++)
		n += (size_t)snprintf(chain + n, sizeof(chain) - n, "%s%s", n ? "," : "",
				      m->b2b[i] == CKPT_B2B_ZSTD ? "zstd" : "crc32c");
	if (!n)
		snprintf(chain, sizeof(chain), "raw");
	if (!m->sharded) {
		snprintf(buf, cap, "%s", chain);
		return;
	}
	char inner[CKPT_MAX_RANK * 21 + 3];
	size_t k = 0;
	inner[k++] = '[';
	for (int d = 0; d < m->rank; d++)
		k += (size_t)snprintf(inner + k, sizeof(inner) - k, "%s%llu", d ? "," : "",
				      (unsigned long long)m->inner_shape[d]);
	snprintf(inner + k, sizeof(inner) - k, "]");
	snprintf(buf, cap, "sharding_indexed(inner=%s,%s)", inner, chain);
}

int ckpt_zarr_unit_key(const ckpt_array_meta *m, const char *prefix, const uint64_t *g, char *buf, size_t cap)
{
	size_t n = 0;
	int w = snprintf(buf, cap, "%s%s", prefix, *prefix ? "/" : "");
	if (w < 0 || (size_t)w >= cap)
		return -ENOBUFS;
	n = (size_t)w;
	if (m->key_c_prefix) {
		w = snprintf(buf + n, cap - n, "c");
		if (w < 0 || (size_t)w >= cap - n)
			return -ENOBUFS;
		n += (size_t)w;
		for (int d = 0; d < m->rank; d++) {
			w = snprintf(buf + n, cap - n, "%c%llu", m->sep, (unsigned long long)g[d]);
			if (w < 0 || (size_t)w >= cap - n)
				return -ENOBUFS;
			n += (size_t)w;
		}
		return (int)n;
	}
	if (m->rank == 0) {
		w = snprintf(buf + n, cap - n, "0");
		if (w < 0 || (size_t)w >= cap - n)
			return -ENOBUFS;
		return (int)(n + (size_t)w);
	}
	for (int d = 0; d < m->rank; d++) {
		if (d)
			w = snprintf(buf + n, cap - n, "%c%llu", m->sep, (unsigned long long)g[d]);
		else
			w = snprintf(buf + n, cap - n, "%llu", (unsigned long long)g[d]);
		if (w < 0 || (size_t)w >= cap - n)
			return -ENOBUFS;
		n += (size_t)w;
	}
	return (int)n;
}

/* ---- decoding ---------------------------------------------------------- */

struct ckpt_zarr_scratch {
	ZSTD_DCtx *dctx;
	uint8_t *buf; /* stored bytes of one storage unit or inner chunk */
	size_t cap;
	uint8_t *aux; /* F-order transpose / shard index */
	size_t auxcap;
};

ckpt_zarr_scratch *ckpt_zarr_scratch_create(void)
{
	ckpt_zarr_scratch *sc = calloc(1, sizeof(*sc));
	if (!sc)
		return NULL;
	sc->dctx = ZSTD_createDCtx();
	if (!sc->dctx) {
		free(sc);
		return NULL;
	}
	return sc;
}

void ckpt_zarr_scratch_destroy(ckpt_zarr_scratch *sc)
{
	if (!sc)
		return;
	ZSTD_freeDCtx(sc->dctx);
	free(sc->buf);
	free(sc->aux);
	free(sc);
}

static int grow(uint8_t **p, size_t *cap, size_t need)
{
	if (need <= *cap)
		return 0;
	size_t n = *cap ? *cap : 4096;
	while (n < need)
		n *= 2;
	uint8_t *q = realloc(*p, n);
	if (!q)
		return -ENOMEM;
	*p = q;
	*cap = n;
	return 0;
}

static void fill_unit(const ckpt_array_meta *m, uint8_t *dst)
{
	int zero = 1;
	for (unsigned i = 0; i < m->itemsize; i++)
		zero &= m->fill[i] == 0;
	if (zero) {
		memset(dst, 0, m->unit_bytes);
		return;
	}
	for (uint64_t off = 0; off < m->unit_bytes; off += m->itemsize)
		memcpy(dst + off, m->fill, m->itemsize);
}

static void swap_bytes(uint8_t *p, uint64_t n, unsigned size)
{
	for (uint64_t off = 0; off + size <= n; off += size)
		for (unsigned i = 0; i < size / 2; i++) {
			uint8_t t = p[off + i];
			p[off + i] = p[off + size - 1 - i];
			p[off + size - 1 - i] = t;
		}
}

/* Column-major unit → row-major, via aux. */
static int f_to_c(const ckpt_array_meta *m, uint8_t *p, ckpt_zarr_scratch *sc)
{
	if (grow(&sc->aux, &sc->auxcap, m->unit_bytes) < 0)
		return -ENOMEM;
	memcpy(sc->aux, p, m->unit_bytes);
	uint64_t n = m->unit_bytes / m->itemsize;
	uint64_t idx[CKPT_MAX_RANK] = { 0 };
	for (uint64_t c = 0; c < n; c++) {
		/* idx is the C-order multi-index of element c */
		uint64_t f = 0, stride = 1;
		for (int d = 0; d < m->rank; d++) {
			f += idx[d] * stride;
			stride *= m->inner_shape[d];
		}
		memcpy(p + c * m->itemsize, sc->aux + f * m->itemsize, m->itemsize);
		for (int d = m->rank - 1; d >= 0; d--) {
			if (++idx[d] < m->inner_shape[d])
				break;
			idx[d] = 0;
		}
	}
	return 0;
}

/* Undo the bytes->bytes chain of `src` (n bytes) into dst (unit_bytes). */
static int decode_chain(const ckpt_array_meta *m, const char *root, const char *key, uint8_t *src, size_t n,
			uint8_t *dst, ckpt_zarr_scratch *sc)
{
	int done = 0;
	for (int i = m->nb2b - 1; i >= 0; i--) {
		if (m->b2b[i] == CKPT_B2B_CRC32C) {
			if (n < 4) {
				ckpt_log(CKPT_LOG_ERR, "%s/%s: chunk too short for its crc32c", root, key);
				return -EIO;
			}
			if (ckpt_crc32c(0, src, n - 4) != ckpt_le32(src + n - 4)) {
				ckpt_log(CKPT_LOG_ERR, "%s/%s: chunk CRC-32C mismatch", root, key);
				return -EIO;
			}
			n -= 4;
		} else {
			if (i != 0 || done) {
				ckpt_log(CKPT_LOG_ERR, "%s/%s: unsupported codec order", root, key);
				return -EIO;
			}
			unsigned long long fcs = ZSTD_getFrameContentSize(src, n);
			if (fcs == ZSTD_CONTENTSIZE_ERROR ||
			    (fcs != ZSTD_CONTENTSIZE_UNKNOWN && fcs != m->unit_bytes)) {
				ckpt_log(CKPT_LOG_ERR,
					 "%s/%s: bad zstd frame (content size %lld, expected %llu)", root,
					 key, fcs == ZSTD_CONTENTSIZE_ERROR ? -1LL : (long long)fcs,
					 (unsigned long long)m->unit_bytes);
				return -EIO;
			}
			size_t r = ZSTD_decompressDCtx(sc->dctx, dst, m->unit_bytes, src, n);
			if (ZSTD_isError(r) || r != m->unit_bytes) {
				ckpt_log(CKPT_LOG_ERR, "%s/%s: zstd decode failed: %s", root, key,
					 ZSTD_isError(r) ? ZSTD_getErrorName(r) : "wrong decoded size");
				return -EIO;
			}
			done = 1;
		}
	}
	if (!done) {
		if (n != m->unit_bytes) {
			ckpt_log(CKPT_LOG_ERR, "%s/%s: raw chunk has %zu bytes, expected %llu", root, key, n,
				 (unsigned long long)m->unit_bytes);
			return -EIO;
		}
		memcpy(dst, src, n);
	}
	if (m->order_f && m->rank > 1 && f_to_c(m, dst, sc) < 0)
		return -ENOMEM;
	if (m->big_endian && m->itemsize > 1)
		swap_bytes(dst, m->unit_bytes,
			   m->dtype == CKPT_DT_COMPLEX64 || m->dtype == CKPT_DT_COMPLEX128 ? m->itemsize / 2
											   : m->itemsize);
	CKPT_STAT_ADD(chunks_decoded, 1);
	CKPT_STAT_ADD(decoded_bytes, m->unit_bytes);
	return 0;
}

static int read_exact(ckpt_store *s, const char *key, uint64_t off, size_t len, void *dst)
{
	ssize_t r = ckpt_store_read(s, key, off, len, dst);
	if (r < 0)
		return (int)r;
	if ((size_t)r != len) {
		ckpt_log(CKPT_LOG_ERR, "%s/%s: truncated (wanted %zu bytes at %llu, got %zd)", s->root, key,
			 len, (unsigned long long)off, r);
		return -EIO;
	}
	return 0;
}

/* Storage-grid index of decode unit g, and its C-order index in the shard. */
static uint64_t unit_of(const ckpt_array_meta *m, const uint64_t *g, uint64_t *sg)
{
	uint64_t inner = 0;
	for (int d = 0; d < m->rank; d++) {
		uint64_t ratio = m->chunk_shape[d] / m->inner_shape[d];
		sg[d] = g[d] / ratio;
		inner = inner * ratio + g[d] % ratio;
	}
	return inner;
}

int ckpt_zarr_read_unit(ckpt_store *s, const char *prefix, const ckpt_array_meta *m, const uint64_t *g,
			void *dst, ckpt_zarr_scratch *sc)
{
	char key[4096];
	uint64_t sg[CKPT_MAX_RANK];
	uint64_t inner = unit_of(m, g, sg); /* C-order index of the inner chunk within its shard */
	if (ckpt_zarr_unit_key(m, prefix, sg, key, sizeof(key)) < 0)
		return -ENAMETOOLONG;
	uint64_t size;
	int rc = ckpt_store_size(s, key, &size);
	if (rc == -ENOENT) {
		fill_unit(m, dst);
		return 0;
	}
	if (rc < 0)
		return rc;
	if (!m->sharded) {
		if (size > m->unit_bytes + (m->unit_bytes >> 3) + (1u << 20)) {
			ckpt_log(CKPT_LOG_ERR,
				 "%s/%s: stored chunk of %llu bytes is larger than any encoding of %llu",
				 s->root, key, (unsigned long long)size, (unsigned long long)m->unit_bytes);
			return -EIO;
		}
		if (grow(&sc->buf, &sc->cap, (size_t)size) < 0)
			return -ENOMEM;
		if ((rc = read_exact(s, key, 0, (size_t)size, sc->buf)) < 0)
			return rc;
		return decode_chain(m, s->root, key, sc->buf, (size_t)size, dst, sc);
	}
	/* sharding_indexed: find the inner chunk through the shard index. */
	uint64_t nidx = m->inner_per_shard;
	uint64_t isize = 16 * nidx + (m->index_crc ? 4 : 0);
	if (size < isize) {
		ckpt_log(CKPT_LOG_ERR, "%s/%s: shard of %llu bytes is smaller than its index (%llu)", s->root,
			 key, (unsigned long long)size, (unsigned long long)isize);
		return -EIO;
	}
	uint64_t ioff = m->index_at_start ? 0 : size - isize;
	int whole = nidx == 1 && size <= m->unit_bytes + (m->unit_bytes >> 3) + (1u << 20) + isize;
	uint8_t *ix;
	if (whole) {
		/* One inner chunk: one read brings index and data. */
		if (grow(&sc->buf, &sc->cap, (size_t)size) < 0)
			return -ENOMEM;
		if ((rc = read_exact(s, key, 0, (size_t)size, sc->buf)) < 0)
			return rc;
		ix = sc->buf + ioff;
	} else {
		if (grow(&sc->aux, &sc->auxcap, (size_t)isize) < 0)
			return -ENOMEM;
		if ((rc = read_exact(s, key, ioff, (size_t)isize, sc->aux)) < 0)
			return rc;
		ix = sc->aux;
	}
	if (m->index_crc && ckpt_crc32c(0, ix, 16 * nidx) != ckpt_le32(ix + 16 * nidx)) {
		ckpt_log(CKPT_LOG_ERR, "%s/%s: shard index CRC-32C mismatch", s->root, key);
		return -EIO;
	}
	uint64_t off = ckpt_le64(ix + 16 * inner), n = ckpt_le64(ix + 16 * inner + 8);
	if (off == UINT64_MAX && n == UINT64_MAX) {
		fill_unit(m, dst);
		return 0;
	}
	uint64_t end;
	if (ckpt_add_u64(off, n, &end) < 0 || end > size ||
	    n > m->unit_bytes + (m->unit_bytes >> 3) + (1u << 20)) {
		ckpt_log(CKPT_LOG_ERR,
			 "%s/%s: inner chunk %llu range [%llu,+%llu) outside the shard (%llu bytes)", s->root,
			 key, (unsigned long long)inner, (unsigned long long)off, (unsigned long long)n,
			 (unsigned long long)size);
		return -EIO;
	}
	if (whole)
		return decode_chain(m, s->root, key, sc->buf + off, (size_t)n, dst, sc);
	if (grow(&sc->buf, &sc->cap, (size_t)n) < 0)
		return -ENOMEM;
	if ((rc = read_exact(s, key, off, (size_t)n, sc->buf)) < 0)
		return rc;
	return decode_chain(m, s->root, key, sc->buf, (size_t)n, dst, sc);
}

struct stored_ctx {
	uint64_t total;
};

static int stored_cb(void *ctx, const char *key, uint64_t size)
{
	struct stored_ctx *c = ctx;
	const char *base = strrchr(key, '/');
	base = base ? base + 1 : key;
	if (strcmp(base, ".zarray") && strcmp(base, "zarr.json") && strcmp(base, ".zattrs"))
		c->total += size;
	return 0;
}

int ckpt_zarr_stored_bytes(ckpt_store *s, const char *prefix, const ckpt_array_meta *m, uint64_t *out)
{
	(void)m;
	char p[4096];
	if (snprintf(p, sizeof(p), "%s%s", prefix, *prefix ? "/" : "") >= (int)sizeof(p))
		return -ENAMETOOLONG;
	struct stored_ctx c = { 0 };
	int rc = ckpt_store_list(s, p, stored_cb, &c);
	if (rc < 0)
		return rc;
	*out = c.total;
	return 0;
}
