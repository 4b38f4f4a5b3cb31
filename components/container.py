"""GpuContainer: the LXC container that runs SGLang, with the NUMA0 GPUs passed in as devN entries.

Decided here: the container's Proxmox config (devN for each GPU's /dev/nvidiaN plus the nvidia
control devices; network; cores and memory), what cannot change in place (`create`: template,
rootfs, unprivileged - a change replaces the container, and preview says so), and the CPU pinning
to the GPUs' NUMA node as a raw lxc.cgroup2.cpuset.cpus line, which only the host's config file
can hold. devN is root@pam-only in Proxmox; config/deployment.py refuses API tokens for that reason.
"""

from __future__ import annotations

import pulumi

import hashlib
import json

from components import pve, remote
from components.fields import ROLLOUT, SERVICE, S, mapof, optional
from grammar.pve import split_props
from components.sglang import service_props


class ContainerProvider(pve.PveGuestProvider):
    """PveGuest for LXC, plus checks Proxmox does not make: every devN node exists on the host, and
    each container GPU really is the /dev/nvidiaN its entry names (the driver numbers GPUs itself)."""

    # gpu_devices: {PCI address: the /dev/nvidiaN its devN entry names}; service: the SGLang service the container
    # runs, checked when this run starts the container; rollout: a fleet's (GpuContainer).
    INPUTS = dict(pve.GUEST_INPUTS, gpu_devices=mapof(S), service=SERVICE, rollout=optional(ROLLOUT))

    def check_devices(self, props):
        target = remote.Target.from_inputs(props['connection'])
        paths = [split_props(v)[0] or split_props(v)[1].get('path')
                 for k, v in sorted(props['config'].items()) if k.startswith('dev')]
        res = remote.run(target, 'check_devices.sh', paths, check=False)
        if res.exit_code != 0:
            missing = [line.split(' ', 1)[1] for line in res.stdout.splitlines() if line.startswith('missing ')]
            raise pve.PveError('container %s: device nodes missing on the host: %s. Is the nvidia driver loaded '
                               '(nvidia-smi; modprobe nvidia-uvm)?' % (props['vmid'], ', '.join(missing)))
        facts = remote.parse_facts(remote.run(target, 'host_facts.sh').stdout)
        wrong = []
        for bdf, node in sorted(props['gpu_devices'].items()):
            gpu = facts.gpus.get(bdf)
            want = int(node.replace('/dev/nvidia', ''))
            if gpu is None or gpu.driver != 'nvidia':
                wrong.append('%s is not bound to nvidia (%s)' % (bdf, gpu.driver if gpu else 'absent'))
            elif gpu.minor is not None and gpu.minor != want:
                wrong.append('%s is /dev/nvidia%d on the host, the container entry says %s' % (bdf, gpu.minor, node))
        if wrong:
            raise pve.PveError('container %s: GPU device nodes do not match the PCI addresses: %s. Bind the VM\'s GPUs '
                               'to vfio-pci and reboot first (reboot_required output), or fix gpuhost:container.gpus'
                               % (props['vmid'], '; '.join(wrong)))

    ROLLOUT_STEP = 'its container'   # a failed step names where a fleet's rollout stopped (state.rollout_note)

    def create(self, props):
        self.check_devices(props)
        return super().create(props)

    def update(self, id_, olds, news):
        self.check_devices(news)
        result = super().update(id_, olds, news)
        outs = result.outs
        if news.get('service') and outs.get('status') == 'running' and outs.get('pid') != olds.get('pid'):
            # This run started or rebooted the container: its SGLang unit starts with it, and the run
            # ends only when it serves again (/health, then /server_info).
            from components.sglang import verify_after_reboot
            verify_after_reboot(remote.Target.from_inputs(news['connection']), news['service'])
        return result


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
