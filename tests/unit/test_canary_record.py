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
