/*
 * cli_util.c - see cli.h.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"

int cli_open_view(const char *source, ckpt_view **v, char **real)
{
	/* s3:// and gs://: no local path (endpoint and credentials from the environment) */
	*real = ckpt_store_source_is_remote(source) ? strdup(source) : realpath(source, NULL);
	if (!*real) {
		int e = errno;
		fprintf(stderr, "ckptfs: %s: %s\n", source, strerror(e));
		return -e;
	}
	ckpt_view_opts vo = { 0 };
	vo.read_only = 1;
	vo.ctx.cache_bytes = 64u << 20;
	int rc = ckpt_view_open(*real, &vo, v);
	if (rc < 0) {
		fprintf(stderr, "ckptfs: %s: %s\n", *real, strerror(-rc));
		free(*real);
		*real = NULL;
	}
	return rc;
}
