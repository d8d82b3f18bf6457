/*
 * pickle.c - the restricted pickle machine of pickle.h.
 *
 * A stack machine over the opcodes of protocols 0-5 that build data: ints,
 * floats, strings, bytes, tuples, lists, dicts, sets, the memo, MARK, and the
 * object opcodes GLOBAL / STACK_GLOBAL, REDUCE, NEWOBJ(_EX), BUILD and
 * BINPERSID, which only ever build records (nothing is called: a global is
 * checked against the list below and kept as its name).  Opcodes that would
 * call code by other means (INST, OBJ), look up the extension registry
 * (EXT1/2/4), take a text persistent id (PERSID) or out-of-band buffers
 * (NEXT_BUFFER, READONLY_BUFFER) are refused, as is every unknown opcode.
 *
 * Every object is allocated on one list owned by the ckpt_pickle and freed
 * with it; objects shared through the memo are simply referenced twice.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "pickle.h"

struct ckpt_pickle {
	ckpt_pk *root;
	ckpt_pk *allocs; /* every object, through next_alloc */
};

/* ---- the list of globals ------------------------------------------------ */

static const char *const k_exact[] = {
	"collections.OrderedDict",
	"_codecs.encode",
	"torch._utils._rebuild_tensor",
	"torch._utils._rebuild_tensor_v2",
	"torch._utils._rebuild_tensor_v3",
	"torch._utils._rebuild_parameter",
	"torch._utils._rebuild_parameter_with_state",
	"torch.storage.UntypedStorage",
	"torch.storage.TypedStorage",
	"torch.storage._LegacyStorage",
	"torch.Size",
	"torch.serialization._get_layout",
	"torch.strided",
	"torch.contiguous_format",
	"torch.channels_last",
	"torch.channels_last_3d",
	"torch.preserve_format",
	"torch.memory_format",
	"torch.distributed.checkpoint.filesystem._StorageInfo",
	"torch.distributed.checkpoint.metadata._StorageInfo",
	NULL,
};

/* Names defined in both modules of the distributed-checkpoint metadata. */
static const char *const k_dcp_mods[] = {
	"torch.distributed.checkpoint.metadata",
	"torch.distributed._shard.sharded_tensor.metadata",
	"torch.distributed._shard.metadata",
	NULL,
};
static const char *const k_dcp_names[] = {
	"Metadata",
	"TensorStorageMetadata",
	"BytesStorageMetadata",
	"ChunkStorageMetadata",
	"TensorProperties",
	"MetadataIndex",
	"StorageMeta",
	"_MEM_FORMAT_ENCODING",
	"MEM_FORMAT_ENCODING",
	"ShardMetadata",
	NULL,
};

static const char *const k_torch_dtypes[] = {
	"float32",	  "float64",	 "float16",	    "bfloat16",
	"int8",		  "uint8",	 "int16",	    "uint16",
	"int32",	  "uint32",	 "int64",	    "uint64",
	"bool",		  "complex32",	 "complex64",	    "complex128",
	"float8_e4m3fn",  "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
	"float8_e8m0fnu", NULL,
};

static const char *const k_pathlib[] = {
	"Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath", "PureWindowsPath", NULL,
};

static int in_list(const char *const *l, const char *s)
{
	for (; *l; l++)
		if (strcmp(*l, s) == 0)
			return 1;
	return 0;
}

int ckpt_pickle_ident_ok(const char *s)
{
	if (!*s)
		return 0;
	for (; *s; s++)
		if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
		      *s == '_'))
			return 0;
	return 1;
}

int ckpt_pickle_global_ok(const char *module, const char *name)
{
	if (!module || !name || !ckpt_pickle_ident_ok(name) || strlen(module) + strlen(name) > 200)
		return 0;
	char full[512];
	snprintf(full, sizeof(full), "%s.%s", module, name);
	if (in_list(k_exact, full))
		return 1;
	if (in_list(k_dcp_mods, module) && in_list(k_dcp_names, name))
		return 1;
	if ((strcmp(module, "pathlib") == 0 || strcmp(module, "pathlib._local") == 0) &&
	    in_list(k_pathlib, name))
		return 1;
	if (strcmp(module, "torch") == 0) {
		if (in_list(k_torch_dtypes, name))
			return 1;
		size_t n = strlen(name);
		/* torch.FloatStorage, torch.BFloat16Storage, torch.Float8_e4m3fnStorage, ... */
		if (n > 7 && strcmp(name + n - 7, "Storage") == 0)
			return 1;
	}
	return 0;
}

/* ---- machine ------------------------------------------------------------- */

struct pm {
	const uint8_t *start, *p, *end;
	const char *what;
	struct ckpt_pickle *out;
	ckpt_pk **stack;
	size_t sn, scap;
	size_t *marks;
	size_t mn, mcap;
	ckpt_pk **memo;
	size_t memo_cap, memo_count;
};

static ckpt_pk *pk_new(struct pm *m, enum ckpt_pk_kind kind)
{
	ckpt_pk *o = calloc(1, sizeof(*o));
	if (!o)
		return NULL;
	o->kind = kind;
	o->next_alloc = m->out->allocs;
	m->out->allocs = o;
	return o;
}

static int bad(struct pm *m, const char *why)
{
	ckpt_log(CKPT_LOG_ERR, "%s: pickle: %s at byte %zu", m->what, why, (size_t)(m->p - m->start));
	return -EINVAL;
}

static int push(struct pm *m, ckpt_pk *o)
{
	if (!o)
		return -ENOMEM;
	if (m->sn == m->scap) {
		if (m->scap >= CKPT_PK_MAX_STACK)
			return bad(m, "stack too deep");
		size_t nc = m->scap ? m->scap * 2 : 64;
		ckpt_pk **ns = realloc(m->stack, nc * sizeof(*ns));
		if (!ns)
			return -ENOMEM;
		m->stack = ns;
		m->scap = nc;
	}
	m->stack[m->sn++] = o;
	return 0;
}

/* The bottom of the current frame: values above the last MARK. */
static size_t frame_base(const struct pm *m)
{
	return m->mn ? m->marks[m->mn - 1] : 0;
}

static ckpt_pk *pop(struct pm *m)
{
	if (m->sn <= frame_base(m))
		return NULL;
	return m->stack[--m->sn];
}

static ckpt_pk *top(struct pm *m)
{
	if (m->sn <= frame_base(m))
		return NULL;
	return m->stack[m->sn - 1];
}

/* Append `it` to container c (a list, tuple or dict being built). */
static int add_item(struct pm *m, ckpt_pk *c, ckpt_pk *it)
{
	if (c->n >= CKPT_PK_MAX_ITEMS * 2)
		return bad(m, "container too long");
	if (it->depth + 1 > CKPT_PK_MAX_DEPTH)
		return bad(m, "containers nested too deep");
	if (c->n == c->cap) {
		size_t nc = c->cap ? c->cap * 2 : 4;
		ckpt_pk **nv = realloc(c->v, nc * sizeof(*nv));
		if (!nv)
			return -ENOMEM;
		c->v = nv;
		c->cap = nc;
	}
	c->v[c->n++] = it;
	if (it->depth + 1 > c->depth)
		c->depth = it->depth + 1;
	return 0;
}

/* Pop the values above the last MARK, and the MARK. */
static int pop_mark(struct pm *m, size_t *from)
{
	if (!m->mn)
		return bad(m, "no MARK");
	*from = m->marks[--m->mn];
	return 0;
}

static int make_seq(struct pm *m, enum ckpt_pk_kind kind, size_t from)
{
	ckpt_pk *t = pk_new(m, kind);
	if (!t)
		return -ENOMEM;
	for (size_t i = from; i < m->sn; i++) {
		int rc = add_item(m, t, m->stack[i]);
		if (rc)
			return rc;
	}
	m->sn = from;
	return push(m, t);
}

static int extend(struct pm *m, ckpt_pk *c, size_t from, int pairs)
{
	if (!c)
		return bad(m, "nothing to add to");
	if (pairs && c->kind != CKPT_PK_DICT)
		return bad(m, "SETITEMS on a value that is not a dict");
	if (!pairs && c->kind != CKPT_PK_LIST)
		return bad(m, "APPENDS on a value that is not a list");
	if (pairs && (m->sn - from) % 2)
		return bad(m, "odd number of dict items");
	for (size_t i = from; i < m->sn; i++) {
		if (m->stack[i] == c)
			return bad(m, "container added to itself");
		int rc = add_item(m, c, m->stack[i]);
		if (rc)
			return rc;
	}
	m->sn = from;
	return 0;
}

static int need(struct pm *m, size_t n)
{
	return (size_t)(m->end - m->p) >= n ? 0 : bad(m, "truncated");
}

static uint64_t le(const uint8_t *p, int n)
{
	uint64_t v = 0;
	for (int i = n - 1; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static int push_int(struct pm *m, int64_t v)
{
	ckpt_pk *o = pk_new(m, CKPT_PK_INT);
	if (!o)
		return -ENOMEM;
	o->i = v;
	return push(m, o);
}

/* Little-endian two's complement of n bytes (LONG1 / LONG4); fits int64. */
static int push_long(struct pm *m, const uint8_t *p, size_t n)
{
	if (n == 0)
		return push_int(m, 0);
	uint8_t sign = (p[n - 1] & 0x80) ? 0xff : 0x00;
	if (n > 8) {
		for (size_t i = 8; i < n; i++)
			if (p[i] != sign)
				return bad(m, "integer larger than 64 bits");
		if ((p[7] & 0x80) != (sign & 0x80))
			return bad(m, "integer larger than 64 bits");
		n = 8;
	}
	uint64_t v = le(p, (int)n);
	if (n < 8 && sign)
		v |= ~(uint64_t)0 << (8 * n);
	return push_int(m, (int64_t)v);
}

static int push_bytes(struct pm *m, enum ckpt_pk_kind kind, const uint8_t *s, size_t n)
{
	ckpt_pk *o = pk_new(m, kind);
	if (!o)
		return -ENOMEM;
	char *c = malloc(n + 1);
	if (!c)
		return -ENOMEM;
	memcpy(c, s, n);
	c[n] = 0;
	o->s = c;
	o->len = n;
	return push(m, o);
}

static int push_global(struct pm *m, const char *mod, size_t ml, const char *name, size_t nl)
{
	char ms[256], ns[256];
	if (ml >= sizeof(ms) || nl >= sizeof(ns) || memchr(mod, 0, ml) || memchr(name, 0, nl))
		return bad(m, "malformed global name");
	memcpy(ms, mod, ml);
	ms[ml] = 0;
	memcpy(ns, name, nl);
	ns[nl] = 0;
	int is_getattr =
		(strcmp(ms, "builtins") == 0 || strcmp(ms, "__builtin__") == 0) && strcmp(ns, "getattr") == 0;
	if (is_getattr) /* only ever applied to an enum class (make_record) */
		snprintf(ms, sizeof(ms), "builtins");
	if (!is_getattr && !ckpt_pickle_global_ok(ms, ns)) {
		char shown[80];
		snprintf(shown, sizeof(shown), "%.38s.%.38s", ms, ns);
		for (char *c = shown; *c; c++)
			if ((unsigned char)*c < 0x20 || (unsigned char)*c >= 0x7f)
				*c = '?';
		ckpt_log(CKPT_LOG_ERR,
			 "%s: pickle: refused global %s (not a plain data type this reader knows)", m->what,
			 shown);
		return -EPERM;
	}
	ckpt_pk *o = pk_new(m, CKPT_PK_GLOBAL);
	if (!o)
		return -ENOMEM;
	ml = strlen(ms);
	size_t fl = ml + 1 + nl;
	char *full = malloc(fl + 1);
	if (!full)
		return -ENOMEM;
	snprintf(full, fl + 1, "%s.%s", ms, ns);
	o->s = full;
	o->len = fl;
	return push(m, o);
}

static size_t utf8_put(char *o, uint32_t c)
{
	if (c < 0x80) {
		o[0] = (char)c;
		return 1;
	}
	if (c < 0x800) {
		o[0] = (char)(0xc0 | c >> 6);
		o[1] = (char)(0x80 | (c & 0x3f));
		return 2;
	}
	if (c < 0x10000) {
		o[0] = (char)(0xe0 | c >> 12);
		o[1] = (char)(0x80 | (c >> 6 & 0x3f));
		o[2] = (char)(0x80 | (c & 0x3f));
		return 3;
	}
	o[0] = (char)(0xf0 | c >> 18);
	o[1] = (char)(0x80 | (c >> 12 & 0x3f));
	o[2] = (char)(0x80 | (c >> 6 & 0x3f));
	o[3] = (char)(0x80 | (c & 0x3f));
	return 4;
}

/* Protocol 0's UNICODE argument: bytes are Latin-1 code points, except the
 * escapes \uXXXX and \UXXXXXXXX; the result is UTF-8. */
static int push_unicode_text(struct pm *m, const char *s, size_t n)
{
	char *o = malloc(n * 4 + 1);
	if (!o)
		return -ENOMEM;
	size_t k = 0;
	for (size_t i = 0; i < n;) {
		uint32_t c = (uint8_t)s[i];
		size_t hex = 0;
		if (c == '\\' && i + 1 < n && (s[i + 1] == 'u' || s[i + 1] == 'U'))
			hex = s[i + 1] == 'u' ? 4 : 8;
		if (hex) {
			if (i + 2 + hex > n) {
				free(o);
				return bad(m, "bad escape in UNICODE");
			}
			c = 0;
			for (size_t j = 0; j < hex; j++) {
				char h = s[i + 2 + j];
				int d = h >= '0' && h <= '9'   ? h - '0'
					: h >= 'a' && h <= 'f' ? h - 'a' + 10
					: h >= 'A' && h <= 'F' ? h - 'A' + 10
							       : -1;
				if (d < 0 || c > 0x10ffff) {
					free(o);
					return bad(m, "bad escape in UNICODE");
				}
				c = c << 4 | (uint32_t)d;
			}
			if (c > 0x10ffff) {
				free(o);
				return bad(m, "bad escape in UNICODE");
			}
			i += 2 + hex;
		} else {
			i++;
		}
		k += utf8_put(o + k, c);
	}
	o[k] = 0;
	ckpt_pk *obj = pk_new(m, CKPT_PK_STR);
	if (!obj) {
		free(o);
		return -ENOMEM;
	}
	obj->s = o;
	obj->len = k;
	return push(m, obj);
}

/* A text line ending at '\n' (GLOBAL, INT, LONG, PUT, GET). */
static int line(struct pm *m, const char **s, size_t *n)
{
	const uint8_t *nl = memchr(m->p, '\n', (size_t)(m->end - m->p));
	if (!nl)
		return bad(m, "unterminated text argument");
	*s = (const char *)m->p;
	*n = (size_t)(nl - m->p);
	m->p = nl + 1;
	return 0;
}

static int text_int(struct pm *m, const char *s, size_t n, int64_t *v)
{
	if (n && s[n - 1] == 'L')
		n--;
	if (n == 0 || n > 20)
		return bad(m, "bad text integer");
	char buf[24];
	memcpy(buf, s, n);
	buf[n] = 0;
	char *e;
	errno = 0;
	long long x = strtoll(buf, &e, 10);
	if (*e || errno)
		return bad(m, "bad text integer");
	*v = x;
	return 0;
}

static int memo_put(struct pm *m, uint64_t idx)
{
	ckpt_pk *o = top(m);
	if (!o)
		return bad(m, "memo store of an empty stack");
	if (idx >= CKPT_PK_MAX_MEMO)
		return bad(m, "memo index too large");
	if (idx >= m->memo_cap) {
		size_t nc = m->memo_cap ? m->memo_cap : 64;
		while (nc <= idx)
			nc *= 2;
		ckpt_pk **nm = realloc(m->memo, nc * sizeof(*nm));
		if (!nm)
			return -ENOMEM;
		memset(nm + m->memo_cap, 0, (nc - m->memo_cap) * sizeof(*nm));
		m->memo = nm;
		m->memo_cap = nc;
	}
	if (!m->memo[idx])
		m->memo_count++;
	m->memo[idx] = o;
	return 0;
}

static int memo_get(struct pm *m, uint64_t idx)
{
	if (idx >= m->memo_cap || !m->memo[idx])
		return bad(m, "memo entry missing");
	return push(m, m->memo[idx]);
}

/* _codecs.encode(text, "latin1"): how protocols 0-2 store bytes.  Every code
 * point of the UTF-8 text is below 256 and becomes one byte. */
static int latin1_bytes(struct pm *m, const ckpt_pk *args)
{
	if (args->n != 2 || args->v[0]->kind != CKPT_PK_STR || args->v[1]->kind != CKPT_PK_STR ||
	    (strcmp(args->v[1]->s, "latin1") != 0 && strcmp(args->v[1]->s, "latin-1") != 0))
		return bad(m, "_codecs.encode other than latin1 text");
	const uint8_t *s = (const uint8_t *)args->v[0]->s;
	size_t n = args->v[0]->len, k = 0;
	uint8_t *o = malloc(n + 1);
	if (!o)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < 0x80) {
			o[k++] = s[i];
		} else if ((s[i] == 0xc2 || s[i] == 0xc3) && i + 1 < n && (s[i + 1] & 0xc0) == 0x80) {
			o[k++] = (uint8_t)((s[i] & 0x03) << 6 | (s[i + 1] & 0x3f));
			i++;
		} else {
			free(o);
			return bad(m, "_codecs.encode of a character above U+00FF");
		}
	}
	o[k] = 0;
	ckpt_pk *b = pk_new(m, CKPT_PK_BYTES);
	if (!b) {
		free(o);
		return -ENOMEM;
	}
	b->s = (const char *)o;
	b->len = k;
	return push(m, b);
}

/* REDUCE / NEWOBJ: a record of a whitelisted global.  OrderedDict() is a dict. */
static int make_record(struct pm *m, ckpt_pk *fn, ckpt_pk *args)
{
	if (!fn || fn->kind != CKPT_PK_GLOBAL)
		return bad(m, "call of a value that is not a global");
	if (!args || args->kind != CKPT_PK_TUPLE)
		return bad(m, "call arguments are not a tuple");
	if (strcmp(fn->s, "collections.OrderedDict") == 0) {
		if (args->n != 0)
			return bad(m, "OrderedDict with arguments");
		return push(m, pk_new(m, CKPT_PK_DICT));
	}
	if (strcmp(fn->s, "_codecs.encode") == 0)
		return latin1_bytes(m, args);
	if (strcmp(fn->s, CKPT_PK_GETATTR) == 0) {
		/* Python < 3.12 pickles an enum member as getattr(EnumClass, "NAME"):
		 * allowed for the enum classes of the list, nothing else */
		const ckpt_pk *cls = args->n == 2 ? args->v[0] : NULL,
			      *member = args->n == 2 ? args->v[1] : NULL;
		if (!cls || cls->kind != CKPT_PK_GLOBAL ||
		    (!ckpt_pk_is_attr(cls, "MEM_FORMAT_ENCODING") &&
		     !ckpt_pk_is_attr(cls, "_MEM_FORMAT_ENCODING")) ||
		    member->kind != CKPT_PK_STR || !ckpt_pickle_ident_ok(member->s)) {
			ckpt_log(CKPT_LOG_ERR, "%s: pickle: refused getattr other than of an enum member",
				 m->what);
			return -EPERM;
		}
		ckpt_pk *r = pk_new(m, CKPT_PK_RECORD), *t = pk_new(m, CKPT_PK_TUPLE);
		if (!r || !t)
			return -ENOMEM;
		int rc = add_item(m, t, args->v[1]);
		if (rc)
			return rc;
		r->s = cls->s;
		r->len = cls->len;
		r->args = t;
		r->depth = t->depth + 1;
		return push(m, r);
	}
	if (args->depth + 1 > CKPT_PK_MAX_DEPTH)
		return bad(m, "containers nested too deep");
	ckpt_pk *r = pk_new(m, CKPT_PK_RECORD);
	if (!r)
		return -ENOMEM;
	r->s = fn->s; /* owned by the global object, freed with the pickle */
	r->len = fn->len;
	r->args = args;
	r->depth = args->depth + 1;
	return push(m, r);
}

static int build(struct pm *m)
{
	ckpt_pk *state = pop(m);
	ckpt_pk *obj = top(m);
	if (!state || !obj)
		return bad(m, "BUILD with an empty stack");
	if (obj->kind != CKPT_PK_RECORD && obj->kind != CKPT_PK_DICT)
		return bad(m, "BUILD of a value that is not an object");
	if (state == obj)
		return bad(m, "BUILD of an object with itself");
	if (state->depth + 1 > CKPT_PK_MAX_DEPTH)
		return bad(m, "containers nested too deep");
	obj->state = state;
	if (state->depth + 1 > obj->depth)
		obj->depth = state->depth + 1;
	return 0;
}

static int step(struct pm *m, int *done)
{
	uint8_t op = *m->p++;
	int rc;
	ckpt_pk *a, *b;
	size_t from = 0, n = 0;
	const char *s;
	int64_t iv;

	switch (op) {
	case 0x80: /* PROTO */
		if ((rc = need(m, 1)))
			return rc;
		if (*m->p > 5)
			return bad(m, "unsupported protocol");
		m->p++;
		return 0;
	case 0x95: /* FRAME: a length hint only */
		if ((rc = need(m, 8)))
			return rc;
		m->p += 8;
		return 0;
	case '.': /* STOP */
		*done = 1;
		return 0;
	case '(': /* MARK */
		if (m->mn == m->mcap) {
			if (m->mcap >= 4096)
				return bad(m, "MARKs nested too deep");
			size_t nc = m->mcap ? m->mcap * 2 : 16;
			size_t *nm = realloc(m->marks, nc * sizeof(*nm));
			if (!nm)
				return -ENOMEM;
			m->marks = nm;
			m->mcap = nc;
		}
		m->marks[m->mn++] = m->sn;
		return 0;
	case '0': /* POP */
		if (m->sn > frame_base(m)) {
			m->sn--;
			return 0;
		}
		if (m->mn) { /* POP of a MARK */
			m->mn--;
			return 0;
		}
		return bad(m, "POP of an empty stack");
	case '1': /* POP_MARK */
		if ((rc = pop_mark(m, &from)))
			return rc;
		m->sn = from;
		return 0;
	case '2': /* DUP */
		if (!(a = top(m)))
			return bad(m, "DUP of an empty stack");
		return push(m, a);
	case 'N':
		return push(m, pk_new(m, CKPT_PK_NONE));
	case 0x88: /* NEWTRUE */
	case 0x89: /* NEWFALSE */
		if (!(a = pk_new(m, CKPT_PK_BOOL)))
			return -ENOMEM;
		a->i = op == 0x88;
		return push(m, a);
	case 'J': /* BININT */
		if ((rc = need(m, 4)))
			return rc;
		iv = (int32_t)(uint32_t)le(m->p, 4);
		m->p += 4;
		return push_int(m, iv);
	case 'K': /* BININT1 */
		if ((rc = need(m, 1)))
			return rc;
		return push_int(m, *m->p++);
	case 'M': /* BININT2 */
		if ((rc = need(m, 2)))
			return rc;
		iv = (int64_t)le(m->p, 2);
		m->p += 2;
		return push_int(m, iv);
	case 0x8a: /* LONG1 */
		if ((rc = need(m, 1)))
			return rc;
		n = *m->p++;
		if ((rc = need(m, n)))
			return rc;
		m->p += n;
		return push_long(m, m->p - n, n);
	case 0x8b: /* LONG4 */
		if ((rc = need(m, 4)))
			return rc;
		n = (size_t)le(m->p, 4);
		m->p += 4;
		if (n > 1024 || (rc = need(m, n)))
			return n > 1024 ? bad(m, "integer larger than 64 bits") : rc;
		m->p += n;
		return push_long(m, m->p - n, n);
	case 'I': /* INT (text; 00 and 01 are the booleans) */
	case 'L': /* LONG (text) */
		if ((rc = line(m, &s, &n)))
			return rc;
		if (op == 'I' && n == 2 && s[0] == '0' && (s[1] == '0' || s[1] == '1')) {
			if (!(a = pk_new(m, CKPT_PK_BOOL)))
				return -ENOMEM;
			a->i = s[1] == '1';
			return push(m, a);
		}
		if ((rc = text_int(m, s, n, &iv)))
			return rc;
		return push_int(m, iv);
	case 'G': { /* BINFLOAT: big-endian double */
		if ((rc = need(m, 8)))
			return rc;
		uint64_t bits = 0;
		for (int i = 0; i < 8; i++)
			bits = bits << 8 | m->p[i];
		m->p += 8;
		if (!(a = pk_new(m, CKPT_PK_FLOAT)))
			return -ENOMEM;
		memcpy(&a->f, &bits, 8);
		return push(m, a);
	}
	case 'F': { /* FLOAT (text) */
		if ((rc = line(m, &s, &n)))
			return rc;
		char buf[64];
		if (n == 0 || n >= sizeof(buf))
			return bad(m, "bad text float");
		memcpy(buf, s, n);
		buf[n] = 0;
		char *e;
		double d = strtod(buf, &e);
		if (*e)
			return bad(m, "bad text float");
		if (!(a = pk_new(m, CKPT_PK_FLOAT)))
			return -ENOMEM;
		a->f = d;
		return push(m, a);
	}
	case 0x8c: /* SHORT_BINUNICODE */
	case 'U': /* SHORT_BINSTRING */
	case 'C': /* SHORT_BINBYTES */
		if ((rc = need(m, 1)))
			return rc;
		n = *m->p++;
		goto counted;
	case 'X': /* BINUNICODE */
	case 'T': /* BINSTRING */
	case 'B': /* BINBYTES */
		if ((rc = need(m, 4)))
			return rc;
		n = (size_t)le(m->p, 4);
		m->p += 4;
		goto counted;
	case 0x8d: /* BINUNICODE8 */
	case 0x8e: /* BINBYTES8 */
	case 0x96: { /* BYTEARRAY8 */
		if ((rc = need(m, 8)))
			return rc;
		uint64_t n64 = le(m->p, 8);
		m->p += 8;
		if (n64 > (uint64_t)(m->end - m->p))
			return bad(m, "truncated");
		n = (size_t)n64;
		goto counted;
	}
	counted:
		if ((rc = need(m, n)))
			return rc;
		m->p += n;
		return push_bytes(m, (op == 0x8c || op == 'X' || op == 0x8d) ? CKPT_PK_STR : CKPT_PK_BYTES,
				  m->p - n, n);
	case 'V': /* UNICODE: raw-unicode-escape text up to '\n' */
		if ((rc = line(m, &s, &n)))
			return rc;
		return push_unicode_text(m, s, n);
	case ')': /* EMPTY_TUPLE */
		return push(m, pk_new(m, CKPT_PK_TUPLE));
	case 0x85: /* TUPLE1 */
	case 0x86: /* TUPLE2 */
	case 0x87: /* TUPLE3 */
		n = (size_t)(op - 0x84);
		if (m->sn < frame_base(m) + n)
			return bad(m, "TUPLEn with too few values");
		return make_seq(m, CKPT_PK_TUPLE, m->sn - n);
	case 't': /* TUPLE */
		if ((rc = pop_mark(m, &from)))
			return rc;
		return make_seq(m, CKPT_PK_TUPLE, from);
	case ']': /* EMPTY_LIST */
	case 0x8f: /* EMPTY_SET */
		return push(m, pk_new(m, CKPT_PK_LIST));
	case 'l': /* LIST */
	case 0x91: /* FROZENSET */
		if ((rc = pop_mark(m, &from)))
			return rc;
		return make_seq(m, CKPT_PK_LIST, from);
	case '}': /* EMPTY_DICT */
		return push(m, pk_new(m, CKPT_PK_DICT));
	case 'd': /* DICT */
		if ((rc = pop_mark(m, &from)))
			return rc;
		if ((m->sn - from) % 2)
			return bad(m, "odd number of dict items");
		return make_seq(m, CKPT_PK_DICT, from);
	case 'a': /* APPEND */
		if (m->sn < frame_base(m) + 2)
			return bad(m, "APPEND with too few values");
		return extend(m, m->stack[m->sn - 2], m->sn - 1, 0);
	case 'e': /* APPENDS */
	case 0x90: /* ADDITEMS */
		if ((rc = pop_mark(m, &from)))
			return rc;
		if (from == frame_base(m))
			return bad(m, "APPENDS without a list");
		return extend(m, m->stack[from - 1], from, 0);
	case 's': /* SETITEM */
		if (m->sn < frame_base(m) + 3)
			return bad(m, "SETITEM with too few values");
		return extend(m, m->stack[m->sn - 3], m->sn - 2, 1);
	case 'u': /* SETITEMS */
		if ((rc = pop_mark(m, &from)))
			return rc;
		if (from == frame_base(m))
			return bad(m, "SETITEMS without a dict");
		return extend(m, m->stack[from - 1], from, 1);
	case 0x94: /* MEMOIZE */
		return memo_put(m, m->memo_count);
	case 'q': /* BINPUT */
		if ((rc = need(m, 1)))
			return rc;
		return memo_put(m, *m->p++);
	case 'r': /* LONG_BINPUT */
		if ((rc = need(m, 4)))
			return rc;
		m->p += 4;
		return memo_put(m, le(m->p - 4, 4));
	case 'h': /* BINGET */
		if ((rc = need(m, 1)))
			return rc;
		return memo_get(m, *m->p++);
	case 'j': /* LONG_BINGET */
		if ((rc = need(m, 4)))
			return rc;
		m->p += 4;
		return memo_get(m, le(m->p - 4, 4));
	case 'p': /* PUT (text) */
	case 'g': /* GET (text) */
		if ((rc = line(m, &s, &n)) || (rc = text_int(m, s, n, &iv)))
			return rc;
		if (iv < 0)
			return bad(m, "negative memo index");
		return op == 'p' ? memo_put(m, (uint64_t)iv) : memo_get(m, (uint64_t)iv);
	case 'c': { /* GLOBAL "module\nname\n" */
		const char *mod, *name;
		size_t ml, nl;
		if ((rc = line(m, &mod, &ml)) || (rc = line(m, &name, &nl)))
			return rc;
		return push_global(m, mod, ml, name, nl);
	}
	case 0x93: /* STACK_GLOBAL */
		b = pop(m);
		a = pop(m);
		if (!a || !b || a->kind != CKPT_PK_STR || b->kind != CKPT_PK_STR)
			return bad(m, "STACK_GLOBAL without two strings");
		return push_global(m, a->s, a->len, b->s, b->len);
	case 'R': /* REDUCE */
		b = pop(m);
		a = pop(m);
		return make_record(m, a, b);
	case 0x81: /* NEWOBJ */
		b = pop(m);
		a = pop(m);
		return make_record(m, a, b);
	case 0x92: /* NEWOBJ_EX: cls, args, kwargs (kwargs must be empty) */
		rc = 0;
		{
			ckpt_pk *kw = pop(m);
			b = pop(m);
			a = pop(m);
			if (!kw || kw->kind != CKPT_PK_DICT || kw->n)
				return bad(m, "NEWOBJ_EX with keyword arguments");
		}
		return make_record(m, a, b);
	case 'b': /* BUILD */
		return build(m);
	case 'Q': /* BINPERSID */
		if (!(a = pop(m)))
			return bad(m, "BINPERSID of an empty stack");
		if (!(b = pk_new(m, CKPT_PK_PERSID)))
			return -ENOMEM;
		if (a->depth + 1 > CKPT_PK_MAX_DEPTH)
			return bad(m, "containers nested too deep");
		b->args = a;
		b->depth = a->depth + 1;
		return push(m, b);
	case 'i': /* INST */
	case 'o': /* OBJ */
	case 0x82: /* EXT1 */
	case 0x83: /* EXT2 */
	case 0x84: /* EXT4 */
	case 'P': /* PERSID (text) */
	case 0x97: /* NEXT_BUFFER */
	case 0x98: /* READONLY_BUFFER */
	case 'S': /* STRING (quoted text, escapes) */
		ckpt_log(CKPT_LOG_ERR, "%s: pickle: refused opcode 0x%02x", m->what, op);
		return -EPERM;
	default:
		ckpt_log(CKPT_LOG_ERR, "%s: pickle: unknown opcode 0x%02x", m->what, op);
		return -EINVAL;
	}
}

static void free_allocs(ckpt_pk *o)
{
	while (o) {
		ckpt_pk *next = o->next_alloc;
		if (o->kind != CKPT_PK_RECORD)
			free((void *)o->s);
		free(o->v);
		free(o);
		o = next;
	}
}

void ckpt_pickle_free(ckpt_pickle *p)
{
	if (!p)
		return;
	free_allocs(p->allocs);
	free(p);
}

const ckpt_pk *ckpt_pickle_root(const ckpt_pickle *p)
{
	return p ? p->root : NULL;
}

int ckpt_pickle_load(const void *buf, size_t len, const char *what, ckpt_pickle **out)
{
	*out = NULL;
	struct pm m = {
		.start = buf, .p = buf, .end = (const uint8_t *)buf + len, .what = what ? what : "pickle"
	};
	m.out = calloc(1, sizeof(*m.out));
	if (!m.out)
		return -ENOMEM;
	int rc = 0, done = 0;
	while (!rc && !done) {
		if (m.p >= m.end) {
			rc = bad(&m, "no STOP");
			break;
		}
		rc = step(&m, &done);
	}
	if (!rc && (m.sn != 1 || m.mn != 0))
		rc = bad(&m, "STOP with a stack other than one value");
	if (!rc)
		m.out->root = m.stack[0];
	free(m.stack);
	free(m.marks);
	free(m.memo);
	if (rc) {
		ckpt_pickle_free(m.out);
		return rc;
	}
	*out = m.out;
	return 0;
}

/* ---- helpers ------------------------------------------------------------- */

const ckpt_pk *ckpt_pk_get(const ckpt_pk *d, const char *key)
{
	if (!d || d->kind != CKPT_PK_DICT || !key)
		return NULL;
	const ckpt_pk *found = NULL;
	for (size_t i = 0; i + 1 < d->n; i += 2)
		if (d->v[i]->kind == CKPT_PK_STR && strcmp(d->v[i]->s, key) == 0)
			found = d->v[i + 1];
	return found;
}

int ckpt_pk_is(const ckpt_pk *o, const char *name)
{
	return o && (o->kind == CKPT_PK_RECORD || o->kind == CKPT_PK_GLOBAL) && o->s &&
	       strcmp(o->s, name) == 0;
}

int ckpt_pk_is_attr(const ckpt_pk *o, const char *attr)
{
	if (!o || (o->kind != CKPT_PK_RECORD && o->kind != CKPT_PK_GLOBAL) || !o->s)
		return 0;
	size_t n = strlen(o->s), a = strlen(attr);
	return n > a && o->s[n - a - 1] == '.' && strcmp(o->s + n - a, attr) == 0;
}

int ckpt_pk_int(const ckpt_pk *o, int64_t *v)
{
	if (!o || (o->kind != CKPT_PK_INT && o->kind != CKPT_PK_BOOL))
		return -EINVAL;
	*v = o->i;
	return 0;
}

const ckpt_pk *ckpt_pk_field(const ckpt_pk *rec, const char *field)
{
	if (!rec)
		return NULL;
	if (rec->kind == CKPT_PK_DICT)
		return ckpt_pk_get(rec, field);
	if (rec->kind != CKPT_PK_RECORD || !rec->state)
		return NULL;
	const ckpt_pk *st = rec->state;
	/* BUILD((dict, slots)) sets both a __dict__ and slots */
	if (st->kind == CKPT_PK_TUPLE && st->n == 2) {
		const ckpt_pk *f = ckpt_pk_get(st->v[0], field);
		return f ? f : ckpt_pk_get(st->v[1], field);
	}
	return ckpt_pk_get(st, field);
}

const ckpt_pk *ckpt_pk_item(const ckpt_pk *o, size_t i)
{
	if (!o || (o->kind != CKPT_PK_TUPLE && o->kind != CKPT_PK_LIST) || i >= o->n)
		return NULL;
	return o->v[i];
}

int ckpt_pk_ints(const ckpt_pk *o, int64_t *out, int max)
{
	if (ckpt_pk_is(o, "torch.Size") && o->kind == CKPT_PK_RECORD) {
		if (o->args->n != 1)
			return -EINVAL;
		o = o->args->v[0];
	}
	if (!o || (o->kind != CKPT_PK_TUPLE && o->kind != CKPT_PK_LIST) || o->n > (size_t)max)
		return -EINVAL;
	for (size_t i = 0; i < o->n; i++)
		if (o->v[i]->kind != CKPT_PK_INT || (out[i] = o->v[i]->i, 0))
			return -EINVAL;
	return (int)o->n;
}
