/*
 * cli_info.c - `ckptfs info [--json] SOURCE [PATH]`: steps, items and a
 * table of arrays without mounting.  Built on the view API alone: a
 * read-only view of SOURCE, walked with readdir; array facts come from the
 * user.ckpt.* xattrs and the generated .npy header.  Never reads array
 * data.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckfs.h"
#include "cli.h"

struct arr {
	char *path; /* inside the view: STEP/ITEM/KEY/NAME.npy */
	const char *step, *item; /* interned in the path copy below; "" when none */
	char *key; /* KEY/NAME inside the item, without .npy */
	char dtype[32];
	char shape[256], chunks[256], codec[512], format[32], shards[256];
	uint64_t logical, stored;
	int stored_ok;
};

struct info {
	ckpt_view *v;
	int step_depth, item_depth; /* -1 when the source is below that level */
	struct arr *a;
	size_t n, cap;
	char **steps;
	size_t nsteps;
	char **items; /* "STEP/ITEM" or "ITEM" */
	size_t nitems;
	int err;
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

static int visit(void *ctx, const char *path, int depth, const ckpt_attr *a)
{
	struct info *in = ctx;
	int abs_depth = 0; /* depth below the view root */
	for (const char *p = path; *p; p++)
		abs_depth += *p == '/';
	(void)depth;
	if (a->is_dir) {
		if (abs_depth == in->step_depth && push_str(&in->steps, &in->nsteps, path) < 0)
			return -ENOMEM;
		if (abs_depth == in->item_depth && push_str(&in->items, &in->nitems, path) < 0)
			return -ENOMEM;
		return 0;
	}
	char buf[512];
	if (ckfs_xattr(in->v, a->ino, "user.ckpt.dtype", buf, sizeof(buf)) < 0)
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
	ckfs_xattr(in->v, a->ino, "user.ckpt.shape", r->shape, sizeof(r->shape));
	ckfs_xattr(in->v, a->ino, "user.ckpt.chunks", r->chunks, sizeof(r->chunks));
	ckfs_xattr(in->v, a->ino, "user.ckpt.codec", r->codec, sizeof(r->codec));
	ckfs_xattr(in->v, a->ino, "user.ckpt.format", r->format, sizeof(r->format));
	if (ckfs_xattr(in->v, a->ino, "user.ckpt.shards", r->shards, sizeof(r->shards)) < 0)
		snprintf(r->shards, sizeof(r->shards), "null");
	r->stored_ok = ckfs_xattr(in->v, a->ino, "user.ckpt.stored_bytes", buf, sizeof(buf)) >= 0;
	r->stored = r->stored_ok ? strtoull(buf, NULL, 10) : 0;
	/* Logical bytes: elements times the element size (no read at all:
	 * even a header read may start read-ahead of the next array). */
	r->logical = elements(r->shape) * itemsize(r->dtype);
	/* Step, item and key from the path. */
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

static void print_ratio(FILE *f, uint64_t logical, uint64_t stored)
{
	if (stored)
		fprintf(f, "%.2f", (double)logical / (double)stored);
	else
		fprintf(f, "-");
}

struct total {
	char name[64];
	size_t arrays;
	uint64_t logical, stored;
};

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

static void print_text(struct info *in, const char *source, const char *kind)
{
	char a1[32], a2[32];
	printf("%s: %s\n", source,
	       !strcmp(kind, "root")   ? "CheckpointManager root"
	       : !strcmp(kind, "step") ? "one step"
				       : "one item");
	if (in->step_depth >= 0) {
		printf("steps (%zu):", in->nsteps);
		for (size_t i = 0; i < in->nsteps; i++)
			printf(" %s", in->steps[i]);
		printf("\n");
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
			printf("  %-*s %-*s %-*s %-*s %10s %10s ", kw, "total", dw, "", sw, "", cw, "",
			       cli_human(it.logical, a1, sizeof(a1)), cli_human(it.stored, a2, sizeof(a2)));
			print_ratio(stdout, it.logical, it.stored);
			printf("  (%zu arrays)\n", it.arrays);
			cur_item = NULL;
		}
		if (!r)
			break;
		if (!cur_item) {
			cur_step = r->step;
			cur_item = r->item;
			memset(&it, 0, sizeof(it));
			printf("\n");
			if (*r->step)
				printf("step %s, ", r->step);
			printf("item %s\n", *r->item ? r->item : "(source)");
			printf("  %-*s %-*s %-*s %-*s %10s %10s %s\n", kw, "KEY", dw, "DTYPE", sw, "SHAPE",
			       cw, "CHUNKS", "LOGICAL", "STORED", "RATIO");
		}
		printf("  %-*s %-*s %-*s %-*s %10s %10s ", kw, r->key, dw, r->dtype, sw, r->shape, cw,
		       r->chunks, cli_human(r->logical, a1, sizeof(a1)),
		       r->stored_ok ? cli_human(r->stored, a2, sizeof(a2)) : "?");
		print_ratio(stdout, r->logical, r->stored);
		printf("\n");
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
	printf("\nper dtype:\n");
	for (size_t i = 0; i < ndt; i++) {
		printf("  %-*s %6zu arrays %10s %10s ", dw, dt[i].name, dt[i].arrays,
		       cli_human(dt[i].logical, a1, sizeof(a1)), cli_human(dt[i].stored, a2, sizeof(a2)));
		print_ratio(stdout, dt[i].logical, dt[i].stored);
		printf("\n");
	}
	printf("total: %zu arrays, %s logical, %s stored, ratio ", all.arrays,
	       cli_human(all.logical, a1, sizeof(a1)), cli_human(all.stored, a2, sizeof(a2)));
	print_ratio(stdout, all.logical, all.stored);
	printf("\n");
	free(dt);
}

static void print_json(struct info *in, const char *source, const char *kind)
{
	FILE *f = stdout;
	fprintf(f, "{\"source\": ");
	cli_json_str(f, source);
	fprintf(f, ", \"kind\": \"%s\", \"steps\": [", kind);
	for (size_t i = 0; i < in->nsteps; i++) {
		fprintf(f, i ? ", " : "");
		cli_json_str(f, in->steps[i]);
	}
	fprintf(f, "],\n \"arrays\": [");
	struct total *dt = NULL, *its = NULL, all = { "", 0, 0, 0 };
	size_t ndt = 0, nits = 0;
	for (size_t i = 0; i < in->n; i++) {
		struct arr *r = &in->a[i];
		fprintf(f, "%s\n  {\"path\": ", i ? "," : "");
		cli_json_str(f, r->path);
		fprintf(f, ", \"step\": ");
		cli_json_str(f, r->step);
		fprintf(f, ", \"item\": ");
		cli_json_str(f, r->item);
		fprintf(f, ", \"key\": ");
		cli_json_str(f, r->key);
		fprintf(f, ", \"dtype\": ");
		cli_json_str(f, r->dtype);
		fprintf(f, ", \"shape\": %s, \"chunks\": %s, \"shards\": %s, \"codec\": ", r->shape,
			r->chunks, r->shards);
		cli_json_str(f, r->codec);
		fprintf(f, ", \"format\": ");
		cli_json_str(f, r->format);
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
			cli_json_str(f, t->name);
			fprintf(f, ", \"arrays\": %zu, \"logical_bytes\": %llu, \"stored_bytes\": %llu}",
				t->arrays, (unsigned long long)t->logical, (unsigned long long)t->stored);
		}
	}
	fprintf(f, "],\n \"total\": {\"arrays\": %zu, \"logical_bytes\": %llu, \"stored_bytes\": %llu}}\n",
		all.arrays, (unsigned long long)all.logical, (unsigned long long)all.stored);
	free(dt);
	free(its);
}

static void info_usage(FILE *f)
{
	fprintf(f, "usage: ckptfs info [--json] SOURCE [PATH]\n"
		   "Steps, items and a table of the arrays under SOURCE (or PATH inside it: STEP,\n"
		   "STEP/ITEM or a directory below), without mounting.  Reads metadata only.\n");
}

int ckfs_cmd_info(int argc, char **argv)
{
	int json = 0;
	const char *source = NULL, *sub = "";
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--json")) {
			json = 1;
		} else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			info_usage(stdout);
			return 0;
		} else if (argv[i][0] == '-' && argv[i][1]) {
			fprintf(stderr, "ckptfs info: unknown option %s\n", argv[i]);
			info_usage(stderr);
			return 2;
		} else if (!source) {
			source = argv[i];
		} else if (!*sub) {
			sub = argv[i];
		} else {
			info_usage(stderr);
			return 2;
		}
	}
	if (!source) {
		info_usage(stderr);
		return 2;
	}
	ckpt_view *v;
	char *real;
	int rc = cli_open_view(source, &v, &real);
	if (rc < 0)
		return 1;
	const char *kind = ckpt_view_kind(v);
	struct info in = { .v = v };
	in.step_depth = !strcmp(kind, "root") ? 0 : -1;
	in.item_depth = !strcmp(kind, "root") ? 1 : !strcmp(kind, "step") ? 0 : -1;
	ckpt_attr a;
	rc = ckfs_resolve(v, sub, &a);
	if (rc < 0) {
		fprintf(stderr, "ckptfs info: %s: %s: %s\n", real, sub, strerror(-rc));
	} else if (!a.is_dir) {
		/* One array: walk its parent, keep that file only. */
		fprintf(stderr, "ckptfs info: %s: %s: not a directory\n", real, sub);
		rc = -ENOTDIR;
	} else {
		char *prefix = strdup(sub);
		size_t pl = prefix ? strlen(prefix) : 0;
		while (pl && prefix[pl - 1] == '/')
			prefix[--pl] = 0;
		if (prefix && *prefix && in.step_depth == 0) { /* the step PATH is in */
			char step[1024];
			component(prefix, 0, step, sizeof(step));
			rc = push_str(&in.steps, &in.nsteps, step);
		}
		if (rc == 0)
			rc = prefix ? ckfs_walk(v, a.ino, prefix, 0, visit, &in) : -ENOMEM;
		free(prefix);
		if (rc < 0)
			fprintf(stderr, "ckptfs info: %s: %s\n", real, strerror(-rc));
	}
	if (rc == 0) {
		if (json)
			print_json(&in, real, kind);
		else
			print_text(&in, real, kind);
	}
	for (size_t i = 0; i < in.n; i++) {
		free(in.a[i].path);
		free((char *)in.a[i].step);
		free((char *)in.a[i].item);
		free(in.a[i].key);
	}
	free(in.a);
	for (size_t i = 0; i < in.nsteps; i++)
		free(in.steps[i]);
	free(in.steps);
	for (size_t i = 0; i < in.nitems; i++)
		free(in.items[i]);
	free(in.items);
	ckpt_view_destroy(v);
	free(real);
	return rc < 0 ? 1 : 0;
}
