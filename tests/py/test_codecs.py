"""Codecs of older and non-default checkpoints.

The fixtures under tests/fixtures/generated/codecs/ (made by
tests/fixtures/generated/make_codecs.py) are Orbax-like items whose arrays use
  zarr v2 (written by python3-zarr 2.13 / numcodecs): zlib, gzip, blosc
      (lz4, zstd, blosclz; byte shuffle, bit shuffle, no shuffle), lz4, bz2;
  zarr v3 (built from the spec): gzip, blosc, crc32c, transpose, bytes big
      endian, and sharding_indexed holding gzip / blosc+crc32c / transpose
      (index at the end and at the start);
plus zstd / raw controls.  Every array must read back byte-exact (whole and
as a slice).  An array whose codec is not supported (a made-up "foo") stays
visible in `ls` and answers EIO or ENOTSUP on read, with a log line naming
it and the codec; the other arrays of its item still read.

The fixtures themselves are checked independently first: zarr v2 by
python3-zarr reading them back, zarr v3 by a small decoder written here
from the zarr v3 spec.
"""

import errno
import gzip
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ckfs_util as U
from crc32c_ref import crc32c

GEN = U.REPO / "tests" / "fixtures" / "generated"
CODECS = GEN / "codecs"
EXPECTED = json.loads((CODECS / "expected" / "expected.json").read_text())

def params():
    return [pytest.param(key, id=key) for key in sorted(EXPECTED)]


def rel_of(param):
    return param.replace(".", "/") + ".npy"


def expected_array(e):
    raw = (CODECS / "expected" / e["file"]).read_bytes()
    return np.frombuffer(raw, dtype=np.dtype(e["dtype"]).newbyteorder("<")).reshape(e["shape"])


@pytest.fixture(scope="module")
def mounts(module_mount):
    return {item: module_mount(CODECS / item, "ro")
            for item in ("zarr2", "zarr3", "zarr2_unsupported", "zarr3_unsupported")}


def data_of(path, nbytes):
    b = U.read_all(path)
    assert len(b) >= nbytes
    return b[len(b) - nbytes:]


@pytest.mark.parametrize("key", params())
def test_codec_reads_byte_exact(key, mounts):
    e = EXPECTED[key]
    m = mounts[e["item"]]
    want = expected_array(e)
    p = m.p(rel_of(e["param"]))
    assert p.name in os.listdir(p.parent)
    assert data_of(p, want.nbytes) == want.tobytes(), f"{key}: bytes differ"
    got = np.load(p)
    assert got.dtype == want.dtype and got.shape == want.shape
    # a slice decodes only the chunks it overlaps; it must agree too
    sl = np.ascontiguousarray(want[1:3])
    ps = m.p(rel_of(e["param"])[:-4] + "[1:3].npy")
    assert data_of(ps, sl.nbytes) == sl.tobytes(), f"{key}[1:3]: bytes differ"


@pytest.mark.parametrize("item", ["zarr2_unsupported", "zarr3_unsupported"])
def test_unsupported_codec_stays_visible_and_fails(item, module_mount):
    m = module_mount(CODECS / item, "ro")
    assert sorted(n for n in os.listdir(m.p()) if not n.startswith("_") and n != "commit_success.txt") == \
        ["bad", "good"]
    assert "f32.npy" in os.listdir(m.p("bad"))
    e = U.errno_of(U.read_all, m.p("bad/f32.npy"))
    assert e in (errno.EIO, errno.ENOTSUP, errno.EOPNOTSUPP), f"errno {e}"
    want = expected_array(EXPECTED[f"{item}/good.f32"])
    assert data_of(m.p("good/f32.npy"), want.nbytes) == want.tobytes()
    m.unmount()
    lines = [ln for ln in m.log().splitlines() if "foo" in ln and ("bad.f32" in ln or "bad/f32" in ln)]
    assert lines, "the unsupported codec must be logged with the array and the codec name"


# ---------------------------------------------------------------------------
# the fixtures, checked without ckptfs

def test_zarr2_fixtures_read_back_with_zarr_python():
    zarr = pytest.importorskip("zarr")
    pytest.importorskip("numcodecs")
    for key, e in EXPECTED.items():
        if not e["item"].startswith("zarr2"):
            continue
        z = zarr.open_array(str(CODECS / e["item"] / e["param"]), mode="r")
        assert np.array_equal(z[...], expected_array(e)), key
        zj = json.loads((CODECS / e["item"] / e["param"] / ".zarray").read_text())
        assert zj["filters"] is None and zj["order"] == "C" and zj["zarr_format"] == 2


def decode(data, codecs, shape, dtype):
    """Undo a zarr v3 codec chain (spec: decode in reverse order)."""
    # shapes seen by each array->array codec
    shapes = [list(shape)]
    for c in codecs:
        if c["name"] == "transpose":
            order = c["configuration"]["order"]
            shapes.append([shapes[-1][o] for o in order])
    k = len(codecs) - 1
    while codecs[k]["name"] not in ("bytes",):
        n, conf = codecs[k]["name"], codecs[k].get("configuration", {})
        if n == "crc32c":
            body, ck = data[:-4], struct.unpack("<I", data[-4:])[0]
            assert crc32c(body) == ck, "crc32c mismatch"
            data = body
        elif n == "gzip":
            assert data[:2] == b"\x1f\x8b", "not a gzip member"
            data = gzip.decompress(data)
        elif n == "zstd":
            import zstandard
            data = zstandard.ZstdDecompressor().decompress(data, max_output_size=1 << 24)
        elif n == "blosc":
            from numcodecs import Blosc
            data = bytes(Blosc().decode(data))
        else:
            raise AssertionError(n)
        k -= 1
    end = "<" if codecs[k].get("configuration", {}).get("endian", "little") == "little" else ">"
    a = np.frombuffer(data, dtype=np.dtype(dtype).newbyteorder(end)).reshape(shapes[-1])
    for c in reversed(codecs[:k]):
        a = np.transpose(a, np.argsort(c["configuration"]["order"]))
    return a.astype(np.dtype(dtype).newbyteorder("<"))


def read_zarr3(adir):
    z = json.loads((adir / "zarr.json").read_text())
    shape, dtype = z["shape"], z["data_type"]
    cs = z["chunk_grid"]["configuration"]["chunk_shape"]
    out = np.zeros(shape, dtype=np.dtype(dtype).newbyteorder("<"))
    for ix in np.ndindex(*[-(-s // c) for s, c in zip(shape, cs)]):
        data = (adir / ("c/" + "/".join(map(str, ix)))).read_bytes()
        c0 = z["codecs"][0]
        if c0["name"] == "sharding_indexed":
            conf = c0["configuration"]
            inner = conf["chunk_shape"]
            per = [s // i for s, i in zip(cs, inner)]
            n = int(np.prod(per))
            isz = 16 * n + 4
            index = data[:isz] if conf.get("index_location", "end") == "start" else data[-isz:]
            assert crc32c(index[:-4]) == struct.unpack("<I", index[-4:])[0]
            chunk = np.zeros(cs, dtype=out.dtype)
            for e, lg in enumerate(np.ndindex(*per)):
                off, nb = struct.unpack_from("<QQ", index, 16 * e)
                sub = decode(data[off:off + nb], conf["codecs"], inner, dtype)
                chunk[tuple(slice(g * i, (g + 1) * i) for g, i in zip(lg, inner))] = sub
        else:
            chunk = decode(data, z["codecs"], cs, dtype)
        sl = tuple(slice(g * c, min((g + 1) * c, s)) for g, c, s in zip(ix, cs, shape))
        out[sl] = chunk[tuple(slice(0, x.stop - x.start) for x in sl)]
    return out


def test_zarr3_fixtures_decode_with_reference_decoder():
    pytest.importorskip("numcodecs")
    pytest.importorskip("zstandard")
    n = 0
    for key, e in EXPECTED.items():
        if not e["item"].startswith("zarr3"):
            continue
        got = read_zarr3(CODECS / e["item"] / e["param"])
        assert np.array_equal(got, expected_array(e)), key
        n += 1
    assert n >= 15


def test_fixtures_are_orbax_like_items():
    for item in ("zarr2", "zarr3", "zarr2_unsupported", "zarr3_unsupported"):
        d = CODECS / item
        meta = json.loads((d / "_METADATA").read_text())
        assert meta["use_zarr3"] is item.startswith("zarr3") and meta["use_ocdbt"] is False
        assert meta["store_array_data_equal_to_fill_value"] is True
        names = {".".join(k["key"] for k in v["key_metadata"]) for v in meta["tree_metadata"].values()}
        folders = {p.name for p in d.iterdir() if p.is_dir() and p.name != "array_metadatas"}
        assert names == folders, item
        assert set(json.loads((d / "_sharding").read_text())) == \
            {__import__("base64").urlsafe_b64encode(n.encode()).decode() for n in names}


def test_generator_is_deterministic(tmp_path):
    pytest.importorskip("zarr")
    pytest.importorskip("numcodecs")
    pytest.importorskip("zstandard")
    r = subprocess.run([sys.executable, str(GEN / "make_codecs.py"), str(tmp_path)], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE)
    assert r.returncode == 0, r.stderr.decode()

    def files(root):
        return {str(p.relative_to(root)): p.read_bytes() for p in Path(root).rglob("*") if p.is_file()}

    a, b = files(CODECS), files(tmp_path / "codecs")
    assert set(a) == set(b)
    diff = [k for k in a if a[k] != b[k]]
    assert not diff, f"regenerated files differ: {diff[:5]}"
