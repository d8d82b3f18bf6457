/*
 * pending.c - writing new steps through the view: pending steps, items,
 * pytree directories and array files map onto the writer (writer.h).  The
 * pending node kinds (N_PSTEP, N_PDIR, N_PFILE) and their ops live here.
 *
 * Locks (the whole order is in tree_int.h): ns_lock -> ps->io_lock
 * (writes, reads and setxattr of the step shared; commit/abort exclusive)
 * -> pf->mu (header state of one file).  ckpt_warray_write runs with only
 * io_lock held (shared), so writers of different files never wait for each
 * other here.  A commit holds io_lock exclusive but NOT ns_lock: the step
 * is marked committing under ns_lock, committed, then its node is swapped
 * for the committed step's under ns_lock again.
 */
#include <ctype.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "npy.h"
#include "safetensors.h"
#include "stats.h"
#include "sysio.h"
#include "upload.h"
#include "orbax.h"
#include "writer.h"
#include "writer_hosts.h"
#include "tree_int.h"

/*
 * The life of a pending step (ps->state; every change through ps_set(),
 * which asserts the edge, and read with atomic loads):
 *
 *   from        to          by
 *   OPEN        COMMITTING  commit_step: checks passed, ns_lock dropped
 *   COMMITTING  OPEN        commit_step: the writer refused (holes, names,
 *                           a copy not whole yet): the step stays pending
 *   COMMITTING  SEALED      commit_step: the writer committed (renamed; on
 *                           an object store: staged); its state is freed
 *   SEALED      COMMITTED   commit_step: swapped for the committed step
 *   SEALED      LOST        commit_step: object store, the upload failed
 *                           and its marker is known not to be there; the
 *                           staged copy is gone, nothing is left
 *   SEALED      UNSETTLED   commit_step: object store, whether the marker
 *                           landed is unknown; every object and the staged
 *                           copy are kept, the step stays pending
 *   UNSETTLED   COMMITTED   settle_step (a touch of the marker): it landed
 *   UNSETTLED   LOST        settle_step: it did not (what was sent is gone)
 *   OPEN        ABORTED     ckpt_view_rmdir (and new_step on ENOMEM)
 *   LOST        ABORTED     ckpt_view_rmdir (the lost step's folder goes)
 *
 * What each state means for the rest of the file:
 *   dead (no writes, reads ESTALE): SEALED, COMMITTED, LOST, ABORTED;
 *   frozen (no namespace change): COMMITTING, SEALED and every dead state.
 * OPEN -> COMMITTING and the ends of commit_step happen under ns_lock
 * exclusive; COMMITTING -> SEALED under io_lock exclusive.
 */
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

static const char *const ps_names[PS_NSTATES] = { "open", "committing", "sealed",   "committed",
						  "lost", "aborted",	"unsettled" };

/* ps_edges[from] has bit `to` set for every legal edge (table above). */
static const unsigned ps_edges[PS_NSTATES] = {
	[PS_OPEN] = 1u << PS_COMMITTING | 1u << PS_ABORTED,
	[PS_COMMITTING] = 1u << PS_OPEN | 1u << PS_SEALED,
	[PS_SEALED] = 1u << PS_COMMITTED | 1u << PS_LOST | 1u << PS_UNSETTLED,
	[PS_LOST] = 1u << PS_ABORTED,
	[PS_UNSETTLED] = 1u << PS_COMMITTED | 1u << PS_LOST,
};
_Static_assert(PS_NSTATES <= 32, "ps_edges is a 32-bit mask per state");

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
	/* STEP/.views/NAME/ was made: the folder copied there becomes the
	 * step's arrays at the commit (views_import.c).  ns_lock. */
	int views_import;
};

static void ps_set(struct pstep *ps, enum ps_state to)
{
	int from = atomic_load(&ps->state);
	if (from < 0 || from >= PS_NSTATES || !(ps_edges[from] & (1u << to))) {
		ckpt_log(CKPT_LOG_ERR, "pending step: no edge %s -> %s",
			 from >= 0 && from < PS_NSTATES ? ps_names[from] : "?", ps_names[to]);
		assert(!"pending step state edge");
	}
	atomic_store(&ps->state, (int)to);
}

/* The invariants of a pending step in its state (an entry-point check). */
static void assert_pstep(const struct pstep *ps)
{
	int st = atomic_load(&ps->state);
	(void)st;
	assert(st >= 0 && st < PS_NSTATES);
	assert(st == PS_OPEN || st == PS_COMMITTING ? ps->step != NULL : ps->step == NULL);
}

static int ps_dead(struct pstep *ps)
{
	int st = atomic_load(&ps->state);
	return st != PS_OPEN && st != PS_COMMITTING;
}

static int sink_shard_done(void *ctx, const char *rel)
{
	return ckpt_bg_upload_file(ctx, rel);
}

static void sink_shard_changed(void *ctx, const char *rel)
{
	ckpt_bg_upload_stale(ctx, rel);
}

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

struct pfile {
	pthread_mutex_t mu;
	int is_slice;
	int is_json; /* the JSON file of a JSON item: hdr[0..size) is its content */
	/* A copied Orbax metadata file (the step's _CHECKPOINT_METADATA, an
	 * item's _METADATA, _sharding or commit_success.txt): hdr[0..size) is
	 * its content; it describes what the copy holds (step_check) and
	 * carries the shardings and item handlers into the commit, which writes
	 * the files anew. */
	int is_meta;
	int is_marker; /* the step's commit_success.txt: hdr[0..size) is its content */
	/* a file of a stored copy: its bytes live in the tmp folder at rel
	 * (its final name), written and read there; size is its size */
	int is_raw;
	char *rel; /* NULL in an Orbax save: the path follows renames (raw_path) */
	int64_t raw_mtime_ns; /* a raw file's mtime on disk after its last change (0: unknown) */
	/* X.safetensors being imported: hdr collects the 8-byte length and the
	 * JSON header until they parse (data_off = 8 + N from then on); each of
	 * its nst tensors is then an array of the step, st_arr[i], under the key
	 * path of X plus the tensor's name split on '.'.  Fixed once parsed
	 * (an O_TRUNC keeps them: the same header must come again). */
	int is_st;
	int is_index; /* model.safetensors.index.json of an X.safetensors.d/ (buffered) */
	ckpt_st_entry *st;
	size_t nst;
	ckpt_warray **st_arr;
	uint64_t st_data; /* bytes of the data buffer */
	int dirty; /* written since its last flush: a writer is still at it */
	/* marker: the explicit commit it asked for failed with this (then it
	 * left the directory); a later close of another descriptor of the
	 * same open (touch dup2()s its file) reports it again.  ns_lock. */
	int commit_err;
	int hwm_valid;
	uint64_t hwm; /* end of the furthest byte written: where O_APPEND writes go */
	/* A copy tool's temporary name (rsync's .NAME.XXXXXX): the name the
	 * file is written as and will be renamed to; NULL for a final name. */
	char *final;
	ckpt_dtype hint; /* named by user.ckpt.dtype before the header, else INVALID */
	struct pfile_node *decl; /* slice files: the NAME.npy node that declared the array */
	/* NAME.npy: slice files made for its array.  Once there is one, every
	 * write of the array must keep the bytes already written (several
	 * writers, one value: CKPT_WRITE_SAME); a lone file may rewrite its own. */
	atomic_int nslices;
	ckpt_warray *arr; /* NULL until the header has been parsed */
	ckpt_region region; /* whole array or the slice */
	uint8_t *hdr; /* header bytes (all bytes written before the header parsed) */
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

static struct pdir_node *to_pdir(struct node *n)
{
	assert(n->kind == N_PSTEP || n->kind == N_PDIR);
	return container_of(to_dir(n), struct pdir_node, d);
}

static struct pfile_node *to_pfile(struct node *n)
{
	assert(n->kind == N_PFILE);
	return container_of(n, struct pfile_node, n);
}

static struct node *parent_of(ckpt_view *v, struct node *n);

#define ST_SUFFIX ".safetensors" /* an imported safetensors file */
#define ST_DIR_SUFFIX ".safetensors.d" /* the shards of one */

static int has_suffix(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);
	return a > b && !strcmp(s + a - b, suf);
}

/* The process the current request comes from (ckpt_view_set_caller). */
static _Thread_local pid_t caller_pid;
static _Thread_local int from_copy_thread; /* try_commit called by copy_thread_main */

void ckpt_view_set_caller(pid_t pid)
{
	caller_pid = pid;
}

/* Remember the calling process as a writer of the step. */
static void note_writer(struct pstep *ps)
{
	atomic_store(&ps->last_op_ns, ckpt_now_ns());
	pid_t pid = caller_pid;
	if (pid <= 0)
		return;
	ckpt_lock(&ps->wp_mu, CKPT_RANK_WP);
	int i = 0;
	while (i < ps->nwp && ps->wp[i].pid != pid)
		i++;
	if (i == ps->nwp && ps->nwp < (int)(sizeof(ps->wp) / sizeof(ps->wp[0]))) {
		ps->wp[i].pid = pid;
		ps->wp[i].fd = (int)syscall(SYS_pidfd_open, pid, 0);
		ps->nwp++;
	}
	ckpt_unlock(&ps->wp_mu, CKPT_RANK_WP);
}

/* A process that wrote into the step is still running. */
static int writers_alive(struct pstep *ps)
{
	ckpt_lock(&ps->wp_mu, CKPT_RANK_WP);
	for (int i = 0; i < ps->nwp;) {
		int gone;
		if (ps->wp[i].fd >= 0) {
			struct pollfd p = { ps->wp[i].fd, POLLIN, 0 };
			gone = poll(&p, 1, 0) == 1;
		} else {
			gone = kill(ps->wp[i].pid, 0) && errno == ESRCH;
		}
		if (!gone) {
			i++;
			continue;
		}
		if (ps->wp[i].fd >= 0)
			close(ps->wp[i].fd);
		ps->wp[i] = ps->wp[--ps->nwp];
	}
	int alive = ps->nwp > 0;
	ckpt_unlock(&ps->wp_mu, CKPT_RANK_WP);
	return alive;
}

/* Files whose bytes the view keeps itself (a JSON item's file, copied
 * metadata, the commit marker) rather than handing them to the writer as
 * array data. */
static int buffered(const struct pfile *pf)
{
	return pf->is_json || pf->is_meta || pf->is_marker || pf->is_index;
}

/* ---- stored copies --------------------------------------------------------
 *
 * A copy of an item as Orbax stored it (cp -r of a step folder on disk: its
 * OCDBT database or zarr folders, not .npy files) cannot be turned into
 * arrays file by file.  The first file in an item that is not a .npy (nor
 * one of the metadata files of a copy) makes the item a stored copy: its
 * files are written as they come into the tmp folder, under their final
 * names, and committed as they are once the item reads back whole
 * (check_stored).  Such an item holds no .npy arrays of the mount's own. */

static const char *step_name_of(ckpt_view *v, struct node *it)
{
	struct node *up = parent_of(v, it);
	return up ? up->name : "?";
}

/* The item directory (a kid of the step) that n is in, or NULL. */
static struct node *item_of(ckpt_view *v, struct node *n)
{
	while (n && n->kind == N_PDIR) {
		struct node *up = parent_of(v, n);
		if (up && up->kind == N_PSTEP)
			return n;
		n = up;
	}
	return NULL;
}

/* "<item>/<dirs>/<name>" of `name` in pending directory dir. */
static int rel_of(ckpt_view *v, struct node *dir, const char *name, char *buf, size_t cap)
{
	const char *parts[CKPT_ORBAX_MAX_DEPTH + 2];
	int k = 0;
	parts[k++] = name;
	for (struct node *d = dir; d && d->kind == N_PDIR; d = parent_of(v, d)) {
		if (k == CKPT_ORBAX_MAX_DEPTH + 2)
			return -ENAMETOOLONG;
		parts[k++] = d->name;
	}
	size_t len = 0;
	for (int i = k - 1; i >= 0; i--) {
		int m = snprintf(buf + len, cap - len, "%s%s", parts[i], i ? "/" : "");
		if (m < 0 || (size_t)m >= cap - len)
			return -ENAMETOOLONG;
		len += (size_t)m;
	}
	return 0;
}

/* <tmp folder>/<rel> */
static int tmp_file(struct pstep *ps, const char *rel, char *buf, size_t cap)
{
	ckpt_step_info info;
	ckpt_step_get_info(ps->step, &info);
	int m = snprintf(buf, cap, "%s/%s", info.tmp_path, rel);
	return m < 0 || (size_t)m >= cap ? -ENAMETOOLONG : 0;
}

/* mkdir -p of the folders of rel (not its last part) in the tmp folder. */
static int make_dirs(struct pstep *ps, const char *rel)
{
	char path[VIEW_PATH_MAX];
	int rc = tmp_file(ps, rel, path, sizeof(path));
	if (rc)
		return rc;
	ckpt_step_info info;
	ckpt_step_get_info(ps->step, &info);
	for (char *p = path + strlen(info.tmp_path) + 1; (p = strchr(p, '/')); p++) {
		*p = 0;
		if (mkdir(path, 0755) && errno != EEXIST)
			rc = -errno;
		*p = '/';
		if (rc)
			return rc;
	}
	return 0;
}

static int raw_open(struct pstep *ps, const char *rel, int flags)
{
	char path[VIEW_PATH_MAX];
	int rc = tmp_file(ps, rel, path, sizeof(path));
	if (rc)
		return rc;
	int fd = open(path, flags | O_CLOEXEC | O_NOFOLLOW, 0644);
	return fd < 0 ? -errno : fd;
}

/* The path of raw file f in the tmp folder.  Its name and folders change
 * only under io_lock exclusive (renames in an Orbax save), so the caller
 * holds io_lock or ns_lock. */
static int raw_path(ckpt_view *v, struct pfile_node *f, char *buf, size_t cap)
{
	char rel[VIEW_PATH_MAX];
	int rc = 0;
	if (f->pf.rel)
		snprintf(rel, sizeof(rel), "%s", f->pf.rel);
	else
		rc = rel_of(v, parent_of(v, &f->n), f->n.name, rel, sizeof(rel));
	return rc ? rc : tmp_file(f->ps, rel, buf, cap);
}

static int raw_open_f(ckpt_view *v, struct pfile_node *f, int flags)
{
	char path[VIEW_PATH_MAX];
	int rc = raw_path(v, f, path, sizeof(path));
	if (rc)
		return rc;
	int fd = open(path, flags | O_CLOEXEC | O_NOFOLLOW, 0644);
	return fd < 0 ? -errno : fd;
}

/* Size and mtime of raw file f from its open descriptor fd (pf->mu held):
 * what stat answers from now on, unchanged by renames and closes. */
static void raw_note_stat(struct pfile *pf, int fd)
{
	struct stat sb;
	if (fstat(fd, &sb) == 0) {
		pf->size = (uint64_t)sb.st_size;
		pf->raw_mtime_ns = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
	}
}

/* A pending .npy (or JSON) file anywhere below dir. */
static int has_arrays(struct node *dir)
{
	struct dir_node *d = to_dir(dir);
	for (size_t i = 0; i < d->nkids; i++) {
		struct node *k = d->kids[i];
		if (k->kind == N_PDIR && has_arrays(k))
			return 1;
		if (k->kind == N_PFILE && !to_pfile(k)->pf.is_meta && !to_pfile(k)->pf.is_raw)
			return 1;
	}
	return 0;
}

/* Item `it` becomes a stored copy (ns_lock exclusive): the metadata files
 * copied into it so far go to its folder as they are. */
static int make_stored(ckpt_view *v, struct node *it, const char *why)
{
	struct pdir_node *pd = to_pdir(it);
	struct pstep *ps = pd->ps;
	if (pd->stored)
		return 0;
	if (v->opts.spool_dir || ckpt_hosts_is_multi(ps->step)) {
		ckpt_log(CKPT_LOG_ERR,
			 "%s/%s: only .npy arrays can be written here (a stored copy of an Orbax item is "
			 "taken by a local single-host root only)",
			 it->name, why);
		return -EPERM;
	}
	if (has_arrays(it)) {
		ckpt_log(CKPT_LOG_ERR,
			 "%s/%s: the item holds .npy arrays; files of a stored Orbax item (an OCDBT or zarr "
			 "copy) cannot join them",
			 it->name, why);
		return -EINVAL;
	}
	int rc = ckpt_step_add_stored_item(ps->step, it->name);
	struct dir_node *d = to_dir(it);
	for (size_t i = 0; i < d->nkids && !rc; i++) {
		struct node *k = d->kids[i];
		if (k->kind != N_PFILE || !to_pfile(k)->pf.is_meta)
			continue;
		struct pfile *pf = &to_pfile(k)->pf;
		char rel[VIEW_PATH_MAX];
		rc = rel_of(v, it, pf->final ? pf->final : k->name, rel, sizeof(rel));
		if (rc)
			break;
		ckpt_lock(&pf->mu, CKPT_RANK_PF);
		int fd = raw_open(ps, rel, O_WRONLY | O_CREAT | O_TRUNC);
		rc = fd < 0 ? fd : ckpt_pwrite_all(fd, pf->hdr, (size_t)pf->size, 0);
		if (fd >= 0)
			close(fd);
		if (!rc && !(pf->rel = strdup(rel)))
			rc = -ENOMEM;
		if (!rc) {
			pf->is_meta = 0;
			pf->is_raw = 1;
		}
		ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	}
	if (rc == 0) {
		pd->stored = 1;
		ckpt_log(CKPT_LOG_INFO, "step %s: item %s is a stored copy (%s is not a .npy array)",
			 step_name_of(v, it), it->name, why);
	}
	return rc;
}

/* No namespace change on the step: committed, aborted or committing. */
static int frozen(struct pstep *ps)
{
	return atomic_load(&ps->state) != PS_OPEN;
}

/* Refuse a change of committed data (or of a read-only mount), logged. */
static int refuse(const char *name, const char *what)
{
	ckpt_log(CKPT_LOG_WARN,
		 "%s: cannot %s: read-only (committed data, or a mount that takes no new steps)", name, what);
	return -EROFS;
}

static struct node *parent_of(ckpt_view *v, struct node *n)
{
	return ckpt_node_at(v, n->parent);
}

/* ---- the pending kinds ------------------------------------------------- */

static void pdir_attr(ckpt_view *v, struct node *n, ckpt_attr *a)
{
	(void)v;
	(void)n;
	a->is_dir = 1;
	a->nlink = 2;
	a->immutable = 0;
	a->mode = 0755;
}

static void pfile_attr(ckpt_view *v, struct node *n, ckpt_attr *a)
{
	(void)v;
	struct pfile *pf = &to_pfile(n)->pf;
	a->immutable = 0;
	a->mode = 0644;
	ckpt_lock(&pf->mu, CKPT_RANK_PF);
	a->size = pf->size;
	if (pf->raw_mtime_ns)
		a->mtime_ns = pf->raw_mtime_ns;
	/* an Orbax save's file: its bytes go straight to the tmp folder and are
	 * read from there, so the kernel keeps no pages of it (direct I/O) */
	a->volatile_data = pf->is_raw && to_pfile(n)->ps->as_written;
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
}

static void pstep_destroy(ckpt_view *v, struct node *n)
{
	(void)v;
	struct pstep *ps = to_pdir(n)->ps;
	if (!ps)
		return;
	if (ps->step) {
		ckpt_step_info info;
		ckpt_step_get_info(ps->step, &info);
		if (info.state == CKPT_STEP_PENDING)
			ckpt_log(CKPT_LOG_WARN,
				 "step %s was not committed; its data stays in %s (not a step)", info.name,
				 info.tmp_path);
	}
	ckpt_step_destroy(ps->step);
	if (atomic_load(&ps->state) == PS_UNSETTLED) {
		ckpt_log(CKPT_LOG_WARN,
			 "step %s: unmounted while whether its commit landed is unknown: every object sent "
			 "stays "
			 "in the store (a reader sees the whole step or none of it)",
			 ps->unsettled);
		CKPT_STAT_ADD(unsettled_steps, -1);
	}
	free(ps->unsettled);
	/* never committed: its objects are not a step; take them back */
	ckpt_bg_upload_free(ps->bg, atomic_load(&ps->state) != PS_COMMITTED);
	pthread_rwlock_destroy(&ps->io_lock);
	for (int i = 0; i < ps->nwp; i++)
		if (ps->wp[i].fd >= 0)
			close(ps->wp[i].fd);
	pthread_mutex_destroy(&ps->wp_mu);
	free(ps);
}

static void st_entries_free(ckpt_st_entry *e, size_t n)
{
	for (size_t i = 0; e && i < n; i++)
		free(e[i].name);
	free(e);
}

static void pfile_destroy(ckpt_view *v, struct node *n)
{
	(void)v;
	struct pfile *pf = &to_pfile(n)->pf;
	pthread_mutex_destroy(&pf->mu);
	free(pf->hdr);
	free(pf->final);
	free(pf->rel);
	st_entries_free(pf->st, pf->nst);
	free(pf->st_arr);
}

static ssize_t pending_read(ckpt_view *v, struct node *n, uint64_t off, size_t len, void *dst);

static const char *pstep_reserves(struct node *k);
static int pstep_lookup(ckpt_view *v, struct node *dir, const char *name, struct node **out);

static const struct node_ops pstep_ops = {
	.kind = N_PSTEP,
	.size = sizeof(struct pdir_node),
	.getattr = pdir_attr,
	.readdir = ckpt_node_readdir_kids,
	.destroy = pstep_destroy,
	.reserves = pstep_reserves,
	.lookup = pstep_lookup,
};

static const struct node_ops pdir_ops = {
	.kind = N_PDIR,
	.size = sizeof(struct pdir_node),
	.getattr = pdir_attr,
	.readdir = ckpt_node_readdir_kids,
};

static const struct node_ops pfile_ops = {
	.kind = N_PFILE,
	.size = sizeof(struct pfile_node),
	.getattr = pfile_attr,
	.read = pending_read,
	.destroy = pfile_destroy,
};

/* A new pending file `name` in dir (a folder of a pending step; not added
 * as its kid yet), of dir's step, its mutex ready.  NULL without memory. */
static struct pfile_node *pfile_node_new(ckpt_view *v, struct node *dir, const char *name)
{
	struct node *n = ckpt_node_new(v, &pfile_ops, name, dir);
	if (!n)
		return NULL;
	struct pfile_node *f = to_pfile(n);
	f->ps = to_pdir(dir)->ps;
	pthread_mutex_init(&f->pf.mu, NULL);
	return f;
}

/* ---- view imports (views_import.c) ------------------------------------------
 *
 * `cp -r hf_folder MNT/30/.views/NAME/`: STEP/.views/ of a pending step is
 * a hidden folder made on lookup; its folder NAME (a recipe that imports)
 * is staged like a stored copy's files (raw files in <tmp>/.views/NAME/),
 * and the commit turns it into the step's arrays (ckpt_vimport_commit). */

/* pstep_ops.lookup (ns_lock shared): STEP/.views/. */
static int pstep_lookup(ckpt_view *v, struct node *dir, const char *name, struct node **out)
{
	struct pstep *ps = to_pdir(dir)->ps;
	if (strcmp(name, CKPT_VIEWS_DIR) || ps->as_written || frozen(ps) || atomic_load(&dir->orphan) ||
	    ckpt_hosts_is_multi(ps->step))
		return -ENOENT;
	struct node *n = ckpt_node_new(v, &pdir_ops, name, dir);
	if (!n)
		return -ENOMEM;
	to_pdir(n)->ps = ps;
	to_pdir(n)->stored = 1; /* its files are staged as they come */
	to_pdir(n)->is_views = 1;
	n->hidden = 1;
	*out = n;
	return 0;
}

int ckpt_view_is_writable(ckpt_view *v, ckpt_ino ino)
{
	struct node *n = ckpt_node_at(v, ino);
	return n && n->kind == N_PFILE && !ps_dead(to_pfile(n)->ps);
}

/* commit_success.txt of a committed step of a writable root: creating it
 * again is a commit that already happened (an idempotent no-op). */
static int is_commit_marker(ckpt_view *v, struct node *n)
{
	struct node *step = n->kind == N_FILE ? parent_of(v, n) : NULL;
	return v->writable && step && step->parent == CKPT_ROOT_INO && step->kind != N_PSTEP &&
	       !strcmp(n->name, CKPT_ORBAX_COMMIT_SUCCESS);
}

int ckpt_view_check_writable(ckpt_view *v, ckpt_ino ino)
{
	struct node *n = ckpt_node_at(v, ino);
	if (!n)
		return -ENOENT;
	if (n->kind == N_PFILE && !ps_dead(to_pfile(n)->ps) && !atomic_load(&n->orphan))
		return 0;
	if (is_commit_marker(v, n))
		return 0; /* writes still answer EROFS; O_TRUNC does nothing */
	return refuse(n->name, "open for writing");
}

/* A pytree key as the tree shows it (the read side's escape): the key into
 * buf, or -EINVAL (logged) when `name` is no name the read side makes or
 * the key is not one a step may hold. */
static int key_of_name(const char *name, char *buf, size_t cap)
{
	const char *why = "";
	int rc = ckpt_orbax_key_unescape(name, buf, cap);
	if (rc == -EINVAL)
		why = "'%' only in the escapes the mount shows: %25 for '%', %2F for '/'";
	else if (rc >= 0 && !ckpt_orbax_name_ok(CKPT_NAME_KEY, buf, &why))
		rc = -EINVAL;
	if (rc < 0)
		ckpt_log(CKPT_LOG_ERR, "%s: not a usable pytree key name (%s)", name,
			 rc == -EINVAL ? why : strerror(-rc));
	return rc < 0 ? (rc == -ENAMETOOLONG ? -ENAMETOOLONG : -EINVAL) : 0;
}

/* ---- namespace -------------------------------------------------------- */

/* pstep_ops.reserves: the final name of a committing step (ns_lock held);
 * layout.c's ckpt_name_reserved asks every pending step of the root. */
static const char *pstep_reserves(struct node *k)
{
	struct pstep *ps = to_pdir(k)->ps;
	int st = atomic_load(&ps->state);
	return st == PS_COMMITTING || st == PS_SEALED ? ps->final : st == PS_UNSETTLED ? ps->unsettled : NULL;
}

/* Upload workers of a step on an object store: one CKPT_UPLOAD_PART buffer
 * each, taken out of the step's write budget; at most a quarter of it
 * (at least one worker), at most -o threads (default 8). */
static unsigned upload_threads(const ckpt_view *v, uint64_t budget)
{
	uint64_t want = v->opts.ctx.threads > 0 ? (uint64_t)v->opts.ctx.threads : 8;
	uint64_t cap = budget / 4 / CKPT_UPLOAD_PART;
	if (cap < 1)
		cap = 1;
	return (unsigned)(want < cap ? want : cap);
}

static int new_step(ckpt_view *v, struct node *root, const char *name, ckpt_attr *out)
{
	const char *why = "";
	char sname[CKPT_ORBAX_NAME_MAX + 1];
	/* Orbax's own folder for step S: an Orbax save, stored as written */
	int as_written = ckpt_orbax_tmp_step(name, sname, sizeof(sname));
	if (!as_written && !ckpt_orbax_name_ok(CKPT_NAME_PENDING_STEP, name, &why)) {
		ckpt_log(CKPT_LOG_ERR, "%s: not a valid step name (%s)", name, why);
		return -EINVAL;
	}
	if (ckpt_node_find_kid(root, name) || ckpt_name_reserved(root, name))
		return -EEXIST;
	struct node *same = as_written ? ckpt_node_find_kid(root, sname) : NULL;
	if (same && same->kind == N_PSTEP) {
		ckpt_log(CKPT_LOG_ERR, "%s: step %s is being written through the mount already", name, sname);
		return -EEXIST;
	}
	if (as_written && v->opts.process_count > 1) {
		ckpt_log(CKPT_LOG_ERR,
			 "%s: an Orbax save through a mount with process_count is not supported (each host's "
			 "mount would stage its own folder); save through one mount",
			 name);
		return -EPERM;
	}
	ckpt_writer_opts o;
	ckpt_writer_opts_init(&o);
	if (v->opts.zstd_level)
		o.zstd_level = v->opts.zstd_level;
	if (v->opts.write_budget)
		o.mem_budget = v->opts.write_budget;
	/* On an object store the uploads' part buffers come out of the same
	 * budget (-o write_buffer counts every buffered byte of the step). */
	unsigned up_threads = 0;
	if (v->opts.spool_dir) {
		up_threads = upload_threads(v, o.mem_budget);
		uint64_t up = (uint64_t)up_threads * CKPT_UPLOAD_PART;
		o.mem_budget = o.mem_budget > 2 * up ? o.mem_budget - up : o.mem_budget / 2;
	}
	ckpt_step *st;
	ckpt_hosts_opts ho = { v->opts.process_index, v->opts.process_count, v->opts.commit_timeout_s };
	int rc = ckpt_hosts_step_begin(v->opts.spool_dir ? v->opts.spool_dir : v->source,
				       as_written ? sname : name, &o, &ho, &st);
	if (rc == 0 && as_written && (rc = ckpt_step_set_as_written(st)) < 0) {
		ckpt_step_abort(st);
		ckpt_step_destroy(st);
	}
	if (rc < 0) {
		ckpt_log(CKPT_LOG_ERR, "step %s: cannot start a pending step: %s", name, strerror(-rc));
		return rc;
	}
	struct pstep *ps = calloc(1, sizeof(*ps));
	struct node *n = ps ? ckpt_node_new(v, &pstep_ops, name, root) : NULL;
	if (!n) {
		ckpt_step_abort(st);
		ckpt_step_destroy(st);
		free(ps);
		return -ENOMEM;
	}
	ps->step = st;
	ps->up_threads = up_threads;
	ps->as_written = as_written;
	if (v->opts.spool_dir && v->opts.process_count <= 1 && !as_written) {
		ckpt_step_info info;
		ckpt_step_get_info(st, &info);
		/* without it (-ENOMEM, no thread) everything goes at commit */
		if (ckpt_bg_upload_new(v->src, info.tmp_path, name, up_threads, &ps->bg) == 0) {
			struct ckpt_step_sink sink = { sink_shard_done, sink_shard_changed, ps->bg };
			ckpt_step_set_sink(st, &sink);
		}
	}
	pthread_rwlock_init(&ps->io_lock, NULL);
	pthread_mutex_init(&ps->wp_mu, NULL);
	atomic_init(&ps->last_op_ns, ckpt_now_ns());
	atomic_init(&ps->state, PS_OPEN);
	to_pdir(n)->ps = ps; /* the node owns it from here on */
	if (ckpt_node_add_kid(root, n) < 0) {
		ckpt_step_abort(st);
		ckpt_step_destroy(st);
		ps->step = NULL;
		ps_set(ps, PS_ABORTED);
		return -ENOMEM;
	}
	ckpt_node_fill_attr(v, n, out);
	return 0;
}

/* ---- Orbax saves -------------------------------------------------------------
 *
 * Orbax (ATOMIC_RENAME, its default on every path but gs://) saves step S
 * into "S.orbax-checkpoint-tmp/" and renames that to "S" when done.  A
 * pending step made under that name is stored as written (ps->as_written):
 * its tmp folder on disk has that very name, every folder and file made in
 * it, at any level and under any name, is made there at once, its bytes
 * written and read there (raw files), and the namespace calls map one to
 * one onto the folder:
 *   mkdir, create, O_TRUNC, write, read, unlink, rmdir of an empty folder;
 *   rename of files and folders inside the step, replacing a file (TensorStore
 *     renames "K.__lock" over "K" while it still holds it open), under
 *     io_lock exclusive, so no read or write sees a path change midway;
 *   a second open for writing of an open file, and a flush of either
 *     descriptor, change nothing (no file here is a commit request: the
 *     commit_success.txt files Orbax writes into the tmp folders are data);
 *   stat: the node's inode number (kept across renames) and the size and
 *     mtime (ns) the file had on disk after its last change, so that
 *     TensorStore's generations (dev, ino, mtime) of an unchanged file stay
 *     equal across fsync, rename and close.
 * The rename of the step to S commits it (commit_step): the writer fsyncs
 * every file and folder, drops leftover "*.__lock" files and renames the
 * folder (ckpt_step_set_as_written); on an object store the staged folder
 * is then uploaded, commit_success.txt last.  rmdir of the step (Orbax's
 * rmtree of a stale tmp folder) throws it away.  fsync answers at once:
 * the commit makes the step durable.
 */

/* mkdir in an Orbax save (ns_lock exclusive). */
static int aw_mkdir(ckpt_view *v, struct node *dir, const char *name, ckpt_attr *out)
{
	struct pstep *ps = to_pdir(dir)->ps;
	char rel[VIEW_PATH_MAX], path[VIEW_PATH_MAX];
	if (ckpt_node_find_kid(dir, name))
		return -EEXIST;
	int rc = rel_of(v, dir, name, rel, sizeof(rel));
	if (!rc)
		rc = tmp_file(ps, rel, path, sizeof(path));
	if (!rc && mkdir(path, 0755) && errno != EEXIST)
		rc = -errno;
	if (rc) {
		ckpt_log(CKPT_LOG_ERR, "%s: mkdir in the tmp folder: %s", rel, strerror(-rc));
		return rc;
	}
	struct node *n = ckpt_node_new(v, &pdir_ops, name, dir);
	if (!n || ckpt_node_add_kid(dir, n) < 0)
		return -ENOMEM;
	to_pdir(n)->ps = ps;
	ckpt_node_fill_attr(v, n, out);
	note_writer(ps);
	return 0;
}

/* A new file in an Orbax save (ns_lock exclusive), made on disk at once. */
static int aw_create(ckpt_view *v, struct node *dir, const char *name, struct node **out)
{
	struct pfile_node *f = pfile_node_new(v, dir, name);
	if (!f)
		return -ENOMEM;
	f->pf.is_raw = 1;
	int fd = raw_open_f(v, f, O_RDWR | O_CREAT);
	if (fd < 0) {
		ckpt_log(CKPT_LOG_ERR, "%s: cannot create it in the tmp folder: %s", name, strerror(-fd));
		return fd; /* the node is unlinked: freed with the view */
	}
	raw_note_stat(&f->pf, fd);
	close(fd);
	*out = &f->n;
	return 0;
}

/* 1 when dir is kid or below node n. */
static int aw_below(ckpt_view *v, struct node *dir, struct node *n)
{
	for (struct node *d = dir; d && d->ino != CKPT_ROOT_INO; d = parent_of(v, d))
		if (d == n)
			return 1;
	return 0;
}

/* rename inside an Orbax save (ns_lock exclusive): the folder's rename,
 * then the nodes'.  A file replaces a file, a folder an empty folder. */
static int aw_rename(ckpt_view *v, struct node *dir, struct node *n, struct node *ndir, const char *newname,
		     unsigned flags)
{
	struct pstep *ps = to_pdir(dir)->ps;
	if (!ndir || (ndir->kind != N_PSTEP && ndir->kind != N_PDIR) || to_pdir(ndir)->ps != ps ||
	    atomic_load(&ndir->orphan))
		return -EXDEV;
	if (frozen(ps))
		return refuse(n->name, "rename (the step is committed or committing)");
	struct node *t = ckpt_node_find_kid(ndir, newname);
	if (t == n)
		return 0;
	if (t && (flags & CKPT_RENAME_NOREPLACE))
		return -EEXIST;
	if (t && n->kind == N_PFILE && t->kind != N_PFILE)
		return -EISDIR;
	if (t && n->kind == N_PDIR && t->kind != N_PDIR)
		return -ENOTDIR;
	if (t && t->kind == N_PDIR && to_dir(t)->nkids)
		return -ENOTEMPTY;
	if (n->kind == N_PDIR && aw_below(v, ndir, n))
		return -EINVAL;
	char *nn = strdup(newname);
	if (!nn)
		return -ENOMEM;
	char orel[VIEW_PATH_MAX], nrel[VIEW_PATH_MAX], op[VIEW_PATH_MAX], np[VIEW_PATH_MAX];
	int rc = rel_of(v, dir, n->name, orel, sizeof(orel));
	if (!rc)
		rc = rel_of(v, ndir, newname, nrel, sizeof(nrel));
	if (!rc)
		rc = tmp_file(ps, orel, op, sizeof(op));
	if (!rc)
		rc = tmp_file(ps, nrel, np, sizeof(np));
	if (rc) {
		free(nn);
		return rc;
	}
	/* no read or write of the step runs while paths change */
	ckpt_wrlock(&ps->io_lock, CKPT_RANK_IO);
	if (rename(op, np)) {
		rc = -errno;
		ckpt_log(CKPT_LOG_ERR, "%s -> %s: rename in the tmp folder: %s", orel, nrel, strerror(errno));
	} else {
		if (t) {
			ckpt_node_remove_kid(ndir, t);
			atomic_store(&t->orphan, true);
		}
		ckpt_node_remove_kid(dir, n);
		char *old = n->name;
		if (n->kind == N_PFILE)
			ckpt_lock(&to_pfile(n)->pf.mu, CKPT_RANK_PF);
		n->name = nn;
		n->parent = ndir->ino;
		if (n->kind == N_PFILE)
			ckpt_unlock(&to_pfile(n)->pf.mu, CKPT_RANK_PF);
		nn = old;
		rc = ckpt_node_add_kid(ndir, n);
	}
	ckpt_rwunlock(&ps->io_lock, CKPT_RANK_IO);
	free(nn);
	note_writer(ps);
	return rc;
}

/* rmdir of an empty folder in an Orbax save (ns_lock exclusive). */
static int aw_rmdir(ckpt_view *v, struct node *dir, struct node *n)
{
	struct pstep *ps = to_pdir(n)->ps;
	if (frozen(ps))
		return refuse(n->name, "remove (the step is committed or committing)");
	if (to_dir(n)->nkids)
		return -ENOTEMPTY;
	char rel[VIEW_PATH_MAX], path[VIEW_PATH_MAX];
	int rc = rel_of(v, dir, n->name, rel, sizeof(rel));
	if (!rc)
		rc = tmp_file(ps, rel, path, sizeof(path));
	if (!rc && rmdir(path) && errno != ENOENT)
		rc = -errno;
	if (rc)
		return rc;
	ckpt_node_remove_kid(dir, n);
	atomic_store(&n->orphan, true);
	return 0;
}

/* Orbax's COMMIT_FILE mode saves into "S" itself: mkdir MNT/S starts a
 * .npy step, and the first thing only a live Orbax save makes turns it into
 * one stored as written (aw_convert): a TensorStore lock file ("*.__lock")
 * or the step's _CHECKPOINT_METADATA without a commit time (a copy of a
 * committed step has neither: its lock files are gone and its metadata
 * carries the commit time).  Every folder and file made so far
 * goes to the tmp folder as written (the buffered metadata, marker and
 * JSON files too); a step holding .npy arrays is not converted (-EINVAL).
 * The close of its commit_success.txt then commits it (Orbax writes it
 * last, after every item's). */

/* A pending file that holds .npy or safetensors data (not convertible). */
static int aw_npy_kid(struct node *dir)
{
	struct dir_node *d = to_dir(dir);
	for (size_t i = 0; i < d->nkids; i++) {
		struct node *k = d->kids[i];
		if (k->kind == N_PDIR && aw_npy_kid(k))
			return 1;
		if (k->kind == N_PFILE) {
			struct pfile *pf = &to_pfile(k)->pf;
			if (pf->arr || pf->is_slice || pf->is_st || pf->is_index ||
			    (!pf->is_raw && !buffered(pf)))
				return 1;
		}
	}
	return 0;
}

/* Put dir's folders and buffered files in the tmp folder (io_lock exclusive). */
static int aw_spill(ckpt_view *v, struct node *dir)
{
	struct dir_node *d = to_dir(dir);
	struct pstep *ps = to_pdir(dir)->ps;
	int rc = 0;
	for (size_t i = 0; i < d->nkids && !rc; i++) {
		struct node *k = d->kids[i];
		char rel[VIEW_PATH_MAX], path[VIEW_PATH_MAX];
		rc = rel_of(v, dir, k->name, rel, sizeof(rel));
		if (!rc)
			rc = tmp_file(ps, rel, path, sizeof(path));
		if (rc)
			break;
		if (k->kind == N_PDIR) {
			to_pdir(k)->stored = 0; /* its files are the step's own now */
			if (mkdir(path, 0755) && errno != EEXIST)
				rc = -errno;
			if (!rc)
				rc = aw_spill(v, k);
			continue;
		}
		struct pfile *pf = &to_pfile(k)->pf;
		ckpt_lock(&pf->mu, CKPT_RANK_PF);
		if (!pf->is_raw) {
			int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
			rc = fd < 0	? -errno
			     : pf->size ? ckpt_pwrite_all(fd, pf->hdr, (size_t)pf->size, 0)
					: 0;
			if (fd >= 0) {
				raw_note_stat(pf, fd);
				close(fd);
			}
		}
		if (!rc) {
			pf->is_raw = 1;
			pf->is_json = pf->is_meta = pf->is_marker = 0;
			free(pf->rel);
			pf->rel = NULL; /* the path follows renames from now on */
		}
		ckpt_unlock(&pf->mu, CKPT_RANK_PF);
		if (rc)
			ckpt_log(CKPT_LOG_ERR, "%s: cannot put it in the tmp folder: %s", rel, strerror(-rc));
	}
	return rc;
}

/* Pending step sn becomes an Orbax save in COMMIT_FILE mode (ns_lock
 * exclusive); why: what showed it. */
static int aw_convert(ckpt_view *v, struct node *sn, const char *why)
{
	struct pstep *ps = to_pdir(sn)->ps;
	if (ps->as_written)
		return 0;
	if (ckpt_hosts_is_multi(ps->step)) {
		ckpt_log(CKPT_LOG_ERR,
			 "step %s: %s: an Orbax save through a mount with process_count is not supported",
			 sn->name, why);
		return -EPERM;
	}
	if (aw_npy_kid(sn)) {
		ckpt_log(CKPT_LOG_ERR, "step %s: %s is Orbax's, but the step holds .npy arrays", sn->name,
			 why);
		return -EINVAL;
	}
	ckpt_wrlock(&ps->io_lock, CKPT_RANK_IO);
	int rc = ckpt_step_set_as_written(ps->step);
	if (!rc)
		rc = aw_spill(v, sn);
	if (!rc) {
		ps->as_written = 1;
		ps->commit_file = 1;
		ps->commit_wanted = 0;
	}
	ckpt_rwunlock(&ps->io_lock, CKPT_RANK_IO);
	if (!rc)
		ckpt_log(CKPT_LOG_INFO, "step %s: an Orbax save (%s): stored as written, committed by its %s",
			 sn->name, why, CKPT_ORBAX_COMMIT_SUCCESS);
	return rc;
}

/* Step-level _CHECKPOINT_METADATA of a live Orbax save: no commit time. */
static int aw_fresh_meta(struct pfile *pf)
{
	ckpt_lock(&pf->mu, CKPT_RANK_PF);
	cJSON *j = pf->hdr ? cJSON_ParseWithLength((const char *)pf->hdr, (size_t)pf->size) : NULL;
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "commit_timestamp_nsecs");
	int fresh = cJSON_IsObject(j) && cJSON_IsNull(c);
	cJSON_Delete(j);
	return fresh;
}

int ckpt_view_mkdir(ckpt_view *v, ckpt_ino parent, const char *name, ckpt_attr *out)
{
	if (ckpt_latest_is(v, parent, name))
		return ckpt_latest_refuse("make a folder");
	ckpt_wrlock(&v->ns_lock, CKPT_RANK_NS);
	struct node *dir = ckpt_node_at(v, parent);
	int rc = 0;
	if (!dir) {
		rc = -ENOENT;
	} else if (dir->ino == CKPT_ROOT_INO && v->writable) {
		rc = new_step(v, dir, name, out);
	} else if ((dir->kind == N_PSTEP || dir->kind == N_PDIR) && !frozen(to_pdir(dir)->ps) &&
		   !atomic_load(&dir->orphan) && to_pdir(dir)->ps->as_written) {
		rc = aw_mkdir(v, dir, name, out);
	} else if ((dir->kind == N_PSTEP || dir->kind == N_PDIR) && !frozen(to_pdir(dir)->ps) &&
		   !atomic_load(&dir->orphan)) {
		struct pstep *ps = to_pdir(dir)->ps;
		const char *why = "";
		char key[VIEW_NAME_BUF];
		struct node *jf =
			dir->kind == N_PDIR ? ckpt_node_find_kid(dir, ckpt_step_json_file(dir->name)) : NULL;
		if (dir->kind == N_PSTEP && !ckpt_orbax_name_ok(CKPT_NAME_ITEM, name, &why)) {
			ckpt_log(CKPT_LOG_ERR, "%s: not a valid item name (%s)", name, why);
			rc = -EINVAL;
		} else if (dir->kind == N_PDIR && !(item_of(v, dir) && to_pdir(item_of(v, dir))->stored) &&
			   (rc = key_of_name(name, key, sizeof(key))) < 0) {
			/* logged */
		} else if (jf && jf->kind == N_PFILE && to_pfile(jf)->pf.is_json) {
			ckpt_log(CKPT_LOG_ERR, "%s: %s is a JSON item: it holds only %s", name, dir->name,
				 jf->name);
			rc = -EINVAL;
		} else if (ckpt_node_find_kid(dir, name)) {
			rc = -EEXIST;
		} else if (dir->kind == N_PDIR && item_of(v, dir) && to_pdir(item_of(v, dir))->is_views &&
			   (dir != item_of(v, dir) || ps->views_import)) {
			/* view import: one folder STEP/.views/NAME/, files only */
			ckpt_log(CKPT_LOG_ERR, "%s: a view import is one folder %s/NAME/ of files", name,
				 CKPT_VIEWS_DIR);
			rc = -EPERM;
		} else if (dir->kind == N_PDIR && to_pdir(dir)->is_views &&
			   (rc = ckpt_vimport_check(v, parent_of(v, dir)->name, name)) < 0) {
			/* logged: no such recipe, or one that does not invert */
		} else {
			if (dir->kind == N_PDIR && to_pdir(dir)->is_views)
				ps->views_import = 1;
			rc = dir->kind == N_PSTEP ? ckpt_step_add_item(ps->step, name) : 0;
			struct node *n = rc == 0 ? ckpt_node_new(v, &pdir_ops, name, dir) : NULL;
			if (n) /* shards of a safetensors import (before publication) */
				to_pdir(n)->is_stdir = dir->kind == N_PDIR &&
						       has_suffix(name, ST_DIR_SUFFIX) &&
						       !(item_of(v, dir) && to_pdir(item_of(v, dir))->stored);
			if (rc == 0 && (!n || ckpt_node_add_kid(dir, n) < 0))
				rc = -ENOMEM;
			if (rc == 0) {
				to_pdir(n)->ps = ps;
				ckpt_node_fill_attr(v, n, out);
				note_writer(ps);
			}
		}
	} else {
		rc = refuse(name, "make a directory");
	}
	ckpt_rwunlock(&v->ns_lock, CKPT_RANK_NS);
	return rc;
}

/*
 * Commit pending step node `sn` as `final`; replaces it in the root.
 * Called with ns_lock exclusive; drops it while the writer commits (under
 * the step's io_lock) and the committed folder is read back, and holds it
 * again on return.
 */
static int check_stored(ckpt_view *v, struct node *sn, int quiet);

/* Object store: send the staged copy of the step committed as `final`,
 * marker last (upload.h says what each result means).  The staged copy
 * goes, unless the marker's outcome is unknown (-EINPROGRESS): a settle
 * sends it again. */
static int send_staged(ckpt_view *v, struct pstep *ps, const char *final, ckpt_bg_upload *done, int settle)
{
	char staged[VIEW_PATH_MAX];
	snprintf(staged, sizeof(staged), "%s/%s", v->opts.spool_dir, final);
	int rc = ckpt_store_upload_tree_rest(v->src, staged, final, ps->up_threads, done, settle);
	if (rc != -EINPROGRESS)
		ckpt_rmtree(staged);
	return rc;
}

/* A sent step (SEALED or UNSETTLED) whose upload did not commit it: say
 * what is true and move on (LOST, or UNSETTLED).  ns_lock exclusive held;
 * returns the errno for the caller (-EEXIST, or -EIO). */
static int sent_outcome(struct pstep *ps, const char *name, const char *final, int rc)
{
	if (rc == -EINPROGRESS) {
		if (atomic_load(&ps->state) != PS_UNSETTLED) {
			char *u = strdup(final);
			if (!u) { /* cannot settle it later: it stays unknown to this mount */
				ckpt_log(CKPT_LOG_ERR, "step %s: out of memory", name);
				ps_set(ps, PS_LOST);
				return -EIO;
			}
			ps->unsettled = u;
			ps_set(ps, PS_UNSETTLED);
			CKPT_STAT_ADD(unsettled_steps, 1);
		}
		ckpt_log(
			CKPT_LOG_ERR,
			"step %s: whether its commit marker landed is unknown; every object sent is kept and "
			"the step stays pending (ckptfs status counts it): touch %s/%s again to find out",
			name, name, CKPT_ORBAX_COMMIT_SUCCESS);
		return -EIO;
	}
	if (atomic_load(&ps->state) == PS_UNSETTLED)
		CKPT_STAT_ADD(unsettled_steps, -1);
	ps_set(ps, PS_LOST);
	if (rc == -EEXIST)
		ckpt_log(
			CKPT_LOG_ERR,
			"step %s: %s was committed by someone else meanwhile; what is in the store is theirs "
			"(nothing was deleted): rmdir this one",
			name, final);
	else
		ckpt_log(CKPT_LOG_ERR,
			 "step %s: upload failed: %s; its marker is not in the store and what was sent is "
			 "deleted: nothing of the step is kept: rmdir it and write it again",
			 name, strerror(-rc));
	return rc;
}

static int swap_committed(ckpt_view *v, struct node *sn, struct node *n, const char *path, const char *final,
			  struct node **committed);

static int commit_step(ckpt_view *v, struct node *sn, const char *final, int copy, struct node **committed)
{
	struct node *root = ckpt_node_at(v, CKPT_ROOT_INO);
	struct pstep *ps = to_pdir(sn)->ps;
	assert(sn->kind == N_PSTEP && sn->parent == CKPT_ROOT_INO && !frozen(ps) &&
	       !atomic_load(&sn->orphan));
	if ((strcmp(sn->name, final) && ckpt_node_find_kid(root, final)) || ckpt_name_reserved(root, final)) {
		ckpt_log(CKPT_LOG_ERR, "step %s: cannot commit as %s: that step exists", sn->name, final);
		return -EEXIST;
	}
	assert_pstep(ps);
	ps->final = final;
	ps_set(ps, PS_COMMITTING);
	ckpt_rwunlock(&v->ns_lock, CKPT_RANK_NS);

	ckpt_wrlock(&ps->io_lock, CKPT_RANK_IO);
	/* Shards uploaded while writing: wait for them before the tmp folder
	 * is renamed; a failed one fails the commit (its objects are deleted,
	 * a retried commit sends everything). */
	int rc = ps->bg ? ckpt_bg_upload_drain(ps->bg) : 0;
	if (rc == 0)
		rc = check_stored(v, sn, copy); /* a copy not whole yet: -EAGAIN, quietly */
	if (rc == 0 && ps->views_import) /* STEP/.views/NAME/ staged: its arrays now */
		rc = ckpt_vimport_commit(v, ps->step, sn->name);
	if (rc == 0)
		rc = ckpt_hosts_commit(ps->step, final);
	if (rc == 0) {
		ps_set(ps, PS_SEALED);
		/* The committed folder is all that is left of the step: free the
		 * writer's buffers now, not at unmount (a training job commits a
		 * step every few minutes).  Its orphaned files answer ESTALE. */
		ckpt_step_destroy(ps->step);
		ps->step = NULL;
	}
	ckpt_rwunlock(&ps->io_lock, CKPT_RANK_IO);
	if (rc == 0 && v->opts.spool_dir) { /* object store: send the staged step, marker last */
		/* only what the step's sink did not send yet (same key prefix) */
		ckpt_bg_upload *done = ps->bg && !strcmp(sn->name, final) ? ps->bg : NULL;
		if (ps->bg && !done) { /* sent under another name: take those back */
			ckpt_bg_upload_free(ps->bg, 1);
			ps->bg = NULL;
		}
		rc = send_staged(v, ps, final, done, 0);
		if (ps->bg) { /* the commit's upload took back what was sent if it failed */
			ckpt_bg_upload_free(ps->bg, 0);
			ps->bg = NULL;
		}
	}
	char path[VIEW_PATH_MAX];
	snprintf(path, sizeof(path), "%s/%s", v->source, final);
	/* Read the committed step back (not linked yet: nobody sees it). */
	struct node *n = rc == 0 ? ckpt_layout_new_step(v, final) : NULL;

	ckpt_wrlock(&v->ns_lock, CKPT_RANK_NS);
	ps->final = NULL;
	if (rc < 0 && atomic_load(&ps->state) == PS_SEALED)
		return sent_outcome(ps, sn->name, final, rc);
	if (rc < 0) {
		ps_set(ps, PS_OPEN);
		if (rc != -EAGAIN)
			ckpt_log(CKPT_LOG_ERR, "step %s: commit failed: %s; the step stays pending", sn->name,
				 strerror(-rc));
		return rc;
	}
	return swap_committed(v, sn, n, path, final, committed);
}

/* Swap pending step sn (SEALED or UNSETTLED) for its committed node n
 * (NULL: it could not be read back).  ns_lock exclusive held. */
static int swap_committed(ckpt_view *v, struct node *sn, struct node *n, const char *path, const char *final,
			  struct node **committed)
{
	struct node *root = ckpt_node_at(v, CKPT_ROOT_INO);
	struct pstep *ps = to_pdir(sn)->ps;
	ckpt_node_remove_kid(root, sn);
	if (atomic_load(&ps->state) == PS_UNSETTLED)
		CKPT_STAT_ADD(unsettled_steps, -1);
	ps_set(ps, PS_COMMITTED);
	atomic_store(&sn->orphan, true);
	if (n)
		n->written_here = 1;
	if (!n || ckpt_node_add_kid(root, n) < 0) {
		ckpt_log(CKPT_LOG_ERR, "step %s: committed to %s but cannot be shown; remount to see it",
			 final, path);
		return -EIO;
	}
	ckpt_log(CKPT_LOG_INFO, "step %s: committed to %s", final, path);
	*committed = n;
	return 0;
}

/*
 * Find out whether the marker of UNSETTLED step sn landed: its staged copy
 * is sent again (marker last, a 412 found out), then the step is committed
 * (*committed: its node), lost, or still unsettled (-EIO).  Called with
 * ns_lock exclusive (from the marker's create); drops it while sending.
 */
static int settle_step(ckpt_view *v, struct node *sn, struct node **committed)
{
	struct pstep *ps = to_pdir(sn)->ps;
	if (ps->settling)
		return -EBUSY;
	ps->settling = 1;
	char *final = strdup(ps->unsettled);
	if (!final) {
		ps->settling = 0;
		return -ENOMEM;
	}
	ckpt_rwunlock(&v->ns_lock, CKPT_RANK_NS);
	int rc = send_staged(v, ps, final, NULL, 1);
	struct node *n = rc == 0 ? ckpt_layout_new_step(v, final) : NULL;
	char path[VIEW_PATH_MAX];
	snprintf(path, sizeof(path), "%s/%s", v->source, final);
	ckpt_wrlock(&v->ns_lock, CKPT_RANK_NS);
	ps->settling = 0;
	if (rc == 0)
		rc = swap_committed(v, sn, n, path, final, committed);
	else
		rc = sent_outcome(ps, sn->name, final, rc);
	free(final);
	return rc;
}

/* Key path of a file in a pending step: item = first directory below the
 * step, keys = the directories below it plus the file's stem. */
static int key_path(ckpt_view *v, struct node *dir, const char *stem, const char **item, const char **keys,
		    int *types, int *depth, char *kbuf)
{
	const char *rev[CKPT_ORBAX_MAX_DEPTH];
	int n = 0;
	rev[n++] = stem;
	struct node *d = dir;
	while (d && d->kind == N_PDIR && n < CKPT_ORBAX_MAX_DEPTH) {
		rev[n++] = d->name;
		d = parent_of(v, d);
	}
	if (!d || d->kind != N_PSTEP || n < 2)
		return -EINVAL;
	*item = rev[n - 1];
	*depth = n - 1;
	for (int i = 0; i < n - 1; i++) {
		/* the names are the read side's escapes of the keys */
		char *k = kbuf + (size_t)i * VIEW_NAME_BUF;
		int rc = key_of_name(rev[n - 2 - i], k, VIEW_NAME_BUF);
		if (rc < 0)
			return rc;
		keys[i] = k;
		int digits = keys[i][0] != 0;
		for (const char *p = keys[i]; *p; p++)
			digits &= *p >= '0' && *p <= '9';
		types[i] = digits ? CKPT_KEY_SEQ : CKPT_KEY_DICT;
	}
	return 0;
}

/* Multi-host: NAME.npy that another host declared (its declaration record,
 * writer_hosts.h) becomes a declared pending file here, as if its header
 * had been written on this mount.  ns_lock exclusive held; NULL if none. */
static struct pfile_node *adopt_decl(ckpt_view *v, struct node *dir, const char *base)
{
	const char *item, *keys[CKPT_ORBAX_MAX_DEPTH];
	int types[CKPT_ORBAX_MAX_DEPTH], depth;
	char stem[VIEW_NAME_BUF], hdr[CKPT_NPY_HEADER_MAX];
	size_t sl = strlen(base) - 4;
	ckpt_warray *arr;
	memcpy(stem, base, sl);
	stem[sl] = 0;
	char *kbuf = malloc((size_t)CKPT_ORBAX_MAX_DEPTH * VIEW_NAME_BUF);
	int rc = kbuf ? key_path(v, dir, stem, &item, keys, types, &depth, kbuf) : -ENOMEM;
	if (rc == 0)
		rc = ckpt_hosts_adopt(to_pdir(dir)->ps->step, item, keys, depth, &arr);
	free(kbuf);
	if (rc < 0)
		return NULL;
	ckpt_warray_info info;
	ckpt_warray_get_info(arr, &info);
	int hl = ckpt_npy_header(info.dtype, info.rank, info.shape, hdr, sizeof(hdr));
	struct pfile_node *f = hl > 0 ? pfile_node_new(v, dir, base) : NULL;
	if (!f)
		return NULL;
	struct node *n = &f->n;
	f->pf.hdr = malloc((size_t)hl);
	if (!f->pf.hdr || ckpt_node_add_kid(dir, n) < 0)
		return NULL;
	memcpy(f->pf.hdr, hdr, (size_t)hl);
	f->pf.arr = arr;
	ckpt_region_full(&f->pf.region, info.rank, info.shape);
	f->pf.have = f->pf.cap = f->pf.data_off = (size_t)hl;
	f->pf.size = (uint64_t)hl + info.nbytes;
	return f;
}

/* rsync writes NAME as ".NAME.XXXXXX" (six letters or digits) and renames
 * it when complete: the final name into buf, or NULL for any other name. */
static const char *temp_final(const char *name, char *buf, size_t cap)
{
	size_t len = strlen(name);
	if (len < 9 || name[0] != '.' || name[len - 7] != '.')
		return NULL;
	for (size_t i = len - 6; i < len; i++)
		if (!isalnum((unsigned char)name[i]))
			return NULL;
	size_t fl = len - 8;
	if (fl + 1 > cap || memchr(name + 1, 0, fl))
		return NULL;
	memcpy(buf, name + 1, fl);
	buf[fl] = 0;
	return buf;
}

/* Orbax's metadata files a copy of a step brings along (0 for any other
 * name): 2 for the step's commit marker, 1 for the others. */
static int copied_meta_kind(ckpt_view *v, struct node *dir, const char *eff)
{
	if (dir->kind == N_PSTEP)
		return !strcmp(eff, CKPT_ORBAX_COMMIT_SUCCESS) ? 2 : !strcmp(eff, CKPT_ORBAX_CKPT_METADATA);
	struct node *up = parent_of(v, dir);
	if (!up || up->kind != N_PSTEP)
		return 0;
	return !strcmp(eff, CKPT_ORBAX_METADATA) || !strcmp(eff, CKPT_ORBAX_SHARDING) ||
	       !strcmp(eff, CKPT_ORBAX_COMMIT_SUCCESS);
}

/* Kids of a pending directory other than copied metadata files. */
static size_t content_kids(struct node *dir)
{
	struct dir_node *d = to_dir(dir);
	size_t k = 0;
	for (size_t i = 0; i < d->nkids; i++)
		k += !(d->kids[i]->kind == N_PFILE && to_pfile(d->kids[i])->pf.is_meta);
	return k;
}

static int new_pfile_as(ckpt_view *v, struct node *dir, const char *name, const char *eff, struct node **out);

static int new_pfile(ckpt_view *v, struct node *dir, const char *name, struct node **out)
{
	if (!to_pdir(dir)->ps->as_written && has_suffix(name, CKPT_ORBAX_LOCK_SUFFIX)) {
		struct node *sn = dir;
		while (sn && sn->kind != N_PSTEP)
			sn = parent_of(v, sn);
		int rc = sn ? aw_convert(v, sn, name) : -EINVAL;
		if (rc)
			return rc;
	}
	if (to_pdir(dir)->ps->as_written)
		return aw_create(v, dir, name, out);
	if (dir->kind == N_PDIR && to_pdir(dir)->is_views) { /* view import: files go in .views/NAME/ */
		ckpt_log(CKPT_LOG_ERR, "%s: a view import is one folder %s/NAME/ of files", name,
			 CKPT_VIEWS_DIR);
		return -EPERM;
	}
	char fbuf[VIEW_NAME_BUF];
	const char *fin = temp_final(name, fbuf, sizeof(fbuf));
	const char *eff = fin ? fin : name;
	struct node *it = dir->kind == N_PDIR ? item_of(v, dir) : NULL;
	struct node *up = parent_of(v, dir);
	int meta = it && to_pdir(it)->stored ? 0 : copied_meta_kind(v, dir, eff);
	size_t el = strlen(eff);
	int npy = el > 4 && !strcmp(eff + el - 4, ".npy");
	int json = up && up->kind == N_PSTEP && !strcmp(eff, ckpt_step_json_file(dir->name));
	int stdir = dir->kind == N_PDIR && to_pdir(dir)->is_stdir;
	int st = it && !to_pdir(it)->stored && !meta && has_suffix(eff, ST_SUFFIX);
	int index = stdir && !strcmp(eff, CKPT_ST_INDEX_NAME);
	if (stdir && !st && !index) {
		ckpt_log(CKPT_LOG_ERR, "%s: %s holds only *.safetensors shards and %s", name, dir->name,
			 CKPT_ST_INDEX_NAME);
		return -EPERM;
	}
	if (st || index) {
		struct pfile_node *f = pfile_node_new(v, dir, name);
		if (!f)
			return -ENOMEM;
		struct node *n = &f->n;
		f->pf.is_st = st;
		f->pf.is_index = index;
		if (fin && !(f->pf.final = strdup(fin)))
			return -ENOMEM;
		*out = n;
		return 0;
	}
	if (it && !meta && !npy && !json) {
		int rc = make_stored(v, it, eff);
		if (rc < 0)
			return rc;
	}
	if (it && to_pdir(it)->stored) {
		char rel[VIEW_PATH_MAX];
		int rc = rel_of(v, dir, eff, rel, sizeof(rel));
		struct pstep *ps = to_pdir(dir)->ps;
		if (!rc)
			rc = make_dirs(ps, rel);
		int fd = rc ? rc : raw_open(ps, rel, O_WRONLY | O_CREAT | O_TRUNC);
		if (fd < 0) {
			ckpt_log(CKPT_LOG_ERR, "%s: cannot create it in the tmp folder: %s", rel,
				 strerror(-fd));
			return fd;
		}
		close(fd);
		struct pfile_node *f = pfile_node_new(v, dir, name);
		if (!f)
			return -ENOMEM;
		struct node *n = &f->n;
		f->pf.is_raw = 1;
		if (!(f->pf.rel = strdup(rel)) || (fin && !(f->pf.final = strdup(fin))))
			return -ENOMEM;
		*out = n;
		return 0;
	}
	if (!meta && dir->kind == N_PSTEP) {
		ckpt_log(CKPT_LOG_ERR, "%s: files go in an item directory (mkdir %s/ITEM first)", name,
			 dir->name);
		return -EPERM;
	}
	struct node *n = NULL;
	int rc = 0;
	if (meta) {
		struct pfile_node *f = pfile_node_new(v, dir, name);
		if (!f)
			return -ENOMEM;
		n = &f->n;
		f->pf.is_marker = meta == 2;
		f->pf.is_meta = meta == 1;
	} else if ((rc = new_pfile_as(v, dir, name, eff, &n)) < 0) {
		return rc;
	}
	if (fin && !(to_pfile(n)->pf.final = strdup(fin)))
		return -ENOMEM; /* the node is unlinked: freed with the view */
	*out = n;
	return 0;
}

static int new_pfile_as(ckpt_view *v, struct node *dir, const char *name, const char *eff, struct node **out)
{
	size_t len = strlen(eff);
	struct node *up = parent_of(v, dir);
	struct pstep *ps = to_pdir(dir)->ps;
	if (up && up->kind == N_PSTEP && !strcmp(eff, ckpt_step_json_file(dir->name))) {
		/* The JSON file of a JSON item (Orbax's JsonCheckpointHandler). */
		if (content_kids(dir)) {
			ckpt_log(CKPT_LOG_ERR, "%s/%s: a JSON item holds only its JSON file", dir->name, eff);
			return -EINVAL;
		}
		int rc = ckpt_step_set_json(ps->step, dir->name, "", 0);
		if (rc < 0)
			return rc;
		struct pfile_node *f = pfile_node_new(v, dir, name);
		if (!f) {
			ckpt_step_set_json(ps->step, dir->name, NULL, 0);
			return -ENOMEM;
		}
		struct node *n = &f->n;
		f->pf.is_json = 1;
		*out = n;
		return 0;
	}
	struct node *jf =
		up && up->kind == N_PSTEP ? ckpt_node_find_kid(dir, ckpt_step_json_file(dir->name)) : NULL;
	if (jf && jf->kind == N_PFILE && to_pfile(jf)->pf.is_json) {
		ckpt_log(CKPT_LOG_ERR, "%s: %s is a JSON item: it holds only %s", eff, dir->name, jf->name);
		return -EINVAL;
	}
	if (len < 5 || strcmp(eff + len - 4, ".npy")) {
		ckpt_log(CKPT_LOG_ERR,
			 "%s: only NAME.npy arrays (or NAME[slice].npy) can be written in a pending step",
			 eff);
		return -EPERM;
	}
	const char *br = strchr(eff, '[');
	struct pfile_node *decl = NULL;
	ckpt_region region = { 0 };
	if (br) {
		char base[VIEW_NAME_BUF];
		size_t stem = len - 4;
		if ((size_t)(br - eff) + 5 > sizeof(base) || eff[stem - 1] != ']') {
			ckpt_log(CKPT_LOG_ERR, "%s: malformed slice file name (want NAME[<slice>].npy)", eff);
			return -EINVAL;
		}
		memcpy(base, eff, (size_t)(br - eff));
		memcpy(base + (br - eff), ".npy", 5);
		struct node *dn = ckpt_node_find_kid(dir, base);
		decl = dn && dn->kind == N_PFILE ? to_pfile(dn) : NULL;
		if (!dn && ckpt_hosts_is_multi(to_pdir(dir)->ps->step))
			decl = adopt_decl(v, dir, base);
		ckpt_warray *darr = NULL;
		if (decl) {
			ckpt_lock(&decl->pf.mu, CKPT_RANK_PF);
			darr = decl->pf.arr;
			ckpt_unlock(&decl->pf.mu, CKPT_RANK_PF);
		}
		if (!darr) {
			ckpt_log(CKPT_LOG_ERR, "%s: %s is not declared yet (write its .npy header first)",
				 eff, base);
			return -ENOENT;
		}
		ckpt_warray_info info;
		ckpt_warray_get_info(darr, &info);
		const char *why = "";
		int rc =
			ckpt_slice_parse(br, stem - (size_t)(br - eff), info.rank, info.shape, &region, &why);
		if (rc < 0) {
			ckpt_log(CKPT_LOG_ERR, "%s: %s", eff, why);
			return rc == -ERANGE ? -EINVAL : rc;
		}
	}
	if (!br) {
		char stem[VIEW_NAME_BUF], key[VIEW_NAME_BUF];
		memcpy(stem, eff, len - 4);
		stem[len - 4] = 0;
		int rc = key_of_name(stem, key, sizeof(key));
		if (rc < 0)
			return rc;
	}
	struct pfile_node *f = pfile_node_new(v, dir, name);
	if (!f)
		return -ENOMEM;
	struct node *n = &f->n;
	if (decl) {
		f->pf.is_slice = 1;
		f->pf.decl = decl;
		atomic_fetch_add(&decl->pf.nslices, 1);
		f->pf.region = region;
		f->pf.arr = NULL; /* set when this file's own header has been checked */
		n->hidden = 1; /* slice files are hidden names */
	}
	*out = n;
	return 0;
}

/* ---- when a step commits -------------------------------------------------
 *
 * A step commits when its commit_success.txt exists AND the step is
 * complete; the order in which a tool creates files does not matter:
 *   - `touch MNT/30/commit_success.txt` (the marker closed with no byte
 *     written by that open) asks for the commit now: it happens at the
 *     close, which returns when the step is durable or fails with the
 *     reason (the step stays pending);
 *   - a marker written with bytes (a copy of another step's marker: cp,
 *     tar, rsync, shutil) asks for the commit once the step is complete:
 *     the close returns 0 at once, and the flush or rename that completes
 *     the step commits it (and returns the commit's error, if any).
 * Complete (step_check): at least one item; every .npy created has its
 * header and every byte; every item named in a copied _CHECKPOINT_METADATA
 * is there and every array leaf named in a copied item _METADATA has been
 * written; for a copy, no file is still being written or waits under a
 * temporary name, and the copied _CHECKPOINT_METADATA has arrived.
 */

struct check {
	ckpt_view *v;
	struct pstep *ps;
	int copy; /* judged for a copy: unfinished files and a missing description wait */
	int log; /* log the first reason (an explicit commit) */
	int items; /* items with content */
	int rc;
};

static void check_fail(struct check *c, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void check_fail(struct check *c, int rc, const char *fmt, ...)
{
	if (c->rc)
		return;
	c->rc = rc;
	if (!c->log)
		return;
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	ckpt_log(CKPT_LOG_ERR, "%s", msg);
}

/* A pending file of the step, for step_check (ns_lock held). */
static void check_file(struct check *c, struct node *dir, struct pfile_node *f)
{
	struct pfile *pf = &f->pf;
	ckpt_lock(&pf->mu, CKPT_RANK_PF);
	int dirty = pf->dirty, hdr = pf->arr != NULL, slice = pf->is_slice, buf = buffered(pf) || pf->is_raw;
	ckpt_warray *arr = pf->arr;
	int st = pf->is_st, st_hdr = pf->data_off != 0;
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	if (st) {
		if (c->copy && dirty)
			check_fail(c, -EBUSY, "%s/%s: still being copied", dir->name, f->n.name);
		else if (!st_hdr)
			check_fail(c, -ENODATA,
				   "%s/%s: created, but its safetensors header was never completed",
				   dir->name, f->n.name);
		for (size_t i = 0; c->copy && st_hdr && !c->rc && i < pf->nst; i++) {
			ckpt_warray_info info;
			ckpt_warray_get_info(pf->st_arr[i], &info);
			if (info.bytes_written < info.nbytes)
				check_fail(c, -ENODATA, "%s/%s: tensor %s not written yet", dir->name,
					   f->n.name, pf->st[i].name);
		}
		return;
	}
	if (c->copy && (dirty || pf->final)) {
		check_fail(c, -EBUSY, "%s/%s: still being copied", dir->name, f->n.name);
		return;
	}
	if (buf)
		return;
	if (!hdr) {
		check_fail(c, -ENODATA,
			   "%s/%s: created, but its .npy header was never completed (write the file again, "
			   "or rm it)",
			   dir->name, f->n.name);
		return;
	}
	if (c->copy && !slice) {
		ckpt_warray_info info;
		ckpt_warray_get_info(arr, &info);
		if (info.bytes_written < info.nbytes)
			check_fail(c, -ENODATA, "%s/%s: %llu of %llu bytes not written yet", dir->name,
				   f->n.name, (unsigned long long)(info.nbytes - info.bytes_written),
				   (unsigned long long)info.nbytes);
	}
}

/* Every tensor the index of an X.safetensors.d/ names was in a shard. */
static void check_index(struct check *c, struct node *stdir)
{
	struct node *ix = ckpt_node_find_kid(stdir, CKPT_ST_INDEX_NAME);
	if (!ix || ix->kind != N_PFILE)
		return;
	struct pfile *pf = &to_pfile(ix)->pf;
	ckpt_lock(&pf->mu, CKPT_RANK_PF);
	cJSON *j = pf->hdr ? cJSON_ParseWithLength((const char *)pf->hdr, (size_t)pf->size) : NULL;
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	if (!j) {
		check_fail(c, c->copy ? -EBUSY : -EINVAL, "%s/%s: not JSON", stdir->name, CKPT_ST_INDEX_NAME);
		return;
	}
	const char *item, *keys[CKPT_ORBAX_MAX_DEPTH];
	int types[CKPT_ORBAX_MAX_DEPTH], depth;
	char stem[VIEW_NAME_BUF];
	size_t sl = strlen(stdir->name) - strlen(ST_DIR_SUFFIX);
	memcpy(stem, stdir->name, sl);
	stem[sl] = 0;
	char *kbuf = malloc((size_t)CKPT_ORBAX_MAX_DEPTH * VIEW_NAME_BUF);
	int rc = kbuf ? key_path(c->v, parent_of(c->v, stdir), stem, &item, keys, types, &depth, kbuf)
		      : -ENOMEM;
	const cJSON *t;
	cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(j, "weight_map"))
	{
		if (rc || c->rc)
			break;
		char *nb = strdup(t->string);
		int d = depth;
		for (char *p = nb, *q; p && d < CKPT_ORBAX_MAX_DEPTH; p = q) {
			q = strchr(p, '.');
			if (q)
				*q++ = 0;
			keys[d++] = p;
		}
		if (nb && !ckpt_step_find_array(c->ps->step, item, keys, d))
			check_fail(c, -ENODATA, "%s: tensor %s (named in %s, file %s) is in no shard written",
				   stdir->name, t->string, CKPT_ST_INDEX_NAME,
				   cJSON_IsString(t) ? t->valuestring : "?");
		free(nb);
	}
	free(kbuf);
	cJSON_Delete(j);
}

static void check_dir(struct check *c, struct node *dir, int *content)
{
	struct dir_node *d = to_dir(dir);
	for (size_t i = 0; i < d->nkids && !c->rc; i++) {
		struct node *k = d->kids[i];
		if (k->kind == N_PDIR) {
			check_dir(c, k, content);
			if (to_pdir(k)->is_stdir && !c->rc)
				check_index(c, k);
		} else if (k->kind == N_PFILE) {
			struct pfile *pf = &to_pfile(k)->pf;
			if (!pf->is_meta && !pf->is_marker && !pf->is_index)
				*content = 1;
			check_file(c, dir, to_pfile(k));
		}
	}
}

/* The content of a copied metadata file `name` in dir, parsed; NULL if
 * there is none.  *bad is set when it is there but not JSON. */
static cJSON *copied_json(struct node *dir, const char *name, int *bad)
{
	struct node *k = ckpt_node_find_kid(dir, name);
	*bad = 0;
	if (!k || k->kind != N_PFILE || !to_pfile(k)->pf.is_meta)
		return NULL;
	struct pfile *pf = &to_pfile(k)->pf;
	ckpt_lock(&pf->mu, CKPT_RANK_PF);
	cJSON *j = pf->hdr ? cJSON_ParseWithLength((const char *)pf->hdr, (size_t)pf->size) : NULL;
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	*bad = j == NULL;
	return j;
}

/* Value types of _METADATA leaves that are arrays in the tree. */
static int array_leaf(const cJSON *leaf)
{
	const cJSON *vm = cJSON_GetObjectItemCaseSensitive(leaf, "value_metadata");
	const cJSON *t = cJSON_GetObjectItemCaseSensitive(vm, "value_type");
	if (!cJSON_IsString(t))
		return 1;
	return !strcmp(t->valuestring, "jax.Array") || !strcmp(t->valuestring, "np.ndarray") ||
	       !strcmp(t->valuestring, "scalar");
}

/* Every array leaf that item `it`'s copied _METADATA names was written. */
static void check_item_meta(struct check *c, struct node *it)
{
	int bad;
	cJSON *j = copied_json(it, CKPT_ORBAX_METADATA, &bad);
	if (bad) {
		check_fail(c, c->copy ? -EBUSY : -EINVAL, "%s/%s: the copied file is not JSON", it->name,
			   CKPT_ORBAX_METADATA);
		return;
	}
	const cJSON *tm = cJSON_GetObjectItemCaseSensitive(j, "tree_metadata");
	const cJSON *leaf;
	cJSON_ArrayForEach(leaf, tm)
	{
		if (c->rc)
			break;
		const cJSON *km = cJSON_GetObjectItemCaseSensitive(leaf, "key_metadata");
		const char *keys[CKPT_ORBAX_MAX_DEPTH];
		int depth = 0;
		const cJSON *k;
		cJSON_ArrayForEach(k, km)
		{
			const cJSON *key = cJSON_GetObjectItemCaseSensitive(k, "key");
			if (depth < CKPT_ORBAX_MAX_DEPTH && cJSON_IsString(key))
				keys[depth++] = key->valuestring;
		}
		if (!depth || !array_leaf(leaf))
			continue;
		ckpt_warray *a = ckpt_step_find_array(c->ps->step, it->name, keys, depth);
		ckpt_warray_info info = { 0 };
		if (a)
			ckpt_warray_get_info(a, &info);
		if (!a)
			check_fail(c, -ENODATA, "%s: %s (named in the copied %s) was never written", it->name,
				   leaf->string ? leaf->string : "a leaf", CKPT_ORBAX_METADATA);
		else if (info.bytes_written < info.nbytes)
			check_fail(c, -ENODATA, "%s: %s (named in the copied %s): %llu bytes not written",
				   it->name, leaf->string ? leaf->string : "a leaf", CKPT_ORBAX_METADATA,
				   (unsigned long long)(info.nbytes - info.bytes_written));
	}
	cJSON_Delete(j);
}

/* 0 when pending step sn may commit now, else why not (-errno; the first
 * reason logged when `log`).  ns_lock held. */
static int step_check(ckpt_view *v, struct node *sn, int copy, int log)
{
	struct check c = { v, to_pdir(sn)->ps, copy, log, 0, 0 };
	struct dir_node *d = to_dir(sn);
	for (size_t i = 0; i < d->nkids && !c.rc; i++) {
		struct node *k = d->kids[i];
		if (k->kind == N_PFILE) {
			check_file(&c, sn, to_pfile(k));
		} else if (k->kind == N_PDIR) {
			int content = 0;
			check_dir(&c, k, &content);
			c.items += content;
			if (!c.rc)
				check_item_meta(&c, k);
		}
	}
	int bad;
	cJSON *cm = copied_json(sn, CKPT_ORBAX_CKPT_METADATA, &bad);
	if (bad)
		check_fail(&c, copy ? -EBUSY : -EINVAL, "step %s: the copied %s is not JSON", sn->name,
			   CKPT_ORBAX_CKPT_METADATA);
	else if (!cm && copy)
		check_fail(&c, -EBUSY, "step %s: waiting for the copy's %s", sn->name,
			   CKPT_ORBAX_CKPT_METADATA);
	const cJSON *ih = cJSON_GetObjectItemCaseSensitive(cm, "item_handlers");
	const cJSON *h;
	cJSON_ArrayForEach(h, ih)
	{
		struct node *it = h->string ? ckpt_node_find_kid(sn, h->string) : NULL;
		if (!it || it->kind != N_PDIR) {
			check_fail(&c, -ENODATA, "step %s: item %s (named in the copied %s) is missing",
				   sn->name, h->string ? h->string : "?", CKPT_ORBAX_CKPT_METADATA);
		} else if (copy) {
			/* a copy of the item is whole once its own description (or
			 * a JSON item's file) is there too */
			int json = cJSON_IsString(h) && strstr(h->valuestring, "JsonCheckpointHandler");
			const char *need = json ? ckpt_step_json_file(it->name) : CKPT_ORBAX_METADATA;
			if (!ckpt_node_find_kid(it, need))
				check_fail(&c, -EBUSY, "step %s: waiting for %s/%s", sn->name, it->name,
					   need);
		}
	}
	cJSON_Delete(cm);
	c.items += c.ps->views_import; /* the arrays a view import makes at the commit */
	if (!c.items)
		check_fail(
			&c, -EINVAL,
			"step %s: nothing to commit (no item holds an array or a JSON file; mkdir %s/state "
			"and write arrays into it)",
			sn->name, sn->name);
	return c.rc;
}

/* Carry what the copied metadata files mean into the writer: the item
 * handlers of _CHECKPOINT_METADATA and the shardings of each item's
 * _sharding (for arrays without one of their own).  ns_lock held. */
struct shard_ctx {
	const cJSON *sh;
};

static int apply_sharding(void *ctx, ckpt_warray *a)
{
	const cJSON *sh = ((struct shard_ctx *)ctx)->sh;
	ckpt_warray_info info;
	ckpt_warray_get_info(a, &info);
	if (info.sharding)
		return 0;
	char *key = ckpt_orbax_sharding_key(info.name);
	const cJSON *e = key ? cJSON_GetObjectItemCaseSensitive(sh, key) : NULL;
	free(key);
	if (cJSON_IsString(e))
		ckpt_warray_set_sharding(a, e->valuestring);
	return 0;
}

static void apply_copied_meta(struct node *sn)
{
	struct pstep *ps = to_pdir(sn)->ps;
	int bad;
	cJSON *cm = copied_json(sn, CKPT_ORBAX_CKPT_METADATA, &bad);
	const cJSON *ih = cJSON_GetObjectItemCaseSensitive(cm, "item_handlers"), *h;
	cJSON_ArrayForEach(h, ih)
	{
		struct node *it = h->string ? ckpt_node_find_kid(sn, h->string) : NULL;
		if (it && it->kind == N_PDIR && cJSON_IsString(h))
			ckpt_step_set_item_handler(ps->step, it->name, h->valuestring);
	}
	cJSON_Delete(cm);
	struct dir_node *d = to_dir(sn);
	for (size_t i = 0; i < d->nkids; i++) {
		struct node *it = d->kids[i];
		cJSON *sh = it->kind == N_PDIR ? copied_json(it, CKPT_ORBAX_SHARDING, &bad) : NULL;
		if (sh) {
			struct shard_ctx sc = { sh };
			ckpt_step_foreach_array(ps->step, it->name, apply_sharding, &sc);
		}
		cJSON_Delete(sh);
	}
}

static int has_stored(struct node *sn)
{
	struct dir_node *d = to_dir(sn);
	for (size_t i = 0; i < d->nkids; i++)
		if (d->kids[i]->kind == N_PDIR && to_pdir(d->kids[i])->stored)
			return 1;
	return 0;
}

static int try_commit(ckpt_view *v, struct node *sn, int copy);

#define COPY_IDLE_NS (2ull * 1000 * 1000 * 1000)

/* Every 100 ms: commit the copied steps with stored items whose copy tools
 * have exited.  Runs from the first need until the view goes. */
static void *copy_thread_main(void *arg)
{
	ckpt_view *v = arg;
	while (!atomic_load(&v->copy_stop)) {
		struct timespec ts = { 0, 100 * 1000 * 1000 };
		nanosleep(&ts, NULL);
		ckpt_wrlock(&v->ns_lock, CKPT_RANK_NS);
		struct node *root = ckpt_node_at(v, CKPT_ROOT_INO);
		for (int again = 1; again && !atomic_load(&v->copy_stop);) {
			again = 0;
			struct dir_node *d = to_dir(root);
			for (size_t i = 0; i < d->nkids; i++) {
				struct node *sn = d->kids[i];
				if (sn->kind != N_PSTEP || frozen(to_pdir(sn)->ps) ||
				    atomic_load(&sn->orphan))
					continue;
				struct pstep *ps = to_pdir(sn)->ps;
				/* the tools that copied it exited, or a writer that lives on
				 * (a program copying with shutil) has been idle a while */
				uint64_t idle = ckpt_now_ns() - atomic_load(&ps->last_op_ns);
				if (!ps->commit_wanted || !has_stored(sn) ||
				    (writers_alive(ps) && idle < COPY_IDLE_NS))
					continue;
				caller_pid = 0;
				from_copy_thread = 1;
				int rc = try_commit(v, sn, 1);
				from_copy_thread = 0;
				if (rc < 0)
					ps->commit_wanted = 0; /* logged; touch the marker to try again */
				again = 1; /* the root's kids changed */
				break;
			}
		}
		ckpt_rwunlock(&v->ns_lock, CKPT_RANK_NS);
	}
	return NULL;
}

/* ns_lock exclusive held. */
static void start_copy_thread(ckpt_view *v)
{
	if (v->copy_thread_on)
		return;
	atomic_store(&v->copy_stop, false);
	if (pthread_create(&v->copy_thread, NULL, copy_thread_main, v) == 0)
		v->copy_thread_on = 1;
	else
		ckpt_log(CKPT_LOG_ERR,
			 "cannot start the thread that commits stored copies: touch the marker");
}

void ckpt_pending_shutdown(ckpt_view *v)
{
	if (!v->copy_thread_on)
		return;
	atomic_store(&v->copy_stop, true);
	pthread_join(v->copy_thread, NULL);
	v->copy_thread_on = 0;
}

/* Commit sn if it may (copy: only when complete; else now or why not).
 * ns_lock exclusive held (commit_step drops and retakes it). */
static int try_commit(ckpt_view *v, struct node *sn, int copy)
{
	int rc = step_check(v, sn, copy, !copy);
	if (rc)
		return copy ? 0 : rc; /* a copy waits for its last file */
	if (copy && has_stored(sn) && !from_copy_thread && writers_alive(to_pdir(sn)->ps)) {
		/* Nothing says when a copy of stored files is whole but the end
		 * of the tool that copies them. */
		start_copy_thread(v);
		return 0;
	}
	apply_copied_meta(sn);
	struct node *step;
	rc = commit_step(v, sn, sn->name, copy, &step);
	return copy && rc == -EAGAIN ? 0 : rc;
}

/* Every array of a layout-built directory reads back whole; *arrays counts them. */
static int read_back(ckpt_view *v, struct node *dir, const char *item, uint8_t *buf, size_t cap, int *arrays)
{
	struct dir_node *d = to_dir(dir);
	for (size_t i = 0; i < d->nkids; i++) {
		struct node *k = d->kids[i];
		int rc = 0;
		if (k->kind == N_DIR) {
			rc = read_back(v, k, item, buf, cap, arrays);
		} else if (k->kind == N_BROKEN) {
			ckpt_log(CKPT_LOG_ERR,
				 "%s/%s: the stored copy does not read back (the reason is above)", item,
				 k->name);
			rc = -EIO;
		} else if (k->kind == N_ARRAY) {
			ckpt_attr a;
			ckpt_node_fill_attr(v, k, &a);
			for (uint64_t off = 0; off < a.size && !rc;) {
				ssize_t n = k->ops->read(v, k, off, cap, buf);
				if (n <= 0)
					rc = n < 0 ? (int)n : -EIO;
				else
					off += (uint64_t)n;
			}
			if (rc)
				ckpt_log(CKPT_LOG_ERR, "%s/%s: the stored copy does not read back: %s", item,
					 k->name, strerror(-rc));
			(*arrays)++;
		}
		if (rc)
			return rc;
	}
	return 0;
}

/* Each stored copy of step sn reads back whole: every array its _METADATA
 * names decodes (an item without _METADATA, which Orbax's PyTree handler
 * always writes, is taken as it is).  -EAGAIN when `quiet` (a copy still
 * in progress: nothing logged), else the error, logged.  Runs in the
 * commit, without ns_lock (the step is frozen). */
static int check_stored(ckpt_view *v, struct node *sn, int quiet)
{
	struct dir_node *d = to_dir(sn);
	struct pstep *ps = to_pdir(sn)->ps;
	int rc = 0;
	for (size_t i = 0; i < d->nkids && !rc; i++) {
		struct node *it = d->kids[i];
		if (it->kind != N_PDIR || !to_pdir(it)->stored)
			continue;
		if (!ckpt_node_find_kid(it, CKPT_ORBAX_METADATA)) {
			/* Only an item of some other handler (named so in the copied
			 * _CHECKPOINT_METADATA) is kept without its _METADATA. */
			int bad;
			cJSON *cm = copied_json(sn, CKPT_ORBAX_CKPT_METADATA, &bad);
			const cJSON *h = cJSON_GetObjectItemCaseSensitive(
				cJSON_GetObjectItemCaseSensitive(cm, "item_handlers"), it->name);
			int other = cJSON_IsString(h) && !strstr(h->valuestring, "PyTreeCheckpointHandler") &&
				    !strstr(h->valuestring, "StandardCheckpointHandler") &&
				    !strstr(h->valuestring, "JsonCheckpointHandler");
			cJSON_Delete(cm);
			if (other)
				continue;
			if (quiet)
				return -EAGAIN;
			ckpt_log(
				CKPT_LOG_ERR,
				"step %s: item %s holds files that are not .npy arrays, and no %s: it is not "
				"an Orbax item (write arrays as NAME.npy, or copy a whole item folder)",
				sn->name, it->name, CKPT_ORBAX_METADATA);
			return -EINVAL;
		}
		ckpt_step_info info;
		ckpt_step_get_info(ps->step, &info);
		const char *tmp = strrchr(info.tmp_path, '/');
		char path[VIEW_PATH_MAX];
		snprintf(path, sizeof(path), "%s/%s", tmp ? tmp + 1 : info.tmp_path, it->name);
		int was = quiet ? ckpt_log_quiet(1) : 0;
		uint8_t *buf = malloc((size_t)1 << 20);
		struct node *n = buf ? ckpt_layout_new_item(v, path) : NULL;
		int arrays = 0;
		rc = n ? read_back(v, n, it->name, buf, (size_t)1 << 20, &arrays) : -ENOMEM;
		if (!rc && !arrays) {
			ckpt_log(CKPT_LOG_ERR, "step %s: the stored copy %s holds no array its %s names",
				 sn->name, it->name, CKPT_ORBAX_METADATA);
			rc = -EINVAL;
		}
		free(buf);
		if (quiet)
			ckpt_log_quiet(was);
		if (rc && quiet)
			rc = -EAGAIN;
	}
	return rc;
}

/* The pending step a pending node belongs to (ns_lock held), or NULL. */
static struct node *step_of(ckpt_view *v, struct node *n)
{
	while (n && n->kind != N_PSTEP && n->ino != CKPT_ROOT_INO)
		n = parent_of(v, n);
	return n && n->kind == N_PSTEP ? n : NULL;
}

int ckpt_view_flush(ckpt_view *v, ckpt_ino ino)
{
	ckpt_wrlock(&v->ns_lock, CKPT_RANK_NS);
	struct node *n = ckpt_node_at(v, ino);
	int rc = 0;
	if (n && n->kind == N_PFILE && atomic_load(&n->orphan)) {
		rc = to_pfile(n)->pf.is_marker ? to_pfile(n)->pf.commit_err : 0;
	} else if (n && n->kind == N_PFILE) {
		struct pfile_node *f = to_pfile(n);
		ckpt_lock(&f->pf.mu, CKPT_RANK_PF);
		int dirty = f->pf.dirty;
		f->pf.dirty = 0;
		ckpt_unlock(&f->pf.mu, CKPT_RANK_PF);
		struct node *sn = step_of(v, n);
		if (sn && !frozen(f->ps) && !atomic_load(&sn->orphan) && f->ps->as_written) {
			struct node *st;
			/* COMMIT_FILE: the step's own marker, written, commits */
			if (f->ps->commit_file && n->parent == sn->ino &&
			    !strcmp(n->name, CKPT_ORBAX_COMMIT_SUCCESS) && f->pf.size)
				rc = commit_step(v, sn, sn->name, 0, &st);
		} else if (sn && !frozen(f->ps) && !atomic_load(&sn->orphan)) {
			if (f->pf.is_meta && n->parent == sn->ino &&
			    !strcmp(n->name, CKPT_ORBAX_CKPT_METADATA) && aw_fresh_meta(&f->pf)) {
				rc = aw_convert(v, sn, n->name);
			} else if (f->pf.is_marker && !dirty && !f->pf.final) {
				rc = try_commit(v, sn, 0); /* touch: commit now, or say why not */
				if (rc < 0 && !atomic_load(&n->orphan)) {
					/* not committed: no marker is left behind (touch again to retry) */
					f->ps->commit_wanted = 0;
					f->pf.commit_err = rc;
					ckpt_node_remove_kid(ckpt_node_at(v, n->parent), n);
					atomic_store(&n->orphan, true);
				}
			} else {
				if (f->pf.is_marker)
					f->ps->commit_wanted = 1;
				if (f->ps->commit_wanted)
					rc = try_commit(v, sn, 1);
			}
		}
	}
	ckpt_rwunlock(&v->ns_lock, CKPT_RANK_NS);
	return rc;
}

int ckpt_view_setattr_meta(ckpt_view *v, ckpt_ino ino)
{
	struct node *n = ckpt_node_at(v, ino);
	if (!n)
		return -ENOENT;
	/* Pending nodes, and those of a step committed through this mount (the
	 * tool that copied it sets the folders' modes last): accepted and
	 * ignored, the mount shows its own modes and owner. */
	struct node *s = n;
	while (s && s->parent != CKPT_ROOT_INO && s->ino != CKPT_ROOT_INO)
		s = parent_of(v, s);
	if (v->writable && s && s->ino != CKPT_ROOT_INO &&
	    (s->kind == N_PSTEP || s->written_here || n->kind == N_PFILE))
		return 0;
	return refuse(n->name, "change the mode or owner");
}

int ckpt_view_create(ckpt_view *v, ckpt_ino parent, const char *name, ckpt_attr *out)
{
	if (ckpt_latest_is(v, parent, name))
		return ckpt_latest_refuse("create a file");
	ckpt_wrlock(&v->ns_lock, CKPT_RANK_NS);
	struct node *dir = ckpt_node_at(v, parent);
	int rc = 0;
	int live = dir && (dir->kind == N_PSTEP || dir->kind == N_PDIR) && !frozen(to_pdir(dir)->ps) &&
		   !atomic_load(&dir->orphan);
	if (!dir) {
		rc = -ENOENT;
	} else if (!strcmp(name, CKPT_ORBAX_COMMIT_SUCCESS) && dir->kind == N_PSTEP &&
		   atomic_load(&to_pdir(dir)->ps->state) == PS_UNSETTLED && !atomic_load(&dir->orphan)) {
		/* touch again: find out whether the step committed */
		struct node *step = NULL, *m;
		rc = settle_step(v, dir, &step);
		m = rc == 0 ? ckpt_node_find_kid(step, CKPT_ORBAX_COMMIT_SUCCESS) : NULL;
		if (rc == 0 && m)
			ckpt_node_fill_attr(v, m, out);
		else if (rc == 0)
			rc = -EEXIST; /* committed, shown without its marker */
	} else if (!strcmp(name, CKPT_ORBAX_COMMIT_SUCCESS) &&
		   ((dir->kind == N_PSTEP && atomic_load(&to_pdir(dir)->ps->state) == PS_COMMITTED) ||
		    (dir->kind != N_PSTEP && dir->parent == CKPT_ROOT_INO && v->writable &&
		     dir->ino != CKPT_ROOT_INO))) {
		rc = -EEXIST; /* committed already: nothing to do */
	} else if ((dir->kind == N_PDIR || dir->kind == N_PSTEP) && live) {
		struct node *n = ckpt_node_find_kid(dir, name);
		if (!n && dir->kind == N_PDIR)
			n = ckpt_node_dyn_find(v, dir->ino, name); /* slice files are hidden names */
		if (n) {
			rc = n->kind == N_PFILE ? 0 : -EISDIR;
		} else {
			rc = new_pfile(v, dir, name, &n);
			if (rc == 0)
				rc = n->hidden ? ckpt_node_dyn_add(v, n) : ckpt_node_add_kid(dir, n);
			if (rc == 0)
				note_writer(to_pdir(dir)->ps);
		}
		if (rc == 0)
			ckpt_node_fill_attr(v, n, out);
	} else {
		rc = refuse(name, "create a file");
	}
	ckpt_rwunlock(&v->ns_lock, CKPT_RANK_NS);
	return rc;
}

int ckpt_view_rename(ckpt_view *v, ckpt_ino parent, const char *name, ckpt_ino newparent, const char *newname,
		     unsigned flags)
{
	if (ckpt_latest_is(v, parent, name) || ckpt_latest_is(v, newparent, newname))
		return ckpt_latest_refuse("rename");
	ckpt_wrlock(&v->ns_lock, CKPT_RANK_NS);
	struct node *dir = ckpt_node_at(v, parent);
	struct node *n = dir && node_has_kids(dir) ? ckpt_node_find_kid(dir, name) : NULL;
	int rc;
	const char *why = "";
	if (!n)
		rc = -ENOENT;
	else if ((n->kind == N_PFILE || n->kind == N_PDIR) && (dir->kind == N_PSTEP || dir->kind == N_PDIR) &&
		 to_pdir(dir)->ps->as_written)
		rc = aw_rename(v, dir, n, ckpt_node_at(v, newparent), newname, flags);
	else if (n->kind == N_PSTEP && parent == CKPT_ROOT_INO && newparent == CKPT_ROOT_INO &&
		 !ps_dead(to_pdir(n)->ps)) {
		struct node *step;
		if ((atomic_load(&to_pdir(n)->ps->state) == PS_COMMITTING ||
		     atomic_load(&to_pdir(n)->ps->state) == PS_SEALED)) {
			rc = refuse(name, "rename (the step is committing)");
		} else if (ckpt_orbax_name_ok(CKPT_NAME_STEP, newname, &why)) {
			rc = commit_step(v, n, newname, 0, &step);
		} else {
			ckpt_log(CKPT_LOG_ERR, "step %s: cannot commit as %s: %s", name, newname, why);
			rc = -EINVAL;
		}
	} else if (n->kind == N_PFILE && to_pfile(n)->pf.final && parent == newparent &&
		   !strcmp(to_pfile(n)->pf.final, newname) && !n->hidden && !frozen(to_pfile(n)->ps)) {
		/* A copy tool's temporary file takes the name it was written as. */
		struct pfile_node *f = to_pfile(n);
		char *nn = ckpt_node_find_kid(dir, newname) ? NULL : strdup(newname);
		rc = nn ? 0 : ckpt_node_find_kid(dir, newname) ? -EEXIST : -ENOMEM;
		if (rc == 0) {
			/* no write of the step runs while the name changes (writes read it) */
			ckpt_wrlock(&f->ps->io_lock, CKPT_RANK_IO);
			ckpt_node_remove_kid(dir, n);
			ckpt_lock(&f->pf.mu, CKPT_RANK_PF);
			char *old = n->name;
			n->name = nn;
			free(f->pf.final);
			f->pf.final = NULL;
			ckpt_unlock(&f->pf.mu, CKPT_RANK_PF);
			rc = ckpt_node_add_kid(dir, n);
			ckpt_rwunlock(&f->ps->io_lock, CKPT_RANK_IO);
			free(old);
			struct node *sn = step_of(v, dir);
			if (rc == 0 && sn && f->ps->commit_wanted)
				rc = try_commit(v, sn, 1);
		}
	} else if (n->kind == N_PSTEP || n->kind == N_PDIR || n->kind == N_PFILE) {
		ckpt_log(CKPT_LOG_ERR, "%s: only a whole pending step can be renamed (that commits it)",
			 name);
		rc = -EPERM;
	} else {
		rc = refuse(name, "rename");
	}
	ckpt_rwunlock(&v->ns_lock, CKPT_RANK_NS);
	return rc;
}

int ckpt_view_unlink(ckpt_view *v, ckpt_ino parent, const char *name)
{
	if (ckpt_latest_is(v, parent, name))
		return ckpt_latest_refuse("remove");
	ckpt_wrlock(&v->ns_lock, CKPT_RANK_NS);
	struct node *dir = ckpt_node_at(v, parent);
	if (dir && node_has_kids(dir) && ckpt_prune_step_of(v, dir)) { /* inside a committed step */
		int rc = node_load(v, dir);
		rc = rc ? rc : ckpt_prune_remove(v, dir, ckpt_node_find_kid(dir, name), 0);
		ckpt_rwunlock(&v->ns_lock, CKPT_RANK_NS);
		return rc;
	}
	struct node *n = dir && (dir->kind == N_PDIR || dir->kind == N_DIR || dir->kind == N_PSTEP)
				 ? ckpt_node_find_kid(dir, name)
				 : NULL;
	int rc;
	if (!n) {
		rc = dir && (dir->kind == N_PDIR || (dir->kind == N_PSTEP && to_pdir(dir)->ps->as_written))
			     ? -ENOENT
			     : refuse(name, "remove");
	} else if (n->kind != N_PFILE) {
		rc = n->kind == N_PDIR ? -EISDIR : refuse(name, "remove");
	} else if (frozen(to_pfile(n)->ps)) {
		rc = refuse(name, "remove (the step is committed or committing)");
	} else {
		/* No write of the step runs while its array is removed. */
		struct pfile_node *f = to_pfile(n);
		struct pfile *pf = &f->pf;
		ckpt_wrlock(&f->ps->io_lock, CKPT_RANK_IO);
		ckpt_lock(&pf->mu, CKPT_RANK_PF);
		ckpt_warray *arr = pf->is_slice ? NULL : pf->arr;
		int json = pf->is_json;
		char raw[VIEW_PATH_MAX];
		if (pf->is_raw && raw_path(v, f, raw, sizeof(raw)) == 0 && unlink(raw) && errno != ENOENT)
			ckpt_log(CKPT_LOG_WARN, "%s: unlink: %s", raw, strerror(errno));
		if (pf->is_marker)
			f->ps->commit_wanted = 0; /* the copy's request to commit is withdrawn */
		ckpt_unlock(&pf->mu, CKPT_RANK_PF);
		rc = 0;
		for (size_t i = 0; pf->is_st && pf->st_arr && i < pf->nst && rc == 0; i++)
			rc = ckpt_warray_remove(pf->st_arr[i]); /* an import's tensors go with it */
		if (arr)
			rc = ckpt_warray_remove(arr); /* its bytes and folder go */
		else if (json)
			rc = ckpt_step_set_json(f->ps->step, dir->name, NULL, 0);
		ckpt_rwunlock(&f->ps->io_lock, CKPT_RANK_IO);
		if (rc == 0) {
			ckpt_node_remove_kid(dir, n);
			atomic_store(&n->orphan, true);
		}
	}
	ckpt_rwunlock(&v->ns_lock, CKPT_RANK_NS);
	return rc;
}

int ckpt_view_rmdir(ckpt_view *v, ckpt_ino parent, const char *name)
{
	if (ckpt_latest_is(v, parent, name))
		return ckpt_latest_refuse("remove");
	ckpt_wrlock(&v->ns_lock, CKPT_RANK_NS);
	struct node *dir = ckpt_node_at(v, parent);
	struct node *n = dir && node_has_kids(dir) ? ckpt_node_find_kid(dir, name) : NULL;
	struct node *gone = !n && parent == CKPT_ROOT_INO ? ckpt_node_dyn_find(v, parent, name) : NULL;
	int rc;
	if (gone && atomic_load(&gone->pruned)) { /* the end of an rmtree of a committed step */
		rc = ckpt_prune_remove(v, dir, gone, 1);
	} else if (dir && node_has_kids(dir) && ckpt_prune_step_of(v, dir)) { /* inside one */
		rc = node_load(v, dir);
		rc = rc ? rc : ckpt_prune_remove(v, dir, ckpt_node_find_kid(dir, name), 1);
	} else if (!n) {
		rc = -ENOENT;
	} else if (n->kind == N_PSTEP &&
		   (!ps_dead(to_pdir(n)->ps) || atomic_load(&to_pdir(n)->ps->state) == PS_LOST)) {
		struct pstep *ps = to_pdir(n)->ps;
		if ((atomic_load(&ps->state) == PS_COMMITTING || atomic_load(&ps->state) == PS_SEALED)) {
			/* never wait for io_lock here: the commit needs ns_lock to finish */
			rc = refuse(name, "remove (the step is committing)");
		} else {
			ckpt_wrlock(&ps->io_lock, CKPT_RANK_IO);
			assert_pstep(ps);
			ckpt_step_abort(ps->step);
			ps_set(ps, PS_ABORTED);
			ckpt_step_destroy(ps->step); /* nothing of it is kept */
			ps->step = NULL;
			ckpt_bg_upload_free(ps->bg, 1); /* aborts and deletes what was sent */
			ps->bg = NULL;
			ckpt_rwunlock(&ps->io_lock, CKPT_RANK_IO);
			ckpt_node_remove_kid(dir, n);
			atomic_store(&n->orphan, true);
			ckpt_log(CKPT_LOG_INFO, "step %s: aborted", name);
			rc = 0;
		}
	} else if (n->kind == N_PSTEP && atomic_load(&to_pdir(n)->ps->state) == PS_UNSETTLED) {
		ckpt_log(CKPT_LOG_ERR,
			 "step %s: whether its commit landed is unknown; touch %s/%s to find out before "
			 "removing it",
			 name, name, CKPT_ORBAX_COMMIT_SUCCESS);
		rc = -EBUSY;
	} else if (n->kind == N_PDIR && to_pdir(n)->ps->as_written) {
		rc = aw_rmdir(v, dir, n);
	} else if (n->kind == N_PDIR && to_pdir(dir)->is_views && !frozen(to_pdir(n)->ps)) {
		/* an emptied view import folder: the import is called off */
		char rel[VIEW_PATH_MAX], path[VIEW_PATH_MAX];
		rc = to_dir(n)->nkids ? -ENOTEMPTY : rel_of(v, dir, name, rel, sizeof(rel));
		if (!rc && !tmp_file(to_pdir(n)->ps, rel, path, sizeof(path)) && rmdir(path) &&
		    errno != ENOENT)
			rc = -errno;
		if (!rc) {
			ckpt_node_remove_kid(dir, n);
			atomic_store(&n->orphan, true);
			to_pdir(n)->ps->views_import = 0;
		}
	} else if (n->kind == N_PDIR) {
		ckpt_log(CKPT_LOG_ERR,
			 "%s: directories of a pending step cannot be removed (rmdir the step to abort it)",
			 name);
		rc = -EPERM;
	} else {
		rc = n->kind == N_DIR ? refuse(name, "remove") : -ENOTDIR;
	}
	ckpt_rwunlock(&v->ns_lock, CKPT_RANK_NS);
	return rc;
}

/* ---- data -------------------------------------------------------------- */

/* Declare the array from the parsed header (pf->mu held). */
static int declare(ckpt_view *v, struct pfile_node *n, const ckpt_npy_info *h)
{
	struct pfile *pf = &n->pf;
	if (pf->is_slice) {
		/* decl->pf.arr is set once and never changes: no need for its mutex */
		ckpt_warray_info info;
		ckpt_warray_get_info(pf->decl->pf.arr, &info);
		int same = h->dtype == info.dtype && h->rank == pf->region.rank;
		for (int d = 0; same && d < h->rank; d++)
			same = h->shape[d] == pf->region.stop[d] - pf->region.start[d];
		if (!same) {
			ckpt_log(CKPT_LOG_ERR,
				 "%s: the .npy header (dtype/shape) disagrees with the slice of %s",
				 n->n.name, pf->decl->n.name);
			return -EINVAL;
		}
		pf->arr = pf->decl->pf.arr;
		return 0;
	}
	if (pf->arr) {
		/* Written again after O_TRUNC: the same declaration or nothing. */
		ckpt_warray_info info;
		ckpt_warray_get_info(pf->arr, &info);
		int same = h->dtype == info.dtype && h->rank == info.rank;
		for (int d = 0; same && d < h->rank; d++)
			same = h->shape[d] == info.shape[d];
		if (!same) {
			ckpt_log(CKPT_LOG_ERR,
				 "%s: written again with another dtype or shape than its declaration (%s, "
				 "rank "
				 "%d); unlink it first to declare it anew",
				 n->n.name, ckpt_dtype_get(info.dtype)->name, info.rank);
			return -EINVAL;
		}
		return 0;
	}
	const char *item, *keys[CKPT_ORBAX_MAX_DEPTH];
	int types[CKPT_ORBAX_MAX_DEPTH], depth;
	char stem[VIEW_NAME_BUF];
	const char *fname = pf->final ? pf->final : n->n.name; /* a temporary name declares its final one */
	size_t sl = strlen(fname) - 4;
	if (sl >= sizeof(stem))
		return -ENAMETOOLONG;
	memcpy(stem, fname, sl);
	stem[sl] = 0;
	struct node *dir = parent_of(v, &n->n);
	char *kbuf = malloc((size_t)CKPT_ORBAX_MAX_DEPTH * VIEW_NAME_BUF);
	if (!kbuf)
		return -ENOMEM;
	int rc = key_path(v, dir, stem, &item, keys, types, &depth, kbuf);
	if (rc == 0)
		rc = ckpt_hosts_declare(n->ps->step, item, keys, types, depth, h->dtype, h->rank, h->shape,
					&pf->arr);
	free(kbuf);
	if (rc < 0)
		return rc;
	ckpt_region_full(&pf->region, h->rank, h->shape);
	return 0;
}

/* Header bytes [off, off + n) of a file still collecting its header
 * (pf->mu held): into pf->hdr, grown as needed. */
static int hdr_put(struct pfile *pf, uint64_t off, const uint8_t *data, size_t n)
{
	if (off + n > pf->cap) {
		uint8_t *p = realloc(pf->hdr, (size_t)(off + n));
		if (!p)
			return -ENOMEM;
		pf->hdr = p;
		pf->cap = (size_t)(off + n);
	}
	memcpy(pf->hdr + off, data, n);
	if (off + n > pf->have)
		pf->have = (size_t)(off + n);
	return 0;
}

/* Several files write this array: written bytes must stay as they are. */
static unsigned same_flag(struct pfile *pf)
{
	return pf->is_slice || atomic_load(&pf->nslices) ? CKPT_WRITE_SAME : 0;
}

/*
 * Header phase (pf->mu held, no header parsed yet): collect the bytes from
 * offset 0 until the .npy header parses, then declare the array and hand
 * the bytes collected past the header to the writer.  Returns 0 when all
 * len bytes were taken and the header is still incomplete, 1 when the
 * array is declared and the first *take bytes of data were consumed (the
 * rest is array data for the caller), or -errno.
 */
static int collect_header(ckpt_view *v, struct pfile_node *n, uint64_t off, const uint8_t *data, size_t len,
			  size_t *take)
{
	struct pfile *pf = &n->pf;
	if (off > pf->have) {
		ckpt_log(CKPT_LOG_ERR, "%s: write at %llu before the .npy header is complete", n->n.name,
			 (unsigned long long)off);
		return -EINVAL;
	}
	/* Only the first CKPT_NPY_MAX_HLEN + 16 bytes can hold a header. */
	const size_t limit = CKPT_NPY_MAX_HLEN + 16;
	if (off >= limit) {
		ckpt_log(CKPT_LOG_ERR, "%s: no valid .npy header in the first %zu bytes", n->n.name, limit);
		return -EINVAL;
	}
	*take = len < limit - off ? len : (size_t)(limit - off);
	if (hdr_put(pf, off, data, *take) < 0)
		return -ENOMEM;
	ckpt_npy_info h;
	size_t need = 0;
	/* Void descrs name no type: '<V2' is bfloat16 (the only 2-byte one);
	 * a 1-byte '<V1' may be any 8-bit float or int4, so it needs the name
	 * from user.ckpt.dtype (set before the data) or from the array it
	 * belongs to.  Named descrs ("float8_e5m2") need no hint. */
	ckpt_dtype hint = CKPT_DT_BFLOAT16;
	ckpt_warray *known = pf->is_slice ? pf->decl->pf.arr : pf->arr;
	if (known) {
		ckpt_warray_info info;
		ckpt_warray_get_info(known, &info);
		hint = info.dtype;
	}
	if (pf->hint != CKPT_DT_INVALID)
		hint = pf->hint;
	int rc = ckpt_npy_parse(pf->hdr, pf->have, hint, &h, &need);
	if (rc == -EAGAIN && *take == len) {
		if (pf->size < pf->have)
			pf->size = pf->have;
		return 0;
	}
	if (rc == -EAGAIN)
		rc = -EINVAL;
	if (rc < 0) {
		ckpt_log(
			CKPT_LOG_ERR,
			"%s: not a valid .npy header for ckptfs (a 1-byte void descr such as '<V1' needs its "
			"dtype named first: setfattr -n user.ckpt.dtype -v float8_e5m2 %s)",
			n->n.name, n->n.name);
	} else if (pf->hint != CKPT_DT_INVALID && h.dtype != pf->hint) {
		ckpt_log(CKPT_LOG_ERR, "%s: the .npy header's dtype is %s, user.ckpt.dtype says %s",
			 n->n.name, ckpt_dtype_get(h.dtype)->name, ckpt_dtype_get(pf->hint)->name);
		rc = -EINVAL;
	} else {
		rc = declare(v, n, &h); /* logs its own reasons */
	}
	if (rc < 0) {
		pf->have = 0; /* a refused header is forgotten: the writer may start over */
		return rc;
	}
	pf->data_off = (size_t)h.data_offset;
	uint64_t count;
	ckpt_region_count(&pf->region, &count);
	pf->size = pf->data_off + count * (h.nbytes / (h.nelems ? h.nelems : 1));
	if (!h.nelems)
		pf->size = pf->data_off;
	/* Bytes already collected past the header are data. */
	size_t extra = pf->have > pf->data_off ? pf->have - pf->data_off : 0;
	if (extra) {
		rc = ckpt_warray_write_flags(pf->arr, &pf->region, 0, pf->hdr + pf->data_off, extra,
					     same_flag(pf));
		if (rc < 0)
			return rc;
	}
	pf->have = pf->data_off;
	uint8_t *shrunk = realloc(pf->hdr, pf->data_off);
	if (shrunk)
		pf->hdr = shrunk;
	pf->cap = pf->data_off;
	return 1;
}

/* Declared (pf->mu held, released here): header bytes must not change;
 * the rest is array data, written without pf->mu. */
static ssize_t write_data(struct pfile_node *n, uint64_t off, const uint8_t *data, size_t len)
{
	struct pfile *pf = &n->pf;
	size_t hdr_part = off < pf->data_off ? (size_t)(pf->data_off - off) : 0;
	if (hdr_part > len)
		hdr_part = len;
	if (hdr_part && memcmp(pf->hdr + off, data, hdr_part)) {
		ckpt_unlock(&pf->mu, CKPT_RANK_PF);
		ckpt_log(CKPT_LOG_ERR, "%s: the .npy header cannot change once written", n->n.name);
		return -EINVAL;
	}
	uint64_t doff = off + hdr_part - pf->data_off;
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	if (len > hdr_part) {
		int rc = ckpt_warray_write_flags(pf->arr, &pf->region, doff, data + hdr_part, len - hdr_part,
						 same_flag(pf));
		if (rc < 0)
			return rc;
	}
	return (ssize_t)len;
}

/* A write of a pending file (io_lock held shared). */
/* The content of a JSON file changed (pf->mu held): hand it to the writer. */
static int json_set_locked(ckpt_view *v, struct pfile_node *n)
{
	ckpt_assert_held(CKPT_RANK_PF);
	struct node *dir = parent_of(v, &n->n);
	return ckpt_step_set_json(n->ps->step, dir->name, n->pf.hdr ? (const char *)n->pf.hdr : "",
				  (size_t)n->pf.size);
}

/* Resize a JSON file's buffer to size bytes (pf->mu held), zero-filling. */
static int json_resize_locked(struct pfile *pf, uint64_t size)
{
	ckpt_assert_held(CKPT_RANK_PF);
	if (size > ((uint64_t)64 << 20))
		return -EFBIG;
	if (size > pf->cap) {
		size_t cap = pf->cap ? pf->cap : 4096;
		while (cap < size)
			cap *= 2;
		uint8_t *p = realloc(pf->hdr, cap);
		if (!p)
			return -ENOMEM;
		pf->hdr = p;
		pf->cap = cap;
	}
	if (size > pf->size)
		memset(pf->hdr + pf->size, 0, (size_t)(size - pf->size));
	pf->size = size;
	return 0;
}

static ssize_t json_write_locked(ckpt_view *v, struct pfile_node *n, uint64_t off, const uint8_t *data,
				 size_t len)
{
	ckpt_assert_held(CKPT_RANK_PF);
	struct pfile *pf = &n->pf;
	uint64_t end = off + len;
	int rc = end < off ? -EFBIG : 0;
	if (!rc && end > pf->size)
		rc = json_resize_locked(pf, end);
	if (!rc) {
		memcpy(pf->hdr + off, data, len);
		if (pf->is_json)
			rc = json_set_locked(v, n);
	}
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	return rc < 0 ? rc : (ssize_t)len;
}

/* ---- importing safetensors files --------------------------------------------
 *
 * `cp model.safetensors MNT/30/state/params.safetensors` (or shard files
 * into MNT/30/state/params.safetensors.d/): the header is parsed as its
 * bytes arrive, every tensor becomes an array of the step under
 * params/<name split on '.'> (the read side's safetensors view joins key
 * paths with '.'), and the data buffer is cut into writes of those arrays
 * as it streams in: nothing is kept beyond the writer's chunk buffers.
 * `__metadata__` is not kept (Orbax has no place for it). */

/* The array key path of an imported file: its directory's, then X (from
 * X.safetensors, or from X.safetensors.d/ for a shard). */
static int st_prefix(ckpt_view *v, struct pfile_node *f, const char **item, const char **keys, int *types,
		     int *depth, char *kbuf)
{
	struct node *dir = parent_of(v, &f->n);
	const char *fname = f->pf.final ? f->pf.final : f->n.name;
	char stem[VIEW_NAME_BUF];
	const char *from = fname;
	size_t cut = strlen(ST_SUFFIX);
	if (dir->kind == N_PDIR && to_pdir(dir)->is_stdir) {
		from = dir->name;
		cut = strlen(ST_DIR_SUFFIX);
		dir = parent_of(v, dir);
	}
	size_t sl = strlen(from) - cut;
	if (sl >= sizeof(stem))
		return -ENAMETOOLONG;
	memcpy(stem, from, sl);
	stem[sl] = 0;
	return key_path(v, dir, stem, item, keys, types, depth, kbuf);
}

/* Declare the parsed tensors (pf->mu held): all or none. */
static int st_declare(ckpt_view *v, struct pfile_node *f)
{
	struct pfile *pf = &f->pf;
	const char *item, *keys[CKPT_ORBAX_MAX_DEPTH];
	int types[CKPT_ORBAX_MAX_DEPTH], depth;
	char *kbuf = malloc((size_t)CKPT_ORBAX_MAX_DEPTH * VIEW_NAME_BUF);
	char *nbuf = NULL;
	int rc = kbuf ? st_prefix(v, f, &item, keys, types, &depth, kbuf) : -ENOMEM;
	if (rc == 0 && !(pf->st_arr = calloc(pf->nst ? pf->nst : 1, sizeof(*pf->st_arr))))
		rc = -ENOMEM;
	size_t i = 0;
	for (; rc == 0 && i < pf->nst; i++) {
		const ckpt_st_entry *e = &pf->st[i];
		free(nbuf);
		if (!(nbuf = strdup(e->name))) {
			rc = -ENOMEM;
			break;
		}
		int d = depth;
		for (char *p = nbuf, *q; p && rc == 0; p = q) {
			q = strchr(p, '.');
			if (q)
				*q++ = 0;
			if (d == CKPT_ORBAX_MAX_DEPTH || !*p) {
				ckpt_log(CKPT_LOG_ERR,
					 "%s: tensor '%s': not a key path (empty part, or too deep)",
					 f->n.name, e->name);
				rc = -EINVAL;
				break;
			}
			int digits = 1;
			for (const char *c = p; *c; c++)
				digits &= *c >= '0' && *c <= '9';
			keys[d] = p;
			types[d++] = digits ? CKPT_KEY_SEQ : CKPT_KEY_DICT;
		}
		if (rc == 0 && ckpt_step_find_array(f->ps->step, item, keys, d))
			rc = -EEXIST; /* another file's array: names must not collide */
		if (rc == 0)
			rc = ckpt_hosts_declare(f->ps->step, item, keys, types, d, e->dtype, e->rank,
						e->shape, &pf->st_arr[i]);
		if (rc < 0)
			ckpt_log(CKPT_LOG_ERR, "%s: tensor '%s' cannot be an array of the step: %s",
				 f->n.name, e->name, strerror(-rc));
	}
	if (rc < 0 && pf->st_arr) { /* none: the file may be written again */
		for (size_t k = 0; k < pf->nst; k++)
			if (pf->st_arr[k])
				ckpt_warray_remove(pf->st_arr[k]);
		free(pf->st_arr);
		pf->st_arr = NULL;
	}
	free(nbuf);
	free(kbuf);
	return rc < 0 ? (rc == -ENOMEM ? rc : -EINVAL) : 0;
}

static int st_entry_cmp(const void *a, const void *b)
{
	const ckpt_st_entry *x = a, *y = b;
	return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* The tensors of an imported file's header (format/safetensors.c checks it
 * as the reference reader does), sorted by data offset, their offsets made
 * relative to the data buffer; *data_size the buffer's size.  The file's
 * final size is not known while it is written: offsets are checked against
 * one another only. */
static int st_entries_parse(struct pfile_node *f, const char *json, size_t len, ckpt_st_entry **out,
			    size_t *n, uint64_t *data_size)
{
	ckpt_st_file *stf = NULL;
	int rc = ckpt_st_parse(json, len, UINT64_MAX, f->n.name, &stf);
	if (rc < 0)
		return rc;
	ckpt_st_entry *e = calloc(stf->n ? stf->n : 1, sizeof(*e));
	*data_size = 0;
	for (size_t i = 0; e && i < stf->n; i++) {
		e[i] = stf->t[i];
		e[i].begin -= stf->data_start;
		e[i].end -= stf->data_start;
		if (e[i].end > *data_size)
			*data_size = e[i].end;
		stf->t[i].name = NULL; /* moved */
	}
	*n = stf->n;
	ckpt_st_file_free(stf);
	if (!e)
		return -ENOMEM;
	qsort(e, *n, sizeof(*e), st_entry_cmp);
	*out = e;
	return 0;
}

/* Header phase of an imported file (pf->mu held): as collect_header. */
static int st_collect(ckpt_view *v, struct pfile_node *f, uint64_t off, const uint8_t *data, size_t len,
		      size_t *take)
{
	struct pfile *pf = &f->pf;
	if (off > pf->have) {
		ckpt_log(CKPT_LOG_ERR, "%s: write at %llu before the safetensors header is complete",
			 f->n.name, (unsigned long long)off);
		return -EINVAL;
	}
	uint64_t need = 8;
	if (pf->have >= 8 || off + len >= 8) {
		uint8_t lenb[8];
		for (int i = 0; i < 8; i++)
			lenb[i] = (uint64_t)i < pf->have ? pf->hdr[i] : data[i - off];
		uint64_t n = ckpt_le64(lenb);
		if (n > 100000000 || n < 2) {
			ckpt_log(CKPT_LOG_ERR, "%s: not a safetensors file (header length %llu)", f->n.name,
				 (unsigned long long)n);
			pf->have = 0;
			return -EINVAL;
		}
		need = 8 + n;
	}
	*take = off + len < need ? len : (size_t)(need - off);
	if (hdr_put(pf, off, data, *take) < 0)
		return -ENOMEM;
	if (need == 8 || pf->have < need) {
		pf->size = pf->have;
		return 0;
	}
	ckpt_st_entry *e;
	size_t n;
	uint64_t data_size;
	int rc = st_entries_parse(f, (const char *)pf->hdr + 8, (size_t)(need - 8), &e, &n, &data_size);
	if (rc == 0 && pf->st) { /* again after O_TRUNC: the same tensors or nothing */
		int same = n == pf->nst && data_size == pf->st_data;
		for (size_t i = 0; same && i < n; i++)
			same = !strcmp(e[i].name, pf->st[i].name) && e[i].dtype == pf->st[i].dtype &&
			       e[i].begin == pf->st[i].begin && e[i].rank == pf->st[i].rank &&
			       !memcmp(e[i].shape, pf->st[i].shape, sizeof(uint64_t) * (size_t)e[i].rank);
		st_entries_free(e, n);
		if (!same) {
			ckpt_log(CKPT_LOG_ERR,
				 "%s: written again with other tensors; rm it first to import anew",
				 f->n.name);
			rc = -EINVAL;
		}
	} else if (rc == 0) {
		pf->st = e;
		pf->nst = n;
		pf->st_data = data_size;
		rc = st_declare(v, f);
		if (rc < 0) {
			st_entries_free(pf->st, pf->nst);
			pf->st = NULL;
			pf->nst = 0;
		}
	} else if (rc != -ENOMEM) {
		rc = -EINVAL; /* logged by the parser */
	}
	if (rc < 0) {
		pf->have = 0; /* forgotten: the writer may start over */
		return rc;
	}
	pf->data_off = (size_t)need;
	pf->size = need + pf->st_data;
	return 1;
}

/* Data of an imported file: file bytes [off, off+len) past the header go to
 * the tensors they belong to.  pf->st is fixed once data_off is set. */
static int st_write_data(struct pfile_node *f, uint64_t off, const uint8_t *data, size_t len)
{
	struct pfile *pf = &f->pf;
	uint64_t d = off - pf->data_off;
	if (d + len > pf->st_data || d + len < d) {
		ckpt_log(CKPT_LOG_ERR, "%s: write past the end of the data its header declares", f->n.name);
		return -EFBIG;
	}
	size_t lo = 0, hi = pf->nst; /* first tensor with end > d */
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (pf->st[mid].end <= d)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (size_t i = lo; len && i < pf->nst; i++) {
		const ckpt_st_entry *e = &pf->st[i];
		if (e->end == e->begin)
			continue;
		size_t k = e->end - d < len ? (size_t)(e->end - d) : len;
		int rc = ckpt_warray_write(pf->st_arr[i], NULL, d - e->begin, data, k);
		if (rc < 0)
			return rc;
		d += k;
		data += k;
		len -= k;
	}
	return 0;
}

static ssize_t st_write_locked(ckpt_view *v, struct pfile_node *f, uint64_t off, const uint8_t *data,
			       size_t len)
{
	ckpt_assert_held(CKPT_RANK_PF);
	struct pfile *pf = &f->pf;
	size_t take = 0;
	int rc = 0;
	if (!pf->data_off) {
		rc = st_collect(v, f, off, data, len, &take);
		if (rc <= 0) {
			ckpt_unlock(&pf->mu, CKPT_RANK_PF);
			return rc < 0 ? rc : (ssize_t)len;
		}
	} else if (off < pf->data_off) {
		take = pf->data_off - off < len ? (size_t)(pf->data_off - off) : len;
		if (memcmp(pf->hdr + off, data, take)) {
			ckpt_unlock(&pf->mu, CKPT_RANK_PF);
			ckpt_log(CKPT_LOG_ERR, "%s: the safetensors header cannot change once written",
				 f->n.name);
			return -EINVAL;
		}
	}
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	if (take < len && (rc = st_write_data(f, off + take, data + take, len - take)) < 0)
		return rc;
	return (ssize_t)len;
}

/* A read of [off, off + *len) of a pending file (pf->mu held): *len
 * clipped to the file's size (0 past its end), the part inside the header
 * bytes written so far copied to dst; returns the bytes copied. */
static size_t header_part(const struct pfile *pf, uint64_t off, size_t *len, uint8_t *dst)
{
	size_t hl = pf->data_off ? pf->data_off : pf->have;
	if (off >= pf->size) {
		*len = 0;
		return 0;
	}
	if (*len > pf->size - off)
		*len = (size_t)(pf->size - off);
	if (off >= hl)
		return 0;
	size_t done = hl - (size_t)off < *len ? hl - (size_t)off : *len;
	memcpy(dst, pf->hdr + off, done);
	return done;
}

/* Read back an imported file (io_lock shared, pf->mu held, released here). */
static ssize_t st_read_locked(struct pfile *pf, uint64_t off, size_t len, uint8_t *dst)
{
	ckpt_assert_held(CKPT_RANK_PF);
	size_t hl = pf->data_off ? pf->data_off : pf->have;
	size_t done = header_part(pf, off, &len, dst);
	int parsed = pf->data_off != 0;
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	uint64_t d = off + done - hl;
	for (size_t i = 0; parsed && done < len && i < pf->nst; i++) {
		const ckpt_st_entry *e = &pf->st[i];
		if (e->end <= d)
			continue;
		size_t k = e->end - d < len - done ? (size_t)(e->end - d) : len - done;
		ssize_t r = ckpt_warray_read(pf->st_arr[i], NULL, d - e->begin, dst + done, k);
		if (r < 0)
			return r;
		if ((size_t)r < k)
			memset(dst + done + r, 0, k - (size_t)r);
		done += k;
		d += k;
	}
	return (ssize_t)done;
}

static ssize_t write_locked(ckpt_view *v, struct pfile_node *n, uint64_t off, const uint8_t *data, size_t len,
			    int append)
{
	ckpt_assert_held(CKPT_RANK_IO);
	struct pfile *pf = &n->pf;
	ckpt_lock(&pf->mu, CKPT_RANK_PF);
	if (append) /* O_APPEND: after the furthest byte written, not the declared size */
		off = buffered(pf) || pf->is_raw ? pf->size : pf->hwm;
	pf->dirty = 1;
	if (off + len > pf->hwm)
		pf->hwm = off + len;
	if (pf->is_raw) { /* a stored copy's file: straight to the tmp folder */
		ckpt_unlock(&pf->mu, CKPT_RANK_PF);
		int fd = raw_open_f(v, n, O_WRONLY);
		int rc = fd < 0 ? fd : ckpt_pwrite_all(fd, data, len, off);
		if (rc < 0) {
			if (fd >= 0)
				close(fd);
			ckpt_log(CKPT_LOG_ERR, "%s: write: %s", n->n.name, strerror(-rc));
			return rc;
		}
		ckpt_lock(&pf->mu, CKPT_RANK_PF);
		if (off + len > pf->size)
			pf->size = off + len;
		raw_note_stat(pf, fd);
		ckpt_unlock(&pf->mu, CKPT_RANK_PF);
		close(fd);
		return (ssize_t)len;
	}
	if (buffered(pf))
		return json_write_locked(v, n, off, data, len);
	if (pf->is_st)
		return st_write_locked(v, n, off, data, len);
	if (pf->data_off)
		return write_data(n, off, data, len);
	size_t take = 0;
	int rc = collect_header(v, n, off, data, len, &take);
	size_t data_off = pf->data_off;
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	if (rc < 0)
		return rc;
	if (rc == 1 && take < len) {
		/* pf->arr and pf->region are fixed once data_off is set */
		rc = ckpt_warray_write_flags(pf->arr, &pf->region, off + take - data_off, data + take,
					     len - take, same_flag(pf));
		if (rc < 0)
			return rc;
	}
	return (ssize_t)len;
}

ssize_t ckpt_view_write(ckpt_view *v, ckpt_ino ino, uint64_t off, const void *data, size_t len,
			unsigned flags)
{
	struct node *n = ckpt_node_at(v, ino);
	if (!n)
		return -ENOENT;
	if (n->kind != N_PFILE)
		return node_has_kids(n) ? -EISDIR : refuse(n->name, "write");
	struct pfile_node *f = to_pfile(n);
	struct pstep *ps = f->ps;
	note_writer(ps);
	ckpt_rdlock(&ps->io_lock, CKPT_RANK_IO);
	ssize_t rc = ps_dead(ps) || atomic_load(&n->orphan)
			     ? refuse(n->name, "write")
			     : write_locked(v, f, off, data, len, (flags & CKPT_WRITE_APPEND) != 0);
	ckpt_rwunlock(&ps->io_lock, CKPT_RANK_IO);
	return rc;
}

int ckpt_view_truncate(ckpt_view *v, ckpt_ino ino, uint64_t size)
{
	struct node *n = ckpt_node_at(v, ino);
	if (!n)
		return -ENOENT;
	if (n->kind != N_PFILE && size == 0 && is_commit_marker(v, n))
		return 0; /* a commit again: nothing changes */
	if (n->kind != N_PFILE)
		return n->kind == N_ARRAY || n->kind == N_FILE ? refuse(n->name, "truncate") : -EISDIR;
	struct pfile_node *f = to_pfile(n);
	struct pfile *pf = &f->pf;
	int rc = 0;
	ckpt_rdlock(&f->ps->io_lock, CKPT_RANK_IO);
	ckpt_lock(&pf->mu, CKPT_RANK_PF);
	if (ps_dead(f->ps) || atomic_load(&n->orphan)) {
		rc = refuse(n->name, "truncate");
	} else if (pf->is_st && size == 0) {
		/* a writer starting over: the tensors' bytes go, the same header must come again */
		for (size_t i = 0; rc == 0 && pf->data_off && i < pf->nst; i++)
			rc = ckpt_warray_forget(pf->st_arr[i], NULL);
		if (!rc)
			pf->data_off = pf->have = pf->size = pf->hwm = 0;
	} else if (pf->is_st) {
		rc = size == pf->size ? 0 : -EINVAL;
		if (rc)
			ckpt_log(CKPT_LOG_ERR, "%s: cannot resize an imported safetensors file", n->name);
	} else if (pf->is_raw) {
		int fd = raw_open_f(v, f, O_WRONLY);
		rc = fd < 0 ? fd : ftruncate(fd, (off_t)size) ? -errno : 0;
		if (!rc) {
			pf->size = pf->hwm = size;
			raw_note_stat(pf, fd);
		}
		if (fd >= 0)
			close(fd);
	} else if (buffered(pf)) {
		rc = json_resize_locked(pf, size);
		if (!rc && pf->is_json)
			rc = json_set_locked(v, f);
		if (!rc)
			pf->hwm = size;
	} else if (size == 0 && !pf->data_off) {
		pf->have = pf->size = 0;
		pf->hwm = 0;
	} else if (size == 0) {
		/* O_TRUNC of a written file: a writer starting over.  Its bytes
		 * go (the array is incomplete until written again); the next
		 * header must repeat the declaration. */
		rc = ckpt_warray_forget(pf->arr, &pf->region);
		if (!rc) {
			pf->data_off = 0;
			pf->have = pf->size = 0;
			pf->hwm = 0;
		}
	} else if (size == pf->size) {
		rc = 0;
	} else {
		ckpt_log(CKPT_LOG_ERR, "%s: cannot resize to %llu bytes (the .npy header fixes the size)",
			 n->name, (unsigned long long)size);
		rc = -EINVAL;
	}
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	ckpt_rwunlock(&f->ps->io_lock, CKPT_RANK_IO);
	return rc;
}

/* Read back a pending file: the header bytes, then what the writer holds
 * (io_lock shared: never concurrent with the step's commit or abort). */
static ssize_t pending_read(ckpt_view *v, struct node *node, uint64_t off, size_t len, void *dst)
{
	struct pfile_node *n = to_pfile(node);
	struct pfile *pf = &n->pf;
	ckpt_rdlock(&n->ps->io_lock, CKPT_RANK_IO);
	if (ps_dead(n->ps)) {
		/* committed (the step's files are read from its folder under their
		 * path now) or aborted: the writer's state is gone */
		ckpt_rwunlock(&n->ps->io_lock, CKPT_RANK_IO);
		return -ESTALE;
	}
	ckpt_lock(&pf->mu, CKPT_RANK_PF);
	uint64_t size = pf->size;
	if (pf->is_st) {
		ssize_t r = st_read_locked(pf, off, len, dst);
		ckpt_rwunlock(&n->ps->io_lock, CKPT_RANK_IO);
		return r;
	}
	if (pf->is_raw) {
		ckpt_unlock(&pf->mu, CKPT_RANK_PF);
		size_t k = off < size ? (size_t)(size - off < len ? size - off : len) : 0;
		int fd = k ? raw_open_f(v, n, O_RDONLY) : 0;
		int rc = fd < 0 ? fd : k ? ckpt_pread_all(fd, dst, k, off) : 0;
		if (k && fd >= 0)
			close(fd);
		ckpt_rwunlock(&n->ps->io_lock, CKPT_RANK_IO);
		return rc < 0 ? rc : (ssize_t)k;
	}
	if (buffered(pf)) {
		size_t k = off < size ? (size_t)(size - off < len ? size - off : len) : 0;
		if (k)
			memcpy(dst, pf->hdr + off, k);
		ckpt_unlock(&pf->mu, CKPT_RANK_PF);
		ckpt_rwunlock(&n->ps->io_lock, CKPT_RANK_IO);
		return (ssize_t)k;
	}
	size_t done = header_part(pf, off, &len, dst);
	ckpt_warray *arr = pf->arr;
	ckpt_region r = pf->region;
	size_t doff = pf->data_off;
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	ssize_t rc = 0;
	if (done < len && arr) {
		rc = ckpt_warray_read(arr, &r, off + done - doff, (uint8_t *)dst + done, len - done);
		if (rc >= 0)
			done += (size_t)rc;
	}
	ckpt_rwunlock(&n->ps->io_lock, CKPT_RANK_IO);
	return rc < 0 ? rc : (ssize_t)done;
}

/* user.ckpt.dtype on a pending file: the dtype its .npy header means (for
 * '<V1', which np.save writes for every 1-byte ml_dtypes type). */
static int set_dtype(struct pfile_node *f, const char *value, size_t size)
{
	char name[32];
	if (size >= sizeof(name)) {
		ckpt_log(CKPT_LOG_ERR, "%s: user.ckpt.dtype: not a dtype name", f->n.name);
		return -EINVAL;
	}
	memcpy(name, value, size);
	name[size] = 0;
	ckpt_dtype dt = ckpt_dtype_from_name(name);
	if (dt == CKPT_DT_INVALID) {
		ckpt_log(
			CKPT_LOG_ERR,
			"%s: user.ckpt.dtype: unknown dtype '%s' (TensorStore names: float8_e5m2, int4, ...)",
			f->n.name, name);
		return -EINVAL;
	}
	struct pfile *pf = &f->pf;
	int rc = 0;
	ckpt_rdlock(&f->ps->io_lock, CKPT_RANK_IO);
	ckpt_lock(&pf->mu, CKPT_RANK_PF);
	int dead = ps_dead(f->ps); /* then the arrays are freed */
	ckpt_warray *known = dead ? NULL : pf->is_slice ? pf->decl->pf.arr : pf->arr;
	ckpt_dtype have = CKPT_DT_INVALID;
	if (known) {
		ckpt_warray_info info;
		ckpt_warray_get_info(known, &info);
		have = info.dtype;
	}
	if (dead || atomic_load(&f->n.orphan)) {
		rc = refuse(f->n.name, "set an extended attribute");
	} else if (buffered(pf)) {
		rc = -ENOTSUP;
	} else if (known && have != dt) {
		ckpt_log(CKPT_LOG_ERR, "%s: user.ckpt.dtype: the array is declared as %s", f->n.name,
			 ckpt_dtype_get(have)->name);
		rc = -EINVAL;
	} else if (!known && pf->have) {
		ckpt_log(CKPT_LOG_ERR, "%s: set user.ckpt.dtype before writing the file", f->n.name);
		rc = -EINVAL;
	} else {
		pf->hint = dt;
	}
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	ckpt_rwunlock(&f->ps->io_lock, CKPT_RANK_IO);
	return rc;
}

/* The node's attribute `name` has exactly this value already. */
static int same_xattr(ckpt_view *v, struct node *n, const char *name, const char *value, size_t size)
{
	if (!n->ops->getxattr || size > ((size_t)1 << 20))
		return 0;
	char *buf = malloc(size + 1);
	ssize_t k = buf ? n->ops->getxattr(v, n, name, buf, size + 1) : -ENOMEM;
	int same = k == (ssize_t)size && !memcmp(buf, value, size);
	free(buf);
	return same;
}

int ckpt_view_setxattr(ckpt_view *v, ckpt_ino ino, const char *name, const char *value, size_t size)
{
	struct node *n = ckpt_node_at(v, ino);
	if (!n)
		return -ENOENT;
	/* the attributes a writer may set; the others describe an array */
	int ours = !strcmp(name, "user.ckpt.sharding") || !strcmp(name, "user.ckpt.dtype");
	if (n->kind != N_PFILE || ps_dead(to_pfile(n)->ps) || atomic_load(&n->orphan)) {
		/* Copy tools that preserve xattrs set what the source showed: the
		 * same value changes nothing; names the mount has no use for are
		 * not supported (the tools then skip them quietly). */
		if (same_xattr(v, n, name, value, size))
			return 0;
		if (!ours || n->kind == N_PDIR || n->kind == N_PSTEP)
			return -ENOTSUP;
		return refuse(n->name, "set an extended attribute");
	}
	if (buffered(&to_pfile(n)->pf))
		return -ENOTSUP; /* no attribute of its own (copy tools then skip it) */
	if (!strcmp(name, "user.ckpt.dtype"))
		return set_dtype(to_pfile(n), value, size);
	if (strcmp(name, "user.ckpt.sharding")) {
		/* the others describe the array (copy tools that preserve xattrs
		 * set them from the source: not supported, skipped quietly) */
		ckpt_log(CKPT_LOG_DEBUG,
			 "%s: only user.ckpt.sharding and user.ckpt.dtype can be set on a pending array",
			 n->name);
		return -ENOTSUP;
	}
	char *json = malloc(size + 1);
	if (!json)
		return -ENOMEM;
	memcpy(json, value, size);
	json[size] = 0;
	struct pfile_node *f = to_pfile(n);
	struct pfile *pf = &f->pf;
	int rc;
	ckpt_rdlock(&f->ps->io_lock, CKPT_RANK_IO);
	ckpt_lock(&pf->mu, CKPT_RANK_PF);
	ckpt_warray *arr = pf->is_slice ? pf->decl->pf.arr : pf->arr;
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	if (ps_dead(f->ps)) {
		rc = refuse(n->name, "set an extended attribute");
	} else if (!arr) {
		ckpt_log(CKPT_LOG_ERR, "%s: write the .npy header before setting its sharding", n->name);
		rc = -ENOENT;
	} else {
		rc = ckpt_warray_set_sharding(arr, json);
		if (rc < 0)
			ckpt_log(CKPT_LOG_ERR, "%s: user.ckpt.sharding is not valid JSON", n->name);
	}
	ckpt_rwunlock(&f->ps->io_lock, CKPT_RANK_IO);
	free(json);
	return rc;
}
