/*
 * fuzz_recipe_inverse.c - libFuzzer target over view recipes the other way:
 * the input is a recipe file, then a NUL byte, then a config.json (both
 * outside bytes: the user's recipe, the copied folder's config); the recipe
 * is inverted (ckpt_recipe_invert) over a fixed tiny Hugging Face Llama
 * folder, and on success every tensor is scattered into its source boxes
 * (ckpt_rtensor_scatter) and its element ops undone (ckpt_rtensor_unconvert).
 * Checked: a refusal says why, with one of the documented errnos; every box
 * lies inside its source array and holds as many elements as its part.
 * Seeds: each shipped recipe (recipes/NAME.json) followed by a config.json
 * (written by scripts/fuzz).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "recipe.h"

#define E 8
#define L 3
#define H 2
#define K 1
#define D 4
#define F 6
#define V 16

static const uint64_t s_ve[] = { V, E }, s_e[] = { E }, s_q[] = { H * D, E }, s_kv[] = { K * D, E },
		      s_o[] = { E, H *D }, s_fe[] = { F, E }, s_ef[] = { E, F };

struct tdef {
	const char *name;
	const uint64_t *shape;
	int rank;
};

static const struct tdef layer[] = {
	{ "input_layernorm.weight", s_e, 1 },	{ "post_attention_layernorm.weight", s_e, 1 },
	{ "self_attn.q_proj.weight", s_q, 2 },	{ "self_attn.k_proj.weight", s_kv, 2 },
	{ "self_attn.v_proj.weight", s_kv, 2 }, { "self_attn.o_proj.weight", s_o, 2 },
	{ "mlp.gate_proj.weight", s_fe, 2 },	{ "mlp.up_proj.weight", s_fe, 2 },
	{ "mlp.down_proj.weight", s_ef, 2 },
};
#define NLAYER (sizeof(layer) / sizeof(*layer))
#define NT (3 + L * NLAYER)

static char names[NT][96];
static ckpt_recipe_target tg[NT];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	size_t n = 0;
	static const struct tdef top[] = { { "model.embed_tokens.weight", s_ve, 2 },
					   { "lm_head.weight", s_ve, 2 },
					   { "model.norm.weight", s_e, 1 } };
	for (size_t k = 0; k < 3; k++) {
		snprintf(names[n], sizeof(names[n]), "%s", top[k].name);
		tg[n] = (ckpt_recipe_target){ names[n], CKPT_DT_BFLOAT16, top[k].rank, top[k].shape };
		n++;
	}
	for (int l = 0; l < L; l++)
		for (size_t k = 0; k < NLAYER; k++) {
			snprintf(names[n], sizeof(names[n]), "model.layers.%d.%s", l, layer[k].name);
			tg[n] = (ckpt_recipe_target){ names[n], CKPT_DT_BFLOAT16, layer[k].rank,
						      layer[k].shape };
			n++;
		}
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *nul = memchr(data, 0, size);
	size_t rlen = nul ? (size_t)(nul - data) : size;
	const char *cfg = nul ? (const char *)nul + 1 : NULL;
	size_t clen = nul ? size - rlen - 1 : 0;
	ckpt_recipe *r = NULL;
	char why[512] = "";
	if (ckpt_recipe_parse((const char *)data, rlen, &r, why, sizeof(why)))
		return 0;
	why[0] = 0;
	int inv = ckpt_recipe_invertible(r, why, sizeof(why));
	REQUIRE(inv == 0 || (inv == -EOPNOTSUPP && why[0]));
	ckpt_rinverse *x = NULL;
	why[0] = 0;
	int rc = ckpt_recipe_invert(r, tg, NT, cfg, clen, &x, why, sizeof(why));
	REQUIRE(rc == 0 || rc == -EOPNOTSUPP || rc == -ENODATA || rc == -EINVAL || rc == -ENOMEM ||
		rc == -E2BIG);
	if (rc) {
		REQUIRE(rc == -ENOMEM || rc == -E2BIG || why[0]);
		REQUIRE(!x);
		ckpt_recipe_free(r);
		return 0;
	}
	REQUIRE(inv == 0);
	const ckpt_rplan *p = ckpt_rinverse_plan(x);
	for (size_t i = 0; i < ckpt_rplan_count(p); i++) {
		const ckpt_rtensor *t = ckpt_rplan_tensor(p, i);
		size_t ti = ckpt_rinverse_target_of(x, i);
		REQUIRE(ti < NT && !strcmp(tg[ti].name, t->name));
		uint64_t n = ckpt_rtensor_count(t);
		unsigned is = ckpt_dtype_get(t->src_dtype)->itemsize;
		uint8_t *in = calloc(n + 1, 8), *conv = calloc(n + 1, 8);
		REQUIRE(in && conv);
		for (uint64_t k = 0; k < n * is; k++)
			in[k] = (uint8_t)(k * 37 + i);
		REQUIRE(ckpt_rtensor_unconvert(t, in, (size_t)n, conv) == 0);
		for (size_t pi = 0; pi < t->nparts; pi++) {
			ckpt_region box;
			if (!ckpt_rtensor_box(t, pi, 0, n, &box))
				continue;
			const ckpt_recipe_src *s = ckpt_rinverse_src(x, t->parts[pi].input);
			REQUIRE(s && box.rank == s->rank);
			uint64_t bc = 1, pc = 1;
			for (int d = 0; d < box.rank; d++) {
				REQUIRE(box.start[d] < box.stop[d] && box.stop[d] <= s->shape[d]);
				bc *= box.stop[d] - box.start[d];
			}
			for (int d = 0; d < t->rank; d++)
				pc *= t->parts[pi].hi[d] - t->parts[pi].lo[d];
			REQUIRE(bc == pc);
			uint8_t *bb = malloc(bc * is);
			REQUIRE(bb);
			ckpt_rtensor_scatter(t, pi, &box, conv, bb);
			free(bb);
		}
		free(in);
		free(conv);
	}
	ckpt_rinverse_free(x);
	ckpt_recipe_free(r);
	return 0;
}
