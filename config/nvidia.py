"""gpuhost:nvidia - the host's nvidia kernel driver: the module's options (/etc/modprobe.d/gpuhost-nvidia.conf) and,
when `driver` is declared, the driver itself (issue 59, docs/driver-plan.md): one version for the host's kernel
module and the container's user space (gpuhost:runtime.nvidia follows it)."""

from __future__ import annotations

from typing import ClassVar, Literal, Optional

from pydantic import Field

from config.runtime import DriverVersion, NvidiaRuntime
from config.values import Model


class NvidiaDriver(NvidiaRuntime):
    """The host's NVIDIA kernel driver, from NVIDIA's .run installer (the same file the container's user space comes
    from, so the same rules: a file on the host or a URL the host downloads it from, with its sha256, the version in
    its name)."""
    KEY: ClassVar[str] = 'gpuhost:nvidia.driver'
    version: DriverVersion = Field(description='The driver version the host\'s kernel module runs, for every installed '
                                               'kernel (DKMS), and the container\'s user space with it')
    modules: Literal['open'] = Field('open', description='The kernel modules\' flavour: open (NVIDIA\'s open kernel '
                                                         'modules; Blackwell GPUs run no other)')

    def runtime(self) -> dict:
        """gpuhost:runtime.nvidia as it follows the driver: the same installer, the same version."""
        return self.model_dump(exclude={'modules'}, exclude_none=True)


class Nvidia(Model):
    dma_remap_peer_mmio: int = Field(ge=0, le=1, default=
        1, description='NVreg_DmaRemapPeerMmio, 0 or 1 (already 1 by default; written explicitly so it is visible '
                       'and diffable). No fix for P2P under translation: NCCL_P2P_DISABLE=1 is')
    driver: Optional[NvidiaDriver] = Field(None, description='The host\'s NVIDIA kernel driver as declared state '
                                           '(version, open modules, the installer). Absent: the driver is the '
                                           'operator\'s, as before (nothing changes on a deployed host)')
