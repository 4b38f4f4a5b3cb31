"""make render: every file a stack would put on its hosts, from the stack file alone."""

import os

from tools import render

GOLDEN = os.path.join(os.path.dirname(__file__), 'golden')


def test_lab_render_writes_the_same_unit_the_program_deploys(tmp_path):
    render.main(['lab', str(tmp_path)])
    with open(tmp_path / 'container/etc/systemd/system/sglang-qwen.service') as f, \
            open(os.path.join(GOLDEN, 'sglang-qwen.service')) as g:
        assert f.read() == g.read()
    assert (tmp_path / 'host/etc/driverctl.d/pci-0000:81:00.0').read_text() == 'vfio-pci\n'
    assert 'lxc.cgroup2.cpuset.cpus: 0-31,64-95' in (tmp_path / 'host/etc/pve/lxc/200.conf.raw-lines').read_text()
    assert 'hostpci3: mapping=gpuhost-300-gpu3,pcie=1' in \
        (tmp_path / 'host/etc/pve/qemu-server/300.conf.api').read_text()
    assert 'gpuhost-300-gpu3\n\tmap node=pve-lab,path=0000:f1:00.0,id=10de:2bb5\n' in \
        (tmp_path / 'host/etc/pve/mapping/pci.cfg.api').read_text()


def test_prod_render_needs_no_secrets(tmp_path):
    render.main(['prod', str(tmp_path)])
    unit = (tmp_path / 'container/etc/systemd/system/sglang-qwen.service').read_text()
    assert '--mamba-radix-cache-strategy extra_buffer_lazy' in unit
    assert 'placeholder' not in ''.join(p.read_text() for p in tmp_path.rglob('*') if p.is_file())
