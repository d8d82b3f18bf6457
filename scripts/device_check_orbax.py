#!/usr/bin/env python3
"""Restore a checkpoint that ckptfs wrote with the real orbax-checkpoint and
compare every array with the values that were written.

Run where orbax-checkpoint, TensorStore and JAX are installed (not on the
development machines, which have no PyPI).  Typical use, from the repo root:

    SRC=$(mktemp -d); MNT=$(mktemp -d)
    build/ckptfs -f -o ready_fd=3 "$SRC" "$MNT" 3>&1 &      # a CheckpointManager root
    python3 scripts/device_check_orbax.py --mount "$MNT" --root "$SRC" --step 30
    fusermount3 -u "$MNT"

The script writes step 30 through the mount (item `state`, the pytree of the
fixtures: bf16/f32/int32 arrays of several ranks, a 0-d scalar, list
indices), commits it by creating commit_success.txt, then restores
SRC/30/state with
  - ocp.PyTreeCheckpointer().restore(path)                (numpy restore),
  - ocp.StandardCheckpointer().restore(path, target)      (abstract target,
    single-device sharding), and
  - ocp.StandardCheckpointer().restore(path, target)      with a
    NamedSharding over every local device where shapes allow,
and prints one line per check and a final "N passed, N failed" line.
Exit status 1 when anything differs.
"""
import argparse
import os
import sys

import numpy as np


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


def write_through_mount(mnt, step, tree):
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
    open(os.path.join(base, "commit_success.txt"), "w").close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mount", required=True, help="ckptfs mount of a CheckpointManager root")
    ap.add_argument("--root", required=True, help="the SOURCE folder of that mount")
    ap.add_argument("--step", default="30")
    args = ap.parse_args()

    import jax
    import jax.numpy as jnp
    import ml_dtypes
    import orbax.checkpoint as ocp

    tree = build_tree(np.random.default_rng(0))
    write_through_mount(args.mount, args.step, tree)
    path = os.path.abspath(os.path.join(args.root, args.step, "state"))
    passed = failed = 0

    def check(label, got, dtype, want):
        nonlocal passed, failed
        got = np.asarray(got)
        if dtype == "bfloat16":
            ok = got.dtype == ml_dtypes.bfloat16 and np.array_equal(got.view(np.uint16), want)
        else:
            ok = got.dtype == np.dtype(dtype) and np.array_equal(got, want)
        print(("ok   " if ok else "FAIL ") + label)
        if ok:
            passed += 1
        else:
            failed += 1

    def compare(tag, restored):
        for p, (dtype, want) in leaves(tree):
            node = restored
            for k in p:
                node = node[int(k)] if isinstance(node, (list, tuple)) else node[k]
            check(f"{tag} {'.'.join(p)}", node, dtype, want)

    compare("PyTreeCheckpointer", ocp.PyTreeCheckpointer().restore(path))

    def abstract(sharding_for):
        out = {}

        def conv(p, dtype, arr):
            dt = jnp.bfloat16 if dtype == "bfloat16" else arr.dtype
            return jax.ShapeDtypeStruct(arr.shape, dt, sharding=sharding_for(arr.shape))

        def rebuild(t, p=()):
            if isinstance(t, tuple):
                return conv(p, *t)
            if isinstance(t, dict):
                return {k: rebuild(v, p + (k,)) for k, v in t.items()}
            return [rebuild(v, p + (str(i),)) for i, v in enumerate(t)]

        out = rebuild(tree)
        return out

    dev = jax.devices()[0]
    single = jax.sharding.SingleDeviceSharding(dev)
    compare("StandardCheckpointer(single)", ocp.StandardCheckpointer().restore(path, abstract(lambda s: single)))

    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("x",))
    n = len(jax.devices())

    def named(shape):
        if shape and shape[0] % n == 0:
            return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
        return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

    compare(f"StandardCheckpointer(named, {n} devices)",
            ocp.StandardCheckpointer().restore(path, abstract(named)))
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
