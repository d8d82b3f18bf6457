"""Directory symlinks inside SOURCE do not fan out.

Folders that are not pytree items (a step's `metadata/`, JSON items) are
mirrored into the view at mount time.  Directory symlinks used to be
followed while mirroring, up to 16 levels deep: two symlinks to ancestors
multiplied the tree by two per level (a mount took 47 s and 3.55 GB with two
links to the step folder; a third link exhausted memory).  The rule now:
directory symlinks are never followed while mirroring (the tree is walked
through the store interface, which does not follow them).

The links here point at the step folder and at the mirrored folder itself,
which cost more than 45k nodes and 44 MB before the fix (kept small so that
a regression stays a short failure).  The test checks that the mount completes, that its tree
is the tree without the links plus at most the two link names (shown as
empty folders, symlinks, or left out), and that the daemon's peak resident
set (VmHWM) is within FANOUT_SLACK of a mount of the same SOURCE without
the links.  No wall-clock assertions.
"""

import os
import shutil

import pytest

import ckfs_util as U

MiB = 1 << 20
FANOUT_SLACK = 8 * MiB
WALK_CAP = 5000          # stop walking a runaway tree here


def bounded_walk(top, cap=WALK_CAP):
    """Relative paths under top (no symlinks followed), at most cap+1."""
    out = []
    stack = [top]
    while stack and len(out) <= cap:
        d = stack.pop()
        for e in os.scandir(d):
            out.append(os.path.relpath(e.path, top))
            if e.is_dir(follow_symlinks=False):
                stack.append(e.path)
            if len(out) > cap:
                break
    return out


@pytest.fixture
def roots(tmp_path):
    """(plain, linked): two copies of the manager fixture's step 10; in the
    second, 10/metadata/ holds `up -> ..` (the step) and `self -> .`."""
    plain = tmp_path / "plain"
    linked = tmp_path / "linked"
    for r in (plain, linked):
        r.mkdir()
        shutil.copytree(U.FIXTURES / "manager" / "10", r / "10")
    assert (linked / "10" / "metadata").is_dir()
    os.symlink("..", linked / "10" / "metadata" / "up")
    os.symlink(".", linked / "10" / "metadata" / "self")
    return plain, linked


def mount_figures(mount, src):
    m = mount(src)
    names = bounded_walk(m.p())
    hwm = U.vm(m.pid)
    return m, names, hwm


def test_two_symlinks_to_ancestors(roots, mount):
    plain, linked = roots
    mp, names_plain, hwm_plain = mount_figures(mount, plain)
    ml, names_linked, hwm_linked = mount_figures(mount, linked)
    grew = hwm_linked - hwm_plain
    assert len(names_linked) <= WALK_CAP, \
        f"the mount shows more than {WALK_CAP} entries (fan-out); the links cost {grew / MiB:.1f} MiB"
    extra = set(names_linked) - set(names_plain)
    assert extra <= {"10/metadata/up", "10/metadata/self"}, f"unexpected entries: {sorted(extra)[:10]}"
    assert set(names_plain) <= set(names_linked), "links made entries disappear"
    for n in ("up", "self"):
        p = ml.p("10/metadata/" + n)
        if os.path.lexists(p) and os.path.isdir(p) and not os.path.islink(p):
            assert os.listdir(p) == [], f"{p} shows the linked folder's contents"
    # the arrays still read
    a = U.read_all(ml.p("10/state/params/layer_0/mlp/w1.npy"))
    assert a == U.read_all(mp.p("10/state/params/layer_0/mlp/w1.npy"))
    if U.sanitized():
        return
    assert grew <= FANOUT_SLACK, f"the links cost {grew / MiB:.1f} MiB of daemon memory (slack 8 MiB)"


def test_symlink_to_a_file_outside_a_mirrored_folder_is_not_a_directory(roots, mount):
    """Whatever is done with file symlinks, a link never makes the
    mirrored folder's own files disappear or change."""
    plain, linked = roots
    mp = mount(plain)
    want = {n: U.read_all(mp.p("10/metadata/" + n)) for n in os.listdir(mp.p("10/metadata"))}
    mp.unmount()
    os.symlink("../_CHECKPOINT_METADATA", plain / "10" / "metadata" / "cm")
    m = mount(plain)
    for n, data in want.items():
        assert U.read_all(m.p("10/metadata/" + n)) == data, n


MIRROR_CAP = 10000       # lib/tree/layout.c: nodes mirrored for one non-pytree item


def test_mirrored_item_is_capped(tmp_path, mount):
    """A non-pytree folder with more entries than MIRROR_CAP is shown up to
    the cap (with a log line), never walked whole."""
    root = tmp_path / "root"
    root.mkdir()
    shutil.copytree(U.FIXTURES / "manager" / "10", root / "10")
    extra = root / "10" / "metadata" / "many"
    extra.mkdir()
    for i in range(MIRROR_CAP + 50):
        (extra / f"f{i:05d}").write_bytes(b"x")
    m = mount(root)
    shown = bounded_walk(m.p("10/metadata"), cap=2 * MIRROR_CAP)
    assert len(shown) == MIRROR_CAP, f"{len(shown)} entries mirrored, cap {MIRROR_CAP}"
    assert "the rest are not shown" in m.log()
