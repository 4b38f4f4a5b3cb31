"""gpuhost:nvidia - the nvidia kernel module's options (/etc/modprobe.d/gpuhost-nvidia.conf)."""

from __future__ import annotations

from pydantic import Field

from config.values import Model


class Nvidia(Model):
    dma_remap_peer_mmio: int = Field(ge=0, le=1, default=
        1, description='NVreg_DmaRemapPeerMmio, 0 or 1 (already 1 by default; written explicitly so it is visible '
                       'and diffable). No fix for P2P under translation: NCCL_P2P_DISABLE=1 is')
