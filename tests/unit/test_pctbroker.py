"""pct's way into a lab container (lab/pctbroker.py), without a lab: the broker runs what its enter_argv makes of
the request with exactly the descriptors pct sent, answers with the exit status or the signal, and refuses
anything but a vmid and an argv of strings, with pct's own message for a container that is not running; a
status request gets what its ct_status says of the container."""

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
    def ct_status(node, vmid):
        asked.append(('status', node, vmid))
        return 'running' if (node, vmid) == ('pve1', '200') else None
    b = pctbroker.Broker(str(tmp_path / 'lab'), enter_argv, ct_status=ct_status).start()
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


def test_a_status_request_gets_the_live_state(broker):
    b, asked = broker
    assert pctbroker.status(b.path, 200, 'pve1') == 'running'
    assert pctbroker.status(b.path, 201, 'pve1') is None
    assert pctbroker.status(b.path, 200, 'pve2') is None
    assert asked == [('status', 'pve1', '200'), ('status', 'pve1', '201'), ('status', 'pve2', '200')]


def test_status_refusals(broker, tmp_path):
    b, asked = broker
    for vmid, node in (('200; true', 'pve1'), ('200', ''), ('200', 7)):
        with pytest.raises(pctbroker.BrokerError, match='a status request is a vmid and a node'):
            pctbroker.status(b.path, vmid, node)
    # Descriptors with it: refused (and closed), nothing asked.
    answer = pctbroker._ask(b.path, {'op': 'status', 'vmid': '200', 'node': 'pve1'}, fds=(0, 1, 2))
    assert answer['error'].startswith('pct: the lab daemon refused the request: '), answer
    assert asked == []
    # A broker without ct_status refuses it.
    other = pctbroker.Broker(str(tmp_path / 'other'), lambda vmid, argv: ['true']).start()
    try:
        with pytest.raises(pctbroker.BrokerError, match='no container status here'):
            pctbroker.status(other.path, 200, 'pve1')
    finally:
        other.stop()
