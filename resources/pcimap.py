"""PCI resource mappings for the VM's GPUs (`/cluster/mapping/pci`): one mapping per GPU, referenced by the
VM as `hostpciN: mapping=<id>,pcie=1`. Its entry for the node records what identifies the device - the
vendor:device ID, the subsystem ID and the IOMMU group - and Proxmox refuses to start the VM when the
device at the address no longer matches ("PCI device mapping invalid (hardware probably changed)"): the
platform's own guard against a renumbered bus handing the VM another device, on this host possibly one of
the container's identical GPUs.

Facts -> desired -> smallest change:
  * declared (config): the mapping id (config/vm.py), the node, the address and the vendor:device ID (the
    GPU inventory's, which preflight checks against the host);
  * facts: the subsystem ID and IOMMU group of the device at the address, written into the entry when the
    entry is made (or rewritten because its address or ID was edited out of band) and from then on *checked*,
    never re-recorded: an entry whose recorded facts no longer match the device is what Proxmox calls
    "hardware probably changed", and `up` stops before the VM is started (preflight at every `up`, and this
    provider before it writes) instead of recording the new device and starting the VM with it;
  * DANGER when the address now holds a non-GPU device or a container GPU (one of the container's
    addresses, or a GPU on the container's NUMA node, where the VM's never sit).

Proxmox's mapping is the record: the Pulumi state keeps no second copy of what it records, only the address
each entry was last written for (`written`, which a refresh leaves alone), so that a later run tells the
config's own move of a GPU (an entry still at that address) from an entry edited out of band. Deleting
a mapping (`pvesh delete /cluster/mapping/pci/<id>`) is how an operator has it recorded again from the
device now at the address; `up` also recreates a mapping deleted out of band, after the same checks.
A mapping is cluster-wide: writing or removing this node's entries keeps the other nodes' as they are, and a
mapping is deleted only when no other node's entry is left in it.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from transport import remote
from resources.host import read_facts
from resources.fields import I, S, arr, mapof, obj, optional
from resources.pve import IMPORTED, api_call, client
from resources.resource import CheckResult, CreateResult, DiffResult, UpdateResult
from resources.state import GpuhostResource, ObservedProvider
from transport.operator import OperatorError, warn
from grammar.gpu import BDF_RE
from grammar.pve import RECORDED, map_entry, parse_map_entry, split_props


class MappingError(OperatorError):
    pass


# ------------------------------------------------------------------ pure logic

def device_fingerprint(dev: remote.PciDevice) -> dict:
    """What Proxmox expects a mapping entry to record for this device (PVE::Mapping::PCI::assert_valid)."""
    return {'id': dev.id, 'subsystem-id': dev.subsystem_id,
            'iommugroup': None if dev.group is None else str(dev.group)}


def proxmox_refusal(mid: str, path: str, entry: dict, dev: Optional[remote.PciDevice]) -> str:
    """What Proxmox says when it refuses to start a VM with this entry, or '' when it would start it: the
    rule of PVE::Mapping::PCI::assert_valid (properties in sorted order, 0x prefixes ignored), in the
    words qemu-server wraps it in."""
    if dev is None:
        why = "pci device '%s' not found" % path
    else:
        want = device_fingerprint(dev)
        why = ''
        for prop in sorted(want):
            expected = want[prop]
            configured = entry.get(prop)
            if expected is None and configured is None:
                continue
            if configured is None:
                why = "missing expected property '%s' for device '%s'" % (prop, path)
            elif expected is None:
                why = "unexpected property '%s' configured for device '%s'" % (prop, path)
            elif expected.replace('0x', '') != str(configured).replace('0x', ''):
                why = "'%s' does not match for '%s' (%s != %s)" % (prop, mid, expected.replace('0x', ''),
                                                                 str(configured).replace('0x', ''))
            if why:
                break
        if not why:
            return ''
    return 'PCI device mapping invalid (hardware probably changed): %s' % why


def describe(dev: Optional[remote.PciDevice]) -> str:
    if dev is None:
        return 'no device'
    return '%s %s (subsystem %s, IOMMU group %s, NUMA node %d, driver %s)' % (
        'a GPU' if dev.is_gpu else 'a non-GPU device (PCI class %s)' % dev.pci_class, dev.id,
        dev.subsystem_id or 'none', '-' if dev.group is None else dev.group, dev.numa, dev.driver or 'none')


def recorded(entry: dict) -> str:
    return '%s (subsystem %s, IOMMU group %s)' % (entry.get('id'), entry.get('subsystem-id') or 'none',
                                                  entry.get('iommugroup', '-'))


@dataclasses.dataclass
class Finding:
    """Why the mapping of one GPU must not be used (or written) now."""
    danger: bool
    text: str          # one sentence: what the mapping expects, what the address holds
    refusal: str       # Proxmox's own refusal at VM start, '' if Proxmox would start the VM


def verify(mid: str, spec: dict, entry: Optional[dict], dev: Optional[remote.PciDevice], guard: dict,
           vm_numa: int) -> Optional[Finding]:
    """Is the device at the declared address still the VM's GPU the mapping (entry: Proxmox's entry for the
    node at that address, or None when there is none yet) was made for? None when it is.

    spec: {'path', 'id', 'hostpci'} as declared; guard: {'gpus': container GPU addresses, 'numa': the
    container's NUMA node}."""
    path = spec['path']
    refusal = proxmox_refusal(mid, path, entry, dev) if entry is not None else ''
    where = 'the PCI mapping %s (%s) %s' % (mid, spec.get('hostpci', 'hostpci'),
                                           'records %s as %s' % (path, recorded(entry)) if entry is not None
                                           else 'is for %s, a %s GPU' % (path, spec['id']))
    ct_numa = guard.get('numa')
    if path in (guard.get('gpus') or []):
        return Finding(True, '%s, one of the container\'s GPUs (gpuhost:container.gpus): started, the VM would '
                       'take it from the container' % where, refusal)
    if dev is None:
        return Finding(False, '%s, but the host has no PCI device there' % where, refusal)
    if not dev.is_gpu:
        return Finding(True, '%s, but the host now has %s there' % (where, describe(dev)), refusal)
    if dev.numa != vm_numa and dev.numa == ct_numa:
        return Finding(True, '%s, but the host now has there %s - on the container\'s NUMA node, where the '
                       'container\'s GPUs sit: started, the VM would take a container GPU' % (where, describe(dev)),
                       refusal)
    if dev.id != spec['id'] or dev.numa != vm_numa:
        return Finding(False, '%s, but the host now has there %s; the config declares %s on NUMA node %d' % (
            where, describe(dev), spec['id'], vm_numa), refusal)
    if refusal:
        return Finding(False, '%s, but the host now has there %s' % (where, describe(dev)), refusal)
    return None


def stop_message(mid: str, spec: dict, finding: Finding, vmid) -> str:
    """The whole story for the operator: what was found, what Proxmox would say, what to do."""
    return ('%s%s.%s Stopping before any change: VM %s is not started. To recover: find where the VM\'s GPUs are '
            'now (lspci -D -nn -d 10de: and /sys/bus/pci/devices/<address>/numa_node on the host), put their addresses '
            'into gpuhost:host.gpus and gpuhost:vm.gpus and check the vfio-pci overrides (driverctl list-overrides: '
            'an override by address binds whatever sits there now), then re-run - the mappings are rewritten for '
            'the new addresses. If the device at %s is the VM\'s GPU after all (only its IOMMU group or subsystem '
            'changed, e.g. after a firmware update), delete the mapping (pvesh delete /cluster/mapping/pci/%s) and '
            're-run: it is recorded again from the device.' % (
                'DANGER - ' if finding.danger else 'the PCI bus changed - ', finding.text,
                ' Proxmox refuses to start the VM with it too: %s.' % finding.refusal if finding.refusal else '',
                vmid, spec['path'], mid))


def node_entries(mapping: Optional[dict], node: str) -> list:
    """The parsed entries of a mapping (GET /cluster/mapping/pci item) for one node."""
    if not mapping:
        return []
    maps = mapping.get('map') or []
    if isinstance(maps, str):
        maps = [maps]
    return [e for e in (parse_map_entry(m) for m in maps) if e.get('node') == node]


def other_entries(mapping: Optional[dict], node: str) -> list:
    """The map strings of a mapping for the other nodes of the cluster, kept as they are."""
    maps = (mapping or {}).get('map') or []
    if isinstance(maps, str):
        maps = [maps]
    return [m for m in maps if parse_map_entry(m).get('node') != node]


def observed_spec(entries: list) -> Optional[dict]:
    """A node's entries as the desired `mappings` value reads: {'path', 'id', ...} without the node and the
    recorded facts (those are checked, not declared). Several entries (Proxmox then uses the first free one)
    read as their paths joined with ';', which never equals a declared address."""
    if not entries:
        return None
    if len(entries) > 1:
        return {'path': ';'.join(e.get('path', '') for e in entries), 'id': ';'.join(e.get('id', '') for e in entries)}
    return {k: v for k, v in entries[0].items() if k != 'node' and k not in RECORDED}


def desired_entry(node: str, spec: dict, dev: remote.PciDevice) -> dict:
    entry = {'node': node, 'path': spec['path'], 'id': spec['id']}
    entry.update({k: v for k, v in device_fingerprint(dev).items() if k != 'id' and v is not None})
    return entry


# ------------------------------------------------------------------- provider

class PciMappingProvider(ObservedProvider):
    """inputs: api, connection, node, vmid, mappings {id: {'path', 'id'}} (declared), checks {id: ''} (no
    finding), hostpci {id: 'hostpciN'}, guard {'gpus', 'numa'} (the container's), vm_numa.
    outputs: the same as observed, plus entries {id: the node's entry as Proxmox has it, or None} and written
    {id: the address this program last wrote or checked the entry for} (kept by a refresh, which records what
    it sees in `mappings`: how the next run tells the config's own move from an edit made outside)."""

    DESIRED = ('mappings', 'checks')
    CONNECTION = ('api', 'connection')
    INPUTS = {'node': S, 'vmid': I, 'mappings': mapof(obj('PciMappingSpec', path=S, id=S)), 'checks': mapof(S),
              'hostpci': mapof(S), 'guard': obj('GpuGuard', gpus=arr(S), numa=I), 'vm_numa': I,
              'fleet_host': optional(S)}
    OUTPUTS = {'entries': mapof(mapof(S)), 'written': mapof(S)}

    @staticmethod
    def label(props) -> str:
        return 'the PCI resource mappings of VM %s' % props['vmid']

    def listing(self, prox, props) -> dict:
        items = api_call('listing %s (GET /cluster/mapping/pci)' % self.label(props), prox.cluster.mapping.pci.get,
                         read=True)
        return {m.get('id'): m for m in items or []}

    def facts(self, props, by_id) -> remote.HostFacts:
        paths = {s['path'] for s in props['mappings'].values()}
        for mid in props['mappings']:
            paths.update(e['path'] for e in node_entries(by_id.get(mid), props['node'])
                         if remote_address(e.get('path')))
        return read_facts(remote.Target.from_inputs(props['connection']), pci=sorted(paths))

    def spec(self, props, mid) -> dict:
        return dict(props['mappings'][mid], hostpci=(props.get('hostpci') or {}).get(mid, 'hostpci'))

    def observe(self, props, by_id, facts, on_finding=None, on_edit=None) -> dict:
        mappings, checks, entries = {}, {}, {}
        for mid in sorted(props['mappings']):
            spec = self.spec(props, mid)
            mine = node_entries(by_id.get(mid), props['node'])
            mappings[mid] = observed_spec(mine)
            entries[mid] = mine[0] if len(mine) == 1 else None
            entry = mine[0] if len(mine) == 1 and mine[0].get('path') == spec['path'] else None
            finding = verify(mid, spec, entry, facts.pci.get(spec['path']), props['guard'], props['vm_numa'])
            checks[mid] = '' if finding is None else ('DANGER - ' if finding.danger else '') + finding.text
            if finding is not None and on_finding:
                on_finding(mid, spec, finding)
            edited = [e for e in mine if e.get('path') != spec['path']]
            if edited and on_edit:
                on_edit(mid, spec, edited, facts)
        return {'mappings': mappings, 'checks': checks, 'entries': entries}

    def edit_note(self, props, mid, spec, edited, facts) -> str:
        """An entry pointing elsewhere than declared: where, and whether that is a container GPU."""
        out = []
        for e in edited:
            p = e.get('path', '')
            dev = facts.pci.get(p)
            danger = p in (props['guard'].get('gpus') or []) or (dev is not None and (
                not dev.is_gpu or (dev.numa == props['guard'].get('numa') and dev.numa != props['vm_numa'])))
            out.append('%s%s (%s%s)' % ('DANGER - ' if danger else '', p, describe(dev) if remote_address(p) else p,
                                        ', a container GPU' if p in (props['guard'].get('gpus') or []) else ''))
        return 'mapping %s: its entry for node %s points at %s, set outside Pulumi; declared: %s' % (
            mid, props['node'], '; '.join(out), spec['path'])

    def apply(self, props, olds=None) -> dict:
        with client(props['api']) as prox:
            by_id = self.listing(prox, props)
            facts = self.facts(props, by_id)
            stops, writes, notes = [], [], []

            def stop(mid, spec, finding):
                stops.append(stop_message(mid, spec, finding, props['vmid']))

            def edit(mid, spec, edited, f):
                # An entry at the address the last run wrote is this program's own: the config moved the GPU.
                if [e.get('path') for e in edited] != [last_written(olds, mid)]:
                    notes.append('repaired ' + self.edit_note(props, mid, spec, edited, f))
            observed = self.observe(props, by_id, facts, on_finding=stop, on_edit=edit)
            if stops:
                raise MappingError('%s:\n  - %s' % (self.label(props), '\n  - '.join(stops)))
            for mid in sorted(props['mappings']):
                spec = props['mappings'][mid]
                want = desired_entry(props['node'], spec, facts.pci[spec['path']])
                cfg = by_id.get(mid)
                if cfg is None:
                    writes.append(('POST', mid, [map_entry(want)], None))
                    if mid in declared_before(olds):
                        notes.append('recreated mapping %s for %s (deleted outside Pulumi)' % (mid, spec['path']))
                elif node_entries(cfg, props['node']) != [want]:
                    writes.append(('PUT', mid, other_entries(cfg, props['node']) + [map_entry(want)], cfg))
            for method, mid, maps, seen in writes:
                what = '%s the PCI resource mapping %s for VM %s' % (
                    'creating' if method == 'POST' else 'updating', mid, props['vmid'])
                if method == 'POST':
                    api_call(what, prox.cluster.mapping.pci.post, id=mid, map=maps)
                    continue
                self.put(prox, props, mid, maps, seen, what)
            for mid in sorted(declared_before(olds) - set(props['mappings'])):
                if mid in by_id:
                    note = self.remove(prox, props, mid, by_id[mid], 'no longer declared')
                    if note:
                        notes.append(note)
            for note in notes:
                warn('VM %s: %s' % (props['vmid'], note))
            if writes:
                by_id = self.listing(prox, props)
                observed = self.observe(props, by_id, facts)
        written = {mid: spec['path'] for mid, spec in props['mappings'].items()}
        return dict(props, written=written, **observed)

    def put(self, prox, props, mid, maps, seen, what):
        # The digest is pci.cfg's, the whole file's: each write changes it, so it is read again right before
        # this one, and the mapping must still be what the decision was made from.
        now = api_call('reading the PCI resource mapping %s' % mid, prox.cluster.mapping.pci(mid).get, read=True)
        if (now or {}).get('map') != seen.get('map'):
            raise MappingError('%s: the mapping %s changed while this run was deciding what to write (%s); '
                               'nothing was written to it - re-run' % (self.label(props), mid, (now or {}).get('map')))
        params = {'map': maps}
        if now.get('digest'):
            params['digest'] = now['digest']
        api_call(what, prox.cluster.mapping.pci(mid).put, **params)

    def remove(self, prox, props, mid, cfg, why) -> str:
        """Take this node's entries out of mapping mid (as listed: cfg); the mapping itself goes only when no
        other node's entry is left - a mapping is cluster-wide, and the other nodes' guests may use it. Returns
        a note for the operator when the mapping stays."""
        others = other_entries(cfg, props['node'])
        if not others:
            api_call('deleting the PCI resource mapping %s (%s)' % (mid, why), prox.cluster.mapping.pci(mid).delete)
            return ''
        nodes = sorted({parse_map_entry(m).get('node') or '?' for m in others})
        if not node_entries(cfg, props['node']):
            return 'mapping %s has no entry for node %s (only for %s): left as it is' % (
                mid, props['node'], ', '.join(nodes))
        self.put(prox, props, mid, others, cfg, 'removing the entries of node %s from the PCI resource mapping %s '
                 '(%s)' % (props['node'], mid, why))
        return 'mapping %s: removed the entry for node %s; the mapping stays with the entries of %s' % (
            mid, props['node'], ', '.join(nodes))

    def create(self, props):
        return CreateResult('pci-mappings-%s' % props['vmid'], self.apply(props))

    def update(self, _id, olds, news):
        return UpdateResult(self.apply(news, olds))

    def check(self, olds, news):
        if olds.get(IMPORTED):
            # `pulumi import` / import_: olds are the mappings as read_by_id() found them.
            self.check_import(olds, news)
        return CheckResult({k: v for k, v in news.items() if k != IMPORTED}, [])

    def diff(self, id_, olds, news):
        if olds.get(IMPORTED):
            # Until its first update or refresh an import is compared on what it found - the mappings and their
            # entries for this node; check_import() verified the device at each declared address, as `up` does.
            changed = not self.same('mappings', olds.get('mappings'), news.get('mappings'))
            return DiffResult(changes=changed, replaces=[])
        return super().diff(id_, olds, news)

    def read_by_id(self, id_, props):
        """`pulumi import gpuhost:index:PciMappings <name> pci-mappings-<vmid>` (or the import_ option): the engine's
        Read carries the id alone. The VM is found in the cluster by its vmid; its mappings are the ones its
        hostpciN entries name (`mapping=<id>`), read with their entries for the VM's node; marked IMPORTED until
        the first update."""
        vmid = str(id_)
        if vmid.startswith('pci-mappings-'):
            vmid = vmid[len('pci-mappings-'):]
        if not vmid.isdigit():
            raise MappingError('import of the PCI resource mappings of a VM: the id is pci-mappings-<vmid> (e.g. '
                               'pci-mappings-300), not %r' % str(id_))
        with client(props['api']) as prox:
            listed = api_call('listing the guests', prox.cluster.resources.get, type='vm', read=True)
            found = [g for g in listed or [] if str(g.get('vmid')) == vmid and g.get('type') == 'qemu']
            if not found:
                return self.read_result(None, {})
            node = found[0]['node']
            where = dict(props, node=node, vmid=int(vmid))
            config = api_call('reading VM %s' % vmid, prox.nodes(node).qemu(vmid).config.get, read=True) or {}
            hostpci = {}
            for key in sorted(config, key=lambda k: (len(k), k)):
                if key.startswith('hostpci') and key[len('hostpci'):].isdigit():
                    mid = split_props(str(config[key]))[1].get('mapping')
                    if mid:
                        hostpci[mid] = key
            by_id = self.listing(prox, where)
        mappings, entries = {}, {}
        for mid in sorted(hostpci):
            mine = node_entries(by_id.get(mid), node)
            mappings[mid] = observed_spec(mine)
            entries[mid] = mine[0] if len(mine) == 1 else None
        outs = dict(where, mappings=mappings, hostpci=hostpci, entries=entries,
                    written={mid: spec['path'] for mid, spec in mappings.items() if spec}, **{IMPORTED: True})
        return self.read_result('pci-mappings-%s' % vmid, outs)

    def check_import(self, found, news):
        """Taken over only if they are the mappings the config describes - the same VM and node, the same mapping
        ids on the same hostpciN - and the device at each declared address is still the VM's GPU (the checks `up`
        makes before it starts the VM). Else one line. An entry pointing elsewhere than declared is taken over and
        rewritten by the next `up`, as the config moving a GPU is. `pulumi import` from the command line has no
        program (news is what was read): the Proxmox side alone is checked then; the first `up` checks the rest."""
        wrong = []
        if str(found.get('vmid')) != str(news['vmid']) or found.get('node') != news['node']:
            wrong.append('they are VM %s\'s on %s, the config declares VM %s on %s (gpuhost:vm.vmid, '
                         'gpuhost:host.node)' % (found.get('vmid'), found.get('node'), news['vmid'], news['node']))
        have, want = found.get('mappings') or {}, news.get('mappings') or {}
        if not wrong and sorted(have) != sorted(want):
            wrong.append('the VM names the mappings %s, the config declares %s' % (
                ', '.join(sorted(have)) or 'none', ', '.join(sorted(want)) or 'none'))
        if not wrong:
            for mid in sorted(want):
                if (found.get('hostpci') or {}).get(mid) != (news.get('hostpci') or {}).get(mid):
                    wrong.append('the VM uses mapping %s as %s, the config as %s' % (
                        mid, (found.get('hostpci') or {}).get(mid), (news.get('hostpci') or {}).get(mid)))
        if not wrong and 'guard' in news:
            with client(news['api']) as prox:
                by_id = self.listing(prox, news)
            facts = read_facts(remote.Target.from_inputs(news['connection']), pci=sorted(
                s['path'] for s in want.values()))
            for mid in sorted(want):
                spec = self.spec(news, mid)
                mine = node_entries(by_id.get(mid), news['node'])
                entry = mine[0] if len(mine) == 1 and mine[0].get('path') == spec['path'] else None
                finding = verify(mid, spec, entry, facts.pci.get(spec['path']), news['guard'], news['vm_numa'])
                if finding is not None:
                    wrong.append(('DANGER - ' if finding.danger else '') + finding.text)
        if wrong:
            raise MappingError('%s: not imported - %s. Nothing was changed; check the id given to `pulumi import` '
                               '(or the import_ option) against gpuhost:vm.vmid and gpuhost:vm.gpus.' % (
                                   self.label(news), '; '.join(wrong)))

    def read(self, id_, props):
        if 'mappings' not in props:
            return self.read_by_id(id_, props)
        props = {k: v for k, v in props.items() if k != IMPORTED}   # a refresh makes an import the program's

        def finding(mid, spec, f):
            warn('VM %s: %s%s. `pulumi up` will stop before starting the VM%s.' % (
                props['vmid'], 'DANGER - ' if f.danger else 'the PCI bus changed - ', f.text,
                ' (Proxmox refuses to start it too: %s)' % f.refusal if f.refusal else ''))

        def edited(mid, spec, entries, facts):
            warn('VM %s: %s. `pulumi up` puts back the declared entry.' % (
                props['vmid'], self.edit_note(props, mid, spec, entries, facts)))
        with client(props['api']) as prox:
            by_id = self.listing(prox, props)
            facts = self.facts(props, by_id)
            observed = self.observe(props, by_id, facts, on_finding=finding, on_edit=edited)
        return self.read_result(id_, dict(props, **observed))

    def delete(self, _id, props):
        with client(props['api']) as prox:
            by_id = self.listing(prox, props)
            for mid in sorted(props.get('mappings') or {}):
                if mid in by_id:
                    note = self.remove(prox, props, mid, by_id[mid], 'the VM no longer uses it')
                    if note:
                        warn('VM %s: %s' % (props['vmid'], note))


def last_written(olds, mid) -> Optional[str]:
    """The address the last run wrote (or found right) mapping mid's entry for. A state from before `written`
    existed has only `mappings`, which a refresh overwrites with what it saw."""
    olds = olds or {}
    if mid in (olds.get('written') or {}):
        return olds['written'][mid]
    return (((olds.get('mappings') or {}).get(mid)) or {}).get('path')


def declared_before(olds) -> set:
    """The mapping ids the last run declared. Not from olds' `mappings` alone: the engine hands a
    provider its old state without the keys whose value is None, and a mapping a refresh found deleted is
    exactly that; `hostpci` and `checks` (strings) keep every declared id."""
    olds = olds or {}
    return (set(olds.get('mappings') or {}) | set(olds.get('hostpci') or {}) | set(olds.get('checks') or {})
            | set(olds.get('written') or {}))


def remote_address(path) -> bool:
    """A single PCI address host_facts.sh can describe (an entry may hold 'a;b' alternatives or a short form)."""
    return isinstance(path, str) and bool(BDF_RE.match(path))


# --------------------------------------------------------------------- preflight

def preflight_problems(d, api: dict, facts: remote.HostFacts) -> list:
    """At every `up`, before any step: each declared mapping that exists is checked against the device now
    at its address (facts.pci must describe the VM's GPU addresses). A mapping not made yet, or pointing
    elsewhere (an out-of-band edit `up` repairs), is checked against the address alone."""
    vm = d.vm
    props = {'vmid': vm.vmid, 'node': d.host.node}
    with client(api) as prox:
        by_id = PciMappingProvider().listing(prox, props)
    inventory = {g.address: g.id for g in d.host.gpus}
    out = []
    for i, (mid, path) in enumerate(zip(vm.mapping_ids(), vm.gpus)):
        spec = {'path': path, 'id': inventory.get(path), 'hostpci': 'hostpci%d' % i}
        mine = node_entries(by_id.get(mid), d.host.node)
        entry = mine[0] if len(mine) == 1 and mine[0].get('path') == path else None
        finding = verify(mid, spec, entry, facts.pci.get(path), {'gpus': list(d.container.gpus),
                                                                 'numa': d.container.numa}, vm.numa)
        if finding is not None:
            out.append(stop_message(mid, spec, finding, vm.vmid))
    return out


class PciMappings(GpuhostResource, name='PciMappings'):
    """The VM's GPUs as Proxmox PCI resource mappings (PciMappingProvider)."""

