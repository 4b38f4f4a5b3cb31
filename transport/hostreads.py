"""One SSH command for the reads of a host that arrive together (issue 45: one read of the host per pass).

A refresh reads every resource of a host side by side: the kernel command line, the VFIO binding, the host's
status and the PCI mappings each ask for host_facts.sh, each host file for read_file.sh, the collector for
collector_facts.sh, the unit for ct_unit_facts.sh. Inside a Read (remote.reading()), remote.run hands such a read
to this module instead of opening a channel of its own:

  * reads that arrive while another batch of the same host is on the wire, or within GATHER_S of the first, go
    out together as one command (hostscripts/read_batch.sh runs each script exactly as it would run
    alone, side by side, and sends back each one's exit status, stdout and stderr);
  * the same script with the same arguments is asked once: a read that succeeded is reused for FRESH_S by the
    reads of this process (a refresh pass);
  * any command on the host outside a Read (a write, a restart, a job, a create's or update's own fresh reads)
    forgets what was read of it first: nothing that changes the host is ever decided from a read made before it.
    A Read changes nothing the reads see (the model's quick look writes only its own cache of sums). One read of a
    batch may have input (the model's quick look gets its verifier on stdin): it gets the batch's stdin.

A read that fails on the host (its own exit status) is that read's result, as it would be alone; a batch that
cannot run (the connection lost, the time limit) fails every read in it, each naming what was being read.
"""

from __future__ import annotations

import threading
import time

GATHER_S = 0.05
FRESH_S = 15.0


class _Batch:
    def __init__(self):
        self.keys, self.results, self.error, self.done = [], {}, None, False
        self.stdin = None   # the one read of the batch that gets the batch's stdin (the model's quick look)


class _Host:
    def __init__(self):
        self.cond = threading.Condition()
        self.gathering = _Batch()
        self.busy = False
        self.memo = {}      # key -> (Result, when)
        self.epoch = 0      # counts the commands that changed the host


_hosts = {}
_lock = threading.Lock()


def _host(key) -> _Host:
    with _lock:
        return _hosts.setdefault(key, _Host())


def forget(key) -> None:
    """Another command runs on the host: what was read of it is old."""
    with _lock:
        h = _hosts.get(key)
    if h is not None:
        with h.cond:
            h.memo.clear()
            h.epoch += 1


def read(key, name: str, args, run_batch, stdin: bytes = None):
    """The result of script `name` with `args` (and `stdin`) on the host `key`, read with whatever else is being read
    of it. run_batch(keys) -> {key: Result} runs one batch (raises for the whole batch); a key is (name, args), or
    (name, args, stdin) for a read with input - at most one such read a batch."""
    want = (name, tuple(str(a) for a in args)) + (() if stdin is None else (bytes(stdin),))
    h = _host(key)
    with h.cond:
        hit = h.memo.get(want)
        if hit is not None and time.monotonic() - hit[1] < FRESH_S:
            return hit[0]
        mine = h.gathering
        while stdin is not None and mine.stdin not in (None, want):
            h.cond.wait()          # the batch gathering now has its read with input: the next one
            mine = h.gathering
        if stdin is not None:
            mine.stdin = want
        if want not in mine.keys:
            mine.keys.append(want)
        while not mine.done:
            if h.busy:
                h.cond.wait()
                continue
            # The leader: the reads of this host arriving in the next moment join this batch.
            h.busy = True
            h.cond.wait(GATHER_S)
            batch, h.gathering, epoch = h.gathering, _Batch(), h.epoch
            h.cond.notify_all()
            h.cond.release()
            try:
                results, error = run_batch(list(batch.keys)), None
            except BaseException as e:  # noqa: B902 - handed to every read of the batch, raised in each
                results, error = {}, e
            finally:
                h.cond.acquire()
            batch.results, batch.error, batch.done = results, error, True
            if error is None and epoch == h.epoch:
                now = time.monotonic()
                h.memo.update({k: (r, now) for k, r in results.items() if r.exit_code == 0})
            h.busy = False
            h.cond.notify_all()
    if mine.error is not None:
        e = mine.error
        try:
            copy = type(e)(*e.args)
        except Exception:
            copy = e
        raise copy from None
    return mine.results[want]


def batch_args(keys, script) -> list:
    """read_batch.sh's arguments for keys [(name, args[, stdin])]: what is read, the requests (and which one reads
    the batch's stdin, -1 for none), each script's body once."""
    names = sorted({k[0] for k in keys})
    out = [','.join(names), str(len(keys)), str(next((i for i, k in enumerate(keys) if len(k) > 2), -1))]
    for k in keys:
        out += [k[0], str(len(k[1]))] + list(k[1])
    for name in names:
        out += [name, script(name)]
    return out


def batch_stdin(keys):
    """The batch's stdin: the input of its one read that has any (None: none has)."""
    return next((k[2] for k in keys if len(k) > 2), None)


def parse_batch(data: bytes, keys, result_type) -> dict:
    """read_batch.sh's output -> {key: Result} (pure; unit-tested). A request missing from it is an error."""
    out, i = {}, 0
    while i < len(data):
        nl = data.index(b'\n', i)
        tag, index, rc, n_out, n_err = data[i:nl].decode().split('\t')
        if tag != 'gpuhost-batch':
            raise ValueError('read_batch.sh: not a record header at byte %d' % i)
        start = nl + 1
        o = data[start:start + int(n_out)]
        e = data[start + int(n_out):start + int(n_out) + int(n_err)]
        out[keys[int(index)]] = result_type(o.decode('utf-8', 'replace'), e.decode('utf-8', 'replace'), int(rc))
        i = start + int(n_out) + int(n_err)
    missing = [k[0] for k in keys if k not in out]
    if missing:
        raise ValueError('read_batch.sh ended before the results of %s' % ', '.join(missing))
    return out
