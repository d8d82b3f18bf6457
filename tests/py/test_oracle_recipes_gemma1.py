"""The Gemma 1 recipes (gemma1-flax-hf, gemma1-flat-hf) and the FLAT layout
of the gemma library (gemma-flat-hf) against reference math.

Trees are saved by the real Orbax in tiny dimensions with the real key
names and axis layouts of google-deepmind/gemma: Gemma 1's fused
qkv_einsum [3, N, E, H] (num_kv_heads == num_heads) or q_einsum + kv_einsum
(MQA, num_kv_heads = 1), gating_einsum [2, E, F], only the pre-attention and
pre-feed-forward norms; the NESTED layout (`transformer/layer_0/attn/...`
as folders) and the FLAT one (one dict of '/'-joined keys, each holding `w`
or `scale`, the MLP's kernels wrapped in `w` too).  Every tensor of the
view is compared, byte for byte, with the Hugging Face tensor computed here
by explicit index loops (the formulas of transformers'
convert_gemma_weights_to_hf.py: q/k/v rows are head-major h*H+d, norms and
embedding copied, the embedding cut to the 256000-row vocabulary), and the
folder is loaded with the safetensors library.  Also: config.json,
`ckptfs info --recipe` for each recipe, and the refusals (a Gemma 2
checkpoint is no Gemma 1 view; a checkpoint without attention kernels is no
view), each with the log line naming the rule.
"""

import json
import os
import subprocess

import numpy as np
import pytest

import ckfs_util as U
from ckfs_help import assert_folder
from ckfs_help import recipe_rand as _rand
from ckfs_help import recipe_save as _save

pytestmark = pytest.mark.oracle

E, H, D, F, NL, V = 64, 4, 16, 96, 3, 256
VF = V + 128  # the Flax table's extra rows (256128 against Hugging Face's 256000)


def gemma1_nested(rng, attn, gating="EF", dtype="bfloat16"):
    """The NESTED params of a Gemma 1 transformer (gemma's load_params)."""
    r = lambda *s: _rand(rng, s, dtype)  # noqa: E731
    tr = {"embedder": {"input_embedding": r(VF, E)}, "final_norm": {"scale": r(E)}}
    for i in range(NL):
        if attn == "mha":
            a = {"qkv_einsum": {"w": r(3, H, E, D)}}
        else:
            a = {"q_einsum": {"w": r(H, E, D)}, "kv_einsum": {"w": r(2, 1, E, D)}}
        a["attn_vec_einsum"] = {"w": r(H, D, E)}
        tr[f"layer_{i}"] = {"attn": a,
                            "mlp": {"gating_einsum": r(2, E, F) if gating == "EF" else r(2, F, E),
                                    "linear": r(F, E)},
                            "pre_attention_norm": {"scale": r(E)}, "pre_ffw_norm": {"scale": r(E)}}
    return tr


def to_flat(tr):
    """gemma's FLAT form of a NESTED transformer: '/'-joined keys down to the
    module, each holding its params; the MLP's arrays wrapped in {'w': ...}."""
    out = {}

    def walk(d, path):
        if all(isinstance(v, np.ndarray) or hasattr(v, "dtype") for v in d.values()) and path:
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


def expected_gemma1(tr, attn, gating="EF"):
    """{HF name: array} by explicit loops: W_q[h*D+d, e] = q[h, e, d]."""
    def rows(m):  # m [N, E, D] -> [N*D, E]
        n = m.shape[0]
        w = np.empty((n * D, E), dtype=m.dtype)
        for h in range(n):
            for d in range(D):
                w[h * D + d, :] = m[h, :, d]
        return w

    want = {"model.embed_tokens.weight": tr["embedder"]["input_embedding"][:V],
            "model.norm.weight": tr["final_norm"]["scale"]}
    for i in range(NL):
        t, pre = tr[f"layer_{i}"], f"model.layers.{i}."
        a = t["attn"]
        if attn == "mha":
            q, k, v = a["qkv_einsum"]["w"][0], a["qkv_einsum"]["w"][1], a["qkv_einsum"]["w"][2]
        else:
            q, k, v = a["q_einsum"]["w"], a["kv_einsum"]["w"][0], a["kv_einsum"]["w"][1]
        want[pre + "self_attn.q_proj.weight"] = rows(q)
        want[pre + "self_attn.k_proj.weight"] = rows(k)
        want[pre + "self_attn.v_proj.weight"] = rows(v)
        o = a["attn_vec_einsum"]["w"]
        w = np.empty((E, H * D), dtype=o.dtype)
        for h in range(H):
            for d in range(D):
                w[:, h * D + d] = o[h, d, :]
        want[pre + "self_attn.o_proj.weight"] = w
        g = t["mlp"]["gating_einsum"]
        want[pre + "mlp.gate_proj.weight"] = g[0].T if gating == "EF" else g[0]
        want[pre + "mlp.up_proj.weight"] = g[1].T if gating == "EF" else g[1]
        want[pre + "mlp.down_proj.weight"] = t["mlp"]["linear"].T
        want[pre + "input_layernorm.weight"] = t["pre_attention_norm"]["scale"]
        want[pre + "post_attention_layernorm.weight"] = t["pre_ffw_norm"]["scale"]
    return {k: np.ascontiguousarray(v) for k, v in want.items()}


def info(root, recipe):
    return subprocess.run([str(U.BIN), "info", "--recipe", recipe, str(root), "30"],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("layout,attn,gating,dtype", [
    ("nested", "mha", "EF", "bfloat16"), ("nested", "mqa", "EF", "float32"),
    ("flat", "mha", "EF", "bfloat16"), ("flat", "mqa", "EF", "bfloat16"),
    ("nested", "mqa", "FE", "bfloat16")])
def test_gemma1_to_hf(mount, tmp_path, layout, attn, gating, dtype):
    tr = gemma1_nested(np.random.default_rng(41), attn, gating, dtype)
    root = tmp_path / "ck"
    _save(root, 30, {"params": {"transformer": tr}} if layout == "nested" else to_flat(tr))
    name = "gemma1-flax-hf" if layout == "nested" else "gemma1-flat-hf"
    want = expected_gemma1(tr, attn, gating)
    m = mount(root, "ro")
    if layout == "flat":  # the mount shows a '/' of a key as %2F; recipes name the key
        assert "transformer%2Flayer_0%2Fattn%2Fattn_vec_einsum" in os.listdir(m.path / "30" / "items")
    assert sorted(os.listdir(m.path / "30/.views")) == [name]
    folder = m.path / "30/.views" / name
    assert sorted(os.listdir(folder)) == ["config.json", "model.safetensors"]
    assert assert_folder(folder, want) == 2 + NL * 9
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == ["GemmaForCausalLM"] and cfg["model_type"] == "gemma"
    assert (cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"], cfg["head_dim"]) == (E, F, H, D)
    assert cfg["num_key_value_heads"] == (H if attn == "mha" else 1)
    assert (cfg["num_hidden_layers"], cfg["vocab_size"]) == (NL, V)
    log = m.log()
    # the Gemma 2/3 recipes name the rule that fails
    other = "gemma-flax-hf" if layout == "nested" else "gemma-flat-hf"
    assert f"{other}: no view: " in log
    r = info(root, name)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:4] == ["TARGET", "SHAPE", "DTYPE", "FROM"]
    assert len([x for x in lines[1:] if x.split()[0].endswith(".weight")]) == 2 + NL * 9
    k = [x for x in lines if x.startswith("model.layers.2.self_attn.k_proj.weight")]
    assert len(k) == 1 and f"[{(H if attn == 'mha' else 1) * D},{E}]" in k[0], k
    sep = "." if layout == "nested" else "/"
    src = f"transformer{sep}layer_2{sep}attn{sep}" + ("qkv_einsum.w take(0,1)" if attn == "mha"
                                                       else "kv_einsum.w take(0,0)")
    assert src in k[0], k[0]


def test_gemma1_flat_release_item(mount, tmp_path):
    """A released model is one Orbax item (gemma's save_params: the FLAT dict
    saved by StandardCheckpointer, no step folder): mounted as it is, the
    view is MNT/.views/NAME/, and `info --recipe` reads it without a STEP."""
    import orbax.checkpoint as ocp
    tr = gemma1_nested(np.random.default_rng(45), "mqa")
    src = tmp_path / "gemma-2b"
    ck = ocp.StandardCheckpointer()
    ck.save(str(src), to_flat(tr))
    ck.wait_until_finished()
    ck.close()
    m = mount(src, "ro")
    assert sorted(os.listdir(m.path / ".views")) == ["gemma1-flat-hf"]
    assert assert_folder(m.path / ".views/gemma1-flat-hf", expected_gemma1(tr, "mqa")) == 2 + NL * 9
    r = subprocess.run([str(U.BIN), "info", "--recipe", "gemma1-flat-hf", str(src)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "transformer/embedder.input_embedding pad(0,256)" in r.stdout


def gemma2(rng, r=None):
    r = r or (lambda *s: _rand(rng, s, "bfloat16"))  # noqa: E731
    K = 2
    tr = {"embedder": {"input_embedding": r(V, E)}, "final_norm": {"scale": r(E)}}
    for i in range(NL):
        tr[f"layer_{i}"] = {"attn": {"q_einsum": {"w": r(H, E, D)}, "kv_einsum": {"w": r(2, K, E, D)},
                                     "attn_vec_einsum": {"w": r(H, D, E)},
                                     "_query_norm": {"scale": r(D)}, "_key_norm": {"scale": r(D)}},
                            "mlp": {"gating_einsum": r(2, F, E), "linear": r(F, E)},
                            **{n: {"scale": r(E)} for n in ("pre_attention_norm", "post_attention_norm",
                                                           "pre_ffw_norm", "post_ffw_norm")}}
    return tr


def test_gemma3_flat_to_hf(mount, tmp_path):
    """Gemma 2/3 in the FLAT layout: gemma-flat-hf, the same tensors as the
    NESTED tree's gemma-flax-hf view; gemma1-flat-hf refuses it (its
    post_attention_norm), naming the key."""
    tr = gemma2(np.random.default_rng(42))
    flat = to_flat(tr)
    assert "transformer/layer_1/mlp/gating_einsum" in flat and "w" in flat["transformer/layer_1/mlp/gating_einsum"]
    root_n, root_f = tmp_path / "nested", tmp_path / "flat"
    _save(root_n, 30, {"params": {"transformer": tr}})
    _save(root_f, 30, flat)
    mn = mount(root_n, "ro")
    mf = mount(root_f, "ro")
    assert sorted(os.listdir(mf.path / "30/.views")) == ["gemma-flat-hf"]
    assert sorted(os.listdir(mn.path / "30/.views")) == ["gemma-flax-hf"]
    from safetensors.numpy import load_file
    want = load_file(str(mn.path / "30/.views/gemma-flax-hf/model.safetensors"))
    # independently: a few of them by the formulas
    t1 = tr["layer_1"]
    assert want["model.layers.1.mlp.down_proj.weight"].tobytes() == np.ascontiguousarray(t1["mlp"]["linear"].T).tobytes()
    assert want["model.layers.1.post_attention_layernorm.weight"].tobytes() == t1["post_attention_norm"]["scale"].tobytes()
    assert want["model.layers.1.self_attn.q_norm.weight"].tobytes() == t1["attn"]["_query_norm"]["scale"].tobytes()
    assert assert_folder(mf.path / "30/.views/gemma-flat-hf", want) == 2 + NL * 13
    assert ((mf.path / "30/.views/gemma-flat-hf/config.json").read_text()
            == (mn.path / "30/.views/gemma-flax-hf/config.json").read_text())
    assert ("gemma1-flat-hf: no view: Gemma 2/3 post_attention_norm: source key "
            "items.transformer/layer_0/post_attention_norm.scale is present") in mf.log()
    assert ("gemma1-flax-hf: no view: Gemma 2/3 post_attention_norm: source key "
            "items.params.transformer.layer_0.post_attention_norm.scale is present") in mn.log()
    r = info(root_f, "gemma-flat-hf")
    assert r.returncode == 0, r.stderr
    assert "transformer/layer_2/mlp/gating_einsum.w take(0,1)" in r.stdout
    r = info(root_f, "gemma1-flat-hf")
    assert r.returncode == 1 and "post_attention_norm.scale is present" in r.stderr, r.stderr


def test_gemma1_refusals(mount, tmp_path):
    """No attention kernel of either form: no view, the log names the group's
    first rule; both forms in one step (a fused layer among split ones): the
    rules of the two forms disagree on K, named."""
    rng = np.random.default_rng(43)
    tr = gemma1_nested(rng, "mqa")
    for i in range(NL):
        del tr[f"layer_{i}"]["attn"]["q_einsum"]
    root = tmp_path / "none"
    _save(root, 30, {"params": {"transformer": tr}})
    tr2 = gemma1_nested(rng, "mqa")
    tr2["layer_1"]["attn"]["qkv_einsum"] = {"w": _rand(rng, (3, H, E, D), "bfloat16")}
    root2 = tmp_path / "both"
    _save(root2, 30, {"params": {"transformer": tr2}})
    m = mount(root, "ro")
    assert os.listdir(m.path / "30/.views") == []
    assert not os.path.exists(m.path / "30/.views/gemma1-flax-hf")
    assert ("gemma1-flax-hf: no view: model.layers.{i}.self_attn.q_proj.weight: no source key "
            "items.params.transformer.layer_{i}.attn.qkv_einsum.w (nor one of the other rules of group q)") in m.log()
    r = info(root, "gemma1-flax-hf")
    assert r.returncode == 1 and "group q" in r.stderr, r.stderr
    m2 = mount(root2, "ro")
    assert os.listdir(m2.path / "30/.views") == []
    assert ("gemma1-flax-hf: no view: model.layers.{i}.self_attn.k_proj.weight: "
            "items.params.transformer.layer_0.attn.kv_einsum.w has shape [2,1,64,16]; axis 1 is K = 4") in m2.log()


def test_group_and_absent_in_user_recipe(mount, tmp_path):
    """The two rule fields on a user's recipe: a group of alternatives makes
    the tensor from whichever key exists; an absent rule refuses a step that
    has its key."""
    rng = np.random.default_rng(44)
    root = tmp_path / "ck"
    a, b = _rand(rng, (8, 4), "float32"), _rand(rng, (4, 8), "float32")
    _save(root, 30, {"x/a": {"w": a}, "keep": {"w": b}})
    rdir = tmp_path / "recipes"
    rdir.mkdir()
    base = {"ckptfs_recipe": 1, "prefixes": [""]}
    (rdir / "alt.json").write_text(json.dumps({**base, "name": "alt", "tensors": [
        {"name": "k", "from": "keep.w", "shape": ["P", "Q"]},
        {"name": "t", "from": "x/a.w", "shape": ["Q", "P"], "ops": [["transpose", 1, 0]], "group": "t"},
        {"name": "t", "from": "x/b.w", "shape": ["P", "Q"], "group": "t"}]}))
    (rdir / "guarded.json").write_text(json.dumps({**base, "name": "guarded", "tensors": [
        {"name": "k", "from": "keep.w", "shape": ["P", "Q"]},
        {"name": "no x/a", "from": "x/a.w", "absent": True}]}))
    (rdir / "bad.json").write_text(json.dumps({**base, "name": "bad", "tensors": [
        {"name": "k", "from": "keep.w", "absent": True, "shape": ["P", "Q"]}]}))
    m = mount(root, "ro", f"recipes={rdir}")
    assert sorted(os.listdir(m.path / "30/.views")) == ["alt"]
    from safetensors.numpy import load_file
    t = load_file(str(m.path / "30/.views/alt/model.safetensors"))
    assert t["t"].tobytes() == np.ascontiguousarray(a.T).tobytes() and t["k"].tobytes() == b.tobytes()
    log = m.log()
    assert "guarded: no view: no x/a: source key items.x/a.w is present" in log
    assert "bad.json: k: an \"absent\" rule has one \"from\" key and nothing else" in log
