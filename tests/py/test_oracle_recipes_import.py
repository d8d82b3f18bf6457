"""View recipes the other way (docs/recipes.md, "The other direction").

Each family's step is saved by the real Orbax (the tree builders
test_oracle_recipes.py uses, in ckfs_help.py), its view folder copied out of a read-only mount
(`cp -r MNT/30/.views/NAME/ hf/`), then copied into a new pending step of a
writable root (`cp -r hf/ MNT/30/.views/NAME/`) and committed with `touch
MNT/30/commit_success.txt`.  Every array of the new step is compared with
the original step's, byte for byte, through the mount and through Orbax's
own restore of SOURCE/30; where the recipe scales by a number that is not
a power of two, the documented bound is checked instead (and that the new
step's view gives the imported folder's bytes again).  Refused recipes and
folders that do not fit (a missing tensor, a wrong shape, an unknown name,
tied weights that differ) fail with their errno and a log line, and leave
no step.
"""

import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

import ckfs_help as R

pytestmark = pytest.mark.oracle

E, H, K, D, F, L, V = R.RECIPE_DIMS


def run(cmd):
    p = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def npy_data(path):
    b = Path(path).read_bytes()
    n = struct.unpack("<H", b[8:10])[0]
    return b[10 + n:]


def arrays(step_dir):
    """{relative path: (dtype, shape, bytes)} of every array of a step
    folder of a mount."""
    out = {}
    for p in Path(step_dir).rglob("*.npy"):
        rel = str(p.relative_to(step_dir))
        out[rel] = (os.getxattr(p, "user.ckpt.dtype").decode(),
                    tuple(json.loads(os.getxattr(p, "user.ckpt.shape"))), npy_data(p))
    return out


def restore(root, step):
    """The items of SOURCE/step restored by Orbax: {key path: numpy array}."""
    import orbax.checkpoint as ocp
    mngr = ocp.CheckpointManager(str(root), item_names=("items",))
    got = mngr.restore(step, args=ocp.args.Composite(items=ocp.args.StandardRestore()))["items"]
    mngr.close()
    flat = {}

    def walk(t, pre):
        if isinstance(t, dict):
            for k, v in t.items():
                walk(v, pre + (str(k),))
        else:
            flat["/".join(pre)] = np.asarray(t)
    walk(got, ())
    return flat


def export(mount, tmp_path, state, recipe):
    """Save state as step 30, copy its view folder out: (root, folder)."""
    root = tmp_path / "src"
    R.recipe_save(root, 30, state)
    ro = mount(root, "ro")
    hf = tmp_path / "hf"
    rc, out = run(f"cp -r {ro.p('30/.views/' + recipe)}/ {hf}/")
    assert rc == 0, out
    return root, ro, hf


def import_(mount, tmp_path, hf, recipe, name="dst"):
    """A writable root, step 30 made by copying hf into .views/recipe/:
    (root, mount, exit code of the copy, of the commit)."""
    root = tmp_path / name
    root.mkdir()
    m = mount(root)
    os.mkdir(m.p("30"))
    rc, out = run(f"cp -r {hf}/ {m.p('30/.views/' + recipe)}/")
    if rc:
        return root, m, rc, out
    rc, out = run(f"touch {m.p('30/commit_success.txt')}")
    return root, m, rc, out


def ulps_bf16(a, b):
    """|a - b| in units in the last place of bfloat16 (raw bits, same sign)."""
    x = np.frombuffer(a, dtype=np.uint16).astype(np.int32)
    y = np.frombuffer(b, dtype=np.uint16).astype(np.int32)
    sx, sy = x >> 15, y >> 15
    mag = lambda v, s: np.where(s == 1, -(v & 0x7FFF), v & 0x7FFF)  # noqa: E731
    return np.abs(mag(x, sx) - mag(y, sy))


def assert_same_step(ro_src, root_dst, mount, inexact=()):
    """Every array of step 30 in both roots: same names, dtypes, shapes and
    bytes (through the mount and through Orbax's restore); names matching
    one of `inexact` within one unit in the last place."""
    fresh = mount(root_dst, "ro")
    want, got = arrays(ro_src.p("30")), arrays(fresh.p("30"))
    assert sorted(want) == sorted(got), sorted(set(want) ^ set(got))
    loose = 0
    for k, (dt, shape, data) in want.items():
        gdt, gshape, gdata = got[k]
        assert (dt, shape) == (gdt, gshape), k
        if any(s in k for s in inexact):
            assert dt == "bfloat16", k
            u = ulps_bf16(data, gdata)
            assert u.max() <= 1, (k, int(u.max()))
            loose += int((u > 0).sum())
        else:
            assert data == gdata, k
    ws, gs = restore(ro_src.source, 30), restore(root_dst, 30)
    assert sorted(ws) == sorted(gs)
    for k in ws:
        if not any(s.replace("/", ".") in k.replace("/", ".") for s in inexact):
            assert ws[k].tobytes() == gs[k].tobytes(), k
    return fresh, loose


def assert_no_step(m, root):
    assert not os.path.exists(m.p("30/commit_success.txt"))
    assert not (root / "30").exists()


def test_maxtext_llama_round_trip_exact(mount, tmp_path):
    """D = 16: the query scale sqrt(D) = 4 is a power of two, so every array
    comes back byte for byte, scan-stacked [E, L, H, D] kernels included."""
    p = R.maxtext_llama(np.random.default_rng(40), "bfloat16")
    src, ro, hf = export(mount, tmp_path, {"params": {"params": p}}, "maxtext-llama-hf")
    dst, m, rc, out = import_(mount, tmp_path, hf, "maxtext-llama-hf")
    assert rc == 0, out + m.log()
    assert_same_step(ro, dst, mount)
    assert "tensors imported as 12 arrays" in m.log()
    # the staged files are not part of the step
    assert not (dst / "30" / ".views").exists()


def view_tensors(folder):
    """{name: raw bytes} of the safetensors file(s) of a view folder."""
    from safetensors import safe_open
    got = {}
    for f in sorted(os.listdir(folder)):
        if f.endswith(".safetensors"):
            with safe_open(str(Path(folder) / f), framework="numpy") as st:
                for k in st.keys():
                    got[k] = st.get_tensor(k).tobytes()
    return got


def mixtral(rng, dtype):
    p = R.maxtext_llama(rng, dtype)
    r = lambda *s: R.recipe_rand(rng, s, dtype)  # noqa: E731
    lay = p["decoder"]["layers"]
    del lay["mlp"]
    X = 4
    lay["MoeBlock_0"] = {"gate": {"kernel": r(E, L, X)}, "wi_0": r(X, L, E, F), "wi_1": r(X, L, E, F),
                         "wo": r(X, L, F, E)}
    return p


def unscanned(rng):
    import jax
    p = R.maxtext_llama(rng, "bfloat16")
    lay = p["decoder"].pop("layers")
    for l in range(L):
        p["decoder"][f"layers_{l}"] = jax.tree_util.tree_map(lambda x: np.ascontiguousarray(x[:, l]), lay)
    return p


def gemma_flax(rng, qk_norm):
    r = lambda *s: R.recipe_rand(rng, s, "bfloat16")  # noqa: E731
    tr = {"embedder": {"input_embedding": r(V, E)}, "final_norm": {"scale": r(E)}}
    for i in range(3):
        attn = {"q_einsum": {"w": r(H, E, D)}, "kv_einsum": {"w": r(2, K, E, D)},
                "attn_vec_einsum": {"w": r(H, D, E)}}
        if qk_norm:
            attn["_query_norm"] = {"scale": r(D)}
            attn["_key_norm"] = {"scale": r(D)}
        tr[f"layer_{i}"] = {"attn": attn, "mlp": {"gating_einsum": r(2, F, E), "linear": r(F, E)},
                            **{n: {"scale": r(E)} for n in ("pre_attention_norm", "post_attention_norm",
                                                           "pre_ffw_norm", "post_ffw_norm")}}
    return {"params": {"transformer": tr}}


def t5x(rng):
    r = lambda *s: R.recipe_rand(rng, s, "float32")  # noqa: E731
    att = lambda: {n: {"kernel": r(E, H * D)} for n in ("query", "key", "value")} | {"out": {"kernel": r(H * D, E)}}  # noqa: E731
    mlp = lambda: {"wi_0": {"kernel": r(E, F)}, "wi_1": {"kernel": r(E, F)}, "wo": {"kernel": r(F, E)}}  # noqa: E731
    enc = {"encoder_norm": {"scale": r(E)}, "relpos_bias": {"rel_embedding": r(H, 32)}}
    for i in range(2):
        enc[f"layers_{i}"] = {"attention": att(), "mlp": mlp(), "pre_attention_layer_norm": {"scale": r(E)},
                              "pre_mlp_layer_norm": {"scale": r(E)}}
    dec = {"decoder_norm": {"scale": r(E)}, "relpos_bias": {"rel_embedding": r(H, 32)},
           "logits_dense": {"kernel": r(E, V)}}
    for j in range(3):
        dec[f"layers_{j}"] = {"self_attention": att(), "encoder_decoder_attention": att(), "mlp": mlp(),
                              **{n: {"scale": r(E)} for n in ("pre_self_attention_layer_norm",
                                                             "pre_cross_attention_layer_norm", "pre_mlp_layer_norm")}}
    return {"target": {"token_embedder": {"embedding": r(V, E)}, "encoder": enc, "decoder": dec}}


ROUND_TRIPS = {
    "maxtext-llama-hf/float32": ("maxtext-llama-hf", lambda g: {"params": {"params": R.maxtext_llama(g, "float32")}}),
    "maxtext-llama3.1-hf/bfloat16": ("maxtext-llama3.1-hf",
                                     lambda g: {"params": {"params": R.maxtext_llama(g, "bfloat16")}}),
    "maxtext-llama-unscanned-hf": ("maxtext-llama-unscanned-hf", lambda g: {"params": {"params": unscanned(g)}}),
    "maxtext-mixtral-hf/bfloat16": ("maxtext-mixtral-hf", lambda g: {"params": {"params": mixtral(g, "bfloat16")}}),
    "gemma-flax-hf": ("gemma-flax-hf", lambda g: gemma_flax(g, False)),
    "gemma-flax-hf/qk_norm": ("gemma-flax-hf", lambda g: gemma_flax(g, True)),
    "t5x-t5-hf": ("t5x-t5-hf", t5x),
}


@pytest.mark.parametrize("case", sorted(ROUND_TRIPS))
def test_round_trip_exact(mount, tmp_path, case):
    """Export, import, commit: every array byte for byte (the ops of these
    recipes invert exactly: index maps, aliases, scales by powers of two)."""
    recipe, build = ROUND_TRIPS[case]
    src, ro, hf = export(mount, tmp_path, build(np.random.default_rng(41)), recipe)
    dst, m, rc, out = import_(mount, tmp_path, hf, recipe)
    assert rc == 0, out + m.log()
    fresh, _ = assert_same_step(ro, dst, mount)
    # and the new step's view is the folder that was imported
    assert view_tensors(fresh.p(f"30/.views/{recipe}")) == view_tensors(hf)


def test_sharded_folder_with_index(mount, tmp_path):
    """The sharded form (model-0000N-of-0000M.safetensors and the index)
    imports the same; a shard left out is named by the index."""
    root = tmp_path / "src"
    p = R.maxtext_llama(np.random.default_rng(42), "float32")
    R.recipe_save(root, 30, {"params": {"params": p}})
    ro = mount(root, "ro", "safetensors_shard_size=100K")
    hf = tmp_path / "hf"
    assert run(f"cp -r {ro.p('30/.views/maxtext-llama-hf')}/ {hf}/")[0] == 0
    shards = sorted(f for f in os.listdir(hf) if f.startswith("model-"))
    assert len(shards) > 1 and (hf / "model.safetensors.index.json").exists()
    dst, m, rc, out = import_(mount, tmp_path, hf, "maxtext-llama-hf")
    assert rc == 0, out + m.log()
    assert_same_step(ro, dst, mount)
    # without its second shard: ENODATA, the log names a tensor and the index
    (hf / shards[1]).unlink()
    dst, m, rc, out = import_(mount, tmp_path, hf, "maxtext-llama-hf", name="dst2")
    assert rc != 0 and "No data available" in out, out
    assert "named in model.safetensors.index.json" in m.log()
    assert_no_step(m, dst)


def test_query_scale_not_a_power_of_two_is_within_one_ulp(mount, tmp_path):
    """D = 8: the query kernel was multiplied by sqrt(8) and rounded to
    bfloat16, which loses information for some values.  Imported, it is
    within one unit in the last place of the original everywhere, and the
    new step exports the very bytes that were imported; every other array
    is byte for byte."""
    p = R.maxtext_llama(np.random.default_rng(43), "bfloat16", d=8)
    src, ro, hf = export(mount, tmp_path, {"params": {"params": p}}, "maxtext-llama-hf")
    dst, m, rc, out = import_(mount, tmp_path, hf, "maxtext-llama-hf")
    assert rc == 0, out + m.log()
    fresh, loose = assert_same_step(ro, dst, mount, inexact=("self_attention/query/",))
    assert loose > 0  # the bound is reached: sqrt(8) is not exact
    assert view_tensors(fresh.p("30/.views/maxtext-llama-hf")) == view_tensors(hf)


@pytest.mark.parametrize("recipe,rule", [("maxtext-gemma2-hf", "affine with a bias"),
                                         ("maxtext-gemma3-hf", "affine with a bias")])
def test_refused_recipes(mount, tmp_path, recipe, rule):
    """A recipe whose ops do not invert within the documented bound is
    refused at the mkdir of its folder: EOPNOTSUPP, a log line naming the
    rule and op, and nothing staged."""
    root = tmp_path / "dst"
    root.mkdir()
    m = mount(root)
    os.mkdir(m.p("30"))
    with pytest.raises(OSError) as e:
        os.mkdir(m.p(f"30/.views/{recipe}"))
    assert e.value.errno == 95  # EOPNOTSUPP
    assert f"recipe {recipe} does not import" in m.log() and rule in m.log()
    # a name that is no recipe: ENOENT
    with pytest.raises(FileNotFoundError):
        os.mkdir(m.p("30/.views/no-such-recipe"))
    assert "no recipe of that name" in m.log()


def rewrite(path, drop=(), rename=None, reshape=None, change=None):
    """Rewrite safetensors file `path` with tensors dropped, renamed
    ({old: new}), reshaped ({name: shape}) or changed ({name: fn(array)})."""
    from safetensors.numpy import load_file, save_file
    t = load_file(str(path))
    for k in drop:
        del t[k]
    for a, b in (rename or {}).items():
        t[b] = t.pop(a)
    for k, s in (reshape or {}).items():
        t[k] = t[k].reshape(s)
    for k, fn in (change or {}).items():
        t[k] = fn(t[k])
    save_file(t, str(path))


@pytest.mark.parametrize("kind", ["missing", "shape", "unknown", "tied"])
def test_mismatches_fail_the_commit_and_leave_no_step(mount, tmp_path, kind):
    """A missing tensor (ENODATA), a wrong shape or an unknown name
    (EINVAL), tied weights that differ (EINVAL): the commit fails with the
    errno, the log names the tensor, no step is left; the step stays
    pending, and the right folder then commits it."""
    if kind == "tied":
        recipe, state = "t5x-t5-hf", t5x(np.random.default_rng(44))
    else:
        recipe = "maxtext-llama-hf"
        state = {"params": {"params": R.maxtext_llama(np.random.default_rng(44), "bfloat16")}}
    src, ro, hf = export(mount, tmp_path, state, recipe)
    good = tmp_path / "good"
    shutil.copytree(hf, good)
    st = hf / "model.safetensors"
    if kind == "missing":
        rewrite(st, drop=["model.layers.1.mlp.up_proj.weight"])
        err, words = "No data available", "model.layers.1.mlp.up_proj.weight is missing"
    elif kind == "shape":
        rewrite(st, reshape={"model.norm.weight": (E // 2, 2)})
        err, words = "Invalid argument", "model.norm.weight: bfloat16 [32,2], the recipe makes bfloat16 [64]"
    elif kind == "unknown":
        rewrite(st, rename={"lm_head.weight": "lm_head.weights"})
        err, words = "recipe maxtext-llama-hf makes no tensor", "lm_head.weights"
    else:
        rewrite(st, change={"decoder.embed_tokens.weight": lambda a: a + np.float32(1)})
        err, words = "Invalid argument", "decoder.embed_tokens.weight differs from shared.weight"
    dst, m, rc, out = import_(mount, tmp_path, hf, recipe)
    assert rc != 0, out
    if kind != "unknown":
        assert err in out, out
    assert words in m.log(), m.log()
    assert_no_step(m, dst)
    assert "commit failed" in m.log()
    # the step is still pending: the right folder in place of the wrong one commits it
    shutil.rmtree(m.p(f"30/.views/{recipe}"))
    assert run(f"cp -r {good}/ {m.p('30/.views/' + recipe)}/")[0] == 0
    assert run(f"touch {m.p('30/commit_success.txt')}")[0] == 0, m.log()
    assert_same_step(ro, dst, mount)


def to_flat(tr):
    """gemma's FLAT form of a NESTED transformer: '/'-joined keys down to the
    module, each holding its params; the MLP's arrays wrapped in {'w': ...}."""
    out = {}

    def walk(d, path):
        if path and all(hasattr(v, "dtype") for v in d.values()):
            key = "transformer/" + "/".join(path)
            if path[-1] == "mlp":
                for n, v in d.items():
                    out[f"{key}/{n}"] = {"w": v}
            else:
                out[key] = dict(d)
            return
        for k, v in d.items():
            walk(v, path + [k])
    walk(tr, [])
    return out


def test_gemma_flat_round_trip(mount, tmp_path):
    """The FLAT layout ('/' inside the keys, the recipe's import_prefix ""):
    the imported step has the same keys and bytes."""
    tr = gemma_flax(np.random.default_rng(46), True)["params"]["transformer"]
    src, ro, hf = export(mount, tmp_path, to_flat(tr), "gemma-flat-hf")
    dst, m, rc, out = import_(mount, tmp_path, hf, "gemma-flat-hf")
    assert rc == 0, out + m.log()
    assert_same_step(ro, dst, mount)


@pytest.mark.parametrize("attn", ["mha", "mqa"])
def test_gemma1_embedding_rows_cut_by_the_view(mount, tmp_path, attn):
    """Gemma 1's Flax embedding has 128 rows more than the Hugging Face one
    (a pad that shortens the axis): the folder does not hold them, so the
    commit fails with ENODATA naming the array, and nothing is committed.
    Both attention forms (the groups: fused qkv_einsum, or q_einsum and
    kv_einsum) are found from the tensors alone."""
    r = lambda *s: R.recipe_rand(np.random.default_rng(47), s, "bfloat16")  # noqa: E731
    tr = {"embedder": {"input_embedding": r(V + 128, E)}, "final_norm": {"scale": r(E)}}
    for i in range(2):
        a = ({"qkv_einsum": {"w": r(3, H, E, D)}} if attn == "mha" else
             {"q_einsum": {"w": r(H, E, D)}, "kv_einsum": {"w": r(2, 1, E, D)}})
        a["attn_vec_einsum"] = {"w": r(H, D, E)}
        tr[f"layer_{i}"] = {"attn": a, "mlp": {"gating_einsum": r(2, E, F), "linear": r(F, E)},
                            "pre_attention_norm": {"scale": r(E)}, "pre_ffw_norm": {"scale": r(E)}}
    src, ro, hf = export(mount, tmp_path, {"params": {"transformer": tr}}, "gemma1-flax-hf")
    dst, m, rc, out = import_(mount, tmp_path, hf, "gemma1-flax-hf")
    assert rc != 0 and "No data available" in out, out
    want = "items.params.transformer.embedder.input_embedding: 8192 of its 24576 elements come from no tensor"
    assert want in m.log(), m.log()
    assert_no_step(m, dst)
