"""The object store (s3:// and gs://) at the store level, against s3rver on
loopback and the fault proxy (tests/s3/).  The C driver is the test_store
unit-test binary beside the daemon (test_store s3check / s3cmp).

What is checked: every fixture file, folder, byte range and OCDBT database is
byte-exact through the store; injected faults (503, resets, truncated bodies,
latency) are retried into the exact bytes, and when retries run out the read
fails cleanly with EIO and a log line naming the object and the status, never
with wrong bytes; an object whose ETag changes is ESTALE; credentials come
from the environment or a profile and never appear in a log.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ckfs_util as U

sys.path.insert(0, str(U.REPO / "tests" / "s3"))
import s3env  # noqa: E402

DRIVER = U.BIN.parent / "test_store"
PREFIX = "fx"
SECRET = "SeCrEt/DoNotLog+0123456789abcdefXYZ"
TOKEN = "SeSsIoNtOkEn//DoNotLog=="

pytestmark = pytest.mark.skipif(bool(s3env.available()) or not DRIVER.exists(),
                                reason=s3env.available() or f"{DRIVER} not built")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    with s3env.S3Env(tmp_path_factory.mktemp("s3")) as e:
        e.upload_tree(U.FIXTURES, PREFIX)
        e.put(PREFIX + "-small/empty", b"")
        e.put(PREFIX + "-small/one", b"x")
        e.put(PREFIX + "-small/two", b"yz")
        yield e


def creds_env(**extra):
    e = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "GOOGLE_OAUTH_ACCESS_TOKEN"}
    e.update(AWS_ACCESS_KEY_ID="S3RVER", AWS_SECRET_ACCESS_KEY=SECRET, AWS_SESSION_TOKEN=TOKEN,
             AWS_SHARED_CREDENTIALS_FILE="/nonexistent", AWS_CONFIG_FILE="/nonexistent")
    e.update(extra)
    return e


def drive(*args, env=None, timeout=300):
    r = subprocess.run([str(DRIVER), *map(str, args)], capture_output=True, text=True,
                       env=env or creds_env(), timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def test_every_fixture_byte_exact_through_s3(env):
    rc, out, err = drive("s3check", f"s3://{s3env.BUCKET}/{PREFIX}", U.FIXTURES, f"endpoint={env.endpoint}")
    assert rc == 0, out + err
    assert "s3check ok" in out and " 0 differences" in out
    assert "ocdbt keys" in out and " 0 ocdbt keys" not in out


def test_gs_scheme_with_hmac_keys_reads_the_same(env):
    # gs:// speaks the same XML API; an S3-compatible endpoint stands in for GCS
    rc, out, err = drive("s3check", f"gs://{s3env.BUCKET}/{PREFIX}/pytree_zarr3", U.FIXTURES / "pytree_zarr3",
                         f"endpoint={env.endpoint}")
    assert rc == 0, out + err


def test_anonymous_access(env):
    rc, out, err = drive("s3check", f"s3://{s3env.BUCKET}/{PREFIX}/v1_pytree", U.FIXTURES / "v1_pytree",
                         f"endpoint={env.endpoint}", "anonymous")
    assert rc == 0, out + err


def test_profile_from_the_shared_credentials_file(env, tmp_path):
    cred = tmp_path / "credentials"
    cred.write_text(f"[default]\naws_access_key_id = WRONG\naws_secret_access_key = x\n\n"
                    f"[ckpt]\naws_access_key_id = S3RVER\naws_secret_access_key = {SECRET}\n")
    e = creds_env(AWS_SHARED_CREDENTIALS_FILE=str(cred), AWS_PROFILE="ckpt")
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        del e[k]
    rc, out, err = drive("s3check", f"s3://{s3env.BUCKET}/{PREFIX}/pytree_zarr2", U.FIXTURES / "pytree_zarr2",
                         f"endpoint={env.endpoint}", env=e)
    assert rc == 0, out + err
    assert "profile 'ckpt'" in err
    # s3rver knows only the key id S3RVER: the default profile's key is refused
    e["AWS_PROFILE"] = "default"
    rc, out, err = drive("s3check", f"s3://{s3env.BUCKET}/{PREFIX}/pytree_zarr2", U.FIXTURES / "pytree_zarr2",
                         f"endpoint={env.endpoint}", "retries=0", env=e)
    assert rc != 0
    assert "403" in err
    # a profile that does not exist is an error at open
    e["AWS_PROFILE"] = "nosuch"
    rc, out, err = drive("s3cmp", f"s3://{s3env.BUCKET}/{PREFIX}", "params.safetensors",
                         U.FIXTURES / "params.safetensors", f"endpoint={env.endpoint}", env=e)
    assert rc == 2 and "nosuch" in err


@pytest.mark.parametrize("key", ["empty", "one", "two"])
def test_tiny_objects(env, tmp_path, key):
    local = tmp_path / key
    local.write_bytes({"empty": b"", "one": b"x", "two": b"yz"}[key])
    rc, out, err = drive("s3cmp", f"s3://{s3env.BUCKET}/{PREFIX}-small", key, local, f"endpoint={env.endpoint}")
    assert rc == 0, out + err


WEIRD = ["a b.bin", "plus+eq=amp&.bin", "tilde~pct%41.bin", "\u00fcml\u00e4ut.bin", "q?hash#.bin", "dir x/in ner/<lt>&gt;\"q'.bin"]


def test_names_needing_encoding(env, tmp_path):
    local = tmp_path / "weird"
    for i, name in enumerate(WEIRD):
        p = local / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(bytes(range(i, 256)) * (i + 1))
        env.put(f"{PREFIX}-weird/{name}", p.read_bytes())
    for d in {os.path.dirname(n) for n in WEIRD if "/" in n}:
        parts = d.split("/")
        for j in range(1, len(parts) + 1):
            env.put(f"{PREFIX}-weird/{'/'.join(parts[:j])}/", b"")
    rc, out, err = drive("s3check", f"s3://{s3env.BUCKET}/{PREFIX}-weird", local, f"endpoint={env.endpoint}")
    assert rc == 0, out + err
    assert f"{len(WEIRD)} files" in out


OBJ = "params.safetensors"  # 42 KB


def cmp_through_proxy(env, *opts, key=OBJ):
    return drive("s3cmp", f"s3://{s3env.BUCKET}/{PREFIX}", key, U.FIXTURES / key,
                 f"endpoint={env.proxy_endpoint}", "retry_base_ms=5", *opts)


@pytest.mark.parametrize("mode,arg,count", [
    ("status", "503:SlowDown", 2),
    ("status", "500:InternalError", 1),
    ("reset", "", 2),
    ("reset_mid", "1000", 1),
    ("truncate", "100", 2),
    ("delay", "300", 1),
])
def test_transient_faults_are_retried_into_exact_bytes(env, mode, arg, count):
    env.fault("clear")
    env.fault(mode, arg, count=count, match="GET /ckpt/fx/params")
    rc, out, err = cmp_through_proxy(env)
    assert rc == 0, out + err
    assert "equal:" in out
    log = env.fault_log()
    assert sum(1 for x in log if x.endswith("-> " + mode)) == count, log


@pytest.mark.parametrize("mode,arg,status", [
    ("status", "503:SlowDown", "HTTP 503 SlowDown"),
    ("truncate", "10", "retries exhausted"),
    ("reset", "", "retries exhausted"),
])
def test_exhausted_retries_are_eio_with_a_log_line(env, mode, arg, status):
    env.fault("clear")
    env.fault(mode, arg, count=100, match="GET /ckpt/fx/params")
    rc, out, err = cmp_through_proxy(env, "retries=2")
    env.fault("clear")
    assert rc == 2, out + err
    assert "WRONG" not in out
    assert "error: Input/output error" in out
    line = [x for x in err.splitlines() if "params.safetensors" in x and "error" in x]
    assert line and status in line[-1], err


def test_forbidden_is_not_retried(env):
    env.fault("clear")
    env.fault("status", "403:AccessDenied", count=100, match="GET /ckpt/fx/params")
    rc, out, err = cmp_through_proxy(env)
    log = env.fault_log()
    env.fault("clear")
    assert rc == 2 and "Permission denied" in out
    assert sum(1 for x in log if "params" in x and x.startswith("GET")) == 1
    assert "HTTP 403 AccessDenied" in err


def test_changed_object_is_estale_never_mixed_bytes(env):
    env.fault("clear")
    env.fault("etag", '"0123456789abcdef0123456789abcdef"', count=100, match="GET /ckpt/fx/params")
    rc, out, err = cmp_through_proxy(env)
    env.fault("clear")
    assert rc == 2, out + err
    assert "Stale file handle" in out
    assert "changed" in err


def test_precondition_failed_is_estale(env):
    env.fault("clear")
    env.fault("status", "412:PreconditionFailed", count=1, match="GET /ckpt/fx/params")
    rc, out, err = cmp_through_proxy(env)
    env.fault("clear")
    assert rc == 2 and "Stale file handle" in out


def test_no_credential_in_any_log_line(env):
    env.fault("clear")
    env.fault("status", "503:SlowDown", count=3, match="GET")
    env.fault("status", "403:SignatureDoesNotMatch", count=1, match="HEAD")
    e = creds_env(CKPT_TEST_DEBUG="1")
    rc1, out1, err1 = drive("s3cmp", f"s3://{s3env.BUCKET}/{PREFIX}", OBJ, U.FIXTURES / OBJ,
                            f"endpoint={env.proxy_endpoint}", "retry_base_ms=5", env=e)
    rc2, out2, err2 = drive("s3check", f"s3://{s3env.BUCKET}/{PREFIX}/pytree_zarr3", U.FIXTURES / "pytree_zarr3",
                            f"endpoint={env.proxy_endpoint}", "retry_base_ms=5", env=e)
    env.fault("clear")
    text = out1 + err1 + out2 + err2
    assert "retry" in text  # the debug lines were there to look at
    for secret in (SECRET, TOKEN, SECRET[:12], TOKEN[:12]):
        assert secret not in text


# -- the write side (upload.h): PUT, create-only PUT, multipart, delete ------------------------------

def test_put_multipart_delete_round_trip(env):
    env.fault("clear")
    rc, out, err = drive("s3write", f"s3://{s3env.BUCKET}/{PREFIX}-write", f"endpoint={env.endpoint}")
    assert rc == 0, out + err
    for line in ("put: ok", "overwrite: ok", "multipart: ok", "small_part: refused", "delete: ok",
                 "folder_store: refused"):
        assert line in out, out + err
    # what the store wrote, boto3 reads the same
    c = env.client()
    body = c.get_object(Bucket=s3env.BUCKET, Key=f"{PREFIX}-write/w/big.bin")["Body"].read()
    assert len(body) == 2 * (5 << 20) + 12345
    keys = [o["Key"] for o in c.list_objects_v2(Bucket=s3env.BUCKET, Prefix=f"{PREFIX}-write/")["Contents"]]
    assert f"{PREFIX}-write/w/small.json" not in keys and f"{PREFIX}-write/w/refused.bin" not in keys


def test_uploads_retry_transient_faults_and_create_only_sees_412(env):
    env.fault("clear")
    env.fault("status", "503:SlowDown", count=2, match="PUT /ckpt/fx-write2/w/big.bin?partNumber=2")
    env.fault("reset", "", count=1, match="POST /ckpt/fx-write2/w/big.bin?uploadId")
    env.fault("status", "412:PreconditionFailed", count=1, match="PUT /ckpt/fx-write2/w/marker.txt")
    rc, out, err = drive("s3write", f"s3://{s3env.BUCKET}/{PREFIX}-write2", f"endpoint={env.proxy_endpoint}",
                         "retry_base_ms=5")
    log = env.fault_log()
    env.fault("clear")
    assert rc == 0, out + err
    assert "multipart: ok" in out and "create_only: exists" in out
    assert sum(1 for x in log if x.endswith("-> status") and "partNumber=2" in x) == 2


def test_listings_longer_than_one_page(env):
    # flat, same-shape keys: s3rver 3.7.1 paginates those correctly
    from concurrent.futures import ThreadPoolExecutor
    c = env.client()
    keys = [f"{PREFIX}-many/d/k{i:05d}" for i in range(2345)]
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda k: c.put_object(Bucket=s3env.BUCKET, Key=k, Body=b"v"), keys))
    rc, out, err = drive("s3ls", f"s3://{s3env.BUCKET}/{PREFIX}-many", "d", f"endpoint={env.endpoint}")
    assert rc == 0, out + err
    assert out.strip() == "listdir 2345 list 2345 rc 0"


# -- gs:// bearer tokens: a token file, GOOGLE_OAUTH_ACCESS_TOKEN, the metadata server ------------------
# The proxy checks the bearer token and strips it (s3rver takes anonymous requests).

def gs_check(env, e, *opts):
    return drive("s3check", f"gs://{s3env.BUCKET}/{PREFIX}/v1_pytree", U.FIXTURES / "v1_pytree",
                 f"endpoint={env.proxy_endpoint}", "retries=0", *opts, env=e)


def no_aws_env(**extra):
    e = creds_env(**extra)
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        del e[k]
    return e


def test_gs_bearer_token_file_and_env(env, tmp_path):
    tok = "ya29.FromAFile-DoNotLog-0123456789"
    tf = tmp_path / "token"
    tf.write_text(tok + "\n")
    env.fault("clear")
    env.fault("bearer", tok, count=100000)
    rc, out, err = gs_check(env, no_aws_env(), f"token_file={tf}")
    assert rc == 0, out + err
    rc2, out2, err2 = gs_check(env, no_aws_env(GOOGLE_OAUTH_ACCESS_TOKEN=tok))
    # a wrong token is refused by the stand-in server: the check is real
    rc3, out3, err3 = gs_check(env, no_aws_env(GOOGLE_OAUTH_ACCESS_TOKEN="ya29.wrong"))
    env.fault("clear")
    assert rc2 == 0, out2 + err2
    assert rc3 != 0 and "401" in err3
    for t in (out + err + out2 + err2, out3 + err3):
        assert tok not in t and tok[:10] not in t and "ya29.wrong" not in t


def test_gs_token_from_the_metadata_server(env):
    import http.server
    import json
    import threading
    tok = "ya29.FromMetadata-DoNotLog-987"
    seen = []

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append((self.path, self.headers.get("Metadata-Flavor")))
            ok = self.path == "/computeMetadata/v1/instance/service-accounts/default/token" and \
                self.headers.get("Metadata-Flavor") == "Google"
            body = json.dumps({"access_token": tok, "expires_in": 3599, "token_type": "Bearer"}).encode()
            self.send_response(200 if ok else 403)
            self.send_header("Content-Length", str(len(body) if ok else 0))
            self.end_headers()
            if ok:
                self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        env.fault("clear")
        env.fault("bearer", tok, count=100000)
        rc, out, err = gs_check(env, no_aws_env(GCE_METADATA_HOST="127.0.0.1:%d" % srv.server_address[1]))
        env.fault("clear")
    finally:
        srv.shutdown()
        srv.server_close()
    assert rc == 0, out + err
    assert "metadata server" in err
    assert 1 <= len(seen) <= 3, seen  # fetched once, reused until it nears expiry
    assert tok not in out + err


@pytest.mark.parametrize("connections,delay", [(1, "40"), (2, "40"), (8, "0")])
def test_adjacent_ranges_read_together_are_coalesced(env, tmp_path, connections, delay):
    """Reads of adjacent ranges that wait for a connection are merged into
    one GET (every piece still byte-exact); never more GETs in flight than
    -o connections, never more GETs than pieces."""
    data = os.urandom(4 << 20)
    local = tmp_path / "big.bin"
    local.write_bytes(data)
    env.put(PREFIX + "-co/big.bin", data)
    env.fault("clear")
    if delay != "0":
        env.fault("delay", delay, count=100000, match="GET /ckpt/fx-co/big.bin")
    pieces = (4 << 20) // (64 << 10)
    rc, out, err = drive("s3par", f"s3://{s3env.BUCKET}/{PREFIX}-co", "big.bin", local, 16, 64 << 10,
                         f"endpoint={env.proxy_endpoint}", f"connections={connections}")
    log = env.fault_log()
    env.fault("clear")
    assert rc == 0 and f"s3par ok {pieces} pieces" in out, out + err
    gets = [x for x in log if x.startswith("GET /ckpt/fx-co/big.bin")]
    assert 1 <= len(gets) <= pieces
    if connections <= 2:
        assert len(gets) < pieces * 3 // 4, len(gets)  # 16 readers, at most 2 in flight: merged


def test_deep_ocdbt_tree_with_siblings_fetched_at_once(env, tmp_path):
    """An OCDBT B+tree of height 3 (2,000 keys in leaves of 8, interior nodes of
    4): sibling nodes are fetched in parallel batches, every key and value
    still byte-exact, and every node fetched once."""
    item = tmp_path / "deep"
    subprocess.run(["/usr/bin/python3", str(U.REPO / "scripts" / "gen_ocdbt.py"), str(item), "--arrays", "500",
                    "--leaf-entries", "8", "--interior-entries", "4", "--zarr3"], check=True, capture_output=True)
    env.upload_tree(item, PREFIX + "-deep/deep", markers=False)
    env.fault("clear")
    env.fault("delay", "5", count=100000, match="GET /ckpt/fx-deep/")
    rc, out, err = drive("s3check", f"s3://{s3env.BUCKET}/{PREFIX}-deep", tmp_path, f"endpoint={env.proxy_endpoint}")
    log = env.fault_log()
    env.fault("clear")
    assert rc == 0, out + err
    assert "s3check ok" in out and " 0 differences" in out and " 0 ocdbt keys" not in out, out
    assert any("fx-deep/deep/d/" in x for x in log)
