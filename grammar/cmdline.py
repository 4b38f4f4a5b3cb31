"""The kernel command line as the kernel reads it, and what this program allows on it.

Checking arguments as strings let `iommu.passthrough=true`, `"quiet iommu=pt"` (two parameters in one
list item) and `vfio-pci.ids=...` through. Everything here follows the kernel's own rules instead:

  * splitting: kernel/params.c next_arg() - whitespace separates, double quotes group (and are
    dropped around a value), `--` ends the kernel's part (the rest goes to init);
  * names: parameq() treats `-` and `_` alike (`vfio-pci.ids` is `vfio_pci.ids`);
  * booleans: kstrtobool() looks at the first character(s): 1/y/Y/t/T and "on" are true,
    0/n/N/f/F and "off" are false (so `iommu.passthrough=yes`, `=true`, `=On` all mean identity);
  * `iommu=` (arch/x86/kernel/pci-dma.c) and `amd_iommu=` (amd/init.c) take comma lists whose
    items are matched by prefix (strncmp): `iommu=pt,nofoo` and `iommu=ptx` both mean passthrough;
    the last IOMMU setting on the line wins.

Pure functions only (golden-tested); the host side reads and writes the line, see host.py.
"""

from __future__ import annotations

import re
from typing import Optional

# One parameter as this program writes it: a name, optionally `=` and a value without whitespace,
# quotes, backslashes, `$` or backticks (the GRUB file is sourced by a shell; systemd-boot's line
# is read by the kernel's splitter).
ARG_RE = re.compile(r'^[A-Za-z0-9_.\-]+(=[A-Za-z0-9_.,:/=+@%~^*!?#&\[\]{}\-]*)?$')

# Set by the program from gpuhost:iommu.domain; nowhere else.
MANAGED = ('iommu', 'iommu.passthrough', 'iommu.strict')
# Written by the boot loader / the host's installer, never by this program.
BOOT_OWNED = ('root', 'rootfstype', 'rootflags', 'boot', 'ro', 'rw', 'init', 'initrd', 'BOOT_IMAGE',
              'rootdelay', 'rootwait')
# Parameters that legitimately appear several times: a new value is added, others are kept.
REPEATABLE = ('console',)
NVIDIA_MANAGED = ('nvidia.NVreg_DmaRemapPeerMmio',)
BLACKLISTS = ('module_blacklist', 'modprobe.blacklist', 'rd.driver.blacklist', 'initcall_blacklist')
GPU_MODULES = ('nvidia', 'nvidia_uvm', 'nvidia_drm', 'nvidia_modeset', 'vfio', 'vfio_pci', 'vfio_iommu_type1',
               'kvm_amd', 'amd_iommu_v2')


def split(line: str) -> list:
    """The words of a command line as the kernel's next_arg() delimits them (quotes kept, so a word
    can be written back unchanged). Words after a bare `--` are init's and are returned too."""
    words, i, n = [], 0, len(line)
    while i < n:
        while i < n and line[i].isspace():
            i += 1
        if i >= n:
            break
        start, in_quote = i, False
        if line[i] == '"':
            in_quote = True
            i += 1
        while i < n:
            c = line[i]
            if c.isspace() and not in_quote:
                break
            if c == '"' and not (i == start and c == '"'):
                in_quote = not in_quote
            i += 1
        words.append(line[start:i])
    return words


def param(word: str) -> tuple:
    """(name, value or None) with the quotes next_arg() strips; name not yet normalised."""
    w = word
    if w.startswith('"'):
        w = w[1:]
        if w.endswith('"'):
            w = w[:-1]
    name, eq, value = w.partition('=')
    if not eq:
        return name, None
    if value.startswith('"'):
        value = value[1:]
        if value.endswith('"'):
            value = value[:-1]
    elif word.startswith('"') and value.endswith('"'):
        value = value[:-1]
    return name, value


def norm(name: str) -> str:
    """parameq(): '-' and '_' are the same character in parameter names."""
    return name.replace('-', '_')


def kernel_words(words: list) -> list:
    """The words the kernel itself parses (everything before a bare `--`)."""
    out = []
    for w in words:
        if w == '--':
            break
        out.append(w)
    return out


def strtobool(value: Optional[str]) -> Optional[bool]:
    """kstrtobool(): None when the kernel would reject the value."""
    if not value:
        return None
    c = value[0]
    if c in '1yYtT':
        return True
    if c in '0nNfF':
        return False
    if c in 'oO' and len(value) > 1:
        if value[1] in 'nN':
            return True
        if value[1] in 'fF':
            return False
    return None


def items(value: Optional[str]) -> list:
    return [x for x in (value or '').split(',') if x]


def iommu_mode(words: list) -> str:
    """The default IOMMU domain the kernel picks from these words: 'identity' (passthrough),
    'DMA' (strict), 'DMA-FQ' (lazy, Proxmox kernels' default) or 'off' (no IOMMU at all)."""
    mode, strict, off = 'translated', None, False
    for w in kernel_words(words):
        name, value = param(w)
        key = norm(name)
        if key == 'iommu':
            for item in items(value):
                if item.startswith('off'):
                    off = True
                if item.startswith('pt'):
                    mode = 'identity'
                if item.startswith('nopt'):
                    mode = 'translated'
        elif key == 'iommu.passthrough':
            b = strtobool(value)
            if b is not None:
                mode = 'identity' if b else 'translated'
        elif key == 'iommu.strict':
            b = strtobool(value)
            if b is not None:
                strict = b
        elif key in ('amd_iommu', 'intel_iommu'):
            if any(item.startswith('off') for item in items(value)):
                off = True
    if off:
        return 'off'
    if mode == 'identity':
        return 'identity'
    return 'DMA' if strict else 'DMA-FQ'


def same(a: str, b: str) -> bool:
    """Do two words set the same parameter to the same value (booleans compared as the kernel reads them)?"""
    na, va = param(a)
    nb, vb = param(b)
    if norm(na) != norm(nb):
        return False
    if va == vb:
        return True
    if norm(na) in ('iommu.passthrough', 'iommu.strict'):
        return strtobool(va) is not None and strtobool(va) == strtobool(vb)
    return False


def has(words: list, arg: str) -> bool:
    """Is the parameter in effect with this value? For most parameters the last occurrence wins."""
    key = norm(param(arg)[0])
    mine = [w for w in kernel_words(words) if norm(param(w)[0]) == key]
    if key in REPEATABLE:
        return any(same(w, arg) for w in mine)
    return bool(mine) and same(mine[-1], arg)


def dangers(words: list, policy: dict) -> list:
    """(word, why) for every word on a line that must not be there. policy: {'blackwell': bool,
    'snp': bool, 'vfio': bool} - what the host runs. Order as on the line."""
    out = []
    for w in kernel_words(words):
        why = danger(w, policy)
        if why:
            out.append((w, why))
    return out


IDENTITY_WHY = ('puts every device in an identity (passthrough) IOMMU domain, which bricks RTX PRO 6000 '
                'Blackwell GPUs until a power cycle (FSP error 0x177) and disables SEV-SNP')


def danger(word: str, policy: dict) -> Optional[str]:
    name, value = param(word)
    key = norm(name)
    if key == 'iommu':
        its = items(value)
        if any(i.startswith('pt') for i in its):
            return IDENTITY_WHY
        if any(i.startswith('off') for i in its):
            return 'turns the IOMMU off (vfio-pci and SEV-SNP need it)'
    if key == 'iommu.passthrough' and strtobool(value):
        return IDENTITY_WHY
    if key == 'intel_iommu' and any(i.startswith('off') for i in items(value)):
        return 'turns the Intel IOMMU off (vfio-pci needs it)'
    if key == 'amd_iommu':
        its = items(value)
        if any(i.startswith('off') for i in its):
            return 'turns the AMD IOMMU off (vfio-pci and SEV-SNP need it)'
        if policy.get('snp') and any(i.startswith('pgtbl_v2') for i in its):
            return 'disables SEV-SNP on the host (v2 page tables), which the VM needs'
    if key in ('vfio_pci.ids', 'pci_stub.ids'):
        return ('binds GPUs by vendor:device ID, and all eight GPUs share one ID, so it would take the '
                'container\'s GPUs too; the VM\'s GPUs are bound by PCI address instead')
    if key in BLACKLISTS and any(norm(m) in GPU_MODULES for m in items(value)):
        return 'blacklists a module the GPUs need (%s)' % ', '.join(m for m in items(value) if norm(m) in GPU_MODULES)
    if policy.get('snp') and key in ('kvm_amd.sev', 'kvm_amd.sev_snp', 'kvm_amd.sev_es') and strtobool(value) is False:
        return 'disables SEV in KVM, which the SEV-SNP VM needs'
    if policy.get('snp') and key == 'mem_encrypt' and value == 'off':
        return 'turns memory encryption off, which SEV-SNP needs'
    return None


# The options the IOMMU drivers read from their parameter (drivers/iommu/amd/init.c parse_amd_iommu_options,
# drivers/iommu/intel/iommu.c intel_iommu_setup); anything else is ignored by the kernel.
IOMMU_DRIVER_OPTIONS = {
    # 'on' is not one of them (the AMD IOMMU is on by default), but many guides write it: harmless.
    'amd_iommu': ('on', 'fullflush', 'force_enable', 'off', 'force_isolation', 'pgtbl_v1', 'pgtbl_v2', 'irtcachedis',
                  'nohugepages', 'v2_pgsizes_only'),
    'intel_iommu': ('on', 'off', 'igfx_off', 'forcedac', 'strict', 'sp_off', 'sm_on', 'sm_off', 'tboot_noforce'),
}
STRICT_OPTIONS = ('fullflush', 'strict')
# x86's COMMAND_LINE_SIZE: the kernel keeps 2047 bytes of its command line and drops the rest.
COMMAND_LINE_MAX = 2047


def check_extra(arg: str, ensure: list, policy: dict) -> Optional[str]:
    """Why an operator-given argument (gpuhost:iommu.extra_kernel_args) is refused, or None."""
    if not isinstance(arg, str) or not arg:
        return 'is empty; give one parameter per list item, e.g. pcie_aspm=off'
    if any(ord(c) < 0x20 or ord(c) == 0x7f for c in arg):
        return 'contains a control character'
    words = split(arg)
    for w in words:
        why = danger(w, policy)
        if why:
            return why if len(words) == 1 else '(the parameter %s) %s' % (w, why)
    if len(words) != 1:
        return ('holds %d parameters (%s); give one parameter per list item' % (
            len(words), ', '.join(words))) if words else 'is blank'
    if not ARG_RE.match(arg):
        return ('is not a plain name[=value] parameter; quotes, spaces, backslashes, "$" and backticks are not '
                'written to the boot configuration')
    name, value = param(arg)
    key = norm(name)
    if key in [norm(m) for m in MANAGED]:
        return ('sets the IOMMU mode, which gpuhost:iommu.domain manages (it writes %s); set the domain '
                'instead' % ' '.join(a for a in ensure if norm(param(a)[0]) in [norm(m) for m in MANAGED]))
    if key in [norm(m) for m in NVIDIA_MANAGED]:
        return 'sets an nvidia option that gpuhost:nvidia.dma_remap_peer_mmio manages; set it there'
    if key in IOMMU_DRIVER_OPTIONS:
        known = IOMMU_DRIVER_OPTIONS[key]
        for item in items(value):
            # The drivers match each item by prefix (strncmp with the option's length) and ignore the rest.
            match = next((k for k in known if item.startswith(k)), None)
            if match is None:
                return ('has no effect: %s= has no option %r (it knows %s); the IOMMU mode is set by '
                        'gpuhost:iommu.domain' % (name, item, ', '.join(known)))
            if match in STRICT_OPTIONS:
                return ('sets the IOMMU mode (%s=%s is iommu.strict=1), which gpuhost:iommu.domain manages; set '
                        'the domain instead (DMA is strict)' % (name, match))
    if key in [norm(b) for b in BOOT_OWNED] or arg == '--':
        return 'belongs to the host\'s boot setup (root file system, init), which this program never changes'
    return None


def edit(words: list, ensure: list, policy: dict, add: bool = True) -> list:
    """The line with every dangerous word gone, every `ensure` parameter present exactly once with
    its value (other values of the same parameter removed, except repeatable ones), and everything
    else kept in place and order. add=False only removes (GRUB_CMDLINE_LINUX: the program's
    arguments go into GRUB_CMDLINE_LINUX_DEFAULT)."""
    ensure_keys = {norm(param(a)[0]): a for a in ensure}
    kernel = kernel_words(words)
    tail = words[len(kernel):]
    out = []
    for w in kernel:
        if danger(w, policy):
            continue
        key = norm(param(w)[0])
        if key in ensure_keys:
            if not same(w, ensure_keys[key]) and key not in REPEATABLE:
                continue
            if any(same(w, o) for o in out):
                continue
        out.append(w)
    if add:
        out += [a for a in ensure if not any(same(w, a) for w in out)]
    return out + tail


def join(words: list) -> str:
    return ' '.join(words)
