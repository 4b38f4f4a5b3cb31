"""Warnings are shown and do not stop the preview; a wrong pinned host key fails the connection before
any change; preview needs no host at all. (The refusals themselves: test_hostile.py.)"""

import copy
import os
import subprocess

import pytest

STACK = 'refuse'


def mutate(cfg, path, value):
    cfg = copy.deepcopy(cfg)
    node = cfg
    for key in path[:-1]:
        node = node.setdefault(key, {})
    if value is DELETE:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value
    return cfg


DELETE = object()
H, I = 'gpuhost:host', 'gpuhost:iommu'


@pytest.fixture(scope='module')
def base(lab):
    cfg = lab.stack_config()
    lab.write_stack(STACK, cfg)
    return cfg


def test_warnings_do_not_stop_preview(lab, base):
    cfg = mutate(base, (I, 'extra_kernel_args'), ['amd_iommu=on'])
    lab.write_stack(STACK, cfg)
    res = lab.pulumi('preview', stack=STACK)
    assert 'amd_iommu=on is not a valid value' in res.stdout
    assert 'SEV-SNP together with PCI passthrough is listed by Proxmox as not supported' in res.stdout
    assert 'NEXTN speculative decoding with the extra_buffer mamba cache' in res.stdout


def test_wrong_pinned_host_key_fails_before_any_change(lab, base, tmp_path):
    subprocess.run(['ssh-keygen', '-q', '-t', 'ed25519', '-N', '', '-f', str(tmp_path / 'other')], check=True)
    cfg = mutate(base, (H, 'ssh', 'host_key_file'), DELETE)
    cfg = mutate(cfg, (H, 'ssh', 'host_key'), ' '.join(open(tmp_path / 'other.pub').read().split()[:2]))
    lab.write_stack(STACK, cfg)
    digest = lab.host_digest()
    res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert 'not the pinned gpuhost:host.ssh.host_key' in out, out[-3000:]
    assert lab.host_digest() == digest
    assert lab.node().lxc.get() == [] and lab.node().qemu.get() == []
    # The SSH private key never shows up in what the CLI printed.
    key = open(os.path.join(lab.project, '.lab', 'ssh', 'id_ed25519')).read().splitlines()[1]
    assert key not in out


def test_preview_needs_no_lab_at_all(lab, base):
    lab.write_stack(STACK, base)
    lab.stop_processes()
    try:
        plan = lab.preview_json(STACK)
        # (the program's own resources: custom ones of the gpuhost package, not its four components)
        ops = {s['urn'].split('::')[-1]: s['op'] for s in plan['steps']
               if 'gpuhost:index:' in s['urn'] and s.get('newState', {}).get('custom')}
        # (the VM's PCI resource mappings too: made from the host's facts at apply, not read at preview)
        assert set(ops.values()) == {'create'} and len(ops) == 12, sorted(ops)
        assert 'host-metrics' in ops and 'vm-pci-mappings' in ops and 'collector' in ops, sorted(ops)
    finally:
        lab.up()
