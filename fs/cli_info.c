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
	fprintf(f, "usage: ckptfs info [--json] [--all] SOURCE [PATH]\n"
		   "Steps, items and a table of the arrays under SOURCE (or PATH inside it: STEP,\n"
		   "STEP/ITEM or a directory below), without mounting.  Reads metadata only.\n"
		   "For a CheckpointManager root, one line per step (--all: every step's table).\n"
		   "A mount serves the same table as STEP/.ckptfs/summary.txt (and summary.json).\n"
		   "Exit status: 0, 1 when SOURCE cannot be opened or an array cannot be read, 2 usage.\n");
}

int ckfs_cmd_info(int argc, char **argv)
{
	int flags = 0;
	const char *source = NULL, *sub = "";
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--json")) {
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
	if (rc < 0)
		return 1;
	ckpt_attr a;
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
				rc = -EIO;
			}
		}
	}
	ckpt_view_destroy(v);
	free(real);
	return rc < 0 ? 1 : 0;
}
