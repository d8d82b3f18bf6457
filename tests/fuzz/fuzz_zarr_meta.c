/*
 * fuzz_zarr_meta.c - libFuzzer target over the zarr metadata model: every
 * input is parsed as .zarray (v2) and as zarr.json (v3).  Where the parse
 * succeeds: emit must succeed, its text must parse again and emit the same
 * text (a fixed point), and the reader's decode plan (ckpt_zarr_parse) of the
 * input and of the emitted text must agree.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "zarr_chunk.h"
#include "zarr_meta.h"
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	ckpt_log_set_level(CKPT_LOG_ERR); /* the plan's warnings about fill values */
	return 0;
}

static void one(const char *json, size_t len, int fmt)
{
	struct ckpt_zarr_meta m, m2;
	const char *why = NULL;
	int rc = ckpt_zarr_meta_parse(json, len, fmt, &m, &why);
	REQUIRE(rc == 0 || rc == -EINVAL || rc == -ENOTSUP || rc == -ENOMEM);
	REQUIRE(rc == 0 || (why && why[0]));
	ckpt_array_meta a, b;
	const char *why2;
	int pa = ckpt_zarr_parse(fmt, json, len, &a, &why2);
	if (rc) {
		REQUIRE(pa == rc);
		ckpt_zarr_meta_free(&m);
		return;
	}
	char *e1 = ckpt_zarr_meta_emit(&m);
	REQUIRE(e1);
	REQUIRE(ckpt_zarr_meta_parse(e1, strlen(e1), fmt, &m2, &why) == 0);
	char *e2 = ckpt_zarr_meta_emit(&m2);
	REQUIRE(e2 && strcmp(e1, e2) == 0);
	int pb = ckpt_zarr_parse(fmt, e1, strlen(e1), &b, &why2);
	REQUIRE(pa == pb);
	if (pa == 0)
		REQUIRE(memcmp(&a, &b, sizeof(a)) == 0);
	free(e1);
	free(e2);
	ckpt_zarr_meta_free(&m2);
	ckpt_zarr_meta_free(&m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	one((const char *)data, size, 2);
	one((const char *)data, size, 3);
	return 0;
}
