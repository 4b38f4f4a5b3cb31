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
from typing import Iterable

import pulumi

from resources.resource import CreateResult, DiffResult, ReadResult, ResourceProvider, UpdateResult, \
    dynamic_type, token
from transport.operator import OperatorError, describe_unexpected, exit_with_engine


class Failed(Exception):
    """What a provider entry point raises: the message alone, complete for the operator (see _normalising). The
    plugin hands it to the engine as it is, after "gpuhost: " (provider/__main__.py one_line); so does Pulumi's
    dynamic-provider host on the upgrade path (serve_the_dynamic_provider_host)."""


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


def host_provider(name: str, connection, api, opts=None, fleet_lock=None):
    """The gpuhost provider plugin's instance for one host (provider/): every custom resource of that host is
    served by it (components pass it on to their children: `providers`). Its configuration is the host's SSH
    connection and Proxmox API login, both secrets, held once here rather than in every resource's inputs
    (the plugin hands them to each call: provider/__main__.py) - and the fleet lock's password when it has one
    (gpuhost:rollout.fleet_lock.password, a secret: a new one updates the provider, never a resource)."""
    args = {'connection': connection, 'api': api}
    if fleet_lock is not None:
        args['fleet_lock'] = fleet_lock
    return pulumi.ProviderResource('gpuhost', name, args, opts)


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
    which hosts came before this one (done) and which wait behind it (not started, still as they were). '' else."""
    r = props.get('rollout') if isinstance(props, dict) and step else None
    if not r:
        return ''
    before, after = r.get('before') or [], r.get('after') or []
    lanes = r.get('max_unavailable') or 1
    return ('rollout stopped at host %s (%s): hosts done before it in its lane: %s; not started, still on their '
            'old setting: %s%s. Fix %s and re-run `pulumi up`: it goes on from here.\n' % (
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
# (`python -m pulumi.dynamic`), which unpickles the provider by the name 0.1.0 gave its class (RELEASE_0_1_0 below):
# an instance of the class the plugin serves. The host imports this module as it unpickles, on its first call; what it
# needs beyond the plugin's calls is done then, in that process only:
#   * it calls configure(request) on each provider it unpickles: nothing to configure;
#   * it sends the engine traceback.format_exc() of whatever a call raises: with no frames (sys.tracebacklimit 0) and
#     Failed named as the builtin `gpuhost`, that reads "gpuhost: <message>", as the plugin's one_line says it;
#   * a CLI killed mid-run leaves it waiting for ever: it watches the engine from its first call on.
# tests/unit/test_dynamic_host.py serves reads through the host.

# Release 0.1.0 pickled each provider by its class's name as its tree had it (components.<module>.<Class>); the
# classes are resources/'s now. Each of those modules answers the old names (its module __getattr__ calls moved()),
# components/pcimap.py and components/pve.py only that. tests/unit/test_dynamic_host.py checks every name.
RELEASE_0_1_0 = {
    'components.container': ('resources.container', ('ContainerProvider',)),
    'components.host': ('resources.host', ('KernelCmdlineProvider', 'HostFileProvider', 'VfioProvider',
                                           'HostStatusProvider')),
    'components.model': ('resources.model', ('ModelProvider',)),
    'components.monitoring': ('resources.monitoring', ('MetricsFileProvider', 'CollectorProvider')),
    'components.pcimap': ('resources.pcimap', ('PciMappingProvider',)),
    'components.pve': ('resources.pve', ('PveGuestProvider',)),
    'components.sglang': ('resources.sglang', ('SglangUnitProvider',)),
}


def moved(module: str, name: str):
    """The class release 0.1.0 named `module`.`name`, from where it is now; AttributeError for any other name."""
    import importlib
    where, names = RELEASE_0_1_0.get(module, (None, ()))
    if name not in names:
        raise AttributeError('module %r has no attribute %r' % (module, name))
    return getattr(importlib.import_module(where), name)


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
