/* killat.so: an LD_PRELOAD shim for the kill-during-save test.  It counts
 * the process's calls of mkdir, fsync, rename and unlink (each libc entry
 * point of the kind: mkdirat, fdatasync, renameat, renameat2, unlinkat
 * count as their kind) over all threads, and sends the process SIGKILL on
 * entry to the chosen call, before it runs.  strace's injection counts
 * per thread, so a save whose calls TensorStore spreads over its thread
 * pool reached a point in one run and not in the next; one process-wide
 * counter reaches the same point every run.
 *
 *   KILLAT_CALL=rename KILLAT_N=3   kill on the 3rd rename
 *   KILLAT_CALL=rename KILLAT_DST=7 kill on the first rename onto a name
 *                                   whose last component is "7"
 *   KILLAT_LOG=FILE                 append "KIND PATH" per call (counting)
 *
 * Built by the test with the system compiler; not part of libckpt. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { K_MKDIR, K_FSYNC, K_RENAME, K_UNLINK, K_N };
static const char *const kind_name[K_N] = { "mkdir", "fsync", "rename", "unlink" };
static int counts[K_N];

static void on_call(int kind, const char *path)
{
	int n = __atomic_add_fetch(&counts[kind], 1, __ATOMIC_SEQ_CST);
	const char *log = getenv("KILLAT_LOG");
	if (log) {
		int fd = open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
		if (fd >= 0) {
			char line[4200];
			int len = snprintf(line, sizeof line, "%s %s\n", kind_name[kind], path ? path : "-");
			if (len > 0 && write(fd, line, (size_t)len) < 0)
				len = 0;
			close(fd);
		}
	}
	const char *call = getenv("KILLAT_CALL");
	if (!call || strcmp(call, kind_name[kind]) != 0)
		return;
	const char *dst = getenv("KILLAT_DST");
	const char *nth = getenv("KILLAT_N");
	int hit = 0;
	if (dst && path) {
		const char *base = strrchr(path, '/');
		hit = strcmp(base ? base + 1 : path, dst) == 0;
	} else if (nth) {
		hit = n == atoi(nth);
	}
	if (hit)
		kill(getpid(), SIGKILL);
}

#define NEXT(name) ((__typeof__(&name))dlsym(RTLD_NEXT, #name))

int mkdir(const char *p, mode_t m)
{
	on_call(K_MKDIR, p);
	return NEXT(mkdir)(p, m);
}
int mkdirat(int d, const char *p, mode_t m)
{
	on_call(K_MKDIR, p);
	return NEXT(mkdirat)(d, p, m);
}
int fsync(int fd)
{
	on_call(K_FSYNC, NULL);
	return NEXT(fsync)(fd);
}
int fdatasync(int fd)
{
	on_call(K_FSYNC, NULL);
	return NEXT(fdatasync)(fd);
}
int rename(const char *a, const char *b)
{
	on_call(K_RENAME, b);
	return NEXT(rename)(a, b);
}
int renameat(int da, const char *a, int db, const char *b)
{
	on_call(K_RENAME, b);
	return NEXT(renameat)(da, a, db, b);
}
int renameat2(int da, const char *a, int db, const char *b, unsigned f)
{
	on_call(K_RENAME, b);
	return NEXT(renameat2)(da, a, db, b, f);
}
int unlink(const char *p)
{
	on_call(K_UNLINK, p);
	return NEXT(unlink)(p);
}
int unlinkat(int d, const char *p, int f)
{
	on_call(K_UNLINK, p);
	return NEXT(unlinkat)(d, p, f);
}
