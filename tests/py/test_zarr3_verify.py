"""The writer's output checked by an independent reader (zarr3_verify.py).

`test_writer --emit DIR` (the C unit-test binary) writes a checkpoint step
with libckpt's writer plus the source bytes of every array; here the step is
checked against the zarr v3 / Orbax layout rules and decoded without any C
code, and the values are compared.  The checker itself is validated on a
real Orbax checkpoint and on corrupted copies (it must fail).

The binary is found in $CKPT_BUILD_DIR, else beside $CKPT_BIN (the daemon),
else in <repo>/build, <repo>/build-writer.  No FUSE mount is needed.
"""

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import zarr3_verify as V  # noqa: E402

REPO = HERE.parent.parent
FIXTURES = Path(os.environ.get("CKPT_FIXTURES", REPO / "tests" / "fixtures" / "orbax-0.12.4"))


def find_test_writer():
    cands = []
    if os.environ.get("CKPT_BUILD_DIR"):
        cands.append(Path(os.environ["CKPT_BUILD_DIR"]))
    if os.environ.get("CKPT_BIN"):
        cands.append(Path(os.environ["CKPT_BIN"]).parent)
    cands += [REPO / "build", REPO / "build-writer"]
    for c in cands:
        if (c / "test_writer").exists():
            return c / "test_writer"
    return None


@pytest.fixture(scope="module")
def emitted(tmp_path_factory):
    exe = find_test_writer()
    if exe is None:
        pytest.fail("test_writer not built (set CKPT_BUILD_DIR)")
    d = tmp_path_factory.mktemp("emit")
    r = subprocess.run([str(exe), "--emit", str(d)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    assert r.returncode == 0, r.stderr.decode()
    step = Path(r.stdout.decode().strip())
    assert step == d / "root" / "1"
    return d, step


def expected_arrays(d):
    out = {}
    for e in json.loads((d / "expected" / "expected.json").read_text()):
        npdt, _ = V.DTYPES[e["dtype"]]
        raw = (d / "expected" / e["file"]).read_bytes()
        out[(e["item"], e["name"])] = np.frombuffer(raw, dtype=npdt).reshape(e["shape"])
    return out


def test_emitted_step_is_valid_and_values_match(emitted):
    d, step = emitted
    arrays, problems = V.verify(str(step))
    assert problems == []
    exp = expected_arrays(d)
    assert set(arrays) == set(exp)
    for k, want in exp.items():
        got = arrays[k]
        assert got.shape == want.shape, k
        assert got.dtype == want.dtype, k
        assert got.tobytes() == want.tobytes(), k
    # Only the step is in the root: no tmp folder, no spill file left.
    assert sorted(os.listdir(d / "root")) == ["1"]
    assert not any(n.startswith(".") for n in os.listdir(step))


def test_cli_summary_and_exit_status(emitted):
    _, step = emitted
    r = subprocess.run([sys.executable, str(HERE / "zarr3_verify.py"), "--no-restore-checks", str(step)],
                       stdout=subprocess.PIPE, timeout=300)
    assert r.returncode == 0
    assert b"12 arrays, 0 problems" in r.stdout


def test_cli_restore_checks_pass_on_emitted_step(emitted):
    _, step = emitted
    r = subprocess.run([sys.executable, str(HERE / "zarr3_verify.py"), str(step)], stdout=subprocess.PIPE,
                       timeout=300)
    assert r.returncode == 0, r.stdout.decode()[-3000:]


def test_checker_accepts_real_orbax_zarr3_and_decodes_it():
    src = FIXTURES / "pytree_zarr3"
    if not src.exists():
        pytest.skip(f"no fixtures at {FIXTURES}")
    arrays, problems = V.verify(str(src))
    assert problems == []
    exp = json.loads((FIXTURES / "expected" / "expected.json").read_text())
    for name, e in exp.items():
        got = arrays[("pytree_zarr3", name)]
        want = (FIXTURES / "expected" / e["file"]).read_bytes()
        assert list(got.shape) == e["shape"]
        assert got.tobytes() == want, name


def corrupt_copy(step, tmp_path):
    dst = tmp_path / "1"
    shutil.copytree(step, dst)
    return dst


def test_checker_catches_index_crc(emitted, tmp_path):
    _, step = emitted
    s = corrupt_copy(step, tmp_path)
    f = s / "state" / "params.dense.kernel" / "c" / "0" / "0"
    b = bytearray(f.read_bytes())
    b[-1] ^= 0xFF
    f.write_bytes(bytes(b))
    _, problems = V.verify(str(s))
    assert any("CRC-32C" in p for p in problems)


def test_checker_catches_bad_frame(emitted, tmp_path):
    _, step = emitted
    s = corrupt_copy(step, tmp_path)
    f = s / "state" / "params.dense.kernel" / "c" / "0" / "0"
    b = bytearray(f.read_bytes())
    b[20] ^= 0x01  # inside the first zstd frame: content or checksum no longer match
    f.write_bytes(bytes(b))
    _, problems = V.verify(str(s))
    assert problems


def test_checker_catches_overlap_and_missing_shard(emitted, tmp_path):
    _, step = emitted
    s = corrupt_copy(step, tmp_path)
    # Point the second inner chunk of a multi-chunk shard at the first one.
    big = s / "state" / "big"
    meta = json.loads((big / "zarr.json").read_text())
    shard = meta["chunk_grid"]["configuration"]["chunk_shape"]
    inner = meta["codecs"][0]["configuration"]["chunk_shape"]
    n = int(np.prod([a // b for a, b in zip(shard, inner)]))
    assert n >= 2
    f = big / "c" / "0" / "0"
    b = bytearray(f.read_bytes())
    ix = len(b) - (16 * n + 4)
    off0, len0 = struct.unpack_from("<QQ", b, ix)
    struct.pack_into("<QQ", b, ix + 16, off0, len0)
    struct.pack_into("<I", b, len(b) - 4, V.crc32c(bytes(b[ix:len(b) - 4])))
    f.write_bytes(bytes(b))
    (s / "state" / "i64" / "c" / "0" / "0").unlink()
    _, problems = V.verify(str(s))
    assert any("overlaps" in p for p in problems)
    assert any("shard missing" in p for p in problems)


def test_checker_catches_metadata_errors(emitted, tmp_path):
    _, step = emitted
    s = corrupt_copy(step, tmp_path)
    m = json.loads((s / "state" / "_METADATA").read_text())
    m["use_zarr3"] = False
    (s / "state" / "_METADATA").write_text(json.dumps(m))
    z = json.loads((s / "extra" / "q" / "zarr.json").read_text())
    z["fill_value"] = 1
    (s / "extra" / "q" / "zarr.json").write_text(json.dumps(z))
    (s / "commit_success.txt").unlink()
    _, problems = V.verify(str(s))
    text = "\n".join(problems)
    assert "use_zarr3" in text and "fill_value" in text and "commit_success.txt" in text


# ---------------------------------------------------------------------------
# Restore checks: what Orbax's restore needs beyond a valid layout.
# The checker must fail on each defect; each case starts from a clean copy
# of the emitted step (default shardings added where the writer left none).

ONE_DEVICE = json.dumps({"sharding_type": "NamedSharding", "shape": [1], "axis_names": ["d"],
                         "axis_types": ["AxisType.Auto"], "partition_spec": [],
                         "device_mesh": {"mesh": [{"id": 0}]}})


def b64(name):
    import base64
    return base64.urlsafe_b64encode(name.encode()).decode()


def load(p):
    return json.loads(Path(p).read_text())


def dump(p, doc):
    Path(p).write_text(json.dumps(doc))


def add_default_shardings(step):
    for item in load(step / "_CHECKPOINT_METADATA")["item_handlers"]:
        meta = step / item / "_METADATA"
        if not meta.exists():
            continue
        sp = step / item / "_sharding"
        table = load(sp) if sp.exists() else {}
        for ent in load(meta)["tree_metadata"].values():
            if ent["value_metadata"]["value_type"] == "jax.Array":
                table.setdefault(b64(".".join(k["key"] for k in ent["key_metadata"])), ONE_DEVICE)
        dump(sp, table)


def test_emitted_step_passes_restore_checks(emitted):
    _, step = emitted
    _, problems = V.verify(str(step), restore_checks=True)
    assert problems == []


def test_restore_checks_accept_real_orbax_zarr3():
    src = FIXTURES / "pytree_zarr3"
    if not src.exists():
        pytest.skip(f"no fixtures at {FIXTURES}")
    arrays, problems = V.verify(str(src), restore_checks=True)
    assert problems == [] and len(arrays) == 10


@pytest.fixture
def clean(emitted, tmp_path):
    """A copy of the emitted step that passes the restore checks."""
    _, step = emitted
    s = corrupt_copy(step, tmp_path)
    add_default_shardings(s)
    _, problems = V.verify(str(s), restore_checks=True)
    assert problems == []
    return s


def problems_of(step, **kw):
    _, problems = V.verify(str(step), restore_checks=True, **kw)
    return "\n".join(problems)


def test_restore_checks_off_by_default_switch(clean):
    # verify() without restore_checks follows the module switch
    sp = clean / "state" / "_sharding"
    sp.unlink()
    _, problems = V.verify(str(clean), restore_checks=False)
    assert problems == []


def test_catches_missing_sharding_entry(clean):
    sp = clean / "state" / "_sharding"
    table = load(sp)
    del table[b64("layers.1.w")]
    dump(sp, table)
    assert "no sharding entry for jax.Array 'layers.1.w'" in problems_of(clean)


def test_catches_missing_sharding_file(clean):
    (clean / "extra" / "_sharding").unlink()
    assert "extra/_sharding: missing" in problems_of(clean)


def test_catches_unrestorable_sharding_type(clean):
    sp = clean / "state" / "_sharding"
    table = load(sp)
    table[b64("f64")] = json.dumps({"sharding_type": "PositionalSharding"})
    dump(sp, table)
    assert "PositionalSharding" in problems_of(clean)


def test_catches_empty_item(clean):
    e = clean / "empty"
    e.mkdir()
    dump(e / "_METADATA", {"tree_metadata": {}, "use_ocdbt": False, "use_zarr3": True,
                           "store_array_data_equal_to_fill_value": True, "custom_metadata": None})
    (e / "commit_success.txt").write_text(f"Checkpoint commit was successful to {e}")
    cm = load(clean / "_CHECKPOINT_METADATA")
    cm["item_handlers"]["empty"] = cm["item_handlers"]["state"]
    dump(clean / "_CHECKPOINT_METADATA", cm)
    assert "item has no leaves" in problems_of(clean)


def drop_leaf(item, keys):
    meta = load(item / "_METADATA")
    del meta["tree_metadata"][str(tuple(keys))]
    dump(item / "_METADATA", meta)
    name = ".".join(keys)
    shutil.rmtree(item / name)
    sp = item / "_sharding"
    table = load(sp)
    table.pop(b64(name), None)
    dump(sp, table)


def test_catches_list_gap(clean):
    drop_leaf(clean / "state", ["layers", "0", "w"])  # only layers/1 is left
    assert "list layers has indices [1], not 0..0" in problems_of(clean)


def test_catches_dict_list_mix(clean):
    meta = load(clean / "state" / "_METADATA")
    ent = meta["tree_metadata"]["('layers', '1', 'w')"]
    ent["key_metadata"][1] = {"key": "x", "key_type": 2}
    meta["tree_metadata"]["('layers', 'x', 'w')"] = meta["tree_metadata"].pop("('layers', '1', 'w')")
    dump(clean / "state" / "_METADATA", meta)
    os.rename(clean / "state" / "layers.1.w", clean / "state" / "layers.x.w")
    sp = clean / "state" / "_sharding"
    table = load(sp)
    table[b64("layers.x.w")] = table.pop(b64("layers.1.w"))
    dump(sp, table)
    assert "layers mixes dict keys and list indices" in problems_of(clean)


def test_catches_zero_size_array(clean):
    z = load(clean / "state" / "i64" / "zarr.json")
    z["shape"] = [0, 10]
    dump(clean / "state" / "i64" / "zarr.json", z)
    assert "zero-size array" in problems_of(clean)


def test_catches_uint4(clean):
    z = load(clean / "extra" / "q" / "zarr.json")
    z["data_type"] = "uint4"
    dump(clean / "extra" / "q" / "zarr.json", z)
    assert "uint4 has no TensorStore name" in problems_of(clean)


def test_catches_stray_step_subfolder(clean):
    (clean / "state2.orbax-checkpoint-tmp").mkdir()
    assert "not named in item_handlers" in problems_of(clean)


def test_catches_reserved_item_name(clean):
    os.rename(clean / "extra", clean / "descriptor")
    cm = load(clean / "_CHECKPOINT_METADATA")
    cm["item_handlers"]["descriptor"] = cm["item_handlers"].pop("extra")
    dump(clean / "_CHECKPOINT_METADATA", cm)
    assert "reserved item name 'descriptor'" in problems_of(clean)


def test_catches_undiscoverable_step_name(clean, tmp_path):
    best = tmp_path / "best"
    os.rename(clean, best)
    assert "step name 'best'" in problems_of(best)
    for name in ("step_0040", "40"):
        ok = tmp_path / name
        os.rename(best, ok)
        assert "step name" not in problems_of(ok)
        best = ok


def test_json_item_accepted_and_checked(clean):
    m = clean / "metadata"
    m.mkdir()
    (m / "metadata").write_text(json.dumps({"step": 1, "note": "hi"}))
    (m / "commit_success.txt").write_text(f"Checkpoint commit was successful to {m}")
    cm = load(clean / "_CHECKPOINT_METADATA")
    cm["item_handlers"]["metadata"] = V.JSON_HANDLER
    dump(clean / "_CHECKPOINT_METADATA", cm)
    assert problems_of(clean) == ""
    (m / "metadata").unlink()
    assert "JSON item without its `metadata` file" in problems_of(clean)


def test_catches_unknown_handler(clean):
    cm = load(clean / "_CHECKPOINT_METADATA")
    cm["item_handlers"]["extra"] = "my.module.Handler"
    dump(clean / "_CHECKPOINT_METADATA", cm)
    assert "unknown item handler 'my.module.Handler'" in problems_of(clean)
