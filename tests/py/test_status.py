"""`ckptfs status MOUNTPOINT`: the pending steps of a mount with
their progress (arrays declared, bytes stored so far) and the mount's
counters (bytes received / stored / buffered, commits, errors, cache), as
text or --json; --watch repeats (redraws on a terminal)."""

import json
import subprocess

import numpy as np

import ckfs_util as U


def status(*args, check=0):
    p = subprocess.run([str(U.BIN), "status", *map(str, args)], capture_output=True, text=True, timeout=60)
    U.assert_log_clean(p.stderr)
    assert p.returncode == check, f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p


def test_pending_step_progress_then_commit(tmp_path, mount):
    src = tmp_path / "src"
    src.mkdir()
    m = mount(src)
    out = status(m.p()).stdout
    assert "no pending step" in out and "commits: 0" in out, out
    assert "cache in use: " in out, out
    (m.p("30") / "state").mkdir(parents=True)
    np.save(m.p("30/state/w.npy"), np.arange(200000, dtype=np.float32).reshape(200, 1000))
    np.save(m.p("30/state/b.npy"), np.arange(10, dtype=np.int32))
    out = status(m.p()).stdout
    assert "pending step 30: 2 arrays declared" in out, out
    j = json.loads(status("--json", m.p()).stdout)
    assert j["source"] == str(src)
    [p] = j["pending"]
    assert p["step"] == "30" and p["arrays"] == 2
    assert p["declared_bytes"] >= 800040 and p["stored_bytes"] > 0
    assert j["stats"]["bytes_written"] >= 800040 and j["stats"]["errors"] == 0
    open(m.p("30/commit_success.txt"), "w").close()
    j = json.loads(status("--json", m.p()).stdout)
    assert j["pending"] == [] and j["stats"]["commits"] == 1, j
    # the commit read the step back: the cache holds some of it, within its budget
    np.load(m.p("30/state/w.npy"))
    j = json.loads(status("--json", m.p()).stdout)
    assert 0 < j["stats"]["cache_bytes"] <= j["stats"]["cache_budget"], j["stats"]


def test_watch_repeats(tmp_path, mount):
    src = tmp_path / "src"
    src.mkdir()
    m = mount(src)
    out = status("--watch", "--interval", "0.05", "--count", "3", m.p()).stdout
    assert out.count("ckptfs mount of") == 3, out
    assert "\033[" not in out  # no redraw codes when stdout is no terminal


def test_not_a_mount_and_usage(tmp_path):
    p = status(tmp_path, check=1)
    assert "not a ckptfs mount" in p.stderr
    status(check=2)
    status("--bogus", tmp_path, check=2)
