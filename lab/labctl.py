"""The lab: a simulated 8-GPU Proxmox host on loopback, for the main job and the integration tests.

    python -m lab.labctl up [--spec lab/spec/default.json]   start (fresh) unless running; prints lab.json
    python -m lab.labctl down                                stop everything and wipe .lab
    python -m lab.labctl status

Parts, all bound to loopback addresses from the spec:
  * fakepve (the Proxmox API, validated against PVE's schema) over TLS with a certificate the
    program is given as its CA; root@pam password login; permission checks on (an ACL exists),
    so only root@pam may set devN / hostpci / amd-sev; an API token for root@pam to prove that.
  * Debian's OpenSSH server, key-only, with a generated host key the stack pins, running in a
    private mount namespace where the simulated host (lab/hostsim.py) lies over /etc, /sys, /proc,
    /dev and /usr/local/sbin (lab/ns-sshd.sh).
  * A sync loop that gives every container fakepve holds a root filesystem (.lab/ct/<vmid>) for
    `pct push` / `pct exec`, writes /etc/pve/{lxc,qemu-server}/<vmid>.conf, and starts or stops the
    container's enabled units when fakepve starts or stops the container.
"""

import argparse
import asyncio
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import hostsim  # noqa: E402

DEFAULT_LAB = os.path.join(REPO, '.lab')
DEFAULT_SPEC = os.path.join(HERE, 'spec', 'default.json')
TEMPLATE = 'local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst'
SGLANG_VENV = 'opt/sglang/venv'
TOOLS = ('driverctl', 'proxmox-boot-tool', 'update-grub', 'update-initramfs', 'reboot', 'pct')


def load(lab):
    with open(os.path.join(lab, 'lab.json')) as f:
        return json.load(f)


def port_open(host, port, timeout=0.3):
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def pid_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except (ProcessLookupError, TypeError):
        return False


def running(lab):
    try:
        info = load(lab)
    except (FileNotFoundError, ValueError):
        return False
    return (pid_alive(info.get('pid')) and port_open(info['pve']['host'], info['pve']['port'])
            and port_open(info['ssh']['host'], info['ssh']['port']))


# --------------------------------------------------------------------------- set-up

def prepare(lab, spec_path):
    """Keys, certificates, secrets and the simulated host's files. Returns lab.json's content."""
    with open(spec_path) as f:
        spec = json.load(f)
    os.makedirs(lab, mode=0o700)
    shutil.copyfile(spec_path, os.path.join(lab, 'spec.json'))
    for sub in ('ssh', 'pve', 'secrets', 'ct', 'host/etc', 'host/dev', 'host/var'):
        os.makedirs(os.path.join(lab, sub), mode=0o700, exist_ok=True)
    host = hostsim.Host(lab)
    host.create()
    # The fake tools, by their real names, first on root's PATH inside the namespace.
    for tool in TOOLS:
        os.symlink(os.path.join(HERE, 'faketools.py'), host.path('sbin', tool))
    hostsim.write(host.path('etc/gpuhost-lab.json'), json.dumps({'lab': lab, 'repo': REPO}) + '\n')

    ssh = os.path.join(lab, 'ssh')
    for name in ('ssh_host_ed25519_key', 'id_ed25519'):
        subprocess.run(['ssh-keygen', '-q', '-t', 'ed25519', '-N', '', '-C', 'gpuhost-lab', '-f',
                        os.path.join(ssh, name)], check=True)
    shutil.copyfile(os.path.join(ssh, 'id_ed25519.pub'), os.path.join(ssh, 'authorized_keys'))
    addr, port = spec['addresses']['ssh'], spec['ports']['ssh']
    with open(os.path.join(ssh, 'sshd_config'), 'w') as f:
        f.write(SSHD_CONFIG.format(addr=addr, port=port, ssh=ssh))
    with open(os.path.join(ssh, 'ssh_host_ed25519_key.pub')) as f:
        host_key = ' '.join(f.read().split()[:2])

    from fakepve.certs import make_cert
    cert, key, _ = make_cert(os.path.join(lab, 'pve'), hosts=(spec['addresses']['pve'],))
    password = secrets.token_urlsafe(18)
    token = secrets.token_hex(16)
    write_secret(os.path.join(lab, 'secrets', 'pve-password'), password)
    write_secret(os.path.join(lab, 'secrets', 'pve-token'), token)
    return {
        'spec': spec_path,
        'node': spec['node'],
        'pve': {'host': spec['addresses']['pve'], 'port': spec['ports']['pve'], 'cafile': cert, 'keyfile': key,
                'user': 'root@pam', 'password_file': os.path.join(lab, 'secrets', 'pve-password'),
                'token_id': 'root@pam!lab', 'token_file': os.path.join(lab, 'secrets', 'pve-token')},
        'ssh': {'host': addr, 'port': port, 'user': 'root', 'key_file': os.path.join(ssh, 'id_ed25519'),
                'host_key': host_key, 'host_key_file': os.path.join(ssh, 'ssh_host_ed25519_key.pub')},
        'container_ip': spec['addresses']['container'],
        'template': TEMPLATE,
        'sglang_version': spec.get('sglang_version', '0.5.23'),
    }


SSHD_CONFIG = '''# The lab's SSH server (generated by lab/labctl.py). Key-only, loopback only.
ListenAddress {addr}:{port}
HostKey {ssh}/ssh_host_ed25519_key
PidFile {ssh}/sshd.pid
AuthorizedKeysFile {ssh}/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
UsePAM no
StrictModes no
MaxStartups 64:30:128
MaxSessions 64
Subsystem sftp internal-sftp
LogLevel VERBOSE
'''


def write_secret(path, value):
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 'w') as f:
        f.write(value)


# --------------------------------------------------------------------------- daemon

class Lab(object):
    def __init__(self, lab):
        self.lab = lab
        self.info = load(lab)
        self.host = hostsim.Host(lab)
        self.sshd = None
        self.pve = None
        self.seen = {}
        self.confs = {}

    async def start(self):
        from fakepve import FakePve
        pinfo = self.info['pve']
        with open(pinfo['password_file']) as f:
            password = f.read()
        pve = FakePve(user='root@pam', password=password, host=pinfo['host'], port=pinfo['port'])
        pve.time_scale = 0
        pve.nodes = {self.info['node']: {'online': True}}
        # An ACL entry switches fakepve's permission checks on: from here only root@pam may
        # set devN, raw hostpciN, amd-sev and affinity, as on a real PVE.
        pve.grant('monitor@pve', '/', 'VM.Audit', 'Sys.Audit')
        with open(pinfo['token_file']) as f:
            pve.apitokens[pinfo['token_id']] = f.read()
        # The OS template as a vztmpl volume of `local` (what `pveam download local <template>` leaves):
        # fakepve then fails a container create naming any other template, as Proxmox does.
        pve.storages['local'].setdefault('volumes', {})[self.info['template'].split(':', 1)[1]] = {
            'content': 'vztmpl', 'format': 'tzst', 'size': 129 * 1024 ** 2, 'ctime': 0}
        await pve.start(pinfo['cafile'], pinfo['keyfile'])
        self.pve = pve
        log = open(os.path.join(self.lab, 'sshd.log'), 'ab')
        self.sshd = subprocess.Popen(
            ['unshare', '-m', '-u', '--propagation', 'private', '--', 'sh', os.path.join(HERE, 'ns-sshd.sh'), self.lab, self.info['node']],
            stdout=log, stderr=log, start_new_session=True)

    def stop(self):
        for vmid in list(self.seen):
            self.stop_units(vmid)
        if self.sshd and self.sshd.poll() is None:
            os.killpg(self.sshd.pid, signal.SIGTERM)
            try:
                self.sshd.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.sshd.pid, signal.SIGKILL)

    # -- containers

    def ct_root(self, vmid):
        return os.path.join(self.lab, 'ct', str(vmid), 'rootfs')

    def make_rootfs(self, vmid):
        root = self.ct_root(vmid)
        if os.path.isdir(root):
            return
        for sub in ('etc/systemd/system', 'run', 'tmp', 'var/log', 'root', SGLANG_VENV + '/bin',
                    SGLANG_VENV + '/lib/python'):
            os.makedirs(os.path.join(root, sub), exist_ok=True)
        for name in ('passwd', 'group', 'nsswitch.conf', 'hosts'):
            if os.path.exists('/etc/' + name):
                shutil.copyfile('/etc/' + name, os.path.join(root, 'etc', name))
        hostsim.write(os.path.join(root, 'etc/lab-ct.json'), json.dumps({'ip': self.info['container_ip']}) + '\n')
        # The SGLang installation the service expects: a virtualenv whose python runs the lab's
        # simulated sglang package (lab/fakesglang) at the spec's version.
        pkg = os.path.join(root, SGLANG_VENV, 'lib/python/sglang')
        shutil.copytree(os.path.join(HERE, 'fakesglang', 'sglang'), pkg)
        hostsim.write(os.path.join(pkg, 'VERSION'), self.info['sglang_version'] + '\n')
        # Its parser: the program's sglang_argparse and the table generated from that version's argparse
        # (a version without a table makes the simulated launch_server fail, naming the supported ones).
        components = os.path.join(os.path.dirname(HERE), 'components')
        shutil.copyfile(os.path.join(components, 'sglang_argparse.py'), os.path.join(pkg, 'sglang_argparse.py'))
        os.makedirs(os.path.join(pkg, 'sglang_flags_data'))
        table = os.path.join(components, 'sglang_flags_data', self.info['sglang_version'] + '.json')
        if os.path.exists(table):
            shutil.copyfile(table, os.path.join(pkg, 'sglang_flags_data', os.path.basename(table)))
        shim = os.path.join(root, SGLANG_VENV, 'bin/python')
        hostsim.write(shim, '#!/bin/sh\nPYTHONPATH=/%s/lib/python exec /usr/bin/python3 "$@"\n' % SGLANG_VENV)
        os.chmod(shim, 0o755)

    def unit_pids(self, vmid):
        d = os.path.join(self.ct_root(vmid), 'run', 'lab-systemd')
        out = []
        if os.path.isdir(d):
            for name in os.listdir(d):
                if name.endswith('.pid'):
                    with open(os.path.join(d, name)) as f:
                        out.append((os.path.join(d, name), int(f.read().strip() or 0)))
        return out

    def stop_units(self, vmid):
        for path, pid in self.unit_pids(vmid):
            if pid and pid_alive(pid):
                try:
                    os.killpg(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            os.unlink(path)

    def boot_units(self, vmid):
        env = dict(os.environ, GPUHOST_LAB=self.lab)
        subprocess.Popen(['unshare', '-m', '--propagation', 'private', '--', '/usr/bin/python3',
                          os.path.join(HERE, 'faketools.py'), '_ct_chroot', str(vmid), 'systemctl', 'lab-boot'],
                         env=env, stdout=subprocess.DEVNULL, start_new_session=True,
                         stderr=open(os.path.join(self.lab, 'ct', str(vmid), 'boot.log'), 'ab'))

    def control(self):
        """Fault injection for tests: LAB/control/pve-fail.json holds keyword arguments of fakepve's
        fail() (method, suffix, status, message, error, times); applied once, then removed."""
        path = os.path.join(self.lab, 'control', 'pve-fail.json')
        if os.path.exists(path):
            with open(path) as f:
                for spec in json.load(f):
                    self.pve.fail(**spec)
            os.unlink(path)

    def sync(self):
        self.control()
        now = {}
        for ct in self.pve.cts:
            # (status, init pid): a reboot keeps "running" but gives the container a new init.
            now[ct.vmid] = (ct.status, ct.pid)
            prev = self.seen.get(ct.vmid, (None, None))
            self.make_rootfs(ct.vmid)
            hostsim.write(os.path.join(self.lab, 'ct', str(ct.vmid), 'status'), ct.status + '\n')
            self.write_conf('lxc', ct.vmid, ct.config)
            if ct.status == 'running' and prev != now[ct.vmid]:
                if prev[0] == 'running':
                    self.stop_units(ct.vmid)
                self.boot_units(ct.vmid)
            elif ct.status != 'running' and prev[0] == 'running':
                self.stop_units(ct.vmid)
        for vmid in set(self.seen) - set(now):
            self.stop_units(vmid)
            shutil.rmtree(os.path.join(self.lab, 'ct', str(vmid)), ignore_errors=True)
            conf = self.host.path('etc/pve/lxc/%d.conf' % vmid)
            if os.path.exists(conf):
                os.unlink(conf)
        vms = set()
        for vm in self.pve.vms:
            vms.add(vm.vmid)
            self.write_conf('qemu-server', vm.vmid, vm.config)
        qdir = self.host.path('etc/pve/qemu-server')
        for name in os.listdir(qdir):
            if name.endswith('.conf') and int(name[:-5]) not in vms:
                os.unlink(os.path.join(qdir, name))
        self.seen = now

    def write_conf(self, kind, vmid, config):
        """/etc/pve/<kind>/<vmid>.conf from the API's view, keeping raw lxc.* lines, which only the
        file can hold (the program edits those over SSH)."""
        path = self.host.path('etc/pve', kind, '%d.conf' % vmid)
        raw = []
        if os.path.exists(path):
            with open(path) as f:
                raw = [line for line in f.read().splitlines() if line.startswith('lxc.')]
        body = ''.join('%s: %s\n' % (k, v) for k, v in sorted(config.items())
                       if k not in ('digest', 'lxc') and not k.startswith('lxc.'))
        key = (kind, vmid)
        if self.confs.get(key) == body and os.path.exists(path):
            return
        self.confs[key] = body
        hostsim.write(path, body + ''.join(line + '\n' for line in raw))


async def serve(lab):
    labd = Lab(lab)
    await labd.start()
    info = labd.info
    info['pid'] = os.getpid()
    hostsim.write(os.path.join(lab, 'lab.json'), json.dumps(info, indent=2) + '\n')
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        while not stop.is_set():
            try:
                labd.sync()
            except Exception:  # a sync bug must not take the lab down mid-test; it is logged
                import traceback
                traceback.print_exc()
            try:
                await asyncio.wait_for(stop.wait(), 0.2)
            except asyncio.TimeoutError:
                pass
    finally:
        labd.stop()
        await labd.pve.stop()


# --------------------------------------------------------------------------- commands

def up(lab, spec):
    if running(lab):
        print(json.dumps({'started': False, 'lab': lab}))
        return load(lab)
    down(lab, quiet=True)
    info = prepare(lab, spec)
    hostsim.write(os.path.join(lab, 'lab.json'), json.dumps(info, indent=2) + '\n')
    log = open(os.path.join(lab, 'labd.log'), 'ab')
    subprocess.Popen([sys.executable, '-m', 'lab.labctl', '--lab', lab, 'serve'], cwd=REPO, stdout=log,
                     stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 30
    while time.time() < deadline:
        if running(lab):
            print(json.dumps({'started': True, 'lab': lab}))
            return load(lab)
        time.sleep(0.1)
    with open(os.path.join(lab, 'labd.log')) as f:
        tail = f.read()[-2000:]
    sshd_log = os.path.join(lab, 'sshd.log')
    if os.path.exists(sshd_log):
        with open(sshd_log) as f:
            tail += '\n--- sshd.log ---\n' + f.read()[-2000:]
    sys.exit('lab did not come up within 30 s:\n' + tail)


def down(lab, quiet=False):
    try:
        info = load(lab)
    except (FileNotFoundError, ValueError):
        info = {}
    pid = info.get('pid')
    if pid and pid_alive(pid):
        os.kill(pid, signal.SIGTERM)
        for _ in range(100):
            if not pid_alive(pid):
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
    sshd_pid = os.path.join(lab, 'ssh', 'sshd.pid')
    if os.path.exists(sshd_pid):
        with open(sshd_pid) as f:
            spid = int(f.read().strip() or 0)
        if spid and pid_alive(spid):
            os.kill(spid, signal.SIGTERM)
    if os.path.isdir(lab):
        shutil.rmtree(lab)
    if not quiet:
        print(json.dumps({'stopped': True, 'lab': lab}))


def main(argv=None):
    ap = argparse.ArgumentParser(prog='labctl', description=__doc__.splitlines()[0])
    ap.add_argument('--lab', default=os.environ.get('GPUHOST_LAB', DEFAULT_LAB))
    sub = ap.add_subparsers(dest='cmd', required=True)
    p_up = sub.add_parser('up')
    p_up.add_argument('--spec', default=DEFAULT_SPEC)
    sub.add_parser('down')
    sub.add_parser('status')
    sub.add_parser('serve')
    args = ap.parse_args(argv)
    lab = os.path.abspath(args.lab)
    if args.cmd == 'up':
        up(lab, os.path.abspath(args.spec))
    elif args.cmd == 'down':
        down(lab)
    elif args.cmd == 'status':
        print(json.dumps({'running': running(lab), 'lab': lab}))
    elif args.cmd == 'serve':
        asyncio.run(serve(lab))


if __name__ == '__main__':
    main()
