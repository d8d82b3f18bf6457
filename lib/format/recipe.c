/*
 * recipe.c - view recipes (recipe.h): the JSON parser, the small expression
 * language of names and shapes, the planner that composes each rule's shape
 * ops into one index map, and the per-element gather and conversions.
 */
#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "recipe.h"
#include "tlsbuf.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "recipe_int.h"

/* ---- small helpers --------------------------------------------------------- */

static void say(char *why, size_t whylen, const char *fmt, ...)
{
	if (!why || !whylen)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, whylen, fmt, ap);
	va_end(ap);
}

/* ---- expressions ----------------------------------------------------------- */

static int env_get(const struct env *e, const char *name, size_t len, double *out)
{
	for (int i = e->n - 1; i >= 0; i--)
		if (strlen(e->name[i]) == len && !memcmp(e->name[i], name, len)) {
			*out = e->val[i];
			return 1;
		}
	return 0;
}

static int env_set(struct env *e, const char *name, double v)
{
	for (int i = e->n - 1; i >= 0; i--)
		if (!strcmp(e->name[i], name)) {
			e->val[i] = v;
			return 0;
		}
	if (e->n >= MAX_VARS * 2)
		return -1;
	e->name[e->n] = name;
	e->val[e->n++] = v;
	return 0;
}

struct ex {
	const char *p, *end;
	const struct env *env;
	int depth;
	const char *err;
};

static void ex_ws(struct ex *x)
{
	while (x->p < x->end && isspace((unsigned char)*x->p))
		x->p++;
}

static int ex_sum(struct ex *x, double *v);

static float round_f32(double d)
{
	return (float)d;
}

static double bf16_round(double d)
{
	uint16_t b = ckpt_f32_to_bf16((float)d);
	uint32_t u = (uint32_t)b << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static int ex_atom(struct ex *x, double *v)
{
	ex_ws(x);
	if (x->p >= x->end)
		return x->err = "expression ends early", -1;
	if (++x->depth > MAX_EXPR_DEPTH)
		return x->err = "expression nests too deep", -1;
	int rc = 0;
	char c = *x->p;
	if (c == '(') {
		x->p++;
		rc = ex_sum(x, v);
		ex_ws(x);
		if (rc == 0 && (x->p >= x->end || *x->p != ')'))
			x->err = "missing )", rc = -1;
		else if (rc == 0)
			x->p++;
	} else if (c == '-') {
		x->p++;
		rc = ex_atom(x, v);
		*v = -*v;
	} else if (isdigit((unsigned char)c) || c == '.') {
		char buf[64];
		size_t n = 0;
		while (x->p < x->end && n < sizeof(buf) - 1 &&
		       (isdigit((unsigned char)*x->p) || *x->p == '.' || *x->p == 'e' || *x->p == 'E' ||
			((*x->p == '-' || *x->p == '+') && n && (buf[n - 1] == 'e' || buf[n - 1] == 'E'))))
			buf[n++] = *x->p++;
		buf[n] = 0;
		char *e;
		*v = strtod(buf, &e);
		if (*e || !isfinite(*v))
			x->err = "bad number", rc = -1;
	} else if (isalpha((unsigned char)c) || c == '_') {
		const char *s = x->p;
		while (x->p < x->end && (isalnum((unsigned char)*x->p) || *x->p == '_'))
			x->p++;
		size_t len = (size_t)(x->p - s);
		ex_ws(x);
		if (x->p < x->end && *x->p == '(') {
			double a;
			x->p++;
			rc = ex_sum(x, &a);
			ex_ws(x);
			if (rc == 0 && (x->p >= x->end || *x->p != ')'))
				x->err = "missing )", rc = -1;
			if (rc == 0) {
				x->p++;
				if (len == 4 && !memcmp(s, "sqrt", 4) && a >= 0)
					*v = sqrt(a);
				else if (len == 3 && !memcmp(s, "f32", 3))
					*v = round_f32(a);
				else if (len == 4 && !memcmp(s, "bf16", 4))
					*v = bf16_round(a);
				else
					x->err = "unknown function (sqrt, f32, bf16)", rc = -1;
			}
		} else if (!env_get(x->env, s, len, v)) {
			x->err = "unknown name", rc = -1;
		}
	} else {
		x->err = "unexpected character", rc = -1;
	}
	x->depth--;
	return rc;
}

static int ex_prod(struct ex *x, double *v)
{
	if (ex_atom(x, v) < 0)
		return -1;
	for (;;) {
		ex_ws(x);
		if (x->p >= x->end || (*x->p != '*' && *x->p != '/' && *x->p != '%'))
			return 0;
		char op = *x->p++;
		double b;
		if (ex_atom(x, &b) < 0)
			return -1;
		if (op == '*')
			*v *= b;
		else if (b == 0)
			return x->err = "division by zero", -1;
		else if (op == '/')
			*v /= b;
		else
			*v = fmod(*v, b);
	}
}

static int ex_sum(struct ex *x, double *v)
{
	if (ex_prod(x, v) < 0)
		return -1;
	for (;;) {
		ex_ws(x);
		if (x->p >= x->end || (*x->p != '+' && *x->p != '-'))
			break;
		char op = *x->p++;
		double b;
		if (ex_prod(x, &b) < 0)
			return -1;
		*v = op == '+' ? *v + b : *v - b;
	}
	/* comparisons (guards): 1 or 0 */
	ex_ws(x);
	if (x->p + 1 < x->end && (x->p[0] == '=' || x->p[0] == '!') && x->p[1] == '=') {
		int ne = x->p[0] == '!';
		x->p += 2;
		double b;
		if (ex_sum(x, &b) < 0)
			return -1;
		*v = ne ? *v != b : *v == b;
	}
	return 0;
}

/* Evaluate expression s (len bytes) in env: 0 and *v, or -1 and why. */
static int eval(const char *s, size_t len, const struct env *env, double *v, const char **why)
{
	struct ex x = { s, s + len, env, 0, NULL };
	int rc = ex_sum(&x, v);
	ex_ws(&x);
	if (rc == 0 && x.p != x.end)
		x.err = "trailing characters", rc = -1;
	if (rc == 0 && !isfinite(*v))
		x.err = "not a finite number", rc = -1;
	*why = x.err;
	return rc;
}

/* An integer expression in [0, 2^53]. */
static int eval_uint(const char *s, const struct env *env, uint64_t *out, char *why, size_t whylen)
{
	double v;
	const char *w;
	if (eval(s, strlen(s), env, &v, &w) < 0) {
		say(why, whylen, "'%s': %s", s, w);
		return -EINVAL;
	}
	if (v < 0 || v > 9007199254740992.0 || v != floor(v)) {
		say(why, whylen, "'%s' = %g: not a whole number >= 0", s, v);
		return -EINVAL;
	}
	*out = (uint64_t)v;
	return 0;
}

/* Render a template: {expr} replaced by its whole-number value. */
static int render(const char *tpl, const struct env *env, char *out, size_t cap, char *why, size_t whylen)
{
	size_t n = 0;
	for (const char *p = tpl; *p;) {
		if (*p == '{') {
			const char *q = strchr(p, '}');
			if (!q) {
				say(why, whylen, "'%s': { without }", tpl);
				return -EINVAL;
			}
			char ebuf[256];
			size_t el = (size_t)(q - p - 1);
			if (el >= sizeof(ebuf)) {
				say(why, whylen, "'%s': expression too long", tpl);
				return -EINVAL;
			}
			memcpy(ebuf, p + 1, el);
			ebuf[el] = 0;
			uint64_t v;
			int rc = eval_uint(ebuf, env, &v, why, whylen);
			if (rc < 0)
				return rc;
			int w = snprintf(out + n, cap - n, "%llu", (unsigned long long)v);
			if (w < 0 || (size_t)w >= cap - n)
				return say(why, whylen, "'%s': name too long", tpl), -EINVAL;
			n += (size_t)w;
			p = q + 1;
		} else {
			if (n + 1 >= cap)
				return say(why, whylen, "'%s': name too long", tpl), -EINVAL;
			out[n++] = *p++;
		}
	}
	out[n] = 0;
	return 0;
}

/* Match name against pattern: literal text and {var} (one or more digits;
 * a var already in env must have that value).  New captures are added to
 * env.  1 on a match. */
static int match(const char *pat, const char *name, struct env *env, char vars[][64], int *nv)
{
	while (*pat) {
		if (*pat == '{') {
			const char *q = strchr(pat, '}');
			if (!q || q - pat - 1 <= 0 || q - pat - 1 >= 64)
				return 0;
			if (!isdigit((unsigned char)*name))
				return 0;
			uint64_t val = 0;
			int digits = 0;
			while (isdigit((unsigned char)*name) && digits < 15) {
				val = val * 10 + (uint64_t)(*name++ - '0');
				digits++;
			}
			if (isdigit((unsigned char)*name))
				return 0;
			double have;
			size_t vl = (size_t)(q - pat - 1);
			if (env_get(env, pat + 1, vl, &have)) {
				if (have != (double)val)
					return 0;
			} else {
				if (*nv >= 8)
					return 0;
				memcpy(vars[*nv], pat + 1, vl);
				vars[*nv][vl] = 0;
				if (env_set(env, vars[*nv], (double)val) < 0)
					return 0;
				(*nv)++;
			}
			pat = q + 1;
		} else {
			if (*pat != *name)
				return 0;
			pat++;
			name++;
		}
	}
	return *name == 0;
}

/* ---- parsing --------------------------------------------------------------- */

static void free_rule(struct rule *r)
{
	free(r->name);
	free(r->alias);
	for (int i = 0; i < r->nfrom; i++)
		free(r->from[i]);
	free(r->from);
	for (int i = 0; i < r->nshape; i++)
		free(r->shape[i]);
	free(r->shape);
	for (int i = 0; i < r->nfor; i++) {
		free(r->for_var[i]);
		free(r->for_expr[i]);
	}
	free(r->for_var);
	free(r->for_expr);
	free(r->when);
	free(r->group);
	for (int i = 0; i < r->nops; i++) {
		for (int j = 0; j < r->ops[i].nargs; j++)
			free(r->ops[i].args[j]);
		free(r->ops[i].args);
	}
	free(r->ops);
}

void ckpt_recipe_free(ckpt_recipe *r)
{
	if (!r)
		return;
	free(r->name);
	free(r->import_item);
	free(r->import_prefix);
	for (int i = 0; i < r->nprefixes; i++)
		free(r->prefixes[i]);
	free(r->prefixes);
	for (int i = 0; i < r->nvars; i++)
		free(r->var_name[i]);
	for (int i = 0; i < r->nrules; i++)
		free_rule(&r->rules[i]);
	free(r->rules);
	for (int i = 0; i < r->nfiles; i++) {
		free(r->files[i].name);
		free(r->files[i].text);
		cJSON_Delete(r->files[i].json);
	}
	free(r->files);
	free(r);
}

const char *ckpt_recipe_name(const ckpt_recipe *r)
{
	return r->name;
}

/* A JSON number or string as expression text. */
static char *expr_text(const cJSON *j)
{
	if (cJSON_IsString(j))
		return strlen(j->valuestring) < 256 ? strdup(j->valuestring) : NULL;
	if (cJSON_IsNumber(j) && isfinite(j->valuedouble)) {
		char b[64];
		snprintf(b, sizeof(b), "%.17g", j->valuedouble);
		return strdup(b);
	}
	return NULL;
}

/* A string or an array of strings (or numbers, with numbers_ok). */
static int str_list(const cJSON *j, int numbers_ok, char ***out, int *n)
{
	*out = NULL;
	*n = 0;
	if (!j)
		return 0;
	if (cJSON_IsString(j)) {
		*out = calloc(1, sizeof(char *));
		if (!*out || !((*out)[0] = strdup(j->valuestring)))
			return -ENOMEM;
		*n = 1;
		return 0;
	}
	if (!cJSON_IsArray(j))
		return -EINVAL;
	int cnt = cJSON_GetArraySize(j);
	if (cnt > 256)
		return -EINVAL;
	*out = calloc((size_t)cnt + 1, sizeof(char *));
	if (!*out)
		return -ENOMEM;
	const cJSON *e;
	cJSON_ArrayForEach(e, j)
	{
		if (!cJSON_IsString(e) && !(numbers_ok && cJSON_IsNumber(e)))
			return -EINVAL;
		if (!((*out)[*n] = expr_text(e)))
			return -EINVAL;
		(*n)++;
	}
	return 0;
}

static int parse_rule(const cJSON *j, struct rule *r, int idx, char *why, size_t whylen)
{
	if (!cJSON_IsObject(j)) {
		say(why, whylen, "tensors[%d]: not an object", idx);
		return -EINVAL;
	}
	const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name");
	if (!cJSON_IsString(name) || !*name->valuestring || strlen(name->valuestring) >= MAX_NAME) {
		say(why, whylen, "tensors[%d]: \"name\" must be a non-empty string", idx);
		return -EINVAL;
	}
	r->name = strdup(name->valuestring);
	const cJSON *alias = cJSON_GetObjectItemCaseSensitive(j, "alias");
	if (alias) {
		if (!cJSON_IsString(alias)) {
			say(why, whylen, "%s: \"alias\" must be a string", r->name);
			return -EINVAL;
		}
		r->alias = strdup(alias->valuestring);
	}
	if (str_list(cJSON_GetObjectItemCaseSensitive(j, "from"), 0, &r->from, &r->nfrom) < 0 ||
	    r->nfrom > MAX_INPUTS || (!r->alias && r->nfrom == 0) || (r->alias && r->nfrom)) {
		say(why, whylen, "%s: needs \"from\" (a key or a list of keys, at most %d) or \"alias\"",
		    r->name, MAX_INPUTS);
		return -EINVAL;
	}
	for (int i = 0; i < r->nfrom; i++)
		if (strlen(r->from[i]) >= MAX_NAME) {
			say(why, whylen, "%s: key too long", r->name);
			return -EINVAL;
		}
	if (str_list(cJSON_GetObjectItemCaseSensitive(j, "shape"), 1, &r->shape, &r->nshape) < 0 ||
	    r->nshape > CKPT_RECIPE_MAX_RANK) {
		say(why, whylen, "%s: \"shape\" must be a list of at most %d names or numbers", r->name,
		    CKPT_RECIPE_MAX_RANK);
		return -EINVAL;
	}
	const cJSON *f = cJSON_GetObjectItemCaseSensitive(j, "for");
	if (f) {
		int cnt = cJSON_IsObject(f) ? cJSON_GetArraySize(f) : -1;
		if (cnt < 0 || cnt > 4) {
			say(why, whylen, "%s: \"for\" must be an object of at most 4 loops", r->name);
			return -EINVAL;
		}
		r->for_var = calloc((size_t)cnt + 1, sizeof(char *));
		r->for_expr = calloc((size_t)cnt + 1, sizeof(char *));
		if (!r->for_var || !r->for_expr)
			return -ENOMEM;
		const cJSON *e;
		cJSON_ArrayForEach(e, f)
		{
			char *t = expr_text(e);
			if (!t || !e->string || !*e->string || strlen(e->string) >= 64) {
				free(t);
				say(why, whylen, "%s: \"for\": each loop is \"var\": count", r->name);
				return -EINVAL;
			}
			r->for_var[r->nfor] = strdup(e->string);
			r->for_expr[r->nfor++] = t;
		}
	}
	const cJSON *when = cJSON_GetObjectItemCaseSensitive(j, "when");
	if (when && !(r->when = expr_text(when))) {
		say(why, whylen, "%s: \"when\" must be an expression", r->name);
		return -EINVAL;
	}
	const cJSON *opt = cJSON_GetObjectItemCaseSensitive(j, "optional");
	r->optional = cJSON_IsTrue(opt);
	const cJSON *group = cJSON_GetObjectItemCaseSensitive(j, "group");
	if (group) {
		if (!cJSON_IsString(group) || !*group->valuestring || strlen(group->valuestring) >= 64 ||
		    r->optional || r->alias) {
			say(why, whylen, "%s: \"group\" must be a name (not on an optional rule or an alias)",
			    r->name);
			return -EINVAL;
		}
		if (!(r->group = strdup(group->valuestring)))
			return -ENOMEM;
	}
	r->absent = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "absent"));
	if (r->absent && (r->alias || r->nfrom != 1 || r->nshape || r->nfor || r->when || r->optional ||
			  r->group || cJSON_GetObjectItemCaseSensitive(j, "ops"))) {
		say(why, whylen, "%s: an \"absent\" rule has one \"from\" key and nothing else", r->name);
		return -EINVAL;
	}
	const cJSON *ops = cJSON_GetObjectItemCaseSensitive(j, "ops");
	if (ops) {
		int cnt = cJSON_IsArray(ops) ? cJSON_GetArraySize(ops) : -1;
		if (cnt < 0 || cnt > 32 || (r->alias && cnt)) {
			say(why, whylen, "%s: \"ops\" must be a list of at most 32 ops (none on an alias)",
			    r->name);
			return -EINVAL;
		}
		r->ops = calloc((size_t)cnt + 1, sizeof(*r->ops));
		if (!r->ops)
			return -ENOMEM;
		const cJSON *o;
		cJSON_ArrayForEach(o, ops)
		{
			const cJSON *k = cJSON_IsArray(o) ? cJSON_GetArrayItem(o, 0) : NULL;
			int kind = -1;
			for (int i = 0;
			     k && cJSON_IsString(k) && i < (int)(sizeof(op_names) / sizeof(*op_names)); i++)
				if (!strcmp(k->valuestring, op_names[i]))
					kind = i;
			if (kind < 0) {
				say(why, whylen, "%s: ops[%d]: not [\"op\", args...] of a known op", r->name,
				    r->nops);
				return -EINVAL;
			}
			struct rop *ro = &r->ops[r->nops++];
			ro->kind = (enum op_kind)kind;
			int na = cJSON_GetArraySize(o) - 1;
			if (na > CKPT_RECIPE_MAX_RANK + 2) {
				say(why, whylen, "%s: ops[%d]: too many arguments", r->name, r->nops - 1);
				return -EINVAL;
			}
			ro->args = calloc((size_t)na + 1, sizeof(char *));
			if (!ro->args)
				return -ENOMEM;
			for (int i = 0; i < na; i++) {
				const cJSON *a = cJSON_GetArrayItem(o, i + 1);
				if (!(ro->args[i] = expr_text(a))) {
					say(why, whylen,
					    "%s: ops[%d] (%s): arguments are numbers or expressions", r->name,
					    r->nops - 1, op_names[kind]);
					return -EINVAL;
				}
				ro->nargs++;
			}
			static const int want[] = { 2, 3, 3, 2, -1, -1, 1, 1, 2, 1, 1 };
			int ok = want[kind] < 0 ? na >= 1 && na <= CKPT_RECIPE_MAX_RANK : na == want[kind];
			if (kind == OP_AFFINE)
				ok = na == 1 || na == 2;
			if (!ok) {
				say(why, whylen, "%s: ops[%d] (%s): wrong number of arguments", r->name,
				    r->nops - 1, op_names[kind]);
				return -EINVAL;
			}
			if (kind == OP_CAST && ckpt_dtype_from_name(ro->args[0]) == CKPT_DT_INVALID) {
				say(why, whylen, "%s: cast to unknown dtype '%s'", r->name, ro->args[0]);
				return -EINVAL;
			}
			int combine = kind == OP_STACK || kind == OP_CONCAT;
			if (combine != (r->nops == 1 && r->nfrom > 1)) {
				say(why, whylen,
				    "%s: several \"from\" keys need stack or concat as the first op, "
				    "and only then",
				    r->name);
				return -EINVAL;
			}
		}
	}
	if (r->nfrom > 1 && r->nops == 0) {
		say(why, whylen, "%s: several \"from\" keys need stack or concat as the first op", r->name);
		return -EINVAL;
	}
	return 0;
}

int ckpt_recipe_parse(const char *text, size_t len, ckpt_recipe **out, char *why, size_t whylen)
{
	*out = NULL;
	if (len > CKPT_RECIPE_MAX_BYTES) {
		say(why, whylen, "larger than %u bytes", CKPT_RECIPE_MAX_BYTES);
		return -EINVAL;
	}
	cJSON *j = cJSON_ParseWithLength(text, len);
	if (!j) {
		say(why, whylen, "not valid JSON");
		return -EINVAL;
	}
	ckpt_recipe *r = calloc(1, sizeof(*r));
	int rc = r ? 0 : -ENOMEM;
	const cJSON *ver = cJSON_GetObjectItemCaseSensitive(j, "ckptfs_recipe");
	const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name");
	if (rc == 0 && (!cJSON_IsNumber(ver) || ver->valuedouble != 1)) {
		say(why, whylen, "\"ckptfs_recipe\": 1 missing (the format version)");
		rc = -EINVAL;
	}
	if (rc == 0 && (!cJSON_IsString(name) || !*name->valuestring || strlen(name->valuestring) > 200 ||
			strchr(name->valuestring, '/') || name->valuestring[0] == '.')) {
		say(why, whylen, "\"name\" must be a file name (no '/', not starting with '.')");
		rc = -EINVAL;
	}
	if (rc == 0 && !(r->name = strdup(name->valuestring)))
		rc = -ENOMEM;
	if (rc == 0) {
		const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prefixes");
		if (p && (str_list(p, 0, &r->prefixes, &r->nprefixes) < 0 || r->nprefixes > 32)) {
			say(why, whylen, "\"prefixes\" must be a list of strings");
			rc = -EINVAL;
		}
	}
	const cJSON *imp = cJSON_GetObjectItemCaseSensitive(j, "import_item");
	if (rc == 0 && imp) {
		if (!cJSON_IsString(imp) || !*imp->valuestring || strlen(imp->valuestring) > 200 ||
		    strchr(imp->valuestring, '/') || strchr(imp->valuestring, '.')) {
			say(why, whylen, "\"import_item\" must be an item name (no '/' or '.')");
			rc = -EINVAL;
		} else if (!(r->import_item = strdup(imp->valuestring))) {
			rc = -ENOMEM;
		}
	}
	const cJSON *ipre = cJSON_GetObjectItemCaseSensitive(j, "import_prefix");
	if (rc == 0 && ipre) {
		if (!cJSON_IsString(ipre) || strlen(ipre->valuestring) > 200) {
			say(why, whylen, "\"import_prefix\" must be a string (a prefix of the keys)");
			rc = -EINVAL;
		} else if (!(r->import_prefix = strdup(ipre->valuestring))) {
			rc = -ENOMEM;
		}
	}
	const cJSON *vars = cJSON_GetObjectItemCaseSensitive(j, "vars");
	if (rc == 0 && vars) {
		const cJSON *e;
		if (!cJSON_IsObject(vars)) {
			say(why, whylen, "\"vars\" must be an object of numbers");
			rc = -EINVAL;
		}
		cJSON_ArrayForEach(e, vars)
		{
			if (rc < 0)
				break;
			if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble) || r->nvars >= MAX_VARS / 2 ||
			    strlen(e->string) >= 64) {
				say(why, whylen, "\"vars\": %s must be a number (at most %d vars)", e->string,
				    MAX_VARS / 2);
				rc = -EINVAL;
				break;
			}
			r->var_name[r->nvars] = strdup(e->string);
			r->var_val[r->nvars++] = e->valuedouble;
		}
	}
	const cJSON *ts = cJSON_GetObjectItemCaseSensitive(j, "tensors");
	if (rc == 0 && (!cJSON_IsArray(ts) || cJSON_GetArraySize(ts) == 0 || cJSON_GetArraySize(ts) > 4096)) {
		say(why, whylen, "\"tensors\" must be a non-empty list of rules");
		rc = -EINVAL;
	}
	if (rc == 0) {
		r->rules = calloc((size_t)cJSON_GetArraySize(ts), sizeof(*r->rules));
		if (!r->rules)
			rc = -ENOMEM;
		const cJSON *e;
		cJSON_ArrayForEach(e, ts)
		{
			if (rc < 0)
				break;
			rc = parse_rule(e, &r->rules[r->nrules], r->nrules, why, whylen);
			r->nrules++;
		}
	}
	const cJSON *fs = cJSON_GetObjectItemCaseSensitive(j, "files");
	if (rc == 0 && fs) {
		if (!cJSON_IsArray(fs) || cJSON_GetArraySize(fs) > 64) {
			say(why, whylen, "\"files\" must be a list of at most 64 files");
			rc = -EINVAL;
		} else if (!(r->files = calloc((size_t)cJSON_GetArraySize(fs) + 1, sizeof(*r->files)))) {
			rc = -ENOMEM;
		}
		const cJSON *fl = rc == 0 ? fs : NULL, *e;
		cJSON_ArrayForEach(e, fl)
		{
			const cJSON *fn = cJSON_GetObjectItemCaseSensitive(e, "name");
			const cJSON *fj = cJSON_GetObjectItemCaseSensitive(e, "json");
			const cJSON *ft = cJSON_GetObjectItemCaseSensitive(e, "text");
			if (!cJSON_IsString(fn) || !*fn->valuestring || strchr(fn->valuestring, '/') ||
			    fn->valuestring[0] == '.' || strlen(fn->valuestring) > 200 ||
			    !strcmp(fn->valuestring, "model.safetensors") ||
			    !strncmp(fn->valuestring, "model-", 6) ||
			    !strcmp(fn->valuestring, "model.safetensors.index.json") ||
			    (!fj == !cJSON_IsString(ft))) {
				say(why, whylen,
				    "files[%d]: needs a plain \"name\" (not a weights file) and one of "
				    "\"json\" or \"text\"",
				    r->nfiles);
				rc = -EINVAL;
				break;
			}
			struct rfile *rf = &r->files[r->nfiles++];
			rf->name = strdup(fn->valuestring);
			if (fj)
				rf->json = cJSON_Duplicate(fj, 1);
			else
				rf->text = strdup(ft->valuestring);
		}
	}
	cJSON_Delete(j);
	if (rc < 0) {
		ckpt_recipe_free(r);
		return rc;
	}
	*out = r;
	return 0;
}

/* ---- lazy tensors: parts and their index maps ----------------------------- */

struct lt {
	int rank;
	uint64_t shape[CKPT_RECIPE_MAX_RANK];
	size_t nparts;
	ckpt_rpart *parts;
	ckpt_dtype dt;
};

static int part_nfactors(const ckpt_rpart *p, int rank)
{
	int n = 0;
	for (int d = 0; d < rank; d++)
		n += p->nf[d];
	return n;
}

/* Index of dim d's first factor. */
static int fstart(const ckpt_rpart *p, int d)
{
	int s = 0;
	for (int i = 0; i < d; i++)
		s += p->nf[i];
	return s;
}

static void drop_part(struct lt *t, size_t i)
{
	memmove(&t->parts[i], &t->parts[i + 1], (t->nparts - i - 1) * sizeof(*t->parts));
	t->nparts--;
}

static int op_take(struct lt *t, int a, uint64_t idx, char *why, size_t whylen)
{
	if (a < 0 || a >= t->rank || idx >= t->shape[a]) {
		say(why, whylen, "take(%d, %llu): out of range", a, (unsigned long long)idx);
		return -EINVAL;
	}
	for (size_t i = t->nparts; i-- > 0;) {
		ckpt_rpart *p = &t->parts[i];
		if (idx < p->lo[a] || idx >= p->hi[a]) {
			drop_part(t, i);
			continue;
		}
		uint64_t u = idx - p->lo[a];
		int s = fstart(p, a), total = part_nfactors(p, t->rank);
		for (int k = s + p->nf[a] - 1; k >= s; k--) {
			p->base[p->f[k].sdim] += (u % p->f[k].n) * p->f[k].stride;
			u /= p->f[k].n;
		}
		memmove(&p->f[s], &p->f[s + p->nf[a]], (size_t)(total - s - p->nf[a]) * sizeof(p->f[0]));
		for (int d = a; d < t->rank - 1; d++) {
			p->nf[d] = p->nf[d + 1];
			p->lo[d] = p->lo[d + 1];
			p->hi[d] = p->hi[d + 1];
		}
	}
	for (int d = a; d < t->rank - 1; d++)
		t->shape[d] = t->shape[d + 1];
	t->rank--;
	return 0;
}

static int op_slice(struct lt *t, int a, uint64_t start, uint64_t stop, char *why, size_t whylen)
{
	if (a < 0 || a >= t->rank || start >= stop || stop > t->shape[a]) {
		say(why, whylen, "slice(%d, %llu, %llu): out of range", a, (unsigned long long)start,
		    (unsigned long long)stop);
		return -EINVAL;
	}
	for (size_t i = t->nparts; i-- > 0;) {
		ckpt_rpart *p = &t->parts[i];
		uint64_t plo = p->lo[a] > start ? p->lo[a] : start, phi = p->hi[a] < stop ? p->hi[a] : stop;
		if (plo >= phi) {
			drop_part(t, i);
			continue;
		}
		uint64_t u0 = plo - p->lo[a], m = phi - plo;
		if (u0 || m != p->hi[a] - p->lo[a]) {
			int s = fstart(p, a);
			uint64_t inner = 1;
			for (int k = s + 1; k < s + p->nf[a]; k++)
				inner *= p->f[k].n;
			if (p->nf[a] == 0 || u0 % inner || m % inner) {
				say(why, whylen, "a slice of axis %d the index map cannot express", a);
				return -EINVAL;
			}
			p->base[p->f[s].sdim] += (u0 / inner) * p->f[s].stride;
			p->f[s].n = m / inner;
		}
		p->lo[a] = plo - start;
		p->hi[a] = phi - start;
	}
	t->shape[a] = stop - start;
	return 0;
}

static int op_transpose(struct lt *t, const int *perm, int n, char *why, size_t whylen)
{
	int seen[CKPT_RECIPE_MAX_RANK] = { 0 };
	if (n != t->rank) {
		say(why, whylen, "transpose: %d axes for a rank-%d tensor", n, t->rank);
		return -EINVAL;
	}
	for (int i = 0; i < n; i++) {
		if (perm[i] < 0 || perm[i] >= n || seen[perm[i]]++) {
			say(why, whylen, "transpose: not a permutation");
			return -EINVAL;
		}
	}
	uint64_t shape[CKPT_RECIPE_MAX_RANK];
	for (int i = 0; i < n; i++)
		shape[i] = t->shape[perm[i]];
	memcpy(t->shape, shape, sizeof(shape));
	for (size_t i = 0; i < t->nparts; i++) {
		ckpt_rpart *p = &t->parts[i], q = *p;
		int k = 0;
		for (int d = 0; d < n; d++) {
			int od = perm[d], s = fstart(p, od);
			q.lo[d] = p->lo[od];
			q.hi[d] = p->hi[od];
			q.nf[d] = p->nf[od];
			for (int j = 0; j < p->nf[od]; j++)
				q.f[k++] = p->f[s + j];
		}
		*p = q;
	}
	return 0;
}

static int op_reshape(struct lt *t, const uint64_t *ns, int nr, char *why, size_t whylen)
{
	uint64_t a = 1, b = 1;
	for (int d = 0; d < t->rank; d++)
		a *= t->shape[d];
	for (int d = 0; d < nr; d++)
		b *= ns[d];
	if (a != b) {
		say(why, whylen, "reshape: %llu elements into %llu", (unsigned long long)a,
		    (unsigned long long)b);
		return -EINVAL;
	}
	int k = 0; /* common prefix: parts may be partial there */
	while (k < t->rank && k < nr && t->shape[k] == ns[k])
		k++;
	for (size_t i = 0; i < t->nparts; i++) {
		ckpt_rpart *p = &t->parts[i], q = *p;
		for (int d = k; d < t->rank; d++)
			if (p->lo[d] != 0 || p->hi[d] != t->shape[d]) {
				say(why, whylen, "reshape across a concat or pad boundary");
				return -EINVAL;
			}
		/* the factors of dims >= k, n == 1 ones dropped */
		ckpt_rfactor fl[CKPT_RECIPE_MAX_FACTORS * 2];
		int nfl = 0, s = fstart(p, k), tot = part_nfactors(p, t->rank);
		for (int j = s; j < tot; j++)
			if (p->f[j].n != 1)
				fl[nfl++] = p->f[j];
		int outk = s; /* factors of dims < k stay */
		ckpt_rfactor nf[CKPT_RECIPE_MAX_FACTORS * 2];
		int nnf = 0, per[CKPT_RECIPE_MAX_RANK] = { 0 };
		/* new dims from the innermost: consume factors from the end */
		ckpt_rfactor rev[CKPT_RECIPE_MAX_FACTORS * 2];
		int nrev = 0;
		for (int d = nr - 1; d >= k; d--) {
			uint64_t need = ns[d];
			while (need > 1) {
				if (nfl == 0) {
					say(why, whylen, "reshape: factors do not add up");
					return -EINVAL;
				}
				ckpt_rfactor f = fl[nfl - 1];
				if (f.n <= need) {
					if (need % f.n) {
						say(why, whylen, "a reshape the index map cannot express");
						return -EINVAL;
					}
					need /= f.n;
					nfl--;
					rev[nrev++] = f;
				} else {
					if (f.n % need) {
						say(why, whylen, "a reshape the index map cannot express");
						return -EINVAL;
					}
					rev[nrev++] = (ckpt_rfactor){ need, f.stride, f.sdim };
					fl[nfl - 1] = (ckpt_rfactor){ f.n / need, f.stride * need, f.sdim };
					need = 1;
				}
				per[d]++;
				if (nrev >= CKPT_RECIPE_MAX_FACTORS * 2) {
					say(why, whylen, "reshape: too many factors");
					return -EINVAL;
				}
			}
		}
		for (int j = nrev - 1; j >= 0; j--)
			nf[nnf++] = rev[j];
		if (outk + nnf > CKPT_RECIPE_MAX_FACTORS) {
			say(why, whylen, "reshape: more than %d factors", CKPT_RECIPE_MAX_FACTORS);
			return -EINVAL;
		}
		memcpy(&q.f[outk], nf, (size_t)nnf * sizeof(nf[0]));
		for (int d = k; d < nr; d++) {
			q.nf[d] = per[d];
			q.lo[d] = 0;
			q.hi[d] = ns[d];
		}
		*p = q;
	}
	memcpy(t->shape, ns, (size_t)nr * sizeof(*ns));
	t->rank = nr;
	return 0;
}

/* Insert a size-1 axis at a (for stack). */
static void insert_axis(struct lt *t, int a)
{
	for (size_t i = 0; i < t->nparts; i++) {
		ckpt_rpart *p = &t->parts[i];
		for (int d = t->rank; d > a; d--) {
			p->nf[d] = p->nf[d - 1];
			p->lo[d] = p->lo[d - 1];
			p->hi[d] = p->hi[d - 1];
		}
		p->nf[a] = 0;
		p->lo[a] = 0;
		p->hi[a] = 1;
	}
	for (int d = t->rank; d > a; d--)
		t->shape[d] = t->shape[d - 1];
	t->shape[a] = 1;
	t->rank++;
}

static void lt_free(struct lt *t)
{
	free(t->parts);
	t->parts = NULL;
	t->nparts = 0;
}

/* ---- planning -------------------------------------------------------------- */

struct src_map {
	const ckpt_recipe_src *srcs;
	size_t n;
	const char *base; /* prefix of every key (item + recipe prefix) */
};

static long find_src(const struct src_map *m, const char *key)
{
	size_t bl = strlen(m->base);
	for (size_t i = 0; i < m->n; i++)
		if (!strncmp(m->srcs[i].name, m->base, bl) && !strcmp(m->srcs[i].name + bl, key))
			return (long)i;
	return -1;
}

static int plan_add(ckpt_rplan *p, ckpt_rtensor *t)
{
	if (p->n >= CKPT_RECIPE_MAX_TENSORS)
		return -E2BIG;
	if (p->n == p->cap) {
		size_t nc = p->cap ? p->cap * 2 : 64;
		ckpt_rtensor *x = realloc(p->t, nc * sizeof(*x));
		if (!x)
			return -ENOMEM;
		p->t = x;
		p->cap = nc;
	}
	p->t[p->n++] = *t;
	return 0;
}

static void tensor_free(ckpt_rtensor *t)
{
	free(t->name);
	free(t->parts);
	free(t->desc);
}

void ckpt_rplan_free(ckpt_rplan *p)
{
	if (!p)
		return;
	for (size_t i = 0; i < p->n; i++)
		tensor_free(&p->t[i]);
	free(p->t);
	for (size_t i = 0; i < p->nfiles; i++) {
		free(p->fname[i]);
		free(p->fcontent[i]);
	}
	free(p->fname);
	free(p->fcontent);
	free(p->flen);
	free(p);
}

static void desc_add(char *d, size_t cap, const char *fmt, ...)
{
	size_t n = strlen(d);
	if (n + 1 >= cap)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(d + n, cap - n, fmt, ap);
	va_end(ap);
}

/* Bind or check a rule's shape pattern against a source shape. */
static int check_shape(const struct rule *ru, const ckpt_recipe_src *s, struct env *env, char *why,
		       size_t whylen)
{
	if (!ru->nshape)
		return 0;
	char have[256] = "";
	for (int d = 0; d < s->rank && d < CKPT_RECIPE_MAX_RANK; d++)
		desc_add(have, sizeof(have), "%s%llu", d ? "," : "", (unsigned long long)s->shape[d]);
	if (s->rank != ru->nshape) {
		say(why, whylen, "%s: %s has shape [%s], the rule wants rank %d", ru->name, s->name, have,
		    ru->nshape);
		return -ENOENT;
	}
	for (int d = 0; d < ru->nshape; d++) {
		const char *e = ru->shape[d];
		double v;
		int ident = isalpha((unsigned char)e[0]) || e[0] == '_';
		for (const char *c = e; *c && ident; c++)
			ident = isalnum((unsigned char)*c) || *c == '_';
		if (ident && !env_get(env, e, strlen(e), &v)) {
			if (env_set(env, e, (double)s->shape[d]) < 0) {
				say(why, whylen, "%s: too many names", ru->name);
				return -EINVAL;
			}
			continue;
		}
		uint64_t want;
		int rc = eval_uint(e, env, &want, why, whylen);
		if (rc < 0)
			return rc;
		if (want != s->shape[d]) {
			say(why, whylen, "%s: %s has shape [%s]; axis %d is %s = %llu in this recipe",
			    ru->name, s->name, have, d, e, (unsigned long long)want);
			return -ENOENT;
		}
	}
	return 0;
}

static int arg_int(const struct rop *o, int i, const struct env *env, int64_t *out, char *why, size_t whylen)
{
	uint64_t v;
	int rc = eval_uint(o->args[i], env, &v, why, whylen);
	*out = (int64_t)v;
	return rc;
}

/* Build target tensor(s) of rule ru for one binding. */
static int build_one(const ckpt_recipe *r, const struct rule *ru, const long *in, const struct src_map *m,
		     struct env *env, ckpt_rplan *plan, char *why, size_t whylen)
{
	char tname[MAX_NAME];
	int rc = render(ru->name, env, tname, sizeof(tname), why, whylen);
	if (rc < 0)
		return rc;
	(void)r;
	ckpt_rtensor t = { 0 };
	t.scale = 1;
	t.bias = 0;
	char desc[1024] = "";
	struct lt x[MAX_INPUTS];
	memset(x, 0, sizeof(x));
	for (int i = 0; i < ru->nfrom; i++) {
		const ckpt_recipe_src *s = &m->srcs[in[i]];
		if (s->rank > CKPT_RECIPE_MAX_RANK) {
			say(why, whylen, "%s: %s has rank %d (at most %d)", ru->name, s->name, s->rank,
			    CKPT_RECIPE_MAX_RANK);
			rc = -EINVAL;
			goto out;
		}
		x[i].rank = s->rank;
		x[i].dt = s->dtype;
		memcpy(x[i].shape, s->shape, (size_t)s->rank * sizeof(uint64_t));
		x[i].parts = calloc(1, sizeof(ckpt_rpart));
		if (!x[i].parts) {
			rc = -ENOMEM;
			goto out;
		}
		x[i].nparts = 1;
		ckpt_rpart *p = &x[i].parts[0];
		p->input = (size_t)in[i];
		p->srank = s->rank;
		for (int d = 0; d < s->rank; d++) {
			p->hi[d] = s->shape[d];
			p->nf[d] = 1;
			p->f[d] = (ckpt_rfactor){ s->shape[d], 1, d };
		}
		desc_add(desc, sizeof(desc), "%s%s", i ? " + " : "", s->name + strlen(m->base));
		if (i && x[i].dt != x[0].dt) {
			say(why, whylen, "%s: inputs of different dtypes", ru->name);
			rc = -ENOENT;
			goto out;
		}
	}
	struct lt *cur = &x[0];
	ckpt_dtype out_dt = cur->dt;
	for (int oi = 0; oi < ru->nops; oi++) {
		const struct rop *o = &ru->ops[oi];
		int64_t a0 = 0, a1 = 0, a2 = 0;
		switch (o->kind) {
		case OP_TAKE:
			if ((rc = arg_int(o, 0, env, &a0, why, whylen)) < 0 ||
			    (rc = arg_int(o, 1, env, &a1, why, whylen)) < 0)
				goto out;
			rc = op_take(cur, (int)a0, (uint64_t)a1, why, whylen);
			desc_add(desc, sizeof(desc), " take(%lld,%lld)", (long long)a0, (long long)a1);
			break;
		case OP_SLICE:
		case OP_SPLIT:
			if ((rc = arg_int(o, 0, env, &a0, why, whylen)) < 0 ||
			    (rc = arg_int(o, 1, env, &a1, why, whylen)) < 0 ||
			    (rc = arg_int(o, 2, env, &a2, why, whylen)) < 0)
				goto out;
			if (o->kind == OP_SPLIT) {
				/* split(axis, parts, index): equal parts */
				if (a0 >= cur->rank || a1 <= 0 || a2 >= a1 || cur->shape[a0] % (uint64_t)a1) {
					say(why, whylen, "split(%lld, %lld, %lld): not equal parts",
					    (long long)a0, (long long)a1, (long long)a2);
					rc = -EINVAL;
					goto out;
				}
				uint64_t w = cur->shape[a0] / (uint64_t)a1;
				desc_add(desc, sizeof(desc), " split(%lld,%lld,%lld)", (long long)a0,
					 (long long)a1, (long long)a2);
				rc = op_slice(cur, (int)a0, (uint64_t)a2 * w, (uint64_t)(a2 + 1) * w, why,
					      whylen);
			} else {
				desc_add(desc, sizeof(desc), " slice(%lld,%lld,%lld)", (long long)a0,
					 (long long)a1, (long long)a2);
				rc = op_slice(cur, (int)a0, (uint64_t)a1, (uint64_t)a2, why, whylen);
			}
			break;
		case OP_PAD:
			if ((rc = arg_int(o, 0, env, &a0, why, whylen)) < 0 ||
			    (rc = arg_int(o, 1, env, &a1, why, whylen)) < 0)
				goto out;
			if (a0 >= cur->rank || a1 <= 0 || (uint64_t)a1 > CKPT_RECIPE_MAX_PAD) {
				say(why, whylen, "pad(%lld, %lld): out of range", (long long)a0,
				    (long long)a1);
				rc = -EINVAL;
				goto out;
			}
			desc_add(desc, sizeof(desc), " pad(%lld,%lld)", (long long)a0, (long long)a1);
			if ((uint64_t)a1 < cur->shape[a0])
				rc = op_slice(cur, (int)a0, 0, (uint64_t)a1, why, whylen);
			else
				cur->shape[a0] = (uint64_t)a1;
			break;
		case OP_TRANSPOSE: {
			int perm[CKPT_RECIPE_MAX_RANK];
			desc_add(desc, sizeof(desc), " transpose(");
			for (int i = 0; i < o->nargs; i++) {
				if ((rc = arg_int(o, i, env, &a0, why, whylen)) < 0)
					goto out;
				perm[i] = (int)(a0 < CKPT_RECIPE_MAX_RANK ? a0 : -1);
				desc_add(desc, sizeof(desc), "%s%lld", i ? "," : "", (long long)a0);
			}
			desc_add(desc, sizeof(desc), ")");
			rc = op_transpose(cur, perm, o->nargs, why, whylen);
			break;
		}
		case OP_RESHAPE: {
			uint64_t ns[CKPT_RECIPE_MAX_RANK];
			desc_add(desc, sizeof(desc), " reshape(");
			for (int i = 0; i < o->nargs; i++) {
				if ((rc = eval_uint(o->args[i], env, &ns[i], why, whylen)) < 0)
					goto out;
				desc_add(desc, sizeof(desc), "%s%llu", i ? "," : "",
					 (unsigned long long)ns[i]);
			}
			desc_add(desc, sizeof(desc), ")");
			rc = op_reshape(cur, ns, o->nargs, why, whylen);
			break;
		}
		case OP_STACK:
		case OP_CONCAT: {
			if ((rc = arg_int(o, 0, env, &a0, why, whylen)) < 0)
				goto out;
			int stack = o->kind == OP_STACK;
			for (int i = 0; i < ru->nfrom; i++) {
				if (a0 > x[i].rank - (stack ? 0 : 1)) {
					say(why, whylen, "%s(%lld): no such axis", op_names[o->kind],
					    (long long)a0);
					rc = -EINVAL;
					goto out;
				}
				if (stack)
					insert_axis(&x[i], (int)a0);
			}
			uint64_t off = 0;
			size_t np = 0;
			for (int i = 0; i < ru->nfrom; i++) {
				for (int d = 0; d < x[0].rank; d++)
					if (x[i].rank != x[0].rank ||
					    (d != a0 && x[i].shape[d] != x[0].shape[d])) {
						say(why, whylen, "%s: inputs' shapes do not fit together",
						    op_names[o->kind]);
						rc = -ENOENT;
						goto out;
					}
				np += x[i].nparts;
			}
			ckpt_rpart *parts = calloc(np, sizeof(*parts));
			if (!parts) {
				rc = -ENOMEM;
				goto out;
			}
			np = 0;
			for (int i = 0; i < ru->nfrom; i++) {
				for (size_t j = 0; j < x[i].nparts; j++) {
					parts[np] = x[i].parts[j];
					parts[np].lo[a0] += off;
					parts[np].hi[a0] += off;
					np++;
				}
				off += x[i].shape[a0];
			}
			free(x[0].parts);
			x[0].parts = parts;
			x[0].nparts = np;
			x[0].shape[a0] = off;
			desc_add(desc, sizeof(desc), " %s(%lld)", op_names[o->kind], (long long)a0);
			break;
		}
		case OP_AFFINE: {
			double s, b = 0;
			const char *w;
			if (eval(o->args[0], strlen(o->args[0]), env, &s, &w) < 0 ||
			    (o->nargs > 1 && eval(o->args[1], strlen(o->args[1]), env, &b, &w) < 0)) {
				say(why, whylen, "%s: affine: %s", ru->name, w);
				rc = -EINVAL;
				goto out;
			}
			if (t.elem && (t.scale != 1 || t.bias != 0)) {
				say(why, whylen, "%s: one affine op per tensor", ru->name);
				rc = -EINVAL;
				goto out;
			}
			t.scale = s;
			t.bias = b;
			t.elem = 1;
			desc_add(desc, sizeof(desc), " affine(%.9g,%.9g)", s, b);
			break;
		}
		case OP_DIVIDE: {
			double c;
			const char *w;
			if (eval(o->args[0], strlen(o->args[0]), env, &c, &w) < 0 || c == 0 ||
			    t.divisor != 0) {
				say(why, whylen, "%s: divide: %s", ru->name,
				    w ? w : "one non-zero divisor per tensor");
				rc = -EINVAL;
				goto out;
			}
			t.divisor = c;
			t.elem = 1;
			desc_add(desc, sizeof(desc), " divide(%.9g)", c);
			break;
		}
		case OP_CAST:
			out_dt = ckpt_dtype_from_name(o->args[0]);
			t.elem = 1;
			desc_add(desc, sizeof(desc), " cast(%s)", o->args[0]);
			break;
		}
		if (rc < 0) {
			char sub[256];
			snprintf(sub, sizeof(sub), "%s", why ? why : "?");
			say(why, whylen, "%s: ops[%d]: %s", tname, oi, sub);
			goto out;
		}
	}
	if (t.elem) {
		ckpt_dtype ok[] = { CKPT_DT_BFLOAT16, CKPT_DT_FLOAT16, CKPT_DT_FLOAT32, CKPT_DT_FLOAT64 };
		int in_ok = 0, out_ok = 0;
		for (size_t i = 0; i < 4; i++) {
			in_ok |= cur->dt == ok[i];
			out_ok |= out_dt == ok[i];
		}
		if (!in_ok || !out_ok) {
			say(why, whylen, "%s: affine and cast need float16/bfloat16/float32/float64", tname);
			rc = -ENOENT;
			goto out;
		}
		if (out_dt == cur->dt && t.scale == 1 && t.bias == 0 && t.divisor == 0)
			t.elem = 0; /* a cast to the same type */
	}
	if (cur->rank > CKPT_RECIPE_MAX_RANK) {
		rc = -EINVAL;
		goto out;
	}
	t.name = strdup(tname);
	t.desc = strdup(desc);
	t.dtype = out_dt;
	t.src_dtype = cur->dt;
	t.rank = cur->rank;
	memcpy(t.shape, cur->shape, sizeof(t.shape));
	t.parts = cur->parts;
	t.nparts = cur->nparts;
	cur->parts = NULL;
	if (!t.name || !t.desc) {
		tensor_free(&t);
		rc = -ENOMEM;
		goto out;
	}
	rc = plan_add(plan, &t);
	if (rc < 0)
		tensor_free(&t);
out:
	for (int i = 0; i < ru->nfrom; i++)
		lt_free(&x[i]);
	return rc;
}

/* The "for" loops of a rule, then build. */
static int run_loops(const ckpt_recipe *r, const struct rule *ru, const long *in, const struct src_map *m,
		     struct env *env, int level, ckpt_rplan *plan, char *why, size_t whylen)
{
	if (level == ru->nfor) {
		if (ru->when) {
			double v;
			const char *w;
			if (eval(ru->when, strlen(ru->when), env, &v, &w) < 0) {
				say(why, whylen, "%s: when: %s", ru->name, w);
				return -EINVAL;
			}
			if (v == 0)
				return 0;
		}
		return build_one(r, ru, in, m, env, plan, why, whylen);
	}
	uint64_t n;
	int rc = eval_uint(ru->for_expr[level], env, &n, why, whylen);
	if (rc < 0)
		return rc;
	if (n > MAX_LOOP) {
		say(why, whylen, "%s: loop of %llu", ru->name, (unsigned long long)n);
		return -EINVAL;
	}
	int mark = env->n;
	for (uint64_t i = 0; i < n; i++) {
		env->n = mark;
		if (env_set(env, ru->for_var[level], (double)i) < 0)
			return -EINVAL;
		if ((rc = run_loops(r, ru, in, m, env, level + 1, plan, why, whylen)) < 0)
			return rc;
	}
	env->n = mark;
	return 0;
}

/* Rule ru over every binding of its captures.  1 when something matched. */
static int run_rule(const ckpt_recipe *r, const struct rule *ru, const struct src_map *m, struct env *env,
		    ckpt_rplan *plan, char *why, size_t whylen)
{
	size_t bl = strlen(m->base);
	int any = 0, mark = env->n;
	char capn[8][64];
	double capmax[8];
	int ncap = 0;
	/* the first key enumerates the captures; the others are rendered */
	for (size_t i = 0; i < m->n; i++) {
		if (strncmp(m->srcs[i].name, m->base, bl))
			continue;
		env->n = mark;
		char vars[8][64];
		int nv = 0;
		if (!match(ru->from[0], m->srcs[i].name + bl, env, vars, &nv))
			continue;
		/* captured names must outlive this iteration's env entries */
		char keep[8][64];
		for (int k = 0; k < nv; k++) {
			memcpy(keep[k], vars[k], 64);
			env->name[mark + k] = keep[k];
		}
		for (int k = 0; k < nv; k++) { /* the largest value of each capture */
			int c = 0;
			while (c < ncap && strcmp(capn[c], vars[k]))
				c++;
			if (c == ncap && ncap < 8) {
				memcpy(capn[ncap], vars[k], 64);
				capmax[ncap++] = env->val[mark + k];
			} else if (c < ncap && env->val[mark + k] > capmax[c]) {
				capmax[c] = env->val[mark + k];
			}
		}
		long in[MAX_INPUTS];
		in[0] = (long)i;
		int rc = 0;
		for (int k = 1; k < ru->nfrom && rc == 0; k++) {
			char key[MAX_NAME];
			rc = render(ru->from[k], env, key, sizeof(key), why, whylen);
			if (rc == 0 && (in[k] = find_src(m, key)) < 0) {
				say(why, whylen, "%s: source %s%s missing", ru->name, m->base, key);
				rc = -ENOENT;
			}
		}
		int smark = env->n;
		for (int k = 0; k < ru->nfrom && rc == 0; k++)
			rc = check_shape(ru, &m->srcs[in[k]], env, why, whylen);
		/* shape names bound by an iteration with captures stay bound (they
		 * must agree across layers); only the captures are dropped */
		if (rc == 0)
			rc = run_loops(r, ru, in, m, env, 0, plan, why, whylen);
		if (rc < 0) {
			env->n = mark;
			return rc;
		}
		/* keep the shape bindings, drop the captures */
		for (int k = smark; k < env->n; k++) {
			env->name[mark + (k - smark)] = env->name[k];
			env->val[mark + (k - smark)] = env->val[k];
		}
		env->n = mark + (env->n - smark);
		mark = env->n;
		any = 1;
		if (nv == 0)
			break; /* a plain key matches once */
	}
	env->n = mark; /* a key that failed to match half-way may have bound a capture */
	/* num_VAR: how many values a capture took (its largest + 1) */
	for (int c = 0; c < ncap; c++) {
		char nm[72];
		double have;
		int w = snprintf(nm, sizeof(nm), "num_%s", capn[c]);
		if (w < 0 || (size_t)w >= sizeof(nm))
			continue; /* a capture name this long has no num_ variable */
		if (env_get(env, nm, strlen(nm), &have)) {
			env_set(env, nm, capmax[c] + 1 > have ? capmax[c] + 1 : have);
		} else if (env->nown < 16) {
			memcpy(env->own[env->nown], nm, sizeof(nm));
			if (env_set(env, env->own[env->nown], capmax[c] + 1) == 0)
				env->nown++;
		}
	}
	return any;
}

static int cmp_tensor(const void *a, const void *b)
{
	return strcmp(((const ckpt_rtensor *)a)->name, ((const ckpt_rtensor *)b)->name);
}

/* Template substitution over a JSON value (files). */
static int fill_json(cJSON *j, const struct env *env, char *why, size_t whylen)
{
	cJSON *e;
	cJSON_ArrayForEach(e, j)
	{
		if (cJSON_IsString(e) && strchr(e->valuestring, '{')) {
			const char *s = e->valuestring;
			size_t n = strlen(s);
			char out[1024];
			int rc;
			if (s[0] == '{' && s[n - 1] == '}' && !memchr(s + 1, '{', n - 2)) {
				double v;
				const char *w;
				if (eval(s + 1, n - 2, env, &v, &w) < 0) {
					say(why, whylen, "files: '%s': %s", s, w);
					return -EINVAL;
				}
				cJSON *num = cJSON_CreateNumber(v);
				if (!num)
					return -ENOMEM;
				/* in place, by pointer: a key met twice stays two items */
				if (e->string && !(num->string = strdup(e->string))) {
					cJSON_Delete(num);
					return -ENOMEM;
				}
				cJSON_ReplaceItemViaPointer(j, e, num);
				e = num;
				continue;
			}
			if ((rc = render(s, env, out, sizeof(out), why, whylen)) < 0)
				return rc;
			cJSON_SetValuestring(e, out);
		} else if (cJSON_IsObject(e) || cJSON_IsArray(e)) {
			int rc = fill_json(e, env, why, whylen);
			if (rc < 0)
				return rc;
		}
	}
	return 0;
}

static int make_files(const ckpt_recipe *r, const struct env *env, ckpt_rplan *p, char *why, size_t whylen)
{
	if (!r->nfiles)
		return 0;
	p->fname = calloc((size_t)r->nfiles, sizeof(char *));
	p->fcontent = calloc((size_t)r->nfiles, sizeof(char *));
	p->flen = calloc((size_t)r->nfiles, sizeof(size_t));
	if (!p->fname || !p->fcontent || !p->flen)
		return -ENOMEM;
	for (int i = 0; i < r->nfiles; i++) {
		const struct rfile *f = &r->files[i];
		char *content = NULL;
		if (f->json) {
			cJSON *c = cJSON_Duplicate(f->json, 1);
			if (!c)
				return -ENOMEM;
			int rc = fill_json(c, env, why, whylen);
			if (rc == 0) {
				char *s = cJSON_Print(c);
				if (s) {
					size_t n = strlen(s);
					content = malloc(n + 2);
					if (content) {
						memcpy(content, s, n);
						content[n] = '\n';
						content[n + 1] = 0;
					}
					cJSON_free(s);
				}
			}
			cJSON_Delete(c);
			if (rc < 0)
				return rc;
		} else {
			size_t cap = strlen(f->text) * 4 + 256;
			content = malloc(cap);
			if (content) {
				int rc = render(f->text, env, content, cap, why, whylen);
				if (rc < 0) {
					free(content);
					return rc;
				}
			}
		}
		if (!content)
			return -ENOMEM;
		p->fname[p->nfiles] = strdup(f->name);
		p->fcontent[p->nfiles] = content;
		p->flen[p->nfiles] = strlen(content);
		if (!p->fname[p->nfiles++])
			return -ENOMEM;
	}
	return 0;
}

/* An absent rule: -ENOENT with the key when its `from` matches one. */
static int check_absent(const struct rule *ru, const struct src_map *m, char *why, size_t whylen)
{
	size_t bl = strlen(m->base);
	for (size_t i = 0; i < m->n; i++) {
		struct env e = { .n = 0 }; /* captures match any value */
		char vars[8][64];
		int nv = 0;
		if (!strncmp(m->srcs[i].name, m->base, bl) &&
		    match(ru->from[0], m->srcs[i].name + bl, &e, vars, &nv)) {
			say(why, whylen, "%s: source key %s is present (the rule says absent)", ru->name,
			    m->srcs[i].name);
			return -ENOENT;
		}
	}
	return 0;
}

/* Every group needs one rule that matched (hit[i]: rule i did). */
static int check_groups(const ckpt_recipe *r, const unsigned char *hit, const struct src_map *m, char *why,
			size_t whylen)
{
	for (int i = 0; i < r->nrules; i++) {
		const char *g = r->rules[i].group;
		int first = 1, any = 0;
		for (int k = 0; g && k < r->nrules; k++)
			if (r->rules[k].group && !strcmp(r->rules[k].group, g)) {
				first &= k >= i;
				any |= hit[k];
			}
		if (g && first && !any) {
			say(why, whylen, "%s: no source key %s%s (nor one of the other rules of group %s)",
			    r->rules[i].name, m->base, r->rules[i].from[0], g);
			return -ENOENT;
		}
	}
	return 0;
}

static int plan_with_base(const ckpt_recipe *r, const struct src_map *m, ckpt_rplan **out, char *why,
			  size_t whylen)
{
	ckpt_rplan *p = calloc(1, sizeof(*p));
	unsigned char *hit = calloc((size_t)r->nrules + 1, 1);
	if (!p || !hit) {
		free(p);
		free(hit);
		return -ENOMEM;
	}
	struct env env = { .n = 0 };
	for (int i = 0; i < r->nvars; i++)
		env_set(&env, r->var_name[i], r->var_val[i]);
	int rc = 0;
	for (int i = 0; i < r->nrules && rc == 0; i++) {
		const struct rule *ru = &r->rules[i];
		if (ru->alias)
			continue;
		if (ru->absent) {
			rc = check_absent(ru, m, why, whylen);
			continue;
		}
		rc = run_rule(r, ru, m, &env, p, why, whylen);
		if (rc == 0 && !ru->optional && !ru->group) {
			say(why, whylen, "%s: no source key %s%s", ru->name, m->base, ru->from[0]);
			rc = -ENOENT;
		}
		hit[i] = rc > 0;
		rc = rc > 0 ? 0 : rc;
	}
	if (rc == 0)
		rc = check_groups(r, hit, m, why, whylen);
	free(hit);
	/* aliases: every tensor the alias template names a second time */
	for (int i = 0; i < r->nrules && rc == 0; i++) {
		const struct rule *ru = &r->rules[i];
		if (!ru->alias)
			continue;
		char an[MAX_NAME], tn[MAX_NAME];
		if ((rc = render(ru->alias, &env, an, sizeof(an), why, whylen)) < 0 ||
		    (rc = render(ru->name, &env, tn, sizeof(tn), why, whylen)) < 0)
			break;
		size_t k;
		for (k = 0; k < p->n && strcmp(p->t[k].name, an); k++)
			;
		if (k == p->n) {
			if (ru->optional)
				continue;
			say(why, whylen, "%s: alias of %s, which this checkpoint does not give", tn, an);
			rc = -ENOENT;
			break;
		}
		ckpt_rtensor t = p->t[k];
		t.name = strdup(tn);
		t.desc = malloc(strlen(an) + 16);
		t.parts = malloc(t.nparts * sizeof(*t.parts));
		if (!t.name || !t.desc || !t.parts) {
			tensor_free(&t);
			rc = -ENOMEM;
			break;
		}
		sprintf(t.desc, "alias of %s", an);
		memcpy(t.parts, p->t[k].parts, t.nparts * sizeof(*t.parts));
		if ((rc = plan_add(p, &t)) < 0)
			tensor_free(&t);
	}
	if (rc == 0) {
		/* sorted by name, duplicates refused */
		qsort(p->t, p->n, sizeof(*p->t), cmp_tensor);
		for (size_t i = 1; i < p->n && rc == 0; i++)
			if (!strcmp(p->t[i].name, p->t[i - 1].name)) {
				say(why, whylen, "two rules make %s", p->t[i].name);
				rc = -EINVAL;
			}
		if (rc == 0 && p->n == 0) {
			say(why, whylen, "no tensor matched");
			rc = -ENOENT;
		}
	}
	if (rc == 0)
		rc = make_files(r, &env, p, why, whylen);
	if (rc < 0) {
		ckpt_rplan_free(p);
		return rc;
	}
	*out = p;
	return 0;
}

int ckpt_recipe_plan(const ckpt_recipe *r, const ckpt_recipe_src *srcs, size_t n, ckpt_rplan **out, char *why,
		     size_t whylen)
{
	*out = NULL;
	/* candidate bases: each recipe prefix alone, then after each item name */
	const char *deflt[1] = { "" };
	const char *const *pre = r->nprefixes ? (const char *const *)r->prefixes : deflt;
	int npre = r->nprefixes ? r->nprefixes : 1;
	const struct rule *first = NULL;
	for (int i = 0; i < r->nrules && !first; i++)
		if (!r->rules[i].alias && !r->rules[i].optional && !r->rules[i].group && !r->rules[i].absent)
			first = &r->rules[i];
	if (!first) {
		say(why, whylen, "no required rule");
		return -EINVAL;
	}
	int rc = -ENOENT, tried = 0;
	char best[512] = "";
	for (size_t item = 0; item <= n; item++) {
		char itemp[256] = "";
		if (item > 0) {
			const char *dot = strchr(srcs[item - 1].name, '.');
			size_t il = dot ? (size_t)(dot - srcs[item - 1].name) + 1 : 0;
			if (!il || il >= sizeof(itemp))
				continue;
			memcpy(itemp, srcs[item - 1].name, il);
			itemp[il] = 0;
			int seen = 0; /* each item name once */
			for (size_t k = 0; k + 1 < item && !seen; k++)
				seen = !strncmp(srcs[k].name, itemp, il);
			if (seen)
				continue;
		}
		for (int pi = 0; pi < npre; pi++) {
			char base[512];
			snprintf(base, sizeof(base), "%s%s", itemp, pre[pi]);
			struct src_map m = { srcs, n, base };
			/* does the first required rule's first key match here? */
			struct env env = { .n = 0 };
			int hit = 0;
			size_t bl = strlen(base);
			for (size_t i = 0; i < n && !hit; i++) {
				char vars[8][64];
				int nv = 0;
				env.n = 0;
				hit = !strncmp(srcs[i].name, base, bl) &&
				      match(first->from[0], srcs[i].name + bl, &env, vars, &nv);
			}
			if (!hit)
				continue;
			tried = 1;
			rc = plan_with_base(r, &m, out, best, sizeof(best));
			if (rc == 0 || rc == -ENOMEM)
				return rc;
		}
	}
	if (!tried)
		say(why, whylen, "%s: no source key %s (under any of the recipe's prefixes)", first->name,
		    first->from[0]);
	else
		say(why, whylen, "%s", best);
	return rc;
}

size_t ckpt_rplan_count(const ckpt_rplan *p)
{
	return p->n;
}

const ckpt_rtensor *ckpt_rplan_tensor(const ckpt_rplan *p, size_t i)
{
	return i < p->n ? &p->t[i] : NULL;
}

size_t ckpt_rplan_nfiles(const ckpt_rplan *p)
{
	return p->nfiles;
}

const char *ckpt_rplan_file(const ckpt_rplan *p, size_t i, const char **content, size_t *len)
{
	if (i >= p->nfiles)
		return NULL;
	*content = p->fcontent[i];
	*len = p->flen[i];
	return p->fname[i];
}

char *ckpt_rplan_table(const ckpt_rplan *p)
{
	size_t cap = 256, len = 0;
	for (size_t i = 0; i < p->n; i++)
		cap += strlen(p->t[i].name) + strlen(p->t[i].desc) + 200;
	char *s = malloc(cap);
	if (!s)
		return NULL;
	len += (size_t)snprintf(s, cap, "%-56s %-22s %-9s %s\n", "TARGET", "SHAPE", "DTYPE", "FROM");
	for (size_t i = 0; i < p->n; i++) {
		const ckpt_rtensor *t = &p->t[i];
		char shape[200] = "[";
		for (int d = 0; d < t->rank; d++)
			desc_add(shape, sizeof(shape), "%s%llu", d ? "," : "",
				 (unsigned long long)t->shape[d]);
		desc_add(shape, sizeof(shape), "]");
		len += (size_t)snprintf(s + len, cap - len, "%-56s %-22s %-9s %s\n", t->name, shape,
					ckpt_dtype_get(t->dtype)->name, t->desc);
	}
	for (size_t i = 0; i < p->nfiles; i++)
		len += (size_t)snprintf(s + len, cap - len, "%-56s %-22s %-9s %s\n", p->fname[i], "-", "file",
					"literal");
	return s;
}

/* ---- reading: boxes, gather, conversions ----------------------------------- */

uint64_t ckpt_rtensor_count(const ckpt_rtensor *t)
{
	uint64_t c = 1;
	for (int d = 0; d < t->rank; d++)
		c *= t->shape[d];
	return c;
}

static void unravel(const ckpt_rtensor *t, uint64_t e, uint64_t *idx)
{
	for (int d = t->rank - 1; d >= 0; d--) {
		idx[d] = e % t->shape[d];
		e /= t->shape[d];
	}
}

int ckpt_rtensor_region(const ckpt_rtensor *t, size_t part, ckpt_region *r)
{
	const ckpt_rpart *p = &t->parts[part];
	int fi = 0, last = -1;
	r->rank = p->srank;
	for (int d = 0; d < p->srank; d++) {
		r->start[d] = p->base[d];
		r->stop[d] = p->base[d] + 1;
	}
	for (int d = 0; d < t->rank; d++) {
		if (p->lo[d] != 0 || p->hi[d] != t->shape[d] || p->nf[d] > 1)
			return 0;
		if (p->nf[d] == 1) {
			const ckpt_rfactor *f = &p->f[fi++];
			if (f->stride != 1 || f->sdim <= last)
				return 0;
			last = f->sdim;
			r->stop[f->sdim] = p->base[f->sdim] + f->n;
		}
	}
	return 1;
}

int ckpt_rtensor_box(const ckpt_rtensor *t, size_t part, uint64_t e0, uint64_t e1, ckpt_region *box)
{
	const ckpt_rpart *p = &t->parts[part];
	if (e1 <= e0)
		return 0;
	uint64_t a[CKPT_RECIPE_MAX_RANK], b[CKPT_RECIPE_MAX_RANK];
	unravel(t, e0, a);
	unravel(t, e1 - 1, b);
	int k = 0;
	while (k < t->rank && a[k] == b[k])
		k++;
	uint64_t smin[CKPT_RECIPE_MAX_RANK], smax[CKPT_RECIPE_MAX_RANK];
	for (int d = 0; d < p->srank; d++)
		smin[d] = smax[d] = p->base[d];
	int fi = 0;
	for (int d = 0; d < t->rank; d++) {
		uint64_t lo = d < k    ? a[d]
			      : d == k ? a[d]
				       : 0,
			 hi = d < k    ? a[d]
			      : d == k ? b[d]
				       : t->shape[d] - 1;
		if (lo < p->lo[d])
			lo = p->lo[d];
		if (hi >= p->hi[d])
			hi = p->hi[d] - 1;
		if (lo > hi)
			return 0;
		uint64_t ua = lo - p->lo[d], ub = hi - p->lo[d];
		if (ua == ub) {
			uint64_t u = ua;
			for (int j = fi + p->nf[d] - 1; j >= fi; j--) {
				uint64_t dg = u % p->f[j].n;
				u /= p->f[j].n;
				smin[p->f[j].sdim] += dg * p->f[j].stride;
				smax[p->f[j].sdim] += dg * p->f[j].stride;
			}
		} else {
			uint64_t inner = 1;
			for (int j = fi + 1; j < fi + p->nf[d]; j++)
				inner *= p->f[j].n;
			for (int j = fi; j < fi + p->nf[d]; j++) {
				uint64_t dlo = j == fi ? ua / inner : 0,
					 dhi = j == fi ? ub / inner : p->f[j].n - 1;
				smin[p->f[j].sdim] += dlo * p->f[j].stride;
				smax[p->f[j].sdim] += dhi * p->f[j].stride;
			}
		}
		fi += p->nf[d];
	}
	box->rank = p->srank;
	for (int d = 0; d < p->srank; d++) {
		box->start[d] = smin[d];
		box->stop[d] = smax[d] + 1;
	}
	return 1;
}

static inline void copy_el(uint8_t *dst, const uint8_t *src, unsigned is)
{
	switch (is) {
	case 1:
		*dst = *src;
		break;
	case 2:
		memcpy(dst, src, 2);
		break;
	case 4:
		memcpy(dst, src, 4);
		break;
	case 8:
		memcpy(dst, src, 8);
		break;
	default:
		memcpy(dst, src, is);
	}
}

/* Rows gathered together, and columns per step of a batch. */
#define GATHER_ROWS 256
#define GATHER_COLS 64
/* Bytes of each target row a transpose's tile holds: two cache lines. */
#define TILE_BYTES 128

struct srow {
	uint8_t *o;
	const uint8_t *s;
};

#if defined(__SSE2__)
/* 8 neighbouring 2-byte elements of a row step rs (1 or 2) from p: with
 * rs 2, the even lanes of bytes [0, 16) and the odd lanes of bytes
 * [14, 30), sign-extended to 32 bits and packed back (exact); no byte
 * past the last element is read. */
static inline __m128i load8_u16(const uint8_t *p, int rs)
{
	if (rs == 1)
		return _mm_loadu_si128((const __m128i *)(const void *)p);
	__m128i lo = _mm_loadu_si128((const __m128i *)(const void *)p);
	__m128i hi = _mm_loadu_si128((const __m128i *)(const void *)(p + 14));
	return _mm_packs_epi32(_mm_srai_epi32(_mm_slli_epi32(lo, 16), 16), _mm_srai_epi32(hi, 16));
}

/* One 8x8 block of 2-byte elements: 8 rows that are neighbours in the
 * source, rs elements apart (row k starts at p + 2*rs*k), 8 columns st
 * elements apart; 8 loads of 8 elements, a transpose in registers, and 8
 * stores of 16 bytes, row j's at o[j]. */
static inline void transpose8_u16(uint8_t *const *o, const uint8_t *p, uint64_t st, int rs)
{
	const size_t step = (size_t)(2 * st);
	__m128i r0 = load8_u16(p, rs);
	__m128i r1 = load8_u16(p + step, rs);
	__m128i r2 = load8_u16(p + 2 * step, rs);
	__m128i r3 = load8_u16(p + 3 * step, rs);
	__m128i r4 = load8_u16(p + 4 * step, rs);
	__m128i r5 = load8_u16(p + 5 * step, rs);
	__m128i r6 = load8_u16(p + 6 * step, rs);
	__m128i r7 = load8_u16(p + 7 * step, rs);
	__m128i t0 = _mm_unpacklo_epi16(r0, r1), t1 = _mm_unpackhi_epi16(r0, r1);
	__m128i t2 = _mm_unpacklo_epi16(r2, r3), t3 = _mm_unpackhi_epi16(r2, r3);
	__m128i t4 = _mm_unpacklo_epi16(r4, r5), t5 = _mm_unpackhi_epi16(r4, r5);
	__m128i t6 = _mm_unpacklo_epi16(r6, r7), t7 = _mm_unpackhi_epi16(r6, r7);
	__m128i u0 = _mm_unpacklo_epi32(t0, t2), u1 = _mm_unpackhi_epi32(t0, t2);
	__m128i u2 = _mm_unpacklo_epi32(t1, t3), u3 = _mm_unpackhi_epi32(t1, t3);
	__m128i u4 = _mm_unpacklo_epi32(t4, t6), u5 = _mm_unpackhi_epi32(t4, t6);
	__m128i u6 = _mm_unpacklo_epi32(t5, t7), u7 = _mm_unpackhi_epi32(t5, t7);
	_mm_storeu_si128((__m128i *)(void *)o[0], _mm_unpacklo_epi64(u0, u4));
	_mm_storeu_si128((__m128i *)(void *)o[1], _mm_unpackhi_epi64(u0, u4));
	_mm_storeu_si128((__m128i *)(void *)o[2], _mm_unpacklo_epi64(u1, u5));
	_mm_storeu_si128((__m128i *)(void *)o[3], _mm_unpackhi_epi64(u1, u5));
	_mm_storeu_si128((__m128i *)(void *)o[4], _mm_unpacklo_epi64(u2, u6));
	_mm_storeu_si128((__m128i *)(void *)o[5], _mm_unpackhi_epi64(u2, u6));
	_mm_storeu_si128((__m128i *)(void *)o[6], _mm_unpacklo_epi64(u3, u7));
	_mm_storeu_si128((__m128i *)(void *)o[7], _mm_unpackhi_epi64(u3, u7));
}

/* 4 neighbouring 4-byte elements of a row step rs (1 or 2) from p: with
 * rs 2, lanes 0 and 2 of bytes [0, 16) and lanes 1 and 3 of [12, 28). */
static inline __m128i load4_u32(const uint8_t *p, int rs)
{
	if (rs == 1)
		return _mm_loadu_si128((const __m128i *)(const void *)p);
	__m128 lo = _mm_loadu_ps((const float *)(const void *)p);
	__m128 hi = _mm_loadu_ps((const float *)(const void *)(p + 12));
	return _mm_castps_si128(_mm_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 2, 0)));
}

/* The same for a 4x4 block of 4-byte elements. */
static inline void transpose4_u32(uint8_t *const *o, const uint8_t *p, uint64_t st, int rs)
{
	const size_t step = (size_t)(4 * st);
	__m128i r0 = load4_u32(p, rs);
	__m128i r1 = load4_u32(p + step, rs);
	__m128i r2 = load4_u32(p + 2 * step, rs);
	__m128i r3 = load4_u32(p + 3 * step, rs);
	__m128i t0 = _mm_unpacklo_epi32(r0, r1), t1 = _mm_unpackhi_epi32(r0, r1);
	__m128i t2 = _mm_unpacklo_epi32(r2, r3), t3 = _mm_unpackhi_epi32(r2, r3);
	_mm_storeu_si128((__m128i *)(void *)o[0], _mm_unpacklo_epi64(t0, t2));
	_mm_storeu_si128((__m128i *)(void *)o[1], _mm_unpackhi_epi64(t0, t2));
	_mm_storeu_si128((__m128i *)(void *)o[2], _mm_unpacklo_epi64(t1, t3));
	_mm_storeu_si128((__m128i *)(void *)o[3], _mm_unpackhi_epi64(t1, t3));
}
#endif

/* The row step of rows [k, k+g) of a batch: rs (1 or 2) when row k+j
 * starts j*rs elements after row k's first (neighbours in the source: a
 * transpose; rs 2: every other one, as a RoPE permutation takes them),
 * else 0. */
static int neighbours(const struct srow *rows, int k, int g, unsigned is)
{
	int rs = g > 1 && rows[k + 1].s == rows[k].s + 2 * (size_t)is ? 2 : 1;
	for (int j = 1; j < g; j++)
		if (rows[k + j].s != rows[k].s + (size_t)(j * rs) * is)
			return 0;
	return rs;
}

#if defined(__SSE2__)
/* Columns [0, cv) of the ng groups of g neighbour rows (row step rs),
 * through a tile of TILE_BYTES per row: for each g source rows (g target
 * columns) the register blocks of every group in turn, so that each
 * source row is read in one run of k0 elements (the lines the hardware
 * streams in), the transposed blocks landing in the tile; then each
 * target row's share of the tile is copied out whole.  Written straight
 * into the target rows instead, a block's 16-byte stores go to g lines one
 * target row apart, and with long rows those lines share a cache set with
 * each other and with the source lines (both strides multiples of 4 KiB),
 * so the source had to be read in short pieces, row by row. */
static void flush_tiled(const struct srow *rows, int ng, int g, uint64_t cv, uint64_t st, unsigned is, int rs,
			uint8_t *tile)
{
	const uint64_t tw = TILE_BYTES / is; /* columns per tile: a multiple of g */
	const int k0 = ng * g;
	for (uint64_t c0 = 0; c0 < cv; c0 += tw) {
		uint64_t c1 = c0 + tw < cv ? c0 + tw : cv;
		for (uint64_t cb = c0; cb < c1; cb += (uint64_t)g)
			for (int q = 0; q < ng; q++) {
				uint8_t *o[8];
				for (int j = 0; j < g; j++)
					o[j] = tile + (size_t)(q * g + j) * TILE_BYTES + is * (cb - c0);
				const uint8_t *s = rows[q * g].s + is * cb * st;
				if (is == 2)
					transpose8_u16(o, s, st, rs);
				else
					transpose4_u32(o, s, st, rs);
			}
		for (int k = 0; k < k0; k++)
			memcpy(rows[k].o + is * c0, tile + (size_t)k * TILE_BYTES, (c1 - c0) * is);
	}
}

#endif

/* cnt elements of each row, source stride st elements, column block by
 * column block over all the rows.  Groups of rows whose sources are
 * neighbours (a transpose) go through register transposes where the CPU
 * has them; the rest, element by element. */
static void flush_rows(const struct srow *rows, int n, uint64_t cnt, uint64_t st, unsigned is)
{
	int k0 = 0; /* rows before k0 are done */
#if defined(__SSE2__)
	const int g = is == 2 ? 8 : is == 4 ? 4 : 0;
	const uint64_t cv = g ? cnt - cnt % (uint64_t)g : 0; /* columns the blocks cover */
	if (g && cv) {
		/* groups of g neighbour rows from the first row on, all of
		 * one row step */
		int ng = 0, rs = neighbours(rows, 0, g, is);
		while (rs && (ng + 1) * g <= n && neighbours(rows, ng * g, g, is) == rs)
			ng++;
		/* (without memory for the tile, every row element by element) */
		uint8_t *tile = ng ? ckpt_tls_buf(CKPT_TLS_TILE, (size_t)(ng * g) * TILE_BYTES) : NULL;
		if (tile) {
			k0 = ng * g;
			flush_tiled(rows, ng, g, cv, st, is, rs, tile);
		}
		for (int k = 0; k < k0; k++) /* the columns after the blocks */
			for (uint64_t c = cv; c < cnt; c++)
				copy_el(rows[k].o + is * c, rows[k].s + is * c * st, is);
	}
#endif
	rows += k0;
	n -= k0;
	for (uint64_t c0 = 0; c0 < cnt; c0 += GATHER_COLS) {
		uint64_t c1 = c0 + GATHER_COLS < cnt ? c0 + GATHER_COLS : cnt;
		for (int k = 0; k < n; k++) {
			uint8_t *o = rows[k].o;
			const uint8_t *s = rows[k].s;
			if (is == 2) {
				for (uint64_t c = c0; c < c1; c++)
					memcpy(o + 2 * c, s + 2 * c * st, 2);
			} else if (is == 4) {
				for (uint64_t c = c0; c < c1; c++)
					memcpy(o + 4 * c, s + 4 * c * st, 4);
			} else {
				for (uint64_t c = c0; c < c1; c++)
					copy_el(o + is * c, s + is * c * st, is);
			}
		}
	}
}

/* Whole rows whose last dimension is several source factors (heads
 * merged: (H, D) -> H*D), all starting at factor digit 0: for each value
 * of the outer factors, the run of the innermost factor is a strided row,
 * and the batch's rows give flush_rows a block of them.  f/fstr are the
 * last dimension's factors (nlf >= 2) and their strides in the box. */
static void flush_factored(const struct srow *rows, int n, const ckpt_rfactor *f, const uint64_t *fstr,
			   int nlf, unsigned is)
{
	uint64_t nin = f[nlf - 1].n, stin = fstr[nlf - 1], dg[CKPT_RECIPE_MAX_FACTORS] = { 0 };
	struct srow seg[GATHER_ROWS];
	for (uint64_t oo = 0;; oo += nin) {
		uint64_t so = 0;
		for (int j = 0; j < nlf - 1; j++)
			so += dg[j] * fstr[j];
		for (int k = 0; k < n; k++) {
			seg[k].o = rows[k].o + oo * is;
			seg[k].s = rows[k].s + so * is;
		}
		if (stin == 1)
			for (int k = 0; k < n; k++)
				memcpy(seg[k].o, seg[k].s, nin * is);
		else
			flush_rows(seg, n, nin, stin, is);
		int j = nlf - 2;
		for (; j >= 0; j--) {
			if (++dg[j] < f[j].n)
				break;
			dg[j] = 0;
		}
		if (j < 0)
			return;
	}
}

/* A batch of strided rows (fact 0: cnt elements, stride st) or of whole
 * factored rows (fact 1). */
static void flush_batch(const struct srow *rows, int n, int fact, uint64_t cnt, uint64_t st, unsigned is,
			const ckpt_rfactor *f, const uint64_t *fstr, int nlf)
{
	if (fact)
		flush_factored(rows, n, f, fstr, nlf, is);
	else
		flush_rows(rows, n, cnt, st, is);
}

void ckpt_rtensor_gather(const ckpt_rtensor *t, size_t part, const ckpt_region *box, const void *boxbuf,
			 uint64_t e0, uint64_t e1, void *dst)
{
	ckpt_rpart_gather(t, &t->parts[part], box, boxbuf, e0, e1, dst);
}

int ckpt_rtensor_clip(const ckpt_rtensor *t, size_t part, const ckpt_region *clip, ckpt_rpart *out)
{
	const ckpt_rpart *p = &t->parts[part];
	if (clip->rank != p->srank)
		return -EINVAL;
	*out = *p;
	int nfac = part_nfactors(p, t->rank);
	int dim_of[CKPT_RECIPE_MAX_FACTORS];
	for (int d = 0, j = 0; d < t->rank; d++)
		for (int k = 0; k < p->nf[d]; k++)
			dim_of[j++] = d;
	for (int s = 0; s < p->srank; s++) {
		uint64_t cs = clip->start[s], ce = clip->stop[s], hi = p->base[s];
		int nj = 0, j1 = -1;
		for (int j = 0; j < nfac; j++)
			if (p->f[j].sdim == s && p->f[j].n > 1) {
				hi += (p->f[j].n - 1) * p->f[j].stride;
				nj++;
				j1 = j;
			}
		if (p->base[s] >= cs && hi < ce)
			continue; /* every element of the part is inside along s */
		if (nj == 0 || hi < cs || p->base[s] >= ce)
			return 0; /* none is */
		const ckpt_rfactor *f = &p->f[j1];
		int d = dim_of[j1];
		if (nj > 1 || j1 != fstart(p, d))
			return -ENOTSUP; /* an inner digit's range: not a box of the target */
		uint64_t dlo = p->base[s] >= cs ? 0 : (cs - p->base[s] + f->stride - 1) / f->stride;
		uint64_t dhi = (ce - p->base[s] + f->stride - 1) / f->stride;
		if (dhi > f->n)
			dhi = f->n;
		if (dlo >= dhi)
			return 0;
		uint64_t inner = 1;
		for (int j = j1 + 1; j < j1 + p->nf[d]; j++)
			inner *= p->f[j].n;
		out->lo[d] = p->lo[d] + dlo * inner;
		out->hi[d] = p->lo[d] + dhi * inner;
		out->f[j1].n = dhi - dlo;
		out->base[s] = p->base[s] + dlo * f->stride;
	}
	return 1;
}

void ckpt_rpart_gather(const ckpt_rtensor *t, const ckpt_rpart *p, const ckpt_region *box, const void *boxbuf,
		       uint64_t e0, uint64_t e1, void *dst)
{
	unsigned is = ckpt_dtype_get(t->src_dtype)->itemsize;
	const uint8_t *src = boxbuf;
	uint8_t *out = dst;
	/* element strides of the box buffer per source dim */
	uint64_t bs[CKPT_RECIPE_MAX_RANK];
	uint64_t acc = 1;
	for (int d = p->srank - 1; d >= 0; d--) {
		bs[d] = acc;
		acc *= box->stop[d] - box->start[d];
	}
	int64_t base_off = 0;
	for (int d = 0; d < p->srank; d++)
		base_off += ((int64_t)p->base[d] - (int64_t)box->start[d]) * (int64_t)bs[d];
	if (t->rank == 0) {
		if (e0 == 0 && e1 > 0)
			copy_el(out, src + (uint64_t)base_off * is, is);
		return;
	}
	int last = t->rank - 1;
	uint64_t R = t->shape[last];
	int lf0 = fstart(p, last), nlf = p->nf[last];
	uint64_t fstr[CKPT_RECIPE_MAX_FACTORS];
	for (int j = 0; j < part_nfactors(p, t->rank); j++)
		fstr[j] = p->f[j].stride * bs[p->f[j].sdim];
	struct srow batch[GATHER_ROWS];
	int nb = 0, fact = 0; /* fact: the batch holds whole factored rows */

	uint64_t bcnt = 0, bst = 0;
	for (uint64_t row = e0 / R; row * R < e1; row++) {
		uint64_t c0 = row * R < e0 ? e0 - row * R : 0, c1 = (row + 1) * R > e1 ? e1 - row * R : R;
		/* outer dims of this row */
		uint64_t rr = row, idx[CKPT_RECIPE_MAX_RANK];
		for (int d = last - 1; d >= 0; d--) {
			idx[d] = rr % t->shape[d];
			rr /= t->shape[d];
		}
		int inside = 1;
		int64_t off = base_off;
		int fi = 0;
		for (int d = 0; d < last && inside; d++) {
			if (idx[d] < p->lo[d] || idx[d] >= p->hi[d]) {
				inside = 0;
				break;
			}
			uint64_t u = idx[d] - p->lo[d];
			for (int j = fi + p->nf[d] - 1; j >= fi; j--) {
				off += (int64_t)((u % p->f[j].n) * fstr[j]);
				u /= p->f[j].n;
			}
			fi += p->nf[d];
		}
		if (!inside)
			continue;
		if (c0 < p->lo[last])
			c0 = p->lo[last];
		if (c1 > p->hi[last])
			c1 = p->hi[last];
		if (c0 >= c1)
			continue;
		uint8_t *o = out + (row * R + c0 - e0) * is;
		uint64_t u0 = c0 - p->lo[last], cnt = c1 - c0;
		if (nlf == 0) {
			copy_el(o, src + (uint64_t)off * is, is);
		} else if (nlf == 1) {
			uint64_t st = fstr[lf0];
			const uint8_t *s = src + ((uint64_t)off + u0 * st) * is;
			if (st == 1) {
				memcpy(o, s, cnt * is);
			} else {
				/* strided rows (a transpose): batched, so that the
				 * source lines of neighbouring rows are read while in
				 * the first-level cache */
				if (nb && (fact || cnt != bcnt || st != bst || nb == GATHER_ROWS)) {
					flush_batch(batch, nb, fact, bcnt, bst, is, &p->f[lf0], &fstr[lf0],
						    nlf);
					nb = 0;
				}
				fact = 0;
				bcnt = cnt;
				bst = st;
				batch[nb].o = o;
				batch[nb++].s = s;
			}
		} else if (u0 == 0 && c1 - c0 == p->hi[last] - p->lo[last]) {
			/* a whole row of several factors: batched by flush_factored */
			if (nb && (!fact || nb == GATHER_ROWS)) {
				flush_batch(batch, nb, fact, bcnt, bst, is, &p->f[lf0], &fstr[lf0], nlf);
				nb = 0;
			}
			fact = 1;
			batch[nb].o = o;
			batch[nb++].s = src + (uint64_t)off * is;
		} else {
			/* odometer over the last dim's factors */
			uint64_t dg[CKPT_RECIPE_MAX_FACTORS], u = u0;
			for (int j = nlf - 1; j >= 0; j--) {
				dg[j] = u % p->f[lf0 + j].n;
				u /= p->f[lf0 + j].n;
			}
			for (uint64_t c = 0; c < cnt; c++) {
				uint64_t so = (uint64_t)off;
				for (int j = 0; j < nlf; j++)
					so += dg[j] * fstr[lf0 + j];
				copy_el(o + is * c, src + so * is, is);
				for (int j = nlf - 1; j >= 0; j--) {
					if (++dg[j] < p->f[lf0 + j].n)
						break;
					dg[j] = 0;
				}
			}
		}
	}
	if (nb)
		flush_batch(batch, nb, fact, bcnt, bst, is, &p->f[lf0], &fstr[lf0], nlf);
}

static float bits_f32(uint32_t b)
{
	float f;
	memcpy(&f, &b, 4);
	return f;
}

static uint32_t f32_bits(float f)
{
	uint32_t b;
	memcpy(&b, &f, 4);
	return b;
}

uint16_t ckpt_f32_to_bf16(float x)
{
	uint32_t b = f32_bits(x);
	if ((b & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((b >> 16) | 0x40); /* NaN stays a (quiet) NaN */
	uint32_t lsb = (b >> 16) & 1;
	return (uint16_t)((b + 0x7fffu + lsb) >> 16);
}

uint16_t ckpt_f32_to_f16(float x)
{
	uint32_t b = f32_bits(x);
	uint16_t sign = (uint16_t)((b >> 16) & 0x8000u);
	uint32_t a = b & 0x7fffffffu;
	if (a > 0x7f800000u)
		return sign | 0x7e00u; /* NaN */
	if (a >= 0x477ff000u) /* rounds to >= 65520: infinity */
		return sign | 0x7c00u;
	if (a < 0x38800000u) { /* below 2^-14: subnormal or zero */
		if (a < 0x33000000u) /* below 2^-25: rounds to zero (2^-25 itself ties to 0) */
			return sign;
		uint32_t m = (a & 0x7fffffu) | 0x800000u;
		int e = (int)(a >> 23); /* 127-25 .. 127-15 */
		int shift = 126 - e; /* value = m * 2^(e-150); f16 unit 2^-24 */
		/* m * 2^(e-150) in units of 2^-24 */
		uint32_t q = m >> shift, rem = m & ((1u << shift) - 1);
		uint32_t half = 1u << (shift - 1);
		if (rem > half || (rem == half && (q & 1)))
			q++;
		return sign | (uint16_t)q;
	}
	uint32_t r = a - 0x38000000u; /* rebias 127 -> 15 in the exponent field (<<23) */
	uint32_t lsb = (r >> 13) & 1;
	r += 0xfffu + lsb;
	return sign | (uint16_t)(r >> 13);
}

static float f16_to_f32(uint16_t h)
{
	uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ffu;
	if (e == 31)
		return bits_f32(s | 0x7f800000u | (m << 13));
	if (e == 0) {
		float f = (float)m * bits_f32(0x33800000u); /* m * 2^-24 */
		return s ? -f : f;
	}
	return bits_f32(s | ((e + 112) << 23) | (m << 13));
}

#if defined(__SSE2__)
/* 4 float32 lanes to bfloat16 bits (to nearest even; NaN stays a quiet
 * NaN), as ckpt_f32_to_bf16, in the low 16 bits of each 32-bit lane. */
static inline __m128i bf16_of(__m128 x)
{
	const __m128i b = _mm_castps_si128(x);
	const __m128i one = _mm_set1_epi32(1), round = _mm_set1_epi32(0x7fff);
	__m128i lsb = _mm_and_si128(_mm_srli_epi32(b, 16), one);
	__m128i r = _mm_srli_epi32(_mm_add_epi32(b, _mm_add_epi32(round, lsb)), 16);
	__m128i nan =
		_mm_cmpgt_epi32(_mm_and_si128(b, _mm_set1_epi32(0x7fffffff)), _mm_set1_epi32(0x7f800000));
	__m128i q = _mm_or_si128(_mm_srli_epi32(b, 16), _mm_set1_epi32(0x40));
	return _mm_or_si128(_mm_and_si128(nan, q), _mm_andnot_si128(nan, r));
}

/* The float32 affine of bfloat16 elements to bfloat16, 8 at a time: the
 * same operations in the same order as the scalar loop of
 * ckpt_rtensor_convert (each an IEEE float32 operation, rounded), so the
 * same bits.  Returns how many elements it did (count rounded down to 8). */
static size_t affine_bf16_sse2(const uint8_t *s, size_t count, uint8_t *d, const float *mul, const float *div,
			       const float *add)
{
	const __m128i zero = _mm_setzero_si128();
	const __m128 a = _mm_set1_ps(mul ? *mul : 1), c = _mm_set1_ps(div ? *div : 1),
		     b = _mm_set1_ps(add ? *add : 0);
	size_t i = 0;
	for (; i + 8 <= count; i += 8) {
		__m128i v = _mm_loadu_si128((const __m128i *)(const void *)(s + 2 * i));
		__m128 lo = _mm_castsi128_ps(_mm_unpacklo_epi16(zero, v)),
		       hi = _mm_castsi128_ps(_mm_unpackhi_epi16(zero, v));
		if (mul) {
			lo = _mm_mul_ps(lo, a);
			hi = _mm_mul_ps(hi, a);
		}
		if (div) {
			lo = _mm_div_ps(lo, c);
			hi = _mm_div_ps(hi, c);
		}
		if (add) {
			lo = _mm_add_ps(lo, b);
			hi = _mm_add_ps(hi, b);
		}
		/* sign-extend the 16-bit results so that the signed pack is exact */
		__m128i rl = _mm_srai_epi32(_mm_slli_epi32(bf16_of(lo), 16), 16);
		__m128i rh = _mm_srai_epi32(_mm_slli_epi32(bf16_of(hi), 16), 16);
		_mm_storeu_si128((__m128i *)(void *)(d + 2 * i), _mm_packs_epi32(rl, rh));
	}
	return i;
}
#endif

int ckpt_rtensor_convert(const ckpt_rtensor *t, const void *src, size_t count, void *dst)
{
	const uint8_t *s = src;
	uint8_t *d = dst;
	ckpt_dtype in = t->src_dtype, out = t->dtype;
	if (in == CKPT_DT_FLOAT64 || out == CKPT_DT_FLOAT64) {
		for (size_t i = 0; i < count; i++) {
			double x;
			if (in == CKPT_DT_FLOAT64) {
				memcpy(&x, s + 8 * i, 8);
			} else if (in == CKPT_DT_FLOAT32) {
				float f;
				memcpy(&f, s + 4 * i, 4);
				x = f;
			} else {
				uint16_t h;
				memcpy(&h, s + 2 * i, 2);
				x = in == CKPT_DT_BFLOAT16 ? bits_f32((uint32_t)h << 16) : f16_to_f32(h);
			}
			if (t->scale != 1)
				x = x * t->scale;
			if (t->divisor != 0)
				x = x / t->divisor;
			if (t->bias != 0)
				x = x + t->bias;
			if (out == CKPT_DT_FLOAT64) {
				memcpy(d + 8 * i, &x, 8);
			} else {
				float f = (float)x;
				if (out == CKPT_DT_FLOAT32) {
					memcpy(d + 4 * i, &f, 4);
				} else {
					uint16_t h = out == CKPT_DT_BFLOAT16 ? ckpt_f32_to_bf16(f)
									     : ckpt_f32_to_f16(f);
					memcpy(d + 2 * i, &h, 2);
				}
			}
		}
		return 0;
	}
	if ((in != CKPT_DT_FLOAT32 && in != CKPT_DT_BFLOAT16 && in != CKPT_DT_FLOAT16) ||
	    (out != CKPT_DT_FLOAT32 && out != CKPT_DT_BFLOAT16 && out != CKPT_DT_FLOAT16))
		return -ENOTSUP;
	const float a = (float)t->scale, b = (float)t->bias, c = (float)t->divisor;
	const int mul = t->scale != 1, add = t->bias != 0, div = t->divisor != 0;
	size_t i = 0;
#if defined(__SSE2__)
	if (in == CKPT_DT_BFLOAT16 && out == CKPT_DT_BFLOAT16)
		i = affine_bf16_sse2(s, count, d, mul ? &a : NULL, div ? &c : NULL, add ? &b : NULL);
#endif
	for (; i < count; i++) {
		float x;
		if (in == CKPT_DT_FLOAT32) {
			memcpy(&x, s + 4 * i, 4);
		} else {
			uint16_t h;
			memcpy(&h, s + 2 * i, 2);
			x = in == CKPT_DT_BFLOAT16 ? bits_f32((uint32_t)h << 16) : f16_to_f32(h);
		}
		/* float32 operations, each rounded (this file is built without
		 * floating-point contraction: no fused multiply-add) */
		if (mul)
			x = x * a;
		if (div)
			x = x / c;
		if (add)
			x = x + b;
		if (out == CKPT_DT_FLOAT32) {
			memcpy(d + 4 * i, &x, 4);
		} else {
			uint16_t h = out == CKPT_DT_BFLOAT16 ? ckpt_f32_to_bf16(x) : ckpt_f32_to_f16(x);
			memcpy(d + 2 * i, &h, 2);
		}
	}
	return 0;
}

/* ---- for recipe_inverse.c ---------------------------------------------------- */

int ckpt_rx_env_get(const struct env *e, const char *name, size_t len, double *out)
{
	return env_get(e, name, len, out);
}

int ckpt_rx_env_set(struct env *e, const char *name, double v)
{
	return env_set(e, name, v);
}

int ckpt_rx_eval(const char *s, size_t len, const struct env *env, double *v, const char **why)
{
	return eval(s, len, env, v, why);
}

int ckpt_rx_render(const char *tpl, const struct env *env, char *out, size_t cap, char *why, size_t whylen)
{
	return render(tpl, env, out, cap, why, whylen);
}

int ckpt_rx_match(const char *pat, const char *name, struct env *env, char vars[][64], int *nv)
{
	return match(pat, name, env, vars, nv);
}
