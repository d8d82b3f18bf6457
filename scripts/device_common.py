"""Shared by scripts/device_check_*.py: find the self-contained ckptfs (the
bundle that scripts/bundle makes) and mount with it.

The device checks run on a machine that has orbax-checkpoint, TensorStore,
JAX and torch but not the Debian packages ckptfs links against, so they use
the bundle: BUILD/bundle/ckptfs-VERSION-linux-ARCH/{bin,lib}, whose
bin/ckptfs finds its libraries through an $ORIGIN rpath.  scripts/device_run.sh
unpacks the bundle's tarball and passes its bin/ckptfs in $CKPTFS.

Standard library only (the checks import it before numpy and friends).
"""
import glob
import os
import platform
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def find_ckptfs(explicit=None):
    """The ckptfs binary to mount with: `explicit` (a --ckptfs option), else
    $CKPTFS, else the newest bundle under REPO/build*/bundle/ for this
    machine's architecture.  Raises FileNotFoundError naming what to do."""
    for cand in (explicit, os.environ.get("CKPTFS")):
        if cand:
            if not (os.path.isfile(cand) and os.access(cand, os.X_OK)):
                raise FileNotFoundError(f"{cand}: not an executable ckptfs")
            return os.path.abspath(cand)
    pattern = os.path.join(REPO, "build*", "bundle", f"ckptfs-*-linux-{platform.machine()}", "bin", "ckptfs")
    found = sorted(glob.glob(pattern), key=os.path.getmtime)
    if not found:
        raise FileNotFoundError(
            "no ckptfs bundle: run `cmake --build BUILD --target bundle` (or scripts/bundle BUILD), "
            "or pass --ckptfs / set CKPTFS to the bundle's bin/ckptfs")
    return found[-1]


def ckptfs_version(binary):
    p = subprocess.run([binary, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    return p.stdout.decode(errors="replace").strip()


def announce_ckptfs(explicit=None):
    """find_ckptfs, printing the binary and its --version; None (the reason
    printed) when there is none."""
    try:
        binary = find_ckptfs(explicit)
    except FileNotFoundError as e:
        print(f"ckptfs: {e}")
        return None
    print(f"ckptfs: {binary}: {ckptfs_version(binary)}")
    return binary


def exit_on_sigterm():
    """SIGTERM (scripts/device_run.sh's timeout) raises SystemExit, so that
    the checks' finally blocks unmount and remove their folders."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def drop_caches():
    """Write back, then drop the page cache (root only).  True when dropped."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
        return True
    except OSError:
        return False


class Mount:
    """A foreground ckptfs mount of `source` on `mnt` (a fresh temporary
    folder when None), ready when start() returns.  Use as a context manager.
    The daemon's log goes to `log_path` (a temporary file when None) and its
    tail is part of any error."""

    def __init__(self, binary, source, mnt=None, opts=(), log_path=None, ready_timeout=120):
        self.binary = binary
        self.source = os.path.abspath(source)
        self._own_mnt = mnt is None
        self.mnt = tempfile.mkdtemp(prefix="ckptfs-mnt-") if mnt is None else os.path.abspath(mnt)
        self.opts = list(opts)
        self.log_path = log_path or os.path.join(tempfile.gettempdir(), f"ckptfs-{os.getpid()}-{id(self)}.log")
        self.ready_timeout = ready_timeout
        self.proc = None
        self.returncode = None

    def p(self, *parts):
        return os.path.join(self.mnt, *parts)

    def log_tail(self, n=2000):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")[-n:]
        except OSError:
            return ""

    def start(self):
        r, w = os.pipe()
        cmd = [self.binary, "-f", "-o", f"ready_fd={w}"]
        for o in self.opts:
            cmd += ["-o", o]
        cmd += [self.source, self.mnt]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(w,))
        os.close(w)
        try:
            ready, _, _ = select.select([r], [], [], self.ready_timeout)
            byte = os.read(r, 1) if ready else b""
        finally:
            os.close(r)
        if byte != b"s":
            self._kill()
            raise RuntimeError(f"ckptfs did not mount {self.source} on {self.mnt} "
                               f"(ready byte {byte!r}, rc {self.proc.poll()}): {self.log_tail()}")
        return self

    def _kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def stop(self):
        """Unmount (fusermount3 -u, or umount as root, or SIGTERM, which
        makes the daemon unmount) and wait for the daemon to exit."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            done = False
            for tool in (["fusermount3", "-u"], ["umount"]):
                if shutil.which(tool[0]) and subprocess.run(
                        tool + [self.mnt], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0:
                    done = True
                    break
            if not done:
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self._kill()
        self.returncode = self.proc.returncode
        self.proc = None
        tail = self.log_tail()
        if self.returncode != 0 or "Sanitizer" in tail or "runtime error" in tail:
            print(f"WARNING: ckptfs exited with status {self.returncode}; its log ends:\n{tail}", flush=True)
        if self._own_mnt:
            for _ in range(50):
                try:
                    os.rmdir(self.mnt)
                    break
                except OSError:
                    time.sleep(0.1)

    def __enter__(self):
        return self.start() if self.proc is None else self

    def __exit__(self, *exc):
        self.stop()
