/*
 * zip.c - ZIP directory reader (see zip.h).  Layout (PKWARE APPNOTE):
 *   [local header 30 B + name + extra][data] ... [central directory]
 *   [ZIP64 end record][ZIP64 locator 20 B] (only when needed)
 *   [end of central directory 22 B + comment (< 64 KiB)]
 * All integers little endian.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "zip.h"

#define SIG_LOCAL 0x04034b50u
#define SIG_CENTRAL 0x02014b50u
#define SIG_EOCD 0x06054b50u
#define SIG_EOCD64 0x06064b50u
#define SIG_LOC64 0x07064b50u
#define EOCD_LEN 22u
#define LOC64_LEN 20u
#define EOCD64_LEN 56u
#define CENTRAL_LEN 46u
#define LOCAL_LEN 30u
#define TAIL_MAX (EOCD_LEN + 0xffffu) /* the end record and its longest comment */

static uint16_t le16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p)
{
	return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

static int fail(const char **why, const char *w)
{
	if (why)
		*why = w;
	return -EINVAL;
}

/* Exactly len bytes at off, else -EINVAL (short) or the callback's error. */
static int read_exact(ckpt_zip_read_fn rd, void *ctx, uint64_t off, size_t len, void *dst, const char **why)
{
	size_t got = 0;
	while (got < len) {
		ssize_t n = rd(ctx, off + got, len - got, (uint8_t *)dst + got);
		if (n < 0)
			return (int)n;
		if (n == 0)
			return fail(why, "the archive ends early");
		got += (size_t)n;
	}
	return 0;
}

int ckpt_zip_magic(const uint8_t *head, size_t n)
{
	return n >= 4 && (le32(head) == SIG_LOCAL || (le32(head) == SIG_EOCD && n >= EOCD_LEN));
}

void ckpt_zip_dir_free(struct ckpt_zip_dir *d)
{
	if (!d)
		return;
	for (size_t i = 0; i < d->n; i++)
		free(d->e[i].name);
	free(d->e);
	memset(d, 0, sizeof(*d));
}

/* The ZIP64 extra field of a central entry: the 8-byte values that stand
 * for fields saturated in the fixed part, in APPNOTE's order. */
static int zip64_extra(const uint8_t *x, size_t xn, struct ckpt_zip_entry *e, int need_u, int need_c,
		       int need_o, const char **why)
{
	size_t p = 0;
	while (p + 4 <= xn) {
		uint16_t id = le16(x + p), len = le16(x + p + 2);
		if (p + 4 + len > xn)
			return fail(why, "an extra field runs past its entry");
		if (id == 1) {
			const uint8_t *v = x + p + 4;
			size_t q = 0;
			if (need_u) {
				if (q + 8 > len)
					return fail(why, "a ZIP64 extra field is too short");
				e->usize = le64(v + q);
				q += 8;
			}
			if (need_c) {
				if (q + 8 > len)
					return fail(why, "a ZIP64 extra field is too short");
				e->csize = le64(v + q);
				q += 8;
			}
			if (need_o) {
				if (q + 8 > len)
					return fail(why, "a ZIP64 extra field is too short");
				e->local_off = le64(v + q);
			}
			return 0;
		}
		p += 4u + len;
	}
	if (need_u || need_c || need_o)
		return fail(why, "a saturated size or offset without its ZIP64 extra field");
	return 0;
}

int ckpt_zip_dir_read(ckpt_zip_read_fn rd, void *ctx, uint64_t size, struct ckpt_zip_dir *out,
		      const char **why)
{
	memset(out, 0, sizeof(*out));
	out->size = size;
	if (size < EOCD_LEN)
		return fail(why, "too short for a ZIP archive");
	size_t tn = size < TAIL_MAX ? (size_t)size : TAIL_MAX;
	uint8_t *tail = malloc(tn);
	if (!tail)
		return -ENOMEM;
	uint64_t toff = size - tn;
	int rc = read_exact(rd, ctx, toff, tn, tail, why);
	if (rc < 0) {
		free(tail);
		return rc;
	}
	/* the last end record whose comment length reaches the end exactly */
	size_t at = SIZE_MAX;
	for (size_t i = tn - EOCD_LEN + 1; i-- > 0;)
		if (le32(tail + i) == SIG_EOCD && i + EOCD_LEN + le16(tail + i + 20) == tn) {
			at = i;
			break;
		}
	if (at == SIZE_MAX) {
		free(tail);
		return fail(why, "no end of central directory record");
	}
	const uint8_t *r = tail + at;
	uint64_t eocd_off = toff + at;
	uint64_t count = le16(r + 10), cd_size = le32(r + 12), cd_off = le32(r + 16);
	int disk = le16(r + 4) != 0 || le16(r + 6) != 0 || le16(r + 8) != le16(r + 10);
	int sat = count == 0xffff || cd_size == 0xffffffffu || cd_off == 0xffffffffu;
	uint8_t loc[LOC64_LEN];
	int has_loc = 0;
	if (eocd_off >= LOC64_LEN) {
		if (at >= LOC64_LEN)
			memcpy(loc, tail + at - LOC64_LEN, LOC64_LEN);
		else if ((rc = read_exact(rd, ctx, eocd_off - LOC64_LEN, LOC64_LEN, loc, why)) < 0) {
			free(tail);
			return rc;
		}
		has_loc = le32(loc) == SIG_LOC64;
	}
	free(tail);
	uint64_t cd_end = eocd_off;
	if (has_loc) {
		uint64_t r64 = le64(loc + 8);
		uint8_t e64[EOCD64_LEN];
		if (le32(loc + 4) != 0 || le32(loc + 16) > 1)
			return fail(why, "a multi-disk archive");
		if (r64 > eocd_off - LOC64_LEN || eocd_off - LOC64_LEN - r64 < EOCD64_LEN)
			return fail(why, "the ZIP64 end record lies outside the archive");
		if ((rc = read_exact(rd, ctx, r64, EOCD64_LEN, e64, why)) < 0)
			return rc;
		if (le32(e64) != SIG_EOCD64)
			return fail(why, "no ZIP64 end record where its locator points");
		if (le32(e64 + 16) != 0 || le32(e64 + 20) != 0 || le64(e64 + 24) != le64(e64 + 32))
			return fail(why, "a multi-disk archive");
		count = le64(e64 + 32);
		cd_size = le64(e64 + 40);
		cd_off = le64(e64 + 48);
		cd_end = r64;
		out->zip64 = 1;
	} else if (sat) {
		return fail(why, "saturated end record without a ZIP64 locator");
	} else if (disk) {
		return fail(why, "a multi-disk archive");
	}
	if (cd_off > cd_end || cd_size > cd_end - cd_off)
		return fail(why, "the central directory lies outside the archive");
	if (cd_size > CKPT_ZIP_MAX_CD)
		return fail(why, "the central directory is too large");
	if (count > CKPT_ZIP_MAX_ENTRIES || count > cd_size / CENTRAL_LEN)
		return fail(why, "more entries than the central directory can hold");
	uint8_t *cd = malloc(cd_size ? (size_t)cd_size : 1);
	if (!cd)
		return -ENOMEM;
	if ((rc = read_exact(rd, ctx, cd_off, (size_t)cd_size, cd, why)) < 0) {
		free(cd);
		return rc;
	}
	out->e = calloc(count ? (size_t)count : 1, sizeof(*out->e));
	if (!out->e) {
		free(cd);
		return -ENOMEM;
	}
	size_t p = 0;
	for (uint64_t i = 0; i < count; i++) {
		if (cd_size - p < CENTRAL_LEN || le32(cd + p) != SIG_CENTRAL) {
			rc = fail(why, "a damaged central directory entry");
			break;
		}
		const uint8_t *c = cd + p;
		size_t nl = le16(c + 28), xl = le16(c + 30), cl = le16(c + 32);
		if (cd_size - p - CENTRAL_LEN < nl + xl + cl) {
			rc = fail(why, "a central directory entry runs past the directory");
			break;
		}
		struct ckpt_zip_entry *e = &out->e[out->n];
		e->flags = le16(c + 8);
		e->method = le16(c + 10);
		e->crc32 = le32(c + 16);
		e->csize = le32(c + 20);
		e->usize = le32(c + 24);
		e->local_off = le32(c + 42);
		if ((rc = zip64_extra(c + CENTRAL_LEN + nl, xl, e, e->usize == 0xffffffffu,
				      e->csize == 0xffffffffu, e->local_off == 0xffffffffu, why)) < 0)
			break;
		if (memchr(c + CENTRAL_LEN, 0, nl)) {
			rc = fail(why, "a member name holding a NUL byte");
			break;
		}
		if (!(e->name = malloc(nl + 1))) {
			rc = -ENOMEM;
			break;
		}
		memcpy(e->name, c + CENTRAL_LEN, nl);
		e->name[nl] = 0;
		e->name_len = nl;
		out->n++;
		if (e->local_off > cd_off || e->csize > cd_off - e->local_off) {
			rc = fail(why, "a member lies outside the archive's data");
			break;
		}
		p += CENTRAL_LEN + nl + xl + cl;
	}
	free(cd);
	return rc;
}

int ckpt_zip_data_offset(ckpt_zip_read_fn rd, void *ctx, const struct ckpt_zip_dir *d,
			 const struct ckpt_zip_entry *e, uint64_t *off, const char **why)
{
	uint8_t h[LOCAL_LEN];
	if (e->local_off > d->size || d->size - e->local_off < LOCAL_LEN)
		return fail(why, "a local header lies outside the archive");
	int rc = read_exact(rd, ctx, e->local_off, LOCAL_LEN, h, why);
	if (rc < 0)
		return rc;
	if (le32(h) != SIG_LOCAL)
		return fail(why, "no local header where the central directory points");
	uint64_t nl = le16(h + 26), xl = le16(h + 28);
	uint64_t start = e->local_off + LOCAL_LEN + nl + xl;
	if (nl != e->name_len || start > d->size || d->size - start < e->csize)
		return fail(why, "a member's data runs past the archive");
	if (nl) {
		char *name = malloc((size_t)nl);
		if (!name)
			return -ENOMEM;
		rc = read_exact(rd, ctx, e->local_off + LOCAL_LEN, (size_t)nl, name, why);
		int same = rc == 0 && memcmp(name, e->name, (size_t)nl) == 0;
		free(name);
		if (rc < 0)
			return rc;
		if (!same)
			return fail(why, "a local header names another member");
	}
	*off = start;
	return 0;
}
