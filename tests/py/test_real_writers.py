"""Older writers, real ones: steps written by TensorStore in the shape of a
T5X checkpoint, zarr arrays written by zarr-python 3, by flax.training.checkpoints (with and without Orbax) and by
older orbax-checkpoint releases (tests/fixtures/real-writers/, see
tests/fixtures/README.md), read through a mount and compared, byte for byte, with what
the writer's own reader returned when the fixture was made
(`expected/<folder>.npz`: TensorStore's read, zarr's read, flax's
restore_checkpoint, that Orbax release's restore).  The writers judged the
fixtures when they were made, so this module needs only numpy and runs
with Debian's python3.

OCDBT manifests of Orbax 0.4 / 0.5 list a data file with an empty path
(TensorStore's first, empty generation); ckptfs reads them.

Missing chunks follow the writer's reader: the T5X embedding's padded rows
were never written (fill_value null), and TensorStore reads them as zeros;
zarr-python 3 leaves out the chunks equal to the fill value (null in zarr
v2, which it reads as zeros); so must ckptfs.
"""

import os
from pathlib import Path

import numpy as np
import pytest

import ckfs_util as U

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


def sources(name):
    """(mount source, path prefix of its leaves in expected) of a folder: an
    older Orbax release's folder holds several checkpoints, each mounted
    on its own; the others are mounted whole."""
    if not name.startswith("orbax-"):
        return [(FIX / name, "")]
    return [(p, p.name + "/") for p in sorted((FIX / name).iterdir()) if p.is_dir()]


@pytest.mark.parametrize("name", FOLDERS)
def test_reads_as_the_writers_reader(name, mount):
    want = expected_of(name)
    seen = set()
    for src, pre in sources(name):
        part = {k[len(pre):]: v for k, v in want.items() if k.startswith(pre)}
        assert part, f"{src}: nothing expected"
        m = mount(src)
        got = mounted_leaves(m.p())
        assert got == set(part), (f"{src}: only in the mount {sorted(got - set(part))}, "
                                  f"only in the writer's restore {sorted(set(part) - got)}")
        for rel, w in part.items():
            check_leaf(m.p(rel), w)
        seen |= {pre + k for k in part}
    assert seen == set(want)


SHAPES = sorted(str(p.relative_to(FIX)) for p in FIX.glob("orbax-*/shapes*") if p.is_dir())


@pytest.mark.parametrize("rel", SHAPES)
def test_empty_dict_and_none_leaves(rel, mount):
    """Orbax restores a {} leaf as {} and None as None (0.5 from _METADATA,
    where its `checkpoint` holds a placeholder and an empty folder for
    each): an empty folder, and nothing."""
    m = mount(FIX / rel)
    names = os.listdir(m.p())
    assert "empty" in names and os.path.isdir(m.p("empty")) and os.listdir(m.p("empty")) == []
    assert not [n for n in names if n.startswith(("none", "empty."))], names


@pytest.mark.parametrize("ver", ["0.6.4", "0.5.10"])
def test_orbax_before_the_flag_left_out_zero_chunks(ver, mount):
    """Orbax before store_array_data_equal_to_fill_value let TensorStore
    leave out the chunks equal to the zarr 3 fill value: an all-zero array
    has no chunk at all.  It restores as zeros, and so it reads."""
    step = FIX / f"orbax-{ver}" / "zeros_zarr3_ocdbt_0"
    assert "store_array_data_equal_to_fill_value" not in (step / "_METADATA").read_text()
    assert [p.name for p in (step / "opt_state.mu").rglob("*") if p.is_file()] == ["zarr.json"]
    m = mount(step)
    a = np.load(m.p("opt_state/mu.npy"))
    assert a.shape == (8, 6) and a.dtype == np.float32 and not a.any()
    assert a.tobytes() == expected_of(f"orbax-{ver}")["zeros_zarr3_ocdbt_0/opt_state/mu.npy"].tobytes()


@pytest.mark.parametrize("name", ["t5x", "zarr_python", "orbax-0.6.4/zeros_zarr3_ocdbt_0"])
def test_verify_counts_absent_chunks_as_fill(name):
    """`ckptfs verify` reads every array: chunks the writer left out are
    counted (read as the fill value), not problems; exit status 0."""
    import subprocess
    p = subprocess.run([str(U.BIN), "verify", str(FIX / name)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "with chunks absent (read as the fill value)" in p.stdout + p.stderr, p.stdout + p.stderr


def test_fixture_set():
    want = {"t5x", "zarr_python", "flax_legacy", "flax_orbax", "orbax-0.11.0", "orbax-0.6.4", "orbax-0.5.10", "orbax-0.4.8",
            "orbax-0.3.5", "orbax-0.2.7", "orbax-0.2.3", "flax_legacy-0.7.0", "flax_orbax-0.7.0", "flax_legacy-0.7.5", "flax_orbax-0.7.5",
            "flax_legacy-0.8.2", "flax_orbax-0.8.2"}
    assert want <= set(FOLDERS), sorted(want - set(FOLDERS))


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
