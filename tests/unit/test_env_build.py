"""The environment builder (hostscripts/ct_env_build.py, run in the container by its python3), run here
with the machine's Debian python3 against a wheelhouse of the lab's wheels: what it leaves - an environment
under its final name only when whole - and how each failure ends (exit code, one line, nothing left)."""

import hashlib
import json
import os
import subprocess

import pytest

from resources import runtime
from lab import pyindex, sglang_wheel

PYTHON = '/usr/bin/python3'
pytestmark = pytest.mark.skipif(not os.path.exists(PYTHON), reason='needs Debian\'s python3')


def minor():
    out = subprocess.run([PYTHON, '-c', 'import sys; print("%d.%d" % sys.version_info[:2])'], capture_output=True,
                         text=True, check=True).stdout
    return out.strip()


@pytest.fixture(scope='module')
def wheelhouse(tmp_path_factory):
    d = str(tmp_path_factory.mktemp('wheelhouse'))
    pyindex.add(d, sglang_wheel.wheel('0.5.23'))
    pyindex.add(d, sglang_wheel.pip_wheel())
    return d


def lock(wheelhouse, sglang='0.5.23'):
    pip = os.path.basename(sglang_wheel.pip_wheel()).split('-')[1]
    from grammar import pylock
    return pylock.parse(pyindex.lock_text(wheelhouse, {'sglang': sglang, 'pip': pip})).canonical()


PATCH = ('--- a/sglang/__init__.py\n+++ b/sglang/__init__.py\n@@ -1,2 +1,3 @@\n'
         ' """A stand-in for the sglang package inside lab containers (see launch_server.py)."""\n'
         '+PATCHED = "sm120"\n import os\n')


def job_for(tmp_path, lock_text, patches=(), sglang='0.5.23', python=None):
    envs = tmp_path / 'envs'
    final = str(envs / ('%016x' % 1))
    return {'path': final, 'marker': {'id': 'x', 'sglang': sglang}, 'lock': lock_text,
            'patches': [{'name': n, 'text': t} for n, t in patches], 'python': python or minor(), 'sglang': sglang,
            'index': None}, final, envs


def build(tmp_path, wheelhouse, lock_text, patches=(), sglang='0.5.23', python=None):
    job, final, envs = job_for(tmp_path, lock_text, patches, sglang, python)
    res = subprocess.run([PYTHON, '-c', runtime.builder_source(), wheelhouse], input=json.dumps(job), text=True,
                         capture_output=True, timeout=300)
    return res, final, envs


def test_builds_under_the_final_name_only_when_whole(tmp_path, wheelhouse):
    res, final, envs = build(tmp_path, wheelhouse, lock(wheelhouse), patches=[('p/sm120.patch', PATCH)])
    assert res.returncode == 0, res.stderr
    assert os.listdir(str(envs)) == [os.path.basename(final)], 'no temporary directory left'
    with open(os.path.join(final, '.gpuhost-env.json')) as f:
        assert json.load(f) == {'id': 'x', 'sglang': '0.5.23'}
    out = subprocess.run([final + '/bin/python', '-c', 'import sglang; print(sglang.__version__, sglang.PATCHED)'],
                         capture_output=True, text=True)
    assert out.stdout.split() == ['0.5.23', 'sm120'], out.stderr
    # pip (pinned by the lock) is in it and its scripts name the final path, not the temporary one.
    pip = open(os.path.join(final, 'bin', 'pip')).readline()
    assert pip == '#!%s/bin/python\n' % final
    assert '.building-' not in open(os.path.join(final, 'pyvenv.cfg')).read()
    # Run again: the environment is there, nothing is built.
    mtime = os.stat(final).st_mtime_ns
    res, _, _ = build(tmp_path, wheelhouse, lock(wheelhouse))
    assert res.returncode == 0 and json.loads(res.stdout) == {'ready': final}
    assert os.stat(final).st_mtime_ns == mtime
    # A directory of that name that is not what the program built there is never touched.
    os.unlink(os.path.join(final, '.gpuhost-env.json'))
    res, _, _ = build(tmp_path, wheelhouse, lock(wheelhouse))
    assert res.returncode == 10 and 'is not the environment the program builds there' in res.stderr


@pytest.mark.parametrize('case,code,words', [
    ('hash', 4, ['sglang==0.5.23', 'sha256', 'the lock pins']),
    ('patch', 6, ['p/bad.patch', 'hunk 1', 'does not apply']),
    ('version', 7, ['reports 0.5.23, not 0.5.22']),
    ('python', 8, ['the lock is for 3.99']),
    ('missing', 5, ['the wheelhouse has no file for torch==2.12.0']),
])
def test_each_failure_leaves_nothing(tmp_path, wheelhouse, case, code, words):
    text = lock(wheelhouse)
    patches, sglang, python = (), '0.5.23', None
    if case == 'hash':
        real = hashlib.sha256(open(sglang_wheel.wheel('0.5.23'), 'rb').read()).hexdigest()
        text = text.replace(real, 'f' * 64)
    elif case == 'patch':
        patches = [('p/bad.patch', PATCH.replace('A stand-in', 'Not the text'))]
    elif case == 'version':
        sglang = '0.5.22'
    elif case == 'python':
        python = '3.99'
    elif case == 'missing':
        text += 'torch==2.12.0 --hash=sha256:%s\n' % ('e' * 64)
    res, final, envs = build(tmp_path, wheelhouse, text, patches=patches, sglang=sglang, python=python)
    assert res.returncode == code, res.stderr
    line = res.stderr.strip().splitlines()[-1]
    assert line.startswith('gpuhost-build: ')
    for w in words:
        assert w in line, line
    assert not os.path.exists(final)
    assert not os.path.isdir(str(envs)) or os.listdir(str(envs)) == [], 'a half-built environment was left'


def test_a_build_cut_short_leaves_a_directory_with_the_programs_marker(tmp_path, wheelhouse):
    """Pruning (ct_env_link.sh) removes only directories that carry the marker: a build killed where its own
    cleanup cannot run (kill -9, the container stopped) must leave one that carries it - written as soon as
    the virtualenv exists, before pip has installed anything."""
    import glob
    import signal
    import time
    job, final, envs = job_for(tmp_path, lock(wheelhouse))
    proc = subprocess.Popen([PYTHON, '-c', runtime.builder_source(), wheelhouse], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    proc.stdin.write(json.dumps(job))
    proc.stdin.close()
    def installing():
        """pip's install (of the lock, into the new virtualenv) is running in the build's session."""
        for pid in filter(str.isdigit, os.listdir('/proc')):
            try:
                with open('/proc/%s/cmdline' % pid, 'rb') as f:
                    argv = f.read().split(b'\0')
                if b'--require-hashes' in argv and os.getsid(int(pid)) == proc.pid:
                    return True
            except OSError:
                continue
        return False

    killed = None
    try:
        while proc.poll() is None and killed is None:
            if installing():
                os.killpg(proc.pid, signal.SIGKILL)   # the builder and pip at once
                killed = glob.glob(str(envs / '.building-*'))
            time.sleep(0.005)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert killed, 'the build ended before it could be cut short (returncode %s)' % proc.returncode
    assert len(killed) == 1 and not os.path.exists(final), killed
    assert os.path.exists(os.path.join(killed[0], 'bin', 'python'))
    marker = os.path.join(killed[0], '.gpuhost-env.json')
    assert os.path.exists(marker), 'the half-built %s carries no marker: pruning would never remove it' % killed[0]
    with open(marker) as f:
        assert json.load(f) == job['marker']
