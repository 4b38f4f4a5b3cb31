"""The operator's own directory for one engine pass (standard library only: the plugin's stub imports it).

The engine starts its plugins afresh for each pass (a preview, the update after it, a refresh), each with the engine's
address as an argument. A pass is keyed by the CLI (the plugin's parent, with its start time: a pid can be reused)
and that address: `$TMPDIR/gpuhost-rollout-<uid>/<cli pid>-<cli start>-<engine port>/`, mode 0700, holding the pass's
one serving process's socket (provider/stub.py) and the rollout's records (provider/rollout.py) - host names and
states, never a secret. Directories of CLIs that ended are removed when a pass starts."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

ENV = 'GPUHOST_PASS_DIR'   # set for the pass's serving process, which is not the CLI's child


def base() -> str:
    path = os.path.join(tempfile.gettempdir(), 'gpuhost-rollout-%d' % os.getuid())
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if st.st_uid != os.getuid() or (st.st_mode & 0o077):
        raise RuntimeError('%s is not the operator\'s own private directory (owner %d, mode %o)' % (
            path, st.st_uid, st.st_mode & 0o777))
    return path


def start_time(pid: int) -> str | None:
    try:
        with open('/proc/%d/stat' % pid) as f:
            return f.read().rpartition(')')[2].split()[19]
    except (OSError, IndexError):
        return None


def sweep(root: str) -> None:
    """Directories of CLIs that are gone (or whose pid now names another process)."""
    for name in os.listdir(root):
        pid, _, rest = name.partition('-')
        start = rest.partition('-')[0]
        if pid.isdigit() and start_time(int(pid)) != start:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def engine_address() -> str | None:
    """The engine's address, which it passes to every provider plugin as an argument."""
    for a in sys.argv[1:]:
        host, _, port = a.rpartition(':')
        if host in ('127.0.0.1', 'localhost', '[::1]') and port.isascii() and port.isdigit():
            return a
    return None


def path() -> str:
    """This pass's directory, made (and the ended passes' swept) on first use in a process."""
    given = os.environ.get(ENV)
    if given:
        return given
    root = base()
    sweep(root)
    cli = os.getppid()
    engine = (engine_address() or 'none').rpartition(':')[2]
    here = os.path.join(root, '%d-%s-%s' % (cli, start_time(cli) or '0', engine))
    os.makedirs(here, mode=0o700, exist_ok=True)
    return here
