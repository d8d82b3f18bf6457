/* kept.c - see kept.h. */
#include <assert.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "kept.h"
#include "stats.h"

enum kept_state { KEPT_EMPTY, KEPT_IDLE, KEPT_BUSY, KEPT_DRAINING };

struct kept_slot {
	uint64_t unit1; /* unit + 1; 0: none (EMPTY or DRAINING) */
	unsigned epoch;
	int fd;
	int refs;
	uint64_t used; /* the set's tick at its last take: the LRU order */
};

struct ckpt_kept {
	pthread_mutex_t mu;
	ckpt_kept_limit *lim;
	uint64_t tick;
	struct kept_slot s[KEPT_UNITS];
};

/* A slot's state from its fields; an impossible combination asserts. */
static enum kept_state kept_check(const struct kept_slot *s)
{
	assert(s->refs >= 0);
	if (s->fd < 0) {
		assert(s->refs == 0 && s->unit1 == 0);
		return KEPT_EMPTY;
	}
	if (s->unit1 == 0) {
		assert(s->refs > 0); /* an idle slot without a unit is closed at once */
		return KEPT_DRAINING;
	}
	return s->refs ? KEPT_BUSY : KEPT_IDLE;
}

/* Close slot s (IDLE, or DRAINING at its last release).  Caller holds mu. */
static void slot_close(ckpt_kept *k, struct kept_slot *s)
{
	close(s->fd);
	s->fd = -1;
	s->unit1 = 0;
	s->refs = 0;
	atomic_fetch_sub(&k->lim->open, 1);
	CKPT_STAT_ADD(kept_files, -1);
}

/* Drop slot s: closed when idle, else closed by its last release.  Caller
 * holds mu. */
static void slot_drop(ckpt_kept *k, struct kept_slot *s)
{
	enum kept_state st = kept_check(s);
	if (st == KEPT_IDLE)
		slot_close(k, s);
	else if (st == KEPT_BUSY)
		s->unit1 = 0;
}

ckpt_kept *ckpt_kept_create(ckpt_kept_limit *lim)
{
	ckpt_kept *k = calloc(1, sizeof(*k));
	if (!k)
		return NULL;
	pthread_mutex_init(&k->mu, NULL);
	k->lim = lim;
	for (int i = 0; i < KEPT_UNITS; i++)
		k->s[i].fd = -1;
	return k;
}

void ckpt_kept_destroy(ckpt_kept *k)
{
	if (!k)
		return;
	ckpt_kept_drop(k);
	for (int i = 0; i < KEPT_UNITS; i++)
		assert(kept_check(&k->s[i]) == KEPT_EMPTY);
	pthread_mutex_destroy(&k->mu);
	free(k);
}

int ckpt_kept_take(ckpt_kept *k, uint64_t unit, unsigned ep, int *fd)
{
	int got = -1;
	pthread_mutex_lock(&k->mu);
	for (int i = 0; i < KEPT_UNITS; i++) {
		struct kept_slot *s = &k->s[i];
		if (s->unit1 == 0)
			continue;
		if (s->epoch != ep) {
			slot_drop(k, s);
		} else if (s->unit1 == unit + 1 && got < 0) { /* two reads may have added it */
			s->refs++;
			s->used = ++k->tick;
			*fd = s->fd;
			got = i;
		}
	}
	pthread_mutex_unlock(&k->mu);
	return got;
}

int ckpt_kept_add(ckpt_kept *k, uint64_t unit, unsigned ep, int fd)
{
	int got = -1;
	pthread_mutex_lock(&k->mu);
	struct kept_slot *free_slot = NULL, *lru = NULL;
	for (int i = 0; i < KEPT_UNITS; i++) {
		struct kept_slot *s = &k->s[i];
		enum kept_state state = kept_check(s);
		if (state == KEPT_EMPTY && !free_slot)
			free_slot = s;
		else if (state == KEPT_IDLE && (!lru || s->used < lru->used))
			lru = s;
	}
	if (free_slot && atomic_fetch_add(&k->lim->open, 1) >= k->lim->max) {
		atomic_fetch_sub(&k->lim->open, 1); /* the context's limit: make room here */
		free_slot = NULL;
	}
	if (!free_slot && lru) {
		slot_close(k, lru); /* one out, one in */
		atomic_fetch_add(&k->lim->open, 1);
		free_slot = lru;
	}
	if (free_slot) {
		free_slot->unit1 = unit + 1;
		free_slot->epoch = ep;
		free_slot->fd = fd;
		free_slot->refs = 1;
		free_slot->used = ++k->tick;
		got = (int)(free_slot - k->s);
		CKPT_STAT_ADD(kept_files, 1);
	}
	pthread_mutex_unlock(&k->mu);
	return got;
}

void ckpt_kept_release(ckpt_kept *k, int slot)
{
	pthread_mutex_lock(&k->mu);
	struct kept_slot *s = &k->s[slot];
	enum kept_state st = kept_check(s);
	assert(st == KEPT_BUSY || st == KEPT_DRAINING);
	if (--s->refs == 0 && st == KEPT_DRAINING)
		slot_close(k, s);
	pthread_mutex_unlock(&k->mu);
}

void ckpt_kept_drop(ckpt_kept *k)
{
	pthread_mutex_lock(&k->mu);
	for (int i = 0; i < KEPT_UNITS; i++)
		slot_drop(k, &k->s[i]);
	pthread_mutex_unlock(&k->mu);
}
