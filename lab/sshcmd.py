#!/usr/bin/python3 -S
"""The armed half of the lab's sshd ForceCommand (lab/sshcmd.sh counts and logs every command and
hands the one a test armed a drop for to this script), and summary(), which tests/lablib.py uses to
name logged commands.

    sshcmd.py LAB N ARM      ARM: {"at": N, "mode": "before"|"after"|"during", "stdin_bytes": null|int}

A drop SIGKILLs this connection's sshd processes ("sshd: root@notty" and its "[priv]" monitor), so
the client sees the TCP connection end without an exit status and without SSH's disconnect message,
as when a host or a network path dies:
  before  nothing of the command runs;
  after   the command runs to completion (its output reaches the client as it is written), then the
          connection dies before the exit status is sent;
  during  the command starts and receives the first stdin_bytes (default: half) of what the client
          sent on stdin; once it has read them the connection dies, then its stdin ends there (an
          upload cut short); it runs on with its output going nowhere (a write gets EPIPE/SIGPIPE),
          as a real orphaned command does.
For 'after' and 'during' the command's exit code on the host is logged in LAB/control/ssh-results.log
({"n", "exit", and for 'during' "stdin_sent", "stdin_total"}).

Stdlib only, no site packages (runs under the lab host's python3).
"""

import fcntl
import os
import sys
import time


def skip_word(text, i):
    """Index after the shell word starting at text[i] (quotes and backslashes as sh reads them)."""
    n = len(text)
    while i < n and text[i] not in ' \t\n':
        c = text[i]
        if c == "'":
            j = text.find("'", i + 1)
            i = n if j < 0 else j + 1
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == '\\' else 1
            i += 1
        elif c == '\\':
            i += 2
        else:
            i += 1
    return i


def next_word(text, i):
    """(the shell word at or after text[i], as written; the index after it)."""
    while i < len(text) and text[i] in ' \t\n':
        i += 1
    j = skip_word(text, i)
    return text[i:j], j


# How hostscripts/guard.sh begins: the program sends each script inside it,
# `exec bash -c '<guard>' NAME LIMIT GRACE '<script>' ARG...`.
GUARD = "'set -euo pipefail\n# guard.sh "


def summary(command):
    """What a command is, in at most 80 characters: for `bash -c '<script>' name args...` (how the
    program sends its scripts, inside its guard or not) the name and arguments as sent, else the command
    line itself."""
    if command is None:
        return '(shell)'
    text = command.lstrip()
    if text.startswith('exec '):
        text = text[5:].lstrip()
    for prefix in ('bash -c ', '/bin/bash -c ', 'sh -c ', '/bin/sh -c '):
        if text.startswith(prefix):
            script, i = next_word(text, len(prefix))
            if script.startswith(GUARD):
                name, i = next_word(text, i)
                for _ in range(3):      # LIMIT GRACE '<script>'
                    _, i = next_word(text, i)
                text = name + ' ' + text[i:].strip()
            elif text[i:].strip():
                text = text[i:].strip()
            break
    return ' '.join(text.split())[:80]


def session_pids():
    """This connection's sshd processes: the ancestors named 'sshd: ...' (not the listener)."""
    out = []
    pid = os.getppid()
    while pid > 1:
        try:
            with open('/proc/%d/cmdline' % pid, 'rb') as f:
                cmd = f.read().split(b'\0')[0]
            with open('/proc/%d/stat' % pid) as f:
                ppid = int(f.read().rsplit(')', 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        if b'[listener]' in cmd:
            break
        if cmd.startswith(b'sshd: '):
            out.append(pid)
        elif out:
            break
        pid = ppid
    return out


def drop_connection():
    import signal
    for pid in session_pids():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def shell_argv(command):
    import pwd
    try:
        shell = pwd.getpwuid(os.getuid()).pw_shell or '/bin/sh'
    except KeyError:
        shell = '/bin/sh'
    if command is None:
        return shell, ['-' + os.path.basename(shell)]
    if command.strip() in ('internal-sftp', '/usr/lib/openssh/sftp-server'):
        return '/usr/lib/openssh/sftp-server', ['sftp-server']
    return shell, [os.path.basename(shell), '-c', command]


def read_all_stdin(idle=2.0):
    """What the client sends on stdin until it closes it (or stays silent for `idle` seconds)."""
    import select
    chunks = []
    while True:
        ready, _, _ = select.select([0], [], [], idle)
        if not ready:
            break
        data = os.read(0, 65536)
        if not data:
            break
        chunks.append(data)
    return b''.join(chunks)


def write_all(fd, data, timeout=10.0):
    """Write data to a pipe the child may or may not read (never block for longer than timeout)."""
    import select
    os.set_blocking(fd, False)
    deadline = time.time() + timeout
    view = memoryview(data)
    while view and time.time() < deadline:
        _, ready, _ = select.select([], [fd], [], 0.2)
        if ready:
            try:
                view = view[os.write(fd, view):]
            except BlockingIOError:
                continue
            except BrokenPipeError:
                break
    return len(data) - len(view)


def wait_drained(fd, timeout=5.0):
    """Until the command has read everything written to its stdin pipe (or timeout)."""
    import array
    import termios
    deadline = time.time() + timeout
    buf = array.array('i', [0])
    while time.time() < deadline:
        fcntl.ioctl(fd, termios.FIONREAD, buf, True)
        if buf[0] == 0:
            return
        time.sleep(0.01)


def main():
    import json
    import signal
    lab, n, drop = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    command = os.environ.pop('SSH_ORIGINAL_COMMAND', None)
    os.environ.pop('SHLVL', None)
    exe, argv = shell_argv(command)

    def result(**fields):
        with open(os.path.join(lab, 'control', 'ssh-results.log'), 'a') as log:
            log.write(json.dumps(dict({'n': n}, **fields)) + '\n')

    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    mode = drop.get('mode', 'before')
    if mode == 'after':
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
            os.execv(exe, argv)
        _, status = os.waitpid(pid, 0)
        # Let the output the command wrote reach the client; the exit status never does.
        time.sleep(0.3)
        drop_connection()
        result(exit=os.waitstatus_to_exitcode(status))
    elif mode == 'during':
        data = read_all_stdin()
        cut = drop.get('stdin_bytes')
        cut = len(data) // 2 if cut is None else max(0, min(int(cut), len(data)))
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(w)
            os.dup2(r, 0)
            os.close(r)
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
            os.execv(exe, argv)
        os.close(r)
        sent = write_all(w, data[:cut])
        wait_drained(w)
        drop_connection()
        time.sleep(0.1)
        os.close(w)
        _, status = os.waitpid(pid, 0)
        result(exit=os.waitstatus_to_exitcode(status), stdin_sent=sent, stdin_total=len(data))
    else:
        drop_connection()
    os._exit(255)


if __name__ == '__main__':
    main()
