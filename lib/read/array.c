#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>
#include <zlib.h>

#include "array.h"
#include "cache.h"
#include "crc32c.h"
#include "kept.h"
#include "pool.h"
#include "stats.h"
#include "stream.h"
#include "tlsbuf.h"

#define SCRATCH_KEEP 16 /* idle decode scratch kept by a context */

struct ckpt_ctx {
	ckpt_cache *cache;
	ckpt_streams *streams; /* units over CKPT_CACHE_UNIT_CAP, read as streams */
	/* Started on first use, not at create: a daemon that forks after
	 * building its view (fuse_daemonize) must not lose its threads.  One
	 * started before a fork (an OCDBT item opened while the view was built)
	 * is left to the parent, and the child starts its own
	 * (ckpt_pool_forked); the parent's copy is kept in parent_pool, under
	 * pool_lock, and freed at destroy (a thread may still hold the pointer
	 * it loaded when it was replaced). */
	_Atomic(ckpt_pool *) pool;
	ckpt_pool *parent_pool;
	pthread_mutex_t pool_lock;
	int threads;
	uint64_t prefetch_bytes;
	atomic_uint_least64_t next_id;
	atomic_int inflight; /* prefetch tasks queued or running */
	pthread_mutex_t drain_lock;
	pthread_cond_t drained;
	pthread_mutex_t sc_lock; /* sc_free */
	ckpt_zarr_scratch *sc_free[SCRATCH_KEEP]; /* idle decode scratch */
	int nsc;
	ckpt_kept_limit kept_lim; /* unit files its arrays keep open */
};

/* Identity of one storage unit as last seen, and the epoch it was checked in. */
struct unit_rec {
	uint64_t su1; /* storage-unit linear index + 1; 0 = empty slot */
	struct ckpt_zarr_unit_id id;
	unsigned epoch;
};

/*
 * The life of an array (a->state; every change through arr_set(), which
 * checks the edge against arr_edges):
 *
 *   from     to       by
 *   LIVE     STALE    revalidate_meta: its metadata changed or went under
 *                     the mount (shape, codecs, data may differ)
 *   LIVE     RETIRED  ckpt_arrays_retire: its step was pruned from a root
 *   STALE    RETIRED  ckpt_arrays_retire
 *
 * LIVE serves reads; STALE and RETIRED answer every read -ESTALE; RETIRED
 * also dropped its chunks' owner from the cache (and drops it again, with
 * the fresh one, when the array is freed: a read that passed its state
 * check just before the retire may have cached a chunk since).
 * Within LIVE, `owner`, `epoch`, `changes` and `torn` are counters, not
 * states: a new owner when a stored unit changed (its cached chunks are
 * unreachable), an epoch per open check, changes for the kernel's pages,
 * and a torn epoch that served a unit which then changed.
 */
enum arr_state { ARR_LIVE, ARR_STALE, ARR_RETIRED, ARR_NSTATES };

static const char *const arr_names[ARR_NSTATES] = { "live", "stale", "retired" };
static const unsigned arr_edges[ARR_NSTATES] = {
	[ARR_LIVE] = 1u << ARR_STALE | 1u << ARR_RETIRED,
	[ARR_STALE] = 1u << ARR_RETIRED,
};
_Static_assert(ARR_NSTATES <= 32, "arr_edges is a 32-bit mask per state");

#define MAX_UNIT_RECS (1u << 16) /* beyond (~5 MiB): forget them all, and the cached chunks */
#define MAX_LOGGED (1u << 12) /* missing chunks logged one by one per array */
#define OPEN_CHECK_MAX 64 /* unit identities checked by one ckpt_array_open_check */

struct ckpt_array {
	ckpt_ctx *ctx;
	ckpt_store *store;
	char *prefix;
	/* Cache owner of the array's chunks: replaced by a fresh one when a
	 * stored unit changed, which makes every cached chunk unreachable (they
	 * age out of the LRU). */
	atomic_uint_least64_t owner;
	uint64_t retired_owner; /* the owner ckpt_arrays_retire replaced (under mu) */
	atomic_uint epoch; /* ckpt_array_revalidate */
	/* Bumped whenever served bytes may have changed or their unit records
	 * were dropped (forget_all, stale): see ckpt_array_open_check. */
	atomic_uint changes;
	_Atomic int state; /* enum arr_state (the table above) */
	atomic_int inflight; /* its prefetch tasks queued or running (ckpt_array_destroy waits) */
	/* epoch + 1 of an epoch that served bytes of a unit that then changed:
	 * the rest of that epoch is -ESTALE (a reader retrying, as the kernel
	 * does after a failed read-ahead, must not get the new version next to
	 * bytes of the old one) */
	atomic_uint torn;
	const char *meta_name; /* "zarr.json" or ".zarray" */
	struct ckpt_zarr_unit_id meta_id; /* under mu */
	uint32_t meta_crc; /* CRC-32C of the metadata bytes parsed */
	size_t meta_len;
	size_t rr; /* next recs slot ckpt_array_open_check looks at (under mu) */
	ckpt_array_meta meta;
	atomic_int stored_known;
	uint64_t stored;
	int streamed; /* units over CKPT_CACHE_UNIT_CAP: read as streams, never cached */
	/* Raw units (decode_is_copy), not sharded, in a store with open_fd: reads
	 * of the whole array go straight from the store (direct_read); other
	 * regions and pinned access (visit) go through the cache. */
	int direct;
	ckpt_kept *kept; /* direct: unit files kept open across one epoch's reads (kept.h), or NULL */
	/* A stored ZIP member (meta.zip_has_crc, not streamed): the CRC-32 of
	 * each decode unit's stored bytes as decoded (zcrc, zknown; zn of the
	 * zunits known), combined in unit order with the member's header CRC
	 * once all are known and compared with the member's CRC-32; zbad (a
	 * mismatch) makes every read of the array -EIO.  Under mu. */
	uint32_t *zcrc;
	uint8_t *zknown;
	uint64_t zunits, zn;
	int zchecked;
	atomic_int zbad;
	pthread_mutex_t mu; /* recs, logged, the ZIP member state */
	struct unit_rec *recs; /* open addressing, nrecs_cap a power of two */
	size_t nrecs, nrecs_cap;
	uint64_t *logged; /* decode-unit indices + 1 logged as missing */
	size_t nlogged, logged_cap;
	int logged_full;
};

/* Decode scratch (a zstd context and the stored bytes of a unit) is
 * shared by the context's decodes, one at a time each: taken for one fill
 * and given back.  Per thread instead, every FUSE worker the loop starts
 * under load would fault in its own unit-sized buffers. */
static ckpt_zarr_scratch *scratch_get(ckpt_ctx *ctx)
{
	pthread_mutex_lock(&ctx->sc_lock);
	ckpt_zarr_scratch *sc = ctx->nsc ? ctx->sc_free[--ctx->nsc] : NULL;
	pthread_mutex_unlock(&ctx->sc_lock);
	return sc ? sc : ckpt_zarr_scratch_create();
}

static void scratch_put(ckpt_ctx *ctx, ckpt_zarr_scratch *sc)
{
	pthread_mutex_lock(&ctx->sc_lock);
	if (ctx->nsc < SCRATCH_KEEP) {
		ctx->sc_free[ctx->nsc++] = sc;
		sc = NULL;
	}
	pthread_mutex_unlock(&ctx->sc_lock);
	ckpt_zarr_scratch_destroy(sc);
}

int ckpt_ctx_create(const ckpt_ctx_opts *opts, ckpt_ctx **out)
{
	ckpt_ctx *ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return -ENOMEM;
	uint64_t budget = opts && opts->cache_bytes ? opts->cache_bytes : (256ull << 20);
	int threads = opts && opts->threads > 0 ? opts->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
	if (threads < 1)
		threads = 1;
	ctx->prefetch_bytes = opts && opts->prefetch_bytes ? opts->prefetch_bytes : (8ull << 20);
	int rc = ckpt_cache_create(budget, &ctx->cache);
	if (rc < 0) {
		free(ctx);
		return rc;
	}
	rc = ckpt_streams_create(&ctx->streams);
	if (rc < 0) {
		ckpt_cache_destroy(ctx->cache);
		free(ctx);
		return rc;
	}
	ctx->threads = threads;
	pthread_mutex_init(&ctx->pool_lock, NULL);
	pthread_mutex_init(&ctx->drain_lock, NULL);
	pthread_cond_init(&ctx->drained, NULL);
	pthread_mutex_init(&ctx->sc_lock, NULL);
	ctx->kept_lim.max = KEPT_MAX;
	*out = ctx;
	return 0;
}

void ckpt_ctx_destroy(ckpt_ctx *ctx)
{
	if (!ctx)
		return;
	ckpt_pool_destroy(atomic_load(&ctx->pool));
	ckpt_pool_destroy(ctx->parent_pool);
	ckpt_cache_destroy(ctx->cache);
	ckpt_streams_destroy(ctx->streams);
	pthread_mutex_destroy(&ctx->pool_lock);
	pthread_mutex_destroy(&ctx->drain_lock);
	pthread_cond_destroy(&ctx->drained);
	while (ctx->nsc > 0)
		ckpt_zarr_scratch_destroy(ctx->sc_free[--ctx->nsc]);
	pthread_mutex_destroy(&ctx->sc_lock);
	free(ctx);
}

int ckpt_array_open(ckpt_ctx *ctx, ckpt_store *store, const char *prefix, int format, ckpt_array **out)
{
	ckpt_array_open_opts o = { .format = format };
	return ckpt_array_open_ex(ctx, store, prefix, &o, out);
}

/* 1 when decoding a unit of a is a copy of its stored bytes. */
static int decode_is_copy(const ckpt_array *a)
{
	const ckpt_array_meta *m = &a->meta;
	return m->nb2b == 0 && !m->order_f && !(m->big_endian && m->itemsize > 1);
}

int ckpt_array_open_ex(ckpt_ctx *ctx, ckpt_store *store, const char *prefix, const ckpt_array_open_opts *o,
		       ckpt_array **out)
{
	static const struct {
		int fmt;
		const char *name;
	} metas[] = { { 3, "zarr.json" }, { 2, ".zarray" } };
	int format = o ? o->format : 0;
	char key[4096];
	char *json = NULL;
	size_t len = 0;
	int rc = -ENOENT, fmt = 0;
	const char *meta_name = NULL;
	for (size_t i = 0; i < 2 && rc == -ENOENT; i++) {
		if (format && metas[i].fmt != format)
			continue;
		if (snprintf(key, sizeof(key), "%s%s%s", prefix, *prefix ? "/" : "", metas[i].name) >=
		    (int)sizeof(key))
			return -ENAMETOOLONG;
		rc = ckpt_store_read_all(store, key, 1 << 20, &json, &len);
		fmt = metas[i].fmt;
		meta_name = metas[i].name;
	}
	if (rc == -EFBIG) {
		ckpt_log(CKPT_LOG_ERR, "%s/%s: metadata larger than 1 MiB", store->root, key);
		return -EINVAL;
	}
	if (rc < 0)
		return rc;
	ckpt_array *a = calloc(1, sizeof(*a));
	if (!a) {
		free(json);
		return -ENOMEM;
	}
	const char *why;
	rc = ckpt_zarr_parse(fmt, json, len, &a->meta, &why);
	a->meta_crc = ckpt_crc32c(0, json, len);
	a->meta_len = len;
	a->meta_name = meta_name;
	free(json);
	if (rc < 0) {
		ckpt_log(CKPT_LOG_ERR, "%s/%s: %s", store->root, key, why);
		free(a);
		return rc;
	}
	a->meta.missing_is_error = o && o->missing_is_error;
	a->prefix = strdup(prefix);
	if (!a->prefix) {
		free(a);
		return -ENOMEM;
	}
	a->ctx = ctx;
	a->store = store;
	/* After the read: object stores answer from what the read pinned.  A
	 * failure leaves it unknown (absent): the first open check re-reads. */
	if (ckpt_zarr_key_identity(store, key, &a->meta_id) < 0)
		a->meta_id.absent = 1;
	a->streamed = ckpt_stream_ok(&a->meta) &&
		      a->meta.unit_bytes > CKPT_CACHE_UNIT_CAP(ckpt_cache_budget(ctx->cache));
	a->direct = !a->streamed && decode_is_copy(a) && !a->meta.sharded && a->meta.rank > 0 &&
		    !a->meta.zip_has_crc && ckpt_store_has_open_fd(store);
	if (a->direct)
		a->kept = ckpt_kept_create(&ctx->kept_lim); /* NULL: a unit opened per read */
	if (a->meta.zip_has_crc && !a->streamed && !a->meta.sharded) {
		uint64_t units = 1;
		for (int d = 0; d < a->meta.rank; d++)
			units *= a->meta.grid[d];
		if (units && units <= (1u << 20)) { /* else: not checked */
			a->zcrc = calloc((size_t)units, sizeof(*a->zcrc));
			a->zknown = calloc((size_t)units, 1);
			if (a->zcrc && a->zknown) {
				a->zunits = units;
			} else {
				free(a->zcrc);
				free(a->zknown);
				a->zcrc = NULL;
				a->zknown = NULL;
			}
		}
	}
	atomic_store(&a->owner, atomic_fetch_add(&ctx->next_id, 1) + 1);
	pthread_mutex_init(&a->mu, NULL);
	*out = a;
	return 0;
}

void ckpt_array_destroy(ckpt_array *a)
{
	if (!a)
		return;
	/* Its prefetch tasks may still reference it: wait until none runs (the
	 * others' go on: an array freed while the mount serves reads, its step
	 * pruned from a live root, does not wait for the whole pool). */
	ckpt_ctx *ctx = a->ctx;
	pthread_mutex_lock(&ctx->drain_lock);
	while (atomic_load(&a->inflight) > 0)
		pthread_cond_wait(&ctx->drained, &ctx->drain_lock);
	pthread_mutex_unlock(&ctx->drain_lock);
	ckpt_streams_forget(ctx->streams, (const void *)(uintptr_t)atomic_load(&a->owner));
	ckpt_kept_destroy(a->kept);
	pthread_mutex_destroy(&a->mu);
	free(a->recs);
	free(a->logged);
	free(a->zcrc);
	free(a->zknown);
	free(a->prefix);
	free(a);
}

const ckpt_array_meta *ckpt_array_meta_of(const ckpt_array *a)
{
	return &a->meta;
}

ckpt_store *ckpt_array_store(const ckpt_array *a)
{
	return a->store;
}

const char *ckpt_array_prefix(const ckpt_array *a)
{
	return a->prefix;
}

/* ---- unit identities (revalidation) ------------------------------------ */

static uint64_t hash64(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	return x;
}

/* The record of storage unit su, or NULL.  Caller holds a->mu. */
static struct unit_rec *rec_find(ckpt_array *a, uint64_t su)
{
	if (!a->nrecs_cap)
		return NULL;
	for (size_t i = hash64(su) & (a->nrecs_cap - 1);; i = (i + 1) & (a->nrecs_cap - 1)) {
		if (a->recs[i].su1 == su + 1)
			return &a->recs[i];
		if (!a->recs[i].su1)
			return NULL;
	}
}

/* Forget every record and make every cached chunk of the array unreachable.
 * Caller holds a->mu. */
static void forget_all(ckpt_array *a)
{
	atomic_store(&a->owner, atomic_fetch_add(&a->ctx->next_id, 1) + 1);
	atomic_fetch_add(&a->changes, 1);
	if (a->recs)
		memset(a->recs, 0, a->nrecs_cap * sizeof(*a->recs));
	a->nrecs = 0;
	if (a->zunits) { /* new stored bytes: the member is checked afresh */
		memset(a->zknown, 0, (size_t)a->zunits);
		a->zn = 0;
		a->zchecked = 0;
		atomic_store(&a->zbad, 0);
	}
}

/* Drop the cached chunks of the listed owners (sorted here). */
static void drop_owners(ckpt_ctx *ctx, uint64_t *owners, size_t n)
{
	for (size_t i = 1; i < n; i++) /* insertion sort: a few hundred at most */
		for (size_t j = i; j > 0 && owners[j - 1] > owners[j]; j--) {
			uint64_t t = owners[j];
			owners[j] = owners[j - 1];
			owners[j - 1] = t;
		}
	ckpt_cache_drop_owners(ctx->cache, owners, n);
}

/* Move a to state `to` if that is an edge of the table: 1, or 0 when a was
 * not in a state that leads there (another thread got there first). */
static int arr_set(ckpt_array *a, enum arr_state to)
{
	int from = atomic_load(&a->state);
	while (from != (int)to && (arr_edges[from] & (1u << to))) {
		if (atomic_compare_exchange_weak(&a->state, &from, (int)to))
			return 1;
	}
	if (from != (int)to)
		ckpt_log(CKPT_LOG_DEBUG, "array %s: no edge %s -> %s", a->prefix, arr_names[from],
			 arr_names[to]);
	return 0;
}

static int arr_stale(const ckpt_array *a)
{
	return atomic_load(&a->state) != ARR_LIVE;
}

void ckpt_arrays_retire(ckpt_ctx *ctx, ckpt_array *const *arrs, size_t n)
{
	uint64_t owners[256];
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		ckpt_array *a = arrs[i];
		if (a->kept)
			ckpt_kept_drop(a->kept); /* its step went: hold none of its files open */
		pthread_mutex_lock(&a->mu);
		if (arr_set(a, ARR_RETIRED)) {
			uint64_t old = atomic_load(&a->owner);
			forget_all(a); /* a fresh owner: nothing reaches the old chunks */
			a->retired_owner = old;
			pthread_mutex_unlock(&a->mu);
			ckpt_streams_forget(ctx->streams, (const void *)(uintptr_t)old);
			owners[k++] = old;
		} else {
			/* Retired before (every other state leads here), and called
			 * again as the array is freed: a read or read-ahead that
			 * passed its state check just before that retire may have
			 * cached chunks since, under the owner it replaced or under
			 * the fresh one.  Nothing asks for either any more: drop both. */
			owners[k++] = a->retired_owner;
			owners[k++] = atomic_load(&a->owner);
			pthread_mutex_unlock(&a->mu);
		}
		if (k + 2 > sizeof(owners) / sizeof(owners[0])) {
			drop_owners(ctx, owners, k);
			k = 0;
		}
	}
	drop_owners(ctx, owners, k);
}

uint64_t ckpt_array_cache_owner(const ckpt_array *a)
{
	return atomic_load(&a->owner);
}

ckpt_cache *ckpt_ctx_cache(ckpt_ctx *ctx)
{
	return ctx->cache;
}

/* Insert or update the record of su.  Caller holds a->mu. */
static void rec_put(ckpt_array *a, uint64_t su, const struct ckpt_zarr_unit_id *id, unsigned epoch)
{
	struct unit_rec *r = rec_find(a, su);
	if (!r) {
		if (a->nrecs + 1 > MAX_UNIT_RECS) {
			forget_all(a);
			return; /* chunks cached before stay unreachable: they are re-read */
		}
		if ((a->nrecs + 1) * 2 > a->nrecs_cap) {
			size_t ncap = a->nrecs_cap ? a->nrecs_cap * 2 : 64;
			struct unit_rec *nr = calloc(ncap, sizeof(*nr)), *old = a->recs;
			if (!nr) {
				forget_all(a);
				return;
			}
			size_t ocap = a->nrecs_cap;
			a->recs = nr;
			a->nrecs_cap = ncap;
			for (size_t i = 0; i < ocap; i++)
				if (old[i].su1) {
					size_t j = hash64(old[i].su1 - 1) & (ncap - 1);
					while (nr[j].su1)
						j = (j + 1) & (ncap - 1);
					nr[j] = old[i];
				}
			free(old);
		}
		size_t j = hash64(su) & (a->nrecs_cap - 1);
		while (a->recs[j].su1)
			j = (j + 1) & (a->nrecs_cap - 1);
		r = &a->recs[j];
		r->su1 = su + 1;
		a->nrecs++;
	}
	r->id = *id;
	r->epoch = epoch;
}

static int same_id(const struct ckpt_zarr_unit_id *x, const struct ckpt_zarr_unit_id *y)
{
	return x->absent == y->absent && (x->absent || (x->size == y->size && x->mtime_ns == y->mtime_ns));
}

static uint64_t storage_linear(const ckpt_array_meta *m, const uint64_t *g)
{
	uint64_t sg[CKPT_MAX_RANK], li = 0;
	ckpt_zarr_storage_index(m, g, sg);
	for (int d = 0; d < m->rank; d++)
		li = li * m->store_grid[d] + sg[d];
	return li;
}

void ckpt_array_revalidate(ckpt_array *a)
{
	atomic_fetch_add(&a->epoch, 1);
}

/* This epoch served bytes of a unit that changed since: see a->torn. */
static void mark_torn(ckpt_array *a, unsigned ep)
{
	atomic_store(&a->torn, ep + 1);
}

/* Stored unit su is now `id`; its record (if any) says which version the
 * array's cached chunks and cursors came from.  Called with a->mu held.  A
 * different version drops them all (a new owner), and when this epoch
 * already served bytes of the old one the epoch is torn: -ESTALE (a->mu
 * still held).  1 when a different version was dropped, else 0. */
static int unit_check_locked(ckpt_array *a, uint64_t su, const struct ckpt_zarr_unit_id *id, unsigned ep)
{
	struct unit_rec *r = rec_find(a, su);
	if (!r || same_id(&r->id, id))
		return 0;
	int served = r->epoch == ep;
	ckpt_log(CKPT_LOG_INFO, "%s/%s: stored data changed under the mount%s", a->store->root, a->prefix,
		 served ? "; this read fails with ESTALE" : "; cached chunks dropped");
	forget_all(a);
	if (served) {
		mark_torn(a, ep);
		return -ESTALE;
	}
	return 1;
}

static int torn_now(ckpt_array *a)
{
	unsigned t = atomic_load(&a->torn);
	return t && t == atomic_load(&a->epoch) + 1;
}

/* Storage-grid index sg of storage unit su (storage_linear's inverse). */
static void storage_of_linear(const ckpt_array_meta *m, uint64_t su, uint64_t *sg)
{
	for (int d = m->rank - 1; d >= 0; d--) {
		sg[d] = su % m->store_grid[d];
		su /= m->store_grid[d];
	}
}

/* The metadata file changed identity: the same bytes (a copy that kept
 * them) only update the identity; other bytes, or none, make the array
 * stale (its shape, codecs or data may be different: every read is
 * -ESTALE from now on; a remount or a rescan of a live root shows the new
 * one). */
static void check_meta(ckpt_array *a)
{
	char key[4096];
	if (!a->meta_name || snprintf(key, sizeof(key), "%s%s%s", a->prefix, *a->prefix ? "/" : "",
				      a->meta_name) >= (int)sizeof(key))
		return;
	struct ckpt_zarr_unit_id now;
	if (ckpt_zarr_key_identity(a->store, key, &now) < 0)
		return; /* reads report the store's trouble */
	pthread_mutex_lock(&a->mu);
	int same = same_id(&a->meta_id, &now);
	pthread_mutex_unlock(&a->mu);
	if (same)
		return;
	char *json = NULL;
	size_t len = 0;
	int rc = now.absent ? -ENOENT : ckpt_store_read_all(a->store, key, 1 << 20, &json, &len);
	int kept = rc == 0 && len == a->meta_len && ckpt_crc32c(0, json, len) == a->meta_crc;
	free(json);
	if (rc < 0 && rc != -ENOENT && rc != -EFBIG)
		return; /* cannot tell now: the next open tries again */
	pthread_mutex_lock(&a->mu);
	if (kept) {
		a->meta_id = now;
	} else if (arr_set(a, ARR_STALE)) {
		ckpt_log(CKPT_LOG_ERR, "%s/%s: %s under the mount; reads of the array fail with ESTALE",
			 a->store->root, key, rc == -ENOENT ? "metadata removed" : "metadata changed");
		forget_all(a);
	}
	pthread_mutex_unlock(&a->mu);
}

unsigned ckpt_array_open_check(ckpt_array *a, int *budget)
{
	unsigned ep = atomic_fetch_add(&a->epoch, 1) + 1;
	if (*budget > 0 && !arr_stale(a)) {
		(*budget)--;
		check_meta(a);
	}
	if (*budget <= 0 || arr_stale(a))
		return atomic_load(&a->changes);
	/* The next recorded units, round-robin over the record table. */
	uint64_t su[OPEN_CHECK_MAX];
	struct ckpt_zarr_unit_id was[OPEN_CHECK_MAX];
	int max = *budget < OPEN_CHECK_MAX ? *budget : OPEN_CHECK_MAX, n = 0;
	pthread_mutex_lock(&a->mu);
	uint64_t owner = atomic_load(&a->owner);
	size_t cap = a->nrecs_cap, i = cap ? a->rr & (cap - 1) : 0;
	for (size_t seen = 0; seen < cap && n < max; seen++, i = (i + 1) & (cap - 1))
		if (a->recs[i].su1) {
			su[n] = a->recs[i].su1 - 1;
			was[n++] = a->recs[i].id;
		}
	a->rr = i;
	pthread_mutex_unlock(&a->mu);
	*budget -= n;
	int changed = -1, k;
	struct ckpt_zarr_unit_id now[OPEN_CHECK_MAX];
	for (k = 0; k < n && changed < 0; k++) {
		char key[4096];
		uint64_t sg[CKPT_MAX_RANK];
		storage_of_linear(&a->meta, su[k], sg);
		if (ckpt_zarr_unit_key(&a->meta, a->prefix, sg, key, sizeof(key)) < 0 ||
		    ckpt_zarr_key_identity(a->store, key, &now[k]) < 0) {
			now[k] = was[k]; /* not known now: its next use checks it */
			continue;
		}
		if (!same_id(&was[k], &now[k]))
			changed = k;
	}
	pthread_mutex_lock(&a->mu);
	if (atomic_load(&a->owner) == owner) {
		if (changed >= 0) {
			ckpt_log(CKPT_LOG_INFO,
				 "%s/%s: stored data changed under the mount; cached chunks dropped",
				 a->store->root, a->prefix);
			forget_all(a);
		} else {
			/* checked in this epoch: their next use needs no stat */
			for (int j = 0; j < k; j++) {
				struct unit_rec *r = rec_find(a, su[j]);
				if (r && same_id(&r->id, &now[j]))
					r->epoch = ep;
			}
		}
	}
	pthread_mutex_unlock(&a->mu);
	return atomic_load(&a->changes);
}

/* Before serving a cached chunk of unit g: the first use in this epoch
 * checks the stored unit's identity; a change drops the array's cached
 * chunks (the caller then misses and decodes afresh). */
static void check_unit(ckpt_array *a, const uint64_t *g)
{
	uint64_t su = storage_linear(&a->meta, g);
	unsigned ep = atomic_load(&a->epoch);
	pthread_mutex_lock(&a->mu);
	struct unit_rec *r = rec_find(a, su);
	int need = r && r->epoch != ep;
	pthread_mutex_unlock(&a->mu);
	if (!need)
		return;
	struct ckpt_zarr_unit_id now;
	if (ckpt_zarr_unit_identity(a->store, a->prefix, &a->meta, g, &now) < 0)
		return; /* the decode, if any, reports the store's error */
	pthread_mutex_lock(&a->mu);
	r = rec_find(a, su);
	if (r && same_id(&r->id, &now)) {
		r->epoch = ep;
	} else if (r) {
		ckpt_log(CKPT_LOG_INFO, "%s/%s: stored data changed under the mount; cached chunks dropped",
			 a->store->root, a->prefix);
		forget_all(a);
	}
	pthread_mutex_unlock(&a->mu);
}

/* ---- missing chunks ---------------------------------------------------- */

/* 1 the first time decode unit li is reported missing (then log it). */
static int first_missing(ckpt_array *a, uint64_t li)
{
	int first = 1;
	pthread_mutex_lock(&a->mu);
	for (size_t i = 0; i < a->nlogged; i++)
		if (a->logged[i] == li + 1) {
			first = 0;
			break;
		}
	if (first) {
		if (a->nlogged == a->logged_cap && a->logged_cap < MAX_LOGGED) {
			size_t nc = a->logged_cap ? a->logged_cap * 2 : 16;
			uint64_t *nl = realloc(a->logged, nc * sizeof(*nl));
			if (nl) {
				a->logged = nl;
				a->logged_cap = nc;
			}
		}
		if (a->nlogged < a->logged_cap) {
			a->logged[a->nlogged++] = li + 1;
		} else {
			first = !a->logged_full ? 2 : 0;
			a->logged_full = 1;
		}
	}
	pthread_mutex_unlock(&a->mu);
	return first;
}

static void log_missing(ckpt_array *a, const uint64_t *g, uint64_t li)
{
	int first = first_missing(a, li);
	if (!first)
		return;
	if (first == 2) {
		ckpt_log(CKPT_LOG_ERR, "%s/%s: more missing chunks; not logged one by one", a->store->root,
			 a->prefix);
		return;
	}
	const ckpt_array_meta *m = &a->meta;
	char coords[CKPT_MAX_RANK * 22 + 3], key[4096];
	size_t n = 0;
	coords[n++] = '(';
	for (int d = 0; d < m->rank; d++)
		n += (size_t)snprintf(coords + n, sizeof(coords) - n, "%s%llu", d ? ", " : "",
				      (unsigned long long)g[d]);
	snprintf(coords + n, sizeof(coords) - n, ")");
	uint64_t sg[CKPT_MAX_RANK];
	uint64_t inner = ckpt_zarr_storage_index(m, g, sg);
	if (ckpt_zarr_unit_key(m, a->prefix, sg, key, sizeof(key)) < 0)
		snprintf(key, sizeof(key), "?");
	char where[64] = "";
	if (m->sharded)
		snprintf(where, sizeof(where), " (inner chunk %llu of the shard)", (unsigned long long)inner);
	ckpt_log(CKPT_LOG_ERR,
		 "%s: array %s: chunk %s is missing: key %s%s; every chunk of this array is stored "
		 "(store_array_data_equal_to_fill_value), so reads of it fail with EIO",
		 a->store->root, a->prefix, coords, key, where);
}

/* ---- chunk access ------------------------------------------------------ */

struct fill_arg {
	ckpt_array *a;
	const uint64_t *g;
	uint64_t owner; /* the cache owner the chunk is loaded under */
};

static uint64_t linear_index(const ckpt_array_meta *m, const uint64_t *g)
{
	uint64_t li = 0;
	for (int d = 0; d < m->rank; d++)
		li = li * m->grid[d] + g[d];
	return li;
}

/* A stored ZIP member: record the CRC-32 of decode unit li's stored
 * bytes; once every unit's is known, check the member's CRC-32.  -EIO when
 * it does not match (now or before): the bytes differ from what the
 * archive says it holds. */
static int zip_note(ckpt_array *a, uint64_t li, uint32_t crc)
{
	const ckpt_array_meta *m = &a->meta;
	int rc = 0;
	pthread_mutex_lock(&a->mu);
	if (!a->zknown[li]) {
		a->zknown[li] = 1;
		a->zn++;
	}
	a->zcrc[li] = crc;
	if (a->zn == a->zunits && !a->zchecked) {
		uLong c = m->zip_head_crc32;
		for (uint64_t i = 0; i < a->zunits; i++)
			c = crc32_combine(c, a->zcrc[i], (z_off_t)m->unit_bytes);
		a->zchecked = 1;
		if ((uint32_t)c != m->zip_crc32) {
			atomic_store(&a->zbad, 1);
			ckpt_log(CKPT_LOG_ERR,
				 "%s/%s: CRC-32 mismatch of the ZIP member (%08x, stored %08x): reads fail "
				 "with EIO",
				 a->store->root, a->prefix, (unsigned)c, (unsigned)m->zip_crc32);
		}
	}
	if (atomic_load(&a->zbad))
		rc = -EIO;
	pthread_mutex_unlock(&a->mu);
	return rc;
}

/* Decode unit g was just read as version id, in epoch ep, by a read that
 * began under cache owner `owner`: check it against the unit's record
 * (unit_check_locked: a different version drops the array's chunks, and is
 * -ESTALE when this epoch served the old one) and record it.  0 or
 * -ESTALE. */
static int record_unit(ckpt_array *a, const uint64_t *g, const struct ckpt_zarr_unit_id *id, unsigned ep,
		       uint64_t owner)
{
	uint64_t su = storage_linear(&a->meta, g);
	pthread_mutex_lock(&a->mu);
	int changed = unit_check_locked(a, su, id, ep); /* 1: not the unit other cached chunks came from */
	if (changed >= 0 && (changed || atomic_load(&a->owner) == owner))
		rec_put(a, su, id, ep);
	pthread_mutex_unlock(&a->mu);
	return changed < 0 ? -ESTALE : 0;
}

static int fill_chunk(void *arg, void *dst)
{
	struct fill_arg *f = arg;
	ckpt_array *a = f->a;
	if (atomic_load(&a->state) == ARR_RETIRED)
		return -ESTALE; /* a read that began before the retirement: not cached */
	ckpt_zarr_scratch *sc = scratch_get(a->ctx);
	if (!sc)
		return -ENOMEM;
	struct ckpt_zarr_unit_id id;
	unsigned ep = atomic_load(&a->epoch);
	id.absent = -1; /* not known */
	int rc = ckpt_zarr_read_unit_id(a->store, a->prefix, &a->meta, f->g, dst, sc, &id);
	uint32_t ucrc = ckpt_zarr_scratch_unit_crc(sc);
	scratch_put(a->ctx, sc);
	if (rc == 0 && a->zunits && zip_note(a, linear_index(&a->meta, f->g), ucrc) < 0)
		return -EIO;
	if (rc == -ENODATA) {
		log_missing(a, f->g, linear_index(&a->meta, f->g));
		return -EIO;
	}
	if (rc < 0 || id.absent < 0)
		return rc;
	return record_unit(a, f->g, &id, ep, f->owner);
}

static int get_chunk(ckpt_array *a, const uint64_t *g, ckpt_centry **e)
{
	check_unit(a, g);
	struct fill_arg f = { a, g, atomic_load(&a->owner) };
	return ckpt_cache_get(a->ctx->cache, f.owner, linear_index(&a->meta, g), (size_t)a->meta.unit_bytes,
			      fill_chunk, &f, e);
}

struct prefetch_task {
	ckpt_array *a;
	ckpt_centry *e; /* the reservation this task fills */
	uint64_t owner; /* ... made under this cache owner */
	uint64_t g[CKPT_MAX_RANK];
};

/* A prefetch task of a ended: a may be freed as soon as its count drops,
 * so nothing of it is touched after that. */
static void prefetch_done(ckpt_ctx *ctx, ckpt_array *a)
{
	int last_a = atomic_fetch_sub(&a->inflight, 1) == 1;
	int last = atomic_fetch_sub(&ctx->inflight, 1) == 1;
	if (last_a || last) {
		pthread_mutex_lock(&ctx->drain_lock);
		pthread_cond_broadcast(&ctx->drained);
		pthread_mutex_unlock(&ctx->drain_lock);
	}
}

static void prefetch_run(void *arg)
{
	struct prefetch_task *t = arg;
	ckpt_array *a = t->a;
	struct fill_arg f = { a, t->g, t->owner };
	ckpt_ctx *ctx = a->ctx;
	ckpt_cache_fill_reserved(ctx->cache, t->e, fill_chunk, &f);
	free(t);
	prefetch_done(ctx, a);
}

static ckpt_pool *ctx_pool(ckpt_ctx *ctx)
{
	ckpt_pool *p = atomic_load(&ctx->pool);
	if (p && !ckpt_pool_forked(p))
		return p;
	pthread_mutex_lock(&ctx->pool_lock);
	p = atomic_load(&ctx->pool);
	if (p && ckpt_pool_forked(p)) {
		/* Its threads stayed in the parent.  An earlier parent's pool
		 * was replaced before this process began: nobody holds it. */
		ckpt_pool_destroy(ctx->parent_pool);
		ctx->parent_pool = p;
		p = NULL;
	}
	if (!p) {
		if (ckpt_pool_create(ctx->threads, 256, &p) != 0)
			p = NULL;
		atomic_store(&ctx->pool, p);
	}
	pthread_mutex_unlock(&ctx->pool_lock);
	return p;
}

ckpt_pool *ckpt_ctx_pool(ckpt_ctx *ctx)
{
	return ctx_pool(ctx);
}

void ckpt_ctx_quiesce(ckpt_ctx *ctx)
{
	ckpt_pool *p = atomic_load(&ctx->pool);
	if (p && !ckpt_pool_forked(p))
		ckpt_pool_quiesce(p);
}

/* Queue the decode of chunk g unless it is cached, being loaded or already
 * queued (the cache reservation makes each chunk queued once). */
static void prefetch(ckpt_array *a, const uint64_t *g)
{
	const ckpt_array_meta *m = &a->meta;
	if (a->streamed)
		return;
	ckpt_pool *pool = ctx_pool(a->ctx);
	struct prefetch_task *t = pool ? malloc(sizeof(*t)) : NULL;
	if (!t)
		return;
	t->owner = atomic_load(&a->owner);
	if (ckpt_cache_reserve(a->ctx->cache, t->owner, linear_index(m, g), (size_t)m->unit_bytes, &t->e) !=
	    1) {
		free(t);
		return;
	}
	t->a = a;
	memcpy(t->g, g, sizeof(uint64_t) * (size_t)m->rank);
	atomic_fetch_add(&a->inflight, 1);
	atomic_fetch_add(&a->ctx->inflight, 1);
	if (ckpt_pool_try_submit(pool, prefetch_run, t) < 0) {
		ckpt_cache_cancel(a->ctx->cache, t->e);
		free(t);
		prefetch_done(a->ctx, a);
	}
}

/* Chunk-grid box [lo, hi] (inclusive) covering region box b. */
static void grid_box(const ckpt_array_meta *m, const ckpt_region *b, uint64_t *lo, uint64_t *hi)
{
	for (int d = 0; d < m->rank; d++) {
		lo[d] = b->start[d] / m->inner_shape[d];
		hi[d] = (b->stop[d] - 1) / m->inner_shape[d];
	}
}

static int next_index(int rank, const uint64_t *lo, const uint64_t *hi, uint64_t *g)
{
	for (int d = rank - 1; d >= 0; d--) {
		if (++g[d] <= hi[d])
			return 1;
		g[d] = lo[d];
	}
	return 0;
}

/* r is the whole array, in C order: a reader of it that has read past a
 * chunk's last element (chunk_stream_end) is done with that chunk. */
static int whole_region(const ckpt_array_meta *m, const ckpt_region *r)
{
	if (m->rank == 0 || m->order_f)
		return 0;
	for (int d = 0; d < m->rank; d++)
		if (r->start[d] != 0 || r->stop[d] != m->shape[d])
			return 0;
	return 1;
}

static uint64_t chunk_stream_end(const ckpt_array_meta *m, const uint64_t *g);

/* A streamed unit (never cached): the cursor of (owner, unit) continues
 * where the last read stopped, so the unit's identity is checked around
 * every use.  Before: a unit that changed since its record was made drops
 * the array's cursors and chunks (a new owner), and fails with -ESTALE when
 * this epoch already served bytes of the old version; after: a change
 * during the copy (bytes of two versions) is -ESTALE. */
static int stream_copy(ckpt_array *a, const uint64_t *g, const ckpt_region *r, uint64_t e0, uint64_t e1,
		       uint8_t *dst)
{
	const ckpt_array_meta *m = &a->meta;
	uint64_t su = storage_linear(m, g);
	unsigned ep = atomic_load(&a->epoch);
	struct ckpt_zarr_unit_id before, after;
	int rc = ckpt_zarr_unit_identity(a->store, a->prefix, m, g, &before);
	if (rc < 0)
		return rc;
	if (before.absent)
		return -ENOTSUP; /* the whole-unit path answers missing units */
	pthread_mutex_lock(&a->mu);
	if (unit_check_locked(a, su, &before, ep) < 0) {
		pthread_mutex_unlock(&a->mu);
		return -ESTALE;
	}
	uint64_t owner = atomic_load(&a->owner);
	pthread_mutex_unlock(&a->mu);
	rc = ckpt_stream_copy(a->ctx->streams, (const void *)(uintptr_t)owner, a->store, a->prefix, m, g, r,
			      e0, e1, dst);
	if (rc < 0)
		return rc;
	rc = ckpt_zarr_unit_identity(a->store, a->prefix, m, g, &after);
	pthread_mutex_lock(&a->mu);
	if (rc < 0 || !same_id(&before, &after)) {
		if (rc == 0)
			ckpt_log(CKPT_LOG_INFO,
				 "%s/%s: stored data changed during a read; it fails with ESTALE",
				 a->store->root, a->prefix);
		forget_all(a); /* the cursor holds bytes of either version */
		if (rc == 0)
			mark_torn(a, ep);
		pthread_mutex_unlock(&a->mu);
		return rc < 0 ? rc : -ESTALE;
	}
	if (atomic_load(&a->owner) == owner)
		rec_put(a, su, &before, ep);
	pthread_mutex_unlock(&a->mu);
	return 0;
}

/* Element-aligned core: stream positions [e0, e1) of r into dst. */
static int read_elems(ckpt_array *a, const ckpt_region *r, uint64_t e0, uint64_t e1, uint8_t *dst)
{
	const ckpt_array_meta *m = &a->meta;
	ckpt_region bbox;
	ckpt_region_stream_bbox(r, e0, e1, &bbox);
	uint64_t lo[CKPT_MAX_RANK], hi[CKPT_MAX_RANK], g[CKPT_MAX_RANK], origin[CKPT_MAX_RANK];
	grid_box(m, &bbox, lo, hi);

	/* Several chunks: let the pool decode the others while we do the first. */
	int whole = whole_region(m, r);
	uint64_t nchunks = 1;
	for (int d = 0; d < m->rank; d++)
		nchunks *= hi[d] - lo[d] + 1;
	memcpy(g, lo, sizeof(uint64_t) * (size_t)m->rank);
	if (nchunks > 1) {
		int more = next_index(m->rank, lo, hi, g);
		while (more) {
			prefetch(a, g);
			more = next_index(m->rank, lo, hi, g);
		}
		memcpy(g, lo, sizeof(uint64_t) * (size_t)m->rank);
	}
	do {
		if (a->streamed) {
			int rc = stream_copy(a, g, r, e0, e1, dst);
			if (rc == 0)
				continue;
			if (rc != -ENOTSUP)
				return rc;
		}
		ckpt_centry *e;
		int rc = get_chunk(a, g, &e);
		if (rc < 0)
			return rc;
		for (int d = 0; d < m->rank; d++)
			origin[d] = g[d] * m->inner_shape[d];
		ckpt_copy_chunk_to_stream(r, e0, e1, dst, ckpt_centry_data(e), origin, m->inner_shape,
					  m->itemsize);
		ckpt_cache_release_used(a->ctx->cache, e,
					whole && e1 * m->itemsize >= chunk_stream_end(m, g));
	} while (next_index(m->rank, lo, hi, g));
	return 0;
}

/* Whether a's chunks can be handed out pinned from the cache (visit,
 * map): 0, -ENOTSUP (rank 0, Fortran-order chunks, units streamed instead
 * of cached), or a's read error (-ESTALE, -EIO). */
static int pinned_access(ckpt_array *a)
{
	if (a->meta.rank == 0 || a->meta.order_f || a->streamed)
		return -ENOTSUP;
	if (arr_stale(a) || torn_now(a))
		return -ESTALE;
	if (atomic_load(&a->zbad))
		return -EIO;
	return 0;
}

/* 1 when box is a non-empty region inside the array. */
static int box_inside(const ckpt_array_meta *m, const ckpt_region *box)
{
	for (int d = 0; d < m->rank; d++)
		if (box->start[d] >= box->stop[d] || box->stop[d] > m->shape[d])
			return 0;
	return 1;
}

int ckpt_array_visit(ckpt_array *a, const ckpt_region *box, ckpt_chunk_fn fn, void *arg)
{
	const ckpt_array_meta *m = &a->meta;
	int st = pinned_access(a);
	if (st < 0)
		return st;
	if (!box_inside(m, box))
		return -EINVAL;
	uint64_t lo[CKPT_MAX_RANK], hi[CKPT_MAX_RANK], g[CKPT_MAX_RANK];
	ckpt_region chunk;
	chunk.rank = m->rank;
	grid_box(m, box, lo, hi);
	/* Several chunks: let the pool decode the others while we do the first. */
	memcpy(g, lo, sizeof(uint64_t) * (size_t)m->rank);
	while (next_index(m->rank, lo, hi, g))
		prefetch(a, g);
	memcpy(g, lo, sizeof(uint64_t) * (size_t)m->rank);
	int rc;
	do {
		ckpt_centry *e;
		if ((rc = get_chunk(a, g, &e)) < 0)
			return rc;
		for (int d = 0; d < m->rank; d++) {
			chunk.start[d] = g[d] * m->inner_shape[d];
			chunk.stop[d] = chunk.start[d] + m->inner_shape[d];
		}
		rc = fn(arg, ckpt_centry_data(e), &chunk);
		ckpt_cache_release(a->ctx->cache, e);
	} while (rc == 0 && next_index(m->rank, lo, hi, g));
	return rc;
}

uint64_t ckpt_array_window(const ckpt_array *a)
{
	/* At least one chunk per decode thread ahead, so a sequential reader
	 * finds the next chunks decoded (or being decoded) when it gets there. */
	uint64_t bytes = a->ctx->prefetch_bytes;
	uint64_t per_chunks = a->meta.unit_bytes * (uint64_t)(a->ctx->threads + 1);
	if (per_chunks > bytes)
		bytes = per_chunks;
	/* Chunks that do not span the trailing dimensions (an array split by
	 * columns) are all needed at once by the stream bytes of one band of
	 * chunks along dim 0: the next band (or the next file) must be on its
	 * way a band ahead, or the decode threads idle while the reader copies.
	 * At most a quarter of the cache, so two bands fit with room to spare. */
	const ckpt_array_meta *m = &a->meta;
	uint64_t band = m->nbytes;
	if (m->rank > 0 && m->shape[0] > 0)
		band = m->nbytes / m->shape[0] *
		       (m->inner_shape[0] < m->shape[0] ? m->inner_shape[0] : m->shape[0]);
	uint64_t cap = ckpt_cache_budget(a->ctx->cache) / 4;
	if (band > cap)
		band = cap;
	return bytes > band ? bytes : band;
}

/* Read-ahead: decode the chunks behind the next window of the stream. */
static void read_ahead(ckpt_array *a, const ckpt_region *r, uint64_t e1, uint64_t count)
{
	const ckpt_array_meta *m = &a->meta;
	if (e1 >= count)
		return;
	uint64_t w = ckpt_array_window(a) / m->itemsize;
	if (w < 1)
		w = 1;
	uint64_t end = e1 + w < count ? e1 + w : count;
	ckpt_region bbox;
	ckpt_region_stream_bbox(r, e1, end, &bbox);
	uint64_t lo[CKPT_MAX_RANK], hi[CKPT_MAX_RANK], g[CKPT_MAX_RANK];
	grid_box(m, &bbox, lo, hi);
	memcpy(g, lo, sizeof(uint64_t) * (size_t)m->rank);
	int budget = 64; /* bound the work queued by one read */
	do {
		prefetch(a, g);
	} while (--budget > 0 && next_index(m->rank, lo, hi, g));
}

static int direct_read(ckpt_array *a, uint64_t off, size_t len, uint8_t *dst);

ssize_t ckpt_array_read(ckpt_array *a, const ckpt_region *r, uint64_t off, size_t len, void *dst)
{
	const ckpt_array_meta *m = &a->meta;
	uint64_t count;
	if (ckpt_region_count(r, &count) < 0)
		return -EOVERFLOW;
	uint64_t total = count * m->itemsize;
	if (arr_stale(a) || torn_now(a))
		return -ESTALE;
	if (atomic_load(&a->zbad))
		return -EIO;
	if (off >= total || len == 0)
		return 0;
	if (len > total - off)
		len = (size_t)(total - off);
	if (a->direct && whole_region(m, r)) {
		int rc = direct_read(a, off, len, dst);
		if (rc < 0 && rc != -ENOTSUP)
			return rc;
		if (rc == 0) {
			CKPT_STAT_ADD(bytes_served, len);
			return (ssize_t)len;
		}
	}
	uint64_t e0 = off / m->itemsize, e1 = (off + len + m->itemsize - 1) / m->itemsize;
	int rc;
	if (off % m->itemsize == 0 && len % m->itemsize == 0) {
		rc = read_elems(a, r, e0, e1, dst);
	} else {
		/* Unaligned range: decode whole elements into a reused per-thread buffer. */
		uint8_t *tmp = ckpt_tls_buf(CKPT_TLS_BOUNCE, (size_t)((e1 - e0) * m->itemsize));
		if (!tmp)
			return -ENOMEM;
		rc = read_elems(a, r, e0, e1, tmp);
		if (rc == 0)
			memcpy(dst, tmp + (off - e0 * m->itemsize), len);
	}
	if (rc < 0)
		return rc;
	read_ahead(a, r, e1, count);
	CKPT_STAT_ADD(bytes_served, len);
	return (ssize_t)len;
}

/* The whole-array layout ckpt_array_map serves: d0 is the last dimension
 * a chunk does not span whole (-1: one chunk holds the array), so within
 * a chunk, the elements of dims d0.. for fixed coordinates of dims < d0
 * are one contiguous run ("segment"); seg = its length in the stream
 * (inner_shape[d0] * the extents of the dims after d0, in bytes). */
static int map_layout(const ckpt_array_meta *m, int *d0, uint64_t *seg)
{
	int d = m->rank - 1;
	uint64_t rest = m->itemsize;
	while (d >= 0 && m->inner_shape[d] == m->shape[d]) {
		rest *= m->shape[d];
		d--;
	}
	*d0 = d;
	*seg = d >= 0 ? rest * m->inner_shape[d] : rest;
	return 0;
}

/* Stream byte just past the last element of chunk g (whole-array region,
 * C order): a sequential reader that has read up to there is done with g. */
static uint64_t chunk_stream_end(const ckpt_array_meta *m, const uint64_t *g)
{
	uint64_t li = 0;
	for (int d = 0; d < m->rank; d++) {
		uint64_t last = (g[d] + 1) * m->inner_shape[d];
		if (last > m->shape[d])
			last = m->shape[d];
		li = li * m->shape[d] + (last - 1);
	}
	return (li + 1) * m->itemsize;
}

/* The piece of the whole-array stream that starts at byte p (< end), in
 * map_layout's terms (row: the stream bytes of one position of dims < d0):
 * its decode unit (g), where it starts in the unit (*uoff), and its length
 * (to the end of its segment, or end). */
static uint64_t map_piece(const ckpt_array_meta *m, int d0, uint64_t seg, uint64_t row, uint64_t p,
			  uint64_t end, uint64_t *g, uint64_t *uoff)
{
	uint64_t rowi = p / row, in = p % row;
	uint64_t j = in / seg, s0 = in % seg, slen = seg - s0;
	if (j * seg + seg > row)
		slen = row - j * seg - s0; /* the clipped last segment of the row */
	if (slen > end - p)
		slen = end - p;
	/* chunk coordinates: dims < d0 from the row index, d0 = j, the rest 0 */
	uint64_t local = 0, rem = rowi, mul = 1;
	memset(g, 0, sizeof(uint64_t) * CKPT_MAX_RANK);
	for (int d = d0 - 1; d >= 0; d--) {
		uint64_t c = rem % m->shape[d];
		rem /= m->shape[d];
		g[d] = c / m->inner_shape[d];
		local += (c % m->inner_shape[d]) * mul;
		mul *= m->inner_shape[d];
	}
	if (d0 >= 0)
		g[d0] = j;
	*uoff = local * seg + s0;
	return slen;
}

/* At most this many distinct chunks behind one mapped read (pinned at once). */
#define MAP_MAX_CHUNKS 64

/* The slot of decode unit g among the *nch distinct units of a read
 * (linear indices cli, coordinates cg), added when new; -1 when the read
 * already has MAP_MAX_CHUNKS. */
static int chunk_slot(const ckpt_array_meta *m, const uint64_t *g, uint64_t *cli,
		      uint64_t (*cg)[CKPT_MAX_RANK], int *nch)
{
	uint64_t li = linear_index(m, g);
	int c;
	for (c = *nch - 1; c >= 0 && cli[c] != li; c--)
		;
	if (c < 0) {
		if (*nch == MAP_MAX_CHUNKS)
			return -1;
		c = (*nch)++;
		cli[c] = li;
		memcpy(cg[c], g, sizeof(uint64_t) * CKPT_MAX_RANK);
	}
	return c;
}

/* The pieces of stream bytes [p, end) of the whole array, in order, each
 * with its decode unit's slot among the distinct units met so far (linear
 * indices cli, coordinates cg; at most MAP_MAX_CHUNKS).  map_piece's
 * divisions run once per row: the next pieces of a row are the next
 * segments, and a row whose units are those of the row before (the same
 * coordinates below d0) takes their slots (jslot) without a search. */
struct piece_walk {
	const ckpt_array_meta *m;
	int d0, nch;
	uint64_t seg, row, p, end;
	uint64_t rowend; /* stream byte where the current row ends (0: before the first) */
	uint64_t ubase; /* where the current row starts in its units */
	uint64_t g[CKPT_MAX_RANK]; /* the current piece's unit */
	int jslot[MAP_MAX_CHUNKS]; /* the slot of segment j of this row's units, or -1 */
	uint64_t cli[MAP_MAX_CHUNKS], cg[MAP_MAX_CHUNKS][CKPT_MAX_RANK];
};

static void walk_start(struct piece_walk *w, const ckpt_array_meta *m, uint64_t p, uint64_t end)
{
	w->m = m;
	map_layout(m, &w->d0, &w->seg);
	w->row = w->d0 >= 0 ? w->seg / m->inner_shape[w->d0] * m->shape[w->d0] : m->nbytes;
	w->p = p;
	w->end = end;
	w->rowend = 0;
	w->nch = 0;
}

/* The next piece: its length (0 past the end), where it starts in its
 * unit (*uoff) and its unit's slot (*c; -1 when the read has more than
 * MAP_MAX_CHUNKS units). */
static uint64_t walk_next(struct piece_walk *w, uint64_t *uoff, int *c)
{
	const ckpt_array_meta *m = w->m;
	uint64_t p = w->p, len;
	if (p >= w->end)
		return 0;
	if (p >= w->rowend) { /* a new row: its first piece from the divisions */
		uint64_t prev[CKPT_MAX_RANK];
		int first = w->rowend == 0, d0 = w->d0 > 0 ? w->d0 : 0;
		memcpy(prev, w->g, sizeof(uint64_t) * (size_t)d0);
		len = map_piece(m, w->d0, w->seg, w->row, p, w->end, w->g, uoff);
		w->rowend = (p / w->row + 1) * w->row;
		w->ubase = *uoff - p % w->row % w->seg;
		if (first || memcmp(prev, w->g, sizeof(uint64_t) * (size_t)d0) != 0)
			for (int j = 0; j < MAP_MAX_CHUNKS; j++)
				w->jslot[j] = -1;
	} else { /* the row's next segment (so d0 >= 0: a row of one segment ended above) */
		w->g[w->d0]++;
		*uoff = w->ubase;
		len = w->seg;
		if (len > w->rowend - p)
			len = w->rowend - p;
		if (len > w->end - p)
			len = w->end - p;
	}
	uint64_t j = w->d0 >= 0 ? w->g[w->d0] : 0;
	if (j < MAP_MAX_CHUNKS && w->jslot[j] >= 0) {
		*c = w->jslot[j];
	} else {
		*c = chunk_slot(m, w->g, w->cli, w->cg, &w->nch);
		if (j < MAP_MAX_CHUNKS)
			w->jslot[j] = *c;
	}
	w->p = p + len;
	return len;
}

/* ---- direct reads ------------------------------------------------------ */

/* Pieces one direct read takes at most; more go through the cache. */
#define DIRECT_MAX_PIECES 4096

struct dpiece {
	uint64_t uoff; /* where it starts in its unit */
	uint8_t *dst;
	size_t len;
	int c; /* its unit's slot */
};

/* The pieces of one unit that a direct read could not take from the store
 * (missing, or not the size its shape implies): copied from the unit
 * decoded into the cache, whose fill says what is wrong. */
static int direct_fallback(ckpt_array *a, const uint64_t *g, const struct dpiece *const *ps, int k)
{
	ckpt_centry *e;
	int rc = get_chunk(a, g, &e);
	if (rc < 0)
		return rc;
	const uint8_t *data = ckpt_centry_data(e);
	for (int i = 0; i < k; i++)
		memcpy(ps[i]->dst, data + ps[i]->uoff, ps[i]->len);
	ckpt_cache_release(a->ctx->cache, e);
	return 0;
}

/* Done with unit descriptor fd (kept in slot, or -1: fd is the caller's);
 * drop: a unit changed or failed, so every kept one is opened again. */
static void unit_fd_done(ckpt_array *a, int slot, int fd, int drop)
{
	if (slot >= 0)
		ckpt_kept_release(a->kept, slot);
	else
		close(fd);
	if (drop && a->kept)
		ckpt_kept_drop(a->kept);
}

/* The pieces ps[0..k) of unit g (ascending offsets in the unit), each
 * stretch of adjacent ones in one readv, all through one descriptor of the
 * unit: kept from an earlier read of this epoch, or opened now (and kept
 * when there is room, see kept.h), its identity taken (fstat) before and
 * after.  A unit not the size its shape implies, or missing, goes through
 * the cache (direct_fallback), whose fill says what is wrong; one that
 * changed while read is -ESTALE, and so is the rest of the epoch. */
static int direct_unit(ckpt_array *a, const uint64_t *g, const struct dpiece *const *ps, int k,
		       struct iovec *iov)
{
	const ckpt_array_meta *m = &a->meta;
	unsigned ep = atomic_load(&a->epoch);
	uint64_t owner = atomic_load(&a->owner);
	uint64_t su = storage_linear(m, g);
	struct ckpt_store_stat st = { 0 };
	int fd = -1;
	int slot = a->kept ? ckpt_kept_take(a->kept, su, ep, &fd) : -1;
	if (slot >= 0 && ckpt_store_fd_stat(fd, &st) < 0) {
		ckpt_kept_release(a->kept, slot);
		return -EIO;
	}
	if (slot < 0) {
		char key[4096];
		uint64_t sg[CKPT_MAX_RANK];
		ckpt_zarr_storage_index(m, g, sg);
		if (ckpt_zarr_unit_key(m, a->prefix, sg, key, sizeof(key)) < 0)
			return -ENAMETOOLONG;
		fd = ckpt_store_open_fd(a->store, key, &st);
		if (fd == -ENOENT)
			return direct_fallback(a, g, ps, k);
		if (fd < 0)
			return fd;
		slot = a->kept ? ckpt_kept_add(a->kept, su, ep, fd) : -1;
	}
	if (st.size != m->unit_bytes) { /* rewritten in place, or never its size */
		unit_fd_done(a, slot, fd, 1);
		return direct_fallback(a, g, ps, k);
	}
	int rc = 0;
	for (int i = 0; i < k && rc == 0;) {
		int j = i, n = 0;
		size_t want = 0;
		do {
			iov[n].iov_base = ps[j]->dst;
			iov[n].iov_len = ps[j]->len;
			want += ps[j]->len;
			n++;
			j++;
		} while (j < k && ps[j]->uoff == ps[j - 1]->uoff + ps[j - 1]->len);
		ssize_t got = ckpt_store_fd_readv(fd, ps[i]->uoff, iov, n);
		if (got < 0) {
			ckpt_log(CKPT_LOG_ERR, "%s/%s: unit %llu: read failed: %s", a->store->root, a->prefix,
				 (unsigned long long)su, strerror((int)-got));
			rc = -EIO;
		} else if ((size_t)got != want) {
			rc = i == 0 ? 1 : -ESTALE; /* shorter than when it was opened */
		}
		i = j;
	}
	struct ckpt_store_stat after;
	if (rc == 0 && ckpt_store_fd_stat(fd, &after) == 0 &&
	    (after.size != st.size || after.mtime_ns != st.mtime_ns)) {
		/* written while these bytes were read: none of them is served */
		pthread_mutex_lock(&a->mu);
		forget_all(a);
		mark_torn(a, ep);
		pthread_mutex_unlock(&a->mu);
		rc = -ESTALE;
	}
	unit_fd_done(a, slot, fd, rc != 0);
	if (rc == 1)
		return direct_fallback(a, g, ps, k);
	if (rc < 0)
		return rc;
	struct ckpt_zarr_unit_id id = { 0, st.size, st.mtime_ns };
	rc = record_unit(a, g, &id, ep, owner);
	if (rc < 0 && a->kept)
		ckpt_kept_drop(a->kept);
	return rc;
}

/* Bytes [off, off + len) of the whole array straight from the stored units
 * into dst (a->direct: raw units in a store that reads as cheaply as it
 * copies), one readv per unit and stretch: the daemon copies each byte once
 * (from the store's page cache into the reply), fills no cache entry, and
 * reads nothing ahead (the kernel's read-ahead asks for the next bytes).
 * 0, the error, or -ENOTSUP when the read has too many pieces (the caller
 * goes through the cache). */
static int direct_read(ckpt_array *a, uint64_t off, size_t len, uint8_t *dst)
{
	const ckpt_array_meta *m = &a->meta;
	uint64_t end = off + len;
	struct piece_walk w;
	walk_start(&w, m, off, end);
	if (w.seg && len / w.seg + 2 > DIRECT_MAX_PIECES)
		return -ENOTSUP;
	size_t per = sizeof(struct dpiece) + sizeof(struct dpiece *) + sizeof(struct iovec);
	uint8_t *mem = ckpt_tls_buf(CKPT_TLS_PIECES, DIRECT_MAX_PIECES * per);
	if (!mem)
		return -ENOMEM;
	struct dpiece *pc = (struct dpiece *)mem;
	const struct dpiece **order = (const struct dpiece **)(pc + DIRECT_MAX_PIECES);
	struct iovec *iov = (struct iovec *)(order + DIRECT_MAX_PIECES);
	int count[MAP_MAX_CHUNKS + 1] = { 0 };
	int n = 0, slot;
	uint64_t uoff;
	for (uint64_t p = off, l; (l = walk_next(&w, &uoff, &slot)) > 0; n++, p += l) {
		if (slot < 0 || n == DIRECT_MAX_PIECES)
			return -ENOTSUP;
		pc[n] = (struct dpiece){ uoff, dst + (p - off), (size_t)l, slot };
		count[slot + 1]++;
	}
	int nch = w.nch;
	/* The pieces by unit, each unit's in stream order (ascending offsets). */
	for (int c = 0; c < nch; c++)
		count[c + 1] += count[c];
	int at[MAP_MAX_CHUNKS];
	memcpy(at, count, sizeof(int) * (size_t)nch);
	for (int i = 0; i < n; i++)
		order[at[pc[i].c]++] = &pc[i];
	for (int c = 0; c < nch; c++) {
		int rc = direct_unit(a, w.cg[c], order + count[c], count[c + 1] - count[c], iov);
		if (rc < 0)
			return rc;
	}
	if (end >= m->nbytes && a->kept)
		ckpt_kept_drop(a->kept); /* read to its end: hold no file open */
	return 0;
}

int ckpt_array_map(ckpt_array *a, const ckpt_region *r, uint64_t off, size_t len, struct iovec *iov,
		   ckpt_pin **pins, int max)
{
	const ckpt_array_meta *m = &a->meta;
	int st = pinned_access(a);
	if (st < 0)
		return st;
	if (a->direct)
		return -ENOTSUP; /* ckpt_array_read copies straight from the store */
	for (int d = 0; d < m->rank; d++)
		if (r->start[d] != 0 || r->stop[d] != m->shape[d])
			return -ENOTSUP;
	uint64_t total = m->nbytes;
	if (off >= total || len == 0)
		return 0;
	if (len > total - off)
		len = (size_t)(total - off);
	uint64_t end = off + len;
	/* Pass 1: the pieces and their chunks (linear decode-unit index), or
	 * -ENOTSUP when they do not fit (the caller copies instead). */
	struct piece_walk w;
	walk_start(&w, m, off, end);
	int n = 0, slot;
	uint64_t uoff;
	for (uint64_t slen; (slen = walk_next(&w, &uoff, &slot)) > 0; n++) {
		if (slot < 0 || n == max)
			return -ENOTSUP;
		/* for now: the chunk slot and the offset inside the chunk */
		iov[n].iov_base = (void *)(uintptr_t)slot;
		iov[n].iov_len = (size_t)slen;
		pins[n] = (ckpt_pin *)(uintptr_t)uoff;
	}
	int nch = w.nch;
	uint64_t(*cg)[CKPT_MAX_RANK] = w.cg;
	/* Pass 2: queue the later chunks, take them all in order. */
	for (int c = nch - 1; c > 0; c--)
		prefetch(a, cg[c]);
	ckpt_pin *held[MAP_MAX_CHUNKS];
	for (int c = 0; c < nch; c++) {
		int rc = get_chunk(a, cg[c], &held[c]);
		if (rc < 0) {
			while (c > 0)
				ckpt_cache_release(a->ctx->cache, held[--c]);
			/* -EAGAIN: no room in the budget while this thread holds pins;
			 * the copying path takes one chunk at a time. */
			return rc == -EAGAIN ? -ENOTSUP : rc;
		}
		if (end >= chunk_stream_end(m, cg[c]))
			ckpt_cache_mark_used(a->ctx->cache, held[c]);
	}
	for (int i = 0; i < n; i++) {
		int c = (int)(uintptr_t)iov[i].iov_base;
		iov[i].iov_base = (uint8_t *)ckpt_centry_data(held[c]) + (uintptr_t)pins[i];
		pins[i] = NULL;
	}
	/* pins[0..n): the distinct chunks first, then NULLs (ckpt_ctx_unpin skips them) */
	memcpy(pins, held, sizeof(*held) * (size_t)nch);
	read_ahead(a, r, (end + m->itemsize - 1) / m->itemsize, total / m->itemsize);
	CKPT_STAT_ADD(bytes_served, len);
	return n;
}

void ckpt_ctx_unpin(ckpt_ctx *ctx, ckpt_pin *pin)
{
	if (pin)
		ckpt_cache_release(ctx->cache, pin);
}

void ckpt_array_prefetch(ckpt_array *a, const ckpt_region *r, uint64_t off, uint64_t len)
{
	uint64_t count;
	if (a->direct && whole_region(&a->meta, r))
		return; /* read straight from the store when asked for */
	if (ckpt_region_count(r, &count) < 0 || count == 0)
		return;
	uint64_t e0 = off / a->meta.itemsize;
	uint64_t e1 = (off + len + a->meta.itemsize - 1) / a->meta.itemsize;
	if (e1 > count)
		e1 = count;
	if (e0 >= e1)
		return;
	ckpt_region bbox;
	ckpt_region_stream_bbox(r, e0, e1, &bbox);
	uint64_t lo[CKPT_MAX_RANK], hi[CKPT_MAX_RANK], g[CKPT_MAX_RANK];
	grid_box(&a->meta, &bbox, lo, hi);
	memcpy(g, lo, sizeof(uint64_t) * (size_t)a->meta.rank);
	int budget = 64;
	do {
		prefetch(a, g);
	} while (--budget > 0 && next_index(a->meta.rank, lo, hi, g));
}

uint64_t ckpt_array_cache_budget(const ckpt_array *a)
{
	return ckpt_cache_budget(a->ctx->cache);
}

void ckpt_array_prefetch_box(ckpt_array *a, const ckpt_region *box, uint64_t max_bytes)
{
	const ckpt_array_meta *m = &a->meta;
	if (pinned_access(a) < 0 || m->unit_bytes == 0 || !box_inside(m, box))
		return;
	uint64_t lo[CKPT_MAX_RANK], hi[CKPT_MAX_RANK], g[CKPT_MAX_RANK];
	grid_box(m, box, lo, hi);
	memcpy(g, lo, sizeof(uint64_t) * (size_t)m->rank);
	uint64_t n = max_bytes / ckpt_cache_charge((size_t)m->unit_bytes);
	if (n > 64)
		n = 64; /* bound the work queued by one call */
	for (uint64_t i = 0; i < n; i++) {
		prefetch(a, g);
		if (!next_index(m->rank, lo, hi, g))
			break;
	}
}

void ckpt_array_cool(ckpt_array *a)
{
	ckpt_cache_cool_owner(a->ctx->cache, atomic_load(&a->owner));
}

uint64_t ckpt_array_cached_bytes(const ckpt_array *a)
{
	const ckpt_array_meta *m = &a->meta;
	uint64_t n = 1;
	for (int d = 0; d < m->rank; d++)
		n *= m->grid[d];
	return n * ckpt_cache_charge((size_t)m->unit_bytes);
}

int ckpt_array_stored_bytes(ckpt_array *a, uint64_t *out)
{
	if (atomic_load(&a->stored_known)) {
		*out = a->stored;
		return 0;
	}
	uint64_t v;
	int rc = ckpt_zarr_stored_bytes(a->store, a->prefix, &a->meta, &v);
	if (rc < 0)
		return rc;
	a->stored = v;
	atomic_store(&a->stored_known, 1);
	*out = v;
	return 0;
}
