"""The gpuhost provider plugin (provider/) as the CLI starts it: its version, its schema, and resources served by
the classes that served them as dynamic resources - with what a dynamic resource left in its state ignored, and
errors as one line."""

import json
import os
import socket
import subprocess

import grpc
import pytest
from pulumi.runtime import rpc
from pulumi.runtime.proto import provider_pb2 as proto
from pulumi.runtime.proto import provider_pb2_grpc
from google.protobuf import empty_pb2

from provider import registry
from tests.lablib import REPO
from tools import provider_schema


def test_the_committed_schema_is_the_generated_one():
    with open(provider_schema.PATH) as f:
        assert f.read() == provider_schema.text(), 'provider/schema.json is stale: run make docs'


def test_every_custom_resource_of_the_program_is_served_by_the_plugin_and_secret_inputs_are_marked(lab_program):
    custom = {r.typ for r in lab_program['resources'] if r.custom and not r.typ.startswith('pulumi:providers:')
              and not r.typ.startswith('command:')}
    assert custom == {registry.token(n) for n in registry.CLASSES}
    with open(provider_schema.PATH) as f:
        schema = json.load(f)
    assert set(schema['resources']) == custom
    # The host's SSH connection and Proxmox login are the provider instance's configuration (secrets, once per
    # host), in no resource's inputs.
    assert schema['provider']['inputProperties'] == {'api': {'$ref': 'pulumi.json#/Any', 'secret': True},
                                                     'connection': {'$ref': 'pulumi.json#/Any', 'secret': True}}
    for token, res in schema['resources'].items():
        assert not {'api', 'connection'} & set(res['inputProperties']), token
    assert schema['resources']['gpuhost:index:SglangUnit']['inputProperties']['api_key']['secret'] is True
    providers = [r for r in lab_program['resources'] if r.typ == 'pulumi:providers:gpuhost']
    assert len(providers) == 1 and set(providers[0].inputs) >= {'api', 'connection'}
    # The lab stack keeps its SSH key and API password in files: the configuration names them (absolute paths),
    # the plugin reads them; their text is in no input. The smoke test reaches the host through an SSH agent.
    conn, api = (rpc.unwrap_rpc_secret(providers[0].inputs[k]) for k in ('connection', 'api'))
    conn, api = (v.get('value', v) if isinstance(v, dict) else v for v in (conn, api))
    assert 'private_key' not in conn and conn['private_key_file'].endswith('/.lab/ssh/id_ed25519'), conn
    assert 'password' not in api and api['password_file'].endswith('/.lab/secrets/pve-password'), api
    smoke = [r.inputs['connection']['value'] for r in lab_program['resources'] if r.typ == 'command:remote:Command']
    assert len(smoke) == 1 and 'privateKey' not in smoke[0], smoke
    from transport.agent import agent_dir
    assert smoke[0]['agentSocketPath'].startswith(agent_dir() + '/'), smoke
    assert not [r.name for r in lab_program['resources'] if r.typ.startswith('gpuhost:index:') and r.custom
                and {'api', 'connection'} & set(r.inputs)]


@pytest.fixture(scope='module')
def lab_program():
    import config
    from tests.unit.config.test_config import lab_data
    from tests.unit.program import run_program
    from tests.unit.test_runtime import FILES
    data = lab_data()
    # The host's driver declared too (gpuhost:nvidia.driver; the lab stack leaves it the operator's): every type.
    data['nvidia'] = {'driver': dict(data['runtime'].pop('nvidia'))}
    return run_program(config.parse_fleet(data), FILES)


def started(cache):
    """The plugin started as the CLI starts it: its executable with the engine's address (here a listener that
    only has to be there: the plugin exits when the engine's address stops answering); its error files under
    `cache`."""
    engine = socket.socket()
    engine.bind(('127.0.0.1', 0))
    engine.listen(16)
    proc = subprocess.Popen([os.path.join(REPO, 'provider', 'pulumi-resource-gpuhost'),
                             '127.0.0.1:%d' % engine.getsockname()[1]], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, XDG_CACHE_HOME=str(cache)))
    try:
        port = int(proc.stdout.readline())
        with grpc.insecure_channel('127.0.0.1:%d' % port) as channel:
            yield provider_pb2_grpc.ResourceProviderStub(channel), proc
    finally:
        proc.kill()
        proc.wait()
        engine.close()


@pytest.fixture(scope='module')
def plugin(tmp_path_factory):
    yield from started(tmp_path_factory.mktemp('cache'))


@pytest.fixture
def fresh_plugin(tmp_path):
    """A plugin process of its own: its first call is the one under test."""
    yield from started(tmp_path)


def props(d):
    import asyncio
    return asyncio.new_event_loop().run_until_complete(rpc.serialize_properties(d, {}))


URN = 'urn:pulumi:lab::gpuhost::gpuhost:index:ProxmoxHost$gpuhost:index:HostFile::host-nvidia-options'
CONN = {'host': '127.0.0.1', 'port': 22, 'user': 'root', 'private_key': 'k', 'host_key': 'ssh-ed25519 AAAA'}


def test_the_plugin_reports_its_version_and_schema(plugin):
    stub, _ = plugin
    with open(os.path.join(REPO, 'provider', 'VERSION')) as f:
        assert stub.GetPluginInfo(empty_pb2.Empty()).version == f.read().strip()
    with open(provider_schema.PATH) as f:
        assert json.loads(stub.GetSchema(proto.GetSchemaRequest(version=0)).schema) == json.load(f)


def test_a_resource_moved_from_a_dynamic_provider_diffs_as_before_and_its_pickle_is_ignored(plugin):
    stub, _ = plugin
    file = {'connection': CONN, 'path': '/etc/modprobe.d/gpuhost-nvidia.conf', 'mode': '0644', 'post': 'initramfs',
            'content': 'options nvidia NVreg_DmaRemapPeerMmio=1\n'}
    old = dict(file, __provider='gASVpickled', sha256='x')
    same = stub.Diff(proto.DiffRequest(urn=URN, id='x', olds=props(old), news=props(file)))
    assert same.changes == proto.DiffResponse.DIFF_NONE
    edited = stub.Diff(proto.DiffRequest(urn=URN, id='x', olds=props(old),
                                         news=props(dict(file, content='options nvidia NVreg_DmaRemapPeerMmio=0\n'))))
    assert edited.changes == proto.DiffResponse.DIFF_SOME and not edited.replaces


def kinds(diff) -> dict:
    return {k: (proto.PropertyDiff.Kind.Name(v.kind), v.inputDiff) for k, v in diff.detailedDiff.items()}


def test_a_preview_names_each_property_that_changes_and_replace_for_a_create_only_one(plugin):
    """What `preview --diff` shows of an update is what Diff details: each property that changes, and whether its
    change replaces the resource (the class's REPLACE: a host file's path, a guest's create-only keys)."""
    stub, _ = plugin
    file = {'path': '/etc/modprobe.d/gpuhost-nvidia.conf', 'mode': '0644', 'post': 'initramfs', 'adopt': False,
            'content': 'options nvidia NVreg_DmaRemapPeerMmio=1\n', 'inventory': [], 'blackwell_ids': ['10de:2bb5']}
    held = dict(file, sha256='x', applied='t')   # the state after the last `up`: the inputs as observed, the facts

    def diff(news, olds=held, urn=URN, old_inputs=file):
        return stub.Diff(proto.DiffRequest(urn=urn, id='x', olds=props(olds), old_inputs=props(old_inputs),
                                           news=props(news)))
    moved = diff(dict(file, path='/etc/modprobe.d/gpuhost.conf'))
    assert moved.changes == proto.DiffResponse.DIFF_SOME and list(moved.replaces) == ['path'], moved
    assert moved.hasDetailedDiff and kinds(moved) == {'path': ('UPDATE_REPLACE', False)} and moved.diffs == ['path']
    # In place: a compared key against what the host had, an input not compared against the last run's.
    edited = diff(dict(file, content='options nvidia NVreg_DmaRemapPeerMmio=0\n', blackwell_ids=['10de:2bb1']))
    assert not edited.replaces and kinds(edited) == {'content': ('UPDATE', False), 'blackwell_ids': ('UPDATE', True)}
    # Drift: the last refresh found the file gone - it is written again.
    assert kinds(diff(file, {k: v for k, v in held.items() if k != 'content'})) == {'content': ('ADD', False)}
    # Nothing for the host: no update, and nothing detailed.
    same = diff(dict(file, blackwell_ids=['10de:2bb1']))
    assert same.changes == proto.DiffResponse.DIFF_NONE and not same.hasDetailedDiff and not same.detailedDiff
    # A container's create-only key (unprotected: a protected one is refused with the way out, test_pve.py).
    guest = {'node': 'pve-lab', 'kind': 'lxc', 'vmid': 200, 'config': {'cores': 32}, 'start': True, 'raw_lxc': {},
             'create': {'ostemplate': 'local:vztmpl/debian-12.tar.zst', 'rootfs': 'local-lvm:200', 'unprivileged': 1},
             'protect': False, 'adopt': False}
    urn = 'urn:pulumi:lab::gpuhost::gpuhost:index:GpuContainer$gpuhost:index:ProxmoxGuest::container-lxc'
    replaced = diff(dict(guest, create=dict(guest['create'], unprivileged=0), config={'cores': 16}),
                    dict(guest, status='running'), urn, guest)
    assert list(replaced.replaces) == ['create'] and replaced.deleteBeforeReplace, replaced
    assert kinds(replaced) == {'create': ('UPDATE_REPLACE', False), 'config': ('UPDATE', False)}


def test_an_error_reaches_the_engine_as_one_line_without_python_frames(plugin):
    stub, proc = plugin
    with pytest.raises(grpc.RpcError) as e:
        # A read of a host that does not answer: the provider's own message, not a traceback.
        stub.Read(proto.ReadRequest(urn=URN, id='x', properties=props({
            'connection': dict(CONN, port=1, timeout=2), 'path': '/etc/x', 'mode': '0644', 'post': 'none',
            'content': ''})), timeout=60)
    text = e.value.details()
    assert text.startswith('gpuhost: ') and 'Traceback' not in text and 'File "' not in text, text
    assert proc.poll() is None, 'the plugin died of an error'
    with pytest.raises(grpc.RpcError) as e:
        stub.Diff(proto.DiffRequest(urn=URN.replace('HostFile', 'NoSuchThing'), id='x', olds=props({}),
                                    news=props({})))
    assert 'the gpuhost provider serves no resource type' in e.value.details()


def test_check_of_a_resource_the_stack_does_not_hold_sees_no_olds_with_the_connection_configured(plugin):
    # (found by test_adopt on the lab: the host's connection given to empty olds made every new guest look held,
    # so adoption never happened and `up` tried to create the running container)
    stub, _ = plugin
    stub.Configure(proto.ConfigureRequest(args=props({'connection': dict(CONN, port=1, timeout=2)})))
    file = {'path': '/etc/modprobe.d/gpuhost-nvidia.conf', 'mode': '0644', 'post': 'initramfs', 'adopt': True,
            'content': 'options nvidia NVreg_DmaRemapPeerMmio=1\n'}
    with pytest.raises(grpc.RpcError) as e:
        # Adopting a host file reads the host first (here one that does not answer): only a resource new to the
        # stack does that.
        stub.Check(proto.CheckRequest(urn=URN, olds=props({}), news=props(file)), timeout=60)
    assert 'gpuhost: ' in e.value.details(), e.value.details()
    held = stub.Check(proto.CheckRequest(urn=URN, olds=props(file), news=props(file)), timeout=60)
    assert held.inputs


def one_line(text: str):
    assert text.startswith('gpuhost: ') and '\n' not in text.strip(), text
    assert 'Traceback' not in text and 'File "' not in text, text


def test_the_first_call_of_a_fresh_plugin_with_an_unknown_type_is_one_line(fresh_plugin):
    stub, _ = fresh_plugin
    with pytest.raises(grpc.RpcError) as e:
        stub.Check(proto.CheckRequest(urn=URN.replace('HostFile', 'NoSuchThing'), olds=props({}), news=props({})))
    one_line(e.value.details())
    assert 'the gpuhost provider serves no resource type gpuhost:index:NoSuchThing (its types: ' in e.value.details()


def test_the_first_call_of_a_fresh_plugin_with_a_property_that_does_not_deserialize_is_one_line(fresh_plugin, tmp_path):
    from google.protobuf import struct_pb2
    stub, _ = fresh_plugin
    news = struct_pb2.Struct()
    news.update({'path': '/etc/x', 'content': {rpc._special_sig_key: 'no-such-signature'}})
    with pytest.raises(grpc.RpcError) as e:
        stub.Check(proto.CheckRequest(urn=URN, olds=props({}), news=news))
    text = e.value.details()
    one_line(text)
    assert text.startswith('gpuhost: unexpected AssertionError: Unrecognized signature'), text
    # The traceback is in a file of its own under the user's cache, named in the line.
    kept = text.rsplit('Python traceback in ', 1)[1].rstrip(')')
    assert kept.startswith(str(tmp_path / 'gpuhost' / 'errors' / 'error-')) and 'File "' in open(kept).read()


def test_a_secret_keyed_value_the_engine_cannot_take_is_named_by_key_and_type_only(tmp_path, monkeypatch):
    from transport.errors import remember
    from provider import __main__ as plugin_main
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
    api_key = 'sk-9d1f3c7e-b2a6-q8x4'
    remember({'api_key': api_key})
    with pytest.raises(plugin_main.Unserializable) as e:
        plugin_main.wire({'port': 30000, 'api_key': api_key.encode()})
    text = plugin_main.one_line(e.value)
    assert text.startswith("gpuhost: unexpected Unserializable: property 'api_key' holds a value of type bytes")
    assert not [api_key[i:i + 6] for i in range(len(api_key) - 5) if api_key[i:i + 6] in text], text


GOOD_API = {'host': '127.0.0.1', 'port': 8006, 'user': 'root@pam', 'password': 'Pa55-not-shown', 'timeout': 30}


def test_checkconfig_refuses_a_configuration_without_its_connection_naming_the_key(fresh_plugin):
    stub, _ = fresh_plugin
    urn = 'urn:pulumi:lab::gpuhost::pulumi:providers:gpuhost::gpuhost'
    got = stub.CheckConfig(proto.CheckRequest(urn=urn, olds=props({}), news=props({'api': GOOD_API})))
    failures = {f.property: f.reason for f in got.failures}
    assert 'connection is required and missing (from gpuhost:host.ssh)' in failures['connection'], failures
    # The login: its CA missing, its password not text - the password never shown.
    assert failures['api.ca_cert'].startswith('api.ca_cert is required and missing (from gpuhost:host.api.ca_cert')
    bad = dict(GOOD_API, password='Pa55\x01-not-shown', port=70000)
    got = stub.CheckConfig(proto.CheckRequest(urn=urn, olds=props({}), news=props({'api': bad})))
    failures = {f.property: f.reason for f in got.failures}
    assert 'a secret value (not shown)' in failures['api.password'] and 'not-shown' not in str(failures)
    assert failures['api.port'].startswith('api.port (from gpuhost:host.api.port): 70000 is not valid'), failures


def test_checkconfig_reads_a_credential_named_by_file_and_names_the_file_it_cannot_read(fresh_plugin, tmp_path):
    stub, _ = fresh_plugin
    urn = 'urn:pulumi:lab::gpuhost::pulumi:providers:gpuhost::gpuhost'
    missing = str(tmp_path / 'gone' / 'pve-password')
    api = {k: v for k, v in GOOD_API.items() if k != 'password'}
    got = stub.CheckConfig(proto.CheckRequest(urn=urn, olds=props({}), news=props({'api': dict(
        api, password_file=missing, password_stamp='')})))
    failures = {f.property: f.reason for f in got.failures}
    assert failures['api.password_file'].startswith('gpuhost:host.api.password_file (%s): cannot read %s' % (
        missing, missing)), failures
    assert '`refresh` and `destroy` use the path the state holds: put the file back there' in failures[
        'api.password_file']
    # A file that is there is read: its text is checked as the password would be (here: a control character).
    (tmp_path / 'pw').write_text('Pa55\x01-not-shown\n')
    got = stub.CheckConfig(proto.CheckRequest(urn=urn, olds=props({}), news=props({'api': dict(
        api, password_file=str(tmp_path / 'pw'), password_stamp='')})))
    failures = {f.property: f.reason for f in got.failures}
    assert 'a secret value (not shown)' in failures['api.password'] and 'not-shown' not in str(failures)


def test_configure_with_a_credential_file_gone_says_so_in_one_line_without_a_traceback_file(fresh_plugin, tmp_path):
    """`refresh` and `destroy` configure the provider from the state's paths (no CheckConfig first): a file moved
    away is the operator's to put back - one line naming it and the way out, not an unexpected error."""
    stub, _ = fresh_plugin
    missing = str(tmp_path / 'moved-away')
    with pytest.raises(grpc.RpcError) as e:
        stub.Configure(proto.ConfigureRequest(args=props({'connection': dict(CONN), 'api': dict(
            {k: v for k, v in GOOD_API.items() if k != 'password'}, password_file=missing, password_stamp='')})))
    text = e.value.details()
    one_line(text)
    assert text.startswith('gpuhost: gpuhost:host.api.password_file (%s): cannot read %s' % (missing, missing)), text
    assert 'unexpected' not in text and 'put the file back there' in text
    assert not (tmp_path / 'gpuhost' / 'errors').exists()
