"""A lab container: its own root filesystem and real systemd as PID 1, like an LXC container on Proxmox.

The root is an overlay: the Debian 12 base (lab/ctbase.py, read-only, shared) below, the container's
own directory above, so every container has its own writable /usr, /opt, /etc, /var. It boots with
`systemd-nspawn --boot` (Debian's systemd-container): systemd 252 as PID 1 in its own PID, mount, IPC
and UTS namespaces, journald, units enabled and started by systemd itself. The network namespace is
the machine's: the container's address is a loopback address (the lab's addresses all are), and
what it serves on it is reachable from the program as from any other host.

The lab daemon (lab/labctl.py) creates, starts, stops and destroys containers as fakepve's state
changes; `pct` (lab/faketools.py, on the lab host) enters a running one through the lab daemon, which runs
the nsenter (lab/pctbroker.py), as the real pct enters an LXC container with lxc-attach. The lab host itself
is a machine of this kind too (lab/labhost.py). Layout under LAB/ct/<vmid>/:

  upper/, work/   overlayfs' layers (the container's own files)
  rootfs/         the merged root, mounted for as long as the container exists (tests read it)
  status          what `pct status` reports: written once systemd runs in it, or once it has stopped
  leader          the pid of its PID 1 (systemd) as the machine sees it; `pct exec` enters it
  nspawn.pid      systemd-nspawn's pid
  boot.log        the console

Stdlib only.
"""

import os
import secrets
import shutil
import signal
import subprocess
import time

# The environment `pct exec` gives a command (lxc-attach's clean environment).
EXEC_ENV = {'PATH': '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', 'HOME': '/root',
            'LANG': 'C.UTF-8'}


class ContainerError(RuntimeError):
    pass


def _read(path, default=None):
    try:
        with open(path) as f:
            return f.read().strip()
    except (FileNotFoundError, ProcessLookupError):
        return default


def _write(path, text):
    tmp = '%s.tmp-%d' % (path, os.getpid())
    with open(tmp, 'w') as f:
        f.write(text)
    os.replace(tmp, path)


def _alive(pid):
    try:
        with open('/proc/%d/stat' % pid) as f:
            return f.read().rsplit(')', 1)[1].split()[0] not in ('Z', 'X')
    except (OSError, IndexError, TypeError):
        return False


def _children(pid):
    out = []
    for name in os.listdir('/proc'):
        if name.isdigit():
            try:
                with open('/proc/%s/stat' % name) as f:
                    if int(f.read().rsplit(')', 1)[1].split()[1]) == pid:
                        out.append(int(name))
            except (OSError, ValueError, IndexError):
                pass
    return out


def descendants(root):
    """Every process below root (children, their children, ...), as this PID namespace numbers them."""
    parents = {}
    for name in os.listdir('/proc'):
        if name.isdigit():
            try:
                with open('/proc/%s/stat' % name) as f:
                    parents[int(name)] = int(f.read().rsplit(')', 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    out = []
    for pid in parents:
        p = parents.get(pid)
        for _ in range(64):
            if p is None or p <= 1:
                break
            if p == root:
                out.append(pid)
                break
            p = parents.get(p)
    return out


def cmdline(pid):
    try:
        with open('/proc/%d/cmdline' % pid, 'rb') as f:
            return f.read()
    except OSError:
        return b''


def mounted(path):
    path = os.path.realpath(path)
    with open('/proc/self/mountinfo') as f:
        return any(line.split()[4] == path for line in f)


def mounts_under(path):
    """Mount points at or below path (this mount namespace), deepest first."""
    path = os.path.realpath(path)
    out = []
    with open('/proc/self/mountinfo') as f:
        for line in f:
            point = line.split()[4].replace('\\040', ' ')
            if point == path or point.startswith(path + '/'):
                out.append(point)
    return sorted(set(out), key=len, reverse=True)


class Container(object):
    def __init__(self, ctdir):
        self.dir = ctdir
        self.rootfs = os.path.join(ctdir, 'rootfs')
        self.proc = None   # the systemd-nspawn this object started, if it did

    def path(self, *parts):
        return os.path.join(self.dir, *parts)

    # -- state as pct sees it

    def status(self):
        return _read(self.path('status'))

    def leader(self):
        """PID 1 of the running container (as the machine numbers it), or None."""
        pid = _read(self.path('leader'))
        if pid and pid.isdigit() and _alive(int(pid)):
            return int(pid)
        return None

    def exists(self):
        return os.path.isdir(self.path('upper'))

    # -- lifecycle (the lab daemon)

    def create(self, base, files):
        """Make the root: the base below, an empty upper layer; then the files Proxmox writes into a new
        container (a machine-id of its own) and the lab's (files: {path: text}). A container whose layer
        exists already (the lab daemon restarted) is only mounted again."""
        fresh = not self.exists()
        for sub in ('upper', 'work', 'rootfs'):
            os.makedirs(self.path(sub), exist_ok=True)
        if not mounted(self.rootfs):
            subprocess.run(['mount', '-t', 'overlay', 'overlay', '-o', 'lowerdir=%s,upperdir=%s,workdir=%s' % (
                base, self.path('upper'), self.path('work')), self.rootfs], check=True, capture_output=True)
        if not fresh:
            return
        files = dict(files)
        files.setdefault('/etc/machine-id', secrets.token_hex(16) + '\n')
        for dst, text in files.items():
            target = os.path.join(self.rootfs, dst.lstrip('/'))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            _write(target, text)
        _write(self.path('status'), 'stopped\n')

    def start(self, machine, hostname, binds=(), timeout=20.0, init=None, options=(), tmp_on_root=True):
        """Boot it: systemd-nspawn with systemd as PID 1. Returns once PID 1 is systemd (as `pct start`
        returns once the container's init runs; the boot itself goes on). init: a command that prepares the
        root as PID 1, then execs systemd (lab/host-init.sh), instead of nspawn's --boot; options: more of
        systemd-nspawn's; tmp_on_root: /tmp on the root filesystem, as in an LXC container (else nspawn's
        tmpfs)."""
        if self.leader():
            return
        _room_for_inotify()
        # Proxmox writes the configured hostname into the container at every start.
        _write(os.path.join(self.rootfs, 'etc', 'hostname'), hostname + '\n')
        argv = ['systemd-nspawn', '--register=no', '--keep-unit', '--quiet', '--console=pipe',
                '--link-journal=no', '--machine=' + machine, '--hostname=' + hostname, '--directory=' + self.rootfs]
        argv += list(options)
        # (src, dst) or (src, dst, 'ro').
        argv += ['--%s=%s:%s' % ('bind-ro' if len(b) > 2 and b[2] == 'ro' else 'bind', b[0], b[1]) for b in binds]
        # With an init of its own, nspawn stops the container as --boot would have it: systemd's halt signal.
        argv += ['--boot'] if init is None else ['--kill-signal=SIGRTMIN+3', '--'] + list(init)
        log = open(self.path('boot.log'), 'ab')
        # /run is a tmpfs in both an LXC container and nspawn's.
        env = dict(os.environ, SYSTEMD_NSPAWN_TMPFS_TMP='0' if tmp_on_root else '1')
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                env=env)
        log.close()
        _write(self.path('nspawn.pid'), '%d\n' % proc.pid)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if proc.poll() is not None:
                last = (_read(self.path('boot.log')) or '').strip().splitlines()[-1:]
                raise ContainerError('systemd-nspawn exited with %s before %s booted (%s); see %s' % (
                    proc.returncode, machine, last[0] if last else 'no output', self.path('boot.log')))
            kids = [p for p in _children(proc.pid) if _read('/proc/%d/comm' % p) == 'systemd']
            if kids:
                _write(self.path('leader'), '%d\n' % kids[0])
                _write(self.path('status'), 'running\n')
                self.proc = proc
                return
            time.sleep(0.02)
        proc.kill()
        raise ContainerError('no systemd in %s %s s after systemd-nspawn started; see %s' % (
            machine, timeout, self.path('boot.log')))

    def stop(self, timeout=20.0):
        """Shut it down as `pct shutdown` does (systemd powers off: units stopped in order), killed if it
        takes longer than timeout."""
        pid = _read(self.path('nspawn.pid'))
        pid = int(pid) if pid and pid.isdigit() else None
        if pid and _alive(pid):
            # systemd-nspawn --boot turns SIGTERM into a clean poweroff of the container's systemd.
            os.kill(pid, signal.SIGTERM)
            deadline = time.time() + timeout
            while _alive(pid) and time.time() < deadline:
                time.sleep(0.05)
            if _alive(pid):
                os.killpg(pid, signal.SIGKILL)
            for _ in range(100):
                if not _alive(pid):
                    break
                time.sleep(0.05)
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        self.proc = None
        for name in ('leader', 'nspawn.pid'):
            try:
                os.unlink(self.path(name))
            except FileNotFoundError:
                pass
        if os.path.isdir(self.dir):
            _write(self.path('status'), 'stopped\n')

    def destroy(self):
        self.stop(timeout=10.0)
        for point in mounts_under(self.dir):
            subprocess.run(['umount', '-l', point], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- entering it (pct)

    def enter_argv(self, argv):
        """The command line that runs argv inside the running container: every namespace of its PID 1,
        its root and working directory (/), a clean environment."""
        pid = self.leader()
        if pid is None:
            raise ContainerError('container not running')
        env = ['%s=%s' % kv for kv in sorted(EXEC_ENV.items())]
        return ['nsenter', '--target', str(pid), '--mount', '--uts', '--ipc', '--net', '--pid', '--cgroup',
                # --wd without a path: PID 1's (a path would be opened before entering its mounts).
                '--root', '--wd', '--', '/usr/bin/env', '-i'] + env + list(argv)


def cleanup(lab):
    """After a lab daemon that did not stop its machines (killed): stop every systemd-nspawn of the lab - the
    containers and the host (LAB/host-os, lab/labhost.py) - and unmount every root below it, so the lab
    directory can be removed."""
    ctroot = os.path.join(lab, 'ct')
    dirs = [os.path.join(ctroot, name) for name in (os.listdir(ctroot) if os.path.isdir(ctroot) else [])]
    for d in dirs + [os.path.join(lab, 'host-os')]:
        c = Container(d)
        pid = _read(c.path('nspawn.pid'))
        if pid and pid.isdigit() and _alive(int(pid)):
            c.stop(timeout=5.0)
    for point in mounts_under(lab):
        subprocess.run(['umount', '-l', point], capture_output=True)


INOTIFY_INSTANCES = 1024


def _room_for_inotify():
    """Every container's systemd, journald and logind take inotify instances (7 a container, counted in
    /proc/*/fd during make bench-fleet), all of one user - root - and the kernel's default cap is 128 a user:
    bench-fleet's 13 hosts and their containers are 26; the count passed 128 at the 19th, and the 23rd's
    systemd-nspawn exited with 255 before it booted. The lab raises the cap to 1024, what the LXD snap sets for
    its containers (canonical/lxd-pkg-snap #361)."""
    path = '/proc/sys/fs/inotify/max_user_instances'
    try:
        if int(_read(path) or 0) < INOTIFY_INSTANCES:
            with open(path, 'w') as f:
                f.write('%d\n' % INOTIFY_INSTANCES)
    except (OSError, ValueError):
        pass
