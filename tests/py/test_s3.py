"""End-to-end: `ckptfs s3://BUCKET/PREFIX MNT` against s3rver on loopback.

Every fixture layout mounted from the object store shows the same tree, byte
for byte, as the same layout mounted from its folder; faults injected by the
proxy under a mounted tree are retried into exact bytes or end in EIO with
the daemon still answering; no credential reaches the daemon's log or `ps`.

The endpoint is given with -o endpoint= (AWS_ENDPOINT_URL_S3 in the daemon's
environment would do as well); credentials only through the environment.
"""
import errno
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

import ckfs_util as U

sys.path.insert(0, str(U.REPO / "tests" / "s3"))
import s3env  # noqa: E402

PREFIX = "fx"
SECRET = "SeCrEt/MountDoNotLog+0123456789abcdef"
TOKEN = "SeSsIoN//MountDoNotLog=="
# every fixture layout, and a step and an item of a CheckpointManager root
LAYOUTS = ["pytree_zarr2", "pytree_zarr3", "pytree_ocdbt_zarr2", "std_ocdbt_zarr3", "v1_pytree",
           "manager", "v1_checkpointables", "manager/10", "manager/10/state"]

pytestmark = pytest.mark.skipif(bool(s3env.available()), reason=s3env.available())


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    with s3env.S3Env(tmp_path_factory.mktemp("s3m")) as e:
        e.upload_tree(U.FIXTURES, PREFIX)
        yield e


def help_text():
    r = subprocess.run([str(U.BIN), "--help"], capture_output=True, text=True, timeout=30)
    return r.stdout + r.stderr


@pytest.fixture
def s3mount(tmp_path, monkeypatch, env):
    """s3mount(layout, endpoint=None, *options) -> Mount of s3://ckpt/fx/<layout>."""
    mounts = []
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "S3RVER")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", TOKEN)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)

    def make(layout, endpoint=None, *options, scheme="s3", expect=b"s"):
        endpoint = endpoint or env.endpoint
        opts = list(options) + [f"endpoint={endpoint}"]
        n = len(mounts)
        m = U.Mount("placeholder", tmp_path / f"s3m{n}", tmp_path / f"s3m{n}.log", options=opts)
        m.source = f"{scheme}://{s3env.BUCKET}/{PREFIX}/{layout}"  # not a Path: keep the '//'
        mounts.append(m)
        byte = m.start(expect_ready=False)
        if byte != expect:
            log = m.log()
            m._abort()
            raise U.MountError(f"s3 mount: {byte!r}, expected {expect!r}\n{log}")
        if byte != b"s":
            m._abort()
        return m

    yield make
    for m in reversed(mounts):
        if not m.closed:
            m.unmount(check=True)


def tree(root):
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        rel = os.path.relpath(dirpath, root)
        out[rel + "/"] = sorted(dirnames + filenames)
        for fn in sorted(filenames):
            with open(os.path.join(dirpath, fn), "rb") as f:
                out[os.path.join(rel, fn)] = f.read()
    return out


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layout_byte_exact_against_the_folder_mount(layout, s3mount, mount):
    remote = s3mount(layout)
    local = mount(U.FIXTURES / layout)
    a, b = tree(remote.p()), tree(local.p())
    assert sorted(a) == sorted(b)
    for k in b:
        assert a[k] == b[k], k
    assert sum(1 for k in b if k.endswith(".npy")) > 0


def test_faults_under_a_mount(env, s3mount, mount):
    lay = U.layout("pytree_zarr3")
    m = s3mount("pytree_zarr3", env.proxy_endpoint)
    arrays = sorted(lay.arrays)
    local = mount(U.FIXTURES / "pytree_zarr3")
    env.fault("clear")
    # transient: 503s and a reset on the chunk GETs are retried into exact bytes
    env.fault("status", "503:SlowDown", count=2, match="GET /ckpt/fx/pytree_zarr3/")
    env.fault("reset", "", count=1, match="GET /ckpt/fx/pytree_zarr3/")
    first = arrays[0]
    assert U.read_all(m.p(first)) == U.read_all(local.p(first))
    # persistent: EIO, never wrong bytes, and the daemon keeps answering
    env.fault("clear")
    env.fault("status", "503:SlowDown", count=10000, match="GET /ckpt/fx/pytree_zarr3/")
    victim = arrays[-1]
    with pytest.raises(OSError) as ei:
        U.read_all(m.p(victim))
    assert ei.value.errno == 5
    env.fault("clear")
    assert U.read_all(m.p(victim)) == U.read_all(local.p(victim))
    assert os.listdir(m.p())
    assert "503" in m.log()


def test_no_credential_in_log_or_ps(env, s3mount):
    m = s3mount("pytree_zarr2", env.proxy_endpoint)
    env.fault("clear")
    env.fault("status", "503:SlowDown", count=2, match="GET")
    tree(m.p())
    env.fault("clear")
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    for s in (SECRET, TOKEN, SECRET[:12], TOKEN[:12]):
        assert s not in ps
        assert s not in m.log()


def test_gs_scheme_mounts_the_same_tree(s3mount, mount):
    # gs:// through the XML API with HMAC keys (the same SigV4 signing, region "auto")
    remote = s3mount("pytree_zarr3", None, scheme="gs")
    local = mount(U.FIXTURES / "pytree_zarr3")
    assert tree(remote.p()) == tree(local.p())


def first_array(root, min_rank=1):
    for dirpath, dirnames, filenames in sorted(os.walk(root)):
        for fn in sorted(filenames):
            if fn.endswith(".npy"):
                p = os.path.join(dirpath, fn)
                a = np.load(p, mmap_mode="r")
                if a.ndim >= min_rank and a.shape[0] >= 2:
                    return os.path.relpath(p, root)
    raise AssertionError("no array of rank >= %d" % min_rank)


@pytest.mark.parametrize("layout", ["pytree_zarr3", "std_ocdbt_zarr3"])
def test_companions_xattrs_and_stats_as_on_the_folder_mount(layout, s3mount, mount):
    remote = s3mount(layout)
    local = mount(U.FIXTURES / layout)
    rel = first_array(local.p())
    stem = rel[: -len(".npy")]
    for name in (stem + "[0:1].npy", stem + "[1:2].npy"):
        assert U.read_all(remote.p(name)) == U.read_all(local.p(name)), name
    shards = stem + ".npy.shards"
    if os.path.isdir(local.p(shards)):
        assert sorted(os.listdir(remote.p(shards))) == sorted(os.listdir(local.p(shards)))
        for fn in os.listdir(local.p(shards)):
            assert U.read_all(remote.p(os.path.join(shards, fn))) == U.read_all(local.p(os.path.join(shards, fn)))
    top = rel.split("/")[0]
    if os.path.isdir(local.p(top)):
        st = top + ".safetensors"
        assert U.read_all(remote.p(st)) == U.read_all(local.p(st))
    names = sorted(os.listxattr(local.p(rel)))
    assert names and sorted(os.listxattr(remote.p(rel))) == names
    for n in names:
        assert os.getxattr(remote.p(rel), n) == os.getxattr(local.p(rel), n), n
    stats = json.loads(U.read_all(remote.p(".ckptfs/stats")))
    assert isinstance(stats, dict) and stats


def test_store_options_reach_the_store(env, s3mount, mount):
    # a bad value is refused before the mount, without echoing the value
    s3mount("pytree_zarr3", None, "connections=0", expect=b"f")
    # retries=N: every GET of a chunk is tried N+1 times before the EIO
    local = mount(U.FIXTURES / "pytree_zarr3")
    rel = first_array(local.p())
    tries = {}
    for n in (0, 2):
        m = s3mount("pytree_zarr3", env.proxy_endpoint, f"retries={n}", "retry_base_ms=5", "connections=2")
        env.fault("clear")
        env.fault("status", "503:SlowDown", count=100000, match="GET /ckpt/fx/pytree_zarr3/")
        with pytest.raises(OSError) as ei:
            U.read_all(m.p(rel))
        assert ei.value.errno == errno.EIO
        # read-ahead may still be retrying other GETs: wait until the
        # requests stop (the rule fails every attempt, so each one ends)
        log, last = env.fault_log(), None
        while log != last:
            time.sleep(0.5)
            last, log = log, env.fault_log()
        env.fault("clear")
        assert U.read_all(m.p(rel)) == U.read_all(local.p(rel))
        gets = [line for line in log if line.startswith("GET ") and "/c/0" in line]
        # each failed GET is logged once by the daemon, after its attempts
        failed = [line for line in m.log().splitlines() if "retries exhausted" in line and "/c/0" in line]
        tries[n] = (len(gets), len(failed))
    for n, (gets, failed) in tries.items():
        assert failed and gets == failed * (n + 1), tries  # retries=N: N+1 attempts per GET


@pytest.mark.parametrize("mode,arg", [("truncate", "7"), ("reset_mid", "3"), ("delay", "300"), ("reset", "")])
def test_transient_faults_give_exact_bytes(env, s3mount, mount, mode, arg):
    m = s3mount("std_ocdbt_zarr3", env.proxy_endpoint, "retry_base_ms=10")
    local = mount(U.FIXTURES / "std_ocdbt_zarr3")
    env.fault("clear")
    env.fault(mode, arg, count=3, match="GET /ckpt/fx/std_ocdbt_zarr3/")
    assert tree(m.p()) == tree(local.p())
    log = env.fault_log()
    env.fault("clear")
    assert any(mode in line for line in log), log


def test_exhausted_retries_name_the_object_and_status(env, s3mount, mount):
    m = s3mount("pytree_zarr2", env.proxy_endpoint, "retries=2", "retry_base_ms=5")
    local = mount(U.FIXTURES / "pytree_zarr2")
    rel = first_array(local.p())
    env.fault("clear")
    env.fault("truncate", "5", count=100000, match="GET /ckpt/fx/pytree_zarr2/")
    with pytest.raises(OSError) as ei:
        U.read_all(m.p(rel))
    assert ei.value.errno == errno.EIO
    env.fault("clear")
    log = m.log()
    assert "retries exhausted" in log and "pytree_zarr2/" in log
    # the daemon stays up and serves the same file once the server behaves
    assert U.read_all(m.p(rel)) == U.read_all(local.p(rel))


def test_remote_root_ro_refuses_new_steps_and_makes_no_local_folder(s3mount, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    m = s3mount("manager", None, "ro")
    with pytest.raises(OSError) as ei:
        os.mkdir(m.p("30"))
    assert ei.value.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
    assert not os.path.exists(tmp_path / "s3:")
    assert not os.path.exists("s3:")


def test_new_steps_appear_without_a_remount(env, s3mount, tmp_path):
    m = s3mount("live")  # an empty root
    assert os.listdir(m.p()) == [".ckptfs"] or os.listdir(m.p()) == []
    n = env.upload_tree(U.FIXTURES / "manager" / "10", f"{PREFIX}/live/10")
    assert n > 0
    assert U.wait_until(lambda: "10" in os.listdir(m.p()), timeout=10)
    # On an object store Orbax writes a step under its final name and its
    # commit_success.txt last: a step without it is still being written.
    half = tmp_path / "20"
    shutil.copytree(U.FIXTURES / "manager" / "20", half)
    marker = (half / "commit_success.txt").read_bytes()
    os.unlink(half / "commit_success.txt")
    env.upload_tree(half, f"{PREFIX}/live/20")
    env.upload_tree(U.FIXTURES / "manager" / "10", f"{PREFIX}/live/30")
    assert U.wait_until(lambda: "30" in os.listdir(m.p()), timeout=10)
    assert "20" not in os.listdir(m.p()), "a step without commit_success.txt is not finished"
    env.put(f"{PREFIX}/live/20/commit_success.txt", marker)
    assert U.wait_until(lambda: "20" in os.listdir(m.p()), timeout=10)
    assert U.read_all(m.p("20/state/params/layer_0/attn/q_proj.npy"))


def _npy_header(dtype, shape):
    import io
    b = io.BytesIO()
    np.lib.format.write_array_header_1_0(b, {"descr": np.dtype(dtype).str, "fortran_order": False,
                                             "shape": tuple(shape)})
    return b.getvalue()


def _write_step(step, seed, writers=4):
    """A step written by several threads at once: a 12 MiB array (one shard
    file, sent as a multipart upload) by row blocks with pwrite, and small
    arrays with np.save.  Returns {relative path: array}."""
    import threading
    r = np.random.default_rng(seed)
    big = r.standard_normal((3072, 1024)).astype(np.float32)
    small = {"state/small/a.npy": r.integers(0, 9, size=(17, 3)).astype(np.int32),
             "state/small/b.npy": r.standard_normal((5,)).astype(np.float64)}
    os.makedirs(os.path.join(step, "state", "small"))
    path = os.path.join(step, "state", "big.npy")
    head = _npy_header(big.dtype, big.shape)
    with open(path, "wb") as f:
        f.write(head)
    data = big.tobytes()
    errors = []

    def work(i):
        try:
            fd = os.open(path, os.O_WRONLY)
            try:
                n = len(data) // writers
                a, b = i * n, len(data) if i == writers - 1 else (i + 1) * n
                for o in range(a, b, 1 << 20):
                    e = min(b, o + (1 << 20))
                    assert os.pwrite(fd, data[o:e], len(head) + o) == e - o
            finally:
                os.close(fd)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(writers)]
    ts += [threading.Thread(target=lambda k=k, v=v: np.save(os.path.join(step, k), v)) for k, v in small.items()]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    return dict(small, **{"state/big.npy": big})


def _keys(env, prefix):
    c = env.client()
    out = []
    for page in c.get_paginator("list_objects_v2").paginate(Bucket=s3env.BUCKET, Prefix=prefix):
        out += [o["Key"] for o in page.get("Contents", [])]
    return out


def test_write_a_step_to_an_object_store_root(env, s3mount, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    m = s3mount("wr", env.proxy_endpoint, "write_buffer=64M")
    env.fault("clear")
    os.mkdir(m.p("30"))
    exp = _write_step(str(m.p("30")), 30)
    # only data (shards finished while writing) reaches the bucket before the commit
    assert not [k for k in _keys(env, f"{PREFIX}/wr/30/") if "/c/" not in k and not k.endswith("/")]
    open(m.p("30/commit_success.txt"), "w").close()
    log = env.fault_log()
    env.fault("clear")
    writes = [x for x in log if x.split()[0] in ("PUT", "POST") and f"/{PREFIX}/wr/30/" in x]
    assert writes and writes[-1].startswith(f"PUT /ckpt/{PREFIX}/wr/30/commit_success.txt "), writes[-4:]
    assert sum(1 for x in writes if "commit_success.txt" in x and "/30/commit_success.txt" in x) == 1
    assert any("?uploads" in x for x in writes), "the 12 MiB shard goes as a multipart upload"
    meta = [i for i, x in enumerate(writes) if "zarr.json" in x or "_METADATA" in x]
    data = [i for i, x in enumerate(writes) if "/c/" in x or "uploadId" in x]
    assert meta and data and max(data) < min(meta), "data objects before metadata"
    keys = _keys(env, f"{PREFIX}/wr/30/")
    assert f"{PREFIX}/wr/30/commit_success.txt" in keys
    assert not os.path.exists(tmp_path / "s3:")
    for k, v in exp.items():
        got = np.load(m.p("30/" + k))
        assert got.dtype == v.dtype and np.array_equal(got, v), k
    # a fresh mount reads the step back from the bucket
    m2 = s3mount("wr")
    assert "30" in os.listdir(m2.p())
    for k, v in exp.items():
        got = np.load(m2.p("30/" + k))
        assert got.dtype == v.dtype and np.array_equal(got, v), k


def test_a_shard_index_is_fetched_once_for_all_its_inner_chunks(env, s3mount, tmp_path, monkeypatch):
    """The index at the end of a shard is read before each of its inner
    chunks; on an object store each read was a GET (2 per inner chunk)."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    m = s3mount("wr7", env.proxy_endpoint)
    os.mkdir(m.p("37"))
    exp = _write_step(str(m.p("37")), 37, writers=2)
    open(m.p("37/commit_success.txt"), "w").close()
    zj = json.loads(env.client().get_object(Bucket=s3env.BUCKET, Key=f"{PREFIX}/wr7/37/state/big/zarr.json")["Body"].read())
    outer = zj["chunk_grid"]["configuration"]["chunk_shape"]
    inner = zj["codecs"][0]["configuration"]["chunk_shape"]
    n = int(np.prod([-(-a // b) for a, b in zip(outer, inner)]))
    assert n >= 3, (outer, inner)
    m2 = s3mount("wr7", env.proxy_endpoint)
    env.fault("clear")
    got = np.load(m2.p("37/state/big.npy"))
    log = env.fault_log()
    assert np.array_equal(got, exp["state/big.npy"])
    gets = [x for x in log if x.startswith(f"GET /ckpt/{PREFIX}/wr7/37/state/big/c/")]
    assert n <= len(gets) <= n + 2, (n, gets)  # one index GET (two if read-ahead races), one per chunk


def test_upload_buffers_count_in_the_write_buffer(env, s3mount, tmp_path, monkeypatch):
    """Each upload worker holds an 8 MiB part buffer: with -o threads=32 they
    held up to 256 MiB beyond -o write_buffer while slow PUTs piled up."""
    if U.sanitized():
        pytest.skip("memory figures are not measured under sanitizers")
    MiB = 1 << 20
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    m = s3mount("wr8", env.proxy_endpoint, "write_buffer=32M", "threads=32")
    base = U.vm(m.proc.pid)
    env.fault("clear")
    env.fault("delay", "300", count=10 ** 6, match=f"PUT /ckpt/{PREFIX}/wr8/38/")
    os.makedirs(m.p("38/state/w"))
    r = np.random.default_rng(38)
    exp = {}
    for i in range(24):  # 24 arrays of 4 MiB, one shard file each: queued for upload when complete
        a = r.standard_normal((1024, 1024)).astype(np.float32)
        np.save(m.p(f"38/state/w/a{i}.npy"), a)
        exp[f"state/w/a{i}.npy"] = a
    open(m.p("38/commit_success.txt"), "w").close()
    env.fault("clear")
    grew = U.vm(m.proc.pid) - base
    assert grew < 32 * MiB + 24 * MiB, f"VmHWM grew by {grew / MiB:.0f} MiB (write_buffer 32 MiB + slack 24 MiB)"
    m2 = s3mount("wr8")
    for k, v in exp.items():
        assert np.array_equal(np.load(m2.p("38/" + k)), v), k


def test_aborted_and_failed_saves_leave_no_marker(env, s3mount, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    m = s3mount("wr2", env.proxy_endpoint, "retries=1", "retry_base_ms=5")
    os.mkdir(m.p("31"))
    _write_step(str(m.p("31")), 31, writers=2)
    # abort: removing the pending step leaves nothing (shards sent meanwhile are deleted)
    shutil.rmtree(m.p("31"), ignore_errors=True)
    assert "31" not in os.listdir(m.p())
    assert not _keys(env, f"{PREFIX}/wr2/31/")
    # a save whose uploads keep failing: EIO, no marker, multipart uploads aborted
    os.mkdir(m.p("32"))
    _write_step(str(m.p("32")), 32, writers=2)
    env.fault("clear")
    env.fault("status", "503:SlowDown", count=100000, match=f"PUT /ckpt/{PREFIX}/wr2/32/state/big/")
    with pytest.raises(OSError) as ei:
        open(m.p("32/commit_success.txt"), "w").close()
    assert ei.value.errno == errno.EIO
    log = env.fault_log()
    env.fault("clear")
    assert f"{PREFIX}/wr2/32/commit_success.txt" not in _keys(env, f"{PREFIX}/wr2/32/")
    assert not [k for k in _keys(env, f"{PREFIX}/wr2/32/") if not k.endswith("/")], "objects sent are deleted"
    assert any(x.startswith("DELETE") and "uploadId" in x for x in log), "multipart upload aborted"
    assert "upload of" in m.log()


def test_shards_are_uploaded_while_the_step_is_written(env, s3mount, tmp_path, monkeypatch):
    """Each array here is one shard file: complete ones are finished and
    uploaded before the commit; the commit sends the rest, marker last."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    m = s3mount("wr4", env.proxy_endpoint)
    os.mkdir(m.p("33"))
    exp = _write_step(str(m.p("33")), 33, writers=2)
    r = np.random.default_rng(33)
    os.makedirs(m.p("33/state/more"))
    for i in range(4):
        a = r.standard_normal((64, 100 + i)).astype(np.float32)
        np.save(m.p(f"33/state/more/m{i}.npy"), a)
        exp[f"state/more/m{i}.npy"] = a
    pre = f"{PREFIX}/wr4/33/"
    shard_keys = {pre + f"state/more.m{i}/c/0/0" for i in range(4)} | {pre + "state/big/c/0/0"}

    def sent():
        return set(_keys(env, pre))
    assert U.wait_until(lambda: shard_keys <= sent(), timeout=30), sorted(sent())
    keys = sent()
    assert pre + "commit_success.txt" not in keys
    assert not [k for k in keys if "/c/" not in k and not k.endswith("/")], "no metadata before the commit"
    env.fault("clear")
    open(m.p("33/commit_success.txt"), "w").close()
    log = env.fault_log()
    env.fault("clear")
    writes = [x for x in log if x.split()[0] in ("PUT", "POST") and f"/{PREFIX}/wr4/33/" in x]
    assert writes[-1].startswith(f"PUT /ckpt/{pre}commit_success.txt "), writes[-4:]
    assert not [x for x in writes if "/c/" in x], "shards sent before are not sent again"
    m2 = s3mount("wr4")
    for k, v in exp.items():
        got = np.load(m2.p("33/" + k))
        assert got.dtype == v.dtype and np.array_equal(got, v), k


def test_a_shard_written_again_after_its_upload_is_sent_again(env, s3mount, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    m = s3mount("wr5", env.proxy_endpoint)
    os.makedirs(m.p("34/state"))
    r = np.random.default_rng(34)
    a = r.standard_normal((256, 300)).astype(np.float32)
    path = m.p("34/state/x.npy")
    np.save(path, a)
    key = f"{PREFIX}/wr5/34/state/x/c/0/0"
    assert U.wait_until(lambda: key in _keys(env, f"{PREFIX}/wr5/34/"), timeout=30)
    head = _npy_header(a.dtype, a.shape)
    a[10:20] = 7.0  # rewrites a stored chunk: the shard changes after its upload
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, a[10:20].tobytes(), len(head) + 10 * a.strides[0])
    finally:
        os.close(fd)
    open(m.p("34/commit_success.txt"), "w").close()
    m2 = s3mount("wr5")
    got = np.load(m2.p("34/state/x.npy"))
    assert np.array_equal(got, a)


def _dir_bytes(d):
    return sum(os.path.getsize(os.path.join(p, f)) for p, _, fs in os.walk(d) for f in fs)


def test_disk_cache_serves_a_remount_without_object_gets(env, s3mount, mount, tmp_path):
    cache = tmp_path / "cache"
    local = mount(U.FIXTURES / "std_ocdbt_zarr3")
    want = tree(local.p())
    m = s3mount("std_ocdbt_zarr3", env.proxy_endpoint, f"cache_dir={cache}")
    assert tree(m.p()) == want
    m.unmount(check=True)
    assert _dir_bytes(cache) > 0
    # every object GET now fails: the remount is served from cache_dir
    env.fault("clear")
    env.fault("status", "503:SlowDown", count=100000, match="GET /ckpt/fx/std_ocdbt_zarr3/")
    m2 = s3mount("std_ocdbt_zarr3", env.proxy_endpoint, f"cache_dir={cache}", "retries=0")
    assert tree(m2.p()) == want
    log = env.fault_log()
    env.fault("clear")
    assert not [x for x in log if x.startswith("GET /ckpt/fx/std_ocdbt_zarr3/")], log


def test_disk_cache_stays_within_its_size(env, s3mount, mount, tmp_path):
    cache = tmp_path / "cache"
    m = s3mount("pytree_zarr3", None, f"cache_dir={cache}", "cache_dir_size=64K")
    local = mount(U.FIXTURES / "pytree_zarr3")
    assert tree(m.p()) == tree(local.p())
    assert 0 < _dir_bytes(cache) <= 64 << 10


def test_info_and_verify_read_an_object_store(env, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "S3RVER")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", env.endpoint)
    src = f"s3://{s3env.BUCKET}/{PREFIX}/manager"
    r = subprocess.run([str(U.BIN), "info", "--json", src], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["source"] == src
    r = subprocess.run([str(U.BIN), "verify", src], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert SECRET not in r.stdout + r.stderr


def test_rename_commits_a_step_to_an_object_store_root(env, s3mount, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    m = s3mount("wr3", None, f"cache_dir={tmp_path / 'cache'}")
    os.mkdir(m.p("tmp40"))
    r = np.random.default_rng(40)
    os.makedirs(m.p("tmp40/state/sub"))
    a = r.standard_normal((9, 4)).astype(np.float32)
    np.save(m.p("tmp40/state/sub/a.npy"), a)
    os.rename(m.p("tmp40"), m.p("40"))
    keys = _keys(env, f"{PREFIX}/wr3/")
    assert f"{PREFIX}/wr3/40/commit_success.txt" in keys
    assert not [k for k in keys if "tmp40" in k]
    assert np.array_equal(np.load(m.p("40/state/sub/a.npy")), a)
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith("ckptfs-spool-") and
                any(p.iterdir())], "the staged copy is removed once uploaded"
    m2 = s3mount("wr3")
    assert np.array_equal(np.load(m2.p("40/state/sub/a.npy")), a)


def test_an_upload_that_fails_after_the_local_commit_loses_the_step_and_says_so(env, s3mount, tmp_path,
                                                                                  monkeypatch):
    """The step committed in its local staging folder, then sending its last
    objects failed: nothing of it is kept (what was sent is deleted), the log
    says so instead of "the step stays pending", and rmdir takes the lost
    step away so that it can be written again."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    m = s3mount("wr7", env.proxy_endpoint, "retries=1", "retry_base_ms=5")
    os.mkdir(m.p("36"))
    _write_step(str(m.p("36")), 36, writers=1)
    env.fault("clear")
    env.fault("status", "503:SlowDown", count=100000, match=f"PUT /ckpt/{PREFIX}/wr7/36/commit_success.txt")
    with pytest.raises(OSError):
        open(m.p("36/commit_success.txt"), "w").close()
    env.fault("clear")
    assert "nothing of the step is kept" in m.log()
    assert "36: commit failed" not in m.log()
    assert not [k for k in _keys(env, f"{PREFIX}/wr7/36/") if not k.endswith("/")]
    os.rmdir(m.p("36"))
    assert "36" not in os.listdir(m.p())
    os.mkdir(m.p("36"))
    _write_step(str(m.p("36")), 36, writers=1)
    open(m.p("36/commit_success.txt"), "w").close()
    assert f"{PREFIX}/wr7/36/commit_success.txt" in _keys(env, f"{PREFIX}/wr7/36/")
