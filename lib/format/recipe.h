/*
 * recipe.h - view recipes: a declarative description of how one model
 * family's checkpoint becomes another's folder (docs/recipes.md), compiled
 * against the arrays of a step into a plan of target tensors, each a lazy
 * function of source arrays.
 *
 * Pure: no I/O, no threads, no global state.  The recipe text is outside
 * bytes (a user's -o recipes=DIR): every failure is a return value with a
 * reason, never a crash (fuzzed: tests/fuzz/fuzz_recipe.c).
 *
 * The shape ops of a rule (take, split, pad, truncate, transpose, reshape,
 * stack, concat) compose into one index map per target tensor: the target
 * is a set of parts, each a box of the target's index space whose element
 * at index t is source element base + sum(digit_f(t) * stride_f) over the
 * factors f of the part (a strided view of one source array; a reshape
 * splits a dimension into factors).  Target elements in no part are zero
 * (pad).  The element ops (affine, cast) run after the gather, per element:
 * the source value widened exactly to float32 (float64 stays float64),
 * y = x*scale rounded to float32, then y + bias rounded to float32, then
 * rounded once to nearest even into the output dtype.  Without element
 * ops the target's bytes are the source's bytes.  A divide op divides by
 * f32(divisor) (one more float32 rounding) after the scale, before the bias.
 *
 * Ownership: a recipe and a plan own all their memory; a plan does not
 * refer to the recipe it came from, nor to the source list it was given.
 * Thread-safety: all calls on a finished recipe or plan are read-only and
 * may run from many threads at once.
 */
#ifndef CKPT_RECIPE_H
#define CKPT_RECIPE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "dtype.h"
#include "slice.h"

/* Largest recipe file accepted. */
#define CKPT_RECIPE_MAX_BYTES (1u << 20)
/* Most factors one part's index map has, over all its dimensions. */
#define CKPT_RECIPE_MAX_FACTORS 24
/* Most target dimensions and source dimensions a rule handles. */
#define CKPT_RECIPE_MAX_RANK 8
/* Most target tensors one plan makes (a guard against runaway loops; the
 * largest MoE checkpoints have tens of thousands). */
#define CKPT_RECIPE_MAX_TENSORS (1u << 17)
/* Largest axis a pad may make. */
#define CKPT_RECIPE_MAX_PAD (1ull << 40)

typedef struct ckpt_recipe ckpt_recipe;

/* Parse and check recipe text (len bytes, JSON).  0 and *out, or -EINVAL
 * with a one-line reason in why (NUL-terminated, truncated to whylen). */
int ckpt_recipe_parse(const char *text, size_t len, ckpt_recipe **out, char *why, size_t whylen);
void ckpt_recipe_free(ckpt_recipe *r);
/* The recipe's "name" (the folder name under STEP/.views/). */
const char *ckpt_recipe_name(const ckpt_recipe *r);

/* One array of the source step: its '.'-joined key path below the step
 * (item name first), dtype and shape.  Borrowed for the call. */
typedef struct ckpt_recipe_src {
	const char *name;
	ckpt_dtype dtype;
	int rank;
	const uint64_t *shape;
} ckpt_recipe_src;

/* One factor of a part's index map: n values, each moving source dim sdim
 * by stride. */
typedef struct ckpt_rfactor {
	uint64_t n;
	uint64_t stride;
	int sdim;
} ckpt_rfactor;

/* A part: the box lo..hi of the target, read from source `input`. */
typedef struct ckpt_rpart {
	size_t input; /* index in the source list given to ckpt_recipe_plan */
	int srank;
	uint64_t base[CKPT_RECIPE_MAX_RANK]; /* source index of the box's first element */
	uint64_t lo[CKPT_RECIPE_MAX_RANK], hi[CKPT_RECIPE_MAX_RANK];
	int nf[CKPT_RECIPE_MAX_RANK]; /* factors of each target dim, outermost first */
	ckpt_rfactor f[CKPT_RECIPE_MAX_FACTORS]; /* dim 0's factors, then dim 1's, ... */
} ckpt_rpart;

/* One target tensor of a plan. */
typedef struct ckpt_rtensor {
	char *name;
	ckpt_dtype dtype; /* what the target holds */
	ckpt_dtype src_dtype; /* what its parts read (all parts share it) */
	int rank;
	uint64_t shape[CKPT_RECIPE_MAX_RANK];
	size_t nparts;
	ckpt_rpart *parts;
	int elem; /* element ops present (else a byte copy) */
	double scale, bias; /* affine: y = x*scale + bias (scale 1, bias 0: none) */
	double divisor; /* divide: y = x / divisor, after the scale, before the bias (0: none) */
	char *desc; /* "SOURCE: op op ..." for the mapping table */
} ckpt_rtensor;

typedef struct ckpt_rplan ckpt_rplan;

/* Match recipe r against the arrays of a step.  0 and *out; -ENOENT when a
 * required rule does not match (a key missing, a shape or dtype that
 * differs), -EINVAL when the rules cannot be applied (an index out of
 * range, a reshape the index map cannot express), -ENOMEM; why names the
 * failing rule and the reason. */
int ckpt_recipe_plan(const ckpt_recipe *r, const ckpt_recipe_src *srcs, size_t n, ckpt_rplan **out, char *why,
		     size_t whylen);
void ckpt_rplan_free(ckpt_rplan *p);
size_t ckpt_rplan_count(const ckpt_rplan *p);
/* Tensor i, in name order. */
const ckpt_rtensor *ckpt_rplan_tensor(const ckpt_rplan *p, size_t i);
/* Literal files: name and content (NUL-terminated, len bytes). */
size_t ckpt_rplan_nfiles(const ckpt_rplan *p);
const char *ckpt_rplan_file(const ckpt_rplan *p, size_t i, const char **content, size_t *len);
/* The mapping as a table (one line per tensor: name, shape, dtype, source
 * and ops); malloc'ed, NUL-terminated. */
char *ckpt_rplan_table(const ckpt_rplan *p);

/* Elements of t (its shape's product). */
uint64_t ckpt_rtensor_count(const ckpt_rtensor *t);

/* The box of part `part`'s source that target elements [e0, e1) (C order)
 * read: 1 and *box (rank srank), or 0 when the part holds none of them.
 * The box may hold more than those elements (a bounding box); its element
 * count is at most (rows spanned + 1) times a part's row. */
int ckpt_rtensor_box(const ckpt_rtensor *t, size_t part, uint64_t e0, uint64_t e1, ckpt_region *box);

/* 1 and *r when part `part` covers all of t and its elements, in C order,
 * are those of region r of its source in C order (takes and slices only,
 * axes in source order): target bytes are then the region's stream bytes.
 * 0 otherwise. */
int ckpt_rtensor_region(const ckpt_rtensor *t, size_t part, ckpt_region *r);

/* Copy the elements of part `part` among target elements [e0, e1) from
 * boxbuf (the C-order bytes of *box of the part's source, src_dtype
 * elements) into dst (e1-e0 src_dtype elements; dst[0] is element e0).
 * Elements outside the part are left as they are. */
void ckpt_rtensor_gather(const ckpt_rtensor *t, size_t part, const ckpt_region *box, const void *boxbuf,
			 uint64_t e0, uint64_t e1, void *dst);

/* ckpt_rtensor_gather for part p, which need not be one of t's: a part
 * that ckpt_rtensor_clip made. */
void ckpt_rpart_gather(const ckpt_rtensor *t, const ckpt_rpart *p, const ckpt_region *box, const void *boxbuf,
		       uint64_t e0, uint64_t e1, void *dst);

/* Part `part` of t restricted to the elements whose source index lies in
 * region clip (one chunk of the source): 1 and *out, a part whose target
 * box and factors are narrowed (gathering it with ckpt_rpart_gather from
 * a buffer of any region holding clip writes exactly those elements);
 * 0 when no element of the part is inside; -ENOTSUP when the elements
 * inside are not a box of the target (the clip cuts a factor that is not
 * the outermost of its target dim, or a source dim that several factors
 * move), -EINVAL when clip's rank is not the source's.  Walking the
 * chunks of a box and gathering each chunk's clipped part straight from
 * the cached chunk replaces copying the box out of the chunks first. */
int ckpt_rtensor_clip(const ckpt_rtensor *t, size_t part, const ckpt_region *clip, ckpt_rpart *out);

/* Apply t's element ops to count src_dtype elements of src, writing count
 * dtype elements to dst (they may not overlap).  0, or -ENOTSUP. */
int ckpt_rtensor_convert(const ckpt_rtensor *t, const void *src, size_t count, void *dst);

/* Round a float32 value to bfloat16 / float16 bits, to nearest even (NaN
 * stays NaN, infinities stay). */
uint16_t ckpt_f32_to_bf16(float x);
uint16_t ckpt_f32_to_f16(float x);

/* ---- the other way (recipe_inverse.c) ----------------------------------------
 *
 * A folder of the target family (its tensors and config.json) back to the
 * source arrays of recipe r: the inverse planner solves the names of the
 * source shapes (config.json values whose template is exactly "{NAME}",
 * loop counts from the largest index in the tensor names, the rest from the
 * tensors' shapes), makes the source list, plans r forward over it and
 * checks that the plan makes exactly the tensors given (same names, dtypes,
 * shapes), that every part maps one to one onto a box of its source, and
 * that the boxes fill every source array exactly once (aliases aside). */

/* 0 when r can be imported; -EOPNOTSUPP and why (the rule and op) when an
 * op does not invert (cast; affine with a bias) or a name template holds an
 * expression that is not a plain {var}. */
int ckpt_recipe_invertible(const ckpt_recipe *r, char *why, size_t whylen);

/* One tensor of the folder (borrowed for the call). */
typedef struct ckpt_recipe_target {
	const char *name;
	ckpt_dtype dtype;
	int rank;
	const uint64_t *shape;
} ckpt_recipe_target;

typedef struct ckpt_rinverse ckpt_rinverse;

/* 0 and *out; -EOPNOTSUPP (see above), -ENODATA (a tensor missing, or
 * source elements no tensor gives), -EINVAL (a name the recipe does not
 * make, a shape or dtype that differs, config.json not an object),
 * -ENOMEM; why names the tensor or rule.  config may be NULL. */
int ckpt_recipe_invert(const ckpt_recipe *r, const ckpt_recipe_target *t, size_t n, const char *config,
		       size_t clen, ckpt_rinverse **out, char *why, size_t whylen);
void ckpt_rinverse_free(ckpt_rinverse *x);
/* The source arrays: "ITEM.key.key" names (ITEM: the recipe's
 * "import_item", else "items"; keys under the recipe's first prefix). */
size_t ckpt_rinverse_nsrc(const ckpt_rinverse *x);
const ckpt_recipe_src *ckpt_rinverse_src(const ckpt_rinverse *x, size_t i);
/* The forward plan over them; its tensor i is target ckpt_rinverse_target_of(x, i);
 * ckpt_rinverse_dup_of is an earlier plan tensor with the same parts (an
 * alias: its bytes must be the same), or SIZE_MAX. */
const ckpt_rplan *ckpt_rinverse_plan(const ckpt_rinverse *x);
size_t ckpt_rinverse_target_of(const ckpt_rinverse *x, size_t i);
size_t ckpt_rinverse_dup_of(const ckpt_rinverse *x, size_t i);

/* The elements of part `part` of t, from src (all of t, src_dtype elements,
 * C order), into boxbuf (the C-order bytes of *box of the part's source,
 * the box ckpt_rtensor_box gives for all of t). */
void ckpt_rtensor_scatter(const ckpt_rtensor *t, size_t part, const ckpt_region *box, const void *src,
			  void *boxbuf);

/* The inverse of t's element ops: count dtype elements of src to count
 * src_dtype elements of dst.  A copy without element ops; else, in float32
 * (float64 stays float64), x = ((y - bias) * divisor) / scale rounded once
 * to the source dtype, then of x and its two neighbours the first that the
 * forward ops take back to y exactly.  -EOPNOTSUPP for a cast. */
int ckpt_rtensor_unconvert(const ckpt_rtensor *t, const void *src, size_t count, void *dst);

/* The name of op kind `kind` ("take", ...). */
const char *ckpt_recipe_op_name(int kind);

#endif
