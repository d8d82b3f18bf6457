"""Importing safetensors files by copying them into a pending step.

`cp model.safetensors MNT/30/state/params.safetensors` declares one array
per tensor under state/params/ (the name split on '.', as the read side's
safetensors view joins key paths) and streams the data into the writer;
`cp -r shards/ MNT/30/state/params.safetensors.d/` does the same for the
Hugging Face sharded form.  The files come from independent writers: the
real fixture written by safetensors 0.8 (torch), and this module's own
writer following the format (8-byte little-endian header length, a JSON
header, the data buffer), which also makes the hostile ones.
"""

import errno
import json
import os
import random
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

import ckfs_util as U

pytestmark = pytest.mark.concurrent

MANAGER = U.FIXTURES / "manager"
TMP = ".orbax-checkpoint-tmp"

# safetensors code -> (numpy dtype of the bytes, ckptfs dtype name)
CODES = {
    "BOOL": ("|b1", "bool"), "I8": ("<i1", "int8"), "U8": ("<u1", "uint8"),
    "I16": ("<i2", "int16"), "U16": ("<u2", "uint16"), "I32": ("<i4", "int32"),
    "U32": ("<u4", "uint32"), "I64": ("<i8", "int64"), "U64": ("<u8", "uint64"),
    "F16": ("<f2", "float16"), "BF16": ("<u2", "bfloat16"), "F32": ("<f4", "float32"),
    "F64": ("<f8", "float64"), "F8_E4M3": ("<u1", "float8_e4m3fn"), "F8_E5M2": ("<u1", "float8_e5m2"),
}


def st_bytes(tensors, order=None, metadata=None, header=None):
    """A safetensors file: tensors {name: (code, shape, raw bytes)} laid out
    in `order` (names; default sorted), no padding between tensors."""
    names = order or sorted(tensors)
    h, at, data = {}, 0, b""
    if metadata is not None:
        h["__metadata__"] = metadata
    for n in names:
        code, shape, raw = tensors[n]
        h[n] = {"dtype": code, "shape": list(shape), "data_offsets": [at, at + len(raw)]}
        at += len(raw)
        data += raw
    if header is not None:
        h = header
    js = json.dumps(h).encode()
    js += b" " * (-len(js) % 8)
    return struct.pack("<Q", len(js)) + js + data


def rand_tensor(rng, code, shape):
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(CODES[code][0]).itemsize
    if code == "BOOL":
        raw = (rng.integers(0, 2, nbytes, dtype=np.uint8)).tobytes()
    else:
        raw = rng.integers(0, 256, nbytes, dtype=np.uint8).tobytes()
    return (code, tuple(shape), raw)


def npy_data(path):
    """The C-order bytes of a .npy file (its header parsed)."""
    b = Path(path).read_bytes()
    hl = struct.unpack("<H", b[8:10])[0] + 10
    return b[hl:]


def run(cmd):
    p = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout + p.stderr


def commit(step_dir):
    open(Path(step_dir) / "commit_success.txt", "w").close()


@pytest.fixture
def rw(mount, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    return root, mount(root)


def assert_tensors(base, tensors):
    """Every tensor reads back under base/<name with '.' as '/'>.npy."""
    for name, (code, shape, raw) in tensors.items():
        p = Path(base, *name.split(".")).with_suffix(".npy")
        p = p.parent / (name.split(".")[-1] + ".npy")
        assert npy_data(p) == raw, name
        assert os.getxattr(p, "user.ckpt.dtype").decode() == CODES[code][1]
        assert json.loads(os.getxattr(p, "user.ckpt.shape")) == list(shape)


def test_import_of_a_real_safetensors_file(rw, mount):
    """The fixture written by safetensors 0.8 from the Orbax fixture's arrays."""
    root, m = rw
    os.makedirs(m.p("30/state"))
    assert run(f"cp {U.FIXTURES / 'params.safetensors'} {m.p('30/state/weights.safetensors')}")[0] == 0
    commit(m.p("30"))
    ro = mount(MANAGER, "ro")
    fresh = mount(root, "ro")
    for sub in ("params/embed/embedding", "params/layer_0/mlp/w1", "params/layer_0/attn/q_proj",
                "opt_state/mu/embedding"):
        assert npy_data(fresh.p(f"30/state/weights/{sub}.npy")) == npy_data(ro.p(f"20/state/{sub}.npy")), sub


def test_round_trip_orbax_view_import(rw, mount):
    """Orbax step -> cp of its safetensors view -> import -> the same arrays
    under the same names, and the new step's view is byte-identical."""
    root, m = rw
    ro = mount(MANAGER, "ro")
    os.makedirs(m.p("30/state"))
    assert run(f"cp {ro.p('20/state/params.safetensors')} {m.p('30/state/params.safetensors')}")[0] == 0
    commit(m.p("30"))
    fresh = mount(root, "ro")
    want = {str(p.relative_to(ro.p("20/state/params"))): npy_data(p)
            for p in Path(ro.p("20/state/params")).rglob("*.npy")}
    got = {str(p.relative_to(fresh.p("30/state/params"))): npy_data(p)
           for p in Path(fresh.p("30/state/params")).rglob("*.npy")}
    assert want and want == got
    # the new step's view: the same tensors and bytes (only __metadata__'s step differs)
    def split(path):
        b = Path(path).read_bytes()
        n = struct.unpack("<Q", b[:8])[0]
        h = json.loads(b[8:8 + n])
        return h.pop("__metadata__"), h, b[8 + n:]
    ma, ha, da = split(ro.p("20/state/params.safetensors"))
    mb, hb, db = split(fresh.p("30/state/params.safetensors"))
    assert (ha, da) == (hb, db)
    assert (ma["step"], mb["step"]) == ("20", "30")


def test_every_dtype_any_order_no_alignment(rw, mount, tmp_path):
    root, m = rw
    rng = np.random.default_rng(7)
    tensors = {}
    for i, code in enumerate(CODES):
        tensors[f"layers.{i % 3}.{code.lower()}"] = rand_tensor(rng, code, (3, 5 + i))
    tensors["scalar"] = rand_tensor(rng, "F32", ())
    tensors["embed.weight"] = rand_tensor(rng, "BF16", (7, 9))
    order = sorted(tensors)
    random.Random(3).shuffle(order)  # data order differs from name order
    f = tmp_path / "model.safetensors"
    f.write_bytes(st_bytes(tensors, order, metadata={"format": "pt"}))
    os.makedirs(m.p("31/state"))
    assert run(f"cp {f} {m.p('31/state/model.safetensors')}")[0] == 0
    # pending: the file reads back as written
    assert Path(m.p("31/state/model.safetensors")).read_bytes() == f.read_bytes()
    commit(m.p("31"))
    assert_tensors(mount(root, "ro").p("31/state/model"), tensors)


def test_sharded_form_in_shuffled_order(rw, mount, tmp_path):
    root, m = rw
    rng = np.random.default_rng(11)
    tensors = {f"model.layers.{i}.mlp.up_proj.weight": rand_tensor(rng, "F32", (4, 6)) for i in range(6)}
    tensors["model.embed_tokens.weight"] = rand_tensor(rng, "BF16", (10, 4))
    names = sorted(tensors)
    shards = [names[0:3], names[3:5], names[5:]]
    d = tmp_path / "hf"
    d.mkdir()
    weight_map = {}
    for i, part in enumerate(shards):
        fn = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        (d / fn).write_bytes(st_bytes({n: tensors[n] for n in part}))
        weight_map.update({n: fn for n in part})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    os.makedirs(m.p("32/state/params.safetensors.d"))
    files = sorted(os.listdir(d))
    random.Random(5).shuffle(files)
    for fn in files:
        shutil.copyfile(d / fn, m.p(f"32/state/params.safetensors.d/{fn}"))
    commit(m.p("32"))
    assert_tensors(mount(root, "ro").p("32/state/params"), tensors)


def test_a_tensor_in_the_index_but_in_no_file_is_enodata(rw, tmp_path):
    root, m = rw
    rng = np.random.default_rng(1)
    a = {"w.a": rand_tensor(rng, "F32", (4,))}
    os.makedirs(m.p("33/state/p.safetensors.d"))
    Path(m.p("33/state/p.safetensors.d/model-00001-of-00002.safetensors")).write_bytes(st_bytes(a))
    Path(m.p("33/state/p.safetensors.d/model.safetensors.index.json")).write_text(json.dumps(
        {"weight_map": {"w.a": "model-00001-of-00002.safetensors", "w.b": "model-00002-of-00002.safetensors"}}))
    assert U.errno_of(commit, m.p("33")) == errno.ENODATA
    assert "w.b" in m.log()
    assert "33" not in os.listdir(root)


HOSTILE = {
    "unknown dtype": {"a": {"dtype": "Q7", "shape": [2], "data_offsets": [0, 2]}},
    "overlap": {"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                "b": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}},
    "gap": {"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
            "b": {"dtype": "U8", "shape": [4], "data_offsets": [8, 12]}},
    "size does not match shape": {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}},
    "negative offset": {"a": {"dtype": "U8", "shape": [4], "data_offsets": [-4, 0]}},
    "names collide in the tree": {"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},
                                  "a.b": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}},
    "zero-size tensor": {"a": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}},
    "not an object": [1, 2, 3],
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_headers_are_refused_and_the_step_stays_fixable(case, rw, mount):
    root, m = rw
    os.makedirs(m.p("34/state"))
    bad = st_bytes({}, header=HOSTILE[case]) + b"\0" * 16
    p = m.p("34/state/x.safetensors")
    assert U.errno_of(lambda: Path(p).write_bytes(bad)) == errno.EINVAL
    assert "x.safetensors" in m.log()
    os.unlink(p)
    good = {"x.y": rand_tensor(np.random.default_rng(0), "F32", (3,))}
    Path(p).write_bytes(st_bytes(good))
    commit(m.p("34"))
    assert_tensors(mount(root, "ro").p("34/state/x"), good)


def test_header_length_beyond_the_file(rw):
    root, m = rw
    os.makedirs(m.p("35/state"))
    p = m.p("35/state/x.safetensors")
    assert U.errno_of(lambda: Path(p).write_bytes(struct.pack("<Q", 1 << 40) + b"{}")) == errno.EINVAL
    os.unlink(p)
    Path(p).write_bytes(struct.pack("<Q", 4096) + b'{"a": ')  # cut short: never completes
    assert U.errno_of(commit, m.p("35")) == errno.ENODATA
    assert "safetensors header was never completed" in m.log()


def test_import_larger_than_write_buffer_stays_in_bounded_memory(mount, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    m = mount(root, "write_buffer=64M")
    big = np.arange(64 << 20, dtype=np.uint32)  # 256 MiB
    rng = np.random.default_rng(2)
    tensors = {"big.w": ("U32", big.shape, big.tobytes()), "small.b": rand_tensor(rng, "F16", (17,))}
    f = tmp_path / "m.safetensors"
    f.write_bytes(st_bytes(tensors))
    os.makedirs(m.p("36/state"))
    before = U.vm(m.pid)
    assert run(f"cp {f} {m.p('36/state/m.safetensors')}")[0] == 0
    commit(m.p("36"))
    grew = U.vm(m.pid) - before
    if not U.sanitized():
        assert grew < (64 + 96) << 20, f"VmHWM grew {grew >> 20} MiB for a 256 MiB import"
    fresh = mount(root, "ro")
    assert npy_data(fresh.p("36/state/m/big/w.npy")) == tensors["big.w"][2]


def test_copy_again_with_o_trunc(rw, mount, tmp_path):
    root, m = rw
    rng = np.random.default_rng(4)
    t = {"a.b": rand_tensor(rng, "I32", (100,))}
    f = tmp_path / "x.safetensors"
    f.write_bytes(st_bytes(t))
    os.makedirs(m.p("37/state"))
    for _ in range(2):
        assert run(f"cp {f} {m.p('37/state/x.safetensors')}")[0] == 0
    commit(m.p("37"))
    assert_tensors(mount(root, "ro").p("37/state/x"), t)
