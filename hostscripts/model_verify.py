"""Verify a model directory on the host, downloading what it lacks first when the job names a source (runs there,
python3 standard library only; sent by model_verify.sh, or started as a job of its own). With {"kind": "file", "url",
"sha256", "dest"} it downloads one file - an installer - the same way instead (fetch_file).

argv[1]: the job, JSON: {"dir", "id", "revision", "storage", "checksums": {file: sha256} | null, "cache": path,
"hash": bool (false: a quick look - sizes, headers and cached sums only, what a preview needs),
"textfile": path | null (node_exporter textfile to write the result to), "source": base URL | absent,
"connections": files downloaded at once (8), "max_bytes_per_s": the whole download's rate limit (null: none),
"hash_workers": files hashed at once (null: min(4, CPUs))}.
The token for the source: the file named by env GPUHOST_TOKEN_FILE. Progress: a line on stderr ("gpuhost-progress:
...") at least every 10 s, and, when env GPUHOST_PROGRESS names a file, that file rewritten (tmp + rename) at least
every 2 s with the phase, bytes, rate, ETA, files in flight and a counter that grows with every byte downloaded or
hashed (a job runner's stall detector compares it).
The last line of stdout is the JSON report: the state of config.json, the index, every shard (missing, short, long,
mismatch, unreadable by an unprivileged container, unhashed), byte counts, how many shard bytes this run read (0 when
every shard's size and mtime match the cache: nothing is read again), where the expected sums came from, and with a
source what was downloaded.

A shard's expected size comes from the shard itself: a safetensors file is an 8-byte little-endian header length, a
JSON header whose data_offsets give every tensor's place, then the data; a file shorter than the end of its last
tensor was cut off. Its expected sha256 comes from the checksum file, or without one from the hub: the X-Linked-Etag
of a HEAD on resolve/<revision>/<file> is the LFS object id, the file's sha256 (huggingface_hub's
get_hf_file_metadata reads the same header)."""

import collections
import hashlib
import json
import os
import re
import stat
import struct
import sys
import tempfile
import threading
import time

INDEX = 'model.safetensors.index.json'
SINGLE = 'model.safetensors'
MANIFEST = ('config.json', INDEX)
MAX_HEADER = 100 * 1024 * 1024   # safetensors' own limit on the header
HASH_BLOCK = 1 << 20             # hashlib releases the GIL for each update: 1 MiB keeps the copy in cache
SMALL = 64 << 20                 # files the checksum file names besides the shards are read every time below this
PROGRESS_S = 10.0                # a stderr line at least this often (the program relays each to the pulumi output)
PROGRESS_FILE_S = 1.0            # the progress file at least this often (the contract: every 2 s)
SHA_RE = re.compile(r'^[0-9a-f]{64}$')
COMMIT_RE = re.compile(r'^[0-9a-f]{40}$')


class FetchError(Exception):
    pass


# ------------------------------------------------------------------------------------------ progress

def human(n):
    n = float(n)
    for unit in ('B', 'kB', 'MB', 'GB', 'TB'):
        if n < 1000 or unit == 'TB':
            return ('%d %s' % (n, unit)) if unit == 'B' else ('%.1f %s' % (n, unit))
        n /= 1000.0


def atomic_write(path, text, mode=0o644):
    """text into path through a temporary file in the same directory and a rename: a reader sees the old or the
    new content, never half of it."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or '.', prefix='.%s.' % os.path.basename(path))
    try:
        with os.fdopen(fd, 'w') as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class Progress(object):
    """What the job is doing, for a person (a stderr line at least every 10 s) and for a job runner (the
    GPUHOST_PROGRESS file, at least every 2 s). Worker threads call add(); a ticker thread writes, so a stalled
    transfer still updates "updated" while "counter" stands still - which is what a stall detector looks for."""

    VERBS = {'download': 'downloading', 'hash': 'hashing', 'check': 'checking'}

    def __init__(self, path=None, label=''):
        self.path, self.label = path, label
        self.lock, self.write_lock = threading.Lock(), threading.Lock()
        self.phase, self.total, self.done, self.files_total, self.files_done = 'check', 0, 0, 0, 0
        self.current, self.counter, self.note = [], 0, ''
        self.window = collections.deque()
        self.last_file = self.last_line = 0.0
        self.stopped, self.thread, self.file_error = threading.Event(), None, None

    def start(self):
        self.emit(line=False)
        self.thread = threading.Thread(target=self._tick, name='progress', daemon=True)
        self.thread.start()

    def stop(self):
        self.stopped.set()
        if self.thread:
            self.thread.join()
        self.emit(line=False)

    def _tick(self):
        while not self.stopped.wait(0.5):
            self.maybe_emit()

    def begin(self, phase, total=0, done=0, files_total=0, note=''):
        """A new phase; a line at once when it has bytes to move (the start of a download or a hashing pass)."""
        with self.lock:
            self.phase, self.total, self.done, self.files_total, self.files_done = phase, total, done, files_total, 0
            self.current, self.note = [], note
            self.window.clear()
            self.window.append((time.monotonic(), done))
        self.emit(line=bool(total))

    def add(self, n, counted=True):
        """n bytes of the phase done (downloaded, or hashed); counted: they were read or received just now (not
        bytes a resumed partial already held)."""
        with self.lock:
            self.done += n
            if counted:
                self.counter += n
        if self.thread is None:
            self.maybe_emit()

    def worked(self, n):
        """n bytes read that the phase's total does not count (a partial hashed before its download resumes)."""
        with self.lock:
            self.counter += n

    def back(self, n):
        """A partial of n bytes was discarded: the phase has that much more to do."""
        with self.lock:
            self.done -= n

    def started(self, name):
        with self.lock:
            self.current.append(name)

    def finished(self, name, ok=True):
        with self.lock:
            if name in self.current:
                self.current.remove(name)
            if ok:
                self.files_done += 1

    def snapshot(self):
        with self.lock:
            now = time.monotonic()
            if not self.window or now - self.window[-1][0] >= 0.5:
                self.window.append((now, self.done))
            while len(self.window) > 2 and now - self.window[1][0] >= 20:
                self.window.popleft()   # the rate over the last ~20 s: what the link does now
            t0, d0 = self.window[0]
            rate = (self.done - d0) / (now - t0) if now - t0 >= 0.5 else None
            eta = (self.total - self.done) / rate if rate and self.total else None
            current = list(self.current)
            state = {'phase': self.phase, 'done_bytes': self.done, 'total_bytes': self.total,
                     'rate_bytes_s': round(rate) if rate is not None else None,
                     'eta_s': round(eta) if eta is not None else None, 'files_done': self.files_done,
                     'files_total': self.files_total, 'current': current, 'counter': self.counter,
                     'updated': round(time.time(), 3)}
            note = self.note
        shown = ', '.join(current[:3]) + (' (+%d more)' % (len(current) - 3) if len(current) > 3 else '')
        if state['phase'] == 'check' and not state['total_bytes']:
            numbers = '%d of %d files' % (state['files_done'], state['files_total'])
        else:
            numbers = '%s of %s (%.0f%%), %s/s, ETA %s' % (
                human(state['done_bytes']), human(state['total_bytes']),
                100.0 * state['done_bytes'] / max(state['total_bytes'], 1), human(max(rate or 0, 0)),
                '%dm%02ds' % divmod(int(eta), 60) if eta is not None and eta >= 0 else 'unknown')
        what = note or shown or '-'
        state['line'] = '%s %s: %s - %s' % (self.VERBS.get(state['phase'], state['phase']), self.label, numbers, what)
        return state

    def maybe_emit(self):
        now = time.monotonic()
        with self.lock:
            due_file = self.path and now - self.last_file >= PROGRESS_FILE_S
            due_line = now - self.last_line >= PROGRESS_S
        if due_file or due_line:
            self.emit(line=due_line)

    def emit(self, line=True):
        state = self.snapshot()
        with self.write_lock:
            now = time.monotonic()
            if self.path:
                self.last_file = now
                try:
                    atomic_write(self.path, json.dumps(state, sort_keys=True) + '\n')
                except OSError as e:
                    if self.file_error is None:   # once: the job goes on, its stderr says why the file stands still
                        self.file_error = e
                        sys.stderr.write('gpuhost-progress: cannot write the progress file %s (%s)\n' % (
                            self.path, e.strerror or e))
            if line:
                self.last_line = now
                text = state['line']
                if state['phase'] == 'download':
                    text = text[len('downloading '):]   # today's shape: the program relays it as "downloading ..."
                sys.stderr.write('gpuhost-progress: %s\n' % text)
                sys.stderr.flush()


PROGRESS = Progress()   # main() replaces it with one that writes GPUHOST_PROGRESS


# ------------------------------------------------------------------------------------------ reading and hashing

def shard_end(path, counter):
    """The size a safetensors file must have (8 + header + data), read from its header."""
    with open(path, 'rb') as f:
        raw = f.read(8)
        counter[0] += len(raw)
        if len(raw) < 8:
            raise ValueError('shorter than a safetensors header')
        (n,) = struct.unpack('<Q', raw)
        if n > MAX_HEADER:
            raise ValueError('header length %d is not safetensors\'' % n)
        head = f.read(n)
        counter[0] += len(head)
        if len(head) < n:
            raise ValueError('cut off inside its header')
    try:
        header = json.loads(head.decode('utf-8'))
    except ValueError:
        raise ValueError('its header is not JSON')
    end = 0
    for name, t in header.items():
        if name == '__metadata__':
            continue
        try:
            end = max(end, int(t['data_offsets'][1]))
        except (KeyError, TypeError, IndexError, ValueError):
            raise ValueError('tensor %s has no data_offsets' % name)
    return 8 + n + end, sorted(k for k in header if k != '__metadata__')


def sha256_file(path, counter=None, progress=None):
    """The file's sha256; counter[0] and progress grow by the bytes read. One preallocated buffer (readinto): no
    allocation per block, and hashlib releases the GIL while it hashes, so threads hash files in parallel."""
    h = hashlib.sha256()
    buf = bytearray(HASH_BLOCK)
    view = memoryview(buf)
    total = 0
    with open(path, 'rb', buffering=0) as f:
        try:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        except (AttributeError, OSError):
            pass
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(view[:n])
            total += n
            if progress is not None:
                progress.add(n)
    if counter is not None:
        counter[0] += total
    return h.hexdigest()


def stat_key(st, path):
    """What a cached sum is valid for. The size, mtime and inode alone can be kept by a rewrite in place (`touch
    -d`, `rsync --inplace -t` set the mtime back); the ctime cannot be set from user space and moves with any write;
    and the file system's id tells a file on another file system with the same inode number apart - its statvfs
    f_fsid (ZFS: from the dataset's GUID, ext4/XFS: from the UUID), which survives a reboot, where st_dev (an
    anonymous device number for ZFS, overlayfs, btrfs) may not: a reboot must not re-hash 244 GB."""
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns, fsid(os.path.dirname(path) or '.')]


_FSIDS = {}


def fsid(directory):
    if directory not in _FSIDS:
        try:
            _FSIDS[directory] = os.statvfs(directory).f_fsid
        except OSError:
            _FSIDS[directory] = 0
    return _FSIDS[directory]


class SumCache(object):
    """{file: {"stat": [size, mtime_ns, inode, ctime_ns, file system id], "sha256", "end", "tensors"}} of one directory, saved (tmp + rename)
    each time an entry is recorded: a killed job keeps every sum it computed. ".hub" holds the hub's sums for the
    directory's revision (a file name never starts with a dot)."""

    def __init__(self, path):
        self.path, self.lock = path, threading.Lock()
        self.data = {}
        if path:
            try:
                with open(path) as f:
                    data = json.load(f)
                self.data = data if isinstance(data, dict) else {}
            except (OSError, ValueError):
                pass

    def record(self, name, entry):
        with self.lock:
            self.data[name] = entry
            self._save(self.data)

    def replace(self, data):
        with self.lock:
            self.data = data
            self._save(data)

    def _save(self, data):
        if not self.path:
            return
        try:
            os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
            atomic_write(self.path, json.dumps(data, sort_keys=True), 0o600)
        except OSError:
            pass   # a cache: the next run computes again what it could not keep


def world_readable(st):
    return bool(st.st_mode & stat.S_IROTH)


def hash_workers(job):
    n = job.get('hash_workers')
    return max(1, int(n)) if n else max(1, min(4, os.cpu_count() or 1))


def run_pool(items, workers, fn):
    """fn(item) for every item on up to `workers` threads, started in the order given; returns the errors in that
    order (FetchError's text, or "<item>: <what>" for anything else) - one failed file does not stop the others."""
    items = list(items)
    errors, lock = {}, threading.Lock()
    it = iter(enumerate(items))

    def work():
        while True:
            with lock:
                i, item = next(it, (None, None))
            if i is None:
                return
            try:
                fn(item)
            except FetchError as e:
                with lock:
                    errors[i] = str(e)
            except Exception as e:   # noqa: BLE001 - one line naming the file, never a traceback from a thread
                with lock:
                    errors[i] = '%s: %s: %s' % (item, type(e).__name__, e)
    threads = [threading.Thread(target=work, name='worker-%d' % i, daemon=True)
               for i in range(max(1, min(workers, len(items))))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [errors[i] for i in sorted(errors)]


# ------------------------------------------------------------------------------------------ verifying

def expected_sums(job, cache):
    """({file: sha256}, where they came from): the checksum file; else the hub's sums the fetch just read
    (job["hub_sums"]) or kept in the cache for this directory; else none (sizes and headers only)."""
    if job.get('checksums'):
        return job['checksums'], 'checksums'
    if job.get('hub_sums'):
        return job['hub_sums'], 'hub'
    hub = cache.data.get('.hub')
    if isinstance(hub, dict) and hub.get('sums'):
        return hub['sums'], 'hub'
    return {}, None


def verify(job, progress=None):
    progress = progress or PROGRESS
    start = time.time()
    d = job['dir']
    do_hash = bool(job.get('hash'))
    rep = {'dir': d, 'id': job.get('id'), 'revision': job.get('revision'), 'problems': [], 'missing': [],
           'short': [], 'long': [], 'mismatch': [], 'unreadable': [], 'unhashed': [], 'shards': 0, 'present': 0,
           'bytes': 0, 'expected_bytes': 0, 'read_bytes': 0, 'hashed': 0, 'checked_sums': 0, 'due': [],
           'oldest_sha256_at': None}
    # Bit rot does not change a file's metadata: a sum older than this is computed again (gpuhost:model.rehash_days).
    rehash_s = job.get('rehash_s')
    counter = [0]
    if not os.path.isdir(d):
        rep['problems'].append('%s does not exist on the host' % d)
        rep['dir_missing'] = True
        return finish(rep, start, counter)
    cache = SumCache(job.get('cache'))
    sums, rep['sums_from'] = expected_sums(job, cache)
    hub = cache.data.get('.hub') if isinstance(cache.data.get('.hub'), dict) else {}
    if rep['sums_from'] == 'hub' and hub.get('commit'):
        rep['hub_commit'] = hub['commit']
    only = job.get('only')   # a staging directory: just these files
    if only is None:
        # The container is unprivileged: its root is "other" to the host, and must be able to enter every
        # directory from the storage down to the model's (a real host's dataset may be 0700; the shards'
        # own modes are checked below).
        closed = [p for p in dirs_down(job.get('storage'), d) if not os.stat(p).st_mode & stat.S_IXOTH]
        if closed:
            rep['problems'].append('%s is not searchable by the container (mode %04o): chmod o+rx %s' % (
                closed[0], stat.S_IMODE(os.stat(closed[0]).st_mode), closed[0]))
    if only is not None:
        shards, weight_map = sorted(n for n in only if n.endswith('.safetensors')), None
        for name in only:
            if name.endswith('.json'):
                try:
                    with open(os.path.join(d, name)) as f:
                        json.load(f)
                except (OSError, ValueError) as e:
                    rep['problems'].append('%s is not readable JSON (%s)' % (name, e))
    else:
        for name in ('config.json',):
            p = os.path.join(d, name)
            try:
                with open(p) as f:
                    json.load(f)
            except FileNotFoundError:
                rep['missing'].append(name)
            except (OSError, ValueError) as e:
                rep['problems'].append('%s is not readable JSON (%s)' % (name, getattr(e, 'strerror', None) or e))
        shards = []
        index = os.path.join(d, INDEX)
        if os.path.exists(index):
            try:
                with open(index) as f:
                    weight_map = json.load(f)['weight_map']
                shards = index_shards(weight_map)
            except (OSError, ValueError, KeyError, TypeError) as e:
                rep['problems'].append('%s is not a safetensors index (%s)' % (INDEX, e))
                weight_map = {}
        elif os.path.exists(os.path.join(d, SINGLE)):
            shards, weight_map = [SINGLE], None
        else:
            rep['missing'].append(INDEX)
            weight_map = None
    rep['shards'] = len(shards)
    new_cache = {}
    tensors = {}
    to_hash = []
    for name in shards:
        p = os.path.join(d, name)
        try:
            st = os.stat(p)
        except FileNotFoundError:
            rep['missing'].append(name)
            continue
        rep['present'] += 1
        rep['bytes'] += st.st_size
        if not world_readable(st):
            rep['unreadable'].append(name)
        key = stat_key(st, p)
        hit = cache.data.get(name)
        entry = dict(hit) if isinstance(hit, dict) and hit.get('stat') == key else {'stat': key}
        try:
            if 'end' not in entry:
                entry['end'], entry['tensors'] = shard_end(p, counter)
        except (OSError, ValueError) as e:
            rep['problems'].append('%s: %s' % (name, e))
            continue
        rep['expected_bytes'] += entry['end']
        for t in entry['tensors']:
            tensors[t] = name
        new_cache[name] = entry
        if st.st_size < entry['end']:
            rep['short'].append('%s (%d of %d bytes)' % (name, st.st_size, entry['end']))
            continue
        if st.st_size > entry['end']:
            rep['long'].append('%s (%d bytes, its header ends the data at %d)' % (name, st.st_size, entry['end']))
        if rehash_s and 'sha256' in entry and time.time() - entry.get('hashed_at', 0) > rehash_s:
            del entry['sha256']
            rep['due'].append(name)
        if sums.get(name) and 'sha256' not in entry:
            if do_hash:
                to_hash.append(name)
            else:
                rep['unhashed'].append(name)
    if to_hash:
        hash_shards(d, to_hash, new_cache, cache, hash_workers(job), progress, rep, counter)
    for name in shards:
        entry, want = new_cache.get(name), sums.get(name)
        if entry and want and 'sha256' in entry and entry['end'] <= entry['stat'][0]:
            rep['checked_sums'] += 1
            at = entry.get('hashed_at') or 0
            rep['oldest_sha256_at'] = at if rep['oldest_sha256_at'] is None else min(rep['oldest_sha256_at'], at)
            if entry['sha256'] != want:
                rep['mismatch'].append('%s (sha256 %s..., %s says %s...)' % (
                    name, entry['sha256'][:12], SAYS[rep['sums_from']], want[:12]))
    if weight_map:
        # The index must agree with the shards' own headers: a tensor in the wrong shard fails the load.
        wrong = [t for t, s in weight_map.items() if s in new_cache and tensors.get(t) != s]
        if wrong:
            rep['problems'].append('%d tensors of %s are not in the shard it names (e.g. %s)' % (
                len(wrong), INDEX, sorted(wrong)[0]))
    for name in sorted(sums):
        if name in shards or (only is not None and name not in only):
            continue
        p = os.path.join(d, name)
        if not os.path.exists(p):
            if name not in rep['missing']:
                rep['missing'].append(name)
        elif name in MANIFEST or os.path.getsize(p) < SMALL:
            # The small files the checksum file names (config, index, tokenizer): read every time.
            got = sha256_file(p)
            rep['checked_sums'] += 1
            if got != sums[name]:
                rep['mismatch'].append('%s (sha256 %s..., %s says %s...)' % (
                    name, got[:12], SAYS[rep['sums_from']], sums[name][:12]))
    if job.get('cache'):
        if hub:
            new_cache['.hub'] = hub
        cache.replace(new_cache)
    return finish(rep, start, counter)


SAYS = {'checksums': 'the checksum file', 'hub': 'the hub (X-Linked-Etag)', 'declared': 'the declared sha256',
        None: 'the source'}


def hash_shards(d, names, entries, cache, workers, progress, rep, counter):
    """sha256 of the named shards, `workers` files at once, largest first (the last file to finish is then a small
    one); each sum goes into the cache file the moment it is known."""
    sizes = {n: entries[n]['stat'][0] for n in names}
    order = sorted(names, key=lambda n: (-sizes[n], n))
    progress.begin('hash', total=sum(sizes.values()), files_total=len(order))
    lock = threading.Lock()
    read = [0]

    def one(name):
        progress.started(name)
        try:
            got = [0]
            digest = sha256_file(os.path.join(d, name), got, progress)
        except OSError as e:
            progress.finished(name, ok=False)
            raise FetchError('%s: %s' % (name, e.strerror or e))
        with lock:
            read[0] += got[0]
            entries[name]['sha256'] = digest
            entries[name]['hashed_at'] = int(time.time())
            rep['hashed'] += 1
            entry = dict(entries[name])
        cache.record(name, entry)
        progress.finished(name)
    for err in run_pool(order, workers, one):
        rep['problems'].append(err)
    counter[0] += read[0]


def finish(rep, start, counter):
    rep['read_bytes'] = counter[0]
    rep['elapsed_s'] = round(time.time() - start, 3)
    rep['verified'] = not (rep['problems'] or rep['missing'] or rep['short'] or rep['long'] or rep['mismatch'] or
                           rep['unreadable'] or rep['unhashed'])
    return rep


# ------------------------------------------------------------------------------------------ HTTP

# A file of a model directory as an index or a checksum file may name it: one plain name (no path, no
# character a URL or a report line would have to escape). The same grammar as config/model.py's checksum file.
FILE_RE = re.compile(r'^[A-Za-z0-9_][A-Za-z0-9._\-]{0,254}$')


def dirs_down(storage, d):
    """storage, then each directory below it down to d (just d when d is not below storage)."""
    if not storage or not (d + '/').startswith(storage.rstrip('/') + '/'):
        return [d]
    out, p = [storage.rstrip('/') or '/'], storage.rstrip('/')
    for part in os.path.relpath(d, storage).split('/'):
        if part != '.':
            p = os.path.join(p, part)
            out.append(p)
    return out


def index_shards(weight_map):
    """The shards an index's weight_map names, sorted; ValueError for none, or for a name that is not a plain
    file of the directory (a downloaded index naming ../../etc/x must never decide where root writes)."""
    shards = sorted(set(weight_map.values()))
    bad = [x for x in shards if not isinstance(x, str) or not FILE_RE.match(x)]
    if not shards or bad:
        raise ValueError('weight_map names no shards' if not shards else
                         'weight_map names %r, not a file name of the directory' % (bad[0],))
    return shards


def origin(url):
    from urllib.parse import urlsplit
    u = urlsplit(url)
    port = u.port or {'http': 80, 'https': 443}.get(u.scheme)
    return (u.scheme, (u.hostname or '').lower(), port)


def read_token():
    # model_verify.sh's token file, or the input of the job that runs this (components/jobs.py: root-only, removed
    # when the job ends).
    path = os.environ.get('GPUHOST_TOKEN_FILE') or os.environ.get('GPUHOST_INPUT')
    if not path:
        return None
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError as e:
        raise FetchError('the token file %s (GPUHOST_TOKEN_FILE) cannot be read (%s); the program writes it for the '
                         'download - re-run the `up`' % (path, e.strerror or e))


class Http(object):
    """Requests to the source. Redirects are followed here, not by urllib, so the rule for the token is one line:
    it goes only to the source's own origin (scheme, host, port). The hub answers resolve/ with a redirect to its
    CDN, another host, which must never see it (huggingface_hub drops it the same way)."""

    REDIRECTS = (301, 302, 303, 307, 308)

    def __init__(self, base, token=None, timeout=60):
        import urllib.request

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args, **kwargs):
                return None   # urllib raises the 3xx as an HTTPError; open() decides
        self.origin, self.token, self.timeout = origin(base), token, timeout
        self.opener = urllib.request.build_opener(NoRedirect)

    def open(self, url, method='GET', headers=None, stop=None):
        """The response to url, after redirects (up to 10); stop(headers) true: the redirect itself is the answer
        (a HEAD on the hub: its 302 carries X-Linked-Etag and X-Linked-Size). Raises urllib.error.HTTPError for
        other statuses >= 400, OSError for the network."""
        import urllib.error
        import urllib.request
        from urllib.parse import urljoin
        for _ in range(10):
            req = urllib.request.Request(url, method=method, headers=dict(
                {'User-Agent': 'gpuhost-model-fetch', 'Accept-Encoding': 'identity'}, **(headers or {})))
            if self.token and origin(url) == self.origin:
                # Not carried over a redirect (the hub answers resolve/ with a redirect to its CDN, another host).
                req.add_unredirected_header('Authorization', 'Bearer ' + self.token)
            try:
                return self.opener.open(req, timeout=self.timeout)
            except urllib.error.HTTPError as e:
                if e.code not in self.REDIRECTS or not e.headers.get('Location'):
                    raise
                if stop and stop(e.headers):
                    return e
                e.close()
                url = urljoin(url, e.headers['Location'])
                if method == 'POST' and e.code == 303:
                    method = 'GET'
        raise FetchError('%s: more than 10 redirects' % url)


def http_failure(url, e):
    import urllib.error
    if isinstance(e, urllib.error.HTTPError):
        return FetchError('%s: HTTP %d%s' % (url, e.code, ' (the token is refused or missing)' if e.code in (401, 403)
                                             else ' (no such file at this revision)' if e.code == 404 else ''))
    return FetchError('%s: %s' % (url, getattr(e, 'reason', None) or e or type(e).__name__))


def strip_etag(value):
    if not value:
        return None
    value = value.strip()
    if value.startswith('W/'):
        value = value[2:]
    return value.strip('"') or None


def metadata(source, url):
    """What a HEAD says about one file: size, the version it is (for a resume), and from the hub its sha256 and the
    commit the revision resolved to. The hub's 302 is the answer (not followed): X-Linked-Size is the file's size,
    X-Linked-Etag its LFS oid = sha256, X-Repo-Commit the commit - as huggingface_hub's get_hf_file_metadata reads
    them."""
    import http.client
    try:
        r = source.open(url, 'HEAD', stop=lambda h: h.get('X-Linked-Size') or h.get('X-Linked-Etag'))
    except (OSError, ValueError, http.client.HTTPException) as e:
        raise http_failure(url, e)
    with r:
        h, code = r.headers, r.getcode()
    linked = strip_etag(h.get('X-Linked-Etag'))
    size = h.get('X-Linked-Size') or (h.get('Content-Length') if code == 200 else None)
    if size is None or not size.strip().isdigit():
        raise FetchError('%s: the source answered HEAD without Content-Length (nor the hub\'s X-Linked-Size), so the '
                         'file\'s size is unknown and its download could be neither checked nor resumed; serve it '
                         'from a server that sends Content-Length for HEAD (any static file server does), or use '
                         'another source' % url)
    etag = h.get('ETag')
    return {'size': int(size), 'etag': etag, 'linked_etag': linked, 'last_modified': h.get('Last-Modified'),
            'sha256': linked.lower() if linked and SHA_RE.match(linked.lower()) else None,
            'commit': h.get('X-Repo-Commit'), 'identity': linked or strip_etag(etag) or h.get('Last-Modified')}


class TokenBucket(object):
    """One rate limit shared by every download thread: each takes what it received, and sleeps off the debt."""

    def __init__(self, rate):
        self.rate = float(rate)
        self.burst = self.tokens = max(self.rate / 4, 1.0)
        self.t = time.monotonic()
        self.lock = threading.Lock()

    def take(self, n):
        with self.lock:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.t) * self.rate)
            self.t = now
            self.tokens -= n
            wait = -self.tokens / self.rate if self.tokens < 0 else 0
        if wait > 0:
            time.sleep(wait)


# ------------------------------------------------------------------------------------------ downloading

def read_json(path):
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def discard(*paths):
    for p in paths:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass


def note(text):
    sys.stderr.write('gpuhost-model: %s\n' % text)
    sys.stderr.flush()


def content_range(value):
    m = re.match(r'^bytes (\d+)-(\d+)/(\d+)$', (value or '').strip())
    return tuple(int(x) for x in m.groups()) if m else None


class Download(object):
    """One file of the source into <staging>/<name>.part, resumable. <name>.part.json records the version the
    partial was started with - the GET's ETag (else Last-Modified) and size, and the HEAD's identity (the hub's
    X-Linked-Etag, else the ETag) - so a resume sends Range with If-Range: a changed file answers 200 with all of
    it, never the rest of another version. The sha256 is computed from the bytes as they arrive (one read)."""

    RETRIES = 3   # a transfer that broke off after making progress is resumed at once, this many times

    def __init__(self, source, url, name, meta, staging, progress, bucket, expected, staged_sums, stats):
        self.http, self.url, self.name, self.meta = source, url, name, meta
        self.part = os.path.join(staging, name + '.part')
        self.side = self.part + '.json'
        self.final = os.path.join(staging, name)
        self.progress, self.bucket, self.expected, self.staged_sums, self.stats = \
            progress, bucket, expected, staged_sums, stats

    def partial(self):
        """Bytes of a partial this download will resume (0: none, or one it must not resume - discarded here)."""
        size = self.meta['size']
        have = os.path.getsize(self.part) if os.path.exists(self.part) else 0
        if not have:
            discard(self.side)
            return 0
        state = read_json(self.side)
        why = None
        if not state:
            why = 'it has no record of the version it was started from (%s)' % os.path.basename(self.side)
        elif state.get('size') != size:
            why = 'the file on the source is %d bytes now, the partial was started for %s' % (size, state.get('size'))
        elif state.get('identity') and self.meta.get('identity') and state['identity'] != self.meta['identity']:
            why = 'the file on the source changed (%s, the partial was started from %s)' % (
                self.meta['identity'], state['identity'])
        elif not (state.get('etag') or state.get('last_modified')):
            why = 'the source gave no ETag or Last-Modified to resume it against'
        elif have > size:
            why = 'it is longer than the file'
        if why:
            note('%s: the partial download (%s) is discarded and the file fetched whole: %s' % (
                self.name, human(have), why))
            discard(self.part, self.side)
            return 0
        return have

    def run(self, have):
        size = self.meta['size']
        self.progress.started(self.name)
        ok = False
        try:
            self.have, self.h, self.resumed = have, hashlib.sha256(), have
            if have:
                # The partial's bytes into the hash first (read once here, then the rest as it arrives).
                self.h = self._hash_partial(have)
                self.stats.add('resumed', have)
            attempts = 0
            while self.have < size or not os.path.exists(self.part):
                before = self.have
                try:
                    self._transfer()
                except FetchError:
                    attempts += 1
                    if attempts >= self.RETRIES or not os.path.exists(self.part) or \
                            os.path.getsize(self.part) <= before:
                        raise
                    # Broke off after making progress: resume at once from what is on disk.
                    on_disk = os.path.getsize(self.part)
                    if on_disk != self.have:
                        self.have, self.h = on_disk, self._hash_partial(on_disk)
            if self.have != size:
                raise FetchError('%s: the transfer ended at %s of %s; the next `up` resumes it' % (
                    self.name, human(self.have), human(size)))
            digest = self.h.hexdigest()
            if self.expected and digest != self.expected[0]:
                discard(self.part, self.side)
                self.progress.back(size)
                raise FetchError('%s: downloaded, but its sha256 is %s..., %s says %s...; removed from staging, will '
                                 'be fetched again' % (self.name, digest[:12], SAYS[self.expected[1]],
                                                       self.expected[0][:12]))
            os.chmod(self.part, 0o644)
            os.rename(self.part, self.final)
            discard(self.side)
            self.staged_sums.record(self.name, {'stat': stat_key(os.stat(self.final), self.final), 'sha256': digest,
                                                'hashed_at': int(time.time())})
            ok = True
        finally:
            self.progress.finished(self.name, ok)

    def _hash_partial(self, have):
        h = hashlib.sha256()
        buf = bytearray(HASH_BLOCK)
        view = memoryview(buf)
        left = have
        with open(self.part, 'rb', buffering=0) as f:
            while left:
                n = f.readinto(view[:min(left, HASH_BLOCK)])
                if not n:
                    break
                h.update(view[:n])
                self.progress.worked(n)
                left -= n
        return h

    def _restart(self, why):
        """Drop what this download holds and fetch the file whole: never splice two versions."""
        note('%s: the partial (%s) is discarded and the file downloaded whole: %s' % (self.name, human(self.have), why))
        discard(self.part, self.side)
        self.progress.back(self.have)
        self.stats.add('resumed', -self.resumed)
        self.have, self.h, self.resumed = 0, hashlib.sha256(), 0

    def _transfer(self):
        """One GET: from self.have on with Range + If-Range, or the whole file; self.have and self.h follow the
        bytes written."""
        import http.client
        import urllib.error
        size = self.meta['size']
        state = read_json(self.side) if self.have else None
        validator = state and (state.get('etag') or state.get('last_modified'))
        if self.have and not validator:
            self._restart('the source gave no ETag or Last-Modified to resume it against')
        headers = {}
        if self.have:
            headers['Range'] = 'bytes=%d-' % self.have
            headers['If-Range'] = validator
        try:
            r = self.http.open(self.url, 'GET', headers)
        except urllib.error.HTTPError as e:
            raise http_failure(self.url, e)
        except (OSError, http.client.HTTPException) as e:
            raise FetchError('%s: the transfer broke off at %s of %s (%s); the next `up` resumes it' % (
                self.name, human(self.have), human(size), getattr(e, 'reason', None) or e or type(e).__name__))
        with r:
            code = r.getcode()
            if self.have and code == 206:
                got = content_range(r.headers.get('Content-Range'))
                if not got or got[0] != self.have or got[2] != size:
                    self._restart('the source answered the resume with %s (wanted bytes %d- of %d)' % (
                        r.headers.get('Content-Range'), self.have, size))
                    return
                mode = 'ab'
            elif code == 200:
                if self.have:
                    same = state.get('etag') and r.headers.get('ETag') == state.get('etag')
                    self._restart('the source ignored the Range request' if same else
                                  'the file changed on the source since the partial was started (If-Range did not '
                                  'match)')
                length = r.headers.get('Content-Length')
                if length is not None and length.isdigit() and int(length) != size:
                    raise FetchError('%s: the source sends %s bytes for it, its HEAD said %d; the file is changing on '
                                     'the source - re-run when it is stable' % (self.name, length, size))
                etag = r.headers.get('ETag')
                atomic_write(self.side, json.dumps({
                    'url': self.url, 'size': size, 'etag': etag if etag and not etag.startswith('W/') else None,
                    'last_modified': r.headers.get('Last-Modified'), 'identity': self.meta.get('identity'),
                    'started': int(time.time())}, sort_keys=True) + '\n', 0o600)
                mode = 'wb'
            else:
                raise FetchError('%s: HTTP %d to a GET%s' % (self.url, code, ' with Range' if self.have else ''))
            chunk = 1 << 20
            if self.bucket:
                chunk = int(min(chunk, max(4096, self.bucket.rate / 8)))
            try:
                # Unbuffered: what was received is in the file (the page cache) at once, so a job killed at any
                # point leaves a partial whose size is exactly the bytes it got - the resume asks for none twice.
                with open(self.part, mode, buffering=0) as out:
                    while True:
                        block = r.read1(chunk)
                        if not block:
                            break
                        if self.have + len(block) > size:
                            raise FetchError('%s: the source sends more than the %d bytes its HEAD said; the file is '
                                             'changing on the source - re-run when it is stable' % (self.name, size))
                        view = memoryview(block)
                        while view:
                            view = view[out.write(view):]
                        self.h.update(block)
                        self.have += len(block)
                        self.progress.add(len(block))
                        self.stats.add('received', len(block))
                        if self.bucket:
                            self.bucket.take(len(block))
                    out.flush()
                    os.fsync(out.fileno())   # the sum is recorded against these bytes: they must be on disk
            except (OSError, http.client.HTTPException) as e:
                raise FetchError('%s: the transfer broke off at %s of %s (%s); the next `up` resumes it' % (
                    self.name, human(os.path.getsize(self.part) if os.path.exists(self.part) else 0), human(size),
                    getattr(e, 'reason', None) or e or type(e).__name__))


class Stats(object):
    def __init__(self):
        self.lock, self.data = threading.Lock(), collections.Counter()

    def add(self, key, n):
        with self.lock:
            self.data[key] += n


def staged_files(staging):
    return {n for n in os.listdir(staging) if not n.startswith('.') and not n.endswith(('.part', '.part.json'))}


def hub_metadata(source, base, names, workers, progress):
    """HEAD of every name (in parallel): {name: metadata}."""
    out, lock = {}, threading.Lock()
    progress.begin('check', files_total=len(names), note='asking the source about %d files' % len(names))

    def one(name):
        m = metadata(source, '%s/%s' % (base, name))
        with lock:
            out[name] = m
        progress.finished(name)
    errors = run_pool(sorted(names), workers, one)
    if errors:
        raise FetchError(errors[0] + ('' if len(errors) == 1 else ' (and %d more files)' % (len(errors) - 1)))
    return out


def fetch(job, progress=None):
    """What the model directory lacks (missing, short, long or mismatching files), downloaded from job["source"]
    into a staging directory beside it on the same file system (in parallel, resumable), checked there, then moved
    into place. A free-space check first. Returns a summary dict; raises FetchError."""
    import shutil
    progress = progress or PROGRESS
    d, base = job['dir'], job['source'].rstrip('/')
    source = Http(base, read_token())
    staging = os.path.join(job['storage'], '.gpuhost-staging', '%s@%s' % (job['id'], job['revision']))
    os.makedirs(staging, mode=0o755, exist_ok=True)
    progress.label = '%s@%s' % (job['id'], job['revision'])
    conns = max(1, int(job.get('connections') or 8))
    bucket = TokenBucket(job['max_bytes_per_s']) if job.get('max_bytes_per_s') else None
    sums = dict(job.get('checksums') or {})
    staged_sums = SumCache(os.path.join(staging, '.gpuhost-sums.json'))
    stats = Stats()
    t0 = time.time()

    def need(rep):
        names = set(rep['missing'])
        for key in ('short', 'long', 'mismatch'):
            names.update(x.split(' ')[0] for x in rep[key])
        return names

    def download(names, metas, expected):
        have = {}
        jobs = {}
        for n in names:
            jobs[n] = Download(source, '%s/%s' % (base, n), n, metas[n], staging, progress, bucket, expected.get(n),
                               staged_sums, stats)
            have[n] = jobs[n].partial()
        return jobs, have

    # The manifest first (small): config.json and the index, if the directory lacks them.
    progress.begin('check', note='looking at %s' % d)
    rep = verify(dict(job, hash=False), progress)
    todo = need(rep) | (set(MANIFEST) if rep.get('dir_missing') else set())
    manifest = sorted((todo & set(MANIFEST)) - staged_files(staging))
    if manifest:
        metas = hub_metadata(source, base, manifest, conns, progress)
        jobs, have = download(manifest, metas, {n: (sums[n], 'checksums') for n in manifest if n in sums})
        progress.begin('download', total=sum(metas[n]['size'] for n in manifest), done=sum(have.values()),
                       files_total=len(manifest), note='starting: %s from %s' % (', '.join(manifest), base))
        progress.note = ''
        errors = run_pool(manifest, conns, lambda n: jobs[n].run(have[n]))
        if errors:
            raise FetchError('; '.join(errors))
    index_at = os.path.join(staging, INDEX) if os.path.exists(os.path.join(staging, INDEX)) else os.path.join(d, INDEX)
    try:
        with open(index_at) as f:
            shards = index_shards(json.load(f)['weight_map'])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise FetchError('%s from %s is not a safetensors index (%s)' % (INDEX, base, e))
    # What each file's sha256 must be: the checksum file's, else the hub's for each LFS file (X-Linked-Etag).
    metas, hub_sums, commit = {}, {}, None
    cache = SumCache(job.get('cache'))
    if not sums:
        known = cache.data.get('.hub') if isinstance(cache.data.get('.hub'), dict) else {}
        if known.get('source') == base and set(shards) <= set(known.get('sums') or {}):
            hub_sums, commit = dict(known['sums']), known.get('commit')
        else:
            metas = hub_metadata(source, base, shards, conns, progress)
            hub_sums = {n: m['sha256'] for n, m in metas.items() if m['sha256']}
            commit = next((m['commit'] for m in metas.values() if m['commit']), None)
            if COMMIT_RE.match(job['revision']) and commit and commit != job['revision']:
                raise FetchError('the source resolved revision %s to commit %s (X-Repo-Commit); the source is not '
                                 'serving the declared revision' % (job['revision'], commit))
            if hub_sums and job.get('cache'):
                cache.data['.hub'] = {'source': base, 'commit': commit, 'sums': hub_sums}
                cache.replace(cache.data)
    expected = {n: (s, 'checksums') for n, s in sums.items()} or {n: (s, 'hub') for n, s in hub_sums.items()}
    # The shards already there, hashed where the cache has no sum (in parallel): a mismatching one is fetched again.
    if job.get('hash'):
        progress.begin('check', note='verifying what %s holds' % d)
        rep = verify(dict(job, hub_sums=hub_sums), progress)
        todo |= need(rep)
    if rep.get('dir_missing') or INDEX in todo:
        todo |= {s for s in shards if not os.path.exists(os.path.join(d, s))}
    todo |= {n for n in sums if not os.path.exists(os.path.join(d, n))}
    files = sorted(todo - set(MANIFEST) - staged_files(staging))
    missing_meta = [n for n in files if n not in metas]
    if missing_meta:
        metas.update(hub_metadata(source, base, missing_meta, conns, progress))
    stats.data.clear()   # the report's byte counts are the shards' (and other big files'), as the line shows them
    jobs, have = download(files, metas, expected)
    total, done = sum(metas[n]['size'] for n in files), sum(have.values())
    free = shutil.disk_usage(job['storage']).free
    margin = 1 << 30
    if total - done + margin > free:
        raise FetchError('not enough space on %s: the download needs %s more (plus 1 GB to spare), %s are free; make '
                         'room (an old revision?) and re-run' % (job['storage'], human(total - done), human(free)))
    t_download = time.time()
    if files:
        # Largest first: the last files to finish are small ones, so the connections stay busy to the end.
        order = sorted(files, key=lambda n: (-metas[n]['size'], n))
        progress.begin('download', total=total, done=done, files_total=len(files),
                       note='starting: %d files from %s, %d at once%s' % (
                           len(files), base, min(conns, len(files)),
                           ', at most %s/s' % human(bucket.rate) if bucket else ''))
        progress.note = ''
        errors = run_pool(order, conns, lambda n: jobs[n].run(have[n]))
        progress.note = 'done' if not errors else 'stopped: %d of %d files failed' % (len(errors), len(files))
        progress.emit()
        progress.note = ''
        if errors:
            raise FetchError(errors[0] + ('' if len(errors) == 1 else ' (and %d more files failed: %s)' % (
                len(errors) - 1, '; '.join(errors[1:4]))))
    t_download = time.time() - t_download
    # Checked in the staging directory before anything moves: sizes against the headers, sums (computed while
    # downloading, kept in the staging directory's cache; a file staged by an earlier run is hashed now if need be).
    staged = sorted(staged_files(staging))
    progress.begin('check', note='checking %d downloaded files' % len(staged))
    want = {n: expected[n][0] for n in staged if n in expected}
    check = verify({'dir': staging, 'id': job['id'], 'revision': job['revision'], 'hash': True,
                    'cache': staged_sums.path, 'hash_workers': job.get('hash_workers'), 'only': staged,
                    'checksums' if sums else 'hub_sums': want}, progress)
    bad = check['short'] + check['long'] + check['mismatch'] + check['problems']
    if bad:
        for x in check['short'] + check['long'] + check['mismatch']:
            discard(os.path.join(staging, x.split(' ')[0]))
        raise FetchError('downloaded files do not check out: %s; removed from staging (%s), will be fetched again' % (
            '; '.join(bad), staging))
    os.makedirs(d, mode=0o755, exist_ok=True)
    kept = SumCache(staged_sums.path).data
    for name in staged:
        os.chmod(os.path.join(staging, name), 0o644)
        os.replace(os.path.join(staging, name), os.path.join(d, name))
    fsync_dir(d)
    # The sums travel with the files (this run checked them and moved them; the move changed only their ctime): the
    # verification after this reads none.
    dir_cache = SumCache(job.get('cache'))
    for name in staged:
        if isinstance(kept.get(name), dict) and 'sha256' in kept[name]:
            dir_cache.data[name] = dict(kept[name], stat=stat_key(os.stat(os.path.join(d, name)), os.path.join(d, name)))
    dir_cache.replace(dir_cache.data)
    discard(staged_sums.path)   # everything moved: the staging directory is empty again
    return {'downloaded': staged, 'downloaded_bytes': stats.data['received'], 'resumed_bytes': stats.data['resumed'],
            'download_s': round(t_download, 3), 'fetch_s': round(time.time() - t0, 3),
            'connections': min(conns, max(len(files), 1)), 'max_bytes_per_s': bucket.rate if bucket else None,
            'hub_sums': hub_sums, 'hub_commit': commit}


def fetch_file(job, progress=None):
    """One file - an installer - from job["url"] to job["dest"], with a model file's guarantees: a file already
    there with the declared sha256 is kept (its sum cached by stat, so it is read once); else it is downloaded into
    <dir>/.gpuhost-staging/<sha256>/ (resumable, hashed as it arrives, the token only to the URL's own origin),
    checked against job["sha256"] and only then moved into place. Returns the report; raises FetchError."""
    import shutil
    progress = progress or PROGRESS
    dest, want, url = job['dest'], job['sha256'], job['url']
    d, name = os.path.split(dest)
    os.makedirs(d, mode=0o700, exist_ok=True)
    cache = SumCache(os.path.join(d, '.gpuhost-sums.json'))
    t0 = time.time()
    if os.path.exists(dest):
        st = os.stat(dest)
        entry = cache.data.get(name)
        if isinstance(entry, dict) and entry.get('stat') == stat_key(st, dest):
            got = entry.get('sha256')
        else:
            progress.begin('check', total=st.st_size, note='hashing %s' % dest)
            got = sha256_file(dest, progress=progress)
            cache.record(name, {'stat': stat_key(st, dest), 'sha256': got, 'hashed_at': int(time.time())})
        if got == want:
            return {'file': dest, 'sha256': got, 'bytes': st.st_size, 'downloaded_bytes': 0, 'resumed_bytes': 0,
                    'fetched': False, 'fetch_s': round(time.time() - t0, 3)}
        note('%s has sha256 %s..., not the declared %s...: downloaded again' % (dest, got[:12], want[:12]))
    staging = os.path.join(d, '.gpuhost-staging', want)
    os.makedirs(staging, mode=0o700, exist_ok=True)
    source = Http(url, read_token())
    progress.begin('check', note='asking %s' % url)
    meta = metadata(source, url)
    stats = Stats()
    staged_sums = SumCache(os.path.join(staging, '.gpuhost-sums.json'))
    dl = Download(source, url, name, meta, staging, progress, None, (want, 'declared'), staged_sums, stats)
    have = dl.partial() if not os.path.exists(dl.final) else meta['size']
    free = shutil.disk_usage(d).free
    if meta['size'] - have + (1 << 30) > free:
        raise FetchError('not enough space on %s: %s needs %s more (plus 1 GB to spare), %s are free; make room and '
                         're-run' % (d, name, human(meta['size'] - have), human(free)))
    if not os.path.exists(dl.final):
        progress.begin('download', total=meta['size'], done=have, files_total=1,
                       note='%s %s from %s' % ('resuming' if have else 'starting', name, url))
        dl.run(have)
    got = (staged_sums.data.get(name) or {}).get('sha256') or sha256_file(dl.final)
    if got != want:
        discard(dl.final)
        raise FetchError('%s: downloaded, but its sha256 is %s..., the declared sha256 is %s...; removed, will be '
                         'fetched again' % (name, got[:12], want[:12]))
    os.chmod(dl.final, 0o600)
    os.replace(dl.final, dest)
    fsync_dir(d)
    cache.record(name, {'stat': stat_key(os.stat(dest), dest), 'sha256': got, 'hashed_at': int(time.time())})
    shutil.rmtree(staging, ignore_errors=True)
    return {'file': dest, 'sha256': got, 'bytes': meta['size'], 'downloaded_bytes': stats.data['received'],
            'resumed_bytes': stats.data['resumed'], 'fetched': True, 'fetch_s': round(time.time() - t0, 3)}


def fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------------------ reporting

def textfile(path, rep):
    labels = 'model="%s",revision="%s"' % (str(rep.get('id')).replace('"', ''), str(rep.get('revision')).replace('"', ''))
    lines = [
        '# HELP gpuhost_model_verified Whether the model\'s files matched its index, headers and checksums (1) or '
        'not (0) at the last verification by pulumi up.',
        '# TYPE gpuhost_model_verified gauge',
        'gpuhost_model_verified{%s} %d' % (labels, 1 if rep['verified'] else 0),
        '# HELP gpuhost_model_shards Shards the model\'s index names (state="expected") and those present in full '
        '(state="complete").',
        '# TYPE gpuhost_model_shards gauge',
        'gpuhost_model_shards{%s,state="expected"} %d' % (labels, rep['shards']),
        'gpuhost_model_shards{%s,state="complete"} %d' % (labels, rep['present'] - len(rep['short'])),
        '# HELP gpuhost_model_size_bytes Bytes of the model\'s shards on the host.',
        '# TYPE gpuhost_model_size_bytes gauge',
        'gpuhost_model_size_bytes{%s} %d' % (labels, rep['bytes']),
        '# HELP gpuhost_model_verification_timestamp_seconds When the model was last verified (Unix time).',
        '# TYPE gpuhost_model_verification_timestamp_seconds gauge',
        'gpuhost_model_verification_timestamp_seconds{%s} %d' % (labels, int(time.time())),
    ]
    if rep.get('oldest_sha256_at') is not None:
        lines += [
            '# HELP gpuhost_model_oldest_sha256_timestamp_seconds When the shard whose sha256 was computed longest ago '
            'was hashed (Unix time): sums older than gpuhost:model.rehash_days are computed again by the next up.',
            '# TYPE gpuhost_model_oldest_sha256_timestamp_seconds gauge',
            'gpuhost_model_oldest_sha256_timestamp_seconds{%s} %d' % (labels, rep['oldest_sha256_at'])]
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    atomic_write(path, '\n'.join(lines) + '\n')


def main():
    global PROGRESS
    job = json.loads(sys.argv[1])
    if job.get('kind') == 'file':
        PROGRESS = progress = Progress(os.environ.get('GPUHOST_PROGRESS') or None, os.path.basename(job['dest']))
        progress.start()
        try:
            rep = fetch_file(job, progress)
        except FetchError as e:
            rep = {'file': job['dest'], 'fetch_error': str(e)}
        finally:
            progress.stop()
        sys.stdout.write(json.dumps(rep, sort_keys=True) + '\n')
        return
    PROGRESS = progress = Progress(os.environ.get('GPUHOST_PROGRESS') or None, '%s@%s' % (job.get('id'),
                                                                                           job.get('revision')))
    progress.start()
    try:
        fetched, failed = None, None
        if job.get('source'):
            try:
                fetched = fetch(job, progress)
            except FetchError as e:
                failed = str(e)
        if failed:
            progress.begin('check', note='the download failed')
            rep = dict(verify(dict(job, hash=False), progress), fetch_error=failed, verified=False)
        else:
            progress.begin('check', note='verifying %s' % job['dir'])
            rep = verify(dict(job, hub_sums=(fetched or {}).pop('hub_sums', None)), progress)
            rep.update(fetched or {})
        if job.get('textfile'):
            textfile(job['textfile'], rep)
    finally:
        progress.stop()
    sys.stdout.write(json.dumps(rep, sort_keys=True) + '\n')


if __name__ == '__main__':
    main()
