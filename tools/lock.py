"""make lock STACK=<name>: the stack's SGLang environment lock, resolved from what the operator asks for.

    runtime/sglang.in    what the operator asks for: sglang==<version>, pip, extras, pins of their own (pip's
                         requirements format; the lock's name with .in for .lock)
    runtime/sglang.lock  every package pinned to one version with the sha256 of its files (gpuhost:runtime.python.lock)

Resolved by uv (`uv pip compile --generate-hashes`, pinned in requirements-dev.txt) for the container the stack
builds the environment in: gpuhost:runtime.python.version and the glibc of gpuhost:container.ostemplate
(grammar/distro.py: debian-12-standard is glibc 2.36, Python 3.11), from the stack's index
(gpuhost:runtime.python.index; INDEX=<url> for a stack whose packages come from a wheelhouse on the host). The
index's login reaches uv through a netrc file of its own (0600, in a 0700 directory, removed after): uv sends it
to the index's host only, never on a command line. An existing lock is the starting point: packages keep their
pins unless the .in asks otherwise (UPGRADE=1: the newest of everything the .in allows). The new lock replaces
the old only when grammar/pylock.py accepts it and it pins the stack's gpuhost:sglang.version and pip.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import config  # noqa: E402
from config import load as config_load  # noqa: E402
from grammar import distro, pylock  # noqa: E402
from tools.sglang_flags_gen import write_atomic  # noqa: E402

STACK_RE = re.compile(r'^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$')


class LockFailed(Exception):
    pass


def in_path(lock_rel: str) -> str:
    stem = lock_rel[:-len('.lock')] if lock_rel.endswith('.lock') else lock_rel
    return stem + '.in'


def secret(stack: str, path: str, project: str) -> str:
    """A secure: config value, decrypted by the CLI (the stack's passphrase or secrets provider)."""
    res = subprocess.run(['pulumi', 'config', 'get', '--path', path, '--stack', stack, '--cwd', project],
                         capture_output=True, text=True)
    if res.returncode != 0:
        raise LockFailed('%s: the CLI could not read it (%s)' % (path, (res.stderr.strip().splitlines() or
                                                                   ['no message'])[-1]))
    return res.stdout.rstrip('\n')


def targets(stack: str, project: str) -> list:
    """[(deployment, glibc, python)] for each lock the stack builds environments from: every host that builds one
    lock must build it for the same container platform."""
    from tools.render import load_fleet
    fleet = load_fleet(stack, project)
    hosts = [h for h in fleet.hosts if h.deployment.runtime and h.deployment.runtime.python]
    if not hosts:
        raise LockFailed('stack %s declares no gpuhost:runtime.python (its lock and index): nothing to lock' % stack)
    by_lock = {}
    for h in hosts:
        d = h.deployment
        try:
            release, glibc, _ = distro.of_template(d.container.ostemplate)
        except distro.UnknownTemplate as e:
            raise LockFailed('%sgpuhost:container.ostemplate: %s' % ('%s: ' % h.name if h.name else '', e)) from None
        by_lock.setdefault(d.runtime.python.lock, {}).setdefault((d.runtime.python.version, glibc), []).append(
            (h, release))
    out = []
    for lock, platforms in sorted(by_lock.items()):
        if len(platforms) > 1:
            raise LockFailed('%s is built for containers of different platforms (%s): give each platform its own lock '
                             '(gpuhost:runtime.python.lock)' % (lock, '; '.join(
                                 '%s: Python %s, glibc %s (%s)' % (', '.join(h.label for h, _ in v), py, glibc, v[0][1])
                                 for (py, glibc), v in sorted(platforms.items()))))
        (python, glibc), hosts_of = next(iter(platforms.items()))
        out.append((hosts_of[0][0].deployment, glibc, python))
    return out


def netrc_for(url: str, username: str, password: str, where: str) -> str:
    host = urllib.parse.urlsplit(url).hostname
    path = os.path.join(where, 'netrc')
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, 'w') as f:
        f.write('machine %s login %s password %s\n' % (host, username, password))
    return path


def wheels_of(toml_bytes: bytes) -> dict:
    """{canonical name: [(file name, bytes, sha256)]} of a pylock.toml (PEP 751) as uv writes it."""
    import tomllib
    doc = tomllib.loads(toml_bytes.decode())
    out = {}
    for pkg in doc.get('packages', []):
        files = []
        for w in pkg.get('wheels', []):
            name = w.get('name') or urllib.parse.unquote(urllib.parse.urlsplit(w.get('url', '')).path.rsplit('/', 1)[-1])
            files.append((name, w.get('size'), (w.get('hashes') or {}).get('sha256')))
        out[pylock.canonical_name(pkg['name'])] = files
    return out


def annotate(text: str, wheels: dict) -> str:
    """uv's lock with each pin's hashes cut to its wheels for this platform, and those wheels named under it
    ("# wheel: <file> <bytes>", what the platform check and the preview read); uv's own comments kept."""
    blocks, head = [], []
    for line in text.splitlines():
        if line and not line[0].isspace() and not line.startswith('#'):
            blocks.append([line])
        elif blocks:
            blocks[-1].append(line)
        else:
            head.append(line)
    out = head[:]
    for block in blocks:
        pin = pylock.parse('\n'.join(block) + '\n')
        (key, p), = pin.pins.items()
        files = [w for w in wheels.get(key, []) if w[2] in p.hashes]
        if not files:
            raise LockFailed('%s==%s: no wheel of it for this platform among its hashes (uv listed %s)' % (
                p.name, p.version, [w[0] for w in wheels.get(key, [])] or 'none'))
        spec = block[0].rstrip(' \\')
        hashes = ['    --hash=sha256:%s' % h for h in sorted({w[2] for w in files})]
        out.append(spec + ' \\')
        out.extend(h + ' \\' for h in hashes[:-1])
        out.append(hashes[-1])
        out.extend('    # wheel: %s%s' % (name, ' %d' % size if size is not None else '') for name, size, _ in files)
        out.extend(line for line in block[1:] if line.lstrip().startswith('#'))
    return '\n'.join(out) + '\n'


def run(stack: str, project: str = ROOT, index: str = None, upgrade: bool = False, uv: str = None) -> list:
    """Write each of the stack's locks; returns a line for each saying what it pins."""
    if not STACK_RE.match(stack):
        raise LockFailed('STACK=%r is not a stack name' % stack)
    return [lock_one(stack, d, glibc, python, project, index, upgrade, uv)
            for d, glibc, python in targets(stack, project)]


def lock_one(stack, d, glibc, python, project, index, upgrade, uv) -> str:
    py = d.runtime.python
    lock_path = config_load.full_path(py.lock, project)
    src = config_load.full_path(in_path(py.lock), project)
    if not os.path.isfile(src):
        raise LockFailed('%s is missing: write what the environment needs there (sglang==%s and pip, one per line; '
                         'extras and pins of your own beside them), then run make lock again' % (
                             os.path.relpath(src, project), d.sglang.version))
    username = password = None
    if index is None:
        if py.index is None:
            raise LockFailed('stack %s takes its packages from a wheelhouse on the host (gpuhost:runtime.python.'
                             'wheelhouse): name the index the wheels come from, make lock STACK=%s INDEX=<url>' % (
                                 stack, stack))
        index, username = py.index.url, py.index.username
        if py.index.password_file is not None:
            password = config_load.read_file(py.index.password_file, project,
                                             'gpuhost:runtime.python.index.password_file').strip()
        elif py.index.password is not None:
            password = secret(stack, 'gpuhost:runtime.python.index.password', project)
    uv = uv or shutil.which('uv') or os.path.join(os.path.dirname(sys.executable), 'uv')
    work = tempfile.mkdtemp(prefix='gpuhost-lock-')   # 0700
    try:
        out = os.path.join(work, os.path.basename(lock_path))
        if os.path.isfile(lock_path) and not upgrade:
            shutil.copyfile(lock_path, out)     # uv keeps the pins of the output file it finds
        env = {k: v for k, v in os.environ.items() if not k.startswith('UV_')}
        env['NETRC'] = netrc_for(index, username, password, work) if username else os.devnull
        argv = [uv, 'pip', 'compile', os.path.relpath(src, project), '--generate-hashes', '--python-version', python,
                '--python-platform', distro.manylinux(glibc), '--index-url', index, '--no-emit-index-url',
                '--only-binary', ':all:', '--custom-compile-command', 'make lock STACK=%s' % stack, '--quiet',
                '-o', out] + (
                    ['--upgrade'] if upgrade else [])
        # From the project: the lock says which .in it came from as the operator names it ("via -r runtime/...").
        res = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=project)
        if res.returncode != 0:
            text = (res.stderr or res.stdout).strip()
            if password:
                text = text.replace(password, '[secret]')
            raise LockFailed('uv could not resolve %s for Python %s on glibc %s from %s:\n%s' % (
                os.path.relpath(src, project), python, glibc, index, text[-4000:]))
        with open(out) as f:
            text = f.read()
        try:
            resolved = pylock.parse(text)
        except pylock.LockError as e:
            raise LockFailed('the resolved lock, line %d: %s (%s kept as it was)' % (e.line, e, py.lock)) from None
        # The wheels of each pin for this platform, with their sizes: uv's pylock.toml of exactly these pins.
        pins_in = os.path.join(work, 'pins.in')
        with open(pins_in, 'w') as f:
            f.write(''.join('%s==%s\n' % (k, v) for k, v in resolved.versions().items()))
        toml_out = os.path.join(work, 'pylock.toml')
        res = subprocess.run(argv[:3] + [pins_in, '--no-deps', '--python-version', python, '--python-platform',
                                         distro.manylinux(glibc), '--index-url', index, '--only-binary', ':all:',
                                         '--quiet', '-o', toml_out], env=env, capture_output=True, text=True,
                             cwd=work)
        if res.returncode != 0:
            text = (res.stderr or res.stdout).strip()
            raise LockFailed('uv could not list the wheels of the resolved pins: %s' % (
                text.replace(password, '[secret]') if password else text)[-4000:])
        with open(toml_out, 'rb') as f:
            text = annotate(text, wheels_of(f.read()))
        try:
            lock = pylock.parse(text)
        except pylock.LockError as e:
            raise LockFailed('the resolved lock, line %d: %s (%s kept as it was)' % (e.line, e, py.lock)) from None
        sg = lock.get('sglang')
        if sg is None or sg.version != d.sglang.version:
            raise LockFailed('the resolved lock pins sglang %s, the stack runs gpuhost:sglang.version %s: ask for '
                             'sglang==%s in %s (%s kept as it was)' % (
                                 sg.version if sg else 'not at all', d.sglang.version, d.sglang.version,
                                 in_path(py.lock), py.lock))
        if lock.get('pip') is None:
            raise LockFailed('the resolved lock pins no pip (the container has none; the environment is built with '
                             'the pip the lock pins): add pip to %s (%s kept as it was)' % (in_path(py.lock), py.lock))
        # A file of its own beside the lock, renamed over it: a reader sees the old lock or the new one.
        write_atomic(lock_path, text)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    torch = lock.get('torch')
    return '%s: %d packages for Python %s on glibc %s (%s), sglang %s%s, from %s' % (
        py.lock, len(lock.pins), python, glibc, distro.manylinux(glibc), sg.version,
        ', torch %s' % torch.version if torch else '', index)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog='make lock', description=__doc__.split('\n\n')[0])
    ap.add_argument('stack')
    ap.add_argument('--index', help='resolve from this index instead of the stack\'s')
    ap.add_argument('--upgrade', action='store_true', help='the newest versions the .in allows')
    ap.add_argument('--project', default=ROOT, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        for line in run(args.stack, os.path.abspath(args.project), args.index, args.upgrade):
            print(line)
    except (LockFailed, config.ConfigError, OSError) as e:
        sys.stderr.write('make lock: %s\n' % e)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
