#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

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

/* The recent lines (ckpt_log_recent): a ring of LOG_RING lines, each cut
 * at LOG_RING_LINE bytes.  ring_mu is a leaf: taken with the line built,
 * calls out of nothing. */
#define LOG_RING 256
#define LOG_RING_LINE 512
static char ring[LOG_RING][LOG_RING_LINE];
static signed char ring_level[LOG_RING];
static unsigned long long ring_next; /* lines ever added */
static pthread_mutex_t ring_mu = PTHREAD_MUTEX_INITIALIZER;

static void ring_add(int level, const char *msg)
{
	struct timespec ts;
	struct tm tm;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	char line[LOG_RING_LINE];
	int n = snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02dZ %s: %s", tm.tm_year + 1900,
			 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
			 ckpt_log_level_name(level), msg);
	if (n < 0)
		return;
	pthread_mutex_lock(&ring_mu);
	memcpy(ring[ring_next % LOG_RING], line, sizeof(line));
	ring_level[ring_next % LOG_RING] = (signed char)level;
	ring_next++;
	pthread_mutex_unlock(&ring_mu);
}

size_t ckpt_log_recent(char *buf, size_t cap, int max_level)
{
	if (!cap)
		return 0;
	size_t len = 0;
	pthread_mutex_lock(&ring_mu);
	unsigned long long first = ring_next > LOG_RING ? ring_next - LOG_RING : 0, from = ring_next;
	/* back from the newest while the lines fit, then copy them oldest first */
	for (size_t need = 0; from > first; from--) {
		unsigned slot = (unsigned)((from - 1) % LOG_RING);
		if (ring_level[slot] > max_level)
			continue;
		size_t k = strlen(ring[slot]) + 1;
		if (need + k >= cap)
			break;
		need += k;
	}
	for (unsigned long long i = from; i < ring_next; i++) {
		unsigned slot = (unsigned)(i % LOG_RING);
		if (ring_level[slot] > max_level)
			continue;
		size_t k = strlen(ring[slot]);
		memcpy(buf + len, ring[slot], k);
		len += k;
		buf[len++] = '\n';
	}
	pthread_mutex_unlock(&ring_mu);
	buf[len] = 0;
	return len;
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
	ring_add(level, n >= 0 && (size_t)n < sizeof(line) ? line + n : line);
	ckpt_log_sink_fn sink = atomic_load(&log_sink);
	if (sink) {
		sink(level, n >= 0 && (size_t)n < sizeof(line) ? line + n : line);
		return;
	}
	/* One fputs per line so concurrent threads do not interleave. */
	fprintf(stderr, "%s\n", line);
}
