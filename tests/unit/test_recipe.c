/*
 * test_recipe.c - view recipes (lib/format/recipe.h): refused recipe texts
 * name their reason; random chains of shape ops (take, slice, split, pad,
 * transpose, reshape, stack, concat) gathered lazily over random element
 * ranges equal the same chain applied eagerly to a dense array; rounding
 * to bfloat16 / float16 (nearest even) and the float32 affine; transposes
 * of 2- and 4-byte elements (the gather's register blocks, rows of row
 * step 1 and 2) element by element; every gather again chunk by chunk
 * (each chunk's clipped part from the chunk, as the views read); groups of
 * alternative rules and absent rules.
 */
#include <errno.h>
#include <math.h>

#include "check.h"
#include "recipe.h"

/* ---- refused texts ---------------------------------------------------------- */

static void test_refused(void)
{
	static const char *const bad[] = {
		"",
		"{",
		"[]",
		"{\"name\": \"x\", \"tensors\": [{\"name\": \"a\", \"from\": \"b\"}]}",
		"{\"ckptfs_recipe\": 2, \"name\": \"x\", \"tensors\": [{\"name\": \"a\", \"from\": \"b\"}]}",
		"{\"ckptfs_recipe\": 1, \"name\": \"a/b\", \"tensors\": [{\"name\": \"a\", \"from\": "
		"\"b\"}]}",
		"{\"ckptfs_recipe\": 1, \"name\": \".x\", \"tensors\": [{\"name\": \"a\", \"from\": \"b\"}]}",
		"{\"ckptfs_recipe\": 1, \"name\": \"x\", \"tensors\": []}",
		"{\"ckptfs_recipe\": 1, \"name\": \"x\", \"tensors\": [{\"name\": \"a\"}]}",
		"{\"ckptfs_recipe\": 1, \"name\": \"x\", \"tensors\": [{\"name\": \"a\", \"from\": \"b\", "
		"\"ops\": [[\"nosuchop\", 1]]}]}",
		"{\"ckptfs_recipe\": 1, \"name\": \"x\", \"tensors\": [{\"name\": \"a\", \"from\": \"b\", "
		"\"ops\": [[\"take\", 1]]}]}",
		"{\"ckptfs_recipe\": 1, \"name\": \"x\", \"tensors\": [{\"name\": \"a\", \"from\": \"b\", "
		"\"ops\": [[\"cast\", \"float33\"]]}]}",
		"{\"ckptfs_recipe\": 1, \"name\": \"x\", \"tensors\": [{\"name\": \"a\", \"from\": [\"b\", "
		"\"c\"]}]}",
		"{\"ckptfs_recipe\": 1, \"name\": \"x\", \"tensors\": [{\"name\": \"a\", \"from\": [\"b\", "
		"\"c\"], "
		"\"ops\": [[\"transpose\", 1, 0]]}]}",
		"{\"ckptfs_recipe\": 1, \"name\": \"x\", \"tensors\": [{\"name\": \"a\", \"from\": \"b\", "
		"\"ops\": [[\"stack\", 0]]}]}",
		"{\"ckptfs_recipe\": 1, \"name\": \"x\", \"tensors\": [{\"name\": \"a\", \"from\": \"b\"}], "
		"\"files\": [{\"name\": \"model.safetensors\", \"text\": \"x\"}]}",
		"{\"ckptfs_recipe\": 1, \"name\": \"x\", \"tensors\": [{\"name\": \"a\", \"from\": \"b\"}], "
		"\"files\": [{\"name\": \"c.json\"}]}",
		"{\"ckptfs_recipe\": 1, \"name\": \"x\", \"tensors\": [{\"name\": \"a\", \"from\": \"b\", "
		"\"group\": \"g\", \"optional\": true}]}",
		"{\"ckptfs_recipe\": 1, \"name\": \"x\", \"tensors\": [{\"name\": \"a\", \"from\": \"b\", "
		"\"group\": 1}]}",
		"{\"ckptfs_recipe\": 1, \"name\": \"x\", \"tensors\": [{\"name\": \"a\", \"from\": \"b\", "
		"\"absent\": true, \"shape\": [\"E\"]}]}",
		"{\"ckptfs_recipe\": 1, \"name\": \"x\", \"tensors\": [{\"name\": \"a\", \"from\": \"b\", "
		"\"absent\": true, \"ops\": []}]}",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
		ckpt_recipe *r = (ckpt_recipe *)1;
		char why[256] = "";
		int rc = ckpt_recipe_parse(bad[i], strlen(bad[i]), &r, why, sizeof(why));
		CHECK_EQ_INT(rc, -EINVAL);
		CHECK(r == NULL);
		CHECK(why[0] != 0);
		if (rc == 0)
			fprintf(stderr, "accepted: %s\n", bad[i]);
	}
}

/* A recipe that parses but does not match names its rule. */
static void test_mismatch(void)
{
	const char *t = "{\"ckptfs_recipe\": 1, \"name\": \"x\", \"tensors\": ["
			"{\"name\": \"a\", \"from\": \"w\", \"shape\": [\"E\", \"F\"]},"
			"{\"name\": \"b.{l}\", \"from\": \"v\", \"shape\": [\"F\", \"E\", \"L\"], \"for\": "
			"{\"l\": \"L\"},"
			" \"ops\": [[\"take\", 2, \"l\"]]},"
			"{\"name\": \"c\", \"from\": \"u\", \"optional\": true}]}";
	ckpt_recipe *r;
	char why[256] = "";
	CHECK_EQ_INT(ckpt_recipe_parse(t, strlen(t), &r, why, sizeof(why)), 0);
	uint64_t s1[2] = { 4, 6 }, s2[3] = { 6, 4, 3 }, s3[3] = { 6, 5, 3 };
	ckpt_recipe_src src[2] = { { "w", CKPT_DT_FLOAT32, 2, s1 }, { "v", CKPT_DT_FLOAT32, 3, s2 } };
	ckpt_rplan *p;
	CHECK_EQ_INT(ckpt_recipe_plan(r, src, 2, &p, why, sizeof(why)), 0);
	CHECK_EQ_INT(ckpt_rplan_count(p), 4); /* a, b.0, b.1, b.2 */
	CHECK(!strcmp(ckpt_rplan_tensor(p, 1)->name, "b.0"));
	CHECK_EQ_INT(ckpt_rplan_tensor(p, 3)->shape[1], 4);
	ckpt_rplan_free(p);
	src[1].shape = s3; /* E differs */
	CHECK_EQ_INT(ckpt_recipe_plan(r, src, 2, &p, why, sizeof(why)), -ENOENT);
	CHECK(strstr(why, "b.{l}: v has shape [6,5,3]; axis 1 is E = 4") != NULL);
	CHECK_EQ_INT(ckpt_recipe_plan(r, src, 1, &p, why, sizeof(why)), -ENOENT);
	CHECK(strstr(why, "b.{l}: no source key v") != NULL);
	ckpt_recipe_free(r);
}

/* Groups of alternative rules and absent rules; keys with '/' (FLAT). */
static void test_group_absent(void)
{
	const char *t = "{\"ckptfs_recipe\": 1, \"name\": \"x\", \"tensors\": ["
			"{\"name\": \"e\", \"from\": \"t/emb.w\", \"shape\": [\"V\", \"E\"]},"
			"{\"name\": \"not g2\", \"from\": \"t/layer_{i}/post.scale\", \"absent\": true},"
			"{\"name\": \"q.{i}\", \"from\": \"t/layer_{i}/qkv.w\", \"shape\": [3, \"E\"], "
			"\"group\": \"q\", \"ops\": [[\"take\", 0, 0]]},"
			"{\"name\": \"q.{i}\", \"from\": \"t/layer_{i}/q.w\", \"shape\": [\"E\"], \"group\": "
			"\"q\"}]}";
	ckpt_recipe *r;
	char why[256] = "";
	CHECK_EQ_INT(ckpt_recipe_parse(t, strlen(t), &r, why, sizeof(why)), 0);
	uint64_t se[2] = { 5, 4 }, sq3[2] = { 3, 4 }, sq[1] = { 4 };
	ckpt_recipe_src fused[3] = { { "i.t/emb.w", CKPT_DT_FLOAT32, 2, se },
				     { "i.t/layer_0/qkv.w", CKPT_DT_FLOAT32, 2, sq3 },
				     { "i.t/layer_1/qkv.w", CKPT_DT_FLOAT32, 2, sq3 } };
	ckpt_rplan *p;
	CHECK_EQ_INT(ckpt_recipe_plan(r, fused, 3, &p, why, sizeof(why)), 0);
	CHECK_EQ_INT(ckpt_rplan_count(p), 3); /* e, q.0, q.1 */
	CHECK(!strcmp(ckpt_rplan_tensor(p, 2)->name, "q.1"));
	CHECK_EQ_INT(ckpt_rplan_tensor(p, 2)->rank, 1);
	ckpt_rplan_free(p);
	ckpt_recipe_src split[2] = { { "i.t/emb.w", CKPT_DT_FLOAT32, 2, se },
				     { "i.t/layer_0/q.w", CKPT_DT_FLOAT32, 1, sq } };
	CHECK_EQ_INT(ckpt_recipe_plan(r, split, 2, &p, why, sizeof(why)), 0);
	CHECK_EQ_INT(ckpt_rplan_count(p), 2);
	ckpt_rplan_free(p);
	/* neither form: the group's first rule is named */
	CHECK_EQ_INT(ckpt_recipe_plan(r, split, 1, &p, why, sizeof(why)), -ENOENT);
	CHECK(strstr(why,
		     "q.{i}: no source key i.t/layer_{i}/qkv.w (nor one of the other rules of group q)") !=
	      NULL);
	/* an absent rule's key present: refused, the key named */
	ckpt_recipe_src g2[3] = { { "i.t/emb.w", CKPT_DT_FLOAT32, 2, se },
				  { "i.t/layer_0/q.w", CKPT_DT_FLOAT32, 1, sq },
				  { "i.t/layer_7/post.scale", CKPT_DT_FLOAT32, 1, sq } };
	CHECK_EQ_INT(ckpt_recipe_plan(r, g2, 3, &p, why, sizeof(why)), -ENOENT);
	CHECK(strstr(why, "not g2: source key i.t/layer_7/post.scale is present") != NULL);
	CHECK(p == NULL);
	ckpt_recipe_free(r);
}

/* ---- lazy vs eager ------------------------------------------------------------ */

struct dense {
	int rank;
	uint64_t shape[8];
	int64_t *v; /* source flat index + 1, or 0 (pad) */
};

static uint64_t dcount(const struct dense *d)
{
	uint64_t c = 1;
	for (int i = 0; i < d->rank; i++)
		c *= d->shape[i];
	return c;
}

static void unrav(const uint64_t *shape, int rank, uint64_t e, uint64_t *idx)
{
	for (int d = rank - 1; d >= 0; d--) {
		idx[d] = e % shape[d];
		e /= shape[d];
	}
}

static uint64_t rav(const uint64_t *shape, int rank, const uint64_t *idx)
{
	uint64_t e = 0;
	for (int d = 0; d < rank; d++)
		e = e * shape[d] + idx[d];
	return e;
}

/* ---- gathering chunk by chunk ---------------------------------------------
 *
 * As a view reads: for each chunk (shape cs over source shape s0) that
 * meets the part's box, the part clipped to the chunk (ckpt_rtensor_clip)
 * is gathered straight from the chunk's buffer; a clip the part cannot
 * express falls back to the whole box.  Element values are the source
 * index's C-order position plus add, in is bytes (little-endian low
 * bytes); an edge chunk's elements past the array hold 0xab bytes (never
 * read).  Returns 1 when the fall-back was taken, else 0. */
static int clip_fallbacks, clip_chunks;

static void fill_region(const uint64_t *s0, int rank, const uint64_t *start, const uint64_t *shape,
			uint64_t add, unsigned is, uint8_t *buf)
{
	uint64_t n = 1, idx[8], jdx[8];
	for (int d = 0; d < rank; d++)
		n *= shape[d];
	for (uint64_t e = 0; e < n; e++) {
		unrav(shape, rank, e, idx);
		int inside = 1;
		for (int d = 0; d < rank; d++) {
			jdx[d] = idx[d] + start[d];
			inside &= jdx[d] < s0[d];
		}
		uint64_t v = rav(s0, rank, jdx) + add;
		if (inside)
			memcpy(buf + e * is, &v, is);
		else
			memset(buf + e * is, 0xab, is);
	}
}

static int chunked_gather(const ckpt_rtensor *t, size_t pi, const uint64_t *s0, const uint64_t *cs,
			  uint64_t add, unsigned is, uint64_t e0, uint64_t e1, uint8_t *got)
{
	ckpt_region box;
	if (!ckpt_rtensor_box(t, pi, e0, e1, &box))
		return 0;
	int rank = box.rank;
	uint64_t lo[8], hi[8], g[8], bshape[8];
	for (int d = 0; d < rank; d++) {
		lo[d] = box.start[d] / cs[d];
		hi[d] = (box.stop[d] - 1) / cs[d];
		g[d] = lo[d];
	}
	uint64_t cn = 1;
	for (int d = 0; d < rank; d++)
		cn *= cs[d];
	uint8_t *cb = malloc(cn * is);
	for (;;) {
		ckpt_region ch;
		ch.rank = rank;
		for (int d = 0; d < rank; d++) {
			ch.start[d] = g[d] * cs[d];
			ch.stop[d] = ch.start[d] + cs[d];
		}
		ckpt_rpart sub;
		int rc = ckpt_rtensor_clip(t, pi, &ch, &sub);
		clip_chunks++;
		if (rc < 0) {
			CHECK_EQ_INT(rc, -ENOTSUP);
			break;
		}
		if (rc == 1) {
			fill_region(s0, rank, ch.start, cs, add, is, cb);
			ckpt_rpart_gather(t, &sub, &ch, cb, e0, e1, got);
		}
		int d = rank - 1;
		for (; d >= 0; d--) {
			if (++g[d] <= hi[d])
				break;
			g[d] = lo[d];
		}
		if (d < 0) {
			free(cb);
			return 0;
		}
	}
	free(cb);
	clip_fallbacks++;
	uint64_t bc = 1;
	for (int d = 0; d < rank; d++)
		bc *= bshape[d] = box.stop[d] - box.start[d];
	uint8_t *bb = malloc(bc * is);
	fill_region(s0, rank, box.start, bshape, add, is, bb);
	ckpt_rtensor_gather(t, pi, &box, bb, e0, e1, got);
	free(bb);
	return 1;
}

/* out = op(in); returns 0, or -1 when the op does not apply. */
static int eager(struct dense *x, int kind, const int64_t *a)
{
	struct dense y = *x;
	uint64_t n = dcount(x), idx[8], jdx[8];
	if (kind == 0) { /* take(a0, a1) */
		for (int d = (int)a[0]; d < x->rank - 1; d++)
			y.shape[d] = x->shape[d + 1];
		y.rank--;
	} else if (kind == 1) { /* slice(a0, a1, a2) */
		y.shape[a[0]] = (uint64_t)(a[2] - a[1]);
	} else if (kind == 2) { /* transpose(a...) */
		for (int d = 0; d < x->rank; d++)
			y.shape[d] = x->shape[a[d]];
	} else if (kind == 3) { /* pad(a0, a1) */
		y.shape[a[0]] = (uint64_t)a[1];
	}
	uint64_t m = dcount(&y);
	y.v = calloc(m ? m : 1, sizeof(int64_t));
	for (uint64_t e = 0; e < m; e++) {
		unrav(y.shape, y.rank, e, idx);
		int64_t val = 0;
		if (kind == 0) {
			for (int d = 0, k = 0; d < x->rank; d++)
				jdx[d] = d == a[0] ? (uint64_t)a[1] : idx[k++];
			val = x->v[rav(x->shape, x->rank, jdx)];
		} else if (kind == 1) {
			memcpy(jdx, idx, sizeof(jdx));
			jdx[a[0]] += (uint64_t)a[1];
			val = x->v[rav(x->shape, x->rank, jdx)];
		} else if (kind == 2) {
			for (int d = 0; d < x->rank; d++)
				jdx[a[d]] = idx[d];
			val = x->v[rav(x->shape, x->rank, jdx)];
		} else if (kind == 3) {
			memcpy(jdx, idx, sizeof(jdx));
			val = idx[a[0]] < x->shape[a[0]] ? x->v[rav(x->shape, x->rank, jdx)] : 0;
		}
		y.v[e] = val;
	}
	(void)n;
	free(x->v);
	*x = y;
	return 0;
}

static int chains_tested, chains_refused, chains_region;

/* One random chain over source [4,3,6] (and a concat of two of them). */
static void one_chain(uint64_t *seed)
{
	uint64_t s0[3] = { 4, 3, 6 };
	int two = check_rnd(seed) % 3 == 0;
	struct dense x = { 3, { 4, 3, 6 }, NULL };
	x.v = malloc(72 * sizeof(int64_t));
	for (int i = 0; i < 72; i++)
		x.v[i] = i + 1;
	char ops[2048] = "";
	size_t ol = 0;
	if (two) { /* concat of b and c on a random axis: c's values are offset by 1000 */
		int ax = (int)(check_rnd(seed) % 3);
		struct dense y = x;
		y.shape[ax] *= 2;
		y.v = malloc(144 * sizeof(int64_t));
		uint64_t idx[8];
		for (uint64_t e = 0; e < 144; e++) {
			unrav(y.shape, 3, e, idx);
			int second = idx[ax] >= s0[ax];
			if (second)
				idx[ax] -= s0[ax];
			y.v[e] = (int64_t)rav(s0, 3, idx) + 1 + (second ? 1000 : 0);
		}
		free(x.v);
		x = y;
		ol += (size_t)snprintf(ops + ol, sizeof(ops) - ol, "[\"concat\", %d]", ax);
	}
	int nops = 1 + (int)(check_rnd(seed) % 5);
	for (int k = 0; k < nops; k++) {
		int kind = (int)(check_rnd(seed) % 5);
		int64_t a[8];
		char txt[256];
		if (kind == 0 && x.rank > 1) {
			a[0] = (int64_t)(check_rnd(seed) % (uint64_t)x.rank);
			a[1] = (int64_t)(check_rnd(seed) % x.shape[a[0]]);
			snprintf(txt, sizeof(txt), "[\"take\", %lld, %lld]", (long long)a[0],
				 (long long)a[1]);
		} else if (kind == 1) {
			a[0] = (int64_t)(check_rnd(seed) % (uint64_t)x.rank);
			if (x.shape[a[0]] < 2)
				continue;
			a[1] = (int64_t)(check_rnd(seed) % (x.shape[a[0]] - 1));
			a[2] = a[1] + 1 + (int64_t)(check_rnd(seed) % (x.shape[a[0]] - (uint64_t)a[1]));
			snprintf(txt, sizeof(txt), "[\"slice\", %lld, %lld, %lld]", (long long)a[0],
				 (long long)a[1], (long long)a[2]);
		} else if (kind == 2) {
			for (int d = 0; d < x.rank; d++)
				a[d] = d;
			for (int d = x.rank - 1; d > 0; d--) {
				int j = (int)(check_rnd(seed) % (uint64_t)(d + 1));
				int64_t t = a[d];
				a[d] = a[j];
				a[j] = t;
			}
			int w = snprintf(txt, sizeof(txt), "[\"transpose\"");
			for (int d = 0; d < x.rank; d++)
				w += snprintf(txt + w, sizeof(txt) - (size_t)w, ", %lld", (long long)a[d]);
			snprintf(txt + w, sizeof(txt) - (size_t)w, "]");
		} else if (kind == 3) {
			a[0] = (int64_t)(check_rnd(seed) % (uint64_t)x.rank);
			a[1] = (int64_t)x.shape[a[0]] + (int64_t)(check_rnd(seed) % 3);
			snprintf(txt, sizeof(txt), "[\"pad\", %lld, %lld]", (long long)a[0], (long long)a[1]);
		} else {
			/* reshape: split a dim into factors or merge two adjacent ones */
			uint64_t ns[8];
			int nr = 0, d = (int)(check_rnd(seed) % (uint64_t)x.rank);
			int merge = d + 1 < x.rank && check_rnd(seed) % 2;
			for (int i = 0; i < x.rank; i++) {
				if (merge && i == d) {
					ns[nr++] = x.shape[i] * x.shape[i + 1];
					i++;
				} else if (!merge && i == d && x.shape[i] % 2 == 0 && x.rank < 6) {
					ns[nr++] = x.shape[i] / 2;
					ns[nr++] = 2;
				} else {
					ns[nr++] = x.shape[i];
				}
			}
			int w = snprintf(txt, sizeof(txt), "[\"reshape\"");
			for (int i = 0; i < nr; i++)
				w += snprintf(txt + w, sizeof(txt) - (size_t)w, ", %llu",
					      (unsigned long long)ns[i]);
			snprintf(txt + w, sizeof(txt) - (size_t)w, "]");
			/* eager reshape: only the shape changes (C order) */
			char full[4096];
			snprintf(full, sizeof(full), "%s%s%s", ops, ol ? ", " : "", txt);
			(void)full;
			uint64_t before = dcount(&x);
			x.rank = nr;
			memcpy(x.shape, ns, sizeof(ns));
			if (dcount(&x) != before)
				abort();
			ol += (size_t)snprintf(ops + ol, sizeof(ops) - ol, "%s%s", ol ? ", " : "", txt);
			continue;
		}
		if (kind == 0 && x.rank <= 1)
			continue;
		eager(&x, kind, a);
		ol += (size_t)snprintf(ops + ol, sizeof(ops) - ol, "%s%s", ol ? ", " : "", txt);
	}
	char text[4096];
	snprintf(text, sizeof(text),
		 "{\"ckptfs_recipe\": 1, \"name\": \"t\", \"tensors\": [{\"name\": \"out\", \"from\": %s, "
		 "\"ops\": [%s]}]}",
		 two ? "[\"b\", \"c\"]" : "\"b\"", ops);
	ckpt_recipe *r;
	char why[256] = "";
	int rc = ckpt_recipe_parse(text, strlen(text), &r, why, sizeof(why));
	CHECK_EQ_INT(rc, 0);
	if (rc) {
		fprintf(stderr, "%s: %s\n", text, why);
		free(x.v);
		return;
	}
	ckpt_recipe_src src[2] = { { "b", CKPT_DT_INT64, 3, s0 }, { "c", CKPT_DT_INT64, 3, s0 } };
	ckpt_rplan *p;
	rc = ckpt_recipe_plan(r, src, 2, &p, why, sizeof(why));
	if (rc == -EINVAL && strstr(why, "cannot express")) {
		/* a pad or concat boundary that a later reshape crosses, or a
		 * slice of a split dim: refused, never wrong */
		chains_refused++;
		ckpt_recipe_free(r);
		free(x.v);
		return;
	}
	if (rc == -EINVAL && strstr(why, "boundary")) {
		chains_refused++;
		ckpt_recipe_free(r);
		free(x.v);
		return;
	}
	CHECK_EQ_INT(rc, 0);
	if (rc) {
		fprintf(stderr, "%s: %s\n", text, why);
		ckpt_recipe_free(r);
		free(x.v);
		return;
	}
	const ckpt_rtensor *t = ckpt_rplan_tensor(p, 0);
	chains_tested++;
	CHECK_EQ_INT(t->rank, x.rank);
	for (int d = 0; d < x.rank && d < t->rank; d++)
		CHECK_EQ_INT(t->shape[d], x.shape[d]);
	uint64_t n = dcount(&x);
	ckpt_region reg;
	if (t->nparts == 1 && ckpt_rtensor_region(t, 0, &reg)) {
		/* a plain region: its C-order stream is the target */
		uint64_t rs[8], idx[8], cnt = 1;
		for (int d = 0; d < reg.rank; d++)
			cnt *= rs[d] = reg.stop[d] - reg.start[d];
		int same = cnt == n;
		for (uint64_t e = 0; same && e < n; e++) {
			unrav(rs, reg.rank, e, idx);
			for (int d = 0; d < reg.rank; d++)
				idx[d] += reg.start[d];
			same = x.v[e] == (int64_t)rav(s0, 3, idx) + 1 + (t->parts[0].input ? 1000 : 0);
		}
		CHECK(same);
		chains_region++;
	}
	/* source values: flat index + 1 (c: + 1000) */
	int64_t sv[2][72];
	for (int i = 0; i < 72; i++) {
		sv[0][i] = i + 1;
		sv[1][i] = i + 1001;
	}
	for (int trial = 0; trial < 6 && n; trial++) {
		uint64_t e0 = check_rnd(seed) % n, e1 = e0 + 1 + check_rnd(seed) % (n - e0);
		if (trial == 0) {
			e0 = 0;
			e1 = n;
		}
		int64_t *got = calloc(e1 - e0, sizeof(int64_t));
		for (size_t pi = 0; pi < t->nparts; pi++) {
			ckpt_region box;
			if (!ckpt_rtensor_box(t, pi, e0, e1, &box))
				continue;
			uint64_t bc = 1;
			for (int d = 0; d < box.rank; d++) {
				CHECK(box.start[d] < box.stop[d] && box.stop[d] <= s0[d]);
				bc *= box.stop[d] - box.start[d];
			}
			int64_t *bb = malloc(bc * sizeof(int64_t));
			uint64_t idx[8], jdx[8], bshape[8];
			for (int d = 0; d < box.rank; d++)
				bshape[d] = box.stop[d] - box.start[d];
			for (uint64_t e = 0; e < bc; e++) {
				unrav(bshape, box.rank, e, idx);
				for (int d = 0; d < box.rank; d++)
					jdx[d] = idx[d] + box.start[d];
				bb[e] = sv[t->parts[pi].input][rav(s0, 3, jdx)];
			}
			ckpt_rtensor_gather(t, pi, &box, bb, e0, e1, got);
			free(bb);
		}
		int same = 1;
		for (uint64_t e = e0; e < e1; e++)
			same &= got[e - e0] == x.v[e];
		CHECK(same);
		if (!same)
			fprintf(stderr, "lazy != eager: %s, elements [%llu, %llu)\n", text,
				(unsigned long long)e0, (unsigned long long)e1);
		/* again chunk by chunk, over a random chunk grid of the sources */
		uint64_t cs[3];
		for (int d = 0; d < 3; d++)
			cs[d] = 1 + check_rnd(seed) % s0[d];
		memset(got, 0, (e1 - e0) * sizeof(int64_t));
		for (size_t pi = 0; pi < t->nparts; pi++)
			chunked_gather(t, pi, s0, cs, t->parts[pi].input ? 1001 : 1, 8, e0, e1,
				       (uint8_t *)got);
		same = 1;
		for (uint64_t e = e0; e < e1; e++)
			same &= got[e - e0] == x.v[e];
		CHECK(same);
		if (!same)
			fprintf(stderr,
				"chunked != eager: %s, elements [%llu, %llu), chunks %llu %llu %llu\n", text,
				(unsigned long long)e0, (unsigned long long)e1, (unsigned long long)cs[0],
				(unsigned long long)cs[1], (unsigned long long)cs[2]);
		free(got);
	}
	ckpt_rplan_free(p);
	ckpt_recipe_free(r);
	free(x.v);
}

static void test_lazy_vs_eager(void)
{
	uint64_t seed = 0x5eed31;
	for (int i = 0; i < 3000; i++)
		one_chain(&seed);
	/* most chains are expressible: the comparison is not vacuous */
	CHECK(chains_tested > 2000);
	CHECK(chains_region > 100); /* plain regions met too */
	/* most chunks are gathered straight from the chunk */
	CHECK(clip_chunks > 10000 && clip_fallbacks * 10 < clip_chunks);
	fprintf(stderr,
		"lazy vs eager: %d chains compared (%d plain regions), %d refused; chunk by chunk: %d "
		"chunks, %d reads fell back to the box\n",
		chains_tested, chains_region, chains_refused, clip_chunks, clip_fallbacks);
}

/* ---- transposes of 2- and 4-byte elements ------------------------------------ */

/* Element i of got (is bytes each) holds the low is bytes of v. */
static int holds_low(const uint8_t *got, uint64_t i, unsigned is, uint64_t v)
{
	uint64_t w = 0;
	memcpy(&w, got + i * is, is);
	return w == (v & (is == 2 ? 0xffffu : 0xffffffffu));
}

/* A scan-stacked kernel (E, L, F) taken at one layer and transposed to
 * (F, E), as the Hugging Face views do, for element widths 2 and 4 (the
 * widths the gather moves in register blocks) and shapes with and without
 * whole 8x8 blocks, over the whole tensor and random element ranges:
 * every element equals the source element it names. */
static void one_transpose(ckpt_dtype dt, unsigned is, uint64_t E, uint64_t L, uint64_t F, uint64_t *seed)
{
	uint64_t s0[3] = { E, L, F };
	uint64_t l = check_rnd(seed) % L;
	char text[512];
	snprintf(text, sizeof(text),
		 "{\"ckptfs_recipe\": 1, \"name\": \"t\", \"tensors\": [{\"name\": \"out\", "
		 "\"from\": \"b\", \"ops\": [[\"take\", 1, %llu], [\"transpose\", 1, 0]]}]}",
		 (unsigned long long)l);
	ckpt_recipe *r;
	char why[256] = "";
	CHECK_EQ_INT(ckpt_recipe_parse(text, strlen(text), &r, why, sizeof(why)), 0);
	ckpt_recipe_src src[1] = { { "b", dt, 3, s0 } };
	ckpt_rplan *p;
	CHECK_EQ_INT(ckpt_recipe_plan(r, src, 1, &p, why, sizeof(why)), 0);
	const ckpt_rtensor *t = ckpt_rplan_tensor(p, 0);
	uint64_t n = F * E;
	for (int trial = 0; trial < 8; trial++) {
		uint64_t e0 = check_rnd(seed) % n, e1 = e0 + 1 + check_rnd(seed) % (n - e0);
		if (trial < 2) {
			e0 = 0;
			e1 = n;
		}
		ckpt_region box;
		CHECK(ckpt_rtensor_box(t, 0, e0, e1, &box));
		uint64_t bs[3], bc = 1, cs[3];
		for (int d = 0; d < 3; d++) /* odd trials: chunk by chunk over this grid */
			cs[d] = 1 + check_rnd(seed) % s0[d];
		for (int d = 0; d < 3; d++)
			bc *= bs[d] = box.stop[d] - box.start[d];
		uint8_t *bb = malloc(bc * is), *got = calloc(e1 - e0, is);
		/* box element (i, j, k) holds the low bytes of its source index */
		for (uint64_t i = 0; i < bs[0]; i++)
			for (uint64_t j = 0; j < bs[1]; j++)
				for (uint64_t k = 0; k < bs[2]; k++) {
					uint64_t v = ((i + box.start[0]) * L + j + box.start[1]) * F + k +
						     box.start[2];
					memcpy(bb + ((i * bs[1] + j) * bs[2] + k) * is, &v, is);
				}
		if (trial & 1)
			chunked_gather(t, 0, s0, cs, 0, is, e0, e1, got);
		else
			ckpt_rtensor_gather(t, 0, &box, bb, e0, e1, got);
		int same = 1;
		for (uint64_t e = e0; e < e1 && same; e++) {
			uint64_t f = e / E, x = e % E;
			same = holds_low(got, e - e0, is, (x * L + l) * F + f);
			if (!same)
				fprintf(stderr, "transpose width %u (%llu, %llu, %llu): element %llu\n", is,
					(unsigned long long)E, (unsigned long long)L, (unsigned long long)F,
					(unsigned long long)e);
		}
		CHECK(same);
		free(bb);
		free(got);
	}
	ckpt_rplan_free(p);
	ckpt_recipe_free(r);
}

/* Heads merged after a transpose, as o_proj: (H, L, D, E) taken at one
 * layer, transposed to (E, H, D) and reshaped to (E, H*D): a row's last
 * dimension is two source factors. */
static void one_merge(ckpt_dtype dt, unsigned is, uint64_t H, uint64_t L, uint64_t D, uint64_t E,
		      uint64_t *seed)
{
	uint64_t s0[4] = { H, L, D, E };
	uint64_t l = check_rnd(seed) % L;
	char text[512];
	snprintf(text, sizeof(text),
		 "{\"ckptfs_recipe\": 1, \"name\": \"t\", \"tensors\": [{\"name\": \"out\", "
		 "\"from\": \"b\", \"ops\": [[\"take\", 1, %llu], [\"transpose\", 2, 0, 1], "
		 "[\"reshape\", %llu, %llu]]}]}",
		 (unsigned long long)l, (unsigned long long)E, (unsigned long long)(H * D));
	ckpt_recipe *r;
	char why[256] = "";
	CHECK_EQ_INT(ckpt_recipe_parse(text, strlen(text), &r, why, sizeof(why)), 0);
	ckpt_recipe_src src[1] = { { "b", dt, 4, s0 } };
	ckpt_rplan *p;
	CHECK_EQ_INT(ckpt_recipe_plan(r, src, 1, &p, why, sizeof(why)), 0);
	const ckpt_rtensor *t = ckpt_rplan_tensor(p, 0);
	uint64_t n = E * H * D;
	for (int trial = 0; trial < 8; trial++) {
		uint64_t e0 = check_rnd(seed) % n, e1 = e0 + 1 + check_rnd(seed) % (n - e0);
		if (trial < 2) {
			e0 = 0;
			e1 = n;
		}
		ckpt_region box;
		CHECK(ckpt_rtensor_box(t, 0, e0, e1, &box));
		uint64_t bs[4], bc = 1, cs[4];
		for (int d = 0; d < 4; d++) /* odd trials: chunk by chunk over this grid */
			cs[d] = 1 + check_rnd(seed) % s0[d];
		for (int d = 0; d < 4; d++)
			bc *= bs[d] = box.stop[d] - box.start[d];
		uint8_t *bb = malloc(bc * is), *got = calloc(e1 - e0, is);
		uint64_t i[4];
		for (uint64_t e = 0; e < bc; e++) {
			uint64_t r2 = e;
			for (int d = 3; d >= 0; d--) {
				i[d] = r2 % bs[d] + box.start[d];
				r2 /= bs[d];
			}
			uint64_t v = ((i[0] * L + i[1]) * D + i[2]) * E + i[3];
			memcpy(bb + e * is, &v, is);
		}
		if (trial & 1)
			chunked_gather(t, 0, s0, cs, 0, is, e0, e1, got);
		else
			ckpt_rtensor_gather(t, 0, &box, bb, e0, e1, got);
		int same = 1;
		for (uint64_t e = e0; e < e1 && same; e++) {
			uint64_t x = e / (H * D), hd = e % (H * D), h = hd / D, d = hd % D;
			same = holds_low(got, e - e0, is, ((h * L + l) * D + d) * E + x);
			if (!same)
				fprintf(stderr, "merge width %u (%llu, %llu, %llu, %llu): element %llu\n", is,
					(unsigned long long)H, (unsigned long long)L, (unsigned long long)D,
					(unsigned long long)E, (unsigned long long)e);
		}
		CHECK(same);
		free(bb);
		free(got);
	}
	ckpt_rplan_free(p);
	ckpt_recipe_free(r);
}

/* A query kernel (E, L, H, D) taken at one layer, its D axis permuted
 * from interleaved pairs to halves (D -> (D/2, 2) -> (2, D/2) -> D, the
 * RoPE permutation of the Llama converters), transposed to (H, D, E) and
 * reshaped to (H*D, E): target rows of one half are every other source
 * element (row step 2 in the register blocks). */
static void one_rope(ckpt_dtype dt, unsigned is, uint64_t E, uint64_t L, uint64_t H, uint64_t D,
		     uint64_t *seed)
{
	uint64_t s0[4] = { E, L, H, D };
	uint64_t l = check_rnd(seed) % L;
	char text[768];
	snprintf(text, sizeof(text),
		 "{\"ckptfs_recipe\": 1, \"name\": \"t\", \"tensors\": [{\"name\": \"out\", "
		 "\"from\": \"b\", \"ops\": [[\"take\", 1, %llu], [\"reshape\", %llu, %llu, %llu, 2], "
		 "[\"transpose\", 1, 3, 2, 0], [\"reshape\", %llu, %llu]]}]}",
		 (unsigned long long)l, (unsigned long long)E, (unsigned long long)H,
		 (unsigned long long)(D / 2), (unsigned long long)(H * D), (unsigned long long)E);
	ckpt_recipe *r;
	char why[256] = "";
	CHECK_EQ_INT(ckpt_recipe_parse(text, strlen(text), &r, why, sizeof(why)), 0);
	ckpt_recipe_src src[1] = { { "b", dt, 4, s0 } };
	ckpt_rplan *p;
	int rc = ckpt_recipe_plan(r, src, 1, &p, why, sizeof(why));
	CHECK_EQ_INT(rc, 0);
	if (rc) {
		fprintf(stderr, "%s: %s\n", text, why);
		ckpt_recipe_free(r);
		return;
	}
	const ckpt_rtensor *t = ckpt_rplan_tensor(p, 0);
	uint64_t n = H * D * E;
	for (int trial = 0; trial < 8; trial++) {
		uint64_t e0 = check_rnd(seed) % n, e1 = e0 + 1 + check_rnd(seed) % (n - e0);
		if (trial < 2) {
			e0 = 0;
			e1 = n;
		}
		uint64_t cs[4];
		for (int d = 0; d < 4; d++)
			cs[d] = trial & 1 ? 1 + check_rnd(seed) % s0[d] : s0[d]; /* even: one chunk */
		uint8_t *got = calloc(e1 - e0, is);
		chunked_gather(t, 0, s0, cs, 0, is, e0, e1, got);
		int same = 1;
		for (uint64_t e = e0; e < e1 && same; e++) {
			uint64_t row = e / E, x = e % E, h = row / D, dd = row % D;
			uint64_t d = dd < D / 2 ? 2 * dd : 2 * (dd - D / 2) + 1;
			same = holds_low(got, e - e0, is, ((x * L + l) * H + h) * D + d);
			if (!same)
				fprintf(stderr, "rope width %u (%llu, %llu, %llu, %llu): element %llu\n", is,
					(unsigned long long)E, (unsigned long long)L, (unsigned long long)H,
					(unsigned long long)D, (unsigned long long)e);
		}
		CHECK(same);
		free(got);
	}
	ckpt_rplan_free(p);
	ckpt_recipe_free(r);
}

static void test_transpose_widths(void)
{
	/* the last two: batches of up to 256 rows, tiles of 64 or 32 columns
	 * and what is left of both */
	static const uint64_t shapes[][3] = { { 64, 2, 128 }, { 37, 3, 45 },   { 8, 1, 8 },
					      { 9, 4, 17 },   { 256, 1, 40 },  { 5, 2, 300 },
					      { 128, 3, 64 }, { 300, 2, 520 }, { 70, 1, 264 } };
	uint64_t seed = 0x7a11;
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
		one_transpose(CKPT_DT_BFLOAT16, 2, shapes[i][0], shapes[i][1], shapes[i][2], &seed);
		one_transpose(CKPT_DT_FLOAT32, 4, shapes[i][0], shapes[i][1], shapes[i][2], &seed);
	}
	static const uint64_t heads[][4] = {
		{ 4, 2, 8, 64 }, { 3, 3, 5, 37 }, { 2, 1, 16, 8 }, { 5, 2, 3, 100 }
	};
	for (size_t i = 0; i < sizeof(heads) / sizeof(heads[0]); i++) {
		one_merge(CKPT_DT_BFLOAT16, 2, heads[i][0], heads[i][1], heads[i][2], heads[i][3], &seed);
		one_merge(CKPT_DT_FLOAT32, 4, heads[i][0], heads[i][1], heads[i][2], heads[i][3], &seed);
	}
	static const uint64_t ropes[][4] = {
		{ 64, 2, 4, 32 }, { 37, 3, 3, 16 }, { 16, 1, 2, 64 }, { 40, 2, 5, 6 }
	};
	for (size_t i = 0; i < sizeof(ropes) / sizeof(ropes[0]); i++) {
		one_rope(CKPT_DT_BFLOAT16, 2, ropes[i][0], ropes[i][1], ropes[i][2], ropes[i][3], &seed);
		one_rope(CKPT_DT_FLOAT32, 4, ropes[i][0], ropes[i][1], ropes[i][2], ropes[i][3], &seed);
	}
}

/* ---- rounding ----------------------------------------------------------------- */

static float f_of(uint32_t b)
{
	float f;
	memcpy(&f, &b, 4);
	return f;
}

static void test_rounding(void)
{
	CHECK_EQ_INT(ckpt_f32_to_bf16(1.0f), 0x3f80);
	CHECK_EQ_INT(ckpt_f32_to_bf16(1.00390625f), 0x3f80); /* tie: to even */
	CHECK_EQ_INT(ckpt_f32_to_bf16(1.01171875f), 0x3f82); /* tie: to even (up) */
	CHECK_EQ_INT(ckpt_f32_to_bf16(f_of(0x3f808001u)), 0x3f81); /* past the tie */
	CHECK_EQ_INT(ckpt_f32_to_bf16(-INFINITY), 0xff80);
	CHECK((ckpt_f32_to_bf16(NAN) & 0x7f80) == 0x7f80 && (ckpt_f32_to_bf16(NAN) & 0x7f) != 0);
	CHECK_EQ_INT(ckpt_f32_to_bf16(f_of(0x7f7fffffu)), 0x7f80); /* max float rounds to inf */
	CHECK_EQ_INT(ckpt_f32_to_f16(1.0f), 0x3c00);
	CHECK_EQ_INT(ckpt_f32_to_f16(65504.0f), 0x7bff);
	CHECK_EQ_INT(ckpt_f32_to_f16(65519.0f), 0x7bff);
	CHECK_EQ_INT(ckpt_f32_to_f16(65520.0f), 0x7c00);
	CHECK_EQ_INT(ckpt_f32_to_f16(-1e10f), 0xfc00);
	CHECK_EQ_INT(ckpt_f32_to_f16(ldexpf(1, -24)), 0x0001);
	CHECK_EQ_INT(ckpt_f32_to_f16(ldexpf(1, -25)), 0x0000); /* tie: to even (0) */
	CHECK_EQ_INT(ckpt_f32_to_f16(ldexpf(1.5f, -24)), 0x0002); /* tie: to even (2) */
	CHECK_EQ_INT(ckpt_f32_to_f16(ldexpf(1, -14)), 0x0400);
	CHECK_EQ_INT(ckpt_f32_to_f16(ldexpf(1023.5f, -24)), 0x0400); /* rounds up into the normals */
	CHECK_EQ_INT(ckpt_f32_to_f16(1.0f + ldexpf(1, -11)), 0x3c00); /* tie: to even */
	CHECK_EQ_INT(ckpt_f32_to_f16(1.0f + ldexpf(3, -11)), 0x3c02);
	CHECK_EQ_INT(ckpt_f32_to_f16(-0.0f), 0x8000);
	/* affine in float32: one rounding per operation, then one to the output */
	ckpt_rtensor t = { 0 };
	t.src_dtype = CKPT_DT_FLOAT32;
	t.dtype = CKPT_DT_BFLOAT16;
	t.elem = 1;
	t.scale = sqrt(128.0);
	t.bias = 0;
	float in[3] = { 1.0f, -0.5f, 3.0f };
	uint16_t out[3];
	CHECK_EQ_INT(ckpt_rtensor_convert(&t, in, 3, out), 0);
	for (int i = 0; i < 3; i++)
		CHECK_EQ_INT(out[i], ckpt_f32_to_bf16(in[i] * (float)sqrt(128.0)));
	t.dtype = CKPT_DT_FLOAT32;
	t.scale = 1;
	t.bias = -1;
	float o2[3];
	CHECK_EQ_INT(ckpt_rtensor_convert(&t, in, 3, o2), 0);
	CHECK(o2[0] == 0.0f && o2[1] == -1.5f && o2[2] == 2.0f);
	t.src_dtype = CKPT_DT_INT32;
	CHECK_EQ_INT(ckpt_rtensor_convert(&t, in, 3, o2), -ENOTSUP);

	/* bfloat16 to bfloat16 runs 8 at a time where the CPU has vectors:
	 * the same bits as one element at a time, over every bfloat16 value
	 * (NaNs, infinities, subnormals) and each op mix */
	static uint16_t all[65536 + 5], v8[65536 + 5], v1[65536 + 5];
	for (uint32_t i = 0; i < 65536 + 5; i++)
		all[i] = (uint16_t)(i * 40503u);
	static const double mix[][3] = { { 11.313708498984761, 0, 0 },
					 { 1, 0, 45.254833995939045 },
					 { 1, -1, 0 },
					 { 0.125, 1, 3 },
					 { 1e30, 0, 0 },
					 { 1e-30, 0, 0 } };
	t.src_dtype = t.dtype = CKPT_DT_BFLOAT16;
	for (size_t m = 0; m < sizeof(mix) / sizeof(mix[0]); m++) {
		t.scale = mix[m][0];
		t.bias = mix[m][1];
		t.divisor = mix[m][2];
		CHECK_EQ_INT(ckpt_rtensor_convert(&t, all, 65536 + 5, v8), 0);
		for (uint32_t i = 0; i < 65536 + 5; i++)
			ckpt_rtensor_convert(&t, all + i, 1, v1 + i);
		int same = memcmp(v8, v1, sizeof(v8)) == 0;
		CHECK(same);
		if (!same)
			fprintf(stderr, "vector affine differs, scale %g bias %g divisor %g\n", t.scale,
				t.bias, t.divisor);
	}
}

int main(void)
{
	CHECK_RUN(test_refused);
	CHECK_RUN(test_mismatch);
	CHECK_RUN(test_group_absent);
	CHECK_RUN(test_lazy_vs_eager);
	CHECK_RUN(test_transpose_widths);
	CHECK_RUN(test_rounding);
	return CHECK_DONE();
}
