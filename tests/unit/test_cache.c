/* Unit tests of the decoded-chunk cache: hits and misses, single-flight
 * loading under concurrent misses, the byte budget (in-flight decodes
 * counted, waits, -EAGAIN for pin holders, units over the budget), failed
 * loads, reuse of consumed chunks' buffers, resized buffers, the per-thread
 * scratch buffers (tlsbuf.h), and the cache's invariants (ckpt_cache_check)
 * after every step and after a concurrent mix of hits, misses, failures and
 * reservations. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cache.h"
#include "check.h"
#include "hugebuf.h"
#include "tlsbuf.h"

static atomic_int fills;

static int fill_pattern(void *arg, void *dst)
{
	size_t n = *(size_t *)arg;
	atomic_fetch_add(&fills, 1);
	usleep(2000); /* widen the window for concurrent misses */
	memset(dst, 0x5a, n);
	return 0;
}

static int fill_fail(void *arg, void *dst)
{
	(void)arg;
	(void)dst;
	atomic_fetch_add(&fills, 1);
	return -EIO;
}

struct worker {
	ckpt_cache *c;
	size_t size;
	int ok;
};

static void *miss_same(void *p)
{
	struct worker *w = p;
	ckpt_centry *e;
	if (ckpt_cache_get(w->c, 1, 42, w->size, fill_pattern, &w->size, &e) == 0) {
		const unsigned char *d = ckpt_centry_data(e);
		w->ok = d[0] == 0x5a && d[w->size - 1] == 0x5a;
		ckpt_cache_release(w->c, e);
	}
	return NULL;
}

static int fill_fail_slow(void *arg, void *dst)
{
	(void)arg;
	(void)dst;
	atomic_fetch_add(&fills, 1);
	usleep(2000); /* waiters pile up on the failing load */
	return -EIO;
}

static void *miss_fail(void *p)
{
	struct worker *w = p;
	ckpt_centry *e;
	w->ok = ckpt_cache_get(w->c, 9, 1, w->size, fill_fail_slow, NULL, &e) == -EIO;
	return NULL;
}

/* A load that fails after another thread began to wait for it: the
 * waiter then loads for itself (its fill succeeds). */
static atomic_int waiter_asked;

static int fill_fail_late(void *arg, void *dst)
{
	(void)arg;
	(void)dst;
	atomic_fetch_add(&fills, 1);
	while (!atomic_load(&waiter_asked))
		usleep(1000);
	usleep(50000); /* the waiter is waiting on this load by now */
	return -EIO;
}

static void *load_fail_late(void *p)
{
	struct worker *w = p;
	ckpt_centry *e;
	w->ok = ckpt_cache_get(w->c, 11, 1, w->size, fill_fail_late, NULL, &e) == -EIO;
	return NULL;
}

struct mixer {
	ckpt_cache *c;
	unsigned seed;
	int errors;
};

static int fill_sized(void *arg, void *dst)
{
	size_t n = *(size_t *)arg;
	memset(dst, (int)(n & 0xff), n);
	return 0;
}

static void *mix(void *p)
{
	struct mixer *m = p;
	static const size_t sizes[] = { 4096, 100000, 1u << 20, (2u << 20) + 1, 3u << 20 };
	for (int i = 0; i < 3000; i++) {
		m->seed = m->seed * 1103515245u + 12345u;
		unsigned r = m->seed >> 8;
		uint64_t idx = r % 40;
		size_t size = sizes[idx % 5]; /* one size per chunk, as for real arrays */
		ckpt_centry *e;
		switch (r % 7) {
		case 0: { /* a failing load */
			int rc = ckpt_cache_get(m->c, 20, idx, size, fill_fail, NULL, &e);
			if (rc == 0)
				ckpt_cache_release(m->c, e);
			break;
		}
		case 1: { /* reserve, then fill or cancel */
			if (ckpt_cache_reserve(m->c, 21, idx, size, &e) == 1) {
				if (r & 1024)
					ckpt_cache_cancel(m->c, e);
				else if (ckpt_cache_fill_reserved(m->c, e, fill_sized, &size) < 0)
					m->errors++;
			}
			break;
		}
		default: {
			uint64_t owner = 21 + (r % 2);
			if (ckpt_cache_get(m->c, owner, idx, size, fill_sized, &size, &e) == 0) {
				const unsigned char *d = ckpt_centry_data(e);
				m->errors += d[0] != (size & 0xff) || d[size - 1] != (size & 0xff);
				ckpt_cache_release(m->c, e);
			} else {
				m->errors++;
			}
		}
		}
	}
	return NULL;
}

/* ---- budget: in-flight decodes count, waits, consumed buffers reused ---- */

static ckpt_cache *budget_cache;
static atomic_ullong budget_peak;

static int fill_watch(void *arg, void *dst)
{
	size_t n = *(size_t *)arg;
	unsigned long long b = ckpt_cache_bytes(budget_cache);
	unsigned long long p = atomic_load(&budget_peak);
	while (b > p && !atomic_compare_exchange_weak(&budget_peak, &p, b))
		;
	usleep(500);
	memset(dst, 0x33, n);
	return 0;
}

struct budget_worker {
	unsigned seed;
	int errors;
};

static void *budget_loop(void *p)
{
	struct budget_worker *w = p;
	size_t size = 1u << 20;
	for (int i = 0; i < 200; i++) {
		w->seed = w->seed * 1103515245u + 12345u;
		ckpt_centry *e;
		int rc = ckpt_cache_get(budget_cache, 5, (w->seed >> 8) % 64, size, fill_watch, &size, &e);
		if (rc != 0) {
			fprintf(stderr, "budget_loop: %d\n", rc);
			w->errors++;
			continue;
		}
		w->errors += ((const unsigned char *)ckpt_centry_data(e))[size - 1] != 0x33;
		ckpt_cache_release_used(budget_cache, e, (w->seed >> 20) & 1);
	}
	return NULL;
}

static void test_budget(void)
{
	size_t mib = 1u << 20, big = 3u << 20;
	ckpt_cache *c;
	ckpt_centry *e, *a, *b;

	/* A sequential reader's consumed chunks are recycled: 32 chunks of
	 * 2 MiB through a 64 MiB budget hold one buffer, not 32. */
	size_t two = 2u << 20;
	CHECK_EQ_INT(ckpt_cache_create(64u << 20, &c), 0);
	for (uint64_t i = 0; i < 32; i++) {
		CHECK_EQ_INT(ckpt_cache_get(c, 1, i, two, fill_pattern, &two, &e), 0);
		ckpt_cache_release_used(c, e, 1);
	}
	CHECK(ckpt_cache_bytes(c) == two);
	CHECK_EQ_INT(ckpt_cache_check(c), 0);
	/* not consumed: kept until the budget is full */
	for (uint64_t i = 100; i < 110; i++) {
		CHECK_EQ_INT(ckpt_cache_get(c, 1, i, two, fill_pattern, &two, &e), 0);
		ckpt_cache_release(c, e);
	}
	CHECK(ckpt_cache_bytes(c) == 10 * two);
	/* a marked pin is consumed at its release; a hit clears the mark */
	CHECK_EQ_INT(ckpt_cache_get(c, 1, 100, two, fill_pattern, &two, &e), 0);
	ckpt_cache_mark_used(c, e);
	ckpt_cache_release(c, e);
	CHECK_EQ_INT(ckpt_cache_check(c), 0);
	CHECK_EQ_INT(ckpt_cache_get(c, 1, 200, two, fill_pattern, &two, &e), 0);
	ckpt_cache_release(c, e);
	CHECK(!ckpt_cache_contains(c, 1, 100)); /* its buffer went to chunk 200 */
	CHECK(ckpt_cache_bytes(c) == 10 * two);
	/* small chunks keep LRU order even when consumed */
	for (uint64_t i = 300; i < 304; i++) {
		CHECK_EQ_INT(ckpt_cache_get(c, 1, i, mib, fill_pattern, &mib, &e), 0);
		ckpt_cache_release_used(c, e, 1);
	}
	CHECK(ckpt_cache_contains(c, 1, 300) && ckpt_cache_bytes(c) == 10 * two + 4 * mib);
	ckpt_cache_destroy(c);

	/* A thread holding pins gets -EAGAIN instead of overshooting; after
	 * releasing them it gets the chunk. */
	CHECK_EQ_INT(ckpt_cache_create(2u << 20, &c), 0);
	CHECK_EQ_INT(ckpt_cache_get(c, 2, 1, mib, fill_pattern, &mib, &a), 0);
	CHECK_EQ_INT(ckpt_cache_get(c, 2, 2, mib, fill_pattern, &mib, &b), 0);
	CHECK_EQ_INT(ckpt_cache_get(c, 2, 3, mib, fill_pattern, &mib, &e), -EAGAIN);
	CHECK(!ckpt_cache_contains(c, 2, 3));
	CHECK(ckpt_cache_bytes(c) <= (2u << 20));
	ckpt_cache_release(c, a);
	ckpt_cache_release(c, b);
	CHECK_EQ_INT(ckpt_cache_get(c, 2, 3, mib, fill_pattern, &mib, &e), 0);
	ckpt_cache_release(c, e);
	/* a prefetch with no room gives up (ECANCELED), a waiting reader loads it */
	CHECK_EQ_INT(ckpt_cache_get(c, 2, 1, mib, fill_pattern, &mib, &a), 0);
	CHECK_EQ_INT(ckpt_cache_get(c, 2, 2, mib, fill_pattern, &mib, &b), 0);
	ckpt_centry *r;
	CHECK_EQ_INT(ckpt_cache_reserve(c, 2, 9, mib, &r), 1);
	CHECK_EQ_INT(ckpt_cache_fill_reserved(c, r, fill_pattern, &mib), -ECANCELED);
	CHECK(!ckpt_cache_contains(c, 2, 9));
	ckpt_cache_release(c, a);
	ckpt_cache_release(c, b);
	/* a unit larger than the budget: decoded alone, never kept */
	CHECK_EQ_INT(ckpt_cache_get(c, 2, 7, big, fill_pattern, &big, &e), 0);
	CHECK_EQ_INT(ckpt_cache_get(c, 2, 8, mib, fill_pattern, &mib, &a), -EAGAIN);
	ckpt_cache_release(c, e);
	CHECK(ckpt_cache_bytes(c) <= (2u << 20));
	CHECK(!ckpt_cache_contains(c, 2, 7));
	CHECK_EQ_INT(ckpt_cache_check(c), 0);
	ckpt_cache_destroy(c);

	/* 8 threads missing on 64 chunks through a 4-chunk budget: decodes
	 * wait for room and the bytes held never exceed the budget. */
	CHECK_EQ_INT(ckpt_cache_create(4u << 20, &budget_cache), 0);
	atomic_store(&budget_peak, 0);
	pthread_t t[8];
	struct budget_worker w[8];
	for (int i = 0; i < 8; i++) {
		w[i] = (struct budget_worker){ 1234u + (unsigned)i * 77u, 0 };
		pthread_create(&t[i], NULL, budget_loop, &w[i]);
	}
	for (int i = 0; i < 8; i++) {
		pthread_join(t[i], NULL);
		CHECK_EQ_INT(w[i].errors, 0);
	}
	CHECK(atomic_load(&budget_peak) <= (4u << 20));
	CHECK(ckpt_cache_bytes(budget_cache) <= (4u << 20));
	CHECK_EQ_INT(ckpt_cache_check(budget_cache), 0);
	ckpt_cache_destroy(budget_cache);
}

/* Load chunks [first, first+n) of owner, each `size` bytes, and release
 * them (consumed or not), checking the invariants after each. */
static void load_chunks(ckpt_cache *c, uint64_t owner, uint64_t first, uint64_t n, size_t size, int consumed)
{
	ckpt_centry *e;
	for (uint64_t i = first; i < first + n; i++) {
		CHECK_EQ_INT(ckpt_cache_get(c, owner, i, size, fill_pattern, &size, &e), 0);
		ckpt_cache_release_used(c, e, consumed);
		CHECK_EQ_INT(ckpt_cache_check(c), 0);
	}
}

/* A buffer resized keeps its first bytes (a grown one is zero past
 * them); sizes under CKPT_HUGEBUF_MIN are not resized.  In the cache, a
 * chunk of another size reuses an evicted buffer resized when the budget
 * allows, within the budget and with the new chunk's bytes. */
/* The smaps entry of the mapping that starts at p: its size in KiB and
 * whether it carries MADV_HUGEPAGE ("hg" in VmFlags); 0 when no mapping
 * starts there. */
static int mapping_at(const void *p, unsigned long *kib, int *hg)
{
	FILE *f = fopen("/proc/self/smaps", "r");
	if (!f)
		return 0;
	char line[512];
	int found = 0;
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
			if (found)
				break;
			if (lo == (unsigned long)(uintptr_t)p) {
				found = 1;
				*kib = (hi - lo) >> 10;
				*hg = 0;
			}
		} else if (found && strncmp(line, "VmFlags:", 8) == 0) {
			*hg = strstr(line, " hg") != NULL;
		}
	}
	fclose(f);
	return found;
}

static void *tls_other_thread(void *arg)
{
	(void)arg;
	return ckpt_tls_buf(CKPT_TLS_REPLY, 1u << 20);
}

/* Per-thread buffers: the reply buffer, large (1 MiB), is a mapping of its
 * own of 2 MiB advised for huge pages, reused while it is large enough and
 * replaced when it is not; the other slots' buffers are as large as asked. */
static void test_tls_bufs(void)
{
	size_t reply = (1u << 20) + 4096;
	uint8_t *big = ckpt_tls_buf(CKPT_TLS_REPLY, reply);
	CHECK(big != NULL);
	unsigned long kib = 0;
	int hg = 0;
	CHECK(mapping_at(big, &kib, &hg));
	CHECK(kib == 2048 && hg);
	memset(big, 0x3c, reply);
	CHECK(ckpt_tls_buf(CKPT_TLS_REPLY, 4096) == big); /* large enough: the same */
	uint8_t *bigger = ckpt_tls_buf(CKPT_TLS_REPLY, (3u << 20) + 1);
	CHECK(bigger != NULL && mapping_at(bigger, &kib, &hg) && kib == 4096 && hg);
	memset(bigger, 0x3d, (3u << 20) + 1);
	/* another slot takes what it asks for: no huge-page mapping for 1 MiB */
	uint8_t *gath = ckpt_tls_buf(CKPT_TLS_VIEW_GATHER, 1u << 20);
	CHECK(gath != NULL && (!mapping_at(gath, &kib, &hg) || !hg));
	memset(gath, 0x3f, 1u << 20);
	uint8_t *small = ckpt_tls_buf(CKPT_TLS_TILE, 100);
	CHECK(small != NULL);
	memset(small, 0x3e, 64u << 10);
	CHECK(ckpt_tls_buf(CKPT_TLS_TILE, 64u << 10) == small);
	pthread_t t;
	void *theirs = NULL;
	CHECK_EQ_INT(pthread_create(&t, NULL, tls_other_thread, NULL), 0);
	pthread_join(t, &theirs);
	CHECK(theirs != NULL && theirs != (void *)bigger);
	CHECK(!mapping_at(theirs, &kib, &hg)); /* freed when its thread exited */
}

static void test_resize(void)
{
	size_t cap, ncap, four = 4u << 20, eight = 8u << 20;
	uint8_t *p = ckpt_hugebuf_alloc(four, &cap);
	CHECK(p && cap == four);
	memset(p, 0x77, four);
	uint8_t *q = ckpt_hugebuf_resize(p, cap, 10u << 20, &ncap);
	CHECK(q && ncap == (10u << 20));
	int kept = 1, zero = 1;
	for (size_t i = 0; q && i < four; i += 4093)
		kept &= q[i] == 0x77;
	for (size_t i = four; q && i < ncap; i += 4093)
		zero &= q[i] == 0;
	CHECK(kept && zero);
	uint8_t *r = ckpt_hugebuf_resize(q, ncap, 3u << 20, &cap);
	CHECK(r && cap == four && r[0] == 0x77 && r[cap - 1] == 0x77);
	CHECK(ckpt_hugebuf_resize(r, cap, 4096, &ncap) == NULL); /* unchanged, still ours */
	CHECK(r[0] == 0x77);
	ckpt_hugebuf_free(r, cap);
	uint8_t *small = ckpt_hugebuf_alloc(4096, &cap);
	CHECK(ckpt_hugebuf_resize(small, cap, four, &ncap) == NULL);
	ckpt_hugebuf_free(small, cap);
	/* every mapped buffer starts on a 2 MiB boundary (each 2 MiB of it can
	 * be one huge page), also one that had to move to grow: a page mapped
	 * right after it keeps it from growing in place */
	const uintptr_t huge = (uintptr_t)2 << 20;
	p = ckpt_hugebuf_alloc(four + 1, &cap);
	CHECK(p && cap == 6u << 20 && (uintptr_t)p % huge == 0);
	memset(p, 0x5a, cap);
	void *block =
		mmap(p + cap, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	CHECK(block == (void *)(p + cap));
	q = ckpt_hugebuf_resize(p, cap, eight + 1, &ncap);
	CHECK(q && q != p && ncap == 10u << 20 && (uintptr_t)q % huge == 0);
	CHECK(q && q[0] == 0x5a && q[cap - 1] == 0x5a && q[cap] == 0 && q[ncap - 1] == 0);
	if (block != MAP_FAILED)
		munmap(block, 4096);
	ckpt_hugebuf_free(q ? q : p, q ? ncap : cap);

	ckpt_cache *c;
	ckpt_centry *e;
	CHECK_EQ_INT(ckpt_cache_create(16u << 20, &c), 0);
	for (uint64_t i = 0; i < 4; i++) {
		CHECK_EQ_INT(ckpt_cache_get(c, 1, i, four, fill_pattern, &four, &e), 0);
		ckpt_cache_release(c, e);
	}
	CHECK(ckpt_cache_bytes(c) == (16u << 20));
	for (uint64_t i = 10; i < 13; i++) {
		CHECK_EQ_INT(ckpt_cache_get(c, 1, i, eight, fill_pattern, &eight, &e), 0);
		const uint8_t *d = ckpt_centry_data(e);
		CHECK(d[0] == 0x5a && d[eight - 1] == 0x5a);
		ckpt_cache_release(c, e);
		CHECK(ckpt_cache_bytes(c) <= (16u << 20));
		CHECK_EQ_INT(ckpt_cache_check(c), 0);
	}
	CHECK(ckpt_cache_contains(c, 1, 12) && !ckpt_cache_contains(c, 1, 0));
	ckpt_cache_destroy(c);

	/* A buffer reused for a smaller chunk is trimmed to it: 4 chunks of
	 * 8 MiB, consumed, then 8 chunks of 4 MiB fill the same 32 MiB budget
	 * (untrimmed, each would hold an 8 MiB buffer: 4 of them). */
	CHECK_EQ_INT(ckpt_cache_create(32u << 20, &c), 0);
	load_chunks(c, 1, 0, 4, eight, 1);
	load_chunks(c, 1, 10, 8, four, 0);
	for (uint64_t i = 10; i < 18; i++)
		CHECK(ckpt_cache_contains(c, 1, i));
	CHECK(ckpt_cache_bytes(c) <= (32u << 20));
	ckpt_cache_destroy(c);
}

/* A fill that records whether its buffer held bytes before (memory
 * touched before reads 0x5a here; fresh memory reads 0). */
struct warm_fill {
	size_t size;
	int warm;
};

static int fill_note_warm(void *arg, void *dst)
{
	struct warm_fill *w = arg;
	const uint8_t *d = dst;
	w->warm = d[0] == 0x5a && d[w->size - 1] == 0x5a;
	memset(dst, 0x5a, w->size);
	return 0;
}

/* A mapped buffer reused for a smaller chunk keeps the rest of its pages
 * as a spare: an 8 MiB chunk's buffer, once consumed, serves two 4 MiB
 * chunks (the first still pinned when the second loads), with no fresh
 * memory; and a 16 MiB one serves a 4 MiB chunk however much it wastes
 * (the rest, 12 MiB, then serves an 8 MiB one). */
static void test_split_spare(void)
{
	size_t eight = 8u << 20, sixteen = 16u << 20;
	ckpt_cache *c;
	ckpt_centry *a, *b;
	CHECK_EQ_INT(ckpt_cache_create(64u << 20, &c), 0);
	load_chunks(c, 1, 0, 1, eight, 1);
	struct warm_fill w1 = { 4u << 20, 0 }, w2 = { 4u << 20, 0 };
	CHECK_EQ_INT(ckpt_cache_get(c, 1, 10, w1.size, fill_note_warm, &w1, &a), 0);
	CHECK_EQ_INT(ckpt_cache_get(c, 1, 11, w2.size, fill_note_warm, &w2, &b), 0);
	CHECK(w1.warm && w2.warm);
	CHECK(ckpt_cache_bytes(c) == eight);
	CHECK_EQ_INT(ckpt_cache_check(c), 0);
	ckpt_cache_release(c, a);
	ckpt_cache_release(c, b);
	load_chunks(c, 2, 0, 1, sixteen, 1);
	struct warm_fill w3 = { 4u << 20, 0 }, w4 = { eight, 0 };
	CHECK_EQ_INT(ckpt_cache_get(c, 3, 0, w3.size, fill_note_warm, &w3, &a), 0);
	CHECK_EQ_INT(ckpt_cache_get(c, 3, 1, w4.size, fill_note_warm, &w4, &b), 0);
	CHECK(w3.warm && w4.warm);
	CHECK(ckpt_cache_bytes(c) == eight + sixteen);
	CHECK_EQ_INT(ckpt_cache_check(c), 0);
	ckpt_cache_release(c, a);
	ckpt_cache_release(c, b);
	ckpt_cache_destroy(c);
}

/* ckpt_cache_cool_owner: the idle entries of one owner go to the cold end
 * as consumed, so making room evicts them before the older entries of
 * another owner; pinned ones and other owners stay. */
static void test_cool_owner(void)
{
	size_t four = 4u << 20;
	ckpt_cache *c;
	ckpt_centry *pinned;
	CHECK_EQ_INT(ckpt_cache_create(32u << 20, &c), 0);
	load_chunks(c, 1, 0, 4, four, 0); /* owner 1: the oldest */
	load_chunks(c, 2, 0, 3, four, 0); /* owner 2, and a fourth kept pinned */
	CHECK_EQ_INT(ckpt_cache_get(c, 2, 3, four, fill_pattern, &four, &pinned), 0);
	CHECK_EQ_INT((int)ckpt_cache_cool_owner(c, 2), 3);
	CHECK_EQ_INT((int)ckpt_cache_cool_owner(c, 2), 0); /* already cold */
	CHECK_EQ_INT(ckpt_cache_check(c), 0);
	load_chunks(c, 3, 0, 3, four, 0); /* three new chunks: owner 2's idle ones make the room */
	for (uint64_t i = 0; i < 4; i++)
		CHECK(ckpt_cache_contains(c, 1, i));
	for (uint64_t i = 0; i < 3; i++)
		CHECK(!ckpt_cache_contains(c, 2, i));
	CHECK(ckpt_cache_contains(c, 2, 3));
	ckpt_cache_release(c, pinned);
	ckpt_cache_destroy(c);
}

/* Dropping owners (a deleted step's arrays): idle entries are freed at
 * once and their bytes leave ckpt_cache_bytes; pinned and reserved ones
 * stay readable and are freed at their last release; other owners stay. */
static void test_drop_owners(void)
{
	size_t mib = 1u << 20;
	ckpt_cache *c;
	ckpt_centry *e, *pin, *r;
	CHECK_EQ_INT(ckpt_cache_create(64u << 20, &c), 0);
	for (uint64_t owner = 10; owner < 14; owner++)
		for (uint64_t i = 0; i < 4; i++) {
			CHECK_EQ_INT(ckpt_cache_get(c, owner, i, mib, fill_pattern, &mib, &e), 0);
			ckpt_cache_release(c, e);
		}
	CHECK(ckpt_cache_bytes(c) == 16 * mib);
	CHECK_EQ_INT(ckpt_cache_get(c, 11, 0, mib, fill_pattern, &mib, &pin), 0);
	CHECK_EQ_INT(ckpt_cache_reserve(c, 11, 9, mib, &r), 1);
	const uint64_t owners[] = { 10, 11 };
	CHECK(ckpt_cache_drop_owners(c, owners, 2) == 7); /* 8 cached, one pinned */
	CHECK_EQ_INT(ckpt_cache_check(c), 0);
	CHECK(ckpt_cache_bytes(c) == 9 * mib); /* owners 12, 13 and the pinned one */
	CHECK(!ckpt_cache_contains(c, 10, 0) && !ckpt_cache_contains(c, 11, 1));
	CHECK(ckpt_cache_contains(c, 12, 3) && ckpt_cache_contains(c, 13, 0));
	CHECK_EQ_INT(((const unsigned char *)ckpt_centry_data(pin))[mib - 1], 0x5a);
	ckpt_cache_release(c, pin);
	CHECK(!ckpt_cache_contains(c, 11, 0));
	CHECK(ckpt_cache_bytes(c) == 8 * mib);
	CHECK_EQ_INT(ckpt_cache_fill_reserved(c, r, fill_pattern, &mib), 0);
	CHECK(!ckpt_cache_contains(c, 11, 9)); /* reserved before the drop: not kept */
	CHECK(ckpt_cache_bytes(c) == 8 * mib);
	CHECK(ckpt_cache_drop_owners(c, owners, 2) == 0);
	CHECK(ckpt_cache_drop_owners(c, owners, 0) == 0);
	CHECK_EQ_INT(ckpt_cache_check(c), 0);
	ckpt_cache_destroy(c);
}

int main(void)
{
	ckpt_cache *c;
	size_t size = 3u << 20;
	CHECK_EQ_INT(ckpt_cache_create(16u << 20, &c), 0);

	/* miss then hit */
	ckpt_centry *e;
	atomic_store(&fills, 0);
	CHECK_EQ_INT(ckpt_cache_get(c, 1, 1, size, fill_pattern, &size, &e), 0);
	ckpt_cache_release(c, e);
	CHECK_EQ_INT(ckpt_cache_get(c, 1, 1, size, fill_pattern, &size, &e), 0);
	ckpt_cache_release(c, e);
	CHECK_EQ_INT(atomic_load(&fills), 1);
	CHECK(ckpt_cache_contains(c, 1, 1));
	CHECK(!ckpt_cache_contains(c, 2, 1));
	CHECK_EQ_INT(ckpt_cache_check(c), 0);

	/* 8 threads miss on one chunk: one fill, every thread sees the data */
	atomic_store(&fills, 0);
	pthread_t t[8];
	struct worker w[8];
	for (int i = 0; i < 8; i++) {
		w[i] = (struct worker){ c, size, 0 };
		pthread_create(&t[i], NULL, miss_same, &w[i]);
	}
	for (int i = 0; i < 8; i++) {
		pthread_join(t[i], NULL);
		CHECK(w[i].ok);
	}
	CHECK_EQ_INT(atomic_load(&fills), 1);
	CHECK_EQ_INT(ckpt_cache_check(c), 0);

	/* the budget holds: 40 chunks of 3 MiB (4 MiB capacity) in a 16 MiB cache */
	for (uint64_t i = 100; i < 140; i++) {
		CHECK_EQ_INT(ckpt_cache_get(c, 3, i, size, fill_pattern, &size, &e), 0);
		ckpt_cache_release(c, e);
		CHECK(ckpt_cache_bytes(c) <= (16u << 20));
	}
	CHECK(!ckpt_cache_contains(c, 3, 100)); /* evicted (LRU) */
	CHECK(ckpt_cache_contains(c, 3, 139));
	CHECK_EQ_INT(ckpt_cache_check(c), 0);

	/* a failed fill is returned and not cached */
	atomic_store(&fills, 0);
	CHECK_EQ_INT(ckpt_cache_get(c, 4, 1, size, fill_fail, NULL, &e), -EIO);
	CHECK(!ckpt_cache_contains(c, 4, 1));
	CHECK_EQ_INT(ckpt_cache_get(c, 4, 1, size, fill_fail, NULL, &e), -EIO);
	CHECK_EQ_INT(atomic_load(&fills), 2);
	CHECK_EQ_INT(ckpt_cache_check(c), 0);

	/* 8 threads on one failing load: every one gets the error, the failed
	 * entry's buffer is accounted for until the last waiter lets it go */
	for (int i = 0; i < 8; i++) {
		w[i] = (struct worker){ c, size, 0 };
		pthread_create(&t[i], NULL, miss_fail, &w[i]);
	}
	for (int i = 0; i < 8; i++) {
		pthread_join(t[i], NULL);
		CHECK(w[i].ok);
	}
	CHECK(!ckpt_cache_contains(c, 9, 1));
	CHECK_EQ_INT(ckpt_cache_check(c), 0);

	/* a waiter of a load that fails loads once for itself: a store that
	 * recovered meanwhile serves it */
	{
		struct worker loader = { c, size, 0 };
		pthread_t lt;
		atomic_store(&fills, 0);
		atomic_store(&waiter_asked, 0);
		pthread_create(&lt, NULL, load_fail_late, &loader);
		while (atomic_load(&fills) == 0)
			usleep(1000);
		atomic_store(&waiter_asked, 1);
		ckpt_centry *got = NULL;
		CHECK_EQ_INT(ckpt_cache_get(c, 11, 1, size, fill_pattern, &size, &got), 0);
		pthread_join(lt, NULL);
		CHECK(loader.ok); /* the loader itself gets its error */
		CHECK_EQ_INT(atomic_load(&fills), 2);
		if (got)
			ckpt_cache_release(c, got);
		CHECK_EQ_INT(ckpt_cache_check(c), 0);
	}

	/* pinned entries survive eviction pressure */
	ckpt_centry *pinned;
	CHECK_EQ_INT(ckpt_cache_get(c, 5, 1, size, fill_pattern, &size, &pinned), 0);
	for (uint64_t i = 0; i < 20; i++) {
		CHECK_EQ_INT(ckpt_cache_get(c, 6, i, size, fill_pattern, &size, &e), 0);
		ckpt_cache_release(c, e);
	}
	CHECK(ckpt_cache_contains(c, 5, 1));
	CHECK_EQ_INT(((const unsigned char *)ckpt_centry_data(pinned))[0], 0x5a);
	CHECK_EQ_INT(ckpt_cache_check(c), 0);
	ckpt_cache_release(c, pinned);

	/* a chunk larger than the budget is served, then not kept */
	size_t huge = 20u << 20;
	CHECK_EQ_INT(ckpt_cache_get(c, 7, 1, huge, fill_pattern, &huge, &e), 0);
	ckpt_cache_release(c, e);
	CHECK(!ckpt_cache_contains(c, 7, 1));
	CHECK(ckpt_cache_bytes(c) <= (16u << 20));

	/* reservations: one per chunk; fill later; a second reserve is refused */
	ckpt_centry *r1, *r2;
	atomic_store(&fills, 0);
	CHECK_EQ_INT(ckpt_cache_reserve(c, 8, 1, size, &r1), 1);
	CHECK_EQ_INT(ckpt_cache_reserve(c, 8, 1, size, &r2), 0);
	CHECK(ckpt_cache_contains(c, 8, 1));
	CHECK_EQ_INT(ckpt_cache_fill_reserved(c, r1, fill_pattern, &size), 0);
	CHECK_EQ_INT(ckpt_cache_get(c, 8, 1, size, fill_pattern, &size, &e), 0);
	ckpt_cache_release(c, e);
	CHECK_EQ_INT(atomic_load(&fills), 1);

	/* a reader takes over a reservation that has not started: one fill */
	atomic_store(&fills, 0);
	CHECK_EQ_INT(ckpt_cache_reserve(c, 8, 2, size, &r1), 1);
	CHECK_EQ_INT(ckpt_cache_get(c, 8, 2, size, fill_pattern, &size, &e), 0);
	CHECK_EQ_INT(((const unsigned char *)ckpt_centry_data(e))[0], 0x5a);
	ckpt_cache_release(c, e);
	CHECK_EQ_INT(ckpt_cache_fill_reserved(c, r1, fill_pattern, &size), 0);
	CHECK_EQ_INT(atomic_load(&fills), 1);

	/* a cancelled reservation leaves nothing behind; a reader then loads it */
	CHECK_EQ_INT(ckpt_cache_reserve(c, 8, 3, size, &r1), 1);
	ckpt_cache_cancel(c, r1);
	CHECK(!ckpt_cache_contains(c, 8, 3));
	CHECK_EQ_INT(ckpt_cache_get(c, 8, 3, size, fill_pattern, &size, &e), 0);
	ckpt_cache_release(c, e);

	/* a failed fill of a reservation is reported and not cached */
	CHECK_EQ_INT(ckpt_cache_reserve(c, 8, 4, size, &r1), 1);
	CHECK_EQ_INT(ckpt_cache_fill_reserved(c, r1, fill_fail, NULL), -EIO);
	CHECK(!ckpt_cache_contains(c, 8, 4));
	CHECK_EQ_INT(ckpt_cache_check(c), 0);

	/* 4 threads: hits, misses, failures, reservations, cancels, eviction */
	pthread_t mt[4];
	struct mixer mx[4];
	for (int i = 0; i < 4; i++) {
		mx[i] = (struct mixer){ c, 77u + (unsigned)i, 0 };
		pthread_create(&mt[i], NULL, mix, &mx[i]);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(mt[i], NULL);
		CHECK_EQ_INT(mx[i].errors, 0);
	}
	CHECK_EQ_INT(ckpt_cache_check(c), 0);
	CHECK(ckpt_cache_bytes(c) <= (16u << 20));

	ckpt_cache_destroy(c);

	CHECK_RUN(test_budget);
	CHECK_RUN(test_resize);
	CHECK_RUN(test_tls_bufs);
	CHECK_RUN(test_split_spare);
	CHECK_RUN(test_cool_owner);
	CHECK_RUN(test_drop_owners);
	return CHECK_DONE();
}
