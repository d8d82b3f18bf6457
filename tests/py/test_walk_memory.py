"""A walk of the tree costs the daemon little memory, and long listings
come whole.

The kernel asks for directory listings in requests as large as its
max_pages (1 MiB on this machine's kernel).  A daemon thread's reply
buffer becomes a 2 MiB huge page once a request asks for more than
64 KiB, so filling each listing request to its size made every thread
that listed a folder hold 2 MiB: a `find` of a small checkpoint raised
the daemon's peak resident set by 9-13 MiB, by how many threads served
it (and a test comparing two mounts' figures failed one run in six).  A
listing reply now carries at most 64 KiB of entries; the kernel asks
again for the rest.

What is measured: VmHWM before and after the walk (not under a
sanitizer, whose shadow memory dominates), and every entry of a folder
whose listing takes several replies.
"""

import os
import shutil

import ckfs_util as U

MiB = 1 << 20
WALK_SLACK = 4 * MiB     # stacks and small buffers of the threads a walk wakes
MANY = 3000              # entries of ~80 bytes each: several 64 KiB replies


def make_source(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    shutil.copytree(U.FIXTURES / "manager" / "10", src / "10")
    many = src / "10" / "metadata" / "many"
    many.mkdir(parents=True)
    for i in range(MANY):
        (many / ("entry-%05d-%s" % (i, "x" * 48))).write_bytes(b"%d" % i)
    return src


def walk(top):
    """Every path under top, each stat()ed (what `find` and `ls -lR` do)."""
    out = []
    for d, dirs, files in os.walk(top):
        for n in dirs + files:
            p = os.path.join(d, n)
            os.lstat(p)
            out.append(os.path.relpath(p, top))
    return out


def test_a_walk_does_not_grow_the_daemon_by_its_listings(tmp_path, mount):
    src = make_source(tmp_path)
    m = mount(src)
    before = U.vm(m.pid)
    names = walk(m.p())
    grew = U.vm(m.pid) - before
    want = {"10/metadata/many/entry-%05d-%s" % (i, "x" * 48) for i in range(MANY)}
    assert want <= set(names), f"{len(want - set(names))} entries of a long listing are missing"
    assert len([n for n in names if n.startswith("10/metadata/many/")]) == MANY, "entries listed twice"
    assert U.read_all(m.p("10/metadata/many/entry-02999-" + "x" * 48)) == b"2999"
    if U.sanitized():
        return
    assert grew <= WALK_SLACK, f"a walk of {len(names)} entries raised the daemon's peak by {grew / MiB:.1f} MiB"
