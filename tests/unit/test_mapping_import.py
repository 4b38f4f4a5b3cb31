"""`pulumi import` of a VM's PCI resource mappings (issue 28): the provider's Read by id alone - the VM against
fakepve (Proxmox's API, validated against its schema), the mappings in test_pcimap's store (fakepve 0.5 stores
none: the lab adds them, lab/pvemap.py) - the mappings the VM's hostpciN entries name, read with their entries for
its node; taken over only when they are the ones the config describes and the device at each address is still the
VM's GPU its entry records (the host's facts: host_facts.sh's records, as test_pcimap has them)."""

import contextlib
import types

import proxmoxer
import pytest

from resources import pcimap, pve
from transport import remote
from resources.state import Failed
from tests.unit.test_pcimap import FakePci

NODE = 'pve1'
PCI_FACTS = '\n'.join([
    'pci\t0000:81:00.0\t10de:2bb5\t10de:204e\t0x030200\t1\tvfio-pci\t40',
    'pci\t0000:82:00.0\t10de:2bb5\t10de:204e\t0x030200\t1\tvfio-pci\t41',
    'pci\t0000:11:00.0\t10de:2bb5\t10de:204e\t0x030200\t0\tnvidia\t21',
]) + '\n'
GUARD = {'gpus': ['0000:01:00.0', '0000:11:00.0', '0000:61:00.0', '0000:71:00.0'], 'numa': 0}
ENTRIES = {'gpuhost-300-gpu0': 'node=pve1,path=0000:81:00.0,id=10de:2bb5,subsystem-id=10de:204e,iommugroup=40',
           'gpuhost-300-gpu1': 'node=pve1,path=0000:82:00.0,id=10de:2bb5,subsystem-id=10de:204e,iommugroup=41'}


@pytest.fixture
def api(fakepve, fakepve_cafile, monkeypatch):
    with open(fakepve_cafile) as f:
        ca = f.read()
    facts = {'text': PCI_FACTS}
    store = FakePci()
    monkeypatch.setattr(pcimap, 'read_facts', lambda target, pci=(): remote.parse_facts(facts['text']))
    monkeypatch.setattr(pcimap.remote.Target, 'from_inputs', classmethod(lambda cls, conn: None))
    real = pcimap.client

    @contextlib.contextmanager
    def client(login):
        with real(login) as prox:
            yield types.SimpleNamespace(nodes=prox.nodes, cluster=types.SimpleNamespace(
                resources=prox.cluster.resources, mapping=types.SimpleNamespace(pci=store)))
    monkeypatch.setattr(pcimap, 'client', client)
    return {'host': fakepve.host, 'port': fakepve.port, 'user': 'root@pam', 'password': 'secret', 'ca_cert': ca,
            'ca_file': fakepve_cafile, 'facts': facts, 'store': store}


def deploy(api, entries=ENTRIES, vmid=300, hostpci=None):
    prox = proxmoxer.ProxmoxAPI(api['host'], port=api['port'], user='root@pam', password='secret',
                                verify_ssl=api['ca_file'])
    for mid, entry in sorted(entries.items()):
        api['store'].post(id=mid, map=[entry])
    config = hostpci or {'hostpci%d' % i: 'mapping=%s,pcie=1' % mid for i, mid in enumerate(sorted(entries))}
    prox.nodes(NODE).qemu.post(vmid=vmid, name='snp-vm', memory=16384, **config)
    return prox


def declared(api, paths=('0000:81:00.0', '0000:82:00.0'), vmid=300):
    ids = ['gpuhost-%s-gpu%d' % (vmid, i) for i in range(len(paths))]
    login = {k: v for k, v in api.items() if k not in ('facts', 'store')}
    return {'api': login, 'connection': {}, 'node': NODE, 'vmid': vmid,
            'mappings': {mid: {'path': p, 'id': '10de:2bb5'} for mid, p in zip(ids, paths)},
            'checks': {mid: '' for mid in ids}, 'hostpci': {mid: 'hostpci%d' % i for i, mid in enumerate(ids)},
            'guard': GUARD, 'vm_numa': 1, 'entries': None, 'written': None}


def read(api, id_='pci-mappings-300'):
    login = {k: v for k, v in api.items() if k not in ('facts', 'store')}
    return pcimap.PciMappingProvider().read(id_, {'api': login, 'connection': {}})


def test_read_by_id_finds_the_mappings_the_vm_names_and_an_import_that_matches_changes_nothing(api):
    deploy(api)
    found = read(api)
    assert found.id == 'pci-mappings-300'
    assert found.outs[pve.IMPORTED] is True and found.outs['node'] == NODE and found.outs['vmid'] == 300
    assert found.outs['mappings'] == {'gpuhost-300-gpu0': {'path': '0000:81:00.0', 'id': '10de:2bb5'},
                                      'gpuhost-300-gpu1': {'path': '0000:82:00.0', 'id': '10de:2bb5'}}
    assert found.outs['hostpci'] == {'gpuhost-300-gpu0': 'hostpci0', 'gpuhost-300-gpu1': 'hostpci1'}
    provider = pcimap.PciMappingProvider()
    news = declared(api)
    provider.check(found.inputs, news)
    diff = provider.diff(found.id, found.outs, news)
    assert not diff.changes and not diff.replaces


def test_the_vms_id_alone_is_taken_and_an_unknown_vm_is_not_found(api):
    deploy(api)
    assert read(api, '300').id == 'pci-mappings-300'
    assert read(api, 'pci-mappings-301').id is None
    with pytest.raises(Failed) as e:
        read(api, 'vm300')
    assert 'the id is pci-mappings-<vmid>' in str(e.value)


@pytest.mark.parametrize('paths, facts, why', [
    # The config declares an address where the host has nothing.
    (('0000:81:00.0', '0000:83:00.0'), PCI_FACTS,
     'the PCI mapping gpuhost-300-gpu1 (hostpci1) is for 0000:83:00.0, a 10de:2bb5 GPU, but the host has no PCI '
     'device there'),
    (('0000:81:00.0',), PCI_FACTS, 'the VM names the mappings gpuhost-300-gpu0, gpuhost-300-gpu1, the config '
                                   'declares gpuhost-300-gpu0'),
    # The bus renumbered since the entry was written: a container GPU (NUMA 0) now sits at the VM's address.
    (('0000:81:00.0', '0000:82:00.0'), PCI_FACTS.replace('0000:82:00.0\t10de:2bb5\t10de:204e\t0x030200\t1\tvfio-pci',
                                                         '0000:82:00.0\t10de:2bb5\t10de:204e\t0x030200\t0\tnvidia'),
     'DANGER - the PCI mapping gpuhost-300-gpu1 (hostpci1) records 0000:82:00.0'),
])
def test_an_import_of_other_mappings_or_of_a_changed_device_is_refused_before_anything_changes(api, paths, facts,
                                                                                              why):
    deploy(api)
    found = read(api)
    api['facts']['text'] = facts
    with pytest.raises(Failed) as e:
        pcimap.PciMappingProvider().check(found.inputs, declared(api, paths))
    text = str(e.value)
    assert text.startswith('the PCI resource mappings of VM 300: not imported - ') and why in text, text
    assert 'Nothing was changed' in text


def test_an_import_whose_entries_point_elsewhere_is_taken_and_updated_like_a_moved_gpu(api):
    """Mappings whose entries point at other addresses than declared (both the VM's GPUs): taken over, and the
    first `up` rewrites them, as when the config moves a GPU. Refused or not, nothing is written at import."""
    deploy(api)
    made = list(api['store'].writes)
    found = read(api)
    provider = pcimap.PciMappingProvider()
    news = declared(api, ('0000:82:00.0', '0000:81:00.0'))
    checked = provider.check(found.inputs, news)
    assert pve.IMPORTED not in checked.inputs
    diff = provider.diff(found.id, found.outs, checked.inputs)
    assert diff.changes and not diff.replaces
    assert api['store'].writes == made


def test_an_import_from_the_command_line_checks_the_proxmox_side_and_a_refresh_makes_it_the_programs(api):
    """`pulumi import` without a program: Check gets what Read found as its news (no guard, no NUMA node). Then a
    refresh (outputs over inputs, as the plugin hands them) reads it as any mapping of the stack, unmarked."""
    deploy(api)
    found = read(api)
    provider = pcimap.PciMappingProvider()
    provider.check(found.inputs, dict(found.inputs, api=declared(api)['api']))
    refreshed = provider.read(found.id, dict(declared(api), **{k: v for k, v in found.outs.items() if v is not None}))
    assert pve.IMPORTED not in refreshed.outs and refreshed.outs['checks'] == {'gpuhost-300-gpu0': '',
                                                                               'gpuhost-300-gpu1': ''}
