/*
 * dtype.h - the one table of element types: names as zarr v2 / zarr v3
 * (TensorStore) spell them, the .npy descr ckptfs emits, the safetensors code,
 * and the stored size.  Pure data; thread-safe.
 */
#ifndef CKPT_DTYPE_H
#define CKPT_DTYPE_H

#include <stddef.h>

typedef enum ckpt_dtype {
	CKPT_DT_INVALID = 0,
	CKPT_DT_BOOL,
	CKPT_DT_INT8,
	CKPT_DT_UINT8,
	CKPT_DT_INT16,
	CKPT_DT_UINT16,
	CKPT_DT_INT32,
	CKPT_DT_UINT32,
	CKPT_DT_INT64,
	CKPT_DT_UINT64,
	CKPT_DT_FLOAT16,
	CKPT_DT_BFLOAT16,
	CKPT_DT_FLOAT32,
	CKPT_DT_FLOAT64,
	CKPT_DT_COMPLEX64,
	CKPT_DT_COMPLEX128,
	CKPT_DT_F8_E3M4,
	CKPT_DT_F8_E4M3FN,
	CKPT_DT_F8_E4M3FNUZ,
	CKPT_DT_F8_E4M3B11FNUZ,
	CKPT_DT_F8_E5M2,
	CKPT_DT_F8_E5M2FNUZ,
	CKPT_DT_F8_E8M0FNU,
	CKPT_DT_F4_E2M1FN,
	CKPT_DT_INT4,
	CKPT_DT_UINT4,
	CKPT_DT_INT2,
	CKPT_DT_COUNT
} ckpt_dtype;

typedef struct ckpt_dtype_info {
	const char *name; /* TensorStore / zarr v3 data_type, e.g. "bfloat16" */
	const char *npy_descr; /* descr written in .npy headers, e.g. "<V2" */
	const char *st_code; /* safetensors dtype code, or NULL if none exists */
	unsigned itemsize; /* stored bytes per element (sub-byte types: 1) */
	char kind; /* 'b' bool, 'i' signed, 'u' unsigned, 'f' float, 'c' complex, 'V' ml_dtypes */
} ckpt_dtype_info;

/* Info for a valid dtype; NULL for CKPT_DT_INVALID or out of range. */
const ckpt_dtype_info *ckpt_dtype_get(ckpt_dtype dt);

/* zarr v3 data_type name ("float32", "bfloat16", ...) -> dtype, or INVALID. */
ckpt_dtype ckpt_dtype_from_name(const char *name);

/* zarr v2 dtype string ("<f4", "|b1", ">i8", "bfloat16", ...) -> dtype.
 * *big_endian is set to 1 for '>' multi-byte types.  INVALID if unknown. */
ckpt_dtype ckpt_dtype_from_zarr2(const char *s, int *big_endian);

/* .npy descr as written by numpy ("<f4", "|b1", "<V2", "|V2", "<u1", ...)
 * plus ckptfs' own names ("bfloat16") -> dtype.  Void descrs map to the
 * raw type of that size only when `hint` has that itemsize (pass the
 * expected dtype, or INVALID to reject void descrs).  INVALID if unknown. */
ckpt_dtype ckpt_dtype_from_npy(const char *descr, ckpt_dtype hint);

#endif
