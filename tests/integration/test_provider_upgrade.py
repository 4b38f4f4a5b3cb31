"""Issue 28: a stack deployed by the last release with dynamic providers only (0.1.0, CHANGELOG.md) moves onto the
gpuhost provider plugin with nothing replaced and nothing restarted - the way Pulumi's own providers test their
upgrades: state recorded with the previous version, then preview and up with the new one."""

import json

from tests.lablib import previous_release

STACK = 'upgrade'


def test_a_stack_deployed_with_dynamic_providers_moves_onto_the_plugin_without_a_change_on_the_host(lab):
    lab.write_stack(STACK, lab.stack_config())
    with previous_release(lab):
        lab.pulumi('up', '--yes', '--skip-preview', stack=STACK, timeout=900)
    before = json.loads(lab.pulumi('stack', 'export', stack=STACK).stdout)
    dynamic = [r['urn'] for r in before['deployment']['resources'] if r['type'].startswith('pulumi-python:dynamic/')]
    assert len(dynamic) >= 10, 'the previous release did not deploy its dynamic resources: %s' % dynamic
    starts, digest = lab.unit_starts(), lab.host_digest()

    # The plan: the host's provider instance is new; every resource is the one deployed, moved by its alias.
    plan = lab.preview_json(STACK)
    ops = {s['urn']: s['op'] for s in plan['steps'] if s['op'] != 'same'}
    assert ops == {u: 'create' for u in ops if '::pulumi:providers:gpuhost::' in u} and len(ops) == 1, ops

    lab.pulumi('up', '--yes', '--skip-preview', '--refresh', stack=STACK)
    assert lab.unit_starts() == starts, 'the upgrade restarted SGLang'
    assert lab.host_digest() == digest, 'the upgrade changed the host'
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
