/* writer_commit.c - turning a pending step into a committed Orbax step:
 * shard indexes, zarr.json, _METADATA, _sharding, _CHECKPOINT_METADATA,
 * commit_success.txt, fsyncs and the no-replace rename (docs/format.md). */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "orbax.h"
#include "zarr_meta.h"
#include "stats.h"
#include "sysio.h"
#include "writer_int.h"

/* The sharding of an array that was given none: one device, replicated (what
 * Orbax records for NamedSharding(Mesh([device 0], ('d',)), P())); it
 * resolves on any host with a device 0, CPU, GPU or TPU.  Python json.dumps
 * spacing, as Orbax writes it. */
#define DEFAULT_SHARDING                                                                                     \
	"{\"sharding_type\": \"NamedSharding\", \"shape\": [1], \"axis_names\": [\"d\"], "                   \
	"\"axis_types\": [\"AxisType.Auto\"], \"partition_spec\": [], \"device_mesh\": {\"mesh\": "          \
	"[{\"id\": 0}]}}"

/* Create/replace rel below dirfd with data, fsync it. */
static int write_file(struct ckpt_step *st, const char *rel, const void *data, size_t len)
{
	int rc = ckpt_write_file_sync_at(st->dirfd, rel, data, len);
	if (rc)
		ckpt_log(CKPT_LOG_ERR, "writer: step %s: writing %s: %s", st->name, rel, strerror(-rc));
	return rc;
}

static int write_json(struct ckpt_step *st, const char *rel, cJSON *j)
{
	if (!j)
		return -ENOMEM;
	char *s = cJSON_PrintUnformatted(j);
	cJSON_Delete(j);
	if (!s)
		return -ENOMEM;
	int rc = write_file(st, rel, s, strlen(s));
	free(s);
	return rc;
}

cJSON *ckpt_w_json_u64(uint64_t v)
{
	char b[24];
	snprintf(b, sizeof(b), "%llu", (unsigned long long)v);
	return cJSON_CreateRaw(b);
}

cJSON *ckpt_w_json_shape(const uint64_t *v, int n)
{
	cJSON *a = cJSON_CreateArray();
	for (int i = 0; a && i < n; i++)
		cJSON_AddItemToArray(a, ckpt_w_json_u64(v[i]));
	return a;
}

/* zarr.json of a: zarr v3, sharding_indexed shards of inner zstd chunks
 * (format/zarr_meta.h lays it out and prints it). */
static char *zarr_json(const struct ckpt_warray *a, int level)
{
	struct ckpt_zarr_meta m;
	char *s = NULL;
	if (ckpt_zarr_meta_init_sharded_zstd(&m, a->dtype, a->rank, a->shape, a->shard, a->inner, level) == 0)
		s = ckpt_zarr_meta_emit(&m);
	ckpt_zarr_meta_free(&m);
	return s;
}

static int finish_array(struct ckpt_step *st, struct ckpt_warray *a)
{
	char path[4096];
	int rc = ckpt_w_shard_finish_all(st, a);
	if (rc)
		return rc;
	snprintf(path, sizeof(path), "%s/" CKPT_ORBAX_ZARR3_META, a->relpath);
	char *zj = zarr_json(a, st->opts.zstd_level);
	rc = zj ? write_file(st, path, zj, strlen(zj)) : -ENOMEM;
	free(zj);
	if (!rc)
		rc = ckpt_w_fsync_dir(st, a->relpath);
	return rc;
}

/* JAX flatten order of two arrays' key paths (qsort comparator). */
static int leaf_cmp(const void *x, const void *y)
{
	const struct ckpt_warray *a = *(struct ckpt_warray *const *)x, *b = *(struct ckpt_warray *const *)y;
	return ckpt_orbax_keypath_cmp((const char *const *)a->keys, a->ktypes, a->depth,
				      (const char *const *)b->keys, b->ktypes, b->depth);
}

/* The item's arrays in JAX leaf order (malloc'd, *n entries; NULL and *n 0
 * when it has none or out of memory). */
static struct ckpt_warray **sorted_leaves(const struct witem *it, size_t *n)
{
	*n = 0;
	struct ckpt_warray **v = it->narrays ? calloc(it->narrays, sizeof(*v)) : NULL;
	if (!v)
		return NULL;
	for (struct ckpt_warray *a = it->first; a; a = a->next)
		v[(*n)++] = a;
	qsort(v, *n, sizeof(*v), leaf_cmp);
	return v;
}

/* Log a list node (keys[0..depth) of item `item`, as a folder path) whose
 * indices are not 0..n-1. */
static void log_list(const struct ckpt_step *st, const char *item, char *const *keys, int depth,
		     const char *problem)
{
	char path[1024];
	size_t o = (size_t)snprintf(path, sizeof(path), "%s", item);
	for (int i = 0; i < depth && o < sizeof(path); i++)
		o += (size_t)snprintf(path + o, sizeof(path) - o, "/%s", keys[i]);
	ckpt_log(CKPT_LOG_ERR,
		 "writer: commit of step %s: the list %s %s (Orbax restores a list only with the indices "
		 "0..n-1)",
		 st->name, path, problem);
}

/* Every sequence node of the item's pytree holds exactly the indices
 * 0..n-1.  In JAX leaf order the leaves of one node are contiguous and its
 * indices ascend, so a leaf that starts a new node at level d must carry
 * index 0 at every sequence level below d, and at level d the previous
 * leaf's index + 1 (or the same index). */
static int check_lists(const struct ckpt_step *st, const struct witem *it)
{
	size_t n;
	struct ckpt_warray **v = sorted_leaves(it, &n);
	if (!v)
		return it->narrays ? -ENOMEM : 0;
	int rc = 0;
	for (size_t i = 0; i < n && !rc; i++) {
		const struct ckpt_warray *a = v[i], *p = i ? v[i - 1] : NULL;
		int d = 0;
		while (p && d < a->depth && d < p->depth && strcmp(a->keys[d], p->keys[d]) == 0)
			d++;
		for (int lv = d; lv < a->depth && !rc; lv++) {
			if (a->ktypes[lv] != CKPT_KEY_SEQ)
				continue;
			uint64_t k = strtoull(a->keys[lv], NULL, 10);
			if (lv == d && p && lv < p->depth && p->ktypes[lv] == CKPT_KEY_SEQ) {
				uint64_t pk = strtoull(p->keys[lv], NULL, 10);
				if (k != pk + 1) {
					char why[96];
					snprintf(why, sizeof(why), "has no index %llu (%llu follows %llu)",
						 (unsigned long long)(pk + 1), (unsigned long long)k,
						 (unsigned long long)pk);
					log_list(st, it->name, a->keys, lv, why);
					rc = -EINVAL;
				}
			} else if (k != 0) {
				log_list(st, it->name, a->keys, lv, "has no index 0");
				rc = -EINVAL;
			}
		}
	}
	free(v);
	return rc;
}

/* What Orbax's restore of the step needs beyond complete arrays. */
static int check_items(struct ckpt_step *st)
{
	if (!st->items) {
		ckpt_log(CKPT_LOG_ERR,
			 "writer: commit of step %s: the step holds no item (Orbax restores nothing from it; "
			 "mkdir an item such as state/ and write arrays into it)",
			 st->name);
		return -EINVAL;
	}
	for (struct witem *it = st->items; it; it = it->next) {
		if (it->stored)
			continue; /* checked by the caller, which read it back */
		if (it->json) {
			cJSON *j = cJSON_ParseWithLength(it->json, it->json_len);
			int ok = j && (strcmp(it->name, CKPT_ORBAX_METRICS_ITEM) || cJSON_IsObject(j));
			cJSON_Delete(j);
			if (!ok) {
				ckpt_log(CKPT_LOG_ERR, "writer: commit of step %s: %s/%s is not valid JSON%s",
					 st->name, it->name, ckpt_step_json_file(it->name),
					 strcmp(it->name, CKPT_ORBAX_METRICS_ITEM) ? "" : " (an object)");
				return -EINVAL;
			}
			continue;
		}
		if (!it->narrays) {
			ckpt_log(
				CKPT_LOG_ERR,
				"writer: commit of step %s: item %s holds no arrays (Orbax cannot restore an "
				"empty item; write arrays into it, or a JSON file %s/%s)",
				st->name, it->name, it->name, CKPT_ORBAX_JSON_FILE);
			return -EINVAL;
		}
		int rc = check_lists(st, it);
		if (rc)
			return rc;
	}
	return 0;
}

/* The item's commit_success.txt (its last file, as Orbax writes it), then
 * an fsync of the item's folder. */
static int commit_success(struct ckpt_step *st, const struct witem *it, const char *final_path)
{
	char path[4096], msg[4200];
	int m = snprintf(msg, sizeof(msg), "Checkpoint commit was successful to %s/%s", final_path, it->name);
	snprintf(path, sizeof(path), "%s/" CKPT_ORBAX_COMMIT_SUCCESS, it->name);
	int rc = write_file(st, path, msg, (size_t)m);
	if (!rc)
		rc = ckpt_w_fsync_dir(st, it->name);
	return rc;
}

static int finish_json_item(struct ckpt_step *st, struct witem *it, const char *final_path)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/%s", it->name, ckpt_step_json_file(it->name));
	int rc = write_file(st, path, it->json, it->json_len);
	if (rc)
		return rc;
	return commit_success(st, it, final_path);
}

static cJSON *metadata_json(const struct witem *it)
{
	cJSON *j = cJSON_CreateObject(), *tm = cJSON_CreateObject();
	struct ckpt_warray **v = calloc(it->narrays ? it->narrays : 1, sizeof(*v));
	if (!j || !tm || !v) {
		cJSON_Delete(j);
		cJSON_Delete(tm);
		free(v);
		return NULL;
	}
	size_t n = 0;
	for (struct ckpt_warray *a = it->first; a; a = a->next)
		v[n++] = a;
	qsort(v, n, sizeof(*v), leaf_cmp);
	for (size_t i = 0; i < n; i++) {
		const struct ckpt_warray *a = v[i];
		cJSON *e = cJSON_CreateObject(), *km = cJSON_CreateArray(), *vm = cJSON_CreateObject();
		for (int k = 0; k < a->depth; k++) {
			cJSON *kk = cJSON_CreateObject();
			cJSON_AddStringToObject(kk, "key", a->keys[k]);
			cJSON_AddNumberToObject(kk, "key_type", a->ktypes[k]);
			cJSON_AddItemToArray(km, kk);
		}
		cJSON_AddStringToObject(vm, "value_type", "jax.Array");
		cJSON_AddFalseToObject(vm, "skip_deserialize");
		cJSON_AddItemToObject(vm, "write_shape", ckpt_w_json_shape(a->inner, a->rank));
		cJSON_AddItemToObject(e, "key_metadata", km);
		cJSON_AddItemToObject(e, "value_metadata", vm);
		char *key = ckpt_orbax_keypath_repr((const char *const *)a->keys, a->depth);
		if (!key) {
			cJSON_Delete(e);
			cJSON_Delete(tm);
			cJSON_Delete(j);
			free(v);
			return NULL;
		}
		cJSON_AddItemToObject(tm, key, e);
		free(key);
	}
	free(v);
	cJSON_AddItemToObject(j, "tree_metadata", tm);
	cJSON_AddFalseToObject(j, "use_ocdbt");
	cJSON_AddTrueToObject(j, "use_zarr3");
	cJSON_AddTrueToObject(j, "store_array_data_equal_to_fill_value");
	cJSON_AddNullToObject(j, "custom_metadata");
	return j;
}

static int lock_file(const char *name)
{
	size_t n = strlen(name), k = strlen(CKPT_ORBAX_LOCK_SUFFIX);
	return n > k && !strcmp(name + n - k, CKPT_ORBAX_LOCK_SUFFIX);
}

/* fsync every file and folder below rel (a stored copy), folders last;
 * with drop_locks, files named *.__lock (TensorStore's lock files, which a
 * committed step never holds) are removed instead. */
static int fsync_tree(struct ckpt_step *st, const char *rel, int depth, int drop_locks)
{
	int fd = openat(st->dirfd, rel, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 || depth > 64) {
		int rc = fd < 0 ? -errno : -ELOOP;
		if (fd >= 0)
			close(fd);
		ckpt_log(CKPT_LOG_ERR, "writer: step %s: %s: %s", st->name, rel, strerror(-rc));
		return rc;
	}
	DIR *d = fdopendir(fd);
	if (!d) {
		close(fd);
		return -errno;
	}
	int rc = 0;
	struct dirent *e;
	while (!rc && (e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		char sub[4096];
		if (snprintf(sub, sizeof(sub), "%s/%s", rel, e->d_name) >= (int)sizeof(sub)) {
			rc = -ENAMETOOLONG;
			break;
		}
		struct stat sb;
		if (fstatat(st->dirfd, sub, &sb, AT_SYMLINK_NOFOLLOW)) {
			rc = -errno;
		} else if (S_ISDIR(sb.st_mode)) {
			rc = fsync_tree(st, sub, depth + 1, drop_locks);
		} else if (S_ISREG(sb.st_mode) && drop_locks && lock_file(e->d_name)) {
			if (unlinkat(st->dirfd, sub, 0) && errno != ENOENT)
				rc = -errno;
		} else if (S_ISREG(sb.st_mode)) {
			int f = openat(st->dirfd, sub, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
			if (f < 0 || fsync(f))
				rc = -errno;
			if (f >= 0)
				close(f);
			if (rc)
				ckpt_log(CKPT_LOG_ERR, "writer: step %s: fsync of %s: %s", st->name, sub,
					 strerror(-rc));
		}
	}
	closedir(d);
	return rc ? rc : ckpt_w_fsync_dir(st, rel);
}

static int finish_item(struct ckpt_step *st, struct witem *it, const char *final_path)
{
	char path[4096];
	int rc = 0;
	if (it->stored)
		return fsync_tree(st, it->name, 0, 0);
	if (it->json)
		return finish_json_item(st, it, final_path);
	for (struct ckpt_warray *a = it->first; a && !rc; a = a->next)
		rc = finish_array(st, a);
	if (rc)
		return rc;
	snprintf(path, sizeof(path), "%s/" CKPT_ORBAX_METADATA, it->name);
	rc = write_json(st, path, metadata_json(it));
	if (rc)
		return rc;
	/* Every jax.Array needs a sharding to be restored without a target. */
	cJSON *sh = NULL;
	for (struct ckpt_warray *a = it->first; a; a = a->next) {
		ckpt_lock(&a->mu, CKPT_RANK_W_ARRAY);
		char *k = ckpt_orbax_sharding_key(a->name);
		if (!sh)
			sh = cJSON_CreateObject();
		if (k && sh)
			cJSON_AddItemToObject(
				sh, k, cJSON_CreateString(a->sharding ? a->sharding : DEFAULT_SHARDING));
		else
			rc = -ENOMEM;
		free(k);
		ckpt_unlock(&a->mu, CKPT_RANK_W_ARRAY);
	}
	snprintf(path, sizeof(path), "%s/" CKPT_ORBAX_SHARDING, it->name);
	if (sh && !rc) {
		rc = write_json(st, path, sh);
		sh = NULL;
	} else if (!rc && unlinkat(st->dirfd, path, 0) && errno != ENOENT) {
		rc = -errno; /* a _sharding from an earlier attempt must not survive */
	}
	cJSON_Delete(sh);
	if (rc)
		return rc;
	return commit_success(st, it, final_path);
}

int ckpt_w_write_ckpt_metadata(struct ckpt_step *st, int64_t commit_ns)
{
	cJSON *j = cJSON_CreateObject();
	if (!j)
		return -ENOMEM;
	if (commit_ns) {
		cJSON *ih = cJSON_CreateObject();
		for (struct witem *it = st->items; it; it = it->next)
			cJSON_AddStringToObject(ih, it->name,
						it->handler ? it->handler
						: it->json  ? CKPT_ORBAX_JSON_HANDLER
							    : CKPT_ORBAX_PYTREE_HANDLER);
		cJSON_AddItemToObject(j, "item_handlers", ih);
	} else {
		cJSON_AddNullToObject(j, "item_handlers");
	}
	cJSON_AddItemToObject(j, "metrics", cJSON_CreateObject());
	cJSON_AddItemToObject(j, "performance_metrics", cJSON_CreateObject());
	cJSON_AddItemToObject(j, "init_timestamp_nsecs", ckpt_w_json_u64((uint64_t)st->init_ns));
	if (commit_ns)
		cJSON_AddItemToObject(j, "commit_timestamp_nsecs", ckpt_w_json_u64((uint64_t)commit_ns));
	else
		cJSON_AddNullToObject(j, "commit_timestamp_nsecs");
	cJSON_AddItemToObject(j, "custom_metadata", cJSON_CreateObject());
	return write_json(st, CKPT_ORBAX_CKPT_METADATA, j);
}

/* Log the arrays with holes; returns how many. */
static uint64_t report_holes(struct ckpt_step *st)
{
	uint64_t bad = 0;
	for (struct witem *it = st->items; it; it = it->next)
		for (struct ckpt_warray *a = it->first; a; a = a->next) {
			if (a->have_total == a->nbytes)
				continue;
			if (bad++ >= 20)
				continue;
			/* The first chunk short of bytes: one without an entry,
			 * or one whose entry has fewer than it needs. */
			uint64_t first = 0;
			while (first < a->nchunks) {
				const struct wchunk *c = ckpt_w_chunk_at(a, first);
				if (!c || c->have != ckpt_w_chunk_need(a, first))
					break;
				first++;
			}
			char box[512] = "[]";
			if (first < a->nchunks) {
				ckpt_region r;
				ckpt_w_chunk_region(a, first, &r);
				if (ckpt_slice_format(&r, box, sizeof(box)) < 0)
					strcpy(box, "[...]");
			}
			ckpt_log(CKPT_LOG_ERR,
				 "writer: commit of step %s: %s: %llu of %llu bytes never written (first "
				 "hole in %s)",
				 st->name, a->relpath, (unsigned long long)(a->nbytes - a->have_total),
				 (unsigned long long)a->nbytes, box);
		}
	if (bad > 20)
		ckpt_log(CKPT_LOG_ERR, "writer: commit of step %s: ... and %llu more incomplete arrays",
			 st->name, (unsigned long long)(bad - 20));
	return bad;
}

static int rename_into_place(struct ckpt_step *st, const char *final_name, const char *final_path);

/* The commit of a step stored as written: its files are the caller's. */
static int commit_as_written(struct ckpt_step *st, const char *final_name)
{
	char final_path[4096];
	snprintf(final_path, sizeof(final_path), "%s/%s", st->root, final_name);
	struct stat sb;
	if (fstatat(st->rootfd, final_name, &sb, AT_SYMLINK_NOFOLLOW) == 0) {
		ckpt_log(CKPT_LOG_ERR, "writer: commit of step %s: %s already exists", st->name, final_path);
		return -EEXIST;
	}
	int rc = fsync_tree(st, ".", 0, 1);
	return rc ? rc : rename_into_place(st, final_name, final_path);
}

static int commit_inner(struct ckpt_step *st, const char *final_name)
{
	const char *why;
	if (!ckpt_orbax_name_ok(CKPT_NAME_STEP, final_name, &why)) {
		ckpt_log(CKPT_LOG_ERR, "writer: step %s: cannot commit as '%s': %s", st->name,
			 final_name ? final_name : "(null)", why);
		return -EINVAL;
	}
	if (st->state != CKPT_STEP_PENDING) {
		ckpt_log(CKPT_LOG_ERR, "writer: step %s: commit: step already %s", st->name,
			 st->state == CKPT_STEP_COMMITTED ? "committed" : "aborted");
		return -EROFS;
	}
	ckpt_lock(&st->mu, CKPT_RANK_W_STEP);
	uint64_t pins = st->pins_total;
	ckpt_unlock(&st->mu, CKPT_RANK_W_STEP);
	if (pins) {
		ckpt_log(CKPT_LOG_ERR, "writer: step %s: commit while writes are in progress", st->name);
		return -EBUSY;
	}
	if (st->as_written)
		return commit_as_written(st, final_name);
	/* Chunks whose store failed get another try. */
	ckpt_w_chunk_retry_errors(st);
	ckpt_w_chunk_wait_idle(st);

	int rc = 0;
	for (struct witem *it = st->items; it && !rc; it = it->next)
		for (struct ckpt_warray *a = it->first; a && !rc; a = a->next)
			if (atomic_load(&a->err)) {
				rc = atomic_load(&a->err);
				ckpt_log(CKPT_LOG_ERR,
					 "writer: commit of step %s: %s: storing chunks failed: %s", st->name,
					 a->relpath, strerror(-rc));
			}
	if (rc)
		return rc;
	if (report_holes(st))
		return -ENODATA;
	if ((rc = check_items(st)))
		return rc;

	char final_path[4096];
	snprintf(final_path, sizeof(final_path), "%s/%s", st->root, final_name);
	struct stat sb;
	if (fstatat(st->rootfd, final_name, &sb, AT_SYMLINK_NOFOLLOW) == 0) {
		ckpt_log(CKPT_LOG_ERR, "writer: commit of step %s: %s already exists", st->name, final_path);
		return -EEXIST;
	}
	for (struct witem *it = st->items; it && !rc; it = it->next)
		rc = finish_item(st, it, final_path);
	if (rc)
		return rc;
	rc = ckpt_w_write_ckpt_metadata(st, ckpt_wall_ns());
	if (rc)
		return rc;
	char msg[4200];
	int m = snprintf(msg, sizeof(msg), "Checkpoint commit was successful to %s", final_path);
	rc = write_file(st, CKPT_ORBAX_COMMIT_SUCCESS, msg, (size_t)m);
	if (!rc)
		rc = ckpt_w_fsync_dir(st, ".");
	return rc ? rc : rename_into_place(st, final_name, final_path);
}

/* Rename the tmp folder (fsynced) to final_name, fsync the root: committed. */
static int rename_into_place(struct ckpt_step *st, const char *final_name, const char *final_path)
{
	int rc = 0;
	struct stat sb;
	if (renameat2(st->rootfd, st->tmpname, st->rootfd, final_name, RENAME_NOREPLACE)) {
		rc = -errno;
		if (errno == EINVAL || errno == ENOSYS) {
			/* File system without RENAME_NOREPLACE: checked above, racy. */
			if (fstatat(st->rootfd, final_name, &sb, AT_SYMLINK_NOFOLLOW) == 0)
				rc = -EEXIST;
			else
				rc = renameat(st->rootfd, st->tmpname, st->rootfd, final_name) ? -errno : 0;
		}
		if (rc) {
			ckpt_log(CKPT_LOG_ERR, "writer: commit of step %s: rename to %s: %s", st->name,
				 final_path, strerror(-rc));
			return rc;
		}
	}
	if (fsync(st->rootfd)) {
		rc = -errno;
		ckpt_log(CKPT_LOG_ERR, "writer: commit of step %s: fsync of %s: %s (the step is renamed)",
			 st->name, st->root, strerror(errno));
	}
	/* Renamed: the step is committed whatever fsync said. */
	st->state = CKPT_STEP_COMMITTED;
	ckpt_w_zpool_stop(st);
	return rc;
}

int ckpt_w_commit(struct ckpt_step *st, const char *final_name)
{
	/* Declarations wait for the commit and then see its outcome. */
	ckpt_lock(&st->decl_mu, CKPT_RANK_W_DECL);
	int rc = commit_inner(st, final_name);
	ckpt_unlock(&st->decl_mu, CKPT_RANK_W_DECL);
	if (rc)
		CKPT_STAT_ADD(commit_failures, 1);
	if (st->state == CKPT_STEP_COMMITTED)
		CKPT_STAT_ADD(commits, 1);
	return rc;
}

int ckpt_step_commit(ckpt_step *st, const char *final_name)
{
	return ckpt_w_commit(st, final_name);
}
