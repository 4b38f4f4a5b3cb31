"""The lab containers' base: a Debian 12 root like Proxmox's `debian-12-standard` template, built once.

    python -m lab.ctbase            build it unless cached; prints its path
    python -m lab.ctbase --info     path, size and package count of the cached base

Built with Debian's `mmdebstrap` from Debian's packages into ~/.cache/gpuhost/ct-base/<recipe hash>/root
and never written again: every lab container is an overlay of it (lab/container.py), so a container
is made in milliseconds and destroyed without trace. Nothing of this project is in it - no SGLang, no
virtualenv, no NVIDIA library: what the service needs, the program installs (gpuhost:runtime).

What it has: Debian's `important` packages (systemd as init, apt, cron, iproute2, procps, ...) plus
the `standard`-priority tools Proxmox's template carries (python3, curl, wget, ca-certificates, less,
locales, ...). Left out on purpose: the template's network daemons (openssh-server, postfix) and
ifupdown - the lab's containers share the machine's network namespace (their addresses are loopback
addresses), where a second sshd on port 22 or an `ifup` would touch the machine itself.
"""

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

SUITE = 'bookworm'
VARIANT = 'important'
INCLUDE = ('python3', 'ca-certificates', 'curl', 'wget', 'less', 'locales', 'bash-completion', 'xz-utils',
           'bzip2', 'file', 'openssh-client', 'iputils-ping', 'procps', 'iproute2', 'dbus')
MIRROR = os.environ.get('GPUHOST_DEBIAN_MIRROR', 'http://deb.debian.org/debian')
CACHE = os.path.join(os.environ.get('GPUHOST_CACHE') or os.path.join(os.path.expanduser('~'), '.cache', 'gpuhost'),
                     'ct-base')
# Bumped when the way the base is made changes without the package list changing.
RECIPE_VERSION = 1


class BaseError(RuntimeError):
    pass


def recipe():
    return {'suite': SUITE, 'variant': VARIANT, 'include': sorted(INCLUDE), 'version': RECIPE_VERSION}


def key():
    return hashlib.sha256(json.dumps(recipe(), sort_keys=True).encode()).hexdigest()[:16]


def path():
    """Where the base's root lives once built (it may not exist yet)."""
    return os.path.join(CACHE, key(), 'root')


def ready(root=None):
    root = root or path()
    return os.path.exists(os.path.join(os.path.dirname(root), 'manifest.json'))


def ensure(log=None):
    """The base's root directory, built first if the cache lacks it. Several labs may start at once
    (parallel test modules): one builds under a lock, the others wait for it."""
    root = path()
    if ready(root):
        return root
    os.makedirs(CACHE, exist_ok=True)
    with open(os.path.join(CACHE, 'build.lock'), 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready(root):
            return root
        build(os.path.dirname(root), log=log)
    return root


def build(dest, log=None):
    """mmdebstrap into a temporary directory beside dest, then rename: a cache entry is whole or absent."""
    if not shutil.which('mmdebstrap'):
        raise BaseError('mmdebstrap is missing: the lab builds its containers\' Debian 12 base with it '
                        '(apt-get install mmdebstrap systemd-container; tools/run.sh does this)')
    tmp = '%s.tmp-%d' % (dest, os.getpid())
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    t0 = time.time()
    argv = ['mmdebstrap', '--mode=root', '--variant=' + VARIANT, '--include=' + ','.join(INCLUDE),
            # What pct create leaves for the container to fill in at its first start: no hostname of the
            # machine that built it, an empty machine-id (a new one per container, lab/container.py).
            '--customize-hook=echo localhost > "$1/etc/hostname"',
            '--customize-hook=: > "$1/etc/machine-id"',
            SUITE, os.path.join(tmp, 'root'), MIRROR]
    out = open(os.path.join(tmp, 'build.log'), 'w') if log is None else log
    try:
        res = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT)
    finally:
        if log is None:
            out.close()
    if res.returncode != 0:
        tail = ''
        if log is None:
            with open(os.path.join(tmp, 'build.log')) as f:
                tail = f.read()[-2000:]
        shutil.rmtree(tmp, ignore_errors=True)
        raise BaseError('building the lab containers\' Debian base failed (mmdebstrap exit %d, mirror %s):\n%s'
                        % (res.returncode, MIRROR, tail))
    pkgs = subprocess.run(['chroot', os.path.join(tmp, 'root'), 'dpkg-query', '-W', '-f', '${Package} ${Version}\n'],
                          capture_output=True, text=True, check=True).stdout.split('\n')
    manifest = dict(recipe(), built=time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()),
                    build_secs=round(time.time() - t0, 1), packages=[p for p in pkgs if p])
    with open(os.path.join(tmp, 'manifest.json'), 'w') as f:
        json.dump(manifest, f, indent=1)
    shutil.rmtree(dest, ignore_errors=True)
    os.rename(tmp, dest)


def info():
    root = path()
    if not ready(root):
        return {'path': root, 'built': False}
    with open(os.path.join(os.path.dirname(root), 'manifest.json')) as f:
        m = json.load(f)
    du = subprocess.run(['du', '-sm', root], capture_output=True, text=True).stdout.split()
    return {'path': root, 'built': m['built'], 'build_secs': m['build_secs'], 'packages': len(m['packages']),
            'size_mb': int(du[0]) if du else None}


def main(argv=None):
    ap = argparse.ArgumentParser(prog='ctbase', description=__doc__.splitlines()[0])
    ap.add_argument('--info', action='store_true')
    args = ap.parse_args(argv)
    if not args.info:
        t0 = time.time()
        try:
            ensure(log=sys.stderr)
        except BaseError as e:
            sys.exit(str(e))
        print('ctbase: ready in %.1f s' % (time.time() - t0), file=sys.stderr)
    print(json.dumps(info()))


if __name__ == '__main__':
    main()
