"""The host as the program composes it: ProxmoxHost, the kernel command line, the nvidia/vfio options and the host's
status as one component. Its resources' serving classes are resources/host.py's."""

from __future__ import annotations

import pulumi
from grammar.gpu import BLACKWELL_IDS
from resources.sglang import service_props

from resources.host import MODPROBE_FILE, HostFile, HostFileProvider, HostStatus, HostStatusProvider, KernelCmdline, \
    KernelCmdlineProvider, VfioBinding, VfioProvider, host_expect, modprobe_content
from resources.driver import NvidiaDriver, NvidiaDriverProvider
from resources.state import moved


class ProxmoxHost(pulumi.ComponentResource):
    """See the module docstring. Outputs: reboot_required, reboot_reasons, gpus, iommu_domain_types,
    running_cmdline, boot."""

    def __init__(self, name: str, deployment, opts=None, rollout=None, fleet_host=None):
        super().__init__('gpuhost:index:ProxmoxHost', name, None, opts)
        d = deployment
        child = pulumi.ResourceOptions(parent=self, retain_on_delete=True)
        # A deployment being adopted: preview says what `up` does to what the host has (never compared).
        adopt = bool(d.container.adopt or (d.vm and d.vm.adopt))
        inventory = [g.model_dump() for g in d.host.gpus]
        blackwell = sorted(BLACKWELL_IDS)
        ensure = d.iommu.kernel_args()
        policy = d.kernel_policy()
        vfio_devices = list(d.vm.gpus) if d.vm else []

        self.kernel = KernelCmdline('%s-kernel-cmdline' % name, {
            'ensure_args': ensure, 'dangerous_args': [], 'policy': policy,
            'inventory': inventory, 'blackwell_ids': blackwell, 'adopt': adopt}, child,
            outputs=KernelCmdlineProvider.OUTPUTS)
        self.nvidia = HostFile('%s-nvidia-options' % name, {
            'path': MODPROBE_FILE, 'mode': '0644', 'post': 'initramfs',
            'content': modprobe_content(d.nvidia.dma_remap_peer_mmio), 'inventory': inventory,
            'blackwell_ids': blackwell, 'adopt': adopt}, child, outputs=HostFileProvider.OUTPUTS)
        self.vfio = VfioBinding('%s-vfio' % name, {
            'driver': 'vfio-pci', 'devices': vfio_devices,
            'container_devices': list(d.container.gpus), 'container_vmid': d.container.vmid,
            'modprobe_conflicts': [], 'dma_remap_peer_mmio': d.nvidia.dma_remap_peer_mmio,
            'inventory': inventory, 'blackwell_ids': blackwell, 'adopt': adopt,
            **({'fleet_host': fleet_host} if fleet_host else {})},
            child, outputs=VfioProvider.OUTPUTS)
        resources = [self.kernel, self.nvidia, self.vfio]
        self.driver = None
        if d.nvidia.driver is not None:
            # The host's driver as declared state (gpuhost:nvidia.driver): after the module's options and the VM's
            # bindings (a load binds only the GPUs vfio-pci does not hold), before the container and SGLang, whose
            # user space follows it.
            drv = d.nvidia.driver
            self.driver = NvidiaDriver('%s-nvidia-driver' % name, {
                'version': drv.version, 'modules': drv.modules, 'kernels_missing': [],
                'installer': {'path': drv.host_path, 'sha256': drv.sha256,
                              **({'source': drv.source} if drv.source else {})},
                # Its mirror's login: to the host's download job on stdin only (resources/runtime.py fetch_installers).
                'installer_tokens': pulumi.Output.secret({'nvidia': {'token': drv.token.get_secret_value()}})
                if drv.token else None,
                'timeout': d.runtime.install_timeout_s, 'stall': d.runtime.stall_timeout_s,
                'container_gpus': list(d.container.gpus), 'vm_gpus': vfio_devices,
                'reboot': d.host.reboot, 'service': service_props(d), **({'rollout': rollout} if rollout else {})},
                pulumi.ResourceOptions(parent=self, retain_on_delete=True, depends_on=[self.nvidia, self.vfio]),
                outputs=NvidiaDriverProvider.OUTPUTS)
            resources.append(self.driver)
        expect = host_expect(d)
        # A token each host resource renews whenever it applies something: then the status is read again
        # at the end of the run, so the outputs describe what the host has after it.
        observed = pulumi.Output.all(*(r.applied for r in resources))
        self.status = HostStatus('%s-status' % name, {
            'expect': expect, 'observed': observed, 'reboot': d.host.reboot,
            'service': service_props(d), **({'rollout': rollout} if rollout else {})},
            # rollout: in a fleet, a reboot (host.reboot: when-required) waits for the host before this one in
            # its rollout lane to serve again (provider/rollout.py).
            pulumi.ResourceOptions(parent=self, depends_on=resources),
            outputs=HostStatusProvider.OUTPUTS)
        self.reboot_required = self.status.reboot_required
        self.reboot_reasons = self.status.reboot_reasons
        self.gpus = self.status.gpus
        self.iommu_domain_types = self.status.iommu_domain_types
        self.running_cmdline = self.status.running_cmdline
        self.boot = self.status.boot
        self.boot_id = self.status.boot_id
        self.register_outputs({'reboot_required': self.reboot_required, 'reboot_reasons': self.reboot_reasons,
                               'gpus': self.gpus, 'iommu_domain_types': self.iommu_domain_types})


def __getattr__(name):
    """Release 0.1.0's name of a serving class, now resources/'s (resources/state.py, RELEASE_0_1_0)."""
    return moved(__name__, name)
