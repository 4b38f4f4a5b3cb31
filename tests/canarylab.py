"""The canary's lab (shared by tests/unit/test_canary_read.py and test_canary_prometheus.py): two of the lab's simulated
SGLang 0.5.23 servers, MTP with three steps against none, and an open-loop load on them."""

import json
import subprocess
import threading
import time
import urllib.request

import pytest

from tests import fakesglang
from tests.unit.test_fake_sglang_serving import ARGS, free_port

MTP3 = ['--speculative-algorithm', 'NEXTN', '--speculative-num-steps', '3', '--speculative-eagle-topk', '1',
        '--speculative-num-draft-tokens', '4']
# A batch costs more here than the lab's default (0.03 a token): speculation's gain turns to a loss at a few running
# requests instead of ~16, so a light test load shows both sides (docs/bench.md, the lab's speed model).
SPEED_MODEL = json.dumps({'batch_cost': 0.1})


@pytest.fixture
def pair(tmp_path):
    """Two of the lab's simulated SGLang 0.5.23 servers: gpu01 (the canary) with MTP, three steps; gpu02 without."""
    fakesglang.install(tmp_path / 'lib', '0.5.23')
    env = dict({'PYTHONPATH': str(tmp_path / 'lib'), 'PATH': '/usr/bin:/bin', 'LAB_SGLANG_STARTUP': '0',
                'LAB_SGLANG_SPEED_MODEL': SPEED_MODEL, 'LAB_SGLANG_REQUEST_LOG': str(tmp_path / 'requests.jsonl')},
               **fakesglang.sysroot(tmp_path / 'container'))
    procs, urls = [], {}
    for host, extra in (('gpu01', MTP3), ('gpu02', [])):
        port = free_port()
        procs.append(subprocess.Popen(['/usr/bin/python3', '-m', 'sglang.launch_server'] + ARGS + extra +
                                      ['--host', '127.0.0.1', '--port', str(port)], cwd=str(tmp_path), env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        urls[host] = 'http://127.0.0.1:%d' % port
    deadline = time.time() + 30
    for url in urls.values():
        while True:
            try:
                urllib.request.urlopen(url + '/health', timeout=2).close()
                break
            except OSError:
                assert time.time() < deadline, 'the simulated SGLang did not start'
                time.sleep(0.1)
    yield urls
    for p in procs:
        p.terminate()
        p.wait(10)


def load(urls, rate, tokens, stop):
    """An open-loop load: `rate` requests a second to each server, evenly spaced, whatever it answers - a load
    balancer's share, not a client that waits (a slower server then runs more requests at once)."""
    body = json.dumps({'model': 'x', 'max_tokens': tokens, 'ignore_eos': True,
                       'messages': [{'role': 'user', 'content': 'Say something.'}]}).encode()

    def one(url):
        req = urllib.request.Request(url + '/v1/chat/completions', data=body,
                                     headers={'Content-Type': 'application/json'})
        try:
            urllib.request.urlopen(req, timeout=60).read()
        except OSError:
            pass
    due = time.time()
    while not stop.is_set():
        for url in urls.values():
            threading.Thread(target=one, args=(url,), daemon=True).start()
        due += 1.0 / rate
        stop.wait(max(0.0, due - time.time()))


def under_load(urls, rate, tokens, judgement):
    """judgement() under the open-loop load, after two seconds to a steady state."""
    stop = threading.Event()
    driver = threading.Thread(target=load, args=(urls, rate, tokens, stop), daemon=True)
    driver.start()
    try:
        time.sleep(2.0)
        return judgement()
    finally:
        stop.set()
        driver.join()
