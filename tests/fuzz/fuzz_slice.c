/*
 * fuzz_slice.c - libFuzzer target over slice names (ckpt_slice_parse).
 * Input: one byte rank (mod 5), rank little-endian u32 dims, then the name.
 * Checked: an accepted region lies inside the array and is non-empty, and
 * its canonical name (ckpt_slice_format) parses back to the same region.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "slice.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	int rank = data[0] % 5;
	if (size < 1 + 4 * (size_t)rank)
		return 0;
	uint64_t shape[CKPT_MAX_RANK];
	for (int d = 0; d < rank; d++) {
		const uint8_t *p = data + 1 + 4 * d;
		shape[d] = (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24;
		if (data[0] & 0x80)
			shape[d] <<= 31; /* huge dims too */
	}
	const char *text = (const char *)data + 1 + 4 * rank;
	size_t len = size - 1 - 4 * (size_t)rank;
	ckpt_region r;
	const char *why = NULL;
	int rc = ckpt_slice_parse(text, len, rank, shape, &r, &why);
	REQUIRE(rc == 0 || rc == -EINVAL || rc == -ERANGE);
	if (rc) {
		REQUIRE(why && why[0]);
		return 0;
	}
	REQUIRE(r.rank == rank);
	for (int d = 0; d < rank; d++)
		REQUIRE(r.start[d] < r.stop[d] && r.stop[d] <= shape[d]);
	char name[CKPT_MAX_RANK * 44 + 3];
	int n = ckpt_slice_format(&r, name, sizeof(name));
	REQUIRE(n > 0);
	ckpt_region back;
	REQUIRE(ckpt_slice_parse(name, (size_t)n, rank, shape, &back, &why) == 0);
	REQUIRE(back.rank == rank);
	REQUIRE(memcmp(back.start, r.start, sizeof(uint64_t) * (size_t)rank) == 0);
	REQUIRE(memcmp(back.stop, r.stop, sizeof(uint64_t) * (size_t)rank) == 0);
	return 0;
}
