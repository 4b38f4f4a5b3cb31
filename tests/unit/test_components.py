"""Components under Pulumi mocks: the resource tree (type tokens, names, parents) and the inputs each
child gets. No engine, no host: these run in milliseconds."""

import pulumi
import pytest

from tests.unit.config.test_config import parse
from tests.unit.program import API, CONN, CREATED  # noqa: F401 - the mocks, set at import

from components.container import GpuContainer  # noqa: E402
from components.host import ProxmoxHost  # noqa: E402
from components.sglang import SglangService  # noqa: E402
from components.vm import SevSnpVm  # noqa: E402


@pytest.fixture(autouse=True)
def _clear():
    CREATED.clear()


def by_name():
    return {a.name: a for a in CREATED}


@pulumi.runtime.test
def test_host_children_and_inputs():
    d = parse()
    host = ProxmoxHost('host', d)

    def check(_):
        r = by_name()
        assert r['host'].typ == 'gpuhost:index:ProxmoxHost'
        assert {n: r[n].typ for n in ('host-kernel-cmdline', 'host-nvidia-options', 'host-vfio', 'host-status')} == {
            'host-kernel-cmdline': 'gpuhost:index:KernelCmdline',
            'host-nvidia-options': 'gpuhost:index:HostFile',
            'host-vfio': 'gpuhost:index:VfioBinding',
            'host-status': 'gpuhost:index:HostStatus'}
        assert r['host-kernel-cmdline'].inputs['ensure_args'] == ['iommu.passthrough=0', 'iommu.strict=0']
        assert r['host-kernel-cmdline'].inputs['dangerous_args'] == []
        assert r['host-kernel-cmdline'].inputs['policy'] == {'blackwell': True, 'snp': True, 'vfio': True}
        assert r['host-vfio'].inputs['devices'] == ['0000:81:00.0', '0000:91:00.0', '0000:e1:00.0', '0000:f1:00.0']
        assert 'NVreg_DmaRemapPeerMmio=1' in r['host-nvidia-options'].inputs['content']
    return host.reboot_required.apply(check)


@pulumi.runtime.test
def test_no_vm_means_no_vm_gpus_to_bind_but_container_bindings_are_still_watched():
    import config
    data = parse().model_dump(mode='json')
    data.pop('vm')
    data['host']['ssh']['private_key'] = 'x'
    data['host']['ssh'].pop('private_key_file')
    data['host']['api']['password'] = 'x'
    data['host']['api'].pop('password_file')
    d = config.parse(data)
    host = ProxmoxHost('host', d)

    def check(_):
        names = by_name()
        assert names['host-vfio'].inputs['devices'] == []
        assert names['host-vfio'].inputs['container_devices'] == ['0000:01:00.0', '0000:11:00.0', '0000:61:00.0',
                                                                  '0000:71:00.0']
        assert names['host-kernel-cmdline'].inputs['policy'] == {'blackwell': True, 'snp': False, 'vfio': False}
    return host.reboot_required.apply(check)


@pulumi.runtime.test
def test_guests_and_service():
    d = parse()
    ct = GpuContainer('container', d)
    vm = SevSnpVm('vm', d)
    svc = SglangService('sglang', d, CONN, ct)

    def check(_):
        r = by_name()
        lxc, qemu, unit = r['container-lxc'].inputs, r['vm-qemu'].inputs, r['sglang-unit'].inputs
        assert lxc['kind'] == 'lxc' and lxc['create']['unprivileged'] == 1
        assert lxc['config']['dev3'] == '/dev/nvidia3,mode=0666'
        assert lxc['raw_lxc'] == {'lxc.cgroup2.cpuset.cpus': '0-31,64-95'}
        assert qemu['config']['amd-sev'] == 'type=snp,allow-smt=1' and qemu['config']['bios'] == 'ovmf'
        assert qemu['config']['affinity'] == '32-63,96-127'
        # The GPUs through resource mappings (the default), one per GPU, made before the VM.
        assert [qemu['config']['hostpci%d' % i] for i in range(4)] == [
            'mapping=gpuhost-300-gpu%d,pcie=1' % i for i in range(4)]
        maps = r['vm-pci-mappings']
        assert maps.typ == 'gpuhost:index:PciMappings'
        assert maps.inputs['mappings'] == {'gpuhost-300-gpu%d' % i: {'path': b, 'id': '10de:2bb5'} for i, b in
                                           enumerate(['0000:81:00.0', '0000:91:00.0', '0000:e1:00.0', '0000:f1:00.0'])}
        assert maps.inputs['checks'] == {'gpuhost-300-gpu%d' % i: '' for i in range(4)}
        assert maps.inputs['guard'] == {'gpus': list(d.container.gpus), 'numa': 0} and maps.inputs['vm_numa'] == 1
        # (the host's connection and login are its provider's configuration, not the resource's: state.host_provider)
        assert maps.inputs['node'] == 'pve-lab' and not {'api', 'connection'} & set(maps.inputs)
        assert unit['expect'] == {'speculative_algorithm': 'EAGLE', 'speculative_num_steps': 1,
                                  'speculative_eagle_topk': 1, 'speculative_num_draft_tokens': 2,
                                  # the declared revision's directory: what SGLang must report it loaded
                                  'model_path': '/models/Qwen3.5-122B-A10B@' + d.model.revision}
        assert 'NCCL_P2P_DISABLE=1' in unit['unit']
        assert r['container-lxc'].custom and r['sglang-unit'].typ == 'gpuhost:index:SglangUnit'
    return pulumi.Output.all(ct.status, vm.status, svc.active).apply(check)


@pulumi.runtime.test
def test_the_unit_runs_from_its_environment_and_the_index_password_is_a_secret():
    from tests.unit.test_runtime import FILES
    d = parse()
    ct = GpuContainer('container', d)
    svc = SglangService('sglang', d, CONN, ct, runtime_files=FILES)

    def check(_):
        unit = by_name()['sglang-unit'].inputs
        env = unit['env']
        assert 'ExecStart=%s/bin/python -m sglang.launch_server' % env['path'] in unit['unit']
        assert 'Environment="PATH=%s/bin:/usr/local/cuda-13.0/bin:' % env['path'] in unit['unit']
        assert unit['runtime'] == {'nvidia': '580.95.05', 'cuda': '13.0.2'}
        assert unit['install']['python']['lock'] == FILES['lock']
        assert unit['install']['python']['index'] == {'url': 'http://127.0.0.2:3141/simple', 'username': 'gpuhost-lab'}
        # Never in a plain input: the password is an input of its own, which the program passes as a secret.
        assert 'pw' not in repr(unit['install'])
    async def secret():
        return await svc.service.index_password.is_secret()

    def both(is_secret):
        assert is_secret, 'the index password reaches the state unencrypted'
        return check(None)
    return pulumi.Output.from_input(secret()).apply(both)


@pulumi.runtime.test
def test_gpus_by_address_make_no_mappings():
    d = parse(vm__gpu_binding='address')
    vm = SevSnpVm('vm', d)

    def check(_):
        r = by_name()
        assert 'vm-pci-mappings' not in r
        assert r['vm-qemu'].inputs['config']['hostpci0'] == '0000:81:00.0,pcie=1'
        assert r['vm-qemu'].inputs['gpu_binding'] == 'address'
    return vm.status.apply(check)
