"""A fleet-wide counting semaphore in etcd (gpuhost:rollout.fleet_lock): N slots per group, one taken by a host before
a step that may stop its SGLang, kept alive while the host is down, released once it serves again - CoreOS's
FleetLock / airlock semantics, so that shard stacks run at once (CI jobs, operators' shells) never have more than N
hosts down between them.

etcd's v3 API through its JSON gateway (POST /v3/..., keys and values base64), with the standard library: the slot
keys are /gpuhost/fleetlock/<group>/slot/<i> (i < N), each holding its holder's name and put under a lease of its own
in a transaction whose compare is "the key does not exist" (create_revision 0). A thread renews the lease every ttl/3
while the slot is held; release revokes it. A holder that dies - a killed runner, a lost machine - stops renewing and
etcd deletes its key when the TTL runs out: its slot is free again.

Fail closed: etcd unreachable, a login refused, an HTTP error - the caller's disruptive step is refused in one line
naming the endpoint (Refused). Nothing here runs unless a disruptive step asks for a slot. No Pulumi imports."""

from __future__ import annotations

import base64
import dataclasses
import json
import ssl
import threading
import time
import urllib.error
import urllib.request
from typing import Callable, Optional

from transport.operator import OperatorError, info, pause, warn

PREFIX = '/gpuhost/fleetlock/'
HTTP_TIMEOUT_S = 5.0


class Refused(OperatorError):
    """The lock cannot be taken (etcd unreachable, a login refused, an HTTP error): the step it guards does not
    start. One line, naming the endpoint; never the password."""


@dataclasses.dataclass(frozen=True)
class Settings:
    group: str
    slots: int
    endpoints: tuple
    ttl_s: float = 60.0
    user: Optional[str] = None
    password: Optional[str] = dataclasses.field(default=None, repr=False)
    ca_file: Optional[str] = None
    cert_file: Optional[str] = None
    key_file: Optional[str] = None

    @classmethod
    def of(cls, plain: dict, secret: Optional[dict] = None) -> 'Settings':
        """From the `fleet_lock` of a host's rollout input (plain) and the provider configuration's (the password)."""
        secret = secret or {}
        return cls(group=plain['group'], slots=int(plain['slots']), endpoints=tuple(plain['endpoints']),
                   ttl_s=float(plain.get('ttl_s') or 60), user=plain.get('user'), password=secret.get('password'),
                   ca_file=plain.get('ca_file'), cert_file=plain.get('cert_file'), key_file=plain.get('key_file'))

    def key(self, i: int) -> str:
        return '%s%s/slot/%d' % (PREFIX, self.group, i)

    def words(self) -> str:
        return 'fleet lock %s (%d slot%s, etcd %s)' % (self.group, self.slots, '' if self.slots == 1 else 's',
                                                       ', '.join(self.endpoints))


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _unb64(text: str) -> str:
    return base64.b64decode(text or '').decode(errors='replace')


def _prefix_end(prefix: str) -> str:
    """etcd's range_end for every key under prefix: the prefix with its last byte incremented."""
    raw = prefix.encode()
    return base64.b64encode(raw[:-1] + bytes([raw[-1] + 1])).decode()


class Client:
    """One group's etcd, endpoint after endpoint: the first that answers serves the call."""

    def __init__(self, settings: Settings):
        self.s = settings
        self._token = None
        self._lock = threading.Lock()
        self._ctx = None
        if any(e.startswith('https:') for e in settings.endpoints):
            try:
                self._ctx = ssl.create_default_context(cafile=settings.ca_file)
                if settings.cert_file:
                    self._ctx.load_cert_chain(settings.cert_file, settings.key_file)
            except (OSError, ssl.SSLError) as e:
                raise Refused('%s: the TLS files cannot be used (%s); fix gpuhost:rollout.fleet_lock.ca_file / '
                              'cert_file / key_file' % (settings.words(), getattr(e, 'strerror', None) or e)) from None

    def call(self, path: str, body: dict) -> dict:
        """POST /v3/<path> on the first endpoint that answers; a stale login token is renewed once."""
        with self._lock:
            token = self._token
        if self.s.user and token is None:
            token = self._authenticate()
        try:
            return self._post(path, body, token)
        except _Unauthorized as e:
            if not self.s.user:
                raise Refused('%s: etcd %s refused the call (%s): it requires a login - set '
                              'gpuhost:rollout.fleet_lock.user and password' % (self.s.words(), e.args[1], e.args[0])
                              ) from None
        try:
            return self._post(path, body, self._authenticate())
        except _Unauthorized as e:
            raise Refused('%s: etcd %s refused user %s (%s); grant it read and write on %s%s/' % (
                self.s.words(), e.args[1], self.s.user, e.args[0], PREFIX, self.s.group)) from None

    def _authenticate(self) -> str:
        try:
            doc = self._post('auth/authenticate', {'name': self.s.user, 'password': self.s.password or ''}, None)
        except _Unauthorized as e:
            doc = {'error': e.args[0], '_endpoint': e.args[1]}
        token = doc.get('token')
        if not token:
            raise Refused('%s: etcd %s refused the login of user %s (%s); check gpuhost:rollout.fleet_lock.user and '
                          'its password' % (self.s.words(), doc.get('_endpoint', self.s.endpoints[0]), self.s.user,
                                            doc.get('error') or 'no token'))
        with self._lock:
            self._token = token
        return token

    def _post(self, path: str, body: dict, token: Optional[str]) -> dict:
        data = json.dumps(body).encode()
        failures, tls = [], False
        for endpoint in self.s.endpoints:
            request = urllib.request.Request('%s/v3/%s' % (endpoint, path), data=data, method='POST',
                                             headers={'Content-Type': 'application/json',
                                                      **({'Authorization': token} if token else {})})
            try:
                with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S, context=self._ctx) as r:
                    doc = json.loads(r.read() or b'{}')
                    doc['_endpoint'] = endpoint
                    return doc
            except urllib.error.HTTPError as e:
                try:
                    doc = json.loads(e.read() or b'{}')
                except ValueError:
                    doc = {}
                text = doc.get('error') or doc.get('message') or 'HTTP %d' % e.code
                if path == 'auth/authenticate' or e.code == 401 or 'auth token' in text or 'user name is empty' in text:
                    raise _Unauthorized(text, endpoint) from None
                if 'lease not found' in text:
                    raise LeaseGone(text) from None
                if e.code >= 500 and endpoint != self.s.endpoints[-1]:
                    # A member without a leader, or one whose gateway cannot reach it: the next member may answer.
                    failures.append('%s (HTTP %d: %s)' % (endpoint, e.code, text))
                    continue
                raise Refused('%s: etcd %s answered /v3/%s with HTTP %d: %s%s; the step that takes the host down is '
                              'not started (fail closed)' % (self.s.words(), endpoint, path, e.code, text,
                                                             ''.join(' (before it: %s)' % f for f in failures)
                                                             )) from None
            except (urllib.error.URLError, OSError, ValueError) as e:
                reason = getattr(e, 'reason', None) or e
                tls = tls or isinstance(e, ssl.SSLError) or isinstance(reason, ssl.SSLError)
                failures.append('%s (%s)' % (endpoint, getattr(reason, 'strerror', None) or reason))
        raise Refused('%s: etcd unreachable: %s; the step that takes the host down is not started (fail closed) - '
                      '%s, then re-run `pulumi up`' % (
                          self.s.words(), '; '.join(failures),
                          'the TLS handshake failed: fix gpuhost:rollout.fleet_lock.ca_file (etcd\'s CA), cert_file '
                          'and key_file (a client certificate etcd trusts)' if tls else
                          'start etcd or fix gpuhost:rollout.fleet_lock.endpoints'))

    # -- the protocol

    def holders(self) -> dict:
        """{slot index: holder} of the group's slots held now (indexes below N)."""
        prefix = '%s%s/slot/' % (PREFIX, self.s.group)
        doc = self.call('kv/range', {'key': _b64(prefix), 'range_end': _prefix_end(prefix)})
        out = {}
        for kv in doc.get('kvs') or []:
            tail = _unb64(kv.get('key'))[len(prefix):]
            if tail.isdigit() and int(tail) < self.s.slots:
                out[int(tail)] = _unb64(kv.get('value'))
        return out

    def grant(self) -> str:
        doc = self.call('lease/grant', {'TTL': int(max(1, round(self.s.ttl_s)))})
        return str(doc['ID'])

    def keepalive(self, lease: str) -> int:
        """The lease's TTL after the renewal; 0: it had expired (its keys are gone)."""
        doc = self.call('lease/keepalive', {'ID': lease})
        return int((doc.get('result') or {}).get('TTL') or 0)

    def revoke(self, lease: str) -> None:
        try:
            self.call('lease/revoke', {'ID': lease})
        except LeaseGone:
            pass   # expired already: its keys are gone

    def put_if(self, i: int, holder: str, lease: str, compare: dict) -> bool:
        key = _b64(self.s.key(i))
        doc = self.call('kv/txn', {'compare': [dict(compare, key=key)],
                                   'success': [{'request_put': {'key': key, 'value': _b64(holder), 'lease': lease}}],
                                   'failure': []})
        return bool(doc.get('succeeded'))


class _Unauthorized(Exception):
    pass


class LeaseGone(Exception):
    pass


class Slot:
    """A slot held: its lease renewed every ttl/3 by a thread of its own until release()."""

    def __init__(self, client: Client, index: int, holder: str, lease: str):
        self.client, self.index, self.holder, self.lease = client, index, holder, lease
        self._stop = threading.Event()
        self.lost = None   # why the lease was lost (its TTL ran out while etcd could not be reached)
        self._thread = threading.Thread(target=self._renew, name='gpuhost-fleetlock', daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        period = max(0.2, self.client.s.ttl_s / 3.0)
        said = False
        while not self._stop.wait(period):
            try:
                if self.client.keepalive(self.lease) <= 0:
                    self.lost = 'its lease expired'
                said = False
            except Refused as e:
                # etcd out of reach for a moment: the lease runs on until its TTL; the next renewal may still come.
                if not said:
                    warn('%s: slot %d of %s not renewed (%s); trying again every %g s' % (
                        self.holder, self.index, self.client.s.words(), e, period))
                    said = True
            except (LeaseGone, _Unauthorized):
                self.lost = 'its lease expired'
            if self.lost:
                warn('%s: slot %d of %s was lost (%s): etcd may let another host down beyond the limit' % (
                    self.holder, self.index, self.client.s.words(), self.lost))
                return

    def stop_keepalive(self) -> None:
        """The renewals stop, the slot is kept until its TTL runs out (a runner killed mid-step, as etcd sees it)."""
        self._stop.set()
        self._thread.join()

    def release(self) -> None:
        self.stop_keepalive()
        self.client.revoke(self.lease)


def acquire(settings: Settings, holder: str, who: str, then: str, poll_s: float = 1.0,
            stop: Optional[Callable[[], None]] = None, client: Optional[Client] = None) -> Slot:
    """A slot of settings' group for `holder` (host and stack): the slot it holds already (the same holder, from an
    earlier run whose lease still runs: taken over onto a lease of this process), else a free one; while all N are
    held, waits - one line naming who holds them, again when that changes - until one frees. `who`, `then`: what a
    Ctrl-C's line says (the step and what it leaves as it was); stop(): raises to end the wait (the rollout stopped).
    Raises Refused (etcd unreachable, a login refused) and Interrupted (Ctrl-C)."""
    client = client or Client(settings)
    said = None
    while True:
        held = client.holders()
        mine = [i for i, h in held.items() if h == holder]
        free = [i for i in range(settings.slots) if i not in held]
        for i, compare in ([(mine[0], {'target': 'VALUE', 'result': 'EQUAL', 'value': _b64(holder)})] if mine else
                           [(i, {'target': 'CREATE', 'result': 'EQUAL', 'create_revision': '0'}) for i in free[:1]]):
            lease = client.grant()
            if client.put_if(i, holder, lease, compare):
                if said is not None:
                    info('%s: took slot %d of %s' % (who, i, settings.words()))
                return Slot(client, i, holder, lease)
            client.revoke(lease)
            break   # another runner took it first: read again
        else:
            text = ', '.join('%d: %s' % (i, h) for i, h in sorted(held.items()))
            if text != said:
                info('%s: waiting for a slot of %s - all held (%s)' % (who, settings.words(), text))
                said = text
            if stop is not None:
                stop()
            pause(poll_s, who, 'a slot of %s (held by %s)' % (settings.words(), text), then)
