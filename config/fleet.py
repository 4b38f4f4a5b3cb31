"""gpuhost:hosts and gpuhost:rollout - a stack of several hosts: each entry merged over the shared
gpuhost:* settings and validated on its own (every refusal names the host), the checks across hosts,
and the rollout lanes (which host waits for which)."""

from __future__ import annotations

import json
import re
from typing import Optional

from pydantic import Field, ValidationError

from config.deployment import Deployment, parse
from config.errors import did_you_mean, format_errors
from config.values import ConfigError, Model, show


FLEET_KEYS = ('hosts', 'rollout')


HOST_NAME_RE = re.compile(r'^[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?$')


class Rollout(Model):
    max_unavailable: int = Field(1, ge=1, le=64, description='How many hosts may restart SGLang (or reboot) at '
                                                             'the same time; the next waits for /health and '
                                                             '/server_info of the one before it')


class FleetHost(object):
    """One host of the stack: its name (None for a one-host stack without gpuhost:hosts) and model."""

    def __init__(self, name: Optional[str], index: int, deployment: Deployment):
        self.name, self.index, self.deployment = name, index, deployment

    def resource_name(self, role: str) -> str:
        """A one-host stack keeps the names it always had (its URNs stay); a fleet prefixes the host."""
        return role if self.name is None else '%s-%s' % (self.name, role)

    @property
    def label(self) -> str:
        return self.name or self.deployment.host.node


class Fleet(object):
    def __init__(self, hosts: list, rollout: Rollout, is_fleet: bool):
        self.hosts, self.rollout, self.is_fleet = hosts, rollout, is_fleet

    def lane_before(self, i: int) -> Optional[FleetHost]:
        """The host whose SGLang must be serving again before host i may restart its own (None: first
        in its lane). Hosts roll out in config order, max_unavailable lanes at once."""
        k = self.rollout.max_unavailable
        return self.hosts[i - k] if self.is_fleet and i >= k else None

    def rollout_info(self, i: int) -> Optional[dict]:
        if not self.is_fleet:
            return None
        k = self.rollout.max_unavailable
        names = [h.name for h in self.hosts]
        return {'host': names[i], 'order': names, 'max_unavailable': k,
                'before': [n for j, n in enumerate(names) if j < i and (i - j) % k == 0],
                'after': [n for j, n in enumerate(names) if j > i and (j - i) % k == 0]}


def deep_merge(base, over):
    """A host entry over the shared defaults: mappings merge key by key, anything else (lists too)
    replaces, and null removes the key (`vm: null`: this host has no VM)."""
    if isinstance(over, dict):
        # A mapping merges into the shared one - or into nothing, when the shared settings lack it (its
        # nulls then remove nothing, so they cannot reach the model as values).
        out = dict(base) if isinstance(base, dict) else {}
        for k, v in over.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = deep_merge(out.get(k), v)
        return out
    return over


def prefixed(e: ConfigError, where: str) -> ConfigError:
    text = str(e)
    head = 'invalid stack configuration:'
    if text.startswith(head):
        text = text[len(head):].lstrip('\n')
        return ConfigError('invalid stack configuration for %s:\n%s' % (where, text))
    return ConfigError('%s: %s' % (where, text))


def parse_fleet(data: dict) -> Fleet:
    """The fleet from the `gpuhost` namespace: without gpuhost:hosts, the stack is one host (the other
    keys); with it, each entry (name plus any of the other keys) is merged over the other keys, the
    shared defaults, and validated on its own - every refusal names the host."""
    try:
        raw = data.get('rollout')
        rollout = Rollout.model_validate_json(json.dumps({} if raw is None else raw), strict=True)
    except ValidationError as e:
        raise ConfigError(format_errors(e, Rollout, ('rollout',))) from None
    defaults = {k: v for k, v in data.items() if k not in FLEET_KEYS}
    hosts = data.get('hosts')
    if hosts is None:
        if 'rollout' in data:
            raise ConfigError('gpuhost:rollout: set, but the stack has no gpuhost:hosts list; a one-host stack has '
                              'nothing to roll out - remove gpuhost:rollout or list the hosts')
        return Fleet([FleetHost(None, 0, parse(defaults))], rollout, False)
    if not isinstance(hosts, list) or not hosts:
        raise ConfigError('gpuhost:hosts: %s is not a list of hosts; write a list of mappings, each with a name and '
                          'what differs from the shared gpuhost:* settings, e.g. [{name: gpu01, host: {address: ...}}]'
                          % show(hosts))
    ours = list(Deployment.model_fields)
    out, names = [], {}
    for i, entry in enumerate(hosts):
        where = 'gpuhost:hosts[%d]' % i
        if not isinstance(entry, dict):
            raise ConfigError('%s: %s is not a mapping; give name plus what differs for this host' % (
                where, show(entry)))
        name = entry.get('name')
        if not isinstance(name, str) or not HOST_NAME_RE.fullmatch(name):
            raise ConfigError('%s.name: %s is not a host name: lowercase letters, digits and -, 1-32 characters, '
                              'starting and ending with a letter or digit (it names the host\'s resources and its '
                              'monitoring label), e.g. gpu01' % (where, show(name)))
        if name in names:
            raise ConfigError('%s.name: %s is also the name of gpuhost:hosts[%d]; each host needs its own name' % (
                where, name, names[name]))
        names[name] = i
        where = '%s (%s)' % (where, name)
        unknown = [k for k in entry if k != 'name' and k not in ours]
        if unknown:
            raise ConfigError('%s: %s is not a setting of a host%s; a host entry takes name and: %s' % (
                where, unknown[0], did_you_mean(unknown[0], ours + ['name']), ', '.join(ours)))
        merged = deep_merge(defaults, {k: v for k, v in entry.items() if k != 'name'})
        try:
            out.append(FleetHost(name, i, parse(merged)))
        except ConfigError as e:
            raise prefixed(e, 'host %s (gpuhost:hosts[%d] merged over the shared gpuhost:* settings)' % (
                name, i)) from None
    check_fleet(out)
    return Fleet(out, rollout, True)


def check_fleet(hosts: list) -> None:
    """What no single host can see: two entries that are the same machine or the same endpoint."""
    seen = {}

    def once(key, value, h, what):
        prev = seen.setdefault((key, value), h)
        if prev is not h:
            raise ConfigError('host %s (gpuhost:hosts[%d]): %s %s is also host %s\'s; %s' % (
                h.name, h.index, key, value, prev.name, what))
    for h in hosts:
        d = h.deployment
        # DNS names compare without case (PVE-GPU01.example and pve-gpu01.example are one machine).
        once('host.address:ssh.port', '%s:%d' % (d.host.address.lower(), d.host.ssh.port), h,
             'two entries for one machine would fight over its settings - remove one or fix the address')
        api = '%s:%d' % ((d.host.api.address or d.host.address).lower(), d.host.api.port)
        once('host.node', '%s@%s' % (d.host.node, api), h,
             'one Proxmox node is one host - fix the node name')
        once('container.ip', d.container.address, h,
             'monitoring and the smoke test would reach one SGLang for two hosts - give each its own address')
        for guest in ([d.container] + ([d.vm] if d.vm else [])):
            # Only hosts reached through the same API address can be seen to share a cluster here; nodes of
            # one cluster with their own addresses are checked by Proxmox at create ("already exists").
            once('vmid', '%d@%s' % (guest.vmid, api), h,
                 'guests of one Proxmox cluster need cluster-wide unique vmids - set another container.vmid / vm.vmid')
        for mid in (d.vm.mapping_ids() if d.vm else []):
            once('PCI mapping id', '%s@%s' % (mid, api), h,
                 'resource mappings are cluster-wide, so each VM of one cluster needs its own - set another '
                 'vm.gpu_mapping_prefix')
