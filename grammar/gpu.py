"""The GPUs this program places: PCI address and vendor:device formats, the Blackwell IDs and the
device nodes the nvidia driver registers."""

import re

BDF_RE = re.compile(r'^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$')
PCI_ID_RE = re.compile(r'^[0-9a-f]{4}:[0-9a-f]{4}$')
# RTX PRO 6000 Blackwell: Workstation, Max-Q, Server Edition (SYSTEM.md). Their GSP/FSP fails to
# boot (error 0x177) after running in an identity IOMMU domain and only a power cycle clears it.
BLACKWELL_IDS = frozenset({'10de:2bb1', '10de:2bb4', '10de:2bb5'})
FSP_EXPLANATION = ('identity (passthrough) IOMMU domains brick RTX PRO 6000 Blackwell GPUs until a power '
                   'cycle: the GPU firmware security processor fails to boot with error 0x177 and no FLR, '
                   'secondary bus reset or CXL reset clears it. SEV-SNP also needs a translating IOMMU')
# The driver's control nodes every CUDA process opens, beside /dev/nvidiaN of each GPU.
NVIDIA_CONTROL_DEVICES = ('/dev/nvidiactl', '/dev/nvidia-uvm', '/dev/nvidia-uvm-tools', '/dev/nvidia-modeset')
