"""Monitoring: the node_exporter textfile the program writes (promtool check metrics), the file_sd
output, the rules and dashboard `make monitoring` renders (promtool check rules, promtool test rules
with the fixtures in tests/unit/monitoring/) and the committed example for the lab stack."""

import dataclasses
import json
import os
import shutil
import subprocess

import pytest
import yaml

from components import collector
from hostscripts import host_state
from components import monitoring as program_monitoring
from resources import monitoring
from transport import remote
from resources.host import reboot_reasons
from tests.lablib import REPO
from tests.unit.config.test_config import parse
from tests.unit.test_facts import EXPECT, facts
from tools import monitoring as tool

FIXTURES = os.path.join(os.path.dirname(__file__), 'monitoring')
PROMTOOL = shutil.which('promtool')

RESOLVED = {'speculative_algorithm': 'EAGLE', 'speculative_num_steps': 1.0, 'speculative_eagle_topk': 1.0,
            'speculative_num_draft_tokens': 2.0, 'tp_size': 4.0, 'served_model_name': 'qwen3.5-122b-a10b',
            'mem_fraction_static': 0.75, 'version': '0.5.23', 'avg_spec_accept_length': 1.8}


def promtool(*args, cwd=None):
    if PROMTOOL is None:
        pytest.fail('promtool is missing: apt-get install -y prometheus (.ci/run installs it)')
    return subprocess.run([PROMTOOL] + list(args), capture_output=True, text=True, cwd=cwd, timeout=120)


def check_metrics(text):
    res = subprocess.run([PROMTOOL or 'promtool', 'check', 'metrics'], input=text, capture_output=True, text=True)
    return res.returncode, (res.stdout + res.stderr).strip()


def samples(text):
    """{'name{labels}': value} of an exposition text."""
    return {line.rsplit(' ', 1)[0]: float(line.rsplit(' ', 1)[1]) for line in text.splitlines()
            if line and not line.startswith('#')}


# ------------------------------------------------------------------------------- the textfile

def test_textfile_is_clean_exposition_format_with_help_and_type():
    text = monitoring.textfile(monitoring.declared(parse()), RESOLVED, True, True)
    assert check_metrics(text) == (0, '')
    names = {line.split()[2] for line in text.splitlines() if line.startswith('# TYPE')}
    assert names == {line.split()[2] for line in text.splitlines() if line.startswith('# HELP')}
    assert all(n.startswith('gpuhost_') for n in names)
    s = samples(text)
    assert s['gpuhost_sglang_speculation_match'] == 1
    assert s['gpuhost_sglang_speculation_requested_info{algorithm="NEXTN",num_steps="1",eagle_topk="1",'
             'num_draft_tokens="2"}'] == 1
    assert s['gpuhost_sglang_speculation_resolved_info{algorithm="EAGLE",num_steps="1",eagle_topk="1",'
             'num_draft_tokens="2"}'] == 1
    assert s['gpuhost_sglang_speculative_num_steps{side="requested"}'] == 1
    assert s['gpuhost_sglang_speculative_num_draft_tokens{side="resolved"}'] == 2
    assert s['gpuhost_sglang_info{version="0.5.23",unit="sglang-qwen.service",model_name="qwen3.5-122b-a10b",'
             'tp_size="4"}'] == 1
    assert s['gpuhost_sglang_unit_active{unit="sglang-qwen.service"}'] == 1
    # Prometheus' textfile collector rejects timestamps; nothing here may change without the host changing.
    assert all(len(line.split()) == 2 for line in text.splitlines() if not line.startswith('#'))


def test_the_two_textfiles_never_share_a_family():
    """node_exporter serves both files of its directory: a family in both (with another HELP, other labels)
    would fail its scrape. The host's own state is the collector's alone, live."""
    ours = monitoring.textfile(monitoring.declared(parse()), RESOLVED, True, True)
    cfg = json.loads(program_monitoring.collector_config(parse()))
    live = collector.render(cfg, facts('host_facts.lab-systemd-boot.txt'), '580.95.05', {}, collector.fresh_state('b'),
                            {'host': True})
    families = [{line.split()[2] for line in t.splitlines() if line.startswith('# TYPE')} for t in (ours, live)]
    assert families[0] and families[1] and not families[0] & families[1], families[0] & families[1]
    for name in ('gpuhost_reboot_required', 'gpuhost_gpu_info', 'gpuhost_iommu_declared_domain_info'):
        assert name in families[1]


def test_textfile_is_a_pure_function_of_state_not_of_traffic():
    decl = monitoring.declared(parse())
    a = monitoring.textfile(decl, RESOLVED, True, True)
    busier = dict(RESOLVED, avg_spec_accept_length=1.37)
    assert monitoring.textfile(decl, busier, True, True) == a


def test_reboot_reasons_become_bounded_kinds():
    base = reboot_reasons(facts('host_facts.lab-grub-identity.txt'), EXPECT)
    vm_unbound = sum(r.endswith('declared vfio-pci') for r in base)
    reasons = base + ['0000:91:00.0: bound to nvidia, declared vfio-pci', 'nvidia NVreg_DmaRemapPeerMmio: running 1, declared 0',
                '0000:01:00.0: bound to vfio-pci, declared nvidia (container)', 'something new the lead adds']
    kinds = dict(host_state.reason_counts(reasons))
    assert set(kinds) == {k for k, _ in monitoring.REASON_KINDS} | {'other'}
    assert kinds['kernel_cmdline_unwanted'] == 1 and kinds['iommu_group_type'] >= 1
    assert (kinds['vm_gpu_binding'], kinds['container_gpu_binding'], kinds['nvidia_module_option'],
            kinds['other']) == (vm_unbound + 1, 1, 1, 1)
    assert sum(kinds.values()) == len(reasons)
    f = facts('host_facts.lab-systemd-boot.txt')
    assert [monitoring.reason_kind(r) for r in reboot_reasons(f, EXPECT)] == ['kernel_cmdline_missing']
    # As the collector writes them, from the golden facts of a GRUB host booted with iommu=pt.
    cfg = json.loads(program_monitoring.collector_config(parse()))
    text = collector.render(cfg, facts('host_facts.lab-grub-identity.txt'), None, {}, collector.fresh_state('b'),
                            {'host': True})
    assert check_metrics(text) == (0, '')
    s = samples(text)
    assert s['gpuhost_reboot_required'] == 1
    written = {k.split('"')[1]: v for k, v in s.items() if k.startswith('gpuhost_reboot_reasons{')}
    assert written == dict(host_state.reason_counts(reboot_reasons(facts('host_facts.lab-grub-identity.txt'),
                                                                   cfg['expect'])))
    assert not any('running' in k or '0000:' in k for k in written), 'free text never becomes a label'
    assert s['gpuhost_blackwell_gpu_identity_domain{gpu="00000000:01:00.0",pci_bus_id="0000:01:00.0"}'] == 1


def test_speculation_resolved_otherwise_or_unknown_and_mtp_off():
    decl = monitoring.declared(parse())
    off = dict(RESOLVED, speculative_algorithm=None)
    s = samples(monitoring.textfile(decl, off, True, False))
    assert s['gpuhost_sglang_speculation_match'] == 0
    assert s['gpuhost_sglang_speculation_resolved_info{algorithm="none",num_steps="0",eagle_topk="0",'
             'num_draft_tokens="0"}'] == 1
    assert s['gpuhost_sglang_speculative_num_steps{side="resolved"}'] == 0
    assert s['gpuhost_sglang_unit_enabled{unit="sglang-qwen.service"}'] == 0
    # /server_info unreadable at the last refresh: no resolved series rather than a false 0.
    text = monitoring.textfile(decl, None, False, True)
    assert check_metrics(text) == (0, '')
    assert 'gpuhost_sglang_speculation_match' not in text and 'resolved_info' not in text
    # MTP not declared: requested none, and SGLang without it matches.
    decl = monitoring.declared(parse(sglang__speculative=None))
    s = samples(monitoring.textfile(decl, off, True, True))
    assert s['gpuhost_sglang_speculation_match'] == 1
    assert s['gpuhost_sglang_speculation_requested_info{algorithm="none",num_steps="0",eagle_topk="0",'
             'num_draft_tokens="0"}'] == 1


def test_gpu_label_in_the_form_nvidia_smi_and_dcgm_print():
    assert monitoring.nvidia_bus_id('0000:01:00.0') == '00000000:01:00.0'
    assert monitoring.nvidia_bus_id('0000:e1:00.0') == '00000000:E1:00.0'
    assert monitoring.nvidia_bus_id('0001:c1:00.1') == '00000001:C1:00.1'


# ----------------------------------------------------------------------------- file_sd output

def test_file_sd_targets_and_labels_by_convention():
    groups = monitoring.file_sd(parse())
    assert groups == [
        {'targets': ['127.0.0.4:30000'], 'labels': {'id': 'lxc/200', 'node': 'pve-lab'}},
        {'targets': ['127.0.0.3:9100'], 'labels': {'id': 'node/pve-lab', 'node': 'pve-lab'}}]
    for g in groups:
        assert not {'job', 'instance', 'model_name', 'model'} & set(g['labels'])
        assert all(isinstance(v, str) for v in g['labels'].values())


# ------------------------------------------------------------------------ the metrics file resource

@dataclasses.dataclass
class FakeHost:
    files: dict
    calls: list = dataclasses.field(default_factory=list)

    def run(self, target, name, args=(), check=True, **kw):
        self.calls.append((name, list(args)))
        if name == 'read_file.sh':
            content = self.files.get(args[0])
            return remote.Result(content or '', '', 0 if content is not None else 4)
        return remote.Result('', '', 0)

    def put_file(self, target, path, content, mode, expected, post='none', client=None):
        self.calls.append(('put_file', [path, mode, expected]))
        self.files[path] = content
        return True


CONN = {'host': 'h', 'port': 22, 'user': 'root', 'private_key': 'k', 'host_key': 'ssh-ed25519 AAAA'}


def test_metrics_file_created_with_its_directory_then_left_alone(monkeypatch):
    host = FakeHost({})
    monkeypatch.setattr(remote, 'run', host.run)
    monkeypatch.setattr(remote, 'put_file', host.put_file)
    p = monitoring.MetricsFileProvider()
    props = {'connection': CONN, 'path': monitoring.TEXTFILE, 'mode': '0644', 'content': 'a 1\n', 'sha256': None}
    out = p.apply(props)
    assert [c[0] for c in host.calls] == ['read_file.sh', 'ensure_dir.sh', 'put_file', 'read_file.sh']
    assert host.calls[1][1] == ['/var/lib/prometheus/node-exporter', '0755']
    assert host.calls[2][1] == [monitoring.TEXTFILE, '0644', '-']
    assert out['content'] == 'a 1\n' and out['sha256'] == remote.sha256_hex('a 1\n')
    assert not p.diff('id', out, props).changes
    host.calls.clear()
    p.apply(props)
    assert [c[0] for c in host.calls] == ['read_file.sh'], 'same content: nothing written'
    host.calls.clear()
    out = p.apply(dict(props, content='a 2\n'))
    assert [c[0] for c in host.calls] == ['read_file.sh', 'put_file', 'read_file.sh']
    assert host.calls[1][1][2] == remote.sha256_hex('a 1\n'), 'compare-and-swap on the content read'
    p.delete('id', out)
    assert host.calls[-1] == ('remove_file.sh', [monitoring.TEXTFILE])


# ---------------------------------------------------------------------------------------- rules

def render_rules(tmp_path, stack='lab', d=None, annotations=True):
    text = tool.rules(stack, d or tool.load(stack))
    if not annotations:
        doc = yaml.safe_load(text)
        for g in doc['groups']:
            for r in g['rules']:
                r.pop('annotations', None)
        text = yaml.safe_dump(doc, sort_keys=False)
    return text


@pytest.mark.parametrize('stack,changes', [('lab', {}), ('prod', {}), ('lab', {'sglang__speculative': None}),
                                           ('lab', {'sglang__version': '0.5.9'})])
def test_rules_pass_promtool_check(tmp_path, stack, changes):
    d = tool.load(stack) if not changes else parse(**changes)
    (tmp_path / 'rules.yml').write_text(tool.rules(stack, d))
    res = promtool('check', 'rules', str(tmp_path / 'rules.yml'))
    assert res.returncode == 0, res.stdout + res.stderr
    names = [r.get('alert') for g in yaml.safe_load((tmp_path / 'rules.yml').read_text())['groups'] for r in g['rules']]
    spec = d.sglang.speculative
    assert ('GpuhostSglangSpeculationInactive' in names) == bool(spec and spec.num_steps)
    assert {'GpuhostTargetDown', 'GpuhostRebootRequired', 'GpuhostContainerGpuOnVfio', 'GpuhostIdentityIommuGroup',
            'GpuhostSglangSpeculationMismatch', 'GpuhostSglangThroughputCollapse', 'GpuhostGpuXidCritical',
            'GpuhostGpuXidErrors', 'GpuhostIommuPageFaults', 'GpuhostNvidiaDriverLibraryMismatch',
            'GpuhostCollectorStale', 'GpuhostKernelWithoutNvidiaModule', 'GpuhostNvidiaKernelModulesUnknown',
            'GpuhostNvidiaDriverDeclaredMismatch'} <= set(names)


def test_rules_threshold_follows_the_declared_steps():
    text = tool.rules('lab', parse(sglang__speculative={'algorithm': 'NEXTN', 'num_steps': 3, 'eagle_topk': 1,
                                                        'num_draft_tokens': 4}))
    assert 'node_id:sglang_spec_accept_length:rate5m < 1.9\n' in text
    assert 'sglang:spec_num_steps{id="lxc/200", node="pve-lab"}) != 3' in text
    # Before 0.5.13 SGLang has no sglang:spec_num_steps: the rule uses the accept length alone.
    assert 'sglang:spec_num_steps' not in tool.rules('lab', parse(sglang__version='0.5.9'))


def test_rules_behave_as_the_fixtures_say(tmp_path):
    (tmp_path / 'rules.yml').write_text(render_rules(tmp_path, annotations=False))
    shutil.copy(os.path.join(FIXTURES, 'alerts.test.yml'), tmp_path)
    res = promtool('test', 'rules', 'alerts.test.yml', cwd=str(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr


def test_rules_annotations_read_as_the_fixtures_say(tmp_path):
    (tmp_path / 'gpuhost.rules.yml').write_text(render_rules(tmp_path))
    shutil.copy(os.path.join(FIXTURES, 'annotations.test.yml'), tmp_path)
    res = promtool('test', 'rules', 'annotations.test.yml', cwd=str(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr


def test_recorded_accept_length_is_bench_serves_on_the_same_counters(tmp_path):
    """The recording rule and bench-serve (tools/bench_serve.py accept_stats) read SGLang's counters one way:
    the same counters, the same accept length."""
    from tools.bench_serve import accept_stats
    per_min = {'sglang:generation_tokens_total': 6600.0, 'sglang:num_requests_total': 60.0,
               'sglang:spec_verify_calls_total': 4087.5}
    minutes = 30
    want = accept_stats({k: 0.0 for k in per_min}, {k: v * minutes for k, v in per_min.items()}, 2)['accept_length']
    assert want == 1.6
    labels = '{id="lxc/200", node="pve-lab", instance="c:30000", job="gpuhost", model_name="m", engine_type="unified"}'
    doc = {'rule_files': ['rules.yml'], 'evaluation_interval': '1m', 'tests': [{
        'interval': '1m',
        'input_series': [{'series': name + labels, 'values': '0+%sx%d' % (v, minutes)} for name, v in per_min.items()],
        'promql_expr_test': [{'expr': 'node_id:sglang_spec_accept_length:rate5m', 'eval_time': '20m', 'exp_samples': [
            {'labels': 'node_id:sglang_spec_accept_length:rate5m{id="lxc/200", node="pve-lab"}', 'value': want}]}]}]}
    (tmp_path / 'rules.yml').write_text(render_rules(tmp_path, annotations=False))
    (tmp_path / 'accept.test.yml').write_text(yaml.safe_dump(doc))
    res = promtool('test', 'rules', 'accept.test.yml', cwd=str(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    # Before SGLang 0.5.13 there is no verify counter: no recording rule, the alert reads the gauge.
    old = tool.rules('lab', parse(sglang__version='0.5.9'))
    assert 'node_id:sglang_spec_accept_length:rate5m' not in old and 'sglang:spec_accept_length{' in old


# ------------------------------------------------------------------------------------ dashboard

def test_dashboard_structure_and_every_query_parses(tmp_path):
    d = tool.load('lab')
    dash = json.loads(json.dumps(tool.dashboard('lab', d)))
    assert dash['schemaVersion'] >= 39 and dash['uid'] == 'gpuhost-lab'
    assert dash['__inputs'][0]['name'] == 'DS_PROMETHEUS' and dash['__inputs'][0]['pluginId'] == 'prometheus'
    assert len({p['id'] for p in dash['panels']}) == len(dash['panels'])
    kinds = {p['type'] for p in dash['panels']}
    assert {r['id'] for r in dash['__requires'] if r['type'] == 'panel'} == kinds
    for p in dash['panels']:
        assert p['datasource'] == {'type': 'prometheus', 'uid': '${DS_PROMETHEUS}'}, p['title']
        assert p['targets'], p['title']
        assert set(p['gridPos']) == {'x', 'y', 'w', 'h'} and p['gridPos']['x'] + p['gridPos']['w'] <= 24
        for t in p['targets']:
            assert t['datasource'] == p['datasource'] and t['expr'] and t['refId']
    for v in dash['templating']['list']:
        assert v['datasource'] == {'type': 'prometheus', 'uid': '${DS_PROMETHEUS}'}
    titles = ' '.join(p['title'] for p in dash['panels']).lower()
    for topic in ('throughput', 'first token', 'inter-token', 'request', 'kv cache', 'accept length', 'accept rate',
                  'gpu assignment', 'reboot', 'identity', 'vfio-pci', 'xid', 'iommu page faults', 'aer',
                  'container user space', 'collector', 'kernel command line', 'nvidia module parameters',
                  'kernels without the nvidia module'):
        assert topic in titles
    exprs = tool.dashboard_exprs(dash)
    assert any('histogram_quantile' in e and 'time_to_first_token_seconds_bucket' in e for e in exprs)
    # promtool has no "parse this PromQL": each query becomes a recording rule for `promtool check rules`
    # (label_values() is Grafana's, not PromQL: its metric selector is checked instead).
    queries = [e[len('label_values('):].rsplit(',', 1)[0] if e.startswith('label_values(') else e for e in exprs]
    doc = {'groups': [{'name': 'dashboard', 'rules': [{'record': 'dashboard:query_%d' % i, 'expr': tool.concrete(q, d)}
                                                      for i, q in enumerate(queries)]}]}
    (tmp_path / 'dashboard-queries.yml').write_text(yaml.safe_dump(doc))
    res = promtool('check', 'rules', str(tmp_path / 'dashboard-queries.yml'))
    assert res.returncode == 0, res.stdout + res.stderr
    assert '$' not in ''.join(tool.concrete(q, d) for q in queries)


# ------------------------------------------------------------------------ the committed example

def test_committed_lab_example_is_what_make_monitoring_writes(tmp_path):
    tool.main(['lab', str(tmp_path)])
    for name in (tool.RULES, tool.DASHBOARD, tool.SCRAPE):
        with open(os.path.join(REPO, 'monitoring', 'lab', name)) as f:
            assert (tmp_path / name).read_text() == f.read(), 'run `make monitoring STACK=lab` and commit the result'


def test_the_gpu_proofs_textfile_passes_promtool_for_a_pass_and_a_failure(monkeypatch):
    """What the proof leaves for node_exporter (resources/sglang.py proof_textfile), written even when it fails."""
    from transport import remote
    from resources import sglang
    written = {}
    monkeypatch.setattr(remote, 'put_file', lambda target, path, text, mode, expected: written.update({path: text}))
    monkeypatch.setattr(remote, 'run', lambda target, script, args, **kw: written.update({script: args}))
    out = {'ok': True, 'per_gpu': [{'bus_id': '0000:01:00.0', 'ok': True}, {'bus_id': '0000:11:00.0', 'ok': True}],
           'busbw': 21.5e9, 'allreduce_bytes': 134217728, 'transport': 'SHM'}
    sglang.proof_textfile(None, {'vmid': 200}, out)
    text = written['/var/lib/prometheus/node-exporter/gpuhost-gpu-proof.prom']
    # Its directory made first: a first deployment proves before the host's metrics file is written.
    assert written['ensure_dir.sh'] == ['/var/lib/prometheus/node-exporter', '0755']
    assert check_metrics(text) == (0, '')
    got = samples(text)
    assert got['gpuhost_gpu_proof_ok{vmid="200"}'] == 1
    assert got['gpuhost_gpu_proof_allreduce_busbw_bytes_per_second{vmid="200",transport="SHM",bytes="134217728"}'] == \
        21.5e9
    sglang.proof_textfile(None, {'vmid': 200}, dict(out, ok=False, busbw=None, per_gpu=[
        {'bus_id': '0000:01:00.0', 'ok': True}, {'bus_id': '0000:11:00.0', 'ok': False}]))
    text = written['/var/lib/prometheus/node-exporter/gpuhost-gpu-proof.prom']
    assert check_metrics(text) == (0, '')
    got = samples(text)
    assert got['gpuhost_gpu_proof_ok{vmid="200"}'] == 0 and got['gpuhost_gpu_proof_gpu_ok{vmid="200",bus_id="0000:11:00.0"}'] == 0
    assert not any(k.startswith('gpuhost_gpu_proof_allreduce') for k in got)
    # With a floor (gpuhost:sglang.proof.min_busbw_gbps): the figure below it, both there for the alert.
    sglang.proof_textfile(None, {'vmid': 200, 'proof': {'min_busbw_gbps': 30}}, dict(out, ok=False))
    text = written['/var/lib/prometheus/node-exporter/gpuhost-gpu-proof.prom']
    assert check_metrics(text) == (0, '')
    got = samples(text)
    assert got['gpuhost_gpu_proof_allreduce_busbw_floor_bytes_per_second{vmid="200"}'] == 30e9 > \
        got['gpuhost_gpu_proof_allreduce_busbw_bytes_per_second{vmid="200",transport="SHM",bytes="134217728"}']
