/* test_writer_chunk.c - the writer's chunk state machine from inside:
 * after each phase of a step (partial writes that spill, completing them,
 * rewriting stored chunks, failing and retried appends, commit) the step is
 * left quiet and ckpt_w_chunk_check_all() compares every chunk with the state
 * table of writer_chunk.c and the step's budget and counters with the
 * chunks.  A debug build also asserts every single transition. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "check.h"
#include "sysio.h"
#include "writer_int.h"

#define ROWS 64
#define COLS 1024 /* one float32 row = one 4 KiB inner chunk */

static float value(uint64_t i, uint64_t j, int gen)
{
	return (float)(i * COLS + j) + 0.5f * (float)gen;
}

static void fill(float *buf, const ckpt_region *r, int gen)
{
	uint64_t k = 0;
	for (uint64_t i = r->start[0]; i < r->stop[0]; i++)
		for (uint64_t j = r->start[1]; j < r->stop[1]; j++)
			buf[k++] = value(i, j, gen);
}

static ckpt_region box(uint64_t r0, uint64_t r1, uint64_t c0, uint64_t c1)
{
	ckpt_region r = { .rank = 2, .start = { r0, c0 }, .stop = { r1, c1 } };
	return r;
}

static int write_box(ckpt_warray *a, ckpt_region r, int gen)
{
	size_t n = (r.stop[0] - r.start[0]) * (r.stop[1] - r.start[1]);
	float *buf = malloc(n * sizeof(float));
	fill(buf, &r, gen);
	int rc = ckpt_warray_write_flags(a, &r, 0, buf, n * sizeof(float), CKPT_WRITE_SAME);
	free(buf);
	return rc;
}

/* The whole array reads back as generation gen, except row `row2` (gen2). */
static int read_matches(ckpt_warray *a, int gen, uint64_t row2, int gen2)
{
	float *buf = malloc(sizeof(float) * ROWS * COLS);
	ssize_t n = ckpt_warray_read(a, NULL, 0, buf, sizeof(float) * ROWS * COLS);
	int ok = n == (ssize_t)(sizeof(float) * ROWS * COLS);
	for (uint64_t i = 0; ok && i < ROWS; i++)
		for (uint64_t j = 0; ok && j < COLS; j++)
			ok = buf[i * COLS + j] == value(i, j, i == row2 ? gen2 : gen);
	free(buf);
	return ok;
}

static void quiet_check(ckpt_step *st, const char *when)
{
	ckpt_w_chunk_wait_idle(st);
	int rc = ckpt_w_chunk_check_all(st);
	if (rc)
		fprintf(stderr, "check_all failed %s\n", when);
	CHECK_EQ_INT(rc, 0);
}

static ckpt_step *begin(const char *root, const char *name, ckpt_warray **a)
{
	ckpt_writer_opts o;
	ckpt_writer_opts_init(&o);
	o.chunk_bytes = COLS * sizeof(float);
	o.shard_bytes = 8 * o.chunk_bytes;
	o.mem_budget = 4 * (o.chunk_bytes + o.chunk_bytes / 8); /* 4 live chunks */
	o.threads = 2;
	ckpt_step *st = NULL;
	CHECK_EQ_INT(ckpt_step_begin(root, name, &o, &st), 0);
	if (!st)
		return NULL;
	const char *keys[] = { "w" };
	int kt[] = { 2 };
	uint64_t shape[] = { ROWS, COLS };
	CHECK_EQ_INT(ckpt_step_add_array(st, "state", keys, kt, 1, CKPT_DT_FLOAT32, 2, shape, a), 0);
	return st;
}

/* Partial chunks beyond the budget spill; completing them reloads them;
 * rewriting a stored chunk reloads it from its shard; commit stores all. */
static void test_spill_reload_rewrite(const char *root)
{
	ckpt_warray *a = NULL;
	ckpt_step *st = begin(root, "1", &a);
	if (!st || !a)
		return;
	CHECK(a->chunk_nbytes == COLS * sizeof(float) && a->nchunks == ROWS);
	quiet_check(st, "after begin");

	CHECK_EQ_INT(write_box(a, box(0, ROWS, 0, COLS / 2), 0), 0); /* every chunk half written */
	quiet_check(st, "after the left halves");
	ckpt_step_info si;
	ckpt_step_get_info(st, &si);
	CHECK(si.spills > 0 && si.spilled_chunks > 0);
	CHECK(si.mem_used <= st->opts.mem_budget);

	CHECK_EQ_INT(write_box(a, box(0, ROWS, COLS / 2, COLS), 0), 0); /* complete them */
	quiet_check(st, "after the right halves");
	ckpt_step_get_info(st, &si);
	CHECK_EQ_INT(si.spilled_chunks, 0);
	CHECK_EQ_INT(si.bytes_pending, 0);
	CHECK_EQ_INT(a->nstored, ROWS);

	/* Other bytes over written ones are refused; forgotten first, they are
	 * written again: STORED -> EMPTY, then EMPTY -> LIVE -> ... */
	CHECK_EQ_INT(write_box(a, box(5, 6, 0, COLS), 1), -EINVAL);
	quiet_check(st, "after a refused rewrite of a stored chunk");
	ckpt_region row5 = box(5, 6, 0, COLS);
	CHECK_EQ_INT(ckpt_warray_forget(a, &row5), 0);
	quiet_check(st, "after forgetting a stored chunk");
	CHECK_EQ_INT(a->nstored, ROWS - 1);
	CHECK_EQ_INT(write_box(a, box(5, 6, 0, COLS), 1), 0);
	quiet_check(st, "after rewriting a forgotten chunk");
	/* Same bytes again: STORED -> LOADING -> LIVE -> QUEUED -> ... */
	CHECK_EQ_INT(write_box(a, box(5, 6, 0, COLS), 1), 0);
	quiet_check(st, "after rewriting a stored chunk");
	CHECK_EQ_INT(a->nstored, ROWS);
	CHECK(read_matches(a, 0, 5, 1));
	quiet_check(st, "after reading back");

	CHECK_EQ_INT(ckpt_step_commit(st, "1"), 0);
	CHECK_EQ_INT(ckpt_w_chunk_check_all(st), 0);
	CHECK(read_matches(a, 0, 5, 1));
	ckpt_step_destroy(st);
}

/* Appends that fail leave chunks in ERROR with their buffers; commit
 * requeues them, fails again while the cause lasts, then succeeds. */
static void test_error_retry(const char *root)
{
	ckpt_warray *a = NULL;
	ckpt_step *st = begin(root, "2", &a);
	if (!st || !a)
		return;
	struct rlimit old_lim, lim;
	getrlimit(RLIMIT_FSIZE, &old_lim);
	signal(SIGXFSZ, SIG_IGN);
	lim = old_lim;
	lim.rlim_cur = 100; /* no compressed chunk fits */
	CHECK_EQ_INT(setrlimit(RLIMIT_FSIZE, &lim), 0);
	fprintf(stderr, "(expected write errors follow)\n");
	CHECK_EQ_INT(write_box(a, box(0, 2, 0, COLS), 0), 0); /* two complete chunks */
	quiet_check(st, "after failed appends");
	CHECK(ckpt_w_chunk_at(a, 0)->state == WC_ERROR && ckpt_w_chunk_at(a, 1)->state == WC_ERROR);
	CHECK(atomic_load(&a->err) < 0); /* EFBIG, or EINVAL from a cut O_DIRECT write */
	CHECK(ckpt_step_commit(st, "2") < 0);
	quiet_check(st, "after a failed commit");
	CHECK_EQ_INT(setrlimit(RLIMIT_FSIZE, &old_lim), 0);
	fprintf(stderr, "(end of expected write errors)\n");
	CHECK_EQ_INT(write_box(a, box(2, ROWS, 0, COLS), 0), 0);
	quiet_check(st, "after the rest");
	CHECK_EQ_INT(ckpt_step_commit(st, "2"), 0);
	CHECK_EQ_INT(ckpt_w_chunk_check_all(st), 0);
	CHECK(ckpt_w_chunk_at(a, 0)->state == WC_STORED && ckpt_w_chunk_at(a, 1)->state == WC_STORED);
	CHECK(read_matches(a, 0, ROWS, 0));
	ckpt_step_destroy(st);
}

int main(void)
{
	char tmpl[] = "/tmp/ckpt-writer-chunk-XXXXXX";
	char *root = mkdtemp(tmpl);
	CHECK(root != NULL);
	if (!root)
		return CHECK_DONE();
	CHECK_RUN_CALL(test_spill_reload_rewrite, (root));
	CHECK_RUN_CALL(test_error_retry, (root));
	CHECK_EQ_INT(ckpt_rmtree(root), 0);
	return CHECK_DONE();
}
