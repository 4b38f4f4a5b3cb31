"""Proxmox guests (LXC containers and QEMU VMs) through the API with proxmoxer, as a custom resource
with a real read(): `pulumi refresh` sees out-of-band config changes, and `up` sends only the keys
that differ (with the config digest, so a concurrent edit fails instead of being overwritten).

Comparison is field by field after normalising Proxmox's answers (numbers as text, booleans as
0/1, comma lists compared on the sub-keys the config sets, so a hwaddr or type=veth Proxmox adds
is not a difference). Keys Proxmox cannot change in place (`create`: ostemplate, storage, rootfs,
unprivileged, ...) replace the guest, and preview says so. Keys of a running guest that wait for a
restart (QEMU hostpciN, ...) are reported in `pending` and treated as applied.

Raw `lxc.*` lines (CPU pinning) cannot be set through the API: they are written into
/etc/pve/lxc/<vmid>.conf over SSH (compare-and-swap on the file's hash, atomic replace), and the
container is rebooted through the API when they change while it runs.

Adoption (gpuhost:container.adopt / gpuhost:vm.adopt): a guest that already runs with the config's vmid
is taken into the stack by create() instead of being made - read, refused if it is not the declared guest
(absent, another name) or differs in what only a new guest could change, then brought to the declared
state by update(). check() says at preview what that means - adoption is the one case in which a preview
reads the host, and only for what the stack does not hold yet. (Adoption predates the plugin: Pulumi's `import`
could not serve a dynamic provider, whose Read on import carries no properties to load it from. The plugin reads by
id: `pulumi import` and the import_ option take a guest over too, check_import() deciding.)
"""

from __future__ import annotations

import re
import time
import uuid

from transport import remote
from resources.resource import CheckResult, CreateResult, UpdateResult
from resources.state import GpuhostResource, ObservedProvider
from transport.operator import OperatorError, info, warn
from grammar.pve import parse_map_entry, parse_raw, same_value, scalar, split_props, with_raw
from resources.fields import ANY, B, I, S, arr, mapof, obj, optional
from transport.proxmox import PveError, api_call, client, wait_task   # noqa: F401 - PveError: the guests' error too


# ---------------------------------------------------------------- normalising

def observed_config(desired: dict, actual: dict) -> dict:
    """The managed keys as the host has them: the desired value where Proxmox's satisfies it (so an
    unchanged guest shows no diff), else Proxmox's own value (None when absent)."""
    return {k: (v if same_value(k, v, actual.get(k)) else actual.get(k)) for k, v in desired.items()}


def changes(desired: dict, actual: dict, previously_managed) -> tuple:
    """(values to set, keys to delete): the smallest PUT that makes the guest match."""
    to_set = {k: scalar(v) for k, v in desired.items() if not same_value(k, v, actual.get(k))}
    to_delete = sorted(k for k in previously_managed if k not in desired and actual.get(k) is not None)
    return to_set, to_delete


MOUNT_RE = re.compile(r'^mp\d+$')


def mounts_of(actual: dict) -> dict:
    """The container's mount points (mpN) as Proxmox has them: what a declared mount point must not replace."""
    return {k: v for k, v in actual.items() if MOUNT_RE.match(k) and v is not None}


def mount_collisions(desired: dict, mounts: dict, owned) -> list:
    """(key, theirs, ours) for each declared mount point the container already has with another value, which
    the program did not set (owned: the config keys it managed before). Overwriting one swaps a dataset out
    from under whatever uses it: never done, only refused."""
    owned = set(owned or ())
    return [(k, mounts[k], v) for k, v in sorted(desired.items())
            if MOUNT_RE.match(k) and k not in owned and mounts.get(k) is not None and not same_value(k, v, mounts[k])]


def collision_text(vmid, collisions) -> str:
    return '; '.join(
        'gpuhost:model.mp: %s would replace the container\'s own %s (%s), a mount point this program did not set, '
        'with the model\'s (%s). It is left as it is: set gpuhost:model.mp to an index `pct config %s` does not '
        'list, or - if %s is really to go - remove it yourself first (pct set %s --delete %s) and re-run' % (
            k[2:], k, theirs, ours, vmid, k, vmid, k) for k, theirs, ours in collisions)


def merge_pending(items: list) -> tuple:
    """GET .../pending -> (effective config incl. pending values, keys waiting for a restart)."""
    config, pending = {}, []
    for item in items:
        key = item['key']
        if item.get('delete'):
            pending.append(key)
            continue
        if 'pending' in item:
            config[key] = item['pending']
            pending.append(key)
        elif 'value' in item:
            config[key] = item['value']
    return config, sorted(pending)


# --------------------------------------------------------------------- adoption

# Template file name -> the ostype Proxmox records for a container made from it (PVE detects it from the
# unpacked system; the file name says the same for the templates `pveam` offers).
OSTYPES = ('debian', 'ubuntu', 'devuan', 'alpine', 'archlinux', 'centos', 'fedora', 'opensuse', 'gentoo', 'nixos')
SIZE_UNITS = {'K': 1.0 / (1024 * 1024), 'M': 1.0 / 1024, 'G': 1.0, 'T': 1024.0}


def template_ostype(template: str):
    name = str(template).rsplit('/', 1)[-1].lower()
    return next((o for o in OSTYPES if name.startswith(o)), None)


def size_gb(text):
    """'8G', '200G', '512M', '1T' -> GB (float); None if unreadable."""
    text = str(text or '').strip().upper()
    if not text:
        return None
    unit = text[-1] if text[-1] in SIZE_UNITS else 'G'
    try:
        return float(text.rstrip('KMGT')) * SIZE_UNITS[unit]
    except ValueError:
        return None


def refusals(props: dict, actual: dict) -> list:
    """What keeps a running guest from being adopted as the config declares it: its identity (the name
    differs - a vmid typo must not take over another guest) and the keys Proxmox cannot change in place
    (an adoption never replaces). One sentence each, with the config key to set."""
    out = []
    lxc = props['kind'] == 'lxc'
    side = 'container' if lxc else 'vm'
    name_key = 'hostname' if lxc else 'name'
    want_name, have_name = props['config'].get(name_key), actual.get(name_key)
    if want_name is not None and have_name != want_name:
        out.append('its %s is %s, the config declares %s (gpuhost:%s.%s) - is gpuhost:%s.vmid the right guest? If it '
                   'is, rename it first (%s set %s --%s %s)' % (
                       name_key, have_name or '(none)', want_name, side, name_key, side, 'pct' if lxc else 'qm',
                       props['vmid'], name_key, want_name))
    if not lxc:
        return out
    create = props.get('create') or {}
    seen = observed_create(create, actual)
    if seen.get('unprivileged') != create.get('unprivileged'):
        out.append('it is %s, the config declares %s (gpuhost:container.unprivileged: %s)' % (
            'unprivileged' if seen['unprivileged'] else 'privileged',
            'unprivileged' if int(create['unprivileged']) else 'privileged',
            'true' if seen['unprivileged'] else 'false'))
    if seen.get('rootfs') != create.get('rootfs'):
        have_storage, _, have_gb = seen['rootfs'].partition(':')
        want_storage, _, want_gb = create['rootfs'].partition(':')
        if have_storage != want_storage:
            out.append('its root disk is on storage %s, the config declares %s (gpuhost:container.storage: %s)' % (
                have_storage, want_storage, have_storage))
        if abs(float(have_gb) - float(want_gb)) > 1e-9:
            gb = float(have_gb)
            out.append('its root disk is %s GB, the config declares %s GB (gpuhost:container.rootfs_gb: %s)' % (
                have_gb, want_gb, ('%d' % gb) if gb.is_integer() else 'its size in GB'))
    # Adopting takes no key as the program's own: a declared mount point the container has with another value
    # would be replaced.
    collisions = mount_collisions(props.get('config') or {}, mounts_of(actual), ())
    if collisions:
        out.append(collision_text(props['vmid'], collisions))
    if seen.get('ostemplate') != create.get('ostemplate'):
        out.append('it runs %s, gpuhost:container.ostemplate is a %s template (use the template it was made from)' % (
            actual.get('ostype'), template_ostype(create['ostemplate'])))
    return out


# What read_by_id() marks an imported guest's state with: its config holds every key the guest had, which the
# program has not declared (as_declared); gone with the first update.
IMPORTED = 'imported'
# Proxmox's own bookkeeping in a guest's config, never the program's.
UNMANAGED_KEYS = ('digest', 'lock')
GPU_KEY_RE = re.compile(r'^(dev|hostpci)\d+$')


def is_gpu_entry(value) -> bool:
    """A devN or hostpciN value that gives a guest a GPU: /dev/nvidiaN (not the control nodes), or a PCI
    device or resource mapping."""
    first, sub = split_props(str(value or ''))
    path = first or sub.get('path') or ''
    return bool(re.match(r'^/dev/nvidia\d+$', path) or sub.get('mapping') or re.match(
        r'^([0-9a-f]{4}:)?[0-9a-f]{2}:[0-9a-f]{2}(\.[0-7])?$', path, re.I))


def observed_create(create: dict, actual: dict) -> dict:
    """A container's create-only inputs as its config shows them: the declared value where the guest agrees or
    cannot tell (Proxmox keeps no template name), the guest's own where it differs - unprivileged, the root
    disk's storage and size, the template's distribution. refusals() words what differs."""
    seen = dict(create or {})
    if 'unprivileged' in seen and int(actual.get('unprivileged') or 0) != int(seen['unprivileged']):
        seen['unprivileged'] = int(actual.get('unprivileged') or 0)
    if seen.get('rootfs'):
        first, sub = split_props(actual.get('rootfs') or '')
        have_storage = (first or sub.get('volume') or '').split(':', 1)[0]
        have_gb = size_gb(sub.get('size'))
        want_storage, _, want_gb = seen['rootfs'].partition(':')
        if (have_storage and have_storage != want_storage) or (
                have_gb is not None and abs(have_gb - float(want_gb)) > 1e-9):
            seen['rootfs'] = '%s:%g' % (have_storage or want_storage, float(want_gb) if have_gb is None else have_gb)
    want_os, have_os = template_ostype(seen.get('ostemplate', '')), actual.get('ostype')
    if want_os and have_os in OSTYPES and have_os != want_os:
        seen['ostemplate'] = '(a %s template)' % have_os
    return seen


def as_declared(olds: dict, news: dict) -> dict:
    """An imported guest's observed state seen as the program's: only the keys the config declares are compared
    and owned (the others are the guest's own and stay), and its create-only keys as its config shows them
    (a later change of one is a replacement, refused while the guest is protected). Any other state unchanged.
    It holds for as long as the state is the import's: a no-op `up` does not write a resource's outputs."""
    if not olds.get(IMPORTED):
        return olds
    config = olds.get('config') or {}
    raw = olds.get('raw_lxc') or {}
    create = observed_create(news.get('create'), config) if news.get('kind') == 'lxc' else news.get('create')
    return dict(olds, config={k: config.get(k) for k in news.get('config') or {}},
                raw_lxc={k: raw.get(k) for k in news.get('raw_lxc') or {}}, create=create)


def show(value) -> str:
    return '(unset)' if value is None else str(value)


# --------------------------------------------------------------------- provider

# What every guest declares (a container's own inputs: resources/container.py). config: the Proxmox config keys
# the program manages (strings and integers, as the API takes them); create: the create-only ones (a container's
# template, root disk and unprivileged).
GUEST_INPUTS = {'node': S, 'kind': S, 'vmid': I,
                'create': obj('GuestCreate', ostemplate=optional(S), rootfs=optional(S), unprivileged=optional(I)),
                'config': mapof(ANY), 'start': B, 'raw_lxc': mapof(S), 'protect': B, 'adopt': B,
                'fleet_host': optional(S)}


class PveGuestProvider(ObservedProvider):
    """inputs: api, connection (LXC: for raw lines), node, kind (lxc|qemu), vmid, create, config, start,
    raw_lxc. outputs: the same as observed, plus status, pending, uid (new on every creation)."""

    DESIRED = ('node', 'kind', 'vmid', 'create', 'config', 'start', 'raw_lxc')
    REPLACE = ('node', 'kind', 'vmid', 'create')
    CONNECTION = ('api', 'connection')
    # mounts: every mpN the container has (the program's and others'), so that a preview from the state can
    # tell a declared mount point that would replace one the program did not set.
    OUTPUTS = {'status': S, 'pending': arr(S), 'uid': S, 'pid': I, 'mounts': mapof(S)}
    # A VM's own (components/vm.py): the container's GPUs it must never get, and how its GPUs are passed.
    INPUTS = dict(GUEST_INPUTS, guard_gpus=arr(S), gpu_binding=S)

    # What each create-only input is called in the stack config, for the refusal below.
    REPLACE_KEYS = {'node': 'gpuhost:host.node', 'vmid': 'gpuhost:{side}.vmid', 'kind': 'gpuhost:{side}',
                    'ostemplate': 'gpuhost:container.ostemplate', 'rootfs': 'gpuhost:container.storage/rootfs_gb',
                    'unprivileged': 'gpuhost:container.unprivileged'}

    def diff(self, id_, olds, news):
        olds = as_declared(olds, news)
        result = super().diff(id_, olds, news)
        # (A replacement makes a new guest, which has no mount point of its own; protect guards that case.)
        collisions = [] if result.replaces else mount_collisions(news.get('config') or {}, olds.get('mounts') or {},
                                                                 olds.get('config') or {})
        if collisions:
            raise OperatorError('%s: %s.' % (self.label(news), collision_text(news.get('vmid'), collisions)))
        if result.replaces:
            # The vmid is fixed by config: a replacement with the same vmid must free it first. With a
            # new vmid the new guest is created first, so a taken vmid fails before anything is lost.
            result.delete_before_replace = olds.get('vmid') == news.get('vmid')
        if result.replaces and news.get('protect', True):
            side = 'container' if olds.get('kind', news.get('kind')) == 'lxc' else 'vm'
            what = []
            for k in result.replaces:
                if k == 'create':
                    old, new = olds.get('create') or {}, news.get('create') or {}
                    what += [(self.REPLACE_KEYS.get(c, c), old.get(c), new.get(c)) for c in sorted(set(old) | set(new))
                             if old.get(c) != new.get(c)]
                else:
                    what.append((self.REPLACE_KEYS.get(k, k).format(side=side), olds.get(k), news.get(k)))
            raise OperatorError(
                '%s: changing %s would destroy %s %s on %s and create a new one - its disk and everything on it '
                'is lost (Proxmox cannot change this in place). The %s is protected. If that is really wanted, set '
                'gpuhost:%s.protect: false for one `pulumi up`; otherwise put the old value back.' % (
                    ', '.join(k for k, _, _ in what),
                    '; '.join('%s from %s to %s' % (k, o, n) for k, o, n in what),
                    'container' if side == 'container' else 'VM', olds.get('vmid'), olds.get('node'), side, side))
        return result

    def guest(self, prox, props):
        return getattr(prox.nodes(props['node']), props['kind'])(props['vmid'])

    def label(self, props):
        return '%s %s on %s' % ('container' if props['kind'] == 'lxc' else 'VM', props['vmid'], props['node'])

    def conf_path(self, props):
        return '/etc/pve/%s/%s.conf' % ('lxc' if props['kind'] == 'lxc' else 'qemu-server', props['vmid'])

    def foreign_gpus(self, actual, props, mapped=None) -> list:
        """(key, value) of hostpci entries that point at a GPU this VM must never get (the container's),
        by address or through a resource mapping whose entry for the node has that address (mapped: {id:
        [paths]}): a VM started with them takes a container GPU away from it."""
        guard = set(props.get('guard_gpus') or [])
        out = []
        for key, value in sorted(actual.items()):
            if key.rstrip('0123456789') == 'hostpci':
                first, sub = split_props(value)
                devices = (first or sub.get('host') or '').split(';')
                via = [p for path in (mapped or {}).get(sub['mapping'], []) for p in path.split(';')] \
                    if sub.get('mapping') else []
                if any(d in guard or '0000:' + d in guard for d in devices + via if d):
                    # Through a mapping, the address is in the mapping's entry, not in the VM's config: say so.
                    out.append((key, value + (' (its mapping\'s entry for %s: %s)' % (props['node'], ';'.join(via))
                                              if via else '')))
        return out

    def mapped_paths(self, prox, actual, props) -> dict:
        """{mapping id: [its paths on this node]} for the hostpci entries that name a mapping ({} if none)."""
        if props['kind'] != 'qemu' or not any(split_props(v)[1].get('mapping') for k, v in actual.items()
                                              if k.rstrip('0123456789') == 'hostpci'):
            return {}
        items = api_call('listing the PCI resource mappings', prox.cluster.mapping.pci.get, read=True)
        out = {}
        for m in items or []:
            maps = m.get('map') or []
            for text in [maps] if isinstance(maps, str) else maps:
                entry = parse_map_entry(text)
                if entry.get('node') == props['node'] and entry.get('path'):
                    out.setdefault(m.get('id'), []).append(entry['path'])
        return out

    def observe(self, prox, props, on_foreign=None):
        g = self.guest(prox, props)
        label = self.label(props)
        items = api_call('reading %s' % label, g.pending.get, read=True)
        actual, pending = merge_pending(items)
        foreign = self.foreign_gpus(actual, props, self.mapped_paths(prox, actual, props)) if on_foreign else []
        if foreign and on_foreign:
            on_foreign(foreign)
        current = api_call('reading %s' % label, g.status.current.get, read=True)
        status = current['status']
        create = dict(props['create'])
        if 'unprivileged' in create:
            create['unprivileged'] = int(actual.get('unprivileged', 0))
        out = {'config': observed_config(props['config'], actual), 'create': create,
               'start': status == 'running', 'status': status, 'pending': pending,
               'pid': int(current['pid']) if current.get('pid') and status == 'running' else None,
               'raw_lxc': self.observe_raw(props), 'mounts': mounts_of(actual)}
        return out

    # -- raw lxc.* lines (over SSH: only the file can hold them)

    def read_conf(self, props, wait=5.0):
        """The guest's config file on the host. Right after a create it can take a moment to show up
        in /etc/pve (the cluster file system), so a missing file is retried briefly."""
        target = remote.Target.from_inputs(props['connection'])
        deadline = time.time() + wait
        while True:
            res = remote.run(target, 'read_file.sh', [self.conf_path(props)], check=False)
            if res.exit_code == 0:
                return target, res.stdout
            if res.exit_code != 4 or time.time() > deadline:
                raise pve_error_from(res, target, self.conf_path(props))
            time.sleep(0.3)

    def observe_raw(self, props):
        want = props.get('raw_lxc') or {}
        if props['kind'] != 'lxc' or not want:
            return {}
        have = parse_raw(self.read_conf(props)[1])
        return {k: have.get(k) for k in want}

    def write_raw(self, props) -> bool:
        want = props.get('raw_lxc') or {}
        target, text = self.read_conf(props)
        new = with_raw(text, want)
        if new == text:
            return False
        return remote.put_file(target, self.conf_path(props), new, '0640', remote.sha256_hex(text))

    # -- lifecycle

    def power(self, prox, props, action):
        g = self.guest(prox, props)
        upid = api_call('%s %s' % (action, self.label(props)), getattr(g.status, action).post)
        wait_task(prox, props['node'], upid, '%s %s' % (action, self.label(props)))

    # -- adoption (gpuhost:<side>.adopt): a guest that already runs, taken into the stack as it is

    def check(self, olds, news):
        """At preview and up, for a guest the stack does not hold yet with adopt set: read it and say what
        adopting it means - or refuse, before anything runs; create() does the adoption. (Before the plugin,
        Pulumi's own `import` could not do this for a dynamic provider: its Read on import carries no
        properties, so the provider host could not even load this class: pulumi/pulumi#16175.)"""
        if olds.get(IMPORTED):
            # `pulumi import` / import_: olds are the guest as read() found it by its id. Taken over only if it is
            # the guest the config describes.
            self.check_import(olds, news)
            return CheckResult(dict(news, adopt=False), [])
        if olds:
            # Adoption is for a guest the stack does not hold yet. One it holds is never adopted again: a
            # replacement (protect: false) creates a new guest - and never takes over another guest at a new vmid.
            return CheckResult(dict(news, adopt=False), [])
        if news.get('adopt') and isinstance(news.get('api'), dict):
            with client(news['api']) as prox:
                plan = self.adoption(prox, news)
            info('%s: exists - adopted into the stack as it is, not created (gpuhost:%s.adopt). %s' % (
                self.label(news), 'container' if news['kind'] == 'lxc' else 'vm',
                '`up` changes: %s%s.' % ('; '.join(plan['changes']), plan['power']) if plan['changes'] else
                'It matches the declared state%s.' % (plan['power'] or ': `up` changes nothing on it')))
        return CheckResult(news, [])

    def adoption(self, prox, props) -> dict:
        """{'observed': the guest as observe() reads it, 'changes': ['key have -> want', ...] that `up` makes,
        'power': what it does to the guest's power state, as words}. Raises PveError when the guest cannot be
        adopted: absent, another guest's name, or a difference only a new guest could make."""
        side = 'container' if props['kind'] == 'lxc' else 'vm'
        g = self.guest(prox, props)
        try:
            actual, _ = merge_pending(api_call('reading %s' % self.label(props), g.pending.get, read=True))
        except PveError as e:
            if not gone(e):
                raise
            raise PveError('gpuhost:%s.adopt: there is no %s %s on %s to adopt; check gpuhost:%s.vmid and '
                           'gpuhost:host.node, or remove adopt to create it' % (
                               side, 'container' if side == 'container' else 'VM', props['vmid'], props['node'],
                               side)) from None
        refused = refusals(props, actual)
        if refused:
            raise PveError('%s: not adopted - %s. Nothing was changed; adopting never replaces a guest.' % (
                self.label(props), '; '.join(refused)))
        observed = self.observe(prox, props)
        to_set, _ = changes(props['config'], actual, ())
        what = ['%s %s -> %s' % (k, show(actual.get(k)), v) for k, v in sorted(to_set.items())]
        raw = {k: v for k, v in (props.get('raw_lxc') or {}).items() if observed['raw_lxc'].get(k) != v}
        what += ['%s %s -> %s' % (k, show(observed['raw_lxc'].get(k)), v) for k, v in sorted(raw.items())]
        running = observed['status'] == 'running'
        power = ''
        if props['start'] and not running:
            power = ', then starts it'
        elif not props['start'] and running:
            power = ', then stops it'
        elif raw and running:
            power = ', then reboots it (raw lxc.* lines take effect only at start)'
        return {'observed': observed, 'changes': what, 'power': power}

    def create(self, props):
        if props.get('adopt'):
            return self.adopt(props)
        return self.make(props)

    def adopt(self, props):
        """The guest exists: checked again (the host may have changed since the preview), then brought to the
        declared state by the same path as any update - never recreated."""
        with client(props['api']) as prox:
            plan = self.adoption(prox, props)
        result = self.update(str(props['vmid']), {'pid': plan['observed'].get('pid'), 'config': {}}, props)
        info('%s: adopted into the stack%s%s' % (
            self.label(props), '; changed %s' % '; '.join(plan['changes']) if plan['changes'] else ', unchanged',
            plan['power'].replace('then starts', 'started').replace('then stops', 'stopped')
            .replace('then reboots', 'rebooted')))
        return CreateResult(str(props['vmid']), result.outs)

    def make(self, props):
        with client(props['api']) as prox:
            node = prox.nodes(props['node'])
            coll = getattr(node, props['kind'])
            params = dict(props['create'])
            params.update({k: scalar(v) for k, v in props['config'].items()})
            params['vmid'] = props['vmid']
            if props['kind'] == 'lxc':
                params['unprivileged'] = scalar(params.get('unprivileged', 1))
            upid = api_call('creating %s' % self.label(props), coll.post, **params)
            wait_task(prox, props['node'], upid, 'creating %s' % self.label(props))
            if props.get('raw_lxc'):
                self.write_raw(props)
            if props['start']:
                self.power(prox, props, 'start')
            outs = dict(props, **self.observe(prox, props))
        outs['uid'] = uuid.uuid4().hex
        return CreateResult(str(props['vmid']), outs)

    def update(self, _id, olds, news):
        with client(news['api']) as prox:
            g = self.guest(prox, news)
            cfg = api_call('reading %s' % self.label(news), g.config.get, read=True)
            actual, _ = merge_pending(api_call('reading %s' % self.label(news), g.pending.get, read=True))
            olds = as_declared(olds, news)
            owned = {} if olds.get(IMPORTED) else (olds.get('config') or {})
            to_set, to_delete = changes(news['config'], actual, owned.keys())
            # Read right before the write: a mount point set since the last refresh is never overwritten either.
            collisions = mount_collisions(to_set, mounts_of(actual), owned)
            if collisions:
                raise PveError('%s: %s. Nothing was changed.' % (self.label(news), collision_text(news['vmid'],
                                                                                                  collisions)))
            foreign = self.foreign_gpus(actual, news, self.mapped_paths(prox, actual, news))
            if foreign:
                warn('%s: repaired %s in %s - pointed at the container\'s GPU, set outside Pulumi; now %s' % (
                    self.label(news), ', '.join('%s: %s' % kv for kv in foreign), self.conf_path(news),
                    ', '.join('%s: %s' % (k, news['config'].get(k, '(removed)')) for k, _ in foreign)))
            if to_set or to_delete:
                params = dict(to_set, digest=cfg.get('digest'))
                if to_delete:
                    params['delete'] = ','.join(to_delete)
                res = api_call('updating %s' % self.label(news), g.config.post if news['kind'] == 'qemu' else g.config.put,
                               **params)
                wait_task(prox, news['node'], res, 'updating %s' % self.label(news))
            raw_changed = self.write_raw(news) if news['kind'] == 'lxc' and news.get('raw_lxc') is not None else False
            status = api_call('reading %s' % self.label(news), g.status.current.get, read=True)['status']
            if news['start'] and status != 'running':
                self.power(prox, news, 'start')
            elif not news['start'] and status == 'running':
                self.power(prox, news, 'stop')
            elif raw_changed and status == 'running':
                # Raw lxc.* lines only take effect when the container starts.
                self.power(prox, news, 'reboot')
            outs = dict(news, **self.observe(prox, news))
        outs['uid'] = olds.get('uid') or uuid.uuid4().hex
        return UpdateResult(outs)

    def read(self, id_, props):
        if 'kind' not in props:
            return self.read_by_id(id_, props)

        def danger(foreign):
            warn('%s: DANGER - %s in %s point%s at the container\'s GPU, set outside Pulumi; started, the VM would '
                 'take it from the container. `pulumi up` puts back the declared hostpci%s.' % (
                     self.label(props), ', '.join('%s: %s' % kv for kv in foreign), self.conf_path(props),
                     's' if len(foreign) == 1 else '',
                     ' and mapping entries' if any('mapping=' in v for _, v in foreign) else ''))
        with client(props['api']) as prox:
            try:
                outs = dict(props, **self.observe(prox, props, on_foreign=danger))
            except PveError as e:
                if gone(e):
                    return self.read_result(None, {})
                raise
        return self.read_result(id_, outs)

    def read_by_id(self, id_, props):
        """`pulumi import gpuhost:index:ProxmoxGuest <name> <vmid>` (or the import_ option): the engine's Read
        carries the id alone, and the provider's configuration (the host's login). The guest is found in the
        cluster by its vmid and read whole - its config, its raw lxc.* lines, its power state - and marked
        IMPORTED: until the first update, the program takes as its own only the keys it declares (as_declared),
        so nothing the guest has that the config does not name is ever deleted or replaced."""
        vmid = str(id_)
        if not vmid.isdigit():
            raise OperatorError('import of a Proxmox guest: the id is its vmid (a number, e.g. 200), not %r' % vmid)
        with client(props['api']) as prox:
            listed = api_call('listing the guests', prox.cluster.resources.get, type='vm', read=True)
            found = [g for g in listed or [] if str(g.get('vmid')) == vmid and g.get('type') in ('lxc', 'qemu')]
            if not found:
                return self.read_result(None, {})
            where = dict(props, node=found[0]['node'], kind=found[0]['type'], vmid=int(vmid))
            actual, _ = merge_pending(api_call('reading %s' % self.label(where), self.guest(prox, where).pending.get,
                                               read=True))
            config = {k: v for k, v in actual.items() if k not in UNMANAGED_KEYS and v is not None}
            create = {'unprivileged': int(actual.get('unprivileged') or 0)} if where['kind'] == 'lxc' else {}
            raw = parse_raw(self.read_conf(where)[1]) if where['kind'] == 'lxc' else {}
            found = dict(where, config=config, create=create, raw_lxc=raw, **{IMPORTED: True})
            outs = dict(found, **self.observe(prox, found))
        return self.read_result(vmid, dict(outs, create=create, **{IMPORTED: True}))

    def check_import(self, found, news):
        """An imported guest is taken over only if it is the one the config describes: the same kind, node and
        vmid, its name, its create-only keys and its mount points (refusals(), as for adopt), and no GPU the
        config does not give it (a devN /dev/nvidiaN or a hostpciN that is not declared: another workload's
        GPU, or a vmid typo between two GPU guests)."""
        side = 'container' if news['kind'] == 'lxc' else 'vm'
        wrong = ['it is a%s %s' % ('n' if found.get('kind') == 'lxc' else '', 'LXC container' if found.get('kind') ==
                                   'lxc' else 'QEMU VM')] if found.get('kind') != news['kind'] else []
        if str(found.get('vmid')) != str(news['vmid']) or found.get('node') != news['node']:
            wrong.append('it is guest %s on %s, the config declares %s on %s (gpuhost:%s.vmid, gpuhost:host.node)' % (
                found.get('vmid'), found.get('node'), news['vmid'], news['node'], side))
        have = found.get('config') or {}
        if not wrong:
            wrong += refusals(news, have)
        declared = news.get('config') or {}
        foreign = sorted(k for k, v in have.items() if GPU_KEY_RE.match(k) and is_gpu_entry(v) and
                         not same_value(k, declared.get(k), v))
        if foreign:
            wrong.append('it has GPU entries the config does not give it (%s) - another workload\'s GPUs, or the wrong '
                         'vmid' % ', '.join('%s: %s' % (k, have[k]) for k in foreign))
        if wrong:
            raise PveError('%s: not imported - %s. Nothing was changed; check the id given to `pulumi import` (or '
                           'the import_ option) against gpuhost:%s.vmid.' % (self.label(news), '; '.join(wrong), side))

    def delete(self, _id, props):
        with client(props['api']) as prox:
            g = self.guest(prox, props)
            try:
                status = api_call('reading %s' % self.label(props), g.status.current.get, read=True)['status']
            except PveError as e:
                # Only Proxmox's own "does not exist" means gone; an auth, TLS or network error says
                # nothing about the guest, and dropping it from the state would orphan it.
                if gone(e):
                    return
                raise
            if status == 'running':
                self.power(prox, props, 'stop')
            upid = api_call('destroying %s' % self.label(props), g.delete, purge=1)
            wait_task(prox, props['node'], upid, 'destroying %s' % self.label(props))

    def same(self, key, observed, desired):
        if key == 'config':
            observed = observed or {}
            return set(observed) == set(desired or {}) and all(
                same_value(k, v, observed.get(k)) for k, v in (desired or {}).items())
        return observed == desired


def gone(e: Exception) -> bool:
    """Proxmox's answer for a guest that does not exist (500, "Configuration file ... does not exist")."""
    return ' 500 ' in str(e) and 'does not exist' in str(e)


def pve_error_from(res, target, path):
    return PveError('%s: reading %s failed (exit %d): %s' % (target.name, path, res.exit_code,
                                                            res.stderr.strip()[-300:] or '(no stderr)'))


class Guest(GpuhostResource, name='ProxmoxGuest'):
    """A container or VM on Proxmox (PveGuestProvider)."""
