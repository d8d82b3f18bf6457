"""Writing new checkpoint steps through the mount (lib/view.h, "Writing a
new step"; docs/format.md, "What ckptfs writes").

A fresh, empty folder is mounted as a CheckpointManager root and step 30 is
written the ways a user would: np.save of every dtype numpy can make (plus
bfloat16 and 8-bit floats as void descrs or a dtype name), ranks 0..3,
cp and `cat >` of .npy files, an array declared by open_memmap
and filled by 4 processes writing slice files at once, an array filled by 2
processes with os.pwrite, one filled through np.memmap, nested pytree
directories, a list-like directory and a second item.  After the commit the
step is read back through the same mount, through a fresh daemon (byte for
byte, slices included), decoded by the independent zarr3_verify checker,
and its metadata files are inspected.  Other tests: a second step leaves
the first untouched, commit by rename, abort by rmdir, and a pending step
is never visible as a step to anyone but its writer.
"""

import errno
import hashlib
import io
import json
import multiprocessing
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import ckfs_util as U
from ckfs_help import Arr, assert_file_is, commit, makedirs_in_mount, npy_bytes, read_bytes, rng, root_with_step_10, small_step, tree_files  # noqa: F401
import zarr3_verify as V

# Every test here writes through the writer's compression threads, and step 30
# is filled by several processes at once.
pytestmark = pytest.mark.concurrent

TMP = ".orbax-checkpoint-tmp"
FORK = multiprocessing.get_context("fork")


# ---------------------------------------------------------------------------
# helpers


def header_len(descr, shape):
    return len(npy_bytes(descr, shape, b""))


def plain_arrays(seed):
    """rel path (inside the item) -> Arr, for arrays written with np.save."""
    r = rng(seed)
    out = {}
    ints = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]
    for i, name in enumerate(ints):
        info = np.iinfo(name)
        v = r.integers(info.min, info.max, size=(5, 3 + i), dtype=name, endpoint=True)
        out[f"dtypes/{name}.npy"] = Arr(v, name)
    out["dtypes/bool.npy"] = Arr(r.integers(0, 2, size=(4, 9)).astype(np.bool_), "bool")
    for name in ("float16", "float32", "float64"):
        v = r.standard_normal((6, 7)).astype(name)
        v.flat[0] = np.inf
        v.flat[1] = -0.0
        v.flat[2] = np.nan
        out[f"dtypes/{name}.npy"] = Arr(v, name)
    c = (r.standard_normal((3, 4)) + 1j * r.standard_normal((3, 4)))
    out["dtypes/complex64.npy"] = Arr(c.astype(np.complex64), "complex64")
    out["dtypes/complex128.npy"] = Arr(c.astype(np.complex128), "complex128")
    out["ranks/r0.npy"] = Arr(np.array(r.standard_normal(), dtype=np.float32), "float32")
    out["ranks/r1.npy"] = Arr(r.integers(-1000, 1000, size=(11,), dtype=np.int32), "int32")
    out["ranks/r2.npy"] = Arr(r.standard_normal((9, 4)).astype(np.float64), "float64")
    out["ranks/r3.npy"] = Arr(r.integers(0, 255, size=(3, 4, 5), dtype=np.uint8), "uint8")
    out["params/dense/kernel.npy"] = Arr(r.standard_normal((16, 8)).astype(np.float32), "float32")
    out["params/dense/bias.npy"] = Arr(r.standard_normal((8,)).astype(np.float32), "float32")
    out["layers/0/w.npy"] = Arr(r.standard_normal((4, 4)).astype(np.float32), "float32")
    out["layers/1/w.npy"] = Arr(r.standard_normal((4, 6)).astype(np.float32), "float32")
    return out


def bf16_patterns(r, shape):
    """uint16 patterns of bfloat16 numbers (the top halves of float32s)."""
    f = r.standard_normal(shape).astype(np.float32)
    return (f.view(np.uint32) >> 16).astype(np.uint16)


def write_bytes(path, data):
    with open(path, "wb") as f:
        f.write(data)


# ---------------------------------------------------------------------------
# multi-process writers (fork: the children only do file I/O)

def _slice_writer(barrier, jobs):
    """jobs: [(path, file bytes)]; write each as one file after the barrier."""
    try:
        barrier.wait(timeout=60)
        for path, data in jobs:
            write_bytes(path, data)
    except BaseException as e:  # noqa: BLE001 - reported through the exit code
        import traceback
        traceback.print_exc()
        os._exit(3 if isinstance(e, OSError) else 4)
    os._exit(0)


def _pwrite_worker(barrier, path, ranges, data):
    """pwrite data[a:b] at file offset `base + a` for every (base, a, b)."""
    try:
        fd = os.open(path, os.O_WRONLY)
        try:
            barrier.wait(timeout=60)
            for off, a, b in ranges:
                n = os.pwrite(fd, data[a:b], off)
                if n != b - a:
                    raise AssertionError(f"short pwrite {n} of {b - a}")
        finally:
            os.close(fd)
    except BaseException:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        os._exit(3)
    os._exit(0)


def run_procs(procs):
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.exitcode is None:
            p.kill()
            p.join()
    assert codes == [0] * len(procs), f"writer processes failed: exit codes {codes} (tracebacks in stderr)"


# ---------------------------------------------------------------------------
# step 30: write it, commit it

def multi_writer_arrays(seed):
    r = rng(seed)
    return {
        "multi/rows.npy": Arr(r.standard_normal((37, 29)).astype(np.float32), "float32"),
        # > 4 MiB: several inner chunks, split by columns
        "multi/cols.npy": Arr(r.standard_normal((1100, 1024)).astype(np.float32), "float32"),
        "multi/blocks.npy": Arr(bf16_patterns(r, (6, 10, 7)), "bfloat16", "<V2"),
        "pw.npy": Arr(r.standard_normal((300, 7)).astype(np.float64), "float64"),
        "mm.npy": Arr(r.integers(-30000, 30000, size=(50, 33), dtype=np.int16), "int16"),
        "om.npy": Arr(r.standard_normal((20, 3, 5)).astype(np.float32), "float32"),
    }


# rows: uneven row slices, cols: uneven column slices, blocks: 2-d blocks of
# a 3-d array.  One list per process.
SLICE_PLAN = [
    [("multi/rows", "[:5]", np.s_[0:5]), ("multi/cols", "[:,0:100]", np.s_[:, 0:100]),
     ("multi/blocks", "[0:3,0:4]", np.s_[0:3, 0:4])],
    [("multi/rows", "[5:17]", np.s_[5:17]), ("multi/cols", "[:,100:613]", np.s_[:, 100:613]),
     ("multi/blocks", "[0:3,4:]", np.s_[0:3, 4:10])],
    [("multi/rows", "[17]", np.s_[17:18]), ("multi/cols", "[:,613]", np.s_[:, 613:614]),
     ("multi/blocks", "[3:,0:9]", np.s_[3:6, 0:9])],
    [("multi/rows", "[18:]", np.s_[18:37]), ("multi/cols", "[:,-410:]", np.s_[:, 614:1024]),
     ("multi/blocks", "[3:6,9:10]", np.s_[3:6, 9:10])],
]


def special_arrays(seed):
    """Arrays whose header is written by hand: '<V2' bfloat16, '<V1'
    float8_e4m3fn, a dtype name as descr, and void arrays np.save writes as
    '|V2' / '|V1'."""
    r = rng(seed)
    return {
        "dtypes/bfloat16.npy": (Arr(bf16_patterns(r, (7, 5)), "bfloat16", "<V2"), "<V2"),
        "dtypes/bf16_npsave.npy": (Arr(bf16_patterns(r, (3, 3)), "bfloat16", "<V2"), "npsave"),
        # '<V1' names no type: the dtype is named with user.ckpt.dtype first
        "dtypes/f8_e4m3fn.npy": (Arr(r.integers(0, 256, size=(4, 6), dtype=np.uint8), "float8_e4m3fn", "<V1"),
                                 "xattr"),
        "dtypes/f8_e5m2.npy": (Arr(r.integers(0, 256, size=(9,), dtype=np.uint8), "float8_e5m2", "<V1"),
                               "float8_e5m2"),
    }


def write_step(step_dir, tmp_path, seed, full=True):
    """Write the items of a step into the pending step_dir; returns
    {rel path inside the step: Arr}."""
    exp = {}
    os.mkdir(step_dir / "state")
    os.mkdir(step_dir / "opt")
    st = step_dir / "state"
    for rel, a in plain_arrays(seed).items():
        makedirs_in_mount(st, Path(rel).parent)
        np.save(st / rel, a.values)
        exp["state/" + rel] = a
    for rel, (a, how) in special_arrays(seed + 1).items():
        makedirs_in_mount(st, Path(rel).parent)
        if how == "npsave":
            np.save(st / rel, a.values.view(f"V{a.values.itemsize}"))
        elif how == "xattr":
            fd = os.open(st / rel, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.setxattr(fd, "user.ckpt.dtype", a.dtype.encode())
                data = npy_bytes("<V1", a.shape, a.raw)
                assert os.write(fd, data) == len(data)
            finally:
                os.close(fd)
        else:
            write_bytes(st / rel, npy_bytes(how, a.shape, a.raw))
        exp["state/" + rel] = a
    # cp and `cat >` of .npy files made outside the mount
    r = rng(seed + 2)
    for tool in ("cp", "cat"):
        a = Arr(r.standard_normal((33, 17)).astype(np.float32), "float32")
        src = tmp_path / f"{tool}-{seed}.npy"
        np.save(src, a.values)
        dst = st / f"{tool}.npy"
        if tool == "cp":
            subprocess.run(["cp", str(src), str(dst)], check=True)
        else:
            subprocess.run(["sh", "-c", 'cat "$1" > "$2"', "sh", str(src), str(dst)], check=True)
        exp[f"state/{tool}.npy"] = a
    # second item
    opt = {"opt/count.npy": Arr(np.array(seed, dtype=np.int32), "int32"),
           "opt/mu/layers/0/w.npy": Arr(r.standard_normal((4, 4)).astype(np.float32), "float32"),
           "opt/mu/layers/1/w.npy": Arr(r.standard_normal((4, 6)).astype(np.float32), "float32")}
    for rel, a in opt.items():
        makedirs_in_mount(step_dir, Path(rel).parent)
        np.save(step_dir / rel, a.values)
        exp[rel] = a
    if not full:
        return exp

    multi = multi_writer_arrays(seed + 3)
    os.mkdir(st / "multi")
    # declare with open_memmap (global header), fill with slice files from 4 processes
    for rel in ("multi/rows.npy", "multi/cols.npy", "multi/blocks.npy"):
        a = multi[rel]
        dt = np.dtype("V2") if a.dtype == "bfloat16" else a.values.dtype
        mm = np.lib.format.open_memmap(st / rel, mode="w+", dtype=dt, shape=a.shape)
        del mm
    barrier = FORK.Barrier(len(SLICE_PLAN))
    procs = []
    for k, plan in enumerate(SLICE_PLAN):
        jobs = []
        for stem, text, sl in plan:
            a = multi[stem + ".npy"]
            part = np.ascontiguousarray(a.values[sl])
            # bfloat16 slices: '<V2' by hand for even workers, np.save ('|V2') for odd ones
            if a.dtype == "bfloat16" and k % 2:
                buf = io.BytesIO()
                np.save(buf, part.view("V2"))
                data = buf.getvalue()
            else:
                data = npy_bytes(a.descr, part.shape, part.tobytes())
            jobs.append((str(st / (stem + text + ".npy")), data))
        procs.append(FORK.Process(target=_slice_writer, args=(barrier, jobs)))
    run_procs(procs)
    # pw.npy: header by one write, data by 2 processes with pwrite of odd-sized blocks
    a = multi["pw.npy"]
    hdr = npy_bytes(a.descr, a.shape, b"")
    write_bytes(st / "pw.npy", hdr)
    raw = a.raw
    blocks = [(i, min(i + 1001, len(raw))) for i in range(0, len(raw), 1001)]
    barrier = FORK.Barrier(2)
    procs = [FORK.Process(target=_pwrite_worker,
                          args=(barrier, str(st / "pw.npy"),
                                [(len(hdr) + x, x, y) for x, y in blocks[k::2]], raw))
             for k in range(2)]
    run_procs(procs)
    # mm.npy: header written, data through np.memmap(mode='r+')
    a = multi["mm.npy"]
    write_bytes(st / "mm.npy", npy_bytes(a.descr, a.shape, b""))
    mm = np.memmap(st / "mm.npy", dtype=a.values.dtype, mode="r+", offset=header_len(a.descr, a.shape),
                   shape=a.shape)
    mm[:] = a.values
    mm.flush()
    del mm
    # om.npy: open_memmap declares and fills through its own mapping
    a = multi["om.npy"]
    mm = np.lib.format.open_memmap(st / "om.npy", mode="w+", dtype=a.values.dtype, shape=a.shape)
    mm[:] = a.values
    mm.flush()
    del mm
    for rel, a in multi.items():
        exp["state/" + rel] = a
    return exp


# slice files read back after the commit: (rel, slice text, numpy index)
SLICE_READS = [
    ("state/multi/rows.npy", "[0:2]", np.s_[0:2]),
    ("state/multi/rows.npy", "[-3:]", np.s_[34:37]),
    ("state/multi/cols.npy", "[:,3:7]", np.s_[:, 3:7]),
    ("state/multi/cols.npy", "[549:551,1000:]", np.s_[549:551, 1000:]),
    ("state/multi/blocks.npy", "[1,2:5]", np.s_[1:2, 2:5]),
    ("state/params/dense/kernel.npy", "[0:2]", np.s_[0:2]),
    ("state/ranks/r3.npy", "[2]", np.s_[2:3]),
    ("state/dtypes/bfloat16.npy", "[1:3,4]", np.s_[1:3, 4:5]),
    ("state/pw.npy", "[100:201]", np.s_[100:201]),
]


def slice_rel(rel, text):
    return rel[:-4] + text + ".npy"


class Written:
    pass


@pytest.fixture(scope="module")
def step30(tmp_path_factory):
    """Step 30 written through a mount of an empty root and committed.
    Everything the tests check about the writing mount is captured here
    (values are compared in the tests); the mount is then unmounted."""
    base = tmp_path_factory.mktemp("w30")
    src = base / "root"
    src.mkdir()
    f = U.MountFactory(base / "mounts")
    w = Written()
    w.src = src
    try:
        m = f(src)
        w.mount_log = m
        os.mkdir(m.p("30"))
        w.exp = write_step(m.p("30"), base, seed=30)
        w.pending_listing = sorted(os.listdir(src))
        commit(m.p("30"))
        w.listing_after = sorted(os.listdir(src))
        w.mnt_listing = sorted(os.listdir(m.p()))
        # (a) read everything back through the same mount
        w.same = {}
        for rel in w.exp:
            w.same[rel] = read_bytes(m.p("30/" + rel))
        for rel, text, _ in SLICE_READS:
            w.same[slice_rel(rel, text)] = read_bytes(m.p("30/" + slice_rel(rel, text)))
        w.dtype_xattr = {rel: os.getxattr(m.p("30/" + rel), "user.ckpt.dtype").decode() for rel in w.exp}
        m.unmount()
        w.returncode = m.returncode
        w.log = m.log()
    finally:
        f.close()
    return w


def test_pending_step_is_only_a_tmp_folder_on_disk(step30):
    assert step30.pending_listing == ["30" + TMP]
    assert step30.listing_after == ["30"]
    assert step30.mnt_listing == ["30"]
    assert step30.returncode == 0


def test_same_mount_reads_back_committed_step(step30):
    for rel, a in step30.exp.items():
        got = step30.same[rel]
        assert got == a.file_bytes(), f"{rel}: bytes read through the writing mount differ"
        assert step30.dtype_xattr[rel] == a.dtype, f"{rel}: user.ckpt.dtype {step30.dtype_xattr[rel]!r}"
    for rel, text, sl in SLICE_READS:
        a = step30.exp[rel]
        assert step30.same[slice_rel(rel, text)] == a.file_bytes(sl), f"{slice_rel(rel, text)} differs"


def test_fresh_mount_reads_back_byte_for_byte(step30, mount):
    m = mount(step30.src)
    assert sorted(os.listdir(m.p())) == ["30"]
    assert sorted(os.listdir(m.p("30"))) == ["_CHECKPOINT_METADATA", "commit_success.txt", "opt", "state"]
    for rel, a in step30.exp.items():
        assert_file_is(m.p("30/" + rel), a, what=rel)
        assert os.getxattr(m.p("30/" + rel), "user.ckpt.dtype").decode() == a.dtype, rel
        assert os.getxattr(m.p("30/" + rel), "user.ckpt.shape").decode() == U.fmt_list(a.shape), rel
    for rel, text, sl in SLICE_READS:
        assert_file_is(m.p("30/" + slice_rel(rel, text)), step30.exp[rel], sl, what=slice_rel(rel, text))
    # the pytree directories are what was created
    assert sorted(os.listdir(m.p("30/state/layers"))) == ["0", "1"]
    assert sorted(os.listdir(m.p("30/state/params/dense"))) == ["bias.npy", "kernel.npy"]
    assert sorted(os.listdir(m.p("30/opt/mu/layers/1"))) == ["w.npy"]
    # bfloat16 through the documented view: raw uint16 patterns
    bf = np.load(m.p("30/state/multi/blocks.npy"))
    assert bf.dtype.itemsize == 2 and bf.dtype.kind == "V"
    assert np.array_equal(bf.view("<u2"), step30.exp["state/multi/blocks.npy"].values)


def test_zarr3_verify_decodes_written_values(step30):
    arrays, problems = V.verify(str(step30.src / "30"))
    assert problems == []
    want = {}
    for rel, a in step30.exp.items():
        item, rest = rel.split("/", 1)
        want[(item, rest[:-4].replace("/", "."))] = a
    assert set(arrays) == set(want)
    for k, a in want.items():
        got = arrays[k]
        assert tuple(got.shape) == a.shape, k
        assert got.tobytes() == a.raw, f"{k}: decoded values differ"


def test_metadata_files(step30):
    step = step30.src / "30"
    names = set(os.listdir(step30.src))
    assert names == {"30"}, names
    assert not [p for p in step.rglob("*") if TMP in p.name]
    cm = json.loads((step / "_CHECKPOINT_METADATA").read_text())
    assert set(cm["item_handlers"]) == {"state", "opt"}
    assert isinstance(cm["commit_timestamp_nsecs"], int)
    assert (step / "commit_success.txt").read_text() == f"Checkpoint commit was successful to {step}"
    for item in ("state", "opt"):
        assert (step / item / "commit_success.txt").is_file()
        meta = json.loads((step / item / "_METADATA").read_text())
        assert meta["use_zarr3"] is True and meta["use_ocdbt"] is False
    tm = json.loads((step / "state" / "_METADATA").read_text())["tree_metadata"]
    km = tm["('layers', '0', 'w')"]["key_metadata"]
    assert km == [{"key": "layers", "key_type": 2}, {"key": "0", "key_type": 1}, {"key": "w", "key_type": 2}]
    km = tm["('params', 'dense', 'kernel')"]["key_metadata"]
    assert [k["key_type"] for k in km] == [2, 2, 2]
    tm = json.loads((step / "opt" / "_METADATA").read_text())["tree_metadata"]
    km = tm["('mu', 'layers', '1', 'w')"]["key_metadata"]
    assert [(k["key"], k["key_type"]) for k in km] == [("mu", 2), ("layers", 2), ("1", 1), ("w", 2)]
    assert set(tm) == {"('count',)", "('mu', 'layers', '0', 'w')", "('mu', 'layers', '1', 'w')"}
    z = json.loads((step / "state" / "dtypes.bfloat16" / "zarr.json").read_text())
    assert z["data_type"] == "bfloat16" and z["shape"] == [7, 5]
    z = json.loads((step / "state" / "dtypes.f8_e5m2" / "zarr.json").read_text())
    assert z["data_type"] == "float8_e5m2"


def test_second_step_leaves_first_unchanged(step30, mount, tmp_path):
    before = tree_files(step30.src / "30")
    m = mount(step30.src)
    os.mkdir(m.p("40"))
    exp40 = write_step(m.p("40"), tmp_path, seed=40, full=False)
    commit(m.p("40"))
    assert sorted(os.listdir(step30.src)) == ["30", "40"]
    assert tree_files(step30.src / "30") == before
    for rel, a in exp40.items():
        assert_file_is(m.p("40/" + rel), a, what="40/" + rel)
    # step 30 through the same (writing) mount is still the old data
    for rel in ("state/params/dense/kernel.npy", "state/multi/cols.npy", "opt/count.npy"):
        assert_file_is(m.p("30/" + rel), step30.exp[rel], what="30/" + rel)
    arrays, problems = V.verify(str(step30.src / "40"))
    assert problems == []
    assert len(arrays) == len(exp40)


# ---------------------------------------------------------------------------
# rename commit, abort, invisibility of pending steps


def test_rename_commits_under_new_name(mount, tmp_path):
    src = tmp_path / "root"
    src.mkdir()
    m = mount(src)
    os.mkdir(m.p("tmp50"))
    exp = small_step(m.p("tmp50"), 50)
    assert sorted(os.listdir(src)) == ["tmp50" + TMP]
    os.rename(m.p("tmp50"), m.p("50"))
    assert sorted(os.listdir(m.p())) == ["50"]
    assert sorted(os.listdir(src)) == ["50"]
    step = src / "50"
    assert (step / "commit_success.txt").read_text() == f"Checkpoint commit was successful to {step}"
    for rel, a in exp.items():
        assert_file_is(m.p("50/" + rel), a, what=rel)
    arrays, problems = V.verify(str(step))
    assert problems == []
    assert arrays[("state", "sub.b")].tobytes() == exp["state/sub/b.npy"].raw
    assert U.errno_of(os.stat, m.p("tmp50")) == errno.ENOENT
    m.unmount()
    m2 = mount(src)
    assert sorted(os.listdir(m2.p())) == ["50"]
    for rel, a in exp.items():
        assert_file_is(m2.p("50/" + rel), a, what=rel)


def test_rmdir_aborts_pending_step(mount, tmp_path):
    src, m, exp10 = root_with_step_10(mount, tmp_path)
    before = tree_files(src / "10")
    os.mkdir(m.p("60"))
    os.mkdir(m.p("60/state"))
    np.save(m.p("60/state/gone.npy"), np.arange(1000, dtype=np.float32))
    a = np.arange(64, dtype=np.int32).reshape(8, 8)
    write_bytes(m.p("60/state/half.npy"), npy_bytes("<i4", (8, 8), a[:4].tobytes()))  # half written
    assert "60" + TMP in os.listdir(src)
    os.rmdir(m.p("60"))
    assert sorted(os.listdir(m.p())) == ["10"]
    assert U.errno_of(os.stat, m.p("60")) == errno.ENOENT
    assert sorted(os.listdir(src)) == ["10"], "the aborted step left something on disk"
    assert tree_files(src / "10") == before
    # the name is free again: a new step 60 starts empty and commits
    os.mkdir(m.p("60"))
    exp60 = small_step(m.p("60"), 61)
    assert sorted(os.listdir(m.p("60/state"))) == ["a.npy", "sub"]
    commit(m.p("60"))
    assert sorted(os.listdir(src)) == ["10", "60"]
    for rel, x in exp60.items():
        assert_file_is(m.p("60/" + rel), x, what=rel)
    for rel, x in exp10.items():
        assert_file_is(m.p("10/" + rel), x, what=rel)
    assert not (src / "60" / "state" / "gone").exists()


def test_pending_step_invisible_to_readers(mount, tmp_path):
    src, w, exp10 = root_with_step_10(mount, tmp_path)
    os.mkdir(w.p("70"))
    exp70 = small_step(w.p("70"), 70)  # complete, but not committed
    # the writer sees its pending step, with what it wrote
    assert sorted(os.listdir(w.p())) == ["10", "70"]
    for rel, a in exp70.items():
        assert read_bytes(w.p("70/" + rel)) == a.file_bytes(), f"pending {rel} reads back wrong"
    # on disk: only the tmp name
    names = sorted(os.listdir(src))
    assert names == ["10", "70" + TMP], names
    # a read-only mount started now shows no step 70, and no tmp folder
    r = mount(src, "ro")
    assert sorted(os.listdir(r.p())) == ["10"]
    assert U.errno_of(os.stat, r.p("70")) == errno.ENOENT
    assert U.errno_of(os.stat, r.p("70" + TMP)) == errno.ENOENT
    for rel, a in exp10.items():
        assert_file_is(r.p("10/" + rel), a, what=rel)
    r.unmount()
    commit(w.p("70"))
    assert sorted(os.listdir(src)) == ["10", "70"]
    r2 = mount(src, "ro")
    assert sorted(os.listdir(r2.p())) == ["10", "70"]
    for rel, a in exp70.items():
        assert_file_is(r2.p("70/" + rel), a, what=rel)
