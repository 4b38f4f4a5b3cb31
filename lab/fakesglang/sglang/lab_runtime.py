"""What the simulated SGLang needs from the container before it serves, checked as the real one's start-up
fails without it - with the real messages (torch's and SGLang's JIT's):

  * the NVIDIA user space: libcuda.so.1 present (torch: "Found no NVIDIA driver on your system") and of the
    running kernel module's version, read from /proc/driver/nvidia/version as a container sees the host's
    (cuInit: error 803, "system has unsupported display driver / cuda driver combination");
  * the CUDA toolkit at $CUDA_HOME (the kernels SGLang JIT-compiles call $CUDA_HOME/bin/nvcc), of the major
    version the environment's torch was built for (TORCH_CUDA: the lab's stands in for a cu130 build), as
    torch.utils.cpp_extension checks it before a JIT build (the toolkit's release read from its version.json,
    where the lab's installer writes what its nvcc --version prints; no version.json: not checked).

LAB_SGLANG_SYSROOT (default /) is where those paths are looked up: the unit tests run this package outside
a container and give it a directory laid out like one. Stdlib only.
"""

import json
import os
import re

LIB = 'usr/lib/x86_64-linux-gnu/libcuda.so.1'
PROC = 'proc/driver/nvidia/version'
NO_DRIVER = ('RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and '
             'installed a driver from http://www.nvidia.com/Download/index.aspx')
MISMATCH = ('RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling '
            'NumCudaDevices() that might have already set an error? Error 803: system has unsupported display driver '
            '/ cuda driver combination')
NO_CUDA_HOME = 'OSError: CUDA_HOME environment variable is not set. Please set it to your CUDA install root.'
NO_NVCC = "FileNotFoundError: [Errno 2] No such file or directory: '%s/bin/nvcc'"
# The CUDA the environment's torch was built for (torch.version.cuda) and torch's message for a toolkit of
# another major version (torch/utils/cpp_extension.py, CUDA_MISMATCH_MESSAGE).
TORCH_CUDA = '13.0'
CUDA_MISMATCH = ('RuntimeError: The detected CUDA version (%s) mismatches the version that was used to compile '
                 'PyTorch (%s). Please make sure to use the same CUDA versions.')


def kernel_module(root):
    try:
        with open(os.path.join(root, PROC)) as f:
            m = re.search(r'^NVRM version:.*\s(\d+\.\d[\d.]*)\s', f.read(), re.M)
    except OSError:
        return None
    return m.group(1) if m else None


def problem(environ=None, root=None):
    """None when the container has what SGLang needs, else the error the real start-up prints."""
    environ = os.environ if environ is None else environ
    root = root or environ.get('LAB_SGLANG_SYSROOT') or '/'
    lib = os.path.join(root, LIB)
    kernel = kernel_module(root)
    if not os.path.exists(lib) or kernel is None:
        return NO_DRIVER
    mine = os.path.realpath(lib).rsplit('libcuda.so.', 1)[-1]
    if mine != kernel:
        return MISMATCH
    cuda = environ.get('CUDA_HOME')
    if not cuda:
        return NO_CUDA_HOME
    if not os.access(os.path.join(root, cuda.lstrip('/'), 'bin', 'nvcc'), os.X_OK):
        return NO_NVCC % cuda
    try:
        with open(os.path.join(root, cuda.lstrip('/'), 'version.json')) as f:
            release = '.'.join(str(json.load(f)['cuda']['version']).split('.')[:2])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if release.split('.')[0] != TORCH_CUDA.split('.')[0]:
        return CUDA_MISMATCH % (release, TORCH_CUDA)
    return None
