"""tools/bench_state.py's pure parts: the synthetic state a stack of N hosts is imported from (every host's resources
cloned from one real host's, each reference renamed with it), the payloads the program declares (so its preview
matches the clones), and the arithmetic docs/fleets.md's shard size rests on."""

import json

from tools import bench_state

STACK = 'urn:pulumi:bench::benchstate::pulumi:pulumi:Stack::benchstate-bench'
PROVIDER = 'urn:pulumi:bench::benchstate::pulumi:providers:command::default_1_2_1'


def command(name, deps=()):
    return {'urn': 'urn:pulumi:bench::benchstate::command:local:Command::%s' % name, 'custom': True,
            'type': 'command:local:Command', 'parent': STACK, 'provider': PROVIDER + '::abc',
            'dependencies': list(deps), 'inputs': {'environment': {'P0': '%s-00:xx' % name[:5]}},
            'outputs': {'environment': {'P0': '%s-00:xx' % name[:5]}, 'stdout': ''}}


def template():
    r0 = command('h0000-r00')
    r1 = command('h0000-r01', deps=[r0['urn']])
    return {'manifest': {}, 'resources': [
        {'urn': STACK, 'type': 'pulumi:pulumi:Stack', 'custom': False,
         'outputs': {'hosts': {'h0000': 'h0000-99:xxx'}}},
        {'urn': PROVIDER, 'type': 'pulumi:providers:command', 'custom': True, 'id': 'abc'},
        r0, r1]}


def test_expand_clones_every_host_resource_with_its_references_renamed():
    t = template()
    before = json.dumps(t, sort_keys=True)
    out = bench_state.expand(t, 3)
    assert json.dumps(t, sort_keys=True) == before, 'the template is left as it was'
    urns = [r['urn'] for r in out['resources']]
    assert len(urns) == len(set(urns)) == 2 + 3 * 2
    assert urns[:2] == [STACK, PROVIDER], 'the stack and the shared provider once, first'
    by_urn = {r['urn']: r for r in out['resources']}
    for h in ('h0000', 'h0001', 'h0002'):
        r1 = by_urn['urn:pulumi:bench::benchstate::command:local:Command::%s-r01' % h]
        assert r1['dependencies'] == ['urn:pulumi:bench::benchstate::command:local:Command::%s-r00' % h]
        assert r1['inputs']['environment']['P0'] == '%s-00:xx' % h
        assert r1['parent'] == STACK and r1['provider'] == PROVIDER + '::abc'
    assert by_urn[STACK]['outputs']['hosts'] == {'h0000': 'h0000-99:xxx', 'h0001': 'h0001-99:xxx',
                                                 'h0002': 'h0002-99:xxx'}


def test_expand_to_one_host_is_the_template():
    t = template()
    assert bench_state.expand(t, 1) == t


def payload_module():
    scope = {}
    exec(compile(bench_state.PAYLOAD, 'payload.py', 'exec'), scope)
    return scope


def test_the_program_payload_has_the_size_asked_for_in_chunks_a_variable_can_hold():
    p = payload_module()
    env = p['payload']('h0007', 3, 64000)
    assert sum(len(v) for v in env.values()) == 64000
    assert all(len(v) <= 16384 for v in env.values()) and sorted(env) == ['P0', 'P1', 'P2', 'P3']
    assert env['P0'].startswith('h0007-03:'), 'the host is named in its state, as a real host\'s is'
    assert p['changed_env'](0) == {} and p['changed_env'](2) == {'GEN': '2'}


def test_payload_sizes_make_a_host_about_as_big_as_a_real_one():
    sizes = bench_state.payload_sizes()
    assert len(sizes) == len(bench_state.HOST_RESOURCE_BYTES) == 17
    synthetic = sum(2 * s + bench_state.COMMAND_OVERHEAD for s in sizes)
    assert abs(synthetic - sum(bench_state.HOST_RESOURCE_BYTES)) < 0.02 * sum(bench_state.HOST_RESOURCE_BYTES)


def test_per_step_and_the_linear_fit():
    assert bench_state.per_step(12.0, 4.0, 8) == 1.0
    assert bench_state.per_step(3.0, 4.0, 4) == -0.25, 'noise is shown, not hidden'
    a, b = bench_state.fit_linear([1, 2, 3, 4], [3, 5, 7, 9])
    assert abs(a - 1) < 1e-9 and abs(b - 2) < 1e-9


def test_rolling_seconds_is_batches_of_hosts_unless_the_checkpoints_take_longer():
    # 50 hosts one at a time, 60 s each plus 4 steps of 0.5 s, after a 30 s pass: 30 + 50 x 62.
    assert bench_state.rolling_seconds(50, 1, 60, 4, 0.5, 30) == 30 + 50 * 62
    # 10 at a time: 5 batches of 62 s (its 200 steps' checkpoints, 100 s in all, fit within them).
    assert bench_state.rolling_seconds(50, 10, 60, 4, 0.5) == 5 * 62
    # 1,000 hosts, 4 steps of 3 s each: 12,000 s of checkpoints whatever runs at once.
    assert bench_state.rolling_seconds(1000, 500, 60, 4, 3.0) == 12000


def test_shard_plan_finds_the_hosts_down_at_once_a_shard_needs_for_the_hour():
    plan = bench_state.shard_plan(1000, 50, 60, 4, 0.2, step_fit=(0.1, 0.0), pass_fit=(10.0, 0.0))
    assert plan['shards'] == 20 and abs(plan['state_mb'] - 10.0) < 1e-9
    # one at a time: 10 + 50 x 60.4 = 3030 s
    assert plan['at_once'] == 1 and plan['fleet_n'] == 20
    assert abs(plan['one_at_a_time_h'] - 3030 / 3600) < 1e-9
    # one stack of 1,000: 2 s a step at 200 MB -> 8,000 s of checkpoints: no N does it in an hour
    one = bench_state.shard_plan(1000, 1000, 60, 4, 0.2, step_fit=(0.0, 0.01), pass_fit=(0.0, 0.0))
    assert one['at_once'] is None and one['fleet_n'] is None
