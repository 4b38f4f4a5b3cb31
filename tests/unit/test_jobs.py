"""components/jobs.py's reading of job.sh poll output, and the outcome line an operator reads."""

from components import jobs


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
