"""The tree a read-only mount shows (docs/usage.md "The tree"), its
attributes and xattrs, and the daemon's mount options and signals."""

import errno
import json
import os
import signal
import subprocess

import numpy as np
import pytest

import ckfs_util as U

WRITE_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)


# ---------------------------------------------------------------------------
# names

def test_listing_is_exact_at_every_level(lm):
    lay, m = lm
    problems = []
    for rel, want in sorted(lay.dirs.items()):
        got = set(os.listdir(m.p(rel)))
        extra = got - want - lay.optional.get(rel, set())
        missing = want - got
        if extra or missing:
            problems.append(f"/{rel}: missing {sorted(missing)}, unexpected {sorted(extra)}")
    assert not problems, "\n".join(problems)


def test_walk_finds_exactly_the_expected_files(lm):
    lay, m = lm
    files = set()
    dirs = set()
    for top, dnames, fnames in os.walk(m.p()):
        rtop = os.path.relpath(top, m.p())
        rtop = "" if rtop == "." else rtop
        dirs.add(rtop)
        for f in fnames:
            files.add(f"{rtop}/{f}" if rtop else f)
    optional = {f"{d}/{n}" if d else n for d, ns in lay.optional.items() for n in ns}
    assert dirs == set(lay.dirs)
    assert files - optional == set(lay.files) | set(lay.arrays)


def test_scandir_types_match_stat(lm):
    lay, m = lm
    for rel in lay.dirs:
        for e in os.scandir(m.p(rel)):
            child = f"{rel}/{e.name}" if rel else e.name
            assert e.is_dir(follow_symlinks=False) == (child in lay.dirs), child
            assert e.is_symlink() == (child in lay.links), child
            if e.is_symlink():
                assert os.readlink(e.path) == lay.links[child], child


def test_hidden_names_are_not_listed(lm):
    lay, m = lm
    hidden_words = ("array_metadatas", "manifest.ocdbt", "ocdbt.process_0", ".zarray", "zarr.json", ".ckptfs")
    for top, dnames, fnames in os.walk(m.p()):
        for n in dnames + fnames:
            assert n not in hidden_words, f"{top}/{n} is listed"
            assert not n.endswith(".shards"), f"{top}/{n}: companions are listed only with show_companions"
            assert not n.endswith(".safetensors"), f"{top}/{n}: companions are listed only with show_companions"
            assert "[" not in n, f"{top}/{n}: slice files are never listed"


def test_missing_names_are_enoent(lm):
    lay, m = lm
    some_dir = sorted(d for d in lay.dirs if d)[0]
    for rel in ("no_such_name", f"{some_dir}/no_such.npy", "params.layer_0.mlp.w1x"):
        assert U.errno_of(os.stat, m.p(rel)) == errno.ENOENT, rel
    arr = sorted(lay.arrays)[0]
    assert U.errno_of(os.stat, m.p(arr + "/x")) == errno.ENOTDIR
    assert U.errno_of(os.listdir, m.p(arr)) == errno.ENOTDIR


def test_stats_file_is_hidden_but_reachable(mount, fixtures_dir, expected):
    m = mount(fixtures_dir / "pytree_zarr2")
    assert ".ckptfs" not in os.listdir(m.p())
    assert U.is_dir_mode(os.stat(m.p(".ckptfs")).st_mode)
    st = os.stat(m.p(".ckptfs/stats"))
    assert U.is_file_mode(st.st_mode)
    before = json.loads(U.read_all(m.p(".ckptfs/stats")))
    assert isinstance(before, dict) and before
    assert all(isinstance(v, int) and v >= 0 for v in before.values()), before
    for key, exp in expected.items():
        assert U.read_all(m.p(key.replace(".", "/") + ".npy")).endswith(exp.data)
    after = json.loads(U.read_all(m.p(".ckptfs/stats")))
    assert set(after) == set(before)
    assert all(after[k] >= before[k] for k in before), (before, after)
    assert sum(after.values()) > sum(before.values()), "reading every array changed no counter"


# ---------------------------------------------------------------------------
# attributes

def test_modes_and_device(lm):
    lay, m = lm
    m.assert_on_mount(m.p())
    for rel in lay.dirs:
        st = os.stat(m.p(rel))
        assert U.is_dir_mode(st.st_mode), f"/{rel}: mode {oct(st.st_mode)} (want dir 0555)"
        assert st.st_dev == m.st_dev
    for rel in list(lay.files) + list(lay.arrays):
        st = os.stat(m.p(rel))
        assert U.is_file_mode(st.st_mode), f"/{rel}: mode {oct(st.st_mode)} (want file 0444)"
        assert st.st_dev == m.st_dev


def test_metadata_files_are_the_source_bytes(lm):
    lay, m = lm
    assert lay.files
    for rel, src in lay.files.items():
        want = src.read_bytes()
        assert os.stat(m.p(rel)).st_size == len(want), rel
        assert U.read_all(m.p(rel)) == want, rel


def test_array_sizes_are_exact(lm, expected):
    lay, m = lm
    for rel, a in lay.arrays.items():
        exp = expected[a.key]
        with open(m.p(rel), "rb") as f:
            head = f.read(4096)
        version, hl, shape, fortran, dtype, _ = U.parse_npy_header(head)
        assert version == (1, 0), rel
        assert hl % 64 == 0, f"{rel}: header of {hl} bytes is not a multiple of 64"
        st = os.stat(m.p(rel))
        assert st.st_size == hl + len(exp.data), f"{rel}: st_size {st.st_size} != {hl} + {len(exp.data)}"


def test_mtime_is_commit_time(lm):
    lay, m = lm
    assert lay.commit_ns
    for rel, ns in lay.commit_ns.items():
        st = os.stat(m.p(rel))
        assert st.st_mtime_ns // 10**9 == ns // 10**9, \
            f"/{rel}: mtime {st.st_mtime_ns} is not the commit time {ns} (to the second)"


def test_writes_are_refused(lm):
    lay, m = lm
    arr = m.p(sorted(lay.arrays)[0])
    meta = m.p(sorted(lay.files)[0])
    parent = arr.parent
    before = U.read_all(arr)
    for fn in (lambda: open(arr, "r+b"), lambda: open(meta, "ab"),
               lambda: os.unlink(arr), lambda: os.truncate(arr, 0),
               lambda: os.rename(arr, parent / "renamed.npy"),
               lambda: os.mkdir(parent / "newdir"), lambda: open(parent / "new.npy", "xb"),
               lambda: os.chmod(arr, 0o644)):
        e = U.errno_of(fn)
        assert e in WRITE_ERRNOS, f"write-like operation succeeded or gave errno {e}"
    assert U.read_all(arr) == before
    assert not os.path.exists(parent / "newdir") and not os.path.exists(parent / "new.npy")


# ---------------------------------------------------------------------------
# extended attributes

CKPT_XATTRS = ("user.ckpt.dtype", "user.ckpt.shape", "user.ckpt.chunks", "user.ckpt.codec",
               "user.ckpt.stored_bytes", "user.ckpt.format", "user.ckpt.shards")


def _x(path, name):
    return os.getxattr(path, name).decode()


def test_xattrs(lm, expected):
    lay, m = lm
    problems = []

    def check(cond, msg):
        if not cond:
            problems.append(msg)

    for rel, a in sorted(lay.arrays.items()):
        p = m.p(rel)
        exp = expected[a.key]
        names = set(os.listxattr(p))
        sharding = U.sharding_entry(a.item_src, a.param)
        want = set(CKPT_XATTRS) | ({"user.ckpt.sharding"} if sharding is not None else set())
        missing = want - names
        check(not missing, f"{rel}: missing xattrs {sorted(missing)} (has {sorted(names)})")
        if missing:
            continue
        check(_x(p, "user.ckpt.dtype") == exp.dtype, f"{rel}: dtype {_x(p, 'user.ckpt.dtype')!r} != {exp.dtype!r}")
        check(_x(p, "user.ckpt.shape") == U.fmt_list(exp.shape),
              f"{rel}: shape {_x(p, 'user.ckpt.shape')!r} != {U.fmt_list(exp.shape)!r}")
        check(_x(p, "user.ckpt.format") == lay.fmt, f"{rel}: format {_x(p, 'user.ckpt.format')!r} != {lay.fmt!r}")
        shards = json.loads(_x(p, "user.ckpt.shards"))
        if lay.ocdbt:
            chunks = U.array_metadatas_chunk_shape(a.item_src, a.param)
            check(_x(p, "user.ckpt.chunks") == U.fmt_list(chunks),
                  f"{rel}: chunks {_x(p, 'user.ckpt.chunks')!r} != {U.fmt_list(chunks)!r}")
            sb = _x(p, "user.ckpt.stored_bytes")
            check(sb.isdigit() and int(sb) > 0, f"{rel}: stored_bytes {sb!r} is not a positive integer")
            check(_x(p, "user.ckpt.codec") != "", f"{rel}: empty codec")
            grid = [-(-s // c) for s, c in zip(exp.shape, chunks)]
            check(shards.get("grid") == grid, f"{rel}: shards {shards} (want grid {grid})")
            check(isinstance(shards.get("count"), int) and shards["count"] > 0, f"{rel}: shards {shards}")
        else:
            f = U.zarr_facts(a.item_src, a.param)
            check(_x(p, "user.ckpt.chunks") == U.fmt_list(f["chunks"]),
                  f"{rel}: chunks {_x(p, 'user.ckpt.chunks')!r} != {U.fmt_list(f['chunks'])!r}")
            check(_x(p, "user.ckpt.codec") == f["codec"], f"{rel}: codec {_x(p, 'user.ckpt.codec')!r} != {f['codec']!r}")
            check(_x(p, "user.ckpt.stored_bytes") == str(f["stored_bytes"]),
                  f"{rel}: stored_bytes {_x(p, 'user.ckpt.stored_bytes')!r} != {f['stored_bytes']}")
            check(shards == {"count": f["count"], "grid": f["grid"]},
                  f"{rel}: shards {shards} != {{'count': {f['count']}, 'grid': {f['grid']}}}")
        if sharding is not None:
            check(json.loads(_x(p, "user.ckpt.sharding")) == json.loads(sharding),
                  f"{rel}: sharding {_x(p, 'user.ckpt.sharding')!r} != the _sharding entry {sharding!r}")
        check(U.errno_of(os.getxattr, p, "user.ckpt.no_such") == errno.ENODATA,
              f"{rel}: unknown xattr does not give ENODATA")
    assert not problems, "\n".join(problems)


def test_xattrs_cannot_be_changed(lm):
    lay, m = lm
    p = m.p(sorted(lay.arrays)[0])
    before = os.getxattr(p, "user.ckpt.dtype")
    for fn in (lambda: os.setxattr(p, "user.ckpt.dtype", b"int8"),
               lambda: os.setxattr(p, "user.other", b"x"),
               lambda: os.removexattr(p, "user.ckpt.dtype")):
        e = U.errno_of(fn)
        assert e in WRITE_ERRNOS + (errno.ENOTSUP,), f"xattr change succeeded or gave errno {e}"
    assert os.getxattr(p, "user.ckpt.dtype") == before


def test_getfattr_dump(module_mount, fixtures_dir):
    """What the README shows: getfattr -d on a bf16 array."""
    m = module_mount(fixtures_dir / "pytree_zarr3")
    out = subprocess.run(["getfattr", "-d", str(m.p("params/layer_0/mlp/w1.npy"))],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert 'user.ckpt.dtype="bfloat16"' in out.stdout
    assert 'user.ckpt.shape="[32,128]"' in out.stdout


# ---------------------------------------------------------------------------
# options and signals

def test_help_exits_zero_and_names_the_options():
    if not U.BIN.exists():
        pytest.fail(f"{U.BIN} does not exist")
    r = subprocess.run([str(U.BIN), "--help"], capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    for word in ("cache_size", "ready_fd", "show_companions", "threads", "log_level"):
        assert word in out, f"--help does not mention {word}:\n{out}"
    U.assert_log_clean(out)


def test_sigterm_unmounts_cleanly(mount, fixtures_dir, expected):
    m = mount(fixtures_dir / "pytree_zarr3")
    data = U.read_all(m.p("params/layer_0/mlp/b1.npy"))
    assert data.endswith(expected["params.layer_0.mlp.b1"].data)
    m.proc.send_signal(signal.SIGTERM)
    rc = m.proc.wait(timeout=U.EXIT_TIMEOUT)
    assert rc == 0, m.log()
    assert not U.is_mounted(m.path)
    assert os.stat(m.path).st_dev == m.parent_dev
    m.unmount()  # checks the log; nothing left to unmount


def test_sigint_unmounts_cleanly(mount, fixtures_dir):
    m = mount(fixtures_dir / "pytree_zarr2")
    os.listdir(m.p("params"))
    m.proc.send_signal(signal.SIGINT)
    assert m.proc.wait(timeout=U.EXIT_TIMEOUT) == 0, m.log()
    assert not U.is_mounted(m.path)
    m.unmount()


def test_option_ro(mount, fixtures_dir, expected):
    m = mount(fixtures_dir / "pytree_zarr3", "ro")
    assert os.statvfs(m.p()).f_flag & os.ST_RDONLY
    p = m.p("params/embed/embedding.npy")
    a = np.load(p)
    assert a.tobytes() == expected["params.embed.embedding"].data
    assert U.errno_of(lambda: open(p, "r+b")) == errno.EROFS
    assert U.errno_of(os.mkdir, m.p("params/x")) == errno.EROFS


@pytest.mark.parametrize("opts", [
    ("cache_size=64K", "threads=1"),
    ("cache_size=1M", "threads=3", "log_level=debug"),
    ("cache_size=1G", "log_level=error"),
    ("show_companions", "log_level=warning"),
])
def test_options_are_accepted(mount, fixtures_dir, expected, opts):
    m = mount(fixtures_dir / "pytree_zarr2", *opts)
    for key, exp in expected.items():
        rel = key.replace(".", "/") + ".npy"
        assert U.read_all(m.p(rel)).endswith(exp.data), rel


@pytest.mark.parametrize("how", ["missing_source", "bad_cache_size", "bad_log_level"])
def test_failed_mount_reports_f(mount, fixtures_dir, tmp_path, how):
    """ready_fd gets 'f' when the daemon cannot mount; it exits non-zero."""
    if how == "missing_source":
        m = mount(tmp_path / "does_not_exist", expect_ready=False)
    elif how == "bad_cache_size":
        m = mount(fixtures_dir / "pytree_zarr3", "cache_size=banana", expect_ready=False)
    else:
        m = mount(fixtures_dir / "pytree_zarr3", "log_level=loud", expect_ready=False)
    rc = m.proc.wait(timeout=U.EXIT_TIMEOUT)
    assert m.ready == b"f", f"readiness byte {m.ready!r} (want b'f'); log:\n{m.log()}"
    assert rc != 0
    assert not U.is_mounted(m.path)
