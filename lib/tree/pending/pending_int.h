/*
 * pending_int.h - what the files of lib/tree/pending/ share: the pending
 * step (struct pstep) and its states, the pending directory and file node
 * structs, and the small inline helpers every file of the folder uses.
 * Not a public header; tree_int.h holds the folder's place in the file map.
 *
 * The write protocol on the namespace, one job per file (bottom up: each
 * calls only the ones above it):
 *   pfile.c        shared helpers: paths in a step's tmp folder, key names
 *                  of pending folders and files; the pending file's kind
 *                  and header-phase tables; N_PDIR's and N_PFILE's node ops
 *                  (reads dispatch through the file's kind)
 *   raw.c          raw copies (PF_RAW): stored copies and Orbax saves
 *                  (files written as they are into the tmp folder); the
 *                  copy-tool watch
 *   safetensors.c  importing safetensors files (PF_ST)
 *   file.c         .npy files (PF_ARRAY, PF_SLICE: header, declaration,
 *                  data) and buffered files (PF_JSON, PF_META, PF_MARKER,
 *                  PF_INDEX); ckpt_view_write and ckpt_view_truncate
 *   step.c         the life of a pending step (its state table): begin,
 *                  completeness checks, commit, settle, abort; the
 *                  folders left over in SOURCE, adopted at view open
 *   namespace.c    the namespace calls on pending steps: mkdir, create (the
 *                  classifier: what a new file is), rename, unlink, rmdir,
 *                  flush, setxattr
 *
 * Locks (the whole order is in tree_int.h): ns_lock -> ps->io_lock
 * (writes, reads and setxattr of the step shared; commit/abort exclusive)
 * -> pf->mu (header state of one file).  ckpt_warray_write runs with only
 * io_lock held (shared), so writers of different files never wait for each
 * other here.  A commit holds io_lock exclusive but NOT ns_lock: the step
 * is marked committing under ns_lock, committed, then its node is swapped
 * for the committed step's under ns_lock again.
 * A function named *_locked is called with the lock its comment names and
 * returns with it still held (ckpt_assert_held checks it in debug and
 * sanitizer builds); no function releases a lock its caller took, but the
 * commit's, which drop ns_lock and take it again (ckpt_ps_commit,
 * ckpt_ps_settle: said at each).  The kinds' ops take pf->mu themselves:
 * what they need is copied under it, the writer and the tmp folder are
 * called without it.
 */
#ifndef CKPT_PENDING_INT_H
#define CKPT_PENDING_INT_H

#include <stdatomic.h>
#include <string.h>
#include <sys/types.h>

#include <cjson/cJSON.h>

#include "npy.h"
#include "safetensors.h"
#include "upload.h"
#include "writer.h"
#include "tree_int.h"

/* The states of a pending step: the table of edges is in step.c, the only
 * file that changes them (ps_set); the others read them (ps_dead, frozen). */
enum ps_state {
	PS_OPEN,
	PS_COMMITTING,
	PS_SEALED,
	PS_COMMITTED,
	PS_LOST,
	PS_ABORTED,
	PS_UNSETTLED,
	PS_NSTATES
};

/* A pending step: the writer's step plus the lock that keeps commit apart
 * from writes.  Owned by its N_PSTEP node. */
struct pstep {
	/* NULL once sealed or aborted: the writer's state (chunk buffers,
	 * threads, declarations) is freed right away, under io_lock exclusive;
	 * every later call on the step's orphaned nodes sees it dead first. */
	struct ckpt_step *step;
	pthread_rwlock_t io_lock;
	_Atomic int state; /* enum ps_state */
	const char *final; /* while committing: the name it commits to (under ns_lock) */
	/* A copied commit_success.txt arrived (cp, tar, rsync of a step): the
	 * step commits once it is complete (step_check), from the flush or
	 * rename that completes it.  Under ns_lock exclusive. */
	int commit_wanted;
	/* The processes that made or wrote its files (pidfds): a stored copy
	 * commits once they have all exited (the copy tool is done).  wp_mu. */
	pthread_mutex_t wp_mu;
	struct {
		pid_t pid;
		int fd;
	} wp[16];
	int nwp;
	atomic_uint_least64_t last_op_ns; /* monotonic time of the last change by a writer */
	/* Object-store root: finished shard files are uploaded while the step
	 * is written (the step's sink); drained at commit.  Freed after the
	 * step (whose compression threads call it). */
	ckpt_bg_upload *bg;
	unsigned up_threads; /* upload workers (bg and commit), counted in the write budget */
	/* UNSETTLED: the name it was sent as (its staged copy and key prefix),
	 * and whether a settle_step runs (both under ns_lock) */
	char *unsettled;
	int settling;
	/* An Orbax save (mkdir of "S.orbax-checkpoint-tmp"): every folder and
	 * file is stored as written in the tmp folder, any name, any level; the
	 * rename to S commits it (see "Orbax saves" below).  Set before
	 * publication, or by aw_convert under io_lock exclusive. */
	atomic_int as_written;
	/* Orbax's COMMIT_FILE mode: a step made as "S" (not Orbax's tmp name)
	 * that became stored as written (aw_convert); the close of its
	 * commit_success.txt, written with bytes, commits it.  ns_lock. */
	int commit_file;
	/* a <step>.orbax-checkpoint-tmp folder found at open, left by an
	 * earlier mount or Orbax run (step.c); set before publication */
	int leftover;
	/* STEP/.views/NAME/ was made: the folder copied there becomes the
	 * step's arrays at the commit (views_import.c).  ns_lock. */
	int views_import;
};

/* N_PSTEP and N_PDIR */
struct pdir_node {
	struct dir_node d;
	struct pstep *ps; /* owned by the N_PSTEP node, borrowed by the others */
	/* an item holding a stored copy (files of another step's item copied as
	 * they are: an OCDBT database, zarr folders); set once, ns_lock */
	int stored;
	int is_stdir; /* X.safetensors.d/: shards of one safetensors import (set before publication) */
	int is_views; /* STEP/.views/ of a view import (views_import.c; set before publication) */
};

/*
 * What a pending file is: its kind, fixed when it is made (new_pfile's
 * classifier, namespace.c) except for the transitions of the table in
 * pfile.c (ckpt_pf_set_kind: kind and ops change together), and the ops
 * table of the kind (struct pfile_ops), defined by the file of its job.
 */
enum pfile_kind {
	PF_ARRAY, /* NAME.npy: declares an array from its .npy header, then its data (file.c) */
	PF_SLICE, /* NAME[slice].npy: a region of a declared NAME.npy's array (file.c) */
	PF_JSON, /* the JSON file of a JSON item: hdr[0..size) is its content (file.c) */
	/* A copied Orbax metadata file (the step's _CHECKPOINT_METADATA, an
	 * item's _METADATA, _sharding or commit_success.txt): hdr[0..size) is
	 * its content; it describes what the copy holds (step_check) and
	 * carries the shardings and item handlers into the commit, which writes
	 * the files anew (file.c). */
	PF_META,
	PF_MARKER, /* the step's commit_success.txt: hdr[0..size) is its content (file.c) */
	PF_INDEX, /* model.safetensors.index.json of an X.safetensors.d/ (buffered; file.c) */
	PF_ST, /* X.safetensors being imported (safetensors.c) */
	/* a file of a stored copy or of an Orbax save: its bytes live in the
	 * tmp folder, written and read there; size is its size (raw.c) */
	PF_RAW,
	PF_NKINDS
};

/*
 * The header phase of the kinds that begin with a header (PF_ARRAY,
 * PF_SLICE: the .npy header; PF_ST: the safetensors length and JSON);
 * every change through ckpt_pf_set_phase() (pfile.c), which asserts the
 * edge; pf->mu held:
 *
 *   from     to       by
 *   HEADER   DATA     the header parsed and declared (collect_header,
 *                     st_collect); a multi-host adoption (adopt_decl)
 *   DATA     HEADER   O_TRUNC to 0: a writer starting over (the same
 *                     header must come again)
 *
 * The other kinds have no header: PH_NONE, for good.
 *   PH_HEADER: data_off 0; hdr[0..have) holds every byte written so far.
 *   PH_DATA:   data_off is the header's length (have == data_off once the
 *              bytes past it went to the writer), hdr
 *              holds the header; the array (arr; st_arr for PF_ST) is declared.
 */
enum pf_phase { PH_NONE, PH_HEADER, PH_DATA, PH_NPHASES };

struct pfile_node;

/* What a kind does.  write, read and truncate run with the step's io_lock
 * held shared and the gate passed (the step not dead; for write and
 * truncate the file not orphaned); each takes pf->mu itself. */
struct pfile_ops {
	enum pfile_kind kind;
	const char *name; /* for logs and asserts */
	/* bytes [off, off + len); append: O_APPEND (off is where the kind says) */
	ssize_t (*write)(ckpt_view *v, struct pfile_node *f, uint64_t off, const uint8_t *data, size_t len,
			 int append);
	ssize_t (*read)(ckpt_view *v, struct pfile_node *f, uint64_t off, size_t len, uint8_t *dst);
	int (*truncate)(ckpt_view *v, struct pfile_node *f, uint64_t size);
	/* step_check: 0 when the file lets its step commit, else -errno and
	 * why (into why[cap]); copy: judged for a copy (unfinished files wait).
	 * ns_lock held. */
	int (*check)(struct pfile_node *f, int copy, char *why, size_t cap);
	/* unlink: what the file put into the step goes (its arrays, its bytes
	 * in the tmp folder, a JSON item's content); 0 or -errno (the file
	 * stays).  ns_lock and io_lock exclusive held. */
	int (*destroy)(ckpt_view *v, struct pfile_node *f);
};

struct pfile {
	pthread_mutex_t mu;
	/* Its kind and the kind's ops: set together (ckpt_pf_node_new,
	 * ckpt_pf_set_kind), changed only with io_lock exclusive and pf->mu
	 * held, so a call holding either sees one kind throughout. */
	enum pfile_kind kind;
	const struct pfile_ops *ops;
	enum pf_phase phase; /* pf->mu (the table above) */
	char *rel; /* PF_RAW: its path in the tmp folder; NULL in an Orbax save: the path follows renames (raw_path) */
	int64_t raw_mtime_ns; /* a raw file's mtime on disk after its last change (0: unknown) */
	/* PF_ST: hdr collects the 8-byte length and the JSON header until they
	 * parse (data_off = 8 + N from then on); each of its nst tensors is
	 * then an array of the step, st_arr[i], under the key path of X plus
	 * the tensor's name split on '.'.  Fixed once parsed (an O_TRUNC keeps
	 * them: the same header must come again). */
	ckpt_st_entry *st;
	size_t nst;
	ckpt_warray **st_arr;
	uint64_t st_data; /* bytes of the data buffer */
	int dirty; /* written since its last flush: a writer is still at it */
	/* marker: the explicit commit it asked for failed with this (then it
	 * left the directory); a later close of another descriptor of the
	 * same open (touch dup2()s its file) reports it again.  ns_lock. */
	int commit_err;
	uint64_t hwm; /* end of the furthest byte written: where O_APPEND writes go */
	/* A copy tool's temporary name (rsync's .NAME.XXXXXX): the name the
	 * file is written as and will be renamed to; NULL for a final name. */
	char *final;
	ckpt_dtype hint; /* named by user.ckpt.dtype before the header, else INVALID */
	struct pfile_node *decl; /* PF_SLICE: the NAME.npy node that declared the array */
	/* NAME.npy: slice files made for its array.  Once there is one, every
	 * write of the array must keep the bytes already written (several
	 * writers, one value: CKPT_WRITE_SAME); a lone file may rewrite its own. */
	atomic_int nslices;
	ckpt_warray *arr; /* NULL until the header has been parsed */
	ckpt_region region; /* whole array or the slice */
	uint8_t *
		hdr; /* header bytes (all bytes written before the header parsed); a buffered file's content */
	size_t have, cap;
	size_t data_off; /* header length once parsed; 0 again after O_TRUNC (arr stays) */
	uint64_t size; /* apparent file size */
};

/* N_PFILE */
struct pfile_node {
	struct node n;
	struct pstep *ps;
	struct pfile pf;
};

static inline struct pdir_node *to_pdir(struct node *n)
{
	assert(n->kind == N_PSTEP || n->kind == N_PDIR);
	return container_of(to_dir(n), struct pdir_node, d);
}

static inline struct pfile_node *to_pfile(struct node *n)
{
	assert(n->kind == N_PFILE);
	return container_of(n, struct pfile_node, n);
}

static inline struct node *parent_of(ckpt_view *v, struct node *n)
{
	return ckpt_node_at(v, n->parent);
}

/* Dead: no writes, reads ESTALE (SEALED, COMMITTED, LOST, ABORTED). */
static inline int ps_dead(struct pstep *ps)
{
	int st = atomic_load(&ps->state);
	return st != PS_OPEN && st != PS_COMMITTING;
}

/* No namespace change on the step: committed, aborted or committing. */
static inline int frozen(struct pstep *ps)
{
	return atomic_load(&ps->state) != PS_OPEN;
}

#define ST_SUFFIX ".safetensors" /* an imported safetensors file */
#define ST_DIR_SUFFIX ".safetensors.d" /* the shards of one */

static inline int has_suffix(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);
	return a > b && !strcmp(s + a - b, suf);
}

/* Files whose bytes the view keeps itself (a JSON item's file, copied
 * metadata, the commit marker, a safetensors index) rather than handing
 * them to the writer as array data. */
static inline int pf_buffered(const struct pfile *pf)
{
	return pf->kind == PF_JSON || pf->kind == PF_META || pf->kind == PF_MARKER || pf->kind == PF_INDEX;
}

/* ---- pfile.c ---------------------------------------------------------------- */

extern const struct node_ops ckpt_pdir_ops;
/* getattr of pending directories (N_PSTEP, N_PDIR) */
void ckpt_pdir_attr(ckpt_view *v, struct node *n, ckpt_attr *a);
/* Refuse a change of committed data (or of a read-only mount), logged: -EROFS. */
int ckpt_pf_refuse(const char *name, const char *what);
/* n is commit_success.txt of a committed step of a writable root:
 * creating it again is a commit that already happened (a no-op). */
int ckpt_pf_is_commit_marker(ckpt_view *v, struct node *n);
/* The name of the step item `it` is in ("?" when none). */
const char *ckpt_pf_step_name_of(ckpt_view *v, struct node *it);
/* The item directory (a kid of the step) that n is in, or NULL. */
struct node *ckpt_pf_item_of(ckpt_view *v, struct node *n);
/* The pending step a pending node belongs to (ns_lock held), or NULL. */
struct node *ckpt_pf_step_of(ckpt_view *v, struct node *n);
/* "<item>/<dirs>/<name>" of `name` in pending directory dir. */
int ckpt_pf_rel_of(ckpt_view *v, struct node *dir, const char *name, char *buf, size_t cap);
/* <tmp folder>/<rel> */
int ckpt_pf_tmp_file(struct pstep *ps, const char *rel, char *buf, size_t cap);
/* mkdir -p of the folders of rel (not its last part) in the tmp folder. */
int ckpt_pf_make_dirs(struct pstep *ps, const char *rel);
/* open(2) of <tmp folder>/<rel>: a descriptor or -errno. */
int ckpt_pf_raw_open(struct pstep *ps, const char *rel, int flags);
/* The path of raw file f in the tmp folder.  Its name and folders change
 * only under io_lock exclusive (renames in an Orbax save), so the caller
 * holds io_lock or ns_lock. */
int ckpt_pf_raw_path(ckpt_view *v, struct pfile_node *f, char *buf, size_t cap);
int ckpt_pf_raw_open_f(ckpt_view *v, struct pfile_node *f, int flags);
/* Size and mtime of raw file pf from its open descriptor fd (pf->mu held):
 * what stat answers from now on, unchanged by renames and closes. */
void ckpt_pf_raw_note_stat(struct pfile *pf, int fd);
/* A pytree key as the tree shows it (the read side's escape): the key into
 * buf, or -EINVAL (logged) when `name` is no name the read side makes or
 * the key is not one a step may hold. */
int ckpt_pf_key_of_name(const char *name, char *buf, size_t cap);
/* Key path of a file in a pending step: item = first directory below the
 * step, keys = the directories below it plus the file's stem; kbuf holds
 * CKPT_ORBAX_MAX_DEPTH names of VIEW_NAME_BUF bytes. */
int ckpt_pf_key_path(ckpt_view *v, struct node *dir, const char *stem, const char **item, const char **keys,
		     int *types, int *depth, char *kbuf);
/* Header bytes [off, off + n) of a file still collecting its header
 * (pf->mu held): into pf->hdr, grown as needed. */
int ckpt_pf_hdr_put(struct pfile *pf, uint64_t off, const uint8_t *data, size_t n);
/* A read of [off, off + *len) of a pending file (pf->mu held): *len
 * clipped to the file's size (0 past its end), the part inside the header
 * bytes written so far copied to dst; returns the bytes copied. */
size_t ckpt_pf_header_part(const struct pfile *pf, uint64_t off, size_t *len, uint8_t *dst);
/* The content of a copied metadata file `name` in dir, parsed; NULL if
 * there is none.  *bad is set when it is there but not JSON. */
cJSON *ckpt_pf_copied_json(struct node *dir, const char *name, int *bad);

/* A new pending file `name` of kind ops->kind in dir (a folder of a
 * pending step; not added as its kid yet), of dir's step, its mutex ready,
 * its header phase the kind's first.  NULL without memory. */
struct pfile_node *ckpt_pf_node_new(ckpt_view *v, struct node *dir, const char *name,
				    const struct pfile_ops *ops);
/* The one kind transition: pf becomes ops->kind (the table in pfile.c,
 * asserted); io_lock exclusive and pf->mu held. */
void ckpt_pf_set_kind(struct pfile *pf, const struct pfile_ops *ops);
/* The header phase moves (the table above, asserted); pf->mu held. */
void ckpt_pf_set_phase(struct pfile *pf, enum pf_phase to);
/* The invariants of a pending file in its kind and phase (pf->mu held;
 * an entry-point check of the kinds' ops). */
void ckpt_pf_assert(const struct pfile *pf);
/* A write of [*off, *off + len) begins (pf->mu held, kept): *off moves to
 * the end for O_APPEND (append); the file is dirty, its high-water mark
 * moves. */
void ckpt_pf_note_write_locked(struct pfile *pf, uint64_t *off, size_t len, int append);
/* The header part of a write to a file with a header phase (.npy,
 * safetensors), under pf->mu, which it takes and drops: while the header
 * is incomplete, collect (pf->mu held; see file.c's collect_header) takes
 * the bytes; once parsed, header bytes must not change (what names the
 * header in the error).  snap(pf, arg), when not NULL, copies what the
 * data part needs under the same hold.  Returns -errno, 0 when the write
 * is consumed (the caller returns len), or 1 with *take (the header bytes
 * of this write) and *data_off. */
typedef int (*ckpt_pf_collect_fn)(ckpt_view *v, struct pfile_node *f, uint64_t off, const uint8_t *data,
				  size_t len, size_t *take);
int ckpt_pf_header_write(ckpt_view *v, struct pfile_node *f, uint64_t *off, const uint8_t *data, size_t len,
			 int append, ckpt_pf_collect_fn collect, const char *what,
			 void (*snap)(struct pfile *pf, void *arg), void *arg, size_t *take,
			 size_t *data_off);
/* pfile_ops.check of a file a copy may still be writing: -EBUSY (why
 * filled) when copy and it is dirty or under a temporary name, else 0. */
int ckpt_pf_copy_busy(struct pfile_node *f, int copy, char *why, size_t cap);
/* Free a parsed safetensors header's entries. */
void ckpt_pf_st_entries_free(ckpt_st_entry *e, size_t n);

/* ---- raw.c ------------------------------------------------------------------ */

/* Remember the calling process (ckpt_view_set_caller) as a writer of the step. */
void ckpt_raw_note_writer(struct pstep *ps);
/* A process that wrote into the step is still running. */
int ckpt_raw_writers_alive(struct pstep *ps);
/* Pending step sn holds an item that is a stored copy. */
int ckpt_raw_has_stored(struct node *sn);
/* Item `it` becomes a stored copy (ns_lock exclusive); why: the file that
 * showed it. */
int ckpt_raw_make_stored(ckpt_view *v, struct node *it, const char *why);
/* Each stored copy of step sn reads back whole (see raw.c); -EAGAIN when
 * `quiet`.  Runs in the commit, without ns_lock. */
int ckpt_raw_check_stored(ckpt_view *v, struct node *sn, int quiet);
/* Start the copy-tool watch (ns_lock exclusive held): every 100 ms it
 * calls commit(v, sn) under ns_lock exclusive for each open step whose copy
 * was asked to commit, holds a stored copy, and whose copy tools exited (or
 * have been idle 2 s).  It stops with the view (a stop hook). */
void ckpt_raw_start_copy_thread(ckpt_view *v, int (*commit)(ckpt_view *v, struct node *sn));
/* Orbax saves (stored as written), ns_lock exclusive held: */
int ckpt_aw_mkdir(ckpt_view *v, struct node *dir, const char *name, ckpt_attr *out);
/* f: a new raw file node of dir (not linked yet), made on disk now */
int ckpt_aw_create(ckpt_view *v, struct pfile_node *f);
int ckpt_aw_rename(ckpt_view *v, struct node *dir, struct node *n, struct node *ndir, const char *newname,
		   unsigned flags);
int ckpt_aw_rmdir(ckpt_view *v, struct node *dir, struct node *n);
/* Pending step sn becomes an Orbax save in COMMIT_FILE mode; why: what showed it. */
int ckpt_aw_convert(ckpt_view *v, struct node *sn, const char *why);
/* Step-level _CHECKPOINT_METADATA of a live Orbax save: no commit time. */
int ckpt_aw_fresh_meta(struct pfile *pf);

/* ---- the kinds' ops (raw.c, safetensors.c, file.c) ---------------------------- */

extern const struct pfile_ops ckpt_pf_raw_ops, ckpt_pf_st_ops;
extern const struct pfile_ops ckpt_pf_array_ops, ckpt_pf_slice_ops, ckpt_pf_json_ops, ckpt_pf_meta_ops,
	ckpt_pf_marker_ops, ckpt_pf_index_ops;

/* ---- file.c ----------------------------------------------------------------- */

/* Multi-host: NAME.npy that another host declared becomes a declared
 * pending file here.  ns_lock exclusive held; NULL if none. */
struct pfile_node *ckpt_pf_adopt_decl(ckpt_view *v, struct node *dir, const char *base);
/* user.ckpt.dtype on a pending file. */
int ckpt_pf_set_dtype(struct pfile_node *f, const char *value, size_t size);

/* ---- step.c ----------------------------------------------------------------- */

/* mkdir at the root of a writable mount: a new pending step (ns_lock exclusive). */
int ckpt_ps_new(ckpt_view *v, struct node *root, const char *name, ckpt_attr *out);
/* Commit pending step node `sn` as `final`; replaces it in the root.
 * Called with ns_lock exclusive; drops it while the writer commits and the
 * committed folder is read back, and holds it again on return. */
int ckpt_ps_commit(ckpt_view *v, struct node *sn, const char *final, int copy, struct node **committed);
/* Find out whether the marker of UNSETTLED step sn landed (ns_lock
 * exclusive, dropped while sending). */
int ckpt_ps_settle(ckpt_view *v, struct node *sn, struct node **committed);
/* Commit sn if it may (copy: only when complete; else now or why not).
 * ns_lock exclusive held (the commit drops and retakes it). */
int ckpt_ps_try_commit(ckpt_view *v, struct node *sn, int copy);
/* rmdir of pending step n (OPEN or LOST) of dir: abort it (ns_lock exclusive). */
int ckpt_ps_abort(ckpt_view *v, struct node *dir, struct node *n);

#endif
