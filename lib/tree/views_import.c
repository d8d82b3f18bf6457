/*
 * views_import.c - view recipes the other way (docs/recipes.md, "The other
 * direction"): `cp -r hf_folder MNT/30/.views/NAME/` into a pending step.
 *
 * pending/ stages the folder's files as they come, unchanged, in the
 * step's tmp folder (<tmp>/.views/NAME/, the way it keeps a stored copy's
 * files) and calls ckpt_vimport_commit in the step's commit: the
 * safetensors headers (format/safetensors.c) and config.json give the
 * target tensors, recipe_inverse.c the source arrays and the forward plan
 * over them; every array is declared in the writer, each target tensor is
 * read from its staged file, its element ops undone, scattered into the
 * box of each source array it fills and written there.  Either every array
 * is declared and written, or none stays declared (the commit fails and the
 * step stays pending, its staged files kept).  Memory: one target tensor
 * and its boxes at a time.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "orbax.h"
#include "recipe.h"
#include "safetensors.h"
#include "sysio.h"
#include "writer.h"
#include "writer_hosts.h"
#include "tree_int.h"

#define CONFIG_MAX (1u << 20)

int ckpt_vimport_check(ckpt_view *v, const char *step, const char *name)
{
	const ckpt_recipe *r = ckpt_views_recipe(v, name);
	if (!r) {
		ckpt_log(CKPT_LOG_ERR, "%s/%s/%s: no recipe of that name (a view import needs one)", step,
			 CKPT_VIEWS_DIR, name);
		return -ENOENT;
	}
	char why[512] = "";
	int rc = ckpt_recipe_invertible(r, why, sizeof(why));
	if (rc < 0)
		ckpt_log(CKPT_LOG_ERR, "%s/%s/%s: recipe %s does not import: %s", step, CKPT_VIEWS_DIR, name,
			 name, why);
	return rc;
}

/* A target tensor and where its bytes are staged. */
struct tin {
	ckpt_recipe_target t;
	uint64_t shape[CKPT_MAX_RANK];
	int file;
	uint64_t begin, end;
};

struct staged {
	char dir[VIEW_PATH_MAX];
	char **files; /* safetensors files, by name */
	size_t nfiles;
	struct tin *t;
	size_t nt, cap;
	char *config;
	size_t clen;
	cJSON *index;
};

static void staged_free(struct staged *s)
{
	for (size_t i = 0; i < s->nfiles; i++)
		free(s->files[i]);
	free(s->files);
	for (size_t i = 0; i < s->nt; i++)
		free((char *)s->t[i].t.name);
	free(s->t);
	free(s->config);
	cJSON_Delete(s->index);
}

static int has_suffix(const char *s, const char *suf)
{
	size_t a = strlen(s), b = strlen(suf);
	return a > b && !strcmp(s + a - b, suf);
}

/* The header of staged safetensors file `name` into s. */
static int read_header(struct staged *s, const char *name, int fi)
{
	char path[VIEW_PATH_MAX + 256];
	snprintf(path, sizeof(path), "%s/%s", s->dir, name);
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return -errno;
	struct stat sb;
	uint8_t first[8];
	uint64_t n = 0;
	int rc = fstat(fd, &sb) < 0 ? -errno : ckpt_pread_all(fd, first, 8, 0);
	if (rc == 0)
		rc = ckpt_st_header_len(first, (uint64_t)sb.st_size, name, &n);
	char *json = rc == 0 ? malloc(n + 1) : NULL;
	if (rc == 0 && !json)
		rc = -ENOMEM;
	if (rc == 0)
		rc = ckpt_pread_all(fd, json, n, 8);
	close(fd);
	ckpt_st_file *f = NULL;
	if (rc == 0)
		rc = ckpt_st_parse(json, n, (uint64_t)sb.st_size, name, &f);
	free(json);
	for (size_t i = 0; rc == 0 && i < f->n; i++) {
		if (s->nt == s->cap) {
			size_t nc = s->cap ? s->cap * 2 : 256;
			struct tin *x = realloc(s->t, nc * sizeof(*x));
			if (!x) {
				rc = -ENOMEM;
				break;
			}
			s->t = x;
			s->cap = nc;
		}
		struct tin *t = &s->t[s->nt];
		memset(t, 0, sizeof(*t));
		if (f->t[i].rank > CKPT_RECIPE_MAX_RANK) {
			ckpt_log(CKPT_LOG_ERR, "%s: tensor %s has rank %d (at most %d)", name, f->t[i].name,
				 f->t[i].rank, CKPT_RECIPE_MAX_RANK);
			rc = -EINVAL;
			break;
		}
		t->t.name = f->t[i].name;
		f->t[i].name = NULL; /* moved */
		t->t.dtype = f->t[i].dtype;
		t->t.rank = f->t[i].rank;
		memcpy(t->shape, f->t[i].shape, sizeof(uint64_t) * (size_t)f->t[i].rank);
		t->file = fi;
		t->begin = f->t[i].begin;
		t->end = f->t[i].end;
		s->nt++;
	}
	ckpt_st_file_free(f);
	return rc;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The staged folder NAME: its safetensors headers, config.json, index. */
static int read_staged(struct staged *s, const char *label)
{
	DIR *d = opendir(s->dir);
	if (!d)
		return -errno;
	int rc = 0;
	struct dirent *e;
	while (rc == 0 && (e = readdir(d))) {
		const char *n = e->d_name;
		if (!strcmp(n, ".") || !strcmp(n, ".."))
			continue;
		if (has_suffix(n, ".safetensors")) {
			char **x = realloc(s->files, (s->nfiles + 1) * sizeof(*x));
			if (!x || !(x[s->nfiles] = strdup(n)))
				rc = -ENOMEM;
			if (x)
				s->files = x;
			if (rc == 0)
				s->nfiles++;
		} else if (!strcmp(n, "config.json") || !strcmp(n, CKPT_ST_INDEX_NAME)) {
			int dfd = dirfd(d);
			char *buf = NULL;
			size_t len = 0;
			rc = ckpt_read_small_file(dfd, n, CONFIG_MAX, &buf, &len);
			if (rc == 0 && !strcmp(n, "config.json")) {
				s->config = buf;
				s->clen = len;
			} else if (rc == 0) {
				s->index = cJSON_ParseWithLength(buf, len);
				free(buf);
				if (!s->index) {
					ckpt_log(CKPT_LOG_ERR, "%s/%s: not JSON", label, n);
					rc = -EINVAL;
				}
			}
		} else {
			ckpt_log(CKPT_LOG_INFO, "%s/%s: not a weights file or config.json: not imported",
				 label, n);
		}
	}
	closedir(d);
	if (rc == 0 && s->nfiles)
		qsort(s->files, s->nfiles, sizeof(*s->files), cmp_str);
	for (size_t i = 0; rc == 0 && i < s->nfiles; i++)
		if ((rc = read_header(s, s->files[i], (int)i)) < 0 && rc != -ENOMEM)
			ckpt_log(CKPT_LOG_ERR, "%s/%s: not a safetensors file (%s)", label, s->files[i],
				 strerror(-rc));
	if (rc == 0 && !s->nfiles) {
		ckpt_log(CKPT_LOG_ERR, "%s: no *.safetensors file", label);
		rc = -ENODATA;
	}
	/* every tensor the index names is in a file */
	const cJSON *w;
	cJSON_ArrayForEach(w, cJSON_GetObjectItemCaseSensitive(s->index, "weight_map"))
	{
		size_t i = 0;
		while (rc == 0 && i < s->nt && strcmp(s->t[i].t.name, w->string))
			i++;
		if (rc == 0 && i == s->nt) {
			ckpt_log(CKPT_LOG_ERR, "%s: tensor %s (named in %s, file %s) is in no file copied",
				 label, w->string, CKPT_ST_INDEX_NAME,
				 cJSON_IsString(w) ? w->valuestring : "?");
			rc = -ENODATA;
		}
	}
	for (size_t i = 0; i < s->nt; i++)
		s->t[i].t.shape = s->t[i].shape;
	return rc;
}

/* Split source name "item.k.k" into the writer's key path (in kbuf). */
static int key_path(char *kbuf, const char **item, const char **keys, int *types, int *depth)
{
	char *dot = strchr(kbuf, '.');
	if (!dot)
		return -EINVAL;
	*dot = 0;
	*item = kbuf;
	int d = 0;
	for (char *p = dot + 1, *q; p; p = q) {
		q = strchr(p, '.');
		if (q)
			*q++ = 0;
		if (d == CKPT_ORBAX_MAX_DEPTH || !*p)
			return -EINVAL;
		int digits = 1;
		for (const char *c = p; *c; c++)
			digits &= *c >= '0' && *c <= '9';
		keys[d] = p;
		types[d++] = digits ? CKPT_KEY_SEQ : CKPT_KEY_DICT;
	}
	*depth = d;
	return 0;
}

static int read_tensor(struct staged *s, const struct tin *t, uint8_t *buf)
{
	char path[VIEW_PATH_MAX + 256];
	snprintf(path, sizeof(path), "%s/%s", s->dir, s->files[t->file]);
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return -errno;
	int rc = ckpt_pread_all(fd, buf, (size_t)(t->end - t->begin), t->begin);
	close(fd);
	return rc;
}

/* Declare the arrays of x and write every target tensor into them. */
static int import_data(struct staged *s, ckpt_step *step, const ckpt_rinverse *x, const char *label)
{
	size_t ns = ckpt_rinverse_nsrc(x);
	ckpt_warray **arr = calloc(ns ? ns : 1, sizeof(*arr));
	if (!arr)
		return -ENOMEM;
	int rc = 0;
	for (size_t i = 0; rc == 0 && i < ns; i++) {
		const ckpt_recipe_src *src = ckpt_rinverse_src(x, i);
		char kbuf[VIEW_PATH_MAX];
		const char *item, *keys[CKPT_ORBAX_MAX_DEPTH];
		int types[CKPT_ORBAX_MAX_DEPTH], depth;
		snprintf(kbuf, sizeof(kbuf), "%s", src->name);
		rc = key_path(kbuf, &item, keys, types, &depth);
		if (rc == 0)
			rc = ckpt_step_add_item(step, item);
		if (rc == 0 && ckpt_step_find_array(step, item, keys, depth))
			rc = -EEXIST;
		if (rc == 0)
			rc = ckpt_hosts_declare(step, item, keys, types, depth, src->dtype, src->rank,
						src->shape, &arr[i]);
		if (rc < 0)
			ckpt_log(CKPT_LOG_ERR, "%s: source array %s cannot be declared: %s", label, src->name,
				 strerror(-rc));
	}
	const ckpt_rplan *p = ckpt_rinverse_plan(x);
	uint8_t *buf = NULL, *other = NULL, *box = NULL;
	size_t bcap = 0, ocap = 0, boxcap = 0;
	for (size_t i = 0; rc == 0 && i < ckpt_rplan_count(p); i++) {
		const ckpt_rtensor *t = ckpt_rplan_tensor(p, i);
		const struct tin *in = &s->t[ckpt_rinverse_target_of(x, i)];
		size_t bytes = (size_t)(in->end - in->begin);
		size_t dup = ckpt_rinverse_dup_of(x, i);
		/* buffers grow to the largest tensor: one for its bytes, one for
		 * the values its element ops undo or the tensor it repeats */
		int second = dup != SIZE_MAX || t->elem;
		if (bytes > bcap || (second && bytes > ocap)) {
			if (bytes > bcap) {
				free(buf);
				bcap = (buf = malloc(bytes)) ? bytes : 0;
			}
			if (second && bytes > ocap) {
				free(other);
				ocap = (other = malloc(bytes)) ? bytes : 0;
			}
			if (!buf || (second && !other)) {
				rc = -ENOMEM;
				break;
			}
		}
		if ((rc = read_tensor(s, in, buf)) < 0) {
			ckpt_log(CKPT_LOG_ERR, "%s: %s: cannot read it back: %s", label, t->name,
				 strerror(-rc));
			break;
		}
		if (dup != SIZE_MAX) { /* tied: the same bytes as the tensor it repeats */
			const struct tin *o = &s->t[ckpt_rinverse_target_of(x, dup)];
			if ((rc = read_tensor(s, o, other)) < 0)
				break;
			if (memcmp(buf, other, bytes)) {
				ckpt_log(
					CKPT_LOG_ERR,
					"%s: %s differs from %s, which the recipe makes from the same source "
					"(tied weights)",
					label, t->name, ckpt_rplan_tensor(p, dup)->name);
				rc = -EINVAL;
			}
			continue;
		}
		const uint8_t *vals = buf;
		if (t->elem) {
			if ((rc = ckpt_rtensor_unconvert(t, buf, (size_t)ckpt_rtensor_count(t), other)) < 0)
				break;
			vals = other;
		}
		unsigned is = ckpt_dtype_get(t->src_dtype)->itemsize;
		for (size_t k = 0; rc == 0 && k < t->nparts; k++) {
			ckpt_region r;
			if (!ckpt_rtensor_box(t, k, 0, ckpt_rtensor_count(t), &r))
				continue;
			uint64_t cnt = 1;
			for (int d = 0; d < r.rank; d++)
				cnt *= r.stop[d] - r.start[d];
			if (cnt * is > boxcap) {
				free(box);
				boxcap = (size_t)(cnt * is);
				if (!(box = malloc(boxcap))) {
					boxcap = 0;
					rc = -ENOMEM;
					break;
				}
			}
			ckpt_rtensor_scatter(t, k, &r, vals, box);
			rc = ckpt_warray_write(arr[t->parts[k].input], &r, 0, box, (size_t)(cnt * is));
			if (rc < 0)
				ckpt_log(CKPT_LOG_ERR, "%s: %s: writing %s: %s", label, t->name,
					 ckpt_rinverse_src(x, t->parts[k].input)->name, strerror(-rc));
		}
	}
	free(buf);
	free(other);
	free(box);
	if (rc < 0) /* none stays declared: the commit fails, the step stays pending */
		for (size_t i = 0; i < ns; i++)
			if (arr[i])
				ckpt_warray_remove(arr[i]);
	free(arr);
	return rc;
}

static int import_one(ckpt_view *v, ckpt_step *step, const char *tmp, const char *stepname, const char *name)
{
	char label[512];
	snprintf(label, sizeof(label), "step %s: %s/%s", stepname, CKPT_VIEWS_DIR, name);
	const ckpt_recipe *r = ckpt_views_recipe(v, name);
	if (!r) {
		ckpt_log(CKPT_LOG_ERR, "%s: no recipe of that name", label);
		return -ENOENT;
	}
	struct staged s = { 0 };
	snprintf(s.dir, sizeof(s.dir), "%s/%s/%s", tmp, CKPT_VIEWS_DIR, name);
	int rc = read_staged(&s, label);
	ckpt_rinverse *x = NULL;
	if (rc == 0) {
		ckpt_recipe_target *t = malloc((s.nt ? s.nt : 1) * sizeof(*t));
		char why[1024] = "";
		if (!t) {
			rc = -ENOMEM;
		} else {
			for (size_t i = 0; i < s.nt; i++)
				t[i] = s.t[i].t;
			rc = ckpt_recipe_invert(r, t, s.nt, s.config, s.clen, &x, why, sizeof(why));
			free(t);
			if (rc < 0 && rc != -ENOMEM)
				ckpt_log(CKPT_LOG_ERR, "%s: cannot import through recipe %s: %s", label, name,
					 why);
		}
	}
	if (rc == 0) {
		rc = import_data(&s, step, x, label);
		if (rc == 0)
			ckpt_log(CKPT_LOG_INFO, "%s: %zu tensors imported as %zu arrays", label, s.nt,
				 ckpt_rinverse_nsrc(x));
	}
	ckpt_rinverse_free(x);
	staged_free(&s);
	return rc;
}

int ckpt_vimport_commit(ckpt_view *v, struct ckpt_step *step, const char *stepname)
{
	ckpt_step_info info;
	ckpt_step_get_info(step, &info);
	char dir[VIEW_PATH_MAX];
	snprintf(dir, sizeof(dir), "%s/%s", info.tmp_path, CKPT_VIEWS_DIR);
	DIR *d = opendir(dir);
	if (!d)
		return errno == ENOENT ? 0 : -errno;
	char **names = NULL;
	size_t n = 0;
	int rc = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		char **x = realloc(names, (n + 1) * sizeof(*x));
		if (!x || !(x[n] = strdup(e->d_name))) {
			free(x ? x : names);
			names = NULL;
			n = 0;
			rc = -ENOMEM;
			break;
		}
		names = x;
		n++;
	}
	closedir(d);
	for (size_t i = 0; i < n && rc == 0; i++)
		rc = import_one(v, step, info.tmp_path, stepname, names[i]);
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	if (rc == 0)
		rc = ckpt_rmtree(dir); /* the staged files are not part of the step */
	return rc;
}
