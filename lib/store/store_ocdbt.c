/*
 * store_ocdbt.c - the OCDBT store: ckpt_store's vtable over a ckpt_ocdbt
 * handle (ocdbt.h), which reads through a base store.  The handle is
 * immutable after open except its own internally locked size cache, so
 * every op is thread-safe as is.  Folders are '/'-prefixes of keys.
 */
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "ocdbt.h"
#include "store.h"
#include "store_int.h"

struct ocdbt_store {
	struct ckpt_store base; /* first member: ckpt_store * <-> struct ocdbt_store * */
	ckpt_ocdbt *db;
	ckpt_store *under; /* the store it reads through (the handle holds the reference) */
};

static ckpt_ocdbt *db_of(ckpt_store *s)
{
	return ((struct ocdbt_store *)s)->db;
}

static int ocdbt_size(ckpt_store *s, const char *key, uint64_t *size)
{
	return ckpt_ocdbt_size(db_of(s), key, size);
}

static ssize_t ocdbt_read(ckpt_store *s, const char *key, uint64_t off, size_t len, void *dst)
{
	return ckpt_ocdbt_read(db_of(s), key, off, len, dst);
}

static int ocdbt_list(ckpt_store *s, const char *prefix, ckpt_store_list_cb cb, void *ctx)
{
	return ckpt_ocdbt_list(db_of(s), prefix ? prefix : "", cb, ctx);
}

static unsigned ocdbt_connections(ckpt_store *s)
{
	return ckpt_store_connections(((struct ocdbt_store *)s)->under);
}

static void ocdbt_destroy(ckpt_store *s)
{
	struct ocdbt_store *o = (struct ocdbt_store *)s;
	ckpt_ocdbt_close(o->db);
	free(o->base.root);
	free(o);
}

static const struct ckpt_store_ops ocdbt_ops = {
	.size = ocdbt_size,
	.read = ocdbt_read,
	.list = ocdbt_list,
	.listdir = ckpt_store_listdir_from_keys,
	.stat = ckpt_store_stat_from_keys,
	.destroy = ocdbt_destroy,
	.connections = ocdbt_connections,
};

int ckpt_store_ocdbt_open_on(ckpt_store *base, const char *dir, ckpt_store **out)
{
	return ckpt_store_ocdbt_open_pool(base, dir, NULL, out);
}

int ckpt_store_ocdbt_open_pool(ckpt_store *base, const char *dir, struct ckpt_pool *pool, ckpt_store **out)
{
	*out = NULL;
	struct ocdbt_store *o = calloc(1, sizeof(*o));
	if (!o)
		return -ENOMEM;
	o->base.ops = &ocdbt_ops;
	o->base.root = ckpt_store_join(base->root, dir);
	if (!o->base.root) {
		free(o);
		return -ENOMEM;
	}
	int rc = ckpt_ocdbt_open_store_pool(base, dir ? dir : "", pool, &o->db);
	if (rc) {
		free(o->base.root);
		free(o);
		return rc;
	}
	o->under = base;
	*out = &o->base;
	return 0;
}

int ckpt_store_ocdbt_open(const char *dir, ckpt_store **out)
{
	*out = NULL;
	ckpt_store *base;
	int rc = ckpt_store_dir_open(dir, &base);
	if (rc)
		return rc;
	rc = ckpt_store_ocdbt_open_on(base, "", out);
	ckpt_store_destroy(base);
	return rc;
}
