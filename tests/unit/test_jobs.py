"""transport/jobs.py's reading of job.sh poll output, and the outcome line an operator reads."""

from transport import jobs


RUNNING = ('state\tactive\nsub\trunning\ncpu\t123456789\nspec\tabc\nstarted\t1700000000\nnow\t1700000010\n'
           'progress\t{"counter": 5, "line": "12.0 GB of 244.0 GB"}\nresult\t-\nstop\t-\n')
ENDED = ('state\tinactive\nsub\tdead\ncpu\t[not set]\nspec\tabc\nstarted\t1700000000\nnow\t1700000100\n'
         'progress\t-\nresult\texit-code exited 5 1700000099\nstop\t-\nout\t{"ok": false}\n'
         'log\tcopying\nlog\tgpuhost: /root/x.run on pve1 has sha256 00ff\n')


def test_a_running_job():
    p = jobs.parse_poll(RUNNING)
    assert p.running and p.cpu == 123456789 and p.spec == 'abc' and p.result is None
    assert jobs.describe_progress(p.progress) == '12.0 GB of 244.0 GB'


def test_an_ended_job():
    p = jobs.parse_poll(ENDED)
    assert not p.running and p.cpu is None and p.out == '{"ok": false}'
    assert p.result == {'service_result': 'exit-code', 'exit_code': 'exited', 'exit_status': '5', 'ended': 1700000099}
    assert p.log[-1] == 'gpuhost: /root/x.run on pve1 has sha256 00ff'
    job = jobs.Job(name='gpuhost-x', label='x', spec='abc', interpreter='bash', body='', limit_s=60,
                   limit_key='gpuhost:runtime.install_timeout_s')
    assert jobs.outcome(job, p) == 'exited with status 5'
    timeout = jobs.parse_poll(ENDED.replace('exit-code exited 5', 'timeout killed TERM'))
    assert jobs.outcome(job, timeout) == 'ran longer than its limit of 60 s (gpuhost:runtime.install_timeout_s) and was stopped'
    stopped = jobs.parse_poll(ENDED.replace('stop\t-', 'stop\tno progress for 600 s'))
    assert jobs.outcome(job, stopped) == 'stopped (no progress for 600 s)'


def test_names_and_specs_are_stable():
    assert jobs.spec_of({'b': 1, 'a': [1, 2]}) == jobs.spec_of({'a': [1, 2], 'b': 1})
    assert jobs.key_of('/rpool/models', 'Qwen') != jobs.key_of('/rpool/models', 'Qwen2')
    assert len(jobs.key_of('x')) == 12


# job.sh poll for a unit systemd could not set up (as printed on a loaded cgroup-v1 lab host): no result, the
# journal's words.
NOT_SET_UP = ('state\tinactive\nsub\tdead\ncpu\t-\nspec\tabc\nstarted\t1700000000\nnow\t1700000010\nprogress\t-\n'
              'result\t-\nstop\t-\n'
              'journal\tgpuhost-x-1.service: Main process exited, code=exited, status=219/CGROUP\n'
              'journal\tgpuhost-x-1.service: Control process exited, code=exited, status=219/CGROUP\n'
              "journal\tgpuhost-x-1.service: Failed with result 'exit-code'.\n")
SUCCEEDED = ENDED.replace('exit-code exited 5', 'success exited 0')


def _scripted(monkeypatch, polls):
    """jobs.run against a host whose job ends as each of polls says, one per start."""
    starts, said = [], []
    monkeypatch.setattr(jobs, 'start', lambda target, job, say: starts.append(1) or 'started')
    monkeypatch.setattr(jobs, 'follow', lambda target, job, say, **kw: jobs.parse_poll(polls[len(starts) - 1]))
    monkeypatch.setattr(jobs, 'SET_UP_PAUSE_S', 0)
    return starts, said


def test_a_job_systemd_could_not_set_up_is_started_again(monkeypatch):
    assert jobs.parse_poll(NOT_SET_UP).not_set_up() == '219/CGROUP'
    starts, said = _scripted(monkeypatch, [NOT_SET_UP, SUCCEEDED])
    job = jobs.Job(name='gpuhost-x', label='the model check', spec='abc', interpreter='bash', body='')
    assert jobs.run(None, job, say=said.append).out == '{"ok": false}'
    assert len(starts) == 2
    assert said == ['the model check: systemd could not set up job gpuhost-x on the host (219/CGROUP), nothing of '
                    'it ran; starting it again (2 of 3)']


def test_set_up_failures_are_tried_a_few_times_then_named(monkeypatch):
    starts, said = _scripted(monkeypatch, [NOT_SET_UP] * 5)
    job = jobs.Job(name='gpuhost-x', label='the model check', spec='abc', interpreter='bash', body='')
    try:
        jobs.run(None, job, say=said.append)
        raise AssertionError('no failure')
    except jobs.JobFailed as e:
        assert 'ended: without a result' in str(e) and 'status=219/CGROUP' in str(e)
    assert len(starts) == jobs.SET_UP_TRIES


def test_a_job_that_ran_and_failed_is_not_started_again(monkeypatch):
    # Its own exit status (even one in systemd's range) came from its process: it ran.
    ran = ENDED.replace('exit-code exited 5', 'exit-code exited 219') + 'journal\tstatus=219/CGROUP\n'
    assert jobs.parse_poll(ran).not_set_up() is None
    starts, said = _scripted(monkeypatch, [ran, SUCCEEDED])
    job = jobs.Job(name='gpuhost-x', label='x', spec='abc', interpreter='bash', body='')
    try:
        jobs.run(None, job, say=said.append)
        raise AssertionError('no failure')
    except jobs.JobFailed as e:
        assert 'exited with status 219' in str(e)
    assert len(starts) == 1 and said == []
