"""The lab's simulated SGLang as a real wheel, and the operator's hand step that installs it in a container.

    python -m lab.sglang_install wheel [--version V]          build (or find cached) and print the wheel's path
    python -m lab.sglang_install install [--lab DIR] [--vmid N] [--venv PATH]

The program does not install SGLang yet (README, "The first `up` on a bare host"): on a real host the
operator puts it into the container by hand between the first `up` (which creates the container and
stops with "no SGLang at /opt/sglang/venv") and the next. `install` is that hand step on the lab, done
the way an operator does it, through the host: the wheel (and pip's own wheel: a fresh
debian-12-standard container has python3 but neither pip nor python3-venv) copied to the host, `pct
push`ed into the container, a virtualenv made with the container's python3, pip installing the wheel
into it. tools/run.sh (`make up`) and the tests (tests/lablib.py) run it when that first `up` stops.

The wheel is built from lab/fakesglang with pip (setuptools), named `sglang` at the lab spec's
version, and cached under ~/.cache/gpuhost/lab-sglang by the hash of its sources.
"""

import argparse
import glob
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SOURCE = os.path.join(HERE, 'fakesglang')
CACHE = os.path.join(os.environ.get('GPUHOST_CACHE') or os.path.join(os.path.expanduser('~'), '.cache', 'gpuhost'),
                     'lab-sglang')
DEFAULT_VENV = '/opt/sglang/venv'
# Its argument table comes from SGLang's own parser (the release's wheel, tools/sglang_flags_gen.py
# --lab-table), never from the program's tables in components/: a wrong table there shows in the lab.
GENERATOR = os.path.join(REPO, 'tools', 'sglang_flags_gen.py')


# The program's refusal when a container lacks SGLang (components/sglang.py).
REFUSAL = re.compile(r'container (\d+): no SGLang at (/\S+) \(expected ([^)\s]+)\)')


class InstallError(RuntimeError):
    pass


def _sources():
    files = sorted(glob.glob(os.path.join(SOURCE, '**', '*'), recursive=True))
    return [f for f in files if os.path.isfile(f) and '__pycache__' not in f] + [GENERATOR]


def wheel(version):
    """Path of the simulated SGLang's wheel at `version`, built once per source hash."""
    h = hashlib.sha256(version.encode())
    for f in _sources():
        h.update(os.path.relpath(f, REPO).encode() + b'\0')
        with open(f, 'rb') as fh:
            h.update(fh.read())
    dest = os.path.join(CACHE, '%s-%s' % (version, h.hexdigest()[:16]))
    found = glob.glob(os.path.join(dest, 'sglang-*.whl'))
    if found:
        return found[0]
    os.makedirs(CACHE, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix='build-', dir=CACHE)
    try:
        stage = os.path.join(tmp, 'src')
        shutil.copytree(SOURCE, stage, ignore=shutil.ignore_patterns('__pycache__', '*.pyc'))
        pkg = os.path.join(stage, 'sglang')
        with open(os.path.join(pkg, 'VERSION'), 'w') as f:
            f.write(version + '\n')
        sys.path.insert(0, REPO)
        from tools import sglang_flags_gen
        sglang_flags_gen.lab_table(version, os.path.join(pkg, 'lab_server_args.json'))
        out = os.path.join(tmp, 'out')
        res = subprocess.run([sys.executable, '-m', 'pip', 'wheel', '--quiet', '--no-deps', '--no-build-isolation',
                              '--no-index', '--disable-pip-version-check', '-w', out, stage],
                             capture_output=True, text=True)
        if res.returncode != 0:
            raise InstallError('building the lab\'s SGLang wheel failed:\n' + (res.stdout + res.stderr)[-2000:])
        built = glob.glob(os.path.join(out, 'sglang-*.whl'))
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        try:
            os.rename(out, dest)
        except OSError:  # another lab built the same one meanwhile
            pass
        return os.path.join(dest, os.path.basename(built[0]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def pip_wheel():
    """pip's own wheel, as Python ships it (ensurepip's bundle): runnable as `python pip.whl/pip ...`."""
    import ensurepip
    found = sorted(glob.glob(os.path.join(os.path.dirname(ensurepip.__file__), '_bundled', 'pip-*.whl')))
    if not found:
        raise InstallError('no pip wheel in %s' % os.path.dirname(ensurepip.__file__))
    return found[-1]


# The hand step, as one script run on the host over SSH (bash -c '<script>' name args).
SCRIPT = r'''set -euo pipefail
vmid=$1 venv=$2 whl=$3 pip=$4
pct push "$vmid" "/root/$whl" "/root/$whl"
pct push "$vmid" "/root/$pip" "/root/$pip"
pct exec "$vmid" -- mkdir -p "$(dirname "$venv")"
pct exec "$vmid" -- python3 -m venv --without-pip "$venv"
pct exec "$vmid" -- "$venv/bin/python" "/root/$pip/pip" install --quiet --no-index --no-deps \
  --disable-pip-version-check --no-warn-script-location "/root/$whl"
pct exec "$vmid" -- rm -f "/root/$whl" "/root/$pip"
rm -f "/root/$whl" "/root/$pip"
pct exec "$vmid" -- "$venv/bin/python" -c 'import sglang; print(sglang.__version__)'
'''


def ssh_run(info, command, timeout=300):
    """(exit code, stdout, stderr) of a command on the lab host over its SSH (pinned host key)."""
    import base64
    import paramiko
    s = info['ssh']
    keytype, b64 = s['host_key'].split()[:2]
    client = paramiko.SSHClient()
    client.get_host_keys().add('[%s]:%d' % (s['host'], s['port']), keytype,
                               paramiko.PKey.from_type_string(keytype, base64.b64decode(b64)))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(s['host'], port=s['port'], username=s['user'], key_filename=s['key_file'],
                   look_for_keys=False, allow_agent=False, timeout=10)
    try:
        _, out, err = client.exec_command(command, timeout=timeout)
        code = out.channel.recv_exit_status()
        return code, out.read().decode(), err.read().decode()
    finally:
        client.close()


def install(lab, vmid=200, venv=DEFAULT_VENV, version=None):
    """Install the simulated SGLang into container vmid of the lab in directory `lab`, by hand as an
    operator would (see the module's doc). Returns the version the venv's sglang reports."""
    with open(os.path.join(lab, 'lab.json')) as f:
        info = json.load(f)
    version = version or info['sglang_version']
    whl, pip = wheel(version), pip_wheel()
    # Copied onto the host: the simulated host's /root is this directory (lab/ns-sshd.sh).
    home = os.path.join(lab, 'host', 'root')
    for src in (whl, pip):
        shutil.copyfile(src, os.path.join(home, os.path.basename(src)))
    command = 'bash -c %s sglang-install %s' % (shlex.quote(SCRIPT), shlex.join(
        [str(vmid), venv, os.path.basename(whl), os.path.basename(pip)]))
    code, out, err = ssh_run(info, command)
    if code != 0:
        raise InstallError('installing SGLang %s into container %s failed (exit %s): %s' % (
            version, vmid, code, (err or out).strip()[-1500:]))
    return out.strip().splitlines()[-1]


def install_where_missing(labs, output):
    """The step after an `up` that stopped with the program's "no SGLang at <venv>" refusal(s): install into
    every running container the refusals name, in any of the labs (directories), that lacks it.
    Returns [(lab, vmid, venv, version)] installed."""
    sys.path.insert(0, HERE)
    import container
    done = []
    for vmid, venv, version in sorted(set(REFUSAL.findall(output))):
        for lab in labs:
            ct = container.Container(os.path.join(lab, 'ct', vmid))
            if ct.leader() and not os.path.exists(os.path.join(ct.rootfs, venv.lstrip('/'), 'bin', 'python')):
                install(lab, int(vmid), venv, version)
                done.append((lab, int(vmid), venv, version))
    return done


def main(argv=None):
    ap = argparse.ArgumentParser(prog='sglang_install', description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest='cmd', required=True)
    w = sub.add_parser('wheel')
    w.add_argument('--version', default='0.5.23')
    i = sub.add_parser('install')
    i.add_argument('--lab', default=os.environ.get('GPUHOST_LAB', os.path.join(REPO, '.lab')))
    i.add_argument('--vmid', type=int, default=200)
    i.add_argument('--venv', default=DEFAULT_VENV)
    m = sub.add_parser('install-missing', help='after an `up` that stopped with "no SGLang at ...": install '
                       'where its output (a file) says, in the lab and the fleet lab')
    m.add_argument('--from', dest='output', required=True)
    args = ap.parse_args(argv)
    try:
        if args.cmd == 'wheel':
            print(wheel(args.version))
        elif args.cmd == 'install-missing':
            with open(args.output, errors='replace') as f:
                text = f.read()
            labs = [os.path.join(REPO, '.lab')] + sorted(glob.glob(os.path.join(REPO, '.lab-fleet', '*')))
            done = install_where_missing([d for d in labs if os.path.exists(os.path.join(d, 'lab.json'))], text)
            for lab, vmid, venv, version in done:
                print('sglang_install: SGLang %s installed into container %d of %s (%s)' % (
                    version, vmid, os.path.relpath(lab, REPO), venv))
            if not done:
                sys.exit('sglang_install: no container named by the output lacks SGLang')
        else:
            print('sglang_install: SGLang %s installed into container %d (%s)' % (
                install(os.path.abspath(args.lab), args.vmid, args.venv), args.vmid, args.venv))
    except InstallError as e:
        sys.exit(str(e))


if __name__ == '__main__':
    main()
