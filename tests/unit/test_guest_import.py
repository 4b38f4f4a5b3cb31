"""`pulumi import` of a Proxmox guest (issue 28): the provider's Read by id alone against fakepve (Proxmox's API,
validated against its schema) - the guest found in the cluster by its vmid, read whole and marked imported;
the import taken only for the guest the config describes; the first diff compares (and the first update owns)
only what the config declares."""

import proxmoxer
import pytest

from resources import pve
from resources.state import Failed

NODE = 'pve1'


@pytest.fixture
def api(fakepve, fakepve_cafile):
    with open(fakepve_cafile) as f:
        ca = f.read()
    return {'host': fakepve.host, 'port': fakepve.port, 'user': 'root@pam', 'password': 'secret', 'ca_cert': ca,
            'ca_file': fakepve_cafile}


def make_vm(api, vmid, **config):
    prox = proxmoxer.ProxmoxAPI(api['host'], port=api['port'], user='root@pam', password='secret',
                                verify_ssl=api['ca_file'])
    prox.nodes(NODE).qemu.post(vmid=vmid, **config)
    return prox


VM = {'name': 'snp-vm', 'cores': 8, 'memory': 16384, 'net0': 'virtio,bridge=vmbr0', 'onboot': 1,
      'hostpci0': '0000:81:00.0,pcie=1'}


def declared(api, **config):
    # (the plugin hands every call the host's login, provider/__main__.py: the old state's and the new inputs' alike)
    return {'api': api, 'node': NODE, 'kind': 'qemu', 'vmid': 300, 'create': {}, 'config': dict(config), 'start': False,
            'raw_lxc': {}, 'protect': True}


def test_read_by_id_finds_the_guest_and_reads_it_whole(api):
    make_vm(api, 300, tags='keep', **VM)
    provider = pve.PveGuestProvider()
    res = provider.read('300', {'api': api})
    assert res.id == '300'
    outs = res.outs
    assert (outs['node'], outs['kind'], outs['vmid'], outs[pve.IMPORTED]) == (NODE, 'qemu', 300, True)
    # Everything the guest has, the keys the config will not declare too (tags), none of Proxmox's bookkeeping.
    assert outs['config']['name'] == 'snp-vm' and outs['config']['tags'] == 'keep' and 'digest' not in outs['config']
    assert outs['status'] == 'stopped' and outs['start'] is False
    assert res.inputs[pve.IMPORTED] is True and res.inputs['config'] == outs['config']


def test_an_imported_guest_matching_the_config_shows_no_change_and_owns_only_what_is_declared(api):
    make_vm(api, 300, tags='keep', **VM)
    provider = pve.PveGuestProvider()
    found = provider.read('300', {'api': api})
    news = declared(api, **VM)
    assert provider.check(found.inputs, news).inputs['adopt'] is False
    diff = provider.diff('300', found.outs, news)
    assert not diff.changes and not diff.replaces
    # A declared key with another value is an update of that key alone; `tags` (not declared) is never deleted.
    diff = provider.diff('300', found.outs, declared(api, **dict(VM, cores=16)))
    assert diff.changes and not diff.replaces
    assert set(pve.as_declared(found.outs, declared(api, **dict(VM, cores=16)))['config']) == set(VM)


@pytest.mark.parametrize('change, why', [
    ({'name': 'other-vm'}, 'its name is snp-vm, the config declares other-vm'),
    ({'hostpci0': '0000:91:00.0,pcie=1'}, 'it has GPU entries the config does not give it (hostpci0: 0000:81:00.0'),
])
def test_an_import_of_another_guest_is_refused_before_anything_changes(api, change, why):
    make_vm(api, 300, **VM)
    provider = pve.PveGuestProvider()
    found = provider.read('300', {'api': api})
    with pytest.raises(Failed) as e:
        provider.check(found.inputs, declared(api, **dict(VM, **change)))
    assert 'VM 300 on pve1: not imported - ' in str(e.value) and why in str(e.value), str(e.value)
    assert 'Nothing was changed' in str(e.value)


def test_an_import_of_a_container_id_declared_as_the_vm_is_refused(api):
    make_vm(api, 300, **VM)
    provider = pve.PveGuestProvider()
    found = provider.read('300', {'api': api})
    news = dict(declared(api, **VM), kind='lxc', config={'hostname': 'sglang'})
    with pytest.raises(Failed) as e:
        provider.check(found.inputs, news)
    assert 'not imported - it is a QEMU VM' in str(e.value), str(e.value)


def test_an_id_that_is_no_guest_is_not_found_and_a_malformed_one_is_refused(api):
    provider = pve.PveGuestProvider()
    assert provider.read('301', {'api': api}).id is None
    with pytest.raises(Failed) as e:
        provider.read('vm-300', {'api': api})
    assert str(e.value) == "import of a Proxmox guest: the id is its vmid (a number, e.g. 200), not 'vm-300'"


def test_the_first_update_after_an_import_sets_the_declared_keys_and_deletes_none_it_did_not_declare(api):
    prox = make_vm(api, 300, tags='keep', description='made by hand', **VM)
    provider = pve.PveGuestProvider()
    found = provider.read('300', {'api': api})
    news = declared(api, **dict(VM, cores=16))
    outs = provider.update('300', found.outs, news).outs
    config = prox.nodes(NODE).qemu(300).config.get()
    assert int(config['cores']) == 16 and config['tags'] == 'keep' and config['description'] == 'made by hand'
    # From here the program owns what it declares, as for a guest it created: no import mark left.
    assert not outs.get(pve.IMPORTED) and set(outs['config']) == set(VM)


CT_READ = {'hostname': 'sglang', 'unprivileged': 1, 'rootfs': 'local-lvm:vm-200-disk-0,size=200G', 'ostype': 'debian',
           'cores': 32}
CT_CREATE = {'ostemplate': 'local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst', 'rootfs': 'local-lvm:200',
             'unprivileged': 1}


def imported_ct(**config):
    """A container's state as an import left it (read_by_id; no update since: a no-op `up` keeps it)."""
    return {'node': NODE, 'kind': 'lxc', 'vmid': 200, 'create': {'unprivileged': 1}, 'config': dict(CT_READ, **config),
            'start': True, 'raw_lxc': {}, 'status': 'running', 'mounts': {}, pve.IMPORTED: True}


def declared_ct(create=None, **config):
    return {'node': NODE, 'kind': 'lxc', 'vmid': 200, 'create': dict(CT_CREATE, **(create or {})),
            'config': dict({'hostname': 'sglang', 'cores': 32}, **config), 'start': True, 'raw_lxc': {},
            'protect': True}


def test_after_an_import_a_create_only_change_is_still_a_replacement_refused_while_protected():
    # (found by the lab's import test: the import's state hid every later create-only change until an update)
    provider = pve.PveGuestProvider()
    assert not provider.diff('200', imported_ct(), declared_ct()).changes
    for create, key in (({'unprivileged': 0}, 'gpuhost:container.unprivileged'),
                        ({'rootfs': 'local-lvm:400'}, 'gpuhost:container.storage/rootfs_gb'),
                        ({'ostemplate': 'local:vztmpl/ubuntu-24.04-standard_24.04-2_amd64.tar.zst'},
                         'gpuhost:container.ostemplate')):
        with pytest.raises(Failed) as e:
            provider.diff('200', imported_ct(), declared_ct(create))
        assert key in str(e.value) and 'protected' in str(e.value), str(e.value)
    diff = provider.diff('200', imported_ct(), dict(declared_ct({'unprivileged': 0}), protect=False))
    assert diff.replaces == ['create'] and diff.delete_before_replace
