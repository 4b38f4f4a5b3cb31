"""make lock (tools/lock.py) before it resolves anything: the container platform it resolves for, read from the stack,
and the refusals that name what to fix. (Resolving against an index, logged in: tests/integration/test_runtime.py.)"""

import os
import shutil

import pytest
import yaml

from grammar import distro
from tools import lock

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_platform_of_proxmox_templates():
    assert distro.of_template('local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst') == ('debian-12', '2.36', '3.11')
    assert distro.of_template('nfs:vztmpl/ubuntu-24.04-standard_24.04-2_amd64.tar.zst') == ('ubuntu-24.04', '2.39',
                                                                                          '3.12')
    assert distro.manylinux('2.36') == 'x86_64-manylinux_2_36'
    with pytest.raises(distro.UnknownTemplate, match='alpine-3.20-default.*ldd --version'):
        distro.of_template('local:vztmpl/alpine-3.20-default_20240908_amd64.tar.xz')


@pytest.fixture
def project(tmp_path):
    shutil.copyfile(os.path.join(REPO, 'Pulumi.prod.yaml'), tmp_path / 'Pulumi.prod.yaml')
    return tmp_path


def edit(project, fn):
    path = project / 'Pulumi.prod.yaml'
    doc = yaml.safe_load(path.read_text())
    fn(doc['config'])
    path.write_text(yaml.safe_dump(doc))


def refused(project, *args):
    with pytest.raises(lock.LockFailed) as e:
        lock.run('prod', str(project), *args, uv='/nonexistent/uv')
    return str(e.value)


def test_the_prod_stack_locks_for_debian_12(project):
    (d, glibc, python), = lock.targets('prod', str(project))
    assert (glibc, python, d.runtime.python.lock) == ('2.36', '3.11', 'runtime/sglang.lock')


def test_a_missing_in_file_is_named_with_what_to_write(project):
    assert refused(project) == ('runtime/sglang.in is missing: write what the environment needs there (sglang==0.5.23 '
                                'and pip, one per line; extras and pins of your own beside them), then run make lock '
                                'again')


def test_a_template_of_unknown_glibc_is_refused_before_resolving(project):
    edit(project, lambda c: c['gpuhost:container'].update(ostemplate='local:vztmpl/alpine-3.20-default_1_amd64.tar.xz'))
    assert 'gpuhost:container.ostemplate: local:vztmpl/alpine-3.20-default_1_amd64.tar.xz is not a template whose C ' \
           'library the program knows' in refused(project)


def test_a_wheelhouse_stack_needs_the_index_named(project):
    def wheelhouse(c):
        c['gpuhost:runtime']['python'].pop('index')
        c['gpuhost:runtime']['python']['wheelhouse'] = '/root/wheels'
    edit(project, wheelhouse)
    (project / 'runtime').mkdir()
    (project / 'runtime' / 'sglang.in').write_text('sglang==0.5.23\npip\n')
    assert 'make lock STACK=prod INDEX=<url>' in refused(project)


def test_a_stack_without_a_managed_environment_has_nothing_to_lock(project):
    edit(project, lambda c: c.pop('gpuhost:runtime'))
    assert refused(project) == 'stack prod declares no gpuhost:runtime.python (its lock and index): nothing to lock'


def test_the_committed_lock_is_one_the_prod_stack_accepts():
    """What `make lock STACK=prod` wrote: sglang at the stack's version, pip, a CUDA-13 torch, every pin hashed."""
    from grammar import pylock
    with open(os.path.join(REPO, 'runtime', 'sglang.lock')) as f:
        pins = pylock.parse(f.read())
    assert pins.get('sglang').version == '0.5.23' and pins.get('pip') is not None
    assert pins.get('torch') is not None and any(k.endswith('-cu13') for k in pins.pins), sorted(pins.pins)[:20]
