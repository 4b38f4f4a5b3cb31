"""The SSH agent that carries a key kept in a file to the smoke test (transport/agent.py): the key loaded from the
text the program read, reached at the same path every run, and an earlier run's agent going away never takes the
next run's socket with it."""

import os
import shutil
import subprocess

import pytest

from transport import agent

pytestmark = pytest.mark.skipif(shutil.which('ssh-agent') is None or shutil.which('ssh-keygen') is None,
                                reason='openssh-client is not installed')


def listed(path):
    res = subprocess.run(['ssh-add', '-l'], env=dict(os.environ, SSH_AUTH_SOCK=path), capture_output=True, text=True)
    return res.returncode, res.stdout


@pytest.fixture
def cache(monkeypatch):
    """A short cache directory: a Unix socket's path is at most 107 bytes, and pytest's tmp_path is long."""
    import tempfile
    path = tempfile.mkdtemp(prefix='gh-')
    monkeypatch.setenv('XDG_CACHE_HOME', path)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_an_earlier_runs_agent_going_away_leaves_the_next_runs_socket(cache, tmp_path):
    subprocess.run(['ssh-keygen', '-q', '-t', 'ed25519', '-N', '', '-f', str(tmp_path / 'key')], check=True)
    key = (tmp_path / 'key').read_text()
    path = agent.socket_path('lab', str(tmp_path / 'key'))
    assert path == agent.socket_path('lab', str(tmp_path / 'key')) and path.endswith('.sock')
    agent.start(path, key, 'gpuhost:host.ssh.private_key_file')
    first_proc, first = agent._started.pop(path)     # as if that run's program were gone without a word
    try:
        code, out = listed(path)
        assert code == 0 and 'ED25519' in out
        agent.start(path, key, 'gpuhost:host.ssh.private_key_file')
        # The first agent's last act (ssh-agent removes its socket when its command ends): only its own.
        first_proc.stdin.close()
        first_proc.wait(5)
        if os.path.exists(first):
            os.unlink(first)
        code, out = listed(path)
        assert code == 0 and 'ED25519' in out, out
        assert stat_mode(os.path.dirname(path)) == 0o700
    finally:
        agent.stop(path)
    assert not os.path.exists(path) and listed(path)[0] != 0


def test_a_socket_path_too_long_for_unix_is_refused_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / ('d' * 80)))
    path = agent.socket_path('lab', '/root/.ssh/id_ed25519')
    with pytest.raises(agent.OperatorError) as e:
        agent.start(path, 'not used', 'gpuhost:host.ssh.private_key_file')
    assert 'is longer than a Unix socket path may be (108 bytes); set XDG_CACHE_HOME to a shorter directory' in str(
        e.value)


def stat_mode(path):
    import stat
    return stat.S_IMODE(os.stat(path).st_mode)
