/*
 * kept.h - descriptors of one array's raw stored units, kept open across
 * the reads of one epoch.
 *
 * A whole raw array in a local folder is read straight from its unit files
 * (array.c, direct_read): a 1 MiB read of an array chunked by columns
 * touches one file per column chunk, and opening, checking and closing
 * each of them for every request cost as much as a tenth of the daemon's
 * CPU.  A kept descriptor serves the later reads of the same unit.
 *
 * Freshness: a descriptor is reused only in the epoch it was opened in
 * (ckpt_array_revalidate starts a new one at every open of a file backed
 * by the array), so a file replaced under the mount (renamed over) is seen
 * by the next open, as the bytes of a cached chunk are, and one open's
 * reads get the bytes of the file they first opened.  A file rewritten in
 * place is the same file: the caller checks its identity (fstat) at every
 * reuse, as it checks a fresh open's.
 *
 * Bounds: KEPT_UNITS descriptors per array (the least recently used idle
 * one is closed for a new one), and at most `max` of a ckpt_kept_limit
 * shared by a read context's arrays (beyond it a descriptor is used once
 * and closed).  ckpt_kept_drop closes them all: at the end of a read that
 * reached the array's last byte, when the array is retired (its step went
 * from the source: no deleted file is held open), and at destroy.
 *
 * A slot's life (derived from its fields, checked by kept_check):
 *
 *   state     fd    refs  unit   meaning
 *   EMPTY     -1    0     0      free
 *   IDLE      >= 0  0     != 0   open, no read uses it
 *   BUSY      >= 0  > 0   != 0   reads are using it (ckpt_kept_take)
 *   DRAINING  >= 0  > 0   0      dropped while in use: closed by the
 *                                last ckpt_kept_release
 *
 *   EMPTY -> BUSY (add), BUSY <-> IDLE (release, take), IDLE -> EMPTY
 *   (drop, a stale epoch, eviction), BUSY -> DRAINING (drop, a stale
 *   epoch), DRAINING -> EMPTY (release).
 *
 * Ownership: a descriptor passed to ckpt_kept_add belongs to the set when
 * the call returns a slot; a slot taken must be released exactly once.
 * Thread-safety: all functions are thread-safe (one leaf mutex per set,
 * taken with no other lock of this layer held, calling nothing while held
 * but close).
 */
#ifndef CKPT_KEPT_H
#define CKPT_KEPT_H

#include <stdatomic.h>
#include <stdint.h>

#define KEPT_UNITS 16 /* descriptors per array */
#define KEPT_MAX 256 /* per read context: well under the usual 1,024 descriptors */

/* The descriptors kept by all the sets of one read context. */
typedef struct ckpt_kept_limit {
	atomic_int open;
	int max;
} ckpt_kept_limit;

typedef struct ckpt_kept ckpt_kept;

/* A set counted against lim (which outlives it), or NULL when out of
 * memory (the caller then opens a unit for every read). */
ckpt_kept *ckpt_kept_create(ckpt_kept_limit *lim);
/* Closes what it keeps; no slot may be taken. */
void ckpt_kept_destroy(ckpt_kept *k);

/* Unit `unit` (any number but UINT64_MAX) of epoch ep: its slot, taken,
 * with the descriptor in *fd; -1 when not kept.  Slots of other epochs are
 * dropped on the way. */
int ckpt_kept_take(ckpt_kept *k, uint64_t unit, unsigned ep, int *fd);

/* Keep fd, just opened for unit in epoch ep: its slot, taken (fd now
 * belongs to the set), or -1 when there is no room (every slot in use, or
 * the context's limit reached): the caller closes fd. */
int ckpt_kept_add(ckpt_kept *k, uint64_t unit, unsigned ep, int fd);

/* Done with a slot from take or add. */
void ckpt_kept_release(ckpt_kept *k, int slot);

/* Close every descriptor kept (those in use when their reads release
 * them). */
void ckpt_kept_drop(ckpt_kept *k);

#endif
