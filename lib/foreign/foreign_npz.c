/*
 * foreign_npz.c - .npz archives (numpy's savez / savez_compressed; the
 * single-file checkpoints big_vision publishes): every member NAME.npy is
 * an array at key path NAME split on '/'.  A stored member is served as a
 * byte range of the archive; a deflated one as one raw-deflate chunk whose
 * inflated .npy header is skipped.  The archive is never read whole: its
 * central directory, and per member the local header and the .npy header.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "common.h"
#include "foreign.h"
#include "npz.h"
#include "orbax.h"
#include "zip.h"

struct zrd {
	ckpt_store *s;
	const char *key;
};

static ssize_t zread(void *ctx, uint64_t off, size_t len, void *dst)
{
	struct zrd *r = ctx;
	return ckpt_store_read(r->s, r->key, off, len, dst);
}

/* 1 for a ZIP archive whose first member is an .npy file (np.savez writes
 * nothing else), or an empty archive named .npz. */
static int npz_probe(ckpt_store *src, const char *key, const struct ckpt_store_stat *st, const uint8_t *head,
		     size_t nhead)
{
	(void)src;
	if (st->is_dir || !ckpt_zip_magic(head, nhead))
		return 0;
	if (ckpt_le32(head) != 0x04034b50u) {
		size_t n = strlen(key);
		return n >= 4 && strcmp(key + n - 4, ".npz") == 0;
	}
	if (nhead < 30)
		return 0;
	size_t nl = (size_t)head[26] | (size_t)head[27] << 8;
	return nl >= 4 && 30 + nl <= nhead && memcmp(head + 30 + nl - 4, ".npy", 4) == 0;
}

/* The .npy header at the start of a stored member's data, and the CRC-32
 * of its bytes (*head_crc: the start of the member's CRC-32). */
static int stored_header(struct zrd *r, uint64_t off, uint64_t avail, struct ckpt_npz_header *h,
			 uint32_t *head_crc, const char **why)
{
	size_t want = 4096;
	for (int tries = 0; tries < 3; tries++) {
		size_t n = avail < want ? (size_t)avail : want;
		uint8_t *buf = malloc(n ? n : 1);
		if (!buf)
			return -ENOMEM;
		ssize_t got = ckpt_store_read(r->s, r->key, off, n, buf);
		if (got < 0) {
			free(buf);
			return (int)got;
		}
		size_t need = 0;
		int rc = ckpt_npz_header_parse(buf, (size_t)got, h, &need, why);
		if (rc == 0) /* 0: the whole header lay in buf */
			*head_crc = (uint32_t)crc32_z(crc32(0L, Z_NULL, 0), buf, (z_size_t)h->data_offset);
		free(buf);
		if (rc != -EAGAIN)
			return rc;
		if (need > avail || (size_t)got < n) {
			*why = "the member ends inside its .npy header";
			return -EINVAL;
		}
		want = need;
	}
	*why = "bad .npy header";
	return -EINVAL;
}

/* The .npy header at the start of a deflated member: inflate its first
 * bytes, reading the member 4 KiB at a time, until the header parses (at
 * most its bound). */
static int deflated_header(struct zrd *r, uint64_t off, uint64_t csize, struct ckpt_npz_header *h,
			   const char **why)
{
	enum { IN_STEP = 4096 };
	size_t cap = CKPT_NPZ_MAX_HEADER + 16;
	uint8_t *in = malloc(IN_STEP), *out = malloc(cap);
	int rc = -ENOMEM;
	z_stream z;
	memset(&z, 0, sizeof(z));
	if (!in || !out || inflateInit2(&z, -MAX_WBITS) != Z_OK)
		goto done;
	size_t made = 0;
	uint64_t fed = 0;
	int zr = Z_OK;
	rc = -EAGAIN;
	while (rc == -EAGAIN && made < cap) {
		if (z.avail_in == 0 && fed < csize) {
			size_t k = csize - fed < IN_STEP ? (size_t)(csize - fed) : IN_STEP;
			ssize_t got = ckpt_store_read(r->s, r->key, off + fed, k, in);
			if (got <= 0) {
				rc = got < 0 ? (int)got : -EINVAL;
				*why = "the member ends early";
				break;
			}
			fed += (uint64_t)got;
			z.next_in = in;
			z.avail_in = (uInt)got;
		}
		size_t step = cap - made < IN_STEP ? cap - made : IN_STEP;
		z.next_out = out + made;
		z.avail_out = (uInt)step;
		zr = inflate(&z, Z_NO_FLUSH);
		made += step - z.avail_out;
		size_t need = 0;
		rc = ckpt_npz_header_parse(out, made, h, &need, why);
		if (rc == -EAGAIN && (zr == Z_STREAM_END || (zr != Z_OK && zr != Z_BUF_ERROR) ||
				      (zr == Z_BUF_ERROR && fed >= csize))) {
			*why = zr == Z_STREAM_END || zr == Z_BUF_ERROR
				       ? "the member ends inside its .npy header"
				       : "bad deflate data";
			rc = -EINVAL;
		}
	}
	if (rc == -EAGAIN) {
		*why = ".npy header too long";
		rc = -EINVAL;
	}
done:
	inflateEnd(&z);
	free(in);
	free(out);
	return rc;
}

/* One member -> one leaf. */
static int add_member(struct ckpt_vitem *vi, struct zrd *r, const struct ckpt_zip_dir *d,
		      const struct ckpt_zip_entry *e)
{
	char buf[4096];
	const char *comps[CKPT_ORBAX_MAX_DEPTH];
	int depth = ckpt_npz_key_path(e->name, buf, sizeof(buf), comps, CKPT_ORBAX_MAX_DEPTH);
	if (depth < 0) { /* not a path: the whole name is one key */
		size_t n = strlen(e->name);
		if (n >= 4 && strcmp(e->name + n - 4, ".npy") == 0)
			n -= 4;
		if (n == 0 || n >= sizeof(buf))
			return 0;
		memcpy(buf, e->name, n);
		buf[n] = 0;
		comps[0] = buf;
		depth = 1;
	}
	const char *why = NULL;
	uint64_t off = 0;
	struct ckpt_npz_header h;
	/* a stored member's CRC-32 covers its .npy header too: the header's, to
	 * combine with the array's bytes when they are checked */
	uint32_t head_crc = 0;
	int rc;
	if (e->flags & 1) {
		why = "encrypted";
		rc = -ENOTSUP;
	} else if (e->method != 0 && e->method != 8) {
		why = "compressed with a method other than stored or deflate";
		rc = -ENOTSUP;
	} else if ((rc = ckpt_zip_data_offset(zread, r, d, e, &off, &why)) == 0) {
		rc = e->method == 0 ? stored_header(r, off, e->csize, &h, &head_crc, &why)
				    : deflated_header(r, off, e->csize, &h, &why);
	}
	if (rc == 0) {
		uint64_t total = h.data_offset + h.nbytes;
		if (total < h.data_offset || (e->method == 0 ? e->csize : e->usize) != total) {
			why = "the member's size differs from what its .npy header says";
			rc = -EINVAL;
		} else if (h.data_offset > (1u << 20)) {
			why = ".npy header too long";
			rc = -EINVAL;
		}
	}
	if (rc == 0) {
		struct ckpt_varray a = {
			.dtype = h.dtype,
			.rank = h.rank,
			.fortran_order = h.fortran_order,
			.big_endian = h.big_endian,
			.codec = e->method == 0 ? CKPT_VCODEC_RAW : CKPT_VCODEC_DEFLATE,
			.skip = e->method == 0 ? 0 : (uint32_t)h.data_offset,
			.has_crc32 = 1,
			.crc32 = e->crc32,
			.head_crc32 = head_crc,
			.base = r->s,
			.base_key = r->key,
			.offset = e->method == 0 ? off + h.data_offset : off,
			.length = e->method == 0 ? h.nbytes : e->csize,
		};
		memcpy(a.shape, h.shape, sizeof(a.shape));
		if ((rc = ckpt_vitem_add_array(vi, comps, depth, &a)) == -ENOMEM)
			return rc;
		if (rc < 0)
			why = "its dtype, shape or byte order cannot be shown";
	}
	if (rc < 0) {
		ckpt_log(CKPT_LOG_ERR, "%s/%s: member %s cannot be read (%s); listed, reads answer EIO",
			 r->s->root, r->key, e->name, why ? why : strerror(-rc));
		return ckpt_vitem_add_unreadable(vi, comps, depth);
	}
	return 0;
}

static int npz_open(ckpt_store *src, const char *key, const struct ckpt_store_stat *st, ckpt_store **item)
{
	struct zrd r = { src, key };
	struct ckpt_zip_dir d;
	const char *why = "?";
	int rc = ckpt_zip_dir_read(zread, &r, st->size, &d, &why);
	if (rc < 0) {
		ckpt_log(CKPT_LOG_ERR, "%s/%s: not a readable .npz archive: %s", src->root, key,
			 rc == -EINVAL ? why : strerror(-rc));
		ckpt_zip_dir_free(&d);
		return rc == -EINVAL ? -EIO : rc;
	}
	char name[4096];
	snprintf(name, sizeof(name), "%s/%s", src->root, key);
	struct ckpt_vitem *vi;
	if ((rc = ckpt_vitem_new(name, &vi)) < 0) {
		ckpt_zip_dir_free(&d);
		return rc;
	}
	for (size_t i = 0; i < d.n && rc == 0; i++) {
		const struct ckpt_zip_entry *e = &d.e[i];
		if (e->name_len && e->name[e->name_len - 1] == '/')
			continue; /* a folder entry */
		if (e->name_len < 4 || strcmp(e->name + e->name_len - 4, ".npy") != 0) {
			ckpt_log(CKPT_LOG_WARN, "%s/%s: member %s is not an .npy file, not shown", src->root,
				 key, e->name);
			continue;
		}
		rc = add_member(vi, &r, &d, e);
	}
	ckpt_zip_dir_free(&d);
	if (rc < 0) {
		ckpt_vitem_free(vi);
		return rc;
	}
	return ckpt_vitem_finish(vi, item);
}

const struct ckpt_foreign_fmt ckpt_foreign_npz = {
	.name = "npz",
	.what = "an .npz archive (a ZIP of .npy members)",
	.probe = npz_probe,
	.open = npz_open,
};
