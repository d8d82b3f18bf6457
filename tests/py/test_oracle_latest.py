"""The root's `latest` symlink is no step for the real Orbax: through a
read-only mount, `CheckpointManager(MNT).all_steps()` and `latest_step()`
are what Orbax finds in SOURCE itself, and the link names that latest
step."""

import os

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import orbax.checkpoint as ocp  # noqa: E402

import ckfs_util as U  # noqa: E402

pytestmark = pytest.mark.oracle

FIX = U.REPO / "tests" / "fixtures" / "orbax-0.12.8"


def steps(root, **kw):
    with ocp.CheckpointManager(root, options=ocp.CheckpointManagerOptions(read_only=True, **kw)) as mgr:
        return mgr.all_steps(), mgr.latest_step()


@pytest.mark.parametrize("layout,kw,want", [
    ("manager", {}, ([20, 30], 30)),
    ("extra_manager_prefix", {"step_prefix": "ckpt", "step_format_fixed_length": 6}, ([20, 40], 40)),
])
def test_all_steps_through_the_mount_ignore_latest(mount, layout, kw, want):
    src = FIX / layout
    m = mount(src, "ro")
    names = os.listdir(m.p())
    assert "latest" in names
    all_src, latest_src = steps(src, **kw)
    all_mnt, latest_mnt = steps(m.p(), **kw)
    assert (sorted(all_mnt), latest_mnt) == (sorted(all_src), latest_src) == want
    assert sorted(n for n in names if n != "latest") == sorted(
        os.path.basename(str(p)) for p in (src.iterdir()) if p.is_dir() and p.name[-1].isdigit())
    target = os.readlink(m.p("latest"))
    assert target.endswith(str(latest_mnt)) and int(target.rsplit("_", 1)[-1]) == latest_mnt
    m.unmount()
