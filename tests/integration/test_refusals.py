"""Every refusal of the config happens at `pulumi preview`, with the key, the value and the fix in the
message, and nothing on the lab host changes (no SSH session, no file, no guest). Warnings are shown
and do not stop the preview. Also: a wrong pinned host key fails the connection before any change."""

import copy
import os
import subprocess

import pytest

STACK = 'refuse'


def mutate(cfg, path, value):
    cfg = copy.deepcopy(cfg)
    node = cfg
    for key in path[:-1]:
        node = node.setdefault(key, {})
    if value is DELETE:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value
    return cfg


DELETE = object()
H, C, V, S, I = 'gpuhost:host', 'gpuhost:container', 'gpuhost:vm', 'gpuhost:sglang', 'gpuhost:iommu'
CT = ['0000:01:00.0', '0000:11:00.0', '0000:61:00.0', '0000:71:00.0']

REFUSALS = [
    ('malformed PCI address', [((C, 'gpus'), ['0000:1:00.0'] + CT[1:])],
     ["gpuhost:container.gpus: '0000:1:00.0' is not a PCI address", '0000:01:00.0']),
    ('uppercase PCI address', [((C, 'gpus'), ['0000:E1:00.0'] + CT[1:])], ['lowercase hex']),
    ('GPU on both sides', [((V, 'gpus'), ['0000:01:00.0', '0000:91:00.0', '0000:e1:00.0', '0000:f1:00.0'])],
     ['gpuhost:vm.gpus: 0000:01:00.0 is already given to the container']),
    ('NUMA mismatch', [((C, 'gpus'), CT[:3] + ['0000:81:00.0']),
                       ((V, 'gpus'), ['0000:71:00.0', '0000:91:00.0', '0000:e1:00.0', '0000:f1:00.0'])],
     ['gpuhost:container.gpus: 0000:81:00.0 sits on NUMA node 1 but the container is placed on NUMA node 0']),
    ('tensor parallelism', [((S, 'tp'), 2)], ['gpuhost:sglang.tp: 2 but the container has 4 GPUs', 'set tp: 4']),
    ('partial speculation', [((S, 'speculative'), {'algorithm': 'NEXTN', 'num_steps': 1})],
     ['gpuhost:sglang.speculative: num_steps=1 set but eagle_topk, num_draft_tokens missing']),
    ('topk 1 draft tokens', [((S, 'speculative'), {'num_steps': 1, 'eagle_topk': 1, 'num_draft_tokens': 4})],
     ['num_draft_tokens: 4 with eagle_topk 1', 'set num_draft_tokens: 2']),
    ('removed flag', [((S, 'extra_args'), ['--mamba-scheduler-strategy', 'extra_buffer'])],
     ['--mamba-scheduler-strategy is not accepted by SGLang 0.5.23', 'rejected from 0.5.20',
      '--mamba-radix-cache-strategy']),
    ('ambiguous flag', [((S, 'extra_args'), ['--cuda-graph-max-bs', '256'])],
     ['--cuda-graph-max-bs is not accepted by SGLang 0.5.23', '--cuda-graph-max-bs-decode']),
    ('flag too new', [((S, 'version'), '0.5.12'), ((S, 'extra_args'), ['--cuda-graph-max-bs-decode', '64'])],
     ['--cuda-graph-max-bs-decode is not accepted by SGLang 0.5.12']),
    ('served name colon', [((S, 'served_model_name'), 'qwen:122b')],
     ["gpuhost:sglang.served_model_name: 'qwen:122b' contains \":\"", 'qwen-122b']),
    ('mem fraction', [((S, 'mem_fraction_static'), 1.2)], ['gpuhost:sglang.mem_fraction_static: 1.2 is outside (0, 1)']),
    ('identity domain', [((I, 'domain'), 'identity')], ['gpuhost:iommu: domain: identity', '0x177', 'power']),
    ('iommu=pt', [((I, 'extra_kernel_args'), ['iommu=pt'])], ['gpuhost:iommu: iommu=pt', '0x177']),
    ('iommu.passthrough=1', [((I, 'extra_kernel_args'), ['iommu.passthrough=1'])], ['iommu.passthrough=1', '0x177']),
    ('pgtbl_v2 with SNP', [((I, 'extra_kernel_args'), ['amd_iommu=pgtbl_v2'])], ['disables SEV-SNP']),
    ('vfio by id', [(('gpuhost:vfio', 'bind'), 'id')], ['gpuhost:vfio.bind: "id" would bind every 10de:2bb5 GPU',
                                                         'bind: address']),
    ('api token', [((H, 'api', 'token_id'), 'root@pam!deploy'), ((H, 'api', 'token_secret'), 'x')],
     ["gpuhost:host.api.token_id: 'root@pam!deploy'", 'only root@pam', 'devN', 'hostpci', 'amd-sev']),
    ('non-root user', [((H, 'api', 'user'), 'deploy@pve')], ["gpuhost:host.api.user: 'deploy@pve'"]),
    ('unknown key', [((C, 'cpus'), 8)], ['gpuhost:container.cpus', 'Extra inputs are not permitted']),
    ('inventory missing GPU', [((C, 'gpus'), CT[:3] + ['0000:31:00.0'])],
     ['0000:31:00.0 is not in gpuhost:host.gpus']),
]


@pytest.fixture(scope='module')
def base(lab):
    cfg = lab.stack_config()
    lab.write_stack(STACK, cfg)
    return cfg


@pytest.mark.parametrize('name,changes,messages', REFUSALS, ids=[r[0] for r in REFUSALS])
def test_refused_at_preview_with_nothing_changed(lab, base, name, changes, messages):
    cfg = base
    for path, value in changes:
        cfg = mutate(cfg, path, value)
    lab.write_stack(STACK, cfg)
    sessions, digest = lab.ssh_sessions(), lab.host_digest()
    res = lab.pulumi('preview', stack=STACK, check=False)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    for m in messages:
        assert m in out, 'missing %r in:\n%s' % (m, out[-3000:])
    assert 'Traceback' not in out
    assert lab.ssh_sessions() == sessions and lab.host_digest() == digest
    assert lab.node().lxc.get() == [] and lab.node().qemu.get() == []


def test_warnings_do_not_stop_preview(lab, base):
    cfg = mutate(base, (I, 'extra_kernel_args'), ['amd_iommu=on'])
    lab.write_stack(STACK, cfg)
    res = lab.pulumi('preview', stack=STACK)
    assert 'amd_iommu=on is not a valid value' in res.stdout
    assert 'SEV-SNP together with PCI passthrough is listed by Proxmox as not supported' in res.stdout
    assert 'NEXTN speculative decoding with the extra_buffer mamba cache' in res.stdout


def test_wrong_pinned_host_key_fails_before_any_change(lab, base, tmp_path):
    subprocess.run(['ssh-keygen', '-q', '-t', 'ed25519', '-N', '', '-f', str(tmp_path / 'other')], check=True)
    cfg = mutate(base, (H, 'ssh', 'host_key_file'), DELETE)
    cfg = mutate(cfg, (H, 'ssh', 'host_key'), ' '.join(open(tmp_path / 'other.pub').read().split()[:2]))
    lab.write_stack(STACK, cfg)
    digest = lab.host_digest()
    res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert 'not the pinned gpuhost:host.ssh.host_key' in out, out[-3000:]
    assert lab.host_digest() == digest
    assert lab.node().lxc.get() == [] and lab.node().qemu.get() == []
    # The SSH private key never shows up in what the CLI printed.
    key = open(os.path.join(lab.project, '.lab', 'ssh', 'id_ed25519')).read().splitlines()[1]
    assert key not in out


def test_preview_needs_no_lab_at_all(lab, base):
    lab.write_stack(STACK, base)
    lab.stop_processes()
    try:
        plan = lab.preview_json(STACK)
        ops = {s['urn'].split('::')[-1]: s['op'] for s in plan['steps'] if s['urn'].count('dynamic')}
        assert set(ops.values()) == {'create'} and len(ops) == 7, ops
    finally:
        lab.up()
