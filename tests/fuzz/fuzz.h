/*
 * fuzz.h - what the libFuzzer targets of tests/fuzz share: the entry point
 * every one defines and REQUIRE, the check that turns a broken property into
 * a crash libFuzzer reports (abort, not assert: it holds under NDEBUG too).
 */
#ifndef CKPT_FUZZ_H
#define CKPT_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
/* Optional: the targets that set up tables or the log level once define it. */
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define REQUIRE(c)                                                                                           \
	do {                                                                                                 \
		if (!(c))                                                                                    \
			abort();                                                                             \
	} while (0)

#endif
