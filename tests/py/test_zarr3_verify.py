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
    r = subprocess.run([sys.executable, str(HERE / "zarr3_verify.py"), str(step)], stdout=subprocess.PIPE,
                       timeout=300)
    assert r.returncode == 0
    assert b"12 arrays, 0 problems" in r.stdout


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
