"""Loopback object-store environment for the tests: s3rver (from the
repo-local node_modules, see package.json) and the fault proxy, both bound to
127.0.0.1, started and stopped by PID.

    with S3Env(tmpdir) as env:      # s3rver + proxy, bucket "ckpt"
        env.upload_tree(local_dir, "prefix")
        env.endpoint                # http://127.0.0.1:PORT (direct)
        env.proxy_endpoint          # through the fault proxy
        env.fault(mode="status", arg="503:SlowDown", count=2, match="GET")
"""
import json
import os
import subprocess
import sys
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
S3RVER = os.path.join(REPO, "node_modules", "s3rver", "bin", "s3rver.js")
PROXY = os.path.join(REPO, "tests", "s3", "faultproxy.py")
BUCKET = "ckpt"


def available():
    """Why the environment cannot run ("" when it can)."""
    if not os.path.exists(S3RVER):
        return "s3rver not installed (run npm install at the repository root)"
    try:
        subprocess.run(["node", "--version"], capture_output=True, check=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return "node not found"
    try:
        import boto3  # noqa: F401
    except ImportError:
        return "boto3 missing"
    return ""


def _read_port(proc, what, deadline=20.0):
    end = time.monotonic() + deadline
    buf = b""
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                break
            continue
        buf += line
        if b"listening on 127.0.0.1:" in line:
            return int(line.rsplit(b":", 1)[1].strip())
    raise RuntimeError("%s did not start: %r" % (what, buf[-2000:]))


def _wait_http(url, deadline=10.0):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("%s does not answer" % url)


class S3Env:
    def __init__(self, tmpdir):
        self.tmpdir = str(tmpdir)
        self.procs = []

    def __enter__(self):
        data = os.path.join(self.tmpdir, "s3data")
        os.makedirs(data, exist_ok=True)
        env = dict(os.environ, NODE_OPTIONS="--openssl-legacy-provider")
        p = subprocess.Popen(
            ["node", S3RVER, "-d", data, "-a", "127.0.0.1", "-p", "0", "-s", "--configure-bucket", BUCKET],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
        )
        self.procs.append(p)
        self.port = _read_port(p, "s3rver")
        self.endpoint = "http://127.0.0.1:%d" % self.port
        _wait_http(self.endpoint + "/")
        q = subprocess.Popen([sys.executable, PROXY, str(self.port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.procs.append(q)
        self.proxy_port = _read_port(q, "faultproxy")
        self.proxy_endpoint = "http://127.0.0.1:%d" % self.proxy_port
        _wait_http(self.proxy_endpoint + "/__fault")
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if p.stdout:
                p.stdout.close()

    def client(self):
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="S3RVER",
            aws_secret_access_key="S3RVER",
            region_name="us-east-1",
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
        )

    def upload_tree(self, local, prefix, markers=True):
        """Upload every regular file below `local` as PREFIX/relative/path.

        With markers, every folder also gets a zero-byte "folder/" object (as
        consoles and gcsfuse create them): s3rver 3.7.1 reports a common
        prefix only when some object lies directly below it, so a folder
        holding only folders (a CheckpointManager root) would not be listed."""
        c = self.client()
        n = 0
        for dirpath, dirnames, filenames in os.walk(local):
            dirnames.sort()
            rel = os.path.relpath(dirpath, local).replace(os.sep, "/")
            if markers and rel != ".":
                c.put_object(Bucket=BUCKET, Key="%s/%s/" % (prefix, rel) if prefix else rel + "/", Body=b"")
            for fn in sorted(filenames):
                path = os.path.join(dirpath, fn)
                if os.path.islink(path) or not os.path.isfile(path):
                    continue
                rel = os.path.relpath(path, local).replace(os.sep, "/")
                with open(path, "rb") as f:
                    c.put_object(Bucket=BUCKET, Key="%s/%s" % (prefix, rel) if prefix else rel, Body=f.read())
                n += 1
        return n

    def put(self, key, data):
        self.client().put_object(Bucket=BUCKET, Key=key, Body=data)

    def fault(self, mode, arg="", count=1, match=""):
        q = urllib.parse.urlencode({"mode": mode, "arg": arg, "count": count, "match": match})
        return json.loads(urllib.request.urlopen("%s/__fault?%s" % (self.proxy_endpoint, q), timeout=10).read())

    def fault_log(self):
        return json.loads(urllib.request.urlopen(self.proxy_endpoint + "/__fault", timeout=10).read())["log"]


import urllib.parse  # noqa: E402  (used above; kept at the end for the docstring's sake)
