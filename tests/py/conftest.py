"""pytest fixtures for the ckptfs black-box tests.

`mount` (per test) and `module_mount` (per test module) are factories:

    m = mount(source_folder, "cache_size=64K", ...)   # options go to -o
    m.p("params/layer_0/mlp/w1.npy")                   # a path inside the mount

Every daemon runs in the foreground (-f) in its own session, reports
readiness on a pipe (-o ready_fd=N) and logs to daemon.log beside its mount
point.  At teardown each mount is unmounted with fusermount3 -u, the daemon
must exit with code 0, the mount point must be gone, and the log must hold
no sanitizer report.
"""

import pytest

import ckfs_util as U

_REASON = U.fuse_unavailable_reason()


def pytest_collection_modifyitems(config, items):
    if _REASON is None:
        return
    skip = pytest.mark.skip(reason=f"FUSE unavailable: {_REASON}")
    for item in items:
        item.add_marker(skip)


def pytest_report_header(config):
    return [f"ckptfs binary: {U.BIN}", f"fixtures: {U.FIXTURES}"]


@pytest.fixture(scope="session")
def fixtures_dir():
    if not (U.FIXTURES / "expected" / "expected.json").exists():
        pytest.fail(f"fixtures not found at {U.FIXTURES} (set CKPT_FIXTURES)")
    return U.FIXTURES


@pytest.fixture(scope="session")
def expected(fixtures_dir):
    return U.load_expected()


@pytest.fixture
def mount(tmp_path):
    f = U.MountFactory(tmp_path / "mounts")
    try:
        yield f
    finally:
        f.close()


@pytest.fixture(scope="module")
def module_mount(tmp_path_factory):
    f = U.MountFactory(tmp_path_factory.mktemp("mounts"))
    try:
        yield f
    finally:
        f.close()
