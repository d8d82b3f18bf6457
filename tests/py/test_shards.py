"""NAME.shards/: one hidden file per stored chunk/shard, named by its
canonical slice (docs/usage.md), and `-o show_companions`, which lists
NAME.shards/ and X.safetensors in readdir."""

import errno
import json
import os
import stat

import numpy as np
import pytest

import ckfs_util as U


def shards_rel(rel):
    return rel[: -len(".npy")] + ".shards"


def canonical(box):
    return "[" + ",".join(f"{a}:{b}" for a, b in box) + "].npy"


def parse_box(name):
    """'[0:16,32:64].npy' -> [(0, 16), (32, 64)]; '[].npy' -> []."""
    assert name.startswith("[") and name.endswith("].npy"), name
    body = name[1:-5]
    if not body:
        return []
    out = []
    for part in body.split(","):
        a, b = part.split(":")
        out.append((int(a), int(b)))
    return out


def stored_boxes(lay, rel, exp):
    """The boxes of the stored chunks/shards of an array, from the source:
    the chunk files of a per-file zarr array; for OCDBT stores the full
    chunk grid (every chunk of these fixtures is stored, as their per-file
    twins pytree_zarr2/3 show)."""
    a = lay.arrays[rel]
    shape = list(exp.shape)
    if lay.ocdbt:
        chunks = U.array_metadatas_chunk_shape(a.item_src, a.param)
        assert chunks is not None, rel
        grid = [-(-s // c) for s, c in zip(shape, chunks)]
        idxs = [()]
        for g in grid:
            idxs = [i + (k,) for i in idxs for k in range(g)]
    else:
        d = a.item_src / a.param
        if (d / ".zarray").exists():
            z = json.loads((d / ".zarray").read_text())
            chunks = z["chunks"]
            sep = z.get("dimension_separator", ".")
            names = [p.name for p in d.iterdir() if p.is_file() and not p.name.startswith(".z")]
            idxs = [tuple(int(x) for x in n.split(sep)) if shape else () for n in names]
        else:
            z = json.loads((d / "zarr.json").read_text())
            chunks = z["chunk_grid"]["configuration"]["chunk_shape"]
            c = d / "c"
            if c.is_file():
                idxs = [()]
            else:
                idxs = [tuple(int(x) for x in p.relative_to(c).parts) for p in c.rglob("*") if p.is_file()]
    boxes = []
    for i in idxs:
        boxes.append([(k * ch, min((k + 1) * ch, s)) for k, ch, s in zip(i, chunks, shape)])
    return boxes, chunks


def test_not_listed_but_reachable(lm, expected):
    lay, m = lm
    for rel, a in sorted(lay.arrays.items()):
        p = m.p(shards_rel(rel))
        st = os.stat(p)
        assert U.is_dir_mode(st.st_mode), f"{p}: mode {oct(st.st_mode)}"
        m.assert_on_mount(p)
        parent = os.path.dirname(rel)
        names = os.listdir(m.p(parent))
        assert os.path.basename(rel) in names
        assert os.path.basename(shards_rel(rel)) not in names, f"{parent}: readdir lists the hidden .shards"
    for d in lay.dirs:
        names = os.listdir(m.p(d))
        hidden = [n for n in names if n.endswith(".shards") or n.endswith(".safetensors")]
        assert not hidden, f"{d or '/'}: lists companions {hidden} without show_companions"


def test_shard_files(lm, expected):
    """Listing = one file per stored chunk, named by its canonical slice;
    contents equal the slice of expected; the boxes tile the array exactly
    once; user.ckpt.shards agrees."""
    lay, m = lm
    for rel, a in sorted(lay.arrays.items()):
        exp = expected[a.key]
        full = exp.array()
        sd = m.p(shards_rel(rel))
        names = sorted(os.listdir(sd))
        boxes, chunks = stored_boxes(lay, rel, exp)
        want = sorted(canonical(b) for b in boxes)
        assert names == want, f"{rel}: shards listed {names}, stored chunks {want}"
        cover = np.zeros(exp.shape, dtype=np.int32)
        for name in names:
            box = parse_box(name)
            assert len(box) == len(exp.shape), f"{rel}/{name}: rank"
            p = sd / name
            st = os.stat(p)
            assert U.is_file_mode(st.st_mode), f"{p}: {oct(st.st_mode)}"
            sl = tuple(slice(s, e) for s, e in box)
            part = np.array(full[sl], order="C")
            raw = U.read_all(p)
            _, hl, shape, fortran, _, _ = U.parse_npy_header(raw)
            assert shape == part.shape, f"{rel}/{name}: header shape {shape}"
            assert st.st_size == hl + part.nbytes == len(raw), f"{rel}/{name}: st_size {st.st_size}"
            assert raw[hl:] == part.tobytes(), f"{rel}/{name}: data differs from the slice of expected"
            arr = np.load(p, allow_pickle=False)
            assert arr.shape == part.shape and arr.tobytes() == part.tobytes(), f"{rel}/{name}: np.load"
            cover[sl] += 1
        assert cover.min(initial=1) == 1 and cover.max(initial=1) == 1, \
            f"{rel}: shard boxes cover some elements {cover.min()}..{cover.max()} times"
        if not exp.shape:
            assert names == ["[].npy"] and cover == 1
        x = json.loads(os.getxattr(m.p(rel), "user.ckpt.shards"))
        grid = [-(-s // c) for s, c in zip(exp.shape, chunks)]
        assert x == {"count": len(names), "grid": grid}, f"{rel}: user.ckpt.shards {x}, listing {len(names)}, grid {grid}"
        assert json.loads(os.getxattr(m.p(rel), "user.ckpt.chunks")) == list(chunks), rel


def test_shard_by_name_on_fresh_mount(mount, expected):
    """A shard file is reachable by name before anything listed its
    directory; names that are not stored chunks are absent."""
    lay = U.layout("pytree_zarr3")
    m = mount(lay.source)
    rel = "params/layer_0/mlp/w1.npy"
    full = expected[lay.arrays[rel].key].array()
    sd = m.p(shards_rel(rel))
    arr = np.load(sd / "[16:32,96:128].npy", allow_pickle=False)
    assert arr.tobytes() == np.array(full[16:32, 96:128], order="C").tobytes()
    for bad in ("[0:16,0:31].npy", "[0:8,0:32].npy", "[0:16,0:32]", "[0,0].npy", "[0:16].npy",
                "[16:32,128:160].npy", "x.npy", "[0:16,0:32].npy.npy"):
        e = U.errno_of(os.stat, sd / bad)
        assert e == errno.ENOENT, f"{bad}: errno {e}, want ENOENT"
    for bad in ("nosuch.shards", "mlp.shards", "w1.npy.shards"):
        e = U.errno_of(os.stat, m.p("params/layer_0/mlp") / bad)
        assert e == errno.ENOENT, f"{bad}: errno {e}, want ENOENT"
    assert U.errno_of(os.stat, m.p("params/layer_0") / "mlp.shards") == errno.ENOENT
    assert os.listdir(sd)  # and it still lists


@pytest.mark.parametrize("layout_name", ["pytree_zarr3", "pytree_zarr2",
                                         pytest.param("manager", marks=pytest.mark.ocdbt),
                                         pytest.param("v1_checkpointables", marks=pytest.mark.ocdbt)])
def test_show_companions(mount, layout_name):
    """With -o show_companions every directory also lists NAME.shards for
    each NAME.npy and X.safetensors for each sub-directory X, and nothing
    else beyond the plain tree."""
    lay = U.layout(layout_name)
    m = mount(lay.source, "show_companions")
    for d, plain in sorted(lay.dirs.items()):
        names = os.listdir(m.p(d))
        assert len(names) == len(set(names)), f"{d}: duplicate names {names}"
        subdirs = {n for n in plain if (d + "/" + n if d else n) in lay.dirs}
        arrays = {n for n in plain if (d + "/" + n if d else n) in lay.arrays}
        want = set(plain) | {n[:-4] + ".shards" for n in arrays} | {n + ".safetensors" for n in subdirs}
        got = set(names) - lay.optional.get(d, set())
        assert got == want, f"{d or '/'}: missing {sorted(want - got)}, extra {sorted(got - want)}"
        for n in names:
            st = os.lstat(m.p(d) / n)
            if n.endswith(".shards") and n[:-7] + ".npy" in arrays:
                assert U.is_dir_mode(st.st_mode), f"{d}/{n}: {oct(st.st_mode)}"
            elif n.endswith(".safetensors") and n[:-12] in subdirs:
                assert U.is_file_mode(st.st_mode), f"{d}/{n}: {oct(st.st_mode)}"
                assert st.st_size >= 8, f"{d}/{n}: st_size {st.st_size}"
        assert "[" not in "".join(names), f"{d}: slice names listed"
        assert ".ckptfs" not in names
    # the listed companions are the real thing: a shard directory lists its chunks
    rel = sorted(r for r in lay.arrays if r.endswith("w1.npy"))[0]
    assert len(os.listdir(m.p(shards_rel(rel)))) == json.loads(os.getxattr(m.p(rel), "user.ckpt.shards"))["count"]
