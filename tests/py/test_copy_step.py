"""Copying a committed step into a writable mount with the tools people use.

A step commits when its commit_success.txt exists and the step is complete
(docs/usage.md, "When a step commits").  Every tool below reaches the marker
at its own moment (cp walks inode order, tar and os.scandir readdir order,
rsync name order, with temporary files renamed into place), so each copy
must exit 0 and commit exactly the source step: every array byte for byte,
the JSON item, the item handlers of _CHECKPOINT_METADATA and every entry of
each item's _sharding.  The source is a read-only mount of the real Orbax
0.12.4 CheckpointManager fixture (step 20: an OCDBT `state` item and a JSON
`metadata` item) and of a step ckptfs itself wrote.
"""

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import ckfs_util as U

pytestmark = pytest.mark.concurrent

MANAGER = U.FIXTURES / "manager"
TMP = ".orbax-checkpoint-tmp"


def run(cmd, **kw):
    p = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=120, **kw)
    return p.returncode, p.stdout + p.stderr


def files_of(d):
    """{relative path: bytes} of every file under d."""
    out = {}
    for dirpath, _, filenames in os.walk(d):
        for fn in filenames:
            p = Path(dirpath) / fn
            out[str(p.relative_to(d))] = p.read_bytes()
    return out


def assert_same_step(src, dst):
    """The committed step dst (a read-only mount of it) holds what src does."""
    a, b = files_of(src), files_of(dst)
    arrays = sorted(k for k in a if k.endswith(".npy"))
    assert arrays, "the source step has no arrays"
    assert sorted(k for k in b if k.endswith(".npy")) == arrays
    for k in arrays:
        assert a[k] == b[k], f"{k}: other bytes than the source"
    assert a["metadata/metadata"] == b["metadata/metadata"]
    ha = json.loads(a["_CHECKPOINT_METADATA"])["item_handlers"]
    hb = json.loads(b["_CHECKPOINT_METADATA"])["item_handlers"]
    assert ha == hb
    for item in ha:
        if f"{item}/_sharding" in a:
            assert json.loads(a[f"{item}/_sharding"]) == json.loads(b[f"{item}/_sharding"]), item
        if f"{item}/_METADATA" in a:
            ta = json.loads(a[f"{item}/_METADATA"])["tree_metadata"]
            tb = json.loads(b[f"{item}/_METADATA"])["tree_metadata"]
            assert sorted(ta) == sorted(tb), item


def assert_committed(src_root, step):
    """On disk: the step folder with its marker, no tmp folder left."""
    names = os.listdir(src_root)
    assert step in names and step + TMP not in names, names
    assert (Path(src_root) / step / "commit_success.txt").is_file()


@pytest.fixture
def ro_src(mount):
    return mount(MANAGER, "ro")


@pytest.fixture
def rw(mount, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    return root, mount(root)


COPIES = {
    "cp -r": "cp -r {src} {dst}",
    "cp -a": "cp -a {src} {dst}",
    "cp -rp": "cp -rp {src} {dst}",
    "tar": "mkdir {dst} && tar -C {src} -cf - . | tar -C {dst} -xf -",
    "rsync -a": "rsync -a {src}/ {dst}/",
    "rsync -a --inplace": "rsync -a --inplace {src}/ {dst}/",
}


def wait_committed(root, step):
    """A copy of stored files commits once the copy tool has exited: the
    step appears a moment after the tool returns."""
    U.wait_until(lambda: step in os.listdir(root), timeout=10)
    assert_committed(root, step)


def assert_same_files(src, dst, sub):
    """Every file of the stored item sub, byte for byte, on disk."""
    a, b = files_of(Path(src) / sub), files_of(Path(dst) / sub)
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k] == b[k], f"{sub}/{k} differs"


@pytest.mark.parametrize("tool", sorted(COPIES))
def test_copy_of_a_step_commits_exactly_the_step(tool, ro_src, rw, mount):
    root, m = rw
    rc, out = run(COPIES[tool].format(src=ro_src.p("20"), dst=m.p("30")))
    assert rc == 0, out
    assert_committed(root, "30")
    fresh = mount(root, "ro")
    assert_same_step(ro_src.p("20"), fresh.p("30"))
    # the writable mount shows the committed step too
    assert_same_step(ro_src.p("20"), m.p("30"))


@pytest.mark.parametrize("tool", sorted(COPIES))
def test_copy_of_a_step_folder_on_disk(tool, ro_src, rw, mount):
    """A plain Orbax step folder (an OCDBT `state` item) copied from disk:
    its files are kept as they are, and it commits once the tool exited and
    every array reads back."""
    root, m = rw
    rc, out = run(COPIES[tool].format(src=MANAGER / "20", dst=m.p("30")))
    assert rc == 0, out
    wait_committed(root, "30")
    assert_same_files(MANAGER / "20", root / "30", "state")
    assert_same_step(ro_src.p("20"), mount(root, "ro").p("30"))


@pytest.mark.parametrize("src", ["mount", "disk"])
def test_shutil_copytree_commits_exactly_the_step(src, ro_src, rw, mount):
    root, m = rw
    shutil.copytree(ro_src.p("20") if src == "mount" else MANAGER / "20", m.p("30"))
    wait_committed(root, "30")
    assert_same_step(ro_src.p("20"), mount(root, "ro").p("30"))


@pytest.mark.parametrize("layout", ["pytree_zarr3", "pytree_zarr2", "pytree_ocdbt_zarr2"])
def test_stored_item_copied_into_a_pending_step(layout, rw, mount):
    """An item folder as Orbax stored it (zarr v3, zarr v2, OCDBT) copied in
    as `state`; touch commits it at once after reading it back."""
    root, m = rw
    os.mkdir(m.p("45"))
    assert run(f"cp -r {U.FIXTURES / layout} {m.p('45/state')}")[0] == 0
    open(m.p("45/commit_success.txt"), "w").close()
    assert_committed(root, "45")
    a = files_of(U.FIXTURES / layout)
    b = files_of(root / "45" / "state")
    assert {k: v for k, v in a.items() if k != "_CHECKPOINT_METADATA"} == \
        {k: v for k, v in b.items() if k != "_CHECKPOINT_METADATA"}
    src = mount(U.FIXTURES / layout, "ro")
    fresh = mount(root, "ro")
    want = {k: v for k, v in files_of(src.p()).items() if k.endswith(".npy")}
    got = {k: v for k, v in files_of(fresh.p("45/state")).items() if k.endswith(".npy")}
    assert want and want == got


def test_a_damaged_stored_copy_is_refused(rw):
    """A data file of the OCDBT copy cut short: the commit reads the item
    back, fails with EIO naming the array, and the step stays pending."""
    root, m = rw
    os.mkdir(m.p("46"))
    assert run(f"cp -r {MANAGER / '20' / 'state'} {m.p('46/state')}")[0] == 0
    d = Path(m.p("46/state/d"))
    (victim,) = list(d.iterdir())
    os.truncate(victim, victim.stat().st_size // 2)
    e = U.errno_of(lambda: open(m.p("46/commit_success.txt"), "w").close())
    assert e == errno.EIO, e
    assert "does not read back" in m.log()
    assert "46" not in os.listdir(root)


def test_npy_and_stored_files_do_not_mix(rw):
    root, m = rw
    os.makedirs(m.p("47/state"))
    np.save(m.p("47/state/w.npy"), np.ones(3, np.float32))
    assert U.errno_of(lambda: open(m.p("47/state/manifest.ocdbt"), "wb").close()) == errno.EINVAL


def test_copy_of_a_step_ckptfs_wrote(ro_src, rw, mount, tmp_path):
    """A step written through a mount, copied from a read-only mount of it."""
    root, m = rw
    assert run(f"cp -r {ro_src.p('20')} {m.p('30')}")[0] == 0
    ro2 = mount(root, "ro")
    root2 = tmp_path / "root2"
    root2.mkdir()
    m2 = mount(root2)
    rc, out = run(f"tar -C {ro2.p('30')} -cf - . | (mkdir {m2.p('31')} && tar -C {m2.p('31')} -xf -)")
    assert rc == 0, out
    assert_committed(root2, "31")
    assert_same_step(ro_src.p("20"), mount(root2, "ro").p("31"))


def all_files(src):
    out = []
    for dirpath, dirnames, filenames in os.walk(src):
        rel = Path(dirpath).relative_to(src)
        out += [rel / d for d in dirnames]
        out += [rel / f for f in filenames]
    return out


@pytest.mark.parametrize("order", ["marker first", "reverse", "metadata item first"])
def test_commit_waits_for_the_last_file_whatever_the_order(order, ro_src, rw, mount):
    """Files copied one at a time in a hostile order: the step is not
    committed until its last byte has arrived, then it is, exactly."""
    root, m = rw
    src = Path(ro_src.p("20"))
    entries = all_files(src)
    dirs = sorted((e for e in entries if (src / e).is_dir()), key=lambda e: len(e.parts))
    files = [e for e in entries if (src / e).is_file()]
    if order == "marker first":
        files.sort(key=lambda e: (str(e) != "commit_success.txt", str(e)))
    elif order == "reverse":
        files.sort(key=str, reverse=True)
    else:
        files.sort(key=lambda e: (not str(e).startswith("metadata"), str(e) == "_CHECKPOINT_METADATA", str(e)))
    dst = Path(m.p("30"))
    os.mkdir(dst)
    for d in dirs:
        os.mkdir(dst / d)
    for i, f in enumerate(files):
        assert "30" not in os.listdir(root), f"committed before {f} was copied"
        shutil.copyfile(src / f, dst / f)
    assert_committed(root, "30")
    assert_same_step(src, mount(root, "ro").p("30"))


def test_copy_of_one_item_into_a_pending_step(ro_src, rw, mount):
    root, m = rw
    os.mkdir(m.p("40"))
    for tool in ("cp -r {src}/state {dst}/state", "cp -a {src}/metadata {dst}/metadata"):
        rc, out = run(tool.format(src=ro_src.p("20"), dst=m.p("40")))
        assert rc == 0, out
    assert "40" not in os.listdir(root)  # no marker yet: still pending
    open(m.p("40/commit_success.txt"), "w").close()
    assert_committed(root, "40")
    fresh = mount(root, "ro")
    a, b = files_of(ro_src.p("20/state")), files_of(fresh.p("40/state"))
    assert {k: v for k, v in a.items() if k.endswith(".npy")} == {k: v for k, v in b.items() if k.endswith(".npy")}
    assert json.loads(a["_sharding"]) == json.loads(b["_sharding"])


def test_touch_on_an_incomplete_copy_says_what_is_missing(ro_src, rw):
    """A copied _CHECKPOINT_METADATA names the items: an explicit commit of a
    step missing one fails with ENODATA, and the step stays pending."""
    root, m = rw
    os.mkdir(m.p("41"))
    shutil.copyfile(ro_src.p("20/_CHECKPOINT_METADATA"), m.p("41/_CHECKPOINT_METADATA"))
    assert run(f"cp -r {ro_src.p('20/metadata')} {m.p('41/metadata')}")[0] == 0
    rc, out = run(f"touch {m.p('41/commit_success.txt')}")
    assert rc != 0 and "No data available" in out, out
    assert "item state" in m.log()
    assert "41" not in os.listdir(root)
    # the rest arrives: an explicit commit now succeeds
    assert run(f"cp -r {ro_src.p('20/state')} {m.p('41/state')}")[0] == 0
    assert run(f"touch {m.p('41/commit_success.txt')}")[0] == 0
    assert_committed(root, "41")


def test_a_copied_marker_never_commits_a_partial_step(ro_src, rw):
    """The copy stops halfway (a killed cp): the step stays pending, however
    long one waits; removing it leaves nothing."""
    root, m = rw
    os.mkdir(m.p("42"))
    src = Path(ro_src.p("20"))
    for f in ("commit_success.txt", "_CHECKPOINT_METADATA"):
        shutil.copyfile(src / f, m.p(f"42/{f}"))
    assert run(f"cp -r {src / 'metadata'} {m.p('42/metadata')}")[0] == 0
    os.mkdir(m.p("42/state"))
    for f in ("_METADATA", "_sharding", "step.npy"):
        shutil.copyfile(src / "state" / f, m.p(f"42/state/{f}"))
    assert "42" not in os.listdir(root)
    os.rmdir(m.p("42"))
    assert os.listdir(root) == []


def test_attributes_of_pending_files_are_accepted(rw):
    root, m = rw
    os.makedirs(m.p("43/state"))
    w = m.p("43/state/w.npy")
    np.save(w, np.arange(10, dtype=np.float32))
    for cmd in (f"chmod 600 {w}", f"chown 0:0 {w}", f"touch -d '2020-01-01' {w}",
                f"chmod 700 {m.p('43/state')}", f"chown 0 {m.p('43')}"):
        rc, out = run(cmd)
        assert rc == 0, (cmd, out)
    open(m.p("43/commit_success.txt"), "w").close()
    assert_committed(root, "43")
    # and on the committed step, as tar and cp -a do for folders at the end
    assert run(f"chmod 755 {m.p('43/state')} && touch {m.p('43/state')}")[0] == 0
    assert np.array_equal(np.load(m.p("43/state/w.npy")), np.arange(10, dtype=np.float32))


def test_attributes_are_refused_on_a_read_only_mount(ro_src):
    rc, out = run(f"chmod 600 {ro_src.p('20/state/step.npy')}")
    assert rc != 0 and "Read-only" in out, out


def test_append_writes_after_the_header(rw, tmp_path):
    """`cat hdr > f; cat data >> f`: O_APPEND writes go after the bytes
    written so far, not after the size the header declares."""
    root, m = rw
    os.makedirs(m.p("44/state"))
    v = np.arange(1000, dtype=np.int64) * 7
    np.save(tmp_path / "ref.npy", v)
    ref = (tmp_path / "ref.npy").read_bytes()
    hl = len(ref) - v.nbytes
    (tmp_path / "hdr").write_bytes(ref[:hl])
    (tmp_path / "data").write_bytes(ref[hl:])
    w = m.p("44/state/w.npy")
    rc, out = run(f"cat {tmp_path / 'hdr'} > {w} && cat {tmp_path / 'data'} >> {w}")
    assert rc == 0, out
    open(m.p("44/commit_success.txt"), "w").close()
    assert_committed(root, "44")
    assert np.array_equal(np.load(m.p("44/state/w.npy")), v)


def test_a_step_with_no_item_is_refused(rw):
    root, m = rw
    os.mkdir(m.p("50"))
    rc, out = run(f"touch {m.p('50/commit_success.txt')}")
    assert rc != 0 and "Invalid argument" in out, out
    assert "50" not in os.listdir(root)
    assert "nothing to commit" in m.log()
    os.mkdir(m.p("50/state"))  # an empty item is no better
    assert U.errno_of(lambda: open(m.p("50/commit_success.txt"), "w").close()) == errno.EINVAL
    assert "50" not in os.listdir(root)


def test_a_header_that_never_completed_fails_the_commit(rw):
    """A writer killed at the start: its .npy exists with part of a header."""
    root, m = rw
    os.makedirs(m.p("51/state"))
    np.save(m.p("51/state/ok.npy"), np.ones(4, np.float32))
    with open(m.p("51/state/cut.npy"), "wb") as f:
        f.write(b"\x93NUMPY\x01\x00v\x00{'descr'")
    open(m.p("51/state/empty.npy"), "wb").close()
    assert U.errno_of(lambda: open(m.p("51/commit_success.txt"), "w").close()) == errno.ENODATA
    assert "header was never completed" in m.log()
    assert "51" not in os.listdir(root)
    os.unlink(m.p("51/state/cut.npy"))
    os.unlink(m.p("51/state/empty.npy"))
    open(m.p("51/commit_success.txt"), "w").close()
    assert_committed(root, "51")
