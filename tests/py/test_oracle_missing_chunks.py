"""A chunk that is not stored, judged by Orbax 0.12.8's own restore.

Orbax restores an item whose `_METADATA` says
`store_array_data_equal_to_fill_value: true` with TensorStore's
`fill_missing_data_reads: false` (a missing chunk is an error), and any
other item with missing chunks read as the fill value (zeros for a zarr v2
`fill_value: null`).  Each case copies a real step, deletes one chunk file,
restores the copy with Orbax and reads it through a mount.
"""

import errno
import json
import os
import shutil

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402

import ckfs_util as U  # noqa: E402
from orbax_oracle import orbax_restore  # noqa: E402

pytestmark = pytest.mark.oracle

FIX = U.REPO / "tests" / "fixtures"

# (name, source step, array folder, chunk file to delete, flag edit: None = keep as written)
CASES = [
    # Orbax 0.6.4 wrote zarr v2 with fill_value null and no flag
    ("orbax064_zarr2_null", "real-writers/orbax-0.6.4/pytree_ocdbt_0", "params.Dense_0.kernel", "1.1", None),
    # Orbax 0.12.8 zarr v3 (fill_value 0.0) with the flag taken out, as before the flag existed
    ("orbax0128_zarr3_noflag", "orbax-0.12.8/pytree_files_zarr3_zstd", "opt_state.mu.embedding", "c/1/0", "drop"),
    # Orbax 0.12.8 zarr v2 (fill_value null) with the flag taken out
    ("orbax0128_zarr2_noflag", "orbax-0.12.8/pytree_files_zarr2_zstd", "params.layers_0.attn.q_proj.kernel", "0.1",
     "drop"),
]


def damaged_copy(tmp_path, src, arr, chunk, flag):
    dst = tmp_path / "step"
    shutil.copytree(FIX / src, dst)
    os.unlink(dst / arr / chunk)
    if flag == "drop":
        meta = json.loads((dst / "_METADATA").read_text())
        meta.pop("store_array_data_equal_to_fill_value", None)
        (dst / "_METADATA").write_text(json.dumps(meta))
    return dst


def npy_data(raw):
    _v, hl, _shape, _f, _dt, _h = U.parse_npy_header(raw[:4096])
    return raw[hl:]


@pytest.mark.parametrize("name,src,arr,chunk,flag", CASES, ids=[c[0] for c in CASES])
def test_missing_chunk_reads_as_orbax_restores(name, src, arr, chunk, flag, tmp_path, mount):
    step = damaged_copy(tmp_path, src, arr, chunk, flag)
    meta = json.loads((step / "_METADATA").read_text())
    assert meta.get("store_array_data_equal_to_fill_value") is not True
    want = orbax_restore(step)
    keys = tuple(arr.split("."))
    a = np.array(want[keys], order="C", copy=True)
    intact = np.array(orbax_restore(FIX / src)[keys], order="C", copy=True)
    assert a.tobytes() != intact.tobytes(), "Orbax restored the deleted chunk's data: the case tests nothing"
    m = mount(step)
    rel = "/".join(keys) + ".npy"
    assert npy_data(U.read_all(m.p(rel))) == a.tobytes(), f"{rel}: not what Orbax restores"


def test_missing_chunk_with_flag_is_eio_as_orbax_fails(tmp_path, mount):
    src, arr, chunk = "orbax-0.12.8/pytree_files_zarr2_zstd", "params.layers_0.attn.q_proj.kernel", "0.1"
    step = damaged_copy(tmp_path, src, arr, chunk, None)
    assert json.loads((step / "_METADATA").read_text())["store_array_data_equal_to_fill_value"] is True
    with pytest.raises(Exception):
        orbax_restore(step)
    m = mount(step)
    assert U.errno_of(U.read_all, m.p("params/layers_0/attn/q_proj/kernel.npy")) == errno.EIO
    other = orbax_restore(FIX / src)[("params", "layers_0", "attn", "o_proj", "kernel")]
    assert npy_data(U.read_all(m.p("params/layers_0/attn/o_proj/kernel.npy"))) == \
        np.array(other, order="C", copy=True).tobytes()
