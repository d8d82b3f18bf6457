/*
 * stream.h - reading part of a large decode unit without decoding it whole.
 *
 * A decode unit larger than a quarter of the cache budget (see
 * CKPT_CACHE_UNIT_CAP in cache.h) is not decoded into the cache when its
 * encoding can be read as a stream: raw bytes (no compressor) are read by
 * range, one zstd frame is decompressed with ZSTD_decompressStream into a
 * small window, discarding the output before the wanted rows and stopping
 * after them.  A sharding_indexed shard that holds one inner chunk (the
 * layout of Orbax's zarr3 arrays) streams that chunk: its range is read
 * from the shard index when the stream starts.  A cursor remembers where a stream stopped, so a sequential
 * reader continues from there instead of starting the frame again.
 *
 * Memory: a fixed pool of CKPT_STREAM_CURSORS cursors per read context,
 * each holding a window of about CKPT_STREAM_WINDOW bytes (whole rows of
 * the unit), an input buffer, and a zstd context whose frame window is at
 * most 2^CKPT_STREAM_WLOG bytes (a frame asking for more is -ENOTSUP: the
 * caller decodes the unit whole).  Readers wait for a free cursor.
 *
 * Thread-safety: all functions are thread-safe.
 */
#ifndef CKPT_STREAM_H
#define CKPT_STREAM_H

#include <stdint.h>

#include "slice.h"
#include "store.h"
#include "zarr_chunk.h"

#define CKPT_STREAM_CURSORS 4
#define CKPT_STREAM_WINDOW ((uint64_t)2 << 20)
#define CKPT_STREAM_WLOG 23

typedef struct ckpt_streams ckpt_streams;

int ckpt_streams_create(ckpt_streams **out);
/* No stream may be in use. */
void ckpt_streams_destroy(ckpt_streams *s);

/* Forget the cursors of `owner` (an array being destroyed, or whose data
 * changed). */
void ckpt_streams_forget(ckpt_streams *s, const void *owner);

/* 1 when the array's decode units can be streamed: not sharded or one
 * inner chunk per shard, C order, little-endian (or 1-byte items), and
 * either no bytes-to-bytes codec or exactly one zstd; rows (the unit's bytes
 * per index of its first dimension) of at most 32 MiB.  A cursor's window
 * holds whole rows: at least one row, at least CKPT_STREAM_WINDOW when rows
 * are smaller. */
int ckpt_stream_ok(const ckpt_array_meta *m);

/* Copy every element of stream positions [e0, e1) of region r that lies in
 * decode unit g into dst (dst[0] is position e0), reading only the rows of
 * the unit up to the last one needed.  `owner` tags the cursor (with g).
 * Returns 0; -ENOTSUP when the unit cannot be streamed after all (missing
 * from the store or from its shard's index, a shard index over 1 MiB, or a
 * zstd frame window over 2^CKPT_STREAM_WLOG): the caller then decodes it
 * whole; -EIO (logged) for corrupt or truncated
 * data; the store's error. */
int ckpt_stream_copy(ckpt_streams *s, const void *owner, ckpt_store *st, const char *prefix,
		     const ckpt_array_meta *m, const uint64_t *g, const ckpt_region *r, uint64_t e0,
		     uint64_t e1, uint8_t *dst);

#endif
