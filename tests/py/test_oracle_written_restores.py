"""ckptfs → Orbax: every step ckptfs writes is restored by the real Orbax.

Each write path of the mount makes a step in a CheckpointManager root:
- one writer per array (np.save of every dtype, bfloat16 and float8 among
  them, ranks 0 to 3, cp and `cat >`), and slice files from 4 processes,
  pwrite from 2, np.memmap and open_memmap (ckfs_help.write_step);
- two hosts (-o process_index=I,process_count=2) over one folder;
- `cp` of a safetensors file (flat) and of the Hugging Face sharded form;
- `cp -r`, `tar` and `rsync -a` of a step out of a read-only mount;
- an `s3://` root on s3rver (the objects then fetched into a folder).

After the commit the daemon is unmounted and the step is judged without
ckptfs (tests/py/orbax_judge.py, a subprocess per call): the real Orbax
restores it through CheckpointManager + StandardRestore, StandardCheckpointer,
PyTreeCheckpointer + PyTreeRestore, `v1.load` and to numpy, onto 8 CPU
devices with the shardings `_sharding` records and onto one; TensorStore
opens every array with the spec Orbax builds for it, and zarr-python 3 reads
it.  Every array must come back byte for byte with its dtype and shape, and
no array may be missing or extra.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import ckfs_util as U
from ckfs_help import Arr, bf16_patterns, commit, makedirs_in_mount, npy_bytes, rng, write_step

pytestmark = pytest.mark.oracle

ORACLE = Path(__file__).with_name("orbax_judge.py")
# every restore API on both device counts for the richest step; two for the others
ALL_APIS = [("manager", 8), ("manager", 1), ("standard", 8), ("standard", 1), ("pytree", 8), ("pytree", 1),
            ("v1", 8), ("v1", 1), ("numpy", 1)]
TWO_APIS = [("manager", 8), ("v1", 1)]
# data types zarr-python 3.1 does not register (it cannot open Orbax's own
# arrays of them either)
ZARR3_UNKNOWN = {"bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3b11fnuz", "float8_e4m3fnuz",
                 "float8_e5m2fnuz", "int4", "uint4"}


def orbax_restore(root, step, item, api, devices):
    """What the real Orbax, TensorStore and zarr 3 read from item of step."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_ENABLE_X64="1", TF_CPP_MIN_LOG_LEVEL="3")
    p = subprocess.run([sys.executable, str(ORACLE), str(root), str(step), item, "--api", api,
                        "--devices", str(devices)], capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, f"Orbax {api} on {devices} device(s) failed:\n{p.stderr[-4000:]}"
    return json.loads(p.stdout)["arrays"]


def assert_restores(root, step, expected, apis):
    """expected: {item: {key path "a/b/c": Arr}}."""
    for api, devices in apis:
        for item, arrays in expected.items():
            got = orbax_restore(root, step, item, api, devices)
            assert sorted(got) == sorted(arrays), (api, devices, item)
            for key, a in arrays.items():
                g = got[key]
                want = hashlib.sha256(a.raw).hexdigest()
                where = f"{item}/{key} ({api}, {devices} device(s))"
                assert (g["dtype"], tuple(g["shape"])) == (a.dtype, a.shape), where
                assert g["sha256"] == want, f"{where}: Orbax restores other bytes"
                assert g["ts_sha256"] == want, f"{where}: TensorStore reads other bytes ({g['spec']})"
                if "zarr_sha256" in g:
                    if g["zarr_sha256"] is None:  # zarr 3 has no such data type (whoever wrote it)
                        assert a.dtype in ZARR3_UNKNOWN, f"{where}: zarr 3 cannot open it"
                    else:
                        assert g["zarr_sha256"] == want, f"{where}: zarr 3 reads other bytes"
                if "devices" in g and devices > 1:
                    assert set(g["devices"]) <= set(range(devices)), where


def by_item(exp):
    """{rel path "item/a/b.npy": Arr} -> {item: {"a/b": Arr}}."""
    out = {}
    for rel, a in exp.items():
        item, rest = rel.split("/", 1)
        out.setdefault(item, {})[rest[:-4]] = a
    return out


def fresh_root(tmp_path, name):
    root = tmp_path / name
    root.mkdir()
    return root


# ---------------------------------------------------------------------------
# one writer per array, slice files from several processes

@pytest.fixture(scope="module")
def written(tmp_path_factory, module_mount):
    tmp = tmp_path_factory.mktemp("written")
    root = fresh_root(tmp, "root")
    m = module_mount(root)
    os.mkdir(m.p("30"))
    exp = write_step(m.p("30"), tmp, 30, full=True)
    commit(m.p("30"))
    m.unmount()
    return root, by_item(exp)


@pytest.mark.parametrize("api,devices", ALL_APIS, ids=[f"{a}-{d}dev" for a, d in ALL_APIS])
def test_one_writer_per_array_and_slice_writers(written, api, devices):
    root, exp = written
    assert_restores(root, 30, exp, [(api, devices)])


# ---------------------------------------------------------------------------
# two hosts over one folder

def test_two_hosts(tmp_path, mount):
    root = fresh_root(tmp_path, "shared")
    hosts = [mount(root, f"process_index={h}", "process_count=2", "commit_timeout=60") for h in range(2)]
    r = rng(7)
    big = Arr(r.standard_normal((2048, 600)).astype(np.float32), "float32")
    blocks = Arr(bf16_patterns(r, (6, 10, 8)), "bfloat16", "<V2")
    only1 = Arr(r.integers(-5, 5, size=(3, 4), dtype=np.int64), "int64")
    steps = [Path(h.p("30")) for h in hosts]
    for s in steps:
        os.mkdir(s)
        makedirs_in_mount(s, "state/params")
    # host 0 declares the shared arrays; each host writes its half
    (steps[0] / "state/params/big.npy").write_bytes(npy_bytes("<f4", big.shape, b""))
    (steps[0] / "state/params/blocks.npy").write_bytes(npy_bytes("<V2", blocks.shape, b""))
    plan = {0: [("big", "[0:1024]", np.s_[0:1024]), ("blocks", "[0:3]", np.s_[0:3])],
            1: [("big", "[1024:]", np.s_[1024:2048]), ("blocks", "[3:]", np.s_[3:6])]}
    arrs = {"big": big, "blocks": blocks}
    for h, jobs in plan.items():
        for stem, text, sl in jobs:
            (steps[h] / f"state/params/{stem}{text}.npy").write_bytes(arrs[stem].file_bytes(sl))
    (steps[1] / "state/step.npy").write_bytes(only1.file_bytes())
    res = {}

    def touch(h):
        try:
            commit(steps[h])
            res[h] = 0
        except OSError as e:
            res[h] = e.errno

    ts = [threading.Thread(target=touch, args=(h,)) for h in (1, 0)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(300)
    assert res == {0: 0, 1: 0}, (res, hosts[0].log()[-3000:])
    for h in reversed(hosts):
        h.unmount()
    exp = {"state": {"params/big": big, "params/blocks": blocks, "step": only1}}
    assert_restores(root, 30, exp, TWO_APIS)


# ---------------------------------------------------------------------------
# import by cp of a safetensors file, flat and sharded

def st_tensors(seed):
    """A small Llama-like state: {name: Arr}, bfloat16 and float32."""
    r = rng(seed)
    t = {}
    for i in range(2):
        t[f"model.layers.{i}.self_attn.q_proj.weight"] = Arr(bf16_patterns(r, (16, 32)), "bfloat16", "<V2")
        t[f"model.layers.{i}.mlp.up_proj.weight"] = Arr(bf16_patterns(r, (40, 32)), "bfloat16", "<V2")
        t[f"model.layers.{i}.input_layernorm.weight"] = Arr(r.standard_normal((32,)).astype(np.float32), "float32")
    t["model.embed_tokens.weight"] = Arr(bf16_patterns(r, (64, 32)), "bfloat16", "<V2")
    t["model.norm.weight"] = Arr(r.standard_normal((32,)).astype(np.float32), "float32")
    return t


def save_st(path, tensors):
    import ml_dtypes
    from safetensors.numpy import save_file
    arrays = {k: (a.values.view(ml_dtypes.bfloat16) if a.dtype == "bfloat16" else a.values)
              for k, a in tensors.items()}
    save_file(arrays, str(path), metadata={"format": "pt"})


@pytest.mark.parametrize("form", ["flat", "sharded"])
def test_import_of_safetensors(form, tmp_path, mount):
    root = fresh_root(tmp_path, "root")
    m = mount(root)
    tensors = st_tensors(11)
    os.makedirs(m.p("30/state"))
    if form == "flat":
        save_st(tmp_path / "model.safetensors", tensors)
        subprocess.run(["cp", str(tmp_path / "model.safetensors"), m.p("30/state/params.safetensors")],
                       check=True, timeout=120)
    else:
        hf = tmp_path / "hf"
        hf.mkdir()
        names = sorted(tensors)
        parts = [names[0::2], names[1::2]]
        weight_map = {}
        for i, part in enumerate(parts):
            fn = f"model-{i + 1:05d}-of-{len(parts):05d}.safetensors"
            save_st(hf / fn, {k: tensors[k] for k in part})
            weight_map.update({k: fn for k in part})
        (hf / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
        subprocess.run(["cp", "-r", str(hf), m.p("30/state/params.safetensors.d")], check=True, timeout=120)
    commit(m.p("30"))
    m.unmount()
    exp = {"state": {"params/" + k.replace(".", "/"): a for k, a in tensors.items()}}
    assert_restores(root, 30, exp, TWO_APIS)


# ---------------------------------------------------------------------------
# cp -r, tar, rsync -a of a step out of a read-only mount of the real
# Orbax 0.12.4 CheckpointManager fixture (step 20)

COPIES = {
    "cp -r": "cp -r {src} {dst}",
    "tar": "mkdir {dst} && tar -C {src} -cf - . | tar -C {dst} -xf -",
    "rsync -a": "rsync -a {src}/ {dst}/",
}


def fixture_state():
    """{key path: Arr} of the fixture pytree (step 20 of manager/)."""
    out = {}
    for key, e in U.load_expected().items():
        values = np.frombuffer(e.data, dtype=np.uint16 if e.dtype == "bfloat16" else np.dtype(e.dtype))
        out[key.replace(".", "/")] = Arr(values.reshape(e.shape), e.dtype)
    return out


@pytest.mark.parametrize("tool", sorted(COPIES))
def test_copy_of_a_step(tool, tmp_path, mount):
    ro = mount(U.FIXTURES / "manager", "ro")
    root = fresh_root(tmp_path, "root")
    rw = mount(root)
    cmd = COPIES[tool].format(src=ro.p("20"), dst=rw.p("40"))
    p = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    U.wait_until(lambda: "40" in os.listdir(root), timeout=30)
    rw.unmount()
    ro.unmount()
    assert_restores(root, 40, {"state": fixture_state()}, TWO_APIS)


# ---------------------------------------------------------------------------
# an s3:// root

def test_s3_root(tmp_path, monkeypatch):
    sys.path.insert(0, str(U.REPO / "tests" / "s3"))
    import s3env
    why = s3env.available()
    if why:
        pytest.fail(f"the s3:// write path needs s3rver: {why}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "S3RVER")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "S3RVER")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with s3env.S3Env(tmp_path / "s3") as env:
        m = U.Mount("placeholder", tmp_path / "mnt", tmp_path / "daemon.log", options=[f"endpoint={env.endpoint}"])
        m.source = f"s3://{s3env.BUCKET}/run"
        m.start()
        try:
            os.mkdir(m.p("30"))
            exp = write_step(m.p("30"), tmp_path, 31, full=False)
            commit(m.p("30"))
        finally:
            m.unmount()
        # the objects, as they are, into a folder Orbax can open
        local = fresh_root(tmp_path, "fetched")
        c = env.client()
        n = 0
        for page in c.get_paginator("list_objects_v2").paginate(Bucket=s3env.BUCKET, Prefix="run/"):
            for o in page.get("Contents", []):
                dst = local / o["Key"][len("run/"):]
                dst.parent.mkdir(parents=True, exist_ok=True)
                dst.write_bytes(c.get_object(Bucket=s3env.BUCKET, Key=o["Key"])["Body"].read())
                n += 1
        assert n and (local / "30" / "commit_success.txt").exists()
    assert_restores(local, 30, by_item(exp), TWO_APIS)


# ---------------------------------------------------------------------------
# STEP/.stored/: the stored files as they are, copied out with standard tools

@pytest.mark.parametrize("tool", sorted(COPIES))
def test_stored_folder_copy_restores(tool, tmp_path, mount):
    """cp -r / tar / rsync of MNT/20/.stored into a plain folder is a step
    that Orbax restores (the tree view's copy is not: its .npy files sit
    beside metadata that describes other files)."""
    ro = mount(U.FIXTURES / "manager", "ro")
    root = fresh_root(tmp_path, "backup")
    cmd = COPIES[tool].format(src=ro.p("20/.stored"), dst=root / "20")
    p = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    ro.unmount()
    assert not list(root.rglob("*.npy")), "a .stored copy holds the stored files, no .npy view"
    assert_restores(root, 20, {"state": fixture_state()}, TWO_APIS)


def test_stored_folder_from_s3(tmp_path, monkeypatch):
    """The standard-tool download of a step from s3://: cp -r of
    MNT/20/.stored of an s3:// mount restores with Orbax, and the copy's
    progress shows in `ckptfs status`."""
    sys.path.insert(0, str(U.REPO / "tests" / "s3"))
    import s3env
    why = s3env.available()
    if why:
        pytest.fail(f"the s3:// read path needs s3rver: {why}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "S3RVER")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "S3RVER")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with s3env.S3Env(tmp_path / "s3") as env:
        c = env.client()
        src = U.FIXTURES / "manager"
        for f in sorted(src.rglob("*")):
            if f.is_file():
                c.put_object(Bucket=s3env.BUCKET, Key="run/" + str(f.relative_to(src)), Body=f.read_bytes())
        m = U.Mount("placeholder", tmp_path / "mnt", tmp_path / "daemon.log",
                    options=[f"endpoint={env.endpoint}", "ro"])
        m.source = f"s3://{s3env.BUCKET}/run"
        m.start()
        local = fresh_root(tmp_path, "fetched")
        try:
            p = subprocess.run(["cp", "-r", m.p("20/.stored"), str(local / "20")], capture_output=True,
                               text=True, timeout=300)
            assert p.returncode == 0, p.stderr
            st = subprocess.run([str(U.BIN), "status", str(m.path)], capture_output=True, text=True, timeout=60)
            assert "copied out of STEP/.stored: " in st.stdout, st.stdout
        finally:
            m.unmount()
    assert_restores(local, 20, {"state": fixture_state()}, TWO_APIS)
