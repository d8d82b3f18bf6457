"""An Orbax save replayed through a writable mount, without JAX
(tests/fixtures/orbax-replay/: the recorded system calls of a real
CheckpointManager saving two steps, pruning the first, restoring the
second; tests/py/orbax_replay.py replays them).

- Through the mount every call has the outcome it had on a local disk, the
  bytes read back are the recorded ones (read-after-write of staged files,
  restore through the mount), TensorStore's generations (inode, mtime ns,
  size) stay equal across fsync, rename and close, and a step appears only
  at the rename of its tmp folder.
- The backing root then holds exactly what the same replay leaves in a
  plain folder (Orbax's files, byte for byte, stored as written), no
  *.__lock and no tmp folder; a fresh mount shows step 2's arrays as a
  mount of the plain folder does.
- Killed (SIGKILL) at many points of the first save: no step and no tmp
  folder of a step becomes visible as a step, and after Orbax's own
  clean-up (rmtree of the stale tmp folder) the whole recorded run works.
"""

import multiprocessing
import os
import signal
from pathlib import Path

import pytest

import orbax_replay as R

FORK = multiprocessing.get_context("fork")
# also in the ThreadSanitizer run of scripts/test (it runs the tests marked concurrent)
pytestmark = pytest.mark.concurrent


def files_of(root):
    out = {}
    for d, _, fs in os.walk(root):
        for f in fs:
            p = Path(d) / f
            out[str(p.relative_to(root))] = p.read_bytes()
    return out


@pytest.fixture(scope="module")
def ops():
    return R.load()


@pytest.fixture(scope="module")
def plain(ops, tmp_path_factory):
    root = tmp_path_factory.mktemp("plain")
    assert R.replay(root, ops) == []
    return root


def test_replay_through_mount(mount, tmp_path, ops, plain):
    src = tmp_path / "src"
    src.mkdir()
    m = mount(src, "delete_steps")  # the recorded run prunes a step
    assert R.replay(m.p(), ops) == []
    assert sorted(os.listdir(m.p())) == ["2", "latest"]
    got, want = files_of(src), files_of(plain)
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k] == want[k], k
    assert not [k for k in got if k.endswith(".__lock") or ".orbax-checkpoint-tmp" in k]
    m.unmount()
    a, b = mount(src, "ro"), mount(plain, "ro")
    for rel in ("2/state/params/w.npy", "2/state/params/b.npy", "2/state/step.npy", "2/metadata/metadata"):
        assert a.p(rel).read_bytes() == b.p(rel).read_bytes(), rel


def _child(root, ops, k):
    R.replay(root, ops, stop_after=k)
    os.kill(os.getpid(), signal.SIGKILL)


def kill_points(ops):
    """Indexes of calls of the first save to die right after: spread over it,
    plus the first of each kind and the last calls before the commit."""
    commit = next(i for i, o in enumerate(ops) if o["op"] == "rename" and o["to"] == "1")
    pts = set(range(10, commit, max(1, commit // 12)))
    for kind in ("mkdir", "write", "lock", "fsync", "rename", "unlink"):
        pts.add(next(i for i, o in enumerate(ops) if o["op"] == kind))
    pts.update({commit - 3, commit - 2, commit - 1})
    return sorted(pts)


def test_kill_during_save(mount, tmp_path, ops):
    src = tmp_path / "src"
    src.mkdir()
    m = mount(src, "delete_steps")  # the recorded run prunes a step
    pts = kill_points(ops)
    assert len(pts) >= 10
    for k in pts:
        p = FORK.Process(target=_child, args=(m.p(), ops, k))
        p.start()
        p.join(60)
        assert p.exitcode == -signal.SIGKILL, (k, p.exitcode)
        names = os.listdir(m.p())
        assert not [n for n in names if n.isdigit()], (k, names)  # no step
        assert not [n for n in os.listdir(src) if n.isdigit()], k
        # Orbax's next save of the step: rmtree of its stale tmp folder first
        for n in names:
            R.shutil.rmtree(m.p(n))
        assert os.listdir(m.p()) == [], k
    assert R.replay(m.p(), ops) == []
    assert sorted(os.listdir(m.p())) == ["2", "latest"]
    assert not [n for n in os.listdir(src) if n != "2"]
