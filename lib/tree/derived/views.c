/*
 * views.c - STEP/.views/NAME/: a committed step shown as another model
 * family's folder by a view recipe (lib/format/recipe.h, docs/recipes.md).
 *
 * The recipes are read once per view, on the first .views lookup, from the
 * folders of opts.recipe_dirs and then the shipped ones (next to the
 * binary: ../share/ckptfs/recipes, or ../recipes in a build tree; then the
 * install prefix's share/ckptfs/recipes); a name
 * met twice keeps its first recipe (a user's own overrides a shipped one).
 * STEP/.views/ is made on lookup (hidden, like .ckptfs/) with one folder per
 * recipe that matches the step's arrays; one that does not is logged with
 * the rule that failed.  A folder holds model.safetensors (or
 * model-0000N-of-0000M.safetensors and model.safetensors.index.json past
 * opts.st_shard_bytes) and the recipe's literal files.
 *
 * A target tensor's bytes are made on read: for each part of its index map
 * the bounding box of the source elements a range needs is read through
 * the shared decoded-chunk cache (ckpt_array_read), gathered, then the
 * element ops run.  Memory per read is bounded by VIEW_BATCH elements and
 * a box at most a few times that, in per-thread buffers kept between
 * reads (tlsbuf.h); decoded chunks live in the cache only,
 * so a scan-stacked chunk that spans all layers is decoded once while the
 * cache holds it, whichever layer's tensor is read.
 *
 * State of a view folder: built whole (plan, layouts, file nodes) before
 * the .views/ node is published, never changed afterwards, released at
 * view destroy.  The recipe set: NULL until loaded, then set once
 * (compare-and-swap) and never changed.
 */
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "orbax.h"
#include "recipe.h"
#include "sysio.h"
#include "tlsbuf.h"
#include "tree_int.h"

/* Target elements made per step of a read. */
#define VIEW_BATCH 524288u
/* Default shard size of a view folder (as X.safetensors.d/: 5 GB). */
#define VIEW_SHARD_BYTES_DEFAULT 5000000000ull

struct recipe_set {
	ckpt_recipe **r;
	size_t n;
};

/* One view folder: the plan and what its reads need. */
struct vset {
	ckpt_rplan *plan;
	ckpt_array **arrs; /* source input i */
	size_t narrs;
	ckpt_st_layout *st; /* model.safetensors, or */
	ckpt_st_sharded *sts; /* the shards */
	size_t *order; /* layout input i is plan tensor order[i] */
	/* file order runs: the tensors of one source array in a row; for
	 * layout input i, the first input of its run and of the next run
	 * (n when none), and whether the run's read-ahead was done */
	size_t *run_start, *next_run;
	atomic_uchar *ahead;
	/* per run (its first input): tensor reads in flight; the first read of
	 * a run waits on run_done for the run before (vfile_tensor_read) */
	unsigned *active;
	pthread_mutex_t run_mu; /* active (CKPT_RANK_VRUN) */
	pthread_cond_t run_done;
};

/* N_DIR of a view folder */
struct vdir_node {
	struct dir_node d;
	struct vset *vs;
};

/* N_VIEWFILE */
struct vfile_node {
	struct node n;
	struct vset *vs;
	const ckpt_st_layout *st;
	uint64_t size;
	atomic_uint seen_changes; /* sum of the source arrays' change counts at the last open */
	atomic_size_t open_rr; /* the source array the next open starts checking at */
};

static struct vfile_node *to_vfile(struct node *n)
{
	assert(n->kind == N_VIEWFILE);
	return container_of(n, struct vfile_node, n);
}

/* ---- the recipe set -------------------------------------------------------- */

static int have_recipe(const struct recipe_set *s, const char *name)
{
	for (size_t i = 0; i < s->n; i++)
		if (!strcmp(ckpt_recipe_name(s->r[i]), name))
			return 1;
	return 0;
}

static int load_file(const char *path, ckpt_recipe **out)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = fopen(path, "rb");
	if (!f)
		return -errno;
	buf = malloc(CKPT_RECIPE_MAX_BYTES + 1);
	if (buf)
		len = fread(buf, 1, CKPT_RECIPE_MAX_BYTES + 1, f);
	fclose(f);
	if (!buf)
		return -ENOMEM;
	char why[256] = "";
	int rc = ckpt_recipe_parse(buf, len, out, why, sizeof(why));
	free(buf);
	if (rc < 0)
		ckpt_log(CKPT_LOG_WARN, "recipe %s: %s", path, why);
	return rc;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static void load_dir(struct recipe_set *s, const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		return;
	char **names = NULL;
	size_t n = 0, cap = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		size_t l = strlen(e->d_name);
		if (e->d_name[0] == '.' || l < 6 || strcmp(e->d_name + l - 5, ".json"))
			continue;
		if (n == cap) {
			size_t nc = cap ? cap * 2 : 16;
			char **x = realloc(names, nc * sizeof(*x));
			if (!x)
				break;
			names = x;
			cap = nc;
		}
		if (!(names[n] = strdup(e->d_name)))
			break;
		n++;
	}
	closedir(d);
	qsort(names, n, sizeof(*names), cmp_str);
	for (size_t i = 0; i < n; i++) {
		char path[PATH_MAX];
		ckpt_recipe *r;
		snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
		if (load_file(path, &r) == 0) {
			ckpt_recipe **x = NULL;
			if (have_recipe(s, ckpt_recipe_name(r))) {
				ckpt_log(CKPT_LOG_INFO, "recipe %s: %s is already known: skipped", path,
					 ckpt_recipe_name(r));
			} else if ((x = realloc(s->r, (s->n + 1) * sizeof(*x)))) {
				s->r = x;
				s->r[s->n++] = r;
				r = NULL;
			}
			ckpt_recipe_free(r);
		}
		free(names[i]);
	}
	free(names);
}

static struct recipe_set *recipes_of(ckpt_view *v)
{
	struct recipe_set *s = atomic_load(&v->recipes);
	if (s)
		return s;
	s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	if (v->opts.recipe_dirs) {
		char *copy = strdup(v->opts.recipe_dirs), *save = NULL;
		for (char *p = copy ? strtok_r(copy, ":", &save) : NULL; p; p = strtok_r(NULL, ":", &save))
			load_dir(s, p);
		free(copy);
	}
	if (!v->opts.no_shipped_recipes) {
		char exe[PATH_MAX];
		ssize_t k = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
		if (k > 0) {
			exe[k] = 0;
			char *slash = strrchr(exe, '/');
			if (slash) {
				*slash = 0;
				char path[PATH_MAX + 32];
				snprintf(path, sizeof(path), "%s/../share/ckptfs/recipes", exe);
				load_dir(s, path);
				snprintf(path, sizeof(path), "%s/../recipes", exe);
				load_dir(s, path);
			}
		}
#ifdef CKPT_RECIPES_DIR
		load_dir(s, CKPT_RECIPES_DIR);
#endif
	}
	struct recipe_set *none = NULL;
	if (!atomic_compare_exchange_strong(&v->recipes, &none, s)) {
		for (size_t i = 0; i < s->n; i++)
			ckpt_recipe_free(s->r[i]);
		free(s->r);
		free(s);
		s = none;
	}
	return s;
}

/* The recipe named `name` (views_import.c), or NULL. */
const ckpt_recipe *ckpt_views_recipe(ckpt_view *v, const char *name)
{
	struct recipe_set *s = recipes_of(v);
	for (size_t i = 0; s && i < s->n; i++)
		if (!strcmp(ckpt_recipe_name(s->r[i]), name))
			return s->r[i];
	return NULL;
}

void ckpt_views_destroy(ckpt_view *v)
{
	struct recipe_set *s = atomic_load(&v->recipes);
	if (!s)
		return;
	for (size_t i = 0; i < s->n; i++)
		ckpt_recipe_free(s->r[i]);
	free(s->r);
	free(s);
}

/* ---- the arrays of a step -------------------------------------------------- */

struct srcs {
	ckpt_recipe_src *s;
	ckpt_array **arrs;
	char **names;
	size_t n, cap;
};

static int walk(struct node *dir, const char *prefix, struct srcs *c, int depth)
{
	if (depth > CKPT_ORBAX_MAX_DEPTH)
		return 0;
	struct dir_node *dn = to_dir(dir);
	for (size_t i = 0; i < dn->nkids; i++) {
		struct node *k = dn->kids[i];
		char name[VIEW_KEYPATH_MAX], key[NAME_MAX + 1];
		size_t stem;
		/* the key as Orbax names it: a '/' in a key (FLAT checkpoints) is '/' here,
		 * not the %2F of the node name */
		const char *kn = ckpt_orbax_key_unescape(k->name, key, sizeof(key)) > 0 ? key : k->name;
		if (k->kind == N_ARRAY && ckpt_node_ends_with(kn, ".npy", &stem)) {
			int w = snprintf(name, sizeof(name), "%s%s%.*s", prefix, *prefix ? "." : "",
					 (int)stem, kn);
			if (w < 0 || (size_t)w >= sizeof(name))
				continue;
			if (c->n == c->cap) {
				size_t cap = c->cap ? c->cap * 2 : 64;
				ckpt_recipe_src *s = realloc(c->s, cap * sizeof(*s));
				if (s)
					c->s = s;
				ckpt_array **a = realloc(c->arrs, cap * sizeof(*a));
				if (a)
					c->arrs = a;
				char **nm = realloc(c->names, cap * sizeof(*nm));
				if (nm)
					c->names = nm;
				if (!s || !a || !nm)
					return -ENOMEM;
				c->cap = cap;
			}
			ckpt_array *arr = to_array(k)->ar->arr;
			const ckpt_array_meta *m = ckpt_array_meta_of(arr);
			if (!(c->names[c->n] = strdup(name)))
				return -ENOMEM;
			c->s[c->n] = (ckpt_recipe_src){ c->names[c->n], m->dtype, m->rank, m->shape };
			c->arrs[c->n] = arr;
			c->n++;
		} else if (k->kind == N_DIR) {
			int w = snprintf(name, sizeof(name), "%s%s%s", prefix, *prefix ? "." : "", kn);
			if (w < 0 || (size_t)w >= sizeof(name))
				continue;
			int rc = walk(k, name, c, depth + 1);
			if (rc < 0)
				return rc;
		}
	}
	return 0;
}

static void srcs_free(struct srcs *c)
{
	for (size_t i = 0; i < c->n; i++)
		free(c->names[i]);
	free(c->names);
	free(c->s);
	free(c->arrs);
}

/* ---- reading target tensors ------------------------------------------------ */

/* One read_part through the cached chunks of its box. */
struct chunk_gather {
	const ckpt_rtensor *t;
	size_t part;
	uint64_t a, b;
	uint8_t *dst;
};

/* ckpt_array_visit's callback: the part's elements from this chunk,
 * gathered straight from the cached chunk.  -ENOTSUP when the chunk cuts
 * the part where its elements are not a box of the target: the caller
 * then copies the box out and gathers every element of [a, b), writing
 * again, with the same bytes, those that earlier chunks wrote. */
static int gather_chunk(void *arg, const void *data, const ckpt_region *chunk)
{
	struct chunk_gather *cg = arg;
	ckpt_rpart sub;
	int rc = ckpt_rtensor_clip(cg->t, cg->part, chunk, &sub);
	if (rc <= 0)
		return rc;
	ckpt_rpart_gather(cg->t, &sub, chunk, data, cg->a, cg->b, cg->dst);
	return 0;
}

/* Elements [a, b) of tensor t's part `part` into dst (src_dtype elements,
 * dst[0] is element a): the box read through the cache, then gathered.
 * A box much larger than the range is split first. */
static int read_part(struct vset *vs, const ckpt_rtensor *t, size_t part, uint64_t a, uint64_t b,
		     uint8_t *dst)
{
	ckpt_region box;
	unsigned is0 = ckpt_dtype_get(t->src_dtype)->itemsize;
	if (ckpt_rtensor_region(t, part, &box)) { /* a region of the source: its stream, no gather */
		ssize_t r =
			ckpt_array_read(vs->arrs[t->parts[part].input], &box, a * is0, (b - a) * is0, dst);
		return r < 0 ? (int)r : (uint64_t)r == (b - a) * is0 ? 0 : -EIO;
	}
	if (!ckpt_rtensor_box(t, part, a, b, &box))
		return 0;
	uint64_t count;
	if (ckpt_region_count(&box, &count) < 0)
		return -EOVERFLOW;
	unsigned is = ckpt_dtype_get(t->src_dtype)->itemsize;
	if (count > 4 * (b - a) + 65536 && b - a > 1) {
		uint64_t mid = a + (b - a) / 2;
		int rc = read_part(vs, t, part, a, mid, dst);
		return rc < 0 ? rc : read_part(vs, t, part, mid, b, dst + (mid - a) * is);
	}
	ckpt_array *arr = vs->arrs[t->parts[part].input];
	struct chunk_gather cg = { t, part, a, b, dst };
	int vr = ckpt_array_visit(arr, &box, gather_chunk, &cg);
	if (vr != -ENOTSUP)
		return vr;
	uint8_t *buf = ckpt_tls_buf(CKPT_TLS_VIEW_BOX, count ? count * is : 1);
	if (!buf)
		return -ENOMEM;
	ssize_t r = ckpt_array_read(arr, &box, 0, count * is, buf);
	if (r >= 0 && (uint64_t)r != count * is)
		r = -EIO;
	if (r >= 0)
		ckpt_rtensor_gather(t, part, &box, buf, a, b, dst);
	return r < 0 ? (int)r : 0;
}

/* 1 when t's parts cover all of it (no pad). */
static int covered(const ckpt_rtensor *t)
{
	uint64_t sum = 0;
	for (size_t p = 0; p < t->nparts; p++) {
		uint64_t c = 1;
		for (int d = 0; d < t->rank; d++)
			c *= t->parts[p].hi[d] - t->parts[p].lo[d];
		sum += c;
	}
	return sum == ckpt_rtensor_count(t);
}

/* Bytes [off, off+len) of target tensor ti's data. */
static ssize_t tensor_read(struct vset *vs, size_t ti, uint64_t off, size_t len, uint8_t *dst)
{
	const ckpt_rtensor *t = ckpt_rplan_tensor(vs->plan, ti);
	unsigned os = ckpt_dtype_get(t->dtype)->itemsize, is = ckpt_dtype_get(t->src_dtype)->itemsize;
	uint64_t total = ckpt_rtensor_count(t) * os;
	if (off >= total)
		return 0;
	if (len > total - off)
		len = (size_t)(total - off);
	uint64_t want = (off + len + os - 1) / os - off / os;
	size_t batch = want < VIEW_BATCH ? (size_t)want : VIEW_BATCH;
	uint8_t *gath = ckpt_tls_buf(CKPT_TLS_VIEW_GATHER, batch * is);
	uint8_t *conv = t->elem ? ckpt_tls_buf(CKPT_TLS_VIEW_CONVERT, batch * os) : NULL;
	int rc = gath && (!t->elem || conv) ? 0 : -ENOMEM;
	size_t done = 0;
	while (rc == 0 && done < len) {
		uint64_t e0 = (off + done) / os, skip = (off + done) % os;
		uint64_t e1 = (off + len + os - 1) / os;
		if (e1 - e0 > batch)
			e1 = e0 + batch;
		size_t cnt = (size_t)(e1 - e0);
		/* whole elements of a plain copy go straight to dst */
		int direct = !t->elem && skip == 0 && cnt * os <= len - done;
		uint8_t *to = direct ? dst + done : gath;
		if (!covered(t))
			memset(to, 0, cnt * is); /* pad: zeros outside every part */
		for (size_t p = 0; p < t->nparts && rc == 0; p++)
			rc = read_part(vs, t, p, e0, e1, to);
		if (rc < 0)
			break;
		if (direct) {
			done += cnt * os;
			continue;
		}
		const uint8_t *res = gath;
		if (t->elem && skip == 0 && cnt * os <= len - done) {
			/* whole converted elements: straight into dst */
			if ((rc = ckpt_rtensor_convert(t, gath, cnt, dst + done)) == 0)
				done += cnt * os;
			continue;
		}
		if (t->elem) {
			rc = ckpt_rtensor_convert(t, gath, cnt, conv);
			res = conv;
		}
		size_t take = cnt * os - (size_t)skip;
		if (take > len - done)
			take = len - done;
		memcpy(dst + done, res + skip, take);
		done += take;
	}
	return rc < 0 ? rc : (ssize_t)done;
}

/* ---- view files ------------------------------------------------------------ */

static void vfile_attr(ckpt_view *v, struct node *n, ckpt_attr *a)
{
	(void)v;
	a->mode = 0444;
	a->size = to_vfile(n)->size;
}

/* The source array of tensor ti's first part (NULL: no part). */
static ckpt_array *first_source(const struct vset *vs, size_t ti)
{
	const ckpt_rtensor *t = ckpt_rplan_tensor(vs->plan, ti);
	return t->nparts ? vs->arrs[t->parts[0].input] : NULL;
}

/* A read of layout input i (ending at byte src_end of the tensor), the
 * second or later tensor of its run (or a run of one, a quarter in): the
 * run before is done, and the source of the next run is queued for
 * decoding while this run's tensors are still read, when all its chunks
 * fit in the cache beside this run's (a quarter of the budget kept
 * free).  Else the first read of a run waits for all the chunks its first
 * rows span (a transposed kernel's rows span every chunk of a sharded
 * array).  The run before goes to the cold end of the cache first, so
 * that making room evicts it, not chunks queued ahead and not read yet;
 * this late into the run, the kernel's read-ahead has left it.  Once per
 * run. */
static void read_next_source(struct vset *vs, size_t i, uint64_t src_end)
{
	size_t r = vs->run_start[i], nx = vs->next_run[i];
	size_t n = ckpt_rplan_count(vs->plan);
	if (atomic_load(&vs->ahead[r]))
		return;
	if (i == r) {
		const ckpt_rtensor *t = ckpt_rplan_tensor(vs->plan, vs->order[i]);
		uint64_t bytes = ckpt_rtensor_count(t) * ckpt_dtype_get(t->dtype)->itemsize;
		if (nx != i + 1 || src_end < bytes / 4)
			return;
	}
	if (atomic_exchange(&vs->ahead[r], 1))
		return;
	ckpt_array *cur = first_source(vs, vs->order[i]);
	if (!cur)
		return;
	if (r > 0) {
		ckpt_array *prev = first_source(vs, vs->order[r - 1]);
		if (prev && prev != cur)
			ckpt_array_cool(prev);
	}
	if (nx >= n)
		return;
	ckpt_array *next = first_source(vs, vs->order[nx]);
	const ckpt_rtensor *t = ckpt_rplan_tensor(vs->plan, vs->order[nx]);
	if (!next || next == cur)
		return;
	uint64_t budget = ckpt_array_cache_budget(cur), held = ckpt_array_cached_bytes(cur);
	uint64_t need = ckpt_array_cached_bytes(next);
	uint64_t count = ckpt_rtensor_count(t), first = count < VIEW_BATCH ? count : VIEW_BATCH;
	ckpt_region box;
	if (held + need + budget / 4 > budget || !ckpt_rtensor_box(t, 0, 0, first, &box))
		return;
	ckpt_array_prefetch_box(next, &box, need);
}

/* How long the first read of a run waits at most for the run before. */
#define RUN_WAIT_NS (200 * 1000000L)

/* Tensor reads in flight on run r (its first input): +1 / -1. */
static void run_enter(struct vset *vs, size_t r, int d)
{
	ckpt_lock(&vs->run_mu, CKPT_RANK_VRUN);
	vs->active[r] += (unsigned)d;
	if (d < 0 && vs->active[r] == 0)
		pthread_cond_broadcast(&vs->run_done);
	ckpt_unlock(&vs->run_mu, CKPT_RANK_VRUN);
}

/* The first tensor of a run waits (at most RUN_WAIT_NS) for the reads of
 * the run before that other threads still serve, when the cache cannot
 * hold both runs' sources: the kernel's read-ahead asks for the next bytes
 * while the last ones are served, and this run's first decodes make room by
 * evicting the run before's chunks, which a read of its last rows still
 * needs (every chunk of a scan-stacked kernel holds a piece of its last
 * layer: all of them decoded again, and the chunks of this run they then
 * evict, once more). */
static void wait_run_before(struct vset *vs, size_t r)
{
	size_t pr = vs->run_start[r - 1];
	ckpt_array *prev = first_source(vs, vs->order[pr]), *cur = first_source(vs, vs->order[r]);
	if (!prev || !cur || prev == cur ||
	    ckpt_array_cached_bytes(prev) + ckpt_array_cached_bytes(cur) <= ckpt_array_cache_budget(cur))
		return;
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_nsec += RUN_WAIT_NS;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	ckpt_lock(&vs->run_mu, CKPT_RANK_VRUN);
	while (vs->active[pr] > 0 && pthread_cond_timedwait(&vs->run_done, &vs->run_mu, &until) == 0)
		;
	ckpt_unlock(&vs->run_mu, CKPT_RANK_VRUN);
}

/* ckpt_st_layout_read's tensor reads: target tensor `input` of the file. */
static ssize_t vfile_tensor_read(void *arg, size_t input, uint64_t src_off, size_t len, uint8_t *to)
{
	struct vset *vs = arg;
	size_t r = vs->run_start[input];
	if (input == r && r > 0)
		wait_run_before(vs, r);
	run_enter(vs, r, 1);
	read_next_source(vs, input, src_off + len);
	ssize_t n = tensor_read(vs, vs->order[input], src_off, len, to);
	run_enter(vs, r, -1);
	return n;
}

static ssize_t vfile_read(ckpt_view *v, struct node *node, uint64_t off, size_t len, void *dst8)
{
	(void)v;
	struct vfile_node *n = to_vfile(node);
	return ckpt_st_layout_read(n->st, off, len, dst8, vfile_tensor_read, n->vs);
}

/* As the safetensors files of companions: every open revalidates the
 * source arrays (a bounded number of store stats, round-robin), and the
 * kernel's cached pages go when what they came from changed. */
#define VIEW_OPEN_CHECK_BUDGET 64

static int vfile_open(ckpt_view *v, struct node *node)
{
	(void)v;
	struct vfile_node *n = to_vfile(node);
	size_t count = n->vs->narrs;
	if (count == 0)
		return 0;
	size_t first = atomic_fetch_add(&n->open_rr, 1) % count;
	int budget = VIEW_OPEN_CHECK_BUDGET, spent_all = 0;
	unsigned sum = 0;
	for (size_t k = 0; k < count; k++) {
		size_t i = (first + k) % count;
		int none = 0;
		sum += ckpt_array_open_check(n->vs->arrs[i], spent_all ? &none : &budget);
		if (budget <= 0 && !spent_all) {
			spent_all = 1;
			atomic_store(&n->open_rr, i + 1);
		}
	}
	return atomic_exchange(&n->seen_changes, sum) != sum;
}

static const struct node_ops vfile_ops = {
	.kind = N_VIEWFILE,
	.size = sizeof(struct vfile_node),
	.open = vfile_open,
	.getattr = vfile_attr,
	.read = vfile_read,
};

static void vset_free(struct vset *vs)
{
	if (!vs)
		return;
	ckpt_rplan_free(vs->plan);
	free(vs->arrs);
	free(vs->order);
	free(vs->run_start);
	free(vs->next_run);
	free(vs->ahead);
	free(vs->active);
	pthread_mutex_destroy(&vs->run_mu);
	pthread_cond_destroy(&vs->run_done);
	ckpt_st_layout_destroy(vs->st);
	ckpt_st_sharded_destroy(vs->sts);
	free(vs);
}

static void dir_attr(ckpt_view *v, struct node *n, ckpt_attr *a)
{
	(void)v;
	(void)n;
	a->is_dir = 1;
	a->mode = 0555;
	a->nlink = 2;
}

static void vdir_destroy(ckpt_view *v, struct node *n)
{
	(void)v;
	vset_free(container_of(to_dir(n), struct vdir_node, d)->vs);
}

static const struct node_ops vdir_ops = {
	.kind = N_DIR,
	.size = sizeof(struct vdir_node),
	.getattr = dir_attr,
	.readdir = ckpt_node_readdir_kids,
	.destroy = vdir_destroy,
};

static const struct node_ops views_ops = {
	.kind = N_DIR,
	.size = sizeof(struct dir_node),
	.getattr = dir_attr,
	.readdir = ckpt_node_readdir_kids,
};

static int add_content(ckpt_view *v, struct node *dir, const char *name, const char *text, size_t len)
{
	struct node *f = ckpt_node_new(v, &ckpt_file_ops, name, dir);
	if (!f)
		return -ENOMEM;
	struct file_node *fn = to_file(f);
	fn->content = malloc(len + 1);
	if (!fn->content)
		return -ENOMEM;
	memcpy(fn->content, text, len);
	fn->content[len] = 0;
	fn->size = len;
	return ckpt_node_add_kid(dir, f);
}

static int add_vfile(ckpt_view *v, struct node *dir, struct vset *vs, const char *name,
		     const ckpt_st_layout *st)
{
	struct node *f = ckpt_node_new(v, &vfile_ops, name, dir);
	if (!f)
		return -ENOMEM;
	struct vfile_node *vf = to_vfile(f);
	vf->vs = vs;
	vf->st = st;
	vf->size = ckpt_st_layout_file_size(st);
	return ckpt_node_add_kid(dir, f);
}

/* Plan tensors by their first source, then name. */
static int cmp_source_order(const void *a, const void *b, void *plan)
{
	const ckpt_rtensor *x = ckpt_rplan_tensor(plan, *(const size_t *)a);
	const ckpt_rtensor *y = ckpt_rplan_tensor(plan, *(const size_t *)b);
	size_t sx = x->nparts ? x->parts[0].input : (size_t)-1,
	       sy = y->nparts ? y->parts[0].input : (size_t)-1;
	if (sx != sy)
		return sx < sy ? -1 : 1;
	return strcmp(x->name, y->name);
}

/* The folder of plan p in views (takes p and arrs). */
static int make_folder(ckpt_view *v, struct node *views, const char *name, ckpt_rplan *p, ckpt_array **arrs,
		       size_t narrs)
{
	struct vset *vs = calloc(1, sizeof(*vs));
	if (!vs) {
		ckpt_rplan_free(p);
		free(arrs);
		return -ENOMEM;
	}
	pthread_mutex_init(&vs->run_mu, NULL);
	pthread_cond_init(&vs->run_done, NULL);
	vs->plan = p;
	vs->arrs = arrs;
	vs->narrs = narrs;
	struct node *dn = ckpt_node_new(v, &vdir_ops, name, views);
	if (!dn) {
		vset_free(vs);
		return -ENOMEM;
	}
	container_of(to_dir(dn), struct vdir_node, d)->vs = vs;
	size_t n = ckpt_rplan_count(p);
	ckpt_st_tensor *tl = calloc(n ? n : 1, sizeof(*tl));
	vs->order = malloc((n ? n : 1) * sizeof(*vs->order));
	if (!tl || !vs->order) {
		free(tl);
		return -ENOMEM;
	}
	/* file order: the tensors of one source array together (all layers of
	 * a scan-stacked kernel in a row: its chunks are decoded once while
	 * the cache holds them), by name within */
	for (size_t i = 0; i < n; i++)
		vs->order[i] = i;
	qsort_r(vs->order, n, sizeof(*vs->order), cmp_source_order, p);
	vs->run_start = malloc((n ? n : 1) * sizeof(size_t));
	vs->next_run = malloc((n ? n : 1) * sizeof(size_t));
	vs->ahead = calloc(n ? n : 1, sizeof(atomic_uchar));
	vs->active = calloc(n ? n : 1, sizeof(unsigned));
	if (!vs->run_start || !vs->next_run || !vs->ahead || !vs->active) {
		free(tl);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++)
		vs->run_start[i] = i && first_source(vs, vs->order[i]) == first_source(vs, vs->order[i - 1])
					   ? vs->run_start[i - 1]
					   : i;
	for (size_t i = n; i-- > 0;)
		vs->next_run[i] =
			i + 1 < n && vs->run_start[i + 1] == vs->run_start[i] ? vs->next_run[i + 1] : i + 1;
	uint64_t total = 0;
	for (size_t i = 0; i < n; i++) {
		const ckpt_rtensor *t = ckpt_rplan_tensor(p, vs->order[i]);
		tl[i] = (ckpt_st_tensor){ t->name, t->dtype, t->rank, t->shape };
		total += ckpt_rtensor_count(t) * ckpt_dtype_get(t->dtype)->itemsize;
	}
	uint64_t limit = v->opts.st_shard_bytes ? v->opts.st_shard_bytes : VIEW_SHARD_BYTES_DEFAULT;
	ckpt_st_meta meta[1] = { { "format", "pt" } };
	int rc;
	if (total <= limit) {
		rc = ckpt_st_layout_create(tl, n, meta, 1, CKPT_ST_CALLER_ORDER, &vs->st);
		if (rc == 0)
			rc = add_vfile(v, dn, vs, "model.safetensors", vs->st);
	} else {
		rc = ckpt_st_sharded_create(tl, n, NULL, 0, limit, CKPT_ST_CALLER_ORDER, &vs->sts);
		for (size_t i = 0; rc == 0 && i < ckpt_st_sharded_count(vs->sts); i++)
			rc = add_vfile(v, dn, vs, ckpt_st_sharded_name(vs->sts, i),
				       ckpt_st_sharded_layout(vs->sts, i));
		if (rc == 0) {
			size_t len;
			const char *idx = ckpt_st_sharded_index(vs->sts, &len);
			rc = add_content(v, dn, CKPT_ST_INDEX_NAME, idx, len);
		}
	}
	free(tl);
	for (size_t i = 0; rc == 0 && i < ckpt_rplan_nfiles(p); i++) {
		const char *content;
		size_t len;
		const char *fname = ckpt_rplan_file(p, i, &content, &len);
		rc = add_content(v, dn, fname, content, len);
	}
	if (rc == 0)
		rc = ckpt_node_add_kid(views, dn);
	/* a source chunk over the cache's unit cap (a quarter of the budget)
	 * is streamed, not kept: every read of a tensor that needs it decodes
	 * it again; say so once per folder */
	uint64_t budget = v->opts.ctx.cache_bytes ? v->opts.ctx.cache_bytes : (256ull << 20), worst = 0;
	const char *wname = NULL;
	for (size_t i = 0; rc == 0 && i < n; i++) {
		const ckpt_rtensor *t = ckpt_rplan_tensor(p, i);
		for (size_t k = 0; k < t->nparts; k++) {
			const ckpt_array_meta *m = ckpt_array_meta_of(arrs[t->parts[k].input]);
			if (m->unit_bytes > worst) {
				worst = m->unit_bytes;
				wname = t->name;
			}
		}
	}
	if (wname && worst > budget / 4)
		ckpt_log(CKPT_LOG_WARN,
			 "%s: source chunks of %llu MiB (for %s) exceed a quarter of cache_size: they are "
			 "decoded "
			 "again for every read that needs them; mount with -o cache_size=%lluM or more",
			 name, (unsigned long long)(worst >> 20), wname,
			 (unsigned long long)((worst * 4) >> 20) + 1);
	return rc;
}

/* 1 when dir is a step that has a .views/ (a committed step of a root, or
 * the root of a step mount). */
static int views_step(ckpt_view *v, struct node *dir)
{
	if (!strcmp(v->kind, "root"))
		return dir->ino != CKPT_ROOT_INO && dir->parent == CKPT_ROOT_INO &&
		       strcmp(dir->name, ".ckptfs") && dir->kind == N_DIR;
	/* a one-step mount, or one item (a released model: gemma's FLAT checkpoints) */
	return (!strcmp(v->kind, "step") || !strcmp(v->kind, "item")) && dir->ino == CKPT_ROOT_INO;
}

int ckpt_views_lookup(ckpt_view *v, struct node *dir, const char *name, struct node **out)
{
	if (strcmp(name, CKPT_VIEWS_DIR) || !views_step(v, dir))
		return -ENOENT;
	int rc = node_load(v, dir);
	if (rc < 0)
		return rc;
	struct recipe_set *rs = recipes_of(v);
	if (!rs)
		return -ENOMEM;
	struct srcs c = { 0 };
	rc = walk(dir, "", &c, 0);
	struct node *views = rc == 0 ? ckpt_node_new(v, &views_ops, CKPT_VIEWS_DIR, dir) : NULL;
	if (rc == 0 && !views)
		rc = -ENOMEM;
	for (size_t i = 0; rc == 0 && i < rs->n; i++) {
		ckpt_rplan *p;
		char why[512] = "";
		int prc = ckpt_recipe_plan(rs->r[i], c.s, c.n, &p, why, sizeof(why));
		if (prc == -ENOMEM) {
			rc = prc;
		} else if (prc < 0) {
			ckpt_log(CKPT_LOG_INFO, "%s/%s/%s: no view: %s",
				 dir->ino == CKPT_ROOT_INO ? "." : dir->name, CKPT_VIEWS_DIR,
				 ckpt_recipe_name(rs->r[i]), why);
		} else {
			ckpt_array **arrs = malloc((c.n ? c.n : 1) * sizeof(*arrs));
			if (!arrs) {
				ckpt_rplan_free(p);
				rc = -ENOMEM;
				break;
			}
			memcpy(arrs, c.arrs, c.n * sizeof(*arrs));
			rc = make_folder(v, views, ckpt_recipe_name(rs->r[i]), p, arrs, c.n);
		}
	}
	srcs_free(&c);
	if (rc < 0)
		return rc; /* the nodes made stay in the table until the view goes */
	views->hidden = 1;
	*out = views;
	return 0;
}

/* ---- ckptfs info --recipe -------------------------------------------------- */

int ckpt_view_recipe_table(ckpt_view *v, ckpt_ino step, const char *recipe, char **out, char **why_out)
{
	*out = NULL;
	*why_out = NULL;
	struct node *dir = ckpt_node_at(v, step);
	if (!dir || !node_has_kids(dir))
		return -ENOTDIR;
	int rc = node_load(v, dir);
	if (rc < 0)
		return rc;
	ckpt_recipe *own = NULL;
	const ckpt_recipe *r = NULL;
	if (strchr(recipe, '/')) {
		if ((rc = load_file(recipe, &own)) < 0)
			return rc;
		r = own;
	} else {
		struct recipe_set *rs = recipes_of(v);
		for (size_t i = 0; rs && i < rs->n && !r; i++)
			if (!strcmp(ckpt_recipe_name(rs->r[i]), recipe))
				r = rs->r[i];
		if (!r)
			return -ENOENT;
	}
	struct srcs c = { 0 };
	rc = walk(dir, "", &c, 0); /* a committed step's kids never change once loaded */
	ckpt_rplan *p = NULL;
	char why[512] = "";
	if (rc == 0)
		rc = ckpt_recipe_plan(r, c.s, c.n, &p, why, sizeof(why));
	if (rc == 0 && !(*out = ckpt_rplan_table(p)))
		rc = -ENOMEM;
	if (rc < 0 && why[0])
		*why_out = strdup(why);
	ckpt_rplan_free(p);
	srcs_free(&c);
	ckpt_recipe_free(own);
	return rc;
}
