"""Helpers of the oracle tests that restore with the real Orbax (imported
by test_oracle_*.py only: it needs the interpreter of scripts/oracle_env)."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402

jax.config.update("jax_enable_x64", True)


def orbax_restore(item):
    """{key path tuple: restored leaf} as Orbax restores the item."""
    with ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as ck:
        tree = ck.metadata(item).item_metadata.tree

        def ra(m):
            return ocp.RestoreArgs(restore_type=np.ndarray) if isinstance(m, ocp.metadata.ArrayMetadata) \
                else ocp.RestoreArgs()

        r = ck.restore(item, args=ocp.args.PyTreeRestore(restore_args=jax.tree.map(ra, tree)))
    out = {}
    for kp, v in jax.tree_util.tree_flatten_with_path(r)[0]:
        keys = tuple(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in kp)
        out[keys] = v
    return out
