import pytest

from components import sglang_flags


@pytest.mark.parametrize('version,flag,ok', [
    ('0.5.13', '--mamba-scheduler-strategy', True),
    ('0.5.19', '--mamba-scheduler-strategy', True),
    ('0.5.20', '--mamba-scheduler-strategy', False),
    ('0.5.13', '--mamba-radix-cache-strategy', False),
    ('0.5.14', '--mamba-radix-cache-strategy', True),
    ('0.5.22', '--cuda-graph-max-bs', True),
    ('0.5.23', '--cuda-graph-max-bs', False),
    ('0.5.23', '--cuda-graph-max-bs-decode', True),
    ('0.5.23', '--some-future-flag', True),
])
def test_flag_acceptance_by_version(version, flag, ok):
    if ok:
        sglang_flags.check(version, [flag, '1'], {})
    else:
        with pytest.raises(ValueError, match=flag):
            sglang_flags.check(version, [flag, '1'], {})


def test_deprecated_alias_warns():
    w = sglang_flags.warnings('0.5.15', ['--mamba-scheduler-strategy', 'no_buffer'], {}, False)
    assert any('deprecated alias' in x for x in w)
