"""A writer gives an array's sharding with setxattr(user.ckpt.sharding) on
its pending NAME.npy; the commit writes it into the item's _sharding
(key: urlsafe base64 of the param name, as Orbax does) and the committed
array shows it as the user.ckpt.sharding xattr.  Bad uses are refused."""

import base64
import errno
import json
import os

import numpy as np

import ckfs_util as U

SHARDING = {"sharding_type": "NamedSharding", "shape": [2], "axis_names": ["x"],
            "axis_types": ["AxisType.Auto"], "partition_spec": ["x", None],
            "device_mesh": {"mesh": [{"id": 0}, {"id": 1}]}}


def test_sharding_from_setxattr(tmp_path, mount):
    src = tmp_path / "root"
    src.mkdir()
    m = mount(src)
    os.makedirs(m.p("7/state/params"))
    w = m.p("7/state/params/w.npy")
    np.save(w, np.arange(16, dtype=np.float32).reshape(4, 4))
    text = json.dumps(SHARDING)
    os.setxattr(w, "user.ckpt.sharding", text.encode())
    assert U.errno_of(os.setxattr, w, "user.ckpt.sharding", b"{not json") == errno.EINVAL
    assert U.errno_of(os.setxattr, w, "user.other", b"1") == errno.ENOTSUP
    open(m.p("7/commit_success.txt"), "w").close()

    on_disk = json.loads((src / "7" / "state" / "_sharding").read_text())
    key = base64.urlsafe_b64encode(b"params.w").decode()
    assert json.loads(on_disk[key]) == SHARDING
    assert json.loads(os.getxattr(m.p("7/state/params/w.npy"), "user.ckpt.sharding")) == SHARDING
    # committed data: a change is refused; the value it has already changes
    # nothing and is accepted (copy tools that preserve xattrs set it)
    shown = os.getxattr(m.p("7/state/params/w.npy"), "user.ckpt.sharding")
    assert U.errno_of(os.setxattr, m.p("7/state/params/w.npy"), "user.ckpt.sharding",
                      shown + b" ") == errno.EROFS
    os.setxattr(m.p("7/state/params/w.npy"), "user.ckpt.sharding", shown)
