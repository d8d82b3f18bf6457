/*
 * sysio.h - small system I/O helpers every layer needs: whole-buffer
 * pread/pwrite, reading a small regular file whole, writing a file
 * durably, fsync of a folder, removing a folder tree, and clocks.
 *
 * Errors: negative errno (see common.h).  Nothing here logs: callers know
 * which file they meant and log once.  EINTR is retried inside.
 *
 * Thread-safety: every function is safe to call from any thread; they
 * share no state.  Functions taking a dirfd resolve a relative path
 * against it (AT_FDCWD = the current folder); an absolute path ignores it.
 */
#ifndef CKPT_SYSIO_H
#define CKPT_SYSIO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "support.h"

/* Read exactly len bytes at off.  0, -EIO when the file ends first, or
 * -errno. */
int ckpt_pread_all(int fd, void *buf, size_t len, uint64_t off);

/* Read into the n buffers of iov (n >= 1) at off, continuing after
 * short reads, until they are full or the file ends: the bytes read, or
 * -errno.  iov is not changed. */
ssize_t ckpt_preadv_all(int fd, const struct iovec *iov, int n, uint64_t off);

/* Write exactly len bytes at off.  0 or -errno (-EIO if the kernel
 * reports writing 0 bytes). */
int ckpt_pwrite_all(int fd, const void *buf, size_t len, uint64_t off);

/* Read the regular file dirfd/path whole into a malloc'd, NUL-terminated
 * buffer (*out, caller frees; *len excludes the NUL).  The last component
 * is not followed if it is a symlink and a FIFO does not block the call
 * (O_NOFOLLOW | O_NONBLOCK); anything but a regular file is -EIO.
 * -EFBIG when the file has more than max bytes; -ENOENT etc. from open. */
int ckpt_read_small_file(int dirfd, const char *path, size_t max, char **out, size_t *len);

/* Create or truncate path (mode 0644), write buf, fsync, close.  0 or
 * -errno; on failure the file may exist with partial content. */
int ckpt_write_file_sync(const char *path, const void *buf, size_t len);
int ckpt_write_file_sync_at(int dirfd, const char *path, const void *buf, size_t len);

/* fsync the folder at path (makes entries created or renamed in it
 * durable).  0 or -errno. */
int ckpt_fsync_dir(const char *path);
int ckpt_fsync_dir_at(int dirfd, const char *path);

/* ckpt_rmtree: public (ckpt/support.h). */
int ckpt_rmtree_at(int dirfd, const char *path);

/* CLOCK_MONOTONIC in nanoseconds: for durations, never for timestamps. */
uint64_t ckpt_now_ns(void);

/* CLOCK_REALTIME in nanoseconds since the Unix epoch: for timestamps that
 * are stored (e.g. _CHECKPOINT_METADATA). */
int64_t ckpt_wall_ns(void);

#endif
