/*
 * test_lockrank.c - the lock-order checks (base/lockrank.c,
 * include/ckpt/lockrank.h): an acquisition out of the table's order, a
 * `*_locked` function without its lock, and a call that must run with no
 * view lock held while one is, each abort the (forked) process; the orders
 * the table allows do not.
 */
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "lockrank.h"

/* Run fn in a child; its wait status.  The child's stderr is kept (the
 * one-line report is what a developer sees). */
static int in_child(void (*fn)(void))
{
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0) {
		fn();
		_exit(0);
	}
	int st = 0;
	waitpid(pid, &st, 0);
	return st;
}

static int aborted(int st)
{
	return WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT;
}

static int exited_ok(int st)
{
	return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* the checks themselves, in any build */
static void wrong_order(void)
{
	ckpt_rank_acquire(CKPT_RANK_DYN, __FILE__, __LINE__); /* a leaf under ns_lock ... */
	ckpt_rank_acquire(CKPT_RANK_NS, __FILE__, __LINE__); /* ... then ns_lock: inverted */
}

static void sibling(void)
{
	ckpt_rank_acquire(CKPT_RANK_NS, __FILE__, __LINE__);
	ckpt_rank_acquire(CKPT_RANK_DYN, __FILE__, __LINE__); /* allowed: ns_lock -> dyn_lock */
	ckpt_rank_acquire(CKPT_RANK_ALLOC, __FILE__, __LINE__); /* siblings: not on one path */
}

static void twice(void)
{
	ckpt_rank_acquire(CKPT_RANK_NS, __FILE__, __LINE__);
	ckpt_rank_acquire(CKPT_RANK_NS, __FILE__, __LINE__); /* a second shared ns_lock can deadlock */
}

static void right_order(void)
{
	ckpt_rank_acquire(CKPT_RANK_SCAN, __FILE__, __LINE__);
	ckpt_rank_acquire(CKPT_RANK_NS, __FILE__, __LINE__);
	ckpt_rank_acquire(CKPT_RANK_IO, __FILE__, __LINE__);
	ckpt_rank_acquire(CKPT_RANK_PF, __FILE__, __LINE__);
	ckpt_rank_acquire(CKPT_RANK_W_DECL, __FILE__, __LINE__);
	ckpt_rank_acquire(CKPT_RANK_W_ARRAY, __FILE__, __LINE__);
	ckpt_rank_acquire(CKPT_RANK_W_STEP, __FILE__, __LINE__);
	ckpt_rank_assert_held(CKPT_RANK_W_ARRAY, __FILE__, __LINE__);
	ckpt_rank_release(CKPT_RANK_W_STEP);
	ckpt_rank_release(CKPT_RANK_W_ARRAY);
	ckpt_rank_release(CKPT_RANK_W_DECL);
	ckpt_rank_release(CKPT_RANK_PF);
	ckpt_rank_release(CKPT_RANK_IO);
	ckpt_rank_release(CKPT_RANK_NS);
	ckpt_rank_release(CKPT_RANK_SCAN);
	ckpt_rank_assert_not_held(CKPT_RANK_NS, __FILE__, __LINE__);
	ckpt_rank_acquire(CKPT_RANK_DYN, __FILE__, __LINE__); /* a root-level take of any lock */
	ckpt_rank_release(CKPT_RANK_DYN);
}

static void not_held(void)
{
	ckpt_rank_assert_held(CKPT_RANK_DYN, __FILE__, __LINE__);
}

static void held_but_must_not(void)
{
	ckpt_rank_acquire(CKPT_RANK_NS, __FILE__, __LINE__);
	ckpt_rank_assert_not_held(CKPT_RANK_NS, __FILE__, __LINE__);
}

static void test_checks(void)
{
	CHECK(aborted(in_child(wrong_order)));
	CHECK(aborted(in_child(sibling)));
	CHECK(aborted(in_child(twice)));
	CHECK(aborted(in_child(not_held)));
	CHECK(aborted(in_child(held_but_must_not)));
	CHECK(exited_ok(in_child(right_order)));
	CHECK(!strcmp(ckpt_rank_name(CKPT_RANK_NS), "v->ns_lock"));
}

/* the wrappers: checked without NDEBUG (Debug, ASan, TSan builds), plain
 * pthread calls with it */
static pthread_mutex_t m_dyn = PTHREAD_MUTEX_INITIALIZER;
static pthread_rwlock_t l_ns = PTHREAD_RWLOCK_INITIALIZER;

static void wrapped_wrong_order(void)
{
	ckpt_lock(&m_dyn, CKPT_RANK_DYN);
	ckpt_rdlock(&l_ns, CKPT_RANK_NS);
	ckpt_rwunlock(&l_ns, CKPT_RANK_NS);
	ckpt_unlock(&m_dyn, CKPT_RANK_DYN);
}

static void wrapped_right_order(void)
{
	ckpt_wrlock(&l_ns, CKPT_RANK_NS);
	ckpt_lock(&m_dyn, CKPT_RANK_DYN);
	ckpt_assert_held(CKPT_RANK_DYN);
	ckpt_unlock(&m_dyn, CKPT_RANK_DYN);
	ckpt_rwunlock(&l_ns, CKPT_RANK_NS);
	ckpt_assert_not_held(CKPT_RANK_NS);
}

static void test_wrappers(void)
{
	CHECK(exited_ok(in_child(wrapped_right_order)));
#ifdef NDEBUG
	CHECK(exited_ok(in_child(wrapped_wrong_order))); /* Release: no checks, no cost */
#else
	CHECK(aborted(in_child(wrapped_wrong_order)));
#endif
}

int main(void)
{
	CHECK_RUN(test_checks);
	CHECK_RUN(test_wrappers);
	return CHECK_DONE();
}
