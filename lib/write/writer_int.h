/*
 * writer_int.h - internals of the writer, shared by its files.  Not a public
 * header: see writer.h for the API and its contracts.
 *
 * Files, top to bottom (each calls only files below it, never one above):
 *   writer_hosts.c   several hosts, one step: a wrapper around a step (its state
 *                    is its own), declaration records, done records, the
 *                    primary's merge (then writer_commit.c commits)
 *   writer.c         begin, write, read back, abort, destroy (the API entry points)
 *   writer_commit.c  the commit protocol: holes report, metadata files, rename
 *   writer_decl.c    items, arrays, pytree key-path consistency, queries
 *   writer_zpool.c   compression threads: take a job, compress, append, report
 *   writer_chunk.c   every chunk state transition: budget, buffers, pins, queue,
 *                    spill, reload, stored/error/retry (the state table is there)
 *   writer_shard.c   shard files: path, O_DIRECT append, read-back, index + fsync
 *   writer_table.c   the sparse chunk and shard tables (pages allocated on first touch)
 *   writer_geom.c    chunk and shard shapes, chunk coordinates
 *   writer_cov.c     byte coverage of a chunk buffer
 * writer_table.c, writer_geom.c and writer_cov.c are leaves (base/ and format/ only).  A byte
 * range of a region's stream is cut into per-chunk pieces by format/slice.c
 * (ckpt_stream_pieces on ckpt_warray.grid).
 */
#ifndef CKPT_WRITER_INT_H
#define CKPT_WRITER_INT_H

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "lockrank.h"
#include "orbax.h"
#include "writer.h"

#define W_MAX_CHUNKS ((uint64_t)1 << 24)
#define W_COV_INLINE 32 /* intervals kept before switching to a bitmap */
#define W_DIO_ALIGN 4096 /* O_DIRECT appends: offset, length and buffer alignment */
#define W_CPAGE_SHIFT 10 /* chunk table: 1024 chunks a page */
#define W_CPAGE ((uint64_t)1 << W_CPAGE_SHIFT)
#define W_SPAGE_SHIFT 8 /* shard table: 256 shards a page */
#define W_SPAGE ((uint64_t)1 << W_SPAGE_SHIFT)

/* Chunk states.  writer_chunk.c owns every transition (its header has the
 * transition table and the fields each state implies); all happen under
 * array->mu.  BUSY states (COMPRESSING, SPILLING, LOADING) belong to one
 * thread doing I/O or compression; everybody else waits on array->cond. */
enum wc_state {
	WC_EMPTY = 0, /* nothing written, no memory */
	WC_LIVE, /* buffer in memory, not complete (or complete and pinned) */
	WC_QUEUED, /* complete, waiting for a compression thread */
	WC_COMPRESSING, /* a compression thread owns the buffer */
	WC_STORED, /* compressed bytes at (off, len) in the shard file */
	WC_ERROR, /* complete, storing failed; buffer kept, retried at commit */
	WC_SPILLING, /* partial, being written to the spill file */
	WC_SPILLED, /* partial, data+coverage in the spill file, no memory */
	WC_LOADING, /* being re-read from the spill file or the shard file */
};

/* Distinct byte coverage of one chunk buffer: a sorted list of disjoint,
 * non-adjacent intervals while short, else a bitmap (1 bit per byte). */
struct wcov {
	uint32_t n;
	uint64_t iv[W_COV_INLINE][2];
	uint64_t *bm; /* non-NULL: bitmap mode, ceil(nbytes/64) words */
};

/* In-memory state of a chunk that has a buffer (LIVE, QUEUED,
 * COMPRESSING, ERROR, SPILLING, LOADING). */
struct wlive {
	pthread_mutex_t mu; /* buf contents and cov */
	uint8_t *buf; /* chunk_nbytes, C order, zero where unwritten */
	size_t bufcap; /* buf's capacity (ckpt_hugebuf_alloc) */
	struct wcov cov;
	struct ckpt_warray *arr;
	uint64_t idx; /* linear chunk index */
	struct wlive *qnext; /* compression queue, under step->mu */
	struct wlive *lru_prev, *lru_next; /* spill candidates, under step->mu */
	uint8_t in_queue, in_lru;
};

/* One inner chunk.  Under array->mu; written only by writer_chunk.c.  An
 * entry of the sparse table (writer_table.c): a chunk without an entry is
 * EMPTY. */
_Static_assert(WC_LOADING < 256, "wchunk.state is a uint8_t");

struct wchunk {
	uint8_t state; /* enum wc_state */
	uint32_t pins; /* writers/readers using the buffer */
	uint64_t have; /* distinct in-bounds bytes written */
	struct wlive *live; /* non-NULL iff the chunk holds memory */
	uint64_t spill_slot; /* spill slot, encoded: 0 = none, else file offset + 1
			      * (read/written only by writer_chunk.c's spill_slot_* helpers) */
	uint64_t off, len; /* STORED: extent in the shard file */
};

/* Shard file states (writer_shard.c owns the transitions). */
enum wsh_state {
	WSH_OPEN = 0, /* chunks are appended; the index is written at commit */
	WSH_FINISHED, /* index written, fsynced, handed to the step's sink (early finish) */
};

_Static_assert(WSH_FINISHED < 256, "wshard.state is a uint8_t");

/* One shard file; an entry of the sparse shard table (writer_table.c),
 * made when one of its chunks is first written. */
struct wshard {
	pthread_mutex_t mu; /* end */
	uint64_t end; /* append offset (data bytes; the index goes here at commit) */
	uint64_t unstored; /* in-bounds chunks not STORED, under array->mu */
	/* enum wsh_state, under array->mu; changed only by writer_shard.c's
	 * shard_set_state (its header has the transition table) */
	uint8_t state;
	int finishing; /* a counter, not a state: early finishes in progress
			* (ckpt_w_shard_finish_early); under array->mu */
	unsigned gen; /* bumped when a STORED chunk leaves STORED; under array->mu */
};

struct witem {
	char *name;
	struct ckpt_warray *first, *last;
	uint64_t narrays;
	char *json; /* JSON item: the file's bytes (NUL-terminated), NULL for a pytree item */
	size_t json_len;
	char *handler; /* item handler named in _CHECKPOINT_METADATA, NULL = ckptfs's default */
	int stored; /* a stored copy: its folder holds the files as copied; committed as they are */
	struct witem *next;
};

typedef _Atomic(struct wchunk *) w_chunk_page;
typedef _Atomic(struct wshard *) w_shard_page;

struct ckpt_warray {
	struct ckpt_step *step;
	struct witem *item;
	char *name; /* param name */
	char *relpath; /* "<item>/<name>" below the tmp folder */
	char **keys;
	int *ktypes;
	int depth;
	ckpt_dtype dtype;
	unsigned isz;
	int rank;
	uint64_t shape[CKPT_MAX_RANK];
	uint64_t inner[CKPT_MAX_RANK]; /* inner chunk shape */
	uint64_t shard[CKPT_MAX_RANK]; /* shard shape (multiple of inner) */
	uint64_t nch[CKPT_MAX_RANK]; /* inner chunks per dim */
	ckpt_chunk_grid grid; /* inner, nch: for ckpt_stream_pieces */
	uint64_t mps[CKPT_MAX_RANK]; /* inner chunks per shard per dim */
	uint64_t nsh[CKPT_MAX_RANK]; /* shards per dim */
	uint64_t nchunks, nshards;
	uint64_t chunk_nbytes; /* raw bytes of one (padded) inner chunk */
	uint64_t bm_bytes; /* bytes of a coverage bitmap */
	uint64_t live_cost; /* budget charged per live chunk */
	uint64_t nbytes; /* logical bytes */
	struct ckpt_warray *next; /* in item */

	pthread_mutex_t mu;
	pthread_cond_t cond;
	_Atomic(w_chunk_page *) cdir; /* chunk table directory (writer_table.c), NULL: none touched */
	_Atomic(w_shard_page *) sdir; /* shard table directory, NULL: none touched */
	char *sharding;
	uint64_t have_total; /* sum of the chunks' have */
	uint64_t stored_bytes; /* compressed bytes appended (incl. dead copies) */
	uint64_t nstored;
	atomic_int err; /* last background errno (0 none); set by compression threads,
			 * read by commit */
	atomic_bool removed; /* ckpt_warray_remove: writes fail, kept until destroy */
};

struct ckpt_step {
	char *root; /* root folder */
	char *name; /* step_name */
	char *tmpname; /* "<name>.orbax-checkpoint-tmp" */
	char *tmppath; /* root/tmpname */
	/* the whole step is stored as written (an Orbax save through the
	 * mount): the commit only drops *.__lock files, fsyncs and renames;
	 * set before any write (ckpt_step_set_as_written) */
	int as_written;
	int rootfd, dirfd;
	int64_t init_ns;
	ckpt_writer_opts opts;

	pthread_mutex_t decl_mu;
	struct witem *items, *items_last;
	struct whash *nodes; /* pytree nodes and param names, see writer.c */
	struct ckpt_warray *removed; /* removed arrays (linked by next), freed at destroy */
	uint64_t narrays, bytes_declared;

	pthread_mutex_t mu; /* leaf lock for everything below */
	pthread_cond_t memcond; /* memory freed / a chunk became spillable */
	pthread_cond_t qcond; /* work queued or stop */
	pthread_cond_t idlecond; /* background work finished */
	uint64_t mem_used; /* charged live chunks + cached buffers */
	uint64_t inflight; /* bytes charged to QUEUED/COMPRESSING/SPILLING/LOADING chunks */
	uint64_t npinned; /* live chunks with pins > 0 */
	uint64_t pins_total; /* all pins (commit refuses while > 0) */
	struct wlive *qhead, *qtail;
	struct wlive *lru_head, *lru_tail; /* oldest first */
	struct wbuf *cache; /* free buffers kept warm */
	uint64_t cached_bytes, ncached;
	int spill_fd;
	uint64_t spill_end;
	uint64_t nspilled;
	uint64_t spills; /* spill operations so far */
	uint64_t bytes_pending;
	uint64_t stored_bytes;
	int io_err; /* sticky background error since the last commit attempt */
	atomic_int no_direct; /* the shard folder's file system refused O_DIRECT */
	int stop; /* compression threads exit; under mu */
	atomic_int state; /* enum ckpt_step_state; read by writes without a lock */
	int nthreads;
	pthread_t *threads;
	/* Multi-host step: the wrapper's state (writer_hosts.c), NULL for one
	 * host.  The wrapper owns it: it sets hosts_free with it, and the step
	 * only hands it back to hosts_free when freed (writer.c never calls
	 * writer_hosts.c, which is above it in the file map). */
	struct whosts *hosts;
	void (*hosts_free)(struct ckpt_step *st);
	struct ckpt_step_sink sink; /* shard_done NULL: none (set before any write) */
};

/* ---- writer_table.c ---- */

/* Chunk idx / shard sidx, NULL when it has no entry (an EMPTY chunk, a
 * shard with no chunk written).  No lock needed for the lookup. */
struct wchunk *ckpt_w_chunk_at(const struct ckpt_warray *a, uint64_t idx);
struct wshard *ckpt_w_shard_at(const struct ckpt_warray *a, uint64_t sidx);
/* Under a->mu: the entry of chunk idx (and of its shard) / of shard sidx,
 * made (zeroed: EMPTY) if needed; NULL on ENOMEM. */
struct wchunk *ckpt_w_chunk_touch(struct ckpt_warray *a, uint64_t idx);
struct wshard *ckpt_w_shard_touch(struct ckpt_warray *a, uint64_t sidx);
/* The first chunk (shard) >= idx whose table page exists, else nchunks
 * (nshards): for (i = ckpt_w_chunk_next(a, 0); i < n; i = ckpt_w_chunk_next(a, i + 1))
 * visits every chunk that may be non-EMPTY, O(touched pages). */
uint64_t ckpt_w_chunk_next(const struct ckpt_warray *a, uint64_t idx);
uint64_t ckpt_w_shard_next(const struct ckpt_warray *a, uint64_t sidx);
/* In-bounds chunks of shard sidx; the chunk of entry e (C order in the
 * shard's chunk grid) of shard sidx, UINT64_MAX when outside the array. */
uint64_t ckpt_w_shard_nchunks(const struct ckpt_warray *a, uint64_t sidx);
uint64_t ckpt_w_shard_entry_chunk(const struct ckpt_warray *a, uint64_t sidx, uint64_t e);
/* Bytes allocated for both tables (tests). */
uint64_t ckpt_w_tab_bytes(const struct ckpt_warray *a);
/* Free both tables (destroy the shard mutexes). */
void ckpt_w_tab_free(struct ckpt_warray *a);

/* ---- writer_geom.c ---- */

/* Choose inner chunk and shard shapes and fill the derived geometry of a
 * (shape, rank, dtype set) array.  -EFBIG when too many chunks. */
int ckpt_w_geom_init(struct ckpt_warray *a, uint64_t chunk_bytes, uint64_t shard_bytes);

/* Validate region against a (NULL = whole array) and fill *out. */
int ckpt_w_region_check(const struct ckpt_warray *a, const ckpt_region *region, ckpt_region *out,
			uint64_t *nbytes);

/* In-bounds bytes of chunk `idx`. */
uint64_t ckpt_w_chunk_need(const struct ckpt_warray *a, uint64_t idx);

/* Grid coordinates of linear chunk idx; shard index of a chunk. */
void ckpt_w_chunk_coords(const struct ckpt_warray *a, uint64_t idx, uint64_t *cg);
uint64_t ckpt_w_chunk_shard(const struct ckpt_warray *a, uint64_t idx);
/* The in-bounds box of chunk idx, global coordinates. */
void ckpt_w_chunk_region(const struct ckpt_warray *a, uint64_t idx, ckpt_region *r);

/* ---- writer_cov.c ---- */
/* Add [a, b) to the coverage; returns the number of bytes not covered
 * before, or -ENOMEM (the bitmap could not be allocated; nothing added). */
int64_t ckpt_w_cov_add(struct wcov *c, uint64_t nbytes, uint64_t a, uint64_t b);
/* Remove [a, b); returns the number of bytes covered before, or -ENOMEM
 * (a split needed the bitmap, which could not be allocated; nothing removed). */
int64_t ckpt_w_cov_remove(struct wcov *c, uint64_t nbytes, uint64_t a, uint64_t b);
/* Call fn(ctx, s, e) for each maximal covered run [s, e) inside [a, b), in
 * order; stops at and returns fn's first non-zero result. */
int ckpt_w_cov_each(const struct wcov *c, uint64_t a, uint64_t b,
		    int (*fn)(void *ctx, uint64_t s, uint64_t e), void *ctx);
void ckpt_w_cov_fill(struct wcov *c, uint64_t nbytes); /* everything covered */
void ckpt_w_cov_free(struct wcov *c);
/* Serialize as a bitmap of bm_bytes (for the spill slot) / restore. */
int ckpt_w_cov_to_bitmap(struct wcov *c, uint64_t nbytes);

/* ---- writer_shard.c ---- */

/* Relative path "<item>/<name>/c/<i>/<j>" of shard sidx (into buf); its
 * length or -ENAMETOOLONG. */
int ckpt_w_shard_path(const struct ckpt_warray *a, uint64_t sidx, char *buf, size_t cap);
/* Append n compressed bytes z (buffer of zcap bytes, W_DIO_ALIGN-aligned,
 * zcap >= n rounded up to W_DIO_ALIGN) to shard sidx, creating it and its
 * folders.  0 with the offset in *off and the open fd in *fd (hand it to
 * ckpt_w_shard_append_done), or -errno with the reason in why. */
int ckpt_w_shard_append(struct ckpt_warray *a, uint64_t sidx, uint8_t *z, size_t n, size_t zcap,
			uint64_t *off, int *fd, char *why, size_t wcap);
/* Close the fd of an append; shard_complete: start writeback of the file. */
void ckpt_w_shard_append_done(int fd, int shard_complete);
/* Read and decode a STORED chunk (extent off, len) into dst (chunk_nbytes);
 * -EIO/-ENOMEM, logged. */
int ckpt_w_shard_load_chunk(struct ckpt_warray *a, uint64_t idx, uint64_t off, uint64_t len, uint8_t *dst);
/* Commit: write every shard's index at its end, fsync the shard files and
 * the array's c/ folders.  Every in-bounds chunk must be STORED. */
int ckpt_w_shard_finish_all(struct ckpt_step *st, struct ckpt_warray *a);
/* Compression thread, after ckpt_w_chunk_store_done returned shard_done with a
 * sink set (and counted sh->finishing): finish shard sidx now, mark it
 * finished and hand it to the sink, unless it changed meanwhile. */
void ckpt_w_shard_finish_early(struct ckpt_warray *a, uint64_t sidx);
/* Under a->mu: a STORED chunk of shard sidx leaves STORED (rewrite, reset):
 * the shard is no longer finished; the sink hears of it. */
void ckpt_w_shard_unfinish_locked(struct ckpt_warray *a, uint64_t sidx);
/* fsync folder rel of the tmp folder; -errno logged. */
int ckpt_w_fsync_dir(struct ckpt_step *st, const char *rel);

/* ---- writer_chunk.c ---- */

/* Called under the chunk buffer's lock with the pinned buffer and its
 * coverage; sets *added to the newly covered bytes (also on failure). */
typedef int (*w_chunk_fill_fn)(void *ctx, uint8_t *buf, struct wcov *cov, uint64_t *added);
/* Called with the chunk's bytes (chunk_nbytes), NULL = all zero. */
typedef void (*w_chunk_copy_fn)(void *ctx, const uint8_t *bytes);

/* Write into chunk idx: pin it with a buffer (allocating within the budget,
 * or re-reading a spilled or stored chunk), run fill, unpin (queueing the
 * chunk for compression once complete).  fill's error or -errno. */
int ckpt_w_chunk_write(struct ckpt_warray *a, uint64_t idx, w_chunk_fill_fn fill, void *ctx);
/* Drop bytes of chunk idx: pin it as for a write (a STORED or SPILLED chunk
 * is re-read; an EMPTY one is left alone: 0 at once), run drop, which
 * clears coverage and zeroes the bytes and sets *removed to the bytes no
 * longer covered, unpin (a complete chunk that lost bytes is LIVE again).
 * drop's error or -errno. */
int ckpt_w_chunk_forget(struct ckpt_warray *a, uint64_t idx, w_chunk_fill_fn drop, void *ctx);
/* Read chunk idx: copy(ctx, bytes) with its live buffer (pinned, under its
 * lock), a copy read into *scratch (chunk_nbytes, allocated on first need,
 * the caller frees it), or NULL when never written.  0, -ENOMEM or -EIO. */
int ckpt_w_chunk_read(struct ckpt_warray *a, uint64_t idx, uint8_t **scratch, w_chunk_copy_fn copy,
		      void *ctx);
/* Compression threads: wait for a queued chunk and make it COMPRESSING
 * (0, the chunk's array, index and buffer), or -ECANCELED once st->stop. */
int ckpt_w_chunk_take_job(struct ckpt_step *st, struct ckpt_warray **a, uint64_t *idx, struct wlive **l);
/* The outcome of a job: rc 0 = stored at (off, len) -> STORED and the
 * buffer freed; else ERROR (why logged once per array).  Returns 1 when
 * that was the last unstored chunk of its shard. */
int ckpt_w_chunk_store_done(struct ckpt_warray *a, uint64_t idx, int rc, uint64_t off, uint64_t len,
			    const char *why);
/* Multi-host commit (writer_hosts.c): an EMPTY chunk becomes STORED at
 * (off, len) of its shard file, whose bytes another host compressed. */
int ckpt_w_chunk_adopt_stored(struct ckpt_warray *a, uint64_t idx, uint64_t off, uint64_t len);
/* Commit: queue every ERROR chunk again and clear the sticky errors. */
void ckpt_w_chunk_retry_errors(struct ckpt_step *st);
/* Drop every byte of chunk idx (waits for BUSY and QUEUED states to end and
 * for pins to drop), making it EMPTY; a stored copy stays in the shard file
 * as dead bytes. */
void ckpt_w_chunk_reset(struct ckpt_warray *a, uint64_t idx);
/* Wait until nothing is queued, compressing, spilling or loading. */
void ckpt_w_chunk_wait_idle(struct ckpt_step *st);
/* Destroy: free every buffer of a (no thread may use it any more) / the
 * warm free buffers of st. */
void ckpt_w_chunk_free_all(struct ckpt_step *st, struct ckpt_warray *a);
void ckpt_w_chunk_cache_free(struct ckpt_step *st);
/* Check every chunk of st against the state table and the step's and
 * arrays' accounting against the chunks (tests; also usable from a
 * debugger).  Only meaningful when the step is quiet: no call in progress
 * and ckpt_w_chunk_wait_idle returned.  0, or -EUCLEAN with each problem logged. */
int ckpt_w_chunk_check_all(struct ckpt_step *st);

/* ---- writer_zpool.c ---- */
int ckpt_w_zpool_start(struct ckpt_step *st);
void ckpt_w_zpool_stop(struct ckpt_step *st);

/* ---- writer_decl.c ---- */
int ckpt_w_keytab_create(struct ckpt_step *st);
void ckpt_w_keytab_free(struct ckpt_step *st);
void ckpt_w_warray_free(struct ckpt_warray *a);
/* 0 while the step is pending, else -EROFS (logged with `what`). */
int ckpt_w_step_writable(struct ckpt_step *st, const char *what);

/* ---- writer_commit.c ---- */
int ckpt_w_commit(struct ckpt_step *st, const char *final_name);
/* _CHECKPOINT_METADATA: provisional at begin (commit_ns 0), final at commit. */
int ckpt_w_write_ckpt_metadata(struct ckpt_step *st, int64_t commit_ns);
/* v as a JSON number (a raw cJSON node, exact beyond 2^53); NULL on ENOMEM. */
struct cJSON *ckpt_w_json_u64(uint64_t v);
/* v[0..n) as a JSON array of such numbers; NULL on ENOMEM. */
struct cJSON *ckpt_w_json_shape(const uint64_t *v, int n);

/* ---- writer_hosts.c: records one host reads from another ---- */

/* A parsed declaration record (decl/<item>/<param>, and each entry of a
 * done record's "arrays"): strings point into the cJSON tree. */
struct w_decl {
	const char *item;
	const char *keys[CKPT_ORBAX_MAX_DEPTH];
	int types[CKPT_ORBAX_MAX_DEPTH];
	int depth;
	ckpt_dtype dtype;
	int rank;
	uint64_t shape[CKPT_MAX_RANK], chunk[CKPT_MAX_RANK], shard[CKPT_MAX_RANK];
	int host; /* -1 when absent */
};

/* 0 and *d, or -EINVAL when j is no usable declaration record (fuzz_hosts_done). */
int ckpt_w_decl_parse(const struct cJSON *j, struct w_decl *d);
/* A record's count or offset: 0 when j is no number or not positive,
 * UINT64_MAX when it is 2^64 or more (as the written 2^64-1 reads back). */
uint64_t ckpt_w_json_to_u64(const struct cJSON *j);

#endif
