"""What a new user meets in the first minutes, through real mounts and the
real command line: a swapped or busy MOUNTPOINT is refused (and says why),
a mount says what it mounted and where its log goes, errors reach the user
without syslog (.ckptfs/log, `ckptfs status`), the GNU long forms and the
"did you mean" hints."""

import errno
import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

import ckfs_util as U


def run(*args, env=None, timeout=120):
    p = subprocess.run([str(U.BIN), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                       env=env, stdin=subprocess.DEVNULL)
    U.assert_log_clean(p.stderr)
    return p


def manager_copy(tmp_path, name="ck"):
    src = tmp_path / name
    shutil.copytree(U.FIXTURES / "manager", src)
    return src


def wait_gone(pid, timeout=U.EXIT_TIMEOUT):
    end = time.time() + timeout
    while time.time() < end:
        try:  # gone, or a zombie nobody reaps (the daemon's parent exited)
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return
        except FileNotFoundError:
            return
        time.sleep(0.05)
    raise AssertionError(f"daemon {pid} still running")


def refused(tmp_path, src, mnt, *options):
    """Start `ckptfs -f -o ready_fd=N,OPTIONS SRC MNT`, expecting a refusal:
    the daemon's output (it must have said 'f' and exited 1).  A daemon
    that mounts after all is unmounted before the test fails."""
    m = U.Mount(src, mnt, tmp_path / f"refused.{len(list(tmp_path.glob('refused.*')))}.log", options=options)
    byte = m.start(expect_ready=False)
    if byte == b"s":
        m.unmount(check=False)
        raise AssertionError(f"mounted {src} on {mnt}, expected a refusal\n{m.log()}")
    m.returncode = m.proc.wait(timeout=U.EXIT_TIMEOUT)
    assert (byte, m.returncode) == (b"f", 1), (byte, m.returncode, m.log())
    U.assert_log_clean(m.log())
    return m.log()


class Background:
    """`ckptfs SOURCE MNT` in the background, as a user types it (no -f):
    the command returns once mounted; ready_file gives the daemon's PID."""

    def __init__(self, tmp_path, src, mnt, *args, env=None):
        self.mnt = Path(mnt)
        self.ready = tmp_path / f"ready.{self.mnt.name}"
        self.p = run(*args, "-o", f"ready_file={self.ready}", src, mnt, env=env)
        self.pid = None
        end = time.time() + U.READY_TIMEOUT
        while self.p.returncode == 0 and self.pid is None and time.time() < end:
            try:  # written by the daemon just after the command returned
                self.pid = int(self.ready.read_text())
            except (FileNotFoundError, ValueError):
                time.sleep(0.02)

    def unmount(self):
        if self.pid is None:
            return
        assert subprocess.call(["fusermount3", "-u", str(self.mnt)]) == 0
        wait_gone(self.pid)
        self.pid = None


# ---- 1. MOUNTPOINT checks -----------------------------------------------------------

def test_swapped_arguments_are_refused_and_the_checkpoint_stays_visible(tmp_path):
    ck = manager_copy(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    before = sorted(os.listdir(ck))
    err = refused(tmp_path, empty, ck)
    assert "did you swap SOURCE and MOUNTPOINT?" in err, err
    assert not U.is_mounted(ck)
    assert sorted(os.listdir(ck)) == before
    assert os.listdir(empty) == []  # nothing written into the would-be root


def test_non_empty_mountpoint_is_refused_unless_nonempty(tmp_path):
    ck = manager_copy(tmp_path)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    (mnt / "notes.txt").write_text("mine\n")
    err = refused(tmp_path, ck, mnt)
    assert "is not empty (1 entry: notes.txt)" in err and "-o nonempty" in err, err
    assert "swap" not in err
    assert (mnt / "notes.txt").read_text() == "mine\n"
    m = U.Mount(ck, mnt, tmp_path / "log", options=["nonempty"])
    m.start()
    try:
        assert sorted(os.listdir(mnt)) == ["10", "20", "latest"]
        assert np.load(mnt / "20" / "state" / "step.npy").shape == ()
    finally:
        m.unmount()
    assert (mnt / "notes.txt").read_text() == "mine\n"


def test_already_mounted_mountpoint_is_refused(tmp_path, mount):
    ck = manager_copy(tmp_path)
    m = mount(ck)
    err = refused(tmp_path, ck, m.path)
    assert "already a mount point" in err and "fusermount3 -u" in err, err
    assert sorted(os.listdir(m.path)) == ["10", "20", "latest"]  # the first mount still serves


def test_empty_source_and_empty_mountpoint_still_mount_a_new_root(tmp_path, mount):
    src = tmp_path / "new"
    src.mkdir()
    m = mount(src)
    assert os.listdir(m.path) == []


# ---- 3. the line on mount --------------------------------------------------------------

def test_mount_prints_one_line_and_q_silences_it(tmp_path):
    ck = manager_copy(tmp_path)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    log = tmp_path / "ck.log"
    b = Background(tmp_path, ck, mnt, "-o", f"log_file={log}")
    try:
        assert b.p.returncode == 0, b.p
        assert b.p.stdout == (f"ckptfs: mounted {ck} on {mnt} (CheckpointManager root, 2 steps, writable); "
                              f"log: {log}; unmount: fusermount3 -u {mnt}\n"), b.p.stdout
        assert b.p.stderr == ""
    finally:
        b.unmount()
    b = Background(tmp_path, ck / "20", mnt, "-q", "-o", f"log_file={log}")
    try:
        assert b.p.returncode == 0 and b.p.stdout == "" and b.p.stderr == "", b.p
        assert os.listdir(mnt)  # mounted all the same
    finally:
        b.unmount()
    b = Background(tmp_path, ck / "20", mnt, "--read-only", f"--log-file={log}")
    try:
        assert "(one step, read-only)" in b.p.stdout, b.p.stdout
    finally:
        b.unmount()


# ---- 2. errors reach the user without syslog -------------------------------------------

CONTAINER = r"""
set -u
# a container: no syslog daemon on /dev/log
if [ -e /dev/log ]; then mount --bind /dev/null /dev/log; fi
"$BIN" -o ready_file="$T/ready" "$SRC" "$MNT"
echo "mount rc=$?"
mkdir -p "$MNT/30/state"
printf 'not a npy file at all' > "$MNT/30/state/w.npy" 2>/dev/null
touch "$MNT/30/commit_success.txt"
echo "touch rc=$?"
echo "--- status"
"$BIN" status "$MNT"
echo "status rc=$?"
echo "--- .ckptfs/log"
cat "$MNT/.ckptfs/log"
fusermount3 -u "$MNT"
pid=$(cat "$T/ready" 2>/dev/null)
for i in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
"""


def test_without_syslog_the_log_goes_to_a_file_and_errors_to_status(tmp_path):
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    ck = manager_copy(tmp_path)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    xdg = tmp_path / "run"
    xdg.mkdir()
    env = dict(os.environ, BIN=str(U.BIN), SRC=str(ck), MNT=str(mnt), T=str(tmp_path),
               XDG_RUNTIME_DIR=str(xdg))
    p = subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c", CONTAINER],
                       capture_output=True, text=True, timeout=180, env=env)
    if "unshare failed" in p.stderr:
        pytest.skip("no private mount namespace here: " + p.stderr)
    out = p.stdout
    logfile = xdg / "ckptfs.log"
    assert f"log: {logfile};" in out, out + p.stderr
    assert "mount rc=0" in out
    assert "touch rc=1" in out  # the commit failed ...
    status = out.split("--- status")[1].split("--- .ckptfs/log")[0]
    assert "status rc=0" in status
    assert "recent errors" in status and "w.npy: not a valid .npy header" in status, status  # ... and says why
    assert f"log: {logfile}" in status
    served = out.split("--- .ckptfs/log")[1]
    assert "error: w.npy: not a valid .npy header" in served and "mounted on" in served, served
    text = logfile.read_text()
    assert "error: w.npy: not a valid .npy header" in text and "ckptfs[" in text, text
    assert oct(logfile.stat().st_mode & 0o777) == "0o600"


def test_log_file_served_as_ckptfs_log(tmp_path, mount):
    ck = manager_copy(tmp_path)
    m = mount(ck)
    log = (m.path / ".ckptfs" / "log").read_text()
    assert f"{ck}: mounted on {m.path} as a checkpoint root (writable); log: stderr" in log, log
    assert ".ckptfs" not in os.listdir(m.path)  # hidden, by name only
    assert "log" in os.listdir(m.path / ".ckptfs")


# ---- 7. CLI habits -------------------------------------------------------------------------

def test_did_you_mean_for_a_subcommand_and_an_option(tmp_path):
    ck = manager_copy(tmp_path)
    p = run("inf", ck)
    assert p.returncode == 1 and "did you mean 'ckptfs info'?" in p.stderr, p.stderr
    p = run("stauts", ck)
    assert p.returncode == 1 and "did you mean 'ckptfs status'?" in p.stderr, p.stderr
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    err = refused(tmp_path, ck, mnt, "cache_sise=1M", "allow_othr")
    assert "did you mean -o cache_size?" in err and "did you mean -o allow_other?" in err, err
    assert not U.is_mounted(mnt)


def test_gnu_long_forms(tmp_path, mount):
    ck = manager_copy(tmp_path)
    log = tmp_path / "long.log"
    m = mount(ck, extra_args=["--read-only", f"--log-file={log}", "--foreground"])
    with pytest.raises(OSError) as e:
        os.mkdir(m.p("30"))
    assert e.value.errno == 30  # EROFS: --read-only is -o ro
    assert "mounted on" in log.read_text()
    p = run("--help")
    for word in ("--foreground", "--read-only", "--log-file", "--allow-other", "--version", "-q"):
        assert word in p.stdout, word


# ---- 4. ckptfs info on a real root ------------------------------------------------------------

def many_steps(tmp_path):
    """A root with steps 10, 20, 100, 200 and 1000 (copies of the fixture's)."""
    src = tmp_path / "many"
    src.mkdir()
    for s in (10, 20):
        shutil.copytree(U.FIXTURES / "manager" / str(s), src / str(s))
    for s in (100, 200, 1000):
        shutil.copytree(U.FIXTURES / "manager" / "20", src / str(s))
    return src


def test_info_lists_steps_by_number_one_line_each(tmp_path):
    src = many_steps(tmp_path)
    p = run("info", src)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "steps (5): 10 20 100 200 1000\n" in out, out
    rows = [l.split() for l in out.splitlines() if l.strip() and l.split()[0].isdigit()]
    assert [r[0] for r in rows] == ["10", "20", "100", "200", "1000"], out
    assert all(r[3] == "10" for r in rows), out  # ten arrays each
    assert out.count("latest") == 1 and rows[-1][-1] == "latest", out
    assert "total: 5 steps, 50 arrays" in out
    assert len(out.splitlines()) < 15, out  # one line per step, not a table per step
    assert "KEY" not in out
    j = __import__("json").loads(run("info", "--json", src).stdout)
    assert j["steps"] == ["10", "20", "100", "200", "1000"]
    full = run("info", "--all", src).stdout
    assert full.count("item state") == 5 and "params/layer_0/mlp/w1" in full
    one = run("info", src, "1000").stdout
    assert "step 1000, item state" in one and "KEY" in one and "STEP " not in one


def test_readdir_of_a_root_is_in_step_order(tmp_path, mount):
    src = many_steps(tmp_path)
    m = mount(src, "ro")
    assert os.listdir(m.path) == ["10", "20", "100", "200", "1000", "latest"]  # readdir order
    assert os.readlink(m.path / "latest") == "1000"


def test_info_exits_1_and_lists_unreadable_arrays(tmp_path):
    src = many_steps(tmp_path)
    shutil.rmtree(src / "20" / "state" / "d")  # the OCDBT data files of step 20
    p = run("info", src)
    assert p.returncode == 1, p
    assert "10 unreadable" in p.stdout and "20/state/params/layer_0/mlp/w1.npy" in p.stdout, p.stdout
    assert "cannot be read" in p.stderr
    p = run("info", "--json", src, "20")
    assert p.returncode == 1
    j = __import__("json").loads(p.stdout)
    assert len(j["unreadable"]) == 10 and j["total"]["arrays"] == 0
    assert run("info", src, "10").returncode == 0  # the readable step alone


# ---- 5. copies out of the mount ------------------------------------------------------------------

def test_modes_are_0644_and_0755_so_copies_stay_writable(tmp_path, mount):
    m = mount(U.FIXTURES / "manager", "ro")
    w1 = m.p("20/state/params/layer_0/mlp/w1.npy")
    assert oct(os.stat(w1).st_mode & 0o777) == "0o644"
    assert oct(os.stat(m.p("20/state")).st_mode & 0o777) == "0o755"
    assert oct(os.stat(m.p("20/state/_METADATA")).st_mode & 0o777) == "0o644"
    dst = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(m.p("20")), str(dst)], check=True)
    assert oct((dst / "state/params/layer_0/mlp/w1.npy").stat().st_mode & 0o777) == "0o644"
    assert subprocess.run(["rm", "-r", str(dst)]).returncode == 0  # no "write-protected" prompt or failure
    with pytest.raises(OSError):  # still read-only for all that
        open(w1, "r+b")


def test_stored_folder_copies_a_restorable_step(tmp_path, mount):
    src = manager_copy(tmp_path)
    m = mount(src, "ro")
    assert ".stored" not in os.listdir(m.p("20"))  # hidden: by name only
    backup = tmp_path / "backup"
    backup.mkdir()
    subprocess.run(["cp", "-r", str(m.p("20/.stored")), str(backup / "20")], check=True)
    # byte for byte the stored files
    for d, _, files in os.walk(src / "20"):
        for f in files:
            rel = os.path.relpath(os.path.join(d, f), src / "20")
            assert (backup / "20" / rel).read_bytes() == (src / "20" / rel).read_bytes(), rel
    assert sorted(os.listdir(backup / "20" / "state")) == sorted(os.listdir(src / "20" / "state"))
    # the copy's progress: bytes read out of .stored, in the stats and in status
    total = sum(f.stat().st_size for f in (src / "20").rglob("*") if f.is_file())
    stats = __import__("json").loads(m.p(".ckptfs/stats").read_bytes())
    assert stats["stored_copy_bytes"] == total, (stats, total)
    st = run("status", m.path).stdout
    assert "copied out of STEP/.stored: " in st, st
    # ckptfs (and so Orbax's layout) reads the copy as a root with step 20
    p = run("info", "--json", backup)
    assert p.returncode == 0, p.stderr
    j = __import__("json").loads(p.stdout)
    assert j["steps"] == ["20"] and j["total"]["arrays"] == 10
    m2 = mount(backup, "ro")
    a = "20/state/params/layer_0/mlp/w1.npy"
    assert m2.p(a).read_bytes() == m.p(a).read_bytes()
    # tar works too
    t = subprocess.run(["tar", "-C", str(m.p("20/.stored")), "-cf", "-", "."], capture_output=True)
    assert t.returncode == 0 and b"manifest.ocdbt" in t.stdout


def test_info_on_a_tree_view_copy_says_what_it_is(tmp_path, mount):
    m = mount(U.FIXTURES / "manager", "ro")
    dst = tmp_path / "cp20"
    subprocess.run(["cp", "-r", str(m.p("20")), str(dst)], check=True)
    p = run("info", dst)
    assert p.returncode == 1, p
    assert "looks like a copy of a ckptfs" in p.stderr and "cp -r MNT/STEP/.stored" in p.stderr, p.stderr
    np.load(dst / "state/params/layer_0/mlp/w1.npy")  # the arrays themselves are fine


# ---- 6. pending leftovers ---------------------------------------------------------------------------

def test_status_labels_a_leftover_pending_folder_and_says_how_to_discard_it(tmp_path, mount):
    src = manager_copy(tmp_path)
    left = src / "40.orbax-checkpoint-tmp"
    (left / "state").mkdir(parents=True)
    (left / "state" / "_METADATA").write_text("{}")
    m = mount(src)
    (m.p("50") / "state").mkdir(parents=True)  # a live pending step
    p = run("status", m.path)
    assert p.returncode == 0, p.stderr
    # there at mount time: shown in the mount, and discarded through it
    assert "left over: 40.orbax-checkpoint-tmp" in p.stdout, p.stdout
    assert f"rm -r {m.p('40.orbax-checkpoint-tmp')}" in p.stdout, p.stdout
    assert "pending step 50:" in p.stdout and "pending step 40" not in p.stdout
    j = __import__("json").loads(run("status", "--json", m.path).stdout)
    assert {s["step"]: s["leftover"] for s in j["pending"]} == {"40": True, "50": False}
    subprocess.run(["rm", "-r", m.p("40.orbax-checkpoint-tmp")], check=True)  # the command it gives works
    assert not left.exists()
    assert "left over" not in run("status", m.path).stdout
    # made in SOURCE after the mount: hidden, discarded in SOURCE or through a pending step
    (src / "60.orbax-checkpoint-tmp" / "state").mkdir(parents=True)
    p = run("status", m.path)
    assert "left over: 60.orbax-checkpoint-tmp" in p.stdout and f"rm -r {src / '60.orbax-checkpoint-tmp'}" in p.stdout
    assert f"mkdir {m.p('60')} && rmdir {m.p('60')}" in p.stdout
    os.mkdir(m.p("60"))
    os.rmdir(m.p("60"))
    assert not (src / "60.orbax-checkpoint-tmp").exists()
    assert "60.orbax" not in run("status", m.path).stdout.split("recent errors")[0]


def test_a_leftover_pending_folder_is_a_pending_step_of_a_writable_mount(tmp_path, mount):
    """A <step>.orbax-checkpoint-tmp folder in SOURCE at mount time (left by
    an earlier mount or Orbax run) is what an Orbax save through the mount
    makes: a pending step stored as written.  rm -r through the mount
    removes it from SOURCE; a rename to <step> commits it; a read-only
    mount leaves it hidden."""
    src = manager_copy(tmp_path)
    left = src / "40.orbax-checkpoint-tmp"
    (left / "state" / "d").mkdir(parents=True)
    (left / "state" / "_METADATA").write_text("{}")
    (left / "state" / "d" / "x").write_bytes(b"abc")
    shutil.copytree(src / "20", src / "70.orbax-checkpoint-tmp")  # a whole step, never renamed
    ro = mount(src, "ro")
    assert sorted(os.listdir(ro.path)) == ["10", "20", "latest"]
    assert U.errno_of(os.stat, ro.p("40.orbax-checkpoint-tmp")) == errno.ENOENT
    m = mount(src)
    assert {"40.orbax-checkpoint-tmp", "70.orbax-checkpoint-tmp"} <= set(os.listdir(m.path))
    assert sorted(os.listdir(m.p("40.orbax-checkpoint-tmp/state"))) == ["_METADATA", "d"]
    assert U.read_all(m.p("40.orbax-checkpoint-tmp/state/d/x")) == b"abc"
    assert os.stat(m.p("40.orbax-checkpoint-tmp/state/d/x")).st_size == 3
    assert os.getxattr(m.p("40.orbax-checkpoint-tmp"), "user.ckpt.leftover")
    subprocess.run(["rm", "-r", m.p("40.orbax-checkpoint-tmp")], check=True)
    assert not left.exists()
    assert "40.orbax-checkpoint-tmp" not in os.listdir(m.path)
    # Orbax's finalize: the rename commits it, and it reads as the step it holds
    os.rename(m.p("70.orbax-checkpoint-tmp"), m.p("70"))
    assert (src / "70").is_dir() and not (src / "70.orbax-checkpoint-tmp").exists()
    want = U.read_all(m.p("20/state/params/layer_0/mlp/w1.npy"))
    assert U.read_all(m.p("70/state/params/layer_0/mlp/w1.npy")) == want
    assert "left over" not in run("status", m.path).stdout


# ---- 8. Python: ckptfs.mount, and bf16 without ml_dtypes --------------------------------------------

@pytest.fixture
def ckptfs_module(monkeypatch):
    import importlib
    import sys
    monkeypatch.syspath_prepend(str(U.REPO / "python"))
    monkeypatch.setenv("CKPTFS_BIN", str(U.BIN))
    sys.modules.pop("ckptfs", None)
    return importlib.import_module("ckptfs")


def test_python_mount_context_manager(ckptfs_module, tmp_path):
    ckptfs = ckptfs_module
    src = U.FIXTURES / "manager"
    with ckptfs.mount(src, ro=True) as mnt:
        assert U.is_mounted(mnt)
        w = np.load(mnt / "20" / "state" / "params" / "layer_0" / "mlp" / "b1.npy")
        assert w.shape == (128,) and w.dtype == np.float32
        with pytest.raises(OSError):
            os.mkdir(mnt / "30")  # ro=True
        where = mnt
    assert not U.is_mounted(where) and not where.exists()  # unmounted, its temporary folder removed
    mine = tmp_path / "mine"
    mine.mkdir()
    with pytest.raises(KeyError):  # an exception in the block still unmounts
        with ckptfs.mount(src, mine, ro=False, options=["cache_size=64M"]) as mnt:
            assert mnt == mine and os.listdir(mnt) == ["10", "20", "latest"]
            raise KeyError("boom")
    assert not U.is_mounted(mine) and mine.is_dir()  # a mount point of the caller's stays


def test_python_mount_failure_raises_with_the_reason(ckptfs_module, tmp_path):
    ckptfs = ckptfs_module
    mnt = tmp_path / "busy"
    mnt.mkdir()
    (mnt / "x").write_text("x")
    with pytest.raises(ckptfs.MountError) as e:
        with ckptfs.mount(U.FIXTURES / "manager", mnt):
            pass
    assert "is not empty" in str(e.value), str(e.value)
    with pytest.raises(ckptfs.MountError) as e:
        with ckptfs.mount(tmp_path / "no-such-checkpoint"):
            pass
    assert "No such file or directory" in str(e.value)


def test_bf16_to_torch_recipe_bits(mount):
    """The recipe of python/ckptfs.py and docs/usage.md: the '<V2' array's
    bits viewed as int16 are what torch.bfloat16 takes; widened to float32
    they equal NAME.f32.npy."""
    m = mount(U.FIXTURES / "manager", "ro")
    d = m.p("20/state/params/layer_0/mlp")
    raw = np.load(d / "w1.npy")
    assert raw.dtype == np.dtype("V2")
    bits = raw.view(np.int16)  # torch.from_numpy(bits).view(torch.bfloat16)
    as_f32 = (bits.astype(np.uint16).astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(as_f32, np.load(d / "w1.f32.npy"))
    try:
        import torch
    except ImportError:
        return
    t = torch.from_numpy(bits).view(torch.bfloat16)
    np.testing.assert_array_equal(t.float().numpy(), as_f32)


def test_step_folders_carry_xattrs(tmp_path, mount):
    src = many_steps(tmp_path)
    shutil.rmtree(src / "20" / "state" / "d")
    m = mount(src, "ro")
    x = {n: os.getxattr(m.p("1000"), n).decode() for n in os.listxattr(m.p("1000"))}
    meta = __import__("json").loads((src / "1000" / "_CHECKPOINT_METADATA").read_text())
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(meta["commit_timestamp_nsecs"] // 10**9))
    assert x == {"user.ckpt.step": "1000", "user.ckpt.committed": when, "user.ckpt.arrays": "10",
                 "user.ckpt.logical_bytes": "41608", "user.ckpt.stored_bytes": x["user.ckpt.stored_bytes"],
                 "user.ckpt.unreadable": "0"}, x
    j = __import__("json").loads(run("info", "--json", src, "1000").stdout)
    assert int(x["user.ckpt.stored_bytes"]) == j["total"]["stored_bytes"]
    assert os.getxattr(m.p("20"), "user.ckpt.unreadable") == b"10"
    assert when.replace("T", " ")[:-1] in run("info", src).stdout  # the same time on info's line


def test_dead_mount_says_transport_endpoint_and_what_to_do(tmp_path):
    ck = manager_copy(tmp_path)
    mnt = tmp_path / "mnt"
    m = U.Mount(ck, mnt, tmp_path / "first.log")
    m.start()
    try:
        m.proc.kill()  # the daemon dies: "Transport endpoint is not connected"
        m.proc.wait(timeout=30)
        with pytest.raises(OSError) as e:
            os.listdir(mnt)
        assert e.value.errno == 107  # ENOTCONN
        p = run("-f", ck, mnt, timeout=30)  # refused before anything is mounted
        assert p.returncode == 1, p
        err = p.stderr
        assert "daemon is gone (Transport endpoint is not connected)" in err and "fusermount3 -u" in err, err
    finally:
        subprocess.call(["fusermount3", "-u", "-z", str(mnt)], stderr=subprocess.DEVNULL)
        m.closed = True
    assert not U.is_mounted(mnt)
