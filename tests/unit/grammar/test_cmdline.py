"""The kernel command line read the way the kernel reads it (grammar/cmdline.py), and the edits
made to a host's configured line (systemd-boot's one line, GRUB's two variables)."""

import pytest

from transport import remote
from grammar import cmdline
from resources.host import HostStateError, grub_with, plan_cmdline

ENSURE = ['iommu.passthrough=0', 'iommu.strict=0']
POLICY = {'blackwell': True, 'snp': True, 'vfio': True}


@pytest.mark.parametrize('line,words', [
    ('root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet', ['root=ZFS=rpool/ROOT/pve-1', 'boot=zfs', 'quiet']),
    ('  quiet\tiommu=pt  ', ['quiet', 'iommu=pt']),
    ('dyndbg="file a.c +p" quiet', ['dyndbg="file a.c +p"', 'quiet']),
    ('"quiet iommu=pt"', ['"quiet iommu=pt"']),
    ('a -- init args', ['a', '--', 'init', 'args']),
])
def test_split_follows_next_arg(line, words):
    assert cmdline.split(line) == words


@pytest.mark.parametrize('word', [
    'iommu=pt', 'iommu=pt,nofoo', 'iommu=force,pt', 'iommu.passthrough=1', 'iommu.passthrough=y',
    'iommu.passthrough=Y', 'iommu.passthrough=yes', 'iommu.passthrough=true', 'iommu.passthrough=T',
    'iommu.passthrough=on', 'iommu.passthrough=ON', 'iommu.passthrough="1"', 'iommu-passthrough=1'.replace('-', '.'),
])
def test_every_spelling_of_passthrough_is_identity(word):
    assert cmdline.iommu_mode(['quiet', word]) == 'identity'
    assert cmdline.dangers([word], POLICY) and 'identity' in cmdline.dangers([word], POLICY)[0][1]


@pytest.mark.parametrize('words,mode', [
    ([], 'DMA-FQ'),
    (['iommu.passthrough=0', 'iommu.strict=0'], 'DMA-FQ'),
    (['iommu.strict=1'], 'DMA'),
    (['iommu.strict=on'], 'DMA'),
    (['iommu=pt', 'iommu.passthrough=0'], 'DMA-FQ'),        # the last setting wins
    (['iommu.passthrough=0', 'iommu=pt'], 'identity'),
    (['iommu=nopt'], 'DMA-FQ'),
    (['iommu.passthrough=maybe'], 'DMA-FQ'),                # kstrtobool rejects it: default stays
    (['amd_iommu=off'], 'off'),
    (['iommu=off'], 'off'),
    (['--', 'iommu=pt'], 'DMA-FQ'),                         # after "--" it is init's, not the kernel's
])
def test_iommu_mode(words, mode):
    assert cmdline.iommu_mode(words) == mode


@pytest.mark.parametrize('arg,why', [
    ('iommu.passthrough=true', 'identity'),
    ('iommu=pt', 'identity'),
    ('quiet iommu=pt', 'identity'),
    ('vfio-pci.ids=10de:2bb5', 'vendor:device ID'),
    ('vfio_pci.ids=10de:2bb5', 'vendor:device ID'),
    ('pci-stub.ids=10de:2bb5', 'vendor:device ID'),
    ('nvidia.NVreg_DmaRemapPeerMmio=0', 'gpuhost:nvidia.dma_remap_peer_mmio'),
    ('nvidia-NVreg_DmaRemapPeerMmio=0'.replace('nvidia-', 'nvidia.'), 'gpuhost:nvidia'),
    ('iommu.strict=1', 'gpuhost:iommu.domain'),
    ('iommu_strict=1'.replace('iommu_', 'iommu.'), 'gpuhost:iommu.domain'),
    ('iommu=nopt', 'gpuhost:iommu.domain'),
    ('amd_iommu=off', 'AMD IOMMU off'),
    ('intel_iommu=off', 'Intel IOMMU off'),
    ('intel_iommu=on,off', 'Intel IOMMU off'),
    ('amd_iommu=pt', "no option 'pt'"),
    ('amd_iommu=force_isolation,passthrough', "no option 'passthrough'"),
    ('amd_iommu=fullflush', 'iommu.strict=1'),
    ('intel_iommu=on,strict', 'iommu.strict=1'),
    ('amd_iommu=pgtbl_v2', 'SEV-SNP'),
    ('amd_iommu=fullflush,pgtbl_v2', 'SEV-SNP'),
    ('modprobe.blacklist=nouveau,nvidia', 'blacklists'),
    ('module_blacklist=vfio-pci', 'blacklists'),
    ('kvm_amd.sev=0', 'SEV'),
    ('kvm-amd.sev_snp=off', 'SEV'),
    ('root=/dev/sda1', 'boot setup'),
    ('init=/bin/sh', 'boot setup'),
    ('--', 'boot setup'),
    ('quiet splash', '2 parameters'),
    ('a="b c"', 'parameter'),
    ('x=$(reboot)', 'plain name'),
    ('x=`id`', 'plain name'),
    ('pcie_aspm=off\nGRUB_TIMEOUT=0', 'control character'),
    ('', 'empty'),
    ('   ', 'blank'),
])
def test_operator_arguments_are_checked_with_kernel_semantics(arg, why):
    got = cmdline.check_extra(arg, ENSURE, POLICY)
    assert got and why in got, got


@pytest.mark.parametrize('arg', ['pcie_aspm=off', 'amd_iommu=force_isolation', 'amd_iommu=on', 'intel_iommu=on,sm_on',
                                 'nomodeset', 'console=ttyS0,115200',
                                 'hugepagesz=1G', 'default_hugepagesz=1G'])
def test_harmless_arguments_pass(arg):
    assert cmdline.check_extra(arg, ENSURE, POLICY) is None


def test_edit_keeps_the_rest_replaces_values_and_drops_dangerous_spellings():
    line = ['root=ZFS=rpool', 'boot=zfs', 'quiet', 'iommu.passthrough=true', 'iommu-strict=1'.replace('-', '.'),
            'vfio-pci.ids=10de:2bb5', 'console=tty0']
    got = cmdline.edit(line, ENSURE + ['console=ttyS0'], POLICY)
    assert got == ['root=ZFS=rpool', 'boot=zfs', 'quiet', 'console=tty0', 'iommu.passthrough=0', 'iommu.strict=0',
                   'console=ttyS0']
    # Already right (also when spelled differently): nothing to change.
    same = ['quiet', 'iommu.passthrough=off', 'iommu.strict=n']
    assert cmdline.edit(same, ENSURE, POLICY) == same
    assert cmdline.has(same, 'iommu.passthrough=0') and cmdline.has(same, 'iommu.strict=0')
    # A later conflicting value is what the kernel uses.
    assert not cmdline.has(['iommu.strict=0', 'iommu.strict=1'], 'iommu.strict=0')


def grub_facts(linux, default, configured=None):
    return remote.HostFacts(boot='grub', grub_linux=linux, grub_default=default,
                            configured=configured if configured is not None else (linux + ' ' + default).strip())


def test_grub_edits_both_variables():
    plan = plan_cmdline(grub_facts('iommu=pt', 'quiet'), ENSURE, POLICY)
    assert plan == {'GRUB_CMDLINE_LINUX': '', 'GRUB_CMDLINE_LINUX_DEFAULT': 'quiet iommu.passthrough=0 iommu.strict=0'}
    # Right already (the program's arguments may sit in either variable): nothing to do.
    assert plan_cmdline(grub_facts('iommu.passthrough=0', 'quiet iommu.strict=0'), ENSURE, POLICY) == {}


def test_intel_iommu_off_is_an_iommu_that_is_off():
    assert cmdline.iommu_mode(['quiet', 'intel_iommu=off']) == 'off'


def test_a_line_beyond_the_kernel_limit_stops_before_any_edit():
    long = ' '.join('pad%d=%s' % (i, 'x' * 100) for i in range(20))
    with pytest.raises(HostStateError, match='keeps only 2047'):
        plan_cmdline(grub_facts('', 'quiet ' + long), ENSURE, POLICY)


def test_grub_danger_from_grub_d_stops_before_any_edit():
    with pytest.raises(HostStateError, match='grub.d'):
        plan_cmdline(grub_facts('', 'quiet', configured='quiet iommu.passthrough=1'), ENSURE, POLICY)


def test_grub_file_rewrite_replaces_the_last_assignment_and_quotes_for_the_shell():
    text = ('GRUB_DEFAULT=0\nGRUB_CMDLINE_LINUX_DEFAULT="quiet"\n# comment\nexport GRUB_CMDLINE_LINUX_DEFAULT="x"\n'
            'GRUB_CMDLINE_LINUX=""\n')
    out = grub_with(text, {'GRUB_CMDLINE_LINUX_DEFAULT': 'quiet a="b c" $x `y` \\z'})
    lines = out.splitlines()
    assert lines[1] == 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"'
    assert lines[3] == r'GRUB_CMDLINE_LINUX_DEFAULT="quiet a=\"b c\" \$x \`y\` \\z"'
    import subprocess
    got = subprocess.run(['bash', '-c', out + '\nprintf %s "$GRUB_CMDLINE_LINUX_DEFAULT"'], capture_output=True,
                         text=True).stdout
    assert got == 'quiet a="b c" $x `y` \\z'
    assert grub_with('GRUB_DEFAULT=0\n', {'GRUB_CMDLINE_LINUX': 'a'}).endswith('GRUB_CMDLINE_LINUX="a"\n')


def test_modprobe_lines_that_undo_the_gpu_settings_are_named():
    from resources.host import modprobe_conflicts
    facts = remote.HostFacts()
    facts.modprobe = [('/etc/modprobe.d/vfio.conf', '3:options vfio-pci ids=10de:2bb5 disable_vga=1'),
                      ('/etc/modprobe.d/a.conf', '1:options vfio_pci disable_idle_d3=1'),
                      ('/etc/modprobe.d/b.conf', '2:blacklist nvidia'),
                      ('/etc/modprobe.d/b.conf', '3:blacklist nvidia_drm'),
                      ('/lib/modprobe.d/c.conf', '1:install nvidia-uvm /bin/false'),
                      ('/etc/modprobe.d/d.conf', '1:options nvidia NVreg_DmaRemapPeerMmio=0'),
                      ('/etc/modprobe.d/d.conf', '2:options nvidia NVreg_DmaRemapPeerMmio=1 NVreg_X=2')]
    got = modprobe_conflicts(facts, 1)
    assert [g.split(' - ')[0] for g in got] == [
        '/etc/modprobe.d/vfio.conf:3: options vfio-pci ids=10de:2bb5 disable_vga=1',
        '/etc/modprobe.d/b.conf:2: blacklist nvidia',
        '/lib/modprobe.d/c.conf:1: install nvidia-uvm /bin/false',
        '/etc/modprobe.d/d.conf:1: options nvidia NVreg_DmaRemapPeerMmio=0']


def test_host_facts_carry_modprobe_lines():
    facts = remote.parse_facts('boot\tgrub\nmodprobe\t/etc/modprobe.d/x.conf\t2:blacklist nvidia\n')
    assert facts.modprobe == [('/etc/modprobe.d/x.conf', '2:blacklist nvidia')]
