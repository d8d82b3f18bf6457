"""Weights only: loading params must read params' stored bytes and
nothing else.

In a copy of a per-file checkpoint every chunk file of every array that
is not under params (opt_state.*, step) is overwritten with garbage (the
zarr metadata stays intact).  Loading all of params - as .npy files, as
slices and as params.safetensors - gives the expected values while the
backing store is read for at most the stored size of params; reading an
opt_state array then fails with EIO, which proves the garbage is there.
"""

import errno
import json
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest

import ckfs_util as U
from st_spec import load

LAYOUTS = ["pytree_zarr3", "pytree_zarr2"]
GARBAGE = bytes(range(7, 250, 3)) * 64  # not a zstd frame, not a shard index with a valid crc32c


def chunk_files(array_dir):
    """The stored chunk/shard files of a per-file zarr array (not its
    metadata): zarr2 'i.j' files, zarr3 everything under c/."""
    d = Path(array_dir)
    if (d / ".zarray").exists():
        return sorted(p for p in d.iterdir() if p.is_file() and not p.name.startswith(".z"))
    c = d / "c"
    assert (d / "zarr.json").exists(), d
    return [c] if c.is_file() else sorted(p for p in c.rglob("*") if p.is_file())


def make_copy(name, dst):
    """Copy fixture `name` to dst with every non-params chunk file replaced
    by garbage.  Returns (stored bytes of params, list of spoiled arrays)."""
    shutil.copytree(U.FIXTURES / name, dst)
    for root, dirs, files in os.walk(dst):
        for n in dirs + files:
            p = os.path.join(root, n)
            os.chmod(p, os.stat(p).st_mode | stat.S_IWUSR)
    os.chmod(dst, os.stat(dst).st_mode | stat.S_IWUSR)
    params_stored = 0
    spoiled = []
    for d in sorted(Path(dst).iterdir()):
        if not d.is_dir() or not ((d / ".zarray").exists() or (d / "zarr.json").exists()):
            continue
        files = chunk_files(d)
        assert files, d
        if d.name.startswith("params."):
            params_stored += sum(f.stat().st_size for f in files)
            continue
        for f in files:
            size = f.stat().st_size
            f.write_bytes(GARBAGE[: size + 5])
        spoiled.append(d.name)
    assert {"step", "opt_state.count", "opt_state.mu.embedding", "opt_state.nu.embedding"} <= set(spoiled)
    assert params_stored > 0
    return params_stored, spoiled


def stats(m):
    with open(m.p(".ckptfs/stats"), "rb") as f:
        return json.loads(f.read())


def params_arrays(lay, expected):
    out = [(rel, expected[a.key]) for rel, a in sorted(lay.arrays.items()) if rel.startswith("params/")]
    assert len(out) == 6
    return out


def halves_and_thirds(shape):
    """A few slices (tuples of (start, stop)) that tile the array."""
    boxes = []
    if len(shape) == 1:
        for parts in (2, 3):
            for piece in np.array_split(np.arange(shape[0]), parts):
                boxes.append([(int(piece[0]), int(piece[-1]) + 1)])
    else:
        for p, q in ((2, 1), (3, 5)):
            for rp in np.array_split(np.arange(shape[0]), p):
                for cp in np.array_split(np.arange(shape[1]), q):
                    boxes.append([(int(rp[0]), int(rp[-1]) + 1), (int(cp[0]), int(cp[-1]) + 1)])
    return boxes


@pytest.mark.parametrize("name", LAYOUTS)
def test_params_only_reads_params(name, mount, expected, tmp_path):
    src = tmp_path / name
    params_stored, spoiled = make_copy(name, src)
    lay = U.layout(name, root=src)
    m = mount(src)
    arrays = params_arrays(lay, expected)
    base = stats(m)["backing_bytes_read"]

    # 1. every params .npy
    for rel, exp in arrays:
        arr = np.load(m.p(rel), allow_pickle=False)
        assert arr.shape == exp.shape and arr.tobytes() == exp.data, f"{rel}: values"
    # 2. slices of each
    for rel, exp in arrays:
        full = exp.array()
        for box in halves_and_thirds(exp.shape):
            text = "[" + ",".join(f"{a}:{b}" for a, b in box) + "]"
            p = m.p(rel[: -len(".npy")] + text + ".npy")
            arr = np.load(p, allow_pickle=False)
            want = np.array(full[tuple(slice(a, b) for a, b in box)], order="C")
            assert arr.shape == want.shape and arr.tobytes() == want.tobytes(), f"{p}: values"
    # 3. params.safetensors
    tensors, meta = load(m.p("params.safetensors"))
    assert meta == {"format": "pt"}
    want_names = {rel[len("params/"): -len(".npy")].replace("/", ".") for rel, _ in arrays}
    assert set(tensors) == want_names
    for rel, exp in arrays:
        dt, shape, data = tensors[rel[len("params/"): -len(".npy")].replace("/", ".")]
        assert shape == exp.shape and data == exp.data, f"params.safetensors: {rel}"

    read = stats(m)["backing_bytes_read"] - base
    print(f"{name}: loading params three ways read {read} backing bytes; params store {params_stored}")
    assert 0 < read <= params_stored, \
        f"{name}: loading params read {read} bytes from the backing store, more than params' {params_stored} " \
        f"stored bytes (something outside params was read, or a chunk was read twice)"

    # last: the garbage is really there
    for rel in ("opt_state/mu/embedding.npy", "opt_state/nu/embedding.npy", "opt_state/count.npy", "step.npy"):
        def read_it():
            with open(m.p(rel), "rb") as f:
                f.read()
        e = U.errno_of(read_it)
        assert e == errno.EIO, f"{rel}: reading a spoiled array gave errno {e}, want EIO"
    assert m.proc.poll() is None
    assert m.unmount() == 0


@pytest.mark.parametrize("name", LAYOUTS)
def test_cold_safetensors_load_ratio(name, mount, expected, tmp_path):
    """A cold full load of params.safetensors reads at most 5% more than
    params' stored bytes."""
    src = tmp_path / name
    params_stored, _ = make_copy(name, src)
    lay = U.layout(name, root=src)
    m = mount(src)
    arrays = params_arrays(lay, expected)
    base = stats(m)["backing_bytes_read"]
    tensors, _ = load(m.p("params.safetensors"))
    read = stats(m)["backing_bytes_read"] - base
    for rel, exp in arrays:
        assert tensors[rel[len("params/"): -len(".npy")].replace("/", ".")][2] == exp.data, rel
    ratio = read / params_stored
    print(f"{name}: cold params.safetensors load read {read} bytes / params stored {params_stored} = {ratio:.4f}")
    assert ratio <= 1.05, f"{name}: read {read} bytes for {params_stored} stored bytes of params (ratio {ratio:.3f})"
    assert read > 0
