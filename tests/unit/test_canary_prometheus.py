"""resources/canary.py's PrometheusSource: the canary's windows read from the fleet's Prometheus instead of the hosts'
own /metrics. Against a real Prometheus (Debian's) scraping two of the lab's simulated SGLang servers with the
labels the stack's prometheus_file_sd gives a fleet's hosts (`host`, `id`, `node`), under the open-loop load of
test_canary_read.py: the windows agree with the program's own reads of the same slots, and the judge reaches the same
verdict at the heavy load. And the ways a read fails closed, each in one line: Prometheus unreachable, a host it does
not scrape, an error from its API."""

import contextlib
import http.server
import json
import os
import shutil
import signal
import statistics
import subprocess
import threading
import time
import types
import urllib.parse
import urllib.request

import pytest
import yaml

from resources import canary
from resources.monitoring import file_sd
from tests.canarylab import pair, under_load  # noqa: F401 (pair: the fixture)
from tests.integration.promlab import Prometheus, wait
from tests.unit.test_fake_sglang_serving import free_port
from tools import monitoring as tool

SCRAPE = '500ms'        # the test Prometheus' scrape interval: two scrapes in each 1 s window
CFG = dict(window_s=1.0, max_duration_s=40, bands=[0.25, 3, 100], min_samples=8, confidence=0.98, tolerance=0.1,
           traffic_tolerance=0.5, slo=types.SimpleNamespace(), prometheus=None)


def targets(urls):
    """The fleet's prometheus_file_sd for these hosts: resources/monitoring.py file_sd's SGLang group, labelled with
    the host's name as components/outputs.py export_fleet labels a fleet's groups. Both on one Proxmox node: only
    `host` tells them apart. (node_exporter's group left out: there is none here.)"""
    groups = []
    for vmid, (host, url) in enumerate(sorted(urls.items()), start=200):
        address, port = url.rsplit('/', 1)[1].split(':')
        d = types.SimpleNamespace(host=types.SimpleNamespace(node='pve1', address='127.0.0.1'),
                                  container=types.SimpleNamespace(address=address, vmid=vmid),
                                  sglang=types.SimpleNamespace(port=int(port)))
        groups += [dict(g, labels=dict(g['labels'], host=host)) for g in file_sd(d) if g['labels']['id'] != 'node/pve1']
    return groups


@contextlib.contextmanager
def prometheus(tmp, urls):
    """A real Prometheus on loopback with `make monitoring`'s scrape config (tools/monitoring.py), its targets the
    file above, every 0.5 s; yields its URL once it holds both hosts' SGLang series."""
    if shutil.which('prometheus') is None:
        pytest.skip('prometheus not installed (apt install prometheus)')
    sd = tmp / 'targets-fleet.json'
    sd.write_text(json.dumps(targets(urls)))
    cfg = yaml.safe_load(tool.scrape_config('fleet', None, targets_file=str(tmp / 'targets-%s.json')))
    cfg['rule_files'] = []
    cfg['global'] = {'scrape_interval': SCRAPE, 'scrape_timeout': SCRAPE}
    job = cfg['scrape_configs'][0]
    job.update(scrape_interval=SCRAPE, scrape_timeout=SCRAPE)
    job['file_sd_configs'][0]['refresh_interval'] = '1s'
    (tmp / 'prometheus.yml').write_text(yaml.safe_dump(cfg))
    url = 'http://127.0.0.1:%d' % free_port()
    proc = subprocess.Popen(['prometheus', '--config.file=%s' % (tmp / 'prometheus.yml'),
                             '--storage.tsdb.path=%s' % (tmp / 'data'), '--web.listen-address=%s' % url[7:]],
                            stdout=subprocess.DEVNULL, stderr=open(str(tmp / 'prometheus.log'), 'w'),
                            start_new_session=True)
    try:
        prom = Prometheus(url)
        wait(lambda: urllib.request.urlopen(url + '/-/ready', timeout=2).status == 200, 30, 'Prometheus ready')
        # Two scrapes of each host stored before the first slot: its first edge needs one.
        wait(lambda: len(prom.query('count_over_time(sglang:num_running_reqs{id=~"lxc/.+"}[5s]) >= 2')) == 2, 30,
             'Prometheus to have scraped both hosts twice')
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def recorded(slots, into):
    for slot in slots:
        into.append(slot)
        yield slot


def spread(a, b):
    """How far b is from a, relative."""
    return abs(b - a) / abs(a) if a else float('inf') if b else 0.0


@pytest.mark.skipif(not os.path.exists('/usr/bin/python3'), reason='the simulated SGLang runs under /usr/bin/python3')
def test_windows_from_prometheus_agree_with_the_programs_own_reads_and_reach_the_same_verdict(pair, tmp_path):
    cfg = types.SimpleNamespace(**CFG)
    with prometheus(tmp_path, pair) as url:
        source = canary.PrometheusSource(url, sorted(pair), settle_s=1.0)
        own, via_prom, verdicts = [], [], {}

        def both():
            # The same slots' traffic judged twice at once: the program's own reads and Prometheus'.
            t = threading.Thread(target=lambda: verdicts.__setitem__('own', canary.run(
                recorded(canary.watch(pair, cfg.window_s), own), 'gpu01', cfg, lambda line: None)))
            t.start()
            verdicts['prometheus'] = canary.run(recorded(source.watch(cfg.window_s), via_prom), 'gpu01', cfg,
                                                lambda line: None)
            t.join()
        under_load(pair, rate=16, tokens=32, judgement=both)
        for name, v in verdicts.items():
            assert v.outcome == 'fail', (name, v.line, v.table())
            assert v.line.startswith('inter-token latency, mean at load 3-100 running: canary '), (name, v.line)

        # The program's own slots re-read from Prometheus: [start, start + window_s] for each host.
        again = [source.windows(slot[0].start, slot[0].start + cfg.window_s)[0] for slot in own]
        figures = {}
        for host in sorted(pair):
            mine = [w for slot in own for w in slot if w.host == host]
            theirs = [w for slot in again for w in slot if w.host == host]
            figures[host] = {
                'requests': (sum(w.requests for w in mine), sum(w.requests for w in theirs)),
                'running': (statistics.fmean(w.running for w in mine), statistics.fmean(w.running for w in theirs))}
            for metric in ('itl_mean', 'itl_p95', 'ttft_p95', 'e2e_p95', 'tokens_per_req', 'queue'):
                a = [w.values[metric] for w in mine if w.values[metric] is not None]
                b = [w.values[metric] for w in theirs if w.values[metric] is not None]
                figures[host][metric] = (statistics.median(a), statistics.median(b))
        report = json.dumps({h: {m: '%.4g / %.4g (%.1f%%)' % (a, b, 100 * spread(a, b)) for m, (a, b) in f.items()}
                             for h, f in figures.items()}, indent=1)
        print('own reads / Prometheus, %d slots:\n%s' % (len(own), report))
        # Window by window they differ by where the scrapes fall (an edge up to 0.5 s before the program's read);
        # over the judgement, the medians and totals agree.
        for host, f in figures.items():
            for metric, limit in (('requests', 0.15), ('running', 0.2), ('itl_mean', 0.1), ('tokens_per_req', 0.2),
                                  ('e2e_p95', 0.2), ('itl_p95', 0.2)):
                assert spread(*f[metric]) <= limit, (host, metric, report)
        rows = {name: {r.metric: r for r in v.rows} for name, v in verdicts.items()}
        print('\n'.join('%s: %s' % (name, v.line) for name, v in verdicts.items()))
        for side in ('canary', 'baseline'):
            a, b = getattr(rows['own']['itl_mean'], side), getattr(rows['prometheus']['itl_mean'], side)
            assert spread(a, b) <= 0.1, (side, a, b)

        # A host Prometheus does not scrape: the judgement fails closed, naming it.
        said = []
        v = canary.run(canary.PrometheusSource(url, ['gpu01', 'gpu03'], settle_s=0).watch(1.0), 'gpu01', cfg,
                       said.append)
        assert v.outcome == 'fail' and not said
        assert v.line.startswith('Prometheus %s has no SGLang series for host gpu03 at ' % url), v.line
        assert v.line.endswith(': it is not scraped - the stack\'s prometheus_file_sd in its file_sd_configs? - the '
                               'judgement fails closed'), v.line
        # An error from its API, as it words it.
        with pytest.raises(canary.ReadError, match=r'^Prometheus %s: the query failed: bad_data: .*parse error' % url):
            source.query('sum(', time.time())


# ---------------------------------------------------------------- failures, one line each

@contextlib.contextmanager
def stub(status, body):
    """An HTTP server answering every GET with this status and JSON body (a callable: of the query)."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)['query'][0]
            data = json.dumps(body(query) if callable(body) else body).encode()
            self.send_response(status)
            self.send_header('Content-Type', 'application/json')
            self.send_header('Content-Length', str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={'poll_interval': 0.05}, daemon=True).start()
    try:
        yield 'http://127.0.0.1:%d' % server.server_port
    finally:
        server.shutdown()
        server.server_close()


def judge_from(url, hosts=('gpu01', 'gpu02')):
    said = []
    v = canary.run(canary.PrometheusSource(url, list(hosts), timeout=5, settle_s=0).watch(1.0), 'gpu01',
                   types.SimpleNamespace(**CFG), said.append)
    assert v.outcome == 'fail' and not said and '\n' not in v.line
    return v.line


def test_prometheus_unreachable_fails_the_judgement_closed():
    url = 'http://127.0.0.1:%d' % free_port()         # nothing listens there
    assert judge_from(url) == ('Prometheus %s is unreachable: [Errno 111] Connection refused - the judgement fails '
                               'closed' % url)
    # The judgement reads from Prometheus where gpuhost:rollout.canary.prometheus is set, whatever the hosts' URLs.
    cfg = types.SimpleNamespace(**dict(CFG, prometheus=url + '/'))
    v = canary.run(canary.source(cfg, {'gpu01': 'http://127.0.0.1:1', 'gpu02': 'http://127.0.0.1:1'}), 'gpu01', cfg,
                   lambda line: None)
    assert v.line.startswith('Prometheus %s is unreachable: ' % url), v.line


def test_a_host_prometheus_has_no_series_for_fails_closed_naming_it():
    # Prometheus holds gpu01's SGLang only: its value at the edge (an instant vector), its samples before (a range).
    one = {'metric': {'__name__': 'sglang:num_running_reqs', 'job': 'gpuhost', 'instance': '10.0.0.5:30000',
                      'host': 'gpu01', 'id': 'lxc/200', 'node': 'pve1', 'tp_rank': '0'}}

    def answer(query):
        if query.endswith(']'):
            return {'status': 'success', 'data': {'resultType': 'matrix',
                                                  'result': [dict(one, values=[[0.5, '2'], [1.0, '2']])]}}
        return {'status': 'success', 'data': {'resultType': 'vector', 'result': [dict(one, value=[1.0, '2'])]}}
    with stub(200, answer) as url:
        line = judge_from(url)
    assert line.startswith('Prometheus %s has no SGLang series for host gpu02 at ' % url), line
    assert '(host="gpu02", id=~"lxc/.+")' in line, line


def test_a_series_scraped_twice_fails_closed_rather_than_counting_twice():
    # Two jobs reading gpu01's SGLang (the operator's scrape config and make monitoring's): summed, every count doubles.
    series = [{'metric': {'__name__': 'sglang:num_requests_total', 'job': job, 'instance': '10.0.0.5:30000',
                          'host': 'gpu01', 'id': 'lxc/200', 'node': 'pve1'}, 'value': [1.0, '7']}
              for job in ('gpuhost', 'sglang')]
    with stub(200, {'status': 'success', 'data': {'resultType': 'vector', 'result': series}}) as url:
        assert judge_from(url) == ('Prometheus %s holds host gpu01\'s sglang:num_requests_total twice (two scrape jobs '
                                   'read its SGLang?): its figures would count twice - keep one job for the target - '
                                   'the judgement fails closed' % url)


def test_an_error_from_prometheus_api_is_its_message():
    body = {'status': 'error', 'errorType': 'bad_data', 'error': 'invalid parameter "query": 1:2: parse error:\n'
                                                                 'unexpected end of input'}
    with stub(400, body) as url:
        assert judge_from(url) == ('Prometheus %s: the query failed: bad_data: invalid parameter "query": 1:2: parse '
                                   'error: unexpected end of input - the judgement fails closed' % url)
    with stub(503, {'status': 'error', 'errorType': 'unavailable', 'error': 'TSDB not ready'}) as url:
        assert judge_from(url).endswith(': the query failed: unavailable: TSDB not ready - the judgement fails closed')
    with stub(502, 'bad gateway') as url:
        assert judge_from(url).endswith(': the query failed: HTTP 502 Bad Gateway - the judgement fails closed')
