"""Pulumi mocks for the unit tests, and the program itself (__main__.py) run under them: what it declares and
exports for a stack's config, with no engine and no host. One set of mocks per process (pulumi.runtime.set_mocks
is global): every module that needs them imports them from here."""

import os
import runpy
import signal

import pulumi

from tests.lablib import REPO

CREATED = []


class Mocks(pulumi.runtime.Mocks):
    def new_resource(self, args):
        CREATED.append(args)
        state = dict(args.inputs)
        if args.typ == 'gpuhost:index:HostStatus' and state.get('boot_id') is None:
            # The boot its apply read on the host (the SGLang unit's host_boot_id).
            state['boot_id'] = '00000000-0000-4000-8000-000000000001'
        if args.typ == 'command:remote:Command':
            # A command's outputs after it ran (what the program reads of the smoke test).
            state.setdefault('stdout', '')
            state.setdefault('stderr', '')
        return args.name + '-id', state

    def call(self, args):
        return {}


pulumi.runtime.set_mocks(Mocks(), preview=False)

CONN = {'host': 'h', 'port': 22, 'user': 'root', 'private_key': 'k', 'host_key': 'ssh-ed25519 AAAA', 'timeout': 5}
API = {'host': 'h', 'port': 8006, 'user': 'root@pam', 'password': 'p', 'ca_cert': 'pem', 'timeout': 5}


def run_program(fleet, runtime_files, model_files=None) -> dict:
    """__main__.py as the engine runs it, for `fleet` (config.parse_fleet of a stack's gpuhost keys), to the end of
    every registration: {'resources': [MockResourceArgs, ...], 'exports': {name: value}}. Only what needs the lab
    is replaced: the files the config names (config.load_stack: the connection, `runtime_files` as
    runtime_inputs(), `model_files` as the model's checksums and token - none by default), the preflight's host
    checks (components/preflight.py run) and the SSH agent a key kept in a file reaches the smoke test through
    (transport/agent.py start)."""
    import config
    from transport import agent
    from components import preflight
    model_files = model_files or {'checksums': None, 'token': None}
    inputs = [(CONN, API, runtime_files, model_files) for _ in fleet.hosts]
    exports = {}

    @pulumi.runtime.test
    def run():
        runpy.run_path(os.path.join(REPO, '__main__.py'), run_name='gpuhost_program')

    saved = (config.load_stack, preflight.run, pulumi.export, signal.getsignal(signal.SIGINT),
             pulumi.runtime.settings.grpc_error_to_exception, agent.start)
    config.load_stack = lambda _root: (fleet, inputs, [])
    preflight.run = lambda *_args, **_kwargs: None
    agent.start = lambda *_args: None
    pulumi.export = exports.__setitem__
    CREATED.clear()
    try:
        run()
    finally:
        # The program sets its SIGINT handler and the SDK's gRPC error hook for the process it owns: not pytest's.
        config.load_stack, preflight.run, pulumi.export = saved[:3]
        signal.signal(signal.SIGINT, saved[3])
        pulumi.runtime.settings.grpc_error_to_exception = saved[4]
        agent.start = saved[5]
    return {'resources': list(CREATED), 'exports': exports}
