"""make render STACK=<name> OUT=<dir>: every file the stack would put on its hosts, written to a folder
without contacting any host (and without decrypting secrets: rendering needs none).

    python -m tools.render lab render/lab
"""

from __future__ import annotations

import json
import os
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import config  # noqa: E402
from grammar import cmdline  # noqa: E402
from resources.host import modprobe_content  # noqa: E402
from components.monitoring import collector_files  # noqa: E402
from resources.sglang import unit_text  # noqa: E402


def load_fleet(stack: str, project: str = ROOT) -> config.Fleet:
    """The stack's hosts from <project>/Pulumi.<stack>.yaml (secure: values replaced by a placeholder:
    nothing rendered here depends on a secret). A one-host stack is a fleet of one without a name."""
    with open(os.path.join(project, 'Pulumi.%s.yaml' % stack)) as f:
        doc = yaml.safe_load(f) or {}
    data = {}
    for key, value in (doc.get('config') or {}).items():
        ns, _, name = key.partition(':')
        if ns == 'gpuhost':
            data[name] = strip_secure(value)
    return config.parse_fleet(data)


def load(stack: str, project: str = ROOT) -> config.Deployment:
    fleet = load_fleet(stack, project)
    if fleet.is_fleet:
        raise config.ConfigError('stack %s lists hosts (gpuhost:hosts); use load_fleet' % stack)
    return fleet.hosts[0].deployment


def strip_secure(value):
    """secure: leaves become a placeholder: nothing rendered here depends on a secret."""
    if isinstance(value, dict):
        if set(value) == {'secure'}:
            return 'redacted-secret-placeholder'  # valid wherever a secret goes (e.g. an API key's grammar)
        return {k: strip_secure(v) for k, v in value.items()}
    if isinstance(value, list):
        return [strip_secure(v) for v in value]
    return value


def files(d: config.Deployment, runtime_files=None) -> dict:
    """relative path under OUT -> content. runtime_files: config.runtime_inputs() of a stack that manages
    the Python environment (the unit runs from its directory)."""
    from resources.runtime import environment
    from components.container import raw_lxc_lines
    from components.vm import vm_config
    args = d.iommu.kernel_args()
    out = {
        'host/etc/modprobe.d/gpuhost-nvidia.conf': modprobe_content(d.nvidia.dma_remap_peer_mmio),
        'host/kernel-cmdline-args.txt': (
            '# Arguments the kernel command line must carry (added to /etc/kernel/cmdline on systemd-boot hosts,\n'
            '# GRUB_CMDLINE_LINUX_DEFAULT in /etc/default/grub on GRUB hosts); the rest of the line is kept.\n'
            + '\n'.join(args) + '\n# Removed wherever found, in any spelling the kernel accepts: identity/passthrough\n'
            '# (iommu=pt, iommu.passthrough=<true>), IOMMU off, vfio-pci.ids/pci-stub.ids, blacklisted GPU modules.\n'),
        'host/etc/kernel/cmdline.example': cmdline.join(cmdline.edit(['root=ZFS=rpool/ROOT/pve-1', 'boot=zfs', 'quiet'],
                                                                     args, d.kernel_policy())) + '\n',
        'container/etc/systemd/system/%s' % d.sglang.unit: unit_text(d, environment(d, runtime_files)),
    }
    if d.vm:
        out['host/etc/driverctl.d/README'] = 'driverctl set-override <address> vfio-pci, one file per GPU:\n'
        for bdf in d.vm.gpus:
            out['host/etc/driverctl.d/pci-%s' % bdf] = 'vfio-pci\n'
        out['host/etc/pve/qemu-server/%d.conf.api' % d.vm.vmid] = ''.join(
            '%s: %s\n' % kv for kv in sorted(vm_config(d).items()))
        if d.vm.mapping_ids():
            from components.vm import mapping_props
            from grammar.pve import map_entry
            maps = mapping_props(d)['mappings']
            out['host/etc/pve/mapping/pci.cfg.api'] = (
                '# PCI resource mappings (POST /cluster/mapping/pci), one per VM GPU, in pci.cfg\'s layout.\n'
                '# Each entry also records subsystem-id and iommugroup, read from the device at the address when\n'
                '# it is written.\n'
                + ''.join('%s\n\tmap %s\n\n' % (mid, map_entry(dict(node=d.host.node, **maps[mid])))
                          for mid in sorted(maps)))
    ct = d.container
    out['host/etc/pve/lxc/%d.conf.raw-lines' % ct.vmid] = ''.join('%s: %s\n' % kv for kv in raw_lxc_lines(d).items())
    out['host/etc/pve/lxc/%d.conf.devices' % ct.vmid] = ''.join(
        '%s: %s\n' % kv for kv in sorted(d.container_devices().items(), key=lambda kv: int(kv[0][3:])))
    out['launch_args.json'] = json.dumps(d.launch_args(), indent=2) + '\n'
    # The collector: its script, its declared state, its service and timer (resources/monitoring.py).
    for path, (content, _mode) in collector_files(d).items():
        out['host' + path] = content
    return out


def main(argv, project=ROOT):
    """project: the directory holding Pulumi.<stack>.yaml and the files it names (locks, patches)."""
    if len(argv) != 2:
        sys.exit('usage: python -m tools.render STACK OUT')
    stack, out_dir = argv
    try:
        fleet = load_fleet(stack, project)
    except config.ConfigError as e:
        sys.exit(str(e))
    for h in fleet.hosts:
        # A fleet: each host's files under OUT/<host>/.
        where = os.path.join(out_dir, h.name) if fleet.is_fleet else out_dir
        for warning in h.deployment.warnings:
            print('warning: %s%s' % ('host %s: ' % h.name if fleet.is_fleet else '', warning), file=sys.stderr)
        try:
            runtime_files = config.runtime_inputs(h.deployment, project, read_secrets=False)
        except config.ConfigError as e:
            sys.exit(str(e))
        for rel, content in sorted(files(h.deployment, runtime_files).items()):
            path = os.path.join(where, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, 'w') as f:
                f.write(content)
            print(path)


if __name__ == '__main__':
    main(sys.argv[1:])
