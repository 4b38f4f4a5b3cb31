"""The fleet lock's client (transport/fleetlock.py) against a real etcd (Debian's etcd-server, started here on loopback
with its data in a temporary directory): N slots and the next waits until one is released, the keep-alive holds a
slot past its TTL, a holder that stops renewing (a killed runner) loses it when the TTL runs out, taking it again is
idempotent, and etcd down or a login refused is a refusal in one line naming the endpoint."""

import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.etcdlab import ETCD, Etcd, free_port, make_pki
from transport import fleetlock
from transport.operator import CANCELLED, Interrupted

pytestmark = pytest.mark.skipif(ETCD is None, reason='etcd is not installed (Debian: apt-get install etcd-server)')
TTL = 2
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope='module')
def etcd(tmp_path_factory):
    server = Etcd(tmp_path_factory.mktemp('etcd')).start()
    yield server.url
    server.stop()


group_no = [0]


def settings(url, slots=2, **kw):
    group_no[0] += 1
    return fleetlock.Settings(group='g%d-%d' % (os.getpid(), group_no[0]), slots=slots, endpoints=(url,),
                              ttl_s=TTL, **kw)


def test_n_slots_are_taken_and_the_next_waits_until_one_is_released(etcd, capsys):
    s = settings(etcd, slots=2)
    a = fleetlock.acquire(s, 'gpu01 a/s1', 'gpu01', 'nothing changed')
    b = fleetlock.acquire(s, 'gpu02 a/s2', 'gpu02', 'nothing changed')
    assert {a.index, b.index} == {0, 1}
    got = []
    waiter = threading.Thread(target=lambda: got.append(
        fleetlock.acquire(s, 'gpu03 a/s3', 'gpu03', 'nothing changed', poll_s=0.1)))
    waiter.start()
    # Until the waiter says it waits (it read the slots and found both held), never a fixed sleep.
    err, deadline = '', time.monotonic() + 10
    while 'gpu03: waiting for a slot' not in err and time.monotonic() < deadline:
        err += capsys.readouterr().err
        time.sleep(0.05)
    assert not got, 'a third host took a slot of two'
    assert 'gpu03: waiting for a slot of fleet lock %s (2 slots, etcd %s) - all held (0: gpu0' % (s.group, etcd) in err
    a.release()
    waiter.join(5)
    assert got and got[0].index == a.index
    assert fleetlock.Client(s).holders() == {a.index: 'gpu03 a/s3', b.index: 'gpu02 a/s2'}
    b.release()
    got[0].release()
    assert fleetlock.Client(s).holders() == {}


def test_the_keepalive_holds_a_slot_past_its_ttl_and_a_holder_that_stops_renewing_loses_it(etcd):
    s = settings(etcd, slots=1)
    kept = fleetlock.acquire(s, 'gpu01 a/s1', 'gpu01', '-')
    time.sleep(TTL * 1.8)
    assert fleetlock.Client(s).holders() == {0: 'gpu01 a/s1'}
    # A runner killed mid-step, as etcd sees it: the renewals stop, nothing is released.
    kept.stop_keepalive()
    assert fleetlock.Client(s).holders() == {0: 'gpu01 a/s1'}
    deadline = time.monotonic() + TTL + 3
    while fleetlock.Client(s).holders() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert fleetlock.Client(s).holders() == {}, 'the dead holder\'s slot outlived its TTL'
    fleetlock.acquire(s, 'gpu02 a/s1', 'gpu02', '-').release()


def test_a_killed_runner_frees_its_slot_by_the_ttl(etcd):
    s = settings(etcd, slots=1)
    code = ('import sys, time; sys.path.insert(0, %r); from transport import fleetlock; '
            's = fleetlock.Settings(group=%r, slots=1, endpoints=(%r,), ttl_s=%d); '
            'fleetlock.acquire(s, "gpu09 b/s9", "gpu09", "-"); print("held", flush=True); time.sleep(60)' % (
                REPO, s.group, etcd, TTL))
    runner = subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.PIPE, text=True)
    try:
        assert runner.stdout.readline().strip() == 'held'
        time.sleep(TTL)   # its keep-alive held it past one TTL
        assert fleetlock.Client(s).holders() == {0: 'gpu09 b/s9'}
        os.kill(runner.pid, signal.SIGKILL)
        runner.wait(5)
        started = time.monotonic()
        slot = fleetlock.acquire(s, 'gpu01 a/s1', 'gpu01', '-', poll_s=0.1)
        assert time.monotonic() - started < TTL + 2
        slot.release()
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait(5)


def test_taking_the_slot_a_holder_has_is_idempotent(etcd):
    s = settings(etcd, slots=2)
    first = fleetlock.acquire(s, 'gpu01 a/s1', 'gpu01', '-')
    # Another process of the same holder (a re-run while the killed run's lease still runs): the same slot, onto
    # its own lease - never a second slot.
    again = fleetlock.acquire(s, 'gpu01 a/s1', 'gpu01', '-', client=fleetlock.Client(s))
    assert again.index == first.index and again.lease != first.lease
    assert fleetlock.Client(s).holders() == {first.index: 'gpu01 a/s1'}
    first.stop_keepalive()
    first.client.revoke(first.lease)   # the old lease ending frees nothing: the key is on the new one
    assert fleetlock.Client(s).holders() == {first.index: 'gpu01 a/s1'}
    again.release()
    assert fleetlock.Client(s).holders() == {}


def test_a_ctrl_c_ends_the_wait_in_one_line(etcd):
    s = settings(etcd, slots=1)
    held = fleetlock.acquire(s, 'gpu01 a/s1', 'gpu01', '-')
    threading.Timer(0.3, CANCELLED.set).start()
    try:
        with pytest.raises(Interrupted) as e:
            fleetlock.acquire(s, 'gpu02 a/s1', 'host gpu02', 'its SGLang unit has not started', poll_s=0.1)
    finally:
        CANCELLED.clear()
        held.release()
    assert str(e.value) == ('host gpu02: interrupted (Ctrl-C) while waiting for a slot of fleet lock %s (1 slot, etcd '
                            '%s) (held by 0: gpu01 a/s1); its SGLang unit has not started' % (s.group, etcd))


def test_etcd_down_refuses_in_one_line_naming_the_endpoint():
    url = 'http://127.0.0.1:%d' % free_port()
    with pytest.raises(fleetlock.Refused) as e:
        fleetlock.acquire(fleetlock.Settings(group='g', slots=1, endpoints=(url,), ttl_s=TTL), 'gpu01 a/s', 'gpu01',
                          '-')
    text = str(e.value)
    assert '\n' not in text
    assert text.startswith('fleet lock g (1 slot, etcd %s): etcd unreachable: %s (' % (url, url))
    assert 'fail closed' in text


def test_a_refused_login_is_one_line_without_the_password(tmp_path):
    server = Etcd(tmp_path / 'etcd').start()
    url = server.url
    try:
        server.enable_auth('lock', 'good-pw')
        good = fleetlock.Settings(group='auth', slots=1, endpoints=(url,), ttl_s=TTL, user='lock', password='good-pw')
        fleetlock.acquire(good, 'gpu01 a/s', 'gpu01', '-').release()
        bad = fleetlock.Settings(group='auth', slots=1, endpoints=(url,), ttl_s=TTL, user='lock', password='WRONG-pw')
        with pytest.raises(fleetlock.Refused) as e:
            fleetlock.acquire(bad, 'gpu01 a/s', 'gpu01', '-')
        text = str(e.value)
        assert '\n' not in text and 'WRONG-pw' not in text and url in text
        assert 'refused the login of user lock' in text
        anonymous = fleetlock.Settings(group='auth', slots=1, endpoints=(url,), ttl_s=TTL)
        with pytest.raises(fleetlock.Refused, match='it requires a login'):
            fleetlock.acquire(anonymous, 'gpu01 a/s', 'gpu01', '-')
    finally:
        server.stop()


@pytest.mark.skipif(shutil.which('openssl') is None, reason='openssl is not installed (it makes the certificates)')
def test_over_tls_with_a_client_certificate_and_refused_without_one(tmp_path):
    """https with the CA given and etcd's client certificate auth: the slot is taken; a certificate etcd does not
    trust, or none, is a refusal in one line naming the endpoint - and a CA that is not one, before any call."""
    pki = make_pki(tmp_path / 'pki')
    server = Etcd(tmp_path / 'etcd', pki=pki).start()
    try:
        tls = fleetlock.Settings(group='tls', slots=1, endpoints=(server.url,), ttl_s=TTL, ca_file=pki['ca'],
                                 cert_file=pki['client'], key_file=pki['client-key'])
        fleetlock.acquire(tls, 'gpu01 a/s', 'gpu01', '-').release()
        for bad in (dict(cert_file=None, key_file=None), dict(ca_file=None)):
            with pytest.raises(fleetlock.Refused) as e:
                fleetlock.acquire(fleetlock.Settings(**dict(vars(tls), **bad)), 'gpu01 a/s', 'gpu01', '-')
            assert '\n' not in str(e.value) and 'etcd unreachable: %s (' % server.url in str(e.value), bad
            assert 'the TLS handshake failed: fix gpuhost:rollout.fleet_lock.ca_file' in str(e.value), bad
        with pytest.raises(fleetlock.Refused, match=r'the TLS files cannot be used .*fix '
                                                    r'gpuhost:rollout.fleet_lock.ca_file'):
            fleetlock.Client(fleetlock.Settings(**dict(vars(tls), ca_file=pki['client-key'])))
    finally:
        server.stop()


class Unit:
    ROLLOUT_STEP = 'its SGLang unit'


UNIT_URN = 'urn:pulumi:shard-a::gpuhost::gpuhost:index:SglangService$gpuhost:index:SglangUnit::%s-sglang-unit'
HOST_URN = 'urn:pulumi:shard-a::gpuhost::gpuhost:index:ProxmoxHost$gpuhost:index:HostStatus::%s-host-status'


@pytest.fixture
def plugin_pass(tmp_path, monkeypatch):
    from provider import rollout
    monkeypatch.setattr(rollout, '_dir', [str(tmp_path)])
    monkeypatch.setattr(rollout, '_slots', {})
    monkeypatch.setattr(rollout, '_steps', {})
    yield rollout
    for slot in list(rollout._slots.values()):
        slot.release()


def test_the_plugin_takes_the_hosts_slot_before_it_goes_down_and_gives_it_back_once_sglang_serves(etcd, plugin_pass):
    """provider/__main__.py step(): a host's reboot takes its slot (one of one), its SGLang unit's restart keeps it,
    the unit done gives it back - and only then does another host of the fleet (another lane, no wait of its own)
    start going down. A failed step keeps its slot: the host may be down."""
    from resources.host import HostStatusProvider
    from provider.__main__ import GpuhostProvider
    rollout = plugin_pass
    s = settings(etcd, slots=1)
    lock = {'group': s.group, 'slots': 1, 'endpoints': [etcd], 'ttl_s': TTL}

    def order(host):
        return {'host': host, 'before': [], 'after': [], 'max_unavailable': 2, 'order': ['gpu01', 'gpu02'],
                'fleet_lock': lock}
    p = GpuhostProvider()
    with p.step(HOST_URN % 'gpu01', {'rollout': order('gpu01'), 'reboot': 'when-required'}, HostStatusProvider()):
        assert fleetlock.Client(s).holders() == {0: 'gpu01 gpuhost/shard-a'}
    assert fleetlock.Client(s).holders() == {0: 'gpu01 gpuhost/shard-a'}, 'given back before SGLang served again'
    started = threading.Event()

    def other():
        with p.step(UNIT_URN % 'gpu02', {'rollout': order('gpu02')}, Unit()):
            started.set()
    waiter = threading.Thread(target=other)
    waiter.start()
    with p.step(UNIT_URN % 'gpu01', {'rollout': order('gpu01')}, Unit()):
        assert not started.wait(1.0), 'gpu02 went down while gpu01 held the only slot'
    waiter.join(5)
    assert started.is_set() and fleetlock.Client(s).holders() == {}
    # Unchanged in a pass: nothing asks etcd (no slot to take, none to give back).
    rollout.record('gpu02', 'SglangUnit', 'same')
    with pytest.raises(RuntimeError):
        with p.step(UNIT_URN % 'gpu02', {'rollout': order('gpu02')}, Unit()):
            raise RuntimeError('SGLang did not come back')
    assert fleetlock.Client(s).holders() == {0: 'gpu02 gpuhost/shard-a'}, 'a failed step gave its slot back'


def test_a_canary_that_restarts_its_baseline_holds_that_hosts_slot_too_until_the_baseline_serves_its_own_change(
        etcd, plugin_pass):
    """baseline: restart - the canary's SGLang step restarts gpu02 as its baseline: both hosts' slots are held during
    it; the canary's goes back when its unit is done, gpu02's when its own unit has taken the change (its step takes
    the slot it holds already, never a third)."""
    from provider.__main__ import GpuhostProvider
    rollout = plugin_pass
    s = settings(etcd, slots=2)
    lock = {'group': s.group, 'slots': 2, 'endpoints': [etcd], 'ttl_s': TTL}

    def order(host):
        return {'host': host, 'before': [], 'after': [], 'max_unavailable': 2, 'order': ['gpu01', 'gpu02', 'gpu03'],
                'canary': 'gpu01', 'fleet_lock': lock}
    p = GpuhostProvider()
    canary = {'host': 'gpu01', 'restart': {'host': 'gpu02'}}
    with p.step(UNIT_URN % 'gpu01', {'rollout': order('gpu01'), 'canary': canary}, Unit()):
        assert sorted(fleetlock.Client(s).holders().values()) == ['gpu01 gpuhost/shard-a', 'gpu02 gpuhost/shard-a']
    assert list(fleetlock.Client(s).holders().values()) == ['gpu02 gpuhost/shard-a'], 'the baseline is not done yet'
    with p.step(UNIT_URN % 'gpu02', {'rollout': order('gpu02')}, Unit()):
        assert list(fleetlock.Client(s).holders().values()) == ['gpu02 gpuhost/shard-a']
    assert fleetlock.Client(s).holders() == {}


def test_the_plugin_refuses_a_disruptive_step_when_etcd_is_down_and_runs_the_others(plugin_pass):
    from provider.__main__ import GpuhostProvider
    url = 'http://127.0.0.1:%d' % free_port()
    lock = {'group': 'g', 'slots': 1, 'endpoints': [url], 'ttl_s': TTL}
    order = {'host': 'gpu01', 'before': [], 'after': [], 'max_unavailable': 1, 'order': ['gpu01'], 'fleet_lock': lock}
    p = GpuhostProvider()
    ran = []
    with pytest.raises(fleetlock.Refused) as e:
        with p.step(UNIT_URN % 'gpu01', {'rollout': order}, Unit()):
            ran.append('restart')
    assert not ran and str(e.value).startswith('host gpu01: its SGLang unit not started: fleet lock g (1 slot, etcd '
                                               '%s): etcd unreachable: %s (' % (url, url))
    assert '\n' not in str(e.value)
    assert plugin_pass.state_of('gpu01', 'SglangUnit') == 'failed'
    # A diff, a read, a step that never stops SGLang: no lock asked for.
    with p.step(UNIT_URN % 'gpu01', {'rollout': order}):
        ran.append('diff')
    assert ran == ['diff']


def test_the_preview_says_which_lock_a_change_that_may_stop_sglang_takes(capsys, monkeypatch):
    from provider.__main__ import lock_preview
    from resources.host import HostStatusProvider
    lock = {'group': 'prod', 'slots': 2, 'endpoints': ['https://etcd1:2379', 'https://etcd2:2379'], 'ttl_s': 60}
    rollout = {'host': 'gpu03', 'before': [], 'after': [], 'max_unavailable': 1, 'order': ['gpu03'],
               'fleet_lock': lock}
    lock_preview(Unit(), {'rollout': rollout})
    assert capsys.readouterr().err == (
        'info: host gpu03: its SGLang unit: `up` takes a slot of fleet lock prod (2 slots, etcd https://etcd1:2379, '
        'https://etcd2:2379) before a step that may stop SGLang, and gives it back once the host serves again\n')
    # A host status that never reboots, a resource without the lock: nothing said.
    lock_preview(HostStatusProvider(), {'rollout': rollout, 'reboot': 'never'})
    lock_preview(Unit(), {'rollout': dict(rollout, fleet_lock=None)})
    assert capsys.readouterr().err == ''
    # The driver's decision reads the host: the preview never asks it (its own diff prices the plan), and says "may".
    from resources import driver
    asked = []
    monkeypatch.setattr(driver.NvidiaDriverProvider, 'plan_for', lambda self, props: asked.append(props))
    lock_preview(driver.NvidiaDriverProvider(), {'rollout': rollout})
    assert 'host gpu03: its NVIDIA driver: `up` takes a slot of fleet lock prod' in capsys.readouterr().err
    assert asked == [], 'the preview read the host for the driver\'s decision'


def test_a_step_that_ends_after_the_hosts_unit_was_found_unchanged_gives_the_slot_back(etcd, plugin_pass):
    """A step the SGLang unit does not wait for (a driver upgrade beside it): the unit found unchanged while the step
    ran keeps the slot (the host is down), the step's end gives it back."""
    from resources.host import HostStatusProvider
    from provider.__main__ import GpuhostProvider
    s = settings(etcd, slots=1)
    order = {'host': 'gpu01', 'before': [], 'after': [], 'max_unavailable': 1, 'order': ['gpu01'],
             'fleet_lock': {'group': s.group, 'slots': 1, 'endpoints': [etcd], 'ttl_s': TTL}}
    p = GpuhostProvider()
    with p.step(HOST_URN % 'gpu01', {'rollout': order, 'reboot': 'when-required'}, HostStatusProvider()):
        plugin_pass.record('gpu01', 'SglangUnit', 'same')
        assert fleetlock.Client(s).holders() == {0: 'gpu01 gpuhost/shard-a'}
    assert fleetlock.Client(s).holders() == {}


def test_a_member_that_cannot_answer_passes_the_call_to_the_next(etcd):
    """Endpoints are tried in order: one that refuses connections, one that answers HTTP 503 (a member without a
    leader), then the live one."""
    import http.server
    import socketserver

    class NoLeader(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.send_response(503)
            self.end_headers()
            self.wfile.write(b'{"error": "etcdserver: no leader", "code": 14}')

        def log_message(self, *args):
            pass
    server = socketserver.TCPServer(('127.0.0.1', 0), NoLeader)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sick = 'http://127.0.0.1:%d' % server.server_address[1]
    dead = 'http://127.0.0.1:%d' % free_port()
    try:
        s = fleetlock.Settings(group='failover', slots=1, endpoints=(dead, sick, etcd), ttl_s=TTL)
        fleetlock.acquire(s, 'gpu01 a/s', 'gpu01', '-').release()
        with pytest.raises(fleetlock.Refused) as e:
            fleetlock.acquire(fleetlock.Settings(group='failover', slots=1, endpoints=(dead, sick), ttl_s=TTL),
                              'gpu01 a/s', 'gpu01', '-')
        assert str(e.value).startswith('fleet lock failover (1 slot, etcd %s, %s): etcd %s answered /v3/kv/range with '
                                       'HTTP 503: etcdserver: no leader (before it: %s (' % (dead, sick, sick, dead))
    finally:
        server.shutdown()
        server.server_close()


def test_make_check_says_whether_etcd_answers_and_who_holds_the_slots(etcd):
    import copy
    import config
    from tests.unit.config.test_config import lab_data
    from tests.unit.config.test_fleet_config import entry
    from tools.check import fleet_lock_line
    data = copy.deepcopy(lab_data())
    data.update(hosts=[entry('gpu01', 1), entry('gpu02', 2)],
                rollout={'fleet_lock': {'group': 'check-%d' % os.getpid(), 'slots': 2, 'endpoints': [etcd]}})
    f = config.parse_fleet(data)
    assert fleet_lock_line(f) == ('  \u2713 fleet lock check-%d (2 slots, etcd %s) answers: 0 of 2 slots held'
                                  % (os.getpid(), etcd), False)
    held = fleetlock.acquire(fleetlock.Settings.of(f.rollout_info(0)['fleet_lock']), 'gpu07 other/shard', 'gpu07',
                             '-')
    try:
        assert fleet_lock_line(f)[0].endswith('answers: 1 of 2 slots held - 0: gpu07 other/shard')
    finally:
        held.release()
    data['rollout']['fleet_lock']['endpoints'] = ['http://127.0.0.1:%d' % free_port()]
    line, problem = fleet_lock_line(config.parse_fleet(data))
    assert problem and line.startswith('  \u2717 fleet lock check-') and 'etcd unreachable' in line
    data.pop('rollout')
    assert fleet_lock_line(config.parse_fleet(data)) == (None, False)
