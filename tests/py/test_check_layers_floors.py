"""scripts/check_layers knows the floors of lib/tree/: node/ calls nothing in
derived/ nor layout.c, derived/ nothing in layout.c.  It passes on the real
build; a call planted into a copy of the build's objects (an object compiled
from a C snippet, placed in a floor's folder) fails it with that rule's
message."""

import shutil
import subprocess
import sys

import pytest

import ckfs_util as U

SCRIPT = U.REPO / "scripts" / "check_layers"
TREE_OBJS = "CMakeFiles/ckpt_tree.dir/lib/tree"

NODE_TO_DERIVED = "floor rule of lib/tree/: node/ calls derived/"
NODE_TO_LAYOUT = "floor rule of lib/tree/: node/ calls layout.c"
DERIVED_TO_LAYOUT = "floor rule of lib/tree/: derived/ calls layout.c"
RULES = (NODE_TO_DERIVED, NODE_TO_LAYOUT, DERIVED_TO_LAYOUT)


@pytest.fixture(scope="module")
def build():
    b = U.BIN.resolve().parent
    if not (b / TREE_OBJS).is_dir():
        pytest.skip(f"no {b / TREE_OBJS} (CKPT_BIN is not in a CMake build folder)")
    for tool in ("nm", "cc"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} is not installed")
    return b


def check_layers(build_dir):
    p = subprocess.run([sys.executable, str(SCRIPT), str(build_dir)], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=300)
    return p.returncode, p.stdout


def plant(tmp_build, rel_obj_path, c_source):
    """Copy the build's object files into tmp_build (once) and add one
    compiled from c_source at rel_obj_path (relative to the build folder)."""
    src = U.BIN.resolve().parent
    if not (tmp_build / "CMakeFiles").exists():
        for o in (src / "CMakeFiles").rglob("*.o"):
            dst = tmp_build / o.relative_to(src)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(o, dst)
    obj = tmp_build / rel_obj_path
    obj.parent.mkdir(parents=True, exist_ok=True)
    c = tmp_build / "planted_snippet.c"
    c.write_text(c_source)
    subprocess.run(["cc", "-c", "-o", str(obj), str(c)], check=True, timeout=60)
    c.unlink()
    return obj


def test_real_build_is_ok(build):
    rc, out = check_layers(build)
    assert rc == 0 and "check_layers: ok" in out, out
    assert not any(r in out for r in RULES), out


@pytest.mark.parametrize("folder, callee, snippet, rule", [
    ("node", "ckpt_latest_is",
     "int ckpt_latest_is(void *v, unsigned long parent, const char *name);\n"
     "int ckpt_planted_call(void);\n"
     "int ckpt_planted_call(void) { return ckpt_latest_is(0, 1, \"latest\"); }\n",
     NODE_TO_DERIVED),
    ("node", "ckpt_layout_step_touch",
     "void ckpt_layout_step_touch(void *v, void *n);\n"
     "void ckpt_planted_call(void);\n"
     "void ckpt_planted_call(void) { ckpt_layout_step_touch(0, 0); }\n",
     NODE_TO_LAYOUT),
    ("derived", "ckpt_name_reserved",
     "int ckpt_name_reserved(void *root, const char *name);\n"
     "int ckpt_planted_call(void);\n"
     "int ckpt_planted_call(void) { return ckpt_name_reserved(0, \"1\"); }\n",
     DERIVED_TO_LAYOUT),
])
def test_planted_call_breaks_its_floor_rule(build, tmp_path, folder, callee, snippet, rule):
    plant(tmp_path, f"{TREE_OBJS}/{folder}/planted.c.o", snippet)
    rc, out = check_layers(tmp_path)
    assert rc == 1 and "check_layers: FAILED" in out, out
    mine = [ln for ln in out.splitlines() if ln.startswith("VIOLATION: ") and rule in ln]
    assert len(mine) == 1, out
    assert f"lib/tree/{folder}/planted.c -> " in mine[0] and f"({callee})" in mine[0], mine[0]
    assert not any(r in out for r in RULES if r != rule), out


def test_derived_may_call_node(build, tmp_path):
    """Calls down across the floors break no floor rule (the planted file is
    only missing from the file map)."""
    plant(tmp_path, f"{TREE_OBJS}/derived/planted.c.o",
          "void *ckpt_node_at(void *v, unsigned long ino);\nvoid *ckpt_planted_call(void);\n"
          "void *ckpt_planted_call(void) { return ckpt_node_at(0, 1); }\n")
    rc, out = check_layers(tmp_path)
    assert not any(r in out for r in RULES), out
    assert "lib/tree/derived/planted.c: not in the file map" in out, out
