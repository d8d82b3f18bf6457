/*
 * ops.c - one handler per FUSE low-level operation.  libckpt returns
 * negative errno; every error reply goes through reply_err() (the one
 * fuse_reply_err call), which checks it is one.
 * Every handler replies exactly once on every path.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <stdio.h>
#include <fcntl.h>
#include <pthread.h>

#include "ckfs.h"

static struct ckfs *fs_of(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

/* Every attribute reply goes through here: owner from -o uid=,gid= (else
 * the mounting user), modes 0777 for directories and 0666 for files less
 * the umask (-o umask=, default 022); the view's own modes when none. */
static void to_stat(const struct ckfs *fs, const ckpt_attr *a, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = a->ino;
	unsigned mode = a->mode;
	if (fs->have_umask && !a->is_link)
		mode = (a->is_dir ? 0777u : 0666u) & ~fs->umask_bits;
	st->st_mode = (a->is_link ? S_IFLNK : a->is_dir ? S_IFDIR : S_IFREG) | mode;
	st->st_uid = fs->show_uid;
	st->st_gid = fs->show_gid;
	st->st_nlink = a->nlink;
	st->st_size = (off_t)a->size;
	st->st_blksize = 1 << 20;
	st->st_blocks = (blkcnt_t)((a->size + 511) / 512);
	st->st_mtim.tv_sec = a->mtime_ns / 1000000000;
	st->st_mtim.tv_nsec = a->mtime_ns % 1000000000;
	st->st_ctim = st->st_mtim;
	st->st_atim = st->st_mtim;
}

/* The error funnel: rc is 0 (success, for the replies that carry no data)
 * or a negative errno from libckpt, and the kernel gets -rc.  Anything
 * else (a positive value, or one beyond the errno range) is a bug upstream:
 * it is logged once per call and answered EIO, never passed on raw. */
static void reply_err(fuse_req_t req, int rc)
{
	if (rc > 0 || rc < -4095) {
		ckpt_log(CKPT_LOG_ERR, "internal error: reply with %d, not a negative errno: EIO instead",
			 rc);
		rc = -EIO;
	}
	fuse_reply_err(req, -rc);
}

/* Under allow_other, only the mounting user may change anything (create
 * or commit steps, write arrays, set xattrs) unless -o allow_other_writes:
 * otherwise any local user could commit a step a training job restores. */
static int may_write(fuse_req_t req)
{
	const struct ckfs *fs = fuse_req_userdata(req);
	const struct fuse_ctx *c = fuse_req_ctx(req);
	if (fs->opts.allow_other_writes || c->uid == fs->owner_uid)
		return 1;
	ckpt_log(CKPT_LOG_WARN,
		 "%s: write request from uid %u refused (only uid %u writes; see allow_other_writes)",
		 fs->opts.source, (unsigned)c->uid, (unsigned)fs->owner_uid);
	reply_err(req, -EACCES);
	return 0;
}

static double ttl(const struct ckfs *fs, const ckpt_attr *a)
{
	return a->immutable ? fs->ttl_immutable : 0.0;
}

/* Write-only handles of pending files bypass the page cache: through the
 * cache, a write that does not start on a page boundary (every .npy write
 * after its header) reaches the daemon as one request per 4 KiB page;
 * direct I/O passes it on in 1 MiB requests.  Handles that may mmap the
 * file (read-write, e.g. np.lib.format.open_memmap) keep the page cache. */
static int write_only(const struct fuse_file_info *fi)
{
	return (fi->flags & O_ACCMODE) == O_WRONLY;
}

static void fill_entry(const struct ckfs *fs, const ckpt_attr *a, struct fuse_entry_param *e)
{
	memset(e, 0, sizeof(*e));
	e->ino = a->ino;
	e->generation = a->generation;
	to_stat(fs, a, &e->attr);
	e->attr_timeout = ttl(fs, a);
	/* A transient node (slice name) is freed once the kernel forgets it
	 * (inval.c): never cache its entry. */
	e->entry_timeout = a->transient ? 0.0 : ttl(fs, a);
}

/* Replies come from a per-thread buffer, grown as needed and reused, so no
 * request allocates: a fresh buffer per reply costs an mmap/munmap pair and
 * a page fault for every 4 KiB of a large reply. */
static char *thread_buf(size_t need)
{
	return ckpt_tls_buf(CKPT_TLS_REPLY, need);
}

static void ckfs_op_init(void *userdata, struct fuse_conn_info *conn)
{
	struct ckfs *fs = userdata;
	/* Zero-message opendir: directories need no per-open state here, and
	 * OPENDIR + RELEASEDIR would double the round trips of a tree walk. */
	fs->no_opendir = (conn->capable & FUSE_CAP_NO_OPENDIR_SUPPORT) != 0;
	conn->max_background = 64;
	conn->congestion_threshold = 48;
	if (conn->capable & FUSE_CAP_EXPORT_SUPPORT)
		conn->want |= FUSE_CAP_EXPORT_SUPPORT;
	fs->init_done = 1;
}

static void ckfs_op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct ckfs *fs = fs_of(req);
	ckpt_attr a;
	int rc = ckpt_view_lookup(fs->view, parent, name, &a);
	if (rc < 0) {
		reply_err(req, rc);
		return;
	}
	struct fuse_entry_param e;
	fill_entry(fs, &a, &e);
	if (fuse_reply_entry(req, &e) != 0)
		ckpt_view_forget(fs->view, a.ino, 1); /* the kernel never got it */
	else if (a.transient)
		ckfs_inval_kick(); /* so that the kernel forgets it soon */
}

/* Transient nodes (slice names) are freed when their count drops to 0;
 * the nodes of a step pruned from a live root when the count of all of
 * them does; the others live as long as the view. */
static void ckfs_op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	ckpt_view_forget(fs_of(req)->view, ino, nlookup);
	fuse_reply_none(req);
}

static void ckfs_op_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets)
{
	struct ckfs *fs = fs_of(req);
	for (size_t i = 0; i < count; i++)
		ckpt_view_forget(fs->view, forgets[i].ino, forgets[i].nlookup);
	fuse_reply_none(req);
}

/* Reply with ino's attributes, or with rc when it is an error already. */
static void reply_attr(fuse_req_t req, fuse_ino_t ino, int rc)
{
	struct ckfs *fs = fs_of(req);
	ckpt_attr a;
	if (rc == 0)
		rc = ckpt_view_getattr(fs->view, ino, &a);
	if (rc < 0) {
		reply_err(req, rc);
		return;
	}
	struct stat st;
	to_stat(fs, &a, &st);
	fuse_reply_attr(req, &st, ttl(fs, &a));
}

static void ckfs_op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)fi;
	reply_attr(req, ino, 0);
}

static void ckfs_op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct ckfs *fs = fs_of(req);
	if (fs->no_opendir) {
		reply_err(req, -ENOSYS); /* the kernel stops sending OPENDIR */
		return;
	}
	ckpt_attr a;
	int rc = ckpt_view_getattr(fs->view, ino, &a);
	if (rc < 0) {
		reply_err(req, rc);
		return;
	}
	if (!a.is_dir) {
		reply_err(req, -ENOTDIR);
		return;
	}
	fi->cache_readdir = a.immutable;
	fi->keep_cache = a.immutable;
	fuse_reply_open(req, fi);
}

/* The most bytes of entries one READDIR reply carries.  The kernel asks
 * for up to its max_pages (1 MiB here) per request; a reply may carry
 * less, and the kernel asks for the rest.  Filling 1 MiB buffers would
 * make each thread that lists a folder hold a 2 MiB reply buffer (the
 * reply buffer is a huge page past 64 KiB, tlsbuf.c): a tree walk of a
 * small checkpoint then cost the daemon 8-12 MiB, varying with how many
 * threads served it. */
#define READDIR_REPLY_MAX (64u << 10)

static void do_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, int plus)
{
	struct ckfs *fs = fs_of(req);
	if (size > READDIR_REPLY_MAX)
		size = READDIR_REPLY_MAX;
	char *buf = thread_buf(size);
	if (!buf) {
		reply_err(req, -ENOMEM);
		return;
	}
	size_t used = 0;
	for (uint64_t i = (uint64_t)off;; i++) {
		const char *name;
		ckpt_attr a;
		int rc;
		if (i < 2) {
			rc = ckpt_view_getattr(fs->view, ino, &a);
			name = i == 0 ? "." : "..";
		} else if (plus) {
			/* the kernel counts each entry of a READDIRPLUS reply as a
			 * lookup: so does libckpt (nodes of a pruned step are freed
			 * when those references are forgotten) */
			rc = ckpt_view_readdir_ref(fs->view, ino, i - 2, &name, &a);
		} else {
			rc = ckpt_view_readdir(fs->view, ino, i - 2, &name, &a);
		}
		if (rc < 0) {
			if (used) /* return what we have; the error shows next time */
				break;
			reply_err(req, rc);
			return;
		}
		if (rc == 0 && i >= 2)
			break;
		size_t n;
		if (plus) {
			struct fuse_entry_param e;
			fill_entry(fs, &a, &e);
			n = fuse_add_direntry_plus(req, buf + used, size - used, name, &e, (off_t)(i + 1));
			if (n > size - used && i >= 2)
				ckpt_view_forget(fs->view, a.ino, 1); /* not sent */
		} else {
			struct stat st;
			to_stat(fs, &a, &st);
			n = fuse_add_direntry(req, buf + used, size - used, name, &st, (off_t)(i + 1));
		}
		if (n > size - used)
			break;
		used += n;
	}
	fuse_reply_buf(req, buf, used);
}

static void ckfs_op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)fi;
	do_readdir(req, ino, size, off, 0);
}

static void ckfs_op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
				struct fuse_file_info *fi)
{
	(void)fi;
	do_readdir(req, ino, size, off, 1);
}

static void ckfs_op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct ckfs *fs = fs_of(req);
	ckpt_attr a;
	int rc = ckpt_view_getattr(fs->view, ino, &a);
	if (rc < 0) {
		reply_err(req, rc);
		return;
	}
	if (a.is_dir) {
		reply_err(req, -EISDIR);
		return;
	}
	int writing = (fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & O_TRUNC);
	if (writing && !may_write(req))
		return;
	if (writing && (rc = ckpt_view_check_writable(fs->view, ino)) < 0) {
		reply_err(req, rc);
		return;
	}
	if ((fi->flags & O_TRUNC) && (rc = ckpt_view_truncate(fs->view, ino, 0)) < 0) {
		reply_err(req, rc);
		return;
	}
	/* Revalidates the stored data behind the file: the kernel keeps its
	 * cached pages (warm re-reads never reach the daemon) unless they may be
	 * stale. */
	int changed = ckpt_view_open_check(fs->view, ino);
	if (changed < 0) {
		reply_err(req, changed);
		return;
	}
	fi->keep_cache = a.immutable && changed == 0;
	/* -o direct_read: replies go straight into the reader's buffer, not
	 * through the mount's page cache (one kernel copy less per byte), at
	 * the price of warm re-reads (each goes to the daemon's chunk cache),
	 * of one request per read() (tar's 10 KiB reads), and of shared mmap
	 * where the kernel does not grant DIRECT_IO_ALLOW_MMAP (devio.c asks).
	 * Not the default: docs/benchmarks.md, "The streaming path". */
	fi->direct_io = a.volatile_data || (writing && write_only(fi)) || (!writing && fs->opts.direct_read);
	fi->noflush = !writing;
	fuse_reply_open(req, fi);
}

#define READ_IOV_MAX 1023 /* + libfuse's header = IOV_MAX */

static void ckfs_op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)fi;
	struct ckfs *fs = fs_of(req);
	/* Straight from the decoded chunks where the layout allows it: one
	 * piece per contiguous run of a chunk (a 1 MiB read of an array in
	 * column chunks is one run per row and chunk).  libfuse adds the reply
	 * header to the iovec, and writev takes at most IOV_MAX pieces. */
	struct iovec iov[READ_IOV_MAX];
	ckpt_pin *pins[READ_IOV_MAX];
	int npins;
	int k = ckpt_view_read_iov(fs->view, ino, (uint64_t)off, size, iov, READ_IOV_MAX, pins, &npins);
	if (k >= 0) {
		fuse_reply_iov(req, iov, k);
		ckpt_view_unpin(fs->view, ino, pins, npins);
		return;
	}
	if (k != -ENOTSUP) {
		reply_err(req, k);
		return;
	}
	char *buf = thread_buf(size);
	if (!buf) {
		reply_err(req, -ENOMEM);
		return;
	}
	ssize_t n = ckpt_view_read(fs->view, ino, (uint64_t)off, size, buf);
	if (n < 0) {
		reply_err(req, (int)n);
		return;
	}
	fuse_reply_buf(req, buf, (size_t)n);
}

/* Reply to getxattr/listxattr: n bytes in buf, or the length when size is 0. */
static void reply_xattr(fuse_req_t req, ssize_t n, const char *buf, size_t size)
{
	if (n < 0)
		reply_err(req, (int)n);
	else if (size == 0)
		fuse_reply_xattr(req, (size_t)n);
	else
		fuse_reply_buf(req, buf, (size_t)n);
}

static void ckfs_op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
	char *buf = size ? thread_buf(size) : NULL;
	if (size && !buf) {
		reply_err(req, -ENOMEM);
		return;
	}
	reply_xattr(req, ckpt_view_getxattr(fs_of(req)->view, ino, name, buf, size), buf, size);
}

/* A root's `latest` symlink: its target (the newest committed step). */
static void ckfs_op_readlink(fuse_req_t req, fuse_ino_t ino)
{
	char *buf = thread_buf(4096);
	if (!buf) {
		reply_err(req, -ENOMEM);
		return;
	}
	ssize_t n = ckpt_view_readlink(fs_of(req)->view, ino, buf, 4096);
	if (n < 0)
		reply_err(req, (int)n);
	else
		fuse_reply_readlink(req, buf);
}

static void ckfs_op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	char *buf = size ? thread_buf(size) : NULL;
	if (size && !buf) {
		reply_err(req, -ENOMEM);
		return;
	}
	reply_xattr(req, ckpt_view_listxattr(fs_of(req)->view, ino, buf, size), buf, size);
}

/* statfs: a writable mount reports the file system SOURCE lives on (a
 * writer checking free space sees the truth); a read-only one reports the
 * checkpoint itself: its files' total size as used, nothing free. */
struct ro_size {
	uint64_t bytes, files;
};

static int add_size(void *ctx, const char *path, int depth, const ckpt_attr *a)
{
	(void)path;
	(void)depth;
	struct ro_size *t = ctx;
	t->files++;
	if (!a->is_dir)
		t->bytes += a->size;
	return 0;
}

static struct ckfs *ro_fs;
static struct ro_size ro_total;

static void ro_size_once(void)
{
	ckfs_walk(ro_fs->view, CKPT_ROOT_INO, "", 0, add_size, &ro_total);
}

static void ckfs_op_statfs(fuse_req_t req, fuse_ino_t ino)
{
	(void)ino;
	struct ckfs *fs = fs_of(req);
	struct statvfs s;
	memset(&s, 0, sizeof(s));
	if (fs->writable && statvfs(fs->opts.source, &s) == 0) {
		s.f_namemax = 255;
		fuse_reply_statfs(req, &s);
		return;
	}
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	ro_fs = fs;
	pthread_once(&once, ro_size_once);
	memset(&s, 0, sizeof(s));
	s.f_bsize = 4096;
	s.f_frsize = 4096;
	s.f_blocks = (ro_total.bytes + 4095) / 4096;
	s.f_files = ro_total.files;
	s.f_namemax = 255;
	fuse_reply_statfs(req, &s);
}

/* Namespace changes: libckpt decides (EROFS outside pending steps). */
static void reply_entry_or_err(fuse_req_t req, int rc, const ckpt_attr *a)
{
	if (rc < 0) {
		reply_err(req, rc);
		return;
	}
	struct fuse_entry_param e;
	fill_entry(fs_of(req), a, &e);
	fuse_reply_entry(req, &e);
}

static void ckfs_op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
	ckpt_view_set_caller(fuse_req_ctx(req)->pid);
	(void)mode;
	if (!may_write(req))
		return;
	ckpt_attr a;
	int rc = ckpt_view_mkdir(fs_of(req)->view, parent, name, &a);
	reply_entry_or_err(req, rc, &a);
}

static void ckfs_op_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
			   struct fuse_file_info *fi)
{
	ckpt_view_set_caller(fuse_req_ctx(req)->pid);
	(void)mode;
	struct ckfs *fs = fs_of(req);
	if (!may_write(req))
		return;
	ckpt_attr a;
	int rc = ckpt_view_create(fs->view, parent, name, &a);
	if (rc < 0) {
		reply_err(req, rc);
		return;
	}
	if ((fi->flags & O_TRUNC) && ckpt_view_is_writable(fs->view, a.ino) &&
	    (rc = ckpt_view_truncate(fs->view, a.ino, 0)) < 0 && a.size) {
		reply_err(req, rc);
		return;
	}
	struct fuse_entry_param e;
	fill_entry(fs, &a, &e);
	fi->keep_cache = a.immutable;
	fi->direct_io = write_only(fi) || a.volatile_data;
	fuse_reply_create(req, &e, fi);
}

static void ckfs_op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
			  struct fuse_file_info *fi)
{
	ckpt_view_set_caller(fuse_req_ctx(req)->pid);
	if (!may_write(req))
		return;
	ssize_t n = ckpt_view_write(fs_of(req)->view, ino, (uint64_t)off, buf, size,
				    (fi->flags & O_APPEND) ? CKPT_WRITE_APPEND : 0);
	if (n < 0)
		reply_err(req, (int)n);
	else
		fuse_reply_write(req, (size_t)n);
}

static void ckfs_op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	if (may_write(req))
		reply_err(req, ckpt_view_unlink(fs_of(req)->view, parent, name));
}

static void ckfs_op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	if (may_write(req))
		reply_err(req, ckpt_view_rmdir(fs_of(req)->view, parent, name));
}

static void ckfs_op_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
			   const char *newname, unsigned int flags)
{
	ckpt_view_set_caller(fuse_req_ctx(req)->pid);
	if (flags & ~(unsigned)RENAME_NOREPLACE) {
		reply_err(req, -EINVAL);
		return;
	}
	if (may_write(req))
		reply_err(req, ckpt_view_rename(fs_of(req)->view, parent, name, newparent, newname,
						(flags & RENAME_NOREPLACE) ? CKPT_RENAME_NOREPLACE : 0));
}

/* Only a size change of a pending file means anything; time updates are
 * accepted and ignored (touch, cp -p), and so are mode/owner changes on a
 * writable mount (cp -a, tar, rsync -a); a read-only mount refuses them. */
static void ckfs_op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
			    struct fuse_file_info *fi)
{
	(void)fi;
	struct ckfs *fs = fs_of(req);
	int rc = 0;
	if ((to_set & (FUSE_SET_ATTR_MODE | FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID | FUSE_SET_ATTR_SIZE)) &&
	    !may_write(req))
		return;
	if (to_set & (FUSE_SET_ATTR_MODE | FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID))
		rc = ckpt_view_setattr_meta(fs->view, ino);
	else if (to_set & FUSE_SET_ATTR_SIZE)
		rc = ckpt_view_truncate(fs->view, ino, (uint64_t)attr->st_size);
	reply_attr(req, ino, rc);
}

/* Pending data is made durable by the commit (documented); fsync has
 * nothing to add but must not claim failure. */
static void ckfs_op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	(void)ino;
	(void)datasync;
	(void)fi;
	reply_err(req, 0);
}

/* A close of a file opened for writing: the commit marker commits here
 * (ckpt_view_flush), and close(2) returns its result. */
static void ckfs_op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	ckpt_view_set_caller(fuse_req_ctx(req)->pid);
	(void)fi;
	reply_err(req, ckpt_view_flush(fs_of(req)->view, ino));
}

static void ckfs_op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value, size_t size,
			     int flags)
{
	(void)flags;
	if (may_write(req))
		reply_err(req, ckpt_view_setxattr(fs_of(req)->view, ino, name, value, size));
}

const struct fuse_lowlevel_ops ckfs_ops = {
	.init = ckfs_op_init,
	.lookup = ckfs_op_lookup,
	.forget = ckfs_op_forget,
	.forget_multi = ckfs_op_forget_multi,
	.getattr = ckfs_op_getattr,
	.readlink = ckfs_op_readlink,
	.setattr = ckfs_op_setattr,
	.opendir = ckfs_op_opendir,
	.readdir = ckfs_op_readdir,
	.readdirplus = ckfs_op_readdirplus,
	.open = ckfs_op_open,
	.read = ckfs_op_read,
	.getxattr = ckfs_op_getxattr,
	.listxattr = ckfs_op_listxattr,
	.setxattr = ckfs_op_setxattr,
	.statfs = ckfs_op_statfs,
	.mkdir = ckfs_op_mkdir,
	.create = ckfs_op_create,
	.unlink = ckfs_op_unlink,
	.rmdir = ckfs_op_rmdir,
	.rename = ckfs_op_rename,
	.write = ckfs_op_write,
	.fsync = ckfs_op_fsync,
	.flush = ckfs_op_flush,
};
