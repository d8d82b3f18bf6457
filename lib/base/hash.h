/*
 * hash.h - FNV-1a, the hash of the in-memory name tables (pytree nodes,
 * hidden names).  Not for anything stored or adversarial-keyed beyond
 * bounded tables.
 */
#ifndef CKPT_HASH_H
#define CKPT_HASH_H

#include <stddef.h>
#include <stdint.h>

#define CKPT_FNV1A_INIT 1469598103934665603ULL /* the 64-bit FNV offset basis */

/* 64-bit FNV-1a of n bytes at p, continuing from h0 (CKPT_FNV1A_INIT to
 * start; a previous result to hash more bytes onto it). */
static inline uint64_t ckpt_fnv1a(const void *p, size_t n, uint64_t h0)
{
	const uint8_t *b = p;
	uint64_t h = h0;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 1099511628211ULL;
	return h;
}

#endif
