"""The lab's simulated SGLang package as the lab installs it, for tests that run it outside a lab:
lab/fakesglang/sglang with its VERSION and its argument table (sglang/lab_server_args.json), made
from the release's wheel by tools/sglang_flags_gen.py --lab-table, never from components/."""

import os
import shutil

from tools import sglang_flags_gen

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def install(lib, version):
    """The package at `lib`/sglang (a PYTHONPATH entry) for SGLang `version`; returns its path."""
    pkg = os.path.join(str(lib), 'sglang')
    shutil.copytree(os.path.join(REPO, 'lab', 'fakesglang', 'sglang'), pkg,
                    ignore=shutil.ignore_patterns('__pycache__'))
    with open(os.path.join(pkg, 'VERSION'), 'w') as f:
        f.write(version + '\n')
    sglang_flags_gen.lab_table(version, os.path.join(pkg, 'lab_server_args.json'))
    return pkg


def sysroot(root, driver='580.95.05', module='580.95.05', cuda_home='/usr/local/cuda-13.0'):
    """A directory laid out as a container with the NVIDIA user space `driver` (None: none), the host's
    module `module` in /proc/driver/nvidia/version, and nvcc at cuda_home (None: no toolkit). Returns the
    environment that points the simulated SGLang at it (LAB_SGLANG_SYSROOT, CUDA_HOME)."""
    root = str(root)
    lib = os.path.join(root, 'usr/lib/x86_64-linux-gnu')
    os.makedirs(lib, exist_ok=True)
    if driver:
        with open(os.path.join(lib, 'libcuda.so.' + driver), 'w') as f:
            f.write('simulated\n')
        os.symlink('libcuda.so.' + driver, os.path.join(lib, 'libcuda.so.1'))
    os.makedirs(os.path.join(root, 'proc/driver/nvidia'), exist_ok=True)
    with open(os.path.join(root, 'proc/driver/nvidia/version'), 'w') as f:
        f.write('NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  %s  Release Build  (dvs-builder@x)  '
                'Tue Sep 23 09:50:16 UTC 2025\n' % module)
    env = {'LAB_SGLANG_SYSROOT': root}
    if cuda_home:
        nvcc = os.path.join(root, cuda_home.lstrip('/'), 'bin', 'nvcc')
        os.makedirs(os.path.dirname(nvcc), exist_ok=True)
        with open(nvcc, 'w') as f:
            f.write('#!/bin/sh\n')
        os.chmod(nvcc, 0o755)
        env['CUDA_HOME'] = cuda_home
    return env
