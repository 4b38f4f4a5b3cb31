"""resources/canary.py, the canary's judge, on synthetic windows (issue 60's unit tests): a clear regression, a clear
gain, noise within the tolerance, too few samples, unequal traffic, a band seen too briefly, an absolute SLO, and the
load band taken from the baseline (a slower canary runs more requests at once at the same traffic)."""

import random

import pytest

from config.fleet import Canary
from resources import canary as judge_mod
from resources.canary import Window, judge

CFG = Canary(window_s=5, max_duration_s=600, min_samples=20, bands=[1, 8, 32, 128])
BASE = {'itl_mean': 20.0, 'itl_p95': 40.0, 'ttft_p95': 300.0, 'e2e_p95': 12.0, 'aborted_ratio': 0.0, 'queue': 0.5,
        'tokens_per_req': 30.0, 'accept_length': 2.4}


def windows(n, running=4.0, canary=None, base=None, requests=20.0, canary_requests=None, seed=1, start=0,
            baselines=('gpu02', 'gpu03'), noise=0.05, canary_running=None):
    """n slots of windows for gpu01 (the canary) and the baseline hosts: each figure the mean times (1 + noise)."""
    rnd = random.Random(seed)
    canary, base = dict(BASE, **(canary or {})), dict(BASE, **(base or {}))
    out = []
    for i in range(n):
        t = (start + i) * 5.0
        for host in ('gpu01',) + tuple(baselines):
            mean = canary if host == 'gpu01' else base
            values = {k: v * (1 + rnd.gauss(0, noise)) for k, v in mean.items()}
            run = canary_running if host == 'gpu01' and canary_running is not None else running
            reqs = canary_requests if host == 'gpu01' and canary_requests is not None else requests
            out.append(Window(host, t, run * (1 + rnd.gauss(0, 0.02)), reqs, values))
    return out


def test_a_clear_regression_fails_naming_the_metric_band_and_both_figures():
    v = judge(windows(30, canary={'itl_mean': 26.0}), 'gpu01', CFG)
    assert v.outcome == 'fail', v.line
    assert v.line.startswith('inter-token latency, mean at load 1-8 running: canary 2')
    assert 'baseline 20' in v.line and 'beyond the tolerance of 10%' in v.line
    row = next(r for r in v.rows if r.metric == 'itl_mean')
    assert row.result == 'fail' and row.effect > 0.2 and row.p < 0.02 and (row.n_canary, row.n_baseline) == (30, 60)


def test_a_clear_gain_passes_with_the_accept_length_reported_not_gated():
    v = judge(windows(30, canary={'itl_mean': 15.0, 'tokens_per_req': 40.0, 'accept_length': 1.0}), 'gpu01', CFG)
    assert v.outcome == 'pass', v.line
    assert v.line == 'no metric worse beyond the tolerance in load 1-8 (30 windows compared)'
    accept = next(r for r in v.rows if r.metric == 'accept_length')
    assert accept.result == 'signal' and accept.effect > 0.5     # much worse, and still no gate
    assert 'speculative accept length' in v.table()


def test_noise_and_a_difference_within_the_tolerance_pass():
    # 4 % slower, many windows: the test may be confident, the effect is within 10 %.
    v = judge(windows(200, canary={'itl_mean': 20.8}, noise=0.02), 'gpu01', CFG)
    row = next(r for r in v.rows if r.metric == 'itl_mean')
    assert row.p < 0.02 and 0 < row.effect < 0.1
    assert v.outcome == 'pass', v.line


def test_too_few_samples_keep_collecting_then_end_inconclusive_saying_what_was_missing():
    ws = windows(8)
    assert judge(ws, 'gpu01', CFG).outcome == 'running'
    v = judge(ws, 'gpu01', CFG, final=True)
    assert v.outcome == 'inconclusive'
    assert v.line == ('too little comparable traffic within the judgement\'s time: load 1-8 running: canary 8 of 20 '
                      'windows, baseline 16 of 20 (0 windows idle, 0 with unequal traffic)')
    idle = judge(windows(40, running=0.2), 'gpu01', CFG, final=True)
    assert idle.outcome == 'inconclusive' and idle.idle == 40 and 'no window with traffic in any band' in idle.line


def test_windows_where_the_canary_took_unequal_traffic_do_not_count():
    # The canary got half the requests (a load balancer that shied away from it): its figures say nothing.
    ws = windows(30, canary={'itl_mean': 12.0}, canary_requests=10.0)
    v = judge(ws, 'gpu01', CFG, final=True)
    assert v.outcome == 'inconclusive' and (v.unequal, v.counted) == (30, 0)
    assert '30 with unequal traffic' in v.line


def test_a_band_seen_briefly_holds_an_early_pass_and_is_named_at_the_end():
    ws = windows(30) + windows(10, running=40.0, start=100, seed=2)      # a quarter of the slots at load 32-128
    assert judge(ws, 'gpu01', CFG).outcome == 'running'
    v = judge(ws, 'gpu01', CFG, final=True)
    assert v.outcome == 'pass'
    assert v.line.endswith('not judged, too few windows: load 32-128 running: canary 10 of 20 windows, baseline 20 of '
                           '20')
    # At load 32-128 the setting is worse: once that band fills, it fails there.
    worse = windows(30) + windows(25, running=40.0, start=100, seed=2, canary={'tokens_per_req': 20.0})
    v = judge(worse, 'gpu01', CFG)
    assert v.outcome == 'fail' and v.line.startswith('output tokens/s per running request at load 32-128 running')


def test_a_burstier_p95_alone_is_reported_not_gated():
    """Speculation yields 1 to k tokens a step: the per-token p95 may worsen while the mean (the decode speed) wins."""
    v = judge(windows(30, canary={'itl_mean': 15.0, 'itl_p95': 70.0}), 'gpu01', CFG)
    assert v.outcome == 'pass', v.line
    assert next(r for r in v.rows if r.metric == 'itl_p95').result == 'signal'


def test_an_absolute_slo_fails_a_canary_no_worse_than_its_baseline():
    cfg = Canary(window_s=5, max_duration_s=600, min_samples=20, slo={'itl_p95_ms': 35})
    v = judge(windows(30), 'gpu01', cfg)
    assert v.outcome == 'fail'
    assert v.line.startswith('inter-token latency p95 at load 1-8 running: the canary\'s 4')
    assert 'beyond the SLO of 35 ms' in v.line


def test_the_load_band_is_the_baselines_a_slower_canary_running_more_requests_is_judged_in_the_same_band():
    ws = windows(30, canary={'itl_mean': 30.0}, canary_running=12.0)
    v = judge(ws, 'gpu01', CFG)
    assert v.outcome == 'fail' and 'at load 1-8 running' in v.line


@pytest.mark.parametrize('metric', sorted(judge_mod.SLO_KEYS))
def test_every_slo_key_is_a_setting(metric):
    assert judge_mod.SLO_KEYS[metric] in type(CFG.slo).model_fields
