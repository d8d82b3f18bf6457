/*
 * zarr_chunk.c - decoding zarr storage units through a store (see zarr_chunk.h);
 * the metadata text itself is parsed by format/zarr_meta.c.
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <blosc.h>
#include <bzlib.h>
#include <lz4.h>
#include <zlib.h>
#include <zstd.h>

#include "crc32c.h"
#include "hugebuf.h"
#include "stats.h"
#include "zarr_chunk.h"

#define MAX_TOTAL_BYTES (1ull << 62)
#define MAX_UNIT_BYTES (1ull << 34) /* 16 GiB decoded per unit: beyond this is absurd */

/* ---- metadata: the decode plan of a parsed model ------------------------ */

/*
 * What this decoder supports of the zarr_meta model: an optional
 * sharding_indexed codec (not nested, nothing before or after it; index
 * bytes little-endian, optionally + crc32c), and a data chain of
 * transposes (any permutations, composed), bytes (either endian), and
 * bytes->bytes codecs of which at most one compresses (zstd, gzip, zlib,
 * blosc, lz4, bz2) and any number are crc32c.
 */
static int plan_chain(const struct ckpt_zarr_chain *ch, ckpt_array_meta *m, const char **why)
{
	int perm[CKPT_MAX_RANK], id = 1;
	for (int d = 0; d < CKPT_MAX_RANK; d++)
		perm[d] = d; /* identity past the rank too: the plan is compared bytewise */
	for (int i = 0; i < ch->na2a; i++) {
		const struct ckpt_zarr_codec *t = &ch->a2a[i];
		int next[CKPT_MAX_RANK];
		memcpy(next, perm, sizeof(next));
		if (t->id != CKPT_CODEC_TRANSPOSE) {
			*why = "unsupported array->array codec";
			return -ENOTSUP;
		}
		/* the i-th transpose sees the output of the previous ones */
		for (int d = 0; d < m->rank; d++) {
			if (t->order[d] < 0 || t->order[d] >= m->rank) {
				*why = "bad transpose order";
				return -EINVAL;
			}
			next[d] = perm[t->order[d]];
		}
		memcpy(perm, next, sizeof(perm));
	}
	for (int d = 0; d < m->rank; d++)
		id &= perm[d] == d;
	memcpy(m->perm, perm, sizeof(perm));
	m->order_f = !id;
	if (ch->a2b.id != CKPT_CODEC_BYTES) {
		*why = ch->a2b.id == CKPT_CODEC_SHARDING ? "nested sharding_indexed is not supported"
							 : "unsupported array->bytes codec";
		return -ENOTSUP;
	}
	m->big_endian = ch->a2b.endian == CKPT_ENDIAN_BIG;
	m->nb2b = 0;
	int compressors = 0;
	for (int i = 0; i < ch->nb2b; i++) {
		const struct ckpt_zarr_codec *c = &ch->b2b[i];
		uint8_t b;
		switch (c->id) {
		case CKPT_CODEC_ZSTD:
			m->zstd_level = c->level;
			b = CKPT_B2B_ZSTD;
			break;
		case CKPT_CODEC_CRC32C:
			b = CKPT_B2B_CRC32C;
			break;
		case CKPT_CODEC_GZIP:
			b = CKPT_B2B_GZIP;
			break;
		case CKPT_CODEC_ZLIB:
			b = CKPT_B2B_ZLIB;
			break;
		case CKPT_CODEC_BLOSC:
			b = CKPT_B2B_BLOSC;
			break;
		case CKPT_CODEC_LZ4:
			b = CKPT_B2B_LZ4;
			break;
		case CKPT_CODEC_BZ2:
			b = CKPT_B2B_BZ2;
			break;
		case CKPT_CODEC_RAW_DEFLATE:
			b = CKPT_B2B_RAW_DEFLATE;
			m->deflate_skip = c->skip;
			m->deflate_has_crc = c->has_crc32;
			m->deflate_crc = c->crc32;
			break;
		default:
			*why = m->zarr_format == 2 ? "unsupported compressor"
						   : "unsupported bytes->bytes codec";
			return -ENOTSUP;
		}
		if (b != CKPT_B2B_CRC32C && ++compressors > 1) {
			*why = "more than one compressor in a codec chain is not supported";
			return -ENOTSUP;
		}
		m->b2b[m->nb2b++] = b;
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
		assert(m->chunk_shape[d] && m->inner_shape[d] && m->chunk_shape[d] % m->inner_shape[d] == 0);
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

static int plan(const struct ckpt_zarr_meta *zm, ckpt_array_meta *m, const char **why)
{
	m->zarr_format = zm->zarr_format;
	m->dtype = zm->dtype;
	m->rank = zm->rank;
	memcpy(m->shape, zm->shape, sizeof(m->shape));
	memcpy(m->chunk_shape, zm->chunk_shape, sizeof(m->chunk_shape));
	memcpy(m->inner_shape, zm->chunk_shape, sizeof(m->inner_shape));
	m->key_c_prefix = zm->key_encoding == CKPT_ZARR_KEYS_DEFAULT;
	m->sep = zm->sep;
	const struct ckpt_zarr_chain *data = &zm->codecs;
	int rc;
	if (zm->codecs.a2b.id == CKPT_CODEC_SHARDING) {
		const struct ckpt_zarr_sharding *sh = zm->codecs.a2b.sharding;
		if (zm->codecs.na2a || zm->codecs.nb2b) {
			*why = zm->codecs.nb2b ? "codecs after sharding_indexed are not supported"
					       : "codecs before sharding_indexed are not supported";
			return -ENOTSUP;
		}
		m->sharded = 1;
		memcpy(m->inner_shape, sh->chunk_shape, sizeof(m->inner_shape));
		data = &sh->codecs;
		const struct ckpt_zarr_chain *ic = &sh->index_codecs;
		if (ic->a2b.id != CKPT_CODEC_NONE) {
			if (ic->na2a || ic->a2b.id != CKPT_CODEC_BYTES || ic->a2b.endian == CKPT_ENDIAN_BIG ||
			    ic->nb2b > 1 || (ic->nb2b == 1 && ic->b2b[0].id != CKPT_CODEC_CRC32C)) {
				*why = "unsupported index_codecs";
				return -ENOTSUP;
			}
			m->index_crc = ic->nb2b == 1;
		}
		m->index_at_start = sh->index_at_start;
	}
	if ((rc = plan_chain(data, m, why)) < 0)
		return rc;
	if ((rc = finish_meta(m, why)) < 0)
		return rc;
	memcpy(m->fill, zm->fill, sizeof(m->fill));
	m->fill_null = zm->fill_null;
	m->zip_has_crc = zm->zip_has_crc;
	m->zip_crc32 = zm->zip_crc32;
	m->zip_head_crc32 = zm->zip_head_crc32;
	if (zm->fill_lossy)
		ckpt_log(CKPT_LOG_WARN, "non-zero fill_value for %s read as zeros",
			 ckpt_dtype_get(m->dtype)->name);
	return 0;
}

int ckpt_zarr_parse(int format, const char *json, size_t len, ckpt_array_meta *out, const char **why)
{
	struct ckpt_zarr_meta zm;
	memset(out, 0, sizeof(*out));
	*why = "";
	static _Thread_local char whybuf[128];
	int rc = ckpt_zarr_meta_parse(json, len, format, &zm, why);
	if (rc == -ENOTSUP && zm.unsupported[0]) {
		snprintf(whybuf, sizeof(whybuf), "%s \"%s\"", *why, zm.unsupported);
		*why = whybuf;
	}
	if (rc == 0)
		rc = plan(&zm, out, why);
	ckpt_zarr_meta_free(&zm);
	return rc;
}

void ckpt_zarr_codec_str(const ckpt_array_meta *m, char *buf, size_t cap)
{
	char chain[96] = "";
	size_t n = 0;
	static const char *const names[] = { "?",     "zstd", "crc32c", "gzip",	  "zlib",
					     "blosc", "lz4",  "bz2",	"deflate" };
	if (m->zarr_format == 3 && n < sizeof(chain))
		n += (size_t)snprintf(chain + n, sizeof(chain) - n, "bytes");
	for (int i = 0; i < m->nb2b && n < sizeof(chain); i++)
		n += (size_t)snprintf(chain + n, sizeof(chain) - n, "%s%s", n ? "," : "",
				      m->b2b[i] < sizeof(names) / sizeof(names[0]) ? names[m->b2b[i]] : "?");
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
	uint8_t *aux; /* transpose / shard index */
	size_t auxcap;
	uint8_t *tmp; /* a decompressor's output when crc32c bytes follow it */
	size_t tmpcap;
	uint32_t unit_crc; /* zip_has_crc: CRC-32 of the last unit's stored bytes */
};

uint32_t ckpt_zarr_scratch_unit_crc(const ckpt_zarr_scratch *sc)
{
	return sc->unit_crc;
}

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
	ckpt_hugebuf_free(sc->buf, sc->cap);
	ckpt_hugebuf_free(sc->aux, sc->auxcap);
	ckpt_hugebuf_free(sc->tmp, sc->tmpcap);
	free(sc);
}

/* The scratch buffers hold whole stored chunks (tens of MiB): from 2 MiB
 * on they are huge-page mappings (hugebuf.h), which the read that fills
 * them and the decompressor that reads them walk with fewer TLB misses.
 * Their bytes are not kept when they grow. */
static int grow(uint8_t **p, size_t *cap, size_t need)
{
	if (need <= *cap)
		return 0;
	size_t n = *cap ? *cap : 4096;
	while (n < need)
		n *= 2;
	size_t ncap;
	uint8_t *q = ckpt_hugebuf_alloc(n, &ncap);
	if (!q)
		return -ENOMEM;
	ckpt_hugebuf_free(*p, *cap);
	*p = q;
	*cap = ncap;
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

/* Stored (transposed) unit -> C order of the decoded unit, via aux.
 * Stored dimension i is decoded dimension perm[i]; the stored array is in
 * C order of its own (permuted) shape. */
static int untranspose(const ckpt_array_meta *m, uint8_t *p, ckpt_zarr_scratch *sc)
{
	if (grow(&sc->aux, &sc->auxcap, m->unit_bytes) < 0)
		return -ENOMEM;
	memcpy(sc->aux, p, m->unit_bytes);
	/* stride (in elements) of decoded dimension d inside the stored array */
	uint64_t stride[CKPT_MAX_RANK], st = 1;
	for (int i = m->rank - 1; i >= 0; i--) {
		stride[m->perm[i]] = st;
		st *= m->inner_shape[m->perm[i]];
	}
	uint64_t n = m->unit_bytes / m->itemsize;
	uint64_t idx[CKPT_MAX_RANK] = { 0 };
	uint64_t f = 0; /* stored position of decoded element c */
	for (uint64_t c = 0; c < n; c++) {
		memcpy(p + c * m->itemsize, sc->aux + f * m->itemsize, m->itemsize);
		for (int d = m->rank - 1; d >= 0; d--) {
			if (++idx[d] < m->inner_shape[d]) {
				f += stride[d];
				break;
			}
			f -= (idx[d] - 1) * stride[d];
			idx[d] = 0;
		}
	}
	return 0;
}

static const char *zlib_what(int b)
{
	return b == CKPT_B2B_GZIP ? "gzip" : b == CKPT_B2B_RAW_DEFLATE ? "deflate" : "zlib";
}

/* gzip / zlib stream (either header: inflate detects it), or a raw deflate
 * stream (CKPT_B2B_RAW_DEFLATE) -> exactly `want` bytes; never writes past
 * dst + want.  crc (not NULL): the CRC-32 every inflated byte must have,
 * the skipped ones included (a ZIP member's). */
static int inflate_to(const char *root, const char *key, int b, const uint8_t *src, size_t n, uint8_t *dst,
		      size_t want, uint32_t skip, const uint32_t *crc)
{
	uLong sum = crc32(0L, Z_NULL, 0);
	z_stream z;
	memset(&z, 0, sizeof(z));
	if (inflateInit2(&z, b == CKPT_B2B_RAW_DEFLATE ? -MAX_WBITS : 32 + MAX_WBITS) != Z_OK)
		return -ENOMEM;
	size_t in_left = n, out_left = want;
	const uint8_t *in = src;
	uint8_t *out = dst, spill;
	int zr = Z_OK, larger = 0;
	/* bytes before the unit's own (skip < 2^20, so avail_in fits): dropped */
	while (skip && zr == Z_OK) {
		uint8_t junk[4096];
		uInt ai = in_left > UINT32_MAX ? UINT32_MAX : (uInt)in_left;
		uInt ao = skip < sizeof(junk) ? skip : (uInt)sizeof(junk);
		z.next_in = (Bytef *)in;
		z.avail_in = ai;
		z.next_out = junk;
		z.avail_out = ao;
		zr = inflate(&z, Z_NO_FLUSH);
		size_t used = ai - z.avail_in, made = ao - z.avail_out;
		in += used;
		in_left -= used;
		skip -= (uint32_t)made;
		if (crc)
			sum = crc32(sum, junk, (uInt)made);
		if (zr == Z_OK && !used && !made)
			zr = Z_BUF_ERROR;
		if (zr == Z_STREAM_END && (skip || want))
			zr = Z_DATA_ERROR; /* ends inside the header */
	}
	/* avail_in/avail_out are 32-bit: feed in pieces.  Once the chunk is
	 * full, a 1-byte spill buffer tells "stream ends here" from "more data". */
	while (zr == Z_OK) {
		uInt ai = in_left > UINT32_MAX ? UINT32_MAX : (uInt)in_left;
		uInt ao = out_left > UINT32_MAX ? UINT32_MAX : (uInt)out_left;
		z.next_in = (Bytef *)in;
		z.avail_in = ai;
		z.next_out = ao ? out : &spill;
		z.avail_out = ao ? ao : 1;
		zr = inflate(&z, Z_NO_FLUSH);
		size_t used = ai - z.avail_in, made = (ao ? ao : 1) - z.avail_out;
		if (!ao && made) {
			larger = 1;
			break;
		}
		in += used;
		in_left -= used;
		if (ao) {
			out += made;
			out_left -= made;
		}
		if (zr == Z_OK && !used && !made)
			zr = Z_BUF_ERROR; /* truncated */
	}
	size_t got = want - out_left;
	inflateEnd(&z);
	if (crc && !larger && zr == Z_STREAM_END && got == want && in_left == 0) {
		sum = crc32_z(sum, dst, want);
		if ((uint32_t)sum != *crc) {
			ckpt_log(CKPT_LOG_ERR, "%s/%s: CRC-32 mismatch of the ZIP member (%08x, stored %08x)",
				 root, key, (unsigned)sum, (unsigned)*crc);
			return -EIO;
		}
	}
	if (larger || zr != Z_STREAM_END || got != want || in_left != 0) {
		ckpt_log(CKPT_LOG_ERR, "%s/%s: bad %s data (%s; %zu of %zu bytes)", root, key, zlib_what(b),
			 larger ? "decodes to more than the chunk"
			 : zr == Z_STREAM_END
				 ? (in_left ? "trailing bytes" : "decodes to less than the chunk")
			 : z.msg ? z.msg
				 : "truncated",
			 got, want);
		return -EIO;
	}
	return 0;
}

/* One compressor: src (n bytes) -> exactly `want` bytes at dst. */
static int decompress(const char *root, const char *key, int b, const uint8_t *src, size_t n, uint8_t *dst,
		      size_t want, ckpt_zarr_scratch *sc, const ckpt_array_meta *m)
{
	switch (b) {
	case CKPT_B2B_ZSTD: {
		unsigned long long fcs = ZSTD_getFrameContentSize(src, n);
		if (fcs == ZSTD_CONTENTSIZE_ERROR || (fcs != ZSTD_CONTENTSIZE_UNKNOWN && fcs != want)) {
			ckpt_log(CKPT_LOG_ERR, "%s/%s: bad zstd frame (content size %lld, expected %zu)",
				 root, key, fcs == ZSTD_CONTENTSIZE_ERROR ? -1LL : (long long)fcs, want);
			return -EIO;
		}
		size_t r = ZSTD_decompressDCtx(sc->dctx, dst, want, src, n);
		if (ZSTD_isError(r) || r != want) {
			ckpt_log(CKPT_LOG_ERR, "%s/%s: zstd decode failed: %s", root, key,
				 ZSTD_isError(r) ? ZSTD_getErrorName(r) : "wrong decoded size");
			return -EIO;
		}
		return 0;
	}
	case CKPT_B2B_GZIP:
	case CKPT_B2B_ZLIB:
	case CKPT_B2B_RAW_DEFLATE:
		return inflate_to(root, key, b, src, n, dst, want,
				  b == CKPT_B2B_RAW_DEFLATE ? m->deflate_skip : 0,
				  b == CKPT_B2B_RAW_DEFLATE && m->deflate_has_crc ? &m->deflate_crc : NULL);
	case CKPT_B2B_BLOSC: {
		size_t nbytes = 0, cbytes = 0, bsize = 0;
		if (n < BLOSC_MIN_HEADER_LENGTH || blosc_cbuffer_validate(src, n, &nbytes) < 0 ||
		    (blosc_cbuffer_sizes(src, &nbytes, &cbytes, &bsize), cbytes > n) || nbytes != want ||
		    want > INT32_MAX) {
			ckpt_log(CKPT_LOG_ERR, "%s/%s: bad blosc header (decoded size %zu, expected %zu)",
				 root, key, nbytes, want);
			return -EIO;
		}
		int r = blosc_decompress_ctx(src, dst, want, 1);
		if (r < 0 || (size_t)r != want) {
			ckpt_log(CKPT_LOG_ERR, "%s/%s: blosc decode failed (%d)", root, key, r);
			return -EIO;
		}
		return 0;
	}
	case CKPT_B2B_LZ4: {
		if (n < 4 || ckpt_le32(src) != want || want > INT32_MAX || n - 4 > INT32_MAX) {
			ckpt_log(CKPT_LOG_ERR, "%s/%s: bad lz4 header (decoded size %lld, expected %zu)",
				 root, key, n < 4 ? -1LL : (long long)ckpt_le32(src), want);
			return -EIO;
		}
		int r = LZ4_decompress_safe((const char *)src + 4, (char *)dst, (int)(n - 4), (int)want);
		if (r < 0 || (size_t)r != want) {
			ckpt_log(CKPT_LOG_ERR, "%s/%s: lz4 decode failed (%d)", root, key, r);
			return -EIO;
		}
		return 0;
	}
	case CKPT_B2B_BZ2: {
		if (want > UINT32_MAX || n > UINT32_MAX) {
			ckpt_log(CKPT_LOG_ERR, "%s/%s: bz2 chunk too large", root, key);
			return -EIO;
		}
		unsigned int dl = (unsigned int)want;
		int r = BZ2_bzBuffToBuffDecompress((char *)dst, &dl, (char *)src, (unsigned int)n, 0, 0);
		if (r != BZ_OK || dl != want) {
			ckpt_log(CKPT_LOG_ERR, "%s/%s: bz2 decode failed (%d; %u of %zu bytes)", root, key, r,
				 r == BZ_OK ? dl : 0, want);
			return -EIO;
		}
		return 0;
	}
	default:
		ckpt_log(CKPT_LOG_ERR, "%s/%s: unknown codec %d", root, key, b);
		return -EIO;
	}
}

/* Undo the bytes->bytes chain of `src` (n bytes; may be modified) into dst
 * (unit_bytes).  Every output size is known: the compressor must produce
 * the unit plus 4 bytes per crc32c applied before it when encoding. */
static int decode_chain(const ckpt_array_meta *m, const char *root, const char *key, const uint8_t *src,
			size_t n, uint8_t *dst, ckpt_zarr_scratch *sc)
{
	const uint8_t *cur = src;
	for (int i = m->nb2b - 1; i >= 0; i--) {
		if (m->b2b[i] == CKPT_B2B_CRC32C) {
			if (n < 4) {
				ckpt_log(CKPT_LOG_ERR, "%s/%s: chunk too short for its crc32c", root, key);
				return -EIO;
			}
			if (ckpt_crc32c(0, cur, n - 4) != ckpt_le32(cur + n - 4)) {
				ckpt_log(CKPT_LOG_ERR, "%s/%s: chunk CRC-32C mismatch", root, key);
				return -EIO;
			}
			n -= 4;
			continue;
		}
		size_t want = (size_t)m->unit_bytes;
		for (int j = 0; j < i; j++)
			want += m->b2b[j] == CKPT_B2B_CRC32C ? 4 : 0;
		uint8_t *out = dst;
		if (want != m->unit_bytes) {
			if (grow(&sc->tmp, &sc->tmpcap, want) < 0)
				return -ENOMEM;
			out = sc->tmp;
		}
		int rc = decompress(root, key, m->b2b[i], cur, n, out, want, sc, m);
		if (rc < 0)
			return rc;
		cur = out;
		n = want;
	}
	if (n != m->unit_bytes) {
		ckpt_log(CKPT_LOG_ERR, "%s/%s: chunk has %zu bytes, expected %llu", root, key, n,
			 (unsigned long long)m->unit_bytes);
		return -EIO;
	}
	if (cur != dst)
		memmove(dst, cur, n);
	if (m->zip_has_crc) /* the stored bytes, before they are rearranged */
		sc->unit_crc = (uint32_t)crc32_z(crc32(0L, Z_NULL, 0), dst, n);
	if (m->order_f && m->rank > 1 && untranspose(m, dst, sc) < 0)
		return -ENOMEM;
	if (m->big_endian && m->itemsize > 1)
		swap_bytes(dst, m->unit_bytes,
			   m->dtype == CKPT_DT_COMPLEX64 || m->dtype == CKPT_DT_COMPLEX128 ? m->itemsize / 2
											   : m->itemsize);
	CKPT_STAT_ADD(chunks_decoded, 1);
	CKPT_STAT_ADD(decoded_bytes, m->unit_bytes);
	return 0;
}

int ckpt_zarr_decode_unit(const ckpt_array_meta *m, const char *what, const void *src, size_t n, void *dst,
			  ckpt_zarr_scratch *sc)
{
	return decode_chain(m, "", what, src, n, dst, sc);
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

uint64_t ckpt_zarr_storage_index(const ckpt_array_meta *m, const uint64_t *g, uint64_t *sg)
{
	uint64_t inner = 0;
	for (int d = 0; d < m->rank; d++) {
		uint64_t ratio = m->chunk_shape[d] / m->inner_shape[d];
		sg[d] = g[d] / ratio;
		inner = inner * ratio + g[d] % ratio;
	}
	return inner;
}

/* A unit the metadata implies but the store lacks: the fill value (zeros
 * for a v2 fill_value null, as TensorStore and zarr read it), unless every
 * unit was stored. */
static int missing(const ckpt_array_meta *m, uint8_t *dst)
{
	if (m->missing_is_error)
		return -ENODATA;
	fill_unit(m, dst);
	return 0;
}

int ckpt_zarr_key_identity(ckpt_store *s, const char *key, struct ckpt_zarr_unit_id *id)
{
	struct ckpt_store_stat st;
	memset(id, 0, sizeof(*id));
	int rc = ckpt_store_stat(s, key, &st);
	if (rc == -ENOENT || (rc == 0 && st.is_dir)) {
		id->absent = 1;
		return 0;
	}
	if (rc < 0)
		return rc;
	id->size = st.size;
	id->mtime_ns = st.mtime_ns;
	return 0;
}

int ckpt_zarr_unit_identity(ckpt_store *s, const char *prefix, const ckpt_array_meta *m, const uint64_t *g,
			    struct ckpt_zarr_unit_id *id)
{
	char key[4096];
	uint64_t sg[CKPT_MAX_RANK];
	ckpt_zarr_storage_index(m, g, sg);
	if (ckpt_zarr_unit_key(m, prefix, sg, key, sizeof(key)) < 0)
		return -ENAMETOOLONG;
	return ckpt_zarr_key_identity(s, key, id);
}

int ckpt_zarr_read_unit(ckpt_store *s, const char *prefix, const ckpt_array_meta *m, const uint64_t *g,
			void *dst, ckpt_zarr_scratch *sc)
{
	return ckpt_zarr_read_unit_id(s, prefix, m, g, dst, sc, NULL);
}

/* The stored range of inner chunk `inner` from the shard index ix (of a
 * shard of `size` bytes): 0, -ENODATA when the index marks it absent, -EIO
 * (logged) for a CRC mismatch or a range outside the shard or larger than
 * any encoding of the unit. */
static int shard_entry(const ckpt_array_meta *m, const char *root, const char *key, const uint8_t *ix,
		       uint64_t inner, uint64_t size, uint64_t *off_out, uint64_t *n_out)
{
	uint64_t nidx = m->inner_per_shard;
	if (m->index_crc && ckpt_crc32c(0, ix, 16 * nidx) != ckpt_le32(ix + 16 * nidx)) {
		ckpt_log(CKPT_LOG_ERR, "%s/%s: shard index CRC-32C mismatch", root, key);
		return -EIO;
	}
	uint64_t off = ckpt_le64(ix + 16 * inner), n = ckpt_le64(ix + 16 * inner + 8);
	if (off == UINT64_MAX && n == UINT64_MAX)
		return -ENODATA;
	uint64_t end;
	if (ckpt_add_u64(off, n, &end) < 0 || end > size ||
	    n > m->unit_bytes + (m->unit_bytes >> 3) + (1u << 20)) {
		ckpt_log(CKPT_LOG_ERR,
			 "%s/%s: inner chunk %llu range [%llu,+%llu) outside the shard (%llu bytes)", root,
			 key, (unsigned long long)inner, (unsigned long long)off, (unsigned long long)n,
			 (unsigned long long)size);
		return -EIO;
	}
	*off_out = off;
	*n_out = n;
	return 0;
}

/* The byte size of a shard's index. */
static uint64_t shard_index_size(const ckpt_array_meta *m)
{
	return 16 * m->inner_per_shard + (m->index_crc ? 4 : 0);
}

int ckpt_zarr_inner_range(ckpt_store *s, const char *key, const ckpt_array_meta *m, uint64_t inner,
			  uint64_t size, uint64_t *off, uint64_t *n)
{
	assert(m->sharded && inner < m->inner_per_shard);
	uint64_t isize = shard_index_size(m);
	if (size < isize) {
		ckpt_log(CKPT_LOG_ERR, "%s/%s: shard of %llu bytes is smaller than its index (%llu)", s->root,
			 key, (unsigned long long)size, (unsigned long long)isize);
		return -EIO;
	}
	if (isize > (1u << 20))
		return -ENOTSUP; /* the whole-unit path reads large indexes */
	uint8_t *buf = malloc((size_t)isize);
	if (!buf)
		return -ENOMEM;
	int rc = read_exact(s, key, m->index_at_start ? 0 : size - isize, (size_t)isize, buf);
	if (rc == 0)
		rc = shard_entry(m, s->root, key, buf, inner, size, off, n);
	free(buf);
	return rc;
}

int ckpt_zarr_read_unit_id(ckpt_store *s, const char *prefix, const ckpt_array_meta *m, const uint64_t *g,
			   void *dst, ckpt_zarr_scratch *sc, struct ckpt_zarr_unit_id *idp)
{
	char key[4096];
	uint64_t sg[CKPT_MAX_RANK];
	uint64_t inner =
		ckpt_zarr_storage_index(m, g, sg); /* C-order index of the inner chunk within its shard */
	if (ckpt_zarr_unit_key(m, prefix, sg, key, sizeof(key)) < 0)
		return -ENAMETOOLONG;
	struct ckpt_zarr_unit_id idl, *id = idp ? idp : &idl;
	int rc = ckpt_zarr_key_identity(s, key, id);
	if (rc < 0)
		return rc;
	if (id->absent)
		return missing(m, dst);
	uint64_t size = id->size;
	if (!m->sharded) {
		if (size > m->unit_bytes + (m->unit_bytes >> 3) + (1u << 20)) {
			ckpt_log(CKPT_LOG_ERR,
				 "%s/%s: stored chunk of %llu bytes is larger than any encoding of %llu",
				 s->root, key, (unsigned long long)size, (unsigned long long)m->unit_bytes);
			return -EIO;
		}
		/* No bytes-to-bytes codec: the stored bytes are the unit, read in place. */
		uint8_t *buf = m->nb2b == 0 && size == m->unit_bytes ? dst : NULL;
		if (!buf) {
			if (grow(&sc->buf, &sc->cap, (size_t)size) < 0)
				return -ENOMEM;
			buf = sc->buf;
		}
		if ((rc = read_exact(s, key, 0, (size_t)size, buf)) < 0)
			return rc;
		return decode_chain(m, s->root, key, buf, (size_t)size, dst, sc);
	}
	/* sharding_indexed: find the inner chunk through the shard index. */
	uint64_t nidx = m->inner_per_shard;
	uint64_t isize = shard_index_size(m);
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
	uint64_t off, n;
	rc = shard_entry(m, s->root, key, ix, inner, size, &off, &n);
	if (rc == -ENODATA)
		return missing(m, dst);
	if (rc < 0)
		return rc;
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
