"""One of two JAX processes (jax.distributed on localhost, 2 CPU devices
each) saving one CheckpointManager root together with the real Orbax:

    python oracle_orbax_procs.py ROOT PROCESS_ID PORT

Steps 0, 1, 2 of a (64, 16) float32 array sharded over the 4 devices of
both processes, max_to_keep=2 (step 0 is pruned by process 0), then step
2 restored and each process's shards compared.  Prints
{"process": I, "all_steps": [...], "restored": true}.
"""

import json
import os
import sys

root, pid, port = sys.argv[1], int(sys.argv[2]), sys.argv[3]
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=2, process_id=pid)
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402

mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(4), ("x",))
sh = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))


def tree(s):
    g = np.arange(64 * 16, dtype=np.float32).reshape(64, 16) + s
    return {"w": jax.make_array_from_callback(g.shape, sh, lambda idx: g[idx])}


mgr = ocp.CheckpointManager(root, options=ocp.CheckpointManagerOptions(max_to_keep=2))
for s in range(3):
    mgr.save(s, args=ocp.args.StandardSave(tree(s)))
mgr.wait_until_finished()
out = mgr.restore(2, args=ocp.args.StandardRestore(tree(2)))
ok = all(np.array_equal(np.asarray(x.data), np.asarray(y.data))
         for x, y in zip(out["w"].addressable_shards, tree(2)["w"].addressable_shards))
print(json.dumps({"process": pid, "all_steps": list(mgr.all_steps()), "restored": bool(ok)}))
mgr.close()
