"""Bad writes through the mount (lib/view.h, "Writing a new step").

Every misuse must fail with the documented errno, leave the pending step
usable (it still commits, with exactly the good data), never take the
daemon down (it exits with code 0 at unmount, checked by the fixture), and
leave a log line naming the file, array or step.

Errnos by contract: EFBIG (write past the end), EINVAL (bad .npy header,
header disagreeing with the declaration or the slice, bad name),
ENOENT (slice of an undeclared array), EROFS (committed steps, read-only
mounts), EEXIST, EPERM (removing a pending directory; files directly in a
step), ENODATA (commit with holes).
"""

import errno
import io
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import ckfs_util as U
import zarr3_verify as V

TMP = ".orbax-checkpoint-tmp"


# ---------------------------------------------------------------------------
# helpers

def npy(descr, shape, raw=b"", **extra):
    """A .npy v1.0 file whose header dict has this descr/shape (any Python
    values; extra keys allowed) and then the raw bytes."""
    d = {"descr": descr, "fortran_order": extra.pop("fortran_order", False), "shape": shape}
    d.update(extra)
    f = io.BytesIO()
    np.lib.format.write_array_header_1_0(f, d)
    return f.getvalue() + bytes(raw)


def raw_header(text):
    """Magic + v1.0 length + `text` padded with spaces to 64 bytes (a
    complete header whose dict text is arbitrary)."""
    body = text.encode("latin1")
    total = 10 + len(body) + 1
    pad = (-total) % 64
    body = body + b" " * pad + b"\n"
    return b"\x93NUMPY\x01\x00" + len(body).to_bytes(2, "little") + body


def write_at(path, data, off=0, create=True):
    """Open (O_WRONLY, O_CREAT unless create=False, never O_TRUNC), pwrite, close."""
    fd = os.open(path, os.O_WRONLY | (os.O_CREAT if create else 0), 0o644)
    try:
        n = os.pwrite(fd, data, off)
        assert n == len(data), f"short write {n} of {len(data)}"
    finally:
        os.close(fd)


def err(fn, *a, **kw):
    return U.errno_of(fn, *a, **kw)


def commit(step_dir):
    open(Path(step_dir) / "commit_success.txt", "w").close()


class Log:
    """Marks a position in the daemon log; `has` checks what came after."""

    def __init__(self, m):
        self.m = m
        self.pos = len(m.log())

    def text(self):
        return self.m.log()[self.pos:]

    def has(self, *needles, timeout=1.0):
        # The daemon writes its log line (unbuffered stderr) before it
        # replies, so the line is normally there at once; the short poll
        # only guards against a slow file system.
        return U.wait_until(lambda: all(n in self.text() for n in needles), timeout=timeout)


def assert_logged(lg, *needles):
    assert lg.has(*needles), f"daemon log after the failure does not name {needles}:\n{lg.text()[-3000:]}"


def alive(m):
    assert m.proc.poll() is None, f"daemon exited (code {m.proc.returncode})\n{m.log()[-4000:]}"


@pytest.fixture
def root(mount, tmp_path):
    """(source root, writable mount) with pending step 30 and item state."""
    src = tmp_path / "root"
    src.mkdir()
    m = mount(src)
    os.mkdir(m.p("30"))
    os.mkdir(m.p("30/state"))
    return src, m


F32 = np.arange(48, dtype=np.float32).reshape(8, 6) * 1.5


def declare_w(m, name="w", values=F32):
    """Declare NAME.npy with just its header; returns the header length."""
    h = npy(np.lib.format.dtype_to_descr(values.dtype), values.shape)
    write_at(m.p(f"30/state/{name}.npy"), h)
    return len(h)


def commit_and_check(src, m, arrays):
    """Commit step 30; every array in `arrays` {rel in step: values} reads
    back through the mount and zarr3_verify accepts the step with exactly
    these arrays."""
    commit(m.p("30"))
    assert sorted(os.listdir(src)) == ["30"]
    for rel, v in arrays.items():
        got = np.load(m.p("30/" + rel))
        assert got.shape == v.shape and got.tobytes() == v.tobytes(), f"{rel} reads back wrong"
    decoded, problems = V.verify(str(src / "30"))
    assert problems == []
    want = {(r.split("/", 1)[0], r.split("/", 1)[1][:-4].replace("/", ".")) for r in arrays}
    assert set(decoded) == want


# ---------------------------------------------------------------------------

def test_write_past_end_is_efbig(root):
    src, m = root
    a = np.arange(4, dtype=np.int32)
    lg = Log(m)
    # header + 16 data bytes + 4 too many, in one write
    assert err(write_at, m.p("30/state/past_end.npy"), npy("<i4", (4,), a.tobytes() + b"XXXX")) == errno.EFBIG
    alive(m)
    assert_logged(lg, "past_end")
    # a declared, fully written array: pwrite straddling / starting at / beyond the end
    b = np.arange(10, dtype=np.float64)
    f = npy("<f8", (10,), b.tobytes())
    write_at(m.p("30/state/full.npy"), f)
    assert os.stat(m.p("30/state/full.npy")).st_size == len(f)
    for off, n in ((len(f) - 4, 8), (len(f), 1), (len(f) + 4096, 16)):
        lg = Log(m)
        assert err(write_at, m.p("30/state/full.npy"), b"\x01" * n, off, False) == errno.EFBIG, (off, n)
        assert_logged(lg, "full")
    alive(m)
    # the failed writes changed nothing: rewrite past_end properly and commit
    write_at(m.p("30/state/past_end.npy"), npy("<i4", (4,), a.tobytes()), create=False)
    commit_and_check(src, m, {"state/past_end.npy": a, "state/full.npy": b})


@pytest.mark.parametrize("case", ["dtype", "shape", "rank", "bf16-as-f32"])
def test_slice_header_disagreeing_is_einval(root, case):
    src, m = root
    declare_w(m)
    bad = {
        "dtype": ("w[0:2].npy", npy("<i4", (2, 6), b"\0" * 48)),
        "shape": ("w[2:4].npy", npy("<f4", (3, 6), b"\0" * 72)),
        "rank": ("w[4:6].npy", npy("<f4", (12,), b"\0" * 48)),
        "bf16-as-f32": ("w[6:8].npy", npy("<V2", (2, 6), b"\0" * 24)),
    }[case]
    name, data = bad
    lg = Log(m)
    assert err(write_at, m.p("30/state/" + name), data) == errno.EINVAL
    alive(m)
    assert_logged(lg, name)
    # correct slice files (np.save truncates the failed one first) fill the array
    for a, b in ((0, 2), (2, 4), (4, 6), (6, 8)):
        np.save(m.p(f"30/state/w[{a}:{b}].npy"), F32[a:b])
    commit_and_check(src, m, {"state/w.npy": F32})


MALFORMED = {
    "not-npy": b"PK\x03\x04" + b"this is a zip file, not an array" * 8,
    "bad-version": b"\x93NUMPY\x09\x00" + raw_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }")[8:],
    "no-shape": raw_header("{'descr': '<f4', 'fortran_order': False, }"),
    "extra-key": npy("<f4", (2,), b"\0" * 8, extra=1),
    "object": npy("|O", (2,)),
    "big-endian": npy(">f4", (2,), b"\0" * 8),
    "structured": npy([("a", "<f4"), ("b", "<i4")], (2,), b"\0" * 16),
    "fortran-2d": npy("<f4", (3, 4), b"\0" * 48, fortran_order=True),
    "negative-dim": npy("<f4", (-1,)),
    "float-dim": raw_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2.5,), }"),
    "unknown-descr": npy("<q9", (2,)),
    "not-a-dict": raw_header("['descr', '<f4']"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_header_is_einval(root, case):
    src, m = root
    name = f"bad_{case.replace('-', '_')}.npy"
    lg = Log(m)
    assert err(write_at, m.p("30/state/" + name), MALFORMED[case]) == errno.EINVAL
    alive(m)
    assert_logged(lg, name)
    # the file never declared an array: it can be removed, and the step commits
    os.unlink(m.p("30/state/" + name))
    good = np.arange(3, dtype=np.int16)
    np.save(m.p("30/state/good.npy"), good)
    commit_and_check(src, m, {"state/good.npy": good})


def test_header_streamed_in_pieces(root):
    """A valid .npy written 7 bytes at a time is accepted; a write that
    leaves a gap before the header is complete is refused."""
    src, m = root
    v = np.arange(30, dtype=np.uint32).reshape(5, 6)
    f = npy("<u4", (5, 6), v.tobytes())
    p = m.p("30/state/streamed.npy")
    fd = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for i in range(0, len(f), 7):
            assert os.write(fd, f[i:i + 7]) == len(f[i:i + 7])
    except OSError as e:
        pytest.fail(f"streamed write failed at byte {i}: {e}")
    finally:
        os.close(fd)
    lg = Log(m)
    assert err(write_at, m.p("30/state/gap.npy"), b"\0" * 8, 300) == errno.EINVAL
    assert_logged(lg, "gap.npy")
    os.unlink(m.p("30/state/gap.npy"))
    commit_and_check(src, m, {"state/streamed.npy": v})


BAD_SLICE_NAMES = [
    "w[9].npy",             # index out of range (shape 8x6)
    "w[-9].npy",
    "w[0:2,6].npy",         # second index out of range
    "w[0:2,0:3,1].npy",     # more indices than dimensions
    "w[0:2.npy",            # no closing bracket
    "w[0:2]].npy",
    "w[a:b].npy",
    "w[::2].npy",           # steps are not supported
    "w[0:2][0:1].npy",
]


@pytest.mark.parametrize("name", BAD_SLICE_NAMES)
def test_bad_slice_name(root, name):
    src, m = root
    declare_w(m)
    lg = Log(m)
    # refused when the file is created, before any header is written
    e = err(lambda: os.close(os.open(m.p("30/state/" + name), os.O_WRONLY | os.O_CREAT, 0o644)))
    assert e in (errno.EINVAL, errno.ENOENT), f"{name}: errno {e}"
    alive(m)
    assert name not in os.listdir(m.p("30/state"))
    assert_logged(lg, name)


def test_slice_of_undeclared_array_is_enoent(root):
    src, m = root
    lg = Log(m)
    assert err(write_at, m.p("30/state/nodecl[0:2].npy"), npy("<f4", (2,), b"\0" * 8)) == errno.ENOENT
    assert_logged(lg, "nodecl")
    # NAME.npy exists but its header is not complete yet: still undeclared
    write_at(m.p("30/state/half.npy"), npy("<f4", (4,))[:20])
    lg = Log(m)
    assert err(write_at, m.p("30/state/half[0:2].npy"), npy("<f4", (2,), b"\0" * 8)) == errno.ENOENT
    assert_logged(lg, "half")
    alive(m)
    # finish the header, then the slice works
    write_at(m.p("30/state/half.npy"), npy("<f4", (4,))[20:], 20, create=False)
    v = np.array([1, 2, 3, 4], dtype=np.float32)
    np.save(m.p("30/state/half[0:2].npy"), v[0:2])
    np.save(m.p("30/state/half[2:].npy"), v[2:])
    commit_and_check(src, m, {"state/half.npy": v})


def committed_step(src, m):
    v = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.save(m.p("30/state/a.npy"), v)
    commit(m.p("30"))
    return v


def write_attempts(m):
    """Every way of writing into committed step 30: (what, callable)."""
    a = m.p("30/state/a.npy")
    return [
        ("open O_WRONLY a.npy", lambda: os.close(os.open(a, os.O_WRONLY))),
        ("open O_RDWR a.npy", lambda: os.close(os.open(a, os.O_RDWR))),
        ("np.save a.npy", lambda: np.save(a, np.zeros((3, 4), np.float32))),
        ("truncate a.npy", lambda: os.truncate(a, 0)),
        ("create new.npy", lambda: os.close(os.open(m.p("30/state/new.npy"), os.O_WRONLY | os.O_CREAT, 0o644))),
        ("create a[0:1].npy", lambda: np.save(m.p("30/state/a[0:1].npy"), np.zeros((1, 4), np.float32))),
        ("mkdir item", lambda: os.mkdir(m.p("30/newitem"))),
        ("mkdir pytree dir", lambda: os.mkdir(m.p("30/state/sub"))),
        ("rmdir step", lambda: os.rmdir(m.p("30"))),
        ("rename step", lambda: os.rename(m.p("30"), m.p("31"))),
        ("rename array", lambda: os.rename(a, m.p("30/state/b.npy"))),
    ]


def test_committed_step_refuses_writes_with_erofs(root):
    src, m = root
    v = committed_step(src, m)
    before = {p: p.read_bytes() for p in (src / "30").rglob("*") if p.is_file()}
    errs = {what: err(fn) for what, fn in write_attempts(m)}
    bad = {what: e for what, e in errs.items() if e != errno.EROFS}
    assert not bad, f"not EROFS: { {k: (errno.errorcode.get(e, e) if e else 'succeeded') for k, e in bad.items()} }"
    alive(m)
    assert sorted(os.listdir(m.p())) == ["30", "latest"]
    assert np.array_equal(np.load(m.p("30/state/a.npy")), v)
    after = {p: p.read_bytes() for p in (src / "30").rglob("*") if p.is_file()}
    assert after == before


def test_a_removal_inside_a_committed_step_is_erofs_by_default(root):
    """Without -o delete_steps no removal touches a committed step: a stray
    rm is EROFS (logged, naming the option) and SOURCE keeps every byte."""
    src, m = root
    committed_step(src, m)
    before = {p: p.read_bytes() for p in (src / "30").rglob("*") if p.is_file()}
    assert err(os.unlink, m.p("30/state/a.npy")) == errno.EROFS
    assert err(os.rmdir, m.p("30/state")) == errno.EROFS
    assert err(shutil.rmtree, m.p("30")) == errno.EROFS
    assert "-o delete_steps" in m.log()
    assert sorted(os.listdir(m.p())) == ["30", "latest"]
    assert {p: p.read_bytes() for p in (src / "30").rglob("*") if p.is_file()} == before


def test_a_removal_inside_a_committed_step_deletes_all_of_it(mount, tmp_path):
    """-o delete_steps, rmtree of a committed step (Orbax's max_to_keep): the
    first unlink inside takes the whole step out of SOURCE; the rest of the
    walk works."""
    src = tmp_path / "root"
    src.mkdir()
    m = mount(src, "delete_steps")
    os.mkdir(m.p("30"))
    os.mkdir(m.p("30/state"))
    committed_step(src, m)
    os.unlink(m.p("30/state/a.npy"))
    assert os.listdir(m.p()) == [] and os.listdir(src) == []
    assert err(os.rmdir, m.p("30/state")) == errno.ENOTEMPTY
    shutil.rmtree(m.p("30"))
    assert err(os.stat, m.p("30")) == errno.ENOENT
    alive(m)
    os.makedirs(m.p("30/state"))  # the name is free again
    committed_step(src, m)
    assert sorted(os.listdir(src)) == ["30"]


def test_committed_step_write_refusals_are_logged(root):
    """view.h: each failure is logged with the array/step name."""
    src, m = root
    committed_step(src, m)
    spans = []
    for what, fn in write_attempts(m):
        start = len(m.log())
        if err(fn) is None:
            continue  # reported by the test above
        name = what.split()[-1]
        name = {"item": "newitem", "dir": "sub", "step": "30", "array": "a.npy"}.get(name, name)
        spans.append((what, name, start, len(m.log())))
    alive(m)
    log = m.log()
    missing = [what for what, name, a, b in spans if name not in log[a:b]]
    assert not missing, f"no log line naming the target for: {missing}\n--- log ---\n{m.log()[-3000:]}"


def test_commit_with_holes_is_enodata_and_step_stays_pending(root):
    src, m = root
    v = np.arange(48, dtype=np.float32).reshape(8, 6)
    declare_w(m, "holey", v)
    for a, b in ((0, 3), (3, 7)):
        np.save(m.p(f"30/state/holey[{a}:{b}].npy"), v[a:b])  # row 7 missing
    # an array written with pwrite, missing 3 bytes in the middle of an element
    u = (np.arange(100, dtype=np.int64) * 1000003).astype(np.int64)
    f = npy("<i8", (100,), u.tobytes())
    hl = len(f) - u.nbytes
    write_at(m.p("30/state/gappy.npy"), f[:hl + 405])
    write_at(m.p("30/state/gappy.npy"), f[hl + 408:], hl + 408, create=False)
    lg = Log(m)
    assert err(commit, m.p("30")) == errno.ENODATA
    alive(m)
    assert_logged(lg, "holey", "gappy")
    # still pending: listed by the mount, only the tmp folder on disk
    assert sorted(os.listdir(m.p())) == ["30"]
    assert sorted(os.listdir(src)) == ["30" + TMP]
    assert err(os.stat, m.p("30/commit_success.txt")) == errno.ENOENT
    # the data written so far is still there
    assert np.array_equal(np.load(m.p("30/state/holey.npy"))[:7], v[:7])
    # fill one hole: still ENODATA
    np.save(m.p("30/state/holey[7].npy"), v[7:8])
    assert err(commit, m.p("30")) == errno.ENODATA
    assert sorted(os.listdir(src)) == ["30" + TMP]
    write_at(m.p("30/state/gappy.npy"), f[hl + 405:hl + 408], hl + 405, create=False)
    commit_and_check(src, m, {"state/holey.npy": v, "state/gappy.npy": u})


def test_conflicting_redeclaration_is_einval(root):
    src, m = root
    hl = declare_w(m)
    p = m.p("30/state/w.npy")
    cases = [
        ("w.npy shape", lambda: write_at(p, npy("<f4", (8, 7)), create=False), "w.npy"),
        ("w.npy dtype", lambda: write_at(p, npy("<i4", (8, 6)), create=False), "w.npy"),
        ("w.npy np.save", lambda: np.save(p, np.zeros((2, 2), np.float32)), "w.npy"),
    ]
    # the same param name by two paths, a leaf that would be an inner node,
    # a node mixing sequence and dict children
    np.save(m.p("30/state/dotted.name.npy"), np.ones(2, np.float32))
    os.mkdir(m.p("30/state/dotted"))
    cases.append(("dotted/name.npy", lambda: np.save(m.p("30/state/dotted/name.npy"), np.ones(2, np.float32)),
                  "dotted"))
    np.save(m.p("30/state/leafnode.npy"), np.ones(3, np.int8))
    os.mkdir(m.p("30/state/leafnode"))
    cases.append(("leafnode/y.npy", lambda: np.save(m.p("30/state/leafnode/y.npy"), np.ones(3, np.int8)),
                  "leafnode"))
    for d in ("mixnode", "mixnode/0", "mixnode/k"):
        os.mkdir(m.p("30/state/" + d))
    np.save(m.p("30/state/mixnode/0/a.npy"), np.ones(2, np.int16))
    cases.append(("mixnode/k/a.npy", lambda: np.save(m.p("30/state/mixnode/k/a.npy"), np.ones(2, np.int16)),
                  "mixnode"))
    unlogged = []
    for what, fn, needle in cases:
        lg = Log(m)
        e = err(fn)
        assert e == errno.EINVAL, f"{what}: errno {errno.errorcode.get(e, e) if e else 'none (accepted)'}"
        alive(m)
        if not lg.has(needle):
            unlogged.append(what)
    # the refused declarations left nothing behind: fill the good arrays, commit
    # (the refused np.save truncated w.npy: its bytes go, its header comes again)
    assert hl == len(npy("<f4", (8, 6)))
    write_at(p, npy("<f4", (8, 6), F32.tobytes()), create=False)
    for d in ("dotted", "leafnode", "mixnode/k"):
        for n in os.listdir(m.p("30/state/" + d)):
            os.unlink(m.p(f"30/state/{d}/{n}"))
    commit_and_check(src, m, {"state/w.npy": F32, "state/dotted.name.npy": np.ones(2, np.float32),
                              "state/leafnode.npy": np.ones(3, np.int8),
                              "state/mixnode/0/a.npy": np.ones(2, np.int16)})
    meta = json.loads((src / "30" / "state" / "_METADATA").read_text())["tree_metadata"]
    assert set(meta) == {"('w',)", "('dotted.name',)", "('leafnode',)", "('mixnode', '0', 'a')"}
    assert not unlogged, f"no log line naming the array for: {unlogged}"


def test_existing_step_or_dir_is_eexist(root):
    src, m = root
    np.save(m.p("30/state/a.npy"), np.ones(2, np.float32))
    assert err(os.mkdir, m.p("30")) == errno.EEXIST           # pending
    assert err(os.mkdir, m.p("30/state")) == errno.EEXIST     # existing item
    os.mkdir(m.p("30/state/p"))
    assert err(os.mkdir, m.p("30/state/p")) == errno.EEXIST   # existing pytree dir
    commit(m.p("30"))
    assert err(os.mkdir, m.p("30")) == errno.EEXIST           # committed
    # commit by rename onto an existing step: EEXIST, the step stays pending
    os.mkdir(m.p("renamee"))
    os.mkdir(m.p("renamee/state"))
    v = np.arange(5, dtype=np.int32)
    np.save(m.p("renamee/state/b.npy"), v)
    lg = Log(m)
    e = err(os.rename, m.p("renamee"), m.p("30"))
    assert e == errno.EEXIST, f"rename onto a committed step: errno {e}"
    alive(m)
    logged = lg.has("renamee")
    assert sorted(os.listdir(src)) == ["30", "renamee" + TMP]
    assert sorted(os.listdir(m.p())) == ["30", "latest", "renamee"]
    assert np.array_equal(np.load(m.p("30/state/a.npy")), np.ones(2, np.float32))
    os.rename(m.p("renamee"), m.p("31"))
    assert sorted(os.listdir(src)) == ["30", "31"]
    assert np.array_equal(np.load(m.p("31/state/b.npy")), v)
    assert logged, f"the refused rename is not logged with the step name:\n{lg.text()[-2000:]}"


def test_array_file_directly_in_step(root):
    src, m = root
    lg = Log(m)
    e = err(np.save, m.p("30/a.npy"), np.ones(2, np.float32))
    assert e in (errno.EPERM, errno.EINVAL), f"errno {e}"
    alive(m)
    assert_logged(lg, "a.npy")
    assert sorted(os.listdir(m.p("30"))) == ["state"]
    assert os.listdir(m.p("30/state")) == []
    # a file that is not .npy in an item makes it a stored copy of an Orbax
    # item; without the item's _METADATA it is not one, and the commit says so
    lg = Log(m)
    write_at(m.p("30/state/notes.txt"), b"hello")
    assert err(commit, m.p("30")) == errno.EINVAL
    alive(m)
    assert_logged(lg, "not an Orbax item")
    assert sorted(os.listdir(src)) == ["30" + TMP]


def test_an_orbax_save_of_a_step_being_written_is_eexist(root):
    src, m = root
    assert err(os.mkdir, m.p("30" + TMP)) == errno.EEXIST
    alive(m)
    assert sorted(os.listdir(m.p())) == ["30"]


@pytest.mark.parametrize("name", ["x" + TMP, "30" + TMP + "x", ".hidden", "metadata"])
def test_bad_step_name_is_einval(root, name):
    src, m = root
    lg = Log(m)
    assert err(os.mkdir, m.p(name)) == errno.EINVAL
    alive(m)
    assert sorted(os.listdir(m.p())) == ["30"]
    assert sorted(os.listdir(src)) == ["30" + TMP]
    assert_logged(lg, name)


@pytest.mark.parametrize("rel", ["_CHECKPOINT_METADATA", "commit_success.txt", "a[0]", "state/p[1]", "state/.x"])
def test_bad_item_or_dir_name_is_einval(root, rel):
    src, m = root
    lg = Log(m)
    assert err(os.mkdir, m.p("30/" + rel)) == errno.EINVAL
    alive(m)
    assert_logged(lg, rel.rsplit("/", 1)[-1])


def test_removing_declared_array(root):
    """rm of a pending array removes it (a retrying writer starts over);
    the directories of a pending step stay."""
    src, m = root
    v = np.arange(6, dtype=np.float32)
    os.mkdir(m.p("30/state/keepdir"))
    np.save(m.p("30/state/keepdir/keep.npy"), np.zeros((2, 2), np.int8))
    os.unlink(m.p("30/state/keepdir/keep.npy"))
    assert os.listdir(m.p("30/state/keepdir")) == []
    lg = Log(m)
    assert err(os.rmdir, m.p("30/state/keepdir")) in (errno.EPERM, errno.ENOTEMPTY)
    alive(m)
    rmdir_logged = lg.has("keepdir")
    np.save(m.p("30/state/keepdir/keep.npy"), v)  # declared anew, another dtype and shape
    commit_and_check(src, m, {"state/keepdir/keep.npy": v})
    assert rmdir_logged, "the refused rmdir of a pending directory is not logged"


def test_read_only_mounts_refuse_new_steps(mount, tmp_path):
    src = tmp_path / "root"
    src.mkdir()
    w = mount(src)
    os.mkdir(w.p("10"))
    os.mkdir(w.p("10/state"))
    np.save(w.p("10/state/a.npy"), np.ones(3, np.float32))
    commit(w.p("10"))
    w.unmount()
    r = mount(src, "ro")
    assert err(os.mkdir, r.p("20")) == errno.EROFS
    assert err(os.mkdir, r.p("10/x")) == errno.EROFS
    assert err(np.save, r.p("10/state/n.npy"), np.ones(1)) == errno.EROFS
    alive(r)
    assert sorted(os.listdir(src)) == ["10"]
    # a mount of one step folder (not a CheckpointManager root) is read-only too
    s = mount(src / "10")
    assert err(os.mkdir, s.p("20")) == errno.EROFS
    assert err(os.mkdir, s.p("state/x")) == errno.EROFS
    alive(s)
    assert sorted(os.listdir(src)) == ["10"]
    assert sorted(os.listdir(src / "10")) == ["_CHECKPOINT_METADATA", "commit_success.txt", "state"]
