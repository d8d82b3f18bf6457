/*
 * main.c - options, mount, readiness signal, the request loop, teardown.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckfs.h"

#define CKPTFS_VERSION "0.1.0"

#define OPT(t, p, v)                                                                                         \
	{                                                                                                    \
		t, offsetof(struct ckfs_opts, p), v                                                          \
	}
static const struct fuse_opt opt_spec[] = { OPT("cache_size=%s", cache_size, 0),
					    OPT("threads=%d", threads, 0),
					    OPT("ready_fd=%d", ready_fd, 0),
					    OPT("show_companions", show_companions, 1),
					    OPT("read_ahead_kb=%d", read_ahead_kb, 0),
					    OPT("log_level=%s", log_level, 0),
					    OPT("safetensors_shard_size=%s", st_shard_size, 0),
					    OPT("zstd_level=%d", zstd_level, 0),
					    OPT("write_buffer=%s", write_buffer, 0),
					    FUSE_OPT_KEY("ro", 1000),
					    OPT("--help", show_help, 1),
					    OPT("-h", show_help, 1),
					    OPT("--version", show_version, 1),
					    OPT("-V", show_version, 1),
					    FUSE_OPT_END };

static void usage(const char *prog)
{
	printf("usage: %s [options] SOURCE MOUNTPOINT\n\n"
	       "Mount an Orbax checkpoint (a CheckpointManager root, one step, or one item folder)\n"
	       "read-only as a tree of .npy files.\n\n"
	       "ckptfs options:\n"
	       "    -o cache_size=SIZE      decoded-chunk cache budget, K/M/G suffix (default 256M)\n"
	       "    -o threads=N            decode threads (default: number of CPUs)\n"
	       "    -o ready_fd=N           write 's' (mounted) or 'f' (failed) to fd N, then close it\n"
	       "    -o show_companions      list NAME.shards/ and X.safetensors in directories\n"
	       "    -o read_ahead_kb=N      kernel read-ahead of the mount (default 1024; 0 keeps the "
	       "kernel's)\n"
	       "    -o safetensors_shard_size=SIZE  shard size of X.safetensors.d/ (default 5G)\n"
	       "    -o zstd_level=N         zstd level of written chunks (default 1)\n"
	       "    -o write_buffer=SIZE    buffered bytes per pending step before writers wait (default "
	       "RAM/8, 512M..2G)\n"
	       "    -o log_level=LEVEL      error, warning, info (default) or debug\n"
	       "    -h, --help              this help\n"
	       "    -V, --version           print the version\n\n",
	       prog);
	printf("FUSE options:\n");
	fuse_cmdline_help();
	fuse_lowlevel_help();
}

/* The first non-option argument is SOURCE; libfuse keeps the rest. */
static int opt_proc(void *data, const char *arg, int key, struct fuse_args *outargs)
{
	(void)outargs;
	struct ckfs_opts *o = data;
	if (key == 1000) { /* -o ro: note it, and pass it on to the kernel */
		o->read_only = 1;
		return 1;
	}
	if (key == FUSE_OPT_KEY_NONOPT && !o->source) {
		o->source = strdup(arg); /* resolved after parsing, when ready_fd is known */
		return o->source ? 0 : -1;
	}
	return 1;
}

static int parse_size(const char *s, uint64_t *out)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -1;
	uint64_t mul = 1;
	switch (*end) {
	case 'k':
	case 'K':
		mul = 1ull << 10;
		end++;
		break;
	case 'm':
	case 'M':
		mul = 1ull << 20;
		end++;
		break;
	case 'g':
	case 'G':
		mul = 1ull << 30;
		end++;
		break;
	case 't':
	case 'T':
		mul = 1ull << 40;
		end++;
		break;
	default:
		break;
	}
	if (*end == 'B' || *end == 'b')
		end++;
	if (*end || v > UINT64_MAX / mul)
		return -1;
	*out = v * mul;
	return 0;
}

static void signal_ready(int fd, char c)
{
	if (fd <= 0)
		return;
	if (write(fd, &c, 1) != 1)
		fprintf(stderr, "ckptfs: cannot write to ready_fd %d: %s\n", fd, strerror(errno));
	close(fd);
}

/* Raise the mount's kernel read-ahead so buffered reads arrive as 1 MiB
 * requests (fuse-guide.md B.3).  Best effort (needs root).  The device
 * number comes from /proc/self/mountinfo: stat() of the mountpoint would
 * ask this very daemon.  The kernel lowers the bdi value to the INIT
 * reply's max_readahead when INIT completes, so this runs on a helper
 * thread shortly after the loop has answered INIT. */
static void set_read_ahead_now(const char *mnt, int kb)
{
	if (kb <= 0)
		return;
	char *real = realpath(mnt, NULL);
	FILE *f = fopen("/proc/self/mountinfo", "re");
	if (!real || !f) {
		free(real);
		if (f)
			fclose(f);
		return;
	}
	char line[8192];
	unsigned maj = 0, min = 0;
	int found = 0;
	while (fgets(line, sizeof(line), f)) {
		unsigned a, b;
		char point[4096];
		/* id parent major:minor root mountpoint ... */
		if (sscanf(line, "%*u %*u %u:%u %*s %4095s", &a, &b, point) == 3 && !strcmp(point, real)) {
			maj = a;
			min = b;
			found = 1; /* keep the last: the newest mount on that point */
		}
	}
	fclose(f);
	free(real);
	if (!found)
		return;
	char path[128];
	snprintf(path, sizeof(path), "/sys/class/bdi/%u:%u/read_ahead_kb", maj, min);
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	char val[32];
	int n = snprintf(val, sizeof(val), "%d", kb);
	if (write(fd, val, (size_t)n) != n)
		ckpt_log(CKPT_LOG_DEBUG, "cannot set %s", path);
	close(fd);
}

struct ra_arg {
	char *mnt;
	int kb;
};

static void *read_ahead_thread(void *p)
{
	struct ra_arg *a = p;
	for (int i = 0; i < 3; i++) {
		usleep(100000);
		set_read_ahead_now(a->mnt, a->kb);
	}
	free(a->mnt);
	free(a);
	return NULL;
}

static void set_read_ahead(const char *mnt, int kb)
{
	struct ra_arg *a = malloc(sizeof(*a));
	if (!a)
		return;
	a->mnt = strdup(mnt);
	a->kb = kb;
	pthread_t t;
	if (!a->mnt || pthread_create(&t, NULL, read_ahead_thread, a) != 0) {
		free(a->mnt);
		free(a);
		return;
	}
	pthread_detach(t);
}

int main(int argc, char *argv[])
{
	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
	struct ckfs fs = { 0 };
	fs.opts.read_ahead_kb = 1024;
	fs.opts.ready_fd = -1;
	fs.ttl_immutable = 86400.0;
	struct fuse_cmdline_opts cl = { 0 };
	int ret = 1;

	if (fuse_opt_parse(&args, &fs.opts, opt_spec, opt_proc) == -1)
		goto out_ready;
	if (fs.opts.show_help) {
		usage(argv[0]);
		ret = 0;
		goto out_args;
	}
	if (fs.opts.show_version) {
		printf("ckptfs %s (libfuse %s)\n", CKPTFS_VERSION, fuse_pkgversion());
		ret = 0;
		goto out_args;
	}
	if (fuse_parse_cmdline(&args, &cl) != 0)
		goto out_ready;
	if (!fs.opts.source || !cl.mountpoint) {
		fprintf(stderr, "usage: %s [options] SOURCE MOUNTPOINT (see --help)\n", argv[0]);
		goto out_ready;
	}
	char *real = realpath(fs.opts.source, NULL);
	if (!real) {
		fprintf(stderr, "ckptfs: %s: %s\n", fs.opts.source, strerror(errno));
		goto out_ready;
	}
	free(fs.opts.source);
	fs.opts.source = real;
	if (fs.opts.log_level) {
		static const char *const lv[] = { "error", "warning", "info", "debug" };
		int found = -1;
		for (int i = 0; i < 4; i++)
			if (!strcmp(fs.opts.log_level, lv[i]))
				found = i;
		if (found < 0) {
			fprintf(stderr, "ckptfs: bad log_level '%s'\n", fs.opts.log_level);
			goto out_ready;
		}
		ckpt_log_set_level(found);
	}
	ckpt_view_opts vo = { 0 };
	vo.ctx.threads = fs.opts.threads;
	vo.show_companions = fs.opts.show_companions;
	vo.read_only = fs.opts.read_only;
	vo.zstd_level = fs.opts.zstd_level;
	if (fs.opts.write_buffer && parse_size(fs.opts.write_buffer, &vo.write_budget) < 0) {
		fprintf(stderr, "ckptfs: bad write_buffer '%s'\n", fs.opts.write_buffer);
		goto out_ready;
	}
	if (fs.opts.cache_size && parse_size(fs.opts.cache_size, &vo.ctx.cache_bytes) < 0) {
		fprintf(stderr, "ckptfs: bad cache_size '%s'\n", fs.opts.cache_size);
		goto out_ready;
	}
	if (fs.opts.st_shard_size && parse_size(fs.opts.st_shard_size, &vo.st_shard_bytes) < 0) {
		fprintf(stderr, "ckptfs: bad safetensors_shard_size '%s'\n", fs.opts.st_shard_size);
		goto out_ready;
	}
	int rc = ckpt_view_open(fs.opts.source, &vo, &fs.view);
	if (rc < 0) {
		fprintf(stderr, "ckptfs: %s: %s\n", fs.opts.source, strerror(-rc));
		goto out_ready;
	}
	ckpt_log(CKPT_LOG_INFO, "%s: mounted as a checkpoint %s", fs.opts.source, ckpt_view_kind(fs.view));

	struct fuse_session *se = fuse_session_new(&args, &ckfs_ops, sizeof(ckfs_ops), &fs);
	if (!se)
		goto out_view;
	if (fuse_set_signal_handlers(se) != 0)
		goto out_session;
	if (fuse_session_mount(se, cl.mountpoint) != 0)
		goto out_signals;
	/* No thread may start before this fork (the child would not have it). */
	if (fuse_daemonize(cl.foreground) != 0)
		goto out_unmount;
	set_read_ahead(cl.mountpoint, fs.opts.read_ahead_kb);
	signal_ready(fs.opts.ready_fd, 's');
	fs.opts.ready_fd = -1;

	if (cl.singlethread) {
		ret = fuse_session_loop(se);
	} else {
		struct fuse_loop_config *lc = fuse_loop_cfg_create();
		fuse_loop_cfg_set_clone_fd(lc, cl.clone_fd);
		fuse_loop_cfg_set_max_threads(lc, cl.max_threads > 0 ? cl.max_threads : 16);
		ret = fuse_session_loop_mt(se, lc);
		fuse_loop_cfg_destroy(lc);
	}
	ret = ret < 0 ? 1 : 0;
out_unmount:
	fuse_session_unmount(se);
out_signals:
	fuse_remove_signal_handlers(se);
out_session:
	fuse_session_destroy(se);
out_view:
	ckpt_view_destroy(fs.view);
out_ready:
	signal_ready(fs.opts.ready_fd, 'f');
	free(cl.mountpoint);
out_args:
	fuse_opt_free_args(&args);
	free(fs.opts.source);
	free(fs.opts.cache_size);
	free(fs.opts.st_shard_size);
	free(fs.opts.log_level);
	free(fs.opts.write_buffer);
	return ret;
}
