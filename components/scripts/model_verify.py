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
            shards = sorted(set(weight_map.values()))
            if not shards or any('/' in s or s in ('.', '..') for s in shards):
                raise ValueError('weight_map names no shards, or a path outside the directory')
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
    rep = verify(job)
    if job.get('textfile'):
        textfile(job['textfile'], rep)
    sys.stdout.write(json.dumps(rep, sort_keys=True) + '\n')


if __name__ == '__main__':
    main()
