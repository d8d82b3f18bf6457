#!/usr/bin/env python3
"""Write a checkpoint shaped like Llama 3.1 405B as MaxText saves it, whose
chunks compress to almost nothing, so that it fits on a small disk.

    gen_405b.py ROOT [--step N] [--layers L] [--devices D]

ROOT becomes a CheckpointManager root with one step, N (default 1000), whose
item `items` holds MaxText's TrainState with scanned layers:

    params/params/token_embedder/embedding              (V, E)        bf16
    params/params/decoder/layers/mlp/wi_0/kernel        (E, L, M)     bf16 (wi_1 the same)
    params/params/decoder/layers/mlp/wo/kernel          (M, L, E)     bf16
    params/params/decoder/layers/self_attention/query/kernel (E, L, Hq, D)
    params/params/decoder/layers/self_attention/{key,value}/kernel (E, L, Hkv, D)
    params/params/decoder/layers/self_attention/out/kernel   (Hq, L, D, E)
    params/params/decoder/layers/{pre,post}_self_attention_layer_norm/scale (E, L)
    params/params/decoder/decoder_norm/scale            (E,)
    params/params/decoder/logits_dense/kernel           (E, V)
    opt_state/0/{mu,nu}/params/...                      the same shapes, f32
    opt_state/0/count, step                             int32 scalars

with E 16384, M 53248, Hq 128, Hkv 8, D 128, V 128256 and L 126 (--layers
changes L).  About 0.8 TB of params and 3.2 TB of optimizer state, logical.

Layout: Orbax's own, OCDBT + zarr3.  Every array is chunked as a save on D
devices (default 256: 32 hosts of 8) with fully sharded data parallelism
chunks it: the embed axis E split D ways (Orbax writes one chunk per device
shard), zarr3 `sharding_indexed` with one inner chunk and the inner codecs
[bytes, zstd], as Orbax writes them.  The OCDBT database is one merged
B+tree (leaves of 64 entries) whose out-of-line values lie in 32 data files
under d/, one per host.

Each chunk holds one repeated byte (distinct per array and chunk, so a read
that lands in the wrong chunk is seen), stored as a zstd frame made of RLE
blocks: 4 bytes per 128 KiB, so the stored size is about 1/32768 of the
logical size.  The frames are those zstd writes for such data: a 2 MiB window,
the content size in the header, no checksum.  value_of() gives the byte of
each chunk, so a reader can check what it got.
"""
import argparse
import base64
import json
import os
import struct
import sys
import time
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "py"))
import gen_ocdbt as G  # noqa: E402
from crc32c_ref import crc32c  # noqa: E402

E, M, HQ, HKV, D, V = 16384, 53248, 128, 8, 128, 128256
ITEMSIZE = {"bfloat16": 2, "float32": 4, "int32": 4}
BLOCK = 128 * 1024


def params_spec(L):
    """[(key path tuple, shape, index of the embed axis)]"""
    p = ("params", "params")
    lay = p + ("decoder", "layers")
    return [
        (p + ("token_embedder", "embedding"), (V, E), 1),
        (lay + ("mlp", "wi_0", "kernel"), (E, L, M), 0),
        (lay + ("mlp", "wi_1", "kernel"), (E, L, M), 0),
        (lay + ("mlp", "wo", "kernel"), (M, L, E), 2),
        (lay + ("self_attention", "query", "kernel"), (E, L, HQ, D), 0),
        (lay + ("self_attention", "key", "kernel"), (E, L, HKV, D), 0),
        (lay + ("self_attention", "value", "kernel"), (E, L, HKV, D), 0),
        (lay + ("self_attention", "out", "kernel"), (HQ, L, D, E), 3),
        (lay + ("pre_self_attention_layer_norm", "scale"), (E, L), 0),
        (lay + ("post_self_attention_layer_norm", "scale"), (E, L), 0),
        (p + ("decoder", "decoder_norm", "scale"), (E,), 0),
        (p + ("decoder", "logits_dense", "kernel"), (E, V), 0),
    ]


def tree_spec(L):
    """[(key path, dtype, shape, chunk shape)] of the whole TrainState."""
    out = []
    for prefix, dtype in ((("params",), "bfloat16"), (("opt_state", "0", "mu"), "float32"),
                          (("opt_state", "0", "nu"), "float32")):
        for path, shape, ax in params_spec(L):
            out.append((prefix + path[1:], dtype, shape, ax))
    out.append((("opt_state", "0", "count"), "int32", (), None))
    out.append((("step",), "int32", (), None))
    return out


def chunk_shape(shape, ax, devices):
    if ax is None:
        return shape
    c = list(shape)
    assert shape[ax] % devices == 0, (shape, ax, devices)
    c[ax] = shape[ax] // devices
    return tuple(c)


def value_of(array_index, chunk_index):
    """The byte every element of that chunk is made of (never 0, the fill value)."""
    return (array_index * 37 + chunk_index * 11) % 251 + 1


def rle_frame(nbytes, byte):
    """A zstd frame of nbytes copies of byte: RLE blocks of at most 128 KiB."""
    out = bytearray(struct.pack("<I", 0xFD2FB528))
    out += bytes([0xC0])                     # 8-byte content size, window descriptor follows
    out += bytes([(21 - 10) << 3])           # window 2 MiB
    out += struct.pack("<Q", nbytes)
    left = nbytes
    while True:
        n = min(BLOCK, left)
        left -= n
        last = 1 if left == 0 else 0
        out += struct.pack("<I", last | (1 << 1) | (n << 3))[:3] + bytes([byte])
        if last:
            return bytes(out)


def shard_value(nbytes, byte):
    """sharding_indexed with one inner chunk: the frame, then the index (offset,
    length) and its CRC-32C."""
    frame = rle_frame(nbytes, byte) if nbytes else b""
    index = struct.pack("<QQ", 0, len(frame))
    return frame + index + struct.pack("<I", crc32c(index))


def zarr_json(dtype, shape, chunks):
    inner = [{"configuration": {"endian": "little"}, "name": "bytes"},
             {"configuration": {"checksum": False, "level": 3}, "name": "zstd"}]
    codecs = [{"configuration": {"chunk_shape": list(chunks), "codecs": inner,
                                 "index_codecs": [{"configuration": {"endian": "little"}, "name": "bytes"},
                                                  {"name": "crc32c"}]},
               "name": "sharding_indexed"}]
    meta = {"chunk_grid": {"configuration": {"chunk_shape": list(chunks)}, "name": "regular"},
            "chunk_key_encoding": {"name": "default"}, "codecs": codecs, "data_type": dtype,
            "fill_value": 0.0 if dtype != "int32" else 0, "node_type": "array", "shape": list(shape),
            "zarr_format": 3}
    return json.dumps(meta, separators=(",", ":"), sort_keys=True).encode()


def sharding_json(shape, ax, devices):
    spec = [None] * len(shape)
    if ax is not None:
        spec[ax] = "fsdp"
    return json.dumps({"sharding_type": "NamedSharding", "shape": [devices], "axis_names": ["fsdp"],
                       "axis_types": ["AxisType.Auto"], "partition_spec": spec,
                       "device_mesh": {"mesh": [{"id": i} for i in range(devices)]}})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root")
    ap.add_argument("--step", type=int, default=1000)
    ap.add_argument("--layers", type=int, default=126)
    ap.add_argument("--devices", type=int, default=256)
    a = ap.parse_args()
    t0 = time.monotonic()
    item = os.path.join(a.root, str(a.step), "items")
    os.makedirs(item)
    kv, tree, sharding = [], {}, {}
    logical = 0
    frames = {}
    for i, (path, dtype, shape, ax) in enumerate(tree_spec(a.layers)):
        name = ".".join(path)
        chunks = chunk_shape(shape, ax, a.devices)
        kv.append(((name + "/zarr.json").encode(), zarr_json(dtype, shape, chunks)))
        nchunk = 1
        for c in chunks:
            nchunk *= c
        nbytes = nchunk * ITEMSIZE[dtype]
        grid = [s // c for s, c in zip(shape, chunks)]
        n = 1
        for g in grid:
            n *= g
        for k in range(n):
            ix, rest = [], k
            for g in reversed(grid):
                ix.append(rest % g)
                rest //= g
            ix.reverse()
            key = name + "/c" + "".join("/%d" % x for x in ix) if shape else name + "/c"
            b = value_of(i, k)
            if (nbytes, b) not in frames:
                frames[(nbytes, b)] = shard_value(nbytes, b)
            kv.append((key.encode(), frames[(nbytes, b)]))
        logical += nbytes * n
        tree[repr(path)] = {
            "key_metadata": [{"key": p, "key_type": 1 if p.isdigit() else 2} for p in path],
            "value_metadata": {"value_type": "jax.Array", "skip_deserialize": False,
                               "write_shape": list(chunks)}}
        # _sharding: the base64 of the param name -> the sharding as a JSON string
        sharding[base64.b64encode(name.encode()).decode()] = sharding_json(shape, ax, a.devices)
    kv.sort()
    args = SimpleNamespace(leaves_in_subdir=False, value_files=32, leaf_entries=64, interior_entries=64,
                           compress=False)
    G.write_database(args, item, "405b", kv, "405b")
    with open(os.path.join(item, "_METADATA"), "w") as f:
        json.dump({"tree_metadata": tree, "use_ocdbt": True, "use_zarr3": True,
                   "store_array_data_equal_to_fill_value": True, "custom_metadata": None}, f)
    with open(os.path.join(item, "_sharding"), "w") as f:
        json.dump(sharding, f)
    now = int(time.time() * 1e9)
    with open(os.path.join(a.root, str(a.step), "_CHECKPOINT_METADATA"), "w") as f:
        json.dump({"item_handlers": {"items": "orbax.checkpoint._src.handlers.pytree_checkpoint_handler."
                                              "PyTreeCheckpointHandler"},
                   "metrics": {}, "performance_metrics": {}, "init_timestamp_nsecs": now,
                   "commit_timestamp_nsecs": now, "custom_metadata": {}}, f)
    for d in (item, os.path.join(a.root, str(a.step))):
        open(os.path.join(d, "commit_success.txt"), "w").close()
    stored = sum(os.path.getsize(os.path.join(dp, fn)) for dp, _, fns in os.walk(a.root) for fn in fns)
    print(json.dumps({"arrays": len(tree), "keys": len(kv), "logical_bytes": logical, "stored_bytes": stored,
                      "seconds": round(time.monotonic() - t0, 1)}))


if __name__ == "__main__":
    main()
