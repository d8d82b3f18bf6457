/*
 * fuse_caps - what this kernel's FUSE offers a server, read from the
 * kernel's own INIT request (no libfuse in between).
 *
 *   fuse_caps [MOUNTPOINT]        (root; default: a fresh folder under /tmp)
 *
 * Opens /dev/fuse, mounts it read-only on MOUNTPOINT, reads the first
 * request (FUSE_INIT: protocol version, max_readahead, flags and, from
 * protocol 7.36 on, flags2), answers it with an error so that the kernel
 * gives up the connection, detaches the mount and prints every flag the
 * kernel set, by name.  Bits 32-63 (flags2) are marked: libfuse 3.14's
 * fuse_conn_info.want is 32 bits wide, so a daemon built on it cannot
 * ask for them (docs/benchmarks.md, "What this kernel's FUSE offers").
 * Exit 0 when the INIT request was read, 1 otherwise.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../fs/fuse_wire.h"

/* Init flag bits, as numbered by the kernel's uapi header up to 7.44. */
static const char *const flag_names[64] = {
	[0] = "ASYNC_READ",
	[1] = "POSIX_LOCKS",
	[2] = "FILE_OPS",
	[3] = "ATOMIC_O_TRUNC",
	[4] = "EXPORT_SUPPORT",
	[5] = "BIG_WRITES",
	[6] = "DONT_MASK",
	[7] = "SPLICE_WRITE",
	[8] = "SPLICE_MOVE",
	[9] = "SPLICE_READ",
	[10] = "FLOCK_LOCKS",
	[11] = "HAS_IOCTL_DIR",
	[12] = "AUTO_INVAL_DATA",
	[13] = "DO_READDIRPLUS",
	[14] = "READDIRPLUS_AUTO",
	[15] = "ASYNC_DIO",
	[16] = "WRITEBACK_CACHE",
	[17] = "NO_OPEN_SUPPORT",
	[18] = "PARALLEL_DIROPS",
	[19] = "HANDLE_KILLPRIV",
	[20] = "POSIX_ACL",
	[21] = "ABORT_ERROR",
	[22] = "MAX_PAGES",
	[23] = "CACHE_SYMLINKS",
	[24] = "NO_OPENDIR_SUPPORT",
	[25] = "EXPLICIT_INVAL_DATA",
	[26] = "MAP_ALIGNMENT",
	[27] = "SUBMOUNTS",
	[28] = "HANDLE_KILLPRIV_V2",
	[29] = "SETXATTR_EXT",
	[30] = "INIT_EXT",
	[31] = "INIT_RESERVED",
	[32] = "SECURITY_CTX",
	[33] = "HAS_INODE_DAX",
	[34] = "CREATE_SUPP_GROUP",
	[35] = "HAS_EXPIRE_ONLY",
	[36] = "DIRECT_IO_ALLOW_MMAP",
	[37] = "PASSTHROUGH",
	[38] = "NO_EXPORT_SUPPORT",
	[39] = "HAS_RESEND",
	[40] = "ALLOW_IDMAP",
	[41] = "OVER_IO_URING",
	[42] = "REQUEST_TIMEOUT",
};

int main(int argc, char **argv)
{
	char tmpl[] = "/tmp/fuse_caps.XXXXXX";
	const char *mnt = argc > 1 ? argv[1] : mkdtemp(tmpl);
	int made = argc <= 1;
	if (!mnt) {
		perror("fuse_caps: mkdtemp");
		return 1;
	}
	int fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		perror("fuse_caps: /dev/fuse");
		return 1;
	}
	char opts[128];
	snprintf(opts, sizeof(opts), "fd=%d,rootmode=40000,user_id=0,group_id=0", fd);
	if (mount("fuse_caps", mnt, "fuse.fuse_caps", MS_NOSUID | MS_NODEV | MS_RDONLY, opts) != 0) {
		perror("fuse_caps: mount");
		return 1;
	}
	/* the kernel's read of a request needs a buffer of at least 8 KiB */
	static uint8_t buf[1 << 17];
	ssize_t n = read(fd, buf, sizeof(buf));
	int rc = 1;
	const struct fuse_wire_in_header *h = (const void *)buf;
	if (n >= (ssize_t)(sizeof(*h) + offsetof(struct fuse_wire_init_in, flags2)) &&
	    h->opcode == FUSE_WIRE_OP_INIT) {
		const struct fuse_wire_init_in *in = (const void *)(buf + sizeof(*h));
		int ext = in->minor >= 36 && n >= (ssize_t)(sizeof(*h) + sizeof(struct fuse_wire_init_in));
		uint64_t flags = in->flags | (ext ? (uint64_t)in->flags2 << 32 : 0);
		printf("kernel FUSE protocol %" PRIu32 ".%" PRIu32 ", max_readahead %" PRIu32 " bytes\n",
		       in->major, in->minor, in->max_readahead);
		printf("flags offered: 0x%016" PRIx64 "\n", flags);
		for (int b = 0; b < 64; b++) {
			if (!(flags >> b & 1))
				continue;
			if (flag_names[b])
				printf("  bit %2d  %-22s%s\n", b, flag_names[b],
				       b >= 32 ? "  (flags2: not in libfuse 3.14's 32-bit want)" : "");
			else
				printf("  bit %2d  (unknown to this tool)\n", b);
		}
		rc = 0;
		/* refuse the connection: the mount then fails every request */
		struct fuse_wire_out_header oh = { sizeof(oh), -EPROTO, h->unique };
		if (write(fd, &oh, sizeof(oh)) < 0) {
			/* nothing to do: the detach below ends it either way */
		}
	} else {
		fprintf(stderr, "fuse_caps: no INIT request (read %zd bytes: %s)\n", n,
			n < 0 ? strerror(errno) : "short");
	}
	if (umount2(mnt, MNT_DETACH) != 0)
		perror("fuse_caps: umount");
	close(fd);
	if (made)
		rmdir(mnt);
	return rc;
}
