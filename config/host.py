"""gpuhost:host - the Proxmox host: how to reach it (SSH with a pinned host key, the API as root@pam with
its CA), its GPU inventory, its NUMA CPU lists and whether the program may reboot it."""

from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import AfterValidator, Field, SecretStr, field_validator, model_validator

from config.values import (Bdf, ConfigError, CpuList, FilePath, HostName, Model, NodeName, PciId, PosixUser, PveUser,
                           Text, check_ca, cpus_of, parse_host_key)
from grammar.gpu import BLACKWELL_IDS


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
    command_timeout: float = Field(900.0, ge=5, le=86400, description='Longest one remote command may run (update-'
                                   'initramfs, boot refresh); shorter ones stop at 30-300 s. A command that runs out is '
                                   'named. Downloads, hashing, builds and installers are jobs with limits of their own')

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
                                                       'program, see docs/operator-guide.md, '
                                                       '"Why API tokens are refused"')
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
    id: PciId = Field(description='vendor:device as `lspci -D -nn -d 10de:` shows it, 10de:2bb5')


class Host(Model):
    address: HostName = Field(description='DNS name (or address) of the Proxmox host, for SSH and the API')
    node: NodeName = Field(description='Proxmox node name')
    ssh: Ssh
    api: Api
    gpus: list[GpuInfo] = Field(min_length=1, description='The host\'s GPU inventory; checked against the host '
                                                          'on every up')
    numa_cpus: dict[int, CpuList] = Field(description='Host CPUs of each NUMA node, "0-31,64-95" as the host '
                                                   'lists them (cat /sys/devices/system/node/node<N>/cpulist)')
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
                                     '(cat /sys/devices/system/node/node<N>/cpulist on the host)' % (cpu, seen[cpu], node))
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
