"""ckptfs against Orbax itself (run by scripts/bench_orbax with the oracles' python).

One checkpoint, written by the real Orbax (CheckpointManager + PyTreeSave with
PyTreeCheckpointHandler(use_ocdbt=True, use_zarr3=True): OCDBT + zarr3, zstd): half bfloat16 and half float32 arrays, random values, at
least --gib GiB.  Every cold measurement starts after drop_caches; medians
of --runs.

  (a) read every array:
      - mount: `np.load` of every `.npy` through a fresh ckptfs mount of the
        root (mount start included), in a fresh process that imports numpy
        and ml_dtypes; --mount-opts adds -o options to that mount;
      - Orbax: `PyTreeCheckpointer.restore` of the step's item to numpy
        (`RestoreArgs(restore_type=np.ndarray)`, its metadata read included), in a fresh process after
        JAX is imported (import time excluded);
      - TensorStore: `ts.open` + `read` of every array with the spec Orbax
        builds, in the same kind of process.
      The readers' order turns by one each run, so each takes each place.
      Target: the mount at least as fast as Orbax's restore (ratio >= 1.00).
  (b) write the same arrays:
      - mount: --writers processes `np.save` their share of the arrays into
        a pending step of a writable mount, then `commit_success.txt` (which
        returns once the step is durable);
      - Orbax: `CheckpointManager.save` + `wait_until_finished` of the same
        tree (from host numpy arrays already on the device, JAX imported).
      Target: at least as fast (ratio >= 1.00).
  (c) the safetensors view: `safetensors.numpy.load_file` of
      `params.safetensors` through a fresh mount, against the same call on a
      plain file holding the same bytes.  No target in the issue: info.

A benchmark measures; it exits non-zero only when something could not run
(or a byte differs).
"""

import argparse
import hashlib
import importlib.machinery
import importlib.util
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
_loader = importlib.machinery.SourceFileLoader('ckpt_bench_main', str(HERE / 'bench'))
_spec = importlib.util.spec_from_loader('ckpt_bench_main', _loader)
bench = importlib.util.module_from_spec(_spec)
_loader.exec_module(bench)

MIB, GIB = bench.MIB, bench.GIB
STEP = 1


def shapes(gib):
    """{key path: (dtype, shape)}: layer-like arrays of 64 MiB, half bf16, half f32."""
    out = {}
    n = max(2, int(round(gib * GIB / (64 * MIB))))
    for i in range(n):
        if i % 2 == 0:
            out[f'params/layer_{i // 2}/w_bf16'] = ('bfloat16', (4096, 8192))
        else:
            out[f'params/layer_{i // 2}/w_f32'] = ('float32', (4096, 4096))
    return out


def make_arrays(spec, seed=0):
    import ml_dtypes
    import numpy as np
    r = np.random.default_rng(seed)
    arrs = {}
    for k, (dt, shape) in spec.items():
        a = r.standard_normal(shape, dtype=np.float32)
        arrs[k] = a.astype(ml_dtypes.bfloat16) if dt == 'bfloat16' else a
    return arrs


def nest(flat):
    tree = {}
    for k, v in flat.items():
        d = tree
        parts = k.split('/')
        for p in parts[:-1]:
            d = d.setdefault(p, {})
        d[parts[-1]] = v
    return tree


def cpu_s():
    """CPU seconds (user + system) of this process so far, every thread included."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def proc_cpu_s(pid):
    """CPU seconds of another process (utime + stime of /proc/PID/stat)."""
    with open('/proc/%d/stat' % pid) as f:
        rest = f.read().rsplit(')', 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / os.sysconf('SC_CLK_TCK')


def child(cfg):
    """A fresh process: JAX/Orbax/TensorStore imported, then one timed job; prints JSON.
    The mount's reader imports numpy and ml_dtypes only, as a user's np.load script does."""
    if cfg['job'] == 'mount_read':
        import ml_dtypes  # noqa: F401  (numpy learns bfloat16, as a user's loader does)
        spec = {k: (d, tuple(s)) for k, (d, s) in cfg['spec'].items()}
        dt, cpu, dcpu, h = mount_read_all(cfg['daemon'], Path(cfg['root']), Path(cfg['mnt']), Path(cfg['log']),
                                          spec, cfg.get('warm', 0), cfg.get('opts', ''))
        print(json.dumps({'seconds': dt, 'cpu': cpu, 'daemon_cpu': dcpu, 'sha256': h}))
        return
    os.environ.setdefault('JAX_PLATFORMS', 'cpu')
    import jax  # noqa: F401
    import numpy as np
    import orbax.checkpoint as ocp
    spec = {k: (d, tuple(s)) for k, (d, s) in cfg['spec'].items()}
    root = cfg['root']
    if cfg['job'] == 'save':
        arrs = make_arrays(spec, cfg['seed'])
        tree = nest({k: jax.device_put(v) for k, v in arrs.items()})
        jax.block_until_ready(tree)
        # OCDBT + zarr3 (StandardCheckpointHandler alone would write zarr v2)
        mgr = ocp.CheckpointManager(root, item_handlers=ocp.PyTreeCheckpointHandler(use_ocdbt=True, use_zarr3=True))
        bench.warm_memory(cfg.get('warm', 0))
        t0, c0 = time.monotonic(), cpu_s()
        mgr.save(STEP, args=ocp.args.PyTreeSave(tree))
        mgr.wait_until_finished()
        dt, dc = time.monotonic() - t0, cpu_s() - c0
        mgr.close()
        print(json.dumps({'seconds': dt, 'cpu': dc}))
        return
    if cfg['job'] == 'orbax_restore':
        item = os.path.join(root, str(STEP), 'default')
        ckptr = ocp.PyTreeCheckpointer()
        bench.warm_memory(cfg.get('warm', 0))
        t0, c0 = time.monotonic(), cpu_s()
        meta = ckptr.metadata(item)
        tree_meta = meta.item_metadata.tree if hasattr(meta, 'item_metadata') else meta.tree
        rargs = jax.tree_util.tree_map(lambda m: ocp.RestoreArgs(restore_type=np.ndarray), tree_meta)
        out = ckptr.restore(item, args=ocp.args.PyTreeRestore(restore_args=rargs))
        dt, dc = time.monotonic() - t0, cpu_s() - c0
        h = hashlib.sha256()
        for k in sorted(spec):
            v = out
            for p in k.split('/'):
                v = v[p]
            h.update(np.ascontiguousarray(v).tobytes())
        print(json.dumps({'seconds': dt, 'cpu': dc, 'sha256': h.hexdigest()}))
        return
    if cfg['job'] == 'ts_read':
        import tensorstore as ts
        from etils import epath
        from orbax.checkpoint._src.serialization import tensorstore_utils as tsu
        from orbax.checkpoint._src.serialization.types import ParamInfo
        item = os.path.join(root, str(STEP), 'default')
        bench.warm_memory(cfg.get('warm', 0))
        t0, c0 = time.monotonic(), cpu_s()
        ctx = tsu.get_ts_context(use_ocdbt=True)
        futs = []
        for k in sorted(spec):
            info = ParamInfo(name=k.replace('/', '.'), parent_dir=epath.Path(item), is_ocdbt_checkpoint=True,
                             use_zarr3=True, ts_context=ctx)
            t = ts.open(tsu.get_json_tspec_read(info, use_ocdbt=True), open=True, read=True, context=ctx).result()
            futs.append(t.read())
        vals = [f.result() for f in futs]
        dt, dc = time.monotonic() - t0, cpu_s() - c0
        h = hashlib.sha256()
        for v in vals:
            h.update(np.ascontiguousarray(v).tobytes())
        print(json.dumps({'seconds': dt, 'cpu': dc, 'sha256': h.hexdigest()}))
        return
    raise SystemExit('unknown job')


def run_child(cfg, timeout=1800):
    env = dict(os.environ, JAX_PLATFORMS='cpu', TF_CPP_MIN_LOG_LEVEL='3')
    p = subprocess.run([sys.executable, __file__, '--child', json.dumps(cfg)], capture_output=True, text=True,
                       timeout=timeout, env=env)
    if p.returncode != 0:
        raise RuntimeError('%s failed: %s' % (cfg['job'], p.stderr[-3000:]))
    return json.loads(p.stdout.strip().splitlines()[-1])


def writer(cfg):
    """One writer process of (b): np.save of its share into the pending step."""
    import numpy as np
    spec = {k: (d, tuple(s)) for k, (d, s) in cfg['spec'].items()}
    arrs = make_arrays(spec, cfg['seed'])
    keys = sorted(spec)[cfg['index']::cfg['count']]
    ready = time.monotonic()
    for k in keys:
        p = Path(cfg['step']) / 'default' / (k + '.npy')
        v = arrs[k]
        if spec[k][0] == 'bfloat16':
            v = v.view(np.dtype('V2'))
        np.save(p, v)
    print(json.dumps({'prepared': ready, 'done': time.monotonic()}))


def mount_read_all(daemon, root, mnt, logp, spec, warm=0, opts=''):
    """np.load every array through a fresh mount, as a restore to numpy
    does (the arrays kept); (seconds, CPU seconds of reader + daemon,
    sha256 of the arrays, taken after the clock stopped)."""
    import numpy as np
    bench.warm_memory(warm)
    t0, c0 = time.monotonic(), cpu_s()
    with bench.Mount(daemon, root, mnt, opts, logp).start() as m:
        arrays = [np.load(mnt / str(STEP) / 'default' / (k + '.npy')) for k in sorted(spec)]
        dt = time.monotonic() - t0
        dcpu = proc_cpu_s(m.proc.pid)
        cpu = dcpu + (cpu_s() - c0)
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return dt, cpu, dcpu, h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description='ckptfs against Orbax (docs/benchmarks.md, "Against Orbax")')
    ap.add_argument('--gib', type=float, default=1.0)
    ap.add_argument('--runs', type=int, default=3)
    ap.add_argument('--writers', type=int, default=2)
    ap.add_argument('--work', default=os.environ.get('WORK', '/var/tmp/ckptfs-bench-orbax'))
    ap.add_argument('--keep', action='store_true')
    ap.add_argument('--warm', type=float, default=4.0,
                    help='GiB touched and freed right before each timed section (scripts/bench warm_memory; 0: none)')
    ap.add_argument('--mount-opts', default='', help='-o options of the mount that row (a) reads through')
    ap.add_argument('--child', help=argparse.SUPPRESS)
    ap.add_argument('--writer', help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(json.loads(a.child))
    if a.writer:
        return writer(json.loads(a.writer))
    if os.geteuid() != 0:
        sys.exit('bench_orbax: needs root (drop_caches)')

    import numpy as np
    import ml_dtypes  # noqa: F401  (numpy learns bfloat16, as a user's loader does)
    from safetensors.numpy import load_file

    t_start = time.monotonic()
    load0 = bench.loadavg()
    daemon, _tool, notes = bench.build()
    work = Path(a.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    logs = work / 'logs'
    logs.mkdir()
    spec = shapes(a.gib)
    jspec = {k: [d, list(s)] for k, (d, s) in spec.items()}
    total = sum((2 if d == 'bfloat16' else 4) * int(np.prod(s)) for d, s in spec.values())
    table = bench.Table()
    details = [f'checkpoint: {len(spec)} arrays, {total / GIB:.2f} GiB logical, half bfloat16 (4096x8192), '
               f'half float32 (4096x4096); written by Orbax {orbax_version()} (PyTreeSave: OCDBT + zarr3, zstd)']
    runs = max(1, a.runs)
    try:
        # (b) Orbax save, also the checkpoint that every read row uses
        save_s = []
        for i in range(runs):
            root = work / ('orbax' if i == 0 else f'orbax{i}')
            shutil.rmtree(root, ignore_errors=True)
            bench.drop_caches()
            save_s.append(run_child({'job': 'save', 'root': str(root), 'spec': jspec, 'seed': 0,
                                     'warm': a.warm})['seconds'])
            if i:
                shutil.rmtree(root)
        root = work / 'orbax'
        stored = sum(f.stat().st_size for f in root.rglob('*') if f.is_file())
        details.append(f'stored by Orbax: {stored / MIB:.0f} MiB')

        # (a) reads
        mount_s, orbax_s, ts_s = [], [], []
        mount_c, orbax_c, ts_c, mount_d = [], [], [], []
        hashes = {}

        def read_orbax():
            r = run_child({'job': 'orbax_restore', 'root': str(root), 'spec': jspec, 'warm': a.warm})
            orbax_s.append(r['seconds'])
            orbax_c.append(r['cpu'])
            hashes.setdefault('orbax', set()).add(r['sha256'])

        def read_ts():
            r = run_child({'job': 'ts_read', 'root': str(root), 'spec': jspec, 'warm': a.warm})
            ts_s.append(r['seconds'])
            ts_c.append(r['cpu'])
            hashes.setdefault('ts', set()).add(r['sha256'])

        def read_mount():
            r = run_child({'job': 'mount_read', 'daemon': str(daemon), 'root': str(root), 'mnt': str(work / 'mnt'),
                           'log': str(logs / 'read.log'), 'spec': jspec, 'warm': a.warm,
                           'opts': a.mount_opts})
            hashes.setdefault('mount', set()).add(r['sha256'])
            mount_s.append(r['seconds'])
            mount_c.append(r['cpu'])
            mount_d.append(r['daemon_cpu'])

        # Every reader in a fresh process of its own, as a user's script
        # (the peers' children import JAX, the mount's numpy); the order
        # turns by one each run: every reader takes every place (a reader's
        # time depends on what ran just before it: this machine's host
        # takes freed memory back on its own schedule)
        order = [read_orbax, read_ts, read_mount]
        for i in range(runs):
            for f in order[i % 3:] + order[:i % 3]:
                bench.drop_caches()
                f()
        assert len(hashes['orbax']) == 1, 'Orbax restored other bytes in another run'
        assert hashes['ts'] == hashes['orbax'], 'TensorStore read other bytes'
        assert hashes['mount'] == hashes['orbax'], 'the mount served other bytes than Orbax restores'
        m, o, t = bench.median(mount_s), bench.median(orbax_s), bench.median(ts_s)
        table.add('(a) read every array: np.load through a fresh mount%s vs Orbax restore to numpy'
                  % (' (-o %s)' % a.mount_opts if a.mount_opts else ''),
                  '%.2f s (%.2f GB/s)' % (m, total / m / 1e9), 'Orbax %.2f s' % o, o / m, '≥ 1.00', o / m >= 1.0)
        table.add('(a) the same vs TensorStore reading every array directly', '%.2f s' % m,
                  'TensorStore %.2f s' % t, t / m)
        mc, oc, tc = bench.median(mount_c), bench.median(orbax_c), bench.median(ts_c)
        table.add('(a) CPU s/GiB: mount (reader + daemon) vs Orbax restore / TensorStore',
                  '%.2f' % (mc * GIB / total), 'Orbax %.2f / TS %.2f' % (oc * GIB / total, tc * GIB / total),
                  oc / mc)
        details.append('read runs (s): mount %s; Orbax restore %s; TensorStore %s'
                       % (fmt(mount_s), fmt(orbax_s), fmt(ts_s)))
        details.append('read CPU per GiB: mount %s (of which the daemon %s, the reader the rest); Orbax %s; '
                       'TensorStore %s' % (fmt([c * GIB / total for c in mount_c]),
                                           fmt([c * GIB / total for c in mount_d]),
                                           fmt([c * GIB / total for c in orbax_c]),
                                           fmt([c * GIB / total for c in ts_c])))

        # (b) writers through the mount
        w_s = []
        for i in range(runs):
            wroot = work / f'wroot{i}'
            wroot.mkdir()
            bench.drop_caches()
            with bench.Mount(daemon, wroot, work / 'wmnt', '', logs / 'write.log').start() as wm:
                step = wm.mnt / str(STEP)
                os.mkdir(step)
                for k in spec:
                    (step / 'default' / k).parent.mkdir(parents=True, exist_ok=True)
                procs = [subprocess.Popen([sys.executable, __file__, '--writer',
                                           json.dumps({'spec': jspec, 'seed': 0, 'index': j, 'count': a.writers,
                                                       'step': str(step)})], stdout=subprocess.PIPE, text=True)
                         for j in range(a.writers)]
                outs = [json.loads(p.communicate(timeout=1800)[0].strip().splitlines()[-1]) for p in procs]
                assert all(p.returncode == 0 for p in procs)
                t0 = max(o_['prepared'] for o_ in outs)   # arrays made in memory, as Orbax's are
                open(step / 'commit_success.txt', 'w').close()
                w_s.append(time.monotonic() - t0)
            shutil.rmtree(wroot)
        w, s = bench.median(w_s), bench.median(save_s)
        table.add(f'(b) write: {a.writers} processes np.save into the mount + commit vs Orbax save',
                  '%.2f s (%.2f GB/s)' % (w, total / w / 1e9), 'Orbax %.2f s' % s, s / w, '≥ 1.00', s / w >= 1.0)
        details.append('write runs (s): mount %s; Orbax save %s' % (fmt(w_s), fmt(save_s)))

        # (c) the safetensors view against a plain file
        plain = work / 'plain.safetensors'
        with bench.Mount(daemon, root, work / 'mnt', '', logs / 'st.log').start() as sm:
            shutil.copyfile(sm.mnt / str(STEP) / 'default' / 'params.safetensors', plain)
        v_s, p_s = [], []
        for _ in range(runs):
            bench.drop_caches()
            bench.warm_memory(a.warm)
            t0 = time.monotonic()
            with bench.Mount(daemon, root, work / 'mnt', '', logs / 'st.log').start() as sm:
                got = load_file(str(sm.mnt / str(STEP) / 'default' / 'params.safetensors'))
                v_s.append(time.monotonic() - t0)
            del got
            bench.drop_caches()
            bench.warm_memory(a.warm)
            t0 = time.monotonic()
            got = load_file(str(plain))
            p_s.append(time.monotonic() - t0)
            del got
        v, p = bench.median(v_s), bench.median(p_s)
        table.add('(c) safetensors.numpy.load_file: the view through a fresh mount vs a plain file',
                  '%.2f s' % v, 'plain file %.2f s' % p, p / v)
        details.append('safetensors runs (s): view %s; plain file %s' % (fmt(v_s), fmt(p_s)))
    finally:
        bench.cleanup_mounts()
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    load1 = bench.loadavg()
    print()
    print(table.render())
    print()
    for d in details:
        print('- ' + d)
    for n in notes:
        print('- note: ' + n)
    print('- ratio: the peer\'s time / the mount\'s time (above 1: the mount is faster)')
    print('- load average (1 min) at start / end: %.2f / %.2f on %d CPUs; wall time %.0f s'
          % (load0, load1, os.cpu_count(), time.monotonic() - t_start))
    return 0


def fmt(xs):
    return ', '.join('%.2f' % x for x in xs)


def orbax_version():
    from importlib.metadata import version
    return version('orbax-checkpoint')


if __name__ == '__main__':
    sys.exit(main())
