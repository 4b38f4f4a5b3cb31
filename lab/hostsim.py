"""The simulated Proxmox host behind the lab's SSH server.

Everything the program touches on a real host has a file here, laid out under LAB/host the way
the real paths are, and bind-mounted over them inside the SSH server's private mount namespace
(see ns-sshd.sh), so the program's scripts run unmodified:

  /sys/bus/pci/devices/<bdf>/{vendor,device,numa_node,driver,driver_override,iommu_group}
  /sys/kernel/iommu_groups/<n>/{type,devices/<bdf>}
  /sys/bus/pci/devices/<bdf>/aer_dev_{correctable,nonfatal,fatal}   (the kernel's AER counters)
  /sys/module/nvidia/version                              (the loaded module)
  /proc/cmdline, /proc/driver/nvidia/params               (the *running* state)
  LAB/host/log/kernel.jsonl                               the kernel log, every boot's (journald's part:
                                                          what `journalctl --dmesg` shows, lab/faketools.py)
  LAB/host/run/systemd.json                               what PID 1 would hold: the unit definitions it
                                                          loaded, the active units (lab/faketools.py systemctl)
  /etc/kernel/cmdline or /etc/default/grub, /etc/modprobe.d, /etc/driverctl.d, /etc/pve
  LAB/host/boot/{cmdline,initrd-modprobe.d}               (what the next boot will use)

The fake tools (lab/bin: driverctl, proxmox-boot-tool, update-grub, update-initramfs, reboot,
pct, journalctl, systemctl) move state between these the way the real ones do, so a forgotten refresh or a missing
reboot shows up as a difference between configured, installed and running state.

Stdlib only: the fake tools run under the host's system python3.
"""

import fcntl
import json
import os
import shutil
import stat
import tempfile
import time
import uuid

VENDOR_NVIDIA = '0x10de'
DEFAULT_DRIVER = 'nvidia'
GPU_DRIVERS = ('nvidia', 'vfio-pci')
NVIDIA_VERSION = '580.95.05'    # the spec's nvidia_version overrides it
# drivers/pci/pcie/aer.c: the error types of each sysfs counter file, in the kernel's order, then its total.
AER_TYPES = {
    'correctable': ('RxErr', 'BadTLP', 'BadDLLP', 'Rollover', 'Timeout', 'NonFatalErr', 'CorrIntErr', 'HeaderOF'),
    'nonfatal': ('Undefined', 'DLP', 'SDES', 'TLP', 'FCP', 'CmpltTO', 'CmpltAbrt', 'UnxCmplt', 'RxOF', 'MalfTLP',
                 'ECRC', 'UnsupReq', 'ACSViol', 'UncorrIntErr', 'BlockedTLP', 'AtomicOpBlocked', 'TLPBlockedErr',
                 'PoisonTLPBlocked'),
}
AER_TYPES['fatal'] = AER_TYPES['nonfatal']
AER_TOTAL = {'correctable': 'TOTAL_ERR_COR', 'nonfatal': 'TOTAL_ERR_NONFATAL', 'fatal': 'TOTAL_ERR_FATAL'}


class Host(object):
    """The simulated host rooted at LAB (the .lab directory)."""

    def __init__(self, lab):
        self.lab = os.path.abspath(lab)
        self.root = os.path.join(self.lab, 'host')
        with open(os.path.join(self.lab, 'spec.json')) as f:
            self.spec = json.load(f)

    # ------------------------------------------------------------------ paths

    def path(self, *parts):
        return os.path.join(self.root, *parts)

    def pci(self, bdf, *parts):
        return self.path('sys', 'bus', 'pci', 'devices', bdf, *parts)

    def group_dir(self, group):
        return self.path('sys', 'kernel', 'iommu_groups', str(group))

    # ------------------------------------------------------------- creation

    def create(self):
        """Lay out a freshly booted host from the spec (running state == configured state)."""
        spec = self.spec
        for sub in ('sys/bus/pci/devices', 'sys/bus/pci/drivers/nvidia', 'sys/bus/pci/drivers/vfio-pci',
                    'sys/kernel/iommu_groups', 'proc/driver/nvidia', 'etc/modprobe.d', 'etc/driverctl.d',
                    'etc/pve/lxc', 'etc/pve/qemu-server', 'etc/pve/nodes', 'boot/initrd-modprobe.d',
                    'var/lib/lxc', 'dev', 'sbin', 'log', 'sys/module/nvidia', 'run'):
            os.makedirs(self.path(sub), exist_ok=True)
        write(self.path('sys/bus/pci/drivers_probe'), '')
        for gpu in spec['gpus']:
            bdf = gpu['bdf']
            vendor, device = gpu['id'].split(':')
            os.makedirs(self.pci(bdf), exist_ok=True)
            write(self.pci(bdf, 'vendor'), '0x%s\n' % vendor)
            write(self.pci(bdf, 'device'), '0x%s\n' % device)
            write(self.pci(bdf, 'class'), '0x030200\n')
            write(self.pci(bdf, 'numa_node'), '%d\n' % gpu['numa'])
            write(self.pci(bdf, 'driver_override'), '(null)\n')
            os.makedirs(os.path.join(self.group_dir(gpu['group']), 'devices'), exist_ok=True)
            write(os.path.join(self.group_dir(gpu['group']), 'type'), '%s\n' % gpu.get('group_type', 'DMA-FQ'))
            relink(os.path.join(self.group_dir(gpu['group']), 'devices', bdf),
                   '../../../../bus/pci/devices/' + bdf)
            relink(self.pci(bdf, 'iommu_group'), '../../../../kernel/iommu_groups/%d' % gpu['group'])
            self.bind(bdf, gpu.get('driver', DEFAULT_DRIVER))
            for severity in AER_TYPES:
                self.write_aer(bdf, severity, {})
        if spec['boot'] == 'systemd-boot':
            write(self.path('etc/kernel/cmdline'), spec['cmdline'] + '\n')
            write(self.path('etc/kernel/proxmox-boot-uuids'), '7A3B-1C2D\n')
        else:
            root_args, default_args = split_grub_default(spec['cmdline'])
            write(self.path('etc/default/grub'), GRUB_TEMPLATE.format(default=default_args))
            write(self.path('etc/gpuhost-lab-grub-root'), root_args + '\n')
        write(self.path('boot/cmdline'), spec['cmdline'] + '\n')
        write_in_place(self.path('proc/cmdline'), self.boot_line(spec['cmdline']) + '\n')
        write_in_place(self.path('proc/boot_id'), str(uuid.uuid4()) + '\n')
        self.write_nvidia_params(spec.get('nvidia_params', {}))
        write(self.path('sys/module/nvidia/version'), spec.get('nvidia_version', NVIDIA_VERSION) + '\n')
        self.boot_messages()
        write(self.path('etc/hostname'), spec['node'] + '\n')
        # root's home as a fresh Debian/Proxmox install has it (the SSH namespace mounts it over /root):
        # bash run by sshd sources ~/.bashrc, and the machine's own would change PATH and cost time.
        for name in ('bashrc', 'profile'):
            src = '/usr/share/base-files/dot.' + name
            write(self.path('root', '.' + name), read(src) if os.path.exists(src) else '')
        # Character devices in the upper layer of the SSH namespace's /dev overlay: what
        # `devN:` entries point at. Majors as the nvidia driver registers them.
        nodes = [('nvidia%d' % i, 195, i) for i in range(len(spec['gpus']))]
        nodes += [('nvidiactl', 195, 255), ('nvidia-modeset', 195, 254), ('nvidia-uvm', 511, 0),
                  ('nvidia-uvm-tools', 511, 1)]
        for name, major, minor in nodes:
            if not os.path.exists(self.path('dev', name)):
                os.mknod(self.path('dev', name), 0o666 | stat.S_IFCHR, os.makedev(major, minor))

    def boot_line(self, cmdline):
        return 'BOOT_IMAGE=/boot/vmlinuz-%s %s' % (self.spec['kernel'], cmdline.strip())

    # --------------------------------------------------------------- facts

    def gpu_bdfs(self):
        return [g['bdf'] for g in self.spec['gpus']]

    def driver(self, bdf):
        link = self.pci(bdf, 'driver')
        return os.path.basename(os.readlink(link)) if os.path.islink(link) else None

    def group(self, bdf):
        return int(os.path.basename(os.readlink(self.pci(bdf, 'iommu_group'))))

    def group_type(self, bdf):
        return read(os.path.join(self.group_dir(self.group(bdf)), 'type')).strip()

    def running_cmdline(self):
        return read(self.path('proc/cmdline')).strip()

    def nvidia_params(self):
        params = {}
        for line in read(self.path('proc/driver/nvidia/params')).splitlines():
            key, _, value = line.partition(':')
            params[key.strip()] = value.strip()
        return params

    def overrides(self):
        out = {}
        d = self.path('etc/driverctl.d')
        for name in sorted(os.listdir(d)):
            if name.startswith('pci-'):
                out[name[4:]] = read(os.path.join(d, name)).strip()
        return out

    # ------------------------------------------------------------- actions

    def bind(self, bdf, driver):
        """Bind (or unbind, driver=None) a device at runtime, as driver_override + drivers_probe do."""
        if driver is not None and driver not in GPU_DRIVERS:
            raise SystemExit('driver %s is not loaded on this host' % driver)
        old = self.driver(bdf)
        if old:
            try:
                os.unlink(self.path('sys/bus/pci/drivers', old, bdf))
            except FileNotFoundError:
                pass
            os.unlink(self.pci(bdf, 'driver'))
        info = self.path('proc/driver/nvidia/gpus', bdf)
        if old == 'nvidia' and driver != 'nvidia' and os.path.isdir(info):
            shutil.rmtree(info)
        if driver:
            relink(self.pci(bdf, 'driver'), '../../drivers/' + driver)
            relink(self.path('sys/bus/pci/drivers', driver, bdf), '../../devices/' + bdf)
        if driver == 'nvidia' and not os.path.isdir(info):
            # The driver hands out the lowest free minor (/dev/nvidiaN) when it probes a GPU.
            used = set()
            gdir = self.path('proc/driver/nvidia/gpus')
            for other in os.listdir(gdir) if os.path.isdir(gdir) else []:
                used.add(self.minor(other))
            minor = min(set(range(len(self.spec['gpus']) + 1)) - used)
            write(os.path.join(info, 'information'), 'Model: \t\t NVIDIA RTX PRO 6000 Blackwell Server Edition\n'
                  'Bus Location: \t %s\nDevice Minor: \t %d\n' % (bdf, minor))

    def minor(self, bdf):
        for line in read(self.path('proc/driver/nvidia/gpus', bdf, 'information')).splitlines():
            if line.startswith('Device Minor:'):
                return int(line.split(':', 1)[1])
        return None

    def write_nvidia_params(self, overrides):
        params = dict(self.spec.get('nvidia_params', {}))
        params.update(overrides)
        write(self.path('proc/driver/nvidia/params'), ''.join('%s: %s\n' % kv for kv in sorted(params.items())))

    def set_group_type(self, bdf, gtype):
        """Write the type of the GPU's IOMMU group, as `echo <type> > /sys/kernel/iommu_groups/N/type` does
        (the kernel allows it with no driver bound; the lab does not check that)."""
        write(os.path.join(self.group_dir(self.group(bdf)), 'type'), gtype + '\n')

    # -------------------------------------------------------- AER counters

    def aer(self, bdf, severity):
        """{error type: count} of one of the device's AER counter files, TOTAL_* included."""
        out = {}
        for line in read(self.pci(bdf, 'aer_dev_' + severity)).splitlines():
            name, _, value = line.partition(' ')
            out[name] = int(value)
        return out

    def write_aer(self, bdf, severity, counts):
        """The device's aer_dev_<severity> file with these counts (others 0) and their total, in the
        kernel's format ("<type> <count>" lines, then TOTAL_ERR_*)."""
        lines = ['%s %d' % (name, counts.get(name, 0)) for name in AER_TYPES[severity]]
        lines.append('%s %d' % (AER_TOTAL[severity], sum(counts.get(n, 0) for n in AER_TYPES[severity])))
        write(self.pci(bdf, 'aer_dev_' + severity), '\n'.join(lines) + '\n')

    def add_aer(self, bdf, severity, error_type, n=1):
        """An AER error the device reported: its counter and the total raised by n."""
        counts = {k: v for k, v in self.aer(bdf, severity).items() if k != AER_TOTAL[severity]}
        if error_type not in AER_TYPES[severity]:
            raise ValueError('%s is not an AER %s error type (%s)' % (error_type, severity,
                                                                        ', '.join(AER_TYPES[severity])))
        counts[error_type] = counts.get(error_type, 0) + n
        self.write_aer(bdf, severity, counts)

    # ------------------------------------------------------------ the kernel log

    def kernel_log_path(self):
        return self.path('log', 'kernel.jsonl')

    def kernel_log(self, message, priority=3):
        """The kernel logs a message now (printk; journald stores it for `journalctl --dmesg`): an entry of
        the current boot with the next sequence number. Returns the entry."""
        boot = read(self.path('proc/boot_id')).strip()
        path = self.kernel_log_path()
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, 'a+') as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.seek(0)
            seq, started = 0, None
            for line in f:
                if line.endswith('\n'):
                    entry = json.loads(line)
                    seq = entry['seq']
                    if entry['boot'] == boot and started is None:
                        started = entry['real'] - entry['mono']
            now = int(time.time() * 1e6)
            entry = {'seq': seq + 1, 'boot': boot, 'real': now, 'mono': now - started if started else 4000000,
                     'prio': priority, 'msg': message}
            f.seek(0, os.SEEK_END)
            f.write(json.dumps(entry) + '\n')
            f.flush()
        return entry

    def kernel_messages(self, boot=None):
        """Every kernel log entry (of one boot id, if given), oldest first."""
        try:
            with open(self.kernel_log_path()) as f:
                entries = [json.loads(line) for line in f if line.endswith('\n')]
        except FileNotFoundError:
            return []
        return [e for e in entries if boot is None or e['boot'] == boot]

    def boot_messages(self):
        """The first lines a booting kernel logs, for a log that is not empty at the start of a boot."""
        self.kernel_log('Linux version %s (build@pve) #1 SMP PREEMPT_DYNAMIC PMX' % self.spec['kernel'], 5)
        self.kernel_log('Command line: %s' % read(self.path('proc/cmdline')).strip(), 6)
        self.kernel_log('AMD-Vi: Interrupt remapping enabled', 6)
        self.kernel_log('nvidia: loading out-of-tree module taints kernel.', 4)
        self.kernel_log('NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  %s  Release Build' % (
            self.spec.get('nvidia_version', NVIDIA_VERSION)), 6)

    # ------------------------------------------------------------- systemd's state

    def systemd_path(self):
        return self.path('run', 'systemd.json')

    def systemd_state(self):
        """What PID 1 would hold: {'loaded': {unit: text}, 'active': [unit], 'running': {unit: pid}}."""
        try:
            with open(self.systemd_path()) as f:
                return json.load(f)
        except FileNotFoundError:
            return {'loaded': {}, 'active': [], 'running': {}}

    def installed_cmdline(self):
        return read(self.path('boot/cmdline')).strip()

    def refresh_boot(self):
        """proxmox-boot-tool refresh / update-grub: install the configured command line for the next boot."""
        if self.spec['boot'] == 'systemd-boot':
            line = read(self.path('etc/kernel/cmdline')).strip()
            if '\n' in line:
                raise SystemExit('E: /etc/kernel/cmdline must be a single line')
        else:
            values = self.grub_values()
            line = ' '.join(x for x in (read(self.path('etc/gpuhost-lab-grub-root')).strip(),
                                        values.get('GRUB_CMDLINE_LINUX', ''),
                                        values.get('GRUB_CMDLINE_LINUX_DEFAULT', '')) if x)
        write(self.path('boot/cmdline'), line + '\n')
        return line

    def grub_values(self):
        """GRUB_CMDLINE_LINUX(_DEFAULT) as grub-mkconfig sees them: /etc/default/grub, then
        /etc/default/grub.d/*.cfg, sourced by a shell."""
        import glob
        import subprocess
        files = [self.path('etc/default/grub')] + sorted(glob.glob(self.path('etc/default/grub.d/*.cfg')))
        out = subprocess.run(['env', '-i', '/bin/bash', '-c', 'for f in "$@"; do . "$f"; done >/dev/null 2>&1; '
                              'printf "%s\\0%s" "${GRUB_CMDLINE_LINUX-}" "${GRUB_CMDLINE_LINUX_DEFAULT-}"',
                              'grub'] + files, capture_output=True, text=True).stdout
        linux, _, default = out.partition('\0')
        return {'GRUB_CMDLINE_LINUX': ' '.join(linux.split()), 'GRUB_CMDLINE_LINUX_DEFAULT': ' '.join(default.split())}

    def update_initramfs(self):
        """Snapshot /etc/modprobe.d into the initramfs, which is what the next boot loads modules with."""
        dst = self.path('boot/initrd-modprobe.d')
        shutil.rmtree(dst)
        shutil.copytree(self.path('etc/modprobe.d'), dst)

    def reboot(self):
        """What a power cycle makes of the installed state: command line, module options, bindings."""
        cmdline = self.installed_cmdline()
        write_in_place(self.path('proc/cmdline'), self.boot_line(cmdline) + '\n')
        write_in_place(self.path('proc/boot_id'), str(uuid.uuid4()) + '\n')
        gtype = domain_type(cmdline)
        for gpu in self.spec['gpus']:
            write(os.path.join(self.group_dir(gpu['group']), 'type'), gtype + '\n')
        overrides = self.overrides()
        # A fresh boot probes in bus order, so minors are handed out again from 0.
        shutil.rmtree(self.path('proc/driver/nvidia/gpus'), ignore_errors=True)
        for bdf in self.gpu_bdfs():
            self.bind(bdf, None)
        for bdf in sorted(self.gpu_bdfs()):
            self.bind(bdf, overrides.get(bdf, DEFAULT_DRIVER))
            write(self.pci(bdf, 'driver_override'), (overrides[bdf] if bdf in overrides else '(null)') + '\n')
        params = {}
        d = self.path('boot/initrd-modprobe.d')
        for name in sorted(os.listdir(d)):
            params.update(modprobe_nvidia_params(read(os.path.join(d, name))))
        self.write_nvidia_params(params)
        # The kernel's AER counters start again at boot; the log starts a new boot.
        for bdf in self.gpu_bdfs():
            for severity in AER_TYPES:
                self.write_aer(bdf, severity, {})
        self.boot_messages()
        # systemd boots: it loads the unit files afresh, and timers.target starts the enabled timers.
        wants = os.path.join(self.path('etc', 'systemd', 'system', 'timers.target.wants'))
        active = sorted(os.listdir(wants)) if os.path.isdir(wants) else []
        write(self.systemd_path(), json.dumps({'loaded': {}, 'active': active, 'running': {}}, sort_keys=True) + '\n')


GRUB_TEMPLATE = '''# If you change this file, run 'update-grub' afterwards to update
# /boot/grub/grub.cfg.
GRUB_DEFAULT=0
GRUB_TIMEOUT=5
GRUB_DISTRIBUTOR="Proxmox VE"
GRUB_CMDLINE_LINUX_DEFAULT="{default}"
GRUB_CMDLINE_LINUX=""
'''


def split_grub_default(cmdline):
    """The spec's command line as (root part set by grub itself, GRUB_CMDLINE_LINUX_DEFAULT)."""
    words = cmdline.split()
    root = [w for w in words if w.startswith('root=') or w in ('ro', 'rw')]
    rest = [w for w in words if w not in root]
    return ' '.join(root), ' '.join(rest)


def kstrtobool(value):
    """lib/kstrtox.c: the first character decides (1yYtT / 0nNfF), "on"/"off" by the second."""
    if not value:
        return None
    if value[0] in '1yYtT':
        return True
    if value[0] in '0nNfF':
        return False
    if value[0] in 'oO' and len(value) > 1:
        return {'n': True, 'N': True, 'f': False, 'F': False}.get(value[1])
    return None


def domain_type(cmdline):
    """The default IOMMU domain type the kernel picks for this command line (what a boot with it
    writes to /sys/kernel/iommu_groups/*/type): x86 iommu= items match by prefix, iommu.passthrough and
    iommu.strict are kstrtobool, parameter names treat - and _ alike, and the last setting wins."""
    identity, strict = False, False
    for word in cmdline.split():
        if word == '--':
            break
        name, _, value = word.partition('=')
        name = name.replace('-', '_')
        if name == 'iommu':
            for item in value.split(','):
                if item.startswith('pt'):
                    identity = True
                elif item.startswith('nopt'):
                    identity = False
        elif name == 'iommu.passthrough' and kstrtobool(value) is not None:
            identity = kstrtobool(value)
        elif name == 'iommu.strict' and kstrtobool(value) is not None:
            strict = kstrtobool(value)
    return 'identity' if identity else 'DMA' if strict else 'DMA-FQ'


def modprobe_nvidia_params(text):
    params = {}
    for line in text.splitlines():
        words = line.split('#', 1)[0].split()
        if len(words) >= 3 and words[0] == 'options' and words[1] == 'nvidia':
            for opt in words[2:]:
                key, _, value = opt.partition('=')
                if key.startswith('NVreg_'):
                    params[key[len('NVreg_'):]] = value
    return params


def read(path):
    with open(path) as f:
        return f.read()


def write(path, text):
    """Atomic write, so a test reading while a tool writes never sees half a file."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix='.tmp.')
    with os.fdopen(fd, 'w') as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def write_in_place(path, text):
    """For files bind-mounted over a real path (/proc/cmdline): a rename would leave the mount on the
    old inode, so these are rewritten in place."""
    with open(path, 'w') as f:
        f.write(text)


def relink(path, target):
    if os.path.lexists(path):
        os.unlink(path)
    os.symlink(target, path)
