"""Helpers shared by several test modules (one place, so that test modules
never import each other).  Moved here from the modules that first needed
them: writing steps (test_write), writable copies of fixtures (test_names),
shard surgery (test_bad_input), Orbax-style saves into a live root
(test_live_root)."""

import hashlib
import io
import json
import os
import shutil
import struct
from pathlib import Path

import numpy as np

import ckfs_util as U
from crc32c_ref import crc32c

# from test_names.py
def _writable_copy(src, dst):
    shutil.copytree(src, dst)
    for d, dirs, files in os.walk(dst):
        os.chmod(d, 0o755)
        for f in files:
            os.chmod(os.path.join(d, f), 0o644)


# from test_names.py
def unsafe_key_item(src):
    """A writable copy of pytree_zarr2 at src whose keys "step" and
    opt_state "count" are renamed to "we/ird" and "100%" (metadata and
    store folders), shown as we%2Fird.npy and opt_state/100%25.npy."""
    _writable_copy(U.FIXTURES / "pytree_zarr2", src)
    meta = json.loads((src / "_METADATA").read_text())
    tree = meta["tree_metadata"]
    # key "step" -> "we/ird": its param name (and store folder) becomes we/ird
    entry = tree.pop("('step',)")
    entry["key_metadata"][0]["key"] = "we/ird"
    tree["('we/ird',)"] = entry
    os.makedirs(src / "we")
    os.rename(src / "step", src / "we" / "ird")
    # key "count" -> "100%": param opt_state.100%
    entry = tree["('opt_state', 'count')"]
    entry["key_metadata"][1]["key"] = "100%"
    os.rename(src / "opt_state.count", src / "opt_state.100%")
    (src / "_METADATA").write_text(json.dumps(meta))


# from test_write.py
def npy_bytes(descr, shape, raw):
    """A .npy v1.0 file with this descr (any text, e.g. '<V2') and shape,
    as np.save writes it, followed by the raw C-order bytes."""
    f = io.BytesIO()
    np.lib.format.write_array_header_1_0(f, {"descr": descr, "fortran_order": False, "shape": tuple(shape)})
    return f.getvalue() + bytes(raw)


# from test_write.py
class Arr:
    """An array written into the mount.

    values: the data as a plain numpy array (bfloat16 as uint16 patterns,
    8-bit floats as uint8); dtype: ckptfs/TensorStore dtype name; descr:
    what the mount must serve in the .npy header."""

    def __init__(self, values, dtype, descr=None):
        self.values = np.array(values, order="C")  # keeps 0-d (ascontiguousarray would not)
        self.dtype = dtype
        self.descr = descr or np.lib.format.dtype_to_descr(self.values.dtype)

    @property
    def shape(self):
        return self.values.shape

    @property
    def raw(self):
        return self.values.tobytes()

    def file_bytes(self, sl=None):
        v = self.values if sl is None else np.ascontiguousarray(self.values[sl])
        return npy_bytes(self.descr, v.shape, v.tobytes())


# from test_write.py
def rng(seed):
    return np.random.default_rng(seed)


# from test_write.py
def makedirs_in_mount(root, rel_dir):
    """mkdir -p inside a pending step (each level one mkdir)."""
    p = Path(root)
    for part in Path(rel_dir).parts:
        p = p / part
        if not p.exists():
            os.mkdir(p)


# from test_write.py
def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


# from test_write.py
def commit(step_dir):
    open(Path(step_dir) / "commit_success.txt", "w").close()


# from test_write.py
def tree_files(d):
    """{relative path: (size, mtime_ns, sha256)} of every file under d."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(d):
        for fn in filenames:
            p = Path(dirpath) / fn
            st = p.stat()
            out[str(p.relative_to(d))] = (st.st_size, st.st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
        for dn in dirnames:
            out[str((Path(dirpath) / dn).relative_to(d)) + "/"] = None
    return out


# from test_write.py
def assert_file_is(path, arr, sl=None, what=""):
    """The mounted .npy at path is byte for byte the file for arr (or its
    slice), and np.load decodes it to the right values."""
    want = arr.file_bytes(sl)
    got = read_bytes(path)
    if got != want:
        n = min(len(got), len(want))
        first = next((i for i in range(n) if got[i] != want[i]), n)
        raise AssertionError(f"{what or path}: {len(got)} bytes served, {len(want)} expected; "
                             f"first difference at byte {first}; served header {got[:128]!r}")
    a = np.load(path)
    v = arr.values if sl is None else arr.values[sl]
    assert a.shape == v.shape, f"{path}: np.load shape {a.shape} != {v.shape}"
    assert a.tobytes() == np.array(v, order="C").tobytes(), f"{path}: np.load values differ"


# from test_write.py
def small_step(step_dir, seed):
    r = rng(seed)
    exp = {"state/a.npy": Arr(r.standard_normal((12, 5)).astype(np.float32), "float32"),
           "state/sub/b.npy": Arr(r.integers(0, 100, size=(7,), dtype=np.int64), "int64")}
    os.mkdir(step_dir / "state")
    os.mkdir(step_dir / "state" / "sub")
    for rel, a in exp.items():
        np.save(step_dir / rel, a.values)
    return exp


# from test_write.py
def root_with_step_10(mount, tmp_path):
    """A new root folder (tmp_path/root), a writable mount m of it and step
    10 written with small_step and committed; (src, m, exp)."""
    src = tmp_path / "root"
    src.mkdir()
    m = mount(src)
    os.mkdir(m.p("10"))
    exp = small_step(m.p("10"), 10)
    commit(m.p("10"))
    return src, m, exp


# from test_bad_input.py
def write(path, data):
    path = Path(path)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())


# from test_bad_input.py
def shard_layout(array_dir):
    """(number of inner chunks per shard) for a zarr3 sharded array."""
    z = json.loads((Path(array_dir) / "zarr.json").read_text())
    outer = z["chunk_grid"]["configuration"]["chunk_shape"]
    inner = z["codecs"][0]["configuration"]["chunk_shape"]
    n = 1
    for o, i in zip(outer, inner):
        n *= -(-o // i)
    return n


# from test_bad_input.py
def read_shard(path, n):
    b = Path(path).read_bytes()
    index = b[len(b) - 16 * n - 4:len(b) - 4]
    entries = [list(struct.unpack_from("<QQ", index, 16 * i)) for i in range(n)]
    return b, entries


# from test_bad_input.py
def write_shard(path, body, entries):
    """Write `body` followed by an index of `entries` with a correct CRC."""
    index = b"".join(struct.pack("<QQ", o, nb) for o, nb in entries)
    write(path, body + index + struct.pack("<I", crc32c(index)))


# from test_bad_input.py
def rel_of(param):
    return param.replace(".", "/") + ".npy"


# from test_bad_input.py
def check_others(m, expected, broken_param):
    bad = []
    for key, exp in expected.items():
        if key == broken_param:
            continue
        try:
            data = U.read_all(m.p(rel_of(key)))
        except OSError as e:
            bad.append(f"{rel_of(key)}: {e}")
            continue
        if not data.endswith(exp.data) or len(data) - len(exp.data) not in range(64, 64 * 1024, 64):
            bad.append(f"{rel_of(key)}: wrong bytes")
    assert not bad, "undamaged arrays do not read correctly:\n" + "\n".join(bad)


# from test_live_root.py
TMP = ".orbax-checkpoint-tmp"


# from test_live_root.py
def save_orbax_style(root, step, src_step, tmp_suffix=""):
    """Save `step` into root as Orbax does, copying the items of src_step.
    Returns a callback list of check points: called with a label after each
    stage so the test can look at the mount in between."""
    tmp = Path(root) / f"{step}{TMP}{tmp_suffix}"
    stages = []
    os.mkdir(tmp)
    shutil.copy(Path(src_step) / "_CHECKPOINT_METADATA", tmp / "_CHECKPOINT_METADATA")
    stages.append(("tmp step created", tmp))
    for item in sorted(os.listdir(src_step)):
        s = Path(src_step) / item
        if not s.is_dir():
            continue
        it = tmp / f"{item}{TMP}"
        _writable_copy(s, it)
        os.rename(it, tmp / item)
    stages.append(("items finalized", tmp))
    (tmp / "commit_success.txt").write_text(f"Checkpoint commit was successful to {Path(root) / str(step)}")
    stages.append(("commit file written", tmp))
    os.rename(tmp, Path(root) / str(step))
    return stages


# from test_live_root.py
def listing(m):
    return sorted(os.listdir(m.p()))


# from test_live_root.py
def wait_listing(m, want):
    """Poll (not a timing assertion): a rescan may be driven by inotify."""
    got = U.wait_until(lambda: listing(m) == want, timeout=5)
    return listing(m) if not got else want


# from test_missing_data.py: the fixture array that the shard tests rewrite
Q = "params.layer_0.attn.q_proj"          # f32 [32, 48] in [8, 24] chunks
Q_REL = "params/layer_0/attn/q_proj.npy"


def new_shard_bytes(values):
    """A one-chunk zarr v3 shard (zstd, index with CRC-32C) of float32 values."""
    import zstandard
    body = zstandard.ZstdCompressor().compress(np.ascontiguousarray(values, dtype="<f4").tobytes())
    index = struct.pack("<QQ", 0, len(body))
    return body + index + struct.pack("<I", crc32c(index))
