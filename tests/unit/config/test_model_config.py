"""gpuhost:model: the weights' storage, mount and identity - what is refused (one line naming the key) and
what follows from it (the container's mpN entry, the model directory on the host, the checksum file)."""

import copy

import pytest

import config
from config.load import model_inputs
from tests.unit.config.test_config import lab_data


def parse(model=None, **sglang):
    data = copy.deepcopy(lab_data())
    if model is not None:
        data['model'] = dict(data['model'], **model)
    data['sglang'].update(sglang)
    return config.parse(data)


def refused(message, model=None, **sglang):
    with pytest.raises(config.ConfigError) as e:
        parse(model, **sglang)
    assert message in str(e.value)
    assert '\n' not in str(e.value).strip().split('invalid stack configuration:')[-1].strip().lstrip('- ')
    return str(e.value)


def test_the_lab_model_is_mounted_read_only_and_found_below_its_storage():
    d = parse()
    assert d.container_mounts() == {'mp0': '/var/lib/gpuhost-models,mp=/models,ro=1'}
    assert d.model.host_dir(d.sglang.model_path) == '/var/lib/gpuhost-models/Qwen3.5-122B-A10B@' + \
        d.model.revision
    assert '/models/Qwen3.5-122B-A10B@%s' % d.model.revision in d.launch_args()
    assert not [w for w in d.warnings if 'writable' in w]


def test_a_writable_mount_only_when_asked_for_and_then_warned():
    d = parse({'writable': True, 'mp': 3})
    assert d.container_mounts() == {'mp3': '/var/lib/gpuhost-models,mp=/models,ro=0'}
    assert any(w.startswith('gpuhost:model.writable: true - container 200 can write the weights') for w in d.warnings)
    refused("gpuhost:model.ro is not a setting", {'ro': 0})


def test_model_path_outside_the_mount_is_refused():
    refused("gpuhost:sglang.model_path: '/opt/models/Qwen3.5-122B-A10B' is not inside the model mount "
            "gpuhost:model.mount (/models)", model_path='/opt/models/Qwen3.5-122B-A10B')
    refused("is not inside the model mount", model_path='/models')
    refused("is not inside the model mount", model_path='/modelsx/Qwen')
    refused('gpuhost:model.mount: \'/etc\' is a system directory', {'mount': '/etc'})


@pytest.mark.parametrize('revision,message', [
    ('main', "gpuhost:model.revision: 'main' is a branch, which moves"),
    ('8177ab0', "gpuhost:model.revision: '8177ab0' looks like an abbreviated commit"),
    ('v1.0; rm -rf /', "gpuhost:model.revision: 'v1.0; rm -rf /' is not a commit"),
    ('../x', "is not a commit"),
    ('8177AB06040C16B2AC6D81B49F000D8E8F4F969E', 'is a commit in capitals; git and the hub write it in lowercase: 8177ab06'),
])
def test_a_revision_is_a_commit_or_a_tag(revision, message):
    refused(message, {'revision': revision})


def test_tags_and_commits_pass():
    assert parse({'revision': 'v1.0'}).model.revision == 'v1.0'
    assert parse({'revision': '8177ab06040c16b2ac6d81b49f000d8e8f4f969e'}).model.revision.startswith('8177')


@pytest.mark.parametrize('key,value', [('storage', '/etc/pve/models'), ('storage', '/var/lib/vz/models'),
                                       ('storage', '/usr/lib'), ('storage', '/run/x'), ('mount', '/var/lib/dpkg'),
                                       ('mount', '/root/.cache'), ('mount', '/tmp/models'), ('mount', '/run/m')])
def test_nothing_below_a_system_directory(key, value):
    refused("gpuhost:model.%s: %r is a system directory" % (key, value), {key: value})


def test_storage_must_be_a_plain_absolute_path():
    refused("gpuhost:model.storage: 'rpool/models' is not an absolute path", {'storage': 'rpool/models'})
    refused("gpuhost:model.storage: '/' is a system directory of the host", {'storage': '/'})


def test_the_checksum_file_is_read_from_the_repository_at_preview(tmp_path):
    d = parse({'checksums': 'models/m.sha256'})
    (tmp_path / 'models').mkdir()
    (tmp_path / 'models' / 'm.sha256').write_text('# from the source\n%s  model-00001-of-00002.safetensors\n'
                                                  '%s *config.json\n' % ('a' * 64, 'B' * 64))
    assert model_inputs(d, str(tmp_path)) == {'checksums': {'model-00001-of-00002.safetensors': 'a' * 64,
                                                            'config.json': 'b' * 64}, 'token': None}
    (tmp_path / 'models' / 'm.sha256').write_text('%s  ../../etc/shadow\n' % ('a' * 64))
    with pytest.raises(config.ConfigError, match=r'gpuhost:model.checksums \(models/m.sha256\), line 1: '):
        model_inputs(d, str(tmp_path))
    with pytest.raises(config.ConfigError, match='gpuhost:model.checksums'):
        model_inputs(parse({'checksums': 'models/absent.sha256'}), str(tmp_path))
    refused("gpuhost:model.checksums: '/etc/m.sha256' is not a path inside the repository",
            {'checksums': '/etc/m.sha256'})
    assert model_inputs(parse({'checksums': None}), str(tmp_path)) == {'checksums': None, 'token': None}


def test_without_a_model_section_nothing_is_mounted():
    data = copy.deepcopy(lab_data())
    data.pop('model')
    d = config.parse(data)
    assert d.container_mounts() == {} and d.model is None


@pytest.mark.parametrize('source,message', [
    ('https://user:pw@mirror.example.internal/models/Q', 'gpuhost:model.source: holds credentials'),
    ('https://mirror.example.internal/models/Q?token=abc', 'gpuhost:model.source: holds credentials'),
    ('ftp://mirror.example.internal/Q', "gpuhost:model.source: 'ftp://mirror.example.internal/Q' is not a source"),
    ('hf://Qwen/Qwen3.5-122B-A10B@main', "gpuhost:model.source: 'main' is a branch"),
    ('hf://Qwen/Qwen3.5-122B-A10B@v2', 'names revision v2, but gpuhost:model.revision is 8177ab06'),
    ('hf://Qwen/../etc', 'is not hf://<org>/<repo>'),
])
def test_bad_sources_are_refused(source, message):
    refused(message, {'source': source})


def test_sources_and_the_urls_files_come_from():
    rev = lab_data()['model']['revision']
    assert parse({'source': 'hf://Qwen/Qwen3.5-122B-A10B'}).model.base_url() == \
        'https://huggingface.co/Qwen/Qwen3.5-122B-A10B/resolve/%s' % rev
    assert parse({'source': 'hf://Qwen/Qwen3.5-122B-A10B@%s' % rev}).model.base_url().endswith(rev)
    assert parse({'source': 'http://10.0.0.5:8080/models/Q/'}).model.base_url() == 'http://10.0.0.5:8080/models/Q'
    refused('gpuhost:model.token is set but there is no gpuhost:model.source', {'token': 'hf_' + 'x' * 30})
    refused('plain-http source would cross the network unencrypted',
            {'source': 'http://10.0.0.5/Q', 'token': 'hf_' + 'x' * 30})


def test_a_plain_text_token_is_refused():
    data = {'model': {'token': 'hf_' + 'x' * 30}}
    with pytest.raises(config.ConfigError, match=r'gpuhost:model.token is set as plain text.*--secret --path '
                                                 r'gpuhost:model.token'):
        config.check_secrets(data, lambda key: False, None)
    config.check_secrets(data, lambda key: True, {('model', 'token')})


def test_the_download_s_connections_and_rate_limit():
    assert parse().model.download_options() == {'connections': 8, 'max_bytes_per_s': None}
    assert parse({'connections': 16, 'max_bytes_per_s': 125000000}).model.download_options() == \
        {'connections': 16, 'max_bytes_per_s': 125000000}
    refused('gpuhost:model.connections: 0 is not a number of connections the host may open to the source at once '
            '(1-32); write e.g. 8', {'connections': 0})
    refused('gpuhost:model.connections: 100 is not a number of connections', {'connections': 100})
    refused("gpuhost:model.connections: '8' is not a whole number (write it without quotes)", {'connections': '8'})
    refused('gpuhost:model.max_bytes_per_s: 100 bytes/s is below 1000000 (1 MB/s), which would take days for a model '
            'of hundreds of GB; give bytes per second, e.g. 125000000 for 1 Gbit/s', {'max_bytes_per_s': 100})
    refused('gpuhost:model.max_bytes_per_s: 1.5 is not a whole number', {'max_bytes_per_s': 1.5})
