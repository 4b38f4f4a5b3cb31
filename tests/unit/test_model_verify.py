"""components/scripts/model_verify.py on a real (tiny) model directory (lab/labmodel.py): what it finds, what it
caches, the line a person reads (components/model.py) and the textfile it writes (promtool accepts it)."""

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

from components.model import line
from tests.lablib import REPO

sys.path.insert(0, os.path.join(REPO, 'lab'))
import labmodel  # noqa: E402

spec = importlib.util.spec_from_file_location('model_verify', os.path.join(REPO, 'components', 'scripts',
                                                                           'model_verify.py'))
mv = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mv)

SHARD = 'model-00002-of-00003.safetensors'


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


@pytest.fixture
def mirror_server(tmp_path, monkeypatch):
    """lab/mirror.py serving the lab model on 127.0.0.1 (an ephemeral port), in a thread of its own."""
    import asyncio
    import threading
    from aiohttp import web
    import mirror
    root = tmp_path / 'mirror'
    labmodel.build(str(root / 'M'), 'M', 'v1')
    monkeypatch.setattr(mirror, 'SLOW', {'model-00003-of-00003.safetensors': 40960})   # ~3.5 s
    m = mirror.Mirror(str(root), str(tmp_path / 'requests.log'), str(tmp_path / 'down'))
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(m.app(), access_log=None)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, '127.0.0.1', 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]
    threading.Thread(target=loop.run_forever, daemon=True).start()
    yield {'url': 'http://127.0.0.1:%d/M' % port, 'down': str(tmp_path / 'down'), 'log': str(tmp_path / 'requests.log')}
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)


def test_a_download_cut_off_midway_is_resumed_and_moved_in_only_when_complete(model, mirror_server, tmp_path):
    import json
    import threading
    storage = tmp_path / 'storage'
    storage.mkdir()
    job = dict(model, dir=str(storage / 'M'), storage=str(storage), source=mirror_server['url'])
    # The source goes away while the slow shard is on its way.
    timer = threading.Timer(1.5, lambda: open(mirror_server['down'], 'w').close())
    timer.start()
    with pytest.raises(mv.FetchError, match=r'model-00003-of-00003.safetensors: the transfer (broke off|ended) at [\d.]+ kB of '
                                            r'142.4 kB.*the next `up` resumes it'):
        mv.fetch(job)
    timer.join()
    assert not os.path.exists(job['dir']), 'nothing moves into place before everything checks out'
    part = storage / '.gpuhost-staging' / 'M@v1' / 'model-00003-of-00003.safetensors.part'
    got = os.path.getsize(part)
    assert 0 < got < 142376
    os.unlink(mirror_server['down'])
    done = mv.fetch(job)
    assert done['resumed_bytes'] == got and done['downloaded_bytes'] == 142376 - got   # shards 1, 2 were staged
    with open(mirror_server['log']) as f:
        ranges = [json.loads(x).get('range') for x in f if 'model-00003' in x and '"GET"' in x]
    assert ranges[-1] == 'bytes=%d-' % got
    rep = mv.verify(job)
    assert rep['verified'] and rep['checked_sums'] == 5
