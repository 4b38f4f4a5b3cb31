"""How `pct` on the lab host enters a lab container: a small broker in the lab daemon.

The host (lab/labhost.py) and the containers (lab/container.py) are sibling machines of systemd-nspawn, each
in its own PID namespace. The real `pct exec` runs lxc-attach, which enters the container's namespaces from
the host; from inside the lab host that cannot work - setns() into a PID namespace that is not a descendant
of one's own is refused. So `pct` (lab/faketools.py, inside the host) asks the lab daemon, which runs on the
machine, over a unix socket bind-mounted into the host (LAB/run/pct.sock):

    request   the container's vmid and the command's argv (JSON), and three file descriptors passed
              with SCM_RIGHTS: the command's stdin, stdout and stderr - pct's own for `pct exec`, a file
              for `pct push` (stdin) and `pct pull` (stdout)
    answer    {"exit": N}, {"signal": N} or {"error": "..."}, once the command has ended

The daemon runs lab/container.py's nsenter into the container (every namespace of its PID 1, its root, a
clean environment) with exactly those descriptors, so the command reads and writes pct's pipes itself -
sshd's, for a command over SSH - and its exit status is pct's. Only that: the vmid must name a running lab
container, and nothing but the nsenter into it is run. The command is the daemon's child, not pct's: like a
process lxc-attach started, it keeps running when the SSH session that started it drops (its output then
goes nowhere). `pct exec <vmid> -- systemd-run ...` reaches the container's own systemd, as with the real pct.
A container whose stop has begun is not running to pct (the lab daemon's check), and the stop waits while an
nsenter that passed the check gets inside (the broker holds the container's gate until nsenter has forked the
command): nsenter never meets a PID 1 that has gone, whose namespaces it could not open.

Every pct call (`pct status` too) first asks the same socket for the container's live state, which the real
pct reads on its own node (the cluster filesystem), not over the API:

    request   {"op": "status", "vmid": ..., "node": ...} (JSON), no descriptors
    answer    {"status": "running"} - the status fakepve holds for the container, the value its
              status/current answers with (the lab daemon's ct_status) - or {"status": null}: fakepve holds no
              such container on that node

So no login, no TLS and no API request per pct call, and the API's faults (injected failures, a network
scenario, an offline node) do not reach pct.

Stdlib only: the client half runs under the host's python3, in every pct call (a few thousand processes in a run of
the test suite): the server half imports contextlib, subprocess and threading where it uses them.
"""

import json
import os
import signal
import socket
import struct
import time

SOCKET = 'pct.sock'
# Real seconds the broker holds a container's gate for one nsenter getting inside at most (it takes milliseconds).
ENTER_SECS = 5.0
# A request: 4 bytes of length, then the JSON; its descriptors ride on the length's bytes.
HEADER = struct.Struct('>I')
MAX_REQUEST = 1 << 20


class BrokerError(RuntimeError):
    pass


def _recv_exact(sock, n):
    data = b''
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise BrokerError('the request ended after %d of %d bytes' % (len(data), n))
        data += chunk
    return data


# ----------------------------------------------------------------------------- the client (pct)

def call(path, vmid, argv, fds=(0, 1, 2)):
    """Run argv in container vmid with fds as its stdin, stdout, stderr; returns the answer (a dict)."""
    return _ask(path, {'vmid': str(vmid), 'argv': list(argv)}, fds)


def status(path, vmid, node):
    """The status fakepve holds for container vmid on node ('running', 'stopped', ...), or None if it holds no
    such container there."""
    answer = _ask(path, {'op': 'status', 'vmid': str(vmid), 'node': node})
    if 'error' in answer:
        raise BrokerError(answer['error'])
    return answer['status']


def _ask(path, request, fds=()):
    payload = json.dumps(request).encode()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        if fds:
            socket.send_fds(sock, [HEADER.pack(len(payload))], list(fds))
            sock.sendall(payload)
        else:
            sock.sendall(HEADER.pack(len(payload)) + payload)
        answer = b''
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    finally:
        sock.close()
    if not answer:
        raise BrokerError('the lab daemon closed the connection without an answer')
    return json.loads(answer.decode())


def exit_like(answer):
    """End this process the way the command ended: its exit code, or the signal that killed it."""
    if 'signal' in answer:
        sig = int(answer['signal'])
        if sig not in (signal.SIGKILL, signal.SIGSTOP):   # (neither can have a handler: EINVAL)
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(int(answer['exit']))


# ----------------------------------------------------------------------------- the server (labd)

class Broker(object):
    """The lab daemon's side: a thread accepting on LAB/run/pct.sock, a thread per request."""

    def __init__(self, lab, enter_argv, gate=None, ct_status=None):
        """enter_argv(vmid, argv): the nsenter command line for a running container (raises ValueError
        with the message pct prints when it is not one). gate(vmid): a lock the broker holds from that check
        until its nsenter is inside the container (has entered every namespace and forked the command), which
        the lab daemon takes before it stops the container: the check's answer still holds when nsenter acts
        on it (else a container going down between the two makes nsenter fail with its own words - `cannot
        open /proc/<pid>/ns/cgroup` - where pct says `CT <vmid> not running`). ct_status(node, vmid): the
        status fakepve holds for the container, or None (called from the request's thread); without it a
        status request is refused."""
        self.dir = os.path.join(lab, 'run')
        self.path = os.path.join(self.dir, SOCKET)
        self.enter_argv = enter_argv
        if gate is None:
            import contextlib
            gate = lambda vmid: contextlib.nullcontext()   # noqa: E731
        self.gate = gate
        self.ct_status = ct_status
        self.sock = None

    def start(self):
        import threading
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # A unix socket's address is at most 107 bytes, and a lab may live deep (a test's tmp directory): the
        # socket is bound through the directory's descriptor, whatever the path's length.
        dfd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            self.sock.bind('/proc/self/fd/%d/%s' % (dfd, SOCKET))
        finally:
            os.close(dfd)
        self.sock.listen(64)
        threading.Thread(target=self._accept, name='pct-broker', daemon=True).start()
        return self

    def stop(self):
        if self.sock is not None:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.sock.close()
            self.sock = None

    def _accept(self):
        import threading
        sock = self.sock
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return   # stopped
            threading.Thread(target=self._serve, args=(conn,), name='pct-request', daemon=True).start()

    def _serve(self, conn):
        import subprocess
        fds = []
        try:
            try:
                head, fds, _, _ = socket.recv_fds(conn, HEADER.size, 3)
                head += _recv_exact(conn, HEADER.size - len(head))
                (size,) = HEADER.unpack(head)
                if size > MAX_REQUEST:
                    raise BrokerError('a request of %d bytes' % size)
                req = json.loads(_recv_exact(conn, size).decode())
                if isinstance(req, dict) and req.get('op') == 'status':
                    proc = self._status(req, fds)
                else:
                    if len(fds) != 3:
                        raise BrokerError('a request is a vmid, an argv and three descriptors')
                    vmid, argv = str(req['vmid']), req['argv']
                    if not vmid.isdigit() or not argv or not all(isinstance(a, str) for a in argv):
                        raise BrokerError('vmid %r, argv %r: a vmid and a non-empty argv of strings' % (vmid, argv))
                    with self.gate(vmid):
                        command = self.enter_argv(vmid, argv)
                        proc = self._spawn(command, fds)
                        if isinstance(proc, subprocess.Popen):
                            self._entered(proc)
            except ValueError as e:   # not a running container: pct's own message
                answer = {'error': str(e)}
            except (BrokerError, KeyError, TypeError, OSError) as e:
                answer = {'error': 'pct: the lab daemon refused the request: %s' % e}
            else:
                answer = proc if isinstance(proc, dict) else self._wait(proc)
            for fd in fds:
                os.close(fd)
            fds = []
            try:
                conn.sendall(json.dumps(answer).encode())
            except OSError:
                pass   # pct is gone (its SSH session dropped, it was killed): the command ran all the same
        finally:
            for fd in fds:
                os.close(fd)
            conn.close()

    def _status(self, req, fds):
        """A status request's answer: {"status": what ct_status says}."""
        vmid, node = str(req.get('vmid')), req.get('node')
        if fds or not vmid.isdigit() or not isinstance(node, str) or not node:
            raise BrokerError('vmid %r, node %r: a status request is a vmid and a node, without descriptors'
                              % (vmid, node))
        if self.ct_status is None:
            raise BrokerError('no container status here')
        return {'status': self.ct_status(node, vmid)}

    @staticmethod
    def _spawn(command, fds):
        """The nsenter started with the request's descriptors (closed here: the command has them), or an answer."""
        import subprocess
        try:
            proc = subprocess.Popen(command, stdin=fds[0], stdout=fds[1], stderr=fds[2], close_fds=True,
                                    start_new_session=True)
        except OSError as e:
            return {'error': 'pct: cannot run nsenter: %s' % e}
        for fd in fds:
            os.close(fd)
        del fds[:]
        return proc

    @staticmethod
    def _entered(proc, timeout=ENTER_SECS):
        """Until nsenter is inside: it forks the command once it has entered every namespace and the root (it
        must fork to enter a PID namespace), or it has ended (its error, not the container's going down)."""
        children = '/proc/%d/task/%d/children' % (proc.pid, proc.pid)
        deadline = time.time() + timeout
        while proc.poll() is None and time.time() < deadline:
            try:
                with open(children) as f:
                    if f.read().strip():
                        return
            except OSError:
                return   # (no such file: it has just ended)
            time.sleep(0.002)
        if proc.poll() is None:
            print('labd: pct broker: nsenter %d not inside its container after %.0f s; the container\'s gate is let go'
                  % (proc.pid, timeout), flush=True)

    @staticmethod
    def _wait(proc):
        code = proc.wait()
        return {'signal': -code} if code < 0 else {'exit': code}
