"""A fleet's rolling changes, held by the plugin processes of one pass instead of dependency edges.

Every host of a fleet runs its steps at once. Only a step that may stop a host's SGLang - the create or update of a
resource that carries its host's place in the rollout (the `rollout` input: the container, the SGLang unit, and the
host status where host.reboot is when-required) - waits first until the host ahead of it in its lane
(`rollout.before[-1]`, config/fleet.py lane_before) serves again: that host's SGLang unit was found unchanged in this
pass (its diff) or its create or update ended (which waits for /health and /server_info). So a pass that changes
nothing never waits host after host, and a change goes down a lane one host at a time: at most max_unavailable hosts
are down at once, as with the dependency edges it replaces.

What the processes share is a directory on the operator's machine, one per pass: keyed by the CLI (the plugin's
parent process, with its start time) and the engine's address (the engine starts its plugins afresh for each pass:
a preview's findings never count in the update after it). A record per host and gated step (same, change, started,
done, failed), written whole (rename); a `failed` file when any step of any host failed; a heartbeat per process
while it has a call in flight that is not such a wait. A killed run leaves nothing held: the next run is another
pass, and directories of CLIs that ended are removed when a plugin next starts.

A wait ends with a refusal, the step untouched, when a step of the pass failed (the engine then starts nothing new:
the host ahead may never come), when the host ahead went down in this pass and nothing of the pass has moved for
STALL_S seconds (its steps stopped: the program or the engine ended them), and on Ctrl-C (the plugin's Cancel). A
host ahead that nothing in this pass touched while nothing moves for STALL_S (`pulumi up --target` left it out) is
no reason to wait.

Across stacks (gpuhost:rollout.fleet_lock, in the host's `rollout` input): after its lane's wait, the step takes a slot
of the fleet's lock in etcd for its host (take_slot; transport/fleetlock.py) - held by this process, its lease renewed,
while the host's other steps run - and the slot is released once the host's SGLang unit is settled in this pass
(record: found unchanged, or its create or update ended). A failed step keeps it: the host may be down, and the slot
is freed by its TTL once this process ends (the next run, as the same holder, takes it again at once). The etcd
password comes from the provider's configuration (provider/__main__.py), never from the resource's inputs."""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from typing import Optional
from urllib.parse import quote

# Nothing of the pass moved for this long while a step waits: the host ahead's steps are not coming.
STALL_S = 30.0
POLL_S = 0.2
BEAT_S = 2.0
SETTLED = ('same', 'done')
TOUCHED = ('change', 'started', 'done')
FAILED = 'failed'
UNIT = 'SglangUnit'   # the resource whose settled state means "serving again"

_lock = threading.Lock()
_dir: list = []
_busy = [0]
_beat: list = []


def run_dir() -> str:
    """This pass's directory (provider/passdir.py)."""
    with _lock:
        if not _dir:
            from provider import passdir
            _dir.append(passdir.path())
        return _dir[0]


def _name(host: str, step: str) -> str:
    return 'rec.%s.%s' % (quote(host, safe=''), quote(step, safe=''))


def _write(name: str, text: str) -> None:
    path = os.path.join(run_dir(), name)
    tmp = '%s.%d.%d.tmp' % (path, os.getpid(), threading.get_ident())
    with open(tmp, 'w') as f:
        f.write(text)
    os.replace(tmp, path)


def _read(name: str) -> Optional[str]:
    try:
        with open(os.path.join(run_dir(), name)) as f:
            return f.read()
    except FileNotFoundError:
        return None


def record(host: str, step: str, state: str) -> None:
    _write(_name(host, step), state)
    if step == UNIT and state in SETTLED:
        release_slot(host)


def state_of(host: str, step: str) -> Optional[str]:
    return _read(_name(host, step))


def failed(host: str, what: str) -> None:
    """A step of `host` failed in this pass: every wait of the pass ends (the first failure is the one named)."""
    path = os.path.join(run_dir(), 'failed')
    if not os.path.exists(path):
        _write('failed', '%s\t%s' % (host, what))


def failure() -> Optional[tuple]:
    text = _read('failed')
    if text is None:
        return None
    host, _, what = text.partition('\t')
    return host, what


def _touched(host: str) -> bool:
    prefix = 'rec.%s.' % quote(host, safe='')
    root = run_dir()
    for name in os.listdir(root):
        if name.startswith(prefix) and not name.endswith('.tmp'):
            if _read(name) in TOUCHED:
                return True
    return False


def last_move() -> float:
    """When something of the pass last moved: a record written, a heartbeat of a call in flight."""
    root = run_dir()
    latest = 0.0
    for name in os.listdir(root):
        try:
            latest = max(latest, os.stat(os.path.join(root, name)).st_mtime)
        except FileNotFoundError:
            pass
    return latest


def _beating() -> None:
    while True:
        if _busy[0] > 0:
            try:
                with open(os.path.join(run_dir(), 'beat.%d' % os.getpid()), 'w'):
                    pass
            except (OSError, RuntimeError):
                pass   # a wait then ends STALL_S sooner; never a failed step
        time.sleep(BEAT_S)


@contextmanager
def busy():
    """Around every call of the plugin: while one is in flight (and not waiting here), the process's heartbeat
    says the pass moves."""
    with _lock:
        _busy[0] += 1
        start = not _beat
        if start:
            _beat.append(True)
    if start:
        threading.Thread(target=_beating, name='gpuhost-rollout-beat', daemon=True).start()
    try:
        yield
    finally:
        with _lock:
            _busy[0] -= 1


@contextmanager
def _idle():
    with _lock:
        _busy[0] -= 1
    try:
        yield
    finally:
        with _lock:
            _busy[0] += 1


def wait_for_lane(rollout: dict, step: str, stall_s: Optional[float] = None) -> None:
    """Before `step` (what may stop this host's SGLang) of host rollout['host']: wait until the canary host
    (gpuhost:rollout.canary: the first host, whose SGLang unit is judged before any other host takes the change), then
    the host ahead of it in its lane, serve again in this pass. Raises OperatorError (the step not started) when one
    will not."""
    host = rollout['host']
    canary = rollout.get('canary')
    if canary and canary != host:
        _wait_for(host, canary, step, stall_s, 'the canary host %s' % canary, 'to be judged')
    before = rollout.get('before') or []
    if before and before[-1] != canary:
        _wait_for(host, before[-1], step, stall_s, 'host %s, ahead of it in its rollout lane,' % before[-1],
                  'to serve again')


def _wait_for(host: str, ahead: str, step: str, stall_s: Optional[float], who: str, what: str) -> None:
    from transport.operator import OperatorError, pause
    stall = STALL_S if stall_s is None else stall_s
    waited = time.monotonic()
    with _idle():
        while True:
            stop = failure()
            if stop is not None:
                raise OperatorError(
                    'host %s: %s not started: the rollout stopped at host %s (%s) in this run; %s keeps what it has. '
                    'Fix %s and re-run `pulumi up`: it goes on from there.' % (
                        host, step, stop[0], stop[1], host, stop[0]))
            if state_of(ahead, UNIT) in SETTLED:
                return
            quiet = time.time() - last_move()
            if quiet > stall and time.monotonic() - waited > stall:
                if not _touched(ahead):
                    return   # nothing of the host ahead is in this pass (`--target`): it keeps serving
                raise OperatorError(
                    'host %s: %s not started: %s went down in this run and its SGLang unit was not reached (nothing of '
                    'the run moved for %g s: the run was ended). Re-run `pulumi up`: it goes on from there.' % (
                        host, step, who, stall))
            pause(POLL_S, 'host %s' % host, '%s %s' % (who.replace(',', ''), what),
                  '%s has not started (nothing of it changed); the next `pulumi up` goes on from there' % step)


# -- the fleet's lock (gpuhost:rollout.fleet_lock): this process's slots, by host

_slots: dict = {}          # host -> transport.fleetlock.Slot
_steps: dict = {}          # host -> gated steps of the host in flight in this process
_host_locks: dict = {}


def _host_lock(host: str) -> threading.Lock:
    with _lock:
        return _host_locks.setdefault(host, threading.Lock())


def take_slot(rollout: dict, step: str, secret: Optional[dict], stack: str, poll_s: float = 1.0) -> None:
    """Before `step` of host rollout['host'] (after wait_for_lane): a slot of the fleet lock its rollout names, unless
    this process holds one for the host already. Nothing when the rollout names no lock (etcd is never asked). Raises
    OperatorError (the step not started): etcd unreachable or a login refused (fail closed), the pass stopped by a
    failure while it waited, Ctrl-C."""
    lock = rollout.get('fleet_lock')
    host = rollout['host']
    if not lock:
        return
    from transport import fleetlock
    from transport.operator import OperatorError
    with _host_lock(host):
        with _lock:
            _steps[host] = _steps.get(host, 0) + 1
            held = _slots.get(host)
        if held is not None and held.lost is None:
            return
        settings = fleetlock.Settings.of(lock, secret)
        then = '%s has not started (nothing of it changed); the next `pulumi up` goes on from there' % step

        def stop():
            failed_at = failure()
            if failed_at is not None:
                raise OperatorError('host %s: %s not started: the rollout stopped at host %s (%s) in this run; %s keeps '
                                    'what it has. Fix %s and re-run `pulumi up`: it goes on from there.' % (
                                        host, step, failed_at[0], failed_at[1], host, failed_at[0]))
        try:
            slot = fleetlock.acquire(settings, '%s %s' % (host, stack), 'host %s' % host, then, poll_s=poll_s,
                                     stop=stop)
        except fleetlock.Refused as e:
            step_ended(host)
            raise fleetlock.Refused('host %s: %s not started: %s' % (host, step, e)) from None
        except BaseException:
            step_ended(host)
            raise
        with _lock:
            _slots[host] = slot


def step_ended(host: str) -> None:
    """A gated step of `host` ended well (a failed one stays counted: its slot is kept until the process ends). If
    the host's SGLang unit was settled already in this pass (a step the unit does not wait for: it was found unchanged
    while this one ran), the slot goes back now."""
    with _lock:
        if _steps.get(host):
            _steps[host] -= 1
        idle = not _steps.get(host) and host in _slots
    if idle and state_of(host, UNIT) in SETTLED:
        release_slot(host)


def release_slot(host: str) -> None:
    """The host serves again: its slot goes back to the fleet - unless a gated step of it is still in flight here."""
    with _lock:
        if _steps.get(host) or host not in _slots:
            return
        slot = _slots.pop(host)
    try:
        slot.release()
    except Exception as e:  # noqa: BLE001 - the host serves; an unreleased slot is freed by its TTL
        from transport.operator import warn
        warn('host %s: slot %d of %s not released (%s); its TTL frees it' % (host, slot.index, slot.client.s.words(),
                                                                              e))
