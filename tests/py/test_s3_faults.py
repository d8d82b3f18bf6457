"""Object storage under faults: never a wrong listing, never a partial step,
never a changed tree.

Every case drives a real mount through the project's fault proxy
(tests/s3/faultproxy.py, between the daemon and s3rver on loopback):

  listings   cut-off pages, pages that are not listings (HTML, random bytes,
             an <Error> sent with 200), malformed <Size>, looping
             continuation tokens, a truncated page without a token;
  reads      a bad Content-Range, a 200 with the whole object to a range
             request, 404 for listed keys, 503 storms on metadata;
  the marker an uncertain commit-marker PUT (applied, then the connection
             reset, then 503s or a 412; not applied; not settled at all).

Each asserts: no wrong step list, no committed partial step, EIO where data
cannot be read, the tree's shape unchanged (an unreadable _METADATA never
makes arrays appear flat), recovery once the fault ends, and bounded time.
Every file operation runs in a child process with a deadline, so that an
endless loop fails the test instead of hanging it.

With CKPT_FAULT_REPORT=FILE the tally per fault kind (reads tried, exact,
clear errors, wrong, wrong listings, partial committed steps) is written to
FILE as JSON at the end of the module.
"""
import errno
import hashlib
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import ckfs_util as U

sys.path.insert(0, str(U.REPO / "tests" / "s3"))
import s3env  # noqa: E402

pytestmark = pytest.mark.skipif(bool(s3env.available()), reason=s3env.available())

PREFIX = "ff"
OP_TIMEOUT = 60  # seconds one file operation may take (retries are bounded far below)
TALLY = {}


def tally(kind, **counts):
    t = TALLY.setdefault(kind, {"reads": 0, "exact": 0, "clear_errors": 0, "wrong": 0, "wrong_listings": 0,
                                "partial_committed_steps": 0})
    for k, v in counts.items():
        t[k] += v


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    path = os.environ.get("CKPT_FAULT_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump(TALLY, f, indent=1, sort_keys=True)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    with s3env.S3Env(tmp_path_factory.mktemp("s3f")) as e:
        e.upload_tree(U.FIXTURES / "manager", f"{PREFIX}/manager")
        e.put(f"{PREFIX}/p.safetensors", (U.FIXTURES / "params.safetensors").read_bytes())
        yield e


@pytest.fixture
def s3mount(tmp_path, monkeypatch, env):
    """s3mount(layout, *options, scheme="s3", direct=False, expect=b"s") ->
    Mount of s3://ckpt/ff/<layout> through the fault proxy (direct: not)."""
    mounts = []
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "S3RVER")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "S3RVER")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))

    def make(layout, *options, scheme="s3", direct=False, expect=b"s"):
        ep = env.endpoint if direct else env.proxy_endpoint
        opts = ["retries=3", "retry_base_ms=5", "timeout_ms=5000"] + list(options) + [f"endpoint={ep}"]
        n = len(mounts)
        m = U.Mount("placeholder", tmp_path / f"m{n}", tmp_path / f"m{n}.log", options=opts)
        m.source = f"{scheme}://{s3env.BUCKET}/{PREFIX}/{layout}"
        mounts.append(m)
        byte = m.start(expect_ready=False)
        if byte != expect:
            log = m.log()
            m._abort()
            raise U.MountError(f"mount: {byte!r}, expected {expect!r}\n{log}")
        if byte != b"s":
            m._abort()
        return m

    yield make
    env.fault("clear")
    for m in reversed(mounts):
        if not m.closed:
            m.unmount(check=False)


# ---- operations in a child process, each with a deadline ----------------------

_CHILD = r"""
import hashlib, json, os, sys
op, path = sys.argv[1], sys.argv[2]
try:
    if op == "read":
        with open(path, "rb") as f:
            print(json.dumps({"sha": hashlib.sha256(f.read()).hexdigest()}))
    elif op == "list":
        print(json.dumps({"names": sorted(os.listdir(path))}))
    elif op == "walk":
        out = {}
        for d, dirs, files in os.walk(path, onerror=lambda e: (_ for _ in ()).throw(e)):
            dirs.sort()
            rel = os.path.relpath(d, path)
            out[rel] = sorted(dirs + files)
            for fn in files:
                with open(os.path.join(d, fn), "rb") as f:
                    out[fn if rel == "." else os.path.join(rel, fn)] = hashlib.sha256(f.read()).hexdigest()
        print(json.dumps({"tree": out}))
    elif op == "touch":
        open(path, "w").close()
        print(json.dumps({"ok": 1}))
except OSError as e:
    print(json.dumps({"errno": e.errno}))
"""


def op(kind, path, timeout=OP_TIMEOUT):
    """Run one operation; its result dict, with "timeout" when it took too long
    and "secs" always."""
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-c", _CHILD, kind, str(path)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = p.communicate(timeout=timeout)
        out = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else {"crash": stderr[-2000:]}
    except subprocess.TimeoutExpired:
        # a child stuck in a request the daemon never answers cannot be
        # waited for: it ends when the mount goes (at teardown)
        p.kill()
        out = {"timeout": True}
    out["secs"] = time.monotonic() - t0
    return out


def ref_tree(root):
    r = op("walk", root)
    assert "tree" in r, r
    return r["tree"]


def flat_names(tree):
    """Array files named with '.'-joined key paths: the shape an unreadable
    _METADATA used to fall back to."""
    return [k for k in tree if k.endswith(".npy") and "." in os.path.basename(k)[:-4]]


def judge_read(kind, got, want_sha, may_fail):
    """Count one read: exact, a clear EIO (when the fault lasts), or wrong."""
    tally(kind, reads=1)
    if got.get("sha") == want_sha:
        tally(kind, exact=1)
        return "exact"
    if may_fail and got.get("errno") == errno.EIO:
        tally(kind, clear_errors=1)
        return "eio"
    tally(kind, wrong=1)
    return "wrong"


def judge_list(kind, got, want, may_fail):
    tally(kind, reads=1)
    if got.get("names") == want:
        tally(kind, exact=1)
        return "exact"
    if may_fail and got.get("errno") == errno.EIO:
        tally(kind, clear_errors=1)
        return "eio"
    tally(kind, wrong=1, wrong_listings=1)
    return "wrong"


def q(prefix):
    """The end of a delimiter listing request of `prefix` (a fault match)."""
    return "prefix=" + prefix.replace("/", "%2F") + "$"


ARRAY = "20/state/params/layer_0/attn/q_proj.npy"


@pytest.fixture(scope="module")
def reference(tmp_path_factory, env):
    """The manager's tree and bytes as a mount without faults shows them."""
    d = tmp_path_factory.mktemp("ref")
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "S3RVER")
    m = U.Mount("placeholder", d / "m", d / "m.log",
                options=[f"endpoint={env.endpoint}"])
    m.source = f"s3://{s3env.BUCKET}/{PREFIX}/manager"
    env_keys = {"AWS_ACCESS_KEY_ID": "S3RVER", "AWS_SECRET_ACCESS_KEY": "S3RVER",
                "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"}
    old = {k: os.environ.get(k) for k in env_keys}
    os.environ.update(env_keys)
    try:
        m.start()
        tree = ref_tree(m.p())
        root = sorted(os.listdir(m.p()))
    finally:
        m.unmount(check=False)
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert "20" in root and "10" in root
    assert ARRAY in tree and not flat_names(tree)
    return {"tree": tree, "root": root}


# ---- listings -------------------------------------------------------------------

ROOT = f"{PREFIX}/manager/"
PAGE_FAULTS = [("cut", f"<CommonPrefixes><Prefix>{ROOT}20/"), ("html", ""), ("random", ""), ("error200", "")]


@pytest.mark.parametrize("scheme", ["s3", "gs"])
@pytest.mark.parametrize("mode,arg", PAGE_FAULTS, ids=[m for m, _ in PAGE_FAULTS])
def test_a_bad_root_listing_page_never_becomes_a_step_list(env, s3mount, reference, mode, arg, scheme):
    kind = f"listing page: {mode}"
    # transient (fewer bad pages than retries): the exact step list
    env.fault("clear")
    env.fault(mode, arg, count=2, match=q(ROOT))
    t0 = time.monotonic()
    m = s3mount("manager", scheme=scheme)
    got = op("list", m.p())
    got["names"] = [n for n in got.get("names", []) if n != ".ckptfs"] if "names" in got else None
    if got["names"] is None:
        del got["names"]
    assert judge_list(kind, got, reference["root"], False) == "exact", (got, m.log()[-3000:])
    assert time.monotonic() - t0 < OP_TIMEOUT
    # lasting: the mount is refused with EIO, never a root with a step missing
    env.fault("clear")
    env.fault(mode, arg, count=10 ** 6, match=q(ROOT))
    t0 = time.monotonic()
    tally(kind, reads=1)
    try:
        m2 = s3mount("manager", scheme=scheme)
    except U.MountError as e:
        tally(kind, clear_errors=1)
        assert "Input/output error" in str(e) and "LIST" in str(e) and "not a valid listing" in str(e), str(e)[-3000:]
    else:
        names = sorted(n for n in os.listdir(m2.p()) if n != ".ckptfs")
        tally(kind, wrong=int(names != reference["root"]), wrong_listings=int(names != reference["root"]),
              exact=int(names == reference["root"]))
        raise AssertionError(f"a mount over bad listing pages shows {names}\n{m2.log()[-3000:]}")
    assert time.monotonic() - t0 < OP_TIMEOUT
    # the fault ends: the same mount command works
    env.fault("clear")
    m3 = s3mount("manager", scheme=scheme)
    got = op("list", m3.p())
    got["names"] = [n for n in got.get("names", []) if n != ".ckptfs"]
    assert judge_list(kind, got, reference["root"], False) == "exact"


@pytest.mark.parametrize("mode,arg", PAGE_FAULTS, ids=[m for m, _ in PAGE_FAULTS])
def test_a_rescan_over_bad_pages_keeps_the_step_list(env, s3mount, reference, mode, arg):
    """A mounted root is listed again every second: a rescan that meets a
    bad page (or cannot check a step's marker) keeps the list it had, so a
    step never vanishes and "the latest step" never goes back."""
    kind = f"listing page: {mode}"
    env.fault("clear")
    m = s3mount("manager")
    assert sorted(n for n in os.listdir(m.p()) if n != ".ckptfs") == reference["root"]
    env.fault(mode, arg, count=10 ** 6, match=q(ROOT))
    for _ in range(4):
        time.sleep(1.1)  # a rescan is due
        got = op("list", m.p())
        if "names" in got:
            got["names"] = [n for n in got["names"] if n != ".ckptfs"]
        assert judge_list(kind, got, reference["root"], False) == "exact", (got, m.log()[-3000:])
    assert "LIST prefix" in m.log()
    env.fault("clear")
    got = op("read", m.p(ARRAY))
    assert judge_read(kind, got, reference["tree"][ARRAY], False) == "exact"


STEP20 = f"{PREFIX}/manager/20/"
STEP_FAULTS = [("cut", f"<CommonPrefixes><Prefix>{STEP20}state/"), ("html", ""), ("random", ""),
               ("error200", ""), ("notoken", ""), ("loop", "t1,t2")]


@pytest.mark.parametrize("mode,arg", STEP_FAULTS, ids=[m for m, _ in STEP_FAULTS])
def test_a_bad_step_listing_is_eio_and_never_a_smaller_step(env, s3mount, reference, mode, arg):
    kind = f"listing page: {mode}" if mode not in ("notoken", "loop") else f"listing: {mode}"
    env.fault("clear")
    m = s3mount("manager")
    assert "20" in os.listdir(m.p())
    env.fault(mode, arg, count=10 ** 6, match=q(STEP20))
    for _ in range(2):  # the failure is not remembered: each lookup tries again
        got = op("list", m.p("20"))
        assert not got.get("timeout"), f"{mode}: listing 20/ did not end within {OP_TIMEOUT}s"
        assert judge_list(kind, got, sorted(n for n in reference["tree"]["20"]), True) == "eio", got
        got = op("read", m.p(ARRAY))
        assert judge_read(kind, got, reference["tree"][ARRAY], True) == "eio", got
    log = m.log()
    assert f"LIST prefix '{STEP20}'" in log, log[-3000:]
    env.fault("clear")
    got = op("walk", m.p("20"))
    want = {k[3:] if k.startswith("20/") else ".": v for k, v in reference["tree"].items()
            if k == "20" or k.startswith("20/")}
    tally(kind, reads=1)
    assert got.get("tree") == want, (got, log[-3000:])
    tally(kind, exact=1)


def test_a_malformed_size_in_a_listing_is_eio_and_never_a_flat_tree(env, s3mount, reference):
    kind = "listing: malformed <Size>"
    env.fault("clear")
    m = s3mount("manager")
    # every listing below step 20 (the step's own lists its files' sizes)
    env.fault("badsize", count=10 ** 6, match="prefix=" + STEP20.replace("/", "%2F"))
    for _ in range(2):
        got = op("read", m.p("20/commit_success.txt"))
        assert judge_read(kind, got, reference["tree"]["20/commit_success.txt"], True) == "eio", got
        got = op("list", m.p("20"))
        assert judge_list(kind, got, sorted(reference["tree"]["20"]), True) == "eio", got
        got = op("read", m.p(ARRAY))
        assert judge_read(kind, got, reference["tree"][ARRAY], True) == "eio", got
    env.fault("clear")
    got = op("walk", m.p("20"))
    want = {k[3:] if k.startswith("20/") else ".": v for k, v in reference["tree"].items()
            if k == "20" or k.startswith("20/")}
    tally(kind, reads=1)
    assert got.get("tree") == want, (got, m.log()[-3000:])
    tally(kind, exact=1)


# ---- reads of metadata and data -------------------------------------------------

META = f"/ckpt/{PREFIX}/manager/20/state/_METADATA"
META_FAULTS = [
    ("503 storm (GET+HEAD)", "status", "503:SlowDown", f"{PREFIX}/manager/20/state/_METADATA"),
    ("404 for a listed key", "status", "404:NoSuchKey", f"GET {META}"),
    ("bad Content-Range", "badrange", "", f"GET {META}"),
]


@pytest.mark.parametrize("name,mode,arg,match", META_FAULTS, ids=[x[0] for x in META_FAULTS])
def test_an_unreadable_metadata_file_is_eio_and_never_changes_the_shape(env, s3mount, reference, name, mode,
                                                                         arg, match):
    """_METADATA listed but unreadable: every lookup below the step fails
    with EIO and is tried again; nested paths never turn flat."""
    kind = f"metadata read: {name}"
    env.fault("clear")
    # transient (fewer faults than retries): the exact tree
    m0 = s3mount("manager", "cache_size=64M")
    env.fault(mode, arg, count=2, match=match)
    got = op("list", m0.p("20/state"))
    assert judge_list(kind, got, sorted(reference["tree"]["20/state"]), False) == "exact", (got, m0.log()[-3000:])
    got = op("read", m0.p(ARRAY))
    assert judge_read(kind, got, reference["tree"][ARRAY], False) == "exact", got
    env.fault("clear")
    # lasting: EIO on every lookup below the step, each one tried again
    m = s3mount("manager", "cache_size=64M")
    assert "20" in os.listdir(m.p())
    env.fault(mode, arg, count=10 ** 6, match=match)
    t0 = time.monotonic()
    for _ in range(2):
        got = op("list", m.p("20/state"))
        res = judge_list(kind, got, sorted(reference["tree"]["20/state"]), True)
        assert res == "eio", (got, m.log()[-3000:])
        got = op("read", m.p(ARRAY))
        assert judge_read(kind, got, reference["tree"][ARRAY], True) == "eio", got
    assert time.monotonic() - t0 < OP_TIMEOUT
    env.fault("clear")
    tree = op("walk", m.p("20"))
    tally(kind, reads=1)
    want = {k[3:] if k.startswith("20/") else ".": v for k, v in reference["tree"].items()
            if k == "20" or k.startswith("20/")}
    assert "tree" in tree and not flat_names(tree["tree"]), (tree, m.log()[-3000:])
    assert tree["tree"] == want
    tally(kind, exact=1)


DATA = f"GET /ckpt/{PREFIX}/p.safetensors"  # one object, each tensor a range of it
DATA_FAULTS = [("bad Content-Range", "badrange"), ("200 to a range request", "fullbody"),
               ("404 for a listed key", "status")]


@pytest.mark.parametrize("name,mode", DATA_FAULTS, ids=[x[0] for x in DATA_FAULTS])
def test_data_range_faults_are_retried_then_eio_then_exact(env, s3mount, name, mode):
    kind = f"data read: {name}"
    env.fault("clear")
    ref = s3mount("p.safetensors", direct=True)
    want = ref_tree(ref.p())
    files = sorted(k for k in want if k.endswith(".npy"))
    arg = "404:NoSuchKey" if mode == "status" else ""
    # transient: retried into exact bytes
    m = s3mount("p.safetensors", "cache_size=64M", "connections=1")
    for f in files:
        env.fault(mode, arg, count=2, match=DATA)
        got = op("read", m.p(f))
        assert judge_read(kind, got, want[f], False) == "exact", (f, got, m.log()[-3000:])
        env.fault("clear")
    # lasting: EIO, bounded; then exact once the fault ends
    m2 = s3mount("p.safetensors", "cache_size=64M", "connections=1")
    hit = 0
    for f in files:
        env.fault(mode, arg, count=10 ** 6, match=DATA)
        got = op("read", m2.p(f))
        res = judge_read(kind, got, want[f], True)
        assert res in ("eio", "exact") and not got.get("timeout"), (f, got)
        hit += res == "eio"
        env.fault("clear")
        got = op("read", m2.p(f))
        assert judge_read(kind, got, want[f], False) == "exact", (f, got, m2.log()[-3000:])
    assert hit, "the fault reached no read"


# ---- the commit marker ---------------------------------------------------------


def write_step(root, step, seed):
    """A small step (two arrays of item `state`); {relative path: array}."""
    r = np.random.default_rng(seed)
    arrays = {"state/a.npy": r.standard_normal((64, 33)).astype(np.float32),
              "state/b.npy": r.integers(0, 1000, size=(129,)).astype(np.int64)}
    os.mkdir(os.path.join(root, step))
    os.mkdir(os.path.join(root, step, "state"))
    for k, v in arrays.items():
        np.save(os.path.join(root, step, k), v)
    return arrays


def keys(env, prefix):
    c = env.client()
    out = []
    for page in c.get_paginator("list_objects_v2").paginate(Bucket=s3env.BUCKET, Prefix=prefix):
        out += [o["Key"] for o in page.get("Contents", []) if not o["Key"].endswith("/")]
    return sorted(out)


def partial_steps(s3mount, layout, expect):
    """A fresh mount (no proxy) of the root: the steps it lists, and how many
    of them do not read back exactly (a committed partial step)."""
    m = s3mount(layout, direct=True)
    names = os.listdir(m.p())
    steps = sorted(n for n in names if n not in (".ckptfs", "latest"))
    assert ("latest" in names) == bool(steps), names  # the link to the newest committed step
    bad = 0
    for step in steps:
        for k, v in expect.get(step, {}).items():
            got = op("read", m.p(f"{step}/{k}"))
            want = hashlib.sha256(open_npy_bytes(v)).hexdigest()
            if got.get("sha") != want:
                bad += 1
                break
        else:
            if step not in expect:
                bad += 1
    m.unmount(check=False)
    return steps, bad


def open_npy_bytes(a):
    import io
    b = io.BytesIO()
    np.save(b, a)
    return b.getvalue()


MARKER_CASES = [
    # name, rules (mode, arg, count, what), want touch errno, committed
    ("landed, answer reset, then 503s", [("apply_reset", "", 1, "PUT"), ("status", "503:SlowDown", 10 ** 6, "PUT")],
     0, True),
    ("landed, answer reset, then 412", [("apply_reset", "", 1, "PUT"), ("status", "412:PreconditionFailed", 1, "PUT")],
     0, True),
    ("not applied, reset, then 503s", [("reset", "", 1, "PUT"), ("status", "503:SlowDown", 10 ** 6, "PUT")],
     errno.EIO, False),
]


@pytest.mark.parametrize("scheme", ["s3", "gs"])
@pytest.mark.parametrize("name,rules,want_errno,committed", MARKER_CASES, ids=[c[0] for c in MARKER_CASES])
def test_an_uncertain_marker_put_is_settled_before_anything_is_deleted(env, s3mount, tmp_path, name, rules,
                                                                       want_errno, committed, scheme):
    kind = f"marker: {name}"
    layout = "wm" + scheme + hashlib.sha1(name.encode()).hexdigest()[:6]
    env.fault("clear")
    m = s3mount(layout, scheme=scheme)
    exp = write_step(str(m.p()), "50", 50)
    marker = f"/ckpt/{PREFIX}/{layout}/50/commit_success.txt"
    for mode, arg, count, meth in rules:
        env.fault(mode, arg, count=count, match=f"{meth} {marker}")
    got = op("touch", m.p("50/commit_success.txt"))
    env.fault("clear")
    log = m.log()
    assert not got.get("timeout")
    # what the store holds: the whole step with its marker, or nothing
    stored = keys(env, f"{PREFIX}/{layout}/50/")
    has_marker = f"{PREFIX}/{layout}/50/commit_success.txt" in stored
    assert has_marker == committed, stored
    if not committed:
        assert stored == [], "without the marker nothing of the step is left"
    steps, bad = partial_steps(s3mount, layout, {"50": exp} if committed else {})
    tally(kind, partial_committed_steps=bad, wrong_listings=int(steps != (["50"] if committed else [])))
    assert bad == 0 and steps == (["50"] if committed else []), (steps, bad)
    tally(kind, reads=1)
    if want_errno == 0:
        assert got.get("ok") == 1, (got, log[-4000:])
        tally(kind, exact=1)
        assert "committed by someone else" not in log and "is deleted" not in log, log[-4000:]
        assert "answer was lost, but the marker landed" in log
    else:
        assert got.get("errno") == want_errno, (got, log[-4000:])
        tally(kind, clear_errors=1)
        assert "the marker did not land; what was sent is deleted" in log, log[-4000:]
    if committed:
        for k, v in exp.items():
            assert np.array_equal(np.load(m.p(f"50/{k}")), v)
    else:
        # the log's advice works in the same mount: rmdir, write again, touch
        os.rmdir(m.p("50"))
        exp = write_step(str(m.p()), "50", 51)
        got = op("touch", m.p("50/commit_success.txt"))
        assert got.get("ok") == 1, (got, m.log()[-3000:])
        steps, bad = partial_steps(s3mount, layout, {"50": exp})
        assert steps == ["50"] and bad == 0


def status_of(m):
    r = subprocess.run([str(U.BIN), "status", "--json", str(m.p())], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_marker_that_cannot_be_settled_keeps_everything_and_stays_pending(env, s3mount, tmp_path):
    kind = "marker: unsettled (answer reset, then 503s on PUT and GET)"
    layout = "wmu"
    env.fault("clear")
    m = s3mount(layout)
    exp = write_step(str(m.p()), "60", 60)
    marker = f"/ckpt/{PREFIX}/{layout}/60/commit_success.txt"
    env.fault("apply_reset", "", count=1, match=f"PUT {marker}")
    env.fault("status", "503:SlowDown", count=10 ** 6, match=marker)
    got = op("touch", m.p("60/commit_success.txt"))
    tally(kind, reads=1)
    assert got.get("errno") == errno.EIO, (got, m.log()[-4000:])
    tally(kind, clear_errors=1)
    # every object is kept: the marker landed, so a reader sees the whole step
    steps, bad = partial_steps(s3mount, layout, {"60": exp})
    tally(kind, partial_committed_steps=bad, wrong_listings=int(steps != ["60"]))
    assert steps == ["60"] and bad == 0, (steps, bad)
    log = m.log()
    assert "whether its commit marker landed is unknown" in log, log[-4000:]
    assert status_of(m)["stats"]["unsettled_steps"] == 1
    assert "60" in os.listdir(m.p())
    with pytest.raises(OSError) as ei:
        os.rmdir(m.p("60"))
    assert ei.value.errno == errno.EBUSY
    # the fault ends: touch again settles it (committed), in the same mount
    env.fault("clear")
    got = op("touch", m.p("60/commit_success.txt"))
    assert got.get("ok") == 1, (got, m.log()[-4000:])
    assert status_of(m)["stats"]["unsettled_steps"] == 0
    for k, v in exp.items():
        assert np.array_equal(np.load(m.p(f"60/{k}")), v)
    tally(kind, reads=1, exact=1)
