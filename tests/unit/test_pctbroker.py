"""pct's way into a lab container (lab/pctbroker.py), without a lab: the broker runs what its enter_argv makes of
the request with exactly the descriptors pct sent, answers with the exit status or the signal, and refuses
anything but a vmid and an argv of strings, with pct's own message for a container that is not running."""

import os
import signal
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, 'lab'))
import pctbroker  # noqa: E402


@pytest.fixture
def broker(tmp_path):
    asked = []

    def enter_argv(vmid, argv):
        asked.append((vmid, argv))
        if vmid != '200':
            raise ValueError('CT %s not running' % vmid)
        return ['/bin/sh', '-c', 'exec "$@"', 'enter'] + argv
    b = pctbroker.Broker(str(tmp_path / 'lab'), enter_argv).start()
    yield b, asked
    b.stop()


def test_the_command_gets_the_descriptors_and_its_exit_status_comes_back(broker, tmp_path):
    b, asked = broker
    src, dst = tmp_path / 'in', tmp_path / 'out'
    src.write_text('piped\n')
    with open(src) as stdin, open(dst, 'w') as stdout:
        answer = pctbroker.call(b.path, 200, ['sh', '-c', 'tr a-z A-Z; exit 7'], fds=(stdin.fileno(), stdout.fileno(), 2))
    assert answer == {'exit': 7} and dst.read_text() == 'PIPED\n'
    assert asked == [('200', ['sh', '-c', 'tr a-z A-Z; exit 7'])]


def test_a_signal_that_ends_the_command_ends_pct_the_same_way(broker, tmp_path):
    b, _ = broker
    assert pctbroker.call(b.path, 200, ['sh', '-c', 'kill -TERM $$']) == {'signal': signal.SIGTERM}
    # pct itself dies of it (what its caller's shell sees as 128 + 15).
    code = subprocess.run([sys.executable, '-c', 'import sys; sys.path.insert(0, %r); import pctbroker; '
                           'pctbroker.exit_like({"signal": 15})' % os.path.join(REPO, 'lab')]).returncode
    assert code == -signal.SIGTERM


def test_refusals(broker):
    b, asked = broker
    assert pctbroker.call(b.path, 201, ['true']) == {'error': 'CT 201 not running'}
    for vmid, argv in (('200; rm -rf /', ['true']), ('200', []), ('200', ['sh', 7])):
        answer = pctbroker.call(b.path, vmid, argv)
        assert answer['error'].startswith('pct: the lab daemon refused the request: vmid '), answer
    assert asked == [('201', ['true'])], 'nothing but a vmid and an argv of strings reaches enter_argv'
