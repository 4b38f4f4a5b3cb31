"""The provider instance's configuration, checked by the plugin's CheckConfig before any resource's call: the host's
SSH connection and its Proxmox API login, with the grammars the config package applies to the same values when it
reads the stack (config/host.py, config/values.py). A refusal names the configuration key, the stack setting it
comes from and the fix; a secret's value is never shown.

A credential the stack keeps in a file is in the configuration by its path (config/load.py provider_access): the
plugin reads it here, at every Configure - `refresh` and `destroy` without the program too."""

from __future__ import annotations

from typing import Annotated, Optional

from pydantic import AfterValidator, ConfigDict, Field, ValidationError

from transport.errors import scrub
from transport.operator import OperatorError
from config.values import ConfigError, HostName, Model, PosixUser, PveUser, check_api_password, check_ca, \
    check_private_key, parse_host_key, show

# Where each key comes from in the stack (config/load.py connection_inputs): what the operator fixes.
STACK_KEYS = {
    'connection': 'gpuhost:host.ssh', 'api': 'gpuhost:host.api',
    'connection.host': 'gpuhost:host.address', 'connection.port': 'gpuhost:host.ssh.port',
    'connection.user': 'gpuhost:host.ssh.user',
    'connection.private_key': 'gpuhost:host.ssh.private_key (or private_key_file)',
    'connection.host_key': 'gpuhost:host.ssh.host_key (or host_key_file)',
    'connection.timeout': 'gpuhost:host.ssh.connect_timeout',
    'connection.command_timeout': 'gpuhost:host.ssh.command_timeout',
    'api.host': 'gpuhost:host.api.address (or gpuhost:host.address)', 'api.port': 'gpuhost:host.api.port',
    'api.user': 'gpuhost:host.api.user', 'api.password': 'gpuhost:host.api.password (or password_file)',
    'api.ca_cert': 'gpuhost:host.api.ca_cert (or ca_file)', 'api.timeout': 'gpuhost:host.api.timeout',
    'connection.private_key_file': 'gpuhost:host.ssh.private_key_file',
    'api.password_file': 'gpuhost:host.api.password_file',
}
# The credentials a configuration may name by file: (part, key, file key, stamp key).
BY_FILE = (('connection', 'private_key', 'private_key_file', 'private_key_stamp'),
           ('api', 'password', 'password_file', 'password_stamp'))
SECRET_KEYS = ('private_key', 'password')


def _checked(check, key: str):
    """A config.values check (ConfigError "<key>: <problem and fix>") as a validator of the same value here: the
    problem and the fix, the stack key in front of them left to _reason()."""
    def validate(value: str) -> str:
        try:
            check(value, key)
        except ConfigError as e:
            text = str(e)
            raise ValueError(text[len(key) + 2:] if text.startswith(key + ': ') else text) from None
        return value
    return AfterValidator(validate)


class _Strict(Model):
    model_config = ConfigDict(frozen=True, extra='forbid', strict=True)


class _Endpoint(_Strict):
    host: HostName
    port: int = Field(ge=1, le=65535)
    timeout: Optional[float] = Field(None, gt=0, le=600)


class Connection(_Endpoint):
    user: PosixUser
    private_key: Annotated[str, _checked(check_private_key, 'gpuhost:host.ssh.private_key')]
    host_key: Annotated[str, AfterValidator(parse_host_key)]
    command_timeout: Optional[float] = Field(None, ge=5, le=86400)
    private_key_file: Optional[str] = None
    private_key_stamp: Optional[str] = None


class Login(_Endpoint):
    user: PveUser
    password: Annotated[str, _checked(check_api_password, 'gpuhost:host.api.password')]
    ca_cert: Annotated[str, _checked(check_ca, 'gpuhost:host.api.ca_cert')]
    password_file: Optional[str] = None
    password_stamp: Optional[str] = None


class HostAccess(_Strict):
    # What else the engine may put into a provider's inputs (its version, keys of its own) is not ours to judge.
    model_config = ConfigDict(frozen=True, extra='ignore', strict=True)
    connection: Connection
    api: Login


class Unreadable(OperatorError):
    """A credential's file that cannot be read: the operator's error, one line (Configure raises it too)."""

    def __init__(self, key: str, text: str):
        super().__init__(text)
        self.key = key


def resolved(config: dict) -> dict:
    """The configuration with each credential named by file read from it (the files' text, as the serving classes
    take it). Unreadable: a file that cannot be read, naming it and the stack setting."""
    from config.load import read_file
    config = dict(config)
    for part, key, file_key, _ in BY_FILE:
        section = config.get(part)
        if not isinstance(section, dict) or not isinstance(section.get(file_key), str) or key in section:
            continue
        where = STACK_KEYS['%s.%s' % (part, file_key)]
        try:
            text = read_file(section[file_key], '/', '%s (%s)' % (where, section[file_key]))
        except ConfigError as e:
            raise Unreadable('%s.%s' % (part, file_key), (
                '%s; the gpuhost provider reads it at every run. `refresh` and `destroy` use the path the state holds: '
                'put the file back there, or - moved for good - set %s to its new path and run `pulumi up` once '
                'without --refresh' % (e, where))) from None
        config[part] = dict(section, **{key: text.strip() if key == 'password' else text})
    from transport.errors import remember
    remember(config)
    return config


def problems(config: dict) -> list:
    """[(key, reason)] for a configuration (plain values, integral numbers as ints); [] when it is whole. A value
    the engine does not know yet (a preview's unknown) is not judged. A credential named by file is read."""
    from pulumi.runtime import rpc
    if any(v is rpc.UNKNOWN for v in config.values()):
        return []
    for part in ('connection', 'api'):
        if isinstance(config.get(part), dict) and any(v is rpc.UNKNOWN for v in config[part].values()):
            return []
    try:
        config = resolved(config)
    except Unreadable as e:
        return [(e.key, scrub(str(e)))]
    try:
        HostAccess.model_validate(config)
        return []
    except ValidationError as e:
        return [_reason(err) for err in e.errors(include_url=False)]


def _reason(err) -> tuple:
    loc = '.'.join(str(p) for p in err['loc'])
    where = STACK_KEYS.get(loc)
    came = ' (from %s)' % where if where else ''
    kind, msg = err['type'], err['msg']
    if msg.startswith('Value error, '):
        msg = msg[len('Value error, '):]
    if kind == 'missing':
        text = '%s is required and missing%s: the program sets it from the stack; set %s and run `pulumi up`' % (
            loc, came, where or 'it')
    elif kind == 'extra_forbidden':
        text = ('%s is not a key the gpuhost provider takes (the program and the provider are of different '
                'releases?)' % loc)
    elif any(p in SECRET_KEYS for p in err['loc']):
        text = '%s%s: a secret value (not shown) that is not valid: %s' % (loc, came, msg)
    elif kind == 'value_error':
        text = '%s%s: %s' % (loc, came, msg)
    else:
        value = err.get('input')
        text = '%s%s: %s is not valid: %s' % (loc, came, show(value) if isinstance(value, (str, int, float))
                                              else 'a value of type %s' % type(value).__name__, msg)
    return loc, scrub(text)
