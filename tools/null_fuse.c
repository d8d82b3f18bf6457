/*
 * null_fuse - the transport limit of a FUSE read path: a low-level daemon
 * that serves one read-only file of N bytes from one static buffer, so a
 * read through it costs the kernel round trip and the reply copy and
 * nothing else (no decode, no cache, no allocation per request).
 *
 *   null_fuse MOUNTPOINT [-o size=BYTES] [-o buf=BYTES] [-o direct_io] [-o splice]
 *             [-o piece=N [-o copy]] [-o file=PATH [-o mmap]] [-o ready_fd=FD]
 *             [FUSE options, e.g. -o max_threads=N]
 *
 * The file is MOUNTPOINT/data (default 512 MiB).  Its bytes are a fixed
 * pattern of buf bytes (default 8 MiB: it stays in the CPU's cache)
 * repeated (byte i is pattern[i % buf]), so a reply is one iovec, or two
 * where it crosses the end of the pattern; -o buf=SIZE (the file's size)
 * makes every byte distinct, read from memory as a file's would be.
 * Settings as ckptfs's (fs/ops.c, fs/main.c): the same max_background and
 * congestion threshold, keep_cache, the kernel's read-ahead raised to
 * 1024 KiB (read_ahead_kb on the mount's bdi, as ckptfs does), libfuse's
 * default max_read / max_write and buffer of 1 MiB requests, and the
 * multi-threaded loop.  -o direct_io opens the file with FOPEN_DIRECT_IO:
 * reads bypass the page cache and arrive as the reader's own read sizes.
 * -o splice replies with fuse_reply_data and FUSE_CAP_SPLICE_WRITE/MOVE
 * (libfuse vmsplices the buffer into a pipe and splices it to /dev/fuse).
 * -o piece=N replies in pieces of N bytes from 8 places of the buffer in
 * turn, the way the rows of column chunks lie in a decoder's memory (what
 * ckptfs replies for an array in chunks [4096, 512] of float32 is 2 KiB
 * pieces); with -o copy those pieces are gathered into one buffer first.
 * -o file=PATH serves that file's bytes instead: pread into a per-thread
 * buffer and one iovec, with -o splice its descriptor handed to
 * fuse_reply_data (libfuse splices the file's pages), with -o mmap one
 * iovec of a populated mapping of it (the daemon copies nothing).
 * Runs in the foreground; writes 's' to ready_fd once mounted.
 */
/* 3.12's loop config (fuse_loop_cfg_*), as ckptfs: built for an older API
 * version, fuse_session_loop_mt reads that config as the old struct, takes
 * max_idle_threads from the wrong field, and a worker thread exits after
 * every request (a clone3 and a fresh 1 MiB receive buffer per read). */
#define FUSE_USE_VERSION 312
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <alloca.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <unistd.h>

static size_t buf_bytes = (size_t)8 << 20;
#define FILE_INO 2

static struct nf_opts {
	char *size;
	int direct_io;
	int splice;
	int ready_fd;
	int piece;
	int copy;
	char *file;
	int mmap;
	char *buf;
} o = { NULL, 0, 0, -1, 0, 0, NULL, 0, NULL };
static int backing_fd = -1;
static unsigned char *backing_map;

static uint64_t file_size = 512ull << 20;
static unsigned char *pattern;

static const struct fuse_opt nf_spec[] = { { "size=%s", offsetof(struct nf_opts, size), 0 },
					   { "direct_io", offsetof(struct nf_opts, direct_io), 1 },
					   { "splice", offsetof(struct nf_opts, splice), 1 },
					   { "ready_fd=%d", offsetof(struct nf_opts, ready_fd), 0 },
					   { "piece=%d", offsetof(struct nf_opts, piece), 0 },
					   { "copy", offsetof(struct nf_opts, copy), 1 },
					   { "file=%s", offsetof(struct nf_opts, file), 0 },
					   { "mmap", offsetof(struct nf_opts, mmap), 1 },
					   { "buf=%s", offsetof(struct nf_opts, buf), 0 },
					   FUSE_OPT_END };

static void attr_of(fuse_ino_t ino, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = ino;
	if (ino == FUSE_ROOT_ID) {
		st->st_mode = S_IFDIR | 0755;
		st->st_nlink = 2;
	} else {
		st->st_mode = S_IFREG | 0444;
		st->st_nlink = 1;
		st->st_size = (off_t)file_size;
		st->st_blocks = (blkcnt_t)((file_size + 511) / 512);
	}
	st->st_blksize = 1 << 20;
}

static void nf_init(void *ud, struct fuse_conn_info *conn)
{
	(void)ud;
	conn->max_background = 64; /* as ckptfs */
	conn->congestion_threshold = 48;
	if (o.splice) /* replies through a pipe (vmsplice + splice) instead of writev */
		conn->want |= conn->capable & (FUSE_CAP_SPLICE_WRITE | FUSE_CAP_SPLICE_MOVE);
}

static void nf_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	if (parent != FUSE_ROOT_ID || strcmp(name, "data")) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	struct fuse_entry_param e;
	memset(&e, 0, sizeof(e));
	e.ino = FILE_INO;
	e.attr_timeout = e.entry_timeout = 3600.0;
	attr_of(FILE_INO, &e.attr);
	fuse_reply_entry(req, &e);
}

static void nf_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)fi;
	if (ino != FUSE_ROOT_ID && ino != FILE_INO) {
		fuse_reply_err(req, ENOENT);
		return;
	}
	struct stat st;
	attr_of(ino, &st);
	fuse_reply_attr(req, &st, 3600.0);
}

static void nf_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	if (ino != FILE_INO) {
		fuse_reply_err(req, EISDIR);
		return;
	}
	if ((fi->flags & O_ACCMODE) != O_RDONLY) {
		fuse_reply_err(req, EROFS);
		return;
	}
	fi->keep_cache = 1;
	fi->direct_io = o.direct_io;
	fi->noflush = 1;
	fuse_reply_open(req, fi);
}

/* -o piece=N: the reply as pieces of N bytes taken from 8 places of the
 * buffer in turn, the way a row of column chunks lies in memory (each piece
 * its own iovec); with -o copy the same pieces are first copied into one
 * reply buffer.  Shows what per-piece transport costs. */
static void piece_reply(fuse_req_t req, size_t size, off_t off)
{
	/* per worker, made and pre-faulted once (workers live as long as the
	 * loop), so no reply pays for fresh memory */
	static __thread struct iovec *iov;
	static __thread unsigned char *out;
	size_t pc = (size_t)o.piece, n = (size + pc - 1) / pc;
	if (!iov && (iov = calloc(1024, sizeof(*iov))) && o.copy && (out = malloc(1u << 20)))
		memset(out, 0, 1u << 20);
	if (!iov || (o.copy && !out) || n > 1024 || size > (1u << 20)) {
		fuse_reply_err(req, EINVAL);
		return;
	}
	for (size_t i = 0; i < n; i++) {
		size_t lane = i % 8, row = i / 8;
		size_t p = (lane * (buf_bytes / 8) + (((uint64_t)off / 8 + row * pc) % (buf_bytes / 8 - pc)));
		iov[i].iov_base = pattern + p;
		iov[i].iov_len = size - i * pc < pc ? size - i * pc : pc;
	}
	if (o.copy) {
		for (size_t i = 0; i < n; i++)
			memcpy(out + i * pc, iov[i].iov_base, iov[i].iov_len);
		fuse_reply_buf(req, (const char *)out, size);
		return;
	}
	fuse_reply_iov(req, iov, (int)n);
}

/* -o file=PATH: the bytes of a backing file, as a daemon serving
 * uncompressed stored data would: with -o mmap, one iovec into the
 * populated mapping; with -o splice, the backing descriptor is handed to
 * fuse_reply_data (libfuse splices its page cache into the reply); else
 * pread into a per-thread buffer, then one iovec. */
static void file_reply(fuse_req_t req, size_t size, off_t off)
{
	if (backing_map) {
		fuse_reply_buf(req, (const char *)backing_map + off, size);
		return;
	}
	if (o.splice) {
		struct fuse_bufvec bv = FUSE_BUFVEC_INIT(size);
		bv.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
		bv.buf[0].fd = backing_fd;
		bv.buf[0].pos = off;
		fuse_reply_data(req, &bv, FUSE_BUF_SPLICE_MOVE);
		return;
	}
	static __thread unsigned char *tb;
	static __thread size_t tcap;
	if (tcap < size) {
		free(tb);
		tb = aligned_alloc(4096, (size + 4095) & ~(size_t)4095);
		tcap = tb ? size : 0;
		if (!tb) {
			fuse_reply_err(req, ENOMEM);
			return;
		}
	}
	ssize_t r = pread(backing_fd, tb, size, off);
	if (r < 0) {
		fuse_reply_err(req, errno);
		return;
	}
	fuse_reply_buf(req, (const char *)tb, (size_t)r);
}

static void nf_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)ino;
	(void)fi;
	if ((uint64_t)off >= file_size) {
		fuse_reply_buf(req, NULL, 0);
		return;
	}
	if (size > file_size - (uint64_t)off)
		size = (size_t)(file_size - (uint64_t)off);
	if (o.piece > 0)
		return piece_reply(req, size, off);
	if (backing_fd >= 0)
		return file_reply(req, size, off);
	struct iovec iov[8];
	int n = 0;
	size_t done = 0;
	while (done < size && n < 8) {
		size_t p = (size_t)(((uint64_t)off + done) % buf_bytes);
		size_t len = buf_bytes - p < size - done ? buf_bytes - p : size - done;
		iov[n].iov_base = pattern + p;
		iov[n].iov_len = len;
		n++;
		done += len;
	}
	if (o.splice) {
		struct fuse_bufvec *bv = alloca(sizeof(*bv) + sizeof(struct fuse_buf) * (size_t)n);
		memset(bv, 0, sizeof(*bv) + sizeof(struct fuse_buf) * (size_t)n);
		bv->count = (size_t)n;
		for (int i = 0; i < n; i++) {
			bv->buf[i].mem = iov[i].iov_base;
			bv->buf[i].size = iov[i].iov_len;
		}
		fuse_reply_data(req, bv, FUSE_BUF_SPLICE_MOVE);
		return;
	}
	fuse_reply_iov(req, iov, n);
}

static void nf_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)fi;
	if (ino != FUSE_ROOT_ID) {
		fuse_reply_err(req, ENOTDIR);
		return;
	}
	char buf[512];
	size_t n = 0;
	struct stat st;
	memset(&st, 0, sizeof(st));
	if (off < 1) {
		st.st_ino = FILE_INO;
		st.st_mode = S_IFREG;
		n += fuse_add_direntry(req, buf + n, sizeof(buf) - n, "data", &st, 1);
	}
	fuse_reply_buf(req, buf, n < size ? n : size);
}

static const struct fuse_lowlevel_ops nf_ops = {
	.init = nf_init,
	.lookup = nf_lookup,
	.getattr = nf_getattr,
	.open = nf_open,
	.read = nf_read,
	.readdir = nf_readdir,
};

/* Raise the mount's bdi read_ahead_kb to 1024 (as ckptfs's read_ahead_kb
 * default does), shortly after INIT (which lowers it to max_readahead). */
static void *read_ahead_thread(void *arg)
{
	const char *mnt = arg;
	for (int i = 0; i < 3; i++) {
		usleep(100000);
		struct stat st;
		char path[128];
		/* stat() of the mountpoint asks this daemon: fine here, its
		 * loop is running by now. */
		if (stat(mnt, &st) != 0)
			continue;
		snprintf(path, sizeof(path), "/sys/class/bdi/%u:%u/read_ahead_kb", major(st.st_dev),
			 minor(st.st_dev));
		int fd = open(path, O_WRONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		if (write(fd, "1024", 4) != 4)
			fprintf(stderr, "null_fuse: cannot set %s\n", path);
		close(fd);
	}
	return NULL;
}

int main(int argc, char *argv[])
{
	struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
	struct fuse_cmdline_opts cl;
	if (fuse_opt_parse(&args, &o, nf_spec, NULL) == -1 || fuse_parse_cmdline(&args, &cl) != 0)
		return 1;
	if (!cl.mountpoint) {
		fprintf(stderr,
			"usage: %s MOUNTPOINT [-o size=BYTES] [-o buf=BYTES] [-o direct_io] [-o splice] "
			"[-o piece=N [-o copy]] [-o file=PATH [-o mmap]] [-o ready_fd=FD]\n",
			argv[0]);
		return 1;
	}
	if (o.size)
		file_size = strtoull(o.size, NULL, 0);
	if (o.file) {
		backing_fd = open(o.file, O_RDONLY | O_CLOEXEC);
		struct stat bst;
		if (backing_fd < 0 || fstat(backing_fd, &bst) != 0) {
			fprintf(stderr, "null_fuse: cannot open %s\n", o.file);
			return 1;
		}
		file_size = (uint64_t)bst.st_size;
		if (o.mmap) {
			void *m = mmap(NULL, file_size, PROT_READ, MAP_SHARED | MAP_POPULATE, backing_fd, 0);
			if (m == MAP_FAILED) {
				fprintf(stderr, "null_fuse: cannot map %s\n", o.file);
				return 1;
			}
			backing_map = m;
		}
	}
	if (o.buf)
		buf_bytes = strtoull(o.buf, NULL, 0);
	if (buf_bytes < ((size_t)1 << 20) || buf_bytes % 4096) {
		fprintf(stderr, "null_fuse: buf must be a multiple of 4096, at least 1 MiB\n");
		return 1;
	}
	pattern = aligned_alloc(4096, buf_bytes);
	if (!pattern)
		return 1;
	for (size_t i = 0; i < buf_bytes; i++)
		pattern[i] = (unsigned char)(i * 131u + (i >> 12));
	int ret = 1;
	struct fuse_session *se = fuse_session_new(&args, &nf_ops, sizeof(nf_ops), NULL);
	if (!se)
		goto out;
	if (fuse_set_signal_handlers(se) != 0 || fuse_session_mount(se, cl.mountpoint) != 0)
		goto out_se;
	pthread_t th;
	if (pthread_create(&th, NULL, read_ahead_thread, cl.mountpoint) == 0)
		pthread_detach(th);
	if (o.ready_fd > 0) {
		if (write(o.ready_fd, "s", 1) != 1)
			fprintf(stderr, "null_fuse: cannot write ready_fd\n");
		close(o.ready_fd);
	}
	struct fuse_loop_config *lc = fuse_loop_cfg_create();
	fuse_loop_cfg_set_clone_fd(lc, cl.clone_fd);
	fuse_loop_cfg_set_max_threads(lc, cl.max_threads > 0 ? cl.max_threads : 16);
	ret = fuse_session_loop_mt(se, lc) < 0 ? 1 : 0;
	fuse_loop_cfg_destroy(lc);
	fuse_session_unmount(se);
	fuse_remove_signal_handlers(se);
out_se:
	fuse_session_destroy(se);
out:
	free(cl.mountpoint);
	fuse_opt_free_args(&args);
	free(pattern);
	free(o.size);
	free(o.file);
	free(o.buf);
	if (backing_fd >= 0)
		close(backing_fd);
	return ret;
}
