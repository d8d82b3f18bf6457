/*
 * store_mem.c - a store held in memory: key -> bytes, filled with
 * ckpt_store_mem_put() before use (tests and fuzzers build trees with it).
 * The keys are kept sorted in byte order, so list() walks one range and
 * listdir/stat come from the flat key list (a folder is any proper
 * '/'-prefix of a key), as for OCDBT.
 */
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "store.h"
#include "store_int.h"

struct mem_entry {
	char *key;
	uint8_t *data;
	size_t len;
};

typedef struct mem_store {
	struct ckpt_store base;
	struct mem_entry *e; /* sorted by key (strcmp) */
	size_t n, cap;
} mem_store;

/* First index whose key is >= key. */
static size_t mem_lower(const mem_store *m, const char *key)
{
	size_t lo = 0, hi = m->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (strcmp(m->e[mid].key, key) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static const struct mem_entry *mem_find(const mem_store *m, const char *key)
{
	size_t i = mem_lower(m, key);
	return i < m->n && strcmp(m->e[i].key, key) == 0 ? &m->e[i] : NULL;
}

static int mem_size(ckpt_store *s, const char *key, uint64_t *size)
{
	const struct mem_entry *e = mem_find((mem_store *)s, key);
	if (!e)
		return -ENOENT;
	*size = e->len;
	return 0;
}

static ssize_t mem_read(ckpt_store *s, const char *key, uint64_t off, size_t len, void *dst)
{
	const struct mem_entry *e = mem_find((mem_store *)s, key);
	if (!e)
		return -ENOENT;
	if (off >= e->len)
		return 0;
	size_t n = e->len - (size_t)off < len ? e->len - (size_t)off : len;
	memcpy(dst, e->data + off, n);
	return (ssize_t)n;
}

static int mem_list(ckpt_store *s, const char *prefix, ckpt_store_list_cb cb, void *ctx)
{
	mem_store *m = (mem_store *)s;
	const char *p = prefix ? prefix : "";
	size_t pn = strlen(p);
	for (size_t i = mem_lower(m, p); i < m->n && strncmp(m->e[i].key, p, pn) == 0; i++) {
		int rc = cb(ctx, m->e[i].key, m->e[i].len);
		if (rc)
			return rc;
	}
	return 0;
}

static void mem_destroy(ckpt_store *s)
{
	mem_store *m = (mem_store *)s;
	for (size_t i = 0; i < m->n; i++) {
		free(m->e[i].key);
		free(m->e[i].data);
	}
	free(m->e);
	free(m->base.root);
	free(m);
}

static unsigned mem_connections(ckpt_store *s)
{
	(void)s;
	return 1; /* a memcpy: nothing gains from a second request */
}

static const struct ckpt_store_ops mem_ops = {
	.size = mem_size,
	.read = mem_read,
	.list = mem_list,
	.listdir = ckpt_store_listdir_from_keys,
	.stat = ckpt_store_stat_from_keys,
	.destroy = mem_destroy,
	.connections = mem_connections,
};

int ckpt_store_mem_open(const char *name, ckpt_store **out)
{
	*out = NULL;
	mem_store *m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->base.ops = &mem_ops;
	m->base.root = strdup(name ? name : "mem:");
	if (!m->base.root) {
		free(m);
		return -ENOMEM;
	}
	*out = &m->base;
	return 0;
}

int ckpt_store_mem_put(ckpt_store *s, const char *key, const void *data, size_t len)
{
	if (s->ops != &mem_ops)
		return -EINVAL;
	if (!ckpt_store_key_ok(key))
		return -EINVAL;
	mem_store *m = (mem_store *)s;
	uint8_t *copy = malloc(len ? len : 1);
	if (!copy)
		return -ENOMEM;
	if (len)
		memcpy(copy, data, len);
	size_t i = mem_lower(m, key);
	if (i < m->n && strcmp(m->e[i].key, key) == 0) {
		free(m->e[i].data);
		m->e[i].data = copy;
		m->e[i].len = len;
		return 0;
	}
	if (m->n == m->cap) {
		size_t nc = m->cap ? m->cap * 2 : 16;
		struct mem_entry *ne = realloc(m->e, nc * sizeof(*ne));
		if (!ne) {
			free(copy);
			return -ENOMEM;
		}
		m->e = ne;
		m->cap = nc;
	}
	char *k = strdup(key);
	if (!k) {
		free(copy);
		return -ENOMEM;
	}
	memmove(m->e + i + 1, m->e + i, (m->n - i) * sizeof(*m->e));
	m->e[i] = (struct mem_entry){ k, copy, len };
	m->n++;
	return 0;
}
