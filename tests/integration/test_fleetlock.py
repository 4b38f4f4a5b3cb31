"""The fleet lock (gpuhost:rollout.fleet_lock; issue 61) on a two-host fleet lab with a real etcd (auth on, the
password a Pulumi secret): lanes that would let both hosts restart at once (max_unavailable 2) under a lock of one
slot - the preview names the lock, `up` takes one host down at a time and gives the slot back, the password never in
the state in plain text; etcd down - a no-op `up` runs, a restart is refused in one line naming the endpoint and
nothing restarts; etcd back, the next `up` converges; a runner killed (kill -9 of the CLI) while it holds a slot - the
slot stays held until its TTL runs out after the plugin ends, then the re-run takes it and converges.

The tests run in order and share the fleet."""

import copy
import json
import os
import shutil
import signal
import subprocess
import threading
import time

import pytest

from tests.etcdlab import ETCD, Etcd
from tests.lablib import FleetLab, claim_net, keep_logs, max_overlap

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900),
              pytest.mark.skipif(ETCD is None, reason='etcd is not installed (Debian: apt-get install etcd-server)')]
STACK = 'fleetlock'
HOSTS = ('gpu01', 'gpu02')
PASSWORD = 'lab-etcd-lock-password-7f3a'


@pytest.fixture(scope='module')
def fleet(tmp_path_factory, request):
    if os.geteuid() != 0:
        pytest.fail('the integration tests need root (mount namespaces for the simulated hosts)')
    base = str(tmp_path_factory.mktemp('fleetlock'))
    etcd = Etcd(os.path.join(base, 'etcd')).start()
    etcd.enable_auth('gpuhost-lock', PASSWORD)
    claims = [claim_net() for _ in HOSTS]
    f = FleetLab(base, [net for net, _ in claims])
    failed = request.session.testsfailed
    try:
        for i in range(1, len(HOSTS) + 1):
            f.add(i)
        cfg = f.stack_config(list(HOSTS), max_unavailable=2)
        cfg['gpuhost:rollout']['fleet_lock'] = {'group': 'lab', 'slots': 1, 'endpoints': [etcd.url], 'ttl_s': 5,
                                                'user': 'gpuhost-lock'}
        write(f, cfg)
        f.pulumi('up', '--yes', '--skip-preview', stack=STACK)
        yield f, cfg, etcd
    finally:
        if request.session.testsfailed > failed:
            keep_logs(base, 'test_fleetlock')
        f.down()
        etcd.stop()
        for _, lock in claims:
            lock.close()
        shutil.rmtree(base, ignore_errors=True)


def write(f, cfg):
    """The stack file, then the lock's password set as a secret (as an operator does: never in the file as text)."""
    f.write_stack(STACK, cfg)
    f.pulumi('config', 'set', '--secret', '--path', 'gpuhost:rollout.fleet_lock.password', PASSWORD, stack=STACK)


def with_speculation(cfg, steps):
    cfg = copy.deepcopy(cfg)
    cfg['gpuhost:sglang']['speculative'] = {'algorithm': 'NEXTN', 'num_steps': steps, 'eagle_topk': 1,
                                            'num_draft_tokens': steps + 1}
    return cfg


def holders(etcd) -> str:
    return etcd.ctl('get', '--prefix', '/gpuhost/fleetlock/lab/', user='root:root-pw')


def test_one_slot_takes_one_host_down_at_a_time_though_the_lanes_allow_two_and_gives_it_back(fleet):
    f, cfg, etcd = fleet
    change = with_speculation(cfg, 2)
    write(f, change)
    pre = f.pulumi('preview', '--diff', stack=STACK)
    said = ' '.join((pre.stdout + pre.stderr).split())
    for host in HOSTS:
        assert ('host %s: its SGLang unit: `up` takes a slot of fleet lock lab (1 slot, etcd %s) before a step that '
                'may stop SGLang, and gives it back once the host serves again' % (host, etcd.url)) in said, said
    assert holders(etcd) == ''
    starts = {n: f.labs[n].unit_starts() for n in HOSTS}
    began = time.time()
    res = f.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    assert {n: f.labs[n].unit_starts() for n in HOSTS} == {n: starts[n] + 1 for n in HOSTS}
    windows = [iv for n in HOSTS for iv in f.labs[n].down_intervals() if iv[0] >= began]
    assert len(windows) == 2 and max_overlap(windows) == 1, windows
    out = ' '.join((res.stdout + res.stderr).split())
    assert 'waiting for a slot of fleet lock lab (1 slot, etcd %s) - all held (0: gpu0' % etcd.url in out, out[-3000:]
    assert holders(etcd) == '', 'a slot outlived its host serving again'
    state = f.pulumi('stack', 'export', stack=STACK).stdout
    assert PASSWORD not in state
    providers = [r for r in json.loads(state)['deployment']['resources'] if r['type'] == 'pulumi:providers:gpuhost']
    assert len(providers) == 2 and all(r['inputs']['fleet_lock'].get('4dabf18193072939515e22adb298388d') ==
                                       '1b47061264138c4ac30d75fd1eb44270' for r in providers)
    f.pulumi('up', '--yes', '--expect-no-changes', stack=STACK)


def test_etcd_down_refuses_a_restart_in_one_line_and_lets_a_no_op_run(fleet):
    f, cfg, etcd = fleet
    etcd.stop()
    try:
        f.pulumi('up', '--yes', '--expect-no-changes', stack=STACK)
        write(f, with_speculation(cfg, 3))
        starts = {n: f.labs[n].unit_starts() for n in HOSTS}
        res = f.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
        out = res.stdout + res.stderr
        assert res.returncode != 0
        assert {n: f.labs[n].unit_starts() for n in HOSTS} == starts
        lines = [line for line in out.splitlines() if 'etcd unreachable: %s' % etcd.url in line]
        assert lines and all('not started: fleet lock lab (1 slot, etcd %s)' % etcd.url in line and
                             'fail closed' in line for line in lines), out[-3000:]
        assert PASSWORD not in out
    finally:
        etcd.start()
    f.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    for n in HOSTS:
        assert '--speculative-num-steps 3' in f.labs[n].ct_exec(['cat', '/etc/systemd/system/sglang-qwen.service']
                                                                 ).stdout
    assert holders(etcd) == ''


def test_a_killed_runners_slot_is_freed_by_its_ttl_and_the_rerun_converges(fleet):
    f, cfg, etcd = fleet
    write(f, with_speculation(cfg, 2))
    proc = subprocess.Popen(['pulumi', 'up', '--yes', '--skip-preview', '--stack', STACK], cwd=f.project, env=f.env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.time() + 240
        while not holders(etcd):
            assert proc.poll() is None and time.time() < deadline, ''.join(lines)[-3000:]
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)     # the runner dies mid-rollout: nothing of it gives the slot back
        killed = time.time()
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    reader.join(10)
    assert holders(etcd), 'the slot went before its TTL'
    while holders(etcd):
        # The plugin notices its engine is gone (two missed probes, 2 s apart), its renewals stop, the TTL (5 s) runs.
        assert time.time() - killed < 30, 'a dead runner\'s slot outlived its TTL: %s' % holders(etcd)
        time.sleep(0.2)
    assert time.time() - killed >= 5
    res = f.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
    if res.returncode != 0:
        assert 'locked' in res.stdout + res.stderr, (res.stdout + res.stderr)[-3000:]
        f.pulumi('cancel', '--yes', stack=STACK)
        f.pulumi('refresh', '--yes', '--clear-pending-creates', stack=STACK)
        f.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    for n in HOSTS:
        assert '--speculative-num-steps 2' in f.labs[n].ct_exec(['cat', '/etc/systemd/system/sglang-qwen.service']
                                                                 ).stdout
    assert holders(etcd) == ''
    f.pulumi('up', '--yes', '--expect-no-changes', stack=STACK)
