#!/usr/bin/env python3
"""Save and restore one ~2 GiB bfloat16 model with Orbax, torch.distributed.checkpoint
and ckptfs on the same machine, and print one table.

Run on a machine with a GPU, orbax-checkpoint, TensorStore, JAX and torch
(scripts/device_run.sh runs it with the ckptfs bundle):

    scripts/device_check_bench.py [--ckptfs BUNDLE/bin/ckptfs] [--size-mib 2048] [--work DIR]
    scripts/device_check_bench.py --dry-run        # here: no GPU, no Orbax/torch; ckptfs rows only

The model: 8 bf16 arrays [rows, 16384] (N(0, 0.02) values, as weights),
--size-mib in all, on the first GPU (JAX arrays; torch tensors for DCP).

Rows (each save ends with os.sync(), so every save is timed to durable):
  Orbax    ocp.StandardCheckpointer().save + wait_until_finished (its
           defaults: OCDBT, zarr3, zstd); restore with an abstract target
           (single-device sharding) until the arrays are ready on the GPU
  DCP      torch.distributed.checkpoint.save / load (one process, no
           process group) into preallocated CUDA tensors
  ckptfs   save: a writable mount of an empty folder, np.save of every
           array (device -> host copy included) as STEP/state/NAME.npy from
           --workers threads, then creating STEP/commit_success.txt, which
           returns when the step is durable;
           restore: a fresh mount, np.load of every array through it
           (host memory), and the same plus jax.device_put to the GPU;
           Orbax restore of the step ckptfs committed (read from SOURCE:
           Orbax reads zarr, the mount shows .npy), as a format check and
           a figure
Before every restore the page cache is dropped when this runs as root
(column `cache`: cold), else it says warm.  Every restore is compared with
the saved bits.  Targets (issue: the device check): ckptfs restore through
the mount and ckptfs save to durable commit each at least as fast as
Orbax's.  A benchmark: it reports, it does not fail on speed; exit status 1
only when something could not run or a restored value differs, 2 when the
packages are missing (without --dry-run).
"""
import argparse
import concurrent.futures as cf
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import device_common as D  # noqa: E402

import numpy as np  # noqa: E402

COLS = 16384
NARRAYS = 8
GIB = 1 << 30
MIB = 1 << 20


def make_model(size_mib, seed=0):
    """{name: uint16 bf16 bit patterns [rows, COLS]}, about size_mib in all."""
    rows = max(1, size_mib * MIB // (NARRAYS * COLS * 2))
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(NARRAYS):
        f = rng.standard_normal((rows, COLS), dtype=np.float32)
        f *= np.float32(0.02)
        out[f"layer_{i}"] = (f.view(np.uint32) >> 16).astype(np.uint16)  # truncation to bf16
    return out


def nbytes(model):
    return sum(a.nbytes for a in model.values())


class Table:
    def __init__(self, total):
        self.total = total
        self.rows = []

    def add(self, method, op, seconds, cache="—", note=""):
        self.rows.append((method, op, seconds, cache, note))

    def na(self, method, op, why):
        self.rows.append((method, op, None, "—", why))

    def seconds(self, method, op):
        for m, o, s, _, _ in self.rows:
            if m == method and o == op:
                return s
        return None

    def render(self):
        head = ("method", "operation", "seconds", "GB/s", "cache", "note")
        body = []
        for m, o, s, c, n in self.rows:
            if s is None:
                body.append((m, o, "n/a", "—", c, n))
            else:
                body.append((m, o, "%.2f" % s, "%.2f" % (self.total / s / 1e9), c, n))
        rows = [head] + body
        w = [max(len(r[i]) for r in rows) for i in range(len(head))]
        line = lambda r: "| " + " | ".join(r[i].ljust(w[i]) for i in range(len(head))) + " |"
        out = [line(head), "|" + "|".join("-" * (x + 2) for x in w) + "|"]
        return "\n".join(out + [line(r) for r in body])


class Failures:
    def __init__(self):
        self.items = []

    def add(self, what):
        print("FAIL " + what, flush=True)
        self.items.append(what)


def same_bits(got, want):
    got = np.asarray(got)
    return got.shape == want.shape and got.dtype.itemsize == 2 and bool(np.array_equal(got.view(np.uint16), want))


def cache_state(cold):
    return "cold" if cold else "warm"


def prepare_restore(want_cold):
    """Drop the page cache if asked and possible; returns 'cold' or 'warm'."""
    return cache_state(want_cold and D.drop_caches())


# ---------------------------------------------------------------------------
# ckptfs (runs everywhere, the dry run included)


def ckptfs_save(binary, root, model, host_of, workers, log):
    """Write STEP 1 (item `state`) through a writable mount of `root`, then
    commit; returns seconds from the first byte to the durable commit."""
    with D.Mount(binary, root, log_path=log) as m:
        t0 = time.monotonic()
        os.mkdir(m.p("1"))
        os.mkdir(m.p("1", "state"))

        def one(name):
            a = host_of(name)  # the device -> host copy is part of the save
            np.save(m.p("1", "state", name + ".npy"), a.view(np.dtype("V2")))

        with cf.ThreadPoolExecutor(workers) as ex:
            list(ex.map(one, sorted(model)))
        open(m.p("1", "commit_success.txt"), "w").close()
        os.sync()
        return time.monotonic() - t0


def ckptfs_restore(binary, root, model, workers, log, to_device=None):
    """np.load every array through a fresh mount (then to_device(name, a)
    when given); returns (seconds, {name: restored})."""
    with D.Mount(binary, root, opts=["ro"], log_path=log) as m:
        t0 = time.monotonic()

        def one(name):
            a = np.load(m.p("1", "state", name + ".npy"))
            return name, (to_device(a) if to_device else a)

        with cf.ThreadPoolExecutor(workers) as ex:
            got = dict(ex.map(one, sorted(model)))
        if to_device:
            for v in got.values():
                v.block_until_ready()
        return time.monotonic() - t0, got


# ---------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ckptfs", help="ckptfs binary (default: $CKPTFS, else the newest bundle under build*/bundle)")
    ap.add_argument("--size-mib", type=int, help="model size (default 2048; 64 with --dry-run)")
    ap.add_argument("--workers", type=int, default=8, help="threads writing/reading the .npy files (default 8)")
    ap.add_argument("--work", default=os.environ.get("WORK", "/var/tmp"),
                    help="a disk folder for the checkpoints (a temporary folder inside it is removed)")
    ap.add_argument("--warm", action="store_true", help="do not drop the page cache before restores")
    ap.add_argument("--keep", action="store_true", help="keep the checkpoints")
    ap.add_argument("--dry-run", action="store_true",
                    help="run without GPU, JAX, Orbax or torch: the ckptfs rows on host arrays")
    args = ap.parse_args()
    D.exit_on_sigterm()
    size = args.size_mib or (64 if args.dry_run else 2048)

    jax = jnp = ocp = torch = dcp = ml_dtypes = None  # the dry run uses none of them
    if not args.dry_run:
        missing = []
        try:
            import jax
            import jax.numpy as jnp
            import ml_dtypes
        except ImportError as e:
            missing.append(f"jax: {e}")
        try:
            import orbax.checkpoint as ocp
        except ImportError as e:
            missing.append(f"orbax-checkpoint: {e}")
        try:
            import torch
            import torch.distributed.checkpoint as dcp
        except ImportError as e:
            missing.append(f"torch: {e}")
        if missing:
            print("needed and missing: " + "; ".join(missing))
            return 2
    gpu_jax = gpu_torch = None
    if jax is not None:
        gpus = [d for d in jax.devices() if d.platform == "gpu"]
        gpu_jax = gpus[0] if gpus else None
    if torch is not None and torch.cuda.is_available():
        gpu_torch = torch.device("cuda", 0)
    if not args.dry_run and (gpu_jax is None or gpu_torch is None):
        print(f"no GPU (jax: {gpu_jax}, torch: {gpu_torch}); --dry-run runs the ckptfs rows on the host")
        return 2

    binary = D.announce_ckptfs(args.ckptfs)
    if binary is None:
        return 1
    if jax is not None:
        print(f"jax {jax.__version__} on {gpu_jax}, orbax-checkpoint {getattr(ocp, '__version__', '?')}, "
              f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")

    t0 = time.monotonic()
    model = make_model(size)
    total = nbytes(model)
    shape = next(iter(model.values())).shape
    print(f"model: {NARRAYS} bf16 arrays {list(shape)}, {total / GIB:.2f} GiB (made in {time.monotonic() - t0:.1f} s)",
          flush=True)

    work = tempfile.mkdtemp(prefix="ckptfs-device-bench-", dir=args.work)
    table = Table(total)
    fails = Failures()
    cold = not args.warm and not args.dry_run  # a dry run leaves the shared page cache alone

    def check(label, restored):
        bad = [n for n, want in model.items() if n not in restored or not same_bits(restored[n], want)]
        if bad:
            fails.add(f"{label}: {len(bad)} arrays differ from what was saved: {bad[:3]}")
        return not bad

    try:
        # the model on the GPU, once for JAX and once for torch
        on_jax = on_torch = None
        if gpu_jax is not None:
            on_jax = {n: jax.device_put(a.view(ml_dtypes.bfloat16), gpu_jax) for n, a in model.items()}
            for v in on_jax.values():
                v.block_until_ready()
        if gpu_torch is not None:
            on_torch = {n: torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).to(gpu_torch)
                        for n, a in model.items()}
            torch.cuda.synchronize()

        # ---- Orbax ----
        opath = os.path.join(work, "orbax", "1")
        if ocp is None:
            table.na("Orbax", "save", "not installed" if not args.dry_run else "dry run")
            table.na("Orbax", "restore", "not installed" if not args.dry_run else "dry run")
        else:
            os.makedirs(os.path.dirname(opath))
            try:
                ck = ocp.StandardCheckpointer()
                t = time.monotonic()
                ck.save(opath, on_jax)
                ck.wait_until_finished()
                os.sync()
                table.add("Orbax", "save", time.monotonic() - t, note="StandardCheckpointer defaults")
            except Exception as e:  # noqa: BLE001 - reported as a row and a failure
                table.na("Orbax", "save", f"{type(e).__name__}: {e}"[:120])
                fails.add(f"Orbax save: {e!r}")
            else:
                single = jax.sharding.SingleDeviceSharding(gpu_jax)
                abstract = {n: jax.ShapeDtypeStruct(a.shape, jnp.bfloat16, sharding=single) for n, a in model.items()}
                c = prepare_restore(cold)
                try:
                    t = time.monotonic()
                    r = ocp.StandardCheckpointer().restore(opath, abstract)
                    jax.block_until_ready(r)
                    table.add("Orbax", "restore -> GPU", time.monotonic() - t, c)
                    check("Orbax restore", {n: np.asarray(jax.device_get(v)) for n, v in r.items()})
                    del r
                except Exception as e:  # noqa: BLE001
                    table.na("Orbax", "restore -> GPU", f"{type(e).__name__}: {e}"[:120])
                    fails.add(f"Orbax restore: {e!r}")

        # ---- torch DCP ----
        tpath = os.path.join(work, "dcp")
        if dcp is None:
            table.na("torch DCP", "save", "not installed" if not args.dry_run else "dry run")
            table.na("torch DCP", "load", "not installed" if not args.dry_run else "dry run")
        else:
            try:
                t = time.monotonic()
                dcp.save(dict(on_torch), checkpoint_id=tpath)
                torch.cuda.synchronize()
                os.sync()
                table.add("torch DCP", "save", time.monotonic() - t, note="FileSystemWriter, one process")
            except Exception as e:  # noqa: BLE001
                table.na("torch DCP", "save", f"{type(e).__name__}: {e}"[:120])
                fails.add(f"torch DCP save: {e!r}")
            else:
                dest = {n: torch.empty_like(v) for n, v in on_torch.items()}
                c = prepare_restore(cold)
                try:
                    t = time.monotonic()
                    dcp.load(dest, checkpoint_id=tpath)
                    torch.cuda.synchronize()
                    table.add("torch DCP", "load -> GPU", time.monotonic() - t, c)
                    check("torch DCP load", {n: v.view(torch.int16).cpu().numpy() for n, v in dest.items()})
                except Exception as e:  # noqa: BLE001
                    table.na("torch DCP", "load -> GPU", f"{type(e).__name__}: {e}"[:120])
                    fails.add(f"torch DCP load: {e!r}")
                del dest

        # ---- ckptfs ----
        root = os.path.join(work, "ckptfs")
        os.mkdir(root)
        log = os.path.join(work, "ckptfs.log")
        if on_jax is not None:
            def host_of(n):
                return np.asarray(jax.device_get(on_jax[n])).view(np.uint16)
            src_note = "from the GPU (device -> host included)"
        else:
            def host_of(n):
                return model[n]
            src_note = "from host memory"
        try:
            s = ckptfs_save(binary, root, model, host_of, args.workers, log)
            table.add("ckptfs", "save (np.save via mount + commit)", s, note=src_note)
            saved = True
        except Exception as e:  # noqa: BLE001
            table.na("ckptfs", "save (np.save via mount + commit)", f"{type(e).__name__}: {e}"[:120])
            fails.add(f"ckptfs save: {e!r}")
            saved = False
        if saved:
            c = prepare_restore(cold)
            try:
                s, got = ckptfs_restore(binary, root, model, args.workers, log)
                table.add("ckptfs", "restore (np.load via mount) -> host", s, c, f"{args.workers} threads")
                check("ckptfs restore", got)
                del got
            except Exception as e:  # noqa: BLE001
                table.na("ckptfs", "restore (np.load via mount) -> host", f"{type(e).__name__}: {e}"[:120])
                fails.add(f"ckptfs restore: {e!r}")
            if gpu_jax is not None:
                c = prepare_restore(cold)
                try:
                    s, got = ckptfs_restore(binary, root, model, args.workers, log,
                                            lambda a: jax.device_put(a.view(ml_dtypes.bfloat16), gpu_jax))
                    table.add("ckptfs", "restore (np.load via mount) -> GPU", s, c, "+ jax.device_put")
                    check("ckptfs restore -> GPU", {n: np.asarray(jax.device_get(v)) for n, v in got.items()})
                    del got
                except Exception as e:  # noqa: BLE001
                    table.na("ckptfs", "restore (np.load via mount) -> GPU", f"{type(e).__name__}: {e}"[:120])
                    fails.add(f"ckptfs restore -> GPU: {e!r}")
            if ocp is not None:
                single = jax.sharding.SingleDeviceSharding(gpu_jax)
                abstract = {n: jax.ShapeDtypeStruct(a.shape, jnp.bfloat16, sharding=single) for n, a in model.items()}
                c = prepare_restore(cold)
                try:
                    t = time.monotonic()
                    r = ocp.StandardCheckpointer().restore(os.path.join(root, "1", "state"), abstract)
                    jax.block_until_ready(r)
                    table.add("Orbax", "restore of the ckptfs step -> GPU", time.monotonic() - t, c,
                              "zarr3 written by ckptfs, read from SOURCE")
                    check("Orbax restore of the ckptfs step", {n: np.asarray(jax.device_get(v)) for n, v in r.items()})
                    del r
                except Exception as e:  # noqa: BLE001
                    table.na("Orbax", "restore of the ckptfs step -> GPU", f"{type(e).__name__}: {e}"[:120])
                    fails.add(f"Orbax restore of the ckptfs step: {e!r}")
            # the step is a committed Orbax step on disk
            if sorted(os.listdir(root)) != ["1"]:
                fails.add(f"ckptfs root after the commit: {sorted(os.listdir(root))}")
    finally:
        if args.keep:
            print(f"checkpoints kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    print()
    print(table.render())
    print()
    for what, ck_op, ref_op in (("save to durable commit", "save (np.save via mount + commit)", "save"),
                                ("restore through the mount", "restore (np.load via mount) -> GPU",
                                 "restore -> GPU")):
        a, b = table.seconds("ckptfs", ck_op), table.seconds("Orbax", ref_op)
        if a and b:
            verdict = "ok" if a <= b else "below target"
            print(f"- ckptfs {what}: {a:.2f} s vs Orbax {b:.2f} s, ratio {b / a:.2f} (target >= 1.00): {verdict}")
        else:
            print(f"- ckptfs {what} vs Orbax: n/a (a row is missing)")
    print(f"- {total / GIB:.2f} GiB, {NARRAYS} arrays {list(shape)} bf16; page cache "
          f"{'dropped before each restore' if cold and os.geteuid() == 0 else 'warm (not root, or --warm)'}; "
          f"{os.cpu_count()} CPUs")
    if fails.items:
        print(f"{len(fails.items)} failures")
        return 1
    print("no failures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
