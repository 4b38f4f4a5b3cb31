"""What a wheel needs of the machine it is installed on, from its file name (PEP 427 name, PEP 425 tags, PEP 600
manylinux): the Python (its python and ABI tags) and the glibc (its platform tag). Stdlib only.

    torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl        CPython 3.11, glibc 2.28 or newer, x86_64
    aiohttp-3.14.5-py3-none-any.whl                           any Python 3, any platform
    cryptography-47.0.0-cp39-abi3-manylinux_2_34_x86_64.whl   CPython 3.9 or newer (the stable ABI), glibc 2.34
"""

import re

WHEEL_RE = re.compile(r'^(?P<name>[^-]+)-(?P<version>[^-]+)(?:-(?P<build>\d[^-]*))?-(?P<py>[^-]+)-(?P<abi>[^-]+)-'
                      r'(?P<plat>[^-]+)\.whl$')
# The legacy manylinux names (PEP 600: manylinux1 = 2.5, manylinux2010 = 2.12, manylinux2014 = 2.17).
LEGACY = {'manylinux1': (2, 5), 'manylinux2010': (2, 12), 'manylinux2014': (2, 17)}
PLAT_RE = re.compile(r'^(?:manylinux_(\d+)_(\d+)|(manylinux1|manylinux2010|manylinux2014))_(x86_64|aarch64|i686)$')


class NotAWheel(ValueError):
    pass


class Wheel(object):
    """One wheel's needs: pythons [(major, minor, exact)], glibc (major, minor) or None (pure), arch or None."""

    def __init__(self, filename: str):
        m = WHEEL_RE.match(filename)
        if not m:
            raise NotAWheel('%r is not a wheel file name (name-version-python-abi-platform.whl)' % filename)
        self.filename = filename
        self.name, self.version = m.group('name'), m.group('version')
        self.abi = m.group('abi')
        self.pythons = [self._python(t) for t in m.group('py').split('.')]
        self.platforms = m.group('plat').split('.')

    @staticmethod
    def _python(tag):
        m = re.match(r'^(py|cp)(\d)(\d*)$', tag)
        if not m:
            return None
        return (m.group(1), int(m.group(2)), int(m.group(3)) if m.group(3) else None)

    def python_ok(self, python: str) -> bool:
        major, minor = (int(x) for x in python.split('.'))
        for tag in self.pythons:
            if tag is None:
                continue
            kind, tmajor, tminor = tag
            if tmajor != major:
                continue
            if tminor is None:
                return True
            if kind == 'py' or self.abi == 'abi3':
                if tminor <= minor:
                    return True
            elif tminor == minor:
                return True
        return False

    def glibc(self):
        """The oldest glibc of its platform tags, None for a pure wheel ('any'); 'other' for a platform that no
        glibc Linux runs (macOS, Windows, musllinux, linux_x86_64: built for one machine only)."""
        best = 'other'
        for plat in self.platforms:
            if plat == 'any':
                return None
            m = PLAT_RE.match(plat)
            if m:
                need = (int(m.group(1)), int(m.group(2))) if m.group(1) else LEGACY[m.group(3)]
                if best == 'other' or need < best:
                    best = need
        return best

    def arch(self):
        for plat in self.platforms:
            m = PLAT_RE.match(plat)
            if m:
                return m.group(4)
        return None

    def runs_on(self, python: str, glibc: str, arch: str = 'x86_64') -> bool:
        need = self.glibc()
        if need == 'other':
            return False
        if need is not None and (self.arch() != arch or need > tuple(int(x) for x in glibc.split('.'))):
            return False
        return self.python_ok(python)

    def needs(self) -> str:
        """What it needs, as an operator reads it: "Python 3.11, glibc 2.34"."""
        pys = []
        for tag in self.pythons:
            if tag is None:
                continue
            kind, major, minor = tag
            if minor is None:
                pys.append('Python %d' % major)
            elif kind == 'py' or self.abi == 'abi3':
                pys.append('Python %d.%d or newer' % (major, minor))
            else:
                pys.append('Python %d.%d' % (major, minor))
        need = self.glibc()
        plat = 'any platform' if need is None else ('a platform other than glibc Linux (%s)' % '.'.join(
            self.platforms) if need == 'other' else 'glibc %d.%d or newer' % need)
        return '%s, %s' % (' or '.join(pys) or 'an unknown Python', plat)


def unfit(pins, python: str, glibc: str, arch: str = 'x86_64') -> list:
    """[(pin, what its wheels need)] of the pins (grammar/pylock.py Pin, with the wheels `make lock` named) none of
    whose wheels runs on this Python and glibc. A pin without named wheels is not judged (a lock made by hand)."""
    out = []
    for pin in pins:
        wheels = []
        for name, _size in pin.wheels:
            try:
                wheels.append(Wheel(name))
            except NotAWheel:
                continue
        if wheels and not any(w.runs_on(python, glibc, arch) for w in wheels):
            out.append((pin, '; '.join(sorted({w.needs() for w in wheels}))))
    return out


def refusal(bad: list, where: str, glibc: str, python: str) -> str:
    """What unfit() found, as the preview and the preflight both say it: the first package, what it needs, what the
    container (`where`) has, how many more, and the fix."""
    pin, needs = bad[0]
    more = ' (and %d more: %s)' % (len(bad) - 1, ', '.join(p.name for p, _ in bad[1:6])) if len(bad) > 1 else ''
    return ('%s %s needs %s; %s has glibc %s and Python %s%s. Make the lock for that container (make lock '
            'STACK=<stack>), or pin a version with a wheel for it in the lock\'s .in' % (
                pin.name, pin.version, needs, where, glibc, python, more))


def download_bytes(pins) -> int:
    """What installing the pins downloads, where the lock says it: per pin, its platform wheel's size (pip prefers it
    to a pure one), else its pure wheel's. 0 where no size is known."""
    total = 0
    for pin in pins:
        sized = []
        for name, size in pin.wheels:
            try:
                sized.append((Wheel(name).glibc() is None, size or 0))
            except NotAWheel:
                continue
        if sized:
            total += sorted(sized)[0][1]
    return total
