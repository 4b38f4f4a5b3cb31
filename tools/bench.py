"""make bench: wall time of a no-op `pulumi preview` and `pulumi up` on the lab, and how many remote
commands each runs (goal: none that change anything, no restart). Writes its section of docs/bench.md (between
BEGIN and END; tests/unit/test_docs.py checks it: its table, its resource count against the program's, its prose
against its table).

Runs its own lab (on a loopback /24 claimed like a test module's: tests/lablib.py claim_net) and stack,
deploys once, then measures N repetitions.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.lablib import SGLANG_STARTUP, Lab, claim_net  # noqa: E402
from tools import docs  # noqa: E402

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


BEGIN, END = '<!-- bench: begin (tools/bench.py, make bench) -->', '<!-- bench: end -->'
COMMANDS = (('preview (no-op)', ('preview', '--expect-no-changes')),
            ('up (no-op)', ('up', '--yes', '--expect-no-changes')),
            ('up --refresh (no-op)', ('up', '--yes', '--refresh', '--expect-no-changes')))
HEADER = ('| command | median s | min s | max s | SSH commands per run (median) | host changed | SGLang restarts | '
          'one-resource program, median s | ratio |')


def declared_resources(state: dict) -> int:
    """The resources the program declared, as the state after an `up` holds them: every component, custom
    resource, command and the host's gpuhost provider instance - not the stack itself nor the default providers the
    engine adds (tests/unit/test_docs.py counts the same from the program's code)."""
    return sum(1 for r in state['deployment']['resources']
               if r['type'] != 'pulumi:pulumi:Stack' and not (r['type'].startswith('pulumi:providers:') and
                                                              r['urn'].rsplit('::', 1)[-1].startswith('default')))


def scripts(entries) -> str:
    """The SSH commands of one run by name, as the lab logged them: "`check_dir.sh`, `host_facts.sh` x9"."""
    counts = {}
    for e in entries:
        name = (e.get('cmd') or '?').split(' ', 1)[0]
        counts[name] = counts.get(name, 0) + 1
    return ', '.join('`%s`%s' % (n, '' if c == 1 else ' x%d' % c) for n, c in sorted(counts.items())) or 'none'


def section(rows, first, resources, runs, load) -> str:
    cpu = subprocess.run(['sh', '-c', "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"], capture_output=True,
                         text=True).stdout.strip()
    by = {r['name']: r for r in rows}
    noop, refresh = by['up (no-op)'], by['up --refresh (no-op)']
    lines = [BEGIN, '# Benchmark: no-op preview and up on the lab', '',
             'Measured by `make bench` (tools/bench.py) on %s: %s, %d cores, Python %s, %d runs each; load average '
             '%.1f at the start, %.1f at the end%s.' % (
                 datetime.date.today().isoformat(), cpu or platform.machine(), os.cpu_count(),
                 platform.python_version(), runs, load[0], load[1],
                 # More runnable processes than cores: other work shared the machine and slowed every run.
                 ' (more than the %d cores: the machine was shared with other work, so the times are longer and '
                 'noisier than on an idle one; the one-resource program\'s ran beside them, under the same load)'
                 % os.cpu_count() if max(load) > (os.cpu_count() or 1) else ''), '',
             'First `up` from empty (%d resources; the NVIDIA user space, CUDA and the Python environment installed '
             'in the bare container; SGLang start-up simulated at %g s): %.1f s.' % (resources, SGLANG_STARTUP, first),
             '', HEADER, '|---|---|---|---|---|---|---|---|---|']
    for r in rows:
        lines.append('| `%s` | %.2f | %.2f | %.2f | %d | %s | %d | %.2f | %.1fx |' % (
            r['name'], r['median'], r['min'], r['max'], r['ssh'], 'yes' if r['changed'] else 'no', r['restarts'],
            # The ratio of the two figures as printed: what a reader (and tests/unit/test_docs.py) works out.
            r['trivial'], round(r['median'], 2) / round(r['trivial'], 2)))
    lines += ['', 'SSH commands are counted in the lab\'s log of every command its sshd ran (lab/sshcmd.sh, the '
              'ForceCommand), in the run with the median count; by name, in that run: `preview` %s; `up` %s; '
              '`up --refresh` %s.' % (
                  by['preview (no-op)']['scripts'], noop['scripts'], refresh['scripts']), '',
              'A no-op `up` ran %d SSH command%s a run. No resource reads the host in it: diff() compares the desired '
              'state with the state recorded at the last apply or refresh; what does read it is the preflight '
              '(components/preflight.py), at the start of every `up` and never at preview. `up --refresh` ran %d: it '
              're-reads the resources from the host (the read-only scripts named above) before it compares, and runs '
              'the preflight. "host changed" compares '
              'a hash of every file of the simulated host before and after the runs; "SGLang restarts" counts the '
              'unit\'s starts in the container\'s journal. The one-resource program (tools/bench.py TRIVIAL_PROGRAM: '
              'one dynamic resource that reads and changes nothing) runs the same command with the same CLI and '
              'virtualenv right after each run: the ratio is what this program costs beyond any Pulumi program on '
              'this machine.' % (noop['ssh'], '' if noop['ssh'] == 1 else 's', refresh['ssh']), END]
    return '\n'.join(lines) + '\n'


def write(block: str) -> None:
    """Only the section between BEGIN and END (added at the top when missing): the rest of docs/bench.md is
    other tools' (bench-fleet, bench-model) or written by hand (bench-serve)."""
    path = os.path.join(ROOT, 'docs', 'bench.md')
    with open(path) as f:
        text = f.read()
    if BEGIN in text or END in text:
        text = docs.replace_between(text, BEGIN, END, block, path)
    else:
        text = block + '\n' + text
    docs.write_atomic(path, text)


def main():
    base = tempfile.mkdtemp(prefix='gpuhost-bench-')
    net, lock = claim_net()  # held until the process ends: no test module starts a lab on the same net
    load = [os.getloadavg()[0]]
    lab = Lab(base, net).up()
    try:
        lab.write_stack(STACK, lab.stack_config())
        first = timed(lambda: lab.pulumi('up', '--yes', '--skip-preview', stack=STACK))
        resources = declared_resources(json.loads(lab.pulumi('stack', 'export', stack=STACK).stdout))
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
        for name, args in COMMANDS:
            times, runs, yardstick = [], [], []
            digest, starts = lab.host_digest(), lab.unit_starts()
            for _ in range(RUNS):
                logged = len(lab.ssh_log())
                times.append(timed(lambda: lab.pulumi(*args, stack=STACK)))
                runs.append(lab.ssh_log()[logged:])
                # Side by side: the machine's load changes both alike.
                yardstick.append(timed(lambda: lab.pulumi(*args, '--stack', 'trivial', cwd=trivial)))
            # The run with the median number of SSH commands: its count and its commands by name.
            middle = sorted(runs, key=len)[len(runs) // 2]
            rows.append({'name': name, 'median': statistics.median(times), 'min': min(times), 'max': max(times),
                         'ssh': len(middle), 'changed': lab.host_digest() != digest,
                         'restarts': lab.unit_starts() - starts, 'trivial': statistics.median(yardstick),
                         'scripts': scripts(middle)})
    finally:
        lab.down()
    load.append(os.getloadavg()[0])
    block = section(rows, first, resources, RUNS, load)
    write(block)
    print(block)
    # The measurements as data, for whoever wants to check the words against them.
    print(json.dumps({'rows': rows, 'first': first, 'resources': resources, 'runs': RUNS, 'load': load}))


if __name__ == '__main__':
    main()
