#include <stdio.h>

#include "stats.h"
#include "common.h"

ckpt_stats ckpt_g_stats;

int ckpt_stats_json(char *buf, size_t cap)
{
#define G(f) ((unsigned long long)atomic_load(&ckpt_g_stats.f))
	int n = snprintf(
		buf, cap,
		"{\n  \"backing_bytes_read\": %llu,\n  \"backing_reads\": %llu,\n"
		"  \"backing_opens\": %llu,\n  \"kept_files\": %lld,\n"
		"  \"chunks_decoded\": %llu,\n  \"decoded_bytes\": %llu,\n"
		"  \"cache_hits\": %llu,\n  \"cache_misses\": %llu,\n  \"cache_evictions\": %llu,\n"
		"  \"bytes_served\": %llu,\n  \"bytes_written\": %llu,\n  \"bytes_pending\": %lld,\n"
		"  \"stored_bytes_written\": %llu,\n  \"commits\": %llu,\n  \"commit_failures\": "
		"%llu,\n  \"errors\": %llu,\n"
		"  \"cache_bytes\": %llu,\n  \"cache_budget\": %llu,\n  \"hidden_nodes\": %llu,\n"
		"  \"unsettled_steps\": %lld,\n"
		"  \"stored_copy_bytes\": %llu,\n"
		"  \"steps_freed\": %llu\n}\n",
		G(backing_bytes_read), G(backing_reads), G(backing_opens),
		(long long)atomic_load(&ckpt_g_stats.kept_files), G(chunks_decoded), G(decoded_bytes),
		G(cache_hits), G(cache_misses), G(cache_evictions), G(bytes_served), G(bytes_written),
		(long long)atomic_load(&ckpt_g_stats.bytes_pending), G(stored_bytes_written), G(commits),
		G(commit_failures), G(errors_logged), G(cache_bytes), G(cache_budget), G(hidden_nodes),
		(long long)atomic_load(&ckpt_g_stats.unsettled_steps), G(stored_copy_bytes), G(steps_freed));
#undef G
	if (n < 0 || (size_t)n >= cap)
		return -ENOBUFS;
	return n;
}
