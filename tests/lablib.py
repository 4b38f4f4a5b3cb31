"""Helpers for the integration tests: a lab of their own (addresses apart from `make lab`'s), a copy
of the project pointing at it, and the real Pulumi CLI run against a file backend in that copy."""

from __future__ import annotations

import copy
import re
import fcntl
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'lab'))
import hostsim  # noqa: E402
import pyindex  # noqa: E402
from container import Container  # noqa: E402
from labhost import LabHost  # noqa: E402
from lab import sglang_wheel  # noqa: E402

PASSPHRASE = 'gpuhost-itest'
# The lab SGLang's load time in the tests' stacks (Lab.stack_config): short, the tests wait for it often.
SGLANG_STARTUP = 0.2
# systemd's catalog ids of "Started <unit>" and "Stopped <unit>" (sd-messages.h: SD_MESSAGE_UNIT_STARTED,
# SD_MESSAGE_UNIT_STOPPED) - for a oneshot service "Finished <unit>" is SD_MESSAGE_UNIT_STARTED too -, of
# "Starting <unit>..." (SD_MESSAGE_UNIT_STARTING) and "Failed to start <unit>" (SD_MESSAGE_UNIT_FAILED).
JOURNAL_EVENTS = {'39f53479d3a045ac8e11786248231fbf': 'started', '9d1aaa27d60140bd96365438aad20286': 'stopped'}
JOURNAL_RUNS = {'7d4958e842da4a758f6c1cdc7b36dcc5': 'starting', '39f53479d3a045ac8e11786248231fbf': 'finished',
                'be02cf6855d2428ba40df7e9d022f03d': 'failed'}
# fail_systemctl()'s wrapper, put into a container as /usr/local/sbin/systemctl (first on pct exec's PATH).
SYSTEMCTL_FAULT = r'''#!/bin/sh
# Put here by a test (tests/lablib.py fail_systemctl): `systemctl <cmd>` fails when
# /etc/lab-faults/systemctl.<cmd> exists; everything else is the real systemctl's.
real=/usr/bin/systemctl
cmd=
for a in "$@"; do case $a in -*) ;; *) cmd=$a; break ;; esac; done
fault=/etc/lab-faults/systemctl.$cmd
if [ -z "$cmd" ] || [ ! -e "$fault" ]; then exec "$real" "$@"; fi
unit=
for a in "$@"; do case $a in -*|"$cmd") ;; *) unit=$a ;; esac; done
case $unit in ""|*.*) ;; *) unit=$unit.service ;; esac
msg=$(cat "$fault")
[ "$msg" = hang ] && exec sleep 3600
if [ -z "$msg" ]; then
  case $cmd in
    start|restart|try-restart)
      # The start job fails in systemd itself: its control process exits 1.
      d=/run/systemd/system/$unit.d
      mkdir -p "$d"
      printf '[Service]\nExecStartPre=/bin/false\nRestart=no\n' > "$d/zz-lab-fault.conf"
      "$real" daemon-reload
      "$real" "$@"
      rc=$?
      rm -f "$d/zz-lab-fault.conf"
      rmdir "$d" 2>/dev/null
      "$real" daemon-reload
      exit $rc ;;
    stop) msg='Job for {unit} failed.
See "systemctl status {unit}" and "journalctl -xeu {unit}" for details.' ;;
    daemon-reload) msg='Failed to reload daemon: Connection timed out' ;;
    enable|disable) msg="Failed to $cmd unit: Input/output error" ;;
    *) msg="Failed to $cmd {unit}: Input/output error" ;;
  esac
fi
printf '%s\n' "$msg" | sed "s|{unit}|$unit|g" >&2
exit 1
'''
PROJECT_FILES = ('Pulumi.yaml', '__main__.py', 'config', 'grammar', 'transport', 'resources', 'components', 'hostscripts',
                 'templates', 'provider')


# Release 0.1.0 (CHANGELOG.md; tag v0.1.0 where tags were kept): the program as that release deployed it.
PREVIOUS_RELEASE = '986fe9e'
PREVIOUS_FILES = ('Pulumi.yaml', '__main__.py', 'config', 'grammar', 'components', 'templates')


# The provider plugin as main had it before issue 44 (provider 0.2.0, unreleased: CHANGELOG.md): the host's SSH key
# and Proxmox password in its provider's configuration, also where the stack keeps them in files.
PLUGIN_RELEASE = '649cadb'
# The project's files in the tree those releases had (before transport/, resources/ and hostscripts/: issue 49).
PLUGIN_FILES = ('Pulumi.yaml', '__main__.py', 'config', 'grammar', 'components', 'templates', 'provider')

# The provider plugin as main had it before issues 45 and 46 (provider 0.2.0, unreleased): one plugin process per
# host and pass, and each host's resources depending on the SGLang unit of the host before it in its rollout lane.
PER_HOST_RELEASE = '8a9d5b0'
PER_HOST_FILES = PLUGIN_FILES


class previous_release:
    """The lab's project copy holds the previous release's program for the duration (its own files set aside and
    put back after): same directory, stack file, backend and virtualenv, as on an operator's checkout. `commit`,
    `files`: another release's (PLUGIN_RELEASE, PLUGIN_FILES)."""

    def __init__(self, lab, commit=PREVIOUS_RELEASE, files=PREVIOUS_FILES):
        self.project = lab.project
        self.aside = os.path.join(os.path.dirname(lab.project), 'project-new')
        self.commit, self.files = commit, files

    def __enter__(self):
        os.makedirs(self.aside)
        for name in PROJECT_FILES:
            os.rename(os.path.join(self.project, name), os.path.join(self.aside, name))
        archive = subprocess.run(['git', '-C', REPO, 'archive', self.commit] + list(self.files),
                                 capture_output=True, check=True).stdout
        subprocess.run(['tar', '-x', '-C', self.project], input=archive, check=True)
        return self

    def __exit__(self, *exc):
        for name in self.files:
            path = os.path.join(self.project, name)
            (shutil.rmtree if os.path.isdir(path) else os.unlink)(path)
        for name in PROJECT_FILES:
            os.rename(os.path.join(self.aside, name), os.path.join(self.project, name))
        os.rmdir(self.aside)


class SshResult(object):
    def __init__(self, stdout, stderr, exit_code):
        self.stdout, self.stderr, self.exit_code = stdout, stderr, exit_code

    @property
    def dropped(self):
        return self.exit_code is None

    def __repr__(self):
        return 'SshResult(exit_code=%r, stdout=%r, stderr=%r)' % (self.exit_code, self.stdout[-300:], self.stderr[-300:])


def _write_json(path, data):
    """Atomically, so the lab daemon never reads half a request."""
    hostsim.write(path, json.dumps(data) + '\n')


def _read(path, default=''):
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return default


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def project_env(base, lab_dir=None):
    """The environment of the CLI for a project copy under base: its file backend and PULUMI_HOME, the
    test passphrase, no update checks or plugin downloads; GPUHOST_LAB when there is a lab."""
    env = dict(os.environ, PULUMI_BACKEND_URL='file://' + os.path.join(base, 'state'),
               PULUMI_HOME=os.path.join(base, 'pulumi-home'), PULUMI_CONFIG_PASSPHRASE=PASSPHRASE,
               PULUMI_SKIP_UPDATE_CHECK='true', PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION='true')
    if lab_dir:
        env['GPUHOST_LAB'] = lab_dir
    env.pop('PULUMI_CONFIG_PASSPHRASE_FILE', None)
    return env


def make_project(base):
    """A copy of the project under base/project, a file backend in base/state and a PULUMI_HOME with
    pulumi-command's provider plugin (from the binary tools/bootstrap.sh cached: no download)."""
    project = os.path.join(base, 'project')
    os.makedirs(project)
    for name in PROJECT_FILES:
        src = os.path.join(REPO, name)
        dst = os.path.join(project, name)
        (shutil.copytree if os.path.isdir(src) else shutil.copyfile)(src, dst)
    os.symlink(os.path.join(REPO, '.venv'), os.path.join(project, '.venv'))
    os.makedirs(os.path.join(base, 'state'))
    env = project_env(base)
    res = subprocess.run([os.path.join(REPO, 'tools', 'install-command-plugin.sh'), env['PULUMI_HOME']],
                         env=env, capture_output=True, text=True)
    assert res.returncode == 0, 'install-command-plugin.sh failed:\n' + res.stderr
    return project


# Each lab (a test module's, a fleet's hosts, a benchmark's) answers on its own loopback /24, 127.0.N.0
# with N from 21, apart from `make lab`'s 127.0.0.0 and `make lab HOSTS=N`'s 127.1.i.0. Several pytest
# processes (or xdist workers, or a benchmark next to a test run) may start labs at once: a net is
# claimed with a lock file held as long as the lab runs, and passed over if its ports are taken.
NET_LOCKS = '/tmp/gpuhost-lab-nets'
FIRST_NET, LAST_NET = 21, 120


def _ports_free(net):
    for addr, port in (('127.0.%d.2' % net, 8006), ('127.0.%d.3' % net, 2222), ('127.0.%d.4' % net, 30000),
                       ('127.0.%d.2' % net, pyindex.PORT), (pyindex.cdn_host('127.0.%d.2' % net), pyindex.CDN_PORT)):
        s = socket.socket()
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((addr, port))
        except OSError:
            return False
        finally:
            s.close()
    return True


def claim_net():
    """(net, open lock file): the first free loopback /24; the lock is released when the file is closed."""
    os.makedirs(NET_LOCKS, exist_ok=True)
    for net in range(FIRST_NET, LAST_NET):
        f = open(os.path.join(NET_LOCKS, '%d.lock' % net), 'w')
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            continue
        if _ports_free(net):
            return net, f
        f.close()
    raise RuntimeError('no free loopback net for a lab in 127.0.%d-%d.0/24' % (FIRST_NET, LAST_NET - 1))


# A module whose tests failed leaves its labs' logs here (its lab directory goes with the module): labd.log,
# sshd.log and the rest, the only account of what the simulated hosts did when CI saw a failure.
FAILED_LOGS = '/tmp/gpuhost-lab-logs'
# How the lab host's systemd records a run it could not put into its cgroup (Lab.lab_unit_fault).
LAB_CGROUP_FAULT = 'status=219/CGROUP'


def keep_logs(base, label):
    """Copy every *.log below base's project lab directories, the record of every SSH command the lab ran
    (control/ssh-commands.raw: each command line, its number and time) and each simulated host's journal
    (host-journal.log) to FAILED_LOGS/<label>-<time>; returns the copy."""
    import time
    dest = os.path.join(FAILED_LOGS, '%s-%s-%d' % (label, time.strftime('%Y%m%dT%H%M%S'), os.getpid()))
    project = os.path.join(base, 'project')
    for top in ('.lab', '.lab-fleet'):
        root = os.path.join(project, top)
        for dirpath, dirnames, filenames in os.walk(root):
            # not into the machines' own trees (container and host roots, the overlays' work directories)
            dirnames[:] = [d for d in dirnames if d not in ('ct', 'host-os', 'work', 'rootfs', 'host', 'artifacts')]
            for name in filenames:
                if name.endswith('.log') or name == 'ssh-commands.raw':
                    src = os.path.join(dirpath, name)
                    out = os.path.join(dest, os.path.relpath(src, project))
                    os.makedirs(os.path.dirname(out), exist_ok=True)
                    try:
                        shutil.copyfile(src, out)
                    except OSError:
                        pass
            # The simulated host's own journal (persistent, in its /var's upper layer): its systemd's account of
            # every unit it ran - why a unit failed is there and nowhere else.
            journal = os.path.join(dirpath, 'host', 'var', 'log', 'journal')
            if os.path.isdir(journal):
                out = os.path.join(dest, os.path.relpath(dirpath, project), 'host-journal.log')
                os.makedirs(os.path.dirname(out), exist_ok=True)
                with open(out, 'w') as f:
                    subprocess.run(['journalctl', '--directory=' + journal, '--no-pager', '-o', 'short-precise'],
                                   stdout=f, stderr=subprocess.STDOUT, timeout=60, check=False)
    return dest


def _stacks(lab):
    """The project copy's stacks this process created (write_stack); a Lab made with __new__
    (in_fleet, attach) or a FleetLab starts without the attribute."""
    return lab.__dict__.setdefault('_known_stacks', set())


def _labd_tails(lab, lines=25):
    """The end of each lab daemon's log (what the lab saw: a container's worker, a power task, pct's broker),
    for a failed command's message: a failure under load in CI is read from its log alone."""
    dirs = [l.dir for l in getattr(lab, 'labs', {}).values()] or [lab.dir]
    out = []
    for d in dirs:
        try:
            with open(os.path.join(d, 'labd.log'), errors='replace') as f:
                tail = f.read().splitlines()[-lines:]
        except OSError:
            continue
        out.append('--- %s (last %d lines)\n%s' % (os.path.join(d, 'labd.log'), len(tail), '\n'.join(tail)))
    return ('\n' + '\n'.join(out)) if out else ''


class Lab(object):
    """A running lab plus a project copy wired to it. `net` picks the loopback addresses."""

    def __init__(self, base, net, **spec_overrides):
        self.base = base
        self.project = os.path.join(base, 'project')
        self.dir = os.path.join(self.project, '.lab')
        make_project(base)
        with open(os.path.join(REPO, 'lab', 'spec', 'default.json')) as f:
            spec = json.load(f)
        spec.update(spec_overrides)
        spec['addresses'] = {'pve': '127.0.%d.2' % net, 'ssh': '127.0.%d.3' % net, 'container': '127.0.%d.4' % net}
        self.spec_path = os.path.join(base, 'spec.json')
        with open(self.spec_path, 'w') as f:
            json.dump(spec, f)
        self.spec = spec
        self.env = project_env(base, self.dir)
        self.info = None

    @classmethod
    def in_fleet(cls, fleet, name, spec):
        """One host of a FleetLab: its lab in <project>/.lab-fleet/<name>, the fleet's project and state."""
        self = cls.__new__(cls)
        self.base, self.project = fleet.base, fleet.project
        self.dir = os.path.join(self.project, '.lab-fleet', name)
        self.spec_path = os.path.join(fleet.base, '%s.spec.json' % name)
        with open(self.spec_path, 'w') as f:
            json.dump(spec, f)
        self.spec = spec
        self.env = fleet.env
        self.info = None
        return self

    @classmethod
    def attach(cls, base):
        """The Lab of a project copy made earlier under base (its lab running), for a debugging session."""
        self = cls.__new__(cls)
        self.base = base
        self.project = os.path.join(base, 'project')
        self.dir = os.path.join(self.project, '.lab')
        self.spec_path = os.path.join(base, 'spec.json')
        with open(self.spec_path) as f:
            self.spec = json.load(f)
        self.env = project_env(base, self.dir)
        with open(os.path.join(self.dir, 'lab.json')) as f:
            self.info = json.load(f)
        self.host = hostsim.Host(self.dir)
        return self

    # -- lifecycle

    def up(self):
        subprocess.run([sys.executable, '-m', 'lab.labctl', '--lab', self.dir, 'up', '--spec', self.spec_path],
                       cwd=REPO, check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(self.dir, 'lab.json')) as f:
            self.info = json.load(f)
        self.host = hostsim.Host(self.dir)
        return self

    def down(self):
        subprocess.run([sys.executable, '-m', 'lab.labctl', '--lab', self.dir, 'down'], cwd=REPO,
                       stdout=subprocess.DEVNULL)

    def stop_processes(self):
        """Stop fakepve, the host (its sshd) and the guests but keep the lab's files (keys, CA)."""
        import signal
        nspawn = self.machine().nspawn_pid()
        os.kill(self.info['pid'], signal.SIGTERM)
        self.wait_for(lambda: not _alive(self.info['pid']) and not (nspawn and _alive(nspawn)),
                      what='lab processes to stop')

    def machine(self):
        """The simulated host as a machine (lab/labhost.py): its systemd, its processes."""
        return LabHost(self.dir)

    # -- config

    def stack_config(self, sglang_startup=SGLANG_STARTUP):
        """Pulumi.lab.yaml's config, aimed at this lab's addresses. The lab's SGLang loads for
        `sglang_startup` seconds at every start (LAB_SGLANG_STARTUP in the unit's environment; its own
        default is 1 s, `make up`'s): a test that does not look at the load itself chooses a short one,
        a test that does sets its own (gpuhost:sglang.environment)."""
        with open(os.path.join(REPO, 'Pulumi.lab.yaml')) as f:
            doc = yaml.safe_load(f)
        cfg = copy.deepcopy(doc['config'])
        cfg['gpuhost:host']['address'] = self.spec['addresses']['ssh']
        cfg['gpuhost:host']['api']['address'] = self.spec['addresses']['pve']
        cfg['gpuhost:container']['ip'] = self.spec['addresses']['container'] + '/8'
        cfg['gpuhost:runtime']['python']['index']['url'] = self.index_url()
        if sglang_startup is not None:
            cfg['gpuhost:sglang'].setdefault('environment', {})['LAB_SGLANG_STARTUP'] = str(sglang_startup)
        return cfg

    def write_stack(self, stack, cfg):
        """Pulumi.<stack>.yaml with cfg, the stack created the first time (every run names its stack
        with --stack, so selecting it again would only cost a CLI start)."""
        with open(os.path.join(self.project, 'Pulumi.%s.yaml' % stack), 'w') as f:
            yaml.safe_dump({'config': cfg}, f, sort_keys=False)
        if stack not in _stacks(self):
            self.pulumi('stack', 'select', '--create', '--secrets-provider', 'passphrase', stack)
            _stacks(self).add(stack)

    def deploy(self, stack):
        """The lab's stack config written as `stack` and deployed; returns the config."""
        cfg = self.stack_config()
        self.write_stack(stack, cfg)
        self.pulumi('up', '--yes', '--skip-preview', stack=stack)
        return cfg

    # -- the CLI

    def pulumi(self, *args, check=True, stack=None, timeout=600, env=None, cwd=None, input=None):
        """Run the real CLI in the project copy (an `up` from a bare container installs everything SGLang
        needs: docs/operator-guide.md, "The first `up` on a bare host")."""
        argv = ['pulumi'] + list(args)
        if stack:
            argv += ['--stack', stack]
        res = subprocess.run(argv, cwd=cwd or self.project, env=dict(self.env, **(env or {})), capture_output=True,
                             text=True, timeout=timeout, input=input)
        if list(args[:2]) == ['stack', 'rm']:
            # Whichever stack went (even halfway, on failure), write_stack creates it again.
            _stacks(self).clear()
        # Whatever happened, the operator never sees Python frames (docs/operator-guide.md, "Faults": errors come
        # without them).
        for stream in (res.stdout, res.stderr):
            assert 'Traceback (most recent call last)' not in stream and '.py", line ' not in stream, \
                '%s printed Python frames:\n%s' % (' '.join(argv), stream[-4000:])
        if check and res.returncode != 0:
            # The errors are in the Diagnostics section, before the outputs that fill the end of stdout.
            diag = res.stdout[res.stdout.find('Diagnostics:'):res.stdout.find('Outputs:')] \
                if 'Diagnostics:' in res.stdout else ''
            raise AssertionError('%s failed (%d):\n%s\n...\n%s\n%s%s' % (' '.join(argv), res.returncode, diag[:6000],
                                                                         res.stdout[-3000:], res.stderr[-3000:],
                                                                         _labd_tails(self)))
        return res

    def preview_json(self, stack, *extra):
        res = self.pulumi('preview', '--json', *extra, stack=stack)
        return json.loads(res.stdout)

    def outputs(self, stack):
        return json.loads(self.pulumi('stack', 'output', '--json', '--show-secrets', stack=stack).stdout)

    def plaintext_secrets_in_state(self, stack):
        """Which of the lab's credentials appear in plain text in the stack's state."""
        state = self.pulumi('stack', 'export', stack=stack).stdout
        found = []
        if self.index_password() in state:
            found.append('index password')
        with open(self.info['pve']['password_file']) as f:
            if f.read().strip() in state:
                found.append('api password')
        with open(self.info['ssh']['key_file']) as f:
            if any(line in state for line in f.read().splitlines()[1:-1]):
                found.append('ssh private key')
        return found

    # -- the package index (lab/pyindex.py) and the locks for it

    def index_url(self):
        return 'http://%s:%d/simple' % (self.spec['addresses'].get('index', self.spec['addresses']['pve']),
                                        pyindex.PORT)

    def index_password(self):
        with open(os.path.join(self.dir, 'secrets', 'index-password')) as f:
            return f.read()

    def add_sglang(self, version):
        """The lab's simulated SGLang at `version` into the lab's index (built once per source hash);
        returns the wheel's sha256."""
        return pyindex.add(os.path.join(self.dir, 'runtime', 'index'), sglang_wheel.wheel(version))

    def write_lock(self, rel, sglang=None, pins=None, text=None):
        """A lock in the project (rel: its path there) for sglang==`sglang` and pip as the lab's index has them
        (pins: more {project: version}); text: the lock's text as given instead. Returns rel."""
        if text is None:
            versions = dict(pins or {}, sglang=sglang, pip=self.info['index']['pip_version'])
            text = pyindex.lock_text(os.path.join(self.dir, 'runtime', 'index'), versions)
        hostsim.write(os.path.join(self.project, rel), text)
        return rel

    def index_down(self, down=True):
        """The package index stops answering (connections closed unanswered), or answers again."""
        self.pve_set(index_down=down)

    def index_files(self, source='index', rate=None):
        """Where the index's files come from: 'index', 'redirect' (a 302 to the lab's CDN, another loopback host)
        or 'link' (the project pages link the CDN's URLs); rate: bytes a second per download (None: no limit)."""
        self.pve_set(index_files={'from': source, 'rate': rate})

    def cdn_requests(self):
        """Every request the CDN saw: [{'t', 'path', 'authorization' (whether it carried the header)}]."""
        try:
            with open(self.control('cdn-requests.log')) as f:
                return [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            return []

    def index_requests(self):
        """Every request the index saw: [{'t', 'path', 'status' (HTTP status, 401, or 'dropped')}]."""
        try:
            with open(self.control('index-requests.log')) as f:
                return [json.loads(line) for line in f if line.endswith('\n')]
        except FileNotFoundError:
            return []

    # -- observing the simulated host

    def ssh_sessions(self):
        """Commands the lab's sshd ran so far (sshd logs one line per session; every command is a
        forced command, lab/sshcmd.sh)."""
        path = os.path.join(self.dir, 'sshd.log')
        with open(path, errors='replace') as f:
            return sum(1 for line in f if 'Starting session: command' in line
                       or 'Starting session: forced-command' in line)

    # -- SSH: commands, drops

    def control(self, *parts):
        return os.path.join(self.dir, 'control', *parts)

    def ssh(self, command, stdin=None, timeout=30.0):
        """Run a command line over the lab's SSH (paramiko, the lab's key, the pinned host key).
        Returns SshResult(stdout, stderr, exit_code); exit_code is None when the connection ended
        without an exit status (a drop)."""
        import base64
        import paramiko
        from transport import remote
        s = self.info['ssh']
        keytype, b64 = s['host_key'].split()[:2]
        client = paramiko.SSHClient()
        client.get_host_keys().add('[%s]:%d' % (s['host'], s['port']), keytype,
                                   paramiko.PKey.from_type_string(keytype, base64.b64decode(b64)))
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.connect(s['host'], port=s['port'], username=s['user'], key_filename=s['key_file'],
                       look_for_keys=False, allow_agent=False, timeout=10)
        try:
            chan = client.get_transport().open_session(timeout=10)
            chan.settimeout(timeout)
            chan.exec_command(command)
            if stdin is not None:
                try:
                    chan.sendall(stdin.encode() if isinstance(stdin, str) else stdin)
                except (OSError, EOFError):
                    pass
            try:
                remote.send_eof(chan)   # not shutdown_write(): paramiko's race (transport/remote.py send_eof)
            except (OSError, EOFError):
                pass
            out, err = [], []
            while True:
                data = chan.recv(65536)
                if not data:
                    break
                out.append(data)
            while True:
                data = chan.recv_stderr(65536)
                if not data:
                    break
                err.append(data)
            # paramiko reports -1 when the channel closed without an exit-status message.
            code = chan.recv_exit_status()
            code = None if code == -1 else code
        finally:
            client.close()
        return SshResult(b''.join(out).decode('utf-8', 'replace'), b''.join(err).decode('utf-8', 'replace'), code)

    def ssh_script(self, script, *args, name='lab-script.sh', stdin=None, timeout=30.0):
        """Run a bash script the way the program sends its own: bash -c '<script>' name args..."""
        import shlex
        command = 'bash -c %s %s %s' % (shlex.quote(script), shlex.quote(name), shlex.join([str(a) for a in args]))
        return self.ssh(command, stdin=stdin, timeout=timeout)

    def ssh_commands(self):
        """How many SSH commands the lab ran so far (every session, since the lab was created)."""
        try:
            with open(self.control('ssh-count')) as f:
                return int(f.read().strip() or 0)
        except FileNotFoundError:
            return 0

    def ssh_log(self):
        """Every SSH command so far, oldest first: [{'n', 't', 'cmd' (for the program's `bash -c
        '<script>' name args` the name and arguments, else the command line; 80 characters), 'command'
        (the whole command line, None for a shell), 'drop' (None, 'before', 'after', 'during'), and
        for a drop after/during 'exit' (the command's exit code on the host) and for 'during'
        'stdin_sent'/'stdin_total'}] (lab/sshcmd.sh, lab/sshcmd.py)."""
        import sshcmd
        out = {}
        try:
            with open(self.control('ssh-commands.raw'), 'rb') as f:
                fields = f.read().split(b'\0')
        except FileNotFoundError:
            fields = []
        for i in range(0, len(fields) - 4, 5):
            n, t, drop, kind, command = (x.decode('utf-8', 'surrogateescape') for x in fields[i:i + 5])
            command = command if kind == 'command' else None
            out[int(n)] = {'n': int(n), 't': float(t), 'cmd': sshcmd.summary(command), 'command': command,
                           'drop': drop or None}
        try:
            with open(self.control('ssh-results.log')) as f:
                for line in f:
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        continue
                    out.setdefault(rec['n'], {}).update(rec)
        except FileNotFoundError:
            pass
        return [out[n] for n in sorted(out)]

    def drop_ssh_at(self, n=1, mode='before', stdin_bytes=None, match=None):
        """Drop the SSH connection at the n-th SSH command from now (1: the next one), once:
        'before' it runs (nothing happens on the host), 'after' it ran to completion (its exit status
        never reaches the client; its output does), or 'during' it (it gets the first stdin_bytes of
        its stdin, default half, then its stdin ends and its output goes nowhere). With match (a script
        name, e.g. 'put_file.sh', or several: 'put_file.sh|ct_unit.sh') n counts only the program's scripts
        of those names. Returns the absolute command number, or None with match (ssh_log()'s entry with a
        'drop' then names it)."""
        if mode not in ('before', 'after', 'during'):
            raise ValueError('mode: before, after or during')
        if n < 1:
            raise ValueError('n counts from 1 (the next command)')
        if match is not None:
            if not re.match(r'^[A-Za-z0-9_.-]+(\|[A-Za-z0-9_.-]+)*$', match):
                raise ValueError('match: a script name, or several separated by |')
            try:
                os.unlink(self.control('ssh-match-count'))
            except FileNotFoundError:
                pass
            _write_json(self.control('ssh-drop.json'), {'at': n, 'mode': mode, 'stdin_bytes': stdin_bytes,
                                                        'match': match})
            return None
        at = self.ssh_commands() + n
        _write_json(self.control('ssh-drop.json'), {'at': at, 'mode': mode, 'stdin_bytes': stdin_bytes})
        return at

    def ssh_drop_pending(self):
        """True while an armed drop has not happened yet."""
        return os.path.exists(self.control('ssh-drop.json'))

    def kill_ssh_sessions(self):
        """SIGKILL every per-connection sshd process now (the listener stays): every open SSH
        connection drops. Returns how many processes were killed."""
        return self.machine().kill_ssh_sessions()

    def on_host(self, script, stdin=None, timeout=30.0):
        """Run a shell script as root *inside* the simulated host (its namespaces, root and a clean
        environment, via nsenter, as `machinectl shell` would), not over SSH: not counted, never dropped.
        For out-of-band changes to what is the host's own (/dev, /var, /etc outside the bind-mounted pve,
        kernel, default, modprobe.d, driverctl.d: layers of an overlay there, which must not be changed
        from outside) and for its systemd."""
        res = subprocess.run(self.machine().enter_argv(['/bin/bash', '-c', script]),
                             input=stdin.encode() if isinstance(stdin, str) else stdin, capture_output=True,
                             timeout=timeout)
        return SshResult(res.stdout.decode('utf-8', 'replace'), res.stderr.decode('utf-8', 'replace'), res.returncode)

    # -- the host's systemd (real: lab/labhost.py)

    def host_unit_runs(self, unit):
        """Every run of a (oneshot) service of the host's systemd, from PID 1's own record in the host's
        journal, oldest first: [{'start' (its "Starting ..."), 'end' (its "Finished" or "Failed"; None while
        it runs), 'ok' (None while it runs)}] - whoever started it: its timer, `systemctl start`."""
        res = self.on_host('journalctl --sync 2>/dev/null; journalctl --no-pager -o json '
                           '--output-fields=MESSAGE_ID,__REALTIME_TIMESTAMP UNIT=%s _PID=1' % unit)
        runs = []
        for line in res.stdout.splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            kind = JOURNAL_RUNS.get(rec.get('MESSAGE_ID'))
            t = int(rec['__REALTIME_TIMESTAMP']) / 1e6
            if kind == 'starting':
                runs.append({'start': t, 'end': None, 'ok': None})
            elif kind and runs and runs[-1]['end'] is None:
                runs[-1].update(end=t, ok=kind == 'finished')
        return runs

    def lab_unit_fault(self, unit, start, end):
        """A failed run of the host's `unit` between start and end (times) that is the lab's own fault: its journal
        lines, reported as a warning. The lab host's nested systemd, on this machine's cgroup v1 hierarchy, sometimes
        cannot attach a new run's process to the unit's cgroup it has just removed ("Failed to attach to cgroup
        ...: No such file or directory", status=219/CGROUP - before the unit's program runs at all; the run before
        logs "Failed to kill control group ..., ignoring: Input/output error"). Any other failure is the program's:
        the test fails with the lines."""
        import shlex
        import warnings
        lines = self.on_host("journalctl --no-pager -o short-precise -u %s --since '@%.3f' --until '@%.3f'" % (
            shlex.quote(unit), start - 1, end + 1)).stdout
        assert LAB_CGROUP_FAULT in lines, '%s failed:\n%s' % (unit, lines)
        warnings.warn('%s: a run failed with the lab host\'s cgroup v1 fault (%s):\n%s' % (unit, LAB_CGROUP_FAULT, lines))
        return lines

    def start_host_unit(self, unit):
        """systemctl start of a oneshot unit of the host's systemd, as its timer would start it; a run that failed
        with the lab's own cgroup v1 fault (lab_unit_fault: a warning with its journal lines) is started once more.
        Any other failure fails the test with the unit's journal."""
        for attempt in range(2):
            before = time.time()
            started = self.ssh('systemctl start %s' % unit)
            if started.exit_code == 0:
                return
            assert attempt == 0, started.stderr
            self.lab_unit_fault(unit, before, time.time())

    def wait_host_run(self, unit, after, timeout):
        """The first run of the host's service that started after `after` (a time) and has ended."""
        deadline = time.time() + timeout
        runs = []
        while time.time() < deadline:
            runs = self.host_unit_runs(unit)
            done = [r for r in runs if r['start'] > after and r['end'] is not None]
            if done:
                return done[0]
            time.sleep(0.2)
        raise AssertionError('%s: no run started after %.1f and ended within %d s (runs: %r)' % (
            unit, after, timeout, runs[-3:]))

    def host_unit(self, unit, *props):
        """systemctl show's properties of a unit of the host's systemd: {name: value}."""
        res = self.on_host('systemctl show %s %s' % (' '.join('-p ' + p for p in props), unit))
        assert res.exit_code == 0, res
        return dict(line.split('=', 1) for line in res.stdout.splitlines() if '=' in line)

    # -- faults of the host's tools and the containers' systemctl

    def fail_tool(self, name, message=''):
        """Make a fake host tool fail (exit 1, message on stderr): name is the tool (driverctl,
        proxmox-boot-tool, update-grub, update-initramfs, pct, reboot) or tool.subcommand
        (proxmox-boot-tool.refresh, pct.exec)."""
        hostsim.write(self.host.path('faults', name), message)

    def hang_tool(self, name):
        """Make a fake host tool (or tool.subcommand) hang: no output, no exit, until killed or until
        the SSH connection it runs under is gone."""
        hostsim.write(self.host.path('faults', name), 'hang\n')

    def fail_systemctl(self, cmd, message=None, vmid=200):
        """Make `systemctl <cmd>` fail inside container vmid: a wrapper the test puts first on the PATH
        `pct exec` gives (/usr/local/sbin/systemctl), calling the real systemctl for everything else.
        Without a message, start/restart/try-restart fail the way systemd fails them - the start job's
        control process exits 1 (a runtime drop-in present only while the wrapper runs), so systemd
        prints its own "Job for <unit> failed ..." and leaves the unit failed, not running - and other
        commands print systemd's message for an I/O error; with one ('{unit}' replaced by the unit
        name), that message on stderr and exit 1; 'hang' hangs instead."""
        root = self.ct_root(vmid)
        hostsim.write(os.path.join(root, 'etc', 'lab-faults', 'systemctl.' + cmd), message or '')
        wrapper = os.path.join(root, 'usr', 'local', 'sbin', 'systemctl')
        hostsim.write(wrapper, SYSTEMCTL_FAULT)
        os.chmod(wrapper, 0o755)

    def clear_faults(self):
        """Remove every injected tool and systemctl fault and an armed SSH drop (not fakepve's:
        pve_reset())."""
        ctdir = os.path.join(self.dir, 'ct')
        roots = [os.path.join(ctdir, v, 'rootfs') for v in (os.listdir(ctdir) if os.path.isdir(ctdir) else [])]
        for d in [self.host.path('faults')] + [os.path.join(r, 'etc', 'lab-faults') for r in roots]:
            if os.path.isdir(d):
                for name in os.listdir(d):
                    os.unlink(os.path.join(d, name))
        for r in roots:
            wrapper = os.path.join(r, 'usr', 'local', 'sbin', 'systemctl')
            if os.path.exists(wrapper):
                os.unlink(wrapper)
        if os.path.exists(self.control('ssh-drop.json')):
            os.unlink(self.control('ssh-drop.json'))

    # -- fakepve's scenarios

    def pve_set(self, timeout=10.0, **ops):
        """Apply fakepve scenarios in the lab daemon, in the order given, and wait until they are in
        force. Operations (lab/labctl.py Lab.pve_op): quorate=False, node_online=('pve-lab', False),
        lock=(200, 'backup'), unlock=200, hold_config_lock=(200, secs|None), release_config_lock=200,
        revoke_tickets=True, expire_tickets=True, ticket_ttl=secs, network={'drop_rate': 0.5, 'seed': 1,
        'hang_rate', 'hang_secs', 'latency', 'jitter', 'node_latency'}, time_scale=1.0, lock_wait=secs,
        ct_secs={'create': 5, ...}, guest_secs=(200, {'start': 5, 'stop': 1, 'shutdown': 2}),
        start_error=(200, 'message'), fail=[fail() kwargs], clear_failures=True, reset=True."""
        import uuid
        rid = uuid.uuid4().hex
        ack = self.control('pve-set.ack.json')
        _write_json(self.control('pve-set.json'), {'id': rid, 'ops': [[k, v] for k, v in ops.items()]})
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                with open(ack) as f:
                    done = json.load(f)
            except (FileNotFoundError, ValueError):
                done = None
            if done and done.get('id') == rid:
                if done.get('error'):
                    raise ValueError('pve_set(%s): %s' % (', '.join(ops), done['error']))
                return
            time.sleep(0.05)
        raise AssertionError('the lab daemon did not apply pve_set(%s) within %s s' % (', '.join(ops), timeout))

    def pve_reset(self):
        """fakepve back to healthy: quorum, nodes online, no network trouble, no injected failures, tasks
        instant, locks set through pve_set released (tickets revoked stay revoked: log in again)."""
        self.pve_set(reset=True)

    def pve_requests(self):
        """Every API request that reached fakepve so far, oldest first: [{'t', 'method', 'path' (with the
        query), 'status' (HTTP status, or 'dropped': the network scenario reset the connection), 'agent' (User-Agent)}]
        (lab/labctl.py Lab.request_log)."""
        try:
            with open(self.control('pve-requests.log')) as f:
                return [json.loads(line) for line in f if line.endswith('\n')]
        except FileNotFoundError:
            return []

    # -- the host's reboot

    def reboots(self):
        """The reboots the lab daemon carried out: [{'requested', 'down', 'up', 'secs', 'old_boot_id',
        'boot_id', 'started' (vmids), 'start_failed' ({vmid: message})}], oldest first."""
        try:
            with open(self.control('reboots.log')) as f:
                return [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            return []

    def wait_reboots(self, count, timeout=60.0):
        """Wait until the lab daemon has carried out `count` reboots in all (it logs one when the host
        is back: sshd accepting, onboot guests started); returns the last."""
        self.wait_for(lambda: len(self.reboots()) >= count, timeout=timeout, what='%d reboot(s) of the host' % count)
        return self.reboots()[count - 1]

    def boot_id(self):
        return hostsim.read(self.host.path('proc/boot_id')).strip()

    # -- guests without the program (for the lab's own tests)

    def create_ct(self, vmid=200, start=True, onboot=0, **config):
        """A container made through the API the way the program makes one (template, root@pam)."""
        node = self.node()
        params = dict(vmid=vmid, ostemplate=self.info['template'], hostname='ct%d' % vmid, memory=1024,
                      rootfs='local-lvm:8', onboot=onboot, unprivileged=0)
        params.update(config)
        node.lxc.post(**params)
        if start:
            node.lxc(vmid).status.start.post()
            self.wait_for(lambda: os.path.isdir(os.path.join(self.ct_root(vmid), 'etc')) and
                          _read(os.path.join(self.dir, 'ct', str(vmid), 'status')).strip() == 'running',
                          what='container %d running in the lab' % vmid)
            # Running is not yet booted: systemctl right after it can fail with "Failed to connect to bus" (a CI
            # run's test_lab_faults fixture did, on a loaded machine) - the tests that make a container go on
            # from a container whose systemd answers.
            self.wait_for(lambda: self.ct_exec(['systemctl', 'is-system-running'], vmid=vmid, check=False).stdout.strip()
                          not in ('', 'offline'), timeout=60, what="container %d's systemd answering" % vmid)
        else:
            self.wait_for(lambda: os.path.exists(self.host.path('etc/pve/lxc/%d.conf' % vmid)),
                          what='/etc/pve/lxc/%d.conf' % vmid)
        return node.lxc(vmid)

    def host_digest(self):
        """A hash of everything the simulated host holds (files, links, device bindings)."""
        return tree_digest(os.path.join(self.dir, 'host'), skip=HOST_SKIP, dirs=False)

    def host_digest_beside_upgrade(self):
        """host_digest() without what this release rewrites, by design, on a host an earlier release deployed
        (UPGRADE_REWRITES): what "the upgrade changed nothing else" means in the upgrade tests."""
        return tree_digest(os.path.join(self.dir, 'host'), skip=HOST_SKIP + UPGRADE_REWRITES, dirs=False)

    def host_files(self):
        """{path: sha256} of what host_digest() covers: which entries a changed digest changed."""
        return {rel: hashlib.sha256(data).hexdigest() for rel, data in
                tree_entries(os.path.join(self.dir, 'host'), skip=HOST_SKIP, dirs=False)}

    def api(self):
        import proxmoxer
        p = self.info['pve']
        with open(p['password_file']) as f:
            password = f.read()
        return proxmoxer.ProxmoxAPI(p['host'], port=p['port'], user='root@pam', password=password,
                                    verify_ssl=p['cafile'])

    def node(self):
        return self.api().nodes(self.info['node'])

    def ct_root(self, vmid=200):
        return os.path.join(self.dir, 'ct', str(vmid), 'rootfs')

    def ct(self, vmid=200):
        return Container(os.path.join(self.dir, 'ct', str(vmid)))

    def ct_exec(self, argv, vmid=200, check=True, timeout=60, stdin=None):
        """Run argv inside the running container (as `pct exec` does, but from the test: not over SSH,
        not counted, never dropped). Returns the CompletedProcess (text)."""
        res = subprocess.run(self.ct(vmid).enter_argv(argv), capture_output=True, text=True, timeout=timeout,
                             input=stdin)
        if check and res.returncode != 0:
            raise AssertionError('%s in container %d failed (%d): %s' % (argv, vmid, res.returncode, res.stderr))
        return res

    def unit_events(self, unit='sglang-qwen.service', vmid=200):
        """systemd's own record of the unit, from the container's journal: [(time, 'started'|'stopped')],
        oldest first - every "Started <unit>" and "Stopped <unit>" PID 1 logged since the container was
        created (the journal is persistent: it survives reboots of the container)."""
        argv = ['journalctl', '--no-pager', '-o', 'json', '--output-fields=MESSAGE_ID,__REALTIME_TIMESTAMP',
                'UNIT=' + unit, '_PID=1']
        if self.ct(vmid).leader():
            self.ct_exec(['journalctl', '--sync'], vmid=vmid, check=False)
            out = self.ct_exec(argv, vmid=vmid, check=False).stdout
        else:
            journal = os.path.join(self.ct_root(vmid), 'var', 'log', 'journal')
            if not os.path.isdir(journal):
                return []
            out = subprocess.run(argv + ['--directory=' + journal], capture_output=True, text=True).stdout
        events = []
        for line in out.splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            kind = JOURNAL_EVENTS.get(rec.get('MESSAGE_ID'))
            if kind:
                events.append((int(rec['__REALTIME_TIMESTAMP']) / 1e6, kind))
        return sorted(events)

    def unit_starts(self, unit='sglang-qwen.service', vmid=200):
        """How often systemd started the unit in the container (its journal)."""
        return sum(1 for _, kind in self.unit_events(unit, vmid) if kind == 'started')

    def unit_start_times(self, unit='sglang-qwen.service', vmid=200):
        return [t for t, kind in self.unit_events(unit, vmid) if kind == 'started']

    def unit_pid(self, unit='sglang-qwen.service', vmid=200):
        """The unit's main process, as systemd reports it (in the container's PID namespace)."""
        return int(self.ct_exec(['systemctl', 'show', '-p', 'MainPID', '--value', unit], vmid=vmid).stdout)

    def unit_proc(self, what, unit='sglang-qwen.service', vmid=200):
        """/proc/<main pid>/<what> (environ, cmdline) of the unit's main process, read inside the container:
        its NUL-separated items."""
        pid = self.unit_pid(unit, vmid)
        res = subprocess.run(self.ct(vmid).enter_argv(['cat', '/proc/%d/%s' % (pid, what)]), capture_output=True,
                             check=True)
        return [i.decode() for i in res.stdout.split(b'\0') if i]

    def down_intervals(self, unit='sglang-qwen.service', vmid=200, startup=1.0):
        """[(stopped, serving again)] of the unit, from systemd's stop and start records; serving again =
        a start plus the simulated SGLang's load time (LAB_SGLANG_STARTUP, 1 s)."""
        events = self.unit_events(unit, vmid)
        starts = [t for t, kind in events if kind == 'started']
        out = []
        for t in (t for t, kind in events if kind == 'stopped'):
            later = [s for s in starts if s >= t]
            out.append((t, later[0] + startup if later else float('inf')))
        return out

    def wait_for(self, fn, timeout=10.0, what='condition'):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if fn():
                return
            time.sleep(0.1)
        raise AssertionError('timed out waiting for ' + what)


class FleetLab(object):
    """Several simulated hosts (lab/fleet.py's topologies, each a Lab on its own loopback /24) and one
    project copy whose stacks list them in gpuhost:hosts."""

    def __init__(self, base, nets):
        sys.path.insert(0, REPO)
        from lab import fleet as fleet_mod
        self.fleet_mod = fleet_mod
        self.base = base
        self.project = make_project(base)
        self.env = project_env(base, os.path.join(self.project, '.lab-fleet'))
        self.labs = {}
        self.nets = list(nets)

    def add(self, i):
        """Host i (gpuNN, topology lab/fleet.py's i-th) on the i-th net given, started."""
        name = self.fleet_mod.name_of(i)
        net = self.nets[i - 1]
        spec = self.fleet_mod.host_spec(i, {'pve': '127.0.%d.2' % net, 'ssh': '127.0.%d.3' % net,
                                            'container': '127.0.%d.4' % net})
        lab = Lab.in_fleet(self, name, spec).up()
        self.labs[name] = lab
        return lab

    def entry(self, name):
        """The host's gpuhost:hosts entry (lab/fleet.py host_entry), to edit before writing a stack."""
        i = int(name[3:])
        return self.fleet_mod.host_entry(i, self.labs[name].spec, os.path.relpath(self.labs[name].dir, self.project))

    def stack_config(self, names=None, max_unavailable=1, entries=None):
        entries = entries if entries is not None else [self.entry(n) for n in (names or sorted(self.labs))]
        return self.fleet_mod.stack_config(entries, max_unavailable)

    # The CLI, as for one lab: the same project-copy methods (every run checked for Python frames).
    write_stack = Lab.write_stack
    pulumi = Lab.pulumi
    preview_json = Lab.preview_json
    outputs = Lab.outputs

    def down(self):
        for lab in self.labs.values():
            lab.down()


def max_overlap(intervals) -> int:
    """The most intervals open at one moment ([(start, end)], from several hosts)."""
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals], key=lambda e: (e[0], e[1]))
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


# What host_digest() leaves out: logs, the host's changing state (/var), device nodes.
HOST_SKIP = ('log', 'var', 'dev')
# The collector's script and config (/usr/local/sbin/gpuhost-collector, /etc/gpuhost/collector.json): the first
# change of the collector's script since release 0.1.0 (issue 59: the NVIDIA driver's metrics, CHANGELOG) rewrites
# them once at the next `up` of a stack any earlier release deployed - the one change an upgrade makes on a host.
UPGRADE_REWRITES = ('sbin/gpuhost-collector', 'etc/gpuhost/collector.json')


def tree_entries(root, skip=(), dirs=True):
    """(relative path, its bytes) for every file, link and (dirs) directory under root, sorted: a file's content, a
    link's target (symlinked directories are not followed: sysfs-style links form cycles, as in real sysfs);
    paths starting with an entry of skip are left out."""
    paths = []
    for dirpath, dirnames, filenames in os.walk(root):
        links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        dirnames[:] = [d for d in dirnames if d not in links]
        paths += [os.path.join(dirpath, n) for n in filenames + links + (dirnames if dirs else [])]
    for path in sorted(set(paths)):
        rel = os.path.relpath(path, root)
        if skip and rel.startswith(tuple(skip)):
            continue
        if os.path.islink(path):
            yield rel, b'->' + os.readlink(path).encode()
        elif os.path.isfile(path):
            with open(path, 'rb') as f:
                yield rel, f.read()
        else:
            yield rel, b''


def tree_digest(root, skip=(), dirs=True):
    """A hash of tree_entries(): what "untouched" means in a test."""
    h = hashlib.sha256()
    for rel, data in tree_entries(root, skip, dirs):
        h.update(rel.encode() + b'\0')
        h.update(data)
    return h.hexdigest()
