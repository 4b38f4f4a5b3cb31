"""What a lock's wheels need of the container (grammar/wheeltags.py), and the preview's refusal of a lock whose wheels
cannot run in the stack's container (config/load.py platform_check), naming the package, what it needs and what the
container has."""

import os
import shutil

import pytest

import config
from grammar import pylock, wheeltags

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
H = ['%064x' % i for i in range(1, 9)]


@pytest.mark.parametrize('name, python, glibc, ok', [
    ('torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl', '3.11', '2.36', True),
    ('torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl', '3.12', '2.36', False),
    ('torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl', '3.11', '2.27', False),
    ('sglang_kernel-0.4.10-cp310-abi3-manylinux_2_34_x86_64.whl', '3.11', '2.36', True),
    ('sglang_kernel-0.4.10-cp310-abi3-manylinux_2_34_x86_64.whl', '3.9', '2.36', False),
    ('sglang_kernel-0.4.10-cp310-abi3-manylinux_2_34_x86_64.whl', '3.11', '2.31', False),
    ('aiohttp-3.14.5-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl', '3.11', '2.17', True),
    ('frozenlist-1.8.0-cp311-cp311-manylinux1_x86_64.manylinux_2_28_x86_64.manylinux_2_5_x86_64.whl', '3.11', '2.5',
     True),
    ('pip-26.3-py3-none-any.whl', '3.9', '2.5', True),
    ('numpy-2.4.0-cp311-cp311-manylinux_2_28_aarch64.whl', '3.11', '2.36', False),
    ('numpy-2.4.0-cp311-cp311-musllinux_1_2_x86_64.whl', '3.11', '2.36', False),
    ('numpy-2.4.0-cp311-cp311-macosx_14_0_arm64.whl', '3.11', '2.36', False),
])
def test_what_a_wheel_runs_on(name, python, glibc, ok):
    assert wheeltags.Wheel(name).runs_on(python, glibc) is ok


def test_what_a_wheel_needs_in_words():
    assert wheeltags.Wheel('sglang-0.5.23-py3-none-manylinux_2_34_x86_64.whl').needs() == \
        'Python 3, glibc 2.34 or newer'
    assert wheeltags.Wheel('x-1-cp310-abi3-manylinux_2_28_x86_64.whl').needs() == 'Python 3.10 or newer, glibc 2.28 ' \
        'or newer'
    with pytest.raises(wheeltags.NotAWheel):
        wheeltags.Wheel('sglang-0.5.23.tar.gz')


def lock_text(sglang_wheel='sglang-0.5.23-py3-none-manylinux_2_34_x86_64.whl'):
    return ('sglang==0.5.23 \\\n    --hash=sha256:%s\n    # wheel: %s 1000\n    # via -r runtime/sglang.in\n'
            'pip==26.3 --hash=sha256:%s\n    # wheel: pip-26.3-py3-none-any.whl 2000\n'
            'torch==2.14.1 --hash=sha256:%s --hash=sha256:%s\n'
            '    # wheel: torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl 900000000\n'
            '    # wheel: torch-2.14.1-cp312-cp312-manylinux_2_28_x86_64.whl 900000001\n' % (
                H[0], sglang_wheel, H[1], H[2], H[3]))


def test_the_lock_names_its_wheels_and_what_installing_it_downloads():
    lock = pylock.parse(lock_text())
    assert lock.get('torch').wheels == [('torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl', 900000000),
                                        ('torch-2.14.1-cp312-cp312-manylinux_2_28_x86_64.whl', 900000001)]
    assert wheeltags.download_bytes(lock.pins.values()) == 1000 + 2000 + 900000000
    # The comments are not the lock's meaning: the same environment with or without them.
    assert lock.canonical() == pylock.parse('\n'.join(
        line for line in lock_text().splitlines() if 'wheel:' not in line) + '\n').canonical()


@pytest.fixture
def prod(tmp_path):
    shutil.copyfile(os.path.join(REPO, 'Pulumi.prod.yaml'), tmp_path / 'Pulumi.prod.yaml')
    (tmp_path / 'runtime').mkdir()
    from tools import render
    return tmp_path, render.load('prod', REPO)


def test_the_preview_refuses_a_lock_whose_wheels_need_a_newer_glibc_than_the_containers(prod):
    root, d = prod
    (root / 'runtime' / 'sglang.lock').write_text(lock_text('sglang-0.5.23-py3-none-manylinux_2_39_x86_64.whl'))
    with pytest.raises(config.ConfigError) as e:
        config.runtime_inputs(d, str(root), read_secrets=False)
    assert str(e.value) == (
        'gpuhost:runtime.python.lock (runtime/sglang.lock): sglang 0.5.23 needs Python 3, glibc 2.39 or newer; the '
        'container (gpuhost:container.ostemplate: debian-12) has glibc 2.36 and Python 3.11. Make the lock for that '
        'container (make lock STACK=<stack>), or pin a version with a wheel for it in the lock\'s .in')


def test_the_preview_takes_a_lock_whose_wheels_run_in_the_container(prod):
    root, d = prod
    (root / 'runtime' / 'sglang.lock').write_text(lock_text())
    assert config.runtime_inputs(d, str(root), read_secrets=False)['packages']['sglang'] == '0.5.23'


def test_the_committed_lock_names_a_wheel_for_every_pin_that_runs_on_debian_12():
    with open(os.path.join(REPO, 'runtime', 'sglang.lock')) as f:
        lock = pylock.parse(f.read())
    assert all(p.wheels for p in lock.pins.values()), [p.name for p in lock.pins.values() if not p.wheels]
    assert wheeltags.unfit(lock.pins.values(), '3.11', '2.36') == []
    assert wheeltags.unfit(lock.pins.values(), '3.11', '2.31'), 'sglang 0.5.23 needs glibc 2.34 (issue 47)'


def test_the_preflight_judges_the_wheels_against_the_running_containers_own_glibc_and_python(prod, monkeypatch):
    """An adopted container, or one made from a template the program does not know: its own glibc and Python (read in
    it by ct_platform.sh) decide. A container that does not run yet was judged by its template at preview."""
    from components import preflight
    from transport import remote
    root, d = prod
    (root / 'runtime' / 'sglang.lock').write_text(lock_text())
    files = config.runtime_inputs(d, str(root), read_secrets=False)
    assert files['wheels']['sglang'] == ['0.5.23', ['sglang-0.5.23-py3-none-manylinux_2_34_x86_64.whl']]
    said = {}
    monkeypatch.setattr(preflight, '_platform', lambda ctx: remote.Result(said['out'], '', 0))
    ctx = preflight.Context(d, {}, {}, None, files)
    said['out'] = 'glibc 2.31 python 3.11\n'
    assert preflight._lock_fits(ctx) == (
        'gpuhost:runtime.python.lock (runtime/sglang.lock): sglang 0.5.23 needs Python 3, glibc 2.34 or newer; '
        'container 200 (read in it: getconf GNU_LIBC_VERSION, python3) has glibc 2.31 and Python 3.11. Make the lock '
        'for that container (make lock STACK=<stack>), or pin a version with a wheel for it in the lock\'s .in. '
        'Nothing was changed on the host.')
    said['out'] = 'glibc 2.41 python 3.13\n'
    assert 'torch 2.14.1 needs Python 3.11, glibc 2.28 or newer; Python 3.12, glibc 2.28 or newer; container 200 ' \
           '(read in it: getconf GNU_LIBC_VERSION, python3) has glibc 2.41 and Python 3.13' in preflight._lock_fits(ctx)
    for fine in ('glibc 2.36 python 3.11\n', 'absent\n', 'glibc  python \n'):
        said['out'] = fine
        assert preflight._lock_fits(ctx) is None, fine
    # A lock made by hand names no wheels: nothing to judge, nothing read.
    said['out'] = 'glibc 2.31 python 3.11\n'
    assert preflight._lock_fits(preflight.Context(d, {}, {}, None, dict(files, wheels={}))) is None
