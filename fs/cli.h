/*
 * cli.h - helpers of the subcommands (info, verify): opening a view
 * without a mount (JSON strings and human-readable sizes: ckpt_json_str,
 * ckpt_human of summary.h).
 */
#ifndef CKFS_CLI_H
#define CKFS_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "ckpt.h"

/* A read-only view of source, its companions hidden; on failure prints
 * the reason and returns -errno.  *real is the resolved source (free it). */
int cli_open_view(const char *source, ckpt_view **v, char **real);

/* The candidate nearest to `word` (at most 2 edits away, and at most half
 * its length), or NULL: the "did you mean" of a mistyped
 * option or subcommand. */
const char *cli_did_you_mean(const char *word, const char *const *cands, size_t n);

#endif
