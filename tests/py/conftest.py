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

# The oracle modules (test_oracle_*.py, marker `oracle`) import the real
# Orbax, JAX, TensorStore, zarr 3 and safetensors.  Under an interpreter
# without them (Debian's python3) they are not collected, and the header
# says so; with CKPT_REQUIRE_ORACLES=1 (what scripts/test sets for the
# interpreter of scripts/oracle_env) a missing oracle is an error instead.
_ORACLE_MISSING = U.oracles_missing()
collect_ignore_glob = ["test_oracle_*.py"] if _ORACLE_MISSING and not U.ORACLES_REQUIRED else []


def pytest_collection_modifyitems(config, items):
    if _REASON is None:
        return
    skip = pytest.mark.skip(reason=f"FUSE unavailable: {_REASON}")
    for item in items:
        if item.get_closest_marker("nofuse") is None:
            item.add_marker(skip)


def pytest_report_header(config):
    lines = [f"ckptfs binary: {U.BIN}", f"fixtures: {U.FIXTURES}"]
    if _ORACLE_MISSING:
        lines.append(f"oracle tests (test_oracle_*.py): not collected, {_ORACLE_MISSING} not importable "
                     "(run them with the python that scripts/oracle_env prints)")
    else:
        lines.append("oracle tests: " + U.oracle_versions())
    return lines


@pytest.fixture(scope="session")
def fixtures_dir():
    if not (U.FIXTURES / "expected" / "expected.json").exists():
        pytest.fail(f"fixtures not found at {U.FIXTURES} (set CKPT_FIXTURES)")
    return U.FIXTURES


@pytest.fixture(scope="session")
def expected(fixtures_dir):
    return U.load_expected()


# The fixture layouts every read test runs on; the OCDBT ones carry the
# marker `ocdbt` (-m "not ocdbt" leaves them out).
LAYOUTS = [
    "pytree_zarr2",
    "pytree_zarr3",
    pytest.param("manager", marks=pytest.mark.ocdbt),
    pytest.param("v1_checkpointables", marks=pytest.mark.ocdbt),
]


@pytest.fixture(scope="module", params=LAYOUTS)
def lm(request, module_mount, fixtures_dir):
    """(layout, mount) of each fixture layout, mounted once per module."""
    lay = U.layout(request.param)
    return lay, module_mount(lay.source)


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
