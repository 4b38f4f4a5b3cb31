"""What a container template gives the environment the program builds in it: its glibc and its python3.

Proxmox's appliance templates (`pveam available --section system`) are named <distribution>-<release>-standard_...;
the C library and the Python of each release are the distribution's own (Debian's and Ubuntu's package versions of
libc6 and python3). Wheels name the glibc they need in their platform tag (manylinux_2_34 needs 2.34 or newer, PEP
600) and the Python in theirs: the lock is resolved for these (tools/lock.py), and checked against them.
Stdlib only.
"""

import re

# (distribution, release) -> (glibc, python3 minor version)
RELEASES = {
    ('debian', '11'): ('2.31', '3.9'),
    ('debian', '12'): ('2.36', '3.11'),
    ('debian', '13'): ('2.41', '3.13'),
    ('ubuntu', '20.04'): ('2.31', '3.8'),
    ('ubuntu', '22.04'): ('2.35', '3.10'),
    ('ubuntu', '24.04'): ('2.39', '3.12'),
}

TEMPLATE_RE = re.compile(r'(?:^|[:/])(debian|ubuntu)-(\d+(?:\.\d+)?)-standard_[^/]*$')


class UnknownTemplate(ValueError):
    pass


def of_template(ostemplate: str) -> tuple:
    """(distribution-release, glibc, python) of a container template volume ID, e.g.
    local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst -> ('debian-12', '2.36', '3.11')."""
    m = TEMPLATE_RE.search(ostemplate)
    if not m or (m.group(1), m.group(2)) not in RELEASES:
        known = ', '.join('%s-%s' % k for k in sorted(RELEASES))
        raise UnknownTemplate('%s is not a template whose C library the program knows (%s-standard); name its glibc '
                              'version (ldd --version in a container made from it)' % (ostemplate, known))
    glibc, python = RELEASES[(m.group(1), m.group(2))]
    return '%s-%s' % m.groups(), glibc, python


def manylinux(glibc: str, arch: str = 'x86_64') -> str:
    """The newest manylinux platform a glibc runs (uv's --python-platform): 2.36 -> x86_64-manylinux_2_36."""
    major, minor = glibc.split('.')
    return '%s-manylinux_%s_%s' % (arch, major, minor)
