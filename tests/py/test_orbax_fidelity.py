"""Writing: every step committed through the mount restores in
Orbax 0.12 as a step Orbax wrote, and what Orbax would refuse is refused.

- Every jax.Array gets a default `_sharding` entry (a single-device
  sharding, as Orbax records for an unsharded array) unless one was set with
  `user.ckpt.sharding`; without it `PyTreeCheckpointer().restore(item)` and
  `CheckpointManager(root).restore(step)` fail ("Sharding of jax.Array
  cannot be None").
- An item with no arrays is refused at commit (or left out of the step).
- A list node with a gap (`layers/1/` without `layers/0/`) is refused.
- `'<V1'` (what np.save writes for every 1-byte ml_dtype) is refused unless
  the dtype was named first (`setfattr -n user.ckpt.dtype -v float8_e5m2`
  on the new file before its data); a descr naming the type still works.
- A JSON item (`MNT/30/metadata/metadata`) is written as Orbax's
  JsonCheckpointHandler writes it and recorded in `item_handlers`.
- uint4 (no TensorStore name), zero-size arrays, reserved item names and
  step names Orbax's step listing does not find are refused with an errno
  and a log line.
Each committed step is also checked by zarr3_verify with restore checks.
"""

import errno
import json
import os
from pathlib import Path

import numpy as np
import pytest

import ckfs_util as U
import zarr3_verify as V
from ckfs_help import Arr, assert_file_is, commit, makedirs_in_mount, npy_bytes, rng

TMP = ".orbax-checkpoint-tmp"
JSON_HANDLER = "orbax.checkpoint._src.handlers.json_checkpoint_handler.JsonCheckpointHandler"
PYTREE_HANDLERS = {
    "orbax.checkpoint._src.handlers.pytree_checkpoint_handler.PyTreeCheckpointHandler",
    "orbax.checkpoint._src.handlers.standard_checkpoint_handler.StandardCheckpointHandler",
}
# What Orbax records for an unsharded array (fixtures' _sharding for 0-d leaves) ...
SINGLE_DEVICE = {"sharding_type": "SingleDeviceSharding", "device_str": "cpu:0"}
# ... and the portable one-device NamedSharding (a mesh of device id 0).
ONE_DEVICE_NAMED = {"sharding_type": "NamedSharding", "shape": [1], "axis_names": ["d"],
                    "axis_types": ["AxisType.Auto"], "partition_spec": [], "device_mesh": {"mesh": [{"id": 0}]}}
# errnos that name a refusal clearly
REFUSED = (errno.EINVAL, errno.EPERM, errno.ENOTSUP, errno.ENODATA)


# ---------------------------------------------------------------------------
# helpers

def new_root(mount, tmp_path):
    src = tmp_path / "root"
    src.mkdir()
    return src, mount(src)


def put(step_dir, rel, arr):
    makedirs_in_mount(step_dir, Path(rel).parent)
    np.save(Path(step_dir) / rel, arr)


def first_refusal(actions):
    """Run the callables in order; (index, errno) of the first OSError, or (None, None)."""
    for i, fn in enumerate(actions):
        e = U.errno_of(fn)
        if e is not None:
            return i, e
    return None, None


def pending_step(m, name="30"):
    """mkdir step `name` in mount m and write one array, state/a.npy."""
    os.mkdir(m.p(name))
    put(m.p(name), "state/a.npy", np.arange(6, dtype=np.float32))


def assert_refused(src, m, step, actions, word):
    """The callables (the last commits `step`) stop at a refusal with an
    errno of REFUSED; the step is not committed and the log names word."""
    where, e = first_refusal(actions)
    assert where is not None and e in REFUSED, (where, e)
    assert_not_committed(src, step)
    assert_logged(m, word)


def is_single_device(s):
    if s.get("sharding_type") == "SingleDeviceSharding":
        return isinstance(s.get("device_str"), str)
    if s.get("sharding_type") == "NamedSharding":
        shape = s.get("shape")
        spec = s.get("partition_spec")
        mesh = (s.get("device_mesh") or {}).get("mesh")
        flat = np.array(mesh, dtype=object).ravel().tolist() if mesh is not None else [None]
        return (isinstance(shape, list) and int(np.prod(shape)) == 1 and len(flat) == 1
                and isinstance(spec, list) and all(p is None for p in spec))
    return False


def b64(name):
    import base64
    return base64.urlsafe_b64encode(name.encode()).decode()


def array_leaves(item_dir):
    meta = json.loads((Path(item_dir) / "_METADATA").read_text())
    return [".".join(k["key"] for k in e["key_metadata"]) for e in meta["tree_metadata"].values()
            if e["value_metadata"]["value_type"] == "jax.Array"]


def basic_step(step_dir, seed):
    r = rng(seed)
    exp = {
        "state/a.npy": Arr(r.standard_normal((12, 5)).astype(np.float32), "float32"),
        "state/sub/b.npy": Arr(r.integers(0, 100, size=(7,), dtype=np.int64), "int64"),
        "state/layers/0/w.npy": Arr(r.standard_normal((4, 4)).astype(np.float32), "float32"),
        "state/layers/1/w.npy": Arr(r.standard_normal((4, 6)).astype(np.float32), "float32"),
        "state/s.npy": Arr(np.array(3.5, dtype=np.float32), "float32"),
        "opt/count.npy": Arr(np.array(seed, dtype=np.int32), "int32"),
    }
    for rel, a in exp.items():
        put(step_dir, rel, a.values)
    return exp


def assert_not_committed(src, name):
    assert not (Path(src) / name).exists(), f"step {name} was committed although it was refused"


def assert_logged(m, *words):
    m.unmount()
    log = m.log()
    for w in words:
        assert w in log, f"the refusal must be logged naming {w!r}:\n{log[-3000:]}"


# ---------------------------------------------------------------------------
# 1. default sharding

def test_default_sharding_for_every_array(tmp_path, mount):
    src, m = new_root(mount, tmp_path)
    os.mkdir(m.p("30"))
    exp = basic_step(m.p("30"), 30)
    commit(m.p("30"))
    step = src / "30"
    for item in ("state", "opt"):
        table = json.loads((step / item / "_sharding").read_text())
        leaves = array_leaves(step / item)
        assert leaves
        for name in leaves:
            assert b64(name) in table, f"{item}: no _sharding entry for {name}"
            s = json.loads(table[b64(name)])
            assert is_single_device(s), f"{item}/{name}: {s} is not a single-device sharding"
    r = mount(src, "ro")
    for rel in exp:
        sh = json.loads(os.getxattr(r.p("30/" + rel), "user.ckpt.sharding"))
        assert is_single_device(sh), rel
    _, problems = V.verify(str(step), restore_checks=True)
    assert problems == []


def test_explicit_sharding_is_kept(tmp_path, mount):
    src, m = new_root(mount, tmp_path)
    os.mkdir(m.p("30"))
    put(m.p("30"), "state/a.npy", np.arange(16, dtype=np.float32).reshape(4, 4))
    mine = json.dumps({"sharding_type": "NamedSharding", "shape": [2], "axis_names": ["x"],
                       "axis_types": ["AxisType.Auto"], "partition_spec": ["x"],
                       "device_mesh": {"mesh": [{"id": 0}, {"id": 1}]}})
    os.setxattr(m.p("30/state/a.npy"), "user.ckpt.sharding", mine.encode())
    commit(m.p("30"))
    table = json.loads((src / "30" / "state" / "_sharding").read_text())
    assert json.loads(table[b64("a")]) == json.loads(mine)


# ---------------------------------------------------------------------------
# 2. an item with no arrays

def test_item_without_arrays_refused_or_left_out(tmp_path, mount):
    src, m = new_root(mount, tmp_path)
    pending_step(m)
    os.mkdir(m.p("30/empty"))
    os.mkdir(m.p("30/empty/sub"))
    e = U.errno_of(commit, m.p("30"))
    if e is not None:
        assert e in REFUSED, f"errno {e}"
        assert_not_committed(src, "30")
        assert_logged(m, "empty")
        return
    # or left out of the committed step, documented
    step = src / "30"
    cm = json.loads((step / "_CHECKPOINT_METADATA").read_text())
    assert "empty" not in cm["item_handlers"]
    assert not (step / "empty").exists()
    _, problems = V.verify(str(step), restore_checks=True)
    assert problems == []


# ---------------------------------------------------------------------------
# 3. list nodes must be 0..n-1

@pytest.mark.parametrize("rels", [["state/layers/1/w.npy"],
                                  ["state/layers/0/w.npy", "state/layers/2/w.npy"],
                                  ["opt/mu/layers/1/w.npy", "state/a.npy"]],
                         ids=["only_1", "0_and_2", "nested_only_1"])
def test_list_gap_refused_at_commit(rels, tmp_path, mount):
    src, m = new_root(mount, tmp_path)
    os.mkdir(m.p("30"))
    for rel in rels:
        put(m.p("30"), rel, np.ones((2, 2), dtype=np.float32))
    e = U.errno_of(commit, m.p("30"))
    assert e in REFUSED, f"commit with a list gap gave errno {e}"
    assert_not_committed(src, "30")
    assert f"30{TMP}" in os.listdir(src), "the refused step stays pending"
    # filling the gap makes the same pending step committable
    for rel in rels:
        parts = rel.split("/")
        if "layers" not in parts:
            continue
        i = parts.index("layers")
        have = {int(r.split("/")[i + 1]) for r in rels if "/layers/" in r and r.split("/")[:i] == parts[:i]}
        for k in range(max(have)):
            fill = "/".join(parts[:i + 1] + [str(k)] + parts[i + 2:])
            if not (m.p("30") / fill).exists():
                put(m.p("30"), fill, np.zeros((2, 2), dtype=np.float32))
    commit(m.p("30"))
    _, problems = V.verify(str(src / "30"), restore_checks=False)
    assert problems == []
    assert_logged(m, "layers")


# ---------------------------------------------------------------------------
# 4. 1-byte void arrays need a named dtype

def v1_bytes(how, raw, shape):
    if how == "<V1":
        return npy_bytes("<V1", shape, raw)
    import io
    buf = io.BytesIO()
    np.save(buf, np.frombuffer(raw, dtype=np.uint8).reshape(shape).view("V1"))  # '|V1'
    return buf.getvalue()


@pytest.mark.parametrize("how", ["<V1", "|V1"])
def test_unnamed_v1_refused(how, tmp_path, mount):
    src, m = new_root(mount, tmp_path)
    pending_step(m)
    raw = bytes(range(12))
    p = m.p("30/state/f8.npy")
    where, e = first_refusal([lambda: Path(p).write_bytes(v1_bytes(how, raw, (3, 4))),
                              lambda: commit(m.p("30"))])
    assert where is not None, "an unnamed 1-byte void array must be refused"
    assert e in REFUSED, f"errno {e}"
    assert_not_committed(src, "30")
    assert_logged(m, "f8")


@pytest.mark.parametrize("dtype", ["float8_e5m2", "float8_e4m3fn", "int4"])
def test_v1_named_by_xattr_commits_as_that_dtype(dtype, tmp_path, mount):
    src, m = new_root(mount, tmp_path)
    os.mkdir(m.p("30"))
    os.mkdir(m.p("30/state"))
    raw = bytes((i * 7) & 0xFF for i in range(20)) if dtype != "int4" else bytes([0, 1, 7, 0xF8, 0xFF] * 4)
    p = m.p("30/state/f8.npy")
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.setxattr(fd, "user.ckpt.dtype", dtype.encode())  # before the data
        data = npy_bytes("<V1", (4, 5), raw)
        assert os.write(fd, data) == len(data)
    finally:
        os.close(fd)
    commit(m.p("30"))
    z = json.loads((src / "30" / "state" / "f8" / "zarr.json").read_text())
    assert z["data_type"] == dtype
    a = Arr(np.frombuffer(raw, dtype=np.uint8).reshape(4, 5), dtype, "<V1")
    r = mount(src, "ro")
    assert os.getxattr(r.p("30/state/f8.npy"), "user.ckpt.dtype").decode() == dtype
    assert_file_is(r.p("30/state/f8.npy"), a)


def test_v1_named_by_descr_still_works(tmp_path, mount):
    src, m = new_root(mount, tmp_path)
    os.mkdir(m.p("30"))
    os.mkdir(m.p("30/state"))
    raw = bytes(range(10))
    Path(m.p("30/state/e5.npy")).write_bytes(npy_bytes("float8_e5m2", (10,), raw))
    commit(m.p("30"))
    z = json.loads((src / "30" / "state" / "e5" / "zarr.json").read_text())
    assert z["data_type"] == "float8_e5m2"


# ---------------------------------------------------------------------------
# 5. JSON items (CheckpointManager's `metadata` item)

def test_json_metadata_item(tmp_path, mount):
    src, m = new_root(mount, tmp_path)
    os.mkdir(m.p("30"))
    exp = basic_step(m.p("30"), 30)
    os.mkdir(m.p("30/metadata"))
    doc = json.dumps({"step": 30, "note": "hello", "lr": 0.001}).encode()
    with open(m.p("30/metadata/metadata"), "wb") as f:
        f.write(doc)
    assert U.read_all(m.p("30/metadata/metadata")) == doc
    commit(m.p("30"))
    step = src / "30"
    cm = json.loads((step / "_CHECKPOINT_METADATA").read_text())
    assert cm["item_handlers"]["metadata"] == JSON_HANDLER
    assert cm["item_handlers"]["state"] in PYTREE_HANDLERS
    assert (step / "metadata" / "metadata").read_bytes() == doc
    assert (step / "metadata" / "commit_success.txt").is_file()
    assert not (step / "metadata" / "_METADATA").exists()
    assert U.read_all(m.p("30/metadata/metadata")) == doc
    r = mount(src, "ro")
    assert sorted(os.listdir(r.p("30/metadata"))) == ["commit_success.txt", "metadata"]
    assert U.read_all(r.p("30/metadata/metadata")) == doc
    for rel, a in exp.items():
        assert_file_is(r.p("30/" + rel), a, what=rel)
    _, problems = V.verify(str(step), restore_checks=True)
    assert problems == []


def test_json_item_must_be_json(tmp_path, mount):
    src, m = new_root(mount, tmp_path)
    pending_step(m)
    os.mkdir(m.p("30/notes"))
    Path(m.p("30/notes/metadata")).write_bytes(b'{"ok": true}')  # a valid JSON item is accepted
    os.mkdir(m.p("30/metadata"))
    assert_refused(src, m, "30", [lambda: Path(m.p("30/metadata/metadata")).write_bytes(b"{not json"),
                                  lambda: commit(m.p("30"))], "metadata")


# ---------------------------------------------------------------------------
# 6. what Orbax refuses or cannot find

def test_uint4_refused(tmp_path, mount):
    src, m = new_root(mount, tmp_path)
    pending_step(m)
    assert_refused(src, m, "30", [lambda: Path(m.p("30/state/u4.npy")).write_bytes(npy_bytes("uint4", (4,), b"\1\2\3\4")),
                                  lambda: commit(m.p("30"))], "uint4")


def test_zero_size_array_refused(tmp_path, mount):
    src, m = new_root(mount, tmp_path)
    pending_step(m)
    assert_refused(src, m, "30", [lambda: put(m.p("30"), "state/empty.npy", np.zeros((0, 3), dtype=np.float32)),
                                  lambda: commit(m.p("30"))], "empty")


@pytest.mark.parametrize("name", ["metrics", "descriptor", "AUTO"])
def test_reserved_item_name_refused(name, tmp_path, mount):
    src, m = new_root(mount, tmp_path)
    pending_step(m)
    assert_refused(src, m, "30", [lambda: os.mkdir(m.p(f"30/{name}")),
                                  lambda: put(m.p("30"), f"{name}/x.npy", np.arange(4, dtype=np.float32)),
                                  lambda: commit(m.p("30"))], name)


@pytest.mark.parametrize("name", ["abc", "30x", "1e3", "best-model"])
def test_undiscoverable_step_name_refused(name, tmp_path, mount):
    src, m = new_root(mount, tmp_path)
    # commit in place
    where, e = first_refusal([lambda: os.mkdir(m.p(name)),
                              lambda: put(m.p(name), "state/a.npy", np.arange(6, dtype=np.float32)),
                              lambda: commit(m.p(name))])
    assert where is not None and e in REFUSED, (where, e)
    assert_not_committed(src, name)
    # commit by rename: a pending name like tmp60 is fine, the final name is checked
    pending_step(m, "tmp60")
    e = U.errno_of(os.rename, m.p("tmp60"), m.p(name))
    assert e in REFUSED, f"rename to {name!r} gave errno {e}"
    assert_not_committed(src, name)
    os.rename(m.p("tmp60"), m.p("60"))
    assert (src / "60" / "commit_success.txt").is_file()
    assert_logged(m, name)


@pytest.mark.parametrize("name", ["step_40", "40"])
def test_discoverable_step_names_commit(name, tmp_path, mount):
    src, m = new_root(mount, tmp_path)
    os.mkdir(m.p(name))
    put(m.p(name), "state/a.npy", np.arange(6, dtype=np.float32))
    commit(m.p(name))
    assert (src / name / "commit_success.txt").is_file()
    _, problems = V.verify(str(src / name), restore_checks=False)
    assert problems == []


# ---------------------------------------------------------------------------
# 7. the whole step as the independent checker sees it

def test_written_step_passes_restore_checks(tmp_path, mount):
    src, m = new_root(mount, tmp_path)
    os.mkdir(m.p("30"))
    exp = basic_step(m.p("30"), 31)
    commit(m.p("30"))
    arrays, problems = V.verify(str(src / "30"), restore_checks=True)
    assert problems == []
    assert len(arrays) == len(exp)
