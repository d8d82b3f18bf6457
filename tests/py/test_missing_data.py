"""Reading: a missing byte is an error, never a zero.

Orbax writes every chunk (also those equal to the fill value), records
`store_array_data_equal_to_fill_value: true` in _METADATA and restores with
TensorStore's `fill_missing_data_reads: false`.  So where that flag is
true, a chunk / shard / inner chunk / OCDBT key that the metadata implies
but the store lacks makes the read of that range fail with EIO (other
ranges of the array still read), logged once with the array and the chunk
coordinates.  Where the flag is absent or false a missing chunk is the fill
value, as zarr specifies and TensorStore reads it: zeros for a zarr v2
fill_value null.

Unreadable metadata never makes data vanish: an array named in _METADATA
whose .zarray / zarr.json is missing or corrupt, or an item whose OCDBT
manifest or data folder is gone, stays listed and answers EIO; a
safetensors view that would have to omit it answers EIO; `cp -r` of the
mount then exits non-zero.  Data that disappears or changes under a mount
is never served as zeros or stale bytes.

Every case works on a copy of the real Orbax fixtures (or of a step written
through the mount, or of an OCDBT database made by scripts/gen_ocdbt.py).
"""

import errno
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

import ckfs_util as U
from ckfs_help import Q, Q_REL, new_shard_bytes, check_others, read_shard, shard_layout, write_shard
from ckfs_help import _writable_copy
from ckfs_help import root_with_step_10

try:
    import zstandard
except ImportError:  # python3-zstandard
    zstandard = None

GONE_ERRNOS = (errno.ENOENT, errno.EIO, errno.ESTALE)


# ---------------------------------------------------------------------------
# helpers

def copy_fixture(name, dst):
    _writable_copy(U.FIXTURES / name, dst)
    return dst


def set_flag(item, value):
    """store_array_data_equal_to_fill_value: True / False / None (absent)."""
    p = Path(item) / "_METADATA"
    meta = json.loads(p.read_text())
    if value is None:
        meta.pop("store_array_data_equal_to_fill_value", None)
    else:
        meta["store_array_data_equal_to_fill_value"] = value
    p.write_text(json.dumps(meta))


def edit_json(path, **members):
    p = Path(path)
    doc = json.loads(p.read_text())
    doc.update(members)
    p.write_text(json.dumps(doc))


def data_of(path, nbytes):
    """The data bytes of a mounted .npy (the last nbytes)."""
    b = U.read_all(path)
    assert len(b) >= nbytes, f"{path}: {len(b)} bytes, fewer than the {nbytes} data bytes"
    return b[len(b) - nbytes:]


def slice_rel(rel, text):
    return rel[:-4] + text + ".npy"


def coord_re(coords):
    """A chunk's grid coordinates as a log line may write them: 1.1, 1/1, (1, 1), [1,1], c/1/1."""
    return re.compile(r"(?<![\d.])" + r"\s*[.,/]\s*".join(str(c) for c in coords) + r"(?!\d)")


def log_lines_naming(log, param, coords):
    names = (param, param.replace(".", "/"))
    rx = coord_re(coords)
    return [ln for ln in log.splitlines() if any(n in ln for n in names) and rx.search(ln)]


def load_gen_ocdbt():
    path = U.REPO / "scripts" / "gen_ocdbt.py"
    if not path.exists():
        pytest.fail(f"{path} is missing (the OCDBT cases build their database with it)")
    spec = importlib.util.spec_from_file_location("gen_ocdbt_t10", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def make_ocdbt(out, drop=None, zarr3=True):
    """Three float32 [32, 32] arrays layer_00000i.w in [16, 32] chunks,
    values arange(1024) + i, in one OCDBT database; `drop` = (i, chunk key)
    leaves that chunk's key out of the database (its metadata stays)."""
    g = load_gen_ocdbt()
    orig = g.array_entries

    def entries(args, i):
        name, shape, chunks, mkey, meta, kv = orig(args, i)
        if drop and drop[0] == i:
            kv = [(k, v) for k, v in kv if not k.endswith("/" + drop[1])]
        return name, shape, chunks, mkey, meta, kv

    g.array_entries = entries
    argv = sys.argv
    sys.argv = ["gen_ocdbt.py", str(out), "--arrays", "3", "--large-every", "1",
                "--zarr3" if zarr3 else "--zarr2"]
    try:
        g.main()
    finally:
        sys.argv = argv
    return out


def ocdbt_values(i):
    return (np.arange(1024, dtype=np.float32) + i).reshape(32, 32)


@dataclass
class Case:
    root: Path
    rel: str                 # the damaged array in the mount
    param: str
    want: np.ndarray         # full array, the hole filled with `fill`
    box: tuple               # the missing chunk's box
    coords: tuple            # its grid coordinates
    good: str                # a slice text that avoids the hole
    bad: str                 # a slice text that overlaps it
    others: dict = field(default_factory=dict)   # rel -> expected data bytes (OCDBT case)
    fixture_keys: bool = False                   # check_others() over expected.json


def make_case(kind, tmp_path, expected, flag=True, fill=0.0):
    """Build a copy with one missing piece; flag sets the _METADATA flag."""
    root = tmp_path / kind
    if kind == "ocdbt_key":
        make_ocdbt(root, drop=(1, "c/1/0"))
        want = ocdbt_values(1).copy()
        box = np.s_[16:32, :]
        want[box] = fill
        others = {f"layer_00000{i}/w.npy": ocdbt_values(i).tobytes() for i in (0, 2)}
        c = Case(root, "layer_000001/w.npy", "layer_000001.w", want, box, (1, 0), "[0:16]", "[16:32]",
                 others=others)
    else:
        e = expected[Q]
        want = np.frombuffer(e.data, dtype=np.float32).reshape(e.shape).copy()
        box = np.s_[8:16, 24:48]
        want[box] = fill
        if kind == "z2_chunk":
            copy_fixture("pytree_zarr2", root)
            os.unlink(root / Q / "1.1")
            if fill is not None:
                edit_json(root / Q / ".zarray", fill_value=fill)
        else:
            copy_fixture("pytree_zarr3", root)
            shard = root / Q / "c" / "1" / "1"
            if kind == "z3_shard":
                os.unlink(shard)
            elif kind == "z3_inner_chunk":
                n = shard_layout(root / Q)
                b, entries = read_shard(shard, n)
                entries[0] = [2**64 - 1, 2**64 - 1]  # the inner chunk is marked missing in the index
                write_shard(shard, b[:len(b) - 16 * n - 4], entries)
            else:
                raise KeyError(kind)
            if fill is not None:
                edit_json(root / Q / "zarr.json", fill_value=fill)
        c = Case(root, Q_REL, Q, want, box, (1, 1), "[0:8]", "[8:16]", fixture_keys=True)
    set_flag(root, flag)
    return c


KINDS = ["z2_chunk", "z3_shard", "z3_inner_chunk", pytest.param("ocdbt_key", marks=pytest.mark.ocdbt)]


def check_other_arrays(m, c, expected):
    if c.fixture_keys:
        check_others(m, expected, c.param)
    for rel, data in c.others.items():
        assert data_of(m.p(rel), len(data)) == data, f"{rel}: wrong bytes"


# ---------------------------------------------------------------------------
# missing data with the flag true: EIO on the affected range only

@pytest.mark.parametrize("kind", KINDS)
def test_missing_piece_is_eio_when_flag_true(kind, tmp_path, mount, expected):
    c = make_case(kind, tmp_path, expected, flag=True)
    m = mount(c.root)
    p = m.p(c.rel)
    assert p.name in os.listdir(p.parent), "the array must stay listed"
    # the size comes from the metadata, which is intact
    assert os.stat(p).st_size >= c.want.nbytes
    for _ in range(3):
        assert U.errno_of(U.read_all, p) == errno.EIO, f"reading {c.rel} with a missing chunk must fail with EIO"
    assert U.errno_of(U.read_all, m.p(slice_rel(c.rel, c.bad))) == errno.EIO, \
        "a slice overlapping the missing chunk must fail with EIO"
    # the rest of the array still reads
    good = m.p(slice_rel(c.rel, c.good))
    sl = np.s_[0:8] if c.good == "[0:8]" else np.s_[0:16]
    want = np.ascontiguousarray(c.want[sl])
    assert data_of(good, want.nbytes) == want.tobytes(), f"{good.name}: a slice avoiding the hole must read"
    check_other_arrays(m, c, expected)
    m.unmount()
    lines = log_lines_naming(m.log(), c.param, c.coords)
    assert len(lines) == 1, (f"the missing chunk must be logged once with {c.param} and its coordinates "
                             f"{c.coords}; matching lines: {lines}\n{m.log()[-3000:]}")


# ---------------------------------------------------------------------------
# flag absent or false: the fill value, as zarr specifies

@pytest.mark.parametrize("flag", [None, False], ids=["flag_absent", "flag_false"])
@pytest.mark.parametrize("kind", KINDS)
def test_missing_piece_is_fill_when_flag_not_true(kind, flag, tmp_path, mount, expected):
    c = make_case(kind, tmp_path, expected, flag=flag, fill=0.0)
    m = mount(c.root)
    want = c.want.tobytes()
    assert data_of(m.p(c.rel), len(want)) == want
    check_other_arrays(m, c, expected)


@pytest.mark.parametrize("flag", [None, False], ids=["flag_absent", "flag_false"])
def test_missing_piece_with_nonzero_fill(flag, tmp_path, mount, expected):
    c = make_case("z3_shard", tmp_path, expected, flag=flag, fill=2.5)
    m = mount(c.root)
    want = c.want.tobytes()
    assert data_of(m.p(c.rel), len(want)) == want


@pytest.mark.parametrize("flag", [None, False], ids=["flag_absent", "flag_false"])
def test_zarr2_null_fill_missing_chunk_is_zeros(flag, tmp_path, mount, expected):
    """fill_value null states no fill value; TensorStore (and so Orbax's
    restore without the flag, and T5X) and zarr read a chunk that is not
    stored as zeros, and so does ckptfs."""
    c = make_case("z2_chunk", tmp_path, expected, flag=flag, fill=None)
    assert json.loads((c.root / Q / ".zarray").read_text())["fill_value"] is None
    want = c.want.copy()
    want[c.box] = 0
    m = mount(c.root)
    assert data_of(m.p(c.rel), want.nbytes) == want.tobytes()
    hole = np.ascontiguousarray(want[8:16])
    assert data_of(m.p(slice_rel(c.rel, c.bad)), hole.nbytes) == hole.tobytes()
    check_others(m, expected, Q)


def test_zarr2_null_fill_missing_chunk_is_eio_when_flag_true(tmp_path, mount, expected):
    c = make_case("z2_chunk", tmp_path, expected, flag=True, fill=None)
    assert json.loads((c.root / Q / ".zarray").read_text())["fill_value"] is None
    m = mount(c.root)
    assert U.errno_of(U.read_all, m.p(c.rel)) == errno.EIO
    good = m.p(slice_rel(c.rel, c.good))
    want = np.ascontiguousarray(c.want[0:8])
    assert data_of(good, want.nbytes) == want.tobytes()
    check_others(m, expected, Q)


def test_missing_shard_of_written_step_is_eio(tmp_path, mount):
    src, w, exp = root_with_step_10(mount, tmp_path)
    w.unmount()
    meta = json.loads((src / "10" / "state" / "_METADATA").read_text())
    assert meta["store_array_data_equal_to_fill_value"] is True
    shards = sorted(p for p in (src / "10" / "state" / "a" / "c").rglob("*") if p.is_file())
    assert shards
    os.unlink(shards[0])
    m = mount(src)
    assert "a.npy" in os.listdir(m.p("10/state"))
    assert U.errno_of(U.read_all, m.p("10/state/a.npy")) == errno.EIO
    assert U.read_all(m.p("10/state/sub/b.npy")) == exp["state/sub/b.npy"].file_bytes()


# ---------------------------------------------------------------------------
# unreadable metadata: the array stays listed and answers EIO

def _unlink(rel):
    return lambda r: os.unlink(r / rel)


def _garbage(rel, text='{"shape": [32, 48], "chunks": '):
    return lambda r: (r / rel).write_text(text)


META_CASES = [
    ("z2_zarray_missing", "pytree_zarr2", _unlink(f"{Q}/.zarray")),
    ("z2_zarray_corrupt", "pytree_zarr2", _garbage(f"{Q}/.zarray")),
    ("z2_zarray_not_object", "pytree_zarr2", _garbage(f"{Q}/.zarray", "[1, 2]")),
    ("z3_zarr_json_missing", "pytree_zarr3", _unlink(f"{Q}/zarr.json")),
    ("z3_zarr_json_corrupt", "pytree_zarr3", _garbage(f"{Q}/zarr.json")),
    ("z3_array_folder_missing", "pytree_zarr3", lambda r: shutil.rmtree(r / Q)),
]


@pytest.mark.parametrize("case,fixture,damage", META_CASES, ids=[c[0] for c in META_CASES])
def test_unreadable_metadata_stays_listed_and_eio(case, fixture, damage, tmp_path, mount, expected):
    root = copy_fixture(fixture, tmp_path / fixture)
    damage(root)
    m = mount(root)
    p = m.p(Q_REL)
    assert p.name in os.listdir(p.parent), f"{Q_REL} must stay listed"
    assert U.errno_of(U.read_all, p) == errno.EIO
    assert U.errno_of(U.read_all, m.p(slice_rel(Q_REL, "[0:8]"))) == errno.EIO
    check_others(m, expected, Q)
    m.unmount()
    assert Q in m.log() or Q.replace(".", "/") in m.log(), "the reason must be logged with the array"


OCDBT_CASES = [
    ("manifest_missing", lambda s: (os.unlink(s / "manifest.ocdbt"), shutil.rmtree(s / "ocdbt.process_0"))),
    ("data_folder_missing", lambda s: shutil.rmtree(s / "d")),
]


@pytest.mark.ocdbt
@pytest.mark.parametrize("case,damage", OCDBT_CASES, ids=[c[0] for c in OCDBT_CASES])
def test_ocdbt_store_missing_arrays_listed_eio(case, damage, tmp_path, mount):
    root = copy_fixture("manager", tmp_path / "manager")
    damage(root / "20" / "state")
    m = mount(root)
    lay = U.layout("manager", root)
    n20 = 0
    for rel in lay.arrays:
        p = m.p(rel)
        if rel.startswith("20/"):
            n20 += 1
            assert p.name in os.listdir(p.parent), f"{rel} must stay listed"
            assert U.errno_of(U.read_all, p) == errno.EIO, rel
        else:
            U.read_all(p)  # step 10 is intact
    assert n20 == 10
    m.unmount()
    assert "20/state" in m.log()


# ---------------------------------------------------------------------------
# views and copies never silently lose an array

def _missing_shard(r):
    os.unlink(r / Q / "c" / "1" / "1")


VIEW_CASES = [("zarr_json_corrupt", _garbage(f"{Q}/zarr.json")), ("shard_missing", _missing_shard)]


def view_params(reason):
    """VIEW_CASES (`reason` says what each guards against)."""
    return [pytest.param(*c, id=c[0]) for c in VIEW_CASES]


@pytest.mark.parametrize("case,damage",
                         view_params("params.safetensors silently leaves out an unreadable array"))
def test_safetensors_view_never_omits(case, damage, tmp_path, mount):
    root = copy_fixture("pytree_zarr3", tmp_path / "z3")
    damage(root)
    m = mount(root)
    assert U.errno_of(U.read_all, m.p("params.safetensors")) == errno.EIO
    assert U.errno_of(U.read_all, m.p("params/layer_0.safetensors")) == errno.EIO
    # a subtree without the broken array still converts
    assert len(U.read_all(m.p("params/embed.safetensors"))) > 64 * 32 * 2


def cp_r(m, dst):
    """cp -r of the whole mount m to dst; the CompletedProcess (stderr kept)."""
    return subprocess.run(["cp", "-r", str(m.p()), str(dst)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_cp_r_of_intact_mount_succeeds(tmp_path, mount):
    root = copy_fixture("pytree_zarr3", tmp_path / "z3")
    m = mount(root)
    r = cp_r(m, tmp_path / "copy")
    assert r.returncode == 0, r.stderr.decode()


@pytest.mark.parametrize("case,damage",
                         view_params("cp -r of the mount exits 0 with an array missing or zeroed"))
def test_cp_r_fails_when_something_is_unreadable(case, damage, tmp_path, mount):
    root = copy_fixture("pytree_zarr3", tmp_path / "z3")
    damage(root)
    m = mount(root)
    r = cp_r(m, tmp_path / "copy")
    assert r.returncode != 0, "cp -r must report the unreadable array"
    assert b"q_proj" in r.stderr


# ---------------------------------------------------------------------------
# data that changes or disappears under the mount

needs_zstd = pytest.mark.skipif(zstandard is None, reason="python3-zstandard is not installed")


@needs_zstd
def test_replaced_shard_is_never_served_stale(tmp_path, mount, expected):
    root = copy_fixture("pytree_zarr3", tmp_path / "z3")
    m = mount(root)
    e = expected[Q]
    old = np.frombuffer(e.data, dtype=np.float32).reshape(e.shape)
    assert data_of(m.p(Q_REL), len(e.data)) == e.data
    patch = np.arange(8 * 24, dtype=np.float32).reshape(8, 24) + 1000.0
    (root / Q / "c" / "1" / "1").write_bytes(new_shard_bytes(patch))
    new = old.copy()
    new[8:16, 24:48] = patch
    for rel, want in ((Q_REL, new), (slice_rel(Q_REL, "[8:16]"), new[8:16])):
        try:
            got = data_of(m.p(rel), want.nbytes)
        except OSError as ex:
            assert ex.errno in GONE_ERRNOS + (errno.ESTALE,), f"{rel}: errno {ex.errno}"
            continue
        assert got == np.ascontiguousarray(want).tobytes(), f"{rel}: stale or wrong bytes after the shard changed"


def test_deleted_shard_after_read_is_eio(tmp_path, mount, expected):
    root = copy_fixture("pytree_zarr3", tmp_path / "z3")
    m = mount(root)
    e = expected[Q]
    assert data_of(m.p(Q_REL), len(e.data)) == e.data
    os.unlink(root / Q / "c" / "1" / "1")
    assert U.errno_of(U.read_all, m.p(Q_REL)) == errno.EIO
    assert U.errno_of(U.read_all, m.p(slice_rel(Q_REL, "[8:16]"))) == errno.EIO
    want = np.frombuffer(e.data, dtype=np.float32).reshape(e.shape)[0:8]
    assert data_of(m.p(slice_rel(Q_REL, "[0:8]")), want.nbytes) == want.tobytes()


@pytest.mark.ocdbt
def test_pruned_step_is_not_served(tmp_path, mount):
    root = copy_fixture("manager", tmp_path / "manager")
    m = mount(root)
    rel = "10/state/" + Q_REL
    first = U.read_all(m.p(rel))
    assert len(first) > 32 * 48 * 4
    shutil.rmtree(root / "10")
    assert U.errno_of(os.stat, m.p("10")) in GONE_ERRNOS
    assert U.errno_of(U.read_all, m.p(rel)) in GONE_ERRNOS
    assert U.errno_of(U.read_all, m.p("10/state/params.safetensors")) in GONE_ERRNOS
    U.read_all(m.p("20/state/" + Q_REL))  # the other step is untouched
