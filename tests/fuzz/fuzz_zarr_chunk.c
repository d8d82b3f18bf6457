/*
 * fuzz_zarr_chunk.c - libFuzzer target over chunk decoding (read/zarr_chunk.c):
 * the first input byte picks one array layout (each zarr v2 compressor, zarr
 * v3 gzip/blosc/crc32c chains, a transpose), the rest is the stored chunk.
 * The decoder writes into a buffer of exactly the chunk's size (so ASan
 * sees any write past it) and must answer 0, -EIO or -ENOMEM.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "zarr_chunk.h"
#include "fuzz.h"

#define V2(comp)                                                                                             \
	"{\"zarr_format\":2,\"shape\":[4,8],\"chunks\":[4,4],\"dtype\":\"<f4\",\"compressor\":" comp         \
	",\"fill_value\":0,\"filters\":null,\"order\":\"C\"}"
#define V3(shape, chunk, dt, codecs)                                                                         \
	"{\"zarr_format\":3,\"node_type\":\"array\",\"shape\":" shape ",\"data_type\":\"" dt "\","           \
	"\"chunk_grid\":{\"name\":\"regular\",\"configuration\":{\"chunk_shape\":" chunk "}},"               \
	"\"chunk_key_encoding\":{\"name\":\"default\"},\"fill_value\":0,\"codecs\":" codecs "}"
#define LE "{\"name\":\"bytes\",\"configuration\":{\"endian\":\"little\"}}"

/* Keep in step with tests/fuzz/seeds/fuzz_zarr_chunk (first byte = index). */
static const char *const layouts[] = {
	V2("null"),
	V2("{\"id\":\"zstd\",\"level\":1}"),
	V2("{\"id\":\"zlib\",\"level\":6}"),
	V2("{\"id\":\"gzip\",\"level\":5}"),
	V2("{\"id\":\"bz2\",\"level\":9}"),
	V2("{\"id\":\"lz4\",\"acceleration\":1}"),
	V2("{\"id\":\"blosc\",\"cname\":\"lz4\",\"clevel\":5,\"shuffle\":1,\"blocksize\":0}"),
	V3("[4,8]", "[4,4]", "float32", "[" LE ",{\"name\":\"gzip\"},{\"name\":\"crc32c\"}]"),
	V3("[4,8]", "[4,4]", "int32",
	   "[" LE ",{\"name\":\"blosc\",\"configuration\":{\"cname\":\"zstd\",\"clevel\":3,\"shuffle\":"
	   "\"bitshuffle\",\"typesize\":4,\"blocksize\":0}}]"),
	V3("[5,6,7]", "[2,3,4]", "int16",
	   "[{\"name\":\"transpose\",\"configuration\":{\"order\":[2,0,1]}}," LE ",{\"name\":\"gzip\"}]"),
	V3("[4,8]", "[4,4]", "float32", "[" LE ",{\"name\":\"crc32c\"},{\"name\":\"gzip\"}]"),
};
#define NLAYOUTS (sizeof(layouts) / sizeof(layouts[0]))

static ckpt_array_meta metas[NLAYOUTS];
static ckpt_zarr_scratch *sc;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	ckpt_log_set_level(-1); /* every bad chunk logs a line */
	for (size_t i = 0; i < NLAYOUTS; i++) {
		const char *why;
		REQUIRE(ckpt_zarr_parse(strstr(layouts[i], "\"zarr_format\":2") ? 2 : 3, layouts[i],
					strlen(layouts[i]), &metas[i], &why) == 0);
	}
	sc = ckpt_zarr_scratch_create();
	REQUIRE(sc);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	const ckpt_array_meta *m = &metas[data[0] % NLAYOUTS];
	void *dst = malloc((size_t)m->unit_bytes);
	REQUIRE(dst);
	int rc = ckpt_zarr_decode_unit(m, "fuzz", data + 1, size - 1, dst, sc);
	REQUIRE(rc == 0 || rc == -EIO || rc == -ENOMEM);
	free(dst);
	return 0;
}
