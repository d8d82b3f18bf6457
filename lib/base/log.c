#include <stdarg.h>
#include <stdio.h>
#include <stdatomic.h>

#include "common.h"
#include "stats.h"

static atomic_int log_level = CKPT_LOG_INFO;
static const char *const level_name[] = { "error", "warning", "info", "debug" };
static _Atomic(ckpt_log_sink_fn) log_sink;

void ckpt_log_set_sink(ckpt_log_sink_fn sink)
{
	atomic_store(&log_sink, sink);
}

const char *ckpt_log_level_name(int level)
{
	return level_name[level < 0 ? 0 : level > 3 ? 3 : level];
}

void ckpt_log_set_level(int level)
{
	atomic_store(&log_level, level);
}

static _Thread_local int log_quiet;

int ckpt_log_quiet(int on)
{
	int was = log_quiet;
	log_quiet = on;
	return was;
}

void ckpt_log(int level, const char *fmt, ...)
{
	if (log_quiet && level < CKPT_LOG_DEBUG)
		level = CKPT_LOG_DEBUG;
	if (level <= CKPT_LOG_ERR)
		CKPT_STAT_ADD(errors_logged, 1);
	if (level > atomic_load(&log_level))
		return;
	char line[1024];
	int n = snprintf(line, sizeof(line), "ckptfs: %s: ",
			 level_name[level < 0	? 0
				    : level > 3 ? 3
						: level]);
	va_list ap;
	va_start(ap, fmt);
	if (n >= 0 && (size_t)n < sizeof(line))
		vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
	va_end(ap);
	ckpt_log_sink_fn sink = atomic_load(&log_sink);
	if (sink) {
		sink(level, n >= 0 && (size_t)n < sizeof(line) ? line + n : line);
		return;
	}
	/* One fputs per line so concurrent threads do not interleave. */
	fprintf(stderr, "%s\n", line);
}
