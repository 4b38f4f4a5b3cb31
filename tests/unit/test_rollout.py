"""provider/rollout.py: a fleet's rollout held by the plugin processes of one pass - a step that may stop a host's
SGLang waits for the host ahead in its lane to serve again, a pass that changes nothing never waits."""

import os
import subprocess
import sys
import threading
import time

import pytest

from transport import operator
from transport.operator import Interrupted, OperatorError
from provider import rollout

ORDER = {'host': 'gpu03', 'before': ['gpu01', 'gpu02'], 'after': ['gpu04'], 'max_unavailable': 1,
         'order': ['gpu01', 'gpu02', 'gpu03', 'gpu04']}


@pytest.fixture(autouse=True)
def pass_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(rollout, '_dir', [str(tmp_path)])
    monkeypatch.setattr(rollout, 'POLL_S', 0.02)
    monkeypatch.setattr(rollout, '_beat', [])
    yield tmp_path
    operator.CANCELLED.clear()


def later(seconds, fn, *args):
    t = threading.Timer(seconds, fn, args)
    t.start()
    return t


def test_first_host_of_a_lane_never_waits():
    start = time.monotonic()
    rollout.wait_for_lane(dict(ORDER, before=[]), 'its SGLang unit')
    assert time.monotonic() - start < 0.1


def test_host_ahead_unchanged_in_this_pass_means_no_wait():
    rollout.record('gpu02', 'SglangUnit', 'same')
    start = time.monotonic()
    rollout.wait_for_lane(ORDER, 'its SGLang unit')
    assert time.monotonic() - start < 0.1


def test_waits_for_the_host_directly_ahead_until_its_unit_is_done():
    # gpu01 (two ahead) is settled; gpu02 (directly ahead) is restarting: gpu03 waits for gpu02 alone.
    rollout.record('gpu01', 'SglangUnit', 'same')
    rollout.record('gpu02', 'SglangUnit', 'started')
    t = later(0.5, rollout.record, 'gpu02', 'SglangUnit', 'done')
    start = time.monotonic()
    rollout.wait_for_lane(ORDER, 'its SGLang unit', stall_s=10)
    t.join()
    assert 0.45 <= time.monotonic() - start < 3


def test_a_failure_anywhere_in_the_pass_refuses_the_step_naming_where_it_stopped():
    rollout.record('gpu02', 'ProxmoxGuest', 'change')
    later(0.3, rollout.failed, 'gpu02', 'its container')
    with pytest.raises(OperatorError) as e:
        rollout.wait_for_lane(ORDER, 'its SGLang unit', stall_s=10)
    assert str(e.value) == (
        'host gpu03: its SGLang unit not started: the rollout stopped at host gpu02 (its container) in this run; '
        'gpu03 keeps what it has. Fix gpu02 and re-run `pulumi up`: it goes on from there.')


def test_the_first_failure_is_the_one_named():
    rollout.failed('gpu02', 'its SGLang unit')
    rollout.failed('gpu04', 'its container')
    assert rollout.failure() == ('gpu02', 'its SGLang unit')


def test_host_ahead_that_went_down_and_never_came_back_is_refused_once_nothing_moves():
    rollout.record('gpu02', 'ProxmoxGuest', 'done')   # its container changed: it went down
    start = time.monotonic()
    with pytest.raises(OperatorError) as e:
        rollout.wait_for_lane(ORDER, 'its container', stall_s=0.5)
    assert 0.5 <= time.monotonic() - start < 3
    assert 'host gpu03: its container not started: host gpu02, ahead of it in its rollout lane, went down in ' \
           'this run and its SGLang unit was not reached' in str(e.value)


def test_heartbeat_of_a_call_in_flight_keeps_the_wait_going(monkeypatch):
    monkeypatch.setattr(rollout, 'BEAT_S', 0.1)
    rollout.record('gpu02', 'ProxmoxGuest', 'done')
    done = threading.Event()

    def long_step():
        with rollout.busy():          # e.g. gpu02's unit installing its runtime
            time.sleep(1.2)
        rollout.record('gpu02', 'SglangUnit', 'done')
        done.set()
    threading.Thread(target=long_step).start()
    time.sleep(0.05)
    with rollout.busy():              # as every call of the plugin is; the wait itself is no heartbeat
        rollout.wait_for_lane(ORDER, 'its SGLang unit', stall_s=0.6)
    assert done.is_set()


def test_host_ahead_left_out_of_the_pass_is_no_reason_to_wait():
    # `pulumi up --target` of gpu03 alone: nothing of gpu02 is in the pass; once nothing moves, gpu03 goes on.
    rollout.record('gpu02', 'HostStatus', 'same')
    start = time.monotonic()
    rollout.wait_for_lane(ORDER, 'its SGLang unit', stall_s=0.3)
    assert time.monotonic() - start < 2


def test_ctrl_c_ends_the_wait_with_one_line():
    rollout.record('gpu02', 'SglangUnit', 'started')
    later(0.2, operator.CANCELLED.set)
    with pytest.raises(Interrupted) as e:
        rollout.wait_for_lane(ORDER, 'its SGLang unit', stall_s=10)
    assert 'host gpu03: interrupted (Ctrl-C) while waiting for host gpu02 ahead of it in its rollout lane to ' \
           'serve again' in str(e.value)


def test_records_are_per_pass_and_a_dead_clis_passes_are_swept(tmp_path, monkeypatch):
    from provider import passdir
    monkeypatch.setattr(rollout, '_dir', [])
    monkeypatch.delenv(passdir.ENV, raising=False)
    monkeypatch.setattr(passdir.tempfile, 'gettempdir', lambda: str(tmp_path))
    monkeypatch.setattr(sys, 'argv', ['plugin', '127.0.0.1:40001'])
    root = passdir.base()
    assert oct(os.stat(root).st_mode & 0o777) == '0o700'
    gone = subprocess.Popen(['true'])
    gone.wait()
    stale = os.path.join(root, '%d-12345-40000' % gone.pid)
    os.makedirs(stale)
    here = rollout.run_dir()
    assert not os.path.exists(stale)
    assert os.path.basename(here) == '%d-%s-40001' % (os.getppid(), passdir.start_time(os.getppid()))
    # The next pass of the same CLI (the engine starts its plugins afresh, on a new address) has its own records.
    rollout.record('gpu02', 'SglangUnit', 'same')
    monkeypatch.setattr(rollout, '_dir', [])
    monkeypatch.setattr(sys, 'argv', ['plugin', '127.0.0.1:40002'])
    assert rollout.run_dir() != here and rollout.state_of('gpu02', 'SglangUnit') is None


def test_a_shared_or_foreign_directory_is_refused(tmp_path, monkeypatch):
    from provider import passdir
    monkeypatch.setattr(passdir.tempfile, 'gettempdir', lambda: str(tmp_path))
    path = os.path.join(str(tmp_path), 'gpuhost-rollout-%d' % os.getuid())
    os.makedirs(path)
    os.chmod(path, 0o777)
    with pytest.raises(RuntimeError, match='not the operator'):
        passdir.base()


class Served:
    ROLLOUT_STEP = 'its SGLang unit'

    def __init__(self, fail=False):
        self.fail = fail

    def update(self):
        if self.fail:
            raise OperatorError('SGLang did not come back')


def test_the_plugin_step_waits_records_and_stops_the_pass_on_failure():
    from provider.__main__ import GpuhostProvider
    p = GpuhostProvider()
    urn = 'urn:pulumi:fleet::gpuhost::gpuhost:index:SglangService$gpuhost:index:SglangUnit::gpu03-sglang-unit'
    rollout.record('gpu02', 'SglangUnit', 'same')
    with p.step(urn, {'rollout': ORDER}, Served()):
        assert rollout.state_of('gpu03', 'SglangUnit') == 'started'
    assert rollout.state_of('gpu03', 'SglangUnit') == 'done'
    with pytest.raises(OperatorError):
        with p.step(urn, {'rollout': ORDER}, Served(fail=True)):
            Served(fail=True).update()
    assert rollout.state_of('gpu03', 'SglangUnit') == 'failed'
    assert rollout.failure() == ('gpu03', 'its SGLang unit')


def test_a_host_status_without_reboots_never_waits():
    from resources.host import HostStatusProvider
    from provider.__main__ import GpuhostProvider
    p = GpuhostProvider()
    rollout.record('gpu02', 'SglangUnit', 'started')   # gpu02 is restarting
    urn = 'urn:pulumi:fleet::gpuhost::gpuhost:index:ProxmoxHost$gpuhost:index:HostStatus::gpu03-host-status'
    start = time.monotonic()
    with p.step(urn, {'rollout': ORDER, 'reboot': 'never'}, HostStatusProvider()):
        pass
    assert time.monotonic() - start < 0.1
    rollout.record('gpu02', 'SglangUnit', 'done')
    with p.step(urn, {'rollout': ORDER, 'reboot': 'when-required'}, HostStatusProvider()):
        pass


def test_with_a_canary_every_other_host_waits_for_its_verdict_whatever_its_lane():
    """gpuhost:rollout.canary: with two lanes, gpu02 (first of the second lane, nothing ahead of it) still waits for
    gpu01's SGLang unit - the judged canary - before it takes the change; the canary itself never waits."""
    two = {'host': 'gpu02', 'before': [], 'after': ['gpu04'], 'max_unavailable': 2, 'canary': 'gpu01',
           'order': ['gpu01', 'gpu02', 'gpu03', 'gpu04']}
    start = time.monotonic()
    rollout.wait_for_lane(dict(two, host='gpu01', after=['gpu03']), 'its SGLang unit')
    assert time.monotonic() - start < 0.1
    rollout.record('gpu01', 'SglangUnit', 'started')
    t = later(0.5, rollout.record, 'gpu01', 'SglangUnit', 'done')
    rollout.wait_for_lane(two, 'its SGLang unit', stall_s=10)
    t.join()
    assert 0.45 <= time.monotonic() - start < 3


def test_a_canary_rolled_back_stops_every_other_host():
    rollout.record('gpu01', 'SglangUnit', 'started')
    later(0.3, rollout.failed, 'gpu01', 'its SGLang unit')
    with pytest.raises(OperatorError, match='host gpu03: its SGLang unit not started: the rollout stopped at host '
                                            'gpu01 \\(its SGLang unit\\) in this run'):
        rollout.wait_for_lane(dict(ORDER, canary='gpu01'), 'its SGLang unit', stall_s=10)
