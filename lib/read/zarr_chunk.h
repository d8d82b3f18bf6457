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
 * Supported: v2 compressor null / zstd / zlib / gzip / blosc / lz4 / bz2,
 * dtype any of dtype.h incl. '>' byte order, order C or F,
 * dimension_separator '.' or '/', fill_value null/number/"NaN"/"Infinity"/
 * "0x<bits>"; v3 codecs [transpose (any permutation)...] → bytes (+endian)
 * → any of zstd / gzip / blosc / crc32c (at most one compressor; crc32c
 * anywhere), or sharding_indexed (inner chain as before; index bytes +
 * crc32c; index at start or end), chunk_key_encoding default or v2.
 * Anything else is refused with a reason naming it (-ENOTSUP).
 *
 * Bounds: every decoder writes at most the size the chunk shape implies
 * (plus 4 bytes per crc32c still to strip) and fails (-EIO, logged) when
 * the stored bytes decode to more or less; stored units larger than any
 * encoding of their unit are refused before they are read.
 *
 * Missing data: a storage unit absent from the store, or an inner chunk
 * that its shard's index marks absent, reads as the fill value (zeros for a
 * v2 fill_value null, as TensorStore, T5X and zarr-python read it) unless
 * `missing_is_error` (set by the caller: store_array_data_equal_to_fill_value
 * true, or a step ckptfs wrote); then ckpt_zarr_read_unit answers -ENODATA
 * without logging, and the caller (read/array.c) logs and answers -EIO.
 */
#ifndef CKPT_ZARR_CHUNK_H
#define CKPT_ZARR_CHUNK_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "dtype.h"
#include "store.h"
#include "zarr_meta.h"

enum ckpt_b2b {
	CKPT_B2B_ZSTD = 1,
	CKPT_B2B_CRC32C = 2,
	CKPT_B2B_GZIP = 3, /* RFC 1952 (v2 "gzip", v3 "gzip") */
	CKPT_B2B_ZLIB = 4, /* RFC 1950 (v2 "zlib") */
	CKPT_B2B_BLOSC = 5, /* a blosc 1 frame (any internal compressor and shuffle) */
	CKPT_B2B_LZ4 = 6, /* numcodecs lz4: 4-byte LE decoded size + an LZ4 block */
	CKPT_B2B_BZ2 = 7, /* a bzip2 stream */
	CKPT_B2B_RAW_DEFLATE = 8, /* raw RFC 1951 deflate (ZIP method 8; ckptfs.raw_deflate) */
};

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
	int order_f; /* stored transposed (v2 order "F", a v3 transpose): see perm */
	int perm[CKPT_MAX_RANK]; /* stored dimension i = decoded dimension perm[i] */
	int nb2b; /* bytes->bytes codecs, in encode order */
	uint8_t b2b[CKPT_ZARR_MAX_B2B];
	int zstd_level; /* informational */
	uint32_t deflate_skip; /* CKPT_B2B_RAW_DEFLATE: decoded bytes dropped before the unit */
	int deflate_has_crc; /* ... and the CRC-32 of all its decoded bytes (a ZIP member's) */
	uint32_t deflate_crc;
	char sep; /* chunk key separator */
	int key_c_prefix; /* v3 default encoding: "c/..." */
	uint8_t fill[16]; /* one element of the fill value */
	int fill_null; /* v2 fill_value null: no fill value stated (missing units read as zeros) */
	/* A stored ZIP member (zarr_meta.h, zip_has_crc): each decode leaves
	 * the CRC-32 of the unit's stored bytes in the scratch
	 * (ckpt_zarr_scratch_unit_crc), for the array to check the member. */
	int zip_has_crc;
	uint32_t zip_crc32, zip_head_crc32;
	int missing_is_error; /* a missing unit is -ENODATA, never the fill value */
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
 * native little-endian).  A missing unit reads as fill (zeros for
 * fill_value null), or is -ENODATA (not logged) when m->missing_is_error.  Returns 0, or
 * -EIO after logging the key and the reason (truncated, CRC mismatch, bad
 * compressed data, wrong size, index out of bounds), or the store's error
 * (-ESTALE, ...). */
int ckpt_zarr_read_unit(ckpt_store *s, const char *prefix, const ckpt_array_meta *m, const uint64_t *g,
			void *dst, ckpt_zarr_scratch *sc);

/* After a successful read of a unit of an array with zip_has_crc: the
 * CRC-32 of its stored bytes (before byte swaps and transposes). */
uint32_t ckpt_zarr_scratch_unit_crc(const ckpt_zarr_scratch *sc);

/* The identity of a storage unit as the store reported it when it was read
 * (for revalidating decoded data later): size and mtime, or absent. */
struct ckpt_zarr_unit_id {
	int absent;
	uint64_t size;
	int64_t mtime_ns;
};

/* ckpt_zarr_read_unit that also reports the identity of the storage unit
 * it read (*id, when id is not NULL; set whenever the store answered). */
int ckpt_zarr_read_unit_id(ckpt_store *s, const char *prefix, const ckpt_array_meta *m, const uint64_t *g,
			   void *dst, ckpt_zarr_scratch *sc, struct ckpt_zarr_unit_id *id);

/* Decode the stored bytes of one decode unit (a v2 chunk, a v3 chunk, or
 * an inner chunk of a shard: the bytes ckpt_zarr_read_unit would read) into
 * dst (m->unit_bytes bytes).  `what` names it in log lines.  Never writes
 * outside dst; 0 or -EIO (logged), -ENOMEM. */
int ckpt_zarr_decode_unit(const ckpt_array_meta *m, const char *what, const void *src, size_t n, void *dst,
			  ckpt_zarr_scratch *sc);

/* The current identity of stored value `key` (one stat of the store): size
 * and mtime, or absent (missing, or a folder).  0, or the store's error
 * other than -ENOENT. */
int ckpt_zarr_key_identity(ckpt_store *s, const char *key, struct ckpt_zarr_unit_id *id);

/* The current identity of the storage unit holding decode unit g (one
 * stat of the store).  0, or the store's error other than -ENOENT. */
int ckpt_zarr_unit_identity(ckpt_store *s, const char *prefix, const ckpt_array_meta *m, const uint64_t *g,
			    struct ckpt_zarr_unit_id *id);

/* Storage-grid index of decode unit g (sg[rank]); returns the C-order
 * index of g inside its storage unit. */
uint64_t ckpt_zarr_storage_index(const ckpt_array_meta *m, const uint64_t *g, uint64_t *sg);

/* Sharded arrays: the stored byte range [*off, *off + *n) of inner chunk
 * `inner` (C-order index within its shard) of the shard stored under `key`,
 * `size` bytes long, read from the shard's index (one read of the index).
 * 0; -ENODATA (not logged) when the index marks the inner chunk absent;
 * -ENOTSUP for an index over 1 MiB; -EIO (logged) for a shard smaller than
 * its index, an index CRC-32C mismatch or a range outside the shard; the
 * store's error. */
int ckpt_zarr_inner_range(ckpt_store *s, const char *key, const ckpt_array_meta *m, uint64_t inner,
			  uint64_t size, uint64_t *off, uint64_t *n);

/* Sum of the stored sizes of all storage units (listing the store). */
int ckpt_zarr_stored_bytes(ckpt_store *s, const char *prefix, const ckpt_array_meta *m, uint64_t *out);

#endif
