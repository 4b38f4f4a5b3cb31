"""The engine's Cancel (an operator's first Ctrl-C) as the plugin takes it: a job being followed is left running with
one line saying so, and a wait for SGLang or a rebooting host ends at once - never after the job or the wait would
have ended by itself (a 244 GB download: hours). Remote steps still run: a resource's steps after one that changed the
host (a guest created, a unit restarted) complete, so the state records what was done."""

import threading
import time

import pytest

from transport import jobs, remote
from transport import operator
from provider.__main__ import GpuhostProvider


@pytest.fixture(autouse=True)
def fresh_cancel():
    operator.CANCELLED.clear()
    yield
    operator.CANCELLED.clear()


def _target():
    return remote.Target(host='pve1', port=22, user='root', private_key='', host_key='', timeout=5.0,
                         command_timeout=20.0)


def test_after_the_plugins_cancel_a_reboot_wait_ends_at_once_and_remote_steps_still_run(monkeypatch):
    from resources import host
    calls = []

    def run(target, name, args=(), **kw):
        calls.append(name)
        return remote.Result('same-boot-id\n', '', 0)   # the host has not come back yet
    monkeypatch.setattr(remote, 'run', run)
    plugin = GpuhostProvider()
    threading.Timer(0.3, plugin.Cancel, (None, None)).start()
    start = time.monotonic()
    token = operator.CANCELLED.serving(plugin.cancelled)   # the wait runs in a call of the instance the engine cancels
    try:
        with pytest.raises(operator.Interrupted) as e:
            host.reboot_and_wait(_target(), timeout=900)
    finally:
        operator.CANCELLED.reset(token)
    assert time.monotonic() - start < 5, 'the reboot wait went on after Cancel'
    assert str(e.value) == ('host pve1: interrupted (Ctrl-C) while waiting for it to come back from its reboot; it goes '
                            'on booting, and the next `pulumi up` carries on from there')
    # A remote step after the Cancel runs: the steps of a resource after a change on the host complete.
    assert remote.run(_target(), 'read_file.sh', ['/etc/hostname']).stdout == 'same-boot-id\n'


RUNNING = ('state\tactive\nsub\trunning\ncpu\t1\nspec\tabc\nstarted\t1700000000\nnow\t1700000010\n'
           'progress\t{"counter": %d, "line": "%d GB of 244 GB"}\nresult\t-\nstop\t-\n')


def test_a_followed_job_is_left_running_at_once_on_cancel(monkeypatch):
    polls = []

    def poll(target, job):
        polls.append(time.monotonic())
        return jobs.parse_poll(RUNNING % (len(polls), len(polls)))
    monkeypatch.setattr(jobs, 'poll', poll)
    job = jobs.Job(name='gpuhost-model-0123456789ab', label='the model download of Qwen', spec='abc',
                   interpreter='bash', body='', limit_s=0, limit_key='')
    threading.Timer(0.3, operator.CANCELLED.set).start()
    start = time.monotonic()
    with pytest.raises(jobs.JobDetached) as e:
        # A poll every 30 s: the cancel must not wait for the next one.
        jobs.follow(_target(), job, say=lambda line: None, poll_s=30.0)
    assert time.monotonic() - start < 5, 'follow waited for its next poll after Cancel'
    assert len(polls) == 1
    text = str(e.value)
    assert text.startswith('the model download of Qwen: the run was interrupted (Ctrl-C) while following job '
                           'gpuhost-model-0123456789ab')
    assert 'the job keeps running - the next `up` re-attaches to it' in text


def test_a_wait_for_sglang_ends_on_cancel_with_what_goes_on(monkeypatch):
    from resources import sglang
    threading.Timer(0.3, operator.CANCELLED.set).start()
    start = time.monotonic()
    with pytest.raises(operator.Interrupted) as e:
        # Nothing listens there: the wait would go on for its whole 600 s.
        sglang.wait_http('http://127.0.0.1:9/health', 600, 'sglang-unit: SGLang in container 200')
    assert time.monotonic() - start < 5
    assert str(e.value).startswith('sglang-unit: SGLang in container 200: interrupted (Ctrl-C) while waiting for '
                                   'http://127.0.0.1:9/health; SGLang goes on starting, and the next `pulumi up` '
                                   'checks it')


def test_after_cancel_a_host_that_does_not_answer_is_not_tried_again():
    # A connection that fails is tried three times with pauses between (about 30 s against a host that drops
    # packets); after the operator's Ctrl-C the first failure is the last.
    import socket
    free = socket.socket()
    free.bind(('127.0.0.1', 0))
    port = free.getsockname()[1]
    free.close()   # nothing listens: refused at once
    key = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl'
    target = remote.Target(host='127.0.0.1', port=port, user='root', private_key=_key(), host_key=key, timeout=5.0,
                           command_timeout=20.0)
    import paramiko
    attempts = []
    real = paramiko.SSHClient.connect

    def counted(self, *a, **kw):
        attempts.append(1)
        return real(self, *a, **kw)
    operator.CANCELLED.set()
    start = time.monotonic()
    with pytest.raises(operator.Interrupted) as e:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(paramiko.SSHClient, 'connect', counted)
            remote.connect(target)
    # One attempt, and none of the pauses between attempts (0.5 s, then 1 s).
    assert attempts == [1] and time.monotonic() - start < 0.5
    assert 'interrupted (Ctrl-C): no further attempt; nothing was run on the host' in str(e.value)


def _key():
    import io
    import paramiko
    out = io.StringIO()
    paramiko.RSAKey.generate(1024).write_private_key(out)
    return out.getvalue()


def test_after_cancel_a_failed_proxmox_read_is_not_retried():
    import requests
    from resources import pve
    calls = []

    def get():
        calls.append(1)
        raise requests.exceptions.ConnectionError('Connection refused')
    operator.CANCELLED.set()
    start = time.monotonic()
    with pytest.raises(operator.Interrupted) as e:
        pve.api_call('container 200: read config', get, read=True)
    assert calls == [1] and time.monotonic() - start < 0.5   # the first pause between attempts is 0.5 s
    assert str(e.value) == ('container 200: read config: failed (Connection refused) and the run was interrupted '
                            '(Ctrl-C): no further attempt; nothing was changed')



def test_after_cancel_a_proxmox_task_that_changes_a_guest_is_still_followed_to_its_end():
    # The task is the step's change (a guest created, started): the state records it only if the step completes.
    from resources import pve
    answers = iter([{'status': 'running'}, {'status': 'running'}, {'status': 'stopped', 'exitstatus': 'OK'}])

    class Prox:
        def nodes(self, node):
            return self

        def tasks(self, upid):
            return self

        @property
        def status(self):
            return self

        def get(self):
            return next(answers)
    operator.CANCELLED.set()
    pve.wait_task(Prox(), 'pve1', 'UPID:pve1:1', 'container 200: create')
    assert next(answers, None) is None
