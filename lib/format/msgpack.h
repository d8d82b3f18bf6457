/*
 * msgpack.h - the structure of a MessagePack document (the `checkpoint`
 * files of Flax, older Orbax and T5X), read through a callback without
 * reading bin and ext payloads into memory: each string, bin and ext value
 * records the offset and length of its payload in the file, so that an
 * inline array of GiBs is served later as a byte range of the file.  Ext
 * values of the types Flax and Orbax define (1 ndarray, 2 complex, 3 numpy
 * scalar, 4 tuple) hold a nested MessagePack document, parsed the same way.
 *
 * Pure: no I/O of its own, no global state.  Hostile input: every count is
 * checked against the bytes left before anything is allocated, nesting is
 * bounded, the whole tree is bounded in nodes.
 */
#ifndef CKPT_MSGPACK_H
#define CKPT_MSGPACK_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define CKPT_MP_MAX_DEPTH 64 /* nesting of arrays, maps and ext documents */
#define CKPT_MP_MAX_NODES (1u << 21) /* values in one file (about 120 MiB of tree at most) */
#define CKPT_MP_MAX_STR (1u << 16) /* strings up to this many bytes are copied */

enum ckpt_mp_type {
	CKPT_MP_NIL,
	CKPT_MP_BOOL,
	CKPT_MP_INT, /* v.i (negative or positive) */
	CKPT_MP_UINT, /* v.u (beyond INT64_MAX) */
	CKPT_MP_FLOAT, /* v.f; f32 set when stored as float 32 */
	CKPT_MP_STR,
	CKPT_MP_BIN,
	CKPT_MP_ARRAY,
	CKPT_MP_MAP,
	CKPT_MP_EXT,
};

/* Ext types of Flax's and Orbax's encoders. */
#define CKPT_MP_EXT_NDARRAY 1
#define CKPT_MP_EXT_COMPLEX 2
#define CKPT_MP_EXT_NPSCALAR 3
#define CKPT_MP_EXT_TUPLE 4

struct ckpt_mp {
	uint8_t type; /* enum ckpt_mp_type */
	uint8_t f32;
	int8_t ext_type;
	uint32_t n; /* ARRAY: items; MAP: pairs; EXT: 1 when kids[0] is its parsed payload */
	union {
		int b;
		int64_t i;
		uint64_t u;
		double f;
	} v;
	uint64_t off, len; /* STR, BIN, EXT: the payload's bytes in the file */
	char *str; /* STR of at most CKPT_MP_MAX_STR bytes without NUL: copied, NUL-terminated; else NULL */
	struct ckpt_mp *kids; /* ARRAY: n values; MAP: 2n (key, value, ...); EXT: 1 document */
};

/* Read len bytes at off into dst: returns bytes read (short only at the
 * end), or a negative errno. */
typedef ssize_t (*ckpt_mp_read_fn)(void *ctx, uint64_t off, size_t len, void *dst);

/* Parse the one document that fills bytes [0, size) of the file.  *out
 * (free with ckpt_mp_free) on 0; -EINVAL (*why static English) for bytes
 * that are not one well-formed document within the bounds, trailing bytes
 * included; -ENOMEM; the callback's errors. */
int ckpt_mp_parse(ckpt_mp_read_fn rd, void *ctx, uint64_t size, struct ckpt_mp **out, const char **why);
void ckpt_mp_free(struct ckpt_mp *m);

/* 1 when the first n bytes of a file start like a MessagePack map whose
 * first key is a short printable string (what every Flax, Orbax and T5X
 * `checkpoint` file starts with), or are exactly an empty map. */
int ckpt_mp_magic(const uint8_t *head, size_t n);

/* MAP m's value under string key `key`, else NULL. */
const struct ckpt_mp *ckpt_mp_get(const struct ckpt_mp *m, const char *key);

#endif
