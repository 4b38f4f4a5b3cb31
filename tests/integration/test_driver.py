"""The host's NVIDIA driver declared (gpuhost:nvidia.driver; issue 59) on a deployed lab stack, in order on one lab:
declared at the version the host runs, the first `up` adopts it and changes nothing; a kernel installed without the
module is warned at preview and built by `up` with nothing stopped (one without headers refused, nothing changed); a
holder of the GPUs other than SGLang keeps an upgrade from touching anything (said at preview, refused by `up`, the
host unchanged); then an upgrade A -> B in place: priced at preview, SGLang stopped once,
the modules reloaded at B for every kernel, the container's user space at B, the proof, SGLang serving, the VM's GPU
bindings and the VM unchanged, nvidia-persistenced running again, and a second `up` with nothing to do; last, a
version whose load fails to initialise the GPUs (the FSP's boot error): the previous version is put back and loaded,
SGLang serves on it again, the run stops with the kernel log's lines, and the collector's textfile counts the Xid; and
a Ctrl-C in the middle of an install, and an SSH drop there, each followed by an `up` that converges with that one
install; and, with gpuhost:host.reboot: when-required, a driver another process holds upgraded across one reboot."""

import copy
import hashlib
import json
import os
import re
import signal
import subprocess
import time

import pytest

from lab import hostsim
from resources import monitoring
from tests.lablib import REPO
from transport import driverfacts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
STACK = 'driver'
A, B, C = '580.95.05', '580.105.08', '580.119.02'
RUN = '/root/gpuhost-artifacts/NVIDIA-Linux-x86_64-%s.run'
VM_GPUS = ('0000:81:00.0', '0000:91:00.0', '0000:e1:00.0', '0000:f1:00.0')


def with_driver(cfg, version, sha256):
    cfg = copy.deepcopy(cfg)
    cfg['gpuhost:runtime'].pop('nvidia')
    cfg['gpuhost:nvidia'] = dict(cfg.get('gpuhost:nvidia') or {}, driver={
        'version': version, 'installer': RUN % version, 'sha256': sha256})
    return cfg


@pytest.fixture(scope='module')
def deployed(lab):
    cfg = lab.stack_config()
    lab.write_stack(STACK, with_driver(cfg, A, cfg['gpuhost:runtime']['nvidia']['sha256']))
    res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    # Version B's installer, uploaded beside A's as an operator does.
    text = hostsim.nvidia_installer(B)
    lab.host.add_artifact(hostsim.nvidia_installer_name(B), text)
    return lab, with_driver(cfg, B, hashlib.sha256(text.encode()).hexdigest()), res


def both(res):
    """The CLI's output: with --diff it writes the diagnostics to stderr."""
    return ' '.join((res.stdout + res.stderr).split())


def test_declared_at_the_running_version_the_first_up_adopts_it_and_a_second_changes_nothing(deployed):
    lab, _, res = deployed
    assert 'host-nvidia-driver: ' not in res.stdout     # no price, no warning: nothing to do
    kernel = lab.host.spec['kernel']      # the lab host's running kernel (uname -r there), a Proxmox one
    assert kernel.endswith('-pve')
    assert lab.outputs(STACK)['nvidia_driver'] == {
        'declared': A, 'loaded': A, 'modules': 'open', 'installed': {kernel: A}, 'kernels_missing': [],
        'running_kernel': kernel}
    digest, starts = lab.host_digest(), lab.unit_starts()
    again = lab.preview_json(STACK, '--refresh')
    changed = [s for s in again['steps'] if s['op'] not in ('same', 'read', 'refresh')]
    assert changed == [], changed
    assert (lab.host_digest(), lab.unit_starts()) == (digest, starts)


def test_a_kernel_without_the_module_is_warned_at_preview_and_built_by_up_with_nothing_stopped(deployed):
    lab, _, _ = deployed
    new, bare = '6.8.12-9-pve', '6.8.12-10-pve'
    lab.host.install_kernel(new)          # as `apt` installs a pve kernel: its headers, no nvidia module yet
    try:
        pre = both(lab.pulumi('preview', '--refresh', '--diff', stack=STACK))
        assert ('host-nvidia-driver: DANGER - kernel 6.8.12-9-pve has no nvidia 580.95.05 module built: a boot into '
                'it runs without the GPU driver') in pre, pre
        assert ('host-nvidia-driver: the loaded module is 580.95.05 as declared, but kernel 6.8.12-9-pve has no '
                'nvidia 580.95.05 module built: a boot into it runs without it. `up` builds it with DKMS; nothing '
                'stops') in pre, pre
        starts = lab.unit_starts()
        up = both(lab.pulumi('up', '--yes', '--skip-preview', '--refresh', stack=STACK))
        assert 'host-nvidia-driver: 580.95.05 built with DKMS for kernel 6.8.12-9-pve' in up, up
        assert 'building 580.95.05 for kernel 6.8.12-9-pve with DKMS' in host_log(lab)
        assert lab.unit_starts() == starts                     # SGLang never stopped
        assert lab.host.nvidia_module() == A and lab.host.installed_nvidia(new) == A
        assert lab.outputs(STACK)['nvidia_driver']['kernels_missing'] == []
        # A kernel without its headers: DKMS cannot build for it - refused with the fix, the host untouched (and the
        # refresh's warning is that kernel's alone: the one built above has its module).
        lab.host.install_kernel(bare, headers=False)
        digest = lab.host_digest()
        driver = next(r['urn'] for r in json.loads(lab.pulumi('stack', 'export', stack=STACK).stdout)['deployment'][
            'resources'] if r['urn'].endswith('::host-nvidia-driver'))     # (that step alone: its refusal is the point)
        res = lab.pulumi('up', '--yes', '--skip-preview', '--refresh', '--target', driver, stack=STACK, check=False)
        out = both(res)
        assert res.returncode != 0 and 'Traceback' not in out, out
        assert ('gpuhost: host-nvidia-driver: kernel 6.8.12-10-pve has no headers (/lib/modules/6.8.12-10-pve/build), '
                'so DKMS cannot build the module for it: apt install proxmox-headers-6.8.12-10-pve (or remove the '
                'kernel) and re-run; nothing was changed') in out, out
        assert 'DANGER - kernel 6.8.12-10-pve has no nvidia' in out and 'DANGER - kernel 6.8.12-9-pve' not in out, out
        assert (lab.host_digest(), lab.unit_starts(), lab.host.nvidia_module()) == (digest, starts, A)
    finally:
        # As removing the kernels' packages does (DKMS's kernel prerm hook first).
        lab.ssh('dkms remove nvidia/580.95.05 -k 6.8.12-9-pve')
        lab.host.remove_kernel(new)
        if os.path.isdir(lab.host.path('lib', 'modules', bare)):
            lab.host.remove_kernel(bare)


def test_another_holder_of_the_gpus_keeps_the_upgrade_from_touching_anything(deployed):
    lab, cfg_b, _ = deployed
    # A monitoring agent on the host with the GPUs open (the lab's persistenced daemon under another unit's name).
    users = lab.host.module_refcnt()
    res = lab.ssh('systemd-run --unit=gpu-monitor /usr/bin/python3 /usr/lib/gpuhost-lab/persistenced.py && '
                  'systemctl show -p MainPID --value gpu-monitor')
    assert res.exit_code == 0, res
    pid = res.stdout.strip()
    deadline = time.time() + 30
    while lab.host.module_refcnt() == users:      # until it holds the GPUs open (its fds counted)
        assert time.time() < deadline, 'the holder never opened the GPUs'
        time.sleep(0.2)
    try:
        lab.write_stack(STACK, cfg_b)
        digest, starts = lab.host_digest(), lab.unit_starts()
        held = ('580.95.05 -> 580.105.08 (open kernel modules, built with DKMS for kernels %s): nothing is touched - '
                'the modules are held by python3 (pid %s, on the host) besides SGLang, and gpuhost:host.reboot is never. '
                'Stop what holds them, or allow a reboot (gpuhost:host.reboot: when-required), and re-run' % (
                    lab.host.spec['kernel'], pid))
        pre = both(lab.pulumi('preview', '--diff', stack=STACK))
        assert 'host-nvidia-driver: ' + held in pre, pre
        up = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
        assert up.returncode != 0 and 'gpuhost: host-nvidia-driver: ' + held in both(up), both(up)
        assert (lab.host_digest(), lab.unit_starts()) == (digest, starts)
        assert lab.host.nvidia_module() == A
    finally:
        lab.ssh('systemctl stop gpu-monitor')


def test_an_upgrade_in_place_reloads_the_modules_and_sglang_serves_on_the_new_user_space(deployed):
    lab, cfg_b, _ = deployed
    lab.write_stack(STACK, cfg_b)
    assert lab.ssh('systemctl start nvidia-persistenced').exit_code == 0
    kernel = lab.host.spec['kernel']
    before = lab.outputs(STACK)
    vm_before = ({b: lab.host.driver(b) for b in VM_GPUS}, before['vm'])
    overrides = lab.ssh('driverctl list-overrides').stdout
    starts = lab.unit_starts()
    pre = both(lab.pulumi('preview', '--diff', stack=STACK))
    assert ('host-nvidia-driver: 580.95.05 -> 580.105.08 (open kernel modules, built with DKMS for kernels %s): the '
            'modules can be reloaded in place (nothing but SGLang holds them): SGLang in container 200 '
            '(sglang-qwen.service) stops for it, then restarts on the new user space. The VM\'s GPUs stay on vfio-pci, '
            'untouched' % kernel) in pre, pre
    assert re.search(r'~ version *: "580.95.05" => "580.105.08"', pre), pre
    up = both(lab.pulumi('up', '--yes', '--skip-preview', stack=STACK))
    assert 'host-nvidia-driver: 580.95.05 -> 580.105.08: loaded, every container GPU up on it' in up, up
    assert lab.host.nvidia_module() == B
    assert lab.host.installed_nvidia(kernel) == B
    after = lab.outputs(STACK)
    assert after['nvidia_driver']['loaded'] == B and after['nvidia_driver']['kernels_missing'] == []
    assert after['runtime']['container_driver'] == B and after['runtime']['host_driver'] == B
    assert after['gpu_proof']['ok'] is True and after['gpu_proof']['at'] != before['gpu_proof']['at']
    assert after['sglang_unit']['active'] is True
    assert lab.unit_starts() == starts + 1        # stopped by the upgrade, started once on B
    assert ({b: lab.host.driver(b) for b in VM_GPUS}, after['vm']) == vm_before
    assert lab.ssh('driverctl list-overrides').stdout == overrides
    assert lab.ssh('systemctl is-active nvidia-persistenced').stdout.strip() == 'active'
    again = lab.preview_json(STACK, '--refresh')
    assert [s for s in again['steps'] if s['op'] not in ('same', 'read', 'refresh')] == []


def test_a_version_that_does_not_bring_the_gpus_up_is_undone_and_stops_the_run(deployed):
    lab, cfg_b, _ = deployed
    text = hostsim.nvidia_installer(C)
    lab.host.add_artifact(hostsim.nvidia_installer_name(C), text)
    lab.host.arm_fsp_failure(version=C)      # C's load logs the FSP boot error for every GPU it binds
    cfg = copy.deepcopy(cfg_b)
    cfg['gpuhost:nvidia']['driver'].update(version=C, installer=RUN % C,
                                           sha256=hashlib.sha256(text.encode()).hexdigest())
    lab.write_stack(STACK, cfg)
    starts = lab.unit_starts()
    try:
        res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
        out = both(res)
        assert res.returncode != 0
        assert ('gpuhost: host-nvidia-driver: 580.119.02 did not bring the GPUs up: the kernel log since the load: '
                'NVRM: GPU 0000:01:00.0: Error status 0x177 while polling for FSP boot complete') in out, out
        assert ('580.105.08 is back and loaded; the rollout stops at this host (its SGLang runs again on '
                '580.105.08)') in out, out
        assert (lab.host.nvidia_module(), lab.host.installed_nvidia()) == (B, B)
        assert lab.unit_starts() == starts + 1          # stopped for the upgrade, started again on B
        # (A fresh-clone CI run saw this unit not active here once under load: its state and journal say why next time.)
        state = lab.ct_exec(['systemctl', 'is-active', 'sglang-qwen.service'], check=False).stdout.strip()
        assert state == 'active', (state, lab.ct_exec(['journalctl', '--no-pager', '-n', '40', '-u',
                                                       'sglang-qwen.service'], check=False).stdout)
        # The collector's next run counts C's Xid 143 (GpuhostGpuXidCritical), with no pulumi command - started as
        # its timer would (Lab.start_host_unit: the lab host's cgroup v1 fault, status=219/CGROUP, proven from the
        # journal, is the only failure it starts again after; any other fails with the unit's journal).
        lab.start_host_unit('gpuhost-collector.service')
        prom = lab.ssh('cat %s/gpuhost-collector.prom' % monitoring.TEXTFILE_DIR).stdout
        assert re.search(r'gpuhost_gpu_xid_errors_total\{[^}]*pci_bus_id="0000:01:00.0"[^}]*xid="143"[^}]*\} [1-9]',
                         prom), prom
    finally:
        lab.host.disarm_fsp_failure()
        lab.write_stack(STACK, cfg_b)


def slow_dkms(lab):
    """The DKMS build takes 8 s (a real one takes minutes): an interruption lands in the middle of the install."""
    os.makedirs(lab.host.path('faults'), exist_ok=True)
    with open(lab.host.path('faults', 'dkms.install'), 'w') as f:
        f.write('slow 8')


def host_log(lab):
    return lab.ssh('cat /var/lib/gpuhost/jobs/gpuhost-driver/log 2>/dev/null').stdout


def test_a_ctrl_c_in_the_middle_of_an_install_leaves_the_job_running_and_the_next_up_converges(deployed):
    lab, cfg_b, _ = deployed
    text = hostsim.nvidia_installer(C)
    cfg = copy.deepcopy(cfg_b)
    cfg['gpuhost:nvidia']['driver'].update(version=C, installer=RUN % C,
                                           sha256=hashlib.sha256(text.encode()).hexdigest())
    lab.write_stack(STACK, cfg)
    slow_dkms(lab)      # the operator's Ctrl-C lands in it
    jobs_started = 'journalctl --no-pager -o cat _PID=1 | grep -c "Started gpuhost-driver-.*gpuhost job gpuhost-driver"'
    before = int(lab.ssh(jobs_started).stdout.strip() or 0)

    def started():
        return lab.ssh('cat /var/lib/gpuhost/jobs/gpuhost-driver/started 2>/dev/null').stdout
    earlier = started()
    try:
        proc = subprocess.Popen(['pulumi', 'up', '--yes', '--skip-preview', '--stack', STACK], cwd=lab.project,
                                env=lab.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        deadline = time.time() + 120
        # This run's job (a start of its own: the last job's log, the failed C's above, says "installing" too).
        while not (started() != earlier and 'installing 580.119.02' in host_log(lab)):
            assert time.time() < deadline and proc.poll() is None, 'the install never started'
            time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)       # the terminal's Ctrl-C: the whole foreground group
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode != 0 and 'Traceback' not in out, out[-3000:]
        # The host says where the upgrade is (driver_facts.sh's `upgrade` record, from the job's own state).
        with open(os.path.join(REPO, 'hostscripts', 'driver_facts.sh'), 'rb') as f:
            facts = driverfacts.parse(lab.ssh('bash -s', stdin=f.read()).stdout)
        assert facts.upgrade[1:] == (B, C) and facts.upgrade[0] in ('installing', 'load', 'check', 'done'), facts
        # The job goes on by itself: the next `up` follows it to its end and carries on - from B, as the job recorded
        # (its modules are unloaded mid-install: this run finds none loaded, and follows the job that loads C).
        up = both(lab.pulumi('up', '--yes', '--skip-preview', stack=STACK))
        assert 're-attached to job gpuhost-driver, still running on the host' in up, up
        assert '580.105.08 -> 580.119.02: loaded, every container GPU up on it' in up, up
    finally:
        os.unlink(lab.host.path('faults', 'dkms.install'))
    assert (lab.host.nvidia_module(), lab.host.installed_nvidia()) == (C, C)
    assert int(lab.ssh(jobs_started).stdout.strip()) == before + 1, 'one job, one install'
    assert host_log(lab).count('installing 580.119.02') == 1
    assert lab.outputs(STACK)['runtime']['container_driver'] == C


def test_an_ssh_drop_in_the_middle_of_an_install_fails_the_up_in_one_line_and_the_next_up_converges(deployed):
    lab, cfg_b, _ = deployed
    lab.write_stack(STACK, cfg_b)         # B from the C the Ctrl-C above left (or from A, run alone)
    slow_dkms(lab)
    jobs_started = 'journalctl --no-pager -o cat _PID=1 | grep -c "Started gpuhost-driver-.*gpuhost job gpuhost-driver"'
    before = int(lab.ssh(jobs_started).stdout.strip() or 0)
    log_before = host_log(lab)
    try:
        # The job's start runs on the host (the upgrade to B begins), then the connection drops before its exit status
        # is back: the `up` ends with one line naming the lost connection and the step; the job goes on installing.
        lab.drop_ssh_at(1, mode='after', match='job.sh')
        res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
        raw = res.stdout + res.stderr
        assert res.returncode != 0 and 'Traceback' not in raw, raw[-3000:]
        lost = [line for line in raw.splitlines() if 'lost during start of job gpuhost-driver' in line]
        # (the engine's live line of the step and its diagnostics: the whole message on each)
        assert any(line.strip().startswith('error: gpuhost: connection to root@') for line in lost), raw
        assert all('gpuhost: connection to root@' in line and
                   'the step may have completed on the host. Safe to re-run' in line and
                   'A job it started keeps running on the host; the next `up` re-attaches to it' in line
                   for line in lost), raw
        # The next `up` follows the job to its end, through a poll whose connection drops too, mid-install (it
        # reconnects and follows on).
        drops = len([e for e in lab.ssh_log() if e.get('drop')])
        lab.drop_ssh_at(2, mode='during', match='job.sh')
        up = both(lab.pulumi('up', '--yes', '--skip-preview', stack=STACK))
        assert 're-attached to job gpuhost-driver, still running on the host' in up, up
        assert '-> 580.105.08: loaded, every container GPU up on it' in up, up
        assert len([e for e in lab.ssh_log() if e.get('drop')]) == drops + 1, 'no poll was dropped'
    finally:
        os.unlink(lab.host.path('faults', 'dkms.install'))
        if lab.ssh_drop_pending():
            os.unlink(lab.control('ssh-drop.json'))
    assert (lab.host.nvidia_module(), lab.host.installed_nvidia()) == (B, B)
    assert int(lab.ssh(jobs_started).stdout.strip()) == before + 1, 'one job, one install'
    assert host_log(lab).count('installing 580.105.08') == 1 and host_log(lab) != log_before
    assert lab.outputs(STACK)['runtime']['container_driver'] == B


def test_a_driver_held_by_another_process_is_upgraded_across_one_reboot_where_allowed(deployed):
    """gpuhost:host.reboot: when-required and a holder of the GPUs other than SGLang (a monitoring agent on the host):
    priced as a reboot at preview; `up` drains SGLang, holds the modules back at the next boot (its own file in
    /etc/modprobe.d and the initramfs), reboots once, installs D with nothing loaded, loads it, removes the hold - a
    later boot loads D -, and SGLang serves on D's user space; the VM's GPUs stay on vfio-pci."""
    lab, cfg_b, _ = deployed
    D = '580.126.09'
    text, name = hostsim.nvidia_installer(D), hostsim.nvidia_installer_name(D)
    # D declared by source: the host downloads it from the lab's mirror into the program's installers directory.
    hostsim.write(os.path.join(lab.dir, 'mirror', 'installers', name), text)
    cfg = copy.deepcopy(cfg_b)
    cfg['gpuhost:nvidia']['driver'] = {'version': D, 'sha256': hashlib.sha256(text.encode()).hexdigest(),
                                       'source': 'http://%s:8089/installers/%s' % (lab.spec['addresses']['pve'], name)}
    cfg['gpuhost:host']['reboot'] = 'when-required'
    lab.write_stack(STACK, cfg)
    users = lab.host.module_refcnt()
    assert lab.ssh('systemd-run --unit=gpu-monitor /usr/bin/python3 /usr/lib/gpuhost-lab/persistenced.py').exit_code == 0
    deadline = time.time() + 30
    while lab.host.module_refcnt() == users:
        assert time.time() < deadline, 'the holder never opened the GPUs'
        time.sleep(0.2)
    pid = lab.ssh('systemctl show -p MainPID --value gpu-monitor').stdout.strip()
    kernel, reboots, old = lab.host.spec['kernel'], len(lab.reboots()), lab.host.nvidia_module()   # C, after the above
    vm_gpus = {b: lab.host.driver(b) for b in VM_GPUS}
    try:
        pre = both(lab.pulumi('preview', '--diff', stack=STACK))
        assert ('host-nvidia-driver: %s -> 580.126.09 (open kernel modules, built with DKMS for kernels %s): the '
                'modules cannot be unloaded in place - held by python3 (pid %s, on the host) - so the host reboots '
                'into 580.126.09 (gpuhost:host.reboot: when-required): SGLang in container 200 (sglang-qwen.service) '
                'stops for it, then restarts on the new user space, and every guest stops while it reboots' % (
                    old, kernel, pid)) in pre, pre
        # The version running now was uploaded elsewhere (/root/gpuhost-artifacts): what a failure would go back to
        # is not beside D's download - refused before anything changes, the fix named.
        res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
        assert res.returncode != 0
        assert ('host-nvidia-driver: the installer of the running version %s (NVIDIA-Linux-x86_64-%s.run) is not in '
                '/var/lib/gpuhost/installers: it is what a failed upgrade goes back to. Put it there and re-run; '
                'nothing was changed' % (old, old)) in both(res), both(res)
        assert (lab.host.nvidia_module(), len(lab.reboots())) == (old, reboots)
        assert lab.ssh('test -e /etc/modprobe.d/gpuhost-driver-hold.conf').exit_code == 1
        assert lab.ssh('test -f /var/lib/gpuhost/installers/' + name).exit_code == 0, 'D downloaded first'
        assert lab.ssh('cp /root/gpuhost-artifacts/%s /var/lib/gpuhost/installers/' % hostsim.nvidia_installer_name(
            old)).exit_code == 0
        up = both(lab.pulumi('up', '--yes', '--skip-preview', stack=STACK))
    finally:
        lab.ssh('systemctl stop gpu-monitor 2>/dev/null || true')
    assert ('host-nvidia-driver: the nvidia modules are held back at the next boot (held by python3 (pid %s, on the '
            'host)); rebooting' % pid) in up, up
    assert '-> 580.126.09: loaded, every container GPU up on it' in up, up
    assert len(lab.reboots()) == reboots + 1, 'one reboot'
    assert (lab.host.nvidia_module(), lab.host.installed_nvidia()) == (D, D)
    assert lab.ssh('test -e /etc/modprobe.d/gpuhost-driver-hold.conf').exit_code == 1, 'the hold is gone'
    after = lab.outputs(STACK)
    assert after['runtime']['container_driver'] == D and after['sglang_unit']['active'] is True
    assert {b: lab.host.driver(b) for b in VM_GPUS} == vm_gpus
    # Nothing holds it back at a later boot either: the initramfs the next boot reads has no hold.
    assert not os.path.exists(lab.host.path('boot', 'initrd-modprobe.d', 'gpuhost-driver-hold.conf'))
