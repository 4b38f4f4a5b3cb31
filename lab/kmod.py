"""The simulated kernel's loadable modules - the NVIDIA driver's - and DKMS's records of them.

The state is the files the real kernel and tools show, under LAB/host (bind-mounted over the real paths on the lab
host, lab/host-init.sh), with nothing kept beside them:

  /sys/module/<m>/initstate, refcnt, holders/<h>, version   a loaded module (the directory absent: not loaded). refcnt
                                                           counts the modules in holders/ plus its users (processes
                                                           with /dev/nvidia* open, ...); a plain number in a file.
  /proc/driver/nvidia/{version,params,gpus/<bdf>/}          made when nvidia loads, gone when it unloads
  /sys/bus/pci/devices/<bdf>/driver                        every free GPU (no driver, no driver_override other than
                                                           nvidia) bound when nvidia loads, unbound when it unloads;
                                                           a GPU on vfio-pci is never touched
  /lib/modules/<k>/modules.dep, updates/dkms/*.ko           what modprobe finds for kernel k: the module files (ELF
                                                           with a .modinfo section, hostsim.module_elf) indexed by
                                                           the real depmod. A file depmod has not indexed is not found.
  /var/lib/dkms/nvidia/<v>/{source,<k>/x86_64/module/}      DKMS's tree; /var/lib/dkms/nvidia/kernel-<k>-x86_64 -> the
                                                           version installed for k (`dkms status`: installed)
  LAB/host/faults/nvidia-fsp.json                          an armed FSP boot failure (arm_fsp_failure)
  LAB/host/kmod.lock                                       one change at a time (tools and tests)

The kernel log (hostsim.Host.kernel_log) gets NVRM's lines when nvidia loads, and an armed failure's.

API for tests (hostsim.Host has the same names, delegating here):
  loaded(host, m) / refcnt(host, m) / holders(host, m) / users(host, m) / version(host, m)
  nvidia_loaded(host)                  nvidia is loaded
  load_nvidia(host, version=None, modules=BOOT_MODULES)
                                       nvidia at version (None: the module installed for the running kernel) and the
                                       other modules holding it; a loaded nvidia is left as it is
  unload_nvidia(host)                  every nvidia module, dependents first; ModuleError (the tools' message) when one
                                       is in use (users > 0)
  hold(host, m='nvidia', n=1) / release(host, m='nvidia', n=1)
                                       n users more / fewer (an open /dev/nvidia*: SGLang, nvidia-persistenced - the lab
                                       runs neither against a real driver, so a test says who holds the module)
  arm_fsp_failure(host, bdfs=None, version=None, status='0x177') / disarm_fsp_failure(host)
                                       every later load of nvidia (of that version; None: any) fails to initialise
                                       those GPUs (None: every GPU it binds): NVRM's FSP/GSP lines and Xid 143 in the
                                       kernel log, the GPU bound to nvidia but absent from /proc/driver/nvidia/gpus.
                                       Stays armed until disarmed (a driver version that regresses always does).
  installed(host, m, kernel)           the module's .modinfo ({'version': ..., ...}) as modprobe finds it for kernel
  boot(host, params)                   what a power cycle leaves: no module loaded, then the running kernel's nvidia
                                       (if installed) with nvidia_uvm and nvidia_modeset, as udev and the host's boot
                                       load them
The tools (lab/faketools.py: rmmod, modprobe, dkms) call load, unload, install_dkms, ... below.

Stdlib only: runs under the lab host's python3 too.
"""

import json
import os
import shutil

import hostsim

NVIDIA = 'nvidia'
# Each nvidia module and the modules it needs loaded first (what depmod would write to modules.dep from their
# symbols; the lab's module files have no symbols, so the table is here). Unloading goes in the reverse order.
DEPENDS = {'nvidia': (), 'nvidia_uvm': ('nvidia',), 'nvidia_modeset': ('nvidia',),
           'nvidia_drm': ('nvidia_modeset',)}
UNLOAD_ORDER = ('nvidia_drm', 'nvidia_modeset', 'nvidia_uvm', 'nvidia')
# What a boot loads: nvidia when udev sees the GPUs, nvidia_uvm and nvidia_modeset (nvidia-modprobe, persistenced).
BOOT_MODULES = ('nvidia', 'nvidia_uvm', 'nvidia_modeset')
# The module files NVIDIA's installer builds, by module name.
FILES = {m: m.replace('_', '-') + '.ko' for m in DEPENDS}
ARCH = 'x86_64'
# The open modules' MODULE_LICENSE; the proprietary ones say "NVIDIA".
OPEN_LICENSE = 'Dual MIT/GPL'
PROPRIETARY_LICENSE = 'NVIDIA'
# pNVRM_ID's builder and date, as /proc/driver/nvidia/version and the load line show them (hostsim.nvidia_proc_version).
BUILD = '(dvs-builder@U22-I3-AE18-23-3)  Tue Sep 23 09:50:16 UTC 2025'
FSP_FAULT = 'nvidia-fsp.json'


class ModuleError(Exception):
    """A refused load or unload. kind: 'in use', 'not loaded', 'not found', 'needs'; the tools word it their way."""

    def __init__(self, kind, module, detail=None):
        Exception.__init__(self, '%s: %s%s' % (module, kind, ' (%s)' % detail if detail else ''))
        self.kind, self.module, self.detail = kind, module, detail


def name_of(arg):
    """The module name as the kernel has it: rmmod and modprobe take `nvidia-uvm`, `nvidia_uvm` or a file."""
    base = os.path.basename(arg)
    for ext in ('.ko.xz', '.ko.zst', '.ko.gz', '.ko'):
        if base.endswith(ext):
            base = base[:-len(ext)]
    return base.replace('-', '_')


# ------------------------------------------------------------------------- reads

def sysmod(host, module, *parts):
    return host.path('sys', 'module', module, *parts)


def loaded(host, module):
    # initstate is what a loadable module has and a built-in one (a directory of parameters) has not.
    return os.path.exists(sysmod(host, module, 'initstate'))


def nvidia_loaded(host):
    return loaded(host, NVIDIA)


def refcnt(host, module):
    return int(hostsim.read(sysmod(host, module, 'refcnt')).strip())


def holders(host, module):
    d = sysmod(host, module, 'holders')
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def users(host, module):
    return refcnt(host, module) - len(holders(host, module))


def version(host, module=NVIDIA):
    try:
        return hostsim.read(sysmod(host, module, 'version')).strip()
    except FileNotFoundError:
        return None


def parse_modinfo(data):
    """The .modinfo section of a module file (bytes) as {key: value} - what `modinfo -F key` prints - or None when
    the file is not a 64-bit little-endian ELF with one."""
    import struct
    if data[:4] != b'\x7fELF' or data[4] != 2 or data[5] != 1:
        return None
    shoff, = struct.unpack_from('<Q', data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from('<HHH', data, 0x3a)
    sections = [struct.unpack_from('<IIQQQQIIQQ', data, shoff + i * shentsize) for i in range(shnum)]
    names = sections[shstrndx]
    for sh in sections:
        start = names[4] + sh[0]
        name = data[start:data.index(b'\0', start)]
        if name == b'.modinfo':
            body = data[sh[4]:sh[4] + sh[5]]
            out = {}
            for item in body.split(b'\0'):
                key, sep, value = item.decode('utf-8', 'replace').partition('=')
                if sep:
                    out.setdefault(key, value)
            return out
    return None


def module_path(host, module, kernel):
    """The file modprobe loads for the module under kernel: depmod's index (modules.dep) names it; None if not."""
    tree = host.path('lib', 'modules', kernel)
    try:
        text = hostsim.read(os.path.join(tree, 'modules.dep'))
    except FileNotFoundError:
        return None
    for line in text.splitlines():
        rel = line.partition(':')[0].strip()
        if rel and name_of(rel) == module:
            return os.path.join(tree, rel)
    return None


def installed(host, module, kernel):
    """The installed module's .modinfo for kernel ({'version': ..., 'license': ...}), None if modprobe finds none."""
    path = module_path(host, module, kernel)
    if path is None or not os.path.exists(path):
        return None
    with open(path, 'rb') as f:
        return parse_modinfo(f.read())


def running_kernel(host):
    return host.spec['kernel']


# ---------------------------------------------------------------------- changes

def locked(host):
    import fcntl
    f = open(host.path('kmod.lock'), 'a')
    fcntl.flock(f, fcntl.LOCK_EX)
    return f


def _set_refcnt(host, module, n):
    hostsim.write(sysmod(host, module, 'refcnt'), '%d\n' % n)


def load(host, module, info, params=None, pid=None):
    """insmod: the module (its .modinfo: info) now loaded; its dependencies must be. params: nvidia's NVreg_ options
    ({name: value}, /proc/driver/nvidia/params). Loading a loaded module changes nothing."""
    if loaded(host, module):
        return
    for dep in DEPENDS.get(module, ()):
        if not loaded(host, dep):
            raise ModuleError('needs', module, dep)
    d = sysmod(host, module)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(os.path.join(d, 'holders'))
    hostsim.write(os.path.join(d, 'initstate'), 'live\n')
    _set_refcnt(host, module, 0)
    if info.get('version'):
        hostsim.write(os.path.join(d, 'version'), info['version'] + '\n')
    for dep in DEPENDS.get(module, ()):
        hostsim.relink(sysmod(host, dep, 'holders', module), '../../%s' % module)
        _set_refcnt(host, dep, refcnt(host, dep) + 1)
    open_modules = info.get('license') != PROPRIETARY_LICENSE
    if module == NVIDIA:
        _load_nvidia(host, info['version'], open_modules, params or {}, pid or os.getpid())
    elif module == 'nvidia_modeset':
        host.kernel_log('nvidia-modeset: Loading NVIDIA %s  %s  Release Build  %s' % (
            'UNIX Open Kernel Mode Setting Driver for x86_64' if open_modules else
            'Kernel Mode Setting Driver for UNIX platforms', info['version'], BUILD), 6)


def flavour_line(version, open_modules=True):
    """pNVRM_ID: what the load line and /proc/driver/nvidia/version's first line name."""
    return 'NVIDIA UNIX %s %s  Release Build  %s' % (
        'Open Kernel Module for x86_64 ' if open_modules else 'x86_64 Kernel Module ', version, BUILD)


def _load_nvidia(host, ver, open_modules, params, pid):
    boot = hostsim.read(host.path('proc/boot_id')).strip()
    if not any(e['msg'].endswith('loading out-of-tree module taints kernel.') for e in host.kernel_messages(boot)):
        host.kernel_log('nvidia: loading out-of-tree module taints kernel.', 4)
    host.kernel_log('NVRM: loading %s' % flavour_line(ver, open_modules), 6)
    hostsim.write(host.path('proc/driver/nvidia/version'), 'NVRM version: %s\nGCC version:  gcc version 12.2.0 '
                  '(Debian 12.2.0-14+deb12u1) \n' % flavour_line(ver, open_modules))
    os.makedirs(host.path('proc/driver/nvidia/gpus'), exist_ok=True)
    host.write_nvidia_params(params)
    fault = fsp_fault(host)
    bound = []
    for bdf in sorted(host.gpu_bdfs()):
        override = hostsim.read(host.pci(bdf, 'driver_override')).strip()
        if host.driver(bdf) is None and override in ('(null)', NVIDIA):
            host.bind(bdf, NVIDIA)
            bound.append(bdf)
    if fault and fault.get('version') in (None, ver):
        for bdf in bound:
            if fault.get('bdfs') is None or bdf in fault['bdfs']:
                _fail_init(host, bdf, fault.get('status', '0x177'), pid)


def _fail_init(host, bdf, status, pid):
    """NVRM's lines for a GPU whose FSP never reported boot complete (open-gpu-kernel-modules' kfsp and RmInitAdapter
    messages, Xid 143); the GPU stays bound to nvidia (the PCI probe succeeded) but the driver has no GPU there."""
    minor = host.minor(bdf)
    short = bdf.rsplit('.', 1)[0]
    for msg in ('NVRM: GPU %s: Error status %s while polling for FSP boot complete, 0x0' % (bdf, status),
                'NVRM: Xid (PCI:%s): 143, pid=%d, name=modprobe, GPU initialization failure' % (short, pid),
                'NVRM: GPU %s: RmInitAdapter: Cannot initialize GSP firmware RM' % bdf,
                'NVRM: GPU %s: RmInitAdapter failed! (0x62:0x40:1860)' % bdf,
                'NVRM: GPU %s: rm_init_adapter failed, device minor number %s' % (bdf, minor)):
        host.kernel_log(msg, 3)
    shutil.rmtree(host.path('proc/driver/nvidia/gpus', bdf), ignore_errors=True)


def unload(host, module):
    """rmmod: ModuleError 'not loaded', or 'in use' (detail: the holders, [] when only users hold it)."""
    if not loaded(host, module):
        raise ModuleError('not loaded', module)
    if holders(host, module) or refcnt(host, module) > 0:
        raise ModuleError('in use', module, holders(host, module))
    if module == NVIDIA:
        for bdf in host.gpu_bdfs():
            if host.driver(bdf) == NVIDIA:
                host.bind(bdf, None)
        shutil.rmtree(host.path('proc/driver/nvidia'), ignore_errors=True)
    shutil.rmtree(sysmod(host, module))
    for dep in DEPENDS.get(module, ()):
        if os.path.lexists(sysmod(host, dep, 'holders', module)):
            os.unlink(sysmod(host, dep, 'holders', module))
            _set_refcnt(host, dep, refcnt(host, dep) - 1)


def hold(host, module=NVIDIA, n=1):
    """n users more (a process opened /dev/nvidia*)."""
    with locked(host):
        if not loaded(host, module):
            raise ModuleError('not loaded', module)
        _set_refcnt(host, module, refcnt(host, module) + n)


def release(host, module=NVIDIA, n=1):
    with locked(host):
        if users(host, module) < n:
            raise ValueError('%s has %d users, not %d' % (module, users(host, module), n))
        _set_refcnt(host, module, refcnt(host, module) - n)


def load_nvidia(host, version=None, modules=BOOT_MODULES, params=None):
    """nvidia at version (None: as installed for the running kernel) and the other modules; loaded ones stay."""
    with locked(host):
        info = installed(host, NVIDIA, running_kernel(host)) or {}
        if version is not None and info.get('version') != version:
            info = {'version': version, 'license': OPEN_LICENSE}
        if not info.get('version'):
            raise ModuleError('not found', NVIDIA, running_kernel(host))
        for m in modules:
            for dep in DEPENDS[m]:
                load(host, dep, info, params)
            load(host, m, info, params)


def unload_nvidia(host):
    with locked(host):
        for m in UNLOAD_ORDER:
            if loaded(host, m):
                unload(host, m)


def clear(host):
    """Power off: no module loaded, no GPU on nvidia, no /proc/driver/nvidia."""
    for m in UNLOAD_ORDER:
        if os.path.isdir(sysmod(host, m)):
            shutil.rmtree(sysmod(host, m))
    shutil.rmtree(host.path('proc/driver/nvidia'), ignore_errors=True)
    for bdf in host.gpu_bdfs():
        if host.driver(bdf) == NVIDIA:
            host.bind(bdf, None)


def modprobe_rules(host, conf='etc/modprobe.d'):
    """/etc/modprobe.d's (conf: the initramfs's copy, boot/initrd-modprobe.d) `blacklist MODULE` (udev's loads by alias skip it; a load by name or as a dependency does
    not) and `install MODULE COMMAND` (modprobe runs COMMAND instead of loading MODULE) lines: (blacklisted set,
    {module: command})."""
    black, install = set(), {}
    conf = host.path(conf)
    for f in sorted(os.listdir(conf)) if os.path.isdir(conf) else []:
        if not f.endswith('.conf'):
            continue
        with open(os.path.join(conf, f)) as fh:
            for line in fh:
                words = line.split('#', 1)[0].split()
                if len(words) == 2 and words[0] == 'blacklist':
                    black.add(name_of(words[1]))
                elif len(words) >= 3 and words[0] == 'install':
                    install[name_of(words[1])] = ' '.join(words[2:])
    return black, install


def refused_by_install(host, module, conf='etc/modprobe.d'):
    """The install command modprobe would run for module or a module it needs (those first, as kmod goes) instead of
    loading it, when that command fails ((module, command)), else None. The lab runs no command: `/bin/true` and
    `true` succeed, any other fails, as `/bin/false` does."""
    _, install = modprobe_rules(host, conf)
    order, todo = [], [module]
    while todo:
        m = todo.pop()
        if m not in order:
            order.insert(0, m)
            todo.extend(DEPENDS.get(m, ()))
    for m in order:
        cmd = install.get(m)
        if cmd is not None and cmd not in ('/bin/true', 'true'):
            return m, cmd
    return None


def boot(host, params):
    """What a boot loads: the running kernel's nvidia modules, if installed (else the GPUs stay without a driver) -
    nvidia by udev's alias (a blacklisted nvidia is not), nvidia_uvm and nvidia_modeset by name with what they need
    (nvidia-modprobe: an install command that fails keeps them, and the nvidia they need, from loading). nvidia loads
    from the initramfs (hostsim.Host.reboot): its copy of /etc/modprobe.d is what counts, as update-initramfs left it."""
    clear(host)
    info = installed(host, NVIDIA, running_kernel(host))
    if info:
        initrd = 'boot/initrd-modprobe.d'
        black, _ = modprobe_rules(host, initrd)
        for m in BOOT_MODULES:
            if (m == NVIDIA and m in black) or refused_by_install(host, m, initrd):
                continue
            for dep in DEPENDS.get(m, ()) + (m,):
                mod_info = installed(host, dep, running_kernel(host))
                if mod_info and not loaded(host, dep):
                    load(host, dep, mod_info, params, pid=1)


# ------------------------------------------------------------------- FSP faults

def arm_fsp_failure(host, bdfs=None, version=None, status='0x177'):
    hostsim.write(host.path('faults', FSP_FAULT), json.dumps({'bdfs': bdfs, 'version': version, 'status': status}))


def disarm_fsp_failure(host):
    try:
        os.unlink(host.path('faults', FSP_FAULT))
    except FileNotFoundError:
        pass


def fsp_fault(host):
    try:
        return json.loads(hostsim.read(host.path('faults', FSP_FAULT)))
    except (FileNotFoundError, ValueError):
        return None


# ------------------------------------------------------------- building, DKMS

def build(dest, version, kernel, license=OPEN_LICENSE):
    """What compiling the modules for kernel leaves in dest: nvidia.ko, nvidia-uvm.ko, nvidia-modeset.ko,
    nvidia-drm.ko."""
    os.makedirs(dest, exist_ok=True)
    for module, fname in FILES.items():
        info = {'version': version, 'license': license, 'name': module}
        if DEPENDS[module]:
            info['depends'] = ','.join(DEPENDS[module])
        info['vermagic'] = '%s SMP preempt mod_unload modversions ' % kernel
        with open(os.path.join(dest, fname), 'wb') as f:
            f.write(hostsim.module_elf(info))


def depmod(modules_root, kernel):
    """The real depmod's index of kernel's tree (modules_root: the directory holding lib/modules)."""
    import subprocess
    subprocess.run([shutil.which('depmod') or '/usr/sbin/depmod', '-b', modules_root, kernel], check=True,
                   capture_output=True)


class Dkms(object):
    """DKMS 3's tree for the nvidia module: var is the directory holding lib/dkms (/var on the host; LAB/host/var
    only before the host boots - its /var is an overlay), src holds the sources (/usr/src), modules_root holds
    lib/modules (the host's /, or LAB/host)."""

    def __init__(self, var, src, modules_root):
        self.tree = os.path.join(var, 'lib', 'dkms')
        self.src, self.modules_root = src, modules_root

    def mdir(self, module, *parts):
        return os.path.join(self.tree, module, *parts)

    def versions(self, module):
        d = self.mdir(module)
        return sorted(v for v in os.listdir(d) if os.path.isdir(os.path.join(d, v)) and not v.startswith('kernel-')) \
            if os.path.isdir(d) else []

    def kernels(self, module, ver):
        d = self.mdir(module, ver)
        return sorted(k for k in os.listdir(d) if os.path.isdir(os.path.join(d, k, ARCH))) if os.path.isdir(d) else []

    def installed_version(self, module, kernel):
        link = self.mdir(module, 'kernel-%s-%s' % (kernel, ARCH))
        return os.readlink(link).split('/')[0] if os.path.islink(link) else None

    def status(self, module=None, ver=None, kernel=None):
        """dkms status's lines: `nvidia/<v>, <kernel>, x86_64: installed` (or built), `nvidia/<v>: added`."""
        lines = []
        modules = [module] if module else (sorted(os.listdir(self.tree)) if os.path.isdir(self.tree) else [])
        for m in modules:
            for v in self.versions(m):
                if ver and v != ver:
                    continue
                ks = [k for k in self.kernels(m, v) if kernel in (None, k)]
                for k in ks:
                    state = 'installed' if self.installed_version(m, k) == v else 'built'
                    lines.append('%s/%s, %s, %s: %s' % (m, v, k, ARCH, state))
                if not self.kernels(m, v) and kernel is None:
                    lines.append('%s/%s: added' % (m, v))
        return lines

    def add(self, module, ver):
        source = os.path.join(self.src, '%s-%s' % (module, ver))
        if not os.path.exists(os.path.join(source, 'dkms.conf')):
            raise DkmsError('Could not find module source directory.\nDirectory: %s does not exist.' % source)
        os.makedirs(self.mdir(module, ver), exist_ok=True)
        hostsim.relink(self.mdir(module, ver, 'source'), source)
        return ['Creating symlink %s -> %s' % (self.mdir(module, ver, 'source'), source)]

    def build(self, module, ver, kernel):
        if not os.path.isdir(self.mdir(module, ver)):
            raise DkmsError('%s/%s is not located in the DKMS tree.' % (module, ver))
        tree = os.path.join(self.modules_root, 'lib', 'modules', kernel)
        if not os.path.exists(os.path.join(tree, 'build')):
            raise DkmsError("Your kernel headers for kernel %s cannot be found at %s/build or %s/source.\nPlease "
                            "install the linux-headers-%s package or use the --kernelsourcedir option to tell DKMS "
                            "where it's located." % (kernel, tree, tree, kernel))
        conf_path = os.path.join(self.mdir(module, ver, 'source'), 'dkms.conf')
        if not os.path.exists(conf_path):
            # DKMS 3's read_conf (die 4) when the sources the tree's symlink points at are gone.
            raise DkmsError('Could not locate dkms.conf file.\nFile: %s does not exist.' % conf_path)
        conf = hostsim.read(conf_path)
        lic = OPEN_LICENSE
        for line in conf.splitlines():
            if line.startswith('MODULE_LICENSE='):
                lic = line.split('=', 1)[1].strip('"')
        build(self.mdir(module, ver, kernel, ARCH, 'module'), ver, kernel, lic)
        return ['Building module(s)... done.']

    def install(self, module, ver, kernel):
        out = []
        if not os.path.isdir(self.mdir(module, ver, kernel, ARCH, 'module')):
            out += self.build(module, ver, kernel)
        built = self.mdir(module, ver, kernel, ARCH, 'module')
        dest = os.path.join(self.modules_root, 'lib', 'modules', kernel, 'updates', 'dkms')
        os.makedirs(dest, exist_ok=True)
        for name in sorted(os.listdir(built)):
            shutil.copyfile(os.path.join(built, name), os.path.join(dest, name))
            out.append('Installing %s/%s' % (dest.replace(self.modules_root.rstrip('/'), '', 1), name))
        hostsim.relink(self.mdir(module, 'kernel-%s-%s' % (kernel, ARCH)), '%s/%s/%s' % (ver, kernel, ARCH))
        depmod(self.modules_root, kernel)
        return out + ['Running depmod... done.']

    def uninstall(self, module, ver, kernel):
        if self.installed_version(module, kernel) == ver:
            dest = os.path.join(self.modules_root, 'lib', 'modules', kernel, 'updates', 'dkms')
            for name in os.listdir(self.mdir(module, ver, kernel, ARCH, 'module')):
                if os.path.exists(os.path.join(dest, name)):
                    os.unlink(os.path.join(dest, name))
            os.unlink(self.mdir(module, 'kernel-%s-%s' % (kernel, ARCH)))
            if os.path.isdir(os.path.join(self.modules_root, 'lib', 'modules', kernel)):
                depmod(self.modules_root, kernel)
        shutil.rmtree(self.mdir(module, ver, kernel), ignore_errors=True)
        return ['Module %s/%s for kernel %s (%s): Before uninstall, this module version was ACTIVE on this kernel.'
                % (module, ver, kernel, ARCH), 'Deleting module %s-%s completely from the DKMS tree.' % (module, ver)]

    def remove(self, module, ver, kernel=None):
        if not os.path.isdir(self.mdir(module, ver)):
            raise DkmsError('The module/version combo: %s-%s is not located in the DKMS tree.' % (module, ver))
        out = []
        for k in self.kernels(module, ver):
            if kernel in (None, k):
                out += self.uninstall(module, ver, k)
        if kernel is None:
            shutil.rmtree(self.mdir(module, ver))
        return out


class DkmsError(Exception):
    pass


def dkms_conf(version, license=OPEN_LICENSE):
    """The dkms.conf NVIDIA's installer writes beside the sources it puts in /usr/src/nvidia-<v> with --dkms: the same
    text as the simulated installer's (hostsim.NVIDIA_INSTALLER, whose own text stays as it is: Pulumi.lab.yaml pins its
    sha256)."""
    text = 'PACKAGE_NAME="nvidia"\nPACKAGE_VERSION="%s"\nAUTOINSTALL="yes"\nMODULE_LICENSE="%s"\n' % (version, license)
    for i, module in enumerate(FILES):
        text += 'BUILT_MODULE_NAME[%d]="%s"\nDEST_MODULE_LOCATION[%d]="/kernel/drivers/video"\n' % (
            i, FILES[module][:-len('.ko')], i)
    return text


def dkms_record(host, version, kernel):
    """What NVIDIA's installer with --dkms leaves for kernel, before the host boots (hostsim.Host.create): the DKMS
    tree in the host's /var, and the sources with their dkms.conf in /usr/src/nvidia-<v> - written into the upper layer
    of the host's root (LAB/host-os/upper, lab/labhost.py) before that overlay is mounted, so a later `dkms install
    nvidia/<v> -k <kernel>` builds from them as on a real host."""
    d = Dkms(host.path('var'), '/usr/src', host.path())
    os.makedirs(d.mdir(NVIDIA, version, kernel, ARCH, 'module'), exist_ok=True)
    hostsim.write(os.path.join(host.lab, 'host-os', 'upper', 'usr', 'src', 'nvidia-%s' % version, 'dkms.conf'),
                  dkms_conf(version))
    hostsim.relink(d.mdir(NVIDIA, version, 'source'), '/usr/src/nvidia-%s' % version)
    build(d.mdir(NVIDIA, version, kernel, ARCH, 'module'), version, kernel)
    hostsim.relink(d.mdir(NVIDIA, 'kernel-%s-%s' % (kernel, ARCH)), '%s/%s/%s' % (version, kernel, ARCH))


if __name__ == '__main__':
    # The compile step of the simulated NVIDIA installer without DKMS: kmod.py build DEST VERSION KERNEL LICENSE
    import sys
    if len(sys.argv) != 6 or sys.argv[1] != 'build':
        sys.exit('usage: kmod.py build DEST VERSION KERNEL LICENSE')
    build(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])
