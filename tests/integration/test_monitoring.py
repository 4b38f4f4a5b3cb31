"""Monitoring end to end on the lab: the stack deployed, its prometheus_file_sd output written to a file
as docs/monitoring.md says, Debian's node_exporter reading the host's textfile directory (inside the simulated
host, on the host's address), a real Prometheus (Debian's) scraping both with the rules `make
monitoring` renders; chat completions served; then Prometheus' HTTP API: targets up with their labels,
SGLang's metrics moving, gpuhost_* present, rules evaluated, every dashboard query answered, and an
alert firing when SGLang resolves other speculation than the unit asks for (the lab's override knob)."""

import json
import os
import subprocess
import urllib.request

import pytest

from tests.integration import promlab
from tests.integration.promlab import wait
from tools import monitoring as tool

STACK = 'mon'
HOST_SEL = '{id="node/pve-lab", node="pve-lab"}'
SGLANG_SEL = '{id="lxc/200", node="pve-lab"}'
MTP_OFF = {'speculative_algorithm': None, 'speculative_num_steps': None, 'speculative_eagle_topk': None,
           'speculative_num_draft_tokens': None}


def served(base, name):
    """A counter summed over its series, from SGLang's own /metrics (base: the OpenAI base URL, .../v1)."""
    with urllib.request.urlopen(base.rsplit('/v1', 1)[0] + '/metrics', timeout=10) as r:
        text = r.read().decode()
    # A sample line is `name{labels} value` or `name value`; the value is its last field.
    return sum(float(line.rsplit(None, 1)[1]) for line in text.splitlines()
               if line.startswith((name + '{', name + ' ')))


def chat(base, n, stream=False, max_tokens=24):
    for i in range(n):
        body = {'model': 'qwen3.5-122b-a10b', 'max_tokens': max_tokens, 'stream': stream,
                'messages': [{'role': 'system', 'content': 'You are the lab.'},
                             {'role': 'user', 'content': 'Question %d?' % i}]}
        req = urllib.request.Request(base + '/chat/completions', data=json.dumps(body).encode(),
                                     headers={'Content-Type': 'application/json'})
        with urllib.request.urlopen(req, timeout=30) as r:
            text = r.read().decode()
        if stream:
            assert text.endswith('data: [DONE]\n\n')
        else:
            assert json.loads(text)['usage']['completion_tokens'] == max_tokens


@pytest.fixture(scope='module')
def env(lab, tmp_path_factory):
    """The stack deployed (gpuhost.prom's directory absent before: the program creates it; the collector it
    installs runs on its timer, which the host's systemd fires), node_exporter and Prometheus running
    (promlab.py). Yields the pieces; stops them."""
    tmp = tmp_path_factory.mktemp('monitoring')
    assert lab.on_host('rm -rf /var/lib/prometheus/node-exporter').exit_code == 0
    lab.write_stack(STACK, lab.stack_config())
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    base = lab.outputs(STACK)['openai_base_url']
    # SGLang as a server that has served both kinds of request before Prometheus looks (the smoke test sent a
    # non-streaming one): rate() cannot count the first value of a series born inside its window, so for five
    # minutes after a server's first streaming request (is_streaming="true" is a new series) the accept length
    # from the counters reads low - pending, never firing (for: 30m), but this module checks nothing is pending.
    chat(base, 1, stream=True)
    with promlab.monitoring(lab, STACK, tmp) as (prom, d):
        yield {'prom': prom, 'tmp': tmp, 'deployment': d, 'base': base}


def test_file_sd_output_and_the_textfile_on_the_host(lab, env):
    ip, host = lab.spec['addresses']['container'], lab.spec['addresses']['ssh']
    assert json.loads((env['tmp'] / 'targets.json').read_text()) == [
        {'targets': ['%s:30000' % ip], 'labels': {'id': 'lxc/200', 'node': 'pve-lab'}},
        {'targets': ['%s:9100' % host], 'labels': {'id': 'node/pve-lab', 'node': 'pve-lab'}}]
    res = lab.on_host('stat -c %a /var/lib/prometheus/node-exporter /var/lib/prometheus/node-exporter/gpuhost.prom '
                      '&& cat /var/lib/prometheus/node-exporter/gpuhost.prom')
    assert res.exit_code == 0, res.stderr
    modes, text = res.stdout.split('\n', 2)[:2], res.stdout.split('\n', 2)[2]
    assert modes == ['755', '644']
    check = subprocess.run(['promtool', 'check', 'metrics'], input=text, capture_output=True, text=True)
    assert check.returncode == 0 and check.stdout + check.stderr == '', check.stdout + check.stderr
    assert 'gpuhost_sglang_speculation_match 1\n' in text
    # The host's own state is the collector's (installed by the same up, which ran it once to check it).
    live = lab.on_host('cat /var/lib/prometheus/node-exporter/gpuhost-collector.prom').stdout
    assert 'gpuhost_reboot_required 1\n' in live  # the lab's first up: the new command line is not running yet
    assert 'gpuhost_reboot_reasons{kind="kernel_cmdline_missing"} 1\n' in live
    assert 'gpuhost_reboot_required' not in text


def test_second_up_changes_nothing_and_leaves_the_textfile_alone(lab, env):
    stat = 'stat -c %Y.%i /var/lib/prometheus/node-exporter/gpuhost.prom'
    before = lab.on_host(stat).stdout
    lab.pulumi('preview', '--expect-no-changes', stack=STACK)
    lab.pulumi('up', '--yes', '--expect-no-changes', stack=STACK)
    assert lab.on_host(stat).stdout == before


def test_prometheus_scrapes_both_targets_with_their_labels(lab, env):
    prom = env['prom']

    def up():
        active = prom.api('targets', state='active')['activeTargets']
        return active if len(active) == 2 and all(t['health'] == 'up' for t in active) else None
    active = wait(up, 60, 'both targets up')
    labels = sorted((t['labels'] for t in active), key=lambda x: x['id'])
    assert labels == [
        {'id': 'lxc/200', 'node': 'pve-lab', 'instance': '%s:30000' % lab.spec['addresses']['container'],
         'job': 'gpuhost'},
        {'id': 'node/pve-lab', 'node': 'pve-lab', 'instance': '%s:9100' % lab.spec['addresses']['ssh'],
         'job': 'gpuhost'}]
    # The textfile through node_exporter, with the target's labels.
    wait(lambda: prom.value('gpuhost_reboot_required%s' % HOST_SEL) == 1, 30, 'gpuhost_reboot_required')
    gpus = prom.query('gpuhost_gpu_info%s' % HOST_SEL)
    assert len(gpus) == 8
    by_bus = {g['metric']['pci_bus_id']: g['metric'] for g in gpus}
    assert by_bus['0000:e1:00.0']['gpu'] == '00000000:E1:00.0'
    assert (by_bus['0000:e1:00.0']['assigned_to'], by_bus['0000:e1:00.0']['driver']) == ('vm', 'vfio-pci')
    assert (by_bus['0000:01:00.0']['assigned_to'], by_bus['0000:01:00.0']['driver']) == ('container', 'nvidia')
    assert {g['iommu_group_type'] for g in by_bus.values()} == {'DMA-FQ'}
    assert prom.value('node_textfile_scrape_error%s' % HOST_SEL) == 0


def test_sglang_metrics_move_and_rules_evaluate(lab, env):
    prom = env['prom']
    wait(lambda: prom.value('sglang:num_running_reqs%s' % SGLANG_SEL) is not None, 30, 'SGLang scraped')
    gen = 'sum(sglang:generation_tokens_total%s)' % SGLANG_SEL
    reqs = 'sum(sglang:num_requests_total%s)' % SGLANG_SEL
    # Counted from what SGLang has served so far (the program's own smoke test may have sent a request),
    # once Prometheus has scraped that much.
    gen0 = served(env['base'], 'sglang:generation_tokens_total')
    reqs0 = served(env['base'], 'sglang:num_requests_total')
    wait(lambda: (prom.value(gen) or 0, prom.value(reqs) or 0) == (gen0, reqs0), 30, 'Prometheus at SGLang\'s counts')
    chat(env['base'], 3)
    chat(env['base'], 2, stream=True)
    wait(lambda: prom.value(gen) == gen0 + 5 * 24, 30, 'generation tokens counted')
    assert prom.value(reqs) == reqs0 + 5
    assert prom.value('max(sglang:spec_accept_length%s)' % SGLANG_SEL) == 1.8
    assert prom.value('max(sglang:spec_num_steps%s)' % SGLANG_SEL) == 1
    # A second burst: the counters move and the recording rule sees a rate.
    chat(env['base'], 2)
    wait(lambda: prom.value(gen) == gen0 + 7 * 24, 30, 'more generation tokens counted')
    wait(lambda: (prom.value('node_id:sglang_generation_tokens:rate5m%s' % SGLANG_SEL) or 0) > 0, 30,
         'the recording rule')
    ttft = prom.value('histogram_quantile(0.5, sum by (le) (rate(sglang:time_to_first_token_seconds_bucket%s[1m])))'
                      % SGLANG_SEL)
    assert ttft is not None and 0 < ttft <= 0.1
    groups = prom.api('rules')['groups']
    assert sorted(g['name'] for g in groups) == ['gpuhost-%s-alerts' % STACK, 'gpuhost-%s-recording' % STACK]
    assert all(r['health'] == 'ok' for g in groups for r in g['rules']), [
        (r['name'], r.get('lastError')) for g in groups for r in g['rules'] if r['health'] != 'ok']
    # The lab needs a reboot after its first up: pending (it fires after a day); nothing else is wrong.
    # The accept length from the counters: each 24-token request's 23 tokens after the first (prefill's) in 13
    # verify steps of the lab's 1.8 accepted tokens per step (1, 2, 2, 2, 2, ...) - 23 / 13 = 1.77.
    wait(lambda: abs((prom.value('node_id:sglang_spec_accept_length:rate5m%s' % SGLANG_SEL) or 0) - 23 / 13.0) < 0.01,
         30, 'the accept length from the counters')
    # The lab needs a reboot after its first up: pending (it fires after a day); nothing else is wrong (once the
    # alert rules have evaluated the last scrape: mid-request, verify steps count before the request's tokens do).
    wait(lambda: 'GpuhostRebootRequired' in prom.alerts('pending'), 30, 'GpuhostRebootRequired pending')
    wait(lambda: prom.alerts() == {'GpuhostRebootRequired'}, 10, 'no other alert pending or firing')


def test_every_dashboard_query_answers(lab, env):
    prom, d = env['prom'], env['deployment']
    dash = tool.dashboard(STACK, d)
    empty = []
    for p in dash['panels']:
        for t in p['targets']:
            if not prom.query(tool.concrete(t['expr'], d)):
                empty.append((p['title'], t['expr']))
    # After traffic, with MTP on and the lab needing its first reboot, every panel has data.
    assert empty == []
    for v in dash['templating']['list']:
        selector = v['query'][len('label_values('):].rsplit(',', 1)[0]
        label = v['query'].rsplit(',', 1)[1].strip(' )')
        values = {r['metric'][label] for r in prom.query(tool.concrete(selector, d))}
        assert values == {v['current']['value']}


def test_sglang_resolving_mtp_off_fires_the_mismatch_alert(lab, env):
    prom = env['prom']
    override = os.path.join(lab.ct_root(), 'etc/lab-sglang-override.json')
    with open(override, 'w') as f:
        json.dump(MTP_OFF, f)
    try:
        # SGLang restarted out of band and silently without MTP; `make up` (pulumi up --refresh) records it.
        assert lab.ssh('pct exec 200 -- systemctl restart sglang-qwen.service').exit_code == 0
        wait(lambda: urllib.request.urlopen(env['base'][:-3] + '/health', timeout=2).status == 200, 30, 'health')
        lab.pulumi('up', '--yes', '--skip-preview', '--refresh', stack=STACK)
        out = lab.outputs(STACK)
        assert out['speculation']['resolved'].get('speculative_algorithm') is None
        wait(lambda: prom.value('gpuhost_sglang_speculation_match%s' % HOST_SEL) == 0, 30, 'match 0 scraped')
        wait(lambda: 'GpuhostSglangSpeculationMismatch' in prom.alerts('firing'), 30, 'the mismatch alert firing')
        alert = [a for a in prom.api('alerts')['alerts'] if a['labels']['alertname'] ==
                 'GpuhostSglangSpeculationMismatch'][0]
        assert 'Requested NEXTN steps 1 topk 1 draft 2, resolved none steps 0' in alert['annotations']['description']
        # Traffic without accepted drafts: the live rule on SGLang's own metrics goes pending (fires after 10 min).
        chat(env['base'], 3)
        wait(lambda: 'GpuhostSglangSpeculationInactive' in prom.alerts('pending'), 30,
             'GpuhostSglangSpeculationInactive pending')
        assert prom.value('max(sglang:spec_accept_length%s)' % SGLANG_SEL) == 0
    finally:
        os.unlink(override)
    assert lab.ssh('pct exec 200 -- systemctl restart sglang-qwen.service').exit_code == 0
    wait(lambda: urllib.request.urlopen(env['base'][:-3] + '/health', timeout=2).status == 200, 30, 'health')
    lab.pulumi('up', '--yes', '--skip-preview', '--refresh', stack=STACK)
    wait(lambda: prom.value('gpuhost_sglang_speculation_match%s' % HOST_SEL) == 1, 30, 'match 1 scraped')
    wait(lambda: 'GpuhostSglangSpeculationMismatch' not in prom.alerts(), 30, 'the mismatch alert resolved')
    lab.pulumi('up', '--yes', '--expect-no-changes', stack=STACK)
