"""Large compressed chunks of a local SOURCE: read, then decoded.

A zstd (or zstd + crc32c) chunk of a local folder, or of an OCDBT data file
of one, is read with pread into the decode's reused scratch memory and
decoded from there; the daemon never maps a backing file (mapping saved no
CPU on the cold read: docs/benchmarks.md, "Mapped decoding against pread"),
and neither it nor libckpt installs a SIGBUS handler.  What is checked here
is what a user sees: every array reads back byte for byte through np.load
and cat, for zarr v2 chunks, zarr v3 shards (one and several inner chunks,
crc32c after zstd) and OCDBT values.  A file truncated between two reads
fails the second with EIO or ESTALE, never other bytes (the unit test
test_zarr's test_large_chunks truncates one under the read itself).
"""

import errno
import importlib.util
import json
import struct
import subprocess
import sys

import numpy as np
import pytest
import zstandard

import ckfs_util as U

ROWS, COLS = 1024, 512          # float32: 2 MiB per array
CH = [512, 512]                 # 1 MiB chunks, ~1 MiB compressed (random data)


def values(k):
    return np.random.default_rng(40 + k).standard_normal((ROWS, COLS), dtype=np.float32)


def tree_entry(top, leaf):
    return {"key_metadata": [{"key": top, "key_type": 2}, {"key": leaf, "key_type": 2}],
            "value_metadata": {"value_type": "jax.Array", "skip_deserialize": False,
                               "write_shape": [ROWS, COLS]}}


def write_metadata(item, names, zarr3, ocdbt=False):
    tree = {repr(("params", n)): tree_entry("params", n) for n in names}
    (item / "_METADATA").write_text(json.dumps({
        "tree_metadata": tree, "use_ocdbt": ocdbt, "use_zarr3": zarr3,
        "store_array_data_equal_to_fill_value": True}))


def zarr2_item(item):
    """params.w0, params.w1: zarr v2, zstd level 1, chunks [512, 512]."""
    cctx = zstandard.ZstdCompressor(level=1)
    item.mkdir()
    for k in range(2):
        d = item / f"params.w{k}"
        d.mkdir()
        (d / ".zarray").write_text(json.dumps({
            "chunks": CH, "compressor": {"id": "zstd", "level": 1}, "dimension_separator": ".",
            "dtype": "<f4", "fill_value": None, "filters": None, "order": "C",
            "shape": [ROWS, COLS], "zarr_format": 2}))
        a = values(k)
        for i in range(ROWS // CH[0]):
            for j in range(COLS // CH[1]):
                b = np.ascontiguousarray(a[i * CH[0]:(i + 1) * CH[0], j * CH[1]:(j + 1) * CH[1]])
                (d / f"{i}.{j}").write_bytes(cctx.compress(b.tobytes()))
    write_metadata(item, ["w0", "w1"], zarr3=False)
    return 2 * (ROWS // CH[0]) * (COLS // CH[1])


def crc32c(b):
    import crc32c_ref
    return crc32c_ref.crc32c(b)


def zarr3_item(item):
    """params.s1: one shard holding one inner chunk of the whole array;
    params.s2: one shard of two inner chunks [512, 512]; zstd then crc32c
    inside, index (crc32c) at the end."""
    cctx = zstandard.ZstdCompressor(level=1)
    item.mkdir()
    n_chunks = 0
    for name, inner in (("s1", [ROWS, COLS]), ("s2", CH)):
        d = item / f"params.{name}"
        (d / "c" / "0").mkdir(parents=True)
        (d / "zarr.json").write_text(json.dumps({
            "zarr_format": 3, "node_type": "array", "shape": [ROWS, COLS], "data_type": "float32",
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [ROWS, COLS]}},
            "chunk_key_encoding": {"name": "default"}, "fill_value": 0.0,
            "codecs": [{"name": "sharding_indexed", "configuration": {
                "chunk_shape": inner,
                "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                           {"name": "zstd", "configuration": {"level": 1, "checksum": False}},
                           {"name": "crc32c"}],
                "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                                 {"name": "crc32c"}],
                "index_location": "end"}}]}))
        a = values(2 if name == "s1" else 3)
        body, index = b"", b""
        for i in range(ROWS // inner[0]):
            for j in range(COLS // inner[1]):
                b = np.ascontiguousarray(a[i * inner[0]:(i + 1) * inner[0], j * inner[1]:(j + 1) * inner[1]])
                z = cctx.compress(b.tobytes())
                z += struct.pack("<I", crc32c(z))
                index += struct.pack("<QQ", len(body), len(z))
                body += z
                n_chunks += 1
        index += struct.pack("<I", crc32c(index))
        (d / "c" / "0" / "0").write_bytes(body + index)
    write_metadata(item, ["s1", "s2"], zarr3=True)
    return n_chunks


def ocdbt_item(item):
    """params.o0: zarr v2 zstd chunks [512, 512] stored as values of an
    OCDBT database (out of line, in its data file), by scripts/gen_ocdbt.py
    with its arrays replaced."""
    path = U.REPO / "scripts" / "gen_ocdbt.py"
    spec = importlib.util.spec_from_file_location("gen_ocdbt_chunk_read", path)
    g = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(g)
    cctx = zstandard.ZstdCompressor(level=1)

    def entries(args, i):
        a = values(10 + i)
        kv = []
        for r in range(ROWS // CH[0]):
            for c in range(COLS // CH[1]):
                b = np.ascontiguousarray(a[r * CH[0]:(r + 1) * CH[0], c * CH[1]:(c + 1) * CH[1]])
                kv.append((f"layer_{i:06d}.w/{r}.{c}", cctx.compress(b.tobytes())))
        meta = {"chunks": CH, "compressor": {"id": "zstd", "level": 1}, "dimension_separator": ".",
                "dtype": "<f4", "fill_value": None, "filters": None, "order": "C",
                "shape": [ROWS, COLS], "zarr_format": 2}
        return (f"layer_{i:06d}.w", [ROWS, COLS], CH, f"layer_{i:06d}.w/.zarray",
                json.dumps(meta).encode(), kv)

    g.array_entries = entries
    argv = sys.argv
    sys.argv = ["gen_ocdbt.py", str(item), "--arrays", "2", "--zarr2"]
    try:
        g.main()
    finally:
        sys.argv = argv
    return 2 * (ROWS // CH[0]) * (COLS // CH[1])


def stats(m):
    return json.loads(U.read_all(m.p(".ckptfs/stats")))


def sigcgt(pid):
    """The signals a process has a handler for (SigCgt of /proc/PID/status)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("SigCgt:"):
                return int(line.split()[1], 16)
    raise KeyError("SigCgt")


@pytest.mark.parametrize("kind", ["zarr2", "zarr3_shards", "ocdbt"])
def test_large_zstd_chunks_read_back(tmp_path, mount, kind):
    item = tmp_path / kind
    if kind == "zarr2":
        n, files = zarr2_item(item), {"params/w0.npy": 0, "params/w1.npy": 1}
    elif kind == "zarr3_shards":
        n, files = zarr3_item(item), {"params/s1.npy": 2, "params/s2.npy": 3}
    else:
        n, files = ocdbt_item(item), {"layer_000000/w.npy": 10, "layer_000001/w.npy": 11}
    m = mount(item, "ro")
    before = stats(m)
    assert "backing_maps" not in before
    for rel, k in files.items():
        got = np.load(m.p(rel))
        assert got.dtype == np.float32 and got.shape == (ROWS, COLS), rel
        assert np.array_equal(got, values(k)), f"{rel}: bytes differ"
    reads = stats(m)["backing_reads"] - before["backing_reads"]
    assert reads >= n, f"{reads} backing reads for {n} chunks"
    # cat of the same files (the kernel's pages now) gives the same bytes
    for rel, k in files.items():
        r = subprocess.run(["cat", str(m.p(rel))], capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert r.stdout.endswith(values(k).tobytes()), rel


def test_a_chunk_truncated_under_the_mount_is_an_error_not_other_bytes(tmp_path, mount):
    item = tmp_path / "zarr2"
    zarr2_item(item)
    m = mount(item, "ro", "cache_size=8M")
    assert np.array_equal(np.load(m.p("params/w0.npy")), values(0))
    chunk = item / "params.w1" / "1.0"
    data = chunk.read_bytes()
    with open(chunk, "r+b") as f:
        f.truncate(len(data) // 2)
    with pytest.raises(OSError) as ei:
        U.read_all(m.p("params/w1.npy"))
    assert ei.value.errno in (errno.EIO, errno.ESTALE), ei.value
    assert "params.w1/1.0" in m.log(), m.log()[-2000:]
    chunk.write_bytes(data)
    assert np.array_equal(np.load(m.p("params/w1.npy")), values(1))


def test_the_daemon_has_no_sigbus_handler(tmp_path, mount):
    """After reading large chunks, SIGBUS still has its default action in
    the daemon (a sanitizer's runtime installs its own: not checked then)."""
    if U.sanitized():
        pytest.skip("a sanitizer handles SIGBUS itself")
    item = tmp_path / "zarr3"
    zarr3_item(item)
    m = mount(item, "ro")
    assert np.array_equal(np.load(m.p("params/s1.npy")), values(2))
    assert not sigcgt(m.pid) & (1 << (7 - 1)), "the daemon catches SIGBUS"


@pytest.mark.concurrent
def test_concurrent_readers_of_large_chunks(tmp_path, mount):
    """Eight threads read the arrays of a small cache at once (chunks are
    evicted, read and decoded again and again): every read is byte-exact."""
    import threading
    item = tmp_path / "zarr2"
    zarr2_item(item)
    m = mount(item, "ro", "cache_size=4M")
    want = {rel: values(k).tobytes() for rel, k in (("params/w0.npy", 0), ("params/w1.npy", 1))}
    errors = []

    def reader(i):
        try:
            for r in range(3):
                rel = sorted(want)[(i + r) % 2]
                data = U.read_all(m.p(rel))
                if not data.endswith(want[rel]):
                    errors.append(f"reader {i}: {rel} differs")
        except OSError as e:
            errors.append(f"reader {i}: {e}")

    ts = [threading.Thread(target=reader, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
