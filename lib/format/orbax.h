/*
 * orbax.h - the Orbax checkpoint layout as names and pure string functions:
 * every file name ckptfs reads or writes, the one rule set for names ckptfs
 * creates, the `_sharding` key encoding, the escaping of pytree keys into
 * file names, and the key-path repr / leaf order of an item's _METADATA.
 *
 * Pure: no I/O, no threads, no global state; every function is safe to call
 * from any thread.  Returned strings are malloc'd and owned by the caller.
 * docs/format.md describes the layout these names belong to.
 */
#ifndef CKPT_ORBAX_H
#define CKPT_ORBAX_H

#include <stddef.h>
#include <stdint.h>

/* ---- file and folder names --------------------------------------------- */

#define CKPT_ORBAX_METADATA "_METADATA" /* item: the pytree (tree_metadata) */
#define CKPT_ORBAX_CKPT_METADATA "_CHECKPOINT_METADATA" /* step: item handlers, timestamps */
#define CKPT_ORBAX_SHARDING "_sharding" /* item: base64url(param) -> sharding JSON text */
#define CKPT_ORBAX_STRINGS "_strings.json" /* item: string leaves */
#define CKPT_ORBAX_ARRAY_METADATAS "array_metadatas" /* item: per-process array metadata folder */
#define CKPT_ORBAX_COMMIT_SUCCESS "commit_success.txt" /* step and item: written last */
#define CKPT_ORBAX_MARKER_FILE "orbax.checkpoint" /* older single-file step marker */
#define CKPT_ORBAX_ROOT_METADATA_DIR "metadata" /* root: the manager's metadata folder, never a step */
#define CKPT_ORBAX_TMP_INFIX                                                                                 \
	".orbax-checkpoint-tmp" /* unfinished step/item: "<name>" CKPT_ORBAX_TMP_INFIX... */
#define CKPT_ORBAX_LOCK_SUFFIX ".__lock" /* TensorStore's lock file of a key being written */
#define CKPT_ORBAX_PARTIAL ".partial_save" /* unfinished (partial save) folder suffix */
#define CKPT_ORBAX_OCDBT_MANIFEST "manifest.ocdbt" /* item: OCDBT root manifest */
#define CKPT_ORBAX_OCDBT_PROCESS_PREFIX "ocdbt.process_" /* item: per-process OCDBT database folders */
#define CKPT_ORBAX_ZARR3_META "zarr.json" /* array folder: zarr v3 metadata */
#define CKPT_ORBAX_ZARR2_META ".zarray" /* array folder: zarr v2 metadata */
#define CKPT_ORBAX_JSON_FILE "metadata" /* JSON item: the file JsonCheckpointHandler writes */
#define CKPT_ORBAX_METRICS_ITEM "metrics" /* the manager's metrics item: JSON in metrics/metrics */
/* Item names ckptfs never creates: Google-internal or reserved by Orbax v1. */
#define CKPT_ORBAX_RESERVED_ITEMS "descriptor", "AUTO"

/* Item handler typestrs recorded in _CHECKPOINT_METADATA.item_handlers. */
#define CKPT_ORBAX_PYTREE_HANDLER                                                                            \
	"orbax.checkpoint._src.handlers.pytree_checkpoint_handler.PyTreeCheckpointHandler"
#define CKPT_ORBAX_JSON_HANDLER "orbax.checkpoint._src.handlers.json_checkpoint_handler.JsonCheckpointHandler"

/* Longest step, item or key name ckptfs creates: a step folder carries the
 * CKPT_ORBAX_TMP_INFIX suffix while pending and must stay under NAME_MAX. */
#define CKPT_ORBAX_NAME_MAX 200
/* Longest param name (the '.'-joined key path, one folder name on disk). */
#define CKPT_ORBAX_PARAM_MAX 255
/* Deepest key path an array may have (also the depth limit when reading). */
#define CKPT_ORBAX_MAX_DEPTH 256

/* ---- name rules -------------------------------------------------------- */

enum ckpt_orbax_name {
	CKPT_NAME_STEP, /* a committed step folder: must be one Orbax's step naming finds */
	CKPT_NAME_ITEM, /* an item folder inside a step */
	CKPT_NAME_KEY, /* one pytree key (a folder or file stem in the tree) */
	CKPT_NAME_PARAM, /* a '.'-joined key path: the array's folder inside its item */
	CKPT_NAME_PENDING_STEP, /* the name of a step being written (renamed at commit) */
};

/*
 * The one rule set for names ckptfs creates.  Every kind: 1..CKPT_ORBAX_NAME_MAX
 * bytes (CKPT_ORBAX_PARAM_MAX for PARAM), no control character (bytes below
 * 0x20 and 0x7f), no leading '.' (so neither "." nor ".." nor hidden names),
 * no '[' (slice syntax in the tree), and neither CKPT_ORBAX_TMP_INFIX nor
 * CKPT_ORBAX_PARTIAL anywhere (those mark unfinished folders).  No '/' except
 * in KEY and PARAM, where '/' makes nested folders: there every
 * '/'-separated part is non-empty, at most 255 bytes and does not start with
 * '.'.  Then per kind:
 *   STEP          ckpt_orbax_step_number() accepts it ("30", "step_30", "0030").
 *   PENDING_STEP  not CKPT_ORBAX_ROOT_METADATA_DIR.
 *   ITEM          not a step-level file: _CHECKPOINT_METADATA, commit_success.txt,
 *                 orbax.checkpoint; not CKPT_ORBAX_RESERVED_ITEMS.
 *   KEY           nothing more.
 *   PARAM         its first '/'-part not an item-level file or folder: _METADATA, _sharding,
 *                 _strings.json, commit_success.txt, array_metadatas,
 *                 manifest.ocdbt, _CHECKPOINT_METADATA, ocdbt.process_*.
 * Returns 1 when `name` is acceptable, else 0 and *why (when why != NULL) a
 * static English reason.  name may be NULL (refused).
 */
int ckpt_orbax_name_ok(enum ckpt_orbax_name kind, const char *name, const char **why);

/* Key types of a key path, the numbers _METADATA's key_metadata uses. */
enum ckpt_orbax_key_type {
	CKPT_KEY_SEQ = 1, /* list/tuple index: decimal, no leading zero, < 10^19 */
	CKPT_KEY_DICT = 2, /* dict key: any string the KEY rule accepts */
};

/*
 * A whole key path an array is created under: depth 1..CKPT_ORBAX_MAX_DEPTH,
 * every key a KEY name of a known type (SEQ keys decimal), and the '.'-joined
 * param name a PARAM name.  1 ok, 0 refused with *why as above.
 */
int ckpt_orbax_keypath_ok(const char *const *keys, const int *types, int depth, const char **why);

/*
 * An unfinished folder Orbax leaves while saving: the name contains
 * CKPT_ORBAX_TMP_INFIX or ends with CKPT_ORBAX_PARTIAL.  Readers skip these.
 */
int ckpt_orbax_is_unfinished(const char *name);

/*
 * The folder Orbax makes for step S while it saves it (ATOMIC_RENAME):
 * "S" CKPT_ORBAX_TMP_INFIX, S a step name Orbax finds.  Returns 1 and S in
 * step (cap bytes), else 0.
 */
int ckpt_orbax_tmp_step(const char *name, char *step, size_t cap);

/*
 * The step number of a step folder name, the way Orbax's standard step naming
 * finds steps: "<digits>" or "<prefix>_<digits>" (non-empty prefix), the
 * digits possibly zero-padded (fixed-length naming) and < 2^64.  Returns 1 and
 * sets *step (when step != NULL), or 0 when the name is no step name.
 */
int ckpt_orbax_step_number(const char *name, uint64_t *step);

/* ---- _sharding keys ---------------------------------------------------- */

/*
 * The key of an array in an item's _sharding file: URL-safe base64
 * (alphabet A-Z a-z 0-9 - _) with '=' padding of the param name (the
 * '.'-joined key path).  malloc'd; NULL on out of memory.
 */
char *ckpt_orbax_sharding_key(const char *param);

/* The exact inverse: the param name, malloc'd; NULL when `key` is not the
 * canonical encoding of a string without NUL bytes (or out of memory). */
char *ckpt_orbax_sharding_key_decode(const char *key);

/* ---- pytree keys as file names ----------------------------------------- */

/*
 * One pytree key as one file-name component of the tree: '%' and '/' become
 * "%25" and "%2F"; the key "" becomes "%", "." becomes "%2E" and ".." becomes
 * "%2E%2E"; every other byte is kept.  Writes a NUL-terminated name into
 * buf[cap] and returns its length, or -ENAMETOOLONG when it does not fit
 * (buf then holds a truncated, still terminated, name when cap > 0).
 */
int ckpt_orbax_key_escape(const char *key, char *buf, size_t cap);

/*
 * The exact inverse of ckpt_orbax_key_escape: returns the key's length with
 * the key in buf[cap], -EINVAL when `name` is not a name the escape produces
 * (a stray or unknown %-sequence, a '/'), -ENAMETOOLONG when it does not fit.
 */
int ckpt_orbax_key_unescape(const char *name, char *buf, size_t cap);

/* ---- key paths in _METADATA -------------------------------------------- */

/*
 * The tree_metadata key of a key path: Python's str() of the tuple of keys,
 * e.g. "('params', 'dense', 'kernel')", "('a',)"; every key is quoted as a
 * Python str (single quotes unless the key has ' and no ", backslash escapes
 * for the quote, '\\', \n \r \t and other control bytes as \xNN).  malloc'd;
 * NULL when depth < 1 or out of memory.
 */
char *ckpt_orbax_keypath_repr(const char *const *keys, int depth);

/*
 * JAX's leaf order (tree flattening): key by key, two SEQ keys by numeric
 * value, anything else by byte order (dict keys are sorted); a path that is a
 * prefix of the other comes first.  <0, 0, >0 like strcmp.
 */
int ckpt_orbax_keypath_cmp(const char *const *ka, const int *ta, int da, const char *const *kb, const int *tb,
			   int db);

#endif
