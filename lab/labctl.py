"""The lab: a simulated 8-GPU Proxmox host on loopback, for the main job and the integration tests.

    python -m lab.labctl up [--spec lab/spec/default.json]   start (fresh) unless running; prints lab.json
    python -m lab.labctl down                                stop everything and wipe .lab
    python -m lab.labctl status

Parts, all bound to loopback addresses from the spec:
  * fakepve (the Proxmox API, validated against PVE's schema) over TLS with a certificate the
    program is given as its CA; root@pam password login; permission checks on (an ACL exists),
    so only root@pam may set devN / hostpci / amd-sev; an API token for root@pam to prove that.
  * The simulated host (lab/labhost.py): a machine of systemd-nspawn with real systemd as PID 1 on the
    host's Debian base, the simulated host's files (lab/hostsim.py) laid over its /etc, /var, /sys, /proc,
    /dev, /usr/local/sbin and /root (lab/host-init.sh); its OpenSSH server (Debian's ssh.service), key-only,
    with a generated host key the stack pins.
  * A sync loop that gives every container fakepve holds a root filesystem (.lab/ct/<vmid>) and boots or
    stops it (lab/container.py), keeps /etc/pve/{lxc,qemu-server}/<vmid>.conf and fakepve's config one
    (as pmxcfs does: an API change rewrites the file, an edit of the file changes what the API
    reports). A container's start/stop/shutdown/reboot task ends once the container is there (Lab.power_task).
  * `pct exec/push/pull` on the host reach the containers through a broker on a unix socket
    (LAB/run/pct.sock, lab/pctbroker.py): the host and the containers are sibling machines.
  * Every SSH command runs through lab/sshcmd.sh (sshd's ForceCommand): counted, logged, and
    dropped on demand (LAB/control/ssh-drop.json, carried out by lab/sshcmd.py).
  * PCI resource mappings (/cluster/mapping/pci), which fakepve does not model: stored, written to the
    host's /etc/pve/mapping/pci.cfg, and checked at VM start with qemu-server's words (lab/pvemap.py).
  * Control files for tests (LAB/control, see tests/lablib.py): pve-fail.json (fakepve's fail()),
    pve-set.json (fakepve's scenarios: quorum, offline node, locks, tickets, network, task
    durations; acknowledged in pve-set.ack.json), pve-requests.log (every API request and its status,
    or "dropped"; written by the lab), reboot-request.json (written by the fake
    `reboot`: the host goes down - SSH connections dropped, its systemd halted, the API away for
    reboot_down_secs, guests stopped - boots the installed state and starts the onboot guests).
"""

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import container  # noqa: E402
import ctbase  # noqa: E402
import hostsim  # noqa: E402
import labhost  # noqa: E402
import labmodel  # noqa: E402
import mirror  # noqa: E402
import pctbroker  # noqa: E402
import pyindex  # noqa: E402
import sglang_wheel  # noqa: E402
import pvemap  # noqa: E402

DEFAULT_LAB = os.path.join(REPO, '.lab')
DEFAULT_SPEC = os.path.join(HERE, 'spec', 'default.json')
TEMPLATE = 'local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst'
# The Proxmox-only tools the host lacks, simulated (lab/faketools.py), and journalctl's kernel log (--dmesg: the
# simulated kernel's; the rest is the host's real journal).
TOOLS = ('driverctl', 'proxmox-boot-tool', 'update-grub', 'update-initramfs', 'reboot', 'pct', 'journalctl', 'rmmod',
         'modprobe', 'dkms')
# Real seconds the host stays down in a reboot (no sshd, no API); the spec's reboot_down_secs or
# this environment variable (read by the lab daemon) overrides it.
REBOOT_DOWN_SECS = 3.0
REBOOT_ENV = 'GPUHOST_LAB_REBOOT_SECS'
# fakepve's task types of a container's power state. On Proxmox such a task ends once lxc-start has the
# container's init running, or lxc-stop has it down; in the lab, once the lab daemon has (Lab.power_task).
POWER_TASKS = ('vzstart', 'vzstop', 'vzshutdown', 'vzreboot')
# Real seconds a power task waits for the lab's container before it fails (a start or stop gives up after 20 s;
# a reboot is both).
POWER_TASK_SECS = 60.0
# Real seconds the pct broker waits for the event loop to read a container's status (Lab.ct_status; it takes
# milliseconds): past them pct goes on with the container's own status file.
STATUS_SECS = 5.0
# Characters of a description line PVE writes as they are (the rest %-encoded) in a guest config.
DESC_SAFE = ' !"#$&\'()*+,-./:;<=>?@[\\]^_`{|}~'


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
    if not pid_alive(info.get('pid')):
        return False
    if os.path.exists(os.path.join(lab, 'control', 'rebooting')):
        return True  # the simulated host is down for a reboot: sshd and the API are away on purpose
    return port_open(info['pve']['host'], info['pve']['port']) and port_open(info['ssh']['host'], info['ssh']['port'])


# --------------------------------------------------------------------------- set-up

def prepare(lab, spec_path):
    """Keys, certificates, secrets and the simulated host's files. Returns lab.json's content."""
    with open(spec_path) as f:
        spec = json.load(f)
    os.makedirs(lab, mode=0o700)
    shutil.copyfile(spec_path, os.path.join(lab, 'spec.json'))
    for sub in ('ssh', 'pve', 'secrets', 'ct', 'control', 'run', 'host/etc', 'host/dev', 'host/var'):
        os.makedirs(os.path.join(lab, sub), mode=0o700, exist_ok=True)
    # The modes of the host's /etc and /var (the upper layers' own: services drop root, and read /etc) and
    # /root, as Debian has them.
    for sub, mode in (('host/etc', 0o755), ('host/var', 0o755), ('host/root', 0o700)):
        os.makedirs(os.path.join(lab, sub), exist_ok=True)
        os.chmod(os.path.join(lab, sub), mode)
    host = hostsim.Host(lab)
    host.create()
    # The fake tools, by their real names, first on root's PATH in the host (its /usr/local/sbin).
    for tool in TOOLS:
        os.symlink(labhost.IN_CODE + '/faketools.py', host.path('sbin', tool))
    # uname -r: the simulated kernel's release (what NVIDIA's installer and `modinfo -k $(uname -r)` build and read for).
    os.symlink(labhost.IN_CODE + '/uname.sh', host.path('sbin', 'uname'))
    # Where the fake tools find the lab inside the host.
    hostsim.write(host.path('etc/gpuhost-lab.json'), json.dumps({'lab': labhost.IN_LAB}) + '\n')
    # The host's identity for its journal (/var/log/journal/<machine-id>), the same across its reboots.
    hostsim.write(host.path('etc/machine-id'), secrets.token_hex(16) + '\n')

    ssh = os.path.join(lab, 'ssh')
    for name in ('ssh_host_ed25519_key', 'id_ed25519'):
        subprocess.run(['ssh-keygen', '-q', '-t', 'ed25519', '-N', '', '-C', 'gpuhost-lab', '-f',
                        os.path.join(ssh, name)], check=True)
    shutil.copyfile(os.path.join(ssh, 'id_ed25519.pub'), os.path.join(ssh, 'authorized_keys'))
    addr, port = spec['addresses']['ssh'], spec['ports']['ssh']
    with open(os.path.join(ssh, 'sshd_config'), 'w') as f:
        # Read by the host's sshd: the paths are the host's.
        f.write(SSHD_CONFIG.format(addr=addr, port=port, ssh=labhost.IN_LAB + '/ssh', command='/bin/bash %s %s' % (
            shlex.quote(labhost.IN_CODE + '/sshcmd.sh'), shlex.quote(labhost.IN_LAB))))
    with open(os.path.join(ssh, 'ssh_host_ed25519_key.pub')) as f:
        host_key = ' '.join(f.read().split()[:2])

    from fakepve.certs import make_cert
    cert, key, _ = make_cert(os.path.join(lab, 'pve'), hosts=(spec['addresses']['pve'],))
    password = secrets.token_urlsafe(18)
    token = secrets.token_hex(16)
    write_secret(os.path.join(lab, 'secrets', 'pve-password'), password)
    write_secret(os.path.join(lab, 'secrets', 'pve-token'), token)
    index = prepare_index(lab, spec)
    model = prepare_model(lab, host)
    # The simulated installers on the lab's mirror too (LAB/mirror/installers/<name>), as NVIDIA's download site or
    # an internal mirror serves them (gpuhost:runtime.nvidia.source / .cuda.source).
    driver = spec.get('nvidia_version', hostsim.NVIDIA_VERSION)
    cuda = spec.get('cuda_version', hostsim.CUDA_VERSION)
    hostsim.write(os.path.join(lab, 'mirror', 'installers', hostsim.nvidia_installer_name(driver)),
                  hostsim.nvidia_installer(driver))
    hostsim.write(os.path.join(lab, 'mirror', 'installers', hostsim.cuda_installer_name(cuda, driver)),
                  hostsim.cuda_installer(cuda))
    return {
        'recipe': recipe(),
        'model': model,
        'index': index,
        'ct_base': ctbase.ensure(),
        'host_base': ctbase.ensure(kind='host'),
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
        # The simulated SGLang's speed model (docs/bench.md), written into each container it creates.
        'sglang_speed': spec.get('sglang_speed'),
    }


def prepare_model(lab, host):
    """The model Pulumi.lab.yaml declares (gpuhost:model), built on the lab host's model storage (lab/labmodel.py),
    and its checksum file in LAB/model/<id>.sha256 (the lab stack's gpuhost:model.checksums). None without one."""
    model, model_path = labmodel.declared(os.path.join(REPO, 'Pulumi.lab.yaml'))
    if not model or not model_path:
        return None
    where = labmodel.host_dir(model, model_path)
    sums = labmodel.build(host.path(where.lstrip('/')), model['id'], model['revision'])
    checksums = os.path.join(lab, 'model', '%s.sha256' % model['id'])
    hostsim.write(checksums, sums)
    # The same files on the lab's mirror (lab/mirror.py), for the download path (gpuhost:model.source).
    labmodel.build(os.path.join(lab, 'mirror', model['id']), model['id'], model['revision'])
    # ... and as the hub holds them (lab/mirror.py's hub: /<org>/<repo>/resolve/<revision>/<file>).
    labmodel.build(os.path.join(lab, 'mirror', labmodel.HUB_ORG, model['id'], model['revision']), model['id'],
                   model['revision'])
    return {'id': model['id'], 'revision': model['revision'], 'storage': model['storage'], 'dir': where,
            'checksums': checksums}


def prepare_index(lab, spec):
    """The lab's package index (lab/pyindex.py): the simulated SGLang's wheel at the spec's version and pip's own
    wheel, and the lab stack's lock for them (LAB/runtime/sglang.lock, with their real sha256)."""
    index_dir = os.path.join(lab, 'runtime', 'index')
    version = spec.get('sglang_version', '0.5.23')
    pyindex.add(index_dir, sglang_wheel.wheel(version))
    pip = os.path.basename(sglang_wheel.pip_wheel()).split('-')[1]
    pyindex.add(index_dir, sglang_wheel.pip_wheel())
    hostsim.write(os.path.join(lab, 'runtime', 'sglang.lock'), pyindex.lock_text(
        index_dir, {'sglang': version, 'pip': pip}, note=', written at lab start for the lab stack'))
    write_secret(os.path.join(lab, 'secrets', 'index-password'), secrets.token_urlsafe(18))
    return {'host': spec['addresses'].get('index', spec['addresses']['pve']),
            'port': spec.get('ports', {}).get('index', pyindex.PORT), 'user': pyindex.USER, 'dir': index_dir,
            'password_file': os.path.join(lab, 'secrets', 'index-password'),
            'lock': os.path.join(lab, 'runtime', 'sglang.lock'), 'pip_version': pip}


SSHD_CONFIG = '''# The lab host's SSH server (generated by lab/labctl.py; ssh.service on the host runs it, lab/host-init.sh).
# Key-only, loopback only.
ListenAddress {addr}:{port}
HostKey {ssh}/ssh_host_ed25519_key
AuthorizedKeysFile {ssh}/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
UsePAM no
StrictModes no
MaxStartups 64:30:128
# OpenSSH's default, as on a real host: a client that opens more sessions at once on one connection is refused
# (the program keeps to transport/remote.py MAX_CHANNELS).
MaxSessions 10
Subsystem sftp internal-sftp
LogLevel VERBOSE
# Every command through the lab's wrapper: counted, logged, dropped on demand (lab/sshcmd.sh).
ForceCommand {command}
'''


def write_secret(path, value):
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 'w') as f:
        f.write(value)


# --------------------------------------------------------------------------- daemon

class CtWorker(threading.Thread):
    """One container's life in the lab daemon: brings lab/container.py's Container to the state fakepve
    last gave it (created, booted, stopped, rebooted, destroyed), off the daemon's event loop - a
    container takes a second or two to shut down, and fakepve's API must keep answering meanwhile.
    Every want() is numbered (asked); done is the number of the last one carried out, failure its error
    (or None): a container's power task ends when its number is done (Lab.ct_reached). enterable: `pct`
    may enter it (Lab.ct_enter_argv) - false from the moment a stop begins; gate: held by the pct broker
    from its check until nsenter is inside, and by a stop before it begins, so no nsenter meets a dying
    container."""

    def __init__(self, labd, vmid):
        super().__init__(name='ct-%d' % vmid, daemon=True)
        self.labd, self.vmid = labd, vmid
        self.ct = container.Container(labd.ct_dir(vmid))
        self.cond = threading.Condition()
        self.desired = None
        self.busy = False
        self.booted_pid = None
        self.asked = self.done = 0
        self.failure = None
        self.gate = threading.Lock()
        self.enterable = False

    def want(self, state):
        with self.cond:
            self.asked += 1
            self.desired = state
            self.cond.notify()

    def idle(self):
        with self.cond:
            return self.desired is None and not self.busy

    def run(self):
        while True:
            with self.cond:
                while self.desired is None:
                    self.cond.wait()
                state, self.desired, self.busy, asked = self.desired, None, True, self.asked
            failure = None
            try:
                done = self.converge(state)
            except Exception as e:  # logged; the lab keeps going (pct then reports the container's state)
                failure = '%s: %s' % (type(e).__name__, e)
                print('labd: container %d: %s' % (self.vmid, failure), flush=True)
                done = False
            with self.cond:
                self.busy = False
                self.done, self.failure = asked, failure
            if done:
                return

    def closed(self):
        """No `pct` enters from here on (one entering now gets in first); the container may go down."""
        with self.gate:
            self.enterable = False
        return self.ct

    def converge(self, state):
        """True when the worker is finished (the container is destroyed or the daemon stops)."""
        if state in ('destroy', 'halt'):
            if state == 'destroy':
                self.closed().destroy()
            else:
                self.closed().stop()
                for point in container.mounts_under(self.ct.dir):
                    subprocess.run(['umount', '-l', point], capture_output=True)
            self.labd.workers.pop(self.vmid, None)
            return True
        if not self.ct.exists() or not container.mounted(self.ct.rootfs):
            self.ct.create(self.labd.info['ct_base'], self.labd.ct_files() if not self.ct.exists() else {})
        if state == 'stopped':
            self.closed().stop()
            self.booted_pid = None
            return False
        _, pid, hostname, binds = state
        if self.ct.leader() and self.booted_pid != pid:
            self.closed().stop()   # fakepve rebooted it: a new init
        # pct may enter once the new init runs (start() writes its leader, then `status`, which pct reads).
        self.enterable = True
        if not self.ct.leader():
            machine = 'lab%s-%d' % (hashlib.sha256(self.labd.lab.encode()).hexdigest()[:8], self.vmid)
            self.ct.start(machine, hostname, binds)
        self.booted_pid = pid
        return False


class Lab(object):
    def __init__(self, lab):
        self.lab = lab
        self.info = load(lab)
        self.host = hostsim.Host(lab)
        self.machine = labhost.LabHost(lab)
        self.broker = pctbroker.Broker(lab, self.ct_enter_argv, self.ct_gate, self.ct_status)
        self.pve = None
        self.loop = None
        self.seen = {}
        self.confs = {}
        self.locked = set()
        self.held = set()
        self.workers = {}
        self.tasks = set()   # the power tasks running on (asyncio keeps only weak references)

    def control_path(self, *parts):
        return os.path.join(self.lab, 'control', *parts)

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
        # PCI resource mappings: fakepve checks the requests against PVE's schema but stores nothing and
        # starts a VM whatever its hostpci holds. The lab keeps the mappings and refuses a start the way
        # qemu-server does (lab/pvemap.py). fakepve registers every `_routes_*` table of its instance.
        self.pcimap = pvemap.Store(self.host, self.info['node'])
        pve._routes_pcimap = self.pcimap.routes
        self.pcimap.wrap_start(pve)
        self.pve = pve
        self.loop = asyncio.get_running_loop()
        # A container's start/stop/shutdown/reboot task ends once the lab's container is there (power_task).
        fake_task = pve.task

        async def task(node, ttype, tid, user, body, vm=None, lock=True, log=()):
            if ttype in POWER_TASKS and vm is not None and vm in pve.cts:
                return await self.power_task(node, ttype, tid, user, body, vm, lock, log)
            return await fake_task(node, ttype, tid, user, body, vm=vm, lock=lock, log=log)
        pve.task = task
        # fakepve keeps no record of the requests its network scenario drops: the lab logs every
        # request, dropped or answered, from a middleware outside fakepve's own (request_log()).
        build_app = pve._build_app
        pve._build_app = lambda: self.with_request_log(build_app())
        await self.start_api()
        await self.start_index()
        await self.start_mirror()
        self.broker.start()
        await self.boot_host()

    async def start_mirror(self):
        """The lab's model mirror (lab/mirror.py) beside the package index, serving LAB/mirror/."""
        from aiohttp import web
        if not self.info.get('model'):
            return
        host = self.info['index']['host']
        # The same app answers as the hub's CDN on a port of its own: resolve/ redirects there (another origin, which
        # must never see the token - the request log says whether it did).
        self.mirror = mirror.Mirror(os.path.join(self.lab, 'mirror'), self.control_path('mirror-requests.log'),
                                    self.control_path('mirror-down'), self.control_path('mirror-throttle.json'),
                                    cdn_url='http://%s:%d' % (host, mirror.CDN_PORT))
        self.mirror_runner = web.AppRunner(self.mirror.app(), access_log=None)
        await self.mirror_runner.setup()
        await web.TCPSite(self.mirror_runner, host, mirror.PORT).start()
        await web.TCPSite(self.mirror_runner, host, mirror.CDN_PORT).start()

    async def start_index(self):
        from aiohttp import web
        info = self.info['index']
        with open(info['password_file']) as f:
            password = f.read()
        cdn = pyindex.cdn_host(info['host'])
        self.index = pyindex.Index(info['dir'], password, self.control_path('index-requests.log'),
                                   'http://%s:%d' % (cdn, pyindex.CDN_PORT), self.control_path('cdn-requests.log'))
        os.makedirs(self.control_path(), exist_ok=True)
        self.index_runner = web.AppRunner(self.index.app(), access_log=None)
        await self.index_runner.setup()
        await web.TCPSite(self.index_runner, info['host'], info['port']).start()
        self.cdn_runner = web.AppRunner(self.index.cdn_app(), access_log=None)
        await self.cdn_runner.setup()
        await web.TCPSite(self.cdn_runner, cdn, pyindex.CDN_PORT).start()

    async def start_api(self):
        await self.pve.start(self.info['pve']['cafile'], self.info['pve']['keyfile'])

    async def stop_api(self):
        runner = self.pve.runner
        if runner is not None:
            # In-flight requests (a hung one, say) get a second, as a host going down gives them.
            runner._shutdown_timeout = 1.0
            await self.pve.stop()

    async def boot_host(self):
        """Power the simulated host on (lab/labhost.py): back once its sshd accepts connections (at most
        10 s after its systemd runs as PID 1); the boot's times go to labd.log."""
        t0 = time.time()
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: self.machine.boot(self.info['host_base'], self.info['node']))
        t1 = time.time()
        while time.time() - t1 < 10 and not port_open(self.info['ssh']['host'], self.info['ssh']['port']):
            await asyncio.sleep(0.02)
        print('labd: host booted: systemd is PID 1 after %.2f s, sshd accepting after %.2f s' % (
            t1 - t0, time.time() - t0), flush=True)

    def halt_host(self, timeout=10.0):
        """The host goes down as in a reboot: every SSH connection dropped at once, without a goodbye (its
        sshd processes killed: a client sees no exit status), then its systemd halts - units stopped in
        order, then every process that is left - within timeout, else it is killed outright."""
        if self.machine.nspawn_pid() is None:
            return
        self.machine.kill_ssh_sessions()
        self.machine.poweroff(timeout=timeout)

    def ct_enter_argv(self, vmid, argv):
        """pct's broker (lab/pctbroker.py): the nsenter into running container vmid, or pct's message. Called
        under ct_gate(vmid): a container whose stop has begun (its worker closed it) is not running to pct,
        as it will be in a moment, and its nsenter cannot meet a PID 1 that is gone."""
        worker = self.workers.get(int(vmid))
        try:
            if worker is None or not worker.enterable:
                raise container.ContainerError('no worker' if worker is None else 'its stop has begun')
            return container.Container(self.ct_dir(vmid)).enter_argv(argv)
        except container.ContainerError as e:   # (not running, going down, or stopped a moment ago)
            # Why, in labd.log (a test's failed command shows its end): pct's own message says only this.
            print('labd: pct exec %s %s: CT %s not running (%s)' % (vmid, ' '.join(argv)[:80], vmid, e), flush=True)
            raise ValueError('CT %s not running' % vmid) from None

    def ct_status(self, node, vmid):
        """pct's broker (lab/pctbroker.py): the status fakepve holds for container vmid on node - the value its
        GET /nodes/{node}/lxc/{vmid}/status/current answers with, from the same handler - or None when it
        holds no such container there. The real pct reads the live state from the cluster filesystem on its
        own node, not over the API: no login, no request in pve-requests.log, no network scenario, injected
        failure or offline node in between. The handler runs on the daemon's event loop, where every change to
        fakepve's state is made (the broker calls this from a request's thread): it never sees one half made."""
        from fakepve import PveError
        pve, loop = self.pve, self.loop
        if pve is None or loop is None:
            return None

        async def read():
            try:
                return (await pve._lxc_status_current('root@pam', {'node': node, 'vmid': int(vmid)}))['status']
            except PveError:   # (its 500: no such container on that node)
                return None
        future = asyncio.run_coroutine_threadsafe(read(), loop)
        try:
            return future.result(timeout=STATUS_SECS)
        except TimeoutError:
            future.cancel()
            print('labd: pct status %s: the event loop did not answer within %.0f s' % (vmid, STATUS_SECS), flush=True)
            raise

    def ct_gate(self, vmid):
        """What the broker holds from its check until its nsenter is inside container vmid (CtWorker.gate)."""
        worker = self.workers.get(int(vmid))
        return worker.gate if worker is not None else contextlib.nullcontext()

    def stop(self):
        """The lab daemon ends: every container shut down and its root unmounted (its files stay)."""
        for worker in list(self.workers.values()):
            worker.want('halt')
        self.settle(timeout=60)
        self.halt_host()
        self.broker.stop()

    # -- containers (lab/container.py: an overlay root over the Debian base, systemd-nspawn, real systemd)

    def ct_dir(self, vmid):
        return os.path.join(self.lab, 'ct', str(vmid))

    def ct_root(self, vmid):
        return os.path.join(self.ct_dir(vmid), 'rootfs')

    def ct_files(self):
        """The lab's own files in a new container, beside what Proxmox writes (hostname, machine-id):
        its address, for the simulated SGLang's bind (lab/fakesglang), and the speed model it follows."""
        files = {'/etc/lab-ct.json': json.dumps({'ip': self.info['container_ip']}) + '\n'}
        if self.info.get('sglang_speed'):
            files['/etc/lab-sglang-speed.json'] = json.dumps(self.info['sglang_speed']) + '\n'
        return files

    def ct_binds(self, ct):
        """devN entries: the host's device nodes appear in the container at their paths (LXC's bind). And the
        host's /proc/driver, read-only, as an LXC container sees it (procfs is the host's): the nvidia module's
        version, which the container's NVIDIA libraries must match (lab/hostsim.py's simulated user space and
        SGLang read it there). systemd-nspawn (252) mounts what goes under /proc after entering the container's
        root, where a host path does not resolve: the directory is bound to /run/lab-proc-driver first (a
        tmpfs, nothing on the container's disk) and from there to /proc/driver."""
        out = [(self.host.path('proc', 'driver'), '/run/lab-proc-driver', 'ro'),
               ('/run/lab-proc-driver', '/proc/driver', 'ro')]
        for k, v in sorted(ct.config.items()):
            if re.match(r'^dev\d+$', k):
                dev = str(v).split(',')[0].strip()
                if dev.startswith('path='):
                    dev = dev[5:]
                src = self.host.path('dev', os.path.relpath(dev, '/dev')) if dev.startswith('/dev/') else None
                if src and os.path.exists(src):
                    out.append((src, dev))
            elif re.match(r'^mp\d+$', k):
                # A bind mount point (gpuhost:model's storage): the host directory at mp=, read-only with ro=1, as
                # LXC mounts it. Only a host directory that exists is bound (Proxmox would refuse the start).
                parts = str(v).split(',')
                opts = dict(p.split('=', 1) for p in parts[1:] if '=' in p)
                src = parts[0].strip()
                if src.startswith('/') and opts.get('mp') and os.path.isdir(self.host.path(src.lstrip('/'))):
                    out.append((self.host.path(src.lstrip('/')), opts['mp']) +
                               (('ro',) if opts.get('ro') in ('1', 'true', 'yes', 'on') else ()))
        return out

    def settle(self, timeout=60.0):
        """Wait until every container has done what it was last asked (booted, stopped, destroyed)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if all(w.idle() for w in self.workers.values()):
                return True
            time.sleep(0.05)
        print('labd: containers still busy after %s s: %s' % (
            timeout, [v for v, w in self.workers.items() if not w.idle()]), flush=True)
        return False

    def worker(self, vmid):
        w = self.workers.get(vmid)
        if w is None or not w.is_alive():
            w = self.workers[vmid] = CtWorker(self, vmid)
            w.start()
        return w

    # -- control files (tests/lablib.py writes them)

    def control(self):
        """Fault injection for tests: LAB/control/pve-fail.json holds keyword arguments of fakepve's
        fail() (method, suffix, status, message, error, times); applied once, then removed.
        LAB/control/pve-set.json: {"id": ..., "ops": [[name, value], ...]}, see pve_op(); applied in
        order, then removed, and acknowledged in pve-set.ack.json ({"id", "error"})."""
        path = self.control_path('pve-fail.json')
        if os.path.exists(path):
            with open(path) as f:
                for spec in json.load(f):
                    self.pve.fail(**spec)
            os.unlink(path)
        path = self.control_path('pve-set.json')
        if os.path.exists(path):
            with open(path) as f:
                try:
                    req = json.load(f)
                except ValueError:
                    return  # still being written (lablib writes it atomically; a hand-made one may not be)
            error = None
            try:
                for name, value in req.get('ops', []):
                    self.pve_op(name, value)
            except Exception as e:  # reported to the test, which raises it
                error = '%s: %s' % (type(e).__name__, e)
            os.unlink(path)
            hostsim.write(self.control_path('pve-set.ack.json'), json.dumps({'id': req.get('id'), 'error': error}) + '\n')

    def with_request_log(self, app):
        from aiohttp import web

        @web.middleware
        async def outermost(request, handler):
            return await self.request_log(request, handler)
        app.middlewares.insert(0, outermost)
        return app

    async def request_log(self, request, handler):
        """Every request that reached fakepve, one JSON line in LAB/control/pve-requests.log: {"t" (time it
        arrived), "method", "path" (with the query), "status" (the HTTP status, or "dropped" when the
        network scenario reset the connection), "agent" (User-Agent: the program's proxmoxer sends
        python-requests/...; the lab's pct does not use the API: Lab.ct_status)}, so a test can count the drops
        and the program's retries."""
        t = time.time()
        status = 'cancelled'  # the client went away, or the API stopped (a reboot), before an answer
        try:
            response = await handler(request)
            status = response.status
        except ConnectionResetError as e:
            # fakepve's drop_rate: the connection closed without an answer.
            status = 'dropped' if 'connection dropped' in str(e) else type(e).__name__
            raise
        except Exception as e:  # an aiohttp HTTPException is an answer too; anything else, its name
            status = getattr(e, 'status', None) or type(e).__name__
            raise
        finally:
            with open(self.control_path('pve-requests.log'), 'a') as f:
                f.write(json.dumps({'t': round(t, 3), 'method': request.method, 'path': request.path_qs,
                                    'status': status, 'agent': request.headers.get('User-Agent')}) + '\n')
        return response

    def guest(self, vmid):
        g = self.pve.guest(int(vmid))
        if g is None:
            raise ValueError('no guest %s' % vmid)
        return g

    def pve_op(self, name, value):
        """One of fakepve's scenarios (fakepve/model.py), by name:
          quorate: bool                      lose / regain quorum (writes and actions: 500 no quorum)
          node_online: [node, bool]          a node offline (its requests: 595 No route to host)
          lock: [vmid, lock]                 the guest's config `lock` (backup, migrate, snapshot, ...)
          unlock: vmid                       clear it, and release a held config lock
          hold_config_lock: [vmid, secs]     another task holds the guest's config lock for secs real
                                             seconds (null: until unlock); writes wait lock_wait then fail
          revoke_tickets: true               forget every login ticket (next request: 401)
          expire_tickets: true               every ticket issued so far has expired
          ticket_ttl: secs                   lifetime of tickets issued from now on
          network: {drop_rate, hang_rate, hang_secs, latency, jitter, seed, node_latency}
          time_scale: float                  PVE seconds -> real seconds for task durations (lab: 0)
          lock_wait: secs                    PVE seconds a write waits for a held config lock
          ct_secs: {create, destroy, ...}    container task durations (PVE seconds)
          guest_secs: [vmid, {start, stop, shutdown}]   one guest's task durations (PVE seconds)
          start_error: [vmid, message|null]  the guest's start task fails with message
          fail: [fail() kwargs, ...]         as pve-fail.json
          index_down: bool                   the package index closes every connection unanswered (lab/pyindex.py)
          index_files: {from, rate}          where the index's files come from: 'index', 'redirect' or 'link' (the
                                             CDN), and a download rate in bytes a second (null: none)
          pve_version: "8.1.4"               the Proxmox VE version /version reports (an older release's)
          clear_failures: true               forget every fail()
          reset: true                        all of the above back to a healthy cluster
        """
        pve = self.pve
        if name == 'quorate':
            pve.quorate = bool(value)
        elif name == 'node_online':
            node, online = value
            pve.nodes.setdefault(node, {})['online'] = bool(online)
        elif name == 'lock':
            vmid, lock = value
            self.set_lock(self.guest(vmid), lock)
            self.locked.add(int(vmid))
        elif name == 'unlock':
            g = self.guest(value)
            self.set_lock(g, None)
            pve.release(g, 'scenario')
            self.locked.discard(int(value))
            self.held.discard(int(value))
        elif name == 'hold_config_lock':
            vmid, secs = value
            g = self.guest(vmid)
            if g.lock_holder is not None and g.lock_holder != 'scenario':
                raise ValueError('the config lock of %s is held by %s' % (vmid, g.lock_holder))
            g.lock_holder = 'scenario'
            self.held.add(int(vmid))
            if secs is not None:
                asyncio.get_running_loop().call_later(float(secs), pve.release, g, 'scenario')
        elif name == 'release_config_lock':
            pve.release(self.guest(value), 'scenario')
            self.held.discard(int(value))
        elif name == 'revoke_tickets':
            if value:
                pve.revoke_tickets()
        elif name == 'expire_tickets':
            if value:
                for session in pve.tickets.values():
                    session['expires'] = time.time() - 1
        elif name == 'ticket_ttl':
            pve.ticket_ttl = float(value)
        elif name == 'network':
            unknown = set(value) - set(pve.network)
            if unknown:
                raise ValueError('unknown network setting(s) %s; known: %s' % (
                    ', '.join(sorted(unknown)), ', '.join(sorted(pve.network))))
            pve.network.update(value)
            if value.get('seed') is not None:
                pve._random.seed(value['seed'])
        elif name == 'time_scale':
            pve.time_scale = float(value)
        elif name == 'lock_wait':
            pve.lock_wait = float(value)
        elif name == 'ct_secs':
            unknown = set(value) - set(pve.ct_secs)
            if unknown:
                raise ValueError('unknown ct_secs %s; known: %s' % (', '.join(sorted(unknown)),
                                                                  ', '.join(sorted(pve.ct_secs))))
            pve.ct_secs.update(value)
        elif name == 'guest_secs':
            vmid, secs = value
            g = self.guest(vmid)
            for key, val in secs.items():
                if key not in ('start', 'stop', 'shutdown'):
                    raise ValueError('guest_secs: start, stop or shutdown, not %r' % key)
                setattr(g, key + '_secs', float(val))
        elif name == 'start_error':
            vmid, message = value
            self.guest(vmid).start_error = message
        elif name == 'fail':
            for spec in value:
                pve.fail(**spec)
        elif name == 'clear_failures':
            pve.failures = {}
        elif name == 'index_down':
            self.index.down = bool(value)
        elif name == 'index_files':
            if value.get('from', 'index') not in ('index', 'redirect', 'link'):
                raise ValueError('index_files: from must be index, redirect or link')
            self.index.files_from = value.get('from', 'index')
            self.index.rate = value.get('rate')
        elif name == 'pve_version':
            pve.version, pve.release_version = str(value), '.'.join(str(value).split('.')[:2])
        elif name == 'reset':
            self.pve_reset()
        else:
            raise ValueError('unknown pve-set operation %r' % name)

    @staticmethod
    def set_lock(g, lock):
        g.lock = lock or None
        if lock:
            g.config['lock'] = lock
        else:
            g.config.pop('lock', None)

    def pve_reset(self):
        """Back to the healthy cluster the lab starts with (guests' own state stays)."""
        from fakepve.model import Model
        pve = self.pve
        healthy = Model()
        pve.quorate = True
        for node in pve.nodes.values():
            node['online'] = True
        pve.network = dict(healthy.network, node_latency={})
        pve.time_scale = 0
        pve.lock_wait = healthy.lock_wait
        pve.ticket_ttl = healthy.ticket_ttl
        pve.version, pve.release_version = healthy.version, healthy.release_version
        self.index.down = False
        self.index.files_from, self.index.rate = 'index', None
        pve.failures = {}
        for key in pve.ct_secs:
            pve.ct_secs[key] = 0
        for g in list(pve.cts) + list(pve.vms):
            g.start_secs = g.stop_secs = g.shutdown_secs = 0
            g.start_error = None
            if g.vmid in self.locked:
                self.set_lock(g, None)
            pve.release(g, 'scenario')
        self.locked.clear()
        self.held.clear()

    # -- the sync loop

    def sync(self):
        self.control()
        now = set()
        for ct in self.pve.cts:
            now.add(ct.vmid)
            self.sync_ct(ct)
        for vmid in set(self.seen) - now:
            self.worker(vmid).want('destroy')
            conf = self.host.path('etc/pve/lxc/%d.conf' % vmid)
            if os.path.exists(conf):
                os.unlink(conf)
            self.confs.pop(('lxc', vmid), None)
            del self.seen[vmid]
        vms = set()
        for vm in self.pve.vms:
            vms.add(vm.vmid)
            self.sync_conf('qemu-server', vm)
        qdir = self.host.path('etc/pve/qemu-server')
        for name in os.listdir(qdir):
            if name.endswith('.conf') and name[:-5].isdigit() and int(name[:-5]) not in vms:
                os.unlink(os.path.join(qdir, name))
                self.confs.pop(('qemu-server', int(name[:-5])), None)

    def sync_ct(self, ct):
        """One container: its config file, and its worker told when fakepve's state of it changed."""
        # (status, init pid): a reboot keeps "running" but gives the container a new init.
        now = (ct.status, ct.pid)
        prev = self.seen.get(ct.vmid, (None, None))
        self.sync_conf('lxc', ct)
        if prev != now or ct.vmid not in self.workers:
            hostname = str(ct.config.get('hostname') or 'CT%d' % ct.vmid)
            self.worker(ct.vmid).want(('running', ct.pid, hostname, self.ct_binds(ct))
                                      if ct.status == 'running' else 'stopped')
        self.seen[ct.vmid] = now

    # -- a container's power task (fakepve's, ending where Proxmox's does)

    async def power_task(self, node, ttype, tid, user, body, ct, lock, log):
        """fakepve's Model.task for a container's start, stop, shutdown or reboot, ending as Proxmox's does: once
        the container is there - its init running, or down (ct_reached). fakepve's own part (body: the checks,
        the state change) runs as fakepve runs it, under the guest's config lock: at once at time_scale 0 (the
        API reports the new state when the request answers) or in the background. The wait for the container
        runs in the background, without the lock, the task `running` meanwhile; its UPID answers the request
        at once, as PVE's worker does. A client that waits for the task (the program's wait_task) then finds
        the container where the task said."""
        from fakepve.model import TaskError
        pve = self.pve
        upid, pid, start = pve._upid(node, ttype, tid, user)
        record = {'upid': upid, 'node': node, 'pid': pid, 'pstart': pid * 7, 'starttime': start,
                  'type': ttype, 'id': str(tid), 'user': user, 'status': 'running', 'log': list(log)}
        pve.tasks[upid] = record
        pve.tasklog.append(record)

        async def fake():
            if lock:
                await pve.acquire(ct, upid)
            try:
                note = await body()
                if note:
                    record['log'].append(note)
            finally:
                if lock:
                    pve.release(ct, upid)

        def end(status):
            record['status'] = 'stopped'
            record['exitstatus'] = status
            record['endtime'] = int(time.time())
            record['log'].append('TASK OK' if status == 'OK' else 'TASK ERROR: ' + status)

        async def run(steps):
            status = 'OK'
            try:
                for step in steps:
                    await step()
            except TaskError as e:
                status = str(e)
                record['log'].append(status)
            except Exception as e:  # a lab bug: the task says it, and labd.log has the trace
                import traceback
                traceback.print_exc()
                status = 'lab: %s: %s' % (type(e).__name__, e)
            end(status)

        steps = [fake, lambda: self.ct_reached(ct)]
        if not pve.time_scale:
            try:
                await fake()
            except TaskError as e:
                record['log'].append(str(e))
                end(str(e))
                return upid
            steps = steps[1:]
        job = asyncio.ensure_future(run(steps))
        self.tasks.add(job)
        job.add_done_callback(self.tasks.discard)
        return upid

    async def ct_reached(self, ct):
        """Until the lab's container is where fakepve has put ct (booted with its init, or down): the lab daemon
        acts at once (not at its next round) and this waits for its worker. A container that did not boot
        fails the task as lxc-start's failure does on Proxmox (and is stopped); anything else names labd.log."""
        from fakepve.model import TaskError
        self.sync_ct(ct)
        deadline = time.time() + POWER_TASK_SECS
        worker, asked = None, 0
        while True:
            current = self.workers.get(ct.vmid)
            if current is None and ct in self.pve.cts:
                # The worker told ended meanwhile, with what it was told after its last task lost: it was
                # destroying the container this vmid named before (a replacement). This one gets its own.
                self.sync_ct(ct)
                current = self.workers.get(ct.vmid)
            if current is not worker:
                worker = current
                if worker is None:
                    return
                with worker.cond:
                    asked = worker.asked
            with worker.cond:
                done, failure = worker.done, worker.failure
            if done >= asked:
                break
            if time.time() > deadline:
                raise TaskError('lab: container %d is not %s after %d s (its worker is still at it; see %s)' % (
                    ct.vmid, ct.status, POWER_TASK_SECS, os.path.join(self.lab, 'labd.log')))
            await asyncio.sleep(0.05)
        if failure is None:
            return
        if ct.status == 'running':
            ct.status, ct.pid = 'stopped', None
            self.sync_ct(ct)
            raise TaskError("startup for container '%d' failed" % ct.vmid)
        raise TaskError('lab: container %d: %s (see %s)' % (ct.vmid, failure, os.path.join(self.lab, 'labd.log')))

    # -- /etc/pve/<kind>/<vmid>.conf <-> fakepve (pmxcfs: the file is the guest's config)

    @staticmethod
    def api_view(config):
        """The config keys the file holds, as text."""
        return {k: str(v) if k == 'description' else str(v).strip() for k, v in config.items()
                if k not in ('digest', 'lxc') and not k.startswith('lxc.')}

    @staticmethod
    def file_text(api, raw):
        """The file PVE writes: the description as comment lines on top, then key: value lines, then
        the raw lxc.* lines."""
        import urllib.parse
        desc = api.get('description')
        head = ''.join('#%s\n' % urllib.parse.quote(line, safe=DESC_SAFE) for line in desc.split('\n')) if desc else ''
        return head + ''.join('%s: %s\n' % (k, v) for k, v in sorted(api.items()) if k != 'description') + \
            ''.join(line + '\n' for line in raw)

    @staticmethod
    def file_view(text):
        """The main section of a guest config file as {key: value}, raw lxc.* lines left out. Comment
        lines at the top are the description (as PVE writes it)."""
        out, comments = {}, []
        for line in text.splitlines():
            if line.startswith('['):
                break
            if line.startswith('#'):
                comments.append(line[1:])
                continue
            key, sep, value = line.partition(':')
            key = key.strip()
            if not sep or not key or key.startswith('lxc.'):
                continue
            out[key] = value.strip()
        if comments and 'description' not in out:
            import urllib.parse
            out['description'] = '\n'.join(urllib.parse.unquote(line) for line in comments)
        return out

    def sync_conf(self, kind, guest):
        """Keep the guest's file and fakepve's config one: whichever changed since the last sync wins
        (the API if both did, its write having been first). Raw lxc.* lines live in the file only."""
        path = self.host.path('etc/pve', kind, '%d.conf' % guest.vmid)
        key = (kind, guest.vmid)
        api = self.api_view(guest.config)
        try:
            with open(path) as f:
                text = f.read()
        except FileNotFoundError:
            text = None
        last = self.confs.get(key)
        if last is not None and text is not None and text != last['text'] and api == last['api']:
            # Edited on the host (by hand, by the program over SSH): the API reports the file.
            filed = self.file_view(text)
            if filed != api:
                self.config_from_file(kind, guest, filed)
                api = self.api_view(guest.config)
            self.confs[key] = {'api': api, 'text': text}
            return
        if last is not None and text == last['text'] and api == last['api']:
            return
        raw = [line for line in (text or '').splitlines() if line.startswith('lxc.')]
        body = self.file_text(api, raw)
        if body != text:
            hostsim.write(path, body)
        self.confs[key] = {'api': api, 'text': body}

    def config_from_file(self, kind, guest, filed):
        """The guest's config as the file now says, typed as the API returns it. A value PVE could
        not parse is left out with a warning in labd.log, as PVE's config parser does."""
        from fakepve import schema
        template = '/nodes/{node}/%s/{vmid}/config' % ('lxc' if kind == 'lxc' else 'qemu')
        spec = schema.load().paths[template]['PUT'].get('parameters') or {}
        props = spec.get('properties', {})
        config = {}
        before = self.api_view(guest.config)
        for k, v in filed.items():
            if before.get(k) == v:
                config[k] = guest.config[k]  # unchanged: as the API had it
                continue
            sch = schema._prop(props, k)
            if sch is None:
                config[k] = v
                continue
            value, err = schema.check_value(sch, v)
            if err:
                print('labd: vm %s - unable to parse value of %r - %s (line ignored)' % (guest.vmid, k, err), flush=True)
                continue
            config[k] = value
        guest.config.clear()
        guest.config.update(config)
        if kind == 'qemu-server':
            guest.lock = config.get('lock')

    # -- the host's reboot (the fake `reboot` asks for it)

    def reboot_requested(self):
        return os.path.exists(self.control_path('reboot-request.json'))

    def setting(self, name, env, default):
        if os.environ.get(env):
            return float(os.environ[env])
        value = self.host.spec.get(name)
        return default if value is None else float(value)

    async def reboot(self, requested=True):
        """What a real reboot does to the host, in order: every SSH connection drops without a goodbye,
        the host's systemd halts (its units stopped, hung commands killed), the API goes away, guests
        stop; the host stays down for reboot_down_secs; it boots the installed state (new boot_id,
        command line, bindings, module options), the API comes back, the onboot guests start (their
        enabled units with them), and the host's systemd boots again - its enabled units (sshd, the
        collector's timer) start by themselves. spec reboot_guest_delay: start the guests that many
        seconds after sshd instead (a real host's pve-guests runs after sshd is up). requested: the fake
        `reboot` asked for it (LAB/control/reboot-request.json); else the host's systemd rebooted by
        itself (`systemctl reboot`: systemd-nspawn exited with 133) and is down already."""
        t0 = time.time()
        request = {}
        if requested:
            try:
                with open(self.control_path('reboot-request.json')) as f:
                    request = json.load(f)
            except ValueError:
                pass
            os.unlink(self.control_path('reboot-request.json'))
        down = self.setting('reboot_down_secs', REBOOT_ENV, REBOOT_DOWN_SECS)
        guest_delay = self.host.spec.get('reboot_guest_delay')
        old_boot = hostsim.read(self.host.path('proc/boot_id')).strip()
        hostsim.write(self.control_path('rebooting'), json.dumps({'t': t0}) + '\n')
        started, failed, t_down, t_up = [], {}, None, None
        try:
            await asyncio.get_running_loop().run_in_executor(None, self.halt_host)
            await self.stop_api()
            t_down = time.time()
            for ct in self.pve.cts:
                if ct.status == 'running':
                    ct.status, ct.pid = 'stopped', None
            for vm in self.pve.vms:
                if vm.status == 'running':
                    vm.status = vm.qmpstatus = 'stopped'
            self.sync()
            self.settle()   # the guests are down before the host is
            self.host.reboot()
            await asyncio.sleep(max(0.0, down - (time.time() - t_down)))
            await self.start_api()
            if guest_delay is None:
                started, failed = await self.start_onboot()
                self.sync()
        finally:
            # Whatever failed above, the host comes back: a lab without sshd or API helps nobody.
            if self.pve.runner is None:
                await self.start_api()
            if not self.machine.running():
                try:
                    await self.boot_host()
                except container.ContainerError as e:
                    print('labd: the host did not boot again: %s' % e, flush=True)
            deadline = time.time() + 10
            while time.time() < deadline and not port_open(self.info['ssh']['host'], self.info['ssh']['port']):
                await asyncio.sleep(0.05)
            t_up = time.time()
            os.unlink(self.control_path('rebooting'))
        if guest_delay is not None:
            await asyncio.sleep(float(guest_delay))
            started, failed = await self.start_onboot()
            self.sync()
        record = {'requested': request.get('t'), 'down': round(t_down or t0, 3), 'up': round(t_up, 3),
                  'secs': round(t_up - t0, 3), 'old_boot_id': old_boot,
                  'boot_id': hostsim.read(self.host.path('proc/boot_id')).strip(),
                  'started': started, 'start_failed': failed}
        with open(self.control_path('reboots.log'), 'a') as f:
            f.write(json.dumps(record) + '\n')
        print('labd: host rebooted: %s' % json.dumps(record), flush=True)

    async def host_went_down(self):
        """The host's systemd ended by itself: rebooted (`systemctl reboot` on the host: nspawn exits with 133)
        - the lab reboots it as a requested reboot does -, or powered off (`poweroff`): it stays off."""
        code = self.machine.exited()
        self.machine.machine.proc = None
        if code == 133:
            print('labd: the host\'s systemd rebooted', flush=True)
            await self.reboot(requested=False)
        else:
            self.machine.poweroff()   # its state files, and any process left
            print('labd: the host is off (systemd-nspawn exited with %s, see %s); `python -m lab.labctl down` and '
                  '`up` start a new lab' % (code, self.machine.path('boot.log')), flush=True)

    async def start_onboot(self):
        """pve-guests' startall: the guests with onboot=1, by startup order, then vmid."""
        def order(g):
            startup = str(g.config.get('startup') or '')
            for item in startup.split(','):
                k, _, v = item.partition('=')
                if k.strip() == 'order' and v.strip().isdigit():
                    return (int(v), g.vmid)
            return (1 << 30, g.vmid)
        guests = [g for g in list(self.pve.cts) + list(self.pve.vms)
                  if str(g.config.get('onboot', 0)) in ('1', 'True', 'true') and not g.template]
        started, failed = [], {}
        for g in sorted(guests, key=order):
            try:
                if g in self.pve.cts:
                    upid = await self.pve._lxc_start('root@pam', {'node': g.node, 'vmid': str(g.vmid)})
                else:
                    self.pve.need_quorum()
                    upid = await self.pve._do_start(g, 'root@pam', {})
                task = self.pve.tasks.get(upid) or {}
                if task.get('status') == 'stopped' and task.get('exitstatus') != 'OK':
                    failed[g.vmid] = task.get('exitstatus')
                else:
                    started.append(g.vmid)
            except Exception as e:  # startall goes on with the next guest
                failed[g.vmid] = getattr(e, 'message', None) or str(e)
        return started, failed


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
                if labd.reboot_requested():
                    await labd.reboot()
                elif labd.machine.exited() is not None:
                    await labd.host_went_down()
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
        await labd.stop_api()
        await labd.index_runner.cleanup()


# --------------------------------------------------------------------------- commands

def recipe():
    """What a lab is made from: the lab's code and spec, and the lab stack's config (its model, its index). A
    running lab made from another recipe (an older checkout: no model on its host, say) is restarted by `up`."""
    h = hashlib.sha256()
    for rel in sorted([os.path.join('lab', n) for n in os.listdir(HERE) if n.endswith(('.py', '.sh'))] +
                      [os.path.join('lab', 'spec', n) for n in os.listdir(os.path.join(HERE, 'spec'))] +
                      ['Pulumi.lab.yaml']):
        with open(os.path.join(REPO, rel), 'rb') as f:
            h.update(rel.encode() + b'\0' + f.read())
    return h.hexdigest()[:16]


def up(lab, spec):
    if running(lab):
        if load(lab).get('recipe') == recipe():
            print(json.dumps({'started': False, 'lab': lab}))
            return load(lab)
        print('labctl: the running lab was made by another checkout of lab/ (or Pulumi.lab.yaml): starting it again',
              file=sys.stderr)
    down(lab, quiet=True)
    info = prepare(lab, spec)
    hostsim.write(os.path.join(lab, 'lab.json'), json.dumps(info, indent=2) + '\n')
    log = open(os.path.join(lab, 'labd.log'), 'ab')
    labd = subprocess.Popen([sys.executable, '-m', 'lab.labctl', '--lab', lab, 'serve'], cwd=REPO, stdout=log,
                            stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 30
    while time.time() < deadline and labd.poll() is None:
        if running(lab):
            print(json.dumps({'started': True, 'lab': lab}))
            return load(lab)
        time.sleep(0.1)
    with open(os.path.join(lab, 'labd.log')) as f:
        tail = f.read()[-2000:]
    for name in ('host-os/boot.log', 'sshd.log'):
        path = os.path.join(lab, name)
        if os.path.exists(path):
            with open(path, errors='replace') as f:
                tail += '\n--- %s ---\n' % name + f.read()[-2000:]
    sys.exit(('the lab daemon exited (%s)' % labd.returncode if labd.poll() is not None else
              'lab did not come up within 30 s') + ':\n' + tail)


def down(lab, quiet=False):
    try:
        info = load(lab)
    except (FileNotFoundError, ValueError):
        info = {}
    pid = info.get('pid')
    if pid and pid_alive(pid):
        os.kill(pid, signal.SIGTERM)
        for _ in range(600):   # it shuts its containers down first (a second or two each, in parallel)
            if not pid_alive(pid):
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
    if os.path.isdir(lab):
        # A daemon that was killed left its host and containers running and their roots mounted.
        container.cleanup(lab)
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
