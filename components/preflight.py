"""Checks made at the start of every `pulumi up` (never at preview, which contacts no host), before
any resource step runs - so before anything is deleted, replaced or written:

  * the host is the one the config describes: every GPU of the inventory at its address, with its
    vendor:device ID and NUMA node (also when no host-level setting changed);
  * the VM's PCI resource mappings still match the devices at their addresses (components/pcimap.py:
    what Proxmox checks at VM start; a container GPU or a non-GPU device at a VM address is DANGER);
  * no Blackwell GPU sits in an identity IOMMU domain, and no container GPU is bound to vfio-pci
    (both mean the host is in a state where changing anything may brick or misassign a GPU);
  * no modprobe configuration outside the program's own file binds GPUs by ID, blacklists or replaces
    a GPU module, or contradicts the nvidia option (the next boot would undo what the program sets);
  * what the guests need exists on the Proxmox side: the node (online), the container's storage,
    its OS template, and the bridges;
  * the SGLang unit's name is not one the container already has of its own;
  * the model storage the container's mount point binds (gpuhost:model.storage) exists on the host;
  * the host runs the nvidia kernel module gpuhost:runtime.nvidia declares (a host driver upgraded under a
    running container stops the run here, before any restart: the container's user space must match it).

Each failure is one ConfigError-like message naming the config key, what was found and what to do.
"""

from __future__ import annotations

from components import host as host_mod
from components import pcimap, pve, remote, runtime
from components.sglang import service_props
from components.state import OperatorError
from grammar.gpu import BLACKWELL_IDS


class PreflightError(OperatorError):
    pass


def container_gpus_on_vfio(facts: remote.HostFacts, container_gpus: list) -> list:
    return [b for b in container_gpus if facts.gpus.get(b) is not None and
            (facts.gpus[b].driver == 'vfio-pci' or facts.overrides.get(b) == 'vfio-pci')]


def check_host(d, connection: dict, api: dict = None) -> remote.HostFacts:
    target = remote.Target.from_inputs(connection)
    by_mapping = bool(d.vm and d.vm.mapping_ids())
    # The devices at the VM's GPU addresses, whatever they are, for its resource mappings: same SSH command.
    facts = host_mod.read_facts(target, pci=list(d.vm.gpus) if by_mapping else [])
    host_mod.check_identity(facts, sorted(BLACKWELL_IDS))
    problems = host_mod.inventory_problems(facts, [g.model_dump() for g in d.host.gpus])
    # A renumbered bus shows in the inventory too (an address missing, a NUMA node that differs); what it means
    # for the VM - Proxmox's mapping check, a container GPU or a non-GPU device at a VM address - comes first.
    stops = pcimap.preflight_problems(d, api, facts) if by_mapping and api is not None else []
    if stops:
        raise PreflightError('\n'.join(stops) + (
            '\nThe host does not match the config either:\n  - ' + '\n  - '.join(problems) if problems else ''))
    if problems:
        raise PreflightError('the host does not match the config:\n  - ' + '\n  - '.join(problems))
    on_vfio = container_gpus_on_vfio(facts, list(d.container.gpus))
    if on_vfio:
        raise PreflightError(host_mod.vfio_recovery(on_vfio, d.container.vmid))
    conflicts = host_mod.modprobe_conflicts(facts, d.nvidia.dma_remap_peer_mmio)
    if conflicts:
        raise PreflightError(host_mod.modprobe_stop(conflicts))
    if d.runtime is not None and d.runtime.nvidia is not None and facts.nvidia_module != d.runtime.nvidia.version:
        raise PreflightError(runtime.host_driver_message(d.runtime.nvidia.version, facts.nvidia_module))
    return facts


def check_proxmox(d, api: dict) -> None:
    node = d.host.node
    with pve.client(api) as prox:
        nodes = pve.api_call('listing the cluster\'s nodes', prox.nodes.get, read=True)
        names = {n.get('node'): n for n in nodes}
        if node not in names:
            raise PreflightError('gpuhost:host.node: %r is not a node of the Proxmox cluster at %s (nodes: %s); fix '
                                 'the node name (hostname -s on the host)' % (node, api['host'],
                                                                             ', '.join(sorted(names)) or 'none'))
        if names[node].get('status') not in (None, 'online'):
            raise PreflightError('gpuhost:host.node: node %s is %s; bring it back (or wait for it) and re-run'
                                 % (node, names[node].get('status')))
        n = prox.nodes(node)
        stores = {s.get('storage'): s for s in pve.api_call('listing the storages of %s' % node, n.storage.get, read=True)}
        c = d.container
        need = [(c.storage, 'rootdir', 'gpuhost:container.storage')]
        tmpl_store = c.ostemplate.split(':', 1)[0]
        need.append((tmpl_store, 'vztmpl', 'gpuhost:container.ostemplate'))
        for sid, content, key in need:
            s = stores.get(sid)
            if s is None:
                raise PreflightError('%s: storage %r does not exist on node %s (storages: %s)' % (
                    key, sid, node, ', '.join(sorted(stores))))
            if str(s.get('active', 1)) not in ('1', 'True', 'true'):
                raise PreflightError('%s: storage %r is not active on node %s; activate it and re-run' % (key, sid, node))
            if content not in str(s.get('content', content)).split(','):
                raise PreflightError('%s: storage %r does not hold %s content on node %s (it has: %s)' % (
                    key, sid, content, node, s.get('content')))
        vols = pve.api_call('listing the templates on %s' % tmpl_store, n.storage(tmpl_store).content.get,
                            content='vztmpl', read=True)
        if c.ostemplate not in {v.get('volid') for v in vols}:
            raise PreflightError('gpuhost:container.ostemplate: %s is not on storage %s of node %s (templates there: %s);'
                                 ' download it (pveam download %s <template>) or fix the name' % (
                                     c.ostemplate, tmpl_store, node,
                                     ', '.join(sorted(v.get('volid') for v in vols)) or 'none', tmpl_store))
        bridges = {i.get('iface') for i in pve.api_call('listing the network of %s' % node, n.network.get,
                                                        type='any_bridge', read=True)
                   if i.get('type') in ('bridge', 'OVSBridge')}
        for key, bridge in (('gpuhost:container.bridge', c.bridge),) + (
                (('gpuhost:vm.bridge', d.vm.bridge),) if d.vm else ()):
            if bridge not in bridges:
                raise PreflightError('%s: bridge %r does not exist on node %s (bridges: %s)' % (
                    key, bridge, node, ', '.join(sorted(b for b in bridges if b)) or 'none'))


def check_unit_name(d, connection: dict) -> None:
    """gpuhost:sglang.unit names a unit of this program's, or a free name: never one the container has
    of its own (ssh.service, a vendor unit...), which writing ours would override and destroy would delete."""
    props = service_props(d)
    out = remote.run(remote.Target.from_inputs(connection), 'ct_unit_owner.sh',
                     [d.container.vmid, d.sglang.unit, props['unit_path']]).stdout.strip()
    if out.startswith('foreign '):
        raise PreflightError('gpuhost:sglang.unit: %s is a unit container %s has of its own (%s); writing the SGLang '
                             'unit under that name would replace it. Choose another name, e.g. sglang-qwen.service'
                             % (d.sglang.unit, d.container.vmid, out[len('foreign '):]))


def check_model_storage(d, connection: dict) -> None:
    """gpuhost:model.storage exists on the host: the container's mount point needs it (Proxmox finds out only
    when the container starts, and the container would not start)."""
    if d.model is None:
        return
    res = remote.run(remote.Target.from_inputs(connection), 'check_dir.sh', [d.model.storage], check=False)
    if res.exit_code != 0:
        raise PreflightError('gpuhost:model.storage: %s %s on the host; create it (zfs create -o mountpoint=%s '
                             '<pool>/models, or mkdir -p %s) and put the model there, or fix the path' % (
                                 d.model.storage, 'is not a directory' if 'not-a-directory' in res.stdout else
                                 'does not exist', d.model.storage, d.model.storage))


def run(d, connection: dict, api: dict) -> None:
    check_host(d, connection, api)
    check_model_storage(d, connection)
    check_proxmox(d, api)
    check_unit_name(d, connection)
