/*
 * test_pickle.c - the restricted pickle reader: pickles written by Python's
 * own pickle in protocols 0, 2, 4 and 5, a torch.save-style data.pkl (stub
 * classes with torch's names), the real distributed-checkpoint .metadata of
 * the fixtures, refused globals and opcodes, and the bounds (memo, nesting,
 * integer size, cycles, every truncation).
 */
#include <errno.h>
#include <string.h>

#include "check.h"
#include "common.h"
#include "pickle.h"
#include "pickle_vectors.h"

static char last_log[512];
static void sink(int level, const char *msg)
{
	(void)level;
	snprintf(last_log, sizeof(last_log), "%s", msg);
}

static void check_plain(const uint8_t *b, size_t n, int has_bytes)
{
	ckpt_pickle *p = NULL;
	CHECK_EQ_INT(ckpt_pickle_load(b, n, "plain", &p), 0);
	const ckpt_pk *r = ckpt_pickle_root(p);
	CHECK(r && r->kind == CKPT_PK_DICT && r->n == 10);
	const ckpt_pk *a = ckpt_pk_get(r, "a");
	int64_t v[8];
	CHECK_EQ_INT(ckpt_pk_ints(a, v, 8), 5);
	CHECK(v[0] == 1 && v[1] == -2 && v[2] == 2147483653LL && v[3] == -(1LL << 40) && v[4] == INT64_MAX);
	const ckpt_pk *t = ckpt_pk_get(r, "b");
	CHECK(t && t->kind == CKPT_PK_TUPLE && t->n == 4);
	if (t && t->n == 4) {
		CHECK(t->v[0]->kind == CKPT_PK_FLOAT && t->v[0]->f == 1.5);
		CHECK(t->v[1]->kind == CKPT_PK_NONE);
		CHECK(t->v[2]->kind == CKPT_PK_BOOL && t->v[2]->i == 1);
		CHECK(t->v[3]->kind == CKPT_PK_BOOL && t->v[3]->i == 0);
	}
	const ckpt_pk *c = ckpt_pk_get(r, "c");
	if (has_bytes)
		CHECK(c && c->kind == CKPT_PK_BYTES && c->len == 4 && memcmp(c->s, "xy\0z", 4) == 0);
	const ckpt_pk *d = ckpt_pk_get(r, "d");
	CHECK(d && d->kind == CKPT_PK_STR && strcmp(d->s, "h\xc3\xa9llo") == 0);
	const ckpt_pk *e = ckpt_pk_get(ckpt_pk_get(r, "e"), "n");
	CHECK(e && e->kind == CKPT_PK_TUPLE && e->n == 0);
	ckpt_pickle_free(p);
	/* every proper prefix is refused, never read past */
	for (size_t cut = 0; cut < n; cut++) {
		uint8_t *copy = malloc(cut + 1);
		memcpy(copy, b, cut);
		int rc = ckpt_pickle_load(copy, cut, "cut", &p);
		CHECK(rc == -EINVAL);
		if (rc != -EINVAL)
			fprintf(stderr, "cut %zu of %zu: %d\n", cut, n, rc);
		CHECK(p == NULL);
		free(copy);
	}
}

static void test_plain(void)
{
	ckpt_log_quiet(1);
	check_plain(k_plain_p0, sizeof(k_plain_p0), 0);
	check_plain(k_plain_p2, sizeof(k_plain_p2), 1);
	check_plain(k_plain_p4, sizeof(k_plain_p4), 1);
	check_plain(k_plain_p5, sizeof(k_plain_p5), 1);
	ckpt_log_quiet(0);
}

static void test_torch(void)
{
	ckpt_pickle *p = NULL;
	CHECK_EQ_INT(ckpt_pickle_load(k_torch, sizeof(k_torch), "data.pkl", &p), 0);
	const ckpt_pk *r = ckpt_pickle_root(p);
	CHECK(r && r->kind == CKPT_PK_DICT && r->n == 4); /* OrderedDict() becomes a dict */
	const ckpt_pk *w = ckpt_pk_get(r, "w"), *wt = ckpt_pk_get(r, "wt");
	CHECK(ckpt_pk_is(w, "torch._utils._rebuild_tensor_v2") && w->args->n == 6);
	CHECK(ckpt_pk_is(wt, "torch._utils._rebuild_tensor_v2") && wt->args->n == 6);
	if (w && wt && w->args && wt->args && w->args->n == 6 && wt->args->n == 6) {
		const ckpt_pk *pid = w->args->v[0];
		CHECK(pid->kind == CKPT_PK_PERSID && pid->args->kind == CKPT_PK_TUPLE && pid->args->n == 5);
		CHECK(ckpt_pk_is(ckpt_pk_item(pid->args, 1), "torch.FloatStorage"));
		CHECK(strcmp(ckpt_pk_item(pid->args, 2)->s, "0") == 0);
		const ckpt_pk *pid2 = wt->args->v[0];
		CHECK(pid2->kind == CKPT_PK_PERSID && strcmp(ckpt_pk_item(pid2->args, 2)->s, "0") == 0);
		int64_t off = 0, v[4];
		CHECK(ckpt_pk_int(wt->args->v[1], &off) == 0 && off == 2147483649LL); /* LONG1 */
		CHECK_EQ_INT(ckpt_pk_ints(wt->args->v[3], v, 4), 2);
		CHECK(v[0] == 1 && v[1] == 4);
	}
	ckpt_pickle_free(p);
}

static void test_dcp_metadata(void)
{
	size_t n = 0;
	char *b = check_slurp(CKPT_FIXTURES "/torch_dcp/.metadata", &n);
	CHECK(b != NULL);
	if (!b)
		return;
	ckpt_pickle *p = NULL;
	CHECK_EQ_INT(ckpt_pickle_load(b, n, ".metadata", &p), 0);
	const ckpt_pk *r = ckpt_pickle_root(p);
	CHECK(ckpt_pk_is(r, "torch.distributed.checkpoint.metadata.Metadata"));
	const ckpt_pk *sdm = ckpt_pk_field(r, "state_dict_metadata");
	CHECK(sdm && sdm->kind == CKPT_PK_DICT && sdm->n == 20);
	const ckpt_pk *emb = ckpt_pk_get(sdm, "params.embed.embedding");
	CHECK(ckpt_pk_is_attr(emb, "TensorStorageMetadata"));
	int64_t v[4];
	CHECK_EQ_INT(ckpt_pk_ints(ckpt_pk_field(emb, "size"), v, 4), 2);
	CHECK(v[0] == 64 && v[1] == 32);
	const ckpt_pk *props = ckpt_pk_field(emb, "properties");
	CHECK(props && props->state && props->state->kind == CKPT_PK_TUPLE &&
	      ckpt_pk_is(props->state->v[0], "torch.bfloat16"));
	const ckpt_pk *sd = ckpt_pk_field(r, "storage_data");
	CHECK(sd && sd->kind == CKPT_PK_DICT && sd->n == 20);
	if (sd && sd->n) {
		CHECK(ckpt_pk_is_attr(sd->v[0], "MetadataIndex"));
		CHECK(ckpt_pk_is(sd->v[1], "torch.distributed.checkpoint.filesystem._StorageInfo"));
		const ckpt_pk *rp = ckpt_pk_field(sd->v[1], "relative_path");
		CHECK(rp && rp->kind == CKPT_PK_STR && strcmp(rp->s, "__0_0.distcp") == 0);
	}
	ckpt_pickle_free(p);
	free(b);
}

static void refused(const uint8_t *b, size_t n, int want, const char *in_log)
{
	ckpt_pickle *p = (ckpt_pickle *)1;
	last_log[0] = 0;
	ckpt_log_set_sink(sink);
	CHECK_EQ_INT(ckpt_pickle_load(b, n, "evil.pkl", &p), want);
	ckpt_log_set_sink(NULL);
	CHECK(p == NULL);
	if (in_log) {
		CHECK(strstr(last_log, in_log) != NULL);
		if (!strstr(last_log, in_log))
			fprintf(stderr, "log was: %s\n", last_log);
	}
}

#define REFUSED(lit, want, log) refused((const uint8_t *)(lit), sizeof(lit) - 1, want, log)

static void test_refused(void)
{
	refused(k_evil, sizeof(k_evil), -EPERM, "refused global os.system");
	refused(k_evil4, sizeof(k_evil4), -EPERM, "refused global builtins.eval");
	REFUSED("\x80\x02"
		"ctorch._utils\n_rebuild_tensor_v9\n.",
		-EPERM, "torch._utils._rebuild_tensor_v9");
	REFUSED("\x80\x02"
		"ctorch\nload\n.",
		-EPERM, "torch.load");
	REFUSED("\x80\x02"
		"c__builtin__\neval\n.",
		-EPERM, "__builtin__.eval");
	REFUSED("(cos\nsystem\nS'ls'\no.", -EPERM, "os.system");
	REFUSED("(S'ls'\nios\nsystem\n.", -EPERM, "0x53");
	REFUSED("\x80\x02\x82\x01.", -EPERM, "0x82"); /* EXT1 */
	REFUSED("\x80\x05\x97.", -EPERM, "0x97"); /* NEXT_BUFFER */
	REFUSED("Pfoo\n.", -EPERM, "0x50"); /* PERSID */
	REFUSED("\x80\x02"
		"ctorch\nFloat Storage\n.",
		-EPERM, NULL);
	/* getattr only of an enum member */
	REFUSED("\x80\x02"
		"c__builtin__\ngetattr\ncos\nsystem\nX\x06\x00\x00\x00"
		"systemq\x00\x86R.",
		-EPERM, "os.system");
	REFUSED("\x80\x02"
		"c__builtin__\ngetattr\nctorch\nSize\nX\x03\x00\x00\x00"
		"foo\x86R.",
		-EPERM, "getattr other than of an enum member");
	/* a whitelisted global may only build records: calling a str is refused */
	REFUSED("\x80\x02X\x01\x00\x00\x00"
		"a)R.",
		-EINVAL, "not a global");
}

static void test_bounds(void)
{
	ckpt_log_quiet(1);
	REFUSED("\x80\x02h\x05.", -EINVAL, NULL); /* BINGET of nothing */
	REFUSED("\x80\x02Nr\xff\xff\xff\xff.", -EINVAL, NULL); /* LONG_BINPUT index 2^32-1 */
	REFUSED("\x80\x02]\x94h\x00"
		"a.",
		-EINVAL, NULL); /* list appended to itself */
	REFUSED("\x80\x02\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01.", -EINVAL, NULL); /* 2^64 */
	REFUSED("\x80\x02\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00.", -EINVAL, NULL); /* 2^63 */
	REFUSED("\x80\x02\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\xff\x86.", -EINVAL,
		NULL); /* TUPLE2 of one value */
	REFUSED("\x80\x06N.", -EINVAL, NULL); /* protocol 6 */
	REFUSED("\x80\x02NN.", -EINVAL, NULL); /* two values at STOP */
	REFUSED("\x80\x02(N.", -EINVAL, NULL); /* MARK left at STOP */
	REFUSED("\x80\x02"
		"X\xff\xff\xff\x7f"
		"ab.",
		-EINVAL, NULL); /* length past the end */
	REFUSED("\x80\x02"
		"\x8d\xff\xff\xff\xff\xff\xff\xff\xff.",
		-EINVAL, NULL);
	REFUSED("\x80\x02N\x8b\xff\xff\xff\x7f.", -EINVAL, NULL);
	REFUSED("\x80\x02}N\x94u.", -EINVAL, NULL);
	ckpt_log_quiet(0);
	/* getattr(enum class, "NAME") */
	ckpt_pickle *p = NULL;
	static const uint8_t ga[] = "\x80\x02"
				    "c__builtin__\ngetattr\n"
				    "ctorch.distributed.checkpoint.metadata\n_MEM_FORMAT_ENCODING\n"
				    "X\x17\x00\x00\x00"
				    "TORCH_CONTIGUOUS_FORMAT\x86R.";
	CHECK_EQ_INT(ckpt_pickle_load(ga, sizeof(ga) - 1, "ga", &p), 0);
	CHECK(p &&
	      ckpt_pk_is(ckpt_pickle_root(p), "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING"));
	ckpt_pickle_free(p);
	/* LONG1 of 9 bytes that fits; -1 */
	static const uint8_t l9[] = "\x80\x02\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\xff.";
	CHECK_EQ_INT(ckpt_pickle_load(l9, sizeof(l9) - 1, "l9", &p), 0);
	CHECK(p && ckpt_pickle_root(p)->kind == CKPT_PK_INT && ckpt_pickle_root(p)->i == -1);
	ckpt_pickle_free(p);
	/* nesting: 64 lists deep is the limit */
	for (int depth = 60; depth <= 70; depth += 10) {
		uint8_t buf[256];
		size_t k = 0;
		buf[k++] = 0x80;
		buf[k++] = 2;
		for (int i = 0; i < depth; i++)
			buf[k++] = ']';
		for (int i = 0; i < depth - 1; i++)
			buf[k++] = 'a';
		buf[k++] = '.';
		ckpt_log_quiet(1);
		int rc = ckpt_pickle_load(buf, k, "deep", &p);
		ckpt_log_quiet(0);
		CHECK_EQ_INT(rc, depth <= CKPT_PK_MAX_DEPTH ? 0 : -EINVAL);
		ckpt_pickle_free(p);
		p = NULL;
	}
	/* the global list itself */
	CHECK(ckpt_pickle_global_ok("torch", "BFloat16Storage"));
	CHECK(ckpt_pickle_global_ok("torch", "bfloat16"));
	CHECK(ckpt_pickle_global_ok("torch.distributed._shard.sharded_tensor.metadata", "TensorProperties"));
	CHECK(ckpt_pickle_global_ok("torch.distributed._shard.sharded_tensor.metadata",
				    "MEM_FORMAT_ENCODING"));
	CHECK(ckpt_pickle_global_ok("pathlib._local", "PosixPath"));
	CHECK(!ckpt_pickle_global_ok("torch", "Storage.x"));
	CHECK(!ckpt_pickle_global_ok("torch", "load"));
	CHECK(!ckpt_pickle_global_ok("collections", "namedtuple"));
	CHECK(!ckpt_pickle_global_ok("pathlib", "Path.open"));
}

int main(void)
{
	CHECK_RUN(test_plain);
	CHECK_RUN(test_torch);
	CHECK_RUN(test_dcp_metadata);
	CHECK_RUN(test_refused);
	CHECK_RUN(test_bounds);
	return CHECK_DONE();
}
