"""What a user gets out of a build folder: `cmake --install` puts the daemon
in bin/ (and the man page in share/man/man1 when the repository has one,
the shipped view recipes in share/ckptfs/recipes/),
and scripts/bundle makes a folder that runs with none of the build
machine's libraries but the C library's.

Both work on the build folder of the daemon under test (the folder of
CKPT_BIN, when it is a CMake build folder); nothing is rebuilt.
"""

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

import ckfs_util as U

# The C library's objects, which a bundle takes from the target machine.
LIBC = re.compile(r"^(linux-vdso|linux-gate|ld-linux[^/]*|ld64|libc|libm|libpthread|libdl|librt|libresolv|"
                  r"libutil|libanl|libnsl|libnss_\w+|libmvec|libBrokenLocale|libcrypt)\.so(\.[0-9.]+)?$")


@pytest.fixture(scope="module")
def build_dir():
    d = U.BIN.resolve().parent
    if not (d / "CMakeCache.txt").exists():
        pytest.skip(f"{U.BIN} is not in a CMake build folder")
    return d


def clean_env():
    env = dict(os.environ)
    for k in ("LD_LIBRARY_PATH", "LD_PRELOAD"):
        env.pop(k, None)
    return env


def test_cmake_install_puts_ckptfs_in_bin(build_dir, tmp_path):
    prefix = tmp_path / "prefix"
    subprocess.run(["cmake", "--install", str(build_dir), "--prefix", str(prefix)], check=True,
                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    exe = prefix / "bin" / "ckptfs"
    assert exe.is_file(), sorted(str(p.relative_to(prefix)) for p in prefix.rglob("*"))
    assert exe.stat().st_mode & stat.S_IXUSR
    assert exe.read_bytes() == U.BIN.read_bytes()
    out = subprocess.run([str(exe), "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         check=True, timeout=60).stdout.decode()
    assert "ckptfs" in out
    if (U.REPO / "docs" / "ckptfs.1").exists():
        assert (prefix / "share" / "man" / "man1" / "ckptfs.1").is_file()
    # the Python helper, where python3 finds it under the prefix, and bash completion
    helper = list(prefix.glob("lib/python3*/dist-packages/ckptfs.py"))
    assert len(helper) == 1 and helper[0].read_bytes() == (U.REPO / "python" / "ckptfs.py").read_bytes()
    code = "import ckptfs; print(ckptfs.mount.__name__)"
    out = subprocess.run(["/usr/bin/python3", "-c", code], env=dict(clean_env(), PYTHONPATH=str(helper[0].parent)),
                         stdout=subprocess.PIPE, check=True, timeout=60).stdout.decode()
    assert out.strip() == "mount"
    comp = prefix / "share" / "bash-completion" / "completions" / "ckptfs"
    assert comp.is_file()
    script = f"source {comp}; COMP_WORDS=(ckptfs -o cache_si); COMP_CWORD=2; _ckptfs; echo ${{COMPREPLY[@]}}"
    out = subprocess.run(["bash", "-c", script], stdout=subprocess.PIPE, check=True, timeout=60).stdout.decode()
    assert out.split() == ["cache_size="], out
    # the shipped view recipes, found by the installed daemon next to itself
    shipped = sorted(p.name for p in (U.REPO / "recipes").glob("*.json"))
    assert shipped and sorted(p.name for p in (prefix / "share" / "ckptfs" / "recipes").glob("*.json")) == shipped
    r = subprocess.run([str(exe), "info", "--recipe", "maxtext-llama-hf", str(U.REPO / "examples" / "sample")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "model.embed_tokens.weight: no source key token_embedder.embedding" in r.stderr, \
        r.stderr
    r = subprocess.run([str(exe), "info", "--recipe", "no-such-recipe", str(U.REPO / "examples" / "sample")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "No such file or directory" in r.stderr, r.stderr


def ldd(path):
    """{soname: resolved path or None} for every library the loader maps."""
    out = subprocess.run(["ldd", str(path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         env=clean_env(), check=True, timeout=60).stdout.decode()
    libs = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == "=>":
            libs[parts[0]] = None if parts[2] == "not" else os.path.realpath(parts[2])
        elif parts and parts[0].startswith("/"):
            libs[os.path.basename(parts[0])] = parts[0]  # the loader
        elif parts:
            libs[parts[0]] = ""                         # the vDSO
    return libs


@pytest.mark.skipif(shutil.which("patchelf") is None, reason="patchelf is not installed (Debian package patchelf)")
def test_bundle_runs_with_only_its_own_libraries(build_dir, tmp_path):
    out = tmp_path / "bundle"
    subprocess.run(["bash", str(U.REPO / "scripts" / "bundle"), str(build_dir), str(out)], check=True,
                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=clean_env(), timeout=300)
    tars = list(out.glob("ckptfs-*.tar.gz"))
    assert len(tars) == 1, list(out.iterdir())
    root = out / tars[0].name[:-len(".tar.gz")]
    exe = root / "bin" / "ckptfs"
    assert exe.is_file() and (root / "README").is_file()

    libs = ldd(exe)
    system = {name: path for name, path in ldd(U.BIN).items() if not LIBC.match(name)}
    assert system, "the daemon links no library besides the C library?"
    for name, path in libs.items():
        assert path is not None, f"{name}: not found"
        if LIBC.match(name):
            continue
        assert path.startswith(str(root.resolve()) + "/lib/"), f"{name} resolves outside the bundle: {path}"
    # every library the build's daemon loads from the system is in the bundle
    assert set(system) <= set(libs), set(system) - set(libs)

    # it runs, with the user's library path cleared and with one that points
    # elsewhere (the bundle's RPATH comes first)
    for env in (clean_env(), dict(clean_env(), LD_LIBRARY_PATH=str(tmp_path / "nowhere"))):
        for arg in ("--version", "--help"):
            p = subprocess.run([str(exe), arg], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               env=env, timeout=60)
            text = p.stdout.decode(errors="replace")
            assert p.returncode == 0, f"{arg}: exit {p.returncode}: {text}"
            assert "ckptfs" in text

    # the tarball holds the same folder
    listing = subprocess.run(["tar", "-tzf", str(tars[0])], stdout=subprocess.PIPE, check=True).stdout.decode()
    assert f"{root.name}/bin/ckptfs" in listing.split()
