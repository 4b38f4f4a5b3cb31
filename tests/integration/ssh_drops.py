"""The SSH connection dropped at each of the first ten remote commands of an `up` that changes host
files (kernel command line, nvidia options) and the SGLang unit, in each way it can drop: the error
names the lost connection, the host and the step; no managed file is ever half-written (each holds
its old or its new content); a re-run converges. Also: a hung host tool is stopped at the step's time
limit and named.

The cases live in three modules, one per way of dropping (test_faults_ssh_before.py, _after.py,
_during.py), so that parallel test workers share them; this module holds what they have in common."""

import copy
import os

import pytest

STACK = 'sshdrop'
# 'before' and 'after' at each of the first ten commands of the up, whatever each is: reads of the host
# (host_facts.sh, ct_unit_owner.sh, read_file.sh), the VM GPUs' vfio-pci binding, the writes of the kernel
# command line and the nvidia options (put_file.sh, the content on stdin) - the engine runs independent
# resources side by side, so which command is the n-th may differ from run to run. 'during' only at the
# uploads, counted among them (the first and the second put_file.sh of the up): 'during' hands the command
# the first half of its stdin and then drops the connection once the command has read it. A read takes no
# stdin, so it would be dropped as it starts, its output going nowhere: to the host (a read changes
# nothing) and to the client (no output, no exit status) that is 'before' again, one more run for no new
# case.
UPLOAD = 'put_file.sh'
UPLOADS = (1, 2)
CASES = ([(n, mode) for n in range(1, 11) for mode in ('before', 'after')] +
         [(k, 'during') for k in UPLOADS])


def cases(mode):
    return [c for c in CASES if c[1] == mode]


def ids(cases_):
    return [('upload%d-%s' if mode == 'during' else '%d-%s') % (n, mode) for n, mode in cases_]


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
    """The managed files in the base state (A) and in the changed state (B)."""
    base = lab.stack_config()
    base['gpuhost:host']['ssh']['command_timeout'] = COMMAND_TIMEOUT
    lab.write_stack(STACK, changed(base))
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    new = managed_files(lab)
    lab.write_stack(STACK, base)
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    old = managed_files(lab)
    assert old != new
    return base, old, new


def the_other_state(lab, states):
    """(stack config, files now, files wanted) for an up from the state the lab is in to the other one:
    each case changes the same files, so it starts where the last one ended rather than spend an up
    going back (a case that failed half-way is put back to A first)."""
    base, old, new = states
    now = managed_files(lab)
    if now == new:
        return base, new, old
    if now != old:
        lab.write_stack(STACK, base)
        lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    return changed(base), old, new


def command(lab, n):
    return next(e for e in lab.ssh_log() if e['n'] == n)


def writes_stdin(step):
    return step['cmd'].split()[0] in ('put_file.sh', 'ct_put_file.sh')


def drop_at(lab, states, n, mode):
    cfg, before, after = the_other_state(lab, states)
    lab.write_stack(STACK, cfg)
    start = lab.ssh_commands()
    lab.drop_ssh_at(n, mode=mode, match=UPLOAD if mode == 'during' else None)
    res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
    out = res.stdout + res.stderr
    assert not lab.ssh_drop_pending(), 'the up ran fewer than %d %s: %s\n%s' % (
        n, 'uploads' if mode == 'during' else 'remote commands', [e['cmd'] for e in lab.ssh_log()[-12:]],
        out[-3000:])
    at = next(e['n'] for e in lab.ssh_log() if e['n'] > start and e.get('drop'))
    step = command(lab, at)
    if mode == 'during':
        assert writes_stdin(step) and step['cmd'].startswith(UPLOAD), step
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
    for name, text in managed_files(lab).items():
        assert text in (before[name], after[name]), '%s half-written after a drop %s %s' % (name, mode, step['cmd'])
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    assert managed_files(lab) == after
    lab.pulumi('preview', '--refresh', '--expect-no-changes', stack=STACK)


def hung_tool(lab, states):
    cfg, before, after = the_other_state(lab, states)
    lab.write_stack(STACK, cfg)
    lab.hang_tool('proxmox-boot-tool.refresh')
    try:
        res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False, timeout=300)
    finally:
        lab.clear_faults()
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert 'did not finish within %d s (gpuhost:host.ssh.command_timeout)' % COMMAND_TIMEOUT in out, out[-3000:]
    assert 'writing /etc/kernel/cmdline' in out
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    assert managed_files(lab) == after
