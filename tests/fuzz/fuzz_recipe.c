/*
 * fuzz_recipe.c - libFuzzer target over view recipe files (ckpt_recipe_parse)
 * planned against a fixed tiny MaxText-like step (ckpt_recipe_plan), then
 * every target tensor read through its index map over a few element ranges
 * (ckpt_rtensor_box, ckpt_rtensor_gather, ckpt_rtensor_convert).
 * Checked: a refused recipe or plan says why; every box lies inside its
 * source array; a gather writes only inside its output range.
 * Seeds: the shipped recipes (the .json files of recipes/, copied by scripts/fuzz) and
 * tests/fuzz/seeds/fuzz_recipe/.
 */
#include <errno.h>
#include <stdint.h>
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

static const uint64_t s_emb[] = { V, E }, s_logits[] = { E, V }, s_norm[] = { E }, s_lnorm[] = { E, L },
		      s_q[] = { E, L, H, D }, s_kv[] = { E, L, K, D }, s_out[] = { H, L, D, E },
		      s_wi[] = { E, L, F }, s_wo[] = { F, L, E }, s_l0[] = { E, H *D };

#define P "items.params.params."
static const ckpt_recipe_src srcs[] = {
	{ P "token_embedder.embedding", CKPT_DT_BFLOAT16, 2, s_emb },
	{ P "decoder.logits_dense.kernel", CKPT_DT_BFLOAT16, 2, s_logits },
	{ P "decoder.decoder_norm.scale", CKPT_DT_BFLOAT16, 1, s_norm },
	{ P "decoder.layers.pre_self_attention_layer_norm.scale", CKPT_DT_BFLOAT16, 2, s_lnorm },
	{ P "decoder.layers.post_self_attention_layer_norm.scale", CKPT_DT_BFLOAT16, 2, s_lnorm },
	{ P "decoder.layers.self_attention.query.kernel", CKPT_DT_BFLOAT16, 4, s_q },
	{ P "decoder.layers.self_attention.key.kernel", CKPT_DT_BFLOAT16, 4, s_kv },
	{ P "decoder.layers.self_attention.value.kernel", CKPT_DT_BFLOAT16, 4, s_kv },
	{ P "decoder.layers.self_attention.out.kernel", CKPT_DT_BFLOAT16, 4, s_out },
	{ P "decoder.layers.mlp.wi_0.kernel", CKPT_DT_BFLOAT16, 3, s_wi },
	{ P "decoder.layers.mlp.wi_1.kernel", CKPT_DT_BFLOAT16, 3, s_wi },
	{ P "decoder.layers.mlp.wo.kernel", CKPT_DT_BFLOAT16, 3, s_wo },
	{ "items.encoder.layers_0.attention.query.kernel", CKPT_DT_FLOAT32, 2, s_l0 },
	{ "items.encoder.layers_1.attention.query.kernel", CKPT_DT_FLOAT32, 2, s_l0 },
};
#define NSRC (sizeof(srcs) / sizeof(*srcs))

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	ckpt_recipe *r = NULL;
	char why[256] = "";
	int rc = ckpt_recipe_parse((const char *)data, size, &r, why, sizeof(why));
	REQUIRE(rc == 0 || rc == -EINVAL || rc == -ENOMEM);
	if (rc) {
		REQUIRE(rc == -ENOMEM || why[0]);
		return 0;
	}
	REQUIRE(ckpt_recipe_name(r)[0]);
	ckpt_rplan *p = NULL;
	why[0] = 0;
	rc = ckpt_recipe_plan(r, srcs, NSRC, &p, why, sizeof(why));
	REQUIRE(rc == 0 || rc == -EINVAL || rc == -ENOENT || rc == -ENOMEM || rc == -E2BIG);
	if (rc) {
		REQUIRE(rc == -ENOMEM || rc == -E2BIG || why[0]);
		ckpt_recipe_free(r);
		return 0;
	}
	free(ckpt_rplan_table(p));
	for (size_t i = 0; i < ckpt_rplan_count(p) && i < 64; i++) {
		const ckpt_rtensor *t = ckpt_rplan_tensor(p, i);
		uint64_t n = ckpt_rtensor_count(t);
		if (n == 0 || n > (1u << 16))
			continue;
		unsigned is = 8; /* room for any source dtype's element */
		uint8_t *out = calloc(n + 2, is), *conv = calloc(n + 1, 8);
		REQUIRE(out && conv);
		for (int trial = 0; trial < 3; trial++) {
			uint64_t e0 = trial == 0 ? 0 : (n * (uint64_t)trial) / 4,
				 e1 = trial == 2 ? e0 + 1 : n;
			for (size_t pi = 0; pi < t->nparts; pi++) {
				ckpt_region box;
				if (!ckpt_rtensor_box(t, pi, e0, e1, &box))
					continue;
				const ckpt_recipe_src *s = &srcs[t->parts[pi].input];
				REQUIRE(box.rank == s->rank);
				uint64_t bc = 1;
				for (int d = 0; d < box.rank; d++) {
					REQUIRE(box.start[d] < box.stop[d] && box.stop[d] <= s->shape[d]);
					bc *= box.stop[d] - box.start[d];
				}
				uint8_t *bb = calloc(bc, is);
				REQUIRE(bb);
				memset(out + (size_t)(e1 - e0) * ckpt_dtype_get(t->src_dtype)->itemsize, 0xa5,
				       is);
				ckpt_rtensor_gather(t, pi, &box, bb, e0, e1, out);
				/* nothing written past the range */
				REQUIRE(out[(size_t)(e1 - e0) * ckpt_dtype_get(t->src_dtype)->itemsize] ==
					0xa5);
				free(bb);
			}
			if (t->elem)
				REQUIRE(ckpt_rtensor_convert(t, out, (size_t)(e1 - e0), conv) == 0);
		}
		free(out);
		free(conv);
	}
	for (size_t i = 0; i < ckpt_rplan_nfiles(p); i++) {
		const char *c;
		size_t len;
		REQUIRE(ckpt_rplan_file(p, i, &c, &len) && strlen(c) == len);
	}
	ckpt_rplan_free(p);
	ckpt_recipe_free(r);
	return 0;
}
