"""The SSH connection dropped at the remote commands of an `up` that changes host files (kernel command
line, nvidia options) and the SGLang unit, in each way it can drop: the error names the lost connection,
the host and the step; no managed file is ever half-written (each holds its old or its new content); a
re-run converges. Also: a hung host tool is stopped at the step's time limit and named.

The cases live in three modules, one per way of dropping (test_faults_ssh_before.py, _after.py,
_during.py), so that parallel test workers share them; this module holds what they have in common."""

import copy
import os

import pytest

STACK = 'sshdrop'
# 'before' at each of the first ten commands of the up, whatever each is: reads of the host (host_facts.sh,
# check_dir.sh, ct_unit_owner.sh, read_file.sh) and the writes of the kernel command line and the nvidia
# options (put_file.sh, the content on stdin) - the engine runs independent resources side by side, so which
# command is the n-th may differ from run to run.
# 'after' (the command ran to completion, its exit status lost) only at the writes, counted among them: the
# nvidia options and the kernel command line, the collector's config, the unit file and the unit's restart
# (an up runs them in about that order). A read that completed changed nothing on the host, and the client
# sees the same thing as at a write (output, then no exit status): 'after' at a read is a write's case again
# for the program and 'before' again for the host, one more run for no new case.
# 'during' only at the uploads, counted among them (the first and the second put_file.sh of the up):
# 'during' hands the command the first half of its stdin and then drops the connection once the command has
# read it. A read takes no stdin, so it would be dropped as it starts, its output going nowhere: 'before'
# again.
UPLOAD = 'put_file.sh'
WRITES = 'put_file.sh|ct_put_file.sh|ct_unit.sh'
UPLOADS = (1, 2)
CASES = ([(n, 'before') for n in range(1, 11)] + [(k, 'after') for k in range(1, 6)] +
         [(k, 'during') for k in UPLOADS])
MATCH = {'before': None, 'after': WRITES, 'during': UPLOAD}


def cases(mode):
    return [c for c in CASES if c[1] == mode]


def ids(cases_):
    name = {'before': '%d-before', 'after': 'write%d-after', 'during': 'upload%d-during'}
    return [name[mode] % n for n, mode in cases_]


# A short gpuhost:host.ssh.command_timeout (the config allows 5 s): the hung tool is stopped sooner. Not 5: on
# a loaded CI machine (4 test workers, 2 cores) running the collector once took longer than that and failed the
# up every case here starts from.
COMMAND_TIMEOUT = 20


def changed(cfg):
    cfg = copy.deepcopy(cfg)
    cfg['gpuhost:iommu'] = {'domain': 'DMA'}
    cfg['gpuhost:nvidia'] = {'dma_remap_peer_mmio': 0}
    cfg['gpuhost:sglang']['speculative'] = {'algorithm': 'NEXTN', 'num_steps': 2, 'eagle_topk': 1,
                                            'num_draft_tokens': 3}
    return cfg


def managed_files(lab):
    unit = os.path.join(lab.ct_root(), 'etc', 'systemd', 'system', 'sglang-qwen.service')
    paths = {'cmdline': lab.host.path('etc/kernel/cmdline'),
             'modprobe': lab.host.path('etc/modprobe.d/gpuhost-nvidia.conf'), 'unit': unit,
             'lxc conf': lab.host.path('etc/pve/lxc/200.conf')}
    out = {}
    for name, path in paths.items():
        with open(path) as f:
            out[name] = f.read()
    return out


@pytest.fixture(scope='module')
def states(lab):
    """The configs and managed files of the base state (A) and the changed state (B): A deployed here, B's
    files recorded by the first up that reaches B (each case changes the same files, from wherever the last
    case left the lab, so no up is spent going back)."""
    base = lab.stack_config()
    base['gpuhost:host']['ssh']['command_timeout'] = COMMAND_TIMEOUT
    lab.write_stack(STACK, base)
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    return {'cfg': {'A': base, 'B': changed(base)}, 'files': {'A': managed_files(lab), 'B': None}}


def the_other_state(lab, states):
    """(state to go to, files now) for an up from the state the lab is in to the other one (a case that failed
    half-way is put back to A first)."""
    now, files = managed_files(lab), states['files']
    if now == files['A']:
        return 'B', now
    if files['B'] is not None and now == files['B']:
        return 'A', now
    lab.write_stack(STACK, states['cfg']['A'])
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    assert managed_files(lab) == files['A'], 'the re-run of the base config did not give back its files'
    return 'B', files['A']


# What each state's files say (B's files are recorded from a re-run after a drop, so they are checked).
SIGNS = {'A': {'modprobe': 'NVreg_DmaRemapPeerMmio=1', 'unit': '--speculative-num-steps 1 '},
         'B': {'modprobe': 'NVreg_DmaRemapPeerMmio=0', 'unit': '--speculative-num-steps 2 '}}


def reached(lab, states, target):
    """The managed files after an up that should have reached target: B's recorded the first time."""
    files = managed_files(lab)
    for name, sign in SIGNS[target].items():
        assert sign in files[name], '%s of state %s lacks %r:\n%s' % (name, target, sign, files[name])
    if states['files'][target] is None:
        assert files != states['files']['A'], 'the changed config changed none of the managed files'
        states['files'][target] = files
    if files != states['files'][target]:
        # Which file, and how (a fresh-clone CI run failed here once with no more than the message).
        import difflib
        diff = ''.join(''.join(difflib.unified_diff(states['files'][target][name].splitlines(True),
                                                    files[name].splitlines(True), 'first run to %s: %s' % (target, name),
                                                    'this run: %s' % name))
                       for name in sorted(files) if files[name] != states['files'][target][name])
        raise AssertionError('a re-run to %s gave other files than the first one:\n%s' % (target, diff))
    return files


def command(lab, n):
    return next(e for e in lab.ssh_log() if e['n'] == n)


def writes_stdin(step):
    return step['cmd'].split()[0] in ('put_file.sh', 'ct_put_file.sh')


def drop_at(lab, states, n, mode):
    target, before = the_other_state(lab, states)
    lab.write_stack(STACK, states['cfg'][target])
    start = lab.ssh_commands()
    lab.drop_ssh_at(n, mode=mode, match=MATCH[mode])
    res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
    out = res.stdout + res.stderr
    assert not lab.ssh_drop_pending(), 'the up ran fewer than %d %s: %s\n%s' % (
        n, {'before': 'remote commands', 'after': 'writes', 'during': 'uploads'}[mode],
        [e['cmd'] for e in lab.ssh_log()[-12:]], out[-3000:])
    at = next(e['n'] for e in lab.ssh_log() if e['n'] > start and e.get('drop'))
    step = command(lab, at)
    if mode == 'during':
        assert writes_stdin(step) and step['cmd'].startswith(UPLOAD), step
    if mode == 'after':
        assert step['cmd'].split()[0] in WRITES.split('|'), step
    if mode in ('during', 'after'):
        # The lab logs the dropped command's own end (its exit code on the host) when it comes.
        lab.wait_for(lambda: 'exit' in command(lab, at), timeout=30, what='the end of command %d' % at)
        step = command(lab, at)
    if mode == 'during':
        assert 0 < step['stdin_sent'] < step['stdin_total'], 'not an upload cut short: %s' % step
    if mode == 'after':
        assert step['exit'] == 0, 'the command failed on the host by itself: %s' % step
    assert res.returncode != 0, 'drop %s command %d (%s) went unnoticed:\n%s' % (mode, n, step['cmd'], out[-3000:])
    assert 'connection to root@%s:%d lost during' % (lab.info['ssh']['host'], lab.info['ssh']['port']) in out, \
        (mode, step, out[-3000:])
    assert 'Safe to re-run' in out
    dropped = managed_files(lab)
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    after = reached(lab, states, target)
    for name, text in dropped.items():
        assert text in (before[name], after[name]), '%s half-written after a drop %s %s' % (name, mode, step['cmd'])
    lab.pulumi('preview', '--refresh', '--expect-no-changes', stack=STACK)


def hung_tool(lab, states):
    target, _ = the_other_state(lab, states)
    lab.write_stack(STACK, states['cfg'][target])
    lab.hang_tool('proxmox-boot-tool.refresh')
    try:
        res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False, timeout=300)
    finally:
        lab.clear_faults()
    out = res.stdout + res.stderr
    # The errors, not the outputs that fill the end of stdout.
    said = res.stdout[res.stdout.find('Diagnostics:'):res.stdout.find('Outputs:')][:6000] + res.stderr[-2000:]
    assert res.returncode != 0
    assert 'did not finish within %d s (gpuhost:host.ssh.command_timeout)' % COMMAND_TIMEOUT in out, said
    assert 'writing /etc/kernel/cmdline' in out, said
    # Stopped on the host before the run reported it (hostscripts/guard.sh): the hung tool and its put_file.sh are
    # gone, the script's own rollback ran, and a re-run right after converges - no wait for the failed run's leftovers.
    assert 'it was stopped on the host (its process group ended' in out, said
    assert 'the old file is back in place' in out, said
    left = lab.on_host('pgrep -af "put_file[.]sh|proxmox-boot-too[l]" || true').stdout.strip()
    assert left == '', left
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    reached(lab, states, target)
