"""Remote commands over SSH with a pinned host key, and the parsers for what they print.

Why not pulumi-command's remote.Command: its provider binary is not on PyPI, and the Go module that
builds it (github.com/pulumi/pulumi-command/provider) is refused by the Go module proxy our machines
reach (see docs/architecture.md, its remote actions table). Our own resources call `run()` instead, with the
same contract remote.Command has - scripts from files, every value a quoted positional argument,
content on stdin, host key pinned - plus what it lacks: a real read() for `pulumi refresh`.

Every script in hostscripts starts with `set -euo pipefail` and is sent as
`bash -c <script> <name> <args...>`; file content travels on stdin, never on the command line.
Nothing secret is ever part of a command, so error messages (which quote stderr) carry none.
"""

from __future__ import annotations

import base64
import contextlib
import contextvars
import dataclasses
import io
import os
import shlex
import socket
import threading
import time
from typing import Optional, Sequence

from hostscripts import host_state
from transport.operator import CANCELLED, Interrupted, OperatorError

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'hostscripts')


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
    command_timeout: float = 900.0

    @classmethod
    def from_inputs(cls, conn: dict) -> 'Target':
        return cls(host=conn['host'], port=int(conn['port']), user=conn['user'], private_key=conn['private_key'],
                   host_key=conn['host_key'], timeout=float(conn.get('timeout', 10.0)),
                   command_timeout=float(conn.get('command_timeout') or 900.0))

    @property
    def name(self):
        return '%s@%s:%d' % (self.user, self.host, self.port)


def _host_key(target: Target):
    """What identifies a host's connection: its pool entry, its lock, its channel slots, its shared reads. The key it
    logs in with too (a digest): one process serves every provider instance of a pass (provider/stub.py), and an
    instance with a rotated key never rides on a connection the old key opened."""
    import hashlib
    return (target.host, target.port, target.user, target.host_key,
            hashlib.sha256(target.private_key.encode()).hexdigest()[:16])


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


class ConnectionLost(RemoteError):
    """The SSH connection went away during a step. The message says which step, whether it had started
    (it may have completed on the host) and that a re-run is safe (every step compares first)."""


# What each script does, for messages, and how long it may take (seconds, before the command timeout
# gpuhost:host.ssh.command_timeout caps the long ones): a hung tool must not hang `pulumi up` forever.
STEPS = {
    'host_facts.sh': ('reading the host facts', 60),
    'read_file.sh': ('reading {0}', 60),
    'put_file.sh': ('writing {0} (then {4})', None),
    'check_devices.sh': ('checking the device nodes', 60),
    'vfio_bind.sh': ('binding {rest} to {0}', 300),
    'reboot.sh': ('scheduling the reboot', 30),
    'ct_put_file.sh': ('writing {1} in container {0}', 120),
    'ct_read_file.sh': ('reading {1} in container {0}', 60),
    'ct_unit.sh': ('starting {1} in container {0}', 300),
    # The proof's own time limit ends it; this one only catches a stuck pct (resources/sglang.py prove).
    'ct_gpu_proof.sh': ('proving the GPUs of container {0} (its unit {1} stopped)', None),
    'ct_unit_facts.sh': ('reading the state of {1} in container {0}', 60),
    'ct_unit_owner.sh': ('checking who owns {1} in container {0}', 60),
    'ct_remove_dropins.sh': ('removing the drop-ins of {1} in container {0}', 60),
    'ct_stop_unit.sh': ('stopping and removing {1} in container {0}', 300),
    'ct_runtime_check.sh': ('checking the NVIDIA user space and CUDA in container {0}', 60),
    'ct_remove_path.sh': ('removing {1} in container {0}', 60),
    'ct_cuda_previous.sh': ('{2} of the CUDA toolkit kept beside {1} in container {0}', 300),
    'ct_env_link.sh': ('linking {1} to {2} in container {0}', 120),
    'ensure_dir.sh': ('creating the directory {0}', 60),
    'check_dir.sh': ('checking the directory {0}', 60),
    'driver_facts.sh': ('reading the NVIDIA driver, loaded and installed for each kernel', 60),
    'ct_gpu_holders.sh': ('reading the processes holding the GPUs in container {0}', 60),
    'model_verify.sh': ('verifying the model files on the host', None),
    'model_forget.sh': ('removing the model\'s textfile {0} and verification cache', 60),
    'model_remove.sh': ('removing the previous model revision\'s directory {1}', 300),
    'remove_file.sh': ('removing {0}', 60),
    'collector_facts.sh': ('reading the collector\'s files and {0}', 60),
    'read_batch.sh': ('reading the host ({0})', 60),
    'collector_enable.sh': ('enabling {1} and running {0} once', 120),
    'collector_remove.sh': ('stopping {1} and removing the collector\'s files', 120),
    # A long step's job (transport/jobs.py): each command only starts, polls or stops it.
    'job.sh': ('{0} of job {1}', 60),
    'ct_job.sh': ('{2} of job {3} in container {0}', 60),
}


def step_name(name: str, args) -> str:
    what, _ = STEPS.get(name, (name, None))
    args = [str(a) for a in args]
    try:
        return what.format(*args, rest=' '.join(args[1:]))
    except IndexError:
        return '%s %s' % (name, ' '.join(args))


def step_timeout(name: str, target: 'Target') -> float:
    limit = STEPS.get(name, (None, None))[1]
    return target.command_timeout if limit is None else min(limit, target.command_timeout)


def _transport_reason(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return text if len(text) < 160 else text[:157] + '...'


def connect(target: Target, attempts: int = 3):
    """An SSH client that accepts only the pinned host key."""
    import paramiko
    keytype, b64 = target.host_key.split()[:2]
    pinned = paramiko.PKey.from_type_string(keytype, base64.b64decode(b64))
    entry = target.host if target.port == 22 else '[%s]:%d' % (target.host, target.port)
    pkey = _pkey(target.private_key)
    last = None
    for attempt in range(attempts):
        client = paramiko.SSHClient()
        client.get_host_keys().add(entry, keytype, pinned)
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            client.connect(target.host, port=target.port, username=target.user, pkey=pkey,
                           look_for_keys=False, allow_agent=False, timeout=target.timeout,
                           banner_timeout=target.timeout, auth_timeout=target.timeout)
            return client
        except paramiko.BadHostKeyException as e:
            client.close()
            raise HostKeyMismatch(
                '%s presented host key %s %s, not the pinned gpuhost:host.ssh.host_key (%s ...). If the host was '
                'reinstalled, verify its key out of band and update the config; otherwise do not connect.' % (
                    target.name, e.key.get_name(), e.key.get_base64()[:24] + '...', b64[:24])) from None
        except paramiko.AuthenticationException as e:
            transport = client.get_transport()
            client.close()
            if transport is not None and transport.is_active():
                raise RemoteError('%s refused the SSH key (gpuhost:host.ssh.private_key); authorise its public key '
                                  'for %s on the host' % (target.name, target.user)) from None
            # The transport died during the key exchange or the login: a lost connection, not a refusal.
            last = e
        except (OSError, EOFError, socket.timeout, paramiko.SSHException) as e:
            client.close()
            last = e
        if attempt + 1 < attempts and CANCELLED.wait(0.5 * (attempt + 1)):
            raise Interrupted('connection to %s failed while logging in (%s) and the run was interrupted '
                                    '(Ctrl-C): no further attempt; nothing was run on the host' % (
                                        target.name, _transport_reason(last)))
    raise ConnectionLost('connection to %s failed while logging in, %d attempts (last: %s); nothing was run on the '
                         'host. Check that it is up and reachable, then re-run.' % (
                             target.name, attempts, _transport_reason(last)))


_pool = {}
_pool_lock = threading.Lock()          # the tables only, never held across a network wait
_host_locks = {}
# Channels open at once on one host's connection. OpenSSH refuses a session beyond its MaxSessions (default 10:
# "open failed"), and a fleet's engine may run many more of a host's steps at once (PULUMI_PARALLEL): the rest
# wait here for a channel, never for the server to refuse one. Two below the default leave room for an operator's
# own session multiplexed on a ControlMaster-style connection.
MAX_CHANNELS = 8
_channel_slots = {}


def _channels(target: 'Target') -> threading.BoundedSemaphore:
    with _pool_lock:
        return _channel_slots.setdefault(_host_key(target), threading.BoundedSemaphore(MAX_CHANNELS))


def _host_lock(key) -> threading.Lock:
    with _pool_lock:
        return _host_locks.setdefault(key, threading.Lock())


def pooled(target: Target):
    """One SSH connection per host, shared by every step of this process (a provider process serves
    all of a run's resources; channels on one transport run concurrently). A dead one is replaced.
    Steps of one host wait for its one connect; other hosts connect at the same time (a lock per host)."""
    key = _host_key(target)
    with _host_lock(key):
        with _pool_lock:
            client = _pool.get(key)
        transport = client.get_transport() if client is not None else None
        if transport is not None and transport.is_active():
            return client
        if client is not None:
            client.close()
        client = connect(target)
        with _pool_lock:
            _pool[key] = client
        return client


def discard(target: Target) -> None:
    key = _host_key(target)
    with _pool_lock:
        client = _pool.pop(key, None)
    if client is not None:
        client.close()


def script(name: str) -> str:
    with open(os.path.join(SCRIPTS, name)) as f:
        return f.read()


def send_eof(chan) -> None:
    """chan.shutdown_write() without paramiko's race (5.1.0 Channel.shutdown): it makes the EOF under the channel's
    lock and sends it after letting go, so the transport thread can meanwhile answer the server's CLOSE of a command
    that ended at once - our EOF then follows our CLOSE, and OpenSSH drops the whole connection ("ieof packet
    referred to nonexistent channel"), every step on it lost (seen under load: a fixture's `up` failed that way).
    Sent with the lock held, the CLOSE waits for it. (The one wait inside: paramiko holds a message back while a
    rekey it started is under way, which the transport thread blocked on this lock could not finish - it starts one
    after 2^29 packets or bytes on a connection, far beyond a run's.)"""
    with chan.lock:
        m = chan._send_eof()
        if m is not None:
            chan.transport._send_user_message(m)


# The program's read-only scripts: inside a Read (reading()), those that arrive together go out as one command
# (transport/hostreads.py); any command outside a Read forgets what was read of its host.
READ_ONLY = frozenset(('host_facts.sh', 'read_file.sh', 'collector_facts.sh', 'ct_read_file.sh', 'ct_unit_facts.sh',
                       'check_dir.sh', 'ct_unit_owner.sh', 'model_verify.sh', 'ct_platform.sh', 'driver_facts.sh',
                       'ct_gpu_holders.sh'))
_READING = contextvars.ContextVar('gpuhost_reading', default=False)


@contextlib.contextmanager
def reading():
    """A Read (refresh, import): the host's read-only scripts are shared and batched (transport/hostreads.py)."""
    token = _READING.set(True)
    try:
        yield
    finally:
        _READING.reset(token)


def run(target: Target, name: str, args: Sequence[str] = (), stdin: Optional[bytes] = None, check: bool = True,
        timeout: Optional[float] = None, client=None, lost_detail: str = '', on_stderr_line=None) -> Result:
    """Run hostscripts/<name> on the host with args as quoted positional parameters.

    Every transport failure becomes ConnectionLost naming the host and the step; a step that does not
    finish in time is stopped and named. Output of a command whose connection dropped is never
    returned as if it were complete. on_stderr_line: called with each line of stderr as it arrives (a
    long step's progress)."""
    from transport import hostreads
    if not _READING.get():
        # Outside a Read a command may change the host: what was read of it is old. (A Read, and the preflight,
        # change nothing the reads see: the model's quick look there writes only its own cache of sums.)
        hostreads.forget(_host_key(target))
    elif name in READ_ONLY and timeout is None and client is None and on_stderr_line is None:
        result = hostreads.read(_host_key(target), name, args, lambda keys: _read_batch(target, keys), stdin)
        return _checked(target, step_name(name, args), result, check)
    out, err, code = _exec(target, name, args, stdin, timeout, client, lost_detail, on_stderr_line)
    return _checked(target, step_name(name, args), Result(out.decode('utf-8', 'replace'),
                                                          err.decode('utf-8', 'replace'), code), check)


def _read_batch(target: Target, keys) -> dict:
    """hostreads' batch: one read alone as itself; several as read_batch.sh."""
    from transport import hostreads
    if len(keys) == 1:
        out, err, code = _exec(target, keys[0][0], keys[0][1], hostreads.batch_stdin(keys))
        return {keys[0]: Result(out.decode('utf-8', 'replace'), err.decode('utf-8', 'replace'), code)}
    # As long as its slowest read may take alone (the model's quick look has the command's own limit).
    out, err, code = _exec(target, 'read_batch.sh', hostreads.batch_args(keys, script), hostreads.batch_stdin(keys),
                           timeout=max(step_timeout(k[0], target) for k in keys))
    try:
        if code != 0:
            raise ValueError('exit code %d: %s' % (code, err.decode('utf-8', 'replace').strip()[-300:]))
        return hostreads.parse_batch(out, keys, Result)
    except ValueError as e:
        raise RemoteError('%s: %s failed: %s' % (target.name, step_name('read_batch.sh', [
            ','.join(sorted({k[0] for k in keys}))]), e)) from None


def _checked(target: Target, step: str, result: Result, check: bool) -> Result:
    if check and result.exit_code != 0:
        tail = result.stderr.strip().splitlines()[-5:]
        raise RemoteError('%s: %s failed (exit code %d): %s' % (
            target.name, step, result.exit_code, ' | '.join(tail) or '(no stderr)'))
    return result


def _exec(target: Target, name: str, args: Sequence[str] = (), stdin: Optional[bytes] = None,
          timeout: Optional[float] = None, client=None, lost_detail: str = '', on_stderr_line=None):
    """run()'s command itself: (stdout bytes, stderr bytes, exit code), on one of the host's MAX_CHANNELS."""
    slots = _channels(target)
    slots.acquire()
    try:
        return _exec_channel(target, name, args, stdin, timeout, client, lost_detail, on_stderr_line)
    finally:
        slots.release()


# Every script runs inside hostscripts/guard.sh: its own process group on the host, ended (TERM, its cleanup, KILL
# after GUARD_GRACE_S) when the program stops waiting for it, when its SSH session is gone (the connection dropped,
# the serving process was killed), or GUARD_MARGIN_S after the program's own limit. A command sshd started outlives
# its session otherwise - a hung tool of a failed run kept running, and its late rollback raced the re-run.
GUARD_GRACE_S = 10
GUARD_MARGIN_S = 5
# How long a stopped command's last output may take to arrive after its guard is gone (only a loaded host's sshd takes
# more than a moment).
DRAIN_S = 10.0


def guarded(name: str, args: Sequence, limit: float) -> str:
    """The command line of hostscripts/<name> with args, inside guard.sh (exec: the guard's parent is the session's
    sshd, whose end it watches)."""
    return 'exec bash -c %s %s %d %d %s %s' % (
        shlex.quote(script('guard.sh')), shlex.quote(name), int(limit) + GUARD_MARGIN_S, GUARD_GRACE_S,
        shlex.quote(script(name)), shlex.join([str(a) for a in args]))


class _GuardLine:
    """Takes guard.sh's first line (`gpuhost-guard PID`) off the front of a command's stderr: the pid its stop signals.
    A server that runs commands without the guard (none of ours) sends no such line; its stderr is left whole."""

    def __init__(self):
        self.pid = None
        self.head = b''
        self.done = False

    def feed(self, chunk: bytes, end: bool = False) -> bytes:
        if self.done:
            return chunk
        self.head += chunk
        line, nl, rest = self.head.partition(b'\n')
        if not nl and not end and len(self.head) < 64:
            return b''
        self.done = True
        if nl and line.startswith(b'gpuhost-guard ') and line[14:].strip().isdigit():
            self.pid = int(line[14:])
            return rest
        return self.head


def _stop(target: Target, transport, chan, guard: _GuardLine, err: list) -> str:
    """The command the program stops waiting for ended on the host - its guard's process group: TERM, its own cleanup,
    KILL - before the failure is reported (stop_guard.sh on a session of its own, beside the command's). Says how it
    ended, with the last line the command wrote (a cleanup's account), for the message."""
    if guard.pid is None:
        chan.close()
        return 'it was stopped waiting for (no guard answered: it may still run on the host)'
    said = ''
    try:
        stopper = _open_session(target, transport)
        try:
            stopper.settimeout(GUARD_GRACE_S + 30)
            stopper.exec_command('bash -c %s stop_guard.sh %d %d' % (
                shlex.quote(script('stop_guard.sh')), guard.pid, GUARD_GRACE_S + 5))
            send_eof(stopper)
            if not stopper.status_event.wait(GUARD_GRACE_S + 30):
                raise socket.timeout('stop_guard.sh did not answer')
            code = stopper.exit_status
            # Its stderr (what still runs, when it failed) until its EOF: OpenSSH may send it after the status.
            said, until = b'', time.monotonic() + DRAIN_S
            while time.monotonic() < until and not (stopper.eof_received or stopper.closed):
                said += stopper.recv_stderr(65536) if stopper.recv_stderr_ready() else b''
                time.sleep(0.01)
            while stopper.recv_stderr_ready():
                said += stopper.recv_stderr(65536)
            said = said.decode('utf-8', 'replace')
        finally:
            stopper.close()
    except Exception as e:  # noqa: BLE001 - whatever the stop met, the step's failure is still reported
        chan.close()
        return 'it could not be stopped on the host (%s): its guard ends it there within %d s' % (
            _transport_reason(e), GUARD_MARGIN_S + GUARD_GRACE_S)
    # What the command wrote while it ended (its cleanup says what it put back): all of it is on its way once the guard
    # is gone, before the channel's EOF - which a loaded host's sshd may take seconds to send (a fresh-clone CI run
    # reported a stopped put_file.sh without its rollback's line; the wait was 2 s then).
    until = time.monotonic() + DRAIN_S
    while time.monotonic() < until and not (chan.eof_received or chan.closed):
        if chan.recv_stderr_ready():
            err.append(guard.feed(chan.recv_stderr(65536)))
        elif chan.recv_ready():
            chan.recv(65536)
        else:
            time.sleep(0.01)
    while chan.recv_stderr_ready():
        err.append(guard.feed(chan.recv_stderr(65536)))
    chan.close()
    if code != 0:
        return 'it was told to stop on the host but still runs there (%s)' % (said.splitlines() or ['?'])[-1]
    last = [line for line in b''.join(err).decode('utf-8', 'replace').strip().splitlines() if line.strip()]
    return 'it was stopped on the host (its process group ended%s)' % (
        ': "%s"' % last[-1].strip()[:200] if last else '')


def _open_session(target: Target, transport):
    """A new session on the host's connection. A server that refuses one (paramiko ChannelException: its MaxSessions
    reached - sessions that just ended still count until it has closed them, which a loaded host takes a moment
    to do) keeps the connection and every command on it: the open is tried again for up to a session's worth of
    waiting, then named - never taken for a lost connection, which would end the other commands on it.
    paramiko keeps a refusal's ChannelException in one slot of the whole transport: of two refusals at once, one
    thread gets it and the other a bare SSHException("Unable to open channel.") - a refusal too while the
    transport is up (seen in CI: 24 commands at once on one connection, one taken for a lost connection)."""
    import paramiko
    deadline, delay = time.monotonic() + max(target.timeout, 10.0), 0.05
    while True:
        try:
            return transport.open_session(timeout=target.timeout)
        except paramiko.SSHException as e:
            if not isinstance(e, paramiko.ChannelException) and not transport.is_active():
                raise
            if time.monotonic() > deadline:
                raise RemoteError('%s refused to open another SSH session for %d s (%s): its sshd allows fewer '
                                  'sessions on one connection than the %d commands this program runs at once '
                                  '(MaxSessions; OpenSSH\'s default is 10) - raise it and re-run; nothing was '
                                  'started by this command' % (target.name, max(target.timeout, 10.0),
                                                               getattr(e, 'text', None) or 'open failed',
                                                               MAX_CHANNELS)) from None
            if CANCELLED.wait(delay):
                raise Interrupted('the run was interrupted (Ctrl-C) while %s had no session free; nothing was '
                                        'started by this command' % target.name) from None
            delay = min(delay * 2, 0.5)


def _exec_channel(target, name, args, stdin, timeout, client, lost_detail, on_stderr_line):
    import paramiko
    step = step_name(name, args)
    limit = timeout if timeout is not None else step_timeout(name, target)
    command = guarded(name, args, limit)
    own = client is None
    started = False
    chan = None
    try:
        client = client or pooled(target)
        transport = client.get_transport()
        if transport is None or not transport.is_active():
            raise EOFError('SSH session not active')
        chan = _open_session(target, transport)
        chan.settimeout(max(limit, target.timeout))
        chan.exec_command(command)
        started = True
        if stdin is not None:
            chan.sendall(stdin)
        send_eof(chan)
        out, err, pending = [], [], b''
        guard = _GuardLine()
        deadline = time.monotonic() + limit
        # Done at the server's EOF (or close) with the exit status in, not at the exit status alone: OpenSSH
        # sends the status when the process ends and drains the rest of its output after it, so a loaded host's
        # last lines can still be on the way (host_facts.sh lost its last lines that way: 3 of 4 PCI devices
        # "missing" from a host that had them).
        while True:
            if chan.recv_ready():
                out.append(chan.recv(65536))
            elif chan.recv_stderr_ready():
                err.append(guard.feed(chan.recv_stderr(65536)))
                if on_stderr_line is not None:
                    pending += err[-1]
                    while b'\n' in pending:
                        one, pending = pending.split(b'\n', 1)
                        on_stderr_line(one.decode('utf-8', 'replace'))
            elif chan.exit_status_ready() and (chan.eof_received or chan.closed):
                break
            elif chan.closed or not transport.is_active():
                raise EOFError('the server closed the connection before the command finished')
            elif time.monotonic() > deadline:
                ended = _stop(target, transport, chan, guard, err)
                raise RemoteError('%s: %s did not finish within %d s (gpuhost:host.ssh.command_timeout); %s - a tool '
                                  'on the host may hang (check its processes), then re-run' % (
                                      target.name, step, limit, ended))
            else:
                time.sleep(0.005)
        code = chan.recv_exit_status()
        while chan.recv_ready():
            out.append(chan.recv(65536))
        while chan.recv_stderr_ready():
            err.append(guard.feed(chan.recv_stderr(65536)))
        err.append(guard.feed(b'', end=True))
        if code == -1:
            raise EOFError('the command ended without an exit status')
    except ConnectionLost:
        raise
    except RemoteError:
        raise
    except (OSError, EOFError, socket.timeout, paramiko.SSHException) as e:
        if own:
            discard(target)
        where = ('the step may have completed on the host%s' % (' (%s)' % lost_detail if lost_detail else '')
                 if started else 'the step had not started')
        raise ConnectionLost('connection to %s lost during %s (%s); %s. Safe to re-run: every step reads the '
                             'host first and does only what is still missing.' % (
                                 target.name, step, _transport_reason(e), where)) from None
    finally:
        # The server's session slot (MaxSessions) back at once, not when its CLOSE comes.
        if chan is not None:
            try:
                chan.close()
            except Exception:  # noqa: BLE001 - a channel of a dead transport: nothing to give back
                pass
    return b''.join(out), b''.join(err), code


def sha256_hex(data) -> str:
    """sha256 of text (UTF-8) or bytes, as sha256sum prints it on the host."""
    import hashlib
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def put_file(target: Target, path: str, content: str, mode: str, expected: str, post: str = 'none',
             client=None) -> bool:
    """Atomically replace a host file if it differs (compare-and-swap on `expected`, the sha256 the
    caller read, or '-' for absent / 'any'); True if it changed."""
    data = content.encode()
    new = sha256_hex(data)
    res = run(target, 'put_file.sh', [path, mode, expected, new, post], stdin=data, client=client,
              lost_detail='%s has either its old content%s or the new one (sha256 %s...), never a mix' % (
                  path, '' if expected in ('any', '-') else ' (sha256 %s...)' % expected[:12], new[:12]))
    return res.stdout.startswith('changed')


def ct_put_file(target: Target, vmid, path: str, content: str, mode: str = '0644', expected: str = 'any',
                client=None) -> bool:
    """Atomically replace a file inside a container if it differs, if it still has the content the caller
    read (`expected` sha256, '-' for absent, or 'any'); True if it changed."""
    data = content.encode()
    new = sha256_hex(data)
    res = run(target, 'ct_put_file.sh', [vmid, path, mode, new, expected], stdin=data, client=client,
              lost_detail='%s in container %s has either its old content or the new one (sha256 %s...)' % (
                  path, vmid, new[:12]))
    return res.stdout.startswith('changed')


# ------------------------------------------------------------------------- facts

# The facts' types live in hostscripts/host_state.py (shared with the collector on the host); parse_facts()
# fills them from host_facts.sh's output.
Gpu = host_state.Gpu


@dataclasses.dataclass
class HostFacts(host_state.HostFacts):
    """The facts as the program reads them: the collector's (host_state.py, which its script carries: a field there
    changes the collector's files on every host) and which boot this is (/proc/sys/kernel/random/boot_id)."""
    boot_id: Optional[str] = None


@dataclasses.dataclass
class PciDevice:
    """Whatever device sits at a PCI address (a GPU or not), as sysfs describes it; what Proxmox checks a
    resource mapping against at VM start (PVE::SysFSTools::pci_device_info)."""
    address: str
    id: str                       # vendor:device, lowercase hex without 0x
    subsystem_id: Optional[str]   # subsystem vendor:device, None when sysfs has none
    pci_class: str                # 0x030200 (3D controller), 0x020000 (Ethernet), ...
    numa: int
    driver: Optional[str]
    group: Optional[int]

    @property
    def is_gpu(self) -> bool:
        """A display-class device (PCI base class 03): what host_facts.sh lists as a GPU."""
        return self.pci_class.lower().startswith('0x03')


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
        elif kind == 'boot_id':
            facts.boot_id = rest.strip() or None
        elif kind == 'configured':
            facts.configured = rest.strip()
        elif kind == 'grub_linux':
            facts.grub_linux = rest.strip()
        elif kind == 'grub_default':
            facts.grub_default = rest.strip()
        elif kind == 'running':
            facts.running = rest.strip()
        elif kind == 'nvidia_module':
            facts.nvidia_module = rest.strip() or None
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
        elif kind == 'modprobe':
            facts.modprobe.append((fields[0], '\t'.join(fields[1:])))
        elif kind == 'pending':
            facts.pending[fields[0]] = fields[1] if len(fields) > 1 else '?'
        elif kind == 'driverctl':
            facts.driverctl = rest.strip() or None
        elif kind == 'iommu_groups':
            facts.iommu_groups = int(rest) if rest.strip().isdigit() else None
        elif kind == 'kvm_amd':
            facts.kvm_amd[fields[0]] = fields[1].strip() if len(fields) > 1 else ''
        elif kind == 'devnode':
            facts.devnodes[fields[0]] = len(fields) > 1 and fields[1] == 'c'
        elif kind == 'pci':
            facts.pci[fields[0]] = None if len(fields) < 7 else PciDevice(
                fields[0], fields[1].lower(), None if fields[2] == '-' else fields[2].lower(), fields[3],
                int(fields[4]) if fields[4].lstrip('-').isdigit() else -1, None if fields[5] == '-' else fields[5],
                int(fields[6]) if fields[6].isdigit() else None)
    return facts


def parse_kv(text: str) -> dict:
    """Tab-separated key/value lines (ct_unit_facts.sh)."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition('\t')
        if sep:
            out[key.strip()] = value.strip()
    return out
