/*
 * fwd_store.h - a store over another one, for the spies of the unit tests:
 * a spy embeds struct fwd_store first (in: the store it watches) and puts
 * fwd_size, fwd_read, fwd_list, fwd_listdir and fwd_stat in its ops table
 * for the calls it only passes on, its own functions for those it watches.
 */
#ifndef CKPT_TEST_FWD_STORE_H
#define CKPT_TEST_FWD_STORE_H

#include "store.h"

struct fwd_store {
	struct ckpt_store base;
	ckpt_store *in;
};

static inline ckpt_store *fwd_in(ckpt_store *s)
{
	return ((struct fwd_store *)s)->in;
}

static inline int fwd_size(ckpt_store *s, const char *key, uint64_t *size)
{
	return ckpt_store_size(fwd_in(s), key, size);
}

static inline ssize_t fwd_read(ckpt_store *s, const char *key, uint64_t off, size_t len, void *dst)
{
	return ckpt_store_read(fwd_in(s), key, off, len, dst);
}

static inline int fwd_list(ckpt_store *s, const char *prefix, ckpt_store_list_cb cb, void *ctx)
{
	return ckpt_store_list(fwd_in(s), prefix, cb, ctx);
}

static inline int fwd_listdir(ckpt_store *s, const char *dir, ckpt_store_dir_cb cb, void *ctx)
{
	return ckpt_store_listdir(fwd_in(s), dir, cb, ctx);
}

static inline int fwd_stat(ckpt_store *s, const char *key, struct ckpt_store_stat *st)
{
	return ckpt_store_stat(fwd_in(s), key, st);
}

#endif
