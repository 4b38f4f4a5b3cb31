"""gpuhost:vm - the SEV-SNP VM with the GPUs bound to vfio-pci (optional: vm: null is a host without one)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from config.values import PROTECT_DOC, Bdf, Bridge, DnsName, Model, VmId


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
