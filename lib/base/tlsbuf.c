#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "tlsbuf.h"

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
		free(b->p[i]);
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
		size_t cap = need < (1u << 20) + 4096 ? (1u << 20) + 4096 : need;
		void *p = realloc(b->p[slot], cap);
		if (!p)
			return NULL;
		memset(p, 0, cap);
		b->p[slot] = p;
		b->cap[slot] = cap;
	}
	return b->p[slot];
}
