"""Proxmox guests (LXC containers and QEMU VMs) through the API with proxmoxer, as a dynamic resource
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
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
import uuid

from pulumi.dynamic import CreateResult, Resource, UpdateResult

from components import remote
from components.state import ObservedProvider, OperatorError


class PveError(OperatorError):
    pass


# ---------------------------------------------------------------- normalising

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


def observed_config(desired: dict, actual: dict) -> dict:
    """The managed keys as the host has them: the desired value where Proxmox's satisfies it (so an
    unchanged guest shows no diff), else Proxmox's own value (None when absent)."""
    return {k: (v if same_value(k, v, actual.get(k)) else actual.get(k)) for k, v in desired.items()}


def changes(desired: dict, actual: dict, previously_managed) -> tuple:
    """(values to set, keys to delete): the smallest PUT that makes the guest match."""
    to_set = {k: scalar(v) for k, v in desired.items() if not same_value(k, v, actual.get(k))}
    to_delete = sorted(k for k in previously_managed if k not in desired and actual.get(k) is not None)
    return to_set, to_delete


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


# ------------------------------------------------------------------ the client

@contextlib.contextmanager
def client(api: dict):
    """A proxmoxer client for root@pam with a password ticket; TLS verified against the given CA."""
    import proxmoxer
    with tempfile.TemporaryDirectory(prefix='gpuhost-ca-') as d:
        ca = os.path.join(d, 'ca.pem')
        with open(ca, 'w') as f:
            f.write(api['ca_cert'])
        try:
            prox = proxmoxer.ProxmoxAPI(api['host'], port=int(api['port']), user=api['user'],
                                        password=api['password'], verify_ssl=ca, timeout=float(api.get('timeout', 30)))
        except proxmoxer.AuthenticationError:
            raise PveError('Proxmox API at %s:%s refused the login of %s (gpuhost:host.api.password)' % (
                api['host'], api['port'], api['user'])) from None
        except Exception as e:  # connection and TLS errors: name the endpoint, never the password
            raise PveError('cannot reach the Proxmox API at %s:%s: %s' % (api['host'], api['port'],
                                                                          type(e).__name__ + ': ' + str(e)[:300])) from None
        yield prox


def wait_task(prox, node: str, upid, what: str, timeout: float = 600.0) -> None:
    if not isinstance(upid, str) or not upid.startswith('UPID:'):
        return
    from proxmoxer.tools import Tasks
    status = Tasks.blocking_status(prox, upid, timeout=timeout, polling_interval=0.2)
    if status is None:
        raise PveError('%s: task %s did not finish within %d s' % (what, upid, timeout))
    if status.get('exitstatus') != 'OK':
        raise PveError('%s failed: %s' % (what, status.get('exitstatus')))


def api_call(what: str, fn, *args, **kwargs):
    import proxmoxer
    try:
        return fn(*args, **kwargs)
    except proxmoxer.ResourceException as e:
        detail = '; '.join('%s: %s' % kv for kv in sorted((e.errors or {}).items())) or (e.content or '').strip()
        raise PveError('%s: Proxmox answered %s %s%s' % (what, e.status_code, e.status_message,
                                                        ' (%s)' % detail if detail else '')) from None


# --------------------------------------------------------------------- provider

class PveGuestProvider(ObservedProvider):
    """inputs: api, connection (LXC: for raw lines), node, kind (lxc|qemu), vmid, create, config, start,
    raw_lxc. outputs: the same as observed, plus status, pending, uid (new on every creation)."""

    DESIRED = ('node', 'kind', 'vmid', 'create', 'config', 'start', 'raw_lxc')
    REPLACE = ('node', 'kind', 'vmid', 'create')
    CONNECTION = ('api', 'connection')
    OUTPUTS = ('status', 'pending', 'uid')

    # What each create-only input is called in the stack config, for the refusal below.
    REPLACE_KEYS = {'node': 'gpuhost:host.node', 'vmid': 'gpuhost:{side}.vmid', 'kind': 'gpuhost:{side}',
                    'ostemplate': 'gpuhost:container.ostemplate', 'rootfs': 'gpuhost:container.storage/rootfs_gb',
                    'unprivileged': 'gpuhost:container.unprivileged'}

    def diff(self, id_, olds, news):
        result = super().diff(id_, olds, news)
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

    def observe(self, prox, props):
        g = self.guest(prox, props)
        label = self.label(props)
        items = api_call('reading %s' % label, g.pending.get)
        actual, pending = merge_pending(items)
        status = api_call('reading %s' % label, g.status.current.get)['status']
        create = dict(props['create'])
        if 'unprivileged' in create:
            create['unprivileged'] = int(actual.get('unprivileged', 0))
        out = {'config': observed_config(props['config'], actual), 'create': create,
               'start': status == 'running', 'status': status, 'pending': pending,
               'raw_lxc': self.observe_raw(props)}
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

    def create(self, props):
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
            cfg = api_call('reading %s' % self.label(news), g.config.get)
            actual, _ = merge_pending(api_call('reading %s' % self.label(news), g.pending.get))
            to_set, to_delete = changes(news['config'], actual, (olds.get('config') or {}).keys())
            if to_set or to_delete:
                params = dict(to_set, digest=cfg.get('digest'))
                if to_delete:
                    params['delete'] = ','.join(to_delete)
                res = api_call('updating %s' % self.label(news), g.config.post if news['kind'] == 'qemu' else g.config.put,
                               **params)
                wait_task(prox, news['node'], res, 'updating %s' % self.label(news))
            raw_changed = self.write_raw(news) if news['kind'] == 'lxc' and news.get('raw_lxc') is not None else False
            status = api_call('reading %s' % self.label(news), g.status.current.get)['status']
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
        with client(props['api']) as prox:
            try:
                outs = dict(props, **self.observe(prox, props))
            except PveError as e:
                if gone(e):
                    return self.read_result(None, {})
                raise
        return self.read_result(id_, outs)

    def delete(self, _id, props):
        with client(props['api']) as prox:
            g = self.guest(prox, props)
            try:
                status = api_call('reading %s' % self.label(props), g.status.current.get)['status']
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


class Guest(Resource, module='gpuhost', name='ProxmoxGuest'):
    """A container or VM on Proxmox (PveGuestProvider)."""


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

