/*
 * upload.h - writing objects into an object store (s3://, gs://): single
 * PUTs for small objects, multipart uploads for large ones, deletes, and the
 * cleanup of multipart uploads left behind by a crash.
 *
 * The protocol a writer follows for a new step on an object store (Orbax's
 * commit-file protocol, as Orbax uses it on gs://): write every data and
 * metadata object of the step under its final name, then
 * ckpt_store_put(..., "STEP/commit_success.txt", ..., CKPT_PUT_CREATE_ONLY)
 * last; a step folder without that object is unfinished for every reader.
 * An aborted save aborts its multipart uploads and never writes the marker.
 *
 * Keys are store keys (relative to the store's root, sub-stores included).
 * Folder stores answer -EROFS (the local writer owns local files).
 * Thread-safety: every call may run concurrently; one upload's parts may be
 * sent from several threads at once (distinct part numbers).
 * Bodies are hashed (SHA-256, signed) before sending; nothing is logged
 * but the object name and the status.
 */
#ifndef CKPT_UPLOAD_H
#define CKPT_UPLOAD_H

#include <stddef.h>

#include "store.h"

/* -EEXIST when the object exists (s3://: If-None-Match: *; gs://:
 * x-goog-if-generation-match: 0) */
#define CKPT_PUT_CREATE_ONLY 1

#define CKPT_UPLOAD_MIN_PART ((size_t)5 << 20) /* every part but the last, S3's minimum */
#define CKPT_UPLOAD_MAX_PARTS 10000u
/* The part size of ckpt_store_upload_tree and ckpt_bg_upload: each of their
 * workers holds one buffer of this size, so their memory is threads * it. */
#define CKPT_UPLOAD_PART ((size_t)8 << 20)

typedef struct ckpt_upload ckpt_upload;
typedef struct ckpt_bg_upload ckpt_bg_upload;

/* One PUT of len bytes (at most 5 GiB).  0, -EEXIST (create-only and the
 * object exists), -EACCES, -EIO (logged), -EROFS (not an object store). */
int ckpt_store_put(ckpt_store *s, const char *key, const void *buf, size_t len, int flags);

/* What is known of a commit marker after ckpt_store_put_marker. */
enum ckpt_marker_state {
	CKPT_MARKER_LANDED, /* the store holds the marker with these bytes: committed */
	CKPT_MARKER_ABSENT, /* the store does not hold it: nothing was committed */
	CKPT_MARKER_OTHERS, /* it held one before (a 412 with every answer certain), or other bytes */
	CKPT_MARKER_UNKNOWN, /* no answer settles it (the store keeps failing) */
};

/* The create-only PUT of a commit marker (at most 1 MiB), whose outcome is
 * found out before anything is decided: when an attempt may have landed
 * without our knowing (no answer, reset, 5xx) and the PUT then fails or
 * gets a 412, one GET says whether the store holds these bytes.  settle: an
 * earlier call for the same marker ended CKPT_MARKER_UNKNOWN, so a 412 is
 * found out too.  Returns a state (>= 0; LANDED and UNKNOWN after an
 * uncertain answer are logged) or -EROFS, -EINVAL, -EFBIG, -ENOMEM. */
int ckpt_store_put_marker(ckpt_store *s, const char *key, const void *buf, size_t len, int settle);

/* DELETE one object (absent is success). */
int ckpt_store_delete(ckpt_store *s, const char *key);

/* Start a multipart upload of `key`. */
int ckpt_upload_begin(ckpt_store *s, const char *key, ckpt_upload **out);
/* Send part `part` (1..10000) of len bytes; re-sending a part replaces it.
 * Every part except the highest-numbered must be >= CKPT_UPLOAD_MIN_PART
 * (checked by ckpt_upload_complete, which then refuses with -EINVAL). */
int ckpt_upload_part(ckpt_upload *u, unsigned part, const void *buf, size_t len);
/* Complete (parts 1..N, all present) and free u.  On any error the upload
 * is aborted and u freed as well. */
int ckpt_upload_complete(ckpt_upload *u);
/* Abort (best effort, logged on failure) and free u.  NULL is a no-op. */
void ckpt_upload_abort(ckpt_upload *u);

/* Abort every multipart upload whose key starts with store key `prefix`
 * (left by a crashed writer).  Returns how many were aborted, or -errno
 * (-ENOTSUP when the server cannot list uploads). */
int ckpt_store_abort_stale_uploads(ckpt_store *s, const char *prefix);

/* Upload the finished step folder `local_dir` (a local folder holding
 * commit_success.txt) as the objects below store key `prefix`, in Orbax's
 * commit order: every data file (parallel; files over 8 MiB as multipart
 * uploads whose parts go in parallel), then every metadata file (zarr.json,
 * .zarray, _METADATA, _sharding, _CHECKPOINT_METADATA, item markers), then
 * prefix/commit_success.txt alone (ckpt_store_put_marker).  `threads`
 * requests at once, each holding one 8 MiB buffer.
 *
 * The marker is the commit, and its outcome is known before anything is
 * deleted:
 *   - a failure before the marker: nothing more is sent, the multipart
 *     uploads begun are aborted and the objects already sent are deleted
 *     again (best effort: without the marker what stays is an unfinished
 *     step for every reader);
 *   - the marker landed (answered, or found after an uncertain answer): 0;
 *   - it did not land: the marker is deleted first (in case a lost attempt
 *     lands), then what was sent; the PUT's error (-EIO);
 *   - someone else's marker: -EEXIST, every object kept;
 *   - nothing settles it: -EINPROGRESS, every object kept (logged); call
 *     again with settle 1 (the same folder) to find out, which sends the
 *     objects again and takes a 412 as "find out".
 * Other errors: -EINVAL (no marker in local_dir, a file that is not
 * regular), -EFBIG, -EROFS (not an object store). */
int ckpt_store_upload_tree(ckpt_store *s, const char *local_dir, const char *prefix, unsigned threads);

/* The same, for a folder part of whose data files a ckpt_bg_upload (drained,
 * same local folder contents and prefix) already sent: those are skipped,
 * the rest go as above; on failure the objects `done` sent are deleted too.
 * done NULL: ckpt_store_upload_tree.  settle: see above. */
int ckpt_store_upload_tree_rest(ckpt_store *s, const char *local_dir, const char *prefix, unsigned threads,
				ckpt_bg_upload *done, int settle);

/*
 * Background uploads of a step's data files while the step is still being
 * written: a file that is complete is queued with ckpt_bg_upload_file and
 * sent (PUT, or a multipart upload over 8 MiB) by one of `threads` workers
 * (at most the store's connections), each holding one 8 MiB buffer.  At
 * commit the writer drains it and calls ckpt_store_upload_tree_rest, which
 * sends only what is left.  A file changed after it was queued is marked
 * with ckpt_bg_upload_stale: its object no longer counts (sent again at
 * commit, or when queued again).  Upload errors are remembered and
 * reported by the drain.  Thread-safety: every call but _free may run
 * concurrently; the calls take only the uploader's own (leaf) mutex and
 * never wait for the network.
 */

/* local_dir/REL is sent as prefix/REL.  0, -ENOMEM, -EAGAIN (no thread). */
int ckpt_bg_upload_new(ckpt_store *s, const char *local_dir, const char *prefix, unsigned threads,
		       ckpt_bg_upload **out);
/* Queue rel (relative to local_dir); after a drain it is ignored (the
 * commit sends it).  0 or -ENOMEM. */
int ckpt_bg_upload_file(ckpt_bg_upload *u, const char *rel);
/* rel changed since it was queued: what was or is being sent no longer counts. */
void ckpt_bg_upload_stale(ckpt_bg_upload *u, const char *rel);
/* Take no new work, wait for the uploads in flight.  0, or -EIO when an
 * upload failed since the last drain (logged); every object sent is then
 * deleted again and nothing counts as sent. */
int ckpt_bg_upload_drain(ckpt_bg_upload *u);
/* 1: rel's object holds its current bytes; 2: an object was sent but is
 * stale; 0: nothing was sent. */
int ckpt_bg_upload_done(ckpt_bg_upload *u, const char *rel);
/* Stop the workers and free u (NULL: no-op).  delete_sent (an aborted
 * save): in-flight multipart uploads are aborted and every object sent is
 * deleted again (best effort, logged). */
void ckpt_bg_upload_free(ckpt_bg_upload *u, int delete_sent);

#endif
