/*
 * fuzz_npy.c - libFuzzer target over ckpt_npy_parse: every input is a .npy
 * file's first bytes, parsed with every dtype as the hint.  Checked: a
 * parsed header's fields are consistent, every shorter prefix of an accepted
 * header asks for more bytes (-EAGAIN with need > len) and the header ckptfs
 * writes for the same dtype and shape parses back to it.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "npy.h"
#include "fuzz.h"

static void check_ok(const uint8_t *data, const struct ckpt_npy_info *in, ckpt_dtype hint)
{
	const ckpt_dtype_info *di = ckpt_dtype_get(in->dtype);
	REQUIRE(di && in->rank >= 0 && in->rank <= CKPT_MAX_RANK);
	REQUIRE(in->version >= 1 && in->version <= 3);
	uint64_t n = 1;
	for (int d = 0; d < in->rank; d++)
		n *= in->shape[d];
	REQUIRE(n == in->nelems && in->nbytes == n * di->itemsize);
	REQUIRE(in->data_offset >= 10 && in->data_offset + in->nbytes >= in->data_offset);
	/* any shorter prefix of the header is incomplete, never refused */
	size_t cuts[3] = { 0, (size_t)in->data_offset / 2, (size_t)in->data_offset - 1 };
	for (int i = 0; i < 3; i++) {
		struct ckpt_npy_info p;
		size_t need = 0;
		REQUIRE(ckpt_npy_parse(data, cuts[i], hint, &p, &need) == -EAGAIN && need > cuts[i]);
	}
	/* our own header for the same array parses to the same array */
	char hdr[CKPT_NPY_HEADER_MAX];
	int h = ckpt_npy_header(in->dtype, in->rank, in->shape, hdr, sizeof(hdr));
	if (h > 0) {
		struct ckpt_npy_info back;
		REQUIRE(ckpt_npy_parse((const uint8_t *)hdr, (size_t)h, in->dtype, &back, NULL) == 0);
		REQUIRE(back.dtype == in->dtype && back.rank == in->rank && back.data_offset == (uint64_t)h);
		REQUIRE(memcmp(back.shape, in->shape, sizeof(uint64_t) * (size_t)in->rank) == 0);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int checked = 0;
	for (int hint = 0; hint < CKPT_DT_COUNT; hint++) {
		struct ckpt_npy_info info;
		size_t need = 0;
		int rc = ckpt_npy_parse(data, size, (ckpt_dtype)hint, &info, &need);
		REQUIRE(rc == 0 || rc == -EINVAL || rc == -EAGAIN);
		if (rc == -EAGAIN)
			REQUIRE(need > size);
		if (rc == 0 && !checked) {
			check_ok(data, &info, (ckpt_dtype)hint);
			checked = 1;
		}
	}
	return 0;
}
