"""What SGLang stands on in the container, as the program's declared state (gpuhost:runtime), with the real CLI,
real pip and a real container: from a bare container to a serving one without a hand step; a new version
built beside the running environment, one restart, the old one kept; a new environment that fails its check
rolled back; a lock hash mismatch, an index that does not answer and a patch that does not apply each leaving
the running environment and unit byte for byte as they were; the host's driver upgraded out of band: DANGER
at refresh, `up` stopped before any restart, and the fix. The tests run in order on one lab and one stack."""

import hashlib
import json
import os
import time
import urllib.request

import pytest

from tests.lablib import tree_digest

STACK = 'runtime'
OLD, NEW = '0.5.19', '0.5.23'   # lab SGLang versions whose real parser is cached (their lab tables)
UNIT = 'etc/systemd/system/sglang-qwen.service'
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOOD_PATCH = ('--- a/sglang/__init__.py\n+++ b/sglang/__init__.py\n@@ -1,2 +1,3 @@\n'
              ' """A stand-in for the sglang package inside lab containers (see launch_server.py)."""\n'
              '+SM120_FP4 = True\n import os\n')


def crashing_patch():
    """A patch that applies and breaks SGLang's start as a kernel built for the wrong GPU does."""
    with open(os.path.join(REPO, 'lab', 'fakesglang', 'sglang', 'launch_server.py')) as f:
        n = f.read().splitlines().index('def main(argv=None):') + 1
    return ('--- a/sglang/launch_server.py\n+++ b/sglang/launch_server.py\n@@ -%d,2 +%d,3 @@\n def main(argv=None):\n'
            "+    sys.exit('RuntimeError: CUDA error: no kernel image is available for execution on the device')\n"
            '     table = load_table(__version__)\n' % (n, n))


@pytest.fixture(scope='module')
def base(lab):
    lab.add_sglang(OLD)
    cfg = lab.stack_config()
    return configure(lab, cfg, OLD, [])


def configure(lab, cfg, version, patches, lock=None):
    """cfg declaring SGLang `version` from a lock of the lab's index (or `lock`: its text), with patches
    [(name, text)] written into the project."""
    rel = 'runtime/sglang-%s-%s.lock' % (version, hashlib.sha256((lock or '').encode()).hexdigest()[:8])
    lab.write_lock(rel, version, text=lock)
    names = []
    for name, text in patches:
        path = os.path.join(lab.project, 'runtime', 'patches', name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, 'w') as f:
            f.write(text)
        names.append('runtime/patches/' + name)
    cfg = json.loads(json.dumps(cfg))
    cfg['gpuhost:sglang']['version'] = version
    cfg['gpuhost:runtime']['python']['lock'] = rel
    cfg['gpuhost:runtime']['python']['patches'] = names
    lab.write_stack(STACK, cfg)
    return cfg


def health(lab):
    with urllib.request.urlopen('http://%s:30000/health' % lab.spec['addresses']['container'], timeout=5) as r:
        return r.status


def health_or_none(lab):
    try:
        return health(lab)
    except OSError:
        return None


def server_version(lab):
    with urllib.request.urlopen('http://%s:30000/server_info' % lab.spec['addresses']['container'], timeout=5) as r:
        return json.loads(r.read())['version']


def tree(path):
    """Every file, link and directory under path, with content: what "untouched" means for environments."""
    return tree_digest(path)


def service_state(lab):
    root = lab.ct_root()
    with open(os.path.join(root, UNIT), 'rb') as f:
        unit = f.read()
    return {'unit': unit, 'envs': tree(os.path.join(root, 'opt', 'sglang')),
            'link': os.readlink(os.path.join(root, 'opt', 'sglang', 'venv')), 'starts': lab.unit_starts()}


def envs(lab):
    return sorted(os.listdir(os.path.join(lab.ct_root(), 'opt', 'sglang', 'envs')))


def test_make_lock_resolves_the_stacks_lock_from_its_index_logged_in_and_never_sends_the_login_elsewhere(lab):
    """`make lock` (tools/lock.py): runtime/sglang.in -> runtime/sglang.lock by uv from the stack's index with the
    stack's login, for the container's Python and glibc; the same pins and hashes as the lab's own lock. The index
    keeps its files on a CDN (a redirect): uv fetches them there without the login. A request the index cannot
    satisfy leaves the lock byte for byte."""
    import subprocess
    from grammar import pylock
    cfg = json.loads(json.dumps(lab.stack_config()))
    cfg['gpuhost:runtime']['python']['lock'] = 'runtime/sglang.lock'
    lab.write_stack('lock', cfg)
    src = os.path.join(lab.project, 'runtime', 'sglang.in')
    os.makedirs(os.path.dirname(src), exist_ok=True)
    with open(src, 'w') as f:
        f.write('sglang==%s\npip\n' % NEW)
    with open(lab.info['index']['password_file']) as f:
        password = f.read().strip()

    def make_lock():
        return subprocess.run(['python', '-m', 'tools.lock', 'lock', '--project', lab.project], cwd=REPO,
                              capture_output=True, text=True, timeout=120)
    lab.index_files('redirect')
    try:
        seen = len(lab.index_requests()), len(lab.cdn_requests())
        res = make_lock()
    finally:
        lab.index_files('index')
    assert res.returncode == 0, res.stderr
    assert 'runtime/sglang.lock: 2 packages for Python 3.11 on glibc 2.36' in res.stdout, res.stdout
    with open(os.path.join(lab.project, 'runtime', 'sglang.lock')) as f:
        made = f.read()
    want = pylock.parse(lab.write_lock('runtime/expected.lock', NEW) and
                        open(os.path.join(lab.project, 'runtime', 'expected.lock')).read())
    assert pylock.parse(made).canonical() == want.canonical()
    asked = lab.index_requests()[seen[0]:]
    # Logged in (uv, like pip, sends the login after a 401): the project pages answered; the files came from the
    # CDN the index redirected to, which never saw the login.
    assert {'/simple/sglang/', '/simple/pip/'} <= {r['path'] for r in asked if r['status'] == 200}, asked
    fetched = lab.cdn_requests()[seen[1]:]
    assert fetched and not any(r['authorization'] for r in fetched), fetched
    assert password not in res.stdout + res.stderr + made

    with open(src, 'w') as f:
        f.write('sglang==9.9.9\npip\n')
    res = make_lock()
    assert res.returncode == 1 and 'uv could not resolve runtime/sglang.in for Python 3.11 on glibc 2.36' in res.stderr
    assert 'sglang' in res.stderr and password not in res.stderr
    with open(os.path.join(lab.project, 'runtime', 'sglang.lock')) as f:
        assert f.read() == made


INSTALLERS = '/var/lib/gpuhost/installers'


def mirror_gets(lab, name):
    """The lab mirror's GETs of one file (lab/mirror.py's request log)."""
    try:
        with open(lab.control('mirror-requests.log')) as f:
            recs = [json.loads(line) for line in f]
    except FileNotFoundError:
        return []
    return [r for r in recs if r.get('method') == 'GET' and os.path.basename(r['path']) == name]


def by_source(lab, cfg):
    """cfg with the NVIDIA user space and CUDA declared by source on the lab's mirror: the installers the host
    downloads (issue 47). The driver's file is padded (64 kB of comments, the same installer otherwise) so that a
    download can be cut in the middle."""
    from lab import hostsim
    rt = cfg['gpuhost:runtime']
    nv_name = hostsim.nvidia_installer_name(rt['nvidia']['version'])
    padded = hostsim.nvidia_installer(rt['nvidia']['version']) + ('# %s\n' % ('-' * 77)) * 820
    hostsim.write(os.path.join(lab.dir, 'mirror', 'installers', 'padded', nv_name), padded)
    mirror = 'http://%s:8089/installers' % lab.spec['addresses']['pve']
    cuda_name = os.path.basename(rt['cuda']['installer'])
    rt['nvidia'] = {'version': rt['nvidia']['version'], 'source': '%s/padded/%s' % (mirror, nv_name),
                    'sha256': hashlib.sha256(padded.encode()).hexdigest()}
    rt['cuda'] = {'version': rt['cuda']['version'], 'source': '%s/%s' % (mirror, cuda_name),
                  'sha256': rt['cuda']['sha256']}
    return cfg, nv_name, len(padded), cuda_name


def test_a_bare_container_is_brought_to_serving_and_a_second_up_changes_nothing(lab, base):
    """... with its installers declared by source: the host downloads them from the lab's mirror - a download cut
    in the middle fails the run with nothing installed and is resumed by the next, a wrong sha256 is refused
    before anything runs - and keeps them for the next container."""
    import threading
    root = lab.ct_root()
    cfg, nv_name, nv_size, cuda_name = by_source(lab, json.loads(json.dumps(base)))
    right = cfg['gpuhost:runtime']['cuda']['sha256']
    cfg['gpuhost:runtime']['cuda']['sha256'] = cfg['gpuhost:runtime']['nvidia']['sha256']   # another file's
    lab.write_stack(STACK, cfg)
    res = lab.pulumi('preview', stack=STACK)
    assert 'the first `up` of container 200 installs, where the container lacks them: the NVIDIA user space ' \
        '580.95.05 (the host downloads http://' in res.stdout, res.stdout[-3000:]
    gpus = cfg['gpuhost:container']['gpus']
    assert 'the first `up` proves the GPUs (%s) before SGLang\'s first start' % ', '.join(gpus) in res.stdout
    # 1. The driver's download cut in the middle (the mirror goes down once 8 kB of 66 kB are on the host).
    with open(lab.control('mirror-throttle.json'), 'w') as f:
        json.dump({'files': {nv_name: 4096}}, f)
    part = '%s/.gpuhost-staging/%s/%s.part' % (INSTALLERS, cfg['gpuhost:runtime']['nvidia']['sha256'], nv_name)
    done = threading.Event()

    def cut():
        while not done.is_set():
            got = lab.on_host('stat -c %%s %s 2>/dev/null || echo 0' % part).stdout.strip()
            if got.isdigit() and int(got) >= 8192:
                open(lab.control('mirror-down'), 'w').close()
                return
            time.sleep(0.3)
    cutter = threading.Thread(target=cut, daemon=True)
    cutter.start()
    try:
        res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
    finally:
        done.set()
        cutter.join(5)
        for f in ('mirror-down', 'mirror-throttle.json'):
            if os.path.exists(lab.control(f)):
                os.unlink(lab.control(f))
    out = res.stdout + res.stderr
    assert res.returncode != 0 and 'gpuhost:runtime.nvidia.source: ' in out and 'resumes' in out, out[-3000:]
    assert not os.path.lexists(root + '/usr/lib/x86_64-linux-gnu/libcuda.so.1') and lab.unit_starts() == 0
    # 2. Resumed from where it broke off (no byte twice); CUDA's, whose declared sha256 is another file's, is
    # downloaded and refused before anything is installed.
    res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and 'gpuhost:runtime.cuda.source: %s: downloaded, but its sha256 is' % cuda_name in out, \
        out[-3000:]
    assert 'Nothing was installed' in out
    assert not os.path.lexists(root + '/usr/lib/x86_64-linux-gnu/libcuda.so.1') and lab.unit_starts() == 0
    gets = mirror_gets(lab, nv_name)
    assert len(gets) >= 2 and gets[-1]['range'] == 'bytes=%d-' % (nv_size - gets[-1]['bytes']), gets
    assert sum(g['bytes'] for g in gets) == nv_size, gets
    assert lab.on_host('sha256sum %s/%s' % (INSTALLERS, nv_name)).stdout.split()[0] == \
        cfg['gpuhost:runtime']['nvidia']['sha256']
    # 3. The right sha256: it serves; the driver's installer is not downloaded again. The GPU proof (on by default)
    # ran before SGLang's first start - the fresh container's unit not loaded yet, nothing to stop.
    cfg['gpuhost:runtime']['cuda']['sha256'] = right
    lab.write_stack(STACK, cfg)
    res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    assert len(mirror_gets(lab, nv_name)) == len(gets)
    assert health(lab) == 200 and server_version(lab) == OLD
    assert lab.unit_starts() == 1
    assert 'GPU proof passed: 4 GPUs ok (%s)' % ', '.join(gpus) in res.stdout and 'The first figure for these GPUs: ' \
        'set gpuhost:sglang.proof.min_busbw_gbps below it' in res.stdout, res.stdout[-3000:]
    proven = lab.outputs(STACK)['gpu_proof']
    assert proven['ok'] and proven['first']['busbw'] == proven['busbw'] > 0 and proven['first']['transport'] == 'SHM'
    # The NVIDIA user space of the host module's version, CUDA at cuda_home, the environment under its id.
    assert os.path.realpath(root + '/usr/lib/x86_64-linux-gnu/libcuda.so.1').endswith('libcuda.so.580.95.05')
    assert lab.ct_exec(['nvidia-smi', '--query-gpu=driver_version', '--format=csv,noheader']).stdout.split() == \
        ['580.95.05'] * 4
    with open(root + '/usr/local/cuda-13.0/version.json') as f:
        assert json.load(f)['cuda']['version'] == '13.0.2'
    out = lab.outputs(STACK)['runtime']
    assert (out['host_driver'], out['container_driver'], out['cuda'], out['sglang']) == \
        ('580.95.05', '580.95.05', '13.0.2', OLD)
    env = '/opt/sglang/envs/' + out['env']
    assert out['env'] == out['declared_env'] and envs(lab) == [out['env']]
    assert os.readlink(root + '/opt/sglang/venv') == env
    with open(os.path.join(root, UNIT)) as f:
        unit = f.read()
    assert 'ExecStart=%s/bin/python -m sglang.launch_server' % env in unit
    assert 'Environment="PATH=%s/bin:/usr/local/cuda-13.0/bin:' % env in unit
    # pip installed it with the index's login: never on a command line, in the state or in the output.
    password = lab.index_password()
    assert all(password not in (e['command'] or '') for e in lab.ssh_log())
    assert lab.plaintext_secrets_in_state(STACK) == []
    assert any(r['path'].startswith('/packages/sglang-%s' % OLD) and r['status'] == 200 for r in lab.index_requests())
    prom = lab.on_host('cat /var/lib/prometheus/node-exporter/gpuhost.prom').stdout
    assert 'gpuhost_nvidia_driver_match 1\n' in prom and 'gpuhost_cuda_info{version="13.0.2"} 1\n' in prom
    assert 'gpuhost_sglang_environment_info{sglang_version="%s",env="%s"' % (OLD, out['env']) in prom

    # What the preflight judges a lock's wheels against in a running container (ct_platform.sh): its own glibc and
    # python3 - the lab's container is Debian 12's, as debian-12-standard.
    from transport import remote
    with open(lab.info['ssh']['key_file']) as f:
        target = remote.Target(host=lab.info['ssh']['host'], port=lab.info['ssh']['port'], user='root',
                               private_key=f.read(), host_key=lab.info['ssh']['host_key'])
    assert remote.run(target, 'ct_platform.sh', ['200']).stdout == 'glibc 2.36 python 3.11\n'
    assert remote.run(target, 'ct_platform.sh', ['299']).stdout == 'absent\n'

    state, asked = service_state(lab), len(lab.index_requests())
    lab.pulumi('up', '--yes', '--refresh', '--expect-no-changes', stack=STACK)
    assert service_state(lab) == state and len(lab.index_requests()) == asked


def test_a_new_version_that_fails_its_check_is_rolled_back(lab, base):
    state = service_state(lab)
    old_env = state['link']
    configure(lab, base, NEW, [('sm120-kernels.patch', crashing_patch())])
    res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert 'no kernel image is available' in lab.ct_exec(['journalctl', '-u', 'sglang-qwen.service']).stdout
    assert 'failed its check' in out and 'Rolled back: container 200 runs the previous unit again - environment %s, ' \
        'SGLang %s - and it serves' % (old_env, OLD) in out, out[-3000:]
    # The service is on the old environment again, serving; the new one stays until a successful up.
    assert health(lab) == 200 and server_version(lab) == OLD
    after = service_state(lab)
    assert after['unit'] == state['unit'] and after['link'] == old_env
    # The new unit at least once (systemd's own Restart=on-failure, RestartSec=10, may start the crashing one
    # again while the check is still waiting on a loaded machine - CI saw one such start), then the previous
    # one, which serves the old version (above).
    assert after['starts'] >= state['starts'] + 2, 'the new unit, then the previous one'
    assert len(envs(lab)) == 2


def test_a_version_bump_builds_beside_restarts_once_and_keeps_the_old_one(lab, base):
    state = service_state(lab)
    # A directory in envs_dir that is not the program's (named like an environment, without its marker): the
    # pruning after the switch leaves it.
    foreign = os.path.join(lab.ct_root(), 'opt', 'sglang', 'envs', '0123456789abcdef')
    os.makedirs(os.path.join(foreign, 'data'))
    configure(lab, base, NEW, [('sm120-fp4.patch', GOOD_PATCH)])
    res = lab.pulumi('preview', '--diff', stack=STACK)
    # With --diff the CLI writes the diagnostics (this message among them) to stderr.
    preview = res.stdout + res.stderr
    assert 'the Python environment changes: sglang %s -> %s' % (OLD, NEW) in preview, preview[-3000:]
    assert 'patches: +sm120-fp4.patch' in preview
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    assert lab.unit_starts() == state['starts'] + 1, 'SGLang must restart exactly once'
    assert health(lab) == 200 and server_version(lab) == NEW
    out = lab.outputs(STACK)['runtime']
    new_env = '/opt/sglang/envs/' + out['env']
    assert lab.ct_exec([new_env + '/bin/python', '-c', 'import sglang; print(sglang.SM120_FP4)']).stdout == 'True\n'
    assert os.readlink(os.path.join(lab.ct_root(), 'opt', 'sglang', 'venv')) == new_env
    # The previous confirmed environment is kept (keep: 1); the one that failed is gone; the foreign one stays.
    assert envs(lab) == sorted([out['env'], os.path.basename(state['link']), '0123456789abcdef'])
    lab.pulumi('up', '--yes', '--expect-no-changes', stack=STACK)


@pytest.mark.parametrize('fault', ['lock hash mismatch', 'index does not answer', 'patch does not apply'])
def test_a_failed_build_leaves_the_service_byte_for_byte(lab, base, fault):
    state = service_state(lab)
    if fault == 'lock hash mismatch':
        with open(os.path.join(lab.project, lab.write_lock('runtime/good.lock', NEW))) as f:
            text = f.read()
        wheel_sha = text.split('sglang==%s' % NEW)[1].split('sha256:')[1][:64]
        # The lock pins another file than the index serves (a stale lock, or a tampered file).
        configure(lab, base, NEW, [], lock=text.replace(wheel_sha, '0' * 64))
        words = ['gpuhost:runtime.python.lock', 'sglang==%s' % NEW, 'the lock pins %s' % ('0' * 64)]
    elif fault == 'index does not answer':
        configure(lab, base, NEW, [('other.patch', GOOD_PATCH.replace('SM120_FP4', 'OTHER'))])
        lab.index_down()
        words = ['gpuhost:runtime.python.index', 'did not answer']
    else:
        configure(lab, base, NEW, [('stale.patch', GOOD_PATCH.replace('A stand-in', 'No stand-in'))])
        words = ['gpuhost:runtime.python.patches', 'runtime/patches/stale.patch', 'hunk 1', 'does not apply']
    try:
        res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
    finally:
        lab.index_down(False)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    for w in words + ['Nothing was switched']:
        assert w in out, (w, out[-3000:])
    assert service_state(lab) == state, 'the running environment or unit changed'
    assert health(lab) == 200


def test_a_host_driver_upgraded_out_of_band_is_danger_and_stops_up(lab, base):
    cfg = configure(lab, base, NEW, [('sm120-fp4.patch', GOOD_PATCH)])
    lab.pulumi('up', '--yes', '--expect-no-changes', stack=STACK)
    state = service_state(lab)
    lab.host.set_nvidia_module('580.105.08')
    res = lab.pulumi('preview', '--refresh', stack=STACK)
    assert 'DANGER - the host runs nvidia kernel module 580.105.08 but container 200 has the NVIDIA user space ' \
           '580.95.05' in res.stdout + res.stderr, res.stdout[-3000:]
    assert 'set gpuhost:runtime.nvidia.version: 580.105.08' in res.stdout + res.stderr
    n = lab.ssh_commands()
    res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert 'gpuhost:runtime.nvidia.version: 580.95.05, but the host runs nvidia kernel module 580.105.08' in out
    assert 'Nothing was changed, nothing restarted' in out
    assert service_state(lab) == state
    # Only the preflight's reads: alone, or side by side in one command (read_batch.sh NAMES ...).
    reads = {'host_facts.sh', 'ct_unit_owner.sh', 'check_dir.sh', 'model_verify.sh'}
    sent = [e['cmd'].split() for e in lab.ssh_log() if e['n'] > n]
    assert sent and all((w[0] in reads) or (w[0] == 'read_batch.sh' and set(w[1].split(',')) <= reads) for w in sent), \
        'up ran more than its preflight: %s' % [' '.join(w)[:60] for w in sent]
    # The fix the message names: the new installer on the host, declared; one restart.
    path, sha = lab.host.add_artifact('NVIDIA-Linux-x86_64-580.105.08.run', lab_installer('580.105.08'))
    cfg['gpuhost:runtime']['nvidia'] = {'version': '580.105.08', 'installer': path, 'sha256': sha}
    lab.write_stack(STACK, cfg)
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    assert lab.unit_starts() == state['starts'] + 1 and health(lab) == 200
    assert lab.outputs(STACK)['runtime']['container_driver'] == '580.105.08'
    assert lab.ct_exec(['nvidia-smi']).returncode == 0
    lab.pulumi('up', '--yes', '--refresh', '--expect-no-changes', stack=STACK)


def lab_installer(version):
    import sys
    sys.path.insert(0, os.path.join(REPO, 'lab'))
    import hostsim
    return hostsim.nvidia_installer(version)


def test_a_build_outlives_a_killed_pulumi_and_the_index_login_never_follows_a_redirect(lab, base):
    """The environment build is a job in the container (gpuhost-envbuild): `pulumi` killed with SIGKILL while it
    runs leaves it running, and the next `up` re-attaches to it - one builder, each file fetched once. The index
    sends its files from a CDN on another loopback host (a 302, as Artifactory or Nexus serving from S3 do): the
    CDN never sees the index's login, neither from pip nor from the builder's own fetch of pip."""
    import signal
    import subprocess
    import threading
    import time
    # The stack as the test before left it (the host's new driver declared), with one more patch: a new build.
    import yaml
    with open(os.path.join(lab.project, 'Pulumi.%s.yaml' % STACK)) as f:
        cfg = yaml.safe_load(f)['config']
    path = os.path.join(lab.project, 'runtime', 'patches', 'job.patch')
    with open(path, 'w') as f:
        f.write('--- a/sglang/__init__.py\n+++ b/sglang/__init__.py\n@@ -2,2 +2,3 @@\n SM120_FP4 = True\n'
                '+SM120_FP4_JOB = True\n import os\n')
    cfg['gpuhost:runtime']['python']['patches'] = cfg['gpuhost:runtime']['python']['patches'] + ['runtime/patches/job.patch']
    lab.write_stack(STACK, cfg)
    # pip's own wheel (~2 MB) at 150 kB/s: the build lasts long enough to be cut off.
    lab.index_files('redirect', rate=150000)
    since = time.time()
    proc = subprocess.Popen(['pulumi', 'up', '--yes', '--skip-preview', '--stack', STACK], cwd=lab.project,
                            env=lab.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    seen, lines = threading.Event(), []

    def reader():
        for line in proc.stdout:
            lines.append(line)
            if 'building the Python environment' in line:
                seen.set()
    threading.Thread(target=reader, daemon=True).start()
    try:
        assert seen.wait(180), ''.join(lines)[-3000:]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        time.sleep(2)
        assert ' active ' in lab.ct_exec(['systemctl', 'list-units', '--plain', '--no-legend', 'gpuhost-envbuild-*'],
                                          check=False).stdout, 'the build died with pulumi'
        # The build must still run when the next `up` comes to it (a CI run once had the build done first, on a
        # loaded machine): its downloads crawl until that `up` says it re-attached, then go at full speed.
        lab.index_files('redirect', rate=10000)

        def up():
            run = subprocess.Popen(['pulumi', 'up', '--yes', '--skip-preview', '--stack', STACK], cwd=lab.project,
                                   env=lab.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            said = []
            for line in run.stdout:
                said.append(line)
                if 're-attached to job gpuhost-envbuild' in line:
                    lab.index_files('redirect', rate=10 ** 8)
            run.wait(60)
            text = ''.join(said)
            assert 'Traceback' not in text, text[-3000:]
            return run.returncode, text
        code, out = up()
        if code != 0:   # docs/operator-guide.md, "if a run was interrupted"
            assert 'locked' in out, out[-3000:]
            lab.pulumi('cancel', '--yes', stack=STACK)
            lab.pulumi('refresh', '--yes', '--clear-pending-creates', stack=STACK)
            code, out = up()
            assert code == 0, out[-3000:]
    finally:
        lab.index_files('index')
    assert 're-attached to job gpuhost-envbuild, still running in container 200' in out, out[-3000:]
    assert health(lab) == 200 and server_version(lab) == NEW
    assert lab.ct_exec(['/opt/sglang/venv/bin/python', '-c', 'import sglang; print(sglang.SM120_FP4_JOB)']).stdout == \
        'True\n'
    cdn = [r for r in lab.cdn_requests() if r['t'] >= since]
    # One build: SGLang's wheel fetched once (pip's own twice in a build: the builder's copy to run pip from, and
    # pip installing the lock's pip into the environment).
    assert len([r for r in cdn if '/sglang-' in r['path']]) == 1 and len([r for r in cdn if '/pip-' in r['path']]) == 2, cdn
    assert cdn and not any(r['authorization'] for r in cdn), cdn
    lab.pulumi('up', '--yes', '--expect-no-changes', stack=STACK)


def test_a_venv_link_pointed_elsewhere_is_drift_and_linked_again_without_a_restart(lab, base):
    """Issue 27, item 10 (the link): sglang.venv re-pointed at another directory is seen by `preview --refresh` and
    linked again by `up`, with no restart (the unit runs from the environment's own directory)."""
    link = os.path.join(lab.ct_root(), 'opt', 'sglang', 'venv')
    declared = os.readlink(link)
    lab.ct_exec(['sh', '-c', 'mkdir -p /opt/other-venv && ln -sfn /opt/other-venv /opt/sglang/venv'])
    starts = lab.unit_starts()
    res = lab.pulumi('preview', '--refresh', stack=STACK)
    assert '/opt/sglang/venv points at /opt/other-venv, not at the environment the unit runs from (%s)' % declared \
        in res.stdout + res.stderr, (res.stdout + res.stderr)[-3000:]
    lab.pulumi('up', '--yes', '--skip-preview', '--refresh', stack=STACK)
    assert os.readlink(link) == declared and lab.unit_starts() == starts and health(lab) == 200
    lab.pulumi('up', '--yes', '--refresh', '--expect-no-changes', stack=STACK)


def test_a_file_of_the_environment_changed_by_hand_is_drift_and_rebuilt_with_one_restart(lab, base):
    """Issue 27, item 10: two lines appended to a file of the active environment are seen by `preview --refresh`
    (the environment against the files pip recorded, as built) and repaired by `up`: built again, swapped in, one
    restart; a refresh of an untouched environment reads none of its files."""
    env = os.readlink(os.path.join(lab.ct_root(), 'opt', 'sglang', 'venv'))
    init = os.path.join(lab.ct_root(), env.lstrip('/'), 'lib', 'python3.11', 'site-packages', 'sglang', '__init__.py')
    with open(init) as f:
        original = f.read()
    with open(init, 'a') as f:
        f.write('import os\nos.environ["BY_HAND"] = "1"\n')
    starts = lab.unit_starts()
    res = lab.pulumi('preview', '--refresh', stack=STACK)
    out = res.stdout + res.stderr
    assert 'the environment %s was changed in place since it was built: 1 file changed (lib/python3.11/site-packages/' \
        'sglang/__init__.py)' % env in out, out[-3000:]
    lab.pulumi('up', '--yes', '--skip-preview', '--refresh', stack=STACK)
    with open(init) as f:
        assert f.read() == original
    assert lab.unit_starts() == starts + 1 and health(lab) == 200
    assert not [d for d in os.listdir(os.path.dirname(os.path.join(lab.ct_root(), env.lstrip('/'))))
                if d.endswith('-replaced')], 'the changed copy stayed'
    lab.pulumi('up', '--yes', '--refresh', '--expect-no-changes', stack=STACK)


def test_a_cuda_reinstall_sglang_refuses_is_rolled_back_to_the_toolkit_that_served(lab, base):
    """Issue 27, item 2 (the reinstall half): a CUDA toolkit reinstalled into the same cuda_home under the same
    unit - CUDA 12.9 for an environment whose torch was built for CUDA 13, which SGLang refuses at its start -
    is rolled back: the toolkit that served is put back where it was, the unit restarted on it and checked, and
    the run fails saying both. Declared back, nothing is left to change."""
    import sys
    import yaml
    sys.path.insert(0, os.path.join(REPO, 'lab'))
    import hostsim
    with open(os.path.join(lab.project, 'Pulumi.%s.yaml' % STACK)) as f:
        cfg = yaml.safe_load(f)['config']
    # One directory whatever the version (/usr/local/cuda, as many hosts have it): the toolkit that serves first.
    cfg['gpuhost:sglang']['cuda_home'] = '/usr/local/cuda'
    lab.write_stack(STACK, cfg)
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    home = os.path.join(lab.ct_root(), 'usr', 'local', 'cuda')

    def toolkit():
        with open(os.path.join(home, 'version.json')) as f:
            return json.load(f)['cuda']['version']
    assert toolkit() == hostsim.CUDA_VERSION and health(lab) == 200
    with open(os.path.join(lab.ct_root(), UNIT), 'rb') as f:
        unit = f.read()
    starts = lab.unit_starts()
    good = dict(cfg['gpuhost:runtime']['cuda'])
    path, sha = lab.host.add_artifact(hostsim.cuda_installer_name('12.9.1', cfg['gpuhost:runtime']['nvidia']['version']),
                                      hostsim.cuda_installer('12.9.1'))
    cfg['gpuhost:runtime']['cuda'] = {'version': '12.9.1', 'installer': path, 'sha256': sha}
    lab.write_stack(STACK, cfg)
    res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert 'The detected CUDA version (12.9) mismatches the version that was used to compile PyTorch (13.0)' in \
        lab.ct_exec(['journalctl', '--no-pager', '-u', 'sglang-qwen.service']).stdout
    assert 'sglang-qwen.service failed its check after its restart: ' in out and \
        'It had restarted with CUDA 12.9.1 (/usr/local/cuda).' in out, out[-3000:]
    assert 'Rolled back: container 200 runs the previous unit again - environment /opt/sglang/envs/' in out and \
        ', CUDA %s (/usr/local/cuda), SGLang %s - and it serves' % (hostsim.CUDA_VERSION, NEW) in out, out[-3000:]
    assert 'gpuhost:runtime.cuda' in out
    # The toolkit that served is back where it was, nothing left beside it; SGLang serves on it.
    assert toolkit() == hostsim.CUDA_VERSION
    assert sorted(n for n in os.listdir(os.path.dirname(home)) if n.startswith('cuda')) == ['cuda', 'cuda-13.0']
    assert health(lab) == 200 and lab.unit_starts() >= starts + 2
    with open(os.path.join(lab.ct_root(), UNIT), 'rb') as f:
        assert f.read() == unit
    cfg['gpuhost:runtime']['cuda'] = good
    lab.write_stack(STACK, cfg)
    lab.pulumi('up', '--yes', '--refresh', '--expect-no-changes', stack=STACK)


def test_the_gpu_proof_runs_before_sglang_starts_on_new_ground_and_a_failure_stops_that_start(lab, base):
    """Issue 48 (gpuhost:sglang.proof): with the unit stopped for a restart onto new ground - here its first start
    with the proof switched on again - the GPUs are proven in the container with the service's own Python and environment (the
    lab's simulated torch answers for the container's simulated GPUs). A GPU that computes wrong, and an all-reduce
    that hangs (killed within the limit), each stop that start, named, and the unit that served is put back. Once
    proven, a restart on the same ground does not prove again."""
    import yaml
    with open(os.path.join(lab.project, 'Pulumi.%s.yaml' % STACK)) as f:
        cfg = yaml.safe_load(f)['config']
    gpus = cfg['gpuhost:container']['gpus']
    version = server_version(lab)
    with open(os.path.join(lab.ct_root(), UNIT), 'rb') as f:
        unit = f.read()
    # Switched off, the proof leaves no result standing; a restart runs none, and every preview warns.
    cfg['gpuhost:sglang']['proof'] = {'enabled': False}
    cfg['gpuhost:sglang'].setdefault('environment', {})['LAB_PROOF_STEP'] = '0'
    lab.write_stack(STACK, cfg)
    res = lab.pulumi('up', '--yes', stack=STACK)
    assert 'gpuhost:sglang.proof.enabled: false - SGLang starts on GPUs nobody proved' in res.stdout + res.stderr
    assert 'proving the GPUs' not in res.stdout and lab.outputs(STACK).get('gpu_proof') is None
    with open(os.path.join(lab.ct_root(), UNIT), 'rb') as f:
        unit = f.read()
    cfg['gpuhost:sglang']['proof'] = {'enabled': True, 'time_limit_s': 12, 'min_busbw_gbps': 5}
    cfg['gpuhost:sglang']['environment']['LAB_PROOF_STEP'] = '1'
    lab.write_stack(STACK, cfg)
    res = lab.pulumi('preview', stack=STACK)
    assert '`up` proves the GPUs (%s) before SGLang starts: they were never proven' % ', '.join(gpus) in res.stdout, \
        res.stdout[-3000:]
    faults = os.path.join(lab.ct_root(), 'etc', 'lab-faults', 'torch.json')
    os.makedirs(os.path.dirname(faults), exist_ok=True)
    for fault, said in (({'bad_gpu': gpus[1]}, 'GPU %s: the bf16 matmul is wrong' % gpus[1]),
                        ({'hang': 'stop'}, 'the all-reduce across GPUs %s did not finish within the 12 s limit' %
                         ', '.join(gpus)),
                        # A slow transport: 2 GB/s against the stack's floor of 5 (gpuhost:sglang.proof.min_busbw_gbps).
                        ({'busbw_gbps': 2}, 'the all-reduce across GPUs %s reached a bus bandwidth of ' %
                         ', '.join(gpus))):
        with open(faults, 'w') as f:
            json.dump(fault, f)
        res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
        out = res.stdout + res.stderr
        assert res.returncode != 0 and 'the GPU proof failed in container 200: ' + said in out, out[-3000:]
        assert 'SGLang was not started on them' in out and 'Rolled back: container 200 runs the previous unit ' \
            'again' in out, out[-3000:]
        assert health(lab) == 200 and server_version(lab) == version
        with open(os.path.join(lab.ct_root(), UNIT), 'rb') as f:
            assert f.read() == unit
        # Nothing of the proof is left running in the container (a hung worker was killed).
        assert 'gpuhost-gpu-proof' not in lab.ct_exec(['ps', '-eo', 'args']).stdout
        # The failure for node_exporter (the GpuhostGpuProofFailed alert), though the run failed.
        prom = lab.on_host('cat /var/lib/prometheus/node-exporter/gpuhost-gpu-proof.prom').stdout
        assert 'gpuhost_gpu_proof_ok{vmid="200"} 0\n' in prom, prom
        if 'bad_gpu' in fault:
            assert 'gpuhost_gpu_proof_gpu_ok{vmid="200",bus_id="%s"} 0\n' % gpus[1] in prom, prom
        if 'busbw_gbps' in fault:
            assert ' GB/s at 128 MiB, below the floor of 5 GB/s; NCCL chose SHM' in out, out[-3000:]
            assert 'gpuhost_gpu_proof_allreduce_busbw_floor_bytes_per_second{vmid="200"} 5000000000\n' in prom, prom
    os.unlink(faults)
    starts = lab.unit_starts()
    res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    assert 'GPU proof passed: 4 GPUs ok (%s)' % ', '.join(gpus) in res.stdout, res.stdout[-3000:]
    assert lab.unit_starts() == starts + 1 and health(lab) == 200
    proven = lab.outputs(STACK)['gpu_proof']
    assert proven['ok'] and proven['gpus'] == gpus and proven['tp'] == 4 and proven['transport'] == 'SHM', proven
    assert [g['bus_id'] for g in proven['per_gpu']] == gpus and all(g['ok'] for g in proven['per_gpu'])
    prom = lab.on_host('cat /var/lib/prometheus/node-exporter/gpuhost-gpu-proof.prom').stdout
    assert 'gpuhost_gpu_proof_ok{vmid="200"} 1\n' in prom and \
        'gpuhost_gpu_proof_allreduce_busbw_bytes_per_second{vmid="200",transport="SHM",bytes="134217728"} ' in prom, prom
    # The same ground: a restart for another setting proves nothing again.
    cfg['gpuhost:sglang']['environment']['LAB_PROOF_STEP'] = '2'
    lab.write_stack(STACK, cfg)
    res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    assert 'proving the GPUs' not in res.stdout and lab.unit_starts() == starts + 2
    assert lab.outputs(STACK)['gpu_proof']['at'] == proven['at']
    # The host reboots: SGLang starts at boot on GPUs nobody proved since. The next `up` stops it, proves them and
    # starts it again, and says so in its preview; the first figure stays the reference.
    reboots = len(lab.reboots())
    assert lab.ssh('reboot').exit_code in (0, None)
    assert lab.wait_reboots(reboots + 1, timeout=120)['boot_id'] == lab.boot_id() != proven['boot_id']
    lab.wait_for(lambda: health_or_none(lab) == 200, timeout=120, what='SGLang serving again after the reboot')
    starts = lab.unit_starts()
    res = lab.pulumi('up', '--yes', '--refresh', stack=STACK)
    assert '`up` proves the GPUs (%s) before SGLang starts: the host rebooted since they were proven (%s), and SGLang ' \
        'started at boot on them unproven' % (', '.join(gpus), proven['at']) in res.stdout, res.stdout[-3000:]
    assert 'GPU proof passed: 4 GPUs ok' in res.stdout and '; the first proof\'s: ' in res.stdout, res.stdout[-3000:]
    assert lab.unit_starts() == starts + 1 and health(lab) == 200
    again = lab.outputs(STACK)['gpu_proof']
    assert again['boot_id'] == lab.boot_id() and again['at'] != proven['at'] and again['first'] == proven['first']
    lab.pulumi('up', '--yes', '--refresh', '--expect-no-changes', stack=STACK)
