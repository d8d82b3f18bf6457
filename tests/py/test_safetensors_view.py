"""X.safetensors: every array under directory X/ as one safetensors file
(docs/usage.md), checked with the independent parser st_spec (all format
checks plus the reference writer's conventions), against expected/, and
tensor by tensor against the params.safetensors that safetensors 0.8
wrote from the same arrays.

Tensor names are the '.'-joined key paths relative to X; __metadata__ is
{"format": "pt"} plus "step" on CheckpointManager-root mounts.
"""

import errno
import json
import mmap
import os
import re
import shutil
import subprocess

import pytest

import ckfs_util as U
import st_spec
from st_spec import load

ST_DTYPE = {"float32": "F32", "bfloat16": "BF16", "int32": "I32", "float64": "F64", "int64": "I64",
            "float16": "F16", "uint8": "U8", "int8": "I8"}


class Case:
    """One safetensors view: the mount source, the view's path in the
    mount, the arrays it must hold and the __metadata__ it must carry."""

    def __init__(self, cid, source, view, tensors, metadata):
        self.id = cid
        self.source = source
        self.view = view            # e.g. "20/state/params.safetensors"
        self.tensors = tensors      # {tensor name: expected key}
        self.metadata = metadata

    def __repr__(self):
        return self.id


def arrays_under(lay, d, strip=""):
    """{tensor name: expected key} of the arrays under directory d of the
    layout; `strip` is a prefix of the layout's paths the mount lacks."""
    pre = d + "/" if d else ""
    out = {}
    for rel, a in lay.arrays.items():
        if rel.startswith(strip + pre):
            out[rel[len(strip + pre): -len(".npy")].replace("/", ".")] = a.key
    assert out, f"no arrays under {strip + d}"
    return out


def cases():
    out = []

    def add(cid, source, view, tensors, metadata, ocdbt=False):
        marks = (pytest.mark.ocdbt,) if ocdbt else ()
        out.append(pytest.param(Case(cid, source, view, tensors, metadata), id=cid, marks=marks))

    pt = {"format": "pt"}
    for name in ("pytree_zarr2", "pytree_zarr3"):
        lay = U.layout(name)
        for d in ("params", "opt_state", "params/layer_0", "params/layer_0/mlp"):
            add(f"{name}:{d}", lay.source, d + ".safetensors", arrays_under(lay, d), pt)
    lay = U.layout("manager")
    for step in ("10", "20"):
        for d in ("state/params", "state/opt_state", "state"):
            add(f"manager:{step}/{d}", lay.source, f"{step}/{d}.safetensors", arrays_under(lay, f"{step}/{d}"),
                {"format": "pt", "step": step}, ocdbt=True)
    # the whole item on a step mount: MNT/state.safetensors, no "step"
    add("manager/20:state", lay.source / "20", "state.safetensors", arrays_under(lay, "state", strip="20/"), pt,
        ocdbt=True)
    lay = U.layout("v1_checkpointables")
    for d in ("params", "opt_state"):
        add(f"v1_checkpointables:{d}", lay.source, d + ".safetensors", arrays_under(lay, d), pt, ocdbt=True)
    return out


CASES = cases()


def pick(*ids):
    out = [p for p in CASES if p.values[0].id in ids]
    assert len(out) == len(ids)
    return out


@pytest.fixture(scope="module")
def mounts(module_mount):
    """One daemon per source, shared by the module's cases."""
    by_src = {}

    def get(source):
        if source not in by_src:
            by_src[source] = module_mount(source)
        return by_src[source]
    return get


@pytest.fixture(scope="session")
def fixture_st(fixtures_dir):
    tensors, meta = load(fixtures_dir / "params.safetensors")
    return tensors


@pytest.mark.parametrize("c", CASES)
def test_view(c, mounts, expected, fixture_st):
    m = mounts(c.source)
    p = m.p(c.view)
    st = os.stat(p)
    assert U.is_file_mode(st.st_mode), f"{p}: mode {oct(st.st_mode)}"
    m.assert_on_mount(p)
    # not listed without show_companions
    assert os.path.basename(c.view) not in os.listdir(os.path.dirname(p)), f"{c.view} is listed"

    whole = U.read_all(p)
    assert len(whole) == st.st_size, f"{c.view}: read {len(whole)} bytes, st_size {st.st_size}"
    parsed = st_spec.parse(whole)  # every format check (strict), raises SpecError
    assert parsed.file_size == st.st_size
    dev = st_spec.writer_deviations(parsed)
    assert not dev, f"{c.view}: departs from the reference writer's conventions: {dev}"
    want_size = 8 + parsed.n + sum(expected[k].data.__len__() for k in c.tensors.values())
    assert st.st_size == want_size, f"{c.view}: st_size {st.st_size}, want {want_size}"

    tensors, metadata = load(p)  # the same checks through the file API
    assert metadata == c.metadata, f"{c.view}: __metadata__ {metadata}, want {c.metadata}"
    assert set(tensors) == set(c.tensors), \
        f"{c.view}: tensors {sorted(tensors)}, want {sorted(c.tensors)}"
    for name, key in sorted(c.tensors.items()):
        exp = expected[key]
        dt, shape, data = tensors[name]
        assert dt == ST_DTYPE[exp.dtype], f"{c.view}:{name}: dtype {dt}, want {ST_DTYPE[exp.dtype]}"
        assert shape == exp.shape, f"{c.view}:{name}: shape {shape}, want {exp.shape}"
        assert data == exp.data, f"{c.view}:{name}: bytes differ from expected/{key}"
        assert parsed.as_dict()[name] == tensors[name]

    # tensor by tensor against the file safetensors 0.8 wrote (full key
    # paths there; it holds the non-scalar arrays only)
    compared = 0
    for name, key in sorted(c.tensors.items()):
        if key not in fixture_st:
            assert expected[key].shape == (), f"{key} (a non-scalar) is missing from the fixture"
            continue
        fdt, fshape, fdata = fixture_st[key]
        dt, shape, data = tensors[name]
        assert (dt, shape) == (fdt, fshape), f"{c.view}:{name}: {dt} {shape}, fixture {key}: {fdt} {fshape}"
        assert data == fdata, f"{c.view}:{name}: bytes differ from the fixture's {key}"
        compared += 1
    assert compared == sum(1 for k in c.tensors.values() if expected[k].shape != ())


@pytest.mark.parametrize("c", pick("pytree_zarr2:params", "pytree_zarr3:opt_state", "manager:20/state",
                                  "manager/20:state", "v1_checkpointables:params"))
def test_mmap_and_copy(c, mounts, tmp_path):
    m = mounts(c.source)
    p = m.p(c.view)
    whole = U.read_all(p)
    parsed = st_spec.parse(whole)
    with open(p, "rb") as f:
        with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
            assert len(mm) == len(whole)
            assert mm[:8] == whole[:8]
            for t in parsed.tensors:
                b, e = parsed.data_start + t.begin, parsed.data_start + t.end
                assert mm[b:e] == t.data, f"{c.view}:{t.name}: mmap bytes differ"
            assert mm[:] == whole
            assert mm[len(whole) - 3:] == whole[-3:]
    dst = tmp_path / "copy.safetensors"
    shutil.copyfile(p, dst)
    assert dst.read_bytes() == whole
    dst2 = tmp_path / "cp.safetensors"
    r = subprocess.run(["cp", str(p), str(dst2)], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert dst2.read_bytes() == whole
    tensors, _ = load(dst2)
    assert set(tensors) == set(c.tensors)


def test_views_of_missing_dirs(mounts):
    """Only a directory X has an X.safetensors."""
    lay = U.layout("pytree_zarr3")
    m = mounts(lay.source)
    for bad in ("nosuch.safetensors", "step.safetensors", "step.npy.safetensors", "_METADATA.safetensors",
                "params/layer_0/mlp/w1.safetensors"):  # ".safetensors" is the top directory's own view
        e = U.errno_of(os.stat, m.p(bad))
        assert e == errno.ENOENT, f"{bad}: errno {e}, want ENOENT"


def stats(m):
    with open(m.p(".ckptfs/stats"), "rb") as f:
        return json.loads(f.read())


def decode_units(path):
    """How many units the daemon decodes to produce the whole array."""
    shape = json.loads(os.getxattr(path, "user.ckpt.shape"))
    codec = os.getxattr(path, "user.ckpt.codec").decode()
    mt = re.match(r"sharding_indexed\(inner=\[([0-9,]*)\]", codec)
    unit = [int(x) for x in mt.group(1).split(",") if x] if mt else json.loads(os.getxattr(path, "user.ckpt.chunks"))
    n = 1
    for s, u in zip(shape, unit):
        n *= -(-s // u)
    return n


@pytest.mark.parametrize("c", pick("pytree_zarr2:params", "pytree_zarr3:params", "manager:20/state",
                                  "v1_checkpointables:params"))
def test_tensor_range_decodes_only_its_chunks(c, mount, expected):
    """On a fresh mount, reading one tensor's byte range of the view
    decodes exactly that array's chunks.  O_DIRECT keeps the kernel from
    widening the read to whole pages (which would take bytes of the
    neighbouring tensors) and from reading ahead."""
    m = mount(c.source)
    p = m.p(c.view)
    base = c.view[: -len(".safetensors")]
    units = {name: decode_units(m.p((base + "/" + name.replace(".", "/") + ".npy")))
             for name in c.tensors}
    try:
        fd = os.open(p, os.O_RDONLY | os.O_DIRECT)
    except OSError as e:
        pytest.skip(f"O_DIRECT open on the mount: {e}")
    try:
        before = stats(m)["chunks_decoded"]
        head = os.pread(fd, 8, 0)
        n = int.from_bytes(head, "little")
        head += os.pread(fd, n, 8)
        size = os.fstat(fd).st_size
        parsed = st_spec.parse_header(head, size)
        assert stats(m)["chunks_decoded"] == before, "reading the header decoded chunks"
        order = sorted(parsed.tensors, key=lambda t: (t.end - t.begin, t.name))  # small ones first
        for t in order:
            before = stats(m)["chunks_decoded"]
            data = os.pread(fd, t.end - t.begin, parsed.data_start + t.begin)
            got = stats(m)["chunks_decoded"] - before
            assert data == expected[c.tensors[t.name]].data, f"{c.view}:{t.name}: bytes"
            assert got == units[t.name], \
                f"{c.view}:{t.name}: reading its byte range decoded {got} chunks, the array has {units[t.name]}"
    finally:
        os.close(fd)
