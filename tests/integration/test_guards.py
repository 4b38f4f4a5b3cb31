"""Guards around a deployed stack: a typo never destroys or replaces a guest, a mount point the container has of
its own is never replaced by the model's, and `up` checks the host and Proxmox before any step (preflight). The
tests share one deployed lab stack, in order."""

import copy
import os

import pytest

STACK = 'guards'
H, C, V, S, M = 'gpuhost:host', 'gpuhost:container', 'gpuhost:vm', 'gpuhost:sglang', 'gpuhost:model'


def with_changes(cfg, *changes):
    cfg = copy.deepcopy(cfg)
    for path, value in changes:
        node = cfg
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return cfg


@pytest.fixture(scope='module')
def deployed(lab):
    return lab.deploy(STACK)


def guests(lab):
    return ({c['vmid']: c['status'] for c in lab.node().lxc.get()},
            {v['vmid']: v['status'] for v in lab.node().qemu.get()})


def refused(lab, cfg, command=('preview',)):
    lab.write_stack(STACK, cfg)
    before, digest = guests(lab), lab.host_digest()
    res = lab.pulumi(*command, stack=STACK, check=False)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out[-3000:]
    assert 'Traceback' not in out and 'File "' not in out, out[-3000:]
    assert guests(lab) == before and lab.host_digest() == digest
    return out


@pytest.mark.parametrize('changes,key', [
    ([((C, 'unprivileged'), False)], 'gpuhost:container.unprivileged'),
    ([((C, 'ostemplate'), 'local:vztmpl/debian-13-standard_13.1-1_amd64.tar.zst')], 'gpuhost:container.ostemplate'),
    ([((C, 'rootfs_gb'), 100)], 'gpuhost:container.storage/rootfs_gb'),
    ([((H, 'node'), 'pve-other')], 'gpuhost:host.node'),
    ([((C, 'vmid'), 201)], 'gpuhost:container.vmid'),
    ([((V, 'vmid'), 301)], 'gpuhost:vm.vmid'),
], ids=['unprivileged', 'ostemplate', 'rootfs', 'node', 'container vmid', 'vm vmid'])
def test_a_change_that_replaces_a_guest_is_refused_at_preview(lab, deployed, changes, key):
    out = refused(lab, with_changes(deployed, *changes))
    assert key in out and 'would destroy' in out and '.protect: false' in out, out[-3000:]


def test_dropping_the_vm_section_is_refused(lab, deployed):
    cfg = copy.deepcopy(deployed)
    cfg.pop(V)
    out = refused(lab, cfg)
    assert 'protect' in out and 'vm-qemu' in out, out[-3000:]


def test_a_namespace_typo_is_refused_and_the_vm_stays(lab, deployed):
    cfg = copy.deepcopy(deployed)
    cfg['gpuhots:vm'] = cfg.pop(V)
    out = refused(lab, cfg, ('up', '--yes', '--skip-preview'))
    assert 'did you mean gpuhost:vm' in out


def ct_config(lab):
    """Container 200's config as its next start has it (pending values applied)."""
    from resources.pve import merge_pending
    return merge_pending(lab.node().lxc(200).pending.get())[0]


def test_a_model_mount_point_the_container_has_of_its_own_is_never_replaced(lab, deployed):
    """gpuhost:model.mp: 1 while container 200 has its own mp1 (another dataset, set outside the program): the
    preview with a refresh and `up` stop, naming both mount points, and mp1 stays as it is."""
    theirs, model = '/srv/data,mp=/data,ro=1', deployed[M].get('storage', '') + ',mp=/models,ro=1'
    lab.node().lxc(200).config.put(mp1=theirs)
    # (The host's /etc/pve/lxc/200.conf follows the API a moment later: the digest below is taken after it.)
    conf = lab.host.path('etc/pve/lxc/200.conf')
    lab.wait_for(lambda: 'mp1: ' in open(conf).read(), what='mp1 in %s' % conf)
    try:
        # With a change of the host's own in the same run (the nvidia option file, written by the host's steps,
        # which come before the container's): `up` without a refresh - the state knows no mp1 - is refused by the
        # preflight, before any step, and the host is left as it was.
        cfg = with_changes(deployed, ((M, 'mp'), 1))
        cfg['gpuhost:nvidia'] = {'dma_remap_peer_mmio': 0}
        lab.write_stack(STACK, cfg)
        before, starts, digest, files = guests(lab), lab.unit_starts(), lab.host_digest(), lab.host_files()
        for command in (('preview', '--refresh'), ('up', '--yes', '--skip-preview')):
            res = lab.pulumi(*command, stack=STACK, check=False)
            out = res.stdout + res.stderr
            assert res.returncode != 0 and 'Traceback' not in out, out[-3000:]
            assert ("container 200 on pve-lab: gpuhost:model.mp: 1 would replace the container's own mp1 (%s), a "
                    "mount point this program did not set, with the model's (%s)" % (theirs, model)) in out, out[-3000:]
            have = ct_config(lab)
            assert (have['mp1'], have['mp0']) == (theirs, model)
            assert guests(lab) == before and lab.unit_starts() == starts
            now = lab.host_files()
            assert lab.host_digest() == digest, (command, sorted(k for k in set(now) | set(files)
                                                                 if now.get(k) != files.get(k)), out[-3000:])
        assert 'Nothing was changed on the host' in out, out[-3000:]
    finally:
        lab.node().lxc(200).config.put(delete='mp1')
        lab.write_stack(STACK, deployed)
    lab.pulumi('up', '--yes', '--refresh', '--expect-no-changes', stack=STACK)


def test_unprotected_wrong_node_stops_at_preflight_before_anything_is_deleted(lab, deployed):
    cfg = with_changes(deployed, ((H, 'node'), 'pve-other'), ((C, 'protect'), False), ((V, 'protect'), False))
    out = refused(lab, cfg, ('up', '--yes', '--skip-preview'))
    assert "gpuhost:host.node: 'pve-other' is not a node of the Proxmox cluster" in out, out[-3000:]


def test_unprotected_replacement_with_a_missing_template_stops_at_preflight(lab, deployed):
    cfg = with_changes(deployed, ((C, 'ostemplate'), 'local:vztmpl/debian-13-standard_13.1-1_amd64.tar.zst'),
                       ((C, 'protect'), False))
    # The preview (it contacts no host) says what replaces the container: its create-only key, property by property.
    lab.write_stack(STACK, cfg)
    ct = [s for s in lab.preview_json(STACK)['steps'] if s['urn'].endswith('::container-lxc') and s.get('detailedDiff')]
    assert [s['op'] for s in ct] == ['replace'] and ct[0]['replaceReasons'] == ['create'], ct
    assert ct[0]['detailedDiff'] == {'create': {'kind': 'update-replace', 'inputDiff': False},
                                     'protect': {'kind': 'update', 'inputDiff': True}}, ct[0]['detailedDiff']
    out = refused(lab, cfg, ('up', '--yes', '--skip-preview'))
    assert 'gpuhost:container.ostemplate: local:vztmpl/debian-13-standard_13.1-1_amd64.tar.zst is not on storage local' \
        in out, out[-3000:]


def test_a_missing_bridge_stops_at_preflight(lab, deployed):
    out = refused(lab, with_changes(deployed, ((C, 'bridge'), 'vmbr9')), ('up', '--yes', '--skip-preview'))
    assert "gpuhost:container.bridge: bridge 'vmbr9' does not exist on node pve-lab" in out, out[-3000:]


def test_a_gpu_missing_on_the_host_stops_every_up(lab, deployed):
    cfg = copy.deepcopy(deployed)
    cfg[H]['gpus'] = cfg[H]['gpus'] + [{'address': '0000:c1:00.0', 'numa': 1, 'id': '10de:2bb5'}]
    lab.write_stack(STACK, cfg)
    assert lab.pulumi('preview', stack=STACK, check=False).returncode == 0  # preview contacts no host
    out = refused(lab, cfg, ('up', '--yes', '--skip-preview'))
    assert 'gpuhost:host.gpus: 0000:c1:00.0 is not a GPU on this host' in out, out[-3000:]


def test_unprotected_vmid_change_onto_a_taken_vmid_keeps_the_old_container(lab, deployed):
    # Someone else's container holds 201: the new container is created first, fails, and 200 stays.
    lab.node().lxc.post(vmid=201, ostemplate=deployed[C]['ostemplate'], hostname='other', storage='local-lvm')
    lab.wait_for(lambda: 201 in guests(lab)[0], what='container 201')
    # The lab's sync loop writes /etc/pve/lxc/201.conf a moment later (pmxcfs would at once): the host's
    # snapshot below must include it.
    lab.wait_for(lambda: os.path.exists(lab.host.path('etc/pve/lxc/201.conf')), what='201.conf on the host')
    try:
        cfg = with_changes(deployed, ((C, 'vmid'), 201), ((C, 'protect'), False))
        out = refused(lab, cfg, ('up', '--yes', '--skip-preview'))
        assert 'creating container 201 on pve-lab' in out and 'already exists' in out, out[-3000:]
        assert lab.node().lxc(200).status.current.get()['status'] == 'running'
    finally:
        lab.node().lxc(201).delete()
        lab.wait_for(lambda: 201 not in guests(lab)[0], what='container 201 gone')
    lab.write_stack(STACK, deployed)
    lab.pulumi('up', '--yes', '--skip-preview', '--refresh', stack=STACK)
    lab.pulumi('up', '--yes', '--expect-no-changes', stack=STACK)


def test_hostile_but_legal_values_reach_sglang_verbatim(lab, deployed):
    odd = 'a b "c" $HOME ${X} %n \\ ; \' end'
    cfg = with_changes(deployed, ((S, 'environment'), {'ODD': odd}),
                       ((S, 'extra_args'), ['--context-length', '32768', '--chunked-prefill-size=8192']))
    lab.write_stack(STACK, cfg)
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    env = dict(item.split('=', 1) for item in lab.unit_proc('environ'))
    assert env['ODD'] == odd
    argv = lab.unit_proc('cmdline')
    assert argv[-4:] == ['--disable-custom-all-reduce', '--context-length', '32768', '--chunked-prefill-size=8192']
    assert lab.ct_exec(['test', '-e', '/tmp/pwned'], check=False).returncode == 1
    lab.write_stack(STACK, deployed)
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)


def test_renaming_the_unit_moves_the_service(lab, deployed):
    units = os.path.join(lab.ct_root(), 'etc', 'systemd', 'system')
    lab.write_stack(STACK, with_changes(deployed, ((S, 'unit'), 'sglang-qwen35.service')))
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    assert not os.path.exists(os.path.join(units, 'sglang-qwen.service'))
    assert os.path.exists(os.path.join(units, 'sglang-qwen35.service'))
    assert lab.unit_starts('sglang-qwen35.service') == 1
    assert lab.outputs(STACK)['speculation']['resolved']['speculative_algorithm'] == 'EAGLE'
    lab.write_stack(STACK, deployed)
    lab.pulumi('up', '--yes', '--skip-preview', stack=STACK)
    assert not os.path.exists(os.path.join(units, 'sglang-qwen35.service'))
    lab.pulumi('up', '--yes', '--expect-no-changes', stack=STACK)


@pytest.mark.parametrize('where', ['run/systemd/system', 'etc/systemd/system'])
def test_a_unit_name_the_container_already_uses_is_refused_before_any_change(lab, deployed, where):
    """gpuhost:sglang.unit: ssh.service would override (or overwrite) the container's own SSH unit, and a
    later destroy would delete it: refused at the start of up, naming the file, nothing changed."""
    # Written inside the container: /run there is the container's own tmpfs (an outside write into its
    # root filesystem's /run would be hidden under it, as on a real host).
    own = '/%s/ssh.service' % where
    lab.ct_exec(['sh', '-c', 'mkdir -p "$(dirname "$1")" && cat > "$1"', 'sh', own],
                stdin='[Unit]\nDescription=OpenBSD Secure Shell server\n[Service]\nExecStart=/usr/sbin/sshd -D\n')
    try:
        lab.write_stack(STACK, with_changes(deployed, ((S, 'unit'), 'ssh.service')))
        digest, starts = lab.host_digest(), lab.unit_starts()
        res = lab.pulumi('up', '--yes', '--skip-preview', stack=STACK, check=False)
        out = res.stdout + res.stderr
        assert res.returncode != 0
        assert 'gpuhost:sglang.unit: ssh.service is a unit container 200 has of its own (/%s/ssh.service)' % where \
            in out, out[-3000:]
        assert lab.ct_exec(['cat', own]).stdout.startswith('[Unit]\nDescription=OpenBSD')
        assert lab.host_digest() == digest and lab.unit_starts() == starts
    finally:
        lab.ct_exec(['rm', '-f', own])
        lab.write_stack(STACK, deployed)
    lab.pulumi('up', '--yes', '--expect-no-changes', stack=STACK)
