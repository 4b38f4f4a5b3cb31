"""Checks made at the start of every `pulumi up` (never at preview, which contacts no host), before
any resource step runs - so before anything is deleted, replaced or written:

  * the host is the one the config describes: every GPU of the inventory at its address, with its
    vendor:device ID and NUMA node (also when no host-level setting changed);
  * the VM's PCI resource mappings still match the devices at their addresses (resources/pcimap.py:
    what Proxmox checks at VM start; a container GPU or a non-GPU device at a VM address is DANGER);
  * no Blackwell GPU sits in an identity IOMMU domain, and no container GPU is bound to vfio-pci
    (both mean the host is in a state where changing anything may brick or misassign a GPU);
  * no modprobe configuration outside the program's own file binds GPUs by ID, blacklists or replaces
    a GPU module, or contradicts the nvidia option (the next boot would undo what the program sets);
  * what the guests need exists on the Proxmox side: the node (online), the container's storage,
    its OS template, and the bridges;
  * the SGLang unit's name is not one the container already has of its own;
  * the model storage the container's mount point binds (gpuhost:model.storage) exists on the host;
  * the model's mount point (gpuhost:model.mp) is not one the container already has of its own - a mount of
    another dataset, not the model's of an earlier run;
  * without gpuhost:model.source, the weights are already whole on the host (nothing could download them, and the
    model's step would refuse them after others had changed the host);
  * the host runs the nvidia kernel module gpuhost:runtime.nvidia declares (a host driver upgraded under a
    running container stops the run here, before any restart: the container's user space must match it).

and, what the host must already have (the program installs none of it): the nvidia kernel module loaded with
the device nodes the container's devN entries name, driverctl (when there is a VM), a Proxmox VE release that
knows devN and amd-sev.

Each is one Check; `up` runs those marked `up` in order and stops at the first failure (run()), `make check`
(tools/check.py) runs every one, read-only, and lists them all (report()). A few are for `make check` only:
IOMMU and SEV-SNP enabled in the firmware - `up` itself may be what turns them on (it removes amd_iommu=off
and the like from the kernel command line and reboots), so refusing it for them would refuse the fix.

Each failure is one ConfigError-like message naming the config key, what was found and what to do.
"""

from __future__ import annotations

import contextvars
import dataclasses
import re
import threading
from typing import Callable, Optional

from resources import host as host_mod
from resources import pcimap, pve, runtime
from transport import driverfacts, remote
from resources.sglang import service_props
from transport.operator import OperatorError, describe_unexpected
from grammar.gpu import BLACKWELL_IDS


class PreflightError(OperatorError):
    pass


# devN (pve-container) and amd-sev (qemu-server) are refused as unknown keys by older releases; the API the
# program is tested against (the lab's fakepve schema) is 9.0's.
MIN_PVE = (9, 0)


def container_gpus_on_vfio(facts: remote.HostFacts, container_gpus: list) -> list:
    return [b for b in container_gpus if facts.gpus.get(b) is not None and
            (facts.gpus[b].driver == 'vfio-pci' or facts.overrides.get(b) == 'vfio-pci')]


class Context:
    """What the checks read, each read once: the host's facts (one SSH command) and the Proxmox API."""

    def __init__(self, d, connection: dict, api: dict, model_files: Optional[dict] = None,
                 runtime_files: Optional[dict] = None):
        self.d, self.connection, self.api, self.model_files = d, connection, api, model_files
        self.runtime_files = runtime_files
        self._facts = None
        self._pve = {}

    @property
    def by_mapping(self):
        return bool(self.d.vm and self.d.vm.mapping_ids())

    def facts_args(self) -> list:
        """host_facts.sh's arguments: the device nodes the container's devN entries name, and the devices at the
        VM's GPU addresses, whatever they are, for its resource mappings - the same SSH command."""
        return device_nodes(self.d) + (list(self.d.vm.gpus) if self.by_mapping else [])

    def facts(self) -> remote.HostFacts:
        if self._facts is None:
            self._facts = host_mod.read_facts(remote.Target.from_inputs(self.connection), self.facts_args())
        return self._facts

    def pve(self, key, what, path_fn, **kwargs):
        if key not in self._pve:
            with pve.client(self.api) as prox:
                self._pve[key] = pve.api_call(what, path_fn(prox), read=True, **kwargs)
        return self._pve[key]

    def nodes(self):
        return {n.get('node'): n for n in self.pve('nodes', 'listing the cluster\'s nodes', lambda p: p.nodes.get)}

    def storages(self):
        node = self.d.host.node
        return {s.get('storage'): s for s in self.pve('storage', 'listing the storages of %s' % node,
                                                      lambda p: p.nodes(node).storage.get)}


def device_nodes(d) -> list:
    from grammar.pve import split_props
    return [split_props(v)[0] or split_props(v)[1].get('path') for _, v in sorted(d.container_devices().items())]


@dataclasses.dataclass(frozen=True)
class Check:
    title: str                                  # what must hold, as `make check` lists it
    where: str                                  # 'host' (SSH) or 'pve' (the API)
    fn: Callable                                # (Context) -> None, or the problem (what was found, what to do)
    up: bool = True                             # also stops `up` (else `make check` only)
    applies: Callable = lambda d: True


# ------------------------------------------------------------------ the host (one SSH command)

def _ssh(ctx):
    ctx.facts()


def _api(ctx):
    ctx.nodes()


def _identity(ctx):
    try:
        host_mod.check_identity(ctx.facts(), sorted(BLACKWELL_IDS))
    except host_mod.HostStateError as e:
        return str(e)


def _inventory(ctx):
    d, facts = ctx.d, ctx.facts()
    problems = host_mod.inventory_problems(facts, [g.model_dump() for g in d.host.gpus])
    # A renumbered bus shows in the inventory too (an address missing, a NUMA node that differs); what it means
    # for the VM - Proxmox's mapping check, a container GPU or a non-GPU device at a VM address - comes first.
    stops = pcimap.preflight_problems(d, ctx.api, facts) if ctx.by_mapping and ctx.api is not None else []
    if stops:
        return '\n'.join(stops) + (
            '\nThe host does not match the config either:\n  - ' + '\n  - '.join(problems) if problems else '')
    if problems:
        return 'the host does not match the config:\n  - ' + '\n  - '.join(problems)


def _vfio(ctx):
    on_vfio = container_gpus_on_vfio(ctx.facts(), list(ctx.d.container.gpus))
    if on_vfio:
        return host_mod.vfio_recovery(on_vfio, ctx.d.container.vmid)


def _modprobe(ctx):
    conflicts = host_mod.modprobe_conflicts(ctx.facts(), ctx.d.nvidia.dma_remap_peer_mmio)
    if conflicts:
        return host_mod.modprobe_stop(conflicts)


def _nvidia_loaded(ctx):
    d, facts = ctx.d, ctx.facts()
    if facts.nvidia_module is None:
        return ('the nvidia kernel module is not loaded (no /sys/module/nvidia): install the NVIDIA driver on the host '
                '(the open kernel module, NVIDIA-Linux-x86_64-<version>.run --kernel-module-type=open%s) and load it '
                '(modprobe nvidia nvidia-uvm; nvidia-smi lists the GPUs)' % (
                    ', version %s as gpuhost:runtime.nvidia.version says' % d.runtime.nvidia.version
                    if d.runtime is not None and d.runtime.nvidia is not None else ''))
    missing = [p for p in device_nodes(d) if not facts.devnodes.get(p)]
    if missing:
        return ('device nodes missing on the host: %s (the container\'s devN entries point at them). Load nvidia-uvm '
                '(modprobe nvidia-uvm) and create the nodes (nvidia-smi; nvidia-modprobe -u -c0)' % ', '.join(missing))


def _nvidia_version(ctx):
    d, facts = ctx.d, ctx.facts()
    # Not loaded at all: _nvidia_loaded says so (and what to install).
    if facts.nvidia_module is not None and facts.nvidia_module != d.runtime.nvidia.version:
        return runtime.host_driver_message(d.runtime.nvidia.version, facts.nvidia_module)


def _kernels_have_nvidia(ctx):
    """Every kernel installed on the host has the nvidia module built for it (hostscripts/driver_facts.sh): a kernel
    update whose DKMS build failed, or that came without its headers, boots the host with no GPU driver at all."""
    facts = driverfacts.parse(remote.run(remote.Target.from_inputs(ctx.connection), 'driver_facts.sh').stdout)
    if not facts.tree:
        return 'the host has no /lib/modules: which kernels have the nvidia module cannot be read'
    missing = facts.without_module()
    if missing:
        return ('%s installed without the nvidia module built for %s: a boot into %s has no GPU driver. Build it '
                'with DKMS after installing the kernel\'s headers (apt install %s; dkms autoinstall -k %s), or remove '
                'the kernel' % (
                    ('kernel %s is' if len(missing) == 1 else 'kernels %s are') % ', '.join(missing),
                    'it' if len(missing) == 1 else 'them', 'it' if len(missing) == 1 else 'one',
                    ' '.join('proxmox-headers-%s' % k for k in missing), missing[0]))
    if any(v == '?' for v in facts.kernels.values()):
        return ('modinfo is not installed on the host, so which kernels have the nvidia module cannot be read: '
                'apt install kmod')


def _driverctl(ctx):
    if ctx.facts().driverctl is None:
        return ('driverctl is not installed on the host (it binds the VM\'s GPUs to vfio-pci by PCI address, so '
                'the binding survives reboots): apt install driverctl')


def _iommu(ctx):
    if not ctx.facts().iommu_groups:
        return ('the host has no IOMMU groups (/sys/kernel/iommu_groups is empty): the IOMMU is off. Enable it in the '
                'firmware (AMD: IOMMU and SVM in the BIOS setup; Intel: VT-d) and reboot; if the kernel command line '
                'holds amd_iommu=off or intel_iommu=off, `up` removes it')


def _sev_snp(ctx):
    kvm = ctx.facts().kvm_amd
    if not kvm:
        return ('kvm_amd is not loaded (no /sys/module/kvm_amd/parameters): the VM needs an AMD host with '
                'virtualization (SVM) enabled in the firmware; modprobe kvm_amd')
    if kvm.get('sev_snp', 'N') not in ('Y', '1'):
        return ('SEV-SNP is off (/sys/module/kvm_amd/parameters/sev_snp: %s, sev: %s): enable SEV, SEV-ES and SEV-SNP '
                'in the firmware (BIOS setup: SEV-SNP support, SNP memory coverage, a nonzero SEV-ES ASID space) and '
                'reboot; without it the VM with amd-sev type=snp does not start (or set gpuhost:vm.sev: off)'
                % (kvm.get('sev_snp', 'absent'), kvm.get('sev', 'absent')))


# ---------------------------------------------------------------------------- Proxmox (the API)

def _pve_version(ctx):
    v = ctx.pve('version', 'reading the Proxmox VE version', lambda p: p.version.get)
    text = str((v.get('version') or v.get('release') or '') if isinstance(v, dict) else '')
    m = re.match(r'^(\d+)\.(\d+)', text)     # 9.0.3, 9.1~beta1, 8.4-1
    if m is None:
        return ('Proxmox VE at %s reports its version as %r, which is not <major>.<minor>...; check pveversion on '
                'the host (the program needs %d.%d or later)' % (ctx.api['host'], text, MIN_PVE[0], MIN_PVE[1]))
    if (int(m.group(1)), int(m.group(2))) < MIN_PVE:
        return ('Proxmox VE %s at %s: the program needs %d.%d or later (it sets devN on the container and amd-sev on '
                'the VM, which older releases refuse as unknown keys); upgrade the host (pve%dto%d, apt full-upgrade)'
                % (text or '(unknown)', ctx.api['host'], MIN_PVE[0], MIN_PVE[1], MIN_PVE[0] - 1, MIN_PVE[0]))


def _node(ctx):
    node, names = ctx.d.host.node, ctx.nodes()
    if node not in names:
        return ('gpuhost:host.node: %r is not a node of the Proxmox cluster at %s (nodes: %s); fix the node name '
                '(hostname -s on the host)' % (node, ctx.api['host'], ', '.join(sorted(names)) or 'none'))
    if names[node].get('status') not in (None, 'online'):
        return 'gpuhost:host.node: node %s is %s; bring it back (or wait for it) and re-run' % (
            node, names[node].get('status'))


def _storage_problem(ctx, sid, content, key):
    node, stores = ctx.d.host.node, ctx.storages()
    s = stores.get(sid)
    if s is None:
        return '%s: storage %r does not exist on node %s (storages: %s)' % (key, sid, node, ', '.join(sorted(stores)))
    if str(s.get('active', 1)) not in ('1', 'True', 'true'):
        return '%s: storage %r is not active on node %s; activate it and re-run' % (key, sid, node)
    if content not in str(s.get('content', content)).split(','):
        return '%s: storage %r does not hold %s content on node %s (it has: %s)' % (key, sid, content, node,
                                                                                  s.get('content'))


def _storage(ctx):
    return _storage_problem(ctx, ctx.d.container.storage, 'rootdir', 'gpuhost:container.storage')


def _template(ctx):
    c, node = ctx.d.container, ctx.d.host.node
    tmpl_store = c.ostemplate.split(':', 1)[0]
    problem = _storage_problem(ctx, tmpl_store, 'vztmpl', 'gpuhost:container.ostemplate')
    if problem:
        return problem
    vols = ctx.pve('templates', 'listing the templates on %s' % tmpl_store,
                   lambda p: p.nodes(node).storage(tmpl_store).content.get, content='vztmpl')
    if c.ostemplate not in {v.get('volid') for v in vols}:
        return ('gpuhost:container.ostemplate: %s is not on storage %s of node %s (templates there: %s); download it '
                '(pveam update; pveam download %s %s) or fix the name' % (
                    c.ostemplate, tmpl_store, node, ', '.join(sorted(v.get('volid') for v in vols)) or 'none',
                    tmpl_store, c.ostemplate.split('/', 1)[-1]))


def _bridges(ctx):
    d, node = ctx.d, ctx.d.host.node
    bridges = {i.get('iface') for i in ctx.pve('network', 'listing the network of %s' % node,
                                                lambda p: p.nodes(node).network.get, type='any_bridge')
               if i.get('type') in ('bridge', 'OVSBridge')}
    for key, bridge in (('gpuhost:container.bridge', d.container.bridge),) + (
            (('gpuhost:vm.bridge', d.vm.bridge),) if d.vm else ()):
        if bridge not in bridges:
            return '%s: bridge %r does not exist on node %s (bridges: %s)' % (
                key, bridge, node, ', '.join(sorted(b for b in bridges if b)) or 'none')


def _unit_name(ctx):
    """gpuhost:sglang.unit names a unit of this program's, or a free name: never one the container has
    of its own (ssh.service, a vendor unit...), which writing ours would override and destroy would delete.
    An adopted container's own /etc/systemd/system/<unit> is the SGLang unit being taken over: allowed."""
    d = ctx.d
    props = service_props(d)
    out = _unit_owner(ctx).stdout.strip()
    if out == 'foreign %s' % props['unit_path'] and d.container.adopt:
        # The container is adopted with the unit it runs: that file is the unit to take over (docs/operator-guide.md).
        return
    if out.startswith('foreign '):
        own = out == 'foreign %s' % props['unit_path']
        adopt = ('. If it is the SGLang unit of a deployment made before this program, take the container in with '
                 'it as they run: gpuhost:container.adopt: true (docs/operator-guide.md, '
                 '"Adopting a running deployment"); otherwise choose another name' if own else '. Choose another name, e.g. sglang-qwen.service')
        return ('gpuhost:sglang.unit: %s is a unit container %s has of its own (%s); writing the SGLang '
                'unit under that name would replace it%s'
                % (d.sglang.unit, d.container.vmid, out[len('foreign '):], adopt))


def _unit_owner_args(ctx) -> list:
    d = ctx.d
    return [d.container.vmid, d.sglang.unit, service_props(d)['unit_path']]


def _unit_owner(ctx) -> remote.Result:
    return remote.run(remote.Target.from_inputs(ctx.connection), 'ct_unit_owner.sh', _unit_owner_args(ctx))


def _storage_dir(ctx) -> remote.Result:
    return remote.run(remote.Target.from_inputs(ctx.connection), 'check_dir.sh', [ctx.d.model.storage], check=False)


def _model_storage(ctx):
    """gpuhost:model.storage exists on the host: the container's mount point needs it (Proxmox finds out only
    when the container starts, and the container would not start)."""
    d = ctx.d
    res = _storage_dir(ctx)
    if res.exit_code != 0:
        return ('gpuhost:model.storage: %s %s on the host; create it (zfs create -o mountpoint=%s <pool>/models, or '
                'mkdir -p %s) and put the model there, or fix the path' % (
                    d.model.storage, 'is not a directory' if 'not-a-directory' in res.stdout else 'does not exist',
                    d.model.storage, d.model.storage))


def _model_weights(ctx):
    """Without a source to download them from, the weights must be on the host already: a quick look (sizes and
    the sums cached by earlier verifications; no shard is read) finds what is missing, cut short or known bad."""
    from resources import model
    d = ctx.d
    if d.model.base_url():
        return None
    check = model.unit_check(d, ctx.model_files)
    rep = model.run_verify(remote.Target.from_inputs(ctx.connection), check, full=False)
    if model.broken(rep):
        return ('gpuhost:model: %s, and gpuhost:model.source is not set, so nothing can download them. The SGLang unit '
                'was not touched: the running service keeps serving, and nothing else on the host was changed. Put '
                'the files named in %s on the host (revision %s), declare gpuhost:model.source, or fix gpuhost:model '
                '/ the checksum file, and re-run' % (model.line(rep), check['dir'], d.model.revision))


def _model_mount(ctx):
    """The container's mpN at gpuhost:model.mp is the model's or free. The step that writes it refuses a mount point
    the program did not set, by the state - after the host's steps ran. Here, before them, with no state: a mount
    point that binds neither the model's storage nor the model's mount path is another dataset's, never the model's
    of an earlier run (which the program set with one of them)."""
    from grammar.pve import same_value, split_props
    d = ctx.d
    key, ours = 'mp%d' % d.model.mp, d.container_mounts()['mp%d' % d.model.mp]
    try:
        items = ctx.pve('container', 'reading container %s\'s config' % d.container.vmid,
                        lambda p: p.nodes(d.host.node).lxc(d.container.vmid).pending.get)
    except pve.PveError as e:
        if pve.gone(e):
            return None         # no container yet: the one `up` creates has no mount point of its own
        raise
    theirs = pve.mounts_of(pve.merge_pending(items)[0]).get(key)
    if theirs is None or same_value(key, ours, theirs):
        return None
    volume, options = split_props(theirs)
    if volume == d.model.storage or options.get('mp') == d.model.mount:
        return None
    return ('container %s on %s: %s. Nothing was changed on the host. (If %s is the model\'s mount point of an '
            'earlier run, with both gpuhost:model.storage and gpuhost:model.mount changed since, change them one `up` '
            'at a time.)' % (d.container.vmid, d.host.node, pve.collision_text(d.container.vmid, [(key, theirs, ours)]),
                             key))


def _platform(ctx) -> remote.Result:
    return remote.run(remote.Target.from_inputs(ctx.connection), 'ct_platform.sh', [ctx.d.container.vmid], check=False)


def _judges_wheels(ctx) -> bool:
    return bool(ctx.runtime_files and ctx.runtime_files.get('wheels'))


def _lock_fits(ctx):
    """The wheels the lock names run on the container's own glibc and Python (the preview judged them against its
    template's release; an adopted container, or one whose template the program does not know, is judged here).
    A container that does not run yet is the template's, judged at preview."""
    import types
    from grammar import wheeltags
    if not _judges_wheels(ctx):
        return None
    res = _platform(ctx)
    words = res.stdout.split()
    if res.exit_code != 0 or words[:1] != ['glibc'] or len(words) != 4:
        return None
    glibc, python = words[1], words[3]
    if not (re.match(r'^\d+\.\d+$', glibc) and re.match(r'^\d+\.\d+$', python)):
        return None
    pins = [types.SimpleNamespace(name=k, version=v, wheels=[(w, None) for w in ws])
            for k, (v, ws) in sorted(ctx.runtime_files['wheels'].items())]
    bad = wheeltags.unfit(pins, python, glibc)
    if bad:
        return 'gpuhost:runtime.python.lock (%s): %s. Nothing was changed on the host.' % (
            ctx.d.runtime.python.lock, wheeltags.refusal(bad, 'container %s (read in it: getconf GNU_LIBC_VERSION, '
                                                         'python3)' % ctx.d.container.vmid, glibc, python))


def _has_model(d):
    return d.model is not None


def _has_vm(d):
    return d.vm is not None


def _driver_is_the_operators(d):
    """Without gpuhost:nvidia.driver the host's module is a prerequisite; declared, the program loads it (and an
    upgrade cut off by a Ctrl-C has it unloaded while its job runs on: the next `up` follows that job, never refused)."""
    return d.nvidia.driver is None


def _pins_nvidia(d):
    """The user space is pinned to a version the host's module must already run - not where the driver is declared
    (gpuhost:nvidia.driver): then the program brings the module to that version itself (resources/driver.py)."""
    return d.runtime is not None and d.runtime.nvidia is not None and d.nvidia.driver is None


# In `up`'s order: what the host is first (a wrong host stops everything), then what it must have, then Proxmox.
CHECKS = (
    Check('SSH to the host, its host key the pinned one (gpuhost:host.ssh)', 'host', _ssh, up=False),
    Check('no Blackwell GPU in an identity IOMMU domain', 'host', _identity),
    Check('the GPUs of gpuhost:host.gpus at their addresses (and the VM\'s PCI mappings)', 'host', _inventory),
    Check('no container GPU bound to vfio-pci', 'host', _vfio),
    Check('no modprobe configuration that undoes the GPU settings', 'host', _modprobe),
    Check('NVIDIA kernel driver loaded, with the device nodes the container uses', 'host', _nvidia_loaded,
          applies=_driver_is_the_operators),
    Check('the host\'s nvidia module is gpuhost:runtime.nvidia.version', 'host', _nvidia_version,
          applies=_pins_nvidia),
    Check('every installed kernel has the nvidia module built for it', 'host', _kernels_have_nvidia, up=False),
    Check('driverctl installed (binds the VM\'s GPUs to vfio-pci)', 'host', _driverctl, applies=_has_vm),
    Check('IOMMU enabled in the firmware', 'host', _iommu, up=False),
    Check('SEV-SNP enabled in the firmware (kvm_amd sev_snp)', 'host', _sev_snp, up=False, applies=_has_vm),
    Check('the model storage gpuhost:model.storage on the host (the container\'s mount point binds it)', 'host',
          _model_storage, applies=_has_model),
    Check('the model\'s weights on the host, when gpuhost:model.source cannot download them', 'host',
          _model_weights, applies=_has_model),
    Check('the Proxmox API, logged in (gpuhost:host.api)', 'pve', _api, up=False),
    Check('Proxmox VE %d.%d or later (knows devN and amd-sev)' % MIN_PVE, 'pve', _pve_version),
    Check('the node gpuhost:host.node, online', 'pve', _node),
    Check('the container\'s storage gpuhost:container.storage', 'pve', _storage),
    Check('the container template gpuhost:container.ostemplate downloaded', 'pve', _template),
    Check('the bridges gpuhost:container.bridge / gpuhost:vm.bridge', 'pve', _bridges),
    Check('the model\'s mount point gpuhost:model.mp is not one of the container\'s own', 'pve', _model_mount,
          applies=_has_model),
    Check('the SGLang unit name is not one of the container\'s own', 'host', _unit_name),
    Check('the lock\'s wheels run on the container\'s glibc and Python', 'host', _lock_fits,
          applies=lambda d: d.runtime is not None and d.runtime.python is not None),
)


def _read_ahead(ctx) -> None:
    """The host's read-only reads of the checks, side by side: they go out as one SSH command and the checks find
    them read (transport/hostreads.py, inside remote.reading()). A read the host answers with a failure is left
    to its check, which says what it means; a connection that fails (lost, refused, a wrong host key) stops the
    preflight here, as it would at the check's own read."""
    from resources import model
    target = remote.Target.from_inputs(ctx.connection)
    reads = [('host_facts.sh', ctx.facts_args(), None), ('ct_unit_owner.sh', _unit_owner_args(ctx), None)] + (
        [('check_dir.sh', [ctx.d.model.storage], None)] if ctx.d.model else []) + (
        # _model_weights' quick look (its verifier on stdin: the batch's one read with input).
        [('model_verify.sh', model.quick_look_args(model.unit_check(ctx.d, ctx.model_files)), model.quick_look_stdin())]
        if ctx.d.model and not ctx.d.model.base_url() else []) + (
        [('ct_platform.sh', [ctx.d.container.vmid], None)] if _judges_wheels(ctx) else [])

    failed = []

    def one(name, args, stdin):
        try:
            remote.run(target, name, args, stdin=stdin, check=False)
        except Exception as e:  # noqa: BLE001 - raised below, in this thread
            failed.append(e)
    # Each thread in a copy of this context: remote.reading() holds in it too.
    threads = [threading.Thread(target=contextvars.copy_context().run, args=(one, *r), daemon=True) for r in reads]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        raise failed[0]


def run(d, connection: dict, api: dict, model_files: Optional[dict] = None,
        runtime_files: Optional[dict] = None) -> None:
    """`up`'s preflight: the first failing check stops the run, before any resource step."""
    ctx = Context(d, connection, api, model_files, runtime_files)
    with remote.reading():
        _read_ahead(ctx)
        for check in CHECKS:
            if check.up and check.applies(d):
                problem = check.fn(ctx)
                if problem:
                    raise PreflightError(problem)


@dataclasses.dataclass
class Result:
    check: Check
    problem: Optional[str] = None             # None: it holds
    skipped: Optional[str] = None             # why it was not checked (its side unreachable)


def report(d, connection: dict, api: dict, model_files: Optional[dict] = None,
           runtime_files: Optional[dict] = None) -> list:
    """Every check, read-only, none stopping the others: a Result each. When SSH or the API cannot be
    reached (the first check of each side), the checks on that side are skipped."""
    ctx = Context(d, connection, api, model_files, runtime_files)
    out, down = [], {}
    for check in CHECKS:
        if not check.applies(d):
            continue
        if check.where in down:
            out.append(Result(check, skipped=down[check.where]))
            continue
        try:
            out.append(Result(check, problem=check.fn(ctx)))
        except Exception as e:  # noqa: BLE001 - one check's surprise is its result, the others still run
            out.append(Result(check, problem=str(e) if isinstance(e, OperatorError) else describe_unexpected(e)))
            if check.fn in (_ssh, _api):
                down[check.where] = 'no connection' if check.fn is _ssh else 'no API session'
    return out
