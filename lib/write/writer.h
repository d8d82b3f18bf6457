/*
 * writer.h - the write path of libckpt: pending checkpoint steps, chunk
 * assembly from many concurrent writers, background zstd compression into
 * zarr v3 `sharding_indexed` shard files, and the atomic commit that turns
 * a pending step into an Orbax checkpoint step that orbax-checkpoint +
 * TensorStore restore (use_ocdbt=false, use_zarr3=true).  docs/format.md
 * ("What ckptfs writes") describes the bytes on disk.
 *
 * Life of a step:
 *
 *   ckpt_step_begin(root, "30", opts, &st)     creates <root>/30.orbax-checkpoint-tmp/
 *   ckpt_step_add_array(st, "state", keys...)   declares an array, returns a handle
 *   ckpt_warray_write(a, region, off, buf, n)   any number of threads, any order
 *   ckpt_step_commit(st, "30")                  fsync everything, rename to <root>/30
 *   ckpt_step_destroy(st)
 *
 * or ckpt_step_abort(st) + ckpt_step_destroy(st) to throw the step away.
 *
 * Pending data: every array is cut into inner chunks (zarr "chunk_shape"
 * inside the shard codec) of about opts.chunk_bytes, grouped into shards
 * (the zarr chunk grid) of about opts.shard_bytes raw bytes; one shard is
 * one file.  A write copies its bytes into in-memory chunk buffers and
 * returns.  When every in-bounds byte of an inner chunk has been written,
 * the chunk is compressed by a background thread and appended to its
 * shard file; its memory is then freed.  Buffered memory is bounded by
 * opts.mem_budget: a write that needs a fresh chunk buffer waits until
 * compression frees memory; if nothing can be freed that way (all
 * buffered chunks are partial, e.g. writers filling interleaved column
 * slices) partial chunks are spilled to an unlinked scratch file inside
 * the tmp folder and re-read when written again (only a spilled chunk's
 * written bytes and the non-zero blocks of its coverage bitmap are written
 * there: the rest of its slot stays a hole, so the file takes about the
 * bytes written, not whole chunks).  Writes never fail for
 * lack of budget.  One exception: if a single chunk is bigger than the
 * budget, or all buffered chunks are pinned by writers in progress
 * and nothing else can be freed, the budget is exceeded rather than
 * deadlocking (by at most one chunk per writing thread).
 *
 * Memory outside the budget: a few hundred bytes per declared array and a
 * hash entry per pytree node; the chunk and shard tables are sparse (pages
 * of 1024 chunks / 256 shards made on the first write to one of them, about
 * 48 bytes per chunk and 72 per shard of a touched page), so a declaration
 * that nothing was written to costs a constant whatever its size; one
 * ZSTD_compressBound(chunk) output buffer per compression thread, and one
 * chunk-sized scratch buffer per ckpt_warray_read call in progress.
 *
 * Byte accounting: coverage is tracked per chunk at byte granularity and
 * counts distinct bytes, so writing bytes again (mmap writeback, retries)
 * is never double counted.  Writes may start and end mid-element.
 * Rewriting a chunk that was already compressed re-reads it, applies the
 * write and compresses it again (the old copy stays in the shard file as
 * dead bytes).
 *
 * Several writers, one value (ckpt_warray_write_flags with CKPT_WRITE_SAME,
 * which the mount uses when several files write one array): a write over
 * bytes already written must bring the same bytes -- a retry, an array
 * every process writes whole, overlapping slice files of one array all do.
 * A write that would change a written byte is refused with -EINVAL,
 * logged with the array and the byte's offset in the array and in the
 * written stream; the first writer's bytes stay.  One
 * exception: a written zero may be overwritten with any value, because
 * np.lib.format.open_memmap writes an array's last byte as zero to size the
 * file before the data comes (so a conflict of a zero with another value is
 * not detected).  To write other bytes, forget them first
 * (ckpt_warray_forget: what an O_TRUNC of the file does).  Only bytes
 * already covered are compared (the coverage map says which), with memcmp;
 * a first write compares nothing.  The check is per chunk: pieces of the
 * same write in earlier chunks may already be applied when a later chunk
 * refuses.  The multi-host merge (writer_hosts.c) does not check: a host's
 * whole chunk wins over other hosts' partial bytes (docs/format.md).
 *
 * Errors: negative errno, one ckpt_log line naming the array and the
 * reason for every user-visible failure.
 *
 * Thread-safety: all functions on a step and its arrays may be called
 * from many threads at once, except that ckpt_step_commit, ckpt_step_abort
 * and ckpt_step_destroy must not run concurrently with any other call on
 * the same step (the daemon serializes them against writes to that step).
 * Different steps are independent.
 *
 * Lock order inside (documented for maintainers; callers hold no locks):
 *   step->decl_mu  (declarations: items, arrays, names)
 *     -> array->mu (chunk state table of one array)
 *       -> step->mu  (memory budget, compression queue, spill list; leaf)
 *   chunk buffer mutex and shard append mutex are leaves taken with no
 *   other lock held.  Nothing waits for memory while holding a chunk pin.
 *
 * Ownership: strings passed in are copied; handles (ckpt_warray) are
 * owned by their step and stay valid until ckpt_step_destroy.
 */
#ifndef CKPT_WRITER_H
#define CKPT_WRITER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common.h"
#include "dtype.h"
#include "slice.h"

typedef struct ckpt_writer_opts {
	int zstd_level; /* zstd level of inner chunks; default 1 (see docs/format.md) */
	uint64_t
		mem_budget; /* bytes of buffered chunk data (incl. coverage maps); default RAM/8 in [512 MiB, 2 GiB] */
	int threads; /* compression threads per step; default 2, 1..64 */
	uint64_t chunk_bytes; /* target (upper bound) raw bytes of an inner chunk; default 4 MiB */
	uint64_t shard_bytes; /* target raw bytes of a shard file; default 1 GiB */
} ckpt_writer_opts;

/* Fill *o with the defaults. */
void ckpt_writer_opts_init(ckpt_writer_opts *o);

typedef struct ckpt_step ckpt_step;
typedef struct ckpt_warray ckpt_warray;

/* Start a pending step: create `<root_dir>/<step_name>.orbax-checkpoint-tmp/`
 * (0755) holding a provisional _CHECKPOINT_METADATA, and start the
 * compression threads.  opts NULL = defaults.
 *
 * step_name must be one path component (no '/', not "." or "..", no
 * ".orbax-checkpoint-tmp" inside, at most 200 bytes).
 *
 * Returns 0 and *out, or
 *   -EEXIST  <root_dir>/<step_name> already exists (a committed step);
 *   -EBUSY   the tmp folder exists and belongs to a live pending step
 *            (this or another process holds its lock);
 *   -EINVAL  bad name or options; other -errno from the file system.
 * A tmp folder left by a crashed writer (nobody holds its flock) is not a
 * step: it is removed and begin proceeds, like Orbax does.  The pending
 * step holds an exclusive flock on its tmp folder until destroy. */
int ckpt_step_begin(const char *root_dir, const char *step_name, const ckpt_writer_opts *opts,
		    ckpt_step **out);

/* The tmp folder <root_dir>/<step_name>.orbax-checkpoint-tmp that is
 * already there (left by an earlier process) becomes a pending step
 * stored as written (ckpt_step_set_as_written), its files as they are:
 * nothing is written or removed, no compression thread starts; it holds the
 * folder's flock like a begun step.  Its commit renames it, its abort
 * removes it.  Returns 0 and *out, -EEXIST (the step is committed), -EBUSY
 * (its lock is held), -ENOENT or another -errno. */
int ckpt_step_adopt(const char *root_dir, const char *step_name, const ckpt_writer_opts *opts,
		    ckpt_step **out);

/* Declare an item (checkpointable) with no arrays yet; idempotent.  Items
 * are also created implicitly by ckpt_step_add_array.  An item that has
 * neither arrays nor JSON at commit makes the commit fail (-EINVAL): Orbax
 * cannot restore an empty pytree.  The name must be an ITEM name of
 * orbax.h (not a step file, not "descriptor" or "AUTO").
 * Returns 0, -EINVAL (bad name), -ENOMEM, -EROFS after commit. */
int ckpt_step_add_item(ckpt_step *st, const char *item);

/* Make `item` a JSON item (Orbax's JsonCheckpointHandler) holding the len
 * bytes at json (copied; replaces what was set before); json NULL makes it
 * a plain item again.  The file is CKPT_ORBAX_JSON_FILE ("metadata"), or
 * "metrics" for the item "metrics".  Checked at commit: the bytes must
 * parse as JSON (an object for "metrics"), else the commit fails with
 * -EINVAL.  Returns 0, -EINVAL (the item has arrays; bad name), -EFBIG
 * (over 64 MiB), -ENOMEM, -EROFS after commit. */
int ckpt_step_set_json(ckpt_step *st, const char *item, const void *json, size_t len);

/* Name the handler recorded for `item` in the step's _CHECKPOINT_METADATA
 * (item_handlers), e.g. Orbax's StandardCheckpointHandler for a copy of a
 * step saved with it (copied).  NULL restores the default: the JSON
 * handler for a JSON item, PyTreeCheckpointHandler otherwise.  Creates the
 * item when needed.  Returns 0, -EINVAL (bad item name), -ENOMEM, -EROFS
 * after commit. */
int ckpt_step_set_item_handler(ckpt_step *st, const char *item, const char *handler);

/* Make `item` a stored copy: its folder in the tmp folder (<tmp_path>/<item>)
 * holds files put there by the caller as they were copied from another
 * step (an OCDBT database, zarr folders, _METADATA, ...); the commit writes
 * nothing into it, fsyncs every file and folder below it and names it in
 * _CHECKPOINT_METADATA (with the handler set by
 * ckpt_step_set_item_handler).  The caller checks that it reads back
 * before committing.  Returns 0, -EINVAL (the item holds arrays or JSON),
 * -ENOMEM, -EROFS after commit. */
int ckpt_step_add_stored_item(ckpt_step *st, const char *item);

/* Make the whole step one stored as written: the caller (an Orbax save
 * through the mount) puts every file and folder into the tmp folder
 * itself, and the commit writes nothing: it removes the leftover lock files
 * of TensorStore (names ending in CKPT_ORBAX_LOCK_SUFFIX), fsyncs every file
 * and folder and renames the tmp folder.  Items declared so far must hold
 * no array (-EINVAL); they and their JSON are then ignored (the caller put
 * their files in the tmp folder), and the step takes no new item, array or
 * JSON (-EINVAL).  Returns 0, -EINVAL or -EROFS after commit. */
int ckpt_step_set_as_written(ckpt_step *st);

/* The name of the JSON file of item `item` (static string). */
const char *ckpt_step_json_file(const char *item);

/* Declare an array of item `item` at pytree key path keypath[0..depth-1]
 * with key_types[i] = 1 (sequence index, decimal digits) or 2 (dict key),
 * as in _METADATA's key_metadata.  The array's stored name (Orbax param
 * name, its folder in the item) is the keys joined with '.'.
 *
 * Declaring the same path again with the same dtype and shape returns the
 * same handle.  Returns -EINVAL (logged) for: a zero-size shape or the
 * dtype uint4 (Orbax cannot save either), an item that is a JSON item or
 * is "metrics" (the manager's JSON metrics), a different dtype/shape than
 * an earlier declaration, a path that is a prefix of another array's path
 * (or vice versa), a node whose children mix sequence and dict keys, two
 * paths with the same param name, depth < 1, a key containing '/' or NUL
 * or a param name that is not a valid file name or that names one of the
 * item's metadata files, rank outside [0, CKPT_MAX_RANK], an unknown dtype.
 * -EFBIG when the array's byte size overflows 2^62 or it would need more
 * than 2^24 inner chunks.  -EROFS after commit.
 *
 * Chunking: inner chunk = the array split along its leading dims (each
 * chunk dim a divisor of the extent when a divisor within 2x of the target
 * exists, else the target with a padded edge chunk), at most
 * opts.chunk_bytes; arrays no larger than that are one chunk.  Shard =
 * a whole number of inner chunks per dim, trailing dims first, up to
 * opts.shard_bytes; small arrays are one shard, one file. */
int ckpt_step_add_array(ckpt_step *st, const char *item, const char *const *keypath, const int *key_types,
			int depth, ckpt_dtype dtype, int rank, const uint64_t *shape, ckpt_warray **out);

/* Drop the bytes written to `region` (NULL = the whole array): exactly the
 * region's bytes become unwritten (zero, uncovered), in every chunk the
 * region meets, also chunks only partly inside it (a column slice of row
 * chunks), whatever their state: a chunk already compressed or spilled is
 * re-read, loses the region's bytes and keeps the rest (it is compressed
 * again once complete); a chunk wholly inside is reset.  A later commit
 * fails with -ENODATA naming the array until the bytes are written again,
 * and they may then take other values.  For a writer that starts a file
 * over (O_TRUNC): a rewrite that dies half-way never commits a mix of old
 * and new bytes.  Costs O(chunks written so far), not O(chunks declared).
 * May run concurrently with writes to other bytes of the same chunks (other
 * slice files); not with writes into the region.  0, -EINVAL (bad region),
 * -EROFS, -ENOMEM/-EIO (re-reading a chunk failed; logged). */
int ckpt_warray_forget(ckpt_warray *a, const ckpt_region *region);

/* Remove a declared array from its pending step: its bytes are dropped,
 * its folder in the tmp folder is deleted, and its name and key path are
 * free for a new declaration.  The handle stays valid (writes and reads
 * then fail with -ESTALE) until ckpt_step_destroy.  Must not run
 * concurrently with writes to it.  0, or -EROFS after commit. */
int ckpt_warray_remove(ckpt_warray *a);

/* Record the sharding JSON (e.g. {"sharding_type": "NamedSharding", ...})
 * written for this array into the item's _sharding file.  NULL clears it.
 * The text is stored verbatim as a JSON string value; it must be valid
 * JSON (checked: -EINVAL otherwise). */
int ckpt_warray_set_sharding(ckpt_warray *a, const char *json);

/* Write bytes [byte_off, byte_off + len) of the C-order byte stream of
 * `region` (global coordinates; NULL = the whole array) from `data`.
 * Returns 0 once the bytes are in chunk buffers (or the spill file).
 *   -EINVAL  region rank differs from the array's, or a dim is empty or
 *            out of bounds; or the write would change bytes already
 *            written (see "Written bytes do not change" above; logged);
 *   -EFBIG   byte_off + len is past the end of the region's stream;
 *   -EROFS   the step was committed or aborted;
 *   -EIO/-ENOSPC/...  a spill or a re-read of a stored chunk failed, or
 *            compression keeps failing and no memory can be freed (logged).
 * len 0 is a no-op. */
int ckpt_warray_write(ckpt_warray *a, const ckpt_region *region, uint64_t byte_off, const void *data,
		      size_t len);
/* The same; flags CKPT_WRITE_SAME: bytes already written must not change
 * (see above).  Without it (ckpt_warray_write) a write over written bytes
 * replaces them: one writer rewriting its own file (mmap writeback of a
 * page changed again, a pwrite that fixes values). */
#define CKPT_WRITE_SAME 1u
int ckpt_warray_write_flags(ckpt_warray *a, const ckpt_region *region, uint64_t byte_off, const void *data,
			    size_t len, unsigned flags);

/* Read back bytes [byte_off, byte_off + len) of `region`'s stream of a
 * pending array: what has been written, zeros where nothing was.  Chunks
 * already compressed are decoded from their shard file (outside the
 * memory budget: one chunk-sized scratch buffer per call).  Returns the
 * number of bytes copied (short only at the end of the region, 0 past
 * it), -EINVAL for a bad region, -EIO (logged) on a read/decode error. */
ssize_t ckpt_warray_read(ckpt_warray *a, const ckpt_region *region, uint64_t byte_off, void *dst, size_t len);

/* Commit: wait for all background compression; check that every byte of
 * every array was written, that every item has arrays or JSON and that
 * every sequence node of a pytree holds the indices 0..n-1; write the
 * shard indexes, every zarr.json, per item _METADATA, _sharding (an entry
 * for every array: the one set, else a one-device NamedSharding) and
 * commit_success.txt (JSON items: the JSON file and commit_success.txt),
 * the step's _CHECKPOINT_METADATA and
 * commit_success.txt; fsync every file and folder; rename the tmp folder
 * to <root>/<final_name> with RENAME_NOREPLACE; fsync the root.
 *
 * Returns 0 (the step is then committed: writes fail with -EROFS, reads
 * still work), or, leaving the step pending so that the caller may fix
 * the cause and call commit again (nothing committed earlier changes):
 *   -ENODATA  some array is missing bytes (each such array logged with
 *             the number of missing bytes);
 *   -EEXIST   <root>/<final_name> exists;
 *   -EINVAL   bad final_name (it must be a step name Orbax finds,
 *             CKPT_NAME_STEP), a step without any item, an item without
 *             arrays or JSON, a list
 *             with a missing index, a JSON item that is not JSON;
 *   -EBUSY    a write or read is in progress on the step;
 *   -EIO/-ENOSPC/...  from compression or the file system (logged). */
int ckpt_step_commit(ckpt_step *st, const char *final_name);

/* Stop the compression threads and remove the tmp folder.  Further
 * writes/commits fail with -EROFS.  No-op on a committed step. */
void ckpt_step_abort(ckpt_step *st);

/* An optional receiver of finished shard files (object-store roots: the
 * upload of a shard starts while the rest of the step is still written).
 * When the last chunk of a shard has been stored, the compression thread
 * finishes that shard file at once (index, truncate, fsync) as the commit
 * would, then calls shard_done(ctx, path) with its path relative to the
 * step's tmp folder ("<item>/<param>/c/<i>/..."); the commit skips it.
 * When a chunk of a finished shard is written again or reset, the file
 * will change: shard_changed(ctx, path) is called (the shard is finished
 * again by the compression thread or at commit, and shard_done called
 * again in the first case).  Both are called with the array's chunk lock
 * held: they must only take leaf locks and never block.  Set it right
 * after ckpt_step_begin, before any write; sink NULL removes it.  The
 * callbacks stop after ckpt_step_destroy (ctx must outlive the step). */
struct ckpt_step_sink {
	int (*shard_done)(void *ctx, const char *relpath_in_step);
	void (*shard_changed)(void *ctx, const char *relpath_in_step);
	void *ctx;
};
void ckpt_step_set_sink(ckpt_step *st, const struct ckpt_step_sink *sink);

/* Free the step and all its arrays.  An uncommitted, unaborted step's tmp
 * folder is left on disk (it is not a step; a later begin removes it).
 * NULL is allowed. */
void ckpt_step_destroy(ckpt_step *st);

/* ---- queries (for the daemon's directory view and stats) ---- */

typedef struct ckpt_warray_info {
	const char *item; /* owned by the step */
	const char *name; /* param name: keys joined with '.' */
	int depth;
	const char *const *keys; /* depth keys, owned by the step */
	const int *key_types;
	ckpt_dtype dtype;
	int rank;
	const uint64_t *shape; /* rank entries each, owned by the step */
	const uint64_t *chunk_shape; /* inner chunk */
	const uint64_t *shard_shape; /* zarr chunk grid (one file each) */
	uint64_t nbytes; /* prod(shape) * itemsize */
	uint64_t bytes_written; /* distinct bytes written so far */
	uint64_t stored_bytes; /* compressed bytes appended to shard files */
	uint64_t chunks, chunks_stored; /* inner chunks in bounds / compressed */
	const char *sharding; /* NULL when unset; valid until the next set_sharding */
} ckpt_warray_info;

/* Snapshot of an array's description and progress.  Thread-safe. */
void ckpt_warray_get_info(ckpt_warray *a, ckpt_warray_info *out);

/* Look an array up by item and key path (types not compared); NULL if
 * none. */
ckpt_warray *ckpt_step_find_array(ckpt_step *st, const char *item, const char *const *keypath, int depth);

/* Call cb for each item name in declaration order; stops when cb returns
 * non-zero and returns that value.  cb must not declare items/arrays. */
int ckpt_step_foreach_item(ckpt_step *st, int (*cb)(void *ctx, const char *item), void *ctx);

/* Call cb for each array of `item` (NULL = of every item) in declaration
 * order; same rules as ckpt_step_foreach_item. */
int ckpt_step_foreach_array(ckpt_step *st, const char *item, int (*cb)(void *ctx, ckpt_warray *a), void *ctx);

enum ckpt_step_state { CKPT_STEP_PENDING = 0, CKPT_STEP_COMMITTED = 1, CKPT_STEP_ABORTED = 2 };

typedef struct ckpt_step_info {
	int state; /* enum ckpt_step_state */
	const char *name; /* step_name given to begin, owned by the step */
	const char *tmp_path; /* <root>/<step_name>.orbax-checkpoint-tmp */
	uint64_t arrays;
	uint64_t bytes_declared; /* sum of nbytes */
	uint64_t bytes_written; /* distinct bytes written */
	uint64_t bytes_pending; /* written, not yet compressed and stored */
	uint64_t mem_used; /* bytes of buffers held (incl. cached free buffers) */
	uint64_t spilled_chunks; /* chunks currently in the spill file */
	uint64_t spills; /* partial chunks written to the spill file so far */
	uint64_t stored_bytes; /* compressed bytes written to shard files */
} ckpt_step_info;

void ckpt_step_get_info(ckpt_step *st, ckpt_step_info *out);

#endif
