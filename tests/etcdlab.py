"""A real etcd for the fleet lock's tests (Debian's etcd-server): one member on loopback, its data in a directory of
the test's, on ports chosen once (a stop and a start come back on the same URL, with the same keys)."""

import os
import shutil
import socket
import subprocess
import time
import urllib.request

ETCD = shutil.which('etcd')
ETCDCTL = shutil.which('etcdctl')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


class Etcd:
    def __init__(self, data_dir):
        self.data_dir = str(data_dir)
        self.client, self.peer = free_port(), free_port()
        self.url = 'http://127.0.0.1:%d' % self.client
        self.proc = None

    def start(self) -> 'Etcd':
        peer = 'http://127.0.0.1:%d' % self.peer
        self.proc = subprocess.Popen(
            [ETCD, '--name', 'lock', '--data-dir', self.data_dir, '--listen-client-urls', self.url,
             '--advertise-client-urls', self.url, '--listen-peer-urls', peer, '--initial-advertise-peer-urls', peer,
             '--initial-cluster', 'lock=' + peer],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while True:
            try:
                urllib.request.urlopen(self.url + '/health', timeout=1).read()
                return self
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError('etcd did not start on %s' % self.url)
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def ctl(self, *args, user=None) -> str:
        argv = [ETCDCTL, '--endpoints', self.url] + (['--user', user] if user else []) + list(args)
        return subprocess.run(argv, env=dict(os.environ, ETCDCTL_API='3'), check=True, capture_output=True,
                              text=True).stdout

    def enable_auth(self, user: str, password: str, root_password: str = 'root-pw') -> None:
        """etcd auth on: root (etcd's rule: a root user with the root role first) and `user`, allowed read and write
        under /gpuhost/fleetlock/ only."""
        for args in (['user', 'add', 'root:' + root_password], ['user', 'grant-role', 'root', 'root'],
                     ['user', 'add', '%s:%s' % (user, password)], ['role', 'add', user],
                     ['role', 'grant-permission', user, '--prefix=true', 'readwrite', '/gpuhost/fleetlock/'],
                     ['user', 'grant-role', user, user], ['auth', 'enable']):
            self.ctl(*args)
