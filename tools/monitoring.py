"""make monitoring STACK=<name> [MON_OUT=<dir>]: Prometheus rules, a Grafana dashboard and a scrape
config for a stack, from its stack file alone (no host, no secrets).

    python -m tools.monitoring lab monitoring/lab

writes
    gpuhost.rules.yml        recording and alerting rules (templates/gpuhost.rules.yml.j2), with the
                             stack's selectors and thresholds (accept length < 1 + 0.3 x declared steps)
    gpuhost-dashboard.json   a Grafana dashboard (import it; the Prometheus datasource is its
                             ${DS_PROMETHEUS} input)
    prometheus.yml           a scrape config that reads the stack's prometheus_file_sd output and these rules

Selectors use the labels of the prometheus_file_sd output (resources/monitoring.py file_sd):
`id` ("lxc/<vmid>" for SGLang, "node/<node>" for node_exporter) and `node`; never `job`, which the
operator's scrape config names.
"""

from __future__ import annotations

import json
import os
import sys

import jinja2
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import config  # noqa: E402
from components import collector  # noqa: E402
from resources import monitoring  # noqa: E402

RULES = 'gpuhost.rules.yml'
DASHBOARD = 'gpuhost-dashboard.json'
SCRAPE = 'prometheus.yml'
GRAFANA_SCHEMA_VERSION = 39   # Grafana 10.4 / 11.x
DS = {'type': 'prometheus', 'uid': '${DS_PROMETHEUS}'}


def load(stack: str, project: str = ROOT) -> config.Deployment:
    """The stack's Deployment from <project>/Pulumi.<stack>.yaml (secure: values replaced by a
    placeholder: nothing here depends on a secret)."""
    from tools.render import load as render_load
    return render_load(stack, project)


def selectors(d) -> dict:
    sglang_id = 'lxc/%d' % d.container.vmid
    host_id = 'node/%s' % d.host.node
    return {'node': d.host.node, 'sglang_id': sglang_id, 'host_id': host_id,
            'sglang_sel': '{id="%s", node="%s"}' % (sglang_id, d.host.node),
            'host_matchers': 'id="%s", node="%s"' % (host_id, d.host.node),
            'host_sel': '{id="%s", node="%s"}' % (host_id, d.host.node)}


def accept_threshold(steps: int) -> float:
    """Below this accept length the drafts cost more than they save (1 + 0.3 x steps)."""
    return round(1 + 0.3 * steps, 2)


def rules(stack: str, d) -> str:
    spec = d.sglang.speculative
    steps = spec.num_steps if spec and spec.num_steps else 0
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(os.path.join(ROOT, 'templates')),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True,
                             lstrip_blocks=True, variable_start_string='[[', variable_end_string=']]',
                             block_start_string='[%', block_end_string='%]')
    return env.get_template('gpuhost.rules.yml.j2').render(
        stack=stack, vmid=d.container.vmid, unit=d.sglang.unit, version=d.sglang.version,
        textfile=monitoring.TEXTFILE, textfile_dir=monitoring.TEXTFILE_DIR,
        speculation=bool(steps), algorithm=spec.algorithm if steps else None, steps=steps,
        accept_threshold=accept_threshold(steps),
        # sglang:spec_num_steps and sglang:spec_verify_calls_total exist from SGLang 0.5.13 (lab/fakesglang FEATURES).
        spec_num_steps_metric=spec_counters(d), spec_counters=spec_counters(d),
        interval=d.monitoring.collector_interval_s, critical_xids='|'.join(str(x) for x in collector.CRITICAL_XIDS),
        collector_textfile=monitoring.COLLECTOR_TEXTFILE, collector_script=monitoring.COLLECTOR_SCRIPT,
        collector_service=monitoring.COLLECTOR_SERVICE, collector_timer=monitoring.COLLECTOR_TIMER, **selectors(d))


def spec_counters(d) -> bool:
    """SGLang has sglang:spec_verify_calls_total (and sglang:spec_num_steps) from 0.5.13."""
    return _version(d.sglang.version) >= (0, 5, 13)


def _version(v: str) -> tuple:
    return tuple(int(x) for x in v.split('.post')[0].split('.'))


# ------------------------------------------------------------------------------------ dashboard

S = '{node="$node", id="$sglang"}'
H = '{node="$node", id="node/$node"}'


def _target(expr, legend='', ref='A', instant=False, fmt='time_series'):
    t = {'datasource': DS, 'expr': expr, 'legendFormat': legend, 'refId': ref, 'range': not instant,
         'instant': instant, 'format': fmt}
    return t


def _panel(kind, title, grid, targets, unit=None, description='', **extra):
    refs = 'ABCDEFGH'
    p = {'type': kind, 'title': title, 'description': description, 'datasource': DS,
         'gridPos': dict(zip(('x', 'y', 'w', 'h'), grid)),
         'targets': [dict(t, refId=refs[i]) for i, t in enumerate(targets)],
         'fieldConfig': {'defaults': {}, 'overrides': []}, 'options': {}}
    if unit:
        p['fieldConfig']['defaults']['unit'] = unit
    if kind == 'timeseries':
        p['fieldConfig']['defaults']['custom'] = {'drawStyle': 'line', 'lineWidth': 1, 'fillOpacity': 10,
                                                  'showPoints': 'never', 'spanNulls': True}
        p['options'] = {'legend': {'displayMode': 'list', 'placement': 'bottom', 'showLegend': True},
                        'tooltip': {'mode': 'multi', 'sort': 'none'}}
    p.update(extra)
    return p


def _quantiles(metric, sel=S):
    return [_target('histogram_quantile(%s, sum by (le) (rate(%s_bucket%s[$__rate_interval])))' % (q, metric, sel),
                    'p%s' % int(float(q) * 100)) for q in ('0.5', '0.95', '0.99')]


def _mapped_stat(title, grid, targets, mapping, description=''):
    steps = [{'color': color, 'value': None if i == 0 else value} for i, (value, _, color) in enumerate(mapping)]
    return _panel('stat', title, grid, targets, description=description,
                  fieldConfig={'defaults': {
                      'mappings': [{'type': 'value', 'options': {str(v): {'text': text, 'index': i}}}
                                   for i, (v, text, _) in enumerate(mapping)],
                      'thresholds': {'mode': 'absolute', 'steps': steps}, 'color': {'mode': 'thresholds'}},
                      'overrides': []},
                  options={'reduceOptions': {'calcs': ['lastNotNull'], 'fields': '', 'values': False},
                           'colorMode': 'background', 'graphMode': 'none', 'textMode': 'auto',
                           'orientation': 'auto', 'justifyMode': 'auto'})


def _count_stat(title, grid, targets, description='', unit='short', red=1):
    """A number, green below `red`, red from it."""
    return _panel('stat', title, grid, targets, description=description,
                  fieldConfig={'defaults': {'unit': unit, 'color': {'mode': 'thresholds'}, 'thresholds': {
                      'mode': 'absolute', 'steps': [{'color': 'green', 'value': None}, {'color': 'red', 'value': red}]}},
                      'overrides': []},
                  options={'reduceOptions': {'calcs': ['lastNotNull'], 'fields': '', 'values': False},
                           'colorMode': 'background', 'graphMode': 'none', 'textMode': 'auto',
                           'orientation': 'auto', 'justifyMode': 'auto'})


def _table(title, grid, targets, columns, description=''):
    return _panel('table', title, grid, targets, description=description,
                  options={'showHeader': True, 'cellHeight': 'sm'},
                  transformations=[{'id': 'merge', 'options': {}},
                                   {'id': 'organize', 'options': {
                                       'excludeByName': {'Time': True, 'Value': True, '__name__': True, 'job': True,
                                                         'instance': True, 'id': True, 'node': True},
                                       'indexByName': {c: i for i, c in enumerate(columns)},
                                       'renameByName': {}}}])


def dashboard(stack: str, d) -> dict:
    sel = selectors(d)
    spec = d.sglang.speculative
    steps = spec.num_steps if spec and spec.num_steps else 0
    panels = [
        _panel('timeseries', 'Token throughput', (0, 0, 12, 8), [
            _target('sum(rate(sglang:generation_tokens_total%s[$__rate_interval]))' % S, 'generated (finished requests)'),
            _target('sum(sglang:gen_throughput%s)' % S, 'decode throughput (scheduler)'),
            _target('sum(rate(sglang:prompt_tokens_total%s[$__rate_interval]))' % S, 'prompt')],
            unit='short', description='Tokens per second: generated tokens of finished requests, the '
                                      'scheduler\'s running decode throughput, prompt tokens.'),
        _panel('timeseries', 'Requests', (12, 0, 12, 8), [
            _target('sum(sglang:num_running_reqs%s)' % S, 'running'),
            _target('sum(sglang:num_queue_reqs%s)' % S, 'queued'),
            _target('sum(rate(sglang:num_requests_total%s[$__rate_interval]))' % S, 'finished / s')],
            unit='short'),
        _panel('timeseries', 'Time to first token', (0, 8, 8, 8),
               _quantiles('sglang:time_to_first_token_seconds'), unit='s'),
        _panel('timeseries', 'Inter-token latency', (8, 8, 8, 8),
               _quantiles('sglang:inter_token_latency_seconds'), unit='s'),
        _panel('timeseries', 'End-to-end request latency', (16, 8, 8, 8),
               _quantiles('sglang:e2e_request_latency_seconds'), unit='s'),
        _panel('timeseries', 'KV cache usage and prefix cache hit rate', (0, 16, 8, 8), [
            _target('max(sglang:token_usage%s)' % S, 'KV token usage'),
            _target('max(sglang:cache_hit_rate%s)' % S, 'prefix cache hit rate')],
            unit='percentunit', fieldConfig={'defaults': {'unit': 'percentunit', 'min': 0, 'max': 1},
                                             'overrides': []}),
        _panel('timeseries', 'Speculative accept length', (8, 16, 8, 8), ([
            _target('(sum(rate(sglang:generation_tokens_total%s[$__rate_interval])) - sum(rate(sglang:num_requests_total'
                    '%s[$__rate_interval]))) / sum(rate(sglang:spec_verify_calls_total%s[$__rate_interval]))'
                    % (S, S, S), 'accept length (counters)')] if spec_counters(d) else []) + [
            _target('max(sglang:spec_accept_length%s)' % S, 'last decode interval (gauge)'),
            _target('1 + 0.3 * max(gpuhost_sglang_speculative_num_steps{node="$node", id="node/$node", '
                    'side="requested"})', 'alert below (1 + 0.3 x declared steps)')],
            unit='short', description='Tokens per forward step (1 + accepted drafts)%s. Declared: %s.' % (
                ': from the counters over the interval (generated tokens less one per request, per verify step), '
                'the alert\'s measure; the gauge is SGLang\'s last decode interval' if spec_counters(d) else '',
                '%s, %d step(s), alert below %s' % (spec.algorithm, steps, accept_threshold(steps)) if steps
                else 'no speculative decoding')),
        _panel('timeseries', 'Speculative accept rate', (16, 16, 8, 8), [
            _target('max(sglang:spec_accept_rate%s)' % S, 'accepted / proposed drafts')],
            unit='percentunit'),
        _mapped_stat('Reboot required', (0, 24, 4, 5), [_target('max(gpuhost_reboot_required%s)' % H)],
                     [(0, 'no', 'green'), (1, 'reboot required', 'orange')],
                     description='Live: the collector on the host compares what runs with what is declared.'),
        _panel('bargauge', 'Reboot reasons by kind', (4, 24, 8, 5), [
            _target('gpuhost_reboot_reasons%s > 0' % H, '{{kind}}', instant=True)],
            options={'orientation': 'horizontal', 'displayMode': 'basic', 'showUnfilled': True,
                     'reduceOptions': {'calcs': ['lastNotNull'], 'fields': '', 'values': False}}),
        _mapped_stat('Targets', (12, 24, 6, 5), [
            _target('up{node="$node", id=~"$sglang|node/$node"}', '{{id}}')],
            [(0, 'down', 'red'), (1, 'up', 'green')]),
        _mapped_stat('Speculation resolved as requested', (18, 24, 6, 5), [
            _target('max(gpuhost_sglang_speculation_match%s)' % H)],
            [(0, 'no', 'red'), (1, 'yes', 'green')]),
        _table('GPU assignment', (0, 29, 16, 9), [
            _target('gpuhost_gpu_info%s' % H, instant=True, fmt='table')],
            ['gpu', 'pci_bus_id', 'assigned_to', 'driver', 'iommu_group', 'iommu_group_type', 'numa_node', 'pci_id'],
            description='Each GPU of the host, live (the collector): where the config assigns it, the driver bound '
                        'to it and its IOMMU group type.'),
        _table('Speculation: requested and resolved', (16, 29, 8, 4), [
            _target('label_replace(gpuhost_sglang_speculation_requested_info%s, "side", "requested", "", "")' % H,
                    instant=True, fmt='table'),
            _target('label_replace(gpuhost_sglang_speculation_resolved_info%s, "side", "resolved", "", "")' % H,
                    instant=True, fmt='table')],
            ['side', 'algorithm', 'num_steps', 'eagle_topk', 'num_draft_tokens']),
        _table('SGLang unit', (16, 33, 8, 5), [
            _target('gpuhost_sglang_info%s' % H, instant=True, fmt='table'),
            _target('gpuhost_sglang_unit_active%s' % H, instant=True, fmt='table'),
            _target('gpuhost_sglang_unit_enabled%s' % H, instant=True, fmt='table')],
            ['unit', 'version', 'model_name', 'tp_size', 'Value #B', 'Value #C']),
        # The host's own state, live (gpuhost-collector.prom): one panel for each of its alerts.
        _mapped_stat('Blackwell GPU in an identity IOMMU domain', (0, 38, 6, 5), [
            _target('max(gpuhost_blackwell_gpu_identity_domain%s)' % H)],
            [(0, 'no', 'green'), (1, 'IDENTITY: power-cycle', 'red')],
            description='Identity domains brick these GPUs (FSP 0x177) until a power cycle (alert '
                        'GpuhostIdentityIommuGroup).'),
        _count_stat('Container GPUs on vfio-pci', (6, 38, 6, 5), [
            _target('count(gpuhost_gpu_info{node="$node", id="node/$node", assigned_to="container", '
                    'driver="vfio-pci"}) or vector(0)')],
            description='Alert GpuhostContainerGpuOnVfio: the GPU table says which.'),
        _count_stat('Collector: seconds since its last complete run', (12, 38, 6, 5), [
            _target('time() - max(gpuhost_collector_last_success_timestamp_seconds%s)' % H)],
            unit='s', red=3 * d.monitoring.collector_interval_s,
            description='The collector runs every %d s; alert GpuhostCollectorStale after three intervals.' % (
                d.monitoring.collector_interval_s)),
        _table('NVIDIA driver: host module and container user space', (18, 38, 6, 5), [
            _target('label_replace(gpuhost_nvidia_module_info%s, "side", "host module", "", "") or '
                    'label_replace(gpuhost_nvidia_driver_info{side="container", node="$node", id="node/$node"}, '
                    '"side", "container user space", "", "") or '
                    'label_replace(gpuhost_nvidia_driver_declared_info%s, "side", "declared", "", "")' % (H, H),
                    instant=True, fmt='table')],
            ['side', 'version'],
            description='They must be the same version (alert GpuhostNvidiaDriverLibraryMismatch): the host module '
                        'live (the collector), the container\'s user space as the last pulumi up found it; with '
                        'gpuhost:nvidia.driver, the declared version (alert GpuhostNvidiaDriverDeclaredMismatch).'),
        _panel('timeseries', 'Xid events by GPU and code', (0, 43, 12, 8), [
            _target('sum by (pci_bus_id, xid) (increase(gpuhost_gpu_xid_errors_total%s[$__rate_interval]))' % H,
                    '{{pci_bus_id}} Xid {{xid}}')],
            unit='short', description='From the kernel log (alerts GpuhostGpuXidCritical: %s; GpuhostGpuXidErrors: '
                                      'the others).' % ', '.join(str(x) for x in collector.CRITICAL_XIDS)),
        _panel('bargauge', 'Xid events since boot, by code', (12, 43, 12, 8), [
            _target('sum by (xid) (gpuhost_gpu_xid_errors_total%s)' % H, 'Xid {{xid}}', instant=True)],
            options={'orientation': 'horizontal', 'displayMode': 'basic', 'showUnfilled': True,
                     'reduceOptions': {'calcs': ['lastNotNull'], 'fields': '', 'values': False}}),
        _panel('timeseries', 'IOMMU page faults by device', (0, 51, 12, 8), [
            _target('sum by (pci_bus_id) (increase(gpuhost_iommu_page_faults_total%s[$__rate_interval]))' % H,
                    '{{pci_bus_id}}')],
            unit='short', description='AMD-Vi IO_PAGE_FAULT events the kernel logged (alert GpuhostIommuPageFaults).'),
        _panel('timeseries', 'PCIe AER errors by GPU', (12, 51, 12, 8), [
            _target('sum by (pci_bus_id, severity) (increase(gpuhost_gpu_pcie_aer_errors_total%s[$__rate_interval]))'
                    % H, '{{pci_bus_id}} {{severity}}')],
            unit='short', description='The kernel\'s AER counters of each GPU (sysfs aer_dev_*).'),
        _panel('bargauge', 'Kernel command line: declared parameters running', (0, 59, 12, 6), [
            _target('gpuhost_kernel_cmdline_declared_arg_running%s' % H, '{{arg}}', instant=True),
            _target('count(gpuhost_kernel_cmdline_unwanted_arg_running%s) or vector(0)' % H,
                    'forbidden parameters running', instant=True)],
            options={'orientation': 'horizontal', 'displayMode': 'basic', 'showUnfilled': True,
                     'reduceOptions': {'calcs': ['lastNotNull'], 'fields': '', 'values': False}},
            description='1: the running kernel has the declared parameter; a reboot applies a missing one.'),
        _panel('bargauge', 'nvidia module parameters: declared and running', (12, 59, 12, 6), [
            _target('gpuhost_nvidia_module_parameter%s' % H, 'NVreg_{{name}} {{side}}', instant=True)],
            options={'orientation': 'horizontal', 'displayMode': 'basic', 'showUnfilled': True,
                     'reduceOptions': {'calcs': ['lastNotNull'], 'fields': '', 'values': False}}),
        _count_stat('Installed kernels without the nvidia module', (0, 65, 6, 5), [
            _target('count(gpuhost_nvidia_kernel_module_built%s == 0) or vector(0)' % H)],
            description='A boot into one has no GPU driver (alert GpuhostKernelWithoutNvidiaModule); the table beside '
                        'names them.'),
        _table('Installed kernels: their nvidia module', (6, 65, 18, 5), [
            _target('gpuhost_nvidia_kernel_module_info%s or label_replace(gpuhost_nvidia_kernel_module_built%s == 0, '
                    '"version", "none built", "", "")' % (H, H), instant=True, fmt='table')],
            ['kernel', 'version'],
            description='Each kernel of /lib/modules and the nvidia module built for it (modinfo -k KERNEL), live; a '
                        'kernel the collector could not read is not listed (alert GpuhostNvidiaKernelModulesUnknown).'),
    ]
    for i, p in enumerate(panels, 1):
        p['id'] = i
    var = {'datasource': DS, 'hide': 0, 'includeAll': False, 'multi': False, 'refresh': 1, 'sort': 1,
           'type': 'query', 'options': []}
    return {
        '__inputs': [{'name': 'DS_PROMETHEUS', 'label': 'Prometheus', 'description': 'The Prometheus that scrapes '
                      'the prometheus_file_sd targets', 'type': 'datasource', 'pluginId': 'prometheus',
                      'pluginName': 'Prometheus'}],
        '__elements': {},
        '__requires': [{'type': 'grafana', 'id': 'grafana', 'name': 'Grafana', 'version': '10.4.0'},
                       {'type': 'datasource', 'id': 'prometheus', 'name': 'Prometheus', 'version': '1.0.0'}] +
                      [{'type': 'panel', 'id': k, 'name': n, 'version': ''} for k, n in
                       (('bargauge', 'Bar gauge'), ('stat', 'Stat'), ('table', 'Table'), ('timeseries', 'Time series'))],
        'annotations': {'list': [{'builtIn': 1, 'datasource': {'type': 'grafana', 'uid': '-- Grafana --'},
                                  'enable': True, 'hide': True, 'iconColor': 'rgba(0, 211, 255, 1)',
                                  'name': 'Annotations & Alerts', 'type': 'dashboard'}]},
        'description': 'SGLang serving and the Proxmox GPU host of the gpuhost stack %s (generated by make '
                       'monitoring STACK=%s).' % (stack, stack),
        'editable': True, 'fiscalYearStartMonth': 0, 'graphTooltip': 1, 'id': None, 'links': [],
        'panels': panels, 'refresh': '30s', 'schemaVersion': GRAFANA_SCHEMA_VERSION,
        'tags': ['gpuhost', 'sglang', 'proxmox'],
        'templating': {'list': [
            dict(var, name='node', label='Proxmox node', query='label_values(gpuhost_reboot_required, node)',
                 definition='label_values(gpuhost_reboot_required, node)',
                 current={'selected': True, 'text': sel['node'], 'value': sel['node']}),
            dict(var, name='sglang', label='SGLang container',
                 query='label_values(sglang:num_running_reqs{node="$node"}, id)',
                 definition='label_values(sglang:num_running_reqs{node="$node"}, id)',
                 current={'selected': True, 'text': sel['sglang_id'], 'value': sel['sglang_id']})]},
        'time': {'from': 'now-6h', 'to': 'now'}, 'timepicker': {}, 'timezone': '',
        'title': 'gpuhost %s: SGLang and host' % stack, 'uid': ('gpuhost-%s' % stack)[:40], 'version': 1,
        'weekStart': ''}


def dashboard_exprs(dash: dict) -> list:
    """Every PromQL expression of the dashboard (panels' targets and query variables)."""
    out = [t['expr'] for p in dash['panels'] for t in p.get('targets', [])]
    out += [v['query'] for v in dash['templating']['list'] if v.get('type') == 'query']
    return out


def concrete(expr: str, d, rate_interval: str = '1m') -> str:
    """A dashboard expression with Grafana's variables filled in, as Grafana sends it."""
    sel = selectors(d)
    return (expr.replace('$__rate_interval', rate_interval).replace('$sglang', sel['sglang_id'])
            .replace('$node', sel['node']))


def scrape_config(stack: str, d, targets_file: str = 'targets/gpuhost-%s.json', rule_files=(RULES,)) -> str:
    return ('# Prometheus scrape config for the gpuhost stack %(stack)s (make monitoring STACK=%(stack)s).\n'
            '# Targets: pulumi stack output prometheus_file_sd --json --stack %(stack)s > %(targets)s\n'
            '# (re-run after every pulumi up; Prometheus re-reads the file on change, no reload).\n'
            % {'stack': stack, 'targets': targets_file % stack}) + yaml.safe_dump({
                'rule_files': list(rule_files),
                'scrape_configs': [{'job_name': 'gpuhost', 'scrape_interval': '15s',
                                    'file_sd_configs': [{'files': [targets_file % stack]}]}]},
                sort_keys=False)


def files(stack: str, d) -> dict:
    return {RULES: rules(stack, d), DASHBOARD: json.dumps(dashboard(stack, d), indent=2) + '\n',
            SCRAPE: scrape_config(stack, d)}


def main(argv):
    if len(argv) != 2:
        sys.exit('usage: python -m tools.monitoring STACK OUT')
    stack, out_dir = argv
    from tools.render import load_fleet
    try:
        fleet = load_fleet(stack)
    except config.ConfigError as e:
        sys.exit(str(e))

    def write(where, name, content):
        os.makedirs(where, exist_ok=True)
        path = os.path.join(where, name)
        with open(path, 'w') as f:
            f.write(content)
        print(path)
    if not fleet.is_fleet:
        for name, content in sorted(files(stack, fleet.hosts[0].deployment).items()):
            write(out_dir, name, content)
        return
    # A fleet: one scrape config for the stack (its prometheus_file_sd holds every host, labelled), and
    # each host's rules and dashboard under OUT/<host>/, named <stack>-<host> (dashboard uid and title,
    # rule groups) so that importing them all clashes in nothing.
    rule_files = []
    for h in fleet.hosts:
        name = '%s-%s' % (stack, h.name)
        write(os.path.join(out_dir, h.name), RULES, rules(name, h.deployment))
        write(os.path.join(out_dir, h.name), DASHBOARD, json.dumps(dashboard(name, h.deployment), indent=2) + '\n')
        rule_files.append('%s/%s' % (h.name, RULES))
    write(out_dir, SCRAPE, scrape_config(stack, fleet.hosts[0].deployment, rule_files=rule_files))


if __name__ == '__main__':
    main(sys.argv[1:])
