"""The host's state as the program decides from it: the facts (GPUs, running command line, live nvidia
parameters) and what follows from them - why the host must reboot to run its declared state, and each
reason's kind for monitoring (pure, stdlib only; imports nothing of ours but grammar/cmdline.py).

Two readers share it, so that they cannot disagree:
  * `pulumi up` / `refresh`: components/scripts/host_facts.sh over SSH, parsed by components/remote.py
    parse_facts(), decided by reboot_reasons() (components/host.py HostStatus);
  * the collector on the host (components/collector.py), every 30 s, which reads the same files itself
    and carries this module inside its script (components/monitoring.py collector_script()).
tests/unit/test_collector.py runs both readers on one simulated host and compares what they decide.
"""

import dataclasses
from typing import Optional

from grammar import cmdline


@dataclasses.dataclass
class Gpu:
    address: str
    id: str
    numa: int
    driver: Optional[str]
    override: Optional[str]
    group: Optional[int]
    group_type: Optional[str]
    minor: Optional[int] = None


@dataclasses.dataclass
class HostFacts:
    boot: str = 'grub'
    configured: str = ''          # the effective configured line (GRUB: LINUX + DEFAULT incl. grub.d)
    grub_linux: str = ''          # GRUB only: the two variables as /etc/default/grub alone sets them
    grub_default: str = ''
    running: str = ''
    gpus: dict = dataclasses.field(default_factory=dict)
    params: dict = dataclasses.field(default_factory=dict)
    overrides: dict = dataclasses.field(default_factory=dict)
    files: dict = dataclasses.field(default_factory=dict)
    pending: dict = dataclasses.field(default_factory=dict)   # path -> follow-up step never finished
    modprobe: list = dataclasses.field(default_factory=list)  # [(file, 'lineno:line')] about GPU modules
    nvidia_module: Optional[str] = None                        # /sys/module/nvidia/version (None: not loaded)
    pci: dict = dataclasses.field(default_factory=dict)       # address asked for -> remote.PciDevice or None
    # Prerequisites the program cannot install (read by host_facts.sh, checked by components/preflight.py):
    driverctl: Optional[str] = None                            # its path on root's PATH (None: not installed)
    iommu_groups: Optional[int] = None                         # entries of /sys/kernel/iommu_groups (0: IOMMU off)
    kvm_amd: dict = dataclasses.field(default_factory=dict)    # /sys/module/kvm_amd/parameters: sev, sev_snp -> Y/N
    devnodes: dict = dataclasses.field(default_factory=dict)   # /dev path asked for -> is a character device

    def running_args(self):
        return [w for w in cmdline.split(self.running) if not w.startswith(('BOOT_IMAGE=', 'initrd='))]


def reboot_reasons(facts: HostFacts, expect: dict) -> list:
    """Why the running host differs from its declared state (each a sentence for monitoring).

    expect: {'ensure_args', 'policy', 'domain', 'nvidia_params', 'vfio_devices', 'container_devices'}
    (components/host.py host_expect())."""
    reasons = []
    running = facts.running_args()
    missing = [a for a in expect['ensure_args'] if not cmdline.has(running, a)]
    if missing:
        reasons.append('kernel command line: running lacks %s' % ' '.join(missing))
    present = [w for w, _ in cmdline.dangers(running, expect['policy'])]
    if present:
        reasons.append('kernel command line: running still has %s' % ' '.join(present))
    for key, value in sorted(expect['nvidia_params'].items()):
        have = facts.params.get(key)
        if have is None:
            if facts.params:
                reasons.append('nvidia %s: not in /proc/driver/nvidia/params, declared %s' % (key, value))
        elif str(have) != str(value):
            reasons.append('nvidia NVreg_%s: running %s, declared %s' % (key, have, value))
    for bdf in expect['vfio_devices']:
        gpu = facts.gpus.get(bdf)
        if gpu and gpu.driver != 'vfio-pci':
            reasons.append('%s: bound to %s, declared vfio-pci' % (bdf, gpu.driver or 'no driver'))
    for bdf in expect['container_devices']:
        gpu = facts.gpus.get(bdf)
        if gpu and gpu.driver != 'nvidia':
            reasons.append('%s: bound to %s, declared nvidia (container)' % (bdf, gpu.driver or 'no driver'))
    domain = expect['domain']
    for gpu in sorted(facts.gpus.values(), key=lambda g: g.address):
        if gpu.group_type and gpu.group_type not in (domain, 'unmanaged', 'blocked') and gpu.driver != 'vfio-pci':
            reasons.append('IOMMU group %s (%s): type %s, declared %s' % (gpu.group, gpu.address, gpu.group_type,
                                                                          domain))
    return reasons


# Reboot reasons by kind, for a metric label (a bounded set, never the reason's text): the first matching
# test names it.
REASON_KINDS = (
    ('kernel_cmdline_missing', lambda r: r.startswith('kernel command line: running lacks')),
    ('kernel_cmdline_unwanted', lambda r: r.startswith('kernel command line: running still has')),
    ('nvidia_module_option', lambda r: r.startswith('nvidia ')),
    ('vm_gpu_binding', lambda r: r.endswith('declared vfio-pci')),
    ('container_gpu_binding', lambda r: r.endswith('declared nvidia (container)')),
    ('iommu_group_type', lambda r: r.startswith('IOMMU group')),
)
OTHER = 'other'


def reason_kind(reason: str) -> str:
    return next((kind for kind, test in REASON_KINDS if test(reason)), OTHER)


def reason_counts(reasons: list) -> list:
    """[(kind, count)] for every kind, in a fixed order (a kind without reasons counts 0)."""
    kinds = [reason_kind(r) for r in reasons]
    return [(kind, kinds.count(kind)) for kind in [k for k, _ in REASON_KINDS] + [OTHER]]


def assignment(bdf: str, expect: dict) -> str:
    """Where the config puts a GPU: container, vm, or host (neither guest)."""
    if bdf in expect['vfio_devices']:
        return 'vm'
    if bdf in expect['container_devices']:
        return 'container'
    return 'host'


def nvidia_bus_id(bdf: str) -> str:
    """0000:e1:00.0 -> 00000000:E1:00.0, the form nvidia-smi and DCGM print."""
    domain, rest = bdf.split(':', 1)
    return '%08X:%s' % (int(domain, 16), rest.upper())
