"""The subcommands that need no mount: `ckptfs info` (metadata table, text and
--json) and `ckptfs verify` (decode everything, exit 1 on any problem), on
the fixtures and on a step written through a mount; and --help, which must
agree with the man page and the README."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import ckfs_util as U

LAYOUTS = ["manager", "pytree_zarr2", "pytree_zarr3", "pytree_ocdbt_zarr2", "std_ocdbt_zarr3",
           "v1_checkpointables", "v1_pytree"]


def run(*args, check=None):
    p = subprocess.run([str(U.BIN), *map(str, args)], capture_output=True, text=True, timeout=120)
    U.assert_log_clean(p.stderr)  # no sanitizer report (exit status 1 is also verify's)
    if check is not None:
        assert p.returncode == check, f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return p


@pytest.fixture(scope="module")
def written(tmp_path_factory, module_mount):
    """A copy of the manager fixture with step 30 written and committed by
    ckptfs (zarr3 + sharding + zstd with frame checksums)."""
    base = tmp_path_factory.mktemp("written")
    src = base / "src"
    shutil.copytree(U.FIXTURES / "manager", src)
    m = module_mount(src)
    step = m.p("30")
    (step / "state").mkdir(parents=True)
    np.save(step / "state" / "w.npy", np.arange(60000, dtype=np.float32).reshape(600, 100))
    np.save(step / "state" / "b.npy", np.arange(10, dtype=np.int32))
    open(step / "commit_success.txt", "w").close()
    m.unmount()
    return src


def copy_of(src, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(src, dst)
    return dst


# ---- info -------------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
def test_info_json_lists_every_array(layout, expected):
    p = run("info", "--json", U.FIXTURES / layout, check=0)
    j = json.loads(p.stdout)
    arrays = j["arrays"]
    assert arrays, p.stdout
    nsteps = max(1, len(j["steps"]))
    assert j["total"]["arrays"] == len(arrays)
    for a in arrays:
        assert a["dtype"] and isinstance(a["shape"], list) and isinstance(a["chunks"], list)
        itemsize = {"bfloat16": 2, "float32": 4, "int32": 4, "float16": 2, "int64": 8, "float64": 8}
        if a["dtype"] in itemsize:
            assert a["logical_bytes"] == int(np.prod(a["shape"], dtype=np.int64)) * itemsize[a["dtype"]], a
        assert a["stored_bytes"] > 0
    assert sum(d["arrays"] for d in j["dtypes"]) == len(arrays)
    assert sum(i["logical_bytes"] for i in j["items"]) == j["total"]["logical_bytes"]
    # the expected arrays of the fixtures all appear (in every step)
    keys = {a["key"].replace("/", ".") for a in arrays}
    for name in expected:
        if layout != "v1_checkpointables":
            assert name in keys, (name, sorted(keys))
    assert len(arrays) % nsteps == 0


def test_info_text_manager():
    p = run("info", "--all", U.FIXTURES / "manager", check=0)
    out = p.stdout
    assert "CheckpointManager root" in out
    assert re.search(r"^steps \(2\): 10 20$", out, re.M), out
    assert "step 10, item state" in out and "step 20, item state" in out
    assert re.search(r"params/layer_0/mlp/w1\s+bfloat16\s+\[32,128\]\s+\[16,32\]\s+8\.0 KiB", out), out
    assert "per dtype:" in out
    assert re.search(r"^total: 20 arrays", out, re.M), out


def test_info_path_limits_to_a_step():
    j = json.loads(run("info", "--json", U.FIXTURES / "manager", "20/state/params", check=0).stdout)
    assert j["steps"] == ["20"]
    assert j["arrays"] and all(a["path"].startswith("20/state/params/") for a in j["arrays"])


def test_info_errors(tmp_path):
    assert run("info", tmp_path / "nope").returncode == 1
    p = run("info", U.FIXTURES / "manager", "99")
    assert p.returncode == 1 and "99" in p.stderr
    assert run("info").returncode == 2
    assert run("info", "--bogus", U.FIXTURES / "manager").returncode == 2


def test_info_reads_no_array_data(written, tmp_path):
    """info on a step whose chunks are all garbage still answers, with no
    error: it never decodes a chunk."""
    src = copy_of(written, tmp_path)
    for f in (src / "30" / "state").rglob("*"):
        if f.is_file() and "c" in f.relative_to(src / "30" / "state").parts:
            f.write_bytes(b"\xff" * f.stat().st_size)
    p = run("info", "--json", src, "30", check=0)
    assert "error" not in p.stderr, p.stderr
    j = json.loads(p.stdout)
    w = [a for a in j["arrays"] if a["key"] == "w"][0]
    assert w["shape"] == [600, 100] and w["dtype"] == "float32" and w["logical_bytes"] == 240000
    assert w["format"] == "zarr3"


def test_info_during_a_pending_step(written, mount, tmp_path):
    src = copy_of(written, tmp_path)
    m = mount(src)
    (m.p("40") / "state").mkdir(parents=True)
    np.save(m.p("40/state/x.npy"), np.ones(5, np.float32))
    j = json.loads(run("info", "--json", src, check=0).stdout)
    assert j["steps"] == ["10", "20", "30"]  # the pending step is not a step yet
    assert run("verify", src).returncode == 0


# ---- verify -----------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
def test_verify_fixtures_ok(layout):
    p = run("verify", U.FIXTURES / layout, check=0)
    assert re.search(r"OK, \d+ arrays", p.stdout), p.stdout


def test_verify_written_step_ok(written):
    p = run("verify", written, "30", check=0)
    assert "OK, 2 arrays" in p.stdout


def shard_of(src, name):
    return src / "30" / "state" / name / "c" / "0" / "0" if name == "w" else src / "30" / "state" / name / "c" / "0"


def test_verify_flipped_data_byte(written, tmp_path):
    src = copy_of(written, tmp_path)
    f = shard_of(src, "w")
    b = bytearray(f.read_bytes())
    b[100] ^= 0x01  # inside the first zstd frame (frame checksums catch any flip)
    f.write_bytes(bytes(b))
    p = run("verify", src, check=1)
    assert "30/state/w.npy" in p.stdout and "zstd" in p.stdout, p.stdout
    assert "1 problem" in p.stdout
    assert run("verify", src, "10").returncode == 0  # other steps unaffected


def test_verify_missing_chunk(written, tmp_path):
    src = copy_of(written, tmp_path)
    shard_of(src, "b").unlink()
    p = run("verify", src, check=1)
    assert re.search(r"30/state/b\.npy: 1 of 1 stored chunks missing", p.stdout), p.stdout


def test_verify_corrupt_shard_index(written, tmp_path):
    src = copy_of(written, tmp_path)
    f = shard_of(src, "w")
    b = bytearray(f.read_bytes())
    b[-8] ^= 0x40  # inside the index (the last 4 bytes are its CRC-32C)
    f.write_bytes(bytes(b))
    p = run("verify", src, check=1)
    assert "30/state/w.npy" in p.stdout and "CRC-32C" in p.stdout, p.stdout


def test_verify_garbage_chunk_in_orbax_fixture(tmp_path):
    src = tmp_path / "z3"
    shutil.copytree(U.FIXTURES / "pytree_zarr3", src)
    (src / "params.layer_0.mlp.b1" / "c" / "3").write_bytes(b"not a zstd frame")
    p = run("verify", src, check=1)
    assert "params/layer_0/mlp/b1.npy" in p.stdout, p.stdout


def test_verify_usage_and_bad_step(tmp_path):
    assert run("verify").returncode == 2
    assert run("verify", U.FIXTURES / "manager", "77").returncode == 1
    assert run("verify", tmp_path / "missing").returncode == 1


# ---- --help, man page, README -------------------------------------------------

def help_options():
    out = run("--help", check=0).stdout
    ours = out.split("FUSE options:")[0]  # libfuse's own list follows
    return out, set(re.findall(r"-o ([a-z_]+)", ours))


def test_help_mentions_everything():
    out, opts = help_options()
    for word in ("writable", "commit_success.txt", "NAME[0:8,:].npy", ".shards/", ".safetensors",
                 ".ckptfs/stats", "info", "verify", "ckptfs(1)", "zsh"):
        assert word in out, word
    assert "read-only as a tree" not in out
    assert {"log_file", "ready_file", "uid", "umask", "allow_other_writes", "cache_size", "ro"} <= opts


def test_man_page_and_readme_agree_with_help():
    _, opts = help_options()
    man = (U.REPO / "docs" / "ckptfs.1").read_text()
    readme = (U.REPO / "README.md").read_text()
    usage = (U.REPO / "docs" / "usage.md").read_text()
    for o in opts:
        assert re.search(r"\b" + o.replace("_", r"\\?_") + r"\b", man), f"man page lacks -o {o}"
        assert o in usage, f"docs/usage.md lacks -o {o}"
    for word in ("ckptfs info", "ckptfs verify", "fuse.ckptfs", "/usr/bin/python3"):
        assert word in readme, word
    assert "EXIT STATUS" in man and "fstab" in man and "zsh" in man
    # object-store sources: --help, the man page and the README's opening paragraph name both
    opening = readme.split("\n## ")[0]
    for scheme in ("s3://", "gs://"):
        assert scheme in help_options()[0] and scheme in man and scheme in opening, scheme


def test_verify_progress_only_on_a_terminal():
    import pty
    master, slave = pty.openpty()
    try:
        p = subprocess.run([str(U.BIN), "verify", str(U.FIXTURES / "manager")], stdout=subprocess.PIPE,
                           stderr=slave, text=True, timeout=120)
        os.close(slave)
        slave = None
        tty = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            tty += chunk
    finally:
        if slave is not None:
            os.close(slave)
        os.close(master)
    assert p.returncode == 0
    assert b"verify: 20/20 arrays" in tty and b"ETA" in tty, tty
    assert "\r" not in p.stdout and "ETA" not in p.stdout
    plain = run("verify", U.FIXTURES / "manager", check=0)
    assert "ETA" not in plain.stderr


def test_version_is_the_cmake_project_version():
    cml = (U.REPO / "CMakeLists.txt").read_text()
    want = re.search(r"project\(ckptfs\s+VERSION\s+([0-9.]+)", cml).group(1)
    for flag in ("--version", "-V"):
        p = run(flag, check=0)
        assert p.stdout.endswith("\n"), repr(p.stdout)
        assert p.stdout.split()[:2] == ["ckptfs", want], repr(p.stdout)
