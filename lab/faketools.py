#!/usr/bin/python3
"""The host commands the program runs over SSH, simulated: driverctl, proxmox-boot-tool, update-grub,
update-initramfs, reboot, pct, and the two parts of systemd the collector needs on a host whose PID 1 is not
systemd: journalctl (the kernel log journald keeps) and systemctl (unit files, enablement, active units;
a oneshot service's start runs its ExecStart). Installed as /usr/local/sbin/<tool> inside the lab's SSH namespace
(lab/bin), so the program's scripts call them by their real names with their real arguments.

Stdlib only (runs under the host's /usr/bin/python3).
"""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, HERE)
import container  # noqa: E402
import hostsim  # noqa: E402

CONFIG = '/etc/gpuhost-lab.json'


def lab_dir():
    if os.environ.get('GPUHOST_LAB'):
        return os.environ['GPUHOST_LAB']
    with open(CONFIG) as f:
        return json.load(f)['lab']


def die(msg, code=1):
    sys.stderr.write(msg.rstrip('\n') + '\n')
    sys.exit(code)


# ----------------------------------------------------------------------------- driverctl

def driverctl(host, args):
    """driverctl [--nosave] set-override|unset-override|list-overrides|list-devices ..."""
    nosave = '--nosave' in args
    args = [a for a in args if a not in ('--nosave', '-v', '--verbose')]
    if not args:
        die('Usage: driverctl [OPTIONS...] {COMMAND} ...', 2)
    cmd, rest = args[0], args[1:]
    known = set(host.gpu_bdfs())
    if cmd == 'list-overrides':
        for bdf, drv in sorted(host.overrides().items()):
            print('%s %s' % (bdf, drv))
        return
    if cmd == 'list-devices':
        overrides = host.overrides()
        for bdf in host.gpu_bdfs():
            print('%s %s%s' % (bdf, host.driver(bdf) or '(none)', ' [*]' if bdf in overrides else ''))
        return
    if cmd in ('set-override', 'unset-override'):
        if not rest or rest[0] not in known:
            die('driverctl: device %s not found' % (rest[0] if rest else ''), 1)
        bdf = rest[0]
        path = host.path('etc/driverctl.d', 'pci-' + bdf)
        if cmd == 'set-override':
            if len(rest) != 2:
                die('Usage: driverctl set-override <device> <driver>', 2)
            drv = rest[1]
            if drv not in hostsim.GPU_DRIVERS and drv != 'none':
                die('driverctl: failed to bind device %s to driver %s' % (bdf, drv), 1)
            hostsim.write(host.pci(bdf, 'driver_override'), drv + '\n')
            host.bind(bdf, None if drv == 'none' else drv)
            if not nosave:
                hostsim.write(path, drv + '\n')
        else:
            hostsim.write(host.pci(bdf, 'driver_override'), '(null)\n')
            host.bind(bdf, hostsim.DEFAULT_DRIVER)
            if os.path.exists(path) and not nosave:
                os.unlink(path)
        return
    die('driverctl: unknown command %s' % cmd, 2)


# ----------------------------------------------------------------------- boot tooling

def proxmox_boot_tool(host, args):
    cmd = args[0] if args else ''
    if not os.path.exists(host.path('etc/kernel/proxmox-boot-uuids')):
        die('E: /etc/kernel/proxmox-boot-uuids does not exist.', 2)
    if cmd == 'status':
        print('Re-executing \'/usr/sbin/proxmox-boot-tool\' in new private mount namespace..')
        print('System currently booted with uefi')
        print('7A3B-1C2D is configured with: uefi (versions: %s)' % host.spec['kernel'])
        return
    if cmd == 'refresh':
        line = host.refresh_boot()
        print('Running hook script \'proxmox-auto-removal\'..')
        print('Copying and configuring kernels on /dev/disk/by-uuid/7A3B-1C2D')
        print('\tCopying kernel and creating boot-entry for %s' % host.spec['kernel'])
        print('\tkernel command line: %s' % line)
        return
    die('proxmox-boot-tool: unknown command %r' % cmd, 2)


def update_grub(host, args):
    if host.spec['boot'] != 'grub':
        # On a systemd-boot host grub's config is not what boots the kernel.
        print('Generating grub configuration file ...')
        print('done')
        return
    line = host.refresh_boot()
    print('Generating grub configuration file ...')
    print('Found linux image: /boot/vmlinuz-%s' % host.spec['kernel'])
    print('done (%s)' % line)


def update_initramfs(host, args):
    if '-u' not in args:
        die('Usage: update-initramfs {-c|-d|-u} [-k version] [-v] [-b directory]', 2)
    host.update_initramfs()
    print('update-initramfs: Generating /boot/initrd.img-%s' % host.spec['kernel'])
    if host.spec['boot'] == 'systemd-boot':
        print('Running hook script \'zz-proxmox-boot\'..')
        host.refresh_boot()


def reboot(host, args):
    """Like systemctl reboot: queue the reboot and return at once. The lab daemon (labctl) then takes
    the host down - every SSH connection dropped, sshd and the API away for a while, guests stopped -
    applies the installed state (hostsim.Host.reboot: new boot_id, command line, bindings), and brings
    it back up, starting the guests marked onboot."""
    path = os.path.join(lab_dir(), 'control', 'reboot-request.json')
    os.makedirs(os.path.dirname(path), exist_ok=True)
    hostsim.write(path, json.dumps({'t': time.time(), 'argv': args}) + '\n')


def ssh_session():
    """Pids of the sshd processes of the SSH connection this command runs under (none outside SSH)."""
    out, pid = [], os.getppid()
    while pid > 1:
        try:
            with open('/proc/%d/cmdline' % pid, 'rb') as f:
                cmd = f.read().split(b'\0')[0]
            with open('/proc/%d/stat' % pid) as f:
                ppid = int(f.read().rsplit(')', 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        if b'[listener]' in cmd:
            break
        if cmd.startswith(b'sshd: '):
            out.append(pid)
        pid = ppid
    return out


def hang():
    """Hang like a tool stuck on a lock or a dead mount: no output, no exit, until killed. The lab
    still ends it when the SSH connection it runs under is gone (the client gave up), so a test's
    hang does not outlive the test."""
    session = ssh_session()
    while True:
        time.sleep(0.5)
        if session and not any(running(pid) for pid in session):
            os._exit(129)


def running(pid):
    try:
        with open('/proc/%d/stat' % pid) as f:
            return f.read().rsplit(')', 1)[1].split()[0] not in ('Z', 'X')
    except (OSError, IndexError):
        return False


# ------------------------------------------------------------------------------- pct

def ct_dir(vmid):
    return os.path.join(lab_dir(), 'ct', str(vmid))


def api_ct_status(vmid, node):
    """The container's status as fakepve (the lab's Proxmox) has it, or None if it holds no such
    container. Asked over its API with root@pam, as the real pct reads the live state."""
    import ssl
    import urllib.parse
    import urllib.request
    try:
        with open(os.path.join(lab_dir(), 'lab.json')) as f:
            pve = json.load(f)['pve']
        with open(pve['password_file']) as f:
            password = f.read()
        ctx = ssl.create_default_context(cafile=pve['cafile'])
        base = 'https://%s:%s/api2/json' % (pve['host'], pve['port'])
        data = urllib.parse.urlencode({'username': 'root@pam', 'password': password}).encode()
        with urllib.request.urlopen(base + '/access/ticket', data=data, context=ctx, timeout=5) as r:
            ticket = json.load(r)['data']['ticket']
        req = urllib.request.Request('%s/nodes/%s/lxc/%s/status/current' % (base, node, vmid),
                                     headers={'Cookie': 'PVEAuthCookie=' + ticket})
        with urllib.request.urlopen(req, context=ctx, timeout=5) as r:
            return json.load(r)['data']['status']
    except (OSError, ValueError, KeyError):
        return None


def ct_status(vmid, node):
    path = os.path.join(ct_dir(vmid), 'status')
    # The lab daemon boots or shuts down a container (lab/container.py) when fakepve's state changes; it
    # writes `status` once systemd runs in it or it is down, a second or two later. A real pct sees the
    # state the moment the API changed it (pct start returns once the container's init runs). So pct
    # waits, a little, until the container has caught up with what the API says.
    live = api_ct_status(vmid, node)
    deadline = time.time() + 15
    while live is not None and time.time() < deadline:
        try:
            with open(path) as f:
                if f.read().strip() == live:
                    break
        except FileNotFoundError:
            pass
        time.sleep(0.1)
    if not os.path.exists(path):
        die("Configuration file 'nodes/%s/lxc/%s.conf' does not exist" % (node, vmid), 2)
    with open(path) as f:
        return f.read().strip()


def pct(host, args):
    if not args:
        die('ERROR: no command specified', 255)
    cmd, rest = args[0], args[1:]
    if not rest or not rest[0].isdigit():
        die("400 not enough arguments\npct %s <vmid>" % cmd, 255)
    vmid = rest[0]
    status = ct_status(vmid, host.spec['node'])
    if cmd == 'status':
        print('status: %s' % status)
        return
    if cmd in ('push', 'pull', 'exec', 'enter') and status != 'running':
        die('CT %s not running' % vmid, 255)
    ct = container.Container(ct_dir(vmid))
    if cmd == 'push':
        opts, pos = parse_opts(rest[1:])
        if len(pos) != 2:
            die('400 wrong number of arguments\npct push <vmid> <file> <destination> [OPTIONS]', 255)
        src, dst = pos
        if not dst.startswith('/'):
            die('destination must be an absolute path', 255)
        try:
            data = open(src, 'rb')
        except OSError as e:
            die('failed to open %s for reading: %s' % (src, e.strerror), 255)
        # Written by a process inside the container, as pct does it: its mounts, its symlinks.
        script = ('[ -d "$(dirname "$1")" ] || { echo "failed to open $1 for writing: No such file or directory" >&2;'
                  ' exit 255; }; cat > "$1" && chown "$3:$4" "$1" && chmod "$2" "$1"')
        with data:
            res = subprocess.run(ct.enter_argv(['/bin/sh', '-c', script, 'pct-push', dst, opts.get('perms', '0644'),
                                                opts.get('user', '0'), opts.get('group', '0')]), stdin=data)
        sys.exit(res.returncode)
    if cmd == 'pull':
        opts, pos = parse_opts(rest[1:])
        if len(pos) != 2:
            die('400 wrong number of arguments\npct pull <vmid> <path> <destination> [OPTIONS]', 255)
        src, dst = pos
        with open(dst, 'wb') as out:
            res = subprocess.run(ct.enter_argv(['/bin/sh', '-c', '[ -f "$1" ] || { echo "failed to open $1 for '
                                                'reading: No such file or directory" >&2; exit 255; }; cat "$1"',
                                                'pct-pull', src]), stdout=out)
        if res.returncode != 0:
            os.unlink(dst)
        sys.exit(res.returncode)
    if cmd == 'exec':
        argv = rest[1:]
        if argv and argv[0] == '--':
            argv = argv[1:]
        if not argv:
            die('missing command', 255)
        os.execvp('nsenter', ct.enter_argv(argv))
    die('pct: unknown command %s' % cmd, 255)


def parse_opts(args):
    opts, pos = {}, []
    it = iter(args)
    for a in it:
        if a.startswith('--'):
            opts[a[2:]] = next(it, '')
        else:
            pos.append(a)
    return opts, pos


# ---------------------------------------------------------------------------- journalctl

def journal_cursor(entry, seqnum_id):
    """journald's cursor format: s=<seqnum id>;i=<seqnum>;b=<boot id>;m=<monotonic>;t=<realtime>;x=<hash>."""
    return 's=%s;i=%x;b=%s;m=%x;t=%x;x=%016x' % (seqnum_id, entry['seq'], entry['boot'].replace('-', ''),
                                                 entry['mono'], entry['real'],
                                                 (entry['seq'] * 0x9e3779b97f4a7c15) & 0xffffffffffffffff)


def journal_field(value):
    """systemd's JSON output: a field that is not printable UTF-8 (control characters other than tab and
    newline) is an array of its bytes."""
    if any((ord(c) < 0x20 and c not in '\t\n') or ord(c) == 0x7f for c in value):
        return list(value.encode('utf-8'))
    return value


def journalctl(host, args):
    """journalctl --dmesg --output=json [--boot] [--no-pager] [--quiet] [--after-cursor=CURSOR]: the kernel
    messages of the current boot (--dmesg implies --boot) after the cursor, as journald's JSON lines. Only
    what the collector uses is simulated; anything else is refused, so nothing passes here that a real
    journalctl would read differently."""
    dmesg, output, after = False, None, None
    it = iter(args)
    for a in it:
        if a in ('-k', '--dmesg'):
            dmesg = True
        elif a in ('-o', '--output'):
            output = next(it, None)
        elif a.startswith('--output='):
            output = a.split('=', 1)[1]
        elif a in ('-b', '--boot', '--no-pager', '-q', '--quiet'):
            pass
        elif a.startswith('--after-cursor='):
            after = a.split('=', 1)[1]
        else:
            die('journalctl (lab): %s is not simulated; the lab keeps only the kernel log (--dmesg --output=json)' % a,
                1)
    if not dmesg or output != 'json':
        die('journalctl (lab): only `journalctl --dmesg --output=json` is simulated', 1)
    boot = hostsim.read(host.path('proc/boot_id')).strip()
    seqnum_id = host.spec.get('journal_seqnum_id', 'a1b2c3d4e5f60718293a4b5c6d7e8f90')
    start = 0
    if after is not None:
        fields = dict(f.split('=', 1) for f in after.split(';') if '=' in f)
        try:
            start = int(fields['i'], 16) if fields.get('s') == seqnum_id else 0
        except (KeyError, ValueError):
            die('Failed to seek to cursor: Invalid argument', 1)
    node = host.spec['node']
    for e in host.kernel_messages(boot):
        if e['seq'] <= start:
            continue
        print(json.dumps({'__CURSOR': journal_cursor(e, seqnum_id), '__REALTIME_TIMESTAMP': str(e['real']),
                          '__MONOTONIC_TIMESTAMP': str(e['mono']), '_BOOT_ID': e['boot'].replace('-', ''),
                          'PRIORITY': str(e['prio']), 'SYSLOG_FACILITY': '0', 'SYSLOG_IDENTIFIER': 'kernel',
                          '_TRANSPORT': 'kernel', '_HOSTNAME': node, '_SOURCE_MONOTONIC_TIMESTAMP': str(e['mono']),
                          'MESSAGE': journal_field(e['msg'])}))


# ----------------------------------------------------------------------------- systemctl

UNIT_DIR = '/etc/systemd/system'
# systemd's PATH for services (path-lookup.c DEFAULT_PATH_NORMAL).
SERVICE_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'


class Systemd(object):
    """PID 1's side of systemctl, kept in LAB/host/run/systemd.json under a lock: the unit definitions it
    loaded (read from disk at first use and at daemon-reload only - an edited unit file without a
    daemon-reload is not what runs, as on a real host), the active units, the running services."""

    def __init__(self, host):
        self.host = host
        self.path = host.systemd_path()

    def __enter__(self):
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        import fcntl
        self.lock = open(self.path + '.lock', 'w')
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        self.state = self.host.systemd_state()
        return self

    def __exit__(self, *exc):
        hostsim.write(self.path, json.dumps(self.state, sort_keys=True) + '\n')
        self.lock.close()

    def unit_file(self, unit):
        return os.path.join(UNIT_DIR, unit)

    def load(self, unit):
        if unit not in self.state['loaded']:
            try:
                with open(self.unit_file(unit)) as f:
                    self.state['loaded'][unit] = f.read()
            except FileNotFoundError:
                return None
        return self.state['loaded'][unit]

    def reload(self):
        self.state['loaded'] = {u: t for u, t in ((u, self._read(u)) for u in self.state['loaded']) if t is not None}

    def _read(self, unit):
        try:
            with open(self.unit_file(unit)) as f:
                return f.read()
        except FileNotFoundError:
            return None


def unit_settings(text):
    """{(section, key): [values]} of a unit file (the lab's units: no continuation lines, no drop-ins)."""
    out, section = {}, None
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in '#;':
            continue
        if line.startswith('[') and line.endswith(']'):
            section = line[1:-1]
            continue
        key, _, value = line.partition('=')
        out.setdefault((section, key.strip()), []).append(value.strip())
    return out


def wanted_links(unit, text):
    return [os.path.join(UNIT_DIR, '%s.wants' % target, unit)
            for value in unit_settings(text).get(('Install', 'WantedBy'), []) for target in value.split()]


def run_service(sd, unit, text):
    """`systemctl start` of a oneshot service: its ExecStart run now, as systemd runs it (a clean
    environment with systemd's PATH, cwd /), and waited for. Returns the exit status."""
    settings = unit_settings(text)
    if settings.get(('Service', 'Type'), ['simple'])[-1] != 'oneshot':
        die('systemctl (lab): only oneshot services are simulated, %s is not one' % unit, 1)
    (line,) = settings[('Service', 'ExecStart')]
    if not re.match(r'^[A-Za-z0-9/_.=,:@+ -]+$', line):
        die('systemctl (lab): only plain ExecStart= lines are simulated: %r' % line, 1)
    proc = subprocess.Popen(shlex.split(line), cwd='/', env={'PATH': SERVICE_PATH, 'LANG': 'C.UTF-8'},
                            start_new_session=True)
    sd.state['running'][unit] = proc.pid
    return proc


def systemctl(host, args):
    """systemctl daemon-reload | enable|disable [--now] [--quiet] UNIT | start|stop|restart UNIT |
    is-enabled|is-active UNIT | reset-failed [UNIT], for units in /etc/systemd/system. The lab host has no
    systemd, so timers do not fire here: tests/lablib.py HostTimers starts a timer's service on its
    schedule (OnUnitActiveSec of the loaded timer) with `systemctl start`, as PID 1 would."""
    quiet = '--quiet' in args or '-q' in args
    now = '--now' in args
    words = [a for a in args if a not in ('--quiet', '-q', '--now', '--no-pager', '--no-block')]
    if not words or any(w.startswith('-') for w in words):
        die('systemctl (lab): %s is not simulated' % ' '.join(args), 1)
    cmd, units = words[0], words[1:]
    if cmd == 'daemon-reload':
        with Systemd(host) as sd:
            sd.reload()
        return
    if cmd == 'reset-failed':
        return
    if len(units) != 1:
        die('systemctl (lab): %s takes one unit here' % cmd, 1)
    unit = units[0]
    if cmd in ('start', 'restart'):
        with Systemd(host) as sd:
            text = sd.load(unit)
            if text is None:
                die('Failed to %s %s: Unit %s not found.' % (cmd, unit, unit), 5)
            if unit.endswith('.timer'):
                if unit not in sd.state['active']:
                    sd.state['active'] = sorted(sd.state['active'] + [unit])
                return
            pid = sd.state['running'].get(unit)
            proc = None if pid and running(pid) else run_service(sd, unit, text)
        if proc is None:
            # A start while the service runs joins the job under way (systemd merges them): its result.
            while running(pid) and unit in host.systemd_state()['running']:
                time.sleep(0.05)
            code = host.systemd_state().get('result', {}).get(unit, 0)
        else:
            code = proc.wait()
            with Systemd(host) as sd:
                sd.state['running'].pop(unit, None)
                sd.state.setdefault('result', {})[unit] = code
        if code != 0:
            die('Job for %s failed because the control process exited with error code.\nSee "systemctl status %s" '
                'and "journalctl -xeu %s" for details.' % (unit, unit, unit), 1)
        return
    if cmd == 'stop':
        stop(host, unit)
        return
    if cmd == 'enable':
        with Systemd(host) as sd:
            text = sd._read(unit)
            if text is None:
                die('Failed to enable unit: Unit file %s does not exist.' % unit, 1)
            for link in wanted_links(unit, text):
                os.makedirs(os.path.dirname(link), exist_ok=True)
                if not os.path.islink(link):
                    os.symlink(sd.unit_file(unit), link)
                    if not quiet:
                        print('Created symlink %s \u2192 %s.' % (link, sd.unit_file(unit)), file=sys.stderr)
        if now:
            systemctl(host, ['start', unit])
        return
    if cmd == 'disable':
        with Systemd(host) as sd:
            text = sd._read(unit) or sd.state['loaded'].get(unit)
            if text is None:
                die('Failed to disable unit: Unit file %s does not exist.' % unit, 1)
            for link in wanted_links(unit, text):
                if os.path.islink(link):
                    os.unlink(link)
                    if not quiet:
                        print('Removed "%s".' % link, file=sys.stderr)
        if now:
            stop(host, unit)
        return
    if cmd == 'is-enabled':
        with Systemd(host) as sd:
            text = sd._read(unit)
        if text is None:
            die('Failed to get unit file state for %s: No such file or directory' % unit, 1)
        links = wanted_links(unit, text)
        state = 'static' if not links else 'enabled' if all(os.path.islink(x) for x in links) else 'disabled'
        print(state)
        sys.exit(0 if state in ('enabled', 'static') else 1)
    if cmd == 'is-active':
        st = host.systemd_state()
        state = 'activating' if unit in st['running'] else 'active' if unit in st['active'] else 'inactive'
        print(state)
        sys.exit(0 if state == 'active' else 3)
    die('systemctl (lab): %s is not simulated' % cmd, 1)


def stop(host, unit):
    """A timer stops firing; a running service is sent SIGTERM (then SIGKILL after 10 s) and waited for."""
    with Systemd(host) as sd:
        sd.state['active'] = [u for u in sd.state['active'] if u != unit]
        pid = sd.state['running'].get(unit)
    if pid is None:
        return
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.time() + 10
    while running(pid) and time.time() < deadline:
        time.sleep(0.05)
    if running(pid):
        os.killpg(pid, signal.SIGKILL)
    while unit in host.systemd_state()['running'] and time.time() < deadline + 5:
        time.sleep(0.05)


TOOLS = {
    'driverctl': driverctl,
    'proxmox-boot-tool': proxmox_boot_tool,
    'update-grub': update_grub,
    'update-initramfs': update_initramfs,
    'reboot': reboot,
    'pct': pct,
    'journalctl': journalctl,
    'systemctl': systemctl,
}


def main():
    tool = os.path.basename(sys.argv[0])
    host = hostsim.Host(lab_dir())
    # Fault injection for tests: a file LAB/host/faults/<tool> (or <tool>.<subcommand>) makes the
    # tool fail with the file's text, or hang if the text is `hang`.
    for name in (tool, '%s.%s' % (tool, sys.argv[1] if len(sys.argv) > 1 else '')):
        fault = host.path('faults', name)
        if os.path.exists(fault):
            with open(fault) as f:
                text = f.read()
            if text.strip() == 'hang':
                hang()
            die(text or '%s: injected failure' % tool, 1)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    TOOLS[tool](host, sys.argv[1:])


if __name__ == '__main__':
    main()
