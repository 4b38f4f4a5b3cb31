"""bench-serve's own logic: variants and the config lines they print, AIPerf's export (a real 0.13.0
profile_export_aiperf.json from the lab, key redacted by AIPerf), the accept length from SGLang's counters
(the lab's /metrics), the lab's time scale, gains and the pick, the report. No lab, no AIPerf run."""

import json
import os

import pytest

from tools import bench_serve as b

GOLDEN = os.path.join(os.path.dirname(__file__), 'golden')


def golden(name):
    with open(os.path.join(GOLDEN, name)) as f:
        return f.read()


def test_variants_parse_and_refuse_with_the_fix():
    assert b.parse_variants('off, NEXTN1,nextn3') == ['off', 'nextn1', 'nextn3']
    for bad, words in (('mtp', 'off (no speculation)'), ('nextn0', 'nextnN'), ('', 'at least one'),
                       ('off,off', 'off named twice')):
        with pytest.raises(b.BenchError) as e:
            b.parse_variants(bad)
        assert words in str(e.value)


def test_a_variant_is_the_config_models_consistent_triple():
    assert b.variant_speculative('off') is None
    assert b.variant_speculative('nextn2') == {'algorithm': 'NEXTN', 'num_steps': 2, 'eagle_topk': 1,
                                               'num_draft_tokens': 3}
    # Every nextn variant passes the program's own validator (topk 1 needs draft = steps + 1).
    import config
    for n in range(1, 10):
        config.Speculative(**b.variant_speculative('nextn%d' % n))


def test_resolved_matches_what_sglang_reports():
    eagle = {'speculative_algorithm': 'EAGLE', 'speculative_num_steps': 2, 'speculative_eagle_topk': 1,
             'speculative_num_draft_tokens': 3}
    assert b.resolved_matches('nextn2', eagle)
    assert not b.resolved_matches('nextn1', eagle) and not b.resolved_matches('off', eagle)
    assert b.resolved_matches('off', {'speculative_algorithm': None}) and b.resolved_matches('off', None)


def test_config_set_lines():
    assert b.config_set_lines('nextn3', 'prod') == [
        'pulumi config set --stack prod --path gpuhost:sglang.speculative.algorithm NEXTN',
        'pulumi config set --stack prod --path gpuhost:sglang.speculative.num_steps 3',
        'pulumi config set --stack prod --path gpuhost:sglang.speculative.eagle_topk 1',
        'pulumi config set --stack prod --path gpuhost:sglang.speculative.num_draft_tokens 4']
    off = b.config_set_lines('off', 'prod')
    assert all(line.startswith('#') for line in off) and 'speculative: null' in off[-1]


def test_parse_profile_reads_aiperfs_export():
    lv = b.parse_profile(json.loads(golden('aiperf-0.13.0-profile_export_aiperf.json')), 4)
    assert lv['concurrency'] == 4 and lv['requests'] == 8 and lv['errors'] == 0
    assert lv['output_tokens_mean'] == 300
    assert round(lv['output_tok_s_per_request'], 1) == 574.2      # the median, lab time (x5)
    assert round(lv['output_tok_s'], 1) == 2181.3
    assert round(lv['request_throughput'], 2) == 7.27
    assert set(lv['ttft_ms']) == set(lv['itl_ms']) == {'p50', 'p90', 'p99'}
    assert lv['ttft_ms']['p50'] < lv['ttft_ms']['p99']


def test_parse_profile_without_throughput_names_the_errors():
    doc = {'completed_request_count': {'avg': 0}, 'error_summary': [
        {'count': 3, 'error_details': {'code': 401, 'message': 'Unauthorized'}}]}
    with pytest.raises(b.BenchError) as e:
        b.parse_profile(doc, 2)
    assert 'concurrency 2' in str(e.value) and '3 errors' in str(e.value) and 'Unauthorized' in str(e.value)


def test_rescale_puts_lab_time_back():
    lv = b.parse_profile(json.loads(golden('aiperf-0.13.0-profile_export_aiperf.json')), 4)
    slow = b.rescale(lv, 5.0)
    assert slow['output_tok_s_per_request'] == pytest.approx(lv['output_tok_s_per_request'] / 5)
    assert slow['itl_ms']['p50'] == pytest.approx(lv['itl_ms']['p50'] * 5)
    assert b.rescale(lv, 1) is lv


def test_accept_length_from_counter_deltas():
    after = b.parse_metrics(golden('lab-sglang-0.5.23-metrics.txt'))
    assert after['sglang:generation_tokens_total'] == 20700 and after['sglang:spec_verify_calls_total'] == 11523
    before = {'sglang:generation_tokens_total': 0.0, 'sglang:num_requests_total': 0.0,
              'sglang:spec_verify_calls_total': 0.0}
    stats = b.accept_stats(before, after, 2)
    # (20700 tokens - 69 first tokens) / 11523 verify steps
    assert stats == {'accept_length': 1.79, 'accept_rate': 0.79, 'source': 'counters'}
    # No verify steps (speculation off): nothing to report; no /metrics: said so.
    off = dict(before, **{'sglang:generation_tokens_total': 500.0, 'sglang:num_requests_total': 5.0})
    assert b.accept_stats(before, off, None)['accept_length'] is None
    assert b.accept_stats(None, after, 2)['source'] == 'no /metrics'


def test_metrics_label_values_may_hold_any_character():
    # A label value with `}`, `,`, `=` and escaped quotes (a served model name is the operator's choice):
    # a sample whose labels a hand-made pattern cuts at the first `}` would go missing from the sum.
    text = ('# HELP sglang:generation_tokens_total Number of generation tokens processed.\n'
            '# TYPE sglang:generation_tokens_total counter\n'
            'sglang:generation_tokens_total{model_name="qwen}, \\"v2\\", tp=4",tp_rank="0"} 1200.0\n'
            'sglang:generation_tokens_total{model_name="qwen}, \\"v2\\", tp=4",tp_rank="1"} 34.0\n'
            '# HELP sglang:num_requests_total Number of requests processed.\n'
            '# TYPE sglang:num_requests_total counter\n'
            'sglang:num_requests_total{model_name="a{b}c,d"} 12.0\n'
            '# HELP sglang:spec_accept_length Multiprocess metric\n'
            '# TYPE sglang:spec_accept_length gauge\n'
            'sglang:spec_accept_length{model_name="}"} NaN\n')
    assert b.parse_metrics(text) == {'sglang:generation_tokens_total': 1234.0, 'sglang:num_requests_total': 12.0}


def test_metrics_that_are_not_prometheus_text_are_named(monkeypatch):
    # A proxy's login page where /metrics should be: the bench stops and names the URL.
    monkeypatch.setattr(b, '_http', lambda url, key=None, timeout=10: '<html>login</html>\n')
    target = b.Target('http://h:30000', 'http://h:30000/metrics', 'http://h:30000/server_info')
    with pytest.raises(b.BenchError) as e:
        target.metrics()
    assert 'http://h:30000/metrics is not Prometheus text' in str(e.value)


def run(levels):
    return {'levels': [{'concurrency': c, 'output_tok_s': v, 'output_tok_s_per_request': v / c} for c, v in levels]}


RUNS = {'off': run([(1, 110.0), (8, 720.0)]), 'nextn1': run([(1, 135.0), (8, 800.0)]),
        'nextn3': run([(1, 140.0), (8, 640.0)]), 'broken': {'error': 'failed', 'levels': []}}


def test_gains_and_the_pick_at_the_target_concurrency():
    g = b.gains(RUNS)
    assert g['nextn1'][1] == pytest.approx(135 / 110 - 1) and g['nextn3'][8] == pytest.approx(640 / 720 - 1)
    assert 'broken' not in g and 'off' not in g
    assert b.best_variant(RUNS, 1) == ('nextn3', 140.0)
    assert b.best_variant(RUNS, 8) == ('nextn1', 800.0)
    assert b.best_variant(RUNS, 32) is None


def test_requests_per_level():
    assert b.requests_for(1, 'x4') == 8 and b.requests_for(16, 'x4') == 64 and b.requests_for(16, '40') == 40


def test_args_refuse_what_cannot_run():
    for argv, words in ((['s', '--concurrency', '1,x'], '--concurrency'), (['s', '--requests', 'lots'], '--requests'),
                        (['s', '--target-concurrency', '3'], 'not one of the levels'),
                        (['s', '--output-tokens', '1'], '--output-tokens')):
        with pytest.raises(b.BenchError) as e:
            b.parse_args(argv)
        assert words in str(e.value)
    a = b.parse_args(['s'])
    assert a.concurrency == [1, 2, 4, 8, 16, 32] and a.input_tokens == a.output_tokens == 1000
    assert a.target_concurrency == 1 and a.variants is None


def test_the_report_labels_lab_figures_simulated():
    lv = b.parse_profile(json.loads(golden('aiperf-0.13.0-profile_export_aiperf.json')), 4)
    result = {'stack': 'lab', 'started': 'now', 'input_tokens': 200, 'output_tokens': 300, 'requests_rule': 'x2',
              'simulated': True, 'time_scale': 5.0,
              'runs': {'off': {'setting': None, 'levels': [dict(lv, output_tok_s=100.0)]},
                       'nextn1': {'setting': b.variant_speculative('nextn1'), 'levels': [dict(lv, output_tok_s=120.0)]}},
              'recommendation': {'concurrency': 4, 'variant': 'nextn1', 'output_tok_s': 120.0,
                                 'config_set': b.config_set_lines('nextn1', 'lab')}}
    md = b.markdown(result)
    assert md.startswith('# bench-serve: stack `lab` (SIMULATED')
    assert '## off - SIMULATED' in md and '| nextn1 | +20.0% |' in md
    assert '| 4 | %.1f / 100 | %.1f / 120 (+20%%) |' % ((lv['output_tok_s_per_request'],) * 2) in md
    assert 'pulumi config set --stack lab --path gpuhost:sglang.speculative.num_steps 1' in md
    result['simulated'] = False
    assert 'SIMULATED' not in b.markdown(result)


def test_the_target_never_shows_its_key():
    t = b.Target('http://h:30000', 'http://h:30000/metrics', 'http://h:30000/server_info', 'sekrit-key-0123456789')
    assert 'sekrit' not in repr(t) and t.env() == {b.KEY_ENV: 'sekrit-key-0123456789'}
    a = b.parse_args(['s'])
    a.tokenizer = '/tok'
    t.model = 'm'
    argv = b.Runner(a, print).aiperf_argv(t, 4, '/tmp/x')
    assert not any('sekrit' in x for x in argv) and '--api-key' not in argv
    assert argv[argv.index('--extra-inputs') + 1] == 'ignore_eos:true' and '--use-server-token-count' in argv


class FakeStack(object):
    """Records the stack file as each `up` sees it."""

    def __init__(self, path, fail_when=None):
        self.name, self.path, self.fail_when, self.seen = 'prod', path, fail_when, []

    def up(self, **kwargs):
        with open(self.path) as f:
            text = f.read()
        self.seen.append(text)
        if self.fail_when and self.fail_when in text:
            from pulumi.automation import errors
            raise errors.CommandError('code: 255\n stdout: \n  gpuhost: sglang: error: it did not start\n stderr: ')


STACK_FILE = """# the operator's comment
config:
  gpuhost:sglang:
    model_path: /models/Qwen3.5-122B-A10B
    api_key:
      secure: v1:abc/def==
    speculative: {algorithm: NEXTN, num_steps: 1, eagle_topk: 1, num_draft_tokens: 2}
encryptionsalt: v1:salt
"""


def test_a_variant_edits_only_the_speculation_and_the_restore_is_byte_for_byte(tmp_path):
    import yaml
    path = str(tmp_path / 'Pulumi.prod.yaml')
    with open(path, 'w') as f:
        f.write(STACK_FILE)
    stack = FakeStack(path, fail_when='num_steps: 3')
    tuner = b.Tuner(stack, path, lambda msg: None, {})
    tuner.apply('off')
    doc = yaml.safe_load(stack.seen[-1])
    assert doc['config']['gpuhost:sglang']['speculative'] is None
    assert doc['config']['gpuhost:sglang']['api_key'] == {'secure': 'v1:abc/def=='}  # still encrypted
    assert doc['encryptionsalt'] == 'v1:salt'
    with pytest.raises(b.BenchError) as e:
        tuner.apply('nextn3')
    assert str(e.value).startswith('`pulumi up` for variant nextn3 failed') and 'it did not start' in str(e.value)
    assert tuner.restore() is None
    with open(path) as f:
        assert f.read() == STACK_FILE  # comments and all
    assert stack.seen[-1] == STACK_FILE and not tuner.dirty
    assert tuner.restore() is None and len(stack.seen) == 3  # nothing to restore: no further up
