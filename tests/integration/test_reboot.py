"""The controlled reboot (host.reboot: when-required, off by default): after the changes that need
it, the program reboots the host, waits for SSH to answer with a new boot, re-reads the facts, and
ends with nothing pending."""

STACK = 'reboot'


def test_when_required_reboots_once_and_ends_with_nothing_pending(lab):
    cfg = lab.stack_config()
    cfg['gpuhost:host']['reboot'] = 'when-required'
    lab.write_stack(STACK, cfg)
    boot_id = open(lab.host.path('proc/boot_id')).read()
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    assert open(lab.host.path('proc/boot_id')).read() != boot_id
    out = lab.outputs(STACK)
    assert out['reboot_required'] is False and out['reboot_reasons'] == []
    assert 'iommu.passthrough=0' in out['iommu']['running_cmdline']
    assert out['gpu_assignment']['0000:81:00.0']['driver'] == 'vfio-pci'
    boot_id = open(lab.host.path('proc/boot_id')).read()
    lab.pulumi('up', '--yes', '--expect-no-changes', stack=STACK)
    assert open(lab.host.path('proc/boot_id')).read() == boot_id


def test_a_reboot_with_the_service_deployed_ends_with_sglang_serving(lab):
    """A later change that needs a reboot: the host goes down (SSH dropped, guests stopped), comes back,
    starts the onboot container, and the run ends only when SGLang answers /health again - on GPUs proven in
    the new boot (the GPU proof, on by default)."""
    import urllib.request
    cfg = lab.stack_config()
    cfg['gpuhost:host']['reboot'] = 'when-required'
    cfg['gpuhost:iommu'] = {'domain': 'DMA'}
    lab.write_stack(STACK, cfg)
    reboots, starts = len(lab.reboots()), lab.unit_starts()
    proven = lab.outputs(STACK)['gpu_proof']
    res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    assert len(lab.reboots()) == reboots + 1
    # SGLang started at boot (once), then the same run stopped it, proved the GPUs of the new boot and started it.
    assert 'the host rebooted since they were proven (%s)' % proven['at'] in res.stdout, res.stdout[-3000:]
    assert 'GPU proof passed: 4 GPUs ok' in res.stdout, res.stdout[-3000:]
    assert lab.unit_starts() == starts + 2
    assert lab.outputs(STACK)['gpu_proof']['boot_id'] == lab.boot_id() != proven['boot_id']
    with urllib.request.urlopen('http://%s:30000/health' % lab.spec['addresses']['container'], timeout=5) as r:
        assert r.status == 200
    out = lab.outputs(STACK)
    assert out['reboot_required'] is False and 'iommu.strict=1' in out['iommu']['running_cmdline']
    assert lab.node().qemu(300).status.current.get()['status'] == 'running'  # onboot
    # The rebooting run already waited for SGLang after the host came back: the next run, having read
    # the host and the container again, finds nothing to do and restarts nothing.
    res = lab.pulumi('up', '--yes', '--refresh', '--skip-preview', '--expect-no-changes', stack=STACK)
    assert lab.unit_starts() == starts + 2, res.stdout[-2000:]
    lab.pulumi('preview', '--refresh', '--expect-no-changes', stack=STACK)
