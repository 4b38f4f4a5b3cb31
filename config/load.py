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
from config.model import parse_checksums
from config.runtime import check_password
from config.values import ConfigError, check_api_password, check_ca, check_private_key, parse_host_key
from grammar import pylock, unidiff


SECRET_PATHS = (('host', 'ssh', 'private_key'), ('host', 'api', 'password'), ('host', 'api', 'token_secret'),
                ('sglang', 'api_key'), ('runtime', 'python', 'index', 'password'), ('model', 'token'),
                ('runtime', 'nvidia', 'token'), ('runtime', 'cuda', 'token'), ('nvidia', 'driver', 'token'))
# The fleet's own credentials (gpuhost:rollout: never in a host entry).
FLEET_SECRET_PATHS = (('rollout', 'fleet_lock', 'password'),)


# Namespaces Pulumi itself uses in a stack's config; anything else that is not ours is a typo.
FOREIGN_NAMESPACES = ('pulumi', 'command')


def full_path(path: str, root: str) -> str:
    """A path the config names, as the program reads it: ~ expanded, relative to the project directory."""
    full = os.path.expanduser(path)
    return os.path.abspath(full if os.path.isabs(full) else os.path.join(root, full))


def read_file(path: str, root: str, what: str) -> str:
    import stat
    full = full_path(path, root)
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
    check_api_password(password, 'gpuhost:host.api.password')
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


def file_stamp(path: str) -> str:
    """What tells a rewritten file from the one seen last time without a byte of its content: size and mtime ('' for
    a file that is not there: the plugin, which reads it, says so)."""
    try:
        st = os.stat(path)
    except OSError:
        return ''
    return '%d:%d' % (st.st_size, st.st_mtime_ns)


def provider_access(d: Deployment, root: str, connection: dict, api: dict) -> tuple:
    """The host's connection and login as the gpuhost provider's configuration holds them (and so the state): a
    credential the stack names by file (gpuhost:host.ssh.private_key_file, gpuhost:host.api.password_file) stays in
    its file - the configuration carries its absolute path and stamp, and the plugin reads it when it is
    configured (provider/__main__.py). One given as a Pulumi secret is carried as it is, encrypted in the state."""
    connection, api = dict(connection), dict(api)
    if d.host.ssh.private_key_file:
        path = full_path(d.host.ssh.private_key_file, root)
        del connection['private_key']
        connection.update(private_key_file=path, private_key_stamp=file_stamp(path))
    if d.host.api.password_file:
        path = full_path(d.host.api.password_file, root)
        del api['password']
        api.update(password_file=path, password_stamp=file_stamp(path))
    return connection, api


def read_repo_file(rel: str, root: str, key: str) -> str:
    """A file the config names inside the repository (the project directory): it must stay inside it, also
    through symbolic links - a lock or patch from elsewhere would be code nobody reviewed with the stack."""
    top = os.path.realpath(root)
    full = os.path.realpath(os.path.join(top, rel))
    if not full.startswith(top + os.sep):
        raise ConfigError('%s: %s leads outside the repository (to %s, through a symbolic link); keep the file in the '
                          'repository and name it by its path there' % (key, rel, full))
    return read_file(full, top, '%s (%s)' % (key, rel))


def runtime_inputs(d: Deployment, root: str, read_secrets: bool = True) -> Optional[dict]:
    """What gpuhost:runtime.python names outside the stack's config, read and checked at preview: the lock
    (every package pinned with its sha256; sglang at gpuhost:sglang.version; pip, which builds the
    environment in a container that has none), the patches (unified diffs of relative paths) and the index
    password from its file. Plain data for the SGLang unit (the caller hands the password on as a secret);
    None when the stack does not manage the Python environment."""
    rt = d.runtime
    if rt is None or rt.python is None:
        return None
    py = rt.python
    key = 'gpuhost:runtime.python.lock'
    try:
        lock = pylock.parse(read_repo_file(py.lock, root, key))
    except pylock.LockError as e:
        raise ConfigError('%s (%s), line %d: %s' % (key, py.lock, e.line, e)) from None
    sglang = lock.get('sglang')
    if sglang is None:
        raise ConfigError('%s (%s) pins no sglang; add sglang==%s with its hashes (the environment exists to run it)'
                          % (key, py.lock, d.sglang.version))
    if sglang.version != d.sglang.version:
        raise ConfigError('%s (%s) pins sglang==%s, but gpuhost:sglang.version is %s (the unit\'s flags are rendered '
                          'and checked for that version); lock sglang==%s, or set gpuhost:sglang.version: %s' % (
                              key, py.lock, sglang.version, d.sglang.version, d.sglang.version, sglang.version))
    if lock.get('pip') is None:
        raise ConfigError('%s (%s) pins no pip; the environment is built with the pip the lock pins, from the package '
                          'source (the container has none): lock it too (pip-compile --generate-hashes --allow-unsafe, '
                          'or add pip==<version> with its hashes)' % (key, py.lock))
    platform_check(lock, d, key, py.lock)
    patches = []
    for i, rel in enumerate(py.patches):
        pkey = 'gpuhost:runtime.python.patches[%d]' % i
        text = read_repo_file(rel, root, pkey)
        try:
            unidiff.parse(text)
        except unidiff.PatchError as e:
            raise ConfigError('%s (%s): %s' % (pkey, rel, e)) from None
        patches.append({'name': rel, 'text': text})
    password = None
    if not read_secrets:
        pass   # tools/render.py: nothing rendered depends on a secret
    elif py.index is not None and py.index.password is not None:
        password = py.index.password.get_secret_value()
    elif py.index is not None and py.index.password_file is not None:
        pkey = 'gpuhost:runtime.python.index.password_file'
        password = read_file(py.index.password_file, root, pkey).strip()
        try:
            check_password(password)
        except ValueError as e:
            raise ConfigError('%s (%s): the password %s' % (pkey, py.index.password_file, e)) from None
    return {'lock': lock.canonical(), 'lock_sha256': lock.sha256(), 'packages': lock.versions(), 'patches': patches,
            'index_password': password,
            # The wheels `make lock` named under each pin: the preflight judges them against the container's own.
            'wheels': {k: [p.version, [name for name, _ in p.wheels]] for k, p in sorted(lock.pins.items()) if p.wheels}}


def platform_check(lock, d: Deployment, key: str, rel: str, glibc: Optional[str] = None, python: Optional[str] = None,
                   where: Optional[str] = None) -> None:
    """The wheels the lock names (make lock writes them under each pin) against the container: its glibc and Python
    as its template gives them (grammar/distro.py), or as read in the container (glibc, python: the preflight). A
    package none of whose wheels runs there is refused, naming what it needs and what the container has."""
    from grammar import distro, wheeltags
    if glibc is None:
        try:
            release, glibc, python = distro.of_template(d.container.ostemplate)
        except distro.UnknownTemplate:
            return      # the preflight reads the container's own
        where = 'the container (gpuhost:container.ostemplate: %s)' % release
    bad = wheeltags.unfit(lock.pins.values(), python, glibc)
    if bad:
        raise ConfigError('%s (%s): %s' % (key, rel, wheeltags.refusal(bad, where, glibc, python)))


def model_inputs(d: Deployment, root: str) -> Optional[dict]:
    """What gpuhost:model names in the repository, read and checked at preview: the checksum file
    ({file: sha256}). None without gpuhost:model."""
    m = d.model
    if m is None:
        return None
    checksums = None
    if m.checksums is not None:
        key = 'gpuhost:model.checksums'
        try:
            checksums = parse_checksums(read_repo_file(m.checksums, root, key), '%s (%s)' % (key, m.checksums))
        except ValueError as e:
            if isinstance(e, ConfigError):
                raise
            raise ConfigError(str(e)) from None
    return {'checksums': checksums, 'token': m.token.get_secret_value() if m.token is not None else None}


# ---------------------------------------------------------------- where a plain credential was recorded

def backend_url() -> Optional[str]:
    """The state backend the CLI runs against: PULUMI_BACKEND_URL, else the one `pulumi login` chose."""
    url = os.environ.get('PULUMI_BACKEND_URL')
    if url:
        return url
    home = os.environ.get('PULUMI_HOME') or os.path.expanduser('~/.pulumi')
    try:
        with open(os.path.join(home, 'credentials.json')) as f:
            return json.load(f).get('current') or None
    except (OSError, ValueError, AttributeError):
        return None


def project_name() -> Optional[str]:
    """The project's name, from Pulumi.yaml in the project directory (the working directory)."""
    import yaml
    try:
        with open('Pulumi.yaml') as f:
            return (yaml.safe_load(f) or {}).get('name')
    except (OSError, yaml.YAMLError, AttributeError):
        return None


def config_leaf(cfg, full: tuple):
    """The value at full (('host', 'api', 'password'), ('hosts', '1', ...)) of a config map as an update
    record keeps it ({'gpuhost:host': {...}}; a structured value may also be kept as JSON text; a flat key,
    gpuhost:host.api.password as `pulumi config set` without --path writes it, is looked up too)."""
    if not isinstance(cfg, dict):
        return None
    for i in range(len(full), 0, -1):
        key = secret_key(full[:i])
        if key in cfg:
            found = _walk(cfg[key], full[i:])
            if found is not None:
                return found
    return None


def _walk(node, rest: tuple):
    for p in rest:
        if isinstance(node, str):
            try:
                node = json.loads(node)
            except ValueError:
                return None
        if isinstance(node, dict):
            node = node.get(p)
        elif isinstance(node, list) and p.isdigit() and int(p) < len(node):
            node = node[int(p)]
        else:
            return None
    return node


def history_records(root: str, stack: str, full: tuple, value) -> tuple:
    """(the stack's history directory in a file backend, [its update records holding value at full]). The
    file backend writes one <stack>-<time>.history.json per update, refresh and destroy, with the stack's
    config as it was - plain values in plain text."""
    project = project_name()
    dirs = ([os.path.join(root, '.pulumi', 'history', project, stack)] if project else []) + \
        [os.path.join(root, '.pulumi', 'history', stack)]   # (the layout before project-scoped stacks)
    for d in dirs:
        if not os.path.isdir(d):
            continue
        found = []
        for name in sorted(os.listdir(d)):
            if not name.endswith('.history.json'):
                continue
            try:
                with open(os.path.join(d, name)) as f:
                    record = json.load(f)
            except (OSError, ValueError):
                continue
            if isinstance(record, dict) and config_leaf(record.get('config'), full) == value:
                found.append(os.path.join(d, name))
        return d, found
    return dirs[0], []


def plain_text_note(full: tuple, value, stack: Optional[str], dry_run: bool) -> str:
    """Where a credential given as plain text already is (the stack's file; the backend's update history,
    which keeps it for good), and so whether it must be rotated. Never the value itself."""
    file = 'Pulumi.%s.yaml' % stack if stack else 'the stack\'s config file (Pulumi.<stack>.yaml)'
    url = backend_url()
    root = url[len('file://'):].split('?', 1)[0] if url and url.startswith('file://') else None
    if root is None or not stack:
        return ('It is recorded in plain text in %s, and the backend %s keeps each update\'s config in the stack\'s '
                'update history (pulumi stack history): if an update, refresh or destroy ran with it, it is there - '
                'treat it as disclosed and rotate it (a new one where it is used)' % (file, url or 'in use'))
    if root.startswith('~'):
        root = os.path.expanduser(root)
    hist, records = history_records(root, stack, full, value)
    where = []
    if records:
        where.append('%d update record%s of the stack\'s history in the backend %s (%s%s)' % (
            len(records), '' if len(records) == 1 else 's', url, ', '.join(records[:3]),
            ', ...' if len(records) > 3 else ''))
    if not dry_run:
        where.append('this run\'s record, written to %s/ when it ends' % hist)
    if not where:
        return ('It is recorded in plain text in %s (the update history in the backend, %s/, holds no record of '
                'it): if that file was committed or shared, rotate it' % (file, hist))
    return ('It is already recorded in plain text - in %s and in %s - treat it as disclosed: rotate it (a new one '
            'where it is used), delete those records, and make the new one a secret' % (
                file, ' and in '.join(where)))


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
    return fleet_from_data(data, is_config_secret, stack_file_secure_paths(pulumi.get_stack()),
                           stack=pulumi.get_stack(), dry_run=pulumi.runtime.is_dry_run())


def fleet_from_data(data: dict, is_secret, secure_paths: Optional[set], stack: Optional[str] = None,
                    dry_run: bool = True) -> 'Fleet':
    """The fleet from a stack's `gpuhost:*` values ({key without the namespace: value}), its credentials
    refused where they are plain text (is_secret('gpuhost:<key>'), secure_paths: check_secrets) - the
    program's way (fleet_from_pulumi) and the read-only check's (tools/check.py) alike. stack, dry_run: for
    the refusal's account of where a plain credential was recorded (dry_run: no update record of this run)."""
    for prefix, settings in secret_scopes(data):
        check_secrets(settings, is_secret, secure_paths, prefix=prefix, stack=stack, dry_run=dry_run)
    check_secrets(data, is_secret, secure_paths, stack=stack, dry_run=dry_run, paths=FLEET_SECRET_PATHS)
    return parse_fleet(data)


def secret_scopes(data: dict):
    """Where in a stack's `gpuhost:*` values ({key without the namespace: value}) the credentials of SECRET_PATHS
    are looked for: (prefix, settings) for the shared settings (every key but gpuhost:hosts and
    gpuhost:rollout), then for each host entry of gpuhost:hosts (prefix ('hosts', '<i>'))."""
    yield (), {k: v for k, v in data.items() if k not in FLEET_KEYS}
    hosts = data.get('hosts')
    if isinstance(hosts, list):
        for i, entry in enumerate(hosts):
            if isinstance(entry, dict):
                yield ('hosts', str(i)), entry


def load_stack(root: str) -> tuple:
    """What the program needs from the running stack's config before it builds anything, for preview
    and up alike: (fleet, each host's (ssh connection, api, runtime, model) inputs - the files the config
    names read and parsed against `root`, the project directory; runtime: runtime_inputs(), model:
    model_inputs() - and the warnings to show, one line each).
    Raises ConfigError with the message the operator sees."""
    fleet = fleet_from_pulumi()
    fleet_lock_files(fleet, root)
    inputs, warnings = [], {}
    for h in fleet.hosts:
        try:
            inputs.append(connection_inputs(h.deployment, root) + (runtime_inputs(h.deployment, root),
                                                                   model_inputs(h.deployment, root)))
        except ConfigError as e:
            raise (prefixed(e, 'host %s (gpuhost:hosts[%d])' % (h.name, h.index)) if fleet.is_fleet else e)
        for warning in h.deployment.warnings:
            warnings.setdefault(warning, []).append(h.name)
    # The same warning for several hosts of a fleet is said once, naming them.
    lines = [(('host%s %s: ' % ('s' if len(names) > 1 else '', ', '.join(names))) if fleet.is_fleet else '') + warning
             for warning, names in warnings.items()]
    return fleet, inputs, lines


def fleet_lock_files(fleet: Fleet, root: str) -> None:
    """The TLS files gpuhost:rollout.fleet_lock names, read at preview: one that cannot be read is refused now, naming
    its key, rather than at the first step that would take a host down (the plugin reads them again there)."""
    lock = fleet.rollout.fleet_lock
    for key in ('ca_file', 'cert_file', 'key_file'):
        path = getattr(lock, key) if lock is not None else None
        if path:
            read_file(path, root, 'gpuhost:rollout.fleet_lock.%s' % key)


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
    doc = _stack_file(stack)
    return None if doc is None else secure_paths_of(doc.get('config'))


def _stack_file(stack: str) -> Optional[dict]:
    """Pulumi.<stack>.yaml in the working directory (the project's), None if it cannot be read as a mapping."""
    import yaml
    try:
        with open('Pulumi.%s.yaml' % stack.split('/')[-1]) as f:
            doc = yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError):
        return None
    return doc if isinstance(doc, dict) else None


def _is_secure(node) -> bool:
    return isinstance(node, dict) and set(node) == {'secure'}


def secure_paths_of(cfg) -> set:
    """Paths of the `secure:` leaves of a stack file's config mapping, under the gpuhost namespace."""
    out = set()

    def walk(node, path):
        if _is_secure(node):
            out.add(path)
        elif isinstance(node, dict):
            for k, v in node.items():
                walk(v, path + (str(k),))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, path + (str(i),))
    for key, value in (cfg.items() if isinstance(cfg, dict) else ()):
        ns, _, name = str(key).partition(':')
        if ns == 'gpuhost':
            walk(value, (name,))
    return out


def secret_key(full: tuple) -> str:
    """gpuhost:host.api.password, gpuhost:hosts[1].host.api.password: the key a credential's path names."""
    return 'gpuhost:' + _loc([int(p) if p.isdigit() else p for p in full])


def secret_fix(key: str, flat_key: Optional[str] = None) -> str:
    """The commands that make the credential at `key` a secret (flat_key: the stack file has it under this flat
    key, as `pulumi config set` without --path writes it - the program reads only the structured one)."""
    return 'pulumi config rm %s && pulumi config set --secret --path %s%s' % (
        flat_key or '--path ' + key, key, ' < ~/.ssh/<key>' if key.endswith('private_key') else '')


def plain_secrets(data: dict, is_secret, secure_paths: Optional[set], prefix: tuple = (),
                  paths: tuple = SECRET_PATHS) -> list:
    """[(path, value)] of the credentials (SECRET_PATHS) in `data` written as plain text (is_secret('gpuhost:<key>'):
    the engine's flag of a top-level key; secure_paths: the stack file's secure: leaves, when it was read)."""
    out = []
    for path in paths:
        node = data
        for p in path:
            node = node.get(p) if isinstance(node, dict) else None
        if node is None:
            continue
        full = tuple(prefix) + path
        plain = not is_secret('gpuhost:' + full[0])
        if not plain and secure_paths is not None:
            plain = not any(full[:len(s)] == s for s in secure_paths)
        if plain:
            out.append((full, node))
    return out


def check_secrets(data: dict, is_secret, secure_paths: Optional[set], prefix: tuple = (), stack: Optional[str] = None,
                  dry_run: bool = True, paths: tuple = SECRET_PATHS) -> None:
    """A password or key written as plain config ends up in plain text in the state: refuse it, saying where
    it is recorded already (plain_text_note). `prefix`: where `data` sits in the config (('hosts', '1') for a
    fleet's host entry)."""
    for full, node in plain_secrets(data, is_secret, secure_paths, prefix, paths):
        key = secret_key(full)
        raise ConfigError('%s is set as plain text, so it would be stored unencrypted in the stack\'s config and '
                          'state. %s. Make it a secret: %s' % (key, plain_text_note(full, node, stack, dry_run),
                                                              secret_fix(key)))


# ---------------------------------------------------------------- before the CLI runs (tools/plain_secrets.py)

def _flat_path(name: str) -> tuple:
    """host.api.password -> ('host', 'api', 'password'); hosts[1].host.api.password -> ('hosts', '1', 'host', ...)."""
    import re
    return tuple(p for p in re.split(r'[.\[\]]+', name) if p)


def _flat_plain(parts: tuple, value) -> list:
    """[(path, value)] of the credentials a flat key (parts: its path) holds in plain text: at its path, or inside
    its value, or - the key deeper than a credential's path - under it."""
    if parts[0] == 'hosts':
        patterns = [('hosts', parts[1]) + p for p in SECRET_PATHS] if len(parts) > 1 and parts[1].isdigit() else []
    else:
        patterns = list(FLEET_SECRET_PATHS) if parts[0] == 'rollout' else list(SECRET_PATHS)
    out = []
    for s in patterns:
        if parts[:len(s)] == s:
            node = value
        elif s[:len(parts)] == parts:
            node = value
            for p in s[len(parts):]:
                if _is_secure(node):
                    break
                if isinstance(node, str):
                    try:
                        node = json.loads(node)
                    except ValueError:
                        node = None
                node = node.get(p) if isinstance(node, dict) else None
        else:
            continue
        if node is not None and not _is_secure(node):
            out.append((s, node))
    return out


def stack_file_plain_secrets(stack: str, extra: tuple = ()) -> list:
    """The credentials Pulumi.<stack>.yaml (in the working directory) holds in plain text, read the program's way
    (fleet_from_pulumi: each gpuhost:<key>'s value, JSON text decoded; credentials where SECRET_PATHS and
    secret_scopes look, refused unless under a secure: leaf) - and as flat keys (gpuhost:host.api.password:
    `pulumi config set` without --path), which the program does not read but an update records all the same.
    extra: [(key, value)] the CLI would add from its flags (pulumi up -c key=value). No passphrase needed:
    nothing is decrypted. [(config key, path, value, how)], how: 'nested', 'flat' or 'flag'."""
    doc = _stack_file(stack)
    cfg = doc.get('config') if doc is not None else None
    cfg = cfg if isinstance(cfg, dict) else {}
    data, flat = {}, []
    for key, value in cfg.items():
        ns, _, name = str(key).partition(':')
        if ns != 'gpuhost' or not name:
            continue
        parts = _flat_path(name)
        if len(parts) == 1 and parts[0] == name:
            if isinstance(value, str):
                try:
                    value = json.loads(value)
                except ValueError:
                    pass
            data[name] = value
        elif parts:
            flat.append((str(key), parts, value, 'flat'))
    for key, value in extra:
        ns, _, name = str(key).partition(':')
        if ns == 'gpuhost' and _flat_path(name):
            flat.append((str(key), _flat_path(name), value, 'flag'))
    out = []
    secure = secure_paths_of(cfg)
    for prefix, settings in secret_scopes(data):
        out += [(secret_key(full), full, node, 'nested')
                for full, node in plain_secrets(settings, lambda key: True, secure, prefix)]
    out += [(secret_key(full), full, node, 'nested')
            for full, node in plain_secrets(data, lambda key: True, secure, (), FLEET_SECRET_PATHS)]
    for key, parts, value, how in flat:
        out += [(key, full, node, how) for full, node in _flat_plain(parts, value)]
    return out
