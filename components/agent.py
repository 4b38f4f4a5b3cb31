"""An SSH agent for the smoke test (pulumi-command's remote.Command) when the stack keeps its SSH key in a file:
pulumi-command takes the key's text as an input - which puts it into the state - or an agent's socket
(`agentSocketPath`), which puts only a path there. So the program runs one OpenSSH agent per key for the length
of an `up`, the key loaded into it from the text the program read (`ssh-add -`), its socket in a private directory
of the user's (~/.cache/gpuhost/agent, 0700) under a name that stays the same from run to run (a new path would be
a change of the smoke test at every `up`). The agent dies with the program (PR_SET_PDEATHSIG, and at exit)."""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import signal
import subprocess

from components.state import OperatorError

_started = {}


def agent_dir() -> str:
    base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    return os.path.join(base, 'gpuhost', 'agent')


def socket_path(stack: str, key_file: str) -> str:
    """Where the agent for this stack and key file listens: the same path at every run of the stack."""
    digest = hashlib.sha256(('%s\0%s' % (stack, os.path.abspath(key_file))).encode()).hexdigest()[:16]
    return os.path.join(agent_dir(), '%s.sock' % digest)


def _die_with_parent():
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)      # PR_SET_PDEATHSIG


def start(path: str, key: str, what: str) -> None:
    """An agent listening at `path` with `key` (the private key's text) loaded; once per path and process.
    `what`: the config key naming the key file, for a refusal."""
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
    try:
        os.unlink(path)          # an agent of an earlier run killed with its program (its socket file stays)
    except FileNotFoundError:
        pass
    proc = subprocess.Popen(['ssh-agent', '-D', '-a', path], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, preexec_fn=_die_with_parent)
    _started[path] = proc
    atexit.register(stop, path)
    env = dict(os.environ, SSH_AUTH_SOCK=path)
    for _ in range(100):
        if os.path.exists(path) or proc.poll() is not None:
            break
        import time
        time.sleep(0.02)
    res = subprocess.run(['ssh-add', '-q', '-'], input=key.encode(), env=env, capture_output=True, timeout=30)
    if res.returncode != 0:
        stop(path)
        from components.errors import scrub
        raise OperatorError('%s: the SSH agent for the smoke test did not take the key (ssh-add: %s)' % (
            what, scrub(res.stderr.decode(errors='replace').strip()[-300:]) or 'exit %d' % res.returncode))


def stop(path: str) -> None:
    proc = _started.pop(path, None)
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
    try:
        os.unlink(path)
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
