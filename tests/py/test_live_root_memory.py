"""A mount of a live CheckpointManager root that lives for months.

Training saves a step every few minutes and keeps the last few; a mount of
its root sees every one of them come and go.  The daemon's memory must
follow the live steps, not the history: once a step is pruned and the
kernel has forgotten its inodes, its nodes, arrays (their cached chunks
and stream cursors) and stores are freed, while readers keep stat'ing,
loading and slicing the live steps.  `.ckptfs/stats` counts the steps
freed (`steps_freed`).
"""
import errno
import json
import os
import shutil
import threading

import numpy as np
import pytest

import ckfs_util as U
from ckfs_help import TMP, _writable_copy

KEEP = 3
W1 = "state/params/layer_0/mlp/w1"            # f32 [32, 128]
Q = "state/params/layer_0/attn/q_proj.npy"    # f32 [32, 48]
GONE = (errno.ENOENT, errno.ESTALE, errno.EIO)
# Saves before the first and the second RSS figure.  Each step read costs
# about 100-125 KiB while it is kept (its nodes, arrays, OCDBT store), so
# 300 saves that are never freed grow the daemon by about 33 MiB.
FIRST, SECOND = 100, 400
# VmRSS growth allowed from FIRST to SECOND saves: the allocator settling
# (arenas of the daemon's threads; up to 7 MiB in some runs, mostly 1-2 MiB)
# and the steps alive at either moment (KEEP plus those whose forget is on
# its way); measured: see docs/reliability.md ("What a pruned step leaves
# behind").
GROWTH_BOUND = 12 << 20
# Steps saved but not yet freed at the end, once the readers stopped and the
# kernel was given time to send its forgets: the KEEP live ones, and a few
# whose entries wait for their invalidation.
ALIVE_BOUND = KEEP + 2


def _steps(mnt):
    try:
        return sorted(int(x) for x in os.listdir(mnt) if x.isdigit())
    except OSError:
        return []


def _reader(mnt, want, seed, stop, errors, done):
    """stat, np.load and slice names of the live steps, until stop.  A step
    pruned meanwhile may fail (an error, or a short read: the file's pages
    were dropped); what is read is the step's data."""
    rnd = np.random.default_rng(seed)
    w1 = None
    while not stop.is_set():
        s = _steps(mnt)
        if not s:
            continue
        step = int(rnd.choice(s))
        try:
            os.stat(f"{mnt}/{step}/state")
            a = np.load(f"{mnt}/{step}/{Q}")
            assert np.array_equal(a, want), f"step {step}: wrong bytes in {Q}"
            w1 = np.load(f"{mnt}/{step}/{W1}.npy") if w1 is None else w1
            r0 = int(rnd.integers(0, 31))
            c0 = int(rnd.integers(0, 127))
            p = f"{mnt}/{step}/{W1}[{r0}:{r0 + 1},{c0}:{c0 + 1}].npy"
            os.stat(p)
            assert np.array_equal(np.load(p), w1[r0:r0 + 1, c0:c0 + 1]), f"step {step}: wrong slice {p}"
            os.listdir(f"{mnt}/{step}/state/params/layer_0")
            done[0] += 1
        except OSError as e:
            if e.errno not in GONE:
                errors.append(e)
                return
        except ValueError as e:  # a short read (np.load): only of a pruned step
            if step in _steps(mnt):
                errors.append(e)
                return
        except Exception as e:  # noqa: BLE001  reported by the test thread
            errors.append(e)
            return


def _freed(m):
    return json.loads(U.read_all(m.p(".ckptfs/stats"))).get("steps_freed", 0)


@pytest.mark.ocdbt
@pytest.mark.concurrent
def test_memory_follows_the_live_steps_not_the_history(tmp_path, mount, monkeypatch):
    """Save the fixture step SECOND times into a live root keeping KEEP,
    with readers running: the daemon's RSS after SECOND saves is that after
    FIRST (within GROWTH_BOUND), and every pruned step is freed."""
    tpl = tmp_path / "tpl"
    _writable_copy(U.FIXTURES / "manager" / "10", tpl)
    root = tmp_path / "root"
    root.mkdir()

    def save(n):
        tmp = root / f"{n}{TMP}"
        shutil.copytree(tpl, tmp)
        os.rename(tmp, root / str(n))
        for old in sorted(int(x) for x in os.listdir(root) if x.isdigit())[:-KEEP]:
            shutil.rmtree(root / str(old))

    for n in range(1, KEEP + 1):
        save(n)
    # Two malloc arenas: on a loaded machine the FUSE loop starts more
    # worker threads, each with an arena of its own, and their settling
    # (14 MiB in one CI run at load 8, against 1-6 MiB when quiet) would
    # hide what this measures: memory that follows the history.
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")
    m = mount(root)
    mnt = str(m.p())
    want = np.load(m.p(f"1/{Q}"))
    stop = threading.Event()
    errors, done = [], [0]
    readers = [threading.Thread(target=_reader, args=(mnt, want, k, stop, errors, done)) for k in range(2)]
    for t in readers:
        t.start()
    rss = {}
    try:
        for n in range(KEEP + 1, SECOND + 1):
            save(n)
            _steps(mnt)  # a rescan: the new step appears, the pruned one goes
            # the newest step is read for sure (the readers pick at random)
            assert np.array_equal(np.load(f"{mnt}/{n}/{Q}"), want)
            if n in (FIRST, SECOND):
                rss[n] = U.vm(m.pid, "VmRSS")
            assert not errors, errors
    finally:
        stop.set()
        for t in readers:
            t.join(timeout=60)
    assert not errors, errors
    assert done[0] > 0
    if not U.sanitized():
        grew = rss[SECOND] - rss[FIRST]
        assert grew <= GROWTH_BOUND, (f"VmRSS grew {grew >> 10} KiB from {FIRST} to {SECOND} saves "
                                      f"(bound {GROWTH_BOUND >> 10} KiB): the daemon keeps pruned steps")
    # With the readers gone, the kernel forgets the pruned steps' inodes
    # once their entries are invalidated: all but the live ones are freed.
    U.wait_until(lambda: SECOND - _freed(m) <= ALIVE_BOUND, timeout=30)
    alive = SECOND - _freed(m)
    print(f"VmRSS after {FIRST} saves {rss[FIRST] >> 10} KiB, after {SECOND} {rss[SECOND] >> 10} KiB; "
          f"steps alive {alive}")
    assert alive <= ALIVE_BOUND, (f"{alive} of {SECOND} steps saved are still held by the daemon "
                                  f"({KEEP} are live): pruned steps are not freed")
    # what is live still reads right
    s = _steps(mnt)
    assert s == list(range(SECOND - KEEP + 1, SECOND + 1)), s
    for st in s:
        assert np.array_equal(np.load(f"{mnt}/{st}/{Q}"), want)
