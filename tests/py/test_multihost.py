"""Several hosts write one step over one shared root (lib/write/writer_hosts.h,
docs/format.md "Multi-host writes", docs/usage.md).

Four daemons are mounted over one backing folder with
-o process_index=I,process_count=4 (host 0 is the primary).  Writers on
every host write their own slices of shared arrays (whole chunks of one
host, chunks split across hosts, bfloat16 and float32, a 3-d array, an
array written by one host only, an array declared on a non-primary, an item
only one host knows), then every host creates commit_success.txt: every
mount reads back the expected bytes, and a fresh read-only mount and the
zarr v3 checker see a valid step.  Failure cases: a non-primary daemon
killed mid-save makes the commit fail naming that host, and a full retry
succeeds; the primary killed between "all done" and the rename leaves the
step absent (never half there), and a retry commits it.  The hosts are
simulated on one machine: a local folder stands in for the shared file
system (NFS on loopback is not available in this container, see
docs/usage.md).
"""

import io
import json
import os
import signal
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest

import ckfs_util as U
import zarr3_verify as V
from ckfs_help import makedirs_in_mount

pytestmark = pytest.mark.concurrent

N = 4
TMP = ".orbax-checkpoint-tmp"
HOSTS = TMP + ".hosts"


def npy_bytes(descr, shape, raw):
    f = io.BytesIO()
    np.lib.format.write_array_header_1_0(f, {"descr": descr, "fortran_order": False, "shape": tuple(shape)})
    return f.getvalue() + bytes(raw)


def bf16(r, shape):
    """bfloat16 bit patterns of finite values (as uint16)."""
    f = r.standard_normal(shape).astype(np.float32)
    return (f.view(np.uint32) >> 16).astype(np.uint16)


class Arr:
    def __init__(self, values, dtype, descr):
        self.values = np.ascontiguousarray(values)
        self.dtype = dtype
        self.descr = descr

    def file_bytes(self, sl=None):
        v = self.values if sl is None else np.ascontiguousarray(self.values[sl])
        return npy_bytes(self.descr, v.shape, v.tobytes())


def arrays(seed):
    r = np.random.default_rng(seed)
    return {
        # 16 MiB: 4 inner chunks of 1024 rows, one per host (whole chunks, one shard: copied)
        "state/big.npy": Arr(r.standard_normal((4096, 1024)).astype(np.float32), "float32", "<f4"),
        # 2 chunks, every one split by columns across all hosts (partial merges)
        "state/cols.npy": Arr(r.standard_normal((1100, 1024)).astype(np.float32), "float32", "<f4"),
        # small bf16 3-d array: one chunk, blocks from every host
        "state/blocks.npy": Arr(bf16(r, (6, 10, 8)), "bfloat16", "<V2"),
        # rows of a small f32 array, uneven
        "state/rows.npy": Arr(r.standard_normal((37, 29)).astype(np.float32), "float32", "<f4"),
        # written by host 2 alone: its whole shard file moves by rename
        "state/h2only.npy": Arr(r.standard_normal((5000, 300)).astype(np.float32), "float32", "<f4"),
        # declared on host 3, written by hosts 0 and 1
        "state/d3.npy": Arr(r.standard_normal((20, 6)).astype(np.float32), "float32", "<f4"),
        # an item only host 1 knows
        "opt/count.npy": Arr(np.arange(12, dtype=np.int32).reshape(3, 4), "int32", "<i4"),
    }


# host -> [(rel, slice text, numpy slice)]; the declarations come first (host, rel).
DECLARE = [(0, "state/big.npy"), (0, "state/cols.npy"), (0, "state/blocks.npy"), (0, "state/rows.npy"),
           (3, "state/d3.npy")]
PLAN = {
    0: [("state/big.npy", "[0:1024]", np.s_[0:1024]), ("state/cols.npy", "[:,0:300]", np.s_[:, 0:300]),
        ("state/blocks.npy", "[0:3,0:5]", np.s_[0:3, 0:5]), ("state/rows.npy", "[:5]", np.s_[0:5]),
        ("state/d3.npy", "[0:10]", np.s_[0:10]),
        # also a row of host 1's chunk: that chunk is partial on the primary, whole on host 1
        ("state/big.npy", "[1500]", np.s_[1500:1501])],
    1: [("state/big.npy", "[1024:2048]", np.s_[1024:2048]), ("state/cols.npy", "[:,300:301]", np.s_[:, 300:301]),
        ("state/blocks.npy", "[0:3,5:]", np.s_[0:3, 5:10]), ("state/rows.npy", "[5:17]", np.s_[5:17]),
        ("state/d3.npy", "[10:]", np.s_[10:20])],
    2: [("state/big.npy", "[2048:3072]", np.s_[2048:3072]), ("state/cols.npy", "[:,301:700]", np.s_[:, 301:700]),
        ("state/blocks.npy", "[3:,0:9]", np.s_[3:6, 0:9]), ("state/rows.npy", "[17]", np.s_[17:18])],
    3: [("state/big.npy", "[3072:]", np.s_[3072:4096]), ("state/cols.npy", "[:,700:]", np.s_[:, 700:1024]),
        ("state/blocks.npy", "[3:6,9:10]", np.s_[3:6, 9:10]), ("state/rows.npy", "[18:]", np.s_[18:37])],
}
WHOLE = {2: ["state/h2only.npy"], 1: ["opt/count.npy"]}  # written whole by one host


def slice_path(step, rel, text):
    return step / (rel[:-4] + text + ".npy")


def mkdirs(step, rel):
    """The folders of file rel in step (mkdir -p, one level at a time)."""
    makedirs_in_mount(step, Path(rel).parent)


def declare(step, rel, a, memmap):
    """Declare rel: open_memmap (which also writes the last byte as 0: only
    where a host's bytes win over it, see docs/usage.md) or a bare header."""
    if memmap:
        dt = np.dtype("V2") if a.dtype == "bfloat16" else a.values.dtype
        mm = np.lib.format.open_memmap(step / rel, mode="w+", dtype=dt, shape=a.values.shape)
        del mm
    else:
        with open(step / rel, "wb") as f:
            f.write(npy_bytes(a.descr, a.values.shape, b""))


def host_writes(step, host, exp, hosts_plan=PLAN):
    """Write host's share (two writer threads per host)."""
    jobs = []
    for rel, text, sl in hosts_plan.get(host, []):
        jobs.append((slice_path(step, rel, text), exp[rel].file_bytes(sl)))
    for rel in WHOLE.get(host, []):
        jobs.append((step / rel, exp[rel].file_bytes()))
    errs = []

    def run(js):
        try:
            for p, data in js:
                with open(p, "wb") as f:
                    f.write(data)
        except BaseException as e:  # noqa: BLE001
            errs.append(e)

    ts = [threading.Thread(target=run, args=(jobs[k::2],)) for k in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not errs, errs


def prepare(mounts, exp, step="30"):
    """mkdir the step and the folders on every host, then the declarations."""
    steps = [m.p(step) for m in mounts]
    for s in steps:
        os.mkdir(s)
    for h, s in enumerate(steps):
        rels = {rel for rel, _, _ in PLAN.get(h, [])} | set(WHOLE.get(h, [])) | {r for hh, r in DECLARE if hh == h}
        for rel in sorted(rels):
            mkdirs(s, rel)
    for h, rel in DECLARE:
        declare(steps[h], rel, exp[rel], memmap=(h == 0 and rel != "state/rows.npy"))
    return steps


def commit_all(steps, order=None):
    """Create commit_success.txt on every host at once; {host: errno or 0}."""
    res = {}

    def run(h):
        try:
            open(steps[h] / "commit_success.txt", "w").close()
            res[h] = 0
        except OSError as e:
            res[h] = e.errno

    order = order or list(range(len(steps) - 1, -1, -1))
    ts = [threading.Thread(target=run, args=(h,)) for h in order]
    for t in ts:
        t.start()
    for t in ts:
        t.join(300)
    return res


def write_all(mounts, exp):
    """prepare, then every host writes its share; the step folders."""
    steps = prepare(mounts, exp)
    for h in range(N):
        host_writes(steps[h], h, exp)
    return steps


def commit_and_check(mounts, src, exp, steps):
    """commit_all succeeds on every host, and the step is whole."""
    res = commit_all(steps)
    assert res == {h: 0 for h in range(N)}, (res, mounts[0].log()[-3000:])
    check_step(mounts, src, exp)


def start_hosts(factory, src, timeout=30, env=None):
    return [start_host(factory, src, h, timeout) for h in range(N)]


def start_host(factory, src, h, timeout=30):
    return factory(src, f"process_index={h}", f"process_count={N}", f"commit_timeout={timeout}")


def check_step(mounts, src, exp, step="30"):
    for m in mounts:
        for rel, a in exp.items():
            got = (m.p(step) / rel).read_bytes()
            assert got == a.file_bytes(), f"{m.path}: {rel} differs after the multi-host commit"
    assert sorted(os.listdir(src)) == [step], os.listdir(src)
    arrays_, problems = V.verify(str(Path(src) / step))
    assert problems == []
    for rel, a in exp.items():
        item, rest = rel.split("/", 1)
        got = arrays_[(item, rest[:-4].replace("/", "."))]
        assert got.tobytes() == a.values.tobytes(), rel
    cm = json.loads((Path(src) / step / "_CHECKPOINT_METADATA").read_text())
    assert set(cm["item_handlers"]) == {"state", "opt"}


def kill(factory, m):
    """SIGKILL a daemon (if still running), detach its mount, forget it."""
    if m.proc.poll() is None:
        os.kill(m.pid, signal.SIGKILL)
    m.proc.wait()
    subprocess.call(["fusermount3", "-u", "-z", str(m.path)])
    m.closed = True
    factory.mounts.remove(m)


@pytest.fixture
def src(tmp_path):
    d = tmp_path / "shared"
    d.mkdir()
    return d


def test_four_hosts_write_one_step(src, mount, tmp_path):
    exp = arrays(1)
    ms = start_hosts(mount, src)
    steps = write_all(ms, exp)
    # pending: only the tmp folder and the coordination folder, no step
    assert sorted(os.listdir(src)) == ["30" + TMP, "30" + HOSTS]
    commit_and_check(ms, src, exp, steps)
    # a read-only mount elsewhere sees the same step
    ro = mount(src, "ro")
    assert sorted(os.listdir(ro.p())) == ["30", "latest"]
    for rel, a in exp.items():
        assert (ro.p("30") / rel).read_bytes() == a.file_bytes(), rel
    # one chunk per shard file: big's chunks 2 and 3 (hosts 2, 3), h2only's two chunks (host 2)
    # and opt/count (host 1) moved by rename; big's chunk 1 (also partly on the primary) and
    # the split chunks merged through the write path
    assert "5 shard files moved, 0 chunks copied, 13 partial chunks merged" in ms[0].log(), ms[0].log()[-3000:]
    for m in ms:
        assert "failed" not in m.log(), m.log()[-3000:]


def test_conflicting_declaration_refused_on_later_host(src, mount):
    ms = start_hosts(mount, src)
    for m in ms[:2]:
        os.mkdir(m.p("40"))
        os.mkdir(m.p("40/state"))
    mm = np.lib.format.open_memmap(ms[0].p("40/state/w.npy"), mode="w+", dtype=np.float32, shape=(8, 4))
    del mm
    with pytest.raises(OSError):
        mm = np.lib.format.open_memmap(ms[1].p("40/state/w.npy"), mode="w+", dtype=np.float32, shape=(8, 5))
        del mm
    assert "declared it with another shape" in ms[1].log()
    # the same declaration is accepted
    mm = np.lib.format.open_memmap(ms[1].p("40/state/w.npy"), mode="w+", dtype=np.float32, shape=(8, 4))
    del mm


def test_killed_host_fails_commit_then_full_retry(src, mount):
    exp = arrays(2)
    ms = start_hosts(mount, src, timeout=3)
    steps = prepare(ms, exp)
    for h in (0, 1, 3):
        host_writes(steps[h], h, exp)
    # host 2 writes part of its share, then its daemon dies
    host_writes(steps[2], 2, exp, {2: PLAN[2][:1]})
    kill(mount, ms[2])
    res = commit_all([steps[0], steps[1], None, steps[3]], order=[3, 1, 0])
    assert set(res) == {0, 1, 3} and all(res[h] != 0 for h in res), res
    assert "hosts not done within 3 s: 2" in ms[0].log()
    for h in (1, 3):
        assert "hosts not done within 3 s: 2" in ms[h].log(), ms[h].log()[-2000:]
    assert "30" not in os.listdir(src)
    # full retry: a new daemon for host 2, every host aborts and writes again
    ms[2] = start_host(mount, src, 2, timeout=30)
    for h in (0, 1, 3):
        os.rmdir(steps[h])
    steps = write_all(ms, exp)
    commit_and_check(ms, src, exp, steps)


def test_primary_killed_before_rename_leaves_no_half_step(src, mount, tmp_path):
    exp = arrays(3)
    # the primary exits between "all hosts done" and its commit (fault hook)
    os.environ["CKPT_HOSTS_FAULT"] = "exit_before_rename"
    try:
        m0 = start_host(mount, src, 0, timeout=30)
    finally:
        del os.environ["CKPT_HOSTS_FAULT"]
    ms = [m0] + [start_host(mount, src, h, timeout=2) for h in range(1, N)]
    steps = write_all(ms, exp)
    res = commit_all(steps)
    assert all(res[h] != 0 for h in range(N)), res
    m0.proc.wait(timeout=30)
    assert m0.proc.returncode == 70
    kill(mount, m0)
    # after the crash: no step named 30, and a fresh mount shows none
    assert "30" not in os.listdir(src)
    ro = mount(src, "ro")
    assert os.listdir(ro.p()) == []
    ro.unmount()
    # the primary restarts; every host retries the whole step
    ms[0] = start_host(mount, src, 0, timeout=30)
    for h in range(1, N):
        os.rmdir(steps[h])
    steps = write_all(ms, exp)
    commit_and_check(ms, src, exp, steps)
