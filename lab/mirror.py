"""The lab's model mirror: the lab model's files (lab/labmodel.py) over HTTP on the lab's own loopback address,
as an operator's mirror on their network would serve them - HEAD with Content-Length, GET with byte ranges
(206, for resumed downloads) - with one deliberately slow shard (SLOW: bytes per second), so a download lasts
long enough for the program's progress line. Every request is logged to LAB/control/mirror-requests.log
({"path", "range", "status"}); LAB/control/mirror-down makes it close connections unanswered (a source gone
mid-way)."""

import asyncio
import json
import os
import re

PORT = 8089
SLOW = {'model-00003-of-00003.safetensors': 10240}   # ~14 s for its 142,376 bytes
CHUNK = 4096


class Mirror(object):
    def __init__(self, root, log_path, down_path):
        self.root, self.log_path, self.down_path = root, log_path, down_path

    def log(self, **rec):
        with open(self.log_path, 'a') as f:
            f.write(json.dumps(rec, sort_keys=True) + '\n')

    def app(self):
        from aiohttp import web
        app = web.Application()
        app.router.add_route('*', '/{path:.*}', self.handle)
        return app

    async def handle(self, request):
        from aiohttp import web
        rel = request.match_info['path']
        rng = request.headers.get('Range')
        if os.path.exists(self.down_path):
            self.log(path=rel, range=rng, status='dropped')
            request.transport.close()
            raise asyncio.CancelledError()
        full = os.path.realpath(os.path.join(self.root, rel))
        if not full.startswith(os.path.realpath(self.root) + os.sep) or not os.path.isfile(full) or \
                request.method not in ('GET', 'HEAD'):
            self.log(path=rel, range=rng, status=404)
            return web.Response(status=404, text='not found\n')
        size = os.path.getsize(full)
        start = 0
        m = re.match(r'^bytes=(\d+)-$', rng or '')
        if m:
            start = int(m.group(1))
            if start >= size:
                self.log(path=rel, range=rng, status=416)
                return web.Response(status=416, headers={'Content-Range': 'bytes */%d' % size})
        status = 206 if m else 200
        headers = {'Content-Length': str(size - start), 'Accept-Ranges': 'bytes',
                   'Content-Type': 'application/octet-stream'}
        if m:
            headers['Content-Range'] = 'bytes %d-%d/%d' % (start, size - 1, size)
        self.log(path=rel, range=rng, status=status, method=request.method)
        resp = web.StreamResponse(status=status, headers=headers)
        await resp.prepare(request)
        if request.method == 'HEAD':
            return resp
        rate = SLOW.get(os.path.basename(rel))
        with open(full, 'rb') as f:
            f.seek(start)
            while True:
                if os.path.exists(self.down_path):
                    request.transport.close()
                    return resp
                block = f.read(CHUNK)
                if not block:
                    break
                await resp.write(block)
                if rate:
                    await asyncio.sleep(len(block) / float(rate))
        await resp.write_eof()
        return resp
