"""The lab's nvidia kernel modules behind SSH, as the driver upgrade (issue 59) will drive them: kmod's rmmod and
modprobe refusing a held module with their real messages, NVIDIA's installer refusing while a module stays loaded,
an install with DKMS for two kernels and a load (GPUs on nvidia again, the VM's vfio-pci GPU untouched), an armed FSP
failure's NVRM lines in `journalctl --dmesg`, and an uninstall (lab/kmod.py, lab/faketools.py, lab/hostsim.py)."""

import json

import hostsim

NEW = '580.105.08'
OLD_KERNEL = '6.8.12-9-pve'       # a second installed kernel (the running one is the spec's)
VM_GPU = '0000:f1:00.0'
FSP_GPU = '0000:61:00.0'


def dmesg(lab):
    res = lab.ssh('journalctl --dmesg --output=json --no-pager')
    assert res.exit_code == 0, res
    return [json.loads(line)['MESSAGE'] for line in res.stdout.splitlines()]


def drivers(lab):
    return {b: lab.host.driver(b) for b in lab.host.gpu_bdfs()}


def test_unload_install_with_dkms_for_two_kernels_load_fail_and_uninstall(lab):
    kernel = lab.spec['kernel']
    res = lab.ssh('command -v rmmod modprobe dkms uname; uname -r')
    assert res.stdout.split() == ['/usr/local/sbin/rmmod', '/usr/local/sbin/modprobe', '/usr/local/sbin/dkms',
                                  '/usr/local/sbin/uname', kernel], res
    assert lab.ssh('driverctl set-override %s vfio-pci' % VM_GPU).exit_code == 0
    assert lab.ssh('cat /sys/module/nvidia/refcnt; ls /sys/module/nvidia/holders').stdout.split() == \
        ['2', 'nvidia_modeset', 'nvidia_uvm']

    res = lab.ssh('rmmod nvidia')
    assert (res.exit_code, res.stderr) == (1, 'rmmod: ERROR: Module nvidia is in use by: nvidia_modeset nvidia_uvm\n')
    res = lab.ssh('modprobe -r nvidia')
    assert (res.exit_code, res.stderr) == (1, 'modprobe: FATAL: Module nvidia is in use.\n')

    # nvidia-persistenced has /dev/nvidiactl and each GPU's node open: the installer unloads what it can, then refuses.
    lab.start_host_unit('nvidia-persistenced.service')
    lab.wait_for(lambda: lab.host.module_refcnt() == 2 + 1 + 7, what="persistenced's users counted")
    fds = lab.ssh('ls -l /proc/$(systemctl show -p MainPID --value nvidia-persistenced)/fd').stdout
    assert '/dev/nvidiactl' in fds and '/dev/nvidia0' in fds, fds
    path, _ = lab.host.add_artifact(hostsim.nvidia_installer_name(NEW), hostsim.nvidia_installer(NEW))
    install = 'sh %s --silent --dkms --kernel-module-type=open' % path
    res = lab.ssh(install)
    assert res.exit_code == 1 and "ERROR: An NVIDIA kernel module 'nvidia' appears to already be loaded in your " \
        'kernel.' in res.stderr, res
    assert lab.host.nvidia_module() == hostsim.NVIDIA_VERSION and lab.host.module_holders() == []
    res = lab.ssh('rmmod nvidia')
    assert (res.exit_code, res.stderr) == (1, 'rmmod: ERROR: Module nvidia is in use\n')
    assert lab.ssh('systemctl stop nvidia-persistenced').exit_code == 0
    assert lab.host.module_refcnt() == 0
    # A user the test adds (hold_nvidia: what SGLang's open /dev/nvidia* would be).
    lab.host.hold_nvidia(1)
    assert lab.ssh('rmmod nvidia').exit_code == 1
    lab.host.release_nvidia(1)

    lab.host.install_kernel(OLD_KERNEL, hostsim.NVIDIA_VERSION)
    res = lab.ssh('modprobe -r nvidia && ls /sys/module /proc/driver')
    assert res.exit_code == 0 and 'nvidia' not in res.stdout.split(), res
    assert set(drivers(lab).values()) == {None, 'vfio-pci'}
    res = lab.ssh('%s && dkms install nvidia/%s -k %s && modprobe nvidia_uvm && modprobe nvidia_modeset' % (
        install, NEW, OLD_KERNEL))
    assert res.exit_code == 0, res
    assert 'is now complete' in res.stdout
    assert lab.ssh('cat /sys/module/nvidia/version').stdout == NEW + '\n'
    for k in (kernel, OLD_KERNEL):
        assert lab.ssh('modinfo -k %s -F version nvidia' % k).stdout == NEW + '\n'
    assert lab.ssh('dkms status').stdout.splitlines() == sorted(
        ['nvidia/%s, %s, x86_64: installed' % (NEW, k) for k in (kernel, OLD_KERNEL)])
    assert drivers(lab) == {b: 'vfio-pci' if b == VM_GPU else 'nvidia' for b in lab.host.gpu_bdfs()}
    assert lab.ssh('cat /sys/bus/pci/devices/%s/driver_override' % VM_GPU).stdout == 'vfio-pci\n'
    assert lab.ssh('nvidia-smi').stdout.startswith('NVIDIA-SMI %s' % NEW)
    assert 'NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  %s  Release Build' % NEW in \
        '\n'.join(dmesg(lab))
    assert 'Installing NVIDIA driver version %s' % NEW in lab.ssh('cat /var/log/nvidia-installer.log').stdout

    # A version whose GSP firmware does not come up on one GPU: the load succeeds, the kernel log says why.
    lab.host.arm_fsp_failure([FSP_GPU], version=NEW)
    res = lab.ssh('modprobe -r nvidia_uvm nvidia_modeset nvidia && modprobe nvidia && ls /proc/driver/nvidia/gpus')
    lab.host.disarm_fsp_failure()
    assert res.exit_code == 0 and FSP_GPU not in res.stdout.split() and len(res.stdout.split()) == 6, res
    log = dmesg(lab)
    for line in ('NVRM: GPU %s: Error status 0x177 while polling for FSP boot complete, 0x0' % FSP_GPU,
                 'NVRM: GPU %s: RmInitAdapter: Cannot initialize GSP firmware RM' % FSP_GPU,
                 'NVRM: GPU %s: RmInitAdapter failed! (0x62:0x40:1860)' % FSP_GPU):
        assert line in log, log[-8:]
    assert any(m.startswith('NVRM: Xid (PCI:0000:61:00): 143, pid=') for m in log)

    res = lab.ssh('sh %s --uninstall --silent' % path)
    assert res.exit_code == 0, res
    assert not lab.host.nvidia_loaded()
    assert lab.ssh('dkms status').stdout == ''
    assert lab.ssh('modinfo -k %s -F version nvidia' % kernel).exit_code != 0
    res = lab.ssh('modprobe nvidia')
    assert (res.exit_code, res.stderr) == (1, 'modprobe: FATAL: Module nvidia not found in directory /lib/modules/%s\n'
                                           % kernel)
