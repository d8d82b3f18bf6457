/*
 * store_dir.c - the folder store: key "a/b/c" is the file <root>/a/b/c.
 * Keys containing ".." components or starting with '/' are rejected so a
 * key can never leave the root.
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "store.h"

typedef struct dir_store {
	struct ckpt_store base;
	int dirfd;
} dir_store;

static int key_ok(const char *key)
{
	if (!key || !*key || key[0] == '/')
		return 0;
	for (const char *p = key; *p;) {
		const char *e = strchr(p, '/');
		size_t n = e ? (size_t)(e - p) : strlen(p);
		if (n == 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
			return 0;
		p += n;
		if (*p == '/')
			p++;
	}
	return 1;
}

static int dir_size(ckpt_store *s, const char *key, uint64_t *size)
{
	dir_store *d = (dir_store *)s;
	struct stat st;
	if (!key_ok(key))
		return -ENOENT;
	if (fstatat(d->dirfd, key, &st, 0) < 0)
		return errno == ENOENT || errno == ENOTDIR ? -ENOENT : -EIO;
	if (!S_ISREG(st.st_mode))
		return -ENOENT;
	*size = (uint64_t)st.st_size;
	return 0;
}

static ssize_t dir_read(ckpt_store *s, const char *key, uint64_t off, size_t len, void *dst)
{
	dir_store *d = (dir_store *)s;
	if (!key_ok(key))
		return -ENOENT;
	int fd = openat(d->dirfd, key, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT || errno == ENOTDIR ? -ENOENT : -EIO;
	size_t done = 0;
	while (done < len) {
		ssize_t n = pread(fd, (char *)dst + done, len - done, (off_t)(off + done));
		if (n < 0) {
			if (errno == EINTR)
				continue;
			ckpt_log(CKPT_LOG_ERR, "%s/%s: read failed: %s", s->root, key, strerror(errno));
			close(fd);
			return -EIO;
		}
		if (n == 0)
			break;
		done += (size_t)n;
	}
	close(fd);
	return (ssize_t)done;
}

/* Recursive walk below `rel` (relative to root); `path` is a scratch buffer. */
static int walk(dir_store *d, char *path, size_t plen, size_t cap, const char *prefix, ckpt_store_list_cb cb,
		void *ctx, int depth)
{
	if (depth > 64)
		return 0;
	/* A fresh open, not dup(): a dup shares the directory offset. */
	int fd = openat(d->dirfd, plen ? path : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	DIR *dir = fdopendir(fd);
	if (!dir) {
		close(fd);
		return 0;
	}
	int rc = 0;
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
		size_t pl = strlen(prefix);
		size_t cmp = np < pl ? np : pl;
		if (memcmp(path, prefix, cmp) == 0) {
			struct stat st;
			if (fstatat(d->dirfd, path, &st, AT_SYMLINK_NOFOLLOW) == 0) {
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
	path[0] = 0;
	return walk((dir_store *)s, path, 0, sizeof(path), prefix ? prefix : "", cb, ctx, 0);
}

static void dir_destroy(ckpt_store *s)
{
	dir_store *d = (dir_store *)s;
	close(d->dirfd);
	free(s->root);
	free(d);
}

static const struct ckpt_store_ops dir_ops = {
	.size = dir_size,
	.read = dir_read,
	.list = dir_list,
	.destroy = dir_destroy,
};

int ckpt_store_dir_open(const char *dir, ckpt_store **out)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	dir_store *d = calloc(1, sizeof(*d));
	if (!d) {
		close(fd);
		return -ENOMEM;
	}
	d->base.ops = &dir_ops;
	d->base.root = strdup(dir);
	d->dirfd = fd;
	if (!d->base.root) {
		close(fd);
		free(d);
		return -ENOMEM;
	}
	*out = &d->base;
	return 0;
}
