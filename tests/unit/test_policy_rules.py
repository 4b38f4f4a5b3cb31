"""The policy pack's rules (policy/gpuhost_rules.py) as pure functions: the inputs the components
really pass (rendered from the lab config), then doctored ones in the spellings the kernel, systemd,
SGLang and Proxmox accept. The same rules through the real CLI: tests/integration/test_policy.py."""

import copy
import os
import sys

import pytest

from tests.unit.config.test_config import parse

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, 'policy'))

import gpuhost_rules as rules  # noqa: E402
from resources import host as host_mod, sglang  # noqa: E402
from components import vm as vm_mod  # noqa: E402

D = parse()
# The same host with the VM's GPUs as raw hostpci addresses (gpuhost:vm.gpu_binding: address).
D_ADDR = parse(vm__gpu_binding='address')
CONN = {'host': 'h', 'port': 22, 'user': 'root', 'private_key': 'PRIVATE-KEY-TEXT', 'host_key': 'k', 'timeout': 5}
API = {'host': 'h', 'port': 8006, 'user': 'root@pam', 'password': 'API-PASSWORD-TEXT', 'ca_cert': 'pem', 'timeout': 5}
INVENTORY = [g.model_dump() for g in D.host.gpus]
DYN = 'gpuhost:index:'


def res(type_, name, **props):
    return rules.Res(DYN + type_, name, 'urn:pulumi:t::p::%s::%s' % (type_, name), props)


def cmdline_res(ensure=None, **kw):
    return res('KernelCmdline', 'host-kernel-cmdline', connection=CONN, ensure_args=ensure or D.iommu.kernel_args(),
               dangerous_args=[], policy=D.kernel_policy(), inventory=INVENTORY,
               blackwell_ids=['10de:2bb1', '10de:2bb4', '10de:2bb5'], **kw)


def file_res(content=None, path=host_mod.MODPROBE_FILE, name='host-nvidia-options'):
    return res('HostFile', name, connection=CONN, path=path, mode='0644', post='initramfs',
               content=host_mod.modprobe_content(1) if content is None else content, inventory=INVENTORY)


def vfio_res(devices=None, container=None):
    return res('VfioBinding', 'host-vfio', connection=CONN, driver='vfio-pci',
               devices=list(D.vm.gpus) if devices is None else devices,
               container_devices=list(D.container.gpus) if container is None else container,
               container_vmid=200.0, inventory=INVENTORY)


def lxc_res(config=None, api=None, gpu_devices=None, vmid=200.0):
    cfg = {'hostname': 'sglang', 'cores': 32.0, 'net0': 'name=eth0,bridge=vmbr0,ip=127.0.0.4/8'}
    cfg.update(D.container_devices())
    cfg.update(config or {})
    return res('ProxmoxGuest', 'container-lxc', api=API if api is None else api, connection=CONN, kind='lxc',
               vmid=vmid, config={k: v for k, v in cfg.items() if v is not None},
               gpu_devices={b: '/dev/nvidia%d' % i for i, b in enumerate(D.container.gpus)}
               if gpu_devices is None else gpu_devices)


def qemu_res(config=None, api=None, guard=None, d=D_ADDR):
    """The VM as the components pass it; by raw address unless d says mapping (D)."""
    cfg = dict(vm_mod.vm_config(d))
    cfg.update(config or {})
    return res('ProxmoxGuest', 'vm-qemu', api=API if api is None else api, kind='qemu', vmid=300.0,
               config={k: v for k, v in cfg.items() if v is not None},
               guard_gpus=list(D.container.gpus) if guard is None else guard, gpu_binding=d.vm.gpu_binding)


def pcimap_res(paths=None, guard=None):
    """The VM's PciMappings as the components pass them (D: the default, gpu_binding mapping); paths:
    {mapping id: address} to put elsewhere."""
    props = vm_mod.mapping_props(D)
    for mid, path in (paths or {}).items():
        props['mappings'][mid] = dict(props['mappings'][mid], path=path)
    if guard is not None:
        props['guard'] = dict(props['guard'], gpus=guard)
    return res('PciMappings', 'vm-pci-mappings', api=API, connection=CONN, entries=None, **props)


def unit_res(*subs, version='0.5.23'):
    text = sglang.unit_text(D)
    for old, new in subs:
        assert old in text, old
        text = text.replace(old, new)
    return res('SglangUnit', 'sglang-unit', connection=CONN, unit=text, version=version, vmid=200.0,
               unit_name='sglang-qwen.service', endpoint='http://127.0.0.4:30000',
               launch_args=sglang.flag_groups(D.launch_args()))


def run(rule, *resources, cfg=None):
    """Findings of `rule` for the last resource, after the others were analyzed in this run."""
    reg = rules.Registry()
    out = []
    for r in resources:
        out = rules.check(rule, r, reg, cfg)
    return out


def everything(binding='mapping'):
    vm = [pcimap_res(), qemu_res(d=D)] if binding == 'mapping' else [qemu_res()]
    return [cmdline_res(), file_res(), vfio_res(), lxc_res()] + vm + [unit_res()]


@pytest.mark.parametrize('binding', ['mapping', 'address'])
@pytest.mark.parametrize('rule', rules.RULES)
def test_the_inputs_the_components_pass_for_the_lab_pass_every_rule(rule, binding):
    reg = rules.Registry()
    cfg = {'allow_public_bind': True} if rule == rules.PRIVATE_BIND else None  # the lab binds 0.0.0.0, opted in
    for r in everything(binding):
        assert rules.check(rule, r, reg, cfg) == [], (rule, r.name)


# ------------------------------------------------------------------------- 1 identity

@pytest.mark.parametrize('arg', ['iommu=pt', 'iommu=pt,nofoo', 'iommu=ptx', 'iommu.passthrough=1',
                                 'iommu.passthrough=y', 'iommu.passthrough=on', 'iommu.passthrough=True',
                                 '"iommu=pt"', 'quiet iommu=pt', 'iommu="pt"'])
def test_identity_in_any_spelling_is_stopped(arg):
    out = run(rules.NO_IDENTITY, cmdline_res(D.iommu.kernel_args() + [arg]))
    assert len(out) == 1 and 'identity (passthrough)' in out[0] and 'FSP error 0x177' in out[0], out
    assert out[0].startswith('host-kernel-cmdline: ensure_args puts ')
    assert 'gpuhost:iommu.domain: DMA-FQ' in out[0]


@pytest.mark.parametrize('arg', ['iommu.passthrough=0', 'iommu.passthrough=off', 'iommu=nopt', 'iommu.strict=1',
                                 'amd_iommu=force_isolation', 'quiet'])
def test_translated_spellings_pass(arg):
    assert run(rules.NO_IDENTITY, cmdline_res(['iommu.strict=0', arg])) == []


def test_identity_is_allowed_only_on_a_host_whose_inventory_has_no_blackwell_gpu():
    other = [{'address': '0000:01:00.0', 'numa': 0.0, 'id': '10de:2330'}]
    r = cmdline_res(['iommu=pt'])
    r.props.update(inventory=other, blackwell_ids=[], policy={'blackwell': False})
    assert run(rules.NO_IDENTITY, r) == []
    r.props.update(inventory=[])  # no inventory: assume the host this program manages
    assert run(rules.NO_IDENTITY, r)


@pytest.mark.parametrize('path,content', [
    ('/etc/kernel/cmdline', 'root=ZFS=rpool/ROOT/pve-1 boot=zfs iommu=pt\n'),
    ('/etc/default/grub', 'GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet iommu.passthrough=1"\n'),
    ('/etc/default/grub.d/iommu.cfg', 'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX iommu=pt"\n')])
def test_a_host_file_that_writes_identity_into_the_boot_configuration_is_stopped(path, content):
    out = run(rules.NO_IDENTITY, file_res(content, path=path, name='boot'))
    assert len(out) == 1 and ('writes' in out[0] and path in out[0]), out


def test_a_commented_grub_line_is_not_a_parameter():
    assert run(rules.NO_IDENTITY, file_res('# GRUB_CMDLINE_LINUX="iommu=pt"\n', path='/etc/default/grub')) == []


# ------------------------------------------------------------------------- 2 vfio by address

@pytest.mark.parametrize('arg', ['vfio-pci.ids=10de:2bb5', 'vfio_pci.ids=10de:2bb5', 'pci-stub.ids=10de:2bb5'])
def test_binding_by_id_on_the_command_line_is_stopped(arg):
    out = run(rules.VFIO_BY_ADDRESS, cmdline_res(D.iommu.kernel_args() + [arg]))
    assert len(out) == 1 and 'vendor:device ID' in out[0] and 'by PCI address' in out[0]


@pytest.mark.parametrize('line', ['options vfio-pci ids=10de:2bb5', 'options vfio_pci disable_vga=1 ids=10de:2bb5',
                                  'options pci-stub ids=10de:2bb5'])
def test_binding_by_id_in_a_modprobe_file_is_stopped(line):
    out = run(rules.VFIO_BY_ADDRESS, file_res(host_mod.modprobe_content(1) + line + '\n'))
    assert len(out) == 1 and 'ids=10de:2bb5' in out[0] and host_mod.MODPROBE_FILE in out[0]


def test_vfio_binding_lists_full_addresses_never_ids_or_container_gpus():
    out = run(rules.VFIO_BY_ADDRESS, vfio_res(devices=['10de:2bb5', '81:00.0', '0000:01:00.0', '0000:91:00.0']))
    assert [o.split(' ')[1] for o in out] == ['devices[0]', 'devices[1]', 'devices[2]'], out
    assert 'a vendor:device ID' in out[0] and 'not a full PCI address' in out[1]
    assert "one of the container's GPUs" in out[2]


@pytest.mark.parametrize('value,why', [('10de:2bb5,pcie=1', 'vendor:device ID'),
                                       ('host=zz:00.0,pcie=1', 'not a PCI address'),
                                       ('0000:c1:00.0,pcie=1', 'no VfioBinding (host-vfio) binds')])
def test_vm_gpus_are_passed_by_an_address_the_vfio_binding_binds(value, why):
    out = run(rules.VFIO_BY_ADDRESS, vfio_res(), qemu_res({'hostpci4': value}))
    assert len(out) == 1 and why in out[0] and out[0].startswith('vm-qemu: hostpci4'), out


def test_a_vm_declared_before_any_vfio_binding_is_stopped():
    out = run(rules.VFIO_BY_ADDRESS, qemu_res())
    assert len(out) == 4 and all('no VfioBinding declared' in o for o in out)


def test_short_and_multi_function_forms_of_a_bound_address_pass():
    assert run(rules.VFIO_BY_ADDRESS, vfio_res(), qemu_res({'hostpci0': 'host=81:00.0,pcie=1',
                                                            'hostpci1': '0000:91:00,pcie=1'})) == []


# ------------------------------------------------------------------------- 3 one side

def test_a_container_gpu_passed_to_the_vm_is_stopped_whichever_comes_second():
    bad = {'hostpci4': '0000:61:00.0,pcie=1'}
    out = run(rules.GPU_ONE_SIDE, qemu_res(bad, guard=[]))
    assert out == []  # alone and with no guard list: nothing to compare with yet
    out = run(rules.GPU_ONE_SIDE, lxc_res(), qemu_res(bad, guard=[]))
    assert len(out) == 1 and 'hostpci4 passes 0000:61:00.0' in out[0] and 'container container-lxc' in out[0]
    out = run(rules.GPU_ONE_SIDE, qemu_res(bad, guard=[]), lxc_res())
    assert len(out) == 1 and 'container GPU 0000:61:00.0 is also passed to VM vm-qemu as hostpci4' in out[0]
    out = run(rules.GPU_ONE_SIDE, qemu_res(bad))
    assert len(out) == 1 and 'guard_gpus' in out[0]


def test_a_vfio_group_in_the_container_is_stopped():
    out = run(rules.GPU_ONE_SIDE, lxc_res({'dev9': 'path=/dev/vfio/42,mode=0660'}))
    assert len(out) == 1 and 'dev9 passes /dev/vfio/42' in out[0]


# ------------------------------------------------------------------------- 4 p2p

@pytest.mark.parametrize('content', [host_mod.modprobe_content(0),
                                     'options nvidia NVreg_DmaRemapPeerMmio=1\n'
                                     'options nvidia NVreg_DmaRemapPeerMmio=0\n',
                                     'options nvidia NVreg_DmaRemapPeerMmio=yes\n',
                                     'options nvidia NVreg_OpenRmEnableUnsupportedGpus=1\n'])
def test_the_nvidia_options_file_must_set_dma_remap_peer_mmio_to_1(content):
    out = run(rules.P2P_OFF, file_res(content))
    assert len(out) == 1 and 'NVreg_DmaRemapPeerMmio' in out[0] and 'Fix: write "options nvidia' in out[0], out


def test_other_modprobe_files_pass_unless_they_change_the_nvidia_setting():
    assert run(rules.P2P_OFF, file_res('options kvm_amd sev=1\n', path='/etc/modprobe.d/kvm.conf', name='f')) == []
    assert run(rules.P2P_OFF, file_res('options nvidia NVreg_DmaRemapPeerMmio=0x1\n')) == []
    assert run(rules.P2P_OFF, file_res('options nvidia NVreg_DmaRemapPeerMmio=0\n', path='/etc/modprobe.d/x.conf'))


@pytest.mark.parametrize('sub,what', [
    (('Environment="NCCL_P2P_DISABLE=1"\n', ''), 'does not set NCCL_P2P_DISABLE'),
    (('NCCL_P2P_DISABLE=1', 'NCCL_P2P_DISABLE=0'), "sets NCCL_P2P_DISABLE='0'"),
    (('Restart=on-failure', 'Restart=on-failure\nEnvironment=NCCL_P2P_DISABLE=true'), "sets NCCL_P2P_DISABLE='true'"),
    (('Type=simple', 'Type=simple\nUnsetEnvironment=NCCL_P2P_DISABLE'), 'unsets NCCL_P2P_DISABLE')])
def test_the_unit_must_disable_nccl_p2p(sub, what):
    out = run(rules.P2P_OFF, unit_res(sub))
    assert len(out) == 1 and what in out[0], out


# ------------------------------------------------------------------------- 5 speculation

def test_a_partial_speculation_triple_is_stopped_with_a_consistent_one():
    out = run(rules.SPECULATION, unit_res((' --speculative-eagle-topk 1', '')))
    assert len(out) == 1 and 'but not --speculative-eagle-topk' in out[0] and 'num_draft_tokens: 2' in out[0], out


def test_topk_1_needs_draft_tokens_steps_plus_1_in_any_spelling():
    out = run(rules.SPECULATION, unit_res(('--speculative-num-draft-tokens 2', '--speculative-num-draft-tok=3')))
    assert len(out) == 1 and 'needs --speculative-num-draft-tokens 2' in out[0] and 'says 3' in out[0]
    steps2 = unit_res(('--speculative-num-steps 1', '--speculative-num-steps 2'),
                      ('--speculative-num-draft-tokens 2', '--speculative-num-draft-tokens 3'))
    assert run(rules.SPECULATION, steps2) == []


def test_no_speculation_at_all_passes():
    text = sglang.unit_text(D)
    argv = ' --speculative-algorithm NEXTN --speculative-num-steps 1 --speculative-eagle-topk 1 ' \
           '--speculative-num-draft-tokens 2'
    assert argv in text
    assert run(rules.SPECULATION, unit_res((argv, ''))) == []


# ------------------------------------------------------------------------- 6 tp

def test_tp_must_equal_the_container_nvidia_devices():
    assert run(rules.TP_GPUS, lxc_res(), unit_res()) == []
    out = run(rules.TP_GPUS, lxc_res({'dev3': None}), unit_res(('--tp-size 4', '--tp 4')))
    assert len(out) == 1 and '--tp 4, but container 200 (container-lxc) has 3 GPUs' in out[0], out
    out = run(rules.TP_GPUS, lxc_res(), unit_res(('--tp-size 4', '--tensor-parallel-size=2')))
    assert len(out) == 1 and 'gpuhost:sglang.tp: 4' in out[0]


def test_a_unit_whose_container_was_not_declared_before_it_is_stopped():
    out = run(rules.TP_GPUS, lxc_res(vmid=201.0), unit_res())
    assert len(out) == 1 and 'no container with that vmid was declared before it' in out[0]


# ------------------------------------------------------------------------- 7 root@pam

@pytest.mark.parametrize('api,why', [
    (dict(API, user='gpuhost@pve'), 'the API user is not root@pam'),
    (dict(API, user='root@pam!ci'), 'names an API token'),
    (dict(API, token_id='root@pam!ci', token_secret='TOKEN-SECRET-TEXT'), 'carries an API token'),
    ({k: v for k, v in API.items() if k != 'password'}, 'has no password'),
    (dict(API, password=''), 'has no password')])
def test_root_only_keys_need_root_at_pam_with_a_password(api, why):
    for guest in (lxc_res(api=api), qemu_res(api=api)):
        out = run(rules.ROOT_PAM, guest)
        assert len(out) == 1 and why in out[0], out
        for secret in ('API-PASSWORD-TEXT', 'TOKEN-SECRET-TEXT', 'gpuhost@pve', 'root@pam!ci'):
            assert secret not in out[0]


def test_a_guest_without_root_only_keys_may_use_any_login():
    plain = res('ProxmoxGuest', 'ct', api=dict(API, user='ops@pve'), kind='lxc', vmid=201.0,
                config={'hostname': 'x', 'cores': 2.0})
    assert run(rules.ROOT_PAM, plain) == []


# ------------------------------------------------------------------------- 8 bind

@pytest.mark.parametrize('host,kind', [('0.0.0.0', 'all'), ('::', 'all'), ('203.0.113.5', 'public'),
                                       ('2001:db8::1', 'public'), ('100.64.0.1', 'public'),
                                       ('sglang.example', 'public'),
                                       ('10.20.0.20', 'private'), ('172.16.0.1', 'private'), ('192.168.1.2', 'private'),
                                       ('127.0.0.4', 'private'), ('::1', 'private'), ('169.254.1.1', 'private'),
                                       ('fe80::1', 'private'), ('fd00::20', 'private'), ('::ffff:10.0.0.1', 'private')])
def test_what_counts_as_public(host, kind):
    assert rules.bind_kind(host) == kind


def test_a_public_bind_needs_the_stack_opt_in():
    out = run(rules.PRIVATE_BIND, unit_res())
    assert len(out) == 1 and 'every address of the container (--host 0.0.0.0, port 30000)' in out[0]
    assert 'gpuhost:sglang.host: 127.0.0.4' in out[0] and '"allow_public_bind": true' in out[0]
    assert run(rules.PRIVATE_BIND, unit_res(), cfg={'allow_public_bind': True}) == []
    assert run(rules.PRIVATE_BIND, unit_res(('--host 0.0.0.0', '--host=10.20.0.20'))) == []
    out = run(rules.PRIVATE_BIND, unit_res(('--host 0.0.0.0', '--ho 203.0.113.5')))
    assert len(out) == 1 and 'a public address (--host 203.0.113.5' in out[0]


def test_without_a_host_flag_sglang_listens_on_its_default_loopback():
    assert run(rules.PRIVATE_BIND, unit_res((' --host 0.0.0.0', ''))) == []


def test_the_default_bind_is_the_containers_own_address_and_passes_the_rule():
    """gpuhost:sglang.host left out (the lab stack sets 0.0.0.0 with its opt-in): SGLang binds the container's own
    address, gpuhost:container.ip's, which sglang-private-bind accepts without any policy config."""
    import copy
    import config
    from tests.unit.config.test_config import lab_data
    data = copy.deepcopy(lab_data())
    del data['sglang']['host']
    d = config.parse(data)
    text = sglang.unit_text(d)
    assert ' --host 127.0.0.4 --port 30000 ' in text
    unit = res('SglangUnit', 'sglang-unit', connection=CONN, unit=text, version='0.5.23', vmid=200.0,
               unit_name='sglang-qwen.service', endpoint='http://127.0.0.4:30000',
               launch_args=sglang.flag_groups(d.launch_args()))
    assert run(rules.PRIVATE_BIND, unit) == []


# ------------------------------------------------------------------------- the unit itself

@pytest.mark.parametrize('sub,why', [
    (('ExecStart=/opt/sglang/venv/bin/python -m sglang.launch_server', 'ExecStart=/bin/sh -c true #'),
     'does not run'),
    (('--tp-size 4', '--tp-size four'), 'would refuse the launch flags'),
    (('--tp-size 4', '--speculative 4'), 'ambiguous option'),
    (('ExecStart=', 'ExecStart=/bin/true\nExecStart='), 'more than one ExecStart')])
def test_a_unit_the_rules_cannot_read_is_a_violation_of_each_flag_rule(sub, why):
    for rule in (rules.SPECULATION, rules.TP_GPUS, rules.PRIVATE_BIND):
        out = run(rule, lxc_res(), unit_res(sub))
        assert len(out) == 1 and 'cannot be checked' in out[0] and why in out[0], (rule, out)


def test_a_version_without_a_flag_table_cannot_be_checked():
    out = run(rules.PRIVATE_BIND, unit_res(version='9.9.9'))
    assert len(out) == 1 and 'no flag table for SGLang 9.9.9' in out[0]


def test_unknown_values_are_left_for_up_never_passed_over():
    r = unit_res()
    r.props['unit'] = rules.UNKNOWN
    with pytest.raises(rules.Unknown):
        run(rules.PRIVATE_BIND, r)
    for rule in (rules.NO_IDENTITY, rules.VFIO_BY_ADDRESS):
        with pytest.raises(rules.Unknown):
            run(rule, cmdline_res(['iommu.strict=0', rules.UNKNOWN]))
    with pytest.raises(rules.Unknown):
        run(rules.ROOT_PAM, lxc_res({'dev0': rules.UNKNOWN}))


# ------------------------------------------------------------------------- levels

def test_a_config_may_lower_rules_to_advisory_and_the_report_says_so():
    levels = dict.fromkeys(rules.RULES, 'mandatory')
    levels.update({rules.GPU_ONE_SIDE: 'advisory', 'relaxed-rules': 'advisory'})
    configs = {rules.PRIVATE_BIND: {'allow_public_bind': True}}
    assert rules.level_problems(levels, configs, 'relaxed-rules') == []
    line = rules.level_report(levels, configs, 'lab')
    assert 'stack lab' in line and 'lowered to advisory' in line and rules.GPU_ONE_SIDE in line
    assert 'sglang-private-bind: allow_public_bind: true' in line
    assert rules.level_report(dict.fromkeys(rules.RULES, 'mandatory'), {}, 'prod') == ''


@pytest.mark.parametrize('levels,configs,why', [
    ({rules.GPU_ONE_SIDE: 'disabled'}, {}, 'never disabled'),
    ({rules.GPU_ONE_SIDE: 'remediate'}, {}, 'never remediate'),
    ({'relaxed-rules': 'disabled'}, {}, 'may not be hidden'),
    ({'gpu-one-sid': 'advisory'}, {}, 'is not a rule of this pack'),
    ({}, {rules.PRIVATE_BIND: {'allow_public_bnd': True}}, 'has no setting allow_public_bnd'),
    ({}, {rules.TP_GPUS: {'tp': 2}}, 'has no setting tp')])
def test_a_config_that_disables_hides_or_mistypes_is_refused(levels, configs, why):
    problems = rules.level_problems(levels, configs, 'relaxed-rules')
    assert len(problems) == 1 and why in problems[0], problems


def test_messages_never_carry_secret_inputs():
    reg = rules.Registry()
    bad = [cmdline_res(['iommu=pt']), file_res(host_mod.modprobe_content(0)), vfio_res(devices=['10de:2bb5']),
           lxc_res({'dev9': '/dev/vfio/1'}, api=dict(API, user='x@pve')),
           qemu_res({'hostpci4': '0000:01:00.0'}, api=dict(API, token_id='t', token_secret='TOKEN-SECRET-TEXT')),
           unit_res(('--tp-size 4', '--tp-size 2'))]
    found = []
    for rule in rules.RULES:
        for r in copy.deepcopy(bad):
            found += rules.check(rule, r, reg, {})
    assert len(found) >= 8, found
    text = '\n'.join(found)
    for secret in ('API-PASSWORD-TEXT', 'PRIVATE-KEY-TEXT', 'TOKEN-SECRET-TEXT'):
        assert secret not in text


def in_fleet(r, host):
    """The resource as a fleet's host declares it: its name prefixed, its fleet_host input set."""
    return rules.Res(r.type, '%s-%s' % (host, r.name), r.urn.replace('::' + r.name, '::%s-%s' % (host, r.name)),
                     dict(r.props, fleet_host=host))


def test_rules_across_resources_compare_only_resources_of_the_same_fleet_host():
    # gpu02 has two container GPUs and tp 2; gpu01 four and tp 4: same vmid 200 on both hosts.
    two = in_fleet(lxc_res({'dev2': None, 'dev3': None}), 'gpu02')
    out = run(rules.TP_GPUS, in_fleet(lxc_res(), 'gpu01'), two,
              in_fleet(unit_res(('--tp-size 4', '--tp-size 2')), 'gpu02'))
    assert out == []
    out = run(rules.TP_GPUS, in_fleet(lxc_res(), 'gpu01'), two, in_fleet(unit_res(), 'gpu02'))
    assert len(out) == 1 and 'gpu02-sglang-unit' in out[0]
    # gpu02's VM takes 0000:01:00.0, which is a container GPU on gpu01 only: another machine, no clash.
    vm = in_fleet(qemu_res({'hostpci0': '0000:01:00.0,pcie=1'}, guard=[]), 'gpu02')
    assert run(rules.GPU_ONE_SIDE, in_fleet(lxc_res(), 'gpu01'), in_fleet(vfio_res(devices=['0000:01:00.0'],
                                                                              container=[]), 'gpu02'), vm) == []
    # The same on one host is stopped.
    assert run(rules.GPU_ONE_SIDE, in_fleet(lxc_res(), 'gpu02'), vm)


# ------------------------------------------------------------------------- PCI resource mappings

def test_a_mapping_whose_entry_points_at_a_container_gpu_is_stopped():
    out = run(rules.GPU_ONE_SIDE, lxc_res(), vfio_res(), pcimap_res({'gpuhost-300-gpu1': '0000:11:00.0'}))
    assert len(out) == 1, out
    assert out[0].startswith('vm-pci-mappings: mapping gpuhost-300-gpu1 points its entry for node pve-lab at '
                             '0000:11:00.0, a container GPU (')
    assert 'container container-lxc' in out[0] and 'its guard' in out[0] and 'Fix: a GPU goes to one side' in out[0]
    # Its own guard is enough, whatever came before it.
    assert len(run(rules.GPU_ONE_SIDE, pcimap_res({'gpuhost-300-gpu1': '0000:11:00.0'}))) == 1
    # And the container coming after it sees the mapped address.
    out = run(rules.GPU_ONE_SIDE, pcimap_res({'gpuhost-300-gpu1': '0000:11:00.0'}, guard=[]), lxc_res())
    assert len(out) == 1 and 'container GPU 0000:11:00.0 is also passed to the VM through mapping ' \
        'gpuhost-300-gpu1 (vm-pci-mappings)' in out[0], out


def test_a_mapping_needs_its_address_bound_to_vfio_by_address():
    out = run(rules.VFIO_BY_ADDRESS, vfio_res(), pcimap_res({'gpuhost-300-gpu3': '0000:c1:00.0'}))
    assert len(out) == 1 and 'mapping gpuhost-300-gpu3 points at 0000:c1:00.0, which no VfioBinding (host-vfio)' \
        in out[0], out
    out = run(rules.VFIO_BY_ADDRESS, pcimap_res())
    assert len(out) == 4 and all('no VfioBinding declared' in o for o in out)
    out = run(rules.VFIO_BY_ADDRESS, vfio_res(), pcimap_res({'gpuhost-300-gpu0': '10de:2bb5'}))
    assert len(out) == 1 and "has the path '10de:2bb5', which is not a PCI address" in out[0], out


def test_a_raw_address_in_a_mapping_stack_is_stopped():
    # The VM's own gpu_binding says mapping, or mappings are declared for its host, or another hostpci uses one.
    raw = {'hostpci1': '0000:91:00.0,pcie=1'}
    out = run(rules.BY_MAPPING, pcimap_res(), qemu_res(raw, d=D))
    assert len(out) == 1, out
    assert out[0].startswith('vm-qemu: hostpci1 passes 0000:91:00.0 by raw PCI address in a stack that gives the VM '
                             'its GPUs through PCI resource mappings (its gpu_binding is mapping; PciMappings '
                             'vm-pci-mappings declared for its host; hostpci0, hostpci2, hostpci3 pass through')
    assert 'Fix: hostpci1: mapping=<id>,pcie=1' in out[0]
    r = qemu_res(raw, d=D)
    r.props.pop('gpu_binding')
    out = run(rules.BY_MAPPING, r)  # a program that does not say: its other hostpci do
    assert len(out) == 4 and sum('by raw PCI address' in o for o in out) == 1, out  # (and 3 undeclared mappings)
    # An address-mode VM with no mappings anywhere is what it declares.
    assert run(rules.BY_MAPPING, vfio_res(), qemu_res()) == []


def test_a_vm_naming_a_mapping_the_run_does_not_declare_is_stopped():
    out = run(rules.BY_MAPPING, qemu_res({'hostpci4': 'mapping=someones-gpu,pcie=1'}, d=D))
    assert len([o for o in out if 'someones-gpu' in o]) == 1, out
    assert any('hostpci4 names mapping someones-gpu, which no PciMappings resource of this run declares' in o
               for o in out)
    # The declared ones pass; one of another fleet host does not count.
    assert run(rules.BY_MAPPING, pcimap_res(), qemu_res(d=D)) == []
    assert len(run(rules.BY_MAPPING, in_fleet(pcimap_res(), 'gpu01'), in_fleet(qemu_res(d=D), 'gpu02'))) == 4


def test_root_pam_is_not_needed_for_mapped_gpus_but_still_for_sev_and_affinity():
    token = dict(API, token_id='root@pam!ci', token_secret='TOKEN-SECRET-TEXT')
    out = run(rules.ROOT_PAM, qemu_res(api=token, d=D))
    assert len(out) == 1 and 'sets affinity, amd-sev (' in out[0] and 'hostpci' not in out[0].split(' (')[0], out
    out = run(rules.ROOT_PAM, qemu_res(api=token))
    assert len(out) == 1 and 'sets affinity, amd-sev, hostpci0, hostpci1, hostpci2, hostpci3 (' in out[0], out


def test_a_mapping_id_that_is_not_proxmoxs_is_stopped():
    r = pcimap_res()
    r.props['mappings'] = {'gpu,x-vga=1,n0': dict(r.props['mappings']['gpuhost-300-gpu0'])}
    out = run(rules.BY_MAPPING, r)
    assert len(out) == 1 and out[0].startswith("vm-pci-mappings: mapping id 'gpu,x-vga=1,n0' is not a Proxmox mapping "
                                               'id') and 'a comma above all' in out[0], out
