/*
 * test_tree.c - the tree layer without a mount: a CheckpointManager fixture
 * seen through ckpt_view_* (lookup, readdir, attributes, reads, xattrs, the
 * hidden companions, the errors of each kind), and the namespace staying
 * usable while a commit runs.
 *
 * The commit is held at a known point without timing: the item's
 * commit_success.txt in the step's tmp folder is a FIFO, which the
 * writer's open() for writing waits on until this test opens it for
 * reading.  alarm() ends the test if a call blocks (a regression).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "ckpt.h"
#include "npy.h"

#define FIX CKPT_FIXTURES

static ckpt_ino lookup(ckpt_view *v, ckpt_ino dir, const char *path)
{
	char buf[512];
	snprintf(buf, sizeof(buf), "%s", path);
	ckpt_ino ino = dir;
	for (char *save = NULL, *c = strtok_r(buf, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
		ckpt_attr a;
		if (ckpt_view_lookup(v, ino, c, &a) < 0)
			return 0;
		ino = a.ino;
	}
	return ino;
}

static int count_entries(ckpt_view *v, ckpt_ino dir)
{
	const char *name;
	ckpt_attr a;
	int i = 0;
	while (ckpt_view_readdir(v, dir, (uint64_t)i, &name, &a) == 1)
		i++;
	return i;
}

static void test_read_side(void)
{
	ckpt_view *v;
	ckpt_view_opts o = { 0 };
	o.read_only = 1;
	CHECK_EQ_INT(ckpt_view_open(FIX "/manager", &o, &v), 0);
	if (!v)
		return;
	CHECK(!strcmp(ckpt_view_kind(v), "root"));
	const char *name;
	ckpt_attr a;
	CHECK_EQ_INT(ckpt_view_readdir(v, CKPT_ROOT_INO, 0, &name, &a), 1);
	CHECK(!strcmp(name, "10") && a.is_dir && a.mode == 0555 && a.nlink == 2);
	CHECK_EQ_INT(count_entries(v, CKPT_ROOT_INO), 3); /* 10, 20, latest */
	CHECK_EQ_INT(ckpt_view_readdir(v, CKPT_ROOT_INO, 2, &name, &a), 1);
	CHECK(!strcmp(name, "latest") && a.is_link && !a.is_dir && a.size == 2 && !a.immutable);
	char target[8];
	CHECK_EQ_INT(ckpt_view_readlink(v, a.ino, target, sizeof(target)), 2);
	CHECK(!strcmp(target, "20"));
	CHECK_EQ_INT(ckpt_view_readlink(v, a.ino, target, 2), -ENAMETOOLONG);
	CHECK_EQ_INT(ckpt_view_readlink(v, CKPT_ROOT_INO, target, sizeof(target)), -EINVAL);
	CHECK(lookup(v, CKPT_ROOT_INO, "latest") == a.ino);
	CHECK_EQ_INT(ckpt_view_unlink(v, CKPT_ROOT_INO, "latest"), -EPERM);
	CHECK_EQ_INT(ckpt_view_rename(v, CKPT_ROOT_INO, "latest", CKPT_ROOT_INO, "30", 0), -EPERM);

	ckpt_ino emb = lookup(v, CKPT_ROOT_INO, "10/state/params/embed/embedding.npy");
	CHECK(emb != 0);
	CHECK_EQ_INT(ckpt_view_getattr(v, emb, &a), 0);
	CHECK(!a.is_dir && a.mode == 0444 && a.immutable && a.size > 128);
	char head[16];
	CHECK_EQ_INT(ckpt_view_read(v, emb, 0, 6, head), 6);
	CHECK(!memcmp(head, "\x93NUMPY", 6));
	/* errors per kind */
	CHECK_EQ_INT(ckpt_view_read(v, CKPT_ROOT_INO, 0, 6, head), -EISDIR);
	CHECK_EQ_INT(ckpt_view_readdir(v, emb, 0, &name, &a), -ENOTDIR);
	CHECK_EQ_INT(ckpt_view_lookup(v, emb, "x", &a), -ENOTDIR);
	CHECK_EQ_INT(ckpt_view_lookup(v, CKPT_ROOT_INO, "nope", &a), -ENOENT);
	CHECK_EQ_INT(ckpt_view_getxattr(v, emb, "security.selinux", head, sizeof(head)), -ENOTSUP);
	CHECK_EQ_INT(ckpt_view_getxattr(v, CKPT_ROOT_INO, "user.ckpt.dtype", head, sizeof(head)), -ENODATA);
	CHECK_EQ_INT(ckpt_view_listxattr(v, CKPT_ROOT_INO, NULL, 0), 0);
	CHECK(ckpt_view_listxattr(v, emb, NULL, 0) > 0);
	CHECK_EQ_INT(ckpt_view_mkdir(v, CKPT_ROOT_INO, "30", &a), -EROFS);

	/* hidden companions: same node on every lookup, not listed */
	ckpt_ino sl = lookup(v, CKPT_ROOT_INO, "10/state/params/embed/embedding[0:2].npy");
	CHECK(sl != 0 && sl == lookup(v, CKPT_ROOT_INO, "10/state/params/embed/embedding[0:2].npy"));
	ckpt_ino params = lookup(v, CKPT_ROOT_INO, "10/state/params/embed");
	int listed = count_entries(v, params);
	ckpt_ino sh = lookup(v, params, "embedding.shards");
	CHECK(sh != 0);
	CHECK(count_entries(v, sh) >= 1);
	CHECK_EQ_INT(count_entries(v, params), listed);
	char val[256];
	ssize_t n = ckpt_view_getxattr(v, emb, "user.ckpt.shards", val, sizeof(val) - 1);
	CHECK(n > 0);
	if (n > 0) {
		val[n] = 0;
		CHECK(strstr(val, "\"count\": ") && !strstr(val, "\"count\": 0"));
	}
	ckpt_ino st = lookup(v, CKPT_ROOT_INO, "10/state.safetensors");
	CHECK(st != 0);
	CHECK_EQ_INT(ckpt_view_getattr(v, st, &a), 0);
	CHECK(!a.is_dir && a.size > 8);
	ckpt_ino stats = lookup(v, CKPT_ROOT_INO, ".ckptfs/stats");
	CHECK(stats != 0);
	CHECK_EQ_INT(ckpt_view_getattr(v, stats, &a), 0);
	CHECK(a.volatile_data && !a.immutable);
	ckpt_view_destroy(v);
}

/* ---- a commit held on a FIFO --------------------------------------------- */

/* touch STEP/commit_success.txt: create the marker, then close it (the
 * flush commits). */
static int commit_marker(ckpt_view *v, ckpt_ino step, ckpt_attr *a)
{
	int rc = ckpt_view_create(v, step, "commit_success.txt", a);
	return rc < 0 ? rc : ckpt_view_flush(v, a->ino);
}

struct commit_call {
	ckpt_view *v;
	ckpt_ino step;
	_Atomic int rc;
};

static void *do_commit(void *arg)
{
	struct commit_call *c = arg;
	ckpt_attr a;
	c->rc = commit_marker(c->v, c->step, &a);
	return NULL;
}

/* A thread of this process waits in open() of a FIFO. */
static int thread_in_fifo_open(void)
{
	DIR *d = opendir("/proc/self/task");
	int found = 0;
	struct dirent *de;
	while (d && !found && (de = readdir(d))) {
		char p[300], w[64] = { 0 };
		snprintf(p, sizeof(p), "/proc/self/task/%s/wchan", de->d_name);
		FILE *f = fopen(p, "r");
		if (!f)
			continue;
		if (fgets(w, sizeof(w), f))
			found = !strcmp(w, "wait_for_partner") || !strcmp(w, "fifo_open");
		fclose(f);
	}
	if (d)
		closedir(d);
	return found;
}

static int hdr_len;

static void write_array(ckpt_view *v, ckpt_ino item, const char *name, float base)
{
	ckpt_attr a;
	CHECK_EQ_INT(ckpt_view_create(v, item, name, &a), 0);
	uint64_t shape[1] = { 64 };
	char buf[128 + 64 * 4];
	int h = ckpt_npy_header(CKPT_DT_FLOAT32, 1, shape, buf, 128);
	CHECK(h > 0);
	hdr_len = h;
	for (int i = 0; i < 64; i++) {
		float f = base + (float)i;
		memcpy(buf + h + 4 * i, &f, 4);
	}
	CHECK_EQ_INT(ckpt_view_write(v, a.ino, 0, buf, (size_t)h + 256, 0), h + 256);
}

static void test_commit_does_not_block_the_namespace(void)
{
	char tmpl[] = "/tmp/test_tree.XXXXXX";
	char *root = mkdtemp(tmpl);
	CHECK(root != NULL);
	if (!root)
		return;
	ckpt_view *v;
	CHECK_EQ_INT(ckpt_view_open(root, NULL, &v), 0);
	ckpt_attr a, it;
	CHECK_EQ_INT(ckpt_view_mkdir(v, CKPT_ROOT_INO, "1", &a), 0);
	CHECK_EQ_INT(ckpt_view_mkdir(v, a.ino, "state", &it), 0);
	write_array(v, it.ino, "w.npy", 1.0f);
	CHECK_EQ_INT(commit_marker(v, a.ino, &it), 0);

	ckpt_attr s2;
	CHECK_EQ_INT(ckpt_view_mkdir(v, CKPT_ROOT_INO, "2", &s2), 0);
	CHECK_EQ_INT(ckpt_view_mkdir(v, s2.ino, "state", &it), 0);
	for (int i = 0; i < 8; i++) {
		char nm[16];
		snprintf(nm, sizeof(nm), "a%d.npy", i);
		write_array(v, it.ino, nm, 100.0f * (float)i);
	}
	char fifo[512];
	snprintf(fifo, sizeof(fifo), "%s/2.orbax-checkpoint-tmp/state/commit_success.txt", root);
	CHECK_EQ_INT(mkfifo(fifo, 0600), 0);

	struct commit_call c = { v, s2.ino, 1 };
	pthread_t t;
	pthread_create(&t, NULL, do_commit, &c);
	while (!thread_in_fifo_open())
		usleep(1000);
	/* The commit is held inside the writer: the namespace answers. */
	CHECK_EQ_INT(count_entries(v, CKPT_ROOT_INO), 3); /* 1, 2 (pending), latest */
	ckpt_ino w = lookup(v, CKPT_ROOT_INO, "1/state/w.npy");
	float f[2];
	CHECK(w != 0);
	CHECK_EQ_INT(ckpt_view_read(v, w, (uint64_t)hdr_len, sizeof(f), f), (int)sizeof(f));
	CHECK(f[0] == 1.0f && f[1] == 2.0f);
	CHECK(lookup(v, CKPT_ROOT_INO, "2/state/a3.npy") != 0);
	/* namespace changes too, and the committing step refuses them */
	CHECK_EQ_INT(ckpt_view_mkdir(v, CKPT_ROOT_INO, "3", &a), 0);
	CHECK_EQ_INT(ckpt_view_rmdir(v, CKPT_ROOT_INO, "3"), 0);
	CHECK_EQ_INT(ckpt_view_mkdir(v, s2.ino, "other", &a), -EROFS);
	CHECK_EQ_INT(ckpt_view_rmdir(v, CKPT_ROOT_INO, "2"), -EROFS);
	CHECK_EQ_INT(ckpt_view_rename(v, CKPT_ROOT_INO, "2", CKPT_ROOT_INO, "4", 0), -EROFS);
	CHECK_EQ_INT(c.rc, 1); /* still held */

	int fd = open(fifo, O_RDONLY | O_NONBLOCK);
	CHECK(fd >= 0);
	pthread_join(t, NULL);
	close(fd);
	/* the held file was a FIFO: that commit failed, the step is still pending */
	CHECK(c.rc < 0);
	unlink(fifo);
	CHECK_EQ_INT(commit_marker(v, s2.ino, &a), 0);
	CHECK_EQ_INT(count_entries(v, CKPT_ROOT_INO), 3); /* 1, 2, latest */
	ckpt_ino a5 = lookup(v, CKPT_ROOT_INO, "2/state/a5.npy");
	CHECK(a5 != 0 && a5 != s2.ino);
	CHECK_EQ_INT(ckpt_view_read(v, a5, (uint64_t)hdr_len, sizeof(f), f), (int)sizeof(f));
	CHECK(f[0] == 500.0f && f[1] == 501.0f);
	ckpt_view_destroy(v);
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	CHECK_EQ_INT(system(cmd), 0);
}

static void write_text(const char *dir, const char *name, const char *text)
{
	char p[600];
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	FILE *f = fopen(p, "w");
	CHECK(f != NULL);
	if (f) {
		fputs(text, f);
		fclose(f);
	}
}

/* What SOURCE may be: a non-empty folder that is no checkpoint is refused
 * unless force_root; a root is live (steps that appear and vanish in the
 * source are seen without reopening the view); a vanished step's nodes
 * answer ENOENT/ESTALE. */
static void test_sources_and_live_root(void)
{
	char tmpl[] = "/tmp/test_tree_live.XXXXXX";
	char *root = mkdtemp(tmpl);
	CHECK(root != NULL);
	if (!root)
		return;
	char p[600];
	write_text(root, "README.txt", "notes\n");
	snprintf(p, sizeof(p), "%s/src", root);
	CHECK_EQ_INT(mkdir(p, 0755), 0);
	ckpt_view *v = NULL;
	CHECK_EQ_INT(ckpt_view_open(root, NULL, &v), -EMEDIUMTYPE);
	ckpt_view_opts o = { 0 };
	o.force_root = 1;
	CHECK_EQ_INT(ckpt_view_open(root, &o, &v), 0);
	if (!v)
		return;
	CHECK(!strcmp(ckpt_view_kind(v), "root"));
	ckpt_view_destroy(v);

	/* a step folder makes it a root; steps come and go */
	snprintf(p, sizeof(p), "%s/5", root);
	CHECK_EQ_INT(mkdir(p, 0755), 0);
	write_text(p, "_CHECKPOINT_METADATA", "{\"commit_timestamp_nsecs\": 1000000000}");
	o.force_root = 0;
	o.read_only = 1;
	CHECK_EQ_INT(ckpt_view_open(root, &o, &v), 0);
	if (!v)
		return;
	ckpt_attr a;
	CHECK_EQ_INT(ckpt_view_lookup(v, CKPT_ROOT_INO, "5", &a), 0);
	CHECK(a.is_dir && !a.immutable && a.mtime_ns == 1000000000);
	ckpt_ino meta = lookup(v, CKPT_ROOT_INO, "5/_CHECKPOINT_METADATA");
	CHECK(meta != 0);
	CHECK_EQ_INT(ckpt_view_lookup(v, CKPT_ROOT_INO, "6", &a), -ENOENT);
	snprintf(p, sizeof(p), "%s/6.orbax-checkpoint-tmp", root);
	CHECK_EQ_INT(mkdir(p, 0755), 0);
	CHECK_EQ_INT(ckpt_view_lookup(v, CKPT_ROOT_INO, "6.orbax-checkpoint-tmp", &a), -ENOENT);
	char q[600];
	snprintf(q, sizeof(q), "%s/6", root);
	CHECK_EQ_INT(rename(p, q), 0);
	CHECK_EQ_INT(ckpt_view_lookup(v, CKPT_ROOT_INO, "6", &a), 0);
	snprintf(p, sizeof(p), "rm -r '%s/5'", root);
	CHECK_EQ_INT(system(p), 0);
	CHECK_EQ_INT(count_entries(v, CKPT_ROOT_INO), 3); /* 6/, src/ and latest */
	CHECK_EQ_INT(ckpt_view_lookup(v, CKPT_ROOT_INO, "5", &a), -ENOENT);
	char buf[16];
	CHECK_EQ_INT(ckpt_view_getattr(v, meta, &a), -ESTALE);
	CHECK_EQ_INT(ckpt_view_read(v, meta, 0, sizeof(buf), buf), -ESTALE);
	ckpt_view_destroy(v);
	snprintf(p, sizeof(p), "rm -rf '%s'", root);
	CHECK_EQ_INT(system(p), 0);
}

/* The process's steps_freed counter (.ckptfs/stats). */
static long steps_freed(ckpt_view *v)
{
	char buf[4096];
	ckpt_attr a;
	ckpt_ino meta = 0, st = 0;
	if (ckpt_view_lookup(v, CKPT_ROOT_INO, ".ckptfs", &a) == 0)
		meta = a.ino;
	if (meta && ckpt_view_lookup(v, meta, "stats", &a) == 0)
		st = a.ino;
	ssize_t n = st ? ckpt_view_read(v, st, 0, sizeof(buf) - 1, buf) : -1;
	if (n <= 0)
		return -1;
	buf[n] = 0;
	const char *f = strstr(buf, "\"steps_freed\": ");
	return f ? strtol(f + 15, NULL, 10) : -1;
}

/* A step pruned from a live root is freed, with its arrays and stores,
 * once every reference the caller (the kernel) got to its nodes is
 * forgotten, and not before; lookups inside it answer ESTALE meanwhile.  A
 * freed inode number comes back with another generation than it had. */
static void test_pruned_step_is_freed(void)
{
	char tmpl[] = "/tmp/test_tree_free.XXXXXX";
	char *root = mkdtemp(tmpl);
	CHECK(root != NULL);
	if (!root)
		return;
	char p[600];
	snprintf(p, sizeof(p), "cp -r '%s/manager/10' '%s/5' && cp -r '%s/manager/10' '%s/6'", FIX, root, FIX,
		 root);
	CHECK_EQ_INT(system(p), 0);
	ckpt_view_opts o = { 0 };
	o.read_only = 1;
	ckpt_view *v = NULL;
	CHECK_EQ_INT(ckpt_view_open(root, &o, &v), 0);
	if (!v)
		return;
	/* a freed transient number comes back with a new generation */
	ckpt_attr a, b;
	ckpt_ino emb = lookup(v, CKPT_ROOT_INO, "6/state/params/embed");
	CHECK(emb != 0);
	CHECK_EQ_INT(ckpt_view_lookup(v, emb, "embedding[0:1].npy", &a), 0);
	CHECK(a.transient);
	ckpt_view_forget(v, a.ino, 1);
	CHECK_EQ_INT(ckpt_view_lookup(v, emb, "embedding[0:2].npy", &b), 0);
	CHECK(b.ino != a.ino || b.generation != a.generation);
	ckpt_view_forget(v, b.ino, 1);

	/* step 5: each path component looked up once (as the kernel would) */
	static const char *const path[] = { "5", "state", "params", "embed", "embedding.npy" };
	ckpt_ino ino[5], dir = CKPT_ROOT_INO;
	uint64_t gen[5];
	for (int i = 0; i < 5; i++) {
		CHECK_EQ_INT(ckpt_view_lookup(v, dir, path[i], &a), 0);
		dir = ino[i] = a.ino;
		gen[i] = a.generation;
	}
	char head[16];
	CHECK_EQ_INT(ckpt_view_read(v, ino[4], 0, 6, head), 6);
	CHECK_EQ_INT(ckpt_view_lookup(v, ino[3], "embedding[0:1].npy", &a), 0); /* a transient one too */
	ckpt_ino sl = a.ino;
	long freed0 = steps_freed(v);
	CHECK(freed0 >= 0);
	snprintf(p, sizeof(p), "rm -r '%s/5'", root);
	CHECK_EQ_INT(system(p), 0);
	CHECK_EQ_INT(count_entries(v, CKPT_ROOT_INO), 2); /* the rescan: 5 is gone (6 and latest) */
	CHECK_EQ_INT(ckpt_view_lookup(v, CKPT_ROOT_INO, "5", &a), -ENOENT);
	CHECK_EQ_INT(ckpt_view_lookup(v, ino[3], "embedding.npy", &a), -ESTALE);
	CHECK_EQ_INT(ckpt_view_getattr(v, ino[4], &a), -ESTALE);
	CHECK_EQ_INT(steps_freed(v), freed0); /* still referenced */
	ckpt_view_forget(v, sl, 1);
	for (int i = 0; i < 4; i++)
		ckpt_view_forget(v, ino[i], 1);
	CHECK_EQ_INT(steps_freed(v), freed0); /* embedding.npy is still referenced */
	CHECK_EQ_INT(ckpt_view_read(v, ino[4], 0, 6, head), -ESTALE);
	ckpt_view_forget(v, ino[4], 1);
	CHECK_EQ_INT(steps_freed(v), freed0 + 1);
	/* the numbers come back (to new slice names), each with a new generation */
	int reused = 0;
	for (int i = 0; i < 16; i++)
		for (int j = 0; j < 8; j++) {
			char nm[64];
			snprintf(nm, sizeof(nm), "embedding[%d:%d,%d:%d].npy", i, i + 1, j, j + 1);
			CHECK_EQ_INT(ckpt_view_lookup(v, emb, nm, &a), 0);
			for (int k = 0; k < 5; k++)
				if (a.ino == ino[k]) {
					CHECK(a.generation != gen[k]);
					reused++;
				}
		}
	CHECK_EQ_INT(reused, 5);
	CHECK(lookup(v, CKPT_ROOT_INO, "6/state/params/embed/embedding.npy") != 0);
	ckpt_view_destroy(v);
	snprintf(p, sizeof(p), "rm -rf '%s'", root);
	CHECK_EQ_INT(system(p), 0);
}

int main(void)
{
	alarm(120); /* a blocked call ends the test (SIGALRM) */
	CHECK_RUN(test_read_side);
	CHECK_RUN(test_commit_does_not_block_the_namespace);
	CHECK_RUN(test_sources_and_live_root);
	CHECK_RUN(test_pruned_step_is_freed);
	return CHECK_DONE();
}
