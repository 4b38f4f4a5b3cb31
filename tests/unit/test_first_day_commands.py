"""The commands README's "Aim it at a real host" gives, checked against the config's parsers: what each prints
is what the config takes, as printed."""

import copy
import glob
import os
import re
import shutil
import subprocess

import pytest

import config
from config.values import cpus_of, parse_host_key
from tests.unit.config.test_config import lab_data

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def readme_block_lines(containing):
    with open(os.path.join(REPO, 'README.md')) as f:
        return [line for line in f.read().splitlines() if containing in line]


@pytest.fixture(scope='module')
def host_key(tmp_path_factory):
    path = str(tmp_path_factory.mktemp('key') / 'ssh_host_ed25519_key')
    subprocess.run(['ssh-keygen', '-q', '-t', 'ed25519', '-N', '', '-C', 'root@pve-gpu01', '-f', path], check=True)
    with open(path + '.pub') as f:
        kind, blob, _ = f.read().split()
    return kind, blob


@pytest.mark.parametrize('host', ['pve-gpu01', '10.20.0.5', '[10.20.0.5]:2222', '|1|F1E1KeoE/eEWhi10WpGv4OdiO6Y=|3988QV0VE8wmZL7suNrYQLITLCg='])
def test_the_line_ssh_keyscan_prints_is_a_host_key(host_key, host):
    kind, blob = host_key
    line = '%s %s %s' % (host, kind, blob)          # ssh-keyscan -t ed25519 <host>, as printed
    assert parse_host_key(line) == '%s %s' % (kind, blob)
    data = copy.deepcopy(lab_data())
    data['host']['ssh'].pop('host_key_file', None)
    data['host']['ssh']['host_key'] = line
    assert config.parse(data).host.ssh.host_key == '%s %s' % (kind, blob)


def test_a_keyscan_line_with_a_damaged_key_is_still_refused(host_key):
    kind, blob = host_key
    with pytest.raises(ValueError, match='ssh-keyscan -t ed25519'):
        parse_host_key('pve-gpu01 %s %s' % (kind, blob[:-8]))


# `lspci -D -nn -d 10de:` on the reference host (one GPU and, on cards that have one, its audio function).
LSPCI = ('0000:01:00.0 3D controller [0302]: NVIDIA Corporation GB202GL [RTX PRO 6000 Blackwell Server Edition] '
         '[10de:2bb5] (rev a1)\n'
         '0000:01:00.1 Audio device [0403]: NVIDIA Corporation GB202 High Definition Audio Controller [10de:22e8] '
         '(rev a1)\n')


def test_what_lspci_d_nn_prints_is_a_gpu_entry():
    gpus = []
    for line in LSPCI.splitlines():
        if re.search(r'\[03[0-9a-f]{2}\]:', line):     # display controllers only
            gpus.append({'address': line.split()[0], 'id': re.findall(r'\[([0-9a-f]{4}:[0-9a-f]{4})\]', line)[-1],
                         'numa': 0})
    assert gpus == [{'address': '0000:01:00.0', 'id': '10de:2bb5', 'numa': 0}]
    data = copy.deepcopy(lab_data())
    data['host']['gpus'][0] = gpus[0]
    assert config.parse(data).host.gpus[0].address == '0000:01:00.0'


def test_an_address_without_the_domain_says_lspci_minus_d():
    data = copy.deepcopy(lab_data())
    data['host']['gpus'][0]['address'] = '01:00.0'         # what lspci -nn (without -D) prints
    with pytest.raises(config.ConfigError, match=r'lspci -D'):
        config.parse(data)


def test_the_cpulist_command_prints_numa_cpus_as_the_config_takes_them():
    cmd = next(line for line in readme_block_lines('host.numa_cpus') if 'cpulist' in line)
    assert 'grep -H . /sys/devices/system/node/node*/cpulist' in cmd
    files = glob.glob('/sys/devices/system/node/node*/cpulist')
    if not files:
        pytest.skip('no NUMA nodes in this machine\'s sysfs')
    out = subprocess.run('grep -H . /sys/devices/system/node/node*/cpulist', shell=True, capture_output=True,
                         text=True, check=True).stdout
    numa = {}
    for line in out.splitlines():
        path, _, cpus = line.partition(':')
        numa[re.search(r'node(\d+)/cpulist$', path).group(1)] = cpus
    assert numa and all(cpus_of(v) for v in numa.values())
    # The reference host's, as the kernel prints them (SMT siblings in a second range).
    assert cpus_of('0-31,64-95') == set(range(0, 32)) | set(range(64, 96))


def test_the_passphrase_file_is_created_as_written_and_pulumi_reads_it(tmp_path):
    lines = [line.split('#')[0].strip() for line in readme_block_lines('config/gpuhost')
             if line.startswith(('install ', '(umask'))]
    assert len(lines) == 2, lines
    home = tmp_path / 'home'
    home.mkdir()
    env = dict(os.environ, HOME=str(home))
    env.pop('PULUMI_CONFIG_PASSPHRASE', None)
    env.pop('PULUMI_CONFIG_PASSPHRASE_FILE', None)
    subprocess.run(['bash', '-euc', '\n'.join(lines)], env=env, check=True)
    pass_file = home / '.config' / 'gpuhost' / 'prod.pass'
    assert oct(pass_file.stat().st_mode & 0o777) == '0o600' and len(pass_file.read_text()) >= 40
    proj = tmp_path / 'project'
    proj.mkdir()
    shutil.copy(os.path.join(REPO, 'Pulumi.yaml'), proj / 'Pulumi.yaml')
    (tmp_path / 'state').mkdir()
    env.update(PULUMI_CONFIG_PASSPHRASE_FILE=str(pass_file), PULUMI_BACKEND_URL='file://%s' % (tmp_path / 'state'),
               PULUMI_HOME=str(tmp_path / 'pulumi-home'), PULUMI_SKIP_UPDATE_CHECK='true')
    run = lambda *a, **kw: subprocess.run(['pulumi'] + list(a), cwd=proj, env=env, capture_output=True,  # noqa: E731
                                          text=True, check=True, **kw)
    run('stack', 'select', '--create', '--secrets-provider', 'passphrase', 'prod')
    run('config', 'set', '--secret', '--path', 'gpuhost:sglang.api_key', input='not-the-real-key')
    assert run('config', 'get', '--path', 'gpuhost:sglang.api_key').stdout.strip() == 'not-the-real-key'


def test_the_prod_example_decrypts_with_the_passphrase_the_readme_gives(tmp_path):
    line = next(line for line in readme_block_lines('pulumi stack init --secrets-provider passphrase prod')
                if 'PULUMI_CONFIG_PASSPHRASE=' in line)
    passphrase = re.search(r'export PULUMI_CONFIG_PASSPHRASE=([^\s;]+); pulumi stack init', line).group(1)
    proj = tmp_path / 'project'
    proj.mkdir()
    for name in ('Pulumi.yaml', 'Pulumi.prod.yaml'):
        shutil.copy(os.path.join(REPO, name), proj / name)
    (tmp_path / 'state').mkdir()
    env = dict(os.environ, PULUMI_CONFIG_PASSPHRASE=passphrase, PULUMI_BACKEND_URL='file://%s' % (tmp_path / 'state'),
               PULUMI_HOME=str(tmp_path / 'pulumi-home'), PULUMI_SKIP_UPDATE_CHECK='true')
    env.pop('PULUMI_CONFIG_PASSPHRASE_FILE', None)
    # (make creates no stack but the lab's: README has it made first, in the backend in use)
    subprocess.run(['pulumi', 'stack', 'init', '--secrets-provider', 'passphrase', 'prod'], cwd=proj,
                   env=env, check=True, capture_output=True)
    res = subprocess.run(['pulumi', 'config', '--show-secrets', '--json'], cwd=proj, env=env, capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stderr
