/*
 * pending/step.c - the life of a pending step (N_PSTEP): mkdir of a step
 * begins it, the checks say when it is complete, the commit (a rename, or
 * its commit marker) seals it and swaps it for the committed step, a
 * settle finds out what an uncertain upload did, rmdir aborts it; a
 * <step>.orbax-checkpoint-tmp folder left over in SOURCE becomes one at
 * view open.  Every state change goes through ps_set(), which asserts the
 * edge (the table below).
 * Not here: the bytes of its files (file.c, safetensors.c, raw.c), the
 * copy-tool watch (raw.c), which namespace call does what (namespace.c).
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "orbax.h"
#include "stats.h"
#include "sysio.h"
#include "writer_hosts.h"
#include "pending_int.h"

/*
 * The life of a pending step (ps->state; every change through ps_set(),
 * which asserts the edge, and read with atomic loads):
 *
 *   from        to          by
 *   OPEN        COMMITTING  ckpt_ps_commit: checks passed, ns_lock dropped
 *   COMMITTING  OPEN        ckpt_ps_commit: the writer refused (holes, names,
 *                           a copy not whole yet): the step stays pending
 *   COMMITTING  SEALED      ckpt_ps_commit: the writer committed (renamed; on
 *                           an object store: staged); its state is freed
 *   SEALED      COMMITTED   ckpt_ps_commit: swapped for the committed step
 *   SEALED      LOST        ckpt_ps_commit: object store, the upload failed
 *                           and its marker is known not to be there; the
 *                           staged copy is gone, nothing is left
 *   SEALED      UNSETTLED   ckpt_ps_commit: object store, whether the marker
 *                           landed is unknown; every object and the staged
 *                           copy are kept, the step stays pending
 *   UNSETTLED   COMMITTED   ckpt_ps_settle (a touch of the marker): it landed
 *   UNSETTLED   LOST        ckpt_ps_settle: it did not (what was sent is gone)
 *   OPEN        ABORTED     ckpt_view_rmdir (and ckpt_ps_new on ENOMEM)
 *   LOST        ABORTED     ckpt_view_rmdir (the lost step's folder goes)
 *
 * What each state means for the rest of the file:
 *   dead (no writes, reads ESTALE): SEALED, COMMITTED, LOST, ABORTED;
 *   frozen (no namespace change): COMMITTING, SEALED and every dead state.
 * OPEN -> COMMITTING and the ends of ckpt_ps_commit happen under ns_lock
 * exclusive; COMMITTING -> SEALED under io_lock exclusive.
 * (enum ps_state is in pending_int.h.)
 */

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

static int sink_shard_done(void *ctx, const char *rel)
{
	return ckpt_bg_upload_file(ctx, rel);
}

static void sink_shard_changed(void *ctx, const char *rel)
{
	ckpt_bg_upload_stale(ctx, rel);
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

/* pstep_ops.reserves: the final name of a committing step (ns_lock held);
 * layout.c's ckpt_name_reserved asks every pending step of the root. */
static ssize_t pstep_getxattr(ckpt_view *v, struct node *n, const char *name, char *buf, size_t cap);

static const char *pstep_reserves(struct node *k)
{
	struct pstep *ps = to_pdir(k)->ps;
	int st = atomic_load(&ps->state);
	return st == PS_COMMITTING || st == PS_SEALED ? ps->final : st == PS_UNSETTLED ? ps->unsettled : NULL;
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
	struct node *n = ckpt_node_new(v, &ckpt_pdir_ops, name, dir);
	if (!n)
		return -ENOMEM;
	to_pdir(n)->ps = ps;
	to_pdir(n)->stored = 1; /* its files are staged as they come */
	to_pdir(n)->is_views = 1;
	n->hidden = 1;
	*out = n;
	return 0;
}

static const struct node_ops pstep_ops = {
	.kind = N_PSTEP,
	.size = sizeof(struct pdir_node),
	.getattr = ckpt_pdir_attr,
	.readdir = ckpt_node_readdir_kids,
	.destroy = pstep_destroy,
	.reserves = pstep_reserves,
	.getxattr = pstep_getxattr,
	.lookup = pstep_lookup,
};

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

int ckpt_ps_new(ckpt_view *v, struct node *root, const char *name, ckpt_attr *out)
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
	/* mkdir S over S.orbax-checkpoint-tmp left over at open (shown as a
	 * pending step, see below): it is reclaimed, as the writer reclaims a
	 * stale tmp folder nobody holds. */
	char tname[VIEW_NAME_BUF];
	struct node *old = NULL;
	if (!as_written &&
	    snprintf(tname, sizeof(tname), "%s%s", name, CKPT_ORBAX_TMP_INFIX) < (int)sizeof(tname))
		old = ckpt_node_find_kid(root, tname);
	if (old && old->kind == N_PSTEP && to_pdir(old)->ps->leftover &&
	    atomic_load(&to_pdir(old)->ps->state) == PS_OPEN) {
		int rc = ckpt_ps_abort(v, root, old);
		if (rc)
			return rc;
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

/* ---- pending folders left over ------------------------------------------------------
 *
 * A <step>.orbax-checkpoint-tmp folder that a writable local root holds
 * when it is mounted was left by an earlier mount or an earlier Orbax run
 * (nothing holds its lock).  It is shown as what it is, a pending step
 * stored as written (the same thing an Orbax save through the mount makes),
 * its folders and files as they are: rm -r through the mount removes it
 * from SOURCE (the rmdir of the step aborts it), a rename to <step>
 * commits it, Orbax may finish it.  Its node answers user.ckpt.leftover,
 * which `ckptfs status` reads.  A read-only mount, an object-store root
 * and a mount with process_count leave such folders hidden.
 */

/* The folders and regular files of dfd (an adopted step's folder, or one
 * of its folders) as kids of dir; depth: dir's below the step. */
static int adopt_tree(ckpt_view *v, struct node *dir, int dfd, int depth)
{
	DIR *d = fdopendir(dfd);
	if (!d) {
		close(dfd);
		return -errno;
	}
	int rc = 0;
	struct dirent *e;
	while (!rc && (e = readdir(d))) {
		struct stat sb;
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") ||
		    fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW))
			continue;
		if (S_ISDIR(sb.st_mode) && depth < CKPT_ORBAX_MAX_DEPTH) {
			struct node *n = ckpt_node_new(v, &ckpt_pdir_ops, e->d_name, dir);
			if (!n || ckpt_node_add_kid(dir, n) < 0) {
				rc = -ENOMEM;
				break;
			}
			to_pdir(n)->ps = to_pdir(dir)->ps;
			int sub =
				openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (sub >= 0)
				rc = adopt_tree(v, n, sub, depth + 1);
		} else if (S_ISREG(sb.st_mode)) {
			/* its path follows renames (pf.rel NULL), as in an Orbax save */
			struct pfile_node *f = ckpt_pf_node_new(v, dir, e->d_name, &ckpt_pf_raw_ops);
			if (!f || ckpt_node_add_kid(dir, &f->n) < 0) {
				rc = -ENOMEM;
				break;
			}
			f->pf.size = (uint64_t)sb.st_size;
			f->pf.raw_mtime_ns = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
		}
	}
	closedir(d);
	return rc;
}

/* The left-over folder `name` (<sname>.orbax-checkpoint-tmp) as a pending
 * step of root (ns_lock exclusive, at view open). */
static void adopt_one(ckpt_view *v, struct node *root, const char *name, const char *sname)
{
	ckpt_writer_opts o;
	ckpt_writer_opts_init(&o);
	ckpt_step *st;
	if (ckpt_step_adopt(v->source, sname, &o, &st) < 0)
		return; /* logged; it stays hidden */
	ckpt_step_info info;
	ckpt_step_get_info(st, &info);
	int dfd = open(info.tmp_path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	struct pstep *ps = calloc(1, sizeof(*ps));
	struct node *n = ps && dfd >= 0 ? ckpt_node_new(v, &pstep_ops, name, root) : NULL;
	if (!n) {
		if (dfd >= 0)
			close(dfd);
		ckpt_step_destroy(st); /* its folder stays as it is */
		free(ps);
		return;
	}
	ps->step = st;
	atomic_init(&ps->as_written, 1);
	ps->leftover = 1;
	pthread_rwlock_init(&ps->io_lock, NULL);
	pthread_mutex_init(&ps->wp_mu, NULL);
	atomic_init(&ps->last_op_ns, ckpt_now_ns());
	atomic_init(&ps->state, PS_OPEN);
	to_pdir(n)->ps = ps; /* the node owns it from here on */
	int rc = ckpt_node_add_kid(root, n);
	if (rc == 0)
		rc = adopt_tree(v, n, dfd, 0);
	else
		close(dfd);
	if (rc < 0) { /* not shown whole: not shown; its folder stays as it is */
		ckpt_node_remove_kid(root, n);
		atomic_store(&n->orphan, true);
		ckpt_step_destroy(st);
		ps->step = NULL;
		ps_set(ps, PS_ABORTED);
		ckpt_log(CKPT_LOG_ERR, "%s: cannot show the pending folder left over: %s", info.tmp_path,
			 strerror(-rc));
		return;
	}
	ckpt_log(CKPT_LOG_INFO,
		 "%s: left by an earlier mount or Orbax run; shown as pending step %s (rm -r it through the "
		 "mount to discard it, or rename it to %s to commit it)",
		 info.tmp_path, name, sname);
}

void ckpt_pending_adopt_leftovers(ckpt_view *v)
{
	if (!v->writable || v->opts.spool_dir || v->opts.process_count > 1)
		return;
	DIR *d = opendir(v->source);
	if (!d)
		return;
	ckpt_wrlock(&v->ns_lock, CKPT_RANK_NS);
	struct node *root = ckpt_node_at(v, CKPT_ROOT_INO);
	struct dirent *e;
	while ((e = readdir(d))) {
		char sname[CKPT_ORBAX_NAME_MAX + 1], want[VIEW_NAME_BUF];
		struct stat sb;
		if (!ckpt_orbax_tmp_step(e->d_name, sname, sizeof(sname)) ||
		    snprintf(want, sizeof(want), "%s%s", sname, CKPT_ORBAX_TMP_INFIX) < 0 ||
		    strcmp(want, e->d_name) || fstatat(dirfd(d), e->d_name, &sb, AT_SYMLINK_NOFOLLOW) ||
		    !S_ISDIR(sb.st_mode) || ckpt_node_find_kid(root, e->d_name) ||
		    ckpt_node_find_kid(root, sname))
			continue;
		adopt_one(v, root, e->d_name, sname);
	}
	ckpt_rwunlock(&v->ns_lock, CKPT_RANK_NS);
	closedir(d);
}

/* pstep_ops.getxattr: user.ckpt.leftover of a step adopted at open. */
static ssize_t pstep_getxattr(ckpt_view *v, struct node *n, const char *name, char *buf, size_t cap)
{
	(void)v;
	static const char val[] = "an earlier mount";
	if (!to_pdir(n)->ps->leftover || strcmp(name, "user.ckpt.leftover"))
		return -ENODATA;
	if (cap && cap < sizeof(val) - 1)
		return -ERANGE;
	if (cap)
		memcpy(buf, val, sizeof(val) - 1);
	return (ssize_t)(sizeof(val) - 1);
}

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

int ckpt_ps_commit(ckpt_view *v, struct node *sn, const char *final, int copy, struct node **committed)
{
	ckpt_assert_held(CKPT_RANK_NS);
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
		rc = ckpt_raw_check_stored(v, sn, copy); /* a copy not whole yet: -EAGAIN, quietly */
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
int ckpt_ps_settle(ckpt_view *v, struct node *sn, struct node **committed)
{
	ckpt_assert_held(CKPT_RANK_NS);
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

/* A pending file of the step, for step_check (ns_lock held): its kind says. */
static void check_file(struct check *c, struct node *dir, struct pfile_node *f)
{
	char why[512] = "";
	int rc = f->pf.ops->check(f, c->copy, why, sizeof(why));
	if (rc)
		check_fail(c, rc, "%s/%s: %s", dir->name, f->n.name, why);
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
	int rc = kbuf ? ckpt_pf_key_path(c->v, parent_of(c->v, stdir), stem, &item, keys, types, &depth, kbuf)
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
			if (pf->kind != PF_META && pf->kind != PF_MARKER && pf->kind != PF_INDEX)
				*content = 1;
			check_file(c, dir, to_pfile(k));
		}
	}
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
	cJSON *j = ckpt_pf_copied_json(it, CKPT_ORBAX_METADATA, &bad);
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
	ckpt_assert_held(CKPT_RANK_NS);
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
	cJSON *cm = ckpt_pf_copied_json(sn, CKPT_ORBAX_CKPT_METADATA, &bad);
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
	cJSON *cm = ckpt_pf_copied_json(sn, CKPT_ORBAX_CKPT_METADATA, &bad);
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
		cJSON *sh = it->kind == N_PDIR ? ckpt_pf_copied_json(it, CKPT_ORBAX_SHARDING, &bad) : NULL;
		if (sh) {
			struct shard_ctx sc = { sh };
			ckpt_step_foreach_array(ps->step, it->name, apply_sharding, &sc);
		}
		cJSON_Delete(sh);
	}
}

static int watch_commit(ckpt_view *v, struct node *sn);

/* Commit sn if it may (copy: only when complete; else now or why not).
 * ns_lock exclusive held (ckpt_ps_commit drops and retakes it).  watch:
 * called by the copy-tool watch (raw.c) once the tools that copied the
 * step exited. */
static int try_commit(ckpt_view *v, struct node *sn, int copy, int watch)
{
	ckpt_assert_held(CKPT_RANK_NS);
	int rc = step_check(v, sn, copy, !copy);
	if (rc)
		return copy ? 0 : rc; /* a copy waits for its last file */
	if (copy && ckpt_raw_has_stored(sn) && !watch && ckpt_raw_writers_alive(to_pdir(sn)->ps)) {
		/* Nothing says when a copy of stored files is whole but the end
		 * of the tool that copies them. */
		ckpt_raw_start_copy_thread(v, watch_commit);
		return 0;
	}
	apply_copied_meta(sn);
	struct node *step;
	rc = ckpt_ps_commit(v, sn, sn->name, copy, &step);
	return copy && rc == -EAGAIN ? 0 : rc;
}

static int watch_commit(ckpt_view *v, struct node *sn)
{
	return try_commit(v, sn, 1, 1);
}

int ckpt_ps_try_commit(ckpt_view *v, struct node *sn, int copy)
{
	return try_commit(v, sn, copy, 0);
}

/* rmdir of pending step n (OPEN or LOST) of dir (ns_lock exclusive). */
int ckpt_ps_abort(ckpt_view *v, struct node *dir, struct node *n)
{
	ckpt_assert_held(CKPT_RANK_NS);
	(void)v;
	struct pstep *ps = to_pdir(n)->ps;
	if ((atomic_load(&ps->state) == PS_COMMITTING || atomic_load(&ps->state) == PS_SEALED)) {
		/* never wait for io_lock here: the commit needs ns_lock to finish */
		return ckpt_pf_refuse(n->name, "remove (the step is committing)");
	}
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
	ckpt_log(CKPT_LOG_INFO, "step %s: aborted", n->name);
	return 0;
}
