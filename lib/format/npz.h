/*
 * npz.h - what an .npz archive's members say: the .npy header of a member
 * as numpy writes it (read leniently: either byte order, C or Fortran
 * order), and the member name as a key path.  Pure; the archive's
 * directory is zip.h's.
 */
#ifndef CKPT_NPZ_H
#define CKPT_NPZ_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "dtype.h"

#define CKPT_NPZ_MAX_HEADER (1u << 20) /* bytes of an .npy header accepted */

struct ckpt_npz_header {
	ckpt_dtype dtype;
	int big_endian; /* '>' descr of a multi-byte type */
	int fortran_order;
	int rank;
	uint64_t shape[CKPT_MAX_RANK];
	uint64_t data_offset; /* bytes of the header (magic .. final newline) */
	uint64_t nbytes; /* the data's bytes */
	int void2; /* the descr was a 2-byte void ('|V2'): shown as bfloat16 */
};

/* Parse the .npy header at the start of buf (len bytes).  Accepted:
 * versions 1.0, 2.0, 3.0; a dict literal with 'descr' (a plain string:
 * '<', '>', '|' or '=' then a numpy type code; '|V2' / '<V2' as bfloat16,
 * the way big_vision stores it), 'fortran_order' (True/False) and 'shape'
 * (a tuple of non-negative ints, rank <= CKPT_MAX_RANK).  Returns 0;
 * -EAGAIN with *need (> len) when buf is too short for the header;
 * -EINVAL / -ENOTSUP with *why (static) for what is malformed or not a
 * supported dtype (structured, object, strings). */
int ckpt_npz_header_parse(const uint8_t *buf, size_t len, struct ckpt_npz_header *out, size_t *need,
			  const char **why);

/* Split member name `name` ("params/img/w.npy") into at most max key-path
 * components written into buf (cap bytes; comps[i] point into it): '/'
 * separates keys, a trailing ".npy" is dropped (np.savez adds it).
 * Returns the depth, or -EINVAL for a name with an empty component ("a//b",
 * leading or trailing '/'), or "." / ".." components; -ENAMETOOLONG. */
int ckpt_npz_key_path(const char *name, char *buf, size_t cap, const char **comps, int max);

#endif
