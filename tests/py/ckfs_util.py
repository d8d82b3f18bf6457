"""Helpers for the black-box tests of the ckptfs daemon.

Everything here talks to the daemon the way a user would: it starts the
binary, waits for the readiness byte on a pipe (-o ready_fd=N), looks at the
mount through ordinary system calls, and unmounts with fusermount3.

Environment:
  CKPT_BIN       the daemon binary (default: <repo>/build/ckptfs)
  CKPT_FIXTURES  the Orbax fixtures (default: <repo>/tests/fixtures/orbax-0.12.4)
"""

import base64
import errno
import json
import os
import select
import shutil
import signal
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(os.environ.get("CKPT_FIXTURES", REPO / "tests" / "fixtures" / "orbax-0.12.4"))
BIN = Path(os.environ.get("CKPT_BIN", REPO / "build" / "ckptfs"))

READY_TIMEOUT = 60.0  # seconds to wait for the readiness byte (ASan builds start slower)
EXIT_TIMEOUT = 30.0   # seconds to wait for the daemon to exit after unmount

# Words in the daemon log that always mean a bug, whatever the test does.
SANITIZER_WORDS = ("AddressSanitizer", "LeakSanitizer", "runtime error", "ThreadSanitizer")


# The oracles' import names and their distributions (tests/requirements-oracles.txt).
ORACLES = {"orbax.checkpoint": "orbax-checkpoint", "jax": "jax", "tensorstore": "tensorstore",
           "zarr": "zarr", "safetensors": "safetensors", "ml_dtypes": "ml_dtypes", "flax": "flax"}
ORACLES_REQUIRED = os.environ.get("CKPT_REQUIRE_ORACLES") == "1"


def oracles_missing():
    """The first oracle module this interpreter cannot import (zarr older
    than 3 counts as missing), or None when all of them import."""
    import importlib.util
    from importlib.metadata import PackageNotFoundError, version
    for mod, dist in ORACLES.items():
        try:
            if importlib.util.find_spec(mod) is None:
                return mod
            if dist == "zarr" and int(version(dist).split(".")[0]) < 3:
                return "zarr 3"
        except (ImportError, PackageNotFoundError, ValueError):
            return mod
    return None


def oracle_versions():
    from importlib.metadata import version
    return ", ".join(f"{d} {version(d)}" for d in ORACLES.values())


def fuse_unavailable_reason():
    """Why FUSE tests cannot run on this machine, or None when they can."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "/dev/fuse is not readable and writable by this user"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (Debian package fuse3)"
    return None


def is_mounted(path):
    """True when `path` is a mount point listed in /proc/self/mountinfo.
    (No system call on the path itself: a hung daemon must not hang us.)"""
    target = os.path.abspath(path)
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
        for line in f:
            fields = line.split()
            # field 5 is the mount point, with octal escapes for blanks
            mp = fields[4].encode().decode("unicode_escape")
            if mp == target:
                return True
    return False


class MountError(AssertionError):
    pass


class Mount:
    """One running daemon and its mount point."""

    def __init__(self, source, mnt, log_path, options=(), bin_path=None, extra_args=()):
        self.source = Path(source)
        self.path = Path(mnt)
        self.log_path = Path(log_path)
        self.options = list(options)
        self.bin = Path(bin_path or BIN)
        self.proc = None
        self.returncode = None
        self.parent_dev = None
        self.st_dev = None
        self.extra_args = list(extra_args)
        self.closed = False
        self.ready = None  # the readiness byte, once start() returned

    # -- start ---------------------------------------------------------------
    def cmdline(self, ready_fd):
        cmd = [str(self.bin), "-f"]
        opts = [f"ready_fd={ready_fd}"] + self.options
        cmd += ["-o", ",".join(opts)]
        cmd += self.extra_args
        cmd += [str(self.source), str(self.path)]
        return cmd

    def start(self, expect_ready=True):
        """Start the daemon; wait for its readiness byte.

        Returns the byte read (b"s", b"f" or b"" at EOF).  With
        expect_ready=True anything but b"s" raises MountError with the log.
        """
        if not self.bin.exists():
            raise MountError(f"daemon binary {self.bin} does not exist (build it, or set CKPT_BIN)")
        self.path.mkdir(parents=True, exist_ok=True)
        self.parent_dev = os.stat(self.path).st_dev
        r, w = os.pipe()
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                self.cmdline(w),
                pass_fds=(w,),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            os.close(w)
            log.close()
        byte = b""
        try:
            ready, _, _ = select.select([r], [], [], READY_TIMEOUT)
            if ready:
                byte = os.read(r, 1)
            else:
                byte = None
        finally:
            os.close(r)
        self.ready = byte
        if byte == b"s":
            self.st_dev = os.stat(self.path).st_dev
            if expect_ready and self.st_dev == self.parent_dev:
                self._abort()
                raise MountError("daemon said 's' but the mount point is not a new file system\n" + self.log())
            return byte
        if byte is None:
            self._abort()
            raise MountError(f"no readiness byte within {READY_TIMEOUT}s\n--- daemon log ---\n{self.log()}")
        if expect_ready:
            self._abort()
            what = "'f' (mount failed)" if byte == b"f" else "EOF without a readiness byte"
            raise MountError(f"daemon reported {what}, exit code {self.returncode}\n--- daemon log ---\n{self.log()}")
        return byte

    def _abort(self):
        """Tear down after a failed start: unmount if needed, stop our PID."""
        if self.proc is None:
            return
        if is_mounted(self.path):
            subprocess.call(["fusermount3", "-u", "-z", str(self.path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            self.returncode = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                self.returncode = self.proc.wait(timeout=EXIT_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.returncode = self.proc.wait()
        self.closed = True

    # -- inspection ------------------------------------------------------------
    @property
    def pid(self):
        return self.proc.pid

    def log(self):
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def p(self, rel=""):
        """Path of `rel` inside the mount."""
        return self.path / rel if rel else self.path

    def assert_on_mount(self, path):
        """`path` is served by this daemon, not by the file system beneath."""
        dev = os.stat(path).st_dev
        assert dev == self.st_dev, f"{path}: st_dev {dev} is not the mount's {self.st_dev}"
        assert dev != self.parent_dev, f"{path}: st_dev is the underlying file system's"

    # -- stop --------------------------------------------------------------------
    def unmount(self, check=True):
        """fusermount3 -u (falling back to -u -z and SIGTERM to our PID);
        wait for the daemon; with check=True assert exit code 0, the mount
        gone and no sanitizer report in the log.  Idempotent."""
        if not self.closed and self.proc is not None:
            self.closed = True
            if self.proc.poll() is None or is_mounted(self.path):
                rc = subprocess.call(["fusermount3", "-u", str(self.path)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
                if rc != 0 and is_mounted(self.path):
                    # busy or wedged: detach lazily and ask the daemon to stop
                    subprocess.call(["fusermount3", "-u", "-z", str(self.path)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
                    if self.proc.poll() is None:
                        self.proc.send_signal(signal.SIGTERM)
            try:
                self.returncode = self.proc.wait(timeout=EXIT_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.returncode = self.proc.wait()
                if check:
                    raise MountError(f"daemon did not exit within {EXIT_TIMEOUT}s of unmount\n{self.log()}")
        if check:
            self.check_clean()
        else:
            assert_log_clean(self.log())
        return self.returncode

    def check_clean(self):
        log = self.log()
        assert self.returncode == 0, \
            f"daemon exit code {self.returncode} (want 0)\n--- daemon log ---\n{log[-8000:]}"
        assert not is_mounted(self.path), f"{self.path} is still mounted after the daemon exited"
        assert_log_clean(log)


def assert_log_clean(log):
    for word in SANITIZER_WORDS:
        assert word not in log, f"daemon log contains {word!r}:\n{log[-8000:]}"


class MountFactory:
    """Starts daemons under one base folder; close() unmounts and checks
    them all (exit code 0, not mounted, clean log)."""

    def __init__(self, base):
        self.base = Path(base)
        self.mounts = []
        self.n = 0

    def __call__(self, source, *options, expect_ready=True, extra_args=(), bin_path=None):
        self.n += 1
        d = self.base / f"m{self.n}"
        d.mkdir(parents=True, exist_ok=True)
        m = Mount(source, d / "mnt", d / "daemon.log", options=options,
                  bin_path=bin_path, extra_args=extra_args)
        self.mounts.append(m)
        m.start(expect_ready=expect_ready)
        return m

    def close(self):
        errors = []
        for m in reversed(self.mounts):
            try:
                # a daemon that never reported 's' is checked by its test
                m.unmount(check=(m.ready == b"s"))
            except AssertionError as e:  # keep unmounting the others
                errors.append(f"{m.source} at {m.path}: {e}")
        self.mounts = []
        if errors:
            raise MountError("\n\n".join(errors))


# ---------------------------------------------------------------------------
# Expected arrays (fixtures/expected): bf16 is kept as raw uint16 patterns.

NPY_DESCR = {"float32": "<f4", "int32": "<i4", "bfloat16": "<V2", "float64": "<f8",
             "int64": "<i8", "uint8": "|u1", "int8": "|i1", "float16": "<f2"}


@dataclass
class Expected:
    key: str           # dotted param name in expected.json
    dtype: str         # "float32", "bfloat16", ...
    shape: tuple
    data: bytes        # exact C-order little-endian bytes
    sha256: str

    @property
    def descr(self):
        return NPY_DESCR[self.dtype]

    @property
    def np_dtype(self):
        """dtype np.load gives for the mounted file ('<V2' → V2 for bf16)."""
        return np.lib.format.descr_to_dtype(self.descr)

    def array(self):
        """The expected values; bf16 as its raw uint16 bit patterns."""
        dt = np.dtype("<u2") if self.dtype == "bfloat16" else np.dtype(self.descr)
        return np.frombuffer(self.data, dtype=dt).reshape(self.shape)


def load_expected():
    """{dotted key: Expected} from fixtures/expected/expected.json."""
    d = FIXTURES / "expected"
    meta = json.loads((d / "expected.json").read_text())
    out = {}
    for key, e in meta.items():
        out[key] = Expected(key=key, dtype=e["dtype"], shape=tuple(e["shape"]),
                            data=(d / e["file"]).read_bytes(), sha256=e["sha256"])
    return out


def parse_npy_header(head):
    """Parse the header of a .npy file given (at least) its first bytes.

    Returns (version, header_len, shape, fortran_order, dtype, header_text)
    where header_len counts every byte before the data."""
    import io
    f = io.BytesIO(head)
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        hl = 10 + int.from_bytes(head[8:10], "little")
    elif version in ((2, 0), (3, 0)):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        hl = 12 + int.from_bytes(head[8:12], "little")
    else:
        raise AssertionError(f"unknown npy version {version}")
    return version, hl, shape, fortran, dtype, head[:hl].decode("latin1")


# ---------------------------------------------------------------------------
# What the mount of each fixture must show (from the source folders).

@dataclass
class ArrayEntry:
    rel: str          # path inside the mount, e.g. "params/layer_0/mlp/w1.npy"
    key: str          # key in expected.json
    item_src: Path    # source item folder
    param: str        # param name inside the item (its store prefix / _sharding key)
    commit_ns: int


@dataclass
class Layout:
    name: str
    source: Path
    files: dict = field(default_factory=dict)    # rel -> source path (byte-identical files)
    arrays: dict = field(default_factory=dict)   # rel -> ArrayEntry
    dirs: dict = field(default_factory=dict)     # rel dir ("" = root) -> set of names
    commit_ns: dict = field(default_factory=dict)  # rel -> commit ns (files, dirs) where defined
    optional: dict = field(default_factory=dict)   # rel dir -> names allowed but not required
    links: dict = field(default_factory=dict)      # rel -> symlink target (a root's `latest`)
    ocdbt: bool = False
    fmt: str = ""

    def add(self, rel, kind):
        parts = rel.split("/")
        for i in range(len(parts)):
            parent = "/".join(parts[:i])
            self.dirs.setdefault(parent, set()).add(parts[i])
        if kind == "dir":
            self.dirs.setdefault(rel, set())


ITEM_META = ("_METADATA", "_sharding", "commit_success.txt")
STEP_META = ("_CHECKPOINT_METADATA", "commit_success.txt")


def commit_ns_of(step_dir):
    return json.loads((Path(step_dir) / "_CHECKPOINT_METADATA").read_text())["commit_timestamp_nsecs"]


def tree_keys(item_src):
    """Key paths (lists of str) of the array leaves in an item's _METADATA."""
    meta = json.loads((Path(item_src) / "_METADATA").read_text())
    out = []
    for v in meta["tree_metadata"].values():
        if v["value_metadata"].get("value_type") in ("jax.Array", "np.ndarray", "scalar"):
            out.append([str(k["key"]) for k in v["key_metadata"]])
    return out


def _add_item(lay, item_src, rel_prefix, key_prefix, commit_ns):
    item_src = Path(item_src)
    pre = rel_prefix + "/" if rel_prefix else ""
    if rel_prefix:
        lay.add(rel_prefix, "dir")
        lay.commit_ns[rel_prefix] = commit_ns
    for name in ITEM_META:
        if (item_src / name).is_file():
            lay.add(pre + name, "file")
            lay.files[pre + name] = item_src / name
            lay.commit_ns[pre + name] = commit_ns
    for keys in tree_keys(item_src):
        rel = pre + "/".join(keys) + ".npy"
        param = ".".join(keys)
        lay.add(rel, "file")
        lay.arrays[rel] = ArrayEntry(rel=rel, key=key_prefix + param, item_src=item_src,
                                     param=param, commit_ns=commit_ns)
        lay.commit_ns[rel] = commit_ns
        for i in range(1, len(keys)):
            lay.commit_ns[pre + "/".join(keys[:i])] = commit_ns


def _add_step_meta(lay, step_src, rel_prefix, commit_ns):
    pre = rel_prefix + "/" if rel_prefix else ""
    if rel_prefix:
        lay.add(rel_prefix, "dir")
    lay.commit_ns[rel_prefix] = commit_ns
    for name in STEP_META:
        if (Path(step_src) / name).is_file():
            lay.add(pre + name, "file")
            lay.files[pre + name] = Path(step_src) / name
            lay.commit_ns[pre + name] = commit_ns


def layout(name, root=None):
    """The expected view of fixture `name` (optionally a copy at `root`)."""
    src = Path(root) if root else FIXTURES / name
    lay = Layout(name=name, source=src)
    if name in ("pytree_zarr2", "pytree_zarr3"):
        ns = commit_ns_of(src)
        _add_step_meta(lay, src, "", ns)
        _add_item(lay, src, "", "", ns)
        lay.fmt = "zarr2" if name.endswith("2") else "zarr3"
    elif name == "manager":
        lay.ocdbt = True
        lay.fmt = "zarr2+ocdbt"
        lay.dirs[""] = set()
        for step in ("10", "20"):
            ns = commit_ns_of(src / step)
            _add_step_meta(lay, src / step, step, ns)
            lay.add(f"{step}/metadata", "dir")
            lay.commit_ns[f"{step}/metadata"] = ns
            for fn in ("commit_success.txt", "metadata"):
                lay.add(f"{step}/metadata/{fn}", "file")
                lay.files[f"{step}/metadata/{fn}"] = src / step / "metadata" / fn
                lay.commit_ns[f"{step}/metadata/{fn}"] = ns
            _add_item(lay, src / step / "state", f"{step}/state", "", ns)
        lay.dirs[""].add("latest")  # the link to the newest committed step
        lay.links["latest"] = "20"
    elif name == "v1_checkpointables":
        lay.ocdbt = True
        lay.fmt = "zarr3+ocdbt"
        ns = commit_ns_of(src)
        _add_step_meta(lay, src, "", ns)
        # the v1 marker file: usage.md neither lists nor hides it
        lay.optional[""] = {"orbax.checkpoint"}
        for item in ("params", "opt_state"):
            _add_item(lay, src / item, item, item + ".", ns)
    else:
        raise KeyError(name)
    return lay


# ---------------------------------------------------------------------------
# Source-side facts for xattrs

def sharding_entry(item_src, param):
    """The JSON text stored for `param` in the item's _sharding, or None."""
    p = Path(item_src) / "_sharding"
    if not p.exists():
        return None
    table = json.loads(p.read_text())
    k = base64.b64encode(param.encode()).decode()
    return table.get(k)


def array_metadatas_chunk_shape(item_src, param):
    am = json.loads((Path(item_src) / "array_metadatas" / "process_0").read_text())
    for a in am["array_metadatas"]:
        if a["array_metadata"]["param_name"] == param:
            return a["array_metadata"]["chunk_shape"]
    return None


def fmt_list(xs):
    return "[" + ",".join(str(int(x)) for x in xs) + "]"


def zarr_facts(item_src, param):
    """For a per-file zarr array: dict(shape, chunks, codec, stored_bytes, count, grid)."""
    d = Path(item_src) / param
    if (d / ".zarray").exists():
        z = json.loads((d / ".zarray").read_text())
        shape, chunks = z["shape"], z["chunks"]
        comp = z.get("compressor")
        codec = "raw" if comp is None else comp["id"]
        units = [p for p in d.iterdir() if p.is_file() and not p.name.startswith(".z")]
    else:
        z = json.loads((d / "zarr.json").read_text())
        shape = z["shape"]
        chunks = z["chunk_grid"]["configuration"]["chunk_shape"]
        c0 = z["codecs"][0]
        if c0["name"] == "sharding_indexed":
            inner = c0["configuration"]["chunk_shape"]
            names = ",".join(c["name"] for c in c0["configuration"]["codecs"])
            codec = f"sharding_indexed(inner={fmt_list(inner)},{names})"
        else:
            codec = ",".join(c["name"] for c in z["codecs"])
        c = d / "c"
        units = [c] if c.is_file() else [p for p in c.rglob("*") if p.is_file()]
    grid = [-(-s // c) for s, c in zip(shape, chunks)]
    return dict(shape=shape, chunks=chunks, codec=codec,
                stored_bytes=sum(p.stat().st_size for p in units),
                count=len(units), grid=grid)


# ---------------------------------------------------------------------------
# File-system helpers

def zip_data_offset(raw, info):
    """Where member `info` (a zipfile.ZipInfo) of the ZIP archive `raw`
    (its bytes) starts its data: after the 30-byte local header, the name
    and the local extra field (whose lengths can differ from the central
    directory's)."""
    lh = info.header_offset
    return lh + 30 + int.from_bytes(raw[lh + 26:lh + 28], "little") + int.from_bytes(raw[lh + 28:lh + 30], "little")


def read_all(path):
    with open(path, "rb") as f:
        return f.read()


def errno_of(fn, *args, **kw):
    """Run fn; return None on success, else the errno of the OSError raised."""
    try:
        fn(*args, **kw)
    except OSError as e:
        return e.errno
    return None


def assert_absent_or_eio(path):
    """A broken array must be left out of its directory, or answer EIO
    (at lookup, open or read).  Returns 'absent' or 'eio'."""
    path = Path(path)
    try:
        names = os.listdir(path.parent)
    except FileNotFoundError:
        names = []  # the whole branch was left out
    if path.name not in names:
        e = errno_of(os.stat, path)
        assert e in (errno.ENOENT, errno.EIO), \
            f"{path} is not listed but stat gives errno {e} (want ENOENT or EIO)"
        return "absent"
    def read():
        with open(path, "rb") as f:
            f.read()
    e = errno_of(read)
    assert e == errno.EIO, f"{path} is listed; reading it must fail with EIO, got errno {e}"
    return "eio"


def is_dir_mode(m):
    """A folder of the mount as shown by default (-o umask=022)."""
    return stat.S_ISDIR(m) and stat.S_IMODE(m) == 0o755


def is_file_mode(m):
    """A file of the mount as shown by default (-o umask=022)."""
    return stat.S_ISREG(m) and stat.S_IMODE(m) == 0o644


def wait_until(pred, timeout=EXIT_TIMEOUT, step=0.05):
    """Poll pred() until true; returns its last value (not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(step)


def vm(pid, key="VmHWM"):
    """A /proc/PID/status figure (VmHWM, VmRSS, ...) in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


_SAN = {}


def sanitized(binary=None):
    """True when the daemon binary (default BIN) is built with AddressSanitizer
    or ThreadSanitizer: memory figures are then meaningless."""
    b = str(binary or BIN)
    if b not in _SAN:
        found = False
        with open(b, "rb") as f:
            tail = b""
            while True:
                chunk = f.read(1 << 20)
                if not chunk:
                    break
                if b"__asan_init" in tail + chunk or b"__tsan_init" in tail + chunk:
                    found = True
                    break
                tail = chunk[-16:]
        _SAN[b] = found
    return _SAN[b]
