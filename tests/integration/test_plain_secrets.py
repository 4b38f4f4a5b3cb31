"""A credential written as plain text in a stack's config is refused by `make up` / `make preview` (tools/run.sh)
before the Pulumi CLI starts: the CLI would record the stack's config, the credential in plain text, in the
backend's update history (an `up --skip-preview`, a refresh, a destroy), before the program - which refuses it too
(test_hostile.py) - or the policy pack runs (docs/operator-guide.md, "Credentials written as plain text").
The real CLI and a file backend in a temporary directory; no lab: nothing here gets as far as a host."""

import os
import secrets
import shutil
import stat
import subprocess

import pytest

from tests.lablib import REPO, make_project, project_env

# The pulumi the tests run, behind a stand-in that writes down each of its command lines first.
SHIM = '''#!/bin/sh
echo "pulumi $*" >> %(log)s
exec %(real)s "$@"
'''


@pytest.fixture(scope='module')
def project(tmp_path_factory):
    """A copy of the project that `make` runs in: the program, tools/ and the policy pack, its file backend and
    PULUMI_HOME (tests/lablib.py make_project); bootstrap a no-op (.env.sh puts the CLI and the venv on PATH)."""
    base = str(tmp_path_factory.mktemp('plain'))
    project = make_project(base)
    for name in ('Makefile', 'tools', 'policy'):
        src = os.path.join(REPO, name)
        (shutil.copytree if os.path.isdir(src) else shutil.copyfile)(src, os.path.join(project, name))
    with open(os.path.join(project, 'tools', 'bootstrap.sh'), 'w') as f:
        f.write('#!/bin/sh\n')
    real = shutil.which('pulumi')
    assert real, 'pulumi is not on PATH (. ./.env.sh first: docs/testing.md)'
    shim_dir = os.path.join(base, 'shim')
    os.makedirs(shim_dir)
    log = os.path.join(base, 'pulumi.calls')
    with open(os.path.join(shim_dir, 'pulumi'), 'w') as f:
        f.write(SHIM % {'log': log, 'real': real})
    os.chmod(os.path.join(shim_dir, 'pulumi'), stat.S_IRWXU)
    with open(os.path.join(project, '.env.sh'), 'w') as f:
        f.write('export PATH=%s:%s:$PATH\n' % (shim_dir, os.path.join(REPO, '.venv', 'bin')))
    return {'base': base, 'dir': project, 'env': project_env(base), 'log': log,
            'state': os.path.join(base, 'state')}


def cli(project, *args, input=None):
    """The real CLI, as the operator runs it to set a stack up (not through make: not written down)."""
    res = subprocess.run(['pulumi'] + list(args), cwd=project['dir'], env=project['env'], capture_output=True,
                         text=True, input=input, timeout=120)
    assert res.returncode == 0, res.stderr
    return res


def new_stack(project, name, *config):
    """A stack in the file backend, its config set with `pulumi config set` (config: argument lists)."""
    cli(project, 'stack', 'init', '--secrets-provider', 'passphrase', name)
    for args in config:
        cli(project, 'config', 'set', '--stack', name, *args)
    with open(os.path.join(project['dir'], 'Pulumi.%s.yaml' % name)) as f:
        return f.read()


def make(project, *args, env=None):
    if os.path.exists(project['log']):
        os.unlink(project['log'])
    res = subprocess.run(['make', '--no-print-directory'] + list(args), cwd=project['dir'],
                         env=dict(project['env'], **(env or {})), capture_output=True, text=True, timeout=280)
    calls = open(project['log']).read().splitlines() if os.path.exists(project['log']) else []
    return res, calls


def files_holding(root, text):
    hits = []
    for top, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(top, name), 'rb') as f:
                if text.encode() in f.read():
                    hits.append(os.path.relpath(os.path.join(top, name), root))
    return hits


@pytest.mark.parametrize('stack,target', [
    # The update starts at once: the CLI records it - the password with it - though the program refuses it.
    ('plain-skip', ('up', 'ARGS=--yes --skip-preview')),
    ('plain-up', ('up', 'ARGS=--yes')),     # a preview first
    ('plain-preview', ('preview',))], ids=['up --skip-preview', 'up', 'preview'])
def test_a_plain_password_is_refused_before_the_cli_starts_and_reaches_no_file_of_the_backend(project, stack, target):
    password = 'hunter2-pasted-' + secrets.token_hex(8)
    text = new_stack(project, stack, ['--path', 'gpuhost:host.api.password', password])
    assert password in text     # (where `pulumi config set` without --secret put it)
    before = files_holding(project['state'], password)
    assert before == []
    res, calls = make(project, target[0], 'STACK=' + stack, *target[1:])
    out = res.stdout + res.stderr
    assert files_holding(project['state'], password) == [], out[-3000:]
    assert calls == [], 'pulumi ran: %s' % calls
    assert res.returncode == 2, out[-3000:]
    assert ('run: stack %s: gpuhost:host.api.password is set as plain text in Pulumi.%s.yaml' % (stack, stack)
            in res.stderr), out[-3000:]
    assert ('Make it a secret: pulumi config rm --path gpuhost:host.api.password && pulumi config set --secret '
            '--path gpuhost:host.api.password') in res.stderr, out[-3000:]
    # What it says of the backend is what is there: no record of it (and none of this run).
    assert ('the update history in the backend, %s/.pulumi/history/gpuhost/%s/, holds no record of it): if that file '
            'was committed or shared, rotate it' % (project['state'], stack)) in res.stderr, out[-3000:]
    assert password not in out
    with open(os.path.join(project['dir'], 'Pulumi.%s.yaml' % stack)) as f:
        assert f.read() == text


def test_a_flat_key_and_a_config_flag_are_refused_too_and_no_passphrase_is_needed(project):
    """`pulumi config set gpuhost:sglang.api_key <key>` (neither --secret nor --path) writes a flat key the program
    does not read - but an update records it. A -c flag would be written into the stack's file, then recorded."""
    key = 'sk-plain-' + secrets.token_hex(8)
    token = 'hf_plain' + secrets.token_hex(8)
    new_stack(project, 'plain-flat', ['gpuhost:sglang.api_key', key])
    res, calls = make(project, 'up', 'STACK=plain-flat', 'ARGS=--yes -c gpuhost:model.token=%s' % token,
                      env={'PULUMI_CONFIG_PASSPHRASE': ''})
    out = res.stdout + res.stderr
    assert res.returncode == 2 and calls == [], (calls, out[-3000:])
    assert ('gpuhost:sglang.api_key is set as plain text in Pulumi.plain-flat.yaml (as the flat key '
            'gpuhost:sglang.api_key, as `pulumi config set` without --path writes it') in res.stderr, out[-3000:]
    assert ('Make it a secret: pulumi config rm gpuhost:sglang.api_key && pulumi config set --secret --path '
            'gpuhost:sglang.api_key') in res.stderr, out[-3000:]
    assert 'gpuhost:model.token is given as plain text on the command line' in res.stderr, out[-3000:]
    assert 'PULUMI_CONFIG_PASSPHRASE' not in res.stderr, out[-3000:]
    assert key not in out and token not in out
    assert files_holding(project['state'], key) == [] and files_holding(project['dir'], token) == []


def test_a_password_set_as_a_secret_goes_on_to_the_cli(project):
    password = 'hunter2-secret-' + secrets.token_hex(8)
    cli(project, 'stack', 'init', '--secrets-provider', 'passphrase', 'secure')
    cli(project, 'config', 'set', '--stack', 'secure', '--secret', '--path', 'gpuhost:host.api.password',
        input=password)
    res, calls = make(project, 'preview', 'STACK=secure')
    out = res.stdout + res.stderr
    assert 'is set as plain text' not in res.stderr, out[-3000:]
    # The CLI ran the preview (the program refuses this bare config for what it lacks, not for the password).
    assert any(c.startswith('pulumi preview --diff --policy-pack policy') for c in calls), (calls, out[-3000:])
    assert password not in out
