"""Issue 28: a stack deployed by the last release with dynamic providers only (0.1.0, CHANGELOG.md) moves onto the
gpuhost provider plugin with nothing replaced and nothing restarted - the way Pulumi's own providers test their
upgrades: state recorded with the previous version, then preview and up with the new one."""

import json

import glob
import os

from tests.lablib import PER_HOST_FILES, PER_HOST_RELEASE, PLUGIN_FILES, PLUGIN_RELEASE, previous_release

STACK = 'upgrade'


def test_a_stack_deployed_with_dynamic_providers_moves_onto_the_plugin_without_a_change_on_the_host(lab):
    lab.write_stack(STACK, lab.stack_config())
    with previous_release(lab):
        lab.pulumi('up', '--yes', '--skip-preview', stack=STACK, timeout=900)
    before = json.loads(lab.pulumi('stack', 'export', stack=STACK).stdout)
    dynamic = [r['urn'] for r in before['deployment']['resources'] if r['type'].startswith('pulumi-python:dynamic/')]
    assert len(dynamic) >= 10, 'the previous release did not deploy its dynamic resources: %s' % dynamic
    starts, digest = lab.unit_starts(), lab.host_digest_beside_upgrade()

    # The plan: the host's provider instance is new; every resource is the one deployed, moved by its alias. The
    # smoke test reaches the host through an SSH agent now (the lab keeps its key in a file): a new connection, so
    # it runs again; the collector's script and config are this release's (lablib.UPGRADE_REWRITES).
    plan = lab.preview_json(STACK)
    ops = {s['urn']: s['op'] for s in plan['steps'] if s['op'] != 'same'}
    created = {u: op for u, op in ops.items() if '::pulumi:providers:gpuhost::' in u}
    assert list(created.values()) == ['create'], ops
    assert {u.rsplit('::', 1)[-1]: op for u, op in ops.items() if u not in created} == {
        'sglang-smoke-test': 'update', 'collector': 'update'}, ops

    lab.pulumi('up', '--yes', '--skip-preview', '--refresh', stack=STACK)
    assert lab.unit_starts() == starts, 'the upgrade restarted SGLang'
    assert lab.host_digest_beside_upgrade() == digest, 'the upgrade changed the host'
    digest = lab.host_digest()
    after = json.loads(lab.pulumi('stack', 'export', stack=STACK).stdout)['deployment']['resources']
    assert not [r['type'] for r in after if r['type'].startswith('pulumi-python:dynamic')]
    moved = {r['urn'].rsplit('::', 1)[-1] for r in after if r['type'].startswith('gpuhost:index:') and r.get('custom')}
    assert moved == {u.rsplit('::', 1)[-1] for u in dynamic}
    # That run's refresh read each resource through the provider it was deployed with (the dynamic-provider host,
    # which hands its pickled self back); the next refresh reads through the plugin, and the pickles are gone.
    lab.pulumi('up', '--yes', '--refresh', '--expect-no-changes', stack=STACK)
    assert lab.unit_starts() == starts and lab.host_digest() == digest
    state = lab.pulumi('stack', 'export', stack=STACK).stdout
    left = ['%s %s' % (r['urn'].rsplit('::', 1)[-1], part) for r in json.loads(state)['deployment']['resources']
            for part in ('inputs', 'outputs') if '__provider' in (r.get(part) or {})]
    assert '__provider' not in state, 'a pickled provider is still in the state: %s' % left


def test_a_credential_kept_in_a_file_leaves_the_state_of_a_stack_the_plugin_release_deployed(lab):
    """Issue 44: the plugin as main had it before (provider 0.2.0, unreleased) put the host's SSH key and root@pam's password into its provider's
    configuration, and the key into the smoke test's connection, also where the stack keeps them in files (the lab
    does): encrypted, but `stack export --show-secrets` printed both. After an `up` with this release neither is
    in the export, nor in the backend's files - also after a refresh - and the host and SGLang stay as they were.
    (On the stack the test above left: deployed again by the plugin release first.)"""
    with open(os.path.join(lab.project, '.lab', 'ssh', 'id_ed25519')) as f:
        key_lines = [line for line in f.read().splitlines() if len(line) > 16 and not line.startswith('-----')]
    with open(lab.info['pve']['password_file']) as f:
        password = f.read().strip()
    assert key_lines and len(password) >= 8

    def leaked():
        text = lab.pulumi('stack', 'export', '--show-secrets', stack=STACK).stdout
        for path in glob.glob(os.path.join(os.path.dirname(lab.project), 'state', '**'), recursive=True):
            if os.path.isfile(path):
                with open(path, errors='replace') as f:
                    text += f.read()
        return sorted({'the SSH key' for line in key_lines if line in text} |
                      ({'the API password'} if password in text else set()))

    with previous_release(lab, PLUGIN_RELEASE, PLUGIN_FILES):
        lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    assert leaked() == ['the API password', 'the SSH key'], 'the plugin release no longer leaks: wrong release?'
    starts, digest = lab.unit_starts(), lab.host_digest_beside_upgrade()
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    assert leaked() == []
    lab.pulumi('refresh', '--yes', stack=STACK)
    assert leaked() == []
    lab.pulumi('up', '--yes', '--expect-no-changes', stack=STACK)
    assert lab.unit_starts() == starts and lab.host_digest_beside_upgrade() == digest


def test_a_stack_the_per_host_plugin_deployed_moves_onto_one_shared_process_without_a_change(lab):
    """Issue 46: main before issues 45 and 46 (one plugin process per host and pass, the rollout order as dependency
    edges) deployed the stack; this release serves it from one process per pass and holds the order in the plugin.
    Nothing to plan, nothing changed on the host, SGLang not restarted - also through a refresh. (On the stack the
    tests above left.)"""
    with previous_release(lab, PER_HOST_RELEASE, PER_HOST_FILES):
        lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    starts, digest = lab.unit_starts(), lab.host_digest_beside_upgrade()
    # Nothing to plan but this release's collector (lablib.UPGRADE_REWRITES), rewritten once.
    plan = lab.preview_json(STACK)
    assert {s['urn'].rsplit('::', 1)[-1]: s['op'] for s in plan['steps'] if s['op'] != 'same'} == {
        'collector': 'update'}
    lab.pulumi('up', '--yes', '--refresh', stack=STACK)
    lab.pulumi('up', '--yes', '--refresh', '--expect-no-changes', stack=STACK)
    assert lab.unit_starts() == starts, 'the upgrade restarted SGLang'
    assert lab.host_digest_beside_upgrade() == digest, 'the upgrade changed the host'
