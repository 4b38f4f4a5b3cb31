"""Proxmox value normalisation: what counts as a difference, and the smallest change."""

from transport import proxmox
from tests.unit.inflight import InFlight
from resources.pve import changes, merge_pending, observed_config, parse_raw, same_value, with_raw


def test_proxmox_additions_are_not_differences():
    assert same_value('net0', 'name=eth0,bridge=vmbr0,ip=10.0.0.20/24',
                      'name=eth0,bridge=vmbr0,hwaddr=BC:24:11:22:5B:4D,ip=10.0.0.20/24,type=veth')
    assert same_value('net0', 'virtio,bridge=vmbr0', 'virtio=BC:24:11:00:00:01,bridge=vmbr0')
    assert same_value('cores', 32, '32') and same_value('onboot', True, 1)
    assert same_value('dev0', '/dev/nvidia0,mode=0666', 'path=/dev/nvidia0,mode=0666')
    assert same_value('hostpci0', '0000:81:00.0,pcie=1', '0000:81:00.0,pcie=1,rombar=1')


def test_real_differences_are():
    # A property the config does not set (smuggled in once through a comma) is a difference.
    assert not same_value('net0', 'name=eth0,bridge=vmbr0,ip=10.0.0.20/24',
                          'name=eth0,bridge=vmbr0,ip=10.0.0.20/24,rate=1,hwaddr=BC:24:11:22:5B:4D')
    assert not same_value('hostpci0', '0000:81:00.0,pcie=1', '0000:81:00.0,pcie=1,x-vga=1')
    assert not same_value('net0', 'name=eth0,bridge=vmbr0,ip=10.0.0.20/24', 'name=eth0,bridge=vmbr1,ip=10.0.0.20/24')
    assert not same_value('hostpci0', '0000:81:00.0,pcie=1', '0000:91:00.0,pcie=1')
    assert not same_value('cores', 32, 8)
    assert not same_value('dev0', '/dev/nvidia0,mode=0666', None)


def test_smallest_change_sets_only_differences_and_deletes_dropped_keys():
    desired = {'cores': 32, 'memory': 1024, 'dev0': '/dev/nvidia0,mode=0666'}
    actual = {'cores': 8, 'memory': 1024, 'dev0': '/dev/nvidia0,mode=0666', 'dev9': '/dev/old', 'ostype': 'debian'}
    to_set, to_delete = changes(desired, actual, ['cores', 'memory', 'dev0', 'dev9'])
    assert to_set == {'cores': '32'} and to_delete == ['dev9']
    assert observed_config(desired, actual) == {'cores': 8, 'memory': 1024, 'dev0': '/dev/nvidia0,mode=0666'}


def test_pending_values_count_as_applied_and_are_listed():
    cfg, pending = merge_pending([{'key': 'cores', 'value': 4}, {'key': 'hostpci3', 'pending': '0000:f1:00.0,pcie=1'},
                                  {'key': 'hostpci2', 'value': '0000:e1:00.0', 'delete': 1}])
    assert cfg == {'cores': 4, 'hostpci3': '0000:f1:00.0,pcie=1'} and pending == ['hostpci2', 'hostpci3']


def test_raw_lines_replace_only_managed_keys_and_stay_out_of_snapshots():
    text = ('arch: amd64\nlxc.cgroup2.cpuset.cpus: 1-2\nlxc.apparmor.profile: unconfined\n\n'
            '[snap1]\nlxc.cgroup2.cpuset.cpus: 9\n')
    new = with_raw(text, {'lxc.cgroup2.cpuset.cpus': '0-31,64-95'})
    assert parse_raw(new) == {'lxc.apparmor.profile': 'unconfined', 'lxc.cgroup2.cpuset.cpus': '0-31,64-95'}
    assert new.endswith('\n[snap1]\nlxc.cgroup2.cpuset.cpus: 9\n')
    assert with_raw(new, {'lxc.cgroup2.cpuset.cpus': '0-31,64-95'}) == new


# Adoption (gpuhost:<side>.adopt): what keeps a running guest from being taken in as declared.
CT = {'kind': 'lxc', 'vmid': 200, 'config': {'hostname': 'sglang'},
      'create': {'ostemplate': 'local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst', 'rootfs': 'local-lvm:200',
                 'unprivileged': 1}}
RUNNING = {'hostname': 'sglang', 'unprivileged': 1, 'ostype': 'debian',
           'rootfs': 'local-lvm:vm-200-disk-0,size=200G'}


def test_a_guest_as_declared_can_be_adopted():
    from resources.pve import refusals
    assert refusals(CT, RUNNING) == []
    assert refusals(dict(CT, kind='qemu', config={'name': 'sev'}), {'name': 'sev'}) == []


def test_each_difference_a_new_guest_would_need_is_named_with_its_key():
    from resources.pve import refusals
    running = dict(RUNNING, hostname='web', unprivileged=0, ostype='ubuntu', rootfs='fast:vm-200-disk-0,size=8G')
    out = refusals(CT, running)
    assert len(out) == 5, out
    assert 'its hostname is web, the config declares sglang (gpuhost:container.hostname)' in out[0]
    assert 'pct set 200 --hostname sglang' in out[0]
    assert out[1] == 'it is privileged, the config declares unprivileged (gpuhost:container.unprivileged: false)'
    assert out[2] == 'its root disk is on storage fast, the config declares local-lvm (gpuhost:container.storage: fast)'
    assert out[3] == 'its root disk is 8 GB, the config declares 200 GB (gpuhost:container.rootfs_gb: 8)'
    assert out[4].startswith('it runs ubuntu, gpuhost:container.ostemplate is a debian template')
    vm = refusals(dict(CT, kind='qemu', vmid=300, config={'name': 'sev'}), {'name': 'other'})
    assert vm == ['its name is other, the config declares sev (gpuhost:vm.name) - is gpuhost:vm.vmid the right '
                  'guest? If it is, rename it first (qm set 300 --name sev)']


def test_sizes_and_templates_as_proxmox_writes_them():
    from resources.pve import size_gb, template_ostype
    assert [size_gb(s) for s in ('8G', '512M', '1T', '200', '', 'x')] == [8.0, 0.5, 1024.0, 200.0, None, None]
    assert template_ostype('local:vztmpl/ubuntu-24.04-standard_24.04-2_amd64.tar.zst') == 'ubuntu'
    assert template_ostype('local:vztmpl/custom.tar.zst') is None


def test_a_guest_the_stack_holds_is_never_adopted_again():
    # Its check (no host contacted) turns adopt off: a later replacement creates, never takes over a guest.
    from resources.pve import PveGuestProvider
    olds = {'kind': 'lxc', 'vmid': 200, 'adopt': True}
    assert PveGuestProvider().check(olds, dict(olds, vmid=201)).inputs['adopt'] is False


# A mount point the container already has that the program did not set (gpuhost:model.mp colliding with it).
MODEL_MP = '/var/lib/gpuhost-models,mp=/models,ro=1'
THEIRS = 'tank:subvol-200-disk-1,mp=/srv/data,size=500G'
HELD = dict(CT, node='pve1', config={'hostname': 'sglang', 'mp0': MODEL_MP}, start=True, raw_lxc={})


def test_a_model_mount_point_the_container_has_of_its_own_is_refused_at_preview():
    """The preview's diff: the state (after the last up or refresh) recorded the container's mount points; mp1
    there, not set by the program, and the config now declares the model at mp1."""
    from resources.pve import PveGuestProvider
    from resources.state import Failed
    import pytest
    olds = dict(HELD, mounts={'mp0': MODEL_MP, 'mp1': THEIRS})
    news = dict(HELD, config={'hostname': 'sglang', 'mp1': MODEL_MP})
    with pytest.raises(Failed) as e:   # (the message alone, as the engine shows it)
        PveGuestProvider().diff('200', olds, news)
    text = str(e.value)
    assert text.startswith('container 200 on pve1: gpuhost:model.mp: 1 would replace the container\'s own mp1 (%s), '
                           'a mount point this program did not set, with the model\'s (%s)' % (THEIRS, MODEL_MP)), text
    assert 'pct config 200' in text and 'pct set 200 --delete mp1' in text
    # The program's own mount point changing, or a free one: no refusal.
    assert PveGuestProvider().diff('200', dict(HELD, mounts={'mp0': MODEL_MP}), news).changes
    same = dict(HELD, mounts={'mp0': MODEL_MP, 'mp1': MODEL_MP})
    assert PveGuestProvider().diff('200', same, news).changes


def test_adopting_a_container_whose_mount_point_the_model_would_replace_is_refused():
    from resources.pve import refusals
    props = dict(CT, config={'hostname': 'sglang', 'mp1': MODEL_MP})
    out = refusals(props, dict(RUNNING, mp1=THEIRS))
    assert len(out) == 1 and out[0].startswith("gpuhost:model.mp: 1 would replace the container's own mp1 (%s)"
                                               % THEIRS), out
    assert refusals(props, dict(RUNNING, mp1=MODEL_MP)) == []


class FakeGuest(object):
    """prox.nodes(node).lxc(vmid) as far as update() uses it; records every write."""

    def __init__(self, config):
        import types
        self.cfg, self.writes = dict(config), []
        guest = self
        self.config = types.SimpleNamespace(get=lambda: dict(guest.cfg, digest='d1'), put=self.put, post=self.put)
        self.pending = types.SimpleNamespace(get=lambda: [{'key': k, 'value': v} for k, v in sorted(guest.cfg.items())])
        self.status = types.SimpleNamespace(current=types.SimpleNamespace(get=lambda: {'status': 'running', 'pid': 7}))

    def put(self, **params):
        self.writes.append(params)
        self.cfg.update({k: v for k, v in params.items() if k not in ('digest', 'delete')})


def test_up_never_overwrites_a_mount_point_the_program_did_not_set(monkeypatch):
    """A state from before the mount points were recorded (or `up` without a refresh after mp1 was set): the
    update reads the container and refuses before any write."""
    import contextlib
    import types
    import pytest
    from resources import pve
    from resources.state import Failed
    ct = FakeGuest({'hostname': 'sglang', 'mp0': MODEL_MP, 'mp1': THEIRS})
    prox = types.SimpleNamespace(nodes=lambda node: types.SimpleNamespace(lxc=lambda vmid: ct))
    monkeypatch.setattr(pve, 'client', contextlib.contextmanager(lambda api: (yield prox)))
    news = dict(HELD, api={}, connection={}, raw_lxc=None, config={'hostname': 'sglang', 'cores': 8, 'mp1': MODEL_MP})
    with pytest.raises(Failed) as e:
        pve.PveGuestProvider().update('200', dict(HELD), news)
    assert str(e.value).startswith("container 200 on pve1: gpuhost:model.mp: 1 would replace the container's own mp1 "
                                   "(%s)" % THEIRS)
    assert str(e.value).endswith('Nothing was changed.')
    assert ct.writes == [] and ct.cfg['mp1'] == THEIRS


def test_a_replacement_is_not_held_up_by_the_old_containers_mount_points():
    """A new container (protect: false, a create-only key changed) has no mount point of its own."""
    from resources.pve import PveGuestProvider
    olds = dict(HELD, mounts={'mp0': MODEL_MP, 'mp1': THEIRS}, protect=False)
    news = dict(HELD, protect=False, config={'hostname': 'sglang', 'mp1': MODEL_MP},
                create=dict(HELD['create'], unprivileged=0))
    assert PveGuestProvider().diff('200', olds, news).replaces == ['create']


def test_the_api_ca_is_one_file_per_ca_in_the_cache_and_unused_ones_are_pruned(tmp_path, monkeypatch):
    # Each run used to leave a /tmp/gpuhost-ca-* directory: the engine ends provider processes without
    # their exit handlers. The CA (public) is now kept once, by content, in the user's cache.
    import os
    import time
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
    first = proxmox._ca_file('-----BEGIN CERTIFICATE-----\nA\n')
    assert proxmox._ca_file('-----BEGIN CERTIFICATE-----\nA\n') == first
    assert open(first).read() == '-----BEGIN CERTIFICATE-----\nA\n'
    folder = tmp_path / 'gpuhost' / 'ca'
    assert oct(folder.stat().st_mode & 0o777) == '0o700'
    old = time.time() - (proxmox.CA_KEEP_DAYS + 1) * 86400
    os.utime(first, (old, old))
    second = proxmox._ca_file('-----BEGIN CERTIFICATE-----\nB\n')
    assert sorted(os.listdir(folder)) == [os.path.basename(second)]
    assert os.path.exists(proxmox._ca_file('-----BEGIN CERTIFICATE-----\nA\n'))


def test_endpoints_log_in_at_the_same_time_and_one_endpoint_logs_in_once(monkeypatch):
    """pve.client(): a lock per endpoint around its login, none across endpoints (a fleet's hosts log in together;
    the resources of one host share its one ticket)."""
    login = InFlight(lambda _api: object())
    monkeypatch.setattr(proxmox, '_login', login)
    monkeypatch.setattr(proxmox, '_clients', {})
    got = []

    def use(host):
        with proxmox.client({'host': host, 'port': 8006, 'user': 'root@pam', 'password': 'p', 'ca_cert': 'c'}) as prox:
            got.append(prox)
    login.run([lambda i=i: use('10.0.0.%d' % (i % 3)) for i in range(6)], at_once=3)
    assert login.most == 3, 'the endpoints logged in one after another'
    logins = [api['host'] for api, in login.calls]
    assert sorted(logins) == ['10.0.0.0', '10.0.0.1', '10.0.0.2'] and len({id(p) for p in got}) == 3
