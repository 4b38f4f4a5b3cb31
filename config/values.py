"""What one value may be: the grammar of every string the config lets reach a file, a command, a path, a
Proxmox property string or the kernel command line, as pydantic types; the key and certificate checks.
Each validator returns the value or raises ValueError with "<value> is not <what>; <fix>" - the config
key is put in front by config/errors.py from pydantic's location of the error."""

from __future__ import annotations

import ipaddress
import os
import re
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from grammar import systemd
from grammar.gpu import BDF_RE, PCI_ID_RE


class ConfigError(ValueError):
    """A refused configuration. str() is the operator-facing message."""


class Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra='forbid', strict=True)


# Each returns the value or raises ValueError with "<value> is not <what>; <fix>" - the config key
# is put in front by format_errors() from pydantic's location of the error.

def show(value, limit=80) -> str:
    """A value as the operator wrote it, safe to print (control characters escaped, long values cut)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 4] + '...' + text[-1]


def no_control(value: str) -> str:
    """Control characters (C0, C1), line and paragraph separators and invisible format characters
    (bidi overrides, zero-width) never belong in a value that reaches a file, a command or a log."""
    import unicodedata
    bad = sorted({c for c in value if unicodedata.category(c) in ('Cc', 'Cf', 'Cs', 'Zl', 'Zp')})
    if bad:
        raise ValueError('%s contains the control character%s %s; a value must stay on one line and hold no '
                         'control or invisible characters - remove %s' % (
                             show(value), 's' if len(bad) > 1 else '', ', '.join(repr(c) for c in bad),
                             'them' if len(bad) > 1 else 'it'))
    return value


def grammar(pattern: str, what: str, example: str, maxlen: int = 255):
    rx = re.compile(pattern)

    def check(value: str) -> str:
        no_control(value)
        if len(value) > maxlen or not rx.match(value):
            raise ValueError('%s is not %s; write e.g. %s' % (show(value), what, example))
        return value
    return AfterValidator(check)


DNS_LABEL = r'(?:[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}[A-Za-z0-9])?)'


DNS_NAME = r'^%s(?:\.%s)*$' % (DNS_LABEL, DNS_LABEL)


def host_or_ip(value: str) -> str:
    no_control(value)
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    if len(value) > 253 or not re.match(DNS_NAME, value):
        raise ValueError('%s is neither a DNS name nor an IP address; write e.g. pve-gpu01.example.internal'
                         % show(value))
    return value


def abs_path(value: str) -> str:
    """An absolute, normalised path of plain characters (it reaches PATH= and ExecStart=)."""
    no_control(value)
    if not value.startswith('/') or not re.match(r'^/[A-Za-z0-9._+@/\-]*$', value):
        raise ValueError('%s is not an absolute path of letters, digits and ._+@-; write e.g. /opt/sglang/venv'
                         % show(value))
    parts = value.split('/')[1:]
    if any(p in ('.', '..') for p in parts) or '//' in value or (len(value) > 1 and value.endswith('/')):
        raise ValueError('%s is not a normalised path (no ".", "..", "//" or trailing "/"); write e.g. %s' % (
            show(value), os.path.normpath(value)))
    return value


def model_ref(value: str) -> str:
    """SGLang's --model-path: a directory in the container or a hub repository id."""
    no_control(value)
    if value.startswith('/'):
        return abs_path(value)
    if not re.match(r'^[A-Za-z0-9][A-Za-z0-9._\-]*/[A-Za-z0-9][A-Za-z0-9._\-]*$', value) or '..' in value:
        raise ValueError('%s is neither an absolute path nor a hub id (org/name); write e.g. '
                         '/models/Qwen3.5-122B-A10B' % show(value))
    return value


# Environment names that carry credentials (HF_TOKEN, AWS_SECRET_ACCESS_KEY, WANDB_API_KEY, ...).
# Whole words between underscores, so TOKENIZERS_PARALLELISM or SGLANG_MAX_TOKENS pass.
SECRET_ENV_RE = re.compile(r'(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|PASS|CREDENTIALS?)(_|$)|(API|ACCESS|PRIVATE|SECRET)_?KEY',
                           re.I)


def unit_name(value: str) -> str:
    no_control(value)
    if not systemd.valid_unit_name(value):
        raise ValueError('%s is not a systemd service name (letters, digits and ":_.-", ending in .service, no '
                         '"/" and no template "@"); write e.g. sglang-qwen.service' % show(value))
    if value[:1] in ('-', '.', '\\'):
        raise ValueError('%s starts with %r: a command line would read it as an option (or a hidden file); start '
                         'it with a letter or digit, e.g. sglang-qwen.service' % (show(value), value[:1]))
    return value


def cpu_list(value: str) -> str:
    cpus_of(value)
    return value


def cpus_of(value: str) -> set:
    no_control(value)
    if not re.match(r'^\d+(-\d+)?(,\d+(-\d+)?)*$', value):
        raise ValueError('%s is not a CPU list; write e.g. 0-31,64-95' % show(value))
    out = set()
    for part in value.split(','):
        lo, _, hi = part.partition('-')
        lo, hi = int(lo), int(hi or lo)
        if hi < lo:
            raise ValueError('%s: range %s runs backwards; write %d-%d' % (show(value), part, hi, lo))
        if hi >= 16384:
            raise ValueError('%s: CPU %d is beyond any host; read the list with cat /sys/devices/system/node/node<N>/cpulist' % (show(value), hi))
        both = out & set(range(lo, hi + 1))
        if both:
            raise ValueError('%s names CPU %d twice; give each CPU once' % (show(value), min(both)))
        out.update(range(lo, hi + 1))
    return out


def ipv4_interface(value: str) -> str:
    no_control(value)
    try:
        iface = ipaddress.ip_interface(value)
    except ValueError:
        raise ValueError('%s is not an address with prefix; write e.g. 10.0.0.20/24' % show(value)) from None
    if '/' not in value:
        raise ValueError('%s has no prefix length; write e.g. %s/24' % (show(value), value))
    if iface.version != 4 or str(iface) != value:
        raise ValueError('%s is not an IPv4 address with prefix as Proxmox writes it; write e.g. 10.0.0.20/24'
                         % show(value))
    return value


def ipv4(value: str) -> str:
    no_control(value)
    try:
        addr = ipaddress.ip_address(value)
    except ValueError:
        raise ValueError('%s is not an IP address; write e.g. 10.0.0.1' % show(value)) from None
    if addr.version != 4 or str(addr) != value:
        raise ValueError('%s is not an IPv4 address; write e.g. 10.0.0.1' % show(value))
    return value


def nameservers(value: str) -> str:
    no_control(value)
    parts = value.split(' ')
    for p in parts:
        try:
            ipaddress.ip_address(p)
        except ValueError:
            raise ValueError('%s is not a space-separated list of IP addresses; write e.g. "10.0.0.53 10.0.0.54"'
                             % show(value)) from None
    return value


def bind_address(value: str) -> str:
    no_control(value)
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise ValueError('%s is not an IP address to listen on; write 0.0.0.0 (all) or the container\'s address'
                         % show(value)) from None
    return value


def env_key(value: str) -> str:
    no_control(value)
    if not re.match(r'^[A-Za-z_][A-Za-z0-9_]*$', value) or len(value) > 128:
        raise ValueError('%s is not an environment variable name (letters, digits, "_", not starting with a '
                         'digit); write e.g. NCCL_DEBUG' % show(value))
    return value


def text(value: str) -> str:
    return no_control(value)


Text = Annotated[str, AfterValidator(text)]


HostName = Annotated[str, AfterValidator(host_or_ip)]


NodeName = Annotated[str, grammar(r'^[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}[A-Za-z0-9])?$', 'a Proxmox node name',
                                  'pve-gpu01 (hostname -s on the host)', 63)]


DnsName = Annotated[str, grammar(DNS_NAME, 'a DNS name (what Proxmox accepts for a guest name)', 'sglang', 253)]


Bridge = Annotated[str, grammar(r'^[A-Za-z][A-Za-z0-9_.\-]{0,14}$', 'a Linux bridge name', 'vmbr0', 15)]


StorageId = Annotated[str, grammar(r'^[a-z][a-z0-9\-_.]*[a-z0-9]$', 'a Proxmox storage id', 'local-lvm', 64)]


Template = Annotated[str, grammar(r'^[a-z][a-z0-9\-_.]*[a-z0-9]:vztmpl/[A-Za-z0-9_+\-][A-Za-z0-9._+\-]*'
                                  r'\.tar\.(?:gz|xz|zst)$', 'a container template volume id',
                                  'local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst')]


PosixUser = Annotated[str, grammar(r'^[a-z_][a-z0-9_\-]{0,31}$', 'a user name', 'root', 32)]


PveUser = Annotated[str, grammar(r'^[A-Za-z0-9._\-]+@[A-Za-z0-9._\-]+$', 'a Proxmox user (user@realm)', 'root@pam',
                                 128)]


Path = Annotated[str, AfterValidator(abs_path)]


FilePath = Annotated[str, grammar(r'^[^\x00-\x1f\x7f]+$', 'a file path', '~/.ssh/id_ed25519', 4096)]


CpuList = Annotated[str, AfterValidator(cpu_list)]


Bdf = Annotated[str, grammar(BDF_RE.pattern, 'a PCI address as `lspci -D` shows it (domain:bus:device.function, '
                                              'lowercase hex)',
                             '0000:01:00.0', 12)]


PciId = Annotated[str, grammar(PCI_ID_RE.pattern, 'a vendor:device ID as lspci -nn shows it', '10de:2bb5', 9)]


VmId = Annotated[int, Field(ge=100, le=999999999)]


# A PCI resource mapping id is Proxmox's pve-configid (a letter, then letters, digits, "-", "_"); the
# program appends the hostpci index, so the prefix may be one letter and must leave room for the digits.
MappingPrefix = Annotated[str, grammar(r'^[A-Za-z][A-Za-z0-9_\-]*$', 'a Proxmox mapping id prefix (a letter, '
                                       'then letters, digits, "-" or "_")', 'gpuhost-300-gpu', 60)]


KEY_TYPE_RE = re.compile(r'^(ssh-(ed25519|rsa|dss)|ecdsa-sha2-nistp(256|384|521)|sk-[a-z0-9@.\-]+)$')


def parse_host_key(value: str) -> str:
    """'type base64 [comment]' -> 'type base64', checked as paramiko will use it when pinning. The line as
    ssh-keyscan prints it (and known_hosts holds it), 'host type base64', is taken too: the host field goes."""
    import base64
    import binascii
    no_control(value)
    parts = value.split()
    if len(parts) >= 3 and not KEY_TYPE_RE.match(parts[0]) and KEY_TYPE_RE.match(parts[1]):
        parts = parts[1:]   # ssh-keyscan's "<host> <type> <key>" (or "[host]:port ...", a hashed |1|... name)
    fix = 'give the host\'s "ssh-ed25519 AAAA..." line (ssh-keyscan -t ed25519 <host>, verified on the console)'
    if len(parts) < 2 or not KEY_TYPE_RE.match(parts[0]):
        raise ValueError('%s is not a public key line; %s' % (show(value, 60), fix))
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError('%s: the key is not valid base64 (cut short or mistyped?); %s' % (
            show(value, 60), fix)) from None
    import struct
    try:
        n = struct.unpack('>I', blob[:4])[0]
        inner = blob[4:4 + n].decode('ascii')
    except (struct.error, UnicodeDecodeError):
        inner = None
    if inner != parts[0]:
        raise ValueError('%s: the key data is a %s key, not %s (or it is damaged); %s' % (
            show(value, 60), inner or 'malformed', parts[0], fix))
    import paramiko
    try:
        ok = paramiko.PKey.from_type_string(parts[0], blob).asbytes() == blob
    except Exception:  # noqa: BLE001 - paramiko raises several types for a malformed key blob
        ok = False
    if not ok:
        raise ValueError('%s: not a complete %s key (cut short or damaged); %s' % (show(value, 60), parts[0], fix))
    return ' '.join(parts[:2])


def check_private_key(text_: str, key: str) -> None:
    """Parse the client key without ever echoing it."""
    import io
    import paramiko
    for cls in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        try:
            cls.from_private_key(io.StringIO(text_))
            return
        except paramiko.PasswordRequiredException:
            raise ConfigError('%s: the private key is encrypted; give an unencrypted key (this program cannot '
                              'prompt for its passphrase)' % key) from None
        except (paramiko.SSHException, ValueError, IndexError, TypeError):
            continue
    raise ConfigError('%s: not an ed25519, ECDSA or RSA private key in OpenSSH or PEM form (the value is a secret '
                      'and not shown); set it with: pulumi config set --secret --path %s < ~/.ssh/<key>'
                      % (key, key))


def check_api_password(password: str, key: str) -> None:
    """root@pam's password as the API login takes it, never echoed."""
    if not password or any(ord(c) < 0x20 for c in password):
        raise ConfigError('%s: empty or holds control characters (not shown)' % key)


def check_ca(pem: str, key: str) -> None:
    from cryptography import x509
    try:
        certs = x509.load_pem_x509_certificates(pem.encode())
    except ValueError:
        certs = []
    if not certs:
        raise ConfigError('%s: not a PEM certificate (-----BEGIN CERTIFICATE----- ...); copy '
                          '/etc/pve/pve-root-ca.pem from the host' % key)


ADOPT_DOC = ('Take the guest that already runs with this vmid on host.node into the stack as it is, instead of '
             'creating one (a deployment made before this program): preview names it and every difference `up` will '
             'converge; a difference Proxmox cannot change in place is refused. Only while the stack does not hold '
             'the guest yet; harmless afterwards')

PROTECT_DOC = ('Pulumi protect: while true, a change that would delete or replace this guest (and its disk) is '
               'refused at preview. Set false for one `pulumi up` to allow it')

# Query parameters that carry a credential in the URLs operators paste (signed links, tokens).
CREDENTIAL_QUERY_RE = re.compile(r'(^|[?&])(token|key|sig|signature|password|access_token)=', re.I)


def http_url(value: str, what: str, example: str, credentials: str) -> str:
    """An http(s) URL of a service on the operator's network (a package index, a model mirror): a host or
    an address, an optional port, a path - no credentials (user:password@ or a token in the query: they would
    sit in plain text in the config, the state and the host's process list; `credentials` says where they go
    instead), no query or fragment, no character a URL does not carry. Returns it without a trailing /."""
    no_control(value)
    parts = urlsplit(value)
    if parts.scheme not in ('https', 'http') or not parts.netloc:
        raise ValueError('%s is not %s; write e.g. %s' % (show(value), what, example))
    if '@' in parts.netloc or CREDENTIAL_QUERY_RE.search(parts.query):
        raise ValueError('holds credentials (user:password@ or a token in the query), which would be stored in plain '
                         'text in the stack\'s config and state and reach the host\'s process list; %s' % credentials)
    if parts.query or parts.fragment or any(c in value for c in ' "\'\\<>'):
        raise ValueError('%s has a query, a fragment or characters a URL does not carry; write e.g. %s'
                         % (show(value), example))
    try:
        host = parts.hostname or ''
        parts.port
    except ValueError:
        raise ValueError('%s has an invalid port; write e.g. %s' % (show(value), example)) from None
    host_or_ip(host)
    return value.rstrip('/')
