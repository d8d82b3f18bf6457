"""The repository's own texts agree with its code: the lock order and the
ops table that docs/design.md copies from lib/tree/tree_int.h, no issue
numbers in docs or comments, .editorconfig against .clang-format; and the
tools around the tests: scripts/check_format and the unit tests' CHECK_CASE
filter (tests/unit/check.h)."""

import os
import re
import shutil
import subprocess
import sys

import pytest

import ckfs_util as U

HEADER = U.REPO / "lib" / "tree" / "tree_int.h"
DESIGN = U.REPO / "docs" / "design.md"


def header_lock_order():
    text = HEADER.read_text()
    block = text.split(" * ---- Lock order of libckpt ")[1].split("\n */")[0]
    lines = block.split("\n")[1:]
    return "\n".join(re.sub(r"^ \* ?", "", ln) for ln in lines).strip("\n")


def test_design_lock_order_is_the_header_text():
    doc = DESIGN.read_text()
    want = header_lock_order()
    assert "v->inval_mu" in want
    block = doc.split("## Lock order")[1].split("```")[1].strip("\n")
    assert block == want, "docs/design.md's lock order differs from lib/tree/tree_int.h's"


def test_lock_order_text_is_the_rank_table():
    """The tree text is generated from include/ckpt/lockrank.h's table
    (scripts/lock_tree), so the order the debug builds assert is the one the
    header and docs/design.md show."""
    out = subprocess.run([sys.executable, str(U.REPO / "scripts" / "lock_tree")], capture_output=True, text=True,
                         check=True).stdout.strip("\n")
    assert "v->ns_lock" in out and "ps->io_lock" in out
    assert header_lock_order() == out, "lib/tree/tree_int.h's lock order is not scripts/lock_tree's output"
    # every rank of the table is taken somewhere through the wrappers
    table = (U.REPO / "include" / "ckpt" / "lockrank.h").read_text()
    ids = re.findall(r"CKPT_RANK\((\w+), \"", table)
    src = "".join(p.read_text() for d in ("lib", "fs") for p in sorted((U.REPO / d).rglob("*.c")))
    unused = [i for i in ids if f"CKPT_RANK_{i})" not in src]
    assert not unused, f"ranks no lock uses: {unused}"


def test_design_ops_table_names_every_member():
    text = HEADER.read_text()
    body = text.split("struct node_ops {")[1].split("\n};")[0]
    members = re.findall(r"\(\*([a-z_]+)\)\(", body)
    assert {"getattr", "open", "prepare", "nentries"} <= set(members)
    doc = DESIGN.read_text().split("### Nodes")[1].split("## Errors")[0]
    ops = doc.split("ops table")[1].split("`view.c` only")[0]
    named = list(dict.fromkeys(re.findall(r"`([a-z_]+)`", ops)))
    assert named == members, f"docs/design.md names {named}, struct node_ops has {members}"


ISSUE_EXEMPT = set()


def test_no_issue_numbers_in_docs_and_comments():
    bad = []
    roots = ["docs", "lib", "fs", "tools", "scripts", "tests/py", "tests/unit", "tests/fuzz", "tests/s3",
             "examples/README.md", "README.md", "CMakeLists.txt"]
    rx = re.compile(r"\bissues? *(#|no\.? *)?[0-9]+|[A-Za-z0-9_-]+/[A-Za-z0-9_.-]+#[0-9]+\b", re.I)
    for r in roots:
        p = U.REPO / r
        files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
        for f in files:
            rel = str(f.relative_to(U.REPO))
            if rel in ISSUE_EXEMPT or "seeds" in f.parts or f.suffix in (".pyc",) or f == U.REPO / __file__:
                continue
            try:
                text = f.read_text()
            except UnicodeDecodeError:
                continue
            for n, line in enumerate(text.splitlines(), 1):
                if rx.search(line) and "ISSUE_EXEMPT" not in line and "rx = re.compile" not in line:
                    bad.append(f"{rel}:{n}: {line.strip()}")
    assert not bad, "\n".join(bad)


def editorconfig_section(name):
    sec, out = None, {}
    for line in (U.REPO / ".editorconfig").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("["):
            sec = line[1:-1]
        elif "=" in line and sec == name:
            k, v = (x.strip() for x in line.split("=", 1))
            out[k] = v
    return out


def test_editorconfig_matches_clang_format():
    cf = dict(re.findall(r"^(\w+): *(\S+)", (U.REPO / ".clang-format").read_text(), re.M))
    ec = editorconfig_section("*.{c,h}")
    assert ec["indent_style"] == ("tab" if cf["UseTab"] == "Always" else "space")
    assert ec["indent_size"] == cf["IndentWidth"] and ec["tab_width"] == cf["TabWidth"]
    assert ec["max_line_length"] == cf["ColumnLimit"]
    # the shell scripts listed as tab-indented are the bash scripts of scripts/
    sh = editorconfig_section("{*.sh,.ci/run,scripts/{bundle,check_format,demo,deps,fuzz,test}}")
    assert sh["indent_style"] == "tab"
    for name in ("bundle", "check_format", "demo", "deps", "fuzz", "test"):
        assert (U.REPO / "scripts" / name).read_text().startswith("#!/usr/bin/env bash"), name


@pytest.fixture
def clang_format():
    if not shutil.which("clang-format"):
        pytest.skip("clang-format is not installed")


def test_check_format_lists_the_files_that_drift(clang_format, tmp_path):
    ok = tmp_path / "ok.c"
    ok.write_text("int f(int x)\n{\n\treturn x + 1;\n}\n")
    bad = tmp_path / "bad.c"
    src = "int g(int x) {\n    return x+1;\n}\n"
    bad.write_text(src)
    (tmp_path / ".clang-format").write_text((U.REPO / ".clang-format").read_text())
    script = U.REPO / "scripts" / "check_format"
    p = subprocess.run(["bash", str(script), str(ok)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=60)
    assert p.returncode == 0 and "all 1 C files follow" in p.stdout, p.stdout
    p = subprocess.run(["bash", str(script), str(ok), str(bad)], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=60)
    assert p.returncode == 1, p.stdout
    assert f"  {bad} (" in p.stdout and str(ok) not in p.stdout.replace(f"{bad}", ""), p.stdout
    assert "1 of 2 C files drift" in p.stdout, p.stdout
    assert bad.read_text() == src, "check_format changed a file"
    p = subprocess.run(["bash", str(script), str(bad)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=60, env=dict(os.environ, CLANG_FORMAT="ckpt-no-such-binary"))
    assert p.returncode == 2 and "not found" in p.stdout, p.stdout


def unit_binary(name):
    exe = U.BIN.resolve().parent / name
    if not exe.is_file():
        pytest.skip(f"no {exe} (CKPT_BIN is not in a CMake build folder)")
    return exe


def run_unit(exe, case):
    env = dict(os.environ)
    env.pop("CHECK_CASE", None)
    if case is not None:
        env["CHECK_CASE"] = case
    p = subprocess.run([str(exe)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                       timeout=300)
    return p.returncode, p.stdout


def test_unit_tests_run_one_case_with_check_case():
    exe = unit_binary("test_orbax")
    rc, full = run_unit(exe, None)
    assert rc == 0 and "case " not in full, full
    total = int(re.search(r"(\d+) passed, 0 failed", full).group(1))
    rc, one = run_unit(exe, "test_escape")
    assert rc == 0 and one.splitlines()[0] == "case test_escape", one
    assert [ln for ln in one.splitlines() if ln.startswith("case ")] == ["case test_escape"], one
    n_one = int(re.search(r"(\d+) passed, 0 failed", one).group(1))
    assert 0 < n_one < total
    rc, two = run_unit(exe, "test_names,test_escape")
    assert rc == 0 and [ln for ln in two.splitlines() if ln.startswith("case ")] == \
        ["case test_names", "case test_escape"], two
    rc, none = run_unit(exe, "test_nosuch")
    assert rc == 1 and "no such case" in none, none
    # a case with arguments and the writer's whole-run totals
    rc, out = run_unit(unit_binary("test_writer"), "test_all_dtypes")
    assert rc == 0 and "case test_all_dtypes" in out and " 0 failed" in out, out


def test_test_modules_do_not_import_each_other():
    """Helpers several test modules need live in ckfs_util.py / ckfs_help.py."""
    bad = []
    for p in sorted((U.REPO / "tests" / "py").glob("*.py")):
        for n, line in enumerate(p.read_text().splitlines(), 1):
            if re.match(r"\s*(from|import)\s+test_\w+", line):
                bad.append(f"{p.name}:{n}: {line.strip()}")
    assert not bad, "test modules import other test modules:\n" + "\n".join(bad)


def test_design_folder_block_follows_the_file_map():
    """docs/design.md's "The tree's folders" names the files of lib/tree/'s
    file map, in its order (scripts/folder_map --check; counts not compared)."""
    r = subprocess.run([sys.executable, str(U.REPO / "scripts" / "folder_map"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
