"""Damaged and absurd checkpoints.

Each case copies pytree_zarr2/ or pytree_zarr3/, damages one array and
mounts the copy.  Whatever the damage:
  - the mount comes up;
  - metadata damage: the array is left out of its directory, or answers EIO;
  - chunk damage: the array is listed and reading it answers EIO;
  - every other array still reads correctly;
  - the daemon log names the damaged array;
  - the daemon exits with code 0 at unmount (checked by the fixture) and
    its log holds no sanitizer report.
"""

import errno
import json
import os
import shutil
import struct
from pathlib import Path

import pytest

import ckfs_util as U
from ckfs_help import check_others, read_shard, rel_of, shard_layout, write, write_shard  # noqa: F401
from crc32c_ref import crc32c

try:
    import zstandard
except ImportError:  # python3-zstandard; scripts/test installs it
    zstandard = None


# ---------------------------------------------------------------------------
# helpers to damage a copy


def edit_json(path, fn):
    path = Path(path)
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc))


def edit_json_text(path, old, new):
    """Replace the JSON text of one member by raw text (for values json.dumps cannot write)."""
    path = Path(path)
    text = json.dumps(json.loads(path.read_text()))  # normalised: ', ' and ': '
    assert old in text, (old, text)
    path.write_text(text.replace(old, new, 1))


def damage_chunk_bytes(path, offset, new):
    b = bytearray(Path(path).read_bytes())
    b[offset:offset + len(new)] = new
    write(path, bytes(b))


# ---------------------------------------------------------------------------
# the cases: (id, fixture, damaged param, kind, damage(root))

def a(root, param):
    return Path(root) / param


Z2, Z3 = "pytree_zarr2", "pytree_zarr3"
W1, Q, EMB, B1, SCALE, OPROJ = ("params.layer_0.mlp.w1", "params.layer_0.attn.q_proj", "params.embed.embedding",
                                "params.layer_0.mlp.b1", "params.final_norm.scale", "params.layer_0.attn.o_proj")
DEEP = "[" * 100000 + "]" * 100000


def _set(member, value):
    return lambda d: d.__setitem__(member, value)


def _del(member):
    return lambda d: d.pop(member)


def _set_inner(member, value):
    return lambda d: d["codecs"][0]["configuration"].__setitem__(member, value)


def _set_inner_codec_name(i, name):
    return lambda d: d["codecs"][0]["configuration"]["codecs"][i].__setitem__("name", name)


META_CASES = [
    # zarr v2 .zarray
    ("z2_invalid_json", Z2, W1, lambda r: write(a(r, W1) / ".zarray", '{"chunks": [16, 32], "shape": [32, 128')),
    ("z2_zarray_missing", Z2, Q, lambda r: os.unlink(a(r, Q) / ".zarray")),
    ("z2_zarray_empty", Z2, EMB, lambda r: write(a(r, EMB) / ".zarray", "")),
    ("z2_zarray_not_object", Z2, B1, lambda r: write(a(r, B1) / ".zarray", "[16, 32]")),
    ("z2_deep_nesting", Z2, W1, lambda r: write(a(r, W1) / ".zarray", DEEP)),
    ("z2_deep_nesting_in_member", Z2, W1, lambda r: write(a(r, W1) / ".zarray", '{"shape": ' + DEEP + "}")),
    ("z2_shape_overflow", Z2, W1, lambda r: edit_json(a(r, W1) / ".zarray", _set("shape", [2**62, 2**62]))),
    ("z2_shape_overflow_rank3", Z2, W1, lambda r: edit_json(
        a(r, W1) / ".zarray", lambda d: d.update(shape=[2**32, 2**32, 16], chunks=[1, 1, 16]))),
    ("z2_shape_huge_float", Z2, W1, lambda r: edit_json_text(a(r, W1) / ".zarray", '"shape": [32, 128]', '"shape": [1e400, 128]')),
    ("z2_shape_above_u64", Z2, W1, lambda r: edit_json_text(
        a(r, W1) / ".zarray", '"shape": [32, 128]', '"shape": [18446744073709551617, 128]')),
    ("z2_shape_negative", Z2, W1, lambda r: edit_json(a(r, W1) / ".zarray", _set("shape", [-32, 128]))),
    ("z2_shape_fraction", Z2, W1, lambda r: edit_json(a(r, W1) / ".zarray", _set("shape", [32.5, 128]))),
    ("z2_shape_string", Z2, W1, lambda r: edit_json(a(r, W1) / ".zarray", _set("shape", "32,128"))),
    ("z2_shape_too_many_dims", Z2, W1, lambda r: edit_json(
        a(r, W1) / ".zarray", lambda d: d.update(shape=[1] * 40, chunks=[1] * 40))),
    ("z2_chunks_zero", Z2, W1, lambda r: edit_json(a(r, W1) / ".zarray", _set("chunks", [0, 32]))),
    ("z2_chunks_negative", Z2, W1, lambda r: edit_json(a(r, W1) / ".zarray", _set("chunks", [-16, 32]))),
    ("z2_chunks_rank_mismatch", Z2, W1, lambda r: edit_json(a(r, W1) / ".zarray", _set("chunks", [16]))),
    ("z2_chunks_object", Z2, W1, lambda r: edit_json(a(r, W1) / ".zarray", _set("chunks", {"a": 1}))),
    ("z2_dtype_number", Z2, W1, lambda r: edit_json(a(r, W1) / ".zarray", _set("dtype", 42))),
    ("z2_dtype_unknown", Z2, Q, lambda r: edit_json(a(r, Q) / ".zarray", _set("dtype", "<f99"))),
    ("z2_format_string", Z2, Q, lambda r: edit_json(a(r, Q) / ".zarray", _set("zarr_format", "2"))),
    ("z2_compressor_string", Z2, Q, lambda r: edit_json(a(r, Q) / ".zarray", _set("compressor", "zstd"))),
    # zarr v3 zarr.json
    ("z3_zarr_json_missing", Z3, EMB, lambda r: os.unlink(a(r, EMB) / "zarr.json")),
    ("z3_invalid_json", Z3, W1, lambda r: write(a(r, W1) / "zarr.json", '{"chunk_grid": {"configuration": ')),
    ("z3_deep_nesting", Z3, W1, lambda r: write(a(r, W1) / "zarr.json", DEEP)),
    ("z3_shape_overflow", Z3, W1, lambda r: edit_json(a(r, W1) / "zarr.json", _set("shape", [2**62, 2**62]))),
    ("z3_shape_huge_float", Z3, W1, lambda r: edit_json_text(a(r, W1) / "zarr.json", '"shape": [32, 128]', '"shape": [1e300, 1e300]')),
    ("z3_shape_negative", Z3, OPROJ, lambda r: edit_json(a(r, OPROJ) / "zarr.json", _set("shape", [48, -32]))),
    ("z3_data_type_unknown", Z3, OPROJ, lambda r: edit_json(a(r, OPROJ) / "zarr.json", _set("data_type", "float1024"))),
    ("z3_data_type_number", Z3, OPROJ, lambda r: edit_json(a(r, OPROJ) / "zarr.json", _set("data_type", 7))),
    ("z3_chunk_grid_missing", Z3, OPROJ, lambda r: edit_json(a(r, OPROJ) / "zarr.json", _del("chunk_grid"))),
    ("z3_codecs_object", Z3, OPROJ, lambda r: edit_json(a(r, OPROJ) / "zarr.json", _set("codecs", {"name": "bytes"}))),
    ("z3_codecs_empty", Z3, OPROJ, lambda r: edit_json(a(r, OPROJ) / "zarr.json", _set("codecs", []))),
    ("z3_inner_not_dividing", Z3, OPROJ, lambda r: edit_json(a(r, OPROJ) / "zarr.json", _set_inner("chunk_shape", [5, 7]))),
    ("z3_inner_zero", Z3, OPROJ, lambda r: edit_json(a(r, OPROJ) / "zarr.json", _set_inner("chunk_shape", [0, 32]))),
    ("z3_inner_codec_unknown", Z3, B1, lambda r: edit_json(a(r, B1) / "zarr.json", _set_inner_codec_name(1, "gzip9000"))),
    ("z3_inner_rank_mismatch", Z3, B1, lambda r: edit_json(a(r, B1) / "zarr.json", _set_inner("chunk_shape", [16, 1]))),
]


def _z2_truncate(r):
    p = a(r, Q) / "1.1"
    write(p, p.read_bytes()[: p.stat().st_size // 2])


def _z2_wrong_size(r):
    # a valid zstd frame that decodes to half of the chunk's bytes
    write(a(r, SCALE) / "3", zstandard.ZstdCompressor().compress(b"\x01" * 8))


def _z3_inner_wrong_size(r):
    d = a(r, B1)
    n = shard_layout(d)
    _, entries = read_shard(d / "c" / "2", n)
    body = zstandard.ZstdCompressor().compress(b"\x02" * 32)  # the inner chunk holds 64 bytes
    write_shard(d / "c" / "2", body, [[0, len(body)]] + entries[1:])


def _z3_index_offset_past_end(r):
    d = a(r, OPROJ)
    n = shard_layout(d)
    b, entries = read_shard(d / "c" / "3" / "0", n)
    entries[0][0] = len(b) + 1000
    write_shard(d / "c" / "3" / "0", b[: len(b) - 16 * n - 4], entries)


def _z3_index_huge_length(r):
    d = a(r, OPROJ)
    n = shard_layout(d)
    b, entries = read_shard(d / "c" / "6" / "0", n)
    entries[0] = [8, 2**63 + 5]
    write_shard(d / "c" / "6" / "0", b[: len(b) - 16 * n - 4], entries)


def _z3_crc_flip(r):
    p = a(r, OPROJ) / "c" / "5" / "0"
    b = bytearray(p.read_bytes())
    b[-1] ^= 0xFF
    write(p, bytes(b))


def _z3_index_flip(r):
    # change the inner chunk's length field without fixing the CRC
    d = a(r, EMB)
    n = shard_layout(d)
    p = d / "c" / "1" / "1"
    b = bytearray(p.read_bytes())
    b[len(b) - 16 * n - 4 + 8] ^= 0x01
    write(p, bytes(b))


def _z3_inner_magic(r):
    d = a(r, B1)
    n = shard_layout(d)
    p = d / "c" / "3"
    _, entries = read_shard(p, n)
    damage_chunk_bytes(p, entries[0][0], b"\0\0\0\0")


def _z3_shard_truncated(r):
    p = a(r, W1) / "c" / "1" / "2"
    write(p, p.read_bytes()[:10])


def _z3_shard_empty(r):
    write(a(r, SCALE) / "c" / "5", b"")


needs_zstd = pytest.mark.skipif(zstandard is None, reason="python3-zstandard is not installed")

CHUNK_CASES = [
    ("z2_chunk_truncated", Z2, Q, _z2_truncate),
    ("z2_chunk_empty", Z2, B1, lambda r: write(a(r, B1) / "3", b"")),
    ("z2_zstd_bad_magic", Z2, EMB, lambda r: damage_chunk_bytes(a(r, EMB) / "2.1", 0, b"\0\0\0\0")),
    ("z2_zstd_frame_cut", Z2, W1, lambda r: write(a(r, W1) / "1.2", (a(r, W1) / "1.2").read_bytes()[:-3])),
    pytest.param("z2_zstd_wrong_size", Z2, SCALE, _z2_wrong_size, marks=needs_zstd, id="z2_zstd_wrong_size"),
    ("z3_crc_flip", Z3, OPROJ, _z3_crc_flip),
    ("z3_index_flip", Z3, EMB, _z3_index_flip),
    ("z3_index_offset_past_end", Z3, OPROJ, _z3_index_offset_past_end),
    ("z3_index_huge_length", Z3, OPROJ, _z3_index_huge_length),
    ("z3_inner_zstd_bad_magic", Z3, B1, _z3_inner_magic),
    ("z3_shard_truncated", Z3, W1, _z3_shard_truncated),
    ("z3_shard_empty", Z3, SCALE, _z3_shard_empty),
    pytest.param("z3_inner_wrong_size", Z3, B1, _z3_inner_wrong_size, marks=needs_zstd, id="z3_inner_wrong_size"),
]


def _ids(cases):
    return [None if hasattr(c, "marks") else c[0] for c in cases]


# ---------------------------------------------------------------------------

def damaged_copy(tmp_path, fixture, damage):
    root = tmp_path / fixture
    shutil.copytree(U.FIXTURES / fixture, root)
    for dirpath, dirnames, filenames in os.walk(root):
        os.chmod(dirpath, 0o755)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o644)
    damage(root)
    return root


def check_log_names(m, param):
    m.unmount()  # exit code 0, unmounted, no sanitizer report; flushes the log
    log = m.log()
    names = (param, param.replace(".", "/"))
    assert any(n in log for n in names), \
        f"the daemon log does not name {param} (as {' or '.join(names)}):\n{log[-4000:]}"


@pytest.mark.parametrize("case,fixture,param,damage", META_CASES, ids=_ids(META_CASES))
def test_bad_metadata(tmp_path, mount, expected, case, fixture, param, damage):
    root = damaged_copy(tmp_path, fixture, damage)
    m = mount(root)
    damaged = m.p(rel_of(param))
    U.assert_absent_or_eio(damaged)
    check_others(m, expected, param)
    # the tree around the damaged array is still browsable
    for top, dnames, fnames in os.walk(m.p()):
        for f in fnames:
            if os.path.join(top, f) != str(damaged):
                os.stat(os.path.join(top, f))
    check_log_names(m, param)


@pytest.mark.parametrize("case,fixture,param,damage", CHUNK_CASES, ids=_ids(CHUNK_CASES))
def test_bad_chunk(tmp_path, mount, expected, case, fixture, param, damage):
    root = damaged_copy(tmp_path, fixture, damage)
    m = mount(root)
    p = m.p(rel_of(param))
    assert p.name in os.listdir(p.parent), "an array with good metadata and a bad chunk must be listed"
    exp = expected[param]
    # the size comes from the metadata, which is intact (header: a multiple of 64 bytes)
    extra = os.stat(p).st_size - len(exp.data)
    assert extra > 0 and extra % 64 == 0, f"st_size {extra + len(exp.data)} for {len(exp.data)} data bytes"
    e = U.errno_of(U.read_all, p)
    assert e == errno.EIO, f"reading {p.name} with a damaged chunk gave errno {e} (want EIO)"
    # and again: a failed decode is not remembered as good data
    assert U.errno_of(U.read_all, p) == errno.EIO
    check_others(m, expected, param)
    check_log_names(m, param)


# ---------------------------------------------------------------------------
# An item whose store cannot be opened (an empty manifest.ocdbt) whose
# _METADATA also holds a malformed entry and two entries for one name: the
# log lines about those entries have no item store to name.  `ckptfs info`
# and the mount used to crash on them.

def _ocdbt_unopenable_bad_entries(root):
    write(root / "manifest.ocdbt", b"")
    shutil.rmtree(root / "ocdbt.process_0")

    def damage(m):
        t = m["tree_metadata"]
        t["('broken',)"] = {"key_metadata": "not a list", "value_metadata": {}}
        first = next(iter(t))
        t[first + " again"] = t[first]  # same key path: a name collision
    edit_json(root / "_METADATA", damage)


def test_unopenable_store_with_malformed_entries(tmp_path, mount, expected):
    import subprocess
    root = damaged_copy(tmp_path, "pytree_ocdbt_zarr2", _ocdbt_unopenable_bad_entries)
    p = subprocess.run([str(U.BIN), "info", str(root)], capture_output=True, text=True, timeout=60)
    # it answers, and exits 1: every array is listed as unreadable
    assert p.returncode == 1, f"ckptfs info exited {p.returncode}:\n{p.stderr[-4000:]}"
    assert "unreadable:" in p.stdout and "embedding.npy" in p.stdout, p.stdout
    assert "malformed entry ('broken',)" in p.stderr
    assert "name collision" in p.stderr
    m = mount(root)
    names = []
    for top, dnames, fnames in os.walk(m.p()):
        names += [os.path.join(top, f) for f in fnames if f.endswith(".npy")]
    assert str(m.p(rel_of("params.embed.embedding"))) in names, names
    for f in names:  # every array is listed and answers EIO: its store is unusable
        assert U.errno_of(U.read_all, f) == errno.EIO, f
    m.unmount()  # exit code 0, no sanitizer report
    assert "malformed entry ('broken',)" in m.log()
