"""hostscripts/gpu_proof.py (issue 48) without a GPU or torch: its parsers on real lines (nvidia-smi's bus ids,
NCCL's INFO lines as NCCL's source prints them and as they appear in public reports and on the lent H100), the
bandwidth nccl-tests defines, its messages, and the whole script against the lab's simulated torch
(lab/fakesglang/torch): the checks pass and fail as they should, and a hang is killed within the time limit with no worker
left. The real run on a GPU: docs/gpu-proof.md."""

import argparse
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from tests.lablib import REPO

SCRIPT = os.path.join(REPO, 'hostscripts', 'gpu_proof.py')
FAKE_TORCH = os.path.join(REPO, 'lab', 'fakesglang')   # its torch: the lab's simulated one
spec = importlib.util.spec_from_file_location('gpu_proof', SCRIPT)
gp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gp)

TWO = '0000:01:00.0,0000:11:00.0'
FOUR = '0000:01:00.0,0000:11:00.0,0000:61:00.0,0000:71:00.0'

# NCCL's transport lines, from public reports (NVIDIA/nccl issues 1189, 952, 429, nccl-tests 213) and, for SHM, the
# format of src/transport/shm.cc ("Channel %02d : %d[%d] -> %d[%d] via SHM/%s/%s").
P2P_LINES = [
    'H20-GPU-05:1789225:1789736 [1] NCCL INFO Channel 01/0 : 1[1] -> 0[0] via P2P/CUMEM',
    'node:919:1150 [0] NCCL INFO Channel 01/0 : 8[0] -> 15[7] via P2P/IPC/read',
    'hw14:798:813 [3] NCCL INFO Channel 02/0 : 3[3] -> 4[4] via P2P/direct pointer',
]
SHM_LINE = 'pve-ct:4417:4459 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct/direct'
NET_LINES = [
    'machine-1:16194:18586 [6] NCCL INFO Channel 03 : 7[b2000] -> 14[b1000] [receive] via NET/IB/0/GDRDMA',
    'node:926:1151 [7] NCCL INFO Channel 03/0 : 15[7] -> 6[6] [send] via NET/Socket/3',
]
# NCCL 2.28.9 on the lent H100 (2026-12-06), world size 1: ring lines name no transport; the ENV lines, one with a
# full stop and one without.
H100_LINES = [
    'vm:2042:2042 [0] NCCL INFO NCCL version 2.28.9+cuda13.0',
    'vm:2042:2042 [0] NCCL INFO NCCL_P2P_DISABLE set by environment to 1',
    'vm:2042:2042 [0] NCCL INFO NCCL_NVLS_ENABLE set by environment to 0.',
    'vm:2042:2042 [0] NCCL INFO Channel 00/64 : 0',
    'vm:2042:2042 [0] NCCL INFO ncclCommInitRankConfig comm 0x40df9230 rank 0 nranks 1 cudaDev 0 nvmlDev 0 busId 60 '
    'commId 0x8e2eba7a156be9e0 - Init COMPLETE',
]


def test_bus_ids_are_normalised_from_nvidia_smi_and_lspci_forms():
    assert gp.bus_id('00000000:00:06.0') == '0000:00:06.0'     # nvidia-smi --query-gpu=pci.bus_id on the H100
    assert gp.bus_id('0000:C1:00.0') == '0000:c1:00.0'
    assert gp.bus_id(' 01:00.0 ') == '0000:01:00.0'             # lspci
    for bad in ('0000:01:00', 'gpu0', '0000:01:00.8', '0000:101:00.0'):
        with pytest.raises(ValueError, match='not a PCI bus id'):
            gp.bus_id(bad)


def test_the_gpu_comparison_ignores_order_and_names_what_is_missing_or_extra(monkeypatch):
    monkeypatch.delenv('CUDA_VISIBLE_DEVICES', raising=False)
    declared = FOUR.split(',')
    assert gp.compare_gpus(declared, list(reversed(declared))) is None
    msg = gp.compare_gpus(declared, declared[:3])
    assert msg.startswith('torch sees 3 GPUs (0000:01:00.0, 0000:11:00.0, 0000:61:00.0), 4 declared: '
                          '0000:71:00.0 is missing; check the container')
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '0,1')
    msg = gp.compare_gpus(declared[:1], declared[:2])
    assert '0000:11:00.0 is not declared' in msg and msg.endswith('CUDA_VISIBLE_DEVICES=0,1')
    assert '0000:01:00.0, 0000:11:00.0 are missing' in gp.compare_gpus(declared[:2], [])


def test_bus_bandwidth_is_nccl_tests_definition():
    algbw, busbw = gp.bandwidth(128 << 20, 0.010, 4)
    assert algbw == pytest.approx(13421772800.0)
    assert busbw == pytest.approx(algbw * 2 * 3 / 4)
    assert gp.bandwidth(1 << 20, 1e-3, 2)[1] == pytest.approx((1 << 20) / 1e-3)
    assert gp.bandwidth(1 << 20, 1e-3, 1)[1] == 0


def test_the_transport_is_read_from_nccls_channel_lines():
    via, env = gp.parse_nccl_log('\n'.join(P2P_LINES))
    assert via == ['P2P/CUMEM', 'P2P/IPC/read', 'P2P/direct pointer'] and env == {}
    assert gp.transport_name(via, 4) == 'P2P'
    via, _ = gp.parse_nccl_log('\n'.join([SHM_LINE] + NET_LINES))
    assert via == ['NET/IB/0/GDRDMA', 'NET/Socket/3', 'SHM/direct/direct']
    assert gp.transport_name(via, 8) == 'NET+SHM'
    via, env = gp.parse_nccl_log('\n'.join(H100_LINES))
    assert via == [] and env == {'NCCL_P2P_DISABLE': '1', 'NCCL_NVLS_ENABLE': '0'}
    assert gp.transport_name(via, 1) == 'none (one GPU)'
    assert gp.transport_name(via, 2).startswith('not chosen yet')


def test_sizes_and_gpu_lists():
    assert gp.parse_sizes('1M,16M,128M,1G') == [1 << 20, 16 << 20, 128 << 20, 1 << 30]
    assert gp.parse_sizes('512, 4KiB') == [512, 4096]
    for bad in ('0', '1T', 'x', '1M,,2M'):
        with pytest.raises(argparse.ArgumentTypeError):
            gp.parse_sizes(bad)
    with pytest.raises(argparse.ArgumentTypeError, match='declared twice: 0000:01:00.0'):
        gp.parse_gpus('0000:01:00.0,01:00.0')


# ------------------------------------------------------------------------------------------ the script, fake torch

def proof(*argv, gpus=TWO, fake=True, **env):
    """Runs the script as the program will, its JSON on stdout: (exit status, the document, stderr, seconds)."""
    e = {k: v for k, v in os.environ.items() if not k.startswith(('NCCL_', 'CUDA_', 'FAKE_TORCH_', 'PYTHONPATH'))}
    if fake:
        e['PYTHONPATH'] = FAKE_TORCH
    e.update(FAKE_TORCH_GPUS=gpus, **env)
    start = time.monotonic()
    r = subprocess.run([sys.executable, SCRIPT, '--json', '-'] + list(argv), capture_output=True, text=True, env=e,
                       timeout=30)
    doc = json.loads(r.stdout) if r.stdout.strip() else None
    if doc:
        assert r.stderr.rstrip().endswith(doc['message'])
    return r.returncode, doc, r.stderr, time.monotonic() - start


def gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_four_gpus_in_cuda_order_pass_with_the_units_environment():
    # CUDA numbers the GPUs otherwise than the declaration: each rank finds its GPU by bus id.
    rc, doc, _, _ = proof('--gpus', FOUR, '--sizes', '1M,16M', gpus=FOUR, CUDA_VISIBLE_DEVICES='3,2,1,0',
                          NCCL_P2P_DISABLE='1')
    assert rc == 0 and doc['ok'], doc['message']
    assert [g['index'] for g in doc['gpus']] == [3, 2, 1, 0]
    assert doc['seen'] == list(reversed(FOUR.split(',')))
    ar = doc['allreduce']
    assert (ar['world_size'], ar['transport'], ar['via'], ar['dtype']) == (4, 'SHM', ['SHM/direct/direct'], 'bfloat16')
    assert [(s['bytes'], s['want'], s['ok']) for s in ar['sizes']] == [(1 << 20, 10, True), (16 << 20, 10, True)]
    assert all(s['busbw'] == pytest.approx(s['algbw'] * 1.5) for s in ar['sizes'])
    assert doc['nccl_env']['NCCL_P2P_DISABLE'] == '1'
    assert doc['message'].startswith('4 GPUs ok (0000:01:00.0, ') and doc['message'].endswith('NCCL chose SHM')
    assert all(g['ok'] and g['memory_total'] == 96 << 30 and g['tflops'] > 0 for g in doc['gpus'])


def test_a_tp_smaller_than_the_gpus_reduces_over_the_first_ones():
    rc, doc, _, _ = proof('--gpus', FOUR, '--tp', '2', '--sizes', '1M', gpus=FOUR)
    assert rc == 0 and len(doc['gpus']) == 4
    assert doc['allreduce']['gpus'] == FOUR.split(',')[:2] and doc['allreduce']['transport'] == 'P2P'


@pytest.mark.parametrize('seen, declared, expect', [
    (TWO, FOUR, '0000:61:00.0, 0000:71:00.0 are missing'),
    (FOUR, TWO, '0000:61:00.0, 0000:71:00.0 are not declared'),
])
def test_the_gpus_torch_sees_must_be_the_declared_ones(seen, declared, expect):
    rc, doc, _, _ = proof('--gpus', declared, '--sizes', '1M', gpus=seen)
    assert rc == 1 and not doc['ok'] and expect in doc['message']


def test_a_wrong_matmul_names_the_gpu():
    rc, doc, _, _ = proof('--gpus', TWO, '--sizes', '1M', FAKE_TORCH_BAD_GPU='0000:11:00.0')
    assert rc == 1
    assert doc['message'].startswith('GPU 0000:11:00.0: the bf16 matmul is wrong, relative error 0.5 (limit 0.01)')
    assert [g['ok'] for g in doc['gpus']] == [True, False]


def test_a_wrong_sum_names_the_group_the_size_and_the_transport():
    rc, doc, _, _ = proof('--gpus', TWO, '--sizes', '1M', FAKE_TORCH_WRONG_SUM='1')
    assert rc == 1
    assert doc['message'] == ('the all-reduce across GPUs 0000:01:00.0, 0000:11:00.0 returned a wrong sum at 1 MiB: '
                              '2 instead of 3; NCCL chose P2P (P2P under the IOMMU\'s translation mode hangs or '
                              'corrupts: NCCL_P2P_DISABLE=1 in the unit)')


def test_a_bus_bandwidth_below_the_floor_fails_naming_the_figure_and_the_transport():
    # At most 2 GB/s through a slow transport (less on a loaded machine): above a floor far below, below 3 GB/s.
    slow = dict(FAKE_TORCH_BUSBW_GBPS='2', NCCL_P2P_DISABLE='1')
    rc, doc, _, _ = proof('--gpus', TWO, '--sizes', '1M,16M', '--min-busbw', '0.1', **slow)
    busbw = doc['allreduce']['sizes'][-1]['busbw']
    assert rc == 0 and doc['ok'] and 0.1e9 < busbw <= 2e9, (doc['message'], busbw)
    rc, doc, _, _ = proof('--gpus', TWO, '--sizes', '1M,16M', '--min-busbw', '3', **slow)
    assert rc == 1 and not doc['ok']
    assert re.fullmatch(r'the all-reduce across GPUs 0000:01:00\.0, 0000:11:00\.0 reached a bus bandwidth of '
                        r'[\d.]+ GB/s at 16 MiB, below the floor of 3 GB/s; NCCL chose SHM', doc['message']), doc['message']
    assert proof('--gpus', TWO, '--sizes', '1M', '--min-busbw', '0')[0] == 3


@pytest.mark.parametrize('hang, env, signalled, chose', [
    ('sleep', {'NCCL_P2P_DISABLE': '1'}, -signal.SIGTERM, 'NCCL chose SHM; the workers were killed'),
    # as `kill -STOP` from outside (the real-GPU run): only SIGKILL ends it
    ('stop', {}, -signal.SIGKILL, 'NCCL chose P2P; the workers were killed (P2P under the IOMMU'),
])
def test_a_hang_is_killed_within_the_limit_and_no_worker_is_left(hang, env, signalled, chose):
    rc, doc, _, secs = proof('--gpus', TWO, '--time-limit', '2', FAKE_TORCH_HANG=hang, **env)
    assert rc == 2 and not doc['ok']
    assert doc['message'].startswith('the all-reduce across GPUs 0000:01:00.0, 0000:11:00.0 did not finish within '
                                     'the 2 s limit; ' + chose)
    assert doc['wall_seconds'] <= 2 and secs < 2 + 1.5   # 1.5 s: the interpreter's start on a loaded machine
    assert [w['exit'] for w in doc['workers']] == [signalled, signalled] and doc['left'] == []
    assert all(gone(w['pid']) for w in doc['workers'])


def test_a_parent_killed_outright_takes_its_workers_with_it():
    # Killed at once after the fork, a worker may not have run its prctl yet: it must see that and go too.
    tmp = tempfile.TemporaryDirectory()   # the killed parent's own temporary directory goes in it
    e = dict(os.environ, PYTHONPATH=FAKE_TORCH, FAKE_TORCH_GPUS=TWO, FAKE_TORCH_HANG='sleep', TMPDIR=tmp.name)
    parent = subprocess.Popen([sys.executable, SCRIPT, '--gpus', TWO, '--time-limit', '30'], env=e,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    children = '/proc/%d/task/%d/children' % (parent.pid, parent.pid)
    end = time.monotonic() + 10
    pids = []
    try:
        while len(pids) < 2 and time.monotonic() < end:
            time.sleep(0.05)
            with open(children) as f:
                pids = [int(p) for p in f.read().split()]
        assert len(pids) == 2
        parent.kill()
        parent.wait()
        end = time.monotonic() + 5
        while not all(map(gone, pids)) and time.monotonic() < end:
            time.sleep(0.05)
        assert all(map(gone, pids)), 'workers %s outlived their parent' % pids
    finally:
        parent.kill()
        for pid in pids:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
        tmp.cleanup()


def test_bad_arguments_and_no_torch_exit_3():
    for argv in (['--gpus', '0000:01:00.0', '--tp', '2'], ['--gpus', '0000:01:00.0,1:00.0'], ['--gpus', 'gpu0'],
                 ['--gpus', TWO, '--sizes', '1T'], ['--gpus', TWO, '--time-limit', '0']):
        rc, doc, err, _ = proof(*argv)
        assert rc == 3 and doc is None and 'error:' in err, argv
    rc, doc, _, _ = proof('--gpus', TWO, fake=False)
    assert rc == 3 and doc['message'].startswith('no torch in ')
    r = subprocess.run([sys.executable, SCRIPT, '--help'], capture_output=True, text=True)
    assert r.returncode == 0 and '--time-limit' in r.stdout


def test_in_a_lab_container_the_simulated_torch_sees_the_containers_gpus_and_its_faults(tmp_path):
    """The lab's torch, as the program's proof meets it in a lab container: the GPUs are the container's device nodes
    named by the host's procfs (a GPU whose node the container lacks is not seen), faults from /etc/lab-faults."""
    for minor, bdf in enumerate(['0000:01:00.0', '0000:11:00.0', '0000:61:00.0']):
        info = tmp_path / 'proc' / 'driver' / 'nvidia' / 'gpus' / bdf / 'information'
        info.parent.mkdir(parents=True)
        info.write_text('Model: \t\t NVIDIA RTX PRO 6000\nBus Location: \t %s\nDevice Minor: \t %d\n' % (bdf, minor))
    (tmp_path / 'dev').mkdir()
    for minor in (0, 2):
        (tmp_path / 'dev' / ('nvidia%d' % minor)).touch()
    (tmp_path / 'dev' / 'nvidiactl').touch()
    lab = {'gpus': '', 'LAB_SGLANG_SYSROOT': str(tmp_path)}
    rc, doc, _, _ = proof('--gpus', '0000:01:00.0,0000:61:00.0', '--sizes', '1M', **lab)
    assert rc == 0 and doc['ok'], doc['message']
    rc, doc, _, _ = proof('--gpus', TWO, '--sizes', '1M', **lab)
    assert rc == 1 and '0000:11:00.0' in doc['message'], doc['message']
    faults = tmp_path / 'etc' / 'lab-faults' / 'torch.json'
    faults.parent.mkdir(parents=True)
    faults.write_text(json.dumps({'bad_gpu': '0000:61:00.0'}))
    rc, doc, _, _ = proof('--gpus', '0000:01:00.0,0000:61:00.0', '--sizes', '1M', **lab)
    assert rc == 1 and '0000:61:00.0' in doc['message'], doc['message']


FAKE_PCT = r'''#!/bin/bash
# pct for ct_gpu_proof.sh on this machine: the container's /run is $CT_ROOT/run; every call's argv logged.
printf '%s\0' "$@" >> "$PCT_LOG"; printf '\n' >> "$PCT_LOG"
sub=$1 vmid=$2; shift 2
case $sub in
  push) cp "$1" "$CT_ROOT$2"; chmod "${4:-0644}" "$CT_ROOT$2" ;;
  exec)
    shift
    [ "$1 $2" = "systemctl show" ] && { echo not-found; exit 0; }
    args=(); for a in "$@"; do case $a in /run/*) args+=("$CT_ROOT$a") ;; *) args+=("$a") ;; esac; done
    exec "${args[@]}" ;;
esac
'''


def test_the_units_environment_reaches_the_proof_on_stdin_never_on_a_command_line(tmp_path):
    """ct_gpu_proof.sh as resources/sglang.py runs it (its stdin built by the same code): the proof runs in exactly the
    unit's environment, and no value of it is on any command line - pct's argv, or any process's while it runs (the
    host's process list shows the container's processes too)."""
    from resources import sglang
    bin_ = tmp_path / 'bin'
    bin_.mkdir()
    (bin_ / 'pct').write_text(FAKE_PCT)
    (bin_ / 'pct').chmod(0o755)
    (tmp_path / 'ct' / 'run').mkdir(parents=True)
    secret = 'hf_proof%08x' % os.getpid()
    environment = {'PYTHONPATH': FAKE_TORCH, 'FAKE_TORCH_GPUS': TWO, 'NCCL_P2P_DISABLE': '1', 'HF_TOKEN': secret,
                   'ODD': 'a b\n$(touch x)'}
    calls = []

    class Target:
        pass

    def run(target, name, args, stdin=None, check=True, timeout=None, **_):
        if name != 'ct_gpu_proof.sh':          # the proof's textfile for the collector: not this test's
            return sglang.remote.Result('', '', 0)
        calls.append(args)
        env = dict(os.environ, PATH='%s:%s' % (bin_, os.environ['PATH']), CT_ROOT=str(tmp_path / 'ct'),
                   PCT_LOG=str(tmp_path / 'pct.log'))
        p = subprocess.Popen(['bash', '-c', open(os.path.join(REPO, 'hostscripts', name)).read(), name] +
                             [str(a) for a in args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=env)
        seen = []
        p.stdin.write(stdin)
        p.stdin.close()
        while p.poll() is None:
            for pid in os.listdir('/proc'):
                try:
                    with open('/proc/%s/cmdline' % pid, 'rb') as f:
                        seen.append(f.read())
                except (OSError, ValueError):
                    pass
            time.sleep(0.02)
        out, err = p.stdout.read().decode(), p.stderr.read().decode()
        assert not [c for c in seen if secret.encode() in c], 'the token on a command line'
        return sglang.remote.Result(out, err, p.returncode)

    props = {'vmid': 200, 'unit_name': 'sglang-qwen.service',
             'proof': {'python': sys.executable, 'environment': environment, 'gpus': TWO.split(','), 'tp': 2,
                       'time_limit_s': 20, 'min_busbw_gbps': None}}
    import unittest.mock
    with unittest.mock.patch.object(sglang.remote, 'run', run):
        result = sglang.prove(Target(), props)
    assert result['ok'], result['message']
    assert calls and not [a for a in calls[0] if secret in str(a)]
    log = (tmp_path / 'pct.log').read_bytes()
    assert b'env\0-i\0' in log and secret.encode() not in log and b'NCCL_P2P_DISABLE' not in log
    # The file with the values is gone from the container's /run once the proof read it.
    assert sorted(os.listdir(tmp_path / 'ct' / 'run')) == []
