/*
 * array.h - reading stored arrays: the read context (decoded-chunk cache +
 * decode threads) and array handles that serve any byte range of any
 * region (whole array, slice, stored shard) in C order.
 *
 * A read decodes only the decode units (chunks) that overlap the requested
 * bytes, through the shared cache (one decode per chunk even under
 * concurrent misses), decoding several chunks in parallel on the context's
 * threads, and prefetching the chunks a sequential reader needs next.
 *
 * Thread-safety: a context and its arrays are safe to use from many
 * threads at once.  Arrays must be destroyed before their context.
 */
#ifndef CKPT_ARRAY_H
#define CKPT_ARRAY_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "slice.h"
#include "store.h"
#include "zarr_chunk.h"
#include "support.h"

typedef struct ckpt_ctx ckpt_ctx;
typedef struct ckpt_array ckpt_array;

/* ckpt_ctx_opts: public (ckpt/support.h). */

int ckpt_ctx_create(const ckpt_ctx_opts *opts, ckpt_ctx **out);
void ckpt_ctx_destroy(ckpt_ctx *ctx);

struct ckpt_pool;
/* The context's decode threads (base/pool.h), started on first use (in a
 * child after a fork, anew), for other work that reads ahead: the OCDBT
 * B+tree node fetches of ckpt_store_ocdbt_open_pool.  NULL when no thread
 * could be started. */
struct ckpt_pool *ckpt_ctx_pool(ckpt_ctx *ctx);

/* Wait until the context's decode threads are at rest: no prefetch or
 * other task queued or running (base/pool.h).  A process may fork after
 * this returns, as long as nothing new was submitted meanwhile (a daemon
 * that forks after building its view). */
void ckpt_ctx_quiesce(ckpt_ctx *ctx);

/* Open the array whose zarr metadata is stored under `prefix` in `store`
 * (`prefix/zarr.json` or `prefix/.zarray`; format 0 tries v3 then v2).
 * The store must outlive the array.  Returns -ENOENT when no metadata
 * exists, -EINVAL/-ENOTSUP (logged with the key and reason) when it is
 * unusable. */
int ckpt_array_open(ckpt_ctx *ctx, ckpt_store *store, const char *prefix, int format, ckpt_array **out);

/* Options of ckpt_array_open_ex; a zeroed struct means ckpt_array_open's
 * behaviour. */
typedef struct ckpt_array_open_opts {
	int format; /* 2, 3, or 0: try zarr.json, then .zarray */
	/* Every chunk the metadata implies is stored (Orbax's
	 * store_array_data_equal_to_fill_value true, or a step ckptfs wrote):
	 * a chunk, shard, inner chunk or OCDBT key the store lacks makes the
	 * reads that need it fail with -EIO (logged once per chunk), never the
	 * fill value.  Without it a missing unit reads as the fill value
	 * (zeros for a v2 fill_value null). */
	int missing_is_error;
} ckpt_array_open_opts;

/* ckpt_array_open with options (o may be NULL).  On failure nothing is
 * allocated and one line is logged naming the metadata key and the reason
 * (for an unsupported codec or data type, its name); what the caller does
 * with the array (leave it out, show it as unreadable) is the caller's to
 * log. */
int ckpt_array_open_ex(ckpt_ctx *ctx, ckpt_store *store, const char *prefix, const ckpt_array_open_opts *o,
		       ckpt_array **out);
void ckpt_array_destroy(ckpt_array *a);

/*
 * Data that changes under a mount.  Each decoded chunk in the cache
 * remembers the identity (size, mtime; or "absent") of the stored unit it
 * came from.  ckpt_array_revalidate() starts a new epoch: the next use of
 * each cached chunk stats its stored unit once (one ckpt_store_stat per
 * storage unit per epoch) and, when the identity differs, drops every
 * cached chunk of the array, so the read decodes the new bytes (or fails:
 * -EIO for a unit now missing when missing_is_error).  A unit found
 * changed while decoding, after the same epoch already served bytes of
 * its earlier version, answers -ESTALE rather than mixing versions, and so
 * does every read of the array until the next epoch (a retried read must
 * not get the new version next to bytes of the old one).  Units read as
 * streams (over the cache's unit cap) are checked around every read: their
 * cursor never continues into a changed unit.
 * Callers call it when a file backed by the array is opened.  Thread-safe.
 */
void ckpt_array_revalidate(ckpt_array *a);

/*
 * Revalidation at the open of a file backed by the array, cheap enough to
 * run on every open: starts a new epoch (as ckpt_array_revalidate) and
 * checks, spending at most *budget store stats (decremented by what it
 * used), the array's metadata file and then the identities of up to 64
 * storage units it recorded, the next ones round-robin over its records
 * (an array that served at most 64 units is checked whole on every open;
 * a larger one over successive opens; the units not checked are still
 * checked at their next use in this epoch).  A changed unit drops the
 * array's cached chunks and stream cursors; changed metadata (other bytes,
 * or none: the array was removed or rewritten) makes every later read of
 * the array -ESTALE.
 *
 * Returns the array's change count, which moves whenever bytes it served
 * may be stale or their records were dropped.  A caller keeping served
 * bytes (the kernel page cache of a file) compares it with the value its
 * previous open got: when it differs, the kept bytes must be dropped.
 * Thread-safe.
 */
unsigned ckpt_array_open_check(ckpt_array *a, int *budget);

/* The stored data of these arrays went for good (their step was deleted
 * from the source): their decoded chunks leave the cache now (those in
 * use at their release) and their stream cursors are dropped; from then on
 * every read is -ESTALE.  A read that passed its state check just before
 * may still cache a chunk; calling this again for arrays retired already
 * (as their step is freed, once nothing reads them) drops those too.  The
 * arrays stay valid until ckpt_array_destroy.  Thread-safe. */
void ckpt_arrays_retire(ckpt_ctx *ctx, ckpt_array *const *arrs, size_t n);

/* The cache owner a's chunks are cached under now: a fresh one after a
 * stored unit changed or a retire (tests look entries up with it). */
uint64_t ckpt_array_cache_owner(const ckpt_array *a);
/* The context's decoded-chunk cache. */
struct ckpt_cache *ckpt_ctx_cache(ckpt_ctx *ctx);

const ckpt_array_meta *ckpt_array_meta_of(const ckpt_array *a);
ckpt_store *ckpt_array_store(const ckpt_array *a);
const char *ckpt_array_prefix(const ckpt_array *a);

/* Copy bytes [off, off+len) of region r's C-order byte stream into dst.
 * r must lie inside the array.  Returns len (clipped at the end of the
 * stream), or -EIO when a chunk it needs cannot be decoded or is missing
 * (see missing_is_error), -ESTALE (see ckpt_array_revalidate).  Failures
 * are never cached: the next read tries the store again. */
ssize_t ckpt_array_read(ckpt_array *a, const ckpt_region *r, uint64_t off, size_t len, void *dst);

/* Zero-copy variant of ckpt_array_read: when r is the whole array in C
 * order, map bytes [off, off+len) onto at most `max` pieces of pinned
 * cache memory, one per contiguous run of a chunk (a chunk spanning every
 * dimension but the first is one run; an array split by columns gives one
 * run per row and chunk).  pins[0..n) are the distinct chunks behind the
 * pieces followed by NULLs; every iov[i] stays valid until all of them are
 * unpinned.  Returns the number of pieces n (0 at the end of the stream),
 * -ENOTSUP when the layout or the range does not allow it (more than `max`
 * pieces, or than 64 chunks, behind the range; the caller then copies with
 * ckpt_array_read), -EIO as ckpt_array_read.  Unpin every entry of
 * pins[0..n) with ckpt_ctx_unpin (NULL is allowed) once the bytes are sent. */
struct iovec;
typedef struct ckpt_centry ckpt_pin;
int ckpt_array_map(ckpt_array *a, const ckpt_region *r, uint64_t off, size_t len, struct iovec *iov,
		   ckpt_pin **pins, int max);
void ckpt_ctx_unpin(ckpt_ctx *ctx, ckpt_pin *pin);

/* Visit the decoded chunks that overlap region box (inside the array):
 * fn(arg, data, chunk) for each, in C order of the chunk grid, where data
 * holds the chunk's elements in C order over the whole chunk region
 * `chunk` (its start is the chunk's origin; an edge chunk's region may
 * reach past the array's shape), pinned for the call.  The other chunks
 * are queued for decoding before the first is waited for.  A nonzero
 * return of fn stops the walk and is returned.  0, or -ENOTSUP when the
 * array's chunks are not kept in the cache (chunks over the cache's unit
 * cap, which are streamed; Fortran-order chunks; rank 0: the caller then
 * copies with ckpt_array_read), -EIO, -ESTALE as ckpt_array_read. */
typedef int (*ckpt_chunk_fn)(void *arg, const void *data, const ckpt_region *chunk);
int ckpt_array_visit(ckpt_array *a, const ckpt_region *box, ckpt_chunk_fn fn, void *arg);
/* Queue, without waiting, the decode of the chunks behind bytes
 * [off, off+len) of region r's stream (they land in the cache).  Used to
 * warm the next file of a reader walking a directory. */
void ckpt_array_prefetch(ckpt_array *a, const ckpt_region *r, uint64_t off, uint64_t len);

/* Queue, without waiting, the decode of the first chunks (in grid order)
 * of region box, at most max_bytes of the cache's budget (at most 64
 * chunks): the next array a reader that walks arrays in turn will need,
 * decoded while it still reads the current one.  Chunks already cached
 * or queued are not queued again (they count against max_bytes).  Making
 * room for them evicts the least recently used idle chunks, so a caller
 * keeps max_bytes within what the cache holds beside the chunks still in
 * use. */
void ckpt_array_prefetch_box(ckpt_array *a, const ckpt_region *box, uint64_t max_bytes);
/* A reader that walks arrays in turn is done with a: its cached chunks
 * go to the cold end of the cache (evicted first, ckpt_cache_cool_owner),
 * ahead of chunks queued for the next arrays. */
void ckpt_array_cool(ckpt_array *a);
/* The budget all of a's chunks take when cached (chunks times the
 * charge of one, ckpt_cache_charge). */
uint64_t ckpt_array_cached_bytes(const ckpt_array *a);
/* The decoded-chunk cache's budget in bytes (-o cache_size). */
uint64_t ckpt_array_cache_budget(const ckpt_array *a);
/* Bytes a sequential reader is read ahead by (the context's window). */
uint64_t ckpt_array_window(const ckpt_array *a);

/* Sum of stored bytes of the array's chunks (computed once, then cached). */
int ckpt_array_stored_bytes(ckpt_array *a, uint64_t *out);

#endif
