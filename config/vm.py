"""gpuhost:vm - the SEV-SNP VM with the GPUs bound to vfio-pci (optional: vm: null is a host without one)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, model_validator

from config.values import ADOPT_DOC, PROTECT_DOC, Bdf, Bridge, DnsName, MappingPrefix, Model, VmId, show
from grammar.pve import CONFIGID_RE

GPU_BINDING_DOC = (
    'How the VM gets its GPUs. mapping (default): through Proxmox PCI resource mappings (/cluster/mapping/pci, '
    'hostpciN: mapping=<id>,pcie=1), one per GPU, recording the device\'s vendor:device ID, subsystem ID and '
    'IOMMU group - Proxmox refuses to start the VM when the device at the address no longer matches (a '
    'renumbered bus). address: raw hostpciN: <address>,pcie=1, which Proxmox starts with whatever device sits '
    'at that address')
# Longest mapping id this program makes. Proxmox's pve-configid has no length limit of its own; an id also
# names the ACL path /mapping/pci/<id> and a section of /etc/pve/mapping/pci.cfg, so it stays short.
MAPPING_ID_MAX = 64


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
    adopt: bool = Field(False, description=ADOPT_DOC)
    gpu_binding: Literal['mapping', 'address'] = Field('mapping', description=GPU_BINDING_DOC)
    gpu_mapping_prefix: Optional[MappingPrefix] = Field(
        None, description='Mapping ids are <prefix><N> for hostpciN (default prefix gpuhost-<vmid>-gpu); mapping '
                          'ids are cluster-wide, so two VMs of one cluster need different prefixes')

    @model_validator(mode='after')
    def _mapping_ids(self):
        if self.gpu_binding == 'address':
            if self.gpu_mapping_prefix is not None:
                raise ValueError('gpuhost:vm.gpu_mapping_prefix: %s is set, but gpuhost:vm.gpu_binding is address (no '
                                 'mappings are made); remove gpu_mapping_prefix or set gpu_binding: mapping'
                                 % show(self.gpu_mapping_prefix))
            return self
        for i, mid in enumerate(self.mapping_ids()):
            # The prefix's grammar makes every id valid; checked whole as Proxmox checks it, so a default that
            # changes one day cannot hand Proxmox an id it refuses halfway through an `up`.
            if not CONFIGID_RE.match(mid) or len(mid) > MAPPING_ID_MAX:
                raise ValueError('gpuhost:vm.gpu_mapping_prefix: the mapping id of hostpci%d would be %s, which is not '
                                 'a Proxmox mapping id (a letter, then letters, digits, "-" or "_"; at most %d '
                                 'characters here); write e.g. gpu_mapping_prefix: gpuhost-%d-gpu' % (
                                     i, show(mid), MAPPING_ID_MAX, self.vmid))
        return self

    def mapping_ids(self) -> list:
        """The resource mapping of each GPU, in hostpci order (hostpci0 is gpus[0]); [] for gpu_binding address."""
        if self.gpu_binding != 'mapping':
            return []
        prefix = self.gpu_mapping_prefix or 'gpuhost-%d-gpu' % self.vmid
        return ['%s%d' % (prefix, i) for i in range(len(self.gpus))]
