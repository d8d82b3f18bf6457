"""Pytree keys that are unsafe as file names are escaped, never trusted
(docs/usage.md): '%' -> %25 and '/' -> %2F; the arrays behind them still
read back correctly."""

import json
import os
import shutil

import numpy as np

import ckfs_util as U


def _writable_copy(src, dst):
    shutil.copytree(src, dst)
    for d, dirs, files in os.walk(dst):
        os.chmod(d, 0o755)
        for f in files:
            os.chmod(os.path.join(d, f), 0o644)


def unsafe_key_item(src):
    """A writable copy of pytree_zarr2 at src whose keys "step" and
    opt_state "count" are renamed to "we/ird" and "100%" (metadata and
    store folders), shown as we%2Fird.npy and opt_state/100%25.npy."""
    _writable_copy(U.FIXTURES / "pytree_zarr2", src)
    meta = json.loads((src / "_METADATA").read_text())
    tree = meta["tree_metadata"]
    # key "step" -> "we/ird": its param name (and store folder) becomes we/ird
    entry = tree.pop("('step',)")
    entry["key_metadata"][0]["key"] = "we/ird"
    tree["('we/ird',)"] = entry
    os.makedirs(src / "we")
    os.rename(src / "step", src / "we" / "ird")
    # key "count" -> "100%": param opt_state.100%
    entry = tree["('opt_state', 'count')"]
    entry["key_metadata"][1]["key"] = "100%"
    os.rename(src / "opt_state.count", src / "opt_state.100%")
    (src / "_METADATA").write_text(json.dumps(meta))


def test_unsafe_keys_are_escaped(tmp_path, mount, expected):
    src = tmp_path / "item"
    unsafe_key_item(src)

    m = mount(src)
    assert "we%2Fird.npy" in os.listdir(m.p(""))
    assert "100%25.npy" in os.listdir(m.p("opt_state"))
    for name in os.listdir(m.p("")):
        assert "/" not in name and name not in (".", "..", "")
    step = np.load(m.p("we%2Fird.npy"))
    assert step.tobytes() == expected["step"].data
    count = np.load(m.p("opt_state/100%25.npy"))
    assert count.tobytes() == expected["opt_state.count"].data
