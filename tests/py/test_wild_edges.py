"""Checkpoints from other tools and older or newer Orbax versions, at the
edges of the formats (fixtures: tests/fixtures/generated/make_wild_edges.py
and scripts/gen_ocdbt_layouts.py; see tests/fixtures/README.md).

  - 64-bit integer fill values beyond 2**53 (zarr v2 by python3-zarr, zarr
    v3 by hand) read back exactly where chunks are missing; a uint64 fill of
    2**64-1 does not make the array unreadable.
  - every compressor configuration numcodecs writes for zarr v2 (blosc
    shuffle -1 = AUTOSHUFFLE included) reads byte-exact; what cannot be
    decoded (a delta filter, a crc32 checksum before the data, lzma) fails
    with EIO/ENOTSUP and a log line naming the codec; the same for zarr v3
    arrays whose codecs are zarr-python's "numcodecs.<id>" wrappers.
  - a step folder without _CHECKPOINT_METADATA (Orbax before that file
    existed) mounts as a step, and shows as a step of a manager root.
  - the OCDBT layouts of newer Orbax (ocdbt_data/ + ocdbt_meta/ folders,
    ocdbt.process_replica_<id>/), uncompressed zarr v3 inside OCDBT, data
    files beyond 4 GiB in the manifest.
"""

import errno
import json
import os
from pathlib import Path

import numpy as np
import pytest

import ckfs_util as U

GEN = U.REPO / "tests" / "fixtures" / "generated"
WILD = GEN / "wild_edges"
EXPECTED = json.loads((WILD / "expected" / "expected.json").read_text())


def expected_array(e):
    raw = (WILD / "expected" / e["file"]).read_bytes()
    return np.frombuffer(raw, dtype=np.dtype(e["dtype"]).newbyteorder("<")).reshape(e["shape"])


def data_of(path, nbytes):
    b = U.read_all(path)
    assert len(b) >= nbytes
    return b[len(b) - nbytes:]


def keys_of(*items):
    return [pytest.param(k, id=k) for k in sorted(EXPECTED) if EXPECTED[k]["item"] in items]


# ---------------------------------------------------------------- 64-bit fill values

@pytest.fixture(scope="module")
def fills(module_mount):
    return {it: module_mount(WILD / it, "ro") for it in ("fills_zarr2", "fills_zarr3")}


@pytest.mark.parametrize("key", keys_of("fills_zarr2", "fills_zarr3"))
def test_int64_fill_reads_exactly(key, fills):
    e = EXPECTED[key]
    want = expected_array(e)
    p = fills[e["item"]].p(e["param"] + ".npy")
    got = np.load(p)
    assert got.dtype == want.dtype and got.shape == want.shape
    # rows 2:4 are a missing chunk: they are the fill value, to the last bit
    assert got.tobytes() == want.tobytes(), f"{key}: {got[2:4, 0]} != {want[2:4, 0]}"
    # and as a slice of the missing rows only
    ps = fills[e["item"]].p(e["param"] + "[2:4].npy")
    sl = np.ascontiguousarray(want[2:4])
    assert data_of(ps, sl.nbytes) == sl.tobytes()


def test_fill_fixtures_check_out_with_zarr_python():
    zarr = pytest.importorskip("zarr")
    for key, e in EXPECTED.items():
        if e["item"] == "fills_zarr2":
            z = zarr.open_array(str(WILD / e["item"] / e["param"]), mode="r")
            assert z[...].tobytes() == expected_array(e).tobytes(), key


# ---------------------------------------------------------------- numcodecs variants

@pytest.fixture(scope="module")
def numcodecs_mount(module_mount):
    return module_mount(WILD / "numcodecs2", "ro")


@pytest.mark.parametrize("key", keys_of("numcodecs2", "numcodecs2_unsupported", "numcodecs3",
                                         "numcodecs3_unsupported"))
def test_numcodecs_variant_reads_byte_exact(key, numcodecs_mount, module_mount):
    e = EXPECTED[key]
    m = numcodecs_mount if e["item"] == "numcodecs2" else module_mount(WILD / e["item"], "ro")
    want = expected_array(e)
    p = m.p(e["param"] + ".npy")
    assert data_of(p, want.nbytes) == want.tobytes(), key
    sl = np.ascontiguousarray(want[1:3])
    assert data_of(m.p(e["param"] + "[1:3].npy"), sl.nbytes) == sl.tobytes(), key


def test_numcodecs_fixtures_check_out_with_zarr_python():
    zarr = pytest.importorskip("zarr")
    for key, e in EXPECTED.items():
        if e["item"] == "numcodecs2" and e["param"] not in ("crc32c", "zstd_checksum_field"):
            z = zarr.open_array(str(WILD / e["item"] / e["param"]), mode="r")
            assert z[...].tobytes() == expected_array(e).tobytes(), key
    meta = json.loads((WILD / "numcodecs2" / "blosc_lz4_auto" / ".zarray").read_text())
    assert meta["compressor"]["shuffle"] == -1


@pytest.mark.parametrize("item,bad,named", [
    ("numcodecs2_unsupported", ("crc32", "delta", "lzma"), "{}"),
    ("numcodecs3_unsupported", ("delta", "lzma"), "numcodecs.{}"),
])
def test_numcodecs_undecodable_fail_naming_the_codec(item, bad, named, tmp_path):
    f = U.MountFactory(tmp_path / "mounts")
    try:
        m = f(WILD / item, "ro")
        names = sorted(n[:-4] for n in os.listdir(m.p()) if n.endswith(".npy"))
        assert names == sorted(bad + ("good",))
        for b in bad:
            e = U.errno_of(U.read_all, m.p(b + ".npy"))
            assert e in (errno.EIO, errno.ENOTSUP, errno.EOPNOTSUPP), f"{b}: errno {e}"
        m.unmount()
        log = m.log()
        for b in bad:
            name = named.format(b)
            assert [ln for ln in log.splitlines() if f'"{name}"' in ln], \
                f"no log line names the codec {name}:\n{log}"
    finally:
        f.close()


# ---------------------------------------------------------------- steps without _CHECKPOINT_METADATA

STEP_FILES = ["metadata/metadata", "state/params/layer_0/mlp/b1.npy", "state/step.npy"]


def _ref_step():
    return U.FIXTURES / "manager" / "20"


@pytest.mark.parametrize("name", ["legacy_step", "legacy_step_nocommit"])
def test_step_without_checkpoint_metadata_mounts(name, mount):
    ref = mount(_ref_step(), "ro")
    m = mount(WILD / name, "ro")
    assert sorted(n for n in os.listdir(m.p()) if not n.startswith("_") and n != "commit_success.txt") == \
        ["metadata", "state"]
    for rel in STEP_FILES:
        assert U.read_all(m.p(rel)) == U.read_all(ref.p(rel)), rel


def test_root_of_steps_without_checkpoint_metadata(mount):
    ref = mount(_ref_step(), "ro")
    m = mount(WILD / "legacy_root", "ro")
    assert sorted(os.listdir(m.p())) == ["20", "30", "latest"], "the tmp folder must stay invisible"
    for step in ("20", "30"):
        assert sorted(n for n in os.listdir(m.p(step)) if not n.startswith("_")
                      and n != "commit_success.txt") == ["metadata", "state"]
        for rel in STEP_FILES:
            assert U.read_all(m.p(f"{step}/{rel}")) == U.read_all(ref.p(rel)), f"{step}/{rel}"



# ---------------------------------------------------------------- OCDBT layouts of newer Orbax

OCDBT_EXPECTED = json.loads((WILD / "expected_ocdbt" / "ocdbt_expected.json").read_text())
OCDBT_ITEMS = ["ocdbt_split", "ocdbt_split_unmerged", "ocdbt_replica", "ocdbt_replica_merged"]


def _ocdbt_array(e):
    raw = (WILD / "expected_ocdbt" / e["file"]).read_bytes()
    return np.frombuffer(raw, dtype=np.dtype(e["dtype"]).newbyteorder("<")).reshape(e["shape"])


@pytest.mark.parametrize("item", OCDBT_ITEMS)
def test_ocdbt_layout_reads_byte_exact(item, module_mount):
    m = module_mount(WILD / item, "ro")
    keys = [k for k in sorted(OCDBT_EXPECTED) if OCDBT_EXPECTED[k]["item"] == item]
    assert len(keys) == 6
    for k in keys:
        e = OCDBT_EXPECTED[k]
        want = _ocdbt_array(e)
        rel = e["param"].replace(".", "/") + ".npy"
        got = np.load(m.p(rel))
        assert got.dtype == want.dtype and got.shape == want.shape, k
        assert got.tobytes() == want.tobytes(), k
        if want.ndim:
            sl = np.ascontiguousarray(want[1:3])
            assert data_of(m.p(rel[:-4] + "[1:3].npy"), sl.nbytes) == sl.tobytes(), k


def test_ocdbt_value_beyond_4gib(tmp_path, mount):
    item = tmp_path / "large"
    import subprocess
    import sys
    subprocess.run([sys.executable, str(U.REPO / "scripts" / "gen_ocdbt_layouts.py"), "--large", str(item)],
                   check=True)
    data = [p for p in (item / "d").iterdir() if p.stat().st_size > 1 << 32]
    assert len(data) == 1, "the generator must write one data file beyond 4 GiB (sparse)"
    m = mount(item, "ro")
    want = (np.arange(64 * 64, dtype=np.float32) * 0.5).reshape(64, 64)
    got = np.load(m.p("big/w.npy"))
    assert got.tobytes() == want.tobytes()
