/*
 * cli_info.c - `ckptfs info [--json] SOURCE [PATH]`: steps, items and a
 * table of arrays without mounting.  Opens a read-only view of SOURCE and
 * prints ckpt_view_summary() of PATH (the same text the mount serves as
 * STEP/.ckptfs/summary.txt).  Never reads array data.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckfs.h"
#include "cli.h"

static void info_usage(FILE *f)
{
	fprintf(f, "usage: ckptfs info [--json] SOURCE [PATH]\n"
		   "Steps, items and a table of the arrays under SOURCE (or PATH inside it: STEP,\n"
		   "STEP/ITEM or a directory below), without mounting.  Reads metadata only.\n"
		   "A mount serves the same table as STEP/.ckptfs/summary.txt (and summary.json).\n"
		   "       ckptfs info --recipe NAME SOURCE [STEP]\n"
		   "The mapping of view recipe NAME (or a recipe file: a path with a '/') over STEP\n"
		   "(default: the last step of a root): target name, shape, dtype, source key and ops,\n"
		   "as STEP/.views/NAME/ serves it; exit status 1 naming the failing rule when it does\n"
		   "not match.\n");
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
	int json = 0;
	const char *source = NULL, *sub = "", *recipe = NULL;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--recipe") && i + 1 < argc) {
			recipe = argv[++i];
		} else if (!strcmp(argv[i], "--json")) {
			json = 1;
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
	if (rc < 0)
		return 1;
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
		rc = ckpt_view_summary(v, a.ino, real, json, &buf, &len);
		if (rc < 0) {
			fprintf(stderr, "ckptfs info: %s: %s\n", real, strerror(-rc));
		} else {
			fwrite(buf, 1, len, stdout);
			free(buf);
		}
	}
	ckpt_view_destroy(v);
	free(real);
	return rc < 0 ? 1 : 0;
}
