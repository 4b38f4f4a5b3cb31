"""put_file.sh (how every host file is replaced) against a post step that hangs past the program's time limit.

The program stops waiting for a hung tool at gpuhost:host.ssh.command_timeout, but the script on the host lives on
until the tool ends. A re-run meanwhile writes the file again and finishes the post step; when the hung tool ends
later (killed, its connection gone), the first run's rollback must not put the old file back over the re-run's."""

import hashlib
import os
import subprocess
import time

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), '..', '..', 'hostscripts', 'put_file.sh')

# A proxmox-boot-tool whose first call hangs until released (30 s at most), then fails (killed); every later call
# succeeds.
TOOL = """#!/bin/bash
if mkdir "$LAB/first" 2>/dev/null; then
  touch "$LAB/started"
  for _ in $(seq 1500); do [ -e "$LAB/release" ] && break; sleep 0.02; done
  echo "proxmox-boot-tool: killed" >&2
  exit 143
fi
echo "Copying and configuring kernels"
"""


def sha(text):
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture
def host(tmp_path):
    bin_ = tmp_path / 'bin'
    bin_.mkdir()
    (bin_ / 'proxmox-boot-tool').write_text(TOOL)
    (bin_ / 'proxmox-boot-tool').chmod(0o755)
    etc = tmp_path / 'etc' / 'kernel'
    etc.mkdir(parents=True)
    (etc / 'cmdline').write_text('root=ZFS=rpool iommu.strict=0\n')
    env = dict(os.environ, PATH='%s:%s' % (bin_, os.environ['PATH']), LAB=str(tmp_path))
    yield tmp_path, etc / 'cmdline', env
    (tmp_path / 'release').touch()   # a test that failed half-way leaves no hung tool behind


def put(path, content, expected, env, wait=True):
    args = ['bash', SCRIPT, str(path), '0644', expected, sha(content), 'boot-systemd']
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            text=True)
    proc.stdin.write(content)
    proc.stdin.close()
    if wait:
        proc.wait(timeout=30)
        proc.out, proc.err = proc.stdout.read(), proc.stderr.read()
    return proc


def until(path):
    deadline = time.monotonic() + 30
    while not os.path.exists(path):
        assert time.monotonic() < deadline, 'the post step never started'
        time.sleep(0.02)


def leftovers(d):
    return sorted(n for n in os.listdir(d) if n.startswith('.gpuhost'))


NEW = 'root=ZFS=rpool iommu.strict=1\n'


def hung_first_run(lab, cmdline, env):
    """The first run: NEW written, its proxmox-boot-tool hanging. Returns (its process, the old content)."""
    old = cmdline.read_text()
    first = put(cmdline, NEW, sha(old), env, wait=False)
    until(lab / 'started')
    return first, old


def tool_killed(lab, first):
    """The hung tool ends failing (killed at last); the first run's exit status and stderr."""
    (lab / 'release').touch()
    first.wait(timeout=30)
    return first.returncode, first.stderr.read()


def test_a_hung_run_s_late_failure_leaves_a_rerun_s_file_alone(host):
    lab, cmdline, env = host
    first, _ = hung_first_run(lab, cmdline, env)
    assert cmdline.read_text() == NEW
    assert any(n.startswith('.gpuhost-old.') for n in leftovers(cmdline.parent)), 'no backup of the old file'
    # The operator re-runs while the first run's tool still hangs: the file has the new content, its post step is
    # still to run - the re-run runs it.
    rerun = put(cmdline, NEW, sha(NEW), env)
    assert rerun.returncode == 0, rerun.err
    assert rerun.out.startswith('changed %s (finished boot-systemd)' % sha(NEW))
    code, err = tool_killed(lab, first)
    assert code == 5
    assert 'a later run has taken the file over since' in err
    assert cmdline.read_text() == NEW
    assert leftovers(cmdline.parent) == []


def test_a_hung_run_that_fails_alone_puts_the_old_file_back(host):
    lab, cmdline, env = host
    first, old = hung_first_run(lab, cmdline, env)
    code, err = tool_killed(lab, first)
    assert code == 5
    assert 'the old file is back in place' in err
    assert cmdline.read_text() == old
    assert leftovers(cmdline.parent) == []


def test_a_rerun_that_writes_other_content_keeps_it(host):
    lab, cmdline, env = host
    third = 'root=ZFS=rpool quiet\n'
    first, _ = hung_first_run(lab, cmdline, env)
    rerun = put(cmdline, third, sha(NEW), env)
    assert rerun.returncode == 0, rerun.err
    assert rerun.out.startswith('changed %s' % sha(third))
    code, _ = tool_killed(lab, first)
    assert code == 5
    assert cmdline.read_text() == third
    assert leftovers(cmdline.parent) == []
