"""gpuhost:iommu - the IOMMU domain type the host boots with (translated: DMA-FQ or DMA; identity is
refused where it would brick a GPU) and the other kernel parameters to keep on its command line."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from config.values import Model, Text
from grammar import cmdline


# Half of the kernel's command line (cmdline.COMMAND_LINE_MAX) for what this program writes: the rest is the
# host's own (root=, BOOT_IMAGE=, console=...).
EXTRA_KERNEL_ARGS_MAX = 1024


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
