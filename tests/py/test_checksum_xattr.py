"""Which arrays carry a data checksum: the user.ckpt.checksum
xattr of an array file says what protects its stored bytes, read from the
metadata and from the header of the first stored zstd frame
(Content_Checksum_flag), and `ckptfs verify` names the arrays that have
none.  Orbax writes zstd frames without checksums; steps written by ckptfs
carry them, and a shard index CRC-32C."""

import os
import shutil
import subprocess

import numpy as np
import pytest

import ckfs_util as U


def xattr(path):
    return os.getxattr(path, "user.ckpt.checksum").decode()


@pytest.fixture(scope="module")
def written(tmp_path_factory, module_mount):
    src = tmp_path_factory.mktemp("ck") / "src"
    shutil.copytree(U.FIXTURES / "manager", src)
    m = module_mount(src)
    step = m.p("30")
    (step / "state").mkdir(parents=True)
    np.save(step / "state" / "w.npy", np.arange(60000, dtype=np.float32).reshape(600, 100))
    open(step / "commit_success.txt", "w").close()
    m.unmount()
    return src


@pytest.mark.parametrize("layout", ["manager", "pytree_zarr2", "pytree_zarr3"])
def test_orbax_arrays_have_no_data_checksum(mount, layout):
    """Orbax's zstd frames carry no checksum; its zarr3 shards have an index
    CRC-32C (which covers the offsets, not the data)."""
    lay = U.layout(layout)
    m = mount(lay.source)
    assert lay.arrays
    for rel in sorted(lay.arrays):
        v = xattr(m.p(rel))
        assert v in ("none", "crc32c-index"), (rel, v)
        assert "user.ckpt.checksum" in os.listxattr(m.p(rel))


def test_ckptfs_written_step_has_frame_and_index_checksums(written, mount):
    m = mount(written, "ro")
    v = xattr(m.p("30/state/w.npy")).split(",")
    assert "zstd-frame" in v and "crc32c-index" in v, v
    # a slice file answers for the same stored array
    assert xattr(m.p("30/state/w[0:2,:].npy")) == ",".join(v)


def test_verify_names_arrays_without_checksum(written):
    p = subprocess.run([str(U.BIN), "verify", str(written)], capture_output=True, text=True, timeout=120)
    U.assert_log_clean(p.stderr)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("ckptfs verify:") and "OK," in lines[0], p.stdout
    note = [ln for ln in lines if "carry no data checksum" in ln]
    assert len(note) == 1, p.stdout
    assert "20 of 21 arrays" in note[0], note
    assert "30/state/w.npy" not in note[0]
    # only the written step: every array has a checksum, no note
    p = subprocess.run([str(U.BIN), "verify", str(written), "30"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "no data checksum" not in p.stdout, p.stdout
