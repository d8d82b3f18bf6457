/*
 * pending/namespace.c - the namespace calls of the write protocol: mkdir,
 * create, rename, unlink, rmdir, flush, setattr and setxattr on the pending
 * steps of a writable root (and the answers for committed data).  create
 * decides what a new pending file is (new_pfile); each call then hands the
 * work to the file of its job.
 * Not here: the step's life (step.c), file bytes (file.c, safetensors.c,
 * raw.c).
 */
#include <ctype.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "orbax.h"
#include "writer_hosts.h"
#include "pending_int.h"

int ckpt_view_is_writable(ckpt_view *v, ckpt_ino ino)
{
	struct node *n = ckpt_node_at(v, ino);
	return n && n->kind == N_PFILE && !ps_dead(to_pfile(n)->ps);
}

int ckpt_view_check_writable(ckpt_view *v, ckpt_ino ino)
{
	struct node *n = ckpt_node_at(v, ino);
	if (!n)
		return -ENOENT;
	if (n->kind == N_PFILE && !ps_dead(to_pfile(n)->ps) && !atomic_load(&n->orphan))
		return 0;
	if (ckpt_pf_is_commit_marker(v, n))
		return 0; /* writes still answer EROFS; O_TRUNC does nothing */
	return ckpt_pf_refuse(n->name, "open for writing");
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
		rc = ckpt_ps_new(v, dir, name, out);
	} else if ((dir->kind == N_PSTEP || dir->kind == N_PDIR) && !frozen(to_pdir(dir)->ps) &&
		   !atomic_load(&dir->orphan) && to_pdir(dir)->ps->as_written) {
		rc = ckpt_aw_mkdir(v, dir, name, out);
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
		} else if (dir->kind == N_PDIR &&
			   !(ckpt_pf_item_of(v, dir) && to_pdir(ckpt_pf_item_of(v, dir))->stored) &&
			   (rc = ckpt_pf_key_of_name(name, key, sizeof(key))) < 0) {
			/* logged */
		} else if (jf && jf->kind == N_PFILE && to_pfile(jf)->pf.kind == PF_JSON) {
			ckpt_log(CKPT_LOG_ERR, "%s: %s is a JSON item: it holds only %s", name, dir->name,
				 jf->name);
			rc = -EINVAL;
		} else if (ckpt_node_find_kid(dir, name)) {
			rc = -EEXIST;
		} else if (dir->kind == N_PDIR && ckpt_pf_item_of(v, dir) &&
			   to_pdir(ckpt_pf_item_of(v, dir))->is_views &&
			   (dir != ckpt_pf_item_of(v, dir) || ps->views_import)) {
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
			struct node *n = rc == 0 ? ckpt_node_new(v, &ckpt_pdir_ops, name, dir) : NULL;
			if (n) /* shards of a safetensors import (before publication) */
				to_pdir(n)->is_stdir = dir->kind == N_PDIR &&
						       has_suffix(name, ST_DIR_SUFFIX) &&
						       !(ckpt_pf_item_of(v, dir) &&
							 to_pdir(ckpt_pf_item_of(v, dir))->stored);
			if (rc == 0 && (!n || ckpt_node_add_kid(dir, n) < 0))
				rc = -ENOMEM;
			if (rc == 0) {
				to_pdir(n)->ps = ps;
				ckpt_node_fill_attr(v, n, out);
				ckpt_raw_note_writer(ps);
			}
		}
	} else {
		rc = ckpt_pf_refuse(name, "make a directory");
	}
	ckpt_rwunlock(&v->ns_lock, CKPT_RANK_NS);
	return rc;
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
		k += !(d->kids[i]->kind == N_PFILE && to_pfile(d->kids[i])->pf.kind == PF_META);
	return k;
}

/*
 * The classifier: what a new file of a pending step that is not an Orbax
 * save is, from its final name `eff`, its folder and what the item holds
 * so far: *kind, or -errno (logged).  The only place that looks at a new
 * file's name to choose its kind.
 */
static int classify(ckpt_view *v, struct node *dir, const char *name, const char *eff, enum pfile_kind *kind)
{
	struct node *it = dir->kind == N_PDIR ? ckpt_pf_item_of(v, dir) : NULL;
	struct node *up = parent_of(v, dir);
	int stored = it && to_pdir(it)->stored;
	int meta = stored ? 0 : copied_meta_kind(v, dir, eff);
	int is_npy = has_suffix(eff, ".npy");
	int is_json = up && up->kind == N_PSTEP && !strcmp(eff, ckpt_step_json_file(dir->name));
	int in_stdir = dir->kind == N_PDIR && to_pdir(dir)->is_stdir;
	int is_st = it && !stored && !meta && has_suffix(eff, ST_SUFFIX);
	int is_index = in_stdir && !strcmp(eff, CKPT_ST_INDEX_NAME);
	if (in_stdir && !is_st && !is_index) {
		ckpt_log(CKPT_LOG_ERR, "%s: %s holds only *.safetensors shards and %s", name, dir->name,
			 CKPT_ST_INDEX_NAME);
		return -EPERM;
	}
	if (is_st || is_index) {
		*kind = is_st ? PF_ST : PF_INDEX;
	} else if (it && (stored || (!meta && !is_npy && !is_json))) {
		*kind = PF_RAW; /* a file of a stored copy (the item becomes one) */
	} else if (!meta && dir->kind == N_PSTEP) {
		ckpt_log(CKPT_LOG_ERR, "%s: files go in an item directory (mkdir %s/ITEM first)", name,
			 dir->name);
		return -EPERM;
	} else if (meta) {
		*kind = meta == 2 ? PF_MARKER : PF_META;
	} else if (is_json) {
		*kind = PF_JSON; /* the JSON file of a JSON item (Orbax's JsonCheckpointHandler) */
	} else {
		*kind = is_npy && strchr(eff, '[') ? PF_SLICE : PF_ARRAY;
	}
	return 0;
}

/* PF_RAW: a file of a stored copy, made in the tmp folder under its final name. */
static int new_stored_file(ckpt_view *v, struct node *dir, const char *name, const char *eff,
			   struct pfile_node **out)
{
	struct node *it = ckpt_pf_item_of(v, dir);
	int rc = to_pdir(it)->stored ? 0 : ckpt_raw_make_stored(v, it, eff);
	if (rc < 0)
		return rc;
	char rel[VIEW_PATH_MAX];
	rc = ckpt_pf_rel_of(v, dir, eff, rel, sizeof(rel));
	struct pstep *ps = to_pdir(dir)->ps;
	if (!rc)
		rc = ckpt_pf_make_dirs(ps, rel);
	int fd = rc ? rc : ckpt_pf_raw_open(ps, rel, O_WRONLY | O_CREAT | O_TRUNC);
	if (fd < 0) {
		ckpt_log(CKPT_LOG_ERR, "%s: cannot create it in the tmp folder: %s", rel, strerror(-fd));
		return fd;
	}
	close(fd);
	struct pfile_node *f = ckpt_pf_node_new(v, dir, name, &ckpt_pf_raw_ops);
	if (!f || !(f->pf.rel = strdup(rel)))
		return -ENOMEM;
	*out = f;
	return 0;
}

/* PF_JSON: the JSON file of a JSON item, which holds nothing else. */
static int new_json(ckpt_view *v, struct node *dir, const char *name, const char *eff,
		    struct pfile_node **out)
{
	struct pstep *ps = to_pdir(dir)->ps;
	if (content_kids(dir)) {
		ckpt_log(CKPT_LOG_ERR, "%s/%s: a JSON item holds only its JSON file", dir->name, eff);
		return -EINVAL;
	}
	int rc = ckpt_step_set_json(ps->step, dir->name, "", 0);
	if (rc < 0)
		return rc;
	struct pfile_node *f = ckpt_pf_node_new(v, dir, name, &ckpt_pf_json_ops);
	if (!f) {
		ckpt_step_set_json(ps->step, dir->name, NULL, 0);
		return -ENOMEM;
	}
	*out = f;
	return 0;
}

/* PF_ARRAY, PF_SLICE: NAME.npy, or NAME[slice].npy of a declared NAME.npy. */
static int new_npy(ckpt_view *v, struct node *dir, const char *name, const char *eff, enum pfile_kind kind,
		   struct pfile_node **out)
{
	size_t len = strlen(eff);
	struct node *up = parent_of(v, dir);
	struct node *jf =
		up && up->kind == N_PSTEP ? ckpt_node_find_kid(dir, ckpt_step_json_file(dir->name)) : NULL;
	if (jf && jf->kind == N_PFILE && to_pfile(jf)->pf.kind == PF_JSON) {
		ckpt_log(CKPT_LOG_ERR, "%s: %s is a JSON item: it holds only %s", eff, dir->name, jf->name);
		return -EINVAL;
	}
	if (len < 5 || strcmp(eff + len - 4, ".npy")) {
		ckpt_log(CKPT_LOG_ERR,
			 "%s: only NAME.npy arrays (or NAME[slice].npy) can be written in a pending step",
			 eff);
		return -EPERM;
	}
	const char *br = kind == PF_SLICE ? strchr(eff, '[') : NULL;
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
			decl = ckpt_pf_adopt_decl(v, dir, base);
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
	} else {
		char stem[VIEW_NAME_BUF], key[VIEW_NAME_BUF];
		memcpy(stem, eff, len - 4);
		stem[len - 4] = 0;
		int rc = ckpt_pf_key_of_name(stem, key, sizeof(key));
		if (rc < 0)
			return rc;
	}
	struct pfile_node *f = ckpt_pf_node_new(v, dir, name, br ? &ckpt_pf_slice_ops : &ckpt_pf_array_ops);
	if (!f)
		return -ENOMEM;
	if (decl) {
		f->pf.decl = decl;
		atomic_fetch_add(&decl->pf.nslices, 1);
		f->pf.region = region;
		f->pf.arr = NULL; /* set when this file's own header has been checked */
		f->n.hidden = 1; /* slice files are hidden names */
	}
	*out = f;
	return 0;
}

static int new_pfile(ckpt_view *v, struct node *dir, const char *name, struct node **out)
{
	if (!to_pdir(dir)->ps->as_written && has_suffix(name, CKPT_ORBAX_LOCK_SUFFIX)) {
		struct node *sn = dir;
		while (sn && sn->kind != N_PSTEP)
			sn = parent_of(v, sn);
		int rc = sn ? ckpt_aw_convert(v, sn, name) : -EINVAL;
		if (rc)
			return rc;
	}
	struct pfile_node *f = NULL;
	if (to_pdir(dir)->ps->as_written) { /* an Orbax save: every file is stored as written */
		f = ckpt_pf_node_new(v, dir, name, &ckpt_pf_raw_ops);
		int rc = f ? ckpt_aw_create(v, f) : -ENOMEM;
		if (rc == 0)
			*out = &f->n;
		return rc;
	}
	if (dir->kind == N_PDIR && to_pdir(dir)->is_views) { /* view import: files go in .views/NAME/ */
		ckpt_log(CKPT_LOG_ERR, "%s: a view import is one folder %s/NAME/ of files", name,
			 CKPT_VIEWS_DIR);
		return -EPERM;
	}
	char fbuf[VIEW_NAME_BUF];
	const char *fin = temp_final(name, fbuf, sizeof(fbuf));
	const char *eff = fin ? fin : name;
	enum pfile_kind kind;
	int rc = classify(v, dir, name, eff, &kind);
	if (rc < 0)
		return rc;
	switch (kind) {
	case PF_RAW:
		rc = new_stored_file(v, dir, name, eff, &f);
		break;
	case PF_JSON:
		rc = new_json(v, dir, name, eff, &f);
		break;
	case PF_ARRAY:
	case PF_SLICE:
		rc = new_npy(v, dir, name, eff, kind, &f);
		break;
	default:
		f = ckpt_pf_node_new(v, dir, name,
				     kind == PF_ST	 ? &ckpt_pf_st_ops
				     : kind == PF_INDEX	 ? &ckpt_pf_index_ops
				     : kind == PF_MARKER ? &ckpt_pf_marker_ops
							 : &ckpt_pf_meta_ops);
		rc = f ? 0 : -ENOMEM;
	}
	if (rc < 0)
		return rc;
	if (fin && !(f->pf.final = strdup(fin)))
		return -ENOMEM; /* the node is unlinked: freed with the view */
	*out = &f->n;
	return 0;
}

int ckpt_view_flush(ckpt_view *v, ckpt_ino ino)
{
	ckpt_wrlock(&v->ns_lock, CKPT_RANK_NS);
	struct node *n = ckpt_node_at(v, ino);
	int rc = 0;
	if (n && n->kind == N_PFILE && atomic_load(&n->orphan)) {
		rc = to_pfile(n)->pf.kind == PF_MARKER ? to_pfile(n)->pf.commit_err : 0;
	} else if (n && n->kind == N_PFILE) {
		struct pfile_node *f = to_pfile(n);
		ckpt_lock(&f->pf.mu, CKPT_RANK_PF);
		int dirty = f->pf.dirty;
		f->pf.dirty = 0;
		ckpt_unlock(&f->pf.mu, CKPT_RANK_PF);
		struct node *sn = ckpt_pf_step_of(v, n);
		if (sn && !frozen(f->ps) && !atomic_load(&sn->orphan) && f->ps->as_written) {
			struct node *st;
			/* COMMIT_FILE: the step's own marker, written, commits */
			if (f->ps->commit_file && n->parent == sn->ino &&
			    !strcmp(n->name, CKPT_ORBAX_COMMIT_SUCCESS) && f->pf.size)
				rc = ckpt_ps_commit(v, sn, sn->name, 0, &st);
		} else if (sn && !frozen(f->ps) && !atomic_load(&sn->orphan)) {
			if (f->pf.kind == PF_META && n->parent == sn->ino &&
			    !strcmp(n->name, CKPT_ORBAX_CKPT_METADATA) && ckpt_aw_fresh_meta(&f->pf)) {
				rc = ckpt_aw_convert(v, sn, n->name);
			} else if (f->pf.kind == PF_MARKER && !dirty && !f->pf.final) {
				rc = ckpt_ps_try_commit(v, sn, 0); /* touch: commit now, or say why not */
				if (rc < 0 && !atomic_load(&n->orphan)) {
					/* not committed: no marker is left behind (touch again to retry) */
					f->ps->commit_wanted = 0;
					f->pf.commit_err = rc;
					ckpt_node_remove_kid(ckpt_node_at(v, n->parent), n);
					atomic_store(&n->orphan, true);
				}
			} else {
				if (f->pf.kind == PF_MARKER)
					f->ps->commit_wanted = 1;
				if (f->ps->commit_wanted)
					rc = ckpt_ps_try_commit(v, sn, 1);
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
	return ckpt_pf_refuse(n->name, "change the mode or owner");
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
		rc = ckpt_ps_settle(v, dir, &step);
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
				ckpt_raw_note_writer(to_pdir(dir)->ps);
		}
		if (rc == 0)
			ckpt_node_fill_attr(v, n, out);
	} else {
		rc = ckpt_pf_refuse(name, "create a file");
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
		rc = ckpt_aw_rename(v, dir, n, ckpt_node_at(v, newparent), newname, flags);
	else if (n->kind == N_PSTEP && parent == CKPT_ROOT_INO && newparent == CKPT_ROOT_INO &&
		 !ps_dead(to_pdir(n)->ps)) {
		struct node *step;
		if ((atomic_load(&to_pdir(n)->ps->state) == PS_COMMITTING ||
		     atomic_load(&to_pdir(n)->ps->state) == PS_SEALED)) {
			rc = ckpt_pf_refuse(name, "rename (the step is committing)");
		} else if (ckpt_orbax_name_ok(CKPT_NAME_STEP, newname, &why)) {
			rc = ckpt_ps_commit(v, n, newname, 0, &step);
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
			struct node *sn = ckpt_pf_step_of(v, dir);
			if (rc == 0 && sn && f->ps->commit_wanted)
				rc = ckpt_ps_try_commit(v, sn, 1);
		}
	} else if (n->kind == N_PSTEP || n->kind == N_PDIR || n->kind == N_PFILE) {
		ckpt_log(CKPT_LOG_ERR, "%s: only a whole pending step can be renamed (that commits it)",
			 name);
		rc = -EPERM;
	} else {
		rc = ckpt_pf_refuse(name, "rename");
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
			     : ckpt_pf_refuse(name, "remove");
	} else if (n->kind != N_PFILE) {
		rc = n->kind == N_PDIR ? -EISDIR : ckpt_pf_refuse(name, "remove");
	} else if (frozen(to_pfile(n)->ps)) {
		rc = ckpt_pf_refuse(name, "remove (the step is committed or committing)");
	} else {
		/* No write of the step runs while what the file put into it goes. */
		struct pfile_node *f = to_pfile(n);
		ckpt_wrlock(&f->ps->io_lock, CKPT_RANK_IO);
		rc = f->pf.ops->destroy(v, f);
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
		rc = ckpt_ps_abort(v, dir, n);
	} else if (n->kind == N_PSTEP && atomic_load(&to_pdir(n)->ps->state) == PS_UNSETTLED) {
		ckpt_log(CKPT_LOG_ERR,
			 "step %s: whether its commit landed is unknown; touch %s/%s to find out before "
			 "removing it",
			 name, name, CKPT_ORBAX_COMMIT_SUCCESS);
		rc = -EBUSY;
	} else if (n->kind == N_PDIR && to_pdir(n)->ps->as_written) {
		rc = ckpt_aw_rmdir(v, dir, n);
	} else if (n->kind == N_PDIR && to_pdir(dir)->is_views && !frozen(to_pdir(n)->ps)) {
		/* an emptied view import folder: the import is called off */
		char rel[VIEW_PATH_MAX], path[VIEW_PATH_MAX];
		rc = to_dir(n)->nkids ? -ENOTEMPTY : ckpt_pf_rel_of(v, dir, name, rel, sizeof(rel));
		if (!rc && !ckpt_pf_tmp_file(to_pdir(n)->ps, rel, path, sizeof(path)) && rmdir(path) &&
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
		rc = n->kind == N_DIR ? ckpt_pf_refuse(name, "remove") : -ENOTDIR;
	}
	ckpt_rwunlock(&v->ns_lock, CKPT_RANK_NS);
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
		return ckpt_pf_refuse(n->name, "set an extended attribute");
	}
	if (pf_buffered(&to_pfile(n)->pf))
		return -ENOTSUP; /* no attribute of its own (copy tools then skip it) */
	if (!strcmp(name, "user.ckpt.dtype"))
		return ckpt_pf_set_dtype(to_pfile(n), value, size);
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
	ckpt_warray *arr = pf->kind == PF_SLICE ? pf->decl->pf.arr : pf->arr;
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	if (ps_dead(f->ps)) {
		rc = ckpt_pf_refuse(n->name, "set an extended attribute");
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
