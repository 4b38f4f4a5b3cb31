"""python -m tools.model_checksums SOURCE [-o FILE] [--endpoint URL] [--token-file PATH] [--file NAME ...]

Writes the checksum file gpuhost:model.checksums names (sha256sum's format, "<sha256>  <file>", # comments) for one
revision of a model, from the source's own metadata rather than from a copy someone downloaded:

- hf://<org>/<repo>@<revision>: the hub's API, GET <endpoint>/api/models/<org>/<repo>/revision/<revision>?blobs=true
  (huggingface_hub's model_info(files_metadata=True)): the commit the revision resolved to ("sha") and each LFS file's
  sha256 ("lfs": {"sha256"}) - the weights, never downloaded. The files the hub keeps in git (config.json, the index,
  the tokenizer: small) have no sha256 there; they are downloaded at that commit and hashed here.
- the http(s) URL of a mirror directory (gpuhost:model.source's other form): its index names the shards; a HEAD of
  each file gives its sha256 when the mirror passes on the hub's X-Linked-Etag (a hub-style .../resolve/<revision>
  URL does); else a file up to --max-hash-bytes is downloaded and hashed here, and a bigger one is an error naming it
  (hash it where the files are: sha256sum).

The token (a gated or private repo): env HF_TOKEN, or the file --token-file names - never the command line, where
`ps` and the shell's history would keep it. It is sent only to the source's own origin; the CDN the hub redirects
to never sees it (the same rule as the host's download, hostscripts/model_verify.py, whose HTTP code this
uses).

Examples:
  HF_TOKEN=$(cat ~/.config/gpuhost/hf-token) python -m tools.model_checksums \\
      hf://Qwen/Qwen3.5-122B-A10B@<commit> -o models/Qwen3.5-122B-A10B.sha256
  python -m tools.model_checksums https://mirror.example.internal/models/Qwen3.5-122B-A10B -o models/Q.sha256
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import hashlib
import importlib.util
import json
import os
import sys
import tempfile
import urllib.error
from urllib.parse import quote

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from config.model import HF_RE, revision as check_revision  # noqa: E402

_spec = importlib.util.spec_from_file_location('model_verify', os.path.join(ROOT, 'hostscripts',
                                                                             'model_verify.py'))
mv = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mv)

DEFAULT_ENDPOINT = 'https://huggingface.co'
MAX_HASH_BYTES = 64 << 20


class ChecksumError(Exception):
    pass


def read_json(source, url, what):
    try:
        with source.open(url, 'GET', {'Accept': 'application/json'}) as r:
            return json.loads(r.read().decode('utf-8'))
    except urllib.error.HTTPError as e:
        raise ChecksumError(str(mv.http_failure(url, e)) + ' - reading %s' % what)
    except (OSError, ValueError) as e:
        raise ChecksumError('%s: %s - reading %s' % (url, getattr(e, 'reason', None) or e, what))


def hash_url(source, url, name, limit):
    """sha256 of the file at url, downloaded here (at most `limit` bytes)."""
    h, n = hashlib.sha256(), 0
    try:
        with source.open(url, 'GET') as r:
            while True:
                block = r.read(1 << 20)
                if not block:
                    break
                n += len(block)
                if n > limit:
                    raise ChecksumError('%s: more than %s and the source gives no sha256 for it (no X-Linked-Etag); '
                                        'hash it where the files are (sha256sum %s) and add the line by hand, or '
                                        'raise --max-hash-bytes' % (name, mv.human(limit), name))
                h.update(block)
    except urllib.error.HTTPError as e:
        raise ChecksumError(str(mv.http_failure(url, e)))
    except OSError as e:
        raise ChecksumError('%s: %s' % (url, getattr(e, 'reason', None) or e))
    return h.hexdigest()


def flat(names, excludes, notes):
    """The names a model directory can hold (one plain file name each, model_verify.FILE_RE), minus --exclude."""
    out = []
    for n in names:
        if any(fnmatch.fnmatch(n, pat) for pat in excludes):
            continue
        if not mv.FILE_RE.match(n):
            notes.append('skipped %s: not a plain file name of the model directory (a subdirectory or a dot file)'
                         % n)
            continue
        out.append(n)
    return sorted(out)


def from_hub(org, repo, rev, endpoint, token, excludes, limit, notes):
    """({file: sha256}, commit, how) from the hub's API at one revision."""
    source = mv.Http(endpoint, token)
    api = '%s/api/models/%s/%s/revision/%s?blobs=true' % (endpoint, org, repo, quote(rev, safe=''))
    info = read_json(source, api, 'the revision\'s file list')
    commit = info.get('sha')
    if not commit or not mv.COMMIT_RE.match(commit):
        raise ChecksumError('%s: the answer names no commit ("sha"); is %s a hub?' % (api, endpoint))
    siblings = {s['rfilename']: s for s in info.get('siblings') or [] if isinstance(s, dict) and s.get('rfilename')}
    if not siblings:
        raise ChecksumError('%s: %s/%s at %s has no files' % (api, org, repo, rev))
    sums, hashed = {}, 0
    for name in flat(siblings, excludes, notes):
        lfs = siblings[name].get('lfs') or {}
        sha = str(lfs.get('sha256') or '').lower()
        if mv.SHA_RE.match(sha):
            sums[name] = sha
        else:
            # In git, not LFS: small files; the bytes at the resolved commit, hashed here.
            sums[name] = hash_url(source, '%s/%s/%s/resolve/%s/%s' % (endpoint, org, repo, commit, name), name, limit)
            hashed += 1
    return sums, commit, '%d LFS files: the hub\'s sha256; %d in git: downloaded and hashed here' % (
        len(sums) - hashed, hashed)


def from_mirror(base, token, extra, excludes, limit, notes):
    """({file: sha256}, commit or None, how) from a mirror directory: its index's shards, HEAD each."""
    source = mv.Http(base, token)
    index = read_json(source, '%s/%s' % (base, mv.INDEX), 'the safetensors index')
    try:
        shards = mv.index_shards(index['weight_map'])
    except (KeyError, TypeError, ValueError) as e:
        raise ChecksumError('%s/%s is not a safetensors index (%s)' % (base, mv.INDEX, e))
    names = flat(set(mv.MANIFEST) | set(shards) | set(extra), excludes, notes)
    sums, commits, linked = {}, set(), 0
    for name in names:
        url = '%s/%s' % (base, name)
        try:
            meta = mv.metadata(source, url)
        except mv.FetchError as e:
            raise ChecksumError(str(e))
        if meta['commit']:
            commits.add(meta['commit'])
        if meta['sha256']:
            sums[name], linked = meta['sha256'], linked + 1
        else:
            sums[name] = hash_url(source, url, name, limit)
    return sums, (sorted(commits)[0] if len(commits) == 1 else None), (
        '%d files: the sha256 the source names (X-Linked-Etag); %d: downloaded and hashed here' % (
            linked, len(sums) - linked))


def render(sums, title, how):
    lines = ['# %s' % title,
             '# written by tools/model_checksums.py on %s (%s)' % (datetime.date.today().isoformat(), how)]
    lines += ['%s  %s' % (sums[n], n) for n in sorted(sums)]
    return '\n'.join(lines) + '\n'


def write(path, text):
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix='.%s.' % os.path.basename(path))
    with os.fdopen(fd, 'w') as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.rename(tmp, path)


def token_from(args):
    if args.token_file:
        try:
            with open(args.token_file) as f:
                return f.read().strip() or None
        except OSError as e:
            raise ChecksumError('--token-file %s: %s' % (args.token_file, e.strerror or e))
    return os.environ.get('HF_TOKEN') or None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog='python -m tools.model_checksums', description=__doc__.split('\n\n')[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)   # --token must not pass for --token-file
    p.add_argument('source', help='hf://<org>/<repo>@<revision>, or the http(s) URL of a mirror directory')
    p.add_argument('-o', '--output', help='the checksum file to write (tmp + rename); stdout without it')
    p.add_argument('--endpoint', default=os.environ.get('HF_ENDPOINT') or DEFAULT_ENDPOINT,
                   help='the hub for hf:// (env HF_ENDPOINT, else %s)' % DEFAULT_ENDPOINT)
    p.add_argument('--token-file', help='a file holding the token (else env HF_TOKEN); never give it on the command '
                                        'line')
    p.add_argument('--file', action='append', default=[], help='with a mirror URL: another file of the model '
                                                               '(tokenizer.json, ...); repeatable')
    p.add_argument('--exclude', action='append', default=[], help='a glob of files to leave out (e.g. *.md); '
                                                                  'repeatable')
    p.add_argument('--max-hash-bytes', type=int, default=MAX_HASH_BYTES,
                   help='the biggest file without a published sha256 to download and hash here (%d)' % MAX_HASH_BYTES)
    args = p.parse_args(argv)
    notes = []
    try:
        token = token_from(args)
        m = HF_RE.match(args.source)
        if args.source.startswith('hf://'):
            if not m or not m.group(3):
                raise ChecksumError('%s: write hf://<org>/<repo>@<revision> - the checksum file is for one revision '
                                    '(the commit, or a tag)' % args.source)
            try:
                check_revision(m.group(3))
            except ValueError as e:
                raise ChecksumError('%s: %s' % (args.source, e))
            endpoint = args.endpoint.rstrip('/')
            sums, commit, how = from_hub(m.group(1), m.group(2), m.group(3), endpoint, token, args.exclude,
                                         args.max_hash_bytes, notes)
            title = '%s/%s at revision %s (commit %s), from %s' % (m.group(1), m.group(2), m.group(3), commit,
                                                                  endpoint)
            if m.group(3) != commit:
                notes.append('the revision %s is commit %s: gpuhost:model.revision may name either' % (
                    m.group(3), commit))
        elif args.source.startswith(('http://', 'https://')):
            base = args.source.rstrip('/')
            sums, commit, how = from_mirror(base, token, args.file, args.exclude, args.max_hash_bytes, notes)
            title = '%s%s' % (base, ' (commit %s)' % commit if commit else '')
        else:
            raise ChecksumError('%s is not hf://<org>/<repo>@<revision> or the http(s) URL of a mirror directory'
                                % args.source)
    except ChecksumError as e:
        sys.stderr.write('model_checksums: %s\n' % e)
        return 1
    text = render(sums, title, how)
    for n in notes:
        sys.stderr.write('model_checksums: %s\n' % n)
    if args.output and args.output != '-':
        write(args.output, text)
        sys.stderr.write('model_checksums: %d files -> %s (%s)\n' % (len(sums), args.output, how))
    else:
        sys.stdout.write(text)
    return 0


if __name__ == '__main__':
    sys.exit(main())
