"""The lab's simulated Proxmox host as a machine: real systemd 252 as its PID 1, the way the lab's containers
run it (lab/container.py), sharing the machine's network namespace (the lab's addresses are loopback addresses:
its sshd listens on the spec's address, and it reaches fakepve, the package index and the mirror there).

Its root is an overlay: the host's Debian base (lab/ctbase.py --kind host: Debian's `important` packages,
OpenSSH's server, python3, dbus, ...) below, LAB/host-os/upper above. It boots with systemd-nspawn and
lab/host-init.sh as PID 1 for a moment, which lays the simulated host (lab/hostsim.py, LAB/host) over the real
paths in the host's own mount namespace - /etc and /var as overlays whose upper layers are LAB/host/etc and
LAB/host/var, the simulated /sys and /proc files, the boot id, the device nodes, /usr/local/sbin (the fake
Proxmox tools), /root - and then execs systemd. Inside the host:

  /run/gpuhost-lab        LAB, read-write (the fake tools move the simulated host's state there; pct reaches
                          the lab daemon's broker there, lab/pctbroker.py; sshd's config, keys and log)
  /usr/lib/gpuhost-lab    the lab's code (lab/), read-only: the fake tools, sshd's ForceCommand
Neither is under /tmp, /root or /home, which a unit's PrivateTmp= and ProtectHome= hide.

Layout under LAB/host-os/ (lab/container.py's): upper/, work/, rootfs/ (the overlay, mounted on the machine
while the lab runs), leader (the pid of its systemd as the machine sees it), nspawn.pid, status, boot.log.

Stdlib only.
"""

import hashlib
import os
import signal
import subprocess
import time

import container

HERE = os.path.dirname(os.path.realpath(__file__))
IN_LAB = '/run/gpuhost-lab'
IN_CODE = '/usr/lib/gpuhost-lab'


class LabHost(object):
    def __init__(self, lab):
        self.lab = os.path.abspath(lab)
        self.machine = container.Container(os.path.join(self.lab, 'host-os'))

    def path(self, *parts):
        return self.machine.path(*parts)

    @property
    def name(self):
        """The nspawn machine's name: unique per lab (nspawn keeps a directory per running name)."""
        return 'lab%s-host' % hashlib.sha256(self.lab.encode()).hexdigest()[:8]

    def mount_root(self, base):
        """The root overlay (the host's base below, LAB/host-os/upper above), mounted unless it is."""
        for sub in ('upper', 'work', 'rootfs'):
            os.makedirs(self.path(sub), exist_ok=True)
        if not container.mounted(self.machine.rootfs):
            subprocess.run(['mount', '-t', 'overlay', 'overlay', '-o', 'lowerdir=%s,upperdir=%s,workdir=%s' % (
                base, self.path('upper'), self.path('work')), self.machine.rootfs], check=True, capture_output=True)

    def boot(self, base, hostname, timeout=20.0):
        """Power on: returns once systemd is PID 1 (its units, sshd among them, start on their own)."""
        for sub in ('etc', 'var'):
            os.makedirs(os.path.join(self.lab, 'work', sub), exist_ok=True)
        self.mount_root(base)
        self.machine.start(
            self.name, hostname, binds=[(self.lab, IN_LAB), (HERE, IN_CODE, 'ro')], timeout=timeout,
            init=['/bin/sh', IN_CODE + '/host-init.sh', IN_LAB],
            # The host's resolv.conf and time zone are its own (its /etc), not copied from the machine.
            options=['--resolv-conf=off', '--timezone=off'], tmp_on_root=False)

    def leader(self):
        return self.machine.leader()

    def running(self):
        return self.leader() is not None

    def exited(self):
        """systemd-nspawn's exit status once the host went down by itself (133: it rebooted, `systemctl
        reboot`; 0: it powered off), None while it runs or when this object did not start it."""
        proc = self.machine.proc
        return None if proc is None else proc.poll()

    def pids(self):
        """Every process of the host, as the machine numbers them."""
        pid = self.nspawn_pid()
        return container.descendants(pid) if pid else []

    def nspawn_pid(self):
        pid = container._read(self.path('nspawn.pid'))
        return int(pid) if pid and pid.isdigit() and container._alive(int(pid)) else None

    def ssh_sessions(self):
        """The per-connection sshd processes ("sshd: root@notty", "sshd: root [priv]"), not the listener."""
        out = []
        for pid in self.pids():
            cmd = container.cmdline(pid)
            if cmd.startswith(b'sshd: ') and b'[listener]' not in cmd:
                out.append(pid)
        return out

    def kill_ssh_sessions(self):
        """SIGKILL every SSH connection's sshd processes: each client sees its connection end without an exit
        status and without SSH's goodbye. Returns how many processes were killed."""
        killed = 0
        for pid in self.ssh_sessions():
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        return killed

    def poweroff(self, timeout=10.0):
        """systemd halts the host (its units stopped in order), killed outright after timeout."""
        self.machine.stop(timeout=timeout)

    def enter_argv(self, argv):
        """argv run inside the host: its namespaces, root, a clean environment (lab/container.py)."""
        return self.machine.enter_argv(argv)
