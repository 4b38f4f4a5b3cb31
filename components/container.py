"""The container as the program composes it: GpuContainer, the LXC guest with the GPUs passed through. Its serving class
is resources/container.py's."""

from __future__ import annotations

import pulumi
import hashlib
import json
from resources import pve
from resources.sglang import service_props
from resources.state import moved



def raw_lxc_lines(d) -> dict:
    """cgroup2 cpuset: the container's threads stay on the GPUs' NUMA node. (cpuset.mems is left to
    the kernel's first-touch policy: untested with Proxmox's cgroup setup.)"""
    return {'lxc.cgroup2.cpuset.cpus': d.host.numa_cpus[d.container.numa]}


class GpuContainer(pulumi.ComponentResource):
    """Outputs: vmid, address, status, devices (devN entries), uid (changes when the container is replaced)."""

    def __init__(self, name, deployment, opts=None, fleet_host=None, rollout=None):
        super().__init__('gpuhost:index:GpuContainer', name, None, opts)
        d = deployment
        c = d.container
        net = 'name=eth0,bridge=%s,ip=%s' % (c.bridge, c.ip) + (',gw=%s' % c.gateway if c.gateway else '')
        config = {'hostname': c.hostname, 'cores': c.cores, 'memory': c.memory_mb, 'swap': c.swap_mb,
                  'net0': net, 'onboot': int(c.onboot)}
        if c.nameserver:
            config['nameserver'] = c.nameserver
        devices = d.container_devices()
        config.update(devices)
        # The model storage, bind-mounted read-only (gpuhost:model; root@pam only, like devN).
        config.update(d.container_mounts())
        gpu_devices = {bdf: '/dev/nvidia%d' % i for i, bdf in enumerate(c.gpus)}
        props = {
            'node': d.host.node, 'kind': 'lxc', 'vmid': c.vmid,
            'create': {'ostemplate': c.ostemplate, 'rootfs': '%s:%d' % (c.storage, c.rootfs_gb),
                       'unprivileged': int(c.unprivileged)},
            'config': config, 'start': True, 'protect': c.protect, 'adopt': c.adopt, 'service': service_props(d),
            'raw_lxc': raw_lxc_lines(d),
            'gpu_devices': gpu_devices,
            **dict.fromkeys(pve.PveGuestProvider.OUTPUTS),
        }
        if fleet_host:
            props['fleet_host'] = fleet_host
        if rollout:
            # Not compared by diff: a change waits for the host before this one in its rollout lane (it may
            # restart SGLang: provider/rollout.py), and the message when this step fails says where it stopped.
            props['rollout'] = rollout
        self.guest = pve.Guest('%s-lxc' % name, props, pulumi.ResourceOptions(parent=self, protect=c.protect))
        self.vmid = self.guest.vmid
        self.status = self.guest.status
        self.uid = self.guest.uid
        # Which container this is, known at preview: it changes exactly when a create-only key does
        # (the container is replaced), so the service depends on nothing else of the container.
        self.identity = hashlib.sha256(json.dumps([d.host.node, c.vmid, props['create']], sort_keys=True)
                                       .encode()).hexdigest()[:16]
        self.address = c.address
        self.devices = devices
        self.register_outputs({'vmid': self.vmid, 'status': self.status, 'uid': self.uid})


def __getattr__(name):
    """Release 0.1.0's name of a serving class, now resources/'s (resources/state.py, RELEASE_0_1_0)."""
    return moved(__name__, name)
