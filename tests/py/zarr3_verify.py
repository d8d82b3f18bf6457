#!/usr/bin/env python3
"""zarr3_verify.py - an independent checker of checkpoints written with
use_ocdbt=false, use_zarr3=true (what ckptfs' writer produces), written from
the zarr v3 core spec, the sharding_indexed / bytes / crc32c / zstd codec
specs and RFC 8878 (zstd frames), not from the C code.

    zarr3_verify.py [--no-restore-checks] DIR
                            DIR = a step folder (has _CHECKPOINT_METADATA)
                            or an item folder (has _METADATA)

prints a summary and exits 1 on any violation.  As a module:

    arrays, problems = verify(DIR)   # arrays: {(item, name): numpy array}
    arrays, problems = verify(DIR, restore_checks=True)

Restore checks (on by default on the command line; in verify() they follow
RESTORE_CHECKS) add what Orbax 0.12's restore needs beyond a valid layout:
a _sharding entry with a single-device or named sharding for every jax.Array
leaf (a restore without a target needs it), at least one leaf per item,
list indices 0..n-1 without gaps and no dict/list mix at one level, no
zero-size arrays and no dtype TensorStore cannot name (uint4), every step
subfolder named in item_handlers with a known handler, JSON items holding
their `metadata` file, no reserved item name (metrics as a pytree,
descriptor, AUTO), and a step name Orbax's step listing discovers.

bfloat16 comes back as uint16 bit patterns, 8-bit ml_dtypes and int4/int2
as uint8.  zstd frames are decoded with python3-zstandard when installed,
else with the `zstd` command-line tool.
"""

import json
import os
import re
import struct
import subprocess
import sys

import numpy as np

from crc32c_ref import crc32c  # noqa: F401 (V.crc32c for the tests)

try:
    import zstandard
except ImportError:  # fall back to the CLI
    zstandard = None

DTYPES = {
    "bool": (np.bool_, 1), "int8": (np.int8, 1), "uint8": (np.uint8, 1),
    "int16": ("<i2", 2), "uint16": ("<u2", 2), "int32": ("<i4", 4), "uint32": ("<u4", 4),
    "int64": ("<i8", 8), "uint64": ("<u8", 8), "float16": ("<f2", 2), "float32": ("<f4", 4),
    "float64": ("<f8", 8), "complex64": ("<c8", 8), "complex128": ("<c16", 16),
    "bfloat16": ("<u2", 2),
}
for _n in ("float8_e3m4", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e4m3b11fnuz", "float8_e5m2",
           "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn", "int4", "uint4", "int2"):
    DTYPES[_n] = (np.uint8, 1)

# TensorStore has no name for these (data_type.h has no uint4 / uint2):
# Orbax can neither save nor restore them.
NO_TENSORSTORE_NAME = {"uint4", "uint2"}

# Switch for verify() without an explicit restore_checks argument: on, so
# every test that verifies a written step also checks what Orbax's restore
# needs (the writer records a default sharding for every array).
RESTORE_CHECKS = True

PYTREE_HANDLERS = {
    "orbax.checkpoint._src.handlers.pytree_checkpoint_handler.PyTreeCheckpointHandler",
    "orbax.checkpoint._src.handlers.standard_checkpoint_handler.StandardCheckpointHandler",
}
JSON_HANDLER = "orbax.checkpoint._src.handlers.json_checkpoint_handler.JsonCheckpointHandler"
RESERVED_ITEMS = {"descriptor", "AUTO"}  # plus `metrics` unless it is a JSON item

EMPTY = 0xFFFFFFFFFFFFFFFF
KNOWN_MEMBERS = {"zarr_format", "node_type", "shape", "data_type", "chunk_grid", "chunk_key_encoding",
                 "fill_value", "codecs", "attributes", "dimension_names", "storage_transformers"}

# ---------------------------------------------------------------- zstd frames (RFC 8878)

def zstd_frame_info(buf):
    """(frame length in bytes, content size or None, has checksum) of the
    single zstd frame starting at buf[0]; raises ValueError when malformed."""
    if len(buf) < 6 or struct.unpack_from("<I", buf, 0)[0] != 0xFD2FB528:
        raise ValueError("not a zstd frame (bad magic)")
    fhd = buf[4]
    fcs_flag, single, checksum, dict_flag = fhd >> 6, (fhd >> 5) & 1, (fhd >> 2) & 1, fhd & 3
    if fhd & 0x08:
        raise ValueError("reserved bit set in the frame header")
    p = 5 + (0 if single else 1) + [0, 1, 2, 4][dict_flag]
    fcs_len = [1 if single else 0, 2, 4, 8][fcs_flag]
    content = None
    if fcs_len:
        content = int.from_bytes(buf[p:p + fcs_len], "little") + (256 if fcs_len == 2 else 0)
    p += fcs_len
    while True:
        if p + 3 > len(buf):
            raise ValueError("truncated block header")
        bh = int.from_bytes(buf[p:p + 3], "little")
        last, btype, bsize = bh & 1, (bh >> 1) & 3, bh >> 3
        p += 3
        if btype == 3:
            raise ValueError("reserved block type")
        p += 1 if btype == 1 else bsize
        if p > len(buf):
            raise ValueError("truncated block")
        if last:
            break
    if checksum:
        p += 4
        if p > len(buf):
            raise ValueError("truncated checksum")
    return p, content, bool(checksum)


def zstd_decompress(frame, size):
    if zstandard is not None:
        return zstandard.ZstdDecompressor().decompress(frame, max_output_size=size)
    r = subprocess.run(["zstd", "-d", "-c", "-q"], input=frame, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE)
    if r.returncode:
        raise ValueError("zstd: " + r.stderr.decode(errors="replace").strip())
    return r.stdout


# ---------------------------------------------------------------- checks

class Checker:
    def __init__(self):
        self.problems = []

    def fail(self, where, msg):
        self.problems.append(f"{where}: {msg}")

    def ok(self, cond, where, msg):
        if not cond:
            self.fail(where, msg)
        return cond


def load_json(path, ck):
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except (OSError, ValueError) as e:
        ck.fail(path, f"cannot read JSON: {e}")
        return None


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def check_ckpt_metadata(step, ck):
    path = os.path.join(step, "_CHECKPOINT_METADATA")
    m = load_json(path, ck)
    if m is None:
        return []
    ck.ok(isinstance(m, dict), path, "not an object")
    if not isinstance(m, dict):
        return []
    for k in ("item_handlers", "metrics", "performance_metrics", "init_timestamp_nsecs",
              "commit_timestamp_nsecs", "custom_metadata"):
        ck.ok(k in m, path, f"missing {k}")
    ih = m.get("item_handlers")
    ck.ok(isinstance(ih, dict) and all(isinstance(v, str) for v in ih.values()), path,
          "item_handlers is not an object of strings")
    ck.ok(isinstance(m.get("metrics"), dict), path, "metrics is not an object")
    pm = m.get("performance_metrics")
    ck.ok(isinstance(pm, dict) and all(isinstance(v, float) for v in pm.values()), path,
          "performance_metrics is not an object of floats")
    ck.ok(is_int(m.get("init_timestamp_nsecs")) and is_int(m.get("commit_timestamp_nsecs")), path,
          "timestamps are not integers")
    if is_int(m.get("init_timestamp_nsecs")) and is_int(m.get("commit_timestamp_nsecs")):
        ck.ok(m["init_timestamp_nsecs"] <= m["commit_timestamp_nsecs"], path, "commit before init")
    ck.ok(isinstance(m.get("custom_metadata"), dict), path, "custom_metadata is not an object")
    check_commit_success(step, ck)
    return sorted(ih) if isinstance(ih, dict) else []


def check_commit_success(d, ck):
    path = os.path.join(d, "commit_success.txt")
    try:
        with open(path, "rb") as f:
            txt = f.read().decode()
    except (OSError, UnicodeDecodeError) as e:
        ck.fail(path, f"cannot read: {e}")
        return
    pre = "Checkpoint commit was successful to "
    ck.ok(txt.startswith(pre), path, f"unexpected content {txt!r}")
    if txt.startswith(pre):
        ck.ok(os.path.basename(txt[len(pre):].rstrip("/")) == os.path.basename(os.path.abspath(d)), path,
              f"names another folder: {txt!r}")


def check_fill(dtype, fv, where, ck):
    if dtype == "bool":
        ck.ok(fv is False, where, f"fill_value {fv!r} is not false")
    elif dtype.startswith(("complex",)):
        ck.ok(isinstance(fv, list) and len(fv) == 2 and all(v == 0 for v in fv), where,
              f"fill_value {fv!r} is not [0, 0]")
    else:
        ck.ok(isinstance(fv, (int, float)) and not isinstance(fv, bool) and fv == 0, where,
              f"fill_value {fv!r} is not 0")


def codec_conf(c):
    return c.get("configuration", {}) if isinstance(c, dict) else {}


def check_zarr_json(path, ck):
    """Validate one zarr.json; returns a dict with shape/dtype/shard/inner or None."""
    z = load_json(path, ck)
    if not isinstance(z, dict):
        return None
    bad = len(ck.problems)
    for k in z:
        if k not in KNOWN_MEMBERS:
            mu = z[k].get("must_understand", True) if isinstance(z[k], dict) else True
            ck.ok(not mu, path, f"unknown member {k}")
    ck.ok(z.get("zarr_format") == 3, path, "zarr_format is not 3")
    ck.ok(z.get("node_type") == "array", path, "node_type is not array")
    shape = z.get("shape")
    ck.ok(isinstance(shape, list) and all(is_int(s) and s >= 0 for s in shape), path, "bad shape")
    dtype = z.get("data_type")
    ck.ok(dtype in DTYPES, path, f"unknown data_type {dtype!r}")
    cg = z.get("chunk_grid", {})
    ck.ok(cg.get("name") == "regular", path, "chunk_grid is not regular")
    shard = codec_conf(cg).get("chunk_shape")
    if isinstance(shape, list):
        ck.ok(isinstance(shard, list) and len(shard) == len(shape) and all(is_int(s) and s >= 1 for s in shard),
              path, "bad chunk_grid chunk_shape")
    cke = z.get("chunk_key_encoding", {})
    ck.ok(cke.get("name") == "default", path, "chunk_key_encoding is not default")
    ck.ok(codec_conf(cke).get("separator", "/") == "/", path, "separator is not /")
    if dtype in DTYPES:
        check_fill(dtype, z.get("fill_value"), path, ck)
    codecs = z.get("codecs")
    inner = None
    if ck.ok(isinstance(codecs, list) and len(codecs) == 1 and codecs[0].get("name") == "sharding_indexed",
             path, "codecs is not [sharding_indexed]"):
        sc = codec_conf(codecs[0])
        inner = sc.get("chunk_shape")
        if ck.ok(isinstance(inner, list) and isinstance(shard, list) and len(inner) == len(shard)
                 and all(is_int(i) and i >= 1 for i in inner), path, "bad inner chunk_shape"):
            ck.ok(all(s % i == 0 for s, i in zip(shard, inner)), path,
                  "shard shape is not a multiple of the inner chunk shape")
        ic = sc.get("codecs")
        if ck.ok(isinstance(ic, list) and len(ic) == 2, path, "inner codecs are not [bytes, zstd]"):
            ck.ok(ic[0].get("name") == "bytes", path, "first inner codec is not bytes")
            end = codec_conf(ic[0]).get("endian")
            if dtype in DTYPES and DTYPES[dtype][1] > 1:
                ck.ok(end == "little", path, "bytes codec of a multi-byte type is not little-endian")
            else:
                ck.ok(end in (None, "little", "big"), path, "bad endian")
            ck.ok(ic[1].get("name") == "zstd", path, "second inner codec is not zstd")
            zc = codec_conf(ic[1])
            ck.ok(is_int(zc.get("level", 0)) and -131072 <= zc.get("level", 0) <= 22, path, "bad zstd level")
            ck.ok(isinstance(zc.get("checksum", False), bool), path, "zstd checksum is not a boolean")
        ix = sc.get("index_codecs")
        ck.ok(isinstance(ix, list) and len(ix) == 2 and ix[0].get("name") == "bytes"
              and codec_conf(ix[0]).get("endian") == "little" and ix[1].get("name") == "crc32c",
              path, "index_codecs are not [bytes little, crc32c]")
        ck.ok(sc.get("index_location", "end") == "end", path, "index_location is not end")
    if len(ck.problems) != bad:
        return None
    zc = codec_conf(codecs[0]["configuration"]["codecs"][1])
    return {"shape": shape, "dtype": dtype, "shard": shard, "inner": inner,
            "checksum": zc.get("checksum", False)}


def grid_iter(dims):
    """C-order multi-indices of a grid."""
    if not dims:
        yield ()
        return
    if any(d == 0 for d in dims):
        return
    idx = [0] * len(dims)
    while True:
        yield tuple(idx)
        k = len(dims) - 1
        while k >= 0:
            idx[k] += 1
            if idx[k] < dims[k]:
                break
            idx[k] = 0
            k -= 1
        if k < 0:
            return


def read_array(adir, meta, ck):
    shape, shard, inner = meta["shape"], meta["shard"], meta["inner"]
    npdt, isz = DTYPES[meta["dtype"]]
    out = np.zeros(shape, dtype=npdt)
    rank = len(shape)
    nsh = [-(-s // c) for s, c in zip(shape, shard)]
    per = [s // i for s, i in zip(shard, inner)]
    n_in = int(np.prod(per)) if rank else 1
    inner_bytes = int(np.prod(inner)) * isz if rank else isz
    covered = np.zeros(shape, dtype=bool)
    for sg in grid_iter(nsh):
        key = "c" + "".join(f"/{g}" for g in sg)
        path = os.path.join(adir, key)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            ck.fail(path, f"shard missing: {e}")
            continue
        isize = 16 * n_in + 4
        if not ck.ok(len(data) >= isize, path, f"{len(data)} bytes, smaller than its index ({isize})"):
            continue
        index = data[len(data) - isize:]
        if not ck.ok(crc32c(index[:-4]) == struct.unpack_from("<I", index, 16 * n_in)[0], path,
                     "index CRC-32C mismatch"):
            continue
        limit = len(data) - isize
        extents = []
        for e, lg in enumerate(grid_iter(per)):
            off, n = struct.unpack_from("<QQ", index, 16 * e)
            origin = [sg[d] * shard[d] + lg[d] * inner[d] for d in range(rank)]
            inside = all(origin[d] < shape[d] for d in range(rank))
            where = f"{path} inner chunk {lg}"
            if off == EMPTY and n == EMPTY:
                ck.ok(not inside, where, "missing (Orbax restores with fill_missing_data_reads=false)")
                continue
            if not ck.ok(off != EMPTY and n != EMPTY and off + n <= limit, where,
                         f"extent ({off}, {n}) outside the data area ({limit} bytes)"):
                continue
            extents.append((off, off + n, where))
            frame = data[off:off + n]
            try:
                flen, content, has_ck = zstd_frame_info(frame)
            except ValueError as ex:
                ck.fail(where, str(ex))
                continue
            ck.ok(flen == n, where, f"frame is {flen} bytes, the index says {n}")
            ck.ok(content in (None, inner_bytes), where, f"frame content size {content} != {inner_bytes}")
            if meta["checksum"]:
                ck.ok(has_ck, where, "zarr.json says checksum but the frame has none")
            try:
                raw = zstd_decompress(frame, inner_bytes)
            except Exception as ex:  # zstandard.ZstdError or ValueError
                ck.fail(where, f"does not decode: {ex}")
                continue
            if not ck.ok(len(raw) == inner_bytes, where, f"decodes to {len(raw)} bytes, not {inner_bytes}"):
                continue
            chunk = np.frombuffer(raw, dtype=npdt).reshape(inner)
            if not inside:
                continue
            sl = tuple(slice(origin[d], min(origin[d] + inner[d], shape[d])) for d in range(rank))
            part = tuple(slice(0, s.stop - s.start) for s in sl)
            out[sl] = chunk[part]
            covered[sl] = True
            # Padding of edge chunks must be the fill value (0).
            pad = np.ones(inner, dtype=bool)
            pad[part] = False
            if pad.any():
                ck.ok(not np.any(chunk.view(np.uint8).reshape(inner + [isz])[pad]), where,
                      "edge-chunk padding is not zero")
        extents.sort()
        for (a0, a1, w0), (b0, b1, w1) in zip(extents, extents[1:]):
            ck.ok(a1 <= b0, w1, f"overlaps {w0}")
    ck.ok(bool(covered.all()) if covered.size else True, adir, "some elements are in no stored chunk")
    return out


def py_key(keys):
    return str(tuple(str(k) for k in keys))


def check_item(item_dir, ck, item_name=None, restore=False):
    arrays = {}
    item = item_name or os.path.basename(os.path.abspath(item_dir))
    path = os.path.join(item_dir, "_METADATA")
    m = load_json(path, ck)
    if not isinstance(m, dict):
        return arrays
    ck.ok(m.get("use_ocdbt") is False, path, "use_ocdbt is not false")
    ck.ok(m.get("use_zarr3") is True, path, "use_zarr3 is not true")
    ck.ok(m.get("store_array_data_equal_to_fill_value") is True, path,
          "store_array_data_equal_to_fill_value is not true")
    ck.ok("custom_metadata" in m, path, "custom_metadata missing")
    tm = m.get("tree_metadata")
    if not ck.ok(isinstance(tm, dict), path, "tree_metadata is not an object"):
        return arrays
    names = set()
    array_names = []
    key_paths = []
    if restore:
        ck.ok(len(tm) > 0, path, "item has no leaves (Orbax cannot rebuild an empty tree)")
    for key, ent in tm.items():
        where = f"{path} [{key}]"
        km = ent.get("key_metadata") if isinstance(ent, dict) else None
        if not ck.ok(isinstance(km, list) and km, where, "key_metadata is not a non-empty list"):
            continue
        keys = []
        for k in km:
            ck.ok(isinstance(k, dict) and isinstance(k.get("key"), str) and k.get("key_type") in (1, 2), where,
                  f"bad key entry {k!r}")
            if isinstance(k, dict):
                keys.append(k.get("key"))
                if k.get("key_type") == 1:
                    ck.ok(str(k.get("key")).isdigit(), where, "sequence key is not an index")
        ck.ok(key == py_key(keys), where, f"dict key is not str(tuple(keys)) = {py_key(keys)!r}")
        vm = ent.get("value_metadata", {})
        ck.ok(vm.get("value_type") in ("jax.Array", "np.ndarray", "scalar"), where,
              f"value_type {vm.get('value_type')!r}")
        ck.ok(vm.get("skip_deserialize") is False, where, "skip_deserialize is not false")
        name = ".".join(str(k) for k in keys)
        if not ck.ok(name not in names, where, f"two leaves named {name}"):
            continue
        names.add(name)
        key_paths.append([(k.get("key"), k.get("key_type")) for k in km if isinstance(k, dict)])
        if vm.get("value_type") == "jax.Array":
            array_names.append(name)
        adir = os.path.join(item_dir, name)
        meta = check_zarr_json(os.path.join(adir, "zarr.json"), ck)
        if meta is None:
            continue
        ws = vm.get("write_shape")
        if ws is not None:
            ck.ok(isinstance(ws, list) and len(ws) == len(meta["shape"]), where, "write_shape has the wrong rank")
        if restore:
            ck.ok(meta["dtype"] not in NO_TENSORSTORE_NAME, where,
                  f"data_type {meta['dtype']} has no TensorStore name (Orbax cannot restore it)")
            ck.ok(all(s > 0 for s in meta["shape"]), where,
                  f"zero-size array {meta['shape']} (Orbax refuses to save or restore it)")
        arrays[(item, name)] = read_array(adir, meta, ck)
    # Leaf order must be JAX's flatten order (sorted dict keys, list indices).
    def sort_key(ent):
        return [(0, int(k["key"]), "") if k.get("key_type") == 1 else (1, 0, k.get("key", ""))
                for k in ent.get("key_metadata", []) if isinstance(k, dict)]
    ents = [e for e in tm.values() if isinstance(e, dict)]
    ck.ok(ents == sorted(ents, key=sort_key), path, "leaves are not in flatten order")
    if restore:
        check_tree_shape(key_paths, path, ck)
    sh_path = os.path.join(item_dir, "_sharding")
    sharded = {}
    if restore and array_names:
        ck.ok(os.path.exists(sh_path), sh_path,
              "missing: a restore without a target has no sharding for any jax.Array")
    if os.path.exists(sh_path):
        import base64
        sh = load_json(sh_path, ck)
        if ck.ok(isinstance(sh, dict), sh_path, "not an object"):
            for k, v in sh.items():
                try:
                    pname = base64.urlsafe_b64decode(k.encode()).decode()
                except ValueError:
                    ck.fail(sh_path, f"key {k!r} is not base64url")
                    continue
                ck.ok(pname in names, sh_path, f"{pname!r} is not an array of the item")
                ck.ok(isinstance(v, str), sh_path, f"value for {pname} is not a string")
                if isinstance(v, str):
                    try:
                        sharded[pname] = json.loads(v)
                    except ValueError:
                        ck.fail(sh_path, f"value for {pname} is not JSON text")
    if restore and os.path.exists(sh_path):
        for name in array_names:
            if ck.ok(name in sharded, sh_path, f"no sharding entry for jax.Array {name!r}"):
                check_sharding(sharded[name], f"{sh_path} [{name}]", ck)
    return arrays


def check_sharding(s, where, ck):
    """One _sharding value as Orbax's sharding.py parses it."""
    if not ck.ok(isinstance(s, dict), where, "sharding is not an object"):
        return
    t = s.get("sharding_type")
    if t == "SingleDeviceSharding":
        ck.ok(isinstance(s.get("device_str"), str), where, "SingleDeviceSharding without device_str")
    elif t == "NamedSharding":
        shape, axes, spec = s.get("shape"), s.get("axis_names"), s.get("partition_spec")
        ck.ok(isinstance(shape, list) and all(is_int(x) and x >= 1 for x in shape), where, "bad mesh shape")
        ck.ok(isinstance(axes, list) and isinstance(shape, list) and len(axes) == len(shape)
              and all(isinstance(a, str) for a in axes), where, "axis_names do not match the mesh shape")
        ck.ok(isinstance(spec, list), where, "partition_spec is not a list")
        mesh = s.get("device_mesh")
        if mesh is not None:
            ck.ok(isinstance(mesh, dict) and "mesh" in mesh, where, "device_mesh has no mesh")
    else:
        ck.fail(where, f"sharding_type {t!r} (Orbax restores NamedSharding or SingleDeviceSharding only)")


def check_tree_shape(key_paths, where, ck):
    """Orbax rebuilds the tree level by level: the item's top level must be
    dict keys, a node is either a dict or a list, and a list's indices are
    exactly 0..n-1 (tree/utils.py asserts on a gap)."""
    kids = {}
    for kp in key_paths:
        for depth, (k, kt) in enumerate(kp):
            kids.setdefault(tuple(x[0] for x in kp[:depth]), set()).add((k, kt))
    for parent, ks in sorted(kids.items(), key=lambda x: (len(x[0]), x[0])):
        label = "/".join(parent) or "(top level)"
        types = {kt for _, kt in ks}
        if not parent:
            ck.ok(types == {2}, where, "the top level of an item must be dict keys")
            continue
        if not ck.ok(len(types) == 1, where, f"{label} mixes dict keys and list indices"):
            continue
        if types == {1}:
            idx = sorted(int(k) for k, _ in ks if str(k).isdigit())
            ck.ok(idx == list(range(len(ks))), where,
                  f"list {label} has indices {idx}, not 0..{len(ks) - 1} (a gap: Orbax's tree rebuild asserts)")


# Orbax's step listing: [prefix_]digits (zero-padded with step_format_fixed_length).
STEP_NAME = re.compile(r"(?:.+_)?[0-9]+")


def item_handlers(step):
    try:
        with open(os.path.join(step, "_CHECKPOINT_METADATA"), "rb") as f:
            ih = json.loads(f.read()).get("item_handlers")
    except (OSError, ValueError, AttributeError):
        return {}
    return ih if isinstance(ih, dict) else {}


def check_json_item(idir, ck):
    """A JsonCheckpointHandler item: one file `metadata` holding JSON."""
    path = os.path.join(idir, "metadata")
    if ck.ok(os.path.isfile(path), path, "JSON item without its `metadata` file"):
        load_json(path, ck)


def verify(d, restore_checks=None):
    """Check a step or item folder; returns (arrays, problems).
    restore_checks: None = RESTORE_CHECKS."""
    restore = RESTORE_CHECKS if restore_checks is None else restore_checks
    ck = Checker()
    arrays = {}
    if os.path.exists(os.path.join(d, "_CHECKPOINT_METADATA")) and not os.path.exists(os.path.join(d, "_METADATA")):
        items = check_ckpt_metadata(d, ck)
        handlers = item_handlers(d)
        base = os.path.basename(os.path.abspath(d))
        ck.ok(".orbax-checkpoint-tmp" not in base, d, "a tmp folder is not a step")
        if restore:
            ck.ok(STEP_NAME.fullmatch(base) is not None, d,
                  f"step name {base!r} is not found by Orbax's step listing ([prefix_]digits)")
            for sub in sorted(os.listdir(d)):
                if os.path.isdir(os.path.join(d, sub)):
                    ck.ok(sub in handlers, os.path.join(d, sub),
                          "step subfolder not named in item_handlers (Orbax's restore raises on it)")
        for it in items:
            idir = os.path.join(d, it)
            h = handlers.get(it)
            if restore:
                ck.ok(h in PYTREE_HANDLERS or h == JSON_HANDLER, idir, f"unknown item handler {h!r}")
                ck.ok(it not in RESERVED_ITEMS and not (it == "metrics" and h != JSON_HANDLER), idir,
                      f"reserved item name {it!r}")
            if ck.ok(os.path.isdir(idir), idir, "item named in item_handlers has no folder"):
                check_commit_success(idir, ck)
                if h == JSON_HANDLER:
                    check_json_item(idir, ck)
                else:
                    arrays.update(check_item(idir, ck, it, restore))
    else:
        arrays.update(check_item(d, ck, None, restore))
    return arrays, ck.problems


def main(argv):
    args = argv[1:]
    restore = True
    if args and args[0] == "--no-restore-checks":
        restore = False
        args = args[1:]
    if len(args) != 1:
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    arrays, problems = verify(args[0], restore_checks=restore)
    for (item, name), a in sorted(arrays.items()):
        print(f"{item}/{name}: {a.dtype} {list(a.shape)}")
    print(f"{len(arrays)} arrays, {len(problems)} problems"
          f" (zstd via {'python3-zstandard' if zstandard else 'zstd CLI'})")
    for p in problems:
        print("VIOLATION:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
