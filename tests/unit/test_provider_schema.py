"""The properties each resource type declares (its serving class's INPUTS and OUTPUTS, resources/fields.py) against
what the program registers: the program run under mocks for the lab stack, a two-host fleet and the lab with what
it leaves out set (an API key, the GPU proof, a model source with its token and checksums, an installer from a
mirror with its login) - every input it hands over declared by the class that serves it, of the declared type,
secret where declared secret, and every required one set. Also what provider/schema.json makes of them."""

import copy
import json

import pytest

from resources import fields
from resources.fields import ANY, B, I, N, S, arr, mapof, obj, optional, secret
from provider import registry
from tools import provider_schema


# gpuhost:rollout.fleet_lock with every optional setting.
FLEET_LOCK = {'group': 'lab', 'slots': 2, 'endpoints': ['https://etcd.example:2379'], 'ca_file': '/etc/etcd/ca.pem',
              'cert_file': '/etc/etcd/client.pem', 'key_file': '/etc/etcd/client-key.pem', 'user': 'lock',
              'password': 'etcd-unit-test-password'}


def runs():
    """(label, resources) of the program under mocks: the lab stack, the two-host fleet, the lab with its optional
    inputs set."""
    import config
    from lab import fleet
    from tests.unit.config.test_config import lab_data
    from tests.unit.program import run_program
    from tests.unit.test_runtime import FILES
    entries = [fleet.host_entry(i, fleet.host_spec(i, fleet.addresses(i)), '.lab-fleet/gpu%02d' % i) for i in (1, 2)]
    two = {k.split(':', 1)[1]: v for k, v in fleet.stack_config(entries).items()}
    if 'nvidia' in two.get('runtime', {}):
        two['nvidia'] = {'driver': dict(two['runtime'].pop('nvidia'))}   # a fleet's driver: rollout too
    two['rollout'] = dict(two.get('rollout') or {}, max_unavailable=2, canary={
        'window_s': 10, 'min_samples': 5, 'prometheus': 'http://prometheus.example:9090', 'baseline': 'restart'},
                          fleet_lock=FLEET_LOCK)
    full = copy.deepcopy(lab_data())
    full['sglang'].update(api_key='sk-unit-test-key-0123456789abcdef', proof={'enabled': True, 'min_busbw_gbps': 40.5})
    full['model'].update(source='hf://Qwen/Qwen3.5-122B-A10B', timeout_s=7200, max_bytes_per_s=100000000)
    full['runtime']['nvidia'].pop('installer')
    full['runtime']['nvidia'].update(source='https://mirror.example/NVIDIA-Linux-x86_64-580.95.05.run',
                                     token='mirror-token-0123')
    # The host's driver declared, from the same mirror (gpuhost:nvidia.driver; runtime.nvidia follows it).
    full['nvidia'] = {'driver': dict(full['runtime'].pop('nvidia'))}
    model_files = {'checksums': {'model-00001-of-00003.safetensors': 'a' * 64}, 'token': 'hf_unit_test_token'}
    return [('lab', run_program(config.parse_fleet(lab_data()), FILES)['resources']),
            ('fleet', run_program(config.parse_fleet(two), FILES)['resources']),
            ('lab with every optional input', run_program(config.parse_fleet(full), FILES,
                                                          model_files=model_files)['resources'])]


@pytest.fixture(scope='module')
def registered():
    from pulumi.runtime import rpc
    out = []
    for label, resources in runs():
        for r in resources:
            if r.typ.startswith('gpuhost:index:') and r.custom:
                kind = rpc.unwrap_rpc_secret(r.inputs.get('kind'))
                out.append((label, r.name, registry.provider_for(r.typ, {'kind': kind}).__class__, r.inputs))
    return out


def test_every_input_the_program_registers_is_declared_by_its_class_with_its_type(registered):
    assert {cls for _, _, cls, _ in registered} == {
        c for name in registry.CLASSES for c in registry.serving_classes(name)}
    found = ['%s %s (%s): %s' % (label, name, cls.__name__, p)
             for label, name, cls, inputs in registered for p in fields.problems(inputs, cls.INPUTS)]
    assert found == [], '\n'.join(found)


def test_every_declared_input_is_set_by_some_run_of_the_program(registered):
    """An optional input no run sets is a declaration nothing checks (or one the program no longer hands over)."""
    never = ['%s.%s' % (cls.__name__, key) for cls in {c for _, _, c, _ in registered} for key in cls.INPUTS
             if not any(key in inputs for _, _, c, inputs in registered if c is cls)]
    assert never == []


def test_what_is_checked_fails_on_a_broken_case():
    from pulumi.runtime import rpc
    gpu = obj('TestGpu', address=S, numa=I, driver=optional(S))
    declared = {'path': S, 'vmid': I, 'ratio': N, 'on': B, 'gpus': arr(gpu), 'env': mapof(S), 'doc': ANY,
                'token': secret(optional(S)), 'note': optional(S)}
    good = {'path': '/etc/x', 'vmid': 200.0, 'ratio': 0.75, 'on': True, 'doc': {'any': [1, 'thing']},
            'gpus': [{'address': '0000:01:00.0', 'numa': 0.0}, {'address': '0000:11:00.0', 'numa': 1.0,
                                                                 'driver': None}],
            'env': {'A': 'b'}, 'token': {rpc._special_sig_key: rpc._special_secret_sig, 'value': 'tok-en'}}
    assert fields.problems(good, declared) == []
    broken = dict(good, vmid=200.5, on=1.0, extra='x', gpus=[{'address': 1.0, 'numa': 0.0, 'bus': 'x'}, {'numa': 0.0}],
                  env={'A': 1.0}, token='tok-en')
    del broken['path']
    assert fields.problems(broken, declared) == [
        'extra: not declared',
        'path: required, not set',
        'vmid: integer expected, got a fraction',
        'on: boolean expected, got float',
        'gpus[0].bus: not a field of TestGpu',
        'gpus[0].address: string expected, got float',
        'gpus[1].address: required field of TestGpu, not set',
        'env.A: string expected, got float',
        'token: declared secret, handed over in plain text',
    ]


def test_the_schema_types_every_property_and_states_required_secret_and_replace_on_changes():
    with open(provider_schema.PATH) as f:
        schema = json.load(f)
    for name in registry.CLASSES:
        res, classes = schema['resources'][registry.token(name)], registry.serving_classes(name)
        assert set(res['inputProperties']) == {k for c in classes for k in c.INPUTS}, name
        assert set(res['properties']) == set(res['inputProperties']) | {k for c in classes for k in c.OUTPUTS}, name
        replace = {k for k, p in res['inputProperties'].items() if p.get('replaceOnChanges')}
        assert replace == {k for c in classes for k in c.REPLACE}, name
        assert all(res['properties'][k].get('replaceOnChanges') for k in replace), name
        assert set(res['requiredInputs']) <= set(res['inputProperties']), name
    guest = schema['resources']['gpuhost:index:ProxmoxGuest']
    # A property one kind of guest has (a container's service, a VM's GPU binding) is required of neither.
    assert {'node', 'vmid', 'config'} <= set(guest['requiredInputs']) and not {
        'service', 'gpu_devices', 'gpu_binding', 'guard_gpus'} & set(guest['requiredInputs'])
    assert guest['inputProperties']['service'] == {'$ref': '#/types/gpuhost:index:Service'}
    assert schema['types']['gpuhost:index:Service']['properties']['vmid'] == {'type': 'integer'}
    secrets = {(token, k) for token, res in schema['resources'].items() for k, p in res['inputProperties'].items()
               if p.get('secret')}
    assert secrets == {('gpuhost:index:ModelWeights', 'token'), ('gpuhost:index:SglangUnit', 'api_key'),
                       ('gpuhost:index:SglangUnit', 'index_password'),
                       ('gpuhost:index:SglangUnit', 'installer_tokens'), ('gpuhost:index:NvidiaDriver', 'installer_tokens'),
                       ('gpuhost:index:SglangUnit', 'baseline_connection')}
    # The output of a secret input is secret too (the engine keeps it so: provider/__main__.py).
    assert all(schema['resources'][token]['properties'][k].get('secret') for token, k in secrets)
    refs = {ref for ref in json.dumps(schema).split('"$ref": "')[1:]}
    assert {r.split('"')[0] for r in refs} - {'pulumi.json#/Any'} == {
        '#/types/' + t for t in schema['types']}, 'an object type named but not defined, or defined and unused'


def test_two_declarations_of_one_object_type_must_agree(monkeypatch):
    from resources.host import HostFileProvider
    monkeypatch.setattr(HostFileProvider, 'INPUTS', dict(HostFileProvider.INPUTS, service=obj('Service', vmid=S)))
    with pytest.raises(provider_schema.Conflict, match='object type gpuhost:index:Service is declared twice'):
        provider_schema.schema()


def test_the_fleet_locks_password_is_in_each_hosts_provider_configuration_as_a_secret_and_nowhere_else():
    import config
    from lab import fleet
    from pulumi.runtime import rpc
    from tests.unit.program import run_program
    from tests.unit.test_runtime import FILES
    entries = [fleet.host_entry(i, fleet.host_spec(i, fleet.addresses(i)), '.lab-fleet/gpu%02d' % i) for i in (1, 2)]
    two = {k.split(':', 1)[1]: v for k, v in fleet.stack_config(entries).items()}
    two['rollout'] = dict(two.get('rollout') or {}, fleet_lock=FLEET_LOCK)
    resources = run_program(config.parse_fleet(two), FILES)['resources']
    providers = [r for r in resources if r.typ == 'pulumi:providers:gpuhost']
    assert len(providers) == 2
    for r in providers:
        assert rpc.is_rpc_secret(r.inputs['fleet_lock'])
        assert rpc.unwrap_rpc_secret(r.inputs['fleet_lock']) == {'password': FLEET_LOCK['password']}
    gated = [r for r in resources if isinstance(r.inputs.get('rollout'), dict)]
    assert gated and all(r.inputs['rollout']['fleet_lock']['group'] == 'lab' for r in gated)
    others = [r for r in resources if r.typ != 'pulumi:providers:gpuhost']
    assert FLEET_LOCK['password'] not in json.dumps([r.inputs for r in others], default=str)
