/*
 * zip.h - the directory of a ZIP archive (an .npz, a torch.save file):
 * the end-of-central-directory record (ZIP64 too), the central directory's
 * entries, and where each member's data starts (after its local header).
 * Pure: every byte comes through the caller's read callback, so the same
 * code reads a local file, an object-store object or a fuzzer's buffer;
 * members are never read, only located, so a stored member can be served
 * as a byte range of the archive.
 *
 * Bounds: the central directory is read whole into memory only up to
 * CKPT_ZIP_MAX_CD bytes and CKPT_ZIP_MAX_ENTRIES entries; every offset and
 * size is checked against the archive's size before it is used.
 */
#ifndef CKPT_ZIP_H
#define CKPT_ZIP_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define CKPT_ZIP_MAX_CD (256u << 20)
#define CKPT_ZIP_MAX_ENTRIES (1u << 22)

/* Read len bytes at off into dst: returns the bytes read (short only at
 * the end), or a negative errno. */
typedef ssize_t (*ckpt_zip_read_fn)(void *ctx, uint64_t off, size_t len, void *dst);

struct ckpt_zip_entry {
	char *name; /* NUL-terminated (a name holding a NUL is refused) */
	size_t name_len;
	uint16_t flags; /* general purpose bits (bit 0: encrypted) */
	uint16_t method; /* 0 stored, 8 deflated, else unsupported */
	uint32_t crc32;
	uint64_t csize; /* bytes stored */
	uint64_t usize; /* bytes once inflated */
	uint64_t local_off; /* offset of the local header */
};

struct ckpt_zip_dir {
	struct ckpt_zip_entry *e;
	size_t n;
	uint64_t size; /* the archive's size */
	int zip64; /* the directory is located through a ZIP64 record */
};

/* 1 when the first bytes of a file (n of them) start like a ZIP archive
 * (a local header, or an empty archive's end record). */
int ckpt_zip_magic(const uint8_t *head, size_t n);

/* Read the directory of the archive of `size` bytes into *out (free with
 * ckpt_zip_dir_free, also after a failure).  -EINVAL (and *why, static
 * English) for what is not a well-formed ZIP archive, a multi-disk one,
 * or one beyond the bounds; -ENOMEM; the callback's errors. */
int ckpt_zip_dir_read(ckpt_zip_read_fn rd, void *ctx, uint64_t size, struct ckpt_zip_dir *out,
		      const char **why);
void ckpt_zip_dir_free(struct ckpt_zip_dir *d);

/* Where entry e's stored bytes start: its local header read and checked
 * (signature, the name), *off = past the header; e->csize bytes from there
 * lie inside the archive.  -EINVAL (*why) when not. */
int ckpt_zip_data_offset(ckpt_zip_read_fn rd, void *ctx, const struct ckpt_zip_dir *d,
			 const struct ckpt_zip_entry *e, uint64_t *off, const char **why);

#endif
