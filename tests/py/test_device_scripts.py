"""The device checks (scripts/device_check_*.py, scripts/device_run.sh) run
for real only on a machine with a GPU, Orbax, JAX and torch.  Here their
--dry-run runs the ckptfs side (mount, write, commit, read back) with the
binary under test, so that what the device machine runs is not first tried
there."""

import os
import shutil
import subprocess
import sys

import ckfs_util as U

SCRIPTS = U.REPO / "scripts"


def run(cmd, env=None, timeout=300):
    p = subprocess.run([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       env=env, timeout=timeout)
    out = p.stdout.decode(errors="replace")
    U.assert_log_clean(out)  # the scripts print a daemon log that holds a sanitizer report
    assert "WARNING: ckptfs exited" not in out, out
    return p.returncode, out


def test_bench_dry_run_saves_and_restores_through_ckptfs(tmp_path):
    rc, out = run([sys.executable, SCRIPTS / "device_check_bench.py", "--dry-run", "--size-mib", "2",
                   "--workers", "3", "--ckptfs", U.BIN, "--work", tmp_path])
    assert rc == 0, out
    assert "| ckptfs    | save (np.save via mount + commit)" in out, out
    assert "| ckptfs    | restore (np.load via mount) -> host" in out, out
    assert "no failures" in out
    assert os.listdir(tmp_path) == [], "the work folder is left behind"


def test_orbax_check_dry_run_commits_a_step(tmp_path):
    rc, out = run([sys.executable, SCRIPTS / "device_check_orbax.py", "--dry-run", "--ckptfs", U.BIN,
                   "--work", tmp_path])
    assert rc == 0, out
    assert "ok   the committed step is on SOURCE" in out and "0 failed" in out, out
    assert os.listdir(tmp_path) == [], "the root or the log is left behind"


def test_safetensors_check_dry_run_mounts_the_source(tmp_path):
    f = U.FIXTURES
    rc, out = run([sys.executable, SCRIPTS / "device_check_safetensors.py", "--dry-run", "--ckptfs", U.BIN,
                   "--source", f / "pytree_zarr3", "params.safetensors", f / "expected"])
    assert rc == 0, out
    assert "7 passed, 0 failed" in out, out


def test_device_run_dry_run_with_a_bundle_folder(tmp_path):
    # a stand-in for the bundle: the layout scripts/bundle makes (the
    # libraries are the system's here)
    b = tmp_path / "bundle" / "ckptfs-test-linux-x"
    (b / "bin").mkdir(parents=True)
    (b / "lib").mkdir()
    shutil.copy2(U.BIN, b / "bin" / "ckptfs")
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, PYTHON=sys.executable, SIZE_MIB="2", WORK=str(work), TIMEOUT="240",
               TMPDIR=str(tmp_path))
    rc, out = run(["bash", SCRIPTS / "device_run.sh", "--dry-run", b], env=env)
    assert rc == 0, out
    assert "device_run: 0 of 3 checks failed" in out, out
    assert out.count("exit status 0") == 3, out
    assert os.listdir(work) == []
    assert sorted(os.listdir(tmp_path)) == ["bundle", "work"], "device_run left its folder behind"
