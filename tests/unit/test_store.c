/*
 * test_store.c - the store discovery API (listdir, stat, read_small, sub,
 * ocdbt_open_on) and the folder store's safety contract: no symlink is
 * followed, special files are -EIO without blocking.
 */
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "common.h"
#include "crc32c.h"
#include "store.h"
#include "store_int.h"
#include "upload.h"

#define FIX CKPT_FIXTURES

static char tmp[256];

static void put(const char *rel, const char *text)
{
	char p[512];
	snprintf(p, sizeof(p), "%s/%s", tmp, rel);
	FILE *f = fopen(p, "w");
	if (!f) {
		perror(p);
		exit(2);
	}
	fputs(text, f);
	fclose(f);
}

static void sh(const char *fmt, const char *arg)
{
	char cmd[1024];
	snprintf(cmd, sizeof(cmd), fmt, arg, arg, arg);
	if (system(cmd) != 0) {
		fprintf(stderr, "failed: %s\n", cmd);
		exit(2);
	}
}

struct seen {
	char names[16][64];
	int dirs[16];
	uint64_t sizes[16];
	int n;
};

static int seen_cb(void *ctx, const char *name, const struct ckpt_store_stat *st)
{
	struct seen *s = ctx;
	if (s->n < 16) {
		snprintf(s->names[s->n], 64, "%s", name);
		s->dirs[s->n] = st->is_dir;
		s->sizes[s->n] = st->size;
		s->n++;
	}
	return 0;
}

static int count_cb(void *ctx, const char *name, const struct ckpt_store_stat *st)
{
	(void)name;
	(void)st;
	((struct seen *)ctx)->n++;
	return 0;
}

static int find(const struct seen *s, const char *name)
{
	for (int i = 0; i < s->n; i++)
		if (strcmp(s->names[i], name) == 0)
			return i;
	return -1;
}

static void on_alarm(int sig)
{
	(void)sig;
	static const char m[] = "test_store: a store call blocked (FIFO?)\n";
	if (write(2, m, sizeof(m) - 1) < 0)
		_exit(3);
	_exit(3);
}

static void test_folder(void)
{
	/* root: a.txt, sub/b.bin, sub/deep/c, outside link, dir link, FIFO */
	put("a.txt", "hello");
	sh("mkdir -p %s/sub/deep", tmp);
	put("sub/b.bin", "0123456789");
	put("sub/deep/c", "c");
	char outside[300];
	snprintf(outside, sizeof(outside), "%s.secret", tmp);
	FILE *f = fopen(outside, "w");
	fputs("SECRET", f);
	fclose(f);
	char p[512];
	snprintf(p, sizeof(p), "%s/link_out", tmp);
	CHECK(symlink(outside, p) == 0);
	snprintf(p, sizeof(p), "%s/link_in", tmp);
	CHECK(symlink("a.txt", p) == 0);
	snprintf(p, sizeof(p), "%s/dirlink", tmp);
	CHECK(symlink("/etc", p) == 0);
	snprintf(p, sizeof(p), "%s/sub/up", tmp);
	CHECK(symlink("..", p) == 0);
	snprintf(p, sizeof(p), "%s/fifo", tmp);
	CHECK(mkfifo(p, 0600) == 0);
	snprintf(p, sizeof(p), "%s/manifest.ocdbt", tmp);
	CHECK(mkfifo(p, 0600) == 0);

	ckpt_store *s;
	CHECK_EQ_INT(ckpt_store_open_source(tmp, NULL, &s), 0);
	char buf[64];
	CHECK_EQ_INT(ckpt_store_read(s, "a.txt", 0, sizeof(buf), buf), 5);
	CHECK(memcmp(buf, "hello", 5) == 0);
	CHECK_EQ_INT(ckpt_store_read(s, "sub/b.bin", 3, 4, buf), 4);
	CHECK(memcmp(buf, "3456", 4) == 0);

	/* Symlinks: never followed, whatever they point at. */
	CHECK_EQ_INT(ckpt_store_read(s, "link_out", 0, sizeof(buf), buf), -EIO);
	CHECK_EQ_INT(ckpt_store_read(s, "link_in", 0, sizeof(buf), buf), -EIO);
	CHECK_EQ_INT(ckpt_store_read(s, "dirlink/hostname", 0, sizeof(buf), buf), -EIO);
	CHECK_EQ_INT(ckpt_store_read(s, "sub/up/a.txt", 0, sizeof(buf), buf), -EIO);
	uint64_t size = 0;
	CHECK_EQ_INT(ckpt_store_size(s, "link_out", &size), -EIO);
	struct ckpt_store_stat st;
	CHECK_EQ_INT(ckpt_store_stat(s, "dirlink", &st), -EIO);
	struct seen ls = { 0 };
	CHECK_EQ_INT(ckpt_store_listdir(s, "dirlink", seen_cb, &ls), -EIO);
	CHECK_EQ_INT(ls.n, 0);

	/* FIFOs: -EIO at once, never a blocking open. */
	alarm(10);
	CHECK_EQ_INT(ckpt_store_read(s, "fifo", 0, sizeof(buf), buf), -EIO);
	CHECK_EQ_INT(ckpt_store_size(s, "fifo", &size), -EIO);
	char *txt = NULL;
	size_t len = 0;
	CHECK_EQ_INT(ckpt_store_read_small(s, "fifo", 100, &txt, &len), -EIO);
	ckpt_store *o = NULL;
	CHECK_EQ_INT(ckpt_store_ocdbt_open_on(s, "", &o), -EIO);
	CHECK(o == NULL);
	alarm(0);

	/* Keys that could leave the root are simply absent. */
	CHECK_EQ_INT(ckpt_store_read(s, "../x", 0, 1, buf), -ENOENT);
	CHECK_EQ_INT(ckpt_store_read(s, "/etc/passwd", 0, 1, buf), -ENOENT);
	CHECK_EQ_INT(ckpt_store_stat(s, "sub/../a.txt", &st), -ENOENT);
	CHECK_EQ_INT(ckpt_store_stat(s, "nope", &st), -ENOENT);
	CHECK_EQ_INT(ckpt_store_size(s, "sub", &size), -ENOENT);

	/* stat */
	CHECK_EQ_INT(ckpt_store_stat(s, "", &st), 0);
	CHECK_EQ_INT(st.is_dir, 1);
	CHECK_EQ_INT(ckpt_store_stat(s, "sub/deep", &st), 0);
	CHECK_EQ_INT(st.is_dir, 1);
	CHECK_EQ_INT(ckpt_store_stat(s, "sub/b.bin", &st), 0);
	CHECK_EQ_INT(st.is_dir, 0);
	CHECK_EQ_INT(st.size, 10);
	CHECK(st.mtime_ns > 0);

	/* listdir: regular files and folders only. */
	CHECK_EQ_INT(ckpt_store_listdir(s, "", seen_cb, &ls), 0);
	CHECK_EQ_INT(ls.n, 2);
	CHECK(find(&ls, "a.txt") >= 0 && ls.sizes[find(&ls, "a.txt")] == 5);
	CHECK(find(&ls, "sub") >= 0 && ls.dirs[find(&ls, "sub")] == 1);
	memset(&ls, 0, sizeof(ls));
	CHECK_EQ_INT(ckpt_store_listdir(s, "sub", seen_cb, &ls), 0);
	CHECK_EQ_INT(ls.n, 2);
	CHECK(find(&ls, "b.bin") >= 0 && find(&ls, "deep") >= 0);
	CHECK_EQ_INT(ckpt_store_listdir(s, "a.txt", seen_cb, &ls), -ENOENT);
	CHECK_EQ_INT(ckpt_store_listdir(s, "missing", seen_cb, &ls), -ENOENT);

	/* read_small */
	CHECK_EQ_INT(ckpt_store_read_small(s, "sub/b.bin", 100, &txt, &len), 0);
	CHECK_EQ_INT(len, 10);
	CHECK(txt && strcmp(txt, "0123456789") == 0);
	free(txt);
	CHECK_EQ_INT(ckpt_store_read_small(s, "sub/b.bin", 9, &txt, &len), -EFBIG);
	CHECK_EQ_INT(ckpt_store_read_small(s, "nope", 9, &txt, &len), -ENOENT);

	/* sub: outlives the parent's handle, sees keys below the prefix. */
	ckpt_store *u;
	CHECK_EQ_INT(ckpt_store_sub(s, "sub", &u), 0);
	CHECK_EQ_INT(ckpt_store_sub(s, "../x", &o), -EINVAL);
	ckpt_store_destroy(s);
	CHECK_EQ_INT(ckpt_store_read(u, "b.bin", 0, 2, buf), 2);
	CHECK(memcmp(buf, "01", 2) == 0);
	CHECK_EQ_INT(ckpt_store_read(u, "deep/c", 0, 2, buf), 1);
	CHECK_EQ_INT(ckpt_store_read(u, "up/a.txt", 0, 2, buf), -EIO);
	CHECK_EQ_INT(ckpt_store_read(u, "../a.txt", 0, 2, buf), -ENOENT);
	memset(&ls, 0, sizeof(ls));
	CHECK_EQ_INT(ckpt_store_listdir(u, "", seen_cb, &ls), 0);
	CHECK_EQ_INT(ls.n, 2);
	CHECK_EQ_INT(ckpt_store_stat(u, "deep", &st), 0);
	CHECK_EQ_INT(st.is_dir, 1);
	ckpt_store *uu;
	CHECK_EQ_INT(ckpt_store_sub(u, "deep", &uu), 0);
	CHECK_EQ_INT(ckpt_store_read(uu, "c", 0, 2, buf), 1);
	CHECK(strstr(uu->root, "/sub/deep") != NULL);
	ckpt_store_destroy(u);
	CHECK_EQ_INT(ckpt_store_read(uu, "c", 0, 2, buf), 1);
	ckpt_store_destroy(uu);
	unlink(outside);
}

struct keys {
	char *all;
	size_t len;
	uint64_t sum;
	int n;
};

static int key_cb(void *ctx, const char *key, uint64_t size)
{
	struct keys *k = ctx;
	size_t n = strlen(key);
	k->all = realloc(k->all, k->len + n + 2);
	memcpy(k->all + k->len, key, n);
	k->all[k->len + n] = '\n';
	k->len += n + 1;
	k->all[k->len] = 0;
	k->sum += size;
	k->n++;
	return 0;
}

/* open_fd: a folder's (and its sub-stores') values opened for pieces read
 * at any offset, with the identity of what was opened; stores that cannot
 * read as cheaply as they copy do not offer it. */
static void test_open_fd(void)
{
	sh("mkdir -p %s/rv", tmp);
	put("rv/v.bin", "0123456789abcdef");
	ckpt_store *s, *sub, *mem;
	CHECK_EQ_INT(ckpt_store_dir_open(tmp, &s), 0);
	CHECK(ckpt_store_has_open_fd(s));
	char a[3], b[1], c[5];
	struct iovec iov[3] = { { a, sizeof(a) }, { b, sizeof(b) }, { c, sizeof(c) } };
	struct ckpt_store_stat st;
	int fd0 = ckpt_store_open_fd(s, "rv/v.bin", &st);
	CHECK(fd0 >= 0);
	CHECK_EQ_INT(ckpt_store_fd_readv(fd0, 2, iov, 3), 9);
	CHECK(memcmp(a, "234", 3) == 0 && b[0] == '5' && memcmp(c, "6789a", 5) == 0);
	struct ckpt_store_stat want;
	CHECK_EQ_INT(ckpt_store_stat(s, "rv/v.bin", &want), 0);
	CHECK(st.size == 16 && st.mtime_ns == want.mtime_ns && !st.is_dir);
	/* short only at the end of the value */
	memset(c, 0, sizeof(c));
	CHECK_EQ_INT(ckpt_store_fd_readv(fd0, 8, iov, 3), 8);
	CHECK(memcmp(a, "89a", 3) == 0 && b[0] == 'b' && memcmp(c, "cdef", 4) == 0);
	close(fd0);
	CHECK_EQ_INT(ckpt_store_sub(s, "rv", &sub), 0);
	CHECK(ckpt_store_has_open_fd(sub));
	/* open_fd: a descriptor for reads at any offset, its identity now */
	int fd = ckpt_store_open_fd(sub, "v.bin", &st);
	CHECK(fd >= 0 && st.size == 16 && st.mtime_ns == want.mtime_ns);
	CHECK_EQ_INT(ckpt_store_fd_readv(fd, 13, iov, 3), 3);
	CHECK(memcmp(a, "def", 3) == 0);
	CHECK_EQ_INT(ckpt_store_fd_readv(fd, 16, iov, 3), 0);
	put("rv/v.bin", "0123456789abcdefgh"); /* written in place (fopen "w"): the same file */
	struct ckpt_store_stat now;
	CHECK_EQ_INT(ckpt_store_fd_stat(fd, &now), 0);
	CHECK(now.size == 18);
	close(fd);
	CHECK_EQ_INT(ckpt_store_open_fd(s, "rv/none", &st), -ENOENT);
	CHECK_EQ_INT(ckpt_store_open_fd(s, "../rv/v.bin", &st), -ENOENT);
	CHECK_EQ_INT(ckpt_store_open_fd(s, "rv", &st), -ENOENT); /* a folder */
	CHECK_EQ_INT(ckpt_store_mem_open(NULL, &mem), 0);
	CHECK_EQ_INT(ckpt_store_mem_put(mem, "k", "xyz", 3), 0);
	CHECK(!ckpt_store_has_open_fd(mem));
	CHECK_EQ_INT(ckpt_store_open_fd(mem, "k", &st), -ENOTSUP);
	ckpt_store *msub;
	CHECK_EQ_INT(ckpt_store_mem_put(mem, "d/k", "xyz", 3), 0);
	CHECK_EQ_INT(ckpt_store_sub(mem, "d", &msub), 0);
	CHECK(!ckpt_store_has_open_fd(msub)); /* a view offers what its parent does */
	CHECK_EQ_INT(ckpt_store_open_fd(msub, "k", &st), -ENOTSUP);
	ckpt_store_destroy(msub);
	ckpt_store_destroy(mem);
	ckpt_store_destroy(sub);
	ckpt_store_destroy(s);
}

static void test_ocdbt_on(void)
{
	const char *items[] = { "std_ocdbt_zarr3", "v1_pytree/state", "v1_checkpointables/params" };
	ckpt_store *root;
	CHECK_EQ_INT(ckpt_store_dir_open(FIX, &root), 0);
	for (size_t i = 0; i < sizeof(items) / sizeof(items[0]); i++) {
		char dir[512];
		snprintf(dir, sizeof(dir), "%s/%s", FIX, items[i]);
		ckpt_store *a, *b;
		CHECK_EQ_INT(ckpt_store_ocdbt_open(dir, &a), 0);
		CHECK_EQ_INT(ckpt_store_ocdbt_open_on(root, items[i], &b), 0);
		struct keys ka = { 0 }, kb = { 0 };
		CHECK_EQ_INT(ckpt_store_list(a, "", key_cb, &ka), 0);
		CHECK_EQ_INT(ckpt_store_list(b, "", key_cb, &kb), 0);
		CHECK(ka.n > 0 && ka.n == kb.n && ka.sum == kb.sum);
		CHECK(ka.all && kb.all && strcmp(ka.all, kb.all) == 0);
		/* every value byte-exact through both */
		for (char *k = ka.all; k && *k;) {
			char *nl = strchr(k, '\n');
			*nl = 0;
			char *va = NULL, *vb = NULL;
			size_t la = 0, lb = 0;
			CHECK_EQ_INT(ckpt_store_read_small(a, k, 1 << 26, &va, &la), 0);
			CHECK_EQ_INT(ckpt_store_read_small(b, k, 1 << 26, &vb, &lb), 0);
			CHECK(la == lb && va && vb && memcmp(va, vb, la) == 0);
			free(va);
			free(vb);
			k = nl + 1;
		}
		/* folders of an OCDBT store are key prefixes */
		struct seen ls = { 0 };
		CHECK_EQ_INT(ckpt_store_listdir(b, "", seen_cb, &ls), 0);
		CHECK(ls.n > 0);
		for (int j = 0; j < ls.n; j++) {
			struct ckpt_store_stat st;
			CHECK_EQ_INT(ckpt_store_stat(b, ls.names[j], &st), 0);
			CHECK_EQ_INT(st.is_dir, ls.dirs[j]);
		}
		struct ckpt_store_stat st;
		CHECK_EQ_INT(ckpt_store_stat(b, "no/such/key", &st), -ENOENT);
		CHECK_EQ_INT(ckpt_store_stat(b, "", &st), 0);
		CHECK_EQ_INT(st.is_dir, 1);
		free(ka.all);
		free(kb.all);
		ckpt_store_destroy(a);
		ckpt_store_destroy(b);
	}
	ckpt_store *none;
	CHECK_EQ_INT(ckpt_store_ocdbt_open_on(root, "pytree_zarr3", &none), -ENOENT);
	ckpt_store_destroy(root);
}

/* ---------------------------------------------------------------- memory store */

struct copy_ctx {
	ckpt_store *from, *to;
	char dir[512];
	int files;
};

/* Copy every file below folder c->dir of c->from into c->to under the same key. */
static int copy_cb(void *ctx, const char *name, const struct ckpt_store_stat *st)
{
	struct copy_ctx *c = ctx;
	char key[sizeof(c->dir)];
	if ((size_t)snprintf(key, sizeof(key), "%s%s%s", c->dir, *c->dir ? "/" : "", name) >= sizeof(key))
		return -ENAMETOOLONG;
	if (st->is_dir) {
		struct copy_ctx sub = *c;
		memcpy(sub.dir, key, sizeof(key));
		int rc = ckpt_store_listdir(c->from, key, copy_cb, &sub);
		c->files = sub.files;
		return rc;
	}
	char *buf = NULL;
	size_t len = 0;
	int rc = ckpt_store_read_small(c->from, key, 1 << 26, &buf, &len);
	if (rc == 0)
		rc = ckpt_store_mem_put(c->to, key, buf, len);
	free(buf);
	c->files++;
	return rc;
}

static void test_mem(void)
{
	ckpt_store *m;
	CHECK_EQ_INT(ckpt_store_mem_open("mem:test", &m), 0);
	CHECK(strcmp(m->root, "mem:test") == 0);
	CHECK_EQ_INT(ckpt_store_mem_put(m, "b/c/d", "dddd", 4), 0);
	CHECK_EQ_INT(ckpt_store_mem_put(m, "a", "A", 1), 0);
	CHECK_EQ_INT(ckpt_store_mem_put(m, "b/e", "", 0), 0);
	CHECK_EQ_INT(ckpt_store_mem_put(m, "b.x", "xx", 2), 0);
	CHECK_EQ_INT(ckpt_store_mem_put(m, "a", "AA", 2), 0); /* replaces */
	/* malformed keys are refused, not stored */
	CHECK_EQ_INT(ckpt_store_mem_put(m, "", "z", 1), -EINVAL);
	CHECK_EQ_INT(ckpt_store_mem_put(m, "/a", "z", 1), -EINVAL);
	CHECK_EQ_INT(ckpt_store_mem_put(m, "b//c", "z", 1), -EINVAL);
	CHECK_EQ_INT(ckpt_store_mem_put(m, "b/../a", "z", 1), -EINVAL);
	CHECK_EQ_INT(ckpt_store_mem_put(m, "b/", "z", 1), -EINVAL);
	uint64_t size = 99;
	CHECK_EQ_INT(ckpt_store_size(m, "a", &size), 0);
	CHECK_EQ_INT(size, 2);
	CHECK_EQ_INT(ckpt_store_size(m, "b/e", &size), 0);
	CHECK_EQ_INT(size, 0);
	CHECK_EQ_INT(ckpt_store_size(m, "b", &size), -ENOENT); /* a folder */
	CHECK_EQ_INT(ckpt_store_size(m, "nope", &size), -ENOENT);
	char buf[8] = { 0 };
	CHECK_EQ_INT(ckpt_store_read(m, "b/c/d", 1, 8, buf), 3);
	CHECK(memcmp(buf, "ddd", 3) == 0);
	CHECK_EQ_INT(ckpt_store_read(m, "b/c/d", 4, 8, buf), 0);
	CHECK_EQ_INT(ckpt_store_read(m, "b/c/d", 1000, 8, buf), 0);
	CHECK_EQ_INT(ckpt_store_read(m, "b/c", 0, 8, buf), -ENOENT);
	/* list: byte order, by prefix */
	struct keys k = { 0 };
	CHECK_EQ_INT(ckpt_store_list(m, "", key_cb, &k), 0);
	CHECK(k.all && strcmp(k.all, "a\nb.x\nb/c/d\nb/e\n") == 0);
	CHECK_EQ_INT(k.sum, 8);
	free(k.all);
	k = (struct keys){ 0 };
	CHECK_EQ_INT(ckpt_store_list(m, "b/", key_cb, &k), 0);
	CHECK(k.all && strcmp(k.all, "b/c/d\nb/e\n") == 0);
	free(k.all);
	/* listdir / stat: folders are key prefixes */
	struct seen ls = { 0 };
	CHECK_EQ_INT(ckpt_store_listdir(m, "", seen_cb, &ls), 0);
	CHECK_EQ_INT(ls.n, 3);
	int i = find(&ls, "b");
	CHECK(i >= 0 && ls.dirs[i] == 1);
	i = find(&ls, "a");
	CHECK(i >= 0 && ls.dirs[i] == 0 && ls.sizes[i] == 2);
	CHECK(find(&ls, "b.x") >= 0);
	ls = (struct seen){ 0 };
	CHECK_EQ_INT(ckpt_store_listdir(m, "b", seen_cb, &ls), 0);
	CHECK_EQ_INT(ls.n, 2);
	CHECK(find(&ls, "c") >= 0 && ls.dirs[find(&ls, "c")] == 1);
	CHECK_EQ_INT(ckpt_store_listdir(m, "zz", seen_cb, &ls), -ENOENT);
	CHECK_EQ_INT(ckpt_store_listdir(m, "a", seen_cb, &ls), -ENOENT); /* a file */
	struct ckpt_store_stat st;
	CHECK_EQ_INT(ckpt_store_stat(m, "", &st), 0);
	CHECK_EQ_INT(st.is_dir, 1);
	CHECK_EQ_INT(ckpt_store_stat(m, "b/c", &st), 0);
	CHECK_EQ_INT(st.is_dir, 1);
	CHECK_EQ_INT(ckpt_store_stat(m, "b/c/d", &st), 0);
	CHECK(st.is_dir == 0 && st.size == 4);
	CHECK_EQ_INT(ckpt_store_stat(m, "b/c/", &st), -ENOENT);
	CHECK_EQ_INT(ckpt_store_stat(m, "b/cc", &st), -ENOENT);
	/* read_small, and a sub-store over the memory store */
	char *txt = NULL;
	size_t len = 0;
	CHECK_EQ_INT(ckpt_store_read_small(m, "b/c/d", 16, &txt, &len), 0);
	CHECK(len == 4 && txt && strcmp(txt, "dddd") == 0);
	free(txt);
	CHECK_EQ_INT(ckpt_store_read_small(m, "b/c/d", 3, &txt, &len), -EFBIG);
	ckpt_store *sub;
	CHECK_EQ_INT(ckpt_store_sub(m, "b", &sub), 0);
	ckpt_store_destroy(m); /* the sub-store holds the memory store */
	CHECK_EQ_INT(ckpt_store_read_small(sub, "c/d", 16, &txt, &len), 0);
	CHECK(len == 4 && txt && strcmp(txt, "dddd") == 0);
	free(txt);
	CHECK_EQ_INT(ckpt_store_stat(sub, "c", &st), 0);
	CHECK_EQ_INT(st.is_dir, 1);
	CHECK_EQ_INT(ckpt_store_mem_put(sub, "q", "q", 1), -EINVAL); /* not a memory store */
	ckpt_store_destroy(sub);

	/* an OCDBT item copied into memory reads exactly as from its folder */
	ckpt_store *root, *mem, *a, *b;
	CHECK_EQ_INT(ckpt_store_dir_open(FIX "/std_ocdbt_zarr3", &root), 0);
	CHECK_EQ_INT(ckpt_store_mem_open(NULL, &mem), 0);
	struct copy_ctx c = { root, mem, "", 0 };
	CHECK_EQ_INT(ckpt_store_listdir(root, "", copy_cb, &c), 0);
	CHECK(c.files > 3);
	CHECK_EQ_INT(ckpt_store_ocdbt_open_on(root, "", &a), 0);
	CHECK_EQ_INT(ckpt_store_ocdbt_open_on(mem, "", &b), 0);
	struct keys ka = { 0 }, kb = { 0 };
	CHECK_EQ_INT(ckpt_store_list(a, "", key_cb, &ka), 0);
	CHECK_EQ_INT(ckpt_store_list(b, "", key_cb, &kb), 0);
	CHECK(ka.n > 0 && ka.n == kb.n && ka.sum == kb.sum && ka.all && kb.all && !strcmp(ka.all, kb.all));
	for (char *key = ka.all; key && *key;) {
		char *nl = strchr(key, '\n');
		*nl = 0;
		char *va = NULL, *vb = NULL;
		size_t la = 0, lb = 0;
		CHECK_EQ_INT(ckpt_store_read_small(a, key, 1 << 26, &va, &la), 0);
		CHECK_EQ_INT(ckpt_store_read_small(b, key, 1 << 26, &vb, &lb), 0);
		CHECK(la == lb && va && vb && memcmp(va, vb, la) == 0);
		free(va);
		free(vb);
		key = nl + 1;
	}
	free(ka.all);
	free(kb.all);
	ckpt_store_destroy(a);
	ckpt_store_destroy(b);
	ckpt_store_destroy(mem);
	ckpt_store_destroy(root);
}

/* Byte ranges of another store's file and whole folders of another store
 * (the virtual items of foreign formats, foreign/foreign.h). */
static void test_mem_ranges(void)
{
	ckpt_store *base, *m;
	CHECK_EQ_INT(ckpt_store_mem_open("mem:base", &base), 0);
	CHECK_EQ_INT(ckpt_store_mem_put(base, "file", "0123456789", 10), 0);
	CHECK_EQ_INT(ckpt_store_mem_put(base, "arr/.zarray", "{}", 2), 0);
	CHECK_EQ_INT(ckpt_store_mem_put(base, "arr/0.0", "CHUNK", 5), 0);
	CHECK_EQ_INT(ckpt_store_mem_put(base, "arr/sub/x", "X", 1), 0);
	CHECK_EQ_INT(ckpt_store_mem_open("mem:virt", &m), 0);
	CHECK_EQ_INT(ckpt_store_mem_put_range(m, "v/r", base, "file", 3, 4), 0);
	CHECK_EQ_INT(ckpt_store_mem_put_range(m, "v/long", base, "file", 8, 5), 0); /* past the end */
	CHECK_EQ_INT(ckpt_store_mem_put_range(m, "v/bad", m, "file", 0, 1), -EINVAL); /* itself */
	CHECK_EQ_INT(ckpt_store_mem_put_range(m, "v/of", base, "file", UINT64_MAX, 2), -EINVAL);
	CHECK_EQ_INT(ckpt_store_mem_put_folder(m, "z/a", base, "arr"), 0);
	CHECK_EQ_INT(ckpt_store_mem_put(m, "z/b", "lit", 3), 0);
	ckpt_store_destroy(base); /* m holds it */
	uint64_t size;
	char buf[16] = { 0 };
	CHECK_EQ_INT(ckpt_store_size(m, "v/r", &size), 0);
	CHECK_EQ_INT(size, 4);
	CHECK_EQ_INT(ckpt_store_read(m, "v/r", 0, 16, buf), 4);
	CHECK(memcmp(buf, "3456", 4) == 0);
	CHECK_EQ_INT(ckpt_store_read(m, "v/r", 2, 1, buf), 1);
	CHECK(buf[0] == '5');
	CHECK_EQ_INT(ckpt_store_read(m, "v/r", 4, 1, buf), 0);
	CHECK_EQ_INT(ckpt_store_read(m, "v/long", 0, 16, buf), -EIO); /* the file is shorter */
	/* the mounted folder */
	CHECK_EQ_INT(ckpt_store_size(m, "z/a/0.0", &size), 0);
	CHECK_EQ_INT(size, 5);
	CHECK_EQ_INT(ckpt_store_read(m, "z/a/0.0", 1, 16, buf), 4);
	CHECK(memcmp(buf, "HUNK", 4) == 0);
	CHECK_EQ_INT(ckpt_store_size(m, "z/a/nope", &size), -ENOENT);
	CHECK_EQ_INT(ckpt_store_size(m, "z/a", &size), -ENOENT); /* a folder */
	struct ckpt_store_stat st;
	CHECK_EQ_INT(ckpt_store_stat(m, "z/a", &st), 0);
	CHECK_EQ_INT(st.is_dir, 1);
	CHECK_EQ_INT(ckpt_store_stat(m, "z/a/sub", &st), 0);
	CHECK_EQ_INT(st.is_dir, 1);
	CHECK_EQ_INT(ckpt_store_stat(m, "z/a/.zarray", &st), 0);
	CHECK(st.is_dir == 0 && st.size == 2);
	CHECK_EQ_INT(ckpt_store_stat(m, "v", &st), 0);
	CHECK_EQ_INT(st.is_dir, 1);
	struct keys k = { 0 };
	CHECK_EQ_INT(ckpt_store_list(m, "z/a/", key_cb, &k), 0);
	CHECK(k.all && strstr(k.all, "z/a/0.0\n") && strstr(k.all, "z/a/.zarray\n") &&
	      strstr(k.all, "z/a/sub/x\n"));
	free(k.all);
	k = (struct keys){ 0 };
	CHECK_EQ_INT(ckpt_store_list(m, "z/", key_cb, &k), 0);
	CHECK(k.all && strstr(k.all, "z/a/0.0\n") && strstr(k.all, "z/b\n") && !strstr(k.all, "v/"));
	free(k.all);
	k = (struct keys){ 0 };
	CHECK_EQ_INT(ckpt_store_list(m, "z/a/s", key_cb, &k), 0);
	CHECK(k.all && strcmp(k.all, "z/a/sub/x\n") == 0);
	free(k.all);
	struct seen ls = { 0 };
	CHECK_EQ_INT(ckpt_store_listdir(m, "z", seen_cb, &ls), 0);
	CHECK_EQ_INT(ls.n, 2);
	CHECK(find(&ls, "a") >= 0 && ls.dirs[find(&ls, "a")] == 1);
	CHECK(find(&ls, "b") >= 0 && ls.dirs[find(&ls, "b")] == 0);
	ls = (struct seen){ 0 };
	CHECK_EQ_INT(ckpt_store_listdir(m, "z/a", seen_cb, &ls), 0);
	CHECK_EQ_INT(ls.n, 3);
	CHECK(find(&ls, "sub") >= 0 && ls.dirs[find(&ls, "sub")] == 1);
	ls = (struct seen){ 0 };
	CHECK_EQ_INT(ckpt_store_listdir(m, "", seen_cb, &ls), 0);
	CHECK_EQ_INT(ls.n, 2);
	ckpt_store_destroy(m);
}

/* ---------------------------------------------------------------- malformed keys */

/* A tiny OCDBT database (one leaf of inline values, raw envelopes) put
 * into a memory store as manifest.ocdbt and d/x: OCDBT keys are any bytes,
 * so a hostile database can hold keys that are not store keys. */
struct obuf {
	uint8_t p[4096];
	size_t n;
};

static void ob_put(struct obuf *b, const void *d, size_t n)
{
	memcpy(b->p + b->n, d, n);
	b->n += n;
}

static void ob_var(struct obuf *b, uint64_t v)
{
	do {
		uint8_t x = (uint8_t)((v & 0x7f) | (v >> 7 ? 0x80 : 0));
		ob_put(b, &x, 1);
		v >>= 7;
	} while (v);
}

static void ob_u8(struct obuf *b, uint8_t v)
{
	ob_put(b, &v, 1);
}

static void ob_str(struct obuf *b, const char *s)
{
	ob_put(b, s, strlen(s));
}

/* magic, length, version 0, no compression, body, CRC-32C */
static void ob_envelope(struct obuf *out, uint32_t magic, const struct obuf *body)
{
	uint8_t m[4] = { (uint8_t)(magic >> 24), (uint8_t)(magic >> 16), (uint8_t)(magic >> 8),
			 (uint8_t)magic };
	out->n = 0;
	ob_put(out, m, 4);
	uint8_t len[8] = { 0 };
	ob_put(out, len, 8);
	ob_var(out, 0);
	ob_var(out, 0);
	ob_put(out, body->p, body->n);
	out->n += 4;
	ckpt_put_le64(out->p + 4, out->n);
	ckpt_put_le32(out->p + out->n - 4, ckpt_crc32c(0, out->p, out->n - 4));
}

static ckpt_store *hostile_ocdbt(const char *const *keys, size_t n)
{
	struct obuf leaf = { .n = 0 }, node, man = { .n = 0 }, menv;
	ob_u8(&leaf, 0); /* height 0 */
	ob_var(&leaf, 0); /* no data files */
	ob_var(&leaf, n);
	for (size_t i = 1; i < n; i++)
		ob_var(&leaf, 0); /* no shared prefix */
	for (size_t i = 0; i < n; i++)
		ob_var(&leaf, strlen(keys[i]));
	for (size_t i = 0; i < n; i++)
		ob_str(&leaf, keys[i]);
	for (size_t i = 0; i < n; i++)
		ob_var(&leaf, strlen(keys[i])); /* the value is the key's text */
	for (size_t i = 0; i < n; i++)
		ob_u8(&leaf, 0);
	for (size_t i = 0; i < n; i++)
		ob_str(&leaf, keys[i]);
	ob_envelope(&node, 0x0cdb20de, &leaf);
	uint8_t uuid[16] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16 };
	ob_put(&man, uuid, 16);
	ob_var(&man, 0); /* single-file manifest */
	ob_var(&man, 1024);
	ob_var(&man, 100000000);
	ob_u8(&man, 4);
	ob_var(&man, 0);
	ob_var(&man, 1); /* data files: d/x */
	ob_var(&man, 3);
	ob_var(&man, 0);
	ob_str(&man, "d/x");
	ob_var(&man, 1); /* one version, its root the leaf */
	ob_var(&man, 1);
	ob_u8(&man, 0);
	ob_var(&man, 0);
	ob_var(&man, 0);
	ob_var(&man, node.n);
	ob_var(&man, 1);
	ob_var(&man, node.n);
	ob_var(&man, 0);
	uint8_t ts[8];
	ckpt_put_le64(ts, 1700000000000000000ull);
	ob_put(&man, ts, 8);
	ob_var(&man, 0);
	ob_envelope(&menv, 0x0cdb3a2a, &man);
	ckpt_store *mem, *o = NULL;
	CHECK_EQ_INT(ckpt_store_mem_open(NULL, &mem), 0);
	CHECK_EQ_INT(ckpt_store_mem_put(mem, "manifest.ocdbt", menv.p, menv.n), 0);
	CHECK_EQ_INT(ckpt_store_mem_put(mem, "d/x", node.p, node.n), 0);
	CHECK_EQ_INT(ckpt_store_ocdbt_open_on(mem, "", &o), 0);
	ckpt_store_destroy(mem);
	return o;
}

/* Every backend gets the dispatcher's key check: a key with "..", ".", an
 * empty component, a leading or trailing '/' is absent (-ENOENT) for every
 * operation, even where the backend holds that very name (an OCDBT key). */
static void test_bad_keys(void)
{
	static const char *const keys[] = { "../x", "/abs", "a/./b", "a//b", "a/b", "a/b/", "ok" };
	static const char *const bad[] = { "../x", "/abs", "a/./b", "a//b", "a/b/" };
	ckpt_store *o = hostile_ocdbt(keys, sizeof(keys) / sizeof(keys[0]));
	ckpt_store *m;
	CHECK_EQ_INT(ckpt_store_mem_open(NULL, &m), 0);
	CHECK_EQ_INT(ckpt_store_mem_put(m, "a/b", "a/b", 3), 0);
	CHECK_EQ_INT(ckpt_store_mem_put(m, "ok", "ok", 2), 0);
	ckpt_store *stores[] = { o, m };
	for (size_t i = 0; i < 2; i++) {
		ckpt_store *s = stores[i];
		if (!s)
			continue;
		uint64_t size = 0;
		char buf[8];
		struct ckpt_store_stat st;
		struct seen ls = { 0 };
		CHECK_EQ_INT(ckpt_store_size(s, "a/b", &size), 0); /* well-formed keys still answer */
		CHECK_EQ_INT(size, 3);
		CHECK_EQ_INT(ckpt_store_read(s, "ok", 0, sizeof(buf), buf), 2);
		CHECK_EQ_INT(ckpt_store_stat(s, "a", &st), 0);
		CHECK_EQ_INT(st.is_dir, 1);
		for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
			CHECK_EQ_INT(ckpt_store_size(s, bad[k], &size), -ENOENT);
			CHECK_EQ_INT(ckpt_store_read(s, bad[k], 0, sizeof(buf), buf), -ENOENT);
			CHECK_EQ_INT(ckpt_store_stat(s, bad[k], &st), -ENOENT);
			CHECK_EQ_INT(ckpt_store_listdir(s, bad[k], seen_cb, &ls), -ENOENT);
		}
		CHECK_EQ_INT(ckpt_store_size(s, "", &size), -ENOENT);
		CHECK_EQ_INT(ckpt_store_read(s, "", 0, sizeof(buf), buf), -ENOENT);
		char *txt = NULL;
		size_t len = 0;
		CHECK_EQ_INT(ckpt_store_read_small(s, "../x", 64, &txt, &len), -ENOENT);
		CHECK(txt == NULL);
	}
	ckpt_store_destroy(o);
	ckpt_store_destroy(m);
}

/* Every store answers how many requests to send at once; views answer
 * for the store below them. */
static void test_connections(void)
{
	ckpt_store *d, *m, *sub, *o, *s3, *s3sub;
	CHECK_EQ_INT(ckpt_store_dir_open(FIX "/std_ocdbt_zarr3", &d), 0);
	CHECK_EQ_INT(ckpt_store_connections(d), CKPT_STORE_FOLDER_CONNECTIONS);
	CHECK_EQ_INT(ckpt_store_ocdbt_open_on(d, "", &o), 0);
	CHECK_EQ_INT(ckpt_store_connections(o), CKPT_STORE_FOLDER_CONNECTIONS);
	ckpt_store_destroy(o);
	CHECK_EQ_INT(ckpt_store_sub(d, "d", &sub), 0);
	CHECK_EQ_INT(ckpt_store_connections(sub), CKPT_STORE_FOLDER_CONNECTIONS);
	ckpt_store_destroy(sub);
	ckpt_store_destroy(d);
	CHECK_EQ_INT(ckpt_store_mem_open(NULL, &m), 0);
	CHECK_EQ_INT(ckpt_store_connections(m), 1);
	ckpt_store_destroy(m);
	/* an object store: its -o connections (no request is sent at open) */
	struct ckpt_store_opts so = { 0 };
	so.endpoint = "http://127.0.0.1:9";
	so.anonymous = 1;
	so.connections = 7;
	CHECK_EQ_INT(ckpt_store_open_source("s3://bucket/pre", &so, &s3), 0);
	CHECK_EQ_INT(ckpt_store_connections(s3), 7);
	CHECK_EQ_INT(ckpt_store_sub(s3, "a/b", &s3sub), 0);
	CHECK_EQ_INT(ckpt_store_connections(s3sub), 7);
	ckpt_store_destroy(s3sub);
	ckpt_store_destroy(s3);
}

/* ---------------------------------------------------------------- ListObjectsV2 answers */

struct lp_got {
	int n;
	char keys[8][64];
	int64_t mt[8];
	uint64_t size[8];
	int prefix[8];
};

static int lp_cb(void *ctx, const char *key, const char *etag, uint64_t size, int64_t mtime_ns, int is_prefix)
{
	(void)etag;
	struct lp_got *g = ctx;
	if (g->n < 8) {
		snprintf(g->keys[g->n], 64, "%s", key);
		g->mt[g->n] = mtime_ns;
		g->size[g->n] = size;
		g->prefix[g->n] = is_prefix;
	}
	g->n++;
	return 0;
}

static void test_s3_list_parse(void)
{
	/* LastModified: ns since 1970; a year no int64 of ns holds (fuzz_s3_list:
	 * the product overflowed) is unknown (0), as is an impossible date */
	static const char body[] =
		"<ListBucketResult><EncodingType>url</EncodingType><IsTruncated>true</IsTruncated>"
		"<NextContinuationToken>t%2B1</NextContinuationToken>"
		"<Contents><Key>a%20b%2B%26</Key><LastModified>2024-05-01T10:20:30.500Z</LastModified>"
		"<Size>12</Size></Contents>"
		"<Contents><Key>big</Key><LastModified>576555963630-01-01T00:00:00Z</LastModified><Size>0</"
		"Size>"
		"</Contents>"
		"<Contents><Key>y9999</Key><LastModified>9999-12-31T23:59:59Z</LastModified><Size>0</Size>"
		"</Contents>"
		"<Contents><Key>month13</Key><LastModified>2024-13-01T00:00:00Z</LastModified><Size>0</Size>"
		"</Contents>"
		"<Contents><Key>sec</Key><LastModified>2024-05-01T10:20:1e300Z</LastModified><Size>0</Size>"
		"</Contents>"
		"<CommonPrefixes><Prefix>d&amp;/</Prefix></CommonPrefixes></ListBucketResult>";
	struct lp_got g = { 0 };
	int truncated = 0;
	char *token = NULL;
	CHECK_EQ_INT(ckpt_s3_list_parse(body, sizeof(body) - 1, NULL, lp_cb, &g, &truncated, &token, NULL),
		     0);
	CHECK_EQ_INT(truncated, 1);
	CHECK(token && strcmp(token, "t%2B1") == 0);
	free(token);
	CHECK_EQ_INT(g.n, 6);
	CHECK(strcmp(g.keys[0], "a b+&") == 0);
	CHECK_EQ_INT(g.size[0], 12);
	CHECK(g.mt[0] == 1714558830500000000ll);
	CHECK(strcmp(g.keys[1], "big") == 0);
	CHECK_EQ_INT(g.mt[1], 0);
	CHECK_EQ_INT(g.mt[2], 0);
	CHECK_EQ_INT(g.mt[3], 0);
	CHECK_EQ_INT(g.mt[4], 0);
	CHECK(strcmp(g.keys[5], "d&/") == 0 && g.prefix[5] == 1);

	/* what is not one whole valid page is refused, and nothing is handed out */
	static const char *const refused[] = {
		"<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>p/a</Key><Size>1</Size>"
		"</Contents>", /* cut off */
		"<html><body>503</body></html>",
		"\x01\x02garbage",
		"<?xml version=\"1.0\"?><Error><Code>SlowDown</Code></Error>",
		"<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>p/a</Key><Size>1x</Size>"
		"</Contents></ListBucketResult>",
		"<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>p/a</Key></Contents>"
		"</ListBucketResult>",
		"<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>q/a</Key><Size>1</Size>"
		"</Contents></ListBucketResult>",
		"<ListBucketResult><Prefix>q/</Prefix><IsTruncated>false</IsTruncated></ListBucketResult>",
		"<ListBucketResult><Prefix>p/</Prefix></ListBucketResult>",
		"",
	};
	for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
		struct lp_got r = { 0 };
		const char *why = NULL;
		CHECK_EQ_INT(ckpt_s3_list_parse(refused[i], strlen(refused[i]), "p/", lp_cb, &r, &truncated,
						&token, &why),
			     -EBADMSG);
		CHECK(why != NULL && r.n == 0 && token == NULL && truncated == 0);
	}
	static const char ok[] =
		"<?xml version=\"1.0\"?>\n<ListBucketResult xmlns=\"x\"><Prefix>p/</Prefix>"
		"<IsTruncated>false</IsTruncated><Contents><Key>p/a</Key><Size>18446744073709551615"
		"</Size></Contents></ListBucketResult>\n";
	struct lp_got o = { 0 };
	CHECK_EQ_INT(ckpt_s3_list_parse(ok, sizeof(ok) - 1, "p/", lp_cb, &o, &truncated, &token, NULL), 0);
	CHECK(o.n == 1 && o.size[0] == UINT64_MAX && truncated == 0 && token == NULL);
	/* every cut of a valid page is refused */
	for (size_t cut = 0; cut < sizeof(ok) - 2; cut++) /* all but the last newline */ {
		struct lp_got r = { 0 };
		CHECK_EQ_INT(ckpt_s3_list_parse(ok, cut, "p/", lp_cb, &r, &truncated, &token, NULL),
			     -EBADMSG);
		CHECK_EQ_INT(r.n, 0);
	}
}

/* ---------------------------------------------------------------- object-store driver
 *
 * Run by tests/py/test_s3_store.py against s3rver on loopback (ctest runs the
 * unit tests above only):
 *   test_store s3check SOURCE LOCALDIR [opt=value ...]
 *       every folder, file, byte range and OCDBT database of LOCALDIR read
 *       through SOURCE must match LOCALDIR exactly; prints "s3check ok ..."
 *   test_store s3cmp SOURCE KEY LOCALFILE [opt=value ...]
 *       read KEY in 64 KiB pieces; exit 0 equal, 1 wrong bytes, 2 an error
 *       (printed as "error: <errno name>")
 */

static int drv_files, drv_dirs, drv_ranges, drv_ocdbt_keys, drv_bad;

static void drv_fail(const char *fmt, const char *a, long b)
{
	fprintf(stderr, fmt, a, b);
	fputc('\n', stderr);
	drv_bad++;
}

struct ent_list {
	char names[4096][128];
	int dir[4096];
	uint64_t size[4096];
	int n;
};

static int ent_cb(void *ctx, const char *name, const struct ckpt_store_stat *st)
{
	struct ent_list *l = ctx;
	if (l->n < 4096) {
		snprintf(l->names[l->n], 128, "%s", name);
		l->dir[l->n] = st->is_dir;
		l->size[l->n] = st->size;
		l->n++;
	}
	return 0;
}

static int ent_cmp(const void *a, const void *b)
{
	return strcmp(a, b);
}

static void sort_ents(struct ent_list *l)
{
	/* names, dir and size sorted together: sort an index */
	for (int i = 1; i < l->n; i++)
		for (int j = i; j > 0 && ent_cmp(l->names[j - 1], l->names[j]) > 0; j--) {
			char t[128];
			memcpy(t, l->names[j], 128);
			memcpy(l->names[j], l->names[j - 1], 128);
			memcpy(l->names[j - 1], t, 128);
			int d = l->dir[j];
			l->dir[j] = l->dir[j - 1];
			l->dir[j - 1] = d;
			uint64_t z = l->size[j];
			l->size[j] = l->size[j - 1];
			l->size[j - 1] = z;
		}
}

static void cmp_value(ckpt_store *loc, ckpt_store *rem, const char *key, uint64_t size)
{
	char *a = NULL, *b = NULL;
	size_t la = 0, lb = 0;
	int ra = ckpt_store_read_small(loc, key, 1 << 28, &a, &la);
	int rb = ckpt_store_read_small(rem, key, 1 << 28, &b, &lb);
	if (ra || rb || la != lb || memcmp(a, b, la) != 0) {
		drv_fail("value differs: %s (rc %ld)", key, rb);
	} else {
		/* ranges: first byte, last byte, a middle piece, one running past the end */
		uint64_t offs[4] = { 0, size ? size - 1 : 0, size / 3, size > 5 ? size - 5 : 0 };
		size_t lens[4] = { 1, 1, (size_t)(size / 3 + 7), 64 };
		for (int i = 0; i < 4; i++) {
			char buf[1 << 16];
			size_t len = lens[i] < sizeof(buf) ? lens[i] : sizeof(buf);
			ssize_t n = ckpt_store_read(rem, key, offs[i], len, buf);
			uint64_t want = offs[i] >= size ? 0 : (size - offs[i] < len ? size - offs[i] : len);
			if (n < 0 || (uint64_t)n != want ||
			    (n > 0 && memcmp(buf, a + offs[i], (size_t)n) != 0))
				drv_fail("range differs: %s (rc %ld)", key, (long)n);
			drv_ranges++;
		}
	}
	free(a);
	free(b);
}

static void cmp_ocdbt(ckpt_store *loc, ckpt_store *rem, const char *dir)
{
	ckpt_store *a = NULL, *b = NULL;
	int ra = ckpt_store_ocdbt_open_on(loc, dir, &a);
	int rb = ckpt_store_ocdbt_open_on(rem, dir, &b);
	if (ra || rb) {
		drv_fail("ocdbt open differs: %s (rc %ld)", dir, rb);
	} else {
		struct keys ka = { 0 }, kb = { 0 };
		ckpt_store_list(a, "", key_cb, &ka);
		ckpt_store_list(b, "", key_cb, &kb);
		if (ka.n != kb.n || !ka.all || !kb.all || strcmp(ka.all, kb.all) != 0)
			drv_fail("ocdbt keys differ: %s (%ld keys)", dir, kb.n);
		for (char *k = ka.all; k && *k;) {
			char *nl = strchr(k, '\n');
			*nl = 0;
			uint64_t size = 0;
			ckpt_store_size(a, k, &size);
			cmp_value(a, b, k, size);
			drv_ocdbt_keys++;
			k = nl + 1;
		}
		free(ka.all);
		free(kb.all);
	}
	ckpt_store_destroy(a);
	ckpt_store_destroy(b);
}

static void cmp_dir(ckpt_store *loc, ckpt_store *rem, const char *dir)
{
	struct ent_list *la = calloc(1, sizeof(*la)), *lb = calloc(1, sizeof(*lb));
	int ra = ckpt_store_listdir(loc, dir, ent_cb, la);
	int rb = ckpt_store_listdir(rem, dir, ent_cb, lb);
	sort_ents(la);
	sort_ents(lb);
	drv_dirs++;
	int ocdbt = 0;
	if (ra || rb || la->n != lb->n) {
		drv_fail("listing differs: '%s' (%ld entries remote)", dir, lb->n);
	} else {
		for (int i = 0; i < la->n; i++) {
			char key[1024];
			snprintf(key, sizeof(key), "%s%s%s", dir, *dir ? "/" : "", la->names[i]);
			if (strcmp(la->names[i], lb->names[i]) != 0 || la->dir[i] != lb->dir[i] ||
			    la->size[i] != lb->size[i]) {
				drv_fail("entry differs: %s (%ld)", key, i);
				continue;
			}
			struct ckpt_store_stat sa, sb;
			int xa = ckpt_store_stat(loc, key, &sa), xb = ckpt_store_stat(rem, key, &sb);
			if (xa || xb || sa.is_dir != sb.is_dir || sa.size != sb.size)
				drv_fail("stat differs: %s (rc %ld)", key, xb);
			if (la->dir[i]) {
				if (strncmp(la->names[i], "ocdbt.process_", 14) == 0)
					ocdbt = 1;
				cmp_dir(loc, rem, key);
			} else {
				if (strcmp(la->names[i], "manifest.ocdbt") == 0)
					ocdbt = 1;
				cmp_value(loc, rem, key, la->size[i]);
				drv_files++;
			}
		}
	}
	if (ocdbt)
		cmp_ocdbt(loc, rem, dir);
	free(la);
	free(lb);
}

static int drv_open(const char *source, int argc, char **argv, ckpt_store **out)
{
	struct ckpt_store_opts o = { 0 };
	for (int i = 0; i < argc; i++) {
		char *eq = strchr(argv[i], '=');
		if (eq)
			*eq = 0;
		if (ckpt_store_opts_set(&o, argv[i], eq ? eq + 1 : NULL) != 1) {
			fprintf(stderr, "bad option %s\n", argv[i]);
			return -EINVAL;
		}
	}
	return ckpt_store_open_source(source, &o, out);
}

/* test_store s3write SOURCE [opt=value ...]: PUT, overwrite, create-only
 * PUT, a multipart upload (parts sent out of order from two threads), a
 * refused multipart upload (small part), delete; each read back through the
 * store.  Prints one "name: result" line per step; exit 0 when all hold. */
struct part_job {
	ckpt_upload *u;
	unsigned first;
	const char *buf;
	int rc;
};

#define PART ((size_t)5 << 20)

static void *part_thread(void *arg)
{
	struct part_job *j = arg;
	for (unsigned p = j->first; p >= 1 && p <= 2; p--)
		if (!j->rc)
			j->rc = ckpt_upload_part(j->u, p, j->buf + (p - 1) * PART, PART);
	return NULL;
}

static int read_back(ckpt_store *s, const char *key, const char *want, size_t len)
{
	char *got = NULL;
	size_t n = 0;
	int rc = ckpt_store_read_small(s, key, len + 1, &got, &n);
	int ok = rc == 0 && n == len && memcmp(got, want, len) == 0;
	free(got);
	return ok;
}

static int drv_write(int argc, char **argv)
{
	ckpt_store *s = NULL, *sub = NULL;
	int rc = drv_open(argv[2], argc - 3, argv + 3, &s);
	if (rc) {
		printf("error: %s\n", strerror(-rc));
		return 2;
	}
	int bad = 0, ok;
	/* through a sub-store: keys are translated */
	if (ckpt_store_sub(s, "w", &sub) != 0)
		return 2;
	rc = ckpt_store_put(sub, "small.json", "{\"a\": 1}", 8, 0);
	ok = rc == 0 && read_back(s, "w/small.json", "{\"a\": 1}", 8);
	printf("put: %s\n", rc ? strerror(-rc) : ok ? "ok" : "WRONG");
	bad += !ok;
	/* overwrite: readers see the new object, not a stale pin */
	rc = ckpt_store_put(sub, "small.json", "{\"b\": 22}", 9, 0);
	ok = rc == 0 && read_back(sub, "small.json", "{\"b\": 22}", 9);
	printf("overwrite: %s\n", rc ? strerror(-rc) : ok ? "ok" : "WRONG");
	bad += !ok;
	rc = ckpt_store_put(sub, "marker.txt", "done", 4, CKPT_PUT_CREATE_ONLY);
	printf("create_only: %s\n", rc == 0 ? "ok" : rc == -EEXIST ? "exists" : strerror(-rc));
	bad += rc != 0 && rc != -EEXIST;

	size_t total = 2 * PART + 12345;
	char *buf = malloc(total);
	for (size_t i = 0; i < total; i++)
		buf[i] = (char)(i * 2654435761u >> 13);
	ckpt_upload *u = NULL;
	rc = ckpt_upload_begin(sub, "big.bin", &u);
	if (rc == 0) {
		struct part_job j = { u, 2, buf, 0 };
		pthread_t t;
		pthread_create(&t, NULL, part_thread, &j);
		rc = ckpt_upload_part(u, 3, buf + 2 * PART, total - 2 * PART);
		pthread_join(t, NULL);
		if (!rc)
			rc = j.rc;
		if (rc)
			ckpt_upload_abort(u);
		else
			rc = ckpt_upload_complete(u);
	}
	ok = rc == 0 && read_back(s, "w/big.bin", buf, total);
	printf("multipart: %s\n", rc ? strerror(-rc) : ok ? "ok" : "WRONG");
	bad += !ok;

	rc = ckpt_upload_begin(sub, "refused.bin", &u);
	if (rc == 0) {
		ckpt_upload_part(u, 1, buf, 1000);
		ckpt_upload_part(u, 2, buf, 1000);
		rc = ckpt_upload_complete(u);
	}
	struct ckpt_store_stat st;
	ok = rc == -EINVAL && ckpt_store_stat(sub, "refused.bin", &st) == -ENOENT;
	printf("small_part: %s\n", ok ? "refused" : "ACCEPTED");
	bad += !ok;

	rc = ckpt_store_delete(sub, "small.json");
	printf("delete: %s\n", rc ? strerror(-rc) : "ok");
	bad += rc != 0;
	bad += ckpt_store_delete(sub, "never-there") != 0;

	ckpt_store *loc = NULL;
	if (ckpt_store_dir_open("/", &loc) == 0) {
		rc = ckpt_store_put(loc, "tmp/x", "x", 1, 0);
		printf("folder_store: %s\n", rc == -EROFS ? "refused" : "ACCEPTED");
		bad += rc != -EROFS;
		ckpt_store_destroy(loc);
	}
	free(buf);
	ckpt_store_destroy(sub);
	ckpt_store_destroy(s);
	return bad ? 1 : 0;
}

/* test_store s3par SOURCE KEY LOCALFILE THREADS RANGE [opt=value ...]:
 * THREADS threads read KEY in RANGE-byte pieces at once (thread i reads
 * pieces i, i+THREADS, ...), every piece compared with LOCALFILE.  Prints
 * "s3par ok N pieces" (exit 0) or the first difference (exit 1). */
struct par_job {
	ckpt_store *s;
	const char *key;
	const char *want;
	size_t size, range;
	unsigned idx, step;
	int bad;
};

static void *par_thread(void *arg)
{
	struct par_job *j = arg;
	char *buf = malloc(j->range);
	for (size_t off = (size_t)j->idx * j->range; buf && off < j->size;
	     off += (size_t)j->step * j->range) {
		size_t n = j->size - off < j->range ? j->size - off : j->range;
		ssize_t g = ckpt_store_read(j->s, j->key, off, j->range, buf);
		if (g != (ssize_t)n || memcmp(buf, j->want + off, n) != 0) {
			printf("WRONG piece at %zu: %zd\n", off, g);
			j->bad = 1;
		}
	}
	free(buf);
	return NULL;
}

static int drv_par(int argc, char **argv)
{
	ckpt_store *rem;
	if (drv_open(argv[2], argc - 7, argv + 7, &rem))
		return 2;
	FILE *f = fopen(argv[4], "rb");
	if (!f)
		return 2;
	fseek(f, 0, SEEK_END);
	size_t size = (size_t)ftell(f);
	rewind(f);
	char *want = malloc(size + 1);
	if (!want || fread(want, 1, size, f) != size)
		return 2;
	fclose(f);
	unsigned nt = (unsigned)atoi(argv[5]);
	size_t range = (size_t)atol(argv[6]);
	struct par_job jobs[64];
	pthread_t th[64];
	int bad = 0;
	if (nt < 1 || nt > 64 || range < 1)
		return 2;
	for (unsigned i = 0; i < nt; i++) {
		jobs[i] = (struct par_job){ rem, argv[3], want, size, range, i, nt, 0 };
		pthread_create(&th[i], NULL, par_thread, &jobs[i]);
	}
	for (unsigned i = 0; i < nt; i++) {
		pthread_join(th[i], NULL);
		bad |= jobs[i].bad;
	}
	if (!bad)
		printf("s3par ok %zu pieces\n", (size + range - 1) / range);
	free(want);
	ckpt_store_destroy(rem);
	return bad;
}

static int drv_main(int argc, char **argv)
{
	ckpt_log_set_level(getenv("CKPT_TEST_DEBUG") ? CKPT_LOG_DEBUG : CKPT_LOG_INFO);
	ckpt_store *rem = NULL, *loc = NULL;
	if (argc >= 4 && strcmp(argv[1], "s3check") == 0) {
		int rc = drv_open(argv[2], argc - 4, argv + 4, &rem);
		if (rc == 0)
			rc = ckpt_store_dir_open(argv[3], &loc);
		if (rc) {
			printf("error: %s\n", strerror(-rc));
			return 2;
		}
		cmp_dir(loc, rem, "");
		struct ckpt_store_stat st;
		if (ckpt_store_stat(rem, "no/such/thing", &st) != -ENOENT)
			drv_fail("stat of a missing key: %s %ld", "", 0);
		char b[4];
		if (ckpt_store_read(rem, "no-such-object", 0, 4, b) != -ENOENT)
			drv_fail("read of a missing key: %s %ld", "", 0);
		printf("s3check %s: %d folders, %d files, %d ranges, %d ocdbt keys, %d differences\n",
		       drv_bad ? "FAILED" : "ok", drv_dirs, drv_files, drv_ranges, drv_ocdbt_keys, drv_bad);
		ckpt_store_destroy(rem);
		ckpt_store_destroy(loc);
		return drv_bad ? 1 : 0;
	}
	if (argc >= 5 && strcmp(argv[1], "s3cmp") == 0) {
		int rc = drv_open(argv[2], argc - 5, argv + 5, &rem);
		if (rc) {
			printf("error: %s\n", strerror(-rc));
			return 2;
		}
		FILE *f = fopen(argv[4], "rb");
		if (!f)
			return 2;
		static char want[1 << 16], got[1 << 16];
		uint64_t off = 0;
		int result = 0;
		for (;;) {
			size_t n = fread(want, 1, sizeof(want), f);
			ssize_t g = ckpt_store_read(rem, argv[3], off, sizeof(got), got);
			if (g < 0) {
				printf("error: %s at offset %llu\n", strerror((int)-g),
				       (unsigned long long)off);
				result = 2;
				break;
			}
			if ((size_t)g != n || memcmp(want, got, n) != 0) {
				printf("WRONG BYTES at offset %llu\n", (unsigned long long)off);
				result = 1;
				break;
			}
			if (n == 0)
				break;
			off += n;
		}
		fclose(f);
		if (result == 0)
			printf("equal: %llu bytes\n", (unsigned long long)off);
		ckpt_store_destroy(rem);
		return result;
	}
	if (argc >= 7 && strcmp(argv[1], "s3par") == 0)
		return drv_par(argc, argv);
	if (argc >= 3 && strcmp(argv[1], "s3write") == 0)
		return drv_write(argc, argv);
	if (argc >= 4 && strcmp(argv[1], "s3ls") == 0) {
		/* test_store s3ls SOURCE DIR: entries of DIR by listdir, keys below it by list */
		int rc = drv_open(argv[2], argc - 4, argv + 4, &rem);
		struct keys k = { 0 };
		struct seen ls = { 0 };
		if (rc == 0)
			rc = ckpt_store_listdir(rem, argv[3], count_cb, &ls);
		char p[1024];
		snprintf(p, sizeof(p), "%s/", argv[3]);
		if (rc == 0)
			rc = ckpt_store_list(rem, p, key_cb, &k);
		printf("listdir %d list %d rc %d\n", ls.n, k.n, rc);
		free(k.all);
		ckpt_store_destroy(rem);
		return rc ? 2 : 0;
	}
	fprintf(stderr, "usage: test_store [s3write SOURCE | s3check SOURCE LOCALDIR | s3cmp SOURCE KEY "
			"FILE] [opt=value ...]\n");
	return 2;
}

int main(int argc, char **argv)
{
	if (argc > 1)
		return drv_main(argc, argv);
	signal(SIGALRM, on_alarm);
	snprintf(tmp, sizeof(tmp), "/tmp/test_store.XXXXXX");
	if (!mkdtemp(tmp))
		return 2;
	ckpt_log_set_level(CKPT_LOG_ERR);
	CHECK_RUN(test_folder);
	CHECK_RUN(test_open_fd);
	CHECK_RUN(test_ocdbt_on);
	CHECK_RUN(test_mem);
	CHECK_RUN(test_mem_ranges);
	CHECK_RUN(test_bad_keys);
	CHECK_RUN(test_connections);
	CHECK_RUN(test_s3_list_parse);
	sh("rm -rf %s", tmp);
	return CHECK_DONE();
}
