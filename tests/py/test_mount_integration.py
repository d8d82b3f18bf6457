"""The daemon as the system sees it: options checked before anything is
mounted, fsname/subtype in the mount table, a log that survives going to the
background (log_file), a readiness file, owner and modes from uid=/gid=/umask=,
statfs figures, and mounting through mount(8) (`mount -t fuse.ckptfs`, an
fstab line read with `mount -T`) via Debian's mount.fuse3 helper."""

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

import ckfs_util as U


def mountinfo_entry(mnt):
    target = os.path.abspath(mnt)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ", 1)
            if left.split()[4].encode().decode("unicode_escape") == target:
                fstype, source, opts = right.split()[:3]
                return fstype, source.encode().decode("unicode_escape"), opts
    return None


def wait_for(pred, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


class Daemonized:
    """A mount started the way fstab does: no -f, the daemon goes to the
    background; ready_file says when it serves, log_file holds its log."""

    def __init__(self, base, source, *opts, cmd_prefix=()):
        self.base = Path(base)
        self.mnt = self.base / "mnt"
        self.mnt.mkdir(parents=True, exist_ok=True)
        self.log = self.base / "ckptfs.log"
        self.ready = self.base / "ready"
        o = ",".join([f"log_file={self.log}", f"ready_file={self.ready}", *opts])
        self.proc = subprocess.run([*cmd_prefix, str(U.BIN), "-o", o, str(source), str(self.mnt)],
                                   capture_output=True, text=True, timeout=60)

    def pid(self):
        return int(self.ready.read_text())

    def unmount(self):
        if U.is_mounted(self.mnt):
            subprocess.run(["fusermount3", "-u", str(self.mnt)], check=True)
        # the daemon removes its ready file on the way out
        assert wait_for(lambda: not self.ready.exists()), "daemon did not exit"


@pytest.fixture
def daemonized(tmp_path):
    made = []

    def start(source, *opts):
        d = Daemonized(tmp_path / f"d{len(made)}", source, *opts)
        made.append(d)
        return d

    yield start
    for d in made:
        if U.is_mounted(d.mnt):
            subprocess.call(["fusermount3", "-u", "-z", str(d.mnt)])


def test_fsname_and_subtype(mount):
    m = mount(U.FIXTURES / "pytree_zarr3")
    fstype, source, _ = mountinfo_entry(m.path)
    assert fstype == "fuse.ckptfs"
    assert source == str((U.FIXTURES / "pytree_zarr3").resolve())
    df = subprocess.run(["df", str(m.path)], capture_output=True, text=True, check=True).stdout
    assert str((U.FIXTURES / "pytree_zarr3").resolve()) in df


def test_own_fsname_is_kept(mount):
    m = mount(U.FIXTURES / "pytree_zarr3", "fsname=mine,subtype=other")
    fstype, source, _ = mountinfo_entry(m.path)
    assert (fstype, source) == ("fuse.other", "mine")


def test_unknown_option_fails_before_mounting(mount):
    m = mount(U.FIXTURES / "pytree_zarr3", "no_such_option=1", expect_ready=False)
    assert m.ready == b"f"
    m.proc.wait(timeout=30)
    assert m.proc.returncode != 0
    log = m.log()
    assert "no_such_option" in log
    assert "mounted" not in log
    assert not U.is_mounted(m.path)


def test_bad_umask_fails(tmp_path):
    p = subprocess.run([str(U.BIN), "-f", "-o", "umask=9x", str(U.FIXTURES / "manager"), str(tmp_path)],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode != 0 and "umask" in p.stderr


def test_daemonized_logs_to_log_file(daemonized, tmp_path):
    src = tmp_path / "z3"
    shutil.copytree(U.FIXTURES / "pytree_zarr3", src)
    (src / "params.layer_0.mlp.b1" / "c" / "3").write_bytes(b"garbage")
    d = daemonized(src)
    assert d.proc.returncode == 0, d.proc.stderr
    assert wait_for(d.ready.exists)
    assert d.pid() > 0 and d.pid() != os.getpid()
    assert U.is_mounted(d.mnt)
    with pytest.raises(OSError):
        (d.mnt / "params" / "layer_0" / "mlp" / "b1.npy").read_bytes()
    stats = json.loads((d.mnt / ".ckptfs" / "stats").read_text())
    assert stats["errors"] >= 1
    d.unmount()
    log = d.log.read_text()
    assert "mounted on" in log and "unmounted" in log
    err = [line for line in log.splitlines() if ": error: " in line]
    assert err, log
    # the error line names the checkpoint folder, the chunk and the reason
    assert any(str(src) in line and "params.layer_0.mlp.b1" in line for line in err), log


def bdi_read_ahead_kb(mnt):
    st = os.stat(mnt)
    return int(Path(f"/sys/class/bdi/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/read_ahead_kb").read_text())


def test_read_ahead_is_raised_before_ready(mount, daemonized):
    """The mount's kernel read-ahead is 1 MiB (or read_ahead_kb=) by the time
    the daemon says it is ready, and by the time ckptfs returns when it goes
    to the background: a reader that starts at once gets 1 MiB requests.
    (Raised from a thread a tenth of a second after the loop answered INIT,
    a reader starting at once read its first tenths of a second in 128 KiB
    requests.)"""
    m = mount(U.FIXTURES / "pytree_zarr3")
    assert bdi_read_ahead_kb(m.path) == 1024
    m2 = mount(U.FIXTURES / "pytree_zarr3", "read_ahead_kb=4096")
    assert bdi_read_ahead_kb(m2.path) == 4096
    d = daemonized(U.FIXTURES / "pytree_zarr3")
    assert d.proc.returncode == 0, d.proc.stderr
    assert bdi_read_ahead_kb(d.mnt) == 1024
    d.unmount()


def test_ready_file_relative_path(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run([str(U.BIN), "-o", "ready_file=rdy", str(U.FIXTURES / "manager"), "mnt"],
                   cwd=tmp_path, check=True, timeout=60)
    try:
        assert wait_for((tmp_path / "rdy").exists)
        assert (mnt / "10").is_dir()
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], check=True)
    assert wait_for(lambda: not (tmp_path / "rdy").exists())


def test_owner_and_umask(mount, tmp_path):
    m = mount(U.FIXTURES / "manager", "uid=1234,gid=4321,umask=027")
    st = os.stat(m.p("10/state/params/layer_0/mlp/w1.npy"))
    assert (st.st_uid, st.st_gid) == (1234, 4321)
    assert st.st_mode & 0o777 == 0o640
    assert os.stat(m.p("10")).st_mode & 0o777 == 0o750


def test_default_owner_is_the_mounting_user(mount):
    m = mount(U.FIXTURES / "manager")
    st = os.stat(m.p("10/state/_METADATA"))
    assert (st.st_uid, st.st_gid) == (os.getuid(), os.getgid())


def test_cp_a_copy_is_writable_with_umask(mount, tmp_path):
    m = mount(U.FIXTURES / "manager", "umask=022")
    dst = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(m.p("10")), str(dst)], check=True)
    f = dst / "state" / "params" / "layer_0" / "mlp" / "w1.npy"
    assert os.stat(f).st_mode & 0o200
    with open(f, "r+b") as fh:  # the owner can write the copy
        fh.write(fh.read(6))


def test_statfs_writable_is_the_backing_fs(mount, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(U.FIXTURES / "manager", src)
    m = mount(src)
    a, b = os.statvfs(m.path), os.statvfs(src)
    assert a.f_blocks * a.f_frsize == b.f_blocks * b.f_frsize
    assert a.f_bavail > 0


def test_statfs_read_only_is_the_checkpoint_size(mount):
    m = mount(U.FIXTURES / "manager", "ro")
    s = os.statvfs(m.path)
    total = 0
    for dirpath, _, files in os.walk(m.path):
        total += sum(os.path.getsize(os.path.join(dirpath, f)) for f in files)
    assert s.f_blocks == (total + s.f_frsize - 1) // s.f_frsize
    assert s.f_bavail == 0 and s.f_bfree == 0


# ---- mount(8) -----------------------------------------------------------------
#
# mount(8) runs /sbin/mount.fuse.ckptfs if it exists, else /sbin/mount.fuse
# (fuse3's mount.fuse3) with "-t fuse.ckptfs".  mount(8) drops PATH from the
# helper's environment, so /bin/sh finds `ckptfs` on its default PATH
# (/usr/local/bin, /usr/bin, ...).  The test makes its build visible there
# in a private mount namespace: /usr/local/bin is bind-mounted over with a
# folder holding the daemon under test, for the namespace only.

def _mount8_unavailable():
    if os.geteuid() != 0:
        return "mount(8) tests need root"
    for tool in ("unshare", "mount", "umount", "findmnt"):
        if shutil.which(tool) is None:
            return f"{tool} missing"
    if not (os.path.exists("/sbin/mount.fuse3") or os.path.exists("/usr/sbin/mount.fuse3")):
        return "mount.fuse3 missing (Debian package fuse3)"
    p = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if p.returncode != 0:
        return "unshare -m not permitted here"
    return None


def run_in_namespace(tmp_path, script):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shutil.copy2(U.BIN, bindir / "ckptfs")
    full = f"set -e\nmount --bind {bindir} /usr/local/bin\n{script}\n"
    return subprocess.run(["unshare", "-m", "sh", "-c", full], capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(_mount8_unavailable() is not None, reason=str(_mount8_unavailable()))
def test_mount_t_fuse_ckptfs(tmp_path):
    src = U.FIXTURES / "manager"
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    log = tmp_path / "log"
    p = run_in_namespace(tmp_path, f"""
mount -t fuse.ckptfs -o ro,nosuid,nodev,log_file={log} {src} {mnt}
findmnt -n -o FSTYPE,SOURCE,OPTIONS {mnt}
ls {mnt}/10/state/params/layer_0/mlp
umount {mnt}
""")
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == (f"ckptfs: mounted {src.resolve()} on {mnt} (CheckpointManager root, 2 steps, "
                        f"read-only); log: {log}; unmount: fusermount3 -u {mnt}"), lines[0]
    lines = lines[1:]
    fstype, source, opts = lines[0].split()
    assert fstype == "fuse.ckptfs" and source == str(src.resolve())
    assert "ro" in opts.split(",") and "nosuid" in opts.split(",")
    assert "w1.npy" in lines[1:]
    text = log.read_text()
    assert "mounted on" in text and "read-only" in text


@pytest.mark.skipif(_mount8_unavailable() is not None, reason=str(_mount8_unavailable()))
def test_fstab_line(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(U.FIXTURES / "manager", src)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    ready = tmp_path / "ready"
    fstab = tmp_path / "fstab"
    fstab.write_text(f"# a test fstab\n{src} {mnt} fuse.ckptfs "
                     f"noauto,nofail,_netdev,nosuid,nodev,umask=022,quiet,ready_file={ready},"
                     f"log_file={tmp_path / 'log'} 0 0\n")
    p = run_in_namespace(tmp_path, f"""
mount -T {fstab} {mnt}
for i in $(seq 300); do test -s {ready} && break; sleep 0.1; done
test -s {ready}
stat -c %a {mnt}/10/state/_METADATA
mkdir {mnt}/40 && rmdir {mnt}/40
findmnt -n -o FSTYPE {mnt}
umount {mnt}
""")
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout.split()
    assert out[0] == "644" and out[1] == "fuse.ckptfs"
    assert "(writable)" in (tmp_path / "log").read_text()


def test_mount_fuse3_helper_directly(tmp_path):
    """What mount(8) runs, run by hand: mount.fuse3 SOURCE MNT -t fuse.ckptfs
    -o OPTS finds ckptfs on PATH, drops the options meant for mount(8)
    (noauto, _netdev, ...) and adds dev,suid unless nodev,nosuid."""
    helper = shutil.which("mount.fuse3") or "/sbin/mount.fuse3"
    if not os.path.exists(helper):
        pytest.skip("mount.fuse3 missing (Debian package fuse3)")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env = dict(os.environ, PATH=f"{U.BIN.parent}:{os.environ.get('PATH', '')}")
    if U.BIN.name != "ckptfs":
        pytest.skip("the daemon under test is not named ckptfs")
    opts = f"noauto,_netdev,nosuid,nodev,ro,ready_file={tmp_path / 'rdy'}"
    p = subprocess.run([helper, str(U.FIXTURES / "manager"), str(mnt), "-t", "fuse.ckptfs", "-o", opts],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    try:
        assert wait_for((tmp_path / "rdy").exists)
        fstype, source, _ = mountinfo_entry(mnt)
        assert fstype == "fuse.ckptfs"
        assert (mnt / "20" / "state").is_dir()
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)])


@pytest.mark.skipif(_mount8_unavailable() is not None, reason=str(_mount8_unavailable()))
def test_daemonized_logs_to_syslog(tmp_path):
    """No log_file and no -f: the daemon logs to syslog as `ckptfs`.  /dev/log
    is a socket of this test, inside a private mount namespace (a folder
    holding it and the needed device nodes is bind-mounted over /dev)."""
    import socket

    src = tmp_path / "z3"
    shutil.copytree(U.FIXTURES / "pytree_zarr3", src)
    (src / "params.layer_0.mlp.b1" / "c" / "3").write_bytes(b"garbage")
    dev = tmp_path / "dev"
    dev.mkdir()
    nodes = ["null", "zero", "fuse", "urandom", "random"]
    for n in nodes:
        (dev / n).touch()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(dev / "log"))
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    binds = "\n".join(f"mount --bind /dev/{n} {dev}/{n}" for n in nodes)
    try:
        p = subprocess.run(["unshare", "-m", "sh", "-c", f"""set -e
{binds}
mount --rbind {dev} /dev
{U.BIN} {src} {mnt}
cat {mnt}/params/layer_0/mlp/b1.npy > /dev/null 2>&1 || true
umount {mnt}
"""], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr
        sock.settimeout(5.0)
        got = []
        while True:
            try:
                got.append(sock.recv(65536).decode(errors="replace"))
            except socket.timeout:
                break
            if any("unmounted" in g for g in got):
                break
    finally:
        sock.close()
    text = "\n".join(got)
    assert "ckptfs[" in text and "mounted on" in text, text
    err = [g for g in got if g.startswith("<27>")]  # LOG_DAEMON | LOG_ERR
    assert any("params.layer_0.mlp.b1" in g for g in err), text
