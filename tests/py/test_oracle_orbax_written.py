"""Orbax -> ckptfs: every step the real orbax-checkpoint 0.12.8 wrote
(tests/fixtures/orbax-0.12.8, made by tests/fixtures/make_orbax_oracle.py)
read through a mount, byte for byte, against what Orbax itself restores.

For every Orbax item of a fixture (a folder with `_METADATA`) the test
restores the tree with Orbax (PyTreeCheckpointHandler, every array leaf as
np.ndarray, so no device layout is needed) and checks through the mount:

- the set of array files (`.npy`) and string files (`.txt`) of the item is
  exactly the set of the leaves Orbax restores;
- each `.npy` has Orbax's shape and data type (numpy's type string; `<Vn`
  for the ml_dtypes types) and the C-order bytes of the restored array;
- each string leaf reads as its text;
- JSON items (CheckpointManager's `metadata`) read as the JSON Orbax restores;
- a CheckpointManager root shows only the steps `max_to_keep` kept.
"""

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402

import ckfs_util as U  # noqa: E402
from orbax_oracle import orbax_restore  # noqa: E402

pytestmark = pytest.mark.oracle

jax.config.update("jax_enable_x64", True)

FIX = U.REPO / "tests" / "fixtures" / "orbax-0.12.8"

LAYOUTS = sorted(p.name for p in FIX.iterdir() if p.is_dir()) if FIX.is_dir() else []
ITEM_FILES = {"_METADATA", "_CHECKPOINT_METADATA", "_sharding", "commit_success.txt", "orbax.checkpoint"}


def items_of(src):
    """Relative paths (from src) of the Orbax pytree items under src (not
    those of a partial save never finalized, which Orbax does not read)."""
    return sorted(str(p.parent.relative_to(src)) if p.parent != src else "" for p in src.rglob("_METADATA")
                  if ".partial_save" not in str(p.relative_to(src)))


def npy_descr(a):
    """The type string ckptfs writes for an array of a's dtype."""
    if a.dtype.kind == "V" or type(a.dtype).__module__.startswith("ml_dtypes") or a.dtype.name in (
            "bfloat16",) or a.dtype.name.startswith(("float8", "float4", "int4", "int2", "uint4", "uint2")):
        return f"<V{a.dtype.itemsize}"
    return a.dtype.str


def mounted_leaves(root):
    """Relative paths of the .npy / .txt files under `root` in the mount."""
    out = set()
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            if f.endswith((".npy", ".txt")) and f not in ITEM_FILES:
                out.add(str(Path(dirpath, f).relative_to(root)))
    return out


def esc(key):
    """A key as a file name in the mount (docs/usage.md)."""
    if key in ("", ".", ".."):
        return {"": "%", ".": "%2E", "..": "%2E%2E"}[key]
    return key.replace("%", "%25").replace("/", "%2F").replace("\0", "%00")


def check_item(mnt_item, src_item):
    want = orbax_restore(src_item)
    assert want, f"{src_item}: Orbax restored nothing"
    names = {}
    for keys, v in want.items():
        ext = ".txt" if isinstance(v, str) else ".npy"
        names["/".join(esc(k) for k in keys) + ext] = v
    got = mounted_leaves(mnt_item)
    assert got == set(names), (f"{mnt_item}: the mount's leaves differ from Orbax's: "
                               f"only in the mount {sorted(got - set(names))}, "
                               f"only in Orbax {sorted(set(names) - got)}")
    for rel, v in names.items():
        p = mnt_item / rel
        raw = U.read_all(p)
        if isinstance(v, str):
            assert raw == v.encode(), f"{rel}: {raw!r} is not Orbax's string {v!r}"
            continue
        a = np.array(v, order="C", copy=True)  # (np.ascontiguousarray makes a 0-d array 1-d)
        _ver, hl, shape, fortran, _dt, head = U.parse_npy_header(raw[:4096])
        assert not fortran
        assert tuple(shape) == a.shape, f"{rel}: shape {shape}, Orbax restores {a.shape}"
        assert f"'descr': '{npy_descr(a)}'" in head, f"{rel}: header {head!r}, Orbax's dtype {a.dtype}"
        assert len(raw) - hl == a.nbytes, f"{rel}: {len(raw) - hl} data bytes, Orbax's array has {a.nbytes}"
        assert raw[hl:] == a.tobytes(), f"{rel}: bytes differ from Orbax's restore ({a.dtype}{a.shape})"
    return len(names)


# Items of one array (ArrayCheckpointHandler) have their own test.
PYTREE_LAYOUTS = [x for x in LAYOUTS if x != "extra_array_item"]


@pytest.mark.parametrize("layout", PYTREE_LAYOUTS)
def test_every_array_matches_orbax_restore(layout, mount):
    src = FIX / layout
    items = items_of(src)
    assert items, f"{layout}: no Orbax item"
    m = mount(src)
    n = 0
    for rel in items:
        n += check_item(m.p(rel) if rel else m.p(), src / rel if rel else src)
    assert n >= 2


def test_fixture_set_is_complete():
    """The generator's layouts are all here (a missing folder must fail)."""
    want = {f"pytree_{o}_{z}_{c}" for o in ("files", "ocdbt") for z in ("zarr2", "zarr3") for c in ("zstd", "raw")}
    want |= {"replica_folders", "split_ocdbt", "v1_pytree", "v1_checkpointables", "v1_partial", "manager",
             "multiprocess_ocdbt", "multiprocess_files", "tree_shapes_files", "tree_shapes_ocdbt",
             "chunked_files_zarr2", "chunked_files_zarr3", "chunked_ocdbt_zarr3", "extra_ocdbt_small_files",
             "extra_manager_prefix", "extra_array_item", "extra_prng_keys", "extra_aggregate", "extra_standard",
             "v1_root_unfinalized", "cast_zarr2", "cast_zarr3"}
    assert want <= set(LAYOUTS), sorted(want - set(LAYOUTS))


def all_steps(root, **kw):
    with ocp.CheckpointManager(root, options=ocp.CheckpointManagerOptions(read_only=True, **kw)) as mgr:
        return mgr.all_steps()


def test_manager_root_keeps_last_two_steps(mount):
    src = FIX / "manager"
    m = mount(src)
    assert sorted(os.listdir(m.p())) == sorted(str(s) for s in all_steps(src)) + ["latest"] == ["20", "30", "latest"]
    assert os.readlink(m.p("latest")) == "30"
    for step in ("20", "30"):
        with ocp.Checkpointer(ocp.JsonCheckpointHandler()) as ck:
            want = ck.restore(src / step / "metadata", args=ocp.args.JsonRestore())
        got = json.loads(U.read_all(m.p(f"{step}/metadata/metadata")))
        assert got == want == {"step": int(step), "model": "tiny"}


def test_array_item_matches_array_restore(mount):
    """ArrayCheckpointHandler's item (one array, key `checkpoint`)."""
    src = FIX / "extra_array_item"
    with ocp.Checkpointer(ocp.ArrayCheckpointHandler()) as ck:
        got = ck.restore(src, args=ocp.args.ArrayRestore(restore_args=ocp.RestoreArgs(restore_type=np.ndarray)))
        want = np.array(got, order="C")
    m = mount(src)
    assert sorted(f for f in os.listdir(m.p()) if f.endswith(".npy")) == ["checkpoint.npy"]
    raw = U.read_all(m.p("checkpoint.npy"))
    _v, hl, shape, _f, _d, _h = U.parse_npy_header(raw[:4096])
    assert tuple(shape) == want.shape == (16, 8)
    assert raw[hl:] == want.tobytes()


def test_manager_step_prefix_and_keep_period(mount):
    """step_prefix 'ckpt', 6 digits, max_to_keep=1 with keep_period=20:
    steps 20 (kept by the period) and 40 (the last)."""
    src = FIX / "extra_manager_prefix"
    m = mount(src)
    steps = all_steps(src, step_prefix="ckpt", step_format_fixed_length=6)
    assert sorted(os.listdir(m.p())) == [f"ckpt_{s:06d}" for s in sorted(steps)] + ["latest"] == [
        "ckpt_000020", "ckpt_000040", "latest"]
    assert os.readlink(m.p("latest")) == "ckpt_000040"


def test_unfinalized_partial_save_is_not_a_step(mount):
    """A partial save never finalized (`2.partial_save/`) is not a step for
    Orbax, nor in the mount."""
    src = FIX / "v1_root_unfinalized"
    assert any(p.name.startswith("2.partial_save") for p in src.iterdir())
    m = mount(src)
    assert sorted(os.listdir(m.p())) == [str(s) for s in all_steps(src)] + ["latest"] == ["1", "latest"]


V1_LAYOUTS = [("v1_pytree", "pytree", "state/"), ("v1_partial", "pytree", "state/"),
              ("v1_checkpointables", "checkpointables", "")]


@pytest.mark.parametrize("layout,kind,prefix", V1_LAYOUTS, ids=[x[0] for x in V1_LAYOUTS])
def test_v1_load_on_8_devices_matches(layout, kind, prefix, tmp_path, mount):
    """ocp.v1.load_pytree / load_checkpointables (on 8 CPU devices, with the
    shardings the checkpoint records, in a subprocess) against the mount."""
    import subprocess
    import sys
    out = tmp_path / "v1.npz"
    subprocess.run([sys.executable, str(U.REPO / "tests" / "py" / "orbax_v1_load.py"), str(FIX / layout), kind,
                    str(out)], check=True, timeout=600, stdout=subprocess.DEVNULL)
    with np.load(out) as z:
        want = {prefix + k: z[k] for k in z.files}
    assert len(want) >= 10
    m = mount(FIX / layout)
    for rel, w in want.items():
        raw = U.read_all(m.p(rel))
        if rel.endswith(".txt"):
            assert raw == w.tobytes(), rel
            continue
        _v, hl, shape, _f, _d, _h = U.parse_npy_header(raw[:4096])
        assert tuple(shape) == w.shape, rel
        assert raw[hl:] == np.array(w, order="C").tobytes(), f"{rel}: not what v1.load gives"


def _dtype_names():
    import ast
    src = (U.REPO / "tests" / "fixtures" / "make_orbax_oracle.py").read_text()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "DTYPES":
            return ast.literal_eval(node.value)
    raise AssertionError("DTYPES not found")


@pytest.mark.parametrize("layout", ["pytree_files_zarr2_zstd", "pytree_ocdbt_zarr3_zstd", "pytree_files_zarr3_raw"])
def test_dtypes_present(layout, mount):
    m = mount(FIX / layout)
    want = orbax_restore(FIX / layout)
    for kind in ("jax", "np", "scalar"):
        names = {f[:-4] for f in os.listdir(m.p(f"dtypes/{kind}"))}
        assert names == set(_dtype_names()), (layout, kind, set(_dtype_names()) ^ names)
        for n in names:
            # the type's name, as ckptfs tells it, is that of the array Orbax restores
            got = os.getxattr(m.p(f"dtypes/{kind}/{n}.npy"), "user.ckpt.dtype").decode()
            assert got == np.asarray(want[("dtypes", kind, n)]).dtype.name == n, (layout, kind, n, got)
