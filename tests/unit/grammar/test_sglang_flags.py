"""extra_args checked with the declared SGLang version's own parser (tables generated from SGLang's
argparse by tools/sglang_flags_gen.py), and the flags the program manages refused in any spelling."""

import pytest

from grammar import sglang_flags

MANAGED = ['--model-path', '/m', '--tp-size', '4', '--speculative-algorithm', 'NEXTN', '--speculative-num-steps', '1',
           '--speculative-eagle-topk', '1', '--speculative-num-draft-tokens', '2']


@pytest.mark.parametrize('version,extra,ok', [
    ('0.5.13', ['--mamba-scheduler-strategy', 'no_buffer'], False),   # managed (mamba_radix_cache_strategy)
    ('0.5.20', ['--mamba-scheduler-strategy', 'no_buffer'], False),   # and gone from 0.5.20
    ('0.5.19', ['--cuda-graph-max-bs', '64'], True),
    ('0.5.23', ['--cuda-graph-max-bs', '64'], False),                 # ambiguous: -decode and -prefill
    ('0.5.23', ['--cuda-graph-max-bs-decode', '64'], True),
    ('0.5.12', ['--cuda-graph-max-bs-decode', '64'], False),          # too new for 0.5.12
    ('0.5.23', ['--some-future-flag'], False),
    ('0.5.23', ['--context-length', '32768'], True),
    ('0.5.23', ['--context-length=32768'], True),
])
def test_extra_flags_by_version(version, extra, ok):
    if ok:
        sglang_flags.check(version, MANAGED, extra)
    else:
        with pytest.raises(sglang_flags.FlagError):
            sglang_flags.check(version, MANAGED, extra)


@pytest.mark.parametrize('extra,dest', [
    (['--tp', '8'], 'tp_size'), (['--tp=8'], 'tp_size'), (['--tp-size', '8'], 'tp_size'),
    (['--speculative-algo', 'EAGLE'], 'speculative_algorithm'), (['--speculative-num-steps', '3'], 'speculative_num_steps'),
    (['--port', '1'], 'port'), (['--model', '/x'], 'model_path'), (['--dp', '2'], 'dp_size'),
    (['--config', 'x.yaml'], 'config'), (['--enable-metrics'], 'enable_metrics'),
])
def test_managed_flags_refused_in_any_spelling(extra, dest):
    with pytest.raises(sglang_flags.FlagError, match='sets %s, which this program manages' % dest):
        sglang_flags.check('0.5.23', MANAGED, extra)


def test_deprecated_alias_warns():
    w = sglang_flags.warnings('0.5.15', MANAGED + ['--mamba-scheduler-strategy', 'no_buffer'], {}, False)
    assert any('--mamba-scheduler-strategy is deprecated' in x and '--mamba-radix-cache-strategy' in x for x in w)
    assert not sglang_flags.warnings('0.5.15', MANAGED + ['--mamba-radix-cache-strategy', 'no_buffer'], {}, False)
