"""make render: every file a stack would put on its hosts, from the stack file alone."""

import os

from tools import render

GOLDEN = os.path.join(os.path.dirname(__file__), 'golden')


LOCK = ('pip==23.2.1 --hash=sha256:%s\nsglang==0.5.23 --hash=sha256:%s\n' % ('1' * 64, '2' * 64))


def test_lab_render_writes_the_same_unit_the_program_deploys(tmp_path):
    # The lab stack's lock is written at lab start: a project with the stack file and a lock of its own.
    import shutil
    project, out = tmp_path / 'project', tmp_path / 'out'
    (project / '.lab' / 'runtime').mkdir(parents=True)
    shutil.copyfile(os.path.join(render.ROOT, 'Pulumi.lab.yaml'), project / 'Pulumi.lab.yaml')
    (project / '.lab' / 'runtime' / 'sglang.lock').write_text(LOCK)
    render.main(['lab', str(out)], project=str(project))
    d = render.load('lab', str(project))
    import config
    from resources.runtime import environment
    from resources.sglang import unit_text
    env = environment(d, config.runtime_inputs(d, str(project), read_secrets=False))
    unit = (out / 'container/etc/systemd/system/sglang-qwen.service').read_text()
    assert unit == unit_text(d, env)
    # The unit runs from the environment's own directory: the golden unit with that path for the venv's.
    with open(os.path.join(GOLDEN, 'sglang-qwen.service')) as g:
        assert unit == g.read().replace('/opt/sglang/venv', env['path'])
    assert env['path'].startswith('/opt/sglang/envs/') and len(env['id']) == 16
    tmp_path = out
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
