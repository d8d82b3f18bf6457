/*
 * zarr_meta.h - one model of zarr array metadata, v2 (.zarray) and v3
 * (zarr.json), with a parser and an emitter.  Pure: no I/O, no threads, no
 * global state; functions are thread-safe on distinct models.
 *
 * The model follows zarr v3: an array's stored unit is produced by a codec
 * chain of
 *   array -> array codecs   (transpose),
 *   one array -> bytes codec (bytes, with its endianness; or sharding_indexed,
 *                            which owns an inner chunk shape, an inner chain
 *                            for the inner chunks, an index chain for the
 *                            shard index and the index's location),
 *   bytes -> bytes codecs    (zstd, gzip, blosc, crc32c; and the zarr v2
 *                            compressors zlib, lz4, bz2, which v3 does not name),
 * applied in that order when encoding.  A v2 array is mapped onto the same
 * model: its dtype's byte order becomes the bytes codec's endianness, order
 * "F" a transpose that reverses the dimensions, its compressor the one
 * bytes -> bytes codec, and its dimension_separator a "v2" chunk key encoding.
 *
 * The model represents what zarr can say; what ckptfs can decode is decided
 * by the reader (read/zarr_chunk.h), which refuses the rest with a reason.
 * docs/format.md lists the members ckptfs reads and writes.
 */
#ifndef CKPT_ZARR_META_H
#define CKPT_ZARR_META_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "dtype.h"

#define CKPT_ZARR_MAX_A2A 4 /* array -> array codecs per chain */
#define CKPT_ZARR_MAX_B2B 4 /* bytes -> bytes codecs per chain */
#define CKPT_ZARR_MAX_NESTING 3
#define CKPT_ZARR_RAW_DEFLATE_ID "ckptfs.raw_deflate" /* see CKPT_CODEC_RAW_DEFLATE */
#define CKPT_ZARR_MAX_SKIP (1u << 20) /* sharding_indexed inside sharding_indexed ... */

enum ckpt_zarr_codec_id {
	CKPT_CODEC_NONE = 0, /* no codec (an absent index chain) */
	/* array -> array */
	CKPT_CODEC_TRANSPOSE,
	/* array -> bytes */
	CKPT_CODEC_BYTES,
	CKPT_CODEC_SHARDING,
	/* bytes -> bytes */
	CKPT_CODEC_ZSTD,
	CKPT_CODEC_GZIP,
	CKPT_CODEC_BLOSC,
	CKPT_CODEC_CRC32C,
	/* bytes -> bytes, zarr v2 compressors only (numcodecs ids) */
	CKPT_CODEC_ZLIB, /* "zlib": RFC 1950 stream */
	CKPT_CODEC_LZ4, /* "lz4": 4-byte little-endian decoded size + one LZ4 block */
	CKPT_CODEC_BZ2, /* "bz2": one bzip2 stream */
	/* bytes -> bytes, ckptfs's own v2 compressor name "ckptfs.raw_deflate":
	 * one raw RFC 1951 deflate stream (no header: a ZIP method-8 member),
	 * used by the virtual items foreign formats are translated into */
	CKPT_CODEC_RAW_DEFLATE,
};

enum ckpt_zarr_endian {
	CKPT_ENDIAN_NONE = 0, /* not given (single-byte types) */
	CKPT_ENDIAN_LITTLE,
	CKPT_ENDIAN_BIG,
};

struct ckpt_zarr_sharding;

struct ckpt_zarr_codec {
	enum ckpt_zarr_codec_id id;
	/* TRANSPOSE: order[i] = the input dimension that becomes dimension i
	 * (an index chain's arrays have one dimension more than the array) */
	int order[CKPT_MAX_RANK + 1];
	/* BYTES */
	enum ckpt_zarr_endian endian;
	/* ZSTD, GZIP, ZLIB, BZ2: level; ZSTD: checksum (0/1); BLOSC: clevel;
	 * LZ4: acceleration */
	int level;
	int checksum;
	/* BLOSC */
	char cname[16]; /* "lz4", "zstd", ... */
	int shuffle; /* 0 noshuffle, 1 shuffle, 2 bitshuffle; -1 (zarr v2 only: numcodecs'
		      * AUTOSHUFFLE; the blosc frame itself says how it was shuffled) */
	int typesize; /* 0: not given */
	uint64_t blocksize;
	/* zarr v3: written as "numcodecs.<id>" with numcodecs' configuration
	 * (zarr-python's numcodecs.zarr3 codecs: zlib, gzip, bz2, lz4, zstd,
	 * blosc, crc32c) */
	int numcodecs;
	/* RAW_DEFLATE: decoded bytes before the chunk's own (an .npy header
	 * inside a deflated .npz member), dropped; at most CKPT_ZARR_MAX_SKIP */
	uint32_t skip;
	/* RAW_DEFLATE: the CRC-32 (ZIP's, zlib's crc32) of every decoded byte,
	 * the skipped ones included (a ZIP member's), when has_crc32 */
	int has_crc32;
	uint32_t crc32;
	/* SHARDING: owned by the codec (freed by ckpt_zarr_meta_free) */
	struct ckpt_zarr_sharding *sharding;
};

/* A codec chain.  a2b.id is CKPT_CODEC_NONE only for an absent index chain. */
struct ckpt_zarr_chain {
	int na2a;
	struct ckpt_zarr_codec a2a[CKPT_ZARR_MAX_A2A];
	struct ckpt_zarr_codec a2b;
	int nb2b;
	struct ckpt_zarr_codec b2b[CKPT_ZARR_MAX_B2B]; /* in encode order */
};

struct ckpt_zarr_sharding {
	uint64_t chunk_shape[CKPT_MAX_RANK]; /* inner chunk shape (rank = the array's) */
	struct ckpt_zarr_chain codecs; /* inner chunks */
	struct ckpt_zarr_chain index_codecs; /* the index; a2b NONE when not given */
	int index_at_start; /* index_location "start" (else "end") */
};

enum ckpt_zarr_key_encoding {
	CKPT_ZARR_KEYS_DEFAULT = 0, /* v3 default: "c" + sep + i + sep + j ... */
	CKPT_ZARR_KEYS_V2, /* i + sep + j ... ("0" for rank 0) */
};

struct ckpt_zarr_meta {
	int zarr_format; /* 2 or 3 */
	ckpt_dtype dtype;
	int rank;
	uint64_t shape[CKPT_MAX_RANK];
	uint64_t chunk_shape[CKPT_MAX_RANK]; /* regular chunk grid (v2 "chunks") */
	enum ckpt_zarr_key_encoding key_encoding;
	char sep; /* '/' or '.' */
	struct ckpt_zarr_chain codecs;
	/* Fill value: one element in native (little-endian) byte order, or null
	 * (v2 "fill_value": null; read as zeros). */
	int fill_null;
	uint8_t fill[16];
	int fill_lossy; /* a non-zero number for a type the model stores only as bits: kept as zero */
	/* v3 dimension_names: NULL when not given, else rank entries, each a
	 * malloc'd string or NULL (a null name).  Owned by the model. */
	char **dim_names;
	/* zarr v2 only, ckptfs's own member "ckptfs.zip_crc32" (the array of a
	 * virtual item that is a stored ZIP member, its chunks byte ranges of
	 * the member in chunk order): the member's CRC-32 from the ZIP
	 * directory, and the CRC-32 of the member's bytes before the array's
	 * (its .npy header), when zip_has_crc. */
	int zip_has_crc;
	uint32_t zip_crc32, zip_head_crc32;
	/* After a -ENOTSUP parse: the name of the codec, compressor or data type
	 * that is not supported (truncated), else "". */
	char unsupported[32];
};

/*
 * Parse `.zarray` (zarr_format 2) or `zarr.json` (3) text of `len` bytes
 * into *m (which the call initialises; free with ckpt_zarr_meta_free, also
 * after a failure).  Returns 0; -EINVAL for malformed or absurd metadata
 * (bad JSON, shapes, ranks, chunk shapes that do not tile, an element count
 * whose byte size overflows 2^62, a fill value that does not fit the type);
 * -ENOTSUP for valid metadata the model does not represent (unknown codec,
 * data type, chunk grid, key encoding, v2 filters, storage transformers);
 * -ENOMEM.  On failure *why (when why != NULL) is a static English reason.
 */
int ckpt_zarr_meta_parse(const char *json, size_t len, int zarr_format, struct ckpt_zarr_meta *m,
			 const char **why);

/*
 * The metadata text of *m: zarr.json for zarr_format 3 (members sorted by
 * name, the way TensorStore prints them), .zarray for 2; no trailing newline.
 * malloc'd; NULL when out of memory or when *m cannot be written in its
 * format (sharding in v2, a transpose v2 cannot express).
 */
char *ckpt_zarr_meta_emit(const struct ckpt_zarr_meta *m);

/* Free what *m owns (sharding codecs, dimension names) and zero it. */
void ckpt_zarr_meta_free(struct ckpt_zarr_meta *m);

/*
 * Fill in *m as ckptfs' writer lays out an array: zarr v3, default chunk
 * keys, shards of `shard_shape` through sharding_indexed with inner chunks
 * of `inner_shape` (bytes little-endian + zstd(level, checksum)), index
 * bytes little-endian + crc32c at the end, fill value zero.  Returns 0,
 * -EINVAL for a bad dtype/rank, -ENOMEM.  Free with ckpt_zarr_meta_free.
 */
int ckpt_zarr_meta_init_sharded_zstd(struct ckpt_zarr_meta *m, ckpt_dtype dtype, int rank,
				     const uint64_t *shape, const uint64_t *shard_shape,
				     const uint64_t *inner_shape, int zstd_level);

/* The innermost chain that encodes the smallest decodable unit (the inner
 * chain of the innermost sharding codec, else m's own chain), and that unit's
 * shape (copied to unit_shape[rank]). */
const struct ckpt_zarr_chain *ckpt_zarr_meta_unit_chain(const struct ckpt_zarr_meta *m, uint64_t *unit_shape);

#endif
