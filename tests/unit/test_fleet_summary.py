"""The fleet table at the end of `make up`, from the stack's outputs."""

from tools.fleet_summary import table


def host(active=True, reboot=False, steps=1, sha='ab' * 32, latency=80):
    return {'sglang_unit': {'active': active}, 'sglang_unit_sha256': sha, 'reboot_required': reboot,
            'speculation': {'resolved': {'speculative_algorithm': 'EAGLE', 'speculative_num_steps': steps}},
            'gpu_assignment': {'a': {'assigned_to': 'container'}, 'b': {'assigned_to': 'vm'}},
            'smoke_test': {'latency_ms': latency}}


def test_one_line_per_host_with_what_an_operator_checks_first():
    text = table({'hosts': {'gpu01': host(), 'gpu02': host(active=False, reboot=True, steps=2, latency=None)}})
    lines = text.splitlines()
    assert lines[0].split() == ['host', 'sglang', 'reboot', 'speculation', 'unit', 'sha256', 'GPUs', 'smoke', 'test']
    assert lines[2].split() == ['gpu01', 'active', 'no', 'EAGLE/1', 'abababababab', 'container:1', 'vm:1', '80', 'ms']
    assert lines[3].split() == ['gpu02', 'DOWN', 'yes', 'EAGLE/2', 'abababababab', 'container:1', 'vm:1', '-']


def test_a_one_host_stack_prints_its_line():
    out = dict(host(sha='cd' * 32), container={'address': '127.0.0.4'})
    assert table(out).splitlines()[2].split()[:5] == ['127.0.0.4', 'active', 'no', 'EAGLE/1', 'cdcdcdcdcdcd']


def test_the_canarys_last_judgement_follows_the_table_and_becomes_a_page(tmp_path, capsys, monkeypatch):
    import io
    import json
    from tools.fleet_summary import main
    verdict = {'host': 'gpu01', 'baseline': ['gpu02', 'gpu03'], 'state': 'fail', 'started': '2026-12-07T17:00:00Z',
               'at': '2026-12-07T17:20:00Z', 'unit_sha256': 'ef' * 32, 'deadline': 1,
               'line': 'inter-token latency, mean at load 4-100 running: canary 26.5 ms, baseline 15.7 ms',
               'then': 'the previous unit was put back and the rollout stopped',
               'table': 'band metric canary baseline\n4-100 inter-token latency, mean 26.5 ms 15.7 ms', 'rows': []}
    page = tmp_path / 'monitoring' / 'fleet' / 'canary.md'
    monkeypatch.setattr('sys.stdin', io.StringIO(json.dumps({'hosts': {'gpu01': host()}, 'canary': verdict})))
    assert main(['--stack', 'fleet', '--canary-page', str(page)]) == 0
    out = capsys.readouterr().out
    text = page.read_text()
    assert text.startswith('# The canary of stack fleet: fail\n\ninter-token latency, mean at load 4-100')
    assert '- host gpu01, judged against gpu02, gpu03 under their own traffic' in text
    assert ('- began 2026-12-07T17:00:00Z, verdict 2026-12-07T17:20:00Z; the previous unit was put back and the '
            'rollout stopped') in text
    assert '```\nband metric canary baseline\n4-100 inter-token latency, mean 26.5 ms 15.7 ms\n```' in text
    assert text.rstrip() in out and out.index('gpu01  active') < out.index('# The canary')


def test_no_canary_no_page(tmp_path, capsys, monkeypatch):
    import io
    import json
    from tools.fleet_summary import main
    page = tmp_path / 'canary.md'
    monkeypatch.setattr('sys.stdin', io.StringIO(json.dumps({'hosts': {'gpu01': host()}})))
    assert main(['--canary-page', str(page)]) == 0
    assert not page.exists() and '# The canary' not in capsys.readouterr().out
