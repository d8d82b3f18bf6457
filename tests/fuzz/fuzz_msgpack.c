/*
 * fuzz_msgpack.c - libFuzzer target over the MessagePack structure reader
 * (msgpack.h) that Flax, older Orbax and T5X `checkpoint` files go through:
 * every input is a whole file.  Checked: a parsed document's every string,
 * bin and ext payload lies inside the file, counts match the children
 * allocated, and ckpt_mp_magic never reads past what it is given.
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

#include "fuzz.h"
#include "membuf.h"
#include "msgpack.h"

static size_t walk(const struct ckpt_mp *m, size_t size, int depth)
{
	REQUIRE(depth <= CKPT_MP_MAX_DEPTH + 1);
	size_t nodes = 1;
	switch (m->type) {
	case CKPT_MP_STR:
	case CKPT_MP_BIN:
	case CKPT_MP_EXT:
		REQUIRE(m->off <= size && m->len <= size - m->off);
		if (m->str)
			REQUIRE(strlen(m->str) == m->len);
		break;
	default:
		break;
	}
	size_t k = m->type == CKPT_MP_MAP ? 2 * (size_t)m->n : m->n;
	if (m->type == CKPT_MP_ARRAY || m->type == CKPT_MP_MAP || (m->type == CKPT_MP_EXT && m->n)) {
		REQUIRE(k == 0 || m->kids);
		for (size_t i = 0; i < k; i++)
			nodes += walk(&m->kids[i], size, depth + 1);
	}
	return nodes;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ckpt_membuf b = { data, size };
	(void)ckpt_mp_magic(data, size < 512 ? size : 512);
	struct ckpt_mp *m = NULL;
	const char *why = NULL;
	int rc = ckpt_mp_parse(ckpt_membuf_read, &b, size, &m, &why);
	REQUIRE(rc == 0 || rc == -EINVAL || rc == -ENOMEM);
	if (rc == 0) {
		REQUIRE(m);
		REQUIRE(walk(m, size, 0) <= CKPT_MP_MAX_NODES + 1);
		(void)ckpt_mp_get(m, "params");
	} else {
		REQUIRE(!m && why);
	}
	ckpt_mp_free(m);
	return 0;
}
