"""gpuhost:hosts and gpuhost:rollout - a stack of several hosts: each entry merged over the shared
gpuhost:* settings and validated on its own (every refusal names the host), the checks across hosts,
and the rollout lanes (which host waits for which)."""

from __future__ import annotations

import json
import re
from typing import Optional

from typing import Annotated, Literal

from pydantic import AfterValidator, Field, SecretStr, ValidationError, field_validator, model_validator

from config.deployment import Deployment, parse
from config.errors import did_you_mean, format_errors
from config.values import ConfigError, FilePath, Model, grammar, http_url, show


FLEET_KEYS = ('hosts', 'rollout')


HOST_NAME_RE = re.compile(r'^[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?$')


def prometheus_url(value: str) -> str:
    return http_url(value, 'the http(s) URL of a Prometheus server (its HTTP API answers under /api/v1)',
                    'http://prometheus.example.internal:9090',
                    'put an authenticating proxy on the operator\'s network in front of it, or leave the key out '
                    '(the program then reads each host\'s /metrics itself)')


PrometheusUrl = Annotated[str, AfterValidator(prometheus_url)]


class CanarySlo(Model):
    """Absolute service levels the canary must meet in every load band it is judged in (the median of its windows'
    figures); absent, only the comparison with the baseline counts."""
    itl_p95_ms: Optional[float] = Field(None, gt=0, le=60000, description='Inter-token latency, p95 of a window, '
                                                                           'in milliseconds')
    ttft_p95_ms: Optional[float] = Field(None, gt=0, le=3600000, description='Time to first token, p95 of a '
                                                                              'window, in milliseconds')
    e2e_p95_s: Optional[float] = Field(None, gt=0, le=86400, description='End-to-end request latency, p95 of a '
                                                                         'window, in seconds')
    aborted_ratio: Optional[float] = Field(None, ge=0, le=1, description='Aborted requests per request in a window')


class Canary(Model):
    """gpuhost:rollout.canary: a change that restarts SGLang with another serving behaviour reaches the first host
    of the first lane first, is judged against hosts still on the old setting under the fleet's own traffic, and
    rolls on only when it holds (docs/canary-plan.md)."""
    baseline: Literal['restart', 'running'] = Field(
        'running', description='running: the other hosts as they run, nothing restarted; restart: the second host, '
                               'still on the old setting, restarts onto it at the same moment as the canary (same '
                               'start, same warm-up: what Kayenta advises) and is the baseline alone - two hosts down '
                               'at once, so gpuhost:rollout.max_unavailable must be 2 at least')
    prometheus: Optional[PrometheusUrl] = Field(
        None, description='Read the hosts\' SGLang metrics from this Prometheus (its HTTP API); absent, the program '
                          'reads each host\'s /metrics itself')
    window_s: int = Field(30, ge=1, le=3600, description='One sample per host and metric per window')
    max_duration_s: int = Field(3600, ge=10, le=86400, description='The longest the judgement may take; '
                                                                  'inconclusive then')
    min_samples: int = Field(50, ge=3, le=10000, description='Windows needed per side and load band before a band '
                                                            'is judged (Kayenta advises ~50 points per metric)')
    bands: list[float] = Field([1, 8, 32, 128], min_length=1, max_length=16,
                               description='Load band edges in running requests (the baseline\'s mean in a window); '
                                           'a window below the first edge is idle and not judged')
    confidence: float = Field(0.98, ge=0.5, lt=1, description='The Mann-Whitney U test\'s confidence that the '
                                                             'canary is worse (one-sided)')
    tolerance: float = Field(0.1, ge=0, le=10, description='How much worse than the baseline (relative, in the '
                                                           'band\'s medians) the canary may be and still pass')
    traffic_tolerance: float = Field(0.25, ge=0, le=10, description='How far the canary\'s request rate in a window '
                                                                    'may be from the baseline\'s (relative) for '
                                                                    'the window to count')
    slo: CanarySlo = Field(CanarySlo(), description='Absolute service levels')
    inconclusive: Literal['rollback', 'proceed'] = Field(
        'rollback', description='What too little traffic within max_duration_s does: the canary goes back '
                                '(rollback), or the rollout goes on (proceed)')

    @model_validator(mode='after')
    def _consistent(self):
        if sorted(set(self.bands)) != list(self.bands) or self.bands[0] <= 0:
            raise ValueError('bands %s: the load band edges must be positive and increasing, e.g. [1, 8, 32, 128]'
                             % show(list(self.bands)))
        if self.max_duration_s < self.window_s * self.min_samples:
            raise ValueError('max_duration_s %d is shorter than min_samples %d windows of window_s %d s (%d s): no '
                             'band could ever be judged; raise max_duration_s to at least %d or lower the others' % (
                                 self.max_duration_s, self.min_samples, self.window_s,
                                 self.window_s * self.min_samples, self.window_s * self.min_samples))
        return self


def etcd_url(value: str) -> str:
    return http_url(value, 'the http(s) URL of an etcd member\'s client endpoint (its v3 JSON gateway answers under /v3)',
                    'https://etcd1.example.internal:2379',
                    'set gpuhost:rollout.fleet_lock.user, and its password as a secret (pulumi config set --secret '
                    '--path gpuhost:rollout.fleet_lock.password)')


EtcdUrl = Annotated[str, AfterValidator(etcd_url)]
# A segment of the slot keys /gpuhost/fleetlock/<group>/slot/<i>: no /, nothing etcd's tools would need quoted.
LockGroup = Annotated[str, grammar(r'^[a-z0-9](?:[a-z0-9._-]{0,62}[a-z0-9])?$',
                                   'a fleet lock group (lowercase letters, digits, ".", "_" and "-", 1-64 characters, '
                                   'starting and ending with a letter or digit: a segment of the etcd keys '
                                   '/gpuhost/fleetlock/<group>/slot/<i>)', 'prod-gpu', 64)]


class FleetLock(Model):
    """gpuhost:rollout.fleet_lock: a fleet-wide limit of hosts down across stacks (shards run at once): before a step
    that may stop a host's SGLang, the plugin takes one of `slots` slots of `group` in etcd, keeps it while the host
    is down and releases it once the host serves again (transport/fleetlock.py, docs/fleets.md)."""
    group: LockGroup = Field(description='The lock\'s name: every stack that shares it shares its slots')
    slots: int = Field(ge=1, le=1024, description='How many hosts of the group may be down at once, across every '
                                                  'stack that takes this lock (give each the same number)')
    endpoints: list[EtcdUrl] = Field(min_length=1, max_length=16, description='etcd members\' client URLs, tried '
                                                                             'in order')
    ttl_s: int = Field(60, ge=5, le=3600, description='The slot\'s lease: renewed every ttl_s/3 while held; a '
                                                      'runner that dies frees its slots this long after')
    ca_file: Optional[FilePath] = Field(None, description='CA bundle to verify https endpoints (absent: the system\'s)')
    cert_file: Optional[FilePath] = Field(None, description='Client certificate (PEM) for etcd\'s TLS client auth')
    key_file: Optional[FilePath] = Field(None, description='Its private key (PEM); read by the plugin, never stored')
    user: Optional[Annotated[str, grammar(r'^[A-Za-z0-9._@-]{1,64}$', 'an etcd user name (letters, digits, ".", "_", '
                                          '"@" and "-", 1-64 characters)', 'gpuhost-lock', 64)]] = Field(
        None, description='etcd user (etcd auth enabled); needs read and write on the keys under /gpuhost/fleetlock/ '
                          'of its group')
    password: Optional[SecretStr] = Field(None, description='Its password; a secret')

    @field_validator('password')
    @classmethod
    def _password(cls, v):
        if v is not None and (not v.get_secret_value() or any(ord(c) < 0x20 for c in v.get_secret_value())):
            raise ValueError('empty or holds control characters (not shown); set it again: pulumi config set --secret '
                             '--path gpuhost:rollout.fleet_lock.password')
        return v

    @model_validator(mode='after')
    def _pairs(self):
        if (self.user is None) != (self.password is None):
            raise ValueError('gpuhost:rollout.fleet_lock: a user needs a password and a password a user; set both '
                             '(the password as a secret: pulumi config set --secret --path '
                             'gpuhost:rollout.fleet_lock.password) or neither (an etcd without auth)')
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError('gpuhost:rollout.fleet_lock: cert_file and key_file go together (etcd\'s TLS client '
                             'auth); set both or neither')
        tls = [k for k in ('ca_file', 'cert_file') if getattr(self, k) is not None]
        plain = [e for e in self.endpoints if e.startswith('http:')]
        if tls and plain:
            raise ValueError('gpuhost:rollout.fleet_lock: %s is set, but endpoint %s is http: TLS settings need https '
                             'endpoints - write https://... or remove %s' % (tls[0], plain[0], ' and '.join(tls)))
        return self

    def plain(self) -> dict:
        """What the gated resources' `rollout` input carries (resources/fields.py ROLLOUT): all but the password,
        which reaches the plugin in the provider's configuration (secret)."""
        import os
        out = {'group': self.group, 'slots': self.slots, 'endpoints': list(self.endpoints), 'ttl_s': self.ttl_s}
        if self.user:
            out['user'] = self.user
        for k in ('ca_file', 'cert_file', 'key_file'):
            if getattr(self, k):
                # The plugin reads them where it runs: the path as the program (in the project directory) sees it.
                out[k] = os.path.abspath(os.path.expanduser(getattr(self, k)))
        return out


class Rollout(Model):
    max_unavailable: int = Field(1, ge=1, le=64, description='How many hosts may restart SGLang (or reboot) at '
                                                             'the same time; the next waits for /health and '
                                                             '/server_info of the one before it')
    canary: Optional[Canary] = Field(None, description='Judge a change on the first host against the others under '
                                                       'real traffic before it goes on (off when absent)')
    fleet_lock: Optional[FleetLock] = Field(None, description='A limit of hosts down across stacks, held in etcd '
                                                              '(off when absent)')


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
        out = {'host': names[i], 'order': names, 'max_unavailable': k,
               'before': [n for j, n in enumerate(names) if j < i and (i - j) % k == 0],
               'after': [n for j, n in enumerate(names) if j > i and (j - i) % k == 0]}
        if self.rollout.canary is not None:
            # The first host of the first lane takes a change first; every other host waits for its verdict.
            out['canary'] = names[0]
        if self.rollout.fleet_lock is not None:
            # A step that may stop this host's SGLang takes a slot of the fleet's lock first (provider/rollout.py).
            out['fleet_lock'] = self.rollout.fleet_lock.plain()
        return out

    def fleet_lock_secret(self) -> Optional[dict]:
        """What of gpuhost:rollout.fleet_lock is secret (its password): the provider's configuration carries it, as a
        Pulumi secret, never the resources' inputs. None without one."""
        lock = self.rollout.fleet_lock
        if lock is None or lock.password is None:
            return None
        return {'password': lock.password.get_secret_value()}

    def canary_settings(self) -> Optional[dict]:
        """The judge's settings (gpuhost:rollout.canary) as the canary's SGLang unit takes them; None: no canary."""
        c = self.rollout.canary
        if c is None:
            return None
        return {'window_s': c.window_s, 'max_duration_s': c.max_duration_s, 'min_samples': c.min_samples,
                'bands': list(c.bands), 'confidence': c.confidence, 'tolerance': c.tolerance,
                'traffic_tolerance': c.traffic_tolerance, 'inconclusive': c.inconclusive,
                'slo': {k: v for k, v in c.slo.model_dump().items() if v is not None}, 'baseline': c.baseline,
                **({'prometheus': c.prometheus} if c.prometheus else {})}


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
    if rollout.canary is not None and len(out) < 2:
        raise ConfigError('gpuhost:rollout.canary: set, but gpuhost:hosts lists one host; a canary is judged against '
                          'hosts still on the old setting - list at least two hosts or remove gpuhost:rollout.canary')
    if rollout.canary is not None and rollout.canary.baseline == 'restart' and rollout.max_unavailable < 2:
        # The canary and its baseline restart together: two hosts down at once, which the fleet must allow.
        raise ConfigError('gpuhost:rollout.canary.baseline: restart takes two hosts down at once (the canary %s and its '
                          'baseline %s restart together), but gpuhost:rollout.max_unavailable is %d; set '
                          'max_unavailable: 2 or more, or baseline: running (the other hosts, as they run, are the '
                          'baseline; nothing else restarts)' % (out[0].name, out[1].name, rollout.max_unavailable))
    if rollout.canary is not None and rollout.canary.baseline == 'restart' and rollout.fleet_lock is not None and \
            rollout.fleet_lock.slots < 2:
        # Its two hosts each take a slot of the lock: with one, the baseline would wait for the canary's for ever.
        raise ConfigError('gpuhost:rollout.canary.baseline: restart takes two hosts down at once, each with a slot of '
                          'the fleet lock, but gpuhost:rollout.fleet_lock.slots is %d; set slots: 2 or more (the same '
                          'in every stack sharing the lock), or baseline: running' % rollout.fleet_lock.slots)
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
