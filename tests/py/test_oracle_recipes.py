"""View recipes (STEP/.views/NAME/, docs/recipes.md) against reference math.

Each family's tree is saved by the real Orbax in tiny dimensions with the
real key names and axis layouts; the view is read through the mount and
every tensor is compared, byte for byte, with the expected tensor computed
here in numpy from the index formulas of the converters (not with the
recipe's op sequence): the `safetensors` library loads the folder.  Also:
config.json, the sharded form, `ckptfs info --recipe`, refused recipes, a
recipe that does not match (no folder; the log names the rule), and the
decode count of scan-stacked chunks read for every layer.
"""

import json
import os
import subprocess

import numpy as np
import pytest

import ckfs_util as U
from ckfs_help import RECIPE_DIMS, assert_folder, maxtext_llama
from ckfs_help import recipe_rand as _rand
from ckfs_help import recipe_save as _save

pytestmark = pytest.mark.oracle

# tiny Llama: E = H*D as the real ones, GQA (K < H); the tree builders are
# shared with test_oracle_recipes_import.py (ckfs_help.py)
E, H, K, D, F, L, V = RECIPE_DIMS


def expected_llama(p, rope31=False, d=D):
    """{HF name: array} by the formulas of the MaxText exporter:
    W[h*D+r, e] = sqrt(D) * M[e, l, h, pi(r)] (float32 product, rounded
    once to the source dtype), pi the RoPE permutation of Llama 3.1."""
    import ml_dtypes
    dec, lay = p["decoder"], p["decoder"]["layers"]
    dt = lay["self_attention"]["query"]["kernel"].dtype
    pi = np.arange(d)
    if rope31:
        r = np.arange(d)
        pi = 2 * (r % (d // 2)) + r // (d // 2)
    out = {"model.embed_tokens.weight": p["token_embedder"]["embedding"],
           "lm_head.weight": np.ascontiguousarray(dec["logits_dense"]["kernel"].T),
           "model.norm.weight": dec["decoder_norm"]["scale"]}
    for l in range(L):
        pre = f"model.layers.{l}."
        out[pre + "input_layernorm.weight"] = lay["pre_self_attention_layer_norm"]["scale"][:, l]
        out[pre + "post_attention_layernorm.weight"] = lay["post_self_attention_layer_norm"]["scale"][:, l]
        for hf, mt, n, perm, scale in (("q_proj", "query", H, pi, True), ("k_proj", "key", K, pi, False),
                                       ("v_proj", "value", K, np.arange(d), False)):
            m = lay["self_attention"][mt]["kernel"]
            w = np.empty((n * d, E), dtype=m.dtype)
            for h in range(n):
                for rr in range(d):
                    w[h * d + rr, :] = m[:, l, h, perm[rr]]
            if scale:
                w = (w.astype(np.float32) * np.float32(np.sqrt(d))).astype(dt)
            out[pre + f"self_attn.{hf}.weight"] = w
        m = lay["self_attention"]["out"]["kernel"]
        o = np.empty((E, H * d), dtype=m.dtype)
        for h in range(H):
            for rr in range(d):
                o[:, h * d + rr] = m[h, l, rr, :]
        out[pre + "self_attn.o_proj.weight"] = o
        out[pre + "mlp.gate_proj.weight"] = lay["mlp"]["wi_0"]["kernel"][:, l, :].T
        out[pre + "mlp.up_proj.weight"] = lay["mlp"]["wi_1"]["kernel"][:, l, :].T
        out[pre + "mlp.down_proj.weight"] = lay["mlp"]["wo"]["kernel"][:, l, :].T
    assert ml_dtypes  # bfloat16 arrays compare by bytes below
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def stats(m):
    return json.loads(open(m.p(".ckptfs/stats")).read())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_maxtext_llama_to_hf(mount, tmp_path, dtype):
    rng = np.random.default_rng(31)
    p = maxtext_llama(rng, dtype)
    root = tmp_path / "ck"
    _save(root, 30, {"params": {"params": p}, "step": np.int32(30)})
    m = mount(root, "ro")
    folder = m.path / "30" / ".views" / "maxtext-llama-hf"
    assert sorted(os.listdir(m.path / "30" / ".views")) == ["maxtext-llama-hf", "maxtext-llama3.1-hf"]
    assert sorted(os.listdir(folder)) == ["config.json", "model.safetensors"]
    n = assert_folder(folder, expected_llama(p))
    assert n == 3 + 9 * L
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["hidden_size"] == E and cfg["num_attention_heads"] == H and cfg["num_key_value_heads"] == K
    assert cfg["head_dim"] == D and cfg["intermediate_size"] == F and cfg["num_hidden_layers"] == L
    assert cfg["vocab_size"] == V and cfg["architectures"] == ["LlamaForCausalLM"]
    # Llama 3.1: q and k permuted from interleaved to halves, v and o not
    assert_folder(m.path / "30" / ".views" / "maxtext-llama3.1-hf", expected_llama(p, rope31=True))
    # .views is hidden, like .ckptfs
    assert ".views" not in os.listdir(m.path / "30")


def test_rope_permutation_d8(mount, tmp_path):
    """D = 8: a head [0..7] in MaxText order comes out [0,2,4,6,1,3,5,7]."""
    p = maxtext_llama(np.random.default_rng(1), "float32", d=8)
    q = p["decoder"]["layers"]["self_attention"]["query"]["kernel"]
    q[...] = np.arange(8, dtype=np.float32)  # every head of every layer
    root = tmp_path / "ck"
    _save(root, 30, {"params": {"params": p}})
    m = mount(root, "ro")
    from safetensors.numpy import load_file
    t = load_file(str(m.path / "30/.views/maxtext-llama3.1-hf/model.safetensors"))
    w = t["model.layers.1.self_attn.q_proj.weight"] / np.float32(np.sqrt(8))
    assert w.shape == (H * 8, E)
    assert list(np.round(w[:8, 0]).astype(int)) == [0, 2, 4, 6, 1, 3, 5, 7]
    assert_folder(m.path / "30/.views/maxtext-llama3.1-hf", expected_llama(p, rope31=True, d=8))


def test_sharded_folder_and_decodes(mount, tmp_path):
    """Past safetensors_shard_size the folder is sharded with an index; the
    scan-stacked chunks (spanning every layer) are decoded once each while
    the cache holds them, though every layer's tensors read them."""
    p = maxtext_llama(np.random.default_rng(2), "float32")
    root = tmp_path / "ck"
    _save(root, 30, {"params": {"params": p}})
    m = mount(root, "ro", "safetensors_shard_size=100K")
    folder = m.path / "30/.views/maxtext-llama-hf"
    names = sorted(os.listdir(folder))
    assert "model.safetensors.index.json" in names and "config.json" in names
    shards = [n for n in names if n.startswith("model-")]
    assert len(shards) > 1
    idx = json.loads((folder / "model.safetensors.index.json").read_text())
    assert sorted(set(idx["weight_map"].values())) == shards
    before = stats(m)["chunks_decoded"]
    assert_folder(folder, expected_llama(p))
    decoded = stats(m)["chunks_decoded"] - before
    # one chunk per array here (Orbax, one device): 3 + 9 source arrays
    assert decoded == 12, decoded


def test_info_recipe(tmp_path):
    p = maxtext_llama(np.random.default_rng(3), "bfloat16")
    root = tmp_path / "ck"
    _save(root, 30, {"params": {"params": p}})
    r = subprocess.run([str(U.BIN), "info", "--recipe", "maxtext-llama-hf", str(root), "30"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:4] == ["TARGET", "SHAPE", "DTYPE", "FROM"]
    q = [x for x in lines if x.startswith("model.layers.2.self_attn.q_proj.weight")]
    assert len(q) == 1
    assert f"[{H * D},{E}]" in q[0] and "bfloat16" in q[0]
    assert "decoder.layers.self_attention.query.kernel take(1,2) transpose(1,2,0)" in q[0]
    assert "affine(4," in q[0]  # sqrt(16)
    assert len([x for x in lines if x.split()[0].endswith(".weight")]) == 3 + 9 * L
    # default step: the last one of the root
    r2 = subprocess.run([str(U.BIN), "info", "--recipe", "maxtext-llama-hf", str(root)],
                        capture_output=True, text=True, timeout=60)
    assert r2.returncode == 0 and r2.stdout == r.stdout
    r3 = subprocess.run([str(U.BIN), "info", "--recipe", "no-such-recipe", str(root), "30"],
                        capture_output=True, text=True, timeout=60)
    assert r3.returncode == 1 and "no-such-recipe" in r3.stderr


def test_mismatch_and_refused(mount, tmp_path):
    """A recipe whose rule does not match gives no folder and the log names
    the rule; a broken recipe file is refused with its reason; a user's
    recipe is offered next to the shipped ones."""
    p = maxtext_llama(np.random.default_rng(4), "float32")
    del p["decoder"]["logits_dense"]  # a tied model: the Llama recipes' lm_head rule fails
    root = tmp_path / "ck"
    _save(root, 30, {"params": {"params": p}})
    rdir = tmp_path / "recipes"
    rdir.mkdir()
    (rdir / "broken.json").write_text('{"ckptfs_recipe": 1, "name": "broken", "tensors": []}')
    (rdir / "notjson.json").write_text('{"ckptfs_recipe": 1,')
    (rdir / "embed-only.json").write_text(json.dumps({
        "ckptfs_recipe": 1, "name": "embed-only", "prefixes": ["params.params."],
        "tensors": [{"name": "emb.T", "from": "token_embedder.embedding", "shape": ["V", "E"],
                     "ops": [["transpose", 1, 0], ["pad", 1, "V+64"], ["cast", "bfloat16"]]}],
        "files": [{"name": "notes.txt", "text": "V={V} E={E}\n"}]}))
    (rdir / "wrong-shape.json").write_text(json.dumps({
        "ckptfs_recipe": 1, "name": "wrong-shape", "prefixes": ["params.params."],
        "tensors": [{"name": "x", "from": "token_embedder.embedding", "shape": ["V", 65]}]}))
    m = mount(root, "ro", f"recipes={rdir}")
    views = sorted(os.listdir(m.path / "30/.views"))
    assert views == ["embed-only"], views
    log = m.log()
    assert "recipe " + str(rdir / "broken.json") + ": \"tensors\" must be a non-empty list" in log
    assert "notjson.json: not valid JSON" in log
    assert "maxtext-llama-hf: no view: lm_head.weight: no source key" in log
    assert "wrong-shape: no view: x: " in log and "axis 1 is 65" in log
    assert (m.path / "30/.views/embed-only/notes.txt").read_text() == f"V={V} E={E}\n"
    import ml_dtypes
    from safetensors.numpy import load_file
    t = load_file(str(m.path / "30/.views/embed-only/model.safetensors"))["emb.T"]
    want = np.zeros((E, V + 64), dtype=ml_dtypes.bfloat16)
    want[:, :V] = p["token_embedder"]["embedding"].T.astype(ml_dtypes.bfloat16)
    assert t.dtype == want.dtype and t.tobytes() == want.tobytes()
    assert not os.path.exists(m.path / "30/.views/maxtext-llama-hf")
    r = subprocess.run([str(U.BIN), "info", "--recipe", "maxtext-llama-hf", str(root), "30"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "lm_head.weight: no source key" in r.stderr, r.stderr


# ---- the other shipped recipes ---------------------------------------------------

X = 4  # experts


def heads_rows(m, n, d, scale=None):
    """W[h*D+r, e] = m[e, h, r] (m: [E, n, d]), times scale in float32 rounded once."""
    w = np.empty((n * d, m.shape[0]), dtype=m.dtype)
    for h in range(n):
        for r in range(d):
            w[h * d + r, :] = m[:, h, r]
    if scale is not None:
        w = (w.astype(np.float32) * np.float32(scale)).astype(m.dtype)
    return w


def heads_cols(m, n, d):
    """W[e, h*D+r] = m[h, r, e] (m: [n, d, E])."""
    w = np.empty((m.shape[2], n * d), dtype=m.dtype)
    for h in range(n):
        for r in range(d):
            w[:, h * d + r] = m[h, r, :]
    return w


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_maxtext_mixtral_to_hf(mount, tmp_path, dtype):
    rng = np.random.default_rng(5)
    p = maxtext_llama(rng, dtype)
    r = lambda *s: _rand(rng, s, dtype)  # noqa: E731
    lay = p["decoder"]["layers"]
    del lay["mlp"]
    lay["MoeBlock_0"] = {"gate": {"kernel": r(E, L, X)}, "wi_0": r(X, L, E, F), "wi_1": r(X, L, E, F),
                         "wo": r(X, L, F, E)}
    root = tmp_path / "ck"
    _save(root, 30, {"params": {"params": p}})
    want = {k: v for k, v in expected_llama({**p, "decoder": {**p["decoder"], "layers": {
        **lay, "mlp": {"wi_0": {"kernel": r(E, L, F)}, "wi_1": {"kernel": r(E, L, F)},
                       "wo": {"kernel": r(F, L, E)}}}}}).items() if ".mlp." not in k}
    moe = lay["MoeBlock_0"]
    for l in range(L):
        pre = f"model.layers.{l}.block_sparse_moe."
        want[pre + "gate.weight"] = np.ascontiguousarray(moe["gate"]["kernel"][:, l, :].T)
        for x in range(X):
            want[pre + f"experts.{x}.w1.weight"] = np.ascontiguousarray(moe["wi_0"][x, l].T)
            want[pre + f"experts.{x}.w3.weight"] = np.ascontiguousarray(moe["wi_1"][x, l].T)
            want[pre + f"experts.{x}.w2.weight"] = np.ascontiguousarray(moe["wo"][x, l].T)
    m = mount(root, "ro")
    assert sorted(os.listdir(m.path / "30/.views")) == ["maxtext-mixtral-hf"]
    folder = m.path / "30/.views/maxtext-mixtral-hf"
    assert assert_folder(folder, want) == 3 + L * (6 + 1 + 3 * X)
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["num_local_experts"] == X and cfg["architectures"] == ["MixtralForCausalLM"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_maxtext_gemma2_to_hf(mount, tmp_path, dtype):
    rng = np.random.default_rng(6)
    r = lambda *s: _rand(rng, s, dtype)  # noqa: E731
    VM = V + 128  # MaxText pads Gemma's vocabulary
    layers = {}
    for half in ("local", "global"):
        for n in ("pre_self_attention_norm", "post_self_attention_norm", "pre_ffw_norm", "post_ffw_norm"):
            layers[f"{n}_{half}"] = {"scale": r(E, L) + 1}
        layers[f"self_attention_{half}"] = {"query": {"kernel": r(E, L, H, D)}, "key": {"kernel": r(E, L, K, D)},
                                            "value": {"kernel": r(E, L, K, D)}, "out": {"kernel": r(H, L, D, E)}}
        layers[f"mlp_{half}"] = {"wi_0": {"kernel": r(E, L, F)}, "wi_1": {"kernel": r(E, L, F)},
                                 "wo": {"kernel": r(F, L, E)}}
    p = {"token_embedder": {"embedding": r(VM, E)},
         "decoder": {"layers": layers, "decoder_norm": {"scale": r(E) + 1}}}
    root = tmp_path / "ck"
    _save(root, 30, {"params": {"params": p}})
    dt = p["token_embedder"]["embedding"].dtype
    f32 = np.float32
    minus1 = lambda x: (x.astype(f32) - f32(1)).astype(dt)  # noqa: E731
    want = {"model.embed_tokens.weight": (p["token_embedder"]["embedding"][:V].astype(f32) / f32(np.sqrt(E))).astype(dt),
            "model.norm.weight": minus1(p["decoder"]["decoder_norm"]["scale"])}
    for half, off in (("local", 0), ("global", 1)):
        for mm in range(L):
            pre = f"model.layers.{2 * mm + off}."
            for n, hf in (("pre_self_attention_norm", "input_layernorm"),
                          ("post_self_attention_norm", "post_attention_layernorm"),
                          ("pre_ffw_norm", "pre_feedforward_layernorm"),
                          ("post_ffw_norm", "post_feedforward_layernorm")):
                want[pre + hf + ".weight"] = minus1(layers[f"{n}_{half}"]["scale"][:, mm])
            a = layers[f"self_attention_{half}"]
            want[pre + "self_attn.q_proj.weight"] = heads_rows(a["query"]["kernel"][:, mm], H, D, np.sqrt(D))
            want[pre + "self_attn.k_proj.weight"] = heads_rows(a["key"]["kernel"][:, mm], K, D)
            want[pre + "self_attn.v_proj.weight"] = heads_rows(a["value"]["kernel"][:, mm], K, D)
            want[pre + "self_attn.o_proj.weight"] = heads_cols(a["out"]["kernel"][:, mm], H, D)
            mlp = layers[f"mlp_{half}"]
            want[pre + "mlp.gate_proj.weight"] = mlp["wi_0"]["kernel"][:, mm].T
            want[pre + "mlp.up_proj.weight"] = mlp["wi_1"]["kernel"][:, mm].T
            want[pre + "mlp.down_proj.weight"] = mlp["wo"]["kernel"][:, mm].T
    want = {k: np.ascontiguousarray(v) for k, v in want.items()}
    m = mount(root, "ro")
    assert sorted(os.listdir(m.path / "30/.views")) == ["maxtext-gemma2-hf"]
    folder = m.path / "30/.views/maxtext-gemma2-hf"
    assert assert_folder(folder, want) == 2 + 2 * L * 11
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 2 * L and cfg["vocab_size"] == V and cfg["tie_word_embeddings"]


@pytest.mark.parametrize("qk_norm,gating", [(False, "FE"), (True, "FE"), (False, "EF")])
def test_gemma_flax_to_hf(mount, tmp_path, qk_norm, gating):
    rng = np.random.default_rng(7)
    r = lambda *s: _rand(rng, s, "bfloat16")  # noqa: E731
    NL = 3
    tr = {"embedder": {"input_embedding": r(V, E)}, "final_norm": {"scale": r(E)}}
    for i in range(NL):
        attn = {"q_einsum": {"w": r(H, E, D)}, "kv_einsum": {"w": r(2, K, E, D)},
                "attn_vec_einsum": {"w": r(H, D, E)}}
        if qk_norm:
            attn["_query_norm"] = {"scale": r(D)}
            attn["_key_norm"] = {"scale": r(D)}
        g = r(2, F, E) if gating == "FE" else r(2, E, F)
        tr[f"layer_{i}"] = {"attn": attn, "mlp": {"gating_einsum": g, "linear": r(F, E)},
                            **{n: {"scale": r(E)} for n in ("pre_attention_norm", "post_attention_norm",
                                                           "pre_ffw_norm", "post_ffw_norm")}}
    root = tmp_path / "ck"
    _save(root, 30, {"params": {"transformer": tr}})
    want = {"model.embed_tokens.weight": tr["embedder"]["input_embedding"],
            "model.norm.weight": tr["final_norm"]["scale"]}
    for i in range(NL):
        t, pre = tr[f"layer_{i}"], f"model.layers.{i}."
        q = t["attn"]["q_einsum"]["w"]  # [H, E, D]: W[h*D+d, e] = q[h, e, d]
        want[pre + "self_attn.q_proj.weight"] = heads_rows(np.transpose(q, (1, 0, 2)), H, D)
        kv = t["attn"]["kv_einsum"]["w"]
        want[pre + "self_attn.k_proj.weight"] = heads_rows(np.transpose(kv[0], (1, 0, 2)), K, D)
        want[pre + "self_attn.v_proj.weight"] = heads_rows(np.transpose(kv[1], (1, 0, 2)), K, D)
        want[pre + "self_attn.o_proj.weight"] = heads_cols(t["attn"]["attn_vec_einsum"]["w"], H, D)
        if qk_norm:
            want[pre + "self_attn.q_norm.weight"] = t["attn"]["_query_norm"]["scale"]
            want[pre + "self_attn.k_norm.weight"] = t["attn"]["_key_norm"]["scale"]
        g = t["mlp"]["gating_einsum"]  # [2, F, E] as HF wants, or [2, E, F] (transposed)
        want[pre + "mlp.gate_proj.weight"] = g[0] if gating == "FE" else g[0].T
        want[pre + "mlp.up_proj.weight"] = g[1] if gating == "FE" else g[1].T
        want[pre + "mlp.down_proj.weight"] = t["mlp"]["linear"].T
        for n, hf in (("pre_attention_norm", "input_layernorm"), ("post_attention_norm", "post_attention_layernorm"),
                      ("pre_ffw_norm", "pre_feedforward_layernorm"), ("post_ffw_norm", "post_feedforward_layernorm")):
            want[pre + hf + ".weight"] = t[n]["scale"]
    want = {k: np.ascontiguousarray(v) for k, v in want.items()}
    m = mount(root, "ro")
    assert sorted(os.listdir(m.path / "30/.views")) == ["gemma-flax-hf"]
    folder = m.path / "30/.views/gemma-flax-hf"
    assert assert_folder(folder, want) == 2 + NL * (11 + (2 if qk_norm else 0))
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["num_hidden_layers"] == NL and cfg["head_dim"] == D


def test_t5x_to_hf(mount, tmp_path):
    rng = np.random.default_rng(8)
    r = lambda *s: _rand(rng, s, "float32")  # noqa: E731
    NE, ND, B = 2, 3, 32
    att = lambda: {n: {"kernel": r(E, H * D)} for n in ("query", "key", "value")} | {"out": {"kernel": r(H * D, E)}}  # noqa: E731
    mlp = lambda: {"wi_0": {"kernel": r(E, F)}, "wi_1": {"kernel": r(E, F)}, "wo": {"kernel": r(F, E)}}  # noqa: E731
    enc = {"encoder_norm": {"scale": r(E)}, "relpos_bias": {"rel_embedding": r(H, B)}}
    for i in range(NE):
        enc[f"layers_{i}"] = {"attention": att(), "mlp": mlp(), "pre_attention_layer_norm": {"scale": r(E)},
                              "pre_mlp_layer_norm": {"scale": r(E)}}
    dec = {"decoder_norm": {"scale": r(E)}, "relpos_bias": {"rel_embedding": r(H, B)},
           "logits_dense": {"kernel": r(E, V)}}
    for j in range(ND):
        dec[f"layers_{j}"] = {"self_attention": att(), "encoder_decoder_attention": att(), "mlp": mlp(),
                              **{n: {"scale": r(E)} for n in ("pre_self_attention_layer_norm",
                                                             "pre_cross_attention_layer_norm", "pre_mlp_layer_norm")}}
    tgt = {"token_embedder": {"embedding": r(V, E)}, "encoder": enc, "decoder": dec}
    root = tmp_path / "ck"
    _save(root, 30, {"target": tgt})
    emb = tgt["token_embedder"]["embedding"]
    want = {"shared.weight": emb, "encoder.embed_tokens.weight": emb, "decoder.embed_tokens.weight": emb,
            "lm_head.weight": dec["logits_dense"]["kernel"].T,
            "encoder.final_layer_norm.weight": enc["encoder_norm"]["scale"],
            "decoder.final_layer_norm.weight": dec["decoder_norm"]["scale"],
            "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight": enc["relpos_bias"]["rel_embedding"].T,
            "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight": dec["relpos_bias"]["rel_embedding"].T}
    qkvo = {"q": "query", "k": "key", "v": "value", "o": "out"}
    for side, n, blocks, mlpi, norms in (
            ("encoder", NE, (("0.SelfAttention", "attention"),), 1,
             (("0", "pre_attention_layer_norm"), ("1", "pre_mlp_layer_norm"))),
            ("decoder", ND, (("0.SelfAttention", "self_attention"), ("1.EncDecAttention", "encoder_decoder_attention")), 2,
             (("0", "pre_self_attention_layer_norm"), ("1", "pre_cross_attention_layer_norm"), ("2", "pre_mlp_layer_norm")))):
        src = enc if side == "encoder" else dec
        for i in range(n):
            lay, hb = src[f"layers_{i}"], f"{side}.block.{i}.layer."
            for hl, mt in blocks:
                for q, k in qkvo.items():
                    want[f"{hb}{hl}.{q}.weight"] = lay[mt][k]["kernel"].T
            for w in ("wi_0", "wi_1", "wo"):
                want[f"{hb}{mlpi}.DenseReluDense.{w}.weight"] = lay["mlp"][w]["kernel"].T
            for nn, mt in norms:
                want[f"{hb}{nn}.layer_norm.weight"] = lay[mt]["scale"]
    want = {k: np.ascontiguousarray(v) for k, v in want.items()}
    m = mount(root, "ro")
    assert sorted(os.listdir(m.path / "30/.views")) == ["t5x-t5-hf"]
    folder = m.path / "30/.views/t5x-t5-hf"
    assert assert_folder(folder, want) == len(want)
    cfg = json.loads((folder / "config.json").read_text())
    assert (cfg["num_layers"], cfg["num_decoder_layers"], cfg["d_kv"], cfg["num_heads"]) == (NE, ND, D, H)
    assert cfg["relative_attention_num_buckets"] == B


def test_step_mount_and_where_views_are(mount, tmp_path):
    """A one-step mount has .views/ at its root; no directory but a step has
    one; a view folder is read-only."""
    p = maxtext_llama(np.random.default_rng(9), "bfloat16")
    root = tmp_path / "ck"
    _save(root, 30, {"params": {"params": p}})
    m = mount(root / "30")
    assert sorted(os.listdir(m.path / ".views")) == ["maxtext-llama-hf", "maxtext-llama3.1-hf"]
    assert_folder(m.path / ".views" / "maxtext-llama-hf", expected_llama(p))
    assert not os.path.exists(m.path / "items" / ".views")
    assert not os.path.exists(m.path / "items" / "params" / ".views")
    with pytest.raises(OSError):
        open(m.path / ".views" / "maxtext-llama-hf" / "model.safetensors", "r+b")
    with pytest.raises(OSError):
        open(m.path / ".views" / "maxtext-llama-hf" / "new.txt", "wb")
    m2 = mount(root, "ro")
    assert not os.path.exists(m2.path / ".views")  # the root of a root mount: no step


SHARDED_SAVE = r"""
import os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax, numpy as np
import orbax.checkpoint as ocp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
src = np.load(sys.argv[2], allow_pickle=True).item()
mesh = Mesh(np.array(jax.devices()), ("fsdp",))
put = lambda x: jax.device_put(x, NamedSharding(mesh, P("fsdp")))
tree = jax.tree_util.tree_map(put, src)
mngr = ocp.CheckpointManager(sys.argv[1], item_names=("items",))
mngr.save(30, args=ocp.args.Composite(items=ocp.args.StandardSave({"params": {"params": tree}})))
mngr.wait_until_finished()
mngr.close()
"""


def stored_chunks(step_dir):
    n = 0
    for dirpath, _, files in os.walk(step_dir):
        for f in files:
            if f.endswith(".npy"):
                shape = json.loads(os.getxattr(os.path.join(dirpath, f), "user.ckpt.shape"))
                chunk = json.loads(os.getxattr(os.path.join(dirpath, f), "user.ckpt.chunks"))
                n += int(np.prod([-(-s // c) for s, c in zip(shape, chunk)]))
    return n


@pytest.mark.parametrize("cache", ["64M", "256K", "32K"])
def test_fsdp_sharded_source(mount, tmp_path, cache):
    """Arrays sharded on their first axis over 4 devices (MaxText's FSDP:
    each stored chunk spans all layers of scan axis 1).  With a cache that
    holds a source array's chunks, every chunk is decoded once for all
    layers; with a tiny one the bytes are still exact (and with chunks over
    a quarter of it, the log says which cache_size avoids re-decoding)."""
    p = maxtext_llama(np.random.default_rng(10), "float32")
    np.save(tmp_path / "src.npy", p, allow_pickle=True)
    root = tmp_path / "ck"
    import sys
    subprocess.run([sys.executable, "-c", SHARDED_SAVE, str(root), str(tmp_path / "src.npy")], check=True,
                   timeout=300)
    m = mount(root, "ro", f"cache_size={cache}")
    chunks = stored_chunks(m.path / "30" / "items")
    assert chunks == 12 * 4  # every array in 4 chunks along its first axis
    before = stats(m)["chunks_decoded"]
    assert_folder(m.path / "30/.views/maxtext-llama-hf", expected_llama(p))
    decoded = stats(m)["chunks_decoded"] - before
    if cache == "64M":
        assert decoded == chunks, (decoded, chunks)
    elif cache == "256K":
        assert decoded >= chunks  # (a streamed unit is not a cached decode: 32K not counted)
    # chunks over a quarter of the cache are streamed: the log says what to mount with
    warned = "exceed a quarter of cache_size" in m.log()
    assert warned == (cache == "32K"), m.log()[-2000:]


def test_the_next_source_is_decoded_ahead(mount, tmp_path):
    """A view file holds the tensors of one source array in a row (a run).
    A read of the second tensor of a run queues the decode of the next
    run's source, so its chunks are decoded before any of its bytes is
    read, and reading them decodes nothing more: every chunk is decoded
    once (FSDP source over 4 devices: 4 chunks per array, each spanning
    every layer)."""
    p = maxtext_llama(np.random.default_rng(12), "float32")
    np.save(tmp_path / "src.npy", p, allow_pickle=True)
    root = tmp_path / "ck"
    import sys
    subprocess.run([sys.executable, "-c", SHARDED_SAVE, str(root), str(tmp_path / "src.npy")], check=True,
                   timeout=300)
    table = subprocess.run([str(U.BIN), "info", "--recipe", "maxtext-llama-hf", str(root), "30"],
                           capture_output=True, text=True, check=True).stdout.splitlines()[1:]
    source = {ln.split()[0]: ln.split()[3] for ln in table if ln.strip()}
    m = mount(root, "ro", "cache_size=64M", "direct_read")  # no kernel read-ahead: reads as made
    f = m.path / "30/.views/maxtext-llama-hf/model.safetensors"
    with open(f, "rb", buffering=0) as fh:  # (a buffered read would take st_blksize, 1 MiB: all of it)
        hlen = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(hlen))
    order = sorted((v["data_offsets"][0] + 8 + hlen, k) for k, v in header.items() if k != "__metadata__")
    runs = []
    for off, name in order:
        if runs and source[runs[-1][0][1]] == source[name]:
            runs[-1].append((off, name))
        else:
            runs.append([(off, name)])
    # the gate_proj run (wi_0: transposed, every row spans its 4 chunks) and the run after it
    i = next(k for k, r in enumerate(runs) if r[0][1].endswith("mlp.gate_proj.weight"))
    run, nxt = runs[i], runs[i + 1]
    assert len(run) == L and source[nxt[0][1]] != source[run[0][1]]
    want = expected_llama(p)

    def read_tensor(fh, off, name):
        n = header[name]["data_offsets"][1] - header[name]["data_offsets"][0]
        assert os.pread(fh.fileno(), n, off) == np.ascontiguousarray(want[name]).tobytes(), name

    with open(f, "rb", buffering=0) as fh:
        read_tensor(fh, *run[0])  # the first tensor of the run: its source's 4 chunks
        d0 = stats(m)["chunks_decoded"]
        read_tensor(fh, *run[1])  # the second: from the cache, and the next source is queued
        U.wait_until(lambda: stats(m)["chunks_decoded"] >= d0 + 4, timeout=30)
        assert stats(m)["chunks_decoded"] == d0 + 4, (d0, stats(m))
        # the rest of the run and the next run's first tensor: nothing more
        # to decode (its second tensor would queue the run after)
        for off, name in run[2:] + nxt[:1]:
            read_tensor(fh, off, name)
    assert stats(m)["chunks_decoded"] == d0 + 4, (d0, stats(m))


def test_in_process_read_matches_the_mount(mount, tmp_path):
    """`ckpt_bench vread` (the benchmarks' in-process reader: the library's
    view API without FUSE, in 1 MiB pieces and in odd-sized ones) gives the
    same bytes as the view file read through the mount, and decodes every
    stored chunk once with a cache that holds a source array."""
    tool = U.BIN.parent / "ckpt_bench"
    assert tool.exists(), f"{tool}: the build's tools (CKPT_TOOLS) are missing"
    p = maxtext_llama(np.random.default_rng(13), "bfloat16")
    np.save(tmp_path / "src.npy", p, allow_pickle=True)
    root = tmp_path / "ck"
    import sys
    subprocess.run([sys.executable, "-c", SHARDED_SAVE, str(root), str(tmp_path / "src.npy")], check=True,
                   timeout=300)
    rel = "30/.views/maxtext-llama-hf/model.safetensors"
    m = mount(root, "ro", "cache_size=64M")
    through_mount = (m.path / rel).read_bytes()
    for piece in ("1048576", "65537"):
        out = tmp_path / f"in-process-{piece}"
        r = subprocess.run([str(tool), "vread", str(root), rel, "-c", "64", "-b", piece, "-o", str(out)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        res = json.loads(r.stdout)
        assert res["bytes"] == len(through_mount) and out.read_bytes() == through_mount, piece
        assert res["chunks_decoded"] == stored_chunks(m.path / "30" / "items"), res


def test_maxtext_llama_unscanned_to_hf(mount, tmp_path):
    """scan_layers: false: decoder/layers_{l}/... without the layer axis;
    the same HF tensors as the scanned tree they are cut from."""
    p = maxtext_llama(np.random.default_rng(11), "bfloat16")
    lay = p["decoder"].pop("layers")
    import jax
    for l in range(L):
        p["decoder"][f"layers_{l}"] = jax.tree_util.tree_map(lambda x: np.ascontiguousarray(x[:, l]), lay)
    root = tmp_path / "ck"
    _save(root, 30, {"params": {"params": p}})
    m = mount(root, "ro")
    assert sorted(os.listdir(m.path / "30/.views")) == ["maxtext-llama-unscanned-hf"]
    folder = m.path / "30/.views/maxtext-llama-unscanned-hf"
    assert_folder(folder, expected_llama({**p, "decoder": {**p["decoder"], "layers": lay}}))
    assert json.loads((folder / "config.json").read_text())["num_hidden_layers"] == L
    assert "maxtext-llama-hf: no view: " in m.log()


def test_info_recipe_default_step_is_the_highest(tmp_path):
    """Steps 9 and 10 (names that sort the other way as text): the default
    STEP of `info --recipe` is 10."""
    root = tmp_path / "ck"
    p9 = maxtext_llama(np.random.default_rng(12), "float32")
    _save(root, 9, {"params": {"params": p9}})
    p10 = maxtext_llama(np.random.default_rng(13), "float32")
    p10["decoder"]["decoder_norm"]["scale"] = np.zeros(E + 2, dtype=np.float32)  # only 10 fails
    _save(root, 10, {"params": {"params": p10}})
    r = subprocess.run([str(U.BIN), "info", "--recipe", "maxtext-llama-hf", str(root)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "/10: model.norm.weight" in r.stderr and "axis 0 is E = 64" in r.stderr, r.stderr
    r = subprocess.run([str(U.BIN), "info", "--recipe", "maxtext-llama-hf", str(root), "9"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_unaligned_reads(mount, tmp_path):
    """Reads at any offset and length (inside elements, across tensors)
    give the bytes of the whole file."""
    p = maxtext_llama(np.random.default_rng(14), "bfloat16")
    root = tmp_path / "ck"
    _save(root, 30, {"params": {"params": p}})
    m = mount(root, "ro", "direct_read")
    path = m.path / "30/.views/maxtext-llama3.1-hf/model.safetensors"
    whole = path.read_bytes()
    rng = np.random.default_rng(15)
    fd = os.open(path, os.O_RDONLY)
    try:
        for _ in range(300):
            off = int(rng.integers(0, len(whole)))
            n = int(rng.integers(1, 70000))
            assert os.pread(fd, n, off) == whole[off:off + n], (off, n)
    finally:
        os.close(fd)
    (tmp_path / "copy.safetensors").write_bytes(whole)
    import ml_dtypes  # noqa: F401
    from safetensors.numpy import load_file
    got = load_file(str(tmp_path / "copy.safetensors"))
    want = expected_llama(p, rope31=True)
    assert sorted(got) == sorted(want)
    assert all(got[k].tobytes() == want[k].tobytes() for k in want)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_maxtext_gemma3_to_hf(mount, tmp_path, dtype):
    """Six-layer pattern: layers_{b} slice s is HF layer 6s+b, the remainder
    layers_{r} is HF layer 6S+r; norms minus 1, embedding / bf16(sqrt(E))."""
    import ml_dtypes
    rng = np.random.default_rng(16)
    r = lambda *s: _rand(rng, s, dtype)  # noqa: E731
    S, NR = 2, 2

    def block(scan):
        ax = (lambda *d: (d[0], S) + d[1:]) if scan else (lambda *d: d)  # noqa: E731
        return {**{n: {"scale": r(*ax(E)) + 1} for n in ("pre_self_attention_norm", "post_self_attention_norm",
                                                          "pre_ffw_norm", "post_ffw_norm")},
                "self_attention": {"query": {"kernel": r(*ax(E, H, D))}, "key": {"kernel": r(*ax(E, K, D))},
                                   "value": {"kernel": r(*ax(E, K, D))},
                                   "out": {"kernel": r(*((H, S, D, E) if scan else (H, D, E)))},
                                   "query_norm": {"scale": r(*ax(D)) + 1}, "key_norm": {"scale": r(*ax(D)) + 1}},
                "mlp": {"wi_0": {"kernel": r(*ax(E, F))}, "wi_1": {"kernel": r(*ax(E, F))},
                        "wo": {"kernel": r(*ax(F, E))}}}
    dec = {"layers": {f"layers_{b}": block(True) for b in range(6)},
           "layers_remainder": {f"layers_{i}": block(False) for i in range(NR)},
           "decoder_norm": {"scale": r(E) + 1}}
    p = {"token_embedder": {"embedding": r(V, E)}, "decoder": dec}
    root = tmp_path / "ck"
    _save(root, 30, {"params": {"params": p}})
    dt = p["token_embedder"]["embedding"].dtype
    f32 = np.float32
    minus1 = lambda x: (x.astype(f32) - f32(1)).astype(dt)  # noqa: E731
    n = f32(ml_dtypes.bfloat16(np.sqrt(E)))
    want = {"model.embed_tokens.weight": (p["token_embedder"]["embedding"].astype(f32) / n).astype(dt),
            "model.norm.weight": minus1(dec["decoder_norm"]["scale"])}
    layers = [(6 * s + b, dec["layers"][f"layers_{b}"], s) for b in range(6) for s in range(S)]
    layers += [(6 * S + i, dec["layers_remainder"][f"layers_{i}"], None) for i in range(NR)]
    for hl, blk, s in layers:
        cut = (lambda x: x[:, s]) if s is not None else (lambda x: x)  # noqa: E731
        pre = f"model.layers.{hl}."
        for mt, hf in (("pre_self_attention_norm", "input_layernorm"),
                       ("post_self_attention_norm", "post_attention_layernorm"),
                       ("pre_ffw_norm", "pre_feedforward_layernorm"), ("post_ffw_norm", "post_feedforward_layernorm")):
            want[pre + hf + ".weight"] = minus1(cut(blk[mt]["scale"]))
        a = blk["self_attention"]
        want[pre + "self_attn.q_norm.weight"] = minus1(cut(a["query_norm"]["scale"]))
        want[pre + "self_attn.k_norm.weight"] = minus1(cut(a["key_norm"]["scale"]))
        want[pre + "self_attn.q_proj.weight"] = heads_rows(cut(a["query"]["kernel"]), H, D)
        want[pre + "self_attn.k_proj.weight"] = heads_rows(cut(a["key"]["kernel"]), K, D)
        want[pre + "self_attn.v_proj.weight"] = heads_rows(cut(a["value"]["kernel"]), K, D)
        want[pre + "self_attn.o_proj.weight"] = heads_cols(cut(a["out"]["kernel"]), H, D)
        want[pre + "mlp.gate_proj.weight"] = cut(blk["mlp"]["wi_0"]["kernel"]).T
        want[pre + "mlp.up_proj.weight"] = cut(blk["mlp"]["wi_1"]["kernel"]).T
        want[pre + "mlp.down_proj.weight"] = cut(blk["mlp"]["wo"]["kernel"]).T
    want = {k: np.ascontiguousarray(v) for k, v in want.items()}
    m = mount(root, "ro")
    assert sorted(os.listdir(m.path / "30/.views")) == ["maxtext-gemma3-hf"]
    folder = m.path / "30/.views/maxtext-gemma3-hf"
    assert assert_folder(folder, want) == 2 + (6 * S + NR) * 13
    assert json.loads((folder / "config.json").read_text())["num_hidden_layers"] == 6 * S + NR
