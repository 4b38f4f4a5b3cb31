"""The lab's simulated nvidia kernel modules (lab/kmod.py): the state a boot leaves, refused unloads, what a load
binds (never a vfio-pci GPU), an armed FSP failure's NVRM lines, a boot into a kernel without the module, DKMS's
status lines - on a host laid out in a temporary directory (no lab host running)."""

import json
import os

import pytest

from lab import hostsim

hostsim.kmod()
import kmod  # noqa: E402  (lab/, put on the path by hostsim.kmod())

VFIO = '0000:f1:00.0'


@pytest.fixture
def host(tmp_path):
    with open(os.path.join(hostsim.os.path.dirname(hostsim.__file__), 'spec', 'default.json')) as f:
        spec = json.load(f)
    for gpu in spec['gpus']:
        if gpu['bdf'] == VFIO:
            gpu['driver'] = 'vfio-pci'
    with open(tmp_path / 'spec.json', 'w') as f:
        json.dump(spec, f)
    h = hostsim.Host(str(tmp_path))
    h.create()
    hostsim.write(h.path('etc/driverctl.d', 'pci-' + VFIO), 'vfio-pci\n')   # (driverctl's, so it outlives a boot)
    return h


def test_module_files_read_back_as_modinfo_reads_them():
    data = hostsim.module_elf({'version': '580.95.05', 'license': 'Dual MIT/GPL', 'name': 'nvidia'})
    assert kmod.parse_modinfo(data) == {'version': '580.95.05', 'license': 'Dual MIT/GPL', 'name': 'nvidia'}
    assert kmod.parse_modinfo(b'not an elf') is None
    assert [kmod.name_of(a) for a in ('nvidia-uvm', 'nvidia_uvm', '/x/nvidia-modeset.ko')] == \
        ['nvidia_uvm', 'nvidia_uvm', 'nvidia_modeset']


def test_a_booted_host_runs_the_installed_module_held_by_uvm_and_modeset(host):
    assert host.nvidia_loaded() and host.nvidia_module() == hostsim.NVIDIA_VERSION
    assert host.module_holders() == ['nvidia_modeset', 'nvidia_uvm'] and host.module_refcnt() == 2
    assert host.installed_nvidia() == hostsim.NVIDIA_VERSION
    assert host.driver(VFIO) == 'vfio-pci'
    assert sorted(os.listdir(host.path('proc/driver/nvidia/gpus'))) == sorted(set(host.gpu_bdfs()) - {VFIO})
    msgs = [e['msg'] for e in host.kernel_messages()]
    assert 'NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  %s  Release Build  %s' % (
        hostsim.NVIDIA_VERSION, kmod.BUILD) in msgs
    assert hostsim.read(host.path('proc/driver/nvidia/version')) == hostsim.nvidia_proc_version(hostsim.NVIDIA_VERSION)
    assert kmod.Dkms(host.path('var'), '/usr/src', host.path()).status() == [
        'nvidia/%s, %s, x86_64: installed' % (hostsim.NVIDIA_VERSION, host.spec['kernel'])]


def test_a_held_module_is_not_unloaded_and_an_unload_unbinds_only_nvidias_gpus(host):
    with pytest.raises(kmod.ModuleError) as e:
        kmod.unload(host, 'nvidia')
    assert (e.value.kind, e.value.detail) == ('in use', ['nvidia_modeset', 'nvidia_uvm'])
    host.hold_nvidia(1, module='nvidia_uvm')
    with pytest.raises(kmod.ModuleError):
        host.unload_nvidia()
    host.release_nvidia(1, module='nvidia_uvm')
    host.unload_nvidia()
    assert not host.nvidia_loaded() and not os.path.exists(host.path('sys/module/nvidia'))
    assert not os.path.exists(host.path('proc/driver/nvidia'))
    assert [host.driver(b) for b in host.gpu_bdfs()] == [None] * 7 + ['vfio-pci']
    host.load_nvidia('580.105.08')
    assert host.nvidia_module() == '580.105.08' and host.driver(VFIO) == 'vfio-pci'
    assert all(host.driver(b) == 'nvidia' for b in host.gpu_bdfs() if b != VFIO)


def test_an_armed_fsp_failure_logs_nvrms_lines_and_leaves_the_gpu_unusable(host):
    host.unload_nvidia()
    host.arm_fsp_failure(['0000:61:00.0'], version='580.105.08')
    host.load_nvidia()    # another version: no failure
    assert os.path.isdir(host.path('proc/driver/nvidia/gpus/0000:61:00.0'))
    host.unload_nvidia()
    host.load_nvidia('580.105.08')
    msgs = [e['msg'] for e in host.kernel_messages()]
    assert 'NVRM: GPU 0000:61:00.0: Error status 0x177 while polling for FSP boot complete, 0x0' in msgs
    assert 'NVRM: GPU 0000:61:00.0: RmInitAdapter: Cannot initialize GSP firmware RM' in msgs
    assert 'NVRM: GPU 0000:61:00.0: RmInitAdapter failed! (0x62:0x40:1860)' in msgs
    assert any(m.startswith('NVRM: Xid (PCI:0000:61:00): 143, pid=') for m in msgs)
    assert not os.path.exists(host.path('proc/driver/nvidia/gpus/0000:61:00.0'))
    assert host.driver('0000:61:00.0') == 'nvidia'


def test_a_boot_into_a_kernel_without_the_module_has_no_gpu_driver(host):
    spec = host.spec
    spec['kernel'] = '6.14.11-1-pve'
    hostsim.write(os.path.join(host.lab, 'spec.json'), json.dumps(spec))
    host.install_kernel('6.14.11-1-pve')
    host.reboot()
    assert not host.nvidia_loaded() and not os.path.exists(host.path('proc/driver/nvidia/version'))
    assert [host.driver(b) for b in host.gpu_bdfs()] == [None] * 7 + ['vfio-pci']
    assert hostsim.read(host.path('proc/osrelease')).strip() == '6.14.11-1-pve'
    host.install_kernel('6.14.11-1-pve', '580.105.08')
    host.reboot()
    assert host.nvidia_module() == '580.105.08' and host.module_refcnt() == 2


def test_dkms_installs_for_a_kernel_with_headers_only(host, tmp_path):
    src = tmp_path / 'src'
    os.makedirs(src / 'nvidia-580.105.08')
    (src / 'nvidia-580.105.08' / 'dkms.conf').write_text('PACKAGE_NAME="nvidia"\n')
    d = kmod.Dkms(host.path('var'), str(src), host.path())
    d.add('nvidia', '580.105.08')
    host.install_kernel('6.14.11-1-pve', headers=False)
    with pytest.raises(kmod.DkmsError, match='Your kernel headers for kernel 6.14.11-1-pve cannot be found'):
        d.install('nvidia', '580.105.08', '6.14.11-1-pve')
    d.install('nvidia', '580.105.08', host.spec['kernel'])
    assert d.status('nvidia', '580.105.08') == ['nvidia/580.105.08, %s, x86_64: installed' % host.spec['kernel']]
    assert host.installed_nvidia() == '580.105.08'


def test_a_driver_upgraded_out_of_band_outlives_a_reboot(host):
    host.set_nvidia_module('580.105.08')
    assert host.installed_nvidia() == '580.105.08'
    host.reboot()
    assert host.nvidia_module() == '580.105.08' and host.module_holders() == ['nvidia_modeset', 'nvidia_uvm']


def test_a_boot_honours_modprobe_d_a_blacklist_keeps_udevs_load_an_install_line_every_load(host):
    """As kmod does at boot, with the initramfs's copy of /etc/modprobe.d (update-initramfs): `blacklist nvidia`
    stops udev's load by alias but not nvidia-modprobe's loads by name (nvidia_uvm needs nvidia, and loads it); an
    `install nvidia /bin/false` line stops every load of it; a file written and not put into the initramfs does not
    count at boot."""
    hold = host.path('etc/modprobe.d', 'gpuhost-driver-hold.conf')
    hostsim.write(hold, 'blacklist nvidia\n')
    host.update_initramfs()
    host.reboot()
    assert host.nvidia_loaded() and host.module_holders() == ['nvidia_modeset', 'nvidia_uvm']
    hostsim.write(hold, ''.join('blacklist %s\ninstall %s /bin/false\n' % (m, m) for m in kmod.DEPENDS))
    host.reboot()
    assert host.nvidia_loaded(), 'not in the initramfs yet'
    host.update_initramfs()
    host.reboot()
    assert not host.nvidia_loaded() and not os.path.isdir(host.path('sys/module/nvidia'))
    assert host.driver(VFIO) == 'vfio-pci'
    assert kmod.refused_by_install(host, 'nvidia_uvm') == ('nvidia', '/bin/false')
    os.unlink(hold)
    host.update_initramfs()
    host.reboot()
    assert host.nvidia_module() == hostsim.NVIDIA_VERSION


def tmp_path_of(host):
    import pathlib
    return pathlib.Path(host.lab)


def test_a_created_host_has_its_drivers_dkms_sources_and_dkms_builds_a_new_kernel_from_them(host):
    """As NVIDIA's installer with --dkms leaves a host: /usr/src/nvidia-<v>/dkms.conf (in the host root's upper layer,
    written before it is mounted), the same text the simulated installer writes; a kernel installed later is built
    from it. Its sources gone, DKMS 3's read_conf message."""
    v = host.spec.get('nvidia_version', hostsim.NVIDIA_VERSION)
    src = os.path.join(host.lab, 'host-os', 'upper', 'usr', 'src')
    conf = os.path.join(src, 'nvidia-' + v, 'dkms.conf')
    with open(conf) as f:
        text = f.read()
    # The simulated installer's own lines that write it, run here.
    run = hostsim.nvidia_installer(v)
    part = run[run.index('    mkdir -p "$src"\n'):run.index('    echo "-> Installing DKMS kernel module:"')]
    out = tmp_path_of(host) / 'from-run'
    os.makedirs(out)
    import subprocess
    subprocess.run(['bash', '-c', part], check=True, env={'src': str(out), 'version': v, 'license': kmod.OPEN_LICENSE,
                                                          'PATH': os.environ['PATH']})
    assert (out / 'dkms.conf').read_text() == text
    d = kmod.Dkms(host.path('var'), src, host.path())
    # (the tree's source link is the host's absolute /usr/src/...: read it under this test's root)
    os.unlink(d.mdir('nvidia', v, 'source'))
    os.symlink(os.path.join(src, 'nvidia-' + v), d.mdir('nvidia', v, 'source'))
    host.install_kernel('6.8.12-9-pve')
    d.install('nvidia', v, '6.8.12-9-pve')
    assert host.installed_nvidia('6.8.12-9-pve') == v
    os.unlink(conf)
    host.install_kernel('6.8.12-10-pve')
    with pytest.raises(kmod.DkmsError, match='^Could not locate dkms.conf file.\nFile: .*/source/dkms.conf does not '
                                             'exist.$'):
        d.install('nvidia', v, '6.8.12-10-pve')
