"""hostscripts/model_verify.py on a real (tiny) model directory (lab/labmodel.py): what it finds, what it
caches, the line a person reads (resources/model.py) and the textfile it writes (promtool accepts it); and its
downloads from the lab's mirror (lab/mirror.py, in a thread: a plain mirror and the hub with its CDN on another
loopback address) - parallel, rate-limited, resumed only onto the same version of a file, checked by sha256 (the
checksum file's or the hub's X-Linked-Etag), with the progress file a job runner polls. The script runs as the host
runs it where it matters (python3 model_verify.py '<job>', Debian's python3, the token in GPUHOST_TOKEN_FILE)."""

import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys
import threading
import time

import pytest

from resources.model import line
from tests.lablib import REPO

sys.path.insert(0, os.path.join(REPO, 'lab'))
import labmodel  # noqa: E402
import mirror  # noqa: E402

spec = importlib.util.spec_from_file_location('model_verify', os.path.join(REPO, 'hostscripts',
                                                                           'model_verify.py'))
mv = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mv)

SHARD = 'model-00002-of-00003.safetensors'
SHARDS = ['model-00001-of-00003.safetensors', SHARD, 'model-00003-of-00003.safetensors']
SIZES = {SHARDS[0]: 91720, SHARD: 50496, SHARDS[2]: 142376}
SCRIPT = os.path.join(REPO, 'hostscripts', 'model_verify.py')
PYTHON = '/usr/bin/python3' if os.path.exists('/usr/bin/python3') else sys.executable   # the host's: stdlib only
HUB_TOKEN = 'hf_lab_0123456789abcdef'


@pytest.fixture
def model(tmp_path):
    d = tmp_path / 'models' / 'M'
    sums = labmodel.build(str(d), 'M', 'v1')
    checksums = {ln.split('  ')[1]: ln.split('  ')[0] for ln in sums.splitlines()}
    return {'dir': str(d), 'id': 'M', 'revision': 'v1', 'checksums': checksums, 'hash': True,
            'cache': str(tmp_path / 'cache' / 'm.json')}


def test_complete_model_verified_then_cached(model):
    first = mv.verify(model)
    assert first['verified'] and (first['shards'], first['present'], first['checked_sums']) == (3, 3, 5)
    assert first['read_bytes'] >= first['bytes'] == 284592
    again = mv.verify(model)
    assert again['verified'] and again['read_bytes'] == 0 and again['hashed'] == 0
    assert line(again) == 'M@v1: 3/3 shards, 284.6 kB, verified (5 sha256, 0 B of shards read)'


def test_quick_look_does_not_hash_new_shards(model):
    rep = mv.verify(dict(model, hash=False))
    assert not rep['verified'] and len(rep['unhashed']) == 3 and rep['read_bytes'] < 10000
    assert line(rep).endswith('3 sha256 to compute')


def test_a_shard_rewritten_in_place_with_its_mtime_set_back_is_hashed_again(model):
    """Issue 27, item 6: `rsync --inplace -t` or `touch -d` keep size, mtime and inode; the ctime moves."""
    assert mv.verify(model)['verified']
    path = os.path.join(model['dir'], SHARD)
    st = os.stat(path)
    time.sleep(0.01)
    with open(path, 'r+b') as f:
        f.seek(st.st_size - 64)
        f.write(b'\xff' * 64)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_ino == st.st_ino and os.stat(path).st_mtime_ns == st.st_mtime_ns
    quick = mv.verify(dict(model, hash=False))
    assert not quick['verified'] and quick['unhashed'] == [SHARD], quick
    full = mv.verify(model)
    assert not full['verified'] and full['mismatch'][0].startswith(SHARD + ' (sha256 '), full


def test_sums_older_than_the_period_are_computed_again(model):
    """Bit rot changes no metadata: a sum older than gpuhost:model.rehash_days is computed again by the next full
    verification, and the textfile says when the oldest sum was computed."""
    first = mv.verify(dict(model, rehash_s=86400))
    assert first['verified'] and first['oldest_sha256_at'] >= int(time.time()) - 5
    with open(model['cache']) as f:
        cache = json.load(f)
    cache[SHARD]['hashed_at'] = int(time.time()) - 2 * 86400
    with open(model['cache'], 'w') as f:
        json.dump(cache, f)
    quick = mv.verify(dict(model, hash=False, rehash_s=86400))
    assert not quick['verified'] and quick['due'] == [SHARD] and quick['read_bytes'] < 10000
    assert line(quick).endswith('1 sha256 to compute (1 older than gpuhost:model.rehash_days)'), line(quick)
    full = mv.verify(dict(model, rehash_s=86400))
    assert full['verified'] and full['hashed'] == 1 and full['read_bytes'] >= SIZES[SHARD]
    again = mv.verify(dict(model, rehash_s=86400))
    assert again['verified'] and again['hashed'] == 0
    # Without a period (null): never again.
    cache_path = model['cache']
    with open(cache_path) as f:
        cache = json.load(f)
    cache[SHARD]['hashed_at'] = 0
    with open(cache_path, 'w') as f:
        json.dump(cache, f)
    assert mv.verify(dict(model, hash=False))['verified']


def test_short_missing_mismatching_and_unreadable_shards_are_named(model):
    mv.verify(model)
    path = os.path.join(model['dir'], SHARD)
    size = os.path.getsize(path)
    os.truncate(path, size - 10)
    rep = mv.verify(model)
    assert rep['short'] == ['%s (%d of %d bytes)' % (SHARD, size - 10, size)] and not rep['verified']
    assert line(rep).startswith('M@v1: 2/3 shards, ')
    labmodel.build(model['dir'], 'M', 'v1')
    with open(path, 'r+b') as f:          # same size, other content: only the sum sees it
        f.seek(size - 1)
        f.write(b'\x00' if f.read(1) != b'\x00' else b'\x01')
    rep = mv.verify(model)
    assert [m.split(' ')[0] for m in rep['mismatch']] == [SHARD]
    os.chmod(path, 0o600)
    assert mv.verify(model)['unreadable'] == [SHARD]
    os.unlink(path)
    rep = mv.verify(model)
    assert rep['missing'] == [SHARD] and '1 missing: %s' % SHARD in line(rep)


@pytest.mark.parametrize('name', ['../../etc/cron.d/x', '/etc/x', 'a b.safetensors', ''])
def test_an_index_naming_a_file_outside_the_directory_is_refused(model, name):
    """Verify and download read file names from the index (downloaded from the source): a name that is not a
    plain file of the directory is a broken index, never a path root writes to."""
    import json
    index = os.path.join(model['dir'], 'model.safetensors.index.json')
    with open(index) as f:
        data = json.load(f)
    data['weight_map']['lm_head.weight'] = name
    with open(index, 'w') as f:
        json.dump(data, f)
    rep = mv.verify(model)
    assert not rep['verified']
    assert any('model.safetensors.index.json is not a safetensors index' in p and repr(name) in p
               for p in rep['problems']), rep['problems']


def test_a_directory_the_container_cannot_enter_is_named(model, tmp_path):
    """An unprivileged container's root is "other" on the host: a 0700 dataset hides the weights from it."""
    storage = str(tmp_path / 'models')
    assert mv.verify(dict(model, storage=storage))['verified']
    os.chmod(storage, 0o700)
    try:
        rep = mv.verify(dict(model, storage=storage))
    finally:
        os.chmod(storage, 0o755)
    assert not rep['verified']
    assert rep['problems'] == ['%s is not searchable by the container (mode 0700): chmod o+rx %s' % (storage, storage)]


def test_a_missing_directory(model, tmp_path):
    rep = mv.verify(dict(model, dir=str(tmp_path / 'nowhere')))
    assert not rep['verified'] and line(rep) == 'M@v1: %s does not exist on the host' % (tmp_path / 'nowhere')


@pytest.mark.skipif(not shutil.which('promtool'), reason='promtool not installed')
def test_the_textfile_passes_promtool(model, tmp_path):
    prom = str(tmp_path / 'tf' / 'gpuhost-model.prom')
    mv.textfile(prom, mv.verify(model))
    with open(prom) as f:
        text = f.read()
    assert 'gpuhost_model_verified{model="M",revision="v1"} 1' in text
    res = subprocess.run(['promtool', 'check', 'metrics'], input=text, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


class MirrorServer(object):
    """lab/mirror.py in a thread of its own: the lab model as a plain mirror (/M/<file>) on 127.0.0.1 and as the hub
    (/gpuhost-lab/M/resolve/v1/<file> and its API, the token required), whose CDN listens on 127.0.0.2."""

    def __init__(self, tmp_path):
        import asyncio
        from aiohttp import web
        self.root, self.control = tmp_path / 'mirror', tmp_path / 'control'
        self.control.mkdir()
        for where in (self.root / 'M', self.root / labmodel.HUB_ORG / 'M' / 'v1'):
            labmodel.build(str(where), 'M', 'v1')
        self.mirror = mirror.Mirror(str(self.root), str(self.control / 'requests.log'), str(self.control / 'down'),
                                    str(self.control / 'throttle.json'), hub_token=HUB_TOKEN)
        self.loop = asyncio.new_event_loop()
        self.runner = web.AppRunner(self.mirror.app(), access_log=None)
        self.loop.run_until_complete(self.runner.setup())
        ports = []
        for host in ('127.0.0.1', '127.0.0.2'):
            site = web.TCPSite(self.runner, host, 0)
            self.loop.run_until_complete(site.start())
            ports.append(site._server.sockets[0].getsockname()[1])
        self.hub_host, self.cdn_host = '127.0.0.1:%d' % ports[0], '127.0.0.2:%d' % ports[1]
        self.mirror.cdn_url = 'http://' + self.cdn_host
        self.url = 'http://%s/M' % self.hub_host
        self.hub_url = 'http://%s/%s/M/resolve/v1' % (self.hub_host, labmodel.HUB_ORG)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def close(self):
        import asyncio
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    def throttle(self, **limits):
        with open(self.control / 'throttle.json', 'w') as f:
            json.dump(limits, f)

    def down(self, after=0.0):
        timer = threading.Timer(after, lambda: open(self.control / 'down', 'w').close())
        timer.start()
        return timer

    def up(self):
        os.unlink(self.control / 'down')

    def requests(self, name=None, method='GET', until=None):
        """The log's records (of one file, of one method) in the order the requests began; until: wait (up to 5 s)
        until they satisfy it - the mirror logs a transfer after its last byte, which the client may have read a
        moment before, and a transfer cut off when its client is gone - a killed job's - once it notices: a fresh-
        clone run saw the killed job's GET logged after the resumed one that followed it."""
        deadline = time.time() + 5
        while True:
            try:
                with open(self.control / 'requests.log') as f:
                    recs = [json.loads(x) for x in f]
            except FileNotFoundError:
                recs = []
            recs = sorted((r for r in recs if (name is None or r['path'].endswith('/' + name)) and
                           (method is None or r['method'] == method)), key=lambda r: r['start'])
            if until is None or until(recs) or time.time() > deadline:
                return recs
            time.sleep(0.05)


@pytest.fixture
def mirror_server(tmp_path, monkeypatch):
    monkeypatch.setattr(mirror, 'SLOW', {})   # slowness comes from the throttle file, per test
    monkeypatch.delenv('GPUHOST_TOKEN_FILE', raising=False)
    server = MirrorServer(tmp_path)
    yield server
    server.close()


@pytest.fixture
def storage(tmp_path):
    s = tmp_path / 'storage'
    s.mkdir()
    return s


def download_job(model, storage, source, **kw):
    return dict(model, dir=str(storage / 'M'), storage=str(storage), source=source, **kw)


def staging(storage):
    return storage / '.gpuhost-staging' / 'M@v1'


def run_job(job, tmp_path, token=None, watch=True, kill_when=None):
    """python3 model_verify.py '<job>' as the host runs it: (report, stderr, the progress file's states seen)."""
    env = dict(os.environ, GPUHOST_PROGRESS=str(tmp_path / 'progress.json'))
    env.pop('GPUHOST_TOKEN_FILE', None)
    if token:
        with open(tmp_path / 'token', 'w') as f:
            f.write(token)
        env['GPUHOST_TOKEN_FILE'] = str(tmp_path / 'token')
    proc = subprocess.Popen([PYTHON, SCRIPT, json.dumps(job)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    states = []
    while watch and proc.poll() is None:
        try:
            with open(tmp_path / 'progress.json') as f:
                state = json.load(f)
            if not states or state['updated'] != states[-1]['updated']:
                states.append(state)
        except FileNotFoundError:
            pass
        if kill_when and kill_when(states):
            proc.kill()
            break
        time.sleep(0.05)
    out, err = proc.communicate(timeout=120)
    report = json.loads(out.strip().splitlines()[-1]) if out.strip() else None
    return report, err, states


def test_a_download_cut_off_midway_is_resumed_and_moved_in_only_when_complete(model, mirror_server, storage):
    """The partial keeps the ETag it was started with; the resume asks for the rest only if the file is still that
    version (If-Range), and the two requests together ask for every byte once."""
    slow = SHARDS[2]
    mirror_server.throttle(files={slow: 40960})   # ~3.5 s
    job = download_job(model, storage, mirror_server.url)
    timer = mirror_server.down(after=1.5)   # the source goes away while the slow shard is on its way
    with pytest.raises(mv.FetchError, match=r'model-00003-of-00003.safetensors: the transfer (broke off|ended) at [\d.]+ kB of '
                                            r'142.4 kB.*the next `up` resumes it'):
        mv.fetch(job)
    timer.join()
    assert not os.path.exists(job['dir']), 'nothing moves into place before everything checks out'
    part = staging(storage) / (slow + '.part')
    got = os.path.getsize(part)
    assert 0 < got < SIZES[slow]
    with open(str(part) + '.json') as f:
        started = json.load(f)
    etag = mirror.etag_of(os.stat(mirror_server.root / 'M' / slow))
    assert (started['etag'], started['size']) == (etag, SIZES[slow])
    mirror_server.up()
    done = mv.fetch(job)
    assert done['resumed_bytes'] == got and done['downloaded_bytes'] == SIZES[slow] - got   # shards 1, 2 were staged
    last = mirror_server.requests(slow, until=lambda rs: rs[-1]['status'] == 206)[-1]
    assert (last['range'], last['if_range'], last['status'], last['bytes']) == \
        ('bytes=%d-' % got, etag, 206, SIZES[slow] - got)
    rep = mv.verify(job)
    assert rep['verified'] and rep['checked_sums'] == 5
    assert not os.listdir(staging(storage))


def test_a_job_killed_mid_download_resumes_where_its_partial_ends(model, mirror_server, storage, tmp_path):
    """SIGKILL (a reboot, `systemctl stop`): the partial on disk is what was received, its record beside it; the next
    run asks for the rest of the same version only."""
    slow = SHARDS[2]
    mirror_server.throttle(files={slow: 40960})
    job = download_job(model, storage, mirror_server.url)
    part = staging(storage) / (slow + '.part')

    def midway(states):
        return any(s['phase'] == 'download' and s['current'] == [slow] and s['done_bytes'] > 100000 for s in states) \
            and os.path.exists(part) and os.path.getsize(part) > 20000
    report, _, _ = run_job(job, tmp_path, kill_when=midway)
    assert report is None and not os.path.exists(job['dir'])
    got = os.path.getsize(part)
    mirror_server.throttle()
    rep, err, _ = run_job(job, tmp_path, watch=False)
    assert rep['verified'] and rep['resumed_bytes'] == got and rep['downloaded_bytes'] == SIZES[slow] - got, (rep, err)
    first, last = mirror_server.requests(slow, until=lambda rs: len(rs) == 2 and rs[-1]['status'] == 206)
    assert (first['range'], last['range'], last['if_range'], last['bytes']) == \
        (None, 'bytes=%d-' % got, mirror.etag_of(os.stat(mirror_server.root / 'M' / slow)), SIZES[slow] - got)


def test_several_files_download_at_once_and_the_progress_file_follows(model, mirror_server, storage, tmp_path):
    # ~2 s each at once, ~6 s one after another.
    mirror_server.throttle(files={SHARDS[0]: 45000, SHARDS[1]: 25000, SHARDS[2]: 70000})
    job = download_job(model, storage, mirror_server.url, connections=8)
    rep, err, states = run_job(job, tmp_path)
    assert rep['verified'] and rep['downloaded'] == sorted(SHARDS + ['config.json', mv.INDEX]), (rep, err)
    assert rep['download_s'] < 5, rep
    # Downloaded once and hashed as the bytes came: the verification after it read no shard again.
    assert rep['checked_sums'] == 5 and rep['read_bytes'] < 10000, rep
    gets = [mirror_server.requests(n, until=lambda rs: rs)[0] for n in SHARDS]
    assert max(g['start'] for g in gets) < min(g['end'] for g in gets), 'the three transfers overlapped'
    downloading = [s for s in states if s['phase'] == 'download' and s['total_bytes'] == sum(SIZES.values())]
    assert max(len(s['current']) for s in downloading) == 3, downloading
    assert all(b['counter'] > a['counter'] for a, b in zip(downloading, downloading[1:])), downloading
    assert all(b['updated'] - a['updated'] <= 2.0 for a, b in zip(states, states[1:])), [s['updated'] for s in states]
    assert downloading[-1]['files_total'] == 3 and downloading[-1]['line'].startswith(
        'downloading M@v1: '), downloading[-1]
    midway = [s for s in downloading if s['current']][-1]
    assert midway['rate_bytes_s'] > 0 and midway['eta_s'] is not None, midway
    assert 'gpuhost-progress: M@v1: 0 B of 284.6 kB (0%), 0 B/s, ETA unknown - starting: 3 files from ' + \
        mirror_server.url + ', 3 at once' in err, err


def test_the_rate_limit_holds_the_whole_download_to_it(model, mirror_server, storage):
    job = download_job(model, storage, mirror_server.url, max_bytes_per_s=100000)
    t = time.time()
    done = mv.fetch(job)
    took = time.time() - t
    # 284.6 kB of shards at 100 kB/s, less the bucket's first quarter second: ~2.6 s (unlimited: a few ms).
    assert 2.2 <= done['download_s'] and took < 8, (done, took)
    total = sum(SIZES.values()) + 571 + 3525
    assert sum(r['bytes'] for r in mirror_server.requests(until=lambda rs: sum(r['bytes'] for r in rs) >= total)) == total


def test_a_file_replaced_on_the_mirror_between_attempts_is_not_spliced(model, mirror_server, storage, capfd):
    slow = SHARDS[2]
    mirror_server.throttle(files={slow: 40960})
    job = download_job(model, storage, mirror_server.url, checksums=None)   # sizes only: the splice would pass them
    timer = mirror_server.down(after=1.2)
    with pytest.raises(mv.FetchError):
        mv.fetch(job)
    timer.join()
    assert os.path.getsize(staging(storage) / (slow + '.part')) > 0
    new = labmodel.files('M', 'v2')[slow]   # the same size, other bytes: a new version under the same name
    mirror.replace_file(str(mirror_server.root / 'M' / slow), new)
    mirror_server.up()
    mirror_server.throttle()
    mv.fetch(job)
    assert 'the file on the source changed' in capfd.readouterr().err
    last = mirror_server.requests(slow, until=lambda rs: rs[-1]['status'] == 200)[-1]
    assert (last['range'], last['status'], last['bytes']) == (None, 200, len(new))
    with open(os.path.join(job['dir'], slow), 'rb') as f:
        assert f.read() == new


def test_a_resume_whose_if_range_no_longer_matches_gets_the_whole_file(model, mirror_server, storage, tmp_path, capfd):
    """Through the hub: the partial came from the CDN. The CDN's copy is rewritten (same bytes, so the hub's
    X-Linked-Etag is unchanged, but a new ETag): the resume's If-Range fails and the CDN answers 200 with all of it."""
    slow = SHARDS[2]
    mirror_server.throttle(files={slow: 40960})
    with open(tmp_path / 'token', 'w') as f:
        f.write(HUB_TOKEN)
    os.environ['GPUHOST_TOKEN_FILE'] = str(tmp_path / 'token')
    try:
        job = download_job(model, storage, mirror_server.hub_url, checksums=None)
        timer = mirror_server.down(after=1.2)
        with pytest.raises(mv.FetchError):
            mv.fetch(job)
        timer.join()
        cdn_file = mirror_server.root / labmodel.HUB_ORG / 'M' / 'v1' / slow
        with open(cdn_file, 'rb') as f:
            same = f.read()
        mirror.replace_file(str(cdn_file), same)
        mirror_server.up()
        mirror_server.throttle()
        mv.fetch(job)
    finally:
        del os.environ['GPUHOST_TOKEN_FILE']
    assert 'If-Range did not match' in capfd.readouterr().err
    last = mirror_server.requests(slow, until=lambda rs: rs[-1]['status'] == 200)[-1]
    assert last['host'] == mirror_server.cdn_host
    assert last['range'] and last['if_range'] and (last['status'], last['bytes']) == (200, SIZES[slow]), last
    rep = mv.verify(dict(job, hub_sums=None))
    assert rep['verified'] and rep['sums_from'] == 'hub' and rep['checked_sums'] == 3, rep


def test_a_same_size_corrupted_shard_is_fetched_again_with_a_source(model, mirror_server, storage):
    job = download_job(model, storage, mirror_server.url, cache=str(storage / 'cache.json'))
    labmodel.build(job['dir'], 'M', 'v1')
    assert mv.verify(job)['verified']
    path = os.path.join(job['dir'], SHARD)
    with open(path, 'r+b') as f:          # same size, other content: only the sum sees it
        f.seek(SIZES[SHARD] - 1)
        f.write(b'\x00' if f.read(1) != b'\x00' else b'\x01')
    done = mv.fetch(job)
    assert done['downloaded'] == [SHARD]
    assert [r['path'] for r in mirror_server.requests(until=lambda rs: rs)] == ['M/' + SHARD]
    rep = mv.verify(job)
    assert rep['verified'] and rep['read_bytes'] < 10000, rep


def test_a_download_that_fails_its_sum_is_removed_from_staging_and_fetched_again(model, mirror_server, storage):
    job = download_job(model, storage, mirror_server.url)
    good = labmodel.files('M', 'v1')[SHARD]
    mirror.replace_file(str(mirror_server.root / 'M' / SHARD), good[:-1] + bytes([good[-1] ^ 1]))
    with pytest.raises(mv.FetchError, match=r'^%s: downloaded, but its sha256 is [0-9a-f]{12}\.\.\., the checksum '
                                            r'file says %s\.\.\.; removed from staging, will be fetched again$' % (
                                                SHARD, model['checksums'][SHARD][:12])):
        mv.fetch(job)
    assert sorted(os.listdir(staging(storage))) == sorted(['.gpuhost-sums.json', 'config.json', mv.INDEX, SHARDS[0],
                                                           SHARDS[2]])
    assert not os.path.exists(job['dir'])
    mirror.replace_file(str(mirror_server.root / 'M' / SHARD), good)
    assert mv.fetch(job)['downloaded_bytes'] == SIZES[SHARD]
    assert mv.verify(job)['verified']


def test_a_head_without_content_length_is_a_named_error(model, storage):
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class NoLength(BaseHTTPRequestHandler):
        def do_HEAD(self):
            self.send_response(200)
            self.send_header('ETag', '"v1"')
            self.end_headers()

        def log_message(self, *args):
            pass
    server = HTTPServer(('127.0.0.1', 0), NoLength)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = 'http://127.0.0.1:%d/M' % server.server_address[1]
        with pytest.raises(mv.FetchError, match=r'^http://127.0.0.1:\d+/M/config.json: the source answered HEAD '
                                                r'without Content-Length \(nor the hub\'s X-Linked-Size\), so the '
                                                r'file\'s size is unknown'):
            mv.fetch(download_job(model, storage, url))
    finally:
        server.shutdown()
        server.server_close()


def test_without_a_checksum_file_the_hub_s_sha256_is_checked_and_the_cdn_never_sees_the_token(
        model, mirror_server, storage, tmp_path):
    job = download_job(model, storage, mirror_server.hub_url, checksums=None, cache=str(storage / 'cache.json'))
    rep, err, _ = run_job(job, tmp_path, token=HUB_TOKEN, watch=False)
    assert rep['verified'] and rep['sums_from'] == 'hub' and rep['checked_sums'] == 3, (rep, err)
    assert rep['hub_commit'] == mirror.commit_of('%s/M' % labmodel.HUB_ORG, 'v1')
    recs = mirror_server.requests(method=None, until=lambda rs: sum(r['host'] == mirror_server.cdn_host for r in rs) >= 3)
    hub = [r for r in recs if r['host'] == mirror_server.hub_host]
    cdn = [r for r in recs if r['host'] == mirror_server.cdn_host]
    assert hub and all(r['auth'] for r in hub), hub
    assert sorted(r['path'].split('/')[-1] for r in cdn) == SHARDS and not any(r['auth'] for r in cdn), cdn
    assert {r['status'] for r in hub if r['path'].endswith('.safetensors')} == {302}
    # Later, without the source: the hub's sums stay with the directory's cache and still catch a changed shard.
    with open(os.path.join(job['dir'], SHARD), 'r+b') as f:
        f.seek(SIZES[SHARD] - 2)
        f.write(b'\xff\xfe')
    rep = mv.verify(dict(job, source=None))
    assert [m.split(' ')[0] for m in rep['mismatch']] == [SHARD] and 'the hub (X-Linked-Etag) says' in rep['mismatch'][0]
    # Without the token the hub refuses, and the report says so.
    other = dict(download_job(model, tmp_path, mirror_server.hub_url, checksums=None), cache=None)
    rep, _, _ = run_job(other, tmp_path, watch=False)
    assert 'HTTP 401 (the token is refused or missing)' in rep['fetch_error'] and not rep['verified']


def sparse_shard(path, tensor, nbytes):
    """A safetensors file of one tensor of nbytes whose data is a hole: big to hash, free on disk."""
    header = json.dumps({tensor: {'dtype': 'BF16', 'shape': [nbytes // 2], 'data_offsets': [0, nbytes]}}).encode()
    header += b' ' * (-len(header) % 8)
    with open(path, 'wb') as f:
        f.write(struct.pack('<Q', len(header)) + header)
        f.truncate(8 + len(header) + nbytes)
    os.chmod(path, 0o644)


def test_a_killed_hashing_job_keeps_the_sums_of_the_shards_it_finished(model, tmp_path):
    """Two workers: one hashes the 8 GiB shard, the other the two small ones - each sum saved as it is known. Killed
    while the big one is hashed: the next look finds the small ones' sums in the cache (only the big one is left)."""
    d = model['dir']
    big = SHARDS[2]
    sparse_shard(os.path.join(d, big), 'lm_head.weight', 8 << 30)
    with open(os.path.join(d, mv.INDEX)) as f:
        index = {'weight_map': {t: s for t, s in json.load(f)['weight_map'].items() if s != big}}
    index['weight_map']['lm_head.weight'] = big
    with open(os.path.join(d, mv.INDEX), 'w') as f:
        json.dump(index, f)
    job = dict(model, checksums={n: model['checksums'][n] for n in SHARDS[:2]} | {big: '0' * 64}, hash_workers=2)

    def small_ones_done(states):
        return any(s['phase'] == 'hash' and s['files_done'] == 2 for s in states)
    _, _, states = run_job(job, tmp_path, kill_when=small_ones_done)
    hashing = [s for s in states if s['phase'] == 'hash']
    assert hashing[-1]['current'] == [big] and hashing[-1]['files_total'] == 3, hashing[-1]
    assert hashing[-1]['total_bytes'] == sum(os.path.getsize(os.path.join(d, n)) for n in SHARDS)
    with open(model['cache']) as f:
        assert sorted(n for n, e in json.load(f).items() if 'sha256' in e) == SHARDS[:2]
    rep = mv.verify(dict(job, hash=False))
    assert rep['unhashed'] == [big] and rep['checked_sums'] == 2 and not rep['mismatch'], rep
