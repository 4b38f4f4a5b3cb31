"""transport/remote.run against an SSH server that sends a command's exit status before the last of its output,
as OpenSSH does when the process ends with output still in its pipe (it drains that after the status). A run
that stopped reading at the exit status lost the tail: host_facts.sh's last lines, the PCI devices a refresh
then called missing from a host that had them."""

import socket
import threading
import time

import paramiko
import pytest

from transport import remote
from tests.unit.inflight import InFlight


class _Server(paramiko.ServerInterface):
    def __init__(self):
        self.exec = threading.Event()
        self.command = None

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED

    def get_allowed_auths(self, username):
        return 'none'

    def check_auth_none(self, username):
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_exec_request(self, channel, command):
        self.command = command
        self.exec.set()
        return True


class _Client:
    """What remote.run asks of a pooled client: its transport."""

    def __init__(self, transport):
        self.transport = transport

    def get_transport(self):
        return self.transport


def _serve(behaviour):
    """A client transport to an in-process SSH server whose exec channel runs behaviour(channel)."""
    ours, theirs = socket.socketpair()
    server = paramiko.Transport(theirs)
    server.add_server_key(paramiko.RSAKey.generate(1024))
    iface = _Server()
    server.start_server(event=threading.Event(), server=iface)   # negotiates in its own thread
    client = paramiko.Transport(ours)
    client.start_client()
    client.auth_none('root')

    def run():
        chan = server.accept(10)
        iface.exec.wait(10)
        behaviour(chan)
    threading.Thread(target=run, daemon=True).start()
    return client, server


def _target():
    return remote.Target(host='127.0.0.1', port=22, user='root', private_key='', host_key='', timeout=5.0,
                         command_timeout=20.0)


def test_output_sent_after_the_exit_status_is_all_returned():
    def status_first(chan):
        chan.sendall(b'gpu\t0000:01:00.0\n')
        chan.send_exit_status(0)
        time.sleep(0.3)      # the rest of the pipe, drained after the status
        chan.sendall(b'pci\t0000:c1:00.0\tok\npci\t0000:c2:00.0\tok\n')
        chan.sendall_stderr(b'a late warning\n')
        chan.shutdown_write()
        chan.close()
    client, server = _serve(status_first)
    try:
        res = remote.run(_target(), 'host_facts.sh', client=_Client(client))
    finally:
        client.close()
        server.close()
    assert res.exit_code == 0
    assert res.stdout == 'gpu\t0000:01:00.0\npci\t0000:c1:00.0\tok\npci\t0000:c2:00.0\tok\n'
    assert res.stderr == 'a late warning\n'


def test_a_connection_closed_without_a_status_is_a_lost_connection_not_a_result():
    def dropped(chan):
        chan.sendall(b'gpu\t0000:01:00.0\n')
        time.sleep(0.1)
        chan.close()
    client, server = _serve(dropped)
    try:
        try:
            remote.run(_target(), 'host_facts.sh', client=_Client(client))
        except remote.ConnectionLost as e:
            assert 'connection to root@127.0.0.1:22 lost during reading the host facts' in str(e)
        else:
            raise AssertionError('a command cut off before its exit status was returned as if complete')
    finally:
        client.close()
        server.close()


def test_a_command_that_ends_at_once_gets_our_eof_before_our_close(monkeypatch):
    """paramiko 5.1's Channel.shutdown() makes the EOF under the channel's lock and sends it after letting go; if the
    server's CLOSE of a command that ended at once is answered in between, our EOF follows our CLOSE and OpenSSH drops
    the whole connection ("ieof packet referred to nonexistent channel 1": a fixture's `up` lost every step on it).
    Here the command ends exactly while remote.run's thread is about to send the EOF, and that thread is held up for
    as long as the transport thread needs to answer the CLOSE: the EOF must still go first."""
    import threading
    import paramiko
    sending = threading.Event()

    def ends_while_we_send_eof(chan):
        sending.wait(10)
        chan.send_exit_status(0)
        chan.close()
    client, server = _serve(ends_while_we_send_eof)
    sent = []
    real = paramiko.Transport._send_user_message

    def send(self, data):
        kind = data.asbytes()[0]
        if self is client and kind == 96 and not sending.is_set():   # remote.run's EOF
            sending.set()
            time.sleep(0.5)
        if self is client and kind in (96, 97):
            sent.append({96: 'EOF', 97: 'CLOSE'}[kind])
        return real(self, data)
    monkeypatch.setattr(paramiko.Transport, '_send_user_message', send)
    try:
        res = remote.run(_target(), 'read_file.sh', ['/etc/hostname'], client=_Client(client))
        deadline = time.time() + 5
        while len(sent) < 2 and time.time() < deadline:
            time.sleep(0.05)
    finally:
        client.close()
        server.close()
    assert res.exit_code == 0
    assert sent == ['EOF', 'CLOSE'], sent


def test_hosts_connect_at_the_same_time_and_one_host_connects_once(monkeypatch):
    """pooled(): a lock per host, none across hosts - a fleet's hosts are not connected one after another (issue 45:
    8 hosts 1.04 s behind one process-wide lock with 0.1 s of server latency), and the steps of one host share its
    one connection."""
    class Client:
        def get_transport(self):
            return self

        def is_active(self):
            return True
    connect = InFlight(lambda _target: Client())
    monkeypatch.setattr(remote, 'connect', connect)
    monkeypatch.setattr(remote, '_pool', {})
    targets = [remote.Target(host='10.0.0.%d' % (i % 4), port=22, user='root', private_key='k', host_key='h')
               for i in range(8)]
    got = []
    connect.run([lambda t=t: got.append(remote.pooled(t)) for t in targets], at_once=4)
    assert connect.most == 4, 'the four hosts connected one after another'
    assert sorted(t.host for t, in connect.calls) == ['10.0.0.%d' % i for i in range(4)], 'a host connected twice'
    assert len(got) == 8 and len({id(c) for c in got}) == 4


class _Busy:
    """A transport whose server refuses `refusals` sessions (MaxSessions reached), then opens one; `bare`: the
    refusals surface as paramiko's bare SSHException, as when another thread's open took the transport's one saved
    exception."""

    def __init__(self, refusals, bare=False, active=True):
        self.refusals, self.opened, self.bare, self.active = refusals, 0, bare, active

    def is_active(self):
        return self.active

    def open_session(self, timeout=None):
        if self.refusals:
            self.refusals -= 1
            raise paramiko.SSHException('Unable to open channel.') if self.bare else \
                paramiko.ChannelException(2, 'Connect failed')
        self.opened += 1
        return 'a channel'


def _host():
    return remote.Target(host='127.0.0.1', port=22, user='root', private_key='-', host_key='ssh-ed25519 AAAA',
                         timeout=0.5)


def test_a_session_the_server_refuses_is_asked_for_again_on_the_same_connection():
    busy = _Busy(3)
    assert remote._open_session(_host(), busy) == 'a channel' and busy.opened == 1


def test_a_refusal_paramiko_reports_bare_is_asked_for_again_while_the_connection_is_up():
    busy = _Busy(3, bare=True)
    assert remote._open_session(_host(), busy) == 'a channel' and busy.opened == 1
    # The same exception from a transport that is down: the connection is lost, not a session refused.
    with pytest.raises(paramiko.SSHException):
        remote._open_session(_host(), _Busy(1, bare=True, active=False))


def test_a_server_that_keeps_refusing_sessions_is_named_not_taken_for_a_lost_connection(monkeypatch):
    monkeypatch.setattr(remote.time, 'monotonic', iter([0.0] + [100.0] * 10).__next__)
    try:
        remote._open_session(_host(), _Busy(10 ** 6))
        raise AssertionError('no error')
    except remote.ConnectionLost:
        raise AssertionError('taken for a lost connection')
    except remote.RemoteError as e:
        assert 'refused to open another SSH session' in str(e) and 'MaxSessions' in str(e)
        assert 'Connect failed' in str(e)
