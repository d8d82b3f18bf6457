"""A CheckpointManager root's `latest`: a symlink to the newest committed
step, through real mounts and real tools (ls, readlink, cat, cp -r, rsync,
tar, rm, mv, mkdir): listed after the steps, followed, numeric, live (a new
step or a pruned one moves it; no step: absent), refused by write calls,
and copied as a symlink."""

import os
import shutil
import stat
import subprocess
import tarfile

import pytest

import ckfs_util as U

META = "metadata/metadata"  # a JSON item file of every step of the fixture


def sh(*args, cwd=None):
    return subprocess.run([str(a) for a in args], capture_output=True, cwd=cwd, timeout=120,
                          stdin=subprocess.DEVNULL)


def manager_copy(tmp_path, name="ck"):
    src = tmp_path / name
    shutil.copytree(U.FIXTURES / "manager", src)
    return src


def test_listed_after_steps_and_followed(tmp_path, mount):
    src = manager_copy(tmp_path)
    m = mount(src, "ro")
    assert os.listdir(m.p()) == ["10", "20", "latest"]  # readdir order: steps by number, then latest
    st = os.lstat(m.p("latest"))
    assert stat.S_ISLNK(st.st_mode) and st.st_size == 2
    r = sh("readlink", m.p("latest"))
    assert (r.returncode, r.stdout) == (0, b"20\n")
    r = sh("ls", "-l", m.p())
    assert r.returncode == 0 and b" latest -> 20\n" in r.stdout, r.stdout
    a, b = sh("ls", str(m.p("latest")) + "/"), sh("ls", m.p("20"))
    assert a.returncode == b.returncode == 0 and a.stdout == b.stdout and b"state" in a.stdout
    r = sh("cat", m.p("latest/" + META))
    assert (r.returncode, r.stdout) == (0, (src / "20" / META).read_bytes())
    for rel in ("latest/state", "latest/" + META):  # the step's own nodes, through the link
        assert os.stat(m.p(rel)).st_ino == os.stat(m.p("20/" + rel[7:])).st_ino
    m.unmount()


def test_numeric_newest(tmp_path, mount):
    """100 is newer than 20 (text order would say 20)."""
    src = manager_copy(tmp_path)
    shutil.copytree(src / "20", src / "100")
    m = mount(src, "ro")
    assert os.listdir(m.p()) == ["10", "20", "100", "latest"]
    r = sh("readlink", m.p("latest"))
    assert (r.returncode, r.stdout) == (0, b"100\n")
    m.unmount()


def test_follows_the_live_root(tmp_path, mount):
    src = manager_copy(tmp_path)
    m = mount(src, "ro")
    assert os.readlink(m.p("latest")) == "20"
    shutil.copytree(src / "20", src / "30")  # a step committed outside the mount
    assert U.wait_until(lambda: os.readlink(m.p("latest")) == "30", timeout=10)
    r = sh("cat", m.p("latest/" + META))
    assert (r.returncode, r.stdout) == (0, (src / "30" / META).read_bytes())
    shutil.rmtree(src / "30")  # the newest pruned
    assert U.wait_until(lambda: os.readlink(m.p("latest")) == "20", timeout=10)
    assert sorted(os.listdir(m.p())) == ["10", "20", "latest"]
    shutil.rmtree(src / "20")
    shutil.rmtree(src / "10")
    assert U.wait_until(lambda: os.listdir(m.p()) == [], timeout=10)  # no step: no link
    assert not os.path.lexists(m.p("latest"))
    r = sh("readlink", m.p("latest"))
    assert (r.returncode, r.stdout) == (1, b"")
    r = sh("ls", str(m.p("latest")) + "/")
    assert r.returncode == 2 and b"No such file or directory" in r.stderr
    shutil.copytree(U.FIXTURES / "manager" / "10", src / "10")  # and back
    assert U.wait_until(lambda: os.listdir(m.p()) == ["10", "latest"], timeout=10)
    assert os.readlink(m.p("latest")) == "10"
    m.unmount()


def test_empty_root_takes_no_step_named_latest(tmp_path, mount):
    src = tmp_path / "empty"
    src.mkdir()
    m = mount(src)
    assert os.listdir(m.p()) == [] and not os.path.lexists(m.p("latest"))
    r = sh("mkdir", m.p("latest"))
    assert r.returncode == 1 and b"Operation not permitted" in r.stderr, r.stderr
    assert os.listdir(m.p()) == [] and os.listdir(src) == []
    assert "latest: cannot make a folder" in m.log()
    m.unmount()


def test_writable_mount_refuses_latest(tmp_path, mount):
    src = manager_copy(tmp_path)
    m = mount(src)
    r = sh("rm", m.p("latest"))
    assert r.returncode == 1 and b"Operation not permitted" in r.stderr, r.stderr
    r = sh("rm", "-rf", m.p("latest"))
    assert r.returncode == 1 and b"Operation not permitted" in r.stderr, r.stderr
    r = sh("mv", m.p("latest"), m.p("40"))
    assert r.returncode == 1 and b"Operation not permitted" in r.stderr, r.stderr
    r = sh("mv", m.p("20"), m.p("latest"))
    assert r.returncode == 1, r.stderr
    r = sh("mkdir", m.p("latest"))
    assert r.returncode == 1 and b"File exists" in r.stderr, r.stderr
    assert os.readlink(m.p("latest")) == "20" and sorted(os.listdir(src)) == ["10", "20"]
    assert (src / "20" / META).read_bytes() == (U.FIXTURES / "manager" / "20" / META).read_bytes()
    log = m.log()
    assert "latest: cannot remove: it is the root's link to its newest committed step" in log, log
    assert "latest: cannot rename" in log, log
    # no committed step: the name is no step either
    shutil.rmtree(src / "10")
    shutil.rmtree(src / "20")
    assert U.wait_until(lambda: os.listdir(m.p()) == [], timeout=10)
    r = sh("mkdir", m.p("latest"))
    assert r.returncode == 1 and b"Operation not permitted" in r.stderr, r.stderr
    r = sh("touch", m.p("latest"))
    assert r.returncode == 1 and b"Operation not permitted" in r.stderr, r.stderr
    assert os.listdir(m.p()) == [] and os.listdir(src) == []
    assert "latest: cannot make a folder" in m.log()
    assert "latest: cannot create a file" in m.log()
    m.unmount()


def test_copy_tools_copy_a_symlink(tmp_path, mount):
    src = manager_copy(tmp_path)
    m = mount(src, "ro")
    cp_dst = tmp_path / "cp"
    r = sh("cp", "-r", m.p(), cp_dst)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(cp_dst)) == ["10", "20", "latest"]
    assert os.path.islink(cp_dst / "latest") and os.readlink(cp_dst / "latest") == "20"
    assert (cp_dst / "latest" / META).read_bytes() == (src / "20" / META).read_bytes()
    rs_dst = tmp_path / "rsync"
    r = sh("rsync", "-a", str(m.p()) + "/", rs_dst)
    assert r.returncode == 0, r.stderr
    assert os.path.islink(rs_dst / "latest") and os.readlink(rs_dst / "latest") == "20"
    tar_path = tmp_path / "root.tar"
    r = sh("tar", "-cf", tar_path, "-C", m.p(), ".")
    assert r.returncode == 0, r.stderr
    with tarfile.open(tar_path) as t:
        links = {i.name: i.linkname for i in t.getmembers() if i.issym()}
        files = [i.name for i in t.getmembers() if i.isfile()]
    assert links == {"./latest": "20"}
    assert not any(f.startswith("./latest/") for f in files)
    m.unmount()


@pytest.mark.parametrize("prefix", ["step_"])
def test_prefixed_steps(tmp_path, mount, prefix):
    """Steps named step_N: the link names the folder."""
    src = tmp_path / "pre"
    src.mkdir()
    for s in ("10", "20", "100"):
        shutil.copytree(U.FIXTURES / "manager" / ("20" if s == "100" else s), src / f"{prefix}{s}")
    m = mount(src, "ro")
    assert os.readlink(m.p("latest")) == f"{prefix}100"
    assert os.listdir(m.p())[-1] == "latest"
    r = sh("cat", m.p("latest/" + META))
    assert (r.returncode, r.stdout) == (0, (src / f"{prefix}100" / META).read_bytes())
    m.unmount()
