"""resources/canary.py's reading side: quantiles as Prometheus' own histogram_quantile gives them (checked with
Debian's promtool), a host's window from two reads of its /metrics (the requests that came in, not only those that
ended; a counter that goes back fails closed), a host that cannot be read failing the judgement closed - and the whole
judge against two of the lab's simulated SGLang servers under an open-loop load: MTP with three steps beats no
speculation at a light load and loses at a heavy one, as the lab's speed model (and SGLang's published figures) say."""

import json
import os
import shutil
import subprocess
import types

import pytest

from resources import canary
from tests.canarylab import pair, under_load  # noqa: F401 (pair: the fixture)

BUCKETS = [
    {0.01: 3, 0.05: 40, 0.1: 90, float('inf'): 100},
    {0.005: 0, 0.01: 0, 0.025: 7, 0.05: 7, 0.1: 19, 0.25: 33, float('inf'): 33},
    {0.1: 1, 0.2: 1, 0.4: 2, 0.8: 5, 1.6: 5, float('inf'): 6},
]
QS = (0.5, 0.9, 0.95, 0.99)


@pytest.mark.skipif(shutil.which('promtool') is None, reason='promtool not installed (apt install prometheus)')
def test_quantiles_are_prometheus_histogram_quantile_to_the_last_bit(tmp_path):
    tests = []
    for i, b in enumerate(BUCKETS):
        series = [{'series': 'h%d_bucket{le="%s"}' % (i, '+Inf' if le == float('inf') else repr(le)),
                   'values': str(int(c))} for le, c in b.items()]
        exprs = [{'expr': 'histogram_quantile(%s, h%d_bucket)' % (q, i), 'eval_time': '0m',
                  'exp_samples': [{'labels': '{}', 'value': canary.histogram_quantile(q, b)}]} for q in QS]
        tests.append({'interval': '1m', 'input_series': series, 'promql_expr_test': exprs})
    path = tmp_path / 'quantiles.yml'
    path.write_text(json.dumps({'rule_files': [], 'evaluation_interval': '1m', 'tests': tests}))
    res = subprocess.run(['promtool', 'test', 'rules', str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert canary.histogram_quantile(0.95, {0.1: 0, float('inf'): 0}) is None
    assert canary.histogram_quantile(0.95, {0.1: 4}) is None           # no +Inf bucket: Prometheus' NaN


def metrics(requests, running, queue, itl, gen, aborted=None, itl_sum=1.0):
    """SGLang 0.5.23's /metrics text, as prometheus_client's multiprocess collector writes it (two tp ranks)."""
    tok = 'engine_type="unified",model_name="qwen"'
    lines = ['# HELP sglang:num_running_reqs Multiprocess metric', '# TYPE sglang:num_running_reqs gauge']
    for rank in (0, 1):
        lines.append('sglang:num_running_reqs{engine_type="unified",model_name="qwen",moe_ep_rank="0",pp_rank="0",'
                     'tp_rank="%d"} %s' % (rank, float(running)))
    lines += ['# HELP sglang:num_queue_reqs Multiprocess metric', '# TYPE sglang:num_queue_reqs gauge',
              'sglang:num_queue_reqs{engine_type="unified",model_name="qwen",moe_ep_rank="0",pp_rank="0",tp_rank="0"} '
              '%s' % float(queue),
              '# HELP sglang:num_requests_total Multiprocess metric', '# TYPE sglang:num_requests_total counter']
    for streaming, n in (('false', requests[0]), ('true', requests[1])):
        lines.append('sglang:num_requests_total{%s,is_streaming="%s"} %s' % (tok, streaming, float(n)))
    lines += ['# HELP sglang:generation_tokens_total Multiprocess metric',
              '# TYPE sglang:generation_tokens_total counter',
              'sglang:generation_tokens_total{%s,is_streaming="false"} %s' % (tok, float(gen)),
              '# HELP sglang:inter_token_latency_seconds Multiprocess metric',
              '# TYPE sglang:inter_token_latency_seconds histogram']
    for le, c in itl.items():
        lines.append('sglang:inter_token_latency_seconds_bucket{%s,le="%s"} %s' % (
            tok, '+Inf' if le == float('inf') else le, float(c)))
    lines.append('sglang:inter_token_latency_seconds_count{%s} %s' % (tok, float(max(itl.values()))))
    lines.append('sglang:inter_token_latency_seconds_sum{%s} %s' % (tok, float(itl_sum)))
    if aborted is not None:
        lines += ['# HELP sglang:num_aborted_requests_total Multiprocess metric',
                  '# TYPE sglang:num_aborted_requests_total counter',
                  'sglang:num_aborted_requests_total{%s} %s' % (tok, float(aborted))]
    return '\n'.join(lines) + '\n'


def test_a_window_from_two_reads_counts_the_requests_that_came_in_and_rank_zeros_gauges():
    a = canary.parse_scrape(metrics((10, 5), 4, 0, {0.02: 100, 0.05: 190, float('inf'): 200}, 3000, aborted=1), 100.0)
    mid = canary.parse_scrape(metrics((12, 6), 6, 2, {0.02: 120, 0.05: 230, float('inf'): 240}, 3300, aborted=1),
                              102.5)
    b = canary.parse_scrape(metrics((16, 7), 8, 1, {0.02: 150, 0.05: 290, float('inf'): 300}, 3800, aborted=2,
                                    itl_sum=3.5), 105.0)
    w = canary.window_of('gpu01', 100.0, a, b, [mid])
    # 8 ended, and 5 more in flight at the end than at the start (4 -> 8 running, 0 -> 1 queued): 13 came in.
    assert (w.host, w.start, w.requests, w.running) == ('gpu01', 100.0, 13.0, 7.0)
    assert w.values['queue'] == 1.5
    assert w.values['aborted_ratio'] == 1 / 8
    assert w.values['tokens_per_req'] == pytest.approx(800 / 5.0 / 7.0)
    # ITL deltas: 30 in <=20ms, 70 in <=50ms, 100 in all: p95 is the highest finite bound (rank 95 > 70+30? no: 100).
    assert w.values['itl_p95'] == pytest.approx(1000 * canary.histogram_quantile(
        0.95, {0.02: 50, 0.05: 100, float('inf'): 100}))
    assert w.values['itl_mean'] == pytest.approx(1000 * 2.5 / 100)     # 2.5 s over 100 tokens
    assert w.values['ttft_p95'] is None and w.values['accept_length'] is None    # families this text lacks
    # A counter that went back: SGLang restarted mid-judgement - no window, the judgement fails closed.
    restarted = canary.parse_scrape(metrics((1, 0), 1, 0, {0.02: 1, 0.05: 1, float('inf'): 1}, 10), 106.0)
    with pytest.raises(canary.ReadError, match="host gpu01: SGLang's sglang:num_requests_total went back .* it "
                                               "restarted during the judgement"):
        canary.window_of('gpu01', 105.0, b, restarted, [])


def test_a_host_whose_metrics_cannot_be_read_fails_the_judgement_closed():
    cfg = types.SimpleNamespace(window_s=0.2, max_duration_s=60, bands=[1], min_samples=3, confidence=0.98,
                                tolerance=0.1, traffic_tolerance=0.25, slo=types.SimpleNamespace())
    calls = []

    def fetch(endpoint):
        calls.append(endpoint)
        if endpoint == 'http://gpu02' and len(calls) > 6:
            raise ConnectionRefusedError(111, 'Connection refused')
        return metrics((len(calls), 0), 2, 0, {0.02: len(calls), float('inf'): len(calls)}, 10 * len(calls))
    said = []
    v = canary.run(canary.watch({'gpu01': 'http://gpu01', 'gpu02': 'http://gpu02'}, cfg.window_s, fetch=fetch),
                   'gpu01', cfg, said.append)
    assert v.outcome == 'fail'
    assert v.line == ('host gpu02: its SGLang metrics (http://gpu02/metrics) could not be read: [Errno 111] Connection '
                      'refused - the judgement fails closed')


# ---------------------------------------------------------------- the lab's SGLang under load

def judged(urls, rate, tokens, cfg):
    """The judgement read from the hosts' own /metrics under an open-loop load, and its progress lines."""
    said = []
    return under_load(urls, rate, tokens, lambda: canary.run(canary.watch(urls, cfg.window_s), 'gpu01', cfg,
                                                             said.append)), said


@pytest.mark.skipif(not os.path.exists('/usr/bin/python3'), reason='the simulated SGLang runs under /usr/bin/python3')
def test_the_judge_passes_mtp_at_a_light_load_and_fails_it_at_a_heavy_one(pair):
    cfg = types.SimpleNamespace(window_s=1.0, max_duration_s=30, bands=[0.25, 3, 100], min_samples=8,
                                confidence=0.98, tolerance=0.1, traffic_tolerance=0.5, slo=types.SimpleNamespace())
    light, said = judged(pair, rate=3, tokens=48, cfg=cfg)
    assert light.outcome == 'pass', (light.line, light.table())
    itl = next(r for r in light.rows if r.metric == 'itl_mean')
    assert itl.canary < itl.baseline, light.table()      # MTP is the faster here (the lab's figures: about 10 %)
    assert said and said[0].startswith('canary gpu01: collecting: ')
    heavy, _ = judged(pair, rate=16, tokens=32, cfg=cfg)
    assert heavy.outcome == 'fail', (heavy.line, heavy.table())
    assert ' at load 3-100 running: canary ' in heavy.line, heavy.line
    accept = next(r for r in heavy.rows if r.metric == 'accept_length')
    assert accept.result == 'signal' and accept.canary > 2      # MTP's accept length is reported, never judged
