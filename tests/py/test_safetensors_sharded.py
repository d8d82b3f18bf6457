"""X.safetensors.d/: the Hugging Face sharded form of a subtree, offered when
the subtree holds more than -o safetensors_shard_size bytes of data.  Each
shard must pass the independent spec checker, the index must name every
tensor once with the right total, and the tensors must equal expected/."""

import errno
import json
import os

import ckfs_util as U
from st_spec import load


def _tensor_bytes(raw):
    """st_spec returns the tensor bytes; normalize to bytes."""
    return raw if isinstance(raw, (bytes, bytearray)) else bytes(raw)


def test_sharded_form(mount, expected):
    m = mount(U.FIXTURES / "manager", "safetensors_shard_size=10K")
    d = m.p("20/state/params.safetensors.d")
    names = sorted(os.listdir(d))
    assert "model.safetensors.index.json" in names
    shards = [n for n in names if n.endswith(".safetensors")]
    assert len(shards) > 1
    n = len(shards)
    assert shards == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    index = json.loads(open(os.path.join(d, "model.safetensors.index.json")).read())
    seen = {}
    total = 0
    for s in shards:
        tensors, meta = load(os.path.join(d, s))
        assert meta == {"format": "pt"}
        for name, (dtype, shape, raw) in tensors.items():
            assert name not in seen
            seen[name] = s
            key = "params." + name
            assert tuple(shape) == expected[key].shape, name
            assert _tensor_bytes(raw) == expected[key].data, name
            total += len(_tensor_bytes(raw))
    assert index["weight_map"] == seen
    assert index["metadata"]["total_size"] == total
    assert index["metadata"]["step"] == "20"
    params = {k for k in expected if k.startswith("params.")}
    assert {"params." + k for k in seen} == params


def test_small_subtree_has_no_sharded_form(mount):
    m = mount(U.FIXTURES / "manager")
    assert U.errno_of(os.stat, m.p("20/state/params.safetensors.d")) == errno.ENOENT
    assert os.path.getsize(m.p("20/state/params.safetensors")) > 0
