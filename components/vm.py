"""SevSnpVm: the confidential-computing VM (AMD SEV-SNP) with the NUMA1 GPUs as hostpciN devices.

Decided here: q35 + OVMF (SNP needs both; Proxmox ignores efidisk0 with SNP, so there is none),
`amd-sev: type=snp`, `hostpci0..N` for the VM's GPUs by PCI address with pcie=1, and NUMA placement
(numa0 bound to the host node of the GPUs, affinity to that node's CPUs). The GPUs are bound to
vfio-pci by ProxmoxHost first, so Proxmox's own new_id binding at VM start cannot grab a container
GPU with the same vendor:device ID. hostpciN changes on a running VM wait for a restart: they show
in the `pending` output and are not forced.
"""

from __future__ import annotations

import pulumi

from components import pve


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
    for i, bdf in enumerate(vm.gpus):
        config['hostpci%d' % i] = '%s,pcie=1' % bdf
    return config


class SevSnpVm(pulumi.ComponentResource):
    """Outputs: vmid, status, pending (config keys waiting for a VM restart), hostpci."""

    def __init__(self, name, deployment, api, opts=None, fleet_host=None):
        super().__init__('gpuhost:index:SevSnpVm', name, None, opts)
        d = deployment
        config = vm_config(d)
        props = {'api': api, 'connection': None, 'node': d.host.node, 'kind': 'qemu', 'vmid': d.vm.vmid,
                 'create': {}, 'config': config, 'start': d.vm.start, 'raw_lxc': {}, 'protect': d.vm.protect,
                 'guard_gpus': list(d.container.gpus),
                 **dict.fromkeys(pve.PveGuestProvider.OUTPUTS)}
        if fleet_host:
            props['fleet_host'] = fleet_host
        self.guest = pve.Guest(pve.PveGuestProvider(), '%s-qemu' % name, props,
                               pulumi.ResourceOptions(parent=self, protect=d.vm.protect))
        self.vmid = self.guest.vmid
        self.status = self.guest.status
        self.pending = self.guest.pending
        self.hostpci = {k: v for k, v in config.items() if k.startswith('hostpci')}
        self.register_outputs({'vmid': self.vmid, 'status': self.status, 'pending': self.pending})
