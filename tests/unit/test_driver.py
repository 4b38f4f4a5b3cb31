"""resources/driver.py's pure part: what an `up` must do to a host's NVIDIA driver (gpuhost:nvidia.driver) and the
preview's words for it - old -> new, reload in place or reboot, what stops - from the facts the host gives."""

from resources import driver
from transport.driverfacts import DriverFacts

A, B = '580.95.05', '580.105.08'
OPEN = 'NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  %s  Release Build  (dvs-builder@U16)  '
SERVICE = {'vmid': 200, 'unit_name': 'sglang.service'}
PROPS = {'version': A, 'installer': {'path': '/root/NVIDIA-Linux-x86_64-%s.run' % A, 'sha256': '0' * 64},
         'service': SERVICE, 'container_gpus': ['0000:01:00.0'], 'vm_gpus': []}


def facts(loaded=A, kernels=None, running='6.8.12-4-pve'):
    return DriverFacts(loaded=loaded, flavour_line=(OPEN % loaded) if loaded else None, running=running,
                       kernels=dict(kernels if kernels is not None else {'6.8.12-4-pve': A}))


def test_as_declared_nothing_to_do():
    p = driver.plan(facts(), A, 'open', 200, 'never')
    assert p.kind == 'none'
    assert driver.observe(facts(), A) == {'version': A, 'modules': 'open', 'kernels_missing': [],
                                          'installed': {'6.8.12-4-pve': A}, 'running_kernel': '6.8.12-4-pve'}


def test_a_kernel_update_without_the_module_is_a_build_where_nothing_stops():
    f = facts(kernels={'6.8.12-4-pve': A, '6.8.12-9-pve': '', '6.8.12-2-pve': '?'})
    p = driver.plan(f, A, 'open', 200, 'never')
    assert (p.kind, p.kernels) == ('build', ['6.8.12-9-pve'])    # '?' (no modinfo) is said elsewhere, not guessed
    assert driver.price(p, SERVICE) == (
        'the loaded module is 580.95.05 as declared, but kernel 6.8.12-9-pve has no nvidia 580.95.05 module built: a '
        'boot into it runs without it. `up` builds it with DKMS; nothing stops')
    assert driver.observe(f, A)['installed'] == {'6.8.12-2-pve': '?', '6.8.12-4-pve': A, '6.8.12-9-pve': '-'}


def test_a_new_version_held_by_nothing_else_reloads_in_place_and_stops_sglang():
    f = facts(kernels={'6.8.12-4-pve': A, '6.8.12-9-pve': A})
    p = driver.plan(f, B, 'open', 200, 'never')
    assert (p.kind, p.old, p.new, p.kernels) == ('reload', A, B, ['6.8.12-4-pve', '6.8.12-9-pve'])
    assert driver.price(p, SERVICE) == (
        '580.95.05 -> 580.105.08 (open kernel modules, built with DKMS for kernels 6.8.12-4-pve, 6.8.12-9-pve): the '
        'modules can be reloaded in place (nothing but SGLang holds them): SGLang in container 200 (sglang.service) '
        'stops for it, then restarts on the new user space. The VM\'s GPUs stay on vfio-pci, untouched')


def test_no_module_loaded_is_a_load():
    p = driver.plan(facts(loaded=None), B, 'open', 200, 'never')
    assert p.kind == 'load' and driver.price(p, None).startswith('not loaded -> 580.105.08')


def test_a_proprietary_module_at_the_declared_version_is_not_what_is_declared():
    f = facts()
    f.flavour_line = 'NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Release Build'
    assert driver.plan(f, A, 'open', 200, 'never').kind == 'reload'
    assert driver.observe(f, A)['modules'] == 'proprietary'


def holder(pid, comm, cgroup):
    from transport.driverfacts import Process, cgroup_vmid
    return Process(pid=pid, comm=comm, cgroup=cgroup, devices=('nvidia0', 'nvidiactl'), vmid=cgroup_vmid(cgroup))


def test_sglang_and_persistenced_do_not_keep_a_reload_from_happening():
    f = facts()
    f.unreadable = 0
    f.processes = [holder(4242, 'python3', '/lxc/200/ns/system.slice/sglang.service'),
                   holder(917, 'nvidia-persiste', '/system.slice/nvidia-persistenced.service')]
    assert driver.plan(f, B, 'open', 200, 'never').kind == 'reload'


def test_another_holder_means_a_reboot_where_allowed_and_nothing_touched_where_not():
    f = facts()
    f.unreadable = 2
    f.processes = [holder(4242, 'python3', '/lxc/200/ns/system.slice/sglang.service'),
                   holder(5150, 'dcgm-exporter', '/system.slice/dcgm-exporter.service'),
                   holder(777, 'nvidia-smi', '/lxc/201/ns/user.slice')]
    p = driver.plan(f, B, 'open', 200, 'when-required')
    assert p.kind == 'reboot'
    assert p.others == ['dcgm-exporter (pid 5150, on the host)', 'nvidia-smi (pid 777, container 201)',
                        '2 processes whose open files could not be read']
    assert driver.price(p, SERVICE) == (
        '580.95.05 -> 580.105.08 (open kernel modules, built with DKMS for kernels 6.8.12-4-pve): the modules cannot '
        'be unloaded in place - held by dcgm-exporter (pid 5150, on the host), nvidia-smi (pid 777, container 201), 2 '
        'processes whose open files could not be read - so the host reboots into 580.105.08 (gpuhost:host.reboot: '
        'when-required): SGLang in container 200 (sglang.service) stops for it, then restarts on the new user '
        'space, and every guest stops while it reboots')
    assert p.kind in driver.DONE_BY_UP      # `up` does it (the job holds the modules back at the next boot)
    assert driver.upgrade_job(dict(PROPS, version=B), 'reboot').args[-1] == 'reboot'
    held = driver.plan(f, B, 'open', 200, 'never')
    assert held.kind == 'held'
    assert driver.price(held, SERVICE) == (
        '580.95.05 -> 580.105.08 (open kernel modules, built with DKMS for kernels 6.8.12-4-pve): nothing is touched - '
        'the modules are held by dcgm-exporter (pid 5150, on the host), nvidia-smi (pid 777, container 201), 2 '
        'processes whose open files could not be read besides SGLang, and gpuhost:host.reboot is never. Stop what '
        'holds them, or allow a reboot (gpuhost:host.reboot: when-required), and re-run')


def build_facts(**kw):
    from transport.driverfacts import parse_dkms
    f = facts(kernels={'6.8.12-4-pve': A, '6.8.12-9-pve': ''})
    f.dkms_tool = True
    f.dkms = [parse_dkms('nvidia/%s, 6.8.12-4-pve, x86_64: installed' % A)]
    f.headers = {'6.8.12-4-pve': True, '6.8.12-9-pve': True}
    for k, v in kw.items():
        setattr(f, k, v)
    return f


def test_a_build_is_done_by_up_and_does_not_take_the_host_down():
    p = driver.plan(build_facts(), A, 'open', 200, 'never')
    assert (p.kind, p.kernels, p.refused) == ('build', ['6.8.12-9-pve'], None)
    assert 'build' in driver.DONE_BY_UP and 'build' not in driver.GOES_DOWN
    assert driver.price(p, SERVICE).endswith('`up` builds it with DKMS; nothing stops')
    job = driver.build_job({'timeout': 3600, 'stall': 600}, p)
    assert (job.name, job.args) == ('gpuhost-driver', ('build', A, '6.8.12-9-pve'))
    assert job.label == 'the NVIDIA driver build of 580.95.05 for kernel 6.8.12-9-pve'


def test_a_kernel_without_headers_is_refused_naming_it_and_the_fix():
    f = build_facts(headers={'6.8.12-4-pve': True, '6.8.12-9-pve': False})
    p = driver.plan(f, A, 'open', 200, 'never')
    assert p.refused == (
        'kernel 6.8.12-9-pve has no headers (/lib/modules/6.8.12-9-pve/build), so DKMS cannot build the module for it: '
        'apt install proxmox-headers-6.8.12-9-pve (or remove the kernel) and re-run; nothing was changed')
    assert driver.price(p, SERVICE).endswith('a boot into it runs without it. `up` cannot build it: ' + p.refused)


def test_a_driver_installed_without_dkms_is_refused_saying_what_to_do():
    from transport.driverfacts import parse_dkms
    other = build_facts(dkms=[parse_dkms('nvidia/%s, 6.8.12-4-pve, x86_64: installed' % B)])
    assert driver.plan(other, A, 'open', 200, 'never').refused == (
        '`dkms status -m nvidia` has no nvidia/580.95.05 - the running driver was not installed with DKMS, so '
        '580.95.05 cannot be built for kernel 6.8.12-9-pve: re-install 580.95.05 with the installer\'s --dkms '
        '(docs/operator-guide.md: the host\'s NVIDIA driver), or remove the kernel; nothing was changed')
    absent = build_facts(dkms_tool=False, dkms=[])
    assert driver.plan(absent, A, 'open', 200, 'never').refused.startswith(
        'dkms is not installed on the host, so 580.95.05 cannot be built for kernel 6.8.12-9-pve: install dkms (apt '
        'install dkms), then re-install 580.95.05 with the installer\'s --dkms')
    # Not read (dkms failed): the job finds out, not a guess here.
    assert driver.plan(build_facts(dkms=None), A, 'open', 200, 'never').refused is None


def test_the_job_refuses_with_the_same_words():
    """hostscripts/driver_upgrade.sh's build mode checks again on the host (changed since the read): its words are
    the program's."""
    from transport import remote
    text = remote.script('driver_upgrade.sh')
    assert driver.NO_HEADERS % ('$k', '$k', '$k') in text
    assert driver.NO_DKMS % ('$why', '$version', '${2:+s}', '$*', '${fix}', '$version') in text


def test_goes_down_only_for_a_plan_that_stops_sglang(monkeypatch):
    prov = driver.NvidiaDriverProvider()
    props = {'connection': {'host': '10.0.0.1', 'port': 22}, 'version': A, 'modules': 'open', 'service': SERVICE}
    monkeypatch.setattr(driver, 'read', lambda target: build_facts())
    monkeypatch.setattr(driver.remote.Target, 'from_inputs', classmethod(lambda cls, conn: None))
    monkeypatch.setattr(driver.driverfacts, 'container_processes', lambda target, vmid: [])
    assert prov.goes_down(props) is False
    monkeypatch.setattr(driver, 'read', lambda target: facts(loaded=B))
    assert prov.goes_down(props) is True

    def unreachable(target):
        raise driver.remote.RemoteError('connection refused')
    monkeypatch.setattr(driver, 'read', unreachable)
    assert prov.goes_down(props) is True


def test_a_host_changed_between_its_turn_and_the_apply_is_refused(monkeypatch):
    prov = driver.NvidiaDriverProvider()
    props = {'connection': {'host': '10.0.0.1', 'port': 22}, 'version': A, 'modules': 'open', 'service': SERVICE}
    monkeypatch.setattr(driver.remote.Target, 'from_inputs', classmethod(lambda cls, conn: None))
    monkeypatch.setattr(driver.driverfacts, 'container_processes', lambda target, vmid: [])
    monkeypatch.setattr(driver, 'read', lambda target: build_facts())
    assert prov.goes_down(props) is False           # a build: it did not wait for its turn
    monkeypatch.setattr(driver, 'read', lambda target: facts(loaded=None))    # unloaded out of band since
    import pytest
    with pytest.raises(driver.DriverError, match='changed while this `up` ran .* did not wait for its turn in the '
                                                 'rollout\\); nothing was changed - re-run `up`'):
        prov.apply(props)


def test_in_a_fleet_each_line_names_its_host_as_the_resource_does():
    # The plugin's log lines carry no resource: three hosts' prices would otherwise read alike.
    assert driver.label({'version': B}) == 'host-nvidia-driver'
    assert driver.label({'version': B, 'rollout': {'host': 'gpu03', 'order': ['gpu01', 'gpu03'], 'before': ['gpu01'],
                                                   'after': [], 'max_unavailable': 1}}) == 'gpu03-host-nvidia-driver'


def test_an_upgrade_a_ctrl_c_left_half_way_is_priced_as_followed_from_the_version_it_left():
    """Its modules unloaded mid-install: not "not loaded -> C, installs and loads it", but the job's own record."""
    from transport import driverfacts
    f = driverfacts.parse('running\t6.8.12-4-pve\nupgrade\tinstalling\t%s\t%s\nkernel\t6.8.12-4-pve\t-\n' % (A, B))
    assert f.upgrade_under_way(B) == ('installing', A) and f.upgrade_under_way('580.119.02') is None
    p = driver.plan(f, B, 'open', 200, 'never')
    assert (p.kind, p.old, p.resuming) == ('load', A, 'installing')
    assert driver.price(p, SERVICE) == (
        '580.95.05 -> 580.105.08 (open kernel modules, built with DKMS for kernels 6.8.12-4-pve): the upgrade is under '
        'way on the host (its job gpuhost-driver is at its step installing, left by an earlier `up`): `up` re-attaches '
        'to it or goes on from that step - never a second install -, then the container\'s user space and SGLang '
        'follow')
    # Ended (done, restored) or to another version: a plan as any other.
    done = driverfacts.parse('loaded\t%s\nrunning\t6.8.12-4-pve\nupgrade\tdone\t%s\t%s\n' % (A, '-', A))
    assert done.upgrade_under_way(A) is None and driver.plan(done, B, 'open', 200, 'never').resuming is None
