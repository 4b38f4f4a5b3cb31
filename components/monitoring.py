"""Monitoring on day one: what the program knows about the host, as Prometheus metrics on the host,
and where Prometheus finds its targets.

  host-metrics   /var/lib/prometheus/node-exporter/gpuhost.prom, a node_exporter textfile-collector
                 file: declared vs running state (reboot required and why, by kind; speculation
                 requested vs resolved; each GPU's assignment, driver and IOMMU group type; the SGLang
                 unit's state and version). Its content is a pure function of the declared state and of
                 facts that change only when the host does (no timestamps, no running averages), so a
                 second `up` writes nothing; computed from the other resources' outputs, so `preview`
                 contacts no host. It describes the host as the last `pulumi up` found it.
  file_sd()      the `prometheus_file_sd` output: SGLang's /metrics and the host's node_exporter, with
                 labels that join with Proxmox's exporter (`id="lxc/200"`, `node`), no `job`.

The metric names follow Prometheus' conventions: prefix `gpuhost_`, base units, `_info` gauges
(value 1) for string facts, a bounded set of label values (a reboot reason's *kind*, never its text).
"""

from __future__ import annotations

import hashlib
import json
import posixpath

import pulumi
from pulumi.dynamic import Resource

from components import remote
from components.sglang import expected_speculation
from components.state import ObservedProvider, OperatorError, numbers

TEXTFILE_DIR = '/var/lib/prometheus/node-exporter'   # Debian's prometheus-node-exporter default
TEXTFILE = TEXTFILE_DIR + '/gpuhost.prom'
NODE_EXPORTER_PORT = 9100

# Reboot reasons by kind: the first matching test names it (components/host.py reboot_reasons()).
REASON_KINDS = (
    ('kernel_cmdline_missing', lambda r: r.startswith('kernel command line: running lacks')),
    ('kernel_cmdline_unwanted', lambda r: r.startswith('kernel command line: running still has')),
    ('nvidia_module_option', lambda r: r.startswith('nvidia ')),
    ('vm_gpu_binding', lambda r: r.endswith('declared vfio-pci')),
    ('container_gpu_binding', lambda r: r.endswith('declared nvidia (container)')),
    ('iommu_group_type', lambda r: r.startswith('IOMMU group')),
)
OTHER = 'other'


def reason_kind(reason: str) -> str:
    return next((kind for kind, test in REASON_KINDS if test(reason)), OTHER)


def nvidia_bus_id(bdf: str) -> str:
    """0000:e1:00.0 -> 00000000:E1:00.0, the form nvidia-smi and DCGM print."""
    domain, rest = bdf.split(':', 1)
    return '%08X:%s' % (int(domain, 16), rest.upper())


# ---------------------------------------------------------------------------------- the textfile

def _escape(value) -> str:
    return str(value).replace('\\', r'\\').replace('\n', r'\n').replace('"', r'\"')


def _labels(labels: dict) -> str:
    if not labels:
        return ''
    return '{%s}' % ','.join('%s="%s"' % (k, _escape(v)) for k, v in labels.items())


def _num(value) -> str:
    value = float(value)
    return str(int(value)) if value.is_integer() else repr(value)


class _Text(object):
    def __init__(self):
        self.lines = []

    def family(self, name, help_, samples, kind='gauge'):
        """samples: [(labels dict, value)]; a family without samples is left out."""
        if not samples:
            return
        self.lines += ['# HELP %s %s' % (name, help_), '# TYPE %s %s' % (name, kind)]
        self.lines += ['%s%s %s' % (name, _labels(labels), _num(value)) for labels, value in samples]

    def text(self):
        return '\n'.join(self.lines) + '\n'


def declared(d) -> dict:
    """What the textfile needs from the config (plain data: it crosses into an apply())."""
    s = d.sglang
    spec = s.speculative
    return {
        'version': s.version, 'unit': s.unit, 'model_name': s.served_model_name, 'tp_size': s.tp,
        'iommu_domain': d.iommu.domain,
        'speculation': ({'algorithm': spec.algorithm, 'num_steps': spec.num_steps, 'eagle_topk': spec.eagle_topk,
                         'num_draft_tokens': spec.num_draft_tokens} if spec and spec.num_steps else None),
        'expect': expected_speculation(d),
    }


def _spec_labels(algorithm, steps, topk, draft) -> dict:
    return {'algorithm': algorithm or 'none', 'num_steps': _num(steps or 0), 'eagle_topk': _num(topk or 0),
            'num_draft_tokens': _num(draft or 0)}


def textfile(decl: dict, gpus: dict, reasons: list, resolved, active, enabled) -> str:
    """The content of gpuhost.prom. gpus: HostStatus' `gpus` (address -> assigned_to, numa, driver, id,
    iommu_group, iommu_group_type); reasons: its `reboot_reasons`; resolved: the SGLang unit's
    `resolved` (/server_info, None when it could not be read); active/enabled: the unit's state."""
    gpus, resolved = numbers(gpus or {}), numbers(resolved)
    reasons = list(reasons or [])
    t = _Text()
    t.family('gpuhost_reboot_required',
             'Whether the host must reboot to run its declared state (1) or not (0), as the last pulumi up found it.',
             [({}, 1 if reasons else 0)])
    kinds = [reason_kind(r) for r in reasons]
    t.family('gpuhost_reboot_reasons',
             'Differences between the running and the declared host state that a reboot applies, by kind.',
             [({'kind': kind}, kinds.count(kind)) for kind in [k for k, _ in REASON_KINDS] + [OTHER]])
    t.family('gpuhost_iommu_declared_domain_info',
             'The IOMMU default domain type the config declares (the running types: gpuhost_gpu_info).',
             [({'domain': decl['iommu_domain']}, 1)])
    t.family('gpuhost_gpu_info',
             'A GPU of the host: where it is assigned (container, vm, host), the driver bound to it and its '
             'IOMMU group\'s type as the last pulumi up found them.',
             [({'gpu': nvidia_bus_id(addr), 'pci_bus_id': addr, 'pci_id': g.get('id') or '',
                'numa_node': _num(g['numa']) if g.get('numa') is not None else '',
                'assigned_to': g.get('assigned_to') or '', 'driver': g.get('driver') or 'none',
                'iommu_group': _num(g['iommu_group']) if g.get('iommu_group') is not None else '',
                'iommu_group_type': g.get('iommu_group_type') or 'none'}, 1)
              for addr, g in sorted(gpus.items())])

    t.family('gpuhost_sglang_info', 'The SGLang service the config declares: version, unit, served model, '
             'tensor parallelism.',
             [({'version': decl['version'], 'unit': decl['unit'], 'model_name': decl['model_name'],
                'tp_size': _num(decl['tp_size'])}, 1)])
    t.family('gpuhost_sglang_unit_active', 'Whether the SGLang unit was active (1) or not (0) at the last pulumi up.',
             [({'unit': decl['unit']}, 1 if active else 0)])
    t.family('gpuhost_sglang_unit_enabled', 'Whether the SGLang unit is enabled to start with the container (1) or '
             'not (0), as the last pulumi up found it.', [({'unit': decl['unit']}, 1 if enabled else 0)])

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
    OUTPUTS = ('sha256',)

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


class MetricsFile(Resource, module='gpuhost', name='MetricsFile'):
    """A node_exporter textfile on the host (MetricsFileProvider)."""


def _digest(values) -> str:
    return hashlib.sha256(json.dumps(numbers(values), sort_keys=True, default=str).encode()).hexdigest()


def upstream(d, host, container, service) -> pulumi.Output:
    """A digest that changes whenever HostStatus or the SGLang unit is created or updated for a
    declared reason: HostStatus' own inputs (the declared host state and the tokens its host resources
    renew on every apply) and the unit's declared inputs (its text, version, name, container, API key).

    Why: a preview that updates either of them cannot know gpuhost.prom's content (their outputs are
    unknown) and lists host-metrics; with this digest among its inputs the `up` then updates it too -
    rewriting the file only if the content differs - so preview lists what up changes. All of it is
    known at preview (never an output that may be null, which a preview reads as unknown)."""
    s = d.sglang
    unit = [service.unit, s.version, s.unit, d.container.vmid]
    token = pulumi.Output.all(host.status.expect, host.status.observed, container.identity).apply(
        lambda a: _digest(list(a) + unit))
    key = getattr(s, 'api_key', None)
    if key is not None:
        # A new API key restarts the unit; only its digest enters, and the result stays a secret.
        token = pulumi.Output.all(token, pulumi.Output.secret(key.get_secret_value())).apply(_digest)
    return token


def host_metrics(name, d, connection, host, container, service, opts=None) -> MetricsFile:
    """The `host-metrics` resource: gpuhost.prom from HostStatus' and the SGLang unit's outputs, written
    after both (`upstream`: see upstream())."""
    decl = declared(d)
    status, unit = host.status, service.service
    content = pulumi.Output.all(host.gpus, host.reboot_reasons, unit.resolved, unit.active, unit.enabled).apply(
        lambda a: textfile(decl, *a))
    opts = pulumi.ResourceOptions.merge(pulumi.ResourceOptions(depends_on=[status, unit]), opts)
    return MetricsFile(MetricsFileProvider(), name, {
        'connection': connection, 'path': TEXTFILE, 'mode': '0644', 'content': content,
        'upstream': upstream(d, host, container, service), 'sha256': None}, opts)
