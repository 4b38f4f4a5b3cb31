"""When an `up` proves the GPUs (resources/sglang.py, issue 48): on new ground, after a host reboot, and the first
all-reduce figure every later proof is shown against."""

from resources import sglang

GPUS = ['0000:01:00.0', '0000:11:00.0']
PROOF = {'gpus': GPUS, 'tp': 2, 'time_limit_s': 60, 'min_busbw_gbps': None}
LAST = {'ok': True, 'gpus': GPUS, 'tp': 2, 'at': '2026-12-01T10:00:00Z', 'boot_id': 'boot-a', 'allreduce_bytes': 1 << 27,
        'busbw': 20e9, 'first': {'busbw': 21e9, 'bytes': 1 << 27, 'transport': 'SHM', 'at': '2026-11-01T10:00:00Z'}}


def test_a_host_that_booted_since_the_last_proof_is_proven_again():
    props = {'proof': PROOF}
    assert sglang.rebooted_since_proof(props, LAST, 'boot-b')
    assert not sglang.rebooted_since_proof(props, LAST, 'boot-a')
    # Never proven, a proof from before boot ids were recorded, the proof off, or no boot id read: nothing to redo.
    assert not sglang.rebooted_since_proof(props, None, 'boot-b')
    assert not sglang.rebooted_since_proof(props, dict(LAST, boot_id=None), 'boot-b')
    assert not sglang.rebooted_since_proof({'proof': None}, LAST, 'boot-b')
    assert not sglang.rebooted_since_proof(props, LAST, None)


def test_the_hosts_boot_comes_from_its_status_unless_unknown_in_a_preview():
    from pulumi.runtime import rpc
    olds = {'runtime_facts': {'boot_id': 'boot-a'}}
    # The program's own reboot earlier in this run: the status resource read the new boot after it.
    assert sglang.host_boot(olds, {'host_boot_id': 'boot-b'}) == 'boot-b'
    # A preview where the status is read again (unknown), or a stack without it: what the unit's last read found.
    assert sglang.host_boot(olds, {'host_boot_id': rpc.UNKNOWN}) == 'boot-a'
    assert sglang.host_boot(olds, {}) == 'boot-a' and sglang.host_boot({}, {}) is None


def test_the_preview_says_why_the_proof_runs():
    olds = {'proven': LAST, 'runtime_facts': {'boot_id': 'boot-b'}, 'runtime': {'nvidia': '580.95.05'}}
    news = {'proof': PROOF, 'runtime': {'nvidia': '580.95.05'}}
    why = sglang.proof_reason(olds, news)
    assert why.startswith('the host rebooted since they were proven (2026-12-01T10:00:00Z), and SGLang started at '
                          'boot on them unproven'), why
    assert sglang.proof_reason(dict(olds, runtime_facts={'boot_id': 'boot-a'}), news) is None
    assert sglang.proof_reason(olds, dict(news, runtime={'nvidia': '590.1'})) == 'the NVIDIA user space or CUDA changes'
    assert sglang.proof_reason(dict(olds, proven=None), news) == 'they were never proven'
    assert sglang.proof_reason(dict(olds, proven=dict(LAST, gpus=GPUS[:1])), news) == 'the container\'s GPUs changed'


def test_a_reboot_alone_is_a_change_the_diff_shows():
    p = sglang.SglangUnitProvider()
    olds = {'proven': LAST, 'runtime_facts': {'boot_id': 'boot-b'}, 'unit_name': 'sglang-qwen.service', 'vmid': 200}
    news = {'proof': PROOF, 'unit_name': 'sglang-qwen.service', 'vmid': 200}
    assert p.diff('200/sglang-qwen.service', olds, news).changes
    assert not p.diff('200/sglang-qwen.service', dict(olds, runtime_facts={'boot_id': 'boot-a'}), news).changes


def test_the_first_figure_is_kept_while_the_group_stays_and_starts_again_when_it_changes():
    out = {'ok': True, 'busbw': 18e9, 'allreduce_bytes': 1 << 27, 'transport': 'SHM', 'at': '2026-12-06T10:00:00Z'}
    assert sglang.first_figure(PROOF, LAST, out) == LAST['first']
    this = {'busbw': 18e9, 'bytes': 1 << 27, 'transport': 'SHM', 'at': '2026-12-06T10:00:00Z'}
    assert sglang.first_figure(PROOF, None, out) == this
    assert sglang.first_figure(PROOF, dict(LAST, gpus=GPUS[:1]), out) == this
    assert sglang.first_figure(PROOF, LAST, dict(out, allreduce_bytes=1 << 30)) == dict(this, bytes=1 << 30)
    # A failed first proof is no reference; one GPU's all-reduce has no bandwidth.
    assert sglang.first_figure(PROOF, None, dict(out, ok=False)) is None
    assert sglang.first_figure(dict(PROOF, tp=1), None, out) is None


def test_a_failed_proof_says_what_became_of_sglang(monkeypatch):
    """Before a restart SGLang was not started on the GPUs; after a reboot, where it had started at boot, it was
    stopped for the proof and stays stopped - and the way to start it is said."""
    import json
    import pytest
    from transport import remote
    doc = {'ok': False, 'message': 'GPU 0000:11:00.0: the bf16 matmul is wrong', 'gpus': [], 'allreduce': {}}
    calls = []

    def run(target, script, args, **kw):
        calls.append(script)
        return remote.Result(json.dumps(doc), '', 1)
    monkeypatch.setattr(remote, 'run', run)
    monkeypatch.setattr(remote, 'put_file', lambda *a, **kw: True)
    props = {'vmid': 200, 'unit_name': 'sglang-qwen.service',
             'proof': dict(PROOF, python='/opt/sglang/venv/bin/python', environment={'NCCL_P2P_DISABLE': '1'})}
    with pytest.raises(sglang.ServiceError) as e:
        sglang.prove(None, props, LAST, 'boot-b')
    assert str(e.value) == ('the GPU proof failed in container 200: GPU 0000:11:00.0: the bf16 matmul is wrong. SGLang '
                            'was not started on them (run the proof by hand: docs/gpu-proof.md)')
    with pytest.raises(sglang.ServiceError) as e:
        sglang.prove(None, props, LAST, 'boot-b', stopped_at_boot=True)
    assert 'SGLang, started at boot on them, was stopped for the proof and stays stopped: fix the GPUs, then `up` ' \
        'proves them again and starts it (or start it by hand: pct exec 200 -- systemctl start ' \
        'sglang-qwen.service)' in str(e.value)
    assert calls.count('ct_gpu_proof.sh') == 2 and 'ensure_dir.sh' in calls
