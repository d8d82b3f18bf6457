"""Decode memory is bounded by cache_size.

Real Orbax zarr v2 checkpoints store a replicated array as ONE chunk, so a
large embedding is one decode unit of hundreds of MiB or GiB (a few KiB
when it compresses well).  Reading 16 bytes of it must not cost the whole
unit in daemon memory, concurrent first readers must not each cost a unit,
and a sequential reader must not decode the unit again for every read.

The fixture here: eight arrays of 256 MiB (float32 [1024, 65536]), each
stored as one zarr v2 chunk compressed with zstd (~8 KiB on disk), plus one
of 64 MiB; and the same arrays as Orbax's zarr3 writes them: one
sharding_indexed shard per array holding one inner chunk ([bytes, zstd],
its index [bytes, crc32c] at the end).  Values: every element of the n-th MiB of the data holds the
float32 value n, so a read at a wrong offset of the unit shows.

What is measured: the daemon's VmHWM (peak resident set, /proc/PID/status)
before and after the reads.  The bound is cache_size + DECODE_SLACK: the
cache may hold cache_size bytes of decoded data; DECODE_SLACK covers what
is not decoded data (FUSE request buffers and thread stacks touched by
eight concurrent requests, zstd decompression contexts and stream windows,
allocator slack).  No wall-clock assertions.  Under AddressSanitizer the
memory bounds are not checked (its shadow and quarantine dominate), the
values still are.
"""

import errno
import hashlib
import json
import os
import shutil
import stat
import threading
from pathlib import Path

import numpy as np
import pytest
import zstandard

import ckfs_util as U
from crc32c_ref import crc32c

MiB = 1 << 20
ROWS, COLS = 1024, 65536                 # 256 MiB of float32
BIG_N = 8
MID_ROWS = 256                           # "mid": 64 MiB
CACHE = 64 * MiB
# Everything the daemon may hold beyond cache_size while serving 8
# concurrent small reads of huge units.  docs/reliability.md names it.
DECODE_SLACK = 32 * MiB


def expected_bytes(start, n):
    """Data bytes [start, start+n) of any of the arrays (not the header)."""
    e0, e1 = start // 4, (start + n + 3) // 4
    vals = (np.arange(e0, e1, dtype=np.int64) * 4 // MiB).astype("<f4")
    raw = vals.tobytes()
    off = start - e0 * 4
    return raw[off:off + n]


def write_values(f, nbytes, raw):
    """The data (the n-th MiB all float32 n), raw or as one zstd frame."""
    if raw:
        for k in range(nbytes // MiB):
            f.write(np.full(MiB // 4, k, dtype="<f4").tobytes())
        return
    cctx = zstandard.ZstdCompressor(level=1)
    with cctx.stream_writer(f, size=nbytes, closefd=False) as w:
        for k in range(nbytes // MiB):
            w.write(np.full(MiB // 4, k, dtype="<f4").tobytes())


def write_one_chunk_array(item, name, rows, cols, raw=False):
    d = item / name
    d.mkdir()
    (d / ".zarray").write_text(json.dumps({
        "chunks": [rows, cols], "compressor": None if raw else {"id": "zstd", "level": 1},
        "dimension_separator": ".",
        "dtype": "<f4", "fill_value": None, "filters": None, "order": "C", "shape": [rows, cols],
        "zarr_format": 2}))
    with open(d / "0.0", "wb") as f:
        write_values(f, rows * cols * 4, raw)
    return {"key_metadata": [{"key": name, "key_type": 2}],
            "value_metadata": {"value_type": "jax.Array", "skip_deserialize": False, "write_shape": [rows, cols]}}


def write_one_shard_array(item, name, rows, cols, raw=False):
    """The zarr3 layout of Orbax: a shard of the whole array holding one
    inner chunk, then the shard index (offset, length) and its CRC-32C."""
    d = item / name
    (d / "c" / "0").mkdir(parents=True)
    inner = [{"name": "bytes", "configuration": {"endian": "little"}}]
    if not raw:
        inner.append({"name": "zstd", "configuration": {"level": 1, "checksum": False}})
    (d / "zarr.json").write_text(json.dumps({
        "zarr_format": 3, "node_type": "array", "shape": [rows, cols], "data_type": "float32",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [rows, cols]}},
        "chunk_key_encoding": {"name": "default"}, "fill_value": 0.0,
        "codecs": [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": [rows, cols], "codecs": inner,
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
            "index_location": "end"}}]}))
    with open(d / "c" / "0" / "0", "wb") as f:
        write_values(f, rows * cols * 4, raw)
        n = f.tell()
        index = np.array([0, n], dtype="<u8").tobytes()
        f.write(index + np.array([crc32c(index)], dtype="<u4").tobytes())
    return {"key_metadata": [{"key": name, "key_type": 2}],
            "value_metadata": {"value_type": "jax.Array", "skip_deserialize": False, "write_shape": [rows, cols]}}


@pytest.fixture(scope="module", params=["zarr2", "zarr3_shard"])
def big_item(tmp_path_factory, request):
    """An item folder (a direct StandardCheckpointer save) with big0..big7
    (256 MiB each) and mid (64 MiB), each one zstd chunk: zarr v2 chunks,
    or zarr3 shards of one inner chunk (Orbax's use_zarr3 layout)."""
    item = tmp_path_factory.mktemp("bigitem") / "item"
    item.mkdir()
    write = write_one_chunk_array if request.param == "zarr2" else write_one_shard_array
    tree = {}
    for k in range(BIG_N):
        tree[f"('big{k}',)"] = write(item, f"big{k}", ROWS, COLS)
    tree["('mid',)"] = write(item, "mid", MID_ROWS, COLS)
    tree["('rawmid',)"] = write(item, "rawmid", MID_ROWS, COLS, raw=True)
    (item / "_METADATA").write_text(json.dumps({
        "tree_metadata": tree, "use_ocdbt": False, "use_zarr3": request.param != "zarr2",
        "store_array_data_equal_to_fill_value": True, "custom_metadata": None}))
    stored = [p for p in item.rglob("*") if p.is_file() and p.parent.name not in ("rawmid", "0") or
              (p.is_file() and "rawmid" not in p.parts and p.name == "0")]
    assert sum(p.stat().st_size for p in stored) < 4 * MiB
    return item


def header_len(path, nbytes=ROWS * COLS * 4):
    """From st_size, without reading (a read would decode)."""
    return os.stat(path).st_size - nbytes


def small_reads(paths, offsets, n=16):
    """One thread per (path, data offset): open, pread n bytes, close, all
    released at once.  Returns ([(path, off, bytes or None)], [errors])."""
    barrier = threading.Barrier(len(paths))
    out, errs = [None] * len(paths), []

    def run(i):
        try:
            hl = header_len(paths[i])
            fd = os.open(paths[i], os.O_RDONLY)
            try:
                barrier.wait(timeout=60)
                out[i] = (paths[i], offsets[i], os.pread(fd, n, hl + offsets[i]))
            finally:
                os.close(fd)
        except threading.BrokenBarrierError:
            errs.append(f"{paths[i]}: not started (another reader failed first)")
        except Exception as e:  # noqa: BLE001 - collected and asserted below
            barrier.abort()
            errs.append(f"{paths[i]}: {e!r}")

    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(paths))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return out, errs


def check_values(results, n=16):
    for path, off, got in results:
        assert got == expected_bytes(off, n), f"{path}: {n} bytes at data offset {off} are wrong: {got!r}"


def stats(m):
    with open(m.p(".ckptfs/stats"), "rb") as f:
        return json.loads(f.read())


# ---------------------------------------------------------------------------
# values (they guard the streaming reads of units over a quarter of cache_size)

def test_reads_at_every_kind_of_offset(big_item, mount):
    """Unaligned reads, reads across MiB (value) boundaries, the first and
    the last bytes, and slices of one huge unit - with a cache large enough
    to hold it."""
    m = mount(big_item, "cache_size=512M")
    p = m.p("big0.npy")
    st = os.stat(p)
    with open(p, "rb") as f:
        hl = U.parse_npy_header(f.read(4096))[1]
    size = ROWS * COLS * 4
    assert st.st_size == hl + size
    with open(p, "rb") as f:
        for off, n in [(0, 16), (1, 7), (MiB - 5, 10), (3 * MiB + 2, 4096), (size - 16, 16), (size - 1, 1),
                       (100 * MiB - 4000, 9000), (size - 3 * MiB - 1, 2 * MiB + 1)]:
            got = os.pread(f.fileno(), n, hl + off)
            assert got == expected_bytes(off, n), f"{n} bytes at {off}"
        assert os.pread(f.fileno(), 16, hl + size) == b""
    for box in [((0, 1), (0, 16)), ((1023, 1024), (65000, 65536)), ((517, 519), (3, 70)), ((300, 301), (0, 65536))]:
        (r0, r1), (c0, c1) = box
        a = np.load(m.p(f"big3[{r0}:{r1},{c0}:{c1}].npy"))
        e = (np.arange(r0, r1)[:, None] * COLS + np.arange(c0, c1)[None, :]) * 4 // MiB
        assert np.array_equal(a, e.astype("<f4")), box


# ---------------------------------------------------------------------------
# memory bounds

def test_one_small_read_of_a_huge_unit(big_item, mount):
    m = mount(big_item, "cache_size=64M")
    p = m.p("big0.npy")
    hl = header_len(p)
    before = U.vm(m.pid)
    with open(p, "rb") as f:
        got = os.pread(f.fileno(), 16, hl + 200 * MiB + 4)
    assert got == expected_bytes(200 * MiB + 4, 16)
    grew = U.vm(m.pid) - before
    if U.sanitized():
        pytest.skip("memory bound not checked under sanitizers (values were)")
    assert grew <= CACHE + DECODE_SLACK, \
        f"one 16-byte read raised the daemon's VmHWM by {grew / MiB:.0f} MiB (cache_size 64 MiB + slack 32 MiB)"


@pytest.mark.concurrent
def test_concurrent_small_reads_within_cache_size(big_item, mount):
    m = mount(big_item, "cache_size=64M")
    paths = [m.p(f"big{k}.npy") for k in range(BIG_N)]
    for p in paths:
        os.stat(p)
    before = U.vm(m.pid)
    offs = [(k * 31 + 7) * MiB - 8 for k in range(BIG_N)]   # each read straddles a value boundary
    results, errs = small_reads(paths, offs)
    assert errs == []
    check_values(results)
    # a second round (the cache holds at most 64 MiB of it)
    results, errs = small_reads(paths, [o + 12345 * 4 for o in offs])
    assert errs == []
    check_values(results)
    grew = U.vm(m.pid) - before
    if U.sanitized():
        pytest.skip("memory bound not checked under sanitizers (values were)")
    assert grew <= CACHE + DECODE_SLACK, \
        f"8 concurrent 16-byte reads raised VmHWM by {grew / MiB:.0f} MiB (cache_size 64 MiB + slack 32 MiB)"


LIMIT_AS = 1 << 30   # 1 GiB of address space for the whole daemon


def limited_daemon(tmp_path):
    """A wrapper that runs the daemon with RLIMIT_AS = 1 GiB (prlimit execs
    it, so the PID is the daemon's) and two malloc arenas (each arena
    reserves 64 MiB of address space, which would make the figure depend on
    the number of CPUs)."""
    w = tmp_path / "ckptfs-limited"
    w.write_text("#!/bin/sh\nMALLOC_ARENA_MAX=2 exec prlimit --as=%d %s \"$@\"\n" % (LIMIT_AS, U.BIN))
    w.chmod(0o755)
    return w


@pytest.mark.concurrent
@pytest.mark.skipif(shutil.which("prlimit") is None, reason="prlimit (util-linux) not installed")
def test_eight_readers_under_memory_limit_never_enomem(big_item, mount, tmp_path):
    if U.sanitized():
        pytest.skip("sanitizer builds reserve terabytes of address space")
    m = mount(big_item, "cache_size=64M", bin_path=limited_daemon(tmp_path))
    paths = [m.p(f"big{k}.npy") for k in range(BIG_N)]
    for rnd in range(3):
        offs = [((k * 29 + rnd * 11) % 250) * MiB + 4 * rnd for k in range(BIG_N)]
        results, errs = small_reads(paths, offs)
        assert errs == [], f"round {rnd}: {errs}"
        check_values(results)


def test_sequential_read_of_a_unit_larger_than_the_cache(big_item, mount):
    """cp of an array stored as one 64 MiB unit with cache_size=16M: the
    bytes are right, each byte is decoded at most about twice (a streaming
    decode, or the unit decoded once), and memory stays within the budget."""
    m = mount(big_item, "cache_size=16M")
    p = m.p("mid.npy")
    hl = header_len(p, MID_ROWS * COLS * 4)
    size = MID_ROWS * COLS * 4
    before_hwm = U.vm(m.pid)
    before = stats(m)
    h = hashlib.sha256()
    with open(p, "rb") as f:
        head = f.read(hl)
        assert len(head) == hl
        pos = 0
        while True:
            b = f.read(MiB)
            if not b:
                break
            if pos % (8 * MiB) == 0:
                assert b[:64] == expected_bytes(pos, 64), f"data at {pos}"
            h.update(b)
            pos += len(b)
    assert pos == size
    want = hashlib.sha256()
    for k in range(size // MiB):
        want.update(np.full(MiB // 4, k, dtype="<f4").tobytes())
    assert h.hexdigest() == want.hexdigest(), "the file's bytes differ"
    decoded = stats(m)["decoded_bytes"] - before["decoded_bytes"]
    assert decoded <= 2 * size + 16 * MiB, \
        f"reading a {size // MiB} MiB unit once decoded {decoded / MiB:.0f} MiB"
    grew = U.vm(m.pid) - before_hwm
    if U.sanitized():
        return
    assert grew <= 16 * MiB + DECODE_SLACK, f"VmHWM grew by {grew / MiB:.0f} MiB (cache_size 16 MiB + slack)"


def test_raw_unit_larger_than_the_cache(big_item, mount):
    """An uncompressed 64 MiB unit with cache_size=16M: small reads, slices
    and a sequential read read only the byte ranges they need."""
    m = mount(big_item, "cache_size=16M")
    p = m.p("rawmid.npy")
    size = MID_ROWS * COLS * 4
    hl = header_len(p, size)
    before_hwm = U.vm(m.pid)
    before = stats(m)
    with open(p, "rb") as f:
        for off, n in [(0, 16), (1, 7), (MiB - 5, 10), (size - 1, 1), (40 * MiB - 3, 3 * MiB)]:
            assert os.pread(f.fileno(), n, hl + off) == expected_bytes(off, n), f"{n} bytes at {off}"
    a = np.load(m.p("rawmid[100:102,5:9].npy"))
    e = (np.arange(100, 102)[:, None] * COLS + np.arange(5, 9)[None, :]) * 4 // MiB
    assert np.array_equal(a, e.astype("<f4"))
    h = hashlib.sha256()
    with open(p, "rb") as f:
        f.seek(hl)
        while True:
            b = f.read(MiB)
            if not b:
                break
            h.update(b)
    want = hashlib.sha256()
    for k in range(size // MiB):
        want.update(np.full(MiB // 4, k, dtype="<f4").tobytes())
    assert h.hexdigest() == want.hexdigest()
    back = stats(m)["backing_bytes_read"] - before["backing_bytes_read"]
    assert back <= 2 * size, f"reading a {size // MiB} MiB raw unit read {back / MiB:.0f} MiB from the store"
    grew = U.vm(m.pid) - before_hwm
    if U.sanitized():
        return
    assert grew <= 16 * MiB + DECODE_SLACK, f"VmHWM grew by {grew / MiB:.0f} MiB (cache_size 16 MiB + slack)"


def test_a_reader_of_a_folder_has_the_next_files_decoding(tmp_path, mount):
    """A reader at the start of one array file of a folder (np.load, cp -r
    walking it) has the first chunks of the next files decoding on the
    decode threads, not only the next one's, as far as half the cache
    holds them: six arrays of one 4 MiB chunk, cache_size=64M: reading the
    first bytes of a0 decodes a0 and queues a1..a5, with nothing else
    read.  (Before, only a1 was queued: the threads decoded one file at a
    time behind a reader of one-chunk files.)"""
    item = tmp_path / "item"
    item.mkdir()
    tree = {f"('a{k}',)": write_one_chunk_array(item, f"a{k}", 16, COLS) for k in range(6)}
    (item / "_METADATA").write_text(json.dumps({
        "tree_metadata": tree, "use_ocdbt": False, "use_zarr3": False,
        "store_array_data_equal_to_fill_value": True, "custom_metadata": None}))
    m = mount(item, "cache_size=64M")
    assert stats(m)["chunks_decoded"] == 0
    p = m.p("a0.npy")
    hl = header_len(p, 16 * COLS * 4)
    with open(p, "rb") as f:
        assert os.pread(f.fileno(), 16, hl) == expected_bytes(0, 16)
    U.wait_until(lambda: stats(m)["chunks_decoded"] >= 6, timeout=30)
    assert stats(m)["chunks_decoded"] == 6, stats(m)
    for k in range(6):  # and they hold the right bytes
        with open(m.p(f"a{k}.npy"), "rb") as f:
            assert os.pread(f.fileno(), 16, hl + MiB) == expected_bytes(MiB, 16)
    assert stats(m)["chunks_decoded"] == 6, stats(m)


def test_the_next_files_decode_across_folders(tmp_path, mount):
    """Orbax keeps each layer's arrays in a folder of their own
    (params/layer_0/w.npy, params/layer_1/w.npy, ...), so a reader's next
    file is often in the next folder: a reader at the start of layer_0/w
    has the files of the folders after it decoding too, in the order cp -r
    and a loader in key order walk them (layer_10 after layer_1).  Six
    layers of one 4 MiB array each, cache_size=64M: the first bytes of
    layer_0/w decode it and queue the other five.  (Before, the warm-up
    stopped at the end of its folder: nothing more was queued, and the
    decode threads waited for the reader at every folder.)"""
    item = tmp_path / "item"
    item.mkdir()
    tree = {}
    names = [f"layer_{k}" for k in (0, 1, 2, 3, 10, 11)]
    for layer in names:
        meta = write_one_chunk_array(item, f"params.{layer}.w", 16, COLS)
        meta["key_metadata"] = [{"key": k, "key_type": 2} for k in ("params", layer, "w")]
        tree[f"('params', '{layer}', 'w')"] = meta
    (item / "_METADATA").write_text(json.dumps({
        "tree_metadata": tree, "use_ocdbt": False, "use_zarr3": False,
        "store_array_data_equal_to_fill_value": True, "custom_metadata": None}))
    m = mount(item, "cache_size=64M")
    assert sorted(os.listdir(m.p("params"))) == sorted(names)
    assert stats(m)["chunks_decoded"] == 0
    p = m.p("params/layer_0/w.npy")
    hl = header_len(p, 16 * COLS * 4)
    with open(p, "rb") as f:
        assert os.pread(f.fileno(), 16, hl) == expected_bytes(0, 16)
    U.wait_until(lambda: stats(m)["chunks_decoded"] >= len(names), timeout=30)
    assert stats(m)["chunks_decoded"] == len(names), stats(m)
    for layer in names:  # and they hold the right bytes
        with open(m.p(f"params/{layer}/w.npy"), "rb") as f:
            assert os.pread(f.fileno(), 16, hl + MiB) == expected_bytes(MiB, 16)
    assert stats(m)["chunks_decoded"] == len(names), stats(m)
