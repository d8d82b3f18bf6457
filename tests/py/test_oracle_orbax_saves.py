"""The real Orbax (0.12.8, JAX on CPU) saving straight through a writable
mount, with no Orbax option changed: CheckpointManager(MNT) saves, lists,
restores and prunes steps (max_to_keep) on a local root and on an s3://
root (s3rver), and a save killed with SIGKILL at many points leaves no step.

The saver and restorer is tests/py/oracle_orbax_save.py (a subprocess per
call).  After the saves: the mount and the backing root hold exactly the
kept steps; Orbax's files are stored as it wrote them (OCDBT, no *.__lock,
no tmp folder); Orbax restores every step through the mount (and the mount
shows each array as NAME.npy with the same bytes), and again from the
backing root (or the bucket's objects) without the mount.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import ckfs_util as U

sys.path.insert(0, str(U.REPO / "tests" / "s3"))
import s3env  # noqa: E402

pytestmark = pytest.mark.oracle

SAVER = Path(__file__).with_name("oracle_orbax_save.py")
ENV = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3", PYTHONDONTWRITEBYTECODE="1")


def orbax(root, what, *steps, view=None, prefix=(), commit_file=False):
    cmd = [*prefix, sys.executable, str(SAVER), str(root), what, *map(str, steps)]
    if view:
        cmd += ["--view", str(view)]
    if commit_file:
        cmd += ["--commit-file"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV)
    return p


def ok(p):
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def stored_names(root):
    return sorted(str(p.relative_to(root)) for p in Path(root).rglob("*"))


def check_backing(src, steps):
    assert sorted(os.listdir(src)) == sorted(map(str, steps))
    names = stored_names(src)
    assert not [n for n in names if n.endswith(".__lock") or ".orbax-checkpoint-tmp" in n], names
    for s in steps:
        for f in ("_CHECKPOINT_METADATA", "commit_success.txt", "default/_METADATA", "default/_sharding",
                  "default/manifest.ocdbt", "default/commit_success.txt", "default/ocdbt.process_0/manifest.ocdbt"):
            assert f"{s}/{f}" in names, (s, f)


def test_local_root_saves_restores_prunes(mount, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    m = mount(src, "delete_steps")  # Orbax's max_to_keep deletes steps
    assert ok(orbax(m.p(), "save", 0, 1, 2, 3, 4))["all_steps"] == [2, 3, 4]
    assert sorted(os.listdir(m.p())) == ["2", "3", "4", "latest"]
    check_backing(src, [2, 3, 4])
    r = ok(orbax(m.p(), "restore", 2, 3, 4, view=m.p()))
    assert r == {"all_steps": [2, 3, 4], "restored": [2, 3, 4]}
    # a later save through the same mount prunes again
    assert ok(orbax(m.p(), "save", 5))["all_steps"] == [3, 4, 5]
    check_backing(src, [3, 4, 5])
    m.unmount()
    # Orbax restores the backing root without the mount
    assert ok(orbax(src, "restore", 3, 4, 5))["restored"] == [3, 4, 5]


def test_local_root_commit_file_mode(mount, tmp_path):
    """Orbax's COMMIT_FILE mode: no renames, the step's commit_success.txt
    (written last) commits."""
    src = tmp_path / "src"
    src.mkdir()
    m = mount(src, "delete_steps")  # Orbax's max_to_keep deletes steps
    assert ok(orbax(m.p(), "save", 0, 1, 2, 3, 4, commit_file=True))["all_steps"] == [2, 3, 4]
    assert sorted(os.listdir(m.p())) == ["2", "3", "4", "latest"]
    check_backing(src, [2, 3, 4])
    assert ok(orbax(m.p(), "restore", 2, 3, 4, view=m.p(), commit_file=True))["restored"] == [2, 3, 4]
    assert "an Orbax save" in m.log()
    m.unmount()
    assert ok(orbax(src, "restore", 2, 3, 4, commit_file=True))["restored"] == [2, 3, 4]


def _keys(env, prefix):
    c = env.client()
    out = []
    for page in c.get_paginator("list_objects_v2").paginate(Bucket=s3env.BUCKET, Prefix=prefix):
        out += [o["Key"] for o in page.get("Contents", [])]
    return out


@pytest.mark.skipif(bool(s3env.available()), reason=s3env.available())
def test_s3_root_saves_restores_prunes(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "S3RVER")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "S3RVER")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with s3env.S3Env(tmp_path / "s3") as env:
        def s3mount(n):
            m = U.Mount("placeholder", tmp_path / f"m{n}", tmp_path / f"m{n}.log",
                        options=[f"endpoint={env.endpoint}", "delete_steps"])
            m.source = f"s3://{s3env.BUCKET}/run"
            m.start()
            return m
        m = s3mount(0)
        try:
            assert ok(orbax(m.p(), "save", 0, 1, 2, 3, 4))["all_steps"] == [2, 3, 4]
            keys = _keys(env, "run/")
            assert sorted({k.split("/")[1] for k in keys}) == ["2", "3", "4"], keys
            assert not [k for k in keys if k.endswith(".__lock") or ".orbax-checkpoint-tmp" in k], keys
            for s in (2, 3, 4):
                assert f"run/{s}/commit_success.txt" in keys and f"run/{s}/default/manifest.ocdbt" in keys
            assert ok(orbax(m.p(), "restore", 2, 3, 4, view=m.p()))["restored"] == [2, 3, 4]
        finally:
            m.unmount()
        # a fresh mount restores from the bucket; the objects as files restore without ckptfs
        m = s3mount(1)
        try:
            assert ok(orbax(m.p(), "restore", 2, 3, 4))["restored"] == [2, 3, 4]
        finally:
            m.unmount()
        local = tmp_path / "fetched"
        c = env.client()
        for k in _keys(env, "run/"):
            dst = local / k[len("run/"):]
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(c.get_object(Bucket=s3env.BUCKET, Key=k)["Body"].read())
        assert ok(orbax(local, "restore", 2, 3, 4))["restored"] == [2, 3, 4]


# (call, n): the save is killed on entry to the process's n-th call of that
# kind (all threads counted together), before the call runs; (call, NAME):
# on the first such call whose destination's last name is NAME.  For this
# tree Orbax 0.12.8 makes 6 mkdir (the step's tmp folder, the item's,
# array_metadatas, TensorStore's database folders), 22 to 26 fsync
# (TensorStore: every file and its folder), 8 or 9 rename (TensorStore's
# lock files over the manifests, whose number its batching moves, then the
# item folder and the step folder: the commit) and 4 unlink (before
# writing array metadata, _METADATA and each commit_success.txt).  Every
# point below is within every run's counts, so every one is a kill.
KILL_POINTS = [("mkdir", 1), ("mkdir", 2), ("mkdir", 3), ("mkdir", 5), ("fsync", 1), ("fsync", 4),
               ("fsync", 8), ("fsync", 12), ("rename", 1), ("rename", 2), ("rename", 3), ("rename", "default"),
               ("rename", "7"), ("unlink", 1), ("unlink", 2), ("unlink", 3), ("unlink", 4)]


@pytest.fixture(scope="module")
def killat(tmp_path_factory):
    """tests/py/killat.c built as an LD_PRELOAD shim (see its opening)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    so = tmp_path_factory.mktemp("killat") / "killat.so"
    subprocess.run([cc, "-O1", "-shared", "-fPIC", "-o", str(so), str(Path(__file__).with_name("killat.c")),
                    "-ldl"], check=True)
    return so


def killed_save(root, step, killat, call, at):
    env = dict(ENV, LD_PRELOAD=str(killat), KILLAT_CALL=call)
    env["KILLAT_DST" if isinstance(at, str) else "KILLAT_N"] = str(at)
    cmd = [sys.executable, str(SAVER), str(root), "save", str(step)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)


def test_sigkill_at_points_of_a_save_leaves_no_step(mount, tmp_path, killat):
    src = tmp_path / "src"
    src.mkdir()
    m = mount(src, "delete_steps")  # Orbax's max_to_keep deletes steps
    for call, at in KILL_POINTS:
        p = killed_save(m.p(), 7, killat, call, at)
        # a run that never reached the point would be a whole save: a failure
        assert p.returncode == -9, (call, at, p.returncode, p.stdout[-500:], p.stderr[-2000:])
        # no step, and nothing of one under a step's name, in the mount or on disk
        assert not [x for x in os.listdir(m.p()) if x.isdigit()], (call, at)
        assert not [x for x in os.listdir(src) if x.isdigit()], (call, at)
        # the next save of the same step works (Orbax removes its stale tmp folder)
        assert ok(orbax(m.p(), "save", 7))["all_steps"] == [7], (call, at)
        shutil.rmtree(m.p("7"))  # through the mount: the step is deleted
        assert not [x for x in os.listdir(src) if x.isdigit()], (call, at)
    assert ok(orbax(m.p(), "save", 7))["all_steps"] == [7]
    assert ok(orbax(m.p(), "restore", 7))["restored"] == [7]
    assert os.listdir(src) == ["7"]


def test_two_jax_processes_save_through_one_mount(mount, tmp_path):
    import socket
    src = tmp_path / "src"
    src.mkdir()
    m = mount(src, "delete_steps")  # Orbax's max_to_keep deletes steps
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    helper = Path(__file__).with_name("oracle_orbax_procs.py")
    procs = [subprocess.Popen([sys.executable, str(helper), str(m.p()), str(i), str(port)], env=ENV,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in (0, 1)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-4000:]
        r = json.loads(out.strip().splitlines()[-1])
        assert r["all_steps"] == [1, 2] and r["restored"], r
    assert sorted(os.listdir(m.p())) == ["1", "2", "latest"]
    names = stored_names(src)
    assert not [n for n in names if n.endswith(".__lock") or ".orbax-checkpoint-tmp" in n], names
    for p in (0, 1):  # each process's database and array metadata, merged by process 0
        assert f"2/default/ocdbt.process_{p}/manifest.ocdbt" in names
        assert f"2/default/array_metadatas/process_{p}" in names
    m.unmount()
