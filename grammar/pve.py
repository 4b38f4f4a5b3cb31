"""Proxmox's value grammars: property strings (`virtio,bridge=vmbr0,firewall=1`, `/dev/nvidia0,mode=0666`,
`0000:81:00.0,pcie=1`) read and compared the way Proxmox writes them back, and the raw `lxc.*` lines of a
guest's config file. Stdlib only; used by the program (components/pve.py), the config and the policy pack.
"""

from __future__ import annotations


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
    defaults = PROXMOX_DEFAULTS.get(base, {})
    if any(k not in d_props and k not in PROXMOX_ADDED.get(base, ()) and scalar(v) != defaults.get(k)
           for k, v in a_props.items()):
        return False
    return all(scalar(a_props.get(k)) == scalar(v) for k, v in d_props.items())



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

