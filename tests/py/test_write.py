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
from ckfs_help import (  # noqa: F401
    Arr, FORK, SLICE_PLAN, assert_file_is, bf16_patterns, commit, header_len, makedirs_in_mount, multi_writer_arrays,
    npy_bytes, plain_arrays, read_bytes, rng, root_with_step_10, run_procs, small_step, special_arrays, tree_files,
    write_bytes, write_step)
import zarr3_verify as V

# Every test here writes through the writer's compression threads, and step 30
# is filled by several processes at once.
pytestmark = pytest.mark.concurrent

TMP = ".orbax-checkpoint-tmp"


# ---------------------------------------------------------------------------
# helpers


# ---------------------------------------------------------------------------
# multi-process writers (fork: the children only do file I/O)


# ---------------------------------------------------------------------------
# step 30: write it, commit it


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
    assert step30.mnt_listing == ["30", "latest"]
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
    assert sorted(os.listdir(m.p())) == ["30", "latest"]
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
    assert sorted(os.listdir(m.p())) == ["50", "latest"]
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
    assert sorted(os.listdir(m2.p())) == ["50", "latest"]
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
    assert sorted(os.listdir(m.p())) == ["10", "latest"]
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
    assert sorted(os.listdir(w.p())) == ["10", "70", "latest"]
    assert os.readlink(w.p("latest")) == "10"  # a pending step is no committed step
    for rel, a in exp70.items():
        assert read_bytes(w.p("70/" + rel)) == a.file_bytes(), f"pending {rel} reads back wrong"
    # on disk: only the tmp name
    names = sorted(os.listdir(src))
    assert names == ["10", "70" + TMP], names
    # a read-only mount started now shows no step 70, and no tmp folder
    r = mount(src, "ro")
    assert sorted(os.listdir(r.p())) == ["10", "latest"]
    assert U.errno_of(os.stat, r.p("70")) == errno.ENOENT
    assert U.errno_of(os.stat, r.p("70" + TMP)) == errno.ENOENT
    for rel, a in exp10.items():
        assert_file_is(r.p("10/" + rel), a, what=rel)
    r.unmount()
    commit(w.p("70"))
    assert sorted(os.listdir(src)) == ["10", "70"]
    r2 = mount(src, "ro")
    assert sorted(os.listdir(r2.p())) == ["10", "70", "latest"]
    assert os.readlink(r2.p("latest")) == "70"
    for rel, a in exp70.items():
        assert_file_is(r2.p("70/" + rel), a, what=rel)
