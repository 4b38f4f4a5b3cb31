import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)


# --- the order of the modules -------------------------------------------------------------------
# `make test` runs modules in parallel workers (pytest-xdist, --dist loadfile --no-loadscope-reorder):
# each module whole in one worker, handed out in collection order. The longest go first (the longest-
# processing-time rule), so the run does not end with one worker still busy with a long module the
# others could have shared out earlier. tests/durations.json holds each module's measured time;
# a module it does not know yet counts as long. Refresh it after adding or changing scenarios:
#   GPUHOST_TEST_DURATIONS_OUT=tests/durations.json make test
DURATIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'durations.json')
UNKNOWN_SECS = 600.0


def _module(nodeid):
    return nodeid.split('::', 1)[0]


def pytest_collection_modifyitems(session, config, items):
    import json
    try:
        with open(DURATIONS) as f:
            secs = json.load(f)
    except (OSError, ValueError):
        return
    first = {}
    for i, item in enumerate(items):
        first.setdefault(_module(item.nodeid), i)
    items.sort(key=lambda it: (-secs.get(_module(it.nodeid), UNKNOWN_SECS), first[_module(it.nodeid)]))


_totals = {}


def pytest_runtest_logreport(report):
    m = _module(report.nodeid)
    _totals[m] = _totals.get(m, 0.0) + report.duration


def pytest_sessionfinish(session):
    out = os.environ.get('GPUHOST_TEST_DURATIONS_OUT')
    if out and not hasattr(session.config, 'workerinput') and _totals:
        import json
        with open(out + '.tmp', 'w') as f:
            json.dump({m: round(s, 1) for m, s in sorted(_totals.items(), key=lambda kv: -kv[1])}, f, indent=1)
            f.write('\n')
        os.replace(out + '.tmp', out)


# --- the machine's share ------------------------------------------------------------------------
# A module of tests/integration runs a lab (a host under real systemd with its containers, the CLI, the
# providers, SGLang's simulator): about half a core. More of them at once than the machine has room for slow
# each other past their timeouts - two copies of the suite on 2 cores (8 labs) reached load 17 and the labs'
# container systemd gave way (issue 30). So every integration module holds one of GPUHOST_LAB_SLOTS (default
# 4, one copy's workers) machine-wide slots - a lock file in LAB_SLOTS, released by the kernel if the worker
# dies - from before its first test to after its last teardown, taken outside the tests' timeouts. Slots go
# first come, first served (a queue of lock files in LAB_SLOTS/queue): a worker that just finished a module
# queues behind the ones already waiting, so a second copy beside the first takes turns module by module
# instead of doubling the load, or starving until the first is done.
LAB_SLOTS = '/tmp/gpuhost-lab-slots'
_slot = {'module': None, 'file': None}


def _lab_slots():
    try:
        return max(1, int(os.environ.get('GPUHOST_LAB_SLOTS', '4')))
    except ValueError:
        return 4


def _queue_ahead(queue, mine):
    """The live entries of the queue older than mine (an entry whose lock is free is a dead waiter's: removed)."""
    import fcntl
    ahead = []
    for name in sorted(os.listdir(queue)):
        if name >= mine:
            break
        path = os.path.join(queue, name)
        try:
            f = open(path, 'a')
        except OSError:
            continue
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            ahead.append(name)   # held: its worker is waiting
        else:
            try:
                os.unlink(path)
            except OSError:
                pass
        finally:
            f.close()
    return ahead


def _take_slot():
    import fcntl
    import time
    queue = os.path.join(LAB_SLOTS, 'queue')
    os.makedirs(queue, exist_ok=True)
    mine = '%020d-%d' % (time.time_ns(), os.getpid())
    entry = open(os.path.join(queue, mine), 'w')
    fcntl.flock(entry, fcntl.LOCK_EX)
    try:
        while True:
            if not _queue_ahead(queue, mine):
                for n in range(_lab_slots()):
                    f = open(os.path.join(LAB_SLOTS, '%d.lock' % n), 'w')
                    try:
                        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        return f
                    except OSError:
                        f.close()
            time.sleep(0.2)
    finally:
        try:
            os.unlink(os.path.join(queue, mine))
        except OSError:
            pass
        entry.close()


def _give_slot():
    if _slot['file'] is not None:
        _slot['file'].close()
    _slot.update(module=None, file=None)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    mod = _module(item.nodeid)
    if mod.startswith('tests/integration/') and _slot['module'] != mod:
        _give_slot()
        _slot.update(module=mod, file=_take_slot())
    yield
    if nextitem is None or _module(nextitem.nodeid) != mod:
        _give_slot()
