/*
 * fuzz_hosts_done.c - libFuzzer target over the records of multi-host writes
 * that one host reads from another (lib/write/writer_hosts.c): the input is
 * parsed as JSON, then
 *   - as a declaration record (ckpt_w_decl_parse): where it is accepted, every
 *     field is in range, and the record written back the way the writer
 *     writes one (exact integers) parses to the same declaration;
 *   - as a done record: each entry of "arrays" as a declaration, with its
 *     "stored" and "parts" triplets read as the primary reads them
 *     (ckpt_w_json_to_u64).
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common.h"
#include "writer_int.h"
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	ckpt_log_set_level(CKPT_LOG_ERR);
	return 0;
}

static cJSON *emit(const struct w_decl *d)
{
	cJSON *j = cJSON_CreateObject(), *k = cJSON_CreateArray(), *t = cJSON_CreateArray();
	for (int i = 0; i < d->depth; i++) {
		cJSON_AddItemToArray(k, cJSON_CreateString(d->keys[i]));
		cJSON_AddItemToArray(t, cJSON_CreateNumber(d->types[i]));
	}
	cJSON_AddStringToObject(j, "item", d->item);
	cJSON_AddItemToObject(j, "keys", k);
	cJSON_AddItemToObject(j, "key_types", t);
	cJSON_AddStringToObject(j, "dtype", ckpt_dtype_get(d->dtype)->name);
	cJSON_AddItemToObject(j, "shape", ckpt_w_json_shape(d->shape, d->rank));
	cJSON_AddItemToObject(j, "chunk", ckpt_w_json_shape(d->chunk, d->rank));
	cJSON_AddItemToObject(j, "shard", ckpt_w_json_shape(d->shard, d->rank));
	cJSON_AddNumberToObject(j, "host", d->host);
	return j;
}

static void check_decl(const cJSON *j)
{
	struct w_decl d;
	if (ckpt_w_decl_parse(j, &d) != 0)
		return;
	REQUIRE(d.item && d.depth >= 1 && d.depth <= CKPT_ORBAX_MAX_DEPTH);
	REQUIRE(d.rank >= 0 && d.rank <= CKPT_MAX_RANK);
	REQUIRE(ckpt_dtype_get(d.dtype) != NULL);
	for (int i = 0; i < d.depth; i++)
		REQUIRE(d.keys[i] != NULL);
	cJSON *e = emit(&d);
	char *txt = e ? cJSON_PrintUnformatted(e) : NULL;
	cJSON *back = txt ? cJSON_Parse(txt) : NULL;
	struct w_decl d2;
	if (back) {
		REQUIRE(ckpt_w_decl_parse(back, &d2) == 0);
		REQUIRE(d2.depth == d.depth && d2.rank == d.rank && d2.dtype == d.dtype && d2.host == d.host);
		REQUIRE(strcmp(d2.item, d.item) == 0);
		for (int i = 0; i < d.depth; i++)
			REQUIRE(strcmp(d2.keys[i], d.keys[i]) == 0 && d2.types[i] == d.types[i]);
		for (int i = 0; i < d.rank; i++)
			REQUIRE(d2.shape[i] == d.shape[i] && d2.chunk[i] == d.chunk[i] &&
				d2.shard[i] == d.shard[i]);
	}
	cJSON_Delete(back);
	free(txt);
	cJSON_Delete(e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	cJSON *j = cJSON_ParseWithLength((const char *)data, size);
	if (!j)
		return 0;
	check_decl(j);
	/* a done record: its arrays, each a declaration plus chunk triplets */
	const cJSON *e, *t;
	cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(j, "arrays"))
	{
		check_decl(e);
		struct w_decl d;
		if (ckpt_w_decl_parse(e, &d) != 0)
			continue;
		static const char *const lists[] = { "stored", "parts" };
		for (int l = 0; l < 2; l++)
			cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(e, lists[l]))
			{
				/* (chunk index, offset, length), as merge_array reads them */
				uint64_t v[3];
				for (int i = 0; i < 3; i++)
					v[i] = ckpt_w_json_to_u64(cJSON_GetArrayItem(t, i));
				(void)v;
			}
	}
	cJSON_Delete(j);
	return 0;
}
