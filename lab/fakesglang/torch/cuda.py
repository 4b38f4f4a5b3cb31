import os
import re
import types

_current = [0]
nccl = types.SimpleNamespace(version=lambda: (2, 27, 3))


def _container_gpus():
    """The container's GPUs: its /dev/nvidia<N> nodes, each named by the host's procfs entry with that minor."""
    root = os.environ.get('LAB_SGLANG_SYSROOT') or '/'
    minors = {int(n[len('nvidia'):]) for n in os.listdir(os.path.join(root, 'dev'))
              if n.startswith('nvidia') and n[len('nvidia'):].isdigit()}
    gdir = os.path.join(root, 'proc', 'driver', 'nvidia', 'gpus')
    out = []
    for bdf in sorted(os.listdir(gdir)) if os.path.isdir(gdir) else []:
        try:
            with open(os.path.join(gdir, bdf, 'information')) as f:
                info = f.read()
        except OSError:
            continue
        m = re.search(r'^Device Minor:\s*(\d+)', info, re.M)
        if m and int(m.group(1)) in minors:
            out.append(bdf.lower())
    return out


def _bus_ids():
    given = os.environ.get('FAKE_TORCH_GPUS')
    gpus = given.split(',') if given else _container_gpus()
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
