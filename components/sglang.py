"""SGLang as the program composes it: SglangService, the unit in the container and its smoke test as one component. The
unit's serving class is resources/sglang.py's."""

from __future__ import annotations

import json

import pulumi

from resources import model as model_mod, runtime
from resources.sglang import SglangUnit, SglangUnitProvider, expected_speculation, flag_groups, proof_inputs, \
    service_props, unit_text
from resources.state import moved
from transport import remote


def smoke_test(name, d, connection, unit, key, unit_text_declared, container_identity):
    """One real chat completion through the OpenAI API, from the host, after every change of the unit
    (or of the container it runs in): an action, not state, so pulumi-command's remote.Command runs it
    (host key pinned; the API key on stdin, a secret). Its latency and token counts become outputs."""
    import shlex
    from pulumi_command import remote as command
    connection = pulumi.Output.from_input(connection)
    conn = command.ConnectionArgs(
        host=connection.apply(lambda c: c['host']), port=connection.apply(lambda c: float(c['port'])),
        user=connection.apply(lambda c: c['user']), host_key=connection.apply(lambda c: c['host_key']),
        # One of the two (transport/agent.py smoke_connection): the key's text, or the agent that holds it.
        private_key=connection.apply(lambda c: c.get('private_key')),
        agent_socket_path=connection.apply(lambda c: c.get('agent_socket_path')),
        per_dial_timeout=10, dial_error_limit=6)
    run = 'bash -c %s smoke_test.sh %s %s' % (shlex.quote(remote.script('smoke_test.sh')),
                                             shlex.quote(service_props(d)['endpoint']),
                                             shlex.quote(d.sglang.served_model_name))
    return command.Command('%s-smoke-test' % name, connection=conn, create=run,
                           stdin=pulumi.Output.secret(key) if key else '',
                           # Declared values (known at preview): a new unit or container runs it again, and so
                           # does a new NVIDIA user space or CUDA (the unit restarts with them).
                           triggers=[remote.sha256_hex(unit_text_declared), container_identity] + (
                               [json.dumps(runtime.declared(d), sort_keys=True)] if d.runtime else []) + (
                               # A new model revision restarts the unit: it is tested again.
                               ['%s@%s' % (d.model.id, d.model.revision)] if d.model else []),
                           # An action, replaced (run again) whenever its triggers change: never protected,
                           # whatever its parent is.
                           opts=pulumi.ResourceOptions(parent=unit, depends_on=[unit], protect=False))


def smoke_summary(stdout: str) -> dict:
    """The smoke test's line as an output: latency and usage (the answer's text is not kept)."""
    try:
        doc = json.loads(stdout.strip().splitlines()[-1])
        resp = doc.get('response') or {}
        usage = resp.get('usage') or {}
        return {'latency_ms': doc.get('latency_ms'), 'model': resp.get('model'),
                'prompt_tokens': usage.get('prompt_tokens'), 'completion_tokens': usage.get('completion_tokens'),
                'finish_reason': ((resp.get('choices') or [{}])[0]).get('finish_reason')}
    except (ValueError, IndexError, AttributeError):
        return {'error': 'unreadable answer: %s' % stdout[-200:]}


class SglangService(pulumi.ComponentResource):
    """Outputs: unit_sha256, resolved (speculation etc. as SGLang reports it), version, active."""

    def __init__(self, name, deployment, connection, container, opts=None, rollout=None, fleet_host=None,
                 runtime_files=None, model=None, model_files=None, host_boot_id=None, canary=None,
                 baseline_connection=None):
        """runtime_files: what config.load_stack read for gpuhost:runtime.python (lock, patches, index password).
        model: the ModelWeights resource (resources/model.py) the unit depends on; model_files: what load_stack
        read for gpuhost:model (checksums). host_boot_id: the host's boot as its status last read it (after this
        run's own reboot, the new one): a boot the GPUs were not proven in is proven again."""
        super().__init__('gpuhost:index:SglangService', name, None, opts)
        d = deployment
        s = d.sglang
        self.env = runtime.environment(d, runtime_files)
        self.unit = unit_text(d, self.env)
        self.endpoint = service_props(d)['endpoint']
        key = s.api_key.get_secret_value() if s.api_key else None
        password = (runtime_files or {}).get('index_password')
        tokens = runtime.installer_tokens(d)
        expect = expected_speculation(d)
        if d.model:
            # The weights it loaded are the declared revision's (a switch of revision is checked, not assumed).
            expect['model_path'] = d.model.container_dir(s.model_path)
        props = dict(service_props(d), expect=expect,
                     api_key=pulumi.Output.secret(key) if key else None,
                     container_uid=container.identity,
                     unit=self.unit, launch_args=flag_groups(d.launch_args()), active=True, enabled=True, dropins=[],
                     adopt=d.container.adopt,
                     cuda_home=s.cuda_home, runtime=runtime.declared(d), env=self.env,
                     proof=proof_inputs(d, self.env),
                     host_boot_id=host_boot_id if d.sglang.proof.enabled else None,
                     install=runtime.install_inputs(d, runtime_files),
                     model=model_mod.declared(d), model_check=model_mod.unit_check(d, model_files),
                     # Reaches pip only as a root-only netrc file in the container (ct_env_build.py).
                     index_password=pulumi.Output.secret(password) if password else None,
                     # The installers' mirror logins: to the host's download job on stdin (runtime.fetch_installers).
                     installer_tokens=pulumi.Output.secret(tokens) if tokens else None,
                     **dict.fromkeys(SglangUnitProvider.OUTPUTS))
        if rollout:
            # Not compared by diff (not DESIRED): where this host stands in the fleet's rollout, for the
            # message when its restart fails. Adding or removing a host changes no other host's unit.
            props['rollout'] = rollout
        if fleet_host:
            props['fleet_host'] = fleet_host
        if canary:
            # The fleet's canary (gpuhost:rollout.canary): this host's unit is judged against the baseline's.
            props['canary'] = canary
        if baseline_connection is not None:
            # baseline: restart - the baseline host's connection, for its restart at the canary's moment (a secret).
            props['baseline_connection'] = baseline_connection
        self.service = SglangUnit('%s-unit' % name, props,
                                pulumi.ResourceOptions(parent=self, depends_on=[container] +
                                                       ([model] if model is not None else []),
                                                       protect=d.container.protect))
        self.smoke = smoke_test(name, d, connection, self.service, key, self.unit, container.identity)
        self.resolved = self.service.resolved
        self.version = s.version
        self.active = self.service.active
        self.enabled = self.service.enabled
        self.observed_at = self.service.observed_at
        self.runtime_facts = self.service.runtime_facts
        self.proven = self.service.proven
        self.canary_verdict = self.service.canary_verdict
        self.register_outputs({'resolved': self.resolved, 'active': self.active, 'enabled': self.enabled})


def __getattr__(name):
    """Release 0.1.0's name of a serving class, now resources/'s (resources/state.py, RELEASE_0_1_0)."""
    return moved(__name__, name)
