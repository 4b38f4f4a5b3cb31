"""The VM's GPUs through Proxmox PCI resource mappings (gpuhost:vm.gpu_binding: mapping, the default), with
the real CLI against the lab, whose Proxmox keeps the mappings and refuses a VM start as qemu-server does
(lab/pvemap.py): made from the host's facts from empty and used by the VM, a second `up` changes nothing; a
mapping deleted or edited out of band is seen by `preview --refresh` and put back by `up`; a renumbered bus
is shown by `preview --refresh` and stops `up` before the VM starts, changing nothing; removing the mappings
keeps another node's entries.
The tests run in order on one stack (each starts where the previous one ended)."""

import json
import os

import pytest

from tests.lablib import REPO

STACK = 'pcimap'
POLICY = os.path.join(REPO, 'policy')
VM_GPUS = ['0000:81:00.0', '0000:91:00.0', '0000:e1:00.0', '0000:f1:00.0']
IDS = ['gpuhost-300-gpu%d' % i for i in range(4)]
CT_GPU = '0000:11:00.0'


@pytest.fixture(scope='module')
def stack(lab):
    lab.write_stack(STACK, lab.stack_config())
    return lab


def mappings(lab):
    """{id: map entries} as Proxmox holds them, and the digest of pci.cfg."""
    items = lab.api().cluster.mapping.pci.get()
    return {m['id']: m['map'] for m in items}, (items[0]['digest'] if items else None)


def entry(lab, bdf):
    group = next(g['group'] for g in lab.host.spec['gpus'] if g['bdf'] == bdf)
    return 'node=pve-lab,path=%s,id=10de:2bb5,subsystem-id=10de:204e,iommugroup=%d' % (bdf, group)


def vm_state(lab):
    vm = lab.node().qemu(300)
    return vm.status.current.get()['status'], vm.config.get()['digest']


def drifted(plan):
    out = {}
    for s in plan.get('steps', []):
        if s['op'] in ('same', 'refresh', 'read'):
            continue
        olds, news = (s.get('oldState') or {}).get('inputs', {}), (s.get('newState') or {}).get('inputs', {})
        out[s['urn'].split('::')[-1]] = {k for k in set(olds) | set(news) if olds.get(k) != news.get(k)}
    return out


def diagnostics(plan):
    return '\n'.join(d.get('message', '') for d in plan.get('diagnostics', []))


def preview_refresh(lab):
    return json.loads(lab.pulumi('preview', '--refresh', '--json', stack=STACK).stdout)


def test_up_from_empty_makes_one_mapping_per_gpu_and_the_vm_uses_them(stack):
    lab = stack
    assert mappings(lab) == ({}, None)
    plan = lab.preview_json(STACK, '--diff')
    step = next(s for s in plan['steps'] if s['urn'].endswith('::vm-pci-mappings'))
    assert step['op'] == 'create'
    assert step['newState']['inputs']['mappings'] == {mid: {'path': b, 'id': '10de:2bb5'}
                                                      for mid, b in zip(IDS, VM_GPUS)}
    # As `make up` runs it: with the policy pack (the mappings pass its rules, analysed after the vfio binding).
    res = lab.pulumi('up', '--yes', '--skip-preview', '--policy-pack', POLICY, '--policy-pack-config',
                     os.path.join(POLICY, 'config.lab.json'), stack=STACK)
    assert '[mandatory]' not in res.stdout + res.stderr
    # Each GPU's mapping records, from the device at its address, what Proxmox checks at VM start.
    assert mappings(lab)[0] == {mid: [entry(lab, b)] for mid, b in zip(IDS, VM_GPUS)}
    vm = lab.node().qemu(300).config.get()
    assert [vm['hostpci%d' % i] for i in range(4)] == ['mapping=%s,pcie=1' % mid for mid in IDS]
    # ... and Proxmox (the lab's qemu-server check) started the VM with them.
    assert vm_state(lab)[0] == 'running'
    out = lab.outputs(STACK)['vm']
    assert out['gpu_binding'] == 'mapping'
    assert out['hostpci'] == {'hostpci%d' % i: 'mapping=%s,pcie=1' % mid for i, mid in enumerate(IDS)}
    assert out['gpu_mappings'][IDS[0]] == {'node': 'pve-lab', 'path': '0000:81:00.0', 'id': '10de:2bb5',
                                           'subsystem-id': '10de:204e', 'iommugroup': '40'}
    assert sorted(out['gpu_mappings']) == IDS


def test_a_second_up_changes_nothing(stack):
    lab = stack
    before, digest, vm = mappings(lab), lab.host_digest(), vm_state(lab)
    lab.pulumi('up', '--yes', '--refresh', '--expect-no-changes', stack=STACK)
    assert mappings(lab) == before and lab.host_digest() == digest and vm_state(lab) == vm


def test_a_mapping_deleted_and_an_entry_pointed_at_a_container_gpu_are_shown_and_put_back(stack):
    """Both out of band through the API, then one `preview --refresh` and one `up` (one lab, few runs)."""
    lab = stack
    before = mappings(lab)[0]
    lab.api().cluster.mapping.pci(IDS[2]).delete()
    # As Proxmox's GUI records a device: the container GPU's own IDs and group, so Proxmox would start the VM.
    lab.api().cluster.mapping.pci(IDS[1]).put(map=[entry(lab, CT_GPU)])
    plan = preview_refresh(lab)
    assert drifted(plan) == {'vm-pci-mappings': {'mappings'}}, drifted(plan)
    # (the plan's update step: its oldState is what the refresh saw; the refresh step's is the state before)
    step = next(s for s in plan['steps'] if s['urn'].endswith('::vm-pci-mappings') and s['op'] == 'update')
    assert step['oldState']['inputs']['mappings'][IDS[2]] is None
    assert step['oldState']['inputs']['mappings'][IDS[1]]['path'] == CT_GPU
    text = diagnostics(plan)
    assert 'DANGER - %s (a GPU 10de:2bb5' % CT_GPU in text and ', a container GPU)' in text, text
    assert "DANGER - hostpci1: mapping=%s,pcie=1 (its mapping's entry for pve-lab: %s)" % (IDS[1], CT_GPU) in text
    res = lab.pulumi('up', '--yes', '--skip-preview', '--refresh', stack=STACK)
    assert 'recreated mapping %s for 0000:e1:00.0 (deleted outside Pulumi)' % IDS[2] in res.stdout, res.stdout[-3000:]
    assert 'repaired mapping %s: its entry for node pve-lab points at DANGER - %s' % (IDS[1], CT_GPU) in res.stdout
    assert mappings(lab)[0] == before
    lab.pulumi('up', '--yes', '--refresh', '--expect-no-changes', stack=STACK)


# A renumbered bus (the host back from a power cycle): the VM's first GPU in another slot with one of the
# container's GPUs at its old address, and its second GPU moved with the NIC at its old address.
RENUMBERED = {'0000:81:00.0': '0000:82:00.0', '0000:71:00.0': '0000:81:00.0',
              '0000:91:00.0': '0000:92:00.0', '0000:c1:00.0': '0000:91:00.0'}


def test_a_renumbered_bus_is_shown_and_stops_up_before_the_vm_starts(stack):
    lab = stack
    lab.node().qemu(300).status.stop.post()   # (the power cycle)
    lab.wait_for(lambda: vm_state(lab)[0] == 'stopped', what='VM 300 stopped')
    lab.host.renumber(RENUMBERED)
    try:
        plan = preview_refresh(lab)
        assert 'checks' in drifted(plan).get('vm-pci-mappings', set()), drifted(plan)
        container_gpu = (
            'DANGER - the PCI mapping %s (hostpci0) records 0000:81:00.0 as 10de:2bb5 (subsystem 10de:204e, IOMMU '
            'group 40), but the host now has there a GPU 10de:2bb5 (subsystem 10de:204e, IOMMU group 23, NUMA node 0'
            % IDS[0])
        nic = ('DANGER - the PCI mapping %s (hostpci1) records 0000:91:00.0 as 10de:2bb5 (subsystem 10de:204e, IOMMU '
               'group 41), but the host now has a non-GPU device (PCI class 0x020000) 8086:1592' % IDS[1])
        assert container_gpu in diagnostics(plan) and nic in diagnostics(plan), diagnostics(plan)
        before, digest, vm = mappings(lab), lab.host_digest(), vm_state(lab)
        res = lab.pulumi('up', '--yes', '--skip-preview', '--refresh', stack=STACK, check=False)
        out = res.stdout + res.stderr
        assert res.returncode != 0
        assert container_gpu in out and nic in out, out[-4000:]
        assert 'Stopping before any change: VM 300 is not started' in out
        assert ("Proxmox refuses to start the VM with it too: PCI device mapping invalid (hardware probably changed): "
                "'iommugroup' does not match for '%s' (23 != 40)" % IDS[0]) in out
        assert "'id' does not match for '%s' (8086:1592 != 10de:2bb5)" % IDS[1] in out
        assert 'The host does not match the config either' in out
        # Nothing changed: the VM is still down with its config, the mappings and the host as they were.
        assert vm_state(lab) == vm and vm[0] == 'stopped'
        assert mappings(lab) == before and lab.host_digest() == digest
        # Proxmox itself would not start it either.
        upid = lab.node().qemu(300).status.start.post()
        assert lab.node().tasks(upid).status.get()['exitstatus'] == (
            "PCI device mapping invalid (hardware probably changed): 'iommugroup' does not match for '%s' "
            "(23 != 40)" % IDS[0])
    finally:
        # The cards back in their slots: the next run converges, and starts the VM.
        lab.host.renumber({new: old for old, new in RENUMBERED.items()})
    lab.pulumi('up', '--yes', '--skip-preview', '--refresh', stack=STACK)
    assert vm_state(lab)[0] == 'running'
    lab.pulumi('up', '--yes', '--refresh', '--expect-no-changes', stack=STACK)


def test_gpu_binding_address_passes_raw_addresses_and_removes_the_mappings(stack):
    """One of the mappings is shared with another node of the cluster (its entry added by hand, as the GUI
    does): removing the mappings takes only this node's entries, and that mapping stays with the other one."""
    lab = stack
    other = entry(lab, VM_GPUS[0]).replace('node=pve-lab', 'node=pve-other')
    lab.api().cluster.mapping.pci(IDS[0]).put(map=mappings(lab)[0][IDS[0]] + [other])
    cfg = lab.stack_config()
    cfg['gpuhost:vm']['gpu_binding'] = 'address'
    lab.write_stack(STACK, cfg)
    plan = lab.preview_json(STACK)
    ops = {s['urn'].split('::')[-1]: s['op'] for s in plan['steps'] if s['op'] != 'same'}
    assert ops.get('vm-pci-mappings') == 'delete' and ops.get('vm-qemu') == 'update', ops
    res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    assert mappings(lab)[0] == {IDS[0]: [other]}
    assert ('mapping %s: removed the entry for node pve-lab; the mapping stays with the entries of pve-other'
            % IDS[0]) in res.stdout, res.stdout[-3000:]
    # The running VM keeps its devices until its next start: the raw addresses wait in its pending config.
    pending = {i['key']: i.get('pending', i.get('value')) for i in lab.node().qemu(300).pending.get()}
    assert [pending['hostpci%d' % i] for i in range(4)] == ['%s,pcie=1' % b for b in VM_GPUS]
    out = lab.outputs(STACK)['vm']
    assert out['gpu_binding'] == 'address' and out['gpu_mappings'] == {}
    assert sorted(out['pending_restart']) == ['hostpci0', 'hostpci1', 'hostpci2', 'hostpci3']
    lab.pulumi('up', '--yes', '--refresh', '--expect-no-changes', stack=STACK)
