"""Long steps as durable jobs (transport/jobs.py, hostscripts/job.sh): transient systemd units in the
container (its real systemd, through `pct exec`) and on the host, started over SSH and followed with short polls.
What an operator relies on: a job outlives the SSH command, the connection and the follower; a second start
re-attaches instead of starting a copy; a changed declaration stops the old one first; a limit and a stall
stop it, named; its secret input is gone when it ends."""

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from tests.lablib import REPO

sys.path.insert(0, REPO)
from transport import jobs, remote  # noqa: E402

# A job that counts: one step a second, its progress file rewritten at each, its stdin's length reported.
COUNTER = r'''
import json, os, sys, time
n = int(sys.argv[1])
secret = sys.stdin.read()
p = os.environ['GPUHOST_PROGRESS']
for i in range(n):
    time.sleep(float(os.environ.get('STEP_S', '0.5')))
    with open(p + '.tmp', 'w') as f:
        json.dump({'counter': i + 1, 'line': 'step %d of %d' % (i + 1, n)}, f)
    os.replace(p + '.tmp', p)
    with open(os.path.join(os.environ['GPUHOST_JOB_DIR'], 'steps'), 'a') as f:
        f.write('%d %d\n' % (os.getpid(), i + 1))
print(json.dumps({'done': n, 'secret_len': len(secret)}))
'''


@pytest.fixture(scope='module')
def target(lab):
    lab.create_ct(200)
    s = lab.info['ssh']
    with open(s['key_file']) as f:
        key = f.read()
    return remote.Target(host=s['host'], port=s['port'], user=s['user'], private_key=key, host_key=s['host_key'],
                         command_timeout=20)


def counter(n, name='gpuhost-test-count', vmid='200', **kw):
    return jobs.Job(name=name, label='counting to %d' % n, spec=jobs.spec_of({'n': n}), interpreter='python3',
                    body=COUNTER, args=(str(n),), stdin=b'a-secret-token', vmid=vmid, **kw)


def job_dir(lab, job):
    root = lab.ct_root(int(job.vmid)) if job.vmid else lab.host.path()
    return os.path.join(root, jobs.JOBS_DIR.lstrip('/'), job.name)


def steps(lab, job):
    if job.vmid is None:   # the host's own /var (read inside it)
        text = lab.on_host('cat %s/%s/steps' % (jobs.JOBS_DIR, job.name)).stdout
    else:
        with open(os.path.join(job_dir(lab, job), 'steps')) as f:
            text = f.read()
    return [tuple(int(x) for x in line.split()) for line in text.splitlines()]


def test_a_job_runs_to_its_end_with_progress_and_its_secret_gone(lab, target):
    said = []
    job = counter(6)
    p = jobs.run(target, job, say=said.append, poll_s=0.3, say_s=1.0)
    assert json.loads(p.out) == {'done': 6, 'secret_len': len(b'a-secret-token')}
    assert any('counting to 6: step' in s for s in said), said
    d = job_dir(lab, job)
    assert not os.path.exists(os.path.join(d, 'input')), 'the secret input outlived the job'
    assert os.stat(d).st_mode & 0o777 == 0o700
    # The unit is gone (--collect): a new start is a new job.
    assert lab.ct_exec(['systemctl', 'list-units', '--all', '--plain', '--no-legend', job.name + '-*'],
                       check=False).stdout.strip() == ''


def test_a_killed_follower_leaves_the_job_running_and_the_next_start_reattaches(lab, target):
    job = counter(8)
    assert jobs.start(target, job) == 'started'
    time.sleep(1.5)
    # Nobody follows it now (a killed `pulumi`); it goes on. A second start is the same job, not a copy.
    said = []
    assert jobs.start(target, job, say=said.append) == 'attached'
    p = jobs.follow(target, job, poll_s=0.3)
    assert json.loads(p.out)['done'] == 8
    pids = {pid for pid, _ in steps(lab, job)}
    assert len(pids) == 1 and [n for _, n in steps(lab, job)] == list(range(1, 9)), steps(lab, job)


def test_two_starts_at_once_make_one_job(lab, target):
    job = counter(4)
    results = []
    threads = [threading.Thread(target=lambda: results.append(jobs.start(target, job))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ['attached', 'attached', 'started'], results
    jobs.follow(target, job, poll_s=0.3)
    assert len({pid for pid, _ in steps(lab, job)}) == 1


def test_a_changed_declaration_stops_the_running_job_first(lab, target):
    old, new = counter(30), counter(3)
    assert jobs.start(target, old) == 'started'
    time.sleep(1.0)
    said = []
    p = jobs.run(target, new, say=said.append, poll_s=0.3)
    assert json.loads(p.out)['done'] == 3
    assert any('runs an earlier declaration; stopping it first' in s for s in said), said
    # The old one ran a step or two, then the new one from 1 - one after the other, never side by side.
    got = steps(lab, new)
    assert [n for _, n in got][-3:] == [1, 2, 3] and len({pid for pid, _ in got}) == 1


def test_a_limit_and_a_stall_stop_the_job_and_say_so(lab, target):
    with pytest.raises(jobs.JobFailed) as e:
        jobs.run(target, counter(40, limit_s=2, limit_key='gpuhost:runtime.install_timeout_s'), poll_s=0.3)
    assert 'ran longer than its limit of 2 s (gpuhost:runtime.install_timeout_s) and was stopped' in str(e.value)
    hang = jobs.Job(name='gpuhost-test-hang', label='a hung tool', spec='hang', interpreter='bash', body='sleep 600',
                    vmid='200', stall_s=3, stall_key='gpuhost:runtime.stall_timeout_s')
    t0 = time.time()
    with pytest.raises(jobs.JobFailed) as e:
        jobs.run(target, hang, poll_s=0.3)
    assert 'made no progress for 3 s (gpuhost:runtime.stall_timeout_s) and was stopped' in str(e.value)
    assert time.time() - t0 < 30
    assert jobs.poll(target, hang).state == 'inactive'
    assert lab.ct_exec(['pgrep', '-f', 'sleep 600'], check=False).returncode == 1, 'the hung process survived'


def test_a_failing_job_says_why_in_one_line(lab, target):
    bad = jobs.Job(name='gpuhost-test-bad', label='a broken step', spec='bad', interpreter='bash',
                   body='echo "working" >&2\necho "gpuhost: the thing is missing" >&2\nexit 4', vmid='200')
    with pytest.raises(jobs.JobFailed) as e:
        jobs.run(target, bad, poll_s=0.3)
    msg = str(e.value)
    assert 'a broken step: job gpuhost-test-bad in container 200 exited with status 4' in msg, msg
    assert 'gpuhost: the thing is missing' in msg and '/var/lib/gpuhost/jobs/gpuhost-test-bad/log' in msg
    assert e.value.outcome.result['exit_status'] == '4'


def test_an_ssh_drop_while_following_leaves_the_job_running(lab, target):
    job = counter(10)
    assert jobs.start(target, job) == 'started'
    # One poll's connection drops: the follower reconnects and goes on; the job never noticed.
    lab.drop_ssh_at(1, mode='during', match='ct_job.sh')
    p = jobs.follow(target, job, poll_s=0.3)
    assert any(e.get('drop') for e in lab.ssh_log()), 'no poll was dropped'
    assert json.loads(p.out)['done'] == 10 and len({pid for pid, _ in steps(lab, job)}) == 1
    # The host unreachable for longer than the follower waits: it gives up following, the job does not.
    job = counter(16)
    assert jobs.start(target, job) == 'started'
    import dataclasses
    unreachable = dataclasses.replace(target, port=1, timeout=1.0)
    with pytest.raises(jobs.JobDetached) as e:
        jobs.follow(unreachable, job, poll_s=0.3, reconnect_s=0.0)
    assert 'the job keeps running in container 200 - the next `up` re-attaches to it' in str(e.value)
    assert jobs.start(target, job) == 'attached'
    p = jobs.follow(target, job, poll_s=0.3)
    assert json.loads(p.out)['done'] == 16 and len({pid for pid, _ in steps(lab, job)}) == 1


def test_a_job_on_the_host_outlives_its_ssh_session_and_is_reattached(lab, target):
    """The host's own systemd (the model's download runs here): started, its follower gone with every SSH
    connection, re-attached by the next start, one process from the first step to the last."""
    job = counter(10, name='gpuhost-test-host', vmid=None)
    assert jobs.start(target, job) == 'started'
    time.sleep(1.0)
    lab.kill_ssh_sessions()
    remote.discard(target)
    assert jobs.start(target, job) == 'attached'
    p = jobs.follow(target, job, poll_s=0.3)
    assert json.loads(p.out) == {'done': 10, 'secret_len': len(b'a-secret-token')}
    got = steps(lab, job)
    assert len({pid for pid, _ in got}) == 1 and [n for _, n in got] == list(range(1, 11)), got
    listing = lab.on_host('ls -la %s/%s' % (jobs.JOBS_DIR, job.name)).stdout
    # The secret gone once the job ended: its wrapper empties the input as it records the result the follower
    # reads; ExecStopPost removes the emptied file a moment later (under load, after the follower returned).
    inputs = [line.split() for line in listing.splitlines() if line.endswith(' input')]
    assert all(fields[4] == '0' for fields in inputs) and 'stdout' in listing, listing
    # Stopped from outside (an operator's `systemctl stop`): the next poll says so, the next start runs it again.
    job = counter(20, name='gpuhost-test-host', vmid=None)
    assert jobs.start(target, job) == 'started'
    lab.ssh("systemctl stop 'gpuhost-test-host-*'")
    p = jobs.follow(target, job, poll_s=0.3)
    assert jobs.outcome(job, p) == 'was killed by SIGTERM (a stop, the host shutting down, or a kill)', p
    assert jobs.start(target, job) == 'started'
    jobs.stop(target, job, 'test over')
