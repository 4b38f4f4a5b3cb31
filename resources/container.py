"""GpuContainer: the LXC container that runs SGLang, with the NUMA0 GPUs passed in as devN entries.

Decided here: the container's Proxmox config (devN for each GPU's /dev/nvidiaN plus the nvidia
control devices; network; cores and memory), what cannot change in place (`create`: template,
rootfs, unprivileged - a change replaces the container, and preview says so), and the CPU pinning
to the GPUs' NUMA node as a raw lxc.cgroup2.cpuset.cpus line, which only the host's config file
can hold. devN is root@pam-only in Proxmox; config/deployment.py refuses API tokens for that reason.
"""

from __future__ import annotations



from resources import pve
from transport import remote
from resources.fields import ROLLOUT, SERVICE, S, mapof, optional
from grammar.pve import split_props


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
            from resources.sglang import verify_after_reboot
            verify_after_reboot(remote.Target.from_inputs(news['connection']), news['service'])
        return result
