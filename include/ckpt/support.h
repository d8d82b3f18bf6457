/*
 * support.h - the public declarations owned by the layers below tree/:
 * logging (base/), the options of the read context (read/) and of an
 * object store (store/), and a folder-removal helper.  Part of the public
 * header set (include/ckpt.h); the layer headers that own these include it
 * rather than repeat them.  No layer header is reachable from here.
 */
#ifndef CKPT_SUPPORT_H
#define CKPT_SUPPORT_H

#include <errno.h> /* every call returns 0 or a negative errno */
#include <stddef.h>
#include <stdint.h>

/* ---- logging (base/log.c; conventions in base/common.h) ---- */
enum ckpt_log_level { CKPT_LOG_ERR = 0, CKPT_LOG_WARN = 1, CKPT_LOG_INFO = 2, CKPT_LOG_DEBUG = 3 };

/* Log one line (a trailing newline is added).  Messages above the current
 * level (ckpt_log_set_level, default INFO) are dropped. */
void ckpt_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ckpt_log_set_level(int level);
/* Send log lines to `sink` (NULL: back to stderr).  The sink gets the
 * level and the message without the "ckptfs: <level>: " prefix; it may be
 * called from any thread at once.  Every error line also counts in
 * ckpt_g_stats.errors_logged, whatever the level filter. */
typedef void (*ckpt_log_sink_fn)(int level, const char *msg);
void ckpt_log_set_sink(ckpt_log_sink_fn sink);
const char *ckpt_log_level_name(int level); /* "error", "warning", "info", "debug" */
/* The recent log lines (the last 256 that passed the level filter, each
 * cut at 511 bytes) of level max_level or more severe, oldest first, as
 * "YYYY-MM-DDTHH:MM:SSZ LEVEL: message\n": as many of the newest as fit in
 * cap - 1 bytes, NUL-terminated.  Returns the length.  Kept whatever the
 * sink, so a daemon without syslog still has them (MNT/.ckptfs/log). */
size_t ckpt_log_recent(char *buf, size_t cap, int max_level);

/* ---- files (base/sysio.c) ---- */
/* Remove path and, if it is a folder, everything below it.  Symlinks are
 * removed, never followed.  0 when path is gone (also when it was absent),
 * else the first -errno met (removal goes on past errors); -ELOOP past 64
 * levels of folders. */
int ckpt_rmtree(const char *path);

/* ---- option values (base/sysio.c) ---- */
/* A size: decimal digits, then optionally k/K, m/M, g/G or t/T (powers of
 * 1024) and then optionally b/B ("10G", "512M", "4096").  0 (and *out set;
 * 0 itself is accepted), or -EINVAL for anything else or a value over
 * 2^64 - 1. */
int ckpt_parse_size(const char *s, uint64_t *out);

/* ---- read context (read/array.h) ---- */
typedef struct ckpt_ctx_opts {
	uint64_t cache_bytes; /* decoded-chunk cache budget (0: 256 MiB) */
	int threads; /* decode threads (0: number of CPUs) */
	uint64_t prefetch_bytes; /* read-ahead window for sequential readers (0: 8 MiB) */
} ckpt_ctx_opts;

/* ---- stores (store/store.h) ---- */
typedef struct ckpt_store ckpt_store;

/*
 * Credentials (never options, so never in ps; never logged):
 *   s3://  AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN),
 *          else the profile's keys in AWS_SHARED_CREDENTIALS_FILE
 *          (~/.aws/credentials) or AWS_CONFIG_FILE (~/.aws/config), else
 *          anonymous.  Requests are signed with SigV4.
 *   gs://  token_file= (re-read when it changes), else
 *          GOOGLE_OAUTH_ACCESS_TOKEN, else HMAC keys found as for s3://
 *          (SigV4, region "auto"), else the metadata server on a Google
 *          Cloud machine (or GCE_METADATA_HOST), else anonymous.
 *
 * Options of object stores (ignored by folder stores).  Every string is
 * borrowed for the duration of ckpt_store_open_source() only (copied).
 * A zeroed struct (or NULL) means: every default below.
 */
struct ckpt_store_opts {
	const char *endpoint; /* "http://127.0.0.1:4568" (path-style URLs); NULL: AWS_ENDPOINT_URL_S3,
				 AWS_ENDPOINT_URL, else https://s3.REGION.amazonaws.com (S3) or
				 https://storage.googleapis.com (GCS) */
	const char *region; /* NULL: AWS_REGION, AWS_DEFAULT_REGION, profile, "us-east-1"; "auto" for gs:// */
	const char *profile; /* NULL: AWS_PROFILE, AWS_DEFAULT_PROFILE, "default" */
	const char *token_file; /* gs://: file holding an OAuth2 bearer token (re-read when it changes) */
	int anonymous; /* 1: send no credentials even when some are found */
	unsigned connections; /* concurrent HTTP requests; 0 = 16 */
	unsigned
		retries; /* attempts after the first on transient failures; 0 = 5, CKPT_STORE_NO_RETRY = none */
	unsigned timeout_ms; /* per attempt (connect + stall detection); 0 = 30000 */
	unsigned retry_base_ms; /* first backoff (doubles, full jitter, capped at 5 s); 0 = 100 */
	const char *cache_dir; /* keep fetched ranges in this folder across remounts; NULL: none */
	uint64_t cache_dir_size; /* bound of cache_dir in bytes; 0 = 10 GiB */
};

#define CKPT_STORE_NO_RETRY 0xffffffffu

/* Apply one mount option to `o`: endpoint=, region=, profile=, token_file=,
 * anonymous (or anonymous=1), connections=, retries=, timeout_ms=,
 * retry_base_ms=, cache_dir=, cache_dir_size= (K/M/G/T suffixes).  Returns 1 when `key` is one of these (string values are
 * borrowed: keep them alive until ckpt_store_open_source), 0 when it is not
 * a store option, -EINVAL for a bad value.  No option carries a secret, so
 * mount options are safe to show in ps. */
int ckpt_store_opts_set(struct ckpt_store_opts *o, const char *key, const char *value);

/* 1 when SOURCE names an object store (s3:// or gs://): not a local path,
 * so callers must not realpath() it, and (until the object-store write path
 * exists) must mount it read-only. */
int ckpt_store_source_is_remote(const char *source);

#endif
