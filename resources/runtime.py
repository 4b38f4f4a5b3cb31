"""The container's runtime as declared state (gpuhost:runtime, config/runtime.py): what SGLang stands on.

  NVIDIA user space   libcuda / libnvidia-ml / nvidia-smi at exactly the host module's version, installed by
                      NVIDIA's .run (an operator's file on the host, sha256-checked there) run in the container
                      with --no-kernel-module. Why not the host's libraries bind-mounted:
                      docs/operator-guide.md, "The first `up` on a bare host".
  CUDA toolkit        NVIDIA's runfile with --toolkit into gpuhost:sglang.cuda_home; checked by its
                      version.json and `nvcc --version`. The toolkit there before is kept beside it
                      (<cuda_home>.gpuhost-previous) until SGLang has served on the new one, and put back
                      if the install, its check or the restart fails (previous_toolkit).
  Python environment  content-addressed: <envs_dir>/<id>, id = a hash of the lock (its canonical text), the
                      patches and the Python version. Built beside the running one by ct_env_build.py (a fresh
                      virtualenv under a temporary name, pip install --require-hashes --no-deps, patches, `import
                      sglang` at the declared version, one rename), never changed afterwards. The unit's
                      ExecStart and PATH name the environment's own directory, so a new environment is a new
                      unit: the SGLang unit's step restarts once, checks /health and /server_info, and on failure
                      puts the previous confirmed unit back (resources/sglang.py). Once confirmed, the venv path
                      becomes a link to it and environments beyond the current and `keep` previous are removed.

All of it is a part of the SGLang unit's resource (its `runtime` and `env` inputs), not resources of its
own: the facts come with the unit's own read (ct_unit_facts.sh, one round trip), the restart and the
rollback are the unit's, and a fleet rolls a new environment out like any other unit change.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import posixpath

from transport import jobs, remote
from transport.operator import OperatorError, info, warn
from grammar.installers import PLACEHOLDER_SHA256, where_sums

ENV_ID_LEN = 16
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
# Where the wheelhouse's staging job copies it inside the container while a build runs.
WHEELHOUSE_IN_CT = '/var/tmp/.gpuhost-wheelhouse'
# NVIDIA's installers, unattended: no kernel module in a container (the host's is the one loaded).
NVIDIA_ARGS = ('--silent', '--no-kernel-module', '--no-questions', '--ui=none', '--no-nouveau-check')
CUDA_ARGS = ('--silent', '--toolkit', '--no-man-page', '--override')


class RuntimeStepError(OperatorError):
    pass


# ----------------------------------------------------------------------------- desired (preview-time)

def environment(d, files) -> dict | None:
    """The Python environment the unit runs from (the unit resource's `env`): its id and directory, and what
    it holds - package versions from the lock, patches, Python - so a preview can say what changes."""
    if d.runtime is None or d.runtime.python is None or files is None:
        return None
    py = d.runtime.python
    patches = [{'name': p['name'], 'sha256': remote.sha256_hex(p['text'])} for p in files['patches']]
    ident = hashlib.sha256(json.dumps({'lock': files['lock_sha256'], 'patches': [[p['name'], p['sha256']]
                                                                                 for p in patches],
                                       'python': py.version}, sort_keys=True).encode()).hexdigest()[:ENV_ID_LEN]
    return {'id': ident, 'path': posixpath.join(py.envs_dir, ident), 'python': py.version,
            'lock_sha256': files['lock_sha256'], 'packages': dict(files['packages']), 'patches': patches,
            'sglang': d.sglang.version}


def declared(d) -> dict | None:
    """The unit resource's `runtime`: the NVIDIA user space and CUDA versions the container must have (None
    for a part the stack does not manage)."""
    rt = d.runtime
    if rt is None:
        return None
    return {'nvidia': rt.nvidia.version if rt.nvidia else None, 'cuda': rt.cuda.version if rt.cuda else None}


def installer_tokens(d) -> dict | None:
    """The installers' mirror logins ({kind: {"token": ...}}): the unit resource's secret input installer_tokens, never
    in `install`. None when no installer has one."""
    rt = d.runtime
    out = {k: {'token': getattr(rt, k).token.get_secret_value()} for k in ('nvidia', 'cuda')
           if rt is not None and getattr(rt, k) is not None and getattr(rt, k).token is not None}
    return out or None


def install_inputs(d, files) -> dict | None:
    """How to install what `runtime` and `env` declare: the unit resource's `install` input. Not compared
    (an installer moved on the host changes nothing installed); the index password is not here (a secret
    input of its own)."""
    rt = d.runtime
    if rt is None:
        return None
    out = {'timeout': rt.install_timeout_s, 'stall': rt.stall_timeout_s, 'nvidia': None, 'cuda': None, 'python': None}
    for key in ('nvidia', 'cuda'):
        part = getattr(rt, key)
        if part:
            # installer: where the file is on the host - the operator's upload, or where the host keeps the download
            # from source (fetch_installers).
            out[key] = {'installer': part.host_path, 'sha256': part.sha256, 'source': part.source}
    if rt.python and files is not None:
        py = rt.python
        out['python'] = {'lock_path': py.lock, 'lock': files['lock'], 'patches': files['patches'], 'keep': py.keep,
                         'envs_dir': py.envs_dir,
                         'index': {'url': py.index.url, 'username': py.index.username} if py.index else None,
                         'wheelhouse': py.wheelhouse}
    return out


def installed_from(art: dict) -> str:
    """Where an installer comes from, for the preview."""
    if art['sha256'] == PLACEHOLDER_SHA256:
        return 'from %s, once its sha256 is set: nothing is installed until then' % (art.get('source') or
                                                                                   art['installer'])
    if art.get('source'):
        return 'the host downloads %s into %s, sha256 %s... checked' % (
            art['source'], posixpath.dirname(art['installer']), art['sha256'][:12])
    return 'from %s on the host, sha256 %s... checked' % (art['installer'], art['sha256'][:12])


def first_install(news: dict) -> str | None:
    """What the unit's first `up` fetches and installs in the container, for the preview (a create shows no diff):
    each declared installer with its source, and the environment with its id and size. None when the program
    installs nothing there."""
    rt, inst, env = news.get('runtime') or {}, news.get('install') or {}, news.get('env')
    parts = []
    for key, name in (('nvidia', 'the NVIDIA user space'), ('cuda', 'CUDA')):
        if rt.get(key) and isinstance(inst.get(key), dict):
            parts.append('%s %s (%s)' % (name, rt[key], installed_from(inst[key])))
    if isinstance(env, dict) and env.get('id'):
        packages = env.get('packages') or {}
        head = ', '.join('%s %s' % (k, packages[k]) for k in ('sglang', 'torch') if k in packages)
        parts.append('the Python environment %s (%s; %d packages from the lock%s)' % (
            env.get('path') or env['id'], head or 'sglang', len(packages),
            ', %d patches' % len(env['patches']) if env.get('patches') else ''))
    if not parts:
        return None
    return 'the first `up` of container %s installs, where the container lacks them: %s' % (
        news.get('vmid'), '; '.join(parts))


def describe_change(old: dict | None, new: dict | None) -> str:
    """An environment change as a person reads it, from the two environments' package lists:
    'sglang 0.5.23 -> 0.5.24, torch 2.12.0.dev20261101+cu130 unchanged (+41 more unchanged), patches:
    +sm120-fp4.patch'."""
    if new is None:
        return 'no environment managed by the program'
    newp = new.get('packages') or {}
    if not old:
        head = ', '.join('%s %s' % (k, newp[k]) for k in ('sglang', 'torch') if k in newp)
        patches = [posixpath.basename(p['name']) for p in new.get('patches') or []]
        return 'a new environment: %s (%d packages)%s' % (head, len(newp), ', patches: ' + ', '.join(
            '+' + p for p in patches) if patches else '')
    oldp = old.get('packages') or {}
    first = ('sglang', 'torch')
    order = sorted(set(oldp) | set(newp), key=lambda k: (first.index(k) if k in first else len(first), k))
    parts = []
    for k in order:
        if k in oldp and k in newp and oldp[k] != newp[k]:
            parts.append('%s %s -> %s' % (k, oldp[k], newp[k]))
        elif k in newp and k not in oldp:
            parts.append('+%s %s' % (k, newp[k]))
        elif k in oldp and k not in newp:
            parts.append('-%s %s' % (k, oldp[k]))
    same = [k for k in order if k in oldp and k in newp and oldp[k] == newp[k]]
    named = [k for k in first if k in same]
    if named or same:
        parts.append('%s unchanged%s' % (', '.join('%s %s' % (k, newp[k]) for k in named) or 'the other packages',
                                         ' (+%d more unchanged)' % (len(same) - len(named)) if len(same) > len(named)
                                         and named else ''))
    if old.get('lock_sha256') != new.get('lock_sha256') and all(oldp.get(k) == v for k, v in newp.items()) \
            and set(oldp) == set(newp):
        parts.insert(0, 'the same versions pinned to other files (hashes)')
    oldpat = {p['name']: p['sha256'] for p in old.get('patches') or []}
    newpat = {p['name']: p['sha256'] for p in new.get('patches') or []}
    changes = ['+' + posixpath.basename(n) for n in newpat if n not in oldpat] + \
        ['-' + posixpath.basename(n) for n in oldpat if n not in newpat] + \
        ['~' + posixpath.basename(n) for n in newpat if n in oldpat and oldpat[n] != newpat[n]]
    if changes:
        parts.append('patches: ' + ', '.join(changes))
    if old.get('python') != new.get('python'):
        parts.append('Python %s -> %s' % (old.get('python'), new.get('python')))
    return ', '.join(parts)


# ----------------------------------------------------------------------------------- facts

def parse_facts(text: str) -> dict:
    """ct_unit_facts.sh's lines (pure; unit-tested): the tab-separated key/value pairs, plus `dropins`,
    `unit_text` (decoded), `envdirs` ({name: marker or None}), `container_driver` (the one version of
    libcuda and libnvidia-ml, or what differs)."""
    kv, dropins, envdirs = {}, [], {}
    for line in text.splitlines():
        key, sep, value = line.partition('\t')
        if not sep:
            continue
        if key == 'dropin':
            dropins.append(value)
        elif key == 'env_check':
            name, _, report = value.partition('\t')
            try:
                kv['env_check'] = {'id': name, **json.loads(report)}
            except ValueError:
                kv['env_check'] = {'id': name, 'ok': None, 'error': report[-200:]}
        elif key == 'envdir':
            name, _, marker = value.partition('\t')
            try:
                envdirs[name] = json.loads(marker) if marker not in ('', '-') else None
            except ValueError:
                envdirs[name] = None
        else:
            kv[key.strip()] = value.strip()
    out = dict(kv, dropins=sorted(dropins), envdirs=envdirs)
    if isinstance(kv.get('env_check'), dict):
        out['env_check'] = kv['env_check']
    if 'unit_text' in kv:
        out['unit_text'] = base64.b64decode(kv['unit_text']).decode('utf-8', 'replace')
    for key in ('host_driver',):
        if out.get(key) in ('', '-'):
            out[key] = None
    if 'libcuda.so' in kv:
        cuda_libs = kv.get('libcuda.so', '').split()
        nvml_libs = kv.get('libnvidia-ml.so', '').split()
        if not cuda_libs and not nvml_libs:
            out['container_driver'] = None
        elif cuda_libs == nvml_libs and len(cuda_libs) == 1:
            out['container_driver'] = cuda_libs[0]
        else:
            out['container_driver'] = 'mixed: libcuda %s, libnvidia-ml %s' % (
                ' '.join(cuda_libs) or 'none', ' '.join(nvml_libs) or 'none')
    if out.get('cuda') == '-':
        out['cuda'] = None
    return out


def env_check_summary(check: dict) -> str:
    """ct_env_check.py's report as words: "sglang/__init__.py changed, 1 file added (lib/.../x.py)"."""
    counts = check.get('counts') or [0, 0, 0]
    parts = []
    for n, key, word in ((counts[0], 'changed', 'changed'), (counts[1], 'missing', 'removed'),
                         (counts[2], 'added', 'added')):
        if n:
            shown = ', '.join(check.get(key) or [])
            parts.append('%d file%s %s (%s%s)' % (n, '' if n == 1 else 's', word, shown,
                                                  ', ...' if n > len(check.get(key) or []) else ''))
    return '; '.join(parts) or 'changed'


def checker_source() -> str:
    with open(os.path.join(remote.SCRIPTS, 'ct_env_check.py')) as f:
        return f.read()


def env_of_unit(unit_text: str | None, envs_dir: str | None) -> str | None:
    """The environment directory the unit file runs from (its ExecStart's python), if it is one in envs_dir."""
    if not unit_text or not envs_dir:
        return None
    for line in unit_text.splitlines():
        if line.startswith('ExecStart='):
            words = line[len('ExecStart='):].strip().lstrip('@-:+!').split()
            exe = words[0].strip('"') if words else ''
            if exe.startswith(envs_dir + '/'):
                return exe[len(envs_dir) + 1:].split('/', 1)[0]
    return None


def observed(props: dict, facts: dict) -> dict:
    """The runtime keys as the container has them: `runtime` (the parts the stack declares), `env` (the
    marker of the declared environment if it is built), and the facts every output carries."""
    running = facts.get('ct') == 'running'
    want = props.get('runtime')
    rt = None
    if want is not None and running:
        rt = {'nvidia': facts.get('container_driver') if want.get('nvidia') else None,
              'cuda': facts.get('cuda') if want.get('cuda') else None}
    env = None
    want_env = props.get('env')
    if want_env is not None and running:
        env = facts.get('envdirs', {}).get(want_env['id'])
    py = (props.get('install') or {}).get('python') or {}
    running_env = env_of_unit(facts.get('unit_text'), py.get('envs_dir')) if running else None
    link = facts.get('venv_link')
    if env is not None and running_env == want_env['id'] and link not in (None, '-', '(a directory)') and \
            want_env.get('path') and link != want_env['path']:
        # The unit runs from the declared environment, but sglang.venv (what operators and scripts use) was pointed
        # elsewhere: drift, which `up` repairs by linking it again (no restart: the service does not use the link).
        env = dict(env, venv_link=link)
    check = facts.get('env_check') or {}
    if env is not None and running_env == want_env['id'] and check.get('id') == want_env['id'] and \
            check.get('ok') is False:
        # Changed in place since it was built (a file edited, removed or added by hand): drift, repaired by building
        # it again beside it, swapping it in and one restart.
        env = dict(env, modified=env_check_summary(check))
    if py:
        marker = facts.get('envdirs', {}).get(running_env) or {} if running_env else {}
        sglang, lock = marker.get('sglang'), marker.get('lock_sha256')
    else:
        sglang, lock = facts.get('sglang') if running else None, None
    return {'runtime': rt, 'env': env, 'runtime_facts': {
        'host_driver': facts.get('host_driver'), 'boot_id': facts.get('boot_id'),
        'container_driver': facts.get('container_driver') if running else None,
        'cuda': facts.get('cuda') if running else None,
        'sglang': sglang, 'env': running_env, 'lock_sha256': lock,
        'venv_link': facts.get('venv_link') if running else None}}


def driver_danger(props: dict, facts: dict, label: str) -> str | None:
    """The warning for a host module that is not the container's user space (a host driver upgraded under a
    running container): SGLang dies at its next start. None when they match or either is unknown."""
    host, ct = facts.get('host_driver'), facts.get('container_driver')
    if not host or not ct or host == ct:
        return None
    declared_ = (props.get('runtime') or {}).get('nvidia')
    fix = ('upload NVIDIA-Linux-x86_64-%s.run to the host, set gpuhost:runtime.nvidia.version: %s with its installer '
           'and sha256, then `pulumi up` (it installs the matching user space in the container and restarts SGLang '
           'once)' % (host, host) if declared_ else
           'install the NVIDIA user space %s in the container (NVIDIA-Linux-x86_64-%s.run --no-kernel-module), or '
           'let the program do it: gpuhost:runtime.nvidia' % (host, host))
    return ('%s: DANGER - the host runs nvidia kernel module %s but container %s has the NVIDIA user space %s: NVML '
            'fails with "Driver/library version mismatch" and SGLang will not start again (at its next restart or the '
            'container\'s). Fix: %s' % (label, host, props['vmid'], ct, fix))


# ------------------------------------------------------------------------------------ apply

def check_host_driver(props: dict, facts: dict) -> None:
    """Stop before anything changes when the host module is not the declared version: the user space to
    install must equal what the host runs."""
    want = (props.get('runtime') or {}).get('nvidia')
    host = facts.get('host_driver')
    if want and host != want:
        raise RuntimeStepError(host_driver_message(want, host))


def host_driver_message(want, host) -> str:
    if host is None:
        return ('gpuhost:runtime.nvidia.version: %s, but the host has no nvidia kernel module loaded (no '
                '/sys/module/nvidia/version); install and load the host driver %s first (the container only gets '
                'the user space). Nothing was changed.' % (want, want))
    return ('gpuhost:runtime.nvidia.version: %s, but the host runs nvidia kernel module %s (/sys/module/nvidia/version): '
            'the container\'s user space must be exactly the host module\'s, or NVML fails with "Driver/library '
            'version mismatch". Nothing was changed, nothing restarted. If the host driver was upgraded on purpose: '
            'upload NVIDIA-Linux-x86_64-%s.run to the host, set gpuhost:runtime.nvidia.version: %s with its installer '
            'and sha256, and re-run (the container gets the matching user space, SGLang restarts once); otherwise put '
            'the host driver %s back.' % (want, host, host, host, want))


def _exit_status(e: jobs.JobFailed):
    r = (e.outcome.result if isinstance(e.outcome, jobs.Poll) else None) or {}
    return int(r['exit_status']) if r.get('exit_code') == 'exited' and str(r.get('exit_status')).isdigit() else None


def _job_log(e: jobs.JobFailed, prefix='gpuhost'):
    """The job's own last words: the last line of its log that starts with prefix, else its last lines."""
    lines = e.outcome.log if isinstance(e.outcome, jobs.Poll) else []
    mine = [l for l in lines if l.startswith(prefix + ': ') or l.startswith(prefix + '-build: ')]
    return mine[-1].split(': ', 1)[1] if mine else ' | '.join(lines[-3:])


def _installer_error(e: jobs.JobFailed, key, what, props, artifact) -> RuntimeStepError:
    code = _exit_status(e)
    if code == 4:
        return RuntimeStepError('%s.installer: %s does not exist on the host; upload it there (it is not in the '
                                'container yet). Nothing was installed.' % (key, artifact['installer']))
    if code == 5:
        got = _job_log(e).rsplit(' ', 1)[-1]
        return RuntimeStepError('%s.sha256: %s on the host has sha256 %s, not the declared %s - another or a damaged '
                                'file; compare it with NVIDIA\'s published checksum, then fix the file or the '
                                'sha256. Nothing was installed.' % (key, artifact['installer'], got, artifact['sha256']))
    return RuntimeStepError('installing %s in container %s failed: %s. The installer\'s own log is in the container '
                            '(%s); the running service was not restarted.' % (
                                what, props['vmid'], str(e), '/var/log/nvidia-installer.log' if 'nvidia' in key else
                                '/var/log/cuda-installer.log'))


# A job on the host: the installer copied into a private file (the job's own root-only directory), hashed there,
# and that copy - not the operator's path, which someone could swap in between - pushed into the container.
STAGE_INSTALLER = r"""set -euo pipefail
vmid=$1 src=$2 want=$3 dest=$4
if [ ! -f "$src" ]; then echo "gpuhost: $src does not exist on $(hostname)" >&2; exit 4; fi
copy=$GPUHOST_JOB_DIR/installer
cp "$src" "$copy"
got=$(sha256sum "$copy" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then echo "gpuhost: $src on $(hostname) has sha256 $got" >&2; rm -f "$copy"; exit 5; fi
pct push "$vmid" "$copy" "$dest" --perms 0700
rm -f "$copy"
echo "staged $dest"
"""

# The job in the container: the pushed copy checked again where it runs, run, removed. HOME (CUDA's, else -):
# the toolkit there - a complete one (the program's marker, or the first one the program meets) - is moved
# aside to HOME.gpuhost-previous first, so that it can be put back if SGLang does not serve on the new one
# (ct_cuda_previous.sh; dropped once it served). A half-written HOME (an install cut off) is never moved over
# the kept one: the installer writes over it.
RUN_INSTALLER = r"""set -euo pipefail
f=$1 want=$2 home=$3 version=$4
shift 4
trap 'rm -f "$f"' EXIT
got=$(sha256sum "$f" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then echo "gpuhost: $f in the container has sha256 $got, not the staged $want" >&2; exit 5; fi
if [ "$home" != - ]; then
  prev=$home.gpuhost-previous
  if [ -f "$home/version.json" ] && [ ! -L "$home" ] && { [ -f "$home/.gpuhost-installed" ] || [ ! -e "$prev" ]; }; then
    rm -rf -- "$prev"
    mv -T -- "$home" "$prev"
    echo "gpuhost: the toolkit that was in $home is kept as $prev until SGLang serves on the new one"
  fi
fi
sh "$f" "$@"
if [ "$home" != - ]; then echo "$version" > "$home/.gpuhost-installed"; fi
echo "installed"
"""


def _limits(props) -> dict:
    inst = props['install']
    return {'limit_s': int(float(inst['timeout'])), 'stall_s': int(float(inst.get('stall') or 600)),
            'limit_key': 'gpuhost:runtime.install_timeout_s', 'stall_key': 'gpuhost:runtime.stall_timeout_s'}


def installer_jobs(props: dict, kind: str, art: dict, args, home='-', version='-') -> tuple:
    """The two jobs of one installer: staging on the host, running in the container (home: CUDA's, whose
    toolkit is kept aside while the new one is installed)."""
    vmid = str(props['vmid'])
    name = posixpath.basename(art['installer'])
    dest = '/var/tmp/.gpuhost-' + name
    spec = jobs.spec_of({'installer': art['installer'], 'sha256': art['sha256'], 'args': list(args), 'vmid': vmid})
    stage = jobs.Job(name='gpuhost-stage-%s-%s' % (kind, vmid), label='copying %s into container %s' % (name, vmid),
                     spec=spec, interpreter='bash', body=STAGE_INSTALLER, args=(vmid, art['installer'], art['sha256'],
                                                                                dest), **_limits(props))
    run = jobs.Job(name='gpuhost-install-%s' % kind, label='installing %s in container %s' % (name, vmid), spec=spec,
                   interpreter='bash', body=RUN_INSTALLER, args=(dest, art['sha256'], home, version) + tuple(args),
                   vmid=vmid,
                   **_limits(props))
    return stage, run


def _install(target, props, kind, art, args, key, what, home='-', version='-') -> None:
    stage, run = installer_jobs(props, kind, art, args, home, version)
    try:
        p = jobs.poll(target, run)
        if not (p.running and p.spec == run.spec):
            # Not already running from an earlier `up` (then it is only followed): stage a fresh copy.
            jobs.run(target, stage)
        jobs.run(target, run)
    except jobs.JobFailed as e:
        raise _installer_error(e, key, what, props, art) from None


def fetch_job(props: dict, kind: str, art: dict, token=None) -> jobs.Job:
    """The download of one installer declared by source: a job on the host (hostscripts/model_verify.py
    fetch_file) into the program's own directory, where the next container's install finds it. The mirror's token
    is the job's input (a root-only file while it runs; model_verify.py sends it to the source's origin only)."""
    name = posixpath.basename(art['installer'])
    job = {'kind': 'file', 'url': art['source'], 'sha256': art['sha256'], 'dest': art['installer']}
    from resources.model import verifier_source
    return jobs.Job(name='gpuhost-fetch-%s' % jobs.key_of(art['installer']), label='downloading %s' % name,
                    spec=jobs.spec_of(job), interpreter='python3', body=verifier_source().decode(),
                    args=(json.dumps(job, sort_keys=True),),
                    stdin=(token or '').encode(), limit_s=0, stall_s=_limits(props)['stall_s'],
                    limit_key='gpuhost:runtime.install_timeout_s', stall_key='gpuhost:runtime.stall_timeout_s',
                    prefix='installer')


def fetch_installers(target, props: dict, facts: dict) -> None:
    """Before anything is installed: every installer this run will run that is declared by source is on the host,
    downloaded (resumable; never two downloads of one file) and checked against its sha256 - a wrong sha256 or a
    source that fails stops the run with nothing installed."""
    todo = [('nvidia', 'gpuhost:runtime.nvidia')] if nvidia_to_install(props, facts) else []
    todo += [('cuda', 'gpuhost:runtime.cuda')] if cuda_to_install(props, facts) else []
    for kind, key in todo:
        art = props['install'][kind]
        if art['sha256'] == PLACEHOLDER_SHA256:
            name = posixpath.basename(art['installer'])
            raise RuntimeStepError('%s.sha256 is the example\'s placeholder (64 zeros), so %s cannot be checked and '
                                   'is neither downloaded nor run: %s; set it (pulumi config set --path %s.sha256 '
                                   '<sha256>) and re-run. Nothing was installed.' % (key, name, where_sums(key, name),
                                                                                     key))
    for kind, key in todo:
        art = props['install'][kind]
        if not art.get('source'):
            continue
        try:
            token = ((props.get('installer_tokens') or {}).get(kind) or {}).get('token')
            p = jobs.run(target, fetch_job(props, kind, art, token))
        except jobs.JobFailed as e:
            raise RuntimeStepError('%s.source: %s; nothing was installed - re-run to resume the download' % (key, e)) \
                from None
        try:
            rep = json.loads((p.out or '').strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise RuntimeStepError('%s.source: the download of %s printed no report: %s' % (
                key, art['source'], (p.out or '')[-300:])) from None
        if rep.get('fetch_error'):
            raise RuntimeStepError('%s.source: %s. Nothing was installed; a partial download is kept on the host and '
                                   'the next `up` resumes it' % (key, rep['fetch_error']))
        if rep.get('fetched'):
            info('%s: downloaded %s from %s (%s bytes%s), sha256 checked; kept as %s for the next container' % (
                key, posixpath.basename(art['installer']), art['source'], rep['bytes'],
                ', %s of them resumed' % rep['resumed_bytes'] if rep.get('resumed_bytes') else '', art['installer']))


def nvidia_to_install(props: dict, facts: dict):
    """The NVIDIA user space version `up` installs (None: the container has it, or none is declared)."""
    want = (props.get('runtime') or {}).get('nvidia')
    return want if want and facts.get('container_driver') != want else None


def install_nvidia(target, props: dict, facts: dict) -> bool:
    want = nvidia_to_install(props, facts)
    if not want:
        return False
    _install(target, props, 'nvidia', props['install']['nvidia'], NVIDIA_ARGS, 'gpuhost:runtime.nvidia',
             'the NVIDIA user space %s' % want)
    return True


def cuda_to_install(props: dict, facts: dict):
    """The CUDA version `up` installs (None: the declared one is there, or none is declared)."""
    want = (props.get('runtime') or {}).get('cuda')
    if not want or (facts.get('cuda') == want and facts.get('nvcc') == 'yes'):
        return None
    return want


def install_cuda(target, props: dict, facts: dict) -> bool:
    """The declared toolkit into cuda_home; the one there before is kept beside it (RUN_INSTALLER) until SGLang
    has served on the new one: previous_toolkit() puts it back or drops it."""
    want = cuda_to_install(props, facts)
    if not want:
        return False
    _install(target, props, 'cuda', props['install']['cuda'], CUDA_ARGS + ('--toolkitpath=%s' % props['cuda_home'],),
             'gpuhost:runtime.cuda', 'CUDA %s' % want, home=props['cuda_home'], version=want)
    return True


def previous_toolkit(target, props: dict, what: str) -> str:
    """'restore': the toolkit an install moved aside goes back to cuda_home (the new one removed); returns its
    version, '' when none was kept; raises RemoteError when it could not be put back. 'drop': it is removed
    (SGLang served on the new one); a removal that fails is a warning, never the run's failure."""
    home = props['cuda_home']
    try:
        out = remote.run(target, 'ct_cuda_previous.sh', [props['vmid'], home, what]).stdout.strip()
    except remote.RemoteError as e:
        if what == 'restore':
            raise
        warn('sglang-unit: SGLang serves on CUDA %s, but removing the previous toolkit %s.gpuhost-previous in '
             'container %s failed: %s; remove it by hand (or the next install replaces it)' % (
                 (props.get('runtime') or {}).get('cuda'), home, props['vmid'], str(e).split(': ', 1)[-1]))
        return ''
    return (out.partition('\t')[2] or '?') if out.startswith('restored') else ''


def toolkit_back(target, props: dict) -> tuple:
    """(the version put back at cuda_home or None, what to say about the toolkit)."""
    home = props['cuda_home']
    try:
        version = previous_toolkit(target, props, 'restore')
    except remote.RemoteError as e:
        return None, 'putting the previous CUDA toolkit back failed too (%s): it is at %s.gpuhost-previous in ' \
                     'container %s' % (str(e).split(': ', 1)[-1], home, props['vmid'])
    if version:
        return version, 'the previous CUDA toolkit, %s, was put back at %s' % (version, home)
    return None, 'CUDA %s stays at %s (no toolkit was there before it)' % ((props.get('runtime') or {}).get('cuda'),
                                                                         home)


def verify_installed(target, props: dict) -> None:
    """After an install: nvidia-smi must talk to the driver (no version mismatch) and nvcc must be the
    declared release - what SGLang needs at its start, checked before it is restarted."""
    want = props.get('runtime') or {}
    out = remote.run(target, 'ct_runtime_check.sh', [props['vmid'], props['cuda_home']]).stdout
    got = {}
    for line in out.splitlines():
        name, _, rest = line.partition('\t')
        code, _, first = rest.partition('\t')
        got[name] = (code, first.strip())
    if want.get('nvidia'):
        code, first = got.get('nvidia_smi', ('?', ''))
        if code != '0' or first.split(',')[0].strip() != want['nvidia']:
            raise RuntimeStepError('container %s: nvidia-smi after installing the NVIDIA user space %s says: %s (exit '
                                   '%s); the service was not restarted. Check the devN device nodes and the host '
                                   'driver (nvidia-smi on the host)' % (props['vmid'], want['nvidia'], first, code))
    if want.get('cuda'):
        code, first = got.get('nvcc', ('?', ''))
        release = 'release %s' % '.'.join(want['cuda'].split('.')[:2])
        if code != '0' or release not in first:
            raise RuntimeStepError('container %s: %s/bin/nvcc --version after installing CUDA %s says: %s (exit %s); '
                                   'the service was not restarted' % (props['vmid'], props['cuda_home'], want['cuda'],
                                                                      first or '(nothing)', code))


def builder_source() -> str:
    """The program the container's python3 runs to build an environment: the patch applier, then the builder."""
    with open(os.path.join(REPO, 'grammar', 'unidiff.py')) as f:
        applier = f.read()
    with open(os.path.join(remote.SCRIPTS, 'ct_env_build.py')) as f:
        builder = f.read()
    return applier + '\n\n' + builder


# What each of the builder's exit codes is about: the config key an operator fixes.
BUILD_KEYS = {3: 'gpuhost:runtime.python.index', 4: 'gpuhost:runtime.python.lock', 6: 'gpuhost:runtime.python.patches',
              7: 'gpuhost:sglang.version', 8: 'gpuhost:runtime.python.version'}


# A job on the host: a wheelhouse copied into the container for the build (tar through pct exec).
STAGE_WHEELHOUSE = r"""set -euo pipefail
vmid=$1 src=$2 dest=$3
if [ ! -d "$src" ]; then echo "gpuhost-build: the wheelhouse $src does not exist on $(hostname)" >&2; exit 5; fi
tar -C "$src" -cf - . | pct exec "$vmid" -- sh -c 'rm -rf "$1" && mkdir -p "$1" && tar -C "$1" -xf -' sh "$dest"
echo "staged $dest"
"""


def build_jobs(props: dict, password=None, replace=False) -> tuple:
    """(the wheelhouse's staging job on the host or None, the build job in the container). One builder per
    container (`gpuhost-envbuild`): a second `up` re-attaches to it, a changed lock stops it first."""
    env = props['env']
    py = props['install']['python']
    vmid = str(props['vmid'])
    wheelhouse = py.get('wheelhouse')
    job = {'path': env['path'], 'marker': env, 'lock': py['lock'], 'patches': py['patches'], 'python': env['python'],
           'sglang': env['sglang'],
           'index': dict(py['index'], password=password) if py.get('index') else None, 'replace': replace}
    # The declaration, without the password (a rotated password is not another build).
    spec = jobs.spec_of({'path': env['path'], 'marker': env, 'lock': remote.sha256_hex(py['lock']), 'replace': replace,
                         'patches': [[p['name'], remote.sha256_hex(p['text'])] for p in py['patches']],
                         'index': py.get('index'), 'wheelhouse': wheelhouse})
    build = jobs.Job(name='gpuhost-envbuild', label='building the Python environment %s in container %s' % (
                         env['path'], vmid), spec=spec, interpreter='python3', body=builder_source(),
                     args=(WHEELHOUSE_IN_CT if wheelhouse else '-',), stdin=json.dumps(job).encode(), vmid=vmid,
                     **_limits(props))
    stage = jobs.Job(name='gpuhost-stage-wheelhouse-%s' % vmid, label='copying the wheelhouse %s into container %s'
                     % (wheelhouse, vmid), spec=spec, interpreter='bash', body=STAGE_WHEELHOUSE,
                     args=(vmid, wheelhouse, WHEELHOUSE_IN_CT), **_limits(props)) if wheelhouse else None
    return stage, build


def build_env(target, props: dict, facts: dict, password=None) -> bool:
    """Build the declared environment unless it is there (its marker is the declared one). False: nothing
    to build. Any failure leaves the running environment and unit as they were, and says which key to fix."""
    env = props['env']
    check = facts.get('env_check') or {}
    replace = check.get('id') == env['id'] and check.get('ok') is False
    if facts.get('envdirs', {}).get(env['id']) == env and not replace:
        return False
    py = props['install']['python']
    stage, build = build_jobs(props, password, replace=replace)
    ended = True
    try:
        p = jobs.poll(target, build)
        if stage is not None and not (p.running and p.spec == build.spec):
            jobs.run(target, stage)
        jobs.run(target, build)
    except jobs.JobDetached:
        # Following it failed (the connection stayed down); the build goes on, from the wheelhouse: kept for it,
        # and removed by the run that sees the build end.
        ended = False
        raise
    except jobs.JobFailed as e:
        if e.job is None or e.outcome is None or not isinstance(e.outcome, jobs.Poll):
            raise
        code = _exit_status(e)
        why = _job_log(e) if code is not None else str(e)
        raise RuntimeStepError(build_failure(code, why, env, py, props)) from None
    finally:
        if stage is not None and ended:
            remote.run(target, 'ct_remove_path.sh', [props['vmid'], WHEELHOUSE_IN_CT], check=False)
    return 'replaced' if replace else True


def build_failure(code, why, env, py, props) -> str:
    key = BUILD_KEYS.get(code)
    if code == 5:
        key = 'gpuhost:runtime.python.wheelhouse' if py.get('wheelhouse') else 'gpuhost:runtime.python.index'
    if code == 4:
        key = 'gpuhost:runtime.python.lock (%s)' % py['lock_path']
    fix = {3: 'check that the index answers from the host\'s network and the login, then re-run',
           4: 'if the lock is stale, compile it again (pip-compile --generate-hashes); otherwise the source serves '
              'other files than the lock was made from - find out why before re-running',
           5: 'add the missing files to the package source, or lock what it has',
           6: 'make the patch against the locked version of the package (git diff --no-renames in a checkout of it)',
           7: 'lock sglang at gpuhost:sglang.version',
           8: 'lock for the container\'s Python, or set gpuhost:runtime.python.version to it',
           9: 'free space in the container or grow its disk (gpuhost:container.rootfs_gb); previous environments are '
              'kept by gpuhost:runtime.python.keep',
           10: 'see above'}.get(code, 'see above')
    if code in (126, 127):
        why, fix = 'the container has no python3', 'install python3 in the container (debian-12-standard has it)'
    return ('%sbuilding the Python environment %s in container %s failed: %s; %s. Nothing was switched: the service '
            'runs its current environment and unit, untouched.' % (key + ': ' if key else '', env['path'],
                                                                    props['vmid'], why, fix))


def finish(target, props: dict, keep_ids: list) -> None:
    """After the environment serves: the venv path links to it, and only the environments in keep_ids (the
    current one, then the previous confirmed ones) stay."""
    env = props['env']
    py = props['install']['python']
    out = remote.run(target, 'ct_env_link.sh', [props['vmid'], props['venv'], env['path'], py['envs_dir']] +
                     list(keep_ids)).stdout
    for line in out.splitlines():
        what, _, path = line.partition('\t')
        if what == 'kept':
            warn('sglang-unit: %s in container %s is a directory (an environment made by hand before the program '
                 'managed it), so it was left as it is instead of becoming a link to %s; remove it once nothing '
                 'uses it' % (path, props['vmid'], env['path']))


def stop_jobs(target, props: dict) -> None:
    """Before the unit (and with it the container's runtime) goes: every install, staging or build job of this
    container still running is stopped, on the host and in the container."""
    vmid = str(props['vmid'])
    names = [('gpuhost-stage-%s-%s' % (kind, vmid), None) for kind in ('nvidia', 'cuda', 'wheelhouse')] + \
        [(name, vmid) for name in ('gpuhost-install-nvidia', 'gpuhost-install-cuda', 'gpuhost-envbuild')]
    for name, where in names:
        job = jobs.Job(name=name, label=name, spec='-', interpreter='bash', body='', vmid=where)
        res = jobs.call(target, job, 'stop', 'the SGLang unit is being deleted')
        if res.exit_code == 0 and jobs.parse_poll(res.stdout).stopped_now:
            info('sglang-unit: stopped job %s %s (the unit is being deleted)' % (name, job.where))
        if res.exit_code == 0:
            jobs.forget(target, job)   # its log and output: of a deployment that is gone


def confirmed_history(env_id: str, previous: list, keep: int) -> list:
    """The environments to keep, newest first: the one just confirmed, then up to `keep` confirmed before."""
    return [env_id] + [e for e in (previous or []) if e != env_id][:keep]
