"""The stack's configuration: one validated model, the single source of truth for every default.

Loaded from structured Pulumi config (namespace `gpuhost`, one object per top-level key below).
Everything that can be refused without touching a host is refused here, at preview, with a message
that names the config key, the bad value and the fix. Warnings are collected on the model
(`Deployment.warnings`) and shown by the program with pulumi.log.warn.

`python -m config schema` prints the JSON schema (docs/config.schema.json is generated from it).
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from components import sglang_flags

BDF_RE = re.compile(r'^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$')
PCI_ID_RE = re.compile(r'^[0-9a-f]{4}:[0-9a-f]{4}$')
# RTX PRO 6000 Blackwell: Workstation, Max-Q, Server Edition (SYSTEM.md). Their GSP/FSP fails to
# boot (error 0x177) after running in an identity IOMMU domain and only a power cycle clears it.
BLACKWELL_IDS = frozenset({'10de:2bb1', '10de:2bb4', '10de:2bb5'})
FSP_EXPLANATION = ('identity (passthrough) IOMMU domains brick RTX PRO 6000 Blackwell GPUs until a power '
                   'cycle: the GPU firmware security processor fails to boot with error 0x177 and no FLR, '
                   'secondary bus reset or CXL reset clears it. SEV-SNP also needs a translating IOMMU')
NVIDIA_CONTROL_DEVICES = ('/dev/nvidiactl', '/dev/nvidia-uvm', '/dev/nvidia-uvm-tools', '/dev/nvidia-modeset')


class ConfigError(ValueError):
    """A refused configuration. str() is the operator-facing message."""


class Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra='forbid')


# ----------------------------------------------------------------------------- host

class Ssh(Model):
    port: int = Field(22, ge=1, le=65535)
    user: str = 'root'
    host_key: Optional[str] = Field(None, description='The host\'s public key, "ssh-ed25519 AAAA..." '
                                                      '(authorized_keys form); pinned: a different key fails')
    host_key_file: Optional[str] = Field(None, description='Or: path of the host\'s .pub key file')
    private_key: Optional[SecretStr] = Field(None, description='Client private key (PEM/OpenSSH); a secret')
    private_key_file: Optional[str] = Field(None, description='Or: path of the client private key file')
    connect_timeout: float = Field(10.0, gt=0)

    @field_validator('host_key')
    @classmethod
    def _host_key(cls, v):
        if v is None:
            return v
        parts = v.split()
        if len(parts) < 2 or not parts[0].startswith(('ssh-', 'ecdsa-')):
            raise ValueError('gpuhost:host.ssh.host_key: %r is not a public key line; give the host\'s '
                             '"ssh-ed25519 AAAA..." line (ssh-keyscan -t ed25519 <host>)' % v[:40])
        return ' '.join(parts[:2])

    @model_validator(mode='after')
    def _one_key(self):
        if (self.host_key is None) == (self.host_key_file is None):
            raise ValueError('gpuhost:host.ssh: set exactly one of host_key ("ssh-ed25519 AAAA...", from '
                             'ssh-keyscan -t ed25519 <host>, verified out of band) or host_key_file')
        if (self.private_key is None) == (self.private_key_file is None):
            raise ValueError('gpuhost:host.ssh: set exactly one of private_key (a secret: pulumi config set '
                             '--secret --path gpuhost:host.ssh.private_key < key) or private_key_file')
        return self


class Api(Model):
    address: Optional[str] = Field(None, description='API address if not gpuhost:host.address')
    port: int = Field(8006, ge=1, le=65535)
    user: str = 'root@pam'
    password: Optional[SecretStr] = Field(None, description='root@pam password; a secret')
    password_file: Optional[str] = None
    token_id: Optional[str] = Field(None, description='API token id (user@realm!name); refused for this '
                                                      'program, see README')
    token_secret: Optional[SecretStr] = None
    ca_cert: Optional[str] = Field(None, description='PEM of the CA that signed the API certificate')
    ca_file: Optional[str] = None
    timeout: float = Field(30.0, gt=0)

    @model_validator(mode='after')
    def _auth(self):
        if self.ca_cert is None and self.ca_file is None:
            raise ValueError('gpuhost:host.api: set ca_cert (PEM) or ca_file; TLS is always verified '
                             '(Proxmox\'s CA is /etc/pve/pve-root-ca.pem on the host)')
        return self


class GpuInfo(Model):
    address: str = Field(description='PCI address, 0000:01:00.0 (lowercase hex)')
    numa: int = Field(ge=0)
    id: str = Field(description='vendor:device as `lspci -nn` shows it, 10de:2bb5')

    @field_validator('address')
    @classmethod
    def _bdf(cls, v):
        if not BDF_RE.match(v):
            raise ValueError('gpuhost:host.gpus[].address: %r is not a PCI address; write it as '
                             'domain:bus:device.function in lowercase hex, e.g. 0000:01:00.0' % v)
        return v

    @field_validator('id')
    @classmethod
    def _id(cls, v):
        if not PCI_ID_RE.match(v):
            raise ValueError('gpuhost:host.gpus[].id: %r is not a vendor:device ID; write e.g. 10de:2bb5' % v)
        return v


class Host(Model):
    address: str = Field(description='DNS name (or address) of the Proxmox host, for SSH and the API')
    node: str = Field(description='Proxmox node name')
    ssh: Ssh
    api: Api
    gpus: list[GpuInfo] = Field(description='The host\'s GPU inventory; checked against the host at apply')
    numa_cpus: dict[int, str] = Field(description='Host CPUs of each NUMA node, "0-31,64-95"')
    reboot: Literal['never', 'when-required'] = Field(
        'never', description='when-required: reboot the host after a change that needs it, wait for SSH '
                             'and re-read the facts. Off by default: a reboot stops every guest')

    @field_validator('numa_cpus')
    @classmethod
    def _cpus(cls, v):
        for node, cpus in v.items():
            if not re.match(r'^\d+(-\d+)?(,\d+(-\d+)?)*$', cpus):
                raise ValueError('gpuhost:host.numa_cpus.%s: %r is not a CPU list; write e.g. 0-31,64-95'
                                 % (node, cpus))
        return v

    @property
    def has_blackwell(self):
        return any(g.id in BLACKWELL_IDS for g in self.gpus)

    def gpu(self, address):
        return next((g for g in self.gpus if g.address == address), None)


# ---------------------------------------------------------------------------- iommu

FORBIDDEN_IOMMU_ARGS = {
    'iommu=pt': 'puts every device in an identity (passthrough) domain',
    'iommu.passthrough=1': 'puts every device in an identity (passthrough) domain',
    'iommu.passthrough=on': 'puts every device in an identity (passthrough) domain',
    'iommu.passthrough=y': 'puts every device in an identity (passthrough) domain',
}


class Iommu(Model):
    domain: Literal['DMA-FQ', 'DMA', 'identity'] = Field(
        'DMA-FQ', description='Default IOMMU domain type: DMA-FQ (translated, lazy flush; the default), DMA '
                              '(translated, strict flush). identity is refused on Blackwell hosts')
    extra_kernel_args: list[str] = Field(default_factory=list,
                                         description='More kernel command-line arguments to keep present')

    def kernel_args(self):
        """The arguments the host's command line must carry (order kept, duplicates dropped)."""
        base = {'DMA-FQ': ['iommu.passthrough=0', 'iommu.strict=0'],
                'DMA': ['iommu.passthrough=0', 'iommu.strict=1'],
                'identity': ['iommu.passthrough=1']}[self.domain]
        out = []
        for a in base + list(self.extra_kernel_args):
            if a not in out:
                out.append(a)
        return out


class Nvidia(Model):
    dma_remap_peer_mmio: Literal[0, 1] = Field(
        1, description='NVreg_DmaRemapPeerMmio (already 1 by default; written explicitly so it is visible '
                       'and diffable). No fix for P2P under translation: NCCL_P2P_DISABLE=1 is')


class Vfio(Model):
    bind: Literal['address', 'id'] = Field(
        'address', description='address: bind the VM\'s GPUs to vfio-pci by PCI address (driverctl). id '
                               '(vfio-pci.ids=) is refused when the container\'s GPUs share the ID')


# ---------------------------------------------------------------------- guests

class Container(Model):
    vmid: int = Field(ge=100, le=999999999)
    hostname: str = 'sglang'
    gpus: list[str] = Field(description='PCI addresses of the container\'s GPUs (stay on nvidia)')
    numa: int = Field(0, ge=0, description='NUMA node of the container\'s GPUs and CPUs')
    ostemplate: str
    storage: str = 'local-lvm'
    rootfs_gb: int = Field(200, ge=1)
    unprivileged: bool = True
    cores: int = Field(32, ge=1)
    memory_mb: int = Field(262144, ge=512)
    swap_mb: int = Field(0, ge=0)
    bridge: str = 'vmbr0'
    ip: str = Field(description='Container address with prefix, 10.0.0.20/24')
    gateway: Optional[str] = None
    nameserver: Optional[str] = None
    onboot: bool = True

    @field_validator('ip')
    @classmethod
    def _ip(cls, v):
        try:
            ipaddress.ip_interface(v)
        except ValueError:
            raise ValueError('gpuhost:container.ip: %r is not an address with prefix; write e.g. 10.0.0.20/24' % v)
        if '/' not in v:
            raise ValueError('gpuhost:container.ip: %r has no prefix length; write e.g. %s/24' % (v, v))
        return v

    @property
    def address(self):
        return str(ipaddress.ip_interface(self.ip).ip)


class Snp(Model):
    allow_smt: bool = True
    kernel_hashes: bool = False


class Vm(Model):
    vmid: int = Field(ge=100, le=999999999)
    name: str = 'snp-gpu'
    gpus: list[str] = Field(description='PCI addresses of the VM\'s GPUs (bound to vfio-pci)')
    numa: int = Field(1, ge=0)
    cores: int = Field(32, ge=1)
    memory_mb: int = Field(262144, ge=1024)
    sev: Literal['snp', 'none'] = 'snp'
    snp: Snp = Snp()
    bridge: str = 'vmbr0'
    start: bool = True


# ---------------------------------------------------------------------- sglang

class Speculative(Model):
    algorithm: Literal['NEXTN', 'EAGLE', 'EAGLE3'] = 'NEXTN'
    num_steps: Optional[int] = Field(None, ge=1)
    eagle_topk: Optional[int] = Field(None, ge=1)
    num_draft_tokens: Optional[int] = Field(None, ge=1)

    @model_validator(mode='after')
    def _triple(self):
        triple = {'num_steps': self.num_steps, 'eagle_topk': self.eagle_topk,
                  'num_draft_tokens': self.num_draft_tokens}
        unset = [k for k, v in triple.items() if v is None]
        if unset and len(unset) < 3:
            raise ValueError('gpuhost:sglang.speculative: %s set but %s missing; set all three (MTP on this '
                             'model: num_steps 1, eagle_topk 1, num_draft_tokens 2) or none' % (
                                 ', '.join('%s=%s' % (k, v) for k, v in triple.items() if v is not None),
                                 ', '.join(unset)))
        if not unset and self.eagle_topk == 1 and self.num_draft_tokens != self.num_steps + 1:
            raise ValueError('gpuhost:sglang.speculative.num_draft_tokens: %d with eagle_topk 1 and num_steps %d; '
                             'SGLang forces draft tokens = steps + 1 when topk is 1, so set num_draft_tokens: %d'
                             % (self.num_draft_tokens, self.num_steps, self.num_steps + 1))
        return self


class Sglang(Model):
    version: str = Field('0.5.23', description='The SGLang version installed in the container\'s virtualenv; '
                                               'flags are rendered and checked for it')
    venv: str = '/opt/sglang/venv'
    cuda_home: str = '/usr/local/cuda-13.0'
    unit: str = 'sglang-qwen.service'
    model_path: str
    served_model_name: str = 'qwen3.5-122b-a10b'
    tp: int = Field(4, ge=1)
    port: int = Field(30000, ge=1, le=65535)
    host: str = '0.0.0.0'
    mem_fraction_static: float = 0.75
    speculative: Optional[Speculative] = Speculative(num_steps=1, eagle_topk=1, num_draft_tokens=2)
    mamba_radix_cache_strategy: Optional[Literal['auto', 'no_buffer', 'extra_buffer', 'extra_buffer_lazy']] = None
    disable_custom_all_reduce: bool = Field(True, description='RTX PRO 6000 owners report custom all-reduce '
                                                              'trouble without P2P')
    extra_args: list[str] = Field(default_factory=list, description='More launch_server flags, checked '
                                                                    'against the declared version')
    environment: dict[str, str] = Field(default_factory=dict)
    health_timeout_s: float = Field(900.0, gt=0, description='How long a (re)start may take to pass /health')

    @field_validator('version')
    @classmethod
    def _version(cls, v):
        if not re.match(r'^\d+\.\d+\.\d+$', v):
            raise ValueError('gpuhost:sglang.version: %r is not a release number; write e.g. 0.5.23' % v)
        return v

    @field_validator('served_model_name')
    @classmethod
    def _name(cls, v):
        if ':' in v:
            raise ValueError('gpuhost:sglang.served_model_name: %r contains ":", which SGLang refuses; use e.g. %r'
                             % (v, v.replace(':', '-')))
        return v

    @field_validator('mem_fraction_static')
    @classmethod
    def _mem(cls, v):
        if not 0 < v < 1:
            raise ValueError('gpuhost:sglang.mem_fraction_static: %r is outside (0, 1); 0.75 leaves room for '
                             'the MTP draft model' % v)
        return v


# ------------------------------------------------------------------ deployment

class Deployment(Model):
    host: Host
    iommu: Iommu = Iommu()
    nvidia: Nvidia = Nvidia()
    vfio: Vfio = Vfio()
    container: Container
    vm: Optional[Vm] = None
    sglang: Sglang

    @model_validator(mode='after')
    def _cross(self):
        host = self.host
        sides = [('container', self.container)] + ([('vm', self.vm)] if self.vm else [])
        seen = {}
        for side, guest in sides:
            for addr in guest.gpus:
                if not BDF_RE.match(addr):
                    raise ValueError('gpuhost:%s.gpus: %r is not a PCI address; write it as domain:bus:device.'
                                     'function in lowercase hex, e.g. 0000:01:00.0' % (side, addr))
                if addr in seen:
                    raise ValueError('gpuhost:%s.gpus: %s is already given to the %s; a GPU goes to one side only '
                                     '- remove it from one of the lists' % (side, addr, seen[addr]))
                seen[addr] = side
                gpu = host.gpu(addr)
                if gpu is None:
                    raise ValueError('gpuhost:%s.gpus: %s is not in gpuhost:host.gpus; add it to the inventory '
                                     '(address, numa, id as lspci -nn shows) or fix the address' % (side, addr))
                if gpu.numa != guest.numa:
                    raise ValueError('gpuhost:%s.gpus: %s sits on NUMA node %d but the %s is placed on NUMA node %d;'
                                     ' give it to the other side or change gpuhost:%s.numa' % (
                                         side, addr, gpu.numa, side, guest.numa, side))
            if guest.numa not in host.numa_cpus:
                raise ValueError('gpuhost:%s.numa: %d has no CPU list in gpuhost:host.numa_cpus; add it' % (
                    side, guest.numa))
        if self.sglang.tp != len(self.container.gpus):
            raise ValueError('gpuhost:sglang.tp: %d but the container has %d GPUs; tensor parallelism must use '
                             'every container GPU - set tp: %d' % (self.sglang.tp, len(self.container.gpus),
                                                                   len(self.container.gpus)))
        self._check_iommu()
        if self.vfio.bind == 'id' and self.vm:
            vm_ids = {host.gpu(a).id for a in self.vm.gpus}
            shared = sorted(vm_ids & {host.gpu(a).id for a in self.container.gpus})
            if shared:
                raise ValueError('gpuhost:vfio.bind: "id" would bind every %s GPU to vfio-pci, including the '
                                 'container\'s; set bind: address (driverctl by PCI address)' % ', '.join(shared))
        self._check_api_auth()
        sglang_flags.check(self.sglang.version, self.launch_args(), self.sglang.environment)
        return self

    def _check_iommu(self):
        host = self.host
        args = self.iommu.kernel_args()
        bad = [(a, FORBIDDEN_IOMMU_ARGS[a]) for a in args if a in FORBIDDEN_IOMMU_ARGS]
        if self.iommu.domain == 'identity':
            bad.insert(0, ('domain: identity', 'asks for identity domains'))
        if bad and host.has_blackwell:
            what, why = bad[0]
            raise ValueError('gpuhost:iommu: %s %s, but the host has Blackwell GPUs (%s): %s. Use domain: DMA-FQ '
                             '(the default) and drop passthrough arguments' % (
                                 what, why, ', '.join(sorted({g.id for g in host.gpus} & BLACKWELL_IDS)),
                                 FSP_EXPLANATION))
        for a in args:
            if a.startswith('amd_iommu=') and 'pgtbl_v2' in a.split('=', 1)[1].split(',') and self.vm \
                    and self.vm.sev == 'snp':
                raise ValueError('gpuhost:iommu.extra_kernel_args: %s disables SEV-SNP on the host, which the VM '
                                 'needs; drop it' % a)
            if a.startswith('amd_iommu=') and a.split('=', 1)[1] in ('off',) and self.vm:
                raise ValueError('gpuhost:iommu.extra_kernel_args: %s turns the IOMMU off; vfio-pci and SEV-SNP '
                                 'need it - drop it' % a)

    def _check_api_auth(self):
        api = self.host.api
        root_only = []
        if self.container.gpus:
            root_only.append('devN (container GPUs)')
        if self.vm and self.vm.gpus:
            root_only.append('raw hostpciN')
        if self.vm and self.vm.sev != 'none':
            root_only.append('amd-sev')
        if self.vm:
            root_only.append('affinity')
        if not root_only:
            return
        if api.token_id or api.token_secret:
            raise ValueError('gpuhost:host.api.token_id: %r - Proxmox lets only root@pam with a password ticket set '
                             '%s; an API token, even root\'s, is refused. Remove token_id/token_secret and set '
                             'host.api.password (secret) for root@pam' % (api.token_id, ', '.join(root_only)))
        if api.user != 'root@pam':
            raise ValueError('gpuhost:host.api.user: %r - only root@pam may set %s; set user: root@pam' % (
                api.user, ', '.join(root_only)))
        if api.password is None and api.password_file is None:
            raise ValueError('gpuhost:host.api: no password for root@pam; set host.api.password as a secret '
                             '(pulumi config set --secret --path gpuhost:host.api.password)')

    # -------------------------------------------------------------- derived

    @property
    def warnings(self):
        out = []
        for a in self.iommu.kernel_args():
            if a == 'amd_iommu=on':
                out.append('gpuhost:iommu.extra_kernel_args: amd_iommu=on is not a valid value (the kernel logs '
                           '"Unknown option - \'on\'"); the AMD IOMMU is on by default, so it does nothing - drop it')
        if self.vfio.bind == 'id' and self.vm and self.vm.gpus:
            out.append('gpuhost:vfio.bind: "id" - the VM\'s GPUs are still bound by PCI address (driverctl), which '
                       'is what "id" would achieve without the risk of catching other GPUs; set bind: address')
        if self.vm and self.vm.sev != 'none' and self.vm.gpus:
            out.append('gpuhost:vm: SEV-%s together with PCI passthrough is listed by Proxmox as not supported '
                       '("very experimental"); this deployment runs it knowingly' % self.vm.sev.upper())
        out.extend(sglang_flags.warnings(self.sglang.version, self.launch_args(), self.sglang.environment,
                                         bool(self.sglang.speculative and self.sglang.speculative.num_steps)))
        return out

    @property
    def p2p_disabled(self):
        """Translated IOMMU: GPU peer-to-peer DMA does not work, so NCCL must not try it."""
        return self.iommu.domain != 'identity'

    def launch_args(self):
        """`python -m sglang.launch_server` arguments for the declared version (a list, never a string)."""
        s = self.sglang
        args = ['--model-path', s.model_path, '--served-model-name', s.served_model_name,
                '--host', s.host, '--port', str(s.port), '--tp-size', str(s.tp),
                '--mem-fraction-static', repr(s.mem_fraction_static), '--enable-metrics']
        spec = s.speculative
        if spec and spec.num_steps is not None:
            args += ['--speculative-algorithm', spec.algorithm,
                     '--speculative-num-steps', str(spec.num_steps),
                     '--speculative-eagle-topk', str(spec.eagle_topk),
                     '--speculative-num-draft-tokens', str(spec.num_draft_tokens)]
        if s.mamba_radix_cache_strategy:
            args += sglang_flags.mamba_strategy_args(s.version, s.mamba_radix_cache_strategy)
        if s.disable_custom_all_reduce:
            args.append('--disable-custom-all-reduce')
        return args + list(s.extra_args)

    def service_environment(self):
        s = self.sglang
        env = {'CUDA_HOME': s.cuda_home, 'PATH': '%s/bin:%s/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:'
                                                 '/sbin:/bin' % (s.venv, s.cuda_home)}
        if self.p2p_disabled:
            env['NCCL_P2P_DISABLE'] = '1'
        env.update(s.environment)
        return env

    def container_devices(self):
        """devN entries: one /dev/nvidiaN per container GPU, then the control devices.

        The nvidia driver numbers the GPUs it owns in bus order; with the VM's GPUs on vfio-pci the
        container's are /dev/nvidia0..N-1 (checked against /proc/driver/nvidia/gpus at apply)."""
        nodes = ['/dev/nvidia%d' % i for i in range(len(self.container.gpus))] + list(NVIDIA_CONTROL_DEVICES)
        return {'dev%d' % i: '%s,mode=0666' % path for i, path in enumerate(nodes)}


def read_file(path: str, root: str, what: str) -> str:
    full = path if os.path.isabs(path) else os.path.join(root, path)
    try:
        with open(full) as f:
            return f.read()
    except OSError as e:
        raise ConfigError('%s: cannot read %s: %s' % (what, full, e.strerror)) from None


def connection_inputs(d: Deployment, root: str) -> tuple:
    """(ssh connection, api) as plain dicts for the resources; the caller wraps them as secrets."""
    ssh, api = d.host.ssh, d.host.api
    key = ssh.private_key.get_secret_value() if ssh.private_key else read_file(
        ssh.private_key_file, root, 'gpuhost:host.ssh.private_key_file')
    host_key = ssh.host_key or ' '.join(read_file(ssh.host_key_file, root, 'gpuhost:host.ssh.host_key_file').split()[:2])
    password = api.password.get_secret_value() if api.password else read_file(
        api.password_file, root, 'gpuhost:host.api.password_file').strip()
    ca = api.ca_cert or read_file(api.ca_file, root, 'gpuhost:host.api.ca_file')
    connection = {'host': d.host.address, 'port': ssh.port, 'user': ssh.user, 'private_key': key,
                  'host_key': host_key, 'timeout': ssh.connect_timeout}
    api_in = {'host': api.address or d.host.address, 'port': api.port, 'user': api.user, 'password': password, 'ca_cert': ca,
              'timeout': api.timeout}
    return connection, api_in


def from_pulumi() -> Deployment:
    """The model from the running stack's `gpuhost:*` config (secure leaves arrive decrypted and go
    into SecretStr fields; the program hands them to resources only as Pulumi secrets)."""
    from pulumi.runtime.config import get_config
    data = {}
    for key in Deployment.model_fields:
        raw = get_config('gpuhost:' + key)
        if raw is None:
            continue
        try:
            data[key] = json.loads(raw)
        except ValueError:
            data[key] = raw
    unknown = sorted(k for k in _all_config_keys() if k.startswith('gpuhost:') and
                     k.split(':', 1)[1] not in Deployment.model_fields)
    if unknown:
        raise ConfigError('unknown config keys %s; the keys are %s' % (
            ', '.join(unknown), ', '.join('gpuhost:' + k for k in Deployment.model_fields)))
    return parse(data)


def _all_config_keys():
    import pulumi.runtime.config as rc
    return list(rc.CONFIG.get())


def parse(data: dict) -> Deployment:
    """Build the model from the `gpuhost` config namespace; raises ConfigError with readable messages."""
    try:
        return Deployment.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_errors(e)) from None


def format_errors(e: ValidationError) -> str:
    lines = []
    for err in e.errors(include_url=False, include_input=False):
        msg = err['msg']
        if msg.startswith('Value error, '):
            msg = msg[len('Value error, '):]
        loc = '.'.join(str(x) for x in err['loc'])
        if msg.startswith('gpuhost:'):
            lines.append(msg)
        else:
            top, _, rest = loc.partition('.')
            lines.append('gpuhost:%s%s: %s' % (top, '.' + rest if rest else '', msg))
    return 'invalid stack configuration:\n  - ' + '\n  - '.join(lines)


if __name__ == '__main__':
    import sys
    if sys.argv[1:] == ['schema']:
        print(json.dumps(Deployment.model_json_schema(), indent=2))
