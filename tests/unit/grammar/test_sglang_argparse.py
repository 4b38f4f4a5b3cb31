"""grammar/sglang_argparse: SGLang's own parser rebuilt from the tables generated from each
release's argparse (tools/sglang_flags_gen.py). The lab's simulated SGLang does not use it
(tests/unit/test_fake_sglang_args.py)."""

import argparse
import json
import os
import re

import pytest

from grammar import sglang_argparse as sa
from tools import sglang_flags_gen as gen

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BASE = ['--model-path', '/models/qwen']


def v(version):
    return tuple(int(x) for x in version.split('.')[:3])


def refused(version, argv):
    with pytest.raises(sa.FlagError) as e:
        sa.parse(version, BASE + argv)
    return e.value


# ---------------------------------------------------------------------------------------------
# The committed data

def test_every_generated_version_has_a_table_and_no_other():
    assert sa.supported_versions() == gen.VERSIONS
    assert sa.supported_versions()[-1] == '0.5.23'


@pytest.mark.parametrize('version', gen.VERSIONS)
def test_table_loads_and_parser_builds(version):
    t = sa.table(version)
    assert t['version'] == version
    assert t['method'] == 'import'  # read from SGLang's own parser, not the ast fallback
    assert t['source']['wheel'].startswith('sglang-%s-' % version) and t['source']['wheel'].endswith('.whl')
    assert re.fullmatch('[0-9a-f]{64}', t['source']['sha256'])
    assert t['parser']['allow_abbrev'] is True and t['parser']['prefix_chars'] == '-'
    parser = sa.build_parser(version)
    assert isinstance(parser, argparse.ArgumentParser) and parser.allow_abbrev
    # Every option string of the table, and no other, in the rebuilt parser.
    rebuilt = {o for a in parser._actions for o in a.option_strings}
    assert rebuilt == set(sa.option_strings(version))
    ns, given = sa.parse(version, BASE)
    assert ns['model_path'] == '/models/qwen' and given == [('--model-path', 'model_path')]


@pytest.mark.parametrize('version', gen.VERSIONS)
def test_committed_file_is_in_the_generators_canonical_form(version):
    # Rerunning the generator on the same wheel rewrites the same bytes: sorted keys, one action a line.
    path = os.path.join(REPO, 'grammar', 'sglang_flags_data', version + '.json')
    with open(path) as f:
        text = f.read()
    assert gen.render(json.loads(text)) == text


def test_unsupported_version_names_the_supported_ones():
    with pytest.raises(ValueError, match=r'no flag table for SGLang 0\.6\.0; supported versions: 0\.5\.1, .*0\.5\.23'):
        sa.table('0.6.0')
    with pytest.raises(ValueError, match='supported versions'):
        sa.parse('9.9.9', BASE)


# ---------------------------------------------------------------------------------------------
# Flags the program manages

def test_tp_is_an_abbreviation_of_tp_size():
    # SGLang has no --tp option: argparse's allow_abbrev resolves the unique prefix to --tp-size.
    assert '--tp' not in sa.option_strings('0.5.23')
    ns, given = sa.parse('0.5.23', BASE + ['--tp', '8'])
    assert ns['tp_size'] == 8 and ('--tp', 'tp_size') in given
    ns, given = sa.parse('0.5.23', BASE + ['--tensor-parallel-size=2'])
    assert ns['tp_size'] == 2 and ('--tensor-parallel-size', 'tp_size') in given


def test_before_0_5_14_tp_parses_into_tensor_parallel_size_and_becomes_tp_size():
    ns, given = sa.parse('0.5.13', BASE + ['--tp', '4'])
    assert ns['tensor_parallel_size'] == 4 and 'tp_size' not in ns
    assert ('--tp', 'tensor_parallel_size') in given
    assert sa.field('0.5.13', 'tensor_parallel_size') == 'tp_size'
    assert sa.fields('0.5.13', ns)['tp_size'] == 4
    assert sa.field('0.5.23', 'tp_size') == 'tp_size'


@pytest.mark.parametrize('version', ['0.5.1', '0.5.13', '0.5.23'])
def test_program_flags_dests(version):
    argv = BASE + ['--served-model-name', 'qwen', '--host', '0.0.0.0', '--port', '31000', '--tp-size', '4',
                   '--mem-fraction-static', '0.75', '--enable-metrics', '--disable-custom-all-reduce',
                   '--speculative-algorithm', 'NEXTN', '--speculative-num-steps', '1', '--speculative-eagle-topk', '1',
                   '--speculative-num-draft-tokens', '2']
    ns, given = sa.parse(version, argv)
    f = sa.fields(version, ns)
    assert (f['served_model_name'], f['host'], f['port'], f['tp_size']) == ('qwen', '0.0.0.0', 31000, 4)
    assert (f['mem_fraction_static'], f['enable_metrics'], f['disable_custom_all_reduce']) == (0.75, True, True)
    assert (f['speculative_algorithm'], f['speculative_num_steps'], f['speculative_eagle_topk'],
            f['speculative_num_draft_tokens']) == ('NEXTN', 1, 1, 2)
    assert [t for t, _ in given] == [a for a in argv if a.startswith('--')]


def test_defaults_are_returned_but_only_argv_flags_are_given():
    ns, given = sa.parse('0.5.23', BASE + ['--port', '31000'])
    assert ns['host'] == '127.0.0.1' and ns['port'] == 31000 and ns['tp_size'] == 1 and ns['enable_metrics'] is False
    assert given == [('--model-path', 'model_path'), ('--port', 'port')]


def test_model_alias_and_required_model_path():
    ns, given = sa.parse('0.5.23', ['--model', '/m'])
    assert ns['model_path'] == '/m' and given == [('--model', 'model_path')]
    with pytest.raises(sa.FlagError, match='required: --model-path'):
        sa.parse('0.5.23', ['--tp', '4'])


# ---------------------------------------------------------------------------------------------
# Version boundaries (the real data; see SYSTEM.md "Flags depend on the SGLang version")

@pytest.mark.parametrize('version', gen.VERSIONS)
def test_cuda_graph_max_bs(version):
    argv = ['--cuda-graph-max-bs', '64']
    if v(version) < (0, 5, 14):
        ns, _ = sa.parse(version, BASE + argv)
        assert ns['cuda_graph_max_bs'] == 64
    elif v(version) < (0, 5, 20):
        # A deprecated alias of --cuda-graph-max-bs-decode.
        ns, _ = sa.parse(version, BASE + argv)
        assert ns['cuda_graph_max_bs_decode'] == 64
        assert sa.deprecated(version, BASE + argv) == [('--cuda-graph-max-bs', 'cuda_graph_max_bs_decode',
                                                        '--cuda-graph-max-bs-decode')]
    else:
        # Gone, and a prefix of two flags: argparse calls it ambiguous.
        e = refused(version, argv)
        assert e.kind == 'ambiguous' and e.token == '--cuda-graph-max-bs'
        assert e.candidates == ['--cuda-graph-max-bs-decode', '--cuda-graph-max-bs-prefill']
        assert 'ambiguous option --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, ' \
               '--cuda-graph-max-bs-prefill' in str(e) and '\n' not in str(e)
        assert refused(version, ['--cuda-graph-max-bs=64']).kind == 'ambiguous'
    if v(version) >= (0, 5, 14):
        ns, _ = sa.parse(version, BASE + ['--cuda-graph-max-bs-decode', '64'])
        assert ns['cuda_graph_max_bs_decode'] == 64
    else:
        assert refused(version, ['--cuda-graph-max-bs-decode', '64']).kind == 'unknown'


@pytest.mark.parametrize('version', gen.VERSIONS)
def test_mamba_scheduler_strategy(version):
    argv = ['--mamba-scheduler-strategy', 'extra_buffer']
    if (0, 5, 7) <= v(version) < (0, 5, 20):
        ns, _ = sa.parse(version, BASE + argv)
        dest = 'mamba_scheduler_strategy' if v(version) < (0, 5, 14) else 'mamba_radix_cache_strategy'
        assert ns[dest] == 'extra_buffer'
        if v(version) >= (0, 5, 14):
            assert sa.deprecated(version, BASE + argv)[0][2] == '--mamba-radix-cache-strategy'
    else:
        e = refused(version, argv)
        assert e.kind == 'unknown' and e.token == '--mamba-scheduler-strategy'
        assert 'unrecognized arguments: --mamba-scheduler-strategy extra_buffer' in str(e)
        if v(version) >= (0, 5, 20):
            assert e.candidates[0] == '--mamba-radix-cache-strategy'
            assert 'did you mean --mamba-radix-cache-strategy' in str(e)


@pytest.mark.parametrize('version', gen.VERSIONS)
def test_mamba_radix_cache_strategy(version):
    if v(version) >= (0, 5, 14):
        for choice in ('auto', 'no_buffer', 'extra_buffer', 'extra_buffer_lazy'):
            ns, _ = sa.parse(version, BASE + ['--mamba-radix-cache-strategy', choice])
            assert ns['mamba_radix_cache_strategy'] == choice
        e = refused(version, ['--mamba-radix-cache-strategy', 'lazy'])
        assert e.kind == 'invalid' and "invalid choice: 'lazy'" in str(e)
    else:
        assert refused(version, ['--mamba-radix-cache-strategy', 'auto']).kind == 'unknown'


def test_extra_buffer_lazy_before_the_rename():
    # 0.5.13 already had extra_buffer_lazy, under the old flag name; 0.5.12 had not.
    ns, _ = sa.parse('0.5.13', BASE + ['--mamba-scheduler-strategy', 'extra_buffer_lazy'])
    assert ns['mamba_scheduler_strategy'] == 'extra_buffer_lazy'
    assert refused('0.5.12', ['--mamba-scheduler-strategy', 'extra_buffer_lazy']).kind == 'invalid'


# ---------------------------------------------------------------------------------------------
# Refusals, as argparse makes them

def test_a_typo_that_is_a_prefix_is_accepted_as_argparse_does():
    # --speculative-num-step is a unique prefix of --speculative-num-steps: allow_abbrev takes it.
    ns, given = sa.parse('0.5.23', BASE + ['--speculative-num-step', '2'])
    assert ns['speculative_num_steps'] == 2 and ('--speculative-num-step', 'speculative_num_steps') in given


def test_a_typo_that_is_no_prefix_is_refused_with_did_you_mean():
    e = refused('0.5.23', ['--speculative-num-stpes', '2'])
    assert e.kind == 'unknown' and e.token == '--speculative-num-stpes'
    assert e.candidates[0] == '--speculative-num-steps'
    assert 'did you mean --speculative-num-steps' in str(e) and '\n' not in str(e)


def test_unknown_flag_refused():
    e = refused('0.5.23', ['--frobnicate-the-gpus', '1'])
    assert e.kind == 'unknown' and e.token == '--frobnicate-the-gpus'
    assert str(e).startswith('SGLang 0.5.23: unrecognized arguments: --frobnicate-the-gpus 1')
    e = refused('0.5.23', ['--enable-metrcs'])
    assert e.candidates[0] == '--enable-metrics' and 'did you mean --enable-metrics' in str(e)


def test_value_of_the_wrong_type_refused():
    e = refused('0.5.23', ['--port=abc'])
    assert e.kind == 'invalid' and e.token == '--port'
    assert "argument --port: invalid int value: 'abc'" in str(e)
    assert sa.parse('0.5.23', BASE + ['--port=31000'])[0]['port'] == 31000
    assert refused('0.5.23', ['--mem-fraction-static', 'most']).kind == 'invalid'
    assert refused('0.5.23', ['--served-model-name']).kind == 'invalid'  # expected one argument


def test_sglang_custom_types():
    # human_readable_int (context length), refused when not a number.
    assert sa.parse('0.5.23', BASE + ['--context-length', '32k'])[0]['context_length'] == 32000
    assert refused('0.5.23', ['--context-length', 'long']).kind == 'invalid'


def test_removed_flag_that_stops_sglang():
    # 0.5.3 kept --enable-ep-moe as an action raising ValueError with the replacement.
    e = refused('0.5.3', ['--enable-ep-moe'])
    assert e.kind == 'removed' and e.raises == 'ValueError' and '--ep-size' in str(e)


def test_help_never_serves():
    assert refused('0.5.23', ['--help']).kind == 'help'


def test_ambiguous_prefixes_match_argparse():
    """The pre-check naming an ambiguous prefix's candidates agrees with argparse itself."""
    version = '0.5.23'
    parser = sa.build_parser(version)
    plain = argparse.ArgumentParser(allow_abbrev=True, add_help=False, exit_on_error=False)
    for o in sa.option_strings(version):
        if o.startswith('--'):
            plain.add_argument(o, action='store_true', dest=o)
    plain.error = lambda message: (_ for _ in ()).throw(ValueError(message))
    seen = 0
    for o in sa.option_strings(version):
        for cut in (1, 4, len(o) // 2):
            prefix = o[:-cut]
            if len(prefix) < 3 or prefix in sa.option_strings(version):
                continue
            try:
                plain.parse_known_args([prefix])
                argparse_says = False
            except ValueError as e:
                argparse_says = 'ambiguous option' in str(e)
            assert (len(sa._matches(parser, version, prefix)) > 1) == argparse_says, prefix
            seen += argparse_says
    assert seen > 100


def test_given_tokens_as_written():
    ns, given = sa.parse('0.5.23', ['--model=/m', '--tp=2', '--port', '1', '--enable-metrics-for-all'])
    assert given == [('--model', 'model_path'), ('--tp', 'tp_size'), ('--port', 'port'),
                     ('--enable-metrics-for-all', 'enable_metrics_for_all_schedulers')]
    # A prefix of two flags is refused even when one of them is spelled out almost entirely.
    assert refused('0.5.23', ['--enable-metric']).candidates == ['--enable-metrics',
                                                                  '--enable-metrics-for-all-schedulers']


def test_parse_returns_copies():
    ns, _ = sa.parse('0.5.23', BASE)
    for value in ns.values():
        if isinstance(value, (list, dict)):
            value.clear() if isinstance(value, dict) else value.append('x')
    assert sa.parse('0.5.23', BASE)[0] == sa.parse('0.5.23', BASE)[0]
