#!/usr/bin/env python3
"""Write Orbax-like OCDBT items in the optional layouts of newer Orbax
versions (orbax-checkpoint 0.12.3 and later), byte by byte from the format
(the encoders are those of scripts/gen_ocdbt.py).

    gen_ocdbt_layouts.py OUT_DIR            the fixtures below, under OUT_DIR
    gen_ocdbt_layouts.py --large OUT_ITEM   one item whose chunk lies past 4 GiB
                                            in a sparse data file (for a test to
                                            build in a temporary folder)

Items written under OUT_DIR (each with _METADATA, _sharding, _CHECKPOINT_METADATA,
commit_success.txt) and OUT_DIR/expected_ocdbt/ (per item and param the
array's C-order little-endian bytes, and ocdbt_expected.json):

  ocdbt_split/            B-tree nodes in ocdbt.process_0/ocdbt_meta/, values in
                          ocdbt.process_0/ocdbt_data/ (Orbax's
                          store_ocdbt_metadata_and_values_separately) instead of d/;
                          a merged manifest.ocdbt at the item and the process's own
  ocdbt_split_unmerged/   the same without the merged manifest (a save whose merge
                          never ran)
  ocdbt_replica/          per-process folders ocdbt.process_replica_0/ and
                          ocdbt.process_replica_1/ (replica_separate_folder), no merged
                          manifest: the arrays are the union of both databases
  ocdbt_replica_merged/   the same with a merged manifest.ocdbt whose root node (in d/)
                          points into both replica folders
Every item's arrays are zarr v3 without any bytes->bytes codec: the codec chain
[bytes], [transpose, bytes] and sharding_indexed with inner chain [bytes] (index
[bytes, crc32c], at the end and at the start).

--large: a data file of 5 GiB + a little, sparse, whose one out-of-line
chunk (uncompressed) starts at 5 GiB, plus a key whose value is 4 GiB + 5
bytes long; the manifest's statistics (tree bytes, indirect value bytes)
are above 2^32 too.
"""
import hashlib
import json
import os
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "py"))
import gen_ocdbt as G  # noqa: E402
from crc32c_ref import crc32c  # noqa: E402

SINGLE_DEVICE = json.dumps({"sharding_type": "SingleDeviceSharding", "device_str": "cpu:0"})
CKPT_METADATA = {
    "item_handlers": "orbax.checkpoint._src.handlers.pytree_checkpoint_handler.PyTreeCheckpointHandler",
    "metrics": {}, "performance_metrics": {}, "init_timestamp_nsecs": 1795980099367490099,
    "commit_timestamp_nsecs": 1795980099407200884, "custom_metadata": {}}

B = {"name": "bytes", "configuration": {"endian": "little"}}
IDX = [B, {"name": "crc32c"}]


def shard(inner, location):
    return [{"name": "sharding_indexed", "configuration": {
        "chunk_shape": list(inner), "codecs": [B], "index_codecs": IDX, "index_location": location}}]


# param, dtype, shape, chunk shape, codecs
ARRAYS = [
    ("params.dense.bias", "float32", (40,), (16,), [B]),
    ("params.dense.kernel", "float32", (24, 40), (8, 40), [B]),  # chunks of 1280 bytes: out of line
    ("params.embed", "int32", (32, 12), (32, 12), shard((8, 6), "end")),  # a 1.6 KiB shard: out of line
    ("params.norm", "float64", (10, 6), (10, 6), shard((5, 3), "start")),
    ("params.proj", "float32", (12, 20), (12, 20),
     [{"name": "transpose", "configuration": {"order": [1, 0]}}, B]),
    ("step", "int64", (), (), [B]),
]


def values(i, dtype, shape):
    n = int(np.prod(shape)) if shape else 1
    return (np.arange(n, dtype=np.int64) * 3 + 1000 * i).astype(dtype).reshape(shape)


def grid(shape, chunks):
    return list(np.ndindex(*[-(-s // c) for s, c in zip(shape, chunks)])) if shape else [()]


def chunk_of(arr, ix, chunks):
    out = np.zeros(chunks, dtype=arr.dtype)
    src = tuple(slice(g * c, min((g + 1) * c, s)) for g, c, s in zip(ix, chunks, arr.shape))
    out[tuple(slice(0, s.stop - s.start) for s in src)] = arr[src]
    return out


def encode_chunk(chunk, codecs):
    c0 = codecs[0]
    if c0["name"] == "sharding_indexed":
        conf = c0["configuration"]
        inner = conf["chunk_shape"]
        bodies = [np.ascontiguousarray(chunk_of(chunk, ix, inner)).astype(chunk.dtype.newbyteorder("<")).tobytes()
                  for ix in grid(chunk.shape, inner)]
        start = conf["index_location"] == "start"
        off = 16 * len(bodies) + 4 if start else 0
        index = b""
        for b in bodies:
            index += struct.pack("<QQ", off, len(b))
            off += len(b)
        index += struct.pack("<I", crc32c(index))
        return index + b"".join(bodies) if start else b"".join(bodies) + index
    a = chunk
    if c0["name"] == "transpose":
        a = np.transpose(a, c0["configuration"]["order"])
    return np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes()


def array_kv(param, arr, chunks, codecs):
    meta = {"chunk_grid": {"configuration": {"chunk_shape": list(chunks)}, "name": "regular"},
            "chunk_key_encoding": {"name": "default"}, "codecs": codecs, "data_type": arr.dtype.name,
            "fill_value": 0, "node_type": "array", "shape": list(arr.shape), "zarr_format": 3}
    kv = [((param + "/zarr.json").encode(), json.dumps(meta, separators=(",", ":"), sort_keys=True).encode())]
    for ix in grid(arr.shape, chunks):
        key = param + "/c" + "".join("/%d" % g for g in ix)
        kv.append((key.encode(), encode_chunk(chunk_of(arr, ix, chunks) if arr.shape else arr, codecs)))
    return kv


def item_files(out, params, expected=None, name=None):
    tree = {}
    for param, arr in params:
        keys = param.split(".")
        tree[str(tuple(keys))] = {
            "key_metadata": [{"key": k, "key_type": 2} for k in keys],
            "value_metadata": {"value_type": "jax.Array", "skip_deserialize": False, "write_shape": list(arr.shape)}}
        if expected is not None:
            raw = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<")).tobytes()
            rel = "%s/%s.bin" % (name, param)
            p = os.path.join(expected["dir"], rel)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "wb") as f:
                f.write(raw)
            expected["doc"]["%s/%s" % (name, param)] = {
                "item": name, "param": param, "dtype": arr.dtype.name, "shape": list(arr.shape), "file": rel,
                "sha256": hashlib.sha256(raw).hexdigest()}
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "_METADATA"), "w") as f:
        json.dump({"tree_metadata": tree, "use_ocdbt": True, "use_zarr3": True,
                   "store_array_data_equal_to_fill_value": True, "custom_metadata": None}, f)
    import base64
    with open(os.path.join(out, "_sharding"), "w") as f:
        json.dump({base64.urlsafe_b64encode(p.encode()).decode(): SINGLE_DEVICE for p, _ in params}, f,
                  separators=(",", ":"))
    with open(os.path.join(out, "_CHECKPOINT_METADATA"), "w") as f:
        json.dump(CKPT_METADATA, f)
    with open(os.path.join(out, "commit_success.txt"), "w") as f:
        f.write("Checkpoint commit was successful to /generated/wild_edges/%s" % os.path.basename(out))


class File:
    def __init__(self, root, rel):
        self.rel, self.path, self.buf, self.sparse_at = rel, os.path.join(root, rel.decode()), bytearray(), 0

    def append(self, blob):
        off = self.sparse_at + len(self.buf)
        self.buf += blob
        return off

    def write(self):
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path, "wb") as f:
            if self.sparse_at:
                f.truncate(self.sparse_at)
                f.seek(self.sparse_at)
            f.write(self.buf)


def leaf(kv, node_file, value_file, value_rel_from_node, prefix=b""):
    """One leaf of kv (sorted) into node_file; values above 1024 bytes into
    value_file, named in the leaf's table as value_rel_from_node.  A value
    given as (offset, length) is a reference into value_file as it stands."""
    refs, ool = [], False
    for k, v in kv:
        if isinstance(v, tuple):
            refs.append((k, (0, v[0], v[1])))
            ool = True
        elif len(v) > G.MAX_INLINE:
            refs.append((k, (0, value_file.append(v), len(v))))
            ool = True
        else:
            refs.append((k, v))
    blob = G.envelope(G.MAGIC_BTREE, G.encode_leaf(prefix, refs, [(b"", value_rel_from_node)] if ool else []), False)
    off = node_file.append(blob)
    indirect = sum(v[2] for _, v in refs if not isinstance(v, bytes))
    return {"first": kv[0][0], "last": kv[-1][0], "off": off, "len": len(blob), "keys": len(kv),
            "tree_bytes": len(blob), "indirect": indirect}


def manifest(db_root, table, height, root, tag, stats=None):
    uuid = hashlib.sha256(("uuid/layouts/%s" % tag).encode()).digest()[:16]
    body = bytearray(uuid)
    body += bytes([0]) + G.varint(G.MAX_INLINE) + G.varint(100000000) + bytes([4]) + G.varint(0)
    body += G.data_file_table(table)
    body += G.varint(1) + G.varint(1) + bytes([height])
    tree_bytes, indirect = stats or (root["tree_bytes"], root["indirect"])
    body += G.varint(0) + G.varint(root["off"]) + G.varint(root["len"])
    body += G.varint(root["keys"]) + G.varint(tree_bytes) + G.varint(indirect)
    body += struct.pack("<Q", 1700000000000000000) + G.varint(0)
    os.makedirs(db_root, exist_ok=True)
    with open(os.path.join(db_root, "manifest.ocdbt"), "wb") as f:
        f.write(G.envelope(G.MAGIC_MANIFEST, bytes(body), False))


def fid(tag):
    return G.file_id("layouts", tag)


def all_params():
    return [(p, values(i, dt, shape), chunks, codecs) for i, (p, dt, shape, chunks, codecs) in enumerate(ARRAYS)]


def kv_of(params):
    kv = []
    for p, arr, chunks, codecs in params:
        kv += array_kv(p, arr, chunks, codecs)
    return sorted(kv)


def make_split(out, expected, name, merged):
    item = os.path.join(out, name)
    params = all_params()
    item_files(item, [(p, a) for p, a, _, _ in params], expected, name)
    proc = os.path.join(item, "ocdbt.process_0")
    node = File(proc, b"ocdbt_meta/" + fid(name + "/meta"))
    data = File(proc, b"ocdbt_data/" + fid(name + "/data"))
    root = leaf(kv_of(params), node, data, b"ocdbt_data/" + data.rel.split(b"/")[-1])
    node.write()
    data.write()
    manifest(proc, [(b"", node.rel)], 0, root, name + "/p0")
    if merged:
        manifest(item, [(b"ocdbt.process_0/", node.rel)], 0, root, name)


def make_replica(out, expected, name, merged):
    item = os.path.join(out, name)
    params = all_params()
    item_files(item, [(p, a) for p, a, _, _ in params], expected, name)
    halves = [params[:3], params[3:]]  # key order: every key of the first half sorts first
    kids = []
    for r, half in enumerate(halves):
        proc = os.path.join(item, "ocdbt.process_replica_%d" % r)
        node = File(proc, b"d/" + fid("%s/r%d/node" % (name, r)))
        data = File(proc, b"d/" + fid("%s/r%d/data" % (name, r)))
        kv = kv_of(half)
        lf = leaf(kv, node, data, data.rel)
        node.write()
        manifest(proc, [(b"", node.rel)], 0, lf, "%s/r%d" % (name, r))
        # the same leaf again as a non-root node of the merged tree: its keys
        # relative to the common prefix of its subtree
        first, last = kv[0][0], kv[-1][0]
        pre = first[:G.lcp(first, last)]
        node2 = File(proc, b"d/" + fid("%s/r%d/merged" % (name, r)))
        lf2 = leaf(kv, node2, data, data.rel, prefix=pre)  # (its own copy of the values)
        node2.write()
        data.write()
        kids.append(dict(lf2, base=("ocdbt.process_replica_%d/" % r).encode(), rel=node2.rel))
    assert kids[0]["last"] < kids[1]["first"]
    if merged:
        top = File(item, b"d/" + fid(name + "/top"))
        table = [(k["base"], k["rel"]) for k in kids]
        kids_enc = [dict(k, fid=i) for i, k in enumerate(kids)]
        blob = G.envelope(G.MAGIC_BTREE, G.encode_interior(1, b"", kids_enc, table), False)
        off = top.append(blob)
        top.write()
        root = {"off": off, "len": len(blob), "keys": sum(k["keys"] for k in kids),
                "tree_bytes": len(blob) + sum(k["tree_bytes"] for k in kids),
                "indirect": sum(k["indirect"] for k in kids)}
        manifest(item, [(b"", top.rel)], 1, root, name)


def make_large(item):
    """One float32 array [64, 64] in one chunk (16 KiB, out of line) at 5 GiB."""
    arr = (np.arange(64 * 64, dtype=np.float32) * 0.5).reshape(64, 64)
    item_files(item, [("big.w", arr)])
    node = File(item, b"d/" + fid("large/node"))
    data = File(item, b"d/" + fid("large/data"))
    data.sparse_at = 5 << 30
    kv = array_kv("big.w", arr, (64, 64), [B])
    # a key no array reads whose value is longer than 4 GiB (it lies inside
    # the sparse file): the index must take its 64-bit length
    kv.append((b"big.w/extra", (0, (4 << 30) + 5)))
    root = leaf(sorted(kv), node, data, data.rel)
    node.write()
    data.write()
    manifest(item, [(b"", node.rel)], 0, root, "large", stats=((6 << 30) + 1, (5 << 30) + 7))
    return arr


def make_all(out, expected):
    make_split(out, expected, "ocdbt_split", True)
    make_split(out, expected, "ocdbt_split_unmerged", False)
    make_replica(out, expected, "ocdbt_replica", False)
    make_replica(out, expected, "ocdbt_replica_merged", True)


def main(argv):
    if len(argv) == 3 and argv[1] == "--large":
        make_large(argv[2])
        return 0
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = argv[1]
    expected = {"dir": os.path.join(out, "expected_ocdbt"), "doc": {}}
    os.makedirs(expected["dir"], exist_ok=True)
    make_all(out, expected)
    with open(os.path.join(expected["dir"], "ocdbt_expected.json"), "w") as f:
        json.dump(expected["doc"], f, indent=1, sort_keys=True)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
