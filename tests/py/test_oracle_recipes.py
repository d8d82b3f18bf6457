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

pytestmark = pytest.mark.oracle

# tiny Llama: E = H*D as the real ones, GQA (K < H)
E, H, K, D, F, L, V = 64, 4, 2, 16, 96, 3, 256


def _save(root, step, state):
    import orbax.checkpoint as ocp
    mngr = ocp.CheckpointManager(str(root), item_names=("items",))
    mngr.save(step, args=ocp.args.Composite(items=ocp.args.StandardSave(state)))
    mngr.wait_until_finished()
    mngr.close()


def _rand(rng, shape, dtype):
    import ml_dtypes
    a = rng.standard_normal(shape).astype(np.float32)
    return a.astype(ml_dtypes.bfloat16) if dtype == "bfloat16" else a


def maxtext_llama(rng, dtype, d=D):
    """params of a MaxText llama2 decoder (scanned, scan axis 1)."""
    r = lambda *s: _rand(rng, s, dtype)  # noqa: E731
    layers = {
        "pre_self_attention_layer_norm": {"scale": r(E, L)},
        "post_self_attention_layer_norm": {"scale": r(E, L)},
        "self_attention": {"query": {"kernel": r(E, L, H, d)}, "key": {"kernel": r(E, L, K, d)},
                           "value": {"kernel": r(E, L, K, d)}, "out": {"kernel": r(H, L, d, E)}},
        "mlp": {"wi_0": {"kernel": r(E, L, F)}, "wi_1": {"kernel": r(E, L, F)}, "wo": {"kernel": r(F, L, E)}},
    }
    return {"token_embedder": {"embedding": r(V, E)},
            "decoder": {"layers": layers, "decoder_norm": {"scale": r(E)},
                        "logits_dense": {"kernel": r(E, V)}}}


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


def assert_folder(folder, want):
    """Every tensor of the safetensors file(s) in folder equals want, bytes,
    dtype and shape; nothing more, nothing less."""
    import ml_dtypes  # noqa: F401
    from safetensors import safe_open
    from safetensors.numpy import load_file
    files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    assert files, os.listdir(folder)
    got = {}
    for f in files:
        with safe_open(str(folder / f), framework="numpy") as st:
            for k in st.keys():
                got[k] = st.get_tensor(k)
        whole = load_file(str(folder / f))
        for k, t in whole.items():
            assert t.tobytes() == got[k].tobytes()
    assert sorted(got) == sorted(want), sorted(set(got) ^ set(want))
    for k, w in want.items():
        g = got[k]
        assert (g.dtype, g.shape) == (w.dtype, w.shape), (k, g.dtype, g.shape, w.dtype, w.shape)
        if g.tobytes() != w.tobytes():
            bad = np.flatnonzero(g.view(np.uint8) != w.view(np.uint8))
            pytest.fail(f"{k}: {bad.size} bytes differ, first at {bad[:5]}")
    return len(got)


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
