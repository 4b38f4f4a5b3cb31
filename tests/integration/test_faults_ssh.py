"""The SSH connection dropped at each of the first ten remote commands of an `up` that changes host
files (kernel command line, nvidia options) and the SGLang unit: the error names the lost connection,
the host and the step; no managed file is ever half-written (each holds its old or its new content);
a re-run converges. Also: a hung host tool is stopped at the step's time limit and named."""

import copy
import os

import pytest

pytestmark = pytest.mark.slow
STACK = 'sshdrop'
MODES = ('before', 'during', 'after')


def changed(cfg):
    cfg = copy.deepcopy(cfg)
    cfg['gpuhost:iommu'] = {'domain': 'DMA'}
    cfg['gpuhost:nvidia'] = {'dma_remap_peer_mmio': 0}
    cfg['gpuhost:sglang']['speculative'] = {'algorithm': 'NEXTN', 'num_steps': 2, 'eagle_topk': 1,
                                            'num_draft_tokens': 3}
    return cfg


def managed_files(lab):
    unit = os.path.join(lab.ct_root(), 'etc', 'systemd', 'system', 'sglang-qwen.service')
    paths = {'cmdline': lab.host.path('etc/kernel/cmdline'),
             'modprobe': lab.host.path('etc/modprobe.d/gpuhost-nvidia.conf'), 'unit': unit,
             'lxc conf': lab.host.path('etc/pve/lxc/200.conf')}
    out = {}
    for name, path in paths.items():
        with open(path) as f:
            out[name] = f.read()
    return out


@pytest.fixture(scope='module')
def states(lab):
    """The managed files in the base state (A) and in the changed state (B)."""
    base = lab.stack_config()
    base['gpuhost:host']['ssh']['command_timeout'] = 20
    lab.write_stack(STACK, changed(base))
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    new = managed_files(lab)
    lab.write_stack(STACK, base)
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    old = managed_files(lab)
    assert old != new
    return base, old, new


@pytest.mark.parametrize('n', range(1, 11))
def test_drop_at_each_command(lab, states, n):
    base, old, new = states
    mode = MODES[n % len(MODES)]
    lab.write_stack(STACK, changed(base))
    at = lab.drop_ssh_at(n, mode=mode)
    res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
    out = res.stdout + res.stderr
    assert not lab.ssh_drop_pending(), 'the up ran fewer than %d remote commands: %s\n%s' % (
        n, [e['cmd'] for e in lab.ssh_log()[-12:]], out[-3000:])
    step = next(e for e in lab.ssh_log() if e['n'] == at)
    assert res.returncode != 0, 'drop %s command %d (%s) went unnoticed:\n%s' % (mode, n, step['cmd'], out[-3000:])
    assert 'connection to root@%s:%d lost during' % (lab.info['ssh']['host'], lab.info['ssh']['port']) in out, \
        (mode, step, out[-3000:])
    assert 'Safe to re-run' in out
    for name, text in managed_files(lab).items():
        assert text in (old[name], new[name]), '%s half-written after a drop %s %s' % (name, mode, step['cmd'])
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    assert managed_files(lab) == new
    lab.pulumi('preview', '--refresh', '--expect-no-changes', stack=STACK)
    lab.write_stack(STACK, base)
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    assert managed_files(lab) == old


def test_a_hung_tool_is_stopped_and_named(lab, states):
    base, old, new = states
    hung = changed(base)
    hung['gpuhost:host']['ssh']['command_timeout'] = 5  # the least the config allows: the hang costs 5 s
    lab.write_stack(STACK, hung)
    lab.hang_tool('proxmox-boot-tool.refresh')
    try:
        res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False, timeout=300)
    finally:
        lab.clear_faults()
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert 'did not finish within 5 s (gpuhost:host.ssh.command_timeout)' in out, out[-3000:]
    assert 'writing /etc/kernel/cmdline' in out
    lab.write_stack(STACK, changed(base))
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    assert managed_files(lab) == new
    lab.write_stack(STACK, base)
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
