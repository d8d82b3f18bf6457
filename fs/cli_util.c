/*
 * cli_util.c - see cli.h.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "store/store.h"

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

void cli_json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\')
			fprintf(f, "\\%c", *p);
		else if (*p < 0x20)
			fprintf(f, "\\u%04x", *p);
		else
			fputc(*p, f);
	}
	fputc('"', f);
}

const char *cli_human(uint64_t n, char *buf, size_t cap)
{
	static const char *const unit[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
	if (n < 1024) {
		snprintf(buf, cap, "%llu B", (unsigned long long)n);
		return buf;
	}
	double d = (double)n;
	int u = 0;
	while (d >= 1024 && u < 5) {
		d /= 1024;
		u++;
	}
	snprintf(buf, cap, "%.1f %s", d, unit[u]);
	return buf;
}
