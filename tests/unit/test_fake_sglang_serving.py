"""The lab's simulated SGLang as a server: OpenAI chat completions (plain and streamed), and /metrics
with the families, types and labels of the real release (SGLang's metrics collector, read from the
wheels tools/sglang_flags_gen.py caches), moving as requests are served. Run with the system
python3, stdlib only, as inside a lab container."""

import json
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from tests import fakesglang

# 0.5.23's families the lab serves: name -> (type, label names of its samples).
SCHED = ['model_name', 'engine_type', 'tp_rank', 'pp_rank', 'moe_ep_rank']
TOK = ['model_name', 'engine_type']
FAMILIES_0523 = {
    'sglang:num_running_reqs': ('gauge', SCHED), 'sglang:num_queue_reqs': ('gauge', SCHED),
    'sglang:num_grammar_queue_reqs': ('gauge', SCHED), 'sglang:gen_throughput': ('gauge', SCHED),
    'sglang:cache_hit_rate': ('gauge', SCHED), 'sglang:token_usage': ('gauge', SCHED),
    'sglang:num_used_tokens': ('gauge', SCHED), 'sglang:spec_accept_length': ('gauge', SCHED),
    'sglang:spec_accept_rate': ('gauge', SCHED), 'sglang:spec_num_steps': ('gauge', SCHED),
    'sglang:spec_num_draft_tokens': ('gauge', SCHED),
    'sglang:prompt_tokens_total': ('counter', TOK + ['is_streaming']),
    'sglang:generation_tokens_total': ('counter', TOK + ['is_streaming']),
    'sglang:num_requests_total': ('counter', TOK + ['is_streaming']),
    'sglang:spec_verify_calls_total': ('counter', TOK),
    'sglang:cached_tokens_total': ('counter', TOK + ['cache_source']),
    'sglang:time_to_first_token_seconds': ('histogram', TOK + ['is_streaming']),
    'sglang:inter_token_latency_seconds': ('histogram', TOK),
    'sglang:request_time_per_output_token_seconds': ('histogram', TOK + ['is_streaming']),
    'sglang:e2e_request_latency_seconds': ('histogram', TOK + ['is_streaming']),
}
ARGS = ['--model-path', '/models/Qwen3.5-122B-A10B', '--served-model-name', 'qwen3.5-122b-a10b', '--tp-size', '4',
        '--enable-metrics']
MTP = ['--speculative-algorithm', 'NEXTN', '--speculative-num-steps', '1', '--speculative-eagle-topk', '1',
       '--speculative-num-draft-tokens', '2']


def free_port():
    s = socket.socket()
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def serve(tmp_path):
    procs = []

    def start(version='0.5.23', extra=(), speed='1', env=None):
        pkg = tmp_path / version / 'sglang'
        if not pkg.exists():
            fakesglang.install(pkg.parent, version)
        port = free_port()
        root = tmp_path / 'container'
        gpu = fakesglang.sysroot(root) if not root.exists() else {'LAB_SGLANG_SYSROOT': str(root),
                                                                  'CUDA_HOME': '/usr/local/cuda-13.0'}
        p = subprocess.Popen(['/usr/bin/python3', '-m', 'sglang.launch_server'] + ARGS + list(extra) +
                             ['--host', '127.0.0.1', '--port', str(port)], cwd=str(tmp_path),
                             env=dict({'PYTHONPATH': str(pkg.parent), 'PATH': '/usr/bin:/bin',
                                       'LAB_SGLANG_STARTUP': '0', 'LAB_SGLANG_SPEED': speed}, **gpu, **(env or {})),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(p)
        base = 'http://127.0.0.1:%d' % port
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                urllib.request.urlopen(base + '/health', timeout=2).close()
                return base
            except urllib.error.HTTPError:  # answering, still loading
                return base
            except OSError:
                time.sleep(0.05)
        raise AssertionError('the fake SGLang did not start')
    yield start
    for p in procs:
        p.terminate()
        p.wait(10)


def post(base, body, stream=False):
    req = urllib.request.Request(base + '/v1/chat/completions', data=json.dumps(body).encode(),
                                 headers={'Content-Type': 'application/json'})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200
        if not stream:
            return json.loads(r.read())
        assert r.headers['Content-Type'] == 'text/event-stream'
        return r.read().decode()


def get(base, path):
    with urllib.request.urlopen(base + path, timeout=10) as r:
        return r.read().decode()


def parse_metrics(text):
    """{family: {'type': ..., 'help': ..., 'samples': {(name, ((label, value), ...)): value}}}."""
    fams, current = {}, None
    for line in text.splitlines():
        m = re.match(r'# (HELP|TYPE) (\S+) (.*)', line)
        if m:
            current = fams.setdefault(m.group(2), {'samples': {}})
            current[m.group(1).lower()] = m.group(3)
            continue
        name, labels, value = re.match(r'([^{ ]+)(?:\{(.*)\})? (\S+)$', line).groups()
        pairs = tuple(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels or ''))
        current['samples'][(name, pairs)] = float(value)
    return fams


def total(fam, suffix=''):
    return sum(v for (n, _), v in fam['samples'].items() if n.endswith(suffix))


MESSAGES = [{'role': 'system', 'content': 'You are terse.'}, {'role': 'user', 'content': 'Say something.'}]


def test_chat_completions_plain_and_streamed(serve):
    base = serve(extra=MTP)
    r = post(base, {'model': 'qwen3.5-122b-a10b', 'messages': MESSAGES, 'max_tokens': 12})
    assert r['object'] == 'chat.completion' and r['model'] == 'qwen3.5-122b-a10b'
    choice = r['choices'][0]
    assert choice['finish_reason'] == 'length' and choice['message']['role'] == 'assistant'
    assert r['usage']['completion_tokens'] == 12 and r['usage']['prompt_tokens'] > 0
    assert r['usage']['total_tokens'] == r['usage']['prompt_tokens'] + 12
    # Without max_tokens the answer ends by itself; ignore_eos makes it exactly max_tokens (benchmarks).
    r = post(base, {'model': 'x', 'messages': MESSAGES})
    assert r['choices'][0]['finish_reason'] == 'stop' and r['usage']['completion_tokens'] == 64
    r = post(base, {'model': 'x', 'messages': MESSAGES, 'max_tokens': 100, 'ignore_eos': True})
    assert r['usage']['completion_tokens'] == 100

    text = post(base, {'model': 'x', 'messages': MESSAGES, 'max_tokens': 9, 'stream': True,
                       'stream_options': {'include_usage': True}}, stream=True)
    events = [e for e in text.split('\n\n') if e]
    assert all(e.startswith('data: ') for e in events) and events[-1] == 'data: [DONE]'
    chunks = [json.loads(e[len('data: '):]) for e in events[:-1]]
    assert {c['object'] for c in chunks} == {'chat.completion.chunk'} and len({c['id'] for c in chunks}) == 1
    assert chunks[0]['choices'][0]['delta']['role'] == 'assistant'
    deltas = [c['choices'][0]['delta'].get('content', '') for c in chunks if c['choices']]
    assert ''.join(deltas) == post(base, {'model': 'x', 'messages': MESSAGES, 'max_tokens': 9})['choices'][0][
        'message']['content']
    assert chunks[-2]['choices'][0]['finish_reason'] == 'length'
    # With MTP a step yields 1 or 2 tokens: fewer content chunks than tokens.
    assert len([d for d in deltas if d]) < 9
    assert chunks[-1]['choices'] == [] and chunks[-1]['usage']['completion_tokens'] == 9
    # Without include_usage: no usage chunk.
    text = post(base, {'model': 'x', 'messages': MESSAGES, 'max_tokens': 3, 'stream': True}, stream=True)
    assert all(json.loads(e[6:])['choices'] for e in text.split('\n\n') if e and e != 'data: [DONE]')

    with pytest.raises(urllib.error.HTTPError) as e:
        post(base, {'model': 'x', 'messages': []})
    assert e.value.code == 400 and json.loads(e.value.read())['object'] == 'error'


def test_metrics_are_the_release_families_and_move_with_traffic(serve):
    base = serve(extra=MTP)
    fams = parse_metrics(get(base, '/metrics'))
    # Before any request: the scheduler's gauges only (prometheus_client shows no family without samples).
    assert set(fams) == {n for n, (t, _) in FAMILIES_0523.items() if t == 'gauge'}
    assert total(fams['sglang:spec_accept_length']) == 0
    assert 'avg_spec_accept_length' not in json.loads(get(base, '/server_info'))['internal_states'][0]

    post(base, {'model': 'x', 'messages': MESSAGES, 'max_tokens': 20})
    post(base, {'model': 'x', 'messages': MESSAGES, 'max_tokens': 10, 'stream': True}, stream=True)
    text = get(base, '/metrics')
    fams = parse_metrics(text)
    assert set(fams) == set(FAMILIES_0523)
    for name, (kind, labels) in FAMILIES_0523.items():
        assert fams[name]['type'] == kind and fams[name]['help'] == 'Multiprocess metric', name
        for (sample, pairs) in fams[name]['samples']:
            assert [k for k, _ in pairs if k != 'le'] == labels, (sample, pairs)
    gen = fams['sglang:generation_tokens_total']['samples']
    streaming = {dict(p)['is_streaming']: v for (_, p), v in gen.items()}
    assert streaming == {'false': 20.0, 'true': 10.0}
    assert total(fams['sglang:num_requests_total']) == 2
    ttft = fams['sglang:time_to_first_token_seconds']
    assert total(ttft, '_count') == 2
    assert [dict(p)['le'] for (n, p) in ttft['samples'] if n.endswith('_bucket')][:3] == ['0.1', '0.2', '0.4']
    itl = fams['sglang:inter_token_latency_seconds']
    assert total(itl, '_count') == 28, 'one observation per token after the first'
    assert total(fams['sglang:spec_accept_length']) == 1.8 and total(fams['sglang:spec_accept_rate']) == 0.8
    assert total(fams['sglang:spec_num_steps']) == 1 and total(fams['sglang:spec_num_draft_tokens']) == 2
    assert total(fams['sglang:gen_throughput']) > 0
    assert json.loads(get(base, '/server_info'))['internal_states'][0]['avg_spec_accept_length'] == 1.8
    # The second request found the first one's system prompt in the prefix cache.
    assert total(fams['sglang:cache_hit_rate']) > 0
    assert [dict(p).get('cache_source') for (_, p) in fams['sglang:cached_tokens_total']['samples']] == ['device']
    # Prometheus' own parser accepts it (its linter only objects to the ':' SGLang's names have).
    res = subprocess.run(['promtool', 'check', 'metrics'], input=text, capture_output=True, text=True)
    problems = [ln for ln in (res.stdout + res.stderr).splitlines() if "metric names should not contain ':'" not in ln]
    assert res.returncode in (0, 3) and problems == []


def test_older_release_serves_its_own_families_and_labels(serve):
    base = serve('0.5.9', extra=MTP)
    post(base, {'model': 'x', 'messages': MESSAGES, 'max_tokens': 4, 'stream': True}, stream=True)
    fams = parse_metrics(get(base, '/metrics'))
    assert 'sglang:spec_num_steps' not in fams and 'sglang:spec_verify_calls_total' not in fams
    assert 'sglang:request_time_per_output_token_seconds' not in fams
    ((_, pairs), _), = fams['sglang:generation_tokens_total']['samples'].items()
    assert [k for k, _ in pairs] == ['model_name']
    ((_, pairs), _), = fams['sglang:num_running_reqs']['samples'].items()
    assert [k for k, _ in pairs] == SCHED
    buckets = [dict(p)['le'] for (n, p) in fams['sglang:e2e_request_latency_seconds']['samples'] if n.endswith('_bucket')]
    assert buckets[-2:] == ['2400.0', '+Inf']


def test_speed_model_and_mtp_off(serve, tmp_path):
    base = serve()
    post(base, {'model': 'x', 'messages': MESSAGES, 'max_tokens': 8})
    fams = parse_metrics(get(base, '/metrics'))
    assert total(fams['sglang:spec_accept_length']) == 0 and total(fams['sglang:spec_num_steps']) == 0
    assert 'sglang:spec_verify_calls_total' not in fams
    code = ('import json; from sglang.launch_server import speed_model as m; print(json.dumps([m({}), '
            'm({"speculative_algorithm": "EAGLE", "speculative_num_steps": 1, "speculative_num_draft_tokens": 2}), '
            'm({"speculative_algorithm": "EAGLE", "speculative_num_steps": 1, "speculative_num_draft_tokens": 2}, 8)]))')
    out = subprocess.run(['/usr/bin/python3', '-c', code], env={'PYTHONPATH': str(tmp_path / '0.5.23')},
                         capture_output=True, text=True, check=True).stdout
    plain, mtp, batch = json.loads(out)
    assert round(plain['accept_length'] / plain['step_s']) == 110
    assert round(mtp['accept_length'] / mtp['step_s']) == 135
    assert mtp['accept_length'] == 1.8 and round(mtp['accept_rate'], 2) == 0.8
    assert batch['step_s'] > mtp['step_s']


def test_api_key_guards_everything_but_probes_and_metrics(serve):
    base = serve(extra=['--api-key', 's3cret'])
    for path in ('/health', '/ready', '/metrics'):
        get(base, path)
    for path in ('/server_info', '/v1/models'):
        with pytest.raises(urllib.error.HTTPError) as e:
            get(base, path)
        assert e.value.code == 401 and json.loads(e.value.read()) == {'error': 'Unauthorized'}
    with pytest.raises(urllib.error.HTTPError) as e:
        post(base, {'model': 'x', 'messages': MESSAGES, 'max_tokens': 2})
    assert e.value.code == 401
    req = urllib.request.Request(base + '/v1/chat/completions', headers={'Authorization': 'Bearer s3cret'},
                                 data=json.dumps({'model': 'x', 'messages': MESSAGES, 'max_tokens': 2}).encode())
    with urllib.request.urlopen(req, timeout=10) as r:
        assert json.loads(r.read())['usage']['completion_tokens'] == 2
    req = urllib.request.Request(base + '/server_info', headers={'Authorization': 'Bearer wrong'})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 401


def test_loading_lasts_until_the_loaded_file_appears(serve, tmp_path):
    """LAB_SGLANG_LOADED_FILE: a test that must catch SGLang still loading (test_faults.py, the program's
    progress line) sets a long start-up and ends it as soon as it has seen that moment."""
    loaded = tmp_path / 'loaded'
    base = serve(env={'LAB_SGLANG_STARTUP': '600', 'LAB_SGLANG_LOADED_FILE': str(loaded)})
    with pytest.raises(urllib.error.HTTPError) as e:
        get(base, '/health')
    assert e.value.code == 503
    loaded.touch()
    assert get(base, '/health') == ''
