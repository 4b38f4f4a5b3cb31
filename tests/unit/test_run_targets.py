"""tools/run.sh, as `make up|preview|check STACK=<stack>` call it: every stack gets the policy pack (and `up`
--refresh); only the lab stack starts the lab; only the lab's stacks are created when missing - any other stack
missing from the backend stops the target, naming the backend. The CLI and the lab are stand-ins that record how
they were called (the CLI keeps which stacks each backend has, and says what the real one says of a missing one)."""

import os
import shutil
import subprocess

import pytest

from tests.lablib import REPO

PULUMI = '''#!/bin/bash
echo "pulumi $*" >> "$CALLS"
echo "${PULUMI_BACKEND_URL:-}" >> "$CALLS.backend"
stack=${*: -1}
case "$*" in
  "stack output --json"*) echo '{}' ;;
  "stack select --create "*) echo "$PULUMI_BACKEND_URL $stack" >> "$CALLS.stacks" ;;
  "stack select "*)
    grep -qxF -- "$PULUMI_BACKEND_URL $stack" "$CALLS.stacks" 2>/dev/null || {
      echo "error: no stack named '$stack' found" >&2; exit 6; } ;;
esac
'''
PYTHON = '''#!/bin/bash
case "$1 $2" in
  "-m lab.labctl") echo "lab $*" >> "$CALLS"; echo '{"started": false}' ;;
  "-m tools.fleet_summary") cat >/dev/null ;;
  "-m tools.plain_secrets") ;;   # (the stand-in stacks have no config: tests/integration/test_plain_secrets.py)
  *) exec python3 "$@" ;;
esac
'''


# run.sh installs the lab's packages first when they are missing: not in a unit test.
LAB_PACKAGES = pytest.mark.skipif(not (os.path.exists('/usr/sbin/sshd') and shutil.which('systemd-nspawn')
                                       and shutil.which('mmdebstrap')), reason='the lab\'s packages are not installed')


@pytest.fixture
def checkout(tmp_path):
    root = tmp_path / 'checkout'
    (root / 'tools').mkdir(parents=True)
    shutil.copy(os.path.join(REPO, 'tools', 'run.sh'), root / 'tools' / 'run.sh')
    shutil.copytree(os.path.join(REPO, 'policy'), root / 'policy')
    (root / 'tools' / 'bootstrap.sh').write_text('#!/bin/bash\n')
    bin_ = tmp_path / 'bin'
    bin_.mkdir()
    for name, text in (('pulumi', PULUMI), ('python', PYTHON)):
        (bin_ / name).write_text(text)
    for p in [root / 'tools' / 'run.sh', root / 'tools' / 'bootstrap.sh', bin_ / 'pulumi', bin_ / 'python']:
        p.chmod(0o755)
    # As tools/bootstrap.sh writes it: the checkout's .state only when the environment names no backend.
    (root / '.env.sh').write_text('export PATH=%s:$PATH\nexport PULUMI_BACKEND_URL=${PULUMI_BACKEND_URL:-file://%s/.state}\n'
                                  % (bin_, root))
    return root, tmp_path / 'calls'


def existing(checkout, backend, stack):
    """A stack the operator made in a backend before."""
    root, calls = checkout
    with open(str(calls) + '.stacks', 'a') as f:
        f.write('%s %s\n' % (backend % {'root': root}, stack))


def run(checkout, *args, **env):
    root, calls = checkout
    e = dict(os.environ, CALLS=str(calls), **env)
    for k in ('PULUMI_CONFIG_PASSPHRASE', 'PULUMI_CONFIG_PASSPHRASE_FILE', 'PULUMI_BACKEND_URL'):
        if k not in env:
            e.pop(k, None)
    res = subprocess.run([str(root / 'tools' / 'run.sh')] + list(args), env=e, capture_output=True, text=True)
    return res, calls.read_text().splitlines() if calls.exists() else []


@LAB_PACKAGES
def test_up_of_a_real_stack_attaches_the_pack_refreshes_and_starts_no_lab(checkout):
    existing(checkout, 'file://%(root)s/.state', 'prod')
    res, calls = run(checkout, 'up', 'prod', '--yes', PULUMI_CONFIG_PASSPHRASE='x')
    assert res.returncode == 0, res.stderr
    assert not any(c.startswith('lab ') for c in calls), calls
    up = next(c for c in calls if c.startswith('pulumi up'))
    assert '--refresh' in up.split() and '--policy-pack policy' in up and up.endswith('--yes'), up


@LAB_PACKAGES
def test_up_of_the_lab_starts_the_lab_and_attaches_the_pack_with_its_config(checkout):
    res, calls = run(checkout, 'up')
    assert res.returncode == 0, res.stderr
    assert calls[0] == 'lab -m lab.labctl up', calls
    assert 'pulumi stack select --create --secrets-provider passphrase lab' in calls, calls
    up = next(c for c in calls if c.startswith('pulumi up'))
    assert '--refresh' in up.split() and '--policy-pack policy --policy-pack-config policy/config.lab.json' in up, up


@LAB_PACKAGES
def test_preview_of_a_real_stack_attaches_the_pack_and_asks_for_the_passphrase(checkout):
    res, calls = run(checkout, 'preview', 'prod')
    assert res.returncode == 2 and 'PULUMI_CONFIG_PASSPHRASE=gpuhost-prod-example' in res.stderr
    existing(checkout, 'file://%(root)s/.state', 'prod')
    res, calls = run(checkout, 'preview', 'prod', PULUMI_CONFIG_PASSPHRASE='gpuhost-prod-example')
    assert res.returncode == 0, res.stderr
    assert any(c.startswith('pulumi preview --diff --policy-pack policy') for c in calls), calls
    assert not any(c.startswith('lab ') for c in calls), calls


@LAB_PACKAGES
def test_the_lab_stack_stays_in_the_checkout_whatever_backend_the_operator_set(checkout):
    """A fresh lab forgets its stack (`stack rm`): in a shared backend that would be someone else's `lab`."""
    root, calls = checkout
    res, _ = run(checkout, 'up', PULUMI_BACKEND_URL='s3://shared/gpuhost')
    assert res.returncode == 0, res.stderr
    assert set(open(str(calls) + '.backend').read().split()) == {'file://%s/.state' % root}
    os.unlink(str(calls) + '.backend')
    existing(checkout, 's3://shared/gpuhost', 'prod')
    res, _ = run(checkout, 'up', 'prod', '--yes', PULUMI_CONFIG_PASSPHRASE='x', PULUMI_BACKEND_URL='s3://shared/gpuhost')
    assert res.returncode == 0, res.stderr
    assert set(open(str(calls) + '.backend').read().split()) == {'s3://shared/gpuhost'}


@LAB_PACKAGES
@pytest.mark.parametrize('target', [('check', 'prod'), ('preview', 'prod'), ('up', 'prod', '--yes')])
def test_a_stack_missing_from_the_default_backend_is_not_created_and_the_backend_is_named(checkout, target):
    """A new shell or CI job without PULUMI_BACKEND_URL: prod lives in the shared backend, not in .state."""
    root, calls_path = checkout
    existing(checkout, 's3://shared/gpuhost', 'prod')
    res, calls = run(checkout, *target, PULUMI_CONFIG_PASSPHRASE='x')
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert not any('--create' in c for c in calls) and not any(c.startswith(('pulumi up', 'pulumi preview'))
                                                               for c in calls), calls
    assert open(str(calls_path) + '.stacks').read() == 's3://shared/gpuhost prod\n'
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith('run: stack prod does not exist in the default backend file://%s/.state ' % root)
    assert 'PULUMI_BACKEND_URL is not set' in lines[0] and 'export PULUMI_BACKEND_URL=' in lines[0], lines[0]
    assert 'pulumi stack init --secrets-provider passphrase prod' in lines[0], lines[0]


@LAB_PACKAGES
def test_a_stack_missing_from_the_backend_the_operator_set_is_not_created_either(checkout):
    res, calls = run(checkout, 'check', 'site-b', PULUMI_CONFIG_PASSPHRASE='x', PULUMI_BACKEND_URL='s3://shared/gpuhost')
    assert res.returncode == 2 and not any('--create' in c for c in calls), (res.stderr, calls)
    assert res.stderr.startswith('run: stack site-b does not exist in the backend s3://shared/gpuhost '
                                 '(PULUMI_BACKEND_URL)'), res.stderr
