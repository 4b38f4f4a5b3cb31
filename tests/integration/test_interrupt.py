"""Ctrl-C and kill in the middle of an `up`, as an operator's terminal delivers them: SIGINT to the whole
foreground process group (the CLI, the language host, the provider processes), once or twice, and
SIGKILL of the CLI alone. The run says what happened without Python frames, no managed file is
half-written, and the commands in docs/operator-guide.md ("if a run was interrupted") make the next run converge."""

import os
import signal
import subprocess
import threading
import time

import pytest

STACK = 'interrupt'
pytestmark = pytest.mark.slow


def unit_path(lab):
    return os.path.join(lab.ct_root(), 'etc', 'systemd', 'system', 'sglang-qwen.service')


def with_steps(cfg, steps):
    cfg['gpuhost:sglang']['speculative'] = {'algorithm': 'NEXTN', 'num_steps': steps, 'eagle_topk': 1,
                                            'num_draft_tokens': steps + 1}
    return cfg


@pytest.fixture(scope='module')
def deployed(lab):
    return lab.deploy(STACK)


def up_interrupted(lab, marker, sigs, timeout=240, at_marker=None):
    """`pulumi up` in a session of its own; when `marker` shows in its output, deliver `sigs` (a list of
    (signal, to_group, delay_before)). Returns (exit code, output)."""
    proc = subprocess.Popen(['pulumi', 'up', '--yes', '--skip-preview', '--stack', STACK], cwd=lab.project,
                            env=lab.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines, seen = [], threading.Event()

    def reader():
        for line in proc.stdout:
            lines.append(line)
            if marker in line:
                seen.set()
    t = threading.Thread(target=reader, daemon=True)
    t.start()
    assert seen.wait(timeout), 'never saw %r:\n%s' % (marker, ''.join(lines)[-3000:])
    if at_marker:
        at_marker()
    for sig, group, delay in sigs:
        time.sleep(delay)
        try:
            (os.killpg if group else os.kill)(proc.pid, sig)
        except ProcessLookupError:
            pass
    rc = proc.wait(timeout=timeout)
    t.join(timeout=10)
    out = ''.join(lines)
    assert 'Traceback (most recent call last)' not in out and 'KeyboardInterrupt' not in out, out[-4000:]
    return rc, out


def test_one_ctrl_c_while_sglang_restarts_ends_cleanly_and_the_rerun_converges(lab, deployed):
    old = open(unit_path(lab)).read()
    lab.write_stack(STACK, with_steps(lab.stack_config(), 2))
    rc, out = up_interrupted(lab, 'sglang-unit updating', [(signal.SIGINT, True, 0.5)])
    assert rc != 0, out[-3000:]
    assert 'canceled' in out or 'cancelled' in out or 'interrupted' in out, out[-3000:]
    text = open(unit_path(lab)).read()
    assert text == old or 'speculative-num-steps 2' in text
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    assert 'speculative-num-steps 2' in open(unit_path(lab)).read()
    assert lab.outputs(STACK)['speculation']['resolved']['speculative_num_steps'] == 2
    lab.pulumi('up', '--yes', '--expect-no-changes', stack=STACK)


def test_two_ctrl_c_leave_nothing_half_written_and_readme_commands_converge(lab, deployed):
    lab.write_stack(STACK, with_steps(lab.stack_config(), 3))
    old = open(unit_path(lab)).read()
    rc, out = up_interrupted(lab, 'sglang-unit updating', [(signal.SIGINT, True, 0.3), (signal.SIGINT, True, 0.3)])
    assert rc != 0, out[-3000:]
    text = open(unit_path(lab)).read()
    assert text == old or 'speculative-num-steps 3' in text
    assert not [n for n in os.listdir(os.path.dirname(unit_path(lab))) if n.startswith('.gpuhost')]
    # docs/operator-guide.md, "if a run was interrupted".
    lab.pulumi('cancel', '--yes', stack=STACK, check=False)
    lab.pulumi('refresh', '--yes', '--clear-pending-creates', stack=STACK)
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    assert lab.outputs(STACK)['speculation']['resolved']['speculative_num_steps'] == 3
    lab.pulumi('up', '--yes', '--expect-no-changes', stack=STACK)


def test_kill_9_of_the_cli_leaves_no_program_process_and_the_readme_commands_converge(lab, deployed):
    lab.write_stack(STACK, with_steps(lab.stack_config(), 4))
    running = []
    rc, out = up_interrupted(lab, 'sglang-unit updating', [(signal.SIGKILL, False, 0.3)],
                             at_marker=lambda: running.extend(_providers_of(lab.project)))
    assert running, 'no provider process seen while the unit was updating'
    assert rc == -signal.SIGKILL
    # The provider process notices the engine is gone and exits (docs/operator-guide.md: within ~6 s).
    deadline = time.time() + 30
    while time.time() < deadline and _providers_of(lab.project):
        time.sleep(1)
    assert not _providers_of(lab.project)
    res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
    if res.returncode != 0:
        assert 'locked' in res.stdout + res.stderr, (res.stdout + res.stderr)[-3000:]
        lab.pulumi('cancel', '--yes', stack=STACK)
        lab.pulumi('refresh', '--yes', '--clear-pending-creates', stack=STACK)
        lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    assert lab.outputs(STACK)['speculation']['resolved']['speculative_num_steps'] == 4
    lab.pulumi('up', '--yes', '--expect-no-changes', stack=STACK)


def _providers_of(project):
    """PIDs of provider processes serving this project: its gpuhost plugin (provider/__main__.py of the project, and
    the stubs the engine starts for it, provider/bin/gpuhost-stub or provider/stub.py), or a dynamic-provider host
    (their cwd is the project).
    Not the plugin's zygote (provider/stub.py): it serves nothing itself - no engine, no host, no connection - and
    ends a minute after its last fork."""
    plugin = os.path.join(project, 'provider', '__main__.py').encode()
    stubs = (os.path.join(project, 'provider', 'stub.py').encode(),
             os.path.join(project, 'provider', 'bin', 'gpuhost-stub').encode())
    out = []
    for pid in os.listdir('/proc'):
        if not pid.isdigit():
            continue
        try:
            cmd = open('/proc/%s/cmdline' % pid, 'rb').read()
            cwd = os.readlink('/proc/%s/cwd' % pid)
            if open('/proc/%s/comm' % pid).read().strip() == 'gpuhost-zygote':
                continue
        except OSError:
            continue
        if plugin in cmd or any(s in cmd for s in stubs) or (cwd == project and (b'pulumi-resource-pulumi-python' in cmd or b'pulumi.dynamic' in cmd)):
            out.append(int(pid))
    return out


def test_a_preview_cut_short_by_head_leaves_no_provider_process(lab):
    """`make preview STACK=prod | head -120`: `head` exits, the CLI dies of SIGPIPE at its next write. A
    preview of resources still to create calls nothing but `check` in the dynamic-provider process; that
    process must notice the engine is gone and exit within seconds (it once waited 41 minutes)."""
    lab.write_stack('fresh', lab.stack_config())
    proc = subprocess.Popen(['pulumi', 'preview', '--diff', '--stack', 'fresh'], cwd=lab.project, env=lab.env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True)
    head, running = [], []
    try:
        for line in proc.stdout:
            head.append(line)
            # The first resource of the program's providers in the plan: its check has run.
            if b'gpuhost:index:' in line:
                # Frozen at once, so the CLI cannot finish the preview before the pipe closes.
                os.kill(proc.pid, signal.SIGSTOP)
                break
        running = _providers_of(lab.project)
        proc.stdout.close()
        os.kill(proc.pid, signal.SIGCONT)
        rc = proc.wait(timeout=120)
        assert running, 'no provider process seen when the preview showed:\n%s' % b''.join(head).decode()
        assert rc == -signal.SIGPIPE, 'the CLI was not cut short (exit %s)' % rc
        gone = time.time()
        deadline = gone + 15
        while time.time() < deadline and _providers_of(lab.project):
            time.sleep(0.5)
        # The watch polls every 2 s and gives up after two misses (docs/operator-guide.md: within ~6 s).
        left = _providers_of(lab.project)
        assert not left, 'provider process(es) %s still running %.0f s after the CLI died' % (left, time.time() - gone)
    finally:
        for pid in _providers_of(lab.project):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
