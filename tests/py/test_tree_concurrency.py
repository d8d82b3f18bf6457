"""The namespace stays usable while a step commits (lib/tree: the commit
does not hold the mount-wide namespace lock while it drains and fsyncs).

The commit is held at a known point without any timing: before the commit,
the test replaces the item's commit_success.txt in the step's tmp folder
(in the source, beneath the mount) by a FIFO.  The writer's commit opens
that file for writing, and open() of a FIFO blocks until a reader opens it;
so the commit call is provably in progress, inside the daemon, until the
test opens the FIFO.  While it is held, `ls` of the root and of the pending
step, and a read of an array of ANOTHER committed step, must answer.  On a
daemon that holds the namespace lock for the whole commit they block until
the commit returns, which the test reports as a failure (it then releases
the commit so that nothing hangs).

After the release the commit fails (fsync of a FIFO), the step stays
pending, and a second commit (FIFO removed) succeeds: the failure path of
the unlocked commit is exercised too.
"""

import os
import threading

import numpy as np
import pytest

import ckfs_util as U

TMP = ".orbax-checkpoint-tmp"
# Only a bound for reporting a failure (the old daemon blocks forever while
# the commit is held); a passing run never waits on it.
HANG = 30.0


class Call(threading.Thread):
    """Run fn() in a thread; .done is set when it returned or raised."""

    def __init__(self, fn):
        super().__init__(daemon=True)
        self.fn = fn
        self.done = threading.Event()
        self.result = None
        self.error = None
        self.start()

    def run(self):
        try:
            self.result = self.fn()
        except BaseException as e:  # reported by the test
            self.error = e
        finally:
            self.done.set()


def wait_for(event, what):
    assert event.wait(HANG), f"{what} did not return within {HANG}s"


@pytest.mark.concurrent
def test_ls_and_read_answer_while_a_commit_is_held(mount, tmp_path):
    src = tmp_path / "root"
    src.mkdir()
    m = mount(src)

    # step 1: committed, the one read during the other commit
    os.mkdir(m.p("1"))
    os.mkdir(m.p("1/state"))
    a1 = np.arange(4096, dtype=np.float32).reshape(64, 64)
    np.save(m.p("1/state/w.npy"), a1)
    open(m.p("1/commit_success.txt"), "w").close()

    # step 2: pending, many arrays so that the commit has real work too
    os.mkdir(m.p("2"))
    os.mkdir(m.p("2/state"))
    r = np.random.default_rng(2)
    arrays = {f"a{i:03d}.npy": r.standard_normal((32, 33)).astype(np.float32) for i in range(64)}
    for name, a in arrays.items():
        np.save(m.p("2/state/" + name), a)

    # hold the commit: the item's commit_success.txt becomes a FIFO
    fifo = src / ("2" + TMP) / "state" / "commit_success.txt"
    assert fifo.parent.is_dir(), sorted(os.listdir(src))
    os.mkfifo(fifo)

    def do_commit():
        open(m.p("2/commit_success.txt"), "w").close()

    commit = Call(do_commit)

    # The commit cannot return before the FIFO is opened for reading, so
    # everything below runs while it is in progress.  Wait until the daemon
    # is inside the commit: one of its threads is blocked opening the FIFO.
    def writer_blocked_on_fifo():
        # a thread blocked in open() of a FIFO waits in the kernel's
        # wait_for_partner (fs/pipe.c)
        for t in os.listdir(f"/proc/{m.pid}/task"):
            try:
                with open(f"/proc/{m.pid}/task/{t}/wchan") as f:
                    if f.read().strip() in ("wait_for_partner", "fifo_open"):
                        return True
            except OSError:
                pass
        return False

    assert U.wait_until(lambda: writer_blocked_on_fifo() or commit.done.is_set(), timeout=HANG), \
        "the commit never reached the held file"
    assert not commit.done.is_set(), f"the commit returned while held: {commit.error!r}"

    ls_root = Call(lambda: sorted(os.listdir(m.p())))
    ls_step = Call(lambda: sorted(os.listdir(m.p("2/state"))))
    read1 = Call(lambda: np.load(m.p("1/state/w.npy")))
    try:
        for what, c in (("ls of the root", ls_root), ("ls of the pending step", ls_step),
                        ("a read of step 1", read1)):
            wait_for(c.done, what + " during a held commit")
            assert c.error is None, f"{what}: {c.error!r}"
        # the commit is still held: the answers came while it ran
        assert not commit.done.is_set()
        assert ls_root.result == ["1", "2", "latest"]
        assert ls_step.result == sorted(arrays)
        assert np.array_equal(read1.result, a1)
    finally:
        # release the commit (open for reading, drain, close)
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        try:
            wait_for(commit.done, "the commit after its release")
        finally:
            os.close(fd)

    # The held file was a FIFO: that commit failed and the step stays pending.
    assert isinstance(commit.error, OSError), commit.error
    assert sorted(os.listdir(m.p())) == ["1", "2", "latest"]
    os.unlink(fifo)
    open(m.p("2/commit_success.txt"), "w").close()
    assert sorted(os.listdir(src)) == ["1", "2"]
    for name, a in list(arrays.items())[:4]:
        assert np.array_equal(np.load(m.p("2/state/" + name)), a)
    assert np.array_equal(np.load(m.p("1/state/w.npy")), a1)
