"""The real Orbax saving into, restoring from and pruning a CheckpointManager
root (a mount, or any folder): the writer of the oracle save tests, run as
a subprocess (its own JAX).

    python oracle_orbax_save.py ROOT save STEP... [--max-to-keep K]
    python oracle_orbax_save.py ROOT restore STEP... [--view MNT]

save: one CheckpointManager(ROOT, max_to_keep=K) saves tree(STEP) for each
STEP (async, Orbax's defaults: ATOMIC_RENAME, OCDBT; --commit-file:
COMMIT_FILE), waits, and prints
{"all_steps": [...]}.  restore: a fresh manager restores each STEP with
StandardRestore and checks every leaf byte for byte against tree(STEP);
with --view, also np.load of each leaf's NAME.npy in MNT/STEP/default (the
mount's view of the step).  Prints {"all_steps": [...], "restored": [...]}.
"""

import argparse
import json
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")


def tree(step):
    import jax
    import jax.numpy as jnp
    import ml_dtypes
    import numpy as np

    r = np.random.default_rng(1000 + step)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("x", "y"))
    sh = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x", "y"))
    w = jax.device_put(r.standard_normal((64, 48)).astype(np.float32), sh)
    emb = jax.device_put(r.standard_normal((32, 16)).astype(ml_dtypes.bfloat16), sh)
    return {"params": {"w": w, "embed": emb, "b": jnp.arange(48, dtype=jnp.int32) + step},
            "opt": {"mu": r.standard_normal((64, 48)).astype(np.float32), "count": np.arange(4, dtype=np.int64) * step}}


def leaves(t, prefix=""):
    for k, v in t.items():
        if isinstance(v, dict):
            yield from leaves(v, f"{prefix}{k}/")
        else:
            yield f"{prefix}{k}", v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("what", choices=["save", "restore"])
    ap.add_argument("steps", type=int, nargs="+")
    ap.add_argument("--max-to-keep", type=int, default=3)
    ap.add_argument("--view")
    ap.add_argument("--commit-file", action="store_true", help="AtomicityMode.COMMIT_FILE")
    a = ap.parse_args()
    import numpy as np
    import orbax.checkpoint as ocp

    kw = {}
    if a.commit_file:
        from orbax.checkpoint import options as oo
        kw["atomicity_options"] = oo.AtomicityOptions(mode=oo.AtomicityMode.COMMIT_FILE)
    if a.what == "save":
        mgr = ocp.CheckpointManager(a.root, options=ocp.CheckpointManagerOptions(max_to_keep=a.max_to_keep, **kw))
        for s in a.steps:
            mgr.save(s, args=ocp.args.StandardSave(tree(s)))
        mgr.wait_until_finished()
        print(json.dumps({"all_steps": list(mgr.all_steps())}))
        mgr.close()
        return
    mgr = ocp.CheckpointManager(a.root, options=ocp.CheckpointManagerOptions(**kw))
    done = []
    for s in a.steps:
        want = tree(s)
        got = mgr.restore(s, args=ocp.args.StandardRestore(want))
        g = dict(leaves(got))
        for k, v in leaves(want):
            x, y = np.asarray(g[k]), np.asarray(v)
            assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), (s, k)
            if a.view:
                z = np.load(os.path.join(a.view, str(s), "default", k + ".npy"))
                assert z.shape == y.shape and z.tobytes() == y.tobytes(), ("view", s, k)
        done.append(s)
    print(json.dumps({"all_steps": list(mgr.all_steps()), "restored": done}))
    mgr.close()


if __name__ == "__main__":
    sys.exit(main())
