"""`make check` on a first day: the stack written, nothing deployed. Every prerequisite listed with ✓ on a ready
host; each one missing in turn is named with its fix (exit 1); the host and Proxmox are left as they were. One
lab for the module; each test puts back what it broke."""

import copy
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.lablib import REPO

STACK = 'check'
OK, BAD = '\u2713', '\u2717'


def check(lab):
    res = subprocess.run([sys.executable, os.path.join(REPO, 'tools', 'check.py'), STACK], cwd=lab.project,
                         env=lab.env, capture_output=True, text=True, timeout=300)
    out = res.stdout + res.stderr
    assert 'Traceback' not in out and '.py", line ' not in out, out
    return res.returncode, out


@pytest.fixture(scope='module')
def stack(lab):
    """The lab's stack config, the SSH private key as a secure value (decrypted by the check as the program
    gets it, with the stack's passphrase)."""
    cfg = lab.stack_config()
    key_file = cfg['gpuhost:host']['ssh'].pop('private_key_file')
    lab.write_stack(STACK, cfg)
    with open(os.path.join(lab.project, key_file)) as f:
        key = f.read()
    lab.pulumi('config', 'set', '--secret', '--path', 'gpuhost:host.ssh.private_key', stack=STACK, input=key)
    with open(os.path.join(lab.project, 'Pulumi.%s.yaml' % STACK)) as f:
        written = yaml.safe_load(f)   # with the passphrase's salt
    assert 'secure' in written['config']['gpuhost:host']['ssh']['private_key']
    return written, key


def write(lab, doc):
    with open(os.path.join(lab.project, 'Pulumi.%s.yaml' % STACK), 'w') as f:
        yaml.safe_dump(doc, f, sort_keys=False)


def line_of(out, title):
    return next((line for line in out.splitlines() if title in line), '')


def test_a_ready_host_has_every_prerequisite_and_the_check_changes_nothing(lab, stack):
    _, key = stack
    digest, requests = lab.host_digest(), len(lab.pve_requests())
    code, out = check(lab)
    assert code == 0, out
    assert BAD not in out and out.count(OK) >= 14, out
    for title in ('NVIDIA kernel driver loaded', 'every installed kernel has the nvidia module', 'driverctl installed',
                  'IOMMU enabled', 'SEV-SNP enabled',
                  'Proxmox VE 9.0 or later', 'container template', 'container\'s storage'):
        assert line_of(out, title).strip().startswith(OK), out
    assert lab.host_digest() == digest
    # Reads only: a login ticket, then GETs.
    sent = [(r['method'], r['path'].split('?')[0]) for r in lab.pve_requests()[requests:]]
    assert sent and all(m == 'GET' or p.endswith('/access/ticket') for m, p in sent), sent
    assert key.strip().splitlines()[1] not in out


def _move(src, dst):
    shutil.move(src, dst)
    return lambda: shutil.move(dst, src)


def unload_nvidia(lab):
    return _move(lab.host.path('sys/module/nvidia'), os.path.join(lab.base, 'nvidia-module'))


def remove_uvm_node(lab):
    assert lab.on_host('rm /dev/nvidia-uvm').exit_code == 0
    return lambda: lab.on_host('mknod -m 666 /dev/nvidia-uvm c 511 0')


def remove_driverctl(lab):
    path = lab.host.path('sbin', 'driverctl')
    target = os.readlink(path)   # (the lab's fake tool, as the host sees it)
    os.unlink(path)
    return lambda: os.symlink(target, path)


def iommu_off(lab):
    groups = lab.host.path('sys/kernel/iommu_groups')
    aside = os.path.join(lab.base, 'iommu-groups')
    os.makedirs(aside)
    for g in os.listdir(groups):
        shutil.move(os.path.join(groups, g), os.path.join(aside, g))

    def back():
        for g in os.listdir(aside):
            shutil.move(os.path.join(aside, g), os.path.join(groups, g))
        os.rmdir(aside)
    return back


def sev_off(lab):
    lab.host.set_sev_snp(False)
    return lambda: lab.host.set_sev_snp(True)


def kernel_without_nvidia(lab):
    # A kernel update whose DKMS build of the nvidia module did not happen (no headers, a failed build).
    lab.host.install_kernel('6.8.12-9-pve')
    return lambda: lab.host.remove_kernel('6.8.12-9-pve')


def old_pve(lab):
    lab.pve_set(pve_version='8.1.4')
    return lab.pve_reset


@pytest.mark.parametrize('breaks,title,fix', [
    (unload_nvidia, 'NVIDIA kernel driver loaded', 'modprobe nvidia'),
    (remove_uvm_node, 'NVIDIA kernel driver loaded', '/dev/nvidia-uvm'),
    (remove_driverctl, 'driverctl installed', 'apt install driverctl'),
    (iommu_off, 'IOMMU enabled in the firmware', 'Enable it in the firmware'),
    (sev_off, 'SEV-SNP enabled', 'enable SEV, SEV-ES and SEV-SNP in the firmware'),
    (old_pve, 'Proxmox VE 9.0 or later', 'Proxmox VE 8.1.4'),
    (kernel_without_nvidia, 'every installed kernel has the nvidia module built for it',
     'kernel 6.8.12-9-pve is installed without the nvidia module built for it: a boot into it has no GPU driver. '
     'Build it with DKMS after installing the kernel\'s headers (apt install proxmox-headers-6.8.12-9-pve; dkms '
     'autoinstall -k 6.8.12-9-pve)'),
], ids=['nvidia module', 'device node', 'driverctl', 'iommu', 'sev-snp', 'pve version', 'kernel without nvidia'])
def test_a_missing_prerequisite_of_the_host_is_named_with_its_fix(lab, stack, breaks, title, fix):
    restore = breaks(lab)
    try:
        digest = lab.host_digest()
        code, out = check(lab)
        assert lab.host_digest() == digest
    finally:
        restore()
    assert code == 1, out
    assert line_of(out, title).strip().startswith(BAD), out
    assert fix in out, out
    assert sum(line.strip().startswith(BAD) for line in out.splitlines()) == 1, out


@pytest.mark.parametrize('key,value,fix', [
    ('ostemplate', 'local:vztmpl/debian-13-standard_13.1-2_amd64.tar.zst',
     'pveam download local debian-13-standard_13.1-2_amd64.tar.zst'),
    ('storage', 'tank', "storage 'tank' does not exist"),
], ids=['template', 'storage'])
def test_a_missing_template_or_storage_is_named_with_its_fix(lab, stack, key, value, fix):
    written, _ = stack
    doc = copy.deepcopy(written)
    doc['config']['gpuhost:container'][key] = value
    write(lab, doc)
    try:
        code, out = check(lab)
    finally:
        write(lab, written)
    assert code == 1 and fix in out, out
    assert line_of(out, 'gpuhost:container.' + key).strip().startswith(BAD), out
