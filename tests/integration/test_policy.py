"""The policy pack (policy/) through the real CLI: `pulumi preview --policy-pack policy` of a program
that builds gpuhost's components from a doctored deployment or with doctored inputs
(tests/policy_program/), so config/ is bypassed and only the pack stands in the way. Preview
contacts no host: no lab, a file backend in a temporary directory.

Each violating preview carries several violations with distinct messages (one preview per kind of
bypass, not per rule); every rule also has a passing preview."""

import json
import os
import re
import shutil
import subprocess

import pytest

from tests.lablib import PROJECT_FILES, REPO

POLICY = os.path.join(REPO, 'policy')
PROGRAM = os.path.join(REPO, 'tests', 'policy_program')
RULES = ('no-identity-iommu', 'vfio-by-address', 'gpu-one-side', 'p2p-off', 'speculation-triple',
         'tp-equals-container-gpus', 'root-pam-password', 'sglang-private-bind', 'vm-gpus-by-mapping')


@pytest.fixture(scope='module')
def program(tmp_path_factory):
    base = tmp_path_factory.mktemp('policy')
    proj = base / 'program'
    proj.mkdir()
    for name in ('Pulumi.yaml', '__main__.py'):
        shutil.copyfile(os.path.join(PROGRAM, name), proj / name)
    # The resources are the gpuhost provider plugin's: the CLI starts it from the repository.
    with open(proj / 'Pulumi.yaml', 'a') as f:
        f.write('plugins:\n  providers:\n    - name: gpuhost\n      path: %s\n' % os.path.join(REPO, 'provider'))
    os.symlink(os.path.join(REPO, '.venv'), proj / '.venv')
    (base / 'state').mkdir()
    env = dict(os.environ, PULUMI_BACKEND_URL='file://%s' % (base / 'state'), PULUMI_HOME=str(base / 'home'),
               PULUMI_CONFIG_PASSPHRASE='gpuhost-policy-test', PULUMI_SKIP_UPDATE_CHECK='true',
               PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION='true', GPUHOST_REPO=REPO,
               # The program imports components/ from the repository.
               PYTHONPATH=REPO)
    env.pop('PULUMI_CONFIG_PASSPHRASE_FILE', None)
    install_command_plugin(env)
    subprocess.run(['pulumi', 'stack', 'select', '--create', '--secrets-provider', 'passphrase', 'policytest'],
                   cwd=proj, env=env, check=True, capture_output=True)
    return proj, env, base


def install_command_plugin(env):
    """pulumi-command's provider in the test's PULUMI_HOME (the components may use it), from the binary
    tools/bootstrap.sh cached, as the lab's project copies get it."""
    res = subprocess.run([os.path.join(REPO, 'tools', 'install-command-plugin.sh'), env['PULUMI_HOME']], env=env,
                         capture_output=True, text=True)
    assert res.returncode == 0, 'install-command-plugin.sh failed:\n' + res.stderr


def preview(program, case=None, config=None):
    """`pulumi preview --policy-pack policy [--policy-pack-config FILE]`: (exit code, output)."""
    proj, env, base = program
    argv = ['pulumi', 'preview', '--policy-pack', POLICY]
    if config is not None:
        path = config if isinstance(config, str) else str(base / 'policy-config.json')
        if not isinstance(config, str):
            with open(path, 'w') as f:
                json.dump(config, f)
        argv += ['--policy-pack-config', path]
    res = subprocess.run(argv, cwd=proj, env=dict(env, GPUHOST_POLICY_CASE=json.dumps(case or {})),
                         capture_output=True, text=True, timeout=300)
    out = res.stdout + res.stderr
    assert 'Traceback' not in out, out[-4000:]
    return res.returncode, out


def findings(out):
    """{(level, rule, resource name): [message, ...]} from the Policies section, or (preview --diff, as
    `make preview` runs it) from the lines the violations print inline."""
    found = {}
    lines = out.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r'^\s+- \[(mandatory|advisory)\]\s+(\S+)\s+\((\S+): (\S+)\)$', line)
        if m:  # the policy's description, then its message
            found.setdefault((m.group(1), m.group(2), m.group(4)), []).append(lines[i + 2].strip())
            continue
        m = re.match(r'^\s*gpuhost-safety@v\S+ \[(mandatory|advisory)\]\s+(\S+)\s+\((\S+): (\S+)\)', line)
        if m:  # the description follows on the same line, the message on the next
            found.setdefault((m.group(1), m.group(2), m.group(4)), []).append(lines[i + 1].strip())
    return found


def test_the_lab_deployment_passes_every_rule_with_the_lab_opt_in(program):
    code, out = preview(program, config=os.path.join(POLICY, 'config.lab.json'))
    assert code == 0, out[-4000:]
    got = findings(out)
    assert list(got) == [('advisory', 'relaxed-rules', 'gpuhost-policy-test-policytest')], got
    assert got[list(got)[0]] == ['stack policytest: the policy config relaxes the safety rules - opt-ins: '
                                 'sglang-private-bind: allow_public_bind: true. Every other rule is mandatory.']


def test_a_private_bind_passes_every_rule_with_no_policy_config(program):
    code, out = preview(program, {'model': {'sglang.host': '127.0.0.4'}})
    assert code == 0, out[-4000:]
    assert findings(out) == {} and '✅ gpuhost-safety@v1.0.0' in out


def test_the_lab_deployment_without_its_opt_in_is_stopped_for_its_wildcard_bind(program):
    code, out = preview(program)
    assert code != 0
    got = findings(out)
    assert list(got) == [('mandatory', 'sglang-private-bind', 'sglang-unit')], got
    assert got[('mandatory', 'sglang-private-bind', 'sglang-unit')] == [
        'sglang-unit: SGLang would listen on every address of the container (--host 0.0.0.0, port 30000) without an '
        'opt-in. Fix: bind the container\'s private address (gpuhost:sglang.host: 127.0.0.4), or opt in for this '
        'stack in policy/config.<stack>.json: {"sglang-private-bind": {"allow_public_bind": true}}']


DOCTORED_MODEL = {
    'model': {'iommu.extra_kernel_args': ['iommu.passthrough=on', 'vfio-pci.ids=10de:2bb5'],
              'vm.gpus': ['0000:01:00.0', '0000:91:00.0', '0000:e1:00.0', '0000:f1:00.0'],
              'nvidia.dma_remap_peer_mmio': 0, 'sglang.environment': {'NCCL_P2P_DISABLE': '0'},
              'sglang.speculative.num_draft_tokens': 3, 'sglang.tp': 2, 'sglang.host': '203.0.113.5',
              # A mapping id with a comma: in `hostpciN: mapping=<id>,pcie=1` it would add x-vga=1.
              'vm.gpu_mapping_prefix': 'gpu,x-vga=1,n'},
    'api': {'user': 'gpuhost@pve'}}


def test_a_deployment_that_bypasses_config_validation_is_stopped_by_every_rule(program):
    """The config model refuses each of these; built with model_copy, only the pack sees them."""
    code, out = preview(program, DOCTORED_MODEL)
    assert code != 0 and 'preview failed' in out
    got = findings(out)
    assert {r for _, r, _ in got} == set(RULES), got
    assert all(level == 'mandatory' for level, _, _ in got)

    def one(rule, name, *parts):
        msgs = got.get(('mandatory', rule, name)) or []
        hits = [m for m in msgs if all(p in m for p in parts)]
        assert hits, (rule, name, parts, msgs)

    one('no-identity-iommu', 'host-kernel-cmdline', "ensure_args puts 'iommu.passthrough=on' on the kernel command "
        "line", 'identity (passthrough)', 'FSP error 0x177', 'Fix: remove it', 'gpuhost:iommu.domain: DMA-FQ')
    one('vfio-by-address', 'host-kernel-cmdline', "'vfio-pci.ids=10de:2bb5'", 'vendor:device ID',
        'Fix: remove it; bind the VM\'s GPUs by PCI address')
    one('vfio-by-address', 'host-vfio', "devices[0] 0000:01:00.0 is one of the container's GPUs",
        'Fix: give it to one side only')
    one('gpu-one-side', 'vm-pci-mappings', "mapping gpu,x-vga=1,n0 points its entry for node pve-lab at 0000:01:00.0, "
        'a container GPU', 'Fix: a GPU goes to one side only')
    one('vm-gpus-by-mapping', 'vm-pci-mappings', "mapping id 'gpu,x-vga=1,n0' is not a Proxmox mapping id",
        'Fix: gpuhost:vm.gpu_mapping_prefix')
    one('vm-gpus-by-mapping', 'vm-qemu', 'hostpci0 names mapping gpu, which no PciMappings resource of this run '
        'declares')
    one('p2p-off', 'host-nvidia-options', "/etc/modprobe.d/gpuhost-nvidia.conf sets NVreg_DmaRemapPeerMmio='0'",
        'Fix: write "options nvidia NVreg_DmaRemapPeerMmio=1"')
    one('p2p-off', 'sglang-unit', "the unit sets NCCL_P2P_DISABLE='0'", 'Fix: Environment="NCCL_P2P_DISABLE=1"')
    one('speculation-triple', 'sglang-unit', '--speculative-eagle-topk 1 with --speculative-num-steps 1 needs '
        '--speculative-num-draft-tokens 2', 'the unit says 3', 'Fix: gpuhost:sglang.speculative.num_draft_tokens: 2')
    one('tp-equals-container-gpus', 'sglang-unit', '--tp-size 2, but container 200 (container-lxc) has 4 GPUs',
        'Fix: gpuhost:sglang.tp: 4')
    one('root-pam-password', 'container-lxc', 'the API user is not root@pam', 'Fix: gpuhost:host.api.user: root@pam')
    # Through mappings, hostpciN needs no root@pam (Mapping.Use); amd-sev and affinity still do.
    one('root-pam-password', 'vm-qemu', 'sets affinity, amd-sev (', 'the API user is not root@pam')
    one('sglang-private-bind', 'sglang-unit', 'a public address (--host 203.0.113.5, port 30000)',
        'Fix: bind the container\'s private address')
    assert 'gpuhost@pve' not in out and 'policy-test-password' not in out


def test_a_token_login_in_the_providers_configuration_is_refused_by_the_plugin_before_the_pack(program):
    """The gpuhost provider's CheckConfig judges its configuration as the config package judges the stack: an API
    token and no password is refused at preview, naming the keys and the stack settings, the token never shown."""
    code, out = preview(program, {'api': {'token_id': 'root@pam!ci', 'token_secret': 'tok-SECRET-value-123',
                                          'password': None}})
    assert code != 0
    assert 'api.password is required and missing (from gpuhost:host.api.password (or password_file))' in out, out[-3000:]
    assert 'api.token_id is not a key the gpuhost provider takes' in out, out[-3000:]
    assert 'tok-SECRET' not in out


def test_inputs_written_past_the_components_are_stopped_in_any_spelling(program):
    case = {'props': {
        'host-kernel-cmdline': {'ensure_args': ['iommu.passthrough=0', 'quiet iommu=pt,nofoo']},
        'host-nvidia-options': {'content': {'__sub__': [['options nvidia', 'options vfio_pci ids=10de:2bb5\n'
                                                                            'options nvidia']]}},
        'vm-qemu': {'config': {'hostpci1': '10de:2bb5,pcie=1', 'hostpci4': 'c1:00.0'}},
        'container-lxc': {'config': {'dev3': None, 'dev8': '/dev/vfio/12,mode=0666'}},
        'vm-pci-mappings': {'mappings': {'gpuhost-300-gpu1': {'path': '0000:11:00.0'}}},
        'sglang-unit': {'unit': {'__sub__': [['--tp-size 4', '--tp 4'], ['--host 0.0.0.0', '--host=::'],
                                             [' --speculative-num-draft-tokens 2', ''],
                                             ['Type=simple', 'Type=simple\nUnsetEnvironment=NCCL_P2P_DISABLE']]}}},
        # The login the guests are made with is the host's provider instance's (the plugin gives it to every call;
        # an `api` input of a resource's own is not used): another user's. (An API token with no password there
        # the plugin itself refuses: the test below.)
        'api': {'host': 'x', 'user': 'ci@pve'}}
    code, out = preview(program, case)
    assert code != 0
    got = findings(out)
    assert {r for _, r, _ in got} == set(RULES), got
    expect = {
        ('no-identity-iommu', 'host-kernel-cmdline'): "ensure_args puts 'iommu=pt,nofoo' on the kernel command line",
        ('vfio-by-address', 'host-nvidia-options'): 'writes "options vfio-pci ids=10de:2bb5" into '
                                                    '/etc/modprobe.d/gpuhost-nvidia.conf',
        ('vfio-by-address', 'vm-qemu'): 'hostpci1 10de:2bb5 is a vendor:device ID, not a PCI address',
        ('gpu-one-side', 'container-lxc'): 'dev8 passes /dev/vfio/12 into the container',
        ('p2p-off', 'sglang-unit'): 'the unit unsets NCCL_P2P_DISABLE',
        ('speculation-triple', 'sglang-unit'): 'the unit sets --speculative-num-steps 1, --speculative-eagle-topk 1 '
                                               'but not --speculative-num-draft-tokens',
        ('tp-equals-container-gpus', 'sglang-unit'): '--tp 4, but container 200 (container-lxc) has 3 GPUs',
        ('root-pam-password', 'vm-qemu'): 'the API user is not root@pam',
        ('gpu-one-side', 'vm-pci-mappings'): 'mapping gpuhost-300-gpu1 points its entry for node pve-lab at '
                                             '0000:11:00.0, a container GPU',
        ('vm-gpus-by-mapping', 'vm-qemu'): 'hostpci4 passes 0000:c1:00.0 by raw PCI address in a stack that gives '
                                           'the VM its GPUs through PCI resource mappings',
        ('sglang-private-bind', 'sglang-unit'): 'every address of the container (--host ::, port 30000)',
    }
    for (rule, name), part in expect.items():
        msgs = got.get(('mandatory', rule, name), [])
        assert any(part in m for m in msgs), (rule, name, msgs)
    assert any('hostpci4 passes 0000:c1:00.0, which no VfioBinding (host-vfio) binds' in m
               for m in got[('mandatory', 'vfio-by-address', 'vm-qemu')])
    assert 'tok-SECRET-value-123' not in out and 'root@pam!ci' not in out


def test_a_rule_lowered_to_advisory_still_prints_its_finding_and_the_pack_says_so(program):
    code, out = preview(program, {'model': {'sglang.tp': 2, 'sglang.host': '127.0.0.4'}},
                        config={'tp-equals-container-gpus': 'advisory'})
    assert code == 0, out[-4000:]
    got = findings(out)
    assert set(got) == {('advisory', 'tp-equals-container-gpus', 'sglang-unit'),
                        ('advisory', 'relaxed-rules', 'gpuhost-policy-test-policytest')}, got
    assert '--tp-size 2, but container 200' in got[('advisory', 'tp-equals-container-gpus', 'sglang-unit')][0]
    assert got[('advisory', 'relaxed-rules', 'gpuhost-policy-test-policytest')] == [
        'stack policytest: the policy config relaxes the safety rules - rules lowered to advisory (their findings '
        'print as warnings and do not stop the run): tp-equals-container-gpus. Every other rule is mandatory.']


@pytest.mark.parametrize('config,why', [
    ({'no-identity-iommu': 'disabled'}, 'no-identity-iommu: enforcement level disabled; a rule may be lowered to '
                                        'advisory, never disabled'),
    ({'all': 'disabled'}, 'relaxed-rules: enforcement level disabled'),
    ({'no-identity-iomu': 'advisory'}, 'no-identity-iomu is not a rule of this pack'),
    ({'sglang-private-bind': {'allow_public_bnd': True}}, 'sglang-private-bind has no setting allow_public_bnd')])
def test_a_policy_config_that_would_disable_or_silently_miss_is_refused(program, config, why):
    code, out = preview(program, config=config)
    assert code != 0
    assert 'the policy config is refused: ' in out and why in out, out[-3000:]


def test_make_preview_prod_runs_the_pack(tmp_path):
    """What `make preview STACK=prod` runs (tools/run.sh): the prod example previews offline with the pack,
    and the only rule it may break is the wildcard bind (Pulumi.prod.yaml's choice, not a safety hole)."""
    proj = tmp_path / 'project'
    proj.mkdir()
    for name in PROJECT_FILES + ('Pulumi.prod.yaml', 'runtime'):
        src = os.path.join(REPO, name)
        (shutil.copytree if os.path.isdir(src) else shutil.copyfile)(src, proj / name)
    os.symlink(os.path.join(REPO, '.venv'), proj / '.venv')
    (tmp_path / 'state').mkdir()
    env = dict(os.environ, PULUMI_BACKEND_URL='file://%s' % (tmp_path / 'state'), PULUMI_HOME=str(tmp_path / 'home'),
               PULUMI_CONFIG_PASSPHRASE='gpuhost-prod-example', PULUMI_SKIP_UPDATE_CHECK='true')
    env.pop('PULUMI_CONFIG_PASSPHRASE_FILE', None)
    install_command_plugin(env)
    subprocess.run(['pulumi', 'stack', 'select', '--create', '--secrets-provider', 'passphrase', 'prod'],
                   cwd=proj, env=env, check=True, capture_output=True)
    argv = ['pulumi', 'preview', '--diff', '--policy-pack', POLICY]
    if os.path.exists(os.path.join(POLICY, 'config.prod.json')):
        argv += ['--policy-pack-config', os.path.join(POLICY, 'config.prod.json')]
    res = subprocess.run(argv, cwd=proj, env=env, capture_output=True, text=True, timeout=300)
    out = res.stdout + res.stderr
    assert re.search(r'Policy Packs run:\n.*\n\s+gpuhost-safety\|local\|%s\s+1\.0\.0' % re.escape(POLICY), out), \
        out[-4000:]
    mandatory = {(r, n) for level, r, n in findings(out) if level == 'mandatory'}
    assert mandatory <= {('sglang-private-bind', 'sglang-unit')}, out[-4000:]
    assert (res.returncode == 0) == (not mandatory), out[-4000:]
    assert 'placeholder-not-the-real-password' not in out
