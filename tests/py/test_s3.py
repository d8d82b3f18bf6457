"""End-to-end: `ckptfs s3://BUCKET/PREFIX MNT` against s3rver on loopback.

Every fixture layout mounted from the object store shows the same tree, byte
for byte, as the same layout mounted from its folder; faults injected by the
proxy under a mounted tree are retried into exact bytes or end in EIO with
the daemon still answering; no credential reaches the daemon's log or `ps`.

Waits on (xfail until present):
  - fs/: accepting an s3:// or gs:// SOURCE (no realpath() on it), and the
    store options (-o endpoint=, region=, connections=, ...) passed to
    ckpt_store_open_source() through ckpt_store_opts_set();
  - tree/: layout.c on the store discovery API (done: layout_build_view).
Until the options are plumbed, the endpoint is given the way AWS tools take
it, through AWS_ENDPOINT_URL_S3 in the daemon's environment.
"""
import os
import subprocess
import sys

import pytest

import ckfs_util as U

sys.path.insert(0, str(U.REPO / "tests" / "s3"))
import s3env  # noqa: E402

PREFIX = "fx"
SECRET = "SeCrEt/MountDoNotLog+0123456789abcdef"
TOKEN = "SeSsIoN//MountDoNotLog=="
LAYOUTS = ["pytree_zarr2", "pytree_zarr3", "manager", "v1_checkpointables"]

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
    has_opts = "endpoint=" in help_text()

    def make(layout, endpoint=None, *options):
        endpoint = endpoint or env.endpoint
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)
        opts = list(options)
        if has_opts:
            opts.append(f"endpoint={endpoint}")
        n = len(mounts)
        m = U.Mount("placeholder", tmp_path / f"s3m{n}", tmp_path / f"s3m{n}.log", options=opts)
        m.source = f"s3://{s3env.BUCKET}/{PREFIX}/{layout}"  # not a Path: keep the '//'
        mounts.append(m)
        byte = m.start(expect_ready=False)
        if byte != b"s":
            log = m.log()
            m._abort()
            if "No such file or directory" in log and "s3://" in log or "not supported" in log:
                pytest.xfail("waits on fs/: an s3:// SOURCE is not accepted yet")
            raise U.MountError(f"s3 mount failed: {byte!r}\n{log}")
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
