"""Self-test of st_spec, the independent safetensors validator: the shipped
fixture and a small hand-checked example pass and decode to the
expected values; deliberately broken files fail with the reference
reader's error.  No mount needed."""

import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import st_spec
from st_spec import SpecError, load, parse, writer_deviations

HERE = Path(__file__).resolve().parent
FIXTURES = Path(
    os.environ.get("CKPT_FIXTURES", HERE.parent / "fixtures" / "orbax-0.12.4")
)
TS_TO_ST = {"float32": "F32", "bfloat16": "BF16", "int32": "I32", "float64": "F64", "int64": "I64"}


# ---- a tiny file builder (independent of the C writer) --------------------


def build(entries, metadata=None, pad=" ", raw_json=None, data=None, extra=b""):
    """entries: [(name, dtype, shape, begin, end)] in the JSON order wanted.
    data: the data buffer (default: bytes 0..255 repeating, as long as the
    largest END).  Returns the file bytes."""
    if raw_json is None:
        parts = []
        if metadata is not None:
            parts.append('"__metadata__":' + json.dumps(metadata, separators=(",", ":")))
        for name, dt, shape, b, e in entries:
            parts.append(
                json.dumps(name)
                + ":"
                + json.dumps({"dtype": dt, "shape": shape, "data_offsets": [b, e]}, separators=(",", ":"))
            )
        raw_json = "{" + ",".join(parts) + "}"
    head = raw_json.encode("utf-8") if isinstance(raw_json, str) else raw_json
    if pad:
        head += pad.encode() * ((8 - len(head) % 8) % 8)
    if data is None:
        end = max([e for *_, e in entries], default=0)
        data = bytes(i % 256 for i in range(end))
    return struct.pack("<Q", len(head)) + head + data + extra


def code_of(blob, strict=True):
    with pytest.raises(SpecError) as ei:
        parse(blob, strict=strict)
    return ei.value.code


GOOD = [("w", "F32", [2, 3], 0, 24), ("b", "BF16", [3], 24, 30)]


# ---- the fixture ---------------------------------------------------------


@pytest.fixture(scope="module")
def expected():
    path = FIXTURES / "expected" / "expected.json"
    if not path.exists():
        pytest.fail(f"fixtures not found at {FIXTURES}")
    return json.loads(path.read_text())


def test_fixture_matches_expected(expected):
    tensors, metadata = load(FIXTURES / "params.safetensors")
    assert metadata is None  # written without __metadata__
    assert len(tensors) == 8
    for name, (dtype, shape, data) in tensors.items():
        exp = expected[name]
        assert dtype == TS_TO_ST[exp["dtype"]], name
        assert list(shape) == exp["shape"], name
        ref = (FIXTURES / "expected" / exp["file"]).read_bytes()
        assert hashlib.sha256(ref).hexdigest() == exp["sha256"], name
        # bf16 and everything else compared as raw bit patterns
        assert data == ref, name
        if dtype == "BF16":
            a = np.frombuffer(data, "<u2").reshape(shape)
            b = np.frombuffer(ref, "<u2").reshape(shape)
            assert np.array_equal(a, b)
    # all arrays of the checkpoint's params / opt_state float leaves are there
    assert {n for n in expected if n.startswith("params.")} <= set(tensors)


def test_fixture_follows_writer_conventions():
    p = st_spec.parse_file(FIXTURES / "params.safetensors")
    assert writer_deviations(p) == []
    assert p.n % 8 == 0


def test_worked_example():
    # w = F32 [2,3] = 0..5, b = BF16 [3] = 1.0, -2.0, 0.5 (bf16 bits 3f80, c000, 3f00)
    w = np.arange(6, dtype="<f4").tobytes()
    b = bytes.fromhex("803f00c0003f")
    blob = build(GOOD, metadata={"format": "pt"}, data=w + b)
    assert len(blob) == 152 + 30
    assert blob[:8] == bytes.fromhex("9000000000000000")
    p = parse(blob)
    assert p.n == 144 and p.data_start == 152
    assert p.metadata == {"format": "pt"}
    d = p.as_dict()
    assert d["w"] == ("F32", (2, 3), w)
    assert np.frombuffer(d["w"][2], "<f4").tolist() == [0, 1, 2, 3, 4, 5]
    bf = np.frombuffer(d["b"][2], "<u2").astype(np.uint32) << 16
    assert bf.view(np.float32).tolist() == [1.0, -2.0, 0.5]
    assert writer_deviations(p) == []


def test_scalar_empty_and_no_tensors():
    ok = build([("e", "F32", [0, 4], 0, 0), ("s", "I32", [], 0, 4)])
    d = parse(ok).as_dict()
    assert d["e"] == ("F32", (0, 4), b"") and d["s"][1] == () and len(d["s"][2]) == 4
    empty = build([])
    assert parse(empty).as_dict() == {}
    assert empty == struct.pack("<Q", 8) + b"{}      "


def test_key_order_does_not_matter():
    shuffled = build(list(reversed(GOOD)))
    p = parse(shuffled)
    assert [t.name for t in p.tensors] == ["w", "b"]
    assert "JSON key order differs from data order" in writer_deviations(p)


def test_writer_deviations_detected():
    # valid for the reader, not what the reference writer emits
    p = parse(build([("b", "BF16", [3], 0, 6), ("w", "F32", [2, 3], 6, 30)]))
    assert any("alignment" in d for d in writer_deviations(p))
    flagged = 0
    for name in ("a", "aa", "aaa", "aaaa"):
        p = parse(build([(name, "U8", [2], 0, 2)], pad=None))
        if p.n % 8:
            flagged += 1
            assert any("multiple of 8" in d for d in writer_deviations(p))
    assert flagged >= 3
    spaced = build(GOOD, raw_json=json.dumps({e[0]: {"dtype": e[1], "shape": e[2], "data_offsets": [e[3], e[4]]} for e in GOOD}))
    assert any("compact" in d for d in writer_deviations(parse(spaced)))
    meta_last = build(GOOD, raw_json='{"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},'
                      '"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[3],"data_offsets":[24,30]}}')
    assert "__metadata__ is not the first key" in writer_deviations(parse(meta_last))


# ---- broken files -----------------------------------------------------------


def test_hole():
    # 16 bytes nobody owns between the tensors
    blob = build([("w", "F32", [2, 3], 0, 24), ("b", "BF16", [3], 40, 46)])
    assert code_of(blob) == "InvalidOffset"


def test_overlap():
    blob = build([("w", "F32", [2, 3], 0, 24), ("b", "BF16", [3], 20, 26)])
    assert code_of(blob) == "InvalidOffset"


def test_first_not_at_zero_and_reversed_offsets():
    assert code_of(build([("w", "F32", [2], 4, 12)])) == "InvalidOffset"
    assert code_of(build([("w", "F32", [0], 8, 0)], data=bytes(8))) == "InvalidOffset"


def test_trailing_bytes_and_missing_data():
    assert code_of(build(GOOD, extra=b" " * 8)) == "MetadataIncompleteBuffer"
    assert code_of(build(GOOD)[:-1]) == "MetadataIncompleteBuffer"


def test_bad_dtype():
    assert code_of(build([("w", "F12", [2], 0, 8)])) == "InvalidHeaderDeserialization"
    assert code_of(build([("w", "f32", [2], 0, 8)])) == "InvalidHeaderDeserialization"
    assert code_of(build([("w", 32, [2], 0, 8)])) == "InvalidHeaderDeserialization"


def test_size_mismatch_overflow_misaligned():
    assert code_of(build([("w", "F32", [2, 3], 0, 20)])) == "TensorInvalidInfo"
    assert code_of(build([("w", "U8", [1 << 32, 1 << 32], 0, 0)], data=b"")) == "ValidationOverflow"
    # 2^61 elements * 32 bits does not fit 64 bits even though the bytes would
    assert code_of(build([("w", "F32", [1 << 61], 0, 0)], data=b"")) == "ValidationOverflow"
    assert code_of(build([("w", "F4", [3], 0, 1)], data=b"\0")) == "MisalignedSlice"
    assert parse(build([("w", "F4", [4], 0, 2)])).as_dict()["w"][0] == "F4"


def test_header_length_checks():
    assert code_of(b"\x08\0\0\0") == "HeaderTooSmall"
    assert code_of(b"") == "HeaderTooSmall"
    assert code_of(struct.pack("<Q", 100_000_001) + b"{}") == "HeaderTooLarge"
    assert code_of(struct.pack("<Q", 1 << 63)) == "HeaderTooLarge"
    assert code_of(struct.pack("<Q", 64) + b"{}      ") == "InvalidHeaderLength"


def test_header_text_checks():
    assert code_of(build([], raw_json=b'{"\xff":1}')) == "InvalidHeader"
    assert code_of(build([], raw_json=' {"w":{"dtype":"F32","shape":[],"data_offsets":[0,4]}}', data=bytes(4))) == "InvalidHeaderStart"
    assert parse(build([], raw_json=' {}'), strict=False).tensors == []
    assert code_of(build([], raw_json="[]")) == "InvalidHeaderStart"
    assert code_of(build([], raw_json="[]"), strict=False) == "InvalidHeaderDeserialization"
    assert code_of(build([], raw_json="{", pad=" ")) == "InvalidHeaderDeserialization"
    # NUL padding is not JSON whitespace
    assert code_of(build(GOOD, pad="\0")) == "InvalidHeaderDeserialization"


def test_metadata_rules():
    assert parse(build(GOOD, metadata={"format": "pt", "step": "20"})).metadata["step"] == "20"
    assert code_of(build(GOOD, metadata={"format": {"x": "y"}})) == "InvalidHeaderDeserialization"
    assert code_of(build(GOOD, metadata={"step": 20})) == "InvalidHeaderDeserialization"
    assert code_of(build(GOOD, metadata=["pt"])) == "InvalidHeaderDeserialization"
    assert code_of(build(GOOD, metadata={"k": "\ud800"})) == "InvalidHeaderDeserialization"
    assert parse(build(GOOD, raw_json='{"__metadata__":null,' + build_json(GOOD)[1:])).metadata is None


def build_json(entries):
    return "{" + ",".join(
        json.dumps(n) + ":" + json.dumps({"dtype": d, "shape": s, "data_offsets": [b, e]}, separators=(",", ":"))
        for n, d, s, b, e in entries
    ) + "}"


def test_bad_numbers():
    for shape in ("[2.0]", "[-1]", "[true]", "[NaN]", "[18446744073709551616]", '["2"]', "2"):
        js = '{"w":{"dtype":"U8","shape":%s,"data_offsets":[0,2]}}' % shape
        assert code_of(build([], raw_json=js, data=bytes(2))) == "InvalidHeaderDeserialization", shape
    for offs in ("[0]", "[0,2,4]", "[0,2.0]", "[-2,0]", "null"):
        js = '{"w":{"dtype":"U8","shape":[2],"data_offsets":%s}}' % offs
        assert code_of(build([], raw_json=js, data=bytes(2))) == "InvalidHeaderDeserialization", offs
    js = '{"w":{"dtype":"U8","shape":[2]}}'
    assert code_of(build([], raw_json=js, data=bytes(2))) == "InvalidHeaderDeserialization"


def test_strict_only_rules():
    dup = '{"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}'
    assert code_of(build([], raw_json=dup, data=bytes(2))) == "DuplicateKey"
    assert len(parse(build([], raw_json=dup, data=bytes(2)), strict=False).tensors) == 1
    extra = '{"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"note":"x"}}'
    assert code_of(build([], raw_json=extra, data=bytes(2))) == "UnknownField"
    assert len(parse(build([], raw_json=extra, data=bytes(2)), strict=False).tensors) == 1


def test_escaped_names_roundtrip():
    names = ['we"ird', "back\\slash", "new\nline", "ctl\x01", "caf\u00e9"]
    entries = [(n, "U8", [1], i, i + 1) for i, n in enumerate(names)]
    got = parse(build(entries)).as_dict()
    assert sorted(got) == sorted(names)


# ---- the module entry points -------------------------------------------------


def test_load_and_cli(tmp_path):
    good = tmp_path / "good.safetensors"
    good.write_bytes(build(GOOD, metadata={"format": "pt"}))
    tensors, meta = load(good)
    assert meta == {"format": "pt"} and tensors["b"][:2] == ("BF16", (3,))
    tensors, _ = load(good, read_data=False)
    assert tensors["w"][2] is None
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(build(GOOD, extra=b"\0" * 8))
    with pytest.raises(SpecError):
        load(bad)

    script = HERE / "st_spec.py"
    r = subprocess.run([sys.executable, str(script), "--writer", str(good)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 tensors" in r.stdout and "OK" in r.stdout
    r = subprocess.run([sys.executable, str(script), str(bad)], capture_output=True, text=True)
    assert r.returncode == 1
    assert "VIOLATION MetadataIncompleteBuffer" in r.stdout
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "missing")], capture_output=True, text=True)
    assert r.returncode == 1
    shuffled = tmp_path / "shuffled.safetensors"
    shuffled.write_bytes(build(list(reversed(GOOD))))
    r = subprocess.run([sys.executable, str(script), str(shuffled)], capture_output=True, text=True)
    assert r.returncode == 0
    r = subprocess.run([sys.executable, str(script), "--writer", str(shuffled)], capture_output=True, text=True)
    assert r.returncode == 1 and "writer convention" in r.stdout
