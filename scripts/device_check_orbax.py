#!/usr/bin/env python3
"""Restore a checkpoint that ckptfs wrote with the real orbax-checkpoint and
compare every array with the values that were written.

Run where orbax-checkpoint, TensorStore and JAX are installed (not on the
development machines, which have no PyPI), with the self-contained ckptfs
(scripts/bundle; scripts/device_run.sh unpacks it and runs every device check):

    python3 scripts/device_check_orbax.py [--ckptfs BUNDLE/bin/ckptfs]

mounts a fresh empty folder (a CheckpointManager root) with that ckptfs
(default: $CKPTFS, else the newest bundle under build*/bundle/) and unmounts
it at the end.  Or against a mount made by hand:

    python3 scripts/device_check_orbax.py --mount "$MNT" --root "$SRC" --step 30

--dry-run writes and commits the step through the mount and skips the
restores (no JAX or Orbax needed).

The script writes step 30 through the mount (item `state`, the pytree of the
fixtures: bf16/f32/int32 arrays of several ranks, a 0-d scalar, list
indices, plus a JSON item `metadata`), commits it by creating
commit_success.txt, then restores it
  - without a target:  ocp.PyTreeCheckpointer().restore(SRC/30/state) and
    ocp.CheckpointManager(SRC).restore(30) (every item, by item_handlers;
    needs a _sharding entry for every array),
  - with a target:     ocp.StandardCheckpointer().restore(path, abstract) with
    single-device shardings, and again with a NamedSharding over every local
    device where the shape allows,
  - partially:         ocp.PyTreeCheckpointer().restore(path,
    args=PyTreeRestore(item={'params': ...}, partial_restore=True)), which
    must return params only,
and compares every value, dtype and shape, and the set of leaves, with what
was written.  It prints one line per check and a final "N passed, N failed"
line; exit status 1 when anything differs, 2 when JAX or Orbax is missing.
"""
import argparse
import importlib
import json
import os
import shutil
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import device_common as D  # noqa: E402


def build_tree(rng):
    bf16 = rng.standard_normal((64, 32)).astype(np.float32)
    bf16_bits = (bf16.view(np.uint32) >> 16).astype(np.uint16)  # truncated bf16 patterns
    return {
        "params": {
            "embed": {"embedding": ("bfloat16", bf16_bits)},
            "layer_0": {
                "attn": {"q_proj": ("float32", rng.standard_normal((32, 48)).astype(np.float32))},
                "mlp": {"b1": ("float32", rng.standard_normal((128,)).astype(np.float32))},
            },
            "layers": [("float32", rng.standard_normal((8, 8)).astype(np.float32)),
                       ("float32", rng.standard_normal((8, 8)).astype(np.float32))],
        },
        "opt_state": {"count": ("int32", np.array(7, dtype=np.int32))},
        "step": ("int32", np.array(30, dtype=np.int32)),
    }


def leaves(tree, path=()):
    if isinstance(tree, tuple):
        yield path, tree
    elif isinstance(tree, dict):
        for k, v in tree.items():
            yield from leaves(v, path + (k,))
    else:
        for i, v in enumerate(tree):
            yield from leaves(v, path + (str(i),))


def write_through_mount(mnt, step, tree, commit=True):
    base = os.path.join(mnt, step)
    os.mkdir(base)
    os.mkdir(os.path.join(base, "state"))
    for path, (dtype, arr) in leaves(tree):
        d = os.path.join(base, "state", *path[:-1])
        os.makedirs(d, exist_ok=True)
        f = os.path.join(d, path[-1] + ".npy")
        if dtype == "bfloat16":
            # '<V2' is what np.save writes for ml_dtypes bfloat16; ckptfs reads it as bfloat16.
            np.save(f, arr.view(np.dtype("V2")))
        else:
            np.save(f, arr)
    if commit:
        open(os.path.join(base, "commit_success.txt"), "w").close()


def flatten(tree, path=()):
    """{path tuple of str: leaf} of a restored tree (dicts, lists, tuples)."""
    out = {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.update(flatten(v, path + (str(k),)))
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            out.update(flatten(v, path + (str(i),)))
    else:
        out[path] = tree
    return out


def write_json_item(mnt, step, doc):
    d = os.path.join(mnt, step, "metadata")
    os.mkdir(d)
    with open(os.path.join(d, "metadata"), "w") as f:
        json.dump(doc, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mount", help="a ckptfs mount of a CheckpointManager root (default: mount a fresh "
                    "empty folder with --ckptfs)")
    ap.add_argument("--root", help="the SOURCE folder of --mount")
    ap.add_argument("--ckptfs", help="ckptfs binary (default: $CKPTFS, else the newest bundle under build*/bundle)")
    ap.add_argument("--work", default=tempfile.gettempdir(), help="where the fresh root is made")
    ap.add_argument("--step", default="30")
    ap.add_argument("--dry-run", action="store_true", help="write and commit only; no JAX, no Orbax")
    args = ap.parse_args()
    D.exit_on_sigterm()
    if bool(args.mount) != bool(args.root):
        ap.error("--mount and --root go together")

    if not args.dry_run:
        try:
            for name in ("jax", "ml_dtypes", "orbax.checkpoint"):
                importlib.import_module(name)
        except ImportError as e:
            print(f"JAX, ml_dtypes and orbax-checkpoint are needed: {e}")
            return 2
    if args.mount:
        return run(args)
    binary = D.announce_ckptfs(args.ckptfs)
    if binary is None:
        return 1
    args.root = tempfile.mkdtemp(prefix="ckptfs-orbax-root-", dir=args.work)
    log = os.path.join(args.work, f"ckptfs-orbax-check-{os.getpid()}.log")
    rc = 1
    try:
        with D.Mount(binary, args.root, log_path=log) as m:
            args.mount = m.mnt
            rc = run(args)
        return rc
    finally:
        shutil.rmtree(args.root, ignore_errors=True)
        if rc == 0:
            os.unlink(log)
        else:
            print(f"ckptfs log: {log}")


def run(args):
    tree = build_tree(np.random.default_rng(0))
    want = {p: v for p, v in leaves(tree)}
    meta_doc = {"step": int(args.step), "note": "written through ckptfs"}
    passed = failed = 0

    def report(ok, label, detail=""):
        nonlocal passed, failed
        print(("ok   " if ok else "FAIL ") + label + (f": {detail}" if detail and not ok else ""))
        if ok:
            passed += 1
        else:
            failed += 1
        return ok

    # Write the step: arrays, the JSON item, then the commit.
    base = os.path.join(args.mount, args.step)
    write_through_mount(args.mount, args.step, tree, commit=False)
    try:
        write_json_item(args.mount, args.step, meta_doc)
        have_json = report(True, "JSON item metadata/metadata written")
    except OSError as e:
        have_json = report(False, "JSON item metadata/metadata written", str(e))
        try:
            os.rmdir(os.path.join(base, "metadata"))  # an empty item would block the commit
        except OSError:
            pass
    open(os.path.join(base, "commit_success.txt"), "w").close()
    path = os.path.abspath(os.path.join(args.root, args.step, "state"))
    report(os.path.isfile(os.path.join(path, "_METADATA")), "the committed step is on SOURCE",
           str(sorted(os.listdir(args.root))))
    if args.dry_run:
        print(f"{passed} passed, {failed} failed (dry run: no restores)")
        return 1 if failed else 0

    import jax
    import jax.numpy as jnp
    import ml_dtypes
    import orbax.checkpoint as ocp

    def check_leaf(label, got, dtype, value):
        got = np.asarray(got)
        if dtype == "bfloat16":
            ok = got.dtype == ml_dtypes.bfloat16 and got.shape == value.shape and \
                np.array_equal(got.view(np.uint16), value)
        else:
            ok = got.dtype == np.dtype(dtype) and got.shape == value.shape and np.array_equal(got, value)
        report(ok, label, f"got {got.dtype} {got.shape}")

    def compare(tag, restored, only=None):
        """Every written leaf (under `only`, a top-level key) is restored
        with its dtype, shape and value, and nothing else is restored."""
        try:
            flat = flatten(restored)
        except Exception as e:  # noqa: BLE001
            report(False, f"{tag}: tree", repr(e))
            return
        exp = {p: v for p, v in want.items() if only is None or p[0] == only}
        report(set(flat) == set(exp), f"{tag}: leaf set",
               f"extra {sorted(set(flat) - set(exp))}, missing {sorted(set(exp) - set(flat))}")
        for p, (dtype, value) in exp.items():
            if p in flat:
                check_leaf(f"{tag} {'.'.join(p)}", flat[p], dtype, value)

    def attempt(tag, fn, *a, **kw):
        try:
            return fn(*a, **kw)
        except Exception as e:  # noqa: BLE001 - every failure is a FAIL line
            report(False, f"{tag}: restore", f"{type(e).__name__}: {e}")
            return None

    # 1. without a target
    r = attempt("PyTreeCheckpointer (no target)", ocp.PyTreeCheckpointer().restore, path)
    if r is not None:
        compare("PyTreeCheckpointer (no target)", r)
    mngr = attempt("CheckpointManager(root)", ocp.CheckpointManager, os.path.abspath(args.root))
    if mngr is not None:
        report(int(args.step) in mngr.all_steps(), "CheckpointManager lists the step", str(mngr.all_steps()))
        r = attempt("CheckpointManager.restore (no args)", mngr.restore, int(args.step))
        if r is not None:
            compare("CheckpointManager.restore state", r["state"])
            if have_json:
                report(dict(r["metadata"]) == meta_doc, "CheckpointManager.restore metadata", str(r["metadata"]))

    # 2. with a target
    def abstract(sharding_for, subtree=None):
        def rebuild(t):
            if isinstance(t, tuple):
                dtype, arr = t
                dt = jnp.bfloat16 if dtype == "bfloat16" else arr.dtype
                return jax.ShapeDtypeStruct(arr.shape, dt, sharding=sharding_for(arr.shape))
            if isinstance(t, dict):
                return {k: rebuild(v) for k, v in t.items()}
            return [rebuild(v) for v in t]
        return rebuild(tree if subtree is None else subtree)

    dev = jax.devices()[0]
    single = jax.sharding.SingleDeviceSharding(dev)
    r = attempt("StandardCheckpointer (target, single device)", ocp.StandardCheckpointer().restore, path,
                abstract(lambda s: single))
    if r is not None:
        compare("StandardCheckpointer (target, single device)", r)

    n = len(jax.devices())
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("x",))

    def named(shape):
        if shape and shape[0] % n == 0:
            return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
        return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

    tag = f"StandardCheckpointer (target, named over {n} devices)"
    r = attempt(tag, ocp.StandardCheckpointer().restore, path, abstract(named))
    if r is not None:
        compare(tag, r)

    # 3. partially: params only
    target = {"params": abstract(lambda s: single, tree["params"])}
    restore_args = jax.tree_util.tree_map(lambda x: ocp.ArrayRestoreArgs(sharding=x.sharding), target)
    tag = "PyTreeCheckpointer (partial, params only)"
    r = attempt(tag, ocp.PyTreeCheckpointer().restore, path,
                args=ocp.args.PyTreeRestore(item=target, restore_args=restore_args, partial_restore=True))
    if r is not None:
        compare(tag, r, only="params")

    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
