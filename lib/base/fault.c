/*
 * fault.c - SIGBUS from a vanished mapped page, turned into -EFAULT for the
 * thread that guards the page (fault.h).
 *
 * Each guarding thread publishes its range and a jump buffer in a
 * thread-local slot before calling fn and clears it after; the handler
 * runs on the faulting thread, so it reads only that thread's slot.  The
 * slot is written with compiler barriers around it (a signal on the same
 * thread is what reads it; no other thread ever does).
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>

#include "fault.h"

struct guard {
	sigjmp_buf jb;
	uintptr_t lo, hi;
};

static __thread struct guard *volatile cur_guard;
static struct sigaction prev_bus; /* the disposition before ours */
static pthread_once_t install_once = PTHREAD_ONCE_INIT;
static int installed; /* written once under install_once */

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
	struct guard *g = cur_guard;
	uintptr_t a = (uintptr_t)si->si_addr;
	if (g && a >= g->lo && a < g->hi) {
		cur_guard = NULL;
		siglongjmp(g->jb, 1);
	}
	/* Not a guarded touch: what would have happened without us. */
	if ((prev_bus.sa_flags & SA_SIGINFO) && prev_bus.sa_sigaction) {
		prev_bus.sa_sigaction(sig, si, uc);
		return;
	}
	if (prev_bus.sa_handler != SIG_DFL && prev_bus.sa_handler != SIG_IGN) {
		prev_bus.sa_handler(sig);
		return;
	}
	/* The default action: returning re-runs the faulting access, which
	 * now raises SIGBUS with no handler (a synchronous SIGBUS that is
	 * ignored kills the process all the same). */
	signal(SIGBUS, SIG_DFL);
}

static void install(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_sigbus;
	sa.sa_flags = SA_SIGINFO;
	sigemptyset(&sa.sa_mask);
	installed = sigaction(SIGBUS, &sa, &prev_bus) == 0;
}

int ckpt_fault_guard(const void *lo, size_t len, int (*fn)(void *), void *arg)
{
	pthread_once(&install_once, install);
	if (!installed)
		return -ENOTSUP;
	if (cur_guard) /* nested: the outer guard stays in charge */
		return fn(arg);
	struct guard g;
	g.lo = (uintptr_t)lo;
	g.hi = (uintptr_t)lo + len;
	if (sigsetjmp(g.jb, 1))
		return -EFAULT; /* the handler cleared cur_guard */
	cur_guard = &g;
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	int rc = fn(arg);
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	cur_guard = NULL;
	return rc;
}
