"""Ordinary tools see each array once (no slice, shard or safetensors
companions in the listing) and copy it byte-exact: cp -r, tar, du, find."""

import filecmp
import os
import subprocess
import tarfile

import ckfs_util as U


def test_cp_tar_find_du(tmp_path, mount, expected):
    m = mount(U.FIXTURES / "pytree_zarr3")
    root = m.p("")
    found = subprocess.run(["find", root, "-type", "f"], capture_output=True, text=True, check=True).stdout.split()
    names = [os.path.relpath(f, root) for f in found]
    assert not [n for n in names if "[" in n or n.endswith((".safetensors", ".shards")) or ".ckptfs" in n]
    assert sum(n.endswith(".npy") for n in names) == len(expected)

    dst = tmp_path / "copy"
    subprocess.run(["cp", "-r", root, str(dst)], check=True)
    cmp = filecmp.dircmp(root, dst)
    assert not cmp.left_only and not cmp.right_only and not cmp.diff_files
    for rel in names:
        assert filecmp.cmp(os.path.join(root, rel), dst / rel, shallow=False), rel

    tar = tmp_path / "c.tar"
    subprocess.run(["tar", "-cf", str(tar), "-C", root, "."], check=True)
    with tarfile.open(tar) as t:
        members = [x.name for x in t.getmembers() if x.isfile()]
    assert sorted(os.path.normpath(x) for x in members) == sorted(names)

    du = subprocess.run(["du", "-sb", root], capture_output=True, text=True, check=True).stdout.split()[0]
    assert int(du) >= sum(os.path.getsize(f) for f in found)
