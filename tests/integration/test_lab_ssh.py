"""The lab's SSH fault hooks: a connection dropped at the n-th command from now, before the command
runs, after it ran, or during it (stdin cut short); every open connection killed at once; every
command counted and logged."""

import os
import threading
import time

import pytest

UPLOAD = '''set -euo pipefail
echo start
cat > "$1"
echo "got $(wc -c < "$1")"
echo to-stderr >&2
exit 7
'''


@pytest.fixture
def target(lab, request):
    """Where UPLOAD writes on the host: root's home there (LAB/host/root on the machine)."""
    path = '/root/upload-%s' % request.node.name
    yield path
    if os.path.exists(on_machine(lab, path)):
        os.unlink(on_machine(lab, path))


def on_machine(lab, path):
    return lab.host.path(path.lstrip('/'))


def test_commands_are_counted_and_logged_and_run_unchanged(lab, target):
    n = lab.ssh_commands()
    res = lab.ssh_script(UPLOAD, target, name='upload.sh', stdin='x' * 10)
    assert (res.exit_code, res.stdout, res.stderr) == (7, 'start\ngot 10\n', 'to-stderr\n')
    assert lab.ssh_commands() == n + 1
    # The log's summary: the script's name and arguments as sent, cut at 80 characters.
    assert lab.ssh_log()[-1]['cmd'] == ('upload.sh ' + target)[:80] and lab.ssh_log()[-1]['drop'] is None
    # The command's environment is what sshd gives it without the wrapper.
    assert lab.ssh('echo "$0 $SHLVL ${SSH_ORIGINAL_COMMAND-unset} $SHELL"').stdout == 'bash 1 unset /bin/bash\n'


def test_drop_before_runs_nothing(lab, target):
    at = lab.drop_ssh_at(1, 'before')
    res = lab.ssh_script(UPLOAD, target, name='upload.sh', stdin='x' * 10)
    assert res.dropped and res.stdout == '' and res.stderr == ''
    assert not os.path.exists(on_machine(lab, target))
    assert lab.ssh_log()[-1] == dict(lab.ssh_log()[-1], n=at, drop='before')
    assert lab.ssh('true').exit_code == 0  # once only


def test_drop_after_runs_to_completion_without_exit_status(lab, target):
    at = lab.drop_ssh_at(1, 'after')
    res = lab.ssh_script(UPLOAD, target, name='upload.sh', stdin='x' * 10)
    assert res.dropped and res.stdout == 'start\ngot 10\n'
    assert open(on_machine(lab, target)).read() == 'x' * 10
    lab.wait_for(lambda: 'exit' in lab.ssh_log()[-1], what='the log of the dropped command')
    assert lab.ssh_log()[-1] == dict(lab.ssh_log()[-1], n=at, drop='after', exit=7)


def test_drop_during_cuts_stdin(lab, target):
    at = lab.drop_ssh_at(1, 'during')
    res = lab.ssh_script(UPLOAD, target, name='upload.sh', stdin='y' * 1000)
    assert res.dropped and 'got' not in res.stdout
    lab.wait_for(lambda: 'exit' in lab.ssh_log()[-1], what='the log of the dropped command')
    entry = lab.ssh_log()[-1]
    assert (entry['n'], entry['drop'], entry['stdin_sent'], entry['stdin_total']) == (at, 'during', 500, 1000)
    assert open(on_machine(lab, target)).read() == 'y' * 500
    # An explicit cut.
    lab.drop_ssh_at(1, 'during', stdin_bytes=3)
    assert lab.ssh_script(UPLOAD, target, stdin='z' * 100).dropped
    lab.wait_for(lambda: 'exit' in lab.ssh_log()[-1], what='the log of the dropped command')
    assert open(on_machine(lab, target)).read() == 'zzz'


def test_drop_at_the_nth_command(lab):
    at = lab.drop_ssh_at(3, 'before')
    assert [lab.ssh('echo %d' % i).exit_code for i in (1, 2)] == [0, 0]
    assert lab.ssh_drop_pending()
    assert lab.ssh('echo 3').dropped
    assert not lab.ssh_drop_pending()
    assert [e['n'] for e in lab.ssh_log() if e['drop']][-1] == at


def test_kill_ssh_sessions_drops_every_open_connection(lab):
    results = []
    threads = [threading.Thread(target=lambda: results.append(lab.ssh('sleep 30'))) for _ in range(2)]
    for t in threads:
        t.start()
    lab.wait_for(lambda: len([e for e in lab.ssh_log() if e['cmd'] == 'sleep 30']) == 2, what='two sessions')
    time.sleep(0.3)
    t0 = time.time()
    assert lab.kill_ssh_sessions() >= 2
    for t in threads:
        t.join(10)
    assert time.time() - t0 < 5
    assert [r.dropped for r in results] == [True, True]
    assert lab.ssh('true').exit_code == 0
