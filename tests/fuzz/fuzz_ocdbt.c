/*
 * fuzz_ocdbt.c - libFuzzer target over the OCDBT decoder: every input is
 * decoded in memory as a manifest and as a B+tree node (as given, with the
 * length/CRC fields repaired, and as a bare body); see ckpt_ocdbt_fuzz_parse.
 */
#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "ocdbt.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	(void)ckpt_ocdbt_fuzz_parse(data, size);
	return 0;
}
