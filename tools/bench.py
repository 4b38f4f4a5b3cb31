"""make bench: wall time of a no-op `pulumi preview` and `pulumi up` on the lab, and how many remote
commands a no-op `up` runs (goal: none that change anything, no restart). Writes docs/bench.md.

Runs its own lab (on a loopback /24 claimed like a test module's: tests/lablib.py claim_net) and stack,
deploys once, then measures N repetitions.
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.lablib import Lab, claim_net  # noqa: E402

STACK = 'bench'
RUNS = int(os.environ.get('BENCH_RUNS', '5'))


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


KEEP_MARKER = '<!-- bench-serve: kept by tools/bench.py -->'


def main():
    base = tempfile.mkdtemp(prefix='gpuhost-bench-')
    net, lock = claim_net()  # held until the process ends: no test module starts a lab on the same net
    lab = Lab(base, net).up()
    try:
        lab.write_stack(STACK, lab.stack_config())
        first = timed(lambda: lab.pulumi('up', '--yes', '--skip-preview', stack=STACK))
        rows = []
        for name, args in (('preview (no-op)', ('preview', '--expect-no-changes')),
                           ('up (no-op)', ('up', '--yes', '--expect-no-changes')),
                           ('up --refresh (no-op)', ('up', '--yes', '--refresh', '--expect-no-changes'))):
            times, sessions = [], []
            digest, starts = lab.host_digest(), lab.unit_starts()
            for _ in range(RUNS):
                before = lab.ssh_sessions()
                times.append(timed(lambda: lab.pulumi(*args, stack=STACK)))
                sessions.append(lab.ssh_sessions() - before)
            changed = lab.host_digest() != digest
            rows.append((name, statistics.median(times), min(times), max(times), statistics.median(sessions),
                         changed, lab.unit_starts() - starts))
    finally:
        lab.down()
    cpu = subprocess.run(['sh', '-c', "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"], capture_output=True,
                         text=True).stdout.strip()
    lines = ['# Benchmark: no-op preview and up on the lab', '',
             'Measured by `make bench` (tools/bench.py) on %s: %s, %d cores, Python %s, %d runs each.' % (
                 datetime.date.today().isoformat(), cpu or platform.machine(), os.cpu_count(),
                 platform.python_version(), RUNS), '',
             'First `up` from empty (12 resources, SGLang start-up simulated at 1 s): %.1f s.' % first, '',
             '| command | median s | min s | max s | SSH commands per run | host changed | SGLang restarts |',
             '|---|---|---|---|---|---|---|']
    for name, med, lo, hi, sess, changed, restarts in rows:
        lines.append('| `%s` | %.2f | %.2f | %.2f | %d | %s | %d |' % (name, med, lo, hi, sess,
                                                                       'yes' if changed else 'no', restarts))
    lines += ['', 'SSH commands are counted from the lab sshd\'s log (one "Starting session: command" per remote '
              'command). A no-op `up` runs none: diff() compares desired state with the state recorded at the last '
              'apply or refresh. `up --refresh` re-reads every resource (read-only scripts: host facts, file '
              'reads, container unit facts); "host changed" compares a hash of every file of the simulated host.']
    text = '\n'.join(lines) + '\n'
    os.makedirs(os.path.join(ROOT, 'docs'), exist_ok=True)
    path = os.path.join(ROOT, 'docs', 'bench.md')
    # The endpoint benchmark's section (make bench-serve, written by hand from its results) is kept.
    kept = ''
    if os.path.exists(path):
        with open(path) as f:
            old = f.read()
        if KEEP_MARKER in old:
            kept = '\n' + old[old.index(KEEP_MARKER):]
    with open(path, 'w') as f:
        f.write(text + kept)
    print(text)


if __name__ == '__main__':
    main()
