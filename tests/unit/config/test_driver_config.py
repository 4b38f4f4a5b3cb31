"""gpuhost:nvidia.driver (issue 59): one declared version for the host's kernel module and the container's user
space - gpuhost:runtime.nvidia follows it, a different one is refused at preview with the key, the values and the
fix; the installer's name must be the version's; only the open modules; absent, nothing changes."""

import copy

import pytest

import config
from tests.unit.config.test_config import lab_data

B = '580.105.08'
RUN_B = '/root/gpuhost-artifacts/NVIDIA-Linux-x86_64-%s.run' % B


def with_driver(driver, runtime_nvidia=None, drop_runtime_nvidia=True):
    data = copy.deepcopy(lab_data())
    data['nvidia'] = dict(data.get('nvidia') or {}, driver=driver)
    if drop_runtime_nvidia:
        data['runtime'].pop('nvidia', None)
    if runtime_nvidia is not None:
        data['runtime']['nvidia'] = runtime_nvidia
    return config.parse(data)


def test_absent_the_driver_is_the_operators_and_the_runtime_stays_as_declared():
    d = config.parse(copy.deepcopy(lab_data()))
    assert d.nvidia.driver is None
    assert d.runtime.nvidia.version == '580.95.05'


def test_the_containers_user_space_follows_the_declared_driver():
    d = with_driver({'version': B, 'installer': RUN_B, 'sha256': 'b' * 64})
    assert d.nvidia.driver.modules == 'open'
    assert (d.runtime.nvidia.version, d.runtime.nvidia.installer, d.runtime.nvidia.sha256) == (B, RUN_B, 'b' * 64)
    # ... also where gpuhost:runtime is not declared at all: the user space must follow a module the program changes.
    data = copy.deepcopy(lab_data())
    data.pop('runtime')
    data['nvidia'] = {'driver': {'version': B, 'source': 'https://mirror.example/NVIDIA-Linux-x86_64-%s.run' % B,
                                 'sha256': 'b' * 64}}
    d = config.parse(data)
    assert d.runtime.nvidia.version == B and d.runtime.nvidia.host_path.endswith('NVIDIA-Linux-x86_64-%s.run' % B)
    assert d.runtime.cuda is None and d.runtime.python is None


def test_a_runtime_at_the_same_version_may_name_its_own_file():
    other = '/root/other/NVIDIA-Linux-x86_64-%s.run' % B
    d = with_driver({'version': B, 'installer': RUN_B, 'sha256': 'b' * 64},
                    runtime_nvidia={'version': B, 'installer': other, 'sha256': 'b' * 64})
    assert d.runtime.nvidia.installer == other


def test_a_runtime_at_another_version_is_refused_with_the_fix():
    with pytest.raises(config.ConfigError) as e:
        with_driver({'version': B, 'installer': RUN_B, 'sha256': 'b' * 64},
                    runtime_nvidia={'version': '580.95.05', 'sha256': 'a' * 64,
                                    'installer': '/root/NVIDIA-Linux-x86_64-580.95.05.run'})
    text = str(e.value)
    assert 'gpuhost:runtime.nvidia.version: 580.95.05, but gpuhost:nvidia.driver.version is %s' % B in text
    assert 'Remove gpuhost:runtime.nvidia' in text and 'Driver/library version mismatch' in text


@pytest.mark.parametrize('driver, message', [
    ({'version': B, 'installer': '/root/NVIDIA-Linux-x86_64-580.95.05.run', 'sha256': 'b' * 64},
     'gpuhost:nvidia.driver.installer: \'/root/NVIDIA-Linux-x86_64-580.95.05.run\' installs driver 580.95.05, but '
     'version is %s' % B),
    ({'version': B, 'sha256': 'b' * 64}, 'gpuhost:nvidia.driver: set exactly one of installer'),
    ({'version': B, 'installer': RUN_B, 'sha256': 'b' * 64, 'modules': 'proprietary'}, 'gpuhost:nvidia.driver.modules'),
    ({'version': '580.95.05; reboot', 'installer': RUN_B, 'sha256': 'b' * 64}, 'gpuhost:nvidia.driver.version'),
    ({'version': B, 'installer': RUN_B, 'sha256': 'B' * 64}, 'gpuhost:nvidia.driver.sha256'),
    ({'version': B, 'source': 'http://mirror.example/NVIDIA-Linux-x86_64-%s.run' % B, 'sha256': 'b' * 64,
      'token': 'abc'}, 'gpuhost:nvidia.driver.token needs an https:// source'),
])
def test_refusals_name_the_key(driver, message):
    with pytest.raises(config.ConfigError) as e:
        with_driver(driver)
    assert message in str(e.value)


def test_cuda_13_still_needs_a_580_driver_when_it_follows_the_driver():
    data = copy.deepcopy(lab_data())
    data['runtime'].pop('nvidia')
    data['nvidia'] = {'driver': {'version': '570.86.15', 'installer': '/root/NVIDIA-Linux-x86_64-570.86.15.run',
                                 'sha256': 'b' * 64}}
    with pytest.raises(config.ConfigError, match='570.86.15 is too old for CUDA 13.0.2'):
        config.parse(data)
