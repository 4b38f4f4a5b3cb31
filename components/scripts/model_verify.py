"""Verify a model directory on the host (runs there, python3 standard library only; sent by model_verify.sh).

argv[1]: the job, JSON: {"dir", "id", "revision", "checksums": {file: sha256} | null, "cache": path,
"hash": bool (false: a quick look - sizes, headers and cached sums only, what a preview needs),
"textfile": path | null (node_exporter textfile to write the result to)}.
Prints one JSON report line: the state of config.json, the index, every shard (missing, short, long,
mismatch, unreadable by an unprivileged container, unhashed), byte counts, and how many shard bytes
this run read (0 when every shard's size and mtime match the cache: nothing is read again).

A shard's expected size comes from the shard itself: a safetensors file is an 8-byte little-endian
header length, a JSON header whose data_offsets give every tensor's place, then the data; a file
shorter than the end of its last tensor was cut off."""

import hashlib
import re
import json
import os
import stat
import struct
import sys
import tempfile
import time

INDEX = 'model.safetensors.index.json'
SINGLE = 'model.safetensors'
MAX_HEADER = 100 * 1024 * 1024   # safetensors' own limit on the header


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


def sha256_file(path, counter):
    h = hashlib.sha256()
    with open(path, 'rb') as f:
        while True:
            block = f.read(4 << 20)
            if not block:
                break
            counter[0] += len(block)
            h.update(block)
    return h.hexdigest()


def load_cache(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def save_cache(path, cache):
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix='.tmp-')
    with os.fdopen(fd, 'w') as f:
        json.dump(cache, f, sort_keys=True)
    os.rename(tmp, path)


def world_readable(st):
    return bool(st.st_mode & stat.S_IROTH)


def verify(job):
    start = time.time()
    d = job['dir']
    sums = job.get('checksums') or {}
    do_hash = bool(job.get('hash'))
    rep = {'dir': d, 'id': job.get('id'), 'revision': job.get('revision'), 'problems': [], 'missing': [],
           'short': [], 'long': [], 'mismatch': [], 'unreadable': [], 'unhashed': [], 'shards': 0, 'present': 0,
           'bytes': 0, 'expected_bytes': 0, 'read_bytes': 0, 'hashed': 0, 'checked_sums': 0}
    counter = [0]
    if not os.path.isdir(d):
        rep['problems'].append('%s does not exist on the host' % d)
        rep['dir_missing'] = True
        return finish(rep, start, counter)
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
    cache = load_cache(job['cache']) if job.get('cache') else {}
    new_cache = {}
    tensors = {}
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
        key = [st.st_size, st.st_mtime_ns, st.st_ino]
        hit = cache.get(name)
        entry = dict(hit) if hit and hit.get('stat') == key else {'stat': key}
        try:
            if 'end' not in entry:
                entry['end'], entry['tensors'] = shard_end(p, counter)
        except (OSError, ValueError) as e:
            rep['problems'].append('%s: %s' % (name, e))
            continue
        rep['expected_bytes'] += entry['end']
        for t in entry['tensors']:
            tensors[t] = name
        if st.st_size < entry['end']:
            rep['short'].append('%s (%d of %d bytes)' % (name, st.st_size, entry['end']))
            continue
        if st.st_size > entry['end']:
            rep['long'].append('%s (%d bytes, its header ends the data at %d)' % (name, st.st_size, entry['end']))
        want = sums.get(name)
        if want:
            if 'sha256' not in entry:
                if do_hash:
                    entry['sha256'] = sha256_file(p, counter)
                    rep['hashed'] += 1
                else:
                    rep['unhashed'].append(name)
            if 'sha256' in entry:
                rep['checked_sums'] += 1
                if entry['sha256'] != want:
                    rep['mismatch'].append('%s (sha256 %s..., the checksum file says %s...)' % (
                        name, entry['sha256'][:12], want[:12]))
        new_cache[name] = entry
    if weight_map:
        # The index must agree with the shards' own headers: a tensor in the wrong shard fails the load.
        wrong = [t for t, s in weight_map.items() if s in new_cache and tensors.get(t) != s]
        if wrong:
            rep['problems'].append('%d tensors of %s are not in the shard it names (e.g. %s)' % (
                len(wrong), INDEX, sorted(wrong)[0]))
    for name in sorted(sums):
        if name in shards:
            continue
        p = os.path.join(d, name)
        if not os.path.exists(p):
            if name not in rep['missing']:
                rep['missing'].append(name)
        elif name in ('config.json', INDEX) or os.path.getsize(p) < (64 << 20):
            # The small files the checksum file names (config, index, tokenizer): read every time.
            got = sha256_file(p, [0])
            rep['checked_sums'] += 1
            if got != sums[name]:
                rep['mismatch'].append('%s (sha256 %s..., the checksum file says %s...)' % (
                    name, got[:12], sums[name][:12]))
    if job.get('cache'):
        try:
            save_cache(job['cache'], new_cache)
        except OSError:
            pass
    return finish(rep, start, counter)


def finish(rep, start, counter):
    rep['read_bytes'] = counter[0]
    rep['elapsed_s'] = round(time.time() - start, 3)
    rep['verified'] = not (rep['problems'] or rep['missing'] or rep['short'] or rep['long'] or rep['mismatch'] or
                           rep['unreadable'] or rep['unhashed'])
    return rep


# ------------------------------------------------------------------------------------------ fetching

PROGRESS_S = 10.0   # a progress line at least this often (the program relays each to the pulumi output)


class FetchError(Exception):
    pass


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


def human(n):
    n = float(n)
    for unit in ('B', 'kB', 'MB', 'GB', 'TB'):
        if n < 1000 or unit == 'TB':
            return ('%d %s' % (n, unit)) if unit == 'B' else ('%.1f %s' % (n, unit))
        n /= 1000.0


def request(url, token, method='GET', start=0):
    import urllib.request
    headers = {'User-Agent': 'gpuhost-model-fetch'}
    if start:
        headers['Range'] = 'bytes=%d-' % start
    req = urllib.request.Request(url, headers=headers, method=method)
    if token:
        # Not carried over a redirect (the hub answers resolve/ with a redirect to its CDN, another host).
        req.add_unredirected_header('Authorization', 'Bearer ' + token)
    return urllib.request.urlopen(req, timeout=60)


def remote_size(url, token):
    import urllib.error
    try:
        with request(url, token, 'HEAD') as r:
            return int(r.headers.get('Content-Length') or 0)
    except urllib.error.HTTPError as e:
        raise FetchError('%s: HTTP %d%s' % (url, e.code, ' (the token is refused or missing)' if e.code in (401, 403)
                                             else ' (no such file at this revision)' if e.code == 404 else ''))
    except (OSError, ValueError) as e:
        raise FetchError('%s: %s' % (url, getattr(e, 'reason', e) or type(e).__name__))


class Progress(object):
    def __init__(self, label, total, done):
        self.label, self.total, self.start_done, self.done = label, total, done, done
        self.t0 = self.last = time.time()

    def add(self, n, name, force=False):
        self.done += n
        now = time.time()
        if force or now - self.last >= PROGRESS_S:
            self.last = now
            rate = (self.done - self.start_done) / max(now - self.t0, 1e-6)
            left = (self.total - self.done) / rate if rate > 0 else 0
            sys.stderr.write('gpuhost-progress: %s: %s of %s (%.0f%%), %s/s, ETA %s - %s\n' % (
                self.label, human(self.done), human(self.total), 100.0 * self.done / max(self.total, 1),
                human(rate), '%dm%02ds' % divmod(int(left), 60), name))
            sys.stderr.flush()


def download(url, token, part, size, progress, name):
    """url into part, resuming from what part holds (HTTP Range); returns when part has size bytes."""
    import http.client
    import urllib.error
    have = os.path.getsize(part) if os.path.exists(part) else 0
    if have > size:
        os.unlink(part)
        have = 0
    if have == size:
        return
    try:
        with request(url, token, start=have) as r:
            if have and r.status != 206:
                have = 0   # the server ignored the range: start over
            with open(part, 'ab' if have else 'wb') as f:
                while True:
                    block = r.read(1 << 20 if size > (64 << 20) else 4096)
                    if not block:
                        break
                    f.write(block)
                    progress.add(len(block), name)
    except urllib.error.HTTPError as e:
        raise FetchError('%s: HTTP %d' % (url, e.code))
    except (OSError, http.client.HTTPException) as e:
        raise FetchError('%s: the transfer broke off at %s of %s (%s); the next `up` resumes it' % (
            name, human(os.path.getsize(part) if os.path.exists(part) else 0), human(size),
            getattr(e, 'reason', e) or type(e).__name__))
    got = os.path.getsize(part)
    if got != size:
        raise FetchError('%s: the transfer ended at %s of %s; the next `up` resumes it' % (name, human(got),
                                                                                           human(size)))


def fetch(job):
    """What the model directory lacks (missing, short, long or mismatching files), downloaded from job["source"]
    into a staging directory beside it on the same file system (resumable), checked there, then moved into
    place. A free-space check first. Returns a summary dict; raises FetchError."""
    import shutil
    d, base = job['dir'], job['source'].rstrip('/')
    token = None
    if os.environ.get('GPUHOST_TOKEN_FILE'):
        with open(os.environ['GPUHOST_TOKEN_FILE']) as f:
            token = f.read().strip() or None
    staging = os.path.join(job['storage'], '.gpuhost-staging', '%s@%s' % (job['id'], job['revision']))
    os.makedirs(staging, mode=0o755, exist_ok=True)
    label = '%s@%s' % (job['id'], job['revision'])
    sums = job.get('checksums') or {}

    def need(rep):
        names = set(rep['missing'])
        for key in ('short', 'long', 'mismatch'):
            names.update(x.split(' ')[0] for x in rep[key])
        return names
    # The manifest first (small): config.json and the index, if the directory lacks them.
    rep = verify(dict(job, hash=False, cache=None))
    todo = need(rep) | ({'config.json', INDEX} if rep.get('dir_missing') else set())
    for name in sorted(todo & {'config.json', INDEX}):
        size = remote_size('%s/%s' % (base, name), token)
        download('%s/%s' % (base, name), token, os.path.join(staging, name + '.part'), size,
                 Progress(label, size, 0), name)
        os.replace(os.path.join(staging, name + '.part'), os.path.join(staging, name))
    index_at = os.path.join(staging, INDEX) if os.path.exists(os.path.join(staging, INDEX)) else os.path.join(d, INDEX)
    try:
        with open(index_at) as f:
            shards = index_shards(json.load(f)['weight_map'])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise FetchError('%s from %s is not a safetensors index (%s)' % (INDEX, base, e))
    if rep.get('dir_missing') or INDEX in todo:
        todo |= {s for s in shards if not os.path.exists(os.path.join(d, s))}
    todo |= {n for n in sums if not os.path.exists(os.path.join(d, n))}
    todo -= {n for n in todo if os.path.exists(os.path.join(staging, n))}
    files = sorted(todo - {'config.json', INDEX})
    sizes = {n: remote_size('%s/%s' % (base, n), token) for n in files}
    parts = {n: (os.path.getsize(os.path.join(staging, n + '.part'))
                 if os.path.exists(os.path.join(staging, n + '.part')) else 0) for n in files}
    total, done = sum(sizes.values()), sum(min(parts[n], sizes[n]) for n in files)
    free = shutil.disk_usage(job['storage']).free
    margin = 1 << 30
    if total - done + margin > free:
        raise FetchError('not enough space on %s: the download needs %s more (plus 1 GB to spare), %s are free; make '
                         'room (an old revision?) and re-run' % (job['storage'], human(total - done), human(free)))
    progress = Progress(label, total, done)
    if files:
        progress.add(0, 'starting: %d files from %s' % (len(files), base), force=True)
    for name in files:
        part = os.path.join(staging, name + '.part')
        download('%s/%s' % (base, name), token, part, sizes[name], progress, name)
        os.replace(part, os.path.join(staging, name))
    if files:
        progress.add(0, 'done', force=True)
    # Checked in the staging directory before anything moves: sizes against the headers, sums.
    staged = sorted(n for n in os.listdir(staging) if not n.endswith('.part'))
    check = verify({'dir': staging, 'id': job['id'], 'revision': job['revision'], 'hash': True, 'cache': None,
                    'checksums': {n: sums[n] for n in staged if n in sums}, 'only': staged})
    bad = check['short'] + check['long'] + check['mismatch'] + check['problems']
    if bad:
        for x in check['short'] + check['long'] + check['mismatch']:
            try:
                os.unlink(os.path.join(staging, x.split(' ')[0]))
            except OSError:
                pass
        raise FetchError('downloaded files do not check out (removed from the staging directory %s): %s' % (
            staging, '; '.join(bad)))
    os.makedirs(d, mode=0o755, exist_ok=True)
    for name in staged:
        os.chmod(os.path.join(staging, name), 0o644)
        os.replace(os.path.join(staging, name), os.path.join(d, name))
    return {'downloaded': staged, 'downloaded_bytes': total - done, 'resumed_bytes': done}


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
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix='.gpuhost-model-')
    with os.fdopen(fd, 'w') as f:
        f.write('\n'.join(lines) + '\n')
    os.chmod(tmp, 0o644)
    os.rename(tmp, path)


def main():
    job = json.loads(sys.argv[1])
    fetched = None
    if job.get('source'):
        try:
            fetched = fetch(job)
        except FetchError as e:
            rep = dict(verify(dict(job, hash=False)), fetch_error=str(e), verified=False)
            if job.get('textfile'):
                textfile(job['textfile'], rep)
            sys.stdout.write(json.dumps(rep, sort_keys=True) + '\n')
            return
    rep = verify(job)
    if fetched:
        rep.update(fetched)
    if job.get('textfile'):
        textfile(job['textfile'], rep)
    sys.stdout.write(json.dumps(rep, sort_keys=True) + '\n')


if __name__ == '__main__':
    main()
