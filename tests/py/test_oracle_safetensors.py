"""Every safetensors view of the mount, loaded by the real `safetensors`
library and by Orbax v1's safetensors layout.

- `X.safetensors` of every Orbax fixture layout (an item's `params`, and
  `MNT/.safetensors`, the whole item under its full key names);
- `X.safetensors.d/`, the Hugging Face sharded form (offered here by a small
  `-o safetensors_shard_size`): every shard file and the index;
- `DIR/.safetensors` of torch sources: a `torch.save` file and the real
  torch 2.11 distributed checkpoint.

Each is loaded with `safe_open(framework="numpy")` tensor by tensor and with
`safetensors.numpy.load_file` (a shard at a time for the sharded form), and
every tensor must equal the fixture's expected bytes, dtype and shape.
Orbax v1 (`checkpoint_layout = 'safetensors'`) loads the flat view and the
sharded folder to the same bytes.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import ckfs_util as U

pytestmark = pytest.mark.oracle

TORCH_FX = U.REPO / "tests" / "fixtures" / "generated" / "torch"
# safetensors dtype code -> the ckptfs / numpy dtype name
ST_DTYPES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16", "I32": "int32",
             "U32": "uint32", "I64": "int64", "U64": "uint64", "F16": "float16", "BF16": "bfloat16",
             "F32": "float32", "F64": "float64", "C64": "complex64"}


def want_of(expected, prefix=""):
    """{name in the view: (dtype, shape, bytes)} from fixtures/expected."""
    out = {}
    for key, e in expected.items():
        if key.startswith(prefix):
            out[key[len(prefix):]] = (e.dtype, tuple(e.shape), e.data)
    return out


def assert_loads(path, want):
    """path: one safetensors file of the mount; want: {name: (dtype, shape, bytes)}."""
    import ml_dtypes  # noqa: F401  (gives numpy bfloat16, as a user's loader does)
    from safetensors import safe_open
    from safetensors.numpy import load_file
    with safe_open(str(path), framework="numpy") as f:
        names = sorted(f.keys())
        assert names == sorted(want), sorted(set(names) ^ set(want))
        for k in names:
            t = f.get_tensor(k)
            assert (str(t.dtype), tuple(t.shape)) == want[k][:2], k
            assert np.ascontiguousarray(t).tobytes() == want[k][2], f"{path}: {k} (safe_open)"
    whole = load_file(str(path))
    assert sorted(whole) == sorted(want)
    for k, t in whole.items():
        assert np.ascontiguousarray(t).tobytes() == want[k][2], f"{path}: {k} (load_file)"


def orbax_v1_load(path):
    """{name: (dtype, shape, sha256)} as Orbax v1's safetensors layout loads path."""
    code = r"""
import hashlib, json, sys
import jax
from orbax.checkpoint.experimental import v1
ctx = v1.Context(checkpoint_layout="safetensors")
with ctx:
    tree = v1.load(sys.argv[1])
out = {}
for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    key = ".".join(str(getattr(k, "key", k)) for k in path)
    import numpy as np
    a = np.asarray(leaf)
    out[key] = [str(a.dtype), list(a.shape), hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()]
json.dump(out, sys.stdout)
"""
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_ENABLE_X64="1")
    p = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=300,
                       env=env)
    assert p.returncode == 0, p.stderr[-4000:]
    return {k: (d, tuple(s), h) for k, (d, s, h) in json.loads(p.stdout).items()}


def assert_orbax_loads(path, want):
    import hashlib
    got = orbax_v1_load(path)
    assert sorted(got) == sorted(want), sorted(set(got) ^ set(want))
    for k, (dt, shape, data) in want.items():
        assert got[k] == (dt, shape, hashlib.sha256(data).hexdigest()), f"{path}: {k} (Orbax v1)"


@pytest.mark.parametrize("layout", ["pytree_zarr2", "pytree_zarr3", "std_ocdbt_zarr3", "pytree_ocdbt_zarr2"])
def test_flat_views(layout, mount, expected):
    m = mount(U.FIXTURES / layout)
    assert_loads(m.p("params.safetensors"), want_of(expected, "params."))
    assert_loads(m.p(".safetensors"), want_of(expected))


def test_flat_view_in_orbax_v1(mount, expected):
    m = mount(U.FIXTURES / "manager")
    assert_orbax_loads(m.p("20/state/params.safetensors"), want_of(expected, "params."))


def test_sharded_view(mount, expected):
    m = mount(U.FIXTURES / "manager", "safetensors_shard_size=10K")
    d = Path(m.p("20/state/params.safetensors.d"))
    index = json.loads((d / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in d.iterdir() if p.name.endswith(".safetensors"))
    assert len(shards) > 1, shards
    assert sorted(set(index["weight_map"].values())) == shards
    want = want_of(expected, "params.")
    assert sorted(index["weight_map"]) == sorted(want)
    for fn in shards:
        part = {k: v for k, v in want.items() if index["weight_map"][k] == fn}
        assert_loads(d / fn, part)
    assert_orbax_loads(d, want)


def torch_want(name):
    """{tensor name: (dtype, shape, bytes)} of a torch.save fixture, as the view
    holds it: tensors with a safetensors dtype (complex128 has none and is
    left out)."""
    exp = json.loads((TORCH_FX / "expected.json").read_text())[name]
    out = {}
    for k, e in exp.items():
        if e["dtype"] in ST_DTYPES.values():
            out[k] = (e["dtype"], tuple(e["shape"]), (TORCH_FX / "expected" / e["file"]).read_bytes())
    return out


def test_torch_save_file_view(mount):
    m = mount(TORCH_FX / "state.pt")
    assert_loads(m.p(".safetensors"), torch_want("state.pt"))


def test_torch_distributed_checkpoint_view(mount, expected):
    m = mount(U.FIXTURES / "torch_dcp")
    assert_loads(m.p(".safetensors"), want_of(expected))
