/*
 * zarr_chunk.h - the decode plan of a zarr v2 / v3 array (from the metadata
 * model of format/zarr_meta.h), chunk keys, and decoding one stored unit
 * through a store.
 *
 * Vocabulary: a *storage unit* is one stored value (a v2 chunk, or a v3
 * chunk which may be a sharding_indexed shard); a *decode unit* is the
 * smallest independently decodable piece (the v3 inner chunk when sharded,
 * else the storage unit).  The chunk cache and all readers work in decode
 * units; `ckpt_array_meta.inner_shape` is their shape and the "chunk grid"
 * of an array is the grid of decode units.
 *
 * Supported: v2 compressor null / zstd, dtype any of dtype.h incl. '>'
 * byte order, order C or F, dimension_separator '.' or '/', fill_value
 * null/number/"NaN"/"Infinity"/"0x<bits>"; v3 codecs [transpose to F order]
 * → bytes (+endian) → zstd / crc32c, or sharding_indexed (inner chain as
 * before; index bytes + crc32c; index at start or end), chunk_key_encoding
 * default or v2.  Anything else is refused with a reason (-ENOTSUP).
 */
#ifndef CKPT_ZARR_CHUNK_H
#define CKPT_ZARR_CHUNK_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "dtype.h"
#include "store.h"
#include "zarr_meta.h"

enum ckpt_b2b { CKPT_B2B_ZSTD = 1, CKPT_B2B_CRC32C = 2 };

typedef struct ckpt_array_meta {
	int zarr_format; /* 2 or 3 */
	ckpt_dtype dtype;
	unsigned itemsize;
	int rank;
	uint64_t shape[CKPT_MAX_RANK];
	uint64_t chunk_shape[CKPT_MAX_RANK]; /* storage unit (v2 chunk / v3 shard) */
	uint64_t inner_shape[CKPT_MAX_RANK]; /* decode unit (== chunk_shape unless sharded) */
	uint64_t grid[CKPT_MAX_RANK]; /* decode units per dim */
	uint64_t store_grid[CKPT_MAX_RANK]; /* storage units per dim */
	uint64_t inner_per_shard; /* decode units per storage unit */
	uint64_t nbytes; /* prod(shape) * itemsize */
	uint64_t unit_bytes; /* bytes of one decoded unit */
	int sharded;
	int index_at_start;
	int index_crc;
	int big_endian;
	int order_f; /* v2 order "F" */
	int nb2b; /* bytes->bytes codecs, in encode order */
	uint8_t b2b[CKPT_ZARR_MAX_B2B];
	int zstd_level; /* informational */
	char sep; /* chunk key separator */
	int key_c_prefix; /* v3 default encoding: "c/..." */
	uint8_t fill[16]; /* one element of the fill value */
} ckpt_array_meta;

/* Parse `.zarray` (format 2) or `zarr.json` (format 3) text (through
 * ckpt_zarr_meta_parse) into a decode plan.  Returns 0, or -EINVAL
 * (malformed / absurd: *why says what) or -ENOTSUP (valid but unsupported
 * codec/dtype: *why says which), or -ENOMEM.  Shapes whose byte size would
 * overflow 2^62 are -EINVAL; a decoded unit over 16 GiB or more than 2^32
 * inner chunks per shard are -EINVAL too. */
int ckpt_zarr_parse(int format, const char *json, size_t len, ckpt_array_meta *out, const char **why);

/* Human-readable codec summary for xattrs, e.g. "sharding_indexed(inner=[16,16],bytes,zstd)". */
void ckpt_zarr_codec_str(const ckpt_array_meta *m, char *buf, size_t cap);

/* Store key of the storage unit at storage-grid index `g`, under `prefix`
 * ("" or "name"); returns length or -ENOBUFS. */
int ckpt_zarr_unit_key(const ckpt_array_meta *m, const char *prefix, const uint64_t *g, char *buf,
		       size_t cap);

/* Per-thread decode scratch (one per thread; never shared). */
typedef struct ckpt_zarr_scratch ckpt_zarr_scratch;
ckpt_zarr_scratch *ckpt_zarr_scratch_create(void);
void ckpt_zarr_scratch_destroy(ckpt_zarr_scratch *sc);

/* Decode the decode unit at (decode-unit) grid index `g` of the array
 * stored under `prefix` in `s` into dst (m->unit_bytes bytes, C order,
 * native little-endian).  A missing unit reads as fill.  Returns 0, or
 * -EIO after logging the key and the reason (truncated, CRC mismatch, bad
 * zstd frame, wrong size, index out of bounds). */
int ckpt_zarr_read_unit(ckpt_store *s, const char *prefix, const ckpt_array_meta *m, const uint64_t *g,
			void *dst, ckpt_zarr_scratch *sc);

/* Sum of the stored sizes of all storage units (listing the store). */
int ckpt_zarr_stored_bytes(ckpt_store *s, const char *prefix, const ckpt_array_meta *m, uint64_t *out);

#endif
