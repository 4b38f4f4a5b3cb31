"""What an error tells the operator (transport/errors.py): no secret the process holds, and the traceback of an
unforeseen one in a private file of its own - never at a shared name a local user could plant a link at."""

import os
import stat
import tempfile
import threading

import pytest

from transport import errors
from transport.operator import describe_unexpected

# A private key as the lab makes them (the text itself is never parsed here) and an API password.
KEY = ('-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n'
       'QyNTUxOQAAACBmSecretLineOfTheKeyThatMustNotLeak0123456789abcdefAAAA\n-----END OPENSSH PRIVATE KEY-----\n')
PASSWORD = 'pve-root-Pa55word-7f3a'


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'cache'))
    return tmp_path / 'cache' / 'gpuhost' / 'errors'


def chunks(secret: str, n=8):
    """Every n characters of the secret's text (a PEM key's armour lines are not secret)."""
    body = '\n'.join(line for line in secret.splitlines() if not line.startswith('-----'))
    return {body[i:i + n] for i in range(0, len(body) - n + 1)}


def test_a_secret_the_process_holds_is_in_no_message_however_it_was_quoted(cache):
    errors.remember({'connection': {'host': '10.0.0.5', 'private_key': KEY}, 'api': {'password': PASSWORD}})
    for text in (KEY, repr(KEY), 'login failed: %r' % PASSWORD, 'key line %s' % KEY.splitlines()[2],
                 'cannot reach 10.0.0.5:22 with %s' % PASSWORD):
        out = errors.scrub(text)
        assert not [c for c in chunks(KEY) | chunks(PASSWORD) if c in out], out
    # What is not a credential stays: the message still says where.
    assert errors.scrub('cannot reach 10.0.0.5:22 with %s' % PASSWORD) == 'cannot reach 10.0.0.5:22 with [secret]'


def test_a_secret_remembered_after_a_message_was_scrubbed_is_scrubbed_too(cache):
    """Hosts configure one after another while messages go out: what a later host adds is in the next scrub."""
    errors.remember({'api': {'password': PASSWORD}})
    assert errors.scrub('first host: %s' % PASSWORD) == 'first host: [secret]'
    later = 'a-second-hosts-password-77'
    assert errors.scrub('second host: %s' % later) == 'second host: %s' % later
    errors.remember({'api': {'password': later}})
    assert errors.scrub('second host: %s, first: %s' % (later, PASSWORD)) == 'second host: [secret], first: [secret]'


def test_the_sdks_own_message_for_a_value_it_cannot_serialize_is_scrubbed_line_and_file(cache):
    """The Pulumi SDK puts repr(value) into the ValueError it raises for a property it cannot serialize."""
    import asyncio
    from pulumi.runtime import rpc
    api_key = 'sk-gpuhost-9d2e7c4b1a'
    errors.remember({'api_key': api_key})
    loop = asyncio.new_event_loop()
    with pytest.raises(ValueError) as e:
        loop.run_until_complete(rpc.serialize_properties({'api_key': (api_key, object())}, {}))
    assert api_key in str(e.value)      # the SDK's text holds it ...
    line = describe_unexpected(e.value)
    assert '\n' not in line and not [c for c in chunks(api_key) if c in line], line   # ... the operator's does not
    path = line.rsplit('Python traceback in ', 1)[1].rstrip(')')
    with open(path) as f:
        kept = f.read()
    assert 'Traceback' in kept and api_key not in kept


def test_a_traceback_goes_to_a_private_file_of_its_own(cache):
    line = describe_unexpected(RuntimeError('boom'))
    assert line.startswith('unexpected RuntimeError: boom (Python traceback in %s/error-' % cache), line
    path = line.rsplit('Python traceback in ', 1)[1].rstrip(')')
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o700 and stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_two_errors_at_once_leave_two_files(cache):
    barrier = threading.Barrier(2)
    lines = []

    def fail(n):
        barrier.wait()
        lines.append(describe_unexpected(RuntimeError('error number %d' % n)))
    threads = [threading.Thread(target=fail, args=(n,)) for n in (1, 2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    paths = {line.rsplit('Python traceback in ', 1)[1].rstrip(')'): line for line in lines}
    assert len(paths) == 2
    for path, line in paths.items():
        with open(path) as f:
            assert line.split(' (Python')[0].split(': ', 1)[1] in f.read()     # each file holds its own error


def test_a_link_planted_at_the_old_or_the_new_path_is_not_followed(cache, tmp_path, monkeypatch):
    target = tmp_path / 'precious'
    target.write_text('keep me\n')
    # The old fixed name in the shared temporary directory: never written again.
    monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path))
    os.symlink(target, tmp_path / 'gpuhost-last-error.txt')
    describe_unexpected(RuntimeError('first'))
    # A link at the very name the next file gets: O_EXCL refuses it, the file takes another name.
    names = iter(['error-20261206T000000Z-1-0000beef.txt', 'error-20261206T000000Z-1-0000cafe.txt'])
    monkeypatch.setattr(errors, '_new_name', lambda: next(names))
    os.symlink(target, cache / 'error-20261206T000000Z-1-0000beef.txt')
    line = describe_unexpected(RuntimeError('second'))
    assert line.endswith('%s)' % (cache / 'error-20261206T000000Z-1-0000cafe.txt')), line
    # The directory itself replaced by a link to another: nothing is written there, and the line says so.
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir()
    os.rename(cache, tmp_path / 'moved')
    os.symlink(elsewhere, cache)
    line = describe_unexpected(RuntimeError('third'))
    assert line.startswith('unexpected RuntimeError: third (no traceback kept: ') and not os.listdir(elsewhere), line
    assert target.read_text() == 'keep me\n'


def test_old_tracebacks_are_pruned(cache):
    describe_unexpected(RuntimeError('first'))
    old = cache / 'error-20200101T000000Z-1-00000000.txt'
    old.write_text('old')
    os.utime(old, (0, 0))
    foreign = cache / 'notes.txt'
    foreign.write_text('not ours')
    os.utime(foreign, (0, 0))
    describe_unexpected(RuntimeError('second'))
    assert not old.exists() and foreign.exists() and len(list(cache.glob('error-*.txt'))) == 2
