"""The pattern every resource of this program follows: facts -> desired -> smallest change.

A resource's inputs are `connection` (or `api`) plus its *desired* keys. Its outputs carry the same
keys as *observed* on the host after the last create, update or refresh, plus extra facts. So:

  * diff() compares desired (new inputs) with observed (old outputs) key by key: a second `up`
    shows no changes, and after `pulumi refresh` found drift, `up` shows and repairs it;
  * read() returns the observed keys as the resource's inputs too, so the refresh itself shows
    the drift as a diff of those keys.
"""

from __future__ import annotations

import datetime
import functools
import threading
from typing import Iterable

import pulumi

from components.resource import CreateResult, DiffResult, ReadResult, ResourceProvider, UpdateResult, \
    dynamic_type, token


class OperatorError(RuntimeError):
    """An error whose message is complete for the operator (what, where, current vs desired, next
    step). Raised from provider methods without the Python frames that led to it."""


class Interrupted(OperatorError):
    """The run was interrupted (the operator's first Ctrl-C reached the provider's Cancel) while it waited for
    something that goes on by itself - a durable job, SGLang loading, a host rebooting: the wait ends at once with
    one line saying what goes on. Remote steps are not stopped: each is one short change made whole, and a
    resource's steps after one that changed the host (a guest created, a unit restarted) still run, so the
    state records what was done; the engine starts no new resource after the Cancel."""


class _Cancelled:
    """The operator's Ctrl-C as the provider instance serving this call was told it (its Cancel, provider/__main__.py).
    One process serves every provider instance of a pass (provider/stub.py), and the engine cancels - and closes -
    instances on its own schedule (a refresh's instances before the update's of the same `up --refresh`): each
    instance's calls see its own event (a context variable the plugin sets around each call); code outside a call
    (tests, the program) sees the process's own. Never cleared in the plugin: an instance serves one CLI command."""

    def __init__(self):
        import contextvars
        self._own = threading.Event()
        self._var = contextvars.ContextVar('gpuhost_cancelled', default=None)

    def event(self) -> threading.Event:
        return self._var.get() or self._own

    def serving(self, event: threading.Event):
        """Around a call of the instance whose event this is: returns the token for reset()."""
        return self._var.set(event)

    def reset(self, token) -> None:
        self._var.reset(token)

    def set(self) -> None:
        self.event().set()

    def clear(self) -> None:
        self.event().clear()

    def is_set(self) -> bool:
        return self.event().is_set()

    def wait(self, timeout=None) -> bool:
        return self.event().wait(timeout)


CANCELLED = _Cancelled()


def pause(seconds: float, who: str, waiting_for: str, then: str) -> None:
    """time.sleep(seconds) in a wait loop that an interrupt ends: raises Interrupted saying who waited for what,
    and `then` - what goes on by itself and what the next run does."""
    if CANCELLED.wait(seconds):
        raise Interrupted('%s: interrupted (Ctrl-C) while waiting for %s; %s' % (who, waiting_for, then))


class Failed(Exception):
    """What a provider entry point raises: the message alone, complete for the operator (see _normalising). The
    plugin hands it to the engine as it is, after "gpuhost: " (provider/__main__.py one_line); so does Pulumi's
    dynamic-provider host on the upgrade path (serve_the_dynamic_provider_host)."""


def describe_unexpected(e: BaseException) -> str:
    """One line for an exception no layer turned into an OperatorError (components/errors.py)."""
    from components import errors
    return errors.describe_unexpected(e)


def end_quietly() -> None:
    """A program's way of ending (the program's and the policy pack's test program's), never with a traceback:

    * Ctrl-C: the engine cancels the run and the language host asks the program to stop with SIGINT. The program
      holds no state of its own (the engine does), so it ends at once - no KeyboardInterrupt traceback in the
      operator's output (the CLI says "update canceled").
    * A resource failed and the engine shut its resource monitor while other registrations were still in flight:
      the SDK turns UNAVAILABLE into a quiet RunError ("Resource monitor has terminated"), but a call the engine
      cancelled (CANCELLED, "context canceled") into a plain Exception the language host prints with its whole
      traceback under the real error. Both mean the same: the run is over, for the reason above."""
    import os
    import signal
    settings = pulumi.runtime.settings
    try:
        signal.signal(signal.SIGINT, lambda _signum, _frame: os._exit(130))
    except ValueError:  # not the main thread: the language host's default handling stays
        pass
    to_exception = settings.grpc_error_to_exception
    if getattr(to_exception, 'gpuhost_quiet', False):
        return

    def monitor_gone(exn):
        import grpc
        if exn.code() == grpc.StatusCode.CANCELLED:
            return pulumi.RunError('Resource monitor has terminated, shutting down')
        return to_exception(exn)
    monitor_gone.gpuhost_quiet = True
    settings.grpc_error_to_exception = monitor_gone


def engine_address():
    """The engine's address, which it passes to every provider plugin as the first argument."""
    import re
    import sys
    return next((a for a in sys.argv[1:] if re.match(r'^(127\.0\.0\.1|localhost|\[::1\]):\d+$', a)), None)


_watching = []


def exit_with_engine() -> None:
    """A provider process outlives a killed `pulumi` (its gRPC server just waits). Watch the engine's
    address and exit when it stops answering, so an interrupted run leaves no processes behind."""
    import os
    import socket
    import threading
    import time
    addr = engine_address()
    if addr is None or _watching:
        return
    _watching.append(addr)
    host, _, port = addr.rpartition(':')

    def loop():
        misses = 0
        while True:
            time.sleep(2)
            try:
                socket.create_connection((host.strip('[]'), int(port)), timeout=2).close()
                misses = 0
            except OSError:
                misses += 1
                if misses >= 2:
                    os._exit(3)
    threading.Thread(target=loop, name='gpuhost-engine-watch', daemon=True).start()


def warn(message: str) -> None:
    log(message, 'WARNING')


def info(message: str) -> None:
    log(message, 'INFO')


def log(message: str, severity: str = 'WARNING') -> None:
    """A message in the CLI's output (preview, up, refresh) from the provider plugin's process.

    The engine starts every provider plugin with its own address as the first argument; its Log
    service shows the message like a program's pulumi.log.warn. Outside a provider (unit tests) the
    message goes to stderr."""
    import sys
    from components.errors import scrub
    message = scrub(message)
    addr = engine_address()
    if addr is None:
        sys.stderr.write('%s: %s\n' % (severity.lower(), message))
        return
    try:
        import grpc
        from pulumi.runtime.proto import engine_pb2, engine_pb2_grpc
        with grpc.insecure_channel(addr) as channel:
            engine_pb2_grpc.EngineStub(channel).Log(engine_pb2.LogRequest(
                severity=getattr(engine_pb2, severity), message=message), timeout=10)
    except Exception:  # noqa: BLE001 - a message that cannot be delivered must not fail the step
        sys.stderr.write('%s: %s\n' % (severity.lower(), message))


def numbers(value):
    """Integral floats back to ints: every number crosses the engine as a double, and 200.0 is not a
    vmid Proxmox or pct accepts."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [numbers(v) for v in value]
    return value


def _normalising(fn, positions):
    @functools.wraps(fn)
    def wrapper(self, *args):
        args = [numbers(a) if i in positions else a for i, a in enumerate(args)]
        try:
            return fn(self, *args)
        except Failed:
            raise
        except Exception as e:  # noqa: BLE001 - the last line of defence: one line, never frames
            # An OperatorError's message is the whole story, so it goes out alone; anything else as one
            # line. A create or update that is a step of a fleet's rollout says where the rollout stopped.
            text = str(e) if isinstance(e, OperatorError) else describe_unexpected(e)
            if fn.__name__ in ('create', 'update'):
                text = rollout_note(args[-1], getattr(self, 'ROLLOUT_STEP', None)) + text
            raise Failed(text) from None
    wrapper.__wrapped_by_numbers__ = True
    return wrapper


class ObservedProvider(ResourceProvider):
    """Base: subclasses set DESIRED (input keys compared), REPLACE (keys whose change means replace)
    and CONNECTION (the input key holding connection details, never compared)."""

    DESIRED: tuple = ()
    REPLACE: tuple = ()
    CONNECTION: tuple = ('connection',)
    OUTPUTS: tuple = ()
    DELETE_BEFORE_REPLACE = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _wrap(cls)

    def changed_keys(self, olds: dict, news: dict) -> list:
        return [k for k in self.DESIRED if not self.same(k, olds.get(k), news.get(k))]

    def same(self, key, observed, desired) -> bool:
        return observed == desired

    def diff(self, _id, olds, news):
        changed = self.changed_keys(olds, news)
        # A new connection (rotated key, renamed host) is an update that reads and changes nothing.
        conn_changed = any(olds.get(k) != news.get(k) for k in self.CONNECTION)
        replaces = [k for k in changed if k in self.REPLACE]
        return DiffResult(changes=bool(changed) or conn_changed, replaces=replaces,
                          delete_before_replace=self.DELETE_BEFORE_REPLACE if replaces else None)

    # The usual life of a resource: apply() makes the host match and returns the outputs; current()
    # reads what the host has now. Providers with another shape override create/update/read.
    ID = None

    def apply(self, props: dict) -> dict:
        raise NotImplementedError

    def current(self, props: dict) -> dict:
        raise NotImplementedError

    def resource_id(self, props: dict) -> str:
        return self.ID

    def create(self, props):
        return CreateResult(self.resource_id(props), self.stamped(self.apply(props)))

    def update(self, _id, _olds, news):
        return UpdateResult(self.stamped(self.apply(news)))

    def stamped(self, outs: dict) -> dict:
        """Providers that list 'applied' in OUTPUTS get a new token on every create/update (never on a
        read): a resource that depends on it runs again whenever this one changed something."""
        if 'applied' in self.OUTPUTS:
            import uuid
            outs = dict(outs, applied=uuid.uuid4().hex)
        return outs

    def read(self, id_, props):
        return self.read_result(id_, dict(props, **self.current(props)))

    def read_result(self, id_, outs: dict) -> ReadResult:
        """Inputs after a refresh: every input as it was, except the desired keys, which take the
        observed values (so the drift is what the next preview shows). OUTPUTS are the extra facts a
        provider reports; the component passes them in as None placeholders, and None they stay."""
        inputs = {k: (None if k in self.OUTPUTS else v) for k, v in outs.items()}
        return ReadResult(id_, outs, inputs)


def host_provider(name: str, connection, api, opts=None):
    """The gpuhost provider plugin's instance for one host (provider/): every custom resource of that host is
    served by it (components pass it on to their children: `providers`). Its configuration is the host's SSH
    connection and Proxmox API login, both secrets, held once here rather than in every resource's inputs
    (the plugin hands them to each call: provider/__main__.py)."""
    return pulumi.ProviderResource('gpuhost', name, {'connection': connection, 'api': api}, opts)


class GpuhostResource(pulumi.CustomResource):
    """Base of the program's custom resources, served by the gpuhost provider plugin (provider/registry.py
    maps each type to the class that serves it). `class HostFile(GpuhostResource, name='HostFile')` is
    gpuhost:index:HostFile; its outputs are attributes, as for any CustomResource.

    A stack deployed before the plugin has these resources as pulumi-python:dynamic/gpuhost:<Name>: the
    alias moves each onto the plugin in place (the engine asks the plugin's DiffConfig, which never asks
    for a replacement)."""

    TYPE_NAME = None

    def __init_subclass__(cls, name=None, **kwargs):
        super().__init_subclass__(**kwargs)
        if name is not None:
            cls.TYPE_NAME = name

    def __init__(self, name, props, opts=None):
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(
            aliases=[pulumi.Alias(type_=dynamic_type(self.TYPE_NAME))]))
        super().__init__(token(self.TYPE_NAME), name, props, opts)



def rollout_note(props, step) -> str:
    """For a provider whose steps gate a fleet's rollout (class attribute ROLLOUT_STEP) and a resource
    that carries its host's place in it (`rollout` input): the line that says where the rollout stopped,
    which hosts came before this one (done) and which wait behind it (not started, old unit). '' else."""
    r = props.get('rollout') if isinstance(props, dict) and step else None
    if not r:
        return ''
    before, after = r.get('before') or [], r.get('after') or []
    lanes = r.get('max_unavailable') or 1
    return ('rollout stopped at host %s (%s): hosts done before it in its lane: %s; not started, still on their '
            'old unit: %s%s. Fix %s and re-run `pulumi up`: it goes on from here.\n' % (
                r['host'], step, ', '.join(before) or 'none', ', '.join(after) or 'none',
                ' (with max_unavailable %d, the other lanes stopped where the output above shows)' % lanes
                if lanes > 1 else '', r['host']))


def only(d: dict, keys: Iterable) -> dict:
    return {k: d[k] for k in keys if k in d}


def _wrap(cls):
    """Numbers normalised and operator errors unframed on every provider entry point; the arguments
    carrying properties: create(props), update(id, olds, news), read(id, props), delete(id, props),
    diff(id, olds, news), check(olds, news)."""
    for name, positions in (('create', {0}), ('update', {1, 2}), ('read', {1}), ('delete', {1}),
                            ('diff', {1, 2}), ('check', {0, 1})):
        fn = cls.__dict__.get(name)
        if fn is not None and not getattr(fn, '__wrapped_by_numbers__', False):
            setattr(cls, name, _normalising(fn, positions))


_wrap(ObservedProvider)


# -- The upgrade path: Pulumi's dynamic-provider host ---------------------------------------------------------------
# A stack deployed by release 0.1.0 holds each resource as a dynamic resource, its provider pickled in its state, until
# the first `up` after the upgrade moves it onto the plugin by its alias (GpuhostResource). Until then - that up's own
# refresh, a `pulumi refresh`, a `destroy` - the engine sends the resource's calls to Pulumi's dynamic-provider host
# (`python -m pulumi.dynamic`), which unpickles the provider: an instance of the class of that name here, the one the
# plugin serves. The host imports this module as it unpickles, on its first call; what it needs beyond the plugin's
# calls is done then, in that process only:
#   * it calls configure(request) on each provider it unpickles: nothing to configure;
#   * it sends the engine traceback.format_exc() of whatever a call raises: with no frames (sys.tracebacklimit 0) and
#     Failed named as the builtin `gpuhost`, that reads "gpuhost: <message>", as the plugin's one_line says it;
#   * a CLI killed mid-run leaves it waiting for ever: it watches the engine from its first call on.
# tests/unit/test_dynamic_host.py serves reads through the host.

def in_dynamic_provider_host() -> bool:
    """True in the process `python -m pulumi.dynamic` that serves a stack's dynamic resources."""
    import sys
    return getattr(getattr(sys.modules.get('__main__'), '__spec__', None), 'name', None) == 'pulumi.dynamic.__main__'


def serve_the_dynamic_provider_host() -> None:
    import sys
    sys.tracebacklimit = 0
    Failed.__module__ = 'builtins'
    Failed.__qualname__ = Failed.__name__ = 'gpuhost'
    ObservedProvider.configure = lambda self, _request: None
    exit_with_engine()


if in_dynamic_provider_host():
    serve_the_dynamic_provider_host()


def utc_now() -> str:
    """Now, as the outputs' *_at fields write it (UTC, seconds)."""
    return datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ')
