"""Hostile and careless stack configs: each is either refused at preview - the message names the config
key and the fix - or accepted because it is harmless. The classes: values that would inject lines into
the systemd unit, paths built from names, kernel parameters in other spellings, SGLang flags that
override managed ones, silent loss (typos in namespaces and keys), coercion and smuggled properties,
unreadable keys and certificates, secrets given as plain text.

Every case goes through config.load_stack - what the program runs first, at preview and up alike, and
whose ConfigError text is the refusal the operator reads - in this process, with the config the CLI
would hand the program (engine_config). A sample of every class also goes through the real `pulumi
preview` against the lab: the CLI shows that same message without Python frames, and nothing on the
host changed (no SSH session, same host digest, no guest).
"""

import contextvars
import copy
import json
import os

import pulumi.runtime.config
import pulumi.runtime.settings
import pytest
import yaml

import config
from tools import render

STACK = 'hostile'
DELETE = object()
H, C, V, S, I = 'gpuhost:host', 'gpuhost:container', 'gpuhost:vm', 'gpuhost:sglang', 'gpuhost:iommu'
RSA_BLOB = ('AAAAB3NzaC1yc2EAAAADAQABAAABAQC7kAp3gJkFhwTHOQ0i5NaFvwn3zVlVb5y4ej2WQXQm9bZx3lLxw6QkMOz2qGgdKvyH2vQh'
            'Zb0t5S8gw6nB1P9p3Xo0eCzO1n0gCdyp3I8ijgqVvP4C2E1Z6Tk5nD0Oq6gkQFvQd7PCmG6KbXcFGbcrBg6K1Q3Jh8M0Ht4xA0v3'
            'q2oqv1VvKqYbLkYlV5e1vKcD6I3Nq4lG8ZhT4y2v9jEkX2Hn5tJcR6P1gx0T1cZGkO8yq3cE0mR4vKc2d4vQdQxF2yWj2oT7mHqz'
            'ZtP0g3hYB7ZyW1wR8cT5yVqC1Zk3D0n8eGq2pH4tJv5wXx9rS1uY3bL0dQ6fM8aE2kR7nTzP')


def m(*changes):
    """(path, value) pairs; a path is a tuple of keys into the stack config."""
    return list(changes)


class File(tuple):
    """A file the config names in the project: (path relative to it, text); put there before loading. A text
    of the form 'symlink:<target>' makes a symbolic link instead."""

    def __new__(cls, rel, text):
        return tuple.__new__(cls, (rel, text))


H1 = 'a' * 64
LOCK = 'pip==23.2.1 --hash=sha256:%s\nsglang==0.5.23 --hash=sha256:%s\n' % (H1, H1)
R = 'gpuhost:runtime'
MD = 'gpuhost:model'


CASES = [
    # 1. Unit-file injection: control characters anywhere a string reaches the unit.
    ('extra_args newline', m(((S, 'extra_args'), ['--context-length', '4096\nExecStartPre=/bin/touch /tmp/pwned'])),
     ['gpuhost:sglang.extra_args[1]', 'control character']),
    ('extra_args carriage return', m(((S, 'extra_args'), ['--context-length\r'])), ['extra_args[0]', 'control']),
    ('extra_args tab', m(((S, 'extra_args'), ['--context-length\t4096'])), ['extra_args[0]', 'control']),
    ('environment value newline', m(((S, 'environment'), {'FOO': 'x\nExecStartPre=/bin/sh -c id'})),
     ['gpuhost:sglang.environment.FOO', 'control character']),
    ('environment value NUL', m(((S, 'environment'), {'FOO': 'a\x00b'})), ['environment.FOO', 'control']),
    ('environment value escape', m(((S, 'environment'), {'FOO': '\x1b[31mred'})), ['environment.FOO', 'control']),
    ('environment key newline', m(((S, 'environment'), {'FOO\nExecStart': 'x'})),
     ['gpuhost:sglang.environment', 'control character']),
    ('environment key with =', m(((S, 'environment'), {'A=B': 'x'})), ['not an environment variable name']),
    ('environment key with space', m(((S, 'environment'), {'A B': 'x'})), ['not an environment variable name']),
    ('environment overrides NCCL_P2P_DISABLE', m(((S, 'environment'), {'NCCL_P2P_DISABLE': '0'})),
     ['NCCL_P2P_DISABLE is set by this program', 'peer-to-peer']),
    ('environment overrides PATH', m(((S, 'environment'), {'PATH': '/tmp'})), ['PATH is set by this program']),
    ('environment hides GPUs', m(((S, 'environment'), {'CUDA_VISIBLE_DEVICES': '0'})),
     ['CUDA_VISIBLE_DEVICES is set by this program']),
    ('served_model_name newline', m(((S, 'served_model_name'), 'qwen\nExecStartPre=/bin/id')),
     ['gpuhost:sglang.served_model_name', 'control character']),
    ('served_model_name quote', m(((S, 'served_model_name'), 'qwen"x')),
     ['gpuhost:sglang.served_model_name', 'not a model name']),
    ('served_model_name colon', m(((S, 'served_model_name'), 'qwen:122b')), ['contains ":"', 'qwen-122b']),
    ('served_model_name specifier', m(((S, 'served_model_name'), 'q%n')), ['served_model_name', 'not a model name']),
    ('cuda_home newline', m(((S, 'cuda_home'), '/usr/local/cuda\nExecStartPre=/bin/id')),
     ['gpuhost:sglang.cuda_home', 'control character']),
    ('cuda_home with PATH separator', m(((S, 'cuda_home'), '/usr/local/cuda:/tmp/evil')),
     ['gpuhost:sglang.cuda_home', 'not an absolute path']),
    ('venv with space', m(((S, 'venv'), '/opt/sg lang')), ['gpuhost:sglang.venv', 'not an absolute path']),
    ('model_path newline', m(((S, 'model_path'), '/models/q\nExecStartPre=/bin/id')),
     ['gpuhost:sglang.model_path', 'control character']),
    ('version with shell', m(((S, 'version'), '0.5.23; reboot')), ['gpuhost:sglang.version', 'not a release number']),
    ('version unknown', m(((S, 'version'), '9.9.9')), ['gpuhost:sglang.version', 'no flag table', 'supported']),
    ('listen host not an address', m(((S, 'host'), 'localhost\n')), ['gpuhost:sglang.host']),
    ('listen on another host\'s address', m(((S, 'host'), '10.99.0.5')),
     ['gpuhost:sglang.host: 10.99.0.5 is not the container\'s address', 'could not listen there']),
    ('listen on loopback only', m(((S, 'host'), '127.0.0.1')),
     ['gpuhost:sglang.host: 127.0.0.1', 'only inside the container', '0.0.0.0']),
    # 2. Paths from names.
    ('unit path traversal', m(((S, 'unit'), '../../../etc/passwd')),
     ['gpuhost:sglang.unit', 'not a systemd service name']),
    ('unit with slash', m(((S, 'unit'), 'a/b.service')), ['gpuhost:sglang.unit', 'not a systemd service name']),
    ('unit without suffix', m(((S, 'unit'), 'sglang')), ['gpuhost:sglang.unit']),
    ('unit template', m(((S, 'unit'), 'sglang@.service')), ['gpuhost:sglang.unit']),
    ('unit socket', m(((S, 'unit'), 'sglang.socket')), ['gpuhost:sglang.unit']),
    ('unit starting with a dash', m(((S, 'unit'), '-x.service')), ['gpuhost:sglang.unit', 'option']),
    ('venv relative', m(((S, 'venv'), '../opt/venv')), ['gpuhost:sglang.venv', 'absolute path']),
    ('venv dotdot', m(((S, 'venv'), '/opt/sglang/../../etc')), ['gpuhost:sglang.venv', 'normalised']),
    ('model_path traversal', m(((S, 'model_path'), '../../etc/shadow')), ['gpuhost:sglang.model_path']),
    ('cuda_home trailing slash', m(((S, 'cuda_home'), '/usr/local/cuda-13.0/')),
     ['gpuhost:sglang.cuda_home', '/usr/local/cuda-13.0']),
    # 3. Kernel parameters by meaning, not by string.
    ('passthrough=true', m(((I, 'extra_kernel_args'), ['iommu.passthrough=true'])),
     ['gpuhost:iommu.extra_kernel_args[0]', 'identity', '0x177']),
    ('passthrough=yes', m(((I, 'extra_kernel_args'), ['iommu.passthrough=yes'])), ['identity']),
    ('intel_iommu=off', m(((I, 'extra_kernel_args'), ['intel_iommu=off'])), ['extra_kernel_args[0]', 'IOMMU off']),
    ('amd_iommu=pt (no such option)', m(((I, 'extra_kernel_args'), ['amd_iommu=pt'])),
     ['extra_kernel_args[0]', "no option 'pt'", 'gpuhost:iommu.domain']),
    ('amd_iommu=fullflush (strict)', m(((I, 'extra_kernel_args'), ['amd_iommu=fullflush'])),
     ['extra_kernel_args[0]', 'iommu.strict=1']),
    ('command line beyond the kernel limit', m(((I, 'extra_kernel_args'), ['pad%d=%s' % (i, 'x' * 90) for i in range(20)])),
     ['gpuhost:iommu.extra_kernel_args', 'keeps only 2047 bytes']),
    ('environment with a hub token', m(((S, 'environment'), {'HF_TOKEN': 'hf_abcdefghijklmnop'})),
     ['gpuhost:sglang.environment', 'HF_TOKEN looks like a credential']),
    ('environment with the API key variable', m(((S, 'environment'), {'SGLANG_API_KEY': 'abcdefghijklmnopqrstu'})),
     ['SGLANG_API_KEY is set by this program', 'gpuhost:sglang.api_key']),
    ('passthrough=On', m(((I, 'extra_kernel_args'), ['iommu.passthrough=On'])), ['identity']),
    ('two parameters in one item', m(((I, 'extra_kernel_args'), ['quiet iommu=pt'])), ['iommu=pt', 'identity']),
    ('iommu=pt in a list', m(((I, 'extra_kernel_args'), ['iommu=force,pt'])), ['identity']),
    ('iommu=pt', m(((I, 'extra_kernel_args'), ['iommu=pt'])), ['gpuhost:iommu', 'iommu=pt', '0x177']),
    ('iommu.passthrough=1', m(((I, 'extra_kernel_args'), ['iommu.passthrough=1'])), ['0x177']),
    ('vfio-pci.ids', m(((I, 'extra_kernel_args'), ['vfio-pci.ids=10de:2bb5'])), ['vendor:device ID', 'PCI address']),
    ('vfio_pci.ids', m(((I, 'extra_kernel_args'), ['vfio_pci.ids=10de:2bb5'])), ['vendor:device ID']),
    ('nvidia option on the command line', m(((I, 'extra_kernel_args'), ['nvidia.NVreg_DmaRemapPeerMmio=0'])),
     ['gpuhost:nvidia.dma_remap_peer_mmio']),
    ('strict contradicts the domain', m(((I, 'extra_kernel_args'), ['iommu.strict=1'])), ['gpuhost:iommu.domain']),
    ('amd_iommu=off', m(((I, 'extra_kernel_args'), ['amd_iommu=off'])), ['AMD IOMMU off']),
    ('iommu=off', m(((I, 'extra_kernel_args'), ['iommu=off'])), ['IOMMU off']),
    ('pgtbl_v2 with SNP', m(((I, 'extra_kernel_args'), ['amd_iommu=pgtbl_v2'])), ['SEV-SNP']),
    ('blacklisted nvidia', m(((I, 'extra_kernel_args'), ['modprobe.blacklist=nvidia'])), ['blacklists']),
    ('SEV off in KVM', m(((I, 'extra_kernel_args'), ['kvm_amd.sev=0'])), ['SEV']),
    ('root= replaced', m(((I, 'extra_kernel_args'), ['root=/dev/sdb1'])), ['boot setup']),
    ('command substitution', m(((I, 'extra_kernel_args'), ['x=$(reboot)'])), ['plain name']),
    ('newline into GRUB', m(((I, 'extra_kernel_args'), ['quiet\nGRUB_TIMEOUT=0'])), ['control character']),
    ('init args separator', m(((I, 'extra_kernel_args'), ['--'])), ['boot setup']),
    ('identity domain', m(((I, 'domain'), 'identity')), ['gpuhost:iommu.domain', '0x177', 'power']),
    # 4. Flags the program manages, in any spelling SGLang's parser accepts.
    ('--tp-size 8', m(((S, 'extra_args'), ['--tp-size', '8'])), ['--tp-size', 'gpuhost:sglang.tp']),
    ('--tp 8', m(((S, 'extra_args'), ['--tp', '8'])), ['--tp', 'gpuhost:sglang.tp']),
    ('--tp=8', m(((S, 'extra_args'), ['--tp=8'])), ['gpuhost:sglang.tp']),
    ('second speculative algorithm', m(((S, 'extra_args'), ['--speculative-algorithm', 'EAGLE'])),
     ['gpuhost:sglang.speculative']),
    ('speculative prefix', m(((S, 'extra_args'), ['--speculative-algo', 'EAGLE'])), ['gpuhost:sglang.speculative']),
    ('--port', m(((S, 'extra_args'), ['--port', '1'])), ['gpuhost:sglang.port']),
    ('--model-path', m(((S, 'extra_args'), ['--model-path', '/x'])), ['gpuhost:sglang.model_path']),
    ('--served-model-name', m(((S, 'extra_args'), ['--served-model-name', 'x'])), ['served_model_name']),
    ('--mem-fraction-static', m(((S, 'extra_args'), ['--mem-fraction-static', '0.9'])), ['mem_fraction_static']),
    ('--dp-size', m(((S, 'extra_args'), ['--dp-size', '2'])), ['gpuhost:sglang.tp']),
    ('--host', m(((S, 'extra_args'), ['--host', '127.0.0.1'])), ['gpuhost:sglang.host']),
    ('unknown flag', m(((S, 'extra_args'), ['--contxt-length', '4096'])), ['--contxt-length', 'did you mean']),
    ('bad value type', m(((S, 'extra_args'), ['--context-length', 'abc'])), ['abc']),
    ('positional', m(((S, 'extra_args'), ['serve'])), ['serve']),
    ('--help', m(((S, 'extra_args'), ['--help'])), ['--help']),
    ('removed flag', m(((S, 'extra_args'), ['--mamba-scheduler-strategy', 'extra_buffer'])),
     ['--mamba-scheduler-strategy']),
    ('too new for the version', m(((S, 'version'), '0.5.12'), ((S, 'extra_args'), ['--cuda-graph-max-bs-decode', '64'])),
     ['--cuda-graph-max-bs-decode', '0.5.12']),
    # 5. Silent loss.
    ('namespace typo', m((('gpuhots:vm',), {'vmid': 300})), ['gpuhots:vm', 'did you mean gpuhost:vm']),
    ('other namespace, our key', m((('gpu-host:sglang',), {'tp': 4})), ['gpu-host:sglang', 'gpuhost:sglang']),
    ('unknown top-level key', m((('gpuhost:vms',), {'vmid': 300})), ['gpuhost:vms', 'did you mean vm']),
    ('dotted key without namespace', m((('gpuhost:gpuhost.vm',), {'vmid': 300})), ['did you mean vm']),
    ('unknown nested key', m(((C, 'cpus'), 8)), ['gpuhost:container.cpus', 'did you mean cores']),
    ('unknown deep key', m(((S, 'speculative', 'num_step'), 1)), ['num_step', 'did you mean num_steps']),
    ('removed vfio section', m((('gpuhost:vfio',), {'bind': 'id'})), ['gpuhost:vfio', 'PCI address']),
    ('same vmid for both guests', m(((V, 'vmid'), 200)), ['gpuhost:vm.vmid', '200']),
    ('half a speculation setting', m(((S, 'speculative'), {'algorithm': 'NEXTN'})),
     ['gpuhost:sglang.speculative', 'speculative: null']),
    # 6. Coercion and smuggled properties.
    ('port true', m(((S, 'port'), True)), ['gpuhost:sglang.port', 'True is not a whole number']),
    ('port as string', m(((S, 'port'), '30000')), ['gpuhost:sglang.port', 'without quotes']),
    ('port as float', m(((S, 'port'), 30000.5)), ['gpuhost:sglang.port']),
    ('tp as string', m(((S, 'tp'), '4')), ['gpuhost:sglang.tp']),
    ('vmid as string', m(((C, 'vmid'), '200')), ['gpuhost:container.vmid']),
    ('onboot as string', m(((C, 'onboot'), 'yes')), ['gpuhost:container.onboot', 'true or false']),
    ('onboot as number', m(((C, 'onboot'), 1)), ['gpuhost:container.onboot', 'true or false']),
    ('mem fraction bool', m(((S, 'mem_fraction_static'), True)), ['gpuhost:sglang.mem_fraction_static']),
    ('mem fraction out of range', m(((S, 'mem_fraction_static'), 1.2)), ['mem_fraction_static', 'outside (0, 1)']),
    ('bridge with comma', m(((C, 'bridge'), 'vmbr0,rate=1')), ['gpuhost:container.bridge', 'not a Linux bridge']),
    ('hostname with comma', m(((C, 'hostname'), 'sglang,foo=1')), ['gpuhost:container.hostname']),
    ('ip with comma', m(((C, 'ip'), '127.0.21.4/8,gw=1.1.1.1')), ['gpuhost:container.ip']),
    ('gateway with comma', m(((C, 'gateway'), '1.1.1.1,x')), ['gpuhost:container.gateway']),
    ('nameserver junk', m(((C, 'nameserver'), '8.8.8.8,x')), ['gpuhost:container.nameserver']),
    ('storage with comma', m(((C, 'storage'), 'local-lvm,size=1')), ['gpuhost:container.storage']),
    ('template traversal', m(((C, 'ostemplate'), 'local:vztmpl/../../etc/passwd')), ['gpuhost:container.ostemplate']),
    ('vm name with space', m(((V, 'name'), 'snp gpu')), ['gpuhost:vm.name']),
    ('vm bridge with comma', m(((V, 'bridge'), 'vmbr0,tag=5')), ['gpuhost:vm.bridge']),
    ('overlapping numa cpus', m(((H, 'numa_cpus'), {'0': '0-31', '1': '16-47'})),
     ['gpuhost:host.numa_cpus', 'CPU 16', 'node 0 and node 1']),
    ('reversed cpu range', m(((H, 'numa_cpus'), {'0': '31-0', '1': '32-63'})), ['runs backwards', '0-31']),
    ('cpu list garbage', m(((H, 'numa_cpus'), {'0': 'all', '1': '32-63'})), ['not a CPU list']),
    ('gpus as a string', m(((C, 'gpus'), '0000:01:00.0')), ['gpuhost:container.gpus', 'not a list']),
    ('health timeout zero', m(((S, 'health_timeout_s'), 0)), ['gpuhost:sglang.health_timeout_s']),
    ('rootfs size bool', m(((C, 'rootfs_gb'), True)), ['gpuhost:container.rootfs_gb']),
    ('host address with shell', m(((H, 'address'), 'pve;rm -rf /')), ['gpuhost:host.address']),
    ('ssh user newline', m(((H, 'ssh', 'user'), 'root\n')), ['gpuhost:host.ssh.user', 'control']),
    ('api user without realm', m(((H, 'api', 'user'), 'root')), ['gpuhost:host.api.user']),
    ('api port zero', m(((H, 'api', 'port'), 0)), ['gpuhost:host.api.port']),
    ('numa as string', m(((V, 'numa'), '1')), ['gpuhost:vm.numa']),
    ('nvidia option as bool', m((('gpuhost:nvidia', 'dma_remap_peer_mmio'), True)),
     ['gpuhost:nvidia.dma_remap_peer_mmio', 'whole number']),
    ('line separator in a value', m(((S, 'environment'), {'FOO': 'a\u2028ExecStartPre=/bin/id'})),
     ['environment.FOO', 'control']),
    ('bidi override in a name', m(((S, 'served_model_name'), 'qwen\u202egpj')), ['served_model_name', 'control']),
    ('flag and value in one item', m(((S, 'extra_args'), ['--tp 8'])), ['extra_args[0]', "'--tp', '8'"]),
    ('ca file is a device', m(((H, 'api', 'ca_file'), '/dev/zero')), ['gpuhost:host.api.ca_file', 'regular file']),
    ('huge environment value', m(((S, 'environment'), {'FOO': 'x' * 5000})), ['gpuhost:sglang.environment.FOO']),
    ('duplicate inventory entry', m(((H, 'gpus'), 'DUP')), ['gpuhost:host.gpus', 'listed twice']),
    # Regressions of the first refusal table: GPUs, NUMA, parallelism, speculation.
    ('malformed PCI address', m(((C, 'gpus'), ['0000:1:00.0', '0000:11:00.0', '0000:61:00.0', '0000:71:00.0'])),
     ["gpuhost:container.gpus[0]: '0000:1:00.0' is not a PCI address", '0000:01:00.0']),
    ('uppercase PCI address', m(((C, 'gpus'), ['0000:E1:00.0', '0000:11:00.0', '0000:61:00.0', '0000:71:00.0'])),
     ['lowercase hex']),
    ('GPU on both sides', m(((V, 'gpus'), ['0000:01:00.0', '0000:91:00.0', '0000:e1:00.0', '0000:f1:00.0'])),
     ['gpuhost:vm.gpus: 0000:01:00.0 is already given to the container']),
    ('NUMA mismatch', m(((C, 'gpus'), ['0000:01:00.0', '0000:11:00.0', '0000:61:00.0', '0000:81:00.0']),
                        ((V, 'gpus'), ['0000:71:00.0', '0000:91:00.0', '0000:e1:00.0', '0000:f1:00.0'])),
     ['gpuhost:container.gpus: 0000:81:00.0 sits on NUMA node 1 but the container is placed on NUMA node 0']),
    ('GPU not in the inventory', m(((C, 'gpus'), ['0000:01:00.0', '0000:11:00.0', '0000:61:00.0', '0000:31:00.0'])),
     ['0000:31:00.0 is not in gpuhost:host.gpus']),
    ('tensor parallelism', m(((S, 'tp'), 2)), ['gpuhost:sglang.tp: 2 but the container has 4 GPUs', 'set tp: 4']),
    ('partial speculation', m(((S, 'speculative'), {'algorithm': 'NEXTN', 'num_steps': 1})),
     ['gpuhost:sglang.speculative: num_steps=1 set but eagle_topk, num_draft_tokens missing']),
    ('topk 1 draft tokens', m(((S, 'speculative'), {'num_steps': 1, 'eagle_topk': 1, 'num_draft_tokens': 4})),
     ['num_draft_tokens: 4 with eagle_topk 1', 'set num_draft_tokens: 2']),
    ('ambiguous flag', m(((S, 'extra_args'), ['--cuda-graph-max-bs', '256'])),
     ['ambiguous option --cuda-graph-max-bs', '--cuda-graph-max-bs-decode']),
    ('non-root API user', m(((H, 'api', 'user'), 'deploy@pve')), ["gpuhost:host.api.user: 'deploy@pve'", 'root@pam']),
    # 7. Keys and certificates parsed at preview; clear messages.
    ('host key bad padding', m(((H, 'ssh', 'host_key_file'), DELETE),
                                ((H, 'ssh', 'host_key'), 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIIlXMOnzn+VUtUJ2HPp')),
     ['gpuhost:host.ssh.host_key', 'base64']),
    ('host key of another type', m(((H, 'ssh', 'host_key_file'), DELETE),
                                   ((H, 'ssh', 'host_key'), 'ssh-ed25519 ' + RSA_BLOB)),
     ['gpuhost:host.ssh.host_key', 'not ssh-ed25519']),
    ('host key garbage', m(((H, 'ssh', 'host_key_file'), DELETE), ((H, 'ssh', 'host_key'), 'not a key')),
     ['gpuhost:host.ssh.host_key', 'not a public key line']),
    ('ca cert garbage', m(((H, 'api', 'ca_file'), DELETE), ((H, 'api', 'ca_cert'), 'garbage')),
     ['gpuhost:host.api.ca_cert', 'not a PEM certificate']),
    ('ca file missing', m(((H, 'api', 'ca_file'), '/nonexistent/ca.pem')),
     ['gpuhost:host.api.ca_file', 'cannot read', '/nonexistent/ca.pem']),
    ('ca file not a cert', m(((H, 'api', 'ca_file'), '.lab/ssh/id_ed25519.pub')), ['ca_file', 'not a PEM certificate']),
    ('private key file not a key', m(((H, 'ssh', 'private_key_file'), '.lab/pve/fakepve.crt')),
     ['gpuhost:host.ssh.private_key_file', 'not an ed25519, ECDSA or RSA private key']),
    ('host key file missing', m(((H, 'ssh', 'host_key_file'), '/nonexistent.pub')),
     ['gpuhost:host.ssh.host_key_file', 'cannot read']),
    ('both key forms', m(((H, 'ssh', 'host_key'), 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIIlXMOnzn+VUtUJ2HPp/GySToF/fuDXoovapSPPhSllC')),
     ['gpuhost:host.ssh', 'exactly one']),
    ('api token', m(((H, 'api', 'token_id'), 'root@pam!deploy')), ['gpuhost:host.api.token_id', 'only root@pam']),
    # 8. The container's runtime: every value checked for where it lands, the files it names in the repository
    # read and parsed, the index password a secret.
    ('driver version with shell', m(((R, 'nvidia', 'version'), '580.95.05; reboot')),
     ['gpuhost:runtime.nvidia.version', 'not an NVIDIA driver version', '/sys/module/nvidia/version']),
    ('driver version as a number', m(((R, 'nvidia', 'version'), 580.95)),
     ['gpuhost:runtime.nvidia.version', 'write it in quotes']),
    ('driver installer of another version',
     m(((R, 'nvidia', 'installer'), '/root/gpuhost-artifacts/NVIDIA-Linux-x86_64-580.105.08.run')),
     ['gpuhost:runtime.nvidia.installer', 'installs driver 580.105.08, but version is 580.95.05']),
    ('driver installer not NVIDIA\'s', m(((R, 'nvidia', 'installer'), '/root/driver.sh')),
     ['gpuhost:runtime.nvidia.installer', "not NVIDIA's driver installer"]),
    ('driver installer relative', m(((R, 'nvidia', 'installer'), 'NVIDIA-Linux-x86_64-580.95.05.run')),
     ['gpuhost:runtime.nvidia.installer', 'not an absolute path']),
    ('driver installer with a newline', m(((R, 'nvidia', 'installer'), '/root/x\n.run')),
     ['gpuhost:runtime.nvidia.installer', 'control character']),
    ('driver source with credentials',
     m(((R, 'nvidia', 'source'), 'https://u:pw@dl.example.internal/NVIDIA-Linux-x86_64-580.95.05.run')),
     ['gpuhost:runtime.nvidia.source', 'holds credentials', 'pulumi config set --secret --path gpuhost:runtime.<nvidia|cuda>.token']),
    ('driver both uploaded and downloaded',
     m(((R, 'nvidia', 'source'), 'https://dl.example.internal/NVIDIA-Linux-x86_64-580.95.05.run')),
     ['gpuhost:runtime.nvidia', 'set exactly one of installer', 'and source']),
    ('plain installer mirror token',
     m(((R, 'nvidia', 'source'), 'https://dl.example.internal/NVIDIA-Linux-x86_64-580.95.05.run'),
       ((R, 'nvidia', 'installer'), DELETE), ((R, 'nvidia', 'token'), 'a-mirror-token-1234')),
     ['gpuhost:runtime.nvidia.token is set as plain text', 'pulumi config set --secret']),
    ('driver sha256 short', m(((R, 'nvidia', 'sha256'), 'abc123')),
     ['gpuhost:runtime.nvidia.sha256', 'not a sha256', 'sha256sum']),
    ('driver sha256 uppercase', m(((R, 'nvidia', 'sha256'), 'A' * 64)), ['gpuhost:runtime.nvidia.sha256']),
    ('cuda runfile of another version', m(((R, 'cuda', 'installer'), '/root/cuda_12.8.1_570.124.06_linux.run')),
     ['gpuhost:runtime.cuda.installer', 'installs CUDA 12.8.1, but version is 13.0.2']),
    ('cuda version the cuda_home does not name', m(((R, 'cuda', 'version'), '12.8.1'),
                                                   ((R, 'cuda', 'installer'), '/root/cuda_12.8.1_570.124.06_linux.run')),
     ['gpuhost:sglang.cuda_home: /usr/local/cuda-13.0 names CUDA 13.0', 'set cuda_home: /usr/local/cuda-12.8']),
    ('cuda_home a system directory the installer would write into', m(((S, 'cuda_home'), '/usr')),
     ["gpuhost:sglang.cuda_home: '/usr' is a system directory of the container", 'e.g. /usr/local/cuda-13.0']),
    ('cuda_home /usr/local\'s own lib', m(((S, 'cuda_home'), '/usr/local/lib')),
     ["gpuhost:sglang.cuda_home: '/usr/local/lib' is a system directory of the container"]),
    ('cuda 13 with a 575 driver', m(((R, 'nvidia', 'version'), '575.64.05'),
                                    ((R, 'nvidia', 'installer'), '/root/NVIDIA-Linux-x86_64-575.64.05.run')),
     ['gpuhost:runtime.nvidia.version: 575.64.05 is too old for CUDA 13.0.2', '580-series']),
    ('index URL with credentials', m(((R, 'python', 'index', 'url'), 'https://deploy:hunter2@pypi.example/simple')),
     ['gpuhost:runtime.python.index.url', 'holds credentials', '--secret --path gpuhost:runtime.python.index.password']),
    ('index URL not http', m(((R, 'python', 'index', 'url'), 'file:///srv/wheels')),
     ['gpuhost:runtime.python.index.url', 'not an http(s) URL']),
    ('index URL with a query', m(((R, 'python', 'index', 'url'), 'https://pypi.example/simple?x=1')),
     ['gpuhost:runtime.python.index.url', 'query']),
    ('index password in plain text', m(((R, 'python', 'index', 'password_file'), DELETE),
                                       ((R, 'python', 'index', 'password'), 'hunter2-not-secret')),
     ['gpuhost:runtime.python.index.password is set as plain text',
      'pulumi config set --secret --path gpuhost:runtime.python.index.password']),
    ('index password and its file', m(((R, 'python', 'index', 'password'), 'x')),
     ['gpuhost:runtime.python.index']),
    ('index user without password', m(((R, 'python', 'index', 'password_file'), DELETE)),
     ['gpuhost:runtime.python.index', 'a username needs a password']),
    ('index password file with a space', m(((R, 'python', 'index', 'password_file'), File('pw.txt', 'two words\n'))),
     ['gpuhost:runtime.python.index.password_file (pw.txt)', 'without spaces']),
    ('index and wheelhouse', m(((R, 'python', 'wheelhouse'), '/root/wheels')),
     ['gpuhost:runtime.python', 'exactly one package source']),
    ('no package source', m(((R, 'python', 'index'), DELETE)), ['exactly one package source']),
    ('wheelhouse relative', m(((R, 'python', 'index'), DELETE), ((R, 'python', 'wheelhouse'), 'wheels')),
     ['gpuhost:runtime.python.wheelhouse', 'not an absolute path']),
    ('lock outside the repository', m(((R, 'python', 'lock'), '../../etc/passwd')),
     ['gpuhost:runtime.python.lock', 'not a normalised relative path inside the repository']),
    ('lock by absolute path', m(((R, 'python', 'lock'), '/etc/passwd')),
     ['gpuhost:runtime.python.lock', 'not a path inside the repository']),
    ('lock through a link out of the repository', m(((R, 'python', 'lock'), File('evil.lock', 'symlink:/etc/hostname'))),
     ['gpuhost:runtime.python.lock', 'evil.lock leads outside the repository', '/etc/hostname']),
    ('lock without hashes', m(((R, 'python', 'lock'), File('nohash.lock', 'pip==23.2.1\nsglang==0.5.23\n'))),
     ['gpuhost:runtime.python.lock (nohash.lock), line 1', 'pip==23.2.1 has no --hash', 'generate-hashes']),
    ('lock with a range', m(((R, 'python', 'lock'), File('range.lock', LOCK + 'torch>=2 --hash=sha256:%s\n' % H1))),
     ['line 3', 'not pinned to one version']),
    ('lock naming an index', m(((R, 'python', 'lock'), File('idx.lock', '--extra-index-url https://x/simple\n' + LOCK))),
     ['line 1', '--extra-index-url names a package source']),
    ('lock of another SGLang', m(((R, 'python', 'lock'), File('old.lock', LOCK.replace('0.5.23', '0.5.22')))),
     ['pins sglang==0.5.22, but gpuhost:sglang.version is 0.5.23']),
    ('lock without SGLang', m(((R, 'python', 'lock'), File('nosg.lock', LOCK.splitlines()[0] + '\n'))),
     ['pins no sglang']),
    ('lock without pip', m(((R, 'python', 'lock'), File('nopip.lock', LOCK.splitlines()[1] + '\n'))),
     ['pins no pip', '--allow-unsafe']),
    ('lock missing', m(((R, 'python', 'lock'), 'runtime/none.lock')),
     ['gpuhost:runtime.python.lock (runtime/none.lock)', 'cannot read']),
    ('patch outside the repository', m(((R, 'python', 'patches'), ['../sm120.patch'])),
     ['gpuhost:runtime.python.patches[0]', 'inside the repository']),
    ('patch that is not a diff', m(((R, 'python', 'patches'), [File('p/x.patch', 'just text\n')])),
     ['gpuhost:runtime.python.patches[0] (p/x.patch)', 'not a unified diff']),
    ('patch escaping site-packages', m(((R, 'python', 'patches'), [File(
        'p/evil.patch', '--- a/../../../etc/passwd\n+++ b/../../../etc/passwd\n@@ -1 +1 @@\n-root\n+evil\n')])),
     ['gpuhost:runtime.python.patches[0] (p/evil.patch)', 'not a relative path inside the tree']),
    ('patch listed twice', m(((R, 'python', 'patches'), ['p/a.patch', 'p/a.patch'])), ['listed twice']),
    ('environments inside the venv', m(((R, 'python', 'envs_dir'), '/opt/sglang/venv/envs')),
     ['gpuhost:runtime.python.envs_dir', 'overlap']),
    ('environments in /usr', m(((R, 'python', 'envs_dir'), '/usr')),
     ["gpuhost:runtime.python.envs_dir: '/usr' is a system directory", 'e.g. /opt/sglang/envs']),
    ('keep too many', m(((R, 'python', 'keep'), 50)), ['gpuhost:runtime.python.keep']),
    ('python version', m(((R, 'python', 'version'), '3')), ['gpuhost:runtime.python.version', 'Python minor version']),
    ('unknown runtime key', m(((R, 'nvidia', 'driver'), '580.95.05')),
     ['gpuhost:runtime.nvidia.driver is not a setting here']),
    # 9. Secrets given as plain config.
    ('plain password', m(((H, 'api', 'password_file'), DELETE), ((H, 'api', 'password'), 'hunter2-not-secret')),
     ['gpuhost:host.api.password is set as plain text', 'pulumi config set --secret --path gpuhost:host.api.password']),
    ('plain private key', m(((H, 'ssh', 'private_key_file'), DELETE), ((H, 'ssh', 'private_key'), 'PRIVATE')),
     ['gpuhost:host.ssh.private_key is set as plain text', 'pulumi config set --secret']),
    # 10. The model (gpuhost:model).
    ('model path outside the mount', m(((S, 'model_path'), '/opt/models/Qwen3.5-122B-A10B')),
     ['gpuhost:sglang.model_path', 'is not inside the model mount gpuhost:model.mount (/models)']),
    ('model revision a branch', m(((MD, 'revision'), 'main')), ['gpuhost:model.revision', 'is a branch, which moves']),
    ('model revision with a shell', m(((MD, 'revision'), 'v1;id')), ['gpuhost:model.revision', 'is not a commit']),
    ('model source with credentials', m(((MD, 'source'), 'https://u:pw@mirror.example.internal/Q')),
     ['gpuhost:model.source: holds credentials']),
    ('model source with a token in the query', m(((MD, 'source'), 'https://mirror.example.internal/Q?token=abc')),
     ['gpuhost:model.source: holds credentials']),
    ('plain model token', m(((MD, 'source'), 'hf://Qwen/Qwen3.5-122B-A10B'), ((MD, 'token'), 'hf_plain0123456789abcdef')),
     ['gpuhost:model.token is set as plain text', 'pulumi config set --secret --path gpuhost:model.token']),
    ('model checksums outside the repository', m(((MD, 'checksums'), '../../etc/shadow')),
     ['gpuhost:model.checksums', 'not a normalised relative path']),
    ('model mounted over /etc', m(((MD, 'mount'), '/etc')), ['gpuhost:model.mount', 'is a system directory']),
]

# Accepted: hostile-looking but harmless; preview succeeds and nothing changes.
ACCEPTED = [
    ('environment with quotes, $, % and backslash',
     m(((S, 'environment'), {'NCCL_DEBUG': 'INFO', 'ODD': 'a b "c" $HOME ${X} %n \\ ; \' end'}))),
    ('extra flag', m(((S, 'extra_args'), ['--context-length', '32768', '--chunked-prefill-size=8192']))),
    ('served name with slash', m(((S, 'served_model_name'), 'Qwen/Qwen3.5-122B-A10B'))),
    ('harmless kernel argument', m(((I, 'extra_kernel_args'), ['pcie_aspm=off', 'amd_iommu=force_isolation']))),
    ('tokenizer environment', m(((S, 'environment'), {'TOKENIZERS_PARALLELISM': 'false'}))),
    # A hub id is SGLang's to fetch: no weights on host storage (gpuhost:model names local ones).
    ('hub model id', m(((S, 'model_path'), 'Qwen/Qwen3.5-122B-A10B'), (('gpuhost:model',), DELETE))),
    ('speculation off', m(((S, 'speculative'), None))),
    ('a wheelhouse instead of an index', m(((R, 'python', 'index'), DELETE), ((R, 'python', 'wheelhouse'), '/root/wheels'))),
    ('a patch', m(((R, 'python', 'patches'), [File('runtime/patches/sm120-fp4.patch',
                                                   '--- a/sglang/x.py\n+++ b/sglang/x.py\n@@ -1 +1 @@\n-a\n+b\n')]))),
    ('no runtime: the operator installs SGLang', m((('gpuhost:runtime',), DELETE))),
]


def put_files(project, node):
    """The File values of a config written into the project, each replaced by its path."""
    if isinstance(node, File):
        rel, text = node
        path = os.path.join(project, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.lexists(path):
            os.unlink(path)
        if text.startswith('symlink:'):
            os.symlink(text[len('symlink:'):], path)
        else:
            with open(path, 'w') as f:
                f.write(text)
        return rel
    if isinstance(node, dict):
        return {k: put_files(project, v) for k, v in node.items()}
    if isinstance(node, list):
        return [put_files(project, v) for v in node]
    return node


def apply(cfg, changes):
    cfg = copy.deepcopy(cfg)
    for path, value in changes:
        if path == (H, 'gpus') and value == 'DUP':
            cfg[H]['gpus'] = cfg[H]['gpus'] + [cfg[H]['gpus'][0]]
            continue
        node = cfg
        for key in path[:-1]:
            node = node.setdefault(key, {})
        if value is DELETE:
            node.pop(path[-1], None)
        else:
            node[path[-1]] = value
    return cfg


# Through the real CLI: at least one case of every class, chosen where the CLI's part could differ -
# a multi-line message, a key in another namespace, a quoted number in YAML, a file path relative to
# the project, the engine's secret flag.
CLI_SAMPLE = ('extra_args newline', 'iommu=pt', '--tp 8', 'namespace typo', 'port as string',
              'private key file not a key', 'plain password', 'lock without hashes', 'index URL with credentials')
CLI_ACCEPTED = ('environment with quotes, $, % and backslash', 'harmless kernel argument')
CLI_REFUSED = [c for c in CASES if c[0] in CLI_SAMPLE]
CLI_HARMLESS = [c for c in ACCEPTED if c[0] in CLI_ACCEPTED]
assert len(CLI_REFUSED) == len(CLI_SAMPLE) and len(CLI_HARMLESS) == len(CLI_ACCEPTED), 'a sampled case was renamed'


@pytest.fixture(scope='module')
def base(lab):
    cfg = lab.stack_config()
    lab.write_stack(STACK, cfg)
    return cfg


def engine_config(cfg):
    """The stack's config as the CLI hands it to the program: one entry per top-level key (every
    namespace), a string as it is and anything else as JSON; no secure: values here (none of the
    cases has one - the CLI would decrypt them and list their keys as secret)."""
    def no_secure(node):
        if isinstance(node, dict):
            assert set(node) != {'secure'}, 'engine_config cannot decrypt a secure: value'
        for child in node.values() if isinstance(node, dict) else node if isinstance(node, list) else ():
            no_secure(child)
    no_secure(cfg)
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in cfg.items()}


def load(lab, cfg):
    """config.load_stack(project) for `cfg` as stack STACK, in the project directory with the stack's
    file written (as `pulumi preview --stack STACK` would run it), in a context of its own so the
    SDK's config and stack name do not outlive the call."""
    cfg = put_files(lab.project, cfg)
    with open(os.path.join(lab.project, 'Pulumi.%s.yaml' % STACK), 'w') as f:
        yaml.safe_dump({'config': cfg}, f, sort_keys=False)

    def run():
        pulumi.runtime.config.set_all_config(engine_config(cfg), [])
        pulumi.runtime.settings._set_stack(STACK)
        pulumi.runtime.settings.SETTINGS.dry_run = True   # (a preview)
        return config.load_stack(lab.project)
    cwd, backend = os.getcwd(), os.environ.get('PULUMI_BACKEND_URL')
    os.chdir(lab.project)
    # The program sees the CLI's environment: the lab project's backend.
    os.environ['PULUMI_BACKEND_URL'] = lab.env['PULUMI_BACKEND_URL']
    try:
        return contextvars.copy_context().run(run)
    finally:
        os.chdir(cwd)
        if backend is None:
            os.environ.pop('PULUMI_BACKEND_URL', None)
        else:
            os.environ['PULUMI_BACKEND_URL'] = backend


def refusal(lab, cfg):
    """The refusal's text (__main__ raises it as the run's error), or the test fails if accepted."""
    try:
        load(lab, cfg)
    except config.ConfigError as e:
        return str(e)
    pytest.fail('accepted by config.load_stack')


@pytest.mark.parametrize('name,changes,messages', CASES, ids=[c[0] for c in CASES])
def test_refused_by_the_config(lab, base, name, changes, messages):
    message = refusal(lab, apply(base, changes))
    for text in messages:
        assert text in message, 'missing %r in:\n%s' % (text, message)


@pytest.mark.parametrize('name,changes', ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_accepted_by_the_config(lab, base, name, changes):
    fleet, inputs, _ = load(lab, apply(base, changes))
    # What preview goes on to build from it renders: unit, container and VM config, command line.
    assert render.files(fleet.hosts[0].deployment, inputs[0][2])


def preview(lab, cfg):
    cfg = put_files(lab.project, cfg)
    lab.write_stack(STACK, cfg)
    sessions, digest = lab.ssh_sessions(), lab.host_digest()
    res = lab.pulumi('preview', stack=STACK, check=False)
    out = res.stdout + res.stderr
    assert 'Traceback' not in out and 'File "' not in out, out[-3000:]
    assert lab.ssh_sessions() == sessions, 'preview ran a command on the host'
    assert lab.host_digest() == digest
    return res, out


@pytest.mark.parametrize('name,changes,messages', CLI_REFUSED, ids=[c[0] for c in CLI_REFUSED])
def test_refused_at_preview(lab, base, name, changes, messages):
    cfg = apply(base, changes)
    res, out = preview(lab, cfg)
    assert res.returncode != 0, 'accepted:\n' + out[-3000:]
    for text in messages:
        assert text in out, 'missing %r in:\n%s' % (text, out[-3000:])
    # What the in-process cases check is what the operator reads, every line of it.
    for line in refusal(lab, cfg).splitlines():
        assert line.strip() in out, 'line %r of the refusal not shown:\n%s' % (line, out[-3000:])
    assert lab.node().lxc.get() == [] and lab.node().qemu.get() == []


@pytest.mark.parametrize('name,changes', CLI_HARMLESS, ids=[c[0] for c in CLI_HARMLESS])
def test_accepted_harmless(lab, base, name, changes):
    res, out = preview(lab, apply(base, changes))
    assert res.returncode == 0, out[-3000:]


def test_a_password_set_as_a_secret_is_accepted(lab, base):
    cfg = apply(base, [((H, 'api', 'password_file'), DELETE)])
    lab.write_stack(STACK, cfg)
    with open(lab.info['pve']['password_file']) as f:
        # On stdin, as README gives it (the lab's random password may start with '-': a flag to the CLI).
        lab.pulumi('config', 'set', '--secret', '--path', 'gpuhost:host.api.password', stack=STACK, input=f.read())
    res = lab.pulumi('preview', stack=STACK, check=False)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]


def history_records(lab, text):
    """The stack's update records in the lab project's file backend that hold `text`."""
    d = os.path.join(lab.env['PULUMI_BACKEND_URL'][len('file://'):], '.pulumi', 'history', 'gpuhost', STACK)
    out = []
    for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        if name.endswith('.history.json'):
            with open(os.path.join(d, name)) as f:
                if text in f.read():
                    out.append(os.path.join(d, name))
    return d, out


def test_a_plain_credential_the_update_history_already_holds_is_named_there_with_rotate(lab, base):
    """Refused at preview - but an `up --skip-preview` (or a `pulumi refresh`, which does not run the program)
    has already written the stack's config, the plain password with it, into the backend's update history:
    the refusal says so, where, and to rotate it; once the records are gone, it says that too."""
    password = 'hunter2-pasted-by-mistake'
    cfg = apply(base, [((H, 'api', 'password_file'), DELETE), ((H, 'api', 'password'), password)])
    cfg = put_files(lab.project, cfg)
    lab.write_stack(STACK, cfg)
    sessions = lab.ssh_sessions()
    res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and lab.ssh_sessions() == sessions, out[-3000:]
    hist, records = history_records(lab, password)
    assert len(records) == 1, 'the refused update was not recorded with the password: %s' % hist
    assert "and in this run's record, written to %s/ when it ends" % hist in out, out[-3000:]
    res, out = preview(lab, cfg)
    assert res.returncode != 0 and password not in out
    assert ('gpuhost:host.api.password is set as plain text, so it would be stored unencrypted in the stack\'s config '
            'and state. It is already recorded in plain text - in Pulumi.%s.yaml and in 1 update record of the stack\'s '
            'history in the backend %s (%s)' % (STACK, lab.env['PULUMI_BACKEND_URL'], records[0])) in out, out[-3000:]
    assert 'treat it as disclosed: rotate it (a new one where it is used), delete those records' in out
    assert 'pulumi config set --secret --path gpuhost:host.api.password' in out
    for record in records:   # as the refusal says
        os.unlink(record)
    res, out = preview(lab, cfg)
    assert res.returncode != 0
    assert ('It is recorded in plain text in Pulumi.%s.yaml (the update history in the backend, %s/, holds no record '
            'of it): if that file was committed or shared, rotate it' % (STACK, hist)) in out, out[-3000:]
    lab.write_stack(STACK, base)
