"""The front door: scripts/packages.txt is the one list of Debian packages
(scripts/deps installs from it for scripts/demo and scripts/test), and
scripts/check_deps fails when CMakeLists.txt requires something whose package
is not on its [build] section, or when the README's apt-get line drifts from
it.  The demo itself runs here too, against the daemon's build folder."""

import os
import re
import shutil
import subprocess
import sys

import pytest

import ckfs_util as U

SCRIPTS = U.REPO / "scripts"
CHECK = SCRIPTS / "check_deps"


def run(cmd, env=None, timeout=120):
    p = subprocess.run([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       env=env, timeout=timeout)
    return p.returncode, p.stdout.decode(errors="replace")


def listed(*sections):
    rc, out = run(["bash", SCRIPTS / "deps", "--list", *sections])
    assert rc == 0, out
    return out.split()


def dpkg_owner(path):
    p = subprocess.run(["dpkg-query", "-S", str(path)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                       text=True)
    return p.stdout.split(":")[0] if p.returncode == 0 else None


def unlisted_dev_package():
    """(module, package, header, libname) of an installed -dev package that is not on the list:
    libxml2-dev when it is there, else the first one found."""
    on_list = set(listed("build", "test"))
    mods = subprocess.run(["pkg-config", "--list-all"], stdout=subprocess.PIPE, text=True).stdout.split("\n")
    names = sorted(line.split()[0] for line in mods if line.strip())
    names.sort(key=lambda n: n != "libxml-2.0")
    for m in names:
        pc = subprocess.run(["pkg-config", "--path", m], stdout=subprocess.PIPE, text=True).stdout.strip()
        pkg = dpkg_owner(pc) if pc else None
        if not pkg or pkg in on_list:
            continue
        files = subprocess.run(["dpkg-query", "-L", pkg], stdout=subprocess.PIPE, text=True).stdout.split()
        hdrs = [f for f in files if f.startswith("/usr/include/") and f.endswith(".h") and os.path.isfile(f)]
        libs = [os.path.basename(f) for f in files if re.search(r"/lib[^/]+\.so$", f)]
        if hdrs and libs:
            return m, pkg, os.path.relpath(hdrs[0], "/usr/include"), libs[0][3:-3]
    pytest.skip("no installed -dev package with a .pc file, a header and a library outside the list")


def planted(tmp_path, extra):
    cml = (U.REPO / "CMakeLists.txt").read_text()
    anchor = "find_package(Threads REQUIRED)\n"
    assert anchor in cml
    f = tmp_path / "CMakeLists.txt"
    f.write_text(cml.replace(anchor, anchor + extra + "\n"))
    return f


@pytest.fixture(scope="module")
def installed():
    rc, out = run(["bash", SCRIPTS / "deps", "--check", "build", "test"])
    if rc:
        pytest.skip("packages of scripts/packages.txt are missing here:\n" + out)


def test_check_deps_passes_on_the_repository(installed):
    rc, out = run([sys.executable, CHECK])
    assert rc == 0, out
    # every requirement of CMakeLists.txt was mapped to its package
    for pkg in ("libfuse3-dev", "libcurl4-openssl-dev", "libssl-dev", "zlib1g-dev", "libblosc-dev",
                "liblz4-dev", "libbz2-dev"):
        assert f"({pkg})" in out, out
    assert "check_deps: ok" in out


def test_a_planted_pkg_config_module_fails_naming_its_package(installed, tmp_path):
    mod, pkg, _, _ = unlisted_dev_package()
    f = planted(tmp_path, f"pkg_check_modules(X REQUIRED IMPORTED_TARGET {mod}>=0.1)")
    rc, out = run([sys.executable, CHECK, "--cmakelists", f])
    assert rc == 1, out
    assert re.search(rf"module {re.escape(mod)} is \S+\.pc from package {re.escape(pkg)}, which is not in "
                     r"\[build\]", out), out
    assert out.count("check_deps: FAIL") == 1, out
    # not REQUIRED: optional, not checked
    f = planted(tmp_path, f"pkg_check_modules(X QUIET {mod})")
    rc, out = run([sys.executable, CHECK, "--cmakelists", f])
    assert rc == 0, out


def test_a_planted_library_and_header_fail_naming_their_package(installed, tmp_path):
    _, pkg, hdr, lib = unlisted_dev_package()
    f = planted(tmp_path, f"find_library(X_LIB NAMES {lib} REQUIRED)\n# a comment: find_path(Y z.h REQUIRED)\n"
                          f"find_path(X_INC {hdr} PATH_SUFFIXES include REQUIRED)")
    rc, out = run([sys.executable, CHECK, "--cmakelists", f])
    assert rc == 1, out
    assert f"library {lib} is " in out and f"header {hdr} is " in out, out
    assert out.count(f"from package {pkg}, which is not in [build]") == 2, out
    assert "z.h" not in out, out


def test_a_module_that_is_not_installed_fails(installed, tmp_path):
    f = planted(tmp_path, "pkg_check_modules(NOPE REQUIRED ckpt-no-such-module)")
    rc, out = run([sys.executable, CHECK, "--cmakelists", f])
    assert rc == 1, out
    assert "module ckpt-no-such-module is not found on this machine" in out, out


def test_a_readme_apt_line_that_drifts_fails(installed, tmp_path):
    readme = (U.REPO / "README.md").read_text()
    assert " libblosc-dev " in readme
    f = tmp_path / "README.md"
    f.write_text(readme.replace(" libblosc-dev ", " ", 1))
    rc, out = run([sys.executable, CHECK, "--readme", f])
    assert rc == 1, out
    assert "lacks libblosc-dev" in out and "it should read:" in out, out


def test_the_readme_apt_line_is_the_build_section():
    text = (U.REPO / "README.md").read_text().replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if "apt-get install" in ln)
    got = [w for w in line.split("apt-get install", 1)[1].split() if not w.startswith("-")]
    assert got == listed("build")


def test_build_section_has_what_cmake_and_the_demo_need():
    build, test = listed("build"), listed("test")
    for pkg in ("libcurl4-openssl-dev", "libssl-dev", "zlib1g-dev", "libblosc-dev", "liblz4-dev", "libbz2-dev",
                "libfuse3-dev", "fuse3", "python3-numpy", "attr"):
        assert pkg in build, pkg
    assert "clang-format" in test and not set(build) & set(test)


def test_deps_dry_run_on_an_empty_package_database(tmp_path):
    """A fresh machine: dpkg knows nothing, so every package would be installed, except nodejs and
    npm when their commands exist (they may come from another source than Debian)."""
    (tmp_path / "info").mkdir()
    (tmp_path / "status").write_text("")
    env = dict(os.environ, DPKG_ADMINDIR=str(tmp_path))
    rc, out = run(["bash", SCRIPTS / "deps", "--dry-run", "build"], env=env)
    assert rc == 0, out
    assert out.strip() == f"scripts/deps: would install ({len(listed('build'))}): {' '.join(listed('build'))}"
    rc, out = run(["bash", SCRIPTS / "deps", "--dry-run", "build", "test"], env=env)
    assert rc == 0, out
    want = [p for p in listed("build", "test")
            if not (p == "nodejs" and shutil.which("node")) and not (p == "npm" and shutil.which("npm"))]
    assert out.split("): ", 1)[1].split() == want, out
    rc, out = run(["bash", SCRIPTS / "deps", "--check", "build"], env=env)
    assert rc == 1 and "libblosc-dev (scripts/packages.txt) is not installed" in out, out
    rc, out = run(["bash", SCRIPTS / "deps", "--list", "nosuch"])
    assert rc == 2 and "no section [nosuch]" in out, out


def test_the_demo_runs_and_unmounts(installed, tmp_path):
    build = U.BIN.resolve().parent
    if not (build / "CMakeCache.txt").exists():
        pytest.skip(f"{U.BIN} is not in a CMake build folder")
    env = dict(os.environ, BUILD_DIR=str(build), TMPDIR=str(tmp_path))
    rc, out = run(["bash", SCRIPTS / "demo"], env=env, timeout=600)
    assert rc == 0, out
    U.assert_log_clean(out)
    assert "chunks_decoded +1," in out, out  # the slice decoded one of w1's 8 chunks
    assert "w1.f32.npy dtype float32 shape (32, 128)" in out, out
    assert "layer_0.mlp.w1         BF16  [32, 128]" in out, out
    assert "the daemon exited with code 0" in out, out
    assert os.listdir(tmp_path) == [], "the demo left its work folder behind"
