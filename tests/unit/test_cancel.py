"""The engine's Cancel (an operator's first Ctrl-C) as the plugin takes it: a job being followed is left running with
one line saying so, and a wait for SGLang or a rebooting host ends at once - never after the job or the wait would
have ended by itself (a 244 GB download: hours). Remote steps still run: a resource's steps after one that changed the
host (a guest created, a unit restarted) complete, so the state records what was done."""

import threading
import time

import pytest

from components import jobs, remote, state
from provider.__main__ import GpuhostProvider


@pytest.fixture(autouse=True)
def fresh_cancel():
    state.CANCELLED.clear()
    yield
    state.CANCELLED.clear()


def _target():
    return remote.Target(host='pve1', port=22, user='root', private_key='', host_key='', timeout=5.0,
                         command_timeout=20.0)


def test_after_the_plugins_cancel_a_reboot_wait_ends_at_once_and_remote_steps_still_run(monkeypatch):
    from components import host
    calls = []

    def run(target, name, args=(), **kw):
        calls.append(name)
        return remote.Result('same-boot-id\n', '', 0)   # the host has not come back yet
    monkeypatch.setattr(remote, 'run', run)
    threading.Timer(0.3, GpuhostProvider().Cancel, (None, None)).start()
    start = time.monotonic()
    with pytest.raises(state.Interrupted) as e:
        host.reboot_and_wait(_target(), timeout=900)
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
    threading.Timer(0.3, state.CANCELLED.set).start()
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
    from components import sglang
    threading.Timer(0.3, state.CANCELLED.set).start()
    start = time.monotonic()
    with pytest.raises(state.Interrupted) as e:
        # Nothing listens there: the wait would go on for its whole 600 s.
        sglang.wait_http('http://127.0.0.1:9/health', 600, 'sglang-unit: SGLang in container 200')
    assert time.monotonic() - start < 5
    assert str(e.value).startswith('sglang-unit: SGLang in container 200: interrupted (Ctrl-C) while waiting for '
                                   'http://127.0.0.1:9/health; SGLang goes on starting, and the next `pulumi up` '
                                   'checks it')
