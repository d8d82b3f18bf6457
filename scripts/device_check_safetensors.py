#!/usr/bin/env python3
"""Check a safetensors file served by ckptfs with the real consumers:
`safetensors.safe_open(path, "pt")` and `safetensors.torch.load_file`.

Run it on a machine that has torch and safetensors installed, against a
mounted view, for example:

    scripts/device_check_safetensors.py MNT/params.safetensors \\
        FIXTURES/expected --fixture FIXTURES/params.safetensors

Every tensor is loaded twice (safe_open + get_tensor, and load_file) and
compared with the expected/ folder (expected.json + one raw C-order .bin per
array): dtype, shape and the exact bytes.  bf16 (and any other dtype numpy
lacks) is compared as raw bit patterns, bf16 additionally through
.view(torch.int16).  Tensor names are looked up in expected.json as they
are, then with the file's stem as prefix ("embed.embedding" in
params.safetensors -> "params.embed.embedding").

PATH may also be a model.safetensors.index.json: then every shard it names
is checked, and the index's weight_map / total_size against the shards.

With --source DIR, the script mounts DIR itself with the self-contained
ckptfs (--ckptfs, default $CKPTFS, else the newest bundle under
build*/bundle/; scripts/device_run.sh unpacks one) and PATH is taken
inside that mount, e.g.

    scripts/device_check_safetensors.py --source FIXTURES/pytree_zarr3 \\
        params.safetensors FIXTURES/expected --fixture FIXTURES/params.safetensors

--dry-run (no torch needed) only reads the view's header through the mount
and checks its tensor names, dtypes and shapes against expected.json.

With --fixture, the view is also compared tensor by tensor with the
safetensors file shipped with the fixtures (same names, dtypes, shapes,
bytes).  With --device cuda, tensors are also loaded onto the GPU
(safe_open(..., device=) and load_file(..., device=)) and copied back.

Prints one line per check and a final "N passed, M failed" line; exit
status 1 when anything failed, 2 when torch/safetensors are missing.
"""

import argparse
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import device_common as D  # noqa: E402

# torch dtype name (str(dtype) without "torch.") -> TensorStore name used in
# expected.json, where they differ.
TORCH_TO_TS = {"bool": "bool", "half": "float16", "float": "float32", "double": "float64"}


class Tally:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def ok(self, msg):
        self.passed += 1
        print(f"PASS {msg}")

    def fail(self, msg):
        self.failed += 1
        print(f"FAIL {msg}")

    def check(self, cond, msg, why=""):
        if cond:
            self.ok(msg)
        else:
            self.fail(f"{msg}: {why}" if why else msg)
        return cond


def ts_name(dtype):
    name = str(dtype).replace("torch.", "")
    return TORCH_TO_TS.get(name, name)


def raw_bytes(torch, t):
    """The tensor's C-order little-endian bytes."""
    t = t.detach().to("cpu").contiguous().reshape(-1)
    try:
        return t.view(torch.uint8).numpy().tobytes()
    except (RuntimeError, TypeError):
        return t.numpy().tobytes()


def load_expected(folder):
    with open(os.path.join(folder, "expected.json"), encoding="utf-8") as f:
        exp = json.load(f)
    return exp


def expected_key(name, stem, exp):
    if name in exp:
        return name
    if stem and f"{stem}.{name}" in exp:
        return f"{stem}.{name}"
    return None


def compare(torch, tally, label, t, exp_entry, ref):
    """Compare one loaded tensor with its expected entry and bytes."""
    problems = []
    if ts_name(t.dtype) != exp_entry["dtype"]:
        problems.append(f"dtype {ts_name(t.dtype)} != {exp_entry['dtype']}")
    if list(t.shape) != list(exp_entry["shape"]):
        problems.append(f"shape {list(t.shape)} != {exp_entry['shape']}")
    got = raw_bytes(torch, t)
    if got != ref:
        diff = next((i for i, (a, b) in enumerate(zip(got, ref)) if a != b), min(len(got), len(ref)))
        problems.append(f"bytes differ ({len(got)} vs {len(ref)} bytes, first at byte {diff})")
    if t.dtype == torch.bfloat16 and not problems:
        import numpy as np

        want = torch.from_numpy(np.frombuffer(ref, dtype="<i2").copy()).reshape(t.shape)
        if not torch.equal(t.detach().to("cpu").view(torch.int16), want):
            problems.append("bf16 bit patterns differ (view(torch.int16))")
    tally.check(
        not problems,
        f"{label} {ts_name(t.dtype)} {list(t.shape)}",
        "; ".join(problems),
    )


def check_file(args, torch, safe_open, load_file, tally, path, exp, seen):
    stem = os.path.basename(path)
    if stem.endswith(".safetensors"):
        stem = stem[: -len(".safetensors")]
    refs = {}

    def ref_for(name):
        key = expected_key(name, stem, exp)
        if key is None:
            return None, None
        if key not in refs:
            with open(os.path.join(args.expected, exp[key]["file"]), "rb") as f:
                refs[key] = f.read()
        return key, refs[key]

    # 1. safe_open + get_tensor, one tensor at a time
    try:
        with safe_open(path, framework="pt") as f:
            meta = f.metadata()
            names = list(f.keys())
            tally.ok(f"{path}: safe_open: {len(names)} tensors, metadata {meta}")
            if not meta or meta.get("format") != "pt":
                print(f"NOTE {path}: __metadata__ has no format=pt (transformers may refuse it)")
            for name in names:
                key, ref = ref_for(name)
                if key is None:
                    tally.fail(f"{path}: {name}: not in expected.json")
                    continue
                seen.add(key)
                compare(torch, tally, f"{path}: safe_open {name}", f.get_tensor(name), exp[key], ref)
    except Exception as e:  # the point is to report any loader failure
        tally.fail(f"{path}: safe_open raised {type(e).__name__}: {e}")
        return None

    # 2. load_file, the whole file at once
    try:
        loaded = load_file(path)
    except Exception as e:
        tally.fail(f"{path}: load_file raised {type(e).__name__}: {e}")
        return None
    tally.check(sorted(loaded) == sorted(names), f"{path}: load_file has the same {len(names)} names")
    for name, t in sorted(loaded.items()):
        key, ref = ref_for(name)
        if key is None:
            tally.fail(f"{path}: {name}: not in expected.json")
            continue
        compare(torch, tally, f"{path}: load_file {name}", t, exp[key], ref)

    # 3. optionally through the GPU
    if args.device != "cpu":
        try:
            with safe_open(path, framework="pt", device=args.device) as f:
                for name in f.keys():
                    key, ref = ref_for(name)
                    if key is not None:
                        compare(torch, tally, f"{path}: safe_open[{args.device}] {name}",
                                f.get_tensor(name), exp[key], ref)
            on_dev = load_file(path, device=args.device)
            for name, t in sorted(on_dev.items()):
                key, ref = ref_for(name)
                if key is not None:
                    tally.check(str(t.device).startswith(args.device.split(":")[0]),
                                f"{path}: load_file[{args.device}] {name} on {t.device}")
                    compare(torch, tally, f"{path}: load_file[{args.device}] {name}", t, exp[key], ref)
        except Exception as e:
            tally.fail(f"{path}: loading onto {args.device} raised {type(e).__name__}: {e}")
    return loaded


def check_fixture(torch, load_file, tally, view, fixture_path):
    """Tensor-by-tensor comparison with the shipped safetensors file."""
    try:
        ref = load_file(fixture_path)
    except Exception as e:
        tally.fail(f"fixture {fixture_path}: load_file raised {type(e).__name__}: {e}")
        return
    vnames, rnames = set(view), set(ref)
    if vnames != rnames:
        # the view may use names relative to its directory
        stem = os.path.basename(fixture_path).replace(".safetensors", "")
        alt = {f"{stem}.{n}": n for n in vnames}
        if set(alt) == rnames:
            view = {k: view[v] for k, v in alt.items()}
            vnames = rnames
    tally.check(rnames <= vnames, f"fixture: all {len(rnames)} fixture tensors are in the view",
                f"missing from the view: {sorted(rnames - vnames)}")
    for name in sorted(vnames - rnames):
        print(f"NOTE fixture: {name} is in the view only")
    for name in sorted(vnames & rnames):
        a, b = view[name], ref[name]
        same = a.dtype == b.dtype and a.shape == b.shape and raw_bytes(torch, a) == raw_bytes(torch, b)
        tally.check(same, f"fixture: {name} {ts_name(b.dtype)} {list(b.shape)}",
                    f"view {a.dtype} {list(a.shape)} differs")


ST_TO_TS = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16", "U32": "uint32",
            "I32": "int32", "U64": "uint64", "I64": "int64", "F16": "float16", "BF16": "bfloat16",
            "F32": "float32", "F64": "float64"}


def dry_check(tally, path, exp):
    """Header only (no torch): every tensor is in expected.json with its
    dtype and shape."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    stem = os.path.basename(path).split(".")[0]
    names = [k for k in header if k != "__metadata__"]
    tally.check(bool(names), f"{path}: {len(names)} tensors in the header, metadata {header.get('__metadata__')}")
    for name in names:
        key = expected_key(name, stem, exp)
        if key is None:
            tally.fail(f"{path}: {name}: not in expected.json")
            continue
        e, h = exp[key], header[name]
        tally.check(ST_TO_TS.get(h["dtype"], h["dtype"]) == e["dtype"] and list(h["shape"]) == list(e["shape"]),
                    f"{path}: header {name} {h['dtype']} {h['shape']}", f"expected {e['dtype']} {e['shape']}")


def main(argv=None):
    args = parse_args(argv)
    D.exit_on_sigterm()
    if not args.source:
        return run(args)
    binary = D.announce_ckptfs(args.ckptfs)
    if binary is None:
        return 1
    with D.Mount(binary, args.source, opts=["ro"]) as m:
        args.path = m.p(args.path)
        rc = run(args)
    if rc == 0:
        os.unlink(m.log_path)
    else:
        print(f"ckptfs log: {m.log_path}")
    return rc


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", help="a .safetensors file (e.g. MNT/params.safetensors) or a .index.json")
    ap.add_argument("expected", help="the fixtures' expected/ folder (expected.json + *.bin)")
    ap.add_argument("--fixture", help="the shipped params.safetensors to compare with tensor by tensor")
    ap.add_argument("--device", default="cpu", help="also load onto this device, e.g. cuda or cuda:0")
    ap.add_argument("--require-all", action="store_true",
                    help="fail when an expected.json array with the file's prefix is missing")
    ap.add_argument("--source", help="mount this checkpoint folder (read-only) and take PATH inside the mount")
    ap.add_argument("--ckptfs", help="ckptfs binary for --source (default: $CKPTFS, else the newest bundle)")
    ap.add_argument("--dry-run", action="store_true", help="header checks only, without torch")
    return ap.parse_args(argv)


def run(args):
    if args.dry_run:
        tally = Tally()
        dry_check(tally, args.path, load_expected(args.expected))
        print(f"{tally.passed} passed, {tally.failed} failed (dry run: header only)")
        return 1 if tally.failed else 0
    try:
        import torch
        from safetensors import safe_open
        from safetensors.torch import load_file
    except ImportError as e:
        print(f"torch and safetensors are needed: {e}")
        return 2
    print(f"torch {torch.__version__}, safetensors {__import__('safetensors').__version__}")
    if args.device != "cpu" and args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"device {args.device} requested but torch.cuda.is_available() is False")
        return 2

    tally = Tally()
    exp = load_expected(args.expected)
    seen = set()
    loaded_all = {}
    if args.path.endswith(".json"):
        with open(args.path, encoding="utf-8") as f:
            index = json.load(f)
        folder = os.path.dirname(args.path)
        wm = index.get("weight_map", {})
        shards = sorted(set(wm.values()))
        tally.check(bool(shards), f"{args.path}: {len(wm)} tensors in {len(shards)} shards")
        total = 0
        for shard in shards:
            spath = os.path.join(folder, shard)
            loaded = check_file(args, torch, safe_open, load_file, tally, spath, exp, seen)
            if loaded is None:
                continue
            want = sorted(n for n, s in wm.items() if s == shard)
            tally.check(sorted(loaded) == want, f"{spath}: holds exactly its weight_map entries")
            total += sum(len(raw_bytes(torch, t)) for t in loaded.values())
            loaded_all.update(loaded)
        ts = index.get("metadata", {}).get("total_size")
        tally.check(ts == total, f"{args.path}: total_size {ts} == sum of tensor bytes {total}")
    else:
        loaded = check_file(args, torch, safe_open, load_file, tally, args.path, exp, seen)
        loaded_all = loaded or {}

    stem = os.path.basename(args.path).split(".")[0]
    missing = sorted(k for k in exp if k not in seen and (k.startswith(stem + ".") or args.path.endswith(".json")))
    for k in missing:
        if args.require_all:
            tally.fail(f"{k}: expected array missing from the view")
        else:
            print(f"NOTE {k}: in expected.json, not in the view")

    if args.fixture:
        check_fixture(torch, load_file, tally, loaded_all, args.fixture)

    print(f"{tally.passed} passed, {tally.failed} failed")
    return 1 if tally.failed else 0


if __name__ == "__main__":
    sys.exit(main())
