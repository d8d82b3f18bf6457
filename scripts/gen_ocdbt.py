#!/usr/bin/env python3
"""Write a synthetic Orbax item folder stored as an OCDBT database.

    gen_ocdbt.py OUT_DIR --arrays N [--leaf-entries K] [--interior-entries M]
                 [--zarr3 | --zarr2] [--large-every L] [--value-files F]
                 [--leaves-in-subdir] [--processes P] [--compress]
                 [--expect FILE]

Array i is named ``layer_%06d.w`` (two pytree levels; zarr v2 unless --zarr3),
float32, shape [4, 4]
(or [32, 32] in two [16, 32] chunks when L > 0 and i % L == 0), values
``arange(size) + i`` in C order.  zarr v2: ``.zarray`` with compressor null,
chunk keys ``0.0``; zarr v3: ``zarr.json`` with the ``bytes`` codec only,
chunk keys ``c/0/0``.  Values of at most 1024 bytes are stored inline in the
B+tree leaves, larger ones out of line in data files under ``d/``.

B+tree: leaves of at most K entries; above them interior nodes of at most M
entries (M = 0: one interior node over all leaves) until a single root
remains, so height > 0 as soon as there is more than one leaf.  A non-root
node's key prefix is the common prefix of its subtree's keys (interior
entries carry subtree_common_prefix_length accordingly).

--leaves-in-subdir puts leaves and out-of-line values in
``ocdbt.process_0/d/<id>`` referenced through base_path ``ocdbt.process_0/``
(exercises transitive data-file paths).  --processes P writes no merged root:
array i goes to the database ``ocdbt.process_<i % P>/`` (a save whose merge
never ran).  --compress zstd-compresses the envelopes with the ``zstd`` CLI.

--expect FILE writes a JSON sidecar: format, height, leaves, sorted keys,
out-of-line keys, and per array its shape, chunk shape, value offset and
chunk keys, so that a test can check what the decoder returns.

The encoding is TensorStore's OCDBT format as docs/format.md ("What ckptfs
reads", OCDBT) describes it.
"""
import argparse
import hashlib
import json
import os
import struct
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "py"))
from crc32c_ref import crc32c  # noqa: E402

MAGIC_MANIFEST = 0x0CDB3A2A
MAGIC_BTREE = 0x0CDB20DE
MAX_INLINE = 1024


def varint(v):
    assert v >= 0
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def lcp(a, b):
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def envelope(magic, body, compress):
    comp = 0
    if compress:
        body = subprocess.run(['zstd', '-q', '-c', '-3'], input=body, stdout=subprocess.PIPE,
                              check=True).stdout
        comp = 1
    head = varint(0) + varint(comp)
    total = 4 + 8 + len(head) + len(body) + 4
    blob = struct.pack('>I', magic) + struct.pack('<Q', total) + head + body
    return blob + struct.pack('<I', crc32c(blob))


def data_file_table(entries):
    """entries: list of (base_path, relative_path) as bytes, in order."""
    out = bytearray(varint(len(entries)))
    paths = [b + r for b, r in entries]
    prefixes = [0] * len(paths)
    for i in range(1, len(paths)):
        p = lcp(paths[i - 1], paths[i])
        # a shared prefix may only extend past the base paths when they are equal
        if entries[i - 1][0] != entries[i][0]:
            p = min(p, len(entries[i - 1][0]), len(entries[i][0]))
        prefixes[i] = p
        out += varint(p)
    for i, p in enumerate(paths):
        out += varint(len(p) - prefixes[i])
    for b, _ in entries:
        out += varint(len(b))
    for i, p in enumerate(paths):
        out += p[prefixes[i]:]
    return bytes(out)


class DataFile:
    def __init__(self, root, rel):
        self.rel = rel            # path relative to the database root, bytes
        self.path = os.path.join(root, rel.decode())
        self.buf = bytearray()

    def append(self, blob):
        off = len(self.buf)
        self.buf += blob
        return off

    def write(self):
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path, 'wb') as f:
            f.write(self.buf)


def file_id(seed, tag):
    return hashlib.sha256(('%s/%s' % (seed, tag)).encode()).hexdigest()[:32].encode()


def encode_leaf(prefix, entries, vfile_ids):
    """entries: list of (full_key, value_bytes | (fid_index, offset, length)).
    vfile_ids: table entries for the out-of-line values."""
    rel = [k[len(prefix):] for k, _ in entries]
    n = len(rel)
    body = bytearray([0])  # height
    body += data_file_table(vfile_ids)
    body += varint(n)
    pre = [0] + [lcp(rel[i - 1], rel[i]) for i in range(1, n)]
    for i in range(1, n):
        body += varint(pre[i])
    for i in range(n):
        body += varint(len(rel[i]) - pre[i])
    for i in range(n):
        body += rel[i][pre[i]:]
    for _, v in entries:
        body += varint(len(v) if isinstance(v, bytes) else v[2])
    for _, v in entries:
        body += bytes([0 if isinstance(v, bytes) else 1])
    for _, v in entries:
        if not isinstance(v, bytes):
            body += varint(v[0])
    for _, v in entries:
        if not isinstance(v, bytes):
            body += varint(v[1])
    for _, v in entries:
        if isinstance(v, bytes):
            body += v
    return bytes(body)


def encode_interior(height, prefix, children, table):
    """children: list of dicts with first, last, fid, off, len, keys, tree_bytes, indirect."""
    n = len(children)
    rel = [c['first'][len(prefix):] for c in children]
    scp = [lcp(c['first'], c['last']) - len(prefix) for c in children]
    body = bytearray([height])
    body += data_file_table(table)
    body += varint(n)
    pre = [0] + [lcp(rel[i - 1], rel[i]) for i in range(1, n)]
    for i in range(1, n):
        body += varint(pre[i])
    for i in range(n):
        body += varint(len(rel[i]) - pre[i])
    for i in range(n):
        body += varint(scp[i])
    for i in range(n):
        body += rel[i][pre[i]:]
    for c in children:
        body += varint(c['fid'])
    for c in children:
        body += varint(c['off'])
    for c in children:
        body += varint(c['len'])
    for c in children:
        body += varint(c['keys'])
    for c in children:
        body += varint(c['tree_bytes'])
    for c in children:
        body += varint(c['indirect'])
    return bytes(body)


def array_values(args, i):
    large = args.large_every > 0 and i % args.large_every == 0
    shape = [32, 32] if large else [4, 4]
    chunks = [16, 32] if large else [4, 4]
    return shape, chunks


def array_entries(args, i):
    """Return (metadata_key, metadata_bytes, [(chunk_key, chunk_bytes)])."""
    name = 'layer_%06d.w' % i
    shape, chunks = array_values(args, i)
    grid = [shape[d] // chunks[d] for d in range(2)]
    per_chunk = chunks[0] * chunks[1]
    out = []
    for g0 in range(grid[0]):
        for g1 in range(grid[1]):
            vals = []
            for r in range(chunks[0]):
                for c in range(chunks[1]):
                    vals.append(float((g0 * chunks[0] + r) * shape[1] + g1 * chunks[1] + c + i))
            raw = struct.pack('<%df' % per_chunk, *vals)
            ck = ('c/%d/%d' % (g0, g1)) if args.zarr3 else ('%d.%d' % (g0, g1))
            out.append((name + '/' + ck, raw))
    if args.zarr3:
        meta = {"chunk_grid": {"configuration": {"chunk_shape": chunks}, "name": "regular"},
                "chunk_key_encoding": {"name": "default"},
                "codecs": [{"configuration": {"endian": "little"}, "name": "bytes"}],
                "data_type": "float32", "fill_value": 0.0, "node_type": "array",
                "shape": shape, "zarr_format": 3}
        mkey = name + '/zarr.json'
    else:
        meta = {"chunks": chunks, "compressor": None, "dimension_separator": ".", "dtype": "<f4",
                "fill_value": None, "filters": None, "order": "C", "shape": shape, "zarr_format": 2}
        mkey = name + '/.zarray'
    return name, shape, chunks, mkey, json.dumps(meta, separators=(',', ':')).encode(), out


def write_database(args, db_root, db_tag, kv, node_seed):
    """Write one OCDBT database (manifest.ocdbt + data files) at db_root.
    kv: sorted list of (key bytes, value bytes).  Returns (height, leaves)."""
    subdir = b'ocdbt.process_0/' if args.leaves_in_subdir else b''
    top = DataFile(db_root, b'd/' + file_id(node_seed, db_tag + 'top'))
    leaf_file = DataFile(db_root, subdir + b'd/' + file_id(node_seed, db_tag + 'leaf')) if subdir else top
    nvf = max(1, args.value_files)
    vfiles = [DataFile(db_root, subdir + b'd/' + file_id(node_seed, db_tag + 'v%d' % j)) for j in range(nvf)]
    # Out-of-line values: value file j gets values round-robin.  Within a leaf
    # the table lists the value files (relative to the leaf's transitive path).
    refs = []
    count_ool = 0
    for k, v in kv:
        if len(v) > MAX_INLINE:
            j = count_ool % nvf
            off = vfiles[j].append(v)
            refs.append((k, (j, off, len(v))))
            count_ool += 1
        else:
            refs.append((k, v))
    vtable = [(b'', vf.rel[len(subdir):]) for vf in vfiles]
    order = sorted(range(nvf), key=lambda j: vtable[j])
    remap = {old: new for new, old in enumerate(order)}
    vtable = [vtable[j] for j in order]
    refs = [(k, v if isinstance(v, bytes) else (remap[v[0]], v[1], v[2])) for k, v in refs]

    K = max(1, args.leaf_entries)
    level = []
    leaves = [refs[i:i + K] for i in range(0, len(refs), K)]
    single = len(leaves) == 1
    for ents in leaves:
        first, last = ents[0][0], ents[-1][0]
        prefix = b'' if single else first[:lcp(first, last)]
        used = any(not isinstance(v, bytes) for _, v in ents)
        blob = envelope(MAGIC_BTREE, encode_leaf(prefix, ents, vtable if used else []), args.compress)
        off = leaf_file.append(blob)
        level.append({'first': first, 'last': last, 'file': leaf_file, 'off': off, 'len': len(blob),
                      'keys': len(ents), 'tree_bytes': len(blob),
                      'indirect': sum(v[2] for _, v in ents if not isinstance(v, bytes))})
    height = 0
    M = args.interior_entries if args.interior_entries > 0 else len(level)
    while len(level) > 1:
        height += 1
        groups = [level[i:i + M] for i in range(0, len(level), M)]
        nxt = []
        for g in groups:
            first, last = g[0]['first'], g[-1]['last']
            is_root = len(groups) == 1
            prefix = b'' if is_root else first[:lcp(first, last)]
            # table: the child file seen from the top file's transitive path ("")
            f = g[0]['file']
            if f is leaf_file and subdir:
                table = [(subdir, f.rel[len(subdir):])]
            else:
                table = [(b'', f.rel)]
            kids = [dict(c, fid=0) for c in g]
            blob = envelope(MAGIC_BTREE, encode_interior(height, prefix, kids, table), args.compress)
            off = top.append(blob)
            nxt.append({'first': first, 'last': last, 'file': top, 'off': off, 'len': len(blob),
                        'keys': sum(c['keys'] for c in g),
                        'tree_bytes': len(blob) + sum(c['tree_bytes'] for c in g),
                        'indirect': sum(c['indirect'] for c in g)})
        level = nxt
    root = level[0]
    if root['file'] is leaf_file and subdir:
        mtable = [(subdir, root['file'].rel[len(subdir):])]
    else:
        mtable = [(b'', root['file'].rel)]

    uuid = hashlib.sha256(('uuid/%s/%s' % (node_seed, db_tag)).encode()).digest()[:16]
    body = bytearray(uuid)
    body += bytes([0])                       # manifest kind: single
    body += varint(MAX_INLINE)
    body += varint(100000000)                # max_decoded_node_bytes
    body += bytes([4])                       # version_tree_arity_log2
    if args.compress:
        body += varint(1) + struct.pack('<i', 0)
    else:
        body += varint(0)
    body += data_file_table(mtable)
    body += varint(1)                        # one version
    body += varint(1)                        # generation 1
    body += bytes([height])
    body += varint(0) + varint(root['off']) + varint(root['len'])
    body += varint(root['keys']) + varint(root['tree_bytes']) + varint(root['indirect'])
    body += struct.pack('<Q', 1700000000000000000)
    body += varint(0)                        # no version-tree nodes

    for vf in vfiles:
        if vf.buf:
            vf.write()
    if leaf_file is not top:
        leaf_file.write()
    if top.buf:
        top.write()
    os.makedirs(db_root, exist_ok=True)
    with open(os.path.join(db_root, 'manifest.ocdbt'), 'wb') as f:
        f.write(envelope(MAGIC_MANIFEST, bytes(body), args.compress))
    return height, len(leaves)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('out_dir')
    ap.add_argument('--arrays', type=int, required=True)
    ap.add_argument('--leaf-entries', type=int, default=256)
    ap.add_argument('--interior-entries', type=int, default=0)
    g = ap.add_mutually_exclusive_group()
    g.add_argument('--zarr3', action='store_true')
    g.add_argument('--zarr2', action='store_true')
    ap.add_argument('--large-every', type=int, default=0)
    ap.add_argument('--value-files', type=int, default=1)
    ap.add_argument('--leaves-in-subdir', action='store_true')
    ap.add_argument('--processes', type=int, default=0)
    ap.add_argument('--compress', action='store_true')
    ap.add_argument('--seed', default='ckptfs')
    ap.add_argument('--expect')
    args = ap.parse_args()
    if args.arrays < 1:
        ap.error('--arrays must be >= 1')
    if args.processes and args.leaves_in_subdir:
        ap.error('--processes and --leaves-in-subdir exclude each other')

    out = args.out_dir
    os.makedirs(out, exist_ok=True)
    tree = {}
    arrays = {}
    per_db = {}
    ool = []
    for i in range(args.arrays):
        name, shape, chunks, mkey, meta, chunk_kv = array_entries(args, i)
        top_key, leaf_key = name.split('.')
        tree[repr((top_key, leaf_key))] = {
            "key_metadata": [{"key": top_key, "key_type": 2}, {"key": leaf_key, "key_type": 2}],
            "value_metadata": {"value_type": "jax.Array", "skip_deserialize": False, "write_shape": shape},
        }
        arrays[name] = {"shape": shape, "chunks": chunks, "dtype": "float32", "offset": i,
                        "metadata_key": mkey, "chunk_keys": [k for k, _ in chunk_kv]}
        db = i % args.processes if args.processes else -1
        lst = per_db.setdefault(db, [])
        lst.append((mkey.encode(), meta))
        for k, v in chunk_kv:
            lst.append((k.encode(), v))
            if len(v) > MAX_INLINE:
                ool.append(k)
    with open(os.path.join(out, '_METADATA'), 'w') as f:
        json.dump({"tree_metadata": tree, "use_ocdbt": True, "use_zarr3": bool(args.zarr3),
                   "store_array_data_equal_to_fill_value": True, "custom_metadata": None}, f)
    heights = {}
    leaves = 0
    for db, kv in sorted(per_db.items()):
        kv.sort()
        root = out if db < 0 else os.path.join(out, 'ocdbt.process_%d' % db)
        h, nl = write_database(args, root, 'db%d' % db, kv, args.seed)
        heights[db] = h
        leaves += nl
    if args.expect:
        keys = sorted(k.decode() for kv in per_db.values() for k, _ in kv)
        doc = {"format": "zarr3" if args.zarr3 else "zarr2", "height": max(heights.values()),
               "leaves": leaves, "keys": keys, "out_of_line": sorted(ool), "arrays": arrays}
        if args.expect == '-':
            json.dump(doc, sys.stdout)
        else:
            with open(args.expect, 'w') as f:
                json.dump(doc, f)


if __name__ == '__main__':
    main()
