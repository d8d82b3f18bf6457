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
	char *recipes; /* -o recipes=DIR: view recipes read before the shipped ones */
	int threads;
	int ready_fd;
	int show_companions;
	int read_ahead_kb;
	int direct_read; /* -o direct_read: read-only opens bypass the page cache */
	char *log_level;
	char *write_buffer;
	int zstd_level;
	int read_only;
	int show_help;
	int show_version;
	char *log_file; /* log here (also in the foreground) */
	char *ready_file; /* written (PID) once the mount serves requests */
	int uid, gid; /* owner shown for every node (-1: the daemon's) */
	char *umask; /* octal; when set, modes are 0777/0666 & ~umask */
	int allow_other_writes; /* other uids may write (allow_other) */
	int delete_steps; /* removals inside a committed step delete it (Orbax's max_to_keep) */
	int force_root; /* -o root: a non-checkpoint SOURCE is a CheckpointManager root */
	int process_index, process_count; /* multi-host writes (docs/usage.md) */
	int commit_timeout; /* seconds; 0: default */
	int has_fsname, has_subtype;
	int nonempty; /* -o nonempty: mount over a non-empty or mounted folder */
	int quiet; /* -q: no line on a successful mount */
};

struct ckfs {
	ckpt_view *view;
	struct ckfs_opts opts;
	double ttl_immutable; /* entry/attr timeout of committed nodes */
	int no_opendir; /* the kernel opens directories without asking */
	int init_done; /* INIT answered (main.c answers it before the loop) */
	uid_t owner_uid; /* the mounting user: the only uid that may write */
	uid_t show_uid;
	gid_t show_gid;
	int have_umask;
	unsigned umask_bits;
	int writable; /* a CheckpointManager root mounted read-write */
};

extern const struct fuse_lowlevel_ops ckfs_ops;

/* -o direct_read: the session's /dev/fuse I/O through devio.c, whose INIT
 * reply also asks for DIRECT_IO_ALLOW_MMAP (shared mmap of direct-I/O files)
 * when the kernel offers it.  After fuse_session_mount; 0 or -errno. */
int ckfs_devio_install(struct fuse_session *se);

/* Entry invalidations of transient names, sent by a thread of their own
 * (inval.c): start after daemonizing, stop after the session is unmounted. */
int ckfs_inval_start(struct fuse_session *se, ckpt_view *view);
void ckfs_inval_kick(void); /* a transient name was answered */
void ckfs_inval_stop(void);

/* ---- shared by the daemon and the subcommands (walk.c) ---- */

/* Called for every node under the walked directory, depth first, in
 * readdir order; `path` is relative to the view root ("10/state/w.npy").
 * Return non-zero to stop the walk (returned by ckfs_walk). */
typedef int (*ckfs_walk_fn)(void *ctx, const char *path, int depth, const ckpt_attr *a);
int ckfs_walk(ckpt_view *v, ckpt_ino dir, const char *prefix, int depth, ckfs_walk_fn fn, void *ctx);

/* Resolve a '/'-separated path inside the view (""= the root). */
int ckfs_resolve(ckpt_view *v, const char *path, ckpt_attr *out);

/* getxattr into a NUL-terminated buffer; the length or -errno. */
ssize_t ckfs_xattr(ckpt_view *v, ckpt_ino ino, const char *name, char *buf, size_t cap);

/* The subcommands (no mount). */
int ckfs_cmd_info(int argc, char **argv);
int ckfs_cmd_verify(int argc, char **argv);
int ckfs_cmd_status(int argc, char **argv);

#endif
