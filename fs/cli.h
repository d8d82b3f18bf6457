/*
 * cli.h - helpers of the subcommands (info, verify): opening a view
 * without a mount, JSON strings, human-readable sizes.
 */
#ifndef CKFS_CLI_H
#define CKFS_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "ckpt.h"

/* A read-only view of source, its companions hidden; on failure prints
 * the reason and returns -errno.  *real is the resolved source (free it). */
int cli_open_view(const char *source, ckpt_view **v, char **real);

/* s as a JSON string literal. */
void cli_json_str(FILE *f, const char *s);

/* "12.3 MiB" into buf; returns buf. */
const char *cli_human(uint64_t n, char *buf, size_t cap);

#endif
