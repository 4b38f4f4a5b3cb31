"""Adoption: a running deployment the stack does not hold - container 200 with what is on its disk, VM 300,
the SGLang unit, the host's files - is taken into the stack as it is (gpuhost:container.adopt, gpuhost:vm.adopt):
preview names each guest and every difference, `up` converges them without recreating anything and restarts
the unit once, the next `up` changes nothing. The tests share one lab and run in order."""

import copy
import json
import os

import pytest

STACK = 'adopt'
C, V = 'gpuhost:container', 'gpuhost:vm'
UNIT = 'sglang-qwen.service'
UNIT_PATH = '/etc/systemd/system/%s' % UNIT
DROPIN = '/etc/systemd/system/%s.d/handmade.conf' % UNIT
MODPROBE = '/etc/modprobe.d/gpuhost-nvidia.conf'


def with_changes(cfg, *changes):
    cfg = copy.deepcopy(cfg)
    for (section, key), value in changes:
        cfg[section][key] = value
    return cfg


def creation_marks(lab):
    """What only a new guest would change: a file on the container's disk (its weights, on a real host), the
    VM's SMBIOS UUID and creation stamp."""
    vm = lab.node().qemu(300).config.get()
    with open(os.path.join(lab.ct_root(), 'root', 'weights')) as f:
        return f.read(), vm.get('smbios1'), vm.get('meta')


@pytest.fixture(scope='module')
def made_by_hand(lab):
    """The reference deployment, running, unknown to the stack: made once (by a stack whose state is then
    dropped, `stack rm --force`: what it made stays), then changed by hand the way an operator's own deployment
    differs from the config - fewer cores and less memory, the VM not started at boot, a hand-written unit
    (no header of the program's) with a line of its own and a drop-in. The container's disk holds the weights."""
    cfg = lab.deploy('made')
    lab.pulumi('stack', 'rm', '--force', '--yes', stack='made')
    node = lab.node()
    node.lxc(200).config.put(cores=16, memory=131072)
    node.qemu(300).config.post(onboot=0)
    # The nvidia options as the operator wrote them (no header of the program's).
    with open(lab.host.path(MODPROBE.lstrip('/')), 'w') as f:
        f.write('options nvidia NVreg_DmaRemapPeerMmio=1\n')
    with open(os.path.join(lab.ct_root(), UNIT_PATH.lstrip('/'))) as f:
        unit = [line for line in f.read().splitlines() if not line.startswith('#')]
    unit.insert(unit.index('[Service]') + 1, 'Environment=HANDMADE=1')
    lab.ct_exec(['sh', '-c', 'cat > %s && mkdir -p %s && printf "[Service]\\nEnvironment=DROPIN=1\\n" > %s && '
                 'echo weights-244GB > /root/weights && systemctl daemon-reload && systemctl restart %s' % (
                     UNIT_PATH, os.path.dirname(DROPIN), DROPIN, UNIT)], stdin='\n'.join(unit) + '\n')
    lab.wait_for(lambda: lab.ct_exec(['systemctl', 'is-active', UNIT], check=False).stdout.strip() == 'active',
                 what='the hand-written unit active')
    lab.write_stack(STACK, cfg)
    return cfg


def guests(lab):
    return ({c['vmid']: c['status'] for c in lab.node().lxc.get()},
            {v['vmid']: v['status'] for v in lab.node().qemu.get()})


def unchanged(lab, cfg, *command):
    """Runs the command with cfg; it must fail, and nothing on the host or in Proxmox may have changed."""
    lab.write_stack(STACK, cfg)
    before, digest, marks = guests(lab), lab.host_digest(), creation_marks(lab)
    res = lab.pulumi(*command, stack=STACK, check=False)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out[-3000:]
    assert guests(lab) == before and lab.host_digest() == digest and creation_marks(lab) == marks
    return out


def test_up_without_adopt_stops_before_anything_and_says_how_to_adopt(lab, made_by_hand):
    out = unchanged(lab, made_by_hand, 'up', '--yes', '--skip-preview')
    assert '%s is a unit container 200 has of its own' % UNIT in out and 'gpuhost:container.adopt: true' in out, \
        out[-3000:]


@pytest.mark.parametrize('change,says', [
    (((C, 'unprivileged'), False), 'it is unprivileged, the config declares privileged '
                                   '(gpuhost:container.unprivileged: true)'),
    (((C, 'rootfs_gb'), 100), 'its root disk is 200 GB, the config declares 100 GB (gpuhost:container.rootfs_gb: 200)'),
    (((C, 'vmid'), 201), 'there is no container 201 on pve-lab to adopt'),
], ids=['unprivileged', 'rootfs', 'vmid typo'])
def test_what_adopting_would_replace_or_miss_is_refused_at_preview(lab, made_by_hand, change, says):
    cfg = with_changes(made_by_hand, ((C, 'adopt'), True), ((V, 'adopt'), True), change)
    out = unchanged(lab, cfg, 'preview')
    assert says in out, out[-3000:]


@pytest.fixture(scope='module')
def adopting(lab, made_by_hand):
    cfg = with_changes(made_by_hand, ((C, 'adopt'), True), ((V, 'adopt'), True))
    lab.write_stack(STACK, cfg)
    return cfg


def test_preview_names_each_adopted_guest_and_every_difference(lab, adopting):
    digest, marks, starts = lab.host_digest(), creation_marks(lab), lab.unit_starts()
    res = lab.pulumi('preview', '--diff', stack=STACK)
    out = res.stdout + res.stderr   # with --diff the CLI writes the diagnostics to stderr
    assert ('container 200 on pve-lab: exists - adopted into the stack as it is, not created '
            '(gpuhost:container.adopt). `up` changes: cores 16 -> 32; memory 131072 -> 262144.') in out, out[-6000:]
    assert ('VM 300 on pve-lab: exists - adopted into the stack as it is, not created (gpuhost:vm.adopt). '
            '`up` changes: onboot 0 -> 1.') in out, out[-6000:]
    assert ('%s in container 200 exists - adopted; `up` rewrites the unit file and removes the drop-in %s (copies '
            'kept in the container), then restarts it once' % (UNIT, DROPIN)) in out, out[-6000:]
    assert '\n    -Environment=HANDMADE=1' in out and '\n    +# Managed by gpuhost' in out, out[-6000:]
    # The host's files: each compared with what is declared.
    assert ('host file %s: exists and differs - `up` replaces it, then runs update-initramfs -u -k all. The lines '
            'that change:\n    +# Managed by gpuhost' % MODPROBE) in out, out[-6000:]
    assert 'host-kernel-cmdline: the configured kernel command line already carries what is declared' in out
    assert "host-vfio: the VM's GPUs are bound to vfio-pci already: adopted as they are" in out
    assert lab.host_digest() == digest and creation_marks(lab) == marks and lab.unit_starts() == starts


def test_up_converges_without_recreating_anything_and_restarts_the_unit_once(lab, adopting):
    marks, starts, requests = creation_marks(lab), lab.unit_starts(), len(lab.pve_requests())
    res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    out = res.stdout + res.stderr
    made = [r for r in lab.pve_requests()[requests:] if r['method'] == 'POST' and
            r['path'].split('?')[0].rstrip('/').endswith(('/lxc', '/qemu'))]
    assert made == [] and creation_marks(lab) == marks, made
    assert 'container 200 on pve-lab: adopted into the stack; changed cores 16 -> 32; memory 131072 -> 262144' in out, \
        out[-4000:]
    node = lab.node()
    ct, vm = node.lxc(200).config.get(), node.qemu(300).config.get()
    assert (int(ct['cores']), int(ct['memory']), int(vm['onboot'])) == (32, 262144, 1), (ct, vm)
    with open(os.path.join(lab.ct_root(), UNIT_PATH.lstrip('/'))) as f:
        unit = f.read()
    assert unit.startswith('# Managed by gpuhost') and 'HANDMADE' not in unit
    assert not os.path.exists(os.path.join(lab.ct_root(), DROPIN.lstrip('/')))
    with open(lab.host.path(MODPROBE.lstrip('/'))) as f:
        assert f.read().startswith('# Managed by gpuhost')
    assert lab.unit_starts() == starts + 1
    assert lab.outputs(STACK)['smoke_test']['completion_tokens'] >= 1
    # Protected from the moment they are in the stack: a destroy or a replacement is refused.
    state = json.loads(lab.pulumi('stack', 'export', stack=STACK).stdout)
    kept = {r['urn'].split('::')[-1]: r.get('protect', False) for r in state['deployment']['resources']
            if r['urn'].endswith(('-lxc', '-qemu', '-unit'))}
    assert kept == {'container-lxc': True, 'vm-qemu': True, 'sglang-unit': True}, kept


def test_the_next_up_changes_nothing_and_adopts_nothing_again(lab, adopting):
    digest, marks, starts = lab.host_digest(), creation_marks(lab), lab.unit_starts()
    res = lab.pulumi('up', '--yes', '--expect-no-changes', stack=STACK)
    assert 'adopted' not in res.stdout + res.stderr, res.stdout[-3000:]
    assert lab.host_digest() == digest and creation_marks(lab) == marks and lab.unit_starts() == starts
