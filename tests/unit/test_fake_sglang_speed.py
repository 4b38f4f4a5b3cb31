"""The lab SGLang's speed model (docs/bench.md "The lab's speed model"): its parameters from
$LAB_SGLANG_SPEED_MODEL, refused at start-up when malformed; the random draw's accept length around the
model's mean; the lab spec's sglang_speed in the containers it creates. The start-up failure knob is
tested on the lab (tests/integration/test_bench_serve.py). Run with the system python3, as in a lab
container."""

import json
import socket
import subprocess
import time
import urllib.request

import pytest

from tests import fakesglang

ARGS = ['--model-path', '/models/Qwen3.5-122B-A10B', '--served-model-name', 'qwen3.5-122b-a10b', '--tp-size', '4',
        '--enable-metrics']
MTP2 = ['--speculative-algorithm', 'NEXTN', '--speculative-num-steps', '2', '--speculative-eagle-topk', '1',
        '--speculative-num-draft-tokens', '3']


@pytest.fixture
def pkg(tmp_path):
    fakesglang.install(tmp_path / 'lib', '0.5.23')
    return str(tmp_path / 'lib')


def env(pkg, **extra):
    return dict({'PYTHONPATH': pkg, 'PATH': '/usr/bin:/bin', 'LAB_SGLANG_STARTUP': '0'}, **extra)


def model(pkg, settings, batch=1, **extra):
    code = ('import json, sys; from sglang.launch_server import speed_model as m; '
            'print(json.dumps(m(json.loads(sys.argv[1]), int(sys.argv[2]))))')
    res = subprocess.run(['/usr/bin/python3', '-c', code, json.dumps(settings), str(batch)], env=env(pkg, **extra),
                         capture_output=True, text=True)
    return res


@pytest.mark.parametrize('doc, words', [
    ('{"base_tok_s": 0}', 'base_tok_s=0 is out of range'),
    ('{"accept_prob": 1.5}', 'accept_prob=1.5 is out of range'),
    ('{"speed": 2}', "unknown speed model key 'speed' (known: base_tok_s, batch_cost"),
    ('{"draw": "median"}', "draw must be 'mean' or 'random'"),
    ('[1]', 'a JSON object of base_tok_s'),
    ('{bad', 'LAB_SGLANG_SPEED_MODEL: not JSON'),
])
def test_a_malformed_speed_model_fails_start_up_like_a_bad_flag(pkg, doc, words):
    res = model(pkg, {}, LAB_SGLANG_SPEED_MODEL=doc)
    assert res.returncode == 1 and res.stderr.strip().splitlines()[-1].startswith('ValueError: lab speed model: ')
    assert words in res.stderr


def test_parameters_change_the_model(pkg):
    out = json.loads(model(pkg, {}, 4, LAB_SGLANG_SPEED_MODEL='{"base_tok_s": 200, "batch_cost": 0}').stdout)
    assert round(out['tok_s'], 6) == 200 and out['accept_length'] == 1
    spec = {'speculative_algorithm': 'EAGLE', 'speculative_num_steps': 2, 'speculative_num_draft_tokens': 3}
    out = json.loads(model(pkg, spec, 1, LAB_SGLANG_SPEED_MODEL='{"accept_prob": 0.5, "draft_cost": 0}').stdout)
    # 1 + 0.5 + 0.25 tokens per step; the verify step of 3 tokens costs 1 + 0.03 x 2.
    assert out['accept_length'] == 1.75 and round(out['tok_s'], 3) == round(1.75 / (1.06 / 110), 3)


def free_port():
    s = socket.socket()
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_random_draw_averages_the_models_accept_length(pkg, tmp_path):
    port = free_port()
    p = subprocess.Popen(['/usr/bin/python3', '-m', 'sglang.launch_server'] + ARGS + MTP2 +
                         ['--host', '127.0.0.1', '--port', str(port)], cwd=str(tmp_path),
                         env=env(pkg, LAB_SGLANG_SPEED='50', LAB_SGLANG_SPEED_MODEL='{"draw": "random", "seed": 7}',
                                 **fakesglang.sysroot(tmp_path / 'container')),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = 'http://127.0.0.1:%d' % port
    try:
        deadline = time.time() + 20
        while True:
            try:
                urllib.request.urlopen(base + '/health', timeout=2).close()
                break
            except OSError:
                assert time.time() < deadline, 'the fake SGLang did not start'
                time.sleep(0.05)
        body = {'model': 'x', 'messages': [{'role': 'user', 'content': 'go'}], 'max_tokens': 1500, 'ignore_eos': True}
        req = urllib.request.Request(base + '/v1/chat/completions', data=json.dumps(body).encode(),
                                     headers={'Content-Type': 'application/json'})
        with urllib.request.urlopen(req, timeout=60) as r:
            assert json.loads(r.read())['usage']['completion_tokens'] == 1500
        with urllib.request.urlopen(base + '/server_info', timeout=10) as r:
            avg = json.loads(r.read())['internal_states'][0]['avg_spec_accept_length']
        # ~600 steps drawn around 1 + 0.8 + 0.64 = 2.44 (sd of one step ~0.8: the mean's ~0.03).
        assert abs(avg - 2.44) < 0.12 and avg != 2.44
    finally:
        p.terminate()
        p.wait(10)



def test_the_lab_spec_sets_the_speed_model_of_the_containers_it_creates(tmp_path):
    """The lab writes the spec's speed model into every container it creates (labctl.Lab.ct_files), and the
    simulated SGLang - installed from its wheel, as in a container - reads it."""
    import types
    import zipfile
    import tests.lablib  # noqa: F401 (puts lab/ on sys.path)
    import labctl
    from lab import sglang_wheel
    fake = types.SimpleNamespace(info={'container_ip': '127.0.0.4', 'sglang_version': '0.5.23',
                                       'sglang_speed': {'base_tok_s': 90, 'batch_cost': 0.05}})
    files = labctl.Lab.ct_files(fake)
    path = tmp_path / 'lab-sglang-speed.json'
    path.write_text(files['/etc/lab-sglang-speed.json'])
    lib = tmp_path / 'site-packages'
    with zipfile.ZipFile(sglang_wheel.wheel('0.5.23')) as z:
        z.extractall(lib)
    code = ('import json, sys; from sglang.launch_server import speed_params; '
            'print(json.dumps(speed_params({}, sys.argv[1])))')
    res = subprocess.run(['/usr/bin/python3', '-c', code, str(path)], capture_output=True, text=True, check=True,
                         env={'PYTHONPATH': str(lib), 'PATH': '/usr/bin:/bin'})
    params = json.loads(res.stdout)
    assert params['base_tok_s'] == 90 and params['batch_cost'] == 0.05 and params['accept_prob'] == 0.8
