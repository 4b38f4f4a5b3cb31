"""The lab's simulated torch (SIMULATED, no GPU): only what hostscripts/gpu_proof.py calls, shipped in the lab's
SGLang wheel so that the program's GPU proof runs in a lab container as it runs with the real torch. A tensor is its
shape and one value that all its elements share, which is enough for the proof's checks.

The GPUs it sees are the container's: its /dev/nvidia<N> nodes, each the GPU whose /proc/driver/nvidia/gpus/<bus
id>/information names that Device Minor (the host's procfs, as an LXC container sees it), in bus-id order;
CUDA_VISIBLE_DEVICES picks and orders them by index, as CUDA does. LAB_SGLANG_SYSROOT (default /) is where those
paths are looked up. Faults, per lab test: /etc/lab-faults/torch.json in the container ({"bad_gpu": <bus id>, "hang":
"sleep"|"stop", "wrong_sum": true, "busbw_gbps": 2}), or the same as environment variables (the unit tests, which also give the GPUs):

FAKE_TORCH_GPUS     the GPUs' PCI bus ids, comma-separated, instead of the container's
FAKE_TORCH_BAD_GPU  the bus id of a GPU whose matmul is wrong (by half)
FAKE_TORCH_HANG     all_reduce never returns: 'sleep' (a wait SIGTERM ends), 'stop' (the worker stops itself, as
                    `kill -STOP` from outside would: only SIGKILL ends it)
FAKE_TORCH_WRONG_SUM  all_reduce returns the sum less one
FAKE_TORCH_BUSBW_GBPS  a slow transport: each all-reduce of more than one rank takes as long as a bus bandwidth of
                    that many GB/s (nccl-tests' busbw) would make it (a bf16 tensor's bytes)"""

import json
import math
import os


def fault(name):
    """A fault the test set: FAKE_TORCH_<NAME>, else /etc/lab-faults/torch.json's name."""
    value = os.environ.get('FAKE_TORCH_' + name.upper())
    if value:
        return value
    root = os.environ.get('LAB_SGLANG_SYSROOT') or '/'
    try:
        with open(os.path.join(root, 'etc', 'lab-faults', 'torch.json')) as f:
            return json.load(f).get(name)
    except (OSError, ValueError):
        return None


from . import cuda, distributed, version  # noqa: E402,F401

__version__ = '0.0+fake'


class dtype:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return 'torch.' + self.name


bfloat16 = dtype('bfloat16')
float32 = dtype('float32')


class Tensor:
    def __init__(self, shape, value, dt):
        self.shape, self.value, self.dtype = tuple(shape), float(value), dt

    def numel(self):
        return math.prod(self.shape)

    def __matmul__(self, other):
        value = self.value * other.value * self.shape[1]
        if self.dtype is bfloat16 and cuda.current_bus_id() == fault('bad_gpu'):
            value *= 1.5
        return Tensor((self.shape[0], other.shape[1]), value, self.dtype)

    def __getitem__(self, rows):
        return Tensor((len(range(*rows.indices(self.shape[0]))),) + self.shape[1:], self.value, self.dtype)

    def __sub__(self, other):
        return Tensor(self.shape, self.value - other.value, self.dtype)

    def __truediv__(self, other):
        return Tensor((), self.value / other.value if other.value else math.nan, self.dtype)

    def float(self):
        return Tensor(self.shape, self.value, float32)

    def norm(self):
        return Tensor((), abs(self.value) * math.sqrt(self.numel()), float32)

    def min(self):
        return Tensor((), self.value, self.dtype)

    max = min

    def item(self):
        return self.value


def randn(*shape, device=None, dtype=float32):
    return Tensor(shape, 1.0, dtype)


def ones(*shape, device=None, dtype=float32):
    return Tensor(shape, 1.0, dtype)


def full(shape, value, device=None, dtype=float32):
    return Tensor(shape, value, dtype)
