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


def make_pki(where) -> dict:
    """A CA, a server certificate for 127.0.0.1 and a client certificate it signed (openssl): {name: path}."""
    where = str(where)
    os.makedirs(where, exist_ok=True)
    out = {k: os.path.join(where, k + '.pem') for k in ('ca', 'ca-key', 'server', 'server-key', 'client', 'client-key')}

    def run(*argv):
        subprocess.run(['openssl'] + list(argv), check=True, capture_output=True)
    run('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '2', '-subj', '/CN=gpuhost-test-ca',
        '-keyout', out['ca-key'], '-out', out['ca'])
    # The server's certificate serves as a client too: etcd's JSON gateway calls its own gRPC port with it (a server
    # certificate without clientAuth: every gateway call fails with HTTP 503, "broken pipe").
    for name, ext in (('server', 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth'),
                      ('client', 'extendedKeyUsage=clientAuth')):
        csr = os.path.join(where, name + '.csr')
        extfile = os.path.join(where, name + '.ext')
        with open(extfile, 'w') as f:
            f.write(ext + '\n')
        run('req', '-newkey', 'rsa:2048', '-nodes', '-subj', '/CN=' + name, '-keyout', out[name + '-key'], '-out', csr)
        run('x509', '-req', '-in', csr, '-CA', out['ca'], '-CAkey', out['ca-key'], '-CAcreateserial', '-days', '2',
            '-extfile', extfile, '-out', out[name])
    return out


class Etcd:
    def __init__(self, data_dir, pki=None):
        """pki (make_pki()): https, client certificates required."""
        self.data_dir = str(data_dir)
        self.pki = pki
        self.client, self.peer = free_port(), free_port()
        self.url = '%s://127.0.0.1:%d' % ('https' if pki else 'http', self.client)
        self.proc = None

    def start(self) -> 'Etcd':
        import ssl
        peer = 'http://127.0.0.1:%d' % self.peer
        tls = ['--cert-file', self.pki['server'], '--key-file', self.pki['server-key'], '--client-cert-auth',
               '--trusted-ca-file', self.pki['ca']] if self.pki else []
        self.proc = subprocess.Popen(
            [ETCD, '--name', 'lock', '--data-dir', self.data_dir, '--listen-client-urls', self.url,
             '--advertise-client-urls', self.url, '--listen-peer-urls', peer, '--initial-advertise-peer-urls', peer,
             '--initial-cluster', 'lock=' + peer] + tls,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ctx = None
        if self.pki:
            ctx = ssl.create_default_context(cafile=self.pki['ca'])
            ctx.load_cert_chain(self.pki['client'], self.pki['client-key'])
        deadline = time.monotonic() + 15
        while True:
            try:
                urllib.request.urlopen(self.url + '/health', timeout=1, context=ctx).read()
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
