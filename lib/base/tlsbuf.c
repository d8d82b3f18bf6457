#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "hugebuf.h"
#include "tlsbuf.h"

/* Every buffer holds at least TLS_SMALL bytes.  The reply buffer, once it
 * holds more, is a huge-page mapping of 2 MiB or more (ckpt_hugebuf_alloc):
 * the kernel pins a reply page by page (get_user_pages) and copies out of
 * it, and over a huge page each pin is a shorter walk and the copy misses
 * the TLB less.  The other slots take what they need (ckpt_hugebuf_alloc:
 * heap memory below 2 MiB), so that a thread's buffers stay the size of
 * its reads. */
#define TLS_SMALL ((size_t)64 << 10)

struct tls_bufs {
	void *p[CKPT_TLS_NSLOTS];
	size_t cap[CKPT_TLS_NSLOTS];
};

static pthread_key_t key;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void bufs_free(void *arg)
{
	struct tls_bufs *b = arg;
	for (int i = 0; i < CKPT_TLS_NSLOTS; i++)
		ckpt_hugebuf_free(b->p[i], b->cap[i]);
	free(b);
}

static void key_init(void)
{
	pthread_key_create(&key, bufs_free);
}

void *ckpt_tls_buf(enum ckpt_tls_slot slot, size_t need)
{
	pthread_once(&once, key_init);
	struct tls_bufs *b = pthread_getspecific(key);
	if (!b) {
		b = calloc(1, sizeof(*b));
		if (!b)
			return NULL;
		pthread_setspecific(key, b);
	}
	if (need > b->cap[slot]) {
		size_t want = need;
		if (want <= TLS_SMALL)
			want = TLS_SMALL;
		else if (slot == CKPT_TLS_REPLY && want < CKPT_HUGEBUF_MIN)
			want = CKPT_HUGEBUF_MIN;
		size_t cap;
		void *p = ckpt_hugebuf_alloc(want, &cap);
		if (!p)
			return NULL;
		memset(p, 0, cap);
		ckpt_hugebuf_free(b->p[slot], b->cap[slot]);
		b->p[slot] = p;
		b->cap[slot] = cap;
	}
	return b->p[slot];
}
