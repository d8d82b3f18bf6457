/*
 * diskcache.c - the optional on-disk cache of object-store byte ranges
 * (-o cache_dir=, -o cache_dir_size=), kept across remounts.
 *
 * One file per fetched range: DIR/ab/<sha256 of "object URL \n ETag \n
 * first \n length">.  The ETag is part of the name, so a replaced object
 * never hits an old entry.  A file is a 16-byte header ("CKDC", CRC-32C of
 * the data, data length) and the data; an entry that does not check out is
 * deleted and counts as a miss.  Entries are written to a temporary name
 * and renamed, so concurrent daemons sharing the folder see whole entries.
 *
 * Size bound: the bytes held are counted at open (one scan) and on every
 * insert; past the bound the least recently used entries (file mtime,
 * touched on every hit) are deleted until 90% of it is held.
 *
 * Thread-safety: every call may run concurrently; c->mu guards the byte
 * count and serializes evictions.
 */
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "crc32c.h"
#include "sigv4.h"
#include "store_int.h"
#include "sysio.h"

#define HDR 16

struct ckpt_dcache {
	char *dir;
	uint64_t max;
	uint64_t used;
	pthread_mutex_t mu;
	unsigned long long seq;
};

static void entry_path(const struct ckpt_dcache *c, const char *id, const char *etag, uint64_t first,
		       uint64_t len, char *path, size_t cap, char *sub, size_t subcap)
{
	char *txt = NULL, hex[65];
	if (asprintf(&txt, "%s\n%s\n%llu\n%llu", id, etag, (unsigned long long)first,
		     (unsigned long long)len) < 0) {
		snprintf(path, cap, "%s/-", c->dir);
		return;
	}
	ckpt_sha256_hex(txt, strlen(txt), hex);
	free(txt);
	snprintf(sub, subcap, "%s/%.2s", c->dir, hex);
	snprintf(path, cap, "%s/%.2s/%s", c->dir, hex, hex + 2);
}

/* Bytes held by every entry below dir (sub-folders one level deep). */
typedef void (*entry_fn)(void *ctx, const char *path, const struct stat *st);

static void for_each_entry(const char *dir, entry_fn fn, void *ctx)
{
	DIR *d = opendir(dir);
	if (!d)
		return;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.' || strlen(e->d_name) != 2)
			continue;
		char sub[4096];
		snprintf(sub, sizeof(sub), "%s/%s", dir, e->d_name);
		DIR *s = opendir(sub);
		if (!s)
			continue;
		struct dirent *f;
		while ((f = readdir(s))) {
			if (f->d_name[0] == '.')
				continue;
			char p[4400];
			struct stat st;
			snprintf(p, sizeof(p), "%s/%s", sub, f->d_name);
			if (lstat(p, &st) == 0 && S_ISREG(st.st_mode))
				fn(ctx, p, &st);
		}
		closedir(s);
	}
	closedir(d);
}

static void count_fn(void *ctx, const char *path, const struct stat *st)
{
	(void)path;
	*(uint64_t *)ctx += (uint64_t)st->st_size;
}

int ckpt_dcache_open(const char *dir, uint64_t max, struct ckpt_dcache **out)
{
	*out = NULL;
	if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
		int e = errno;
		ckpt_log(CKPT_LOG_ERR, "cache_dir %s: %s", dir, strerror(e));
		return -e;
	}
	struct ckpt_dcache *c = calloc(1, sizeof(*c));
	if (!c || !(c->dir = strdup(dir))) {
		free(c);
		return -ENOMEM;
	}
	c->max = max ? max : (uint64_t)10 << 30;
	pthread_mutex_init(&c->mu, NULL);
	for_each_entry(dir, count_fn, &c->used);
	*out = c;
	return 0;
}

void ckpt_dcache_close(struct ckpt_dcache *c)
{
	if (!c)
		return;
	pthread_mutex_destroy(&c->mu);
	free(c->dir);
	free(c);
}

int ckpt_dcache_get(struct ckpt_dcache *c, const char *id, const char *etag, uint64_t first, uint64_t len,
		    void *dst)
{
	if (!c || !etag || !*etag)
		return -ENOENT;
	char path[4200], sub[4200];
	entry_path(c, id, etag, first, len, path, sizeof(path), sub, sizeof(sub));
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return -ENOENT;
	uint8_t h[HDR];
	struct stat st;
	int ok = fstat(fd, &st) == 0 && (uint64_t)st.st_size == HDR + len &&
		 ckpt_pread_all(fd, h, HDR, 0) == 0 && memcmp(h, "CKDC", 4) == 0 &&
		 ckpt_pread_all(fd, dst, (size_t)len, HDR) == 0;
	if (ok) {
		uint32_t crc;
		uint64_t n;
		memcpy(&crc, h + 4, 4);
		memcpy(&n, h + 8, 8);
		ok = n == len && ckpt_crc32c(0, dst, (size_t)len) == crc;
	}
	if (ok)
		futimens(fd, NULL); /* recently used */
	close(fd);
	if (!ok) {
		ckpt_log(CKPT_LOG_WARN, "cache_dir: entry %s is damaged, dropped", path);
		if (unlink(path) == 0) {
			pthread_mutex_lock(&c->mu);
			c->used -= (uint64_t)st.st_size < c->used ? (uint64_t)st.st_size : c->used;
			pthread_mutex_unlock(&c->mu);
		}
		return -ENOENT;
	}
	return 0;
}

struct old {
	char *path;
	int64_t mtime;
	uint64_t size;
};

struct olds {
	struct old *v;
	size_t n, cap;
};

static void old_fn(void *ctx, const char *path, const struct stat *st)
{
	struct olds *o = ctx;
	if (o->n == o->cap) {
		size_t n = o->cap ? 2 * o->cap : 256;
		struct old *v = realloc(o->v, n * sizeof(*v));
		if (!v)
			return;
		o->v = v;
		o->cap = n;
	}
	o->v[o->n].path = strdup(path);
	o->v[o->n].mtime = (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
	o->v[o->n].size = (uint64_t)st->st_size;
	if (o->v[o->n].path)
		o->n++;
}

static int old_cmp(const void *a, const void *b)
{
	const struct old *x = a, *y = b;
	return (x->mtime > y->mtime) - (x->mtime < y->mtime);
}

/* Delete least recently used entries down to 90% of the bound (c->mu held). */
static void evict_locked(struct ckpt_dcache *c)
{
	struct olds o = { 0 };
	for_each_entry(c->dir, old_fn, &o);
	qsort(o.v, o.n, sizeof(*o.v), old_cmp);
	uint64_t held = 0;
	for (size_t i = 0; i < o.n; i++)
		held += o.v[i].size;
	uint64_t goal = c->max / 10 * 9;
	for (size_t i = 0; i < o.n && held > goal; i++)
		if (unlink(o.v[i].path) == 0)
			held -= o.v[i].size;
	for (size_t i = 0; i < o.n; i++)
		free(o.v[i].path);
	free(o.v);
	c->used = held;
}

void ckpt_dcache_put(struct ckpt_dcache *c, const char *id, const char *etag, uint64_t first, uint64_t len,
		     const void *src)
{
	if (!c || !etag || !*etag || HDR + len > c->max / 2)
		return;
	char path[4200], sub[4200], tmp[4300];
	entry_path(c, id, etag, first, len, path, sizeof(path), sub, sizeof(sub));
	if (mkdir(sub, 0700) != 0 && errno != EEXIST)
		return;
	pthread_mutex_lock(&c->mu);
	unsigned long long seq = ++c->seq;
	pthread_mutex_unlock(&c->mu);
	snprintf(tmp, sizeof(tmp), "%s.tmp.%d.%llu", path, (int)getpid(), seq);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0)
		return;
	uint8_t h[HDR] = { 'C', 'K', 'D', 'C' };
	uint32_t crc = ckpt_crc32c(0, src, (size_t)len);
	memcpy(h + 4, &crc, 4);
	memcpy(h + 8, &len, 8);
	int ok = ckpt_pwrite_all(fd, h, HDR, 0) == 0 && ckpt_pwrite_all(fd, src, (size_t)len, HDR) == 0;
	close(fd);
	if (!ok || rename(tmp, path) != 0) {
		unlink(tmp);
		return;
	}
	pthread_mutex_lock(&c->mu);
	c->used += HDR + len;
	if (c->used > c->max)
		evict_locked(c);
	pthread_mutex_unlock(&c->mu);
}
