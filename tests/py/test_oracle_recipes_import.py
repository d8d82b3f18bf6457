"""View recipes the other way (docs/recipes.md, "The other direction").

Each family's step is saved by the real Orbax (the tree builders of
test_oracle_recipes.py), its view folder copied out of a read-only mount
(`cp -r MNT/30/.views/NAME/ hf/`), then copied into a new pending step of a
writable root (`cp -r hf/ MNT/30/.views/NAME/`) and committed with `touch
MNT/30/commit_success.txt`.  Every array of the new step is compared with
the original step's, byte for byte, through the mount and through Orbax's
own restore of SOURCE/30; where the recipe scales by a number that is not
a power of two, the documented bound is checked instead (and that the new
step's view gives the imported folder's bytes again).  Refused recipes and
folders that do not fit (a missing tensor, a wrong shape, an unknown name,
tied weights that differ) fail with their errno and a log line, and leave
no step.
"""

import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

import ckfs_util as U
import test_oracle_recipes as R

pytestmark = pytest.mark.oracle

E, H, K, D, F, L, V = R.E, R.H, R.K, R.D, R.F, R.L, R.V


def run(cmd):
    p = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def npy_data(path):
    b = Path(path).read_bytes()
    n = struct.unpack("<H", b[8:10])[0]
    return b[10 + n:]


def arrays(step_dir):
    """{relative path: (dtype, shape, bytes)} of every array of a step
    folder of a mount."""
    out = {}
    for p in Path(step_dir).rglob("*.npy"):
        rel = str(p.relative_to(step_dir))
        out[rel] = (os.getxattr(p, "user.ckpt.dtype").decode(),
                    tuple(json.loads(os.getxattr(p, "user.ckpt.shape"))), npy_data(p))
    return out


def restore(root, step):
    """The items of SOURCE/step restored by Orbax: {key path: numpy array}."""
    import orbax.checkpoint as ocp
    mngr = ocp.CheckpointManager(str(root), item_names=("items",))
    got = mngr.restore(step, args=ocp.args.Composite(items=ocp.args.StandardRestore()))["items"]
    mngr.close()
    flat = {}

    def walk(t, pre):
        if isinstance(t, dict):
            for k, v in t.items():
                walk(v, pre + (str(k),))
        else:
            flat["/".join(pre)] = np.asarray(t)
    walk(got, ())
    return flat


def export(mount, tmp_path, state, recipe):
    """Save state as step 30, copy its view folder out: (root, folder)."""
    root = tmp_path / "src"
    R._save(root, 30, state)
    ro = mount(root, "ro")
    hf = tmp_path / "hf"
    rc, out = run(f"cp -r {ro.p('30/.views/' + recipe)}/ {hf}/")
    assert rc == 0, out
    return root, ro, hf


def import_(mount, tmp_path, hf, recipe, name="dst"):
    """A writable root, step 30 made by copying hf into .views/recipe/:
    (root, mount, exit code of the copy, of the commit)."""
    root = tmp_path / name
    root.mkdir()
    m = mount(root)
    os.mkdir(m.p("30"))
    rc, out = run(f"cp -r {hf}/ {m.p('30/.views/' + recipe)}/")
    if rc:
        return root, m, rc, out
    rc, out = run(f"touch {m.p('30/commit_success.txt')}")
    return root, m, rc, out


def ulps_bf16(a, b):
    """|a - b| in units in the last place of bfloat16 (raw bits, same sign)."""
    x = np.frombuffer(a, dtype=np.uint16).astype(np.int32)
    y = np.frombuffer(b, dtype=np.uint16).astype(np.int32)
    sx, sy = x >> 15, y >> 15
    mag = lambda v, s: np.where(s == 1, -(v & 0x7FFF), v & 0x7FFF)  # noqa: E731
    return np.abs(mag(x, sx) - mag(y, sy))


def assert_same_step(ro_src, root_dst, mount, inexact=()):
    """Every array of step 30 in both roots: same names, dtypes, shapes and
    bytes (through the mount and through Orbax's restore); names matching
    one of `inexact` within one unit in the last place."""
    fresh = mount(root_dst, "ro")
    want, got = arrays(ro_src.p("30")), arrays(fresh.p("30"))
    assert sorted(want) == sorted(got), sorted(set(want) ^ set(got))
    loose = 0
    for k, (dt, shape, data) in want.items():
        gdt, gshape, gdata = got[k]
        assert (dt, shape) == (gdt, gshape), k
        if any(s in k for s in inexact):
            assert dt == "bfloat16", k
            u = ulps_bf16(data, gdata)
            assert u.max() <= 1, (k, int(u.max()))
            loose += int((u > 0).sum())
        else:
            assert data == gdata, k
    ws, gs = restore(ro_src.source, 30), restore(root_dst, 30)
    assert sorted(ws) == sorted(gs)
    for k in ws:
        if not any(s.replace("/", ".") in k.replace("/", ".") for s in inexact):
            assert ws[k].tobytes() == gs[k].tobytes(), k
    return fresh, loose


def assert_no_step(m, root):
    assert not os.path.exists(m.p("30/commit_success.txt"))
    assert not (root / "30").exists()


def test_maxtext_llama_round_trip_exact(mount, tmp_path):
    """D = 16: the query scale sqrt(D) = 4 is a power of two, so every array
    comes back byte for byte, scan-stacked [E, L, H, D] kernels included."""
    p = R.maxtext_llama(np.random.default_rng(40), "bfloat16")
    src, ro, hf = export(mount, tmp_path, {"params": {"params": p}}, "maxtext-llama-hf")
    dst, m, rc, out = import_(mount, tmp_path, hf, "maxtext-llama-hf")
    assert rc == 0, out + m.log()
    assert_same_step(ro, dst, mount)
    assert "tensors imported as 12 arrays" in m.log()
    # the staged files are not part of the step
    assert not (dst / "30" / ".views").exists()
