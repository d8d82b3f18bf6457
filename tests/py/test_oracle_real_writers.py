"""Older writers, real ones: steps written by TensorStore in the shape of a
T5X checkpoint, by flax.training.checkpoints (with and without Orbax) and by
older orbax-checkpoint releases (tests/fixtures/real-writers/, see the
README there), read through a mount and compared, byte for byte, with what
the writer's own reader returned when the fixture was made
(`expected/<folder>.npz`: TensorStore's read, flax's restore_checkpoint,
that Orbax release's restore).

Missing chunks follow the writer's reader: the T5X embedding's padded rows
were never written (fill_value null), and TensorStore reads them as zeros;
so must ckptfs.
"""

import os
from pathlib import Path

import numpy as np
import pytest

import ckfs_util as U

pytestmark = pytest.mark.oracle

FIX = U.REPO / "tests" / "fixtures" / "real-writers"
FOLDERS = sorted(p.stem for p in (FIX / "expected").glob("*.npz")) if (FIX / "expected").is_dir() else []


def expected_of(name):
    with np.load(FIX / "expected" / f"{name}.npz") as z:
        return {k: z[k] for k in z.files}


def mounted_leaves(root):
    out = set()
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            if f.endswith((".npy", ".txt")) and f != "commit_success.txt":
                out.add(str(Path(dirpath, f).relative_to(root)))
    return out


def check_leaf(path, want):
    raw = U.read_all(path)
    if path.suffix == ".txt":
        assert raw == want.tobytes(), f"{path}: {raw!r}, the writer's reader gives {want.tobytes()!r}"
        return
    _v, hl, shape, fortran, _dt, head = U.parse_npy_header(raw[:4096])
    assert not fortran
    assert tuple(shape) == want.shape, f"{path}: shape {shape}, want {want.shape}"
    descr = f"<V{want.dtype.itemsize}" if want.dtype.kind == "V" else want.dtype.str
    assert f"'descr': '{descr}'" in head, f"{path}: header {head!r}, want {want.dtype}"
    assert raw[hl:] == np.array(want, order="C").tobytes(), f"{path}: bytes differ from the writer's reader"


@pytest.mark.parametrize("name", FOLDERS)
def test_reads_as_the_writers_reader(name, mount):
    want = expected_of(name)
    m = mount(FIX / name)
    got = mounted_leaves(m.p())
    assert got == set(want), (f"{name}: only in the mount {sorted(got - set(want))}, "
                              f"only in the writer's restore {sorted(set(want) - got)}")
    for rel, w in want.items():
        check_leaf(m.p(rel), w)


def test_fixture_set():
    assert {"t5x", "flax_legacy", "flax_orbax"} <= set(FOLDERS), FOLDERS


def test_t5x_never_written_chunks_read_as_zeros(mount):
    """The padded rows of the T5X embedding (chunks 6.0 and 7.0 of a
    fill_value null zarr v2 array, never written) read as zeros, the whole
    array and a slice of the padding alike."""
    step = FIX / "t5x" / "checkpoint_1000"
    emb = step / "target.token_embedder.embedding"
    assert '"fill_value":null' in (emb / ".zarray").read_text()
    assert not (emb / "6.0").exists() and not (emb / "7.0").exists() and (emb / "5.0").exists()
    m = mount(FIX / "t5x")
    rel = "checkpoint_1000/optimizer/target/token_embedder/embedding.npy"
    a = np.load(m.p(rel))
    assert a.shape == (128, 16) and a.dtype == np.float32
    assert not a[96:].any()
    assert a[:90].any()
    want = expected_of("t5x")[rel]
    assert a.tobytes() == want.tobytes()
