/*
 * ckpt.h - the public interface of libckpt, for the daemon (fs/) and the
 * command-line tools.  Everything else is private to the library: fs/ is
 * built with include/ as its only libckpt include folder, so no layer
 * header (lib/LAYER/NAME.h) can be included from it, and scripts/check_layers
 * fails on any call from fs/ into a function not declared in this header set.
 *
 * libckpt is layered (see docs/design.md): base -> format -> store ->
 * read / write -> tree.  The public header set is include/ckpt/:
 *   view.h     the tree layer's view API: a namespace of nodes with lookup,
 *              readdir, getattr, read, xattrs and the write protocol, all
 *              returning 0 or a negative errno (opaque ckpt_view);
 *   summary.h  the table of arrays of a directory;
 *   tlsbuf.h   the per-thread reply buffers;
 *   lockrank.h the lock order as a table, and the lock wrappers that check it;
 *   support.h  logging, read-context and object-store options, ckpt_rmtree.
 * The layers include these headers too (they implement them).
 */
#ifndef CKPT_H
#define CKPT_H

#include "ckpt/support.h"
#include "ckpt/lockrank.h"
#include "ckpt/tlsbuf.h"
#include "ckpt/view.h"
#include "ckpt/summary.h"

#endif
