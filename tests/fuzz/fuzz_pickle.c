/*
 * fuzz_pickle.c - libFuzzer target over ckpt_pickle_load: every input is a
 * whole pickle.  Checked: the result is 0 or a refusal (-EINVAL, -EPERM);
 * an accepted pickle's graph is walkable within the documented bounds
 * (depth, item counts, every string NUL-terminated at its length, every
 * record named by a global the list accepts) and the helpers never fail on
 * any node of it.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "pickle.h"
#include "fuzz.h"

static size_t budget;

static void walk(const ckpt_pk *o, int depth)
{
	REQUIRE(o != NULL);
	if (depth > 4 * CKPT_PK_MAX_DEPTH || budget == 0)
		return; /* a cycle (documented) or a wide shared graph */
	budget--;
	int64_t iv;
	int64_t ints[8];
	switch (o->kind) {
	case CKPT_PK_NONE:
	case CKPT_PK_FLOAT:
		break;
	case CKPT_PK_BOOL:
		REQUIRE(o->i == 0 || o->i == 1);
		/* fallthrough */
	case CKPT_PK_INT:
		REQUIRE(ckpt_pk_int(o, &iv) == 0 && iv == o->i);
		break;
	case CKPT_PK_STR:
	case CKPT_PK_BYTES:
		REQUIRE(o->s != NULL && o->s[o->len] == 0);
		break;
	case CKPT_PK_GLOBAL:
	case CKPT_PK_RECORD: {
		REQUIRE(o->s != NULL);
		const char *dot = strrchr(o->s, '.');
		REQUIRE(dot != NULL);
		char mod[512];
		size_t ml = (size_t)(dot - o->s);
		REQUIRE(ml < sizeof(mod));
		memcpy(mod, o->s, ml);
		mod[ml] = 0;
		REQUIRE(ckpt_pickle_global_ok(mod, dot + 1) ||
			(o->kind == CKPT_PK_GLOBAL && strcmp(o->s, CKPT_PK_GETATTR) == 0));
		if (o->kind == CKPT_PK_RECORD) {
			REQUIRE(o->args && o->args->kind == CKPT_PK_TUPLE);
			walk(o->args, depth + 1);
			if (o->state)
				walk(o->state, depth + 1);
			(void)ckpt_pk_field(o, "size");
			(void)ckpt_pk_ints(o, ints, 8);
		}
		break;
	}
	case CKPT_PK_PERSID:
		REQUIRE(o->args != NULL);
		walk(o->args, depth + 1);
		break;
	case CKPT_PK_TUPLE:
	case CKPT_PK_LIST:
	case CKPT_PK_DICT:
		REQUIRE(o->n <= 2u * CKPT_PK_MAX_ITEMS);
		if (o->kind == CKPT_PK_DICT)
			REQUIRE(o->n % 2 == 0);
		for (size_t i = 0; i < o->n; i++)
			walk(o->v[i], depth + 1);
		if (o->kind == CKPT_PK_DICT) {
			(void)ckpt_pk_get(o, "state_dict_metadata");
			if (o->state)
				walk(o->state, depth + 1);
		} else {
			(void)ckpt_pk_item(o, 0);
			(void)ckpt_pk_ints(o, ints, 8);
		}
		break;
	default:
		REQUIRE(0);
	}
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	ckpt_log_quiet(1);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	ckpt_pickle *p = NULL;
	int rc = ckpt_pickle_load(data, size, "fuzz", &p);
	REQUIRE(rc == 0 || rc == -EINVAL || rc == -EPERM);
	REQUIRE((rc == 0) == (p != NULL));
	if (p) {
		budget = 100000;
		walk(ckpt_pickle_root(p), 0);
		ckpt_pickle_free(p);
	}
	return 0;
}
