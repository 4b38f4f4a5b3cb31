#!/usr/bin/python3
"""The host commands the program runs over SSH that a Debian host without Proxmox lacks, simulated:
driverctl, proxmox-boot-tool, update-grub, update-initramfs, reboot (the lab daemon reboots the host), pct (into
the lab's containers, and their live state, through the lab daemon: lab/pctbroker.py), and journalctl's kernel
log - the simulated kernel's messages for `journalctl --dmesg`, everything else the host's real journalctl - and the
nvidia kernel modules' rmmod, modprobe and dkms (lab/kmod.py: /sys/module, /lib/modules, /var/lib/dkms). Installed as
/usr/local/sbin/<tool> on the lab host (lab/labhost.py), first on root's PATH, so the program's scripts call
them by their real names with their real arguments; systemd and its systemctl are the host's own.

Stdlib only (runs under the host's /usr/bin/python3).
"""

import json
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, HERE)
import hostsim  # noqa: E402
import pctbroker  # noqa: E402

CONFIG = '/etc/gpuhost-lab.json'
REAL_JOURNALCTL = '/usr/bin/journalctl'


def config():
    with open(CONFIG) as f:
        return json.load(f)


def lab_dir():
    if os.environ.get('GPUHOST_LAB'):
        return os.environ['GPUHOST_LAB']
    return config()['lab']


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


def live_ct_status(vmid, node):
    """The container's status as fakepve (the lab's Proxmox) has it, or None if it holds no such container (or
    the lab daemon does not answer). The real pct reads the live state from the cluster filesystem on its own
    node, not over the API; the lab's asks the lab daemon, which holds fakepve, over pct's socket
    (lab/pctbroker.py): no login, no API request, and the API's faults (an injected failure, a network
    scenario, an offline node) do not reach it."""
    try:
        return pctbroker.status(os.path.join(lab_dir(), 'run', pctbroker.SOCKET), vmid, node)
    except (OSError, pctbroker.BrokerError, ValueError, KeyError):
        return None


def ct_status(vmid, node):
    path = os.path.join(ct_dir(vmid), 'status')
    # The lab daemon boots or shuts down a container (lab/container.py) when fakepve's state changes; it
    # writes `status` once systemd runs in it or it is down, a second or two later. A power task through the
    # API ends only then (labctl's power_task), but fakepve's state changes when it starts; a real pct sees
    # the live state. So pct waits, a little, until the container has caught up with what fakepve holds.
    live = live_ct_status(vmid, node)
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
            answer = in_container(vmid, ['/bin/sh', '-c', script, 'pct-push', dst, opts.get('perms', '0644'),
                                         opts.get('user', '0'), opts.get('group', '0')], fds=(data.fileno(), 1, 2))
        pctbroker.exit_like(answer)
    if cmd == 'pull':
        opts, pos = parse_opts(rest[1:])
        if len(pos) != 2:
            die('400 wrong number of arguments\npct pull <vmid> <path> <destination> [OPTIONS]', 255)
        src, dst = pos
        with open(dst, 'wb') as out:
            answer = in_container(vmid, ['/bin/sh', '-c', '[ -f "$1" ] || { echo "failed to open $1 for '
                                         'reading: No such file or directory" >&2; exit 255; }; cat "$1"',
                                         'pct-pull', src], fds=(0, out.fileno(), 2))
        if answer.get('exit') != 0:
            os.unlink(dst)
        pctbroker.exit_like(answer)
    if cmd == 'exec':
        argv = rest[1:]
        if argv and argv[0] == '--':
            argv = argv[1:]
        if not argv:
            die('missing command', 255)
        pctbroker.exit_like(in_container(vmid, argv))
    die('pct: unknown command %s' % cmd, 255)


def in_container(vmid, argv, fds=(0, 1, 2)):
    """argv run in the running container vmid with fds as its stdin, stdout and stderr, as the real pct runs
    it with lxc-attach: by the lab daemon, which enters the container for pct (lab/pctbroker.py). Returns
    the answer ({'exit': N} or {'signal': N}); a refusal ends pct with its message."""
    path = os.path.join(lab_dir(), 'run', pctbroker.SOCKET)
    try:
        answer = pctbroker.call(path, vmid, argv, fds)
    except (OSError, pctbroker.BrokerError, ValueError) as e:
        die('pct: the lab daemon does not answer at %s (%s): is the lab running? python -m lab.labctl status'
            % (path, e), 255)
    if 'error' in answer:
        die(answer['error'], 255)
    return answer


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
    messages of the current boot (--dmesg implies --boot) after the cursor, as journald's JSON lines - the
    simulated kernel's (LAB/host/log/kernel.jsonl, lab/hostsim.py), which the host's journald never sees.
    Only what the collector uses of --dmesg is simulated; any other option with it is refused, so nothing
    passes here that a real journalctl would read differently. Without --dmesg (-k) it is the host's own
    journalctl: `journalctl -u <unit>` is the real journal."""
    if not any(a in ('-k', '--dmesg') for a in args) and os.path.exists(REAL_JOURNALCTL):
        os.execv(REAL_JOURNALCTL, [REAL_JOURNALCTL] + args)
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


# ------------------------------------------------------------------ kernel modules

def rmmod(host, args):
    """kmod's rmmod: each module named unloaded, refused with kmod's messages while held or when not loaded."""
    import kmod
    names = [a for a in args if not a.startswith('-')]
    if not names:
        die('rmmod: ERROR: missing module name.', 1)
    code = 0
    with kmod.locked(host):
        for arg in names:
            name = kmod.name_of(arg)
            try:
                kmod.unload(host, name)
            except kmod.ModuleError as e:
                code = 1
                if e.kind == 'not loaded':
                    sys.stderr.write('rmmod: ERROR: Module %s is not currently loaded\n' % name)
                elif e.detail:
                    sys.stderr.write('rmmod: ERROR: Module %s is in use by: %s\n' % (name, ' '.join(e.detail)))
                else:
                    sys.stderr.write('rmmod: ERROR: Module %s is in use\n' % name)
    sys.exit(code)


def modprobe(host, args):
    """kmod's modprobe for the nvidia modules: `modprobe [-v] [-q] MODULE [PARAM=VALUE ...]` loads it and what it
    needs from the running kernel's tree (depmod's modules.dep) with /etc/modprobe.d's options; `modprobe -r [-v] [-q]
    MODULE ...` unloads each, then what it needed if nothing else uses that, and does nothing for one not loaded."""
    import kmod
    remove = quiet = verbose = False
    words = []
    for a in args:
        if a in ('-r', '--remove'):
            remove = True
        elif a in ('-q', '--quiet'):
            quiet = True
        elif a in ('-v', '--verbose'):
            verbose = True
        elif a.startswith('-') and len(a) > 1 and not a.startswith('--') and set(a[1:]) <= set('rqv'):
            remove, quiet, verbose = remove or 'r' in a, quiet or 'q' in a, verbose or 'v' in a
        elif a.startswith('-'):
            die('modprobe (lab): option %s is not simulated' % a, 1)
        else:
            words.append(a)
    if not words:
        die('modprobe: ERROR: missing parameters. See -h.', 1)
    kernel = kmod.running_kernel(host)
    with kmod.locked(host):
        if remove:
            for arg in words:
                name = kmod.name_of(arg)
                if not kmod.loaded(host, name):
                    continue
                if kmod.refcnt(host, name) > 0 or kmod.holders(host, name):
                    die('modprobe: FATAL: Module %s is in use.' % name, 1)
                if verbose:
                    print('rmmod %s' % name)
                kmod.unload(host, name)
                for dep in kmod.DEPENDS.get(name, ()):
                    if kmod.loaded(host, dep) and kmod.refcnt(host, dep) == 0 and not kmod.holders(host, dep):
                        if verbose:
                            print('rmmod %s' % dep)
                        kmod.unload(host, dep)
            return
        name, params = kmod.name_of(words[0]), {}
        conf = host.path('etc/modprobe.d')
        for f in sorted(os.listdir(conf)) if os.path.isdir(conf) else []:
            if f.endswith('.conf'):
                params.update(hostsim.modprobe_nvidia_params(hostsim.read(os.path.join(conf, f))))
        params.update(hostsim.modprobe_nvidia_params('options nvidia ' + ' '.join(words[1:])) if words[1:] and
                      name == kmod.NVIDIA else {})
        order, todo = [], [name]
        while todo:
            m = todo.pop()
            if m not in order:
                order.insert(0, m)
                todo.extend(kmod.DEPENDS.get(m, ()))
        refused = None if kmod.loaded(host, name) else kmod.refused_by_install(host, name)
        if refused:
            # kmod 30's words (Debian 12), the install command's exit status as it gives it.
            sys.stderr.write("modprobe: ERROR: ../libkmod/libkmod-module.c:1047 command_do() Error running install "
                             "command '%s' for module %s: retcode 1\n" % (refused[1], refused[0]))
            die("modprobe: ERROR: could not insert '%s': Invalid argument" % name, 1)
        for m in order:
            if kmod.loaded(host, m):
                continue
            path = kmod.module_path(host, m, kernel)
            info = kmod.installed(host, m, kernel)
            if info is None:
                if quiet:
                    sys.exit(1)
                die('modprobe: FATAL: Module %s not found in directory /lib/modules/%s' % (m, kernel), 1)
            if verbose:
                print('insmod %s %s' % (path.replace(host.path(), '', 1),
                                        ' '.join('NVreg_%s=%s' % kv for kv in sorted(params.items())) if
                                        m == kmod.NVIDIA else ''))
            kmod.load(host, m, info, params if m == kmod.NVIDIA else None)


def dkms(host, args):
    """DKMS 3 for the nvidia module: status [MODULE[/VERSION]] [-k KERNEL], add|build|install|remove|uninstall
    (MODULE/VERSION or -m MODULE -v VERSION; -k KERNEL, --all), autoinstall [-k KERNEL]. Its tree is the host's
    /var/lib/dkms, the sources /usr/src/<module>-<version> (NVIDIA's installer puts them there)."""
    import kmod
    if not args:
        die('Error! No action was specified.', 1)
    cmd, module, ver, kernels, everything = args[0], None, None, [], False
    it = iter(args[1:])
    for a in it:
        if a == '-m':
            module = next(it, None)
        elif a == '-v':
            ver = next(it, None)
        elif a == '-k':
            kernels.append(next(it, '').split('/')[0])
        elif a.startswith('--kernelver='):
            kernels.append(a.split('=', 1)[1])
        elif a == '--all':
            everything = True
        elif a in ('-q', '--quiet', '--force'):
            pass
        elif not a.startswith('-'):
            if a.startswith('/usr/src/'):
                a = os.path.basename(a.rstrip('/')).replace('-', '/', 1)
            module, _, v = a.partition('/')
            ver = v or ver
        else:
            die('Error! Unknown option: %s' % a, 1)
    d = kmod.Dkms('/var', '/usr/src', '/')
    running = kmod.running_kernel(host)
    try:
        if cmd == 'status':
            for line in d.status(module, ver, kernels[0] if kernels else None):
                print(line)
            return
        if cmd == 'autoinstall':
            for m in (sorted(os.listdir(d.tree)) if os.path.isdir(d.tree) else []):
                for v in d.versions(m):
                    for k in kernels or [running]:
                        out = d.install(m, v, k)
                        print('\n'.join(out))
            return
        if not module or not ver:
            die('Error! Invalid number of arguments passed.\nUsage: %s <module>/<module-version> or '
                '-m <module>/<module-version> or -m <module> -v <module-version>' % cmd, 1)
        if cmd == 'add':
            out = d.add(module, ver)
        elif cmd in ('build', 'install'):
            if not os.path.isdir(d.mdir(module, ver)):
                d.add(module, ver)
            out = []
            for k in kernels or [running]:
                out += getattr(d, cmd)(module, ver, k)
        elif cmd in ('remove', 'uninstall'):
            if cmd == 'remove' and everything:
                out = d.remove(module, ver)
            else:
                out = []
                for k in kernels or [running]:
                    out += (d.remove(module, ver, k) if cmd == 'remove' else d.uninstall(module, ver, k))
        else:
            die('Error! Unknown action specified: "%s"' % cmd, 1)
    except kmod.DkmsError as e:
        die('Error! %s' % e, 1)
    print('\n'.join(out))


TOOLS = {
    'driverctl': driverctl,
    'proxmox-boot-tool': proxmox_boot_tool,
    'update-grub': update_grub,
    'update-initramfs': update_initramfs,
    'reboot': reboot,
    'pct': pct,
    'journalctl': journalctl,
    'rmmod': rmmod,
    'modprobe': modprobe,
    'dkms': dkms,
}


def main():
    tool = os.path.basename(sys.argv[0])
    host = hostsim.Host(lab_dir())
    # Fault injection for tests: a file LAB/host/faults/<tool> (or <tool>.<subcommand>) makes the
    # tool fail with the file's text, hang if the text is `hang`, or take N seconds more, then do its work, if it is
    # `slow N` (a long step - a DKMS build - at a test's length).
    for name in (tool, '%s.%s' % (tool, sys.argv[1] if len(sys.argv) > 1 else '')):
        fault = host.path('faults', name)
        if os.path.exists(fault):
            with open(fault) as f:
                text = f.read()
            if text.strip() == 'hang':
                hang()
            if text.startswith('slow '):
                time.sleep(float(text.split()[1]))
                continue
            die(text or '%s: injected failure' % tool, 1)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    TOOLS[tool](host, sys.argv[1:])


if __name__ == '__main__':
    main()
