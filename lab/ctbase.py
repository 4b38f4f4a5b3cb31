"""The lab's Debian 12 roots, each built once: the containers' (like Proxmox's `debian-12-standard` template)
and the simulated Proxmox host's.

    python -m lab.ctbase [--kind ct|host]            build it unless cached; prints its path
    python -m lab.ctbase [--kind ct|host] --info     path, size and package count of the cached base

Built with Debian's `mmdebstrap` from Debian's packages into ~/.cache/gpuhost/<kind>-base/<recipe hash>/root
and never written again: every lab container (lab/container.py) and every lab host (lab/labhost.py) is an
overlay of it, so one is made in milliseconds and destroyed without trace. Nothing of this project is in
either - no SGLang, no virtualenv, no NVIDIA library: what the service needs, the program installs
(gpuhost:runtime); what makes a root the lab's host, the lab adds at each boot (lab/labhost.py).

`ct`: Debian's `important` packages (systemd as init, apt, cron, iproute2, procps, ...) plus the
`standard`-priority tools Proxmox's template carries (python3, curl, wget, ca-certificates, less, locales,
...). Left out on purpose: the template's network daemons (openssh-server, postfix) - the lab's containers
share the machine's network namespace (their addresses are loopback addresses), where a second sshd on
port 22 would touch the machine itself.

`host`: what a Proxmox VE host has that the program's scripts and the operator use there - Debian's
`important` packages (systemd 252 as PID 1, util-linux, coreutils, procps, kmod, ...), OpenSSH's server,
python3 (the collector, the model's verification), dbus, curl, pciutils. No Proxmox package: the
Proxmox-only tools are the lab's (lab/faketools.py). The host's own SSH server listens where the lab says,
never on port 22 of the machine: its ssh.service is pointed at the lab's sshd_config at every boot, and the
host keys the package's installation made are removed (each lab host has its own, pinned by its stack).
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
HOST_INCLUDE = ('python3', 'openssh-server', 'openssh-client', 'dbus', 'procps', 'util-linux', 'coreutils', 'kmod',
                'iproute2', 'curl', 'ca-certificates', 'less', 'file', 'xz-utils', 'zstd', 'pciutils')
# What pct create leaves for the container to fill in at its first start (and the lab for its host): no
# hostname of the machine that built it, an empty machine-id (a new one per container, lab/container.py).
HOOKS = ('echo localhost > "$1/etc/hostname"', ': > "$1/etc/machine-id"')
HOST_HOOKS = HOOKS + ('rm -f "$1"/etc/ssh/ssh_host_*',)
KINDS = {'ct': {'include': INCLUDE, 'hooks': HOOKS, 'what': "the lab containers' Debian base"},
         'host': {'include': HOST_INCLUDE, 'hooks': HOST_HOOKS, 'what': "the lab host's Debian base"}}
MIRROR = os.environ.get('GPUHOST_DEBIAN_MIRROR', 'http://deb.debian.org/debian')
ROOT = os.environ.get('GPUHOST_CACHE') or os.path.join(os.path.expanduser('~'), '.cache', 'gpuhost')
# Bumped when the way the base is made changes without the package list changing.
RECIPE_VERSION = 1


class BaseError(RuntimeError):
    pass


def recipe(kind='ct'):
    r = {'suite': SUITE, 'variant': VARIANT, 'include': sorted(KINDS[kind]['include']), 'version': RECIPE_VERSION}
    if kind != 'ct':
        # (the containers' recipe as it always was: its cached base keeps its key)
        r.update(kind=kind, hooks=list(KINDS[kind]['hooks']))
    return r


def key(kind='ct'):
    return hashlib.sha256(json.dumps(recipe(kind), sort_keys=True).encode()).hexdigest()[:16]


def cache(kind='ct'):
    return os.path.join(ROOT, '%s-base' % kind)


def path(kind='ct'):
    """Where the base's root lives once built (it may not exist yet)."""
    return os.path.join(cache(kind), key(kind), 'root')


def ready(root=None):
    root = root or path()
    return os.path.exists(os.path.join(os.path.dirname(root), 'manifest.json'))


def ensure(log=None, kind='ct'):
    """The base's root directory, built first if the cache lacks it. Several labs may start at once
    (parallel test modules): one builds under a lock, the others wait for it."""
    root = path(kind)
    if ready(root):
        return root
    os.makedirs(cache(kind), exist_ok=True)
    with open(os.path.join(cache(kind), 'build.lock'), 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready(root):
            return root
        build(os.path.dirname(root), log=log, kind=kind)
    return root


def build(dest, log=None, kind='ct'):
    """mmdebstrap into a temporary directory beside dest, then rename: a cache entry is whole or absent."""
    if not shutil.which('mmdebstrap'):
        raise BaseError('mmdebstrap is missing: the lab builds %s with it (apt-get install mmdebstrap '
                        'systemd-container; tools/run.sh does this)' % KINDS[kind]['what'])
    tmp = '%s.tmp-%d' % (dest, os.getpid())
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    t0 = time.time()
    argv = (['mmdebstrap', '--mode=root', '--variant=' + VARIANT, '--include=' + ','.join(KINDS[kind]['include'])] +
            ['--customize-hook=' + hook for hook in KINDS[kind]['hooks']] + [SUITE, os.path.join(tmp, 'root'), MIRROR])
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
        raise BaseError('building %s failed (mmdebstrap exit %d, mirror %s):\n%s'
                        % (KINDS[kind]['what'], res.returncode, MIRROR, tail))
    pkgs = subprocess.run(['chroot', os.path.join(tmp, 'root'), 'dpkg-query', '-W', '-f', '${Package} ${Version}\n'],
                          capture_output=True, text=True, check=True).stdout.split('\n')
    manifest = dict(recipe(kind), built=time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()),
                    build_secs=round(time.time() - t0, 1), packages=[p for p in pkgs if p])
    with open(os.path.join(tmp, 'manifest.json'), 'w') as f:
        json.dump(manifest, f, indent=1)
    shutil.rmtree(dest, ignore_errors=True)
    os.rename(tmp, dest)


def info(kind='ct'):
    root = path(kind)
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
    ap.add_argument('--kind', choices=sorted(KINDS), default='ct')
    args = ap.parse_args(argv)
    if not args.info:
        t0 = time.time()
        try:
            ensure(log=sys.stderr, kind=args.kind)
        except BaseError as e:
            sys.exit(str(e))
        print('ctbase: %s ready in %.1f s' % (args.kind, time.time() - t0), file=sys.stderr)
    print(json.dumps(info(args.kind)))


if __name__ == '__main__':
    main()
