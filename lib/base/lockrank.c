/*
 * lockrank.c - the lock-order checks of include/ckpt/lockrank.h: each
 * thread's held ranks, and each rank's ancestors in the table's tree.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "common.h"
#include "lockrank.h"

#define CKPT_RANK_BIT_(id) ((uint64_t)1 << CKPT_RANK_##id)
#define CKPT_RANK_ROW_(id, lock, what, parents) [CKPT_RANK_##id] = { lock, parents },

static const struct {
	const char *lock;
	uint64_t parents;
} ranks[CKPT_RANK_COUNT] = { CKPT_RANKS(CKPT_RANK_ROW_, CKPT_RANK_BIT_) };

_Static_assert(CKPT_RANK_COUNT <= 64, "ranks are bits of a uint64_t");

/* ancestors[r]: every rank on a path from a root down to r (r excluded) */
static uint64_t ancestors[CKPT_RANK_COUNT];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init(void)
{
	/* parents come first in the table, so one pass closes the relation */
	for (int r = 0; r < CKPT_RANK_COUNT; r++) {
		uint64_t a = ranks[r].parents;
		if (a >> r) { /* a parent listed after its child: the table is wrong */
			fprintf(stderr, "ckptfs: lock rank table: %s has a parent listed after it\n",
				ranks[r].lock);
			abort();
		}
		for (int p = 0; p < r; p++)
			if (ranks[r].parents & ((uint64_t)1 << p))
				a |= ancestors[p];
		ancestors[r] = a;
	}
}

const char *ckpt_rank_name(int rank)
{
	return rank >= 0 && rank < CKPT_RANK_COUNT ? ranks[rank].lock : "?";
}

/* The ranks this thread holds, in acquisition order (a rank may repeat only
 * where the table allows it, which it never does today). */
#define HELD_MAX 16
static _Thread_local int held[HELD_MAX];
static _Thread_local int nheld;

static void die(const char *what, int rank, int other, const char *file, int line)
{
	/* no ckpt_log: its sink may take locks; one line straight to stderr */
	fprintf(stderr, "ckptfs: lock order violated at %s:%d: %s %s%s%s\n", file, line, what,
		ckpt_rank_name(rank), other >= 0 ? " while holding " : "",
		other >= 0 ? ckpt_rank_name(other) : "");
	abort();
}

void ckpt_rank_acquire(int rank, const char *file, int line)
{
	pthread_once(&once, init);
	if (rank < 0 || rank >= CKPT_RANK_COUNT)
		die("taking an unranked lock", rank, -1, file, line);
	for (int i = 0; i < nheld; i++)
		if (!(ancestors[rank] & ((uint64_t)1 << held[i])))
			die("taking", rank, held[i], file, line);
	if (nheld == HELD_MAX)
		die("taking too many locks at once:", rank, held[nheld - 1], file, line);
	held[nheld++] = rank;
}

void ckpt_rank_release(int rank)
{
	for (int i = nheld - 1; i >= 0; i--)
		if (held[i] == rank) {
			for (int j = i; j + 1 < nheld; j++)
				held[j] = held[j + 1];
			nheld--;
			return;
		}
	die("releasing a lock not held:", rank, -1, "?", 0);
}

void ckpt_rank_assert_held(int rank, const char *file, int line)
{
	for (int i = 0; i < nheld; i++)
		if (held[i] == rank)
			return;
	die("expected to hold", rank, -1, file, line);
}

void ckpt_rank_assert_not_held(int rank, const char *file, int line)
{
	for (int i = 0; i < nheld; i++)
		if (held[i] == rank)
			die("expected not to hold", rank, -1, file, line);
}
