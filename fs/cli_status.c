/*
 * cli_status.c - `ckptfs status [--json] [--watch [--interval S] [--count N]]
 * MOUNTPOINT`: what a running mount is doing.  Reads the mount's
 * .ckptfs/stats (bytes received, compressed and stored, buffered bytes,
 * commits, cache counters, errors), the pending steps (a step being
 * written is a <step>.orbax-checkpoint-tmp folder of SOURCE; SOURCE comes
 * from /proc/self/mountinfo, where fsname=SOURCE puts it) with the arrays
 * declared in the mount and the bytes stored so far in the tmp folder.
 * --watch redraws on a terminal (plain blocks otherwise).
 *
 * Exit status: 0, 1 when MOUNTPOINT is no ckptfs mount, 2 usage.
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "ckfs.h"
#include "cli.h"

#define TMP_SUFFIX ".orbax-checkpoint-tmp"
/* Counters of .ckptfs/stats shown, in order. */
static const char *const counters[] = { "bytes_written", "stored_bytes_written", "bytes_pending",
					"commits",	 "commit_failures",	 "errors",
					"cache_hits",	 "cache_misses",	 "cache_evictions",
					"bytes_served",	 "chunks_decoded",	 "cache_bytes",
					"cache_budget",	 "unsettled_steps",	 "stored_copy_bytes" };
#define NCOUNTERS (sizeof(counters) / sizeof(counters[0]))

struct pstep {
	char name[256];
	uint64_t arrays, declared, stored, stored_files;
	/* left by an earlier mount: no such step in the mount, or shown there
	 * as the pending step the mount found at open (user.ckpt.leftover) */
	int leftover;
	int shown; /* MNT/<step>.orbax-checkpoint-tmp is there */
};

static void usage(FILE *f)
{
	fprintf(f, "usage: ckptfs status [--json] [--watch [--interval S] [--count N]] MOUNTPOINT\n"
		   "Pending steps of a ckptfs mount with their progress, and its counters.\n");
}

/* The mount source of `mnt` (a ckptfs mount) from /proc/self/mountinfo. */
static int mount_source(const char *mnt, char *src, size_t cap)
{
	FILE *f = fopen("/proc/self/mountinfo", "r");
	if (!f)
		return -errno;
	char line[8192];
	int found = -ENOENT;
	while (fgets(line, sizeof(line), f)) {
		char *fld[6] = { 0 }, *save = NULL, *p = line;
		for (int i = 0; i < 5 && (fld[i] = strtok_r(p, " ", &save)); i++)
			p = NULL;
		char *dash = strstr(save ? save : "", " - ");
		if (!fld[4] || !dash || strcmp(fld[4], mnt))
			continue;
		char type[64], source[4096];
		if (sscanf(dash + 3, "%63s %4095s", type, source) != 2 || strncmp(type, "fuse.ckptfs", 11))
			continue;
		/* mountinfo escapes space, tab, newline and backslash as \ooo */
		size_t o = 0;
		for (char *s = source; *s && o + 1 < cap; s++) {
			if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] && s[3]) {
				src[o++] = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
				s += 3;
			} else {
				src[o++] = *s;
			}
		}
		src[o] = 0;
		found = 0;
	}
	fclose(f);
	return found;
}

static uint64_t stat_value(const char *json, const char *key)
{
	char pat[80];
	snprintf(pat, sizeof(pat), "\"%s\":", key);
	const char *p = strstr(json, pat);
	return p ? strtoull(p + strlen(pat), NULL, 10) : 0;
}

/*
 * Tallies the files under dir into ps, 64 levels deep at most.  stored = 0:
 * dir is the step in the mount, the arrays (.npy files, slice files and
 * hidden names left out) and their declared bytes; stored = 1: dir is the
 * tmp folder in the source, every regular file and its bytes (links not
 * followed).
 */
static void walk_step(const char *dir, int depth, int stored, struct pstep *ps)
{
	DIR *d = opendir(dir);
	if (!d || depth > 64) {
		if (d)
			closedir(d);
		return;
	}
	struct dirent *e;
	while ((e = readdir(d))) {
		if (stored ? !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") : e->d_name[0] == '.')
			continue;
		char p[PATH_MAX];
		struct stat st;
		if (snprintf(p, sizeof(p), "%s/%s", dir, e->d_name) >= (int)sizeof(p) ||
		    (stored ? lstat(p, &st) : stat(p, &st)) < 0)
			continue;
		size_t n = strlen(e->d_name);
		if (S_ISDIR(st.st_mode)) {
			walk_step(p, depth + 1, stored, ps);
		} else if (stored && S_ISREG(st.st_mode)) {
			ps->stored += (uint64_t)st.st_size;
			ps->stored_files++;
		} else if (!stored && n > 4 && !strcmp(e->d_name + n - 4, ".npy") &&
			   !strchr(e->d_name, '[')) {
			ps->arrays++;
			ps->declared += (uint64_t)st.st_size;
		}
	}
	closedir(d);
}

/* Pending steps: <step>.orbax-checkpoint-tmp folders of source. */
static size_t pending_steps(const char *mnt, const char *source, struct pstep **out)
{
	*out = NULL;
	DIR *d = opendir(source);
	if (!d)
		return 0;
	size_t n = 0, cap = 0;
	struct pstep *v = NULL;
	struct dirent *e;
	while ((e = readdir(d))) {
		size_t l = strlen(e->d_name), k = strlen(TMP_SUFFIX);
		if (l <= k || l - k >= sizeof(v->name) || strcmp(e->d_name + l - k, TMP_SUFFIX))
			continue;
		if (n == cap) {
			cap = cap ? 2 * cap : 8;
			struct pstep *nv = realloc(v, cap * sizeof(*nv));
			if (!nv)
				break;
			v = nv;
		}
		struct pstep *ps = &v[n++];
		memset(ps, 0, sizeof(*ps));
		memcpy(ps->name, e->d_name, l - k);
		char p[PATH_MAX];
		if (snprintf(p, sizeof(p), "%s/%s", source, e->d_name) < (int)sizeof(p))
			walk_step(p, 0, 1, ps);
		struct stat st;
		if (snprintf(p, sizeof(p), "%s/%s", mnt, ps->name) < (int)sizeof(p)) {
			ps->leftover = stat(p, &st) != 0;
			walk_step(p, 0, 0, ps);
		}
		/* shown under its own name: an Orbax save through the mount, or a
		 * folder the mount found at open (it says so) */
		if (ps->leftover && snprintf(p, sizeof(p), "%s/%s", mnt, e->d_name) < (int)sizeof(p) &&
		    stat(p, &st) == 0) {
			ps->shown = 1;
			ps->leftover = getxattr(p, "user.ckpt.leftover", NULL, 0) >= 0;
		}
	}
	closedir(d);
	*out = v;
	return n;
}

/* The error and warning lines of MNT/.ckptfs/log, the last `max` of them
 * (newest last, each a malloc'd string without its newline), and the log's
 * destination from the mount's first line (*dest, malloc'd, or NULL). */
#define RECENT_MAX 5
static size_t recent_errors(const char *mnt, char **lines, size_t max, char **dest)
{
	char path[PATH_MAX];
	*dest = NULL;
	snprintf(path, sizeof(path), "%s/.ckptfs/log", mnt);
	FILE *lf = fopen(path, "re");
	if (!lf)
		return 0;
	size_t n = 0;
	char line[1024];
	while (fgets(line, sizeof(line), lf)) {
		line[strcspn(line, "\n")] = 0;
		const char *msg = strchr(line, ' '); /* past the time */
		if (!msg)
			continue;
		msg++;
		const char *lp = strstr(msg, "; log: ");
		if (!strncmp(msg, "info: ", 6) && strstr(msg, ": mounted on ") && lp) {
			free(*dest);
			*dest = strdup(lp + 7);
		}
		if (strncmp(msg, "error: ", 7) && strncmp(msg, "warning: ", 9))
			continue;
		if (n == max) {
			free(lines[0]);
			memmove(lines, lines + 1, (max - 1) * sizeof(*lines));
			n--;
		}
		if ((lines[n] = strdup(line)))
			n++;
	}
	fclose(lf);
	return n;
}

static int show(const char *mnt, const char *source, int json, FILE *f)
{
	char path[PATH_MAX], buf[8192];
	snprintf(path, sizeof(path), "%s/.ckptfs/stats", mnt);
	FILE *sf = fopen(path, "r");
	if (!sf) {
		fprintf(stderr, "ckptfs status: %s: %s\n", path, strerror(errno));
		return 1;
	}
	size_t len = fread(buf, 1, sizeof(buf) - 1, sf);
	buf[len] = 0;
	fclose(sf);
	struct pstep *ps;
	size_t np = pending_steps(mnt, source, &ps);
	char *errs[RECENT_MAX], *dest;
	size_t ne = recent_errors(mnt, errs, RECENT_MAX, &dest);
	char h1[32], h2[32], h3[32];
	if (json) {
		fprintf(f, "{\"mountpoint\": ");
		ckpt_json_str(f, mnt);
		fprintf(f, ", \"source\": ");
		ckpt_json_str(f, source);
		fprintf(f, ", \"pending\": [");
		for (size_t i = 0; i < np; i++) {
			fprintf(f, "%s{\"step\": ", i ? ", " : "");
			ckpt_json_str(f, ps[i].name);
			fprintf(f,
				", \"arrays\": %llu, \"declared_bytes\": %llu, \"stored_bytes\": %llu, "
				"\"stored_files\": %llu, \"leftover\": %s}",
				(unsigned long long)ps[i].arrays, (unsigned long long)ps[i].declared,
				(unsigned long long)ps[i].stored, (unsigned long long)ps[i].stored_files,
				ps[i].leftover ? "true" : "false");
		}
		fprintf(f, "], \"log\": ");
		if (dest)
			ckpt_json_str(f, dest);
		else
			fprintf(f, "null");
		fprintf(f, ", \"recent_errors\": [");
		for (size_t i = 0; i < ne; i++) {
			fprintf(f, "%s", i ? ", " : "");
			ckpt_json_str(f, errs[i]);
		}
		fprintf(f, "], \"stats\": {");
		for (size_t i = 0; i < NCOUNTERS; i++)
			fprintf(f, "%s\"%s\": %llu", i ? ", " : "", counters[i],
				(unsigned long long)stat_value(buf, counters[i]));
		fprintf(f, "}}\n");
	} else {
		fprintf(f, "%s: ckptfs mount of %s\n", mnt, source);
		size_t live = 0;
		for (size_t i = 0; i < np; i++)
			live += !ps[i].leftover;
		if (!live)
			fprintf(f, "no pending step\n");
		for (size_t i = 0; i < np; i++) {
			if (ps[i].leftover && ps[i].shown) {
				fprintf(f,
					"left over: %s" TMP_SUFFIX
					" (%s in %llu files), a step an earlier mount "
					"never committed, shown as a pending step.  Discard it: rm -r "
					"%s/%s" TMP_SUFFIX "\n",
					ps[i].name, ckpt_human(ps[i].stored, h2, sizeof(h2)),
					(unsigned long long)ps[i].stored_files, mnt, ps[i].name);
				continue;
			}
			if (ps[i].leftover) {
				fprintf(f,
					"left over: %s" TMP_SUFFIX
					" (%s in %llu files), a step an earlier mount "
					"never committed; not part of this mount.  Discard it: rm -r "
					"%s/%s" TMP_SUFFIX
					" (or, on a writable mount, mkdir %s/%s && rmdir %s/%s)\n",
					ps[i].name, ckpt_human(ps[i].stored, h2, sizeof(h2)),
					(unsigned long long)ps[i].stored_files, source, ps[i].name, mnt,
					ps[i].name, mnt, ps[i].name);
				continue;
			}
			fprintf(f, "pending step %s: %llu array%s declared (%s), %s stored in %llu files\n",
				ps[i].name, (unsigned long long)ps[i].arrays, ps[i].arrays == 1 ? "" : "s",
				ckpt_human(ps[i].declared, h1, sizeof(h1)),
				ckpt_human(ps[i].stored, h2, sizeof(h2)),
				(unsigned long long)ps[i].stored_files);
		}
		fprintf(f, "written: %s received, %s stored (compressed), %s buffered\n",
			ckpt_human(stat_value(buf, "bytes_written"), h1, sizeof(h1)),
			ckpt_human(stat_value(buf, "stored_bytes_written"), h2, sizeof(h2)),
			ckpt_human(stat_value(buf, "bytes_pending"), h3, sizeof(h3)));
		fprintf(f, "commits: %llu, failed: %llu; errors: %llu\n",
			(unsigned long long)stat_value(buf, "commits"),
			(unsigned long long)stat_value(buf, "commit_failures"),
			(unsigned long long)stat_value(buf, "errors"));
		if (stat_value(buf, "unsettled_steps"))
			fprintf(f,
				"unsettled: %llu step%s committed to the object store whose marker's outcome "
				"is "
				"unknown (pending; touch STEP/commit_success.txt again to settle)\n",
				(unsigned long long)stat_value(buf, "unsettled_steps"),
				stat_value(buf, "unsettled_steps") == 1 ? "" : "s");
		fprintf(f, "cache: %llu hits, %llu misses, %llu evictions; %s served\n",
			(unsigned long long)stat_value(buf, "cache_hits"),
			(unsigned long long)stat_value(buf, "cache_misses"),
			(unsigned long long)stat_value(buf, "cache_evictions"),
			ckpt_human(stat_value(buf, "bytes_served"), h1, sizeof(h1)));
		fprintf(f, "cache in use: %s of %s\n",
			ckpt_human(stat_value(buf, "cache_bytes"), h2, sizeof(h2)),
			ckpt_human(stat_value(buf, "cache_budget"), h3, sizeof(h3)));
		if (stat_value(buf, "stored_copy_bytes"))
			fprintf(f, "copied out of STEP/.stored: %s\n",
				ckpt_human(stat_value(buf, "stored_copy_bytes"), h1, sizeof(h1)));
		if (ne)
			fprintf(f, "recent errors (all: cat %s/.ckptfs/log):\n", mnt);
		for (size_t i = 0; i < ne; i++)
			fprintf(f, "  %s\n", errs[i]);
		if (dest)
			fprintf(f, "log: %s\n", dest);
	}
	for (size_t i = 0; i < ne; i++)
		free(errs[i]);
	free(dest);
	free(ps);
	fflush(f);
	return 0;
}

int ckfs_cmd_status(int argc, char **argv)
{
	int json = 0, watch = 0;
	long count = 0;
	double interval = 1.0;
	const char *mnt_arg = NULL;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--json")) {
			json = 1;
		} else if (!strcmp(argv[i], "--watch")) {
			watch = 1;
		} else if (!strcmp(argv[i], "--interval") && i + 1 < argc) {
			interval = strtod(argv[++i], NULL);
		} else if (!strcmp(argv[i], "--count") && i + 1 < argc) {
			count = strtol(argv[++i], NULL, 10);
		} else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			usage(stdout);
			return 0;
		} else if (argv[i][0] == '-' || mnt_arg) {
			usage(stderr);
			return 2;
		} else {
			mnt_arg = argv[i];
		}
	}
	if (!mnt_arg || interval <= 0) {
		usage(stderr);
		return 2;
	}
	char *mnt = realpath(mnt_arg, NULL);
	char source[4096];
	if (!mnt || mount_source(mnt, source, sizeof(source)) < 0) {
		fprintf(stderr, "ckptfs status: %s: not a ckptfs mount\n", mnt_arg);
		free(mnt);
		return 1;
	}
	int tty = isatty(1);
	int rc = 0;
	for (long n = 0;; n++) {
		if (watch && tty)
			fputs("\033[H\033[J", stdout);
		rc = show(mnt, source, json, stdout);
		if (!watch || rc || (count > 0 && n + 1 >= count))
			break;
		if (!tty)
			fputs("\n", stdout);
		struct timespec ts = { (time_t)interval,
				       (long)((interval - (double)(time_t)interval) * 1e9) };
		nanosleep(&ts, NULL);
	}
	free(mnt);
	return rc;
}
