# ct_env_build.py: builds one Python environment inside the container, beside the running one. Run by the
# container's python3 as the job `gpuhost-envbuild` (components/runtime.py build_jobs, components/jobs.py: a
# transient unit of the container's systemd, so a build of several GB outlives the SSH command), its source
# preceded by grammar/unidiff.py's (parse, apply_all, PatchError); the job arrives as JSON on stdin:
#   path      the environment's final directory (<envs_dir>/<id>: content-addressed, never built in place)
#   marker    what the program records about it (written last, as <path>/.gpuhost-env.json)
#   lock      the lock, canonical (every package pinned with its sha256), pip among them
#   patches   [{name, text}] unified diffs applied in order to site-packages
#   python    the minor version the lock is for; sglang: the version `import sglang` must report
#   index     {url, username, password} or null; wheelhouse: a directory of wheels in the container, or null
# Steps: a fresh virtualenv under a temporary name (<envs_dir>/.building-<id>-<pid>), made with the
# container's own python3 (`-m venv --without-pip`: Debian's python3 has no ensurepip); pip's wheel, pinned by
# the lock, fetched from the source and checked against the lock's hash; `pip install --require-hashes
# --no-deps` of the lock run from that wheel; the patches; the version check; the scripts' paths rewritten to
# the final name; the marker (written first, to claim the directory, and again, synced, last); then one
# rename. A half-built environment never has the final name, and every failure removes it. The index password
# goes to pip as a root-only netrc file in a private directory under /run (NETRC=<file>), never on a command
# line, and is removed afterwards.
# Exit codes (components/runtime.py turns them into the operator's message, naming the config key):
#   3 the source did not answer or refused the login   4 a file's hash differs from the lock's
#   5 the source lacks a pinned package                 6 a patch does not apply
#   7 sglang reports another version                    8 the container's python3 is not the lock's
#   9 no space left                                     10 the final directory exists but is not ours
#   11 anything else (pip's last lines)
# Stdlib only (the container's python3); no `from __future__`: this source follows unidiff's.

import base64
import csv
import errno
import hashlib
import html.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

MARKER = '.gpuhost-env.json'
# What the environment holds, file by file, as built: every file pip's RECORDs list (paths relative to the
# environment), with its size and sha256 after the patches and the move to the final name. ct_env_check.py compares
# the environment with it (components/runtime.py): a file changed, removed or added by hand afterwards is drift.
FILES = '.gpuhost-env-files.json'


class Progress(object):
    """The build's progress file for the job that runs it (components/jobs.py: GPUHOST_PROGRESS), rewritten
    atomically every 2 s: the phase, pip's last line, and a counter that moves with every line pip prints and
    every byte it downloads into the build's temporary directory (pip is silent while it fetches one big wheel;
    the job's stall detector compares the counter)."""

    def __init__(self, path):
        self.path, self.phase, self.line, self.lines, self.tmp = path, 'starting', 'starting', 0, None
        self._stop = threading.Event()
        if path:
            threading.Thread(target=self._loop, name='progress', daemon=True).start()

    def note(self, phase, line=None):
        self.phase = phase
        if line:
            self.lines += 1
            self.line = line if len(line) < 200 else line[:197] + '...'

    def _bytes(self):
        total = 0
        if self.tmp and os.path.isdir(self.tmp):
            for root, _, files in os.walk(self.tmp):
                for name in files:
                    try:
                        total += os.lstat(os.path.join(root, name)).st_size
                    except OSError:
                        pass
        return total

    def write(self):
        if not self.path:
            return
        doc = {'phase': self.phase, 'line': '%s: %s' % (self.phase, self.line), 'counter': self.lines + self._bytes(),
               'updated': int(time.time())}
        tmp = self.path + '.tmp'
        with open(tmp, 'w') as f:
            f.write(json.dumps(doc, sort_keys=True) + '\n')
        os.replace(tmp, self.path)

    def _loop(self):
        while not self._stop.wait(2.0):
            try:
                self.write()
            except OSError:
                pass


PROGRESS = Progress(os.environ.get('GPUHOST_PROGRESS'))


class Failed(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(1 << 20), b''):
            h.update(block)
    return h.hexdigest()


def lock_pin(lock, name):
    """(version, [sha256]) of a package in the canonical lock (name==version ... --hash=sha256:x ...)."""
    for line in lock.splitlines():
        m = re.match(r'^%s(\[[^\]]*\])?==(\S+)' % re.escape(name), line)
        if m:
            return m.group(2), re.findall(r'--hash=sha256:([0-9a-f]{64})', line)
    raise Failed(11, 'the lock pins no %s' % name)


class Links(html.parser.HTMLParser):
    """The anchors of a PEP 503 project page: [(file name, href)]."""

    def __init__(self):
        super().__init__()
        self.links, self._href = [], None

    def handle_starttag(self, tag, attrs):
        if tag == 'a':
            self._href = dict(attrs).get('href')

    def handle_data(self, data):
        if self._href is not None:
            self.links.append((data.strip(), self._href))
            self._href = None


def origin(url):
    parts = urllib.parse.urlsplit(url)
    return parts.scheme, parts.hostname, parts.port or {'http': 80, 'https': 443}.get(parts.scheme)


def fetch(url, index, what):
    req = urllib.request.Request(url, headers={'User-Agent': 'gpuhost-env-build'})
    # The login goes to the index's own origin only: not to a link that points at another host, and not along a
    # redirect (an Artifactory, Nexus or GitLab index serving its files from S3 or a CDN) - urllib carries an
    # ordinary header over to the redirect's target, an unredirected one it does not.
    if index.get('username') and origin(url) == origin(index['url']):
        token = base64.b64encode(('%s:%s' % (index['username'], index['password'])).encode()).decode()
        req.add_unredirected_header('Authorization', 'Basic ' + token)
    try:
        return urllib.request.urlopen(req, timeout=60)
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            raise Failed(3, 'the package index at %s refused the login (HTTP %d) while fetching %s; check '
                            'index.username and the password' % (index['url'], e.code, what))
        if e.code == 404:
            raise Failed(5, 'the package index at %s has no %s (HTTP 404)' % (index['url'], what))
        raise Failed(3, 'the package index at %s answered HTTP %d for %s' % (index['url'], e.code, what))
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, 'reason', e)
        raise Failed(3, 'the package index at %s did not answer (%s)' % (index['url'], reason))


def pip_wheel(job, work):
    """pip's wheel as the lock pins it (runnable as <wheel>/pip), from the job's source, hash-checked."""
    version, hashes = lock_pin(job['lock'], 'pip')
    name = 'pip-%s-py3-none-any.whl' % version
    dest = os.path.join(work, name)
    if job.get('wheelhouse'):
        src = os.path.join(job['wheelhouse'], name)
        if not os.path.exists(src):
            raise Failed(5, 'the wheelhouse has no %s (the lock pins pip==%s)' % (name, version))
        shutil.copyfile(src, dest)
    else:
        index = job['index']
        page = '%s/pip/' % index['url'].rstrip('/')
        parser = Links()
        with fetch(page, index, 'the project page of pip') as r:
            parser.feed(r.read().decode('utf-8', 'replace'))
        hrefs = [href for text, href in parser.links if text == name]
        if not hrefs:
            raise Failed(5, 'the package index at %s has no %s (the lock pins pip==%s)' % (index['url'], name, version))
        with fetch(urllib.parse.urljoin(page, hrefs[0]), index, name) as r, open(dest, 'wb') as f:
            shutil.copyfileobj(r, f)
    got = sha256_file(dest)
    if got not in hashes:
        raise Failed(4, 'pip==%s: the source serves %s with sha256 %s, the lock pins %s' % (
            version, name, got, ', '.join(hashes)))
    return dest


def run(argv, env, what):
    """(exit status, output) of a step; each line it prints is the build's progress."""
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, universal_newlines=True)
    out = []
    for line in proc.stdout:
        out.append(line)
        PROGRESS.note(what, line.strip())
    return proc.wait(), ''.join(out)


def pip_failure(out, job):
    """pip's output -> Failed with the reason an operator acts on."""
    tail = ' | '.join(l.strip() for l in out.strip().splitlines()[-4:])
    if 'No space left on device' in out:
        return Failed(9, 'no space left on device while installing the lock (%s)' % tail[-300:])
    if 'DO NOT MATCH THE HASHES' in out:
        m = re.search(r'^\s*(\S+==\S+) from (\S+)(?: \(from [^\n]*\))?:\s*\n\s*Expected sha256 (\S+)\s*\n'
                      r'\s*Got\s+(\S+)', out, re.M)
        if m:
            return Failed(4, '%s: the source serves %s with sha256 %s, the lock pins %s' % (
                m.group(1), m.group(2).rsplit('/', 1)[-1].split('#')[0], m.group(4), m.group(3)))
        return Failed(4, 'files do not match the lock\'s hashes (%s)' % tail[-400:])
    unreachable = re.search(r'(NewConnectionError|ConnectTimeoutError|Max retries exceeded|Connection refused|'
                            r'Temporary failure in name resolution|Read timed out)', out)
    if unreachable and job.get('index'):
        return Failed(3, 'the package index at %s did not answer (%s)' % (job['index']['url'], unreachable.group(1)))
    if re.search(r'\b(401|403)\b.*(Unauthorized|Forbidden)|User for ', out) and job.get('index'):
        return Failed(3, 'the package index at %s refused the login' % job['index']['url'])
    m = re.search(r'No matching distribution found for (\S+)', out)
    if m:
        where = 'the wheelhouse' if job.get('wheelhouse') else 'the package index at %s' % job['index']['url']
        return Failed(5, '%s has no file for %s' % (where, m.group(1)))
    return Failed(11, 'pip install failed: %s' % tail[-600:])


def relocate(tmp, final):
    """Scripts pip wrote name the interpreter by its temporary path (#!<tmp>/bin/python): point them at the
    final one, so the environment works under the name it is renamed to."""
    old, new = tmp.encode(), final.encode()
    bindir = os.path.join(tmp, 'bin')
    for name in os.listdir(bindir):
        p = os.path.join(bindir, name)
        if os.path.islink(p) or not os.path.isfile(p):
            continue
        with open(p, 'rb') as f:
            data = f.read()
        if old in data:
            mode = os.stat(p).st_mode
            with open(p + '.gpuhost-new', 'wb') as f:
                f.write(data.replace(old, new))
            os.chmod(p + '.gpuhost-new', mode)
            os.replace(p + '.gpuhost-new', p)
    cfg = os.path.join(tmp, 'pyvenv.cfg')
    with open(cfg) as f:
        text = f.read()
    with open(cfg, 'w') as f:
        f.write(text.replace(tmp, final))


def apply_patches(job, site):
    patches = []
    for p in job['patches']:
        try:
            patches.append((p['name'], parse(p['text'])))   # noqa: F821 - grammar/unidiff.py, sent before this
        except PatchError as e:                            # noqa: F821
            raise Failed(6, '%s: %s' % (p['name'], e))

    def read(rel):
        path = os.path.join(site, rel)
        if not os.path.isfile(path):
            return None
        with open(path, encoding='utf-8', errors='surrogateescape', newline='') as f:
            return f.read()
    try:
        result = apply_all(patches, read)                  # noqa: F821
    except PatchError as e:                                # noqa: F821
        raise Failed(6, str(e))
    for rel, text in sorted(result.items()):
        path = os.path.join(site, rel)
        if text is None:
            os.unlink(path)
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, 'w', encoding='utf-8', errors='surrogateescape', newline='') as f:
            f.write(text)
        # The bytecode of the old text must not outlive it (its mtime check would catch it; be sure).
        cache = os.path.join(os.path.dirname(path), '__pycache__')
        stem = os.path.splitext(os.path.basename(path))[0] + '.'
        if os.path.isdir(cache):
            for c in os.listdir(cache):
                if c.startswith(stem):
                    os.unlink(os.path.join(cache, c))
    return sorted(result)


def write_marker(directory, job, sync):
    with open(os.path.join(directory, MARKER), 'w') as f:
        f.write(json.dumps(job['marker'], sort_keys=True) + '\n')
        if sync:
            f.flush()
            os.fsync(f.fileno())


def record_paths(env):
    """The files pip recorded (each installed distribution's RECORD), relative to the environment."""
    out = set()
    for site in glob_sites(env):
        for dist in os.listdir(site):
            if not dist.endswith('.dist-info'):
                continue
            try:
                with open(os.path.join(site, dist, 'RECORD'), newline='') as f:
                    rows = list(csv.reader(f))
            except OSError:
                continue
            for row in rows:
                if not row or not row[0]:
                    continue
                rel = os.path.normpath(os.path.relpath(os.path.join(site, row[0]), env))
                if rel.startswith('..') or rel.endswith('.pyc') or '__pycache__' in rel.split(os.sep):
                    continue
                out.add(rel)
    return sorted(out)


def glob_sites(env):
    lib = os.path.join(env, 'lib')
    return [os.path.join(lib, d, 'site-packages') for d in sorted(os.listdir(lib)) if d.startswith('python')
            and os.path.isdir(os.path.join(lib, d, 'site-packages'))] if os.path.isdir(lib) else []


def write_manifest(tmp, final):
    """FILES for the environment being built at tmp (paths and hashes as they will be at final)."""
    files = {}
    # What pip's RECORDs list, and whatever else bin/ and site-packages hold when the build ends (the venv's own
    # activate scripts): ct_env_check.py calls a file there that is not in this list added by hand.
    paths = set(record_paths(tmp))
    for root in [os.path.join(tmp, 'bin')] + glob_sites(tmp):
        for dirpath, dirnames, names in os.walk(root):
            dirnames[:] = [d for d in dirnames if d != '__pycache__']
            paths.update(os.path.relpath(os.path.join(dirpath, n), tmp) for n in names if not n.endswith('.pyc'))
    for rel in sorted(paths):
        p = os.path.join(tmp, rel)
        if os.path.isfile(p) and not os.path.islink(p):
            st = os.stat(p)
            # Its stat as built too (a rename of the directory changes none of it): a check of an untouched file
            # reads no byte of it.
            files[rel] = [st.st_size, sha256_file(p), st.st_mtime_ns, st.st_ino, st.st_ctime_ns]
    with open(os.path.join(tmp, FILES), 'w') as f:
        f.write(json.dumps({'path': final, 'files': files}, sort_keys=True) + '\n')


def build(job, work):
    final = job['path']
    envs = os.path.dirname(final)
    ident = os.path.basename(final)
    if sys.version_info[:2] != tuple(int(x) for x in job['python'].split('.')):
        raise Failed(8, 'the container\'s python3 is %d.%d, the lock is for %s' % (
            sys.version_info[0], sys.version_info[1], job['python']))
    os.makedirs(envs, mode=0o755, exist_ok=True)
    for name in os.listdir(envs):
        if name.startswith('.building-%s-' % ident):   # an interrupted build of this environment
            shutil.rmtree(os.path.join(envs, name), ignore_errors=True)
    PROGRESS.note('pip', 'fetching pip as the lock pins it')
    wheel = pip_wheel(job, work)
    lock = os.path.join(work, 'lock.txt')
    with open(lock, 'w') as f:
        f.write(job['lock'])
    env = {'PATH': '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', 'HOME': work, 'LANG': 'C.UTF-8',
           # pip reads no configuration of the container's: the job says everything.
           'PIP_CONFIG_FILE': os.devnull, 'PYTHONDONTWRITEBYTECODE': '1'}
    source = ['--no-index', '--find-links', job['wheelhouse']] if job.get('wheelhouse') else \
        ['--index-url', job['index']['url'] + '/']
    parts = urllib.parse.urlsplit(job['index']['url']) if job.get('index') else None
    if parts is not None and parts.scheme == 'http':
        # pip ignores a plain-http index off loopback unless told to trust it; the stack declared this one (and
        # was warned at preview that its login crosses the network unencrypted).
        source += ['--trusted-host', parts.netloc]
    if job.get('index') and job['index'].get('username'):
        netrc = os.path.join(work, 'netrc')
        fd = os.open(netrc, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, 'w') as f:
            f.write('machine %s login %s password %s\n' % (urllib.parse.urlsplit(job['index']['url']).hostname,
                                                           job['index']['username'], job['index']['password']))
        env['NETRC'] = netrc
    tmp = os.path.join(envs, '.building-%s-%d' % (ident, os.getpid()))
    try:
        code, out = run([sys.executable, '-m', 'venv', '--without-pip', tmp], env, 'venv')
        if code != 0:
            if 'No space left' in out:
                raise Failed(9, 'no space left on device while making the virtualenv')
            raise Failed(11, 'python3 -m venv --without-pip failed: %s' % out.strip()[-400:])
        # The program's claim on the directory from its first moment: pruning (ct_env_link.sh) removes only
        # directories that carry the marker, and a build cut short where this cleanup cannot run (kill -9, the
        # container stopped) must still be recognised as the program's. Written again, synced, before the rename.
        write_marker(tmp, job, sync=False)
        # pip's downloads inside the environment being built (the same disk; /tmp may be small, /run is memory):
        # the progress counts their bytes, and they go with it - removed before the rename, or with the
        # half-built directory.
        env['TMPDIR'] = PROGRESS.tmp = os.path.join(tmp, '.gpuhost-tmp')
        os.makedirs(env['TMPDIR'], mode=0o700)
        python = os.path.join(tmp, 'bin', 'python')
        code, out = run([python, os.path.join(wheel, 'pip'), 'install', '--no-deps', '--require-hashes', '--no-input',
                         '--disable-pip-version-check', '--no-cache-dir', '--no-warn-script-location',
                         # No bytecode compiled under the temporary name (it would record that path); the
                         # first start compiles it at the final one.
                         '--no-compile', '--progress-bar', 'off',
                         # Wheels only: a source distribution would be built with build dependencies the lock
                         # does not pin (and with a compiler the container does not have).
                         '--only-binary', ':all:'] + source + ['-r', lock], env, 'pip')
        if code != 0:
            raise pip_failure(out, job)
        site = os.path.join(tmp, 'lib', 'python%s' % job['python'], 'site-packages')
        PROGRESS.note('patches', '%d to apply' % len(job['patches']))
        patched = apply_patches(job, site)
        code, out = run([python, '-c', 'import sglang; print(sglang.__version__)'], env, 'version')
        got = out.strip().splitlines()[-1] if out.strip() else ''
        if code != 0:
            raise Failed(7, '`import sglang` fails in the new environment: %s' % ' | '.join(
                out.strip().splitlines()[-3:])[-400:])
        if got != job['sglang']:
            raise Failed(7, 'the new environment\'s sglang reports %s, not %s' % (got, job['sglang']))
        shutil.rmtree(env.pop('TMPDIR'), ignore_errors=True)
        PROGRESS.tmp = None
        relocate(tmp, final)
        PROGRESS.note('check', 'recording the files of the environment')
        write_manifest(tmp, final)
        write_marker(tmp, job, sync=True)
        if job.get('replace') and os.path.isdir(final):
            # The environment of this id was changed by hand in place: the fresh one takes its name, the changed
            # one goes aside (a name pruning removes once the fresh one served), two renames apart.
            aside = os.path.join(envs, '.building-%s-replaced' % ident)
            shutil.rmtree(aside, ignore_errors=True)
            os.rename(final, aside)
        os.rename(tmp, final)
        return {'built': final, 'sglang': got, 'patched': patched}
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def main():
    job = json.load(sys.stdin)
    # Where the staging job copied the wheelhouse ('-': the job's index is the source).
    job['wheelhouse'] = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != '-' else None
    final = job['path']
    if os.path.exists(final):
        try:
            with open(os.path.join(final, MARKER)) as f:
                ours = json.load(f) == job['marker']
        except (OSError, ValueError):
            ours = False
        if ours and not job.get('replace'):
            print(json.dumps({'ready': final}))
            return 0
        if not ours:   # (ours with `replace`: changed by hand, built again beside it and swapped in build())
            raise Failed(10, '%s exists but is not the environment the program builds there (its %s is missing or '
                             'differs); move it away (it may be in use) and re-run' % (final, MARKER))
    run_dir = '/run' if os.access('/run', os.W_OK) else None
    work = tempfile.mkdtemp(prefix='gpuhost-build-', dir=run_dir)   # mode 0700: the netrc lives here
    try:
        print(json.dumps(build(job, work)))
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == '__main__':
    try:
        sys.exit(main())
    except Failed as e:
        sys.stderr.write('gpuhost-build: %s\n' % e)
        sys.exit(e.code)
    except OSError as e:
        if e.errno == errno.ENOSPC:
            sys.stderr.write('gpuhost-build: no space left on device (%s)\n' % e)
            sys.exit(9)
        sys.stderr.write('gpuhost-build: %s: %s\n' % (type(e).__name__, e))
        sys.exit(11)
