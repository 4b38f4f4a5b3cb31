"""A different deployment on the same kind of host: no VM, no speculative decoding, strict IOMMU
flushing (DMA) and DmaRemapPeerMmio=0. The program adapts (no vfio binding, no hostpci, no MTP
flags) and reports what needs a reboot."""

STACK = 'variant'
VM_GPUS = ['0000:81:00.0', '0000:91:00.0', '0000:e1:00.0', '0000:f1:00.0']


def variant(lab):
    cfg = lab.stack_config()
    cfg.pop('gpuhost:vm')
    cfg['gpuhost:sglang']['speculative'] = None
    cfg['gpuhost:iommu'] = {'domain': 'DMA'}
    cfg['gpuhost:nvidia'] = {'dma_remap_peer_mmio': 0}
    return cfg


def test_no_vm_no_mtp_strict_iommu(lab):
    lab.write_stack(STACK, variant(lab))
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    out = lab.outputs(STACK)
    assert 'vm' not in out and lab.node().qemu.get() == []
    assert lab.host.overrides() == {} and [lab.host.driver(b) for b in VM_GPUS] == ['nvidia'] * 4
    # (null values are left out of the JSON outputs)
    assert out['speculation']['requested'].get('speculative_algorithm') is None
    assert out['speculation']['resolved'].get('speculative_algorithm') is None
    assert out['speculation']['resolved']['tp_size'] == 4
    unit = open(lab.ct_root() + '/etc/systemd/system/sglang-qwen.service').read()
    assert '--speculative' not in unit
    assert 'iommu.strict=1' in open(lab.host.path('etc/kernel/cmdline')).read()
    assert set(out['reboot_reasons']) >= {'kernel command line: running lacks iommu.passthrough=0 iommu.strict=1',
                                          'nvidia NVreg_DmaRemapPeerMmio: running 1, declared 0'}
    assert {a: g['assigned_to'] for a, g in out['gpu_assignment'].items() if a in VM_GPUS} == {
        b: 'host' for b in VM_GPUS}
    lab.host.reboot()
    lab.pulumi('refresh', '--yes', '--skip-preview', '--run-program', stack=STACK)
    out = lab.outputs(STACK)
    assert out['reboot_required'] is False, out['reboot_reasons']
    assert out['iommu']['running_domain_types'] == ['DMA']
    # The collector reports it live (its timer's next run, started here as systemd would); up has nothing to do.
    # (a fresh-clone CI run saw this start fail once, cause not kept: Lab.start_host_unit tells the lab's own cgroup v1
    # fault, started again, from the program's, shown with its journal)
    lab.start_host_unit('gpuhost-collector.service')
    prom = lab.on_host('cat /var/lib/prometheus/node-exporter/gpuhost-collector.prom').stdout
    assert 'gpuhost_reboot_required 0\n' in prom and 'gpuhost_iommu_declared_domain_info{domain="DMA"} 1\n' in prom
    assert 'gpuhost_nvidia_module_parameter{name="DmaRemapPeerMmio",side="running"} 0\n' in prom
    # SGLang started at boot on GPUs nobody proved since: the one thing `up` does is stop it, prove them, start it.
    starts = lab.unit_starts()
    res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    assert 'the host rebooted since they were proven' in res.stdout and 'GPU proof passed' in res.stdout, \
        res.stdout[-3000:]
    assert lab.unit_starts() == starts + 1
    lab.pulumi('up', '--yes', '--expect-no-changes', stack=STACK)


def test_cpu_pinning_change_rewrites_the_raw_line_and_reboots_the_container(lab):
    cfg = variant(lab)
    cfg['gpuhost:host']['numa_cpus']['0'] = '0-15,64-79'
    lab.write_stack(STACK, cfg)
    pid = lab.node().lxc(200).status.current.get()['pid']
    starts = lab.unit_starts()
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    conf = open(lab.host.path('etc/pve/lxc/200.conf')).read()
    assert 'lxc.cgroup2.cpuset.cpus: 0-15,64-79' in conf and '0-31,64-95' not in conf
    assert lab.node().lxc(200).status.current.get()['pid'] != pid, 'raw lxc lines need a container restart'
    lab.wait_for(lambda: lab.unit_starts() == starts + 1, what='SGLang to come back after the reboot')
    lab.pulumi('up', '--yes', '--expect-no-changes', stack=STACK)
