"""Who may write: under -o allow_other, any uid but the
mounting user's gets EACCES for every change (mkdir, create, write, setxattr,
rename, rmdir, unlink, the commit marker) unless -o allow_other_writes; reads
by others are allowed (the tree shows world-readable modes; -o
default_permissions with uid=/gid=/umask= narrows them).

The other user is `nobody`, reached with setpriv; the tests need root."""

import os
import pwd
import shutil
import subprocess
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest

import ckfs_util as U


def _unavailable():
    if os.geteuid() != 0:
        return "needs root (to run a process as nobody)"
    if shutil.which("setpriv") is None:
        return "setpriv missing (util-linux)"
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        return "no user nobody"
    return None


pytestmark = pytest.mark.skipif(_unavailable() is not None, reason=str(_unavailable()))

# What `nobody` tries; each line prints "NAME ERRNO" (0 = it worked).
PROBE = textwrap.dedent("""
    import errno, os, sys
    m, pending = sys.argv[1], sys.argv[2]
    def t(name, f):
        try:
            f()
            print(name, 0)
        except OSError as e:
            print(name, errno.errorcode.get(e.errno, e.errno))
    t("read", lambda: open(m + "/10/state/step.npy", "rb").read())
    t("mkdir_step", lambda: os.mkdir(m + "/999999"))
    t("mkdir_item", lambda: os.mkdir(pending + "/evil"))
    t("create", lambda: open(pending + "/state/w2.npy", "wb").close())
    t("write", lambda: open(pending + "/state/w.npy", "r+b").write(b"x"))
    t("setxattr", lambda: os.setxattr(pending + "/state/w.npy", "user.ckpt.sharding", b"{}"))
    t("unlink", lambda: os.unlink(pending + "/state/w.npy"))
    t("rename", lambda: os.rename(pending, m + "/999998"))
    t("commit", lambda: open(pending + "/commit_success.txt", "w").close())
    t("rmdir", lambda: os.rmdir(pending))
""")


@pytest.fixture
def shared_dir():
    """A folder `nobody` can reach (pytest's own temp folders are 0700)."""
    d = Path(tempfile.mkdtemp(prefix="ckptfs-sec-"))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def as_nobody(mnt, pending):
    script = Path(mnt).parent / "probe.py"
    script.write_text(PROBE)
    os.chmod(script, 0o644)
    p = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                        "/usr/bin/python3", str(script), str(mnt), str(pending)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return dict(line.split() for line in p.stdout.splitlines())


def start_shared(shared_dir, *opts):
    src = shared_dir / "src"
    shutil.copytree(U.FIXTURES / "manager", src)
    os.chmod(src, 0o700)  # a root-owned SOURCE nobody cannot touch directly
    f = U.MountFactory(shared_dir / "mounts")
    m = f(src, "allow_other", *opts)
    os.chmod(shared_dir / "mounts", 0o755)
    os.chmod(m.path.parent, 0o755)
    pending = m.p("50")
    (pending / "state").mkdir(parents=True)
    np.save(pending / "state" / "w.npy", np.zeros(4, np.float32))
    return f, m, src, pending


def test_others_cannot_write(shared_dir):
    f, m, src, pending = start_shared(shared_dir)
    try:
        r = as_nobody(m.path, pending)
        assert r.pop("read") == "0"
        assert all(v == "EACCES" for v in r.values()), r
        assert not (src / "999999").exists() and not (src / "50").exists()
        # the mounting user still commits
        open(pending / "commit_success.txt", "w").close()
        assert (src / "50" / "commit_success.txt").exists()
        assert "refused" in m.log()
    finally:
        f.close()


def test_allow_other_writes_opts_in(shared_dir):
    f, m, src, pending = start_shared(shared_dir, "allow_other_writes")
    try:
        r = as_nobody(m.path, pending)
        assert r["read"] == "0" and r["mkdir_step"] == "0" and r["create"] == "0", r
        assert "EACCES" not in r.values(), r
    finally:
        f.close()
