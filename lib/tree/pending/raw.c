/*
 * pending/raw.c - raw copies: pending files whose bytes go straight to the
 * step's tmp folder as they are written (the kind PF_RAW), and the copy-tool
 * watch that commits a copied step once the tools that copied it exited.
 * Two kinds of step hold them: a stored copy (an item copied as Orbax
 * stored it: an OCDBT database or zarr folders, read back whole before the
 * commit), and an Orbax save (a step stored as written: every folder and
 * file of "S.orbax-checkpoint-tmp", or of "S" in COMMIT_FILE mode).
 * Not here: .npy or safetensors data (file.c, safetensors.c), the commit
 * itself (step.c), which namespace call lands where (namespace.c).
 */
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "orbax.h"
#include "sysio.h"
#include "writer_hosts.h"
#include "pending_int.h"

/* ---- the copy-tool watch ----------------------------------------------------- */

/* The process the current request comes from (ckpt_view_set_caller). */
static _Thread_local pid_t caller_pid;

void ckpt_view_set_caller(pid_t pid)
{
	caller_pid = pid;
}

/* Remember the calling process as a writer of the step. */
void ckpt_raw_note_writer(struct pstep *ps)
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
int ckpt_raw_writers_alive(struct pstep *ps)
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

int ckpt_raw_has_stored(struct node *sn)
{
	struct dir_node *d = to_dir(sn);
	for (size_t i = 0; i < d->nkids; i++)
		if (d->kids[i]->kind == N_PDIR && to_pdir(d->kids[i])->stored)
			return 1;
	return 0;
}

#define COPY_IDLE_NS (2ull * 1000 * 1000 * 1000)

/* The copy-tool watch of a view (v->copy_watch, made under ns_lock exclusive). */
struct copy_watch {
	pthread_t thread;
	atomic_bool stop;
	int (*commit)(ckpt_view *v, struct node *sn); /* the step's: commit a whole copy */
};

/* Every 100 ms: commit the copied steps with stored items whose copy tools
 * have exited.  Runs from the first need until the view goes. */
static void *copy_thread_main(void *arg)
{
	ckpt_view *v = arg;
	struct copy_watch *w = v->copy_watch;
	while (!atomic_load(&w->stop)) {
		struct timespec ts = { 0, 100 * 1000 * 1000 };
		nanosleep(&ts, NULL);
		ckpt_wrlock(&v->ns_lock, CKPT_RANK_NS);
		struct node *root = ckpt_node_at(v, CKPT_ROOT_INO);
		for (int again = 1; again && !atomic_load(&w->stop);) {
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
				if (!ps->commit_wanted || !ckpt_raw_has_stored(sn) ||
				    (ckpt_raw_writers_alive(ps) && idle < COPY_IDLE_NS))
					continue;
				caller_pid = 0;
				int rc = w->commit(v, sn);
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

/* The view's stop hook: first thing at view destroy. */
static void copy_watch_stop(ckpt_view *v, void *arg)
{
	struct copy_watch *w = arg;
	atomic_store(&w->stop, true);
	pthread_join(w->thread, NULL);
	v->copy_watch = NULL;
	free(w);
}

void ckpt_raw_start_copy_thread(ckpt_view *v, int (*commit)(ckpt_view *v, struct node *sn))
{
	ckpt_assert_held(CKPT_RANK_NS);
	if (v->copy_watch)
		return;
	struct copy_watch *w = calloc(1, sizeof(*w));
	if (w) {
		w->commit = commit;
		atomic_init(&w->stop, false);
		v->copy_watch = w;
		if (pthread_create(&w->thread, NULL, copy_thread_main, v) == 0) {
			if (ckpt_view_add_stop_hook(v, copy_watch_stop, w) == 0)
				return;
			copy_watch_stop(v, w); /* no room to be stopped later: stop now */
			w = NULL;
		}
	}
	v->copy_watch = NULL;
	free(w);
	ckpt_log(CKPT_LOG_ERR, "cannot start the thread that commits stored copies: touch the marker");
}

/* ---- stored copies --------------------------------------------------------
 *
 * A copy of an item as Orbax stored it (cp -r of a step folder on disk: its
 * OCDBT database or zarr folders, not .npy files) cannot be turned into
 * arrays file by file.  The first file in an item that is not a .npy (nor
 * one of the metadata files of a copy) makes the item a stored copy: its
 * files are written as they come into the tmp folder, under their final
 * names, and committed as they are once the item reads back whole
 * (ckpt_raw_check_stored).  Such an item holds no .npy arrays of the mount's own. */

/* A pending .npy (or JSON) file anywhere below dir. */
static int has_arrays(struct node *dir)
{
	struct dir_node *d = to_dir(dir);
	for (size_t i = 0; i < d->nkids; i++) {
		struct node *k = d->kids[i];
		if (k->kind == N_PDIR && has_arrays(k))
			return 1;
		if (k->kind == N_PFILE && to_pfile(k)->pf.kind != PF_META && to_pfile(k)->pf.kind != PF_RAW)
			return 1;
	}
	return 0;
}

/* Item `it` becomes a stored copy (ns_lock exclusive): the metadata files
 * copied into it so far go to its folder as they are. */
int ckpt_raw_make_stored(ckpt_view *v, struct node *it, const char *why)
{
	ckpt_assert_held(CKPT_RANK_NS);
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
	/* no read or write of the step runs while its files change kind */
	ckpt_wrlock(&ps->io_lock, CKPT_RANK_IO);
	for (size_t i = 0; i < d->nkids && !rc; i++) {
		struct node *k = d->kids[i];
		if (k->kind != N_PFILE || to_pfile(k)->pf.kind != PF_META)
			continue;
		struct pfile *pf = &to_pfile(k)->pf;
		char rel[VIEW_PATH_MAX];
		rc = ckpt_pf_rel_of(v, it, pf->final ? pf->final : k->name, rel, sizeof(rel));
		if (rc)
			break;
		ckpt_lock(&pf->mu, CKPT_RANK_PF);
		int fd = ckpt_pf_raw_open(ps, rel, O_WRONLY | O_CREAT | O_TRUNC);
		rc = fd < 0 ? fd : ckpt_pwrite_all(fd, pf->hdr, (size_t)pf->size, 0);
		if (fd >= 0)
			close(fd);
		if (!rc && !(pf->rel = strdup(rel)))
			rc = -ENOMEM;
		if (!rc)
			ckpt_pf_set_kind(pf, &ckpt_pf_raw_ops);
		ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	}
	ckpt_rwunlock(&ps->io_lock, CKPT_RANK_IO);
	if (rc == 0) {
		pd->stored = 1;
		ckpt_log(CKPT_LOG_INFO, "step %s: item %s is a stored copy (%s is not a .npy array)",
			 ckpt_pf_step_name_of(v, it), it->name, why);
	}
	return rc;
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
int ckpt_raw_check_stored(ckpt_view *v, struct node *sn, int quiet)
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
			cJSON *cm = ckpt_pf_copied_json(sn, CKPT_ORBAX_CKPT_METADATA, &bad);
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
 * The rename of the step to S commits it (ckpt_ps_commit): the writer fsyncs
 * every file and folder, drops leftover "*.__lock" files and renames the
 * folder (ckpt_step_set_as_written); on an object store the staged folder
 * is then uploaded, commit_success.txt last.  rmdir of the step (Orbax's
 * rmtree of a stale tmp folder) throws it away.  fsync answers at once:
 * the commit makes the step durable.
 */

/* mkdir in an Orbax save (ns_lock exclusive). */
int ckpt_aw_mkdir(ckpt_view *v, struct node *dir, const char *name, ckpt_attr *out)
{
	ckpt_assert_held(CKPT_RANK_NS);
	struct pstep *ps = to_pdir(dir)->ps;
	char rel[VIEW_PATH_MAX], path[VIEW_PATH_MAX];
	if (ckpt_node_find_kid(dir, name))
		return -EEXIST;
	int rc = ckpt_pf_rel_of(v, dir, name, rel, sizeof(rel));
	if (!rc)
		rc = ckpt_pf_tmp_file(ps, rel, path, sizeof(path));
	if (!rc && mkdir(path, 0755) && errno != EEXIST)
		rc = -errno;
	if (rc) {
		ckpt_log(CKPT_LOG_ERR, "%s: mkdir in the tmp folder: %s", rel, strerror(-rc));
		return rc;
	}
	struct node *n = ckpt_node_new(v, &ckpt_pdir_ops, name, dir);
	if (!n || ckpt_node_add_kid(dir, n) < 0)
		return -ENOMEM;
	to_pdir(n)->ps = ps;
	ckpt_node_fill_attr(v, n, out);
	ckpt_raw_note_writer(ps);
	return 0;
}

/* A new file in an Orbax save (ns_lock exclusive), made on disk at once. */
int ckpt_aw_create(ckpt_view *v, struct pfile_node *f)
{
	int fd = ckpt_pf_raw_open_f(v, f, O_RDWR | O_CREAT);
	if (fd < 0) {
		ckpt_log(CKPT_LOG_ERR, "%s: cannot create it in the tmp folder: %s", f->n.name,
			 strerror(-fd));
		return fd; /* the node is unlinked: freed with the view */
	}
	ckpt_lock(&f->pf.mu, CKPT_RANK_PF);
	ckpt_pf_raw_note_stat(&f->pf, fd);
	ckpt_unlock(&f->pf.mu, CKPT_RANK_PF);
	close(fd);
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
int ckpt_aw_rename(ckpt_view *v, struct node *dir, struct node *n, struct node *ndir, const char *newname,
		   unsigned flags)
{
	ckpt_assert_held(CKPT_RANK_NS);
	struct pstep *ps = to_pdir(dir)->ps;
	if (!ndir || (ndir->kind != N_PSTEP && ndir->kind != N_PDIR) || to_pdir(ndir)->ps != ps ||
	    atomic_load(&ndir->orphan))
		return -EXDEV;
	if (frozen(ps))
		return ckpt_pf_refuse(n->name, "rename (the step is committed or committing)");
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
	int rc = ckpt_pf_rel_of(v, dir, n->name, orel, sizeof(orel));
	if (!rc)
		rc = ckpt_pf_rel_of(v, ndir, newname, nrel, sizeof(nrel));
	if (!rc)
		rc = ckpt_pf_tmp_file(ps, orel, op, sizeof(op));
	if (!rc)
		rc = ckpt_pf_tmp_file(ps, nrel, np, sizeof(np));
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
	ckpt_raw_note_writer(ps);
	return rc;
}

/* rmdir of an empty folder in an Orbax save (ns_lock exclusive). */
int ckpt_aw_rmdir(ckpt_view *v, struct node *dir, struct node *n)
{
	ckpt_assert_held(CKPT_RANK_NS);
	struct pstep *ps = to_pdir(n)->ps;
	if (frozen(ps))
		return ckpt_pf_refuse(n->name, "remove (the step is committed or committing)");
	if (to_dir(n)->nkids)
		return -ENOTEMPTY;
	char rel[VIEW_PATH_MAX], path[VIEW_PATH_MAX];
	int rc = ckpt_pf_rel_of(v, dir, n->name, rel, sizeof(rel));
	if (!rc)
		rc = ckpt_pf_tmp_file(ps, rel, path, sizeof(path));
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
 * one stored as written (ckpt_aw_convert): a TensorStore lock file ("*.__lock")
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
			if (pf->kind != PF_RAW && pf->kind != PF_JSON && pf->kind != PF_META &&
			    pf->kind != PF_MARKER)
				return 1;
		}
	}
	return 0;
}

/* Put dir's folders and buffered files in the tmp folder (io_lock exclusive). */
static int aw_spill(ckpt_view *v, struct node *dir)
{
	ckpt_assert_held(CKPT_RANK_IO);
	struct dir_node *d = to_dir(dir);
	struct pstep *ps = to_pdir(dir)->ps;
	int rc = 0;
	for (size_t i = 0; i < d->nkids && !rc; i++) {
		struct node *k = d->kids[i];
		char rel[VIEW_PATH_MAX], path[VIEW_PATH_MAX];
		rc = ckpt_pf_rel_of(v, dir, k->name, rel, sizeof(rel));
		if (!rc)
			rc = ckpt_pf_tmp_file(ps, rel, path, sizeof(path));
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
		if (pf->kind != PF_RAW) {
			int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
			rc = fd < 0	? -errno
			     : pf->size ? ckpt_pwrite_all(fd, pf->hdr, (size_t)pf->size, 0)
					: 0;
			if (fd >= 0) {
				ckpt_pf_raw_note_stat(pf, fd);
				close(fd);
			}
		}
		if (!rc) {
			if (pf->kind != PF_RAW)
				ckpt_pf_set_kind(pf, &ckpt_pf_raw_ops);
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
int ckpt_aw_convert(ckpt_view *v, struct node *sn, const char *why)
{
	ckpt_assert_held(CKPT_RANK_NS);
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
int ckpt_aw_fresh_meta(struct pfile *pf)
{
	ckpt_lock(&pf->mu, CKPT_RANK_PF);
	cJSON *j = pf->hdr ? cJSON_ParseWithLength((const char *)pf->hdr, (size_t)pf->size) : NULL;
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "commit_timestamp_nsecs");
	int fresh = cJSON_IsObject(j) && cJSON_IsNull(c);
	cJSON_Delete(j);
	return fresh;
}

/* ---- the kind's ops (PF_RAW): bytes in the tmp folder ---------------------------- */

static ssize_t raw_write(ckpt_view *v, struct pfile_node *f, uint64_t off, const uint8_t *data, size_t len,
			 int append)
{
	ckpt_assert_held(CKPT_RANK_IO);
	struct pfile *pf = &f->pf;
	ckpt_lock(&pf->mu, CKPT_RANK_PF);
	ckpt_pf_note_write_locked(pf, &off, len, append);
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	/* the path changes only under io_lock exclusive: it holds without pf->mu */
	int fd = ckpt_pf_raw_open_f(v, f, O_WRONLY);
	int rc = fd < 0 ? fd : ckpt_pwrite_all(fd, data, len, off);
	if (rc < 0) {
		if (fd >= 0)
			close(fd);
		ckpt_log(CKPT_LOG_ERR, "%s: write: %s", f->n.name, strerror(-rc));
		return rc;
	}
	ckpt_lock(&pf->mu, CKPT_RANK_PF);
	if (off + len > pf->size)
		pf->size = off + len;
	ckpt_pf_raw_note_stat(pf, fd);
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	close(fd);
	return (ssize_t)len;
}

static ssize_t raw_read(ckpt_view *v, struct pfile_node *f, uint64_t off, size_t len, uint8_t *dst)
{
	ckpt_assert_held(CKPT_RANK_IO);
	ckpt_lock(&f->pf.mu, CKPT_RANK_PF);
	uint64_t size = f->pf.size;
	ckpt_unlock(&f->pf.mu, CKPT_RANK_PF);
	size_t k = off < size ? (size_t)(size - off < len ? size - off : len) : 0;
	int fd = k ? ckpt_pf_raw_open_f(v, f, O_RDONLY) : 0;
	int rc = fd < 0 ? fd : k ? ckpt_pread_all(fd, dst, k, off) : 0;
	if (k && fd >= 0)
		close(fd);
	return rc < 0 ? rc : (ssize_t)k;
}

static int raw_truncate(ckpt_view *v, struct pfile_node *f, uint64_t size)
{
	ckpt_assert_held(CKPT_RANK_IO);
	struct pfile *pf = &f->pf;
	ckpt_lock(&pf->mu, CKPT_RANK_PF);
	int fd = ckpt_pf_raw_open_f(v, f, O_WRONLY);
	int rc = fd < 0 ? fd : ftruncate(fd, (off_t)size) ? -errno : 0;
	if (!rc) {
		pf->size = pf->hwm = size;
		ckpt_pf_raw_note_stat(pf, fd);
	}
	if (fd >= 0)
		close(fd);
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	return rc;
}

/* unlink: the file leaves the tmp folder (a failure is only logged). */
static int raw_destroy(ckpt_view *v, struct pfile_node *f)
{
	ckpt_assert_held(CKPT_RANK_IO);
	char raw[VIEW_PATH_MAX];
	ckpt_lock(&f->pf.mu, CKPT_RANK_PF);
	if (ckpt_pf_raw_path(v, f, raw, sizeof(raw)) == 0 && unlink(raw) && errno != ENOENT)
		ckpt_log(CKPT_LOG_WARN, "%s: unlink: %s", raw, strerror(errno));
	ckpt_unlock(&f->pf.mu, CKPT_RANK_PF);
	return 0;
}

const struct pfile_ops ckpt_pf_raw_ops = {
	.kind = PF_RAW,
	.name = "raw",
	.write = raw_write,
	.read = raw_read,
	.truncate = raw_truncate,
	.check = ckpt_pf_copy_busy,
	.destroy = raw_destroy,
};
