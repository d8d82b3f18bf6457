"""The Orbax side of scripts/bench row 8, run with the oracles' python
(scripts/oracle_env): the real Orbax saving and restoring one pytree.

    python bench_orbax_saves.py save ROOT STEP MIB     -> {"seconds": s, "bytes": n}
    python bench_orbax_saves.py restore ROOT STEP MIB  -> {"seconds": s, "bytes": n, "equal": true}

The tree: 8 float32 arrays of MIB/8 MiB each (a quarter random, the rest a
smooth ramp, so zstd has work either way) on one CPU device.  save times
CheckpointManager(ROOT).save + wait_until_finished (durable: Orbax's rename
of the step's tmp folder); restore times CheckpointManager(ROOT).restore of
STEP into numpy-backed jax arrays.
"""
import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402


def tree(mib):
    n = mib * (1 << 20) // 8 // 4
    rows = n // 1024
    r = np.random.default_rng(7)
    out = {}
    for i in range(8):
        a = np.linspace(0, 1, rows * 1024, dtype=np.float32).reshape(rows, 1024) + i
        a[: rows // 4] = r.standard_normal((rows // 4, 1024), dtype=np.float32)
        out[f"layer_{i}"] = {"w": a}
    return out


def main():
    what, root, step, mib = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    t = tree(mib)
    nbytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(t))
    mgr = ocp.CheckpointManager(root)
    if what == "save":
        t0 = time.monotonic()
        mgr.save(step, args=ocp.args.StandardSave(t))
        mgr.wait_until_finished()
        dt = time.monotonic() - t0
        print(json.dumps({"seconds": dt, "bytes": nbytes}))
    else:
        t0 = time.monotonic()
        got = mgr.restore(step, args=ocp.args.StandardRestore(t))
        dt = time.monotonic() - t0
        eq = all(np.array_equal(np.asarray(a), b)
                 for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(t)))
        print(json.dumps({"seconds": dt, "bytes": nbytes, "equal": bool(eq)}))
    mgr.close()


if __name__ == "__main__":
    main()
