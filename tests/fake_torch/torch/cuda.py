import os
import types

_current = [0]
nccl = types.SimpleNamespace(version=lambda: (2, 27, 3))


def _bus_ids():
    gpus = os.environ.get('FAKE_TORCH_GPUS', '0000:01:00.0').split(',')
    visible = os.environ.get('CUDA_VISIBLE_DEVICES')
    return gpus if visible is None else [gpus[int(i)] for i in visible.split(',') if i.strip()]


def device_count():
    return len(_bus_ids())


def get_device_properties(i):
    domain, bus, rest = _bus_ids()[i].split(':')
    return types.SimpleNamespace(name='Fake GPU', total_memory=96 << 30, pci_domain_id=int(domain, 16),
                                 pci_bus_id=int(bus, 16), pci_device_id=int(rest.split('.')[0], 16))


def current_bus_id():
    return _bus_ids()[_current[0]]


def set_device(i):
    _current[0] = i


def mem_get_info(i=None):
    return (90 << 30, 96 << 30)


def synchronize():
    pass
