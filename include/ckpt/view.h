/*
 * ckpt/view.h - the mounted tree: nodes (steps, items, pytree directories,
 * array files, metadata files, and the hidden companions: slice files,
 * NAME.shards/ directories, X.safetensors files, .ckptfs/stats) addressed by
 * stable inode numbers, with lookup, readdir, attributes, xattrs and reads.
 * The daemon maps FUSE requests onto these calls one to one.
 *
 * Inode numbers: 1 is the root; a node keeps its number for the life of the
 * view, except transient nodes and the nodes of a step pruned from a live
 * root (see ckpt_view_forget); looking the same hidden name up twice while
 * it is referenced returns the same node.
 *
 * Thread-safety: every call may run concurrently with every other.  A
 * commit (create of commit_success.txt, rename of a pending step) blocks
 * only calls on its own step's files while it drains and fsyncs; lookup,
 * readdir and reads elsewhere on the mount go on.  Namespace changes of a
 * step being committed answer -EROFS.
 */
#ifndef CKPT_VIEW_H
#define CKPT_VIEW_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "support.h"

/* Opaque here; read/array.h and read/cache.h define them. */
typedef struct ckpt_centry ckpt_pin;

typedef struct ckpt_view ckpt_view;
typedef uint64_t ckpt_ino;
struct ckpt_store_opts;

#define CKPT_ROOT_INO 1

typedef struct ckpt_view_opts {
	ckpt_ctx_opts ctx; /* cache and decode threads */
	int read_only; /* refuse new steps even on a CheckpointManager root */
	int zstd_level; /* written chunks (0: the writer's default) */
	uint64_t write_budget; /* buffered bytes per pending step (0: default) */
	int process_index; /* multi-host writes (lib/write/writer_hosts.h): this host, 0 = primary */
	int process_count; /* hosts writing each step; 0 or 1: a single host */
	unsigned commit_timeout_s; /* multi-host commit: wait for the other hosts (0: 600 s) */
	int show_companions; /* list NAME.shards/ and X.safetensors in readdir */
	uint64_t st_shard_bytes; /* X.safetensors.d/ shard size (0: 5 GB) */
	/* Options of an s3:// or gs:// SOURCE (store.h; NULL: defaults).  Borrowed
	 * for the duration of ckpt_view_open() only. */
	const struct ckpt_store_opts *store;
	int force_root; /* use a non-empty SOURCE that is no checkpoint as a CheckpointManager root */
	/* An object-store root: local folder where pending steps are staged
	 * (committed steps are uploaded from it, commit marker last); NULL: the
	 * view is read-only there.  Borrowed for the life of the view. */
	const char *spool_dir;
	/* View recipes (STEP/.views/, docs/recipes.md): ':'-separated folders of
	 * recipe files read before the shipped ones (a name met twice keeps the
	 * first); NULL: none.  Borrowed for the life of the view. */
	const char *recipe_dirs;
	int no_shipped_recipes; /* do not read the recipes shipped with ckptfs */
	/* A writable root: an unlink or rmdir inside a committed step deletes
	 * the whole step (rmtree, CheckpointManager's max_to_keep; prune.c).
	 * 0: such removals are -EROFS, committed steps never lose a byte. */
	int delete_steps;
} ckpt_view_opts;

typedef struct ckpt_attr {
	ckpt_ino ino;
	int is_dir;
	int is_link; /* a symlink (a root's `latest`): ckpt_view_readlink gives its target */
	unsigned mode; /* permission bits */
	uint64_t size;
	int64_t mtime_ns;
	unsigned nlink;
	int immutable; /* committed data: the kernel may cache it indefinitely */
	int volatile_data; /* content changes (stats): serve with direct I/O */
	uint64_t generation; /* with ino, unique for the life of the view (ino numbers are reused) */
	int transient; /* a hidden name made on lookup, freed once forgotten: do not cache the entry */
} ckpt_attr;

/* Build the view of SOURCE (a CheckpointManager root, a step folder or an
 * item folder; detected).  An empty folder is a root.  A non-empty SOURCE
 * with none of _METADATA, _CHECKPOINT_METADATA, orbax.checkpoint, an OCDBT
 * manifest or a step folder is refused with -EMEDIUMTYPE (logged: what was
 * looked for) unless opts->force_root.  Only the root is listed here: the
 * steps of a root are read on first use.  An array whose metadata or store
 * is unreadable stays in the tree and answers -EIO (logged); only an
 * unusable SOURCE fails (-errno).
 *
 * A root is live: a lookup or readdir of the root lists the source again
 * when its mtime moved (object stores: at most once a second), so steps
 * committed outside the mount appear and pruned ones disappear; the name of
 * a pruned step answers -ENOENT, its nodes -ENOENT (readdir) or -ESTALE
 * (lookup in them, getattr, read).
 * Such nodes (the root and its steps) are not `immutable`.
 *
 * It returns with the view's decode threads at rest (none runs or has a
 * task queued): the caller may fork before its next call into the view
 * (fuse_daemonize); the child starts threads of its own when it needs
 * them. */
int ckpt_view_open(const char *source, const ckpt_view_opts *opts, ckpt_view **out);
/* The same over a store the caller made (tests, fuzzers: an in-memory
 * store); the view takes its own reference and names it by src->root.
 * Always read-only.  SOURCE-only behaviour follows src->root (a live root
 * of an "s3://" name, a local one otherwise). */
int ckpt_view_open_store(ckpt_store *src, const ckpt_view_opts *opts, ckpt_view **out);
void ckpt_view_destroy(ckpt_view *v);

/* What SOURCE was detected as: "root", "step" or "item". */
const char *ckpt_view_kind(const ckpt_view *v);

int ckpt_view_getattr(ckpt_view *v, ckpt_ino ino, ckpt_attr *out);

/* The mapping of view recipe `recipe` (a recipe name, or a path with a '/'
 * to a recipe file) over the arrays of directory `step` (a committed step):
 * one line per target tensor (name, shape, dtype, source key and ops) and
 * per literal file, in *out (malloc'ed).  -ENOENT for an unknown recipe or
 * one that does not match, -EINVAL for a recipe that cannot be applied;
 * *why (malloc'ed, or NULL) then names the failing rule.  Reads metadata
 * only. */
int ckpt_view_recipe_table(ckpt_view *v, ckpt_ino step, const char *recipe, char **out, char **why);

/* A file is being opened (for reading).  Stored data behind it is
 * revalidated, cheaply and boundedly (a few stats): 1 when bytes the
 * kernel may have cached from earlier opens of this inode could be stale
 * (the open must drop them: FUSE keep_cache off), 0 when they may be kept,
 * -ESTALE when the file's step is gone, -ENOENT. */
int ckpt_view_open_check(ckpt_view *v, ckpt_ino ino);

/* Files opened once whose step vanished from a live root: the kernel may
 * still hold their pages, which an open descriptor reads without asking.
 * 1 and one inode to invalidate in the kernel (page cache and attributes),
 * each handed out once; 0 when there is none. */
int ckpt_view_next_inval_inode(ckpt_view *v, ckpt_ino *ino);
/* fn(arg) is called (with no view lock held, from any thread, possibly a
 * request handler: it must not block) when inodes were queued for
 * ckpt_view_next_inval_inode.  Set it before requests are served. */
void ckpt_view_set_inval_notify(ckpt_view *v, void (*fn)(void *arg), void *arg);

/* Look `name` up in directory `parent`.  -ENOENT when absent; -EINVAL or
 * -ENOENT (logged with the reason) for a malformed or out-of-range slice
 * name; -ENOTDIR when parent is not a directory. */
int ckpt_view_lookup(ckpt_view *v, ckpt_ino parent, const char *name, ckpt_attr *out);

/* Every successful ckpt_view_lookup (and ckpt_view_readdir_ref) answer
 * counts one kernel reference to the node; ckpt_view_forget drops nlookup of
 * them (the FUSE forget).  A transient node (out->transient: slice files and
 * other hidden files made on lookup) is freed when its own count reaches
 * zero.  The nodes of a step of a live root are freed together once the
 * step was pruned (a rescan no longer finds its folder) and the references
 * to all of them are forgotten.  A freed node's inode number may come back
 * for another node with a new out->generation, so a caller must use an
 * inode number only while it holds a reference (the kernel does: it sends
 * no request for an inode it has forgotten).  A caller that could not pass
 * an answer on forgets it (nlookup 1).  Other nodes live as long as the
 * view.  A caller that never forgets (a tool walking a view) keeps every
 * node it looked up. */
void ckpt_view_forget(ckpt_view *v, ckpt_ino ino, uint64_t nlookup);

/* Answered transient names waiting for their entry invalidation beyond
 * which a directory's entry is invalidated instead of one name
 * (ckpt_view_next_inval): the nodes waiting for the kernel's forget stay
 * about this many, whatever the number of readers and names. */
#define CKPT_VIEW_INVAL_NAMES_CAP 4096

/* Transient nodes answered by ckpt_view_lookup, oldest first, each handed
 * out once per answer (and, once each, a step pruned from a live root and
 * the nodes of it the kernel holds): 1 and the parent and name (copied,
 * NUL-terminated, into name of cap bytes) of one, 0 when there are none.
 * A kernel keeps a
 * dentry until it is invalidated or memory runs short, so the daemon
 * invalidates each of these entries (away from request handlers) to get
 * the forget that frees the node.  A node freed meanwhile is not handed
 * out.  When more than CKPT_VIEW_INVAL_NAMES_CAP wait, the entry handed
 * out is that of the oldest one's directory (in its own parent), which
 * stands for all of that directory's names waiting: the kernel drops their
 * unused dentries with it; those it keeps (in use) are handed out again,
 * one by one, later.  The caller invalidates whatever entry it gets. */
int ckpt_view_next_inval(ckpt_view *v, ckpt_ino *parent, char *name, size_t cap);

/* Directory entry number `index` (0-based, "." and ".." not included):
 * returns 1 and sets *name (valid while the caller holds a reference to
 * dir) and *attr, 0 past the end, -ENOTDIR / -errno on error.  Entries come
 * sorted by name (strcmp), except at the root, where step folders (names
 * all digits) come first, by number (10, 20, 100), then the other names; a root with a committed
 * step ends with `latest`, a symlink (attr->is_link) to the newest one. */
int ckpt_view_readdir(ckpt_view *v, ckpt_ino dir, uint64_t index, const char **name, ckpt_attr *attr);
/* The same for a READDIRPLUS entry, which the kernel counts as a lookup:
 * one reference to the entry's node is counted (ckpt_view_forget drops it;
 * the caller forgets an entry it does not send). */
int ckpt_view_readdir_ref(ckpt_view *v, ckpt_ino dir, uint64_t index, const char **name, ckpt_attr *attr);

/* The target of symlink ino (a root's `latest`: the name of its newest
 * committed step, the root listed again first as a lookup does) into buf,
 * NUL-terminated: its length, -ENOENT when the root has no committed step
 * any more, -EINVAL when ino is no symlink, -ENAMETOOLONG when cap is too
 * small. */
ssize_t ckpt_view_readlink(ckpt_view *v, ckpt_ino ino, char *buf, size_t cap);

/* Read file bytes [off, off+len) into dst: returns bytes copied (0 at EOF)
 * or -EIO (logged) / -EISDIR. */
ssize_t ckpt_view_read(ckpt_view *v, ckpt_ino ino, uint64_t off, size_t len, void *dst);

/* Zero-copy read of an array file: fill iov[0..n) with pieces of the
 * header and of pinned decoded chunks covering [off, off+len) (clipped at
 * EOF); returns n (0 at EOF), or -ENOTSUP when the node or its chunk
 * layout does not allow it (use ckpt_view_read), or -EIO.  pins[0..*npins)
 * must be handed to ckpt_view_unpin once the bytes are sent.  max >= 3. */
struct iovec;
int ckpt_view_read_iov(ckpt_view *v, ckpt_ino ino, uint64_t off, size_t len, struct iovec *iov, int max,
		       ckpt_pin **pins, int *npins);
void ckpt_view_unpin(ckpt_view *v, ckpt_ino ino, ckpt_pin **pins, int npins);

/* Extended attributes: value of `name` into buf (returns its length; with
 * cap 0 just the length), -ENOTSUP outside the user.* namespace,
 * -ENODATA when the node has no such attribute,
 * -ERANGE when cap is too small.  list: NUL-separated names, same rules. */
ssize_t ckpt_view_getxattr(ckpt_view *v, ckpt_ino ino, const char *name, char *buf, size_t cap);
ssize_t ckpt_view_listxattr(ckpt_view *v, ckpt_ino ino, char *buf, size_t cap);

/*
 * Writing a new step (only when SOURCE is a CheckpointManager root and the
 * view is not read-only; everywhere else these return -EROFS):
 *
 *   mkdir ROOT/<step>                 start a pending step (Orbax and ckptfs
 *                                     ignore its <step>.orbax-checkpoint-tmp folder)
 *   mkdir <step>/<item>[/<node>...]   items and pytree directories
 *   create .../NAME.npy, write        the .npy header declares the array
 *                                     (dtype, shape); data bytes follow
 *   create .../NAME[<slice>].npy      a slice of a declared array: a .npy of
 *                                     the slice's shape and dtype
 *   create <step>/commit_success.txt  commit: returns once durable, or the
 *                                     errno of the failure (step stays pending)
 *   rename <step> -> <new name>       commit under the new name
 *   rmdir <step>                      abort the pending step
 *
 * An Orbax save: mkdir ROOT/<step>.orbax-checkpoint-tmp starts a pending
 * step stored as written: any folder and file inside it, at any level, is
 * made in its folder of that name as it is written (renames inside the
 * step, of open files and over existing files, unlink, rmdir of empty
 * folders as on a local disk), and rename to <step> commits it.
 * A committed step of a writable root is deleted by removing anything in
 * it (rmtree): the first unlink or rmdir below it takes the whole step out
 * of the root (the source folder or objects are deleted at once); the
 * rest of the removal then works on what the mount still shows of it.
 *
 * Errors: -EROFS (committed data, read-only mount), -EEXIST, -EINVAL (bad
 * .npy header, header that disagrees with the declaration or the slice,
 * bad name, array file directly in a step), -EFBIG (write past the end),
 * -ENOENT (slice of an undeclared array), -ENODATA (commit with holes),
 * -EPERM (removing a declared array), -EIO/-ENOSPC from storage.  Each
 * failure is logged with the array/step name and the reason.
 */

/* New directory `name` in parent; fills *out. */
int ckpt_view_mkdir(ckpt_view *v, ckpt_ino parent, const char *name, ckpt_attr *out);
/* New file `name` in parent (or the commit trigger); fills *out. */
int ckpt_view_create(ckpt_view *v, ckpt_ino parent, const char *name, ckpt_attr *out);
/* Write len bytes at off of a pending file; returns len or -errno.
 * Blocks while the step's write buffer is full (backpressure). */
ssize_t ckpt_view_write(ckpt_view *v, ckpt_ino ino, uint64_t off, const void *data, size_t len,
			unsigned flags);
#define CKPT_WRITE_APPEND 1u /* the file was opened O_APPEND: write after the furthest byte written */
/* A file opened for writing is being closed (FUSE flush; runs once per
 * close(2), which waits for it).  The step's commit marker closed with
 * nothing written by that open commits the step now: 0 once durable, or
 * why not (-ENODATA: bytes or a header missing, each logged; -EINVAL: no
 * item, a list with a gap, ...; the step stays pending).  A marker written
 * with bytes (a copy of a step) asks for the commit once the step is
 * complete: then the flush, or the rename, that completes the step
 * commits it and returns the commit's result.  0 for other nodes. */
int ckpt_view_flush(ckpt_view *v, ckpt_ino ino);
/* The process the calling thread's next requests come from (0: unknown).
 * A copy of a step whose items are stored files (an OCDBT database or
 * zarr folders copied from disk, not .npy) commits once the processes
 * that wrote it have exited: nothing else says when such a copy is whole. */
void ckpt_view_set_caller(pid_t pid);
/* chmod, chown: 0 for the nodes of a pending step, and of a step committed
 * through this mount (accepted and ignored: the mount shows its own modes
 * and owner, so copy tools that preserve them succeed), else -EROFS
 * (logged). */
int ckpt_view_setattr_meta(ckpt_view *v, ckpt_ino ino);
/* Truncate a pending file to `size` (only 0 before a header, or its
 * current size); -EROFS elsewhere. */
int ckpt_view_truncate(ckpt_view *v, ckpt_ino ino, uint64_t size);
/* flags: 0 (a file replaces a file, a folder an empty folder, where the
 * target takes it: inside an Orbax save) or CKPT_RENAME_NOREPLACE (-EEXIST
 * when newname exists). */
#define CKPT_RENAME_NOREPLACE 1u
int ckpt_view_rename(ckpt_view *v, ckpt_ino parent, const char *name, ckpt_ino newparent, const char *newname,
		     unsigned flags);
/* The root's `latest` (a symlink to the newest committed step) is refused
 * by unlink, rmdir, rename (either side) and mkdir/create with -EPERM
 * (logged). */
int ckpt_view_unlink(ckpt_view *v, ckpt_ino parent, const char *name);
int ckpt_view_rmdir(ckpt_view *v, ckpt_ino parent, const char *name);
/* Set user.ckpt.sharding (a JSON string, e.g. {"sharding_type":
 * "NamedSharding", ...}) on a declared pending array: it is written to the
 * item's _sharding at commit.  -ENOTSUP for other names, -EROFS outside
 * pending steps, -EINVAL for invalid JSON. */
int ckpt_view_setxattr(ckpt_view *v, ckpt_ino ino, const char *name, const char *value, size_t size);
/* 1 when the node is writable (a pending file), else 0. */
int ckpt_view_is_writable(ckpt_view *v, ckpt_ino ino);
/* 0 when the node may be opened for writing, else -EROFS (logged). */
int ckpt_view_check_writable(ckpt_view *v, ckpt_ino ino);

#endif
