"""bfloat16 and float8 arrays for plain numpy: NAME.f32.npy is a
hidden companion of NAME.npy holding the same values as float32 '<f4',
exactly (every bfloat16 / float8 value is a float32 value); also for slices,
NAME[<slice>].f32.npy.  Other dtypes have no such name."""

import json
import math
import os

import numpy as np
import pytest

import ckfs_util as U


def bf16_to_f32(u16):
    return (u16.astype(np.uint32) << 16).view(np.float32)


def f8_value(x, mbits, bias, ieee):
    """Reference decoding of one float8 byte (written from the format's definition)."""
    ebits = 7 - mbits
    s = -1.0 if x & 0x80 else 1.0
    e = (x >> mbits) & ((1 << ebits) - 1)
    m = x & ((1 << mbits) - 1)
    if e == (1 << ebits) - 1 and (ieee or m == (1 << mbits) - 1):
        return s * math.inf if ieee and m == 0 else math.nan
    if e == 0:
        return s * m * 2.0 ** (1 - bias - mbits)
    return s * (1 + m / (1 << mbits)) * 2.0 ** (e - bias)


F8 = {"float8_e4m3fn": (3, 7, False), "float8_e5m2": (2, 15, True)}


@pytest.fixture(scope="module")
def f8_item(tmp_path_factory):
    """A zarr3 item with one uncompressed [16,16] array per float8 dtype
    holding all 256 byte patterns."""
    item = tmp_path_factory.mktemp("f8") / "item"
    tree = {}
    for dt in F8:
        d = item / dt
        (d / "c").mkdir(parents=True)
        (d / "zarr.json").write_text(json.dumps({
            "zarr_format": 3, "node_type": "array", "shape": [16, 16], "data_type": dt,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [16, 16]}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": 0, "codecs": [{"name": "bytes"}], "attributes": {}}))
        (d / "c" / "0").mkdir()
        (d / "c" / "0" / "0").write_bytes(bytes(range(256)))
        tree[f"('{dt}',)"] = {"key_metadata": [{"key": dt, "key_type": 2}],
                              "value_metadata": {"value_type": "jax.Array", "skip_deserialize": False}}
    (item / "_METADATA").write_text(json.dumps({
        "tree_metadata": tree, "use_ocdbt": False, "use_zarr3": True,
        "store_array_data_equal_to_fill_value": True, "custom_metadata": None}))
    return item


def bf16_arrays():
    lay = U.layout("pytree_zarr3")
    exp = U.load_expected()
    return lay, [(rel, a) for rel, a in sorted(lay.arrays.items()) if exp[a.key].dtype == "bfloat16"], exp


def test_bf16_widened_exactly(mount):
    lay, arrays, exp = bf16_arrays()
    assert arrays, "the fixture has bfloat16 arrays"
    m = mount(lay.source)
    for rel, a in arrays:
        raw = exp[a.key].array()  # uint16 patterns
        w = np.load(m.p(rel[:-4] + ".f32.npy"))
        assert w.dtype == np.dtype("<f4") and w.shape == raw.shape, rel
        assert w.tobytes() == bf16_to_f32(raw).tobytes(), rel
        assert os.getxattr(m.p(rel[:-4] + ".f32.npy"), "user.ckpt.dtype") == b"float32"
        # hidden: not listed
        assert os.path.basename(rel[:-4] + ".f32.npy") not in os.listdir(os.path.dirname(m.p(rel)))


def test_bf16_slice_widened(mount):
    lay, arrays, exp = bf16_arrays()
    m = mount(lay.source)
    rel, a = arrays[0]
    raw = exp[a.key].array()
    n = raw.shape[0]
    box = f"[1:{min(n, 4)}]"
    w = np.load(m.p(rel[:-4] + box + ".f32.npy"))
    assert w.tobytes() == bf16_to_f32(raw[1:min(n, 4)]).tobytes()
    # reads at odd offsets and lengths agree with the whole file
    whole = open(m.p(rel[:-4] + ".f32.npy"), "rb").read()
    fd = os.open(m.p(rel[:-4] + ".f32.npy"), os.O_RDONLY)
    try:
        for off, ln in ((0, 7), (127, 5), (len(whole) - 3, 10), (len(whole) // 2 + 1, 9)):
            assert os.pread(fd, ln, off) == whole[off:off + ln], (off, ln)
    finally:
        os.close(fd)


@pytest.mark.parametrize("dt", sorted(F8))
def test_float8_widened_exactly(mount, f8_item, dt):
    m = mount(f8_item)
    w = np.load(m.p(f"{dt}.f32.npy"))
    assert w.dtype == np.dtype("<f4") and w.shape == (16, 16)
    want = np.array([f8_value(x, *F8[dt]) for x in range(256)], dtype=np.float32).reshape(16, 16)
    assert np.array_equal(np.isnan(w), np.isnan(want))
    ok = ~np.isnan(want)
    assert (w[ok] == want[ok]).all() and (np.signbit(w[ok]) == np.signbit(want[ok])).all()
    # a few landmarks
    flat = w.reshape(-1)
    if dt == "float8_e4m3fn":
        assert flat[0x7E] == 448 and flat[0x01] == 2.0 ** -9 and math.isnan(flat[0x7F])
    else:
        assert flat[0x7B] == 57344 and flat[0x7C] == math.inf and flat[0x01] == 2.0 ** -16
    s = np.load(m.p(f"{dt}[2:4,0:3].f32.npy"))
    assert s.tobytes() == w[2:4, 0:3].tobytes()


def test_no_widened_name_for_other_dtypes(mount):
    lay = U.layout("pytree_zarr3")
    exp = U.load_expected()
    m = mount(lay.source)
    other = [rel for rel, a in sorted(lay.arrays.items()) if exp[a.key].dtype == "float32"]
    assert other
    with pytest.raises(FileNotFoundError):
        os.stat(m.p(other[0][:-4] + ".f32.npy"))
