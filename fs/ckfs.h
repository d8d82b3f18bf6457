/*
 * ckfs.h - state shared by the daemon's files: the parsed options and the
 * view the FUSE handlers serve.  The daemon is glue: every handler maps
 * one request onto one or two libckpt calls and replies exactly once.
 */
#ifndef CKFS_H
#define CKFS_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include "ckpt.h"

struct ckfs_opts {
	char *source;
	char *cache_size;
	char *st_shard_size;
	int threads;
	int ready_fd;
	int show_companions;
	int read_ahead_kb;
	char *log_level;
	char *write_buffer;
	int zstd_level;
	int read_only;
	int show_help;
	int show_version;
};

struct ckfs {
	ckpt_view *view;
	struct ckfs_opts opts;
	double ttl_immutable; /* entry/attr timeout of committed nodes */
	int no_opendir; /* the kernel opens directories without asking */
};

extern const struct fuse_lowlevel_ops ckfs_ops;

#endif
