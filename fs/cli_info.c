/*
 * cli_info.c - `ckptfs info [--json] SOURCE [PATH]`: steps, items and a
 * table of arrays without mounting.  Opens a read-only view of SOURCE and
 * prints ckpt_view_summary() of PATH (the same text the mount serves as
 * STEP/.ckptfs/summary.txt).  Never reads array data.
 */
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "ckfs.h"
#include "cli.h"

static void info_usage(FILE *f)
{
	fprintf(f, "usage: ckptfs info [--json] [--all] SOURCE [PATH]\n"
		   "Steps, items and a table of the arrays under SOURCE (or PATH inside it: STEP,\n"
		   "STEP/ITEM or a directory below), without mounting.  Reads metadata only.\n"
		   "For a CheckpointManager root, one line per step (--all: every step's table).\n"
		   "A mount serves the same table as STEP/.ckptfs/summary.txt (and summary.json).\n"
		   "       ckptfs info --recipe NAME SOURCE [STEP]\n"
		   "The mapping of view recipe NAME (or a recipe file: a path with a '/') over STEP\n"
		   "(default: the last step of a root): target name, shape, dtype, source key and ops,\n"
		   "as STEP/.views/NAME/ serves it; exit status 1 naming the failing rule when it does\n"
		   "not match.\n"
		   "Exit status: 0, 1 when SOURCE cannot be opened or an array cannot be read, 2 usage.\n");
}

/* 1 when a NAME.npy file lies in folder dir or below (depth levels at most):
 * a folder copied out of a mount's tree view (cp -r MNT/STEP) holds the
 * arrays as .npy files beside Orbax metadata that describes other files. */
static int has_npy(const char *dir, int depth)
{
	DIR *d = depth >= 0 ? opendir(dir) : NULL;
	if (!d)
		return 0;
	int found = 0;
	struct dirent *e;
	while (!found && (e = readdir(d))) {
		size_t n = strlen(e->d_name);
		char p[PATH_MAX];
		struct stat st;
		if (e->d_name[0] == '.' ||
		    snprintf(p, sizeof(p), "%s/%s", dir, e->d_name) >= (int)sizeof(p) || lstat(p, &st) != 0)
			continue;
		if (S_ISREG(st.st_mode) && n > 4 && !strcmp(e->d_name + n - 4, ".npy"))
			found = 1;
		else if (S_ISDIR(st.st_mode))
			found = has_npy(p, depth - 1);
	}
	closedir(d);
	return found;
}

static void explain_tree_copy(const char *real)
{
	fprintf(stderr,
		"ckptfs info: %s holds .npy files beside Orbax metadata: it looks like a copy of a ckptfs\n"
		"mount's tree view (cp -r MNT/STEP).  Its metadata describes the stored files, which the "
		"copy\n"
		"lacks, so neither Orbax nor ckptfs can restore it; its NAME.npy files are plain arrays\n"
		"(numpy.load).  For a step that Orbax restores, copy the stored files from the mount:\n"
		"    cp -r MNT/STEP/.stored DEST/STEP\n",
		real);
}

/* --recipe NAME: the mapping table over STEP (default: a root's last step). */
static int recipe_table(ckpt_view *v, const char *real, const char *sub, const char *recipe)
{
	char last[4096] = "";
	if (!*sub && !strcmp(ckpt_view_kind(v), "root")) {
		const char *name;
		ckpt_attr at;
		unsigned long long best = 0;
		for (uint64_t i = 0; ckpt_view_readdir(v, CKPT_ROOT_INO, i, &name, &at) > 0; i++) {
			char *end;
			unsigned long long num = strtoull(name, &end, 10);
			/* the highest step number (names sort as text: "10" < "9") */
			if (at.is_dir && name[0] != '.' && (!last[0] || (!*end && num >= best))) {
				snprintf(last, sizeof(last), "%s", name);
				best = *end ? 0 : num;
			}
		}
		sub = last;
	}
	ckpt_attr a;
	int rc = ckfs_resolve(v, sub, &a);
	if (rc < 0) {
		fprintf(stderr, "ckptfs info: %s: %s: %s\n", real, sub, strerror(-rc));
		return rc;
	}
	char *out, *why;
	rc = ckpt_view_recipe_table(v, a.ino, recipe, &out, &why);
	if (rc < 0) {
		fprintf(stderr, "ckptfs info: recipe %s over %s%s%s: %s\n", recipe, real, *sub ? "/" : "",
			sub, why ? why : strerror(-rc));
	} else {
		fputs(out, stdout);
	}
	free(out);
	free(why);
	return rc;
}

int ckfs_cmd_info(int argc, char **argv)
{
	int flags = 0;
	const char *source = NULL, *sub = "", *recipe = NULL;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--recipe") && i + 1 < argc) {
			recipe = argv[++i];
		} else if (!strcmp(argv[i], "--json")) {
			flags |= CKPT_SUMMARY_JSON;
		} else if (!strcmp(argv[i], "--all")) {
			flags |= CKPT_SUMMARY_ALL;
		} else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			info_usage(stdout);
			return 0;
		} else if (argv[i][0] == '-' && argv[i][1]) {
			fprintf(stderr, "ckptfs info: unknown option %s\n", argv[i]);
			info_usage(stderr);
			return 2;
		} else if (!source) {
			source = argv[i];
		} else if (!*sub) {
			sub = argv[i];
		} else {
			info_usage(stderr);
			return 2;
		}
	}
	if (!source) {
		info_usage(stderr);
		return 2;
	}
	ckpt_view *v;
	char *real;
	int rc = cli_open_view(source, &v, &real);
	if (rc < 0) {
		if (!ckpt_store_source_is_remote(source) && has_npy(source, 8))
			explain_tree_copy(source);
		return 1;
	}
	ckpt_attr a;
	if (recipe) {
		rc = recipe_table(v, real, sub, recipe);
		ckpt_view_destroy(v);
		free(real);
		return rc < 0 ? 1 : 0;
	}
	rc = ckfs_resolve(v, sub, &a);
	if (rc < 0) {
		fprintf(stderr, "ckptfs info: %s: %s: %s\n", real, sub, strerror(-rc));
	} else if (!a.is_dir) {
		fprintf(stderr, "ckptfs info: %s: %s: not a directory\n", real, sub);
		rc = -ENOTDIR;
	} else {
		char *buf;
		size_t len;
		rc = ckpt_view_summary(v, a.ino, real, flags, &buf, &len);
		if (rc < 0) {
			fprintf(stderr, "ckptfs info: %s: %s\n", real, strerror(-rc));
		} else {
			fwrite(buf, 1, len, stdout);
			free(buf);
			if (rc > 0) {
				fprintf(stderr,
					"ckptfs info: %s: %d array%s cannot be read (listed under "
					"\"unreadable\")\n",
					real, rc, rc == 1 ? "" : "s");
				if (!ckpt_store_source_is_remote(real) && has_npy(real, 8))
					explain_tree_copy(real);
				rc = -EIO;
			}
		}
	}
	ckpt_view_destroy(v);
	free(real);
	return rc < 0 ? 1 : 0;
}
