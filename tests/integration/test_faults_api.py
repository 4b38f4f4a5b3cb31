"""Proxmox API faults during an `up` that changes the container's config: each ends in one line that
names the request (guest, operation), the cause and what to do - no traceback - nothing is half
applied, and once the fault is gone the re-run converges."""

import pytest

pytestmark = pytest.mark.slow
STACK = 'apifault'


@pytest.fixture(scope='module')
def base(lab):
    cfg = lab.stack_config()
    lab.write_stack(STACK, cfg)
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    return cfg


def with_cores(cfg, cores):
    import copy
    cfg = copy.deepcopy(cfg)
    cfg['gpuhost:container']['cores'] = cores
    return cfg


FAULTS = [
    ('lost quorum', {'quorate': False},
     ['updating container 200 on pve-lab: Proxmox answered 500', 'no quorum', 'pvecm status']),
    ('guest locked by a backup', {'lock': (200, 'backup')},
     ['updating container 200 on pve-lab', 'CT is locked (backup)', 'wait for it to finish']),
    ('config lock held', {'hold_config_lock': (200, None)},
     ['updating container 200 on pve-lab', "can't lock file", 're-run when it has finished']),
    ('node offline', {'node_online': ('pve-lab', False)},
     ['gpuhost:host.node: node pve-lab is offline']),
    ('API unreachable', {'network': {'drop_rate': 1.0, 'seed': 1}},
     ['cannot reach the Proxmox API at', 'RemoteDisconnected', 'nothing was changed']),
]


@pytest.mark.parametrize('name,ops,messages', FAULTS, ids=[f[0] for f in FAULTS])
def test_api_fault_is_one_clear_line_and_the_rerun_converges(lab, base, name, ops, messages):
    lab.write_stack(STACK, with_cores(base, 16))
    lab.pve_set(**ops)
    try:
        res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
    finally:
        lab.pve_set(reset=True, unlock=200, release_config_lock=200)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out[-3000:]
    for text in messages:
        assert text in out, 'missing %r:\n%s' % (text, out[-3000:])
    assert lab.node().lxc(200).config.get()['cores'] == 32, 'half applied'
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    assert lab.node().lxc(200).config.get()['cores'] == 16
    lab.write_stack(STACK, base)
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    lab.pulumi('preview', '--refresh', '--expect-no-changes', stack=STACK)


def test_revoked_tickets_are_renewed_transparently(lab, base):
    lab.write_stack(STACK, with_cores(base, 16))
    lab.pve_set(revoke_tickets=True)
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    assert lab.node().lxc(200).config.get()['cores'] == 16
    lab.write_stack(STACK, base)
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)


def test_a_flaky_api_is_retried_for_reads(lab, base):
    """A fifth of the requests dropped: reads are retried with backoff, so a refresh goes through."""
    lab.pve_set(network={'drop_rate': 0.2, 'seed': 7})
    try:
        lab.pulumi('refresh', '--yes', '--skip-preview', stack=STACK)
    finally:
        lab.pve_reset()
    lab.pulumi('preview', '--refresh', '--expect-no-changes', stack=STACK)
