"""Mount a checkpoint with ckptfs for the length of a ``with`` block.

    import numpy as np
    import ckptfs

    with ckptfs.mount("/data/run1/checkpoints", ro=True) as mnt:
        w = np.load(mnt / "1000" / "state" / "params" / "w.npy")

``mount`` starts ``ckptfs -f -q -o ready_fd=N ...``, waits for the daemon's
readiness byte on a pipe (``s``: mounted, ``f``: failed), yields the mount
point as a ``pathlib.Path`` and unmounts (``fusermount3 -u``) when the block
ends, even on an exception.  A failed mount raises ``MountError`` carrying
the daemon's own words.  Only the Python standard library is used.

bfloat16 arrays load as numpy void ``'<V2'``.  Without ml_dtypes, read
``NAME.f32.npy`` (float32, exact), or turn the raw bits into torch without
any other package::

    import numpy as np, torch
    raw = np.load(mnt / "1000/state/params/w.npy")          # dtype '<V2'
    t = torch.from_numpy(raw.view(np.int16)).view(torch.bfloat16)
"""

import contextlib
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["mount", "MountError"]

READY_TIMEOUT = 120.0  # seconds: a cold object store may take a while


class MountError(RuntimeError):
    """ckptfs did not mount; the message holds the daemon's output."""


def _binary(binary):
    b = binary or os.environ.get("CKPTFS_BIN") or shutil.which("ckptfs")
    if not b:
        raise MountError("ckptfs is not installed (not on PATH; set CKPTFS_BIN)")
    return b


def _unmount(mnt, proc, timeout):
    for attempt in range(50):  # busy for a moment while files close
        rc = subprocess.call(["fusermount3", "-u", str(mnt)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        if rc == 0 or proc.poll() is not None:
            break
        time.sleep(0.1)
    else:
        subprocess.call(["fusermount3", "-u", "-z", str(mnt)], stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        proc.wait()


@contextlib.contextmanager
def mount(source, mountpoint=None, ro=True, options=(), binary=None, timeout=READY_TIMEOUT):
    """Mount ``source`` (a folder, ``s3://...`` or ``gs://...``) on
    ``mountpoint`` (default: a fresh temporary folder, removed afterwards)
    and yield the mount point as a Path.

    ro: mount read-only (``-o ro``).  options: more ``-o`` options, as
    strings ("cache_size=1G").  binary: the ckptfs to run (default:
    $CKPTFS_BIN, else ckptfs on PATH).
    """
    own = mountpoint is None
    mnt = Path(tempfile.mkdtemp(prefix="ckptfs-")) if own else Path(mountpoint)
    log = tempfile.TemporaryFile()
    r, w = os.pipe()
    opts = [f"ready_fd={w}"] + (["ro"] if ro else []) + [str(o) for o in options]
    cmd = [_binary(binary), "-f", "-q", "-o", ",".join(opts), os.fspath(source), str(mnt)]
    proc = None
    try:
        try:
            proc = subprocess.Popen(cmd, pass_fds=(w,), stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT)
        finally:
            os.close(w)
        ready, _, _ = select.select([r], [], [], timeout)
        byte = os.read(r, 1) if ready else None
        if byte != b"s":
            if proc.poll() is None and byte is None:
                proc.terminate()
            proc.wait()
            log.seek(0)
            said = log.read().decode(errors="replace").strip()
            why = "no answer within %gs" % timeout if byte is None else "exit status %s" % proc.returncode
            raise MountError(f"ckptfs could not mount {source} on {mnt} ({why}): {said}")
        try:
            yield mnt
        finally:
            _unmount(mnt, proc, timeout)
    finally:
        os.close(r)
        log.close()
        if own:
            with contextlib.suppress(OSError):
                mnt.rmdir()
