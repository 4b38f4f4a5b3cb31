"""gpuhost:model - the weights SGLang serves: where they live on the host (a directory, e.g. a ZFS dataset's
mountpoint), how the container sees them (a Proxmox bind mount point, mpN, read-only), and which model and
revision they are - verified against the model's own files (config.json, model.safetensors.index.json and
every shard it names, with sizes; sha256 from a checksum file kept in the repository) before every start
(resources/model.py).

Optional: without gpuhost:model the operator provides gpuhost:sglang.model_path in the container by hand."""

from __future__ import annotations

import posixpath
import re
from typing import Annotated, Optional


from pydantic import AfterValidator, Field, SecretStr, field_validator, model_validator

from config.runtime import RepoPath
from config.values import Model, Path, grammar, http_url, no_control, show

ModelId = Annotated[str, grammar(r'^[A-Za-z0-9][A-Za-z0-9._\-]{0,95}$', 'a model id (letters, digits, ._-)',
                                 'Qwen3.5-122B-A10B', 96)]

# Names that move: a deployment names what it verified, so a branch is not a revision.
MOVING = ('main', 'master', 'head', 'latest', 'dev', 'develop', 'trunk', 'stable', 'nightly')


def revision(value: str) -> str:
    """A commit (40 lowercase hex digits) or a tag; never a branch (it moves) or an abbreviated commit."""
    no_control(value)
    if re.match(r'^[0-9a-f]{40}$', value):
        return value
    if re.match(r'^[0-9a-fA-F]{40}$', value):
        raise ValueError('%s is a commit in capitals; git and the hub write it in lowercase: %s' % (
            show(value), value.lower()))
    if re.match(r'^[0-9a-fA-F]{7,39}$', value) and not re.match(r'^\d+$', value):
        raise ValueError('%s looks like an abbreviated commit; give all 40 hex digits (git rev-parse %s, or the '
                         'commit on the model page\'s "Files and versions")' % (show(value), value))
    if value.lower() in MOVING:
        raise ValueError('%s is a branch, which moves; give the commit (40 hex digits) or a tag the weights were '
                         'published under, e.g. v1.0' % show(value))
    if not re.match(r'^[A-Za-z0-9][A-Za-z0-9._+\-]{0,127}$', value) or '..' in value or value.endswith('.lock'):
        raise ValueError('%s is not a commit (40 lowercase hex digits) or a tag (letters, digits, ._+-); write e.g. '
                         'v1.0 or the commit\'s 40 hex digits' % show(value))
    return value


Revision = Annotated[str, AfterValidator(revision)]

HF_RE = re.compile(r'^hf://([A-Za-z0-9][A-Za-z0-9._\-]{0,95})/([A-Za-z0-9][A-Za-z0-9._\-]{0,95})(?:@(.+))?$')


def model_source(value: str) -> str:
    """hf://<org>/<repo>[@<revision>], or the http(s) URL of a mirror directory holding the model's files -
    never with credentials in it (they would sit in plain text in the config, the state and the host's logs)."""
    no_control(value)
    if value.startswith('hf://'):
        m = HF_RE.match(value)
        if not m or '..' in value:
            raise ValueError('%s is not hf://<org>/<repo>[@<revision>]; write e.g. hf://Qwen/Qwen3.5-122B-A10B'
                             % show(value))
        if m.group(3):
            revision(m.group(3))
        return value
    if not value.startswith(('http://', 'https://')):
        raise ValueError('%s is not a source: write hf://<org>/<repo> (Hugging Face, token in gpuhost:model.token) '
                         'or the http(s) URL of a mirror directory holding the model\'s files' % show(value))
    return http_url(value, 'the http(s) URL of a mirror directory holding the model\'s files',
                    'https://mirror.example.internal/models/Qwen3.5-122B-A10B',
                    'give the URL without them and the token as a secret: pulumi config set --secret --path '
                    'gpuhost:model.token')

# gpuhost:model.connections: at most this many files at once (the hub's own client and GPUStack use 8).
MAX_CONNECTIONS = 32
# gpuhost:model.max_bytes_per_s: at least 1 MB/s (a smaller number is a unit mistake: bits, or MB meant).
MIN_RATE = 1000000

# Where a container path must not be: the container's own system (a read-only bind there breaks it).
SYSTEM_DIRS = ('/', '/bin', '/boot', '/dev', '/etc', '/lib', '/lib64', '/opt', '/proc', '/root', '/run', '/sbin',
               '/sys', '/tmp', '/usr', '/var', '/home', '/srv')

# Not even below these: the container's own system (a read-only bind there breaks it) ...
MOUNT_BELOW = ('/proc', '/sys', '/dev', '/etc', '/usr', '/bin', '/sbin', '/lib', '/lib64', '/boot', '/var', '/run',
               '/tmp', '/root')
# ... and the host's: its system, Proxmox's configuration (pmxcfs) and guest storage.
STORAGE_BELOW = ('/proc', '/sys', '/dev', '/etc', '/usr', '/bin', '/sbin', '/lib', '/lib64', '/boot', '/run',
                 '/var/lib/vz', '/var/lib/pve-cluster', '/var/lib/dpkg', '/var/lib/apt')


def under(path: str, dirs) -> bool:
    return any(path == d or path.startswith(d + '/') for d in dirs)


class ModelWeights(Model):
    id: ModelId = Field(description='The model, as its files and the preview line name it: Qwen3.5-122B-A10B')
    revision: Revision = Field(description='The commit (40 hex digits) or tag of the weights on the host')
    storage: Path = Field(description='The directory on the host that holds the model directories (e.g. a ZFS '
                                      'dataset\'s mountpoint, /rpool/models); must exist before `up`')
    mount: Path = Field('/models', description='Where the container sees gpuhost:model.storage; '
                                               'gpuhost:sglang.model_path must be inside it')
    mp: int = Field(0, ge=0, le=255, description='The N of the container\'s mpN key for the mount')
    writable: bool = Field(False, description='Mount read-write (ro=0). Refused unless set: SGLang only reads the '
                                              'weights, and a container that can write them can corrupt them for '
                                              'the next start')
    checksums: Optional[RepoPath] = Field(None, description='sha256sum-format file in the repository (from the '
                                          'model\'s source): every shard it names is checked against it; read at '
                                          'preview')
    source: Optional[Annotated[str, AfterValidator(model_source)]] = Field(
        None, description='Where `up` downloads what is missing from: hf://<org>/<repo> or a mirror\'s http(s) URL '
                          '(on the host, resumable, into a staging directory, moved into place once verified)')
    token: Optional[SecretStr] = Field(None, description='Bearer token for the source (a Hugging Face token); a '
                                       'secret, handed to the host on stdin and kept in a root-only file only while '
                                       'the download runs')
    timeout_s: Optional[float] = Field(None, ge=60, le=30 * 86400, description='Longest the download and '
                                       'verification job may run on the host (none by default: 244 GB take what the '
                                       'uplink allows; the stall detector catches a download that stopped moving)')
    stall_timeout_s: float = Field(600.0, ge=5, le=86400, description='The download or verification job is stopped '
                                   'and the step fails when no byte was downloaded or hashed for this long')
    rehash_days: Optional[float] = Field(30.0, ge=1, le=3650, description='A shard\'s sha256 is computed again when '
                                         'the cached one is older than this (bit rot changes no file metadata); null '
                                         'for never. The oldest sum\'s time is in the model\'s metrics')
    connections: int = Field(8, description='How many files the host downloads from the source at once (one '
                                            'connection each); 1-32')
    max_bytes_per_s: Optional[int] = Field(None, description='The whole download\'s rate limit on the host, in bytes '
                                                             'per second (e.g. 500000000 for 4 Gbit/s), so the '
                                                             'weights do not take all of the host\'s uplink; none by '
                                                             'default')

    @field_validator('connections')
    @classmethod
    def _connections(cls, v):
        if not 1 <= v <= MAX_CONNECTIONS:
            raise ValueError('%d is not a number of connections the host may open to the source at once (1-%d); '
                             'write e.g. 8 (one per file: more than the ~50 shards of a large model gain nothing, and '
                             'a mirror or the hub may refuse a client that opens more)' % (v, MAX_CONNECTIONS))
        return v

    @field_validator('max_bytes_per_s')
    @classmethod
    def _rate(cls, v):
        if v is not None and v < MIN_RATE:
            raise ValueError('%d bytes/s is below %d (1 MB/s), which would take days for a model of hundreds of GB; '
                             'give bytes per second, e.g. 125000000 for 1 Gbit/s, or leave it unset for no limit'
                             % (v, MIN_RATE))
        return v

    @model_validator(mode='after')
    def _source(self):
        m = HF_RE.match(self.source or '')
        if m and m.group(3) and m.group(3) != self.revision:
            raise ValueError('gpuhost:model.source: %s names revision %s, but gpuhost:model.revision is %s; drop the '
                             '@<revision> from the source (the revision is gpuhost:model.revision)' % (
                                 self.source, m.group(3), self.revision))
        if self.token is not None and self.source is None:
            raise ValueError('gpuhost:model.token is set but there is no gpuhost:model.source to use it with')
        if self.token is not None and not (self.source.startswith(('hf://', 'https://'))):
            raise ValueError('gpuhost:model.token with a plain-http source would cross the network unencrypted; use '
                             'an https:// mirror, or no token')
        return self

    @field_validator('mount')
    @classmethod
    def _mount(cls, v):
        if v in SYSTEM_DIRS or under(v, MOUNT_BELOW):
            raise ValueError('%s is a system directory of the container (or inside one); mount the weights on a path '
                             'of their own, e.g. /models' % show(v))
        return v

    @field_validator('storage')
    @classmethod
    def _storage(cls, v):
        if v in SYSTEM_DIRS or under(v, STORAGE_BELOW):
            raise ValueError('%s is a system directory of the host (or inside one): root stages downloads and removes '
                             'old revisions below it; give the directory (or ZFS dataset mountpoint) that holds the '
                             'models, e.g. /rpool/models' % show(v))
        return v

    def relative(self, model_path: str) -> Optional[str]:
        """model_path's part below the mount, or None when it is not inside it."""
        if not model_path.startswith(self.mount.rstrip('/') + '/'):
            return None
        return posixpath.relpath(model_path, self.mount)

    def host_dir(self, model_path: str) -> str:
        """Where this revision's directory is on the host: <storage>/<model_path below the mount>@<revision>. One
        directory per revision, so a new revision is downloaded beside the one serving, and the unit names the
        revision it loads (container_dir): a revision change is a unit change, and putting the previous unit
        back after a failed start puts the previous weights back with it."""
        return '%s@%s' % (posixpath.join(self.storage, self.relative(model_path)), self.revision)

    def container_dir(self, model_path: str) -> str:
        """The same directory as the container sees it: the unit's --model-path."""
        return '%s@%s' % (model_path.rstrip('/'), self.revision)

    def base_url(self) -> Optional[str]:
        """The URL each file of the model is fetched under (<base>/<file>), or None without a source."""
        m = HF_RE.match(self.source or '')
        if m:
            return 'https://huggingface.co/%s/%s/resolve/%s' % (m.group(1), m.group(2), self.revision)
        return self.source

    def download_options(self) -> dict:
        """The download's job keys for hostscripts/model_verify.py ("connections", "max_bytes_per_s")."""
        return {'connections': self.connections, 'max_bytes_per_s': self.max_bytes_per_s}

    def mount_entry(self) -> str:
        """The container's mpN value: a bind mount of the host directory (root@pam only)."""
        return '%s,mp=%s,ro=%d' % (self.storage, self.mount, 0 if self.writable else 1)


def parse_checksums(text: str, key: str) -> dict:
    """sha256sum's format: "<64 hex>  <file>" (or " *<file>"), one a line; # comments and blank lines allowed.
    Returns {file: sha256}. Raises ValueError naming the line."""
    out = {}
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith('#'):
            continue
        m = re.match(r'^([0-9a-fA-F]{64}) [ *]([A-Za-z0-9_][A-Za-z0-9._\-]{0,254})$', s)
        if not m:
            raise ValueError('%s, line %d: %s is not "<sha256>  <file name>" (sha256sum\'s output for a file of the '
                             'model directory: a plain name of letters, digits and ._-)' % (key, n, show(s, 60)))
        name = m.group(2)
        if name in out:
            raise ValueError('%s, line %d: %s is listed twice' % (key, n, name))
        out[name] = m.group(1).lower()
    if not out:
        raise ValueError('%s: no checksums in it (sha256sum\'s lines, "<sha256>  <file>")' % key)
    return out
