"""A lock: a pip requirements file in which every package is pinned to one version and to the sha256 of
its files (what `pip-compile --generate-hashes` and `uv pip compile --generate-hashes` write, what `pip
install --require-hashes` and `uv pip sync` install). Read with pip's own rules (requirements file
format): a backslash at the end of a line continues it, a `#` at the start of a line or after
whitespace starts a comment, per-requirement options follow the requirement (`--hash=sha256:<hex>` or
`--hash sha256:<hex>`).

Stricter than pip: every requirement is `name==version` (or `===`), optionally with extras and an
environment marker, and carries at least one sha256; nothing in the file may say where packages come
from (`--index-url`, `--find-links`, `-e`, a URL): the source is the stack's to declare, and a lock that
named one would silently win over it. Stdlib only.
"""

import hashlib
import re

NAME_RE = re.compile(r'^([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)(\[[A-Za-z0-9._,\s-]*\])?\s*(===|==)\s*'
                     r'([A-Za-z0-9][A-Za-z0-9.+!_-]*)\s*(?:;\s*(.+?))?\s*$')
HASH_RE = re.compile(r'^sha256:([0-9a-f]{64})$')
# "    # wheel: <file name> <bytes>" under a pin: the wheel one of its hashes is of (tools/lock.py writes them).
WHEEL_COMMENT_RE = re.compile(r'^\s*#\s*wheel:\s*(\S+\.whl)(?:\s+(\d{1,15}))?\s*$')
# Options pip allows in a requirements file that name a package source or another file.
SOURCE_OPTIONS = ('-i', '--index-url', '--extra-index-url', '--no-index', '-f', '--find-links', '--trusted-host',
                  '-r', '--requirement', '-c', '--constraint', '-e', '--editable')
# Options that change nothing about what is installed from a complete lock.
HARMLESS_OPTIONS = ('--require-hashes',)


class LockError(ValueError):
    """A line of the lock pip would read differently, or that pins nothing. `line` counts from 1."""

    def __init__(self, line, message):
        super().__init__(message)
        self.line = line


def canonical_name(name: str) -> str:
    """PEP 503's normalised project name (what an index lists and pip compares)."""
    return re.sub(r'[-_.]+', '-', name).lower()


class Pin(object):
    def __init__(self, name, version, hashes, extras='', marker=None, line=0):
        self.name, self.version, self.hashes = name, version, sorted(set(hashes))
        self.extras, self.marker, self.line = extras, marker, line
        self.wheels = []     # [(file name, bytes or None)] from "# wheel:" comments; empty where the lock names none

    @property
    def key(self):
        return canonical_name(self.name)

    def requirement(self) -> str:
        """The pin as one requirements-file line (hashes sorted): what the environment is built from."""
        spec = '%s%s==%s' % (self.key, self.extras, self.version)
        if self.marker:
            spec += ' ; ' + self.marker
        return spec + ''.join(' --hash=sha256:%s' % h for h in self.hashes)


class Lock(object):
    def __init__(self, pins):
        self.pins = {p.key: p for p in pins}

    def versions(self) -> dict:
        return {k: p.version for k, p in sorted(self.pins.items())}

    def canonical(self) -> str:
        """The lock's meaning and nothing else (no comments, no layout, sorted): two locks that install the
        same files have the same canonical text, so a reworded comment builds no new environment."""
        return ''.join(p.requirement() + '\n' for _, p in sorted(self.pins.items()))

    def sha256(self) -> str:
        return hashlib.sha256(self.canonical().encode()).hexdigest()

    def get(self, name):
        return self.pins.get(canonical_name(name))


def logical_lines(text: str):
    """(first physical line number, logical line) as pip reads them: comments removed, continuations joined."""
    out, buf, start = [], '', None
    for n, raw in enumerate(text.splitlines(), 1):
        line = re.sub(r'(^|\s)#.*$', '', raw)
        if start is None:
            start = n
        if line.endswith('\\'):
            buf += line[:-1] + ' '
            continue
        buf += line
        if buf.strip():
            out.append((start, buf.strip()))
        buf, start = '', None
    if buf.strip():
        out.append((start, buf.strip()))
    return out


def parse(text: str) -> Lock:
    if '\0' in text:
        raise LockError(1, 'holds a NUL byte: not a text file')
    pins, seen = [], {}
    for n, line in logical_lines(text):
        words = line.split()
        if words[0].startswith('-'):
            opt = words[0].split('=', 1)[0]
            if opt in HARMLESS_OPTIONS:
                continue
            if opt in SOURCE_OPTIONS:
                raise LockError(n, '%s names a package source or another file; a lock pins packages only - the '
                                   'source is the stack\'s (gpuhost:runtime.python.index or wheelhouse). Remove the '
                                   'line (pip-compile --no-emit-index-url --no-emit-find-links)' % opt)
            raise LockError(n, 'option %s is not one a lock needs; remove it' % opt)
        # The requirement is everything before the first option; what follows must be hashes.
        first = re.search(r'\s--?[A-Za-z]', ' ' + line)
        req = (' ' + line)[:first.start()].strip() if first else line
        rest = (' ' + line)[first.start():].split() if first else []
        if '@' in req.split(';')[0] or '://' in req:
            raise LockError(n, '%r is a direct reference (name @ URL); pin it as name==version with its hashes '
                               'and serve the file from the package source' % req)
        m = NAME_RE.match(req)
        if not m:
            raise LockError(n, '%r is not pinned to one version (name==version): a lock pins every package '
                               'exactly (pip-compile --generate-hashes writes it so)' % req[:80])
        name, extras, _, version, marker = m.groups()
        hashes = []
        i = 0
        while i < len(rest):
            word = rest[i]
            if word == '--hash' and i + 1 < len(rest):
                value, i = rest[i + 1], i + 2
            elif word.startswith('--hash='):
                value, i = word[len('--hash='):], i + 1
            else:
                raise LockError(n, '%s==%s: %r is not a --hash option; only hashes may follow a pin' % (
                    name, version, word))
            h = HASH_RE.match(value)
            if not h:
                raise LockError(n, '%s==%s: %r is not sha256:<64 lowercase hex digits>; the lock pins sha256 '
                                   'hashes (pip-compile --generate-hashes)' % (name, version, value[:80]))
            hashes.append(h.group(1))
        if not hashes:
            raise LockError(n, '%s==%s has no --hash; every package must be pinned with the sha256 of its files, '
                               'or pip would install whatever the source serves under that version (pip-compile '
                               '--generate-hashes or uv pip compile --generate-hashes)' % (name, version))
        key = canonical_name(name)
        if key in seen:
            raise LockError(n, '%s is pinned twice (also line %d); keep one' % (name, seen[key]))
        seen[key] = n
        pins.append(Pin(name, version, hashes, (extras or '').replace(' ', ''), marker, n))
    if not pins:
        raise LockError(1, 'pins no package')
    # `make lock` names the wheels each pin's hashes are of, in comments under it (what the platform check reads).
    starts = sorted((p.line, p) for p in pins)
    for n, raw in enumerate(text.splitlines(), 1):
        m = WHEEL_COMMENT_RE.match(raw)
        if m:
            owner = [p for line, p in starts if line <= n]
            if not owner:
                raise LockError(n, 'a "# wheel:" comment before any pin; it belongs under the pin of its wheel')
            owner[-1].wheels.append((m.group(1), int(m.group(2)) if m.group(2) else None))
    return Lock(pins)
