"""The collector that runs on the host (components/collector.py) and the resource that installs it
(resources/monitoring.py): it reads the host as `pulumi up` reads it and decides as `pulumi up` decides,
counts Xid events and IOMMU page faults from the kernel log exactly once, writes a textfile promtool
accepts, and the script the program installs is this very code."""

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from components import collector
from hostscripts import host_state
from components import monitoring as program_monitoring
from resources import monitoring
from transport import remote
from tests.unit.config.test_config import parse
from tests.unit.grammar.test_systemd_unit import analyze
from tools import render as render_tool

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, 'lab'))
import hostsim  # noqa: E402

PROMTOOL = shutil.which('promtool')
XID79 = 'NVRM: Xid (PCI:0000:11:00): 79, pid=1234, name=python3, GPU has fallen off the bus.'


def lab_deployment():
    return render_tool.load('lab')


def config(tmp_path, d=None):
    cfg = json.loads(program_monitoring.collector_config(d or lab_deployment()))
    cfg['textfile'] = str(tmp_path / 'textfile' / 'gpuhost-collector.prom')
    cfg['state'] = str(tmp_path / 'state' / 'collector-state.json')
    os.makedirs(os.path.dirname(cfg['textfile']), exist_ok=True)
    os.makedirs(os.path.dirname(cfg['state']), exist_ok=True)
    return collector.validate_config(cfg)


@pytest.fixture
def host(tmp_path, monkeypatch):
    """The lab's simulated host (lab/hostsim.py: the files of sysfs and procfs a real host has, and the kernel
    log journald keeps) in a directory, with the lab's journalctl first on PATH."""
    lab = tmp_path / 'lab'
    lab.mkdir()
    shutil.copy(os.path.join(REPO, 'lab', 'spec', 'default.json'), str(lab / 'spec.json'))
    h = hostsim.Host(str(lab))
    h.create()
    # The kernel has the boot id at /proc/sys/kernel/random/boot_id; the lab keeps it at proc/boot_id and
    # bind-mounts it there in its SSH namespace.
    os.makedirs(h.path('proc/sys/kernel/random'))
    os.symlink('../../../boot_id', h.path('proc/sys/kernel/random/boot_id'))
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    os.symlink(os.path.join(REPO, 'lab', 'faketools.py'), str(bin_dir / 'journalctl'))
    monkeypatch.setenv('PATH', '%s:%s' % (bin_dir, os.environ['PATH']))
    monkeypatch.setenv('GPUHOST_LAB', str(lab))
    return h


def run(h, cfg, **kw):
    kw.setdefault('rootfs', h.path())
    return collector.collect(cfg, h.path('sys'), h.path('proc'), log=kw.pop('log', lambda m: None), **kw)


def samples(text):
    return {line.rsplit(' ', 1)[0]: float(line.rsplit(' ', 1)[1]) for line in text.splitlines()
            if line and not line.startswith('#')}


def check_metrics(text):
    if PROMTOOL is None:
        pytest.fail('promtool is missing: apt-get install -y prometheus (.ci/run installs it)')
    res = subprocess.run([PROMTOOL, 'check', 'metrics'], input=text, capture_output=True, text=True)
    return res.returncode, (res.stdout + res.stderr).strip()


def xid(text, bdf, code):
    return samples(text).get('gpuhost_gpu_xid_errors_total{gpu="%s",pci_bus_id="%s",xid="%d"}' % (
        host_state.nvidia_bus_id(bdf), bdf, code))


# ------------------------------------------------------------ the same reading as host_facts.sh

def host_facts_sh(h):
    """hostscripts/host_facts.sh, unmodified, with the simulated host's sysfs and procfs files
    bind-mounted over the real paths in a private mount namespace (as the lab host has them)."""
    if os.geteuid() != 0:
        pytest.fail('this test runs host_facts.sh in a mount namespace of its own, which needs root')
    ns = ('set -e\nfor p in sys/bus/pci sys/kernel/iommu_groups proc/cmdline proc/driver; do '
          'mount --bind "$1/$p" "/$p"; done\nexec bash -c "$SCRIPT" host_facts.sh\n')
    with open(os.path.join(REPO, 'hostscripts', 'host_facts.sh')) as f:
        script = f.read()
    res = subprocess.run(['unshare', '-m', '--propagation', 'private', '--', 'sh', '-c', ns, 'ns', h.root],
                         capture_output=True, text=True, env=dict(os.environ, SCRIPT=script), timeout=60)
    assert res.returncode == 0, res.stderr
    return remote.parse_facts(res.stdout)


def perturb(h):
    """A host in trouble, every way the facts can differ: an identity group, a container GPU on vfio-pci,
    a VM GPU with no driver, another nvidia parameter, a dangerous running command line."""
    h.set_group_type('0000:11:00.0', 'identity')
    h.bind('0000:01:00.0', 'vfio-pci')
    hostsim.write(h.pci('0000:01:00.0', 'driver_override'), 'vfio-pci\n')
    h.bind('0000:91:00.0', None)
    h.write_nvidia_params({'DmaRemapPeerMmio': 0})
    hostsim.write_in_place(h.path('proc/cmdline'), 'BOOT_IMAGE=/boot/vmlinuz root=ZFS=rpool  quiet\tiommu=pt '
                           'iommu.strict=0\n')


@pytest.mark.parametrize('trouble', [False, True], ids=['as-created', 'in-trouble'])
def test_collector_reads_the_host_as_host_facts_sh_and_decides_the_same(host, trouble):
    if trouble:
        perturb(host)
    program = host_facts_sh(host)
    mine = collector.read_host(host.path('sys'), host.path('proc'))
    assert mine.running == program.running
    assert mine.params == program.params
    assert {a: dataclasses.asdict(g) for a, g in mine.gpus.items()} == \
        {a: dataclasses.asdict(g) for a, g in program.gpus.items()}
    expect = json.loads(program_monitoring.collector_config(lab_deployment()))['expect']
    reasons = host_state.reboot_reasons(program, expect)
    assert host_state.reboot_reasons(mine, expect) == reasons
    if trouble:
        kinds = dict(host_state.reason_counts(reasons))
        assert kinds['iommu_group_type'] == 1 and kinds['container_gpu_binding'] == 1
        assert kinds['nvidia_module_option'] == 1 and kinds['kernel_cmdline_unwanted'] == 1
    else:
        assert reasons == ['kernel command line: running lacks iommu.passthrough=0 iommu.strict=0'] + [
            '%s: bound to nvidia, declared vfio-pci' % b for b in expect['vfio_devices']]


def test_the_config_carries_the_declared_state_host_status_uses():
    from resources.host import host_expect
    d = lab_deployment()
    doc = json.loads(program_monitoring.collector_config(d))
    assert doc['expect'] == dict(json.loads(json.dumps(host_expect(d))), nvidia_driver=None)
    assert doc['interval_s'] == 30 and doc['textfile'] == monitoring.COLLECTOR_TEXTFILE
    assert render_tool.load('lab').monitoring.collector_interval_s == 30


# ------------------------------------------------------------------------------- the kernel log

@pytest.mark.parametrize('message,event', [
    (XID79, ('xid', '0000:11:00.0', 79)),
    ("NVRM: Xid (PCI:0000:E1:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) "
     "has been detected on GPU in the framebuffer at partition 0, subpartition 1.", ('xid', '0000:e1:00.0', 48)),
    ('NVRM: Xid (PCI:0000:61:00): 119, pid=2811, name=python3, Timeout after 6s of waiting for RPC response '
     'from GPU0 GSP!', ('xid', '0000:61:00.0', 119)),
    ('NVRM: Xid (PCI:0000:71:00 GPU-I:03): 13, pid=99, Graphics SM Warp Exception', ('xid', '0000:71:00.0', 13)),
    ('nvidia 0000:81:00.0: AMD-Vi: Event logged [IO_PAGE_FAULT domain=0x0027 address=0xfee00000 flags=0x0020]',
     ('iommu_page_fault', '0000:81:00.0')),
    ('vfio-pci 0000:91:00.0: AMD-Vi: Event logged [IO_PAGE_FAULT domain=0x0001 address=0x3fffc0000 flags=0x0000]',
     ('iommu_page_fault', '0000:91:00.0')),
    ('AMD-Vi: Event logged [IO_PAGE_FAULT device=0000:c4:00.0 domain=0x0000 address=0x0 flags=0x0000]',
     ('iommu_page_fault', '0000:c4:00.0')),
    # Kernels before 6.x print the device without its PCI segment.
    ('AMD-Vi: Event logged [IO_PAGE_FAULT device=0a:00.1 domain=0x0000 address=0xfd7c0000 flags=0x0050]',
     ('iommu_page_fault', '0000:0a:00.1')),
    ('NVRM: GPU 0000:11:00.0: GPU has fallen off the bus.', None),
    ('AMD-Vi: Event logged [Device not attached to domain properly]', None),
    ('AMD-Vi: Event logged [INVALID_DEVICE_REQUEST device=0000:01:00.0 pasid=0x00000 address=0x0 flags=0x0a00]',
     None),
    ('NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.95.05', None),
])
def test_kernel_messages_in_their_real_formats(message, event):
    assert collector.scan(message, ['0000:11:00.0', '0000:e1:00.0', '0000:61:00.0', '0000:71:00.0']) == event


def test_an_xid_counts_once_across_restarts_a_lost_state_and_a_crash(host, tmp_path, monkeypatch):
    cfg = config(tmp_path)
    text = run(host, cfg)
    assert xid(text, '0000:11:00.0', 79) == 0, 'critical codes are written from 0 for every GPU'
    host.kernel_log(XID79)
    assert xid(run(host, cfg), '0000:11:00.0', 79) == 1
    # Restarted: the next runs read on from the saved position.
    for _ in range(3):
        assert xid(run(host, cfg), '0000:11:00.0', 79) == 1
    # Its state lost: it counts the boot again from its first message - the same count, not double.
    os.unlink(cfg['state'])
    assert xid(run(host, cfg), '0000:11:00.0', 79) == 1
    # Killed after saving its state, before writing the textfile: the next run shows the count once.
    host.kernel_log(XID79.replace(': 79,', ': 79,'))

    def fail_textfile(path, text, mode=0o644, sync=False):
        if path == cfg['textfile']:
            raise KeyboardInterrupt('killed')
        return real(path, text, mode, sync)
    real = collector.replace
    monkeypatch.setattr(collector, 'replace', fail_textfile)
    with pytest.raises(KeyboardInterrupt):
        run(host, cfg)
    monkeypatch.setattr(collector, 'replace', real)
    assert xid(run(host, cfg), '0000:11:00.0', 79) == 2
    # Killed before saving its state: the next run reads the same messages again, once.
    host.kernel_log(XID79)

    def fail_state(path, text, mode=0o644, sync=False):
        raise KeyboardInterrupt('killed')
    monkeypatch.setattr(collector, 'replace', fail_state)
    with pytest.raises(KeyboardInterrupt):
        run(host, cfg)
    monkeypatch.setattr(collector, 'replace', real)
    assert xid(run(host, cfg), '0000:11:00.0', 79) == 3


def test_a_new_boot_starts_the_counts_again_and_keeps_the_last_success(host, tmp_path):
    cfg = config(tmp_path)
    host.kernel_log(XID79)
    host.kernel_log('nvidia 0000:61:00.0: AMD-Vi: Event logged [IO_PAGE_FAULT domain=0x0015 address=0xfee00000 '
                    'flags=0x0020]')
    s = samples(run(host, cfg, clock=lambda: 1000.0))
    assert s['gpuhost_iommu_page_faults_total{pci_bus_id="0000:61:00.0"}'] == 1
    host.reboot()
    text = run(host, cfg, clock=lambda: 2000.0)
    assert xid(text, '0000:11:00.0', 79) == 0
    assert samples(text)['gpuhost_iommu_page_faults_total{pci_bus_id="0000:61:00.0"}'] == 0
    assert samples(text)['gpuhost_collector_last_success_timestamp_seconds'] == 2000


def test_a_source_it_cannot_read_keeps_the_last_success_and_the_counts(host, tmp_path, monkeypatch):
    cfg = config(tmp_path)
    host.kernel_log(XID79)
    run(host, cfg, clock=lambda: 1000.0)
    fail = tmp_path / 'failbin'
    fail.mkdir()
    (fail / 'journalctl').write_text('#!/bin/sh\necho "Failed to open journal: Bad message" >&2\nexit 1\n')
    os.chmod(str(fail / 'journalctl'), 0o755)
    monkeypatch.setenv('PATH', '%s:%s' % (fail, os.environ['PATH']))
    logged = []
    text = run(host, cfg, clock=lambda: 2000.0, log=logged.append)
    s = samples(text)
    assert s['gpuhost_collector_source_ok{source="kernel_log"}'] == 0
    assert s['gpuhost_collector_source_ok{source="host"}'] == 1
    assert s['gpuhost_collector_last_success_timestamp_seconds'] == 1000, 'stale: the stale alert fires'
    assert xid(text, '0000:11:00.0', 79) == 1, 'the counts read so far stay'
    assert any('Failed to open journal: Bad message' in m for m in logged), logged


def test_journal_messages_that_are_not_printable_arrive_as_bytes(host, tmp_path):
    host.kernel_log('NVRM: Xid (PCI:0000:71:00): 95, pid=1, name=\x1b[1mpy\x1b[0m, Uncontained ECC error')
    entries = collector.journal()
    assert entries[-1][2].startswith('NVRM: Xid (PCI:0000:71:00): 95, pid=1, name=\x1b[1mpy')
    after = collector.journal(entries[-2][0])
    assert [e[0] for e in after] == [entries[-1][0]]
    assert xid(run(host, config(tmp_path)), '0000:71:00.0', 95) == 1


# ------------------------------------------------------------------------------------ the textfile

def test_textfile_passes_promtool_and_says_what_the_host_runs(host, tmp_path):
    perturb(host)
    host.add_aer('0000:01:00.0', 'correctable', 'BadTLP', 3)
    host.add_aer('0000:01:00.0', 'fatal', 'MalfTLP')
    host.kernel_log(XID79)
    host.kernel_log('NVRM: Xid (PCI:0000:11:00): 31, pid=1, name=python3, Ch 00000008, intr 10000000. MMU Fault')
    text = run(host, config(tmp_path), clock=lambda: 1234.5)
    assert check_metrics(text) == (0, '')
    assert open(config(tmp_path)['textfile']).read() == text
    names = {line.split()[2] for line in text.splitlines() if line.startswith('# TYPE')}
    assert names == {line.split()[2] for line in text.splitlines() if line.startswith('# HELP')}
    assert all(n.startswith('gpuhost_') for n in names)
    s = samples(text)
    assert s['gpuhost_blackwell_gpu_identity_domain{gpu="00000000:11:00.0",pci_bus_id="0000:11:00.0"}'] == 1
    assert s['gpuhost_blackwell_gpu_identity_domain{gpu="00000000:61:00.0",pci_bus_id="0000:61:00.0"}'] == 0
    assert s['gpuhost_gpu_info{gpu="00000000:01:00.0",pci_bus_id="0000:01:00.0",pci_id="10de:2bb5",numa_node="0",'
             'assigned_to="container",driver="vfio-pci",iommu_group="20",iommu_group_type="DMA-FQ"}'] == 1
    assert s['gpuhost_gpu_info{gpu="00000000:91:00.0",pci_bus_id="0000:91:00.0",pci_id="10de:2bb5",numa_node="1",'
             'assigned_to="vm",driver="none",iommu_group="41",iommu_group_type="DMA-FQ"}'] == 1
    assert s['gpuhost_reboot_required'] == 1
    assert s['gpuhost_reboot_reasons{kind="container_gpu_binding"}'] == 1
    assert s['gpuhost_kernel_cmdline_declared_arg_running{arg="iommu.passthrough=0"}'] == 0
    assert s['gpuhost_kernel_cmdline_declared_arg_running{arg="iommu.strict=0"}'] == 1
    assert s['gpuhost_kernel_cmdline_unwanted_arg_running{arg="iommu=pt"}'] == 1
    assert s['gpuhost_nvidia_module_parameter{name="DmaRemapPeerMmio",side="declared"}'] == 1
    assert s['gpuhost_nvidia_module_parameter{name="DmaRemapPeerMmio",side="running"}'] == 0
    assert s['gpuhost_nvidia_module_info{version="580.95.05"}'] == 1
    assert xid(text, '0000:11:00.0', 79) == 1 and xid(text, '0000:11:00.0', 31) == 1
    assert xid(text, '0000:61:00.0', 31) is None, 'other codes appear where they happened'
    assert s['gpuhost_gpu_pcie_aer_errors_total{gpu="00000000:01:00.0",pci_bus_id="0000:01:00.0",'
             'severity="correctable"}'] == 3
    assert s['gpuhost_gpu_pcie_aer_errors_total{gpu="00000000:01:00.0",pci_bus_id="0000:01:00.0",'
             'severity="fatal"}'] == 1
    assert s['gpuhost_collector_last_success_timestamp_seconds'] == 1234.5
    assert s['gpuhost_collector_interval_seconds'] == 30
    assert s['gpuhost_iommu_declared_domain_info{domain="DMA-FQ"}'] == 1
    # node_exporter's textfile collector rejects timestamps.
    assert all(len(line.split()) == 2 for line in text.splitlines() if not line.startswith('#'))
    assert not [n for n in os.listdir(os.path.dirname(config(tmp_path)['textfile'])) if n != 'gpuhost-collector.prom']


def test_identity_on_a_gpu_that_is_not_blackwell_is_a_reboot_reason_not_the_critical_series(host, tmp_path):
    hostsim.write(host.pci('0000:11:00.0', 'device'), '0x2330\n')   # an H100, say
    host.set_group_type('0000:11:00.0', 'identity')
    s = samples(run(host, config(tmp_path)))
    assert not any(k.startswith('gpuhost_blackwell_gpu_identity_domain{gpu="00000000:11:00.0"') for k in s)
    assert s['gpuhost_reboot_reasons{kind="iommu_group_type"}'] == 1


# ------------------------------------------------------------------ the NVIDIA driver, declared and per kernel

KMOD = pytest.mark.skipif(shutil.which('modinfo') is None or shutil.which('depmod') is None,
                          reason='kmod not installed')


def driver_deployment(version='580.105.08'):
    from tests.unit.config.test_driver_config import with_driver
    return with_driver({'version': version, 'sha256': 'b' * 64,
                        'installer': '/root/gpuhost-artifacts/NVIDIA-Linux-x86_64-%s.run' % version})


def fake_modinfo(tmp_path, body):
    path = tmp_path / 'modinfo'
    path.write_text('#!/bin/sh\n' + body + '\n')
    os.chmod(str(path), 0o755)
    return str(path)


@KMOD
def test_each_installed_kernel_and_its_nvidia_module_as_the_real_modinfo_reads_them(host, tmp_path):
    """The trees the lab lays out as a kernel's package and DKMS leave them (lab/hostsim.py install_kernel), read
    under the host's root with the real modinfo (`-b ROOT`): the same versions hostscripts/driver_facts.sh reads
    from /lib/modules (tests/unit/test_driverfacts.py, the same trees)."""
    running = host.spec['kernel']       # the lab host's own, with the module its NVIDIA driver is
    host.install_kernel('6.8.12-4-pve', '580.95.05')
    host.install_kernel('6.8.12-9-pve')
    logged = []
    assert collector.kernel_modules(host.path(), collector.find_modinfo(), log=logged.append) == (
        {running: '580.95.05', '6.8.12-4-pve': '580.95.05', '6.8.12-9-pve': ''}, True)
    assert logged == []
    text = run(host, config(tmp_path))
    assert check_metrics(text) == (0, '')
    s = samples(text)
    assert s['gpuhost_nvidia_kernel_modules_readable'] == 1
    assert s['gpuhost_nvidia_kernel_module_built{kernel="6.8.12-4-pve"}'] == 1
    assert s['gpuhost_nvidia_kernel_module_built{kernel="6.8.12-9-pve"}'] == 0
    assert s['gpuhost_nvidia_kernel_module_info{kernel="6.8.12-4-pve",version="580.95.05"}'] == 1
    assert not [k for k in s if k.startswith('gpuhost_nvidia_kernel_module_info{kernel="6.8.12-9-pve"')], \
        'no version label for a module that is not there'
    # DKMS builds it (a kernel's headers installed, `dkms autoinstall -k`): the next run says so.
    host.install_kernel('6.8.12-9-pve', '580.95.05')
    s = samples(run(host, config(tmp_path)))
    assert s['gpuhost_nvidia_kernel_module_built{kernel="6.8.12-9-pve"}'] == 1


def test_no_modinfo_or_no_module_tree_is_unknown_not_none_built(host, tmp_path):
    host.install_kernel('6.8.12-9-pve') if shutil.which('depmod') else os.makedirs(host.path('lib/modules/k'))
    logged = []
    assert collector.kernel_modules(host.path(), None, log=logged.append) == ({}, False)
    assert 'no modinfo (kmod) on the host' in logged[0]
    assert collector.kernel_modules(str(tmp_path / 'nothing'), '/usr/sbin/modinfo', log=logged.append) == ({}, False)
    assert 'cannot list %s' % (tmp_path / 'nothing' / 'lib' / 'modules') in logged[1]
    s = samples(run(host, config(tmp_path), modinfo=lambda: None))
    assert s['gpuhost_nvidia_kernel_modules_readable'] == 0
    assert not [k for k in s if k.startswith('gpuhost_nvidia_kernel_module_')], 'nothing guessed'
    assert s['gpuhost_collector_last_success_timestamp_seconds'] > 0, 'the other alerts are not blinded'


def test_a_modinfo_that_fails_otherwise_or_hangs_leaves_those_kernels_out(host, tmp_path):
    shutil.rmtree(host.path('lib', 'modules'))
    for k in ('6.8.12-1-pve', '6.8.12-4-pve', '6.8.12-9-pve'):
        os.makedirs(host.path('lib', 'modules', k))
    # "not found" only for one kernel; a broken index for another; a version for the third.
    broken = fake_modinfo(tmp_path, 'case "$4" in\n'
                                    '6.8.12-1-pve) echo "modinfo: ERROR: Module nvidia not found." >&2; exit 1;;\n'
                                    '6.8.12-4-pve) echo "modinfo: ERROR: could not open modules.dep.bin" >&2; exit 1;;\n'
                                    '*) echo 580.95.05;;\nesac')
    logged = []
    assert collector.kernel_modules(host.path(), broken, log=logged.append) == (
        {'6.8.12-1-pve': '', '6.8.12-9-pve': '580.95.05'}, False)
    assert logged == ['modinfo -k 6.8.12-4-pve -F version nvidia: exit 1, modinfo: ERROR: could not open '
                      'modules.dep.bin']
    s = samples(run(host, config(tmp_path), modinfo=lambda: broken))
    assert s['gpuhost_nvidia_kernel_modules_readable'] == 0
    assert s['gpuhost_nvidia_kernel_module_built{kernel="6.8.12-1-pve"}'] == 0
    assert 'gpuhost_nvidia_kernel_module_built{kernel="6.8.12-4-pve"}' not in s
    # One that does not answer: that kernel and the ones after it are not asked, the run goes on.
    asked = tmp_path / 'asked'
    hangs = fake_modinfo(tmp_path, 'echo "$4" >> %s; [ "$4" != 6.8.12-4-pve ] || exec sleep 30; echo 580.95.05' % asked)
    logged = []
    assert collector.kernel_modules(host.path(), hangs, timeout=0.5, log=logged.append) == (
        {'6.8.12-1-pve': '580.95.05'}, False)
    assert asked.read_text().split() == ['6.8.12-1-pve', '6.8.12-4-pve']
    assert logged == ['modinfo -k 6.8.12-4-pve: no answer within 0.5 s; kernels not read: 6.8.12-4-pve 6.8.12-9-pve']


def test_the_declared_driver_is_exported_only_where_it_is_declared(host, tmp_path):
    s = samples(run(host, config(tmp_path)))
    assert not [k for k in s if k.startswith('gpuhost_nvidia_driver_declared_info')], 'the operator\'s driver'
    d = driver_deployment('580.105.08')
    assert json.loads(program_monitoring.collector_config(d))['expect']['nvidia_driver'] == '580.105.08'
    text = run(host, config(tmp_path, d))
    assert check_metrics(text) == (0, '')
    s = samples(text)
    assert s['gpuhost_nvidia_driver_declared_info{version="580.105.08"}'] == 1
    assert s['gpuhost_nvidia_module_info{version="580.95.05"}'] == 1


def test_the_collector_reads_driver_versions_as_the_config_declares_them():
    """The collector checks its config's driver version with config/runtime.py's grammar, copied (it imports nothing
    of the program's config): the two accept the same versions."""
    from config.runtime import DriverVersion
    check = DriverVersion.__metadata__[0].func

    def accepts(read, error):
        def one(v):
            try:
                read(v)
                return True
            except error:
                return False
        return one
    versions = ('580.95.05', '580.159.04', '550.54', '58.1', '580.95.05.1', '580.95.05\n', '580.95.05 ', 'x580.95.05')
    program = [v for v in versions if accepts(check, ValueError)(v)]
    assert program == ['580.95.05', '580.159.04', '550.54']
    assert [v for v in versions if accepts(lambda v: collector._str(v, 'v', collector.DRIVER_VERSION_RE, ''),
                                           collector.ConfigError)(v)] == program


# ------------------------------------------------------------------------------------- the config

@pytest.mark.parametrize('edit,message', [
    (lambda c: c['expect']['vfio_devices'].append('0000:zz:00.0'),
     "expect.vfio_devices[4]: '0000:zz:00.0' is not a PCI address (0000:81:00.0)"),
    (lambda c: c.update(textfile='/var/lib/prometheus/node-exporter/gpuhost.txt'),
     "textfile: '/var/lib/prometheus/node-exporter/gpuhost.txt' does not end in .prom"),
    (lambda c: c.update(interval_s=True), 'interval_s: True is not a number of seconds'),
    (lambda c: c.update(version=collector.CONFIG_VERSION + 1),
     'version: %d, this collector reads version %d' % (collector.CONFIG_VERSION + 1, collector.CONFIG_VERSION)),
    (lambda c: c['expect'].update(nvidia_driver='580.95.05; reboot'),
     "expect.nvidia_driver: '580.95.05; reboot' is not an NVIDIA driver version (580.95.05), or null"),
    (lambda c: c['expect'].update(nvidia_driver=580),
     'expect.nvidia_driver: 580 is not a non-empty string'),
    (lambda c: c['expect'].pop('nvidia_driver'), "expect: keys ['nvidia_driver'] missing, none unknown"),
    (lambda c: c.update(extra=1), "keys none missing, ['extra'] unknown"),
    (lambda c: c['expect']['nvidia_params'].update(DmaRemapPeerMmio='1; reboot'),
     "expect.nvidia_params.DmaRemapPeerMmio: '1; reboot' is not an integer as a string"),
    (lambda c: c.update(state='relative/state.json'), "state: 'relative/state.json' is not an absolute"),
])
def test_a_config_it_refuses_names_the_key_the_value_and_what_to_do(tmp_path, capsys, edit, message):
    cfg = json.loads(program_monitoring.collector_config(lab_deployment()))
    # (A config it were to accept would write here, not into this machine's /var/lib.)
    cfg.update(textfile=str(tmp_path / 'x.prom'), state=str(tmp_path / 's.json'))
    edit(cfg)
    path = tmp_path / 'collector.json'
    path.write_text(json.dumps(cfg))
    assert collector.main(['--config', str(path)]) == collector.EXIT_CONFIG
    err = capsys.readouterr().err
    assert message in err and 'run it again rather than editing the file' in err, err


# ---------------------------------------------------------------------------- the installed script

def test_the_installed_script_is_this_code_and_runs_as_the_module_does(host, tmp_path):
    script = program_monitoring.collector_script()
    for name, _shipped_as, rel in program_monitoring.EMBEDDED:
        with open(os.path.join(REPO, rel)) as f:
            assert "_module(%r, r'''%s''')" % (name, f.read()) in script, rel
    with open(os.path.join(REPO, program_monitoring.COLLECTOR_MAIN)) as f:
        assert script.endswith(f.read())
    assert script == program_monitoring.collector_script(), 'the same program writes the same script'
    path = tmp_path / 'gpuhost-collector'
    path.write_text(script)
    os.chmod(str(path), 0o755)
    cfg = config(tmp_path)
    (tmp_path / 'collector.json').write_text(json.dumps(cfg))
    host.kernel_log(XID79)
    host.install_kernel('6.8.12-9-pve')      # a kernel update DKMS has not built the module for
    # A clean environment, as systemd runs it: no PYTHONPATH, nothing of this checkout.
    env = {'PATH': os.environ['PATH'], 'GPUHOST_LAB': os.environ['GPUHOST_LAB']}
    res = subprocess.run(['/usr/bin/python3', '-I', str(path), '--config', str(tmp_path / 'collector.json'),
                          '--path.sysfs', host.path('sys'), '--path.procfs', host.path('proc'),
                          '--path.rootfs', host.path(), '--print'],
                         capture_output=True, text=True, env=env, cwd='/', timeout=60)
    assert res.returncode == 0, res.stderr
    os.unlink(cfg['state'])
    ours = run(host, cfg)
    strip = re.compile(r'^gpuhost_collector_last_success_timestamp_seconds .*$', re.M)
    assert strip.sub('', res.stdout) == strip.sub('', ours)
    assert xid(res.stdout, '0000:11:00.0', 79) == 1
    assert samples(res.stdout)['gpuhost_nvidia_kernel_module_built{kernel="6.8.12-9-pve"}'] == 0


def test_units_load_in_systemd_and_run_the_script_on_the_interval():
    units = program_monitoring.collector_units(parse(monitoring__collector_interval_s=15))
    dumps, err = analyze(units)
    ours = [line for line in err.splitlines() if 'gpuhost-collector.' in line and ':' in line and
            re.search(r'gpuhost-collector\.(service|timer):\d+:', line)]
    assert ours == [], ours
    service, timer = dumps[monitoring.COLLECTOR_SERVICE], dumps[monitoring.COLLECTOR_TIMER]
    assert '/usr/local/sbin/gpuhost-collector --config /etc/gpuhost/collector.json' in service
    assert re.search(r'Type:\s+oneshot', service), service
    assert 'OnUnitActiveSec' in timer and '15s' in timer, timer
    assert 'Unit: gpuhost-collector.service' in timer or 'gpuhost-collector.service' in timer
    assert 'AccuracySec=1s' in units[monitoring.COLLECTOR_TIMER]


def test_interval_out_of_range_is_refused_at_preview():
    from config import ConfigError
    with pytest.raises(ConfigError) as e:
        parse(monitoring__collector_interval_s=2)
    assert 'gpuhost:monitoring.collector_interval_s' in str(e.value) and '5' in str(e.value)


# --------------------------------------------------------------------------------- the resource

@dataclasses.dataclass
class FakeHost:
    files: dict
    timer: tuple = ('not-found', 'inactive')
    calls: list = dataclasses.field(default_factory=list)
    enable_fails: str = ''

    def run(self, target, name, args=(), check=True, **kw):
        import base64
        self.calls.append((name, list(args)))
        if name == 'collector_facts.sh':
            lines = ['file\t%s\t%s' % (p, '-' if self.files.get(p) is None else
                                       base64.b64encode(self.files[p].encode()).decode()) for p in args[1:]]
            return remote.Result('\n'.join(lines + ['timer\t%s\t%s' % self.timer]) + '\n', '', 0)
        if name == 'collector_enable.sh':
            if self.enable_fails:
                return remote.Result('', self.enable_fails, 5)
            self.timer = ('enabled', 'active')
        return remote.Result('', '', 0)

    def put_file(self, target, path, content, mode, expected, post='none', client=None):
        self.calls.append(('put_file', [path, mode, expected]))
        self.files[path] = content
        return True


CONN = {'host': 'h', 'port': 22, 'user': 'root', 'private_key': 'k', 'host_key': 'ssh-ed25519 AAAA'}


def props():
    files = program_monitoring.collector_files(lab_deployment())
    return {'connection': CONN, 'files': {p: c for p, (c, _) in files.items()},
            'modes': {p: m for p, (_, m) in files.items()}, 'timer': monitoring.CollectorProvider.TIMER_ON,
            'service_unit': monitoring.COLLECTOR_SERVICE, 'timer_unit': monitoring.COLLECTOR_TIMER,
            'textfile_dir': monitoring.TEXTFILE_DIR, 'script': monitoring.COLLECTOR_SCRIPT,
            'config': monitoring.COLLECTOR_CONFIG,
            'generated': [monitoring.COLLECTOR_TEXTFILE, monitoring.COLLECTOR_STATE],
            'dirs': ['/etc/gpuhost', '/var/lib/gpuhost']}


def test_resource_installs_once_then_changes_only_what_differs_and_removes_everything(monkeypatch):
    host = FakeHost({})
    monkeypatch.setattr(remote, 'run', host.run)
    monkeypatch.setattr(remote, 'put_file', host.put_file)
    p = monitoring.CollectorProvider()
    want = props()
    out = p.apply(want)
    names = [c[0] for c in host.calls]
    assert names.count('put_file') == 4 and names[-2:] == ['collector_enable.sh', 'collector_facts.sh']
    assert host.calls[names.index('collector_enable.sh')][1] == [monitoring.COLLECTOR_SERVICE,
                                                                  monitoring.COLLECTOR_TIMER, 'yes']
    assert ('ensure_dir.sh', ['/etc/gpuhost', '0755']) in host.calls
    assert ('put_file', [monitoring.COLLECTOR_SCRIPT, '0755', '-']) in host.calls
    assert not p.diff('id', out, want).changes, 'a second up changes nothing'
    host.calls.clear()
    p.apply(want)
    assert [c[0] for c in host.calls] == ['collector_facts.sh'], 'nothing to do: one read, nothing written'
    # Only the config differs (another interval): that file, no daemon-reload, one run to check it.
    d = parse(monitoring__collector_interval_s=60)
    host.calls.clear()
    changed = dict(want, files=dict(want['files'], **{
        monitoring.COLLECTOR_CONFIG: program_monitoring.collector_config(d)}))
    assert p.diff('id', out, changed).changes
    p.apply(changed)
    assert [c for c in host.calls if c[0] == 'put_file'] == [
        ('put_file', [monitoring.COLLECTOR_CONFIG, '0644', remote.sha256_hex(want['files'][monitoring.COLLECTOR_CONFIG])])]
    assert ('collector_enable.sh', [monitoring.COLLECTOR_SERVICE, monitoring.COLLECTOR_TIMER, 'no']) in host.calls
    # The timer disabled out of band: refresh shows it, up enables it again (and reloads).
    host.timer = ('disabled', 'inactive')
    seen = p.read('id', dict(out, connection=CONN)).outs
    assert seen['timer'] == {'enabled': 'disabled', 'active': 'inactive'}
    host.calls.clear()
    p.apply(changed)
    assert ('collector_enable.sh', [monitoring.COLLECTOR_SERVICE, monitoring.COLLECTOR_TIMER, 'yes']) in host.calls
    host.calls.clear()
    p.delete('id', want)
    assert host.calls == [('collector_remove.sh', [monitoring.COLLECTOR_SERVICE, monitoring.COLLECTOR_TIMER] +
                           sorted(want['files']) + want['generated'] + ['--'] + want['dirs'])]


def test_a_collector_that_cannot_run_fails_the_step_with_its_message(monkeypatch):
    host = FakeHost({}, enable_fails='gpuhost-collector: /etc/gpuhost/collector.json: cannot read it: '
                                     'Permission denied\ngpuhost: gpuhost-collector.service failed on h\n')
    monkeypatch.setattr(remote, 'run', host.run)
    monkeypatch.setattr(remote, 'put_file', host.put_file)
    with pytest.raises(monitoring.CollectorError) as e:
        monitoring.CollectorProvider().apply(props())
    assert 'Permission denied' in str(e.value) and 'gpuhost-collector --config /etc/gpuhost/collector.json' in \
        str(e.value)


def test_render_writes_the_collector_files():
    files = render_tool.files(lab_deployment())
    assert files['host/usr/local/sbin/gpuhost-collector'] == program_monitoring.collector_script()
    assert json.loads(files['host/etc/gpuhost/collector.json'])['interval_s'] == 30
    assert 'OnUnitActiveSec=30s' in files['host/etc/systemd/system/gpuhost-collector.timer']


def test_a_config_bump_never_meets_a_script_that_cannot_read_it(tmp_path, monkeypatch):
    """Issue 27, item 5: `up` writes the collector's script before its config, so a timer firing in between runs
    the new script on the old config - which it skips (exit 0, said why), never failing - and an older script
    never meets a newer config."""
    d = lab_deployment()
    files = program_monitoring.collector_files(d)
    props = {'connection': {}, 'files': {p: c for p, (c, _) in files.items()},
             'modes': {p: m for p, (_, m) in files.items()}, 'timer': monitoring.CollectorProvider.TIMER_ON,
             'service_unit': monitoring.COLLECTOR_SERVICE, 'timer_unit': monitoring.COLLECTOR_TIMER,
             'textfile_dir': monitoring.TEXTFILE_DIR, 'script': monitoring.COLLECTOR_SCRIPT,
             'config': monitoring.COLLECTOR_CONFIG}
    written = []
    provider = monitoring.CollectorProvider()
    old = {'files': {p: 'old ' + c for p, c in props['files'].items()}, 'timer': dict(props['timer'])}
    monkeypatch.setattr(provider, 'observe', lambda target, props: old)
    monkeypatch.setattr(remote.Target, 'from_inputs', classmethod(lambda cls, c: None))
    monkeypatch.setattr(remote, 'put_file', lambda target, p, *a, **k: written.append(p))
    monkeypatch.setattr(remote, 'run', lambda *a, **k: remote.Result('', '', 0))
    provider.apply(props)
    assert written.index(monitoring.COLLECTOR_SCRIPT) < written.index(monitoring.COLLECTOR_CONFIG), written
    # The new script on the config of the version before: the run is skipped, not failed.
    cfg = json.loads(program_monitoring.collector_config(d))
    cfg.update(version=collector.CONFIG_VERSION - 1, textfile=str(tmp_path / 'x.prom'), state=str(tmp_path / 's.json'))
    path = tmp_path / 'collector.json'
    path.write_text(json.dumps(cfg))
    assert collector.main(['--config', str(path)]) == 0
    assert not (tmp_path / 'x.prom').exists()
    # A config newer than the script is refused, as before (written by a newer program).
    cfg['version'] = collector.CONFIG_VERSION + 1
    path.write_text(json.dumps(cfg))
    assert collector.main(['--config', str(path)]) == collector.EXIT_CONFIG
