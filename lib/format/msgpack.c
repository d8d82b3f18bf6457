/*
 * msgpack.c - MessagePack structure reader (see msgpack.h).  A buffered
 * cursor over the read callback: headers and short strings come through a
 * 64 KiB window, bin payloads (and ext payloads of unknown types) are
 * skipped by moving the cursor.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "msgpack.h"

#define WIN (64u << 10)

struct cur {
	ckpt_mp_read_fn rd;
	void *ctx;
	uint64_t pos, end; /* next byte, end of the current document */
	uint8_t buf[WIN];
	uint64_t boff; /* file offset of buf[0] */
	size_t blen;
	size_t nodes;
	const char *why;
	int err;
};

static int bad(struct cur *c, const char *why)
{
	if (!c->err) {
		c->err = -EINVAL;
		c->why = why;
	}
	return c->err;
}

/* k (<= WIN) bytes at the cursor into dst, advancing it. */
static int take(struct cur *c, void *dst, size_t k)
{
	if (c->err)
		return c->err;
	if (k > c->end - c->pos)
		return bad(c, "a value runs past the end of its document");
	if (c->pos < c->boff || c->pos + k > c->boff + c->blen) {
		uint64_t left = c->end - c->pos;
		size_t want = left < WIN ? (size_t)left : WIN;
		size_t got = 0;
		while (got < want) {
			ssize_t n = c->rd(c->ctx, c->pos + got, want - got, c->buf + got);
			if (n < 0)
				return c->err = (int)n;
			if (n == 0)
				break;
			got += (size_t)n;
		}
		c->boff = c->pos;
		c->blen = got;
		if (got < k)
			return bad(c, "the file ends early");
	}
	memcpy(dst, c->buf + (c->pos - c->boff), k);
	c->pos += k;
	return 0;
}

static uint64_t be(const uint8_t *p, int n)
{
	uint64_t v = 0;
	for (int i = 0; i < n; i++)
		v = v << 8 | p[i];
	return v;
}

static int take_be(struct cur *c, int n, uint64_t *v)
{
	uint8_t b[8];
	int rc = take(c, b, (size_t)n);
	if (rc == 0)
		*v = be(b, n);
	return rc;
}

static int skip(struct cur *c, uint64_t n)
{
	if (c->err)
		return c->err;
	if (n > c->end - c->pos)
		return bad(c, "a value runs past the end of its document");
	c->pos += n;
	return 0;
}

static void free_kids(struct ckpt_mp *m)
{
	size_t k = m->type == CKPT_MP_MAP ? 2 * (size_t)m->n : m->n;
	if (m->kids)
		for (size_t i = 0; i < k; i++)
			free_kids(&m->kids[i]);
	free(m->kids);
	free(m->str);
	m->kids = NULL;
	m->str = NULL;
}

void ckpt_mp_free(struct ckpt_mp *m)
{
	if (!m)
		return;
	free_kids(m);
	free(m);
}

static int value(struct cur *c, struct ckpt_mp *m, int depth);

static int container(struct cur *c, struct ckpt_mp *m, uint64_t n, int map, int depth)
{
	m->type = map ? CKPT_MP_MAP : CKPT_MP_ARRAY;
	uint64_t items = map ? 2 * n : n;
	/* every value takes at least one byte */
	if (n > UINT32_MAX || items > c->end - c->pos)
		return bad(c, "a count larger than the bytes left");
	if (c->nodes + items > CKPT_MP_MAX_NODES)
		return bad(c, "too many values");
	if (depth >= CKPT_MP_MAX_DEPTH)
		return bad(c, "nested too deeply");
	c->nodes += (size_t)items;
	m->n = (uint32_t)n;
	if (!items)
		return 0;
	m->kids = calloc((size_t)items, sizeof(*m->kids));
	if (!m->kids)
		return c->err = -ENOMEM;
	for (uint64_t i = 0; i < items; i++)
		if (value(c, &m->kids[i], depth + 1) < 0)
			return c->err;
	return 0;
}

static int ext(struct cur *c, struct ckpt_mp *m, uint64_t len, int depth)
{
	uint8_t t;
	if (take(c, &t, 1) < 0)
		return c->err;
	m->type = CKPT_MP_EXT;
	m->ext_type = (int8_t)t;
	m->off = c->pos;
	m->len = len;
	if (len > c->end - c->pos)
		return bad(c, "a value runs past the end of its document");
	if (t < CKPT_MP_EXT_NDARRAY || t > CKPT_MP_EXT_TUPLE)
		return skip(c, len);
	/* a nested document filling the payload exactly */
	if (depth >= CKPT_MP_MAX_DEPTH)
		return bad(c, "nested too deeply");
	if (len == 0)
		return bad(c, "an empty ext payload");
	uint64_t outer = c->end;
	c->end = c->pos + len;
	m->kids = calloc(1, sizeof(*m->kids));
	if (!m->kids)
		return c->err = -ENOMEM;
	m->n = 1;
	c->nodes++;
	if (value(c, &m->kids[0], depth + 1) < 0)
		return c->err;
	if (c->pos != c->end)
		return bad(c, "trailing bytes inside an ext payload");
	c->end = outer;
	return 0;
}

static int str(struct cur *c, struct ckpt_mp *m, uint64_t len)
{
	m->type = CKPT_MP_STR;
	m->off = c->pos;
	m->len = len;
	if (len > c->end - c->pos)
		return bad(c, "a value runs past the end of its document");
	if (len > CKPT_MP_MAX_STR)
		return skip(c, len);
	char *s = malloc((size_t)len + 1);
	if (!s)
		return c->err = -ENOMEM;
	size_t got = 0;
	while (got < len) {
		size_t k = len - got < WIN ? (size_t)(len - got) : WIN;
		if (take(c, s + got, k) < 0) {
			free(s);
			return c->err;
		}
		got += k;
	}
	s[len] = 0;
	if (memchr(s, 0, (size_t)len))
		free(s); /* not a C string: only its offset */
	else
		m->str = s;
	return 0;
}

static int value(struct cur *c, struct ckpt_mp *m, int depth)
{
	uint8_t b;
	uint64_t v = 0;
	if (take(c, &b, 1) < 0)
		return c->err;
	if (b <= 0x7f) {
		m->type = CKPT_MP_INT;
		m->v.i = b;
		return 0;
	}
	if (b >= 0xe0) {
		m->type = CKPT_MP_INT;
		m->v.i = (int8_t)b;
		return 0;
	}
	if (b <= 0x8f)
		return container(c, m, b & 0x0f, 1, depth);
	if (b <= 0x9f)
		return container(c, m, b & 0x0f, 0, depth);
	if (b <= 0xbf)
		return str(c, m, b & 0x1f);
	switch (b) {
	case 0xc0:
		m->type = CKPT_MP_NIL;
		return 0;
	case 0xc2:
	case 0xc3:
		m->type = CKPT_MP_BOOL;
		m->v.b = b == 0xc3;
		return 0;
	case 0xc4:
	case 0xc5:
	case 0xc6:
		if (take_be(c, 1 << (b - 0xc4), &v) < 0)
			return c->err;
		m->type = CKPT_MP_BIN;
		m->off = c->pos;
		m->len = v;
		return skip(c, v);
	case 0xc7:
	case 0xc8:
	case 0xc9:
		if (take_be(c, 1 << (b - 0xc7), &v) < 0)
			return c->err;
		return ext(c, m, v, depth);
	case 0xca: {
		if (take_be(c, 4, &v) < 0)
			return c->err;
		uint32_t u = (uint32_t)v;
		float f;
		memcpy(&f, &u, 4);
		m->type = CKPT_MP_FLOAT;
		m->f32 = 1;
		m->v.f = f;
		return 0;
	}
	case 0xcb:
		if (take_be(c, 8, &v) < 0)
			return c->err;
		m->type = CKPT_MP_FLOAT;
		memcpy(&m->v.f, &v, 8);
		return 0;
	case 0xcc:
	case 0xcd:
	case 0xce:
	case 0xcf:
		if (take_be(c, 1 << (b - 0xcc), &v) < 0)
			return c->err;
		if (v > INT64_MAX) {
			m->type = CKPT_MP_UINT;
			m->v.u = v;
		} else {
			m->type = CKPT_MP_INT;
			m->v.i = (int64_t)v;
		}
		return 0;
	case 0xd0:
	case 0xd1:
	case 0xd2:
	case 0xd3: {
		int n = 1 << (b - 0xd0);
		if (take_be(c, n, &v) < 0)
			return c->err;
		/* sign-extend */
		if (n < 8 && (v >> (8 * n - 1)) & 1)
			v |= ~UINT64_C(0) << (8 * n);
		m->type = CKPT_MP_INT;
		memcpy(&m->v.i, &v, 8);
		return 0;
	}
	case 0xd4:
	case 0xd5:
	case 0xd6:
	case 0xd7:
	case 0xd8:
		return ext(c, m, (uint64_t)1 << (b - 0xd4), depth);
	case 0xd9:
	case 0xda:
	case 0xdb:
		if (take_be(c, 1 << (b - 0xd9), &v) < 0)
			return c->err;
		return str(c, m, v);
	case 0xdc:
	case 0xdd:
		if (take_be(c, b == 0xdc ? 2 : 4, &v) < 0)
			return c->err;
		return container(c, m, v, 0, depth);
	case 0xde:
	case 0xdf:
		if (take_be(c, b == 0xde ? 2 : 4, &v) < 0)
			return c->err;
		return container(c, m, v, 1, depth);
	default: /* 0xc1 */
		return bad(c, "a byte that is no MessagePack type");
	}
}

int ckpt_mp_parse(ckpt_mp_read_fn rd, void *ctx, uint64_t size, struct ckpt_mp **out, const char **why)
{
	*out = NULL;
	struct cur *c = calloc(1, sizeof(*c));
	struct ckpt_mp *m = calloc(1, sizeof(*m));
	if (!c || !m) {
		free(c);
		free(m);
		return -ENOMEM;
	}
	c->rd = rd;
	c->ctx = ctx;
	c->end = size;
	c->nodes = 1;
	int rc = value(c, m, 0);
	if (rc == 0 && c->pos != size)
		rc = bad(c, "trailing bytes after the document");
	if (rc == 0)
		rc = c->err;
	if (why)
		*why = c->why ? c->why : "?";
	free(c);
	if (rc < 0) {
		ckpt_mp_free(m);
		return rc;
	}
	*out = m;
	return 0;
}

int ckpt_mp_magic(const uint8_t *head, size_t n)
{
	if (n == 1 && head[0] == 0x80)
		return 1;
	if (n < 2)
		return 0;
	size_t p;
	uint64_t cnt;
	if (head[0] >= 0x81 && head[0] <= 0x8f) {
		cnt = head[0] & 0x0f;
		p = 1;
	} else if (head[0] == 0xde && n >= 3) {
		cnt = be(head + 1, 2);
		p = 3;
	} else if (head[0] == 0xdf && n >= 5) {
		cnt = be(head + 1, 4);
		p = 5;
	} else {
		return 0;
	}
	if (cnt == 0 || p >= n)
		return 0;
	uint64_t kl;
	if (head[p] >= 0xa1 && head[p] <= 0xbf) {
		kl = head[p] & 0x1f;
		p++;
	} else if (head[p] == 0xd9 && p + 1 < n) {
		kl = head[p + 1];
		p += 2;
	} else {
		return 0;
	}
	if (kl == 0 || p + kl >= n)
		return 0;
	for (size_t i = 0; i < kl; i++)
		if (head[p + i] < 0x20 || head[p + i] == 0x7f)
			return 0;
	return head[p + kl] != 0xc1; /* the first value starts with a type byte */
}

const struct ckpt_mp *ckpt_mp_get(const struct ckpt_mp *m, const char *key)
{
	if (!m || m->type != CKPT_MP_MAP)
		return NULL;
	for (uint32_t i = 0; i < m->n; i++) {
		const struct ckpt_mp *k = &m->kids[2 * i];
		if (k->type == CKPT_MP_STR && k->str && strcmp(k->str, key) == 0)
			return &m->kids[2 * i + 1];
	}
	return NULL;
}
