#include <string.h>

#include "dtype.h"

/* bf16 and the 8-bit floats appear as void in .npy (what np.save writes for
 * ml_dtypes arrays); '<f1' is never emitted: numpy has no 1-byte float
 * and refuses such a header. */
static const ckpt_dtype_info infos[CKPT_DT_COUNT] = {
	[CKPT_DT_BOOL] = { "bool", "|b1", "BOOL", 1, 'b' },
	[CKPT_DT_INT8] = { "int8", "|i1", "I8", 1, 'i' },
	[CKPT_DT_UINT8] = { "uint8", "|u1", "U8", 1, 'u' },
	[CKPT_DT_INT16] = { "int16", "<i2", "I16", 2, 'i' },
	[CKPT_DT_UINT16] = { "uint16", "<u2", "U16", 2, 'u' },
	[CKPT_DT_INT32] = { "int32", "<i4", "I32", 4, 'i' },
	[CKPT_DT_UINT32] = { "uint32", "<u4", "U32", 4, 'u' },
	[CKPT_DT_INT64] = { "int64", "<i8", "I64", 8, 'i' },
	[CKPT_DT_UINT64] = { "uint64", "<u8", "U64", 8, 'u' },
	[CKPT_DT_FLOAT16] = { "float16", "<f2", "F16", 2, 'f' },
	[CKPT_DT_BFLOAT16] = { "bfloat16", "<V2", "BF16", 2, 'V' },
	[CKPT_DT_FLOAT32] = { "float32", "<f4", "F32", 4, 'f' },
	[CKPT_DT_FLOAT64] = { "float64", "<f8", "F64", 8, 'f' },
	[CKPT_DT_COMPLEX64] = { "complex64", "<c8", "C64", 8, 'c' },
	[CKPT_DT_COMPLEX128] = { "complex128", "<c16", NULL, 16, 'c' },
	[CKPT_DT_F8_E3M4] = { "float8_e3m4", "<V1", NULL, 1, 'V' },
	[CKPT_DT_F8_E4M3FN] = { "float8_e4m3fn", "<V1", "F8_E4M3", 1, 'V' },
	[CKPT_DT_F8_E4M3FNUZ] = { "float8_e4m3fnuz", "<V1", "F8_E4M3FNUZ", 1, 'V' },
	[CKPT_DT_F8_E4M3B11FNUZ] = { "float8_e4m3b11fnuz", "<V1", NULL, 1, 'V' },
	[CKPT_DT_F8_E5M2] = { "float8_e5m2", "<V1", "F8_E5M2", 1, 'V' },
	[CKPT_DT_F8_E5M2FNUZ] = { "float8_e5m2fnuz", "<V1", "F8_E5M2FNUZ", 1, 'V' },
	[CKPT_DT_F8_E8M0FNU] = { "float8_e8m0fnu", "<V1", "F8_E8M0", 1, 'V' },
	[CKPT_DT_F4_E2M1FN] = { "float4_e2m1fn", "<V1", NULL, 1, 'V' },
	[CKPT_DT_INT4] = { "int4", "<V1", NULL, 1, 'V' },
	[CKPT_DT_UINT4] = { "uint4", "<V1", NULL, 1, 'V' },
	[CKPT_DT_INT2] = { "int2", "<V1", NULL, 1, 'V' },
};

const ckpt_dtype_info *ckpt_dtype_get(ckpt_dtype dt)
{
	if (dt <= CKPT_DT_INVALID || dt >= CKPT_DT_COUNT)
		return NULL;
	return &infos[dt];
}

ckpt_dtype ckpt_dtype_from_name(const char *name)
{
	if (!name)
		return CKPT_DT_INVALID;
	for (int i = 1; i < CKPT_DT_COUNT; i++)
		if (strcmp(infos[i].name, name) == 0)
			return (ckpt_dtype)i;
	return CKPT_DT_INVALID;
}

/* Numeric descr without the byte-order character: "f4", "b1", "i8". */
static ckpt_dtype from_typestr(const char *t)
{
	static const struct {
		const char *s;
		ckpt_dtype dt;
	} map[] = {
		{ "b1", CKPT_DT_BOOL },	     { "i1", CKPT_DT_INT8 },	    { "u1", CKPT_DT_UINT8 },
		{ "i2", CKPT_DT_INT16 },     { "u2", CKPT_DT_UINT16 },	    { "i4", CKPT_DT_INT32 },
		{ "u4", CKPT_DT_UINT32 },    { "i8", CKPT_DT_INT64 },	    { "u8", CKPT_DT_UINT64 },
		{ "f2", CKPT_DT_FLOAT16 },   { "f4", CKPT_DT_FLOAT32 },	    { "f8", CKPT_DT_FLOAT64 },
		{ "c8", CKPT_DT_COMPLEX64 }, { "c16", CKPT_DT_COMPLEX128 },
	};
	for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
		if (strcmp(map[i].s, t) == 0)
			return map[i].dt;
	return CKPT_DT_INVALID;
}

ckpt_dtype ckpt_dtype_from_zarr2(const char *s, int *big_endian)
{
	*big_endian = 0;
	if (!s || !*s)
		return CKPT_DT_INVALID;
	if (s[0] == '<' || s[0] == '>' || s[0] == '|' || s[0] == '=') {
		ckpt_dtype dt = from_typestr(s + 1);
		if (dt != CKPT_DT_INVALID && s[0] == '>' && infos[dt].itemsize > 1)
			*big_endian = 1;
		return dt;
	}
	return ckpt_dtype_from_name(s); /* TensorStore extensions: "bfloat16", ... */
}

ckpt_dtype ckpt_dtype_from_npy(const char *descr, ckpt_dtype hint)
{
	if (!descr || !*descr)
		return CKPT_DT_INVALID;
	if ((descr[0] == '<' || descr[0] == '|') && descr[1] == 'V') {
		const ckpt_dtype_info *h = ckpt_dtype_get(hint);
		if (!h || h->kind != 'V')
			return CKPT_DT_INVALID;
		char want[8];
		want[0] = 'V';
		want[1] = (char)('0' + h->itemsize);
		want[2] = 0;
		return strcmp(descr + 1, want) == 0 ? hint : CKPT_DT_INVALID;
	}
	if (descr[0] == '<' || descr[0] == '|')
		return from_typestr(descr + 1);
	if (descr[0] == '>')
		return CKPT_DT_INVALID; /* big-endian input is not accepted for writing */
	return ckpt_dtype_from_name(descr);
}
