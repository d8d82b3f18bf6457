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

/* Levenshtein distance of a and b, or 99 when either is over 63 bytes. */
static unsigned edits(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	if (la > 63 || lb > 63)
		return 99;
	unsigned row[64];
	for (size_t j = 0; j <= lb; j++)
		row[j] = (unsigned)j;
	for (size_t i = 1; i <= la; i++) {
		unsigned diag = row[0];
		row[0] = (unsigned)i;
		for (size_t j = 1; j <= lb; j++) {
			unsigned up = row[j];
			unsigned best = diag + (a[i - 1] != b[j - 1]);
			if (row[j] + 1 < best)
				best = row[j] + 1;
			if (row[j - 1] + 1 < best)
				best = row[j - 1] + 1;
			row[j] = best;
			diag = up;
		}
	}
	return row[lb];
}

const char *cli_did_you_mean(const char *word, const char *const *cands, size_t n)
{
	const char *best = NULL;
	unsigned bd = 3;
	for (size_t i = 0; i < n; i++) {
		unsigned d = edits(word, cands[i]);
		if (d < bd && 2 * d <= strlen(word)) {
			bd = d;
			best = cands[i];
		}
	}
	return best;
}
