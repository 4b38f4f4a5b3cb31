"""The same stack on a GRUB host (legacy boot, LVM root): the arguments go into
GRUB_CMDLINE_LINUX_DEFAULT, update-grub installs them, the rest of /etc/default/grub is untouched."""

import shutil

import pytest

from tests.lablib import Lab, claim_net

STACK = 'grub'


@pytest.fixture(scope='module')
def grub_lab(tmp_path_factory):
    # A loopback net claimed like the shared `lab` fixture's: no other module or pytest process gets it.
    base = str(tmp_path_factory.mktemp('grublab'))
    net, lock = claim_net()
    try:
        lab = Lab(base, net, boot='grub', cmdline='root=/dev/mapper/pve-root ro quiet').up()
        yield lab
        lab.down()
    finally:
        lock.close()
        shutil.rmtree(base, ignore_errors=True)


def test_grub_host_gets_its_command_line_through_update_grub(grub_lab):
    lab = grub_lab
    before = open(lab.host.path('etc/default/grub')).read()
    lab.write_stack(STACK, lab.stack_config())
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    after = open(lab.host.path('etc/default/grub')).read()
    assert 'GRUB_CMDLINE_LINUX_DEFAULT="quiet iommu.passthrough=0 iommu.strict=0"' in after
    assert [l for l in after.splitlines() if 'CMDLINE_LINUX_DEFAULT' not in l] == \
        [l for l in before.splitlines() if 'CMDLINE_LINUX_DEFAULT' not in l]
    assert lab.host.installed_cmdline() == 'root=/dev/mapper/pve-root ro quiet iommu.passthrough=0 iommu.strict=0'
    out = lab.outputs(STACK)
    assert out['iommu']['boot'] == 'grub' and out['reboot_required'] is True
    lab.pulumi('up', '--yes', '--expect-no-changes', stack=STACK)
