"""hostscripts/driver_facts.sh and its parser (issue 59's first step, docs/driver-plan.md): the NVIDIA driver as
loaded and as installed per kernel - read, never guessed. The parser on the real output of the lent H100 (a machine
with no /lib/modules: said, not guessed), and the script itself with the real modinfo against module trees laid out
by the lab (lab/hostsim.py install_kernel: a module file modinfo and depmod read, as DKMS leaves it)."""

import os
import shutil
import subprocess

import pytest

from lab import hostsim
from tests.lablib import REPO
from transport import driverfacts

GOLDEN = os.path.join(REPO, 'tests', 'unit', 'golden')
SCRIPT = os.path.join(REPO, 'hostscripts', 'driver_facts.sh')


def test_the_real_h100s_driver_is_open_580_and_its_missing_module_tree_is_said_not_guessed():
    with open(os.path.join(GOLDEN, 'driver_facts.h100-device.txt')) as f:
        facts = driverfacts.parse(f.read())
    assert (facts.loaded, facts.flavour, facts.running) == ('580.159.04', 'open', '6.18.44-fc-v1272-gpu')
    assert facts.tree is False and facts.kernels == {} and facts.without_module() == []


def test_a_proprietary_module_and_an_unloaded_one():
    facts = driverfacts.parse('loaded\t550.54.14\nflavour\tNVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  '
                              'Thu Feb 22 01:44:30 UTC 2024\nrunning\t6.8.12-4-pve\n')
    assert facts.flavour == 'proprietary' and facts.tree is True
    facts = driverfacts.parse('running\t6.8.12-4-pve\nkernel\t6.8.12-4-pve\t580.95.05\n')
    assert facts.loaded is None and facts.flavour is None and facts.kernels == {'6.8.12-4-pve': '580.95.05'}


@pytest.mark.skipif(shutil.which('modinfo') is None or shutil.which('depmod') is None, reason='kmod not installed')
def test_each_kernel_with_the_module_it_has_read_by_the_real_modinfo(tmp_path):
    """Two kernels, one with the module DKMS built and one a kernel update left without it: the script, run with
    /lib/modules pointing at the lab's trees (a bind mount in a mount namespace of its own), reads each with modinfo."""
    if subprocess.run(['unshare', '-m', 'true'], capture_output=True).returncode != 0:
        pytest.skip('no mount namespace here')
    host = hostsim.Host.__new__(hostsim.Host)
    host.root = str(tmp_path)
    host.install_kernel('6.8.12-4-pve', '580.95.05')
    host.install_kernel('6.8.12-9-pve')
    made = not os.path.isdir('/lib/modules')     # (a machine without kernels of its own: a container, CI)
    if made:
        os.makedirs('/lib/modules')
    try:
        out = subprocess.run(['unshare', '-m', 'bash', '-c', 'mount --bind "$1" /lib/modules && bash "$2"', 'x',
                              str(tmp_path / 'lib' / 'modules'), SCRIPT], capture_output=True, text=True,
                             check=True).stdout
    finally:
        if made:
            os.rmdir('/lib/modules')
    facts = driverfacts.parse(out)
    assert facts.kernels == {'6.8.12-4-pve': '580.95.05', '6.8.12-9-pve': ''}, out
    assert facts.without_module() == ['6.8.12-9-pve']


# ---------------------------------------------------------------- what holds the driver, dkms, persistenced, headers

def golden(name):
    with open(os.path.join(GOLDEN, name)) as f:
        return driverfacts.parse(f.read())


def test_the_real_h100s_output_says_nothing_of_holders_dkms_or_headers_and_is_read_as_unknown():
    """A script that printed none of the new records (the lent H100's): unknown, never "nothing holds it"."""
    facts = golden('driver_facts.h100-device.txt')
    assert (facts.refcnt, facts.holders, facts.processes, facts.headers) == ({}, {}, [], {})
    assert (facts.unreadable, facts.persistenced, facts.dkms_tool, facts.dkms) == (None, None, None, None)
    assert facts.in_use() is None and facts.processes_known is False


def test_a_proxmox_hosts_driver_held_by_sglangs_container_another_container_and_persistenced():
    facts = golden('driver_facts.proxmox8-host.txt')
    assert (facts.loaded, facts.flavour, facts.running) == ('580.95.05', 'open', '6.8.12-4-pve')
    assert facts.refcnt == {'nvidia': 41, 'nvidia_uvm': 4, 'nvidia_modeset': 1, 'nvidia_drm': 0}
    assert facts.holders == {'nvidia': ['nvidia_modeset', 'nvidia_uvm'], 'nvidia_modeset': ['nvidia_drm']}
    assert facts.in_use() is True and facts.processes_known is True and facts.persistenced == 'active'
    sglang = [p for p in facts.processes if p.vmid == 200]
    assert [(p.pid, p.comm) for p in sglang] == [(48190, 'python3'), (48213, 'sglang::schedul'),
                                                 (48214, 'sglang::schedul')]
    assert sglang[1].devices == ('nvidia-uvm', 'nvidia0', 'nvidia1', 'nvidiactl')
    assert sglang[1].cgroup == '/lxc/200/ns/system.slice/sglang-qwen.service'
    # What an upgrade of container 200's driver must not stop unasked: the host's persistenced, container 201's tool.
    others = facts.holders_other_than(200)
    assert [(p.pid, p.comm, p.vmid) for p in others] == [(1187, 'nvidia-persiste', None), (50102, 'nvidia-smi', 201)]
    assert [p.pid for p in facts.holders_other_than(201)] == [1187, 48190, 48213, 48214]
    assert [(e.version, e.kernel, e.arch, e.state) for e in facts.dkms] == [
        ('580.95.05', '6.8.12-4-pve', 'x86_64', 'installed'), ('580.95.05', '6.8.12-2-pve', 'x86_64', 'installed')]
    assert facts.dkms[1].note == '(WARNING! Diff between built and installed module!)' and facts.dkms_tool is True
    assert facts.headers == {'6.8.12-2-pve': True, '6.8.12-4-pve': True, '6.8.12-9-pve': False}
    assert facts.without_headers() == ['6.8.12-9-pve'] == facts.without_module()


def test_an_older_proxmox_with_dkms_2s_lines_a_proprietary_module_and_no_persistenced():
    facts = golden('driver_facts.proxmox7-host.txt')
    assert facts.flavour == 'proprietary' and facts.persistenced == 'absent'
    assert [(e.module, e.version, e.kernel, e.state) for e in facts.dkms] == [
        ('nvidia', '535.183.01', '5.15.158-2-pve', 'installed'), ('nvidia', '535.183.01', '5.15.160-1-pve', 'built'),
        ('nvidia', '550.54.14', None, 'added')]
    # nvidia_uvm holds nvidia with no process holding either: still in use (rmmod nvidia would fail).
    assert facts.processes == [] and facts.holders_other_than(200) == [] and facts.in_use() is True
    assert facts.without_module() == ['5.15.160-1-pve'] and facts.without_headers() == []


@pytest.mark.parametrize('line, want', [
    ('nvidia/580.95.05, 6.8.12-4-pve, x86_64: installed', ('nvidia', '580.95.05', '6.8.12-4-pve', 'x86_64',
                                                           'installed')),
    ('nvidia, 580.95.05, 6.8.12-4-pve, x86_64: installed', ('nvidia', '580.95.05', '6.8.12-4-pve', 'x86_64',
                                                            'installed')),
    ('nvidia/580.95.05: added', ('nvidia', '580.95.05', None, None, 'added')),
    ('nvidia/580.95.05, 6.8.12-9-pve, x86_64: broken', ('nvidia', '580.95.05', '6.8.12-9-pve', 'x86_64', 'broken')),
    ('Error! Could not locate dkms.conf file.', (None, None, None, None, None)),
])
def test_a_dkms_status_line_in_either_format(line, want):
    e = driverfacts.parse_dkms(line)
    assert (e.module, e.version, e.kernel, e.arch, e.state) == want and e.line == line


def test_unknown_states_stay_unknown():
    facts = driverfacts.parse('loaded\t580.159.04\nrunning\tk\nrefcnt\tnvidia\t?\nrefcnt\tnvidia_uvm\t?\n'
                              'unreadable\t3\npersistenced\t?\ndkms\t?\n')
    assert facts.refcnt == {'nvidia': None, 'nvidia_uvm': None} and facts.in_use() is None
    assert facts.processes_known is False and facts.persistenced is None
    assert (facts.dkms_tool, facts.dkms) == (True, None)
    facts = driverfacts.parse('running\tk\nunreadable\t0\npersistenced\tinactive\ndkms\tnone\n')
    assert facts.in_use() is False and (facts.dkms_tool, facts.dkms) == (True, [])     # not loaded at all
    facts = driverfacts.parse('loaded\tv\nrunning\tk\nrefcnt\tnvidia\t0\nrefcnt\tnvidia_uvm\t0\nunreadable\t4\n'
                              'dkms\tabsent\n')
    assert facts.in_use() is False and (facts.dkms_tool, facts.dkms) == (False, [])   # the kernel's count is 0


def test_a_containers_own_scan_counts_only_where_the_host_does_not_show_that_container():
    mine = driverfacts.parse_container('process\t812\tpython3\t/system.slice/sglang.service\tnvidia0,nvidiactl\n'
                                       'unreadable\t0\n', 200)
    assert [(p.pid, p.vmid, p.cgroup) for p in mine] == [(812, 200, '/system.slice/sglang.service')]
    assert driverfacts.parse_container('absent\n', 200) is None
    assert driverfacts.parse_container('', 200) is None             # no scan finished: unknown, not "none"
    # A Proxmox host shows container 200's processes itself: the container's view (the same ones) is not added.
    host = golden('driver_facts.proxmox8-host.txt')
    assert host.with_container(200, mine).processes == host.processes
    # The lab's host (its containers are machines of their own) shows only its own: container 200's are added.
    lab = driverfacts.parse('running\tk\nrefcnt\tnvidia\t3\nprocess\t90\tnvidia-persiste\t/system.slice/'
                            'nvidia-persistenced.service\tnvidiactl\nunreadable\t0\n')
    merged = lab.with_container(200, mine)
    assert [(p.pid, p.vmid) for p in merged.processes] == [(90, None), (812, 200)]
    assert [p.pid for p in merged.holders_other_than(200)] == [90]
    assert lab.with_container(200, None) is lab


def test_a_cgroup_names_its_proxmox_container():
    assert driverfacts.cgroup_vmid('/lxc/200/ns/system.slice/sglang.service') == 200
    assert driverfacts.cgroup_vmid('/lxc/201') == 201
    assert driverfacts.cgroup_vmid('/lxc.payload.105/init.scope') == 105
    assert driverfacts.cgroup_vmid('/lxc.monitor/200') is None         # the host's monitor of the container
    assert driverfacts.cgroup_vmid('/system.slice/nvidia-persistenced.service') is None
    assert driverfacts.cgroup_vmid(None) is None


# The real script in a mount and PID namespace of its own (only its processes in /proc: nothing else the machine
# runs is seen): /dev is a directory whose nvidia0 and nvidiactl are plain files bound there (no driver needed - a
# process's fd link names the path it opened), /sys/module a tree with an nvidia module whose refcnt is unreadable,
# as on the lent H100. A python3 child holds the nodes open (one by O_PATH); the shell that starts the script holds
# one too, which the script inherits: the script must not list itself, the shell must be listed.
INNER = r'''
set -euo pipefail
t=$1 script=$2 ctscript=$3
mount --bind /dev/null "$t/dev/null"
mount --rbind "$t/dev" /dev
mount --bind "$t/sys-module" /sys/module
python3 -c 'import os, time
a = os.open("/dev/nvidia0", os.O_PATH); b = os.open("/dev/nvidiactl", os.O_RDONLY)
c = os.open("/dev/nvidia0", os.O_RDONLY); time.sleep(60)' &
py=$!
for _ in $(seq 200); do
  ls -l "/proc/$py/fd" 2>/dev/null | grep -q nvidiactl && break
  sleep 0.05
done
exec 3</dev/nvidia0
PATH=$t/bin:$PATH bash "$script" > "$t/host.out" &
s=$!
wait "$s"
PATH=$t/bin:$PATH bash "$ctscript" 200 < "$script" > "$t/ct.out" 3<&- &
c=$!
wait "$c"
# As a user who cannot read root's fd directories (the shell's, python3's): counted, not taken for "nothing open".
setpriv --reuid=65534 --regid=65534 --clear-groups bash -s processes < "$script" > "$t/nobody.out"
echo "$$ $py $s $c" > "$t/pids"
kill "$py"
'''


def test_the_real_script_names_the_processes_holding_dev_nvidia_and_not_itself(tmp_path):
    if subprocess.run(['unshare', '-mpf', '--mount-proc', 'true'], capture_output=True).returncode != 0:
        pytest.skip('no mount and PID namespace here')
    (tmp_path / 'dev').mkdir()
    for name in ('null', 'nvidia0', 'nvidiactl'):
        (tmp_path / 'dev' / name).touch()
    (tmp_path / 'dev' / 'fd').symlink_to('/proc/self/fd')
    sysmod = tmp_path / 'sys-module'
    (sysmod / 'nvidia' / 'holders').mkdir(parents=True)
    (sysmod / 'nvidia' / 'holders' / 'nvidia_uvm').mkdir()
    (sysmod / 'nvidia_uvm' / 'holders').mkdir(parents=True)
    (sysmod / 'nvidia_uvm' / 'refcnt').write_text('2\n')
    (sysmod / 'nvme').mkdir()
    # dkms and systemctl as the host would answer (one line of each dkms format); pct running the container's scan here.
    bin_ = tmp_path / 'bin'
    bin_.mkdir()
    stubs = {
        'dkms': 'printf "%s\\n" "nvidia/580.95.05, 6.8.12-4-pve, x86_64: installed" '
                '"nvidia, 550.54.14, 6.8.12-2-pve, x86_64: built"',
        'systemctl': 'case $1 in show) echo loaded ;; is-active) echo active; exit 0 ;; esac',
        # (The container's scan run holding a node itself: it must not list itself either. On a real host pct runs on
        # the host, which the container does not see: here the caller, sharing the PID namespace, holds nothing.)
        'pct': 'case $1 in status) echo "status: running" ;; exec) shift 3; exec "$@" 3</dev/nvidia0 ;; esac',
    }
    for name, body in stubs.items():
        (bin_ / name).write_text('#!/bin/bash\n' + body + '\n')
        (bin_ / name).chmod(0o755)
    subprocess.run(['unshare', '-mpf', '--mount-proc', 'bash', '-c', INNER, 'inner', str(tmp_path), SCRIPT,
                    os.path.join(REPO, 'hostscripts', 'ct_gpu_holders.sh')], check=True, timeout=60)
    shell, py, script, ct = (int(x) for x in (tmp_path / 'pids').read_text().split())
    out = (tmp_path / 'host.out').read_text()
    facts = driverfacts.parse(out)
    held = {p.pid: (p.comm, p.devices) for p in facts.processes}
    assert held == {shell: ('bash', ('nvidia0',)), py: ('python3', ('nvidia0', 'nvidiactl'))}, out
    assert script not in held and facts.unreadable == 0 and facts.processes_known, out
    assert all(p.cgroup and p.cgroup.startswith('/') for p in facts.processes), out
    assert facts.refcnt == {'nvidia': None, 'nvidia_uvm': 2} and facts.holders == {'nvidia': ['nvidia_uvm']}, out
    assert facts.in_use() is True and facts.persistenced == 'active', out
    assert [(e.version, e.kernel, e.state) for e in facts.dkms] == [('580.95.05', '6.8.12-4-pve', 'installed'),
                                                                   ('550.54.14', '6.8.12-2-pve', 'built')], out
    # The same scan through ct_gpu_holders.sh (pct exec ... bash -s processes): only its records, each marked 200.
    ct_out = (tmp_path / 'ct.out').read_text()
    assert [line.split('\t')[0] for line in ct_out.splitlines()] == ['process', 'process', 'unreadable'], ct_out
    mine = driverfacts.parse_container(ct_out, 200)
    assert {(p.pid, p.comm, p.vmid) for p in mine} == {(shell, 'bash', 200), (py, 'python3', 200)}, ct_out
    assert ct not in {p.pid for p in mine} and ct_out.count('bash') == 1
    nobody = driverfacts.parse((tmp_path / 'nobody.out').read_text())
    assert (nobody.processes, nobody.unreadable, nobody.processes_known) == ([], 2, False)


def test_a_scan_that_cannot_run_says_so(tmp_path):
    """A find without GNU's predicates (busybox's, in a small container): `unreadable ?`, holders unknown."""
    (tmp_path / 'find').write_text('#!/bin/sh\necho "find: unrecognized: -readable" >&2\nexit 1\n')
    (tmp_path / 'find').chmod(0o755)
    env = dict(os.environ, PATH='%s:%s' % (tmp_path, os.environ['PATH']))
    out = subprocess.run(['bash', SCRIPT, 'processes'], capture_output=True, text=True, check=True, env=env).stdout
    assert out == 'unreadable\t?\n'
    facts = driverfacts.parse('running\tk\nrefcnt\tnvidia\t?\n' + out)
    assert (facts.unreadable, facts.processes_known, facts.in_use()) == (None, False, None)
    assert driverfacts.parse_container(out, 200) is None


def test_the_containers_scan_is_sent_driver_facts_own_text(monkeypatch):
    """One scan, not two copies of it: ct_gpu_holders.sh runs driver_facts.sh's text, sent on stdin, in the container."""
    from transport import remote
    sent = []

    def run(target, name, args=(), stdin=None, **kw):
        sent.append((target, name, list(args), stdin))
        return remote.Result('process\t812\tpython3\t/system.slice/sglang.service\tnvidia0\nunreadable\t0\n', '', 0)

    monkeypatch.setattr(remote, 'run', run)
    got = driverfacts.container_processes('host-a', 200)
    with open(SCRIPT, 'rb') as f:
        assert sent == [('host-a', 'ct_gpu_holders.sh', ['200'], f.read())]
    assert [(p.pid, p.vmid) for p in got] == [(812, 200)]
    assert remote.step_name('ct_gpu_holders.sh', ['200']) == 'reading the processes holding the GPUs in container 200'


def test_the_real_h100_read_again_with_every_record_a_holder_found_by_its_open_devices():
    """The script of today run on a lent H100 (2026-12-07; a VM whose kernel has nvidia built in: no refcnt, no
    modeset or drm module, no systemd, no dkms, no /lib/modules), idle and with a process holding /dev/nvidiactl and
    /dev/nvidia0 open (`exec 3</dev/nvidiactl 4</dev/nvidia0; sleep 20`, read-only: nothing loaded or unloaded)."""
    idle, held = golden('driver_facts.h100-idle.txt'), golden('driver_facts.h100-held.txt')
    for f in (idle, held):
        assert (f.loaded, f.flavour, f.running) == ('580.159.04', 'open', '6.18.44-fc-v1272-gpu')
        assert f.refcnt == {'nvidia': None, 'nvidia_uvm': None}       # unreadable: said, not guessed as 0
        assert (f.persistenced, f.dkms_tool, f.tree, f.unreadable) == (None, False, False, 0)
    # Idle: no process, and a refcnt nobody could read - unknown, not "free to unload".
    assert idle.processes == [] and idle.in_use() is None
    assert [(p.pid, p.comm, p.devices, p.vmid) for p in held.processes] == [(676, 'sleep', ('nvidia0', 'nvidiactl'),
                                                                             None)]
    assert held.processes[0].cgroup.startswith('/process_api/') and held.in_use() is True
    assert [p.pid for p in held.holders_other_than(200)] == [676]
