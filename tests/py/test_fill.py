"""Missing chunks read as the fill value where the checkpoint allows it:
_METADATA's store_array_data_equal_to_fill_value false (or absent) and a
fill value in the array metadata (zarr v2 fill_value 0, zarr v3 0.0 or
2.5; zeros for a zarr v2 fill_value null); only the missing box does.
(With the flag true a missing chunk is EIO: test_missing_data.py.)"""

import json
import os

import numpy as np

import ckfs_util as U
from ckfs_help import _writable_copy


def _expected_f32(expected, key):
    e = expected[key]
    return np.frombuffer(e.data, dtype=np.float32).reshape(e.shape)


def _edit(path, **members):
    doc = json.loads(path.read_text())
    doc.update(members)
    path.write_text(json.dumps(doc))


def test_missing_chunks_read_as_fill(tmp_path, mount, expected):
    z2 = tmp_path / "z2"
    z3 = tmp_path / "z3"
    _writable_copy(U.FIXTURES / "pytree_zarr2", z2)
    _writable_copy(U.FIXTURES / "pytree_zarr3", z3)
    for src in (z2, z3):
        _edit(src / "_METADATA", store_array_data_equal_to_fill_value=False)
    # q_proj: f32 [32, 48] in [8, 24] chunks; remove chunk (1, 1) -> rows 8:16, cols 24:48
    _edit(z2 / "params.layer_0.attn.q_proj" / ".zarray", fill_value=0)
    os.unlink(z2 / "params.layer_0.attn.q_proj" / "1.1")
    os.unlink(z3 / "params.layer_0.attn.q_proj" / "c" / "1" / "1")
    # a v3 fill value that is not zero
    _edit(z3 / "params.layer_0.mlp.b1" / "zarr.json", fill_value=2.5)
    os.unlink(z3 / "params.layer_0.mlp.b1" / "c" / "0")  # b1: f32 [128] in [16] chunks

    want = _expected_f32(expected, "params.layer_0.attn.q_proj").copy()
    want[8:16, 24:48] = 0
    for src in (z2, z3):
        m = mount(src)
        got = np.load(m.p("params/layer_0/attn/q_proj.npy"))
        assert np.array_equal(got, want), src.name
    b1 = np.load(m.p("params/layer_0/mlp/b1.npy"))
    want_b1 = _expected_f32(expected, "params.layer_0.mlp.b1").copy()
    want_b1[0:16] = 2.5
    assert np.array_equal(b1, want_b1)
