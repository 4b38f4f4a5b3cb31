"""The stack's configuration: one validated model, the single source of truth for every default.

Loaded from structured Pulumi config (namespace `gpuhost`, one object per top-level key below).
Everything that can be refused without touching a host is refused here, at preview, with a message
that names the config key, the bad value and the fix. Warnings are collected on the model
(`Deployment.warnings`) and shown by the program with pulumi.log.warn.

Hostile or careless input is the normal case. So:
  * types are strict (no bool -> int, no "30000" -> 30000, no 1.0 -> 1), unknown keys and config
    namespaces that look like ours are refused with a "did you mean";
  * every string that lands in a file, a command, a path, a Proxmox property string or the kernel
    command line is checked against that grammar here (no control characters anywhere, Proxmox's
    formats for names, systemd's for the unit name, the kernel's rules for its parameters,
    SGLang's own argument parser for its flags);
  * secrets must arrive as Pulumi secrets; keys and certificates are parsed before any host is
    contacted.

`python -m config schema` prints the JSON schema (docs/config.schema.json is generated from it).
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import os
import re
from typing import Annotated, Any, Literal, Optional

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator,
                      model_validator)

from components import cmdline, sglang_flags, systemd

BDF_RE = re.compile(r'^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$')
PCI_ID_RE = re.compile(r'^[0-9a-f]{4}:[0-9a-f]{4}$')
# RTX PRO 6000 Blackwell: Workstation, Max-Q, Server Edition (SYSTEM.md). Their GSP/FSP fails to
# boot (error 0x177) after running in an identity IOMMU domain and only a power cycle clears it.
BLACKWELL_IDS = frozenset({'10de:2bb1', '10de:2bb4', '10de:2bb5'})
FSP_EXPLANATION = ('identity (passthrough) IOMMU domains brick RTX PRO 6000 Blackwell GPUs until a power '
                   'cycle: the GPU firmware security processor fails to boot with error 0x177 and no FLR, '
                   'secondary bus reset or CXL reset clears it. SEV-SNP also needs a translating IOMMU')
API_KEY_VAR = 'SGLANG_API_KEY'
NVIDIA_CONTROL_DEVICES = ('/dev/nvidiactl', '/dev/nvidia-uvm', '/dev/nvidia-uvm-tools', '/dev/nvidia-modeset')
SECRET_PATHS = (('host', 'ssh', 'private_key'), ('host', 'api', 'password'), ('host', 'api', 'token_secret'),
                ('sglang', 'api_key'))
# Namespaces Pulumi itself uses in a stack's config; anything else that is not ours is a typo.
FOREIGN_NAMESPACES = ('pulumi', 'command')


class ConfigError(ValueError):
    """A refused configuration. str() is the operator-facing message."""


class Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra='forbid', strict=True)


# ------------------------------------------------------------------ grammars
# Each returns the value or raises ValueError with "<value> is not <what>; <fix>" - the config key
# is put in front by format_errors() from pydantic's location of the error.

def show(value, limit=80) -> str:
    """A value as the operator wrote it, safe to print (control characters escaped, long values cut)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 4] + '...' + text[-1]


def no_control(value: str) -> str:
    """Control characters (C0, C1), line and paragraph separators and invisible format characters
    (bidi overrides, zero-width) never belong in a value that reaches a file, a command or a log."""
    import unicodedata
    bad = sorted({c for c in value if unicodedata.category(c) in ('Cc', 'Cf', 'Cs', 'Zl', 'Zp')})
    if bad:
        raise ValueError('%s contains the control character%s %s; a value must stay on one line and hold no '
                         'control or invisible characters - remove %s' % (
                             show(value), 's' if len(bad) > 1 else '', ', '.join(repr(c) for c in bad),
                             'them' if len(bad) > 1 else 'it'))
    return value


def grammar(pattern: str, what: str, example: str, maxlen: int = 255):
    rx = re.compile(pattern)

    def check(value: str) -> str:
        no_control(value)
        if len(value) > maxlen or not rx.match(value):
            raise ValueError('%s is not %s; write e.g. %s' % (show(value), what, example))
        return value
    return AfterValidator(check)


DNS_LABEL = r'(?:[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}[A-Za-z0-9])?)'
DNS_NAME = r'^%s(?:\.%s)*$' % (DNS_LABEL, DNS_LABEL)


def host_or_ip(value: str) -> str:
    no_control(value)
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    if len(value) > 253 or not re.match(DNS_NAME, value):
        raise ValueError('%s is neither a DNS name nor an IP address; write e.g. pve-gpu01.example.internal'
                         % show(value))
    return value


def abs_path(value: str) -> str:
    """An absolute, normalised path of plain characters (it reaches PATH= and ExecStart=)."""
    no_control(value)
    if not value.startswith('/') or not re.match(r'^/[A-Za-z0-9._+@/\-]*$', value):
        raise ValueError('%s is not an absolute path of letters, digits and ._+@-; write e.g. /opt/sglang/venv'
                         % show(value))
    parts = value.split('/')[1:]
    if any(p in ('.', '..') for p in parts) or '//' in value or (len(value) > 1 and value.endswith('/')):
        raise ValueError('%s is not a normalised path (no ".", "..", "//" or trailing "/"); write e.g. %s' % (
            show(value), os.path.normpath(value)))
    return value


def model_ref(value: str) -> str:
    """SGLang's --model-path: a directory in the container or a hub repository id."""
    no_control(value)
    if value.startswith('/'):
        return abs_path(value)
    if not re.match(r'^[A-Za-z0-9][A-Za-z0-9._\-]*/[A-Za-z0-9][A-Za-z0-9._\-]*$', value) or '..' in value:
        raise ValueError('%s is neither an absolute path nor a hub id (org/name); write e.g. '
                         '/models/Qwen3.5-122B-A10B' % show(value))
    return value


# Environment names that carry credentials (HF_TOKEN, AWS_SECRET_ACCESS_KEY, WANDB_API_KEY, ...).
# Whole words between underscores, so TOKENIZERS_PARALLELISM or SGLANG_MAX_TOKENS pass.
SECRET_ENV_RE = re.compile(r'(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|PASS|CREDENTIALS?)(_|$)|(API|ACCESS|PRIVATE|SECRET)_?KEY',
                           re.I)

# Half of the kernel's command line (cmdline.COMMAND_LINE_MAX) for what this program writes: the rest is the
# host's own (root=, BOOT_IMAGE=, console=...).
EXTRA_KERNEL_ARGS_MAX = 1024


def unit_name(value: str) -> str:
    no_control(value)
    if not systemd.valid_unit_name(value):
        raise ValueError('%s is not a systemd service name (letters, digits and ":_.-", ending in .service, no '
                         '"/" and no template "@"); write e.g. sglang-qwen.service' % show(value))
    if value[:1] in ('-', '.', '\\'):
        raise ValueError('%s starts with %r: a command line would read it as an option (or a hidden file); start '
                         'it with a letter or digit, e.g. sglang-qwen.service' % (show(value), value[:1]))
    return value


def cpu_list(value: str) -> str:
    cpus_of(value)
    return value


def cpus_of(value: str) -> set:
    no_control(value)
    if not re.match(r'^\d+(-\d+)?(,\d+(-\d+)?)*$', value):
        raise ValueError('%s is not a CPU list; write e.g. 0-31,64-95' % show(value))
    out = set()
    for part in value.split(','):
        lo, _, hi = part.partition('-')
        lo, hi = int(lo), int(hi or lo)
        if hi < lo:
            raise ValueError('%s: range %s runs backwards; write %d-%d' % (show(value), part, hi, lo))
        if hi >= 16384:
            raise ValueError('%s: CPU %d is beyond any host; read the list with lscpu -p=CPU,NODE' % (show(value), hi))
        both = out & set(range(lo, hi + 1))
        if both:
            raise ValueError('%s names CPU %d twice; give each CPU once' % (show(value), min(both)))
        out.update(range(lo, hi + 1))
    return out


def ipv4_interface(value: str) -> str:
    no_control(value)
    try:
        iface = ipaddress.ip_interface(value)
    except ValueError:
        raise ValueError('%s is not an address with prefix; write e.g. 10.0.0.20/24' % show(value)) from None
    if '/' not in value:
        raise ValueError('%s has no prefix length; write e.g. %s/24' % (show(value), value))
    if iface.version != 4 or str(iface) != value:
        raise ValueError('%s is not an IPv4 address with prefix as Proxmox writes it; write e.g. 10.0.0.20/24'
                         % show(value))
    return value


def ipv4(value: str) -> str:
    no_control(value)
    try:
        addr = ipaddress.ip_address(value)
    except ValueError:
        raise ValueError('%s is not an IP address; write e.g. 10.0.0.1' % show(value)) from None
    if addr.version != 4 or str(addr) != value:
        raise ValueError('%s is not an IPv4 address; write e.g. 10.0.0.1' % show(value))
    return value


def nameservers(value: str) -> str:
    no_control(value)
    parts = value.split(' ')
    for p in parts:
        try:
            ipaddress.ip_address(p)
        except ValueError:
            raise ValueError('%s is not a space-separated list of IP addresses; write e.g. "10.0.0.53 10.0.0.54"'
                             % show(value)) from None
    return value


def bind_address(value: str) -> str:
    no_control(value)
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise ValueError('%s is not an IP address to listen on; write 0.0.0.0 (all) or the container\'s address'
                         % show(value)) from None
    return value


def env_key(value: str) -> str:
    no_control(value)
    if not re.match(r'^[A-Za-z_][A-Za-z0-9_]*$', value) or len(value) > 128:
        raise ValueError('%s is not an environment variable name (letters, digits, "_", not starting with a '
                         'digit); write e.g. NCCL_DEBUG' % show(value))
    return value


def text(value: str) -> str:
    return no_control(value)


Text = Annotated[str, AfterValidator(text)]
HostName = Annotated[str, AfterValidator(host_or_ip)]
NodeName = Annotated[str, grammar(r'^[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}[A-Za-z0-9])?$', 'a Proxmox node name',
                                  'pve-gpu01 (hostname -s on the host)', 63)]
DnsName = Annotated[str, grammar(DNS_NAME, 'a DNS name (what Proxmox accepts for a guest name)', 'sglang', 253)]
Bridge = Annotated[str, grammar(r'^[A-Za-z][A-Za-z0-9_.\-]{0,14}$', 'a Linux bridge name', 'vmbr0', 15)]
StorageId = Annotated[str, grammar(r'^[a-z][a-z0-9\-_.]*[a-z0-9]$', 'a Proxmox storage id', 'local-lvm', 64)]
Template = Annotated[str, grammar(r'^[a-z][a-z0-9\-_.]*[a-z0-9]:vztmpl/[A-Za-z0-9_+\-][A-Za-z0-9._+\-]*'
                                  r'\.tar\.(?:gz|xz|zst)$', 'a container template volume id',
                                  'local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst')]
PosixUser = Annotated[str, grammar(r'^[a-z_][a-z0-9_\-]{0,31}$', 'a user name', 'root', 32)]
PveUser = Annotated[str, grammar(r'^[A-Za-z0-9._\-]+@[A-Za-z0-9._\-]+$', 'a Proxmox user (user@realm)', 'root@pam',
                                 128)]
Path = Annotated[str, AfterValidator(abs_path)]
FilePath = Annotated[str, grammar(r'^[^\x00-\x1f\x7f]+$', 'a file path', '~/.ssh/id_ed25519', 4096)]
CpuList = Annotated[str, AfterValidator(cpu_list)]
Bdf = Annotated[str, grammar(BDF_RE.pattern, 'a PCI address (domain:bus:device.function, lowercase hex)',
                             '0000:01:00.0', 12)]
PciId = Annotated[str, grammar(PCI_ID_RE.pattern, 'a vendor:device ID as lspci -nn shows it', '10de:2bb5', 9)]
VmId = Annotated[int, Field(ge=100, le=999999999)]


# ----------------------------------------------------------------------------- host

def parse_host_key(value: str) -> str:
    """'type base64 [comment]' -> 'type base64', checked as paramiko will use it when pinning."""
    import base64
    import binascii
    no_control(value)
    parts = value.split()
    fix = 'give the host\'s "ssh-ed25519 AAAA..." line (ssh-keyscan -t ed25519 <host>, verified on the console)'
    if len(parts) < 2 or not re.match(r'^(ssh-(ed25519|rsa|dss)|ecdsa-sha2-nistp(256|384|521)|sk-[a-z0-9@.\-]+)$',
                                      parts[0]):
        raise ValueError('%s is not a public key line; %s' % (show(value, 60), fix))
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError('%s: the key is not valid base64 (cut short or mistyped?); %s' % (
            show(value, 60), fix)) from None
    import struct
    try:
        n = struct.unpack('>I', blob[:4])[0]
        inner = blob[4:4 + n].decode('ascii')
    except (struct.error, UnicodeDecodeError):
        inner = None
    if inner != parts[0]:
        raise ValueError('%s: the key data is a %s key, not %s (or it is damaged); %s' % (
            show(value, 60), inner or 'malformed', parts[0], fix))
    import paramiko
    try:
        ok = paramiko.PKey.from_type_string(parts[0], blob).asbytes() == blob
    except Exception:  # noqa: BLE001 - paramiko raises several types for a malformed key blob
        ok = False
    if not ok:
        raise ValueError('%s: not a complete %s key (cut short or damaged); %s' % (show(value, 60), parts[0], fix))
    return ' '.join(parts[:2])


def check_private_key(text_: str, key: str) -> None:
    """Parse the client key without ever echoing it."""
    import io
    import paramiko
    for cls in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        try:
            cls.from_private_key(io.StringIO(text_))
            return
        except paramiko.PasswordRequiredException:
            raise ConfigError('%s: the private key is encrypted; give an unencrypted key (this program cannot '
                              'prompt for its passphrase)' % key) from None
        except (paramiko.SSHException, ValueError, IndexError, TypeError):
            continue
    raise ConfigError('%s: not an ed25519, ECDSA or RSA private key in OpenSSH or PEM form (the value is a secret '
                      'and not shown); set it with: pulumi config set --secret --path %s < ~/.ssh/<key>'
                      % (key, key))


def check_ca(pem: str, key: str) -> None:
    from cryptography import x509
    try:
        certs = x509.load_pem_x509_certificates(pem.encode())
    except ValueError:
        certs = []
    if not certs:
        raise ConfigError('%s: not a PEM certificate (-----BEGIN CERTIFICATE----- ...); copy '
                          '/etc/pve/pve-root-ca.pem from the host' % key)


class Ssh(Model):
    port: int = Field(22, ge=1, le=65535)
    user: PosixUser = 'root'
    host_key: Optional[Annotated[str, AfterValidator(parse_host_key)]] = Field(
        None, description='The host\'s public key, "ssh-ed25519 AAAA..." (authorized_keys form); pinned: a '
                          'different key fails')
    host_key_file: Optional[FilePath] = Field(None, description='Or: path of the host\'s .pub key file')
    private_key: Optional[SecretStr] = Field(None, description='Client private key (PEM/OpenSSH); a secret')
    private_key_file: Optional[FilePath] = Field(None, description='Or: path of the client private key file')
    connect_timeout: float = Field(10.0, gt=0, le=600)
    command_timeout: float = Field(900.0, ge=5, le=86400, description='Longest a remote step may run (update-initramfs, '
                                   'boot refresh); shorter steps stop at 30-300 s. A step that runs out is named')

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
    address: Optional[HostName] = Field(None, description='API address if not gpuhost:host.address')
    port: int = Field(8006, ge=1, le=65535)
    user: PveUser = 'root@pam'
    password: Optional[SecretStr] = Field(None, description='root@pam password; a secret')
    password_file: Optional[FilePath] = None
    token_id: Optional[Text] = Field(None, description='API token id (user@realm!name); refused for this '
                                                       'program, see README')
    token_secret: Optional[SecretStr] = None
    ca_cert: Optional[str] = Field(None, description='PEM of the CA that signed the API certificate')
    ca_file: Optional[FilePath] = None
    timeout: float = Field(30.0, gt=0, le=600)

    @model_validator(mode='after')
    def _auth(self):
        if (self.ca_cert is None) == (self.ca_file is None):
            raise ValueError('gpuhost:host.api: set exactly one of ca_cert (PEM) or ca_file; TLS is always verified '
                             '(Proxmox\'s CA is /etc/pve/pve-root-ca.pem on the host)')
        if self.ca_cert is not None:
            try:
                check_ca(self.ca_cert, 'gpuhost:host.api.ca_cert')
            except ConfigError as e:
                raise ValueError(str(e)) from None
        if self.password is not None and self.password_file is not None:
            raise ValueError('gpuhost:host.api: set one of password (secret) or password_file, not both')
        return self


class GpuInfo(Model):
    address: Bdf = Field(description='PCI address, 0000:01:00.0 (lowercase hex)')
    numa: int = Field(ge=0, le=63)
    id: PciId = Field(description='vendor:device as `lspci -nn` shows it, 10de:2bb5')


class Host(Model):
    address: HostName = Field(description='DNS name (or address) of the Proxmox host, for SSH and the API')
    node: NodeName = Field(description='Proxmox node name')
    ssh: Ssh
    api: Api
    gpus: list[GpuInfo] = Field(min_length=1, description='The host\'s GPU inventory; checked against the host '
                                                          'on every up')
    numa_cpus: dict[int, CpuList] = Field(description='Host CPUs of each NUMA node, "0-31,64-95"')
    reboot: Literal['never', 'when-required'] = Field(
        'never', description='when-required: reboot the host after a change that needs it, wait for SSH '
                             'and re-read the facts. Off by default: a reboot stops every guest')

    @field_validator('numa_cpus')
    @classmethod
    def _disjoint(cls, v):
        seen = {}
        for node in sorted(v):
            if node < 0 or node > 63:
                raise ValueError('NUMA node %d is not a node number (0-63)' % node)
            for cpu in sorted(cpus_of(v[node])):
                if cpu in seen:
                    raise ValueError('CPU %d is listed for NUMA node %d and node %d; each CPU belongs to one node '
                                     '(lscpu -p=CPU,NODE on the host)' % (cpu, seen[cpu], node))
                seen[cpu] = node
        return v

    @field_validator('gpus')
    @classmethod
    def _unique(cls, v):
        seen = set()
        for g in v:
            if g.address in seen:
                raise ValueError('%s is listed twice; list each GPU once' % g.address)
            seen.add(g.address)
        return v

    @property
    def has_blackwell(self):
        return any(g.id in BLACKWELL_IDS for g in self.gpus)

    def gpu(self, address):
        return next((g for g in self.gpus if g.address == address), None)


# ---------------------------------------------------------------------------- iommu

class Iommu(Model):
    domain: Literal['DMA-FQ', 'DMA', 'identity'] = Field(
        'DMA-FQ', description='Default IOMMU domain type: DMA-FQ (translated, lazy flush; the default), DMA '
                              '(translated, strict flush). identity is refused on Blackwell hosts and with SEV-SNP')
    extra_kernel_args: list[Text] = Field(default_factory=list, max_length=64,
                                          description='More kernel command-line parameters to keep present, one '
                                                      'per item (checked with the kernel\'s own rules)')

    def managed_args(self):
        return {'DMA-FQ': ['iommu.passthrough=0', 'iommu.strict=0'],
                'DMA': ['iommu.passthrough=0', 'iommu.strict=1'],
                'identity': ['iommu.passthrough=1']}[self.domain]

    def kernel_args(self):
        """The arguments the host's command line must carry (order kept, duplicates dropped)."""
        out = []
        for a in self.managed_args() + list(self.extra_kernel_args):
            if not any(cmdline.same(a, o) for o in out):
                out.append(a)
        return out


class Nvidia(Model):
    dma_remap_peer_mmio: int = Field(ge=0, le=1, default=
        1, description='NVreg_DmaRemapPeerMmio, 0 or 1 (already 1 by default; written explicitly so it is visible '
                       'and diffable). No fix for P2P under translation: NCCL_P2P_DISABLE=1 is')


# ---------------------------------------------------------------------- guests

PROTECT_DOC = ('Pulumi protect: while true, a change that would delete or replace this guest (and its disk) is '
               'refused at preview. Set false for one `pulumi up` to allow it')


class Container(Model):
    vmid: VmId
    hostname: DnsName = 'sglang'
    gpus: list[Bdf] = Field(min_length=1, max_length=16,
                            description='PCI addresses of the container\'s GPUs (stay on nvidia)')
    numa: int = Field(0, ge=0, le=63, description='NUMA node of the container\'s GPUs and CPUs')
    ostemplate: Template
    storage: StorageId = 'local-lvm'
    rootfs_gb: int = Field(200, ge=1, le=1048576)
    unprivileged: bool = True
    cores: int = Field(32, ge=1, le=8192)
    memory_mb: int = Field(262144, ge=512, le=1 << 30)
    swap_mb: int = Field(0, ge=0, le=1 << 30)
    bridge: Bridge = 'vmbr0'
    ip: Annotated[str, AfterValidator(ipv4_interface)] = Field(
        description='Container address with prefix, 10.0.0.20/24')
    gateway: Optional[Annotated[str, AfterValidator(ipv4)]] = None
    nameserver: Optional[Annotated[str, AfterValidator(nameservers)]] = None
    onboot: bool = True
    protect: bool = Field(True, description=PROTECT_DOC)

    @property
    def address(self):
        return str(ipaddress.ip_interface(self.ip).ip)


class Snp(Model):
    allow_smt: bool = True
    kernel_hashes: bool = False


class Vm(Model):
    vmid: VmId
    name: DnsName = 'snp-gpu'
    gpus: list[Bdf] = Field(max_length=16, description='PCI addresses of the VM\'s GPUs (bound to vfio-pci)')
    numa: int = Field(1, ge=0, le=63)
    cores: int = Field(32, ge=1, le=8192)
    memory_mb: int = Field(262144, ge=1024, le=1 << 30)
    sev: Literal['snp', 'none'] = 'snp'
    snp: Snp = Snp()
    bridge: Bridge = 'vmbr0'
    start: bool = True
    protect: bool = Field(True, description=PROTECT_DOC)


# ---------------------------------------------------------------------- sglang

def suggest_triple(steps, topk, draft) -> str:
    """A consistent (num_steps, eagle_topk, num_draft_tokens) built from what the operator gave: with
    topk 1 SGLang forces draft = steps + 1 (MTP on this model: 1, 1, 2)."""
    if topk in (None, 1):
        if steps is None:
            steps = max(1, draft - 1) if draft else 1
        topk, draft = 1, steps + 1
    else:
        steps = steps or 1
        draft = draft or steps * topk + 1
    return '{num_steps: %d, eagle_topk: %d, num_draft_tokens: %d}' % (steps, topk, draft)


class Speculative(Model):
    algorithm: Literal['NEXTN', 'EAGLE', 'EAGLE3'] = 'NEXTN'
    num_steps: Optional[int] = Field(None, ge=1, le=16)
    eagle_topk: Optional[int] = Field(None, ge=1, le=64)
    num_draft_tokens: Optional[int] = Field(None, ge=1, le=256)

    @model_validator(mode='after')
    def _triple(self):
        triple = {'num_steps': self.num_steps, 'eagle_topk': self.eagle_topk,
                  'num_draft_tokens': self.num_draft_tokens}
        unset = [k for k, v in triple.items() if v is None]
        if unset:
            given = ', '.join('%s=%s' % (k, v) for k, v in triple.items() if v is not None)
            raise ValueError('gpuhost:sglang.speculative: %s%s missing; set all three - from your numbers: %s - or '
                             'speculative: null to run without speculative decoding' % (
                                 given + ' set but ' if given else '', ', '.join(unset),
                                 suggest_triple(self.num_steps, self.eagle_topk, self.num_draft_tokens)))
        if self.eagle_topk == 1 and self.num_draft_tokens != self.num_steps + 1:
            raise ValueError('gpuhost:sglang.speculative.num_draft_tokens: %d with eagle_topk 1 and num_steps %d; '
                             'SGLang forces draft tokens = steps + 1 when topk is 1, so set num_draft_tokens: %d'
                             % (self.num_draft_tokens, self.num_steps, self.num_steps + 1))
        return self


class Sglang(Model):
    version: Annotated[str, grammar(r'^\d+\.\d+\.\d+(\.post\d+)?$', 'a release number', '0.5.23', 24)] = Field(
        '0.5.23', description='The SGLang version installed in the container\'s virtualenv; flags are rendered and '
                              'checked with that version\'s own argument parser')
    venv: Path = '/opt/sglang/venv'
    cuda_home: Path = '/usr/local/cuda-13.0'
    unit: Annotated[str, AfterValidator(unit_name)] = 'sglang-qwen.service'
    model_path: Annotated[str, AfterValidator(model_ref)]
    served_model_name: str = 'qwen3.5-122b-a10b'
    tp: int = Field(4, ge=1, le=64)
    port: int = Field(30000, ge=1, le=65535)
    host: Annotated[str, AfterValidator(bind_address)] = '0.0.0.0'
    mem_fraction_static: float = 0.75
    speculative: Optional[Speculative] = Speculative(num_steps=1, eagle_topk=1, num_draft_tokens=2)
    mamba_radix_cache_strategy: Optional[Literal['auto', 'no_buffer', 'extra_buffer', 'extra_buffer_lazy']] = None
    disable_custom_all_reduce: bool = Field(True, description='RTX PRO 6000 owners report custom all-reduce '
                                                              'trouble without P2P')
    extra_args: list[Text] = Field(default_factory=list, max_length=256,
                                   description='More launch_server flags, parsed with the declared version\'s '
                                               'own argument parser; flags this program sets are refused')
    environment: dict[Annotated[str, AfterValidator(env_key)], Annotated[Text, Field(max_length=4096)]] = Field(
        default_factory=dict, max_length=128)
    api_key: Optional[SecretStr] = Field(None, description='Bearer key for the OpenAI API (SGLang --api-key); a '
                                         'secret, kept in a root-only file in the container, never in the unit. '
                                         '/health and /metrics stay open for monitoring')
    health_timeout_s: float = Field(900.0, gt=0, le=86400,
                                    description='How long a (re)start may take to pass /health')

    @field_validator('version')
    @classmethod
    def _version(cls, v):
        if v not in sglang_flags.supported_versions():
            raise ValueError('SGLang %s has no flag table here; supported: %s (tools/sglang_flags_gen.py adds a '
                             'release)' % (v, ', '.join(sglang_flags.supported_versions())))
        return v

    @field_validator('served_model_name')
    @classmethod
    def _name(cls, v):
        no_control(v)
        if ':' in v:
            raise ValueError('%s contains ":", which SGLang refuses; use e.g. %s' % (show(v), show(v.replace(':', '-'))))
        return _served_name(v)

    @field_validator('mem_fraction_static')
    @classmethod
    def _mem(cls, v):
        if not 0 < v < 1:
            raise ValueError('%r is outside (0, 1); 0.75 leaves room for the MTP draft model' % v)
        return v

    @field_validator('api_key')
    @classmethod
    def _api_key(cls, v):
        if v is not None and not re.match(r'^[A-Za-z0-9._~+/=\-]{16,256}$', v.get_secret_value()):
            raise ValueError('must be 16-256 characters of letters, digits and ._~+/=- (not shown); make one with: '
                             'openssl rand -base64 32 | pulumi config set --secret --path gpuhost:sglang.api_key')
        return v

    @field_validator('environment')
    @classmethod
    def _env(cls, v):
        for key in v:
            why = sglang_flags.MANAGED_ENV.get(key)
            if why:
                raise ValueError('%s is set by this program (%s); remove it from gpuhost:sglang.environment' % (key, why))
            if SECRET_ENV_RE.search(key):
                raise ValueError('%s looks like a credential: gpuhost:sglang.environment is written into the unit file, '
                                 'which every user of the container can read, and into the stack\'s state as plain '
                                 'text. Remove it; the OpenAI API key goes into gpuhost:sglang.api_key (a secret), and '
                                 'a model is served from a local path (gpuhost:sglang.model_path) with no hub token'
                                 % key)
        return v


def _served_name(v):
    rx = re.compile(r'^[A-Za-z0-9][A-Za-z0-9._/+\-]{0,127}$')
    if not rx.match(v):
        raise ValueError('%s is not a model name SGLang serves (letters, digits, ._/+-, up to 128); write e.g. '
                         'qwen3.5-122b-a10b' % show(v))
    return v


# ------------------------------------------------------------------ deployment

class Deployment(Model):
    host: Host
    iommu: Iommu = Iommu()
    nvidia: Nvidia = Nvidia()
    container: Container
    vm: Optional[Vm] = None
    sglang: Sglang

    @model_validator(mode='after')
    def _cross(self):
        host = self.host
        sides = [('container', self.container)] + ([('vm', self.vm)] if self.vm else [])
        if self.vm and self.vm.vmid == self.container.vmid:
            raise ValueError('gpuhost:vm.vmid: %d is the container\'s vmid too; each guest needs its own (e.g. vm.vmid: '
                             '%d)' % (self.vm.vmid, self.container.vmid + 100))
        bind = ipaddress.ip_address(self.sglang.host)
        if not bind.is_unspecified and bind != ipaddress.ip_address(self.container.address):
            raise ValueError('gpuhost:sglang.host: %s is not the container\'s address (gpuhost:container.ip: %s): %s, '
                             'while /health, the smoke test and monitoring reach SGLang at %s. Use %s (the container\'s '
                             'own address only) or 0.0.0.0 (all of its addresses)' % (
                                 self.sglang.host, self.container.ip,
                                 'SGLang would answer only inside the container' if bind.is_loopback else
                                 'SGLang could not listen there (the restart would fail)',
                                 self.container.address, self.container.address))
        seen = {}
        for side, guest in sides:
            for addr in guest.gpus:
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
        self._check_api_auth()
        try:
            sglang_flags.check(self.sglang.version, self.managed_launch_args(), list(self.sglang.extra_args))
        except sglang_flags.FlagError as e:
            raise ValueError(str(e)) from None
        return self

    def kernel_policy(self):
        """What decides which kernel parameters are dangerous on this host (components/cmdline.py)."""
        return {'blackwell': self.host.has_blackwell, 'snp': bool(self.vm and self.vm.sev == 'snp'),
                'vfio': bool(self.vm and self.vm.gpus)}

    def _check_iommu(self):
        host = self.host
        policy = self.kernel_policy()
        managed = self.iommu.managed_args()
        for i, arg in enumerate(self.iommu.extra_kernel_args):
            why = cmdline.check_extra(arg, managed, policy)
            if why:
                raise ValueError('gpuhost:iommu.extra_kernel_args[%d]: %s %s%s' % (
                    i, show(arg), why, '' if 'identity' not in why else '. Use gpuhost:iommu.domain: DMA-FQ (the '
                    'default) and drop it'))
        total = len(' '.join(list(managed) + list(self.iommu.extra_kernel_args)).encode())
        if total > EXTRA_KERNEL_ARGS_MAX:
            raise ValueError('gpuhost:iommu.extra_kernel_args: with the managed arguments they make %d bytes; the kernel '
                             'keeps only %d bytes of its whole command line (the host\'s root=, BOOT_IMAGE= and '
                             'others included) and silently drops the rest, so keep these under %d' % (
                                 total, cmdline.COMMAND_LINE_MAX, EXTRA_KERNEL_ARGS_MAX))
        if self.iommu.domain == 'identity':
            if host.has_blackwell:
                raise ValueError('gpuhost:iommu.domain: identity asks for identity (passthrough) domains, but the host '
                                 'has Blackwell GPUs (%s): %s. Use domain: DMA-FQ (the default)' % (
                                     ', '.join(sorted({g.id for g in host.gpus} & BLACKWELL_IDS)), FSP_EXPLANATION))
            if self.vm and self.vm.sev == 'snp':
                raise ValueError('gpuhost:iommu.domain: identity disables SEV-SNP on the host ("SNP: IOMMU disabled or '
                                 'configured in passthrough mode"), which gpuhost:vm.sev: snp needs; use DMA-FQ')

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
        if api.token_id or api.token_secret:
            raise ValueError('gpuhost:host.api.token_id: %s - Proxmox lets only root@pam with a password ticket set '
                             '%s; an API token, even root\'s, is refused. Remove token_id/token_secret and set '
                             'host.api.password (secret) for root@pam' % (show(api.token_id), ', '.join(root_only)))
        if api.user != 'root@pam':
            raise ValueError('gpuhost:host.api.user: %s - only root@pam may set %s; set user: root@pam' % (
                show(api.user), ', '.join(root_only)))
        if api.password is None and api.password_file is None:
            raise ValueError('gpuhost:host.api: no password for root@pam; set host.api.password as a secret '
                             '(pulumi config set --secret --path gpuhost:host.api.password)')

    # -------------------------------------------------------------- derived

    @property
    def warnings(self):
        out = []
        for a in self.iommu.kernel_args():
            name, value = cmdline.param(a)
            if cmdline.norm(name) == 'amd_iommu' and any(i == 'on' for i in cmdline.items(value)):
                out.append('gpuhost:iommu.extra_kernel_args: %s is not a valid value (the kernel logs "Unknown option '
                           '- \'on\'"); the AMD IOMMU is on by default, so it does nothing - drop it' % a)
        if self.vm and self.vm.sev != 'none' and self.vm.gpus:
            out.append('gpuhost:vm: SEV-%s together with PCI passthrough is listed by Proxmox as not supported '
                       '("very experimental"); this deployment runs it knowingly' % self.vm.sev.upper())
        for side, guest in (('container', self.container), ('vm', self.vm)):
            if guest is not None and not guest.protect:
                out.append('gpuhost:%s.protect: false - this `up` may delete or replace %s %d and its disk; set it '
                           'back to true afterwards' % (side, side, guest.vmid))
        out.extend(sglang_flags.warnings(self.sglang.version, self.launch_args(), self.sglang.environment,
                                         bool(self.sglang.speculative)))
        return out

    @property
    def p2p_disabled(self):
        """Translated IOMMU: GPU peer-to-peer DMA does not work, so NCCL must not try it."""
        return self.iommu.domain != 'identity'

    def managed_launch_args(self):
        """The flags this program sets (a list, never a string); extra_args may not touch them."""
        s = self.sglang
        args = ['--model-path', s.model_path, '--served-model-name', s.served_model_name,
                '--host', s.host, '--port', str(s.port), '--tp-size', str(s.tp),
                '--mem-fraction-static', repr(s.mem_fraction_static), '--enable-metrics']
        spec = s.speculative
        if spec:
            args += ['--speculative-algorithm', spec.algorithm,
                     '--speculative-num-steps', str(spec.num_steps),
                     '--speculative-eagle-topk', str(spec.eagle_topk),
                     '--speculative-num-draft-tokens', str(spec.num_draft_tokens)]
        if s.mamba_radix_cache_strategy:
            try:
                args += sglang_flags.mamba_strategy_args(s.version, s.mamba_radix_cache_strategy)
            except sglang_flags.FlagError as e:
                raise ValueError(str(e)) from None
        if s.disable_custom_all_reduce:
            args.append('--disable-custom-all-reduce')
        return args

    def launch_args(self):
        """`python -m sglang.launch_server` arguments for the declared version. The API key is a
        reference to the root-only environment file's variable, never its value."""
        key = ['--api-key', systemd.EnvRef(API_KEY_VAR)] if self.sglang.api_key else []
        return self.managed_launch_args() + key + list(self.sglang.extra_args)

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


# ------------------------------------------------------------------ loading

def read_file(path: str, root: str, what: str) -> str:
    import stat
    full = os.path.expanduser(path)
    full = full if os.path.isabs(full) else os.path.join(root, full)
    try:
        with open(full) as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_size > 1 << 20:
                raise ConfigError('%s: %s is not a regular file of at most 1 MiB' % (what, full))
            return f.read()
    except OSError as e:
        raise ConfigError('%s: cannot read %s: %s' % (what, full, e.strerror)) from None
    except UnicodeDecodeError:
        raise ConfigError('%s: %s is not a text file' % (what, full)) from None


def connection_inputs(d: Deployment, root: str) -> tuple:
    """(ssh connection, api) as plain dicts for the resources; the caller wraps them as secrets.
    Files named in the config are read and parsed here, at preview."""
    ssh, api = d.host.ssh, d.host.api
    if ssh.private_key:
        key = ssh.private_key.get_secret_value()
        check_private_key(key, 'gpuhost:host.ssh.private_key')
    else:
        key = read_file(ssh.private_key_file, root, 'gpuhost:host.ssh.private_key_file')
        check_private_key(key, 'gpuhost:host.ssh.private_key_file (%s)' % ssh.private_key_file)
    if ssh.host_key:
        host_key = ssh.host_key
    else:
        raw = read_file(ssh.host_key_file, root, 'gpuhost:host.ssh.host_key_file')
        try:
            host_key = parse_host_key(raw.strip())
        except ValueError as e:
            raise ConfigError('gpuhost:host.ssh.host_key_file (%s): %s' % (ssh.host_key_file, e)) from None
    if api.password:
        password = api.password.get_secret_value()
    else:
        password = read_file(api.password_file, root, 'gpuhost:host.api.password_file').strip()
    if not password or any(ord(c) < 0x20 for c in password):
        raise ConfigError('gpuhost:host.api.password: empty or holds control characters (not shown)')
    if api.ca_cert:
        ca = api.ca_cert
    else:
        ca = read_file(api.ca_file, root, 'gpuhost:host.api.ca_file')
        check_ca(ca, 'gpuhost:host.api.ca_file (%s)' % api.ca_file)
    connection = {'host': d.host.address, 'port': ssh.port, 'user': ssh.user, 'private_key': key,
                  'host_key': host_key, 'timeout': ssh.connect_timeout, 'command_timeout': ssh.command_timeout}
    api_in = {'host': api.address or d.host.address, 'port': api.port, 'user': api.user, 'password': password,
              'ca_cert': ca, 'timeout': api.timeout}
    return connection, api_in


def fleet_from_pulumi() -> 'Fleet':
    """The fleet from the running stack's `gpuhost:*` config (secure leaves arrive decrypted and go
    into SecretStr fields; the program hands them to resources only as Pulumi secrets)."""
    from pulumi.runtime.config import get_config, is_config_secret
    import pulumi
    keys = _all_config_keys()
    check_namespaces(keys)
    data = {}
    for key in list(Deployment.model_fields) + list(FLEET_KEYS):
        raw = get_config('gpuhost:' + key)
        if raw is None:
            continue
        try:
            data[key] = json.loads(raw)
        except ValueError:
            data[key] = raw
    secure = stack_file_secure_paths(pulumi.get_stack())
    hosts = data.get('hosts')
    defaults = {k: v for k, v in data.items() if k not in FLEET_KEYS}
    check_secrets(defaults, is_config_secret, secure)
    if isinstance(hosts, list):
        for i, entry in enumerate(hosts):
            if isinstance(entry, dict):
                check_secrets(entry, is_config_secret, secure, prefix=('hosts', str(i)))
    return parse_fleet(data)


def load_stack(root: str) -> tuple:
    """What the program needs from the running stack's config before it builds anything, for preview
    and up alike: (fleet, each host's (ssh connection, api) inputs - the files the config names read
    and parsed against `root`, the project directory - and the warnings to show, one line each).
    Raises ConfigError with the message the operator sees."""
    fleet = fleet_from_pulumi()
    inputs, warnings = [], {}
    for h in fleet.hosts:
        try:
            inputs.append(connection_inputs(h.deployment, root))
        except ConfigError as e:
            raise (prefixed(e, 'host %s (gpuhost:hosts[%d])' % (h.name, h.index)) if fleet.is_fleet else e)
        for warning in h.deployment.warnings:
            warnings.setdefault(warning, []).append(h.name)
    # The same warning for several hosts of a fleet is said once, naming them.
    lines = [(('host%s %s: ' % ('s' if len(names) > 1 else '', ', '.join(names))) if fleet.is_fleet else '') + warning
             for warning, names in warnings.items()]
    return fleet, inputs, lines


def _all_config_keys():
    import pulumi.runtime.config as rc
    return list(rc.CONFIG.get())


# Names operators reach for that this program spells differently.
SYNONYMS = {'cpus': 'cores', 'cpu': 'cores', 'vcpus': 'cores', 'memory': 'memory_mb', 'mem': 'memory_mb',
            'ram': 'memory_mb', 'swap': 'swap_mb', 'disk': 'rootfs_gb', 'rootfs': 'rootfs_gb', 'disk_gb': 'rootfs_gb',
            'template': 'ostemplate', 'id': 'vmid', 'tensor_parallel': 'tp', 'tp_size': 'tp', 'model': 'model_path',
            'spec': 'speculative', 'speculative_decoding': 'speculative', 'env': 'environment', 'args': 'extra_args',
            'kernel_args': 'extra_kernel_args', 'gpu': 'gpus', 'address': 'address'}


def did_you_mean(word: str, choices) -> str:
    choices = list(choices)
    if SYNONYMS.get(word) in choices:
        return ' (did you mean %s?)' % SYNONYMS[word]
    match = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return ' (did you mean %s?)' % match[0] if match else ''


def check_namespaces(keys) -> None:
    """Unknown gpuhost: keys, and keys in a namespace that looks like ours (gpuhots:vm), are refused:
    ignoring them once meant an `up` that deleted the VM and exited 0."""
    ours = list(Deployment.model_fields) + list(FLEET_KEYS)
    problems = []
    for k in sorted(keys):
        ns, sep, name = k.partition(':')
        if not sep:
            continue
        if ns == 'gpuhost':
            if name not in ours:
                hint = did_you_mean(name.split('.')[-1] if name.startswith('gpuhost.') else name, ours)
                if name == 'vfio':
                    hint = (' (removed: the VM\'s GPUs are always bound to vfio-pci by PCI address; drop '
                            'gpuhost:vfio from the stack config)')
                problems.append('gpuhost:%s is not a setting of this program%s' % (name, hint))
        elif ns not in FOREIGN_NAMESPACES:
            close = difflib.SequenceMatcher(None, ns.lower(), 'gpuhost').ratio() >= 0.6
            if close or name.split('.')[0] in ours:
                problems.append('%s: namespace %r is not this program\'s; did you mean gpuhost:%s? (pulumi config '
                                'rm %s, then set it under gpuhost:)' % (k, ns, name, k))
    if problems:
        raise ConfigError('invalid stack configuration:\n  - ' + '\n  - '.join(problems) +
                          '\n  The settings are: ' + ', '.join('gpuhost:' + k for k in ours))


def stack_file_secure_paths(stack: str) -> Optional[set]:
    """Paths of `secure:` leaves in Pulumi.<stack>.yaml ({('host','api','password'), ...}), or None if
    the file cannot be read (config then comes from elsewhere and only the engine's flag counts)."""
    import yaml
    try:
        with open('Pulumi.%s.yaml' % stack) as f:
            doc = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError):
        return None
    out = set()

    def walk(node, path):
        if isinstance(node, dict):
            if set(node) == {'secure'}:
                out.add(path)
                return
            for k, v in node.items():
                walk(v, path + (str(k),))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, path + (str(i),))
    for key, value in (doc.get('config') or {}).items():
        ns, _, name = str(key).partition(':')
        if ns == 'gpuhost':
            walk(value, (name,))
    return out


def check_secrets(data: dict, is_secret, secure_paths: Optional[set], prefix: tuple = ()) -> None:
    """A password or key written as plain config ends up in plain text in the state: refuse it.
    `prefix`: where `data` sits in the config (('hosts', '1') for a fleet's host entry)."""
    for path in SECRET_PATHS:
        node = data
        for p in path:
            node = node.get(p) if isinstance(node, dict) else None
        if node is None:
            continue
        full = tuple(prefix) + path
        key = 'gpuhost:' + _loc([int(p) if p.isdigit() else p for p in full])
        plain = not is_secret('gpuhost:' + full[0])
        if not plain and secure_paths is not None:
            plain = not any(full[:len(s)] == s for s in secure_paths)
        if plain:
            raise ConfigError('%s is set as plain text, so it would be stored unencrypted in the stack\'s config and '
                              'state. Make it a secret: pulumi config rm --path %s && pulumi config set --secret '
                              '--path %s%s' % (key, key, key, ' < ~/.ssh/<key>' if 'key' in path[-1] else ''))


def parse(data: dict) -> Deployment:
    """Build the model from the `gpuhost` config namespace; raises ConfigError with readable messages."""
    try:
        return Deployment.model_validate_json(json.dumps(data), strict=True)
    except ValidationError as e:
        raise ConfigError(format_errors(e)) from None
    except (TypeError, ValueError) as e:  # a value json cannot carry
        raise ConfigError('invalid stack configuration: %s' % e) from None


# ------------------------------------------------------------------ fleets

FLEET_KEYS = ('hosts', 'rollout')
HOST_NAME_RE = re.compile(r'^[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?$')


class Rollout(Model):
    max_unavailable: int = Field(1, ge=1, le=64, description='How many hosts may restart SGLang (or reboot) at '
                                                             'the same time; the next waits for /health and '
                                                             '/server_info of the one before it')


class FleetHost(object):
    """One host of the stack: its name (None for a one-host stack without gpuhost:hosts) and model."""

    def __init__(self, name: Optional[str], index: int, deployment: Deployment):
        self.name, self.index, self.deployment = name, index, deployment

    def resource_name(self, role: str) -> str:
        """A one-host stack keeps the names it always had (its URNs stay); a fleet prefixes the host."""
        return role if self.name is None else '%s-%s' % (self.name, role)

    @property
    def label(self) -> str:
        return self.name or self.deployment.host.node


class Fleet(object):
    def __init__(self, hosts: list, rollout: Rollout, is_fleet: bool):
        self.hosts, self.rollout, self.is_fleet = hosts, rollout, is_fleet

    def lane_before(self, i: int) -> Optional[FleetHost]:
        """The host whose SGLang must be serving again before host i may restart its own (None: first
        in its lane). Hosts roll out in config order, max_unavailable lanes at once."""
        k = self.rollout.max_unavailable
        return self.hosts[i - k] if self.is_fleet and i >= k else None

    def rollout_info(self, i: int) -> Optional[dict]:
        if not self.is_fleet:
            return None
        k = self.rollout.max_unavailable
        names = [h.name for h in self.hosts]
        return {'host': names[i], 'order': names, 'max_unavailable': k,
                'before': [n for j, n in enumerate(names) if j < i and (i - j) % k == 0],
                'after': [n for j, n in enumerate(names) if j > i and (j - i) % k == 0]}


def deep_merge(base, over):
    """A host entry over the shared defaults: mappings merge key by key, anything else (lists too)
    replaces, and null removes the key (`vm: null`: this host has no VM)."""
    if isinstance(over, dict):
        # A mapping merges into the shared one - or into nothing, when the shared settings lack it (its
        # nulls then remove nothing, so they cannot reach the model as values).
        out = dict(base) if isinstance(base, dict) else {}
        for k, v in over.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = deep_merge(out.get(k), v)
        return out
    return over


def prefixed(e: ConfigError, where: str) -> ConfigError:
    text = str(e)
    head = 'invalid stack configuration:'
    if text.startswith(head):
        text = text[len(head):].lstrip('\n')
        return ConfigError('invalid stack configuration for %s:\n%s' % (where, text))
    return ConfigError('%s: %s' % (where, text))


def parse_fleet(data: dict) -> Fleet:
    """The fleet from the `gpuhost` namespace: without gpuhost:hosts, the stack is one host (the other
    keys); with it, each entry (name plus any of the other keys) is merged over the other keys, the
    shared defaults, and validated on its own - every refusal names the host."""
    try:
        raw = data.get('rollout')
        rollout = Rollout.model_validate_json(json.dumps({} if raw is None else raw), strict=True)
    except ValidationError as e:
        raise ConfigError(format_errors(e, Rollout, ('rollout',))) from None
    defaults = {k: v for k, v in data.items() if k not in FLEET_KEYS}
    hosts = data.get('hosts')
    if hosts is None:
        if 'rollout' in data:
            raise ConfigError('gpuhost:rollout: set, but the stack has no gpuhost:hosts list; a one-host stack has '
                              'nothing to roll out - remove gpuhost:rollout or list the hosts')
        return Fleet([FleetHost(None, 0, parse(defaults))], rollout, False)
    if not isinstance(hosts, list) or not hosts:
        raise ConfigError('gpuhost:hosts: %s is not a list of hosts; write a list of mappings, each with a name and '
                          'what differs from the shared gpuhost:* settings, e.g. [{name: gpu01, host: {address: ...}}]'
                          % show(hosts))
    ours = list(Deployment.model_fields)
    out, names = [], {}
    for i, entry in enumerate(hosts):
        where = 'gpuhost:hosts[%d]' % i
        if not isinstance(entry, dict):
            raise ConfigError('%s: %s is not a mapping; give name plus what differs for this host' % (
                where, show(entry)))
        name = entry.get('name')
        if not isinstance(name, str) or not HOST_NAME_RE.fullmatch(name):
            raise ConfigError('%s.name: %s is not a host name: lowercase letters, digits and -, 1-32 characters, '
                              'starting and ending with a letter or digit (it names the host\'s resources and its '
                              'monitoring label), e.g. gpu01' % (where, show(name)))
        if name in names:
            raise ConfigError('%s.name: %s is also the name of gpuhost:hosts[%d]; each host needs its own name' % (
                where, name, names[name]))
        names[name] = i
        where = '%s (%s)' % (where, name)
        unknown = [k for k in entry if k != 'name' and k not in ours]
        if unknown:
            raise ConfigError('%s: %s is not a setting of a host%s; a host entry takes name and: %s' % (
                where, unknown[0], did_you_mean(unknown[0], ours + ['name']), ', '.join(ours)))
        merged = deep_merge(defaults, {k: v for k, v in entry.items() if k != 'name'})
        try:
            out.append(FleetHost(name, i, parse(merged)))
        except ConfigError as e:
            raise prefixed(e, 'host %s (gpuhost:hosts[%d] merged over the shared gpuhost:* settings)' % (
                name, i)) from None
    check_fleet(out)
    return Fleet(out, rollout, True)


def check_fleet(hosts: list) -> None:
    """What no single host can see: two entries that are the same machine or the same endpoint."""
    seen = {}

    def once(key, value, h, what):
        prev = seen.setdefault((key, value), h)
        if prev is not h:
            raise ConfigError('host %s (gpuhost:hosts[%d]): %s %s is also host %s\'s; %s' % (
                h.name, h.index, key, value, prev.name, what))
    for h in hosts:
        d = h.deployment
        # DNS names compare without case (PVE-GPU01.example and pve-gpu01.example are one machine).
        once('host.address:ssh.port', '%s:%d' % (d.host.address.lower(), d.host.ssh.port), h,
             'two entries for one machine would fight over its settings - remove one or fix the address')
        api = '%s:%d' % ((d.host.api.address or d.host.address).lower(), d.host.api.port)
        once('host.node', '%s@%s' % (d.host.node, api), h,
             'one Proxmox node is one host - fix the node name')
        once('container.ip', d.container.address, h,
             'monitoring and the smoke test would reach one SGLang for two hosts - give each its own address')
        for guest in ([d.container] + ([d.vm] if d.vm else [])):
            # Only hosts reached through the same API address can be seen to share a cluster here; nodes of
            # one cluster with their own addresses are checked by Proxmox at create ("already exists").
            once('vmid', '%d@%s' % (guest.vmid, api), h,
                 'guests of one Proxmox cluster need cluster-wide unique vmids - set another container.vmid / vm.vmid')


TYPE_NAMES = {'int_type': 'a whole number', 'int_parsing': 'a whole number', 'float_type': 'a number',
              'float_parsing': 'a number', 'bool_type': 'true or false', 'bool_parsing': 'true or false',
              'string_type': 'a string', 'list_type': 'a list', 'dict_type': 'a mapping', 'model_type': 'a mapping',
              'model_attributes_type': 'a mapping', 'int_from_float': 'a whole number'}


def _field_model(loc, root=None):
    """The model class at a location (for 'did you mean' on unknown keys)."""
    import typing
    model = root or Deployment
    for part in loc:
        if isinstance(part, int) or model is None:
            continue
        field = model.model_fields.get(part) if hasattr(model, 'model_fields') else None
        if field is None:
            return model
        ann = field.annotation
        nxt = None
        for cand in [ann] + list(typing.get_args(ann)):
            for c in [cand] + list(typing.get_args(cand)):
                if isinstance(c, type) and issubclass(c, BaseModel):
                    nxt = c
        model = nxt
    return model


def _secret_loc(loc) -> bool:
    return any(str(p) in ('password', 'private_key', 'token_secret') for p in loc)


def _loc(loc) -> str:
    out = ''
    for p in loc:
        if isinstance(p, int):
            out += '[%d]' % p
        elif p == '[key]':
            out += '(key)'
        else:
            out += ('.' if out else '') + str(p)
    return out


def format_errors(e: ValidationError, root=None, prefix: tuple = ()) -> str:
    """root, prefix: the model validated and where it sits in the gpuhost namespace (('rollout',) for
    Rollout); by default the whole Deployment."""
    lines = []
    for err in e.errors(include_url=False):
        msg, kind, loc = err['msg'], err['type'], tuple(prefix) + tuple(err['loc'])
        value = err.get('input')
        if msg.startswith('Value error, '):
            msg = msg[len('Value error, '):]
        if msg.startswith('gpuhost:'):
            lines.append(msg)
            continue
        where = 'gpuhost:' + _loc(loc)
        shown = 'a secret value (not shown)' if _secret_loc(loc) else show(value)
        if kind == 'extra_forbidden':
            parent = _field_model(loc[len(prefix):-1], root)
            known = list(parent.model_fields) if parent is not None else []
            lines.append('%s is not a setting here%s; the settings of gpuhost:%s are: %s' % (
                where, did_you_mean(str(loc[-1]), known), _loc(loc[:-1]) or '', ', '.join(known)))
        elif kind == 'missing':
            lines.append('%s is required and not set' % where)
        elif kind in TYPE_NAMES:
            lines.append('%s: %s is not %s%s' % (where, shown, TYPE_NAMES[kind],
                                                 ' (write it without quotes)' if isinstance(value, str) and
                                                 kind.startswith(('int', 'float', 'bool')) and
                                                 loc[-1] != '[key]' else
                                                 ' (write it in quotes)' if kind == 'string_type' else ''))
        elif kind == 'literal_error':
            lines.append('%s: %s is not one of the allowed values: %s' % (
                where, shown, msg.split('Input should be ', 1)[-1]))
        elif kind in ('greater_than_equal', 'less_than_equal', 'greater_than', 'less_than', 'too_short', 'too_long'):
            lines.append('%s: %s - %s' % (where, shown, msg.lower()))
        else:
            lines.append('%s: %s' % (where, msg))
    return 'invalid stack configuration:\n  - ' + '\n  - '.join(lines)


SECURE = {'type': 'object', 'description': 'a Pulumi secret (pulumi config set --secret)',
          'properties': {'secure': {'type': 'string', 'pattern': '^v1:'}}, 'required': ['secure'],
          'additionalProperties': False}


def stack_schema() -> dict:
    """A JSON schema for Pulumi.<stack>.yaml as written: `gpuhost:<key>` objects checked against the
    model's structure and types, any value may be a `secure:` one, unknown keys and namespaces other
    than Pulumi's own are refused. For editors and CI; the program's own checks go further."""
    import copy

    def securable(node):
        if isinstance(node, dict):
            node = {k: securable(v) for k, v in node.items()}
            if node.get('type') in ('string', 'integer', 'number', 'boolean') or 'anyOf' in node or '$ref' in node:
                return {'anyOf': [node, SECURE]} if node is not SECURE else node
            return node
        if isinstance(node, list):
            return [securable(v) for v in node]
        return node

    model = copy.deepcopy(Deployment.model_json_schema())
    defs = {k: securable(v) for k, v in model.pop('$defs', {}).items()}
    props = {'gpuhost:' + k: securable(v) for k, v in model['properties'].items()}
    # A fleet: the keys above are the shared settings (each may then be partial); gpuhost:hosts entries
    # are a name plus any of them (the program merges and validates each host in full).
    entry = {'type': 'object', 'required': ['name'], 'additionalProperties': False,
             'properties': dict({'name': {'type': 'string', 'pattern': HOST_NAME_RE.pattern}},
                                **{k: {} for k in model['properties']})}
    props['gpuhost:hosts'] = {'type': 'array', 'minItems': 1, 'items': entry,
                              'description': 'A fleet: one entry per host, merged over the shared gpuhost:* settings'}
    props['gpuhost:rollout'] = securable(copy.deepcopy(Rollout.model_json_schema()))
    return {
        '$schema': 'https://json-schema.org/draft/2020-12/schema',
        'title': 'Pulumi.<stack>.yaml of the gpuhost project',
        'type': 'object',
        'properties': {
            # One host: the keys in full. A fleet (gpuhost:hosts): the shared keys may be partial, so they
            # are checked as mappings only; the program validates each merged host in full.
            'config': {'type': 'object', 'properties': {k: {} for k in props},
                       'patternProperties': {'^(%s):' % '|'.join(FOREIGN_NAMESPACES): {}},
                       'additionalProperties': False,
                       'if': {'required': ['gpuhost:hosts']},
                       'then': {'properties': dict({k: {'type': 'object'} for k in props},
                                                   **{k: props[k] for k in ('gpuhost:hosts', 'gpuhost:rollout')})},
                       'else': {'properties': props, 'required': ['gpuhost:' + r for r in model['required']]}},
            'encryptionsalt': {'type': 'string'}, 'secretsprovider': {'type': 'string'},
            'encryptedkey': {'type': 'string'}, 'environment': {},
        },
        'additionalProperties': False,
        '$defs': defs,
    }


if __name__ == '__main__':
    import sys
    if sys.argv[1:] == ['schema']:
        print(json.dumps(Deployment.model_json_schema(), indent=2))
    elif sys.argv[1:] == ['stack-schema']:
        print(json.dumps(stack_schema(), indent=2))
