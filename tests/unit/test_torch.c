/*
 * test_torch.c - tensors of torch.save pickles and distributed-checkpoint
 * metadata (format/torch.c): the data.pkl of the generated torch fixture
 * (written by a real torch), the real .metadata of the fixtures, dense
 * layouts and their refusals, chunk grids.
 */
#include <errno.h>
#include <string.h>

#include "check.h"
#include "common.h"
#include "pickle.h"
#include "torch.h"

static const struct ckpt_torch_tensor *find(const struct ckpt_torch_state *s, const char *name)
{
	for (size_t i = 0; i < s->n; i++)
		if (strcmp(s->t[i].name, name) == 0)
			return &s->t[i];
	return NULL;
}

static void test_state(void)
{
	size_t n = 0;
	char *b = check_slurp(CKPT_SRCDIR "/tests/fuzz/seeds/fuzz_pickle/state_data_pkl", &n);
	CHECK(b != NULL);
	if (!b)
		return;
	ckpt_pickle *p = NULL;
	CHECK_EQ_INT(ckpt_pickle_load(b, n, "state.pt", &p), 0);
	struct ckpt_torch_state s;
	CHECK_EQ_INT(ckpt_torch_state_parse(ckpt_pickle_root(p), "state.pt", &s), 0);
	CHECK_EQ_INT(s.n, 18);
	const struct ckpt_torch_tensor *emb = find(&s, "model.model.embed_tokens.weight");
	const struct ckpt_torch_tensor *head = find(&s, "model.lm_head.weight");
	CHECK(emb && head);
	if (emb && head) {
		CHECK_EQ_INT(emb->depth, 4);
		CHECK(strcmp(emb->path[0], "model") == 0 && strcmp(emb->path[3], "weight") == 0);
		CHECK_EQ_INT(emb->dtype, CKPT_DT_BFLOAT16);
		CHECK(emb->rank == 2 && emb->shape[0] == 16 && emb->shape[1] == 8);
		CHECK(strcmp(emb->storage_key, head->storage_key) == 0); /* tied */
	}
	int order[CKPT_MAX_RANK];
	uint64_t off, len;
	const struct ckpt_torch_tensor *t = find(&s, "model.model.layers.1.transposed");
	CHECK(t && ckpt_torch_dense(t, order, &off, &len) == 0 && order[0] == 1 && order[1] == 0 &&
	      off == 0 && len == 96);
	t = find(&s, "model.model.layers.1.offset_view");
	CHECK(t && ckpt_torch_dense(t, order, &off, &len) == 0 && order[0] == 0 && off == 20 && len == 48);
	t = find(&s, "model.model.layers.0.norm.weight"); /* a Parameter */
	CHECK(t && t->dtype == CKPT_DT_FLOAT32 && t->rank == 1 && t->shape[0] == 8);
	t = find(&s, "model.scalar");
	CHECK(t && t->rank == 0 && ckpt_torch_dense(t, order, &off, &len) == 0 && len == 4);
	t = find(&s, "model.complex.c128");
	CHECK(t && t->dtype == CKPT_DT_COMPLEX128);
	t = find(&s, "model.buffers.mask");
	CHECK(t && t->dtype == CKPT_DT_BOOL);
	t = find(&s, "step");
	CHECK(t && t->dtype == CKPT_DT_INT64 && t->rank == 0);
	ckpt_torch_state_free(&s);
	ckpt_pickle_free(p);
	free(b);
}

static void test_dense(void)
{
	struct ckpt_torch_tensor t = {
		.dtype = CKPT_DT_INT32, .rank = 2, .shape = { 3, 2 }, .stride = { 4, 2 }, .storage_numel = 12
	};
	int order[CKPT_MAX_RANK];
	uint64_t off, len;
	CHECK_EQ_INT(ckpt_torch_dense(&t, order, &off, &len), -EINVAL); /* x[:, ::2] */
	t.stride[0] = 2;
	t.stride[1] = 1;
	CHECK_EQ_INT(ckpt_torch_dense(&t, order, &off, &len), 0);
	t.offset = 7; /* 7 + 6 > 12 */
	CHECK_EQ_INT(ckpt_torch_dense(&t, order, &off, &len), -EINVAL);
	/* (1, 6, 4) with strides (24, 1, 6): a transpose of the last two */
	struct ckpt_torch_tensor u = { .dtype = CKPT_DT_FLOAT16,
				       .rank = 3,
				       .shape = { 1, 6, 4 },
				       .stride = { 99, 1, 6 },
				       .storage_numel = 24 };
	CHECK_EQ_INT(ckpt_torch_dense(&u, order, &off, &len), 0);
	CHECK(order[0] == 0 && order[1] == 2 && order[2] == 1 && len == 48);
	/* a (2, 3, 4) permuted (2, 0, 1): strides (1, 8, 2)... shape (4, 2, 3) of C strides (6, 3, 1) seen as order */
	struct ckpt_torch_tensor w = { .dtype = CKPT_DT_UINT8,
				       .rank = 3,
				       .shape = { 3, 4, 2 },
				       .stride = { 1, 6, 3 },
				       .storage_numel = 24 };
	CHECK_EQ_INT(ckpt_torch_dense(&w, order, &off, &len), 0);
	CHECK(order[0] == 1 && order[1] == 2 && order[2] == 0);
	/* broadcast (stride 0) is not dense */
	w.stride[0] = 0;
	CHECK_EQ_INT(ckpt_torch_dense(&w, order, &off, &len), -EINVAL);
}

static void test_dcp(void)
{
	size_t n = 0;
	char *b = check_slurp(CKPT_FIXTURES "/torch_dcp/.metadata", &n);
	CHECK(b != NULL);
	if (!b)
		return;
	ckpt_pickle *p = NULL;
	CHECK_EQ_INT(ckpt_pickle_load(b, n, ".metadata", &p), 0);
	struct ckpt_dcp_meta m;
	CHECK_EQ_INT(ckpt_dcp_meta_parse(ckpt_pickle_root(p), ".metadata", &m), 0);
	CHECK_EQ_INT(m.n, 10);
	int seen = 0;
	for (size_t i = 0; i < m.n; i++) {
		const struct ckpt_dcp_entry *e = &m.e[i];
		CHECK(!e->is_bytes && e->nchunks == 1 && strcmp(e->chunks[0].file, "__0_0.distcp") == 0);
		if (strcmp(e->fqn, "params.embed.embedding") == 0) {
			seen++;
			CHECK(e->dtype == CKPT_DT_BFLOAT16 && e->rank == 2 && e->size[0] == 64 &&
			      e->size[1] == 32);
			uint64_t grid[CKPT_MAX_RANK];
			size_t idx[1];
			CHECK(ckpt_dcp_grid(e, grid, idx) == 0 && grid[0] == 64 && grid[1] == 32 &&
			      idx[0] == 0);
		}
		if (strcmp(e->fqn, "step") == 0) {
			seen++;
			CHECK(e->dtype == CKPT_DT_INT32 && e->rank == 0);
		}
	}
	CHECK_EQ_INT(seen, 2);
	CHECK(m.version == NULL || strcmp(m.version, "1.0.0") == 0);
	ckpt_dcp_meta_free(&m);
	ckpt_pickle_free(p);
	free(b);
}

static void test_grid(void)
{
	struct ckpt_dcp_chunk ch[4] = { 0 };
	struct ckpt_dcp_entry e = { .rank = 2, .size = { 8, 6 }, .chunks = ch, .nchunks = 4 };
	uint64_t offs[4][2] = { { 4, 3 }, { 0, 0 }, { 0, 3 }, { 4, 0 } };
	for (int i = 0; i < 4; i++) {
		ch[i].offsets[0] = offs[i][0];
		ch[i].offsets[1] = offs[i][1];
		ch[i].sizes[0] = 4;
		ch[i].sizes[1] = 3;
	}
	uint64_t grid[CKPT_MAX_RANK];
	size_t idx[4];
	CHECK_EQ_INT(ckpt_dcp_grid(&e, grid, idx), 0);
	CHECK(grid[0] == 4 && grid[1] == 3 && idx[0] == 3 && idx[1] == 0 && idx[2] == 1 && idx[3] == 2);
	ch[3].offsets[1] = 3; /* two boxes at one place, one cell uncovered */
	CHECK_EQ_INT(ckpt_dcp_grid(&e, grid, idx), -EINVAL);
	ch[3].offsets[1] = 0;
	ch[3].sizes[1] = 2; /* uneven */
	CHECK_EQ_INT(ckpt_dcp_grid(&e, grid, idx), -EINVAL);
	CHECK_EQ_INT(ckpt_dcp_cells(&e, grid), -EINVAL); /* uneven, and a gap at (4:8, 2:3) */
	e.nchunks = 3; /* a gap */
	ch[3].sizes[1] = 3;
	CHECK_EQ_INT(ckpt_dcp_grid(&e, grid, idx), -EINVAL);
	CHECK_EQ_INT(ckpt_dcp_cells(&e, grid), -EINVAL);
	e.nchunks = 4;
	CHECK_EQ_INT(ckpt_dcp_cells(&e, grid), 0);
	CHECK(grid[0] == 4 && grid[1] == 3);
	/* rows 0:5, 5:8 of 8: cells of one row */
	struct ckpt_dcp_chunk rc2[2] = { { .offsets = { 0 }, .sizes = { 5 } },
					 { .offsets = { 5 }, .sizes = { 3 } } };
	struct ckpt_dcp_entry r1 = { .rank = 1, .size = { 8 }, .chunks = rc2, .nchunks = 2 };
	CHECK(ckpt_dcp_cells(&r1, grid) == 0 && grid[0] == 1);
	rc2[1].offsets[0] = 4; /* overlap at row 4 (and row 7 uncovered) */
	CHECK_EQ_INT(ckpt_dcp_cells(&r1, grid), -EINVAL);
	/* rank 0: one box */
	struct ckpt_dcp_chunk c0 = { 0 };
	struct ckpt_dcp_entry s0 = { .rank = 0, .chunks = &c0, .nchunks = 1 };
	CHECK_EQ_INT(ckpt_dcp_cells(&s0, grid), 0);
	s0.nchunks = 0;
	CHECK_EQ_INT(ckpt_dcp_cells(&s0, grid), -EINVAL);
}

static int load_meta(const char *dir, ckpt_pickle **p, struct ckpt_dcp_meta *m)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/tests/fixtures/generated/torch/%s/.metadata", CKPT_SRCDIR, dir);
	size_t n = 0;
	char *b = check_slurp(path, &n);
	if (!b)
		return -ENOENT;
	int rc = ckpt_pickle_load(b, n, dir, p);
	free(b);
	if (rc)
		return rc;
	rc = ckpt_dcp_meta_parse(ckpt_pickle_root(*p), dir, m);
	if (rc)
		ckpt_pickle_free(*p);
	return rc;
}

static const struct ckpt_dcp_entry *entry(const struct ckpt_dcp_meta *m, const char *fqn)
{
	for (size_t i = 0; i < m->n; i++)
		if (strcmp(m->e[i].fqn, fqn) == 0)
			return &m->e[i];
	return NULL;
}

static void test_dcp_variants(void)
{
	const char *dirs[] = { "dcp_two_ranks", "dcp_old_names", "dcp_zstd" };
	for (int v = 0; v < 3; v++) {
		ckpt_pickle *p = NULL;
		struct ckpt_dcp_meta m;
		CHECK_EQ_INT(load_meta(dirs[v], &p, &m), 0);
		if (!p)
			continue;
		const struct ckpt_dcp_entry *w = entry(&m, "model.w"), *b = entry(&m, "model.b");
		CHECK(w && b && entry(&m, "step"));
		uint64_t grid[CKPT_MAX_RANK];
		size_t idx[8];
		if (w) {
			CHECK(w->dtype == CKPT_DT_FLOAT32 && w->nchunks == 2);
			CHECK(ckpt_dcp_grid(w, grid, idx) == 0 && grid[0] == 4 && grid[1] == 6);
			CHECK(w->chunks[0].transform == (v == 2 ? CKPT_DCP_ZSTD : CKPT_DCP_RAW));
			if (v != 1)
				CHECK(strcmp(w->chunks[1].file, "__1_0.distcp") == 0);
		}
		if (b) {
			CHECK(b->dtype == CKPT_DT_BFLOAT16 && b->nchunks == 4);
			CHECK(ckpt_dcp_grid(b, grid, idx) == 0 && grid[0] == 2 && grid[1] == 2 &&
			      idx[1] == 1 && idx[2] == 2);
		}
		const struct ckpt_dcp_entry *irr = entry(&m, "model.irregular"), *extra = entry(&m, "extra");
		CHECK((v == 0) == (irr != NULL));
		CHECK((v == 0) == (extra != NULL));
		if (irr) {
			CHECK(ckpt_dcp_grid(irr, grid, idx) == -EINVAL);
			CHECK(ckpt_dcp_cells(irr, grid) == 0 && grid[0] == 1 && grid[1] == 2);
		}
		const struct ckpt_dcp_entry *ov = entry(&m, "model.overlap"), *cols = entry(&m, "model.cols");
		CHECK((v == 0) == (ov != NULL));
		if (ov)
			CHECK(ckpt_dcp_cells(ov, grid) == -EINVAL);
		CHECK(cols && ckpt_dcp_cells(cols, grid) == 0 && grid[0] == 4 && grid[1] == 1);
		if (w)
			CHECK(ckpt_dcp_cells(w, grid) == 0 && grid[0] == 4 && grid[1] == 6);
		if (extra)
			CHECK(extra->is_bytes && extra->nchunks == 1 && extra->chunks[0].offset == 0);
		CHECK((v == 1) == (m.version == NULL));
		ckpt_dcp_meta_free(&m);
		ckpt_pickle_free(p);
	}
}

static void test_rebuild_v3(void)
{
	/* _rebuild_tensor_v3 over an untyped storage of 16 bytes: uint16 view [1:4] */
	static const char pk[] = "\x80\x02}X\x01\x00\x00\x00"
				 "tctorch._utils\n_rebuild_tensor_v3\n"
				 "((X\x07\x00\x00\x00"
				 "storagectorch.storage\nUntypedStorage\n"
				 "X\x01\x00\x00\x00"
				 "0X\x03\x00\x00\x00"
				 "cpuK\x10tQK\x01K\x03\x85K\x01\x85\x89"
				 "ccollections\nOrderedDict\n)Rctorch\nuint16\ntRs.";
	ckpt_pickle *p = NULL;
	CHECK_EQ_INT(ckpt_pickle_load(pk, sizeof(pk) - 1, "v3", &p), 0);
	struct ckpt_torch_state s;
	CHECK_EQ_INT(ckpt_torch_state_parse(ckpt_pickle_root(p), "v3", &s), 0);
	CHECK_EQ_INT(s.n, 1);
	if (s.n == 1) {
		int order[CKPT_MAX_RANK];
		uint64_t off, len;
		CHECK(s.t[0].dtype == CKPT_DT_UINT16 && s.t[0].storage_numel == 8 &&
		      strcmp(s.t[0].name, "t") == 0);
		CHECK(ckpt_torch_dense(&s.t[0], order, &off, &len) == 0 && off == 2 && len == 6);
	}
	ckpt_torch_state_free(&s);
	ckpt_pickle_free(p);
}

int main(void)
{
	CHECK_RUN(test_rebuild_v3);
	CHECK_RUN(test_dcp_variants);
	CHECK_RUN(test_state);
	CHECK_RUN(test_dense);
	CHECK_RUN(test_dcp);
	CHECK_RUN(test_grid);
	return CHECK_DONE();
}
