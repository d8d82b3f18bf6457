/*
 * check.h - the minimal assertion kit of the C unit tests (one executable
 * per module, run by ctest).  CHECK records a failure and goes on; the test's
 * main ends with `return CHECK_DONE();`, which prints the tally.
 */
#ifndef CKPT_TEST_CHECK_H
#define CKPT_TEST_CHECK_H

#include <stdio.h>

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

#define CHECK_DONE() (printf("%d passed, %d failed\n", check_passed, check_failed), check_failed ? 1 : 0)

#endif
