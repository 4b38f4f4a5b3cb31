"""The lab's package index: PEP 503's "simple" API over the wheels in LAB/runtime/index, on a loopback address,
behind HTTP basic auth (a generated password in LAB/secrets/index-password), served by the lab daemon - so the
program's way to a company index (a login that is a Pulumi secret, pip fed through a netrc file) is the one
tested. And the lock the lab stack installs from it (LAB/runtime/sglang.lock), written with the files' real
sha256.

    GET /simple/                 the projects
    GET /simple/<project>/       its files, each linked with #sha256=<hex> (what pip checks against the lock)
    GET /packages/<file>         a file

Every request is logged to LAB/control/index-requests.log ({"t", "path", "status"}; never a credential). With
`down` set (tests/lablib.py index_down(), through the lab daemon's control file), connections are closed
without an answer: an index that does not answer.

Like a company index that keeps its files elsewhere (Artifactory, Nexus or GitLab serving from S3 or a CDN),
`files` (tests/lablib.py index_files()) makes it send them from a second server, the "CDN", on another loopback
host (the index's address with .5 as the last byte, port CDN_PORT), which asks no login and logs whether a
request carried an Authorization header (LAB/control/cdn-requests.log: {"t", "path", "authorization"}):
'redirect' answers /packages/<file> with a 302 to the CDN, 'link' puts the CDN's absolute URLs on the project
pages; `rate` (bytes a second per download, null for none) makes every file download slow, index and CDN alike.
"""

import base64
import hashlib
import hmac
import json
import os
import re
import shutil
import time

USER = 'gpuhost-lab'
PORT = 3141   # devpi's
CDN_PORT = 3142


def cdn_host(index_host):
    return index_host.rsplit('.', 1)[0] + '.5'


def canonical(name):
    return re.sub(r'[-_.]+', '-', name).lower()


def sha256(path):
    h = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(1 << 20), b''):
            h.update(block)
    return h.hexdigest()


def files(index_dir):
    """{project: [(file name, sha256)]} of the wheels in the directory."""
    out = {}
    for name in sorted(os.listdir(index_dir)):
        if name.endswith('.whl'):
            out.setdefault(canonical(name.split('-', 1)[0]), []).append((name, sha256(os.path.join(index_dir, name))))
    return out


def add(index_dir, path):
    """Put a wheel into the index (atomically: a reader sees it whole or not at all); returns its sha256."""
    os.makedirs(index_dir, exist_ok=True)
    dest = os.path.join(index_dir, os.path.basename(path))
    tmp = dest + '.tmp-%d' % os.getpid()
    shutil.copyfile(path, tmp)
    os.replace(tmp, dest)
    return sha256(dest)


def lock_text(index_dir, pins, note=''):
    """A lock as pip-compile --generate-hashes writes it, for `pins` ({project: version}), every file of that
    version in the index hashed."""
    have = files(index_dir)
    lines = ['# The lab\'s lock (lab/pyindex.py)%s: every package pinned with the sha256 of its files in the lab\'s '
             'index.' % note]
    for project, version in sorted(pins.items()):
        found = [(n, h) for n, h in have.get(canonical(project), []) if n.split('-')[1] == version]
        if not found:
            raise ValueError('the lab index has no %s %s' % (project, version))
        lines.append('%s==%s \\' % (project, version))
        lines.extend('    --hash=sha256:%s%s' % (h, ' \\' if i + 1 < len(found) else '') for i, (_, h) in enumerate(found))
    return '\n'.join(lines) + '\n'


class Index(object):
    """The aiohttp application (lab/labctl.py starts it on the lab's index address)."""

    def __init__(self, index_dir, password, log_path, cdn_base=None, cdn_log_path=None):
        self.dir, self.password, self.log_path = index_dir, password, log_path
        self.cdn_base, self.cdn_log_path = cdn_base, cdn_log_path
        self.down = False
        self.files_from = 'index'   # 'redirect' | 'link': from the CDN
        self.rate = None

    async def send_file(self, request, path):
        """The file, at most `rate` bytes a second when set."""
        import asyncio
        from aiohttp import web
        if not self.rate:
            return web.FileResponse(path)
        resp = web.StreamResponse(headers={'Content-Type': 'application/octet-stream',
                                           'Content-Length': str(os.path.getsize(path))})
        await resp.prepare(request)
        chunk = max(1024, int(self.rate) // 10)
        with open(path, 'rb') as f:
            for block in iter(lambda: f.read(chunk), b''):
                await resp.write(block)
                await asyncio.sleep(len(block) / float(self.rate))
        await resp.write_eof()
        return resp

    def cdn_app(self):
        """The CDN: the same files, no login, every request's Authorization header noted (present or not)."""
        from aiohttp import web

        async def package(request):
            name = request.match_info['file']
            path = os.path.join(self.dir, name)
            with open(self.cdn_log_path, 'a') as f:
                f.write(json.dumps({'t': round(time.time(), 3), 'path': request.path,
                                    'authorization': 'Authorization' in request.headers}) + '\n')
            if '/' in name or name.startswith('.') or not name.endswith('.whl') or not os.path.isfile(path):
                raise web.HTTPNotFound()
            return await self.send_file(request, path)
        app = web.Application()
        app.router.add_get('/packages/{file}', package)
        return app

    def authorised(self, request):
        head = request.headers.get('Authorization', '')
        if not head.startswith('Basic '):
            return False
        try:
            user, _, password = base64.b64decode(head[6:]).decode().partition(':')
        except (ValueError, UnicodeDecodeError):
            return False
        return user == USER and hmac.compare_digest(password, self.password)

    def log(self, request, status):
        with open(self.log_path, 'a') as f:
            f.write(json.dumps({'t': round(time.time(), 3), 'path': request.path, 'status': status}) + '\n')

    def app(self):
        from aiohttp import web

        @web.middleware
        async def gate(request, handler):
            if self.down:
                self.log(request, 'dropped')
                request.transport.abort()   # no answer at all, as a dead server
                raise web.HTTPServiceUnavailable()
            if not self.authorised(request):
                self.log(request, 401)
                return web.Response(status=401, text='login required',
                                    headers={'WWW-Authenticate': 'Basic realm="gpuhost lab index"'})
            response = await handler(request)
            self.log(request, response.status)
            return response

        async def root(request):
            body = ''.join('<a href="%s/">%s</a>\n' % (p, p) for p in sorted(files(self.dir)))
            return web.Response(text='<!DOCTYPE html>\n<html><body>\n%s</body></html>\n' % body, content_type='text/html')

        async def project(request):
            name = canonical(request.match_info['project'])
            have = files(self.dir).get(name)
            if not have:
                raise web.HTTPNotFound()
            if request.match_info['project'] != name:
                raise web.HTTPMovedPermanently('/simple/%s/' % name)
            base = self.cdn_base + '/packages/' if self.files_from == 'link' else '../../packages/'
            body = ''.join('<a href="%s%s#sha256=%s">%s</a>\n' % (base, n, h, n) for n, h in have)
            return web.Response(text='<!DOCTYPE html>\n<html><body>\n%s</body></html>\n' % body, content_type='text/html')

        async def package(request):
            name = request.match_info['file']
            path = os.path.join(self.dir, name)
            if '/' in name or name.startswith('.') or not name.endswith('.whl') or not os.path.isfile(path):
                raise web.HTTPNotFound()
            if self.files_from == 'redirect':
                raise web.HTTPFound(self.cdn_base + '/packages/' + name)
            return await self.send_file(request, path)

        app = web.Application(middlewares=[gate])
        app.router.add_get('/simple/', root)
        app.router.add_get('/simple/{project}/', project)
        app.router.add_get('/packages/{file}', package)
        return app
