"""The write layer's byte-level rules, through a real mount.

- O_TRUNC of a written file drops exactly that file's bytes, also in chunks
  the file shares with other files (a column slice crosses every row
  chunk in part): a rewrite that dies half-way leaves the array incomplete
  (ENODATA at the commit), never a mix of old and new bytes.
- Bytes once written do not change: the same bytes again (a retry, an
  array every process writes, overlapping slice files of one value) are
  fine, other bytes over them are refused with EINVAL and a log line naming
  the array and the byte, unless the file was truncated first.
- A declared array that nothing was written to costs the daemon a constant:
  32 headers of (2**44,) float32 (64 TiB each) add almost nothing to its
  resident and virtual memory.
- A spilled partial chunk takes about the bytes written in the spill file,
  not a whole chunk (the file is unlinked: measured through the daemon's fd).
"""

import errno
import io
import os
import time
from pathlib import Path

import numpy as np
import pytest

import ckfs_util as U

TMP = ".orbax-checkpoint-tmp"
MiB = 1 << 20


def commit(step_dir):
    open(Path(step_dir) / "commit_success.txt", "w").close()


def npy_header(dtype, shape):
    f = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        f, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": shape})
    return f.getvalue()


def stats(m):
    import json
    with open(m.p(".ckptfs/stats"), "rb") as f:
        return json.loads(f.read())


@pytest.fixture
def wm(mount, tmp_path):
    """A writable mount of an empty root with pending step 30, item state."""
    src = tmp_path / "root"
    src.mkdir()
    m = mount(src)
    m.src = src
    os.makedirs(m.p("30/state"))
    return m


def save_errno(path, a):
    """np.save's bytes through one buffered file: None, or the errno of the
    failed write (np.save's own error for its data has no errno)."""
    a = np.ascontiguousarray(a)
    return U.errno_of(lambda: Path(path).write_bytes(npy_header(a.dtype, a.shape) + a.tobytes()))


def declare(m, rel, dtype, shape):
    with open(m.p(rel), "wb") as f:
        f.write(npy_header(dtype, shape))


def wait_stored(m, timeout=20):
    """Until compression has stored every complete chunk (so that a rewrite
    has to re-read them)."""
    U.wait_until(lambda: stats(m)["bytes_pending"] == 0, timeout=timeout)


R = np.random.default_rng(5)
# 16 rows of 1 MiB: 4 inner chunks of 4 rows (4 MiB), so a column slice
# crosses every chunk in part.
BIG = R.standard_normal((16, 1 << 18)).astype(np.float32)
NEW = R.standard_normal((16, 1 << 18)).astype(np.float32)
SMALL = R.standard_normal((6, 5)).astype(np.float32)
SMALL2 = R.standard_normal((6, 5)).astype(np.float32)
H = 1 << 17   # half the columns of BIG


# ---------------------------------------------------------------------------
# 1. O_TRUNC drops exactly the file's bytes

@pytest.mark.parametrize("case", ["column_slice", "small_array_slice", "whole_array"])
def test_truncated_rewrite_dies_halfway(wm, case):
    if case == "column_slice":
        full, new, cols = BIG, NEW, (0, H)
    elif case == "small_array_slice":   # the array is smaller than one chunk
        full, new, cols = SMALL, SMALL2, (1, 3)
    else:
        full, new, cols = BIG, NEW, None
    w = wm.p("30/state/w.npy")
    if cols is None:
        np.save(w, full)
        rewrite = w
        new_part = new
    else:
        declare(wm, "30/state/w.npy", full.dtype, full.shape)
        c0, c1 = cols
        n = full.shape[1]
        if c0:
            np.save(wm.p(f"30/state/w[:,0:{c0}].npy"), full[:, :c0])
        np.save(wm.p(f"30/state/w[:,{c0}:{c1}].npy"), full[:, c0:c1])
        np.save(wm.p(f"30/state/w[:,{c1}:{n}].npy"), full[:, c1:])
        rewrite = wm.p(f"30/state/w[:,{c0}:{c1}].npy")
        new_part = new[:, c0:c1]
    wait_stored(wm)
    # The restarted writer: O_TRUNC, the header, half the data, then it dies.
    data = np.ascontiguousarray(new_part).tobytes()
    hdr = npy_header(new_part.dtype, new_part.shape)
    with open(rewrite, "wb") as f:
        f.write(hdr)
        f.write(data[: len(data) // 2])
    assert U.errno_of(commit, wm.p("30")) == errno.ENODATA, "a half-rewritten file was committed"
    assert "bytes never written" in wm.log()
    assert sorted(os.listdir(wm.src)) == ["30" + TMP]
    # What reads back: the new half, zeros where the rest will come, the
    # other files' bytes untouched.
    back = np.load(w)
    want = full.copy()
    part = np.frombuffer(data[: len(data) // 2] + bytes(len(data) - len(data) // 2),
                         dtype=new_part.dtype).reshape(new_part.shape)
    if cols is None:
        want = part
    else:
        want[:, cols[0]:cols[1]] = part
    assert np.array_equal(back, want)
    # Written again in full: committed with the new bytes.
    np.save(rewrite, new_part)
    commit(wm.p("30"))
    expect = full.copy()
    if cols is None:
        expect = new
    else:
        expect[:, cols[0]:cols[1]] = new[:, cols[0]:cols[1]]
    assert np.array_equal(np.load(w), expect)


# ---------------------------------------------------------------------------
# 2. overlapping files: the same bytes, or EINVAL

def test_overlapping_slices_same_bytes(wm):
    declare(wm, "30/state/w.npy", BIG.dtype, BIG.shape)
    np.save(wm.p("30/state/w[0:10].npy"), BIG[0:10])
    np.save(wm.p("30/state/w[6:16].npy"), BIG[6:16])        # rows 6..9 twice, same bytes
    np.save(wm.p("30/state/w[:,0:8].npy"), BIG[:, 0:8])      # a replicated column slice
    commit(wm.p("30"))
    assert np.array_equal(np.load(wm.p("30/state/w.npy")), BIG)


@pytest.mark.parametrize("stored", [False, True], ids=["buffered", "compressed"])
def test_overlapping_slices_other_bytes_refused(wm, stored):
    declare(wm, "30/state/w.npy", BIG.dtype, BIG.shape)
    np.save(wm.p("30/state/w[0:10].npy"), BIG[0:10])
    if stored:
        wait_stored(wm)        # rows 0..7 are compressed: checking them re-reads them
    other = BIG[6:16].copy()
    other[1, 3] += 1.0         # row 7: written by the first file with another value
    assert save_errno(wm.p("30/state/w[6:16].npy"), other) == errno.EINVAL
    log = wm.log()
    byte = (7 * BIG.shape[1] + 3) * 4
    assert "state/w" in log and "write refused" in log and f"byte {byte}" in log, log[-2000:]
    # The first file's bytes stand; the refused file is written right.
    assert np.array_equal(np.load(wm.p("30/state/w.npy"))[0:7], BIG[0:7])
    np.save(wm.p("30/state/w[6:16].npy"), BIG[6:16])
    commit(wm.p("30"))
    assert np.array_equal(np.load(wm.p("30/state/w.npy")), BIG)


def test_rewrite_after_truncate_takes_new_bytes(wm):
    """O_TRUNC forgets the file's bytes first, so new values are fine; a lone
    file rewritten in place (no slice files share its array: mmap writeback
    of a page changed again, a pwrite fixing values) takes the new bytes;
    once slice files share the array, its written bytes stay as they are."""
    p = wm.p("30/state/a.npy")
    np.save(p, SMALL)
    np.save(p, SMALL2)                 # O_TRUNC: new values
    body = npy_header(SMALL.dtype, SMALL.shape)
    fd = os.open(p, os.O_WRONLY)       # no O_TRUNC: the one writer rewriting in place
    try:
        assert os.pwrite(fd, SMALL.tobytes()[:8], len(body)) == 8
        assert os.pwrite(fd, SMALL2.tobytes()[:8], len(body)) == 8
    finally:
        os.close(fd)
    commit(wm.p("30"))
    assert np.array_equal(np.load(p), SMALL2)


def test_a_shared_array_keeps_its_written_bytes(wm):
    p = wm.p("30/state/b.npy")
    np.save(p, SMALL)
    with open(wm.p("30/state/b[0:1].npy"), "wb") as f:   # a slice file: several writers now
        f.write(npy_header(SMALL.dtype, (1,) + SMALL.shape[1:]) + SMALL[0:1].tobytes())
    body = npy_header(SMALL.dtype, SMALL.shape)
    fd = os.open(p, os.O_WRONLY)
    try:
        assert U.errno_of(os.pwrite, fd, SMALL2.tobytes()[:8], len(body)) == errno.EINVAL
    finally:
        os.close(fd)
    commit(wm.p("30"))
    assert np.array_equal(np.load(p), SMALL)


# ---------------------------------------------------------------------------
# 3. declared but unwritten space costs O(1)

def big_maps(pid, least=128 * MiB):
    """The daemon's mappings of at least `least` bytes, as (start, end)."""
    out = set()
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            a, b = (int(x, 16) for x in line.split()[0].split("-"))
            if b - a >= least:
                out.add((a, b))
    return out


def test_declared_space_is_free(wm):
    if U.sanitized():
        pytest.skip("memory figures are meaningless under a sanitizer")
    pid = wm.pid
    declare(wm, "30/state/warm.npy", np.float32, (4,))   # the step's first declaration
    rss0, vm0, maps0 = U.vm(pid, "VmRSS"), U.vm(pid, "VmSize"), big_maps(pid)
    for i in range(32):
        declare(wm, f"30/state/big{i}.npy", np.float32, (1 << 44,))
    rss1, vm1 = U.vm(pid, "VmRSS"), U.vm(pid, "VmSize")
    print(f"32 headers of (2**44,) float32: RSS +{(rss1 - rss0) / MiB:.1f} MiB, "
          f"VmSize +{(vm1 - vm0) / MiB:.1f} MiB")
    assert os.stat(wm.p("30/state/big31.npy")).st_size == len(npy_header(np.float32, (1 << 44,))) + (4 << 44)
    # Before: 4.5 MiB resident and one 805 MiB mapping each (144 MiB / 25
    # GiB).  After: well under 1 MiB and no mapping.  VmSize also moves when
    # the daemon starts FUSE worker threads meanwhile (8 MiB of stack and a
    # 64 MiB malloc arena each), hence the loose bound on it.
    assert rss1 - rss0 < 16 * MiB, f"RSS grew {(rss1 - rss0) / MiB:.1f} MiB"
    new_maps = big_maps(pid) - maps0
    assert not new_maps, f"{len(new_maps)} new mappings of 128 MiB or more"
    assert vm1 - vm0 < 1024 * MiB, f"VmSize grew {(vm1 - vm0) / MiB:.1f} MiB"
    # Every chunk is still missing: the commit says how many bytes.
    with open(wm.p("30/state/warm.npy"), "r+b") as f:
        f.seek(len(npy_header(np.float32, (4,))))
        f.write(bytes(16))
    with open(wm.p("30/state/big0.npy"), "r+b") as f:
        f.seek(len(npy_header(np.float32, (1 << 44,))) + (1 << 45))
        f.write(b"\x01" * 4096)
    assert U.errno_of(commit, wm.p("30")) == errno.ENODATA
    log = wm.log()
    assert f"state/big0: {(4 << 44) - 4096} of {4 << 44} bytes never written" in log, log[-2000:]
    assert f"state/big1: {4 << 44} of {4 << 44} bytes never written" in log
    assert U.vm(pid, "VmRSS") - rss0 < 32 * MiB


# ---------------------------------------------------------------------------
# 4. the spill file is sparse

def spill_file_blocks(pid):
    """Allocated bytes of the daemon's unlinked spill file(s)."""
    total, found = 0, False
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if TMP in target and "(deleted)" in target:
            total += os.stat(f"/proc/{pid}/fd/{fd}").st_blocks * 512
            found = True
    return total if found else None


def test_spill_file_is_sparse(mount, tmp_path):
    src = tmp_path / "root"
    src.mkdir()
    m = mount(src, "write_buffer=12M")      # two 4 MiB chunks and their bitmaps
    os.makedirs(m.p("30/state"))
    rows, row = 48, 1 << 20                  # (48, 2**20) float32: one 4 MiB chunk a row
    hdr = npy_header(np.float32, (rows, row))
    p = m.p("30/state/w.npy")
    with open(p, "wb") as f:
        f.write(hdr)
    written = 0
    fd = os.open(p, os.O_WRONLY)
    try:
        for r in range(rows):                # 1 KiB at the start of every row, interleaved
            os.pwrite(fd, b"\x07" * 1024, len(hdr) + r * row * 4)
            written += 1024
    finally:
        os.close(fd)
    s = stats(m)
    alloc = spill_file_blocks(m.pid)
    print(f"{written // 1024} KiB written to {rows} chunks: spill file {alloc / MiB:.2f} MiB allocated, "
          f"{s.get('spills', '?')} spills")
    assert alloc is not None, "no spill file: nothing was spilled"
    # Before: a whole 4.5 MiB slot per spilled chunk (over 200 MiB here).
    assert alloc <= rows * 16 * 1024, f"spill file holds {alloc / MiB:.1f} MiB for {written} bytes"
    # The spilled bytes come back.
    with open(p, "rb") as f:
        f.seek(len(hdr) + 5 * row * 4)
        assert f.read(2048) == b"\x07" * 1024 + bytes(1024)
