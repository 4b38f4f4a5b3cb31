"""SevSnpVm: the confidential-computing VM (AMD SEV-SNP) with the NUMA1 GPUs as hostpciN devices.

Decided here: q35 + OVMF (SNP needs both; Proxmox ignores efidisk0 with SNP, so there is none),
`amd-sev: type=snp`, `hostpci0..N` for the VM's GPUs with pcie=1, and NUMA placement (numa0 bound to the
host node of the GPUs, affinity to that node's CPUs).

The GPUs reach the VM through Proxmox PCI resource mappings by default (gpuhost:vm.gpu_binding: mapping):
`hostpciN: mapping=<id>,pcie=1`, each mapping recording the device's IDs and IOMMU group
(resources/pcimap.py), so Proxmox itself refuses to start the VM with a device that is not the one
recorded - after a renumbered bus, the address may hold one of the container's identical GPUs. With
gpu_binding: address they are raw `hostpciN: <address>,pcie=1`. Either way the GPUs are bound to vfio-pci
by ProxmoxHost first, so Proxmox's own new_id binding at VM start cannot grab a container GPU with the
same vendor:device ID. hostpciN changes on a running VM wait for a restart: they show in the `pending`
output and are not forced.
"""

from __future__ import annotations

import pulumi

from resources import pcimap, pve
from grammar.pve import hostpci_address, hostpci_mapping


def vm_config(d) -> dict:
    vm = d.vm
    sev = None
    if vm.sev != 'none':
        sev = 'type=%s' % vm.sev
        if vm.sev == 'snp':
            sev += ',allow-smt=%d' % int(vm.snp.allow_smt)
            if vm.snp.kernel_hashes:
                sev += ',kernel-hashes=1'
    config = {
        'name': vm.name, 'machine': 'q35', 'bios': 'ovmf', 'ostype': 'l26', 'cpu': 'host',
        'cores': vm.cores, 'sockets': 1, 'memory': vm.memory_mb, 'numa': 1,
        'numa0': 'cpus=0-%d,hostnodes=%d,memory=%d,policy=bind' % (vm.cores - 1, vm.numa, vm.memory_mb),
        'affinity': d.host.numa_cpus[vm.numa],
        'net0': 'virtio,bridge=%s' % vm.bridge, 'scsihw': 'virtio-scsi-single',
        # Started with the host, like the container: a reboot must not leave it off.
        'onboot': int(vm.start),
    }
    if sev:
        config['amd-sev'] = sev
    mapping_ids = vm.mapping_ids()
    for i, bdf in enumerate(vm.gpus):
        config['hostpci%d' % i] = hostpci_mapping(mapping_ids[i]) if mapping_ids else hostpci_address(bdf)
    return config


def mapping_props(d) -> dict:
    """The inputs of the VM's resource mappings: what is declared of each (the rest is read from the host)."""
    vm = d.vm
    inventory = {g.address: g.id for g in d.host.gpus}
    ids = vm.mapping_ids()
    return {'node': d.host.node, 'vmid': vm.vmid,
            'mappings': {mid: {'path': bdf, 'id': inventory[bdf]} for mid, bdf in zip(ids, vm.gpus)},
            'checks': {mid: '' for mid in ids},
            'hostpci': {mid: 'hostpci%d' % i for i, mid in enumerate(ids)},
            'guard': {'gpus': list(d.container.gpus), 'numa': d.container.numa}, 'vm_numa': vm.numa}


class SevSnpVm(pulumi.ComponentResource):
    """Outputs: vmid, status, pending (config keys waiting for a VM restart), hostpci, gpu_mappings (each
    mapping's entry for the node as Proxmox has it; {} with gpu_binding: address)."""

    def __init__(self, name, deployment, opts=None, fleet_host=None):
        super().__init__('gpuhost:index:SevSnpVm', name, None, opts)
        d = deployment
        config = vm_config(d)
        fleet = {'fleet_host': fleet_host} if fleet_host else {}
        self.mappings = None
        depends = []
        if d.vm.mapping_ids():
            self.mappings = pcimap.PciMappings(
                '%s-pci-mappings' % name,
                dict(entries=None, **mapping_props(d), **fleet),
                # After what the VM waits for (the host's files and bindings): a child does not inherit its
                # component's depends_on, and the mappings read the host over the same SSH connection.
                pulumi.ResourceOptions(parent=self, depends_on=opts.depends_on if opts else None))
            # The VM is created and started only after its mappings are made and checked against the host.
            depends.append(self.mappings)
        props = {'node': d.host.node, 'kind': 'qemu', 'vmid': d.vm.vmid,
                 'create': {}, 'config': config, 'start': d.vm.start, 'raw_lxc': {}, 'protect': d.vm.protect,
                 'adopt': d.vm.adopt,
                 'guard_gpus': list(d.container.gpus), 'gpu_binding': d.vm.gpu_binding,
                 **dict.fromkeys(pve.PveGuestProvider.OUTPUTS), **fleet}
        self.guest = pve.Guest('%s-qemu' % name, props,
                               pulumi.ResourceOptions(parent=self, protect=d.vm.protect, depends_on=depends))
        self.vmid = self.guest.vmid
        self.status = self.guest.status
        self.pending = self.guest.pending
        self.hostpci = {k: v for k, v in config.items() if k.startswith('hostpci')}
        self.gpu_mappings = self.mappings.entries if self.mappings is not None else {}
        self.register_outputs({'vmid': self.vmid, 'status': self.status, 'pending': self.pending})
