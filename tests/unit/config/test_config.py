"""The config model: defaults, derived values, refusals (message names key, value and fix), warnings."""

import copy

import pytest
import yaml

import config
from tests.lablib import REPO


def lab_data():
    with open(REPO + '/Pulumi.lab.yaml') as f:
        cfg = yaml.safe_load(f)['config']
    return {k.split(':', 1)[1]: v for k, v in cfg.items() if k.startswith('gpuhost:')}


def parse(**changes):
    data = copy.deepcopy(lab_data())
    for path, value in changes.items():
        node = data
        keys = path.split('__')
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    return config.parse(data)


def test_lab_config_is_valid_and_defaults_come_from_the_model():
    d = parse()
    assert d.iommu.kernel_args() == ['iommu.passthrough=0', 'iommu.strict=0']
    assert d.sglang.tp == 4 and d.sglang.mem_fraction_static == 0.75
    assert (d.sglang.speculative.num_steps, d.sglang.speculative.eagle_topk,
            d.sglang.speculative.num_draft_tokens) == (1, 1, 2)
    assert d.service_environment()['NCCL_P2P_DISABLE'] == '1'
    assert d.service_environment()['PATH'].startswith('/opt/sglang/venv/bin:')
    assert d.container_devices()['dev0'] == '/dev/nvidia0,mode=0666'
    assert d.container_devices()['dev4'] == '/dev/nvidiactl,mode=0666'


def test_model_is_frozen():
    d = parse()
    with pytest.raises(Exception):
        d.sglang.tp = 8


def test_launch_args_follow_the_version():
    old = parse(sglang__version='0.5.12', sglang__mamba_radix_cache_strategy='extra_buffer')
    assert old.launch_args()[old.launch_args().index('--mamba-scheduler-strategy') + 1] == 'extra_buffer'
    new = parse(sglang__mamba_radix_cache_strategy='extra_buffer_lazy')
    assert '--mamba-radix-cache-strategy' in new.launch_args()
    with pytest.raises(config.ConfigError, match='extra_buffer_lazy.*needs a newer SGLang than 0.5.12'):
        parse(sglang__version='0.5.12', sglang__mamba_radix_cache_strategy='extra_buffer_lazy')


@pytest.mark.parametrize('changes,message', [
    ({'sglang__speculative': {'num_steps': 1, 'eagle_topk': 1}}, 'num_draft_tokens missing'),
    ({'sglang__speculative': {'num_steps': 2, 'eagle_topk': 1, 'num_draft_tokens': 2}}, 'set num_draft_tokens: 3'),
    ({'sglang__served_model_name': 'a:b'}, 'contains ":"'),
    ({'sglang__mem_fraction_static': 0}, 'outside (0, 1)'),
    ({'sglang__version': '0.5'}, 'not a release number'),
    ({'iommu__domain': 'identity'}, '0x177'),
    ({'iommu__extra_kernel_args': ['iommu.passthrough=on']}, 'identity (passthrough) IOMMU domain'),
    ({'iommu__extra_kernel_args': ['amd_iommu=off']}, 'turns the AMD IOMMU off'),
    ({'container__ip': '10.0.0.5'}, 'has no prefix length'),
    ({'host__numa_cpus': {0: '0-31', 1: 'all'}}, "gpuhost:host.numa_cpus.1: 'all' is not a CPU list"),
    ({'host__numa_cpus': {0: '0-31', 1: '31-40'}}, 'CPU 31 is listed for NUMA node 0 and node 1'),
    ({'sglang__port': True}, 'gpuhost:sglang.port: True is not a whole number'),
    ({'sglang__proof': {'min_busbw_gbps': 0}}, 'gpuhost:sglang.proof.min_busbw_gbps: 0 - input should be greater than 0'),
    ({'sglang__tp': 1, 'container__gpus': ['0000:01:00.0'], 'sglang__proof': {'min_busbw_gbps': 5}},
     'gpuhost:sglang.proof.min_busbw_gbps: 5 GB/s, but with tp 1 the all-reduce moves no data'),
    ({'sglang__tp': '4'}, 'gpuhost:sglang.tp: \'4\' is not a whole number (write it without quotes)'),
    ({'container__bridge': 'vmbr0,rate=1'}, 'gpuhost:container.bridge: \'vmbr0,rate=1\' is not a Linux bridge name'),
    ({'sglang__unit': '../../../etc/passwd'}, 'gpuhost:sglang.unit: \'../../../etc/passwd\' is not a systemd'),
    ({'sglang__environment': {'X': 'a\nExecStartPre=/bin/id'}}, 'gpuhost:sglang.environment.X: '),
    ({'sglang__extra_args': ['--tp', '8']}, '--tp sets tp_size, which this program manages'),
    ({'container__cpus': 8}, 'gpuhost:container.cpus is not a setting here (did you mean cores?)'),
    ({'vm__vmid': 200}, 'gpuhost:vm.vmid: 200 is the container\'s vmid too'),
    ({'sglang__speculative': {'num_steps': 3, 'num_draft_tokens': 4}},
     'from your numbers: {num_steps: 3, eagle_topk: 1, num_draft_tokens: 4}'),
    ({'host__ssh': {'host_key': 'nonsense', 'private_key': 'x'}}, 'is not a public key line'),
    ({'host__ssh': {'host_key': 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIIlXMOnzn+VUtUJ2HPp/GySToF/fuDXoovapSPPhSllC'}},
     'set exactly one of private_key'),
    ({'host__ssh': {'host_key': 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIIlXMOnzn+VUtUJ2HPp', 'private_key_file': 'k'}},
     'not valid base64'),
    ({'host__api': {'password': 'x'}}, 'TLS is always verified'),
    ({'vm__numa': 2}, 'sits on NUMA node 1 but the vm is placed on NUMA node 2'),
    ({'vm__gpu_binding': 'mappings'},
     "gpuhost:vm.gpu_binding: 'mappings' is not one of the allowed values: 'mapping' or 'address'"),
    ({'vm__gpu_mapping_prefix': 'gpu,0'}, "gpuhost:vm.gpu_mapping_prefix: 'gpu,0' is not a Proxmox mapping id prefix"),
    ({'vm__gpu_mapping_prefix': '0gpu'}, "'0gpu' is not a Proxmox mapping id prefix (a letter, then letters, "
                                         "digits, \"-\" or \"_\"); write e.g. gpuhost-300-gpu"),
    ({'vm__gpu_mapping_prefix': 'gpu\n'}, 'contains the control character'),
    ({'vm__gpu_mapping_prefix': 'g' * 63}, 'is not a Proxmox mapping id prefix'),
    ({'vm__gpu_binding': 'address', 'vm__gpu_mapping_prefix': 'gpu'},
     "gpuhost:vm.gpu_mapping_prefix: 'gpu' is set, but gpuhost:vm.gpu_binding is address"),
])
def test_refusals(changes, message):
    with pytest.raises(config.ConfigError) as e:
        parse(**changes)
    assert message in str(e.value)


def test_no_api_token_even_without_vm_when_container_has_gpus():
    data = copy.deepcopy(lab_data())
    data.pop('vm')
    data['host']['api'].update(token_id='root@pam!x', token_secret='s')
    with pytest.raises(config.ConfigError, match=r'devN \(container GPUs\)'):
        config.parse(data)


def test_vm_gpus_are_mapped_by_default_with_ids_proxmox_accepts():
    d = parse()
    assert d.vm.gpu_binding == 'mapping'
    assert d.vm.mapping_ids() == ['gpuhost-300-gpu0', 'gpuhost-300-gpu1', 'gpuhost-300-gpu2', 'gpuhost-300-gpu3']
    assert parse(vm__gpu_mapping_prefix='snp_').vm.mapping_ids()[3] == 'snp_3'
    assert parse(vm__gpu_binding='address').vm.mapping_ids() == []


def test_the_token_refusal_names_exactly_what_needs_root():
    data = copy.deepcopy(lab_data())
    data['host']['api'].update(token_id='root@pam!x', token_secret='s')
    with pytest.raises(config.ConfigError) as e:
        config.parse(data)
    # Through mappings, hostpciN needs Mapping.Use only; devN, amd-sev and affinity stay root@pam's.
    assert 'set devN (container GPUs), amd-sev, affinity, bind mount points (mpN); an API token' in str(e.value)
    data['vm']['gpu_binding'] = 'address'
    with pytest.raises(config.ConfigError) as e:
        config.parse(data)
    assert 'set devN (container GPUs), raw hostpciN, amd-sev, affinity, bind mount points (mpN); an API token' in str(e.value)


def test_warnings():
    d = parse(iommu__extra_kernel_args=['amd_iommu=on'], sglang__environment={'SGLANG_ENABLE_SPEC_V2': '1'})
    text = '\n'.join(d.warnings)
    assert 'amd_iommu=on is not a valid value' in text
    assert 'SEV-SNP together with PCI passthrough' in text
    assert 'extra_buffer mamba cache' in text
    assert 'SGLANG_ENABLE_SPEC_V2 is ignored from SGLang 0.5.22' in text
    assert not any('extra_buffer mamba' in w for w in parse(sglang__mamba_radix_cache_strategy='extra_buffer_lazy').warnings)
    # The GPU proof is on by default; switched off, every preview says so.
    assert not any('proof' in w for w in parse().warnings)
    assert any(w.startswith('gpuhost:sglang.proof.enabled: false - SGLang starts on GPUs nobody proved')
               for w in parse(sglang__proof={'enabled': False}).warnings)


def test_schema_lists_every_section():
    schema = config.Deployment.model_json_schema()
    assert set(schema['properties']) == {'host', 'iommu', 'nvidia', 'container', 'vm', 'sglang', 'runtime',
                                          'model', 'monitoring'}


def test_an_index_login_over_plain_http_is_warned_unless_on_loopback():
    assert not [w for w in parse().warnings if 'plain http' in w]
    d = parse(runtime__python__index__url='http://pypi.example.internal/simple')
    assert any('gpuhost:runtime.python.index.url: http://pypi.example.internal/simple is plain http' in w
               for w in d.warnings)


def test_runtime_parts_are_optional_and_versions_are_strings():
    d = parse(runtime={'nvidia': {'version': '580.95.05', 'sha256': 'a' * 64,
                                  'installer': '/root/NVIDIA-Linux-x86_64-580.95.05.run'}})
    assert d.runtime.cuda is None and d.runtime.python is None
    with pytest.raises(config.ConfigError, match='gpuhost:runtime.cuda.version'):
        parse(runtime__cuda__version=13.0)


@pytest.mark.parametrize('envs_dir', ['/', '/usr', '/etc', '/var', '/opt', '/home', '/root', '/tmp', '/srv', '/boot',
                                      '/bin', '/lib', '/lib64', '/var/lib', '/usr/local', '/usr/lib/sglang',
                                      '/etc/sglang', '/proc/1', '/sys/x', '/dev/shm', '/boot/envs', '/run/sglang',
                                      '/sbin/x', '/lib/x'])
def test_the_environments_directory_is_never_a_system_directory(envs_dir):
    """The program builds one directory per environment there and removes the old ones: never /usr (tried as a
    new user would: accepted, /usr/<id> built), a parent of system directories, or anything inside one."""
    with pytest.raises(config.ConfigError) as e:
        parse(runtime__python__envs_dir=envs_dir)
    line = next(l for l in str(e.value).splitlines() if 'envs_dir' in l)
    assert line.startswith("  - gpuhost:runtime.python.envs_dir: %r is a system directory of the container" % envs_dir)
    assert 'give the environments a directory of their own, e.g. /opt/sglang/envs' in line, line


@pytest.mark.parametrize('envs_dir', ['/opt/sglang/envs', '/srv/sglang/envs', '/var/lib/gpuhost/envs',
                                      '/home/sglang/envs', '/opt/envs'])
def test_an_environments_directory_of_its_own_is_accepted(envs_dir):
    assert parse(runtime__python__envs_dir=envs_dir).runtime.python.envs_dir == envs_dir


@pytest.mark.parametrize('key', ['sglang__api_key', 'model__token', 'host__api__password', 'runtime__nvidia__token'])
def test_a_credential_of_the_wrong_type_is_refused_without_its_value(key):
    """An API key or token written unquoted in YAML is a number (or a list, a mapping): refused, and its value is in
    no word of the message - every credential key, not only the passwords and the SSH key."""
    with pytest.raises(config.ConfigError) as e:
        parse(**{key: 918273645})
    assert 'a secret value (not shown) is not a string' in str(e.value) and '918273645' not in str(e.value)
