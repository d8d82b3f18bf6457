/*
 * check.h - the minimal assertion kit of the C unit tests (one executable
 * per module, run by ctest).  CHECK records a failure and goes on; the test's
 * main ends with `return CHECK_DONE();`, which prints the tally.
 */
#ifndef CKPT_TEST_CHECK_H
#define CKPT_TEST_CHECK_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static int check_passed, check_failed;

#define CHECK(cond)                                                                                          \
	do {                                                                                                 \
		if (cond) {                                                                                  \
			check_passed++;                                                                      \
		} else {                                                                                     \
			check_failed++;                                                                      \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);             \
		}                                                                                            \
	} while (0)

#define CHECK_EQ_INT(a, b)                                                                                   \
	do {                                                                                                 \
		long long check_a_ = (long long)(a), check_b_ = (long long)(b);                              \
		if (check_a_ == check_b_) {                                                                  \
			check_passed++;                                                                      \
		} else {                                                                                     \
			check_failed++;                                                                      \
			fprintf(stderr, "%s:%d: CHECK failed: %s == %s (%lld != %lld)\n", __FILE__,          \
				__LINE__, #a, #b, check_a_, check_b_);                                       \
		}                                                                                            \
	} while (0)

/* xorshift64 (13, 7, 17): the next pseudo-random number of the sequence
 * whose state (never 0) is *s, which it advances.  Tests use fixed seeds, so
 * a failure reproduces. */
static inline uint64_t check_rnd(uint64_t *s)
{
	uint64_t x = *s;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *s = x;
}

/* The whole file at path, malloc'ed with a NUL after its bytes (the caller
 * frees it), its size in *len when len is not NULL; NULL when it cannot be
 * read. */
static inline char *check_slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *b = n < 0 ? NULL : malloc((size_t)n + 1);
	if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
		free(b);
		b = NULL;
	}
	fclose(f);
	if (b) {
		b[n] = 0;
		if (len)
			*len = (size_t)n;
	}
	return b;
}

#define CHECK_DONE() (printf("%d passed, %d failed\n", check_passed, check_failed), check_failed ? 1 : 0)

#endif
