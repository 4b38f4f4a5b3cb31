"""Where state lives: a backend the operator set in the environment is the one used (.env.sh only defaults to
the checkout's .state), and `make clean` (tools/clean.sh) removes only the lab stacks' state from .state."""

import os
import shutil
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pulumi(cwd, backend, *args):
    env = dict(os.environ, PULUMI_BACKEND_URL=backend, PULUMI_CONFIG_PASSPHRASE='test', PULUMI_SKIP_UPDATE_CHECK='true',
               PULUMI_HOME=os.path.join(str(cwd), '.pulumi-home'))
    env.pop('PULUMI_CONFIG_PASSPHRASE_FILE', None)
    return subprocess.run(['pulumi'] + list(args), cwd=cwd, env=env, capture_output=True, text=True, check=True)


@pytest.fixture
def checkout(tmp_path):
    """A checkout's shape: Pulumi.yaml, tools/clean.sh, what bootstrap makes, and .state as a file backend."""
    (tmp_path / 'tools').mkdir()
    shutil.copy(os.path.join(REPO, 'tools', 'clean.sh'), tmp_path / 'tools' / 'clean.sh')
    shutil.copy(os.path.join(REPO, 'Pulumi.yaml'), tmp_path / 'Pulumi.yaml')
    for d in ('.venv', 'render', '.state'):
        (tmp_path / d).mkdir()
    return tmp_path


def stacks(cwd, backend):
    out = pulumi(cwd, backend, 'stack', 'ls', '--json').stdout
    import json
    return sorted(s['name'] for s in json.loads(out))


def test_make_clean_keeps_the_state_of_a_stack_that_is_not_the_lab(checkout):
    backend = 'file://%s' % (checkout / '.state')
    for stack in ('lab', 'lab-fleet', 'prod'):
        pulumi(checkout, backend, 'stack', 'init', '--secrets-provider', 'passphrase', stack)
    res = subprocess.run([str(checkout / 'tools' / 'clean.sh')], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert stacks(checkout, backend) == ['prod']
    assert 'kept .state' in res.stderr and 'prod' in res.stderr and 'pulumi stack export' in res.stderr
    assert not (checkout / '.venv').exists() and not (checkout / 'render').exists()


def test_make_clean_keeps_what_a_removed_real_stack_left(checkout):
    """`pulumi stack rm prod` leaves prod.json.bak and its history: the last record of a real host's deployment."""
    backend = 'file://%s' % (checkout / '.state')
    for stack in ('lab', 'prod'):
        pulumi(checkout, backend, 'stack', 'init', '--secrets-provider', 'passphrase', stack)
    pulumi(checkout, backend, 'stack', 'rm', '--yes', 'prod')
    res = subprocess.run([str(checkout / 'tools' / 'clean.sh')], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert 'kept .state' in res.stderr and 'prod' in res.stderr
    assert (checkout / '.state' / '.pulumi' / 'stacks' / 'gpuhost' / 'prod.json.bak').exists()


def test_make_clean_removes_state_that_only_the_lab_had(checkout):
    backend = 'file://%s' % (checkout / '.state')
    pulumi(checkout, backend, 'stack', 'init', '--secrets-provider', 'passphrase', 'lab')
    res = subprocess.run([str(checkout / 'tools' / 'clean.sh')], capture_output=True, text=True)
    assert res.returncode == 0 and res.stderr == '', res.stderr
    assert not (checkout / '.state').exists()


ENV_SH = os.path.join(REPO, '.env.sh')


@pytest.mark.skipif(not os.path.exists(ENV_SH), reason='no .env.sh: tools/bootstrap.sh writes it (every make target)')
def test_a_backend_set_in_the_environment_is_the_one_used(tmp_path):
    shutil.copy(os.path.join(REPO, 'Pulumi.yaml'), tmp_path / 'Pulumi.yaml')
    mine = tmp_path / 'shared-state'
    mine.mkdir()
    env = dict(os.environ, PULUMI_BACKEND_URL='file://%s' % mine, PULUMI_CONFIG_PASSPHRASE='test')
    env.pop('PULUMI_CONFIG_PASSPHRASE_FILE', None)
    res = subprocess.run(['bash', '-c', '. "$1" && echo "$PULUMI_BACKEND_URL" && '
                          'pulumi stack init --secrets-provider passphrase site-a >/dev/null', 'sh', ENV_SH],
                         cwd=tmp_path, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == 'file://%s' % mine
    assert [p.name for p in (mine / '.pulumi' / 'stacks' / 'gpuhost').iterdir() if p.name.endswith('.json')] == \
        ['site-a.json']
    # Without one: the checkout's own .state.
    env.pop('PULUMI_BACKEND_URL')
    res = subprocess.run(['bash', '-c', '. "$1" && echo "$PULUMI_BACKEND_URL"', 'sh', ENV_SH], env=env,
                         capture_output=True, text=True)
    assert res.stdout.strip() == 'file://%s/.state' % REPO
