"""What an error tells the operator, from the program or the provider plugin: one line, no Python frames, no
secret - and the full traceback of anything unforeseen kept in a private file of the user running the CLI.

Secrets: every process that holds a credential unwrapped (the program after it read the stack, the plugin after
Configure and in each call) hands it to remember(); scrub() takes each one out of any text before it leaves the
process (an error, a log line, a traceback file). A message is never built from repr() of a property value; the
scrub is what catches a library's message that was (the Pulumi SDK's serializer puts repr(value) into its
ValueError)."""

from __future__ import annotations

import datetime
import os
import re
import secrets as _random
import threading
import time

# Keys whose string values are credentials wherever they sit in a property or configuration (the connection's key,
# the API's password, the model hub's token, SGLang's API key, the package index password).
CREDENTIAL_KEYS = frozenset({'private_key', 'password', 'token', 'token_secret', 'api_key', 'index_password'})
# Shorter values are not scrubbed: a 3-character "secret" would blank out words of every message.
MIN_SECRET = 4
# A multi-line secret (a PEM key) is also scrubbed line by line, for a message that quotes part of it.
MIN_LINE = 16
MASK = '[secret]'

_secrets: set = set()
_lock = threading.Lock()
_pattern = None


def _forms(value: str):
    """The secret as it may appear in text: itself, escaped by repr() or JSON, and its long lines."""
    import json
    yield value
    yield repr(value)[1:-1]
    yield json.dumps(value)[1:-1]
    for line in value.splitlines():
        if len(line.strip()) >= MIN_LINE and not line.startswith('-----'):    # not a PEM armour line
            yield line.strip()


def remember(value) -> None:
    """Note the credentials in a value (a configuration, a resource's properties, a config model's dump): every
    string under a CREDENTIAL_KEYS key, at any depth."""
    global _pattern
    found = set()

    def walk(v, k):
        if isinstance(v, dict):
            for kk, vv in v.items():
                walk(vv, kk)
        elif isinstance(v, (list, tuple)):
            for vv in v:
                walk(vv, k)
        elif isinstance(v, str) and k in CREDENTIAL_KEYS and len(v) >= MIN_SECRET:
            found.update(f for f in _forms(v) if len(f) >= MIN_SECRET)
        elif hasattr(v, 'get_secret_value'):          # pydantic's SecretStr
            walk(v.get_secret_value(), k)
    walk(value, None)
    with _lock:
        if found - _secrets:
            _secrets.update(found)
            # Compiled when a scrub needs it, not here: each host's configuration adds its key's lines, and compiling
            # the alternation of every secret so far at each host cost a process 2.5 CPU-s for 50 hosts with RSA keys
            # (python -m tools.bench_scrub; docs/bench.md).
            _pattern = None


def _compiled():
    global _pattern
    with _lock:
        if _pattern is None and _secrets:
            _pattern = re.compile('|'.join(re.escape(s) for s in sorted(_secrets, key=len, reverse=True)))
        return _pattern


def scrub(text: str) -> str:
    """`text` with every remembered secret replaced by [secret]."""
    if not text or not _secrets:
        return text
    pattern = _pattern
    if pattern is None:
        # Not compiled since the last secret came: compiled only for a text that holds one (a message between two
        # hosts' configurations seldom does), else each host's log line would compile it again.
        if not any(s in text for s in list(_secrets)):
            return text
        pattern = _compiled()
    return pattern.sub(MASK, text)


# ---------------------------------------------------------------------------------------------- the traceback file

KEEP_DAYS = 30
KEEP_FILES = 200
NAME = re.compile(r'^error-\d{8}T\d{6}Z-\d+-[0-9a-f]{8}\.txt$')


def error_dir() -> str:
    base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    return os.path.join(base, 'gpuhost', 'errors')


def _private_dir() -> int:
    """A descriptor of ~/.cache/gpuhost/errors, made 0700 where missing. Neither gpuhost/ nor errors/ is
    followed if it is a symbolic link, and a directory another user owns is refused (OSError)."""
    base = os.path.dirname(os.path.dirname(error_dir()))
    os.makedirs(base, mode=0o700, exist_ok=True)
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in ('gpuhost', 'errors'):
            try:
                os.mkdir(part, 0o700, dir_fd=fd)
            except FileExistsError:
                pass
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
            st = os.fstat(fd)
            if st.st_uid != os.geteuid():
                raise PermissionError('%s belongs to uid %d, not to this user' % (part, st.st_uid))
        if os.fstat(fd).st_mode & 0o077:
            os.fchmod(fd, 0o700)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _prune(fd: int) -> None:
    """Tracebacks older than KEEP_DAYS go, and all but the newest KEEP_FILES (a loop of failing runs)."""
    cutoff = time.time() - KEEP_DAYS * 86400
    kept = []
    for name in os.listdir(fd):
        if not NAME.match(name):
            continue
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if st.st_mtime < cutoff:
                os.unlink(name, dir_fd=fd)
            else:
                kept.append((st.st_mtime, name))
        except OSError:
            pass
    for _, name in sorted(kept, reverse=True)[KEEP_FILES:]:
        try:
            os.unlink(name, dir_fd=fd)
        except OSError:
            pass


def _new_name() -> str:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime('%Y%m%dT%H%M%SZ')
    return 'error-%s-%d-%s.txt' % (stamp, os.getpid(), _random.token_hex(4))


def keep_traceback(text: str) -> str:
    """Write `text` (scrubbed) to a new file of its own in the private error directory: a unique name, created with
    O_EXCL|O_NOFOLLOW and mode 0600, so nothing planted at a name is followed or overwritten and two errors at
    once leave two files. Returns its path; OSError when no file could be made."""
    fd = _private_dir()
    try:
        _prune(fd)
        for _ in range(8):
            name = _new_name()
            try:
                out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                              dir_fd=fd)
            except FileExistsError:
                continue
            with os.fdopen(out, 'w') as f:
                f.write(scrub(text))
            return os.path.join(error_dir(), name)
        raise FileExistsError('no free name for an error file')
    finally:
        os.close(fd)


def describe_unexpected(e: BaseException) -> str:
    """One line for an exception no layer turned into an operator's error (a bug, or a library error we did not
    foresee): its type and text, without frames or secrets, plus where the full traceback went."""
    import traceback
    try:
        # An explicit limit: format_exception given none honours sys.tracebacklimit, whatever the process set it to
        # (0 left the file one line, no frames).
        path = keep_traceback(''.join(traceback.format_exception(type(e), e, e.__traceback__, limit=64)))
        where = ' (Python traceback in %s)' % path
    except OSError as err:
        where = ' (no traceback kept: %s: %s)' % (error_dir(), err.strerror or err)
    # Scrubbed before it is folded onto one line and cut: a secret of several lines, or one cut in two, would
    # no longer be found.
    message = ' '.join(scrub(str(e)).split())[:500] or '(no message)'
    return scrub('unexpected %s: %s%s' % (type(e).__name__, message, where))
