"""fakepve's scenarios through the lab's control interface (lab.pve_set / lab.pve_reset), each seen
through proxmoxer as the program sees it: status code and message."""

import time

import proxmoxer
import pytest
import requests

NODE = 'pve-lab'


@pytest.fixture(scope='module')
def ct(lab):
    lab.create_ct(200)
    yield
    lab.pve_reset()


@pytest.fixture
def api(lab, ct):
    lab.pve_reset()
    return lab.api()


def error(fn):
    with pytest.raises(proxmoxer.ResourceException) as e:
        fn()
    return e.value.status_code, e.value.content


def task_exit(api, upid, timeout=30.0):
    """The task's exit status once it has ended, as a client waits for a PVE task (a container's start ends once
    the lab has booted it)."""
    deadline = time.time() + timeout
    while True:
        status = api.nodes(NODE).tasks(upid).status.get()
        if status['status'] == 'stopped' or time.time() > deadline:
            return status.get('exitstatus')
        time.sleep(0.1)


def test_lost_quorum_fails_writes_not_reads(lab, api):
    lab.pve_set(quorate=False)
    ct = api.nodes(NODE).lxc(200)
    assert ct.config.get()['hostname'] == 'ct200'
    assert error(lambda: ct.config.put(cores=4)) == (500, 'cluster not ready - no quorum?')
    assert error(lambda: api.nodes(NODE).lxc.post(vmid=201, ostemplate=lab.info['template'])) == \
        (500, 'cluster not ready - no quorum?')
    lab.pve_set(quorate=True)
    ct.config.put(cores=4)


def test_offline_node(lab, api):
    lab.pve_set(node_online=(NODE, False))
    assert error(lambda: api.nodes(NODE).lxc(200).config.get()) == (595, 'No route to host')
    assert error(lambda: api.nodes(NODE).lxc(200).config.put(cores=4)) == (595, 'No route to host')
    lab.pve_reset()
    assert api.nodes(NODE).lxc(200).config.get()['hostname'] == 'ct200'


def test_guest_lock(lab, api):
    ct = api.nodes(NODE).lxc(200)
    lab.pve_set(lock=(200, 'backup'))
    assert ct.config.get()['lock'] == 'backup'
    assert error(lambda: ct.config.put(cores=4)) == (500, 'CT is locked (backup)')
    assert task_exit(api, ct.status.shutdown.post()) == 'CT is locked (backup)'
    lab.pve_set(unlock=200)
    ct.config.put(cores=4)


def test_held_config_lock_times_out(lab, api):
    ct = api.nodes(NODE).lxc(200)
    lab.pve_set(hold_config_lock=(200, None))
    assert error(lambda: ct.config.put(cores=4)) == (500, "can't lock file '/run/lock/lxc/pve-config-200.lock' - got timeout")
    # With time running, a write waits lock_wait (PVE seconds x time_scale) before it gives up;
    # a lock held for a while is released by itself.
    lab.pve_set(time_scale=1.0, lock_wait=0.5)
    t0 = time.time()
    error(lambda: ct.config.put(cores=4))
    assert time.time() - t0 >= 0.5
    lab.pve_set(release_config_lock=200, hold_config_lock=(200, 0.3))
    ct.config.put(cores=4)
    lab.pve_reset()


@pytest.mark.parametrize('op', ['revoke_tickets', 'expire_tickets'])
def test_tickets_gone(lab, api, op):
    lab.pve_set(**{op: True})
    assert error(lambda: api.nodes(NODE).lxc(200).config.get()) == (401, 'permission denied - invalid PVE ticket')
    assert lab.api().nodes(NODE).lxc(200).config.get()['hostname'] == 'ct200'  # a new login works


def test_flaky_network(lab, api):
    p = lab.info['pve']
    slow = proxmoxer.ProxmoxAPI(p['host'], port=p['port'], user='root@pam', password=open(p['password_file']).read(),
                                verify_ssl=p['cafile'], timeout=0.5)
    lab.pve_set(network={'drop_rate': 1.0})
    with pytest.raises(requests.exceptions.ConnectionError):
        api.nodes(NODE).lxc(200).config.get()
    with pytest.raises(requests.exceptions.ConnectionError):
        lab.api()  # the login too
    lab.pve_set(network={'drop_rate': 0.0, 'hang_rate': 1.0, 'hang_secs': 5})
    with pytest.raises(requests.exceptions.ReadTimeout):
        slow.nodes(NODE).lxc(200).config.get()
    lab.pve_reset()
    assert slow.nodes(NODE).lxc(200).config.get()['hostname'] == 'ct200'


def test_slow_tasks_and_start_error(lab, api):
    ct = api.nodes(NODE).lxc(200)
    ct.status.stop.post()
    lab.pve_set(time_scale=1.0, guest_secs=(200, {'start': 1.0}))
    upid = ct.status.start.post()
    assert api.nodes(NODE).tasks(upid).status.get()['status'] == 'running'
    lab.wait_for(lambda: task_exit(api, upid) == 'OK', what='the slow start')
    ct.status.stop.post()
    lab.pve_set(time_scale=0, start_error=(200, 'startup for container 200 failed'))
    assert task_exit(api, ct.status.start.post()) == 'startup for container 200 failed'
    lab.pve_reset()
    assert task_exit(api, ct.status.start.post()) == 'OK'


def test_fail_and_bad_operations(lab, api):
    lab.pve_set(fail=[{'method': 'GET', 'suffix': '/lxc/200/config', 'status': 500, 'message': 'boom', 'times': 1}])
    assert error(lambda: api.nodes(NODE).lxc(200).config.get()) == (500, 'boom')
    assert api.nodes(NODE).lxc(200).config.get()['hostname'] == 'ct200'
    with pytest.raises(ValueError, match='unknown pve-set operation'):
        lab.pve_set(bogus=1)
    with pytest.raises(ValueError, match='no guest 999'):
        lab.pve_set(lock=(999, 'backup'))


# -- PCI resource mappings: stored by the lab around fakepve, checked at VM start as qemu-server does
# (lab/pvemap.py), in Proxmox's words.

ENTRY = 'node=pve-lab,path=0000:81:00.0,id=10de:2bb5,subsystem-id=10de:204e,iommugroup=40'
MAPPED_VM = 390


def start_exit(api, vmid):
    return task_exit(api, api.nodes(NODE).qemu(vmid).status.start.post())


def test_pci_mappings_are_stored_validated_and_checked_at_vm_start(lab, api):
    maps = api.cluster.mapping.pci
    maps.post(id='labgpu0', map=[ENTRY])
    try:
        assert maps('labgpu0').get()['map'] == [ENTRY]
        assert [m['id'] for m in maps.get()] == ['labgpu0']
        assert error(lambda: maps.post(id='labgpu0', map=[ENTRY])) == (
            500, "create hardware mapping failed: pci ID 'labgpu0' already defined")
        # PVE's schema, through fakepve: the id's format and the entry's property string.
        assert error(lambda: maps.post(id='0gpu', map=[ENTRY]))[0] == 400
        assert error(lambda: maps.post(id='labgpu9', map=['node=pve-lab,path=81:00.0;x,id=10de:2bb5']))[0] == 400
        assert 'labgpu0\n\tmap %s\n' % ENTRY in open(lab.host.path('etc/pve/mapping/pci.cfg')).read()

        api.nodes(NODE).qemu.post(vmid=MAPPED_VM, machine='q35', hostpci0='mapping=labgpu0,pcie=1')
        vm = api.nodes(NODE).qemu(MAPPED_VM)
        assert start_exit(api, MAPPED_VM) == 'OK'
        vm.status.stop.post()
        # An entry that no longer matches the device: Proxmox's check, in its order (id, iommugroup, ...).
        maps('labgpu0').put(map=[ENTRY.replace('iommugroup=40', 'iommugroup=41')])
        assert start_exit(api, MAPPED_VM) == ("PCI device mapping invalid (hardware probably changed): 'iommugroup' "
                                              "does not match for 'labgpu0' (40 != 41)")
        checks = maps.get(**{'check-node': NODE})[0]['checks']
        assert checks == [{'severity': 'error', 'message': "Invalid configuration: 'iommugroup' does not match for "
                                                           "'labgpu0' (40 != 41)\n"}]
        maps('labgpu0').put(map=[ENTRY.replace(',subsystem-id=10de:204e', '')])
        assert start_exit(api, MAPPED_VM) == ("PCI device mapping invalid (hardware probably changed): missing "
                                              "expected property 'subsystem-id' for device '0000:81:00.0'")
        # A renumbered bus: a container-side GPU where the mapped one was.
        maps('labgpu0').put(map=[ENTRY], digest=maps('labgpu0').get()['digest'])
        assert error(lambda: maps('labgpu0').put(map=[ENTRY], digest='0' * 40))[0] == 500
        lab.host.renumber({'0000:81:00.0': '0000:82:00.0', '0000:71:00.0': '0000:81:00.0'})
        try:
            assert start_exit(api, MAPPED_VM) == ("PCI device mapping invalid (hardware probably changed): "
                                                  "'iommugroup' does not match for 'labgpu0' (23 != 40)")
            assert lab.host.spec['gpus'][3]['bdf'] == '0000:81:00.0' and lab.host.group('0000:82:00.0') == 40
        finally:
            lab.host.renumber({'0000:81:00.0': '0000:71:00.0', '0000:82:00.0': '0000:81:00.0'})
        assert lab.host.group('0000:81:00.0') == 40 and lab.host.driver('0000:71:00.0') == 'nvidia'
        maps('labgpu0').delete()
        assert start_exit(api, MAPPED_VM) == "PCI device mapping not found for 'labgpu0'"
        # A raw address is checked for a device only.
        vm.config.post(hostpci0='0000:d1:00.0,pcie=1')
        assert start_exit(api, MAPPED_VM) == "no PCI device found for '0000:d1:00.0'"
    finally:
        maps('labgpu0').delete()
        if any(v['vmid'] == MAPPED_VM for v in api.nodes(NODE).qemu.get()):
            api.nodes(NODE).qemu(MAPPED_VM).delete()
