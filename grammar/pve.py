"""Proxmox's value grammars: property strings (`virtio,bridge=vmbr0,firewall=1`, `/dev/nvidia0,mode=0666`,
`0000:81:00.0,pcie=1`, `mapping=gpuhost-300-gpu0,pcie=1`) read and compared the way Proxmox writes them
back, the node entries of a PCI resource mapping (`node=pve,path=0000:81:00.0,id=10de:2bb5,...`), and the
raw `lxc.*` lines of a guest's config file. Stdlib only; used by the program (resources/pve.py,
resources/pcimap.py), the config and the policy pack.
"""

from __future__ import annotations

import re


def split_props(value) -> tuple:
    """'a,b=c,d=e' -> ('a', {'b': 'c', 'd': 'e'}); a leading k=v (host=..., path=...) is kept as a key."""
    text = str(value)
    first, props = None, {}
    for i, part in enumerate(text.split(',')):
        if '=' in part:
            k, v = part.split('=', 1)
            props[k.strip()] = v.strip()
        elif i == 0:
            first = part.strip()
    return first, props


def scalar(value) -> str:
    if isinstance(value, bool):
        return '1' if value else '0'
    return str(value)


LIST_KEYS = ('net', 'dev', 'hostpci', 'numa', 'amd-sev', 'features', 'rootfs', 'mp', 'scsi', 'efidisk',
             'virtio', 'sata', 'ide')
# Sub-keys Proxmox fills in itself (a generated MAC, the interface type, the disk size), and sub-keys
# at Proxmox's default value: anything else the config does not set is a difference, so a property
# smuggled in once (a comma in a bridge name) does not stay after the config is fixed.
PROXMOX_ADDED = {'net': {'hwaddr', 'type'}, 'rootfs': {'size'}}
PROXMOX_DEFAULTS = {'hostpci': {'rombar': '1'}}
# The positional part of these values has a key name when written as k=v.
POSITIONAL = {'dev': 'path', 'hostpci': 'host', 'amd-sev': 'type', 'numa': 'cpus'}


def is_list_key(key: str) -> bool:
    return any(key.rstrip('0123456789') == p for p in LIST_KEYS)


def same_value(key: str, desired, actual) -> bool:
    """Does Proxmox's value satisfy the desired one? Only sub-keys the config sets count."""
    if actual is None:
        return desired is None
    if desired is None:
        return False
    if not is_list_key(key):
        return scalar(desired) == scalar(actual)
    base = key.rstrip('0123456789')
    pos_name = POSITIONAL.get(base)
    d_first, d_props = split_props(desired)
    a_first, a_props = split_props(actual)
    if pos_name:
        d_first = d_first or d_props.pop(pos_name, None)
        a_first = a_first or a_props.pop(pos_name, None)
    if d_first is not None and a_first is None and d_first in a_props:
        # net0 'virtio,bridge=...' comes back as 'virtio=BC:24:...,bridge=...' (model=MAC).
        a_first = d_first
        a_props = {k: v for k, v in a_props.items() if k != d_first}
    if d_first is not None and (a_first or '').lower() != d_first.lower():
        return False
    if d_first is None and a_first is not None:
        # `mapping=...` desired, a raw address found (or added beside it): another device, not a detail.
        return False
    defaults = PROXMOX_DEFAULTS.get(base, {})
    if any(k not in d_props and k not in PROXMOX_ADDED.get(base, ()) and scalar(v) != defaults.get(k)
           for k, v in a_props.items()):
        return False
    return all(scalar(a_props.get(k)) == scalar(v) for k, v in d_props.items())



# ------------------------------------------------------------ PCI resource mappings

# pve-configid (PVE::JSONSchema's $CONFIGID_RE, case-insensitive): the format of a mapping's id, and of the
# `mapping=` a hostpciN entry names.
CONFIGID_RE = re.compile(r'^[a-z][a-z0-9_-]+$', re.I)
# The keys of one node's entry of /cluster/mapping/pci (PVE::Mapping::PCI's $map_fmt), in the order this
# program writes them.
MAP_KEYS = ('node', 'path', 'id', 'subsystem-id', 'iommugroup', 'description')
# What identifies the hardware beside the vendor:device ID (which the config declares): read from the device
# when an entry is written, checked by Proxmox at VM start (PVE::Mapping::PCI::assert_valid) like the ID.
RECORDED = ('subsystem-id', 'iommugroup')


def parse_map_entry(text) -> dict:
    """'node=pve,path=0000:81:00.0,id=10de:2bb5,iommugroup=40' -> {'node': 'pve', 'path': ..., ...}; values as
    text (iommugroup too, so a comparison does not depend on how a client typed it)."""
    _, props = split_props(text)
    return {k: v for k, v in props.items() if v != ''}


def map_entry(entry: dict) -> str:
    """One node's entry as a property string, known keys in MAP_KEYS order (None values left out)."""
    keys = [k for k in MAP_KEYS if entry.get(k) is not None] + sorted(k for k in entry if k not in MAP_KEYS
                                                                       and entry[k] is not None)
    return ','.join('%s=%s' % (k, entry[k]) for k in keys)


def hostpci_mapping(mapping_id: str) -> str:
    """A VM's hostpciN value for a GPU passed through a resource mapping (PCI express: q35)."""
    return 'mapping=%s,pcie=1' % mapping_id


def hostpci_address(bdf: str) -> str:
    """A VM's hostpciN value for a GPU passed by its raw PCI address."""
    return '%s,pcie=1' % bdf


# ------------------------------------------------------------ raw lxc.* lines

def parse_raw(text: str) -> dict:
    """Raw lxc.* lines of the main section of a PVE guest config ('lxc.key: value')."""
    out = {}
    for line in text.splitlines():
        if line.startswith('['):
            break
        if line.startswith('lxc.') and ':' in line:
            k, v = line.split(':', 1)
            out[k.strip()] = v.strip()
    return out


def with_raw(text: str, want: dict) -> str:
    """The config with the managed lxc.* keys set to `want` (others untouched), in the main section."""
    if not want:
        return text
    lines = text.splitlines()
    end = next((i for i, line in enumerate(lines) if line.startswith('[')), len(lines))
    main = [line for line in lines[:end] if not (line.startswith('lxc.') and line.split(':', 1)[0].strip() in want)]
    while main and not main[-1].strip():
        main.pop()
    main += ['%s: %s' % (k, v) for k, v in want.items()]
    rest = lines[end:]
    return '\n'.join(main + ([''] if rest else []) + rest) + '\n'

