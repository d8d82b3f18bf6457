/*
 * fuse_wire.h - the few structures of the FUSE protocol that the daemon
 * and tools/fuse_caps read or amend themselves, around libfuse: the
 * request and reply headers and INIT's arguments up to flags2 (7.36), as
 * the kernel's include/uapi/linux/fuse.h lays them out.  (The system's
 * <linux/fuse.h> may be older than the running kernel.)
 */
#ifndef CKFS_FUSE_WIRE_H
#define CKFS_FUSE_WIRE_H

#include <stdint.h>

enum { FUSE_WIRE_OP_INIT = 26 };
#define FUSE_WIRE_INIT_EXT (1u << 30)
/* bits 32-63 travel in flags2, shifted down by 32 */
#define FUSE_WIRE_INIT2_DIRECT_IO_ALLOW_MMAP (1u << (36 - 32))

struct fuse_wire_in_header {
	uint32_t len, opcode;
	uint64_t unique, nodeid;
	uint32_t uid, gid, pid;
	uint16_t total_extlen, padding;
};
struct fuse_wire_init_in { /* flags2 from 7.36 on, with FUSE_WIRE_INIT_EXT */
	uint32_t major, minor, max_readahead, flags, flags2;
};
struct fuse_wire_out_header {
	uint32_t len;
	int32_t error;
	uint64_t unique;
};
struct fuse_wire_init_out { /* up to flags2 (7.36) */
	uint32_t major, minor, max_readahead, flags;
	uint16_t max_background, congestion_threshold;
	uint32_t max_write, time_gran;
	uint16_t max_pages, map_alignment;
	uint32_t flags2;
};

#endif
