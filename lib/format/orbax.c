/*
 * orbax.c - Orbax names, name rules and key encodings (see orbax.h).
 */
#include "orbax.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- name rules -------------------------------------------------------- */

static int refuse(const char **why, const char *reason)
{
	if (why)
		*why = reason;
	return 0;
}

static int in_list(const char *name, const char *const *list, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(name, list[i]) == 0)
			return 1;
	return 0;
}

int ckpt_orbax_is_unfinished(const char *name)
{
	size_t n = strlen(name), np = sizeof(CKPT_ORBAX_PARTIAL) - 1;
	return strstr(name, CKPT_ORBAX_TMP_INFIX) != NULL ||
	       (n >= np && strcmp(name + n - np, CKPT_ORBAX_PARTIAL) == 0);
}

int ckpt_orbax_tmp_step(const char *name, char *step, size_t cap)
{
	size_t n = strlen(name), k = sizeof(CKPT_ORBAX_TMP_INFIX) - 1;
	const char *why;
	if (n <= k || strcmp(name + n - k, CKPT_ORBAX_TMP_INFIX) || n - k >= cap)
		return 0;
	memcpy(step, name, n - k);
	step[n - k] = 0;
	return ckpt_orbax_name_ok(CKPT_NAME_STEP, step, &why);
}

int ckpt_orbax_step_number(const char *name, uint64_t *step)
{
	if (!name || !*name)
		return 0;
	size_t n = strlen(name), d = n;
	while (d > 0 && name[d - 1] >= '0' && name[d - 1] <= '9')
		d--;
	/* name[d..n) are the trailing digits; before them nothing or "<prefix>_" */
	if (d == n || (d > 0 && (d < 2 || name[d - 1] != '_')))
		return 0;
	uint64_t v = 0;
	for (size_t i = d; i < n; i++) {
		unsigned dig = (unsigned)(name[i] - '0');
		if (v > (UINT64_MAX - dig) / 10)
			return 0;
		v = v * 10 + dig;
	}
	if (step)
		*step = v;
	return 1;
}

/* A '/'-separated path of folder names (a key or param with '/' becomes
 * nested folders): no empty component and none starting with '.'. */
static int path_ok(const char *name, const char **why)
{
	for (const char *p = name; *p;) {
		const char *e = strchr(p, '/');
		size_t n = e ? (size_t)(e - p) : strlen(p);
		if (n == 0)
			return refuse(why, "an empty folder name (leading, trailing or double '/')");
		if (p[0] == '.')
			return refuse(why, "a folder name starting with '.'");
		if (n > 255)
			return refuse(why, "a folder name over 255 bytes");
		if (!e)
			break;
		if (!e[1])
			return refuse(why, "an empty folder name (leading, trailing or double '/')");
		p = e + 1;
	}
	return 1;
}

static int common_ok(const char *name, size_t max, int slash_ok, const char **why)
{
	if (!name || !*name)
		return refuse(why, "empty name");
	if (strlen(name) > max)
		return refuse(why, "name too long");
	if (name[0] == '.')
		return refuse(why, "names starting with '.' are reserved");
	for (const unsigned char *p = (const unsigned char *)name; *p; p++)
		if (*p < 0x20 || *p == 0x7f)
			return refuse(why, "a name cannot contain control characters");
	if (!slash_ok && strchr(name, '/'))
		return refuse(why, "a name cannot contain '/'");
	if (slash_ok && !path_ok(name, why))
		return 0;
	if (strchr(name, '['))
		return refuse(why, "a name cannot contain '[' (slice syntax)");
	if (strstr(name, CKPT_ORBAX_TMP_INFIX) || strstr(name, CKPT_ORBAX_PARTIAL))
		return refuse(why, "the name marks an unfinished Orbax folder");
	return 1;
}

int ckpt_orbax_name_ok(enum ckpt_orbax_name kind, const char *name, const char **why)
{
	static const char *const step_files[] = { CKPT_ORBAX_CKPT_METADATA, CKPT_ORBAX_COMMIT_SUCCESS,
						  CKPT_ORBAX_MARKER_FILE };
	static const char *const reserved_items[] = { CKPT_ORBAX_RESERVED_ITEMS };
	static const char *const item_files[] = { CKPT_ORBAX_METADATA,	      CKPT_ORBAX_SHARDING,
						  CKPT_ORBAX_STRINGS,	      CKPT_ORBAX_COMMIT_SUCCESS,
						  CKPT_ORBAX_ARRAY_METADATAS, CKPT_ORBAX_OCDBT_MANIFEST,
						  CKPT_ORBAX_CKPT_METADATA };
	int slash_ok = kind == CKPT_NAME_KEY || kind == CKPT_NAME_PARAM;
	if (!common_ok(name, kind == CKPT_NAME_PARAM ? CKPT_ORBAX_PARAM_MAX : CKPT_ORBAX_NAME_MAX, slash_ok,
		       why))
		return 0;
	switch (kind) {
	case CKPT_NAME_STEP:
		if (!ckpt_orbax_step_number(name, NULL))
			return refuse(why,
				      "not a step name Orbax finds (\"<number>\" or \"<prefix>_<number>\")");
		return 1;
	case CKPT_NAME_PENDING_STEP:
		if (strcmp(name, CKPT_ORBAX_ROOT_METADATA_DIR) == 0)
			return refuse(why, "the root's metadata folder is not a step");
		return 1;
	case CKPT_NAME_ITEM:
		if (in_list(name, step_files, sizeof(step_files) / sizeof(step_files[0])))
			return refuse(why, "the name of an Orbax step file");
		if (in_list(name, reserved_items, sizeof(reserved_items) / sizeof(reserved_items[0])))
			return refuse(why, "an item name Orbax reserves");
		return 1;
	case CKPT_NAME_KEY:
		return 1;
	case CKPT_NAME_PARAM: {
		/* the first folder sits beside the item's own files */
		char first[CKPT_ORBAX_PARAM_MAX + 1];
		size_t n = strcspn(name, "/");
		memcpy(first, name, n);
		first[n] = 0;
		if (in_list(first, item_files, sizeof(item_files) / sizeof(item_files[0])) ||
		    strncmp(first, CKPT_ORBAX_OCDBT_PROCESS_PREFIX,
			    sizeof(CKPT_ORBAX_OCDBT_PROCESS_PREFIX) - 1) == 0)
			return refuse(why, "the name of an Orbax item file");
		return 1;
	}
	}
	return refuse(why, "unknown kind of name");
}

static int seq_key_ok(const char *k)
{
	size_t n = strlen(k);
	if (n == 0 || n > 19 || (k[0] == '0' && n > 1))
		return 0;
	for (const char *p = k; *p; p++)
		if (*p < '0' || *p > '9')
			return 0;
	return 1;
}

int ckpt_orbax_keypath_ok(const char *const *keys, const int *types, int depth, const char **why)
{
	if (!keys || !types || depth < 1 || depth > CKPT_ORBAX_MAX_DEPTH)
		return refuse(why, "a key path has 1 to 256 keys");
	size_t len = 0;
	for (int i = 0; i < depth; i++) {
		if (!ckpt_orbax_name_ok(CKPT_NAME_KEY, keys[i], why))
			return 0;
		if (types[i] != CKPT_KEY_SEQ && types[i] != CKPT_KEY_DICT)
			return refuse(why, "unknown key type");
		if (types[i] == CKPT_KEY_SEQ && !seq_key_ok(keys[i]))
			return refuse(why, "a sequence key is a decimal index without leading zeros");
		len += strlen(keys[i]) + 1;
		if (len > CKPT_ORBAX_PARAM_MAX + 1)
			return refuse(why, "name too long");
	}
	char param[CKPT_ORBAX_PARAM_MAX + 1], *p = param;
	for (int i = 0; i < depth; i++) {
		if (i)
			*p++ = '.';
		p = stpcpy(p, keys[i]);
	}
	return ckpt_orbax_name_ok(CKPT_NAME_PARAM, param, why);
}

/* ---- _sharding keys ---------------------------------------------------- */

static const char b64_alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

char *ckpt_orbax_sharding_key(const char *param)
{
	size_t n = strlen(param);
	char *o = malloc(4 * ((n + 2) / 3) + 1), *p = o;
	const unsigned char *u = (const unsigned char *)param;
	if (!o)
		return NULL;
	for (size_t i = 0; i < n; i += 3) {
		uint32_t v = (uint32_t)u[i] << 16 | (i + 1 < n ? (uint32_t)u[i + 1] << 8 : 0) |
			     (i + 2 < n ? u[i + 2] : 0);
		*p++ = b64_alphabet[v >> 18 & 63];
		*p++ = b64_alphabet[v >> 12 & 63];
		*p++ = i + 1 < n ? b64_alphabet[v >> 6 & 63] : '=';
		*p++ = i + 2 < n ? b64_alphabet[v & 63] : '=';
	}
	*p = 0;
	return o;
}

static int b64_value(char c)
{
	const char *p = c ? strchr(b64_alphabet, c) : NULL;
	return p ? (int)(p - b64_alphabet) : -1;
}

char *ckpt_orbax_sharding_key_decode(const char *key)
{
	size_t n = strlen(key);
	if (n % 4)
		return NULL;
	char *o = malloc(n / 4 * 3 + 1), *p = o;
	if (!o)
		return NULL;
	for (size_t i = 0; i < n; i += 4) {
		int last = i + 4 == n;
		int pad = last ? (key[i + 3] == '=') + (key[i + 2] == '=') : 0;
		if (pad == 1 && key[i + 2] == '=')
			goto bad; /* "x=y=" style */
		int v[4];
		for (int k = 0; k < 4 - pad; k++)
			if ((v[k] = b64_value(key[i + k])) < 0)
				goto bad;
		uint32_t x = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 |
			     (pad < 2 ? (uint32_t)v[2] << 6 : 0) | (pad < 1 ? (uint32_t)v[3] : 0);
		/* canonical: the bits below the last kept byte are zero */
		if ((pad == 2 && (x & 0xffff)) || (pad == 1 && (x & 0xff)))
			goto bad;
		unsigned char b[3] = { (unsigned char)(x >> 16), (unsigned char)(x >> 8), (unsigned char)x };
		for (int k = 0; k < 3 - pad; k++) {
			if (!b[k])
				goto bad; /* a param name has no NUL byte */
			*p++ = (char)b[k];
		}
	}
	*p = 0;
	return o;
bad:
	free(o);
	return NULL;
}

/* ---- pytree keys as file names ----------------------------------------- */

static int put_str(char *buf, size_t cap, const char *s)
{
	size_t n = strlen(s);
	if (n >= cap) {
		if (cap) {
			memcpy(buf, s, cap - 1);
			buf[cap - 1] = 0;
		}
		return -ENAMETOOLONG;
	}
	memcpy(buf, s, n + 1);
	return (int)n;
}

int ckpt_orbax_key_escape(const char *key, char *buf, size_t cap)
{
	static const char hex[] = "0123456789ABCDEF";
	if (!*key)
		return put_str(buf, cap, "%");
	if (strcmp(key, ".") == 0)
		return put_str(buf, cap, "%2E");
	if (strcmp(key, "..") == 0)
		return put_str(buf, cap, "%2E%2E");
	size_t o = 0;
	for (const unsigned char *p = (const unsigned char *)key; *p; p++) {
		size_t need = (*p == '%' || *p == '/') ? 3 : 1;
		if (o + need >= cap) {
			if (cap)
				buf[o] = 0;
			return -ENAMETOOLONG;
		}
		if (need == 3) {
			buf[o++] = '%';
			buf[o++] = hex[*p >> 4];
			buf[o++] = hex[*p & 15];
		} else {
			buf[o++] = (char)*p;
		}
	}
	if (o > (size_t)INT32_MAX)
		return -ENAMETOOLONG;
	buf[o] = 0;
	return (int)o;
}

int ckpt_orbax_key_unescape(const char *name, char *buf, size_t cap)
{
	if (strcmp(name, "%") == 0)
		return put_str(buf, cap, "");
	if (strcmp(name, "%2E") == 0)
		return put_str(buf, cap, ".");
	if (strcmp(name, "%2E%2E") == 0)
		return put_str(buf, cap, "..");
	if (!*name || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
		return -EINVAL; /* the escape never produces these */
	size_t o = 0;
	for (const char *p = name; *p; p++) {
		char c = *p;
		if (c == '/')
			return -EINVAL;
		if (c == '%') {
			if (strncmp(p, "%25", 3) == 0)
				c = '%';
			else if (strncmp(p, "%2F", 3) == 0)
				c = '/';
			else
				return -EINVAL;
			p += 2;
		}
		if (o + 1 >= cap) {
			if (cap)
				buf[o] = 0;
			return -ENAMETOOLONG;
		}
		buf[o++] = c;
	}
	if (o > (size_t)INT32_MAX)
		return -ENAMETOOLONG;
	buf[o] = 0;
	return (int)o;
}

/* ---- key paths in _METADATA -------------------------------------------- */

/* Python repr() of a str into o (room checked by the caller: 4 bytes a byte + 2). */
static char *py_repr(char *o, const char *s)
{
	static const char hx[] = "0123456789abcdef";
	char q = (strchr(s, '\'') && !strchr(s, '"')) ? '"' : '\'';
	*o++ = q;
	for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
		if (*c == '\\' || *c == (unsigned char)q) {
			*o++ = '\\';
			*o++ = (char)*c;
		} else if (*c == '\n') {
			*o++ = '\\';
			*o++ = 'n';
		} else if (*c == '\r') {
			*o++ = '\\';
			*o++ = 'r';
		} else if (*c == '\t') {
			*o++ = '\\';
			*o++ = 't';
		} else if (*c < 0x20 || *c == 0x7f) {
			*o++ = '\\';
			*o++ = 'x';
			*o++ = hx[*c >> 4];
			*o++ = hx[*c & 15];
		} else {
			*o++ = (char)*c;
		}
	}
	*o++ = q;
	return o;
}

char *ckpt_orbax_keypath_repr(const char *const *keys, int depth)
{
	if (!keys || depth < 1)
		return NULL;
	size_t cap = 4;
	for (int i = 0; i < depth; i++)
		cap += 4 * strlen(keys[i]) + 4;
	char *b = malloc(cap + 1), *p = b;
	if (!b)
		return NULL;
	*p++ = '(';
	for (int i = 0; i < depth; i++) {
		if (i) {
			*p++ = ',';
			*p++ = ' ';
		}
		p = py_repr(p, keys[i]);
	}
	if (depth == 1)
		*p++ = ',';
	*p++ = ')';
	*p = 0;
	return b;
}

int ckpt_orbax_keypath_cmp(const char *const *ka, const int *ta, int da, const char *const *kb, const int *tb,
			   int db)
{
	for (int i = 0; i < da && i < db; i++) {
		int c;
		if (ta[i] == CKPT_KEY_SEQ && tb[i] == CKPT_KEY_SEQ) {
			/* canonical decimals: the shorter is the smaller */
			size_t la = strlen(ka[i]), lb = strlen(kb[i]);
			c = la != lb ? (la < lb ? -1 : 1) : strcmp(ka[i], kb[i]);
		} else {
			c = strcmp(ka[i], kb[i]);
		}
		if (c)
			return c;
	}
	return da < db ? -1 : da > db;
}
