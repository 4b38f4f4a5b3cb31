"""Helpers for the integration tests: a lab of their own (addresses apart from `make lab`'s), a copy
of the project pointing at it, and the real Pulumi CLI run against a file backend in that copy."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, 'lab'))
import hostsim  # noqa: E402

PASSPHRASE = 'gpuhost-itest'
PROJECT_FILES = ('Pulumi.yaml', '__main__.py', 'config.py', 'components', 'templates')


def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


class Lab(object):
    """A running lab plus a project copy wired to it. `net` picks the loopback addresses."""

    def __init__(self, base, net, **spec_overrides):
        self.base = base
        self.project = os.path.join(base, 'project')
        self.dir = os.path.join(self.project, '.lab')
        os.makedirs(self.project)
        for name in PROJECT_FILES:
            src = os.path.join(REPO, name)
            dst = os.path.join(self.project, name)
            (shutil.copytree if os.path.isdir(src) else shutil.copyfile)(src, dst)
        os.symlink(os.path.join(REPO, '.venv'), os.path.join(self.project, '.venv'))
        with open(os.path.join(REPO, 'lab', 'spec', 'default.json')) as f:
            spec = json.load(f)
        spec.update(spec_overrides)
        spec['addresses'] = {'pve': '127.0.%d.2' % net, 'ssh': '127.0.%d.3' % net, 'container': '127.0.%d.4' % net}
        self.spec_path = os.path.join(base, 'spec.json')
        with open(self.spec_path, 'w') as f:
            json.dump(spec, f)
        self.spec = spec
        self.env = dict(os.environ, PULUMI_BACKEND_URL='file://' + os.path.join(base, 'state'),
                        PULUMI_HOME=os.path.join(base, 'pulumi-home'), PULUMI_CONFIG_PASSPHRASE=PASSPHRASE,
                        PULUMI_SKIP_UPDATE_CHECK='true', PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION='true',
                        GPUHOST_LAB=self.dir)
        self.env.pop('PULUMI_CONFIG_PASSPHRASE_FILE', None)
        os.makedirs(os.path.join(base, 'state'))
        # pulumi-command's provider plugin, from the binary tools/bootstrap.sh cached (no download).
        res = subprocess.run([os.path.join(REPO, 'tools', 'install-command-plugin.sh'), self.env['PULUMI_HOME']],
                             env=self.env, capture_output=True, text=True)
        assert res.returncode == 0, 'install-command-plugin.sh failed:\n' + res.stderr
        self.info = None

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
        """Stop fakepve, sshd and the guests' services but keep the lab's files (keys, CA)."""
        import signal
        # sshd removes its pid file when it stops: read it before stopping the lab.
        with open(os.path.join(self.dir, 'ssh', 'sshd.pid')) as f:
            sshd = int(f.read().strip())
        os.kill(self.info['pid'], signal.SIGTERM)
        self.wait_for(lambda: not _alive(self.info['pid']) and not _alive(sshd), what='lab processes to stop')

    # -- config

    def stack_config(self):
        """Pulumi.lab.yaml's config, aimed at this lab's addresses."""
        with open(os.path.join(REPO, 'Pulumi.lab.yaml')) as f:
            doc = yaml.safe_load(f)
        cfg = copy.deepcopy(doc['config'])
        cfg['gpuhost:host']['address'] = self.spec['addresses']['ssh']
        cfg['gpuhost:host']['api']['address'] = self.spec['addresses']['pve']
        cfg['gpuhost:container']['ip'] = self.spec['addresses']['container'] + '/8'
        return cfg

    def write_stack(self, stack, cfg):
        with open(os.path.join(self.project, 'Pulumi.%s.yaml' % stack), 'w') as f:
            yaml.safe_dump({'config': cfg}, f, sort_keys=False)
        self.pulumi('stack', 'select', '--create', '--secrets-provider', 'passphrase', stack)

    # -- the CLI

    def pulumi(self, *args, check=True, stack=None, timeout=600, env=None):
        argv = ['pulumi'] + list(args)
        if stack:
            argv += ['--stack', stack]
        res = subprocess.run(argv, cwd=self.project, env=dict(self.env, **(env or {})), capture_output=True, text=True,
                             timeout=timeout)
        # Whatever happened, the operator never sees Python frames (README: errors come without them).
        for stream in (res.stdout, res.stderr):
            assert 'Traceback (most recent call last)' not in stream and '.py", line ' not in stream, \
                '%s printed Python frames:\n%s' % (' '.join(argv), stream[-4000:])
        if check and res.returncode != 0:
            raise AssertionError('%s failed (%d):\n%s\n%s' % (' '.join(argv), res.returncode, res.stdout[-6000:],
                                                              res.stderr[-3000:]))
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
        with open(self.info['pve']['password_file']) as f:
            if f.read().strip() in state:
                found.append('api password')
        with open(self.info['ssh']['key_file']) as f:
            if any(line in state for line in f.read().splitlines()[1:-1]):
                found.append('ssh private key')
        return found

    # -- observing the simulated host

    def ssh_sessions(self):
        """Commands the lab's sshd ran so far (sshd logs one line per session)."""
        path = os.path.join(self.dir, 'sshd.log')
        with open(path, errors='replace') as f:
            return sum(1 for line in f if 'Starting session: command' in line)

    def host_digest(self):
        """A hash of everything the simulated host holds (files, links, device bindings)."""
        h = hashlib.sha256()
        root = os.path.join(self.dir, 'host')
        paths = []
        # os.walk does not follow the sysfs-style symlinks (they form cycles, as in real sysfs).
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
            paths += [os.path.join(dirpath, n) for n in filenames + [d for d in os.listdir(dirpath)
                                                                    if os.path.islink(os.path.join(dirpath, d))]]
        for path in sorted(set(paths)):
            rel = os.path.relpath(path, root)
            if rel.startswith(('log', 'var', 'dev')):
                continue
            h.update(rel.encode())
            if os.path.islink(path):
                h.update(b'->' + os.readlink(path).encode())
            elif os.path.isfile(path):
                with open(path, 'rb') as f:
                    h.update(f.read())
        return h.hexdigest()

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

    def unit_starts(self, unit='sglang-qwen.service', vmid=200):
        path = os.path.join(self.ct_root(vmid), 'run', 'lab-systemd', unit + '.starts')
        if not os.path.exists(path):
            return 0
        with open(path) as f:
            return sum(1 for _ in f)

    def wait_for(self, fn, timeout=10.0, what='condition'):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if fn():
                return
            time.sleep(0.1)
        raise AssertionError('timed out waiting for ' + what)
