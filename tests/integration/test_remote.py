"""The SSH layer against the lab's real OpenSSH server: values with shell metacharacters arrive
intact and are never executed, content travels on stdin, a file write is atomic with a compare-and-
swap, and credentials never appear in error messages."""

import os

import pytest

from resources import pve
from transport import remote

# A directory on the lab host (root's home there: LAB/host/root on this machine).
DIR = '/root/gpuhost-test-remote'
ODD = DIR + "/gpuhost odd $(touch gpuhost-pwned); x'y\"z`id`.conf"


@pytest.fixture(scope='module')
def target(lab):
    with open(lab.info['ssh']['key_file']) as f:
        key = f.read()
    os.makedirs(lab.host.path(DIR.lstrip('/')))
    yield remote.Target(host=lab.info['ssh']['host'], port=lab.info['ssh']['port'], user='root', private_key=key,
                        host_key=lab.info['ssh']['host_key'])


def on_machine(lab, path):
    return lab.host.path(path.lstrip('/'))


def test_metacharacters_in_arguments_are_data_not_code(lab, target):
    content = 'line one\n$(echo not expanded)\n'
    assert remote.put_file(target, ODD, content, '0640', '-') is True
    assert lab.on_host('ls -d /gpuhost-pwned /root/gpuhost-pwned /tmp/gpuhost-pwned %s/gpuhost-pwned 2>/dev/null; true'
                       % DIR).stdout == ''
    assert remote.run(target, 'read_file.sh', [ODD]).stdout == content
    assert oct(os.stat(on_machine(lab, ODD)).st_mode & 0o777) == '0o640'
    # Same content again: nothing written.
    assert remote.put_file(target, ODD, content, '0640', remote.sha256_hex(content)) is False


def test_compare_and_swap_refuses_a_file_changed_since_it_was_read(target):
    with pytest.raises(remote.RemoteError) as e:
        remote.put_file(target, ODD, 'new\n', '0640', remote.sha256_hex('what we read earlier'))
    assert 'changed on pve-lab since it was read' in str(e.value)
    assert remote.run(target, 'read_file.sh', [ODD]).stdout == 'line one\n$(echo not expanded)\n'


def test_content_cut_short_in_transit_is_never_installed(lab, target):
    """A dropped connection ends stdin early; the script sees fewer bytes than were sent."""
    whole = 'options nvidia NVreg_DmaRemapPeerMmio=1\n'
    with pytest.raises(remote.RemoteError) as e:
        remote.run(target, 'put_file.sh', [ODD, '0640', 'any', remote.sha256_hex(whole.encode()), 'none'],
                   stdin=whole.encode()[:10])
    assert 'arrived incomplete' in str(e.value) and 'nothing was changed' in str(e.value)
    assert remote.run(target, 'read_file.sh', [ODD]).stdout == 'line one\n$(echo not expanded)\n'
    assert not [n for n in os.listdir(on_machine(lab, DIR)) if n.startswith('.gpuhost.')]


def test_wrong_password_error_names_the_user_not_the_password(lab):
    api = {'host': lab.info['pve']['host'], 'port': lab.info['pve']['port'], 'user': 'root@pam',
           'password': 'hunter2-wrong', 'ca_cert': open(lab.info['pve']['cafile']).read()}
    with pytest.raises(pve.PveError) as e:
        with pve.client(api):
            pass
    assert 'refused the login of root@pam' in str(e.value) and 'hunter2-wrong' not in str(e.value)


def test_tls_is_verified_against_the_given_ca(lab, tmp_path):
    other = os.path.join(lab.project, 'components', '..', 'Pulumi.yaml')  # any non-CA file
    api = {'host': lab.info['pve']['host'], 'port': lab.info['pve']['port'], 'user': 'root@pam',
           'password': open(lab.info['pve']['password_file']).read(), 'ca_cert': open(other).read()}
    with pytest.raises(pve.PveError, match='TLS certificate not trusted.*gpuhost:host.api.ca_cert'):
        with pve.client(api):
            pass


def test_reads_of_a_refresh_share_one_command_and_a_write_forgets_them(lab, target, monkeypatch):
    """Inside a Read, the host's read-only scripts that arrive together go out as one SSH command
    (transport/hostreads.py); each one's result is what it gives alone - its output, a file that is missing
    (exit 4) - and a write on the host is never followed by a read from before it."""
    import threading
    from transport import hostreads
    missing = DIR + '/not-there.conf'
    asks = [('host_facts.sh', []), ('host_facts.sh', ['/etc/kernel/cmdline']), ('read_file.sh', [ODD]),
            ('read_file.sh', [missing]), ('host_facts.sh', [])]
    alone = [remote.run(target, name, args, check=False) for name, args in asks]
    assert alone[3].exit_code == 4 and 'does not exist' in alone[3].stderr
    hostreads.forget(remote._host_key(target))
    # However loaded the machine, the threads released together all join the first batch.
    monkeypatch.setattr(hostreads, 'GATHER_S', 1.0)
    start, got = lab.ssh_commands(), [None] * len(asks)
    gate = threading.Barrier(len(asks))

    def ask(i):
        gate.wait()
        with remote.reading():
            got[i] = remote.run(target, asks[i][0], asks[i][1], check=False)
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(asks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [(r.stdout, r.stderr, r.exit_code) for r in got] == [(r.stdout, r.stderr, r.exit_code) for r in alone]
    sent = [e['cmd'] for e in lab.ssh_log() if e['n'] > start]
    assert len(sent) == 1 and sent[0].startswith('read_batch.sh host_facts.sh,read_file.sh 4 '), sent
    # Asked again in the same pass: no command. Then a write: the next read goes to the host and sees it.
    with remote.reading():
        assert remote.run(target, 'read_file.sh', [ODD]).stdout == alone[2].stdout
    assert lab.ssh_commands() == start + 1
    remote.put_file(target, ODD, 'after the write\n', '0640', remote.sha256_hex(alone[2].stdout))
    with remote.reading():
        assert remote.run(target, 'read_file.sh', [ODD]).stdout == 'after the write\n'
    remote.put_file(target, ODD, alone[2].stdout, '0640', 'any')


def test_a_host_gets_at_most_max_channels_commands_at_once(target, monkeypatch):
    """A fleet's engine may run many of a host's steps at once; the lab's sshd refuses a session beyond
    OpenSSH's default MaxSessions 10, as a real host does. The program keeps to remote.MAX_CHANNELS on its
    one connection: every command gets through, the ones beyond the cap a moment later."""
    import threading
    import time
    real = remote.script
    monkeypatch.setattr(remote, 'script', lambda name: 'sleep 0.4; echo done' if name == 'slow.sh' else real(name))
    n = 3 * remote.MAX_CHANNELS
    results, gate = [], threading.Barrier(n)

    def one():
        gate.wait()
        try:
            results.append(remote.run(target, 'slow.sh').stdout)
        except remote.RemoteError as e:
            results.append(str(e))
    threads = [threading.Thread(target=one) for _ in range(n)]
    began = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == ['done\n'] * n
    # Three rounds of MAX_CHANNELS at the most: at least three times one command's 0.4 s.
    assert time.monotonic() - began >= 3 * 0.4


SLEEPER = 'set -euo pipefail\ntrap \'echo "sleeper: cleaned up" >&2; exit 7\' TERM\nsleep 300 &\nwait\n'


def sleepers(lab):
    return lab.on_host('pgrep -af "sleep 30[0]" || true').stdout.strip()


@pytest.fixture
def sleeper(monkeypatch):
    """A script that outlives any wait and has cleanup of its own - no host tool of the lab's, whose hang ends with
    its SSH session by itself."""
    script = remote.script
    monkeypatch.setattr(remote, 'script', lambda name: SLEEPER if name == 'sleeper.sh' else script(name))


def test_a_command_past_its_time_limit_is_gone_from_the_host_when_the_run_says_so(lab, target, sleeper):
    with pytest.raises(remote.RemoteError) as e:
        remote.run(target, 'sleeper.sh', ['a b'], timeout=2)
    assert 'did not finish within 2 s' in str(e.value)
    # Its cleanup ran before the program reported it, and nothing of it runs any more.
    assert 'it was stopped on the host (its process group ended: "sleeper: cleaned up")' in str(e.value), str(e.value)
    assert sleepers(lab) == ''


def test_a_command_whose_connection_went_away_ends_on_the_host(lab, target, sleeper):
    """A killed serving process, a dropped connection: sshd leaves the command running - its guard ends it."""
    import threading
    client = remote.connect(target)
    failed = []
    t = threading.Thread(target=lambda: failed.append(
        pytest.raises(remote.ConnectionLost, remote.run, target, 'sleeper.sh', [], client=client)))
    t.start()
    lab.wait_for(lambda: sleepers(lab) != '', timeout=15, what='the command to start on the host')
    client.close()
    t.join(15)
    assert failed
    # Within seconds (the guard looks once a second), where sshd alone leaves it its 300 s.
    lab.wait_for(lambda: sleepers(lab) == '', timeout=15, what='the command to end with its SSH session')
