"""gpuhost-collector: the host reports its own state, live, for node_exporter's textfile collector.

Runs ON THE HOST, not in Pulumi: `pulumi up` installs it as /usr/local/sbin/gpuhost-collector with
gpuhost-collector.service (oneshot) and gpuhost-collector.timer (every gpuhost:monitoring.
collector_interval_s, 30 s by default), and its declared state as /etc/gpuhost/collector.json
(components/monitoring.py). Each run writes /var/lib/prometheus/node-exporter/gpuhost-collector.prom
atomically (a temporary file in the same directory, not named *.prom, renamed over it):

  * per GPU: the driver bound, the IOMMU group's type, the NUMA node, where the config assigns it
    (gpuhost_gpu_info), and - its own series, for a critical alert - whether a Blackwell GPU sits in an
    identity domain (gpuhost_blackwell_gpu_identity_domain);
  * the kernel command line running vs declared, the live nvidia module parameters vs declared, and
    whether the host must reboot to run its declared state, and why by kind - decided by the very
    function `pulumi up` uses (components/host_state.py reboot_reasons);
  * NVIDIA Xid events per GPU and Xid code, and AMD-Vi IO_PAGE_FAULT events per PCI device, as counters
    since boot, from the kernel log (journalctl --dmesg: the whole boot, also when the collector starts
    late, and a cursor to go on from); PCIe AER error counts per GPU from sysfs;
  * the host's NVIDIA kernel module version, the driver version the config declares (gpuhost:nvidia.driver, when
    it does), and for each installed kernel (/lib/modules/*) the nvidia module built for it - `modinfo -k KERNEL -F
    version nvidia`, the read hostscripts/driver_facts.sh makes: a kernel without one boots with no GPU driver;
  * the collector's own last success.

Why Python and not a shell + awk script: the reboot reasons and the kernel command-line rules (every
spelling of iommu=pt the kernel accepts) are the program's own Python (grammar/cmdline.py,
components/host_state.py). The script carries those modules inside it (components/monitoring.py
collector_script()), so the host decides exactly as `pulumi up` does; a second implementation in awk
would drift from the first. Every Proxmox VE host has python3 (Debian's); this module uses the standard
library only.

Counters survive restarts without counting twice: the position in the kernel log (journald's cursor)
and the counts read up to it are kept together in one state file, keyed by the boot id and replaced
atomically. A run that dies before replacing it is repeated from the old position by the next run; a
state of another boot starts again from zero (the kernel's own counters, AER, restart at boot too). A
lost state file costs nothing: the journal still holds the whole boot, and counting from its start gives
the same numbers.

The container side of the driver/library check (the NVIDIA user space inside the container, which must
be the host module's version) is not read here: the program installs it and exports its version in
gpuhost.prom (gpuhost_nvidia_driver_info{side="container"}); the alert GpuhostNvidiaDriverLibraryMismatch
compares it with this collector's live gpuhost_nvidia_module_info.
"""

import argparse
import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from components import exposition, host_state
from grammar import cmdline

# 2: expect.nvidia_driver (the declared driver version, null when gpuhost:nvidia.driver is absent).
CONFIG_VERSION = 2
STATE_VERSION = 1
EXIT_CONFIG = 2     # the config file is missing or refused: nothing was written
EXIT_WRITE = 1      # the textfile could not be written
# Xid codes operators page on (NVIDIA's Xid catalog): 79 the GPU has fallen off the bus, 48 a double-bit
# ECC error, 94/95 contained/uncontained ECC errors, 119/120 GSP RPC timeout / GSP error, 143 a GPU that did
# not initialise (its FSP/GSP did not boot: after a driver load or upgrade). Each needs the GPU reset (94: to
# remap the row); their series are written from 0 for every GPU, so the first event is an increase Prometheus
# sees, not a series that appears at 1.
CRITICAL_XIDS = (48, 79, 94, 95, 119, 120, 143)
AER_SEVERITIES = (('correctable', 'aer_dev_correctable', 'TOTAL_ERR_COR'),
                  ('nonfatal', 'aer_dev_nonfatal', 'TOTAL_ERR_NONFATAL'),
                  ('fatal', 'aer_dev_fatal', 'TOTAL_ERR_FATAL'))
BDF_RE = re.compile(r'^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$')
PCI_ID_RE = re.compile(r'^[0-9a-f]{4}:[0-9a-f]{4}$')
# NVIDIA's driver: "NVRM: Xid (PCI:0000:01:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
# (domain:bus:device, no function; newer drivers may add more inside the parentheses, e.g. a MIG instance).
XID_RE = re.compile(r'NVRM: Xid \(PCI:([0-9a-fA-F]{4}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})(?:\.[0-7])?[^)]*\): '
                    r'(\d+)\b')
# drivers/iommu/amd/iommu.c amd_iommu_report_page_fault(), with pr_fmt/dev_fmt "AMD-Vi: ": a device the
# IOMMU driver knows is logged through pci_err() ("<driver> <address>: AMD-Vi: Event logged [IO_PAGE_FAULT
# domain=... address=... flags=...]"), an unknown one with its address inside ("AMD-Vi: Event logged
# [IO_PAGE_FAULT device=0000:01:00.0 domain=..."; kernels before 6.x print it without the PCI segment).
FAULT_DEV_RE = re.compile(r'(?:^|\s)([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]): AMD-Vi: Event logged '
                          r'\[IO_PAGE_FAULT ')
FAULT_ADDR_RE = re.compile(r'AMD-Vi: Event logged \[IO_PAGE_FAULT device=((?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:'
                           r'[0-9a-fA-F]{2}\.[0-7]) ')
JOURNALCTL = ('journalctl', '--dmesg', '--output=json', '--no-pager', '--quiet')
# config/runtime.py DriverVersion's grammar (tests/unit/test_collector.py holds them equal).
DRIVER_VERSION_RE = re.compile(r'^\d{3}\.\d{1,3}(\.\d{1,3})?$')
# kmod's modinfo, when the kernel's module index has no module of that name: the one failure that means "none built"
# (any other - a broken index, a timeout - is "unknown", never "none").
MODINFO_NOT_FOUND = 'Module nvidia not found'
MODINFO_TIMEOUT_S = 10
# Where Debian puts modinfo (kmod), should the unit's PATH not name it.
MODINFO_PATHS = ('/usr/sbin/modinfo', '/sbin/modinfo', '/usr/bin/modinfo', '/bin/modinfo')


class ConfigError(Exception):
    pass


class OlderConfig(ConfigError):
    """A config of an earlier version than this script's: the program is replacing it right now."""


# ------------------------------------------------------------------------------------ the config

def _str(value, key, pattern=None, example=''):
    if not isinstance(value, str) or not value or any(ord(c) < 0x20 or ord(c) == 0x7f for c in value):
        raise ConfigError('%s: %r is not a non-empty string without control characters%s' % (
            key, value, ' (e.g. %s)' % example if example else ''))
    if pattern is not None and not pattern.match(value):
        raise ConfigError('%s: %r is not %s' % (key, value, example))
    return value


def _path(value, key):
    _str(value, key, example='/var/lib/gpuhost/collector-state.json')
    if not value.startswith('/') or '/../' in value + '/' or value.endswith('/'):
        raise ConfigError('%s: %r is not an absolute, normalised file path' % (key, value))
    return value


def _list(value, key, check):
    if not isinstance(value, list):
        raise ConfigError('%s: %r is not a list' % (key, value))
    return [check(v, '%s[%d]' % (key, i)) for i, v in enumerate(value)]


def validate_config(doc) -> dict:
    """The collector's config (written by `pulumi up`: components/monitoring.py collector_config()),
    each value checked before it is used. Raises ConfigError naming the key and the value."""
    if not isinstance(doc, dict):
        raise ConfigError('the top level is %s, not an object' % type(doc).__name__)
    want = {'version', 'textfile', 'state', 'interval_s', 'blackwell_ids', 'expect'}
    if set(doc) != want:
        raise ConfigError('keys %s missing, %s unknown' % (sorted(want - set(doc)) or 'none',
                                                           sorted(set(doc) - want) or 'none'))
    if isinstance(doc['version'], int) and not isinstance(doc['version'], bool) and doc['version'] < CONFIG_VERSION:
        raise OlderConfig('version %d is older than this collector\'s %d' % (doc['version'], CONFIG_VERSION))
    if doc['version'] != CONFIG_VERSION:
        raise ConfigError('version: %r, this collector reads version %d' % (doc['version'], CONFIG_VERSION))
    textfile = _path(doc['textfile'], 'textfile')
    if not textfile.endswith('.prom'):
        raise ConfigError('textfile: %r does not end in .prom, so node_exporter would not read it' % textfile)
    interval = doc['interval_s']
    if isinstance(interval, bool) or not isinstance(interval, int) or not 1 <= interval <= 86400:
        raise ConfigError('interval_s: %r is not a number of seconds (1-86400)' % (interval,))
    expect = doc['expect']
    if not isinstance(expect, dict):
        raise ConfigError('expect: %r is not an object' % (expect,))
    keys = {'ensure_args', 'policy', 'domain', 'nvidia_params', 'vfio_devices', 'container_devices', 'nvidia_driver'}
    if set(expect) != keys:
        raise ConfigError('expect: keys %s missing, %s unknown' % (sorted(keys - set(expect)) or 'none',
                                                                   sorted(set(expect) - keys) or 'none'))
    policy = expect['policy']
    if not isinstance(policy, dict) or not all(isinstance(k, str) and isinstance(v, bool) for k, v in policy.items()):
        raise ConfigError('expect.policy: %r is not an object of booleans' % (policy,))
    params = expect['nvidia_params']
    if not isinstance(params, dict):
        raise ConfigError('expect.nvidia_params: %r is not an object' % (params,))
    for k, v in params.items():
        _str(k, 'expect.nvidia_params key', re.compile(r'^[A-Za-z][A-Za-z0-9]*$'), 'a parameter name without NVreg_')
        _str(v, 'expect.nvidia_params.%s' % k, re.compile(r'^-?[0-9]+$'), 'an integer as a string ("1")')
    driver = expect['nvidia_driver']
    if driver is not None:
        _str(driver, 'expect.nvidia_driver', DRIVER_VERSION_RE, 'an NVIDIA driver version (580.95.05), or null')
    return {
        'version': CONFIG_VERSION, 'textfile': textfile, 'state': _path(doc['state'], 'state'),
        'interval_s': interval,
        'blackwell_ids': _list(doc['blackwell_ids'], 'blackwell_ids',
                               lambda v, k: _str(v, k, PCI_ID_RE, 'a vendor:device ID (10de:2bb5)')),
        'expect': {
            'ensure_args': _list(expect['ensure_args'], 'expect.ensure_args', lambda v, k: _str(v, k)),
            'policy': dict(policy),
            'domain': _str(expect['domain'], 'expect.domain', re.compile(r'^(DMA-FQ|DMA|identity)$'),
                           'DMA-FQ, DMA or identity'),
            'nvidia_params': dict(params),
            'vfio_devices': _list(expect['vfio_devices'], 'expect.vfio_devices',
                                  lambda v, k: _str(v, k, BDF_RE, 'a PCI address (0000:81:00.0)')),
            'container_devices': _list(expect['container_devices'], 'expect.container_devices',
                                       lambda v, k: _str(v, k, BDF_RE, 'a PCI address (0000:01:00.0)')),
            'nvidia_driver': driver,
        },
    }


def load_config(path) -> dict:
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as e:
        raise ConfigError('cannot read it: %s' % (e.strerror or e)) from None
    except ValueError as e:
        raise ConfigError('not JSON: %s' % e) from None
    return validate_config(doc)


# -------------------------------------------------------------------------------- reading the host

def _read(path, default=None):
    try:
        with open(path) as f:
            return f.read()
    except (FileNotFoundError, NotADirectoryError):
        return default


def _value(path):
    """A sysfs attribute as `$(cat file)` gives it (trailing newlines cut), None if it does not exist."""
    text = _read(path)
    return None if text is None else text.rstrip('\n')


def read_host(sysfs='/sys', procfs='/proc') -> host_state.HostFacts:
    """What components/scripts/host_facts.sh reports of the running host - every NVIDIA display-class
    device (vendor 0x10de, class 0x03...) with its ID, NUMA node, driver, driver_override, IOMMU group
    and type, its /dev/nvidiaN minor; /proc/cmdline; /proc/driver/nvidia/params - read the same way and
    into the same HostFacts (tests/unit/test_collector.py runs both on one simulated host)."""
    cmdline_text = _read(os.path.join(procfs, 'cmdline'), '')
    # host_facts.sh: tabs and line breaks to spaces, trailing spaces cut; parse_facts() strips the rest.
    running = cmdline_text.replace('\t', ' ').replace('\n', ' ').replace('\r', ' ').rstrip(' ').strip()
    facts = host_state.HostFacts(boot='', running=running)
    devices = os.path.join(sysfs, 'bus', 'pci', 'devices')
    for bdf in sorted(os.listdir(devices)):
        dev = os.path.join(devices, bdf)
        vendor = _value(os.path.join(dev, 'vendor'))
        if vendor != '0x10de':
            continue
        cls = _value(os.path.join(dev, 'class'))
        if not (cls if cls is not None else '0x03').startswith('0x03'):
            continue
        device = _value(os.path.join(dev, 'device')) or ''
        numa = _value(os.path.join(dev, 'numa_node')) or ''
        link = os.path.join(dev, 'driver')
        driver = os.path.basename(os.readlink(link)) if os.path.islink(link) else None
        override = _value(os.path.join(dev, 'driver_override'))
        group = gtype = None
        glink = os.path.join(dev, 'iommu_group')
        if os.path.islink(glink):
            name = os.path.basename(os.readlink(glink))
            group = int(name) if name.isdigit() else None
            gtype = _value(os.path.join(sysfs, 'kernel', 'iommu_groups', name, 'type'))
            gtype = None if gtype in (None, '-') else gtype
        gpu = host_state.Gpu(bdf, '%s:%s' % (vendor[2:], device[2:] if device.startswith('0x') else device),
                             int(numa) if numa.lstrip('-').isdigit() else -1, driver,
                             None if override in (None, '(null)', '-', '') else override, group, gtype)
        info = _read(os.path.join(procfs, 'driver', 'nvidia', 'gpus', bdf, 'information'))
        for line in (info or '').splitlines():
            if line.startswith('Device Minor'):
                value = line.split(':', 1)[1].strip()
                gpu.minor = int(value) if value.isdigit() else None
        facts.gpus[bdf] = gpu
    for line in (_read(os.path.join(procfs, 'driver', 'nvidia', 'params')) or '').splitlines():
        key, _, value = line.partition(':')
        facts.params[key.strip()] = value.strip()
    return facts


def read_aer(sysfs, bdf) -> dict:
    """{'correctable': n, 'nonfatal': n, 'fatal': n}: the kernel's AER counters of the device since boot
    (drivers/pci/pcie/aer.c: one "<name> <count>" line per error type, then TOTAL_ERR_*); a severity
    whose file is missing (no AER capability, or an old kernel) is left out."""
    out = {}
    for severity, name, total in AER_SEVERITIES:
        text = _read(os.path.join(sysfs, 'bus', 'pci', 'devices', bdf, name))
        if text is None:
            continue
        for line in text.splitlines():
            words = line.split()
            if len(words) == 2 and words[0] == total and words[1].isdigit():
                out[severity] = int(words[1])
    return out


def module_version(sysfs='/sys'):
    """The loaded nvidia module's version (/sys/module/nvidia/version), None if it is not loaded."""
    text = _read(os.path.join(sysfs, 'module', 'nvidia', 'version'))
    return text.strip() or None if text is not None else None


def find_modinfo():
    """modinfo's path (kmod's: every Proxmox VE host has it), None where the host has none."""
    return shutil.which('modinfo') or next((p for p in MODINFO_PATHS if os.access(p, os.X_OK)), None)


def kernel_modules(root='/', modinfo=None, run=subprocess.run, timeout=MODINFO_TIMEOUT_S, log=None):
    """({kernel: version}, readable): each installed kernel (a directory of ROOT/lib/modules) and the version of
    the nvidia module built for it, as `modinfo -k KERNEL -F version nvidia` reads it (hostscripts/driver_facts.sh's
    command; with ROOT other than /, `-b ROOT`): '' when modinfo finds none (a boot into that kernel has no GPU
    driver). What cannot be told is not guessed: a kernel modinfo failed for otherwise, or that it did not answer
    within `timeout` seconds, is left out, and so is every kernel when there is no modinfo or no /lib/modules;
    readable is then False. After a timeout the kernels left are not asked (a hung disk would hang each of them)."""
    log = log or (lambda msg: None)
    tree = os.path.join(root, 'lib', 'modules')
    try:
        kernels = sorted(n for n in os.listdir(tree) if os.path.isdir(os.path.join(tree, n)))
    except OSError as e:
        log('cannot list %s: %s' % (tree, e.strerror or e))
        return {}, False
    if modinfo is None:
        log('no modinfo (kmod) on the host: which kernels have the nvidia module is unknown')
        return {}, False
    found, readable = {}, True
    for kernel in kernels:
        argv = [modinfo] + (['-b', root] if os.path.normpath(root) != '/' else []) + [
            '-k', kernel, '-F', 'version', 'nvidia']
        try:
            res = run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                      timeout=timeout)
        except subprocess.TimeoutExpired:
            log('modinfo -k %s: no answer within %g s; kernels not read: %s' % (
                kernel, timeout, ' '.join(kernels[kernels.index(kernel):])))
            return found, False
        except OSError as e:
            log('cannot run %s: %s' % (modinfo, e.strerror or e))
            return found, False
        out = res.stdout.decode('utf-8', 'replace').strip().splitlines()
        err = res.stderr.decode('utf-8', 'replace').strip()
        if res.returncode == 0 and out and out[0].strip():
            found[kernel] = out[0].strip()
        elif res.returncode != 0 and MODINFO_NOT_FOUND in err:
            found[kernel] = ''
        else:
            readable = False
            log('modinfo -k %s -F version nvidia: exit %d, %s' % (kernel, res.returncode,
                                                                  err[-300:] or 'no version printed'))
    return found, readable


def boot_id(procfs='/proc') -> str:
    return _read(os.path.join(procfs, 'sys', 'kernel', 'random', 'boot_id'), '').strip()


# ------------------------------------------------------------------------------ the kernel log

def message_text(value) -> str:
    """journalctl's JSON gives MESSAGE as a string, or as an array of byte values when it is not
    printable UTF-8 (systemd's json output); None when the field is absent."""
    if isinstance(value, list):
        return bytes(v for v in value if isinstance(v, int) and 0 <= v < 256).decode('utf-8', 'replace')
    return value if isinstance(value, str) else ''


def scan(message: str, gpus=()):
    """An Xid or an IOMMU page fault in one kernel message: ('xid', address, code), ('iommu_page_fault',
    address), or None. An Xid names domain:bus:device only; it is the GPU in `gpus` at that slot
    (function 0 if none is known)."""
    m = XID_RE.search(message)
    if m:
        slot = ('%s:%s:%s' % m.group(1, 2, 3)).lower()
        bdf = next((g for g in sorted(gpus) if g.startswith(slot + '.')), slot + '.0')
        return ('xid', bdf, int(m.group(4)))
    m = FAULT_DEV_RE.search(message) or FAULT_ADDR_RE.search(message)
    if m:
        bdf = m.group(1).lower()
        return ('iommu_page_fault', bdf if bdf.count(':') == 2 else '0000:' + bdf)
    return None


def journal(after=None, run=subprocess.Popen):
    """(cursor, _BOOT_ID, MESSAGE) of every kernel message of this boot after the cursor, oldest first,
    from `journalctl --dmesg` (kernel messages of the current boot) in JSON."""
    argv = list(JOURNALCTL) + (['--after-cursor=%s' % after] if after else [])
    proc = run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    # Both pipes read together (communicate): journalctl blocked on a full stderr pipe would never end stdout.
    stdout, stderr = proc.communicate()
    if proc.returncode != 0:
        raise OSError(errno.EIO, 'journalctl exited with %d: %s' % (
            proc.returncode, stderr.decode('utf-8', 'replace').strip()[-300:] or '(no message)'))
    out = []
    for raw in stdout.splitlines():
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get('__CURSOR'), str):
            out.append((entry['__CURSOR'], entry.get('_BOOT_ID') or '', message_text(entry.get('MESSAGE'))))
    return out


def fresh_state(boot) -> dict:
    return {'version': STATE_VERSION, 'boot_id': boot, 'cursor': None, 'xid': {}, 'iommu_page_faults': {},
            'last_success': None}


def load_state(path, boot) -> dict:
    """The counts and the kernel-log position of this boot; a fresh state for another boot, or when the
    file is missing or unreadable (the next read starts at the boot's first message)."""
    try:
        with open(path) as f:
            state = json.load(f)
    except (OSError, ValueError):
        return fresh_state(boot)
    if not isinstance(state, dict) or state.get('version') != STATE_VERSION:
        return fresh_state(boot)
    if state.get('boot_id') != boot:
        # Another boot: its counts end with it (as the kernel's own); the last success is a wall-clock time.
        new = fresh_state(boot)
        if isinstance(state.get('last_success'), (int, float)):
            new['last_success'] = state['last_success']
        return new
    if not isinstance(state.get('xid'), dict) or not isinstance(state.get('iommu_page_faults'), dict):
        return fresh_state(boot)
    return state


def count(state: dict, entries, gpus=()) -> dict:
    """The state after the kernel messages `entries` ((cursor, boot id, message), oldest first): counts
    raised, the cursor moved to the last one. Messages of another boot (journalctl --dmesg shows only
    the current one) are skipped. Pure: returns a new state."""
    new = json.loads(json.dumps(state))
    boot = new['boot_id'].replace('-', '')
    for cursor, entry_boot, message in entries:
        new['cursor'] = cursor
        if entry_boot and entry_boot.replace('-', '') != boot:
            continue
        event = scan(message, gpus)
        if event is None:
            continue
        if event[0] == 'xid':
            per_gpu = new['xid'].setdefault(event[1], {})
            per_gpu[str(event[2])] = per_gpu.get(str(event[2]), 0) + 1
        else:
            new['iommu_page_faults'][event[1]] = new['iommu_page_faults'].get(event[1], 0) + 1
    return new


# ------------------------------------------------------------------------------------ the textfile

def render(cfg, facts, version, aer, state, sources, kernels=None) -> str:
    """The textfile's content. facts: read_host()'s HostFacts or None (not read); version: the nvidia
    module's version or None; aer: {address: read_aer()}; state: the counts since boot and the last
    success (when the kernel log could not be read this time, the counts as far as they were read);
    sources: {source: ok}; kernels: kernel_modules()'s ({kernel: version, '' none}, readable), None not read."""
    expect = cfg['expect']
    t = exposition.Text()
    t.family('gpuhost_collector_last_success_timestamp_seconds',
             'When a run of the collector last read every source (Unix time); a run that could not keeps it.',
             [({}, state['last_success'])] if state.get('last_success') is not None else [])
    t.family('gpuhost_collector_interval_seconds', 'How often the collector runs (its systemd timer).',
             [({}, cfg['interval_s'])])
    t.family('gpuhost_collector_source_ok', 'Whether the collector\'s last run read this source (1) or not (0; '
             'its log: journalctl -u gpuhost-collector.service).', [({'source': s}, 1 if ok else 0)
                                                                    for s, ok in sorted(sources.items())])
    t.family('gpuhost_iommu_declared_domain_info',
             'The IOMMU default domain type the config declares (the running types: gpuhost_gpu_info).',
             [({'domain': expect['domain']}, 1)])
    if facts is not None:
        reasons = host_state.reboot_reasons(facts, expect)
        t.family('gpuhost_reboot_required', 'Whether the running host differs from its declared state in ways a '
                 'reboot applies (1) or not (0), live.', [({}, 1 if reasons else 0)])
        t.family('gpuhost_reboot_reasons', 'Differences between the running and the declared host state that a '
                 'reboot applies, by kind, live.',
                 [({'kind': kind}, n) for kind, n in host_state.reason_counts(reasons)])
        gpus = sorted(facts.gpus.values(), key=lambda g: g.address)
        t.family('gpuhost_gpu_info', 'A GPU of the host: where the config assigns it (container, vm, host), the '
                 'driver bound to it and its IOMMU group\'s type, live.',
                 [({'gpu': host_state.nvidia_bus_id(g.address), 'pci_bus_id': g.address, 'pci_id': g.id,
                    'numa_node': str(g.numa), 'assigned_to': host_state.assignment(g.address, expect),
                    'driver': g.driver or 'none', 'iommu_group': '' if g.group is None else str(g.group),
                    'iommu_group_type': g.group_type or 'none'}, 1) for g in gpus])
        t.family('gpuhost_blackwell_gpu_identity_domain', 'Whether this Blackwell GPU sits in an identity '
                 '(passthrough) IOMMU domain (1), which bricks it (FSP error 0x177) until a power cycle.',
                 [(_gpu(g.address), 1 if g.group_type == 'identity' and g.id in cfg['blackwell_ids'] else 0)
                  for g in gpus if g.id in cfg['blackwell_ids']])
        running = facts.running_args()
        t.family('gpuhost_kernel_cmdline_declared_arg_running', 'Whether the running kernel command line has '
                 'this declared parameter (1) or not (0: a reboot applies it).',
                 [({'arg': a}, 1 if cmdline.has(running, a) else 0) for a in expect['ensure_args']])
        t.family('gpuhost_kernel_cmdline_unwanted_arg_running', 'A parameter on the running kernel command line '
                 'that the config forbids (identity/passthrough, IOMMU off, vfio-pci.ids, ...).',
                 [({'arg': w}, 1) for w, _ in cmdline.dangers(running, expect['policy'])])
        samples = []
        for name, value in sorted(expect['nvidia_params'].items()):
            samples.append(({'name': name, 'side': 'declared'}, int(value)))
            have = facts.params.get(name)
            if have is not None and re.match(r'^-?[0-9]+$', have):
                samples.append(({'name': name, 'side': 'running'}, int(have)))
        t.family('gpuhost_nvidia_module_parameter', 'An nvidia module parameter (NVreg_<name>): declared by the '
                 'config, running as /proc/driver/nvidia/params reports it.', samples)
    if version is not None:
        t.family('gpuhost_nvidia_module_info', 'The loaded NVIDIA kernel module (/sys/module/nvidia/version).',
                 [({'version': version}, 1)])
    if expect['nvidia_driver'] is not None:
        t.family('gpuhost_nvidia_driver_declared_info', 'The NVIDIA driver version the config declares '
                 '(gpuhost:nvidia.driver; the loaded module: gpuhost_nvidia_module_info).',
                 [({'version': expect['nvidia_driver']}, 1)])
    if kernels is not None:
        built, readable = kernels
        t.family('gpuhost_nvidia_kernel_modules_readable', 'Whether the collector read the nvidia module of every '
                 'installed kernel (1) or not (0: no modinfo, no /lib/modules, or modinfo failed or timed out; the '
                 'kernels it could not read are left out).', [({}, 1 if readable else 0)])
        t.family('gpuhost_nvidia_kernel_module_built', 'Whether an nvidia module is built for this installed kernel '
                 '(1) or not (0: a boot into it has no GPU driver), as modinfo -k KERNEL reads it.',
                 [({'kernel': k}, 1 if v else 0) for k, v in sorted(built.items())])
        t.family('gpuhost_nvidia_kernel_module_info', 'The version of the nvidia module built for this installed '
                 'kernel (modinfo -k KERNEL -F version nvidia).',
                 [({'kernel': k, 'version': v}, 1) for k, v in sorted(built.items()) if v])
    known = sorted(facts.gpus) if facts is not None else []
    xids = {(bdf, int(code)): n for bdf, codes in state['xid'].items() for code, n in codes.items()}
    for bdf in known:
        for code in CRITICAL_XIDS:
            xids.setdefault((bdf, code), 0)
    t.family('gpuhost_gpu_xid_errors_total', 'NVIDIA Xid events logged by the kernel since boot, per GPU and '
             'Xid code.', [(dict(_gpu(bdf), xid=str(code)), n) for (bdf, code), n in sorted(xids.items())],
             kind='counter')
    faults = dict(state['iommu_page_faults'])
    for bdf in known:
        faults.setdefault(bdf, 0)
    t.family('gpuhost_iommu_page_faults_total', 'AMD-Vi IO_PAGE_FAULT events the kernel logged since boot, per '
             'PCI device (the kernel rate-limits them: a lower bound).',
             [({'pci_bus_id': bdf}, n) for bdf, n in sorted(faults.items())], kind='counter')
    t.family('gpuhost_gpu_pcie_aer_errors_total', 'PCIe AER errors of the GPU since boot, by severity (sysfs '
             'aer_dev_correctable, aer_dev_nonfatal, aer_dev_fatal).',
             [(dict(_gpu(bdf), severity=sev), counts[sev]) for bdf, counts in sorted(aer.items())
              for sev, _, _ in AER_SEVERITIES if sev in counts], kind='counter')
    return t.text()


def _gpu(bdf):
    return {'gpu': host_state.nvidia_bus_id(bdf), 'pci_bus_id': bdf}


def replace(path, text, mode=0o644, sync=False):
    """Write path atomically: a temporary file in the same directory (not named *.prom, so node_exporter
    never reads it half written), then renamed over it."""
    d = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(dir=d, prefix='.%s.' % os.path.basename(path), suffix='.tmp')
    try:
        with os.fdopen(fd, 'w') as f:
            f.write(text)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def locked(path):
    """One run at a time (a manual run beside the timer's): both would read from the same cursor."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def collect(cfg, sysfs='/sys', procfs='/proc', clock=time.time, read_journal=journal, log=None, rootfs='/',
            modinfo=find_modinfo) -> str:
    """One run: read every source, move the kernel-log state on (saved before the textfile, so the file
    never shows counts the state does not hold), write the textfile. Returns its content. A source that
    cannot be read is left out of the file and reported (gpuhost_collector_source_ok 0, a line on stderr);
    the other sources are still written."""
    log = log or (lambda msg: sys.stderr.write('gpuhost-collector: %s\n' % msg))
    sources = {}
    facts = None
    try:
        facts = read_host(sysfs, procfs)
        sources['host'] = True
    except OSError as e:
        sources['host'] = False
        log('cannot read the GPUs, /proc/cmdline or the nvidia parameters: %s' % e)
    version = module_version(sysfs)
    # Not a source of the last success: a host without modinfo says so in its own series (readable 0) rather than
    # blinding every other alert through the stale one.
    kernels = kernel_modules(rootfs, modinfo(), log=log)
    aer = {}
    try:
        for bdf in sorted(facts.gpus) if facts is not None else []:
            counts = read_aer(sysfs, bdf)
            if counts:
                aer[bdf] = counts
        sources['aer'] = facts is not None
    except OSError as e:
        sources['aer'] = False
        log('cannot read the AER counters: %s' % e)
    boot = boot_id(procfs)
    state = load_state(cfg['state'], boot)
    try:
        entries = read_journal(state['cursor'])
        sources['kernel_log'] = True
    except OSError as e:
        sources['kernel_log'] = False
        log('cannot read the kernel log (journalctl --dmesg): %s' % e)
        entries = None
    new = count(state, entries, facts.gpus if facts is not None else ()) if entries is not None else dict(state)
    if all(sources.values()):
        new['last_success'] = round(clock(), 3)
    if new != state:
        # Saved (and synced) before the textfile: a run that dies after this line is repeated by the next from
        # the new position, one that dies before it from the old one - never counted twice.
        replace(cfg['state'], json.dumps(new, sort_keys=True) + '\n', 0o600, sync=True)
    text = render(cfg, facts, version, aer, new, sources, kernels)
    replace(cfg['textfile'], text)
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog='gpuhost-collector', description='Write the host\'s live GPU safety and '
                                 'health metrics for node_exporter\'s textfile collector (installed by gpuhost).')
    ap.add_argument('--config', default='/etc/gpuhost/collector.json', help='the declared state (pulumi up writes it)')
    ap.add_argument('--path.sysfs', dest='sysfs', default='/sys', help='sysfs mount point (as node_exporter\'s)')
    ap.add_argument('--path.procfs', dest='procfs', default='/proc', help='procfs mount point (as node_exporter\'s)')
    ap.add_argument('--path.rootfs', dest='rootfs', default='/', help='the root the installed kernels are read under '
                    '(its lib/modules; as node_exporter\'s)')
    ap.add_argument('--print', action='store_true', help='also print the textfile written')
    args = ap.parse_args(argv)
    try:
        cfg = load_config(args.config)
    except OlderConfig as e:
        # `pulumi up` writes this script before its config (components/monitoring.py): between the two, the new
        # script meets the old config. It skips the run rather than fail it; a config that stays old (the run
        # died in between) shows as the collector's stale alert, and the next `up` writes it.
        sys.stderr.write('gpuhost-collector: %s: %s: `pulumi up` is replacing it; this run is skipped.\n' % (
            args.config, e))
        return 0
    except ConfigError as e:
        sys.stderr.write('gpuhost-collector: %s: %s. The file is written by `pulumi up`: run it again rather than '
                         'editing the file.\n' % (args.config, e))
        return EXIT_CONFIG
    try:
        os.makedirs(os.path.dirname(cfg['state']), mode=0o700, exist_ok=True)
        with locked(cfg['state'] + '.lock'):
            text = collect(cfg, args.sysfs, args.procfs, rootfs=args.rootfs)
    except OSError as e:
        sys.stderr.write('gpuhost-collector: cannot write %s or %s: %s\n' % (cfg['textfile'], cfg['state'], e))
        return EXIT_WRITE
    if args.print:
        sys.stdout.write(text)
    return 0


if __name__ == '__main__':
    sys.exit(main())
