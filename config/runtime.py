"""gpuhost:runtime - what SGLang stands on inside the container, installed and checked by the program:

  nvidia   the NVIDIA user space (libcuda, libnvidia-ml, nvidia-smi) at exactly the host module's version,
           from NVIDIA's .run installer (a file on the host, or a URL the host downloads it from; with its
           sha256), run in the container with --no-kernel-module;
  cuda     the CUDA toolkit at gpuhost:sglang.cuda_home, from NVIDIA's runfile (a file on the host or a URL;
           sha256);
  python   the Python environment SGLang runs from, built from a lock kept in the repository (every package
           pinned with its sha256, pip among them: the container has none), from a package index (its
           password a Pulumi secret) or a wheelhouse on the host, with patches (unified diffs in the
           repository) applied to the installed packages. Content-addressed: a new lock, patch or Python
           builds a new environment beside the running one.

Optional, each part on its own: without gpuhost:runtime the operator installs SGLang into gpuhost:sglang.venv
and the program checks its version (docs/operator-guide.md, "The first `up` on a bare host"). The files the
section names in
the repository (lock, patches) are read and checked at preview by config/load.py (runtime_inputs)."""

from __future__ import annotations

import posixpath
import re
from typing import Annotated, ClassVar, Optional
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, SecretStr, field_validator, model_validator

from config.values import FilePath, Model, Path, grammar, http_url, no_control, show

Sha256 = Annotated[str, grammar(r'^[0-9a-f]{64}$', 'a sha256 (64 lowercase hex digits)',
                                'the output of sha256sum <file>', 64)]
DriverVersion = Annotated[str, grammar(r'^\d{3}\.\d{1,3}(\.\d{1,3})?$', 'an NVIDIA driver version',
                                       '580.95.05 (cat /sys/module/nvidia/version on the host)', 16)]
CudaVersion = Annotated[str, grammar(r'^\d{1,2}\.\d{1,2}\.\d{1,3}$', 'a CUDA toolkit version as version.json has it',
                                     '13.0.2', 16)]
PythonVersion = Annotated[str, grammar(r'^3\.\d{1,2}$', 'a Python minor version', '3.11 (Debian 12\'s python3)', 5)]

# NVIDIA's own file names: the version in the name must be the declared one (a wrong file fails at preview).
NVIDIA_RUN_RE = re.compile(r'^NVIDIA-Linux-(?:x86_64|aarch64)-(\d[\d.]*?)(?:-no-compat32)?\.run$')
CUDA_RUN_RE = re.compile(r'^cuda_(\d+\.\d+\.\d+)_(\d[\d.]*?)_linux(?:_sbsa)?\.run$')
# The oldest driver branch each CUDA major needs (SYSTEM.md: CUDA 13.0 needs a 580-series driver).
CUDA_MIN_DRIVER = {13: 580, 12: 525}


# The environments directory holds one directory per environment, and `up` removes the old ones there: it must be
# a directory of its own - never one of the container's system directories or their parents (/usr: the program
# would build /usr/<id>, and prune there), and nothing inside the parts of the system a package manager, the
# kernel or systemd own.
ENVS_NOT = ('/', '/bin', '/boot', '/dev', '/etc', '/home', '/lib', '/lib32', '/lib64', '/libx32', '/media', '/mnt',
            '/opt', '/proc', '/root', '/run', '/sbin', '/srv', '/sys', '/tmp', '/usr', '/var', '/var/backups',
            '/var/cache', '/var/lib', '/var/local', '/var/log', '/var/mail', '/var/opt', '/var/spool', '/var/tmp')
ENVS_NOT_BELOW = ('/proc', '/sys', '/dev', '/etc', '/usr', '/boot', '/run', '/bin', '/sbin', '/lib', '/lib32', '/lib64',
                  '/libx32')


def dedicated_dir(value: str) -> str:
    if value in ENVS_NOT or any(value.startswith(d + '/') for d in ENVS_NOT_BELOW):
        raise ValueError('%s is a system directory of the container (or inside one), and the program builds an '
                         'environment per lock there and removes the old ones; give the environments a directory of '
                         'their own, e.g. /opt/sglang/envs' % show(value))
    return value


# CUDA's toolkit directory (gpuhost:sglang.cuda_home, when gpuhost:runtime.cuda installs there): the installer
# writes into it, and a reinstall moves the one there aside (<dir>.gpuhost-previous) and back or away - a
# directory of its own, never a system directory, a parent of one, or /usr/local's own (bin, lib, share, ...).
USR_LOCAL_OWN = ('bin', 'etc', 'games', 'include', 'lib', 'lib64', 'libexec', 'man', 'sbin', 'share', 'src')


def toolkit_dir(value: str) -> str | None:
    """Why value cannot be the directory a CUDA install owns, or None."""
    parts = value.split('/')
    if value in ENVS_NOT or value == '/usr/local' or (value.startswith('/usr/local/') and parts[3] in USR_LOCAL_OWN):
        return 'is a system directory of the container'
    if not value.startswith('/usr/local/') and any(value.startswith(d + '/') for d in ENVS_NOT_BELOW):
        return 'is inside a system directory of the container'
    return None


def repo_path(value: str) -> str:
    """A file in the repository, relative to the project directory, that stays inside it."""
    no_control(value)
    if value.startswith(('/', '~')):
        raise ValueError('%s is not a path inside the repository; keep the file in the repository and give its path '
                         'relative to the project directory, e.g. runtime/sglang.lock' % show(value))
    parts = value.split('/')
    if not re.match(r'^[A-Za-z0-9._+@/\-]+$', value) or any(p in ('', '.', '..') for p in parts):
        raise ValueError('%s is not a normalised relative path inside the repository (letters, digits, ._+@-, no '
                         '"..", "." or empty parts); write e.g. runtime/patches/sm120-fp4.patch' % show(value))
    return value


RepoPath = Annotated[str, AfterValidator(repo_path)]


def index_url(value: str) -> str:
    return http_url(value, 'an http(s) URL of a package index', 'https://pypi.example.internal/simple',
                    'write the URL without them and set gpuhost:runtime.python.index.username and .password '
                    '(pulumi config set --secret --path gpuhost:runtime.python.index.password)')


# Installers declared by `source` are downloaded by the host into this directory of the program's own, one file
# per name, and kept there for the next container (resources/runtime.py fetch_installers).
INSTALLERS_DIR = '/var/lib/gpuhost/installers'


def installer_url(value: str) -> str:
    return http_url(value, 'an http(s) URL of the installer', 'https://us.download.nvidia.com/XFree86/Linux-x86_64/'
                    '580.95.05/NVIDIA-Linux-x86_64-580.95.05.run (NVIDIA\'s download URL for that version, or the same '
                    'file on an internal mirror)', 'give the URL without them and the mirror\'s token as a secret: '
                    'pulumi config set --secret --path gpuhost:runtime.<nvidia|cuda>.token')


class Installer(Model):
    installer: Optional[Path] = Field(None, description='The installer on the Proxmox host (uploaded once by the '
                                                        'operator) ...')
    source: Optional[Annotated[str, AfterValidator(installer_url)]] = Field(
        None, description='... or where the host downloads it from (NVIDIA\'s URL for that version, or a mirror): '
                          'a job on the host, resumable, checked against sha256 before use, kept in '
                          '/var/lib/gpuhost/installers for the next container')
    token: Optional[SecretStr] = Field(None, description='Bearer token for a mirror that wants a login; a secret, '
                                       'sent only to the source\'s own origin (never along a redirect to another '
                                       'host), handed to the host on stdin and kept in a root-only file only while '
                                       'the download runs')
    sha256: Sha256 = Field(description='sha256sum of the installer; a file with another hash is never run (NVIDIA '
                                       'publishes them: the driver\'s beside each .run on download.nvidia.com, '
                                       'CUDA\'s on the toolkit\'s download page, "Checksums")')

    def file_name(self, key: str, pattern, what: str, thing: str, version: str) -> str:
        """The installer's file name as NVIDIA names it, from the path or the URL; the version in it must be the
        declared one (a wrong file fails at preview)."""
        if (self.installer is None) == (self.source is None):
            raise ValueError('%s: set exactly one of installer (the file uploaded to the host) and source (the URL the '
                             'host downloads it from)' % key)
        if self.token is not None and (self.source is None or not self.source.startswith('https://')):
            raise ValueError('%s.token needs an https:// source to use it with (a plain-http one would carry it '
                             'unencrypted); set source, or drop the token' % key)
        if self.token is not None:
            check_token(key + '.token', self.token.get_secret_value())
        field = 'installer' if self.installer is not None else 'source'
        given = self.installer if self.installer is not None else self.source
        name = posixpath.basename(given if field == 'installer' else urlsplit(given).path)
        m = pattern.match(name)
        if not m:
            raise ValueError('%s.%s: %s is not %s; give the %s of the file for %s' % (
                key, field, show(given), what, 'path on the host' if field == 'installer' else 'URL', version))
        if m.group(1) != version:
            raise ValueError('%s.%s: %s installs %s %s, but version is %s; give the one of %s (or fix the version)' % (
                key, field, show(given), thing, m.group(1), version, version))
        return name

    @property
    def host_path(self) -> str:
        """Where the installer is on the host: the operator's upload, or the program's download."""
        if self.installer is not None:
            return self.installer
        return posixpath.join(INSTALLERS_DIR, posixpath.basename(urlsplit(self.source).path))


class NvidiaRuntime(Installer):
    KEY: ClassVar[str] = 'gpuhost:runtime.nvidia'   # what messages name (config/nvidia.py's driver: its own)
    version: DriverVersion = Field(description='The NVIDIA user space version: exactly the host\'s loaded module '
                                               '(/sys/module/nvidia/version), or NVML fails with "Driver/library '
                                               'version mismatch"')

    @model_validator(mode='after')
    def _name(self):
        self.file_name(self.KEY, NVIDIA_RUN_RE, 'NVIDIA\'s driver installer '
                       '(NVIDIA-Linux-x86_64-<version>.run, as NVIDIA names it)', 'driver', self.version)
        return self


class CudaRuntime(Installer):
    version: CudaVersion = Field(description='The CUDA toolkit version installed at gpuhost:sglang.cuda_home '
                                             '(version.json\'s cuda.version)')

    @model_validator(mode='after')
    def _name(self):
        self.file_name('gpuhost:runtime.cuda', CUDA_RUN_RE, 'NVIDIA\'s CUDA runfile (cuda_<version>_<driver>_linux.run)',
                       'CUDA', self.version)
        return self


class PackageIndex(Model):
    url: Annotated[str, AfterValidator(index_url)] = Field(description='The index\'s PEP 503 "simple" URL, without '
                                                                       'credentials')
    username: Optional[Annotated[str, grammar(r'^[A-Za-z0-9._@+\-]{1,128}$', 'a user name for the index',
                                              'deploy', 128)]] = None
    password: Optional[SecretStr] = Field(None, description='The index password; a secret. It reaches pip through a '
                                          'root-only netrc file in the container\'s /run, never a command line')
    password_file: Optional[FilePath] = Field(None, description='Or: a file holding it (read at preview)')

    @field_validator('password')
    @classmethod
    def _password(cls, v):
        if v is not None:
            check_password(v.get_secret_value())
        return v

    @model_validator(mode='after')
    def _auth(self):
        if self.password is not None and self.password_file is not None:
            raise ValueError('gpuhost:runtime.python.index: set password (a secret) or password_file, not both')
        if (self.password is not None or self.password_file is not None) != (self.username is not None):
            raise ValueError('gpuhost:runtime.python.index: a username needs a password and a password a username; '
                             'set both (the password as a secret) or neither (an index without login)')
        return self


def check_token(key: str, value: str) -> None:
    """What an HTTP Authorization header can carry: printable, no whitespace. Never shown."""
    if not re.match(r'^[!-~]{8,4096}$', value):
        raise ValueError('%s must be 8-4096 printable characters without spaces (not shown)' % key)


def check_password(value: str) -> str:
    """What netrc can carry: printable, no whitespace or quotes, not starting with #. Never shown."""
    if not re.match(r'^[!#-&(-\[\]-~]{1,256}$', value) or value.startswith('#'):
        raise ValueError('must be 1-256 printable characters without spaces, quotes or backslashes, not starting with '
                         '"#" (not shown); make one with: openssl rand -base64 32')
    return value


class PythonEnvironment(Model):
    lock: RepoPath = Field(description='The lock in the repository: every package pinned with --hash=sha256 '
                                       '(pip-compile --generate-hashes --allow-unsafe), pip and sglang among them')
    index: Optional[PackageIndex] = Field(None, description='Where the packages come from: a package index ...')
    wheelhouse: Optional[Path] = Field(None, description='... or a directory of wheels on the host')
    patches: list[RepoPath] = Field(default_factory=list, max_length=64,
                                    description='Unified diffs in the repository, applied in order to the installed '
                                                'packages (paths relative to site-packages; git\'s a/ b/ are stripped)')
    version: PythonVersion = Field('3.11', description='The container python3\'s minor version the lock is for')
    keep: int = Field(1, ge=0, le=10, description='How many previous environments to keep beside the current one')
    envs_dir: Annotated[Path, AfterValidator(dedicated_dir)] = Field('/opt/sglang/envs', description='Where the environments live, one directory each, named '
                                                           'after the hash of lock, patches and Python version')

    @model_validator(mode='after')
    def _source(self):
        if (self.index is None) == (self.wheelhouse is None):
            raise ValueError('gpuhost:runtime.python: set exactly one package source: index (url, username, password '
                             'as a secret) or wheelhouse (a directory of wheels on the host)')
        dup = sorted({p for p in self.patches if self.patches.count(p) > 1})
        if dup:
            raise ValueError('gpuhost:runtime.python.patches: %s is listed twice; list each patch once' % dup[0])
        return self


class Runtime(Model):
    nvidia: Optional[NvidiaRuntime] = None
    cuda: Optional[CudaRuntime] = None
    python: Optional[PythonEnvironment] = None
    install_timeout_s: float = Field(3600.0, ge=30, le=86400, description='Longest an installer or an environment '
                                     'build may run (the CUDA runfile and torch wheels are gigabytes)')
    stall_timeout_s: float = Field(600.0, ge=5, le=86400, description='An installer, a copy or an environment build '
                                   'that makes no progress (no output, no bytes, no CPU) for this long is stopped and '
                                   'the step fails')
