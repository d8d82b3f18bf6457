"""Checkpoints of other tools than Orbax 0.12, through real mounts: .npz
archives (stored, deflated, ZIP64), Flax save_checkpoint steps of the Orbax
era (every array inline in the msgpack `checkpoint`), legacy Flax
checkpoint_<N> files (lists as maps, chunked arrays, a GDA placeholder),
Orbax before 0.5.16 (the aggregate `checkpoint` with PLACEHOLDER:// and
AGGREGATED:// leaves, inline values, _strings.json) and T5X steps
(TensorStore spec leaves).  Fixtures: tests/fixtures/generated/
make_wild_formats.py (the formats' own encoders; see tests/fixtures/README.md).

Every array reads byte-exact (whole, a slice, inside the safetensors view),
the tree holds exactly the expected files, `ckptfs info` and `ckptfs
verify` work on each, and what is not one of these formats is refused by
content, never shown as an empty step.
"""

import errno
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

import ckfs_util as U

WF = U.REPO / "tests" / "fixtures" / "generated" / "wild_formats"
EXPECTED = json.loads((WF / "expected" / "expected.json").read_text())

# mount SOURCE (relative to WF) -> the expected layouts it holds, each at a path of the mount
SOURCES = {
    "npz/stored.npz": {"npz/stored.npz": ""},
    "npz/compressed.npz": {"npz/compressed.npz": ""},
    "npz/zip64.npz": {"npz/zip64.npz": ""},
    "flax_inline": {"flax_inline/checkpoint_5": "checkpoint_5", "flax_inline/checkpoint_10": "checkpoint_10"},
    "flax_inline/checkpoint_5": {"flax_inline/checkpoint_5": ""},
    "flax_legacy": {"flax_legacy/checkpoint_1": "checkpoint_1", "flax_legacy/checkpoint_2": "checkpoint_2"},
    "flax_single_checkpoint": {"flax_legacy/checkpoint_1": ""},
    "orbax_old": {"orbax_old/1/default": "1/default", "orbax_old/2/default": "2/default"},
    "orbax_old/2/default": {"orbax_old/2/default": ""},
    "orbax_old_ocdbt/merged": {"orbax_old_ocdbt/merged": ""},
    "orbax_old_ocdbt/unmerged": {"orbax_old_ocdbt/unmerged": ""},
    "orbax_old_ocdbt/per_folder": {"orbax_old_ocdbt/per_folder": ""},
    "orbax_names": {"orbax_names": ""},
    "t5x": {"t5x/checkpoint_100": "checkpoint_100"},
    "t5x/checkpoint_100": {"t5x/checkpoint_100": ""},
}
STRINGS = {  # text leaves: mount path -> content
    "flax_inline": {"checkpoint_5/name.txt": "adam", "checkpoint_10/name.txt": "adam"},
    "orbax_old": {"1/default/tag.txt": "run-1", "2/default/tag.txt": "run-2"},
}
EMPTY_DIRS = {  # empty nodes of the trees: empty folders
    "flax_inline": ["checkpoint_5/opt_state/1/1", "checkpoint_10/opt_state/1/1"],
    "orbax_old": ["1/default/empty", "2/default/empty"],
    "t5x": ["checkpoint_100/optimizer/state/param_states/encoder/layer_norm/scale"],
}


def arrays_of(source):
    """(mount-relative path, expected entry) of every array of a SOURCE."""
    out = []
    for lay, at in SOURCES[source].items():
        for p, e in sorted(EXPECTED[lay].items()):
            out.append((f"{at}/{p}" if at else p, e))
    return out


def want_array(e):
    raw = (WF / "expected" / e["file"]).read_bytes()
    return raw


def data_of(path):
    """dtype descr, shape and data bytes of an .npy file read through the mount."""
    b = U.read_all(path)
    h = U.parse_npy_header(b)
    return h, b


def npy_parts(b):
    assert b[:6] == b"\x93NUMPY", b[:16]
    if b[6] == 1:
        hl = struct.unpack("<H", b[8:10])[0]
        off = 10 + hl
    else:
        hl = struct.unpack("<I", b[8:12])[0]
        off = 12 + hl
    import ast
    d = ast.literal_eval(b[off - hl:off].decode("latin1").strip())
    return d, b[off:]


DESCR = {"float32": "<f4", "float64": "<f8", "int8": "|i1", "int16": "<i2", "int32": "<i4", "int64": "<i8",
         "uint8": "|u1", "bool": "|b1", "bfloat16": "<V2", "complex128": "<c16"}


@pytest.fixture(scope="module")
def mounts(module_mount):
    cache = {}

    def get(source):
        if source not in cache:
            cache[source] = module_mount(WF / source, "ro")
        return cache[source]
    return get


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_every_array_reads_byte_exact(source, mounts):
    m = mounts(source)
    for rel, e in arrays_of(source):
        d, data = npy_parts(U.read_all(m.p(rel)))
        assert d["descr"] == DESCR[e["dtype"]], (rel, d)
        assert list(d["shape"]) == e["shape"], (rel, d)
        assert d["fortran_order"] is False
        assert data == want_array(e), rel
        if e["dtype"] not in ("bfloat16",):
            a = np.load(m.p(rel))
            assert a.dtype == np.dtype(e["dtype"]) and list(a.shape) == e["shape"]


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_tree_holds_exactly_the_expected_files(source, mounts):
    m = mounts(source)
    got_files, got_dirs = set(), set()
    for dirpath, dirs, files in os.walk(m.p()):
        r = os.path.relpath(dirpath, m.p())
        for f in files:
            got_files.add(os.path.normpath(os.path.join(r, f)))
        if not dirs and not files and r != ".":
            got_dirs.add(r)
    want = {rel for rel, _ in arrays_of(source)} | strings_of(source).keys()
    assert got_files == want, (sorted(got_files - want), sorted(want - got_files))
    assert got_dirs == set(empty_dirs_of(source)), got_dirs


def strings_of(source):
    """Text leaves visible in a mount of `source` (path in the mount -> text)."""
    out = {}
    for base, strings in STRINGS.items():
        for p, text in strings.items():
            full = f"{base}/{p}"
            if source == base:
                out[p] = text
            elif full.startswith(source + "/"):
                out[full[len(source) + 1:]] = text
    return out


def empty_dirs_of(source):
    out = []
    for base, dirs in EMPTY_DIRS.items():
        for p in dirs:
            full = f"{base}/{p}"
            if source == base:
                out.append(p)
            elif full.startswith(source + "/"):
                out.append(full[len(source) + 1:])
    return out


@pytest.mark.parametrize("source", sorted(s for s in SOURCES if strings_of(s)))
def test_string_leaves(source, mounts):
    m = mounts(source)
    for p, text in strings_of(source).items():
        assert m.p(p).read_text() == text


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_slices_read_byte_exact(source, mounts):
    m = mounts(source)
    n = 0
    for rel, e in arrays_of(source):
        shape = e["shape"]
        if not shape or shape[0] < 2:
            continue
        itemsize = len(want_array(e)) // max(1, int(np.prod(shape)))
        row = int(np.prod(shape[1:])) * itemsize
        want = want_array(e)[row:]
        name = rel[:-4] + "[1:].npy"
        d, data = npy_parts(U.read_all(m.p(name)))
        assert list(d["shape"]) == [shape[0] - 1] + shape[1:]
        assert data == want, name
        n += 1
    assert n > 0


ST_CODE = {"float32": "F32", "float64": "F64", "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64",
           "uint8": "U8", "bool": "BOOL", "bfloat16": "BF16"}


@pytest.mark.parametrize("source,folder", [
    ("npz/stored.npz", "params"), ("npz/compressed.npz", "params/llm"), ("flax_inline", "checkpoint_5/params"),
    ("flax_legacy", "checkpoint_2"), ("orbax_old", "1/default/params"),
    ("t5x", "checkpoint_100/optimizer/target"), ("orbax_old_ocdbt/unmerged", "transformer%2Fembedder"),
    ("orbax_names", "params"),
])
def test_safetensors_view(source, folder, mounts):
    m = mounts(source)
    b = U.read_all(m.p(folder + ".safetensors"))
    hl = struct.unpack("<Q", b[:8])[0]
    hdr = json.loads(b[8:8 + hl])
    body = b[8 + hl:]
    want = {}
    for rel, e in arrays_of(source):
        if rel.startswith(folder + "/") and e["dtype"] in ST_CODE:
            want[rel[len(folder) + 1:-4].replace("/", ".")] = e
    got = {k: v for k, v in hdr.items() if k != "__metadata__"}
    assert set(got) == set(want), (sorted(got), sorted(want))
    for k, e in want.items():
        t = got[k]
        assert t["dtype"] == ST_CODE[e["dtype"]] and t["shape"] == e["shape"], (k, t)
        s, f = t["data_offsets"]
        assert body[s:f] == want_array(e), k


def run(*args):
    return subprocess.run([str(U.BIN), *map(str, args)], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_info_and_verify(source):
    p = run("info", "--json", WF / source)
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    want = arrays_of(source)
    assert j["total"]["arrays"] == len(want), (j["total"], len(want))
    keys = {a["key"] for a in j["arrays"]}
    for rel, e in want:
        parts = rel[:-4].split("/")
        assert any(k.endswith("/".join(parts[-2:])) or k == parts[-1] for k in keys), (rel, sorted(keys))
    p = run("verify", WF / source)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "OK" in p.stdout + p.stderr


# ---------------------------------------------------------------- what is not one of them

def test_a_file_that_is_no_checkpoint_is_refused(tmp_path, mount):
    f = tmp_path / "notes.bin"
    f.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))
    m = mount(f, "ro", expect_ready=False)
    assert m.ready != b"s"
    log = m.log()
    assert "not a checkpoint file" in log and ".npz archive" in log and "MessagePack" in log, log


def test_a_damaged_msgpack_step_is_never_an_empty_step(tmp_path, mount):
    """A step whose `checkpoint` is not readable lists one entry that answers
    EIO; it neither vanishes nor shows as an empty step."""
    root = tmp_path / "root"
    shutil.copytree(WF / "t5x", root)
    ck = root / "checkpoint_100" / "checkpoint"
    ck.write_bytes(ck.read_bytes()[:40])  # the document ends early
    m = mount(root, "ro")
    names = os.listdir(m.p("checkpoint_100"))
    assert names == ["checkpoint"], names
    assert U.errno_of(U.read_all, m.p("checkpoint_100/checkpoint")) == errno.EIO
    assert "not a readable MessagePack checkpoint" in m.log()


def test_a_t5x_step_shows_its_arrays(mount):
    """Before T5X steps were read, this step mounted as a folder of raw files
    (the msgpack `checkpoint` and zarr folders), with no array."""
    m = mount(WF / "t5x", "ro")
    assert sorted(os.listdir(m.p("checkpoint_100"))) == ["optimizer", "version.npy"]


def test_a_missing_zarr_folder_is_an_unreadable_leaf(tmp_path, mount):
    item = tmp_path / "default"
    shutil.copytree(WF / "orbax_old" / "1" / "default", item)
    shutil.rmtree(item / "params.dense.kernel")
    m = mount(item, "ro")
    assert "kernel.npy" in os.listdir(m.p("params/dense"))
    assert U.errno_of(U.read_all, m.p("params/dense/kernel.npy")) == errno.EIO
    assert U.read_all(m.p("params/dense/bias.npy"))  # the others still read
    assert "zarr folder is not in the checkpoint" in m.log()


def test_npz_member_that_is_no_npy_is_eio(tmp_path, mount):
    import zipfile
    f = tmp_path / "x.npz"
    with zipfile.ZipFile(f, "w") as z:
        with z.open("good.npy", "w") as w:
            np.save(w, np.arange(3, dtype=np.int32))
        z.writestr("bad.npy", b"not an npy header at all")
    m = mount(f, "ro")
    assert sorted(os.listdir(m.p())) == ["bad.npy", "good.npy"]
    assert np.array_equal(np.load(m.p("good.npy")), np.arange(3, dtype=np.int32))
    assert U.errno_of(U.read_all, m.p("bad.npy")) == errno.EIO


def test_truncated_npz_member_is_eio(tmp_path, mount):
    """A stored member whose bytes the archive does not hold reads EIO
    (never zeros), even when the directory was readable at mount."""
    f = tmp_path / "t.npz"
    shutil.copy(WF / "npz" / "stored.npz", f)
    m = mount(f, "ro")
    name = "params/img/embedding/kernel.npy"
    data = U.read_all(m.p(name))
    assert data
    # overwrite the archive with a copy whose members are cut short
    with open(f, "r+b") as fh:
        fh.truncate(200)
    assert U.errno_of(lambda: U.read_all(m.p("u8.npy"))) in (errno.EIO,)


def test_deflated_npz_member_with_wrong_bytes_is_eio(tmp_path, mount):
    """A deflated member whose stream still inflates, but to other bytes
    (one flipped byte inside a stored deflate block: random data does not
    compress), fails its CRC-32 and reads EIO; the archive's other member
    still reads.  Before, the wrong bytes were served."""
    import zipfile
    f = tmp_path / "c.npz"
    a = np.random.default_rng(5).integers(0, 255, size=(64, 1024), dtype=np.uint8)
    b = np.arange(10, dtype=np.int64)
    np.savez_compressed(f, a=a, b=b)
    with zipfile.ZipFile(f) as z:
        info = z.getinfo("a.npy")
        assert info.compress_type == zipfile.ZIP_DEFLATED
    raw = bytearray(f.read_bytes())
    start = U.zip_data_offset(raw, info)
    raw[start + info.compress_size // 2] ^= 0x5A
    f.write_bytes(bytes(raw))
    m = mount(f, "ro")
    assert U.errno_of(U.read_all, m.p("a.npy")) == errno.EIO
    assert "CRC-32 mismatch of the ZIP member" in m.log()
    assert np.array_equal(np.load(m.p("b.npy")), b)


def test_stored_npz_member_with_wrong_bytes_is_eio(tmp_path, mount):
    """np.savez (no compression): a member of 24 MiB is served as 8 MiB
    ranges of the archive.  With one byte changed, reading it whole fails
    with EIO once every range was decoded (its CRC-32 covers the whole
    member), and every read after that too; the ranges that do not hold the
    byte read as before on their own; a second member of the same archive
    reads.  Before, the changed byte was served."""
    import zipfile
    f = tmp_path / "s.npz"
    a = np.random.default_rng(6).standard_normal((3 * 1024, 2048), dtype=np.float32)
    b = np.arange(10, dtype=np.int64)
    np.savez(f, a=a, b=b)
    with zipfile.ZipFile(f) as z:
        info = z.getinfo("a.npy")
        assert info.compress_type == zipfile.ZIP_STORED
    raw = bytearray(f.read_bytes())
    start = U.zip_data_offset(raw, info)
    raw[start + info.file_size - 100] ^= 0x5A   # in the last rows
    f.write_bytes(bytes(raw))
    m = mount(f, "ro")
    first = np.load(m.p("a[0:1024].npy"))       # a range without the byte: read as before
    assert np.array_equal(first, a[0:1024])
    assert U.errno_of(U.read_all, m.p("a.npy")) == errno.EIO
    assert "CRC-32 mismatch of the ZIP member" in m.log()
    assert U.errno_of(U.read_all, m.p("a[0:1024].npy")) == errno.EIO
    assert np.array_equal(np.load(m.p("b.npy")), b)
    # the archive as written reads whole
    np.savez(f, a=a, b=b)
    m2 = mount(f, "ro")
    assert np.array_equal(np.load(m2.p("a.npy")), a)


def test_keys_with_slashes_keep_their_key_path(mounts):
    """A pytree key holding '/' (Gemma's 'transformer/layer_0/attn/q_einsum')
    is one folder, escaped as for Orbax items; .npz member names are paths."""
    m = mounts("orbax_old_ocdbt/unmerged")
    assert sorted(os.listdir(m.p())) == ["step.npy", "transformer%2Fembedder", "transformer%2Flayer_0%2Fattn%2Fq_einsum"]
    m = mounts("npz/stored.npz")
    assert "q_einsum" in os.listdir(m.p("params/llm/layers/attn"))


# ---------------------------------------------------------------- from an object store

def _s3env():
    import sys
    sys.path.insert(0, str(U.REPO / "tests" / "s3"))
    import s3env
    return s3env


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    s3env = _s3env()
    if s3env.available():
        pytest.skip(s3env.available())
    with s3env.S3Env(tmp_path_factory.mktemp("s3wf")) as e:
        e.upload_tree(WF, "wf")
        yield e, s3env


@pytest.mark.parametrize("source", ["npz/stored.npz", "npz/compressed.npz", "flax_inline", "flax_legacy",
                                    "orbax_old/2/default", "orbax_old_ocdbt/unmerged", "t5x"])
def test_object_store_mount_is_the_same_tree(source, s3, tmp_path, monkeypatch, mount):
    """Every layout (an .npz object too) reads through s3:// exactly as from
    its folder: the translators read only through the store."""
    env, s3env = s3
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "S3RVER")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    m = U.Mount("placeholder", tmp_path / "s3m", tmp_path / "s3m.log", options=["ro", f"endpoint={env.endpoint}"])
    m.source = f"s3://{s3env.BUCKET}/wf/{source}"
    try:
        m.start()
        local = mount(WF / source, "ro")
        for rel, e in arrays_of(source):
            assert U.read_all(m.p(rel)) == U.read_all(local.p(rel)), rel
        got = sorted(os.path.relpath(os.path.join(d, f), m.p()) for d, _, fs in os.walk(m.p()) for f in fs)
        want = sorted(os.path.relpath(os.path.join(d, f), local.p()) for d, _, fs in os.walk(local.p()) for f in fs)
        assert got == want
    finally:
        m.unmount(check=True)


def test_t5x_tmp_folder_is_no_step(tmp_path, mount):
    """T5X writes checkpoint_<N>.tmp-<seconds>/ and renames it: unfinished."""
    root = tmp_path / "root"
    shutil.copytree(WF / "t5x", root)
    shutil.copytree(root / "checkpoint_100", root / "checkpoint_200.tmp-1700000000")
    m = mount(root, "ro")
    assert os.listdir(m.p()) == ["checkpoint_100", "latest"]


def test_gda_folder_belongs_to_its_step(mounts):
    """Legacy Flax's checkpoint_<N>_gda/ holds arrays of step checkpoint_<N>,
    it is no step of its own."""
    m = mounts("flax_legacy")
    assert sorted(os.listdir(m.p())) == ["checkpoint_1", "checkpoint_2", "latest"]
    assert os.readlink(m.p("latest")) == "checkpoint_2"


def test_xattrs_of_npz_members(mounts):
    m = mounts("npz/compressed.npz")
    assert os.getxattr(m.p("u8.npy"), "user.ckpt.codec") == b"deflate"
    assert os.getxattr(m.p("u8.npy"), "user.ckpt.shape") == b"[200]"
    m = mounts("npz/stored.npz")
    assert os.getxattr(m.p("u8.npy"), "user.ckpt.codec") == b"raw"
    assert os.getxattr(m.p("params/llm/layers/attn/q_einsum/w.npy"), "user.ckpt.dtype") == b"bfloat16"


def test_a_folder_that_is_no_checkpoint_names_the_other_formats(tmp_path, mount):
    d = tmp_path / "junk"
    d.mkdir()
    (d / "checkpoint").write_text("model_checkpoint_path: \"ckpt-1\"\n")  # TensorFlow's, not MessagePack
    (d / "notes.txt").write_text("x")
    m = mount(d, "ro", expect_ready=False)
    assert m.ready != b"s"
    log = m.log()
    assert "not a checkpoint" in log and ".npz archive" in log and "MessagePack `checkpoint`" in log, log
