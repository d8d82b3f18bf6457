/*
 * view_xattr.c - the user.ckpt.* extended attributes of array files.
 */
#include <stdio.h>
#include <string.h>

#include "view_internal.h"

/* Room for one attribute value. */
#define XATTR_VAL_MAX 4096

static const char *const array_xattrs[] = { "user.ckpt.dtype",	"user.ckpt.shape",
					    "user.ckpt.chunks", "user.ckpt.codec",
					    "user.ckpt.format", "user.ckpt.stored_bytes",
					    "user.ckpt.shards", "user.ckpt.sharding",
					    "user.ckpt.slice" };

static int dims_str(int rank, const uint64_t *d, char *buf, size_t cap)
{
	size_t o = (size_t)snprintf(buf, cap, "[");
	for (int i = 0; i < rank && o < cap; i++)
		o += (size_t)snprintf(buf + o, cap - o, "%s%llu", i ? "," : "", (unsigned long long)d[i]);
	if (o < cap)
		o += (size_t)snprintf(buf + o, cap - o, "]");
	return o < cap ? (int)o : -ERANGE;
}

static int has_xattr(struct array_node *n, const char *name)
{
	if (!strcmp(name, "user.ckpt.sharding"))
		return n->ar->sharding != NULL;
	if (!strcmp(name, "user.ckpt.slice")) {
		const ckpt_array_meta *m = ckpt_array_meta_of(n->ar->arr);
		for (int d = 0; d < m->rank; d++)
			if (n->region.start[d] != 0 || n->region.stop[d] != m->shape[d])
				return 1;
		return 0;
	}
	return 1;
}

static ssize_t put(const char *val, size_t len, char *buf, size_t cap)
{
	if (cap == 0)
		return (ssize_t)len;
	if (len > cap)
		return -ERANGE;
	memcpy(buf, val, len);
	return (ssize_t)len;
}

/* Number of stored units of the array of file n (its NAME.shards/ listing). */
static uint64_t unit_count(ckpt_view *v, struct node *n)
{
	char name[VIEW_NAME_BUF];
	size_t stem;
	struct node *dir = view_node(v, n->parent);
	if (!dir || dir->kind != N_DIR || !node_ends_with(n->name, ".npy", &stem))
		return 0;
	snprintf(name, sizeof(name), "%.*s.shards", (int)stem, n->name);
	struct node *sd;
	pthread_rwlock_rdlock(&v->ns_lock);
	int rc = node_lookup_locked(v, dir, name, &sd);
	pthread_rwlock_unlock(&v->ns_lock);
	uint64_t count = 0;
	if (rc == 0 && sd->ops->nentries && sd->ops->nentries(v, sd, &count) < 0)
		count = 0;
	return count;
}

ssize_t array_getxattr(ckpt_view *v, struct node *node, const char *name, char *buf, size_t cap)
{
	struct array_node *n = to_array(node);
	if (!has_xattr(n, name))
		return -ENODATA;
	const ckpt_array_meta *m = ckpt_array_meta_of(n->ar->arr);
	char val[XATTR_VAL_MAX];
	int len = -ENODATA;
	if (!strcmp(name, "user.ckpt.dtype")) {
		len = snprintf(val, sizeof(val), "%s", ckpt_dtype_get(m->dtype)->name);
	} else if (!strcmp(name, "user.ckpt.shape")) {
		uint64_t s[CKPT_MAX_RANK];
		for (int d = 0; d < n->region.rank; d++)
			s[d] = n->region.stop[d] - n->region.start[d];
		len = dims_str(m->rank, s, val, sizeof(val));
	} else if (!strcmp(name, "user.ckpt.chunks")) {
		len = dims_str(m->rank, m->chunk_shape, val, sizeof(val));
	} else if (!strcmp(name, "user.ckpt.codec")) {
		ckpt_zarr_codec_str(m, val, sizeof(val));
		len = (int)strlen(val);
	} else if (!strcmp(name, "user.ckpt.format")) {
		len = snprintf(val, sizeof(val), "zarr%d%s", m->zarr_format, n->ar->ocdbt ? "+ocdbt" : "");
	} else if (!strcmp(name, "user.ckpt.stored_bytes")) {
		uint64_t sb;
		int rc = ckpt_array_stored_bytes(n->ar->arr, &sb);
		if (rc < 0)
			return -EIO;
		len = snprintf(val, sizeof(val), "%llu", (unsigned long long)sb);
	} else if (!strcmp(name, "user.ckpt.shards")) {
		uint64_t count = unit_count(v, node);
		char grid[CKPT_MAX_RANK * 21 + 3];
		dims_str(m->rank, m->store_grid, grid, sizeof(grid));
		len = snprintf(val, sizeof(val), "{\"count\": %llu, \"grid\": %s}", (unsigned long long)count,
			       grid);
	} else if (!strcmp(name, "user.ckpt.sharding")) {
		return put(n->ar->sharding, strlen(n->ar->sharding), buf, cap);
	} else if (!strcmp(name, "user.ckpt.slice")) {
		len = ckpt_slice_format(&n->region, val, sizeof(val));
	}
	if (len < 0)
		return len;
	return put(val, (size_t)len, buf, cap);
}

ssize_t array_listxattr(ckpt_view *v, struct node *node, char *buf, size_t cap)
{
	(void)v;
	struct array_node *n = to_array(node);
	size_t total = 0;
	for (size_t i = 0; i < sizeof(array_xattrs) / sizeof(array_xattrs[0]); i++) {
		if (!has_xattr(n, array_xattrs[i]))
			continue;
		size_t l = strlen(array_xattrs[i]) + 1;
		if (cap) {
			if (total + l > cap)
				return -ERANGE;
			memcpy(buf + total, array_xattrs[i], l);
		}
		total += l;
	}
	return (ssize_t)total;
}
