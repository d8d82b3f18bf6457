/*
 * stats.h - process-wide counters (lock-free atomics), reported by the
 * daemon as MNT/.ckptfs/stats.  Any thread may bump or read them.
 */
#ifndef CKPT_STATS_H
#define CKPT_STATS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ckpt_stats {
	atomic_uint_least64_t backing_bytes_read; /* bytes read from the backing store */
	atomic_uint_least64_t backing_reads; /* read calls on the backing store */
	atomic_uint_least64_t backing_opens; /* files of a local backing folder opened to read */
	atomic_int_least64_t kept_files; /* gauge: of them, held open across reads (raw arrays) */
	atomic_uint_least64_t chunks_decoded; /* chunk decodes (cache misses that decoded) */
	atomic_uint_least64_t decoded_bytes; /* bytes produced by chunk decodes */
	atomic_uint_least64_t cache_hits;
	atomic_uint_least64_t cache_misses;
	atomic_uint_least64_t cache_evictions;
	atomic_uint_least64_t bytes_served; /* bytes returned to readers */
	atomic_uint_least64_t bytes_written; /* bytes accepted from writers */
	atomic_int_least64_t bytes_pending; /* accepted, not yet compressed+stored */
	atomic_uint_least64_t stored_bytes_written; /* compressed bytes written to disk */
	atomic_uint_least64_t commits;
	atomic_uint_least64_t commit_failures;
	atomic_uint_least64_t errors_logged; /* error lines logged (ckpt_log at CKPT_LOG_ERR) */
	atomic_uint_least64_t cache_bytes; /* gauge: bytes held by the decoded-unit cache */
	atomic_uint_least64_t cache_budget; /* its byte budget (cache_size) */
	atomic_uint_least64_t hidden_nodes; /* gauge: names made on lookup alive (slice files, ...) */
	/* gauge: steps committed to an object store whose marker's outcome is
	 * not known (they stay pending until a touch of the marker settles it) */
	atomic_int_least64_t unsettled_steps;
	atomic_uint_least64_t stored_copy_bytes; /* bytes read from STEP/.stored/ files */
	atomic_uint_least64_t
		steps_freed; /* steps pruned from a live root whose nodes, arrays and stores were freed */
} ckpt_stats;

extern ckpt_stats ckpt_g_stats;

#define CKPT_STAT_ADD(field, n) atomic_fetch_add_explicit(&ckpt_g_stats.field, (n), memory_order_relaxed)

/* Render all counters as one JSON object into buf (NUL-terminated).
 * Returns the length, or a negative errno if buf is too small. */
int ckpt_stats_json(char *buf, size_t cap);

#endif
