/*
 * xattr.c - the user.ckpt.* extended attributes of array files.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store.h"
#include "tree_int.h"

/* Room for one attribute value. */
#define XATTR_VAL_MAX 4096

static const char *const array_xattrs[] = { "user.ckpt.dtype",	"user.ckpt.shape",
					    "user.ckpt.chunks", "user.ckpt.codec",
					    "user.ckpt.format", "user.ckpt.stored_bytes",
					    "user.ckpt.shards", "user.ckpt.sharding",
					    "user.ckpt.slice",	"user.ckpt.checksum" };

/* Stored units user.ckpt.checksum looks at for a first stored one. */
#define CHECKSUM_PROBE_UNITS 64
/* zstd frame magic, and Content_Checksum_flag in its Frame_Header_Descriptor */
#define ZSTD_MAGIC 0xFD2FB528u
#define ZSTD_FHD_CHECKSUM 0x04

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
	struct node *dir = ckpt_node_at(v, n->parent);
	if (!dir || dir->kind != N_DIR || !ckpt_node_ends_with(n->name, ".npy", &stem))
		return 0;
	snprintf(name, sizeof(name), "%.*s.shards", (int)stem, n->name);
	struct node *sd;
	ckpt_rdlock(&v->ns_lock, CKPT_RANK_NS);
	int rc = ckpt_node_lookup_locked(v, dir, name, &sd);
	ckpt_rwunlock(&v->ns_lock, CKPT_RANK_NS);
	uint64_t count = 0;
	if (rc == 0 && sd->ops->nentries && sd->ops->nentries(v, sd, &count) < 0)
		count = 0;
	return count;
}

static uint64_t le64(const uint8_t *p)
{
	uint64_t x = 0;
	for (int i = 7; i >= 0; i--)
		x = x << 8 | p[i];
	return x;
}

/* Whether the zstd frame of the first stored unit (its first inner chunk
 * when sharded) sets Content_Checksum_flag: 1, 0, or -1 when no unit is
 * stored among the first CHECKSUM_PROBE_UNITS or it is unreadable. */
static int first_frame_checksummed(const ckpt_array_meta *m, ckpt_store *s, const char *prefix)
{
	uint64_t g[CKPT_MAX_RANK] = { 0 };
	for (int u = 0; u < CHECKSUM_PROBE_UNITS; u++) {
		char key[VIEW_PATH_MAX];
		uint64_t size;
		if (ckpt_zarr_unit_key(m, prefix, g, key, sizeof(key)) >= 0 &&
		    ckpt_store_size(s, key, &size) == 0) {
			uint64_t off = 0;
			if (m->sharded) {
				uint64_t isize = 16 * m->inner_per_shard + (m->index_crc ? 4 : 0);
				if (size < isize || isize > (64u << 20))
					return -1;
				uint8_t *ix = malloc((size_t)isize);
				if (!ix || ckpt_store_read(s, key, m->index_at_start ? 0 : size - isize,
							   (size_t)isize, ix) != (ssize_t)isize) {
					free(ix);
					return -1;
				}
				off = UINT64_MAX;
				for (uint64_t i = 0; i < m->inner_per_shard && off == UINT64_MAX; i++)
					off = le64(ix + 16 * i);
				free(ix);
			}
			uint8_t h[5];
			if (off != UINT64_MAX &&
			    ckpt_store_read(s, key, off, sizeof(h), h) == (ssize_t)sizeof(h) &&
			    (h[0] | h[1] << 8 | h[2] << 16 | (uint32_t)h[3] << 24) == ZSTD_MAGIC)
				return (h[4] & ZSTD_FHD_CHECKSUM) != 0;
			if (off != UINT64_MAX)
				return -1;
		}
		int d = m->rank - 1;
		for (; d >= 0; d--) {
			if (++g[d] < m->store_grid[d])
				break;
			g[d] = 0;
		}
		if (d < 0)
			break;
	}
	return -1;
}

/* user.ckpt.checksum: what protects the stored data of the array, as a
 * ','-separated list: "crc32c-index" (shard index CRC-32C), "crc32c-chunk"
 * (a crc32c codec on every chunk), "zstd-frame" (the first stored zstd
 * frame carries a content checksum), "gzip-crc32"; "none" when nothing
 * does (e.g. Orbax's zstd frames, written without checksums). */
static int checksum_str(struct array_node *n, char *val, size_t cap)
{
	const ckpt_array_meta *m = ckpt_array_meta_of(n->ar->arr);
	int has_zstd = 0, has_crc = 0, has_gzip = 0, zstd_outer = 0;
	for (int i = 0; i < m->nb2b; i++) {
		has_zstd |= m->b2b[i] == CKPT_B2B_ZSTD;
		has_crc |= m->b2b[i] == CKPT_B2B_CRC32C;
		has_gzip |= m->b2b[i] == CKPT_B2B_GZIP;
	}
	/* the frame starts the stored bytes when only crc32c (appended) follows zstd */
	for (int i = m->nb2b - 1; i >= 0 && !zstd_outer; i--) {
		if (m->b2b[i] == CKPT_B2B_ZSTD)
			zstd_outer = 1;
		else if (m->b2b[i] != CKPT_B2B_CRC32C)
			break;
	}
	size_t o = 0;
	val[0] = 0;
	if (m->sharded && m->index_crc)
		o += (size_t)snprintf(val + o, cap - o, "%scrc32c-index", o ? "," : "");
	if (has_crc && o < cap)
		o += (size_t)snprintf(val + o, cap - o, "%scrc32c-chunk", o ? "," : "");
	if (has_zstd && zstd_outer && o < cap &&
	    first_frame_checksummed(m, ckpt_array_store(n->ar->arr), ckpt_array_prefix(n->ar->arr)) == 1)
		o += (size_t)snprintf(val + o, cap - o, "%szstd-frame", o ? "," : "");
	if (has_gzip && o < cap)
		o += (size_t)snprintf(val + o, cap - o, "%sgzip-crc32", o ? "," : "");
	if (!o)
		o = (size_t)snprintf(val, cap, "none");
	return o < cap ? (int)o : -ERANGE;
}

ssize_t ckpt_array_getxattr(ckpt_view *v, struct node *node, const char *name, char *buf, size_t cap)
{
	struct array_node *n = to_array(node);
	if (!has_xattr(n, name))
		return -ENODATA;
	const ckpt_array_meta *m = ckpt_array_meta_of(n->ar->arr);
	char val[XATTR_VAL_MAX];
	int len = -ENODATA;
	if (!strcmp(name, "user.ckpt.dtype")) {
		len = snprintf(val, sizeof(val), "%s",
			       ckpt_dtype_get(n->widen ? CKPT_DT_FLOAT32 : m->dtype)->name);
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
	} else if (!strcmp(name, "user.ckpt.checksum")) {
		len = checksum_str(n, val, sizeof(val));
	}
	if (len < 0)
		return len;
	return put(val, (size_t)len, buf, cap);
}

ssize_t ckpt_xattr_list(const char *const *names, size_t count, const uint8_t *skip, char *buf, size_t cap)
{
	size_t total = 0;
	for (size_t i = 0; i < count; i++) {
		if (skip && skip[i])
			continue;
		size_t l = strlen(names[i]) + 1;
		if (cap) {
			if (total + l > cap)
				return -ERANGE;
			memcpy(buf + total, names[i], l);
		}
		total += l;
	}
	return (ssize_t)total;
}

ssize_t ckpt_array_listxattr(ckpt_view *v, struct node *node, char *buf, size_t cap)
{
	(void)v;
	struct array_node *n = to_array(node);
	enum { N = sizeof(array_xattrs) / sizeof(array_xattrs[0]) };
	uint8_t skip[N];
	for (size_t i = 0; i < N; i++)
		skip[i] = !has_xattr(n, array_xattrs[i]);
	return ckpt_xattr_list(array_xattrs, N, skip, buf, cap);
}
