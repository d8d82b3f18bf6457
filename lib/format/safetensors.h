/*
 * safetensors.h - the byte layout of a virtual safetensors file (and of the
 * Hugging Face sharded form): header bytes, file size, where every tensor's
 * data lies, and the mapping of a file byte range onto tensor pieces.
 * Pure computation: no I/O, the tensor data itself never passes through here.
 *
 * File format (the safetensors format of huggingface/safetensors; docs/format.md):
 *   [8 bytes N, u64 LE][N bytes JSON, space padded, N % 8 == 0][data buffer]
 * Tensor t's data sits at file offset 8 + N + data_offsets[0] and holds its
 * elements in C order, little-endian, exactly as the array's C-order bytes.
 *
 * What this module emits (byte-identical to the reference writer, prepare()
 * in huggingface/safetensors tensor.rs, for the same inputs):
 *   - compact JSON (no spaces), `__metadata__` first when a metadata map is
 *     given, then one entry per tensor
 *     "NAME":{"dtype":"F32","shape":[2,3],"data_offsets":[B,E]};
 *   - tensor order = file order = data order: dtype descending in the
 *     reference `Dtype` enum (which is ordered by alignment, so this is
 *     "itemsize descending"; dtypes of equal itemsize keep the reference
 *     enum's relative order, e.g. F32 before U32 before I32), then name in
 *     byte (strcmp) order;
 *   - data offsets contiguous from 0: no gap, no overlap, no trailing byte;
 *     0-d tensors have "shape":[] and one element; tensors with a 0 in their
 *     shape are kept with BEGIN == END;
 *   - JSON strings escaped like serde_json: \" \\ \b \f \n \r \t, other
 *     control bytes (< 0x20) as \u00xx (lower-case hex); bytes >= 0x80 are
 *     written raw (UTF-8).  The metadata map keeps the caller's order (the
 *     reference writer holds it in a hash map, so it has no fixed order).
 *
 * Input rules (create fails with -EINVAL, after one ckpt_log line naming
 * the offender, when broken):
 *   - names, metadata keys and values must be NUL-terminated, valid UTF-8
 *     (the reader rejects a non-UTF-8 header and there is no faithful way to
 *     escape invalid bytes in JSON);
 *   - tensor names must be unique and must not be "__metadata__"; metadata
 *     keys must be unique;
 *   - rank in [0, CKPT_MAX_RANK]; shape may be NULL only when rank is 0.
 * A dtype without a safetensors code (ckpt_dtype_get(dt)->st_code == NULL:
 * int4, float4, complex128, ...) makes create fail with -ENOTSUP and a log
 * line naming the tensor and its dtype, unless CKPT_ST_SKIP_UNSUPPORTED is
 * passed: then the tensor is left out of the file (one WARN line each).
 * Sizes that overflow u64 give -EOVERFLOW; a JSON header larger than the
 * reader's 100,000,000-byte limit gives -EFBIG (logged).  -ENOMEM on
 * allocation failure.  Nothing is allocated / *out untouched on failure.
 *
 * Ownership: create copies everything it needs (names, shapes, metadata);
 * the caller's arrays may be freed right after.  Pointers returned by the
 * accessors live as long as the layout.
 *
 * Accessors given a NULL handle return NULL / 0 (never crash).
 *
 * Thread-safety: a layout / sharded set is immutable after create; every
 * accessor and ckpt_st_layout_map may be called from many threads at once.
 * Destroy must not race with other calls on the same object.
 */
#ifndef CKPT_SAFETENSORS_H
#define CKPT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common.h"
#include "dtype.h"

/* Largest header the reference reader accepts (MAX_HEADER_SIZE). */
#define CKPT_ST_MAX_HEADER 100000000u

/* create flag: leave out tensors whose dtype has no safetensors code
 * instead of failing with -ENOTSUP. */
#define CKPT_ST_SKIP_UNSUPPORTED 0x1u
/* create flag: tensor order = file order = the caller's order instead of
 * the reference writer's (dtype, name) order; readers find tensors by
 * their offsets, so any order loads.  View recipes use it to keep the
 * tensors read from one source array together (its decoded chunks stay in
 * the cache while they are read). */
#define CKPT_ST_CALLER_ORDER 0x2u

/* One input tensor.  `name` is the '.'-joined key path, UTF-8. */
typedef struct ckpt_st_tensor {
	const char *name;
	ckpt_dtype dtype;
	int rank;
	const uint64_t *shape; /* rank entries */
} ckpt_st_tensor;

/* One __metadata__ entry (string -> string). */
typedef struct ckpt_st_meta {
	const char *key;
	const char *value;
} ckpt_st_meta;

typedef struct ckpt_st_layout ckpt_st_layout;

/* Lay out `n` tensors with the metadata map meta[0..n_meta).  n_meta == 0
 * writes no `__metadata__` key at all (what the reference writer does for
 * metadata=None); pass {"format","pt"} for files that transformers should
 * load.  flags: 0 or CKPT_ST_SKIP_UNSUPPORTED.  On success *out owns the
 * new layout.  Errors: see the top of this file. */
int ckpt_st_layout_create(const ckpt_st_tensor *tensors, size_t n, const ckpt_st_meta *meta, size_t n_meta,
			  unsigned flags, ckpt_st_layout **out);
void ckpt_st_layout_destroy(ckpt_st_layout *l);

/* The first bytes of the file: 8-byte N + the padded JSON (8 + N bytes,
 * returned in *len).  This is also the file offset where data begins. */
const uint8_t *ckpt_st_layout_header(const ckpt_st_layout *l, size_t *len);

/* Total file size: 8 + N + sum of tensor bytes. */
uint64_t ckpt_st_layout_file_size(const ckpt_st_layout *l);

/* Sum of tensor data bytes (file size without the header). */
uint64_t ckpt_st_layout_data_size(const ckpt_st_layout *l);

/* Number of tensors in the file (skipped ones are not counted). */
size_t ckpt_st_layout_count(const ckpt_st_layout *l);

/* Tensor i in file order (0 <= i < count). */
typedef struct ckpt_st_info {
	const char *name;
	ckpt_dtype dtype;
	int rank;
	const uint64_t *shape;
	uint64_t data_begin; /* data_offsets[0], relative to the data buffer */
	uint64_t file_offset; /* absolute: header length + data_begin */
	uint64_t nbytes; /* data_offsets[1] - data_offsets[0] */
	size_t input; /* index of this tensor in the caller's array */
} ckpt_st_info;

/* Fill *out for tensor i.  -ERANGE when i >= count. */
int ckpt_st_layout_get(const ckpt_st_layout *l, size_t i, ckpt_st_info *out);

/* File-order index of the tensor called `name`: 0 and *idx, or -ENOENT. */
int ckpt_st_layout_find(const ckpt_st_layout *l, const char *name, size_t *idx);

/* A piece of a file byte range.  Header pieces come from the header bytes
 * (ckpt_st_layout_header); tensor pieces from the tensor's C-order bytes. */
#define CKPT_ST_PIECE_HEADER ((size_t)-1)
typedef struct ckpt_st_piece {
	size_t dst_off; /* where the piece goes, relative to the requested off */
	size_t len; /* bytes, > 0 */
	size_t tensor; /* file-order tensor index, or CKPT_ST_PIECE_HEADER */
	size_t input; /* caller's index of that tensor (CKPT_ST_PIECE_HEADER for the header) */
	uint64_t src_off; /* offset within the header bytes / the tensor's bytes */
} ckpt_st_piece;

/* Map the file range [off, off + len) onto pieces, in file order, at most
 * `cap` of them.  The range is clamped to the file size (nothing past EOF;
 * off >= file size gives 0 pieces).  Pieces are contiguous: piece k+1's
 * dst_off is piece k's dst_off + len, the first has dst_off 0.  Zero-size
 * tensors never appear.  Only the tensors the range touches are listed.
 * When `cap` pieces were filled and the range goes on, the rest is NOT
 * mapped: continue with off + (last dst_off + last len).
 * Returns the number of pieces, or -EINVAL (cap == 0 with a non-empty
 * clamped range, or NULL pointers). */
ssize_t ckpt_st_layout_map(const ckpt_st_layout *l, uint64_t off, size_t len, ckpt_st_piece *pieces,
			   size_t cap);

/* Bytes [off, off + len) of the file into dst: header pieces copied from
 * the header bytes, tensor pieces from tensor(arg, input, src_off, len,
 * to), which returns the bytes it wrote (exactly len, else the read fails
 * with -EIO) or -errno.  Returns the bytes read (clamped at the end of the
 * file) or the first error; pure but for what tensor() does. */
typedef ssize_t (*ckpt_st_tensor_read_fn)(void *arg, size_t input, uint64_t src_off, size_t len, uint8_t *to);
ssize_t ckpt_st_layout_read(const ckpt_st_layout *l, uint64_t off, size_t len, uint8_t *dst,
			    ckpt_st_tensor_read_fn tensor, void *arg);

/*
 * Hugging Face sharded form (huggingface_hub's split_*_into_shards rules):
 * tensors are taken in the caller's order (after skipping unsupported ones
 * under CKPT_ST_SKIP_UNSUPPORTED) and appended to the current shard while
 * its data bytes stay <= max_shard_bytes; a tensor that does not fit closes
 * the shard and opens a new one; a tensor larger than max_shard_bytes
 * closes the current shard (if not empty) and gets a shard of its own, and
 * the next tensor starts a new shard (order is kept).  Zero-size tensors
 * fit in any shard except an oversized tensor's own.  Within each shard the usual file order applies.
 *
 * Shard i (0-based) is named "model-%05d-of-%05d.safetensors" with i + 1 and
 * the shard count, even when there is only one shard (a caller that wants
 * the plain "model.safetensors" name for that case uses a single layout).
 * No tensors gives zero shards and an index with an empty weight_map.
 * Each shard's `__metadata__` is exactly {"format":"pt"} (as
 * huggingface_hub writes them); the caller's map goes, with string values,
 * into the index's "metadata" object after "total_size" (a caller key
 * "total_size" is -EINVAL).  More than 99999 shards is -EFBIG.
 *
 * The index text (model.safetensors.index.json) is JSON with indent 2, as
 * Python's json.dumps(obj, indent=2) lays it out, weight_map keys in byte
 * order, with a final newline:
 *   {
 *     "metadata": {
 *       "total_size": T
 *     },
 *     "weight_map": {
 *       "NAME": "model-00001-of-00002.safetensors"
 *     }
 *   }
 * total_size = sum of tensor data bytes over all shards (no headers).
 *
 * ckpt_st_piece.input in a shard's layout is the index in the caller's
 * array given to ckpt_st_sharded_create (not an index within the shard).
 */
typedef struct ckpt_st_sharded ckpt_st_sharded;

#define CKPT_ST_INDEX_NAME "model.safetensors.index.json"

/* Errors: as ckpt_st_layout_create, plus -EINVAL for max_shard_bytes == 0. */
int ckpt_st_sharded_create(const ckpt_st_tensor *tensors, size_t n, const ckpt_st_meta *meta, size_t n_meta,
			   uint64_t max_shard_bytes, unsigned flags, ckpt_st_sharded **out);
void ckpt_st_sharded_destroy(ckpt_st_sharded *s);

size_t ckpt_st_sharded_count(const ckpt_st_sharded *s);
/* Layout / file name of shard i; NULL when i >= count. */
const ckpt_st_layout *ckpt_st_sharded_layout(const ckpt_st_sharded *s, size_t i);
const char *ckpt_st_sharded_name(const ckpt_st_sharded *s, size_t i);
/* Shard index of shard file `name` ("model-00002-of-00005.safetensors"):
 * 0 and *i, or -ENOENT. */
int ckpt_st_sharded_find_file(const ckpt_st_sharded *s, const char *name, size_t *i);
/* The index JSON text (NUL-terminated; *len excludes the NUL). */
const char *ckpt_st_sharded_index(const ckpt_st_sharded *s, size_t *len);
/* Sum of data bytes of all shards ("total_size"). */
uint64_t ckpt_st_sharded_total_size(const ckpt_st_sharded *s);

/* Write `s` JSON-escaped as above (without the surrounding quotes) into
 * buf, snprintf style: at most cap - 1 bytes plus a NUL when cap > 0.
 * Returns the full escaped length (without the NUL), so a result >= cap
 * means the output was truncated. */
size_t ckpt_st_json_escape(const char *s, char *buf, size_t cap);

/* 1 when the NUL-terminated string is valid UTF-8 (no overlong forms, no
 * surrogates, nothing above U+10FFFF), else 0. */
int ckpt_st_utf8_valid(const char *s);

/* ---- reading a safetensors file's header -------------------------------------
 *
 * A file is [u64 LE N][N bytes of JSON][data]: the JSON object maps each
 * tensor name to {"dtype", "shape", "data_offsets": [BEGIN, END]} (offsets
 * relative to the data, which starts at 8 + N) and may hold a
 * "__metadata__" map of strings.  The checks are the reference reader's:
 * N at most CKPT_ST_MAX_HEADER and inside the file, a JSON object, known
 * dtype codes, END - BEGIN the tensor's byte size, offsets inside the data,
 * names unique; tensors may not overlap.
 */
typedef struct ckpt_st_entry {
	char *name;
	ckpt_dtype dtype;
	int rank;
	uint64_t shape[CKPT_MAX_RANK];
	uint64_t begin, end; /* file offsets of the tensor's bytes (8 + N + data_offsets) */
} ckpt_st_entry;

typedef struct ckpt_st_file {
	ckpt_st_entry *t; /* in the header's order */
	size_t n;
	uint64_t data_start; /* 8 + N */
	char *metadata_json; /* "__metadata__" as compact JSON, NULL when absent */
} ckpt_st_file;

/* The header length N from the first 8 bytes of a file of file_size bytes:
 * -EINVAL (logged, naming `what`) when it is too large for the limit or the file. */
int ckpt_st_header_len(const uint8_t first8[8], uint64_t file_size, const char *what, uint64_t *n);
/* Parse the n JSON bytes of the header of a file of file_size bytes.
 * -EINVAL (logged) for a header the reference reader refuses; -ENOMEM. */
int ckpt_st_parse(const char *json, size_t n, uint64_t file_size, const char *what, ckpt_st_file **out);
void ckpt_st_file_free(ckpt_st_file *f);
/* The dtype of a safetensors code ("BF16"), or INVALID. */
ckpt_dtype ckpt_st_dtype(const char *code);

#endif
