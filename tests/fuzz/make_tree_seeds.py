#!/usr/bin/env python3
"""Pack checkpoint folders into the input format of fuzz_tree (the container
described at the top of tests/fuzz/fuzz_tree.c: a flags byte, then per file
a head byte, path components, a u16 length and the bytes).  Path components
found in fuzz_tree.c's word table are written as their index, others as
literals; the table is read from fuzz_tree.c itself so the two never differ.

  make_tree_seeds.py OUTDIR [FIXTURES]     seeds from every fixture folder,
                                           its steps and its items
  make_tree_seeds.py --pack DIR OUTFILE    one folder into one input

Each source gives two seeds: "meta" (only the files of at most 2 KiB: the
metadata, small chunks; big OCDBT data files left out) and "full" (every
file, cut to 64 KiB) when it is at most 160 KiB in all.
"""

import os
import re
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def load_words():
    src = open(os.path.join(HERE, "fuzz_tree.c"), encoding="utf-8").read()
    m = re.search(r"words\[\]\s*=\s*\{(.*?)\};", src, re.S)
    return re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(1))


WORDS = load_words()
NWORDS = len(WORDS)
MAX_LIT = 255 - NWORDS


def files_of(top):
    out = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        for f in sorted(filenames):
            p = os.path.join(dirpath, f)
            if os.path.islink(p) or not os.path.isfile(p):
                continue
            out.append((os.path.relpath(p, top).replace(os.sep, "/"), p))
    return out


def encode_path(rel):
    comps = rel.split("/")
    if len(comps) > 8:
        return None
    b = bytearray([len(comps) - 1])
    for c in comps:
        if c in WORDS:
            b.append(WORDS.index(c))
            continue
        raw = c.encode()
        if len(raw) > MAX_LIT:
            return None
        b.append(NWORDS + len(raw))
        b += raw
    return bytes(b)


def pack(entries, flags=0):
    """entries: (relative path, bytes) -> one fuzz_tree input."""
    out = bytearray([flags])
    for rel, data in entries:
        head = encode_path(rel)
        if head is None:
            continue
        data = data[:0xFFFF]
        out += head + struct.pack("<H", len(data)) + data
    return bytes(out)


def pack_dir(top, max_file=None):
    entries = []
    for rel, p in files_of(top):
        size = os.path.getsize(p)
        if max_file is not None and size > max_file:
            continue
        entries.append((rel, open(p, "rb").read()))
    return entries


def sources(fixtures):
    """Every fixture folder, each step of a root and each item below it."""
    for name in sorted(os.listdir(fixtures)):
        top = os.path.join(fixtures, name)
        if not os.path.isdir(top) or name == "expected":
            continue
        yield name, top
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            if dirpath == top:
                continue
            rel = os.path.relpath(dirpath, fixtures).replace(os.sep, "_")
            if "_CHECKPOINT_METADATA" in filenames or "_METADATA" in filenames or \
                    "manifest.ocdbt" in filenames:
                yield rel, dirpath


def main(argv):
    if len(argv) == 4 and argv[1] == "--pack":
        data = pack(pack_dir(argv[2]))
        open(argv[3], "wb").write(data)
        print(f"{argv[3]}: {len(data)} bytes")
        return 0
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    out = argv[1]
    fixtures = argv[2] if len(argv) == 3 else os.path.join(REPO, "tests", "fixtures", "orbax-0.12.4")
    os.makedirs(out, exist_ok=True)
    n = 0
    for name, top in sources(fixtures):
        meta = pack_dir(top, max_file=2048)
        full = pack_dir(top)
        seeds = [("meta", meta, 0)]
        if sum(len(d) for _, d in full) <= 160 * 1024 and len(full) != len(meta):
            seeds.append(("full", full, 0))
        seeds.append(("comp", meta, 1))  # with the companions listed
        for kind, entries, flags in seeds:
            if not entries:
                continue
            open(os.path.join(out, f"{name}.{kind}"), "wb").write(pack(entries, flags))
            n += 1
    print(f"fuzz_tree: {n} seeds in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
