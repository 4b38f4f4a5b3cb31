"""host_facts.sh output -> HostFacts, and the decisions made from facts (golden files captured from the
lab's SSH server running the unmodified script)."""

import os

import pytest

from transport import remote
from resources.host import HostStateError, check_inventory, reboot_reasons

GOLDEN = os.path.join(os.path.dirname(__file__), 'golden')
INVENTORY = [{'address': a, 'numa': n, 'id': '10de:2bb5'} for a, n in (
    ('0000:01:00.0', 0), ('0000:11:00.0', 0), ('0000:61:00.0', 0), ('0000:71:00.0', 0),
    ('0000:81:00.0', 1), ('0000:91:00.0', 1), ('0000:e1:00.0', 1), ('0000:f1:00.0', 1))]
BLACKWELL = ['10de:2bb1', '10de:2bb4', '10de:2bb5']
VM = ['0000:81:00.0', '0000:91:00.0', '0000:e1:00.0', '0000:f1:00.0']
EXPECT = {'ensure_args': ['iommu.passthrough=0', 'iommu.strict=0'], 'policy': {'blackwell': True, 'snp': True, 'vfio': True},
          'domain': 'DMA-FQ', 'nvidia_params': {'DmaRemapPeerMmio': '1'}, 'vfio_devices': VM,
          'container_devices': ['0000:01:00.0', '0000:11:00.0', '0000:61:00.0', '0000:71:00.0']}


def facts(name):
    with open(os.path.join(GOLDEN, name)) as f:
        return remote.parse_facts(f.read())


def test_systemd_boot_host_after_first_up():
    f = facts('host_facts.lab-systemd-boot.txt')
    assert f.boot == 'systemd-boot'
    assert f.configured.split()[-2:] == ['iommu.passthrough=0', 'iommu.strict=0']
    assert f.running_args() == ['root=ZFS=rpool/ROOT/pve-1', 'boot=zfs', 'quiet']
    assert len(f.gpus) == 8
    g = f.gpus['0000:81:00.0']
    assert (g.id, g.numa, g.driver, g.override, g.group, g.group_type) == ('10de:2bb5', 1, 'vfio-pci', 'vfio-pci',
                                                                           40, 'DMA-FQ')
    assert f.gpus['0000:01:00.0'].override is None and f.gpus['0000:71:00.0'].minor == 3
    assert f.params['DmaRemapPeerMmio'] == '1'
    assert f.overrides == {b: 'vfio-pci' for b in VM}
    assert f.files['/etc/nothing'] is None and len(f.files['/etc/modprobe.d/gpuhost-nvidia.conf']) == 64


def test_reboot_reasons_name_what_is_not_running_yet():
    reasons = reboot_reasons(facts('host_facts.lab-systemd-boot.txt'), EXPECT)
    assert reasons == ['kernel command line: running lacks iommu.passthrough=0 iommu.strict=0']


def test_grub_host_values_are_read_as_grub_sources_them_and_identity_is_reported():
    f = facts('host_facts.lab-grub-identity.txt')
    assert f.boot == "grub" and f.configured == "quiet iommu=pt"
    assert (f.grub_linux, f.grub_default) == ("", "quiet iommu=pt")
    reasons = reboot_reasons(f, EXPECT)
    assert 'kernel command line: running still has iommu=pt' in reasons
    assert any(r.startswith('IOMMU group 20 (0000:01:00.0): type identity, declared DMA-FQ') for r in reasons)


def test_identity_domain_on_blackwell_stops_everything():
    with pytest.raises(HostStateError) as e:
        check_inventory(facts('host_facts.lab-grub-identity.txt'), INVENTORY, BLACKWELL)
    assert '0x177' in str(e.value) and '0000:01:00.0' in str(e.value) and 'power-cycle' in str(e.value)


def test_inventory_mismatch_names_address_and_values():
    inv = [dict(g) for g in INVENTORY]
    inv[0]['id'] = '10de:2bb1'
    inv[4]['numa'] = 0
    inv.append({'address': '0000:c1:00.0', 'numa': 1, 'id': '10de:2bb5'})
    with pytest.raises(HostStateError) as e:
        check_inventory(facts('host_facts.lab-systemd-boot.txt'), inv, BLACKWELL)
    msg = str(e.value)
    assert '0000:01:00.0 is 10de:2bb5 on the host, config says 10de:2bb1' in msg
    assert '0000:81:00.0 sits on NUMA node 1 on the host, config says 0' in msg
    assert '0000:c1:00.0 is not a GPU on this host' in msg


def test_parse_tolerates_a_gpu_without_iommu_group_and_a_path_with_spaces():
    f = remote.parse_facts('boot\tgrub\nconfigured\t"quiet"\ngpu\t0000:01:00.0\t10de:2bb5\t-1\t-\t(null)\t-\t-\n'
                           'file\t/etc/odd dir/$x;y.conf\t-\n')
    g = f.gpus['0000:01:00.0']
    assert (g.numa, g.driver, g.group, g.group_type) == (-1, None, None, None)
    assert f.files == {'/etc/odd dir/$x;y.conf': None}


def test_the_prerequisites_host_facts_reads():
    """What `make check` and up's preflight decide from: driverctl's path, the IOMMU groups, kvm_amd's SEV
    parameters and whether each device node the container names is a character device."""
    t = '\t'
    facts = remote.parse_facts('\n'.join([
        'driverctl%s/usr/sbin/driverctl' % t, 'iommu_groups%s97' % t, 'kvm_amd%ssev%sY' % (t, t),
        'kvm_amd%ssev_snp%sN' % (t, t), 'devnode%s/dev/nvidia0%sc' % (t, t), 'devnode%s/dev/nvidia-uvm%s-' % (t, t)]))
    assert facts.driverctl == '/usr/sbin/driverctl' and facts.iommu_groups == 97
    assert facts.kvm_amd == {'sev': 'Y', 'sev_snp': 'N'}
    assert facts.devnodes == {'/dev/nvidia0': True, '/dev/nvidia-uvm': False}
    bare = remote.parse_facts('iommu_groups%s0\n' % t)
    assert bare.driverctl is None and bare.iommu_groups == 0 and bare.kvm_amd == {} and bare.devnodes == {}
