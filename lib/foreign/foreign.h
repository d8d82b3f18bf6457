/*
 * foreign.h - checkpoint formats that are not Orbax (npz archives, Flax and
 * old Orbax msgpack trees, T5X steps, PyTorch files), shown through the
 * same tree as Orbax items.  The layer lib/foreign/ (CMakeLists.txt): it
 * links store, format and base, and never sees the node model (lib/tree/);
 * the tree reaches a translator only through the table (ckpt_foreign_probe
 * and the table entry's open).
 *
 * Files, from the bottom up (each calls only the ones above it in this
 * list; scripts/check_layers checks it):
 *   foreign_vitem.c    the virtual-item builder (ckpt_vitem_*): stores only
 *   foreign_npz.c      .npz archives (translator)
 *   foreign_msgpack.c  Flax / old Orbax / T5X msgpack checkpoints (translator)
 *   foreign_torch.c    torch.save, DCP, safetensors files and folders
 *                      (translator)
 *   foreign.c          the translator table: which format a SOURCE or folder is
 *
 * The mechanism: a translator reads a foreign file's structure (never its
 * array bytes) and builds a VIRTUAL ORBAX ITEM, an in-memory store
 * (store.h ckpt_store_mem_*) holding, per array, a synthesized zarr v2
 * `.zarray` (literal bytes) and its chunk keys as byte ranges of the
 * original file (ckpt_store_mem_put_range), or the array's zarr folder as
 * it is (ckpt_store_mem_put_folder), plus a synthesized `_METADATA` naming
 * every leaf with its key path.  layout.c builds the item's tree from that
 * store exactly as for an Orbax item, so NAME.npy files, slices, shard
 * listings, the safetensors view, `ckptfs info`, `ckptfs verify` and the
 * cache work unchanged, and array bytes are read lazily from the original
 * file through the source's store (folder or object store).
 *
 * A translator is one entry of the table in foreign.c: a name, a probe
 * ("is this file or folder yours?", decided by content: magic bytes,
 * structure; a file name is only a hint) and an open (build the virtual
 * item).  Layout detection (lib/tree/layout.c) asks the table wherever it
 * finds a SOURCE, a step or an item it does not know as Orbax.
 *
 * Writing a translator: a file lib/foreign/foreign_<name>.c defining a const
 * struct ckpt_foreign_fmt (its bytes parsed by a pure lib/format/<name>.c),
 * declared extern and appended to formats[] in foreign.c (probes are asked
 * in that order; the first that claims wins), and named in the file map
 * above, between foreign_vitem.c and foreign.c.  Its open: ckpt_vitem_new,
 * one ckpt_vitem_add_* per leaf (arrays, strings, empty nodes),
 * ckpt_vitem_finish for the store.
 * Errors are negative errno, logged once by the translator with the file
 * and the reason.
 */
#ifndef CKPT_FOREIGN_H
#define CKPT_FOREIGN_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "dtype.h"
#include "store.h"

/* ---- the translator table ------------------------------------------------ */

#define CKPT_FOREIGN_HEAD 512 /* bytes of a file given to every probe */

struct ckpt_foreign_fmt {
	const char *name; /* "npz", "flax-msgpack", ...: in log lines */
	const char *what; /* what it looks for, in words, for the not-a-checkpoint message */
	/* 1 when `key` of src (a file when st->is_dir is 0, then head holds its
	 * first nhead bytes, nhead = min(size, CKPT_FOREIGN_HEAD); else a folder,
	 * head NULL) is this format's; 0 when not.  Cheap: a folder probe may
	 * stat and read the head of a few files, no more. */
	int (*probe)(ckpt_store *src, const char *key, const struct ckpt_store_stat *st, const uint8_t *head,
		     size_t nhead);
	/* The virtual item of `key` (*item: a new store reference).  -errno,
	 * logged (the file and why). */
	int (*open)(ckpt_store *src, const char *key, const struct ckpt_store_stat *st, ckpt_store **item);
	/* Folder formats: the file that makes a folder this format's
	 * ("checkpoint"), written last by its tool; when open fails, the folder
	 * shows one entry of this name that answers EIO; on an object-store
	 * root a step folder this format claims counts as committed only when
	 * this is set.  NULL for file formats (the entry is named after the
	 * file; a step file counts as committed) and for folders recognized
	 * without one file. */
	const char *main_file;
};

/* The translator that claims `key` of src (a file or folder; st may be
 * NULL: stat'ed here), else NULL. */
const struct ckpt_foreign_fmt *ckpt_foreign_probe(ckpt_store *src, const char *key,
						  const struct ckpt_store_stat *st);

/* "what" of every translator, joined with ", " (static). */
const char *ckpt_foreign_what(void);

/* ---- building a virtual item --------------------------------------------- */

struct ckpt_vitem;

/* A new empty item; `name` (copied) names it in log lines and is its
 * store's root ("npz:/data/x.npz"). -ENOMEM. */
int ckpt_vitem_new(const char *name, struct ckpt_vitem **out);
void ckpt_vitem_free(struct ckpt_vitem *vi);

enum ckpt_vcodec {
	CKPT_VCODEC_RAW = 0, /* the element bytes as they are */
	CKPT_VCODEC_DEFLATE, /* one raw deflate stream (ZIP method 8) of them */
};

/* An array whose element bytes are `length` bytes of file base_key of
 * store base from `offset` on, in C order (or Fortran order), little
 * endian (or big). */
struct ckpt_varray {
	ckpt_dtype dtype;
	int rank;
	uint64_t shape[CKPT_MAX_RANK];
	int fortran_order;
	int big_endian;
	enum ckpt_vcodec codec;
	uint32_t skip; /* DEFLATE: inflated bytes before the elements (an .npy header), <= 2^20 */
	/* The ZIP member's CRC-32, when has_crc32.  DEFLATE: over all inflated
	 * bytes, checked at every decode.  RAW (contiguous, npieces 0): over
	 * the member's bytes before `offset` (head_crc32 is theirs: an .npy
	 * header) and then the array's; checked once every chunk was decoded. */
	int has_crc32;
	uint32_t crc32, head_crc32;
	ckpt_store *base; /* borrowed; the item takes its own reference */
	const char *base_key;
	uint64_t offset, length;
	/* RAW only: when npieces > 0 the bytes are these (offset, length) pairs
	 * of base_key one after another (offset and length unused; borrowed) */
	const uint64_t *pieces;
	size_t npieces;
};

/*
 * Leaves.  `path` is the key path (depth >= 1 components, each a key as
 * the format spells it; a '/' inside a key stays inside that key: the tree
 * shows it escaped, as for Orbax).  Every leaf's path must be unique; a
 * second leaf at a path is left out by the tree (logged there).
 *
 * add_array: raw arrays are cut into chunks of about 8 MiB along the
 * slowest stored dimension (each chunk a range of the file); a deflated
 * array is one chunk.  -EINVAL when length is not what dtype and shape
 * need (raw) or the shape is absurd; -ENOMEM.
 * add_bytes: a small array given as bytes (C order, little endian), copied.
 * add_zarr: an array stored as a zarr v2 or v3 folder `dir` of base (its
 *   .zarray / zarr.json and chunks used as they are).
 * add_string: a text leaf (NAME.txt holding the string).
 * add_empty: an empty dict or list (an empty folder).
 */
int ckpt_vitem_add_array(struct ckpt_vitem *vi, const char *const *path, int depth,
			 const struct ckpt_varray *a);
int ckpt_vitem_add_bytes(struct ckpt_vitem *vi, const char *const *path, int depth, ckpt_dtype dtype,
			 int rank, const uint64_t *shape, const void *data, size_t len);
int ckpt_vitem_add_zarr(struct ckpt_vitem *vi, const char *const *path, int depth, ckpt_store *base,
			const char *dir);
int ckpt_vitem_add_string(struct ckpt_vitem *vi, const char *const *path, int depth, const char *value);
int ckpt_vitem_add_empty(struct ckpt_vitem *vi, const char *const *path, int depth);
/*
 * Arrays put cell by cell, for layouts add_array does not cut itself: a
 * chunk grid the translator lays out (a distributed checkpoint's chunk
 * boxes, cut into equal cells), or one block whose elements lie in a
 * permuted dimension order.  ckpt_vitem_cell_* put the cell at grid
 * coordinates `coord` (rank of them) of the array that the next leaf added
 * will be; ckpt_vitem_add_grid then adds that leaf with the array's
 * metadata.  Cells put before a leaf is added otherwise (add_unreadable
 * after a cell failed) stay in the store, named by no leaf.
 *
 * cell_bytes: the cell's bytes (copied; C order within the cell, or the
 * grid's order).  cell_range: `length` bytes of file base_key of base from
 * `offset` on.  cell_pieces: npieces (offset, length) pairs of base_key one
 * after another.  -EINVAL, -ENOMEM.
 * add_grid: a cell never put reads as the fill value (as an add_zarr
 * array's missing chunk).  -EINVAL for a bad dtype, rank or order; -ENOMEM.
 */
struct ckpt_vgrid {
	ckpt_dtype dtype;
	int rank;
	uint64_t shape[CKPT_MAX_RANK];
	uint64_t cell[CKPT_MAX_RANK]; /* a cell's shape (a dimension of 0 counts as 1) */
	int big_endian;
	/* NULL: each cell's elements in C order (a zarr v2 array); else their
	 * dimension order, order[0] slowest, a permutation of 0..rank-1 (a zarr
	 * v3 array with a transpose codec) */
	const int *order;
};
int ckpt_vitem_cell_bytes(struct ckpt_vitem *vi, int rank, const uint64_t *coord, const void *data,
			  size_t len);
int ckpt_vitem_cell_range(struct ckpt_vitem *vi, int rank, const uint64_t *coord, ckpt_store *base,
			  const char *base_key, uint64_t offset, uint64_t length);
int ckpt_vitem_cell_pieces(struct ckpt_vitem *vi, int rank, const uint64_t *coord, ckpt_store *base,
			   const char *base_key, const uint64_t *pieces, size_t npieces);
int ckpt_vitem_add_grid(struct ckpt_vitem *vi, const char *const *path, int depth,
			const struct ckpt_vgrid *g);

/* An array the translator found but cannot serve (it logged why): listed
 * as NAME.npy, reads answer EIO, so that a copy of the tree fails instead
 * of leaving it out silently. */
int ckpt_vitem_add_unreadable(struct ckpt_vitem *vi, const char *const *path, int depth);

/* The most leaves of one item (its synthesized _METADATA stays well within
 * what the tree reads); one more is -EFBIG (logged), which fails the item. */
#define CKPT_VITEM_MAX_LEAVES (1u << 17)

/* Leaves added so far. */
size_t ckpt_vitem_leaves(const struct ckpt_vitem *vi);

/* Write the item's _METADATA (and _strings.json) and hand its store out
 * (*out: one reference).  Frees vi in every case.  -ENOMEM. */
int ckpt_vitem_finish(struct ckpt_vitem *vi, ckpt_store **out);

/* The store key under which a virtual item keeps the array of leaf `i`
 * ("a/<i>", i zero-padded); the `ckptfs_key` member of that leaf's value_metadata in the
 * synthesized _METADATA names it, and layout.c opens the array there. */
#define CKPT_VITEM_KEY_MEMBER "ckptfs_key"

#endif
