"""PyTorch checkpoints mounted as ckptfs trees (docs/usage.md "PyTorch and
safetensors sources"): torch.save files, distributed checkpoints (DCP)
and safetensors files, each tensor read byte-exact through a real mount,
and the whole-checkpoint safetensors view (DIR/.safetensors).

Safetensors files are checked with the small independent parser below
(8-byte length, JSON header, data offsets), not with ckptfs code.
"""

import json
import os
import struct

import pytest

import ckfs_util as U

HERE = os.path.dirname(os.path.abspath(__file__))
TORCH_FX = os.path.join(HERE, "..", "fixtures", "generated", "torch")


def st_parse(blob):
    """{name: (dtype, shape, bytes)} and __metadata__ of a safetensors file."""
    n = struct.unpack("<Q", blob[:8])[0]
    head = json.loads(blob[8:8 + n].decode("utf-8"))
    meta = head.pop("__metadata__", None)
    data = blob[8 + n:]
    ends = sorted((v["data_offsets"][0], v["data_offsets"][1]) for v in head.values())
    pos = 0
    for b, e in ends:  # contiguous, no gap, no overlap
        assert b == pos, (b, pos)
        pos = e
    assert pos == len(data)
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in head.items()}, meta


def test_whole_item_safetensors_view(mount, fixtures_dir, expected):
    """MNT/.safetensors of an item mount holds every array under its full
    key path (the view of directory X is X.safetensors; '' is the top)."""
    m = mount(fixtures_dir / "pytree_zarr3")
    blob = U.read_all(m.p(".safetensors"))
    tensors, meta = st_parse(blob)
    assert meta == {"format": "pt"}
    assert set(tensors) == set(expected), sorted(set(tensors) ^ set(expected))
    for k, e in expected.items():
        assert tensors[k][2] == e.data, k
    # a sub-directory's view still names tensors relative to it
    sub, _ = st_parse(U.read_all(m.p("params.safetensors")))
    assert "embed.embedding" in sub and sub["embed.embedding"][2] == expected["params.embed.embedding"].data
