"""The table of `ckptfs info` inside the mount: STEP/.ckptfs/summary.txt and
summary.json in each committed step of a root, and .ckptfs/summary.txt at
the root of a one-step or one-item mount (next to .ckptfs/stats).  Hidden
(reachable by name, never listed), read-only, the same bytes as
`ckptfs info SOURCE [STEP]` prints, and built from metadata only: reading it
decodes no chunk."""

import errno
import json
import os
import shutil
import subprocess

import pytest

import ckfs_util as U
from ckfs_help import listing, save_orbax_style, wait_listing


def info(*args):
    p = subprocess.run([str(U.BIN), "info", *map(str, args)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout


def decoded(m):
    with open(m.p(".ckptfs/stats"), "rb") as f:
        s = json.loads(f.read())
    return s["chunks_decoded"], s["decoded_bytes"]


def read_text(path):
    with open(path, "rb") as f:
        return f.read().decode()


def test_step_summary_manager(mount):
    src = (U.FIXTURES / "manager").resolve()
    m = mount(src, "ro")
    before = decoded(m)
    step = m.p("20")
    assert ".ckptfs" not in os.listdir(step)
    meta = step / ".ckptfs"
    assert U.is_dir_mode(os.stat(meta).st_mode)
    assert sorted(os.listdir(meta)) == ["summary.json", "summary.txt"]
    st = os.stat(meta / "summary.txt")
    assert U.is_file_mode(st.st_mode)
    text = read_text(meta / "summary.txt")
    assert text == info(src, "20")
    assert "step 20, item state" in text and text.endswith("\n")
    assert os.stat(meta / "summary.txt").st_size == len(text.encode())
    raw = read_text(meta / "summary.json")
    assert raw == info("--json", src, "20")
    j = json.loads(raw)
    assert j["steps"] == ["20"] and j["arrays"] and all(a["step"] == "20" for a in j["arrays"])
    assert j["total"]["arrays"] == len(j["arrays"])
    # metadata only: not one chunk decoded for all of the above
    assert decoded(m) == before
    # read-only
    for flags in (os.O_WRONLY, os.O_RDWR | os.O_TRUNC):
        assert U.errno_of(os.open, meta / "summary.txt", flags) in (errno.EROFS, errno.EACCES, errno.EPERM)
    # only steps have one; the root's .ckptfs/ has the stats only
    assert U.errno_of(os.stat, step / "state" / ".ckptfs") == errno.ENOENT
    assert U.errno_of(os.stat, m.p(".ckptfs/summary.txt")) == errno.ENOENT
    assert U.errno_of(os.stat, meta / ".ckptfs") == errno.ENOENT


def test_item_mount_summary(mount):
    src = (U.FIXTURES / "pytree_zarr3").resolve()
    m = mount(src, "ro")
    before = decoded(m)
    assert ".ckptfs" not in os.listdir(m.p())
    assert sorted(os.listdir(m.p(".ckptfs"))) == ["log", "stats", "summary.json", "summary.txt"]
    text = read_text(m.p(".ckptfs/summary.txt"))
    assert text == info(src)
    assert os.stat(m.p(".ckptfs/summary.txt")).st_size == len(text.encode())
    j = json.loads(read_text(m.p(".ckptfs/summary.json")))
    assert j["kind"] == "item" and j["total"]["arrays"] == len(j["arrays"]) > 0
    assert decoded(m) == before


def test_size_known_before_the_first_read(mount):
    """stat before any open already gives the exact size (built outside the
    namespace lock on getattr)."""
    src = (U.FIXTURES / "manager").resolve()
    m = mount(src, "ro")
    size = os.stat(m.p("20/.ckptfs/summary.json")).st_size
    assert size == len(info("--json", src, "20").encode())


def test_live_root_new_step(mount, tmp_path):
    src = tmp_path / "root"
    shutil.copytree(U.FIXTURES / "manager", src)
    src = src.resolve()
    m = mount(src)
    assert read_text(m.p("20/.ckptfs/summary.txt")) == info(src, "20")
    want = sorted(listing(m) + ["40"])
    save_orbax_style(src, 40, U.FIXTURES / "manager" / "20")
    assert wait_listing(m, want) == want
    text = read_text(m.p("40/.ckptfs/summary.txt"))
    assert text == info(src, "40")
    assert "step 40, item state" in text
    assert json.loads(read_text(m.p("40/.ckptfs/summary.json")))["steps"] == ["40"]


def test_written_step_while_namespace_changes(mount, tmp_path):
    """Steps written and committed through the mount, their summaries read
    for the first time while another thread keeps taking the namespace lock
    exclusively (mkdir/rmdir of a pending step): every read finishes (the
    table is built outside that lock) and matches `ckptfs info`."""
    import threading
    from ckfs_help import commit, small_step

    src = tmp_path / "root"
    shutil.copytree(U.FIXTURES / "manager", src)
    src = src.resolve()
    m = mount(src)
    stop = threading.Event()

    def churn():
        while not stop.is_set():
            d = m.p("999")
            os.mkdir(d)
            os.rmdir(d)

    texts = {}

    def reader():
        for s in ("31", "32", "33"):
            step = m.p(s)
            os.mkdir(step)
            small_step(step, int(s))
            commit(step)
            texts[s] = read_text(m.p(f"{s}/.ckptfs/summary.txt"))

    t = threading.Thread(target=churn)
    r = threading.Thread(target=reader)
    t.start()
    r.start()
    r.join(timeout=60)
    stop.set()
    t.join(timeout=60)
    assert not r.is_alive() and not t.is_alive()
    assert sorted(texts) == ["31", "32", "33"]
    for s, text in texts.items():
        assert text == info(src, s)
        assert f"step {s}, item state" in text and "sub/b" in text
