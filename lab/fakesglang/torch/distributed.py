"""The lab's simulated torch.distributed (SIMULATED), in one process: every rank computes the sum itself, assuming each filled rank+1 as
the proof does. Writes NCCL's INFO lines (their real shapes) to NCCL_DEBUG_FILE as NCCL would."""

import os
import signal
import socket
import time

_group = {}


def _log(lines):
    path = os.environ.get('NCCL_DEBUG_FILE')
    if os.environ.get('NCCL_DEBUG') != 'INFO' or not path:
        return
    prefix = '%s:%d:%d [%d] NCCL INFO ' % (socket.gethostname(), os.getpid(), os.getpid() + 1, _group['rank'])
    with open(path, 'a') as f:
        f.write(''.join(prefix + line + '\n' for line in lines))


def init_process_group(backend, init_method=None, rank=0, world_size=1, timeout=None):
    _group.update(rank=rank, world=world_size)
    lines = ['%s set by environment to %s.' % (k, v) for k, v in sorted(os.environ.items())
             if k.startswith('NCCL_') and k not in ('NCCL_DEBUG', 'NCCL_DEBUG_FILE')]
    peer = (rank + 1) % world_size
    if world_size > 1:
        if os.environ.get('NCCL_P2P_DISABLE') == '1':
            lines += ['Channel %02d : %d[%d] -> %d[%d] via SHM/direct/direct' % (c, rank, rank, peer, peer)
                      for c in range(2)]
        else:
            lines += ['Channel %02d/0 : %d[%d] -> %d[%d] via P2P/CUMEM' % (c, rank, rank, peer, peer)
                      for c in range(2)]
    _log(lines)


def all_reduce(t):
    from torch import fault
    hang = fault('hang')
    if hang == 'stop':
        os.kill(os.getpid(), signal.SIGSTOP)
    elif hang:
        time.sleep(3600)
    n, rank = _group['world'], _group['rank']
    slow = fault('busbw_gbps')
    if slow and n > 1:   # a slow transport: each all-reduce takes what nccl-tests' busbw of that many GB/s means
        time.sleep(t.numel() * 2 * 2 * (n - 1) / n / (float(slow) * 1e9))
    t.value = n * (n + 1) / 2 if t.value == rank + 1 else t.value * n
    if fault('wrong_sum') and t.numel() > 1:
        t.value -= 1


def destroy_process_group():
    _group.clear()
