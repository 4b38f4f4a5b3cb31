"""Reading the stack: the `gpuhost:*` Pulumi config of the running stack (secure values as secrets, plain
ones refused where a secret belongs, look-alike namespaces refused), the files the config names, and
what the program needs before it builds anything (load_stack)."""

from __future__ import annotations

import difflib
import json
import os
from typing import Optional

from config.deployment import Deployment
from config.errors import _loc, did_you_mean
from config.fleet import FLEET_KEYS, Fleet, parse_fleet, prefixed
from config.values import ConfigError, check_ca, check_private_key, parse_host_key


SECRET_PATHS = (('host', 'ssh', 'private_key'), ('host', 'api', 'password'), ('host', 'api', 'token_secret'),
                ('sglang', 'api_key'))


# Namespaces Pulumi itself uses in a stack's config; anything else that is not ours is a typo.
FOREIGN_NAMESPACES = ('pulumi', 'command')


def read_file(path: str, root: str, what: str) -> str:
    import stat
    full = os.path.expanduser(path)
    full = full if os.path.isabs(full) else os.path.join(root, full)
    try:
        with open(full) as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_size > 1 << 20:
                raise ConfigError('%s: %s is not a regular file of at most 1 MiB' % (what, full))
            return f.read()
    except OSError as e:
        raise ConfigError('%s: cannot read %s: %s' % (what, full, e.strerror)) from None
    except UnicodeDecodeError:
        raise ConfigError('%s: %s is not a text file' % (what, full)) from None


def connection_inputs(d: Deployment, root: str) -> tuple:
    """(ssh connection, api) as plain dicts for the resources; the caller wraps them as secrets.
    Files named in the config are read and parsed here, at preview."""
    ssh, api = d.host.ssh, d.host.api
    if ssh.private_key:
        key = ssh.private_key.get_secret_value()
        check_private_key(key, 'gpuhost:host.ssh.private_key')
    else:
        key = read_file(ssh.private_key_file, root, 'gpuhost:host.ssh.private_key_file')
        check_private_key(key, 'gpuhost:host.ssh.private_key_file (%s)' % ssh.private_key_file)
    if ssh.host_key:
        host_key = ssh.host_key
    else:
        raw = read_file(ssh.host_key_file, root, 'gpuhost:host.ssh.host_key_file')
        try:
            host_key = parse_host_key(raw.strip())
        except ValueError as e:
            raise ConfigError('gpuhost:host.ssh.host_key_file (%s): %s' % (ssh.host_key_file, e)) from None
    if api.password:
        password = api.password.get_secret_value()
    else:
        password = read_file(api.password_file, root, 'gpuhost:host.api.password_file').strip()
    if not password or any(ord(c) < 0x20 for c in password):
        raise ConfigError('gpuhost:host.api.password: empty or holds control characters (not shown)')
    if api.ca_cert:
        ca = api.ca_cert
    else:
        ca = read_file(api.ca_file, root, 'gpuhost:host.api.ca_file')
        check_ca(ca, 'gpuhost:host.api.ca_file (%s)' % api.ca_file)
    connection = {'host': d.host.address, 'port': ssh.port, 'user': ssh.user, 'private_key': key,
                  'host_key': host_key, 'timeout': ssh.connect_timeout, 'command_timeout': ssh.command_timeout}
    api_in = {'host': api.address or d.host.address, 'port': api.port, 'user': api.user, 'password': password,
              'ca_cert': ca, 'timeout': api.timeout}
    return connection, api_in


def fleet_from_pulumi() -> 'Fleet':
    """The fleet from the running stack's `gpuhost:*` config (secure leaves arrive decrypted and go
    into SecretStr fields; the program hands them to resources only as Pulumi secrets)."""
    from pulumi.runtime.config import get_config, is_config_secret
    import pulumi
    keys = _all_config_keys()
    check_namespaces(keys)
    data = {}
    for key in list(Deployment.model_fields) + list(FLEET_KEYS):
        raw = get_config('gpuhost:' + key)
        if raw is None:
            continue
        try:
            data[key] = json.loads(raw)
        except ValueError:
            data[key] = raw
    secure = stack_file_secure_paths(pulumi.get_stack())
    hosts = data.get('hosts')
    defaults = {k: v for k, v in data.items() if k not in FLEET_KEYS}
    check_secrets(defaults, is_config_secret, secure)
    if isinstance(hosts, list):
        for i, entry in enumerate(hosts):
            if isinstance(entry, dict):
                check_secrets(entry, is_config_secret, secure, prefix=('hosts', str(i)))
    return parse_fleet(data)


def load_stack(root: str) -> tuple:
    """What the program needs from the running stack's config before it builds anything, for preview
    and up alike: (fleet, each host's (ssh connection, api) inputs - the files the config names read
    and parsed against `root`, the project directory - and the warnings to show, one line each).
    Raises ConfigError with the message the operator sees."""
    fleet = fleet_from_pulumi()
    inputs, warnings = [], {}
    for h in fleet.hosts:
        try:
            inputs.append(connection_inputs(h.deployment, root))
        except ConfigError as e:
            raise (prefixed(e, 'host %s (gpuhost:hosts[%d])' % (h.name, h.index)) if fleet.is_fleet else e)
        for warning in h.deployment.warnings:
            warnings.setdefault(warning, []).append(h.name)
    # The same warning for several hosts of a fleet is said once, naming them.
    lines = [(('host%s %s: ' % ('s' if len(names) > 1 else '', ', '.join(names))) if fleet.is_fleet else '') + warning
             for warning, names in warnings.items()]
    return fleet, inputs, lines


def _all_config_keys():
    import pulumi.runtime.config as rc
    return list(rc.CONFIG.get())


def check_namespaces(keys) -> None:
    """Unknown gpuhost: keys, and keys in a namespace that looks like ours (gpuhots:vm), are refused:
    ignoring them once meant an `up` that deleted the VM and exited 0."""
    ours = list(Deployment.model_fields) + list(FLEET_KEYS)
    problems = []
    for k in sorted(keys):
        ns, sep, name = k.partition(':')
        if not sep:
            continue
        if ns == 'gpuhost':
            if name not in ours:
                hint = did_you_mean(name.split('.')[-1] if name.startswith('gpuhost.') else name, ours)
                if name == 'vfio':
                    hint = (' (removed: the VM\'s GPUs are always bound to vfio-pci by PCI address; drop '
                            'gpuhost:vfio from the stack config)')
                problems.append('gpuhost:%s is not a setting of this program%s' % (name, hint))
        elif ns not in FOREIGN_NAMESPACES:
            close = difflib.SequenceMatcher(None, ns.lower(), 'gpuhost').ratio() >= 0.6
            if close or name.split('.')[0] in ours:
                problems.append('%s: namespace %r is not this program\'s; did you mean gpuhost:%s? (pulumi config '
                                'rm %s, then set it under gpuhost:)' % (k, ns, name, k))
    if problems:
        raise ConfigError('invalid stack configuration:\n  - ' + '\n  - '.join(problems) +
                          '\n  The settings are: ' + ', '.join('gpuhost:' + k for k in ours))


def stack_file_secure_paths(stack: str) -> Optional[set]:
    """Paths of `secure:` leaves in Pulumi.<stack>.yaml ({('host','api','password'), ...}), or None if
    the file cannot be read (config then comes from elsewhere and only the engine's flag counts)."""
    import yaml
    try:
        with open('Pulumi.%s.yaml' % stack) as f:
            doc = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError):
        return None
    out = set()

    def walk(node, path):
        if isinstance(node, dict):
            if set(node) == {'secure'}:
                out.add(path)
                return
            for k, v in node.items():
                walk(v, path + (str(k),))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, path + (str(i),))
    for key, value in (doc.get('config') or {}).items():
        ns, _, name = str(key).partition(':')
        if ns == 'gpuhost':
            walk(value, (name,))
    return out


def check_secrets(data: dict, is_secret, secure_paths: Optional[set], prefix: tuple = ()) -> None:
    """A password or key written as plain config ends up in plain text in the state: refuse it.
    `prefix`: where `data` sits in the config (('hosts', '1') for a fleet's host entry)."""
    for path in SECRET_PATHS:
        node = data
        for p in path:
            node = node.get(p) if isinstance(node, dict) else None
        if node is None:
            continue
        full = tuple(prefix) + path
        key = 'gpuhost:' + _loc([int(p) if p.isdigit() else p for p in full])
        plain = not is_secret('gpuhost:' + full[0])
        if not plain and secure_paths is not None:
            plain = not any(full[:len(s)] == s for s in secure_paths)
        if plain:
            raise ConfigError('%s is set as plain text, so it would be stored unencrypted in the stack\'s config and '
                              'state. Make it a secret: pulumi config rm --path %s && pulumi config set --secret '
                              '--path %s%s' % (key, key, key, ' < ~/.ssh/<key>' if 'key' in path[-1] else ''))
