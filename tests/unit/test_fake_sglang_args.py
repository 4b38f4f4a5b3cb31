"""The lab's simulated SGLang's command line: argparse rebuilt from the parser of the release's wheel
(lab/fakesglang/sglang/lab_args.py with the table tools/sglang_flags_gen.py --lab-table writes), not
from the program's tables. Run with the system python3, as in a lab container."""

import os
import subprocess

import pytest

from tests import fakesglang


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
