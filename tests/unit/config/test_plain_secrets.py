"""The check tools/run.sh runs before the Pulumi CLI (tools/plain_secrets.py, config.load.stack_file_plain_secrets):
which credentials Pulumi.<stack>.yaml holds in plain text - read as the program reads its config (the same paths,
SECRET_PATHS, in the same places: the shared settings and each gpuhost:hosts entry), flat keys too - and what it
says, without the value and without the passphrase."""

import json
import typing

import pytest
import yaml
from pydantic import BaseModel, SecretStr

from config import load
from config.deployment import Deployment
from tools import plain_secrets

SECURE = {'secure': 'v1:AAAAAAAAAAAAAAAA:not-decrypted-here'}


@pytest.fixture
def stack_file(tmp_path, monkeypatch):
    """write(config) -> the check's findings for stack `s` [(key, how)]; the project directory is tmp_path."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv('PULUMI_BACKEND_URL', 'file://%s' % (tmp_path / 'state'))
    (tmp_path / 'Pulumi.yaml').write_text('name: gpuhost\nruntime: python\n')

    def write(cfg, stack='s', extra=()):
        (tmp_path / ('Pulumi.%s.yaml' % stack)).write_text(yaml.safe_dump({'config': cfg}))
        return [(key, how) for key, _, _, how in load.stack_file_plain_secrets(stack, extra)]
    return write


def test_a_nested_plain_password_is_found_and_a_secure_one_passes(stack_file):
    host = {'address': 'h', 'api': {'user': 'root@pam', 'password': 'hunter2'}}
    assert stack_file({'gpuhost:host': host}) == [('gpuhost:host.api.password', 'nested')]
    host['api']['password'] = SECURE
    assert stack_file({'gpuhost:host': host}) == []
    # The whole object encrypted (pulumi config set --secret gpuhost:host '<json>'): nothing plain in it.
    assert stack_file({'gpuhost:host': SECURE}) == []


def test_the_flat_form_is_found_at_any_depth_and_a_secure_one_passes(stack_file):
    assert stack_file({'gpuhost:host.api.password': 'hunter2'}) == [('gpuhost:host.api.password', 'flat')]
    assert stack_file({'gpuhost:host.api': {'password': 'hunter2', 'port': 8006}}) == [('gpuhost:host.api', 'flat')]
    assert stack_file({'gpuhost:host.api.password': SECURE, 'gpuhost:host.api': {'password': SECURE}}) == []
    # Set with neither --path nor --secret: the fix removes the flat key and sets the structured one.
    assert load.secret_fix('gpuhost:host.api.password', 'gpuhost:host.api') == (
        'pulumi config rm gpuhost:host.api && pulumi config set --secret --path gpuhost:host.api.password')


def test_missing_credentials_and_other_settings_pass(stack_file):
    assert stack_file({'gpuhost:host': {'address': 'h', 'api': {'password_file': 'pw'}},
                       'gpuhost:sglang': {'port': 30000, 'api_key': None}, 'gpuhost:host.address': 'h',
                       'aws:region': 'x'}) == []
    assert stack_file({}) == []
    assert load.stack_file_plain_secrets('no-such-stack') == []


@pytest.mark.parametrize('path', load.SECRET_PATHS, ids=['.'.join(p) for p in load.SECRET_PATHS])
def test_every_credential_the_program_refuses_is_found_nested_flat_and_in_a_host_entry(stack_file, path):
    key = 'gpuhost:' + '.'.join(path)
    nested = {}
    node = nested
    for p in path[:-1]:
        node = node.setdefault(p, {})
    node[path[-1]] = 'plain'
    cfg = {'gpuhost:' + k: v for k, v in nested.items()}
    assert stack_file(cfg) == [(key, 'nested')]
    assert stack_file({key: 'plain'}) == [(key, 'flat')]
    hosts = [{'name': 'a'}, dict(nested, name='b')]
    assert stack_file({'gpuhost:hosts': hosts}) == [('gpuhost:hosts[1].' + '.'.join(path), 'nested')]
    assert stack_file({'gpuhost:hosts[1].' + '.'.join(path): 'plain'}) == [('gpuhost:hosts[1].' + '.'.join(path),
                                                                           'flat')]
    # As the program gets a structured value: JSON text is decoded (config.load.fleet_from_pulumi).
    assert stack_file({'gpuhost:' + path[0]: json.dumps(nested[path[0]])}) == [(key, 'nested')]


def test_a_secure_leaf_covers_only_its_own_host(stack_file):
    hosts = [{'name': 'a', 'host': {'api': {'password': SECURE}}}, {'name': 'b', 'host': {'api': {'password': 'x'}}}]
    assert stack_file({'gpuhost:hosts': hosts}) == [('gpuhost:hosts[1].host.api.password', 'nested')]


def test_a_config_flag_is_found():
    assert plain_secrets.flag_config(['--yes', '-c', 'gpuhost:model.token=hf_x', '--config=a:b=c=d',
                                      '-cgpuhost:sglang.api_key=k', '--config-file', 'f.yaml']) == [
        ('gpuhost:model.token', 'hf_x'), ('a:b', 'c=d'), ('gpuhost:sglang.api_key', 'k')]


def test_the_refusal_names_the_key_and_the_fix_never_the_value(stack_file, capsys):
    stack_file({'gpuhost:host': {'api': {'password': 'hunter2-value'}, 'ssh': {'private_key': 'PRIVATE-value'}}},
               stack='prod')
    assert plain_secrets.main(['prod', '--yes', '-c', 'gpuhost:model.token=hf_value']) == 2
    err = capsys.readouterr().err
    assert 'value' not in err, err
    lines = err.splitlines()
    assert len(lines) == 3 and all(line.startswith('run: stack prod: gpuhost:') for line in lines), err
    assert 'gpuhost:host.ssh.private_key is set as plain text in Pulumi.prod.yaml' in lines[0]
    assert lines[0].endswith('pulumi config rm --path gpuhost:host.ssh.private_key && pulumi config set --secret '
                             '--path gpuhost:host.ssh.private_key < ~/.ssh/<key>')
    assert 'Refused before pulumi runs: no update, refresh or destroy of this run recorded it.' in lines[1]
    assert 'holds no record of it): if that file was committed or shared, rotate it' in lines[1]
    assert 'gpuhost:model.token is given as plain text on the command line' in lines[2]
    assert plain_secrets.main(['other']) == 0


def test_secret_paths_are_the_models_secret_fields():
    """SECRET_PATHS - what the program and the check refuse in plain text - is every SecretStr field of the
    model: a new secret field the list missed would be taken in plain text by both."""
    def walk(model, path):
        for name, field in model.model_fields.items():
            for t in [field.annotation] + list(typing.get_args(field.annotation)):
                if t is SecretStr:
                    yield path + (name,)
                elif isinstance(t, type) and issubclass(t, BaseModel):
                    yield from walk(t, path + (name,))
    assert sorted(walk(Deployment, ())) == sorted(load.SECRET_PATHS)


def test_the_fleet_locks_plain_password_is_found_nested_and_flat(stack_file):
    lock = {'group': 'g', 'slots': 1, 'endpoints': ['http://e:2379'], 'user': 'u', 'password': 'plain'}
    key = 'gpuhost:rollout.fleet_lock.password'
    assert stack_file({'gpuhost:rollout': {'fleet_lock': lock}}) == [(key, 'nested')]
    assert stack_file({key: 'plain'}) == [(key, 'flat')]
    assert stack_file({'gpuhost:rollout': {'fleet_lock': dict(lock, password=SECURE)}}) == []
