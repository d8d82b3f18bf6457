"""A checkpoint of a big model's shapes (scripts/gen_405b.py: Llama 3.1 405B's
names and axes as MaxText saves them, OCDBT + zarr3, chunks of one repeated
byte stored as zstd RLE frames), here with 2 layers and chunks of an
8-device save so that it is made in a second: 60 GiB logical, a few MiB
stored, units of 436 MiB (bf16) and 872 MiB (f32).

What must hold for such a checkpoint: the tree and the safetensors header
come from metadata alone; a read of a few bytes of a unit larger than the
cache streams it (the daemon's peak memory stays within cache_size and a
slack, as docs/reliability.md states), and every byte read is the one the
generator put there (each chunk has its own byte).
"""
import os
import subprocess
import sys

import numpy as np
import pytest

import ckfs_util as U

sys.path.insert(0, str(U.REPO / "scripts"))
import gen_405b as G  # noqa: E402

MiB = 1 << 20
LAYERS, DEVICES = 2, 8
CACHE = 64 * MiB
SLACK = 48 * MiB   # stream cursors (4 x one 13-27 MiB row window + 4 MiB input) are inside it


@pytest.fixture(scope="module")
def big_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("big") / "root"
    subprocess.run([sys.executable, str(U.REPO / "scripts" / "gen_405b.py"), str(root), "--layers", str(LAYERS),
                    "--devices", str(DEVICES)], check=True, capture_output=True, timeout=300)
    return root


def spec_index(*tail):
    for i, (path, _, _, _) in enumerate(G.tree_spec(LAYERS)):
        if path[-len(tail):] == tail:
            return i
    raise KeyError(tail)


def test_big_shapes_stream_within_the_cache(big_root, mount):
    m = mount(big_root, f"cache_size={CACHE}")
    item = m.p("1000/items")
    subprocess.run(["ls", "-lR", str(m.p())], check=True, capture_output=True, timeout=120)
    wi0 = item / "params/params/decoder/layers/mlp/wi_0/kernel.npy"
    assert os.stat(wi0).st_size > 16384 * LAYERS * 53248 * 2
    before = U.vm(m.pid)
    k = spec_index("mlp", "wi_0", "kernel")
    with open(wi0, "rb") as f:
        hl = U.parse_npy_header(f.read(4096))[1]
        chunk_rows = 16384 // DEVICES
        row = LAYERS * 53248 * 2
        # the first bytes, bytes inside the third chunk, the last bytes
        for off, chunk in [(0, 0), (2 * chunk_rows * row + 12345, 2), (DEVICES * chunk_rows * row - 16, DEVICES - 1)]:
            got = os.pread(f.fileno(), 16, hl + off)
            assert got == bytes([G.value_of(k, chunk)]) * 16, (off, got)
    mu = item / "opt_state/0/mu/params/decoder/layers/mlp/wo/kernel.npy"
    k = spec_index("mu", "params", "decoder", "layers", "mlp", "wo", "kernel")
    with open(mu, "rb") as f:
        hl = U.parse_npy_header(f.read(4096))[1]
        assert os.pread(f.fileno(), 8, hl) == bytes([G.value_of(k, 0)]) * 8
    # a slice across two chunks of the embed axis
    a = np.load(item / "params/params/decoder/layers/self_attention/query/kernel[2047:2049,1].npy")
    k = spec_index("self_attention", "query", "kernel")
    assert (a.view(np.uint8)[0] == G.value_of(k, 0)).all() and (a.view(np.uint8)[1] == G.value_of(k, 1)).all()
    grew = U.vm(m.pid) - before
    if U.sanitized():
        pytest.skip("memory bound not checked under sanitizers (values were)")
    assert grew <= CACHE + SLACK, f"reads of huge units raised VmHWM by {grew / MiB:.0f} MiB"
