/*
 * recipe_int.h - the parsed form of a view recipe, shared by recipe.c (the
 * parser and the forward planner) and recipe_inverse.c (the other way:
 * target tensors back to source arrays).  Not a public header.
 */
#ifndef CKPT_RECIPE_INT_H
#define CKPT_RECIPE_INT_H

#include <cjson/cJSON.h>

#include "recipe.h"

#define MAX_VARS 64
#define MAX_NAME 1024
#define MAX_EXPR_DEPTH 32
#define MAX_INPUTS 64
#define MAX_LOOP 1000000

enum op_kind {
	OP_TAKE,
	OP_SLICE,
	OP_SPLIT,
	OP_PAD,
	OP_TRANSPOSE,
	OP_RESHAPE,
	OP_STACK,
	OP_CONCAT,
	OP_AFFINE,
	OP_CAST,
	OP_DIVIDE
};

static const char *const op_names[] = { "take",	 "slice",  "split",  "pad",  "transpose", "reshape",
					"stack", "concat", "affine", "cast", "divide" };

struct rop {
	enum op_kind kind;
	int nargs;
	char **args; /* expressions (numbers are kept as their text) */
};

struct rule {
	char *name; /* target name template */
	char *alias; /* target name template of the tensor this one repeats, or NULL */
	char **from;
	int nfrom;
	char **shape;
	int nshape;
	char **for_var, **for_expr;
	int nfor;
	char *when;
	struct rop *ops;
	int nops;
	int optional;
	char *group; /* alternatives: the recipe needs one rule of the group to match, or NULL */
	int absent; /* a guard: the recipe fails when `from` matches a key */
};

struct rfile {
	char *name;
	cJSON *json; /* template, or */
	char *text;
};

struct ckpt_recipe {
	char *name;
	char **prefixes;
	int nprefixes;
	char *var_name[MAX_VARS];
	double var_val[MAX_VARS];
	int nvars;
	struct rule *rules;
	int nrules;
	struct rfile *files;
	int nfiles;
	char *import_item; /* "import_item": the item a view import writes (NULL: "items") */
	char *import_prefix; /* "import_prefix": where its keys go in it (NULL: the first prefix) */
};

struct ckpt_rplan {
	ckpt_rtensor *t;
	size_t n, cap;
	char **fname, **fcontent;
	size_t *flen;
	size_t nfiles;
};

struct env {
	const char *name[MAX_VARS * 2];
	double val[MAX_VARS * 2];
	int n;
	char own[16][72]; /* names made here (num_VAR) */
	int nown;
};

/* The expression helpers of recipe.c (its static functions, for the
 * inverse planner). */
int ckpt_rx_env_get(const struct env *e, const char *name, size_t len, double *out);
int ckpt_rx_env_set(struct env *e, const char *name, double v);
/* 0 and *v, or -1 and *why. */
int ckpt_rx_eval(const char *s, size_t len, const struct env *env, double *v, const char **why);
int ckpt_rx_render(const char *tpl, const struct env *env, char *out, size_t cap, char *why, size_t whylen);
int ckpt_rx_match(const char *pat, const char *name, struct env *env, char vars[][64], int *nv);

#endif
