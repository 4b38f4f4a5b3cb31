"""The simulated Proxmox host: its hardware, kernel and Proxmox state.

Everything the program touches on a real host that a Debian root under real systemd cannot have (the GPUs,
the kernel's state, Proxmox's files) has a file here, laid out under LAB/host the way the real paths are,
and bind-mounted over them in the lab host's own mount namespace (lab/labhost.py, lab/host-init.sh), so the
program's scripts run unmodified:

  /sys/bus/pci/devices/<bdf>/{vendor,device,subsystem_vendor,subsystem_device,class,irq,numa_node,driver,
                               driver_override,iommu_group}
  /sys/kernel/iommu_groups/<n>/{type,devices/<bdf>}
  /sys/bus/pci/devices/<bdf>/aer_dev_{correctable,nonfatal,fatal}   (the kernel's AER counters)
  /sys/module/<m>/{initstate,refcnt,holders/,version}    (the loaded nvidia modules: lab/kmod.py)
  /lib/modules/<kernel>/                                  (each installed kernel's modules, depmod's index, build/)
  /sys/module/kvm_amd/parameters/{sev,sev_es,sev_snp}     (Y: enabled in the firmware and KVM; the spec's sev_snp)
  /proc/cmdline, /proc/driver/nvidia/params               (the *running* state)
  /proc/sys/kernel/random/boot_id                         (a reboot makes a new one)
  /proc/sys/kernel/osrelease                              (the running kernel: the spec's; the host's `uname`
                                                          prints it, lab/uname.sh)
  /dev/nvidia*                                            (the nodes the driver makes at every boot)
  LAB/host/log/kernel.jsonl                               the kernel log, every boot's (journald's part:
                                                          what `journalctl --dmesg` shows, lab/faketools.py)
  /etc/kernel/cmdline or /etc/default/grub, /etc/modprobe.d, /etc/driverctl.d, /etc/pve
  LAB/host/boot/{cmdline,initrd-modprobe.d}               (what the next boot will use)
  LAB/host/etc, LAB/host/var                              the upper layers of the host's /etc and /var
  LAB/host/sbin, LAB/host/root                            its /usr/local/sbin and /root

The fake tools (lab/faketools.py: driverctl, proxmox-boot-tool, update-grub, update-initramfs, reboot,
pct, journalctl --dmesg, rmmod, modprobe, dkms) move state between these the way the real ones do, so a
forgotten refresh or a missing reboot shows up as a difference between configured, installed and running state.

The nvidia kernel modules' state and its API for tests (load_nvidia, unload_nvidia, hold_nvidia, arm_fsp_failure,
...) are lab/kmod.py's; Host has the same names. A boot (create, reboot) loads the nvidia module installed for the
running kernel (/lib/modules/<kernel>/updates/dkms/nvidia.ko, as NVIDIA's installer with DKMS leaves it), or none.

Stdlib only: the fake tools run under the host's system python3.
"""

import fcntl
import json
import os
import stat
import sys
import time

# shutil, tempfile and uuid are imported where used: each fake tool (pct, driverctl, ...) is a process of its own
# that imports this module, a few thousand times in a run of the test suite.

VENDOR_NVIDIA = '0x10de'
DEFAULT_DRIVER = 'nvidia'
GPU_DRIVERS = ('nvidia', 'vfio-pci')
# The nvidia module the simulated host runs unless the spec says (nvidia_version), and the CUDA toolkit whose
# runfile the host holds (cuda_version): Pulumi.lab.yaml declares these, with the installers' sha256.
NVIDIA_VERSION = '580.95.05'
CUDA_VERSION = '13.0.2'
# Where the operator's installers lie on the host (root's home: LAB/host/root, safe to write from outside).
ARTIFACTS = 'root/gpuhost-artifacts'
# The subsystem vendor:device a GPU of the spec reports unless it says otherwise (`subsystem`): the lab's
# own value (NVIDIA's vendor, a made-up board id); a real card reports its board's, which Proxmox records in
# a PCI resource mapping like the vendor:device ID.
DEFAULT_SUBSYSTEM = '10de:204e'
# drivers/pci/pcie/aer.c: the error types of each sysfs counter file, in the kernel's order, then its total.
AER_TYPES = {
    'correctable': ('RxErr', 'BadTLP', 'BadDLLP', 'Rollover', 'Timeout', 'NonFatalErr', 'CorrIntErr', 'HeaderOF'),
    'nonfatal': ('Undefined', 'DLP', 'SDES', 'TLP', 'FCP', 'CmpltTO', 'CmpltAbrt', 'UnxCmplt', 'RxOF', 'MalfTLP',
                 'ECRC', 'UnsupReq', 'ACSViol', 'UncorrIntErr', 'BlockedTLP', 'AtomicOpBlocked', 'TLPBlockedErr',
                 'PoisonTLPBlocked'),
}
AER_TYPES['fatal'] = AER_TYPES['nonfatal']
AER_TOTAL = {'correctable': 'TOTAL_ERR_COR', 'nonfatal': 'TOTAL_ERR_NONFATAL', 'fatal': 'TOTAL_ERR_FATAL'}


def kmod():
    """lab/kmod.py (imported by its file's directory, whichever way this module was: `hostsim` or `lab.hostsim`)."""
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    import kmod as module
    return module


class Host(object):
    """The simulated host rooted at LAB (the .lab directory)."""

    def __init__(self, lab):
        self.lab = os.path.abspath(lab)
        self.root = os.path.join(self.lab, 'host')

    @property
    def spec(self):
        """The spec as the host has it now (read each time: a renumbered bus rewrites it, and the lab daemon,
        the fake tools and the tests each hold a Host of their own)."""
        with open(os.path.join(self.lab, 'spec.json')) as f:
            return json.load(f)

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
                    'var/lib/lxc', 'dev', 'sbin', 'log', 'sys/module/nvidia', 'lib/modules'):
            os.makedirs(self.path(sub), exist_ok=True)
        write(self.path('sys/bus/pci/drivers_probe'), '')
        for gpu in spec['gpus']:
            self.add_device(gpu, '0x030200')
            if gpu.get('driver', DEFAULT_DRIVER) != DEFAULT_DRIVER:
                self.bind(gpu['bdf'], gpu['driver'])   # nvidia binds its GPUs when it loads (below)
            for severity in AER_TYPES:
                self.write_aer(gpu['bdf'], severity, {})
        for dev in spec.get('devices', []):
            # Other PCI devices (a NIC, say): bound to their own driver, never touched by the program.
            self.add_device(dev, dev['class'])
            os.makedirs(self.path('sys/bus/pci/drivers', dev['driver']), exist_ok=True)
            relink(self.pci(dev['bdf'], 'driver'), '../../drivers/' + dev['driver'])
        if spec['boot'] == 'systemd-boot':
            write(self.path('etc/kernel/cmdline'), spec['cmdline'] + '\n')
            write(self.path('etc/kernel/proxmox-boot-uuids'), '7A3B-1C2D\n')
        else:
            root_args, default_args = split_grub_default(spec['cmdline'])
            write(self.path('etc/default/grub'), GRUB_TEMPLATE.format(default=default_args))
            write(self.path('etc/gpuhost-lab-grub-root'), root_args + '\n')
        driver = spec.get('nvidia_version', NVIDIA_VERSION)
        self.install_kernel(spec['kernel'], driver)
        kmod().dkms_record(self, driver, spec['kernel'])
        self.set_sev_snp(spec.get('sev_snp', True))
        self.add_artifact(nvidia_installer_name(driver), nvidia_installer(driver))
        cuda = spec.get('cuda_version', CUDA_VERSION)
        self.add_artifact(cuda_installer_name(cuda, driver), cuda_installer(cuda))
        write(self.path('boot/cmdline'), spec['cmdline'] + '\n')
        write_in_place(self.path('proc/cmdline'), self.boot_line(spec['cmdline']) + '\n')
        import uuid
        write_in_place(self.path('proc/boot_id'), str(uuid.uuid4()) + '\n')
        write_in_place(self.path('proc/osrelease'), spec['kernel'] + '\n')
        self.boot_messages()
        write(self.path('kmod.lock'), '')    # (there from the start: a test's digest of the host does not see it come)
        kmod().boot(self, {})
        write(self.path('etc/hostname'), spec['node'] + '\n')
        # nvidia-persistenced's unit as an operator installs it from NVIDIA's samples, disabled until a test enables it
        # (lab/persistenced.py: the daemon simulated, holding the nvidia module while it runs).
        write(self.path('etc/systemd/system/nvidia-persistenced.service'), PERSISTENCED_UNIT)
        # root's home as a fresh Debian/Proxmox install has it (the host mounts it over /root): bash run by
        # sshd sources ~/.bashrc.
        for name in ('bashrc', 'profile'):
            src = '/usr/share/base-files/dot.' + name
            write(self.path('root', '.' + name), read(src) if os.path.exists(src) else '')
        # The character devices the nvidia driver registers: the host's /dev gets them at every boot
        # (lab/host-init.sh), the containers' `devN:` entries bind them from here.
        nodes = [('nvidia%d' % i, 195, i) for i in range(len(spec['gpus']))]
        nodes += [('nvidiactl', 195, 255), ('nvidia-modeset', 195, 254), ('nvidia-uvm', 511, 0),
                  ('nvidia-uvm-tools', 511, 1)]
        for name, major, minor in nodes:
            if not os.path.exists(self.path('dev', name)):
                os.mknod(self.path('dev', name), 0o666 | stat.S_IFCHR, os.makedev(major, minor))

    def set_sev_snp(self, on):
        """SEV, SEV-ES and SEV-SNP as kvm_amd reports them: on when the firmware enables them (a test turns them off
        as an operator's BIOS setup would leave them)."""
        for name in ('sev', 'sev_es', 'sev_snp'):
            write(self.path('sys/module/kvm_amd/parameters', name), 'Y\n' if on else 'N\n')

    def set_nvidia_module(self, version):
        """The loaded nvidia kernel module's version, changed in place: /sys/module/nvidia/version and
        /proc/driver/nvidia/version (what the containers see) - a test's upgrade of the host driver out of band, with
        nothing else of the module's state changed (load_nvidia and unload_nvidia change that) - and the running
        kernel's installed modules at that version too, as the operator's install left them, so a reboot loads it again
        (no DKMS record: that is in the host's /var, not to be written from outside while it runs)."""
        write(self.path('sys/module/nvidia/version'), version + '\n')
        write(self.path('proc/driver/nvidia/version'), nvidia_proc_version(version))
        kernel = self.spec['kernel']
        dkms = self.path('lib', 'modules', kernel, 'updates', 'dkms')
        if os.path.exists(os.path.join(dkms, 'nvidia.ko')):
            kmod().build(dkms, version, kernel)
            kmod().depmod(self.path(), kernel)

    def nvidia_module(self):
        return read(self.path('sys/module/nvidia/version')).strip()

    # The nvidia modules' state (lab/kmod.py): what tests call.
    def nvidia_loaded(self):
        return kmod().nvidia_loaded(self)

    def load_nvidia(self, version=None, modules=None, params=None):
        k = kmod()
        k.load_nvidia(self, version, modules or k.BOOT_MODULES, params)

    def unload_nvidia(self):
        kmod().unload_nvidia(self)

    def hold_nvidia(self, n=1, module='nvidia'):
        kmod().hold(self, module, n)

    def release_nvidia(self, n=1, module='nvidia'):
        kmod().release(self, module, n)

    def module_refcnt(self, module='nvidia'):
        return kmod().refcnt(self, module)

    def module_holders(self, module='nvidia'):
        return kmod().holders(self, module)

    def installed_nvidia(self, kernel=None):
        """The nvidia module's version modprobe would load under kernel (None: the running one), None if none."""
        info = kmod().installed(self, 'nvidia', kernel or self.spec['kernel'])
        return info.get('version') if info else None

    def arm_fsp_failure(self, bdfs=None, version=None, status='0x177'):
        kmod().arm_fsp_failure(self, bdfs, version, status)

    def disarm_fsp_failure(self):
        kmod().disarm_fsp_failure(self)

    def install_kernel(self, kernel, nvidia=None, headers=True):
        """A kernel's module tree, /lib/modules/KERNEL, as installing its package leaves it - with its headers
        (build/, what DKMS and NVIDIA's installer build against) unless headers=False, and, given a version, the
        nvidia modules NVIDIA's installer with DKMS builds for it (updates/dkms/nvidia.ko, nvidia-uvm.ko, ...; no DKMS
        record: that is in the host's /var, kmod.dkms_record) - indexed by the real depmod, so the host's real modinfo
        reads it (`modinfo -F version -k KERNEL nvidia`) and the lab's modprobe finds it. A test installs a kernel
        without the module: the host's next boot into it would have no GPU driver."""
        import shutil
        tree = self.path('lib', 'modules', kernel)
        if os.path.isdir(tree):
            shutil.rmtree(tree)
        os.makedirs(os.path.join(tree, 'kernel'))
        if headers:
            write(os.path.join(tree, 'build', 'Makefile'), '# the headers of %s (the gpuhost lab\'s)\n' % kernel)
        if nvidia:
            kmod().build(os.path.join(tree, 'updates', 'dkms'), nvidia, kernel)
        # depmod as a kernel's or DKMS's install runs it; its warnings are for the files a real tree has besides
        # (modules.order, modules.builtin*), which no read of the nvidia module needs.
        kmod().depmod(self.path(), kernel)

    def remove_kernel(self, kernel):
        import shutil
        shutil.rmtree(self.path('lib', 'modules', kernel))

    def add_artifact(self, name, text):
        """An installer the operator uploaded to the host: (its path on the host, its sha256)."""
        import hashlib
        path = self.path(ARTIFACTS, name)
        write(path, text)
        return '/' + ARTIFACTS + '/' + name, hashlib.sha256(text.encode()).hexdigest()

    def add_device(self, dev, pci_class):
        """A device's sysfs directory and IOMMU group (spec entry: bdf, id, numa, group, subsystem)."""
        bdf = dev['bdf']
        vendor, device = dev['id'].split(':')
        sub_vendor, sub_device = dev.get('subsystem', DEFAULT_SUBSYSTEM).split(':')
        os.makedirs(self.pci(bdf), exist_ok=True)
        for name, value in (('vendor', '0x' + vendor), ('device', '0x' + device),
                            ('subsystem_vendor', '0x' + sub_vendor), ('subsystem_device', '0x' + sub_device),
                            ('class', pci_class),
                            ('numa_node', str(dev['numa'])), ('irq', str(dev.get('irq', 100 + dev['group']))),
                            ('driver_override', '(null)')):
            write(self.pci(bdf, name), value + '\n')
        os.makedirs(os.path.join(self.group_dir(dev['group']), 'devices'), exist_ok=True)
        write(os.path.join(self.group_dir(dev['group']), 'type'), '%s\n' % dev.get('group_type', 'DMA-FQ'))
        relink(os.path.join(self.group_dir(dev['group']), 'devices', bdf), '../../../../bus/pci/devices/' + bdf)
        relink(self.pci(bdf, 'iommu_group'), '../../../../kernel/iommu_groups/%d' % dev['group'])

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
        if driver == 'nvidia' and not kmod().nvidia_loaded(self):
            driver = None    # no driver to probe: the device stays without one until nvidia loads
        old = self.driver(bdf)
        if old:
            try:
                os.unlink(self.path('sys/bus/pci/drivers', old, bdf))
            except FileNotFoundError:
                pass
            os.unlink(self.pci(bdf, 'driver'))
        info = self.path('proc/driver/nvidia/gpus', bdf)
        if old == 'nvidia' and driver != 'nvidia' and os.path.isdir(info):
            import shutil
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

    def probe_gpus(self):
        """The drivers a boot binds: driverctl's overrides (by address: whatever sits at the address gets it),
        else nvidia if it is loaded. A fresh boot probes in bus order, so minors are handed out again from 0."""
        overrides = self.overrides()
        import shutil
        shutil.rmtree(self.path('proc/driver/nvidia/gpus'), ignore_errors=True)
        for bdf in self.gpu_bdfs():
            self.bind(bdf, None)
        default = DEFAULT_DRIVER if kmod().nvidia_loaded(self) else None
        for bdf in sorted(self.gpu_bdfs()):
            self.bind(bdf, overrides.get(bdf, default))
            write(self.pci(bdf, 'driver_override'), (overrides[bdf] if bdf in overrides else '(null)') + '\n')

    def renumber(self, moves):
        """The host came back from a power cycle with devices at other addresses - a BIOS update renumbered
        the buses, a card moved: moves {old address: new address}, all at once (a swap is two moves). A
        device keeps its IDs, NUMA node and IOMMU group; the spec follows it (a later reboot lays out the new
        addresses). Drivers are bound as a boot binds them, driverctl's overrides by address included. The
        running command line, module options and guests are left as they are."""
        spec = self.spec
        entries = {e['bdf']: e for e in spec['gpus'] + spec.get('devices', [])}
        missing = sorted(set(moves) - set(entries))
        taken = sorted(set(moves.values()) & (set(entries) - set(moves)))
        if missing or taken:
            raise ValueError('renumber: no device at %s; already taken: %s' % (missing, taken))
        gpus = set(self.gpu_bdfs())
        for old in moves:
            if old in gpus:
                self.bind(old, None)
        staged = {}
        for old, new in moves.items():
            entry = entries[old]
            tmp = self.pci('.moving-' + new)
            os.rename(self.pci(old), tmp)
            os.unlink(os.path.join(self.group_dir(entry['group']), 'devices', old))
            driver = os.path.join(self.path('sys/bus/pci/drivers'), str(entry.get('driver')), old)
            if os.path.lexists(driver) and old not in gpus:
                os.unlink(driver)
            staged[new] = (tmp, entry)
        for new, (tmp, entry) in staged.items():
            os.rename(tmp, self.pci(new))
            relink(os.path.join(self.group_dir(entry['group']), 'devices', new), '../../../../bus/pci/devices/' + new)
            if entry not in spec['gpus'] and entry.get('driver'):
                relink(self.path('sys/bus/pci/drivers', entry['driver'], new), '../../devices/' + new)
            entry['bdf'] = new
        write(os.path.join(self.lab, 'spec.json'), json.dumps(spec, indent=2) + '\n')
        self.probe_gpus()

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
        # (nvidia's lines are its load's: lab/kmod.py)

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
        import shutil
        dst = self.path('boot/initrd-modprobe.d')
        shutil.rmtree(dst)
        shutil.copytree(self.path('etc/modprobe.d'), dst)

    def reboot(self):
        """What a power cycle makes of the installed state: command line, module options, bindings."""
        cmdline = self.installed_cmdline()
        write_in_place(self.path('proc/cmdline'), self.boot_line(cmdline) + '\n')
        import uuid
        write_in_place(self.path('proc/boot_id'), str(uuid.uuid4()) + '\n')
        write_in_place(self.path('proc/osrelease'), self.spec['kernel'] + '\n')
        gtype = domain_type(cmdline)
        spec = self.spec
        for dev in spec['gpus'] + spec.get('devices', []):
            write(os.path.join(self.group_dir(dev['group']), 'type'), gtype + '\n')
        kmod().clear(self)
        self.probe_gpus()
        params = {}
        d = self.path('boot/initrd-modprobe.d')
        for name in sorted(os.listdir(d)):
            params.update(modprobe_nvidia_params(read(os.path.join(d, name))))
        # The kernel's AER counters start again at boot; the log starts a new boot.
        for bdf in self.gpu_bdfs():
            for severity in AER_TYPES:
                self.write_aer(bdf, severity, {})
        self.boot_messages()
        # nvidia loads from the initramfs with its options (the GPUs on no other driver bind to it).
        kmod().boot(self, params)


PERSISTENCED_UNIT = '''[Unit]
Description=NVIDIA Persistence Daemon
Wants=syslog.target

[Service]
Type=simple
ExecStart=/usr/bin/python3 /usr/lib/gpuhost-lab/persistenced.py
ExecStopPost=/bin/rm -rf /var/run/nvidia-persistenced

[Install]
WantedBy=multi-user.target
'''


def nvidia_proc_version(version):
    """/proc/driver/nvidia/version as the open kernel module writes it."""
    return ('NVRM version: %s\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1) \n'
            % kmod().flavour_line(version))


def nvidia_installer_name(version):
    return 'NVIDIA-Linux-x86_64-%s.run' % version


def cuda_installer_name(version, driver=NVIDIA_VERSION):
    return 'cuda_%s_%s_linux.run' % (version, driver)


# SIMULATED installers: shell scripts that leave in a container what NVIDIA's leave there (files, versions,
# messages), and refuse what NVIDIA's refuse in a container. Their text - and so their sha256, which
# Pulumi.lab.yaml pins - depends only on the version (tests/unit/test_lab_runtime.py holds them to it).
NVIDIA_INSTALLER = r'''#!/bin/sh
# NVIDIA-Linux-x86_64-@VERSION@.run - SIMULATED by the gpuhost lab (lab/hostsim.py), not NVIDIA's installer.
# With --no-kernel-module it installs what NVIDIA's installs in an LXC container: the user-space libraries
# (libcuda.so.@VERSION@, libnvidia-ml.so.@VERSION@ and their .so.1 links) and nvidia-smi, replacing any other
# version's. nvidia-smi compares its own version with the running kernel module's (/proc/driver/nvidia/version)
# and fails as NVML does when they differ.
# Without it (on the host) it first unloads the nvidia modules (refusing as NVIDIA's does when one stays loaded),
# needs the kernel's headers (/lib/modules/<kernel>/build), removes an earlier install, builds the kernel modules
# for the running kernel (uname -r) or --kernel-name's - with --dkms through DKMS (/usr/src/nvidia-<version>, `dkms
# install`), else into /lib/modules/<kernel>/kernel/drivers/video - runs depmod, installs the user space and loads
# nvidia (modprobe) unless --skip-module-load or the kernel is not the running one. --uninstall removes all that.
set -eu
version=@VERSION@
kernel=yes
dkms=no
type=open
kname=
load=yes
uninstall=no
for a in "$@"; do
  case $a in
    --no-kernel-module|--no-kernel-modules) kernel=no ;;
    -s|--silent|--no-questions|--ui=none|--no-nouveau-check|--accept-license|--no-x-check|--no-install-compat32-libs) ;;
    --dkms) dkms=yes ;;
    --no-dkms) dkms=no ;;
    --kernel-module-type=open|-m=kernel-open|--kernel-module-build-directory=kernel-open) type=open ;;
    --kernel-module-type=proprietary|-m=kernel|--kernel-module-build-directory=kernel) type=proprietary ;;
    --kernel-name=?*|-k=?*) kname=${a#*=} ;;
    --skip-module-load) load=no ;;
    --uninstall) uninstall=yes ;;
    *) echo "ERROR: Unrecognised option: '$a'" >&2; exit 1 ;;
  esac
done
mkdir -p /var/log
log=/var/log/nvidia-installer.log
echo "nvidia-installer log file '$log'" > "$log"
echo "nvidia-installer command line:" >> "$log"
for a in "$@"; do echo "    $a" >> "$log"; done
fail() {
  echo "ERROR: $1" | tee -a "$log" >&2
  echo "ERROR: Installation has failed.  Please see the file '/var/log/nvidia-installer.log' for details.  You may find suggestions on fixing installation problems in the README available on the Linux driver download page at www.nvidia.com." | tee -a "$log" >&2
  exit 1
}
lib=/usr/lib/x86_64-linux-gnu
unload_modules() {
  for m in nvidia_drm nvidia_modeset nvidia_uvm nvidia_peermem nvidia; do
    if [ -e "/sys/module/$m/refcnt" ]; then rmmod "$m" >> "$log" 2>&1 || true; fi
  done
  for m in nvidia_drm nvidia_modeset nvidia_uvm nvidia_peermem nvidia; do
    if [ -e "/sys/module/$m/refcnt" ]; then
      fail "An NVIDIA kernel module '$m' appears to already be loaded in your kernel.  This may be because it is in use (for example, by an X server, a CUDA program, or the NVIDIA Persistence Daemon), but this may also happen if your kernel was configured without support for module unloading.  Please be sure to exit any programs that may be using the GPU(s) before attempting to upgrade your driver.  If no GPU-based programs are running, you know that your kernel supports module unloading, and you still receive this message, then an error may have occurred that has corrupted an NVIDIA kernel module's usage count, for which the simplest remedy is to reboot your computer."
    fi
  done
}
remove_modules() {   # an earlier install's kernel modules: DKMS's, then the installer's own
  if [ -d /var/lib/dkms/nvidia ]; then
    for d in /var/lib/dkms/nvidia/*/; do
      [ -d "$d" ] || continue   # (none left: the pattern itself)
      v=${d%/}; v=${v##*/}
      case $v in kernel-*) continue ;; esac
      dkms remove "nvidia/$v" --all >> "$log" 2>&1
      rm -rf "/usr/src/nvidia-$v"
    done
  fi
  for tree in /lib/modules/*/; do
    [ -d "${tree}kernel/drivers/video" ] || continue
    found=no
    for ko in nvidia.ko nvidia-uvm.ko nvidia-modeset.ko nvidia-drm.ko; do
      if [ -e "${tree}kernel/drivers/video/$ko" ]; then rm -f "${tree}kernel/drivers/video/$ko"; found=yes; fi
    done
    k=${tree%/}; k=${k##*/}
    if [ $found = yes ]; then depmod -a "$k"; fi
  done
}
if [ $uninstall = yes ]; then
  unload_modules
  remove_modules
  rm -f "$lib"/libcuda.so* "$lib"/libnvidia-ml.so* /usr/bin/nvidia-smi
  echo "Uninstallation of existing driver: NVIDIA Accelerated Graphics Driver for Linux-x86_64 ($version) is complete." | tee -a "$log"
  exit 0
fi
if [ $kernel = yes ]; then
  running=$(uname -r)
  k=${kname:-$running}
  echo "-> Installing NVIDIA driver version $version" >> "$log"
  echo "-> Kernel module type: $type; kernel: $k" >> "$log"
  unload_modules
  if [ ! -e "/lib/modules/$k/build" ]; then
    fail "Unable to find the kernel source tree for the currently running kernel.  Please make sure you have installed the kernel source files for your kernel and that they are properly configured; on Red Hat Linux systems, for example, be sure you have the 'kernel-source' or 'kernel-devel' RPM installed.  If you know the correct kernel source files are installed, you may specify the kernel source path with the '--kernel-source-path' command line option."
  fi
  if [ $type = open ]; then license='Dual MIT/GPL'; else license=NVIDIA; fi
  remove_modules
  if [ $dkms = yes ]; then
    src=/usr/src/nvidia-$version
    mkdir -p "$src"
    printf 'PACKAGE_NAME="nvidia"\nPACKAGE_VERSION="%s"\nAUTOINSTALL="yes"\nMODULE_LICENSE="%s"\n' "$version" "$license" > "$src/dkms.conf"
    for i in 0 1 2 3; do
      set -- nvidia nvidia-uvm nvidia-modeset nvidia-drm
      shift $i
      printf 'BUILT_MODULE_NAME[%s]="%s"\nDEST_MODULE_LOCATION[%s]="/kernel/drivers/video"\n' $i "$1" $i >> "$src/dkms.conf"
    done
    echo "-> Installing DKMS kernel module:" >> "$log"
    dkms add "nvidia/$version" >> "$log" 2>&1 || fail "Failed to run \`dkms add -m nvidia -v $version\`"
    if ! dkms install "nvidia/$version" -k "$k" >> "$log" 2>&1; then
      fail "Failed to install the kernel module through DKMS. No kernel module was installed; please try installing again without DKMS, or check the DKMS logs for more information."
    fi
  else
    python3 /usr/lib/gpuhost-lab/kmod.py build "/lib/modules/$k/kernel/drivers/video" "$version" "$k" "$license"
    depmod -a "$k"
  fi
fi
lib=/usr/lib/x86_64-linux-gnu
mkdir -p "$lib"
rm -f "$lib"/libcuda.so* "$lib"/libnvidia-ml.so*
for l in libcuda.so libnvidia-ml.so; do
  printf 'SIMULATED %s %s\n' "$l" "$version" > "$lib/$l.$version"
  ln -sf "$l.$version" "$lib/$l.1"
  ln -sf "$l.1" "$lib/$l"
done
cat > /usr/bin/nvidia-smi.new <<'NVSMI'
#!/bin/sh
# nvidia-smi - SIMULATED by the gpuhost lab (installed by the lab's NVIDIA-Linux-x86_64-<version>.run).
lib=$(readlink -f /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 2>/dev/null || true)
mine=${lib##*/libnvidia-ml.so.}
kernel=$(sed -n 's/^NVRM version:.*[[:space:]]\([0-9][0-9]*\.[0-9][0-9.]*\)[[:space:]].*/\1/p' /proc/driver/nvidia/version 2>/dev/null | head -n 1)
if [ -z "$kernel" ]; then
  echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running."
  exit 9
fi
if [ "$kernel" != "$mine" ]; then
  echo "Failed to initialize NVML: Driver/library version mismatch"
  echo "NVML library version: ${mine%.*}"
  exit 18   # NVML_ERROR_LIB_RM_VERSION_MISMATCH in nvml.h
fi
case " $* " in
  *" --query-gpu=driver_version "*)
    n=0
    for d in /dev/nvidia[0-9]*; do [ -e "$d" ] && n=$((n + 1)); done
    if [ $n = 0 ]; then echo "No devices were found"; exit 6; fi
    i=0
    while [ $i -lt $n ]; do echo "$mine"; i=$((i + 1)); done ;;
  *) printf 'NVIDIA-SMI %s    Driver Version: %s    CUDA Version: 13.0\n' "$mine" "$mine" ;;
esac
NVSMI
chmod 755 /usr/bin/nvidia-smi.new
mv -f /usr/bin/nvidia-smi.new /usr/bin/nvidia-smi
if [ $kernel = yes ] && [ $load = yes ] && [ "$k" = "$running" ]; then
  modprobe nvidia >> "$log" 2>&1 || fail "Unable to load the kernel module 'nvidia.ko'.  This happens most frequently when this kernel module was built against the wrong or improperly configured kernel sources, with a version of gcc that differs from the one used to build the target kernel, or if another driver, such as nouveau, is present and prevents the NVIDIA kernel module from obtaining ownership of the NVIDIA GPU(s), or no NVIDIA GPU installed in this system is supported by this NVIDIA Linux graphics driver release."
fi
echo "Installation of the NVIDIA Accelerated Graphics Driver for Linux-x86_64 (version: $version) is now complete." | tee -a "$log"
'''

CUDA_INSTALLER = r'''#!/bin/sh
# cuda_@VERSION@_<driver>_linux.run - SIMULATED by the gpuhost lab (lab/hostsim.py), not NVIDIA's runfile. With
# --silent --toolkit [--toolkitpath=DIR] it installs what the toolkit leaves for SGLang's JIT: DIR/version.json
# and a DIR/bin/nvcc that prints its release.
set -eu
version=@VERSION@
release=${version%.*}
toolkit=no
path=/usr/local/cuda-$release
for a in "$@"; do
  case $a in
    --silent|--override|--no-man-page|--no-opengl-libs|--no-drm) ;;
    --toolkit) toolkit=yes ;;
    --toolkitpath=*) path=${a#--toolkitpath=} ;;
    --driver) echo "ERROR: the driver cannot be installed in a container (no kernel module); install it on the host" >&2; exit 1 ;;
    *) echo "Unknown option: $a" >&2; exit 1 ;;
  esac
done
mkdir -p /var/log
if [ $toolkit = no ]; then
  echo "Nothing selected to install (--silent needs --toolkit or --driver)" | tee /var/log/cuda-installer.log >&2
  exit 1
fi
mkdir -p "$path/bin"
cat > "$path/version.json" <<JSON
{
   "cuda" : {
      "name" : "CUDA SDK",
      "version" : "$version"
   },
   "cuda_nvcc" : {
      "name" : "CUDA NVCC",
      "version" : "$release.88"
   }
}
JSON
cat > "$path/bin/nvcc" <<NVCC
#!/bin/sh
# nvcc - SIMULATED by the gpuhost lab.
if [ "\${1:-}" = --version ]; then
  echo "nvcc: NVIDIA (R) Cuda compiler driver"
  echo "Copyright (c) 2005-2025 NVIDIA Corporation"
  echo "Cuda compilation tools, release $release, V$release.88"
  exit 0
fi
echo "nvcc fatal   : No input files specified; use option --help for more information" >&2
exit 1
NVCC
chmod 755 "$path/bin/nvcc"
echo "Toolkit:  Installed in $path/" | tee /var/log/cuda-installer.log
'''


def nvidia_installer(version):
    return NVIDIA_INSTALLER.replace('@VERSION@', version)


def cuda_installer(version):
    return CUDA_INSTALLER.replace('@VERSION@', version)


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


def module_elf(info):
    """A kernel module file as modinfo and depmod read it: a 64-bit x86-64 relocatable ELF whose .modinfo section
    holds KEY=value strings (version=, name=, vermagic=, ...) - all a module's metadata is - beside an empty
    .gnu.linkonce.this_module (what marks a file as a module) and the section names. No code: the lab loads nothing."""
    import struct
    sections = [('.modinfo', b''.join(('%s=%s' % kv).encode() + b'\0' for kv in info.items())),
                ('.gnu.linkonce.this_module', b'\0' * 64)]
    names, offsets = b'\0', []
    for name, _ in sections:
        offsets.append(len(names))
        names += name.encode() + b'\0'
    sections.append(('.shstrtab', names + b'.shstrtab\0'))
    offsets.append(len(names))
    body, headers, pos = b'', [], 64
    for (name, data), off in zip(sections, offsets):
        kind = 3 if name == '.shstrtab' else 1          # SHT_STRTAB, SHT_PROGBITS
        headers.append(struct.pack('<IIQQQQIIQQ', off, kind, 0, 0, pos, len(data), 0, 0, 1, 0))
        body += data
        pos += len(data)
    # e_type ET_REL, e_machine EM_X86_64, e_shoff after the sections' data, e_shstrndx the last section.
    head = b'\x7fELF' + bytes([2, 1, 1, 0]) + b'\0' * 8 + struct.pack(
        '<HHIQQQIHHHHHH', 1, 62, 1, 0, 0, pos, 0, 64, 0, 0, 64, len(headers) + 1, len(headers))
    return head + body + b'\0' * 64 + b''.join(headers)


def read(path):
    with open(path) as f:
        return f.read()


def write(path, text):
    """Atomic write, so a test reading while a tool writes never sees half a file."""
    import tempfile
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
