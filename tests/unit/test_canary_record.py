"""The canary's judgement as its host keeps it (resources/sglang.py canary_files): the record an operator and
`refresh` read, and node_exporter's file the GpuhostCanaryUnresolved alert reads - judging while no verdict has ruled
(also after a Ctrl-C), a verdict after."""

import json
import shutil
import subprocess

import pytest

from resources.sglang import canary_files

RECORD = {'host': 'gpu01', 'baseline': ['gpu02', 'gpu03'], 'unit_sha256': 'ab' * 32, 'started': '2026-12-07T17:00:00Z',
          'deadline': 1796666400, 'changed': 1796662800, 'line': 'being judged', 'then': '', 'rows': [], 'table': ''}


def promtool_check(text):
    tool = shutil.which('promtool')
    if tool is None:
        pytest.fail('promtool is missing: apt-get install -y prometheus (.ci/run installs it)')
    res = subprocess.run([tool, 'check', 'metrics'], input=text, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def samples(prom):
    return sorted(l for l in prom.splitlines() if l and not l.startswith('#'))


@pytest.mark.parametrize('state', ['judging', 'interrupted'])
def test_a_judgement_without_a_verdict_is_flagged_with_its_deadline(state):
    text, prom = canary_files(dict(RECORD, state=state), 200)
    promtool_check(prom)
    assert samples(prom) == ['gpuhost_canary_deadline_timestamp_seconds{vmid="200"} 1796666400',
                             'gpuhost_canary_judging{vmid="200"} 1',
                             'gpuhost_canary_timestamp_seconds{vmid="200"} 1796662800']
    assert json.loads(text)['state'] == state


@pytest.mark.parametrize('state', ['pass', 'fail', 'inconclusive'])
def test_a_verdict_ends_the_flag_and_names_its_outcome(state):
    rows = [{'band': '4-100', 'metric': 'itl_mean', 'canary': 26.5, 'baseline': 15.7, 'n_canary': 8, 'n_baseline': 16,
             'p': 0.0011, 'effect': 0.69, 'result': 'fail'}]
    text, prom = canary_files(dict(RECORD, state=state, rows=rows, line='x'), 200)
    promtool_check(prom)
    assert 'gpuhost_canary_judging{vmid="200"} 0' in samples(prom)
    assert 'gpuhost_canary_verdict{vmid="200",outcome="%s"} 1' % state in samples(prom)
    assert json.loads(text)['rows'] == rows


# ------------------------------------------------------------------- baseline: restart

RESTART = {'host': 'gpu02', 'vmid': 200, 'unit_name': 'sglang-qwen.service', 'health_timeout': 5}
BASELINE_CONNECTION = {'host': '127.1.2.2', 'port': 22, 'user': 'root', 'private_key': 'not a key here',
                       'host_key': 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB4tDZv1+0bA0zVbQ2cZrmKa7Kz1tWQKqgJqYgP8u3Xd'}


def baseline_props(endpoint):
    return {'canary': {'host': 'gpu01', 'restart': dict(RESTART, endpoint=endpoint)},
            'baseline_connection': BASELINE_CONNECTION}


def test_the_baseline_restarts_on_its_own_connection_and_the_judgement_waits_until_it_serves(monkeypatch):
    import http.server
    import threading
    from resources import sglang
    calls = []
    monkeypatch.setattr(sglang.remote, 'run', lambda target, name, args=(), **kw: calls.append(
        (target.host, name, list(args))))

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == '/health' else 404)
            self.end_headers()

        def log_message(self, *args):
            pass
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        sglang.BaselineRestart(baseline_props('http://127.0.0.1:%d' % server.server_address[1])).wait()
    finally:
        server.shutdown()
    assert calls == [('127.1.2.2', 'ct_unit.sh', [200, 'sglang-qwen.service', 'yes'])]


def test_a_baseline_that_does_not_serve_again_ends_the_judgement_before_it_begins(monkeypatch):
    from resources import sglang
    from transport import remote

    def refused(target, name, args=(), **kw):
        raise remote.RemoteError('root@127.1.2.2:22: ct_unit.sh exited 1: Job for sglang-qwen.service failed')
    monkeypatch.setattr(sglang.remote, 'run', refused)
    with pytest.raises(sglang.ServiceError) as e:
        sglang.BaselineRestart(baseline_props('http://127.0.0.1:9')).wait()
    assert str(e.value).startswith('the canary\'s baseline gpu02 did not serve again after its restart at the '
                                   'canary\'s moment (')
    assert 'Job for sglang-qwen.service failed' in str(e.value) and 'no judgement without it' in str(e.value)
    assert 'not a key here' not in str(e.value)
