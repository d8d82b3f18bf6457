/*
 * recipe_inverse.c - view recipes the other way (recipe.h, "the other
 * way"): from the tensors of a target folder (names, dtypes, shapes) and its
 * config.json back to the source arrays a recipe reads, checked by planning
 * the recipe forward over those arrays; the scatter of a target tensor into
 * its source box, and the inverse of the element ops.
 *
 * Pure, like recipe.c: no I/O, no threads; config.json is outside bytes
 * (fuzzed with the recipe: tests/fuzz/fuzz_recipe_inverse.c).
 */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "recipe_int.h"

#define MAX_SRCS 65536 /* candidate source arrays */
#define MAX_COMBOS 4096 /* capture bindings per rule */
#define NAME_ARENA 128 /* names bound from config.json or inferred */

struct ckpt_rinverse {
	ckpt_recipe_src *src; /* names, dtypes and shapes owned here */
	uint64_t (*shape)[CKPT_RECIPE_MAX_RANK];
	size_t nsrc;
	ckpt_rplan *plan;
	size_t *target_of; /* plan tensor -> index of the target given */
	size_t *dup_of; /* plan tensor -> an earlier plan tensor with the same parts, or SIZE_MAX */
};

static void say(char *why, size_t whylen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void say(char *why, size_t whylen, const char *fmt, ...)
{
	if (!why || !whylen)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, whylen, fmt, ap);
	va_end(ap);
}

static int is_ident(const char *s, size_t n)
{
	if (!n || !(isalpha((unsigned char)s[0]) || s[0] == '_'))
		return 0;
	for (size_t i = 1; i < n; i++)
		if (!isalnum((unsigned char)s[i]) && s[i] != '_')
			return 0;
	return 1;
}

/* ---- which recipes invert ------------------------------------------------- */

int ckpt_recipe_invertible(const ckpt_recipe *r, char *why, size_t whylen)
{
	for (int i = 0; i < r->nrules; i++) {
		const struct rule *ru = &r->rules[i];
		if (ru->alias || ru->absent) /* an absent rule is a guard that makes nothing */
			continue;
		for (const char *p = strchr(ru->name, '{'); p; p = strchr(p + 1, '{')) {
			const char *q = strchr(p, '}');
			if (!q || !is_ident(p + 1, (size_t)(q - p - 1))) {
				say(why, whylen,
				    "%s: the name's {%.*s} cannot be read back from a tensor name (only "
				    "{var})",
				    ru->name, q ? (int)(q - p - 1) : 0, p + 1);
				return -EOPNOTSUPP;
			}
		}
		if (!ru->nshape) {
			say(why, whylen, "%s: a rule without \"shape\" cannot be imported", ru->name);
			return -EOPNOTSUPP;
		}
		for (int k = 0; k < ru->nops; k++) {
			const struct rop *o = &ru->ops[k];
			if (o->kind == OP_CAST) {
				say(why, whylen,
				    "%s: ops[%d] (cast): the source dtype cannot be told from the target's",
				    ru->name, k);
				return -EOPNOTSUPP;
			}
			if (o->kind == OP_AFFINE && o->nargs > 1) {
				double b;
				const char *w;
				struct env e = { .n = 0 };
				if (ckpt_rx_eval(o->args[1], strlen(o->args[1]), &e, &b, &w) < 0 || b != 0) {
					say(why, whylen,
					    "%s: ops[%d] (affine with a bias): its inverse has no bound "
					    "relative "
					    "to the value",
					    ru->name, k);
					return -EOPNOTSUPP;
				}
			}
		}
	}
	return 0;
}

/* ---- solving for the names of the source shapes --------------------------- */

struct solver {
	const ckpt_recipe *r;
	const ckpt_recipe_target *t;
	size_t nt;
	struct env env;
	char names[NAME_ARENA][64];
	int nnames;
};

static const char *keep_name(struct solver *s, const char *n, size_t len)
{
	for (int i = 0; i < s->nnames; i++)
		if (strlen(s->names[i]) == len && !memcmp(s->names[i], n, len))
			return s->names[i];
	if (s->nnames == NAME_ARENA || len >= 64)
		return NULL;
	memcpy(s->names[s->nnames], n, len);
	s->names[s->nnames][len] = 0;
	return s->names[s->nnames++];
}

static int bound(const struct env *e, const char *n, size_t len)
{
	double v;
	return ckpt_rx_env_get(e, n, len, &v);
}

/* Bind name = v unless it is bound (a recipe var, or bound before). */
static void bind(struct solver *s, const char *n, size_t len, double v)
{
	if (bound(&s->env, n, len))
		return;
	const char *k = keep_name(s, n, len);
	if (k)
		ckpt_rx_env_set(&s->env, k, v);
}

/* config.json: a template value that is exactly "{NAME}" binds NAME to the
 * number the folder's config.json has under the same key (nested objects
 * alike).  Other keys are not looked at. */
static void bind_config(struct solver *s, const cJSON *tpl, const cJSON *have, int depth)
{
	const cJSON *e;
	if (depth > 8)
		return;
	cJSON_ArrayForEach(e, tpl)
	{
		const cJSON *h = e->string ? cJSON_GetObjectItemCaseSensitive(have, e->string) : NULL;
		if (!h)
			continue;
		if (cJSON_IsObject(e) && cJSON_IsObject(h)) {
			bind_config(s, e, h, depth + 1);
		} else if (cJSON_IsString(e) && cJSON_IsNumber(h) && isfinite(h->valuedouble)) {
			const char *v = e->valuestring;
			size_t n = strlen(v);
			if (n > 2 && v[0] == '{' && v[n - 1] == '}' && is_ident(v + 1, n - 2))
				bind(s, v + 1, n - 2, h->valuedouble);
		}
	}
}

/* The unbound names of expression x (functions excluded): 0, 1 (the
 * name in *first and *flen), or 2 for two or more. */
static int unbound_names(const struct env *e, const char *x, const char **first, size_t *flen)
{
	int cnt = 0;
	*first = NULL;
	*flen = 0;
	for (const char *p = x; *p;) {
		if (!isalpha((unsigned char)*p) && *p != '_') {
			p++;
			continue;
		}
		const char *b = p;
		while (isalnum((unsigned char)*p) || *p == '_')
			p++;
		size_t n = (size_t)(p - b);
		const char *q = p;
		while (*q == ' ')
			q++;
		if (*q == '(' || bound(e, b, n))
			continue; /* sqrt, f32, bf16; or known */
		if (!cnt) {
			*first = b;
			*flen = n;
			cnt = 1;
		} else if (n != *flen || memcmp(b, *first, n)) {
			return 2;
		}
	}
	return cnt;
}

/* Solve expression x == want for its one unbound name (x = c*X or X + c). */
static int solve1(struct solver *s, const char *x, uint64_t want)
{
	const char *n;
	size_t nl;
	if (unbound_names(&s->env, x, &n, &nl) != 1)
		return 0;
	char nm[64];
	if (nl >= sizeof(nm))
		return 0;
	memcpy(nm, n, nl);
	nm[nl] = 0;
	struct env e = s->env;
	double f1, f0, v;
	const char *w;
	double cand[2];
	int nc = 0;
	ckpt_rx_env_set(&e, nm, 1);
	if (ckpt_rx_eval(x, strlen(x), &e, &f1, &w) == 0 && f1 != 0)
		cand[nc++] = (double)want / f1;
	e = s->env;
	ckpt_rx_env_set(&e, nm, 0);
	if (ckpt_rx_eval(x, strlen(x), &e, &f0, &w) == 0)
		cand[nc++] = (double)want - f0;
	for (int i = 0; i < nc; i++) {
		if (cand[i] < 0 || cand[i] != floor(cand[i]))
			continue;
		e = s->env;
		ckpt_rx_env_set(&e, nm, cand[i]);
		if (ckpt_rx_eval(x, strlen(x), &e, &v, &w) == 0 && v == (double)want) {
			bind(s, n, nl, cand[i]);
			return 1;
		}
	}
	return 0;
}

/* A dimension while propagating a rule's shape through its ops: a number,
 * or an expression with names not bound yet. */
struct sdim {
	char x[160];
};

static void sd_set(struct sdim *d, const char *x)
{
	snprintf(d->x, sizeof(d->x), "%s", x);
}

static int sd_num(const struct env *e, const char *x, int64_t *out)
{
	double v;
	const char *w;
	if (ckpt_rx_eval(x, strlen(x), e, &v, &w) < 0 || v < 0 || v != floor(v) || v > 9e15)
		return 0;
	*out = (int64_t)v;
	return 1;
}

/* Run rule ru's shape through its ops on names (env e: its loop and capture
 * variables bound to a match) and bind what target tensor t's shape tells. */
static void infer_shape(struct solver *s, const struct rule *ru, const struct env *e,
			const ckpt_recipe_target *t)
{
	struct sdim d[CKPT_RECIPE_MAX_RANK * 2];
	int rank = ru->nshape;
	for (int i = 0; i < rank; i++)
		sd_set(&d[i], ru->shape[i]);
	for (int k = 0; k < ru->nops; k++) {
		const struct rop *o = &ru->ops[k];
		int64_t a0 = 0, a1 = 0, a2 = 0;
		switch (o->kind) {
		case OP_TAKE:
			if (!sd_num(e, o->args[0], &a0) || a0 >= rank)
				return;
			memmove(&d[a0], &d[a0 + 1], (size_t)(rank - a0 - 1) * sizeof(d[0]));
			rank--;
			break;
		case OP_TRANSPOSE: {
			struct sdim q[CKPT_RECIPE_MAX_RANK * 2];
			if (o->nargs != rank)
				return;
			for (int i = 0; i < rank; i++) {
				if (!sd_num(e, o->args[i], &a0) || a0 >= rank)
					return;
				q[i] = d[a0];
			}
			memcpy(d, q, (size_t)rank * sizeof(d[0]));
			break;
		}
		case OP_RESHAPE:
			rank = o->nargs;
			for (int i = 0; i < rank; i++)
				sd_set(&d[i], o->args[i]);
			break;
		case OP_PAD:
			if (!sd_num(e, o->args[0], &a0) || a0 >= rank)
				return;
			sd_set(&d[a0], o->args[1]);
			break;
		case OP_SLICE:
			if (!sd_num(e, o->args[0], &a0) || a0 >= rank)
				return;
			snprintf(d[a0].x, sizeof(d[a0].x), "(%s)-(%s)", o->args[2], o->args[1]);
			break;
		case OP_SPLIT: {
			if (!sd_num(e, o->args[0], &a0) || a0 >= rank || !sd_num(e, o->args[1], &a1) || !a1)
				return;
			char b[160];
			snprintf(b, sizeof(b), "(%s)/%lld", d[a0].x, (long long)a1);
			sd_set(&d[a0], b);
			break;
		}
		case OP_STACK:
		case OP_CONCAT:
			return; /* the shapes of the other inputs: left to config.json */
		default:
			break;
		}
		(void)a2;
	}
	if (rank != t->rank)
		return;
	for (int i = 0; i < rank; i++) {
		int64_t v;
		if (sd_num(&s->env, d[i].x, &v))
			continue;
		/* the loop and capture variables of this match are known too */
		struct env both = s->env;
		for (int k = 0; k < e->n; k++)
			if (!bound(&both, e->name[k], strlen(e->name[k])))
				ckpt_rx_env_set(&both, e->name[k], e->val[k]);
		if (sd_num(&both, d[i].x, &v))
			continue;
		const char *x = d[i].x;
		size_t n = strlen(x);
		if (is_ident(x, n))
			bind(s, x, n, (double)t->shape[i]);
		else
			solve1(s, x, t->shape[i]);
	}
}

/* ---- candidate sources ----------------------------------------------------- */

struct cands {
	ckpt_recipe_src *s;
	uint64_t (*shape)[CKPT_RECIPE_MAX_RANK];
	size_t n, cap;
};

static int cand_add(struct cands *c, const char *name, ckpt_dtype dt, int rank, const uint64_t *shape,
		    const char *rule, char *why, size_t whylen)
{
	for (size_t i = 0; i < c->n; i++) {
		if (strcmp(c->s[i].name, name))
			continue;
		if (c->s[i].rank != rank || memcmp(c->shape[i], shape, (size_t)rank * sizeof(*shape)) ||
		    c->s[i].dtype != dt) {
			say(why, whylen, "%s: the rules reading %s disagree on its shape or dtype", rule,
			    name);
			return -EINVAL;
		}
		return 0;
	}
	if (c->n == MAX_SRCS)
		return say(why, whylen, "more than %d source arrays", MAX_SRCS), -E2BIG;
	if (c->n == c->cap) {
		size_t nc = c->cap ? c->cap * 2 : 64;
		ckpt_recipe_src *x = realloc(c->s, nc * sizeof(*x));
		if (!x)
			return -ENOMEM;
		c->s = x;
		uint64_t(*y)[CKPT_RECIPE_MAX_RANK] = realloc(c->shape, nc * sizeof(*y));
		if (!y)
			return -ENOMEM;
		c->shape = y;
		c->cap = nc;
	}
	char *nm = strdup(name);
	if (!nm)
		return -ENOMEM;
	c->s[c->n] = (ckpt_recipe_src){ nm, dt, rank, NULL };
	memcpy(c->shape[c->n], shape, (size_t)rank * sizeof(*shape));
	c->n++;
	return 0;
}

static void cands_free(struct cands *c)
{
	for (size_t i = 0; i < c->n; i++)
		free((char *)c->s[i].name);
	free(c->s);
	free(c->shape);
}

/* The variables of a match of rule ru's name against target i, in *e
 * (a copy of the solver's env plus the captures).  1 on a match. */
static int match_target(const struct solver *s, const struct rule *ru, size_t i, struct env *e,
			char vars[][64], int *nv)
{
	*e = s->env;
	*nv = 0;
	return ckpt_rx_match(ru->name, s->t[i].name, e, vars, nv);
}

/* Source arrays of rule ru: one per binding of the captures of its first
 * key (read back from the target names), with the solved shape. */
static int rule_sources(struct solver *s, const struct rule *ru, const char *base, struct cands *c, char *why,
			size_t whylen)
{
	/* the captures of the first key that are not loop variables */
	char capv[8][64];
	int ncap = 0;
	for (const char *p = strchr(ru->from[0], '{'); p && ncap < 8; p = strchr(p + 1, '{')) {
		const char *q = strchr(p, '}');
		if (!q || q - p - 1 <= 0 || q - p - 1 >= 64)
			break;
		memcpy(capv[ncap], p + 1, (size_t)(q - p - 1));
		capv[ncap][q - p - 1] = 0;
		ncap++;
	}
	double(*combo)[8] = calloc(MAX_COMBOS, sizeof(*combo));
	if (!combo)
		return -ENOMEM;
	size_t ncombo = 0;
	ckpt_dtype dt = CKPT_DT_INVALID;
	int matched = 0;
	for (size_t i = 0; i < s->nt; i++) {
		struct env e;
		char vars[8][64];
		int nv;
		if (!match_target(s, ru, i, &e, vars, &nv))
			continue;
		matched = 1;
		if (dt == CKPT_DT_INVALID)
			dt = s->t[i].dtype;
		double vals[8] = { 0 };
		int ok = 1;
		for (int k = 0; k < ncap; k++)
			ok &= ckpt_rx_env_get(&e, capv[k], strlen(capv[k]), &vals[k]);
		if (!ok)
			continue;
		size_t j = 0;
		while (j < ncombo && memcmp(combo[j], vals, sizeof(vals)))
			j++;
		if (j == ncombo && ncombo < MAX_COMBOS)
			memcpy(combo[ncombo++], vals, sizeof(vals));
	}
	int rc = 0;
	if (!matched && ru->optional)
		goto out;
	if (dt == CKPT_DT_INVALID)
		dt = s->nt ? s->t[0].dtype : CKPT_DT_FLOAT32;
	if (!ncap && !ncombo)
		ncombo = 1; /* a plain key: one array, even when no tensor names it (then missing) */
	for (size_t j = 0; j < ncombo && rc == 0; j++) {
		struct env e = s->env;
		for (int k = 0; k < ncap; k++)
			ckpt_rx_env_set(&e, capv[k], combo[j][k]);
		if (ru->when) {
			double g;
			const char *w;
			if (ckpt_rx_eval(ru->when, strlen(ru->when), &e, &g, &w) < 0 || g == 0)
				continue;
		}
		uint64_t shape[CKPT_RECIPE_MAX_RANK], count = 1;
		for (int d = 0; d < ru->nshape; d++) {
			int64_t v;
			if (!sd_num(&e, ru->shape[d], &v) && !matched) {
				say(why, whylen,
				    "%s is missing (no tensor of the folder is made by this rule)", ru->name);
				rc = -ENODATA;
				goto out;
			} else if (!sd_num(&e, ru->shape[d], &v)) {
				say(why, whylen,
				    "%s: axis %d (%s) of its source is not told by the tensors or "
				    "config.json",
				    ru->name, d, ru->shape[d]);
				rc = -EINVAL;
				goto out;
			}
			shape[d] = (uint64_t)v;
			if (!v || (uint64_t)v > (UINT64_C(1) << 50) / count) {
				say(why, whylen, "%s: axis %d (%s) of its source would be %lld: not a size",
				    ru->name, d, ru->shape[d], (long long)v);
				rc = -EINVAL;
				goto out;
			}
			count *= (uint64_t)v;
		}
		for (int k = 0; k < ru->nfrom && rc == 0; k++) {
			char key[MAX_NAME], full[MAX_NAME + 512];
			if ((rc = ckpt_rx_render(ru->from[k], &e, key, sizeof(key), why, whylen)) < 0)
				break;
			snprintf(full, sizeof(full), "%s%s", base, key);
			rc = cand_add(c, full, dt, ru->nshape, shape, ru->name, why, whylen);
		}
	}
out:
	free(combo);
	return rc;
}

/* ---- the inverse plan ------------------------------------------------------- */

static int cmp_tgt(const void *a, const void *b, void *ctx)
{
	const ckpt_recipe_target *t = ctx;
	return strcmp(t[*(const size_t *)a].name, t[*(const size_t *)b].name);
}

static int same_parts(const ckpt_rtensor *a, const ckpt_rtensor *b)
{
	return a->nparts == b->nparts && a->rank == b->rank &&
	       !memcmp(a->shape, b->shape, sizeof(a->shape)) &&
	       !memcmp(a->parts, b->parts, a->nparts * sizeof(*a->parts));
}

static uint64_t box_count(const ckpt_region *b)
{
	uint64_t c = 1;
	for (int d = 0; d < b->rank; d++)
		c *= b->stop[d] - b->start[d];
	return c;
}

static uint64_t part_count(const ckpt_rtensor *t, size_t k)
{
	uint64_t c = 1;
	for (int d = 0; d < t->rank; d++)
		c *= t->parts[k].hi[d] - t->parts[k].lo[d];
	return c;
}

static int boxes_overlap(const ckpt_region *a, const ckpt_region *b)
{
	for (int d = 0; d < a->rank; d++)
		if (a->stop[d] <= b->start[d] || b->stop[d] <= a->start[d])
			return 0;
	return 1;
}

struct pbox {
	size_t tensor, part;
	ckpt_region box;
};

/* Every element of every source array is written exactly once (aliases
 * aside): the parts' boxes per source are disjoint and fill it. */
static int check_cover(ckpt_rinverse *x, char *why, size_t whylen)
{
	const ckpt_rplan *p = x->plan;
	size_t total = 0;
	for (size_t i = 0; i < p->n; i++)
		total += p->t[i].nparts;
	struct pbox *b = calloc(total ? total : 1, sizeof(*b));
	size_t *start = calloc(x->nsrc + 1, sizeof(*start));
	int rc = b && start ? 0 : -ENOMEM;
	size_t nb = 0;
	for (size_t i = 0; rc == 0 && i < p->n; i++) {
		const ckpt_rtensor *t = &p->t[i];
		if (x->dup_of[i] != SIZE_MAX)
			continue;
		for (size_t k = 0; k < t->nparts; k++) {
			uint64_t n = part_count(t, k);
			if (!n)
				continue;
			struct pbox *q = &b[nb];
			ckpt_rtensor_box(t, k, 0, ckpt_rtensor_count(t), &q->box);
			/* the part's elements in their box, in the box's index space */
			if (box_count(&q->box) != n) {
				say(why, whylen,
				    "%s: its part %zu reads %llu elements of a box of %llu: the index map "
				    "does not invert",
				    t->name, k, (unsigned long long)n,
				    (unsigned long long)box_count(&q->box));
				rc = -EOPNOTSUPP;
				break;
			}
			q->tensor = i;
			q->part = k;
			nb++;
		}
	}
	for (size_t si = 0; rc == 0 && si < x->nsrc; si++) {
		uint64_t want = 1, have = 0;
		for (int d = 0; d < x->src[si].rank; d++)
			want *= x->src[si].shape[d];
		size_t first = SIZE_MAX;
		for (size_t i = 0; i < nb && rc == 0; i++) {
			const ckpt_rtensor *t = &p->t[b[i].tensor];
			if (t->parts[b[i].part].input != si)
				continue;
			if (first == SIZE_MAX)
				first = i;
			for (size_t j = 0; j < i; j++) {
				const ckpt_rtensor *u = &p->t[b[j].tensor];
				if (u->parts[b[j].part].input == si && boxes_overlap(&b[i].box, &b[j].box)) {
					say(why, whylen, "%s and %s both fill elements of %s", u->name,
					    t->name, x->src[si].name);
					rc = -EINVAL;
					break;
				}
			}
			have += box_count(&b[i].box);
		}
		if (rc == 0 && have != want) {
			say(why, whylen,
			    "%s: %llu of its %llu elements come from no tensor of the folder (cut by "
			    "the recipe: a pad that shortens an axis)",
			    x->src[si].name, (unsigned long long)(want - have), (unsigned long long)want);
			rc = -ENODATA;
		}
	}
	free(b);
	free(start);
	return rc;
}

void ckpt_rinverse_free(ckpt_rinverse *x)
{
	if (!x)
		return;
	for (size_t i = 0; i < x->nsrc; i++)
		free((char *)x->src[i].name);
	free(x->src);
	free(x->shape);
	ckpt_rplan_free(x->plan);
	free(x->target_of);
	free(x->dup_of);
	free(x);
}

/* The position of rule i among the rules of its group (0: the first). */
static int group_pos(const ckpt_recipe *r, int i)
{
	int k = 0;
	for (int j = 0; j < i; j++)
		k += r->rules[j].group && !strcmp(r->rules[j].group, r->rules[i].group);
	return k;
}

/* The source arrays of alternative `alt` of the groups, planned forward
 * and checked against the folder. */
static int build_alt(struct solver *s, const ckpt_recipe *r, int alt, int *stage, ckpt_rinverse **out,
		     char *why, size_t whylen)
{
	*out = NULL;
	const char *item = r->import_item ? r->import_item : "items";
	const char *pre = r->import_prefix ? r->import_prefix : r->nprefixes ? r->prefixes[0] : "";
	char base[512];
	snprintf(base, sizeof(base), "%s.%s", item, pre);
	struct cands c = { 0 };
	int rc = 0;
	for (int i = 0; rc == 0 && i < r->nrules; i++) {
		const struct rule *ru = &r->rules[i];
		if (ru->alias || ru->absent || (ru->group && group_pos(r, i) != alt))
			continue;
		rc = rule_sources(s, ru, base, &c, why, whylen);
	}
	ckpt_rinverse *x = rc == 0 ? calloc(1, sizeof(*x)) : NULL;
	if (rc == 0 && !x)
		rc = -ENOMEM;
	if (rc < 0) {
		cands_free(&c);
		return rc;
	}
	x->src = c.s;
	x->shape = c.shape;
	x->nsrc = c.n;
	for (size_t i = 0; i < c.n; i++)
		x->src[i].shape = x->shape[i];
	char fwhy[512] = "";
	*stage = 1; /* how far it got: the sources are made */
	rc = ckpt_recipe_plan(r, x->src, x->nsrc, &x->plan, fwhy, sizeof(fwhy));
	if (rc < 0 && rc != -ENOMEM) {
		say(why, whylen, "the folder's tensors do not make a source step: %s", fwhy);
		rc = -EINVAL;
	}
	const ckpt_recipe_target *t = s->t;
	size_t nt = s->nt;
	size_t *ord = rc == 0 ? malloc((nt ? nt : 1) * sizeof(*ord)) : NULL;
	if (rc == 0 && (!ord || !(x->target_of = malloc((x->plan->n + 1) * sizeof(size_t))) ||
			!(x->dup_of = malloc((x->plan->n + 1) * sizeof(size_t)))))
		rc = -ENOMEM;
	if (rc == 0) {
		for (size_t i = 0; i < nt; i++)
			ord[i] = i;
		qsort_r(ord, nt, sizeof(*ord), cmp_tgt, (void *)t);
		for (size_t i = 1; i < nt && rc == 0; i++)
			if (!strcmp(t[ord[i]].name, t[ord[i - 1]].name)) {
				say(why, whylen, "%s: given twice", t[ord[i]].name);
				rc = -EINVAL;
			}
		*stage = 2;
		/* both lists sorted by name: walk them together; a name the
		 * recipe does not make is told before what is then missing */
		const ckpt_rplan *p = x->plan;
		size_t a = 0, b = 0, missing = SIZE_MAX, unknown = SIZE_MAX;
		while (rc == 0 && (a < p->n || b < nt)) {
			int cmp = a == p->n ? 1 : b == nt ? -1 : strcmp(p->t[a].name, t[ord[b]].name);
			if (cmp < 0) {
				if (missing == SIZE_MAX)
					missing = a;
				a++;
			} else if (cmp > 0) {
				if (unknown == SIZE_MAX)
					unknown = ord[b];
				b++;
			} else {
				const ckpt_rtensor *m = &p->t[a];
				const ckpt_recipe_target *g = &t[ord[b]];
				int same = g->rank == m->rank && g->dtype == m->dtype;
				for (int d = 0; same && d < m->rank; d++)
					same = g->shape[d] == m->shape[d];
				if (!same) {
					char gs[160] = "", ms[160] = "";
					for (int d = 0; d < g->rank && d < CKPT_RECIPE_MAX_RANK; d++)
						snprintf(gs + strlen(gs), sizeof(gs) - strlen(gs), "%s%llu",
							 d ? "," : "", (unsigned long long)g->shape[d]);
					for (int d = 0; d < m->rank; d++)
						snprintf(ms + strlen(ms), sizeof(ms) - strlen(ms), "%s%llu",
							 d ? "," : "", (unsigned long long)m->shape[d]);
					say(why, whylen, "%s: %s [%s], the recipe makes %s [%s] here",
					    g->name, ckpt_dtype_get(g->dtype)->name, gs,
					    ckpt_dtype_get(m->dtype)->name, ms);
					rc = -EINVAL;
				}
				x->target_of[a] = ord[b];
				a++;
				b++;
			}
		}
		if (rc == 0 && unknown != SIZE_MAX) {
			say(why, whylen, "%s: recipe %s makes no tensor of this name%s%s%s", t[unknown].name,
			    r->name, missing != SIZE_MAX ? " (and " : "",
			    missing != SIZE_MAX ? p->t[missing].name : "",
			    missing != SIZE_MAX ? " is missing)" : "");
			rc = -EINVAL;
		} else if (rc == 0 && missing != SIZE_MAX) {
			say(why, whylen, "%s is missing (the recipe makes it from %s)", p->t[missing].name,
			    p->t[missing].desc);
			rc = -ENODATA;
		}
	}
	free(ord);
	/* tensors with the same parts (aliases): the first one a rule with
	 * "from" makes leads, the others must hold its bytes */
	for (size_t i = 0; rc == 0 && i < x->plan->n; i++) {
		const ckpt_rtensor *ti = &x->plan->t[i];
		int ai = !strncmp(ti->desc, "alias of ", 9);
		x->dup_of[i] = SIZE_MAX;
		for (size_t j = 0; j < x->plan->n && x->dup_of[i] == SIZE_MAX; j++) {
			const ckpt_rtensor *tj = &x->plan->t[j];
			int aj = !strncmp(tj->desc, "alias of ", 9);
			if (j != i && (aj < ai || (aj == ai && j < i)) && same_parts(ti, tj))
				x->dup_of[i] = j;
		}
	}
	for (size_t i = 0; rc == 0 && i < x->plan->n; i++) /* the leader of a leader: its own */
		while (x->dup_of[i] != SIZE_MAX && x->dup_of[x->dup_of[i]] != SIZE_MAX)
			x->dup_of[i] = x->dup_of[x->dup_of[i]];
	if (rc == 0)
		rc = (*stage = 3, check_cover(x, why, whylen));
	if (rc < 0) {
		ckpt_rinverse_free(x);
		return rc;
	}
	*out = x;
	return 0;
}

int ckpt_recipe_invert(const ckpt_recipe *r, const ckpt_recipe_target *t, size_t nt, const char *config,
		       size_t clen, ckpt_rinverse **out, char *why, size_t whylen)
{
	*out = NULL;
	int rc = ckpt_recipe_invertible(r, why, whylen);
	if (rc < 0)
		return rc;
	struct solver *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->r = r;
	s->t = t;
	s->nt = nt;
	for (int i = 0; i < r->nvars; i++)
		ckpt_rx_env_set(&s->env, r->var_name[i], r->var_val[i]);
	if (config) {
		cJSON *cj = cJSON_ParseWithLength(config, clen);
		if (!cj || !cJSON_IsObject(cj)) {
			cJSON_Delete(cj);
			free(s);
			say(why, whylen, "config.json: not a JSON object");
			return -EINVAL;
		}
		for (int i = 0; i < r->nfiles; i++)
			if (!strcmp(r->files[i].name, "config.json") && r->files[i].json)
				bind_config(s, r->files[i].json, cj, 0);
		cJSON_Delete(cj);
	}
	/* a name no rule makes is told first (what it should have been is
	 * then missing) */
	for (size_t k = 0; k < nt; k++) {
		int known = 0;
		for (int i = 0; i < r->nrules && !known; i++) {
			if (r->rules[i].absent)
				continue;
			struct env e = s->env;
			char vars[8][64];
			int nv = 0;
			known = ckpt_rx_match(r->rules[i].name, t[k].name, &e, vars, &nv);
		}
		if (!known) {
			say(why, whylen, "%s: recipe %s makes no tensor of this name", t[k].name, r->name);
			free(s);
			return -EINVAL;
		}
	}
	/* loop counts, then shapes, from the names and shapes of the tensors */
	for (int pass = 0; pass < 4; pass++) {
		int before = s->env.n;
		for (int i = 0; i < r->nrules; i++) {
			const struct rule *ru = &r->rules[i];
			if (ru->alias || ru->absent)
				continue;
			int first = -1;
			for (size_t k = 0; k < nt; k++) {
				struct env e;
				char vars[8][64];
				int nv;
				if (!match_target(s, ru, k, &e, vars, &nv))
					continue;
				for (int f = 0; f < ru->nfor; f++) {
					double lv, have;
					const char *fx = ru->for_expr[f];
					if (!ckpt_rx_env_get(&e, ru->for_var[f], strlen(ru->for_var[f]),
							     &lv) ||
					    !is_ident(fx, strlen(fx)))
						continue;
					/* L: one more than the largest l of any tensor */
					if (!ckpt_rx_env_get(&s->env, fx, strlen(fx), &have)) {
						bind(s, fx, strlen(fx), lv + 1);
					} else if (lv + 1 > have) {
						for (int q = 0; q < s->nnames; q++)
							if (!strcmp(s->names[q], fx))
								ckpt_rx_env_set(&s->env, s->names[q], lv + 1);
					}
				}
				if (first < 0)
					first = (int)k;
			}
			if (first >= 0) {
				struct env e;
				char vars[8][64];
				int nv;
				match_target(s, ru, (size_t)first, &e, vars, &nv);
				infer_shape(s, ru, &e, &t[first]);
			}
		}
		if (s->env.n == before)
			break;
	}
	/* groups: every group's first rule, then every group's second, ...:
	 * the first set whose plan makes the folder's tensors is imported */
	int nalt = 1;
	for (int i = 0; i < r->nrules; i++)
		if (r->rules[i].group && group_pos(r, i) + 1 > nalt)
			nalt = group_pos(r, i) + 1;
	/* all fail: the reason of the one that got furthest (the first of those) */
	char first[1024] = "";
	int frc = 0, best = -1;
	for (int alt = 0; alt < nalt; alt++) {
		char w[1024] = "";
		int stage = 0;
		rc = build_alt(s, r, alt, &stage, out, w, sizeof(w));
		if (rc == 0 || rc == -ENOMEM)
			break;
		if (stage > best) {
			best = stage;
			frc = rc;
			snprintf(first, sizeof(first), "%s", w);
		}
	}
	free(s);
	if (rc < 0 && rc != -ENOMEM) {
		rc = frc;
		say(why, whylen, "%s", first);
	}
	return rc;
}

size_t ckpt_rinverse_nsrc(const ckpt_rinverse *x)
{
	return x->nsrc;
}

const ckpt_recipe_src *ckpt_rinverse_src(const ckpt_rinverse *x, size_t i)
{
	return i < x->nsrc ? &x->src[i] : NULL;
}

const ckpt_rplan *ckpt_rinverse_plan(const ckpt_rinverse *x)
{
	return x->plan;
}

size_t ckpt_rinverse_target_of(const ckpt_rinverse *x, size_t i)
{
	return x->target_of[i];
}

size_t ckpt_rinverse_dup_of(const ckpt_rinverse *x, size_t i)
{
	return x->dup_of[i];
}

/* ---- data: scatter and the inverse element ops ------------------------------ */

void ckpt_rtensor_scatter(const ckpt_rtensor *t, size_t part, const ckpt_region *box, const void *src,
			  void *boxbuf)
{
	const ckpt_rpart *p = &t->parts[part];
	unsigned is = ckpt_dtype_get(t->src_dtype)->itemsize;
	const uint8_t *in = src;
	uint8_t *out = boxbuf;
	uint64_t bs[CKPT_RECIPE_MAX_RANK], acc = 1;
	for (int d = p->srank - 1; d >= 0; d--) {
		bs[d] = acc;
		acc *= box->stop[d] - box->start[d];
	}
	int64_t base = 0;
	for (int d = 0; d < p->srank; d++)
		base += ((int64_t)p->base[d] - (int64_t)box->start[d]) * (int64_t)bs[d];
	if (t->rank == 0) {
		memcpy(out + (uint64_t)base * is, in, is);
		return;
	}
	/* per target dim: the source offset of each index of the part */
	uint64_t *so[CKPT_RECIPE_MAX_RANK];
	uint64_t ts[CKPT_RECIPE_MAX_RANK];
	acc = 1;
	for (int d = t->rank - 1; d >= 0; d--) {
		ts[d] = acc;
		acc *= t->shape[d];
	}
	int fi = 0, ok = 1;
	for (int d = 0; d < t->rank; d++) {
		uint64_t n = p->hi[d] - p->lo[d];
		so[d] = malloc((n ? n : 1) * sizeof(uint64_t));
		ok &= so[d] != NULL;
		for (uint64_t u = 0; so[d] && u < n; u++) {
			uint64_t r = u, off = 0;
			for (int j = fi + p->nf[d] - 1; j >= fi; j--) {
				off += (r % p->f[j].n) * p->f[j].stride * bs[p->f[j].sdim];
				r /= p->f[j].n;
			}
			so[d][u] = off;
		}
		fi += p->nf[d];
	}
	if (ok) {
		int last = t->rank - 1;
		uint64_t u[CKPT_RECIPE_MAX_RANK] = { 0 }, n_last = p->hi[last] - p->lo[last];
		for (int d = 0; d < t->rank; d++)
			if (p->hi[d] == p->lo[d])
				goto done;
		for (;;) {
			uint64_t sof = (uint64_t)base, tof = 0;
			for (int d = 0; d < last; d++) {
				sof += so[d][u[d]];
				tof += (p->lo[d] + u[d]) * ts[d];
			}
			tof += p->lo[last];
			const uint64_t *sl = so[last];
			for (uint64_t k = 0; k < n_last; k++)
				memcpy(out + (sof + sl[k]) * is, in + (tof + k) * is, is);
			int d = last - 1;
			while (d >= 0 && ++u[d] == p->hi[d] - p->lo[d])
				u[d--] = 0;
			if (d < 0)
				break;
		}
	}
done:
	for (int d = 0; d < t->rank; d++)
		free(so[d]);
}

static float bits_f32(uint32_t b)
{
	float f;
	memcpy(&f, &b, 4);
	return f;
}

static float h_to_f32(ckpt_dtype dt, uint16_t h)
{
	if (dt == CKPT_DT_BFLOAT16)
		return bits_f32((uint32_t)h << 16);
	uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ffu;
	if (e == 31)
		return bits_f32(s | 0x7f800000u | (m << 13));
	if (e == 0) {
		float f = (float)m * bits_f32(0x33800000u);
		return s ? -f : f;
	}
	return bits_f32(s | ((e + 112) << 23) | (m << 13));
}

static uint16_t f32_to_h(ckpt_dtype dt, float x)
{
	return dt == CKPT_DT_BFLOAT16 ? ckpt_f32_to_bf16(x) : ckpt_f32_to_f16(x);
}

/* The next 16-bit float value up (dir 1) or down (-1), by bits. */
static uint16_t h_next(uint16_t h, int dir)
{
	int neg = (h & 0x8000u) != 0;
	if ((h & 0x7fffu) == 0)
		return dir > 0 ? 0x0001 : 0x8001;
	return (dir > 0) != neg ? (uint16_t)(h + 1) : (uint16_t)(h - 1);
}

int ckpt_rtensor_unconvert(const ckpt_rtensor *t, const void *src, size_t count, void *dst)
{
	ckpt_dtype dt = t->src_dtype;
	if (t->dtype != dt)
		return -EOPNOTSUPP; /* cast: refused by ckpt_recipe_invertible */
	if (!t->elem) {
		memcpy(dst, src, count * ckpt_dtype_get(dt)->itemsize);
		return 0;
	}
	const uint8_t *s = src;
	uint8_t *d = dst;
	if (dt == CKPT_DT_FLOAT64) {
		for (size_t i = 0; i < count; i++) {
			double y;
			memcpy(&y, s + 8 * i, 8);
			if (t->bias != 0)
				y = y - t->bias;
			if (t->divisor != 0)
				y = y * t->divisor;
			if (t->scale != 1)
				y = y / t->scale;
			memcpy(d + 8 * i, &y, 8);
		}
		return 0;
	}
	if (dt != CKPT_DT_FLOAT32 && dt != CKPT_DT_BFLOAT16 && dt != CKPT_DT_FLOAT16)
		return -EOPNOTSUPP;
	const float a = (float)t->scale, c = (float)t->divisor, b = (float)t->bias;
	const int mul = t->scale != 1, div = t->divisor != 0, add = t->bias != 0;
	for (size_t i = 0; i < count; i++) {
		float y;
		uint16_t yh = 0;
		if (dt == CKPT_DT_FLOAT32) {
			memcpy(&y, s + 4 * i, 4);
		} else {
			memcpy(&yh, s + 2 * i, 2);
			y = h_to_f32(dt, yh);
		}
		float x = y;
		if (add)
			x = x - b;
		if (div)
			x = x * c;
		if (mul)
			x = x / a;
		if (!isfinite(y) || !isfinite(x)) {
			if (dt == CKPT_DT_FLOAT32)
				memcpy(d + 4 * i, &x, 4);
			else {
				uint16_t h = f32_to_h(dt, x);
				memcpy(d + 2 * i, &h, 2);
			}
			continue;
		}
		/* of x rounded and its two neighbours, one the forward ops take
		 * back to y, if there is one: re-exporting gives y again */
		if (dt == CKPT_DT_FLOAT32) {
			float cand[3] = { x, nextafterf(x, INFINITY), nextafterf(x, -INFINITY) }, pick = x;
			for (int k = 0; k < 3; k++) {
				float f = cand[k];
				if (mul)
					f = f * a;
				if (div)
					f = f / c;
				if (add)
					f = f + b;
				if (!memcmp(&f, &y, 4)) {
					pick = cand[k];
					break;
				}
			}
			memcpy(d + 4 * i, &pick, 4);
		} else {
			uint16_t h0 = f32_to_h(dt, x);
			uint16_t cand[3] = { h0, h_next(h0, 1), h_next(h0, -1) }, pick = h0;
			for (int k = 0; k < 3; k++) {
				float f = h_to_f32(dt, cand[k]);
				if (mul)
					f = f * a;
				if (div)
					f = f / c;
				if (add)
					f = f + b;
				if (f32_to_h(dt, f) == yh) {
					pick = cand[k];
					break;
				}
			}
			memcpy(d + 2 * i, &pick, 2);
		}
	}
	return 0;
}

const char *ckpt_recipe_op_name(int kind)
{
	return kind >= 0 && kind < (int)(sizeof(op_names) / sizeof(*op_names)) ? op_names[kind] : "?";
}
