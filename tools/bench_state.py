"""make bench-state: how the Pulumi engine's cost per step grows with the state's size on the file backend - the
figures behind docs/fleets.md's shard size. Writes its section of docs/bench.md (between BEGIN and END;
tests/unit/test_docs.py checks its table).

The file ("DIY") backend writes the whole snapshot before and after every step that changes something, so a step
costs more the bigger the stack. This bench holds synthetic stacks of N hosts x 17 resources, each host about as many
bytes of state as a real one (HOST_RESOURCE_BYTES, measured on a fleet lab state), and times a no-op `preview`, a
no-op `up` and an `up` that changes K resources (one a host first), with and without the checkpoints
(PULUMI_SKIP_CHECKPOINTS) - the difference is what the snapshot writes cost.

The stack is a throwaway Pulumi Python project in a temp dir (its own file:// backend, passphrase secrets, its own
PULUMI_HOME holding the cached pulumi-command plugin: no network). Its resources are pulumi-command
`command:local:Command`s (one provider process, the engine's own Check and Diff calls, a real update that runs
`true`): not the gpuhost provider's, whose per-host costs `make bench-fleet` measures. A stack of N hosts is not built
by N hosts' creates (quadratic in checkpoint bytes) but imported: one host is created for real, its deployment
exported and cloned N times (expand(); the program declares exactly what the clones hold, so `preview` shows no
change).

BENCH_STATE_HOSTS (default 8,40,100,400: 1x-50x make bench-fleet's 8 hosts), BENCH_STATE_CHANGED (K, default 32),
BENCH_RUNS (default 1). BENCH_STATE_FROM=<results.json> writes the section again from a run's figures (each run keeps
them in $TMPDIR/gpuhost-bench-state-results.json).
"""

from __future__ import annotations

import copy
import datetime
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tools import docs  # noqa: E402

BEGIN, END = '<!-- bench-state: begin (tools/bench_state.py) -->', '<!-- bench-state: end -->'
HEADER = ('| hosts | resources | state MB | K | `preview` s | `preview` CPU s | `up` no-op s | `up` no-op CPU s | '
          '`up` K changed s | `up` K changed CPU s | same, no checkpoints s | same, no checkpoints CPU s | '
          's per changed step | checkpoints s per changed step | checkpoints CPU s per changed step |')

# Bytes of state (compact JSON of the resource: inputs, outputs, URN, dependencies...) of each of a real host's 17
# resources, measured on tests/integration/test_fleet.py's shard-b state and make bench's lab state (2026-12-07,
# within 3% of each other): HostCollector (its exporter's files, in inputs and outputs) 128,300; SglangUnit 14,200;
# MetricsFile 10,000; ProxmoxGuest x2 3,700 each; command:remote:Command 6,200; HostStatus 5,200; the host's
# provider instance 4,900; ModelWeights 4,250; PciMappings 3,950; HostFile 3,900; VfioBinding 3,700; KernelCmdline
# 3,300; ProxmoxHost 2,600; GpuContainer 1,850; SevSnpVm 1,800; SglangService 1,750. 210 KB a host in all, and the
# stack's outputs about 3.5 KB more a host.
HOST_RESOURCE_BYTES = (128300, 14200, 10000, 3700, 3700, 6200, 5200, 4900, 4250, 3950, 3900, 3700, 3300, 2600, 1850,
                       1800, 1750)
STACK_OUTPUT_BYTES = 3500
# A local Command's state holds its environment twice (inputs and outputs) plus ~1 KB of its own fields.
COMMAND_OVERHEAD = 1100
TEMPLATE = 'h0000'
PROJECT = 'benchstate'

PROGRAM = '''"""tools/bench_state.py's synthetic fleet: N hosts x 17 local Commands of a real host's state bytes."""
import json

import pulumi
from pulumi_command import local

from payload import host_name, payload, changed_env

cfg = pulumi.Config()
hosts = cfg.require_int('hosts')
gen = cfg.get_int('gen') or 0
changed = cfg.get_int('changed') or 0
sizes = json.loads(cfg.require('sizes'))
outputs = {}
for h in range(hosts):
    host = host_name(h)
    prev = None
    for j, size in enumerate(sizes):
        env = payload(host, j, size)
        # `changed` resources carry the generation, one a host first (every host's first resource, then every
        # host's second...): bumping it makes that many update steps, independent of each other where on
        # different hosts.
        if j * hosts + h < changed:
            env.update(changed_env(gen))
        prev = local.Command('%s-r%02d' % (host, j), create='true', update='true', environment=env,
                             opts=pulumi.ResourceOptions(depends_on=[prev] if prev else None))
    outputs[host] = payload(host, 99, int(cfg.require('stack_bytes')))['P0']
pulumi.export('hosts', outputs)
'''

PAYLOAD = '''"""Deterministic payloads: the program's, so that every clone of the imported host matches it."""
CHUNK = 16384


def host_name(h):
    return 'h%04d' % h


def payload(host, j, size):
    """An environment of `size` bytes: the host's name in it (as a real host's state names its host), in chunks
    under the kernel's limit on one variable."""
    text = ('%s-%02d:' % (host, j) + 'x' * size)[:max(size, 1)]
    return {'P%d' % i: text[i * CHUNK:(i + 1) * CHUNK] for i in range((len(text) + CHUNK - 1) // CHUNK)}


def changed_env(gen):
    return {'GEN': str(gen)} if gen else {}
'''


def payload_sizes() -> list:
    """Each synthetic resource's environment size, so that its state (environment twice plus the Command's own
    fields) is about the real resource's bytes."""
    return [max(1, b // 2 - COMMAND_OVERHEAD // 2) for b in HOST_RESOURCE_BYTES]


def expand(deployment: dict, hosts: int, template: str = TEMPLATE) -> dict:
    """A deployment of `hosts` hosts from one of a single host: every resource whose URN names `template` cloned
    with the host's name in its place (URN, parent, dependencies, inputs and outputs alike), the stack's outputs
    the same way. Pure: the state a real `up` of that many hosts would leave, without its quadratic creates."""
    out = copy.deepcopy(deployment)
    resources = out['resources']
    mine = [r for r in resources if template in r['urn']]
    rest = [r for r in resources if template not in r['urn']]
    texts = [json.dumps(r, separators=(',', ':')) for r in mine]
    cloned = []
    for h in range(hosts):
        name = 'h%04d' % h
        cloned += [json.loads(t.replace(template, name)) for t in texts]
    out['resources'] = rest + cloned
    for r in out['resources']:
        if r['type'] == 'pulumi:pulumi:Stack':
            hosts_out = r.get('outputs', {}).get('hosts', {})
            if template in hosts_out:
                text = json.dumps(hosts_out[template])
                r['outputs']['hosts'] = {'h%04d' % h: json.loads(text.replace(template, 'h%04d' % h))
                                         for h in range(hosts)}
    return out


def per_step(changed_s: float, noop_s: float, steps: int) -> float:
    """Seconds each changed step adds to an `up`: the K-changed up less the other one, over K (negative where the
    noise of a shared machine is larger than the difference: kept, not hidden)."""
    return (changed_s - noop_s) / steps if steps else 0.0


def fit_linear(xs: list, ys: list) -> tuple:
    """Least squares y = a + b x: (a, b)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - b * mx, b


def rolling_seconds(hosts: int, at_once: int, host_s: float, steps_per_host: int, step_s: float,
                    pass_s: float = 0.0) -> float:
    """Seconds for one stack's rolling change of `hosts` hosts, `at_once` of them down at a time: its engine passes
    (pass_s: program and engine over every resource), then ceil(hosts / at_once) batches, each a host's own time
    (stop, start, model load, checks) plus its changed steps' engine cost - and never less than all the stack's
    changed steps one after another, since one engine writes its checkpoints one at a time whatever runs at once."""
    batches = -(-hosts // at_once)
    return pass_s + max(batches * (host_s + steps_per_host * step_s), hosts * steps_per_host * step_s)


def shard_plan(fleet: int, shard: int, host_s: float, steps_per_host: int, host_mb: float, step_fit: tuple,
               pass_fit: tuple, budget_s: float = 3600.0) -> dict:
    """A fleet of `fleet` hosts in shards of `shard`, run in parallel: each shard's state size, its engine's cost
    per changed step and per pass (the linear fits, against state MB and hosts), how many of a shard's hosts must be
    down at once to finish within budget_s (None: none will - its checkpoints alone take longer), and so the
    fleet-wide max_unavailable N that needs (that many a shard, every shard at once)."""
    shards = -(-fleet // shard)
    mb = shard * host_mb
    step_s = max(0.0, step_fit[0] + step_fit[1] * mb)
    pass_s = max(0.0, pass_fit[0] + pass_fit[1] * shard)
    at_once = None
    for u in range(1, shard + 1):
        if rolling_seconds(shard, u, host_s, steps_per_host, step_s, pass_s) <= budget_s:
            at_once = u
            break
    return {'shard': shard, 'shards': shards, 'state_mb': mb, 'step_s': step_s, 'pass_s': pass_s,
            'at_once': at_once, 'fleet_n': at_once * shards if at_once else None,
            'one_at_a_time_h': rolling_seconds(shard, 1, host_s, steps_per_host, step_s, pass_s) / 3600}


class Stack:
    """A throwaway project, backend and PULUMI_HOME under `base`."""

    def __init__(self, base: str):
        self.base = base
        self.project = os.path.join(base, 'project')
        os.makedirs(self.project)
        os.makedirs(os.path.join(base, 'state'))
        self.env = dict(os.environ, PULUMI_HOME=os.path.join(base, 'home'),
                        PULUMI_BACKEND_URL='file://' + os.path.join(base, 'state'),
                        PULUMI_CONFIG_PASSPHRASE='bench-state', PULUMI_SKIP_UPDATE_CHECK='true',
                        PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION='true')
        self.env.pop('PULUMI_CONFIG_PASSPHRASE_FILE', None)
        subprocess.run([os.path.join(ROOT, 'tools', 'install-command-plugin.sh'), self.env['PULUMI_HOME']],
                       check=True, env=self.env)
        with open(os.path.join(self.project, 'Pulumi.yaml'), 'w') as f:
            f.write('name: %s\nruntime:\n  name: python\n  options:\n    virtualenv: %s\n' % (PROJECT, sys.prefix))
        with open(os.path.join(self.project, '__main__.py'), 'w') as f:
            f.write(PROGRAM)
        with open(os.path.join(self.project, 'payload.py'), 'w') as f:
            f.write(PAYLOAD)

    def pulumi(self, *args, env=None, timeout=1800) -> str:
        r = subprocess.run(['pulumi', '--non-interactive', *args, '--stack', 'bench', '--cwd', self.project],
                           env=dict(self.env, **(env or {})), capture_output=True, text=True, timeout=timeout)
        if r.returncode:
            raise SystemExit('bench-state: pulumi %s failed (%d):\n%s\n%s' % (' '.join(args), r.returncode,
                                                                              r.stdout[-3000:], r.stderr[-3000:]))
        return r.stdout

    def config(self, **values):
        for k, v in values.items():
            self.pulumi('config', 'set', k, str(v))

    @property
    def state_file(self) -> str:
        return os.path.join(self.base, 'state', '.pulumi', 'stacks', PROJECT, 'bench.json')


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def measured(fn) -> tuple:
    c, t = children_cpu(), time.perf_counter()
    fn()
    return time.perf_counter() - t, children_cpu() - c


def main():
    sizes = [int(s) for s in os.environ.get('BENCH_STATE_HOSTS', '8,40,100,400').split(',')]
    changed = int(os.environ.get('BENCH_STATE_CHANGED', '32'))
    runs = int(os.environ.get('BENCH_RUNS', '1'))
    began = time.perf_counter()
    load = [os.getloadavg()[0]]
    base = tempfile.mkdtemp(prefix='gpuhost-bench-state-')
    rows = []
    try:
        stack = Stack(os.path.join(base, 'template'))
        stack.pulumi('stack', 'init', '--secrets-provider', 'passphrase')
        stack.config(hosts=1, changed=0, gen=0, sizes=json.dumps(payload_sizes()), stack_bytes=STACK_OUTPUT_BYTES)
        stack.pulumi('up', '--yes', '--skip-preview')
        template = json.loads(stack.pulumi('stack', 'export'))
        host_bytes = sum(len(json.dumps(r, separators=(',', ':'))) for r in template['deployment']['resources']
                         if TEMPLATE in r['urn'])
        shutil.rmtree(stack.base)
        for n in sizes:
            stack = Stack(os.path.join(base, 'n%d' % n))
            stack.pulumi('stack', 'init', '--secrets-provider', 'passphrase')
            k = min(changed, n * len(HOST_RESOURCE_BYTES))
            stack.config(hosts=n, changed=k, gen=0, sizes=json.dumps(payload_sizes()),
                         stack_bytes=STACK_OUTPUT_BYTES)
            big = dict(template, deployment=expand(template['deployment'], n))
            path = os.path.join(stack.base, 'deployment.json')
            with open(path, 'w') as f:
                json.dump(big, f)
            # The stack's own encryption salt and secrets provider stay: import only the resources.
            cur = json.loads(stack.pulumi('stack', 'export'))
            cur['deployment']['resources'] = big['deployment']['resources']
            with open(path, 'w') as f:
                json.dump(cur, f)
            stack.pulumi('stack', 'import', '--file', path)
            os.unlink(path)
            state_mb = os.path.getsize(stack.state_file) / 1e6
            resources = len(cur['deployment']['resources'])
            res = {k: [] for k in ('preview', 'preview_cpu', 'noop', 'noop_cpu', 'changed', 'changed_cpu', 'skip',
                                   'skip_cpu')}
            gen = 0
            for _ in range(runs):
                w, c = measured(lambda: stack.pulumi('preview', '--expect-no-changes'))
                res['preview'].append(w)
                res['preview_cpu'].append(c)
                # --skip-preview: one engine pass each, the update's (make up's `up --yes` adds a preview pass).
                w, c = measured(lambda: stack.pulumi('up', '--yes', '--skip-preview', '--expect-no-changes'))
                res['noop'].append(w)
                res['noop_cpu'].append(c)
                gen += 1
                stack.config(gen=gen)
                w, c = measured(lambda: stack.pulumi('up', '--yes', '--skip-preview'))
                res['changed'].append(w)
                res['changed_cpu'].append(c)
                gen += 1
                stack.config(gen=gen)
                w, c = measured(lambda: stack.pulumi('up', '--yes', '--skip-preview',
                                                     env={'PULUMI_SKIP_CHECKPOINTS': 'true'}))
                res['skip'].append(w)
                res['skip_cpu'].append(c)
            med = {key: statistics.median(v) for key, v in res.items()}
            rows.append((n, resources, round(state_mb, 2), med, k))
            print('bench-state: %d hosts, %d resources, %.1f MB: %s' % (n, resources, state_mb, med), flush=True)
            shutil.rmtree(stack.base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    load.append(os.getloadavg()[0])
    results = {'rows': rows, 'host_bytes': host_bytes, 'changed': changed, 'runs': runs, 'load': load,
               'minutes': (time.perf_counter() - began) / 60, 'date': datetime.date.today().isoformat(),
               'parallel': os.environ.get('PULUMI_PARALLEL', 'the CLI\'s default'), 'pulumi': pulumi_version()}
    # Kept, so that the section can be written again from the same figures (BENCH_STATE_FROM=<this file>).
    with open(os.path.join(tempfile.gettempdir(), 'gpuhost-bench-state-results.json'), 'w') as f:
        json.dump(results, f)
    write(results)


# The extrapolation's assumptions (docs/fleets.md shows the formula with them).
FLEET = 1000
# A real host's part of a rolling SGLang restart: start-up with the weights in the page cache took about 50 s on the
# reference host (../shared/SYSTEM.md), plus what the lab's rolling change spends a host beyond its simulated 1 s
# load (make bench-fleet: 48.7 s for 8 hosts, ~6 s a host): about 60 s.
HOST_S = 60.0
# Update steps a host's rolling change makes (the unit, its metrics file, the smoke test's replacement: create and
# delete) - an estimate, not counted by any bench.
STEPS_PER_HOST = 4
SHARD_SIZES = (25, 50, 100, 200, 400, 1000)


def fits(rows) -> dict:
    """Linear fits over the sizes measured: a changed step's cost and its checkpoints' against state MB, the two
    passes of an `up` (its preview and its update, no-op) against hosts."""
    mb = [r[2] for r in rows]
    hosts = [r[0] for r in rows]
    return {'step': fit_linear(mb, [per_step(m['changed'], m['noop'], k) for _n, _r, _mb, m, k in rows]),
            'ckpt': fit_linear(mb, [per_step(m['changed'], m['skip'], k) for _n, _r, _mb, m, k in rows]),
            'pass': fit_linear(hosts, [m['preview'] + m['noop'] for _n, _r, _mb, m, k in rows])}


def section(results: dict) -> str:
    rows = [tuple(r) for r in results['rows']]
    cpu = subprocess.run(['sh', '-c', "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"], capture_output=True,
                         text=True).stdout.strip()
    runs, load = results['runs'], results['load']
    lines = [BEGIN, '# Benchmark: the engine\'s cost per step as the state grows (`make bench-state`)', '',
             'Measured by tools/bench_state.py on %s: %s, %d cores, Python %s, pulumi %s, %d run%s of each; load '
             'average %.1f at the start, %.1f at the end (the machine was shared with other work: single runs on it '
             'are noisy by a second or more); the whole benchmark took %.1f min.'
             % (results['date'], cpu or platform.machine(), os.cpu_count(), platform.python_version(),
                results['pulumi'], runs, '' if runs == 1 else 's', load[0], load[1], results['minutes']), '',
             'Synthetic stacks on the file backend: N hosts x %d resources (pulumi-command local Commands, one '
             'provider process) and the stack, %d bytes of state a host as imported (a real host: %d, '
             'tools/bench_state.py HOST_RESOURCE_BYTES). K: the `up` that changes K resources, one a host first '
             '(K update steps). The `up`s run as `up --yes --skip-preview`: the update\'s engine pass alone '
             '(`make up` adds a preview pass, which costs what `preview` does). "no checkpoints": the same K changes '
             'with PULUMI_SKIP_CHECKPOINTS=true (the snapshot written at the start and the end only). CPU: the CLI '
             'and all it ran (language host, program, plugin). PULUMI_PARALLEL=%s.' % (
                 len(HOST_RESOURCE_BYTES), results['host_bytes'], sum(HOST_RESOURCE_BYTES), results['parallel']),
             '', HEADER, '|' + '---|' * (HEADER.count('|') - 1)]
    for n, resources, state_mb, med, k in rows:
        lines.append('| %d | %d | %.1f | %d | %.2f | %.1f | %.2f | %.1f | %.2f | %.1f | %.2f | %.1f | %.3f | %.3f | '
                     '%.3f |' % (n, resources, state_mb, k, med['preview'], med['preview_cpu'], med['noop'],
                                 med['noop_cpu'], med['changed'], med['changed_cpu'], med['skip'], med['skip_cpu'],
                                 per_step(med['changed'], med['noop'], k), per_step(med['changed'], med['skip'], k),
                                 per_step(med['changed_cpu'], med['skip_cpu'], k)))
    f = fits(rows)
    host_mb = results['host_bytes'] / 1e6
    lines += ['', 'Linear fits over the sizes measured (state MB = hosts x %.3f): a changed step costs %.3f s + %.4f s '
              'per MB of state (its checkpoints alone: %.3f s + %.4f s per MB); an `up`\'s two passes (preview and '
              'update, no-op) %.1f s + %.3f s per host. At 1,000 hosts in one stack (%.0f MB) that is %.2f s a '
              'changed step and %.0f s of passes.' % (
                  host_mb, f['step'][0], f['step'][1], f['ckpt'][0], f['ckpt'][1], f['pass'][0], f['pass'][1],
                  FLEET * host_mb, f['step'][0] + f['step'][1] * FLEET * host_mb,
                  f['pass'][0] + f['pass'][1] * FLEET), '',
              'Extrapolated to {:,} hosts (docs/fleets.md, "Sharding a large fleet", has the formula): shards run in '
              'parallel, {:.0f} s a host (its SGLang restart on a real host), {:d} changed steps a host, within an '
              'hour:'.format(FLEET, HOST_S, STEPS_PER_HOST), '',
              PLAN_HEADER, '|' + '---|' * (PLAN_HEADER.count('|') - 1)]
    for size in SHARD_SIZES:
        p = shard_plan(FLEET, size, HOST_S, STEPS_PER_HOST, host_mb, f['step'], f['pass'])
        lines.append('| %d | %d | %.0f | %.2f | %.0f | %.2f | %s | %s |' % (
            size, p['shards'], p['state_mb'], p['step_s'], p['pass_s'], p['one_at_a_time_h'],
            p['at_once'] if p['at_once'] else 'none', p['fleet_n'] if p['fleet_n'] else 'none'))
    lines.append(END)
    return '\n'.join(lines) + '\n'


PLAN_HEADER = ('| hosts a shard | shards | state MB | s a changed step | s of passes | hours, one host a shard at a '
               'time | hosts a shard down at once for 1 h | fleet-wide max_unavailable N |')


def pulumi_version() -> str:
    return subprocess.run(['pulumi', 'version'], capture_output=True, text=True).stdout.strip()


def write(results: dict):
    text = section(results)
    path = os.path.join(ROOT, 'docs', 'bench.md')
    with open(path) as f:
        doc = f.read()
    if BEGIN in doc and END in doc:
        doc = docs.replace_between(doc, BEGIN, END, text, path)
    else:
        doc = doc.rstrip('\n') + '\n\n' + text
    with open(path, 'w') as f:
        f.write(doc)
    print(text)


if __name__ == '__main__':
    if os.environ.get('BENCH_STATE_FROM'):
        with open(os.environ['BENCH_STATE_FROM']) as f:
            write(json.load(f))
    else:
        main()
