"""Replay of a recorded Orbax run (tests/fixtures/orbax-replay/) against a
folder or a mount: the same system calls, in the order the recording's
threads entered them, with the same bytes.  No JAX, no Orbax.

replay(root, ops) returns the list of differences from the recording (an
outcome that differs, bytes read that differ) and checks on the way what
Orbax and TensorStore rely on:
  - the generation TensorStore remembers for a key (st_ino, st_mtime_ns and
    size by fstat of the lock file after its fsync, before its rename) is
    what stat of the key says after the rename and after the close;
  - a step folder (a name of digits) appears in ROOT only at the rename of
    its tmp folder, and never in part.
The deletion of a committed step (Orbax's rmtree of it) walks the files
stored on disk; a mount shows the step as its arrays instead, so the first
unlink or rmdir inside a committed step is replayed as shutil.rmtree of the
step (what Orbax asked for), and the recorded calls under it that follow
are skipped.
"""

import errno
import fcntl
import json
import lzma
import os
import shutil
import struct
from pathlib import Path

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "orbax-replay" / "replay.json.xz"
F_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", 37)
F_OFD_SETLKW = getattr(fcntl, "F_OFD_SETLKW", 38)


def load(path=FIXTURE):
    with lzma.open(path, "rt") as f:
        return json.load(f)["ops"]


def _flags(names):
    v = 0
    for n in names:
        v |= getattr(os, n, 0)
    return v


def _err(e):
    return errno.errorcode.get(e.errno, str(e.errno))


def _gen(st):
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def replay(root, ops, stop_after=None):
    """Run ops (up to index stop_after) under root; the differences."""
    root = Path(root)
    fds, paths, last_fstat, pending_gen = {}, {}, {}, {}
    diffs = []
    steps = {n for n in os.listdir(root) if n.isdigit()}
    deleted = set()

    def note(i, op, got):
        diffs.append(f"#{i} {op['op']} {op.get('path', op.get('fd'))}: recorded "
                     f"{op.get('err', 'ok')}, got {got}")

    for i, op in enumerate(ops):
        if stop_after is not None and i > stop_after:
            break
        kind = op["op"]
        want = op.get("err")
        p = root / op["path"] if "path" in op else None
        fd = fds.get(op.get("fd")) if "fd" in op and kind != "open" else None
        if "fd" in op and kind != "open" and fd is None:
            continue  # its open failed here (already reported)
        top = (op.get("path") or paths.get(fd, "")).split("/")[0]
        if top in deleted and kind != "close":
            continue
        if kind in ("unlink", "rmdir") and top in steps and op["path"] != top:
            shutil.rmtree(root / top)  # a committed step's deletion
            if os.path.exists(root / top):
                diffs.append(f"#{i} rmtree of step {top}: still there")
            deleted.add(top)
            steps.discard(top)
            continue
        try:
            if kind == "open":
                nfd = os.open(p, _flags(op["flags"]), 0o666)
                if want:
                    os.close(nfd)
                else:
                    fds[op["fd"]] = nfd
                    paths[nfd] = op["path"]
            elif kind == "mkdir":
                os.mkdir(p, 0o777)
            elif kind == "stat":
                os.stat(p, follow_symlinks=op["follow"])
            elif kind == "fstat":
                last_fstat[fd] = _gen(os.fstat(fd))
            elif kind == "write":
                data = bytes.fromhex(op["data"])
                n = os.pwrite(fd, data, op["off"]) if "off" in op else os.write(fd, data)
                if n != len(data):
                    note(i, op, f"short write {n}")
            elif kind == "read":
                got = os.pread(fd, op["len"], op["off"]) if "off" in op else os.read(fd, op["len"])
                if got != bytes.fromhex(op["data"]):
                    note(i, op, f"{len(got)} bytes that differ from the recording's {len(op['data']) // 2}")
            elif kind == "close":
                os.close(fd)
                del fds[op["fd"]]
                key = pending_gen.pop(fd, None)
                if key:  # the renamed lock file is closed: its generation holds
                    g = _gen(os.stat(root / key[0]))
                    if g != key[1]:
                        diffs.append(f"#{i} close: generation of {key[0]} moved at close: {key[1]} -> {g}")
                paths.pop(fd, None)
            elif kind == "fsync":
                os.fsync(fd)
            elif kind == "ftruncate":
                os.ftruncate(fd, op["size"])
            elif kind == "lock":
                t = fcntl.F_UNLCK if op["type"] == "F_UNLCK" else fcntl.F_WRLCK
                fcntl.fcntl(fd, F_OFD_SETLKW if op["wait"] else F_OFD_SETLK, struct.pack("hhqqi", t, 0, 0, 0, 0))
            elif kind == "flock":
                fcntl.flock(fd, fcntl.LOCK_UN if "LOCK_UN" in op["how"] else fcntl.LOCK_EX)
            elif kind == "listdir":
                os.listdir(fd)
            elif kind == "rename":
                lock = next((f for f, q in paths.items() if q == op["path"]), None)
                os.rename(p, root / op["to"])
                if lock is not None:
                    paths[lock] = op["to"]
                    if lock in last_fstat and op["path"].endswith(".__lock"):
                        g = _gen(os.stat(root / op["to"]))
                        if g != last_fstat[lock]:
                            diffs.append(f"#{i} rename: generation of {op['to']} moved: {last_fstat[lock]} -> {g}")
                        pending_gen[lock] = (op["to"], g)
            elif kind == "unlink":
                os.unlink(p)
            elif kind == "rmdir":
                os.rmdir(p)
            got = None
        except OSError as e:
            got = _err(e)
        if got != want and not (kind == "mkdir" and want == "EEXIST" and got is None):
            note(i, op, got or "ok")
        now = {n for n in os.listdir(root) if n.isdigit()}
        if now - steps and not (kind == "rename" and op["to"] in now - steps and not want):
            diffs.append(f"#{i} {kind}: step(s) {sorted(now - steps)} appeared before their rename")
        steps = now
    for f in fds.values():
        os.close(f)
    return diffs
