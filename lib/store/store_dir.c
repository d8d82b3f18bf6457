/*
 * store_dir.c - the folder store: key "a/b/c" is the file <root>/a/b/c.
 *
 * Safety (the contract is in store.h): every path below the root is
 * resolved with openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS), or, on a
 * kernel without openat2, one component at a time with O_NOFOLLOW, so no
 * symlink is followed and nothing outside the root is reached.  Files are
 * opened O_NONBLOCK and must be regular (fstat) before a byte is read, so
 * a FIFO or device can neither block nor be served.
 */
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common.h"
#include "store.h"
#include "store_int.h"
#include "stats.h"
#include "sysio.h"

typedef struct dir_store {
	struct ckpt_store base;
	int dirfd;
} dir_store;

static int have_openat2 = 1; /* cleared (relaxed) on ENOSYS */

/* Open `rel` below dirfd without following any symlink.  -errno; -ELOOP
 * means a symlink was met. */
static int open_walk(int dirfd, const char *rel, int flags)
{
	char comp[256];
	int cur = dirfd;
	const char *p = rel;
	for (;;) {
		const char *e = strchr(p, '/');
		size_t n = e ? (size_t)(e - p) : strlen(p);
		if (n >= sizeof(comp)) {
			if (cur != dirfd)
				close(cur);
			return -ENAMETOOLONG;
		}
		memcpy(comp, p, n);
		comp[n] = 0;
		int fd;
		if (e) {
			fd = openat(cur, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (fd < 0 && errno == ENOTDIR) {
				struct stat st;
				if (fstatat(cur, comp, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode))
					errno = ELOOP;
				else
					errno = ENOTDIR;
			}
		} else {
			fd = openat(cur, comp, flags | O_NOFOLLOW | O_CLOEXEC);
		}
		int err = errno;
		if (cur != dirfd)
			close(cur);
		if (fd < 0)
			return -err;
		if (!e)
			return fd;
		cur = fd;
		p = e + 1;
	}
}

static int safe_open(dir_store *d, const char *rel, int flags)
{
	if (!*rel)
		rel = ".";
	if (__atomic_load_n(&have_openat2, __ATOMIC_RELAXED)) {
		struct open_how how = { 0 };
		how.flags = (uint64_t)(flags | O_CLOEXEC);
		how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
		long fd = syscall(SYS_openat2, d->dirfd, rel, &how, sizeof(how));
		if (fd >= 0)
			return (int)fd;
		if (errno != ENOSYS)
			return errno == EAGAIN ? -EIO : -errno;
		__atomic_store_n(&have_openat2, 0, __ATOMIC_RELAXED);
	}
	if (strcmp(rel, ".") == 0) {
		int fd = openat(d->dirfd, ".", flags | O_CLOEXEC);
		return fd < 0 ? -errno : fd;
	}
	return open_walk(d->dirfd, rel, flags);
}

/* Map an open failure: absent -> -ENOENT; symlink -> -EIO (logged). */
static int open_err(dir_store *d, const char *key, int rc)
{
	if (rc == -ENOENT || rc == -ENOTDIR || rc == -ENAMETOOLONG)
		return -ENOENT;
	if (rc == -ELOOP || rc == -EXDEV) {
		ckpt_log(CKPT_LOG_ERR, "%s/%s: a symbolic link, not followed", d->base.root, key);
		return -EIO;
	}
	if (rc == -ENOMEM || rc == -EMFILE || rc == -ENFILE || rc == -EACCES || rc == -EPERM)
		return rc;
	ckpt_log(CKPT_LOG_ERR, "%s/%s: cannot open: %s", d->base.root, key, strerror(-rc));
	return -EIO;
}

static int64_t mtime_ns(const struct stat *st)
{
	return (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
}

/* Open a regular file for reading; its stat in *st. */
static int open_reg(dir_store *d, const char *key, struct stat *st)
{
	int fd = safe_open(d, key, O_RDONLY | O_NONBLOCK);
	if (fd < 0)
		return open_err(d, key, fd);
	CKPT_STAT_ADD(backing_opens, 1);
	if (fstat(fd, st) != 0) {
		int rc = -errno;
		close(fd);
		ckpt_log(CKPT_LOG_ERR, "%s/%s: fstat: %s", d->base.root, key, strerror(-rc));
		return -EIO;
	}
	if (S_ISDIR(st->st_mode)) {
		close(fd);
		return -ENOENT;
	}
	if (!S_ISREG(st->st_mode)) {
		close(fd);
		ckpt_log(CKPT_LOG_ERR, "%s/%s: not a regular file (mode 0%o), not read", d->base.root, key,
			 (unsigned)(st->st_mode & S_IFMT));
		return -EIO;
	}
	return fd;
}

static int dir_stat(ckpt_store *s, const char *key, struct ckpt_store_stat *out)
{
	dir_store *d = (dir_store *)s;
	int fd = safe_open(d, key, O_PATH);
	if (fd < 0)
		return open_err(d, key, fd);
	struct stat st;
	int rc = fstat(fd, &st) == 0 ? 0 : -errno;
	close(fd);
	if (rc) {
		ckpt_log(CKPT_LOG_ERR, "%s/%s: fstat: %s", s->root, key, strerror(-rc));
		return -EIO;
	}
	memset(out, 0, sizeof(*out));
	out->mtime_ns = mtime_ns(&st);
	if (S_ISDIR(st.st_mode)) {
		out->is_dir = 1;
		return 0;
	}
	if (!S_ISREG(st.st_mode)) {
		ckpt_log(CKPT_LOG_ERR, "%s/%s: not a regular file (mode 0%o)", s->root, key,
			 (unsigned)(st.st_mode & S_IFMT));
		return -EIO;
	}
	out->size = (uint64_t)st.st_size;
	return 0;
}

static int dir_size(ckpt_store *s, const char *key, uint64_t *size)
{
	struct ckpt_store_stat st = { 0 }; /* gcc -O2 cannot see that open_err() never returns 0 */
	int rc = dir_stat(s, key, &st);
	if (rc)
		return rc;
	if (st.is_dir)
		return -ENOENT;
	*size = st.size;
	return 0;
}

static void stat_out(const struct stat *st, struct ckpt_store_stat *out)
{
	memset(out, 0, sizeof(*out));
	out->size = (uint64_t)st->st_size;
	out->mtime_ns = mtime_ns(st);
}

static int dir_open_fd(ckpt_store *s, const char *key, struct ckpt_store_stat *out)
{
	struct stat st;
	int fd = open_reg((dir_store *)s, key, &st);
	if (fd >= 0)
		stat_out(&st, out);
	return fd;
}

int ckpt_store_fd_stat(int fd, struct ckpt_store_stat *out)
{
	struct stat st;
	if (fstat(fd, &st) != 0) {
		ckpt_log(CKPT_LOG_ERR, "fstat of an open stored file (descriptor %d): %s", fd,
			 strerror(errno));
		return -EIO;
	}
	stat_out(&st, out);
	return 0;
}

/* One open, one preadv (short only at the end of the value). */
static ssize_t dir_read(ckpt_store *s, const char *key, uint64_t off, size_t len, void *dst)
{
	struct ckpt_store_stat st;
	int fd = dir_open_fd(s, key, &st);
	if (fd < 0)
		return fd;
	struct iovec iov = { dst, len };
	ssize_t done = ckpt_preadv_all(fd, &iov, 1, off);
	if (done < 0)
		ckpt_log(CKPT_LOG_ERR, "%s/%s: read failed: %s", s->root, key, strerror((int)-done));
	close(fd);
	return done < 0 ? -EIO : done;
}

static int dir_listdir(ckpt_store *s, const char *dir, ckpt_store_dir_cb cb, void *ctx)
{
	dir_store *d = (dir_store *)s;
	int fd = safe_open(d, dir, O_RDONLY | O_DIRECTORY);
	if (fd < 0)
		return open_err(d, dir, fd);
	DIR *dp = fdopendir(fd);
	if (!dp) {
		close(fd);
		return -ENOMEM;
	}
	int rc = 0;
	struct dirent *de;
	while (rc == 0 && (de = readdir(dp))) {
		if (de->d_name[0] == '.' && (!de->d_name[1] || (de->d_name[1] == '.' && !de->d_name[2])))
			continue;
		if (de->d_type != DT_UNKNOWN && de->d_type != DT_DIR && de->d_type != DT_REG)
			continue;
		struct stat st;
		if (fstatat(dirfd(dp), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
			continue; /* vanished meanwhile */
		struct ckpt_store_stat cs = { 0, 0, 0 };
		cs.mtime_ns = mtime_ns(&st);
		if (S_ISDIR(st.st_mode))
			cs.is_dir = 1;
		else if (S_ISREG(st.st_mode))
			cs.size = (uint64_t)st.st_size;
		else
			continue; /* symlinks, FIFOs, sockets, devices: not reported */
		rc = cb(ctx, de->d_name, &cs);
	}
	closedir(dp);
	return rc;
}

/* Recursive walk below `path` (relative to root); `path` is a scratch buffer. */
static int walk(dir_store *d, char *path, size_t plen, size_t cap, const char *prefix, ckpt_store_list_cb cb,
		void *ctx, int depth)
{
	if (depth > 64)
		return 0;
	int fd = safe_open(d, plen ? path : "", O_RDONLY | O_DIRECTORY);
	if (fd < 0)
		return 0;
	DIR *dir = fdopendir(fd);
	if (!dir) {
		close(fd);
		return 0;
	}
	int rc = 0;
	size_t pl = strlen(prefix);
	struct dirent *de;
	while (rc == 0 && (de = readdir(dir))) {
		if (de->d_name[0] == '.' && (!de->d_name[1] || (de->d_name[1] == '.' && !de->d_name[2])))
			continue;
		size_t n = strlen(de->d_name);
		size_t need = plen + (plen ? 1 : 0) + n + 1;
		if (need > cap)
			continue;
		size_t np = plen;
		if (plen)
			path[np++] = '/';
		memcpy(path + np, de->d_name, n + 1);
		np += n;
		/* Prune subtrees that cannot match the prefix. */
		size_t cmp = np < pl ? np : pl;
		if (memcmp(path, prefix, cmp) == 0) {
			struct stat st;
			if (fstatat(dirfd(dir), de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
				if (S_ISDIR(st.st_mode))
					rc = walk(d, path, np, cap, prefix, cb, ctx, depth + 1);
				else if (S_ISREG(st.st_mode) && np >= pl)
					rc = cb(ctx, path, (uint64_t)st.st_size);
			}
		}
		path[plen] = 0;
	}
	closedir(dir);
	return rc;
}

static int dir_list(ckpt_store *s, const char *prefix, ckpt_store_list_cb cb, void *ctx)
{
	char path[4096];
	prefix = prefix ? prefix : "";
	/* Start in the prefix's folder: listing one array of a store with
	 * 10,000 array folders must not read the root 10,000 times. */
	const char *slash = strrchr(prefix, '/');
	size_t plen = slash ? (size_t)(slash - prefix) : 0;
	if (plen >= sizeof(path))
		return -ENAMETOOLONG;
	memcpy(path, prefix, plen);
	path[plen] = 0;
	return walk((dir_store *)s, path, plen, sizeof(path), prefix, cb, ctx, 0);
}

static void dir_destroy(ckpt_store *s)
{
	dir_store *d = (dir_store *)s;
	close(d->dirfd);
	free(s->root);
	free(d);
}

static const struct ckpt_store_ops ckpt_dir_ops = {
	.size = dir_size,
	.read = dir_read,
	.list = dir_list,
	.listdir = dir_listdir,
	.stat = dir_stat,
	.destroy = dir_destroy,
	.open_fd = dir_open_fd,
};

int ckpt_store_dir_open(const char *dir, ckpt_store **out)
{
	*out = NULL;
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	dir_store *d = calloc(1, sizeof(*d));
	if (!d) {
		close(fd);
		return -ENOMEM;
	}
	d->base.ops = &ckpt_dir_ops;
	d->base.root = strdup(dir);
	d->dirfd = fd;
	if (!d->base.root) {
		close(fd);
		free(d);
		return -ENOMEM;
	}
	size_t n = strlen(d->base.root);
	while (n > 1 && d->base.root[n - 1] == '/')
		d->base.root[--n] = 0;
	*out = &d->base;
	return 0;
}
