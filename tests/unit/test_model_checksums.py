"""tools/model_checksums.py against the lab mirror (lab/mirror.py in a thread, as tests/unit/test_model_verify.py runs
it): the checksum file for a revision written from the hub's API (LFS sums, never the weights) or from a mirror's
X-Linked-Etag, the same lines lab/labmodel.py's own sha256 give; the token sent to the hub only, never to its CDN,
and never taken from the command line."""

import hashlib

import pytest

from config.model import parse_checksums
from tests.unit.test_model_verify import HUB_TOKEN, SHARDS, MirrorServer, labmodel, mirror
from tools import model_checksums


@pytest.fixture
def server(tmp_path, monkeypatch):
    monkeypatch.setattr(mirror, 'SLOW', {})
    monkeypatch.delenv('HF_TOKEN', raising=False)
    monkeypatch.delenv('HF_ENDPOINT', raising=False)
    s = MirrorServer(tmp_path)
    yield s
    s.close()


def true_sums():
    return {n: hashlib.sha256(data).hexdigest() for n, data in labmodel.files('M', 'v1').items()}


def test_from_the_hub_api_the_weights_are_not_downloaded(server, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv('HF_TOKEN', HUB_TOKEN)
    out = tmp_path / 'models' / 'M.sha256'
    assert model_checksums.main(['hf://%s/M@v1' % labmodel.HUB_ORG, '--endpoint', 'http://' + server.hub_host,
                                 '-o', str(out)]) == 0
    text = out.read_text()
    assert parse_checksums(text, 'M.sha256') == true_sums()
    commit = mirror.commit_of('%s/M' % labmodel.HUB_ORG, 'v1')
    assert text.startswith('# %s/M at revision v1 (commit %s), from http://%s\n' % (labmodel.HUB_ORG, commit,
                                                                                   server.hub_host))
    err = capsys.readouterr().err
    assert '5 files -> %s (3 LFS files: the hub\'s sha256; 2 in git: downloaded and hashed here)' % out in err
    assert 'the revision v1 is commit %s' % commit in err
    recs = server.requests(method=None, until=lambda rs: len(rs) >= 3)
    assert all(r['auth'] for r in recs) and not any(r['path'].endswith('.safetensors') for r in recs), recs


def test_from_a_hub_style_mirror_url_by_x_linked_etag(server, tmp_path, capsys):
    url = server.hub_url
    with open(tmp_path / 'token', 'w') as f:
        f.write(HUB_TOKEN + '\n')
    assert model_checksums.main([url, '--token-file', str(tmp_path / 'token')]) == 0
    out = capsys.readouterr().out
    assert parse_checksums(out, 'stdout') == true_sums()
    recs = server.requests(method=None, until=lambda rs: len(rs) >= 6)
    # The shards' sums came from the hub's HEAD (302, not followed): no CDN request, no shard byte fetched.
    assert not [r for r in recs if r['host'] == server.cdn_host], recs
    assert {r['method'] for r in recs if r['path'].endswith('.safetensors')} == {'HEAD'}


def test_from_a_plain_mirror_small_files_are_hashed_here_and_big_ones_named(server, capsys):
    assert model_checksums.main([server.url]) == 0
    assert parse_checksums(capsys.readouterr().out, 'stdout') == true_sums()
    assert model_checksums.main([server.url, '--max-hash-bytes', '60000']) == 1
    err = capsys.readouterr().err.strip()
    assert err == ('model_checksums: %s: more than 60.0 kB and the source gives no sha256 for it (no X-Linked-Etag); '
                   'hash it where the files are (sha256sum %s) and add the line by hand, or raise --max-hash-bytes'
                   % (SHARDS[0], SHARDS[0])), err


def test_without_the_token_the_hub_refuses_in_one_line(server, capsys):
    assert model_checksums.main(['hf://%s/M@v1' % labmodel.HUB_ORG, '--endpoint', 'http://' + server.hub_host]) == 1
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and 'HTTP 401 (the token is refused or missing) - reading the revision\'s file ' \
        'list' in err, err


@pytest.mark.parametrize('argv,message', [
    (['hf://Qwen/Qwen3.5-122B-A10B'], 'write hf://<org>/<repo>@<revision>'),
    (['hf://Qwen/Qwen3.5-122B-A10B@main'], "'main' is a branch, which moves"),
    (['ftp://x/y'], 'is not hf://<org>/<repo>@<revision> or the http(s) URL'),
])
def test_what_it_refuses(argv, message, capsys):
    assert model_checksums.main(argv) == 1
    assert message in capsys.readouterr().err


def test_the_token_is_not_an_argument(capsys):
    with pytest.raises(SystemExit):
        model_checksums.main(['hf://a/b@v1', '--token', 'hf_secret'])
    assert 'unrecognized arguments: --token' in capsys.readouterr().err
