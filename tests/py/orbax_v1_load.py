"""Load a checkpoint with Orbax's v1 API on 8 CPU devices and save every leaf
to an .npz (keys: the leaf's key path joined by '/'; strings as UTF-8 bytes
under KEY + '.txt').  Run in a subprocess of its own, since the XLA device
count must be set before JAX starts:

    python orbax_v1_load.py PATH pytree|checkpointables OUT.npz
"""

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import numpy as np  # noqa: E402
from orbax.checkpoint.experimental import v1  # noqa: E402

jax.config.update("jax_enable_x64", True)


def main():
    path, kind, out = sys.argv[1:4]
    r = v1.load_pytree(path) if kind == "pytree" else v1.load_checkpointables(path)
    flat = {}
    for kp, v in jax.tree_util.tree_flatten_with_path(r)[0]:
        key = "/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in kp)
        if isinstance(v, str):
            flat[key + ".txt"] = np.frombuffer(v.encode(), np.uint8)
        else:
            flat[key + ".npy"] = np.asarray(v)
    np.savez(out, **flat)


if __name__ == "__main__":
    main()
