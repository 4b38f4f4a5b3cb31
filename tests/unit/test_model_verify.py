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
