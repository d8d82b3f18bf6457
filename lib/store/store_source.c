/*
 * store_source.c - SOURCE as the user wrote it: the store mount options and
 * the choice of backend (object store or folder).  The top of store/'s
 * generic part: it calls the backends' open functions, and nothing below
 * calls it (see the file map in store_int.h).
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "store.h"
#include "store_int.h"

/* ---------------------------------------------------------------- SOURCE */

static int parse_uint(const char *v, unsigned lo, unsigned hi, unsigned *out)
{
	char *end;
	if (!v || !*v)
		return -EINVAL;
	errno = 0;
	unsigned long n = strtoul(v, &end, 10);
	if (*end || errno || n < lo || n > hi)
		return -EINVAL;
	*out = (unsigned)n;
	return 0;
}

/* "10G", "512M", "4096" -> bytes (> 0). */
static int parse_size(const char *v, uint64_t *out)
{
	uint64_t n;
	if (ckpt_parse_size(v, &n) < 0 || n == 0)
		return -EINVAL;
	*out = n;
	return 0;
}

int ckpt_store_opts_set(struct ckpt_store_opts *o, const char *key, const char *value)
{
	int rc = 0;
	if (strcmp(key, "endpoint") == 0)
		o->endpoint = value;
	else if (strcmp(key, "region") == 0)
		o->region = value;
	else if (strcmp(key, "profile") == 0)
		o->profile = value;
	else if (strcmp(key, "token_file") == 0)
		o->token_file = value;
	else if (strcmp(key, "anonymous") == 0)
		o->anonymous = !value || strcmp(value, "0") != 0;
	else if (strcmp(key, "connections") == 0)
		rc = parse_uint(value, 1, 1024, &o->connections);
	else if (strcmp(key, "retries") == 0) {
		rc = parse_uint(value, 0, 100, &o->retries);
		if (rc == 0 && o->retries == 0)
			o->retries = CKPT_STORE_NO_RETRY;
	} else if (strcmp(key, "timeout_ms") == 0)
		rc = parse_uint(value, 100, 3600000, &o->timeout_ms);
	else if (strcmp(key, "retry_base_ms") == 0)
		rc = parse_uint(value, 1, 60000, &o->retry_base_ms);
	else if (strcmp(key, "cache_dir") == 0)
		rc = value && *value ? (o->cache_dir = value, 0) : -EINVAL;
	else if (strcmp(key, "cache_dir_size") == 0)
		rc = parse_size(value, &o->cache_dir_size);
	else
		return 0;
	if (rc == 0 && !value && strcmp(key, "anonymous") != 0)
		rc = -EINVAL;
	return rc ? rc : 1;
}

int ckpt_store_source_is_remote(const char *source)
{
	return source && (strncmp(source, "s3://", 5) == 0 || strncmp(source, "gs://", 5) == 0);
}

int ckpt_store_open_source(const char *source, const struct ckpt_store_opts *o, ckpt_store **out)
{
	*out = NULL;
	if (!source || !*source)
		return -EINVAL;
	if (ckpt_store_source_is_remote(source))
		return ckpt_store_s3_open(source, o, out);
	return ckpt_store_dir_open(source, out);
}
