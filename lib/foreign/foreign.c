/*
 * foreign.c - the translator table (see foreign.h): which foreign format a
 * SOURCE or a step folder is, by content.  The translators are the
 * foreign_*.c files below it; they build their virtual items with
 * foreign_vitem.c.  The tree (lib/tree/layout.c) reaches them only through
 * this table.
 */
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "foreign.h"
#include "orbax.h"
#include "zarr_meta.h"

/* ---- the table ------------------------------------------------------------ */

/* Translators (foreign_*.c).  Order matters only where two could claim the
 * same bytes; none do. */
extern const struct ckpt_foreign_fmt ckpt_foreign_npz;
extern const struct ckpt_foreign_fmt ckpt_foreign_torch;
extern const struct ckpt_foreign_fmt ckpt_foreign_dcp;
extern const struct ckpt_foreign_fmt ckpt_foreign_safetensors;
extern const struct ckpt_foreign_fmt ckpt_foreign_safetensors_dir;
extern const struct ckpt_foreign_fmt ckpt_foreign_msgpack_file;
extern const struct ckpt_foreign_fmt ckpt_foreign_msgpack_dir;
extern const struct ckpt_foreign_fmt ckpt_foreign_zarr_names;

static const struct ckpt_foreign_fmt *const formats[] = {
	&ckpt_foreign_npz,
	/* foreign_torch.c; safetensors before msgpack: a safetensors header
	 * length can start like a msgpack map */
	&ckpt_foreign_torch,
	&ckpt_foreign_dcp,
	&ckpt_foreign_safetensors,
	&ckpt_foreign_safetensors_dir,
	&ckpt_foreign_msgpack_file,
	&ckpt_foreign_msgpack_dir,
	&ckpt_foreign_zarr_names,
};

#define NFORMATS (sizeof(formats) / sizeof(formats[0]))

const struct ckpt_foreign_fmt *ckpt_foreign_probe(ckpt_store *src, const char *key,
						  const struct ckpt_store_stat *st)
{
	struct ckpt_store_stat own;
	if (!st) {
		if (ckpt_store_stat(src, key, &own) < 0)
			return NULL;
		st = &own;
	}
	uint8_t head[CKPT_FOREIGN_HEAD];
	size_t nhead = 0;
	if (!st->is_dir) {
		if (!*key)
			return NULL;
		size_t want = st->size < sizeof(head) ? (size_t)st->size : sizeof(head);
		ssize_t n = want ? ckpt_store_read(src, key, 0, want, head) : 0;
		if (n < 0)
			return NULL;
		nhead = (size_t)n;
	}
	for (size_t i = 0; i < NFORMATS; i++)
		if (formats[i]->probe(src, key, st, st->is_dir ? NULL : head, nhead) == 1)
			return formats[i];
	return NULL;
}

static char what_buf[1024];
static pthread_once_t what_once = PTHREAD_ONCE_INIT;

static void what_init(void)
{
	size_t o = 0;
	for (size_t i = 0; i < NFORMATS && o < sizeof(what_buf); i++)
		o += (size_t)snprintf(what_buf + o, sizeof(what_buf) - o, "%s%s", i ? ", " : "",
				      formats[i]->what);
}

const char *ckpt_foreign_what(void)
{
	pthread_once(&what_once, what_init);
	return what_buf;
}
