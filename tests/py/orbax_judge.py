"""The real Orbax, TensorStore and zarr 3 reading a checkpoint: the judges of
the oracle tests (marker `oracle`), run as a subprocess so that each call
picks its own JAX device count.

    python orbax_judge.py ROOT STEP ITEM --api API --devices N

restores item ITEM of step STEP of the CheckpointManager root ROOT with the
real Orbax, then opens every array of the item with TensorStore (the spec
Orbax itself builds for it) and with zarr-python 3, and prints one JSON
object: {"api", "devices", "arrays": {"a/b/c": {"dtype", "shape", "sha256",
"devices", "spec", "ts_sha256", "zarr_sha256"}}}.  The sha256 is of the C-order
little-endian bytes (bfloat16 and float8 as their bit patterns).

API (how the restore is asked for, all with the abstract tree taken from the
checkpoint's own metadata):
  manager   CheckpointManager(ROOT).restore(STEP, Composite(ITEM=StandardRestore))
  standard  StandardCheckpointer().restore(ROOT/STEP/ITEM, abstract tree)
  pytree    PyTreeCheckpointer().restore(..., PyTreeRestore(restore_args=ArrayRestoreArgs))
  v1        orbax.checkpoint.experimental.v1.load(ROOT/STEP, checkpointable_name=ITEM)
  numpy     PyTreeRestore with RestoreArgs(restore_type=np.ndarray): no device at all

--devices N runs JAX on N CPU devices
(XLA_FLAGS=--xla_force_host_platform_device_count=N, set before JAX loads).
With N > 1 every array is restored with the sharding the item's `_sharding`
file records (Orbax's metadata gives it back); with N == 1 onto the one
device.
"""

import argparse
import hashlib
import json
import os
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("step", type=int)
    ap.add_argument("item")
    ap.add_argument("--api", default="manager", choices=["manager", "standard", "pytree", "v1", "numpy"])
    ap.add_argument("--devices", type=int, default=1)
    a = ap.parse_args()

    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={a.devices}"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    assert len(jax.devices()) == a.devices, jax.devices()
    item_dir = os.path.join(a.root, str(a.step), a.item)

    meta = ocp.PyTreeCheckpointer().metadata(item_dir)
    tree_meta = meta.item_metadata.tree if hasattr(meta, "item_metadata") else meta.tree

    def sharding_of(m):
        if a.devices == 1:
            return jax.sharding.SingleDeviceSharding(jax.devices()[0])
        sh = getattr(m, "sharding", None)
        if sh is None:
            raise SystemExit(f"no sharding recorded for {m.name}")
        return sh.to_jax_sharding()

    def abstract(m):
        if not hasattr(m, "shape"):  # a non-array leaf: restored as saved
            return None
        return jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=sharding_of(m))

    target = jax.tree_util.tree_map(abstract, tree_meta)

    if a.api == "manager":
        mgr = ocp.CheckpointManager(a.root, item_names=(a.item,))
        assert a.step in mgr.all_steps(), (a.step, mgr.all_steps())
        out = mgr.restore(a.step, args=ocp.args.Composite(**{a.item: ocp.args.StandardRestore(target)}))[a.item]
        mgr.close()
    elif a.api == "standard":
        out = ocp.StandardCheckpointer().restore(item_dir, target)
    elif a.api == "pytree":
        rargs = jax.tree_util.tree_map(
            lambda t: ocp.ArrayRestoreArgs(sharding=t.sharding, global_shape=t.shape, dtype=t.dtype), target)
        out = ocp.PyTreeCheckpointer().restore(item_dir, args=ocp.args.PyTreeRestore(target, restore_args=rargs))
    elif a.api == "numpy":
        rargs = jax.tree_util.tree_map(lambda t: ocp.RestoreArgs(restore_type=np.ndarray), target)
        out = ocp.PyTreeCheckpointer().restore(item_dir, args=ocp.args.PyTreeRestore(restore_args=rargs))
    else:
        from orbax.checkpoint.experimental import v1
        out = v1.load(os.path.join(a.root, str(a.step)), target, checkpointable_name=a.item)

    arrays = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(out)[0]:
        key = "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
        host = np.asarray(leaf)
        ent = {"dtype": str(host.dtype), "shape": list(host.shape),
               "sha256": hashlib.sha256(np.ascontiguousarray(host).tobytes()).hexdigest()}
        if isinstance(leaf, jax.Array):
            ent["devices"] = sorted(d.id for d in leaf.sharding.device_set)
            if a.devices > 1:
                # every shard on its device holds exactly its part of the global array
                for s in leaf.addressable_shards:
                    assert np.asarray(s.data).tobytes() == np.ascontiguousarray(host[s.index]).tobytes(), key
        arrays[key] = ent

    # TensorStore with Orbax's own spec, and zarr-python 3 where there is a folder
    import tensorstore as ts
    from orbax.checkpoint._src.serialization import tensorstore_utils as tsu
    use_ocdbt = os.path.exists(os.path.join(item_dir, "manifest.ocdbt"))
    ts_ctx = tsu.get_ts_context(use_ocdbt=use_ocdbt)
    with open(os.path.join(item_dir, "_METADATA")) as f:
        use_zarr3 = bool(json.load(f).get("use_zarr3", False))
    for path, m in jax.tree_util.tree_flatten_with_path(tree_meta)[0]:
        if not hasattr(m, "shape"):
            continue
        key = "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path)
        ent = arrays.setdefault(key, {})
        from etils import epath
        from orbax.checkpoint._src.serialization.types import ParamInfo
        info = ParamInfo(name=m.name, parent_dir=epath.Path(item_dir), is_ocdbt_checkpoint=use_ocdbt,
                         use_zarr3=use_zarr3)
        spec = tsu.get_json_tspec_read(info, use_ocdbt=use_ocdbt)
        ent["spec"] = spec
        arr = ts.open(spec, open=True, read=True, context=ts_ctx).result().read().result()
        ent["ts_sha256"] = hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()
        folder = os.path.join(item_dir, m.name)
        if not use_ocdbt and os.path.exists(os.path.join(folder, "zarr.json")):
            import zarr
            try:
                z = zarr.open_array(store=folder, mode="r")
            except ValueError as e:
                # zarr 3.1 registers no bfloat16 / float8 data type: it cannot
                # open such an array, whoever wrote it (Orbax's own included)
                if "No Zarr data type" not in str(e):
                    raise
                ent["zarr_sha256"] = None
            else:
                ent["zarr_sha256"] = hashlib.sha256(np.ascontiguousarray(z[...]).tobytes()).hexdigest()
    json.dump({"api": a.api, "devices": a.devices, "arrays": arrays}, sys.stdout, default=str)


if __name__ == "__main__":
    main()
