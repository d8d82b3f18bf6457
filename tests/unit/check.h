/*
 * check.h - the minimal assertion kit of the C unit tests (one executable
 * per module, run by ctest).  CHECK records a failure and goes on; the test's
 * main ends with `return CHECK_DONE();`, which prints the tally.
 *
 * Cases: main calls each case as CHECK_RUN(test_fn) (or, with arguments,
 * CHECK_RUN_CALL(test_fn, (a, b))).  With the environment variable
 * CHECK_CASE set to a comma-separated list of case names (the functions'
 * names), only those cases run, e.g. one case of one executable:
 *     CHECK_CASE=test_escape build/test_orbax
 *     CHECK_CASE=test_escape ctest --test-dir build -R test_orbax -V
 * Code of main outside CHECK_RUN (set-up, clean-up) always runs; checks that
 * need every case to have run go under `if (CHECK_ALL_CASES())`.  When
 * CHECK_CASE names no case of the executable, CHECK_DONE fails.
 */
#ifndef CKPT_TEST_CHECK_H
#define CKPT_TEST_CHECK_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check_passed, check_failed, check_cases_run;

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

/* 1 when CHECK_CASE is unset or empty: every case runs. */
#define CHECK_ALL_CASES() (!getenv("CHECK_CASE") || !*getenv("CHECK_CASE"))

/* Whether case `name` runs: CHECK_CASE unset, or naming it. */
static inline int check_case_selected(const char *name)
{
	const char *p = getenv("CHECK_CASE");
	if (!p || !*p)
		return 1;
	size_t n = strlen(name);
	while (*p) {
		size_t len = strcspn(p, ",");
		if (len == n && strncmp(p, name, n) == 0)
			return 1;
		p += len + (p[len] == ',');
	}
	return 0;
}

#define CHECK_RUN_CALL(fn, args)                                                                             \
	do {                                                                                                 \
		if (check_case_selected(#fn)) {                                                              \
			check_cases_run++;                                                                   \
			if (!CHECK_ALL_CASES())                                                              \
				printf("case %s\n", #fn);                                                    \
			fn args;                                                                             \
		}                                                                                            \
	} while (0)
#define CHECK_RUN(fn) CHECK_RUN_CALL(fn, ())

static inline int check_done(void)
{
	if (!CHECK_ALL_CASES() && check_cases_run == 0) {
		printf("CHECK_CASE=%s: no such case here (cases are the names given to CHECK_RUN in main)\n",
		       getenv("CHECK_CASE"));
		return 1;
	}
	printf("%d passed, %d failed\n", check_passed, check_failed);
	return check_failed ? 1 : 0;
}
#define CHECK_DONE() check_done()

#endif
