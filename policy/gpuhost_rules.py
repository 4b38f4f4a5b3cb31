"""The safety rules of the gpuhost policy pack, as pure functions over resource inputs.

Each rule looks at what a resource is about to write to the host - the gpuhost provider's resources' input
properties - never at the stack config, so it holds for a program that bypasses config/. Resources
are recognised by their inputs (any `gpuhost:index:...` type, or any `pulumi-python:dynamic/...` type: what
they were before the provider plugin, and what a program could write a host file with on its own):

  ensure_args                 KernelCmdline: parameters the kernel command line must carry
  path + content              HostFile / MetricsFile: a whole file on the host
  devices + container_devices VfioBinding: GPUs bound to vfio-pci (by address) / the container's
  kind lxc|qemu + config      ProxmoxGuest: the container (devN) or the VM (hostpciN, amd-sev)
  mappings + checks + node    PciMappings: the VM's GPUs as Proxmox PCI resource mappings (id -> address)
  unit + version              SglangUnit: the systemd unit's text (the truth: what is written)

Kernel command-line semantics come from grammar/cmdline.py (the kernel's own rules), the SGLang
flags from grammar/sglang_argparse.py (SGLang's own parser for the unit's version, so `--tp 4`,
`--host=::` and prefixes read as SGLang reads them), the unit text from grammar/systemd_unit.py (systemd
252's parser, checked against systemd-analyze). The project root must be on sys.path.

Rules that span resources (GPU on both sides, TP vs the container, hostpci vs the vfio binding, a
hostpci `mapping=` vs the mapping) use what this process saw earlier in the same run (`Registry`). A
dependency makes the engine analyze the resource depended on first, so "X was declared before Y" is "Y
depends on X": the VM must come after the vfio binding and its mappings, the mappings after the vfio
binding, the unit after its container; container and VM are compared whichever comes second.

Secrets: `api` and `connection` arrive as plain values; no message ever includes any part of them.
"""

from __future__ import annotations

import ipaddress
import os
import re
import threading

from grammar import cmdline, sglang_argparse, systemd_unit
from grammar.gpu import BLACKWELL_IDS
from grammar.sglang_flags import suggest_triple
from grammar.pve import CONFIGID_RE, split_props  # Proxmox's property strings and ids, shared with the program

# --------------------------------------------------------------------------- rule names

NO_IDENTITY = 'no-identity-iommu'
VFIO_BY_ADDRESS = 'vfio-by-address'
GPU_ONE_SIDE = 'gpu-one-side'
P2P_OFF = 'p2p-off'
SPECULATION = 'speculation-triple'
TP_GPUS = 'tp-equals-container-gpus'
ROOT_PAM = 'root-pam-password'
PRIVATE_BIND = 'sglang-private-bind'
BY_MAPPING = 'vm-gpus-by-mapping'
RULES = (NO_IDENTITY, VFIO_BY_ADDRESS, GPU_ONE_SIDE, P2P_OFF, SPECULATION, TP_GPUS, ROOT_PAM, PRIVATE_BIND, BY_MAPPING)

DESCRIPTIONS = {
    NO_IDENTITY: 'No identity (passthrough) IOMMU in any spelling on a host with Blackwell GPUs: it bricks them '
                 'until a power cycle (FSP error 0x177) and disables SEV-SNP.',
    VFIO_BY_ADDRESS: 'The VM\'s GPUs are bound to vfio-pci by PCI address (never vfio-pci.ids / pci-stub.ids: all '
                     'eight GPUs share one ID), before the VM, and are not the container\'s.',
    GPU_ONE_SIDE: 'No GPU in both the container (devN, its GPU list) and the VM (hostpciN, or a PCI resource '
                  'mapping\'s entry).',
    P2P_OFF: 'NVreg_DmaRemapPeerMmio=1 in the nvidia options file, and NCCL_P2P_DISABLE=1 in the SGLang unit '
             '(no GPU P2P under a translating IOMMU).',
    SPECULATION: 'The speculation flags in the unit are complete and consistent: --speculative-num-steps, '
                 '--speculative-eagle-topk and --speculative-num-draft-tokens all or none; topk 1 needs '
                 'draft = steps + 1.',
    TP_GPUS: 'The unit\'s --tp-size equals the number of GPUs (/dev/nvidiaN devN entries) of its container.',
    ROOT_PAM: 'A guest with devN, hostpciN, amd-sev or affinity is configured by root@pam with a password, '
              'never an API token (Proxmox refuses these keys to anyone else).',
    PRIVATE_BIND: 'SGLang listens on a private address (RFC 1918, loopback, link-local, IPv6 ULA) unless the '
                  'stack\'s policy config opts in with allow_public_bind: true.',
    BY_MAPPING: 'In a stack that gives the VM its GPUs through PCI resource mappings, no VM GPU by raw address '
                '(Proxmox starts a raw address with whatever device sits there); every mapping= a VM names is one '
                'the run declares, and every mapping id is a Proxmox mapping id.',
}

JUDGED_PREFIXES = ('gpuhost:index:', 'pulumi-python:dynamic/')
BOOT_FILES = ('/etc/kernel/cmdline', '/etc/default/grub')
GRUB_DIR = '/etc/default/grub.d/'
MODPROBE_DIR = '/etc/modprobe.d/'
ROOT_ONLY_KEYS = re.compile(r'^(dev\d+|hostpci\d+|amd-sev|affinity)$')
# The keys above that the `root-pam-password` rule lets pass: a hostpciN through a resource mapping needs
# Mapping.Use on /mapping/pci/<id> (and VM.Config.HWType), not root@pam.

FSP = 'bricks RTX PRO 6000 Blackwell GPUs until a power cycle (FSP error 0x177) and disables SEV-SNP'
TRANSLATED_FIX = ('keep the IOMMU translated: gpuhost:iommu.domain: DMA-FQ (the default: iommu.passthrough=0 '
                  'iommu.strict=0)')


class Unknown(Exception):
    """A value the rule needs is not known yet (preview): the rule is judged at `up`."""

    def __init__(self, path):
        super().__init__('.'.join(str(p) for p in path))
        self.path = list(path)


class UNKNOWN_VALUE(object):
    """Marks a value Pulumi does not know yet (it depends on another resource's outputs)."""

    def __repr__(self):
        return '<unknown>'


UNKNOWN = UNKNOWN_VALUE()


def need(value, *path):
    if value is UNKNOWN:
        raise Unknown(path)
    return value


def show(value, limit=120) -> str:
    """A value for a message: repr-quoted, control characters escaped, cut to `limit`."""
    text = value if isinstance(value, str) else repr(value)
    text = text.encode('unicode_escape').decode('ascii')
    return repr(text[:limit] + ('...' if len(text) > limit else '')) if isinstance(value, str) else text[:limit]


# --------------------------------------------------------------------------- resources

class Res(object):
    """One resource as the rules see it: type, name, urn and its inputs as plain Python values
    (numbers as Pulumi sends them, floats; values not known yet as UNKNOWN)."""

    def __init__(self, type_, name, urn, props):
        self.type, self.name, self.urn, self.props = type_, name, urn, props or {}

    def get(self, key, default=None):
        return self.props.get(key, default)

    @property
    def kind(self) -> str:
        """What it writes: cmdline, file, vfio, lxc, qemu, unit - or '' (nothing these rules judge)."""
        if not self.type.startswith(JUDGED_PREFIXES):
            return ''
        p = self.props
        if 'ensure_args' in p:
            return 'cmdline'
        if 'mappings' in p and 'checks' in p and 'node' in p:
            return 'pcimap'
        if 'devices' in p and 'container_devices' in p:
            return 'vfio'
        if p.get('kind') in ('lxc', 'qemu') and 'config' in p:
            return p['kind']
        if 'unit' in p and 'version' in p:
            return 'unit'
        if 'path' in p and 'content' in p:
            return 'file'
        return ''


def as_int(value):
    """Pulumi numbers arrive as floats; 200.0 -> 200, anything else unchanged."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# --------------------------------------------------------------------------- PCI addresses

FULL_BDF = re.compile(r'^([0-9a-f]{4}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$')
ANY_BDF = re.compile(r'^(?:([0-9a-fA-F]{4}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.([0-7]))?$')
PCI_ID = re.compile(r'^[0-9a-fA-F]{4}:[0-9a-fA-F]{4}$')


def bdf(text):
    """(domain, bus, device, function or None) of a PCI address in any form Proxmox accepts
    (0000:81:00.0, 81:00.0, 81:00 = every function), or None."""
    m = ANY_BDF.match(text.strip()) if isinstance(text, str) else None
    if not m:
        return None
    dom, bus, dev, fn = m.groups()
    return ((dom or '0000').lower(), bus.lower(), dev.lower(), fn)


def same_gpu(a, b) -> bool:
    return a[:3] == b[:3] and (a[3] is None or b[3] is None or a[3] == b[3])


def fmt_bdf(a) -> str:
    return '%s:%s:%s%s' % (a[0], a[1], a[2], '.' + a[3] if a[3] is not None else '')


def map_path(text) -> tuple:
    """(node, [address texts]) of one entry of a resource mapping's map: 'node=n,path=a;b,id=...'."""
    _, props = split_props(text)
    return props.get('node'), [p for p in (props.get('path') or '').split(';') if p]


def hostpci_hosts(value) -> tuple:
    """([host address texts], mapping or None) of a hostpciN value."""
    first, props = split_props(value)
    host = first if first is not None else props.get('host')
    hosts = [h for h in (host or '').split(';') if h]
    return hosts, props.get('mapping')


def dev_path(value):
    first, props = split_props(value)
    return first if first is not None else props.get('path')


# --------------------------------------------------------------------------- what a run declared

class Registry(object):
    """What the resources analyzed so far in this run declared, for the rules across resources.
    Keyed by URN (analyzing a resource twice replaces its entry)."""

    def __init__(self):
        self.lock = threading.RLock()
        self.vfio = {}   # urn -> {'name', 'devices': [bdf], 'container_devices': [bdf]}
        self.lxc = {}    # urn -> {'name', 'vmid', 'gpus': [bdf], 'nvidia_nodes': [path]}
        self.qemu = {}   # urn -> {'name', 'vmid', 'hostpci': [(key, bdf)]}
        self.pcimap = {}  # urn -> {'name', 'node', 'mappings': {id: [bdf]}}

    def record(self, res: Res):
        kind = res.kind
        scope = scope_of(res)
        with self.lock:
            if kind == 'vfio':
                devs = [bdf(d) for d in _list(res.get('devices')) if isinstance(d, str) and bdf(d)]
                cdevs = [bdf(d) for d in _list(res.get('container_devices')) if isinstance(d, str) and bdf(d)]
                self.vfio[res.urn] = {'name': res.name, 'devices': devs, 'container_devices': cdevs, 'scope': scope}
            elif kind == 'lxc':
                self.lxc[res.urn] = {'name': res.name, 'vmid': as_int(res.get('vmid')),
                                     'gpus': lxc_gpus(res), 'nvidia_nodes': nvidia_nodes(res), 'scope': scope}
            elif kind == 'qemu':
                self.qemu[res.urn] = {'name': res.name, 'vmid': as_int(res.get('vmid')),
                                      'hostpci': [(k, a) for k, a, _ in qemu_hostpci(res) if a], 'scope': scope}
            elif kind == 'pcimap':
                self.pcimap[res.urn] = {'name': res.name, 'node': res.get('node'), 'scope': scope,
                                        'mappings': {mid: [a for a, _ in paths if a]
                                                     for mid, paths in pcimap_paths(res).items()}}

    def on_host(self, table: dict, res: 'Res') -> dict:
        """The entries of `table` declared for the same host as res (a fleet stack holds several hosts,
        and PCI addresses or vmids repeat between them)."""
        scope = scope_of(res)
        return {u: v for u, v in table.items() if v.get('scope') == scope}


def scope_of(res: 'Res'):
    """Which host of a fleet a resource belongs to: its `fleet_host` input (the program sets it on the
    vfio binding, the guests and the unit of every host of a fleet). None in a one-host stack."""
    value = res.get('fleet_host')
    if isinstance(value, str):
        return value
    return None


def _list(value):
    return value if isinstance(value, list) else []


def _dict(value):
    return value if isinstance(value, dict) else {}


def lxc_gpus(res: Res) -> list:
    return [bdf(k) for k in _dict(res.get('gpu_devices')) if bdf(k)]


def guest_config(res: Res) -> dict:
    return _dict(need(res.get('config'), 'config'))


def nvidia_nodes(res: Res) -> list:
    """The distinct /dev/nvidiaN paths of an LXC's devN entries (one per GPU)."""
    out = []
    for key, value in sorted(guest_config(res).items()):
        if re.match(r'^dev\d+$', key):
            path = dev_path(need(value, 'config', key))
            if path and re.match(r'^/dev/nvidia\d+$', path) and path not in out:
                out.append(path)
    return out


def qemu_mappings(res: Res) -> list:
    """[(key, mapping id)] of the hostpciN entries that pass a device through a resource mapping."""
    out = []
    for key, value in sorted(guest_config(res).items()):
        if re.match(r'^hostpci\d+$', key):
            hosts, mapping = hostpci_hosts(need(value, 'config', key))
            if mapping is not None and not hosts:
                out.append((key, mapping))
    return out


def pcimap_paths(res: Res) -> dict:
    """{mapping id: [(bdf or None, address text)]} of a PciMappings resource's declared entries."""
    out = {}
    for mid, spec in sorted(_dict(need(res.get('mappings'), 'mappings')).items()):
        spec = need(spec, 'mappings', mid)
        path = need(_dict(spec).get('path'), 'mappings', mid, 'path')
        out[mid] = [(bdf(p), p) for p in (path.split(';') if isinstance(path, str) else [show(path)])]
    return out


def qemu_hostpci(res: Res) -> list:
    """[(key, bdf or None, problem or None)] for each host device of each hostpciN entry by address (entries
    through a resource mapping: qemu_mappings)."""
    out = []
    for key, value in sorted(guest_config(res).items()):
        if not re.match(r'^hostpci\d+$', key):
            continue
        value = need(value, 'config', key)
        hosts, mapping = hostpci_hosts(value)
        if mapping is not None and not hosts:
            continue
        if not hosts:
            out.append((key, None, 'has no host PCI address'))
        for h in hosts:
            a = bdf(h)
            if a:
                out.append((key, a, None))
            elif PCI_ID.match(h):
                out.append((key, None, '%s is a vendor:device ID, not a PCI address' % h))
            else:
                out.append((key, None, '%s is not a PCI address' % show(h)))
    return out


# --------------------------------------------------------------------------- host files

def is_boot_file(path: str) -> bool:
    return path in BOOT_FILES or (path.startswith(GRUB_DIR) and path.endswith('.cfg'))


def boot_words(path: str, content: str) -> list:
    """The kernel parameters a boot configuration file carries: /etc/kernel/cmdline is one line;
    a GRUB file's GRUB_CMDLINE_LINUX* assignments (shell quoting approximated: quotes dropped)."""
    if path == '/etc/kernel/cmdline':
        return cmdline.split(' '.join(content.splitlines()))
    words = []
    for line in content.splitlines():
        m = re.match(r'^\s*(?:export\s+)?GRUB_CMDLINE_LINUX\w*=(.*)$', line)
        if m:
            value = m.group(1).strip()
            words += [w for w in re.split(r'\s+', value.replace('"', ' ').replace("'", ' ')) if w]
    return words


def modprobe_options(content: str) -> list:
    """[(module as the kernel names it, [param words])] of the `options` lines of a modprobe.d file
    (a trailing backslash continues a line; '#' starts a comment)."""
    out, buf = [], ''
    for line in content.splitlines():
        if line.endswith('\\'):
            buf += line[:-1] + ' '
            continue
        line, buf = buf + line, ''
        line = line.split('#', 1)[0]
        words = line.split()
        if len(words) >= 2 and words[0] == 'options':
            out.append((cmdline.norm(words[1]), words[2:]))
    return out


# --------------------------------------------------------------------------- the unit

class UnitFlags(object):
    """The SGLang launch flags and environment a unit's text runs with (or why they can't be read)."""

    def __init__(self, ns=None, given=(), env=None, unset=(), problem=None):
        # env None: the unit could not be read at all (its Environment= lines are unknown too).
        self.ns, self.given, self.env, self.unset, self.problem = ns or {}, list(given), env, set(unset), problem

    def set(self, dest) -> bool:
        return dest in [d for _, d in self.given]

    def token(self, dest):
        return next((t for t, d in self.given if d == dest), '--' + dest.replace('_', '-'))


_unit_cache = {}
_unit_lock = threading.Lock()


def unit_flags(res: Res) -> UnitFlags:
    text = need(res.get('unit'), 'unit')
    version = need(res.get('version'), 'version')
    name = res.get('unit_name')
    name = name if isinstance(name, str) and name.endswith('.service') else 'sglang.service'
    key = (text, version, name)
    with _unit_lock:
        if key not in _unit_cache:
            _unit_cache.clear()
            _unit_cache[key] = _read_unit(text, version, name)
        return _unit_cache[key]


def _read_unit(text, version, name) -> UnitFlags:
    try:
        u = systemd_unit.parse_unit(text, name)
    except systemd_unit.UnitError as e:
        return UnitFlags(problem='systemd would not load the unit: %s' % e)
    except Exception as e:  # noqa: BLE001 - whatever the text holds, the finding is "cannot read"
        return UnitFlags(problem='the unit cannot be parsed (%s)' % type(e).__name__)
    env = u.env_dict()
    unset = set()
    for s, k, v, _ in u.assignments:
        if s == 'Service' and k == 'UnsetEnvironment':
            unset.update(w.split('=', 1)[0] for w in v.split())
    if len(u.exec_start) != 1:
        return UnitFlags(env=env, unset=unset,
                         problem='the unit has %d ExecStart= commands, not one' % len(u.exec_start))
    cmd = u.exec_start[0]
    argv = systemd_unit.command_argv(cmd, env)
    if len(argv) < 3 or not re.match(r'^python[0-9.]*$', os.path.basename(cmd.path)) \
            or argv[1:3] != ['-m', 'sglang.launch_server']:
        return UnitFlags(env=env, unset=unset, problem='ExecStart= does not run `<venv>/bin/python -m '
                         'sglang.launch_server`: %s' % show(' '.join(argv), 160))
    try:
        ns, given = sglang_argparse.parse(version, argv[3:])
    except sglang_argparse.FlagError as e:
        return UnitFlags(env=env, unset=unset, problem='SGLang %s would refuse the launch flags: %s' % (version, e))
    except ValueError as e:
        return UnitFlags(env=env, unset=unset, problem=str(e))
    ns = sglang_argparse.fields(version, ns)
    given = [(t, sglang_argparse.field(version, d)) for t, d in given]
    return UnitFlags(ns, given, env, unset)


def unit_problem(res: Res, flags: UnitFlags, what: str) -> list:
    return ['%s: %s cannot be checked: %s. Fix: render the unit with resources/sglang.py (ExecStart= '
            '<venv>/bin/python -m sglang.launch_server with flags SGLang %s accepts)' % (
                res.name, what, flags.problem, show(res.get('version')))]


# --------------------------------------------------------------------------- rule 1

def is_identity(word: str) -> bool:
    return cmdline.iommu_mode([word]) == 'identity' or cmdline.danger(word, {}) == cmdline.IDENTITY_WHY


def blackwell_host(res: Res) -> tuple:
    """(True, ids) unless the resource's GPU inventory is given and holds no Blackwell GPU (no
    inventory: assume the host this program manages, which has them)."""
    inv = res.get('inventory')
    ids = set(BLACKWELL_IDS) | {i for i in _list(res.get('blackwell_ids')) if isinstance(i, str)}
    if not isinstance(inv, list) or not inv:
        return True, sorted(BLACKWELL_IDS)
    found = sorted({g.get('id') for g in inv if isinstance(g, dict) and g.get('id') in ids})
    policy = res.get('policy')
    if isinstance(policy, dict) and policy.get('blackwell') is True:
        return True, found or sorted(BLACKWELL_IDS)
    return bool(found), found


def no_identity_iommu(res: Res, reg: Registry, cfg: dict) -> list:
    kind = res.kind
    if kind == 'cmdline':
        words = []
        for i, a in enumerate(_list(need(res.get('ensure_args'), 'ensure_args'))):
            a = need(a, 'ensure_args', i)
            words += [(i, w) for w in cmdline.split(a if isinstance(a, str) else '')]
        where = 'ensure_args puts %s on the kernel command line'
    elif kind == 'file' and isinstance(res.get('path'), str) and is_boot_file(res.get('path')):
        content = need(res.get('content'), 'content')
        words = [(None, w) for w in boot_words(res.get('path'), content if isinstance(content, str) else '')]
        where = 'writes %%s into %s' % res.get('path')
    else:
        return []
    blackwell, ids = blackwell_host(res)
    if not blackwell:
        return []
    out = [('%s: %s - the kernel reads it as identity (passthrough) IOMMU domains, which %s (host GPUs %s). Fix: '
            'remove it and %s' % (res.name, where % show(w), FSP, ', '.join(ids), TRANSLATED_FIX))
           for _, w in words if is_identity(w)]
    if not out and cmdline.iommu_mode([w for _, w in words]) == 'identity':
        out.append('%s: %s - together they select identity (passthrough) IOMMU domains, which %s. Fix: %s' % (
            res.name, where % show(' '.join(w for _, w in words)), FSP, TRANSLATED_FIX))
    return out


# --------------------------------------------------------------------------- rule 2

BY_ID_WHY = 'binds GPUs by vendor:device ID, and all eight GPUs share one ID, so it takes the container\'s GPUs too'
BY_ADDRESS_FIX = ('bind the VM\'s GPUs by PCI address: gpuhost:vm.gpus lists addresses, which the host\'s vfio step '
                  '(driverctl set-override <address> vfio-pci) binds one by one')


def vfio_by_address(res: Res, reg: Registry, cfg: dict) -> list:
    kind = res.kind
    out = []
    if kind == 'cmdline' or (kind == 'file' and isinstance(res.get('path'), str) and is_boot_file(res.get('path'))):
        if kind == 'cmdline':
            args = [need(a, 'ensure_args', i) for i, a in enumerate(_list(need(res.get('ensure_args'), 'ensure_args')))]
            words = [w for a in args if isinstance(a, str) for w in cmdline.split(a)]
            where = 'ensure_args puts %s on the kernel command line'
        else:
            words = boot_words(res.get('path'), need(res.get('content'), 'content') or '')
            where = 'writes %%s into %s' % res.get('path')
        for w in words:
            if cmdline.norm(cmdline.param(w)[0]) in ('vfio_pci.ids', 'pci_stub.ids'):
                out.append('%s: %s - it %s. Fix: remove it; %s' % (
                    res.name, where % show(w), BY_ID_WHY, BY_ADDRESS_FIX))
    elif kind == 'file' and isinstance(res.get('path'), str) and res.get('path').startswith(MODPROBE_DIR):
        content = need(res.get('content'), 'content')
        for module, params in modprobe_options(content if isinstance(content, str) else ''):
            if module in ('vfio_pci', 'pci_stub') and any(p.startswith('ids=') for p in params):
                out.append('%s: writes "options %s %s" into %s - it %s. Fix: remove the ids= option; %s' % (
                    res.name, module.replace('_', '-'), ' '.join(params), res.get('path'), BY_ID_WHY, BY_ADDRESS_FIX))
    elif kind == 'vfio':
        devices = _list(need(res.get('devices'), 'devices'))
        container = [bdf(d) for d in _list(need(res.get('container_devices'), 'container_devices'))
                     if isinstance(d, str) and bdf(d)]
        for i, d in enumerate(devices):
            d = need(d, 'devices', i)
            if not isinstance(d, str) or not FULL_BDF.match(d):
                what = 'a vendor:device ID' if isinstance(d, str) and PCI_ID.match(d) else 'not a full PCI address'
                out.append('%s: devices[%d] is %s, %s; vfio-pci must bind each VM GPU by its address (0000:81:00.0, '
                           'lowercase, with domain and function). Fix: list the VM\'s GPU addresses in gpuhost:vm.gpus'
                           % (res.name, i, show(d), what))
                continue
            taken = [c for c in container if same_gpu(c, bdf(d))]
            if taken:
                out.append('%s: devices[%d] %s is one of the container\'s GPUs (container_devices): binding it to '
                           'vfio-pci takes it from the container. Fix: give it to one side only - remove it from '
                           'gpuhost:vm.gpus or from gpuhost:container.gpus' % (res.name, i, d))
    elif kind == 'pcimap':
        with reg.lock:
            bound = [a for v in reg.on_host(reg.vfio, res).values() for a in v['devices']]
            binders = [v['name'] for v in reg.on_host(reg.vfio, res).values()]
        for mid, paths in pcimap_paths(res).items():
            for a, text in paths:
                if a is None:
                    out.append('%s: mapping %s has the path %s, which is not a PCI address; the VM\'s GPUs are mapped '
                               'and bound by address. Fix: one address from gpuhost:vm.gpus per mapping' % (
                                   res.name, mid, show(text)))
                elif not any(same_gpu(b, a) for b in bound):
                    out.append('%s: mapping %s points at %s, which %s binds to vfio-pci by address before the VM - '
                               'Proxmox would then bind it at VM start by vendor:device ID (new_id), which can grab a '
                               'container GPU with the same ID. Fix: list %s in gpuhost:vm.gpus (the host\'s vfio '
                               'step binds it) and let the mappings depend on the host' % (
                                   res.name, mid, fmt_bdf(a), 'no VfioBinding declared' if not binders else
                                   'no VfioBinding (%s)' % ', '.join(binders), fmt_bdf(a)))
    elif kind == 'qemu':
        with reg.lock:
            bound = [a for v in reg.on_host(reg.vfio, res).values() for a in v['devices']]
            binders = [v['name'] for v in reg.on_host(reg.vfio, res).values()]
        for key, a, problem in qemu_hostpci(res):
            if problem:
                out.append('%s: %s %s; the VM\'s GPUs are passed and bound by PCI address. Fix: write %s: '
                           '0000:XX:00.0,pcie=1 with an address from gpuhost:vm.gpus' % (res.name, key, problem, key))
            elif not any(same_gpu(b, a) for b in bound):
                out.append('%s: %s passes %s, which %s binds to vfio-pci by address before this VM - Proxmox '
                           'would then bind it at VM start by vendor:device ID (new_id), which can grab a container '
                           'GPU with the same ID. Fix: list %s in gpuhost:vm.gpus (the host\'s vfio step binds it) '
                           'and let the VM depend on the host' % (
                               res.name, key, fmt_bdf(a), 'no VfioBinding declared' if not binders else
                               'no VfioBinding (%s)' % ', '.join(binders), fmt_bdf(a)))
    return out


# --------------------------------------------------------------------------- rule 3

ONE_SIDE_FIX = 'a GPU goes to one side only: remove it from gpuhost:vm.gpus or from gpuhost:container.gpus'


def gpu_one_side(res: Res, reg: Registry, cfg: dict) -> list:
    kind = res.kind
    out = []
    if kind == 'qemu':
        guard = [bdf(g) for g in _list(res.get('guard_gpus')) if isinstance(g, str) and bdf(g)]
        with reg.lock:
            lxcs = [(v['name'], v['gpus']) for u, v in reg.on_host(reg.lxc, res).items() if u != res.urn]
            cdevs = [(v['name'], v['container_devices']) for v in reg.on_host(reg.vfio, res).values()]
        sources = [('its guard_gpus (the container\'s GPUs)', guard)] + \
                  [('container %s' % n, g) for n, g in lxcs] + \
                  [('the container_devices of %s' % n, g) for n, g in cdevs]
        for key, a, _ in qemu_hostpci(res):
            if not a:
                continue
            hits = [what for what, gpus in sources if any(same_gpu(g, a) for g in gpus)]
            if hits:
                out.append('%s: %s passes %s to the VM, but it is a container GPU (%s). Fix: %s' % (
                    res.name, key, fmt_bdf(a), '; '.join(hits), ONE_SIDE_FIX))
    elif kind == 'pcimap':
        guard = [bdf(g) for g in _list(_dict(res.get('guard')).get('gpus')) if isinstance(g, str) and bdf(g)]
        with reg.lock:
            lxcs = [(v['name'], v['gpus']) for v in reg.on_host(reg.lxc, res).values()]
            cdevs = [(v['name'], v['container_devices']) for v in reg.on_host(reg.vfio, res).values()]
        sources = [('its guard (the container\'s GPUs)', guard)] + [('container %s' % n, g) for n, g in lxcs] + \
                  [('the container_devices of %s' % n, g) for n, g in cdevs]
        node = res.get('node')
        for mid, paths in pcimap_paths(res).items():
            for a, _ in paths:
                hits = [what for what, gpus in sources if a and any(same_gpu(g, a) for g in gpus)]
                if hits:
                    out.append('%s: mapping %s points its entry for node %s at %s, a container GPU (%s): a VM started '
                               'with it takes the GPU from the container. Fix: %s' % (
                                   res.name, mid, node if isinstance(node, str) else '?', fmt_bdf(a),
                                   '; '.join(hits), ONE_SIDE_FIX))
    elif kind == 'lxc':
        gpus = lxc_gpus(res)
        with reg.lock:
            vms = [('VM %s as %s' % (v['name'], key), b) for u, v in reg.on_host(reg.qemu, res).items() if u != res.urn
                   for key, b in v['hostpci']]
            vms += [('the VM through mapping %s (%s)' % (mid, v['name']), b)
                    for v in reg.on_host(reg.pcimap, res).values()
                    for mid, addrs in v['mappings'].items() for b in addrs]
        for a in gpus:
            for how, b in vms:
                if same_gpu(a, b):
                    out.append('%s: container GPU %s is also passed to %s. Fix: %s' % (
                        res.name, fmt_bdf(a), how, ONE_SIDE_FIX))
        for key, value in sorted(guest_config(res).items()):
            if re.match(r'^dev\d+$', key):
                path = dev_path(need(value, 'config', key))
                if path and (path == '/dev/vfio/vfio' or re.match(r'^/dev/vfio/', path)):
                    out.append('%s: %s passes %s into the container - a vfio group is a VM GPU. Fix: remove %s; the '
                               'container gets its GPUs as /dev/nvidiaN' % (res.name, key, path, key))
    return out


# --------------------------------------------------------------------------- rule 4

def p2p_off(res: Res, reg: Registry, cfg: dict) -> list:
    kind = res.kind
    if kind == 'file':
        path = res.get('path')
        if not isinstance(path, str) or not path.startswith(MODPROBE_DIR):
            return []
        content = need(res.get('content'), 'content')
        opts = modprobe_options(content if isinstance(content, str) else '')
        nvidia = [p for m, ps in opts if m == 'nvidia' for p in ps]
        if not nvidia and 'nvidia' not in os.path.basename(path):
            return []
        values = [p.split('=', 1)[1] for p in nvidia if p.split('=', 1)[0] == 'NVreg_DmaRemapPeerMmio' and '=' in p]
        fix = 'Fix: write "options nvidia NVreg_DmaRemapPeerMmio=1" (gpuhost:nvidia.dma_remap_peer_mmio: 1)'
        if not values:
            if 'nvidia' in os.path.basename(path):
                return ['%s: the nvidia options file %s does not set NVreg_DmaRemapPeerMmio; it must say 1 explicitly '
                        '(visible and diffable). %s' % (res.name, path, fix)]
            return []
        last = values[-1]  # the kernel takes the last value of a repeated module parameter
        try:
            ok = int(last, 0) == 1
        except ValueError:
            ok = False
        if not ok:
            return ['%s: %s sets NVreg_DmaRemapPeerMmio=%s; this host runs the nvidia driver with 1. %s' % (
                res.name, path, show(last), fix)]
        return []
    if kind == 'unit':
        flags = unit_flags(res)
        if flags.env is None:
            return unit_problem(res, flags, 'NCCL_P2P_DISABLE')
        value = flags.env.get('NCCL_P2P_DISABLE')
        if 'NCCL_P2P_DISABLE' in flags.unset:
            value = None
        if value != '1':
            return ['%s: the unit %s; GPU peer-to-peer DMA does not work under the translating IOMMU, so NCCL must '
                    'not try it. Fix: Environment="NCCL_P2P_DISABLE=1" in the unit (resources/sglang.py renders it; '
                    'do not override it in gpuhost:sglang.environment)' % (
                        res.name, 'does not set NCCL_P2P_DISABLE' if value is None and
                        'NCCL_P2P_DISABLE' not in flags.unset else 'unsets NCCL_P2P_DISABLE' if value is None
                        else 'sets NCCL_P2P_DISABLE=%s' % show(value))]
    return []


# --------------------------------------------------------------------------- rule 5

TRIPLE = ('speculative_num_steps', 'speculative_eagle_topk', 'speculative_num_draft_tokens')


def speculation_triple(res: Res, reg: Registry, cfg: dict) -> list:
    if res.kind != 'unit':
        return []
    flags = unit_flags(res)
    if flags.problem:
        return unit_problem(res, flags, 'the speculation flags')
    given = [d for d in TRIPLE if flags.set(d)]
    if not given:
        return []
    steps, topk, draft = (flags.ns.get(d) for d in TRIPLE)
    if len(given) != 3:
        missing = ['--' + d.replace('_', '-') for d in TRIPLE if d not in given]
        return ['%s: the unit sets %s but not %s; SGLang then picks the rest itself and the speculation differs '
                'from what was declared. Fix: set all three or none - from these numbers: %s' % (
                    res.name, ', '.join('%s %s' % (flags.token(d), flags.ns.get(d)) for d in given),
                    ', '.join(missing), suggest_triple(steps, topk, draft))]
    if topk == 1 and draft != steps + 1:
        return ['%s: --speculative-eagle-topk 1 with --speculative-num-steps %s needs --speculative-num-draft-tokens '
                '%s (steps + 1; SGLang forces it), the unit says %s. Fix: gpuhost:sglang.speculative.num_draft_tokens: '
                '%s' % (res.name, steps, steps + 1, draft, steps + 1)]
    return []


# --------------------------------------------------------------------------- rule 6

def tp_equals_container_gpus(res: Res, reg: Registry, cfg: dict) -> list:
    kind = res.kind
    if kind == 'unit':
        flags = unit_flags(res)
        if flags.problem:
            return unit_problem(res, flags, '--tp-size')
        tp = flags.ns.get('tp_size')
        vmid = as_int(need(res.get('vmid'), 'vmid'))
        with reg.lock:
            cts = [v for v in reg.on_host(reg.lxc, res).values() if v['vmid'] == vmid]
        if not cts:
            return ['%s: the unit runs in container %s, but no container with that vmid was declared before it, so '
                    '--tp-size %s cannot be checked against its GPUs. Fix: the unit must depend on its container '
                    '(SglangService(..., container))' % (res.name, vmid, tp)]
        return [_tp_mismatch(res.name, tp, flags.token('tp_size'), c) for c in cts if len(c['nvidia_nodes']) != tp]
    return []


def _tp_mismatch(name, tp, token, ct):
    n = len(ct['nvidia_nodes'])
    return ('%s: %s %s, but container %s (%s) has %d GPU%s (%s). Tensor parallelism must use every container GPU. '
            'Fix: %s' % (name, token, tp, ct['vmid'], ct['name'], n, '' if n == 1 else 's',
                         ', '.join(ct['nvidia_nodes']) or 'no /dev/nvidiaN devN entry',
                         'gpuhost:sglang.tp: %d, or change gpuhost:container.gpus' % n if n else
                         'give the container its GPUs (gpuhost:container.gpus: one devN /dev/nvidiaN entry each)'))


# --------------------------------------------------------------------------- rule 7

def root_pam_password(res: Res, reg: Registry, cfg: dict) -> list:
    if res.kind not in ('lxc', 'qemu'):
        return []
    mapped = {k for k, _ in qemu_mappings(res)} if res.kind == 'qemu' else set()
    keys = sorted(k for k in guest_config(res) if ROOT_ONLY_KEYS.match(k) and k not in mapped)
    if not keys:
        return []
    api = need(res.get('api'), 'api')
    what = '%s (%s)' % (', '.join(keys[:6]) + (', ...' if len(keys) > 6 else ''),
                        'devN' if res.kind == 'lxc' else 'hostpciN/amd-sev/affinity')
    fix = ('Fix: gpuhost:host.api.user: root@pam with host.api.password (a secret); remove token_id/token_secret. '
           '(The api input is a secret: its values are not shown.)')
    if not isinstance(api, dict):
        return ['%s: sets %s but has no api login; only root@pam with a password may set them. %s' % (
            res.name, what, fix)]
    problems = []
    if api.get('user') != 'root@pam':
        problems.append('the API user is not root@pam' + (' (it names an API token: user!token)'
                                                          if '!' in str(api.get('user')) else ''))
    tokens = sorted(k for k, v in api.items() if 'token' in k.lower() and v not in (None, '', UNKNOWN))
    if tokens:
        problems.append('it carries an API token (%s)' % ', '.join(tokens))
    # (A password the stack keeps in a file is in the configuration by its path: config/load.py provider_access.)
    password = api.get('password') or api.get('password_file')
    if password is UNKNOWN:
        raise Unknown(['api', 'password'])
    if not isinstance(password, str) or not password:
        problems.append('it has no password')
    if not problems:
        return []
    return ['%s: sets %s, which Proxmox lets only root@pam with a password ticket set, but %s. %s' % (
        res.name, what, ' and '.join(problems), fix)]


# --------------------------------------------------------------------------- rule 8

PRIVATE_NETS = [ipaddress.ip_network(n) for n in (
    '10.0.0.0/8', '172.16.0.0/12', '192.168.0.0/16',       # RFC 1918
    '127.0.0.0/8', '::1/128',                              # loopback
    '169.254.0.0/16', 'fe80::/10',                         # link-local
    'fc00::/7')]                                           # IPv6 unique local (RFC 4193)


def bind_kind(host) -> str:
    """'private', 'all' (a wildcard: every address of the container) or 'public'."""
    if host in ('localhost',):
        return 'private'
    try:
        ip = ipaddress.ip_address(str(host).strip('[]'))
    except ValueError:
        return 'public'  # a name: whatever it resolves to, unknown here
    if ip.is_unspecified:
        return 'all'
    if getattr(ip, 'ipv4_mapped', None):
        ip = ip.ipv4_mapped
    return 'private' if any(ip in n for n in PRIVATE_NETS) else 'public'


def sglang_private_bind(res: Res, reg: Registry, cfg: dict) -> list:
    if res.kind != 'unit':
        return []
    flags = unit_flags(res)
    if flags.problem:
        return unit_problem(res, flags, 'the listen address (--host)')
    host = flags.ns.get('host')
    kind = bind_kind(host)
    if kind == 'private' or cfg.get('allow_public_bind') is True:
        return []
    port = flags.ns.get('port')
    endpoint = res.get('endpoint') if isinstance(res.get('endpoint'), str) else None
    addr = re.sub(r'^https?://', '', endpoint or '').rsplit(':', 1)[0] or None
    where = 'every address of the container' if kind == 'all' else 'a public address'
    return ['%s: SGLang would listen on %s (--host %s, port %s) without an opt-in. Fix: bind the container\'s '
            'private address (gpuhost:sglang.host: %s), or opt in for this stack in policy/config.<stack>.json: '
            '{"%s": {"allow_public_bind": true}}' % (
                res.name, where, host if re.match(r'^[\w.:\[\]-]+$', str(host)) else show(host), port,
                addr or '<the container address>', PRIVATE_BIND)]


# --------------------------------------------------------------------------- rule 9

ID_FIX = ('a mapping id is a letter, then letters, digits, "-" or "_" (Proxmox\'s pve-configid); anything else - a '
          'comma above all - would add properties to the hostpci entry that names it. Fix: '
          'gpuhost:vm.gpu_mapping_prefix of letters, digits, "-" and "_"')


def vm_gpus_by_mapping(res: Res, reg: Registry, cfg: dict) -> list:
    if res.kind == 'pcimap':
        return ['%s: mapping id %s is not a Proxmox mapping id: %s' % (res.name, show(mid), ID_FIX)
                for mid in pcimap_paths(res) if not CONFIGID_RE.match(mid)]
    if res.kind != 'qemu':
        return []
    mapped = qemu_mappings(res)
    with reg.lock:
        declared = {mid: (v['name'], addrs) for v in reg.on_host(reg.pcimap, res).values()
                    for mid, addrs in v['mappings'].items()}
    why = []
    if res.get('gpu_binding') == 'mapping':
        why.append('its gpu_binding is mapping')
    if declared:
        why.append('PciMappings %s declared for its host' % ', '.join(sorted({n for n, _ in declared.values()})))
    if mapped:
        why.append('%s pass%s through mappings' % (', '.join(k for k, _ in mapped), 'es' if len(mapped) == 1 else ''))
    out = []
    for key, mid in mapped:
        if mid not in declared:
            out.append('%s: %s names mapping %s, which no PciMappings resource of this run declares for this host, so '
                       'what it passes cannot be checked (container GPU, vfio binding). Fix: let the program make the '
                       'mappings (gpuhost:vm.gpu_binding: mapping) and the VM depend on them' % (res.name, key, mid))
    if not why:
        return out
    for key, a, _ in qemu_hostpci(res):
        if a:
            out.append('%s: %s passes %s by raw PCI address in a stack that gives the VM its GPUs through PCI resource '
                       'mappings (%s): Proxmox starts a raw address with whatever device sits there after a renumbered '
                       'bus - on this host possibly a container GPU - while a mapping makes it refuse. Fix: %s: '
                       'mapping=<id>,pcie=1 with that GPU\'s mapping (gpuhost:vm.gpu_binding: mapping makes them), '
                       'or gpu_binding: address for the whole VM' % (res.name, key, fmt_bdf(a), '; '.join(why), key))
    return out


CHECKS = {
    NO_IDENTITY: no_identity_iommu,
    VFIO_BY_ADDRESS: vfio_by_address,
    GPU_ONE_SIDE: gpu_one_side,
    P2P_OFF: p2p_off,
    SPECULATION: speculation_triple,
    TP_GPUS: tp_equals_container_gpus,
    ROOT_PAM: root_pam_password,
    PRIVATE_BIND: sglang_private_bind,
    BY_MAPPING: vm_gpus_by_mapping,
}

CONFIG_SCHEMAS = {
    PRIVATE_BIND: {'allow_public_bind': {'type': 'boolean', 'default': False,
                                         'description': 'Allow SGLang to listen on 0.0.0.0 / :: or a public address '
                                                        'for this stack (the finding is then not raised; the pack '
                                                        'reports the opt-in)'}},
}


def check(rule: str, res: Res, reg: Registry, cfg: dict = None) -> list:
    """The findings of one rule for one resource (messages). Records the resource first."""
    reg.record(res)
    return CHECKS[rule](res, reg, cfg or {})


# --------------------------------------------------------------------------- levels

def level_report(levels: dict, configs: dict, stack: str) -> str:
    """The line the pack prints when a stack's policy config relaxes anything, or ''."""
    lowered = sorted(r for r in RULES if levels.get(r) == 'advisory')
    opt_ins = sorted('%s: allow_public_bind: true' % r for r in (PRIVATE_BIND,)
                     if (configs.get(r) or {}).get('allow_public_bind') is True)
    if not lowered and not opt_ins:
        return ''
    parts = []
    if lowered:
        parts.append('rules lowered to advisory (their findings print as warnings and do not stop the run): %s'
                     % ', '.join(lowered))
    if opt_ins:
        parts.append('opt-ins: %s' % '; '.join(opt_ins))
    return 'stack %s: the policy config relaxes the safety rules - %s. Every other rule is mandatory.' % (
        stack or '?', '; '.join(parts))


def level_problems(levels: dict, configs: dict, reporter: str) -> list:
    """Why a policy config is refused: a rule disabled (or anything but mandatory/advisory), the
    reporter disabled, a policy name this pack does not have or a setting a rule does not have (a
    typo would otherwise relax or opt in to nothing, silently)."""
    out = []
    for name, level in sorted(levels.items()):
        if name == reporter:
            if level == 'disabled':
                out.append('%s: enforcement level disabled; it reports relaxed rules and may not be hidden' % name)
        elif name not in RULES:
            out.append('%s is not a rule of this pack (rules: %s)' % (name, ', '.join(RULES)))
        elif level not in ('mandatory', 'advisory'):
            out.append('%s: enforcement level %s; a rule may be lowered to advisory, never %s' % (name, level, level))
    for name, props in sorted(configs.items()):
        known = CONFIG_SCHEMAS.get(name, {})
        for key in sorted(props or {}):
            if key not in known:
                out.append('%s has no setting %s%s' % (name, key, ' (settings: %s)' % ', '.join(sorted(known))
                                                       if known else ''))
    return out
