"""The gpuhost plugin as the engine starts it: once per provider instance - one per host - and pass (issue 46).

Serving a host costs a Python process with grpc, the pulumi SDK, paramiko and proxmoxer loaded (~0.5-0.9 CPU-s):
eight hosts paid it eight times a pass. This stub (standard library only, a few milliseconds) asks the pass's one
serving process (provider/__main__.py --serve, started by the first stub of the pass) for an instance of its own -
its own gRPC server on its own port, so each host keeps its own configuration (connection, login) exactly as with a
process each - prints that port for the engine, and stays until the engine ends it (SIGINT, then SIGTERM) or the
serving process ends. Its socket closing ends the instance. The serving process ends a few seconds after its last
instance, or when the engine stops answering (a killed CLI).

The pass's serving process is forked by the zygote (provider/__main__.py zygote): one warm process for the plugin's
virtualenv and directory that has loaded what a serving process loads (~0.4 CPU-s of its ~0.75), started by the
first stub that finds none and ending a minute after its last fork; a pass's serving process then pays no import.
A fork has the zygote's namespaces, cgroup, credentials, limits and nice level, not its stub's (issue 58: a stub under
`unshare -n` got a serving process on the zygote's loopback, which its engine could not reach): a stub asks only the
zygote of its own identity (provider/identity.py), which forks only for a stub that has it, else answers `other` -
that stub's serving process is then started the plain way.
GPUHOST_PLUGIN_ZYGOTE=0 starts each serving process afresh; GPUHOST_PLUGIN_SHARED=0 serves each instance in a
process of its own, as before."""

import fcntl
import os
import signal
import socket
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import identity  # noqa: E402 - provider/identity.py, standard library only
import passdir  # noqa: E402 - provider/passdir.py, standard library only

START_S = 60.0
# How long the zygote may take to fork a pass's serving process.
ZYGOTE_ANSWER_S = 20.0


def _connect(path: str):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        return s
    except OSError:
        s.close()
        return None


def _spawn(here: str, log: str) -> None:
    """The serving process, detached (its own session, not a child of this stub: the engine ends a stub's children
    with it)."""
    import subprocess
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            subprocess.Popen([sys.executable, os.path.join(HERE, '__main__.py'), '--serve'] + sys.argv[1:],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(log, 'ab'),
                             env=dict(os.environ, **{passdir.ENV: here}), close_fds=True)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _zygote_path() -> str:
    """The zygote's socket for this virtualenv and plugin directory (and the environment that decides what Python
    loads) and for this process's identity - what a fork inherits from the zygote: its namespaces, cgroup,
    credentials, limits, nice level (provider/identity.py) -, in the operator's private directory
    (provider/passdir.py). OSError when the identity is unreadable."""
    import hashlib
    import json
    key = json.dumps([sys.executable, HERE, sorted((k, v) for k, v in os.environ.items() if k.startswith('PYTHON')),
                      identity.of('/proc/self')])
    return os.path.join(passdir.base(), 'zygote-%s.sock' % hashlib.sha256(key.encode()).hexdigest()[:16])


def _ask_zygote(path: str, here: str, log: str):
    """'ok' once the zygote forked this pass's serving process, 'stale' (it ended: a file it loaded changed), 'other'
    (it forks for none but a process of its own identity: provider/identity.py) or None (no zygote answers)."""
    import json
    conn = _connect(path)
    if conn is None:
        return None
    umask = os.umask(0o077)
    os.umask(umask)
    request = json.dumps({'argv': sys.argv[1:], 'env': dict(os.environ, **{passdir.ENV: here}), 'cwd': os.getcwd(),
                          'umask': umask, 'log': log}).encode()
    try:
        conn.settimeout(ZYGOTE_ANSWER_S)
        conn.sendall(request)
        conn.shutdown(socket.SHUT_WR)
        answer = b''
        while not answer.endswith(b'\n'):
            chunk = conn.recv(64)
            if not chunk:
                return None
            answer += chunk
        return answer.strip().decode()
    except OSError:
        return None
    finally:
        conn.close()


def _from_zygote(here: str, log: str) -> bool:
    """This pass's serving process forked by the zygote (provider/__main__.py zygote), which is started when none
    answers; False when that fails for any reason (the caller then starts one the plain way). A zygote that answers
    `other` is left alone: this process's identity, as the zygote reads it, is not the one this process read itself
    (a /proc of another pid namespace than theirs, say), and a zygote started in its place would answer the same."""
    try:
        path = _zygote_path()
    except OSError:
        return False
    answer = _ask_zygote(path, here, log)
    if answer in ('ok', 'other'):
        return answer == 'ok'
    with open(path[:-len('.sock')] + '.lock', 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        answer = _ask_zygote(path, here, log)
        if answer in ('ok', 'other'):
            return answer == 'ok'
        # Its own session: neither the engine ending this stub nor the operator's Ctrl-C reaches it. Only what decides
        # how Python loads modules of its environment: a CLI's (its secrets among them) goes to that CLI's passes.
        import subprocess
        env = {k: v for k, v in os.environ.items()
               if k in ('PATH', 'HOME', 'LANG', 'TZ', 'TMPDIR') or k.startswith(('LC_', 'PYTHON'))}
        with open(path[:-len('.sock')] + '.log', 'wb') as err:
            zygote = subprocess.Popen([sys.executable, os.path.join(HERE, '__main__.py'), '--zygote', path],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, cwd='/',
                                      env=env, close_fds=True, start_new_session=True)
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline and zygote.poll() is None:
            conn = _connect(path)
            if conn is not None:
                conn.close()
                return _ask_zygote(path, here, log) == 'ok'
            time.sleep(0.02)
    return False


def _serving(here: str):
    sock = os.path.join(here, 'plugin.sock')
    with open(os.path.join(here, 'plugin.lock'), 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        conn = _connect(sock)
        if conn is not None:
            return conn
        log = os.path.join(here, 'plugin.log')
        if os.environ.get('GPUHOST_PLUGIN_ZYGOTE', '1') == '0' or not _from_zygote(here, log):
            _spawn(here, log)
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            conn = _connect(sock)
            if conn is not None:
                return conn
            time.sleep(0.02)
    try:
        with open(log, 'rb') as f:
            tail = f.read()[-2000:].decode('utf-8', 'replace')
    except OSError:
        tail = ''
    sys.stderr.write('gpuhost: the provider plugin did not start within %d s: %s\n' % (START_S, tail))
    sys.exit(1)


def _instance(here: str):
    """(connection, port line) from the pass's serving process; None when it ended before answering (it was ending
    after its last instance as this one asked: the next try starts another)."""
    conn = _serving(here)
    try:
        conn.sendall(b'new\n')
        line = b''
        while not line.endswith(b'\n'):
            chunk = conn.recv(64)
            if not chunk:
                conn.close()
                return None
            line += chunk
        return conn, line
    except OSError:
        conn.close()
        return None


def main() -> None:
    # The CLI that started this stub, read first: a CLI that exits right after reading the port line must not leave
    # this stub taking its new parent for the CLI.
    cli = os.getppid()
    if os.environ.get('GPUHOST_PLUGIN_SHARED', '1') == '0':
        os.execv(sys.executable, [sys.executable, os.path.join(HERE, '__main__.py')] + sys.argv[1:])
    here = passdir.path()
    for _ in range(3):
        got = _instance(here)
        if got is not None:
            break
        time.sleep(0.2)
    else:
        sys.stderr.write('gpuhost: the provider plugin ended before it served this instance (%s)\n'
                         % os.path.join(here, 'plugin.log'))
        sys.exit(1)
    conn, line = got
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: os._exit(0))
    sys.stdout.write(line.decode())
    sys.stdout.flush()
    # Until the engine ends this stub, the serving process ends, or the CLI is gone (a CLI that exits without ending
    # its plugins leaves this stub to another parent).
    conn.settimeout(1.0)
    while os.getppid() == cli:
        try:
            if not conn.recv(4096):
                break
        except socket.timeout:
            continue
        except OSError:
            break
    os._exit(0)


if __name__ == '__main__':
    main()
