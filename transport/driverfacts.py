"""The host's NVIDIA kernel driver as loaded and as installed (hostscripts/driver_facts.sh's records; issue 59,
docs/driver-plan.md): what is read, never guessed - a host that does not show something gives None or '?'.

What holds the GPUs is read twice over where needed. On a Proxmox host the host's /proc shows every container's
processes too, each under the cgroup /lxc/<vmid>/... (`Process.vmid`). A container that is a machine of its own (the
lab's) is not seen from the host: hostscripts/ct_gpu_holders.sh runs the same scan inside it (`container_processes`).
The two views are merged by one rule (`DriverFacts.with_container`): when the host already shows any process under
/lxc/<vmid>/, the host's view of that container is the whole of it and the container's own scan - the same processes
under other PIDs - is not added; otherwise the container's processes are added, each marked with <vmid>."""

from __future__ import annotations

import dataclasses
import re
from typing import Dict, List, Optional, Tuple

# The modules that hold one another and the GPUs (NVIDIA's driver container unloads them in the reverse order).
MODULES = ('nvidia', 'nvidia_uvm', 'nvidia_modeset', 'nvidia_drm', 'nvidia_peermem')

# A container's cgroup as the host sees it: Proxmox's /lxc/<vmid>/ns/..., LXC's default /lxc.payload.<name>/...
# (/lxc.monitor/<vmid> is the host's monitor of the container, not one of its processes.)
_CT_CGROUP = re.compile(r'^/lxc(?:/|\.payload\.)(\d+)(?:/|$)')


def cgroup_vmid(cgroup: Optional[str]) -> Optional[int]:
    """The Proxmox container a host-side cgroup path puts a process in; None: the host's own (or unreadable)."""
    m = _CT_CGROUP.match(cgroup or '')
    return int(m.group(1)) if m else None


@dataclasses.dataclass(frozen=True)
class Process:
    """A process with /dev/nvidia* open: it holds the nvidia module (an unload fails while it runs)."""
    pid: int                      # as the side that read it sees it (the host's, or the container's own)
    comm: str
    cgroup: Optional[str]         # the unified hierarchy's path; None: unreadable
    devices: Tuple[str, ...]      # ('nvidia0', 'nvidiactl', 'nvidia-uvm', ...): /dev/ left off
    vmid: Optional[int] = None    # the container it runs in; None: the host itself


@dataclasses.dataclass(frozen=True)
class DkmsEntry:
    """One line of `dkms status -m nvidia`."""
    line: str                     # as dkms printed it
    module: Optional[str] = None
    version: Optional[str] = None
    kernel: Optional[str] = None  # None: not built for any kernel (state `added`)
    arch: Optional[str] = None
    state: Optional[str] = None   # added, built, installed, broken (None: a line of another shape)
    note: str = ''                # what followed the state: `(WARNING! Diff between built and installed module!)`


def parse_dkms(line: str) -> DkmsEntry:
    """`nvidia/580.95.05, 6.8.12-4-pve, x86_64: installed` (dkms 3), `nvidia, 580.95.05, 6.8.12-4-pve, x86_64:
    installed` (dkms 2), `nvidia/580.95.05: added`; a line of neither shape keeps only its text."""
    head, sep, tail = line.partition(': ')
    if not sep:
        head, sep, tail = line.rpartition(':')
        if not sep:
            return DkmsEntry(line=line)
    parts = [p.strip() for p in head.split(',')]
    if '/' in parts[0]:
        module, version = parts[0].split('/', 1)
        rest = parts[1:]
    elif len(parts) >= 2:
        module, version, rest = parts[0], parts[1], parts[2:]
    else:
        return DkmsEntry(line=line)
    state, _, note = tail.strip().partition(' ')
    return DkmsEntry(line=line, module=module or None, version=version or None,
                     kernel=rest[0] if rest else None, arch=rest[1] if len(rest) > 1 else None,
                     state=state or None, note=note.strip())


@dataclasses.dataclass
class DriverFacts:
    loaded: Optional[str] = None          # the loaded nvidia module's version; None: not loaded
    flavour_line: Optional[str] = None    # /proc/driver/nvidia/version's first line
    running: Optional[str] = None         # the running kernel
    # Each kernel of /lib/modules -> the nvidia module version installed for it: '' none, '?' unknown (no modinfo).
    kernels: Dict[str, str] = dataclasses.field(default_factory=dict)
    tree: bool = True                     # False: the host has no /lib/modules at all
    # Each nvidia module the host has loaded -> its reference count; None: /sys/module/<m>/refcnt not readable.
    refcnt: Dict[str, Optional[int]] = dataclasses.field(default_factory=dict)
    # Each loaded nvidia module -> the modules using it (/sys/module/<m>/holders/).
    holders: Dict[str, List[str]] = dataclasses.field(default_factory=dict)
    processes: List[Process] = dataclasses.field(default_factory=list)
    # The processes whose fds could not be read; None: no scan was made (an older script) - processes then unknown.
    unreadable: Optional[int] = None
    # nvidia-persistenced's unit: 'active', 'inactive', 'failed', ... or 'absent' (no such unit); None: unknown.
    persistenced: Optional[str] = None
    # dkms itself: True installed, False not installed (then dkms is []), None not read.
    dkms_tool: Optional[bool] = None
    dkms: Optional[List[DkmsEntry]] = None   # `dkms status -m nvidia`; None: unknown (not read, or dkms failed)
    # Each kernel of /lib/modules -> whether its headers are installed (DKMS builds for it only then).
    headers: Dict[str, bool] = dataclasses.field(default_factory=dict)
    # The program's upgrade job as it recorded itself on the host: (step, from, to); None: none recorded.
    upgrade: Optional[tuple] = None

    def upgrade_under_way(self, version: str) -> Optional[tuple]:
        """(step, from) of an upgrade to `version` the job has begun and not ended (a Ctrl-C, a drop, a reboot left
        it): what the next `up` follows, not a fresh install. None: none."""
        if self.upgrade and self.upgrade[2] == version and self.upgrade[0] not in ('done', 'restored'):
            return self.upgrade[0], (None if self.upgrade[1] in ('-', '') else self.upgrade[1])
        return None

    @property
    def flavour(self) -> Optional[str]:
        """'open' (NVIDIA's open kernel modules - Blackwell runs no other), 'proprietary', or None (not loaded)."""
        if not self.flavour_line:
            return None
        return 'open' if 'Open Kernel Module' in self.flavour_line else 'proprietary'

    def without_module(self) -> list:
        """The installed kernels with no nvidia module built for them: a boot into one has no GPU driver."""
        return sorted(k for k, v in self.kernels.items() if v == '')

    def without_headers(self) -> list:
        """The installed kernels whose headers are missing: DKMS cannot build the module for them."""
        return sorted(k for k, v in self.headers.items() if not v)

    @property
    def processes_known(self) -> bool:
        """The scan ran and read every process's fds: an empty `processes` then means none holds the GPUs."""
        return self.unreadable == 0

    def holders_other_than(self, vmid: Optional[int]) -> List[Process]:
        """The processes holding the GPUs that are not container vmid's: the host's own (nvidia-persistenced, a
        stray nvidia-smi) and other containers'. Only as complete as `processes_known` says."""
        return [p for p in self.processes if p.vmid is None or p.vmid != vmid]

    def in_use(self) -> Optional[bool]:
        """Whether the driver is held - an unload would fail: an nvidia module with a refcnt above 0 or a module
        holding it, or a process with /dev/nvidia* open (it holds the module, whatever could be read of its refcnt).
        False only when that is known: no nvidia module loaded (read by this script), or every loaded one's refcnt
        read as 0 (the kernel's own count: every open /dev/nvidia* is in it). None: not known - a refcnt the host does
        not show (the lent H100) with nothing seen holding, or an older script's output."""
        if any(n for n in self.refcnt.values() if n) or any(self.holders.values()) or self.processes:
            return True
        if not self.refcnt:
            # No module record: none loaded - if the script that printed this reads modules (its scan's record).
            return False if self.loaded is None and self.unreadable is not None else None
        return None if any(n is None for n in self.refcnt.values()) else False

    def with_container(self, vmid: int, processes: Optional[List[Process]]) -> 'DriverFacts':
        """These facts with container vmid's own scan (container_processes) merged in by the module's rule: added only
        when the host shows none of that container's processes (a Proxmox host shows them all itself)."""
        if processes is None or any(p.vmid == vmid for p in self.processes):
            return self
        return dataclasses.replace(self, processes=self.processes + [dataclasses.replace(p, vmid=vmid)
                                                                      for p in processes])


def _process(fields: List[str]) -> Optional[Process]:
    if len(fields) < 4 or not fields[0].strip().isdigit():
        return None
    cgroup = fields[2].strip()
    cgroup = None if cgroup in ('', '?') else cgroup
    return Process(pid=int(fields[0]), comm=fields[1].strip(), cgroup=cgroup,
                   devices=tuple(d for d in fields[3].strip().split(',') if d), vmid=cgroup_vmid(cgroup))


def parse(text: str) -> DriverFacts:
    """driver_facts.sh's output (pure; golden-tested)."""
    facts = DriverFacts()
    for line in text.splitlines():
        kind, _, rest = line.partition('\t')
        fields = rest.split('\t')
        if kind == 'loaded':
            facts.loaded = rest.strip() or None
        elif kind == 'flavour':
            facts.flavour_line = rest.strip() or None
        elif kind == 'running':
            facts.running = rest.strip() or None
        elif kind == 'kernel' and len(fields) >= 2 and fields[0]:
            facts.kernels[fields[0]] = '' if fields[1].strip() == '-' else fields[1].strip()
        elif kind == 'modules' and rest.strip() == 'absent':
            facts.tree = False
        elif kind == 'refcnt' and len(fields) >= 2 and fields[0]:
            n = fields[1].strip()
            facts.refcnt[fields[0]] = int(n) if n.isdigit() else None
        elif kind == 'holder' and len(fields) >= 2 and fields[0] and fields[1]:
            facts.holders.setdefault(fields[0], []).append(fields[1])
        elif kind == 'process':
            p = _process(fields)
            if p is not None:
                facts.processes.append(p)
        elif kind == 'unreadable' and rest.strip().isdigit():
            facts.unreadable = int(rest.strip())
        elif kind == 'upgrade' and len(fields) >= 3 and fields[0]:
            facts.upgrade = (fields[0].strip(), fields[1].strip(), fields[2].strip())
        elif kind == 'persistenced':
            state = rest.strip()
            facts.persistenced = None if state in ('', '?') else state
        elif kind == 'dkms':
            value = rest.strip()
            if value == 'absent':
                facts.dkms_tool, facts.dkms = False, []
            elif value == '?':
                facts.dkms_tool = True
            elif value == 'none':
                facts.dkms_tool, facts.dkms = True, facts.dkms or []
            elif value:
                facts.dkms_tool = True
                facts.dkms = (facts.dkms or []) + [parse_dkms(value)]
        elif kind == 'headers' and len(fields) >= 2 and fields[0] and fields[1].strip() in ('yes', 'no'):
            facts.headers[fields[0]] = fields[1].strip() == 'yes'
    return facts


def parse_container(text: str, vmid: int) -> Optional[List[Process]]:
    """ct_gpu_holders.sh's output: container vmid's processes holding /dev/nvidia* (PIDs as it sees them), each
    marked vmid. None: the container is absent or not running, or the scan did not finish (no `unreadable` record)."""
    if text.strip() == 'absent':
        return None
    facts = parse(text)
    if facts.unreadable is None:
        return None
    return [dataclasses.replace(p, vmid=vmid) for p in facts.processes]


def container_processes(target, vmid: int) -> Optional[List[Process]]:
    """Container vmid's processes holding the GPUs, read inside it (driver_facts.sh's scan through pct exec)."""
    from transport import remote
    res = remote.run(target, 'ct_gpu_holders.sh', [str(vmid)], stdin=remote.script('driver_facts.sh').encode())
    return parse_container(res.stdout, vmid)
