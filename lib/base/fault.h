/*
 * fault.h - touching memory that may vanish under the reader: the pages of
 * a file mapping whose file is truncated while it is mapped.  The kernel
 * answers such a touch with SIGBUS, which would kill the process; inside
 * ckpt_fault_guard it makes the guarded call return -EFAULT instead.
 *
 * The first call installs a process-wide SIGBUS handler (once).  A SIGBUS
 * that is not a touch of the range a thread guards right now goes to the
 * disposition that was in place before (a handler is called; the default
 * ends the process as it would have), so the handler changes nothing for
 * faults anywhere else.  A SIGBUS handler the program installs later
 * replaces this one: guarded touches then get the program's handler (the
 * daemon installs none).
 *
 * Thread-safety: any number of threads may guard at once, each its own
 * range; guards do not nest on one thread (a nested call runs unguarded
 * for the outer range).
 */
#ifndef CKPT_FAULT_H
#define CKPT_FAULT_H

#include <stddef.h>

/* Run fn(arg) and return its result, or -EFAULT when fn touched
 * [lo, lo+len) and the page was gone (SIGBUS).  fn is then abandoned where it stood
 * (siglongjmp): it must not take locks, allocate, or leave state that the
 * caller cannot reset; everything it wrote is to be treated as garbage.
 * -ENOTSUP when the handler cannot be installed (the caller must then not
 * touch such memory at all). */
int ckpt_fault_guard(const void *lo, size_t len, int (*fn)(void *), void *arg);

#endif
