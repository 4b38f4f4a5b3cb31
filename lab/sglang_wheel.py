"""The lab's simulated SGLang as a real wheel, for the lab's package index (lab/pyindex.py).

    python -m lab.sglang_wheel wheel [--version V]          build (or find cached) and print the wheel's path

The wheel is built from lab/fakesglang with pip (setuptools), named `sglang` at the requested version, and
cached under ~/.cache/gpuhost/lab-sglang by the hash of its sources. It is reproducible (SOURCE_DATE_EPOCH
fixed, files in a fixed order and mode), so its sha256 - the one the lab's lock pins - is the same wherever it
is built from the same sources with the same build tools (the project's .venv). The program installs it (resources/runtime.py) as it
installs the real one: from a package index, by a lock with hashes, into a virtualenv in the container.
"""

import argparse
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SOURCE = os.path.join(HERE, 'fakesglang')
CACHE = os.path.join(os.environ.get('GPUHOST_CACHE') or os.path.join(os.path.expanduser('~'), '.cache', 'gpuhost'),
                     'lab-sglang')
# Its argument table comes from SGLang's own parser (the release's wheel, tools/sglang_flags_gen.py
# --lab-table), never from the program's tables in components/: a wrong table there shows in the lab.
GENERATOR = os.path.join(REPO, 'tools', 'sglang_flags_gen.py')

# The wheel's files all carry this time (2026-01-01T00:00:00Z): the same sources make the same bytes.
SOURCE_DATE_EPOCH = '1767225600'


class WheelError(RuntimeError):
    pass


def _sources():
    files = sorted(glob.glob(os.path.join(SOURCE, '**', '*'), recursive=True))
    return [f for f in files if os.path.isfile(f) and '__pycache__' not in f] + [GENERATOR]


def wheel(version):
    """Path of the simulated SGLang's wheel at `version`, built once per source hash."""
    h = hashlib.sha256(('%s\0%s' % (version, SOURCE_DATE_EPOCH)).encode())
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
        # The bytes of a wheel are its files' contents, names, order, modes and times: fix what the machine
        # would otherwise vary (the checkout's umask, the clock).
        for root, dirs, names in os.walk(stage):
            for n in dirs:
                os.chmod(os.path.join(root, n), 0o755)
            for n in names:
                os.chmod(os.path.join(root, n), 0o644)
        out = os.path.join(tmp, 'out')
        res = subprocess.run([sys.executable, '-m', 'pip', 'wheel', '--quiet', '--no-deps', '--no-build-isolation',
                              '--no-index', '--disable-pip-version-check', '-w', out, stage],
                             capture_output=True, text=True, env=dict(os.environ, SOURCE_DATE_EPOCH=SOURCE_DATE_EPOCH))
        if res.returncode != 0:
            raise WheelError('building the lab\'s SGLang wheel failed:\n' + (res.stdout + res.stderr)[-2000:])
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
        raise WheelError('no pip wheel in %s' % os.path.dirname(ensurepip.__file__))
    return found[-1]


def main(argv=None):
    ap = argparse.ArgumentParser(prog='sglang_wheel', description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest='cmd', required=True)
    w = sub.add_parser('wheel')
    w.add_argument('--version', default='0.5.23')
    args = ap.parse_args(argv)
    try:
        print(wheel(args.version))
    except WheelError as e:
        sys.exit(str(e))


if __name__ == '__main__':
    main()
