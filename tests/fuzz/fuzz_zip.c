/*
 * fuzz_zip.c - libFuzzer target over the ZIP directory reader (zip.h) and
 * the .npy headers of .npz members (npz.h): every input is a whole archive.
 * Checked: every entry the directory reader accepts lies inside the
 * archive, its data offset (when its local header checks out) leaves room
 * for its stored bytes, and a stored member's header, when it parses, fits
 * inside the member.  Member names are split into key paths.
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

#include "fuzz.h"
#include "npz.h"
#include "membuf.h"
#include "zip.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct ckpt_membuf b = { data, size };
	struct ckpt_zip_dir d;
	const char *why = NULL;
	(void)ckpt_zip_magic(data, size);
	int rc = ckpt_zip_dir_read(ckpt_membuf_read, &b, size, &d, &why);
	REQUIRE(rc == 0 || rc == -EINVAL || rc == -ENOMEM);
	REQUIRE(rc != -EINVAL || why);
	for (size_t i = 0; rc == 0 && i < d.n; i++) {
		const struct ckpt_zip_entry *e = &d.e[i];
		REQUIRE(e->name && strlen(e->name) == e->name_len);
		REQUIRE(e->local_off <= size && e->csize <= size);
		char kb[4096];
		const char *comps[16];
		int depth = ckpt_npz_key_path(e->name, kb, sizeof(kb), comps, 16);
		REQUIRE(depth < 0 || (depth >= 1 && depth <= 16));
		for (int k = 0; k < depth; k++)
			REQUIRE(*comps[k] && !strchr(comps[k], '/'));
		uint64_t off;
		if (ckpt_zip_data_offset(ckpt_membuf_read, &b, &d, e, &off, &why) != 0)
			continue;
		REQUIRE(off <= size && size - off >= e->csize);
		if (e->method != 0)
			continue;
		struct ckpt_npz_header h;
		size_t need = 0;
		int hr = ckpt_npz_header_parse(data + off, (size_t)e->csize, &h, &need, &why);
		REQUIRE(hr == 0 || hr == -EAGAIN || hr == -EINVAL || hr == -ENOTSUP);
		if (hr == -EAGAIN)
			REQUIRE(need > e->csize);
		if (hr == 0)
			REQUIRE(h.data_offset <= e->csize && h.rank >= 0 && h.rank <= CKPT_MAX_RANK);
	}
	ckpt_zip_dir_free(&d);
	return 0;
}
