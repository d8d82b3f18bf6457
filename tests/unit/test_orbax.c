/*
 * test_orbax.c - Orbax name rules, step numbers, _sharding keys, key escaping
 * and the key-path repr / leaf order.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "orbax.h"

static void test_names(void)
{
	const char *why = NULL;
	/* committed step names: what Orbax's step naming finds */
	CHECK(ckpt_orbax_name_ok(CKPT_NAME_STEP, "30", &why));
	CHECK(ckpt_orbax_name_ok(CKPT_NAME_STEP, "0", NULL));
	CHECK(ckpt_orbax_name_ok(CKPT_NAME_STEP, "0030", NULL));
	CHECK(ckpt_orbax_name_ok(CKPT_NAME_STEP, "step_30", NULL));
	CHECK(ckpt_orbax_name_ok(CKPT_NAME_STEP, "a_b_7", NULL));
	why = NULL;
	CHECK(!ckpt_orbax_name_ok(CKPT_NAME_STEP, "renamee", &why) && why && *why);
	CHECK(!ckpt_orbax_name_ok(CKPT_NAME_STEP, "s3", NULL));
	CHECK(!ckpt_orbax_name_ok(CKPT_NAME_STEP, "_3", NULL));
	CHECK(!ckpt_orbax_name_ok(CKPT_NAME_STEP, "3_", NULL));
	CHECK(!ckpt_orbax_name_ok(CKPT_NAME_STEP, "metadata", NULL));
	CHECK(!ckpt_orbax_name_ok(CKPT_NAME_STEP, "30.orbax-checkpoint-tmp", NULL));
	CHECK(!ckpt_orbax_name_ok(CKPT_NAME_STEP, "../30", NULL));
	CHECK(!ckpt_orbax_name_ok(CKPT_NAME_STEP, "99999999999999999999", NULL)); /* > 2^64 */
	/* pending step names: anything but the reserved ones */
	CHECK(ckpt_orbax_name_ok(CKPT_NAME_PENDING_STEP, "renamee", NULL));
	CHECK(ckpt_orbax_name_ok(CKPT_NAME_PENDING_STEP, "tmp50", NULL));
	CHECK(!ckpt_orbax_name_ok(CKPT_NAME_PENDING_STEP, "metadata", NULL));
	CHECK(!ckpt_orbax_name_ok(CKPT_NAME_PENDING_STEP, "x.orbax-checkpoint-tmp", NULL));
	CHECK(!ckpt_orbax_name_ok(CKPT_NAME_PENDING_STEP, "30.orbax-checkpoint-tmp", NULL));
	CHECK(!ckpt_orbax_name_ok(CKPT_NAME_PENDING_STEP, ".hidden", NULL));
	CHECK(!ckpt_orbax_name_ok(CKPT_NAME_PENDING_STEP, "", NULL));
	CHECK(!ckpt_orbax_name_ok(CKPT_NAME_PENDING_STEP, NULL, NULL));
	CHECK(!ckpt_orbax_name_ok(CKPT_NAME_PENDING_STEP, "x.partial_save", NULL));
	/* every kind: length, '/', '.', '[' */
	char longname[CKPT_ORBAX_NAME_MAX + 2];
	memset(longname, 'a', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = 0;
	CHECK(!ckpt_orbax_name_ok(CKPT_NAME_KEY, longname, NULL));
	longname[CKPT_ORBAX_NAME_MAX] = 0;
	CHECK(ckpt_orbax_name_ok(CKPT_NAME_KEY, longname, NULL));
	const enum ckpt_orbax_name kinds[] = { CKPT_NAME_STEP, CKPT_NAME_ITEM, CKPT_NAME_KEY, CKPT_NAME_PARAM,
					       CKPT_NAME_PENDING_STEP };
	for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
		CHECK(!ckpt_orbax_name_ok(kinds[i], ".", NULL));
		CHECK(!ckpt_orbax_name_ok(kinds[i], "..", NULL));
		CHECK(ckpt_orbax_name_ok(kinds[i], "a/1", NULL) ==
		      (kinds[i] == CKPT_NAME_KEY || kinds[i] == CKPT_NAME_PARAM));
		CHECK(!ckpt_orbax_name_ok(kinds[i], "a[1]", NULL));
		CHECK(!ckpt_orbax_name_ok(kinds[i], "a\x01b", NULL));
		CHECK(!ckpt_orbax_name_ok(kinds[i], "line\nbreak", NULL));
		CHECK(!ckpt_orbax_name_ok(kinds[i], "del\x7f", NULL));
		CHECK(!ckpt_orbax_name_ok(kinds[i], "30\t", NULL));
	}
	/* '/' in keys and params: nested folders, each part a plain name */
	CHECK(ckpt_orbax_name_ok(CKPT_NAME_KEY, "we/ird", NULL));
	CHECK(!ckpt_orbax_name_ok(CKPT_NAME_KEY, "a//b", NULL));
	CHECK(!ckpt_orbax_name_ok(CKPT_NAME_KEY, "a/", NULL));
	CHECK(!ckpt_orbax_name_ok(CKPT_NAME_KEY, "/a", NULL));
	CHECK(!ckpt_orbax_name_ok(CKPT_NAME_KEY, "a/../b", NULL));
	CHECK(!ckpt_orbax_name_ok(CKPT_NAME_KEY, "a/.b", NULL));
	CHECK(!ckpt_orbax_name_ok(CKPT_NAME_PARAM, "_sharding/x", NULL));
	CHECK(ckpt_orbax_name_ok(CKPT_NAME_PARAM, "x/_sharding", NULL));
	/* reserved item names */
	CHECK(!ckpt_orbax_name_ok(CKPT_NAME_ITEM, "descriptor", NULL));
	CHECK(!ckpt_orbax_name_ok(CKPT_NAME_ITEM, "AUTO", NULL));
	CHECK(ckpt_orbax_name_ok(CKPT_NAME_ITEM, "metrics", NULL)); /* as a JSON item */
	/* items */
	CHECK(ckpt_orbax_name_ok(CKPT_NAME_ITEM, "state", NULL));
	CHECK(!ckpt_orbax_name_ok(CKPT_NAME_ITEM, "_CHECKPOINT_METADATA", NULL));
	CHECK(!ckpt_orbax_name_ok(CKPT_NAME_ITEM, "commit_success.txt", NULL));
	CHECK(!ckpt_orbax_name_ok(CKPT_NAME_ITEM, "orbax.checkpoint", NULL));
	/* params */
	CHECK(ckpt_orbax_name_ok(CKPT_NAME_PARAM, "params.dense.kernel", NULL));
	CHECK(!ckpt_orbax_name_ok(CKPT_NAME_PARAM, "_METADATA", NULL));
	CHECK(!ckpt_orbax_name_ok(CKPT_NAME_PARAM, "_sharding", NULL));
	CHECK(!ckpt_orbax_name_ok(CKPT_NAME_PARAM, "_strings.json", NULL));
	CHECK(!ckpt_orbax_name_ok(CKPT_NAME_PARAM, "manifest.ocdbt", NULL));
	CHECK(!ckpt_orbax_name_ok(CKPT_NAME_PARAM, "array_metadatas", NULL));
	CHECK(!ckpt_orbax_name_ok(CKPT_NAME_PARAM, "ocdbt.process_0", NULL));
	CHECK(ckpt_orbax_name_ok(CKPT_NAME_KEY, "_METADATA", NULL)); /* fine one level down */

	/* key paths */
	const char *k1[] = { "_strings", "json" };
	const int t22[] = { CKPT_KEY_DICT, CKPT_KEY_DICT }, t21[] = { CKPT_KEY_DICT, CKPT_KEY_SEQ };
	CHECK(!ckpt_orbax_keypath_ok(k1, t22, 2, NULL)); /* param "_strings.json" */
	const char *k2[] = { "layers", "0" };
	CHECK(ckpt_orbax_keypath_ok(k2, t21, 2, NULL));
	const char *k3[] = { "layers", "01" };
	CHECK(!ckpt_orbax_keypath_ok(k3, t21, 2, NULL));
	CHECK(ckpt_orbax_keypath_ok(k3, t22, 2, NULL));
	const int tbad[] = { CKPT_KEY_DICT, 3 };
	CHECK(!ckpt_orbax_keypath_ok(k2, tbad, 2, NULL));
	CHECK(!ckpt_orbax_keypath_ok(k2, t22, 0, NULL));
	why = NULL;
	CHECK(!ckpt_orbax_keypath_ok(k2, t22, CKPT_ORBAX_MAX_DEPTH + 1, &why) && why);

	/* unfinished folders */
	CHECK(ckpt_orbax_is_unfinished("30.orbax-checkpoint-tmp"));
	CHECK(ckpt_orbax_is_unfinished("30.orbax-checkpoint-tmp-1700000000"));
	CHECK(ckpt_orbax_is_unfinished("30.partial_save"));
	CHECK(!ckpt_orbax_is_unfinished("30.partial_save.x"));
	CHECK(!ckpt_orbax_is_unfinished("30"));

	uint64_t s = 0;
	CHECK(ckpt_orbax_step_number("step_0042", &s) && s == 42);
	CHECK(ckpt_orbax_step_number("18446744073709551615", &s) && s == UINT64_MAX);
	CHECK(!ckpt_orbax_step_number("18446744073709551616", &s));
	CHECK(!ckpt_orbax_step_number("", &s));
}

static void sharding_rt(const char *param, const char *want)
{
	char *k = ckpt_orbax_sharding_key(param);
	CHECK(k && strcmp(k, want) == 0);
	char *back = k ? ckpt_orbax_sharding_key_decode(k) : NULL;
	CHECK(back && strcmp(back, param) == 0);
	free(k);
	free(back);
}

static void test_sharding(void)
{
	sharding_rt("", "");
	sharding_rt("a", "YQ==");
	sharding_rt("ab", "YWI=");
	sharding_rt("abc", "YWJj");
	sharding_rt("params.dense.kernel", "cGFyYW1zLmRlbnNlLmtlcm5lbA==");
	sharding_rt("\xff\xfe?", "__4_"); /* the URL-safe characters */
	CHECK(ckpt_orbax_sharding_key_decode("YQ") == NULL); /* unpadded */
	CHECK(ckpt_orbax_sharding_key_decode("YR==") == NULL); /* non-zero trailing bits */
	CHECK(ckpt_orbax_sharding_key_decode("Y===") == NULL);
	CHECK(ckpt_orbax_sharding_key_decode("YQ=A") == NULL);
	CHECK(ckpt_orbax_sharding_key_decode("YQ==YWJj") == NULL);
	CHECK(ckpt_orbax_sharding_key_decode("YW+j") == NULL); /* '+' is not URL-safe */
	CHECK(ckpt_orbax_sharding_key_decode("AA==") == NULL); /* a NUL byte */
	/* every byte value in every position */
	for (int b = 1; b < 256; b++)
		for (int pos = 0; pos < 3; pos++) {
			char s[4] = { 'x', 'y', 'z', 0 };
			s[pos] = (char)b;
			char *k = ckpt_orbax_sharding_key(s), *back = ckpt_orbax_sharding_key_decode(k);
			CHECK(back && strcmp(back, s) == 0);
			free(k);
			free(back);
		}
}

static void escape_rt(const char *key, const char *want)
{
	char buf[64], back[64];
	int n = ckpt_orbax_key_escape(key, buf, sizeof(buf));
	CHECK_EQ_INT(n, (int)strlen(want));
	CHECK(strcmp(buf, want) == 0);
	CHECK_EQ_INT(ckpt_orbax_key_unescape(buf, back, sizeof(back)), (int)strlen(key));
	CHECK(strcmp(back, key) == 0);
}

static void test_escape(void)
{
	escape_rt("kernel", "kernel");
	escape_rt("", "%");
	escape_rt(".", "%2E");
	escape_rt("..", "%2E%2E");
	escape_rt("...", "...");
	escape_rt(".x", ".x");
	escape_rt("a/b", "a%2Fb");
	escape_rt("100%", "100%25");
	escape_rt("%2E", "%252E");
	escape_rt("%", "%25");
	escape_rt("a.b", "a.b");
	char buf[8];
	CHECK_EQ_INT(ckpt_orbax_key_escape("abcdefgh", buf, sizeof(buf)), -ENAMETOOLONG);
	CHECK(strlen(buf) < sizeof(buf));
	CHECK_EQ_INT(ckpt_orbax_key_escape("abcdef/", buf, sizeof(buf)), -ENAMETOOLONG);
	CHECK_EQ_INT(ckpt_orbax_key_escape("abcd/", buf, sizeof(buf)), 7);
	CHECK_EQ_INT(ckpt_orbax_key_unescape("%41", buf, sizeof(buf)), -EINVAL);
	CHECK_EQ_INT(ckpt_orbax_key_unescape("a%2Eb", buf, sizeof(buf)), -EINVAL);
	CHECK_EQ_INT(ckpt_orbax_key_unescape("a%2", buf, sizeof(buf)), -EINVAL);
	CHECK_EQ_INT(ckpt_orbax_key_unescape("a%2f", buf, sizeof(buf)), -EINVAL);
	CHECK_EQ_INT(ckpt_orbax_key_unescape("a/b", buf, sizeof(buf)), -EINVAL);
	CHECK_EQ_INT(ckpt_orbax_key_unescape("", buf, sizeof(buf)), -EINVAL);
	CHECK_EQ_INT(ckpt_orbax_key_unescape(".", buf, sizeof(buf)), -EINVAL);
	CHECK_EQ_INT(ckpt_orbax_key_unescape("..", buf, sizeof(buf)), -EINVAL);
	CHECK_EQ_INT(ckpt_orbax_key_unescape("abcdefgh", buf, sizeof(buf)), -ENAMETOOLONG);
}

static void repr_is(const char *const *keys, int depth, const char *want)
{
	char *r = ckpt_orbax_keypath_repr(keys, depth);
	CHECK(r && strcmp(r, want) == 0);
	if (r && strcmp(r, want))
		fprintf(stderr, "  got %s want %s\n", r, want);
	free(r);
}

static void test_repr_and_order(void)
{
	const char *a[] = { "params", "dense", "kernel" };
	repr_is(a, 3, "('params', 'dense', 'kernel')");
	repr_is(a, 1, "('params',)");
	const char *q[] = { "it's", "say \"hi\" it's", "a\\b\n\t\r\x01\x7f" };
	repr_is(q, 1, "(\"it's\",)");
	repr_is(q + 1, 1, "('say \"hi\" it\\'s',)");
	repr_is(q + 2, 1, "('a\\\\b\\n\\t\\r\\x01\\x7f',)");
	const char *e[] = { "" };
	repr_is(e, 1, "('',)");
	CHECK(ckpt_orbax_keypath_repr(a, 0) == NULL);

	const int S = CKPT_KEY_SEQ, D = CKPT_KEY_DICT;
	const char *l2[] = { "layers", "2" }, *l10[] = { "layers", "10" }, *lay[] = { "layers" };
	const char *dk2[] = { "layers", "b" }, *dk10[] = { "layers", "a" };
	const int ts[] = { D, S }, td[] = { D, D };
	CHECK(ckpt_orbax_keypath_cmp(l2, ts, 2, l10, ts, 2) < 0); /* numeric: 2 < 10 */
	CHECK(ckpt_orbax_keypath_cmp(l10, ts, 2, l2, ts, 2) > 0);
	CHECK(ckpt_orbax_keypath_cmp(l2, td, 2, l10, td, 2) > 0); /* dict keys: "10" < "2" */
	CHECK(ckpt_orbax_keypath_cmp(dk10, td, 2, dk2, td, 2) < 0);
	CHECK(ckpt_orbax_keypath_cmp(lay, td, 1, l2, ts, 2) < 0); /* prefix first */
	CHECK(ckpt_orbax_keypath_cmp(l2, ts, 2, lay, td, 1) > 0);
	CHECK(ckpt_orbax_keypath_cmp(l2, ts, 2, l2, ts, 2) == 0);
	const char *Up[] = { "Z" }, *lo[] = { "a" };
	CHECK(ckpt_orbax_keypath_cmp(Up, td, 1, lo, td, 1) < 0); /* byte (code point) order */
	const char *u8[] = { "\xc3\xa9" }; /* U+00E9 sorts after ASCII */
	CHECK(ckpt_orbax_keypath_cmp(lo, td, 1, u8, td, 1) < 0);
}

int main(void)
{
	CHECK_RUN(test_names);
	CHECK_RUN(test_sharding);
	CHECK_RUN(test_escape);
	CHECK_RUN(test_repr_and_order);
	return CHECK_DONE();
}
