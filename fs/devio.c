/*
 * devio.c - the session's reads and writes of /dev/fuse, through libfuse's
 * custom I/O hook, so that the reply to the kernel's INIT request can ask
 * for what libfuse 3.14 cannot: the flags of the protocol's second word
 * (flags2, bits 32-63; fuse_conn_info.want is 32 bits wide).  One is asked
 * for, when the kernel offers it: DIRECT_IO_ALLOW_MMAP (protocol 7.39),
 * which lets files opened with FOPEN_DIRECT_IO (-o direct_read) be mapped
 * shared as well (without it mmap(MAP_SHARED) fails with ENODEV).
 *
 * Every other request and reply passes through unchanged: read(2),
 * writev(2) and splice(2) on the descriptor libfuse hands over, as libfuse
 * itself would make them.  Installed only with -o direct_read.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>
#include <unistd.h>

#include "ckfs.h"
#include "fuse_wire.h"

/* The INIT request seen, until its reply went out: its unique (0: none
 * pending) and the kernel's second flag word (0 unless it sent FUSE_WIRE_INIT_EXT).
 * Atomics: the reply may leave on another thread than the one that read
 * the request. */
static _Atomic uint64_t init_unique;
static _Atomic uint32_t init_offer2;

static ssize_t dev_read(int fd, void *buf, size_t len, void *userdata)
{
	(void)userdata;
	ssize_t n = read(fd, buf, len);
	const size_t hl = sizeof(struct fuse_wire_in_header);
	if (n >= (ssize_t)(hl + offsetof(struct fuse_wire_init_in, flags2))) {
		const struct fuse_wire_in_header *h = buf;
		const struct fuse_wire_init_in *in = (const void *)((const char *)buf + hl);
		if (h->opcode == FUSE_WIRE_OP_INIT) {
			/* flags2 exists from 7.36 on, and counts with FUSE_WIRE_INIT_EXT */
			int ext = in->minor >= 36 && (in->flags & FUSE_WIRE_INIT_EXT) &&
				  n >= (ssize_t)(hl + sizeof(struct fuse_wire_init_in));
			atomic_store(&init_offer2, ext ? in->flags2 : 0);
			atomic_store(&init_unique, h->unique);
		}
	}
	return n;
}

/* The INIT reply, once: ask for DIRECT_IO_ALLOW_MMAP when offered, and say
 * so in the log either way. */
static void amend_init(const struct iovec *iov, int count)
{
	if (count < 2 || iov[0].iov_len < sizeof(struct fuse_wire_out_header))
		return;
	const struct fuse_wire_out_header *oh = iov[0].iov_base;
	uint64_t want = atomic_load(&init_unique);
	if (!want || oh->unique != want || !atomic_compare_exchange_strong(&init_unique, &want, 0))
		return;
	uint32_t offer2 = atomic_load(&init_offer2);
	if (oh->error != 0 || iov[1].iov_len < offsetof(struct fuse_wire_init_out, flags2) + sizeof(uint32_t))
		return;
	struct fuse_wire_init_out *out = iov[1].iov_base;
	if (offer2 & FUSE_WIRE_INIT2_DIRECT_IO_ALLOW_MMAP) {
		out->flags |= FUSE_WIRE_INIT_EXT;
		out->flags2 |= FUSE_WIRE_INIT2_DIRECT_IO_ALLOW_MMAP;
		ckpt_log(CKPT_LOG_INFO, "direct_read: the kernel maps direct-I/O files shared too "
					"(DIRECT_IO_ALLOW_MMAP)");
	} else {
		ckpt_log(CKPT_LOG_INFO,
			 "direct_read: this kernel does not map direct-I/O files shared "
			 "(no DIRECT_IO_ALLOW_MMAP): mmap(MAP_SHARED) of a file fails with ENODEV");
	}
}

static ssize_t dev_writev(int fd, struct iovec *iov, int count, void *userdata)
{
	(void)userdata;
	if (atomic_load_explicit(&init_unique, memory_order_relaxed))
		amend_init(iov, count);
	return writev(fd, iov, count);
}

static ssize_t dev_splice_receive(int fdin, off_t *offin, int fdout, off_t *offout, size_t len,
				  unsigned int flags, void *userdata)
{
	(void)userdata;
	return splice(fdin, offin, fdout, offout, len, flags);
}

static ssize_t dev_splice_send(int fdin, off_t *offin, int fdout, off_t *offout, size_t len,
			       unsigned int flags, void *userdata)
{
	(void)userdata;
	return splice(fdin, offin, fdout, offout, len, flags);
}

int ckfs_devio_install(struct fuse_session *se)
{
	static const struct fuse_custom_io io = {
		.writev = dev_writev,
		.read = dev_read,
		.splice_receive = dev_splice_receive,
		.splice_send = dev_splice_send,
	};
	int rc = fuse_session_custom_io(se, &io, fuse_session_fd(se));
	return rc < 0 ? rc : rc > 0 ? -EINVAL : 0;
}
