"""The gpuhost provider plugin's gRPC server (the Pulumi CLI starts it through provider/pulumi-resource-gpuhost).

Each resource type is served by the class that served it as a dynamic resource (provider/registry.py): the same
check, diff, create, read, update and delete, the same messages. What changes is the plumbing:
  * no provider code in state: a resource's state holds its properties only (a `__provider` left by a dynamic
    resource is dropped on the way in, and is gone from the state after the resource's next refresh or update);
  * no cap of four calls at a time: the engine's --parallel decides how many steps run at once;
  * a version (provider/VERSION) and a schema (provider/schema.json, tools/provider_schema.py writes it from the
    classes' declarations, resources/fields.py);
  * a preview's diff property by property, each one that replaces the resource said so (Diff, detailed_diff).
Like the dynamic-provider host it replaces, the plugin tells the engine it takes no secrets and no previews of
creates: the engine unwraps secret inputs on the way in and marks the outputs of secret inputs secret on the way
out, and a preview of a resource to create makes no call into the plugin's create."""

import asyncio
import os
import sys
import threading
import traceback
from concurrent import futures
from contextlib import contextmanager

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import grpc  # noqa: E402
from google.protobuf import empty_pb2  # noqa: E402
from pulumi.runtime import rpc  # noqa: E402
from pulumi.runtime.proto import plugin_pb2, provider_pb2 as proto  # noqa: E402
from pulumi.runtime.proto import provider_pb2_grpc  # noqa: E402

from provider import registry, rollout  # noqa: E402

DYNAMIC_KEY = '__provider'   # what a dynamic resource kept in its state: a pickled provider, never read here
# The provider instance's configuration (one instance per host, resources/state.py host_provider): the host's SSH
# connection and its Proxmox API login. Every call gets them as the resource's `connection` / `api` properties, the
# way the serving classes read them; they never go back into a resource's inputs or outputs (a stack deployed before
# the configuration held them in every resource: gone from each at its next refresh or update).
# The fleet lock's password (gpuhost:rollout.fleet_lock.password) is there too, for the same reasons: a secret held once
# per host, never in a resource's inputs, outputs or state beside them (its other settings are the `rollout` input's).
HOST_KEYS = ('connection', 'api', 'fleet_lock')
# The engine decides how many steps run at once (--parallel); the plugin never holds one back.
MAX_CALLS = 256


def version() -> str:
    with open(os.path.join(HERE, 'VERSION')) as f:
        return f.read().strip()


def type_of(urn: str) -> str:
    """urn:pulumi:<stack>::<project>::<parent types $>...<type>::<name> -> <type>."""
    parts = urn.split('::')
    return parts[2].split('$')[-1] if len(parts) >= 4 else ''


def stack_of(urn: str) -> str:
    """urn:pulumi:<stack>::<project>::... -> <project>/<stack> (with the host, a fleet lock slot's holder)."""
    parts = urn.split('::')
    return '%s/%s' % (parts[1], parts[0].split(':')[-1]) if len(parts) >= 2 else urn


def plain(struct, keep_unknowns=False) -> dict:
    from transport.errors import remember
    props = rpc.deserialize_properties(struct, keep_unknowns) if struct is not None else {}
    props.pop(DYNAMIC_KEY, None)
    remember(props)
    return props


def without_host(props: dict) -> dict:
    return {k: v for k, v in (props or {}).items() if k not in HOST_KEYS}


# Another host's connection an input carries (the fleet canary's, baseline: restart - resources/sglang.py
# BaselineRestart): a key named by file is read here when the step runs, as Configure reads the provider's own, and
# the outputs keep the input as it came (the path, never the key read from it).
OTHER_CONNECTIONS = ('baseline_connection',)


def read_other_connections(props: dict) -> dict:
    from provider.configuration import resolved
    out = dict(props)
    for key in OTHER_CONNECTIONS:
        if isinstance(props.get(key), dict):
            out[key] = resolved({'connection': props[key]})['connection']
    return out


def as_given(outs: dict, given: dict) -> dict:
    return dict(outs, **{k: given[k] for k in OTHER_CONNECTIONS if k in given and k in outs})


def configuration(struct) -> dict:
    """The provider's configuration as plain values (its secrets unwrapped: they reach only the serving classes,
    as the dynamic resources' secret inputs did)."""
    from transport.errors import remember
    from resources.state import numbers
    args = rpc.deserialize_properties(struct, True) if struct is not None else {}
    config = {k: numbers(unwrapped(v)) for k, v in args.items()}
    remember(config)
    return config


def unwrapped(value):
    """A value with every secret marker taken off, at any depth."""
    value = rpc.unwrap_rpc_secret(value)
    if isinstance(value, dict):
        return {k: unwrapped(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unwrapped(v) for v in value]
    return value


def wire(props: dict):
    """Properties for the engine. The SDK's serializer names a value it cannot take by its repr() - a secret's
    text, for a secret key: a failure is reported by key and type alone."""
    loop = asyncio.new_event_loop()
    try:
        try:
            return loop.run_until_complete(rpc.serialize_properties(dict(props or {}), {}))
        except Exception:  # noqa: BLE001 - the SDK's message holds the value; find the key, say nothing of it
            pass
        for key, value in (props or {}).items():
            try:
                loop.run_until_complete(rpc.serialize_properties({key: value}, {}))
            except Exception:  # noqa: BLE001
                raise Unserializable('property %r holds a value of type %s, which the engine cannot take (a bug in '
                                     'gpuhost: its value is not shown)' % (str(key), type(value).__name__)) from None
        raise Unserializable('the properties cannot be sent to the engine (a bug in gpuhost)')
    finally:
        loop.close()


class Unserializable(TypeError):
    pass


def detailed_diff(served, olds: dict, news: dict, old_inputs: dict, new_inputs: dict, result) -> dict:
    """What a preview shows of an update or a replacement, property by property (DiffResponse.detailedDiff):

      * each key the class compares (its DESIRED) whose declared value is not the one it has seen (the old outputs:
        a drift shows as the value found), by the class's own comparison (its same()) - ADD, DELETE or UPDATE, the
        _REPLACE kind for a key the result replaces on;
      * and, as the engine showed them before the plugin said anything, the other inputs whose value differs from
        the last run's (inputDiff) - the SGLang unit's flags one by one (launch_args), what it verifies and installs.

    Empty when no property has changed (an update for a reason of the class's own: a cleanup to retry, a proof
    after a reboot; or a resource taken in by `import`, compared on what its import found): the engine then shows
    its own view of the inputs, as it did before."""
    from resources.pve import IMPORTED
    from resources.state import numbers
    if olds.get(IMPORTED):
        return {}
    # As the class compared them (its entry points see integral numbers as ints: resources/state.py numbers).
    olds, news = numbers(olds), numbers(news)
    kinds = proto.PropertyDiff
    replaces = set(result.replaces or ())
    out = {}
    for key in served.DESIRED:
        old, new = olds.get(key), news.get(key)
        if key not in replaces and served.same(key, old, new):
            continue
        kind = kinds.ADD if old is None else kinds.DELETE if new is None else kinds.UPDATE
        if key in replaces:
            kind = {kinds.ADD: kinds.ADD_REPLACE, kinds.DELETE: kinds.DELETE_REPLACE}.get(kind, kinds.UPDATE_REPLACE)
        out[key] = kinds(kind=kind)
    if old_inputs is None:
        return out
    for key in sorted(set(old_inputs) | set(new_inputs)):
        if key in out or key in served.DESIRED or old_inputs.get(key) == new_inputs.get(key):
            continue
        kind = kinds.ADD if key not in old_inputs else kinds.DELETE if key not in new_inputs else kinds.UPDATE
        out[key] = kinds(kind=kind, inputDiff=True)
    return out


def lock_preview(served, props: dict) -> None:
    """The preview's line for a change that may stop a host's SGLang under a fleet lock: the slot it takes."""
    lock = (props.get('rollout') or {}).get('fleet_lock')
    step = getattr(served, 'ROLLOUT_STEP', None)
    if not lock or not step:
        return
    # A class whose decision reads the host (the driver: its diff prices the plan already) is not asked here: no
    # second read at preview, and its decision stays the apply's (resources/driver.py _turn).
    if getattr(served, 'GOES_DOWN_READS_HOST', False):
        down = True
    else:
        try:
            down = getattr(served, 'goes_down', lambda _p: True)(props)
        except Exception:  # noqa: BLE001 - unreadable now: the step may go down, so the preview says so
            down = True
    if down:
        from transport.fleetlock import Settings
        from transport.operator import info
        info('host %s: %s: `up` takes a slot of %s before a step that may stop SGLang, and gives it back once the '
             'host serves again' % (props['rollout']['host'], step, Settings.of(lock).words()))


def one_line(e: BaseException) -> str:
    """What the engine gets for an exception: "gpuhost: <message>", one line for anything unforeseen, never a Python
    frame, no secret the process holds (transport/errors.py)."""
    from transport.errors import scrub
    from resources.state import Failed
    from transport.operator import OperatorError, describe_unexpected
    text = str(e) if isinstance(e, (Failed, OperatorError)) else describe_unexpected(e)
    return 'gpuhost: ' + scrub(text)


def _one_line_errors(fn):
    """Every entry point's errors reach the engine as one_line() makes them, from the process's first call on:
    a serving class's error (resources/state.py Failed) and the plugin's own alike."""
    def wrapper(self, request, context):
        from transport.operator import CANCELLED
        token = CANCELLED.serving(self.cancelled)
        try:
            with rollout.busy():
                return fn(self, request, context)
        except Exception as e:  # noqa: BLE001 - every error goes to the engine, never kills the server
            text = one_line(e)
        finally:
            CANCELLED.reset(token)
        context.abort(grpc.StatusCode.UNKNOWN, text)
    wrapper.__name__ = fn.__name__
    return wrapper


class GpuhostProvider(provider_pb2_grpc.ResourceProviderServicer):
    def __init__(self):
        self.config = {}
        # This instance's Ctrl-C (transport/operator.py CANCELLED): the serving process serves other instances too.
        self.cancelled = threading.Event()

    @_one_line_errors
    def GetPluginInfo(self, request, context):
        return plugin_pb2.PluginInfo(version=version())

    @_one_line_errors
    def GetSchema(self, request, context):
        with open(os.path.join(HERE, 'schema.json')) as f:
            return proto.GetSchemaResponse(schema=f.read())

    @_one_line_errors
    def CheckConfig(self, request, context):
        # The configuration is checked here, before any resource's call: a missing or malformed connection or
        # login is refused naming its key and the stack setting it comes from (provider/configuration.py).
        from provider import configuration as checked
        failures = checked.problems(configuration(request.news))
        return proto.CheckResponse(inputs=request.news, failures=[
            proto.CheckFailure(property=key, reason=reason) for key, reason in failures])

    @_one_line_errors
    def DiffConfig(self, request, context):
        # A new connection or login (a rotated key, a new password) updates the provider instance and nothing it
        # serves; never a replacement (the engine also asks this when a stack's resources move from the
        # dynamic-provider host onto this plugin).
        olds, news = configuration(request.olds), configuration(request.news)
        changed = sorted(k for k in set(olds) | set(news) if olds.get(k) != news.get(k))
        return proto.DiffResponse(changes=proto.DiffResponse.DIFF_SOME if changed else proto.DiffResponse.DIFF_NONE,
                                  diffs=changed, replaces=[])

    @_one_line_errors
    def Configure(self, request, context):
        # A credential named by file is read here, at every run (provider/configuration.py resolved).
        from provider.configuration import resolved
        self.config = {k: v for k, v in resolved(configuration(request.args)).items() if k in HOST_KEYS}
        return proto.ConfigureResponse(acceptSecrets=False, supportsPreview=False, acceptResources=False,
                                       acceptOutputs=False)

    @contextmanager
    def step(self, urn: str, props: dict, served=None):
        """A step of a fleet's host. `served` (a create or update): if it may stop the host's SGLang (its props carry
        the host's place in the rollout), it first waits for the host ahead in its lane to serve again, and says when
        it started and ended. A failure of any step ends every such wait of the pass (provider/rollout.py)."""
        order = props.get('rollout')
        step = getattr(served, 'ROLLOUT_STEP', None) if served is not None else None
        gated = bool(order and step and getattr(served, 'goes_down', lambda _p: True)(props))
        name = registry.name_of(type_of(urn))
        # baseline: restart - the canary's step restarts its baseline host too (resources/sglang.py BaselineRestart):
        # that host's slot with the canary's, given back once its own SGLang unit is settled.
        baseline = ((props.get('canary') or {}).get('restart') or {}).get('host') if gated else None
        if gated:
            rollout.wait_for_lane(order, step)
            # Across stacks: a slot of the fleet's lock (gpuhost:rollout.fleet_lock), kept while the host is down,
            # released once its SGLang unit is settled in this pass (rollout.record); a failed step keeps it.
            from transport.fleetlock import Refused
            try:
                rollout.take_slot(order, step, self.config.get('fleet_lock'), stack_of(urn))
                if baseline:
                    rollout.take_slot(dict(order, host=baseline), 'its restart as the canary\'s baseline',
                                      self.config.get('fleet_lock'), stack_of(urn))
            except Refused as e:
                # Fail closed: the step does not start, and the hosts behind this one stop waiting for it.
                rollout.record(order['host'], name, 'failed')
                self.failed(urn, props, step, e)
                raise
            rollout.record(order['host'], name, 'started')
        try:
            yield
        except BaseException as e:
            if gated:
                rollout.record(order['host'], name, 'failed')
            self.failed(urn, props, step or 'its %s %s' % (name, urn.split('::')[-1]), e)
            raise
        if gated:
            rollout.step_ended(order['host'])
            if baseline:
                rollout.step_ended(baseline)
        if order and served is not None:
            rollout.record(order['host'], name, 'done')

    def failed(self, urn: str, props: dict, what: str, error: BaseException = None) -> None:
        """A step of a fleet's host failed (a single host's stack has no rollout to stop)."""
        host = (props.get('rollout') or {}).get('host') or props.get('fleet_host')
        if host and not isinstance(error, KeyboardInterrupt):
            try:
                rollout.failed(host, what)
            except OSError:
                pass   # the failure itself goes to the engine whatever happens here

    def host(self, props: dict) -> dict:
        """The resource's properties as its serving class reads them: with the host's connection and login."""
        return dict(props, **self.config)

    @_one_line_errors
    def Cancel(self, request, context):
        # The operator's first Ctrl-C (the engine signals every provider and waits for the steps in flight): a
        # wait - a job followed, SGLang loading, a host rebooting - ends at once with one line saying what goes on
        # by itself (transport/operator.py CANCELLED, Interrupted).
        from transport import operator
        operator.CANCELLED.set()
        return empty_pb2.Empty()

    @_one_line_errors
    def Check(self, request, context):
        # No olds: a resource the stack does not hold yet (what adoption keys on) - given the connection, they would
        # look like a resource's state.
        olds = plain(request.olds, True)
        olds, news = self.host(olds) if olds else {}, self.host(plain(request.news, True))
        result = registry.provider_for(type_of(request.urn), news).check(olds, news)
        if result.failures:
            self.failed(request.urn, news, 'its configuration (%s)' % ', '.join(f.property for f in result.failures))
        return proto.CheckResponse(inputs=wire(without_host(result.inputs)), failures=[
            proto.CheckFailure(property=f.property, reason=f.reason) for f in result.failures or []])

    @_one_line_errors
    def Diff(self, request, context):
        new_inputs = plain(request.news, True)
        olds, news = self.host(plain(request.olds, True)), self.host(new_inputs)
        served = registry.provider_for(type_of(request.urn), news)
        with self.step(request.urn, news):
            result = served.diff(request.id, olds, news)
        if news.get('rollout'):
            # For the hosts behind this one in its lane: this step will (change) or will not (same) take it down.
            rollout.record(news['rollout']['host'], registry.name_of(type_of(request.urn)),
                           'same' if result.changes is False else 'change')
            if result.changes is not False:
                lock_preview(served, news)
        fields = {'changes': proto.DiffResponse.DIFF_UNKNOWN if result.changes is None else
                  proto.DiffResponse.DIFF_SOME if result.changes else proto.DiffResponse.DIFF_NONE}
        if result.replaces is not None:
            fields['replaces'] = result.replaces
        if result.delete_before_replace is not None:
            fields['deleteBeforeReplace'] = result.delete_before_replace
        # (an engine older than the old inputs in a DiffRequest: the compared keys alone)
        old_inputs = plain(request.old_inputs, True) if request.HasField('old_inputs') else None
        detailed = detailed_diff(served, olds, news, old_inputs, new_inputs, result) if result.changes else {}
        if detailed:
            fields.update(detailedDiff=detailed, hasDetailedDiff=True, diffs=sorted(detailed))
        return proto.DiffResponse(**fields)

    @_one_line_errors
    def Create(self, request, context):
        props = self.host(plain(request.properties))
        served = registry.provider_for(type_of(request.urn), props)
        with self.step(request.urn, props, served):
            result = served.create(read_other_connections(props))
        return proto.CreateResponse(id=result.id, properties=wire(without_host(as_given(result.outs, props))))

    @_one_line_errors
    def Read(self, request, context):
        # On refresh the engine passes the last outputs and inputs: the outputs over the inputs (a resource taken in
        # by `import_` keeps the outputs its import read, which lack what only the program declares); on an
        # import, only the id.
        # The host's read-only scripts of the Reads that arrive together go out as one command, each read once
        # (transport/hostreads.py).
        from transport import remote
        props = self.host(dict(plain(request.inputs), **plain(request.properties)))
        with remote.reading():
            result = registry.provider_for(type_of(request.urn), props).read(request.id, props)
        fields = {'id': result.id, 'properties': wire(without_host(result.outs))}
        if result.inputs is not None:
            fields['inputs'] = wire(without_host(result.inputs))
        return proto.ReadResponse(**fields)

    @_one_line_errors
    def Update(self, request, context):
        olds, news = self.host(plain(request.olds)), self.host(plain(request.news))
        served = registry.provider_for(type_of(request.urn), news)
        with self.step(request.urn, news, served):
            result = served.update(request.id, olds, read_other_connections(news))
        return proto.UpdateResponse(properties=wire(without_host(as_given(result.outs, news))))

    @_one_line_errors
    def Delete(self, request, context):
        props = self.host(plain(request.properties))
        served = registry.provider_for(type_of(request.urn), props)
        with self.step(request.urn, props):
            served.delete(request.id, props)
        return empty_pb2.Empty()


def instance():
    """One provider instance: a gRPC server of its own (its own configuration: one host's connection and login)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=MAX_CALLS),
                         options=[('grpc.max_receive_message_length', 256 * 1024 * 1024)])
    provider_pb2_grpc.add_ResourceProviderServicer_to_server(GpuhostProvider(), server)
    port = server.add_insecure_port('127.0.0.1:0')
    server.start()
    return server, port


def main():
    if sys.argv[1:2] == ['--zygote']:
        return zygote(sys.argv[2])
    from transport import operator
    # A killed CLI leaves a provider's gRPC server waiting for ever: exit when the engine stops answering.
    operator.exit_with_engine()
    if '--serve' in sys.argv:
        return serve()
    server, port = instance()
    sys.stdout.write('%d\n' % port)
    sys.stdout.flush()
    # Until SIGINT: the engine ends the plugin, or the operator's Ctrl-C reached the process group (the engine then
    # cancels the waits and waits for the steps in flight). The main thread wakes twice a second: the kernel may hand
    # the signal to one of gRPC's threads, and a main thread blocked for good in a lock never runs Python's handler
    # (two fresh-clone CI runs saw a process outlive its SIGINT by over 10 s).
    import signal
    done = threading.Event()
    signal.signal(signal.SIGINT, lambda _signum, _frame: done.set())
    while not done.wait(0.5):
        pass
    # The calls in flight finish - up to STOP_GRACE_S -, no new one starts, and the process ends without the
    # interpreter's teardown.
    server.stop(STOP_GRACE_S).wait()
    os._exit(0)


# How long a per-instance process (GPUHOST_PLUGIN_SHARED=0) lets its calls in flight finish once it is told to end.
STOP_GRACE_S = 60.0


# The serving process ends this long after its last instance ended (the engine ends its plugins at a pass's end).
IDLE_S = 10.0


def serve():
    """The pass's one serving process (provider/stub.py): an instance for each stub that asks, on the pass directory's
    socket, for as long as that stub's connection lasts."""
    import socket
    import time
    from provider import passdir
    here = passdir.path()
    path = os.path.join(here, 'plugin.sock')
    if os.path.exists(path):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(64)
    # Which process serves the pass (a zygote's fork has the zygote's command line).
    pidfile = os.path.join(here, 'plugin.pid')
    with open(pidfile + '.tmp', 'w') as f:
        f.write('%d\n' % os.getpid())
    os.replace(pidfile + '.tmp', pidfile)
    live = [0, time.monotonic()]
    lock = threading.Lock()

    def one(conn):
        server = None
        try:
            if conn.recv(16).strip() != b'new':
                return
            server, port = instance()
            conn.sendall(b'%d\n' % port)
            while conn.recv(4096):
                pass
        except OSError:
            pass
        finally:
            conn.close()
            if server is not None:
                server.stop(None)
            with lock:
                live[0] -= 1
                live[1] = time.monotonic()

    def reaper():
        while True:
            time.sleep(0.5)
            with lock:
                if live[0] == 0 and time.monotonic() - live[1] > IDLE_S:
                    for done in (path, pidfile):
                        try:
                            os.unlink(done)
                        except OSError:
                            pass
                    os._exit(0)
    threading.Thread(target=reaper, name='gpuhost-idle', daemon=True).start()
    while True:
        conn, _ = listener.accept()
        with lock:
            live[0] += 1
        threading.Thread(target=one, args=(conn,), name='gpuhost-instance', daemon=True).start()


# -- the zygote (provider/stub.py): a pass's serving process without the imports

# The zygote ends this long after the last pass it started one for (or at once when a file it loaded changed).
ZYGOTE_IDLE_S = 60.0
# A request (a stub's argv, environment, cwd) larger than this is not read on.
ZYGOTE_MAX_REQUEST = 4 << 20
# What a serving process loads over a pass, beyond this module: loaded once, in the zygote.
WARM = ('provider.rollout', 'provider.configuration', 'provider.passdir', 'resources.state', 'resources.fields',
        'transport.remote', 'transport.hostreads', 'transport.jobs', 'transport.agent', 'transport.proxmox',
        'transport.errors', 'transport.operator', 'transport.fleetlock',
        # The libraries those import inside their functions (a pass paid them at its first connection and login:
        # ~0.25 CPU-s, a tenth of an 8-host no-op `up --refresh`'s serving CPU): imported, they start no thread.
        'paramiko', 'requests', 'proxmoxer', 'proxmoxer.backends.https')


def _set_name(name: bytes) -> None:
    """The process's name (/proc/<pid>/comm, what ps and top show): a zygote and the serving processes it forked share
    its command line."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(15, name, 0, 0, 0)   # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def _loaded_from() -> list:
    """The project's directories this process loaded modules from (the virtualenv's site-packages are
    fingerprinted as whole directories: _fingerprint)."""
    repo = os.path.dirname(HERE)
    installed = tuple(os.path.abspath(p) + os.sep for p in (sys.prefix, sys.base_prefix))
    dirs = set()
    for module in list(sys.modules.values()):
        f = getattr(module, '__file__', None)
        f = f and os.path.abspath(f)
        if f and f.startswith(repo + os.sep) and not f.startswith(installed) and 'site-packages' not in f:
            dirs.add(os.path.dirname(f))
    return sorted(dirs)


def _fingerprint(dirs: list) -> list:
    """What a serving process forked now would run: every file of the project's module directories (code, the host
    scripts and templates they read) and every other directory on sys.path (a package installed or removed)."""
    import stat
    repo = os.path.dirname(HERE)
    out = []
    for d in dirs:
        try:
            names = sorted(os.listdir(d))
        except OSError:
            out.append((d, None))
            continue
        for name in names:
            p = os.path.join(d, name)
            try:
                st = os.stat(p)
            except OSError:
                continue
            # The project's root holds the stacks' files, written by every `pulumi config set`: its modules only.
            if stat.S_ISREG(st.st_mode) and (d != repo or name.endswith('.py')):
                out.append((p, st.st_mtime_ns, st.st_size))
    for d in sys.path:
        if d and os.path.abspath(d) not in (repo, HERE):
            try:
                out.append((d, os.stat(d).st_mtime_ns))
            except OSError:
                pass
    return out


def zygote(path: str):
    """One warm process for the plugin's virtualenv and directory (provider/stub.py starts it): it has loaded what a
    serving process loads - grpc, the SDK, paramiko, proxmoxer, the serving classes, ~0.4 CPU-s - and forks a serving
    process for each pass that asks, with that pass's own command line, environment and directory, so no import is
    paid again. It holds no connection, no configuration and no secret: a request's environment goes to the forked
    process only. It forks only while it is single-threaded and while every file it loaded is unchanged (else it
    answers `stale` and ends: the stub starts a fresh one), and ends ZYGOTE_IDLE_S after its last fork.
    A fork inherits the zygote's namespaces, cgroup, credentials, limits and nice level, not the asking stub's: it
    forks only for a peer (SO_PEERCRED's pid) whose identity (provider/identity.py: namespaces, cgroup, credentials,
    limits, scheduling, read from /proc/<pid>) is its own, read once at its start - a stub of another network
    namespace would get a serving process its engine cannot reach (issue 58). Any other peer, one it cannot see (pid
    0: another pid namespace) or whose identity it cannot read is answered `other`, and its stub starts a serving
    process the plain way (stubs key their zygote by their identity: one that differs rarely asks this one)."""
    import gc
    import importlib
    import json
    import socket
    import struct
    import time
    from provider import identity
    _set_name(b'gpuhost-zygote')
    for module in WARM + tuple(sorted({m for m, _ in list(registry.CLASSES.values()) +
                                       list(registry.GUEST_KINDS.values())})):
        importlib.import_module(module)
    dirs = _loaded_from()
    loaded = _fingerprint(dirs)
    os.chdir('/')
    if len(os.listdir('/proc/self/task')) != 1:
        sys.stderr.write('gpuhost zygote: not single-threaded after its imports; not forking\n')
        os._exit(1)
    try:
        me = identity.of('/proc/self')
    except OSError as e:
        sys.stderr.write('gpuhost zygote: its own identity unreadable (%s); not forking\n' % e)
        os._exit(1)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if os.path.exists(path):
        os.unlink(path)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(64)
    mine = os.stat(path).st_ino
    listener.settimeout(2.0)
    gc.freeze()
    last = time.monotonic()

    def ours() -> bool:
        try:
            return os.stat(path).st_ino == mine
        except OSError:
            return False

    def kin(pid: int) -> bool:
        """The peer shares what its serving process would inherit from this zygote."""
        try:
            return pid > 0 and identity.of('/proc/%d' % pid) == me
        except OSError:
            return False

    while True:
        try:
            conn, _ = listener.accept()
        except socket.timeout:
            if time.monotonic() - last > ZYGOTE_IDLE_S or not ours():
                break
            continue
        try:
            conn.settimeout(10.0)
            peer, uid, _ = struct.unpack('3i', conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
            if uid != os.getuid():
                continue
            data = b''
            while len(data) <= ZYGOTE_MAX_REQUEST:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            if not data or len(data) > ZYGOTE_MAX_REQUEST:
                continue
            # After its request is read whole: a stub still sending would see its connection reset, not the answer.
            if not kin(peer):
                conn.sendall(b'other\n')
                continue
            if _fingerprint(dirs) != loaded:
                conn.sendall(b'stale\n')
                break
            request = json.loads(data)
            pid = os.fork()
            if pid == 0:
                _forked(request, listener, conn)
            os.waitpid(pid, 0)
            conn.sendall(b'ok\n')
            last = time.monotonic()
        except (OSError, ValueError, KeyError):
            pass
        finally:
            conn.close()
    if ours():
        os.unlink(path)
    os._exit(0)


def _forked(request: dict, listener, conn):
    """In the zygote's child: a serving process for the request's pass, in a session of its own (the engine ends
    its stubs' process groups, never the serving process), the zygote's child exiting at once."""
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        listener.close()
        conn.close()
        log = os.open(request['log'], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        os.environ.clear()
        os.environ.update(request['env'])
        os.chdir(request['cwd'])
        os.umask(request['umask'])
        sys.argv[1:] = ['--serve'] + list(request['argv'])
        import random
        import tempfile
        tempfile.tempdir = None
        random.seed()
        _set_name(b'gpuhost-serve')
    except BaseException:  # noqa: BLE001 - the zygote's child never returns into the zygote's loop
        os._exit(1)
    try:
        main()
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
    finally:
        os._exit(0)


if __name__ == '__main__':
    main()
