/*
 * ckpt.h - the public interface of libckpt, for the daemon (fs/) and the
 * command-line tools.  Everything else under lib/ is private to the library.
 *
 * libckpt is layered (see docs/design.md): base -> format -> store ->
 * read / write -> tree.  The tree layer's view API (tree/view.h) is what a
 * file system front end needs: a namespace of nodes with lookup, readdir,
 * getattr, read, xattrs and the write protocol, all returning 0 or a
 * negative errno; tree/summary.h the table of arrays of a directory.
 * tlsbuf.h gives the per-thread reply buffers.
 */
#ifndef CKPT_H
#define CKPT_H

#include "tree/view.h"
#include "tree/summary.h"
#include "base/tlsbuf.h"

#endif
