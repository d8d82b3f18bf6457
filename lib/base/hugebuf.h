/*
 * hugebuf.h - large, zero-filled buffers backed by transparent huge pages.
 *
 * A buffer of CKPT_HUGEBUF_MIN bytes or more is its own anonymous mapping,
 * rounded up to a multiple of 2 MiB, starting on a 2 MiB boundary (also
 * after a resize that moved it; kernels before 6.7 do not align such
 * mappings themselves, and an unaligned one gets no huge page) and
 * advised MADV_HUGEPAGE, so its first touch faults 2 MiB at a time
 * instead of 4 KiB, and freeing it returns the memory to the system at
 * once.  Smaller buffers come from calloc.  Either way the memory is
 * zero-filled.
 *
 * Ownership: the caller keeps *cap and passes it back to
 * ckpt_hugebuf_free; a buffer may be reused for any len <= cap.  Mapped
 * buffers (capacity >= CKPT_HUGEBUF_MIN) can also be split in two, so
 * that memory touched once serves smaller chunks.
 * Thread-safety: every function may be called from any thread.
 */
#ifndef CKPT_HUGEBUF_H
#define CKPT_HUGEBUF_H

#include <stddef.h>

#define CKPT_HUGEBUF_MIN ((size_t)2 << 20)

/* A zero-filled buffer of at least len bytes (len 0 gives a valid
 * 1-byte buffer); *cap = its usable size (>= len).  NULL when out of
 * memory. */
void *ckpt_hugebuf_alloc(size_t len, size_t *cap);

/* Resize buffer p of capacity cap (from ckpt_hugebuf_alloc) to hold len
 * bytes, keeping the pages already touched: the first min(cap, len) bytes
 * keep their contents (the rest of a grown buffer is zero-filled), a
 * shrunk buffer gives its tail back.  Returns the buffer (perhaps moved;
 * p is then invalid) with *newcap, or NULL when p cannot be resized in
 * place of a new allocation (either size under CKPT_HUGEBUF_MIN, or the
 * remapping failed): p is then unchanged and still owned by the caller. */
void *ckpt_hugebuf_resize(void *p, size_t cap, size_t len, size_t *newcap);

/* Split a mapped buffer p of capacity cap (>= CKPT_HUGEBUF_MIN) after
 * its first head bytes (a multiple of 2 MiB, 0 < head < cap): p keeps
 * [0, head) as a buffer of capacity head, and the tail, returned, is a
 * buffer of capacity cap - head.  Each is resized or freed on its
 * own.  No page is touched or given back: the tail's pages stay warm. */
void *ckpt_hugebuf_split(void *p, size_t cap, size_t head);

/* Free a buffer from ckpt_hugebuf_alloc; cap is the *cap it returned.
 * NULL is allowed. */
void ckpt_hugebuf_free(void *p, size_t cap);

#endif
