"""Writers that retry.

A training job preempted in the middle of a save restarts and runs the same
save again into the same pending step.  That must work with plain file
operations:

- `np.save` / `cp` of an array or a slice file that was already written
  (open with O_TRUNC, then the same .npy header) succeeds, and the bytes
  written last are the ones committed; O_TRUNC drops the file's bytes, so a
  retry that dies half-way leaves the array incomplete (ENODATA at the
  commit), never a mix of old and new bytes; a header with a different dtype
  or shape is refused with EINVAL and the declaration stays;
- `unlink` of a pending array removes it (its bytes are dropped; the commit
  goes through without it);
- a declaration left behind by a failed write (header written, data
  missing) makes the commit fail with ENODATA, and once it is removed the
  commit succeeds;
- a second create of commit_success.txt after a successful commit succeeds
  (idempotent) or answers EEXIST, never EROFS, and changes nothing.
"""

import errno
import hashlib
import io
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import ckfs_util as U

TMP = ".orbax-checkpoint-tmp"


def commit(step_dir):
    open(Path(step_dir) / "commit_success.txt", "w").close()


def stats(m):
    with open(m.p(".ckptfs/stats"), "rb") as f:
        return json.loads(f.read())


def npy_bytes(a):
    f = io.BytesIO()
    np.save(f, a)
    return f.getvalue()


def tree_files(d):
    out = {}
    for dirpath, _dirnames, filenames in os.walk(d):
        for fn in filenames:
            p = Path(dirpath) / fn
            out[str(p.relative_to(d))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture
def wm(mount, tmp_path):
    """A writable mount of an empty CheckpointManager root, with pending
    step 30 and its item `state`."""
    src = tmp_path / "root"
    src.mkdir()
    m = mount(src)
    m.src = src
    os.makedirs(m.p("30/state"))
    return m


R = np.random.default_rng(11)
A = R.standard_normal((6, 5)).astype(np.float32)
B = R.standard_normal((6, 5)).astype(np.float32)   # same header as A, other values



# ---------------------------------------------------------------------------
# re-running a save

def test_np_save_again_same_header(wm):
    p = wm.p("30/state/a.npy")
    np.save(p, A)
    np.save(p, A)          # the retry of the same save
    np.save(p, B)          # same header, new values: the last write wins
    assert np.array_equal(np.load(p), B)
    commit(wm.p("30"))
    assert np.array_equal(np.load(p), B)


def test_cp_again_same_header(wm, tmp_path):
    f = tmp_path / "a.npy"
    np.save(f, A)
    dst = str(wm.p("30/state/a.npy"))
    subprocess.run(["cp", str(f), dst], check=True)
    r = subprocess.run(["cp", str(f), dst], capture_output=True, text=True)
    assert r.returncode == 0, f"second cp failed: {r.stderr}"
    commit(wm.p("30"))
    assert U.read_all(wm.p("30/state/a.npy")) == npy_bytes(A)


def test_slice_file_again_same_header(wm):
    w = wm.p("30/state/w.npy")
    mm = np.lib.format.open_memmap(w, mode="w+", dtype=np.float32, shape=A.shape)
    del mm
    np.save(wm.p("30/state/w[0:3].npy"), A[0:3])
    np.save(wm.p("30/state/w[3:6].npy"), B[3:6])
    np.save(wm.p("30/state/w[3:6].npy"), A[3:6])   # the retry rewrites rows 3..5
    commit(wm.p("30"))
    assert np.array_equal(np.load(w), A)


def test_open_memmap_again_redeclares(wm):
    """open_memmap(mode='w+') of an array already declared the same way
    (a restarted declaring process) succeeds."""
    w = wm.p("30/state/w.npy")
    mm = np.lib.format.open_memmap(w, mode="w+", dtype=np.float32, shape=A.shape)
    del mm
    mm = np.lib.format.open_memmap(w, mode="w+", dtype=np.float32, shape=A.shape)
    mm[:] = A
    mm.flush()
    del mm
    commit(wm.p("30"))
    assert np.array_equal(np.load(w), A)


@pytest.mark.parametrize("other", [A.astype(np.float64), A.reshape(5, 6), A[:4]],
                         ids=["dtype", "shape", "rows"])
def test_rewrite_with_other_header_refused(wm, other):
    """A different dtype or shape is not a retry: EINVAL, and the array
    keeps its declaration."""
    p = wm.p("30/state/a.npy")
    np.save(p, A)
    assert U.errno_of(np.save, p, other) == errno.EINVAL
    assert U.errno_of(os.stat, p) is None, "the refused write removed the declaration"


@pytest.mark.parametrize("other", [A.astype(np.float64), A.reshape(5, 6)], ids=["dtype", "shape"])
def test_refused_rewrite_then_right_rewrite_commits(wm, other):
    p = wm.p("30/state/a.npy")
    np.save(p, A)
    assert U.errno_of(np.save, p, other) == errno.EINVAL
    np.save(p, B)
    commit(wm.p("30"))
    assert np.array_equal(np.load(p), B)


def test_truncated_rewrite_is_incomplete_until_rewritten(wm):
    """O_TRUNC drops the bytes of the file: a retry that dies after the
    header does not commit the old bytes (or a mix of old and new) as if
    they were written; the commit fails with ENODATA until the data is
    written again."""
    p = wm.p("30/state/a.npy")
    np.save(p, A)
    hdr = npy_bytes(A)[: -A.nbytes]
    with open(p, "wb") as f:                  # O_TRUNC, header, then the writer dies
        f.write(hdr)
        f.write(B.tobytes()[: B.nbytes // 2])
    assert U.errno_of(commit, wm.p("30")) == errno.ENODATA
    with open(p, "wb") as f:
        f.write(npy_bytes(B))
    commit(wm.p("30"))
    assert np.array_equal(np.load(p), B)


@pytest.mark.parametrize("other", [B[0:3].astype(np.float64), B[0:2]], ids=["dtype", "shape"])
def test_slice_rewrite_with_other_header_refused(wm, other):
    w = wm.p("30/state/w.npy")
    mm = np.lib.format.open_memmap(w, mode="w+", dtype=np.float32, shape=A.shape)
    del mm
    np.save(wm.p("30/state/w[0:3].npy"), A[0:3])
    assert U.errno_of(np.save, wm.p("30/state/w[0:3].npy"), other) == errno.EINVAL
    np.save(wm.p("30/state/w[3:6].npy"), A[3:6])


# ---------------------------------------------------------------------------
# removing pending arrays

def test_unlink_pending_array(wm):
    big = np.arange(3 << 20, dtype=np.float32)      # 12 MiB: several chunks stored before the commit
    np.save(wm.p("30/state/gone.npy"), big)
    np.save(wm.p("30/state/keep.npy"), A)
    os.unlink(wm.p("30/state/gone.npy"))
    assert sorted(os.listdir(wm.p("30/state"))) == ["keep.npy"]
    assert U.errno_of(os.stat, wm.p("30/state/gone.npy")) == errno.ENOENT
    # (compression may have stored some of its chunks already: what is left
    # pending can only be keep's bytes)
    assert stats(wm)["bytes_pending"] <= A.nbytes, "the unlinked array's bytes are still pending"
    # its stored chunks are gone from the pending folder
    left = [p for p in (wm.src / ("30" + TMP)).rglob("*") if "gone" in p.name]
    assert left == [], f"files of the removed array left in the pending step: {left}"
    # the name is free again, for another dtype and shape
    np.save(wm.p("30/state/gone.npy"), np.arange(4, dtype=np.int8))
    os.unlink(wm.p("30/state/gone.npy"))
    commit(wm.p("30"))
    assert sorted(os.listdir(wm.p("30/state"))) == ["_METADATA", "_sharding", "commit_success.txt", "keep.npy"]
    meta = json.loads((wm.src / "30" / "state" / "_METADATA").read_text())
    assert list(meta["tree_metadata"]) == ["('keep',)"]
    assert not (wm.src / "30" / "state" / "gone").exists()
    assert np.array_equal(np.load(wm.p("30/state/keep.npy")), A)


def test_failed_write_blocks_commit_with_enodata(wm):
    """What happens today, and must keep happening: a declaration whose
    data never came makes the commit fail with ENODATA; the step stays
    pending."""
    mm = np.lib.format.open_memmap(wm.p("30/state/half.npy"), mode="w+", dtype=np.float32, shape=A.shape)
    del mm
    np.save(wm.p("30/state/half[0:3].npy"), A[0:3])      # the writer of rows 3..5 died
    np.save(wm.p("30/state/keep.npy"), A)
    assert U.errno_of(commit, wm.p("30")) == errno.ENODATA
    assert sorted(os.listdir(wm.src)) == ["30" + TMP]
    assert sorted(os.listdir(wm.p("30/state"))) == ["half.npy", "keep.npy"]


def test_failed_write_declaration_removed_then_commit(wm):
    mm = np.lib.format.open_memmap(wm.p("30/state/half.npy"), mode="w+", dtype=np.float32, shape=A.shape)
    del mm
    np.save(wm.p("30/state/half[0:3].npy"), A[0:3])
    np.save(wm.p("30/state/keep.npy"), A)
    assert U.errno_of(commit, wm.p("30")) == errno.ENODATA
    os.unlink(wm.p("30/state/half.npy"))
    commit(wm.p("30"))
    assert sorted(os.listdir(wm.src)) == ["30"]
    assert sorted(os.listdir(wm.p("30/state"))) == ["_METADATA", "_sharding", "commit_success.txt", "keep.npy"]


def test_failed_write_retried_then_commit(wm):
    """The restarted writer simply writes the array again."""
    mm = np.lib.format.open_memmap(wm.p("30/state/half.npy"), mode="w+", dtype=np.float32, shape=A.shape)
    del mm
    np.save(wm.p("30/state/half[0:3].npy"), A[0:3])
    assert U.errno_of(commit, wm.p("30")) == errno.ENODATA
    np.save(wm.p("30/state/half.npy"), A)
    commit(wm.p("30"))
    assert np.array_equal(np.load(wm.p("30/state/half.npy")), A)


# ---------------------------------------------------------------------------
# committing twice

def test_second_commit_create_is_idempotent(wm):
    np.save(wm.p("30/state/a.npy"), A)
    commit(wm.p("30"))
    before = tree_files(wm.src / "30")
    e = U.errno_of(commit, wm.p("30"))
    assert e in (None, errno.EEXIST), f"second commit: errno {e} (want success or EEXIST)"
    e = U.errno_of(lambda: open(wm.p("30/commit_success.txt"), "x").close())
    assert e in (None, errno.EEXIST), f"O_EXCL create after commit: errno {e}"
    assert tree_files(wm.src / "30") == before, "the second commit changed the committed step"
    assert sorted(os.listdir(wm.src)) == ["30"]


def test_writes_into_committed_step_still_refused(wm):
    """Idempotent commit is not a way back in: the committed step stays
    read-only."""
    np.save(wm.p("30/state/a.npy"), A)
    commit(wm.p("30"))
    assert U.errno_of(np.save, wm.p("30/state/b.npy"), A) == errno.EROFS
    assert U.errno_of(np.save, wm.p("30/state/a.npy"), A) in (errno.EROFS, errno.EACCES)
    assert U.errno_of(os.unlink, wm.p("30/state/a.npy")) == errno.EROFS
    assert U.errno_of(os.mkdir, wm.p("30/other")) == errno.EROFS
