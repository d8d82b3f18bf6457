/*
 * summary.c - the table of arrays of a directory (see summary.h), and the
 * hidden .ckptfs/summary.txt and .ckptfs/summary.json files that serve it
 * inside the mount: in each committed step of a root (STEP/.ckptfs/, made
 * on lookup) and in the root of a one-step or one-item mount (next to
 * .ckptfs/stats).
 *
 * The table is built by walking the nodes (node.c) the way the public
 * calls do: each directory entry under ns_lock shared, taken here, and each
 * xattr with no view lock (the user.ckpt.shards one takes ns_lock shared
 * itself).  So it is built only where no view lock is held (precondition of
 * ckpt_view_summary and of every function below that reaches the walk): on
 * a read, an open or a getattr of the file, never on a lookup (which runs
 * under ns_lock: a second shared acquisition can wait forever behind a
 * queued writer).  This file calls only node.c, never the public view API
 * (view.c is above it in the file map).  The text is kept on the node once built (a committed step
 * never changes); until then the file's size is 0.  It is served with
 * direct I/O, so a reader never depends on a size it saw before the build.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "summary.h"
#include "tree_int.h"

#define META_DIR ".ckptfs"

/* ---- the table ------------------------------------------------------------ */

struct arr {
	char *path; /* inside the view: STEP/ITEM/KEY/NAME.npy */
	char *step, *item; /* "" when none */
	char *key; /* KEY/NAME inside the item, without .npy */
	char dtype[32];
	char shape[256], chunks[256], codec[512], format[32], shards[256];
	uint64_t logical, stored;
	int stored_ok;
};

struct info {
	ckpt_view *v;
	int step_depth, item_depth; /* -1 when the directory is below that level */
	struct arr *a;
	size_t n, cap;
	char **steps;
	int64_t *step_mtime; /* of each step folder (ns) */
	size_t nsteps;
	char **broken; /* arrays listed but unreadable (paths) */
	size_t nbroken;
};

struct total {
	char name[64];
	size_t arrays;
	uint64_t logical, stored;
};

static int push_str(char ***list, size_t *n, const char *s)
{
	char **l = realloc(*list, (*n + 1) * sizeof(*l));
	if (!l)
		return -ENOMEM;
	*list = l;
	l[*n] = strdup(s);
	if (!l[*n])
		return -ENOMEM;
	(*n)++;
	return 0;
}

/* Path component `k` (0-based) of path, into buf; "" when absent. */
static void component(const char *path, int k, char *buf, size_t cap)
{
	const char *p = path;
	for (int i = 0; i < k && p; i++) {
		p = strchr(p, '/');
		if (p)
			p++;
	}
	buf[0] = 0;
	if (!p || k < 0)
		return;
	size_t len = strcspn(p, "/");
	snprintf(buf, cap, "%.*s", (int)(len < cap ? len : cap - 1), p);
}

/* Bytes per element as the .npy file stores it: the sub-byte and 8-bit
 * float types take one byte each. */
static uint64_t itemsize(const char *dtype)
{
	if (!strcmp(dtype, "bool") || !strncmp(dtype, "float8", 6) || !strncmp(dtype, "float4", 6) ||
	    !strcmp(dtype, "int4") || !strcmp(dtype, "uint4") || !strcmp(dtype, "int2") ||
	    !strcmp(dtype, "uint2"))
		return 1;
	size_t n = strlen(dtype), i = n;
	while (i > 0 && dtype[i - 1] >= '0' && dtype[i - 1] <= '9')
		i--;
	unsigned long bits = i < n ? strtoul(dtype + i, NULL, 10) : 8;
	return bits >= 8 ? bits / 8 : 1;
}

/* Product of a "[a,b,c]" shape ("[]": 1). */
static uint64_t elements(const char *shape)
{
	uint64_t n = 1;
	for (const char *p = shape; *p;) {
		if (*p >= '0' && *p <= '9') {
			char *end;
			n *= strtoull(p, &end, 10);
			p = end;
		} else {
			p++;
		}
	}
	return n;
}

static ssize_t xattr(ckpt_view *v, ckpt_ino ino, const char *name, char *buf, size_t cap)
{
	/* what ckpt_view_getxattr does for user.* names; no view lock held */
	ckpt_assert_not_held(CKPT_RANK_NS);
	struct node *nd = ckpt_node_at(v, ino);
	ssize_t n = !nd			       ? -ENOENT
		    : ckpt_node_is_gone(v, nd) ? -ESTALE
		    : !nd->ops->getxattr       ? -ENODATA
					       : nd->ops->getxattr(v, nd, name, buf, cap - 1);
	buf[n >= 0 ? (size_t)n : 0] = 0;
	return n;
}

static int visit(struct info *in, const char *path, const ckpt_attr *a)
{
	int abs_depth = 0; /* depth below the view root */
	for (const char *p = path; *p; p++)
		abs_depth += *p == '/';
	if (a->is_dir) {
		if (abs_depth == in->step_depth) {
			int64_t *m = realloc(in->step_mtime, (in->nsteps + 1) * sizeof(*m));
			if (!m)
				return -ENOMEM;
			in->step_mtime = m;
			m[in->nsteps] = a->mtime_ns;
			if (push_str(&in->steps, &in->nsteps, path) < 0)
				return -ENOMEM;
		}
		return 0;
	}
	struct node *nd = ckpt_node_at(in->v, a->ino);
	if (nd && nd->ops->kind == N_BROKEN) /* listed, reads answer EIO */
		return push_str(&in->broken, &in->nbroken, path);
	char buf[512];
	if (xattr(in->v, a->ino, "user.ckpt.dtype", buf, sizeof(buf)) < 0)
		return 0; /* not an array: a metadata file */
	if (in->n == in->cap) {
		size_t cap = in->cap ? in->cap * 2 : 64;
		struct arr *na = realloc(in->a, cap * sizeof(*na));
		if (!na)
			return -ENOMEM;
		in->a = na;
		in->cap = cap;
	}
	struct arr *r = &in->a[in->n];
	memset(r, 0, sizeof(*r));
	r->path = strdup(path);
	if (!r->path)
		return -ENOMEM;
	in->n++;
	snprintf(r->dtype, sizeof(r->dtype), "%.31s", buf);
	xattr(in->v, a->ino, "user.ckpt.shape", r->shape, sizeof(r->shape));
	xattr(in->v, a->ino, "user.ckpt.chunks", r->chunks, sizeof(r->chunks));
	xattr(in->v, a->ino, "user.ckpt.codec", r->codec, sizeof(r->codec));
	xattr(in->v, a->ino, "user.ckpt.format", r->format, sizeof(r->format));
	if (xattr(in->v, a->ino, "user.ckpt.shards", r->shards, sizeof(r->shards)) < 0)
		snprintf(r->shards, sizeof(r->shards), "null");
	r->stored_ok = xattr(in->v, a->ino, "user.ckpt.stored_bytes", buf, sizeof(buf)) >= 0;
	r->stored = r->stored_ok ? strtoull(buf, NULL, 10) : 0;
	/* Logical bytes: elements times the element size (no read at all:
	 * even a header read may start read-ahead of the next array). */
	r->logical = elements(r->shape) * itemsize(r->dtype);
	char comp[1024];
	component(path, in->step_depth, comp, sizeof(comp));
	r->step = strdup(comp);
	component(path, in->item_depth, comp, sizeof(comp));
	r->item = strdup(comp);
	const char *k = path;
	for (int i = 0; i <= in->item_depth && k; i++) {
		k = strchr(k, '/');
		if (k)
			k++;
	}
	r->key = strdup(k ? k : path);
	if (!r->step || !r->item || !r->key)
		return -ENOMEM;
	size_t kl = strlen(r->key);
	if (kl > 4 && !strcmp(r->key + kl - 4, ".npy"))
		r->key[kl - 4] = 0;
	return 0;
}

/* Entry `index` of dir, as ckpt_view_readdir answers it (without the root
 * rescan): ns_lock shared is taken here, so none may be held. */
static int entry(ckpt_view *v, ckpt_ino ino, uint64_t index, const char **name, ckpt_attr *attr)
{
	ckpt_assert_not_held(CKPT_RANK_NS);
	return ckpt_node_entry(v, ino, index, name, attr, 0);
}

/* Every entry below dir, depth first in listing order (hidden names are
 * not listed, so .ckptfs/ never shows up). */
static int walk(struct info *in, ckpt_ino dir, const char *prefix, int depth)
{
	if (depth > 256)
		return 0;
	for (uint64_t i = 0;; i++) {
		const char *name = "";
		ckpt_attr a;
		int rc = entry(in->v, dir, i, &name, &a);
		if (rc <= 0)
			return rc;
		size_t len = strlen(prefix) + strlen(name) + 2;
		char *path = malloc(len);
		if (!path)
			return -ENOMEM;
		snprintf(path, len, "%s%s%s", prefix, *prefix ? "/" : "", name);
		size_t nsteps = in->nsteps;
		rc = visit(in, path, &a);
		if (rc == 0 && a.is_dir)
			rc = walk(in, a.ino, path, depth + 1);
		struct node *sn = in->nsteps > nsteps ? ckpt_node_at(in->v, a.ino) : NULL;
		if (rc == 0 && sn) { /* a step: its commit time is read when it is first listed */
			ckpt_attr fresh;
			ckpt_node_fill_attr(in->v, sn, &fresh);
			in->step_mtime[in->nsteps - 1] = fresh.mtime_ns;
		}
		free(path);
		if (rc)
			return rc;
	}
}

void ckpt_json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\')
			fprintf(f, "\\%c", *p);
		else if (*p < 0x20)
			fprintf(f, "\\u%04x", *p);
		else
			fputc(*p, f);
	}
	fputc('"', f);
}

const char *ckpt_human(uint64_t n, char *buf, size_t cap)
{
	static const char *const unit[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
	if (n < 1024) {
		snprintf(buf, cap, "%llu B", (unsigned long long)n);
		return buf;
	}
	double d = (double)n;
	int u = 0;
	while (d >= 1024 && u < 5) {
		d /= 1024;
		u++;
	}
	snprintf(buf, cap, "%.1f %s", d, unit[u]);
	return buf;
}

static void print_ratio(FILE *f, uint64_t logical, uint64_t stored)
{
	if (stored)
		fprintf(f, "%.2f", (double)logical / (double)stored);
	else
		fprintf(f, "-");
}

static struct total *tally(struct total **t, size_t *n, const char *name)
{
	for (size_t i = 0; i < *n; i++)
		if (!strcmp((*t)[i].name, name))
			return &(*t)[i];
	struct total *nt = realloc(*t, (*n + 1) * sizeof(*nt));
	if (!nt)
		return NULL;
	*t = nt;
	memset(&nt[*n], 0, sizeof(nt[*n]));
	snprintf(nt[*n].name, sizeof(nt[*n].name), "%s", name);
	return &nt[(*n)++];
}

static void print_unreadable(FILE *f, struct info *in)
{
	if (!in->nbroken)
		return;
	fprintf(f,
		"unreadable: %zu array%s listed whose data or metadata cannot be read (reads answer EIO;\n"
		"the reasons are logged):\n",
		in->nbroken, in->nbroken == 1 ? "" : "s");
	for (size_t i = 0; i < in->nbroken; i++)
		fprintf(f, "  %s\n", in->broken[i]);
}

/* One line per step (the default for a whole root): when it was committed,
 * its arrays and bytes, the latest marked. */
static void print_steps(FILE *f, struct info *in)
{
	char a1[32], a2[32], when[32];
	int sw = 4;
	for (size_t i = 0; i < in->nsteps; i++)
		sw = (int)strlen(in->steps[i]) > sw ? (int)strlen(in->steps[i]) : sw;
	fprintf(f, "\n  %*s  %-20s %7s %10s %10s %-5s\n", sw, "STEP", "COMMITTED (UTC)", "ARRAYS", "LOGICAL",
		"STORED", "RATIO");
	struct total all = { "", 0, 0, 0 };
	for (size_t i = 0; i < in->nsteps; i++) {
		struct total t = { "", 0, 0, 0 };
		size_t bad = 0;
		for (size_t k = 0; k < in->n; k++) {
			if (strcmp(in->a[k].step, in->steps[i]))
				continue;
			t.arrays++;
			t.logical += in->a[k].logical;
			t.stored += in->a[k].stored;
		}
		size_t sl = strlen(in->steps[i]);
		for (size_t k = 0; k < in->nbroken; k++)
			bad += !strncmp(in->broken[k], in->steps[i], sl) && in->broken[k][sl] == '/';
		time_t sec = (time_t)(in->step_mtime[i] / 1000000000);
		struct tm tm;
		gmtime_r(&sec, &tm);
		strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
		fprintf(f, "  %*s  %-20s %7zu %10s %10s ", sw, in->steps[i], when, t.arrays,
			ckpt_human(t.logical, a1, sizeof(a1)), ckpt_human(t.stored, a2, sizeof(a2)));
		print_ratio(f, t.logical, t.stored);
		if (bad)
			fprintf(f, "  %zu unreadable", bad);
		fprintf(f, "%s\n", i + 1 == in->nsteps ? "  latest" : "");
		all.arrays += t.arrays;
		all.logical += t.logical;
		all.stored += t.stored;
	}
	fprintf(f, "\ntotal: %zu steps, %zu arrays, %s logical, %s stored, ratio ", in->nsteps, all.arrays,
		ckpt_human(all.logical, a1, sizeof(a1)), ckpt_human(all.stored, a2, sizeof(a2)));
	print_ratio(f, all.logical, all.stored);
	fprintf(f, "\n");
	print_unreadable(f, in);
	if (in->nsteps)
		fprintf(f, "(the table of one step's arrays: ckptfs info SOURCE %s; of every step: --all)\n",
			in->steps[in->nsteps - 1]);
}

static void print_text(FILE *f, struct info *in, const char *source, const char *kind, int compact)
{
	char a1[32], a2[32];
	fprintf(f, "%s: %s\n", source,
		!strcmp(kind, "root")	? "CheckpointManager root"
		: !strcmp(kind, "step") ? "one step"
					: "one item");
	if (in->step_depth >= 0) {
		fprintf(f, "steps (%zu):", in->nsteps);
		for (size_t i = 0; i < in->nsteps; i++)
			fprintf(f, " %s", in->steps[i]);
		fprintf(f, "\n");
	}
	if (compact) {
		print_steps(f, in);
		return;
	}
	struct total *dt = NULL, all = { "", 0, 0, 0 };
	size_t ndt = 0;
	int kw = 3, dw = 5, sw = 5, cw = 6;
	for (size_t i = 0; i < in->n; i++) {
		struct arr *r = &in->a[i];
		int l = (int)strlen(r->key);
		kw = l > kw ? l : kw;
		dw = (int)strlen(r->dtype) > dw ? (int)strlen(r->dtype) : dw;
		sw = (int)strlen(r->shape) > sw ? (int)strlen(r->shape) : sw;
		cw = (int)strlen(r->chunks) > cw ? (int)strlen(r->chunks) : cw;
	}
	const char *cur_step = NULL, *cur_item = NULL;
	struct total it = { "", 0, 0, 0 };
	for (size_t i = 0; i <= in->n; i++) {
		struct arr *r = i < in->n ? &in->a[i] : NULL;
		if (cur_item && (!r || strcmp(r->step, cur_step) || strcmp(r->item, cur_item))) {
			fprintf(f, "  %-*s %-*s %-*s %-*s %10s %10s ", kw, "total", dw, "", sw, "", cw, "",
				ckpt_human(it.logical, a1, sizeof(a1)),
				ckpt_human(it.stored, a2, sizeof(a2)));
			print_ratio(f, it.logical, it.stored);
			fprintf(f, "  (%zu arrays)\n", it.arrays);
			cur_item = NULL;
		}
		if (!r)
			break;
		if (!cur_item) {
			cur_step = r->step;
			cur_item = r->item;
			memset(&it, 0, sizeof(it));
			fprintf(f, "\n");
			if (*r->step)
				fprintf(f, "step %s, ", r->step);
			fprintf(f, "item %s\n", *r->item ? r->item : "(source)");
			fprintf(f, "  %-*s %-*s %-*s %-*s %10s %10s %s\n", kw, "KEY", dw, "DTYPE", sw,
				"SHAPE", cw, "CHUNKS", "LOGICAL", "STORED", "RATIO");
		}
		fprintf(f, "  %-*s %-*s %-*s %-*s %10s %10s ", kw, r->key, dw, r->dtype, sw, r->shape, cw,
			r->chunks, ckpt_human(r->logical, a1, sizeof(a1)),
			r->stored_ok ? ckpt_human(r->stored, a2, sizeof(a2)) : "?");
		print_ratio(f, r->logical, r->stored);
		fprintf(f, "\n");
		it.arrays++;
		it.logical += r->logical;
		it.stored += r->stored;
		all.arrays++;
		all.logical += r->logical;
		all.stored += r->stored;
		struct total *t = tally(&dt, &ndt, r->dtype);
		if (t) {
			t->arrays++;
			t->logical += r->logical;
			t->stored += r->stored;
		}
	}
	fprintf(f, "\nper dtype:\n");
	for (size_t i = 0; i < ndt; i++) {
		fprintf(f, "  %-*s %6zu arrays %10s %10s ", dw, dt[i].name, dt[i].arrays,
			ckpt_human(dt[i].logical, a1, sizeof(a1)), ckpt_human(dt[i].stored, a2, sizeof(a2)));
		print_ratio(f, dt[i].logical, dt[i].stored);
		fprintf(f, "\n");
	}
	fprintf(f, "total: %zu arrays, %s logical, %s stored, ratio ", all.arrays,
		ckpt_human(all.logical, a1, sizeof(a1)), ckpt_human(all.stored, a2, sizeof(a2)));
	print_ratio(f, all.logical, all.stored);
	fprintf(f, "\n");
	print_unreadable(f, in);
	free(dt);
}

static void print_json(FILE *f, struct info *in, const char *source, const char *kind)
{
	fprintf(f, "{\"source\": ");
	ckpt_json_str(f, source);
	fprintf(f, ", \"kind\": \"%s\", \"steps\": [", kind);
	for (size_t i = 0; i < in->nsteps; i++) {
		fprintf(f, i ? ", " : "");
		ckpt_json_str(f, in->steps[i]);
	}
	fprintf(f, "],\n \"arrays\": [");
	struct total *dt = NULL, *its = NULL, all = { "", 0, 0, 0 };
	size_t ndt = 0, nits = 0;
	for (size_t i = 0; i < in->n; i++) {
		struct arr *r = &in->a[i];
		fprintf(f, "%s\n  {\"path\": ", i ? "," : "");
		ckpt_json_str(f, r->path);
		fprintf(f, ", \"step\": ");
		ckpt_json_str(f, r->step);
		fprintf(f, ", \"item\": ");
		ckpt_json_str(f, r->item);
		fprintf(f, ", \"key\": ");
		ckpt_json_str(f, r->key);
		fprintf(f, ", \"dtype\": ");
		ckpt_json_str(f, r->dtype);
		fprintf(f, ", \"shape\": %s, \"chunks\": %s, \"shards\": %s, \"codec\": ", r->shape,
			r->chunks, r->shards);
		ckpt_json_str(f, r->codec);
		fprintf(f, ", \"format\": ");
		ckpt_json_str(f, r->format);
		fprintf(f, ", \"logical_bytes\": %llu, \"stored_bytes\": ", (unsigned long long)r->logical);
		if (r->stored_ok)
			fprintf(f, "%llu, \"ratio\": ", (unsigned long long)r->stored);
		else
			fprintf(f, "null, \"ratio\": ");
		if (r->stored)
			fprintf(f, "%.4f}", (double)r->logical / (double)r->stored);
		else
			fprintf(f, "null}");
		char iname[128];
		snprintf(iname, sizeof(iname), "%s%s%s", r->step, *r->step ? "/" : "", r->item);
		struct total *t[2] = { tally(&dt, &ndt, r->dtype), tally(&its, &nits, iname) };
		for (int k = 0; k < 2; k++) {
			if (!t[k])
				continue;
			t[k]->arrays++;
			t[k]->logical += r->logical;
			t[k]->stored += r->stored;
		}
		all.arrays++;
		all.logical += r->logical;
		all.stored += r->stored;
	}
	struct {
		const char *name;
		struct total *t;
		size_t n;
	} groups[] = { { "items", its, nits }, { "dtypes", dt, ndt } };
	for (int g = 0; g < 2; g++) {
		fprintf(f, "],\n \"%s\": [", groups[g].name);
		for (size_t i = 0; i < groups[g].n; i++) {
			struct total *t = &groups[g].t[i];
			fprintf(f, "%s\n  {\"name\": ", i ? "," : "");
			ckpt_json_str(f, t->name);
			fprintf(f, ", \"arrays\": %zu, \"logical_bytes\": %llu, \"stored_bytes\": %llu}",
				t->arrays, (unsigned long long)t->logical, (unsigned long long)t->stored);
		}
	}
	fprintf(f, "],\n \"unreadable\": [");
	for (size_t i = 0; i < in->nbroken; i++) {
		fprintf(f, i ? ", " : "");
		ckpt_json_str(f, in->broken[i]);
	}
	fprintf(f, "],\n \"total\": {\"arrays\": %zu, \"logical_bytes\": %llu, \"stored_bytes\": %llu}}\n",
		all.arrays, (unsigned long long)all.logical, (unsigned long long)all.stored);
	free(dt);
	free(its);
}

/* The path of dir inside the view ("" for the root), from its ancestors'
 * names (a published node's name and parent never change). */
static char *dir_path(ckpt_view *v, ckpt_ino dir)
{
	const char *names[256];
	int k = 0;
	size_t len = 1;
	for (struct node *n = ckpt_node_at(v, dir); n && n->ino != CKPT_ROOT_INO;
	     n = ckpt_node_at(v, n->parent)) {
		if (k == 256)
			return NULL;
		names[k++] = n->name;
		len += strlen(n->name) + 1;
	}
	char *p = malloc(len), *w = p;
	if (!p)
		return NULL;
	*w = 0;
	while (k-- > 0)
		w += sprintf(w, "%s%s", w == p ? "" : "/", names[k]);
	return p;
}

int ckpt_view_summary(ckpt_view *v, ckpt_ino dir, const char *source, int flags, char **buf, size_t *len)
{
	int json = flags & CKPT_SUMMARY_JSON;
	ckpt_assert_not_held(CKPT_RANK_NS); /* the walk takes it shared, entry by entry */
	ckpt_attr a;
	struct node *dn = ckpt_node_at(v, dir);
	if (!dn)
		return -ENOENT;
	if (ckpt_node_is_gone(v, dn))
		return -ESTALE;
	ckpt_node_fill_attr(v, dn, &a);
	if (!a.is_dir)
		return -ENOTDIR;
	int rc = 0;
	const char *kind = v->kind;
	struct info in = { .v = v };
	in.step_depth = !strcmp(kind, "root") ? 0 : -1;
	in.item_depth = !strcmp(kind, "root") ? 1 : !strcmp(kind, "step") ? 0 : -1;
	char *prefix = dir_path(v, dir);
	if (!prefix)
		return -ENOMEM;
	/* a whole root: one line per step unless CKPT_SUMMARY_ALL */
	int compact = !*prefix && in.step_depth == 0 && !(flags & CKPT_SUMMARY_ALL);
	if (*prefix && in.step_depth == 0) { /* the step the directory is in */
		char step[1024];
		component(prefix, 0, step, sizeof(step));
		in.step_mtime = calloc(1, sizeof(*in.step_mtime));
		rc = in.step_mtime ? push_str(&in.steps, &in.nsteps, step) : -ENOMEM;
	}
	if (rc == 0)
		rc = walk(&in, dir, prefix, 0);
	free(prefix);
	if (rc == 0) {
		FILE *f = open_memstream(buf, len);
		if (!f) {
			rc = -ENOMEM;
		} else {
			if (json)
				print_json(f, &in, source ? source : v->source, kind);
			else
				print_text(f, &in, source ? source : v->source, kind, compact);
			if (fclose(f) != 0) {
				free(*buf);
				rc = -ENOMEM;
			}
		}
	}
	for (size_t i = 0; i < in.n; i++) {
		free(in.a[i].path);
		free(in.a[i].step);
		free(in.a[i].item);
		free(in.a[i].key);
	}
	free(in.a);
	for (size_t i = 0; i < in.nsteps; i++)
		free(in.steps[i]);
	free(in.steps);
	free(in.step_mtime);
	for (size_t i = 0; i < in.nbroken; i++)
		free(in.broken[i]);
	free(in.broken);
	return rc < 0 ? rc : (int)(in.nbroken < 0x7fffffff ? in.nbroken : 0x7fffffff);
}

int ckpt_summary_totals(ckpt_view *v, ckpt_ino dir, struct summary_totals *t)
{
	ckpt_assert_not_held(CKPT_RANK_NS); /* the walk takes it shared, entry by entry */
	memset(t, 0, sizeof(*t));
	struct info in = { .v = v, .step_depth = -1, .item_depth = -1 };
	int rc = walk(&in, dir, "", 0);
	for (size_t i = 0; i < in.n; i++) {
		t->arrays++;
		t->logical += in.a[i].logical;
		t->stored += in.a[i].stored;
		free(in.a[i].path);
		free(in.a[i].step);
		free(in.a[i].item);
		free(in.a[i].key);
	}
	t->unreadable = in.nbroken;
	free(in.a);
	for (size_t i = 0; i < in.nbroken; i++)
		free(in.broken[i]);
	free(in.broken);
	return rc < 0 ? rc : 0;
}

/* ---- .ckptfs/summary.txt and summary.json ---------------------------------- */

struct sum_text {
	size_t len;
	char data[];
};

struct sum_node {
	struct node n;
	int json;
	_Atomic(struct sum_text *) text; /* set once (the first build to finish wins) */
};

static struct sum_node *to_sum(struct node *n)
{
	assert(n->kind == N_SUMMARY);
	return container_of(n, struct sum_node, n);
}

/* Build the text once; called with no view lock held (it walks the view
 * through the public calls). */
static int sum_build(ckpt_view *v, struct node *n)
{
	struct sum_node *s = to_sum(n);
	if (atomic_load_explicit(&s->text, memory_order_acquire))
		return 0;
	struct node *meta = ckpt_node_at(v, n->parent);
	if (!meta)
		return -ENOENT;
	char *buf;
	size_t len;
	int rc = ckpt_view_summary(v, meta->parent, NULL, s->json, &buf, &len);
	if (rc < 0)
		return rc;
	struct sum_text *t = malloc(sizeof(*t) + len + 1);
	if (!t) {
		free(buf);
		return -ENOMEM;
	}
	t->len = len;
	memcpy(t->data, buf, len + 1);
	free(buf);
	struct sum_text *none = NULL;
	if (!atomic_compare_exchange_strong(&s->text, &none, t))
		free(t); /* a concurrent build finished first: same text */
	return 0;
}

static void sum_prepare(ckpt_view *v, struct node *n)
{
	(void)sum_build(v, n); /* a failure shows as size 0; the read reports it */
}

static void sum_attr(ckpt_view *v, struct node *n, ckpt_attr *a)
{
	(void)v;
	struct sum_text *t = atomic_load_explicit(&to_sum(n)->text, memory_order_acquire);
	a->mode = 0444;
	a->size = t ? t->len : 0;
	/* direct I/O: a size seen before the text was built is never trusted */
	a->immutable = 0;
	a->volatile_data = 1;
}

static int sum_open(ckpt_view *v, struct node *n)
{
	int rc = sum_build(v, n);
	return rc < 0 ? rc : 0;
}

static ssize_t sum_read(ckpt_view *v, struct node *n, uint64_t off, size_t len, void *dst)
{
	int rc = sum_build(v, n);
	if (rc < 0)
		return rc;
	struct sum_text *t = atomic_load_explicit(&to_sum(n)->text, memory_order_acquire);
	if (off >= t->len)
		return 0;
	size_t m = t->len - (size_t)off < len ? t->len - (size_t)off : len;
	memcpy(dst, t->data + off, m);
	return (ssize_t)m;
}

static void sum_destroy(ckpt_view *v, struct node *n)
{
	(void)v;
	free(atomic_exchange(&to_sum(n)->text, NULL));
}

static const struct node_ops sum_ops = {
	.kind = N_SUMMARY,
	.size = sizeof(struct sum_node),
	.getattr = sum_attr,
	.prepare = sum_prepare,
	.open = sum_open,
	.read = sum_read,
	.destroy = sum_destroy,
};

int ckpt_summary_add_files(ckpt_view *v, struct node *meta)
{
	static const char *const names[2] = { "summary.txt", "summary.json" };
	for (int j = 0; j < 2; j++) {
		struct node *n = ckpt_node_new(v, &sum_ops, names[j], meta);
		if (!n)
			return -ENOMEM;
		to_sum(n)->json = j;
		atomic_init(&to_sum(n)->text, NULL);
		int rc = ckpt_node_add_kid(meta, n);
		if (rc < 0)
			return rc;
	}
	return 0;
}
