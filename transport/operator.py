"""What every layer above says to the operator, and how a wait hears the operator's Ctrl-C: OperatorError (a message
complete for the operator), Interrupted and the cancel event (CANCELLED, pause), and the provider plugin's log
(info, warn: the engine's Log service, stderr outside a provider). The lowest of the program's own modules: transport
(SSH, the Proxmox API, durable jobs) raises and logs through it, and so does everything above."""

from __future__ import annotations

import threading


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


def describe_unexpected(e: BaseException) -> str:
    """One line for an exception no layer turned into an OperatorError (components/errors.py)."""
    from transport import errors
    return errors.describe_unexpected(e)


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
    from transport.errors import scrub
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
