"""Monitoring on day one: what the program knows about the host, as Prometheus metrics on the host,
and where Prometheus finds its targets.

  host-metrics   /var/lib/prometheus/node-exporter/gpuhost.prom, a node_exporter textfile-collector
                 file: what only the program knows (speculation requested vs resolved, the SGLang unit's
                 state and version). Its content is a pure function of the declared state and of facts
                 that change only when the host does (no timestamps, no running averages), so a second
                 `up` writes nothing; computed from the unit's outputs, so `preview` contacts no host. It
                 describes the service as the last `pulumi up` found it.
  collector      the collector on the host (components/collector.py): its script, config, service and
                 timer, which write gpuhost-collector.prom every 30 s - the host's own state, live (GPUs,
                 IOMMU domains, command line, module options, reboot reasons, Xid events, IOMMU page
                 faults, AER errors, the NVIDIA driver loaded, declared and built per installed kernel). The
                 two files never share a metric family.
  file_sd()      the `prometheus_file_sd` output: SGLang's /metrics and the host's node_exporter, with
                 labels that join with Proxmox's exporter (`id="lxc/200"`, `node`), no `job`.

The metric names follow Prometheus' conventions: prefix `gpuhost_`, base units, `_info` gauges
(value 1) for string facts, a bounded set of label values (a reboot reason's *kind*, never its text).
"""

from __future__ import annotations

import posixpath

from hostscripts import exposition, host_state
from transport import remote
from resources.fields import S, arr, mapof, obj
from resources.sglang import expected_speculation
from resources.state import GpuhostResource, ObservedProvider, numbers
from transport.operator import OperatorError

TEXTFILE_DIR = exposition.TEXTFILE_DIR
TEXTFILE = TEXTFILE_DIR + '/gpuhost.prom'
NODE_EXPORTER_PORT = 9100

# Moved to hostscripts/host_state.py (the collector on the host uses them too); kept here by name.
REASON_KINDS, OTHER, reason_kind, nvidia_bus_id = (host_state.REASON_KINDS, host_state.OTHER, host_state.reason_kind,
                                                   host_state.nvidia_bus_id)
_Text = exposition.Text
_num = exposition.number


def declared(d) -> dict:
    """What the textfile needs from the config (plain data: it crosses into an apply())."""
    s = d.sglang
    spec = s.speculative
    return {
        'version': s.version, 'unit': s.unit, 'model_name': s.served_model_name, 'tp_size': s.tp,
        'speculation': ({'algorithm': spec.algorithm, 'num_steps': spec.num_steps, 'eagle_topk': spec.eagle_topk,
                         'num_draft_tokens': spec.num_draft_tokens} if spec and spec.num_steps else None),
        'expect': expected_speculation(d),
    }


def _spec_labels(algorithm, steps, topk, draft) -> dict:
    return {'algorithm': algorithm or 'none', 'num_steps': _num(steps or 0), 'eagle_topk': _num(topk or 0),
            'num_draft_tokens': _num(draft or 0)}


def textfile(decl: dict, resolved, active, enabled, facts=None) -> str:
    """The content of gpuhost.prom: what only the program knows - the SGLang service it declares, the unit's
    state and the speculation SGLang resolved, and the runtime it installed, as the last run found them.
    resolved: the SGLang unit's `resolved` (/server_info, None when it could not be read); active/enabled:
    the unit's state; facts: its `runtime_facts` (driver versions of the host module and the container's
    libraries, CUDA, the running environment and its lock's hash). The host's own state (GPUs, IOMMU,
    reboot) is the collector's, live (gpuhost-collector.prom)."""
    resolved = numbers(resolved)
    t = _Text()
    t.family('gpuhost_sglang_info', 'The SGLang service the config declares: version, unit, served model, '
             'tensor parallelism.',
             [({'version': decl['version'], 'unit': decl['unit'], 'model_name': decl['model_name'],
                'tp_size': _num(decl['tp_size'])}, 1)])
    t.family('gpuhost_sglang_unit_active', 'Whether the SGLang unit was active (1) or not (0) at the last pulumi up.',
             [({'unit': decl['unit']}, 1 if active else 0)])
    t.family('gpuhost_sglang_unit_enabled', 'Whether the SGLang unit is enabled to start with the container (1) or '
             'not (0), as the last pulumi up found it.', [({'unit': decl['unit']}, 1 if enabled else 0)])

    facts = facts or {}
    t.family('gpuhost_nvidia_driver_info', 'The NVIDIA driver version on each side: the kernel module the host runs '
             '(side="host") and the user-space libraries in the container (side="container"), at the last pulumi up.',
             [({'side': side, 'version': facts[key]}, 1) for side, key in (('host', 'host_driver'),
                                                                            ('container', 'container_driver'))
              if facts.get(key)])
    if facts.get('host_driver') and facts.get('container_driver'):
        t.family('gpuhost_nvidia_driver_match', 'Whether the container\'s NVIDIA user space is the host module\'s '
                 'version (1) or not (0: NVML fails with "Driver/library version mismatch", SGLang cannot start again).',
                 [({}, 1 if facts['host_driver'] == facts['container_driver'] else 0)])
    if facts.get('cuda'):
        t.family('gpuhost_cuda_info', 'The CUDA toolkit in the container (version.json), at the last pulumi up.',
                 [({'version': facts['cuda']}, 1)])
    if facts.get('sglang') and facts.get('sglang') != '-':
        t.family('gpuhost_sglang_environment_info', 'The Python environment the SGLang unit runs from: the SGLang '
                 'version it holds, its directory\'s id and the sha256 of its lock (empty when the operator manages it).',
                 [({'sglang_version': facts['sglang'], 'env': facts.get('env') or '',
                    'lock_sha256': facts.get('lock_sha256') or ''}, 1)])

    spec = decl['speculation'] or {}
    requested = _spec_labels(spec.get('algorithm'), spec.get('num_steps'), spec.get('eagle_topk'),
                             spec.get('num_draft_tokens'))
    t.family('gpuhost_sglang_speculation_requested_info', 'The speculative decoding the unit asks SGLang for '
             '(algorithm as configured; none: off).', [(requested, 1)])
    sides = [({'side': 'requested'}, spec)]
    if resolved is not None:
        algo = resolved.get('speculative_algorithm')
        got = {'algorithm': algo, 'num_steps': resolved.get('speculative_num_steps') if algo else None,
               'eagle_topk': resolved.get('speculative_eagle_topk') if algo else None,
               'num_draft_tokens': resolved.get('speculative_num_draft_tokens') if algo else None}
        t.family('gpuhost_sglang_speculation_resolved_info', 'The speculative decoding SGLang resolved, as its '
                 '/server_info reported it at the last pulumi up (NEXTN is reported as EAGLE; none: off).',
                 [(_spec_labels(got['algorithm'], got['num_steps'], got['eagle_topk'], got['num_draft_tokens']), 1)])
        match = all(resolved.get(k) == v for k, v in decl['expect'].items())
        t.family('gpuhost_sglang_speculation_match', 'Whether SGLang resolved the speculative decoding the unit asks '
                 'for (1) or something else (0), at the last pulumi up.', [({}, 1 if match else 0)])
        sides.append(({'side': 'resolved'}, got))
    for key, help_ in (('num_steps', 'Speculative decoding steps (0: off).'),
                       ('eagle_topk', 'Speculative decoding top-k (0: off).'),
                       ('num_draft_tokens', 'Speculative decoding draft tokens (0: off).')):
        t.family('gpuhost_sglang_speculative_%s' % key, help_ + ' side: requested by the unit, resolved by SGLang.',
                 [(labels, (values or {}).get(key) or 0) for labels, values in sides])
    return t.text()


def file_sd(d) -> list:
    """Prometheus file_sd target groups: SGLang's /metrics in the container, the host's node_exporter.
    No `job` (the scrape config names it) and no `instance` (Prometheus sets it from the target);
    `id` as Proxmox's exporter (prometheus-pve-exporter) writes it, `node` the Proxmox node name.
    No label repeats what SGLang already labels its series with (model_name)."""
    node = d.host.node
    return [
        {'targets': ['%s:%d' % (d.container.address, d.sglang.port)],
         'labels': {'id': 'lxc/%d' % d.container.vmid, 'node': node}},
        {'targets': ['%s:%d' % (d.host.address, NODE_EXPORTER_PORT)],
         'labels': {'id': 'node/%s' % node, 'node': node}},
    ]


# ------------------------------------------------------------------------------------ the resource

class MetricsFileError(OperatorError):
    pass


class MetricsFileProvider(ObservedProvider):
    """A textfile-collector file on the host, replaced atomically (put_file.sh: a temporary file in the
    same directory that node_exporter ignores, then a rename), its directory created if missing.
    Removed on destroy: metrics about a deployment that is gone would mislead."""
    DESIRED = ('path', 'content', 'mode', 'upstream')
    REPLACE = ('path',)
    INPUTS = {'path': S, 'content': S, 'mode': S, 'upstream': S}
    OUTPUTS = {'sha256': S}

    def observe(self, target, props):
        res = remote.run(target, 'read_file.sh', [props['path']], check=False)
        if res.exit_code not in (0, 4):
            raise MetricsFileError('%s: cannot read %s: %s' % (target.name, props['path'], res.stderr.strip()[-300:]))
        return {'content': res.stdout if res.exit_code == 0 else None,
                'sha256': remote.sha256_hex(res.stdout) if res.exit_code == 0 else None}

    def apply(self, props):
        target = remote.Target.from_inputs(props['connection'])
        current = self.observe(target, props)
        if current['content'] != props['content']:
            if current['sha256'] is None:
                remote.run(target, 'ensure_dir.sh', [posixpath.dirname(props['path']), '0755'])
            remote.put_file(target, props['path'], props['content'], props['mode'], current['sha256'] or '-')
            current = self.observe(target, props)
        return dict(props, **current)

    def resource_id(self, props):
        return 'textfile:' + props['path']

    def current(self, props):
        return self.observe(remote.Target.from_inputs(props['connection']), props)

    def delete(self, _id, props):
        remote.run(remote.Target.from_inputs(props['connection']), 'remove_file.sh', [props['path']])


class MetricsFile(GpuhostResource, name='MetricsFile'):
    """A node_exporter textfile on the host (MetricsFileProvider)."""


# ------------------------------------------------------------------------- the collector on the host

COLLECTOR_SCRIPT = '/usr/local/sbin/gpuhost-collector'
COLLECTOR_CONFIG = '/etc/gpuhost/collector.json'
UNIT_DIR = '/etc/systemd/system'
COLLECTOR_SERVICE = 'gpuhost-collector.service'
COLLECTOR_TIMER = 'gpuhost-collector.timer'
COLLECTOR_TEXTFILE = TEXTFILE_DIR + '/gpuhost-collector.prom'
COLLECTOR_STATE_DIR = '/var/lib/gpuhost'     # the service's StateDirectory=gpuhost
COLLECTOR_STATE = COLLECTOR_STATE_DIR + '/collector-state.json'
COLLECTOR_TIMEOUT_S = 120
def parse_collector_facts(text: str) -> dict:
    """collector_facts.sh's output -> {'files': {path: content or None}, 'timer': {'enabled', 'active'}}
    (pure)."""
    import base64
    files, timer = {}, {'enabled': 'not-found', 'active': 'unknown'}
    for line in text.splitlines():
        kind, _, rest = line.partition('\t')
        fields = rest.split('\t')
        if kind == 'file' and len(fields) == 2:
            files[fields[0]] = None if fields[1] == '-' else base64.b64decode(fields[1]).decode('utf-8', 'replace')
        elif kind == 'timer' and len(fields) == 2:
            timer = {'enabled': fields[0], 'active': fields[1]}
    return {'files': files, 'timer': timer}


class CollectorError(OperatorError):
    pass


class CollectorProvider(ObservedProvider):
    """The collector on the host: its script, config and two unit files (compare-and-swap each, like every
    host file of this program), the timer enabled and active, one run checked at install. Removed on
    destroy with its textfile and state: metrics of a collector that is gone would mislead."""
    ID = 'gpuhost-collector'
    DESIRED = ('files', 'timer')
    # files: {path: content} (and their modes), the script and the units among them; what the collector writes
    # itself and its directories, removed with it.
    INPUTS = {'files': mapof(S), 'modes': mapof(S), 'timer': obj('TimerState', enabled=S, active=S), 'script': S,
              'config': S, 'service_unit': S, 'timer_unit': S, 'textfile_dir': S, 'generated': arr(S),
              'dirs': arr(S)}
    TIMER_ON = {'enabled': 'enabled', 'active': 'active'}

    def observe(self, target, props):
        paths = sorted(props['files'])
        res = remote.run(target, 'collector_facts.sh', [props['timer_unit']] + paths, check=False)
        if res.exit_code != 0:
            raise CollectorError('%s: cannot read the collector\'s files: %s' % (target.name,
                                                                                  res.stderr.strip()[-300:]))
        facts = parse_collector_facts(res.stdout)
        return {'files': {p: facts['files'].get(p) for p in paths}, 'timer': facts['timer']}

    def apply(self, props):
        target = remote.Target.from_inputs(props['connection'])
        current = self.observe(target, props)
        # The script before its config: a running timer meets the new script with the old config (which it
        # skips: collector.OlderConfig), never the old script with a config it cannot read.
        todo = [p for p in sorted(props['files'], key=lambda p: (p != props['script'], p))
                if current['files'][p] != props['files'][p]]
        if todo or current['timer'] != self.TIMER_ON:
            for directory in sorted({posixpath.dirname(p) for p in todo if current['files'][p] is None} |
                                    {props['textfile_dir']}):
                remote.run(target, 'ensure_dir.sh', [directory, '0755'])
            for p in todo:
                old = current['files'][p]
                remote.put_file(target, p, props['files'][p], props['modes'][p],
                                remote.sha256_hex(old) if old is not None else '-')
            reload = any(p.startswith(UNIT_DIR + '/') for p in todo) or current['timer'] != self.TIMER_ON
            res = remote.run(target, 'collector_enable.sh', [props['service_unit'], props['timer_unit'],
                                                             'yes' if reload else 'no'], check=False)
            if res.exit_code != 0:
                raise CollectorError(
                    '%s: the collector does not run on the host: %s. Its files are in place; fix the cause (python3 '
                    'present? `%s --config %s` by hand shows the same), then re-run.' % (
                        target.name, ' | '.join(res.stderr.strip().splitlines()[-6:]) or '(no message)',
                        props['script'], props['config']))
            current = self.observe(target, props)
        return dict(props, **current)

    def current(self, props):
        return self.observe(remote.Target.from_inputs(props['connection']), props)

    def delete(self, _id, props):
        remote.run(remote.Target.from_inputs(props['connection']), 'collector_remove.sh',
                   [props['service_unit'], props['timer_unit']] + sorted(props['files']) +
                   list(props['generated']) + ['--'] + list(props['dirs']))


class HostCollector(GpuhostResource, name='HostCollector'):
    """The collector on the host (CollectorProvider)."""
