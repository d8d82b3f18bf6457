"""PyTorch checkpoints mounted as ckptfs trees (docs/usage.md "PyTorch and
safetensors sources"): torch.save files, distributed checkpoints (DCP)
and safetensors files, each tensor read byte-exact through a real mount,
and the whole-checkpoint safetensors view (DIR/.safetensors).

Safetensors files are checked with the small independent parser below
(8-byte length, JSON header, data offsets), not with ckptfs code.
"""

import errno
import json
import os
import struct

import pytest

import ckfs_util as U

HERE = os.path.dirname(os.path.abspath(__file__))
TORCH_FX = os.path.join(HERE, "..", "fixtures", "generated", "torch")


def st_parse(blob):
    """{name: (dtype, shape, bytes)} and __metadata__ of a safetensors file."""
    n = struct.unpack("<Q", blob[:8])[0]
    head = json.loads(blob[8:8 + n].decode("utf-8"))
    meta = head.pop("__metadata__", None)
    data = blob[8 + n:]
    ends = sorted((v["data_offsets"][0], v["data_offsets"][1]) for v in head.values())
    pos = 0
    for b, e in ends:  # contiguous, no gap, no overlap
        assert b == pos, (b, pos)
        pos = e
    assert pos == len(data)
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in head.items()}, meta


def test_whole_item_safetensors_view(mount, fixtures_dir, expected):
    """MNT/.safetensors of an item mount holds every array under its full
    key path (the view of directory X is X.safetensors; '' is the top)."""
    m = mount(fixtures_dir / "pytree_zarr3")
    blob = U.read_all(m.p(".safetensors"))
    tensors, meta = st_parse(blob)
    assert meta == {"format": "pt"}
    assert set(tensors) == set(expected), sorted(set(tensors) ^ set(expected))
    for k, e in expected.items():
        assert tensors[k][2] == e.data, k
    # a sub-directory's view still names tensors relative to it
    sub, _ = st_parse(U.read_all(m.p("params.safetensors")))
    assert "embed.embedding" in sub and sub["embed.embedding"][2] == expected["params.embed.embedding"].data


# ---- helpers ------------------------------------------------------------------

import subprocess
import zipfile

import numpy as np

NP_DT = {"float32": "<f4", "float64": "<f8", "float16": "<f2", "bfloat16": "<u2", "int8": "i1", "uint8": "u1",
         "int16": "<i2", "int32": "<i4", "int64": "<i8", "bool": "?", "complex64": "<c8", "complex128": "<c16"}
ST_CODE = {"float32": "F32", "float64": "F64", "float16": "F16", "bfloat16": "BF16", "int8": "I8", "uint8": "U8",
           "int16": "I16", "int32": "I32", "int64": "I64", "bool": "BOOL", "complex64": "C64"}


def fx_expected(table, name):
    """{key: (dtype, shape, C-order bytes)} of a generated torch fixture."""
    e = json.load(open(os.path.join(TORCH_FX, table)))[name]
    return {k: (v["dtype"], tuple(v["shape"]), open(os.path.join(TORCH_FX, "expected", v["file"]), "rb").read())
            for k, v in e.items()}


def npy_path(m, key):
    return m.p(key.replace(".", "/") + ".npy")


def npy_data(path):
    """The element bytes of a mounted .npy (header length from the header itself)."""
    b = U.read_all(path)
    assert b[:6] == b"\x93NUMPY"
    hl = struct.unpack("<H", b[8:10])[0] if b[6] == 1 else struct.unpack("<I", b[8:12])[0]
    return b[(10 if b[6] == 1 else 12) + hl:]


def check_tensor(m, key, dtype, shape, raw):
    """NAME.npy byte-exact, and its slices: the first row, and a range."""
    p = npy_path(m, key)
    assert npy_data(p) == raw, key
    if shape:
        a = np.frombuffer(raw, dtype=NP_DT[dtype]).reshape(shape)
        n = shape[0]
        lo, hi = (n // 3, n - n // 3) if n > 1 else (0, 1)
        s = npy_data(str(p)[:-4] + "[%d:%d].npy" % (lo, hi))
        assert s == np.ascontiguousarray(a[lo:hi]).tobytes(), key
        r = npy_data(str(p)[:-4] + "[%d].npy" % (n - 1))
        assert r == np.ascontiguousarray(a[n - 1]).tobytes(), key
        if dtype == "bfloat16":  # the float32 companion widens exactly
            f = np.load(str(p)[:-4] + ".f32.npy")
            assert (f.view("<u4") == (a.astype("<u4") << 16)).all()


def run_cli(*args):
    return subprocess.run([str(U.BIN), *map(str, args)], capture_output=True, text=True, timeout=120)


# ---- torch.save -------------------------------------------------------------------

def test_torch_save_every_tensor(mount):
    m = mount(os.path.join(TORCH_FX, "state.pt"))
    exp = fx_expected("expected.json", "state.pt")
    assert len(exp) == 18
    for k, (dt, shape, raw) in exp.items():
        check_tensor(m, k, dt, shape, raw)
    # nested dict keys and Hugging Face names become the key path
    assert sorted(os.listdir(m.p())) == ["model", "step.npy"]
    assert os.path.isdir(m.p("model/model/layers/0/mlp/up_proj"))
    # tied weights: two names over one storage, both served
    assert npy_data(npy_path(m, "model.lm_head.weight")) == npy_data(npy_path(m, "model.model.embed_tokens.weight"))
    assert os.getxattr(npy_path(m, "model.lm_head.weight"), "user.ckpt.dtype") == b"bfloat16"
    assert os.getxattr(npy_path(m, "model.model.layers.1.transposed"), "user.ckpt.shape") == b"[6,4]"


def test_torch_save_member_with_wrong_bytes_is_eio(mount, tmp_path):
    """A tensor that is a whole stored member of the archive (its storage)
    is checked against the member's CRC-32 once read whole: one changed
    byte reads EIO, never the changed byte; tensors of other members read
    as before.  Before, the changed byte was served."""
    import zipfile
    src = os.path.join(TORCH_FX, "state.pt")
    f = tmp_path / "state.pt"
    raw = bytearray(open(src, "rb").read())
    exp = fx_expected("expected.json", "state.pt")
    # the member holding the tensor's bytes, found by content
    key = "model.model.layers.0.norm.weight"
    want = exp[key][2]
    with zipfile.ZipFile(src) as z:
        hits = [i for i in z.infolist() if "/data/" in i.filename and z.read(i) == want]
    assert len(hits) == 1, [i.filename for i in hits]
    info = hits[0]
    start = U.zip_data_offset(raw, info)
    raw[start + len(want) // 2] ^= 0x01
    f.write_bytes(bytes(raw))
    m = mount(f)
    assert U.errno_of(U.read_all, npy_path(m, key)) == errno.EIO
    assert "CRC-32 mismatch of the ZIP member" in m.log()
    other = "model.model.layers.0.mlp.up_proj.weight"
    assert npy_data(npy_path(m, other)) == exp[other][2]


def test_torch_save_permuted_view(mount):
    """A (2, 3, 4) tensor permuted (2, 0, 1): neither C nor Fortran order."""
    m = mount(os.path.join(TORCH_FX, "permuted.pt"))
    (dt, shape, raw), = fx_expected("expected.json", "permuted.pt").values()
    assert shape == (4, 2, 3)
    check_tensor(m, "p", dt, shape, raw)


def test_torch_save_strided_view_refused(mount):
    """x[:, ::2] is no dense block: listed, reads answer EIO, the log says why;
    the other tensor of the file reads."""
    m = mount(os.path.join(TORCH_FX, "strided.pt"))
    exp = fx_expected("expected.json", "strided.pt")
    check_tensor(m, "ok", *exp["ok"])
    assert U.errno_of(U.read_all, m.p("w.npy")) == errno.EIO
    assert "tensor w cannot be served" in m.log() and "strided" in m.log()


def test_torch_legacy_format_refused(mount):
    m = mount(os.path.join(TORCH_FX, "legacy.pt"), expect_ready=False)
    assert m.ready != b"s"
    m.proc.wait(timeout=10)
    assert "legacy format of torch before 1.6" in m.log()


def evil_archive(path, payload):
    """A torch.save-shaped ZIP whose data.pkl asks for a global that runs code."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("evil/data.pkl", payload)
        z.writestr("evil/data/0", b"\0" * 16)
        z.writestr("evil/version", b"3\n")


def unicode_op(text):
    b = text.encode()
    return b"X" + struct.pack("<I", len(b)) + b


@pytest.mark.parametrize("head,name", [
    (b"\x80\x02cposix\nsystem\n", "posix.system"),
    (b"\x80\x02cos\nsystem\n", "os.system"),
    (b"\x80\x04\x8c\x08builtins\x8c\x04exec\x93", "builtins.exec"),
    (b"\x80\x02csubprocess\ncall\n", "subprocess.call"),
])
def test_torch_pickle_refuses_other_globals(mount, tmp_path, head, name):
    """A data.pkl asking for any global off the list: the mount is refused,
    the global named in the log, and nothing ran."""
    mark = tmp_path / "ran"
    cmd = "touch " + str(mark)
    payload = head + unicode_op(cmd if name != "builtins.exec" else "import os; os.system(%r)" % cmd)
    payload += b"\x85R."
    src = tmp_path / "evil.pt"
    evil_archive(src, payload)
    m = mount(src, expect_ready=False)
    assert m.ready != b"s"
    m.proc.wait(timeout=10)
    assert "refused global " + name in m.log(), m.log()
    assert not mark.exists()


def test_torch_safetensors_view_matches_source(mount, tmp_path):
    """cp of MNT/.safetensors: the tensors of the file under their original
    names, byte-identical (complex128 has no safetensors code: left out)."""
    m = mount(os.path.join(TORCH_FX, "state.pt"))
    dst = tmp_path / "model.safetensors"
    subprocess.run(["cp", str(m.p(".safetensors")), str(dst)], check=True)
    tensors, meta = st_parse(dst.read_bytes())
    assert meta == {"format": "pt"}
    exp = fx_expected("expected.json", "state.pt")
    want = {k for k, v in exp.items() if v[0] in ST_CODE}
    assert set(tensors) == want
    for k in want:
        dt, shape, raw = exp[k]
        assert tensors[k] == (ST_CODE[dt], list(shape), raw), k
    # the view of a sub-directory names tensors relative to it
    sub, _ = st_parse(U.read_all(m.p("model/model.safetensors")))
    assert sub["embed_tokens.weight"][2] == exp["model.model.embed_tokens.weight"][2]


def test_torch_info_verify():
    src = os.path.join(TORCH_FX, "state.pt")
    p = run_cli("info", "--json", src)
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    assert len(j["arrays"]) == 18
    keys = {a["key"].replace("/", ".") for a in j["arrays"]}
    assert keys == set(fx_expected("expected.json", "state.pt"))
    p = run_cli("verify", src)
    assert p.returncode == 0, p.stdout + p.stderr
    p = run_cli("verify", os.path.join(TORCH_FX, "strided.pt"))
    assert p.returncode == 1 and "w" in p.stdout + p.stderr


# ---- distributed checkpoints --------------------------------------------------------

def test_dcp_real_fixture(mount, fixtures_dir, expected):
    """The DCP folder torch 2.11 wrote: every tensor equals Orbax's arrays."""
    m = mount(fixtures_dir / "torch_dcp")
    for k, e in expected.items():
        check_tensor(m, k, e.dtype, e.shape, e.data)
    p = run_cli("verify", fixtures_dir / "torch_dcp")
    assert p.returncode == 0, p.stdout + p.stderr
    j = json.loads(run_cli("info", "--json", fixtures_dir / "torch_dcp").stdout)
    assert {a["key"].replace("/", ".") for a in j["arrays"]} == set(expected)


@pytest.mark.parametrize("folder", ["dcp_two_ranks", "dcp_old_names", "dcp_zstd"])
def test_dcp_variants(mount, folder):
    m = mount(os.path.join(TORCH_FX, folder))
    exp = fx_expected("expected_dcp.json", folder)
    for k, (dt, shape, raw) in exp.items():
        check_tensor(m, k, dt, shape, raw)
    # chunk boxes from two ranks: the zarr chunk grid is the boxes ...
    assert os.getxattr(m.p("model/b.npy"), "user.ckpt.chunks") == b"[2,2]"
    # ... or, for uneven boxes, the largest cells every box is made of
    # (columns 0:3 and 3:5: one column per cell, four pieces of its item each)
    assert os.getxattr(m.p("model/cols.npy"), "user.ckpt.chunks") == b"[4,1]"
    if folder == "dcp_two_ranks":
        assert os.getxattr(m.p("model/irregular.npy"), "user.ckpt.chunks") == b"[1,2]"
        # overlapping boxes (rows 0:5 and 3:8): listed, EIO, logged
        assert U.errno_of(U.read_all, m.p("model/overlap.npy")) == errno.EIO
        assert "model.overlap cannot be served" in m.log()
        assert not os.path.exists(m.p("extra.npy"))  # a bytes entry is not shown
        # a view that would leave the unreadable tensor out answers EIO instead
        assert U.errno_of(U.read_all, m.p(".safetensors")) == errno.EIO
    else:
        st, _ = st_parse(U.read_all(m.p(".safetensors")))
        assert set(st) == set(exp)
        for k, (dt, shape, raw) in exp.items():
            assert st[k] == (ST_CODE[dt], list(shape), raw), k
    j = json.loads(run_cli("info", "--json", os.path.join(TORCH_FX, folder)).stdout)
    assert {a["key"].replace("/", ".") for a in j["arrays"]} >= set(exp)
    p = run_cli("verify", os.path.join(TORCH_FX, folder))
    assert p.returncode == (1 if folder == "dcp_two_ranks" else 0), p.stdout + p.stderr


def test_dcp_offsets_beyond_2_31(mount, tmp_path):
    """Items placed beyond 2**31 bytes (LONG1 offsets in .metadata; sparse files)."""
    d = tmp_path / "large"
    subprocess.run(["/usr/bin/python3", os.path.join(TORCH_FX, "make_dcp.py"), "--large", str(d)], check=True)
    m = mount(d)
    exp = fx_expected("expected_dcp.json", "dcp_two_ranks")
    for k in ("model.w", "model.b", "step"):
        check_tensor(m, k, *exp[k])


# ---- safetensors sources ----------------------------------------------------------------

def st_write(path, tensors):
    """A safetensors file from {name: (code, shape, bytes)} (independent writer)."""
    head, off, data = {}, 0, b""
    for k, (code, shape, raw) in tensors.items():
        head[k] = {"dtype": code, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        data += raw
    h = json.dumps(head).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)


def test_safetensors_file(mount, fixtures_dir, expected):
    m = mount(fixtures_dir / "params.safetensors")
    for k, e in expected.items():
        if e.shape:
            check_tensor(m, k, e.dtype, e.shape, e.data)
    # the whole view gives back the same tensors under the same names
    a, _ = st_parse(U.read_all(m.p(".safetensors")))
    b, _ = st_parse((fixtures_dir / "params.safetensors").read_bytes())
    assert a == b
    assert run_cli("verify", fixtures_dir / "params.safetensors").returncode == 0
    j = json.loads(run_cli("info", "--json", fixtures_dir / "params.safetensors").stdout)
    assert {a["key"].replace("/", ".") for a in j["arrays"]} == set(b)


def test_safetensors_sharded_folder(mount, tmp_path, expected):
    d = tmp_path / "hf"
    d.mkdir()
    names = sorted(k for k, e in expected.items() if e.shape)
    half = len(names) // 2
    wm = {}
    for i, part in enumerate((names[:half], names[half:])):
        f = "model-%05d-of-00002.safetensors" % (i + 1)
        st_write(d / f, {k: (ST_CODE[expected[k].dtype], expected[k].shape, expected[k].data) for k in part})
        wm.update({k: f for k in part})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 1}, "weight_map": wm}))
    m = mount(d)
    for k in names:
        e = expected[k]
        check_tensor(m, k, e.dtype, e.shape, e.data)
    assert run_cli("verify", d).returncode == 0


# ---- ZIP64: a torch.save archive with a storage beyond 4 GiB (sparse) -------------

def zip64_torch(path, n, tail):
    """A torch.save-shaped archive, written byte by byte: data.pkl holds a
    uint8 tensor "w" of n elements over storage data/0 and a view "tail" of
    its last len(tail) bytes; data/0 (n bytes, sparse but for the tail) needs
    ZIP64 records.  Hand-written protocol-2 pickle, no torch."""
    def u(s):
        b = s.encode()
        return b"X" + struct.pack("<I", len(b)) + b

    def long1(v):
        b = v.to_bytes(8, "little").rstrip(b"\0") or b"\0"
        if b[-1] & 0x80:
            b += b"\0"
        return b"\x8a" + bytes([len(b)]) + b

    def tensor(off, size):
        return (b"ctorch._utils\n_rebuild_tensor_v2\n((" + u("storage") + b"ctorch\nByteStorage\n" + u("0") +
                u("cpu") + long1(n) + b"tQ" + long1(off) + long1(size) + b"\x85K\x01\x85\x89"
                b"ccollections\nOrderedDict\n)Rt" + b"R")
    pkl = (b"\x80\x02}(" + u("w") + tensor(0, n) + u("tail") + tensor(n - len(tail), len(tail)) + b"u.")
    cd = b""
    with open(path, "wb") as f:
        def member(name, size, data_writer, big):
            nonlocal cd
            off = f.tell()
            nm = name.encode()
            x = struct.pack("<HHQQ", 1, 16, size, size) if big else b""
            s32 = 0xFFFFFFFF if big else size
            f.write(struct.pack("<IHHHHHIIIHH", 0x04034b50, 45, 0, 0, 0, 0, 0, s32, s32, len(nm), len(x)) + nm + x)
            data_writer()
            cx = struct.pack("<HHQQQ", 1, 24, size, size, off) if big else b""
            cd += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014b50, 45, 45, 0, 0, 0, 0, 0, s32, s32, len(nm), len(cx),
                              0, 0, 0, 0, 0xFFFFFFFF if big else off) + nm + cx

        member("big/data.pkl", len(pkl), lambda: f.write(pkl), False)

        def sparse():
            start = f.tell()
            f.truncate(start + n - len(tail))
            f.seek(start + n - len(tail))
            f.write(tail)
        member("big/data/0", n, sparse, True)
        cdoff = f.tell()
        f.write(cd)
        z64 = f.tell()
        f.write(struct.pack("<IQHHIIQQQQ", 0x06064b50, 44, 45, 45, 0, 0, 2, 2, len(cd), cdoff))
        f.write(struct.pack("<IIQI", 0x07064b50, 0, z64, 1))
        f.write(struct.pack("<IHHHHIIH", 0x06054b50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0))


def test_torch_save_zip64(mount, tmp_path):
    n = 2 ** 32 + 4096
    tail = bytes(range(200, 232))
    src = tmp_path / "big.pt"
    zip64_torch(src, n, tail)
    m = mount(src)
    assert npy_data(m.p("tail.npy")) == tail
    assert npy_data(m.p("w[%d:].npy" % (n - 40))) == bytes(8) + tail
    assert os.getxattr(m.p("w.npy"), "user.ckpt.shape") == b"[%d]" % n
    st = os.stat(m.p("w.npy"))
    assert st.st_size == n + 128


def test_dcp_metadata_refuses_other_globals(mount, tmp_path):
    """.metadata is read with the same restricted reader: a global off the
    list (here the os.system a plain pickle.load would run) refuses the mount."""
    import shutil
    d = tmp_path / "dcp"
    shutil.copytree(os.path.join(TORCH_FX, "dcp_old_names"), d)
    mark = tmp_path / "ran"
    cmd = ("touch " + str(mark)).encode()
    (d / ".metadata").write_bytes(b"\x80\x04\x8c\x02os\x8c\x06system\x93X" + struct.pack("<I", len(cmd)) + cmd +
                                  b"\x85R.")
    m = mount(d, expect_ready=False)
    assert m.ready != b"s"
    m.proc.wait(timeout=10)
    assert "refused global os.system" in m.log(), m.log()
    assert not mark.exists()


def test_torch_save_big_endian(mount, tmp_path):
    """An archive whose byteorder member says "big": served little-endian."""
    def u(s):
        return b"X" + struct.pack("<I", len(s)) + s.encode()
    pkl = (b"\x80\x02}" + u("w") + b"ctorch._utils\n_rebuild_tensor_v2\n((" + u("storage") + b"ctorch\nIntStorage\n" +
           u("0") + u("cpu") + b"K\x04tQK\x01K\x03\x85K\x01\x85\x89ccollections\nOrderedDict\n)RtRs.")
    src = tmp_path / "be.pt"
    with zipfile.ZipFile(src, "w", zipfile.ZIP_STORED) as z:
        z.writestr("be/data.pkl", pkl)
        z.writestr("be/byteorder", b"big")
        z.writestr("be/data/0", np.array([9, 1, 2, 3], dtype=">i4").tobytes())
        z.writestr("be/version", b"3\n")
    m = mount(src)
    assert npy_data(m.p("w.npy")) == np.array([1, 2, 3], dtype="<i4").tobytes()
    assert (np.load(m.p("w.npy")) == [1, 2, 3]).all()


def test_torch_save_training_checkpoint(mount):
    """{"model": state_dict() (an OrderedDict with _metadata), "optimizer":
    Adam's state_dict (int keys), "epoch": 3}: every tensor, numbers left out."""
    m = mount(os.path.join(TORCH_FX, "module.pt"))
    exp = fx_expected("expected.json", "module.pt")
    assert "optimizer.state.0.exp_avg" in exp
    for k, (dt, shape, raw) in exp.items():
        check_tensor(m, k, dt, shape, raw)
    assert sorted(os.listdir(m.p())) == ["model", "optimizer"]
    assert "entries that are not tensors are not shown" in m.log()


# ---- distributed checkpoints saved with the safetensors serialization ---------------

DCP_ST = os.path.join(TORCH_FX, "dcp_safetensors")


@pytest.mark.parametrize("folder", ["dcp_safetensors", "dcp_safetensors_sharded"])
def test_dcp_safetensors_serialization(mount, folder):
    """dcp_safetensors: each data file is its bytes items, then one
    safetensors file of the rank's shards (DCP_SHARDING_INFO in
    __metadata__), .metadata pointing every chunk at that part.
    dcp_safetensors_sharded: the same shards as the Hugging Face storage
    writer saves them, no .metadata.  Each global tensor reassembled
    byte-exact, slices too; info and verify agree."""
    src = os.path.join(TORCH_FX, folder)
    m = mount(src)
    exp = fx_expected("expected_dcp.json", folder)
    assert set(exp) == {"model.w", "model.b", "step", "model.cols", "model.irregular"}
    for k, (dt, shape, raw) in exp.items():
        check_tensor(m, k, dt, shape, raw)
    assert os.getxattr(m.p("model/w.npy"), "user.ckpt.chunks") == b"[4,6]"
    assert os.getxattr(m.p("model/b.npy"), "user.ckpt.chunks") == b"[4,2]"
    assert os.getxattr(m.p("model/irregular.npy"), "user.ckpt.chunks") == b"[1,2]"
    # a 2-D slice across both ranks' shards
    a = np.frombuffer(exp["model.cols"][2], dtype="<f4").reshape(4, 5)
    assert npy_data(m.p("model/cols[1:3,2:4].npy")) == np.ascontiguousarray(a[1:3, 2:4]).tobytes()
    assert not os.path.exists(m.p("extra.npy"))  # the bytes item before rank 0's part
    st, _ = st_parse(U.read_all(m.p(".safetensors")))
    assert set(st) == set(exp)
    for k, (dt, shape, raw) in exp.items():
        assert st[k] == (ST_CODE[dt], list(shape), raw), k
    j = json.loads(run_cli("info", "--json", src).stdout)
    assert {a["key"].replace("/", ".") for a in j["arrays"]} == set(exp)
    p = run_cli("verify", src)
    assert p.returncode == 0, p.stdout + p.stderr


def st_variant(tmp_path, fname, old, new):
    """A copy of dcp_safetensors with bytes `old` in data file fname replaced
    by `new` (same length, so every offset stays)."""
    import shutil
    d = tmp_path / "dcp"
    shutil.copytree(DCP_ST, d)
    f = d / fname
    blob = f.read_bytes()
    assert len(old) == len(new) and blob.count(old) == 1
    f.write_bytes(blob.replace(old, new))
    return d


def test_dcp_safetensors_saved_offsets_disagree(mount, tmp_path):
    """saved_offsets that name another box than .metadata: that tensor is
    listed, reads answer EIO, the log says why; the others still read."""
    d = st_variant(tmp_path, "__1_0.distcp", rb'\"model.w\": {\"saved_offsets\": [4, 0]}',
                   rb'\"model.w\": {\"saved_offsets\": [0, 0]}')
    m = mount(d)
    assert U.errno_of(U.read_all, m.p("model/w.npy")) == errno.EIO
    assert "model.w cannot be served" in m.log() and "saved_offsets" in m.log()
    exp = fx_expected("expected_dcp.json", "dcp_safetensors")
    check_tensor(m, "model.b", *exp["model.b"])
    assert run_cli("verify", d).returncode == 1


def test_dcp_safetensors_tensor_missing(mount, tmp_path):
    """A chunk whose fqn is not in its data file's safetensors part: EIO."""
    d = st_variant(tmp_path, "__0_0.distcp", b'"model.cols":{"dtype"', b'"model.colx":{"dtype"')
    m = mount(d)
    assert U.errno_of(U.read_all, m.p("model/cols.npy")) == errno.EIO
    assert "holds no tensor of that name" in m.log()
    exp = fx_expected("expected_dcp.json", "dcp_safetensors")
    check_tensor(m, "model.w", *exp["model.w"])


def test_dcp_safetensors_sharded_gap_and_mismatch(mount, tmp_path):
    """Without .metadata the global size is the far corner of the boxes: a
    missing rank whose shard started at 0 leaves a gap (model.b: EIO); a
    shard whose dtype differs from the other rank's makes that tensor EIO."""
    import shutil
    d = tmp_path / "hf"
    shutil.copytree(os.path.join(TORCH_FX, "dcp_safetensors_sharded"), d)
    f = d / "shard-00002-model-00001-of-00001.safetensors"
    blob = f.read_bytes()
    old = b'"model.irregular":{"dtype":"F16"'
    assert blob.count(old) == 1
    f.write_bytes(blob.replace(old, b'"model.irregular":{"dtype":"I16"'))
    m = mount(d)
    assert U.errno_of(U.read_all, m.p("model/irregular.npy")) == errno.EIO
    assert "model.irregular cannot be served" in m.log()
    exp = fx_expected("expected_dcp.json", "dcp_safetensors_sharded")
    check_tensor(m, "model.w", *exp["model.w"])
    m.unmount()
    (d / "shard-00001-model-00001-of-00001.safetensors").unlink()
    m2 = mount(d)
    assert U.errno_of(U.read_all, m2.p("model/b.npy")) == errno.EIO
    assert "do not tile" in m2.log()


def test_plain_safetensors_folder_is_no_dcp(tmp_path):
    """A folder of safetensors files without DCP_SHARDING_INFO (and without
    an index) is not taken for a sharded distributed checkpoint."""
    d = tmp_path / "plain"
    d.mkdir()
    st_write(d / "a.safetensors", {"w": ("F32", [2], bytes(8))})
    p = run_cli("info", d)
    assert p.returncode != 0
    assert "DCP_SHARDING_INFO" in p.stdout + p.stderr  # named among the formats looked for


def test_dcp_safetensors_bad_header_logged_once(mount):
    """A data file whose safetensors header is refused: every tensor with a
    chunk there is listed and answers EIO; the header is refused (and logged)
    once, not once per chunk."""
    import shutil
    import tempfile
    with tempfile.TemporaryDirectory() as t:
        d = os.path.join(t, "dcp")
        shutil.copytree(DCP_ST, d)
        f = os.path.join(d, "__0_0.distcp")
        blob = open(f, "rb").read()
        old = b'"model.cols":{"dtype":"F32"'
        assert blob.count(old) == 1
        open(f, "wb").write(blob.replace(old, b'"model.cols":{"dtype":"X32"'))
        m = mount(d)
        for k in ("model/w", "model/b", "model/cols", "model/irregular", "step"):
            assert U.errno_of(U.read_all, m.p(k + ".npy")) == errno.EIO, k
        assert m.log().count("safetensors data of") == 1, m.log()
        assert m.log().count("its safetensors header is malformed") == 5, m.log()
        m.unmount()
