/*
 * npy.h - the .npy header: writing the header ckptfs serves in front of an
 * array's C-order bytes, and parsing the header of a .npy file a user
 * writes into the mount.
 *
 * Written headers are exactly what np.save (numpy >= 1.24) writes for the
 * same dtype and shape: format version 1.0, the dict
 *   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
 * followed by numpy's growth-axis spare spaces (21 - digits of shape[0],
 * rank > 0 only), then spaces and a final '\n' so that the data starts on
 * a 64-byte boundary.  With rank <= CKPT_MAX_RANK the header always fits
 * v1.0 and never exceeds CKPT_NPY_HEADER_MAX bytes, so v2.0 is never
 * written.  The descr comes from the dtype table (dtype.h): bfloat16 is
 * '<V2', the 8-bit floats and int4/uint4/int2 '<V1'.
 *
 * Pure functions: thread-safe, no allocation, no logging.
 */
#ifndef CKPT_NPY_H
#define CKPT_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "dtype.h"

/* Upper bound of a header written by ckpt_npy_header() (any dtype, rank <=
 * CKPT_MAX_RANK, any dims <= INT64_MAX); a multiple of 64. */
#define CKPT_NPY_HEADER_MAX 1024

/* Largest HEADER_LEN ckpt_npy_parse() accepts, for every format version.
 * Headers of plain dtypes are far smaller; numpy only needs more for
 * structured dtypes, which ckptfs does not accept anyway. */
#define CKPT_NPY_MAX_HLEN 65535

typedef struct ckpt_npy_info {
	ckpt_dtype dtype;
	int rank;
	uint64_t shape[CKPT_MAX_RANK];
	int fortran_order; /* 1 only where the layout equals C order, see below */
	int version; /* format major version: 1, 2 or 3 */
	uint64_t data_offset; /* bytes before the array data (magic..final pad) */
	uint64_t nelems; /* product of shape (1 for rank 0) */
	uint64_t nbytes; /* nelems * itemsize */
} ckpt_npy_info;

/* Write the .npy v1.0 header for an array of dtype dt and the given shape
 * into buf (binary, not NUL-terminated).
 * Returns the header length (a multiple of 64, <= CKPT_NPY_HEADER_MAX), or
 *   -EINVAL     invalid dtype, rank < 0 or > CKPT_MAX_RANK, shape NULL with rank > 0;
 *   -EOVERFLOW  a dim larger than INT64_MAX (numpy could not read it);
 *   -ENOBUFS    cap is smaller than the header (nothing useful in buf). */
int ckpt_npy_header(ckpt_dtype dt, int rank, const uint64_t *shape, char *buf, size_t cap);

/* Size of the whole .npy file: *header_len = length of ckpt_npy_header()'s
 * output, *total = header + nelems * itemsize.  Either pointer may be NULL.
 * Returns 0, -EINVAL (as ckpt_npy_header) or -EOVERFLOW (the byte count
 * does not fit in uint64). */
int ckpt_npy_file_size(ckpt_dtype dt, int rank, const uint64_t *shape, uint64_t *header_len, uint64_t *total);

/* Parse the header at the start of a user's .npy file; buf holds its first
 * len bytes (possibly fewer than the header: a writer streams the file).
 *
 * Accepted: magic "\x93NUMPY", version 1.0 (u16 HEADER_LEN), 2.0 or 3.0
 * (u32 HEADER_LEN; 3.0 means UTF-8, which changes nothing here), HEADER_LEN
 * <= CKPT_NPY_MAX_HLEN, then a Python dict literal with exactly the keys
 * 'descr', 'fortran_order' and 'shape' (each once, any order, single or
 * double quotes, optional trailing commas, any whitespace between tokens and
 * after the closing brace).  'descr' must be a plain string that
 * ckpt_dtype_from_npy(descr, hint) knows, so big-endian, structured, object
 * and unknown descrs are rejected; void descrs ('<V2', '|V1') are accepted
 * only when `hint` is the ml_dtypes type of that size.  `hint` does nothing
 * else: the caller compares out->dtype with what it expects.  'shape' is a
 * tuple ("()", "(5,)", "(2, 3)") of decimal ints without sign or leading
 * zeros (a Python 2 'L' suffix is accepted in versions 1.0/2.0), each <=
 * INT64_MAX, rank <= CKPT_MAX_RANK.  'fortran_order' True is accepted only
 * when the Fortran layout is byte-identical to C order (at most one dim
 * larger than 1, or no elements); out->fortran_order is then 1.  The data
 * size and data_offset + nbytes must fit in int64.
 *
 * Returns 0 and fills *out (data_offset = where the data starts), or
 *   -EAGAIN  buf is a valid prefix so far but too short: *need is set to
 *            the number of bytes to supply (> len);
 *   -EINVAL  anything malformed or unsupported (never reads outside buf).
 * `need` may be NULL. */
int ckpt_npy_parse(const uint8_t *buf, size_t len, ckpt_dtype hint, struct ckpt_npy_info *out, size_t *need);

#endif
