"""The GPU proof (issue 48): before SGLang starts, show that the container's GPUs work the way SGLang will use them.
Runs in the serving container with the service's own Python, torch and environment (the unit's NCCL_*/CUDA_*
variables, NCCL_P2P_DISABLE=1 among them, reach the workers unchanged).

  gpu_proof.py --gpus 0000:01:00.0,0000:11:00.0 [--tp N] [--sizes 1M,16M,128M] [--time-limit 60] [--min-busbw GBPS]
               [--json PATH]

1. torch sees exactly the declared GPUs: count and PCI bus ids, matched by bus id whatever CUDA's device order
   (CUDA_DEVICE_ORDER, CUDA_VISIBLE_DEVICES);
2. each GPU multiplies two bf16 matrices, the result checked against an fp32 product of the same inputs; its TFLOP/s
   and its memory (total, free);
3. the first --tp GPUs (default: all) all-reduce through torch.distributed and NCCL, one process a GPU as SGLang's
   tensor parallelism runs: the exact sum (each rank fills rank+1, every element must be n(n+1)/2), over --sizes, with
   the time per all-reduce, algbw = bytes/time and busbw = algbw * 2(n-1)/n (nccl-tests' definitions), and the
   transport NCCL chose, read from NCCL's own INFO log (P2P, SHM, NET);
4. a hard time limit for the whole proof: the workers (this script with --worker RANK, one a GPU) run in process
   groups of their own and get SIGTERM, then SIGKILL, so that the proof ends within --time-limit; a hang is a result.

Prints one JSON document (to --json PATH, or stdout) and its one-line `message` on stderr.
Exit status: 0 every check passed, 1 a check failed, 2 a hang (the workers were killed), 3 bad arguments or no torch.
This process uses the standard library only; the workers import torch."""

import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

OK, FAILED, HANG, ERROR = 0, 1, 2, 3
MATMUL_N = 8192        # 1.1 TFLOP a product: long enough to time, 0.4 GB of memory
CHECK_ROWS = 256       # rows of the product compared with the fp32 reference
MATMUL_ITERS = 20
MAX_REL_ERR = 1e-2     # bf16 rounding of the output alone gives about 2e-3; a broken GPU gives ~1 or NaN
MARK = 'gpu-proof '    # the workers' report lines on stdout start with it; other output there is ignored
DEFAULT_SIZES = '1M,16M,128M'
# SYSTEM.md: peer-to-peer DMA between the GPUs does not work under the IOMMU's translation mode.
P2P_HINT = ' (P2P under the IOMMU\'s translation mode hangs or corrupts: NCCL_P2P_DISABLE=1 in the unit)'
STAGES = {None: 'starting', 'import torch': 'importing torch', 'inventory': 'listing its GPUs',
          'matmul': 'its bf16 matmul', 'all-reduce': 'the all-reduce', 'done': 'its exit after the checks'}
UNITS = {'': 1, 'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30}
BUS_RE = re.compile(r'^(?:([0-9a-f]{1,8}):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])$')
# NCCL's transport set-up lines (src/transport/p2p.cc, shm.cc, net.cc), e.g.
# "host:919:1150 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/IPC/read", "... via SHM/direct/direct",
# "... Channel 03/0 : 15[7] -> 6[6] [send] via NET/Socket/3"
CHANNEL_RE = re.compile(r'NCCL INFO Channel \d+(?:/\d+)? : \d+\[[0-9a-f]+\] -> \d+\[[0-9a-f]+\]'
                        r'(?: \[(?:send|receive)\])? via (\S.*?)\s*$')
ENV_RE = re.compile(r'NCCL INFO (NCCL_\w+) set by environment to (.*?)\.?\s*$')


# ------------------------------------------------------------------------------------------ pure parts

def bus_id(text):
    """A PCI address as dddd:bb:dd.f in lowercase (nvidia-smi writes 00000000:01:00.0, lspci 01:00.0)."""
    m = BUS_RE.match(text.strip().lower())
    if not m:
        raise ValueError('%r is not a PCI bus id (dddd:bb:dd.f, e.g. 0000:01:00.0)' % text)
    domain, bus, dev, fn = m.groups()
    return '%04x:%02x:%02x.%s' % (int(domain or '0', 16), int(bus, 16), int(dev, 16), fn)


def compare_gpus(declared, seen):
    """None when torch sees exactly the declared GPUs (in any order), else the message naming the difference."""
    missing = [b for b in declared if b not in seen]
    extra = [b for b in seen if b not in declared]
    if not missing and not extra:
        return None
    diff = []
    if missing:
        diff.append('%s %s missing' % (', '.join(missing), 'is' if len(missing) == 1 else 'are'))
    if extra:
        diff.append('%s %s not declared' % (', '.join(extra), 'is' if len(extra) == 1 else 'are'))
    visible = os.environ.get('CUDA_VISIBLE_DEVICES')
    return ('torch sees %d GPU%s (%s), %d declared: %s; check the container\'s GPU devices%s' % (
        len(seen), '' if len(seen) == 1 else 's', ', '.join(seen) or 'none', len(declared), '; '.join(diff),
        '' if visible is None else ' and CUDA_VISIBLE_DEVICES=%s' % visible))


def bandwidth(nbytes, seconds, world):
    """(algbw, busbw) in bytes/s for an all-reduce, as nccl-tests defines them (doc/PERFORMANCE.md)."""
    algbw = nbytes / seconds
    return algbw, algbw * 2 * (world - 1) / world


def parse_nccl_log(text):
    """(the distinct transports NCCL set up, e.g. ['SHM/direct/direct'], {NCCL_* variable: value NCCL read})."""
    via, env = set(), {}
    for line in text.splitlines():
        m = CHANNEL_RE.search(line)
        if m:
            via.add(m.group(1))
        m = ENV_RE.search(line)
        if m:
            env[m.group(1)] = m.group(2)
    return sorted(via), env


def transport_name(via, world):
    if world == 1:
        return 'none (one GPU)'
    kinds = sorted({v.split('/', 1)[0] for v in via})
    return '+'.join(kinds) if kinds else 'not chosen yet (no channel in the NCCL log)'


def parse_sizes(text):
    sizes = []
    for part in text.split(','):
        m = re.match(r'^\s*(\d+)\s*([KMG]?)i?B?\s*$', part, re.I)
        if not m or int(m.group(1)) == 0:
            raise argparse.ArgumentTypeError('%r is not a size (bytes, or with K, M or G: 1M,16M,128M)' % part)
        sizes.append(int(m.group(1)) * UNITS[m.group(2).upper()])
    return sizes


def parse_gpus(text):
    try:
        gpus = [bus_id(g) for g in text.split(',') if g.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e))
    dup = sorted({g for g in gpus if gpus.count(g) > 1})
    if not gpus or dup:
        raise argparse.ArgumentTypeError('declared twice: %s' % ', '.join(dup) if dup else 'no GPU given')
    return gpus


def human(nbytes):
    for unit, size in (('GiB', 1 << 30), ('MiB', 1 << 20), ('KiB', 1 << 10)):
        if nbytes >= size:
            return '%g %s' % (round(nbytes / size, 2), unit)
    return '%d B' % nbytes


def finite(x):
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


class Parser(argparse.ArgumentParser):
    def error(self, message):   # argparse's own status 2 means a hang here
        self.print_usage(sys.stderr)
        sys.stderr.write('%s: error: %s\n' % (self.prog, message))
        sys.exit(ERROR)


def parse_args(argv):
    p = Parser(prog='gpu_proof.py', description=__doc__.split('\n\n')[0],
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--gpus', type=parse_gpus, required=True, help='the declared PCI bus ids, comma-separated')
    p.add_argument('--tp', type=int, help='world size of the all-reduce (default: the number of --gpus)')
    p.add_argument('--sizes', type=parse_sizes, default=parse_sizes(DEFAULT_SIZES),
                   help='bytes per all-reduce, comma-separated, K/M/G = KiB/MiB/GiB (default %s)' % DEFAULT_SIZES)
    p.add_argument('--time-limit', type=float, default=60.0, help='seconds for the whole proof (default 60)')
    p.add_argument('--min-busbw', type=float, metavar='GBPS',
                   help='the floor for the all-reduce\'s bus bandwidth at its largest size, in GB/s (nccl-tests\' '
                        'busbw; default: none - the figure is reported, not judged)')
    p.add_argument('--json', default='-', help='where the JSON goes (default: stdout)')
    p.add_argument('--worker', type=int, help=argparse.SUPPRESS)
    p.add_argument('--store', help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.tp is None:
        args.tp = len(args.gpus)
    if not 1 <= args.tp <= len(args.gpus):
        p.error('--tp %d: the all-reduce takes one declared GPU a rank and --gpus names %d' % (args.tp, len(args.gpus)))
    if not args.time_limit > 0:
        p.error('--time-limit must be positive')
    if args.min_busbw is not None and not args.min_busbw > 0:
        p.error('--min-busbw must be positive')
    return args


# ------------------------------------------------------------------------------------------ the worker (torch)

def emit(**fields):
    print(MARK + json.dumps(fields), flush=True)


def nccl_version(torch):
    v = torch.cuda.nccl.version()
    return '.'.join(map(str, v)) if isinstance(v, tuple) else str(v)


def device_bus_id(props):
    try:
        return '%04x:%02x:%02x.0' % (props.pci_domain_id, props.pci_bus_id, props.pci_device_id)
    except AttributeError:
        raise RuntimeError('this torch does not report PCI bus ids (torch.cuda.get_device_properties has no '
                           'pci_bus_id): a newer torch is needed')


def matmul(torch):
    a = torch.randn(MATMUL_N, MATMUL_N, device='cuda', dtype=torch.bfloat16)
    b = torch.randn(MATMUL_N, MATMUL_N, device='cuda', dtype=torch.bfloat16)
    c = a @ b
    ref = a[:CHECK_ROWS].float() @ b.float()   # fp32 (TF32 is off by default): another kernel, same inputs
    err = ((c[:CHECK_ROWS].float() - ref).norm() / ref.norm()).item()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(MATMUL_ITERS):
        c = a @ b
    torch.cuda.synchronize()
    secs = (time.perf_counter() - t0) / MATMUL_ITERS
    return {'ok': err <= MAX_REL_ERR, 'rel_err': finite(err), 'tflops': 2 * MATMUL_N ** 3 / secs / 1e12,
            'n': MATMUL_N}


def allreduce(torch, dist, rank, args):
    import datetime
    n = args.tp
    want = n * (n + 1) // 2
    # bf16 as SGLang reduces, while the sum is exact in it (integers up to 256)
    dtype, elem = (torch.bfloat16, 2) if want <= 256 else (torch.float32, 4)
    t0 = time.perf_counter()
    # The store's and NCCL watchdog's own timeout is past the proof's limit: the parent's kill decides.
    dist.init_process_group('nccl', init_method='file://' + args.store, rank=rank, world_size=n,
                            timeout=datetime.timedelta(seconds=args.time_limit + 60))
    dist.all_reduce(torch.ones(1, device='cuda', dtype=dtype))   # NCCL sets its communicator up here
    torch.cuda.synchronize()
    out = {'dtype': str(dtype).replace('torch.', ''), 'init_seconds': time.perf_counter() - t0, 'sizes': []}
    for size in args.sizes:
        numel = max(1, size // elem)
        emit(stage='all-reduce', bytes=numel * elem)
        t = torch.full((numel,), float(rank + 1), device='cuda', dtype=dtype)
        dist.all_reduce(t)
        got = [t.min().item(), t.max().item()]
        iters = max(3, min(20, (256 << 20) // (numel * elem)))
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        out['sizes'].append({'bytes': numel * elem, 'seconds': (time.perf_counter() - start) / iters,
                             'iters': iters, 'ok': got == [want, want], 'got': got, 'want': want})
        del t
    dist.destroy_process_group()
    return out


def worker(args):
    rank = args.worker
    emit(stage='import torch', pid=os.getpid())
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        emit(error='torch does not import in %s: %s' % (sys.executable, e))
        return ERROR
    stage = 'inventory'
    try:
        emit(stage=stage, versions={'torch': torch.__version__, 'cuda': torch.version.cuda,
                                    'nccl': nccl_version(torch)})
        seen = [device_bus_id(torch.cuda.get_device_properties(i)) for i in range(torch.cuda.device_count())]
        emit(seen=seen)
        mine = args.gpus[rank]
        if mine not in seen:
            emit(error='torch does not see it')
            return FAILED
        index = seen.index(mine)
        torch.cuda.set_device(index)
        free, total = torch.cuda.mem_get_info(index)
        stage = 'matmul'
        emit(stage=stage)
        gpu = matmul(torch)
        gpu.update(index=index, name=torch.cuda.get_device_properties(index).name, memory_total=total,
                   memory_free=free)
        emit(gpu=gpu)
        if rank < args.tp:
            stage = 'all-reduce'
            emit(stage=stage)
            emit(allreduce=allreduce(torch, dist, rank, args))
    except Exception as e:   # the parent reports it, with the stage and the log's tail
        emit(error='%s: %s' % (type(e).__name__, e), stage=stage)
        return FAILED
    emit(stage='done')
    return OK


# ------------------------------------------------------------------------------------------ the parent

def die_with_parent(libc):
    # A parent killed outright (an orchestrator's own timeout) must not leave workers holding GPUs: the kernel
    # sends them SIGKILL when it goes (prctl PR_SET_PDEATHSIG = 1). A parent gone before the prctl: exit now.
    parent = os.getpid()

    def set_pdeathsig():
        libc.prctl(1, int(signal.SIGKILL))
        if os.getppid() != parent:
            os._exit(ERROR)
    return set_pdeathsig


def spawn(args, tmp):
    import ctypes
    libc = ctypes.CDLL(None)
    procs = []
    for rank in range(len(args.gpus)):
        # NCCL logs to stdout block-buffered, lost when a hung worker is killed; its own file is line-buffered.
        env = dict(os.environ, NCCL_DEBUG='INFO', NCCL_DEBUG_SUBSYS='INIT,ENV', PYTHONUNBUFFERED='1',
                   NCCL_DEBUG_FILE=os.path.join(tmp, 'nccl-%d.log' % rank))
        cmd = [sys.executable, os.path.abspath(__file__), '--worker', str(rank), '--gpus', ','.join(args.gpus),
               '--tp', str(args.tp), '--sizes', ','.join(map(str, args.sizes)), '--time-limit', str(args.time_limit),
               '--store', os.path.join(tmp, 'store')]
        with open(os.path.join(tmp, 'worker-%d.log' % rank), 'wb') as log:
            procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          env=env, start_new_session=True, preexec_fn=die_with_parent(libc)))
    return procs


def supervise(procs, deadline):
    """'done' when every worker exited, 'failed' when one exited non-zero (the others would wait for it in the
    all-reduce), 'hang' at the deadline."""
    while True:
        codes = [p.poll() for p in procs]
        if None not in codes:
            return 'done'
        if any(c not in (None, 0) for c in codes):
            return 'failed'
        if time.monotonic() >= deadline:
            return 'hang'
        time.sleep(0.05)


def group_alive(pgid):
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop(procs, grace):
    """SIGTERM to every worker's process group, SIGKILL to what is left after `grace` s. Returns the process groups
    still alive after that (a process stuck in the driver), [] normally."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        live = [p for p in procs if p.poll() is None or group_alive(p.pid)]
        if not live:
            return []
        for p in live:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
        end = time.monotonic() + grace
        while time.monotonic() < end and any(p.poll() is None or group_alive(p.pid) for p in live):
            time.sleep(0.02)
    return [p.pid for p in procs if p.poll() is None or group_alive(p.pid)]


def read_reports(path):
    report, other = {}, []
    try:
        with open(path, errors='replace') as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        lines = []
    for line in lines:
        if line.startswith(MARK):
            try:
                report.update(json.loads(line[len(MARK):]))
            except ValueError:
                other.append(line)
        else:
            other.append(line)
    report['log_tail'] = [line for line in other if line.strip()][-15:]
    return report


def read_text(path):
    try:
        with open(path, errors='replace') as f:
            return f.read()
    except FileNotFoundError:
        return ''


def prove(args):
    start = time.monotonic()
    # The kill (SIGTERM, then SIGKILL, each given `grace`) and a grace for the report fit inside the limit.
    grace = min(2.0, args.time_limit / 20)
    tmp = tempfile.mkdtemp(prefix='gpu-proof-')
    procs = []
    try:
        procs = spawn(args, tmp)
        outcome = supervise(procs, start + args.time_limit - 3 * grace)
        first = [i for i, p in enumerate(procs) if p.returncode not in (None, 0)]   # before the kill adds its own
        kill_start = time.monotonic()
        left = stop(procs, grace)
        kill_seconds = time.monotonic() - kill_start
        codes = [p.returncode for p in procs]
        reports = [read_reports(os.path.join(tmp, 'worker-%d.log' % r)) for r in range(len(procs))]
        logs = [read_text(os.path.join(tmp, 'nccl-%d.log' % r)) for r in range(args.tp)]
    finally:
        stop(procs, 0.5)
        shutil.rmtree(tmp, ignore_errors=True)
    via, nccl_env = parse_nccl_log('\n'.join(logs))
    doc = summarise(args, outcome, first, codes, reports, via, nccl_env)
    doc.update(time_limit=args.time_limit, wall_seconds=round(time.monotonic() - start, 3), left=left)
    if outcome == 'hang':
        doc['kill_seconds'] = round(kill_seconds, 3)
    if left:
        doc['message'] += '; worker process group%s %s still alive after SIGKILL (stuck in the driver?)' % (
            '' if len(left) == 1 else 's', ', '.join(map(str, left)))
    return doc


def summarise(args, outcome, first, codes, reports, via, nccl_env):
    world = args.tp
    group = args.gpus[:world]
    transport = transport_name(via, world)
    seen = next((r['seen'] for r in reports if 'seen' in r), None)
    versions = next((r['versions'] for r in reports if 'versions' in r), {})
    gpus = []
    for rank, (gpu, r) in enumerate(zip(args.gpus, reports)):
        g = dict(r.get('gpu', {}), bus_id=gpu, rank=rank, pid=r.get('pid'), stage=r.get('stage'))
        g['ok'] = bool(g.get('ok')) and 'error' not in r
        if 'error' in r:
            g['error'] = r['error']
            g['log_tail'] = r['log_tail']
        gpus.append(g)
    sizes = []
    ranks = [r.get('allreduce') for r in reports[:world]]
    if all(ranks):
        for i, size in enumerate(ranks[0]['sizes']):
            rows = [rk['sizes'][i] for rk in ranks]
            secs = max(row['seconds'] for row in rows)   # the slowest rank's time, as the group waits for it
            algbw, busbw = bandwidth(size['bytes'], secs, world)
            bad = [row['got'] for row in rows if not row['ok']]
            sizes.append({'bytes': size['bytes'], 'seconds': secs, 'algbw': algbw, 'busbw': busbw,
                          'ok': not bad, 'got': bad[0] if bad else size['got'], 'want': size['want']})
    doc = {'ok': False, 'message': '', 'declared': args.gpus, 'seen': seen, 'tp': world, 'gpus': gpus,
           'allreduce': {'world_size': world, 'gpus': group, 'dtype': ranks[0]['dtype'] if all(ranks) else None,
                         'init_seconds': max(r['init_seconds'] for r in ranks) if all(ranks) else None,
                         'transport': transport, 'via': via, 'sizes': sizes},
           'nccl_env': nccl_env, 'versions': versions,
           'workers': [{'rank': i, 'pid': r.get('pid'), 'exit': c, 'stage': r.get('stage')}
                       for i, (r, c) in enumerate(zip(reports, codes))]}
    doc['exit'], doc['message'] = verdict(args, outcome, first, codes, reports, seen, gpus, sizes, transport)
    doc['ok'] = doc['exit'] == OK
    return doc


def verdict(args, outcome, first, codes, reports, seen, gpus, sizes, transport):
    """(exit status, the one-line message): the first failure in the order a person would look. `first`: the ranks
    that had exited non-zero before the kill; `codes`: the exit statuses after it (negative: killed)."""
    world = args.tp
    group = ', '.join(args.gpus[:world])
    chose = 'one GPU, no transport' if world == 1 else 'NCCL chose %s' % transport
    limit = '%g s' % args.time_limit
    if outcome == 'hang':
        stuck = [(i, reports[i].get('stage')) for i, c in enumerate(codes) if (c is None or c < 0) and i not in first]
        # A worker stuck before the all-reduce holds the others up in it: it is the one to name.
        before = [(i, s) for i, s in stuck if s != 'all-reduce']
        if before:
            i, s = before[0]
            return HANG, 'GPU %s (rank %d) did not finish %s within the %s limit; the workers were killed' % (
                args.gpus[i], i, STAGES.get(s, s), limit)
        size = max((r.get('bytes', 0) for r in reports[:world]), default=0)
        return HANG, 'the all-reduce across GPUs %s did not finish within the %s limit%s; %s; the workers were ' \
                     'killed%s' % (group, limit, ' (at %s)' % human(size) if size else '', chose, P2P_HINT
                                   if 'P2P' in transport else '')
    errors = [(i, r['error']) for i, r in enumerate(reports) if 'error' in r]
    if any(reports[i].get('stage') == 'import torch' for i, _ in errors):
        return ERROR, next(e for i, e in errors if reports[i].get('stage') == 'import torch')
    if seen is not None:
        mismatch = compare_gpus(args.gpus, seen)
        if mismatch:
            return FAILED, mismatch
    if errors or first:
        i, e = errors[0] if errors else (first[0], 'it exited without a report (the log: %s)' % (
            ' | '.join(reports[first[0]]['log_tail'][-3:]) or 'empty'))
        return FAILED, 'GPU %s (rank %d) failed during %s: %s' % (args.gpus[i], i, STAGES.get(
            reports[i].get('stage'), reports[i].get('stage')), e)
    for g in gpus:
        if not g['ok']:
            return FAILED, 'GPU %s: the bf16 matmul is wrong, relative error %s (limit %g); look for Xid errors in ' \
                           'the host\'s kernel log' % (g['bus_id'], g.get('rel_err'), MAX_REL_ERR)
    for s in sizes:
        if not s['ok']:
            return FAILED, 'the all-reduce across GPUs %s returned a wrong sum at %s: %s instead of %s; %s%s' % (
                group, human(s['bytes']), ' to '.join(sorted({'%g' % v for v in s['got']})), s['want'], chose,
                P2P_HINT if 'P2P' in transport else '')
    if not sizes:
        return FAILED, 'the all-reduce across GPUs %s reported no result' % group
    tflops = [g['tflops'] for g in gpus]
    big = max(sizes, key=lambda s: s['bytes'])
    if world == 1:   # NCCL moves no data for one rank: its time is a kernel launch, not a bandwidth
        reduced = 'the all-reduce of one rank exact (no data moves, no transport)'
    elif args.min_busbw and big['busbw'] < args.min_busbw * 1e9:
        return FAILED, 'the all-reduce across GPUs %s reached a bus bandwidth of %.3g GB/s at %s, below the floor of ' \
                       '%g GB/s; %s' % (group, big['busbw'] / 1e9, human(big['bytes']), args.min_busbw, chose)
    else:
        reduced = 'all-reduce of %s in %.3g ms, busbw %.3g GB/s; %s' % (
            human(big['bytes']), big['seconds'] * 1e3, big['busbw'] / 1e9, chose)
    return OK, '%d GPU%s ok (%s): bf16 matmul %.0f-%.0f TFLOP/s; %s' % (
        len(gpus), '' if len(gpus) == 1 else 's', ', '.join(args.gpus), min(tflops), max(tflops), reduced)


def write(doc, path):
    text = json.dumps(doc, indent=1, sort_keys=True) + '\n'
    if path == '-':
        sys.stdout.write(text)
        return
    tmp = '%s.tmp.%d' % (path, os.getpid())
    with open(tmp, 'w') as f:
        f.write(text)
    os.replace(tmp, path)


def on_signal(signum, frame):
    raise SystemExit(128 + signum)   # prove()'s finally kills the workers


def from_env_file(argv: list) -> list:
    """`--env-file PATH ARGS...` (ct_gpu_proof.sh: started with no environment, env -i): the unit's environment is in
    PATH - KEY=value entries each ended by a NUL, never on a command line, which any process list shows - so read it,
    remove it, and run again with exactly that environment. Other argv: as it is."""
    if argv[:1] != ['--env-file'] or len(argv) < 2:
        return argv
    with open(argv[1], 'rb') as f:
        data = f.read()
    os.unlink(argv[1])
    env = {}
    for entry in data.split(b'\0'):
        key, sep, value = entry.partition(b'=')
        if sep and key:
            env[os.fsdecode(key)] = os.fsdecode(value)
    os.execve(sys.executable, [sys.executable, os.path.abspath(__file__)] + argv[2:], env)


def main(argv=None):
    args = parse_args(from_env_file(sys.argv[1:] if argv is None else argv))
    if args.worker is not None:
        return worker(args)
    import importlib.util
    if importlib.util.find_spec('torch') is None:
        doc = {'ok': False, 'exit': ERROR, 'declared': args.gpus,
               'message': 'no torch in %s: run the proof with the serving environment\'s python' % sys.executable}
    else:
        signal.signal(signal.SIGTERM, on_signal)
        doc = prove(args)
    write(doc, args.json)
    print(doc['message'], file=sys.stderr)
    return doc['exit']


if __name__ == '__main__':
    sys.exit(main())
