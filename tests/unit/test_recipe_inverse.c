/*
 * test_recipe_inverse.c - view recipes the other way (recipe.h, "the other
 * way"): which recipes invert; source arrays solved from target tensors and
 * config.json, scattered back and gathered forward again to the same bytes;
 * the errors that name a missing, unknown or misshapen tensor; and the
 * bound of the inverse of a scale, over every finite bfloat16 and float16
 * value and a sweep of float32 ones.
 */
#include <errno.h>
#include <math.h>

#include "check.h"
#include "recipe.h"

/* E 4, L 3, H 2, D 2: a scanned query kernel [E, L, H, D] -> per layer
 * [H*D, E], scaled by sqrt(D); norms [E, L] -> [E]; an embedding aliased. */
static const char *const RECIPE =
	"{\"ckptfs_recipe\": 1, \"name\": \"t\", \"prefixes\": [\"p.\"], \"tensors\": ["
	"{\"name\": \"emb\", \"from\": \"emb\", \"shape\": [\"V\", \"E\"]},"
	"{\"name\": \"tied\", \"alias\": \"emb\"},"
	"{\"name\": \"l.{l}.norm\", \"from\": \"dec.norm\", \"shape\": [\"E\", \"L\"], \"for\": {\"l\": "
	"\"L\"},"
	" \"ops\": [[\"take\", 1, \"l\"]]},"
	"{\"name\": \"l.{l}.q\", \"from\": \"dec.q\", \"shape\": [\"E\", \"L\", \"H\", \"D\"], \"for\": "
	"{\"l\": \"L\"},"
	" \"ops\": [[\"take\", 1, \"l\"], [\"transpose\", 1, 2, 0], [\"reshape\", \"H*D\", \"E\"],"
	" [\"affine\", \"sqrt(D)\"]]}],"
	" \"files\": [{\"name\": \"config.json\", \"json\": {\"heads\": \"{H}\", \"layers\": \"{L}\"}}]}";

enum { E = 4, L = 3, H = 2, D = 2, V = 5 };

static const uint64_t s_emb[] = { V, E }, s_norm[] = { E }, s_q[] = { H * D, E };

static int parse(const char *text, ckpt_recipe **r)
{
	char why[256] = "";
	int rc = ckpt_recipe_parse(text, strlen(text), r, why, sizeof(why));
	if (rc)
		fprintf(stderr, "parse: %s\n", why);
	return rc;
}

/* The target folder: emb, tied, and per layer norm and q (float32). */
static size_t targets(ckpt_recipe_target *t, char names[][32])
{
	size_t n = 0;
	t[n++] = (ckpt_recipe_target){ "emb", CKPT_DT_FLOAT32, 2, s_emb };
	t[n++] = (ckpt_recipe_target){ "tied", CKPT_DT_FLOAT32, 2, s_emb };
	for (int l = 0; l < L; l++) {
		snprintf(names[2 * l], 32, "l.%d.norm", l);
		snprintf(names[2 * l + 1], 32, "l.%d.q", l);
		t[n++] = (ckpt_recipe_target){ names[2 * l], CKPT_DT_FLOAT32, 1, s_norm };
		t[n++] = (ckpt_recipe_target){ names[2 * l + 1], CKPT_DT_FLOAT32, 2, s_q };
	}
	return n;
}

static const ckpt_recipe_src *src_named(const ckpt_rinverse *x, const char *name)
{
	for (size_t i = 0; i < ckpt_rinverse_nsrc(x); i++)
		if (!strcmp(ckpt_rinverse_src(x, i)->name, name))
			return ckpt_rinverse_src(x, i);
	return NULL;
}

static void test_solve_and_scatter(void)
{
	ckpt_recipe *r;
	CHECK_EQ_INT(parse(RECIPE, &r), 0);
	char why[512] = "";
	CHECK_EQ_INT(ckpt_recipe_invertible(r, why, sizeof(why)), 0);
	ckpt_recipe_target t[2 + 2 * L];
	char names[2 * L][32];
	size_t nt = targets(t, names);
	/* H cannot be told from [H*D, E] alone, nor D: config.json names H */
	ckpt_rinverse *x = NULL;
	int rc = ckpt_recipe_invert(r, t, nt, NULL, 0, &x, why, sizeof(why));
	CHECK_EQ_INT(rc, -EINVAL);
	CHECK(strstr(why, "not told by the tensors or config.json") != NULL);
	const char *cfg = "{\"heads\": 2, \"layers\": 3, \"other\": \"ignored\"}";
	rc = ckpt_recipe_invert(r, t, nt, cfg, strlen(cfg), &x, why, sizeof(why));
	CHECK_EQ_INT(rc, 0);
	if (rc) {
		fprintf(stderr, "invert: %s\n", why);
		ckpt_recipe_free(r);
		return;
	}
	CHECK_EQ_INT((int)ckpt_rinverse_nsrc(x), 3);
	const ckpt_recipe_src *q = src_named(x, "items.p.dec.q"), *nm = src_named(x, "items.p.dec.norm");
	CHECK(q && q->rank == 4 && q->shape[0] == E && q->shape[1] == L && q->shape[2] == H &&
	      q->shape[3] == D);
	CHECK(nm && nm->rank == 2 && nm->shape[0] == E && nm->shape[1] == L);
	CHECK(src_named(x, "items.p.emb") != NULL);
	/* source arrays of known values; gather forward, scatter back: the same */
	const ckpt_rplan *p = ckpt_rinverse_plan(x);
	float qsrc[E * L * H * D], back[E * L * H * D];
	for (int i = 0; i < E * L * H * D; i++)
		qsrc[i] = (float)(i + 1) * 0.25f; /* scale by sqrt(2) and back: within an ulp */
	memset(back, 0, sizeof(back));
	int dups = 0;
	for (size_t i = 0; i < ckpt_rplan_count(p); i++) {
		const ckpt_rtensor *tt = ckpt_rplan_tensor(p, i);
		dups += ckpt_rinverse_dup_of(x, i) != SIZE_MAX;
		if (tt->parts[0].input != (size_t)(q - ckpt_rinverse_src(x, 0)))
			continue;
		uint64_t n = ckpt_rtensor_count(tt);
		float g[H * D * E], y[H * D * E], u[H * D * E], box[H * D * E];
		ckpt_region full = { .rank = 4, .start = { 0 }, .stop = { E, L, H, D } };
		ckpt_rtensor_gather(tt, 0, &full, qsrc, 0, n, g);
		CHECK_EQ_INT(ckpt_rtensor_convert(tt, g, (size_t)n, y), 0);
		CHECK_EQ_INT(ckpt_rtensor_unconvert(tt, y, (size_t)n, u), 0);
		ckpt_region b;
		CHECK(ckpt_rtensor_box(tt, 0, 0, n, &b));
		uint64_t bc = 1;
		for (int d = 0; d < b.rank; d++)
			bc *= b.stop[d] - b.start[d];
		CHECK(bc == n);
		ckpt_rtensor_scatter(tt, 0, &b, u, box);
		/* the box is one layer [E, 1, H, D] */
		CHECK(b.start[1] + 1 == b.stop[1]);
		for (int e = 0; e < E; e++)
			for (int h = 0; h < H * D; h++)
				back[(e * L + (int)b.start[1]) * H * D + h] = box[e * H * D + h];
	}
	CHECK_EQ_INT(dups, 1); /* tied repeats emb */
	int exact = 0, far = 0;
	for (int i = 0; i < E * L * H * D; i++) {
		exact += back[i] == qsrc[i];
		far += fabsf(back[i] - qsrc[i]) > nextafterf(qsrc[i], INFINITY) - qsrc[i];
	}
	CHECK_EQ_INT(far, 0);
	CHECK(exact > E * L * H * D / 2);
	ckpt_rinverse_free(x);

	/* a missing tensor, an unknown name, a wrong shape */
	t[3] = t[nt - 1]; /* l.0.q gone (and the last one twice: refused first) */
	rc = ckpt_recipe_invert(r, t, nt - 1, cfg, strlen(cfg), &x, why, sizeof(why));
	CHECK_EQ_INT(rc, -ENODATA);
	CHECK(strstr(why, "l.0.q is missing") != NULL);
	nt = targets(t, names);
	t[0].name = "embs";
	rc = ckpt_recipe_invert(r, t, nt, cfg, strlen(cfg), &x, why, sizeof(why));
	CHECK_EQ_INT(rc, -EINVAL);
	CHECK(strstr(why, "embs: recipe t makes no tensor of this name") != NULL);
	if (!strstr(why, "embs: recipe t"))
		fprintf(stderr, "unknown name: %s\n", why);
	nt = targets(t, names);
	static const uint64_t s_bad[] = { E - 1 };
	t[2].shape = s_bad;
	rc = ckpt_recipe_invert(r, t, nt, cfg, strlen(cfg), &x, why, sizeof(why));
	CHECK(rc == -EINVAL || rc == -ENODATA);
	ckpt_recipe_free(r);
}

static void test_refused_ops(void)
{
	static const char *const refused[] = {
		"{\"ckptfs_recipe\": 1, \"name\": \"t\", \"tensors\": [{\"name\": \"a\", \"from\": \"b\", "
		"\"shape\": [\"E\"], \"ops\": [[\"affine\", 1, -1]]}]}",
		"{\"ckptfs_recipe\": 1, \"name\": \"t\", \"tensors\": [{\"name\": \"a\", \"from\": \"b\", "
		"\"shape\": [\"E\"], \"ops\": [[\"cast\", \"float32\"]]}]}",
		"{\"ckptfs_recipe\": 1, \"name\": \"t\", \"tensors\": [{\"name\": \"a.{2*m}\", \"from\": "
		"\"b\", "
		"\"shape\": [\"E\", \"L\"], \"for\": {\"m\": \"L\"}, \"ops\": [[\"take\", 1, \"m\"]]}]}",
		"{\"ckptfs_recipe\": 1, \"name\": \"t\", \"tensors\": [{\"name\": \"a\", \"from\": \"b\"}]}",
	};
	for (size_t i = 0; i < sizeof(refused) / sizeof(*refused); i++) {
		ckpt_recipe *r;
		CHECK_EQ_INT(parse(refused[i], &r), 0);
		char why[256] = "";
		CHECK_EQ_INT(ckpt_recipe_invertible(r, why, sizeof(why)), -EOPNOTSUPP);
		CHECK(why[0] == 'a');
		ckpt_recipe_free(r);
	}
	ckpt_recipe *r;
	CHECK_EQ_INT(
		parse("{\"ckptfs_recipe\": 1, \"name\": \"t\", \"tensors\": [{\"name\": \"a\", \"from\": "
		      "\"b\", \"shape\": [\"E\"], \"ops\": [[\"affine\", 3, 0], [\"divide\", 7]]}]}",
		      &r),
		0);
	CHECK_EQ_INT(ckpt_recipe_invertible(r, NULL, 0), 0);
	ckpt_recipe_free(r);
}

static float f_of(uint32_t b)
{
	float f;
	memcpy(&f, &b, 4);
	return f;
}

static float h_value(ckpt_dtype dt, uint16_t h)
{
	ckpt_rtensor t = { 0 };
	float f;
	t.src_dtype = dt;
	t.dtype = CKPT_DT_FLOAT32;
	t.elem = 1;
	t.scale = 1;
	ckpt_rtensor_convert(&t, &h, 1, &f);
	return f;
}

/* Every finite 16-bit value x: y = forward(x), x' = inverse(y): |x' - x|
 * within one step of the source grid at x, and forward(x') == y. */
static void check_bound_16(ckpt_dtype dt, double scale, double divisor)
{
	ckpt_rtensor t = { 0 };
	t.src_dtype = t.dtype = dt;
	t.elem = 1;
	t.scale = scale;
	t.divisor = divisor;
	int bad = 0, again = 0, moved = 0, n = 0;
	for (uint32_t b = 0; b < 0x10000; b++) {
		uint16_t x = (uint16_t)b, y, x2, y2;
		float xv = h_value(dt, x);
		if (!isfinite(xv))
			continue;
		ckpt_rtensor_convert(&t, &x, 1, &y);
		unsigned expo = dt == CKPT_DT_BFLOAT16 ? (y >> 7) & 0xff : (y >> 10) & 0x1f;
		if (!isfinite(h_value(dt, y)) || (expo == 0 && xv != 0))
			continue; /* overflowed, or subnormal on the way out (documented) */
		n++;
		ckpt_rtensor_unconvert(&t, &y, 1, &x2);
		ckpt_rtensor_convert(&t, &x2, 1, &y2);
		again += y2 != y;
		moved += x2 != x;
		/* the distance in steps of the grid: bits of same-sign values */
		int dx = (int)(x & 0x7fff) - (int)(x2 & 0x7fff);
		if (((x ^ x2) & 0x8000) && (x & 0x7fff) && (x2 & 0x7fff))
			bad++;
		else if (dx > 1 || dx < -1)
			bad++;
	}
	CHECK_EQ_INT(bad, 0);
	CHECK_EQ_INT(again, 0);
	CHECK(n > 30000);
	if (scale == 4.0)
		CHECK_EQ_INT(moved, 0);
	fprintf(stderr, "%s scale %g divisor %g: %d of %d values come back one ulp away\n",
		ckpt_dtype_get(dt)->name, scale, divisor, moved, n);
}

static void test_scale_bound(void)
{
	check_bound_16(CKPT_DT_BFLOAT16, sqrt(8.0), 0);
	check_bound_16(CKPT_DT_BFLOAT16, sqrt(128.0), 0);
	check_bound_16(CKPT_DT_BFLOAT16, 4.0, 0);
	check_bound_16(CKPT_DT_BFLOAT16, 1, (double)(float)sqrt(2048.0));
	check_bound_16(CKPT_DT_FLOAT16, sqrt(128.0), 0);
	/* float32: a sweep over the exponents */
	ckpt_rtensor t = { 0 };
	t.src_dtype = t.dtype = CKPT_DT_FLOAT32;
	t.elem = 1;
	t.scale = sqrt(128.0);
	int bad = 0, again = 0;
	for (uint32_t b = 0x00800000u; b < 0x7e000000u; b += 0x1357u) {
		float x = f_of(b), y, x2, y2;
		ckpt_rtensor_convert(&t, &x, 1, &y);
		if (!isfinite(y))
			continue; /* overflowed on the way out */
		ckpt_rtensor_unconvert(&t, &y, 1, &x2);
		ckpt_rtensor_convert(&t, &x2, 1, &y2);
		again += y2 != y;
		bad += x2 != x && x2 != nextafterf(x, INFINITY) && x2 != nextafterf(x, -INFINITY);
	}
	CHECK_EQ_INT(bad, 0);
	CHECK_EQ_INT(again, 0);
}

int main(void)
{
	CHECK_RUN(test_solve_and_scatter);
	CHECK_RUN(test_refused_ops);
	CHECK_RUN(test_scale_bound);
	return CHECK_DONE();
}
