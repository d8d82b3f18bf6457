#!/usr/bin/env python3
"""An independent safetensors parser and validator, written from the public
format description (the "Format" section of huggingface/safetensors' README:
8-byte little-endian header length N, N bytes of JSON header, then the data)
and NOT from ckptfs' C code, so that the tests
can check the daemon's safetensors view against the format itself.

It applies every check of the reference reader (huggingface/safetensors,
SafeTensors::read_metadata + Metadata::validate), each failure raised as
SpecError with the reference's error name in `.code`:

  HeaderTooSmall            file shorter than 8 bytes
  HeaderTooLarge            N > 100,000,000
  InvalidHeaderLength       8 + N > file length
  InvalidHeader             header bytes are not UTF-8
  InvalidHeaderDeserialization
                            not JSON of the expected shape: top level not an
                            object, a tensor entry without dtype/shape/
                            data_offsets, an unknown dtype code, a shape or
                            offset that is not a non-negative integer below
                            2**64, __metadata__ not a flat string->string map
  InvalidOffset             (in data_offsets order) a tensor that does not
                            start where the previous one ended (0 for the
                            first): a hole or an overlap; or END < BEGIN
  ValidationOverflow        prod(shape) * bits overflows 64 bits
  MisalignedSlice           prod(shape) * bits not a multiple of 8
  TensorInvalidInfo         END - BEGIN != prod(shape) * bits / 8
  MetadataIncompleteBuffer  the last END + 8 + N != file length (trailing
                            bytes, or data missing)

With strict=True (the default) it also enforces what the README demands but
the reference reader lets pass; ckptfs must meet these too:

  InvalidHeaderStart        the header does not begin with '{'
  DuplicateKey              a key appears twice in an object
  UnknownField              a tensor entry has fields beyond the three
                            (the JSON schema's additionalProperties: false)

`writer_deviations()` lists where a file differs from the reference
writer's conventions (N % 8 == 0, space padding, __metadata__ first,
order by dtype alignment descending then name) - not errors of the format,
but ckptfs promises them.

Module use:
    from st_spec import load
    tensors, metadata = load(path)     # {name: (dtype, shape, bytes)}, dict|None
CLI:
    st_spec.py FILE [--lenient] [--writer] [--no-data]
prints a summary; exit status 1 on a violation.
"""

import argparse
import json
import os
import sys

MAX_HEADER = 100_000_000
U64 = 1 << 64

# Dtype codes and their sizes in bits, in the order of the reference Dtype
# enum (increasing alignment); the reference writer orders by this,
# descending.
DTYPE_BITS = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}
DTYPE_RANK = {code: i for i, code in enumerate(DTYPE_BITS)}
TENSOR_FIELDS = ("dtype", "shape", "data_offsets")


class SpecError(ValueError):
    """A violation of the safetensors format; `code` names the check."""

    def __init__(self, code, detail=""):
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code
        self.detail = detail


class Tensor:
    """One tensor entry.  `data` is the raw bytes (None if not read)."""

    __slots__ = ("name", "dtype", "shape", "begin", "end", "data")

    def __init__(self, name, dtype, shape, begin, end, data=None):
        self.name, self.dtype, self.shape = name, dtype, shape
        self.begin, self.end, self.data = begin, end, data

    @property
    def nbytes(self):
        return self.end - self.begin

    def as_tuple(self):
        return (self.dtype, self.shape, self.data)

    def __repr__(self):
        return f"Tensor({self.name!r}, {self.dtype}, {list(self.shape)}, [{self.begin},{self.end}])"


class Parsed:
    """Result of parse(): header length, raw header text, metadata, tensors
    (in data-offset order) and the key order of the JSON object."""

    def __init__(self, n, header, metadata, tensors, key_order, file_size):
        self.n = n
        self.header = header
        self.metadata = metadata
        self.tensors = tensors
        self.key_order = key_order
        self.file_size = file_size

    @property
    def data_start(self):
        return 8 + self.n

    def as_dict(self):
        return {t.name: t.as_tuple() for t in self.tensors}


def _is_uint(v):
    # bool is an int subclass in Python; JSON true is not a number
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < U64


def _reject_constant(name):
    # Python's json takes NaN / Infinity; JSON (and serde_json) does not
    raise ValueError(f"non-JSON constant {name}")


class _Obj(dict):
    """A JSON object that remembers its key order."""

    order = ()


def _parse_json(text, strict):
    dups = []

    def pairs(items):
        d = _Obj()
        for k, v in items:
            if k in d:
                dups.append(k)
            d[k] = v
        d.order = [k for k, _ in items]
        return d

    try:
        obj = json.loads(text, object_pairs_hook=pairs, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as e:
        raise SpecError("InvalidHeaderDeserialization", str(e)) from None
    if strict and dups:
        raise SpecError("DuplicateKey", repr(dups[0]))
    return obj


def _check_str(s, what):
    # a lone surrogate escape (\ud800) is valid for Python's json, not for a
    # Rust String
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise SpecError("InvalidHeaderDeserialization", f"{what} is not valid Unicode") from None


def parse_header(head, file_size, strict=True):
    """Validate the first bytes of a file (`head` holds at least 8 + N
    bytes, or the whole file if shorter) given the total file size.
    Returns a Parsed whose tensors have data=None."""
    if file_size < 8 or len(head) < 8:
        raise SpecError("HeaderTooSmall", f"file has {file_size} bytes")
    n = int.from_bytes(head[:8], "little")
    if n > MAX_HEADER:
        raise SpecError("HeaderTooLarge", f"N = {n}")
    if 8 + n > file_size:
        raise SpecError("InvalidHeaderLength", f"8 + N = {8 + n} > file size {file_size}")
    raw = bytes(head[8 : 8 + n])
    if len(raw) != n:
        raise SpecError("InvalidHeaderLength", "short header read")
    try:
        text = raw.decode("utf-8", errors="strict")
    except UnicodeDecodeError as e:
        raise SpecError("InvalidHeader", str(e)) from None
    if strict and not text.startswith("{"):
        raise SpecError("InvalidHeaderStart", f"header begins with {text[:1]!r}")
    obj = _parse_json(text, strict)
    if not isinstance(obj, dict):
        raise SpecError("InvalidHeaderDeserialization", "top level is not an object")
    key_order = list(dict.fromkeys(obj.order))
    metadata = None
    entries = []
    for key in key_order:
        val = obj[key]
        _check_str(key, "a key")
        if key == "__metadata__":
            if val is None:  # Option<HashMap>: null means absent
                continue
            if not isinstance(val, dict):
                raise SpecError("InvalidHeaderDeserialization", "__metadata__ is not an object")
            for mk, mv in val.items():
                _check_str(mk, "a metadata key")
                if not isinstance(mv, str):
                    raise SpecError(
                        "InvalidHeaderDeserialization", f"__metadata__[{mk!r}] is not a string"
                    )
                _check_str(mv, "a metadata value")
            metadata = dict(val)
            continue
        if not isinstance(val, dict):
            raise SpecError("InvalidHeaderDeserialization", f"{key!r}: entry is not an object")
        fields = val
        for f in TENSOR_FIELDS:
            if f not in fields:
                raise SpecError("InvalidHeaderDeserialization", f"{key!r}: no {f}")
        extra = sorted(set(fields) - set(TENSOR_FIELDS))
        if strict and extra:
            raise SpecError("UnknownField", f"{key!r}: {extra}")
        dtype = fields["dtype"]
        if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
            raise SpecError("InvalidHeaderDeserialization", f"{key!r}: unknown dtype {dtype!r}")
        shape = fields["shape"]
        if not isinstance(shape, list) or not all(_is_uint(d) for d in shape):
            raise SpecError("InvalidHeaderDeserialization", f"{key!r}: bad shape {shape!r}")
        offs = fields["data_offsets"]
        if not isinstance(offs, list) or len(offs) != 2 or not all(_is_uint(o) for o in offs):
            raise SpecError("InvalidHeaderDeserialization", f"{key!r}: bad data_offsets {offs!r}")
        entries.append(Tensor(key, dtype, tuple(shape), offs[0], offs[1]))

    # Metadata::validate: in data_offsets order, contiguous from 0.
    entries.sort(key=lambda t: (t.begin, t.end))
    pos = 0
    for t in entries:
        if t.begin != pos or t.end < t.begin:
            raise SpecError("InvalidOffset", f"{t.name!r}: [{t.begin},{t.end}] but expected start {pos}")
        pos = t.end
        count = 1
        for d in t.shape:
            count *= d
            if count >= U64:
                raise SpecError("ValidationOverflow", f"{t.name!r}: shape {list(t.shape)}")
        bits = count * DTYPE_BITS[t.dtype]
        if bits >= U64:
            raise SpecError("ValidationOverflow", f"{t.name!r}: {count} elements of {t.dtype}")
        if bits % 8:
            raise SpecError("MisalignedSlice", f"{t.name!r}: {bits} bits")
        if t.end - t.begin != bits // 8:
            raise SpecError(
                "TensorInvalidInfo",
                f"{t.name!r}: {t.end - t.begin} bytes for {list(t.shape)} {t.dtype} ({bits // 8} expected)",
            )
    if pos + 8 + n != file_size:
        raise SpecError(
            "MetadataIncompleteBuffer", f"data ends at {8 + n + pos}, file has {file_size} bytes"
        )
    return Parsed(n, text, metadata, entries, key_order, file_size)


def parse(data, strict=True):
    """Validate a whole file held in memory; tensors get their bytes."""
    data = bytes(data)
    p = parse_header(data[: 8 + MAX_HEADER + 1], len(data), strict)
    for t in p.tensors:
        t.data = data[p.data_start + t.begin : p.data_start + t.end]
    return p


def parse_file(path, strict=True, read_data=True):
    """Validate the file at `path` (reads the header, then each tensor's
    bytes when read_data)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) == 8:
            n = int.from_bytes(head, "little")
            if n <= MAX_HEADER:
                head += f.read(min(n, max(size - 8, 0)))
        p = parse_header(head, size, strict)
        if read_data:
            for t in p.tensors:
                f.seek(p.data_start + t.begin)
                t.data = f.read(t.nbytes)
                if len(t.data) != t.nbytes:
                    raise SpecError("MetadataIncompleteBuffer", f"short read of {t.name!r}")
    return p


def load(path, strict=True, read_data=True):
    """(tensors, metadata): {name: (dtype, shape tuple, bytes)} and the
    __metadata__ dict (None when absent).  Raises SpecError."""
    p = parse_file(path, strict, read_data)
    return p.as_dict(), p.metadata


def writer_deviations(p):
    """Where a valid file departs from the reference writer's output
    conventions; empty list when it matches them all."""
    out = []
    if p.n % 8:
        out.append(f"N = {p.n} is not a multiple of 8")
    body = p.header.rstrip(" ")
    if not body.endswith("}"):
        out.append("header is not the JSON object followed by spaces only")
    keys = p.key_order
    if p.metadata is not None and keys[0] != "__metadata__":
        out.append("__metadata__ is not the first key")
    tensor_keys = [k for k in keys if k != "__metadata__"]
    by_offset = [t.name for t in p.tensors]
    if tensor_keys != by_offset:
        out.append("JSON key order differs from data order")
    want = sorted(p.tensors, key=lambda t: (-DTYPE_RANK[t.dtype], t.name.encode("utf-8")))
    if [t.name for t in want] != by_offset:
        out.append("data order is not (dtype alignment descending, name)")
    compact = json.dumps(json.loads(p.header), separators=(",", ":"), ensure_ascii=False)
    if body != compact:
        out.append("JSON is not compact (serde_json style)")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description="Validate a safetensors file against the format rules.")
    ap.add_argument("file")
    ap.add_argument("--lenient", action="store_true", help="only the reference reader's checks")
    ap.add_argument("--writer", action="store_true", help="also require the reference writer's conventions")
    ap.add_argument("--no-data", action="store_true", help="do not read tensor bytes")
    args = ap.parse_args(argv)
    try:
        p = parse_file(args.file, strict=not args.lenient, read_data=not args.no_data)
    except SpecError as e:
        print(f"{args.file}: VIOLATION {e}")
        return 1
    except OSError as e:
        print(f"{args.file}: {e}")
        return 1
    print(f"{args.file}: {p.file_size} bytes, header N = {p.n}, {len(p.tensors)} tensors")
    if p.metadata is not None:
        print(f"  __metadata__ {json.dumps(p.metadata, ensure_ascii=False)}")
    for t in p.tensors:
        print(f"  {t.name}  {t.dtype} {list(t.shape)}  [{t.begin}, {t.end})")
    if args.writer:
        dev = writer_deviations(p)
        for d in dev:
            print(f"{args.file}: VIOLATION writer convention: {d}")
        if dev:
            return 1
    print(f"{args.file}: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
