/*
 * pickle.h - a restricted reader of Python pickles (protocols 0-5), for the
 * small pickles of PyTorch checkpoints: a torch.save archive's data.pkl and
 * a distributed checkpoint's .metadata.  It never calls anything: a global
 * is only a name checked against a fixed list of plain record types
 * (OrderedDict, torch tensor rebuild functions, storage classes and dtypes,
 * torch.Size, the distributed-checkpoint dataclasses, pathlib paths, a few
 * enums), and REDUCE / NEWOBJ / BUILD with such a global produce a record
 * (global, args, state).  Any other global is refused, naming it in the log.
 *
 * Pure: input is the whole pickle in memory; no I/O, no threads.  The input
 * is untrusted: the memo, the stack, MARK nesting, container nesting,
 * container lengths and integer sizes are bounded (integers must fit in a
 * signed 64-bit value), and every malformed input is -EINVAL.
 *
 * The result is a graph of ckpt_pk objects owned by the ckpt_pickle: the
 * memo can make two places share one object, and a hostile pickle can even
 * build a cycle (a list appended to itself), so every consumer walks it with
 * a depth bound (CKPT_PK_MAX_DEPTH) and a budget of visits.
 */
#ifndef CKPT_PICKLE_H
#define CKPT_PICKLE_H

#include <stddef.h>
#include <stdint.h>

#define CKPT_PK_MAX_DEPTH 64 /* container nesting accepted by the parser */
#define CKPT_PK_MAX_MEMO (1u << 20) /* memo entries */
#define CKPT_PK_MAX_STACK (1u << 20) /* values on the stack */
#define CKPT_PK_MAX_ITEMS (1u << 22) /* items of one list/tuple/dict */

enum ckpt_pk_kind {
	CKPT_PK_NONE = 1,
	CKPT_PK_BOOL, /* i: 0 or 1 */
	CKPT_PK_INT, /* i */
	CKPT_PK_FLOAT, /* f */
	CKPT_PK_STR, /* s (UTF-8 as stored, NUL-terminated), len */
	CKPT_PK_BYTES, /* s, len (also bytearray, protocol-1 strings) */
	CKPT_PK_TUPLE, /* v[0..n) */
	CKPT_PK_LIST, /* v[0..n) (also sets and frozensets) */
	CKPT_PK_DICT, /* n pairs: v[2k] key, v[2k+1] value, in insertion order; state */
	CKPT_PK_GLOBAL, /* s = "module.name" (a whitelisted global, not called) */
	CKPT_PK_RECORD, /* s = the global's name; args (a TUPLE); state (BUILD's argument or NULL) */
	CKPT_PK_PERSID, /* args = the persistent id (BINPERSID's argument) */
};

typedef struct ckpt_pk ckpt_pk;
struct ckpt_pk {
	enum ckpt_pk_kind kind;
	int64_t i;
	double f;
	const char *s;
	size_t len;
	ckpt_pk **v;
	size_t n;
	ckpt_pk *args;
	ckpt_pk *state;
	/* private to the parser */
	size_t cap;
	unsigned depth;
	ckpt_pk *next_alloc;
};

typedef struct ckpt_pickle ckpt_pickle;

/* Parse the pickle buf[0..len).  `what` names it in log lines (a file name).
 * *out gets the result (free with ckpt_pickle_free).  -EPERM for a global
 * outside the list (logged with its name) or an opcode that would run code
 * or fetch outside data (INST, OBJ, EXT*, PERSID, out-of-band buffers),
 * -EINVAL for a malformed or over-limit pickle, -ENOMEM. */
int ckpt_pickle_load(const void *buf, size_t len, const char *what, ckpt_pickle **out);
const ckpt_pk *ckpt_pickle_root(const ckpt_pickle *p);
void ckpt_pickle_free(ckpt_pickle *p);

/* getattr (builtins or __builtin__) is accepted only to be applied to an
 * enum class of the list (getattr(_MEM_FORMAT_ENCODING, "NAME"), how Python
 * before 3.12 pickles an enum member): that makes a record of the enum class
 * with args ("NAME",).  A bare getattr global has this name. */
#define CKPT_PK_GETATTR "builtins.getattr"

/* 1 when "module.name" is on the list of globals the reader accepts. */
int ckpt_pickle_global_ok(const char *module, const char *name);

/* 1 when s is a non-empty run of [A-Za-z0-9_] (a Python name, or a part of
 * a state-dict key, that may be shown as a path component). */
int ckpt_pickle_ident_ok(const char *s);

/* Helpers; each is NULL / -EINVAL safe on a NULL or wrong-kind object. */
/* The value of a str key in a dict (the last when repeated), else NULL. */
const ckpt_pk *ckpt_pk_get(const ckpt_pk *dict, const char *key);
/* 1 when o is a record (or a bare global when allow_global) named `name`. */
int ckpt_pk_is(const ckpt_pk *o, const char *name);
/* A record's name ending: 1 when its global's name ends with ".<attr>". */
int ckpt_pk_is_attr(const ckpt_pk *o, const char *attr);
/* Integer value of an INT or BOOL. */
int ckpt_pk_int(const ckpt_pk *o, int64_t *v);
/* A field of a record built by NEWOBJ + BUILD(dict) (or a dict's key). */
const ckpt_pk *ckpt_pk_field(const ckpt_pk *rec, const char *field);
/* Item i of a TUPLE or LIST, else NULL. */
const ckpt_pk *ckpt_pk_item(const ckpt_pk *o, size_t i);
/* A sequence of ints (a tuple/list, or torch.Size(tuple) as a record) into
 * out[0..max): returns the count, -EINVAL when not one or longer than max. */
int ckpt_pk_ints(const ckpt_pk *o, int64_t *out, int max);

#endif
