"""Every array file of a read-only mount, byte for byte, through every
read path a user has: read(), cat, np.load, np.load(mmap_mode='r'),
random pread()s, and many concurrent readers."""

import gc
import hashlib
import json
import os
import random
import subprocess
import sys
import threading

import numpy as np
import pytest

import ckfs_util as U
import conftest


def test_expected_files_match_their_sha256(expected):
    """Guards the fixtures themselves (a corrupt copy would fail everything else)."""
    for key, e in expected.items():
        assert hashlib.sha256(e.data).hexdigest() == e.sha256, key
        assert len(e.data) == int(np.prod(e.shape, dtype=np.int64)) * (2 if e.dtype == "bfloat16" else np.dtype(e.descr).itemsize)


def check_header(rel, whole, exp):
    """The .npy header of `whole` (the file's bytes): v1.0, 64-aligned, the
    array's shape, C order, the documented descr.  Returns its length."""
    version, hl, shape, fortran, dtype, text = U.parse_npy_header(whole)
    assert version == (1, 0), f"{rel}: npy version {version}"
    assert hl % 64 == 0, f"{rel}: data starts at {hl}, not on a 64-byte boundary"
    assert text.endswith("\n"), f"{rel}: header does not end with a newline"
    assert shape == exp.shape, f"{rel}: header shape {shape} != {exp.shape}"
    assert fortran is False, f"{rel}: fortran_order"
    assert dtype == exp.np_dtype, f"{rel}: header dtype {dtype} != {exp.np_dtype}"
    assert f"'descr': '{exp.descr}'" in text, f"{rel}: header {text!r} lacks descr {exp.descr!r}"
    return hl


def test_read_whole_files(lm, expected):
    lay, m = lm
    assert lay.arrays
    for rel, a in sorted(lay.arrays.items()):
        exp = expected[a.key]
        whole = U.read_all(m.p(rel))
        hl = check_header(rel, whole, exp)
        assert len(whole) == os.stat(m.p(rel)).st_size, rel
        assert whole[hl:] == exp.data, f"{rel}: data differs from expected/{a.key}"


def test_cat(lm, expected):
    lay, m = lm
    for rel, a in sorted(lay.arrays.items()):
        r = subprocess.run(["cat", str(m.p(rel))], capture_output=True, timeout=120)
        assert r.returncode == 0, r.stderr
        hl = check_header(rel, r.stdout, expected[a.key])
        assert r.stdout[hl:] == expected[a.key].data, rel


@pytest.mark.parametrize("mmap_mode", [None, "r"])
def test_np_load(lm, expected, mmap_mode):
    lay, m = lm
    for rel, a in sorted(lay.arrays.items()):
        exp = expected[a.key]
        arr = np.load(m.p(rel), mmap_mode=mmap_mode, allow_pickle=False)
        try:
            assert arr.shape == exp.shape, rel
            assert arr.dtype == exp.np_dtype, f"{rel}: {arr.dtype} != {exp.np_dtype}"
            assert arr.tobytes() == exp.data, rel
            if exp.dtype == "bfloat16":
                # the documented way back to bf16 bit patterns: .view()
                assert np.array_equal(arr.view("<u2"), exp.array()), rel
            else:
                assert np.array_equal(arr, exp.array()), rel
        finally:
            del arr
            gc.collect()  # drop the mapping so that the mount can be unmounted


def test_random_preads(lm, expected):
    lay, m = lm
    for rel, a in sorted(lay.arrays.items()):
        exp = expected[a.key]
        fd = os.open(m.p(rel), os.O_RDONLY)
        try:
            head = os.pread(fd, 4096, 0)
            hl = check_header(rel, head, exp)
            full = head[:hl] + exp.data
            size = len(full)
            rng = random.Random(f"{lay.name}/{rel}")
            for i in range(200):
                kind = i % 4
                if kind == 0:    # anywhere, any length
                    off, n = rng.randrange(0, size + 64), rng.randrange(0, size + 64)
                elif kind == 1:  # small reads across the header/data seam
                    off, n = rng.randrange(max(0, hl - 70), min(size, hl + 70) + 1), rng.randrange(1, 140)
                elif kind == 2:  # up to and past the end
                    off, n = rng.randrange(max(0, size - 300), size + 1), rng.randrange(1, 600)
                else:            # large reads from anywhere
                    off, n = rng.randrange(0, size), rng.choice([4096, 65536, 1 << 20])
                got = os.pread(fd, n, off)
                assert got == full[off:off + n], \
                    f"{rel}: pread({n} @ {off}) of a {size}-byte file returned {len(got)} wrong bytes"
        finally:
            os.close(fd)


# ---------------------------------------------------------------------------
# concurrency: each test gets a fresh daemon so that all readers miss the
# chunk cache together.

@pytest.fixture(params=conftest.LAYOUTS)
def layout_name(request):
    return request.param


CONCURRENT_OPTS = {
    "default": (),
    "small_cache": ("cache_size=16K", "threads=2"),
}


def _read_in_pieces(path, rng):
    out = bytearray()
    fd = os.open(path, os.O_RDONLY)
    try:
        while True:
            piece = os.pread(fd, rng.choice([1, 7, 64, 1000, 4096, 10000]), len(out))
            if not piece:
                return bytes(out)
            out += piece
    finally:
        os.close(fd)


@pytest.mark.concurrent
@pytest.mark.parametrize("opts", sorted(CONCURRENT_OPTS))
def test_concurrent_threads(layout_name, mount, expected, opts):
    lay = U.layout(layout_name)
    m = mount(lay.source, *CONCURRENT_OPTS[opts])
    rels = sorted(lay.arrays)
    nthreads = 8
    barrier = threading.Barrier(nthreads)
    results = [None] * nthreads
    errors = []

    def worker(i):
        try:
            rng = random.Random(i)
            order = rels[:]
            rng.shuffle(order)
            barrier.wait()
            got = {}
            for _ in range(2):
                for rel in order:
                    got.setdefault(rel, []).append(_read_in_pieces(m.p(rel), rng))
            results[i] = got
        except BaseException as e:  # reported below
            errors.append(f"thread {i}: {e!r}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(nthreads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for rel in rels:
        exp = expected[lay.arrays[rel].key]
        copies = [c for r in results for c in r[rel]]
        hl = check_header(rel, copies[0], exp)
        assert copies[0][hl:] == exp.data, rel
        assert all(c == copies[0] for c in copies), f"{rel}: concurrent readers saw different bytes"


READER = r"""
import hashlib, json, os, sys
root, rels = sys.argv[1], sys.argv[2:]
sys.stdin.read(1)   # start together
out = {}
for rel in rels:
    h = hashlib.sha256()
    with open(os.path.join(root, rel), "rb", buffering=0) as f:
        while True:
            b = f.read(3000)
            if not b:
                break
            h.update(b)
    out[rel] = h.hexdigest()
print(json.dumps(out))
"""


@pytest.mark.concurrent
def test_concurrent_processes(layout_name, mount, expected):
    lay = U.layout(layout_name)
    m = mount(lay.source, "cache_size=16K")
    rels = sorted(lay.arrays)
    procs = []
    for i in range(8):
        order = rels[:]
        random.Random(100 + i).shuffle(order)
        procs.append(subprocess.Popen([sys.executable, "-c", READER, str(m.p()), *order],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    for p in procs:
        p.stdin.write("g")
        p.stdin.flush()
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        outs.append(json.loads(out))
    for rel in rels:
        exp = expected[lay.arrays[rel].key]
        with open(m.p(rel), "rb") as f:
            head = f.read(4096)
        hl = check_header(rel, head, exp)
        want = hashlib.sha256(head[:hl] + exp.data).hexdigest()
        for i, o in enumerate(outs):
            assert o[rel] == want, f"{rel}: process {i} read different bytes"

