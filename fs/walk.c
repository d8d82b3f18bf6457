/*
 * walk.c - tree walks over the view API, shared by the daemon (statfs) and
 * the subcommands (info, verify).  Metadata only: nothing here reads array
 * data.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckfs.h"

int ckfs_walk(ckpt_view *v, ckpt_ino dir, const char *prefix, int depth, ckfs_walk_fn fn, void *ctx)
{
	if (depth > 256)
		return 0;
	for (uint64_t i = 0;; i++) {
		const char *name;
		ckpt_attr a;
		int rc = ckpt_view_readdir(v, dir, i, &name, &a);
		if (rc < 0)
			return rc;
		if (rc == 0)
			return 0;
		size_t len = strlen(prefix) + strlen(name) + 2;
		char *path = malloc(len);
		if (!path)
			return -ENOMEM;
		snprintf(path, len, "%s%s%s", prefix, *prefix ? "/" : "", name);
		rc = fn(ctx, path, depth, &a);
		if (rc == 0 && a.is_dir)
			rc = ckfs_walk(v, a.ino, path, depth + 1, fn, ctx);
		free(path);
		if (rc)
			return rc;
	}
}

int ckfs_resolve(ckpt_view *v, const char *path, ckpt_attr *out)
{
	int rc = ckpt_view_getattr(v, CKPT_ROOT_INO, out);
	char *copy = strdup(path);
	if (!copy)
		return -ENOMEM;
	char *save = NULL;
	for (char *c = strtok_r(copy, "/", &save); c && rc == 0; c = strtok_r(NULL, "/", &save)) {
		if (!strcmp(c, "."))
			continue;
		rc = ckpt_view_lookup(v, out->ino, c, out);
	}
	free(copy);
	return rc;
}

ssize_t ckfs_xattr(ckpt_view *v, ckpt_ino ino, const char *name, char *buf, size_t cap)
{
	ssize_t n = ckpt_view_getxattr(v, ino, name, buf, cap - 1);
	buf[n >= 0 ? (size_t)n : 0] = 0;
	return n;
}
