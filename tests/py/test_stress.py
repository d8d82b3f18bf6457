"""Bounded stress test: keep it proven under load.

One writable mount of a CheckpointManager root holding four committed steps
(5: zarr v2, 7: zarr v3, 10 and 20: zarr v2 in OCDBT), with a small
decoded-chunk cache and a small write buffer.  At the same time:

- 32 reader processes, each doing READER_OPS random operations: whole
  .npy files, random pread ranges of them, slice files of random boxes,
  preads of tensors in X.safetensors and in the sharded X.safetensors.d/
  form, NAME.shards/ files, metadata files, directory listings, and random
  names that must fail with ENOENT or EINVAL;
- 4 writer processes writing WRITE_ROUNDS new steps together (one declares
  the shared arrays, all four write row slices of them and whole arrays of
  their own; the first commits; all four read back what they wrote).

Checked: zero wrong bytes, zero unexpected errors, every written step
reads back byte for byte and passes the independent zarr v3 checker, the
daemon's peak resident set (VmHWM) stays within cache_size + write_buffer +
STRESS_SLACK (not checked under sanitizers), and the daemon unmounts
cleanly with exit code 0 and a log free of sanitizer reports.

Bounded by operation counts (about a minute on two cores; no wall-clock
assertions).  CKPT_STRESS_SCALE=0.2 runs a fifth of the operations.  Run it
under ASan and TSan builds too (CKPT_BIN=<build>/ckptfs).
"""

import errno
import io
import json
import multiprocessing
import os
import random
import shutil
import traceback
from pathlib import Path

import numpy as np
import pytest

import ckfs_util as U
import zarr3_verify as V

pytestmark = [pytest.mark.stress, pytest.mark.concurrent]

FORK = multiprocessing.get_context("fork")
MiB = 1 << 20
SCALE = float(os.environ.get("CKPT_STRESS_SCALE", "1"))
N_READERS = 32
N_WRITERS = 4
READER_OPS = max(10, int(2500 * SCALE))
WRITE_ROUNDS = max(1, int(20 * SCALE))
CACHE_SIZE = 256 << 10          # -o cache_size
WRITE_BUFFER = 32 * MiB         # -o write_buffer
ST_SHARD = 16 << 10             # -o safetensors_shard_size: X.safetensors.d/ for every params tree
# What the daemon may hold beyond its two configured budgets: FUSE request
# buffers and thread stacks of ~36 busy clients, decode and zstd contexts,
# the view of four steps, allocator slack.  docs/reliability.md names it.
STRESS_SLACK = 96 * MiB


# ---------------------------------------------------------------------------
# what the mount must show

class Truth:
    """Everything a reader checks against, built before the fork."""

    def __init__(self, root, expected):
        self.arrays = {}     # rel in mount -> (raw bytes, shape, itemsize)
        self.files = {}      # rel in mount -> bytes (metadata files)
        self.dirs = []       # rel dirs with arrays
        self.st_views = {}   # "10/state/params" -> {tensor name: array rel}
        lays = [("5/", U.layout("pytree_zarr2", root / "5")), ("7/", U.layout("pytree_zarr3", root / "7")),
                ("", U.layout("manager", root))]
        for pre, lay in lays:
            for rel, a in lay.arrays.items():
                e = expected[a.key]
                self.arrays[pre + rel] = (e.data, tuple(e.shape), np.dtype(e.descr).itemsize)
            for rel, src in lay.files.items():
                self.files[pre + rel] = Path(src).read_bytes()
        for rel in self.arrays:
            d = os.path.dirname(rel)
            if d not in self.dirs:
                self.dirs.append(d)
        for x in ("5/params", "7/params", "7/opt_state", "10/state/params", "20/state/params", "20/state/opt_state"):
            names = {}
            for rel in self.arrays:
                if rel.startswith(x + "/"):
                    names[rel[len(x) + 1:-4].replace("/", ".")] = rel
            assert names, x
            self.st_views[x] = names
        self.rels = sorted(self.arrays)

    def values(self, rel):
        raw, shape, isz = self.arrays[rel]
        dt = {1: "<u1", 2: "<u2", 4: "<u4", 8: "<u8"}[isz]
        return np.frombuffer(raw, dtype=dt).reshape(shape)


def npy_data(buf):
    hl = U.parse_npy_header(buf[:4096])[1]
    return buf[hl:], U.parse_npy_header(buf[:4096])[2]


def st_header(f):
    n = int.from_bytes(os.pread(f.fileno(), 8, 0), "little")
    return 8 + n, json.loads(os.pread(f.fileno(), n, 8))


# ---------------------------------------------------------------------------
# readers

class Wrong(AssertionError):
    pass


def check(cond, what):
    if not cond:
        raise Wrong(what)


def rand_box(r, shape):
    box = []
    for n in shape:
        a = r.randrange(n)
        b = r.randrange(a + 1, n + 1)
        box.append((a, b))
    return box


def op_whole(mnt, t, r):
    rel = r.choice(t.rels)
    raw, shape, _ = t.arrays[rel]
    buf = U.read_all(mnt / rel)
    data, sh = npy_data(buf)
    check(sh == shape, f"{rel}: header shape {sh} != {shape}")
    check(data == raw, f"{rel}: whole-file bytes differ")


def op_pread(mnt, t, r):
    rel = r.choice(t.rels)
    raw, _, _ = t.arrays[rel]
    with open(mnt / rel, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        hl = size - len(raw)
        for _ in range(4):
            off = r.randrange(len(raw) + 1)
            n = r.randrange(1, 9000)
            got = os.pread(f.fileno(), n, hl + off)
            check(got == raw[off:off + n], f"{rel}: pread({n}, data offset {off}) differs")


def op_slice(mnt, t, r):
    rel = r.choice([x for x in t.rels if t.arrays[x][1]])
    shape = t.arrays[rel][1]
    box = rand_box(r, shape)
    name = rel[:-4] + "[" + ",".join(f"{a}:{b}" for a, b in box) + "].npy"
    buf = U.read_all(mnt / name)
    data, sh = npy_data(buf)
    want = np.ascontiguousarray(t.values(rel)[tuple(slice(a, b) for a, b in box)])
    check(sh == want.shape, f"{name}: shape {sh} != {want.shape}")
    check(data == want.tobytes(), f"{name}: slice bytes differ")


def op_safetensors(mnt, t, r):
    x = r.choice(sorted(t.st_views))
    with open(mnt / (x + ".safetensors"), "rb") as f:
        base, hdr = st_header(f)
        names = [k for k in hdr if k != "__metadata__"]
        check(sorted(names) == sorted(t.st_views[x]), f"{x}.safetensors: tensors {sorted(names)}")
        for name in r.sample(names, min(3, len(names))):
            b, e = hdr[name]["data_offsets"]
            raw = t.arrays[t.st_views[x][name]][0]
            check(e - b == len(raw), f"{x}.safetensors:{name}: {e - b} bytes")
            off = r.randrange(len(raw))
            n = r.randrange(1, len(raw) - off + 1)
            got = os.pread(f.fileno(), n, base + b + off)
            check(got == raw[off:off + n], f"{x}.safetensors:{name}: pread({n}, {off}) differs")


def op_safetensors_d(mnt, t, r):
    x = r.choice(sorted(t.st_views))
    d = mnt / (x + ".safetensors.d")
    idx = json.loads(U.read_all(d / "model.safetensors.index.json"))
    wm = idx["weight_map"]
    check(sorted(wm) == sorted(t.st_views[x]), f"{d}: weight_map {sorted(wm)}")
    name = r.choice(sorted(wm))
    with open(d / wm[name], "rb") as f:
        base, hdr = st_header(f)
        b, e = hdr[name]["data_offsets"]
        raw = t.arrays[t.st_views[x][name]][0]
        got = os.pread(f.fileno(), e - b, base + b)
        check(got == raw, f"{d}/{wm[name]}:{name} differs")


def op_shards(mnt, t, r):
    rel = r.choice([x for x in t.rels if t.arrays[x][1]])
    d = mnt / (rel[:-4] + ".shards")
    names = os.listdir(d)
    check(names, f"{d}: empty")
    n = r.choice(names)
    box = [tuple(int(v) for v in p.split(":")) for p in n[1:-5].split(",")]
    buf = U.read_all(d / n)
    data, _ = npy_data(buf)
    want = np.ascontiguousarray(t.values(rel)[tuple(slice(a, b) for a, b in box)])
    check(data == want.tobytes(), f"{d}/{n}: bytes differ")


def op_meta(mnt, t, r):
    rel = r.choice(sorted(t.files))
    check(U.read_all(mnt / rel) == t.files[rel], f"{rel}: metadata bytes differ")
    d = r.choice(t.dirs)
    os.listdir(mnt / d) if d else os.listdir(mnt)


JUNK = ["x", "1:2:3", "::2", "a:b", "0:1,0:1,0:1,0:1,0:1,0:1", "99999999999999999999", " 0:1", "0:1,", "...",
        "-", "0:-0:1"]


def op_bad_name(mnt, t, r):
    rel = r.choice(t.rels)
    stem = rel[:-4]
    k = r.randrange(5)
    if k == 0:
        name, ok = f"{stem}[{r.choice(JUNK)}].npy", (errno.EINVAL, errno.ENOENT)
    elif k == 1:
        big = r.randrange(10**6, 10**9)
        # out of range: ENOENT; on a 0-d array any index is one dimension too many: EINVAL
        name, ok = f"{stem}[{big}:{big + 1}].npy", (errno.ENOENT,) if t.arrays[rel][1] else (errno.EINVAL,)
    elif k == 2:
        name, ok = f"{os.path.dirname(rel)}/nosuch{r.randrange(10**9)}.npy", (errno.ENOENT,)
    elif k == 3:
        name, ok = f"{os.path.dirname(rel)}/nosuch{r.randrange(10**9)}.safetensors", (errno.ENOENT,)
    else:
        name, ok = f"{stem}.shards/[{r.randrange(10**6)}:{r.randrange(10**6, 10**7)}].npy", (errno.ENOENT,)
    try:
        U.read_all(mnt / name)
    except OSError as e:
        check(e.errno in ok, f"{name}: errno {e.errno} ({os.strerror(e.errno)}), want one of {ok}")
        return
    raise Wrong(f"{name}: opened and read, expected an error")


OPS = [(op_whole, 3), (op_pread, 3), (op_slice, 4), (op_safetensors, 2), (op_safetensors_d, 1), (op_shards, 2),
       (op_meta, 1), (op_bad_name, 2)]


def reader(k, mnt, t, out, start):
    r = random.Random(1000 + k)
    ops = [f for f, w in OPS for _ in range(w)]
    res = {"ops": 0, "errors": []}
    try:
        start.wait(timeout=120)
        for _ in range(READER_OPS):
            f = r.choice(ops)
            try:
                f(mnt, t, r)
            except Exception as e:  # noqa: BLE001 - every failure is reported
                res["errors"].append(f"{f.__name__}: {e!r}")
                if len(res["errors"]) > 20:
                    break
            res["ops"] += 1
    except BaseException:  # noqa: BLE001
        res["errors"].append(traceback.format_exc())
    Path(out).write_text(json.dumps(res))
    os._exit(0)


# ---------------------------------------------------------------------------
# writers

SHARED = {"w0": ((256, 96), "<f4"), "w1": ((2048, 1024), "<f4"), "w2": ((64, 7, 5), "<i2"), "w3": ((1024, 600), "<u2")}


def shared_values(rnd, name):
    shape, dt = SHARED[name]
    g = np.random.default_rng([rnd, sum(map(ord, name))])
    if dt == "<f4":
        return g.standard_normal(shape).astype(dt)
    return g.integers(0, 30000, size=shape).astype(dt)


def own_values(rnd, k):
    g = np.random.default_rng([rnd, 77, k])
    return g.standard_normal((100 + 13 * k, 33)).astype("<f8")


def step_name(rnd):
    return str(100 + rnd)


def writer(k, mnt, out, start, barrier):
    res = {"errors": []}
    try:
        start.wait(timeout=120)
        for rnd in range(WRITE_ROUNDS):
            step = mnt / step_name(rnd)
            st = step / "state"
            if k == 0:
                os.mkdir(step)
                os.mkdir(st)
                os.mkdir(st / "shared")
                for name, (shape, dt) in SHARED.items():
                    mm = np.lib.format.open_memmap(st / "shared" / (name + ".npy"), mode="w+", dtype=dt, shape=shape)
                    del mm
            barrier.wait(timeout=300)
            os.mkdir(st / f"own{k}")
            np.save(st / f"own{k}" / "a.npy", own_values(rnd, k))
            for name, (shape, dt) in SHARED.items():
                rows = shape[0] // N_WRITERS
                v = shared_values(rnd, name)[k * rows:(k + 1) * rows]
                buf = io.BytesIO()
                np.save(buf, np.ascontiguousarray(v))
                with open(st / "shared" / f"{name}[{k * rows}:{(k + 1) * rows}].npy", "wb") as f:
                    f.write(buf.getvalue())
            barrier.wait(timeout=300)
            if k == 0:
                open(step / "commit_success.txt", "w").close()
            barrier.wait(timeout=300)
            got = np.load(st / f"own{k}" / "a.npy")
            if got.tobytes() != own_values(rnd, k).tobytes():
                res["errors"].append(f"round {rnd}: own{k}/a.npy reads back wrong")
            for name in SHARED:
                got = np.load(st / "shared" / (name + ".npy"))
                if got.tobytes() != shared_values(rnd, name).tobytes():
                    res["errors"].append(f"round {rnd}: shared/{name}.npy reads back wrong")
    except BaseException:  # noqa: BLE001
        res["errors"].append(traceback.format_exc())
        barrier.abort()
    Path(out).write_text(json.dumps(res))
    os._exit(0)


# ---------------------------------------------------------------------------

def build_root(root):
    root.mkdir()
    shutil.copytree(U.FIXTURES / "pytree_zarr2", root / "5")
    shutil.copytree(U.FIXTURES / "pytree_zarr3", root / "7")
    for s in ("10", "20"):
        shutil.copytree(U.FIXTURES / "manager" / s, root / s)


class Run:
    pass


@pytest.fixture(scope="module")
def stress_run(tmp_path_factory, expected):
    """Run the whole load once; the tests below check its parts."""
    tmp_path = tmp_path_factory.mktemp("stress")
    root = tmp_path / "root"
    build_root(root)
    t = Truth(root, expected)
    factory = U.MountFactory(tmp_path / "mounts")
    run = Run()
    run.root = root
    try:
        m = factory(root, f"cache_size={CACHE_SIZE}", f"write_buffer={WRITE_BUFFER}",
                    f"safetensors_shard_size={ST_SHARD}")
        mnt = m.p()
        res_dir = tmp_path / "results"
        res_dir.mkdir()
        start = FORK.Barrier(N_READERS + N_WRITERS + 1)
        wbar = FORK.Barrier(N_WRITERS)
        procs = []
        for k in range(N_READERS):
            procs.append(FORK.Process(target=reader, args=(k, mnt, t, res_dir / f"r{k}.json", start)))
        for k in range(N_WRITERS):
            procs.append(FORK.Process(target=writer, args=(k, mnt, res_dir / f"w{k}.json", start, wbar)))
        for p in procs:
            p.start()
        start.wait(timeout=120)
        for p in procs:
            p.join(900)
        run.hung = [p.pid for p in procs if p.exitcode is None]
        for p in procs:
            if p.exitcode is None:
                p.kill()
                p.join()
        run.exitcodes = [p.exitcode for p in procs]
        run.errors, run.ops = [], 0
        for k in range(N_READERS):
            f = res_dir / f"r{k}.json"
            r = json.loads(f.read_text()) if f.exists() else {"ops": 0, "errors": ["no result"]}
            run.ops += r["ops"]
            run.errors += [f"reader {k}: {e}" for e in r["errors"]]
        for k in range(N_WRITERS):
            f = res_dir / f"w{k}.json"
            r = json.loads(f.read_text()) if f.exists() else {"errors": ["no result"]}
            run.errors += [f"writer {k}: {e}" for e in r["errors"]]
        run.hwm = U.vm(m.pid)
        print(f"stress: {run.ops} reader operations, {WRITE_ROUNDS} steps written by {N_WRITERS} writers, "
              f"daemon VmHWM {run.hwm / MiB:.1f} MiB")
        run.unmount_error = None
        try:
            m.unmount()      # exit code 0, not mounted, no sanitizer report in the log
        except AssertionError as e:
            run.unmount_error = str(e)
        run.returncode = m.returncode
    finally:
        factory.close()
    return run


def test_stress_no_wrong_bytes_no_errors(stress_run):
    r = stress_run
    assert r.hung == [], f"processes still running after 900 s: {r.hung}"
    assert r.exitcodes == [0] * (N_READERS + N_WRITERS)
    assert r.errors == [], f"{len(r.errors)} errors, first ones:\n" + "\n".join(r.errors[:20])
    assert r.ops == N_READERS * READER_OPS


def test_stress_written_steps_read_back(stress_run):
    root = stress_run.root
    steps = sorted(os.listdir(root))
    want_steps = sorted(["5", "7", "10", "20"] + [step_name(r) for r in range(WRITE_ROUNDS)])
    assert steps == want_steps, steps
    for rnd in range(WRITE_ROUNDS):
        s = step_name(rnd)
        arrays, problems = V.verify(str(root / s))
        assert problems == [], f"step {s}: {problems}"
        for name in SHARED:
            assert arrays[("state", "shared." + name)].tobytes() == shared_values(rnd, name).tobytes(), (s, name)
        for k in range(N_WRITERS):
            assert arrays[("state", f"own{k}.a")].tobytes() == own_values(rnd, k).tobytes(), (s, k)


def test_stress_clean_unmount(stress_run):
    assert stress_run.unmount_error is None, stress_run.unmount_error
    assert stress_run.returncode == 0


def test_stress_memory_within_budget(stress_run):
    if U.sanitized():
        pytest.skip("memory figures are meaningless under sanitizers")
    hwm = stress_run.hwm
    budget = CACHE_SIZE + WRITE_BUFFER + STRESS_SLACK
    assert hwm <= budget, (f"daemon VmHWM {hwm / MiB:.0f} MiB > cache_size {CACHE_SIZE >> 10} KiB + "
                           f"write_buffer {WRITE_BUFFER // MiB} MiB + slack {STRESS_SLACK // MiB} MiB")
