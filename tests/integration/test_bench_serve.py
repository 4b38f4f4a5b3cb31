"""make bench-serve on the lab: AIPerf against the stack's endpoint (the simulated SGLang, API key on),
reporting what the server did; the tuner applying speculation variants through the Automation API, picking
the one the lab's speed model makes best, and always putting the declared config back - after a variant that
fails to start and after Ctrl-C alike.

What the benchmark reports is checked against what the server itself recorded for the same requests (the
simulated SGLang logs each request's X-Request-ID, first and last token time and token count; AIPerf records
the X-Request-ID of each request it measured), not against a wall-clock speed model: on a 2-core machine that
also runs AIPerf's workers, the server and the CLI, the rate the server achieves is not reproducible to a few
percent (issue 30: 1.13 req/s measured at concurrency 4 failed a 6% bound), but what AIPerf measured of it is.
The lab runs 3x faster than the model (LAB_SGLANG_SPEED=3) and the tool converts back."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.lablib import REPO

STACK = 'bench'
SPEED = 3
KEY = 'bench-test-key-0123456789abcdef'
SHORT = ['--input-tokens', '200', '--output-tokens', '300', '--requests', 'x2']
# The first test's setup makes AIPerf's virtualenv on a fresh clone (bench_venv: 2 min 10 s on an idle
# 2-core machine, allowed 900 s) before the lab and the first benchmark.
pytestmark = pytest.mark.timeout(1200)


@pytest.fixture(scope='module', autouse=True)
def bench_venv():
    """AIPerf's own virtualenv, as `make bench-serve` makes it (idempotent; a fresh clone installs it)."""
    res = subprocess.run([os.path.join(REPO, 'tools', 'bench-venv.sh')], capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, 'tools/bench-venv.sh failed:\n' + res.stderr[-3000:]


def bench(lab, tmp_path, *args, timeout=600):
    out = str(tmp_path / 'out')
    res = subprocess.run([sys.executable, '-m', 'tools.bench_serve', STACK, '--cwd', lab.project, '--out', out]
                         + SHORT + list(args), cwd=REPO, env=lab.env, capture_output=True, text=True, timeout=timeout)
    return res, out


def deploy(lab, speed_model=None, speed=SPEED):
    cfg = lab.stack_config()
    env = {'LAB_SGLANG_SPEED': str(speed)}
    if speed_model:
        env['LAB_SGLANG_SPEED_MODEL'] = json.dumps(speed_model)
    cfg['gpuhost:sglang']['environment'] = env
    lab.write_stack(STACK, cfg)
    # The key as an operator sets it: a secret (the test's own, on its command line).
    lab.pulumi('config', 'set', '--secret', '--path', 'gpuhost:sglang.api_key', KEY, stack=STACK)
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    with open(os.path.join(lab.project, 'Pulumi.%s.yaml' % STACK), 'rb') as f:
        return f.read()


def model(lab, settings, batch, params=None):
    """The lab's speed model (the copy installed in the container's virtualenv, run there) for resolved
    settings and a batch size."""
    code = ('import json, sys; from sglang.launch_server import speed_model as m; '
            'print(json.dumps(m(json.loads(sys.argv[1]), int(sys.argv[2]))))')
    argv = ['/opt/sglang/venv/bin/python', '-c', code, json.dumps(settings), str(batch)]
    if params:
        argv = ['env', 'LAB_SGLANG_SPEED_MODEL=' + json.dumps(params)] + argv
    return json.loads(lab.ct_exec(argv).stdout)


NEXTN = {'speculative_algorithm': 'EAGLE', 'speculative_num_steps': 1, 'speculative_num_draft_tokens': 2}


def assert_declared(lab, declared):
    with open(os.path.join(lab.project, 'Pulumi.%s.yaml' % STACK), 'rb') as f:
        assert f.read() == declared, 'the stack file is not the declared one'
    resolved = lab.outputs(STACK)['speculation']['resolved']
    assert resolved['speculative_num_steps'] == 1 and resolved['speculative_num_draft_tokens'] == 2, resolved
    lab.pulumi('preview', '--expect-no-changes', stack=STACK)


def no_key_anywhere(res, out):
    assert KEY not in res.stdout + res.stderr
    for dirpath, _, files in os.walk(out):
        for name in files:
            if name.endswith(('.json', '.jsonl', '.md', '.log', '.txt', '.csv')):
                with open(os.path.join(dirpath, name), errors='replace') as f:
                    assert KEY not in f.read(), os.path.join(dirpath, name)


def server_requests(lab):
    """What the simulated SGLang recorded of each chat completion it served, by X-Request-ID."""
    path = os.path.join(lab.ct_root(), 'var', 'log', 'lab-sglang', 'requests.jsonl')
    with open(path) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    return {r['request_id']: r for r in recs if r.get('request_id')}


def measured_ids(artifact_dir):
    """The X-Request-IDs of the requests AIPerf measured at one level (its per-record export; warm-up excluded)."""
    ids = []
    with open(os.path.join(artifact_dir, 'profile_export.jsonl')) as f:
        for line in f:
            if line.strip():
                meta = json.loads(line).get('metadata') or {}
                if meta.get('benchmark_phase') == 'profiling':
                    ids.append(meta.get('x_request_id'))
    return ids


def median(values):
    v = sorted(values)
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2.0


def test_the_benchmark_reports_what_the_server_did(lab, tmp_path):
    deploy(lab)
    res, out = bench(lab, tmp_path, '--concurrency', '1,4')
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    with open(os.path.join(out, 'results.json')) as f:
        result = json.load(f)
    assert result['simulated'] and result['time_scale'] == SPEED
    levels = result['runs']['declared']['levels']
    assert [lv['concurrency'] for lv in levels] == [1, 4]
    served = server_requests(lab)
    for lv in levels:
        ids = measured_ids(os.path.join(out, 'declared', 'c%d' % lv['concurrency']))
        assert len(ids) == lv['requests'] >= 8 and all(i in served for i in ids), (lv, ids[:3])
        reqs = [served[i] for i in ids]
        # One request's decode rate as the server produced it (AIPerf's per-user throughput: the tokens after
        # the first over the time from the first to the last), in the speed model's time like the report.
        server_rate = median((r['completion_tokens'] - 1) / (r['last_token'] - r['first_token']) for r in reqs) / SPEED
        err = lv['output_tok_s_per_request'] / server_rate - 1
        want = model(lab, NEXTN, lv['concurrency'])
        print('c=%d reported %.1f tok/s per request, the server did %.1f (%+.1f%%); accept length %.3f (model %.3f)'
              % (lv['concurrency'], lv['output_tok_s_per_request'], server_rate, 100 * err, lv['accept_length'],
                 want['accept_length']))
        # Client and server clocks see the same stream a few milliseconds apart; a report off by 2x fails.
        assert abs(err) < 0.1, (lv, server_rate)
        assert lv['output_tokens_mean'] == 300 == median(r['completion_tokens'] for r in reqs) and lv['errors'] == 0
        # At concurrency 4 the requests ran side by side on the server (one after another would be batch 1).
        assert max(r['max_batch'] for r in reqs) == lv['concurrency'], [r['max_batch'] for r in reqs]
        # The accept length from SGLang's counters: the speed model's mean yield per step (no clock in it).
        assert abs(lv['accept_length'] - want['accept_length']) < 0.05
        assert lv['ttft_ms']['p50'] <= lv['ttft_ms']['p99'] and lv['itl_ms']['p50'] > 0
    # Aggregate: the requests ran side by side (one after another would be about 1x). Not near 4x: with 8
    # requests the ramp and the last requests' tail weigh (CI measured 2.9x on a loaded machine).
    assert levels[1]['output_tok_s'] > 2 * levels[0]['output_tok_s'], (levels[0], levels[1])
    with open(os.path.join(out, 'results.md')) as f:
        md = f.read()
    assert 'SIMULATED' in md and '| 4 |' in md
    assert os.path.getsize(os.path.join(out, 'plot.png')) > 10000
    no_key_anywhere(res, out)


def test_a_variant_that_fails_to_start_is_reported_and_the_stack_restored(lab, tmp_path):
    declared = deploy(lab)
    fail = os.path.join(lab.ct_root(), 'etc', 'lab-sglang-fail.json')
    with open(fail, 'w') as f:
        json.dump({'speculative_num_steps': 3, 'message': 'RuntimeError: lab: out of memory for the draft model'}, f)
    try:
        res, out = bench(lab, tmp_path, '--variants', 'nextn3,off', '--concurrency', '1')
    finally:
        os.unlink(fail)
    text = res.stdout + res.stderr
    assert res.returncode == 1, text[-3000:]
    assert 'variant nextn3 FAILED' in text and 'sglang-qwen.service is not running in container 200' in text, text[-3000:]
    assert 'variant nextn3: the stack is back on its declared config' in text
    # The next variant still ran, from the declared config.
    with open(os.path.join(out, 'results.json')) as f:
        result = json.load(f)
    assert result['runs']['nextn3']['error'] and result['runs']['off']['levels']
    assert 'restored: Pulumi.%s.yaml is the declared config again' % STACK in text
    assert_declared(lab, declared)


def running_requests(lab):
    """sglang:num_running_reqs from the lab SGLang's /metrics (no key needed there, as in SGLang)."""
    try:
        with urllib.request.urlopen('http://%s:30000/metrics' % lab.spec['addresses']['container'], timeout=5) as r:
            text = r.read().decode()
    except OSError:  # restarting for the variant
        return 0
    name = 'sglang:num_running_reqs'
    return sum(float(line.rsplit(None, 1)[1]) for line in text.splitlines()
               if line.startswith((name + '{', name + ' ')))


def test_ctrl_c_during_a_variant_restores_the_declared_config(lab, tmp_path):
    declared = deploy(lab)
    out = str(tmp_path / 'out')
    p = subprocess.Popen([sys.executable, '-m', 'tools.bench_serve', STACK, '--cwd', lab.project, '--out', out,
                          '--variants', 'off', '--concurrency', '1', '--input-tokens', '100', '--output-tokens',
                          '5000', '--requests', '4'], cwd=REPO, env=lab.env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    seen = []
    deadline = time.time() + 120
    for line in p.stdout:
        seen.append(line)
        if 'variant off: serving' in line or time.time() > deadline:
            break
    # In the middle of the benchmark: one of AIPerf's requests being decoded.
    lab.wait_for(lambda: running_requests(lab) > 0, timeout=60, what='a benchmark request in flight')
    p.send_signal(signal.SIGINT)
    rest, _ = p.communicate(timeout=180)
    text = ''.join(seen) + rest
    assert p.returncode == 130, text[-3000:]
    assert 'SIGINT: stopping; the declared config will be restored' in text
    assert 'restored: Pulumi.%s.yaml is the declared config again' % STACK in text, text[-3000:]
    assert_declared(lab, declared)


# The tuner's test runs last: the tests above share one deployment (their deploy() is an up that changes
# nothing), this one deploys its own speed model.
# A steeper batch cost than the default: MTP wins clearly at concurrency 1 and loses clearly at 8.
STEEP = {'batch_cost': 0.1}
# At concurrency 8 without speculation the steep model streams ~520 tokens a second; 3x faster (1,550 a
# second through AIPerf and the simulated server) the 2-core machine could not keep up while other test
# modules run beside it (CI measured +10% for a model's -13.5%): this test runs the lab in real time.
TUNER_SPEED = 1


@pytest.mark.slow
def test_the_tuner_picks_the_variant_the_model_makes_best_and_restores_the_stack(lab, tmp_path):
    declared = deploy(lab, STEEP, speed=TUNER_SPEED)
    starts = lab.unit_starts()
    res, out = bench(lab, tmp_path, '--variants', 'off,nextn2', '--concurrency', '1,8', '--target-concurrency', '8')
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    with open(os.path.join(out, 'results.json')) as f:
        result = json.load(f)
    off, n2 = result['runs']['off']['levels'], result['runs']['nextn2']['levels']
    assert off[0]['accept_length'] is None and abs(n2[0]['accept_length'] - 2.44) < 0.05
    spec2 = dict(NEXTN, speculative_num_steps=2, speculative_num_draft_tokens=3)
    for c, i in ((1, 0), (8, 1)):
        want = model(lab, spec2, c, STEEP)['tok_s'] / model(lab, {}, c, STEEP)['tok_s'] - 1
        got = n2[i]['output_tok_s'] / off[i]['output_tok_s'] - 1
        print('c=%d gain of nextn2 over off: measured %+.1f%%, model %+.1f%%' % (c, 100 * got, 100 * want))
        assert abs(got - want) < 0.08
    assert result['recommendation']['variant'] == 'off' and result['recommendation']['concurrency'] == 8
    assert 'best at concurrency 8: off' in res.stdout and 'speculative: null' in res.stdout
    assert 'gain of nextn2 over off: c=1 +' in res.stdout
    # One restart per variant and one to restore.
    assert lab.unit_starts() == starts + 3
    assert_declared(lab, declared)
    no_key_anywhere(res, out)
