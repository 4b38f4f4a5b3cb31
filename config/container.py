"""gpuhost:container - the LXC container that serves SGLang: its GPUs (devN), NUMA node, template and
create-only keys, resources, network and protection."""

from __future__ import annotations

import ipaddress
from typing import Annotated, Optional

from pydantic import AfterValidator, Field

from config.values import (ADOPT_DOC, PROTECT_DOC, Bdf, Bridge, DnsName, Model, StorageId, Template, VmId, ipv4,
                           ipv4_interface, nameservers)


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
    adopt: bool = Field(False, description=ADOPT_DOC)

    @property
    def address(self):
        return str(ipaddress.ip_interface(self.ip).ip)
