"""The lab's runtime pieces: the simulated SGLang refuses to start without the NVIDIA user space of the host
module's version or without CUDA, with the real messages; the simulated installers are the files
Pulumi.lab.yaml pins; the simulated SGLang's wheel is reproducible (its sha256 is the lab lock's)."""

import hashlib
import os
import sys

import pytest
import yaml

from tests import fakesglang

REPO = fakesglang.REPO
sys.path.insert(0, os.path.join(REPO, 'lab'))
import hostsim  # noqa: E402


def _module(path):
    """lab_runtime.py alone: the package around it needs its VERSION, which only a build writes."""
    import importlib.util
    spec = importlib.util.spec_from_file_location('lab_runtime', path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


lab_runtime = _module(os.path.join(REPO, 'lab', 'fakesglang', 'sglang', 'lab_runtime.py'))


@pytest.mark.parametrize('layout,message', [
    ({}, None),
    ({'driver': None}, 'Found no NVIDIA driver on your system'),
    ({'driver': '580.95.05', 'module': '580.105.08'}, 'Error 803: system has unsupported display driver / cuda driver '
                                                      'combination'),
    ({'cuda_home': None}, "No such file or directory: '/usr/local/cuda-13.0/bin/nvcc'"),
])
def test_the_simulated_sglang_needs_what_the_real_one_needs(tmp_path, layout, message):
    env = fakesglang.sysroot(tmp_path, **layout)
    env.setdefault('CUDA_HOME', '/usr/local/cuda-13.0')
    got = lab_runtime.problem(env)
    assert (got is None) if message is None else (message in got), got


@pytest.mark.parametrize('version,message', [
    ('13.0.2', None), ('13.1.0', None),
    ('12.9.1', 'The detected CUDA version (12.9) mismatches the version that was used to compile PyTorch (13.0)'),
])
def test_a_toolkit_of_another_major_than_torch_is_refused_as_torch_refuses_it(tmp_path, version, message):
    env = fakesglang.sysroot(tmp_path, cuda_home='/usr/local/cuda')
    with open(os.path.join(str(tmp_path), 'usr/local/cuda/version.json'), 'w') as f:
        f.write('{"cuda": {"name": "CUDA SDK", "version": "%s"}}' % version)
    got = lab_runtime.problem(env)
    assert (got is None) if message is None else (message in got), got


def test_no_cuda_home_is_the_real_error(tmp_path):
    env = fakesglang.sysroot(tmp_path)
    del env['CUDA_HOME']
    assert lab_runtime.problem(env) == lab_runtime.NO_CUDA_HOME


def test_the_lab_stack_pins_the_simulated_installers():
    with open(os.path.join(REPO, 'Pulumi.lab.yaml')) as f:
        rt = yaml.safe_load(f)['config']['gpuhost:runtime']
    nv, cuda = rt['nvidia'], rt['cuda']
    assert nv['version'] == hostsim.NVIDIA_VERSION and cuda['version'] == hostsim.CUDA_VERSION
    assert nv['installer'] == '/%s/%s' % (hostsim.ARTIFACTS, hostsim.nvidia_installer_name(nv['version']))
    assert cuda['installer'] == '/%s/%s' % (hostsim.ARTIFACTS, hostsim.cuda_installer_name(cuda['version']))
    # A change of the simulated installers' text must come with their new sha256 in Pulumi.lab.yaml.
    assert nv['sha256'] == hashlib.sha256(hostsim.nvidia_installer(nv['version']).encode()).hexdigest()
    assert cuda['sha256'] == hashlib.sha256(hostsim.cuda_installer(cuda['version']).encode()).hexdigest()


def test_the_simulated_sglang_wheel_is_reproducible(tmp_path, monkeypatch):
    from lab import sglang_wheel
    shas = []
    for n in range(2):
        monkeypatch.setattr(sglang_wheel, 'CACHE', str(tmp_path / str(n)))
        with open(sglang_wheel.wheel('0.5.23'), 'rb') as f:
            shas.append(hashlib.sha256(f.read()).hexdigest())
    assert shas[0] == shas[1]
