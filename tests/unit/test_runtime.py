"""resources/runtime.py's pure parts: the environment's id and description, the facts parser (golden lines
as ct_unit_facts.sh prints them), the driver check."""

import base64
import json

import pytest

from resources import runtime
from tests.unit.config.test_config import parse

H = 'a' * 64
FILES = {'lock': 'pip==23.2.1 --hash=sha256:%s\nsglang==0.5.23 --hash=sha256:%s\n' % (H, H), 'lock_sha256': 'c' * 64,
         'packages': {'pip': '23.2.1', 'sglang': '0.5.23'}, 'patches': [], 'index_password': 'pw'}


def test_the_environment_is_named_by_its_content():
    d = parse()
    a = runtime.environment(d, FILES)
    assert a['path'] == '/opt/sglang/envs/' + a['id'] and len(a['id']) == 16
    assert runtime.environment(d, dict(FILES)) == a, 'the same content, the same environment'
    patched = dict(FILES, patches=[{'name': 'runtime/patches/sm120.patch', 'text': '--- a/x\n'}])
    assert runtime.environment(d, patched)['id'] != a['id']
    assert runtime.environment(d, dict(FILES, lock_sha256='d' * 64))['id'] != a['id']
    assert runtime.environment(parse(runtime__python__version='3.12'), FILES)['id'] != a['id']
    assert runtime.environment(parse(runtime=None), FILES) is None


def test_the_change_in_a_persons_words():
    old = {'packages': {'sglang': '0.5.23', 'torch': '2.12.0.dev20261101+cu130', 'numpy': '2.3.1', 'pip': '25.0'},
           'patches': [{'name': 'runtime/patches/old.patch', 'sha256': '1'}], 'python': '3.11', 'lock_sha256': 'x'}
    new = {'packages': {'sglang': '0.5.24', 'torch': '2.12.0.dev20261101+cu130', 'numpy': '2.3.1', 'pip': '25.0',
                        'triton': '3.5.0'},
           'patches': [{'name': 'runtime/patches/sm120-fp4.patch', 'sha256': '2'}], 'python': '3.11',
           'lock_sha256': 'y'}
    assert runtime.describe_change(old, new) == (
        'sglang 0.5.23 -> 0.5.24, +triton 3.5.0, torch 2.12.0.dev20261101+cu130 unchanged (+2 more unchanged), '
        'patches: +sm120-fp4.patch, -old.patch')
    same = dict(old, lock_sha256='z')
    assert runtime.describe_change(old, same).startswith('the same versions pinned to other files (hashes)')
    assert runtime.describe_change(None, new) == ('a new environment: sglang 0.5.24, torch 2.12.0.dev20261101+cu130 '
                                                  '(5 packages), patches: +sm120-fp4.patch')


UNIT = '[Service]\nExecStart=/opt/sglang/envs/0123456789abcdef/bin/python -m sglang.launch_server --port 30000\n'
MARKER = {'id': '0123456789abcdef', 'sglang': '0.5.23', 'lock_sha256': 'c' * 64}
FACTS = '\n'.join([
    'host_driver\t580.95.05', 'ct\trunning', 'unit\t' + 'b' * 64,
    'unit_text\t' + base64.b64encode(UNIT.encode()).decode(),
    'dropin\t/etc/systemd/system/sglang-qwen.service.d/override.conf',
    'ActiveState\tactive', 'InvocationID\tabc', 'UnitFileState\tenabled',
    'libcuda.so\t580.95.05', 'libnvidia-ml.so\t580.95.05', 'cuda\t13.0.2', 'nvcc\tyes',
    'envdir\t0123456789abcdef\t' + json.dumps(MARKER), 'envdir\t.building-fedcba9876543210-77\t-',
    'venv_link\t/opt/sglang/envs/0123456789abcdef', ''])


def test_facts_as_the_script_prints_them():
    f = runtime.parse_facts(FACTS)
    assert f['host_driver'] == f['container_driver'] == '580.95.05' and f['cuda'] == '13.0.2'
    assert f['unit_text'] == UNIT and f['dropins'] == ['/etc/systemd/system/sglang-qwen.service.d/override.conf']
    assert f['envdirs'] == {'0123456789abcdef': MARKER, '.building-fedcba9876543210-77': None}
    props = {'vmid': 200, 'runtime': {'nvidia': '580.95.05', 'cuda': '13.0.2'}, 'env': MARKER,
             'install': {'python': {'envs_dir': '/opt/sglang/envs'}}}
    seen = runtime.observed(props, f)
    assert seen['runtime'] == {'nvidia': '580.95.05', 'cuda': '13.0.2'} and seen['env'] == MARKER
    assert seen['runtime_facts']['env'] == '0123456789abcdef' and seen['runtime_facts']['sglang'] == '0.5.23'
    assert runtime.driver_danger(props, f, 'sglang-unit') is None


@pytest.mark.parametrize('libs,want', [
    (('', ''), None),
    (('580.95.05 580.105.08', '580.105.08'), 'mixed: libcuda 580.95.05 580.105.08, libnvidia-ml 580.105.08'),
])
def test_container_driver_when_not_one_version(libs, want):
    f = runtime.parse_facts('ct\trunning\nlibcuda.so\t%s\nlibnvidia-ml.so\t%s\n' % libs)
    assert f['container_driver'] == want


def test_a_host_driver_upgraded_under_the_container_is_danger_with_the_fix():
    f = runtime.parse_facts(FACTS.replace('host_driver\t580.95.05', 'host_driver\t580.105.08'))
    message = runtime.driver_danger({'vmid': 200, 'runtime': {'nvidia': '580.95.05'}}, f, 'sglang-unit')
    assert message.startswith('sglang-unit: DANGER - the host runs nvidia kernel module 580.105.08 but container 200 '
                              'has the NVIDIA user space 580.95.05')
    assert 'Driver/library version mismatch' in message
    assert 'set gpuhost:runtime.nvidia.version: 580.105.08' in message
    with pytest.raises(runtime.RuntimeStepError, match='Nothing was changed, nothing restarted'):
        runtime.check_host_driver({'runtime': {'nvidia': '580.95.05'}}, f)


# ------------------------------------------------------------------ ct_env_link.sh: the link and the pruning

PCT = '#!/bin/sh\n# pct exec VMID -- CMD...: the command run here (the "container" is this machine\'s files)\n' \
      '[ "$1" = exec ] && [ "$3" = -- ] || exit 2\nshift 3\nexec "$@"\n'


def env_dir(envs, name, ident=None, marker=True):
    """A directory as the builder leaves it: its marker (json.dumps(env, sort_keys=True), as ct_env_build.py
    writes it) names the environment's id and final path."""
    import os
    d = os.path.join(envs, name)
    os.makedirs(os.path.join(d, 'bin'))
    if marker:
        ident = ident or name
        with open(os.path.join(d, '.gpuhost-env.json'), 'w') as f:
            f.write(json.dumps({'id': ident, 'path': os.path.join(envs, ident), 'sglang': '0.5.23'},
                               sort_keys=True) + '\n')
    return d


def test_pruning_removes_only_the_programs_own_environments(tmp_path):
    """envs_dir may hold what is not the program's - a directory named like an id without the marker, one
    whose marker names another place, a link, another tool's half-made directory: all kept; the program's
    old environments and its interrupted builds (their marker written before the packages) go."""
    import os
    import subprocess
    from transport import remote
    bin_ = tmp_path / 'bin'
    bin_.mkdir()
    (bin_ / 'pct').write_text(PCT)
    (bin_ / 'pct').chmod(0o755)
    envs = str(tmp_path / 'envs')
    cur, prev, old = '%016x' % 1, '%016x' % 2, '%016x' % 3
    for name in (cur, prev, old):
        env_dir(envs, name)
    env_dir(envs, '.building-%016x-41' % 4, ident='%016x' % 4)
    foreign = [env_dir(envs, '%016x' % 5, marker=False), env_dir(envs, '.building-by-someone-else', marker=False),
               env_dir(envs, '%016x' % 6)]
    # ... its marker copied from another envs_dir (a restored backup): not an environment of this directory.
    with open(os.path.join(foreign[2], '.gpuhost-env.json'), 'w') as f:
        f.write(json.dumps({'id': '%016x' % 6, 'path': '/elsewhere/%016x' % 6}, sort_keys=True) + '\n')
    target = str(tmp_path / 'data')
    env_dir(target, 'x')
    os.symlink(os.path.join(target, 'x'), os.path.join(envs, '%016x' % 7))
    venv = str(tmp_path / 'venv')
    with open(os.path.join(remote.SCRIPTS, 'ct_env_link.sh')) as f:
        script = f.read()
    res = subprocess.run(['bash', '-c', script, 'ct_env_link.sh', '200', venv, os.path.join(envs, cur), envs, cur, prev],
                         env=dict(os.environ, PATH='%s:%s' % (bin_, os.environ['PATH'])), capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stderr
    assert os.readlink(venv) == os.path.join(envs, cur)
    assert sorted(os.listdir(envs)) == sorted([cur, prev, '%016x' % 5, '%016x' % 6, '%016x' % 7,
                                               '.building-by-someone-else'])
    assert os.path.isdir(os.path.join(target, 'x', 'bin')), 'a link is removed at most, never followed'
    assert sorted(res.stdout.splitlines()) == ['removed\t%s/.building-%016x-41' % (envs, 4),
                                               'removed\t%s/%s' % (envs, old)]


# ------------------------------------------- a CUDA reinstall: the toolkit before it kept, put back or dropped

def _toolkit(home, version, marker=False):
    import os
    os.makedirs(os.path.join(home, 'bin'), exist_ok=True)
    with open(os.path.join(home, 'version.json'), 'w') as f:
        f.write('{\n   "cuda" : {\n      "name" : "CUDA SDK",\n      "version" : "%s"\n   }\n}\n' % version)
    if marker:
        with open(os.path.join(home, '.gpuhost-installed'), 'w') as f:
            f.write(version + '\n')


def _version(home):
    import os
    with open(os.path.join(home, 'version.json')) as f:
        return json.load(f)['cuda']['version']


def test_a_cuda_reinstall_keeps_the_toolkit_before_it_and_puts_it_back_or_drops_it(tmp_path):
    """The installer job (runtime.RUN_INSTALLER) moves the complete toolkit at cuda_home aside before the
    installer writes there; ct_cuda_previous.sh puts it back (SGLang did not serve on the new one) or drops it
    (it did). An install cut off halfway (no marker) is never moved over the kept one."""
    import hashlib
    import os
    import subprocess
    from transport import remote
    bin_ = tmp_path / 'bin'
    bin_.mkdir()
    (bin_ / 'pct').write_text(PCT)
    (bin_ / 'pct').chmod(0o755)
    env = dict(os.environ, PATH='%s:%s' % (bin_, os.environ['PATH']))
    home = str(tmp_path / 'cuda')
    with open(os.path.join(remote.SCRIPTS, 'ct_cuda_previous.sh')) as f:
        previous = f.read()

    def install(version, fail=False):
        inst = tmp_path / 'installer.run'
        inst.write_text('set -e\n%smkdir -p "%s/bin"\nprintf \'{"cuda": {"version": "%s"}}\\n\' > "%s/version.json"\n' % (
            'mkdir -p "%s/bin"; echo half > "%s/bin/nvcc"; exit 1\n' % (home, home) if fail else '', home, version,
            home))
        sha = hashlib.sha256(inst.read_bytes()).hexdigest()
        return subprocess.run(['bash', '-c', runtime.RUN_INSTALLER, 'job', str(inst), sha, home, version], env=env,
                              capture_output=True, text=True)

    def prev(what):
        res = subprocess.run(['bash', '-c', previous, 'ct_cuda_previous.sh', '200', home, what], env=env,
                             capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
        return res.stdout.strip()

    # A toolkit installed by hand before the program managed it: kept aside, then put back.
    _toolkit(home, '13.0.1')
    assert install('12.9.1').returncode == 0
    assert _version(home) == '12.9.1' and _version(home + '.gpuhost-previous') == '13.0.1'
    assert prev('restore') == 'restored\t13.0.1'
    assert _version(home) == '13.0.1' and not os.path.exists(home + '.gpuhost-previous')
    assert not os.path.exists(home + '.gpuhost-failed')
    # Served on: the kept one is dropped.
    assert install('13.0.2').returncode == 0 and prev('drop') == 'dropped'
    assert sorted(os.listdir(tmp_path)) == ['bin', 'cuda'] and _version(home) == '13.0.2'
    # An install cut off halfway, then run again: the kept one is the one that served, not the half-written one.
    assert install('13.1.0', fail=True).returncode != 0
    assert _version(home + '.gpuhost-previous') == '13.0.2'
    assert install('13.1.0', fail=True).returncode != 0
    assert _version(home + '.gpuhost-previous') == '13.0.2'
    assert prev('restore') == 'restored\t13.0.2' and _version(home) == '13.0.2'
    # Nothing kept: nothing to do.
    assert prev('restore') == 'none' and prev('drop') == 'none'


def test_a_build_whose_following_detached_keeps_its_wheelhouse_and_one_that_ended_removes_it(monkeypatch):
    """The wheelhouse copied into the container is what the running build installs from: a run that lost the
    build (the connection stayed down, or Ctrl-C) leaves it for the build; the run that sees the build end removes
    it."""
    from transport import jobs, remote
    from resources import runtime
    calls = []
    monkeypatch.setattr(runtime, 'build_jobs', lambda props, password, replace=False: ('stage', 'build'))
    monkeypatch.setattr(jobs, 'poll', lambda target, job: jobs.parse_poll('state\tinactive\nsub\tdead\n'))
    monkeypatch.setattr(remote, 'run', lambda target, name, args=(), **kw: calls.append(name))
    props = {'env': {'id': 'e1', 'path': '/opt/sglang/envs/e1'}, 'install': {'python': {}}, 'vmid': 200}

    def detached(target, job, *a, **kw):
        if job == 'build':
            raise jobs.JobDetached('lost the connection while following job gpuhost-envbuild')
    monkeypatch.setattr(jobs, 'run', detached)
    with pytest.raises(jobs.JobDetached):
        runtime.build_env(None, props, {})
    assert calls == []
    monkeypatch.setattr(jobs, 'run', lambda target, job, *a, **kw: None)
    assert runtime.build_env(None, props, {}) is True
    assert calls == ['ct_remove_path.sh']
