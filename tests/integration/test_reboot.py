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
