"""The host's NVIDIA driver declared (gpuhost:nvidia.driver; issue 59) on a deployed lab stack: declared at the version
the host runs, the first `up` adopts it and changes nothing; a new version is priced at preview (old -> new, reloaded
in place, SGLang stops) and, until the upgrade lands (docs/driver-plan.md step 3), `up` stops at the driver with one
line and the host unchanged; a kernel installed without the module is warned at preview as a build."""

import copy
import re

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
STACK = 'driver'
A, B = '580.95.05', '580.105.08'
RUN = '/root/gpuhost-artifacts/NVIDIA-Linux-x86_64-%s.run'


def with_driver(cfg, version, sha256=None):
    cfg = copy.deepcopy(cfg)
    declared = cfg['gpuhost:runtime'].pop('nvidia')
    cfg['gpuhost:nvidia'] = dict(cfg.get('gpuhost:nvidia') or {}, driver={
        'version': version, 'installer': RUN % version, 'sha256': sha256 or declared['sha256']})
    return cfg


@pytest.fixture(scope='module')
def deployed(lab):
    cfg = lab.stack_config()
    lab.write_stack(STACK, with_driver(cfg, A))
    res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    return lab, cfg, res


def one_line(text):
    return ' '.join(text.split())


def test_declared_at_the_running_version_the_first_up_adopts_it_and_a_second_changes_nothing(deployed):
    lab, _, res = deployed
    assert 'host-nvidia-driver: ' not in res.stdout     # no price, no warning: nothing to do
    kernel = lab.host.spec['kernel']      # the lab host's running kernel (uname -r there), a Proxmox one
    assert kernel.endswith('-pve')
    assert lab.outputs(STACK)['nvidia_driver'] == {
        'declared': A, 'loaded': A, 'modules': 'open', 'installed': {kernel: A}, 'kernels_missing': [],
        'running_kernel': kernel}
    digest, starts = lab.host_digest(), lab.unit_starts()
    again = lab.preview_json(STACK, '--refresh')
    changed = [s for s in again['steps'] if s['op'] not in ('same', 'read', 'refresh')]
    assert changed == [], changed
    assert (lab.host_digest(), lab.unit_starts()) == (digest, starts)


def test_a_new_version_is_priced_at_preview_and_up_stops_at_it_with_the_host_unchanged(deployed):
    lab, cfg, _ = deployed
    lab.write_stack(STACK, with_driver(cfg, B, sha256='b' * 64))
    try:
        digest, starts = lab.host_digest(), lab.unit_starts()
        res = lab.pulumi('preview', '--diff', stack=STACK)
        pre = one_line(res.stdout + res.stderr)    # with --diff the CLI writes the diagnostics to stderr
        assert ('host-nvidia-driver: 580.95.05 -> 580.105.08 (open kernel modules, built with DKMS for kernels '
                '%s): the modules can be reloaded in place (nothing but SGLang holds them): SGLang in '
                'container 200 (sglang-qwen.service) stops for it, then restarts on the new user space. The VM\'s '
                'GPUs stay on vfio-pci, untouched. This release does not change a host\'s driver yet' % lab.host.spec['kernel']) in pre, pre
        assert re.search(r'~ version *: "580.95.05" => "580.105.08"', pre), pre
        res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
        assert res.returncode != 0
        out = one_line(res.stdout)
        assert ('gpuhost: host-nvidia-driver: 580.95.05 -> 580.105.08 (open kernel modules, built with DKMS for '
                'kernels %s)' % lab.host.spec['kernel']) in out and '`up` stops at this step with nothing changed' in out, out
        assert (lab.host_digest(), lab.unit_starts()) == (digest, starts)
        assert lab.host.nvidia_module() == A
    finally:
        lab.write_stack(STACK, with_driver(cfg, A))


def test_a_kernel_without_the_module_is_warned_at_preview_as_a_build(deployed):
    lab, _, _ = deployed
    lab.host.install_kernel('6.8.12-9-pve')
    try:
        res = lab.pulumi('preview', '--refresh', '--diff', stack=STACK)
        pre = one_line(res.stdout + res.stderr)
        assert ('host-nvidia-driver: DANGER - kernel 6.8.12-9-pve has no nvidia 580.95.05 module built: a boot into '
                'it runs without the GPU driver') in pre, pre
        assert ('host-nvidia-driver: the loaded module is 580.95.05 as declared, but kernel 6.8.12-9-pve has no '
                'nvidia 580.95.05 module built') in pre, pre
    finally:
        lab.host.remove_kernel('6.8.12-9-pve')
