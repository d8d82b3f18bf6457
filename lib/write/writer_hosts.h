/*
 * writer_hosts.h - several hosts (daemons) writing one step into one shared
 * root folder, with one commit.  The shared folder is the only channel: no
 * sockets, no coordinator process.  docs/format.md ("Multi-host writes")
 * describes the files; this header states the contracts.
 *
 * Every host runs its own daemon over the same root with the same
 * process_count N and its own process_index I; host 0 is the primary.
 * With count <= 1 every function here is the plain writer call.
 *
 * Folders of step S (all below the shared root):
 *   S.orbax-checkpoint-tmp/         the primary's pending step (the step itself)
 *   S.orbax-checkpoint-tmp.hosts/   coordination folder (Orbax and ckptfs
 *                                   ignore it: the name holds the tmp infix)
 *     attempt                       id of the primary's current attempt
 *     decl/<item>/<param>           one declaration record per array (JSON)
 *     h<I>.orbax-checkpoint-tmp/    host I's staging step (I >= 1): its shard
 *                                   files, written by host I only, and `parts`
 *                                   (the chunks host I wrote only partly)
 *     done.<I>                      host I is done: what it wrote, where
 *     error                         the primary's failed commit attempt
 *
 * Rule: no two hosts ever write the same file.  A host writes only its own
 * staging folder, its done record, and declaration records it creates with
 * a no-replace link (first one wins; the others compare against it).  The
 * primary alone writes the step folder, the attempt and error records, and
 * removes the coordination folder after the commit.
 *
 * Thread-safety: as writer.h.  ckpt_hosts_commit blocks (polling the shared
 * folder) for up to the timeout; the caller holds the step exclusively.
 */
#ifndef CKPT_WRITER_HOSTS_H
#define CKPT_WRITER_HOSTS_H

#include "writer.h"

#define CKPT_HOSTS_SUFFIX ".orbax-checkpoint-tmp.hosts"
#define CKPT_HOSTS_MAX 4096
#define CKPT_HOSTS_DEFAULT_TIMEOUT 600

typedef struct ckpt_hosts_opts {
	int index; /* this host, 0 = primary */
	int count; /* hosts that write each step; <= 1: a single host */
	unsigned timeout_s; /* commit: how long the primary waits for the others (0: default 600) */
} ckpt_hosts_opts;

/* Begin step `step_name` on this host.  Primary: ckpt_step_begin (stale tmp
 * folder removed as usual), then a new attempt id; done and error records
 * of earlier attempts are removed.  Other hosts: a staging step
 * h<I>.orbax-checkpoint-tmp in the coordination folder (a stale staging
 * folder of this host is removed).  -EEXIST when <root>/<step_name> exists;
 * -EINVAL for bad options; as ckpt_step_begin otherwise. */
int ckpt_hosts_step_begin(const char *root, const char *step_name, const ckpt_writer_opts *o,
			  const ckpt_hosts_opts *h, ckpt_step **out);

/* ckpt_step_add_array, plus on a multi-host step: an existing declaration
 * record for the same param must agree (keys, dtype, shape, chunk and shard
 * shapes), else -EINVAL (logged, nothing declared); without one this
 * host's declaration is published. */
int ckpt_hosts_declare(ckpt_step *st, const char *item, const char *const *keypath, const int *key_types,
		       int depth, ckpt_dtype dtype, int rank, const uint64_t *shape, ckpt_warray **out);

/* Declare locally the array another host declared at item/keypath, from its
 * record.  0 and *out; -ENOENT when there is no record (or a single-host
 * step); -EINVAL when the record is unusable or disagrees. */
int ckpt_hosts_adopt(ckpt_step *st, const char *item, const char *const *keypath, int depth,
		     ckpt_warray **out);

/* Commit.  Single host: ckpt_step_commit.  Host I >= 1: make its part
 * durable (shard files, partial chunks), record done.<I>, then wait until
 * <root>/<final_name> exists (0) or the primary's error record names this
 * host's done record (its errno); gives up with -ETIMEDOUT after twice the
 * timeout plus 10 s.  Primary: wait for done records of every other host
 * of this attempt (-ETIMEDOUT after the timeout, naming the missing
 * indices in the log and the error record), merge them into its step
 * (declarations, stored chunks, partial chunks), then ckpt_step_commit and
 * remove the coordination folder.  On failure the step stays pending on
 * every host; the consumed done records are removed, so the next commit
 * call of each host starts over. */
int ckpt_hosts_commit(ckpt_step *st, const char *final_name);

/* 1 on a step begun with count > 1. */
int ckpt_hosts_is_multi(const ckpt_step *st);

#endif
