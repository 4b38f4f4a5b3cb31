"""The upgrade path from 0.1.0 (resources/state.py, "The upgrade path"): until a stack's first `up` moves its dynamic
resources onto the plugin, Pulumi's dynamic-provider host serves them - that up's refresh reads each through it - with
the provider it unpickles from the state: the class the plugin serves. Here a read goes through the real host, as the
engine sends it."""

import asyncio
import os
import subprocess
import sys

import grpc
import pytest
from pulumi.dynamic.dynamic import serialize_provider
from pulumi.runtime import rpc
from pulumi.runtime.proto import provider_pb2 as proto, provider_pb2_grpc

from resources.state import Failed, ObservedProvider
from transport.operator import OperatorError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
URN = 'urn:pulumi:upgrade::gpuhost::pulumi-python:dynamic/gpuhost:HostFile::host-file'


class Observed(ObservedProvider):
    """A host file as read() finds it; a file that cannot be read says so, as an operator's error."""
    DESIRED = ('content',)

    def current(self, props):
        if props.get('gone'):
            raise OperatorError('host pve-lab: /etc/modprobe.d/x.conf cannot be read (No such file or directory); '
                                'run `pulumi up` to write it again')
        return {'content': 'as found'}


@pytest.fixture(scope='module')
def host():
    """`python -m pulumi.dynamic` as the engine starts it, in the project's directory."""
    proc = subprocess.Popen([sys.executable, '-m', 'pulumi.dynamic'], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=REPO))
    try:
        port = int(proc.stdout.readline())
        with grpc.insecure_channel('127.0.0.1:%d' % port) as channel:
            stub = provider_pb2_grpc.ResourceProviderStub(channel)
            stub.Configure(proto.ConfigureRequest(args=wire({})), timeout=30)
            yield stub
    finally:
        proc.kill()
        proc.wait()


def wire(props):
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(rpc.serialize_properties(props, {}))
    finally:
        loop.close()


def read(stub, **props):
    props = dict(props, __provider=serialize_provider(Observed()), content='as declared')
    return stub.Read(proto.ReadRequest(id='host-file', urn=URN, properties=wire(props)), timeout=60)


def test_the_host_reads_a_resource_of_0_1_0_through_the_class_the_plugin_serves(host):
    got = rpc.deserialize_properties(read(host).inputs)
    assert got['content'] == 'as found'   # the drift, as the refresh then shows it


def test_a_failing_read_reaches_the_engine_as_the_plugin_says_it_one_line_no_frames(host):
    with pytest.raises(grpc.RpcError) as e:
        read(host, gone=True)
    assert e.value.details() == ('gpuhost: host pve-lab: /etc/modprobe.d/x.conf cannot be read (No such file or '
                                 'directory); run `pulumi up` to write it again\n')
    # Dressed there only: here, in the plugin's place, Failed is itself.
    assert (Failed.__module__, Failed.__name__) == ('resources.state', 'Failed')


def test_every_class_0_1_0_pickled_resolves_by_its_old_name_to_the_class_the_plugin_serves():
    """A 0.1.0 stack's pickles name components.<module>.<Class> (git show 986fe9e:components/); the classes are
    resources/'s now, and the old names answer with them - in a fresh process, as the dynamic-provider host
    unpickles."""
    from resources.state import RELEASE_0_1_0
    from tests.unit.fresh import fresh_json
    got = fresh_json('import importlib, json, sys\n'
                     'from resources.state import RELEASE_0_1_0\n'
                     'print(json.dumps([[old, name, getattr(importlib.import_module(old), name) is '
                     'getattr(importlib.import_module(new), name)] for old, (new, names) in RELEASE_0_1_0.items() '
                     'for name in names]))\n')
    assert len(got) == 11 and all(same for _, _, same in got), got
    assert sorted(RELEASE_0_1_0) == ['components.%s' % m for m in (
        'container', 'host', 'model', 'monitoring', 'pcimap', 'pve', 'sglang')]
