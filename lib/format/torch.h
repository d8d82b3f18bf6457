/*
 * torch.h - what PyTorch checkpoints say, from their pickles (pickle.h):
 * the tensors of a torch.save archive's data.pkl, and the tensors, chunk
 * boxes and storage of a distributed checkpoint's .metadata.  Pure (the
 * pickle is already parsed; no I/O, no threads); the input is untrusted and
 * every count, rank and size is checked.
 */
#ifndef CKPT_TORCH_H
#define CKPT_TORCH_H

#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "dtype.h"
#include "pickle.h"

#define CKPT_TORCH_MAX_PATH 64 /* key path components of one tensor */
#define CKPT_TORCH_MAX_TENSORS (1u << 20)

/* One tensor of a torch.save archive: a view of the storage in member
 * "<archive>/data/<storage_key>". */
struct ckpt_torch_tensor {
	char *name; /* the key path joined with '.' */
	char **path; /* key path: nested dict keys, each split on '.' */
	int depth;
	ckpt_dtype dtype;
	int rank;
	uint64_t shape[CKPT_MAX_RANK];
	int64_t stride[CKPT_MAX_RANK]; /* in elements */
	uint64_t offset; /* storage offset, in elements */
	char *storage_key;
	uint64_t storage_numel; /* elements the persistent id says the storage holds */
};

struct ckpt_torch_state {
	struct ckpt_torch_tensor *t;
	size_t n;
	size_t skipped; /* leaves that are not tensors (numbers, strings, ...), left out */
};

/* The tensors of data.pkl's object tree (a tensor, or nested dicts, lists
 * and tuples of them; list items are named by their index).  -EINVAL
 * (logged, naming `what` and the key) for a tensor record that is malformed
 * or of a storage type without a ckptfs dtype; -ENOMEM. */
int ckpt_torch_state_parse(const ckpt_pk *root, const char *what, struct ckpt_torch_state *out);
void ckpt_torch_state_free(struct ckpt_torch_state *s);

/* The dtype of a storage class name ("torch.BFloat16Storage"), or INVALID. */
ckpt_dtype ckpt_torch_storage_dtype(const char *global);
/* The dtype of a torch dtype global ("torch.bfloat16"), or INVALID. */
ckpt_dtype ckpt_torch_dtype(const char *global);

/* How a tensor's elements lie in its storage: when they are a dense block
 * in some dimension order, *order gets that order (order[0] the slowest
 * stored dimension; the identity for C order) and *byte_off / *byte_len the
 * block's bytes in the storage.  Size-1 dimensions may have any stride.
 * -EINVAL when no dimension order makes the elements dense (a strided or
 * overlapping view), or the block lies outside storage_numel elements. */
int ckpt_torch_dense(const struct ckpt_torch_tensor *t, int *order, uint64_t *byte_off, uint64_t *byte_len);

/* A tensor name as a key path: split on '.' (how the safetensors view
 * joins the path back), unless a split would make an empty component, then
 * the whole name is one component.  The components point into buf (cap
 * bytes).  Returns the depth, or -EINVAL for a name that cannot be a path
 * ("", ".", "..", a '/', too deep, too long). */
int ckpt_torch_key_split(const char *name, char *buf, size_t cap, const char **comps, int max);

/* ---- distributed checkpoints (.metadata) ---------------------------------- */

enum ckpt_dcp_transform { CKPT_DCP_RAW = 0, CKPT_DCP_ZSTD = 1 };

/* One saved chunk of a tensor: its global element box and where its item
 * (a torch.save archive of the chunk, maybe zstd-compressed) lies. */
struct ckpt_dcp_chunk {
	uint64_t offsets[CKPT_MAX_RANK], sizes[CKPT_MAX_RANK];
	char *file; /* relative_path */
	uint64_t offset, length; /* the item's bytes in that file */
	enum ckpt_dcp_transform transform;
};

struct ckpt_dcp_entry {
	char *fqn;
	int is_bytes; /* a BytesStorageMetadata item (a pickled object), not a tensor */
	ckpt_dtype dtype;
	int rank;
	uint64_t size[CKPT_MAX_RANK];
	struct ckpt_dcp_chunk *chunks;
	size_t nchunks;
};

struct ckpt_dcp_meta {
	struct ckpt_dcp_entry *e;
	size_t n;
	char *version; /* Metadata.version, NULL when absent */
};

/* The entries of a .metadata object tree.  Tensors whose every chunk has
 * storage info get their chunks in storage order; -EINVAL (logged) for a
 * malformed tree, an unknown dtype or transform, a chunk box outside the
 * tensor, a tensor chunk without storage; -ENOMEM. */
int ckpt_dcp_meta_parse(const ckpt_pk *root, const char *what, struct ckpt_dcp_meta *out);
void ckpt_dcp_meta_free(struct ckpt_dcp_meta *m);

/* The chunk boxes of e as a regular grid: every chunk has size grid[d]
 * along dimension d (a zarr chunk grid stores whole chunks, so a shorter
 * last chunk does not fit), the boxes tile the whole tensor exactly once,
 * and index[i] gets chunk i's row-major position in the grid.  -EINVAL when
 * the boxes form no such grid (gaps, overlaps, uneven boxes). */
int ckpt_dcp_grid(const struct ckpt_dcp_entry *e, uint64_t *grid, size_t *index);

/* The coarsest regular grid in which every chunk box of e is a whole number
 * of cells: along dimension d, cell[d] is the greatest common divisor of the
 * tensor's size and every box's offset and size (so even sharding gives the
 * boxes themselves, and a shorter last shard gives smaller cells).  The
 * boxes must tile the tensor exactly once.  -EINVAL when they do not (gaps,
 * overlaps) or the grid would have more than CKPT_DCP_MAX_CELLS cells. */
#define CKPT_DCP_MAX_CELLS (1u << 22)
int ckpt_dcp_cells(const struct ckpt_dcp_entry *e, uint64_t *cell);

#endif
