/* placeholder */
#include "common.h"
#include "foreign.h"
static int no_probe(ckpt_store *src, const char *key, const struct ckpt_store_stat *st, const uint8_t *head,
		    size_t nhead)
{
	(void)src; (void)key; (void)st; (void)head; (void)nhead;
	return 0;
}
static int no_open(ckpt_store *src, const char *key, const struct ckpt_store_stat *st, ckpt_store **item)
{
	(void)src; (void)key; (void)st; (void)item;
	return -ENOTSUP;
}
const struct ckpt_foreign_fmt ckpt_foreign_msgpack_file = { "msgpack", "x", no_probe, no_open };
const struct ckpt_foreign_fmt ckpt_foreign_msgpack_dir = { "msgpack", "y", no_probe, no_open };
