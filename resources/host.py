"""ProxmoxHost: the host-level state - IOMMU kernel command line, nvidia module options, the VM's
GPUs bound to vfio-pci by PCI address - and whether the host must reboot to reach it.

Children (all `parent=self`, named `<name>-<role>`):
  <name>-kernel-cmdline   the arguments the command line must carry / must not carry (GRUB or
                          systemd-boot, whichever the host boots with), then update-grub or
                          proxmox-boot-tool refresh
  <name>-nvidia-options   /etc/modprobe.d/gpuhost-nvidia.conf, then update-initramfs -u -k all
  <name>-vfio             driverctl overrides of the VM's GPUs to vfio-pci
  <name>-status           the facts monitoring wants: GPU assignment, IOMMU mode running,
                          reboot_required and its reasons (declared vs running)

Before changing anything, the kernel and vfio steps read the host and stop if a Blackwell GPU
sits in an identity IOMMU domain or the GPU inventory differs from the config.

Destroy leaves these host-level settings in place (retain_on_delete): undoing them needs a reboot
and hands GPUs back to other drivers, which is an operator's decision, not a side effect of
`pulumi destroy`. docs/operator-guide.md, "What destroy does".
"""

from __future__ import annotations

import re
import time


from transport import remote
from transport import operator
from hostscripts.host_state import assignment, reboot_reasons
from resources.fields import B, I, ROLLOUT, S, SERVICE, arr, mapof, obj, optional
from grammar import cmdline
from resources.sglang import changed_lines
from resources.resource import CheckResult
from resources.state import GpuhostResource, ObservedProvider
from transport.operator import OperatorError, info, warn

GRUB_FILE = '/etc/default/grub'
SYSTEMD_BOOT_FILE = '/etc/kernel/cmdline'
MODPROBE_FILE = '/etc/modprobe.d/gpuhost-nvidia.conf'


class HostStateError(OperatorError):
    pass


# ------------------------------------------------------------------ pure logic

GRUB_VAR_RE = r'^\s*(?:export\s+)?%s='


def grub_quote(value: str) -> str:
    """A value for a double-quoted assignment in a shell-sourced file: \\ " $ ` escaped."""
    return '"%s"' % re.sub(r'([\\"$`])', r'\\\1', value)


def grub_with(text: str, values: dict) -> str:
    """/etc/default/grub with each variable in `values` set (the last assignment wins in shell, so
    that is the one replaced; one is appended if there is none). Other lines stay as they are."""
    lines = text.splitlines()
    for var, value in values.items():
        line = '%s=%s' % (var, grub_quote(value))
        idx = [i for i, x in enumerate(lines) if re.match(GRUB_VAR_RE % re.escape(var), x)]
        if idx:
            lines[idx[-1]] = line
        else:
            lines.append(line)
    return '\n'.join(lines) + '\n'


# What update-grub puts in front of GRUB's variables (BOOT_IMAGE=..., root=...), in bytes.
GRUB_PREFIX_RESERVE = 100


def check_length(line: str, reserve: int = 0) -> None:
    """The kernel keeps only COMMAND_LINE_MAX bytes of its command line: whatever is beyond - possibly the
    IOMMU settings this program adds - would be silently dropped at boot."""
    size = len(line.encode()) + reserve
    if size > cmdline.COMMAND_LINE_MAX:
        raise HostStateError('the kernel command line would be %d bytes, but the kernel keeps only %d and drops the '
                             'rest (the IOMMU settings among them); shorten gpuhost:iommu.extra_kernel_args or the '
                             'host\'s own arguments. Nothing was changed.' % (size, cmdline.COMMAND_LINE_MAX))


def plan_cmdline(facts: remote.HostFacts, ensure: list, policy: dict) -> dict:
    """What the configured command line must become: {file-level edits} or {} when it is right.
    systemd-boot: {'line': ...}; GRUB: {'GRUB_CMDLINE_LINUX': ..., 'GRUB_CMDLINE_LINUX_DEFAULT': ...}
    (both variables are checked: the kernel gets LINUX followed by DEFAULT). Raises HostStateError
    when a dangerous parameter comes from a file this program does not edit (/etc/default/grub.d)."""
    if facts.boot == 'systemd-boot':
        words = cmdline.split(facts.configured)
        new = cmdline.edit(words, ensure, policy)
        check_length(cmdline.join(new))
        return {} if new == words else {'line': cmdline.join(new)}
    lw, dw = cmdline.split(facts.grub_linux), cmdline.split(facts.grub_default)
    elsewhere = [w for w, _ in cmdline.dangers(cmdline.split(facts.configured), policy) if w not in lw + dw]
    if elsewhere:
        raise HostStateError('the GRUB command line gets %s from a file under /etc/default/grub.d/ (sourced after '
                             '/etc/default/grub): %s. Remove it there, then re-run; nothing was changed.' % (
                                 ' '.join(elsewhere), cmdline.dangers(cmdline.split(facts.configured), policy)[0][1]))
    new_l = cmdline.edit(lw, ensure, policy, add=False)
    new_d = cmdline.edit(dw, ensure, policy, add=False)
    new_d += [a for a in ensure if not cmdline.has(new_l + new_d, a)]
    check_length(cmdline.join(new_l + new_d), reserve=GRUB_PREFIX_RESERVE)
    out = {}
    if new_l != lw:
        out['GRUB_CMDLINE_LINUX'] = cmdline.join(new_l)
    if new_d != dw:
        out['GRUB_CMDLINE_LINUX_DEFAULT'] = cmdline.join(new_d)
    return out


def check_inventory(facts: remote.HostFacts, inventory: list, blackwell_ids: list) -> None:
    """Stop before any change if the host is not the one the config describes, or if a Blackwell
    GPU already sits in an identity domain (its FSP will not boot again without a power cycle)."""
    check_identity(facts, blackwell_ids)
    problems = inventory_problems(facts, inventory)
    if problems:
        raise HostStateError('the host does not match the config:\n  - ' + '\n  - '.join(problems))


def inventory_problems(facts: remote.HostFacts, inventory: list) -> list:
    """Each GPU of the inventory that is not at its address with its ID and NUMA node, as a sentence."""
    problems = []
    for gpu in inventory:
        got = facts.gpus.get(gpu['address'])
        if got is None:
            problems.append('gpuhost:host.gpus: %s is not a GPU on this host (found: %s)' % (
                gpu['address'], ', '.join(sorted(facts.gpus)) or 'none'))
            continue
        if got.id != gpu['id']:
            problems.append('gpuhost:host.gpus: %s is %s on the host, config says %s; fix the id' % (
                gpu['address'], got.id, gpu['id']))
        if got.numa != gpu['numa']:
            problems.append('gpuhost:host.gpus: %s sits on NUMA node %d on the host, config says %d' % (
                gpu['address'], got.numa, gpu['numa']))
    return problems


def check_identity(facts: remote.HostFacts, blackwell_ids: list) -> None:
    identity = sorted(g.address for g in facts.gpus.values() if g.group_type == 'identity' and g.id in blackwell_ids)
    if identity:
        raise HostStateError(
            'host has Blackwell GPUs in identity IOMMU domains: %s. Stopping before any change: identity domains '
            'brick these GPUs (FSP error 0x177) until a power cycle. Remove iommu=pt / iommu.passthrough=1 from the '
            'command line, power-cycle the host (a warm reboot does not clear it), then re-run.' % ', '.join(identity))


def host_expect(d) -> dict:
    """The declared host state the running one is compared with (host_state.reboot_reasons): by
    HostStatus at every run, and by the collector on the host every 30 s (its config file)."""
    return {'ensure_args': d.iommu.kernel_args(), 'policy': d.kernel_policy(), 'domain': d.iommu.domain,
            'nvidia_params': {'DmaRemapPeerMmio': str(d.nvidia.dma_remap_peer_mmio)},
            'vfio_devices': list(d.vm.gpus) if d.vm else [], 'container_devices': list(d.container.gpus)}


def modprobe_content(dma_remap_peer_mmio: int) -> str:
    from resources.render import render
    return render('gpuhost-nvidia.conf.j2', dma_remap_peer_mmio=dma_remap_peer_mmio)


GPU_MODULES = ('nvidia', 'nvidia_uvm', 'nvidia_modeset', 'vfio', 'vfio_pci', 'vfio_iommu_type1')


def modprobe_conflicts(facts: remote.HostFacts, dma_remap_peer_mmio: int) -> list:
    """'<file>:<line>: <text> - <why>' for each line of modprobe's configuration outside this program's
    files that would undo, at the next boot, what it sets: binding by ID, a GPU module blacklisted or
    replaced, a contradicting nvidia option."""
    out = []
    for path, text in facts.modprobe:
        lineno, _, line = text.partition(':')
        words = line.split()
        if len(words) < 2:
            continue
        verb, module, rest = words[0], words[1].replace('-', '_'), words[2:]
        why = None
        if verb == 'options' and module in ('vfio_pci', 'pci_stub') and any(w.startswith('ids=') for w in rest):
            why = ('binds GPUs by vendor:device ID at boot, and all eight share one ID, so it takes the container\'s '
                   'GPUs too (the VM\'s are bound by PCI address)')
        elif verb == 'blacklist' and module in GPU_MODULES:
            why = 'keeps %s from loading at boot' % words[1]
        elif verb == 'install' and module in GPU_MODULES:
            why = 'replaces loading %s with another command' % words[1]
        elif verb == 'options' and module == 'nvidia':
            for w in rest:
                k, _, v = w.partition('=')
                if k == 'NVreg_DmaRemapPeerMmio' and v != str(dma_remap_peer_mmio):
                    why = ('sets NVreg_DmaRemapPeerMmio=%s against gpuhost:nvidia.dma_remap_peer_mmio: %d (%s)'
                           % (v, dma_remap_peer_mmio, MODPROBE_FILE))
        if why:
            out.append('%s:%s: %s - %s' % (path, lineno, line.strip(), why))
    return out


def modprobe_stop(conflicts: list) -> str:
    return ('modprobe configuration outside this program would undo its GPU settings at the next boot: %s. Remove '
            'or fix %s (then update-initramfs -u -k all) and re-run; nothing was changed.' % (
                '; '.join(conflicts), 'those lines' if len(conflicts) > 1 else 'that line'))


def read_facts(target: remote.Target, files=(), pci=()) -> remote.HostFacts:
    """The host's facts; `files`: paths whose hash to read, `pci`: addresses whose device to describe
    (facts.pci), whatever sits there - one SSH command either way."""
    return remote.parse_facts(remote.run(target, 'host_facts.sh', list(files) + list(pci)).stdout)


POST_STEPS = {'initramfs': 'update-initramfs -u -k all', 'boot-systemd': 'proxmox-boot-tool refresh',
              'boot-grub': 'update-grub', 'none': None}


def adopting(olds, news) -> bool:
    """A host resource of a deployment being adopted (gpuhost:container.adopt or gpuhost:vm.adopt) that the
    stack does not hold yet: its check says at preview what `up` will do to what the host already has.
    (Host resources never fail on what exists: they read before they write, so they need no switch.)"""
    return not olds and bool(news.get('adopt')) and isinstance(news.get('connection'), dict)


# ------------------------------------------------------------------- providers

# One of gpuhost:host.gpus: what every host resource checks the host against before it writes (check_inventory),
# with the Blackwell IDs of the program, and whether the deployment is being adopted (never compared).
INVENTORY_GPU = obj('InventoryGpu', address=S, id=S, numa=I)
HOST_CHECKS = {'inventory': arr(INVENTORY_GPU), 'blackwell_ids': arr(S), 'adopt': B}
KERNEL_POLICY = obj('KernelPolicy', vfio=B, blackwell=B, snp=B)


class KernelCmdlineProvider(ObservedProvider):
    """The configured command line (what the next boot uses) carries every `ensure_args` parameter
    with its value and no dangerous parameter (grammar/cmdline.py, in any spelling the kernel
    accepts). Observed: which ensured parameters are in effect, which dangerous ones are present."""
    ID = 'kernel-cmdline'
    DESIRED = ('ensure_args', 'dangerous_args')
    INPUTS = {'ensure_args': arr(S), 'dangerous_args': arr(S), 'policy': KERNEL_POLICY, **HOST_CHECKS}
    OUTPUTS = {'boot': S, 'configured': S, 'running': S, 'applied': S}

    def observe(self, facts, props):
        configured = cmdline.split(facts.configured)
        # Written but never installed for the next boot (the refresh step was cut short): not done.
        pending = any(f in facts.pending for f in (SYSTEMD_BOOT_FILE, GRUB_FILE))
        return {
            'ensure_args': [] if pending else [a for a in props['ensure_args'] if cmdline.has(configured, a)],
            'dangerous_args': [w for w, _ in cmdline.dangers(configured, props['policy'])],
            'boot': facts.boot,
            'configured': facts.configured,
            'running': facts.running,
        }

    def where(self, facts, words):
        """Which file (and GRUB variable) holds these words: who may have put them there."""
        if facts.boot == 'systemd-boot':
            return SYSTEMD_BOOT_FILE
        vars_ = [v for v, line in (('GRUB_CMDLINE_LINUX', facts.grub_linux), ('GRUB_CMDLINE_LINUX_DEFAULT',
                                                                            facts.grub_default))
                 if any(w in cmdline.split(line) for w in words)]
        return '%s (%s)' % (GRUB_FILE, ', '.join(vars_) or 'a file under /etc/default/grub.d')

    def apply(self, props):
        target = remote.Target.from_inputs(props['connection'])
        facts = read_facts(target, [SYSTEMD_BOOT_FILE, GRUB_FILE])
        check_inventory(facts, props['inventory'], props['blackwell_ids'])
        plan = plan_cmdline(facts, props['ensure_args'], props['policy'])
        found = cmdline.dangers(cmdline.split(facts.configured), props['policy'])
        if found:
            warn('host-kernel-cmdline: removed %s from %s - not declared, added outside Pulumi: %s' % (
                ' '.join(w for w, _ in found), self.where(facts, [w for w, _ in found]), found[0][1]))
        pending = [f for f in (SYSTEMD_BOOT_FILE, GRUB_FILE) if f in facts.pending]
        if plan or pending:
            if facts.boot == 'systemd-boot':
                # One line, all of it ours to write: the facts carry the file's hash for the CAS.
                line = plan['line'] if plan else facts.configured
                remote.put_file(target, SYSTEMD_BOOT_FILE, line + '\n', '0644',
                                facts.files.get(SYSTEMD_BOOT_FILE) or '-', 'boot-systemd')
            else:
                old = remote.run(target, 'read_file.sh', [GRUB_FILE], check=False)
                if old.exit_code not in (0, 7):
                    raise HostStateError('%s: cannot read %s: %s' % (target.name, GRUB_FILE, old.stderr.strip()))
                remote.put_file(target, GRUB_FILE, grub_with(old.stdout, plan) if plan else old.stdout, '0644',
                                remote.sha256_hex(old.stdout), 'boot-grub')
            facts = read_facts(target, [SYSTEMD_BOOT_FILE, GRUB_FILE])
        out = dict(props, **self.observe(facts, props))
        if out['dangerous_args'] or len(out['ensure_args']) != len(props['ensure_args']):
            raise HostStateError('the configured kernel command line is still not as declared after the edit '
                                 '(%s): %s' % (facts.boot, facts.configured))
        return out

    def check(self, olds, news):
        if adopting(olds, news):
            facts = read_facts(remote.Target.from_inputs(news['connection']), [SYSTEMD_BOOT_FILE, GRUB_FILE])
            plan = plan_cmdline(facts, news['ensure_args'], news['policy'])
            if not plan:
                info('host-kernel-cmdline: the configured kernel command line already carries what is declared: '
                     'adopted as it is')
            else:
                info('host-kernel-cmdline: `up` edits %s: %s, then runs %s; the kernel runs it from the next reboot '
                     '(reboot_required says so)' % (
                         SYSTEMD_BOOT_FILE if facts.boot == 'systemd-boot' else GRUB_FILE,
                         '; '.join('%s -> %s' % (k, v) for k, v in sorted(plan.items())),
                         'proxmox-boot-tool refresh' if facts.boot == 'systemd-boot' else 'update-grub'))
        return CheckResult(news, [])

    def current(self, props):
        facts = read_facts(remote.Target.from_inputs(props['connection']), [SYSTEMD_BOOT_FILE, GRUB_FILE])
        found = cmdline.dangers(cmdline.split(facts.configured), props['policy'])
        if found:
            warn('host-kernel-cmdline: DANGER - the configured kernel command line has %s in %s, added outside '
                 'Pulumi: %s. Do not reboot the host: `pulumi up` removes it first.' % (
                     ' '.join(w for w, _ in found), self.where(facts, [w for w, _ in found]), found[0][1]))
        return self.observe(facts, props)


class HostFileProvider(ObservedProvider):
    """A whole file on the host; `post` (initramfs, boot-systemd, boot-grub) runs when it changes."""
    DESIRED = ('path', 'content', 'mode', 'post')
    REPLACE = ('path',)
    INPUTS = {'path': S, 'content': S, 'mode': S, 'post': S, **HOST_CHECKS}
    OUTPUTS = {'sha256': S, 'applied': S}

    def observe(self, target, props):
        res = remote.run(target, 'read_file.sh', [props['path']], check=False)
        # exit 7: written, but its follow-up step never finished - not done, so the next apply finishes it.
        if res.exit_code not in (0, 4, 7):
            raise HostStateError('%s: cannot read %s: %s' % (target.name, props['path'], res.stderr.strip()[-300:]))
        return {'content': res.stdout if res.exit_code == 0 else None,
                'sha256': remote.sha256_hex(res.stdout) if res.exit_code in (0, 7) else None}

    def apply(self, props):
        target = remote.Target.from_inputs(props['connection'])
        current = self.observe(target, props)
        if current['content'] != props['content']:
            if props.get('inventory'):
                check_inventory(read_facts(target), props['inventory'], props['blackwell_ids'])
            remote.put_file(target, props['path'], props['content'], props['mode'], current['sha256'] or '-',
                            props['post'])
            current = self.observe(target, props)
        return dict(props, **current)

    def resource_id(self, props):
        return props['path']

    def check(self, olds, news):
        if adopting(olds, news):
            current = self.observe(remote.Target.from_inputs(news['connection']), news)
            post = POST_STEPS.get(news['post'])
            if current['content'] == news['content']:
                info('host file %s: exists with the declared content: adopted as it is' % news['path'])
            elif current['content'] is None:
                info('host file %s: absent - `up` writes it%s' % (
                    news['path'], ', then runs %s' % post if post else ''))
            else:
                info('host file %s: exists and differs - `up` replaces it%s. The lines that change:\n    %s' % (
                    news['path'], ', then runs %s' % post if post else '',
                    '\n    '.join(changed_lines(current['content'], news['content']))))
        return CheckResult(news, [])

    def current(self, props):
        return self.observe(remote.Target.from_inputs(props['connection']), props)


def vfio_recovery(bdfs: list, vmid) -> str:
    many = len(bdfs) > 1
    them = 'them' if many else 'it'
    return ('container GPU%s %s %s bound to vfio-pci on the host, not nvidia: something re-bound %s out of band '
            '(driverctl set-override, a VM\'s hostpci). Stopping before any change - a VM started now could take '
            '%s, and the container\'s /dev/nvidiaN numbering no longer matches. To recover: check that no VM uses %s '
            '(qm config <vmid> | grep hostpci), then on the host run `%s`, confirm with `readlink '
            '/sys/bus/pci/devices/<address>/driver` (nvidia), restart container %s (pct reboot %s) and re-run.' % (
                's' if many else '', ', '.join(bdfs), 'are' if many else 'is', them, them, them,
                ' && '.join('driverctl unset-override %s' % b for b in bdfs), vmid, vmid))


class VfioProvider(ObservedProvider):
    """GPU bindings, both sides: the VM's GPUs on vfio-pci by PCI address (driverctl override, so it
    survives reboots), the container's on nvidia with no override. A VM GPU elsewhere is re-bound (and
    said so); a container GPU on vfio-pci stops the run with the steps to recover."""
    DESIRED = ('driver', 'devices', 'container_devices', 'modprobe_conflicts')
    INPUTS = {'driver': S, 'devices': arr(S), 'container_devices': arr(S), 'modprobe_conflicts': arr(S),
              'container_vmid': I, 'dma_remap_peer_mmio': I, 'fleet_host': optional(S), **HOST_CHECKS}
    OUTPUTS = {'overrides': mapof(S), 'bound': mapof(S), 'applied': S}

    def observe(self, facts, props):
        ok = [b for b in props['devices'] if facts.overrides.get(b) == props['driver']
              and facts.gpus.get(b) is not None and facts.gpus[b].driver == props['driver']]
        ct = props.get('container_devices') or []
        ct_ok = [b for b in ct if facts.gpus.get(b) is not None and facts.gpus[b].driver == 'nvidia'
                 and b not in facts.overrides]
        return {'devices': ok, 'container_devices': ct_ok, 'overrides': dict(sorted(facts.overrides.items())),
                'bound': {b: facts.gpus[b].driver for b in list(props['devices']) + list(ct) if b in facts.gpus},
                'modprobe_conflicts': modprobe_conflicts(facts, props.get('dma_remap_peer_mmio', 1))}

    def apply(self, props):
        target = remote.Target.from_inputs(props['connection'])
        facts = read_facts(target)
        check_inventory(facts, props['inventory'], props['blackwell_ids'])
        on_vfio = [b for b in props.get('container_devices') or [] if facts.gpus.get(b) is not None and
                   (facts.gpus[b].driver == 'vfio-pci' or facts.overrides.get(b) == 'vfio-pci')]
        if on_vfio:
            raise HostStateError(vfio_recovery(on_vfio, props.get('container_vmid')))
        conflicts = modprobe_conflicts(facts, props.get('dma_remap_peer_mmio', 1))
        if conflicts:
            raise HostStateError(modprobe_stop(conflicts))
        todo = [b for b in props['devices'] if b not in self.observe(facts, props)['devices']]
        if todo:
            was = {b: facts.gpus[b].driver if b in facts.gpus else None for b in todo}
            remote.run(target, 'vfio_bind.sh', [props['driver']] + todo)
            facts = read_facts(target)
            moved = ['%s (was %s)' % (b, d or 'unbound') for b, d in sorted(was.items()) if d not in (None, props['driver'])]
            if moved:
                warn('host-vfio: re-bound the VM\'s GPU%s %s to %s by PCI address; bound to another driver, %s '
                     'shifted the nvidia driver\'s /dev/nvidiaN numbering' % (
                         's' if len(moved) > 1 else '', ', '.join(moved), props['driver'],
                         'they' if len(moved) > 1 else 'it'))
        return dict(props, **self.observe(facts, props))

    def resource_id(self, props):
        return 'vfio-' + props['driver']

    def check(self, olds, news):
        if adopting(olds, news):
            observed = self.observe(read_facts(remote.Target.from_inputs(news['connection'])), news)
            todo = [b for b in news['devices'] if b not in observed['devices']]
            info('host-vfio: %s' % ('`up` binds the VM\'s GPU%s %s to %s by PCI address (driverctl)' % (
                's' if len(todo) > 1 else '', ', '.join(todo), news['driver']) if todo else
                'the VM\'s GPUs are bound to %s already: adopted as they are' % news['driver']))
        return CheckResult(news, [])

    def current(self, props):
        facts = read_facts(remote.Target.from_inputs(props['connection']))
        out = self.observe(facts, props)
        wrong = [b for b in props.get('container_devices') or [] if b not in out['container_devices']]
        if wrong:
            warn('host-vfio: DANGER - container GPU%s %s found bound to %s (declared: nvidia). `pulumi up` will stop '
                 'before any change and print the steps to recover.' % (
                     's' if len(wrong) > 1 else '', ', '.join(wrong),
                     ', '.join(sorted({str(out['bound'].get(b)) for b in wrong}))))
        for line in out['modprobe_conflicts']:
            warn('host-vfio: DANGER - %s. `pulumi up` will stop before any change.' % line)
        return out


class HostStatusProvider(ObservedProvider):
    """Read-only: what the host is running compared with what is declared. `expect` changes whenever
    any declared host setting does, so the status is re-read exactly when something could differ."""
    ID = 'status'
    DESIRED = ('expect', 'observed')
    ROLLOUT_STEP = 'its host status and reboot'   # with host.reboot: when-required it gates the rollout
    # expect: host_expect(); observed: the host resources' `applied` tokens; reboot: gpuhost:host.reboot.
    INPUTS = {'expect': obj('HostExpect', ensure_args=arr(S), policy=KERNEL_POLICY, domain=S, nvidia_params=mapof(S),
                            vfio_devices=arr(S), container_devices=arr(S)),
              'observed': arr(S), 'reboot': S, 'service': SERVICE, 'rollout': optional(ROLLOUT)}
    OUTPUTS = {'gpus': mapof(obj('HostGpu', assigned_to=S, id=S, numa=I, driver=optional(S), iommu_group=optional(I),
                                 iommu_group_type=optional(S), minor=optional(I))),
               'iommu_domain_types': arr(S), 'boot': S, 'running_cmdline': S, 'reboot_required': B,
               'reboot_reasons': arr(S), 'nvidia_params': mapof(S),
               # the host's boot (/proc/sys/kernel/random/boot_id): the SGLang unit proves its GPUs again after a new one
               'boot_id': optional(S)}

    def goes_down(self, props) -> bool:
        """Whether an update may stop the host's SGLang (provider/rollout.py): only a reboot does."""
        return props.get('reboot') == 'when-required'

    def observe(self, target, props):
        facts = read_facts(target)
        expect = props['expect']
        reasons = reboot_reasons(facts, expect)
        gpus = {g.address: {'assigned_to': assignment(g.address, expect), 'numa': g.numa, 'driver': g.driver,
                            'id': g.id, 'iommu_group': g.group, 'iommu_group_type': g.group_type, 'minor': g.minor}
                for g in sorted(facts.gpus.values(), key=lambda g: g.address)}
        types = sorted({g.group_type for g in facts.gpus.values() if g.group_type})
        return {'gpus': gpus, 'iommu_domain_types': types, 'boot': facts.boot, 'running_cmdline': facts.running,
                'reboot_required': bool(reasons), 'reboot_reasons': reasons,
                'nvidia_params': {k: facts.params[k] for k in sorted(facts.params)}, 'boot_id': facts.boot_id}

    def apply(self, props):
        target = remote.Target.from_inputs(props['connection'])
        status = self.observe(target, props)
        if status['reboot_required'] and props.get('reboot') == 'when-required':
            from resources.sglang import serving_now, verify_after_reboot
            was_serving = bool(props.get('service')) and serving_now(target, props['service'])
            reboot_and_wait(target)
            if props.get('service'):
                verify_after_reboot(target, props['service'], required=was_serving)
            status = self.observe(target, props)
            if status['reboot_required']:
                raise HostStateError('host rebooted but still differs from the declared state: ' +
                                     '; '.join(status['reboot_reasons']))
        return dict(props, **status)

    def current(self, props):
        return self.observe(remote.Target.from_inputs(props['connection']), props)


def reboot_and_wait(target: remote.Target, timeout: float = 900.0) -> None:
    """Reboot, then wait until SSH answers with a new boot (the running command line is re-read by
    the caller). The SSH session may drop mid-command: that is what a reboot does."""
    before = remote.run(target, 'read_file.sh', ['/proc/sys/kernel/random/boot_id'], check=False).stdout
    try:
        remote.run(target, 'reboot.sh', [], check=False, timeout=30)
    except remote.RemoteError:
        pass
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            now = remote.run(target, 'read_file.sh', ['/proc/sys/kernel/random/boot_id'], check=False).stdout
            if now != before or not before:
                return
        except remote.RemoteError:
            pass
        operator.pause(2, 'host %s' % target.host, 'it to come back from its reboot',
                    'it goes on booting, and the next `pulumi up` carries on from there')
    raise HostStateError('host %s did not come back over SSH within %d s after reboot' % (target.host, timeout))



# ------------------------------------------------------------------- resources

class _HostResource(GpuhostResource):
    """A host-level resource; `outputs` names the extra facts it reports."""

    def __init__(self, name, props, opts, outputs=()):
        super().__init__(name, dict({k: None for k in outputs}, **props), opts)


class KernelCmdline(_HostResource, name='KernelCmdline'):
    pass


class HostFile(_HostResource, name='HostFile'):
    pass


class VfioBinding(_HostResource, name='VfioBinding'):
    pass


class HostStatus(_HostResource, name='HostStatus'):
    pass
