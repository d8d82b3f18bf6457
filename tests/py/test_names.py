"""Pytree keys that are unsafe as file names are escaped, never trusted
(docs/usage.md): '%' -> %25 and '/' -> %2F; the arrays behind them still
read back correctly."""

import json
import os
import shutil

import numpy as np

import ckfs_util as U
from ckfs_help import _writable_copy, unsafe_key_item  # noqa: F401


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
