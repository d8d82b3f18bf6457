/*
 * main.c - options, mount, readiness signal, the request loop, teardown.
 */
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/un.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include "ckfs.h"
#include "cli.h"

#ifndef CKPT_VERSION
#error "CKPT_VERSION comes from CMake (project VERSION)"
#endif

#define OPT(t, p, v)                                                                                         \
	{                                                                                                    \
		t, offsetof(struct ckfs_opts, p), v                                                          \
	}
static const struct fuse_opt opt_spec[] = { OPT("cache_size=%s", cache_size, 0),
					    OPT("threads=%d", threads, 0),
					    OPT("ready_fd=%d", ready_fd, 0),
					    OPT("show_companions", show_companions, 1),
					    OPT("read_ahead_kb=%d", read_ahead_kb, 0),
					    OPT("direct_read", direct_read, 1),
					    OPT("log_level=%s", log_level, 0),
					    OPT("safetensors_shard_size=%s", st_shard_size, 0),
					    OPT("recipes=%s", recipes, 0),
					    OPT("zstd_level=%d", zstd_level, 0),
					    OPT("write_buffer=%s", write_buffer, 0),
					    OPT("log_file=%s", log_file, 0),
					    OPT("ready_file=%s", ready_file, 0),
					    OPT("uid=%d", uid, 0),
					    OPT("gid=%d", gid, 0),
					    OPT("umask=%s", umask, 0),
					    OPT("allow_other_writes", allow_other_writes, 1),
					    OPT("delete_steps", delete_steps, 1),
					    OPT("root", force_root, 1),
					    OPT("process_index=%d", process_index, 0),
					    OPT("process_count=%d", process_count, 0),
					    OPT("commit_timeout=%d", commit_timeout, 0),
					    OPT("nonempty", nonempty, 1),
					    OPT("-q", quiet, 1),
					    OPT("--quiet", quiet, 1),
					    OPT("quiet", quiet, 1),
					    FUSE_OPT_KEY("fsname=", 1001),
					    FUSE_OPT_KEY("subtype=", 1002),
					    FUSE_OPT_KEY("ro", 1000),
					    OPT("--help", show_help, 1),
					    OPT("-h", show_help, 1),
					    OPT("--version", show_version, 1),
					    OPT("-V", show_version, 1),
					    FUSE_OPT_END };

static void usage(const char *prog)
{
	printf("usage: %s [options] SOURCE MOUNTPOINT\n"
	       "       %s info [--json] SOURCE [PATH]\n"
	       "       %s verify SOURCE [STEP...]\n"
	       "       %s status [--json] [--watch] MOUNTPOINT\n\n"
	       "Mount an Orbax checkpoint (a CheckpointManager root, one step folder or one item\n"
	       "folder) as a tree of .npy files: STEP/ITEM/KEY/.../NAME.npy.  A CheckpointManager root\n"
	       "is writable: mkdir a new step, write .npy files into it, then create\n"
	       "STEP/commit_success.txt to commit it atomically (-o ro to refuse).  Committed steps\n"
	       "are read-only.\n\n"
	       "Hidden names (looked up by name, not listed unless -o show_companions):\n"
	       "    NAME[0:8,:].npy         a slice of an array as its own .npy (quote it in zsh)\n"
	       "    NAME.shards/            one .npy per stored shard or chunk\n"
	       "    NAME.f32.npy            a bfloat16/float8 array as float32, exactly (also slices)\n"
	       "    DIR.safetensors         every array under DIR as one safetensors file\n"
	       "    DIR.safetensors.d/      the same, in shards (-o safetensors_shard_size)\n"
	       "    STEP/.views/NAME/       STEP as another model family's folder (Hugging Face\n"
	       "                            safetensors + config.json) by view recipe NAME\n"
	       "    .ckptfs/stats           counters as JSON (cache, bytes, commits, errors)\n"
	       "    .ckptfs/log             the recent log lines (errors with their reasons)\n"
	       "    STEP/.ckptfs/summary.txt  the table of `ckptfs info SOURCE STEP` (.json: --json);\n"
	       "                            .ckptfs/summary.txt at the root of a one-step/item mount\n"
	       "Array files carry user.ckpt.* xattrs (dtype, shape, chunks, codec, stored_bytes).\n\n"
	       "Subcommands (no mount):\n"
	       "    info [--json] SOURCE [PATH]   steps, items and a table of arrays (metadata only)\n"
	       "    verify SOURCE [STEP...]       decode every chunk and check every checksum;\n"
	       "                                  exit status 1 when an array has a problem\n"
	       "    status [--json] [--watch] MNT pending steps of a mount (arrays declared, bytes\n"
	       "                                  stored), its counters; --watch repeats every second\n\n"
	       "ckptfs options:\n"
	       "    -o ro                   read-only: refuse new steps\n"
	       "    -o root                 use a non-empty SOURCE that is no checkpoint as a\n"
	       "                            CheckpointManager root (for new steps)\n"
	       "    -o cache_size=SIZE      decoded-chunk cache budget, K/M/G suffix (default 256M)\n"
	       "    -o threads=N            decode threads (default: number of CPUs)\n"
	       "    -o show_companions      list NAME.shards/ and X.safetensors in directories\n"
	       "    -o read_ahead_kb=N      kernel read-ahead of the mount (default 1024; 0 keeps the "
	       "kernel's)\n"
	       "    -o direct_read          read-only opens bypass the kernel page cache (less CPU per\n"
	       "                            byte for streaming readers; no warm re-reads; shared mmap\n"
	       "                            only where the kernel allows it, as logged at mount)\n"
	       "    -o safetensors_shard_size=SIZE  shard size of X.safetensors.d/ (default 5G)\n"
	       "    -o recipes=DIR          view recipes of DIR too (before the shipped ones)\n"
	       "    -o zstd_level=N         zstd level of written chunks (default 1)\n"
	       "    -o write_buffer=SIZE    buffered bytes per pending step before writers wait (default "
	       "RAM/8, 512M..2G)\n"
	       "    -o process_index=I,process_count=N  several hosts write each step over one shared\n"
	       "                            SOURCE; host 0 is the primary (docs/usage.md)\n"
	       "    -o commit_timeout=SEC   multi-host commit: wait this long for the other hosts (600)\n"
	       "    -o uid=N,gid=N          owner shown for every file (default: the mounting user)\n"
	       "    -o umask=OCT            show modes 0777/0666 & ~OCT (default 022: 0755 and 0644)\n"
	       "    -o delete_steps         let rm -r (and Orbax's max_to_keep) delete committed steps:\n"
	       "                            the first removal inside a step deletes all of it\n"
	       "    -o allow_other_writes   with allow_other: let other users write and commit steps\n"
	       "                            (default: EACCES for any uid but the mounting user's)\n"
	       "    -o endpoint=URL         s3://, gs:// SOURCE: the service's URL (MinIO, R2, a local\n"
	       "                            server; path-style requests)\n"
	       "    -o region=NAME          SigV4 region (default AWS_REGION, the profile's, us-east-1)\n"
	       "    -o profile=NAME         profile of ~/.aws/credentials and ~/.aws/config\n"
	       "    -o token_file=PATH      gs://: OAuth2 bearer token file (re-read when it changes)\n"
	       "    -o anonymous            send no credentials (public buckets)\n"
	       "    -o connections=N        HTTP requests in flight (default 16)\n"
	       "    -o retries=N            retries of a failed request (default 5)\n"
	       "    -o timeout_ms=N         per-attempt timeout (default 30000)\n"
	       "    -o retry_base_ms=N      first backoff, doubled per retry (default 100)\n"
	       "    -o cache_dir=PATH       keep fetched object ranges in PATH across remounts; new\n"
	       "                            steps are staged there too (default: not kept; $TMPDIR)\n"
	       "    -o cache_dir_size=SIZE  bound of cache_dir, K/M/G suffix (default 10G)\n"
	       "                            Credentials come only from the environment and the AWS or\n"
	       "                            Google files, never from options (see ckptfs(1)).\n"
	       "    -o log_level=LEVEL      error, warning, info (default) or debug\n"
	       "    -o log_file=PATH        log to PATH (default: stderr in the foreground, syslog\n"
	       "                            with ident ckptfs once daemonized; without a syslog\n"
	       "                            daemon, $XDG_RUNTIME_DIR/ckptfs.log or /tmp/ckptfs-UID.log)\n"
	       "    -o ready_file=PATH      write the daemon's PID to PATH once the mount is ready\n"
	       "    -o ready_fd=N           write 's' (mounted) or 'f' (failed) to fd N, then close it\n"
	       "    -o nonempty             mount even over a non-empty folder or a mount point (its\n"
	       "                            files are hidden until the unmount; refused otherwise)\n"
	       "    -q, --quiet, -o quiet   print no line on a successful mount (quiet: for fstab)\n"
	       "    --foreground, --read-only, --allow-other, --log-file=PATH\n"
	       "                            GNU long forms of -f, -o ro, -o allow_other, -o log_file\n"
	       "    -h, --help              this help\n"
	       "    -V, --version           print the version\n\n"
	       "fsname=SOURCE and subtype=ckptfs are set unless given.  mount -t fuse.ckptfs and\n"
	       "/etc/fstab work through mount.fuse3.  Exit status: 0 success, 1 failure.\n"
	       "See ckptfs(1).\n\n",
	       prog, prog, prog, prog);
	printf("FUSE options:\n");
	fuse_cmdline_help();
	fuse_lowlevel_help();
}

/* Options of an object-store SOURCE (-o endpoint=..., see store.h); the
 * values they borrow live in store_vals until exit. */
static struct ckpt_store_opts store_opts;
static char *store_vals[32];
static unsigned n_store_vals;
static int store_opt_bad;
static char *spool_dir; /* object-store root: pending steps staged here (removed at exit) */

/* 1 when `arg` ("key" or "key=value") is a store option (taken), 0 when not. */
static int store_opt(const char *arg)
{
	const char *eq = strchr(arg, '=');
	char key[64];
	size_t kl = eq ? (size_t)(eq - arg) : strlen(arg);
	if (kl >= sizeof(key) || n_store_vals >= sizeof(store_vals) / sizeof(store_vals[0]))
		return 0;
	memcpy(key, arg, kl);
	key[kl] = 0;
	char *val = eq ? strdup(eq + 1) : NULL;
	if (eq && !val)
		return 0;
	int rc = ckpt_store_opts_set(&store_opts, key, val);
	if (rc == 1) {
		if (val)
			store_vals[n_store_vals++] = val;
		return 1;
	}
	free(val);
	if (rc < 0) {
		fprintf(stderr, "ckptfs: bad value in -o %s\n", key); /* never echo a value */
		store_opt_bad = 1;
		return 1;
	}
	return 0;
}

/* The first non-option argument is SOURCE; libfuse keeps the rest. */
static int opt_proc(void *data, const char *arg, int key, struct fuse_args *outargs)
{
	(void)outargs;
	struct ckfs_opts *o = data;
	if (key == FUSE_OPT_KEY_OPT && store_opt(arg))
		return 0;
	if (key == 1000) { /* -o ro: note it, and pass it on to the kernel */
		o->read_only = 1;
		return 1;
	}
	if (key == 1001 || key == 1002) { /* the user's own: keep them */
		*(key == 1001 ? &o->has_fsname : &o->has_subtype) = 1;
		return 1;
	}
	if (key == FUSE_OPT_KEY_NONOPT && !o->source) {
		o->source = strdup(arg); /* resolved after parsing, when ready_fd is known */
		return o->source ? 0 : -1;
	}
	return 1;
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
 * requests: the kernel sizes buffered reads by the mount's bdi read_ahead_kb
 * (128 by default) and the daemon can only lower it through
 * conn->max_readahead.  Best effort (needs root).  The device number comes
 * from /proc/self/mountinfo: stat() of the mountpoint would ask this very
 * daemon.  The kernel lowers the bdi value to the INIT reply's
 * max_readahead while that reply is written, so this runs after
 * answer_init. */
static void set_read_ahead(const char *mnt, int kb)
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

/* Answer the kernel's INIT request here, before the loop starts and before
 * fuse_daemonize forks (no thread is started): once its reply is written
 * the kernel has applied it to the mount, so set_read_ahead can follow at
 * once, before anyone is told the mount is ready.  (Set from a thread after
 * the loop had answered INIT, a reader that began right away read its first
 * tenths of a second in 128 KiB requests.)  0, or -1 when no INIT came. */
static int answer_init(struct fuse_session *se, const struct ckfs *fs)
{
	struct fuse_buf buf = { .mem = NULL };
	int rc;
	do
		rc = fuse_session_receive_buf(se, &buf);
	while (rc == -EINTR);
	if (rc > 0)
		fuse_session_process_buf(se, &buf);
	free(buf.mem);
	return rc > 0 && fs->init_done ? 0 : -1;
}

/* ---- log sinks: a file (log_file=) or syslog once daemonized ---- */

static int log_fd = -1;

static void file_sink(int level, const char *msg)
{
	char line[1200];
	struct timespec ts;
	struct tm tm;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	int n = snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ ckptfs[%d]: %s: %s\n",
			 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
			 ts.tv_nsec / 1000000, (int)getpid(), ckpt_log_level_name(level), msg);
	if (n < 0)
		return;
	if ((size_t)n >= sizeof(line)) {
		n = sizeof(line) - 1;
		line[n - 1] = '\n';
	}
	/* O_APPEND: one write per line, whole lines from concurrent threads. */
	if (write(log_fd, line, (size_t)n) < 0)
		return;
}

static int log_foreground;
static char *log_dest; /* where the log goes, in words (the mount line) */

static void file_and_stderr_sink(int level, const char *msg)
{
	file_sink(level, msg);
	if (log_foreground)
		fprintf(stderr, "ckptfs: %s: %s\n", ckpt_log_level_name(level), msg);
}

static void syslog_sink(int level, const char *msg)
{
	static const int prio[] = { LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG };
	syslog(prio[level < 0 ? 0 : level > 3 ? 3 : level], "%s", msg);
}

/* 1 when a syslog daemon listens on /dev/log (often none in a container:
 * syslog(3) would then drop every line without a word). */
static int syslog_listens(void)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX, .sun_path = "/dev/log" };
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return 0;
	int ok = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
	close(fd);
	return ok;
}

/* The log file of a daemon in the background without syslog and without
 * -o log_file: $XDG_RUNTIME_DIR/ckptfs.log, else /tmp/ckptfs-UID.log.  The
 * file must be a regular file of ours (not a link someone planted).
 * Opens log_fd; the path (malloc'd) or NULL. */
static char *open_default_log(void)
{
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	struct stat st;
	char *path = NULL;
	if (xdg && xdg[0] == '/' && stat(xdg, &st) == 0 && S_ISDIR(st.st_mode)) {
		if (asprintf(&path, "%s/ckptfs.log", xdg) < 0)
			return NULL;
	} else if (asprintf(&path, "/tmp/ckptfs-%u.log", (unsigned)geteuid()) < 0) {
		return NULL;
	}
	int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
		if (fd >= 0)
			close(fd);
		free(path);
		return NULL;
	}
	log_fd = fd;
	return path;
}

/* Absolute form of a path given on the command line (the daemon changes
 * to / when it goes to the background). */
static char *abs_path(const char *p)
{
	if (p[0] == '/')
		return strdup(p);
	char cwd[4096];
	if (!getcwd(cwd, sizeof(cwd)))
		return NULL;
	size_t len = strlen(cwd) + strlen(p) + 2;
	char *out = malloc(len);
	if (out)
		snprintf(out, len, "%s/%s", cwd, p);
	return out;
}

/* ready_file: written to PATH.tmp then renamed, so whoever waits for PATH
 * never sees it half written. */
static int write_ready_file(const char *path)
{
	size_t len = strlen(path) + 8;
	char *tmp = malloc(len);
	if (!tmp)
		return -ENOMEM;
	snprintf(tmp, len, "%s.tmp", path);
	int rc = 0;
	FILE *f = fopen(tmp, "we");
	if (!f || fprintf(f, "%d\n", (int)getpid()) < 0)
		rc = -errno;
	if (f && fclose(f) != 0 && rc == 0)
		rc = -errno;
	if (rc == 0 && rename(tmp, path) != 0)
		rc = -errno;
	if (rc < 0) {
		ckpt_log(CKPT_LOG_ERR, "ready_file %s: %s", path, strerror(-rc));
		unlink(tmp);
	}
	free(tmp);
	return rc;
}

/* ---- the mount point: refuse one whose files the mount would hide ---- */

/* Names whose presence marks a folder as a checkpoint (or part of one). */
static const char *const ckpt_marks[] = { "commit_success.txt", "_CHECKPOINT_METADATA",
					  "_METADATA",		"manifest.ocdbt",
					  "_sharding",		".zarray",
					  "zarr.json",		"checkpoint",
					  "model.safetensors" };

/* The entries of dir but . and ..: their count (the first ones' names,
 * comma-separated, in names), or -errno.  *ckpt is set when one looks like
 * part of a checkpoint: a marker file or a step folder (digits only). */
static long dir_entries(const char *dir, char *names, size_t cap, int *ckpt)
{
	DIR *d = opendir(dir);
	if (!d)
		return -errno;
	long n = 0;
	size_t used = 0;
	struct dirent *e;
	names[0] = 0;
	*ckpt = 0;
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (n < 3 && used + strlen(e->d_name) + 3 < cap)
			used += (size_t)snprintf(names + used, cap - used, "%s%s", n ? ", " : "", e->d_name);
		n++;
		size_t k = strspn(e->d_name, "0123456789");
		if (k && !e->d_name[k])
			*ckpt = 1;
		for (size_t i = 0; i < sizeof(ckpt_marks) / sizeof(ckpt_marks[0]); i++)
			if (!strcmp(e->d_name, ckpt_marks[i]))
				*ckpt = 1;
	}
	closedir(d);
	return n;
}

/* 1 when `real` (a resolved path) is a mount point of this namespace. */
static int is_mount_point(const char *real)
{
	FILE *f = fopen("/proc/self/mountinfo", "re");
	if (!f)
		return 0;
	char line[8192];
	int found = 0;
	while (!found && fgets(line, sizeof(line), f)) {
		char point[4096], un[4096];
		if (sscanf(line, "%*u %*u %*s %*s %4095s", point) != 1)
			continue;
		size_t o = 0; /* mountinfo writes blanks and backslashes as \ooo */
		for (const char *c = point; *c && o + 1 < sizeof(un); c++) {
			if (c[0] == '\\' && c[1] >= '0' && c[1] <= '3' && c[2] && c[3]) {
				un[o++] = (char)((c[1] - '0') * 64 + (c[2] - '0') * 8 + (c[3] - '0'));
				c += 3;
			} else {
				un[o++] = *c;
			}
		}
		un[o] = 0;
		found = !strcmp(un, real);
	}
	fclose(f);
	return found;
}

/* After libfuse refused the mount point: when the last argument (the
 * MOUNTPOINT) is a FUSE mount whose daemon is gone, say what to do. */
static void hint_dead_mount(int argc, char **argv)
{
	const char *mnt = argc >= 2 ? argv[argc - 1] : NULL;
	struct stat st;
	if (mnt && mnt[0] != '-' && stat(mnt, &st) != 0 && errno == ENOTCONN)
		fprintf(stderr,
			"ckptfs: MOUNTPOINT %s is a FUSE mount whose daemon is gone (Transport endpoint is "
			"not "
			"connected): fusermount3 -u %s first\n",
			mnt, mnt);
}

/*
 * 0 when mnt may be mounted on: an empty folder that is no mount point yet
 * (or anything, with -o nonempty).  Else prints why, and what to do, and
 * returns -1.  A mount over a folder hides its files until the unmount; a
 * swap of SOURCE and MOUNTPOINT would hide the very checkpoint.
 */
static int check_mountpoint(const char *mnt, const char *source, int nonempty)
{
	if (nonempty || !strncmp(mnt, "/dev/fd/", 8)) /* libfuse's pre-opened /dev/fuse */
		return 0;
	struct stat st;
	if (stat(mnt, &st) != 0 && errno == ENOTCONN) {
		hint_dead_mount(2, (char *[]){ NULL, (char *)mnt });
		return -1;
	}
	if (is_mount_point(mnt)) {
		fprintf(stderr,
			"ckptfs: MOUNTPOINT %s is already a mount point: unmount it first (fusermount3 -u "
			"%s), "
			"or add -o nonempty to mount over it\n",
			mnt, mnt);
		return -1;
	}
	char names[256];
	int ckpt = 0, src_ckpt = 0;
	long n = dir_entries(mnt, names, sizeof(names), &ckpt);
	if (n < 0) {
		fprintf(stderr, "ckptfs: MOUNTPOINT %s: %s\n", mnt, strerror((int)-n));
		return -1;
	}
	if (n == 0)
		return 0;
	char snames[8];
	long sn = ckpt_store_source_is_remote(source)
			  ? 1
			  : dir_entries(source, snames, sizeof(snames), &src_ckpt);
	if (ckpt && sn == 0)
		fprintf(stderr,
			"ckptfs: MOUNTPOINT %s holds a checkpoint and SOURCE %s is empty: did you swap "
			"SOURCE "
			"and MOUNTPOINT? (usage: ckptfs [options] SOURCE MOUNTPOINT)\n",
			mnt, source);
	else
		fprintf(stderr,
			"ckptfs: MOUNTPOINT %s is not empty (%ld entr%s: %s%s): the mount would hide %s; use "
			"an "
			"empty folder, or add -o nonempty to mount over it\n",
			mnt, n, n == 1 ? "y" : "ies", names, n > 3 ? ", ..." : "", n == 1 ? "it" : "them");
	return -1;
}

/* ---- GNU long forms, and "did you mean" for a mistyped name ---- */

static char *alias_made[16]; /* the -o strings long_aliases made (freed at exit) */
static unsigned n_alias_made;

/* argv with the GNU long forms rewritten as their libfuse/-o forms:
 * --foreground -f, --read-only -o ro, --allow-other -o allow_other,
 * --log-file=PATH (or --log-file PATH) -o log_file=PATH.  NULL when out of
 * memory (or past 16 --log-file); the strings of the result are argv's,
 * static, or in alias_made. */
static char **long_aliases(int *argc, char **argv)
{
	char **out = calloc(2 * (size_t)*argc + 1, sizeof(*out));
	if (!out)
		return NULL;
	static char f[] = "-f", o[] = "-o", ro[] = "ro", ao[] = "allow_other";
	int n = 0;
	for (int i = 0; i < *argc; i++) {
		const char *a = argv[i];
		if (i && !strcmp(a, "--")) { /* the rest are names */
			while (i < *argc)
				out[n++] = argv[i++];
			break;
		}
		if (i && !strcmp(a, "--foreground")) {
			out[n++] = f;
		} else if (i && !strcmp(a, "--read-only")) {
			out[n++] = o;
			out[n++] = ro;
		} else if (i && !strcmp(a, "--allow-other")) {
			out[n++] = o;
			out[n++] = ao;
		} else if (i &&
			   (!strncmp(a, "--log-file=", 11) || (!strcmp(a, "--log-file") && i + 1 < *argc))) {
			const char *path = a[10] == '=' ? a + 11 : argv[++i];
			char *kv = NULL, *opt = NULL;
			if (asprintf(&kv, "log_file=%s", path) < 0 ||
			    fuse_opt_add_opt_escaped(&opt, kv) == -1) {
				free(kv);
				free(out);
				return NULL;
			}
			free(kv);
			if (n_alias_made == sizeof(alias_made) / sizeof(alias_made[0])) {
				free(opt);
				free(out);
				return NULL;
			}
			alias_made[n_alias_made++] = opt;
			out[n++] = o;
			out[n++] = opt;
		} else {
			out[n++] = argv[i];
		}
	}
	out[n] = NULL;
	*argc = n;
	return out;
}

/* The -o names ckptfs and libfuse know (for "did you mean"). */
static const char *const known_opts[] = { "cache_size",
					  "threads",
					  "ready_fd",
					  "show_companions",
					  "read_ahead_kb",
					  "direct_read",
					  "log_level",
					  "safetensors_shard_size",
					  "zstd_level",
					  "write_buffer",
					  "log_file",
					  "ready_file",
					  "uid",
					  "gid",
					  "umask",
					  "allow_other_writes",
					  "delete_steps",
					  "root",
					  "process_index",
					  "process_count",
					  "commit_timeout",
					  "nonempty",
					  "quiet",
					  "fsname",
					  "subtype",
					  "ro",
					  "rw",
					  "allow_other",
					  "allow_root",
					  "auto_unmount",
					  "default_permissions",
					  "max_read",
					  "blkdev",
					  "blksize",
					  "nosuid",
					  "suid",
					  "nodev",
					  "dev",
					  "noexec",
					  "exec",
					  "noatime",
					  "relatime",
					  "sync",
					  "async",
					  "dirsync",
					  "clone_fd",
					  "max_threads",
					  "max_idle_threads",
					  "endpoint",
					  "region",
					  "profile",
					  "token_file",
					  "anonymous",
					  "connections",
					  "retries",
					  "timeout_ms",
					  "cache_dir",
					  "cache_dir_size",
					  "retry_base_ms" };

/* After libfuse refused the command line: a hint for each -o name that
 * looks like a known one mistyped. */
static void hint_options(const struct fuse_args *args)
{
	for (int i = 1; i < args->argc; i++) {
		const char *list = NULL;
		if (!strcmp(args->argv[i], "-o") && i + 1 < args->argc)
			list = args->argv[++i];
		else if (!strncmp(args->argv[i], "-o", 2))
			list = args->argv[i] + 2;
		if (!list)
			continue;
		char *copy = strdup(list), *save = NULL;
		for (char *o = copy ? strtok_r(copy, ",", &save) : NULL; o; o = strtok_r(NULL, ",", &save)) {
			o[strcspn(o, "=")] = 0;
			int known = 0;
			for (size_t k = 0; k < sizeof(known_opts) / sizeof(known_opts[0]); k++)
				known |= !strcmp(o, known_opts[k]);
			const char *m = known ? NULL
					      : cli_did_you_mean(o, known_opts,
								 sizeof(known_opts) / sizeof(known_opts[0]));
			if (m)
				fprintf(stderr, "ckptfs: unknown option -o %s: did you mean -o %s?\n", o, m);
		}
		free(copy);
	}
}

/* The line printed on a successful mount (-q: none): what, where, the
 * log and how to unmount.  Before the fork: flushed. */
static void mount_line(struct ckfs *fs, const char *mnt, const char *log)
{
	const char *kind = ckpt_view_kind(fs->view);
	char what[96];
	if (!strcmp(kind, "root")) {
		unsigned long steps = 0;
		const char *name;
		ckpt_attr a;
		for (uint64_t i = 0; ckpt_view_readdir(fs->view, CKPT_ROOT_INO, i, &name, &a) > 0; i++)
			if (a.is_dir && name[0] && !name[strspn(name, "0123456789")])
				steps++;
		snprintf(what, sizeof(what), "CheckpointManager root, %lu step%s", steps,
			 steps == 1 ? "" : "s");
	} else {
		snprintf(what, sizeof(what), "one %s", kind);
	}
	printf("ckptfs: mounted %s on %s (%s, %s); log: %s; unmount: fusermount3 -u %s\n", fs->opts.source,
	       mnt, what, fs->writable ? "writable" : "read-only",
	       log ? log : "none (no syslog: add -o log_file=PATH)", mnt);
	fflush(stdout);
}

static int parse_options(struct ckfs *fs, struct fuse_args *args)
{
	struct ckfs_opts *o = &fs->opts;
	fs->owner_uid = getuid();
	fs->show_uid = o->uid >= 0 ? (uid_t)o->uid : getuid();
	fs->show_gid = o->gid >= 0 ? (gid_t)o->gid : getgid();
	/* 0755 folders, 0644 files, as rclone, s3fs and gcsfuse show them:
	 * copies out of the mount (cp -r, rsync, tar) stay writable */
	fs->have_umask = 1;
	fs->umask_bits = 022;
	if (o->umask) {
		char *end;
		errno = 0;
		unsigned long m = strtoul(o->umask, &end, 8);
		if (errno || end == o->umask || *end || m > 0777) {
			fprintf(stderr, "ckptfs: bad umask '%s' (octal, e.g. 022)\n", o->umask);
			return -1;
		}
		fs->have_umask = 1;
		fs->umask_bits = (unsigned)m;
	}
	if (o->log_level) {
		static const char *const lv[] = { "error", "warning", "info", "debug" };
		int found = -1;
		for (int i = 0; i < 4; i++)
			if (!strcmp(o->log_level, lv[i]))
				found = i;
		if (found < 0) {
			fprintf(stderr, "ckptfs: bad log_level '%s'\n", o->log_level);
			return -1;
		}
		ckpt_log_set_level(found);
	}
	if (o->ready_file) {
		char *a = abs_path(o->ready_file);
		if (!a)
			return -1;
		free(o->ready_file);
		o->ready_file = a;
	}
	if (o->log_file) {
		log_fd = open(o->log_file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
		if (log_fd < 0) {
			fprintf(stderr, "ckptfs: log_file %s: %s\n", o->log_file, strerror(errno));
			return -1;
		}
	}
	/* fsname=SOURCE, subtype=ckptfs: findmnt and df name the checkpoint. */
	if (!o->has_fsname) {
		char *opt = NULL;
		size_t len = strlen(o->source) + 8;
		char *kv = malloc(len);
		if (!kv)
			return -1;
		snprintf(kv, len, "fsname=%s", o->source);
		int rc = fuse_opt_add_opt_escaped(&opt, kv);
		free(kv);
		if (rc == -1 || fuse_opt_add_arg(args, "-o") == -1 || fuse_opt_add_arg(args, opt) == -1) {
			free(opt);
			return -1;
		}
		free(opt);
	}
	if (!o->has_subtype && fuse_opt_add_arg(args, "-osubtype=ckptfs") == -1)
		return -1;
	return 0;
}

int main(int argc, char *argv[])
{
	if (argc >= 2 && !strcmp(argv[1], "info"))
		return ckfs_cmd_info(argc - 1, argv + 1);
	if (argc >= 2 && !strcmp(argv[1], "verify"))
		return ckfs_cmd_verify(argc - 1, argv + 1);
	if (argc >= 2 && !strcmp(argv[1], "status"))
		return ckfs_cmd_status(argc - 1, argv + 1);
	if (argc >= 2 && argv[1][0] != '-' && access(argv[1], F_OK) != 0) {
		static const char *const subs[] = { "info", "verify", "status" };
		const char *m = cli_did_you_mean(argv[1], subs, 3);
		if (m) {
			fprintf(stderr,
				"ckptfs: %s: no such subcommand or SOURCE; did you mean 'ckptfs %s'?\n",
				argv[1], m);
			return 1;
		}
	}
	char **av = long_aliases(&argc, argv);
	if (!av) {
		fprintf(stderr, "ckptfs: out of memory\n");
		return 1;
	}
	argv = av;

	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
	struct ckfs fs = { 0 };
	fs.opts.read_ahead_kb = 1024;
	fs.opts.ready_fd = -1;
	fs.opts.uid = -1;
	fs.opts.gid = -1;
	fs.ttl_immutable = 86400.0;
	struct fuse_cmdline_opts cl = { 0 };
	struct fuse_session *se = NULL;
	int ret = 1;

	if (fuse_opt_parse(&args, &fs.opts, opt_spec, opt_proc) == -1)
		goto out_ready;
	if (fs.opts.show_help) {
		usage(argv[0]);
		ret = 0;
		goto out_args;
	}
	if (fs.opts.show_version) {
		printf("ckptfs %s (libfuse %s)\n", CKPT_VERSION, fuse_pkgversion());
		ret = 0;
		goto out_args;
	}
	if (fuse_parse_cmdline(&args, &cl) != 0) {
		hint_dead_mount(argc, argv);
		goto out_ready;
	}
	if (!fs.opts.source || !cl.mountpoint) {
		fprintf(stderr, "usage: %s [options] SOURCE MOUNTPOINT (see --help)\n", argv[0]);
		goto out_ready;
	}
	if (store_opt_bad)
		goto out_ready;
	if (!ckpt_store_source_is_remote(fs.opts.source)) { /* an object store has no local path */
		char *real = realpath(fs.opts.source, NULL);
		if (!real) {
			fprintf(stderr, "ckptfs: %s: %s\n", fs.opts.source, strerror(errno));
			goto out_ready;
		}
		free(fs.opts.source);
		fs.opts.source = real;
	}
	if (check_mountpoint(cl.mountpoint, fs.opts.source, fs.opts.nonempty) < 0)
		goto out_ready;
	if (parse_options(&fs, &args) < 0)
		goto out_ready;
	ckpt_view_opts vo = { 0 };
	vo.ctx.threads = fs.opts.threads;
	vo.show_companions = fs.opts.show_companions;
	vo.delete_steps = fs.opts.delete_steps;
	vo.read_only = fs.opts.read_only;
	vo.force_root = fs.opts.force_root;
	vo.zstd_level = fs.opts.zstd_level;
	if (fs.opts.recipes) { /* read after the daemon changed directory: absolute paths */
		size_t ndirs = 1, n = 0;
		for (const char *c = fs.opts.recipes; *c; c++)
			ndirs += *c == ':';
		size_t cap = ndirs * (PATH_MAX + 1) + 1;
		char *abs = calloc(1, cap), *save = NULL;
		for (char *d = abs ? strtok_r(fs.opts.recipes, ":", &save) : NULL; d;
		     d = strtok_r(NULL, ":", &save)) {
			char *r = realpath(d, NULL);
			int w = snprintf(abs + n, cap - n, "%s%s", n ? ":" : "", r ? r : d);
			if (w > 0 && (size_t)w < cap - n)
				n += (size_t)w;
			free(r);
		}
		free(fs.opts.recipes);
		fs.opts.recipes = abs;
	}
	vo.recipe_dirs = fs.opts.recipes;
	if (fs.opts.process_count < 0 || fs.opts.process_index < 0 || fs.opts.commit_timeout < 0 ||
	    (fs.opts.process_index && fs.opts.process_index >= fs.opts.process_count)) {
		fprintf(stderr, "ckptfs: process_index must be in [0, process_count)\n");
		goto out_ready;
	}
	if (fs.opts.process_count > 1 && ckpt_store_source_is_remote(fs.opts.source)) {
		fprintf(stderr,
			"ckptfs: process_count needs a shared folder as SOURCE, not an object store\n");
		goto out_ready;
	}
	vo.process_index = fs.opts.process_index;
	vo.process_count = fs.opts.process_count;
	vo.commit_timeout_s = (unsigned)fs.opts.commit_timeout;
	vo.store = &store_opts;
	if (ckpt_store_source_is_remote(fs.opts.source) && !fs.opts.read_only) {
		/* new steps are staged in a local spool folder, uploaded at commit */
		const char *tmp = store_opts.cache_dir ? store_opts.cache_dir : getenv("TMPDIR");
		if (store_opts.cache_dir && mkdir(store_opts.cache_dir, 0700) != 0 && errno != EEXIST)
			tmp = NULL; /* reported by the store */
		if (asprintf(&spool_dir, "%s/ckptfs-spool-XXXXXX", tmp && *tmp ? tmp : "/tmp") < 0) {
			spool_dir = NULL;
			goto out_ready;
		}
		if (!mkdtemp(spool_dir)) {
			fprintf(stderr, "ckptfs: spool folder %s: %s\n", spool_dir, strerror(errno));
			free(spool_dir);
			spool_dir = NULL;
			goto out_ready;
		}
		vo.spool_dir = spool_dir;
	}
	if (ckpt_store_source_is_remote(fs.opts.source) && vo.ctx.threads <= 0) {
		/* requests wait on the network, not the CPU: twice the connections, so
		 * that reads queue for a connection and adjacent ones are merged */
		long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
		int want = 2 * (int)(store_opts.connections ? store_opts.connections : 16);
		vo.ctx.threads = ncpu > want ? (int)ncpu : want;
	}
	if (fs.opts.write_buffer && ckpt_parse_size(fs.opts.write_buffer, &vo.write_budget) < 0) {
		fprintf(stderr, "ckptfs: bad write_buffer '%s'\n", fs.opts.write_buffer);
		goto out_ready;
	}
	if (fs.opts.cache_size && ckpt_parse_size(fs.opts.cache_size, &vo.ctx.cache_bytes) < 0) {
		fprintf(stderr, "ckptfs: bad cache_size '%s'\n", fs.opts.cache_size);
		goto out_ready;
	}
	if (fs.opts.st_shard_size && ckpt_parse_size(fs.opts.st_shard_size, &vo.st_shard_bytes) < 0) {
		fprintf(stderr, "ckptfs: bad safetensors_shard_size '%s'\n", fs.opts.st_shard_size);
		goto out_ready;
	}
	/* The session first: it refuses unknown options before any work. */
	struct fuse_args seen = FUSE_ARGS_INIT(0, NULL); /* libfuse frees args on failure */
	for (int i = 0; i < args.argc; i++)
		fuse_opt_add_arg(&seen, args.argv[i]);
	se = fuse_session_new(&args, &ckfs_ops, sizeof(ckfs_ops), &fs);
	if (!se)
		hint_options(&seen);
	fuse_opt_free_args(&seen);
	if (!se)
		goto out_ready;
	int rc = ckpt_view_open(fs.opts.source, &vo, &fs.view);
	if (rc < 0) {
		fprintf(stderr, "ckptfs: %s: %s\n", fs.opts.source, strerror(-rc));
		goto out_session;
	}
	fs.writable = !fs.opts.read_only && !strcmp(ckpt_view_kind(fs.view), "root");
	/* where the log goes: -o log_file, stderr in the foreground, syslog
	 * when a daemon listens on /dev/log, else a default file */
	int use_syslog = 0;
	if (log_fd >= 0) {
		log_dest = abs_path(fs.opts.log_file);
	} else if (cl.foreground) {
		log_dest = strdup("stderr");
	} else if (syslog_listens()) {
		use_syslog = 1;
		log_dest = strdup("syslog (journalctl -t ckptfs)");
	} else {
		log_dest = open_default_log();
	}
	if (fuse_set_signal_handlers(se) != 0)
		goto out_view;
	if (fuse_session_mount(se, cl.mountpoint) != 0)
		goto out_signals;
	if (fs.opts.direct_read && ckfs_devio_install(se) != 0) {
		fprintf(stderr, "ckptfs: cannot set the session's device I/O for -o direct_read\n");
		goto out_unmount;
	}
	if (answer_init(se, &fs) != 0) {
		fprintf(stderr, "ckptfs: the kernel's INIT request could not be answered\n");
		goto out_unmount;
	}
	set_read_ahead(cl.mountpoint, fs.opts.read_ahead_kb);
	if (!fs.opts.quiet)
		mount_line(&fs, cl.mountpoint, log_dest);
	/* No thread may start before this fork (the child would not have it). */
	if (fuse_daemonize(cl.foreground) != 0)
		goto out_unmount;
	if (ckfs_inval_start(se, fs.view) != 0)
		goto out_unmount;
	/* stderr is /dev/null from here on unless in the foreground. */
	log_foreground = cl.foreground;
	if (log_fd >= 0) {
		ckpt_log_set_sink(file_and_stderr_sink);
	} else if (use_syslog) {
		openlog("ckptfs", LOG_PID | LOG_NDELAY, LOG_DAEMON);
		ckpt_log_set_sink(syslog_sink);
	}
	ckpt_log(CKPT_LOG_INFO, "%s: mounted on %s as a checkpoint %s%s; log: %s", fs.opts.source,
		 cl.mountpoint, ckpt_view_kind(fs.view), fs.writable ? " (writable)" : " (read-only)",
		 log_dest ? log_dest : "none (no syslog, no file: add -o log_file=PATH)");
	if (fs.opts.ready_file)
		write_ready_file(fs.opts.ready_file);
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
	ckpt_log(CKPT_LOG_INFO, "%s: unmounted from %s", fs.opts.source, cl.mountpoint);
	if (fs.opts.ready_file)
		unlink(fs.opts.ready_file);
out_unmount:
	fuse_session_unmount(se);
	ckfs_inval_stop(); /* after the unmount: a pending invalidation cannot block it */
out_signals:
	fuse_remove_signal_handlers(se);
out_view:
	ckpt_view_destroy(fs.view);
out_session:
	fuse_session_destroy(se);
out_ready:
	signal_ready(fs.opts.ready_fd, 'f');
	free(cl.mountpoint);
out_args:
	ckpt_log_set_sink(NULL);
	if (log_fd >= 0)
		close(log_fd);
	fuse_opt_free_args(&args);
	free(fs.opts.source);
	free(fs.opts.cache_size);
	free(fs.opts.st_shard_size);
	free(fs.opts.recipes);
	free(fs.opts.log_level);
	free(fs.opts.write_buffer);
	free(fs.opts.log_file);
	free(fs.opts.ready_file);
	free(fs.opts.umask);
	for (unsigned i = 0; i < n_store_vals; i++)
		free(store_vals[i]);
	if (spool_dir)
		ckpt_rmtree(spool_dir);
	free(spool_dir);
	free(av);
	for (unsigned i = 0; i < n_alias_made; i++)
		free(alias_made[i]);
	free(log_dest);
	return ret;
}
