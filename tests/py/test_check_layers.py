"""scripts/check_layers on the build the tests run (the folder of CKPT_BIN's
binary): the real objects pass, and each rule fails, with its own message,
on a copy of the build where one object was replaced by a planted one:
the foreign layer's two rules, and the floors of lib/tree/ (node/ calls
nothing in derived/ nor layout.c, derived/ nothing in layout.c).

A planted build is a copy of the build's object tree (BUILD/CMakeFiles/
*.dir/**/*.o, as symlinks) in which plant() compiles one object from a
tiny C source.  check_layers ignores an object whose source file is gone,
so a planted object takes the path of an existing file's object; to keep
that file's place in the graph the planted source defines its symbols
again (keep_defs()) and adds the one call the case is about (refs()).
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import ckfs_util as U

pytestmark = pytest.mark.nofuse

CHECK = U.REPO / "scripts" / "check_layers"
BUILD = U.BIN.parent
RULE_TRANSLATOR_TO_TREE = "a translator calls into the node model"
RULE_TREE_TO_TRANSLATOR = "calls a translator's own symbol instead of the translator table"
NODE_TO_DERIVED = "floor rule of lib/tree/: node/ calls derived/"
NODE_TO_LAYOUT = "floor rule of lib/tree/: node/ calls layout.c"
DERIVED_TO_LAYOUT = "floor rule of lib/tree/: derived/ calls layout.c"
FLOOR_RULES = (NODE_TO_DERIVED, NODE_TO_LAYOUT, DERIVED_TO_LAYOUT)


def objects(build):
    """Every object file check_layers may read under build."""
    return sorted(Path(build, "CMakeFiles").glob("*.dir/**/*.o"))


def obj(layer, src):
    """The object of lib/LAYER/SRC, relative to a build folder."""
    return f"CMakeFiles/ckpt_{layer}.dir/lib/{layer}/{src}.o"


@pytest.fixture(scope="module")
def build():
    if not objects(BUILD):
        pytest.skip(f"no object files under {BUILD}/CMakeFiles (build first, or set CKPT_BIN)")
    return BUILD


def run_check(build_dir):
    """(exit status, output) of scripts/check_layers on build_dir."""
    r = subprocess.run([sys.executable, str(CHECK), str(build_dir)], capture_output=True, text=True,
                       timeout=300)
    return r.returncode, r.stdout + r.stderr


def violations(out):
    return [l for l in out.splitlines() if l.startswith("VIOLATION: ")]


def mirror(build, dst):
    """dst: the build's object tree, every object a symlink to the real one."""
    for o in objects(build):
        link = dst / o.relative_to(build)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(o)
    return dst


@pytest.fixture
def tmp_build(build, tmp_path):
    """A copy of the build's object tree to plant objects in."""
    return mirror(build, tmp_path / "build")


def plant(tmp_build, rel_obj_path, c_source):
    """Compile c_source (cc -c) into tmp_build/rel_obj_path, in place of the
    object there (or as a new one).  Returns the object's path."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    assert cc, "no C compiler (cc) to plant an object with"
    out = Path(tmp_build, rel_obj_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.is_symlink() or out.exists():
        out.unlink()
    src = out.with_name(out.name + ".plant.c")
    src.write_text(c_source)
    r = subprocess.run([cc, "-c", "-o", str(out), str(src)], capture_output=True, text=True)
    assert r.returncode == 0, f"{cc} -c {src}:\n{r.stderr}"
    return out


def defined(obj_path):
    """The global symbols an object file defines (nm -P), but the compiler's
    own (__*: a sanitizer build's __odr_asan.NAME), as check_layers reads them."""
    out = subprocess.run(["nm", "-P", str(obj_path)], capture_output=True, text=True, check=True).stdout
    names = []
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 2 and f[1] in "TDBRCVWGS" and f[1].isupper() and not f[0].startswith("__"):
            names.append(f[0])
    return names


def keep_defs(build, rel_obj_path):
    """C that defines again every global symbol of the build's object at
    rel_obj_path (as bytes: nm does not tell a function from data)."""
    return "".join(f"const char {n}[1] = {{ 0 }};\n" for n in defined(Path(build, rel_obj_path)))


def refs(*names):
    """C whose object refers to each of names (an undefined symbol apiece)
    without defining anything global."""
    return "".join(f"extern char {n}[];\nstatic char *const ref_{i}_ __attribute__((used)) = {n};\n"
                   for i, n in enumerate(names))


def a_symbol(build, rel_obj_path):
    """One symbol the build's object at rel_obj_path defines (the first by name)."""
    names = sorted(defined(Path(build, rel_obj_path)))
    assert names, f"{rel_obj_path} defines no symbol"
    return names[0]


def test_real_build_passes(build):
    rc, out = run_check(build)
    assert rc == 0 and "check_layers: ok" in out, out


def test_mirror_passes(tmp_build):
    """The copy itself, nothing planted, passes: what the cases below find
    is what they planted."""
    rc, out = run_check(tmp_build)
    assert rc == 0 and "check_layers: ok" in out, out


def test_translator_calling_the_node_model_fails(build, tmp_build):
    target = obj("foreign", "foreign_npz.c")
    tree_fn = a_symbol(build, obj("tree", "node/node.c"))
    plant(tmp_build, target, keep_defs(build, target) + refs(tree_fn))
    rc, out = run_check(tmp_build)
    assert rc == 1, out
    v = violations(out)
    assert v and all(RULE_TRANSLATOR_TO_TREE in l for l in v), out
    assert any("lib/foreign/foreign_npz.c -> lib/tree/node/node.c" in l and tree_fn in l for l in v), out


@pytest.mark.parametrize("translator", ["foreign_npz.c", "foreign_msgpack.c", "foreign_torch.c"])
def test_namespace_calling_a_translator_fails(build, tmp_build, translator):
    target = obj("tree", "layout.c")
    own = a_symbol(build, obj("foreign", translator))
    plant(tmp_build, target, keep_defs(build, target) + refs(own))
    rc, out = run_check(tmp_build)
    assert rc == 1, out
    v = violations(out)
    assert v and all(RULE_TREE_TO_TRANSLATOR in l for l in v), out
    assert any(f"lib/tree/layout.c -> lib/foreign/{translator}" in l and own in l for l in v), out


def test_namespace_calling_the_table_and_builder_passes(build, tmp_build):
    """The way in that the rule leaves open: the table and the builder."""
    target = obj("tree", "layout.c")
    plant(tmp_build, target, keep_defs(build, target)
          + refs(a_symbol(build, obj("foreign", "foreign.c")), a_symbol(build, obj("foreign", "foreign_vitem.c"))))
    rc, out = run_check(tmp_build)
    assert rc == 0 and "check_layers: ok" in out, out


@pytest.mark.parametrize("caller, callee, rule", [
    ("node/node.c", "derived/latest.c", NODE_TO_DERIVED),
    ("node/xattr.c", "layout.c", NODE_TO_LAYOUT),
    ("derived/latest.c", "layout.c", DERIVED_TO_LAYOUT),
])
def test_planted_call_breaks_its_floor_rule(build, tmp_build, caller, callee, rule):
    target = obj("tree", caller)
    fn = a_symbol(build, obj("tree", callee))
    plant(tmp_build, target, keep_defs(build, target) + refs(fn))
    rc, out = run_check(tmp_build)
    assert rc == 1 and "check_layers: FAILED" in out, out
    mine = [l for l in violations(out) if rule in l]
    assert len(mine) == 1, out
    assert f"lib/tree/{caller} -> lib/tree/{callee}" in mine[0] and fn in mine[0], mine[0]
    assert not any(r in out for r in FLOOR_RULES if r != rule), out


def test_derived_may_call_node(build, tmp_build):
    """Calls down across the floors break no floor rule."""
    target = obj("tree", "derived/latest.c")
    plant(tmp_build, target, keep_defs(build, target) + refs(a_symbol(build, obj("tree", "node/node.c"))))
    rc, out = run_check(tmp_build)
    assert not any(r in out for r in FLOOR_RULES), out
