/*
 * pending/pfile.c - what every file of the write protocol shares: where a
 * pending file lives in its step's tmp folder (ckpt_pf_rel_of,
 * ckpt_pf_raw_path), the pytree keys a pending folder or file name stands
 * for (ckpt_pf_key_of_name, ckpt_pf_key_path), the header bytes of a
 * pending file, copied metadata as JSON; the pending file's kind and
 * header-phase tables (ckpt_pf_set_kind, ckpt_pf_set_phase, ckpt_pf_assert);
 * the node ops of N_PDIR and N_PFILE (a read dispatches through the file's
 * kind).
 * Not here: anything that changes a step's state (step.c), a kind's bytes
 * (file.c, safetensors.c, raw.c), which kind a new file is or the
 * namespace (namespace.c).
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "orbax.h"
#include "pending_int.h"

/* Refuse a change of committed data (or of a read-only mount), logged. */
int ckpt_pf_refuse(const char *name, const char *what)
{
	ckpt_log(CKPT_LOG_WARN,
		 "%s: cannot %s: read-only (committed data, or a mount that takes no new steps)", name, what);
	return -EROFS;
}

/* commit_success.txt of a committed step of a writable root: creating it
 * again is a commit that already happened (an idempotent no-op). */
int ckpt_pf_is_commit_marker(ckpt_view *v, struct node *n)
{
	struct node *step = n->kind == N_FILE ? parent_of(v, n) : NULL;
	return v->writable && step && step->parent == CKPT_ROOT_INO && step->kind != N_PSTEP &&
	       !strcmp(n->name, CKPT_ORBAX_COMMIT_SUCCESS);
}

const char *ckpt_pf_step_name_of(ckpt_view *v, struct node *it)
{
	struct node *up = parent_of(v, it);
	return up ? up->name : "?";
}

/* The item directory (a kid of the step) that n is in, or NULL. */
struct node *ckpt_pf_item_of(ckpt_view *v, struct node *n)
{
	while (n && n->kind == N_PDIR) {
		struct node *up = parent_of(v, n);
		if (up && up->kind == N_PSTEP)
			return n;
		n = up;
	}
	return NULL;
}

/* The pending step a pending node belongs to (ns_lock held), or NULL. */
struct node *ckpt_pf_step_of(ckpt_view *v, struct node *n)
{
	while (n && n->kind != N_PSTEP && n->ino != CKPT_ROOT_INO)
		n = parent_of(v, n);
	return n && n->kind == N_PSTEP ? n : NULL;
}

/* "<item>/<dirs>/<name>" of `name` in pending directory dir. */
int ckpt_pf_rel_of(ckpt_view *v, struct node *dir, const char *name, char *buf, size_t cap)
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
int ckpt_pf_tmp_file(struct pstep *ps, const char *rel, char *buf, size_t cap)
{
	ckpt_step_info info;
	ckpt_step_get_info(ps->step, &info);
	int m = snprintf(buf, cap, "%s/%s", info.tmp_path, rel);
	return m < 0 || (size_t)m >= cap ? -ENAMETOOLONG : 0;
}

/* mkdir -p of the folders of rel (not its last part) in the tmp folder. */
int ckpt_pf_make_dirs(struct pstep *ps, const char *rel)
{
	char path[VIEW_PATH_MAX];
	int rc = ckpt_pf_tmp_file(ps, rel, path, sizeof(path));
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

int ckpt_pf_raw_open(struct pstep *ps, const char *rel, int flags)
{
	char path[VIEW_PATH_MAX];
	int rc = ckpt_pf_tmp_file(ps, rel, path, sizeof(path));
	if (rc)
		return rc;
	int fd = open(path, flags | O_CLOEXEC | O_NOFOLLOW, 0644);
	return fd < 0 ? -errno : fd;
}

/* The path of raw file f in the tmp folder.  Its name and folders change
 * only under io_lock exclusive (renames in an Orbax save), so the caller
 * holds io_lock or ns_lock. */
int ckpt_pf_raw_path(ckpt_view *v, struct pfile_node *f, char *buf, size_t cap)
{
	char rel[VIEW_PATH_MAX];
	int rc = 0;
	if (f->pf.rel)
		snprintf(rel, sizeof(rel), "%s", f->pf.rel);
	else
		rc = ckpt_pf_rel_of(v, parent_of(v, &f->n), f->n.name, rel, sizeof(rel));
	return rc ? rc : ckpt_pf_tmp_file(f->ps, rel, buf, cap);
}

int ckpt_pf_raw_open_f(ckpt_view *v, struct pfile_node *f, int flags)
{
	char path[VIEW_PATH_MAX];
	int rc = ckpt_pf_raw_path(v, f, path, sizeof(path));
	if (rc)
		return rc;
	int fd = open(path, flags | O_CLOEXEC | O_NOFOLLOW, 0644);
	return fd < 0 ? -errno : fd;
}

/* Size and mtime of raw file f from its open descriptor fd (pf->mu held):
 * what stat answers from now on, unchanged by renames and closes. */
void ckpt_pf_raw_note_stat(struct pfile *pf, int fd)
{
	ckpt_assert_held(CKPT_RANK_PF);
	struct stat sb;
	if (fstat(fd, &sb) == 0) {
		pf->size = (uint64_t)sb.st_size;
		pf->raw_mtime_ns = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
	}
}

/* A pytree key as the tree shows it (the read side's escape): the key into
 * buf, or -EINVAL (logged) when `name` is no name the read side makes or
 * the key is not one a step may hold. */
int ckpt_pf_key_of_name(const char *name, char *buf, size_t cap)
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

/* Key path of a file in a pending step: item = first directory below the
 * step, keys = the directories below it plus the file's stem. */
int ckpt_pf_key_path(ckpt_view *v, struct node *dir, const char *stem, const char **item, const char **keys,
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
		int rc = ckpt_pf_key_of_name(rev[n - 2 - i], k, VIEW_NAME_BUF);
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

/* Header bytes [off, off + n) of a file still collecting its header
 * (pf->mu held): into pf->hdr, grown as needed. */
int ckpt_pf_hdr_put(struct pfile *pf, uint64_t off, const uint8_t *data, size_t n)
{
	ckpt_assert_held(CKPT_RANK_PF);
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

/* A read of [off, off + *len) of a pending file (pf->mu held): *len
 * clipped to the file's size (0 past its end), the part inside the header
 * bytes written so far copied to dst; returns the bytes copied. */
size_t ckpt_pf_header_part(const struct pfile *pf, uint64_t off, size_t *len, uint8_t *dst)
{
	ckpt_assert_held(CKPT_RANK_PF);
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

/* The content of a copied metadata file `name` in dir, parsed; NULL if
 * there is none.  *bad is set when it is there but not JSON. */
cJSON *ckpt_pf_copied_json(struct node *dir, const char *name, int *bad)
{
	struct node *k = ckpt_node_find_kid(dir, name);
	*bad = 0;
	if (!k || k->kind != N_PFILE || to_pfile(k)->pf.kind != PF_META)
		return NULL;
	struct pfile *pf = &to_pfile(k)->pf;
	ckpt_lock(&pf->mu, CKPT_RANK_PF);
	cJSON *j = pf->hdr ? cJSON_ParseWithLength((const char *)pf->hdr, (size_t)pf->size) : NULL;
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	*bad = j == NULL;
	return j;
}

void ckpt_pdir_attr(ckpt_view *v, struct node *n, ckpt_attr *a)
{
	(void)v;
	(void)n;
	a->is_dir = 1;
	a->nlink = 2;
	a->immutable = 0;
	a->mode = 0755;
}

const struct node_ops ckpt_pdir_ops = {
	.kind = N_PDIR,
	.size = sizeof(struct pdir_node),
	.getattr = ckpt_pdir_attr,
	.readdir = ckpt_node_readdir_kids,
};

/* ---- pending files: kinds, header phases, dispatch --------------------------- */

static const char *const ph_names[PH_NPHASES] = { "none", "header", "data" };

/* ph_edges[from] has bit `to` set for every legal edge (pending_int.h). */
static const unsigned ph_edges[PH_NPHASES] = {
	[PH_HEADER] = 1u << PH_DATA,
	[PH_DATA] = 1u << PH_HEADER,
};

/*
 * The kind of a pending file changes at run time only by these edges
 * (ckpt_pf_set_kind, which asserts them; io_lock exclusive and pf->mu held):
 *
 *   from                 to     by
 *   META                 RAW    make_stored (raw.c): its item became a
 *                               stored copy; its content went to the tmp folder
 *   JSON, META, MARKER   RAW    aw_spill (raw.c): its step became an Orbax
 *                               save (COMMIT_FILE mode); likewise
 */
static const unsigned pf_kind_edges[PF_NKINDS] = {
	[PF_JSON] = 1u << PF_RAW,
	[PF_META] = 1u << PF_RAW,
	[PF_MARKER] = 1u << PF_RAW,
};
_Static_assert(PF_NKINDS <= 32 && PH_NPHASES <= 32, "edge tables are 32-bit masks");

/* The kinds whose files begin with a header (the phase table). */
static int has_header(enum pfile_kind k)
{
	return k == PF_ARRAY || k == PF_SLICE || k == PF_ST;
}

void ckpt_pf_assert(const struct pfile *pf)
{
	(void)pf;
	assert(pf->kind < PF_NKINDS && pf->ops && pf->ops->kind == pf->kind);
	assert(pf->phase < PH_NPHASES && (pf->phase == PH_NONE) == !has_header(pf->kind));
	assert(pf->phase != PH_HEADER || pf->data_off == 0);
	assert(pf->phase != PH_DATA || (pf->data_off > 0 && pf->have >= pf->data_off &&
					(pf->kind == PF_ST ? pf->st_arr != NULL : pf->arr != NULL)));
	assert(pf->kind != PF_SLICE || pf->decl != NULL);
}

void ckpt_pf_set_phase(struct pfile *pf, enum pf_phase to)
{
	ckpt_assert_held(CKPT_RANK_PF);
	enum pf_phase from = pf->phase;
	if (from >= PH_NPHASES || !(ph_edges[from] & (1u << to))) {
		ckpt_log(CKPT_LOG_ERR, "pending file: no header phase edge %s -> %s",
			 from < PH_NPHASES ? ph_names[from] : "?", ph_names[to]);
		assert(!"pending file header phase edge");
	}
	pf->phase = to;
}

void ckpt_pf_set_kind(struct pfile *pf, const struct pfile_ops *ops)
{
	ckpt_assert_held(CKPT_RANK_PF);
	enum pfile_kind from = pf->kind, to = ops->kind;
	if (from >= PF_NKINDS || !(pf_kind_edges[from] & (1u << to))) {
		ckpt_log(CKPT_LOG_ERR, "pending file: no kind edge %s -> %s", pf->ops ? pf->ops->name : "?",
			 ops->name);
		assert(!"pending file kind edge");
	}
	pf->kind = to;
	pf->ops = ops;
	assert(!has_header(to));
}

void ckpt_pf_note_write_locked(struct pfile *pf, uint64_t *off, size_t len, int append)
{
	ckpt_assert_held(CKPT_RANK_PF);
	if (append) /* O_APPEND: after the furthest byte written, not the declared size */
		*off = pf_buffered(pf) || pf->kind == PF_RAW ? pf->size : pf->hwm;
	pf->dirty = 1;
	if (*off + len > pf->hwm)
		pf->hwm = *off + len;
}

int ckpt_pf_header_write(ckpt_view *v, struct pfile_node *f, uint64_t *off, const uint8_t *data, size_t len,
			 int append, ckpt_pf_collect_fn collect, const char *what,
			 void (*snap)(struct pfile *pf, void *arg), void *arg, size_t *take, size_t *data_off)
{
	struct pfile *pf = &f->pf;
	*take = 0;
	ckpt_lock(&pf->mu, CKPT_RANK_PF);
	ckpt_pf_assert(pf);
	ckpt_pf_note_write_locked(pf, off, len, append);
	if (pf->phase == PH_HEADER) {
		int rc = collect(v, f, *off, data, len, take);
		if (rc <= 0) {
			ckpt_unlock(&pf->mu, CKPT_RANK_PF);
			return rc;
		}
	} else if (*off < pf->data_off) {
		*take = pf->data_off - *off < len ? (size_t)(pf->data_off - *off) : len;
		if (memcmp(pf->hdr + *off, data, *take)) {
			ckpt_unlock(&pf->mu, CKPT_RANK_PF);
			ckpt_log(CKPT_LOG_ERR, "%s: the %s header cannot change once written", f->n.name,
				 what);
			return -EINVAL;
		}
	}
	*data_off = pf->data_off;
	if (snap)
		snap(pf, arg);
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
	return 1;
}

int ckpt_pf_copy_busy(struct pfile_node *f, int copy, char *why, size_t cap)
{
	ckpt_assert_held(CKPT_RANK_NS);
	ckpt_lock(&f->pf.mu, CKPT_RANK_PF);
	int dirty = f->pf.dirty;
	ckpt_unlock(&f->pf.mu, CKPT_RANK_PF);
	if (copy && (dirty || f->pf.final)) {
		snprintf(why, cap, "still being copied");
		return -EBUSY;
	}
	return 0;
}

void ckpt_pf_st_entries_free(ckpt_st_entry *e, size_t n)
{
	for (size_t i = 0; e && i < n; i++)
		free(e[i].name);
	free(e);
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
	a->volatile_data = pf->kind == PF_RAW && to_pfile(n)->ps->as_written;
	ckpt_unlock(&pf->mu, CKPT_RANK_PF);
}

static void pfile_destroy(ckpt_view *v, struct node *n)
{
	(void)v;
	struct pfile *pf = &to_pfile(n)->pf;
	pthread_mutex_destroy(&pf->mu);
	free(pf->hdr);
	free(pf->final);
	free(pf->rel);
	ckpt_pf_st_entries_free(pf->st, pf->nst);
	free(pf->st_arr);
}

/* Read back a pending file (io_lock shared: never concurrent with the
 * step's commit or abort), through its kind. */
static ssize_t pending_read(ckpt_view *v, struct node *node, uint64_t off, size_t len, void *dst)
{
	struct pfile_node *f = to_pfile(node);
	ckpt_rdlock(&f->ps->io_lock, CKPT_RANK_IO);
	/* committed (the step's files are read from its folder under their
	 * path now) or aborted: the writer's state is gone */
	ssize_t rc = ps_dead(f->ps) ? -ESTALE : f->pf.ops->read(v, f, off, len, dst);
	ckpt_rwunlock(&f->ps->io_lock, CKPT_RANK_IO);
	return rc;
}

static const struct node_ops pfile_ops = {
	.kind = N_PFILE,
	.size = sizeof(struct pfile_node),
	.getattr = pfile_attr,
	.read = pending_read,
	.destroy = pfile_destroy,
};

struct pfile_node *ckpt_pf_node_new(ckpt_view *v, struct node *dir, const char *name,
				    const struct pfile_ops *ops)
{
	struct node *n = ckpt_node_new(v, &pfile_ops, name, dir);
	if (!n)
		return NULL;
	struct pfile_node *f = to_pfile(n);
	f->ps = to_pdir(dir)->ps;
	pthread_mutex_init(&f->pf.mu, NULL);
	f->pf.kind = ops->kind;
	f->pf.ops = ops;
	f->pf.phase = has_header(ops->kind) ? PH_HEADER : PH_NONE;
	return f;
}
