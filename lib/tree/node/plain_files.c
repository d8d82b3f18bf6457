/*
 * plain_files.c - the file kinds whose bytes are no array: files read from
 * a store by key (a file of the source, STEP/.stored/) or synthesized in
 * memory, and the snapshots .ckptfs/stats and .ckptfs/log.
 */
#include <stdlib.h>
#include <string.h>

#include "stats.h"
#include "store.h"
#include "tree_int.h"

/* Size reported for .ckptfs/stats (served with direct I/O). */
#define STATS_SIZE 4096
/* Size reported for .ckptfs/log (direct I/O: a read ends where the lines do). */
#define LOG_SIZE (256u * 512u)

static void file_attr(ckpt_view *v, struct node *n, ckpt_attr *a, uint64_t size)
{
	(void)v;
	(void)n;
	a->mode = 0444;
	a->size = size;
}

/* ---- copied and synthesized files ------------------------------------------ */

static void plain_file_attr(ckpt_view *v, struct node *n, ckpt_attr *a)
{
	file_attr(v, n, a, to_file(n)->size);
}

static ssize_t file_read(ckpt_view *v, struct node *node, uint64_t off, size_t len, void *dst)
{
	(void)v;
	struct file_node *n = to_file(node);
	if (off >= n->size)
		return 0;
	if (len > n->size - off)
		len = (size_t)(n->size - off);
	if (n->content) {
		memcpy(dst, n->content + off, len);
		return (ssize_t)len;
	}
	ssize_t r = ckpt_store_read(n->store, n->key, off, len, dst);
	if (r < 0) {
		ckpt_log(CKPT_LOG_ERR, "%s/%s: read failed: %s", n->store->root, n->key, strerror((int)-r));
		return -EIO;
	}
	if (n->stored_copy)
		CKPT_STAT_ADD(stored_copy_bytes, (uint64_t)r);
	return r;
}

static void file_destroy(ckpt_view *v, struct node *node)
{
	(void)v;
	struct file_node *n = to_file(node);
	free(n->key);
	free(n->content);
}

const struct node_ops ckpt_file_ops = {
	.kind = N_FILE,
	.size = sizeof(struct file_node),
	.getattr = plain_file_attr,
	.read = file_read,
	.destroy = file_destroy,
};

/* ---- .ckptfs/stats ---------------------------------------------------------- */

static void stats_attr(ckpt_view *v, struct node *n, ckpt_attr *a)
{
	file_attr(v, n, a, STATS_SIZE);
	a->immutable = 0;
	a->volatile_data = 1;
}

static ssize_t stats_read(ckpt_view *v, struct node *n, uint64_t off, size_t len, void *dst)
{
	(void)v;
	(void)n;
	char buf[STATS_SIZE];
	int k = ckpt_stats_json(buf, sizeof(buf));
	if (k < 0)
		return k;
	/* Every snapshot is exactly STATS_SIZE bytes, the JSON padded with
	 * spaces and a newline (JSON whitespace): a reader whose second read
	 * lands past the first snapshot's JSON gets padding, never the tail
	 * of a longer, newer snapshot. */
	if ((size_t)k < sizeof(buf)) {
		memset(buf + k, ' ', sizeof(buf) - (size_t)k);
		buf[sizeof(buf) - 1] = '\n';
		k = (int)sizeof(buf);
	}
	if (off >= (uint64_t)k)
		return 0;
	size_t m = (size_t)k - (size_t)off < len ? (size_t)k - (size_t)off : len;
	memcpy(dst, buf + off, m);
	return (ssize_t)m;
}

const struct node_ops ckpt_stats_ops = {
	.kind = N_STATS,
	.size = sizeof(struct node),
	.getattr = stats_attr,
	.read = stats_read,
};

/* ---- .ckptfs/log: the recent log lines (ckpt_log_recent) --------------------- */

static void log_attr(ckpt_view *v, struct node *n, ckpt_attr *a)
{
	file_attr(v, n, a, LOG_SIZE);
	a->immutable = 0;
	a->volatile_data = 1;
}

/* Each read takes a new snapshot: lines are only appended until the ring
 * is full, so a reader reading on from where it stopped gets the lines
 * that came since (one read of LOG_SIZE bytes gets them all at once). */
static ssize_t log_read(ckpt_view *v, struct node *n, uint64_t off, size_t len, void *dst)
{
	(void)v;
	(void)n;
	char *buf = malloc(LOG_SIZE + 1);
	if (!buf)
		return -ENOMEM;
	size_t k = ckpt_log_recent(buf, LOG_SIZE + 1, CKPT_LOG_DEBUG);
	size_t m = 0;
	if (off < k) {
		m = k - (size_t)off < len ? k - (size_t)off : len;
		memcpy(dst, buf + off, m);
	}
	free(buf);
	return (ssize_t)m;
}

const struct node_ops ckpt_log_ops = {
	.kind = N_STATS,
	.size = sizeof(struct node),
	.getattr = log_attr,
	.read = log_read,
};
