"""PCI resource mappings (resources/pcimap.py): Proxmox's own check of an entry against the device at its
address, what counts as DANGER, and the entries the program writes; host_facts.sh's `pci` records."""

import pytest

from transport import remote
from resources.pcimap import (desired_entry, node_entries, observed_spec, other_entries, proxmox_refusal,
                               stop_message, verify)
from grammar.pve import CONFIGID_RE, map_entry, parse_map_entry

# What host_facts.sh prints for addresses it is given (the lab's host after the VM's GPUs were bound).
PCI_FACTS = '\n'.join([
    'pci\t0000:81:00.0\t10de:2bb5\t10de:204e\t0x030200\t1\tvfio-pci\t40',
    'pci\t0000:11:00.0\t10de:2bb5\t10de:204e\t0x030200\t0\tnvidia\t21',
    'pci\t0000:c1:00.0\t8086:1592\t8086:0002\t0x020000\t1\tice\t90',
    'pci\t0000:82:00.0\t10de:2bb5\t-\t0x030200\t1\t-\t-',
    'pci\t0000:99:00.0\t-',
]) + '\n'
FACTS = remote.parse_facts(PCI_FACTS)
SPEC = {'path': '0000:81:00.0', 'id': '10de:2bb5', 'hostpci': 'hostpci0'}
ENTRY = {'node': 'pve-lab', 'path': '0000:81:00.0', 'id': '10de:2bb5', 'subsystem-id': '10de:204e',
         'iommugroup': '40'}
GUARD = {'gpus': ['0000:01:00.0', '0000:11:00.0', '0000:61:00.0', '0000:71:00.0'], 'numa': 0}
MID = 'gpuhost-300-gpu0'
CT_GPU_PATH = '0000:11:00.0'


def at(address):
    return FACTS.pci[address]


def test_pci_records_describe_whatever_sits_at_an_address():
    gpu = at('0000:81:00.0')
    assert (gpu.id, gpu.subsystem_id, gpu.pci_class, gpu.numa, gpu.driver, gpu.group) == (
        '10de:2bb5', '10de:204e', '0x030200', 1, 'vfio-pci', 40)
    assert gpu.is_gpu and not at('0000:c1:00.0').is_gpu
    bare = at('0000:82:00.0')
    assert (bare.subsystem_id, bare.driver, bare.group) == (None, None, None)
    assert FACTS.pci['0000:99:00.0'] is None and '0000:98:00.0' not in FACTS.pci


def test_host_facts_describes_the_devices_at_the_addresses_it_is_given():
    """Golden: the unmodified host_facts.sh over the lab's SSH, given a file, a GPU's address, the NIC's and an
    empty one (a fresh lab: every GPU on nvidia)."""
    import os
    with open(os.path.join(os.path.dirname(__file__), 'golden', 'host_facts.lab-pci.txt')) as f:
        facts = remote.parse_facts(f.read())
    gpu, nic = facts.pci['0000:81:00.0'], facts.pci['0000:c1:00.0']
    assert (gpu.id, gpu.subsystem_id, gpu.pci_class, gpu.numa, gpu.driver, gpu.group, gpu.is_gpu) == (
        '10de:2bb5', '10de:204e', '0x030200', 1, 'nvidia', 40, True)
    assert (nic.id, nic.subsystem_id, nic.pci_class, nic.driver, nic.group, nic.is_gpu) == (
        '8086:1592', '8086:0002', '0x020000', 'ice', 90, False)
    assert facts.pci['0000:d1:00.0'] is None and set(facts.pci) == {'0000:81:00.0', '0000:c1:00.0', '0000:d1:00.0'}
    # The other records are as before: the eight GPUs (the NIC is not one), the file's hash.
    assert len(facts.gpus) == 8 and '0000:c1:00.0' not in facts.gpus
    assert len(facts.files['/etc/kernel/cmdline']) == 64


def test_the_entry_made_from_a_device_is_the_one_proxmox_then_accepts():
    want = desired_entry('pve-lab', SPEC, at('0000:81:00.0'))
    assert want == ENTRY
    assert map_entry(want) == 'node=pve-lab,path=0000:81:00.0,id=10de:2bb5,subsystem-id=10de:204e,iommugroup=40'
    assert parse_map_entry(map_entry(want)) == want
    assert proxmox_refusal(MID, SPEC['path'], want, at('0000:81:00.0')) == ''
    # A device without subsystem ID or IOMMU group: the entry says nothing of them, and that matches too.
    bare = desired_entry('pve-lab', dict(SPEC, path='0000:82:00.0'), at('0000:82:00.0'))
    assert bare == {'node': 'pve-lab', 'path': '0000:82:00.0', 'id': '10de:2bb5'}
    assert proxmox_refusal(MID, '0000:82:00.0', bare, at('0000:82:00.0')) == ''


@pytest.mark.parametrize('entry,dev,why', [
    # PVE::Mapping::PCI::assert_valid: properties in sorted order (id, iommugroup, subsystem-id), in its words.
    (dict(ENTRY, iommugroup='23'), '0000:81:00.0', "'iommugroup' does not match for 'gpuhost-300-gpu0' (40 != 23)"),
    (dict(ENTRY, id='10de:2bb1', iommugroup='9'), '0000:81:00.0',
     "'id' does not match for 'gpuhost-300-gpu0' (10de:2bb5 != 10de:2bb1)"),
    (dict(ENTRY, **{'subsystem-id': '0x10de:0x204f'}), '0000:81:00.0',
     "'subsystem-id' does not match for 'gpuhost-300-gpu0' (10de:204e != 10de:204f)"),
    ({k: v for k, v in ENTRY.items() if k != 'subsystem-id'}, '0000:81:00.0',
     "missing expected property 'subsystem-id' for device '0000:81:00.0'"),
    (ENTRY, '0000:82:00.0', "unexpected property 'iommugroup' configured for device '0000:81:00.0'"),
    (ENTRY, '0000:99:00.0', "pci device '0000:81:00.0' not found"),
])
def test_proxmox_refuses_an_entry_that_no_longer_matches_its_device(entry, dev, why):
    assert proxmox_refusal(MID, '0000:81:00.0', entry, FACTS.pci[dev]) == \
        'PCI device mapping invalid (hardware probably changed): ' + why


def test_the_declared_gpu_at_its_address_with_its_recorded_facts_passes():
    assert verify(MID, SPEC, ENTRY, at('0000:81:00.0'), GUARD, 1) is None
    assert verify(MID, SPEC, None, at('0000:81:00.0'), GUARD, 1) is None  # not made yet: the device is right


def test_a_container_gpu_at_the_vms_address_is_danger():
    # The renumbered bus: a GPU of the container's NUMA node now sits where the VM's GPU was.
    f = verify(MID, SPEC, ENTRY, at('0000:11:00.0'), GUARD, 1)
    assert f.danger and "on the container's NUMA node" in f.text and 'take a container GPU' in f.text
    assert f.text.startswith('the PCI mapping gpuhost-300-gpu0 (hostpci0) records 0000:81:00.0 as 10de:2bb5 '
                             '(subsystem 10de:204e, IOMMU group 40), but the host now has there a GPU 10de:2bb5 '
                             '(subsystem 10de:204e, IOMMU group 21, NUMA node 0, driver nvidia)')
    assert f.refusal.endswith("'iommugroup' does not match for 'gpuhost-300-gpu0' (21 != 40)")
    # A mapping for one of the container's own addresses (a program that bypassed the config).
    f = verify(MID, dict(SPEC, path='0000:11:00.0'), None, at('0000:11:00.0'), GUARD, 1)
    assert f.danger and "one of the container's GPUs (gpuhost:container.gpus)" in f.text


def test_a_non_gpu_device_at_the_vms_address_is_danger():
    f = verify(MID, SPEC, ENTRY, at('0000:c1:00.0'), GUARD, 1)
    assert f.danger and 'a non-GPU device (PCI class 0x020000) 8086:1592' in f.text
    assert "'id' does not match" in f.refusal


def test_other_changes_stop_too_but_are_not_danger():
    f = verify(MID, SPEC, dict(ENTRY, iommugroup='41'), at('0000:81:00.0'), GUARD, 1)
    assert not f.danger and "'iommugroup' does not match" in f.refusal
    f = verify(MID, SPEC, ENTRY, FACTS.pci['0000:99:00.0'], GUARD, 1)
    assert not f.danger and 'the host has no PCI device there' in f.text and "pci device '0000:81:00.0' not found" \
        in f.refusal
    # Nothing recorded yet, but the address holds another model than declared.
    f = verify(MID, dict(SPEC, id='10de:2bb1'), None, at('0000:81:00.0'), GUARD, 1)
    assert not f.danger and 'the config declares 10de:2bb1 on NUMA node 1' in f.text and f.refusal == ''


def test_the_stop_message_says_what_to_do():
    f = verify(MID, SPEC, ENTRY, at('0000:11:00.0'), GUARD, 1)
    text = stop_message(MID, SPEC, f, 300)
    assert text.startswith('DANGER - the PCI mapping gpuhost-300-gpu0 (hostpci0) records 0000:81:00.0')
    assert 'Proxmox refuses to start the VM with it too: PCI device mapping invalid (hardware probably changed)' in text
    assert 'Stopping before any change: VM 300 is not started.' in text
    assert 'gpuhost:host.gpus and gpuhost:vm.gpus' in text and 'driverctl list-overrides' in text
    assert 'pvesh delete /cluster/mapping/pci/gpuhost-300-gpu0' in text


def test_entries_of_other_nodes_are_kept_and_several_for_ours_are_a_difference():
    mapping = {'id': MID, 'map': ['node=pve-b,path=0000:01:00.0,id=10de:2bb5', map_entry(ENTRY)]}
    assert node_entries(mapping, 'pve-lab') == [ENTRY]
    assert other_entries(mapping, 'pve-lab') == ['node=pve-b,path=0000:01:00.0,id=10de:2bb5']
    assert observed_spec(node_entries(mapping, 'pve-lab')) == {'path': '0000:81:00.0', 'id': '10de:2bb5'}
    two = {'map': [map_entry(ENTRY), map_entry(dict(ENTRY, path='0000:91:00.0'))]}
    assert observed_spec(node_entries(two, 'pve-lab')) == {'path': '0000:81:00.0;0000:91:00.0',
                                                           'id': '10de:2bb5;10de:2bb5'}
    # Proxmox may hand back one entry as a plain string; a description the config does not set is a difference.
    assert node_entries({'map': map_entry(ENTRY)}, 'pve-lab') == [ENTRY]
    assert observed_spec([dict(ENTRY, description='by hand')]) == {'path': '0000:81:00.0', 'id': '10de:2bb5',
                                                                   'description': 'by hand'}
    assert observed_spec([]) is None


@pytest.mark.parametrize('mid,ok', [('gpuhost-300-gpu0', True), ('G_0', True), ('a1', True), ('a', False),
                                    ('0gpu', False), ('gpu.0', False), ('gpu 0', False), ('gpu,0', False)])
def test_mapping_ids_are_proxmoxs_configid(mid, ok):
    assert bool(CONFIGID_RE.match(mid)) == ok


# ------------------------------------------------------------------ the provider's apply, with a fake Proxmox

class FakePci(object):
    """proxmoxer's prox.cluster.mapping.pci as far as the provider uses it; records every write."""

    def __init__(self, ids=None):
        self.ids = {k: {'map': list(v)} for k, v in (ids or {}).items()}
        self.writes = []
        self.digest = 'd0'

    def get(self):
        return [dict(v, id=k, digest=self.digest) for k, v in sorted(self.ids.items())]

    def post(self, id, map):
        self.writes.append(('POST', id, list(map)))
        self.ids[id] = {'map': list(map)}
        self.digest += '+'

    def __call__(self, mid):
        pci = self

        class One(object):
            def get(self):
                return dict(pci.ids[mid], digest=pci.digest)

            def put(self, map, digest=None):
                assert digest == pci.digest, 'stale digest %s (now %s)' % (digest, pci.digest)
                pci.writes.append(('PUT', mid, list(map)))
                pci.ids[mid] = {'map': list(map)}
                pci.digest += '+'

            def delete(self):
                pci.writes.append(('DELETE', mid))
                pci.ids.pop(mid, None)
        return One()


@pytest.fixture
def fake(monkeypatch):
    import contextlib
    import types
    from resources import pcimap
    state = types.SimpleNamespace(pci=FakePci(), facts=FACTS)
    prox = types.SimpleNamespace(cluster=types.SimpleNamespace(mapping=types.SimpleNamespace()))

    @contextlib.contextmanager
    def client(api):
        prox.cluster.mapping.pci = state.pci
        yield prox
    monkeypatch.setattr(pcimap, 'client', client)
    monkeypatch.setattr(pcimap, 'read_facts', lambda target, pci=(): state.facts)
    monkeypatch.setattr(pcimap.remote.Target, 'from_inputs', classmethod(lambda cls, conn: None))
    return state


def props(paths=('0000:81:00.0',)):
    ids = ['gpuhost-300-gpu%d' % i for i in range(len(paths))]
    return {'api': {}, 'connection': {}, 'node': 'pve-lab', 'vmid': 300,
            'mappings': {mid: {'path': p, 'id': '10de:2bb5'} for mid, p in zip(ids, paths)},
            'checks': {mid: '' for mid in ids}, 'hostpci': {mid: 'hostpci%d' % i for i, mid in enumerate(ids)},
            'guard': GUARD, 'vm_numa': 1, 'entries': None}


def test_apply_creates_then_changes_nothing(fake):
    from resources.pcimap import PciMappingProvider
    out = PciMappingProvider().apply(props())
    assert fake.pci.writes == [('POST', MID, [map_entry(ENTRY)])]
    assert out['mappings'] == {MID: {'path': '0000:81:00.0', 'id': '10de:2bb5'}} and out['checks'] == {MID: ''}
    assert out['entries'] == {MID: ENTRY} and out['written'] == {MID: '0000:81:00.0'}
    PciMappingProvider().apply(props(), out)
    assert len(fake.pci.writes) == 1


def test_apply_puts_back_an_edited_entry_keeps_other_nodes_and_reads_the_digest_again(fake, capsys):
    from resources.pcimap import PciMappingProvider
    other = 'node=pve-b,path=0000:01:00.0,id=10de:2bb5'
    fake.pci = FakePci({MID: [other, map_entry(dict(ENTRY, path=CT_GPU_PATH, iommugroup='21'))],
                        'gpuhost-300-gpu1': []})
    fake.facts = remote.parse_facts(PCI_FACTS + 'pci\t0000:91:00.0\t10de:2bb5\t10de:204e\t0x030200\t1\tvfio-pci\t41\n')
    olds = {'mappings': {MID: {'path': '0000:81:00.0', 'id': '10de:2bb5'}}}
    PciMappingProvider().apply(props(('0000:81:00.0', '0000:91:00.0')), olds)
    assert [w[:2] for w in fake.pci.writes] == [('PUT', MID), ('PUT', 'gpuhost-300-gpu1')]
    assert fake.pci.writes[0][2] == [other, map_entry(ENTRY)]
    err = capsys.readouterr().err
    assert 'repaired mapping gpuhost-300-gpu0: its entry for node pve-lab points at DANGER - 0000:11:00.0' in err
    assert ', a container GPU), set outside Pulumi; declared: 0000:81:00.0' in err


def test_apply_after_the_config_moved_a_gpu_rewrites_without_calling_it_out_of_band(fake, capsys):
    from resources.pcimap import PciMappingProvider
    fake.pci = FakePci({MID: [map_entry(dict(ENTRY, path='0000:82:00.0'))]})
    fake.facts = remote.parse_facts(PCI_FACTS.replace('0000:82:00.0\t10de:2bb5\t-\t0x030200\t1\t-\t-',
                                                      '0000:82:00.0\t10de:2bb5\t10de:204e\t0x030200\t1\tvfio-pci\t44'))
    PciMappingProvider().apply(props(('0000:81:00.0',)), {'mappings': {MID: {'path': '0000:82:00.0'}}})
    assert fake.pci.writes == [('PUT', MID, [map_entry(ENTRY)])]
    assert 'repaired' not in capsys.readouterr().err


def test_apply_stops_before_any_write_when_a_device_no_longer_matches(fake):
    from resources.pcimap import MappingError, PciMappingProvider
    fake.pci = FakePci({MID: [map_entry(ENTRY)]})
    fake.facts = remote.parse_facts(PCI_FACTS.replace('0000:81:00.0\t10de:2bb5\t10de:204e\t0x030200\t1\tvfio-pci\t40',
                                                      '0000:81:00.0\t10de:2bb5\t10de:204e\t0x030200\t0\tvfio-pci\t23')
                                    + 'pci\t0000:91:00.0\t10de:2bb5\t10de:204e\t0x030200\t1\tvfio-pci\t41\n')
    with pytest.raises(MappingError) as e:
        PciMappingProvider().apply(props(('0000:81:00.0', '0000:91:00.0')))
    assert str(e.value).startswith('the PCI resource mappings of VM 300:\n  - DANGER - the PCI mapping '
                                   'gpuhost-300-gpu0')
    assert 'gpuhost-300-gpu1' not in str(e.value)
    assert fake.pci.writes == []   # not even the second mapping, which was fine to make


def test_apply_names_a_mapping_deleted_out_of_band_as_recreated(fake, capsys):
    """The old state as the engine hands it after a refresh that found the mapping gone: the None value
    of its id is not there at all (pulumi.runtime.rpc drops None properties)."""
    from resources.pcimap import PciMappingProvider
    olds = {k: v for k, v in props().items() if k != 'entries'}
    olds['mappings'] = {}
    PciMappingProvider().apply(props(), olds)
    assert fake.pci.writes == [('POST', MID, [map_entry(ENTRY)])]
    assert 'recreated mapping %s for 0000:81:00.0 (deleted outside Pulumi)' % MID in capsys.readouterr().err


def test_apply_deletes_a_mapping_no_longer_declared(fake):
    from resources.pcimap import PciMappingProvider
    fake.pci = FakePci({MID: [map_entry(ENTRY)], 'gpuhost-300-gpu1': [map_entry(dict(ENTRY, path='0000:91:00.0'))]})
    fake.facts = remote.parse_facts(PCI_FACTS + 'pci\t0000:91:00.0\t10de:2bb5\t10de:204e\t0x030200\t1\tvfio-pci\t41\n')
    olds = props(('0000:81:00.0', '0000:91:00.0'))
    PciMappingProvider().apply(props(), olds)
    assert fake.pci.writes == [('DELETE', 'gpuhost-300-gpu1')]


def test_apply_after_a_refresh_recorded_an_edit_still_calls_it_out_of_band(fake, capsys):
    """`up --refresh`: the old state's `mappings` is what the refresh saw (the edited entry); `written` is what
    the last run wrote, so the edit is still named as one."""
    from resources.pcimap import PciMappingProvider
    fake.pci = FakePci({MID: [map_entry(dict(ENTRY, path=CT_GPU_PATH, iommugroup='21'))]})
    olds = dict(props(), mappings={MID: {'path': CT_GPU_PATH, 'id': '10de:2bb5'}}, written={MID: '0000:81:00.0'})
    PciMappingProvider().apply(props(), olds)
    assert fake.pci.writes[0][:2] == ('PUT', MID)
    assert 'repaired mapping %s: its entry for node pve-lab points at DANGER - %s' % (MID, CT_GPU_PATH) in \
        capsys.readouterr().err


OTHER_NODE = 'node=pve-b,path=0000:01:00.0,id=10de:2bb5'


def test_apply_removes_only_this_nodes_entry_of_a_mapping_no_longer_declared(fake):
    """A mapping the cluster shares: the other node's entry stays, with the digest read right before the write."""
    from resources.pcimap import PciMappingProvider
    fake.pci = FakePci({MID: [map_entry(ENTRY)],
                        'gpuhost-300-gpu1': [OTHER_NODE, map_entry(dict(ENTRY, path='0000:91:00.0'))]})
    fake.facts = remote.parse_facts(PCI_FACTS + 'pci\t0000:91:00.0\t10de:2bb5\t10de:204e\t0x030200\t1\tvfio-pci\t41\n')
    PciMappingProvider().apply(props(), props(('0000:81:00.0', '0000:91:00.0')))
    assert fake.pci.writes == [('PUT', 'gpuhost-300-gpu1', [OTHER_NODE])]


def test_delete_keeps_other_nodes_entries_and_deletes_a_mapping_left_empty(fake):
    from resources.pcimap import PciMappingProvider
    fake.pci = FakePci({MID: [OTHER_NODE, map_entry(ENTRY)],
                        'gpuhost-300-gpu1': [map_entry(dict(ENTRY, path='0000:91:00.0'))],
                        'gpuhost-300-gpu2': [OTHER_NODE]})
    PciMappingProvider().delete('pci-mappings-300', props(('0000:81:00.0', '0000:91:00.0', '0000:e1:00.0')))
    assert sorted(fake.pci.writes) == [('DELETE', 'gpuhost-300-gpu1'), ('PUT', MID, [OTHER_NODE])]
    assert fake.pci.ids == {MID: {'map': [OTHER_NODE]}, 'gpuhost-300-gpu2': {'map': [OTHER_NODE]}}
