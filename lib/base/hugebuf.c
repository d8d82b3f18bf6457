/* hugebuf.c - see hugebuf.h. */
#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "hugebuf.h"

#define HUGE_ALIGN ((size_t)2 << 20)

/* A fresh anonymous mapping of n bytes (a multiple of HUGE_ALIGN) that
 * starts on a HUGE_ALIGN boundary, so that every 2 MiB of it can be one
 * huge page (kernels before 6.7 place a mapping of that size anywhere):
 * mapped HUGE_ALIGN larger, then the ends trimmed.  NULL when out of
 * memory. */
static void *aligned_area(size_t n)
{
	size_t span = n + HUGE_ALIGN;
	if (span < n)
		return NULL;
	char *p = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	uintptr_t at = ((uintptr_t)p + HUGE_ALIGN - 1) & ~(uintptr_t)(HUGE_ALIGN - 1);
	size_t head = (size_t)(at - (uintptr_t)p);
	if (head)
		munmap(p, head);
	munmap((char *)at + n, span - head - n);
	return (void *)at;
}

void *ckpt_hugebuf_alloc(size_t len, size_t *cap)
{
	if (len < CKPT_HUGEBUF_MIN) {
		size_t n = len ? len : 1;
		void *p = calloc(1, n);
		*cap = p ? n : 0;
		return p;
	}
	size_t n = (len + HUGE_ALIGN - 1) & ~(HUGE_ALIGN - 1);
	if (n < len) { /* overflow */
		*cap = 0;
		return NULL;
	}
	void *p = aligned_area(n);
	if (!p) {
		*cap = 0;
		return NULL;
	}
	madvise(p, n, MADV_HUGEPAGE); /* advice only: without THP it is plain memory */
	*cap = n;
	return p;
}

void *ckpt_hugebuf_resize(void *p, size_t cap, size_t len, size_t *newcap)
{
	if (!p || cap < CKPT_HUGEBUF_MIN || len < CKPT_HUGEBUF_MIN)
		return NULL;
	size_t n = (len + HUGE_ALIGN - 1) & ~(HUGE_ALIGN - 1);
	if (n < len)
		return NULL;
	if (n == cap) {
		*newcap = cap;
		return p;
	}
	void *q = mremap(p, cap, n, 0); /* in place: the start stays aligned */
	if (q == MAP_FAILED) { /* moved, to an aligned area of its own */
		void *to = aligned_area(n);
		if (!to)
			return NULL;
		q = mremap(p, cap, n, MREMAP_MAYMOVE | MREMAP_FIXED, to);
		if (q == MAP_FAILED) {
			munmap(to, n);
			return NULL;
		}
	}
	if (n > cap)
		madvise(q, n, MADV_HUGEPAGE);
	*newcap = n;
	return q;
}

void *ckpt_hugebuf_split(void *p, size_t cap, size_t head)
{
	/* any page range of an anonymous mapping can be unmapped or
	 * remapped by itself: the two parts need no system call yet */
	assert(p && cap >= CKPT_HUGEBUF_MIN && head > 0 && head < cap && head % HUGE_ALIGN == 0);
	(void)cap;
	return (char *)p + head;
}

void ckpt_hugebuf_free(void *p, size_t cap)
{
	if (!p)
		return;
	if (cap < CKPT_HUGEBUF_MIN)
		free(p);
	else
		munmap(p, cap);
}
