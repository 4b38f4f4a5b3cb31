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
# The yardstick: a program of one dynamic resource that reads nothing and changes nothing, run by the same CLI,
# language host and virtualenv - what any Pulumi program pays for an `up` on this machine.
TRIVIAL_PROGRAM = '''"""make bench's yardstick: one dynamic resource, nothing read, nothing changed."""
import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ReadResult, Resource, ResourceProvider


class Nothing(ResourceProvider):
    def create(self, props):
        return CreateResult('nothing', props)

    def diff(self, _id, olds, news):
        return DiffResult(changes=False)

    def read(self, id_, props):
        return ReadResult(id_, props)


class Thing(Resource):
    pass


Thing(Nothing(), 'thing', {'value': 1})
'''


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
        trivial = os.path.join(base, 'trivial')
        os.makedirs(trivial)
        with open(os.path.join(trivial, 'Pulumi.yaml'), 'w') as f:
            f.write('name: trivial\nruntime:\n  name: python\n  options:\n    virtualenv: %s\n'
                    % os.path.join(ROOT, '.venv'))
        with open(os.path.join(trivial, '__main__.py'), 'w') as f:
            f.write(TRIVIAL_PROGRAM)
        lab.pulumi('stack', 'select', '--create', '--secrets-provider', 'passphrase', 'trivial', cwd=trivial)
        lab.pulumi('up', '--yes', '--skip-preview', '--stack', 'trivial', cwd=trivial)
        rows = []
        for name, args in (('preview (no-op)', ('preview', '--expect-no-changes')),
                           ('up (no-op)', ('up', '--yes', '--expect-no-changes')),
                           ('up --refresh (no-op)', ('up', '--yes', '--refresh', '--expect-no-changes'))):
            times, sessions, yardstick = [], [], []
            digest, starts = lab.host_digest(), lab.unit_starts()
            for _ in range(RUNS):
                before = lab.ssh_sessions()
                times.append(timed(lambda: lab.pulumi(*args, stack=STACK)))
                sessions.append(lab.ssh_sessions() - before)
                # Side by side: the machine's load changes both alike.
                yardstick.append(timed(lambda: lab.pulumi(*args, '--stack', 'trivial', cwd=trivial)))
            changed = lab.host_digest() != digest
            rows.append((name, statistics.median(times), min(times), max(times), statistics.median(sessions),
                         changed, lab.unit_starts() - starts, statistics.median(yardstick)))
    finally:
        lab.down()
    cpu = subprocess.run(['sh', '-c', "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"], capture_output=True,
                         text=True).stdout.strip()
    lines = ['# Benchmark: no-op preview and up on the lab', '',
             'Measured by `make bench` (tools/bench.py) on %s: %s, %d cores, Python %s, %d runs each.' % (
                 datetime.date.today().isoformat(), cpu or platform.machine(), os.cpu_count(),
                 platform.python_version(), RUNS), '',
             'First `up` from empty (12 resources; the NVIDIA user space, CUDA and the Python environment installed '
             'in the bare container; SGLang start-up simulated at 0.2 s): %.1f s.' % first, '',
             '| command | median s | min s | max s | SSH commands per run | host changed | SGLang restarts | '
             'one-resource program, median s | ratio |',
             '|---|---|---|---|---|---|---|---|---|']
    for name, med, lo, hi, sess, changed, restarts, trivial_med in rows:
        lines.append('| `%s` | %.2f | %.2f | %.2f | %d | %s | %d | %.2f | %.1fx |' % (
            name, med, lo, hi, sess, 'yes' if changed else 'no', restarts, trivial_med, med / trivial_med))
    lines += ['', 'SSH commands are counted from the lab sshd\'s log (one "Starting session: command" per remote '
              'command). A no-op `up` runs none: diff() compares desired state with the state recorded at the last '
              'apply or refresh. `up --refresh` re-reads every resource (read-only scripts: host facts, file '
              'reads, container unit facts); "host changed" compares a hash of every file of the simulated host. '
              'The one-resource program (tools/bench.py TRIVIAL_PROGRAM: one dynamic resource that reads and changes '
              'nothing) runs the same command with the same CLI and virtualenv right after each run: the ratio is '
              'what this program costs beyond any Pulumi program on this machine.']
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
