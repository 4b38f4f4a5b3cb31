"""Faults leave no half-written state and a re-run converges: a boot-refresh step that fails after
the command line was written (the file is put back), a Proxmox API error while creating the
container, and a Blackwell GPU found in an identity IOMMU group (stop before any change)."""

import json
import os
import subprocess

STACK = 'faults'


def test_failed_boot_refresh_rolls_the_file_back_and_a_rerun_converges(lab):
    lab.write_stack(STACK, lab.stack_config())
    before = open(lab.host.path('etc/kernel/cmdline')).read()
    os.makedirs(lab.host.path('faults'), exist_ok=True)
    with open(lab.host.path('faults', 'proxmox-boot-tool.refresh'), 'w') as f:
        f.write('E: mount of /dev/disk/by-uuid/7A3B-1C2D failed')
    res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert 'boot-systemd failed after writing /etc/kernel/cmdline' in out and 'the old file is back' in out, out[-3000:]
    assert open(lab.host.path('etc/kernel/cmdline')).read() == before
    assert not [n for n in os.listdir(lab.host.path('etc/kernel')) if n.startswith('.gpuhost')]
    # The same run's other file, the nvidia options: absent, or written and baked into the initramfs.
    modprobe = lab.host.path('etc/modprobe.d/gpuhost-nvidia.conf')
    installed = lab.host.path('boot/initrd-modprobe.d/gpuhost-nvidia.conf')
    if os.path.exists(modprobe):
        assert open(modprobe).read() == open(installed).read()
    else:
        assert not os.path.exists(installed)
    assert not [n for n in os.listdir(lab.host.path('etc/modprobe.d')) if n.startswith('.gpuhost')]
    os.unlink(lab.host.path('faults', 'proxmox-boot-tool.refresh'))
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    assert 'iommu.strict=0' in lab.host.installed_cmdline()
    assert 'NVreg_DmaRemapPeerMmio=1' in open(installed).read()
    lab.pulumi('up', '--yes', '--expect-no-changes', stack=STACK)


def test_proxmox_error_on_update_fails_cleanly_and_a_rerun_converges(lab):
    cfg = lab.stack_config()
    cfg['gpuhost:container']['cores'] = 16
    lab.write_stack(STACK, cfg)
    os.makedirs(os.path.join(lab.dir, 'control'), exist_ok=True)
    with open(os.path.join(lab.dir, 'control', 'pve-fail.json'), 'w') as f:
        json.dump([{'method': 'PUT', 'suffix': '/nodes/pve-lab/lxc/200/config', 'status': 500,
                    'message': 'cfs-lock \'file-lxc_conf\' error: got lock request timeout', 'times': 1}], f)
    lab.wait_for(lambda: not os.path.exists(os.path.join(lab.dir, 'control', 'pve-fail.json')), what='fault armed')
    res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert 'updating container 200 on pve-lab: Proxmox answered 500' in out and 'got lock request timeout' in out
    assert lab.node().lxc(200).config.get()['cores'] == 32
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    assert lab.node().lxc(200).config.get()['cores'] == 16
    lab.pulumi('up', '--yes', '--expect-no-changes', stack=STACK)


def test_sglang_resolving_other_speculation_fails_the_update_with_both_values(lab):
    with open(os.path.join(lab.ct_root(), 'etc/lab-sglang-override.json'), 'w') as f:
        json.dump({'speculative_num_draft_tokens': 2}, f)
    cfg = lab.stack_config()
    cfg['gpuhost:container']['cores'] = 16
    cfg['gpuhost:sglang']['speculative'] = {'algorithm': 'NEXTN', 'num_steps': 2, 'eagle_topk': 1,
                                            'num_draft_tokens': 3}
    lab.write_stack(STACK, cfg)
    res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert 'speculative_num_draft_tokens: unit asked for 3, SGLang resolved 2' in out, out[-3000:]
    os.unlink(os.path.join(lab.ct_root(), 'etc/lab-sglang-override.json'))
    # The unit was written but never confirmed: the re-run restarts SGLang and converges.
    starts = lab.unit_starts()
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    assert lab.unit_starts() == starts + 1
    assert lab.outputs(STACK)['speculation']['resolved']['speculative_num_draft_tokens'] == 3
    lab.pulumi('up', '--yes', '--expect-no-changes', stack=STACK)


def test_blackwell_in_identity_group_stops_before_any_change(lab):
    cfg = lab.stack_config()
    cfg['gpuhost:nvidia'] = {'dma_remap_peer_mmio': 0}
    cfg['gpuhost:iommu'] = {'domain': 'DMA'}
    lab.write_stack(STACK, cfg)
    group = lab.host.group('0000:11:00.0')
    with open(os.path.join(lab.host.group_dir(group), 'type'), 'w') as f:
        f.write('identity\n')
    cmdline = open(lab.host.path('etc/kernel/cmdline')).read()
    res = lab.pulumi('up', '--yes', '--skip-preview', '--parallel', '1', stack=STACK, check=False)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert 'Blackwell GPUs in identity IOMMU domains: 0000:11:00.0' in out and '0x177' in out, out[-3000:]
    assert open(lab.host.path('etc/kernel/cmdline')).read() == cmdline
    # The power cycle the message asks for.
    with open(os.path.join(lab.host.group_dir(group), 'type'), 'w') as f:
        f.write('DMA-FQ\n')


def test_a_failing_restart_inside_the_container_is_named_and_the_rerun_restarts(lab):
    cfg = lab.stack_config()
    cfg['gpuhost:container']['cores'] = 16
    cfg['gpuhost:sglang']['speculative'] = {'algorithm': 'NEXTN', 'num_steps': 3, 'eagle_topk': 1,
                                            'num_draft_tokens': 4}
    lab.write_stack(STACK, cfg)
    lab.fail_systemctl('restart')
    try:
        res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
    finally:
        lab.clear_faults()
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert 'starting sglang-qwen.service in container 200 failed' in out, out[-3000:]
    starts = lab.unit_starts()
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    assert lab.unit_starts() == starts + 1
    assert lab.outputs(STACK)['speculation']['resolved']['speculative_num_steps'] == 3
    lab.pulumi('up', '--yes', '--expect-no-changes', stack=STACK)


def test_a_flag_change_sglang_rejects_is_rolled_back_to_the_unit_that_served(lab):
    """Issue 27, item 2: a restart for other flags only (a speculative setting SGLang refuses at start-up) that
    fails its check puts the last confirmed unit back, restarts and checks it, and fails the run saying both."""
    cfg = lab.stack_config()
    cfg['gpuhost:container']['cores'] = 16
    cfg['gpuhost:sglang']['speculative'] = {'algorithm': 'NEXTN', 'num_steps': 3, 'eagle_topk': 1,
                                            'num_draft_tokens': 4}
    lab.write_stack(STACK, cfg)
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    unit = os.path.join(lab.ct_root(), 'etc', 'systemd', 'system', 'sglang-qwen.service')
    before = open(unit).read()
    fail = os.path.join(lab.ct_root(), 'etc', 'lab-sglang-fail.json')
    with open(fail, 'w') as f:
        json.dump({'speculative_num_steps': 5, 'message': 'RuntimeError: lab: out of memory for the draft model'}, f)
    try:
        cfg['gpuhost:sglang']['speculative'] = {'algorithm': 'NEXTN', 'num_steps': 5, 'eagle_topk': 1,
                                                'num_draft_tokens': 6}
        lab.write_stack(STACK, cfg)
        res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
    finally:
        os.unlink(fail)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    # What failed and why leads the line; the changed settings (a whole command line) come last.
    line = next(l for l in out.splitlines() if 'sglang-qwen.service failed its check after its restart: ' in l)
    assert 'failed its check after its restart: sglang-qwen.service in container 200: sglang-qwen.service is not ' \
        'running' in line[:300], line[:300]
    assert line.index('Rolled back: container 200') < line.index('It had restarted with its new settings ('), line
    assert 'Rolled back: container 200 runs the previous unit again' in out and 'and it serves' in out, out[-3000:]
    assert open(unit).read() == before
    assert lab.outputs(STACK)['speculation']['resolved']['speculative_num_steps'] == 3
    import urllib.request
    with urllib.request.urlopen('http://%s:30000/server_info' % lab.spec['addresses']['container'], timeout=5) as r:
        assert json.load(r)['speculative_num_steps'] == 3


def test_a_slow_start_reports_progress_while_waiting(lab):
    """The real model loads for minutes: the wait for /health says where it is every ~15 s (a constant of
    resources/sglang.py). The lab's SGLang loads until the CLI has shown that line - at most 50 s, within
    health_timeout_s - so the test waits only as long as the program takes to say it."""
    line = 'waiting for http://%s:30000/health - loading, last answer HTTP 503' % lab.spec['addresses']['container']
    loaded = os.path.join(lab.ct_root(), 'etc', 'lab-sglang-loaded')
    cfg = lab.stack_config()
    cfg['gpuhost:sglang']['environment'] = {'LAB_SGLANG_STARTUP': '50',
                                            'LAB_SGLANG_LOADED_FILE': '/etc/lab-sglang-loaded'}
    lab.write_stack(STACK, cfg)
    proc = subprocess.Popen(['pulumi', 'up', '--yes', '--skip-preview', '--stack', STACK], cwd=lab.project,
                            env=lab.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, seen = [], False
    try:
        for text in proc.stdout:  # the CLI prints the provider's message as it arrives
            out.append(text)
            if line in text and not seen:
                seen = True
                open(loaded, 'w').close()
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        if os.path.exists(loaded):
            os.unlink(loaded)
    out = ''.join(out)
    assert rc == 0 and 'Traceback' not in out, out[-3000:]
    assert seen, 'no progress line while SGLang loaded:\n' + out[-3000:]
    lab.write_stack(STACK, lab.stack_config())
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
