"""The canary under traffic (gpuhost:rollout.canary; issue 60) on a three-host fleet lab with an open-loop load on
every host's SGLang (tests/canarylab.py): a speculation setting worse at that load is judged on the first host, rolled
back there by itself, and the rollout stopped - the other hosts never restarted, the error naming the metric and band;
a setting no worse at that load is judged, passes, and rolls on to every host; no traffic at all ends inconclusive and
puts the canary back; a Prometheus that cannot be read fails the judgement closed; a Ctrl-C during the judgement is
resolved by the next `up` (judged again, put back).

The lab's speed model makes a batch cost more (batch_cost 0.1, through gpuhost:sglang.environment) so that a light load
- about 8 running requests a host - is where MTP with three steps loses to MTP with one, and no speculation is within
the tolerance of it. Windows of 1 s, 8 per side and band: a judgement takes ~10 s here (real-size: 30 s, 50, an hour
at most)."""

import copy
import json
import os
import shutil
import threading

import pytest

from tests.canarylab import load
from tests.lablib import FleetLab, claim_net, keep_logs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
STACK = 'canary'
HOSTS = ('gpu01', 'gpu02', 'gpu03')
CANARY = {'window_s': 1, 'max_duration_s': 60, 'min_samples': 8, 'bands': [1, 4, 100], 'traffic_tolerance': 0.5}
RATE, TOKENS = 7.5, 64      # each host: about 8 requests running at once


@pytest.fixture(scope='module')
def fleet(tmp_path_factory, request):
    if os.geteuid() != 0:
        pytest.fail('the integration tests need root (mount namespaces for the simulated hosts)')
    base = str(tmp_path_factory.mktemp('canary'))
    claims = [claim_net() for _ in HOSTS]
    f = FleetLab(base, [net for net, _ in claims])
    failed = request.session.testsfailed
    try:
        for i in range(1, len(HOSTS) + 1):
            f.add(i)
        cfg = f.stack_config(list(HOSTS))
        cfg['gpuhost:sglang'] = dict(cfg['gpuhost:sglang'], environment={
            'LAB_SGLANG_SPEED_MODEL': '{"batch_cost": 0.1}'})
        cfg['gpuhost:rollout']['canary'] = dict(CANARY)
        f.write_stack(STACK, cfg)
        f.pulumi('up', '--yes', '--skip-preview', stack=STACK)     # from empty: nothing to judge yet
        yield f, cfg
    finally:
        if request.session.testsfailed > failed:
            keep_logs(base, 'test_canary')
        f.down()
        for _, lock in claims:
            lock.close()
        shutil.rmtree(base, ignore_errors=True)


def endpoints(f):
    return {n: 'http://%s:30000' % f.labs[n].spec['addresses']['container'] for n in HOSTS}


def up_under_load(f):
    stop = threading.Event()
    driver = threading.Thread(target=load, args=(endpoints(f), RATE, TOKENS, stop), daemon=True)
    driver.start()
    try:
        return f.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
    finally:
        stop.set()
        driver.join()


def with_speculation(cfg, spec):
    cfg = copy.deepcopy(cfg)
    cfg['gpuhost:sglang']['speculative'] = spec
    return cfg


def test_a_setting_worse_at_the_fleets_load_is_rolled_back_from_the_canary_and_stops_the_rollout(fleet):
    f, cfg = fleet
    worse = with_speculation(cfg, {'algorithm': 'NEXTN', 'num_steps': 3, 'eagle_topk': 1, 'num_draft_tokens': 4})
    f.write_stack(STACK, worse)
    pre = f.pulumi('preview', '--diff', stack=STACK)
    said = ' '.join((pre.stdout + pre.stderr).split())
    assert ('sglang-unit: gpu01 is the canary: `up` restarts it first, onto the new setting, and it is judged against '
            'gpu02, gpu03 under their own traffic (windows of 1 s, up to 60 s, from each host\'s /metrics') in said, said
    starts = {n: f.labs[n].unit_starts() for n in HOSTS}
    units = {n: f.labs[n].ct_exec(['cat', '/etc/systemd/system/sglang-qwen.service']).stdout for n in HOSTS}
    res = up_under_load(f)
    print(res.stdout + res.stderr)        # the judgement's windows and table (pytest shows them on a failure)
    out = ' '.join((res.stdout + res.stderr).split())
    assert res.returncode != 0, out[-3000:]
    assert 'the canary gpu01 failed its judgement: ' in out, out[-3000:]
    assert ' at load 4-100 running: canary ' in out and 'beyond the tolerance of 10%' in out, out[-3000:]
    assert 'rollout stopped at host gpu01 (its SGLang unit)' in out, out[-3000:]
    # The canary went back to its previous unit (restarted onto the new one, then onto the old): the others untouched.
    assert f.labs['gpu01'].unit_starts() == starts['gpu01'] + 2
    assert {n: f.labs[n].unit_starts() for n in HOSTS[1:]} == {n: starts[n] for n in HOSTS[1:]}
    assert {n: f.labs[n].ct_exec(['cat', '/etc/systemd/system/sglang-qwen.service']).stdout for n in HOSTS} == units
    # The canary's host keeps the verdict: node_exporter's file no longer flags a judgement under way, and `make up`'s
    # way in after the operator put the setting back (`up --refresh`: nothing to restart) reads the failed verdict -
    # which its own `up` could not keep - into the `canary` output, the table with it.
    assert canary_metrics(f) == {'judging': '0', 'verdict': 'fail'}
    f.write_stack(STACK, cfg)
    f.pulumi('up', '--yes', '--skip-preview', '--refresh', stack=STACK)
    assert f.labs['gpu01'].unit_starts() == starts['gpu01'] + 2
    verdict = json.loads(f.pulumi('stack', 'output', 'canary', '--json', stack=STACK).stdout)
    assert (verdict['state'], verdict['host'], verdict['baseline']) == ('fail', 'gpu01', ['gpu02', 'gpu03'])
    assert ' at load 4-100 running: canary ' in verdict['line'] and verdict['line'] in out, verdict
    assert verdict['then'] == 'the previous unit was put back and the rollout stopped', verdict
    assert {'band': '4-100', 'metric': 'itl_mean', 'result': 'fail'}.items() <= next(
        r for r in verdict['rows'] if r['metric'] == 'itl_mean').items(), verdict['rows']
    assert verdict['table'].splitlines()[0].split()[:3] == ['band', 'metric', 'canary'], verdict['table']


def canary_metrics(f) -> dict:
    """What node_exporter reads of the canary on its host: {'judging': '0'|'1', 'verdict': outcome or None}."""
    text = f.labs['gpu01'].ssh('cat /var/lib/prometheus/node-exporter/gpuhost-canary.prom').stdout
    seen = {'verdict': None}
    for line in text.splitlines():
        if line.startswith('gpuhost_canary_judging{'):
            seen['judging'] = line.split()[-1]
        elif line.startswith('gpuhost_canary_verdict{'):
            seen['verdict'] = line.split('outcome="', 1)[1].split('"', 1)[0]
    return seen


def test_a_setting_no_worse_at_the_fleets_load_passes_the_canary_and_rolls_on_to_every_host(fleet):
    """With baseline: restart (Kayenta's advice: both start at the same moment, with the same warm-up): gpu02 restarts
    onto its own setting as gpu01 restarts onto the new one, and is the baseline alone."""
    f, cfg = fleet
    plain = with_speculation(cfg, None)
    plain['gpuhost:rollout'] = dict(plain['gpuhost:rollout'], max_unavailable=2,
                                    canary=dict(CANARY, baseline='restart'))
    f.write_stack(STACK, plain)
    starts = {n: f.labs[n].unit_starts() for n in HOSTS}
    res = up_under_load(f)
    print(res.stdout + res.stderr)        # the judgement's windows and table (pytest shows them on a failure)
    out = ' '.join((res.stdout + res.stderr).split())
    assert res.returncode == 0, out[-3000:]
    assert ('gpu01 is the canary: judged against gpu02, restarted onto its own setting at the same moment (baseline: '
            'restart), under its own traffic') in out, out[-3000:]
    assert 'the canary\'s baseline gpu02 restarts sglang-qwen.service onto its own setting' in out, out[-3000:]
    assert 'sglang-unit: the canary gpu01 passed: no metric worse beyond the tolerance in load 4-100' in out, out[-3000:]
    # gpu02: restarted as the baseline, then onto the new setting by the rollout; the others once.
    assert {n: f.labs[n].unit_starts() - starts[n] for n in HOSTS} == {'gpu01': 1, 'gpu02': 2, 'gpu03': 1}
    for n in HOSTS:
        unit = f.labs[n].ct_exec(['cat', '/etc/systemd/system/sglang-qwen.service']).stdout
        assert '--speculative-algorithm' not in unit, (n, unit)
    verdict = json.loads(f.pulumi('stack', 'output', 'canary', '--json', stack=STACK).stdout)
    assert (verdict['state'], verdict['then'], verdict['baseline']) == ('pass', 'the rollout went on', ['gpu02']), verdict
    assert canary_metrics(f) == {'judging': '0', 'verdict': 'pass'}


def test_too_little_traffic_ends_inconclusive_and_puts_the_canary_back(fleet):
    """No load at all: every window idle; at max_duration_s the verdict is inconclusive and, with the default
    inconclusive: rollback, the canary goes back - never a pass for want of data."""
    f, cfg = fleet
    quiet = with_speculation(cfg, {'algorithm': 'NEXTN', 'num_steps': 2, 'eagle_topk': 1, 'num_draft_tokens': 3})
    quiet['gpuhost:rollout']['canary'] = dict(CANARY, max_duration_s=10)
    f.write_stack(STACK, quiet)
    starts = {n: f.labs[n].unit_starts() for n in HOSTS}
    res = f.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
    out = ' '.join((res.stdout + res.stderr).split())
    assert res.returncode != 0, out[-3000:]
    assert ('the canary gpu01 had too little comparable traffic for a verdict (gpuhost:rollout.canary.inconclusive: '
            'rollback): too little comparable traffic within the judgement\'s time: no window with traffic in any band '
            '(') in out, out[-3000:]
    assert f.labs['gpu01'].unit_starts() == starts['gpu01'] + 2
    assert {n: f.labs[n].unit_starts() for n in HOSTS[1:]} == {n: starts[n] for n in HOSTS[1:]}
    f.write_stack(STACK, cfg)


def test_a_prometheus_that_cannot_be_read_fails_the_judgement_closed(fleet):
    f, cfg = fleet
    blind = with_speculation(cfg, {'algorithm': 'NEXTN', 'num_steps': 2, 'eagle_topk': 1, 'num_draft_tokens': 3})
    blind['gpuhost:rollout']['canary'] = dict(CANARY, prometheus='http://127.0.0.1:9')    # nothing listens there
    f.write_stack(STACK, blind)
    starts = {n: f.labs[n].unit_starts() for n in HOSTS}
    res = up_under_load(f)
    out = ' '.join((res.stdout + res.stderr).split())
    assert res.returncode != 0, out[-3000:]
    assert 'the canary gpu01 failed its judgement: ' in out and 'http://127.0.0.1:9' in out, out[-3000:]
    assert '- the judgement fails closed' in out, out[-3000:]
    assert f.labs['gpu01'].unit_starts() == starts['gpu01'] + 2
    assert {n: f.labs[n].unit_starts() for n in HOSTS[1:]} == {n: starts[n] for n in HOSTS[1:]}
    f.write_stack(STACK, cfg)


def test_a_ctrl_c_during_the_judgement_is_resolved_by_the_next_up(fleet):
    """The operator's Ctrl-C while the canary is judged: `up` ends in one line (the canary runs the new setting,
    unconfirmed); the next `up` restarts it, judges it again under the traffic, and - the setting being worse -
    puts the previous unit back: never left half-way, never passed for want of a verdict."""
    import signal
    import subprocess
    import time
    f, cfg = fleet
    worse = with_speculation(cfg, {'algorithm': 'NEXTN', 'num_steps': 3, 'eagle_topk': 1, 'num_draft_tokens': 4})
    f.write_stack(STACK, worse)
    starts = {n: f.labs[n].unit_starts() for n in HOSTS}
    stop = threading.Event()
    driver = threading.Thread(target=load, args=(endpoints(f), RATE, TOKENS, stop), daemon=True)
    driver.start()
    try:
        proc = subprocess.Popen(['pulumi', 'up', '--yes', '--skip-preview', '--stack', STACK], cwd=f.project,
                                env=f.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        seen, deadline = [], time.time() + 300
        for line in proc.stdout:
            seen.append(line)
            if 'canary gpu01: collecting:' in line:
                os.killpg(proc.pid, signal.SIGINT)      # the terminal's Ctrl-C: the whole foreground group
                break
            assert time.time() < deadline, ''.join(seen)[-3000:]
        rest, _ = proc.communicate(timeout=120)
        out = ' '.join((''.join(seen) + rest).split())
        assert proc.returncode != 0 and 'Traceback' not in out, out[-3000:]
        assert ('the canary gpu01\'s judgement was interrupted (Ctrl-C) before a verdict; it runs the new setting, '
                'unconfirmed - the next `pulumi up` restarts it and judges it again') in out, out[-3000:]
        assert {n: f.labs[n].unit_starts() for n in HOSTS[1:]} == {n: starts[n] for n in HOSTS[1:]}
        # Left without a verdict: its host says so (the GpuhostCanaryUnresolved alert's series), and why.
        assert canary_metrics(f) == {'judging': '1', 'verdict': None}
        record = json.loads(f.labs['gpu01'].ssh('cat /var/lib/gpuhost/canary.json').stdout)
        assert record['state'] in ('judging', 'interrupted') and record['baseline'] == ['gpu02', 'gpu03'], record
        again = f.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
    finally:
        stop.set()
        driver.join()
    out = ' '.join((again.stdout + again.stderr).split())
    assert again.returncode != 0 and 'the canary gpu01 failed its judgement: ' in out, out[-3000:]
    # Onto the new setting (the interrupted run), again (this run), and back: the others never.
    assert f.labs['gpu01'].unit_starts() == starts['gpu01'] + 3
    assert {n: f.labs[n].unit_starts() for n in HOSTS[1:]} == {n: starts[n] for n in HOSTS[1:]}
    unit = f.labs['gpu01'].ct_exec(['cat', '/etc/systemd/system/sglang-qwen.service']).stdout
    assert '--speculative-num-steps 3' not in unit, unit
    assert canary_metrics(f) == {'judging': '0', 'verdict': 'fail'}
    f.write_stack(STACK, cfg)
