/*
 * tlsbuf.h - per-thread scratch buffers that grow and are reused, so a
 * steady stream of requests allocates (and page-faults) nothing.
 *
 * Each thread has one buffer per slot; a buffer stays valid until the
 * next call for the same slot on the same thread (its bytes are not kept
 * when it grows), and is freed when the thread exits.  The reply buffer,
 * once over 64 KiB, is a huge-page mapping (hugebuf.h) of at least 2 MiB;
 * the others are as large as asked (huge-page mappings from 2 MiB on).
 * Thread-safe by construction (nothing is shared).
 */
#ifndef CKPT_TLSBUF_H
#define CKPT_TLSBUF_H

#include <stddef.h>

enum ckpt_tls_slot {
	CKPT_TLS_REPLY = 0, /* the daemon's reply buffer */
	CKPT_TLS_BOUNCE = 1, /* array.c: unaligned byte ranges */
	CKPT_TLS_PIECES = 2, /* array.c: the pieces of a direct read */
	CKPT_TLS_TILE = 3, /* recipe.c: a transpose's tile of target rows */
	CKPT_TLS_VIEW_BOX = 4, /* views.c: a source box read whole, then gathered */
	CKPT_TLS_VIEW_GATHER = 5, /* views.c: a batch of target elements, gathered */
	CKPT_TLS_VIEW_CONVERT = 6, /* views.c: the same batch after element ops */
	CKPT_TLS_NSLOTS
};

/* A buffer of at least `need` bytes for `slot`; NULL when out of memory.
 * A new or grown buffer is pre-faulted (its first touch happens here, not
 * in the copy that follows). */
void *ckpt_tls_buf(enum ckpt_tls_slot slot, size_t need);

#endif
