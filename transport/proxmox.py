"""The Proxmox API as the serving classes reach it (resources/pve.py, resources/container.py, resources/pcimap.py):
one proxmoxer client per endpoint and process (client), a request as one line for the operator on failure with
Proxmox's advice and retries for reads (api_call), a task followed to its end (wait_task). No Pulumi here."""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import threading
import time

from transport.operator import CANCELLED, Interrupted, OperatorError


class PveError(OperatorError):
    pass


# ------------------------------------------------------------------ the client

_clients = {}
_clients_lock = threading.Lock()        # the tables only, never held across a login
_login_locks = {}
CA_KEEP_DAYS = 30


def _ca_file(pem: str) -> str:
    """The CA as a file for requests' verify= (proxmoxer logs in with a bare `requests.post`, which takes a
    path only). A CA certificate is public, so it is kept by content in the user's cache - one file per CA,
    shared by every run, written whole (temp file + rename) - rather than in a temp directory per process: the
    engine ends provider processes without running their exit handlers, and each run left one behind. A run
    touches its file; files no run has used for CA_KEEP_DAYS (labs' throw-away CAs) are pruned."""
    import hashlib
    base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    folder = os.path.join(base, 'gpuhost', 'ca')
    os.makedirs(folder, mode=0o700, exist_ok=True)
    path = os.path.join(folder, hashlib.sha256(pem.encode()).hexdigest()[:32] + '.pem')
    try:
        os.utime(path)
        return path
    except FileNotFoundError:
        pass
    fd, tmp = tempfile.mkstemp(dir=folder, prefix='.new-')
    with os.fdopen(fd, 'w') as f:
        f.write(pem)
    os.replace(tmp, path)
    cutoff = time.time() - CA_KEEP_DAYS * 86400
    for name in os.listdir(folder):
        try:
            if os.stat(os.path.join(folder, name)).st_mtime < cutoff:
                os.unlink(os.path.join(folder, name))
        except OSError:
            pass
    return path


@contextlib.contextmanager
def client(api: dict):
    """A proxmoxer client for root@pam with a password ticket; TLS verified against the given CA. One
    login per endpoint and process, shared by every resource of the run (a provider process serves
    them all). The login is retried on connection errors (it changes nothing); a refused one is not."""
    import hashlib
    key = (api['host'], str(api['port']), api['user'], hashlib.sha256(api['password'].encode()).hexdigest(),
           hashlib.sha256(api['ca_cert'].encode()).hexdigest())
    # A lock per endpoint around its login: one host's slow or retried login never holds up another's.
    with _clients_lock:
        lock = _login_locks.setdefault(key, threading.Lock())
    with lock:
        with _clients_lock:
            prox = _clients.get(key)
        if prox is None:
            prox = _login(api)
            with _clients_lock:
                _clients[key] = prox
    yield prox


def _login(api: dict):
    import proxmoxer
    import requests
    ca = _ca_file(api['ca_cert'])
    where = '%s:%s' % (api['host'], api['port'])
    for attempt in range(READ_ATTEMPTS):
        try:
            prox = proxmoxer.ProxmoxAPI(api['host'], port=int(api['port']), user=api['user'],
                                        password=api['password'], verify_ssl=ca,
                                        timeout=float(api.get('timeout', 30)))
            break
        except proxmoxer.AuthenticationError:
            raise PveError('Proxmox API at %s refused the login of %s (gpuhost:host.api.password); check the '
                           'password of %s' % (where, api['user'], api['user'])) from None
        except requests.exceptions.SSLError as e:
            raise PveError('Proxmox API at %s: TLS certificate not trusted (%s); check gpuhost:host.api.ca_cert '
                           '(/etc/pve/pve-root-ca.pem on the host)' % (where, reason(e))) from None
        except (requests.exceptions.RequestException, OSError) as e:
            if attempt + 1 < READ_ATTEMPTS:
                retry_pause('Proxmox API at %s: login' % where, attempt, e)
                continue
            raise PveError('cannot reach the Proxmox API at %s (%s) after %d attempts; nothing was changed. Check '
                           'that pveproxy runs and the address is right, then re-run' % (
                               where, reason(e), READ_ATTEMPTS)) from None
    # Kept for one re-login when Proxmox revokes the ticket mid-run (401): a refused request was
    # not executed, so it is safe to send again.
    prox._backend.auth._gpuhost_password = api['password']
    return prox


READ_ATTEMPTS = 5


def backoff(attempt: int) -> float:
    return 0.5 * (2 ** attempt)


def retry_pause(what: str, attempt: int, e: BaseException, cancel: bool = True) -> None:
    """The pause before a read's next attempt; an interrupt (the plugin's Cancel) ends it and the retries."""
    if not cancel:
        time.sleep(backoff(attempt))
    elif CANCELLED.wait(backoff(attempt)):
        raise Interrupted('%s: failed (%s) and the run was interrupted (Ctrl-C): no further attempt; nothing '
                                'was changed' % (what, reason(e)))


def reason(e: BaseException) -> str:
    """One short line for a transport error (requests nests the useful part deep in its message)."""
    text = str(e)
    for marker in ('Connection refused', 'Connection reset by peer', 'Read timed out', 'timed out',
                   'RemoteDisconnected', 'Remote end closed connection', 'Name or service not known',
                   'No route to host', 'certificate verify failed', 'Connection aborted'):
        if marker in text:
            return marker
    return (type(e).__name__ + ': ' + text)[:160]


# Proxmox's own words for conditions an operator can act on, and what to do.
ADVICE = (
    ('is locked', 'another task holds the guest\'s lock (backup, migration, snapshot); wait for it to finish (or '
                  '`pct unlock`/`qm unlock` if it is stale), then re-run'),
    ('no quorum', 'the cluster has lost quorum and refuses changes; check `pvecm status`, re-run once it is quorate'),
    ('cluster not ready', 'the cluster has lost quorum and refuses changes; check `pvecm status`, re-run once it is '
                          'quorate'),
    ('got lock request timeout', 'the cluster file system was busy (cfs lock timeout); re-run'),
    ('can\'t lock file', 'the guest\'s config file is locked by another task; re-run when it has finished'),
    ('hostname lookup', 'the node is not part of the cluster; check gpuhost:host.node'),
    ('offline', 'the node is offline; bring it back, then re-run'),
    ('no route to host', 'the node is unreachable from the API node; check the cluster network, then re-run'),
    ('does not exist', 'it is gone on the Proxmox side; `pulumi refresh` updates the state'),
    # (only a guest's vmid: Proxmox says "CT 200 already exists on node ..." / "VM 300 already exists"; a disk image
    # or a mapping that exists is another matter)
    (re.compile(r'\b(CT|VM) \d+ already exists', re.I), 'a guest with this vmid runs on the host but this stack does not hold it. To take it in as it '
                       'is (nothing recreated; preview shows what `up` would change), set adopt: true in its section '
                       '(gpuhost:container or gpuhost:vm) - docs/operator-guide.md, "Adopting a running deployment"; '
                       'if it holds nothing, remove it instead (pct destroy / qm destroy)'),
)


def advice(text: str) -> str:
    low = text.lower()
    return next((a for marker, a in ADVICE
                 if (marker.search(text) if hasattr(marker, 'search') else marker.lower() in low)), '')


def api_call(what: str, fn, *args, read: bool = False, cancel: bool = True, **kwargs):
    """One API request, as one line on failure: the request (`what`: guest and operation), Proxmox's
    answer or the transport error, and what to do. Reads (read=True) are retried with backoff on
    transport errors and 5xx answers that mean "try again"; writes are never retried blindly - only
    after a 401 (a revoked or expired ticket: the request was refused, not executed), once. A read's retries end
    at the operator's Ctrl-C (the plugin's Cancel), unless cancel=False: the reads that follow a change to its end."""
    import proxmoxer
    import requests
    relogged = False
    attempt = 0
    while True:
        try:
            return fn(*args, **kwargs)
        except proxmoxer.ResourceException as e:
            if e.status_code == 401 and not relogged and _relogin(fn):
                relogged = True
                continue
            detail = '; '.join('%s: %s' % kv for kv in sorted((e.errors or {}).items())) or \
                (e.content or '').strip()
            transient = e.status_code in (502, 503, 504, 595, 596) and 'offline' not in detail.lower()
            if read and transient and attempt + 1 < READ_ATTEMPTS:
                retry_pause(what, attempt, e, cancel)
                attempt += 1
                continue
            text = '%s %s%s' % (e.status_code, e.status_message, ' (%s)' % detail if detail else '')
            tip = advice(text) or ('the ticket was refused again after a fresh login; check the user\'s permissions'
                                   if e.status_code == 401 else '')
            raise PveError('%s: Proxmox answered %s%s' % (what, text, '; ' + tip if tip else '')) from None
        except (requests.exceptions.RequestException, OSError) as e:
            if read and attempt + 1 < READ_ATTEMPTS:
                retry_pause(what, attempt, e, cancel)
                attempt += 1
                continue
            where = getattr(fn, '__self__', None)
            raise PveError('%s: connection to the Proxmox API lost (%s)%s; %s' % (
                what, reason(e), ' after %d attempts' % READ_ATTEMPTS if read else '',
                'nothing was changed, re-run' if read else
                'the request was sent once and not retried (it changes state): it may or may not have been applied '
                '- re-run, which reads the guest first and applies only what is still missing')) from None


def _relogin(fn) -> bool:
    try:
        auth = fn.__self__._store['session'].auth
        auth._get_new_tokens(password=auth._gpuhost_password)
        return True
    except Exception:  # noqa: BLE001 - no fresh ticket: report the 401 itself
        return False


def wait_task(prox, node: str, upid, what: str, timeout: float = 600.0) -> None:
    """Wait for a Proxmox task; its status is read with the same retries as any read."""
    if not isinstance(upid, str) or not upid.startswith('UPID:'):
        return
    task = prox.nodes(node).tasks(upid).status
    deadline = time.monotonic() + timeout
    while True:
        status = api_call('%s (task status)' % what, task.get, read=True, cancel=False)
        if status.get('status') == 'stopped':
            break
        if time.monotonic() > deadline:
            raise PveError('%s: the Proxmox task %s is still running after %d s; it was not stopped - watch it in '
                           'the task log, then re-run' % (what, upid, timeout))
        # Not ended by a Cancel: the task is the step's change (a guest created, started, its config set), and the
        # state records it only when the step completes - a guest made by a task the run stopped following would
        # be one the stack does not hold ("CT 200 already exists" next time).
        time.sleep(0.2)
    if status.get('exitstatus') != 'OK':
        text = str(status.get('exitstatus'))
        tip = advice(text)
        raise PveError('%s failed: %s%s' % (what, text, '; ' + tip if tip else ''))
