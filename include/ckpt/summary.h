/*
 * ckpt/summary.h - the table of arrays of a directory of a view, as `ckptfs info`
 * prints it and as MNT/STEP/.ckptfs/summary.txt (and summary.json) serve it.
 * Metadata only: built from readdir and the user.ckpt.* xattrs, it never
 * reads array data (logical bytes are shape x itemsize, stored bytes what
 * the tree already knows).
 */
#ifndef CKPT_SUMMARY_H
#define CKPT_SUMMARY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "view.h"

/*
 * The summary of directory `dir` of v (the root, a step, an item or a
 * directory below): the source line, the steps (in the root's order: by
 * number), per item a table of its arrays (key, dtype, shape, chunks,
 * logical and stored bytes, ratio) with a total line, then totals per
 * dtype and over all arrays, then the arrays that are listed but cannot
 * be read.  For the whole of a root, the text has one line per step
 * instead (commit time, arrays, logical and stored bytes, the latest
 * marked) unless flags has CKPT_SUMMARY_ALL.  With CKPT_SUMMARY_JSON, the
 * full summary as one JSON object (steps, arrays, items, dtypes,
 * unreadable, total).  `source` names the checkpoint in the first line
 * (NULL: the source v was opened on).
 *
 * Returns 0, or the number of unreadable arrays (listed in the text), with
 * *buf (malloc'ed, NUL-terminated, the caller frees it) and *len (bytes
 * without the NUL); or -errno (-ENOTDIR when dir is a file).  Walks with
 * ckpt_view_readdir/ckpt_view_getxattr, so it must be called with no lock
 * of the view held (as every public call); thread-safe.
 */
#define CKPT_SUMMARY_JSON 1
#define CKPT_SUMMARY_ALL 2
int ckpt_view_summary(ckpt_view *v, ckpt_ino dir, const char *source, int flags, char **buf, size_t *len);

/* Writes s to f as a JSON string literal (quotes, backslashes and control
 * characters escaped; other bytes, UTF-8 included, as they are). */
void ckpt_json_str(FILE *f, const char *s);

/* n bytes for people ("812 B", "12.3 MiB", up to PiB) into buf of cap
 * bytes (truncated to fit); returns buf.  Pure, thread-safe. */
const char *ckpt_human(uint64_t n, char *buf, size_t cap);

#endif
