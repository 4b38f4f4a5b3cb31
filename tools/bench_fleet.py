"""make bench-fleet: a fleet on the lab, side by side - no-op preview, up and up --refresh of 1 and 8 hosts, the
operator machine's own CPU seconds for each (the pulumi CLI, the program, the plugin processes: everything the
CLI ran and waited for, not the simulated hosts), SSH connections and commands per host, and a rolling MTP
change across 8 hosts (the most hosts whose SGLang was down at one moment, and the total time). Writes its
section of docs/bench.md, with its own wall time (goal: at most 15 minutes on 2 cores, first ups included).

Nine simulated hosts (lab/fleet.py topologies, each its own fakepve and sshd on its own loopback /24, claimed
like a test module's: tests/lablib.py claim_net): stack f1 manages one, f8 the other eight, so each stack owns
its hosts (as separate sites would). Every stack lists its hosts in gpuhost:hosts. BENCH_RUNS (default 3) runs
of each command.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.lablib import FleetLab, claim_net, max_overlap  # noqa: E402

RUNS = int(os.environ.get('BENCH_RUNS', '3'))
BEGIN, END = '<!-- bench-fleet: begin (tools/bench_fleet.py) -->', '<!-- bench-fleet: end -->'


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def children_cpu() -> float:
    """CPU seconds of the processes this one ran and waited for (the CLI and whatever it ran and waited for: the
    language host, the program, the plugins) - the operator machine's side. The simulated hosts (sshd, fakepve, the
    containers) were started by the labs, not by a CLI, and are not in it."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def adopt_orphans() -> None:
    """Make this process the reaper of what its children leave running: the gpuhost plugin's serving process
    (provider/stub.py) is not the child of the stub that started it, and outlives the CLI by a moment. Adopted, it is
    waited for here and its CPU counts in children_cpu() like the CLI's."""
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)   # PR_SET_CHILD_SUBREAPER


def serving_children() -> list:
    """This process's adopted children that are a pass's gpuhost serving process (provider/__main__.py --serve, or
    forked by the plugin's zygote, which has that command line: not the zygote itself, which ends a minute after its
    last fork)."""
    me, out = os.getpid(), []
    for pid in os.listdir('/proc'):
        if not pid.isdigit():
            continue
        try:
            with open('/proc/%s/stat' % pid) as f:
                ppid = int(f.read().rpartition(')')[2].split()[1])
            with open('/proc/%s/cmdline' % pid, 'rb') as f:
                cmd = f.read().split(b'\0')
            with open('/proc/%s/comm' % pid) as f:
                zygote = f.read().strip() == 'gpuhost-zygote'
        except (OSError, ValueError, IndexError):
            continue
        if ppid == me and KINDS[2][1](cmd) and not zygote:
            out.append(int(pid))
    return out


# What runs on the operator's machine during a pass, by the process's command line (first match wins).
KINDS = (('pulumi CLI', lambda cmd: cmd[:1] and os.path.basename(cmd[0]) == b'pulumi'),
         ('language host', lambda cmd: cmd[:1] and os.path.basename(cmd[0]) == b'pulumi-language-python'),
         # With the zygote's forks (they have its command line) and the zygote itself (its imports, once).
         ('plugin serving process', lambda cmd: (b'--serve' in cmd or b'--zygote' in cmd) and
          any(c.endswith(b'provider/__main__.py') for c in cmd)),
         ('plugin stubs', lambda cmd: any(c.endswith((b'provider/stub.py', b'provider/bin/gpuhost-stub'))
                                          for c in cmd)),
         ('the program (Python)', lambda cmd: any(b'pulumi-language-python-exec' in c for c in cmd)),
         ('pulumi-command plugin', lambda cmd: cmd[:1] and os.path.basename(cmd[0]) == b'pulumi-resource-command'),
         ('ssh-agent', lambda cmd: cmd[:1] and os.path.basename(cmd[0]) == b'ssh-agent'),
         ('other (pip --version and list, ...)', lambda cmd: True))


def descendants_cpu() -> dict:
    """{pid: (kind, own CPU seconds so far)} of every process below this one (the CLI and what it started; the
    serving process, adopted). Own CPU only (utime + stime): a parent's count of its waited children would count
    them twice."""
    parents, info = {}, {}
    tick = os.sysconf('SC_CLK_TCK')
    for pid in os.listdir('/proc'):
        if not pid.isdigit():
            continue
        try:
            with open('/proc/%s/stat' % pid) as f:
                fields = f.read().rpartition(')')[2].split()
            with open('/proc/%s/cmdline' % pid, 'rb') as f:
                cmd = f.read().rstrip(b'\0').split(b'\0')
        except (OSError, ValueError, IndexError):
            continue
        parents[int(pid)] = int(fields[1])
        info[int(pid)] = (cmd, (int(fields[11]) + int(fields[12])) / tick)
    me, out = os.getpid(), {}
    for pid, (cmd, cpu) in info.items():
        # The CLI's side only: what a `pulumi` process started (the language host, the program, the stubs), and what
        # its processes left to this one (the serving process, an ssh-agent) - not the labs' simulated hosts, which
        # this process started too.
        cli = KINDS[0][1](cmd)
        p, hops = parents.get(pid), 0
        while p not in (None, 0, 1, me) and hops < 64:
            cli = cli or KINDS[0][1](info.get(p, ([b''], 0))[0])
            p, hops = parents.get(p), hops + 1
        left = parents.get(pid) == me and (KINDS[2][1](cmd) or os.path.basename(cmd[0]) == b'ssh-agent')
        if p == me and (cli or left):
            out[pid] = (next(k for k, match in KINDS if match(cmd)), cpu)
    return out


def machine_cpu() -> float:
    """CPU seconds the whole machine has spent busy (/proc/stat: user, nice, system, irq, softirq, steal)."""
    with open('/proc/stat') as f:
        fields = [int(v) for v in f.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf('SC_CLK_TCK')


def measured(fn):
    """(wall seconds, operator CPU seconds, plugin serving processes, machine CPU seconds, {kind: CPU seconds}) of
    fn(). The CPU includes the plugin's serving processes of the run (seen while it runs, waited for after it: they
    end a moment after their pass, not in the wall). The CPU by kind is sampled every 0.1 s (descendants_cpu): what
    a process spent after its last sample, and what processes too short to be sampled spent, is "not sampled"."""
    import threading
    seen, done, last = set(), threading.Event(), {}

    def watch():
        while not done.wait(0.1):
            seen.update(serving_children())
            last.update(descendants_cpu())
    # A serving process of an earlier command (a first up, a stack setting) ends before this one is measured.
    for pid in serving_children():
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    watcher = threading.Thread(target=watch, daemon=True)
    earlier = descendants_cpu()     # what runs already (an agent of an earlier command) counts from here
    watcher.start()
    cpu, machine = children_cpu(), machine_cpu()
    try:
        wall = timed(fn)
    finally:
        machine = machine_cpu() - machine
        done.set()
        watcher.join()
    seen.update(serving_children())
    for pid in seen:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    total = children_cpu() - cpu
    kinds = {}
    for pid, (kind, used) in last.items():
        kinds[kind] = kinds.get(kind, 0.0) + used - earlier.get(pid, (kind, 0.0))[1]
    kinds['not sampled'] = max(0.0, total - sum(kinds.values()))
    return wall, total, len(seen), machine, kinds


def connections(lab) -> int:
    with open(os.path.join(lab.dir, 'sshd.log'), errors='replace') as f:
        return sum(1 for line in f if 'Accepted publickey' in line)


def counters(labs):
    return {n: (connections(lab), lab.ssh_sessions()) for n, lab in labs.items()}


def per_host(before, after, names):
    conns = [after[n][0] - before[n][0] for n in names]
    cmds = [after[n][1] - before[n][1] for n in names]
    return max(conns), statistics.median(cmds)


def cost_note(rows) -> str:
    """What each host beyond the first costs, from the table: wall, operator and machine CPU seconds."""
    by = {(r[0], r[1]): (r[2], r[5], r[-1]) for r in rows}
    parts = []
    for what in ('preview (no-op)', 'up (no-op)', 'up --refresh (no-op)'):
        (w1, c1, m1), (w8, c8, m8) = by[(what, 1)], by[(what, 8)]
        parts.append('`%s` %.2f s of wall, %.2f CPU-s of the operator\'s and %.2f of the machine\'s' % (
            what, (w8 - w1) / 7, (c8 - c1) / 7, (m8 - m1) / 7))
    return ('What each host beyond the first costs, from the table (8 hosts less 1, over 7): %s. On 2 cores the '
            'simulated hosts take their share of the same CPU (machine less operator), so the wall of 8 hosts is '
            'bounded by both sides\' CPU together; on a real site only the operator column is the operator '
            'machine\'s.' % '; '.join(parts))


def cpu_split(split) -> list:
    """The table of the operator's CPU by process kind (median of the runs), 1 and 8 hosts, and per extra host."""
    order = [k for k, _ in KINDS] + ['not sampled']
    cols = [(what, n) for what in ('preview (no-op)', 'up (no-op)', 'up --refresh (no-op)') for n in (1, 8)]
    lines = ['Where the operator\'s CPU goes (CPU-s, median of the runs; each process sampled every 0.1 s by '
             'tools/bench_fleet.py descendants_cpu, by its command line; "not sampled": what processes spent after '
             'their last sample or lived too briefly to be seen):', '',
             '| process | ' + ' | '.join('%s, %d host%s' % (w, n, '' if n == 1 else 's') for w, n in cols) +
             ' | per extra host, `up --refresh` |', '|---|' + '---|' * (len(cols) + 1)]
    for kind in order:
        vals = [split.get(c, {}).get(kind, 0.0) for c in cols]
        extra = (split.get(('up --refresh (no-op)', 8), {}).get(kind, 0.0) -
                 split.get(('up --refresh (no-op)', 1), {}).get(kind, 0.0)) / 7
        lines.append('| %s | %s | %.2f |' % (kind, ' | '.join('%.2f' % v for v in vals), extra))
    return lines


def main():
    adopt_orphans()
    began = time.perf_counter()
    base = tempfile.mkdtemp(prefix='gpuhost-bench-fleet-')
    # The locks are held until the process ends: no test module starts a lab on one of these nets.
    locks = [claim_net() for _ in range(9)]
    fleet = FleetLab(base, [net for net, _ in locks])
    stacks = {'f1': ['gpu01'], 'f8': ['gpu%02d' % i for i in range(2, 10)]}
    rows, first, split = [], {}, {}
    load = [os.getloadavg()[0]]
    try:
        for i in range(1, 10):
            fleet.add(i)
        for stack, names in stacks.items():
            fleet.write_stack(stack, fleet.stack_config(names))
            # From bare containers: every host installs its NVIDIA user space, CUDA and SGLang environment,
            # one host at a time (max_unavailable 1) - longer than a test's 600 s for eight.
            first[stack] = timed(lambda: fleet.pulumi('up', '--yes', '--skip-preview', stack=stack, timeout=3600))
        for what, args in (('preview (no-op)', ('preview', '--expect-no-changes')),
                           ('up (no-op)', ('up', '--yes', '--expect-no-changes')),
                           ('up --refresh (no-op)', ('up', '--yes', '--refresh', '--expect-no-changes'))):
            for stack in ('f1', 'f8'):
                names = stacks[stack]
                times, cpus, conns, cmds, servers, machines, kinds = [], [], [], [], [], [], []
                for _ in range(RUNS):
                    before = counters(fleet.labs)
                    wall, cpu, served, machine, by_kind = measured(lambda: fleet.pulumi(*args, stack=stack))
                    kinds.append(by_kind)
                    times.append(wall)
                    cpus.append(cpu)
                    servers.append(served)
                    machines.append(machine)
                    c, m = per_host(before, counters(fleet.labs), names)
                    conns.append(c)
                    cmds.append(m)
                rows.append((what, len(names), statistics.median(times), min(times), max(times),
                             statistics.median(cpus), max(conns), statistics.median(cmds), max(servers),
                             statistics.median(machines)))
                split[(what, len(names))] = {k: statistics.median([r.get(k, 0.0) for r in kinds])
                                             for k in {k for r in kinds for k in r}}
        # The rolling MTP change: NEXTN 1 step -> 2 steps on the eight hosts of f8.
        names = stacks['f8']
        cfg = fleet.stack_config(names)
        cfg['gpuhost:sglang']['speculative'] = {'algorithm': 'NEXTN', 'num_steps': 2, 'eagle_topk': 1,
                                                'num_draft_tokens': 3}
        fleet.write_stack('f8', cfg)
        before = counters(fleet.labs)
        start = time.time()
        rolling = timed(lambda: fleet.pulumi('up', '--yes', '--skip-preview', stack='f8'))
        after = counters(fleet.labs)
        intervals = [iv for n in names for iv in fleet.labs[n].down_intervals() if iv[0] >= start]
        down_max = max_overlap(intervals)
        restarted = sum(1 for n in names if any(iv[0] >= start for iv in fleet.labs[n].down_intervals()))
        roll_conns, roll_cmds = per_host(before, after, names)
        outage = statistics.median([b - a for a, b in intervals]) if intervals else 0.0
    finally:
        fleet.down()
    load.append(os.getloadavg()[0])
    total = time.perf_counter() - began
    cpu = subprocess.run(['sh', '-c', "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"], capture_output=True,
                         text=True).stdout.strip()
    base1 = {w: med for w, n, med, *_ in rows if n == 1}
    lines = [BEGIN, '# Benchmark: a fleet (`make bench-fleet`)', '',
             'Measured by tools/bench_fleet.py on %s: %s, %d cores, Python %s, %d runs each; load average %.1f at the '
             'start, %.1f at the end; the whole benchmark took %.1f min (labs, first ups and every run). Hosts are '
             'simulated (lab/fleet.py, four topologies mixed), each with its own fakepve and sshd on loopback; every '
             'stack lists its hosts in gpuhost:hosts.' % (
                 datetime.date.today().isoformat(), cpu or platform.machine(), os.cpu_count(),
                 platform.python_version(), RUNS, load[0], load[1], total / 60), '',
             'First `up` from empty: 1 host %.1f s, 8 hosts %.1f s (guests and units roll out one host at a time, '
             'max_unavailable 1; host-level steps run in parallel).' % (first['f1'], first['f8']), '',
             '"operator CPU s": the CPU the operator\'s machine spent - the pulumi CLI and all it ran and waited for '
             '(the language host, the program, the gpuhost plugin processes), not the simulated hosts, which share '
             'these 2 cores with it here and would not on a real site. "machine CPU s": what the whole machine spent '
             'busy during the run (/proc/stat) - the operator\'s side plus the simulated hosts\' (their sshd, '
             'scripts, fakepve) and what else ran; %d cores give %d CPU-s per second of wall.' % (
                 os.cpu_count(), os.cpu_count()), '',
             '| command | hosts | median s | min s | max s | vs 1 host | operator CPU s (median) | machine CPU s '
             '(median) | SSH connections per host (max) | SSH commands per host (median) | plugin serving processes '
             'per run (max) |', '|---|---|---|---|---|---|---|---|---|---|---|']
    for what, n, med, lo, hi, cpu_s, conns, cmds, served, machine in rows:
        lines.append('| `%s` | %d | %.2f | %.2f | %.2f | %.2fx | %.1f | %.1f | %d | %g | %d |' % (
            what, n, med, lo, hi, med / base1[what], cpu_s, machine, conns, cmds, served))
    lines += ['', 'Rolling MTP change on 8 hosts (NEXTN 1 -> 2 steps, max_unavailable 1): %.1f s in all; %d of 8 '
              'hosts restarted; **at most %d host%s down at the same moment** (from the simulated SGLang\'s stop and '
              'start records; down = stop until the start plus its 1 s load); median outage %.1f s a host; SSH '
              'connections per host (max) %d, commands per host (median) %g.' % (
                  rolling, restarted, down_max, '' if down_max == 1 else 's', outage, roll_conns, roll_cmds), '',
              'SSH connections: the program opens one per host for the preflight of an `up` (never at preview); '
              'the host\'s gpuhost provider instance one per host, shared by every resource of that host '
              '(transport/remote.py pooled(), at most 8 commands at once), when a resource reads or changes it; '
              'pulumi-command one per smoke test (only when a unit or container changed). A refresh\'s reads of a '
              'host that arrive together go out as one command (transport/hostreads.py), the preflight\'s too. '
              'Each host has its own provider instance (`pulumi:providers:gpuhost`), and all of them are served by '
              'one plugin process per engine pass (the engine starts a stub per instance: provider/bin/gpuhost-stub, '
              '~7 ms of CPU, or provider/stub.py, ~39 ms, where Go did not build the first; '
              '"plugin serving processes per run" counts the serving processes - an `up` has two '
              'passes, its preview and its update; `up --refresh` three). The engine ran with PULUMI_PARALLEL=%s '
              '(what `make up` sets).' % (
                  os.environ.get('PULUMI_PARALLEL', 'the CLI\'s default')), '',
              cost_note(rows), ''] + cpu_split(split) + [END]
    section = '\n'.join(lines) + '\n'
    path = os.path.join(ROOT, 'docs', 'bench.md')
    with open(path) as f:
        text = f.read()
    if BEGIN in text and END in text:
        text = re.sub(re.escape(BEGIN) + '.*?' + re.escape(END) + '\n?', lambda _m: section, text, flags=re.S)
    else:
        text = text.rstrip('\n') + '\n\n' + section
    with open(path, 'w') as f:
        f.write(text)
    print(section)


if __name__ == '__main__':
    main()
