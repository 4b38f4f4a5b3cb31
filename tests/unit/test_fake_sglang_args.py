"""The lab's simulated SGLang's command line: argparse rebuilt from the parser of the release's wheel
(lab/fakesglang/sglang/lab_args.py with the table tools/sglang_flags_gen.py --lab-table writes), not
from the program's tables, so a wrong table in components/ is caught by --verify and not shared by
the lab. Run with the system python3, as in a lab container."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tests import fakesglang
from tools import sglang_flags_gen as gen

REPO = fakesglang.REPO


def run_fake(lib, *argv, **env):
    return subprocess.run(['/usr/bin/python3', '-m', 'sglang.launch_server'] + list(argv), cwd=str(lib),
                          env=dict({'PYTHONPATH': str(lib), 'PATH': '/usr/bin:/bin'}, **env),
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def fake_sglang(tmp_path):
    def install(version):
        lib = tmp_path / version
        fakesglang.install(lib, version)
        return lambda *argv: run_fake(lib, *argv)
    return install


def test_fake_refuses_like_argparse(fake_sglang):
    run = fake_sglang('0.5.23')
    r = run('--model-path', '/m', '--tp', '4', '--cuda-graph-max-bs', '64')
    assert r.returncode == 2 and r.stderr.startswith('usage: sglang serve')
    assert r.stderr.splitlines()[-1] == ('sglang serve: error: ambiguous option: --cuda-graph-max-bs could match '
                                         '--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill')
    r = run('--model-path', '/m', '--mamba-scheduler-strategy', 'extra_buffer')
    assert r.returncode == 2
    assert r.stderr.splitlines()[-1] == 'sglang serve: error: unrecognized arguments: --mamba-scheduler-strategy ' \
                                        'extra_buffer'
    r = run('--model-path', '/m', '--port', 'abc')
    assert r.returncode == 2 and r.stderr.splitlines()[-1] == "sglang serve: error: argument --port: invalid int " \
                                                              "value: 'abc'"


def test_fake_older_version_prog_and_removed_flag(fake_sglang):
    run = fake_sglang('0.5.3')
    r = run('--model-path', '/m', '--no-such-flag')
    assert r.returncode == 2
    assert r.stderr.splitlines()[-1] == 'launch_server.py: error: unrecognized arguments: --no-such-flag'
    r = run('--model-path', '/m', '--enable-ep-moe')
    assert r.returncode == 1 and r.stderr.strip().startswith('ValueError: NOTE: --enable-ep-moe is deprecated')


def test_fake_checks_speculative_settings_after_parsing(fake_sglang):
    r = fake_sglang('0.5.19')('--model-path', '/m', '--tp', '4', '--mamba-scheduler-strategy', 'extra_buffer',
                              '--speculative-algorithm', 'NEXTN')
    assert r.returncode == 1 and 'speculative decoding needs' in r.stderr


def test_a_package_without_its_versions_table_does_not_start(tmp_path):
    pkg = fakesglang.install(tmp_path, '0.5.23')
    with open(os.path.join(pkg, 'VERSION'), 'w') as f:
        f.write('0.5.22\n')
    r = run_fake(tmp_path, '--model-path', '/m')
    assert r.returncode == 1
    assert r.stderr.strip() == ("RuntimeError: lab: %s is SGLang 0.5.23's argument table, this package is 0.5.22"
                                % os.path.join(pkg, 'lab_server_args.json'))
    os.unlink(os.path.join(pkg, 'lab_server_args.json'))
    r = run_fake(tmp_path, '--model-path', '/m')
    assert r.returncode == 1 and 'tools/sglang_flags_gen.py --lab-table 0.5.22 --out' in r.stderr


# ---------------------------------------------------------------------------------------------
# Independence: a wrong committed table

def free_port():
    s = socket.socket()
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.slow  # a whole --verify run: ~35 s of CPU
def test_a_wrong_committed_table_fails_verify_and_the_lab_does_not_use_it(tmp_path):
    # A checkout whose committed 0.5.23 table lost --enable-metrics and the choice extra_buffer_lazy, and
    # still has --mamba-scheduler-strategy (SGLang refuses it from 0.5.20).
    tree = tmp_path / 'checkout'
    shutil.copytree(os.path.join(REPO, 'tools'), tree / 'tools', ignore=shutil.ignore_patterns('__pycache__', 'pulumi*'))
    shutil.copytree(os.path.join(REPO, 'lab', 'fakesglang'), tree / 'lab' / 'fakesglang',
                    ignore=shutil.ignore_patterns('__pycache__'))
    (tree / 'grammar' / 'sglang_flags_data').mkdir(parents=True)
    for name in ('__init__.py', 'sglang_argparse.py'):
        shutil.copyfile(os.path.join(REPO, 'grammar', name), tree / 'grammar' / name)
    with open(os.path.join(REPO, 'grammar', 'sglang_flags_data', '0.5.23.json')) as f:
        table = json.load(f)
    table['actions'] = [a for a in table['actions'] if a['option_strings'] != ['--enable-metrics']]
    mamba, = [a for a in table['actions'] if a['dest'] == 'mamba_radix_cache_strategy']
    mamba['choices'].remove('extra_buffer_lazy')
    table['actions'].append(dict(mamba, dest='mamba_scheduler_strategy', option_strings=['--mamba-scheduler-strategy']))
    (tree / 'grammar' / 'sglang_flags_data' / '0.5.23.json').write_text(gen.render(table))
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}

    # CI's check (.ci/run) in that checkout: the program's parser disagrees with SGLang's, the lab's does not.
    r = subprocess.run([sys.executable, str(tree / 'tools' / 'sglang_flags_gen.py'), '--verify', '0.5.23'],
                       cwd=str(tree), env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 1, r.stdout + r.stderr
    summary = [line.split() for line in r.stdout.splitlines() if line.startswith('0.5.23')]
    counts = {words[1]: int(words[-2]) for words in summary}
    assert counts['grammar/sglang_argparse'] > 0 and counts['lab/fakesglang'] == 0, r.stdout
    found = r.stdout.splitlines()
    # Without --enable-metrics the program's parser reads it as an abbreviation of the next flag.
    assert '    --model-path /m --enable-metrics: enable_metrics_for_all_schedulers: SGLang False, rebuilt True' in found
    assert any(line.startswith('    --model-path /m --mamba-radix-cache-strategy extra_buffer_lazy: SGLang accepts, '
                               'rebuilt refuses') for line in found), r.stdout
    assert any(line.startswith('    --model-path /m --mamba-scheduler-strategy extra_buffer: SGLang refuses (sglang '
                               'serve: error: unrecognized arguments: --mamba-scheduler-strategy extra_buffer), '
                               'rebuilt accepts') for line in found), r.stdout

    # The lab's SGLang built from that checkout: its table is the wheel's, and it serves with both.
    lib = tmp_path / 'lib'
    shutil.copytree(tree / 'lab' / 'fakesglang' / 'sglang', lib / 'sglang')
    (lib / 'sglang' / 'VERSION').write_text('0.5.23\n')
    subprocess.run([sys.executable, str(tree / 'tools' / 'sglang_flags_gen.py'), '--lab-table', '0.5.23', '--out',
                    str(lib / 'sglang' / 'lab_server_args.json')], cwd=str(tree), env=env, check=True, timeout=600)
    assert not any(name.startswith('sglang_') for name in os.listdir(lib / 'sglang'))  # nothing of components/
    r = run_fake(lib, '--model-path', '/m', '--mamba-scheduler-strategy', 'extra_buffer')
    assert r.returncode == 2 and r.stderr.splitlines()[-1] == ('sglang serve: error: unrecognized arguments: '
                                                               '--mamba-scheduler-strategy extra_buffer')
    port = free_port()
    p = subprocess.Popen(['/usr/bin/python3', '-m', 'sglang.launch_server', '--model-path', '/m', '--enable-metrics',
                          '--mamba-radix-cache-strategy', 'extra_buffer_lazy', '--host', '127.0.0.1', '--port', str(port)],
                         cwd=str(lib), env={'PYTHONPATH': str(lib), 'PATH': '/usr/bin:/bin', 'LAB_SGLANG_STARTUP': '0'},
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 20
        while True:
            assert p.poll() is None, p.stderr.read()
            try:
                with urllib.request.urlopen('http://127.0.0.1:%d/server_info' % port, timeout=2) as resp:
                    info = json.loads(resp.read())
                break
            except OSError:
                assert time.time() < deadline, 'the simulated SGLang did not start'
                time.sleep(0.05)
        assert info['mamba_radix_cache_strategy'] == 'extra_buffer_lazy' and info['enable_metrics'] is True
    finally:
        p.terminate()
        p.wait(10)
