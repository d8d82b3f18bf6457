/*
 * torch.c - tensors of torch.save pickles and of distributed-checkpoint
 * metadata (torch.h), read from the object tree of pickle.h.
 *
 * A torch.save data.pkl is a tree of dicts (OrderedDict), lists and tuples
 * whose tensor leaves are records of torch._utils._rebuild_tensor_v2 (or
 * _rebuild_tensor, or _rebuild_parameter around one):
 *     (storage, storage_offset, size, stride, requires_grad, hooks[, meta])
 * where storage is a persistent id ('storage', <torch.XStorage>, key,
 * location, numel) naming archive member data/<key>, and the storage class
 * gives the element type.
 *
 * A distributed checkpoint's .metadata is a Metadata record whose state has
 * state_dict_metadata {fqn: TensorStorageMetadata(properties, size, chunks)
 * or BytesStorageMetadata()} and storage_data {MetadataIndex(fqn, offset,
 * index): _StorageInfo(relative_path, offset, length[,
 * transform_descriptors])}.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "torch.h"

/* ---- dtypes ----------------------------------------------------------------- */

static const struct {
	const char *name; /* the dtype's attribute of torch */
	const char *storage; /* its storage class */
	ckpt_dtype dt;
} k_types[] = {
	{ "float32", "FloatStorage", CKPT_DT_FLOAT32 },
	{ "float64", "DoubleStorage", CKPT_DT_FLOAT64 },
	{ "float16", "HalfStorage", CKPT_DT_FLOAT16 },
	{ "bfloat16", "BFloat16Storage", CKPT_DT_BFLOAT16 },
	{ "int8", "CharStorage", CKPT_DT_INT8 },
	{ "uint8", "ByteStorage", CKPT_DT_UINT8 },
	{ "int16", "ShortStorage", CKPT_DT_INT16 },
	{ "int32", "IntStorage", CKPT_DT_INT32 },
	{ "int64", "LongStorage", CKPT_DT_INT64 },
	{ "uint16", "UInt16Storage", CKPT_DT_UINT16 },
	{ "uint32", "UInt32Storage", CKPT_DT_UINT32 },
	{ "uint64", "UInt64Storage", CKPT_DT_UINT64 },
	{ "bool", "BoolStorage", CKPT_DT_BOOL },
	{ "complex64", "ComplexFloatStorage", CKPT_DT_COMPLEX64 },
	{ "complex128", "ComplexDoubleStorage", CKPT_DT_COMPLEX128 },
	{ "float8_e4m3fn", "Float8_e4m3fnStorage", CKPT_DT_F8_E4M3FN },
	{ "float8_e5m2", "Float8_e5m2Storage", CKPT_DT_F8_E5M2 },
	{ "float8_e4m3fnuz", "Float8_e4m3fnuzStorage", CKPT_DT_F8_E4M3FNUZ },
	{ "float8_e5m2fnuz", "Float8_e5m2fnuzStorage", CKPT_DT_F8_E5M2FNUZ },
	{ "float8_e8m0fnu", "Float8_e8m0fnuStorage", CKPT_DT_F8_E8M0FNU },
	/* raw bytes (a tensor over an untyped storage is rebuilt as uint8) */
	{ NULL, "UntypedStorage", CKPT_DT_UINT8 },
};

#define NTYPES (sizeof(k_types) / sizeof(k_types[0]))

ckpt_dtype ckpt_torch_storage_dtype(const char *g)
{
	if (!g)
		return CKPT_DT_INVALID;
	const char *attr;
	if (strncmp(g, "torch.storage.", 14) == 0)
		attr = g + 14;
	else if (strncmp(g, "torch.", 6) == 0)
		attr = g + 6;
	else
		return CKPT_DT_INVALID;
	for (size_t i = 0; i < NTYPES; i++)
		if (strcmp(attr, k_types[i].storage) == 0)
			return k_types[i].dt;
	return CKPT_DT_INVALID;
}

ckpt_dtype ckpt_torch_dtype(const char *g)
{
	if (!g || strncmp(g, "torch.", 6) != 0)
		return CKPT_DT_INVALID;
	for (size_t i = 0; i < NTYPES; i++)
		if (k_types[i].name && strcmp(g + 6, k_types[i].name) == 0)
			return k_types[i].dt;
	return CKPT_DT_INVALID;
}

/* ---- torch.save state ---------------------------------------------------------- */

#define WALK_BUDGET (4u << 20) /* nodes visited: a shared graph is no bomb */

struct walk {
	const char *what;
	struct ckpt_torch_state *out;
	size_t cap;
	size_t budget;
	char *path[CKPT_TORCH_MAX_PATH];
	int depth;
};

static const ckpt_pk *unwrap_param(const ckpt_pk *o)
{
	if ((ckpt_pk_is(o, "torch._utils._rebuild_parameter") ||
	     ckpt_pk_is(o, "torch._utils._rebuild_parameter_with_state")) &&
	    o->kind == CKPT_PK_RECORD && o->args->n >= 1)
		return o->args->v[0];
	return o;
}

static int is_tensor(const ckpt_pk *o)
{
	o = unwrap_param(o);
	return o && o->kind == CKPT_PK_RECORD &&
	       (ckpt_pk_is(o, "torch._utils._rebuild_tensor_v2") ||
		ckpt_pk_is(o, "torch._utils._rebuild_tensor") ||
		ckpt_pk_is(o, "torch._utils._rebuild_tensor_v3"));
}

static char *joined(struct walk *w)
{
	size_t n = 0;
	for (int i = 0; i < w->depth; i++)
		n += strlen(w->path[i]) + 1;
	char *s = malloc(n + 1);
	if (!s)
		return NULL;
	size_t k = 0;
	for (int i = 0; i < w->depth; i++) {
		if (i)
			s[k++] = '.';
		size_t l = strlen(w->path[i]);
		memcpy(s + k, w->path[i], l);
		k += l;
	}
	s[k] = 0;
	return s;
}

static int tensor_bad(struct walk *w, const char *why)
{
	char *name = joined(w);
	ckpt_log(CKPT_LOG_ERR, "%s: tensor %s: %s", w->what, name ? name : "?", why);
	free(name);
	return -EINVAL;
}

static int add_tensor(struct walk *w, const ckpt_pk *rec)
{
	rec = unwrap_param(rec);
	const ckpt_pk *a = rec->args;
	if (a->n < 4)
		return tensor_bad(w, "rebuild record with too few arguments");
	const ckpt_pk *pid = a->v[0];
	if (pid->kind != CKPT_PK_PERSID || !pid->args || pid->args->kind != CKPT_PK_TUPLE || pid->args->n < 5)
		return tensor_bad(w, "storage is not a persistent id");
	const ckpt_pk *p = pid->args;
	if (p->v[0]->kind != CKPT_PK_STR || strcmp(p->v[0]->s, "storage") != 0)
		return tensor_bad(w, "persistent id is not a storage");
	if (p->v[1]->kind != CKPT_PK_GLOBAL)
		return tensor_bad(w, "storage type is not a class");
	ckpt_dtype dt = ckpt_torch_storage_dtype(p->v[1]->s);
	if (dt == CKPT_DT_INVALID) {
		char why[160];
		snprintf(why, sizeof(why), "storage type %.100s has no ckptfs dtype", p->v[1]->s);
		return tensor_bad(w, why);
	}
	if (p->v[2]->kind != CKPT_PK_STR || !ckpt_pickle_ident_ok(p->v[2]->s) || p->v[2]->len > 64)
		return tensor_bad(w, "malformed storage key");
	int64_t numel, off;
	if (ckpt_pk_int(p->v[4], &numel) || numel < 0)
		return tensor_bad(w, "malformed storage size");
	/* _rebuild_tensor_v3(storage, offset, size, stride, requires_grad, hooks,
	 * dtype[, metadata]): the dtype is an argument; over an untyped storage
	 * the persistent id counts bytes, the offset elements of that dtype */
	if (ckpt_pk_is(rec, "torch._utils._rebuild_tensor_v3")) {
		ckpt_dtype d3 = a->n >= 7 && a->v[6]->kind == CKPT_PK_GLOBAL ? ckpt_torch_dtype(a->v[6]->s)
									     : CKPT_DT_INVALID;
		if (d3 == CKPT_DT_INVALID)
			return tensor_bad(w, "_rebuild_tensor_v3 without a dtype ckptfs has");
		if (ckpt_pk_is_attr(p->v[1], "UntypedStorage"))
			numel /= (int64_t)ckpt_dtype_get(d3)->itemsize;
		else if (d3 != dt)
			return tensor_bad(w, "dtype differs from its storage's");
		dt = d3;
	}
	if (ckpt_pk_int(a->v[1], &off) || off < 0)
		return tensor_bad(w, "malformed storage offset");
	int64_t size[CKPT_MAX_RANK], stride[CKPT_MAX_RANK];
	int rank = ckpt_pk_ints(a->v[2], size, CKPT_MAX_RANK);
	int srank = ckpt_pk_ints(a->v[3], stride, CKPT_MAX_RANK);
	if (rank < 0 || srank != rank)
		return tensor_bad(w, "malformed size or stride");
	for (int d = 0; d < rank; d++)
		if (size[d] < 0 || stride[d] < 0)
			return tensor_bad(w, "negative size or stride");
	if (w->out->n >= CKPT_TORCH_MAX_TENSORS)
		return tensor_bad(w, "too many tensors");
	if (w->out->n == w->cap) {
		size_t nc = w->cap ? w->cap * 2 : 16;
		struct ckpt_torch_tensor *nt = realloc(w->out->t, nc * sizeof(*nt));
		if (!nt)
			return -ENOMEM;
		w->out->t = nt;
		w->cap = nc;
	}
	struct ckpt_torch_tensor *t = &w->out->t[w->out->n];
	memset(t, 0, sizeof(*t));
	t->dtype = dt;
	t->rank = rank;
	for (int d = 0; d < rank; d++) {
		t->shape[d] = (uint64_t)size[d];
		t->stride[d] = stride[d];
	}
	t->offset = (uint64_t)off;
	t->storage_numel = (uint64_t)numel;
	t->name = joined(w);
	t->storage_key = strdup(p->v[2]->s);
	t->path = calloc((size_t)(w->depth ? w->depth : 1), sizeof(char *));
	int oom = !t->name || !t->storage_key || !t->path;
	for (int i = 0; i < w->depth && !oom; i++) {
		t->path[i] = strdup(w->path[i]);
		oom = !t->path[i];
		t->depth = i + 1;
	}
	w->out->n++; /* freed with the state even when incomplete */
	return oom ? -ENOMEM : 0;
}

static int walk_node(struct walk *w, const ckpt_pk *o, int level);

/* Push the components of one key (split on '.', unless that would make an
 * empty component: then the key stays whole), walk, pop. */
static int walk_key(struct walk *w, const char *key, const ckpt_pk *val, int level)
{
	if (!*key || strcmp(key, ".") == 0 || strcmp(key, "..") == 0 || strchr(key, '/')) {
		ckpt_log(CKPT_LOG_WARN, "%s: key '%.80s' cannot be a file name, left out", w->what, key);
		w->out->skipped++;
		return 0;
	}
	int split = key[0] != '.' && key[strlen(key) - 1] != '.' && !strstr(key, "..");
	int pushed = 0, rc = 0;
	const char *s = key;
	while (rc == 0) {
		const char *dot = split ? strchr(s, '.') : NULL;
		size_t l = dot ? (size_t)(dot - s) : strlen(s);
		if (w->depth >= CKPT_TORCH_MAX_PATH) {
			rc = tensor_bad(w, "key path too deep");
			break;
		}
		char *c = strndup(s, l);
		if (!c) {
			rc = -ENOMEM;
			break;
		}
		w->path[w->depth++] = c;
		pushed++;
		if (!dot)
			break;
		s = dot + 1;
	}
	if (rc == 0)
		rc = walk_node(w, val, level + 1);
	while (pushed--)
		free(w->path[--w->depth]);
	return rc;
}

static int walk_node(struct walk *w, const ckpt_pk *o, int level)
{
	if (!w->budget--)
		return tensor_bad(w, "object graph too large");
	if (level > CKPT_PK_MAX_DEPTH)
		return tensor_bad(w, "nested too deep");
	if (is_tensor(o))
		return add_tensor(w, o);
	if (o->kind == CKPT_PK_DICT) {
		for (size_t i = 0; i + 1 < o->n; i += 2) {
			const ckpt_pk *k = o->v[i];
			char num[32];
			const char *key;
			if (k->kind == CKPT_PK_STR) {
				key = k->s;
				if (strlen(key) != k->len)
					key = "";
			} else if (k->kind == CKPT_PK_INT) {
				snprintf(num, sizeof(num), "%lld", (long long)k->i);
				key = num;
			} else {
				w->out->skipped++;
				continue;
			}
			int rc = walk_key(w, key, o->v[i + 1], level);
			if (rc)
				return rc;
		}
		return 0;
	}
	if (o->kind == CKPT_PK_LIST || o->kind == CKPT_PK_TUPLE) {
		for (size_t i = 0; i < o->n; i++) {
			char num[32];
			snprintf(num, sizeof(num), "%zu", i);
			int rc = walk_key(w, num, o->v[i], level);
			if (rc)
				return rc;
		}
		return 0;
	}
	w->out->skipped++; /* a number, a string, None, another record */
	return 0;
}

void ckpt_torch_state_free(struct ckpt_torch_state *s)
{
	if (!s)
		return;
	for (size_t i = 0; i < s->n; i++) {
		struct ckpt_torch_tensor *t = &s->t[i];
		free(t->name);
		free(t->storage_key);
		for (int d = 0; d < t->depth; d++)
			free(t->path[d]);
		free(t->path);
	}
	free(s->t);
	memset(s, 0, sizeof(*s));
}

int ckpt_torch_state_parse(const ckpt_pk *root, const char *what, struct ckpt_torch_state *out)
{
	memset(out, 0, sizeof(*out));
	struct walk w = { .what = what ? what : "data.pkl", .out = out, .budget = WALK_BUDGET };
	int rc;
	if (!root)
		return -EINVAL;
	if (is_tensor(root)) /* torch.save(tensor): one tensor, named "tensor" */
		rc = walk_key(&w, "tensor", root, 0);
	else
		rc = walk_node(&w, root, 0);
	if (rc)
		ckpt_torch_state_free(out);
	return rc;
}

int ckpt_torch_dense(const struct ckpt_torch_tensor *t, int *order, uint64_t *byte_off, uint64_t *byte_len)
{
	unsigned isz = ckpt_dtype_get(t->dtype)->itemsize;
	uint64_t numel = 1;
	int big[CKPT_MAX_RANK], nb = 0, empty = 0;
	for (int d = 0; d < t->rank; d++) {
		order[d] = d;
		if (t->shape[d] == 0)
			empty = 1;
		else if (numel > UINT64_MAX / t->shape[d])
			return -EINVAL;
		else
			numel *= t->shape[d];
		if (t->shape[d] > 1)
			big[nb++] = d;
	}
	if (empty) {
		*byte_off = 0;
		*byte_len = 0;
		return 0;
	}
	/* the dimensions of size > 1 by decreasing stride (insertion sort) */
	for (int i = 1; i < nb; i++)
		for (int j = i; j > 0 && t->stride[big[j - 1]] < t->stride[big[j]]; j--) {
			int x = big[j];
			big[j] = big[j - 1];
			big[j - 1] = x;
		}
	uint64_t expect = 1;
	for (int i = nb - 1; i >= 0; i--) {
		if ((uint64_t)t->stride[big[i]] != expect)
			return -EINVAL;
		expect *= t->shape[big[i]];
	}
	/* size-1 dimensions stay where they are; the others take the slots in stride order */
	for (int d = 0, k = 0; d < t->rank; d++)
		if (t->shape[d] > 1)
			order[d] = big[k++];
	if (t->offset > UINT64_MAX - numel || t->offset + numel > t->storage_numel)
		return -EINVAL;
	if (numel > UINT64_MAX / isz || t->offset > UINT64_MAX / isz)
		return -EINVAL;
	*byte_off = t->offset * isz;
	*byte_len = numel * isz;
	return 0;
}

int ckpt_torch_key_split(const char *name, char *buf, size_t cap, const char **comps, int max)
{
	size_t n = strlen(name);
	if (!n || n >= cap || strcmp(name, ".") == 0 || strcmp(name, "..") == 0 || strchr(name, '/') ||
	    max < 1)
		return -EINVAL;
	memcpy(buf, name, n + 1);
	int split = name[0] != '.' && name[n - 1] != '.' && !strstr(name, "..");
	int depth = 0;
	char *s = buf;
	for (;;) {
		if (depth >= max)
			return -EINVAL;
		comps[depth++] = s;
		char *dot = split ? strchr(s, '.') : NULL;
		if (!dot)
			break;
		*dot = 0;
		s = dot + 1;
	}
	return depth;
}

/* ---- distributed checkpoint metadata ------------------------------------------ */

static int meta_bad(const char *what, const char *fqn, const char *why)
{
	ckpt_log(CKPT_LOG_ERR, "%s: %s%s%s", what, fqn ? fqn : "", fqn ? ": " : "", why);
	return -EINVAL;
}

void ckpt_dcp_meta_free(struct ckpt_dcp_meta *m)
{
	if (!m)
		return;
	for (size_t i = 0; i < m->n; i++) {
		for (size_t c = 0; c < m->e[i].nchunks; c++)
			free(m->e[i].chunks[c].file);
		free(m->e[i].chunks);
		free(m->e[i].fqn);
	}
	free(m->e);
	free(m->version);
	memset(m, 0, sizeof(*m));
}

static int tensor_dtype(const ckpt_pk *props, ckpt_dtype *dt)
{
	const ckpt_pk *d = NULL;
	if (props && props->kind == CKPT_PK_RECORD && props->state) {
		if (props->state->kind == CKPT_PK_TUPLE && props->state->n >= 1)
			d = props->state->v
				    [0]; /* __getstate__: (dtype, layout, requires_grad, memory_format, pin) */
		else
			d = ckpt_pk_field(props, "dtype");
	}
	if (!d || d->kind != CKPT_PK_GLOBAL)
		return -EINVAL;
	*dt = ckpt_torch_dtype(d->s);
	return *dt == CKPT_DT_INVALID ? -EINVAL : 0;
}

/* The transform of one item: none, or exactly one zstd stream. */
static int transform_of(const ckpt_pk *td, enum ckpt_dcp_transform *t)
{
	*t = CKPT_DCP_RAW;
	if (!td || td->kind == CKPT_PK_NONE)
		return 0;
	if (td->kind != CKPT_PK_LIST && td->kind != CKPT_PK_TUPLE)
		return -EINVAL;
	if (td->n == 0)
		return 0;
	if (td->n != 1 || td->v[0]->kind != CKPT_PK_STR)
		return -EINVAL;
	const char *s = td->v[0]->s;
	size_t l = strlen("stream.zstd");
	if (strncmp(s, "stream.zstd", l) != 0)
		return -EINVAL;
	s += l;
	if (*s == '@') /* name@domain/version */
		s = strchr(s, '/');
	if (!s || strcmp(s, "/1") != 0)
		return -EINVAL;
	*t = CKPT_DCP_ZSTD;
	return 0;
}

/* Fill chunk c (already boxed) of e from the storage_data entry naming it. */
static int chunk_storage(const char *what, const ckpt_pk *sd, struct ckpt_dcp_entry *e,
			 struct ckpt_dcp_chunk *c, size_t ci)
{
	const ckpt_pk *found = NULL;
	for (size_t i = 0; i + 1 < sd->n && !found; i += 2) {
		const ckpt_pk *mi = sd->v[i];
		const ckpt_pk *fqn = ckpt_pk_field(mi, "fqn");
		if (!fqn || fqn->kind != CKPT_PK_STR || strcmp(fqn->s, e->fqn) != 0)
			continue;
		if (e->is_bytes) {
			found = sd->v[i + 1];
			break;
		}
		int64_t off[CKPT_MAX_RANK];
		const ckpt_pk *o = ckpt_pk_field(mi, "offset");
		int r = ckpt_pk_ints(o, off, CKPT_MAX_RANK);
		if (r != e->rank)
			continue;
		int same = 1;
		for (int d = 0; d < r; d++)
			same &= off[d] >= 0 && (uint64_t)off[d] == c->offsets[d];
		if (same)
			found = sd->v[i + 1];
	}
	(void)ci;
	if (!found)
		return meta_bad(what, e->fqn, "a saved chunk has no storage entry");
	const ckpt_pk *rp = ckpt_pk_field(found, "relative_path");
	int64_t off, len;
	if (!rp || rp->kind != CKPT_PK_STR || strlen(rp->s) != rp->len || !*rp->s ||
	    ckpt_pk_int(ckpt_pk_field(found, "offset"), &off) ||
	    ckpt_pk_int(ckpt_pk_field(found, "length"), &len) || off < 0 || len < 0 ||
	    (uint64_t)off > UINT64_MAX - (uint64_t)len)
		return meta_bad(what, e->fqn, "malformed storage entry");
	if (transform_of(ckpt_pk_field(found, "transform_descriptors"), &c->transform))
		return meta_bad(what, e->fqn,
				"unknown transform of a storage entry (only stream.zstd/1 is read)");
	c->file = strdup(rp->s);
	if (!c->file)
		return -ENOMEM;
	c->offset = (uint64_t)off;
	c->length = (uint64_t)len;
	return 0;
}

static int parse_entry(const char *what, const ckpt_pk *val, const ckpt_pk *sd, struct ckpt_dcp_entry *e)
{
	if (ckpt_pk_is_attr(val, "BytesStorageMetadata")) {
		e->is_bytes = 1;
		e->chunks = calloc(1, sizeof(*e->chunks));
		if (!e->chunks)
			return -ENOMEM;
		e->nchunks = 1;
		return chunk_storage(what, sd, e, &e->chunks[0], 0);
	}
	if (!ckpt_pk_is_attr(val, "TensorStorageMetadata"))
		return meta_bad(what, e->fqn, "entry is neither tensor nor bytes metadata");
	if (tensor_dtype(ckpt_pk_field(val, "properties"), &e->dtype))
		return meta_bad(what, e->fqn, "tensor dtype missing or without a ckptfs dtype");
	int64_t size[CKPT_MAX_RANK];
	e->rank = ckpt_pk_ints(ckpt_pk_field(val, "size"), size, CKPT_MAX_RANK);
	if (e->rank < 0)
		return meta_bad(what, e->fqn, "malformed tensor size");
	for (int d = 0; d < e->rank; d++) {
		if (size[d] < 0)
			return meta_bad(what, e->fqn, "negative tensor size");
		e->size[d] = (uint64_t)size[d];
	}
	const ckpt_pk *chunks = ckpt_pk_field(val, "chunks");
	if (!chunks || chunks->kind != CKPT_PK_LIST || chunks->n > CKPT_PK_MAX_ITEMS)
		return meta_bad(what, e->fqn, "malformed chunk list");
	e->chunks = calloc(chunks->n ? chunks->n : 1, sizeof(*e->chunks));
	if (!e->chunks)
		return -ENOMEM;
	for (size_t i = 0; i < chunks->n; i++) {
		struct ckpt_dcp_chunk *c = &e->chunks[i];
		e->nchunks = i + 1;
		int64_t off[CKPT_MAX_RANK], sz[CKPT_MAX_RANK];
		if (ckpt_pk_ints(ckpt_pk_field(chunks->v[i], "offsets"), off, CKPT_MAX_RANK) != e->rank ||
		    ckpt_pk_ints(ckpt_pk_field(chunks->v[i], "sizes"), sz, CKPT_MAX_RANK) != e->rank)
			return meta_bad(what, e->fqn, "malformed chunk box");
		for (int d = 0; d < e->rank; d++) {
			if (off[d] < 0 || sz[d] < 0 || (uint64_t)off[d] > e->size[d] ||
			    (uint64_t)sz[d] > e->size[d] - (uint64_t)off[d])
				return meta_bad(what, e->fqn, "chunk box outside the tensor");
			c->offsets[d] = (uint64_t)off[d];
			c->sizes[d] = (uint64_t)sz[d];
		}
		int rc = chunk_storage(what, sd, e, c, i);
		if (rc)
			return rc;
	}
	return 0;
}

int ckpt_dcp_meta_parse(const ckpt_pk *root, const char *what, struct ckpt_dcp_meta *out)
{
	memset(out, 0, sizeof(*out));
	what = what ? what : ".metadata";
	if (!ckpt_pk_is_attr(root, "Metadata") || root->kind != CKPT_PK_RECORD)
		return meta_bad(what, NULL, "not a distributed-checkpoint Metadata object");
	const ckpt_pk *sdm = ckpt_pk_field(root, "state_dict_metadata");
	const ckpt_pk *sd = ckpt_pk_field(root, "storage_data");
	if (!sdm || sdm->kind != CKPT_PK_DICT)
		return meta_bad(what, NULL, "no state_dict_metadata");
	if (!sd || sd->kind != CKPT_PK_DICT)
		return meta_bad(what, NULL,
				"no storage_data (written by a storage layer ckptfs does not read)");
	const ckpt_pk *ver = ckpt_pk_field(root, "version");
	if (ver && ver->kind == CKPT_PK_STR && !(out->version = strdup(ver->s)))
		return -ENOMEM;
	out->e = calloc(sdm->n / 2 + 1, sizeof(*out->e));
	if (!out->e) {
		ckpt_dcp_meta_free(out);
		return -ENOMEM;
	}
	for (size_t i = 0; i + 1 < sdm->n; i += 2) {
		const ckpt_pk *k = sdm->v[i];
		if (k->kind != CKPT_PK_STR || strlen(k->s) != k->len) {
			ckpt_dcp_meta_free(out);
			return meta_bad(what, NULL, "a state_dict_metadata key is not a string");
		}
		struct ckpt_dcp_entry *e = &out->e[out->n++];
		e->fqn = strdup(k->s);
		int rc = e->fqn ? parse_entry(what, sdm->v[i + 1], sd, e) : -ENOMEM;
		if (rc) {
			ckpt_dcp_meta_free(out);
			return rc;
		}
	}
	return 0;
}

int ckpt_dcp_grid(const struct ckpt_dcp_entry *e, uint64_t *grid, size_t *index)
{
	if (e->is_bytes || e->nchunks == 0)
		return -EINVAL;
	uint64_t n[CKPT_MAX_RANK], total = 1;
	for (int d = 0; d < e->rank; d++) {
		grid[d] = e->chunks[0].sizes[d];
		if (grid[d] == 0) {
			if (e->size[d] != 0)
				return -EINVAL;
			grid[d] = 1;
			n[d] = 1;
		} else {
			if (e->size[d] % grid[d])
				return -EINVAL;
			n[d] = e->size[d] / grid[d];
		}
		if (n[d] && total > UINT64_MAX / n[d])
			return -EINVAL;
		total *= n[d];
	}
	if (total != e->nchunks)
		return -EINVAL;
	/* every box is a grid cell; distinct cells (nchunks == cells, so all covered) */
	uint8_t *seen = calloc((size_t)total, 1);
	if (!seen)
		return -ENOMEM;
	int rc = 0;
	for (size_t i = 0; i < e->nchunks && !rc; i++) {
		uint64_t pos = 0;
		for (int d = 0; d < e->rank; d++) {
			const struct ckpt_dcp_chunk *c = &e->chunks[i];
			uint64_t want = e->size[d] ? grid[d] : 0;
			if (c->sizes[d] != want || (e->size[d] && c->offsets[d] % grid[d])) {
				rc = -EINVAL;
				break;
			}
			pos = pos * n[d] + (e->size[d] ? c->offsets[d] / grid[d] : 0);
		}
		if (!rc && (pos >= total || seen[pos]))
			rc = -EINVAL;
		if (!rc) {
			seen[pos] = 1;
			index[i] = (size_t)pos;
		}
	}
	free(seen);
	return rc;
}

static uint64_t gcd64(uint64_t a, uint64_t b)
{
	while (b) {
		uint64_t t = a % b;
		a = b;
		b = t;
	}
	return a;
}

int ckpt_dcp_cells(const struct ckpt_dcp_entry *e, uint64_t *cell)
{
	if (e->is_bytes)
		return -EINVAL;
	uint64_t n[CKPT_MAX_RANK], total = 1;
	for (int d = 0; d < e->rank; d++) {
		uint64_t g = e->size[d];
		for (size_t i = 0; i < e->nchunks; i++)
			g = gcd64(gcd64(g, e->chunks[i].offsets[d]), e->chunks[i].sizes[d]);
		cell[d] = g ? g : 1;
		n[d] = e->size[d] / cell[d];
		if (n[d] && total > CKPT_DCP_MAX_CELLS / n[d])
			return -EINVAL;
		total *= n[d];
	}
	if (total == 0)
		return 0; /* an empty tensor: nothing to tile */
	uint8_t *seen = calloc((size_t)total, 1);
	if (!seen)
		return -ENOMEM;
	int rc = 0;
	size_t marked = 0;
	for (size_t i = 0; i < e->nchunks && !rc; i++) {
		const struct ckpt_dcp_chunk *c = &e->chunks[i];
		uint64_t m[CKPT_MAX_RANK], q[CKPT_MAX_RANK] = { 0 }, cells = 1;
		for (int d = 0; d < e->rank; d++) {
			m[d] = c->sizes[d] / cell[d];
			cells *= m[d];
		}
		if (cells == 0)
			continue;
		for (;;) {
			uint64_t pos = 0;
			for (int d = 0; d < e->rank; d++)
				pos = pos * n[d] + c->offsets[d] / cell[d] + q[d];
			if (seen[pos]) {
				rc = -EINVAL; /* two boxes overlap */
				break;
			}
			seen[pos] = 1;
			marked++;
			int d = e->rank - 1;
			while (d >= 0 && ++q[d] == m[d])
				q[d--] = 0;
			if (d < 0)
				break;
		}
	}
	free(seen);
	if (!rc && marked != total)
		rc = -EINVAL; /* a gap */
	return rc;
}
