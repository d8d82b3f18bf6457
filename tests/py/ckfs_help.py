"""Helpers shared by several test modules (one place, so that test modules
never import each other).  Moved here from the modules that first needed
them: writing steps (test_write), writable copies of fixtures (test_names),
shard surgery (test_bad_input), Orbax-style saves into a live root
(test_live_root), the trees of view recipes's sources (test_oracle_recipes)."""

import hashlib
import io
import json
import multiprocessing
import os
import shutil
import struct
import subprocess
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
    """The root's steps: its listing less `latest` (the link to the newest
    committed step, which test_latest.py checks)."""
    return sorted(n for n in os.listdir(m.p()) if n != "latest")


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


# from test_write.py: writing step 30 the ways a user would (also the
# step the oracle tests hand to the real Orbax)
FORK = multiprocessing.get_context("fork")


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


# from test_oracle_recipes.py: each family's tree in tiny dimensions (E = H*D
# as the real ones, GQA: K < H), saved by the real Orbax
RECIPE_DIMS = (64, 4, 2, 16, 96, 3, 256)  # E, H, K, D, F, L, V


def recipe_save(root, step, state):
    import orbax.checkpoint as ocp
    mngr = ocp.CheckpointManager(str(root), item_names=("items",))
    mngr.save(step, args=ocp.args.Composite(items=ocp.args.StandardSave(state)))
    mngr.wait_until_finished()
    mngr.close()


def recipe_rand(rng, shape, dtype):
    import ml_dtypes
    a = rng.standard_normal(shape).astype(np.float32)
    return a.astype(ml_dtypes.bfloat16) if dtype == "bfloat16" else a


def maxtext_llama(rng, dtype, d=None):
    """params of a MaxText llama2 decoder (scanned, scan axis 1)."""
    E, H, K, D, F, L, V = RECIPE_DIMS
    d = D if d is None else d
    r = lambda *s: recipe_rand(rng, s, dtype)  # noqa: E731
    layers = {
        "pre_self_attention_layer_norm": {"scale": r(E, L)},
        "post_self_attention_layer_norm": {"scale": r(E, L)},
        "self_attention": {"query": {"kernel": r(E, L, H, d)}, "key": {"kernel": r(E, L, K, d)},
                           "value": {"kernel": r(E, L, K, d)}, "out": {"kernel": r(H, L, d, E)}},
        "mlp": {"wi_0": {"kernel": r(E, L, F)}, "wi_1": {"kernel": r(E, L, F)}, "wo": {"kernel": r(F, L, E)}},
    }
    return {"token_embedder": {"embedding": r(V, E)},
            "decoder": {"layers": layers, "decoder_norm": {"scale": r(E)},
                        "logits_dense": {"kernel": r(E, V)}}}


def assert_folder(folder, want):
    """Every tensor of the safetensors file(s) in folder equals want, bytes,
    dtype and shape; nothing more, nothing less."""
    import ml_dtypes  # noqa: F401
    import pytest
    from safetensors import safe_open
    from safetensors.numpy import load_file
    files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    assert files, os.listdir(folder)
    got = {}
    for f in files:
        with safe_open(str(folder / f), framework="numpy") as st:
            for k in st.keys():
                got[k] = st.get_tensor(k)
        whole = load_file(str(folder / f))
        for k, t in whole.items():
            assert t.tobytes() == got[k].tobytes()
    assert sorted(got) == sorted(want), sorted(set(got) ^ set(want))
    for k, w in want.items():
        g = got[k]
        assert (g.dtype, g.shape) == (w.dtype, w.shape), (k, g.dtype, g.shape, w.dtype, w.shape)
        if g.tobytes() != w.tobytes():
            bad = np.flatnonzero(g.view(np.uint8) != w.view(np.uint8))
            pytest.fail(f"{k}: {bad.size} bytes differ, first at {bad[:5]}")
    return len(got)
