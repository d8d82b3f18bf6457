"""Whole-array reads of every chunk layout give numpy's C-order bytes.

The daemon answers a read of NAME.npy straight from the decoded chunks
(one reply piece per contiguous run of a chunk) for any C-order layout:
chunks split by rows, by columns (an array sharded P(None, 'y')), by both,
with clipped edge chunks and with chunks larger than the array.  Layouts
with too many pieces per read fall back to copying.  Every byte of every
layout is checked here, with reads of many sizes at unaligned offsets
(through the page cache, and with -o direct_read, where the daemon gets
the reader's own offsets and sizes), zstd-compressed and raw.  Raw chunks
in a local folder are copied from their files straight into each reply,
without a decode or a cache entry.
"""

import errno
import json
import mmap
import os

import numpy as np
import pytest
import zstandard

import ckfs_util as U

# name: (dtype, shape, chunks)
ARRAYS = {
    "col": ("<f4", [64, 96], [64, 32]),            # split by columns
    "col_edge": ("<f4", [50, 70], [50, 32]),       # last column chunk clipped
    "row": ("<f4", [96, 40], [32, 40]),            # split by rows
    "grid": ("<f4", [40, 40], [16, 16]),           # both, clipped at both edges
    "mid3d": ("<i2", [6, 10, 12], [4, 3, 12]),     # partial in dims 0 and 1
    "last3d": ("<f8", [3, 4, 10], [2, 4, 4]),      # partial in the last dim
    "oversized": ("<f4", [10, 7], [16, 8]),        # one chunk larger than the array
    "wide": ("<f4", [512, 1024], [512, 128]),      # 2 MiB: many pieces per 1 MiB read
    "thin": ("<f4", [256, 256], [256, 1]),         # 4-byte runs: too many pieces, copied
}


def values(dtype, shape, seed):
    n = int(np.prod(shape))
    a = (np.arange(n, dtype=np.int64) * 7 + seed) % 30011
    return a.astype(dtype).reshape(shape)


def write_array(item, name, dtype, shape, chunks, compressed):
    a = values(dtype, shape, len(name))
    d = item / name
    d.mkdir()
    (d / ".zarray").write_text(json.dumps({
        "chunks": chunks, "compressor": {"id": "zstd", "level": 1} if compressed else None,
        "dimension_separator": ".", "dtype": dtype, "fill_value": None, "filters": None,
        "order": "C", "shape": shape, "zarr_format": 2}))
    grid = [(s + c - 1) // c for s, c in zip(shape, chunks)]
    cctx = zstandard.ZstdCompressor(level=1)
    for g in np.ndindex(*grid):
        # a chunk is stored whole: the part outside the array is padding
        block = np.zeros(chunks, dtype=dtype)
        src = tuple(slice(i * c, min((i + 1) * c, s)) for i, c, s in zip(g, chunks, shape))
        block[tuple(slice(0, x.stop - x.start) for x in src)] = a[src]
        raw = block.tobytes()
        (d / ".".join(str(i) for i in g)).write_bytes(cctx.compress(raw) if compressed else raw)
    return a, {"key_metadata": [{"key": name, "key_type": 2}],
               "value_metadata": {"value_type": "jax.Array", "skip_deserialize": False,
                                  "write_shape": shape}}


@pytest.fixture(scope="module", params=["zstd", "raw", "zstd-direct_read", "raw-direct_read"])
def layouts(request, tmp_path_factory, module_mount):
    item = tmp_path_factory.mktemp("layouts") / "item"
    item.mkdir()
    tree, want = {}, {}
    for name, (dtype, shape, chunks) in ARRAYS.items():
        want[name], tree["('%s',)" % name] = write_array(item, name, dtype, shape, chunks,
                                                         request.param.startswith("zstd"))
    (item / "_METADATA").write_text(json.dumps({
        "tree_metadata": tree, "use_ocdbt": False, "use_zarr3": False,
        "store_array_data_equal_to_fill_value": True}))
    opts = ["direct_read"] if request.param.endswith("direct_read") else []
    return module_mount(item, *opts), want


@pytest.mark.parametrize("name", list(ARRAYS))
def test_whole_file_equals_numpy(layouts, name):
    m, want = layouts
    got = np.load(m.path / (name + ".npy"))
    assert got.dtype == want[name].dtype and got.shape == want[name].shape
    assert got.tobytes() == want[name].tobytes()


@pytest.mark.parametrize("name", list(ARRAYS))
def test_preads_at_odd_offsets(layouts, name):
    m, want = layouts
    path = m.path / (name + ".npy")
    size = os.stat(path).st_size
    data = want[name].tobytes()
    hdr = size - len(data)
    with open(path, "rb") as f:
        head = f.read(hdr)
    whole = head + data
    fd = os.open(path, os.O_RDONLY)
    try:
        for off in (0, 1, hdr - 1, hdr, hdr + 3, hdr + 4093, size // 3 + 5, size - 9):
            for n in (1, 7, 4096, 5000, 65537, 1 << 20):
                if 0 <= off < size:
                    assert os.pread(fd, n, off) == whole[off:off + n], (off, n)
    finally:
        os.close(fd)


def test_direct_read_maps_shared_where_the_kernel_allows_and_reads_stay_right(layouts):
    """-o direct_read: a shared mapping works, with the right bytes, when the
    kernel offers FUSE_DIRECT_IO_ALLOW_MMAP (the daemon asks for it in its
    INIT reply, fs/devio.c, and logs which); else it is refused with ENODEV.
    A private mapping, np.load and np.load(mmap_mode='r') where it maps read
    the same bytes.  (Before, libfuse 3.14's reply never asked for it: ENODEV
    on every kernel.)"""
    m, want = layouts
    path = m.path / "wide.npy"
    data = want["wide"].tobytes()
    direct = "direct_read" in " ".join(m.options)
    shared = not direct or "maps direct-I/O files shared too" in m.log()
    if direct:
        assert "direct_read: th" in m.log()  # one line either way
    with open(path, "rb") as f:
        if shared:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                assert mm[-len(data):] == data
        else:
            with pytest.raises(OSError) as e:
                mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            assert e.value.errno == errno.ENODEV
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) as mm:
            assert mm[-64:] == data[-64:]
    assert np.load(path).tobytes() == data
    if shared:
        assert np.load(path, mmap_mode="r").tobytes() == data


def stats(m):
    return json.loads((m.path / ".ckptfs" / "stats").read_text())


def test_raw_chunks_are_copied_from_their_files_without_decoding(layouts):
    """A whole-file read of a raw array decodes nothing: its pieces are read
    from the chunk files straight into the reply (one preadv per chunk and
    stretch); a slice still goes through the decoded-chunk cache."""
    m, want = layouts
    if json.loads((m.source / "wide" / ".zarray").read_text())["compressor"] is not None:
        pytest.skip("raw layouts only")
    path = m.path / "wide.npy"
    data = want["wide"].tobytes()
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # the bytes come from the daemon
        before = stats(m)
        got = b"".join(iter(lambda: os.read(fd, 1 << 20), b""))
    finally:
        os.close(fd)
    after = stats(m)
    assert got[-len(data):] == data
    assert after["bytes_served"] - before["bytes_served"] >= len(data)
    assert after["chunks_decoded"] == before["chunks_decoded"]
    part = np.load(m.path / "wide[0:4,0:4].npy")
    assert part.tobytes() == want["wide"][0:4, 0:4].tobytes()
    assert stats(m)["chunks_decoded"] - after["chunks_decoded"] == 1
