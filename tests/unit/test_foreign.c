/*
 * test_foreign.c - the parsers of foreign checkpoint bytes (format/zip.h,
 * format/npz.h, format/msgpack.h) on hostile input, and the virtual-item
 * builder (foreign/foreign.h) read back through the zarr reader.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "array.h"
#include "check.h"
#include "common.h"
#include "foreign.h"
#include "msgpack.h"
#include "npz.h"
#include "slice.h"
#include "store.h"
#include "membuf.h"
#include "zip.h"

static int mp(const void *p, size_t n, struct ckpt_mp **out)
{
	struct ckpt_membuf b = { p, n };
	const char *why;
	return ckpt_mp_parse(ckpt_membuf_read, &b, n, out, &why);
}

static void test_msgpack(void)
{
	struct ckpt_mp *m;
	/* {"w": ext1([[2], "float32", bin 8 bytes])}: the bin's offset in the file */
	static const uint8_t doc[] = { 0x81, 0xa1, 'w', 0xc7, 0x15, 0x01, 0x93, 0x91, 0x02,
				       0xa7, 'f',  'l', 'o',  'a',  't',  '3',	'2',  0xc4,
				       0x08, 0,	   0,	0x80, 0x3f, 0,	  0,	0,    0x40 };
	CHECK_EQ_INT(mp(doc, sizeof(doc), &m), 0);
	const struct ckpt_mp *w = ckpt_mp_get(m, "w");
	CHECK(w && w->type == CKPT_MP_EXT && w->ext_type == 1 && w->n == 1);
	const struct ckpt_mp *d = &w->kids[0];
	CHECK(d->type == CKPT_MP_ARRAY && d->n == 3 && d->kids[2].type == CKPT_MP_BIN);
	CHECK_EQ_INT(d->kids[2].off, 19);
	CHECK_EQ_INT(d->kids[2].len, 8);
	CHECK(d->kids[1].str && strcmp(d->kids[1].str, "float32") == 0);
	ckpt_mp_free(m);
	/* hostile counts: refused before anything is allocated for them */
	static const uint8_t big_array[] = { 0xdd, 0xff, 0xff, 0xff, 0xff, 0x00 };
	CHECK_EQ_INT(mp(big_array, sizeof(big_array), &m), -EINVAL);
	static const uint8_t big_map[] = { 0xdf, 0x7f, 0xff, 0xff, 0xff, 0xa1, 'a', 0x01 };
	CHECK_EQ_INT(mp(big_map, sizeof(big_map), &m), -EINVAL);
	static const uint8_t big_bin[] = { 0xc6, 0xff, 0xff, 0xff, 0xf0, 0x00 };
	CHECK_EQ_INT(mp(big_bin, sizeof(big_bin), &m), -EINVAL);
	static const uint8_t empty_ext[] = { 0xc7, 0x00, 0x01 };
	CHECK_EQ_INT(mp(empty_ext, sizeof(empty_ext), &m), -EINVAL);
	/* an ext document that does not fill its payload exactly */
	static const uint8_t short_ext[] = { 0xc7, 0x02, 0x01, 0x90, 0x90 };
	CHECK_EQ_INT(mp(short_ext, sizeof(short_ext), &m), -EINVAL);
	static const uint8_t trailing[] = { 0x80, 0x00 };
	CHECK_EQ_INT(mp(trailing, sizeof(trailing), &m), -EINVAL);
	static const uint8_t never[] = { 0xc1 };
	CHECK_EQ_INT(mp(never, sizeof(never), &m), -EINVAL);
	/* nesting beyond the bound */
	uint8_t deep[200];
	memset(deep, 0x91, sizeof(deep));
	deep[sizeof(deep) - 1] = 0x90;
	CHECK_EQ_INT(mp(deep, sizeof(deep), &m), -EINVAL);
	/* sign extension of int 8..32, a uint 64 past INT64_MAX */
	static const uint8_t ints[] = { 0x93, 0xd0, 0xfe, 0xd2, 0xff, 0xff, 0xff, 0xfd, 0xcf,
					0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff };
	CHECK_EQ_INT(mp(ints, sizeof(ints), &m), 0);
	CHECK(m->kids[0].v.i == -2 && m->kids[1].v.i == -3 && m->kids[2].type == CKPT_MP_UINT);
	ckpt_mp_free(m);
	/* magic */
	CHECK(ckpt_mp_magic(doc, sizeof(doc)));
	static const uint8_t png[] = { 0x89, 'P', 'N', 'G', 0x0d, 0x0a };
	CHECK(!ckpt_mp_magic(png, sizeof(png)));
}

static void test_npz_header(void)
{
	struct ckpt_npz_header h;
	size_t need = 0;
	const char *why;
	char hdr[128];
	const char *dict = "{'descr': '>i4', 'fortran_order': True, 'shape': (2, 3), }";
	size_t dl = strlen(dict);
	memcpy(hdr, "\x93NUMPY\x01\x00", 8);
	hdr[8] = (char)(dl + 1);
	hdr[9] = 0;
	memcpy(hdr + 10, dict, dl);
	hdr[10 + dl] = '\n';
	size_t n = 11 + dl;
	CHECK_EQ_INT(ckpt_npz_header_parse((const uint8_t *)hdr, n, &h, &need, &why), 0);
	CHECK(h.dtype == CKPT_DT_INT32 && h.big_endian && h.fortran_order && h.rank == 2 && h.shape[1] == 3);
	CHECK_EQ_INT(h.data_offset, n);
	CHECK_EQ_INT(h.nbytes, 24);
	CHECK_EQ_INT(ckpt_npz_header_parse((const uint8_t *)hdr, n - 5, &h, &need, &why), -EAGAIN);
	CHECK_EQ_INT(need, n);
	/* '|V2' is bfloat16; an object dtype is refused */
	const char *d2 = "{'descr': '|V2', 'fortran_order': False, 'shape': ()}";
	dl = strlen(d2);
	hdr[8] = (char)dl;
	memcpy(hdr + 10, d2, dl);
	CHECK_EQ_INT(ckpt_npz_header_parse((const uint8_t *)hdr, 10 + dl, &h, &need, &why), 0);
	CHECK(h.dtype == CKPT_DT_BFLOAT16 && h.void2 && h.rank == 0);
	const char *d3 = "{'descr': '|O', 'fortran_order': False, 'shape': ()}";
	dl = strlen(d3);
	hdr[8] = (char)dl;
	memcpy(hdr + 10, d3, dl);
	CHECK_EQ_INT(ckpt_npz_header_parse((const uint8_t *)hdr, 10 + dl, &h, &need, &why), -ENOTSUP);
	/* key paths */
	char kb[64];
	const char *c[8];
	CHECK_EQ_INT(ckpt_npz_key_path("params/img/w.npy", kb, sizeof(kb), c, 8), 3);
	CHECK(strcmp(c[0], "params") == 0 && strcmp(c[2], "w") == 0);
	CHECK_EQ_INT(ckpt_npz_key_path("a//b.npy", kb, sizeof(kb), c, 8), -EINVAL);
	CHECK_EQ_INT(ckpt_npz_key_path("a/../b.npy", kb, sizeof(kb), c, 8), -EINVAL);
	CHECK_EQ_INT(ckpt_npz_key_path("/a.npy", kb, sizeof(kb), c, 8), -EINVAL);
}

static void put16(uint8_t *p, unsigned v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static void put32(uint8_t *p, uint32_t v)
{
	put16(p, v & 0xffff);
	put16(p + 2, v >> 16);
}

static void test_zip(void)
{
	/* one stored member "a.npy" of 3 bytes, then its central entry and the end record */
	uint8_t z[256] = { 0 };
	size_t o = 0;
	put32(z, 0x04034b50);
	put16(z + 8, 0);
	put32(z + 18, 3);
	put32(z + 22, 3);
	put16(z + 26, 5);
	memcpy(z + 30, "a.npy", 5);
	memcpy(z + 35, "xyz", 3);
	o = 38;
	size_t cd = o;
	put32(z + o, 0x02014b50);
	put32(z + o + 20, 3);
	put32(z + o + 24, 3);
	put16(z + o + 28, 5);
	put32(z + o + 42, 0);
	memcpy(z + o + 46, "a.npy", 5);
	o += 51;
	size_t eocd = o;
	put32(z + o, 0x06054b50);
	put16(z + o + 8, 1);
	put16(z + o + 10, 1);
	put32(z + o + 12, (uint32_t)(eocd - cd));
	put32(z + o + 16, (uint32_t)cd);
	o += 22;
	struct ckpt_membuf b = { z, o };
	struct ckpt_zip_dir d;
	const char *why;
	CHECK(ckpt_zip_magic(z, o));
	CHECK_EQ_INT(ckpt_zip_dir_read(ckpt_membuf_read, &b, o, &d, &why), 0);
	CHECK_EQ_INT(d.n, 1);
	CHECK(strcmp(d.e[0].name, "a.npy") == 0 && d.e[0].csize == 3 && d.e[0].method == 0);
	uint64_t off;
	CHECK_EQ_INT(ckpt_zip_data_offset(ckpt_membuf_read, &b, &d, &d.e[0], &off, &why), 0);
	CHECK_EQ_INT(off, 35);
	ckpt_zip_dir_free(&d);
	/* a count the directory cannot hold */
	put16(z + eocd + 8, 0xfff0);
	put16(z + eocd + 10, 0xfff0);
	CHECK_EQ_INT(ckpt_zip_dir_read(ckpt_membuf_read, &b, o, &d, &why), -EINVAL);
	ckpt_zip_dir_free(&d);
	put16(z + eocd + 8, 1);
	put16(z + eocd + 10, 1);
	/* a member whose size runs past the data */
	put32(z + cd + 20, 1000);
	CHECK_EQ_INT(ckpt_zip_dir_read(ckpt_membuf_read, &b, o, &d, &why), -EINVAL);
	ckpt_zip_dir_free(&d);
	put32(z + cd + 20, 3);
	/* a saturated offset without its ZIP64 extra field */
	put32(z + cd + 42, 0xffffffffu);
	CHECK_EQ_INT(ckpt_zip_dir_read(ckpt_membuf_read, &b, o, &d, &why), -EINVAL);
	ckpt_zip_dir_free(&d);
	put32(z + cd + 42, 0);
	/* a local header naming another member */
	z[31] = 'X';
	CHECK_EQ_INT(ckpt_zip_dir_read(ckpt_membuf_read, &b, o, &d, &why), 0);
	CHECK_EQ_INT(ckpt_zip_data_offset(ckpt_membuf_read, &b, &d, &d.e[0], &off, &why), -EINVAL);
	ckpt_zip_dir_free(&d);
	/* no end record */
	CHECK_EQ_INT(ckpt_zip_dir_read(ckpt_membuf_read, &b, o - 1, &d, &why), -EINVAL);
	ckpt_zip_dir_free(&d);
}

/* A virtual item: an F-order big-endian array as a range, read back. */
static void test_vitem(void)
{
	ckpt_store *base, *item;
	CHECK_EQ_INT(ckpt_store_mem_open("mem:file", &base), 0);
	/* int16 [2,3] = [[1,2,3],[4,5,6]] in Fortran order, big endian, after 5 junk bytes */
	static const uint8_t file[] = { 9, 9, 9, 9, 9, 0, 1, 0, 4, 0, 2, 0, 5, 0, 3, 0, 6 };
	CHECK_EQ_INT(ckpt_store_mem_put(base, "f", file, sizeof(file)), 0);
	struct ckpt_vitem *vi;
	CHECK_EQ_INT(ckpt_vitem_new("virt", &vi), 0);
	const char *path[] = { "p", "w" };
	struct ckpt_varray a = { .dtype = CKPT_DT_INT16,
				 .rank = 2,
				 .shape = { 2, 3 },
				 .fortran_order = 1,
				 .big_endian = 1,
				 .base = base,
				 .base_key = "f",
				 .offset = 5,
				 .length = 12 };
	CHECK_EQ_INT(ckpt_vitem_add_array(vi, path, 2, &a), 0);
	a.length = 11;
	CHECK_EQ_INT(ckpt_vitem_add_array(vi, path, 2, &a), -EINVAL); /* not what the shape needs */
	CHECK_EQ_INT(ckpt_vitem_leaves(vi), 1);
	CHECK_EQ_INT(ckpt_vitem_finish(vi, &item), 0);
	ckpt_store_destroy(base);
	ckpt_ctx *ctx;
	CHECK_EQ_INT(ckpt_ctx_create(NULL, &ctx), 0);
	ckpt_array *arr;
	CHECK_EQ_INT(ckpt_array_open(ctx, item, "a/0000000000", 2, &arr), 0);
	int16_t got[6];
	ckpt_region r;
	uint64_t shape[2] = { 2, 3 };
	ckpt_region_full(&r, 2, shape);
	CHECK_EQ_INT(ckpt_array_read(arr, &r, 0, sizeof(got), got), (int)sizeof(got));
	for (int i = 0; i < 6; i++)
		CHECK_EQ_INT(got[i], i + 1);
	ckpt_array_destroy(arr);
	ckpt_ctx_destroy(ctx);
	char *meta;
	size_t ml;
	CHECK_EQ_INT(ckpt_store_read_small(item, "_METADATA", 1 << 20, &meta, &ml), 0);
	CHECK(strstr(meta, "\"key_metadata\"") && strstr(meta, "a/0000000000"));
	free(meta);
	ckpt_store_destroy(item);
}

/* A raw array past the chunk target is cut into whole-row chunks (each a
 * range of the file); pieces laid end to end are cut the same way. */
static void test_vitem_chunks(void)
{
	enum { ROWS = 5, COLS = 1 << 20 }; /* uint32: 4 MiB rows, 20 MiB in all */
	size_t nb = (size_t)ROWS * COLS * 4;
	uint32_t *file = malloc(nb + 7);
	CHECK(file != NULL);
	if (!file)
		return;
	for (size_t i = 0; i < (size_t)ROWS * COLS; i++)
		file[i] = (uint32_t)(i * 2654435761u);
	ckpt_store *base, *item;
	CHECK_EQ_INT(ckpt_store_mem_open("mem:big", &base), 0);
	CHECK_EQ_INT(ckpt_store_mem_put(base, "f", file, nb), 0);
	struct ckpt_vitem *vi;
	CHECK_EQ_INT(ckpt_vitem_new("virt", &vi), 0);
	const char *p1[] = { "whole" }, *p2[] = { "pieces" };
	struct ckpt_varray a = { .dtype = CKPT_DT_UINT32,
				 .rank = 2,
				 .shape = { ROWS, COLS },
				 .base = base,
				 .base_key = "f",
				 .length = nb };
	CHECK_EQ_INT(ckpt_vitem_add_array(vi, p1, 1, &a), 0);
	/* the same bytes as three pieces of odd sizes */
	uint64_t pieces[6] = { 0, 1000, 1000, nb / 2 - 1000, nb / 2, nb / 2 };
	a.pieces = pieces;
	a.npieces = 3;
	CHECK_EQ_INT(ckpt_vitem_add_array(vi, p2, 1, &a), 0);
	CHECK_EQ_INT(ckpt_vitem_finish(vi, &item), 0);
	ckpt_store_destroy(base);
	uint64_t size;
	CHECK_EQ_INT(ckpt_store_size(item, "a/0000000000/1.0", &size), 0); /* one row a chunk */
	CHECK_EQ_INT(size, (uint64_t)COLS * 4);
	ckpt_ctx *ctx;
	CHECK_EQ_INT(ckpt_ctx_create(NULL, &ctx), 0);
	const char *keys[] = { "a/0000000000", "a/0000000001" };
	for (int k = 0; k < 2; k++) {
		ckpt_array *arr;
		CHECK_EQ_INT(ckpt_array_open(ctx, item, keys[k], 2, &arr), 0);
		ckpt_region r;
		uint64_t shape[2] = { ROWS, COLS };
		ckpt_region_full(&r, 2, shape);
		/* a window across the boundary of rows 1 and 2 */
		uint32_t got[64];
		uint64_t at = (uint64_t)2 * COLS * 4 - 128;
		CHECK_EQ_INT(ckpt_array_read(arr, &r, at, sizeof(got), got), (int)sizeof(got));
		CHECK(memcmp(got, (const uint8_t *)file + at, sizeof(got)) == 0);
		ckpt_array_destroy(arr);
	}
	ckpt_ctx_destroy(ctx);
	ckpt_store_destroy(item);
	free(file);
}

/* Arrays put cell by cell: a 2x2 grid of [2,2] cells given as bytes, a
 * range and pieces (one cell left out: the fill value), and one block in a
 * permuted dimension order; read back through the zarr reader. */
static void test_vitem_grid(void)
{
	/* int16 [4,4] = 0..15 in C order; the file holds cell (0,1) as one range
	 * at 0 and cell (1,0)'s two rows apart, at 8 and 20 */
	static const int16_t file[] = { 2, 3, 6, 7, 99, 99, 8, 9, 99, 99, 99, 99, 12, 13 };
	/* int16 [2,3,4]: element (i,j,k) = 100*i + 10*j + k, stored in order
	 * {1,2,0}: as a C-order [3,4,2] array at (j,k,i), after the cells */
	int16_t perm[24];
	for (int i = 0; i < 2; i++)
		for (int j = 0; j < 3; j++)
			for (int k = 0; k < 4; k++)
				perm[(j * 4 + k) * 2 + i] = (int16_t)(100 * i + 10 * j + k);
	ckpt_store *base, *item;
	CHECK_EQ_INT(ckpt_store_mem_open("mem:cells", &base), 0);
	CHECK_EQ_INT(ckpt_store_mem_put(base, "f", file, sizeof(file)), 0);
	CHECK_EQ_INT(ckpt_store_mem_put(base, "p", perm, sizeof(perm)), 0);
	struct ckpt_vitem *vi;
	CHECK_EQ_INT(ckpt_vitem_new("virt", &vi), 0);
	const int16_t c00[] = { 0, 1, 4, 5 };
	const uint64_t at00[2] = { 0, 0 }, at01[2] = { 0, 1 }, at10[2] = { 1, 0 };
	const uint64_t pieces[4] = { 12, 4, 24, 4 };
	CHECK_EQ_INT(ckpt_vitem_cell_bytes(vi, 2, at00, c00, sizeof(c00)), 0);
	CHECK_EQ_INT(ckpt_vitem_cell_range(vi, 2, at01, base, "f", 0, 8), 0);
	CHECK_EQ_INT(ckpt_vitem_cell_pieces(vi, 2, at10, base, "f", pieces, 2), 0);
	CHECK_EQ_INT(ckpt_vitem_cell_range(vi, CKPT_MAX_RANK + 1, at00, base, "f", 0, 8), -EINVAL);
	const char *pg[] = { "grid" }, *pp[] = { "permuted" };
	struct ckpt_vgrid g = { .dtype = CKPT_DT_INT16, .rank = 2, .shape = { 4, 4 }, .cell = { 2, 2 } };
	CHECK_EQ_INT(ckpt_vitem_add_grid(vi, pg, 1, &g), 0);
	const int bad[3] = { 0, 0, 1 }, order[3] = { 1, 2, 0 };
	struct ckpt_vgrid pgrid = {
		.dtype = CKPT_DT_INT16, .rank = 3, .shape = { 2, 3, 4 }, .cell = { 2, 3, 4 }
	};
	pgrid.order = bad;
	CHECK_EQ_INT(ckpt_vitem_add_grid(vi, pp, 1, &pgrid), -EINVAL); /* not a permutation */
	const uint64_t zero[3] = { 0, 0, 0 };
	CHECK_EQ_INT(ckpt_vitem_cell_range(vi, 3, zero, base, "p", 0, sizeof(perm)), 0);
	pgrid.order = order;
	CHECK_EQ_INT(ckpt_vitem_add_grid(vi, pp, 1, &pgrid), 0);
	CHECK_EQ_INT(ckpt_vitem_leaves(vi), 2);
	CHECK_EQ_INT(ckpt_vitem_finish(vi, &item), 0);
	ckpt_store_destroy(base);
	uint64_t size;
	CHECK_EQ_INT(ckpt_store_size(item, "a/0000000001/zarr.json", &size), 0); /* zarr v3: a transpose */
	ckpt_ctx *ctx;
	CHECK_EQ_INT(ckpt_ctx_create(NULL, &ctx), 0);
	ckpt_array *arr;
	ckpt_region r;
	CHECK_EQ_INT(ckpt_array_open(ctx, item, "a/0000000000", 2, &arr), 0);
	int16_t got[16];
	ckpt_region_full(&r, 2, g.shape);
	CHECK_EQ_INT(ckpt_array_read(arr, &r, 0, sizeof(got), got), (int)sizeof(got));
	for (int i = 0; i < 16; i++) /* cell (1,1), never put, is the fill value */
		CHECK_EQ_INT(got[i], i / 4 >= 2 && i % 4 >= 2 ? 0 : i);
	ckpt_array_destroy(arr);
	CHECK_EQ_INT(ckpt_array_open(ctx, item, "a/0000000001", 3, &arr), 0);
	int16_t pgot[24];
	ckpt_region_full(&r, 3, pgrid.shape);
	CHECK_EQ_INT(ckpt_array_read(arr, &r, 0, sizeof(pgot), pgot), (int)sizeof(pgot));
	for (int i = 0; i < 24; i++)
		CHECK_EQ_INT(pgot[i], 100 * (i / 12) + 10 * (i / 4 % 3) + i % 4);
	ckpt_array_destroy(arr);
	ckpt_ctx_destroy(ctx);
	ckpt_store_destroy(item);
}

int main(void)
{
	ckpt_log_set_level(CKPT_LOG_ERR);
	CHECK_RUN(test_msgpack);
	CHECK_RUN(test_npz_header);
	CHECK_RUN(test_zip);
	CHECK_RUN(test_vitem);
	CHECK_RUN(test_vitem_chunks);
	CHECK_RUN(test_vitem_grid);
	return CHECK_DONE();
}
