"""Remote commands over SSH with a pinned host key, and the parsers for what they print.

Why not pulumi-command's remote.Command: its provider binary is not on PyPI, and the Go module that
builds it (github.com/pulumi/pulumi-command/provider) is refused by the Go module proxy our machines
reach (see README, "Why no pulumi-command"). Our dynamic resources call `run()` instead, with the
same contract remote.Command has - scripts from files, every value a quoted positional argument,
content on stdin, host key pinned - plus what it lacks: a real read() for `pulumi refresh`.

Every script in components/scripts starts with `set -euo pipefail` and is sent as
`bash -c <script> <name> <args...>`; file content travels on stdin, never on the command line.
Nothing secret is ever part of a command, so error messages (which quote stderr) carry none.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import os
import shlex
import socket
import time
from typing import Optional, Sequence

from components.state import OperatorError

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'scripts')


class RemoteError(OperatorError):
    """A remote step failed. The message names the host, the step, the exit code and stderr's tail."""


class HostKeyMismatch(RemoteError):
    pass


@dataclasses.dataclass(frozen=True)
class Target:
    host: str
    port: int
    user: str
    private_key: str = dataclasses.field(repr=False)
    host_key: str
    timeout: float = 10.0

    @classmethod
    def from_inputs(cls, conn: dict) -> 'Target':
        return cls(host=conn['host'], port=int(conn['port']), user=conn['user'], private_key=conn['private_key'],
                   host_key=conn['host_key'], timeout=float(conn.get('timeout', 10.0)))

    @property
    def name(self):
        return '%s@%s:%d' % (self.user, self.host, self.port)


@dataclasses.dataclass
class Result:
    stdout: str
    stderr: str
    exit_code: int


def _pkey(text: str):
    import paramiko
    for cls in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        try:
            return cls.from_private_key(io.StringIO(text))
        except (paramiko.SSHException, ValueError):
            continue
    # Never echo the key: say what it is not.
    raise RemoteError('gpuhost:host.ssh.private_key: not an unencrypted ed25519, ECDSA or RSA private key')


def connect(target: Target, attempts: int = 3):
    """An SSH client that accepts only the pinned host key."""
    import paramiko
    keytype, b64 = target.host_key.split()[:2]
    pinned = paramiko.PKey.from_type_string(keytype, base64.b64decode(b64))
    client = paramiko.SSHClient()
    entry = target.host if target.port == 22 else '[%s]:%d' % (target.host, target.port)
    client.get_host_keys().add(entry, keytype, pinned)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    last = None
    for attempt in range(attempts):
        try:
            client.connect(target.host, port=target.port, username=target.user, pkey=_pkey(target.private_key),
                           look_for_keys=False, allow_agent=False, timeout=target.timeout,
                           banner_timeout=target.timeout, auth_timeout=target.timeout)
            return client
        except paramiko.BadHostKeyException as e:
            raise HostKeyMismatch(
                '%s presented host key %s %s, not the pinned gpuhost:host.ssh.host_key (%s ...). If the host was '
                'reinstalled, verify its key out of band and update the config; otherwise do not connect.' % (
                    target.name, e.key.get_name(), e.key.get_base64()[:24] + '...', b64[:24])) from None
        except paramiko.AuthenticationException:
            raise RemoteError('%s refused the SSH key (gpuhost:host.ssh.private_key); authorise its public key for '
                              '%s on the host' % (target.name, target.user)) from None
        except (OSError, socket.timeout, paramiko.SSHException) as e:
            last = e
            time.sleep(0.5 * (attempt + 1))
    raise RemoteError('cannot reach %s over SSH after %d attempts: %s' % (target.name, attempts, last))


def script(name: str) -> str:
    with open(os.path.join(SCRIPTS, name)) as f:
        return f.read()


def run(target: Target, name: str, args: Sequence[str] = (), stdin: Optional[bytes] = None, check: bool = True,
        timeout: float = 900.0, client=None) -> Result:
    """Run components/scripts/<name> on the host with args as quoted positional parameters."""
    body = script(name)
    command = 'bash -c %s %s %s' % (shlex.quote(body), shlex.quote(name), shlex.join([str(a) for a in args]))
    own = client is None
    client = client or connect(target)
    try:
        chan = client.get_transport().open_session(timeout=target.timeout)
        chan.settimeout(timeout)
        chan.exec_command(command)
        if stdin is not None:
            chan.sendall(stdin)
        chan.shutdown_write()
        out, err = [], []
        while True:
            if chan.recv_ready():
                out.append(chan.recv(65536))
            elif chan.recv_stderr_ready():
                err.append(chan.recv_stderr(65536))
            elif chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                break
            else:
                time.sleep(0.005)
        code = chan.recv_exit_status()
        while chan.recv_ready():
            out.append(chan.recv(65536))
        while chan.recv_stderr_ready():
            err.append(chan.recv_stderr(65536))
    except (OSError, socket.timeout) as e:
        raise RemoteError('%s: %s on %s did not complete: %s (the step is safe to re-run)' % (
            target.name, name, target.host, e)) from None
    finally:
        if own:
            client.close()
    result = Result(b''.join(out).decode('utf-8', 'replace'), b''.join(err).decode('utf-8', 'replace'), code)
    if check and code != 0:
        tail = result.stderr.strip().splitlines()[-5:]
        raise RemoteError('%s: %s %s failed with exit code %d: %s' % (
            target.name, name, shlex.join([str(a) for a in args])[:200], code, ' | '.join(tail) or '(no stderr)'))
    return result


def sha256_hex(data) -> str:
    """sha256 of text (UTF-8) or bytes, as sha256sum prints it on the host."""
    import hashlib
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def put_file(target: Target, path: str, content: str, mode: str, expected: str, post: str = 'none',
             client=None) -> bool:
    """Atomically replace a host file if it differs (compare-and-swap on `expected`, the sha256 the
    caller read, or '-' for absent / 'any'); True if it changed."""
    data = content.encode()
    res = run(target, 'put_file.sh', [path, mode, expected, sha256_hex(data), post], stdin=data, client=client)
    return res.stdout.startswith('changed')


def ct_put_file(target: Target, vmid, path: str, content: str, mode: str = '0644', client=None) -> bool:
    """Atomically replace a file inside a container if it differs; True if it changed."""
    data = content.encode()
    res = run(target, 'ct_put_file.sh', [vmid, path, mode, sha256_hex(data)], stdin=data, client=client)
    return res.stdout.startswith('changed')


# ------------------------------------------------------------------------- facts

@dataclasses.dataclass
class Gpu:
    address: str
    id: str
    numa: int
    driver: Optional[str]
    override: Optional[str]
    group: Optional[int]
    group_type: Optional[str]
    minor: Optional[int] = None


@dataclasses.dataclass
class HostFacts:
    boot: str = 'grub'
    configured: str = ''          # the effective configured line (GRUB: LINUX + DEFAULT incl. grub.d)
    grub_linux: str = ''          # GRUB only: the two variables as /etc/default/grub alone sets them
    grub_default: str = ''
    running: str = ''
    gpus: dict = dataclasses.field(default_factory=dict)
    params: dict = dataclasses.field(default_factory=dict)
    overrides: dict = dataclasses.field(default_factory=dict)
    files: dict = dataclasses.field(default_factory=dict)

    def running_args(self):
        from components import cmdline
        return [w for w in cmdline.split(self.running) if not w.startswith(('BOOT_IMAGE=', 'initrd='))]


def parse_facts(text: str) -> HostFacts:
    """Parse host_facts.sh output (pure; golden-tested)."""
    facts = HostFacts()
    for line in text.splitlines():
        if not line.strip():
            continue
        kind, _, rest = line.partition('\t')
        fields = rest.split('\t')
        if kind == 'boot':
            facts.boot = fields[0]
        elif kind == 'configured':
            facts.configured = rest.strip()
        elif kind == 'grub_linux':
            facts.grub_linux = rest.strip()
        elif kind == 'grub_default':
            facts.grub_default = rest.strip()
        elif kind == 'running':
            facts.running = rest.strip()
        elif kind == 'gpu':
            bdf, pci_id, numa, driver, override, group, gtype = fields[:7]
            facts.gpus[bdf] = Gpu(bdf, pci_id, int(numa) if numa.lstrip('-').isdigit() else -1,
                                  None if driver == '-' else driver,
                                  None if override in ('(null)', '-', '') else override,
                                  int(group) if group.isdigit() else None, None if gtype == '-' else gtype)
        elif kind == 'minor':
            if fields[0] in facts.gpus and fields[1].strip().isdigit():
                facts.gpus[fields[0]].minor = int(fields[1])
        elif kind == 'param':
            facts.params[fields[0].strip()] = fields[1].strip() if len(fields) > 1 else ''
        elif kind == 'override':
            facts.overrides[fields[0]] = fields[1]
        elif kind == 'file':
            facts.files[fields[0]] = None if fields[1] == '-' else fields[1]
    return facts


def parse_kv(text: str) -> dict:
    """Tab-separated key/value lines (ct_unit_facts.sh)."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition('\t')
        if sep:
            out[key.strip()] = value.strip()
    return out
