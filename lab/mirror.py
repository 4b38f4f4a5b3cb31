"""The lab's model mirror: the lab model's files (lab/labmodel.py) over HTTP on the lab's own loopback address, as an
operator's mirror on their network would serve them, and the parts of the Hugging Face hub a download reads.

A plain mirror (LAB/mirror/<dir>/<file> at /<dir>/<file>): HEAD with Content-Length, ETag and Last-Modified; GET
with byte ranges (206) honouring If-Range as RFC 9110 says - the range only when the validator still matches the
file, else 200 with all of it; one deliberately slow shard (SLOW: bytes per second), so a download lasts long enough
for the program's progress line.

The hub (LAB/mirror/<org>/<repo>/<revision>/<file>), as huggingface.co answers (read from huggingface_hub's
get_hf_file_metadata and model_info):
- HEAD/GET /<org>/<repo>/resolve/<revision>/<file>: X-Repo-Commit (the commit the revision resolved to); a small file
  directly with its git blob id as ETag; an LFS file (*.safetensors) as a 302 to the CDN (another listener, `cdn_url`)
  carrying X-Linked-Etag (the LFS oid: the file's sha256), X-Linked-Size and ETag - a client must take the size from
  X-Linked-Size, not from the redirect's own Content-Length;
- GET /api/models/<org>/<repo>/revision/<revision>[?blobs=true]: {"id", "sha", "siblings": [{"rfilename"} + with
  blobs "size", "blobId" and for LFS files "lfs": {"sha256", "size", "pointerSize"}]};
- with `hub_token` set, both refuse (401) a request without "Authorization: Bearer <token>", as a gated repo does.
The CDN serves the plain paths and must never see the token: every request's log record says whether it carried one.

Control, for tests (LAB/control/ in the lab):
- mirror-down: while it exists, connections are closed unanswered (a source gone mid-way);
- mirror-throttle.json: {"per_connection": bytes/s, "total": bytes/s, "files": {"<name>": bytes/s}} (each optional;
  re-read every half second, so a test can slow a transfer down or let it finish while it runs);
- replace_file(): a file's content replaced between two attempts (a new inode and mtime: a new ETag).
Every request is logged to the log file as one JSON line: {"path", "method", "range", "if_range", "status", "bytes"
(body bytes sent), "host" (the listener's host:port), "auth" (whether an Authorization header came), "start", "end"
(Unix times)} - so a test can prove that no byte was fetched twice, that transfers overlapped, and that the CDN never
saw the token."""

import asyncio
import email.utils
import hashlib
import json
import os
import re
import time

PORT = 8089
CDN_PORT = 8090
SLOW = {'model-00003-of-00003.safetensors': 10240}   # ~14 s for its 142,376 bytes
CHUNK = 256 * 1024                                  # unthrottled: big writes (the benchmark's 2 GB must not be slow)
THROTTLED_CHUNK = 4096
HUB_RE = re.compile(r'^([^/]+)/([^/]+)/resolve/([^/]+)/([^/]+)$')
API_RE = re.compile(r'^api/models/([^/]+)/([^/]+)/revision/([^/]+)$')
LFS_SUFFIXES = ('.safetensors', '.bin', '.gguf', '.pt')


def etag_of(st):
    """A strong validator that changes whenever the file is replaced or rewritten (nginx's is mtime-size)."""
    return '"%x-%x-%x"' % (st.st_ino, st.st_size, st.st_mtime_ns)


def replace_file(path, data):
    """The file's content replaced the way a mirror sync does it (a new file renamed over the old): a new ETag."""
    tmp = path + '.tmp-replace'
    with open(tmp, 'wb') as f:
        f.write(data)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def commit_of(repo, revision):
    """The commit a revision resolves to: itself when it is one, else a fixed made-up one (a tag of the lab)."""
    if re.match(r'^[0-9a-f]{40}$', revision):
        return revision
    return hashlib.sha1(('%s@%s' % (repo, revision)).encode()).hexdigest()


class Bucket(object):
    """The whole mirror's bandwidth (mirror-throttle.json "total"), shared by every connection."""

    def __init__(self):
        self.t, self.tokens = time.monotonic(), 0.0

    async def take(self, n, rate):
        now = time.monotonic()
        self.tokens = min(rate / 4, self.tokens + (now - self.t) * rate)
        self.t = now
        self.tokens -= n
        if self.tokens < 0:
            await asyncio.sleep(-self.tokens / rate)


class Mirror(object):
    def __init__(self, root, log_path, down_path, throttle_path=None, cdn_url=None, hub_token=None):
        self.root, self.log_path, self.down_path = root, log_path, down_path
        self.throttle_path = throttle_path or os.path.join(os.path.dirname(down_path), 'mirror-throttle.json')
        self.cdn_url, self.hub_token = cdn_url, hub_token
        self.bucket = Bucket()
        self.sums = {}

    def log(self, **rec):
        with open(self.log_path, 'a') as f:
            f.write(json.dumps(rec, sort_keys=True) + '\n')

    def throttle(self):
        try:
            with open(self.throttle_path) as f:
                data = json.load(f)
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def app(self):
        from aiohttp import web
        app = web.Application()
        app.router.add_route('*', '/{path:.*}', self.handle)
        return app

    def sha256(self, full, st):
        key = (full, st.st_ino, st.st_size, st.st_mtime_ns)
        if key not in self.sums:
            h = hashlib.sha256()
            with open(full, 'rb') as f:
                for block in iter(lambda: f.read(1 << 20), b''):
                    h.update(block)
            self.sums[key] = h.hexdigest()
        return self.sums[key]

    def local(self, rel):
        full = os.path.realpath(os.path.join(self.root, rel))
        if not full.startswith(os.path.realpath(self.root) + os.sep) or not os.path.isfile(full):
            return None
        return full

    async def handle(self, request):
        from aiohttp import web
        rel = request.match_info['path']
        rec = {'path': rel, 'method': request.method, 'range': request.headers.get('Range'),
               'if_range': request.headers.get('If-Range'), 'host': request.host,
               'auth': 'Authorization' in request.headers, 'bytes': 0, 'start': round(time.time(), 3)}
        if os.path.exists(self.down_path):
            self.log(status='dropped', **rec)
            request.transport.close()
            raise asyncio.CancelledError()
        try:
            hub = HUB_RE.match(rel)
            api = API_RE.match(rel)
            if (hub or api) and self.hub_token and \
                    request.headers.get('Authorization') != 'Bearer ' + self.hub_token:
                rec['status'] = 401
                return web.Response(status=401, text='Invalid credentials in Authorization header\n',
                                    headers={'X-Error-Code': 'GatedRepo'})
            if api:
                return self.api(request, rec, *api.groups())
            if hub:
                return await self.resolve(request, rec, *hub.groups())
            return await self.serve(request, rec, rel)
        finally:
            self.log(end=round(time.time(), 3), **rec)

    def revision_dir(self, org, repo, revision):
        """<root>/<org>/<repo>/<revision>, also when the revision is the commit a tag there resolves to."""
        rel = '%s/%s/%s' % (org, repo, revision)
        if os.path.isdir(os.path.join(self.root, rel)) or not re.match(r'^[0-9a-f]{40}$', revision):
            return rel
        try:
            tags = os.listdir(os.path.join(self.root, org, repo))
        except OSError:
            return rel
        for tag in tags:
            if commit_of('%s/%s' % (org, repo), tag) == revision:
                return '%s/%s/%s' % (org, repo, tag)
        return rel

    def api(self, request, rec, org, repo, revision):
        from aiohttp import web
        d = os.path.join(self.root, self.revision_dir(org, repo, revision))
        if request.method != 'GET' or not os.path.isdir(d):
            rec['status'] = 404
            return web.Response(status=404, text='Revision Not Found\n', headers={'X-Error-Code': 'RevisionNotFound'})
        blobs = request.query.get('blobs') in ('true', '1', 'True')
        siblings = []
        for name in sorted(os.listdir(d)):
            full = os.path.join(d, name)
            if not os.path.isfile(full):
                continue
            s = {'rfilename': name}
            if blobs:
                st = os.stat(full)
                with open(full, 'rb') as f:
                    blob = f.read() if not name.endswith(LFS_SUFFIXES) else b''
                s.update(size=st.st_size, blobId=hashlib.sha1(b'blob %d\0' % len(blob) + blob).hexdigest())
                if name.endswith(LFS_SUFFIXES):
                    s['lfs'] = {'sha256': self.sha256(full, st), 'size': st.st_size, 'pointerSize': 134}
            siblings.append(s)
        body = json.dumps({'_id': 'lab', 'id': '%s/%s' % (org, repo), 'modelId': '%s/%s' % (org, repo),
                           'sha': commit_of('%s/%s' % (org, repo), revision), 'siblings': siblings}).encode()
        rec.update(status=200, bytes=len(body))
        return web.Response(status=200, body=body, content_type='application/json')

    async def resolve(self, request, rec, org, repo, revision, name):
        from aiohttp import web
        rel = '%s/%s' % (self.revision_dir(org, repo, revision), name)
        full = self.local(rel)
        commit = commit_of('%s/%s' % (org, repo), revision)
        if full is None or request.method not in ('GET', 'HEAD'):
            rec['status'] = 404
            return web.Response(status=404, text='Entry not found\n',
                                headers={'X-Error-Code': 'EntryNotFound', 'X-Repo-Commit': commit})
        if not name.endswith(LFS_SUFFIXES):
            with open(full, 'rb') as f:
                data = f.read()
            blob = hashlib.sha1(b'blob %d\0' % len(data) + data).hexdigest()
            return await self.serve(request, rec, rel, extra={'X-Repo-Commit': commit, 'ETag': '"%s"' % blob})
        st = os.stat(full)
        sha = self.sha256(full, st)
        location = '%s/%s?X-Amz-Signature=lab-%s' % (self.cdn_url.rstrip('/'), rel, sha[:8])
        body = b'Found. Redirecting to ' + location.encode()
        rec.update(status=302, bytes=0 if request.method == 'HEAD' else len(body))
        return web.Response(status=302, body=body, headers={
            'Location': location, 'X-Repo-Commit': commit, 'X-Linked-Etag': '"%s"' % sha,
            'X-Linked-Size': str(st.st_size), 'ETag': '"%s"' % sha})

    async def serve(self, request, rec, rel, extra=None):
        from aiohttp import web
        full = self.local(rel)
        if full is None or request.method not in ('GET', 'HEAD'):
            rec['status'] = 404
            return web.Response(status=404, text='not found\n')
        st = os.stat(full)
        size, etag = st.st_size, (extra or {}).get('ETag') or etag_of(st)
        modified = email.utils.formatdate(st.st_mtime, usegmt=True)
        start, end = 0, size - 1
        m = re.match(r'^bytes=(\d+)-(\d*)$', rec['range'] or '')
        if_range = rec['if_range']
        if m and if_range is not None and if_range != etag and if_range != modified:
            m = None   # RFC 9110 13.1.5: the validator no longer matches - the whole (new) file, 200
        if m:
            start = int(m.group(1))
            end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
            if start >= size or end < start:
                rec['status'] = 416
                return web.Response(status=416, headers={'Content-Range': 'bytes */%d' % size})
        status = 206 if m else 200
        headers = {'Content-Length': str(end - start + 1), 'Accept-Ranges': 'bytes', 'ETag': etag,
                   'Last-Modified': modified, 'Content-Type': 'application/octet-stream'}
        headers.update(extra or {})
        if m:
            headers['Content-Range'] = 'bytes %d-%d/%d' % (start, end, size)
        rec['status'] = status
        resp = web.StreamResponse(status=status, headers=headers)
        await resp.prepare(request)
        if request.method == 'HEAD':
            return resp
        name = os.path.basename(rel)
        checked, limits = 0.0, {}
        with open(full, 'rb') as f:
            f.seek(start)
            left = end - start + 1
            while left > 0:
                if os.path.exists(self.down_path):
                    request.transport.close()
                    rec['status'] = 'cut'
                    return resp
                now = time.monotonic()
                if now - checked >= 0.5:
                    checked, limits = now, self.throttle()
                per_file = (limits.get('files') or {}).get(name) or SLOW.get(name)
                per_conn = min([r for r in (per_file, limits.get('per_connection')) if r] or [0])
                total = limits.get('total')
                rate = min([r for r in (per_conn, total) if r] or [0])
                # Throttled: a block a fiftieth of a second's worth (4 KiB for the lab's slow shard, so its progress
                # is smooth; bigger for a benchmark's tens of MB/s, so the mirror itself is not what limits it).
                size = min(CHUNK, max(THROTTLED_CHUNK, int(rate / 50))) if rate else CHUNK
                block = f.read(min(left, size))
                if not block:
                    break
                await resp.write(block)
                rec['bytes'] += len(block)
                left -= len(block)
                if total:
                    await self.bucket.take(len(block), float(total))
                if per_conn:
                    await asyncio.sleep(len(block) / float(per_conn))
        await resp.write_eof()
        return resp
