"""Names written through the mount.

The read side escapes pytree keys that are unsafe as file names
(docs/usage.md: '%' -> %25, '/' -> %2F, '.' -> %2E, '..' -> %2E%2E, the
empty key -> %).  A writer must get the inverse: the name a process creates
in a pending step is the name every reader sees after the commit, or the
create fails with EINVAL.  So copying a tree out of one step into a new step
keeps its keys, and no name is silently renamed (today `%2E.npy` written
reads back as `%252E.npy`).

Step names are names of folders in SOURCE that training jobs list and parse:
a step name with a control character is refused with EINVAL, and nothing is
left in SOURCE.
"""

import errno
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import ckfs_util as U
from ckfs_help import unsafe_key_item

TMP = ".orbax-checkpoint-tmp"


def commit(step_dir):
    open(Path(step_dir) / "commit_success.txt", "w").close()


# ---------------------------------------------------------------------------
# step names

# (no '[' in these: the name rules refuse it already, for being slice syntax)
CONTROL_NAMES = ["a\x01b", "line\nbreak", "tab\there", "esc\x1bc", "del\x7f", "cr\r"]


@pytest.mark.parametrize("name", CONTROL_NAMES, ids=[repr(n) for n in CONTROL_NAMES])
def test_step_name_with_control_character_refused(mount, tmp_path, name):
    src = tmp_path / "root"
    src.mkdir()
    m = mount(src)
    assert U.errno_of(os.mkdir, m.p(name)) == errno.EINVAL, f"mkdir {name!r} was not refused with EINVAL"
    assert name not in os.listdir(m.p())
    assert os.listdir(src) == [], f"the refused step left {os.listdir(src)} in SOURCE"
    # the mount is still usable: a plain step works
    os.mkdir(m.p("10"))
    os.mkdir(m.p("10/state"))
    np.save(m.p("10/state/a.npy"), np.arange(3, dtype=np.int32))
    commit(m.p("10"))
    assert sorted(os.listdir(src)) == ["10"]


def test_plain_step_names_accepted(mount, tmp_path):
    """The refusal is for control characters only: the names Orbax's step
    naming finds ("<number>", "<prefix>_<number>") keep working."""
    src = tmp_path / "root"
    src.mkdir()
    m = mount(src)
    names = ["10", "step_0030", "checkpoint_40", "ckpt 2_50", "run.a_60"]
    for n in names:
        os.mkdir(m.p(n))
        os.mkdir(m.p(n + "/state"))
        np.save(m.p(n + "/state/a.npy"), np.arange(3, dtype=np.int32))
        commit(m.p(n))
    assert sorted(os.listdir(src)) == sorted(names)
    assert sorted(os.listdir(m.p())) == sorted(names + ["latest"])
    assert os.readlink(m.p("latest")) == "run.a_60"  # the greatest number, as Orbax's latest_step


# ---------------------------------------------------------------------------
# array names: written name == read name (or EINVAL)

# (written file name, the pytree key it must stand for)
ROUNDTRIP = [
    ("100%25.npy", "100%"),
    ("we%2Fird.npy", "we/ird"),
    ("a%25b%2Fc.npy", "a%b/c"),
]
# names whose key cannot be a store folder of its own ('.', '..', ''), or
# that are not what the read side ever produces (a bare '%', a non-canonical
# escape): round trip or EINVAL, never a silent rename
ROUNDTRIP_OR_EINVAL = ["%2E.npy", "%2E%2E.npy", "%.npy", "50%.npy", "%41.npy", "%zz.npy", "%2e.npy"]


@pytest.mark.parametrize("name,key", ROUNDTRIP)
def test_escaped_name_round_trips(mount, tmp_path, name, key):
    src = tmp_path / "root"
    src.mkdir()
    m = mount(src)
    os.makedirs(m.p("20/state"))
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.save(m.p("20/state/" + name), a)
    assert name in os.listdir(m.p("20/state")), "the pending step does not list the written name"
    commit(m.p("20"))
    listed = sorted(os.listdir(m.p("20/state")))
    assert name in listed, f"{name} written, the committed step lists {listed}"
    assert np.array_equal(np.load(m.p("20/state/" + name)), a)
    meta = json.loads((src / "20" / "state" / "_METADATA").read_text())
    keys = [[k["key"] for k in v["key_metadata"]] for v in meta["tree_metadata"].values()]
    assert keys == [[key]], f"_METADATA keys {keys}, want [[{key!r}]]"
    # a fresh daemon agrees
    m.unmount()
    m2 = mount(src, "ro")
    assert name in os.listdir(m2.p("20/state"))
    assert np.array_equal(np.load(m2.p("20/state/" + name)), a)


@pytest.mark.parametrize("name", ROUNDTRIP_OR_EINVAL)
def test_unusual_name_round_trips_or_is_refused(mount, tmp_path, name):
    src = tmp_path / "root"
    src.mkdir()
    m = mount(src)
    os.makedirs(m.p("20/state"))
    np.save(m.p("20/state/keep.npy"), np.arange(2, dtype=np.int8))
    a = np.arange(6, dtype=np.int16)
    e = U.errno_of(np.save, m.p("20/state/" + name), a)
    assert e in (None, errno.EINVAL), f"create {name}: errno {e} (want success or EINVAL)"
    commit(m.p("20"))
    listed = sorted(os.listdir(m.p("20/state")))
    if e is None:
        assert name in listed, f"{name} written, the committed step lists {listed}"
        assert np.array_equal(np.load(m.p("20/state/" + name)), a)
    else:
        assert listed == ["_METADATA", "_sharding", "commit_success.txt", "keep.npy"], listed


def test_copy_tree_into_new_step_keeps_keys(mount, tmp_path, expected):
    """Step 10 holds keys '100%' and 'we/ird' (shown as 100%25.npy and
    we%2Fird.npy); copying its arrays file by file into a new step 20 gives
    the same names, the same bytes and the same pytree keys."""
    src = tmp_path / "root"
    src.mkdir()
    unsafe_key_item(src / "10")
    tree = json.loads((src / "10" / "_METADATA").read_text())["tree_metadata"]

    m = mount(src)
    assert "we%2Fird.npy" in os.listdir(m.p("10"))
    assert "100%25.npy" in os.listdir(m.p("10/opt_state"))
    os.makedirs(m.p("20/state"))
    copied = {}
    for d, dirs, files in os.walk(m.p("10")):
        rel = os.path.relpath(d, m.p("10"))
        for dn in dirs:
            os.mkdir(m.p("20/state") / rel / dn)
        for fn in files:
            if fn.endswith(".npy"):
                r = os.path.normpath(os.path.join(rel, fn))
                shutil.copyfile(os.path.join(d, fn), m.p("20/state") / r)
                copied[r] = U.read_all(os.path.join(d, fn))
    assert "we%2Fird.npy" in copied and "opt_state/100%25.npy" in copied
    commit(m.p("20"))
    got = {}
    for d, _dirs, files in os.walk(m.p("20/state")):
        rel = os.path.relpath(d, m.p("20/state"))
        for fn in files:
            if fn.endswith(".npy"):
                got[os.path.normpath(os.path.join(rel, fn))] = U.read_all(os.path.join(d, fn))
    assert sorted(got) == sorted(copied), f"names differ: {sorted(set(got) ^ set(copied))}"
    for r, data in copied.items():
        assert got[r] == data, f"{r}: bytes differ after the copy"
    keys_src = {tuple(k["key"] for k in v["key_metadata"]) for v in tree.values()}
    meta20 = json.loads((src / "20" / "state" / "_METADATA").read_text())["tree_metadata"]
    keys_dst = {tuple(k["key"] for k in v["key_metadata"]) for v in meta20.values()}
    assert keys_dst == keys_src, f"keys differ: {sorted(keys_dst ^ keys_src)}"
