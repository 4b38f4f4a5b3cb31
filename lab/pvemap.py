"""Proxmox's PCI resource mappings, which fakepve 0.5.0 does not model, added around it by the lab daemon
(lab/labctl.py): fakepve validates /cluster/mapping/pci requests against PVE's schema (the id's format, the
map entries' property strings, the permissions) and would answer with a made-up value storing nothing; the
lab stores them, and checks them at VM start as qemu-server does.

Written from Proxmox's own code, not from this program's (the lab must be able to disagree with it):
  * pve-manager PVE/API2/Cluster/Mapping/PCI.pm: index (with check-node), get, create, update, delete and
    their messages;
  * pve-guest-common src/PVE/Mapping/PCI.pm: the entry format and assert_valid (the device at each path must
    have the recorded vendor:device ID, subsystem ID and IOMMU group; properties in sorted order);
  * pve-common PVE::SysFSTools::pci_device_info (what is read from sysfs: no device without an irq file);
  * qemu-server PVE/QemuServer/PCI.pm parse_hostpci (the words a VM start fails with) and vm_start, which
    applies pending changes before it parses the hostpci entries.
The store is kept by the daemon (it survives the API's restarts in a reboot) and written to the simulated
host's /etc/pve/mapping/pci.cfg in pci.cfg's layout, as pmxcfs would show it.

Stdlib only (runs in the lab daemon with fakepve installed; fakepve's errors are imported where used).
"""

import hashlib
import os
import re

import hostsim

MAP_KEYS = ('node', 'path', 'id', 'subsystem-id', 'iommugroup', 'description')


class Invalid(Exception):
    """A `die "...\\n"` of Proxmox's mapping or hostpci code: str() is its message."""


def parse_props(text):
    """PVE::JSONSchema::parse_property_string for the formats here: 'k=v,...', a leading bare value as
    the default key (None)."""
    out = {}
    for i, part in enumerate(str(text).split(',')):
        if not part:
            continue
        key, eq, value = part.partition('=')
        if eq:
            out[key] = value
        elif i == 0:
            out[None] = part
    return out


def device_info(host, name):
    """PVE::SysFSTools::pci_device_info(name, verbose=1) on the simulated host, or None."""
    if not re.match(r'^(?:([a-f0-9]{4}):)?([a-f0-9]{2}):([a-f0-9]{2})\.([a-f0-9])$', name):
        return None
    devdir = host.pci(name)

    def first_line(fname):
        try:
            with open(os.path.join(devdir, fname)) as f:
                return f.readline().rstrip('\n')
        except OSError:
            return None
    irq = first_line('irq')
    if irq is None or not irq.isdigit():
        return None
    vendor, device = first_line('vendor'), first_line('device')
    if not vendor or not vendor.startswith('0x') or not device or not device.startswith('0x'):
        return None
    info = {'vendor': vendor[2:], 'device': device[2:]}
    sub_vendor, sub_device = first_line('subsystem_vendor'), first_line('subsystem_device')
    if sub_vendor is not None:
        info['subsystem_vendor'] = re.sub(r'^0x', '', sub_vendor)
    if sub_device is not None:
        info['subsystem_device'] = re.sub(r'^0x', '', sub_device)
    link = os.path.join(devdir, 'iommu_group')
    if os.path.lexists(link):
        m = re.search(r'/(\d+)$', os.readlink(link))
        if m:
            info['iommugroup'] = int(m.group(1))
    if os.path.isdir(os.path.join(devdir, 'mdev_supported_types')) or os.path.isdir(os.path.join(devdir, 'nvidia')):
        info['mdev'] = 1
    return info


def assert_valid(host, name, entry, cluster_cfg=None):
    """PVE::Mapping::PCI::assert_valid: raises Invalid unless every path of the entry holds the device it
    records."""
    paths = [p for p in (entry.get('path') or '').split(';')]
    for idx, path in enumerate(paths):
        if not re.search(r'\.[a-f0-9]', path, re.I):
            path = path + '.0'   # a whole device: its first function must exist
        info = device_info(host, path)
        if info is None:
            raise Invalid("pci device '%s' not found" % path)
        expected = {'id': '%s:%s' % (info['vendor'], info['device']), 'iommugroup': info.get('iommugroup'),
                    'subsystem-id': None}
        if 'subsystem_vendor' in info and 'subsystem_device' in info:
            expected['subsystem-id'] = '%s:%s' % (info['subsystem_vendor'], info['subsystem_device'])
        configured = {k: entry.get(k) for k in ('id', 'iommugroup', 'subsystem-id')}
        if cluster_cfg is not None:
            expected['mdev'] = 1 if info.get('mdev') else 0
            configured['mdev'] = 1 if str(cluster_cfg.get('mdev') or 0) in ('1', 'true') else 0
        for prop in sorted(expected):
            if prop == 'iommugroup' and idx > 0:
                continue  # checked on the first device only
            want, have = expected[prop], configured[prop]
            if want is None and have is None:
                continue
            if want is not None and have is None:
                raise Invalid("missing expected property '%s' for device '%s'" % (prop, path))
            if want is None and have is not None:
                raise Invalid("unexpected property '%s' configured for device '%s'" % (prop, path))
            want, have = str(want).replace('0x', ''), str(have).replace('0x', '')
            if want != have:
                raise Invalid("'%s' does not match for '%s' (%s != %s)" % (prop, name, want, have))


class Store(object):
    """The cluster's PCI mappings (pci.cfg) and the API over them."""

    def __init__(self, host, node):
        self.host, self.node = host, node
        self.ids = {}   # id -> {'map': [str], 'description'?, 'mdev'?, 'live-migration-capable'?}

    # -- pci.cfg

    def text(self):
        """The file PVE writes (PVE::SectionConfig: a header line per section, then its properties)."""
        out = []
        for mid in sorted(self.ids):
            cfg = self.ids[mid]
            out.append(mid)
            for key in sorted(k for k in cfg if k != 'map'):
                out.append('\t%s %s' % (key, cfg[key]))
            for m in cfg.get('map') or []:
                out.append('\tmap %s' % m)
            out.append('')
        return '\n'.join(out) + ('\n' if out else '')

    def digest(self):
        return hashlib.sha1(self.text().encode()).hexdigest()

    def save(self):
        hostsim.write(self.host.path('etc/pve/mapping/pci.cfg'), self.text())

    def node_mapping(self, mid, node):
        """PVE::Mapping::PCI::get_node_mapping: the parsed entries of one node, or None without the id."""
        cfg = self.ids.get(mid)
        if cfg is None:
            return None
        out = []
        for m in cfg.get('map') or []:
            entry = {k: v for k, v in parse_props(m).items() if k is not None}
            if entry.get('node') == node:
                out.append(entry)
        return out

    # -- the API (fakepve's StatefulRoutes: handlers run after the schema's checks)

    def routes(self):
        base = '/cluster/mapping/pci'
        return [('GET', base, self.index), ('POST', base, self.create), ('GET', base + '/{id}', self.get),
                ('PUT', base + '/{id}', self.update), ('DELETE', base + '/{id}', self.delete)]

    @staticmethod
    def die(message):
        from fakepve.model import PveError
        return PveError(500, message)

    async def index(self, v, user):
        check = v.get('check-node')
        if check is not None and check not in ('localhost', self.node):
            raise self.die('wrong node to check - %s != %s' % (check, self.node))
        out = []
        for mid in sorted(self.ids):
            entry = dict(self.ids[mid], id=mid, digest=self.digest(), type='pci')
            if check is not None:
                entry['checks'] = []
                mappings = self.node_mapping(mid, self.node)
                if not mappings:
                    entry['checks'].append({'severity': 'warning', 'message': 'No mapping for node %s.' % self.node})
                for m in mappings or []:
                    try:
                        assert_valid(self.host, mid, m, entry)
                    except Invalid as e:
                        entry['checks'].append({'severity': 'error', 'message': 'Invalid configuration: %s\n' % e})
            out.append(entry)
        return out

    async def get(self, v, user):
        cfg = self.ids.get(v['id'])
        if cfg is None:
            raise self.die("mapping '%s' not found" % v['id'])
        return dict(cfg, digest=self.digest(), type='pci')

    @staticmethod
    def options(v):
        out = {}
        if v.get('map') is not None:
            out['map'] = list(v['map']) if isinstance(v['map'], list) else [v['map']]
        for key in ('description', 'mdev', 'live-migration-capable'):
            if v.get(key) is not None:
                out[key] = v[key]
        return out

    async def create(self, v, user):
        mid = v['id']
        if mid in self.ids:
            raise self.die("create hardware mapping failed: pci ID '%s' already defined" % mid)
        self.ids[mid] = self.options(v)
        self.save()
        return None

    async def update(self, v, user):
        mid = v['id']
        if v.get('digest') and v['digest'] != self.digest():
            raise self.die('update hardware mapping failed: detected modified configuration - file changed by other '
                           'user? Try again.')
        if mid not in self.ids:
            raise self.die("update hardware mapping failed: pci ID '%s' does not exist" % mid)
        cfg = self.ids[mid]
        for key in [k for k in re.split(r'[\s,;]+', str(v.get('delete') or '')) if k]:
            cfg.pop(key, None)
        cfg.update(self.options(v))
        self.save()
        return None

    async def delete(self, v, user):
        self.ids.pop(v['id'], None)
        self.save()
        return None

    # -- the check at VM start

    def start_error(self, config, node):
        """Why qemu-server would refuse to start a VM with this config (pending changes applied), or None:
        PVE::QemuServer::PCI::parse_hostpci for every hostpciN, in order."""
        keys = sorted((k for k in config if re.match(r'^hostpci\d+$', k)), key=lambda k: int(k[7:]))
        for key in keys:
            props = parse_props(config[key])
            host = props.get(None) or props.get('host')
            mapping = props.get('mapping')
            try:
                if host and mapping:
                    raise Invalid("Cannot set both 'host' and 'mapping'.")
                if mapping:
                    devices = self.node_mapping(mapping, node)
                    if not devices:
                        raise Invalid("PCI device mapping not found for '%s'" % mapping)
                    alternatives = []
                    for device in devices:
                        try:
                            assert_valid(self.host, mapping, device, self.ids.get(mapping))
                        except Invalid as e:
                            raise Invalid('PCI device mapping invalid (hardware probably changed): %s' % e) from None
                        alternatives.append((device.get('path') or '').split(';'))
                elif host:
                    alternatives = [host.split(';')]
                else:
                    raise Invalid("Either 'host' or 'mapping' must be set.")
                for alternative in alternatives:
                    for pci_id in alternative:
                        if not self.lspci(pci_id):
                            raise Invalid("no PCI device found for '%s'" % pci_id)
            except Invalid as e:
                return str(e)
        return None

    def lspci(self, pci_id):
        """PVE::SysFSTools::lspci(filter): the devices whose address starts with it (domain 0000 implied)."""
        full = pci_id if re.match(r'^[a-f0-9]{4}:', pci_id) else '0000:' + pci_id
        root = self.host.path('sys/bus/pci/devices')
        return [d for d in sorted(os.listdir(root)) if d.startswith(full)] if os.path.isdir(root) else []

    def wrap_start(self, pve):
        """fakepve's VM start, with qemu-server's check: the task fails with its words after applying the
        pending changes (vm_start applies them before it builds the command line)."""
        from fakepve.model import TaskError
        start = pve._do_start

        async def checked(vm, user, p):
            if vm.ha_managed or vm.template or vm.lock or vm.status == 'running':
                return await start(vm, user, p)   # fakepve's own refusals (or HA) come first
            merged = dict(vm.config)
            for key, value in vm.pending.items():
                if value is None:
                    merged.pop(key, None)
                else:
                    merged[key] = value
            error = self.start_error(merged, vm.node)
            if error is None:
                return await start(vm, user, p)

            async def body():
                vm.apply_pending()
                raise TaskError(error)
            return await pve.task(vm.node, 'qmstart', vm.vmid, user, body, vm=vm)
        pve._do_start = checked
