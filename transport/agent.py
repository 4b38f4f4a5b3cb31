"""An SSH agent for the smoke test (pulumi-command's remote.Command) when the stack keeps its SSH key in a file:
pulumi-command takes the key's text as an input - which puts it into the state - or an agent's socket
(`agentSocketPath`), which puts only a path there. So the program runs one OpenSSH agent per key for the length
of an `up`, the key loaded into it from the text the program read (`ssh-add -`), its socket in a private directory
of the user's (~/.cache/gpuhost/agent, 0700), reached through a link whose name stays the same from run to run (a
new path would be a change of the smoke test at every `up`).

The agent ends with the program, however the program ends (Ctrl-C ends it with os._exit, a killed CLI with a
signal): it runs as `ssh-agent -a SOCKET cat`, and ssh-agent, given a command, exits within 10 s of that command
(its own check of its parent); the command is `cat` reading a pipe of the program's, which ends when the program
does. (ssh-agent is setgid on Debian, so a parent-death signal would not survive its exec.)"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import subprocess

from transport.operator import OperatorError

_started = {}
START_S = 30          # for the agent's socket to appear (a loaded machine)
SUN_PATH = 108        # Linux's sockaddr_un.sun_path, the terminating NUL included


def agent_dir() -> str:
    base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    return os.path.join(base, 'gpuhost', 'agent')


def socket_path(stack: str, key_file: str) -> str:
    """Where the agent for this stack and key file listens: the same path at every run of the stack."""
    digest = hashlib.sha256(('%s\0%s' % (stack, os.path.abspath(key_file))).encode()).hexdigest()[:16]
    return os.path.join(agent_dir(), '%s.sock' % digest)


def start(path: str, key: str, what: str) -> None:
    """An agent with `key` (the private key's text) loaded, reached at `path`; once per path and process. `what`:
    the config key naming the key file, for a refusal.

    `path` is a link to this run's own socket (<path minus .sock>-<pid>-<random>.sock), switched atomically: the
    agent of an earlier run, which may still be in its last 10 s, removes only its own socket when it goes."""
    if path in _started:
        return
    for tool in ('ssh-agent', 'ssh-add'):
        if shutil.which(tool) is None:
            raise OperatorError('%s: a key kept in a file reaches the smoke test through an SSH agent, and %s is not '
                                'installed on this machine; apt-get install openssh-client' % (what, tool))
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    st = os.lstat(folder)
    if st.st_uid != os.geteuid() or not os.path.isdir(folder) or os.path.islink(folder):
        raise OperatorError('%s: %s is not a directory of this user\'s; remove it and re-run' % (what, folder))
    os.chmod(folder, 0o700)
    _prune(path)
    import secrets
    own = '%s-%d-%s.sock' % (path[:-len('.sock')], os.getpid(), secrets.token_hex(4))
    if len(own.encode()) >= SUN_PATH:
        raise OperatorError('%s: the SSH agent\'s socket %s is longer than a Unix socket path may be (%d bytes); set '
                            'XDG_CACHE_HOME to a shorter directory' % (what, own, SUN_PATH))
    proc = subprocess.Popen(['ssh-agent', '-a', own, 'cat'], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _started[path] = (proc, own)
    atexit.register(stop, path)
    import time
    deadline = time.monotonic() + START_S
    # The socket file appears when ssh-agent binds it, a moment before it listens: ready is when it answers.
    while not answers(own) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if not answers(own):
        stop(path)
        why = ('exited at once (exit %d)' % proc.returncode if proc.returncode is not None else
               'did not open %s in %d s' % (own, START_S))
        raise OperatorError('%s: the SSH agent for the smoke test %s' % (what, why))
    res = subprocess.run(['ssh-add', '-q', '-'], input=key.encode(), env=dict(os.environ, SSH_AUTH_SOCK=own),
                         capture_output=True, timeout=30)
    if res.returncode != 0:
        stop(path)
        from transport.errors import scrub
        raise OperatorError('%s: the SSH agent for the smoke test did not take the key (ssh-add: %s)' % (
            what, scrub(res.stderr.decode(errors='replace').strip()[-300:]) or 'exit %d' % res.returncode))
    link = '%s.%d.new' % (path, os.getpid())
    try:
        os.unlink(link)
    except FileNotFoundError:
        pass
    os.symlink(own, link)
    os.replace(link, path)


def answers(path: str) -> bool:
    import socket
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(path)
            return True
        except OSError:
            return False


def _prune(path: str) -> None:
    """Sockets of earlier runs' agents whose program is gone (an agent killed outright leaves its socket)."""
    folder, stem = os.path.dirname(path), os.path.basename(path)[:-len('.sock')]
    for name in os.listdir(folder):
        parts = name[len(stem) + 1:-len('.sock')].split('-') if name.startswith(stem + '-') else []
        if len(parts) == 2 and parts[0].isdigit() and name.endswith('.sock'):
            try:
                os.kill(int(parts[0]), 0)
            except ProcessLookupError:
                try:
                    os.unlink(os.path.join(folder, name))
                except OSError:
                    pass
            except OSError:
                pass


def stop(path: str) -> None:
    """This run's agent told to go (its command ends; the agent follows within 10 s), its socket removed, and the
    link too while it still points at it."""
    proc, own = _started.pop(path, (None, None))
    if proc is None:
        return
    proc.stdin.close()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
    for name in (own, path):
        try:
            if name == own or os.readlink(path) == own:
                os.unlink(name)
        except OSError:
            pass


def smoke_connection(stack: str, d, connection: dict, root: str, start_agent: bool) -> dict:
    """pulumi-command's connection for the host's smoke test: the key's text where the stack gives it as a secret
    (encrypted in the state, as before), an agent's socket where the stack keeps it in a file - started with the
    key loaded when `start_agent` (an `up`; a preview runs no smoke test)."""
    if not d.host.ssh.private_key_file:
        return connection
    from config.load import full_path
    path = socket_path(stack, full_path(d.host.ssh.private_key_file, root))
    if start_agent:
        start(path, connection['private_key'], 'gpuhost:host.ssh.private_key_file')
    return dict({k: v for k, v in connection.items() if k != 'private_key'}, agent_socket_path=path)
