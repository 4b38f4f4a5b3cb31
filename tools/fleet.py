"""One command for a fleet split into shard stacks (docs/fleets.md, "Sharding a large fleet"): every shard's
`preview` or `up` at once through Pulumi's Automation API, at most --parallel shards at a time, and one merged
table - shard, host, what changes, SGLang restarts, reboots, the fleet lock's group.

    python -m tools.fleet preview [--stack S]... [--parallel K]
    python -m tools.fleet up [--stack S]... [--parallel K] [--yes]
    make fleet-preview STACKS='site-a site-b' / make fleet-up STACKS='site-a site-b' [YES=1]

Which stacks: each --stack, or every stack whose Pulumi.<stack>.yaml has `gpuhost:hosts`. A shard that fails does
not stop the others: each one's engine run goes to its end (a failing step stops that shard's rollout only, as a
single `make up` does), then the table is printed with one line per failing shard and its first error; the exit
status is 1 if any shard failed, 0 otherwise. `up` is `make up`'s (--refresh, the policy pack), and without --yes
it first prints the merged preview and asks. After the ups, each shard's host table (tools/fleet_summary.py) as
`make up` prints it; fleet-monitoring/ stays the merge of the shards' monitoring outputs.

The table is assembled from the engine's events (pure: `Shard.add` and `rows`, unit-tested with synthetic events):
a resource belongs to the host whose name prefixes it (`gpu01-sglang-unit`); at preview, the planned steps, the
SGLang unit's update or replacement read as a restart and the host status' change of its declared state (`expect`)
as a reboot where `host.reboot: when-required` (otherwise the reboot is the operator's: `manual`); after `up`, what
was done - the SGLang unit's `restarted` output and the host's boot_id before and after. Nothing secret is printed:
the steps' names and counts, the error's first line (our errors never hold a credential) and booleans.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The engine's step ops, grouped as the table counts them (a replacement's create-replacement/delete-replaced
# pair is counted once, as its `replace`).
COUNTED = {'create': 'create', 'update': 'update', 'replace': 'replace', 'delete': 'delete',
           'import': 'create', 'import-replacement': 'replace', 'read-replacement': 'replace'}
CHANGING = ('update', 'replace')
UNIT = 'gpuhost:index:SglangUnit'
STATUS = 'gpuhost:index:HostStatus'
DRIVER = 'gpuhost:index:NvidiaDriver'
GUEST = 'gpuhost:index:ProxmoxGuest'
# tools/run.sh's stack_env: the lab's stacks keep their state in the checkout and use the lab's public passphrase.
LAB_STACKS = ('lab', 'lab-fleet')
LAB_PASSPHRASE = 'gpuhost-lab'
# Lines of the engine that only say that something failed (the step's own error comes before them).
GENERIC = ('update failed', 'preview failed', 'refresh failed', 'an unhandled error occurred',
           'one or more errors occurred', 'program failed with an unhandled exception')


class FleetError(Exception):
    """A refusal before any shard ran (no stacks, no passphrase): printed as one line, exit status 2."""


# ------------------------------------------------------------------ the stacks' config (read, never decrypted)

def _config(path: str) -> dict:
    import yaml
    try:
        with open(path) as f:
            doc = yaml.safe_load(f) or {}
    except FileNotFoundError:
        return {}
    cfg = doc.get('config') if isinstance(doc, dict) else None
    return cfg if isinstance(cfg, dict) else {}


def stack_config(stack: str, root: str = ROOT) -> dict:
    """The stack's config as its program sees it, secure: values left as they are: the project's `config:` in
    Pulumi.yaml (each key's `value`, docs/fleets.md "Sharding": the settings every shard shares - the fleet lock's
    group, say) under Pulumi.<stack>.yaml's keys, a key the stack sets replacing the project's whole as Pulumi does."""
    out = {}
    for key, v in _config(os.path.join(root, 'Pulumi.yaml')).items():
        if isinstance(v, dict) and ('value' in v or 'default' in v):
            out[key] = v.get('value', v.get('default'))
        elif not isinstance(v, dict) or 'type' not in v:
            out[key] = v
    # org/project/stack: its file is the stack's
    out.update(_config(os.path.join(root, 'Pulumi.%s.yaml' % stack.split('/')[-1])))
    return out


def shard_stacks(root: str = ROOT) -> list:
    """Every stack of the project whose Pulumi.<stack>.yaml lists hosts (gpuhost:hosts), sorted."""
    out = []
    for name in sorted(os.listdir(root)):
        if name.startswith('Pulumi.') and name.endswith('.yaml') and name != 'Pulumi.yaml':
            if _config(os.path.join(root, name)).get('gpuhost:hosts'):
                out.append(name[len('Pulumi.'):-len('.yaml')])
    return out


def host_names(cfg: dict) -> list:
    return [h.get('name') for h in cfg.get('gpuhost:hosts') or [] if isinstance(h, dict) and h.get('name')]


def lock_group(cfg: dict) -> str:
    """The fleet lock's group and its slots (gpuhost:rollout.fleet_lock: `rack-7 (2 slots)`), '-' without one."""
    rollout = cfg.get('gpuhost:rollout')
    lock = rollout.get('fleet_lock') if isinstance(rollout, dict) else None
    group = lock.get('group') if isinstance(lock, dict) else None
    if not group:
        return '-'
    slots = lock.get('slots')
    return '%s (%s slot%s)' % (group, slots, '' if slots == 1 else 's') if slots else str(group)


# ------------------------------------------------------------------ the table (pure)

class HostRow(object):
    def __init__(self):
        self.ops = {}          # op -> [resource names without the host prefix]
        self.sglang = '-'
        self.reboot = '-'
        self.failed = []       # names of the steps that failed


class Shard(object):
    """One shard's engine events, tallied per host. `done`: the events of an `up` (what was done: the outputs
    events) rather than a preview's plan (the steps' pre events)."""

    def __init__(self, name: str, hosts, group: str = '-', done: bool = False):
        self.name = name
        self.hosts = {h: HostRow() for h in hosts}
        self.group = group
        self.done = done
        self.errors = []       # first lines of the error diagnostics, in order
        self.error = None      # set when the shard failed (its first error line)
        self.outputs = None    # after an up: the stack's outputs (pulumi.automation OutputMap)

    def host_of(self, urn: str) -> str:
        """The host whose name prefixes the resource's (the longest that does), '-' for the stack's own."""
        name = urn.split('::')[-1]
        best = ''
        for h in self.hosts:
            if (name == h or name.startswith(h + '-')) and len(h) > len(best):
                best = h
        return best or '-'

    def row(self, host: str) -> HostRow:
        if host not in self.hosts:
            self.hosts[host] = HostRow()
        return self.hosts[host]

    def add(self, event) -> None:
        """One pulumi.automation EngineEvent."""
        if event.diagnostic_event is not None:
            d = event.diagnostic_event
            if d.severity == 'error':
                line = first_line(d.message)
                if line and self.errors and self.errors[-1].endswith(':'):
                    self.errors[-1] += ' ' + line     # a heading's first item, in a diagnostic of its own
                elif line:
                    self.errors.append(line)
            return
        if event.res_op_failed_event is not None:
            m = event.res_op_failed_event.metadata
            self.row(self.host_of(m.urn)).failed.append(short(m.urn, self.host_of(m.urn)))
            return
        if self.done:
            if event.res_outputs_event is None:
                return
            m = event.res_outputs_event.metadata
        else:
            if event.resource_pre_event is None:
                return
            m = event.resource_pre_event.metadata
        self.step(m)

    def step(self, m) -> None:
        state = m.new or m.old
        if m.type.startswith('pulumi:') or (state is not None and state.custom is False):
            return   # the stack, providers and components change nothing on a host themselves
        op = COUNTED.get(m.op.value if hasattr(m.op, 'value') else m.op)
        if op is None:
            return
        host = self.host_of(m.urn)
        r = self.row(host)
        r.ops.setdefault(op, []).append(short(m.urn, host))
        new_in = (m.new.inputs if m.new else None) or {}
        if m.type == UNIT:
            if op in CHANGING:
                if not self.done:
                    r.sglang = 'restart'
                elif (m.new.outputs or {}).get('restarted') if m.new else True:
                    r.sglang = 'restarted'
            elif op == 'create' and r.sglang == '-':
                r.sglang = 'first start' if not self.done else 'started'
        elif m.type == GUEST and op == 'replace' and r.sglang == '-':
            r.sglang = 'restart (new guest)' if not self.done else 'restarted (new guest)'
        elif m.type == DRIVER and op in CHANGING and r.sglang == '-':
            # An upgrade stops SGLang, a build for a new kernel does not: the plugin decides on the host at `up`.
            r.sglang = 'maybe (driver)' if not self.done else r.sglang
        elif m.type == STATUS and op in CHANGING:
            if self.done:
                old_boot = ((m.old.outputs or {}) if m.old else {}).get('boot_id')
                new_boot = ((m.new.outputs or {}) if m.new else {}).get('boot_id')
                if old_boot and new_boot and old_boot != new_boot:
                    r.reboot = 'rebooted'
            elif 'expect' in (m.diffs or []) or any(k.split('.')[0] == 'expect' for k in (m.detailed_diff or {})):
                r.reboot = 'when required' if new_in.get('reboot') == 'when-required' else 'manual'

    def rows(self) -> list:
        out = []
        for host in sorted(self.hosts, key=lambda h: (h == '-', h)):
            r = self.hosts[host]
            if host == '-' and not r.ops and not r.failed:
                continue
            parts = []
            for op in ('create', 'update', 'replace', 'delete'):
                names = sorted(r.ops.get(op, []))
                if names:
                    parts.append('%s %d (%s%s)' % (op, len(names), ', '.join(names[:4]), ', ...' if len(names) > 4
                                                   else ''))
            changes = ', '.join(parts) or ('none' if not self.error else
                                           'none done: shard failed' if self.done else 'unknown: shard failed')
            if r.failed:
                changes += '; FAILED: %s' % ', '.join(r.failed)
            out.append([self.name, host, changes, r.sglang, r.reboot, self.group])
        if self.error and not out:
            out.append([self.name, '-', 'FAILED', '-', '-', self.group])
        return out


def short(urn: str, host: str) -> str:
    name = urn.split('::')[-1]
    return name[len(host) + 1:] if host != '-' and name.startswith(host + '-') else name


def first_line(text: str) -> str:
    """The first line of an error that says something (the engine's "update failed" after it does not); a line that
    ends with ':' (a heading: `invalid stack configuration for host gpu02 (...):`) with the line after it."""
    lines = [ln.strip() for ln in (text or '').splitlines()]
    lines = [ln[len('error: '):].strip() if ln.startswith('error: ') else ln for ln in lines]
    lines = [ln for ln in lines if ln and not ln.lower().startswith(GENERIC)]
    if not lines:
        return ''
    return '%s %s' % (lines[0], lines[1]) if lines[0].endswith(':') and len(lines) > 1 else lines[0]


def table(shards) -> str:
    done = any(s.done for s in shards)
    head = ['shard', 'host', 'what is done' if done else 'what changes', 'SGLang', 'reboot', 'lock group']
    body = [r for s in shards for r in s.rows()]
    widths = [max(len(str(r[i])) for r in [head] + body) for i in range(len(head))]
    line = lambda r: '  '.join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return '\n'.join([line(head), line(['-' * w for w in widths])] + [line(r) for r in body])


def failures(shards) -> list:
    return ['shard %s failed: %s' % (s.name, s.error) for s in shards if s.error]


# ------------------------------------------------------------------ running the shards

_select = threading.Lock()


def env_for(stack: str, root: str = ROOT) -> dict:
    """What the stack's CLI runs get besides this process's environment (tools/run.sh stack_env)."""
    if stack in LAB_STACKS:
        os.makedirs(os.path.join(root, '.state'), exist_ok=True)
        # An empty PULUMI_CONFIG_PASSPHRASE_FILE is no file: the operator's, for the real shards, is not read.
        return {'PULUMI_BACKEND_URL': 'file://%s' % os.path.join(root, '.state'),
                'PULUMI_CONFIG_PASSPHRASE': LAB_PASSPHRASE, 'PULUMI_CONFIG_PASSPHRASE_FILE': ''}
    return {}


def check_env(stacks) -> None:
    real = [s for s in stacks if s not in LAB_STACKS]
    if real and not (os.environ.get('PULUMI_CONFIG_PASSPHRASE') or os.environ.get('PULUMI_CONFIG_PASSPHRASE_FILE')):
        raise FleetError('stack %s has secure: values; set PULUMI_CONFIG_PASSPHRASE or PULUMI_CONFIG_PASSPHRASE_FILE '
                         '(the same passphrase for every shard of this run)' % real[0])


def policy_args(stack: str, root: str) -> dict:
    """tools/run.sh policy_args: the policy pack (this checkout's), mandatory, with the stack's config for it when
    the project has one (policy/config.<stack>.json)."""
    cfg = [os.path.join(d, 'policy', 'config.%s.json' % stack) for d in (root, ROOT)]
    cfg = [c for c in cfg if os.path.isfile(c)][:1]
    return {'policy_packs': [os.path.join(ROOT, 'policy')], 'policy_pack_configs': cfg or None}


def run_shard(shard: Shard, action: str, root: str = ROOT) -> Shard:
    """The shard's preview or up in its own workspace. Every failure ends here, in shard.error: the others go on."""
    from pulumi import automation as auto
    try:
        env = env_for(shard.name, root)
        # Each shard its own LocalWorkspace on the project directory itself: the program reads its stack's files
        # relative to it and records their paths in the state (a copy elsewhere would change every host's
        # connection input). Selecting a stack writes the workspace's "current stack" file, which no run here
        # reads (the Automation API passes --stack to every command): the selects take turns so that no two
        # write it at once.
        opts = auto.LocalWorkspaceOptions(work_dir=root, env_vars=env)
        with _select:
            try:
                stack = auto.select_stack(shard.name, work_dir=root, opts=opts)
            except auto.StackNotFoundError:
                # As tools/run.sh select_stack: only the operator makes a stack (an empty one would plan to create
                # or adopt everything on its hosts).
                shard.error = ('stack %s does not exist in the backend %s (PULUMI_BACKEND_URL; this checkout\'s .state '
                               'when it is not set); if its state lives elsewhere, export PULUMI_BACKEND_URL=<that '
                               'backend> and re-run; to start a new stack in this backend on purpose: . ./.env.sh && '
                               'pulumi stack init --secrets-provider passphrase %s' % (
                                   shard.name, env.get('PULUMI_BACKEND_URL') or os.environ.get('PULUMI_BACKEND_URL'),
                                   shard.name))
                return shard
        events = dict(on_event=shard.add, color='never', **policy_args(shard.name, root))
        if action == 'preview':
            stack.preview(**events)
        else:
            stack.up(refresh=True, show_secrets=False, suppress_outputs=True, **events)
            shard.outputs = stack.outputs()
    except auto.CommandError as e:
        shard.error = next((ln for ln in shard.errors if ln), None) or first_line(_stderr(e)) or \
            'pulumi %s failed' % action
    except Exception as e:  # noqa: BLE001 - one shard's failure of any kind is reported, the others go on
        shard.error = '%s: %s' % (type(e).__name__, first_line(str(e)) or 'failed')
    return shard


def _stderr(e) -> str:
    text = getattr(e, 'stderr', '') or ''
    errs = [ln for ln in text.splitlines() if ln.strip().startswith('error:')]
    return '\n'.join(errs) or text


def run_all(stacks, action: str, parallel: int, root: str = ROOT) -> list:
    shards = []
    for name in stacks:
        cfg = stack_config(name, root)
        shards.append(Shard(name, host_names(cfg), lock_group(cfg), done=action == 'up'))
    pool = ThreadPoolExecutor(max_workers=max(1, parallel))
    futures = [pool.submit(run_shard, s, action, root) for s in shards]
    try:
        wait(futures)
    except KeyboardInterrupt:
        # Ctrl-C on a terminal reached every shard's pulumi too (one process group): each ends its steps in flight
        # and stops, as `pulumi up` does. Shards not started yet never start; the running ones are waited for, so
        # no host is left mid-step by this process (a second Ctrl-C ends the wait: main says so).
        for f, shard in zip(futures, shards):
            if f.cancel():
                shard.error = 'not started: interrupted (Ctrl-C)'
        print('fleet: interrupted - waiting for the shards that run now to end their steps in flight',
              file=sys.stderr)
        wait(futures)
    pool.shutdown(wait=False)
    return shards


def summaries(shards) -> str:
    """What `make up` prints after an up, per shard (tools/fleet_summary.py), and the shards' monitoring targets
    merged the way fleet-monitoring/ merges them (a host in two shards is refused there: said here already)."""
    from tools import fleet_summary
    sys.path.insert(0, os.path.join(ROOT, 'fleet-monitoring'))
    from merge import MergeError, merge_file_sd
    out = []
    done = [s for s in shards if s.outputs is not None]
    plain = {s.name: {k: v.value for k, v in s.outputs.items() if not v.secret} for s in done}
    for s in done:
        out.append('Shard %s (every output: pulumi stack output --json --stack %s):' % (s.name, s.name))
        out.append(fleet_summary.table(plain[s.name]))
        out.append('')
    try:
        groups = merge_file_sd({s: plain[s].get('prometheus_file_sd') for s in plain})
        out.append('Monitoring: %d target groups across %d shards; fleet-monitoring/ merges them (docs/fleets.md).'
                   % (len(groups), len(plain)))
    except MergeError as e:
        out.append('Monitoring: %s' % e)
    return '\n'.join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog='python -m tools.fleet', description=__doc__.split('\n\n')[0])
    p.add_argument('action', choices=('preview', 'up'))
    p.add_argument('--stack', action='append', default=[], help='a shard stack (repeat; default: every stack '
                   'whose Pulumi.<stack>.yaml has gpuhost:hosts)')
    p.add_argument('--parallel', type=int, default=4, help='shards run at once (default 4)')
    p.add_argument('--yes', action='store_true', help='up: no merged preview and question first')
    p.add_argument('--cwd', default=ROOT, help='the project directory (default: this checkout)')
    a = p.parse_args(argv)
    root = os.path.abspath(a.cwd)
    try:
        stacks = [s for arg in a.stack for s in arg.split()] or shard_stacks(root)
        if not stacks:
            raise FleetError('no shard stacks: no Pulumi.<stack>.yaml here has gpuhost:hosts; name them with --stack')
        if a.parallel < 1:
            raise FleetError('--parallel %d: at least 1 shard at a time' % a.parallel)
        check_env(stacks)
        from tools import plain_secrets
        here = os.getcwd()
        os.chdir(root)   # plain_secrets reads Pulumi.<stack>.yaml in the working directory
        try:
            refused = [(s, ln) for s in stacks for ln in plain_secrets.refusals(s)]
        finally:
            os.chdir(here)
        for s, ln in refused:
            print('fleet: stack %s: %s' % (s, ln), file=sys.stderr)
        if refused:
            return 2
    except FleetError as e:
        print('fleet: %s' % e, file=sys.stderr)
        return 2
    try:
        if a.action == 'up' and not a.yes:
            code = report(run_all(stacks, 'preview', a.parallel, root), 'preview')
            if code:
                return code
            if not sys.stdin.isatty():
                print('fleet: not applied: confirm on a terminal, or pass --yes (make fleet-up YES=1)', file=sys.stderr)
                return 2
            if input('Apply this to %d shard(s)? [y/N] ' % len(stacks)).strip().lower() not in ('y', 'yes'):
                return 1
        return report(run_all(stacks, a.action, a.parallel, root), a.action)
    except KeyboardInterrupt:
        print('fleet: interrupted again: the shards\' pulumi runs stop now, a step in flight may be cut short (pulumi '
              'says which); `make fleet-preview` shows where each shard stands', file=sys.stderr)
        return 130


def report(shards, action: str) -> int:
    print(table(shards))
    if action == 'up':
        text = summaries(shards)
        if text:
            print()
            print(text)
    bad = failures(shards)
    for line in bad:
        print(line, file=sys.stderr)
    print('%s: %d of %d shards succeeded' % (action, len(shards) - len(bad), len(shards)))
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
