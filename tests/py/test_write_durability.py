"""A daemon killed with SIGKILL in the middle of a save (docs/format.md,
"The commit protocol").

The daemon is killed (by its PID) at several points of writing step 30:
after the mkdir only, while two processes are in the middle of writing
slice files, after every write but before the commit, and during the
commit.  The dead mount is detached (fusermount3 -u -z) and SOURCE is
mounted again by a fresh daemon.  Then:
  - no partial step is visible: the step does not exist, or (only when
    the kill hit the commit) it exists and reads back completely;
  - every step committed earlier reads back byte for byte, and its files
    on disk did not change;
  - the tmp folder left behind is not shown as a step: it is the pending
    step it was (stored as written, labelled left over), under its own
    name;
  - a new pending step of the same name starts (the stale tmp folder is
    reclaimed: nothing of it survives) and commits.
"""

import errno
import io
import multiprocessing
import os
import select
import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import ckfs_util as U
from ckfs_help import commit, tree_files
import zarr3_verify as V

TMP = ".orbax-checkpoint-tmp"
FORK = multiprocessing.get_context("fork")
MARKER = "STALE_MARKER"


# ---------------------------------------------------------------------------
# helpers

def npy_bytes(descr, shape, raw=b""):
    f = io.BytesIO()
    np.lib.format.write_array_header_1_0(f, {"descr": descr, "fortran_order": False, "shape": tuple(shape)})
    return f.getvalue() + bytes(raw)


def npy_of(a):
    a = np.array(a, order="C")  # keeps 0-d arrays 0-d
    return npy_bytes(np.lib.format.dtype_to_descr(a.dtype), a.shape, a.tobytes())




def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def kill_daemon(m):
    """SIGKILL our daemon by PID, reap it, detach the dead mount.  The
    factory then only checks its log for sanitizer reports."""
    assert m.proc.poll() is None, f"daemon already exited with {m.proc.returncode}\n{m.log()[-4000:]}"
    os.kill(m.pid, signal.SIGKILL)
    rc = m.proc.wait(timeout=30)
    subprocess.call(["fusermount3", "-u", "-z", str(m.path)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    m.closed = True
    m.returncode = rc
    m.ready = b"killed"
    assert rc == -signal.SIGKILL, f"daemon exit status {rc}, not killed by SIGKILL"
    assert not U.is_mounted(m.path)


class Root:
    """A CheckpointManager root with committed step 10; remembers every
    committed step's arrays {rel: values} and its files on disk."""

    def __init__(self, mount, base):
        self.mount = mount
        self.src = Path(base) / "root"
        self.src.mkdir()
        self.steps = {}
        self.hashes = {}
        r = np.random.default_rng(10)
        exp = {"state/params/w.npy": r.standard_normal((64, 48)).astype(np.float32),
               "state/params/b.npy": r.standard_normal((48,)).astype(np.float32),
               "state/layers/0/k.npy": r.integers(-9, 9, size=(3, 5, 7), dtype=np.int16),
               "state/step.npy": np.array(10, dtype=np.int64)}
        m = mount(self.src)
        self.write_committed(m, "10", exp)
        m.unmount()

    def write_committed(self, m, step, exp):
        os.mkdir(m.p(step))
        write_arrays(m.p(step), exp)
        commit(m.p(step))
        self.add(step, exp)

    def add(self, step, exp):
        self.steps[step] = exp
        self.hashes[step] = tree_files(self.src / step)

    def check_after_kill(self, step, committed_ok=False, exp=None):
        """Remount; returns the new mount (and whether `step` is committed).
        Asserts everything the module docstring promises."""
        on_disk = sorted(os.listdir(self.src))
        committed = step in on_disk
        if committed:
            assert committed_ok, f"step {step} is on disk although the daemon died before its commit: {on_disk}"
            assert step + TMP not in on_disk, f"both {step} and its tmp folder exist: {on_disk}"
        else:
            assert step + TMP in on_disk, f"the pending step's tmp folder is gone: {on_disk}"
            (self.src / (step + TMP) / MARKER).write_text("left by the killed writer")
        m = self.mount(self.src)
        names = sorted(os.listdir(m.p()))
        want = sorted(self.steps) + ([step] if committed else [])
        want += ["latest"] if want else []  # the link to the newest committed step
        want += [] if committed else [step + TMP]  # the left-over folder: a pending step
        assert names == sorted(want), f"mount shows {names}, want {sorted(want)}"
        if committed:
            assert U.errno_of(os.stat, m.p(step + TMP)) == errno.ENOENT
        else:
            assert U.errno_of(os.stat, m.p(step)) == errno.ENOENT
            assert os.getxattr(m.p(step + TMP), "user.ckpt.leftover")
        # earlier steps: unchanged on disk, and byte for byte through the mount
        for s, e in self.steps.items():
            assert tree_files(self.src / s) == self.hashes[s], f"files of step {s} changed"
            for rel, v in e.items():
                assert read_bytes(m.p(f"{s}/{rel}")) == npy_of(v), f"{s}/{rel} reads back wrong"
        if committed:
            for rel, v in exp.items():
                assert read_bytes(m.p(f"{step}/{rel}")) == npy_of(v), f"committed {step}/{rel} reads back wrong"
            arrays, problems = V.verify(str(self.src / step))
            assert problems == []
            assert len(arrays) == len(exp)
            self.add(step, exp)
        return m, committed

    def reclaim(self, m, step, seed):
        """mkdir the same step name again on mount m: the stale tmp folder
        is replaced; the new step commits with only its own arrays."""
        os.mkdir(m.p(step))
        tmp = self.src / (step + TMP)
        assert tmp.is_dir()
        assert not (tmp / MARKER).exists(), "the stale tmp folder was not reclaimed"
        assert os.listdir(m.p(step)) == []
        r = np.random.default_rng(seed)
        exp = {"state/fresh.npy": r.standard_normal((10, 3)).astype(np.float32)}
        write_arrays(m.p(step), exp)
        commit(m.p(step))
        assert sorted(os.listdir(self.src)) == sorted(list(self.steps) + [step])
        assert sorted(os.listdir(self.src / step / "state")) == ["_METADATA", "_sharding", "commit_success.txt", "fresh"]
        for rel, v in exp.items():
            assert read_bytes(m.p(f"{step}/{rel}")) == npy_of(v)
        arrays, problems = V.verify(str(self.src / step))
        assert problems == [] and len(arrays) == 1
        self.add(step, exp)


def write_arrays(step_dir, exp):
    for rel, v in exp.items():
        d = Path(step_dir)
        for part in Path(rel).parent.parts:
            d = d / part
            if not d.exists():
                os.mkdir(d)
        np.save(Path(step_dir) / rel, v)


@pytest.fixture
def root(mount, tmp_path):
    return Root(mount, tmp_path)


# ---------------------------------------------------------------------------
# (a) after mkdir only

def test_kill_after_mkdir(root):
    m = root.mount(root.src)
    os.mkdir(m.p("30"))
    assert sorted(os.listdir(root.src)) == ["10", "30" + TMP]
    kill_daemon(m)
    m2, _ = root.check_after_kill("30")
    root.reclaim(m2, "30", 31)


def test_kill_after_mkdir_of_items(root):
    m = root.mount(root.src)
    os.mkdir(m.p("30"))
    os.mkdir(m.p("30/state"))
    os.mkdir(m.p("30/state/params"))
    kill_daemon(m)
    m2, _ = root.check_after_kill("30")
    root.reclaim(m2, "30", 32)


# ---------------------------------------------------------------------------
# (b) mid-way through writing slice files

def _paused_writer(jobs, pause_at, ready_w, go_r):
    """Write slice files (path, bytes) in order; at job index pause_at write
    only half of the file, report on ready_w, wait for a byte on go_r, then
    try to go on (the daemon is dead by then: errors are expected)."""
    code = 0
    try:
        for i, (path, data) in enumerate(jobs):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                if i == pause_at:
                    half = len(data) // 2
                    os.write(fd, data[:half])
                    os.write(ready_w, b"r")
                    os.read(go_r, 1)
                    os.write(fd, data[half:])
                else:
                    os.write(fd, data)
            finally:
                try:
                    os.close(fd)
                except OSError:
                    pass
    except OSError:
        code = 0  # the mount died under us: expected after the pause
    except BaseException:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        code = 1
    os._exit(code)


@pytest.mark.concurrent
def test_kill_mid_slice_writes(root):
    # a small write buffer: column slices of multi-MiB chunks force spills
    m = root.mount(root.src, "write_buffer=2M")
    os.mkdir(m.p("30"))
    os.mkdir(m.p("30/state"))
    r = np.random.default_rng(30)
    big = r.standard_normal((1536, 1024)).astype(np.float32)   # 6 MiB: several inner chunks
    rows = r.integers(0, 1 << 30, size=(97, 33), dtype=np.int32)
    st = m.p("30/state")
    mm = np.lib.format.open_memmap(st / "big.npy", mode="w+", dtype=big.dtype, shape=big.shape)
    del mm
    with open(st / "rows.npy", "wb") as f:
        f.write(npy_bytes("<i4", rows.shape))
    cols = [(0, 100), (100, 357), (357, 358), (358, 700), (700, 1024)]
    jobs_a = [(str(st / f"big[:,{a}:{b}].npy"), npy_of(big[:, a:b])) for a, b in cols]
    jobs_b = [(str(st / f"rows[{a}:{b}].npy"), npy_of(rows[a:b])) for a, b in ((0, 10), (10, 50), (50, 97))]
    procs, readys, gos = [], [], []
    for jobs, pause in ((jobs_a, 3), (jobs_b, 1)):
        rr, rw = os.pipe()
        gr, gw = os.pipe()
        p = FORK.Process(target=_paused_writer, args=(jobs, pause, rw, gr))
        p.start()
        os.close(rw)
        os.close(gr)
        procs.append(p)
        readys.append(rr)
        gos.append(gw)
    try:
        for rr in readys:
            ok, _, _ = select.select([rr], [], [], 120)
            assert ok and os.read(rr, 1) == b"r", "a writer did not reach its pause point"
        # both writers are in the middle of a slice file; earlier files are complete
        assert sorted(os.listdir(root.src)) == ["10", "30" + TMP]
        kill_daemon(m)
    finally:
        for gw in gos:
            os.write(gw, b"g")
            os.close(gw)
        for rr in readys:
            os.close(rr)
        for p in procs:
            p.join(60)
            if p.exitcode is None:
                p.kill()
                p.join()
    assert [p.exitcode for p in procs] == [0, 0], "a writer failed unexpectedly (traceback in stderr)"
    m2, _ = root.check_after_kill("30")
    root.reclaim(m2, "30", 33)


# ---------------------------------------------------------------------------
# (c) after all writes, before the commit

def test_kill_after_all_writes_before_commit(root):
    m = root.mount(root.src)
    os.mkdir(m.p("30"))
    r = np.random.default_rng(34)
    exp = {f"state/a{i}.npy": r.standard_normal((256, 256)).astype(np.float32) for i in range(6)}
    exp["state/params/w.npy"] = r.standard_normal((1200, 1024)).astype(np.float32)
    write_arrays(m.p("30"), exp)
    for rel, v in exp.items():  # complete, readable through the writing mount
        assert read_bytes(m.p("30/" + rel)) == npy_of(v)
    kill_daemon(m)
    m2, _ = root.check_after_kill("30")
    root.reclaim(m2, "30", 35)


# ---------------------------------------------------------------------------
# (d) during the commit

def big_step(seed, n=40):
    """Many arrays (many files to fsync at commit), ~20 MiB in all."""
    r = np.random.default_rng(seed)
    exp = {f"state/layers/{i}/w.npy": r.standard_normal((128, 1024)).astype(np.float32) for i in range(n)}
    exp["opt/count.npy"] = np.array(seed, dtype=np.int32)
    return exp


def first_file(tmp, name):
    """A poll for `name` anywhere below tmp (commit-time files)."""
    def found():
        for dirpath, _, files in os.walk(tmp):
            if name in files:
                return True
        return False
    return found


# When to kill: a delay after the commit request starts (seconds), or the
# moment a file written only by the commit appears in the tmp folder.
TRIGGERS = [("delay", 0.0), ("delay", 0.02), ("file", "zarr.json"), ("file", "_METADATA"),
            ("file", "commit_success.txt"), ("delay", 0.1), ("delay", 0.3)]


@pytest.mark.concurrent
def test_kill_during_commit(root, capsys):
    outcomes = []
    seed = 40
    for i, (kind, arg) in enumerate(TRIGGERS):
        step = str(40 + i)
        m = root.mount(root.src)
        os.mkdir(m.p(step))
        exp = big_step(seed + i)
        write_arrays(m.p(step), exp)
        tmp = root.src / (step + TMP)
        res = {}

        def do_commit():
            try:
                commit(m.p(step))
                res["rc"] = 0
            except OSError as e:
                res["rc"] = e.errno

        t = threading.Thread(target=do_commit)
        t.start()
        if kind == "delay":
            if arg:
                t.join(arg)
        else:
            poll = first_file(tmp, arg)
            give_up = time.monotonic() + 120  # a bound on the loop only; nothing is asserted on time
            while t.is_alive() and not poll() and time.monotonic() < give_up:
                pass
        kill_daemon(m)
        t.join(60)
        assert not t.is_alive(), "the commit call did not return after the daemon died"
        m2, committed = root.check_after_kill(step, committed_ok=True, exp=exp)
        outcomes.append((kind, arg, "committed" if committed else "not committed", res.get("rc")))
        if committed:
            assert U.errno_of(os.mkdir, m2.p(step)) == errno.EEXIST
        else:
            root.reclaim(m2, step, seed + 100 + i)
        m2.unmount()
    with capsys.disabled():
        print("\nkill during commit:", outcomes)
